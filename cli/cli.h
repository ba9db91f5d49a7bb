/*
 * cli.h - what the command-line tool's files share. The tool uses only the
 * library's public API.
 */
#ifndef LEASE_CLI_H
#define LEASE_CLI_H

#include <stdint.h>
#include <stdio.h>
#include <jansson.h>

#include "lease.h"

/* Exit codes: a promise to scripts, documented in the README. */
enum {
    EXIT_OK = 0,
    EXIT_FAIL = 1,
    EXIT_USAGE = 2,
    EXIT_BUSY = 3,
    EXIT_LOST = 4,
    EXIT_STALE = 5,
    EXIT_STORE = 6,
    EXIT_TIMEOUT = 7
};

#define DEFAULT_TTL_MS 30000u

/* Options every command takes. */
typedef struct cli_globals {
    const char *store_url; /* NULL: the default; never argv's (redacted) bytes */
    uint64_t timeout_ms;   /* 0: the library's default */
    int json;
    int store_from_file;   /* store_url came from --store-file */
    int store_from_env;    /* store_url came from $LEASE_STORE */
} cli_globals;

/* A small flag parser: `--name value`, `--name=value`, `--flag`. */
typedef struct cli_args {
    int argc;
    char **argv;
    int i;
    const char *cmd;
} cli_args;

int cli_usage(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int cli_fail(int code, const char *what);
/* The library's log lines stay on stderr, but not those of `event`, which
 * the command reports itself as its error line (fence: "fenced"): one
 * line for one event. Programs that route the log still get the event. */
void cli_log_except(const char *event);
int cli_exit_code(int lease_rc);
int cli_open_store(lease_store **out, const cli_globals *g);
/* --store URL (copied, and its secrets overwritten in argv at once, so
 * that `ps` never shows them), --store-file PATH (0600), --timeout, --json. */
int cli_parse_global(cli_globals *g, cli_args *a, const char *arg, int *rc);
/* Takes $LEASE_STORE as the store URL, then hides its secrets in the
 * process's own environment block (/proc/PID/environ, readable by a
 * child of `lease run`), as --store's are hidden in argv. */
int cli_take_env_store(cli_globals *g);
/* Overwrite in place the secrets of a store URL given in argv (its
 * password, secret query parameters), so that ps shows "***". */
void cli_hide_url_secrets(char *arg);
/* With `arg` the current flag: its value (from "=" or the next word). */
const char *cli_value(cli_args *a, const char *arg, int *rc);
int cli_flag_is(const char *arg, const char *name);
/* A word that is none of the command's flags: an unknown option, or its one
 * positional (into *slot), or one too many (hint: "" or a tip). */
int cli_positional(cli_args *a, const char *arg, const char **slot, const char *hint);
/* The NAME of elect, leader and agent: present, and short enough. */
int cli_election_name(cli_args *a, const char *name);
/* A --label the library would refuse (over LEASE_LABEL_MAX bytes): exit 2
 * before any connection. 0 if fine (NULL is fine). */
int cli_check_label(cli_args *a, const char *label);
/* s under the text rule of escape.h, as a string the caller frees (NULL
 * when out of memory): for output that pads a column. */
char *cli_text(const char *s);
int cli_duration(uint64_t *ms, const char *cmd, const char *flag,
                 const char *text, int allow_zero);
void cli_default_label(char *buf, size_t size);
void cli_print_json(json_t *obj); /* prints and frees */
json_t *cli_grant_json(const lease_grant *g);
/* "held", "expired" or "free": the library's one meaning of info->state,
 * the same on every store (never worked out here from held and owner). */
const char *cli_state_name(const lease_info *info);
json_t *cli_info_json(const lease_info *info);
json_t *cli_history_json(const lease_history_entry *entry);
/* Wall-clock ms since the epoch as "2026-01-02T03:04:05.678Z"; "-" for 0. */
void cli_format_wall(char *buf, size_t size, int64_t ms);

/* `lease --version`: the tool's and library's versions, the stores built
 * in and the client libraries they talk through (version.c). */
int cli_print_version(FILE *out);
/* The directory liblease.so was loaded from, into buf: 0, or -1 if unknown
 * or longer than size (version.c). */
int cli_lib_dir(char *buf, size_t size);

/*
 * The options of run, elect, hold and claim (cmd_run.c, cmd_hold.c),
 * checked before any store is opened. hold and claim keep their keys in
 * one session: hold the keys given, in their order; claim up to `want` of
 * PREFIX/0 .. PREFIX/(nkeys-1).
 */
typedef struct cli_run_opts {
    const char *key, *label; /* run: KEY, elect: NAME, claim: PREFIX */
    uint64_t ttl_ms, wait_ms, grace_ms, kill_margin_ms;
    int has_grace, pass_store, cmd_at, elect;
    char deflabel[LEASE_LABEL_MAX + 1];
    char **keys;  /* hold and claim; NULL for run and elect */
    size_t nkeys;
    size_t want;  /* claim: how many of the keys; 0 for hold */
} cli_run_opts;

/* The stop timing, from the ttl and --grace: exit 2 if it leaves no room. */
int cli_run_timing(cli_args *a, cli_run_opts *o);
/* Takes the authority o describes, runs the command after "--" under it and
 * stops it in time; the exit code. */
int cli_run_supervise(cli_globals *g, cli_args *a, cli_run_opts *o);

int cmd_run(cli_globals *g, cli_args *a);
int cmd_hold(cli_globals *g, cli_args *a);
int cmd_claim(cli_globals *g, cli_args *a);
int cmd_elect(cli_globals *g, cli_args *a);
int cmd_leader(cli_globals *g, cli_args *a);
int cmd_agent(cli_globals *g, cli_args *a);
/* fence-sql and fence-install (cmd_fence_kit.c). */
int cmd_fence_sql(cli_globals *g, cli_args *a);
int cmd_fence_install(cli_globals *g, cli_args *a);


#endif
