/*
 * keeper.c - holding a lease: renew in the background, keep the local
 * deadline, and call back once when authority ends.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lease_int.h"

struct lease_keeper {
    lease_store *store;      /* the keeper's own connection */
    lease_grant grant;       /* touched only by the keeper's thread */
    _Atomic int state;       /* lease_keeper_state */
    _Atomic int64_t deadline_ns;
    _Atomic uint64_t token;
    uint64_t every_ms;
    int step_down;
    lease_lost_cb on_lost;
    void *payload;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;                /* under mu */
    pthread_t thread;
};

static void lose(lease_keeper *k, int reason)
{
    int expected = LEASE_KEEPER_HELD;

    /* The state leaves HELD exactly once, so on_lost runs exactly once. */
    if (!atomic_compare_exchange_strong(&k->state, &expected, LEASE_KEEPER_LOST))
        return;
    lease__metric_loss(lease_store_scheme(k->store), reason != LEASE_ELOST);
    if (k->grant.acquired_ns)
        lease__metric_held(lease_store_scheme(k->store),
                           lease_clock_ns() - k->grant.acquired_ns);
    lease__log_state(LEASE_LOG_WARN, "lost", lease_store_scheme(k->store), &k->grant,
                     reason == LEASE_ELOST
                         ? "the store says this owner no longer holds the lease"
                         : "no renewal succeeded before the local deadline: "
                           "authority is uncertain");
    if (k->on_lost)
        k->on_lost(k, reason, k->payload);
}

/* Sleep until `until` (on lease_clock_ns) or until stopped; 1 if stopped. */
static int wait_until(lease_keeper *k, int64_t until)
{
    int stopped;

    pthread_mutex_lock(&k->mu);
    /* Bounded: each wait ends by `until`, and a late one leaves the loop. */
    while (!k->stop && lease__cond_wait_until(&k->cv, &k->mu, until) == 0)
        ;
    stopped = k->stop;
    pthread_mutex_unlock(&k->mu);
    return stopped;
}

static void *run(void *arg)
{
    lease_keeper *k = arg;
    int64_t next = lease_clock_ns() + (int64_t)k->every_ms * 1000000;

    for (;;) {
        int64_t deadline = atomic_load(&k->deadline_ns), now, left;
        int rc;

        if (wait_until(k, next < deadline ? next : deadline))
            return NULL;
        now = lease_clock_ns();
        left = deadline - now;
        if (left <= 0) {
            lease__seterr(LEASE_ESTORE, "'%s': no renewal succeeded before "
                          "the local deadline", k->grant.key);
            lose(k, LEASE_ESTORE);
            return NULL;
        }
        /* A renewal that answers after the deadline is worthless: bound
         * the call by the time left (a leader stepping down: by the time
         * left before the last quarter of the ttl). */
        if (k->step_down) {
            int64_t quarter = (int64_t)k->grant.ttl_ms * 1000000 / 4;
            if (left <= quarter) {
                lease__seterr(LEASE_ESTORE, "'%s': the local deadline is near",
                              k->grant.key);
                lose(k, LEASE_ESTORE);
                return NULL;
            }
            left -= quarter;
        }
        /* ...and by the renewal period, so that one attempt stuck on an
         * unresponsive member leaves time to retry through another. */
        {
            uint64_t bound = (uint64_t)left / 1000000 + 1;
            if (bound > k->every_ms)
                bound = k->every_ms;
            lease_store_set_timeout(k->store, bound);
        }
        rc = lease__renew(&k->grant, k->store, k->grant.ttl_ms, 0);
        if (rc == 0) {
            atomic_store(&k->deadline_ns, k->grant.deadline_ns);
            next = now + (int64_t)k->every_ms * 1000000;
        } else if (rc == LEASE_ELOST || rc == LEASE_EINVALID) {
            /* The application hears first; the history can wait a call. */
            lose(k, LEASE_ELOST);
            if (rc == LEASE_ELOST)
                lease__history_lost(k->store, &k->grant);
            return NULL;
        } else if (k->step_down) {
            /* Uncertain is not leader: step down now, do not retry. */
            lose(k, LEASE_ESTORE);
            return NULL;
        } else {
            /* Uncertain: retry soon, several times before the deadline. */
            int64_t retry = left / 4;
            if (retry > (int64_t)k->every_ms * 1000000 / 2)
                retry = (int64_t)k->every_ms * 1000000 / 2;
            if (retry < 1000000)
                retry = 1000000;
            next = now + retry;
        }
    }
}

