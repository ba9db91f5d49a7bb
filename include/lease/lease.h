/*
 * lease/lease.h - owners, and acquiring, renewing, releasing and inspecting
 * leases.
 *
 * Every function here checks its arguments first: a bad key (empty, longer
 * than LEASE_KEY_MAX, or NULL), a ttl of 0 or above the store's cap, a
 * malformed owner, a NULL pointer, gives LEASE_EINVALID and sends nothing
 * to the store.
 */
#ifndef LEASE_LEASE_H
#define LEASE_LEASE_H

#include "types.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Make a new owner identity: a random (version 4) UUID from the OS's random
 * source, in canonical lower-case text. Make a fresh one for each holder
 * instance; never reuse one across processes.
 */
int lease_owner_new(char out[LEASE_OWNER_BUFSZ]);

/* Is `key` a usable key or resource name (1..LEASE_KEY_MAX bytes)? 1 or 0. */
int lease_key_valid(const char *key);

/* Is `owner` a UUID in text form (any case)? 1 or 0. */
int lease_owner_valid(const char *owner);

/*
 * A cancel handle ends a wait early: lease_acquire() and lease_campaign()
 * given one in their options stop waiting once it is fired, from another
 * thread or from a signal handler (a program that waits on its main thread
 * and must answer Ctrl-C, an event loop cancelling a task).
 *
 * While a wait has a cancel handle, its pauses between tries are spent
 * watching the handle rather than the store's release notifications (a
 * store's own wait cannot be interrupted): a release is seen at the next
 * try, at most backoff_max_ms later, and the holder's expiry on time, as
 * without notifications. The first try is always made; a fired wait makes
 * no further try and ends with LEASE_ETIMEOUT, its message saying it was
 * cancelled, or LEASE_ESTORE when the last try's outcome is unknown (the
 * same owner may acquire again to learn it); a try in progress when it is
 * fired ends first (one store call, bounded by the timeout).
 * A handle stays fired; make one per wait. (The type: lease/types.h.)
 */

/* A new, unfired handle (it holds one close-on-exec descriptor). */
int lease_cancel_new(lease_cancel **out);

/* Fire: every wait using the handle ends. Any thread, and async-signal-safe
 * (it only stores a flag and writes to a descriptor). Firing again is a
 * no-op. */
int lease_cancel_fire(lease_cancel *cancel);

/* 1 once fired, else 0 (and 0 for NULL). */
int lease_cancel_fired(const lease_cancel *cancel);

/* Free a handle no wait uses any more. NULL is allowed. */
void lease_cancel_free(lease_cancel *cancel);

/* 2 added `cancel`; a version 1 structure (without it) is still taken. */
#define LEASE_ACQUIRE_OPTS_VERSION 2

/* Options of lease_acquire(). Start from LEASE_ACQUIRE_OPTS_INIT. */
typedef struct lease_acquire_opts {
    unsigned int version;   /* LEASE_ACQUIRE_OPTS_VERSION */
    const char *owner;      /* required: see lease_owner_new() */
    uint64_t ttl_ms;        /* required: 1 ms .. the store's cap */
    const char *label;      /* optional holder label for people (NULL: "") */
    uint64_t wait_ms;       /* 0: try once; else wait at most this long */
    uint64_t backoff_min_ms; /* first pause between tries (0: 10 ms) */
    uint64_t backoff_max_ms; /* largest pause between tries (0: 1000 ms) */
    lease_cancel *cancel;   /* optional: ends the wait when fired (NULL: none) */
} lease_acquire_opts;

#define LEASE_ACQUIRE_OPTS_INIT { LEASE_ACQUIRE_OPTS_VERSION, NULL, 0, NULL, 0, 0, 0, NULL }

/*
 * Acquire `key` for opts->owner.
 *
 * Succeeds when no unexpired lease exists for the key: *out gets a new
 * token, strictly greater than every token this store issued for the key.
 * If opts->owner already holds the unexpired lease (a retried acquire whose
 * answer was lost), it succeeds with the same token and the expiry is set
 * anew to the store's clock + ttl, as a renew would.
 *
 * With wait_ms > 0 the call retries with exponential backoff and jitter
 * (waking early when the store can notify a release, and never sleeping
 * past the holder's remaining time or the wait), and fails with
 * LEASE_ETIMEOUT when the wait is over. Without it, a held key gives
 * LEASE_EBUSY at once.
 *
 * On LEASE_EBUSY (and LEASE_ETIMEOUT) `holder`, if not NULL, receives the
 * current holder's label, owner and remaining time. `holder` may be NULL.
 * LEASE_ESTORE means the outcome is unknown: the caller may or may not hold
 * the lease; retrying with the same owner is safe.
 */
int lease_acquire(lease_grant *out, lease_info *holder, lease_store *store,
                  const char *key, const lease_acquire_opts *opts);

/*
 * Extend the lease of `grant` to the store's clock + ttl_ms (0: the grant's
 * current ttl). On success grant->ttl_ms and grant->deadline_ns are updated.
 * LEASE_ELOST when the owner/token no longer hold an unexpired lease: an
 * expired lease is never revived with its old token.
 */
int lease_renew(lease_grant *grant, lease_store *store, uint64_t ttl_ms);

/*
 * End the lease of `grant` now. The key's token counter is kept, so the
 * next holder still gets a greater token. LEASE_ELOST, changing nothing,
 * when owner and token do not match the key's current lease.
 */
int lease_release(lease_store *store, const lease_grant *grant);

/*
 * Fill a grant from values the caller kept (e.g. from the command line)
 * so that it can be renewed or released. deadline_ns is set to 0 (unknown).
 * The owner is stored in canonical lower case.
 */
int lease_grant_init(lease_grant *out, const char *key, const char *owner,
                     uint64_t token, uint64_t ttl_ms);

/* Milliseconds left before the grant's local deadline (0 once passed). */
uint64_t lease_grant_remaining_ms(const lease_grant *grant);

/* 1 while the grant's local deadline has not passed, else 0. */
int lease_grant_valid(const lease_grant *grant);

/* The state of one key. LEASE_ENOTFOUND for a key never acquired. */
int lease_inspect(lease_info *out, lease_store *store, const char *key);

/*
 * Every key starting with `prefix` ("" or NULL: all keys), sorted by key,
 * free ones included. *out is an array of *count infos that the caller frees
 * with lease_list_free() (NULL when *count is 0).
 */
int lease_list(lease_info **out, size_t *count, lease_store *store,
               const char *prefix);

void lease_list_free(lease_info *list);

#ifdef __cplusplus
}
#endif
#endif
