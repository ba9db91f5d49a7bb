/*
 * lease/history.h - the recent grants of a key, for post-mortems.
 *
 * Every store records each new grant (a new token) in the same atomic step
 * that grants it, and how the grant ended in the step that ends it:
 *
 *   released  the holder released it;
 *   lost      the holder was still running and the store refused its renew:
 *             the lease had expired (and maybe been granted again) first.
 *             A release after that leaves it lost: its authority had ended;
 *   expired   its ttl ran out with no word from the holder (crashed, paused,
 *             cut off), found when the key was granted again or read;
 *   held      not ended: still the current unexpired lease.
 *
 * An expired or lost grant is dated by when its lease expired, where the
 * store can tell (SQLite, PostgreSQL, Redis); on etcd, whose leases leave
 * no record of their end, an expired grant has no time (0) and a lost one
 * the time of the refused renew.
 *
 * At least the newest LEASE_HISTORY_KEEP grants of a key are kept; older
 * ones are pruned by later grants, so the history of a key stays bounded.
 * Times are wall-clock milliseconds since the Unix epoch, on the store's
 * clock where it has one (PostgreSQL, Redis) and on the recording client's
 * clock otherwise (SQLite, etcd).
 */
#ifndef LEASE_HISTORY_H
#define LEASE_HISTORY_H

#include "types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Grants kept per key, at least (stores may keep a few more in between). */
#define LEASE_HISTORY_KEEP 100
/* The most entries one lease_history() call returns. */
#define LEASE_HISTORY_READ_MAX 200

typedef enum lease_ended {
    LEASE_ENDED_HELD = 0, /* still the current unexpired lease */
    LEASE_ENDED_RELEASED = 1,
    LEASE_ENDED_EXPIRED = 2,
    LEASE_ENDED_LOST = 3
} lease_ended;

typedef struct lease_history_entry {
    uint64_t token;
    char owner[LEASE_OWNER_BUFSZ];
    char label[LEASE_LABEL_MAX + 1];
    uint64_t ttl_ms;     /* ttl granted at acquisition (PostgreSQL, on a lease
                          * table with acquired_at: the last one granted) */
    int64_t acquired_ms; /* when granted */
    lease_ended ended;
    int64_t ended_ms;    /* when it ended (see above); 0 while held or
                          * when the store cannot know */
} lease_history_entry;

/*
 * The recent grants of `key`, newest (highest token) first: at most `max`
 * of them (0, or more than LEASE_HISTORY_READ_MAX: that many). *out is an array of *count entries that
 * the caller frees with lease_history_free() (NULL when *count is 0).
 * A key never acquired has an empty history (not LEASE_ENOTFOUND): its
 * history may also have been recorded before the store kept one.
 */
int lease_history(lease_history_entry **out, size_t *count, lease_store *store,
                  const char *key, size_t max);

void lease_history_free(lease_history_entry *entries);

/* "held", "released", "expired", "lost"; "unknown" for other values. */
const char *lease_ended_name(lease_ended ended);

#ifdef __cplusplus
}
#endif
#endif