int lease_keeper_start(lease_keeper **out, lease_store *store,
                       const lease_grant *grant, const lease_keeper_opts *opts)
{
    lease_keeper_opts defaults = LEASE_KEEPER_OPTS_INIT;
    lease_keeper *k;
    int rc;

    if (out == NULL)
        return lease__seterr(LEASE_EINVALID, "out is NULL");
    *out = NULL;
    if (store == NULL || grant == NULL)
        return lease__seterr(LEASE_EINVALID, "store or grant is NULL");
    if (opts == NULL)
        opts = &defaults;
    if (opts->version != LEASE_KEEPER_OPTS_VERSION)
        return lease__seterr(LEASE_EINVALID,
                             "options are not LEASE_KEEPER_OPTS_INIT");
    if ((rc = lease__check_grant(grant)) < 0 ||
        (rc = lease__check_ttl(store, grant->ttl_ms)) < 0)
        return rc;
    if (grant->deadline_ns == 0)
        return lease__seterr(LEASE_EINVALID,
                             "grant has no local deadline: keep a grant "
                             "returned by lease_acquire");
    if (opts->renew_every_ms >= grant->ttl_ms)
        return lease__seterr(LEASE_EINVALID,
                             "renewal period must be shorter than the ttl");
    if ((k = calloc(1, sizeof(*k))) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    k->grant = *grant;
    k->every_ms = opts->renew_every_ms ? opts->renew_every_ms : grant->ttl_ms / 3;
    if (k->every_ms == 0)
        k->every_ms = 1;
    k->on_lost = opts->on_lost;
    k->payload = opts->payload;
    k->step_down = opts->step_down;
    atomic_init(&k->state, LEASE_KEEPER_HELD);
    atomic_init(&k->deadline_ns, grant->deadline_ns);
    atomic_init(&k->token, grant->token);
    if ((rc = lease_store_open(&k->store, store->url)) < 0) {
        free(k);
        return rc;
    }
    lease_store_set_ttl_max(k->store, store->ttl_max_ms);
    pthread_mutex_init(&k->mu, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&k->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (pthread_create(&k->thread, NULL, run, k) != 0) {
        lease_store_close(k->store);
        pthread_cond_destroy(&k->cv);
        pthread_mutex_destroy(&k->mu);
        free(k);
        return lease__seterr(LEASE_ENOMEM, "cannot start the keeper thread");
    }
    *out = k;
    return 0;
}

int lease_keeper_valid(const lease_keeper *k)
{
    /* Both: the flag says the store refused us; the clock catches a pause
     * in which the keeper's thread could not run either. */
    return k != NULL && atomic_load(&k->state) == LEASE_KEEPER_HELD &&
           lease_clock_ns() < atomic_load(&k->deadline_ns);
}

uint64_t lease_keeper_remaining_ms(const lease_keeper *k)
{
    int64_t left;

    if (!lease_keeper_valid(k))
        return 0;
    left = atomic_load(&k->deadline_ns) - lease_clock_ns();
    return left > 0 ? (uint64_t)(left / 1000000) : 0;
}

int64_t lease_keeper_deadline_ns(const lease_keeper *k)
{
    return k ? atomic_load(&k->deadline_ns) : 0;
}

uint64_t lease_keeper_token(const lease_keeper *k)
{
    return k ? atomic_load(&k->token) : 0;
}

lease_keeper_state lease_keeper_state_get(const lease_keeper *k)
{
    return k ? (lease_keeper_state)atomic_load(&k->state) : LEASE_KEEPER_STOPPED;
}

int lease_keeper_stop(lease_grant *last, lease_keeper *k, int release)
{
    int expected = LEASE_KEEPER_HELD, rc = 0;

    if (k == NULL)
        return 0;
    pthread_mutex_lock(&k->mu);
    k->stop = 1;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    pthread_join(k->thread, NULL);
    /* Only now is the thread gone, so k->grant is ours to read. */
    if (atomic_compare_exchange_strong(&k->state, &expected,
                                       LEASE_KEEPER_STOPPED) && release) {
        lease_store_set_timeout(k->store, LEASE__TIMEOUT_DEFAULT_MS);
        rc = lease_release(k->store, &k->grant);
    }
    if (last)
        *last = k->grant;
    lease_store_close(k->store);
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mu);
    free(k);
    return rc;
}
