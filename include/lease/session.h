/*
 * lease/session.h - holding many leases at once: one background thread and
 * one store connection renew every grant of the session.
 *
 * A keeper (lease/keeper.h) is one thread and one connection per lease;
 * a process that holds hundreds or thousands of leases (a replica owning
 * its share of tenants or shards, a scheduler with one lease per job) uses
 * a session instead. Every grant of a session has the session's ttl and is
 * renewed on one schedule, in batches: one round trip per batch where the
 * store can (its renew_many slot), else one renew per grant over the same
 * connection. Each grant keeps its own local deadline, exactly as a
 * keeper's: the time its last successful renew was sent, plus the granted
 * ttl, minus a margin. A grant the store refuses is lost alone; a batch
 * that fails leaves every grant's deadline to run out as it would for a
 * keeper (with step_down, every grant of the failed batch is lost at once).
 *
 * Threading: lease_held_valid(), lease_held_remaining_ms(),
 * lease_held_deadline_ns(), lease_held_token(), lease_held_state() and
 * lease_held_grant() may be called from any thread at any time and do not
 * touch the store. lease_session_acquire(), lease_session_claim(),
 * lease_session_release(), lease_session_release_all() and
 * lease_session_count() may be called from any thread; they are
 * serialised with the renewing thread (a call waits at most one store
 * timeout for a batch in progress). lease_session_close() once, by one
 * thread, not from a callback: calls in progress on other threads end
 * first (an acquire waiting for its key gives up with LEASE_EINVALID), and
 * calls that begin once it has begun fail with LEASE_EINVALID; none may
 * begin after it returns. Callbacks run on the session's thread:
 * keep them short, and call no lease_session_* function from them (those
 * that would wait for the thread return LEASE_EINVALID there).
 */
#ifndef LEASE_SESSION_H
#define LEASE_SESSION_H

#include "types.h"
#include "lease.h"
#include "keeper.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lease_session lease_session;

/* One grant kept by a session. Valid until lease_session_release() of it,
 * lease_session_release_all() or lease_session_close(); a lost grant stays
 * valid (state LEASE_KEEPER_LOST) until then. */
typedef struct lease_held lease_held;

/*
 * Called once per grant, from the session's thread, when its authority
 * ends: reason LEASE_ELOST (the store said another owner or token holds
 * the key) or LEASE_ESTORE (renewals failed until its local deadline was
 * near: uncertain, so treated as lost).
 */
typedef void (*lease_session_lost_cb)(lease_session *session, lease_held *held,
                                      int reason, void *payload);

#define LEASE_SESSION_OPTS_VERSION 1

typedef struct lease_session_opts {
    unsigned int version;      /* LEASE_SESSION_OPTS_VERSION */
    const char *owner;         /* required: every grant's owner (lease_owner_new) */
    uint64_t ttl_ms;           /* required: every grant's ttl */
    const char *label;         /* optional holder label (NULL: "") */
    uint64_t renew_every_ms;   /* 0: ttl/3; must be below the ttl */
    size_t batch_max;          /* grants per renewal round trip (0: 1000;
                                  all for a store whose grants share one
                                  store-side lease, as etcd's do) */
    lease_session_lost_cb on_lost; /* optional: any grant of the session */
    void *payload;             /* passed to on_lost */
    int step_down;             /* as lease_keeper_opts.step_down, per grant */
} lease_session_opts;

#define LEASE_SESSION_OPTS_INIT \
    { LEASE_SESSION_OPTS_VERSION, NULL, 0, NULL, 0, 0, NULL, NULL, 0 }

/*
 * Open a session. It opens its own connection with the URL of `store`
 * (which it does not use after this returns) and starts its thread.
 * *out is freed by lease_session_close().
 */
int lease_session_open(lease_session **out, lease_store *store,
                       const lease_session_opts *opts);

/* A per-grant callback, besides the session's on_lost (both run). */
typedef void (*lease_held_lost_cb)(lease_held *held, int reason, void *payload);

/*
 * Acquire `key` for the session's owner with the session's ttl and label,
 * waiting at most wait_ms (0: try once; as lease_acquire), and keep it.
 * on_lost may be NULL. LEASE_EBUSY / LEASE_ETIMEOUT with `holder` filled
 * (may be NULL) when another owner holds it; LEASE_EINVALID for a key this
 * session already keeps.
 */
int lease_session_acquire(lease_held **out, lease_info *holder,
                          lease_session *session, const char *key,
                          uint64_t wait_ms, lease_held_lost_cb on_lost,
                          void *payload);

/*
 * Work partitioning: try each of the n keys once (no waiting), starting
 * at an offset derived from the owner so that replicas spread over the
 * keys, until `want` are held by this session (keys it already holds
 * count). out[i] is set for each key i now kept by the session (NULL for
 * the others); *count gets how many are held: a lost grant still kept is
 * set in out[] but not counted, and its key is tried again only after
 * lease_session_release() of it. 0 even when fewer than
 * `want` could be had; an error only for bad input (n == 0, want == 0 or
 * > n, a NULL or duplicate key) or when the store failed before any
 * key could be tried.
 */
int lease_session_claim(size_t *count, lease_held **out, lease_session *session,
                        const char *const *keys, size_t n, size_t want);

/* 1 while the grant is held and its local deadline has not passed. */
int lease_held_valid(const lease_held *held);
uint64_t lease_held_remaining_ms(const lease_held *held);
int64_t lease_held_deadline_ns(const lease_held *held);
uint64_t lease_held_token(const lease_held *held);
lease_keeper_state lease_held_state(const lease_held *held);
/* key, owner, label, token, ttl of the grant (not its moving deadline). */
const lease_grant *lease_held_grant(const lease_held *held);

/*
 * Stop keeping `held` and release it in the store if it is still held;
 * frees it. 0, LEASE_ELOST (it was lost) or LEASE_ESTORE (the release
 * failed; the lease runs out by itself). A grant lost for want of an
 * answer (not refused by the store) is released too, guarded by its owner
 * and token, since the store may still hold it; it answers LEASE_ELOST.
 */
int lease_session_release(lease_session *session, lease_held *held);

/* Release every grant of the session (each as lease_session_release);
 * returns the first error, after trying them all. */
int lease_session_release_all(lease_session *session);

/* How many grants the session keeps (held or lost, not yet released). */
size_t lease_session_count(const lease_session *session);

/*
 * Stop the thread, release every grant still held when `release` is set
 * (else they run out by themselves), close the connection and free the
 * session and its grants. NULL is allowed. Returns as release_all.
 */
int lease_session_close(lease_session *session, int release);

#ifdef __cplusplus
}
#endif
#endif
