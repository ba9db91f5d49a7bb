/*
 * lease/sys/store.h - the store interface, for those who write a store.
 * Users of the library never need this header.
 *
 * A store is one versioned table of function pointers (lease_backend) and
 * a connection struct that embeds `lease_store` as its first member and
 * keeps its own state after it:
 *
 *     typedef struct { lease_store parent; sqlite3 *db; ... } sqlite_store;
 *
 * The core does all argument checking before a slot is called: keys,
 * resource and data names are 1..LEASE_KEY_MAX bytes, owners are canonical
 * lower-case UUIDs, labels are at most LEASE_LABEL_MAX bytes, ttls are
 * between 1 ms and the handle's cap, tokens are >= 1. A slot never needs to
 * check them again, and the core computes local deadlines, waits, backoff
 * and jitter: a slot makes one attempt, bounded by `store->timeout_ms`.
 *
 * Errors: a slot returns 0 or a LEASE_E* code and sets the thread's message
 * with lease_store_seterr(). A store error must never be reported as
 * LEASE_EBUSY, LEASE_ELOST or success: when the store could not say, the
 * answer is LEASE_ESTORE. Messages must not contain the URL's password.
 */
#ifndef LEASE_SYS_STORE_H
#define LEASE_SYS_STORE_H

#include "../types.h"
#include "../history.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Version 1 holds every slot up to advisory_txn; version 2 appends the
 * grant history; version 3 appends store_size and open3, so that the core
 * allocates the connection and fills its shared part before the store's
 * open runs; version 4 appends share_lease; version 5 appends install_kit.
 * A later version only appends slots; the core reads a slot
 * only when backend->version is at least the version that brought it, so
 * a table written for an earlier version keeps working unchanged.
 */
#define LEASE_BACKEND_VERSION 5

/*
 * What a store can do beyond the required slots. lease_backend_register()
 * refuses a table that names a feature without the slot that provides it
 * (NOTIFY: wait_release, TXN: guarded_txn, RENEW_MANY: renew_many,
 * ADVISORY: advisory_txn, SHARED: share_lease); ROUNDS_TTL has no slot.
 */
#define LEASE_FEATURE_NOTIFY 0x01u   /* wait_release wakes on a release */
#define LEASE_FEATURE_TXN 0x02u      /* guarded_txn gives a native connection */
#define LEASE_FEATURE_RENEW_MANY 0x04u /* renew_many (sessions renew in batches) */
#define LEASE_FEATURE_ROUNDS_TTL 0x08u /* granted ttl may exceed the asked */
#define LEASE_FEATURE_ADVISORY 0x10u   /* advisory_txn takes database locks */
#define LEASE_FEATURE_SHARED 0x20u     /* share_lease: one store lease per session */

/* One acquisition request, already checked by the core. */
typedef struct lease_request {
    const char *key;
    const char *owner;  /* canonical lower-case UUID */
    const char *label;  /* never NULL, maybe "" */
    uint64_t ttl_ms;
} lease_request;

/* Called by `list` once per key, in any order (the core sorts the keys
 * before the caller sees them); non-zero stops the walk. */
typedef int (*lease_list_cb)(const lease_info *info, void *payload);

