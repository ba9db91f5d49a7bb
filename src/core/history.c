/*
 * history.c - the grant history of a key. The stores record it in the
 * same atomic steps that grant and end leases; here the reading side:
 * argument checks, and entries still marked held checked against the lease
 * itself, since a lease that simply ran out has written nothing anywhere.
 */
#include <stdlib.h>
#include <string.h>

#include "lease_int.h"

const char *lease_ended_name(lease_ended ended)
{
    switch (ended) {
    case LEASE_ENDED_HELD:
        return "held";
    case LEASE_ENDED_RELEASED:
        return "released";
    case LEASE_ENDED_EXPIRED:
        return "expired";
    case LEASE_ENDED_LOST:
        return "lost";
    }
    return "unknown";
}

static int has_history(const lease_store *s)
{
    return s->backend->version >= 2 && s->backend->history != NULL;
}

int lease_history(lease_history_entry **out, size_t *count, lease_store *s,
                  const char *key, size_t max)
{
    lease_history_entry *e;
    lease_info info;
    size_t n = 0, i;
    int rc;

    if (out == NULL || count == NULL)
        return lease__seterr(LEASE_EINVALID, "out or count is NULL");
    *out = NULL;
    *count = 0;
    if (s == NULL)
        return lease__seterr(LEASE_EINVALID, "store is NULL");
    if ((rc = lease__check_name("key", key)) < 0)
        return rc;
    if (!has_history(s))
        return lease__seterr(LEASE_EUNSUPPORTED, "the %s store keeps no grant history",
                             s->backend->name);
    if (max == 0 || max > LEASE_HISTORY_READ_MAX)
        max = LEASE_HISTORY_READ_MAX;
    /*
     * Inspect first, then read: an entry still marked held is judged
     * against a lease state older than the entries. So a release between
     * the two calls shows as released (the read sees it), and a grant made
     * between them (a token newer than inspect saw) is left held rather
     * than called expired.
     */
    memset(&info, 0, sizeof(info));
    if ((rc = s->backend->inspect(&info, s, key)) == LEASE_ENOTFOUND) {
        /* No lease at all (e.g. its row deleted by hand): none is held. */
        memset(&info, 0, sizeof(info));
        info.token = UINT64_MAX;
    } else if (rc < 0)
        return rc;
    if ((e = calloc(max, sizeof(*e))) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory reading history");
    if ((rc = s->backend->history(e, &n, s, key, max)) < 0) {
        free(e);
        return rc;
    }
    if (n > max)
        n = max;
    /* Only the current unexpired lease of the same owner is held. */
    for (i = 0; i < n; i++)
        if (e[i].ended == LEASE_ENDED_HELD && e[i].token <= info.token &&
            !(info.held && info.token == e[i].token &&
              strcmp(info.owner, e[i].owner) == 0))
            e[i].ended = LEASE_ENDED_EXPIRED;
    if (n == 0) {
        free(e);
        e = NULL;
    }
    *out = e;
    *count = n;
    return 0;
}

void lease_history_free(lease_history_entry *entries)
{
    free(entries);
}

void lease__history_lost(lease_store *s, const lease_grant *g)
{
    char saved[LEASE__ERRMSG_SIZE];

    if (!has_history(s) || s->backend->history_lost == NULL)
        return;
    /* Best effort, and the caller's error (the refused renew) must stay
     * the one the thread reports. */
    lease__strlcpy(saved, lease_errmsg(), sizeof(saved));
    s->backend->history_lost(s, g->key, g->owner, g->token);
    lease__seterr(LEASE_ELOST, "%s", saved);
}
