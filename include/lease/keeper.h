/*
 * lease/keeper.h - holding a lease: background renewal, the local deadline,
 * and one call when authority ends.
 *
 * A keeper renews a grant from its own thread over its own connection (a
 * second handle opened on the same URL), so a slow caller never delays a
 * renewal. It keeps the local deadline of the grant: the time each
 * successful renew was *sent*, plus the granted ttl, minus a margin.
 *
 * Threading: lease_keeper_valid(), lease_keeper_remaining_ms(),
 * lease_keeper_deadline_ns(), lease_keeper_token() and
 * lease_keeper_state_get()
 * may be called from any thread at any time and do not touch the store.
 * lease_keeper_stop() must be called once, by one thread, and not from the
 * on_lost callback.
 */
#ifndef LEASE_KEEPER_H
#define LEASE_KEEPER_H

#include "types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lease_keeper lease_keeper;

/*
 * Called once, from the keeper's thread, when authority ends:
 *   LEASE_ELOST   the store said this owner/token no longer holds the lease
 *   LEASE_ESTORE  renewals failed until the local deadline was near: the
 *                 lease may still exist in the store but authority is
 *                 uncertain, so it is treated as lost
 * Keep it short; it must not call lease_keeper_stop().
 */
typedef void (*lease_lost_cb)(lease_keeper *keeper, int reason, void *payload);

#define LEASE_KEEPER_OPTS_VERSION 1

typedef struct lease_keeper_opts {
    unsigned int version;     /* LEASE_KEEPER_OPTS_VERSION */
    uint64_t renew_every_ms;  /* 0: ttl/3 */
    lease_lost_cb on_lost;    /* optional */
    void *payload;            /* passed to on_lost */
    /*
     * The step-down policy of a leader: with step_down set, the first
     * renewal that fails (or that cannot finish before the last quarter
     * of the ttl) ends authority at once: on_lost(LEASE_ESTORE), no
     * further renewal. Without it the keeper retries until the deadline.
     */
    int step_down;
} lease_keeper_opts;

#define LEASE_KEEPER_OPTS_INIT { LEASE_KEEPER_OPTS_VERSION, 0, NULL, NULL, 0 }

typedef enum lease_keeper_state {
    LEASE_KEEPER_HELD = 0,   /* renewing; check lease_keeper_valid() */
    LEASE_KEEPER_LOST = 1,   /* authority ended; on_lost was called */
    LEASE_KEEPER_STOPPED = 2 /* lease_keeper_stop() was called */
} lease_keeper_state;

/*
 * Start keeping `grant`, which was acquired from `store`. The keeper opens
 * its own connection with the store's URL; `store` itself is not used
 * after this returns. opts may be NULL. *out is freed by lease_keeper_stop().
 */
int lease_keeper_start(lease_keeper **out, lease_store *store,
                       const lease_grant *grant, const lease_keeper_opts *opts);

/*
 * "Is my authority still valid?": 1 while the lease is held and its local
 * deadline has not passed; 0 otherwise. Reads an atomic and the clock.
 * Ask it before each side effect, and still carry the token to the resource:
 * a pause right after this check is exactly what fencing is for.
 */
int lease_keeper_valid(const lease_keeper *keeper);

/* Milliseconds before the local deadline (0 once passed or lost). */
uint64_t lease_keeper_remaining_ms(const lease_keeper *keeper);

/* The current local deadline on lease_clock_ns() (moves on each renew). */
int64_t lease_keeper_deadline_ns(const lease_keeper *keeper);

uint64_t lease_keeper_token(const lease_keeper *keeper);

lease_keeper_state lease_keeper_state_get(const lease_keeper *keeper);

/*
 * Stop renewing, join the thread and free the keeper. With release != 0 and
 * the lease still held, release it (its result is returned: 0, LEASE_ELOST
 * or LEASE_ESTORE). Copies the last grant (with its deadline) to `last` if
 * not NULL. NULL keeper is allowed.
 */
int lease_keeper_stop(lease_grant *last, lease_keeper *keeper, int release);

#ifdef __cplusplus
}
#endif
#endif
