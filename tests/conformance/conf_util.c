/*
 * conf_util.c - the state conf_util.h declares: one copy per program,
 * shared by all of its files.
 */
#include "conf_util.h"

const char *conf_url;
lease_store *conf_store;
char conf_prefix[64];
pid_t conf_children[CONF_MAX_CHILDREN];