typedef struct lease_backend {
    unsigned int version;      /* LEASE_BACKEND_VERSION */
    const char *name;          /* "sqlite": shown in logs and metrics */
    const char *const *schemes; /* URL schemes, NULL-terminated */
    unsigned int features;     /* LEASE_FEATURE_* */

    /*
     * Required before version 3; a version-3 table has open3 instead and
     * leaves this NULL. Open a connection for `url` (whose scheme is one of
     * `schemes`): parse it, connect, create or upgrade the schema, taking
     * at most timeout_ms for all of it. Return a new struct whose first
     * member is lease_store (the core fills that member's fields after open
     * returns). EINVALID for a bad URL, ESTORE when the store cannot be
     * opened or reached in time.
     */
    int (*open)(lease_store **out, const char *url, uint64_t timeout_ms);

    /*
     * Required. Close the connection. Before version 3 it also frees what
     * open returned; from version 3 on it releases what open3 took, and the
     * core frees the struct it allocated.
     */
    void (*close)(lease_store *store);

    /*
     * Required. One atomic attempt (docs/contract.md#acquire): when no unexpired lease
     * exists, grant a new token > every token issued for the key and set
     * expiry = store clock + ttl; when req->owner holds the unexpired lease,
     * set expiry anew and return the same token; otherwise LEASE_EBUSY with
     * `holder` filled. On success fill out->token and out->ttl_ms (the ttl
     * actually granted, >= req->ttl_ms); the core fills the rest.
     */
    int (*acquire)(lease_grant *out, lease_info *holder, lease_store *store,
                   const lease_request *req);

    /*
     * Required. Extend to store clock + ttl_ms when (key, owner, token) is
     * the current unexpired lease; else LEASE_ELOST. On success set
     * *granted_ms to the ttl actually granted.
     */
    int (*renew)(uint64_t *granted_ms, lease_store *store, const char *key,
                 const char *owner, uint64_t token, uint64_t ttl_ms);

    /* Required. End the lease if owner and token match; else LEASE_ELOST. */
    int (*release)(lease_store *store, const char *key, const char *owner,
                   uint64_t token);

    /*
     * Required. LEASE_ENOTFOUND for a key never acquired. `out` comes
     * zeroed. The core sets out->state from `held`, `owner` and what the
     * store adds: a key that is not held but still has an owner is
     * LEASE_STATE_EXPIRED. A store that forgets the owner when a lease runs
     * out sets out->state = LEASE_STATE_EXPIRED itself for a key whose last
     * lease ran out without a release (a released key stays FREE).
     */
    int (*inspect)(lease_info *out, lease_store *store, const char *key);

    /* Required. Walk every key starting with prefix ("" = all), each
     * lease_info filled as inspect fills it. */
    int (*list)(lease_store *store, const char *prefix, lease_list_cb cb,
                void *payload);

    /* Required. See lease_fence_advance(); *mark is always set on 0/ESTALE. */
    int (*fence_advance)(uint64_t *mark, lease_store *store,
                         const char *resource, uint64_t token);

    /* Required. LEASE_ENOTFOUND if the resource has no mark. */
    int (*fence_mark)(uint64_t *mark, lease_store *store, const char *resource);

    /* Required. See lease_guarded_put(). */
    int (*guarded_put)(lease_store *store, const char *key, const char *owner,
                       uint64_t token, const char *name, const void *value,
                       size_t len);

    /* Required. See lease_data_get(); *value is malloc'ed, NUL-terminated. */
    int (*data_get)(void **value, size_t *len, uint64_t *token,
                    lease_store *store, const char *name);

    /*
     * Optional (LEASE_FEATURE_TXN). Begin, lock and validate the lease row,
     * call cb(native connection, payload), commit when it returns 0 and roll
     * back otherwise, returning its value.
     */
    int (*guarded_txn)(lease_store *store, const char *key, const char *owner,
                       uint64_t token, int (*cb)(void *native, void *payload),
                       void *payload);

    /*
     * Optional (LEASE_FEATURE_NOTIFY). Block until `key` is released or
     * expires, or timeout_ms passes, whichever is first. Return 0 when woken
     * (the key may be taken again already: the core simply retries),
     * LEASE_ETIMEOUT when the time ran out, LEASE_ESTORE on failure.
     * Without it the core polls with backoff and jitter.
     */
    int (*wait_release)(lease_store *store, const char *key,
                        uint64_t timeout_ms);

    /*
     * Optional (LEASE_FEATURE_RENEW_MANY): a session (lease/session.h)
     * renews its grants in batches with it; without it, one renew per
     * grant over the same connection. Renew n leases of one holder in
     * one round trip: results[i] gets what renew would have returned for
     * grants[i], and granted_ms[i] the ttl granted. Returns 0 if the round
     * trip happened (whatever the results), LEASE_ESTORE otherwise.
     */
    int (*renew_many)(int *results, uint64_t *granted_ms, lease_store *store,
                      const lease_grant *grants, size_t n, uint64_t ttl_ms);

    /*
     * Optional. Called when the handle's per-call timeout changes (and once
     * after open), so that the store bounds its waits (busy timeouts,
     * socket timeouts) by it. The value is also in store->timeout_ms.
     */
    int (*set_timeout)(lease_store *store, uint64_t timeout_ms);

    /*
     * Optional (LEASE_FEATURE_ADVISORY). Begin a transaction, take the
     * transaction-level advisory lock numbered `lock_key` (waiting at most
     * the handle's timeout, or not at all when try_only), call
     * cb(native connection, payload), commit when it returns 0 and roll
     * back otherwise. LEASE_EBUSY when try_only and the lock is taken;
     * LEASE_ETIMEOUT when waiting for it ran out of time.
     */
    int (*advisory_txn)(lease_store *store, int64_t lock_key, int try_only,
                        int (*cb)(void *native, void *payload), void *payload);

    /* ---- version 2 ---- */

    /*
     * Optional, both or neither: the grant history (lease/history.h).
     * A store that has it records, in the same atomic step as the operation
     * itself, so that a client dying in between cannot leave a grant out:
     *  - acquire granting a new token: an entry (token, owner, label, the
     *    granted ttl, acquired_ms = now, LEASE_ENDED_HELD); the previous
     *    grant's entry, if still HELD, becomes EXPIRED with ended_ms = when
     *    it expired (0 if the store cannot know); entries older than the
     *    newest LEASE_HISTORY_KEEP may be pruned (the history stays
     *    bounded: a store may let it grow a little past the mark between
     *    prunes);
     *  - release: RELEASED, ended_ms = now.
     * A retried acquire by the holder (same token) records nothing.
     *
     * history: fill out[0 .. *n) newest first, at most `max` (>= 1)
     * entries; *n = 0 for a key never acquired. The newest entry may still
     * read HELD after its lease expired: the core checks it with inspect.
     */
    int (*history)(lease_history_entry *out, size_t *n, lease_store *store,
                   const char *key, size_t max);

    /*
     * Mark the entry of (key, owner, token) LOST, unless it is RELEASED,
     * keeping its ended_ms if it has one, else the lease's expiry if the
     * store still knows it, else now. The core calls it after the store
     * refused a renew with LEASE_ELOST. A later release leaves it LOST.
     * Nothing to mark (pruned, another owner) is not an error.
     */
    int (*history_lost)(lease_store *store, const char *key, const char *owner,
                        uint64_t token);

    /* ---- version 3 ---- */

    /*
     * Required, with open3: the size of the store's connection struct
     * (sizeof(my_store), whose first member is lease_store). The core
     * allocates it zeroed and fills the lease_store part (backend, url,
     * url_redacted, timeout_ms, ttl_max_ms) before open3 runs, so that the
     * store's messages name the redacted URL and its waits read
     * store->timeout_ms from the first call on, with no copies of its own.
     */
    size_t store_size;

    /*
     * Required. What open is to earlier versions, on the struct the core
     * allocated: parse `url` (store->url, passed for convenience), connect,
     * create or upgrade the schema, within store->timeout_ms. On failure
     * release whatever it took and return the error: the core then frees
     * the struct without calling close.
     */
    int (*open3)(lease_store *store, const char *url);

    /* ---- version 4 ---- */

    /*
     * Optional (LEASE_FEATURE_SHARED, which also needs RENEW_MANY). For a
     * store whose expiry is an object of its own that many keys can share
     * (an etcd lease): called once by lease_session_open() on the
     * session's own handle, before any acquire on it. From then on every
     * grant acquired over this handle is attached to one store-side lease
     * of ttl_ms, which renew_many keeps alive with one request for the
     * whole batch (and renew for one grant); release removes the key
     * without ending the shared lease; when the shared lease ends, every
     * grant in it is lost (renew and renew_many answer LEASE_ELOST for
     * each). Tokens are what they are without it.
     */
    int (*share_lease)(lease_store *store, uint64_t ttl_ms);

    /* ---- version 5 ---- */

    /*
     * Optional (NULL: lease_fence_install() answers LEASE_EUNSUPPORTED).
     * Install a resource-side fencing kit (docs/fencing.md) into the
     * server behind the handle, over the handle's own connection, so that
     * its credentials and TLS serve the install too: Redis loads `kit`
     * (lease_fence.lua's text) with FUNCTION LOAD REPLACE. `kit` is len
     * bytes and a NUL, checked by the core (1 .. LEASE_KIT_MAX bytes, no
     * NUL inside). Bounded by store->timeout_ms; what the server
     * refused is LEASE_ESTORE with its message.
     */
    int (*install_kit)(lease_store *store, const char *kit, size_t len);
} lease_backend;

/*
 * The part of a connection the core owns. A store embeds it first and must
 * not change it. Before version 3, `open` leaves it zeroed and the core
 * fills it after open returns; from version 3 on it is filled before open3
 * runs. timeout_ms always holds the handle's timeout: a store reads it
 * there rather than keeping a copy (set_timeout is called after it
 * changed).
 */
struct lease_store {
    const lease_backend *backend;
    char *url;          /* the URL as given, password included: never print */
    char *url_redacted; /* for messages and logs */
    uint64_t timeout_ms; /* bound on one call of a slot */
    uint64_t ttl_max_ms;
};

/*
 * Make a backend available to lease_store_open() for its schemes, before
 * the built-in ones. Call it at start-up, before other threads use the
 * library. EINVALID if the version or a required slot is missing, or a
 * feature bit names a slot the table does not have.
 */
int lease_backend_register(const lease_backend *backend);

/*
 * Set the thread's last error to `code` with a printf-style message and
 * return `code`, so a slot can write `return lease_store_seterr(...)`.
 */
int lease_store_seterr(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif
