/*
 * session.c - many grants kept by one thread over one connection: renewal
 * in batches, one local deadline per grant, and one call per lost grant.
 *
 * Locking: `mu` guards the connection, the grants' array and index, the
 * lost list and the thread's scratch. The thread holds it for one batch at
 * a time and never while it sleeps or runs callbacks; a lease_held's
 * state, deadline and token are atomics, so the accessors take no lock.
 * A grant's lease_grant is written once, before the grant is published,
 * and never again: lease_held_grant() may be read from any thread.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lease_int.h"

#define SESSION_BATCH_DEFAULT 1000
/* A store without renew_many renews one grant per call, under the mutex:
 * in batches this small, callers wait for a few calls at most. */
#define FALLBACK_BATCH 16
#define ACQUIRE_BACKOFF_MIN_MS 10
#define ACQUIRE_BACKOFF_MAX_MS 1000

struct lease_held {
    lease_grant grant;       /* as acquired; never written after publishing */
    _Atomic int state;       /* lease_keeper_state: HELD or LOST */
    _Atomic int64_t deadline_ns;
    _Atomic uint64_t token;
    lease_held_lost_cb on_lost;
    void *payload;
    uint64_t hash;           /* of grant.key, for the index */
    size_t pos;              /* in session->held; under mu */
    uint64_t round;          /* the last renewal round that took it; under mu */
    int reason;              /* why it was lost; the thread's */
    int mark_history;        /* lost on LEASE_ELOST: tell the history */
    lease_held *next_lost;   /* the lost list, waiting for callbacks */
};

struct lease_session {
    lease_store *store;          /* the session's own connection */
    char owner[LEASE_OWNER_BUFSZ];
    char label[LEASE_LABEL_MAX + 1];
    uint64_t ttl_ms;
    uint64_t every_ms;
    uint64_t call_timeout_ms;    /* the handle's timeout for callers' calls */
    size_t batch_max;
    int step_down;
    lease_session_lost_cb on_lost;
    void *payload;

    pthread_mutex_t mu;
    pthread_cond_t cv;           /* wakes the thread (stop) */
    pthread_cond_t cb_cv;        /* callbacks finished */
    pthread_cond_t calls_cv;     /* a caller's call ended, or closing began */
    int stop;
    int cb_running;              /* the thread is calling back: no frees */
    int closing;                 /* lease_session_close() began: no new calls */
    int inflight;                /* callers' calls in progress */
    int64_t first_ns;            /* no held grant's deadline is before this:
                                    bounds callers' calls (see caller_timeout) */
    _Atomic int waiting;         /* callers waiting for mu */
    _Atomic int64_t due_ns;      /* when the thread wants mu back (its
                                    next round or deadline); INT64_MAX
                                    while it holds it */
    pthread_t thread;

    lease_held **held;           /* every kept grant, in no order */
    size_t n, cap;
    lease_held **index;          /* open addressing on the key's hash */
    size_t slots;                /* a power of two, or 0 */
    _Atomic size_t count;        /* n, for lease_session_count() */
    uint64_t round;
    lease_held *lost;            /* lost, callbacks not yet run */

    /* One batch: the grants, their copies for the store, the answers. */
    lease_held **batch;
    lease_grant *grants;
    int *results;
    uint64_t *granted;
    size_t scratch;
};

/* ---- the index: keys to grants ---- */

static uint64_t key_hash(const char *key)
{
    return (uint64_t)lease_advisory_key(key);
}

static lease_held *index_find(const lease_session *s, const char *key)
{
    uint64_t hv = key_hash(key);
    size_t mask = s->slots - 1, i;

    if (s->slots == 0)
        return NULL;
    for (i = hv & mask; s->index[i]; i = (i + 1) & mask)
        if (s->index[i]->hash == hv && strcmp(s->index[i]->grant.key, key) == 0)
            return s->index[i];
    return NULL;
}

static void index_put(lease_held **tab, size_t slots, lease_held *h)
{
    size_t mask = slots - 1, i = h->hash & mask;

    while (tab[i])
        i = (i + 1) & mask;
    tab[i] = h;
}

/* Linear probing without tombstones: after removing, pull back every entry
 * of the run that would no longer be found past the hole. */
static void index_remove(lease_session *s, const lease_held *h)
{
    size_t mask = s->slots - 1, i = h->hash & mask, j;

    while (s->index[i] != h)
        i = (i + 1) & mask;
    for (j = i;;) {
        size_t home;

        j = (j + 1) & mask;
        if (s->index[j] == NULL)
            break;
        home = s->index[j]->hash & mask;
        if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
            continue;
        s->index[i] = s->index[j];
        i = j;
    }
    s->index[i] = NULL;
}

/* Room for one more grant, made before the store is asked, so that keeping
 * a grant the store gave cannot fail. */
static int make_room(lease_session *s)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        lease_held **p = realloc(s->held, cap * sizeof(*p));

        if (p == NULL)
            return lease__seterr(LEASE_ENOMEM, "out of memory");
        s->held = p;
        s->cap = cap;
    }
    if ((s->n + 1) * 2 > s->slots) {
        size_t slots = s->slots ? s->slots * 2 : 32, i;
        lease_held **tab = calloc(slots, sizeof(*tab));

        if (tab == NULL)
            return lease__seterr(LEASE_ENOMEM, "out of memory");
        for (i = 0; i < s->n; i++)
            index_put(tab, slots, s->held[i]);
        free(s->index);
        s->index = tab;
        s->slots = slots;
    }
    return 0;
}

static void keep(lease_session *s, lease_held *h)
{
    int64_t d = atomic_load(&h->deadline_ns);

    if (d < s->first_ns)
        s->first_ns = d;
    h->pos = s->n;
    s->held[s->n++] = h;
    index_put(s->index, s->slots, h);
    atomic_store(&s->count, s->n);
}

static void unkeep(lease_session *s, lease_held *h)
{
    lease_held *last = s->held[--s->n], **p;

    /* A grant lost in this round whose callbacks have not run yet (the
     * thread lets callers in between batches) leaves the list of pending
     * callbacks before it is freed. */
    for (p = &s->lost; *p; p = &(*p)->next_lost)
        if (*p == h) {
            *p = h->next_lost;
            break;
        }

    s->held[h->pos] = last;
    last->pos = h->pos;
    index_remove(s, h);
    atomic_store(&s->count, s->n);
}

/* ---- the mutex ---- */

/* Callers say that they wait, so that the thread lets them in between two
 * batches: a mutex is not fair, and the thread would take it straight
 * back. */
static void lock_caller(lease_session *s)
{
    int i;

    /* ...and the other way round: once the thread's round is due, a caller
     * that acquires key after key would take the mutex straight back each
     * time and starve renewals past their deadlines. Stand back (bounded:
     * at most ~100 ms) until the thread has it. */
    for (i = 0; i < 2000 && lease_clock_ns() >= atomic_load(&s->due_ns); i++)
        usleep(50);
    atomic_fetch_add(&s->waiting, 1);
    pthread_mutex_lock(&s->mu);
    atomic_fetch_sub(&s->waiting, 1);
}

/* Under mu, on the thread: a caller waits at most one batch. The wait for
 * them is bounded, so that a stream of callers cannot starve renewals. */
static void let_callers_in(lease_session *s)
{
    int i;

    if (atomic_load(&s->waiting) == 0)
        return;
    /* Due now: the callers let in stand back at their next lock_caller,
     * so the mutex comes back here instead of to the next caller's try. */
    atomic_store(&s->due_ns, lease_clock_ns());
    pthread_mutex_unlock(&s->mu);
    for (i = 0; i < 1000 && atomic_load(&s->waiting) > 0; i++)
        sched_yield();
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->due_ns, INT64_MAX);
}

/* Callbacks run on the session's thread, which holds what a call would
 * wait for (or is what close would join): refuse instead of hanging. */
static int on_own_thread(const lease_session *s)
{
    return pthread_equal(pthread_self(), s->thread);
}

static int check_session(const lease_session *s)
{
    if (s == NULL)
        return lease__seterr(LEASE_EINVALID, "session is NULL");
    if (on_own_thread(s))
        return lease__seterr(LEASE_EINVALID, "lease_session_* called from a "
                             "loss callback (the session's own thread)");
    return 0;
}

/* A caller's call (acquire, claim, release, release_all) is counted, so
 * that lease_session_close() waits for the calls in progress instead of
 * freeing the session under them; once closing began, new calls fail. */
static int call_begin(lease_session *s)
{
    int rc = 0;

    lock_caller(s);
    if (s->closing)
        rc = lease__seterr(LEASE_EINVALID, "the session is closing");
    else
        s->inflight++;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Counted as waiting, as lock_caller is, so that the thread lets it in
 * between batches (let_callers_in) rather than after its whole round: a
 * caller that ended its store call must not wait a round to say so. */
static void call_end(lease_session *s)
{
    atomic_fetch_add(&s->waiting, 1);
    pthread_mutex_lock(&s->mu);
    atomic_fetch_sub(&s->waiting, 1);
    if (--s->inflight == 0)
        pthread_cond_broadcast(&s->calls_cv);
    pthread_mutex_unlock(&s->mu);
}

/* Under mu: the bound on a caller's store call. The thread cannot renew
 * while a caller holds the mutex, so a call that hangs must give the
 * mutex back while the earliest deadline still leaves the thread time to
 * renew: at most half of what is left, at most the handle's timeout. Not
 * below a quarter of the renewal period, though: one grant whose renewals
 * keep failing (its deadline near) must not make every caller's call time
 * out at once; a round trip that short costs the others little. */
static uint64_t caller_timeout(const lease_session *s)
{
    uint64_t bound = s->call_timeout_ms, floor = s->every_ms / 4 ? s->every_ms / 4 : 1;
    int64_t left;

    if (s->first_ns != INT64_MAX) {
        left = s->first_ns - lease_clock_ns();
        bound = left > 2000000 ? (uint64_t)(left / 2000000) : 1;
        if (bound < floor)
            bound = floor;
    }
    return bound < s->call_timeout_ms ? bound : s->call_timeout_ms;
}

/* ---- the thread ---- */

/* Under mu. The state leaves HELD exactly once, so the callbacks run once;
 * they run later, from notify_lost, without the mutex. */
static void lose(lease_session *s, lease_held *h, int reason, int mark_history)
{
    const char *name = lease_store_scheme(s->store);
    int expected = LEASE_KEEPER_HELD;

    if (!atomic_compare_exchange_strong(&h->state, &expected, LEASE_KEEPER_LOST))
        return;
    lease__metric_loss(name, reason != LEASE_ELOST);
    if (h->grant.acquired_ns)
        lease__metric_held(name, lease_clock_ns() - h->grant.acquired_ns);
    lease__log_state(LEASE_LOG_WARN, "lost", name, &h->grant,
                     reason == LEASE_ELOST
                         ? "the store says this owner no longer holds the lease"
                         : "no renewal succeeded before the local deadline: "
                           "authority is uncertain");
    h->reason = reason;
    h->mark_history = mark_history;
    h->next_lost = s->lost;
    s->lost = h;
}

/* Under mu; returns with it held. Callbacks run unlocked, and while they do
 * no grant is freed (release waits for cb_running to clear). The history
 * hears after the application, as the keeper does it. */
static void notify_lost(lease_session *s)
{
    lease_held *list = s->lost, *h;

    if (list == NULL)
        return;
    s->lost = NULL;
    s->cb_running = 1;
    pthread_mutex_unlock(&s->mu);
    for (h = list; h; h = h->next_lost) {
        if (h->on_lost)
            h->on_lost(h, h->reason, h->payload);
        if (s->on_lost)
            s->on_lost(s, h, h->reason, s->payload);
    }
    pthread_mutex_lock(&s->mu);
    lease_store_set_timeout(s->store, s->call_timeout_ms);
    for (h = list; h; h = h->next_lost)
        if (h->mark_history)
            lease__history_lost(s->store, &h->grant);
    s->cb_running = 0;
    pthread_cond_broadcast(&s->cb_cv);
}

/* Under mu: every held grant whose local deadline has passed is lost. */
static void expire(lease_session *s, int64_t now)
{
    size_t i;

    for (i = 0; i < s->n; i++) {
        lease_held *h = s->held[i];

        if (atomic_load(&h->state) == LEASE_KEEPER_HELD &&
            atomic_load(&h->deadline_ns) <= now) {
            lease__seterr(LEASE_ESTORE, "'%s': no renewal succeeded before "
                          "the local deadline", h->grant.key);
            lose(s, h, LEASE_ESTORE, 0);
        }
    }
}

static int64_t earliest_deadline(const lease_session *s)
{
    int64_t first = INT64_MAX;
    size_t i;

    for (i = 0; i < s->n; i++) {
        const lease_held *h = s->held[i];
        int64_t d = atomic_load(&h->deadline_ns);

        if (atomic_load(&h->state) == LEASE_KEEPER_HELD && d < first)
            first = d;
    }
    return first;
}

/* Under mu: wait until `until` (on lease_clock_ns), a stop, or a spurious
 * wake-up; the caller re-checks. */
static void wait_locked(lease_session *s, pthread_cond_t *cv, int64_t until)
{
    (void)lease__cond_wait_until(cv, &s->mu, until);
}

/* A renewal that answers after the deadline is worthless: bound the call
 * by the time left, and by the period so that one stuck attempt leaves
 * time to retry. */
static void bound_timeout(lease_session *s, int64_t left_ns)
{
    uint64_t bound = (uint64_t)left_ns / 1000000 + 1;

    if (bound > s->every_ms)
        bound = s->every_ms;
    lease_store_set_timeout(s->store, bound);
}

/* What a leader stepping down keeps in hand: the last quarter of the ttl. */
static int64_t reserve_ns(const lease_session *s)
{
    return s->step_down ? (int64_t)s->ttl_ms * 1000000 / 4 : 0;
}

/* Under mu: the batch scratch grows with the session, up to batch_max.
 * Out of memory, the batches stay as large as they were. */
static size_t batch_room(lease_session *s)
{
    size_t max = s->store->backend->renew_many ? s->batch_max : FALLBACK_BATCH;
    size_t want = s->n < max ? s->n : max;
    lease_held **b;
    lease_grant *g;
    int *r;
    uint64_t *t;

    if (want <= s->scratch)
        return s->scratch;
    if ((b = realloc(s->batch, want * sizeof(*b))) != NULL)
        s->batch = b;
    if ((g = realloc(s->grants, want * sizeof(*g))) != NULL)
        s->grants = g;
    if ((r = realloc(s->results, want * sizeof(*r))) != NULL)
        s->results = r;
    if ((t = realloc(s->granted, want * sizeof(*t))) != NULL)
        s->granted = t;
    if (b && g && r && t)
        s->scratch = want;
    return s->scratch < max ? s->scratch : max;
}

/* Under mu: the next held grants of this round, at most `room`. A grant
 * whose deadline passed (with step_down: whose last quarter began) is lost
 * instead of sent. *left_ns gets the smallest time left of the batch. */
static size_t take_batch(lease_session *s, size_t room, int64_t *left_ns)
{
    int64_t now = lease_clock_ns(), reserve = reserve_ns(s);
    size_t i, n = 0;

    *left_ns = INT64_MAX;
    for (i = 0; i < s->n && n < room; i++) {
        lease_held *h = s->held[i];
        int64_t left;

        if (h->round == s->round || atomic_load(&h->state) != LEASE_KEEPER_HELD)
            continue;
        h->round = s->round;
        left = atomic_load(&h->deadline_ns) - now;
        if (left <= reserve) {
            lease__seterr(LEASE_ESTORE, "'%s': the local deadline is near",
                          h->grant.key);
            lose(s, h, LEASE_ESTORE, 0);
            continue;
        }
        if (left - reserve < *left_ns)
            *left_ns = left - reserve;
        s->batch[n] = h;
        s->grants[n] = h->grant;
        n++;
    }
    return n;
}

/* One grant's answer: 0 when settled (renewed or lost), 1 when uncertain
 * and to be retried before its deadline. */
static int settle(lease_session *s, lease_held *h, int rc, int64_t deadline)
{
    if (rc == 0) {
        atomic_store(&h->deadline_ns, deadline);
        return 0;
    }
    if (rc == LEASE_ELOST || rc == LEASE_EINVALID) {
        lose(s, h, LEASE_ELOST, rc == LEASE_ELOST);
        return 0;
    }
    if (s->step_down) {
        /* Uncertain is not leader: step down now. */
        lose(s, h, LEASE_ESTORE, 0);
        return 0;
    }
    return 1;
}

/* The store without renew_many: one lease__renew per grant (it records the
 * metric and the log line), each bounded by its own time left. */
static int renew_each(lease_session *s, size_t n)
{
    int64_t reserve = reserve_ns(s);
    int failed = 0;
    size_t i;

    for (i = 0; i < n; i++) {
        lease_held *h = s->batch[i];
        int64_t left = atomic_load(&h->deadline_ns) - lease_clock_ns() - reserve;
        int rc;

        if (left <= 0) {
            lease__seterr(LEASE_ESTORE, "'%s': the local deadline is near",
                          h->grant.key);
            lose(s, h, LEASE_ESTORE, 0);
            continue;
        }
        bound_timeout(s, left);
        rc = lease__renew(&s->grants[i], s->store, s->ttl_ms, 0);
        failed |= settle(s, h, rc, s->grants[i].deadline_ns);
    }
    return failed ? LEASE_ESTORE : 0;
}

/* One grant of a renew_many answer, judged as lease__renew judges one
 * renew (metric, log line, too-late answers). */
static int judge(lease_session *s, size_t i, int rc, int64_t sent, int64_t now,
                 size_t *uncertain)
{
    const char *name = s->store->backend->name;
    lease_grant *g = &s->grants[i];
    uint64_t granted = s->granted[i] ? s->granted[i] : s->ttl_ms;
    int64_t deadline = lease__deadline_ns(sent, granted);

    /* An extension that arrives after its own local deadline gives no
     * authority: uncertain, like a renewal that got no answer. */
    if (rc == 0 && deadline <= now)
        rc = lease__seterr(LEASE_ESTORE, "renew '%s': the store answered after "
                           "%lld ms, past the local deadline of the %llu ms "
                           "lease", g->key, (long long)((now - sent) / 1000000),
                           (unsigned long long)granted);
    else if (rc == LEASE_ELOST)
        lease__not_holder("renew", g->key, g->token, NULL);
    lease__metric_renew(name, rc == 0);
    if (rc < 0) {
        /* A refusal is this grant's own news. An uncertain answer is
         * usually the whole batch's (the store did not answer): said once
         * for the batch by renew_batch, not once per grant per retry. */
        if (rc != LEASE_ELOST && (*uncertain)++ > 0)
            lease__log_state(LEASE_LOG_DEBUG, "renewal_failed", name, g,
                             lease_errmsg());
        else
            lease__log_state(LEASE_LOG_WARN, "renewal_failed", name, g,
                             lease_errmsg());
        return settle(s, s->batch[i], rc, 0);
    }
    g->ttl_ms = granted;
    g->deadline_ns = deadline;
    lease__log_state(LEASE_LOG_DEBUG, "renewed", name, g, NULL);
    return settle(s, s->batch[i], 0, deadline);
}

/* One round trip for the batch; every deadline counts from when it was
 * sent. A failed round trip fails every grant of it. */
static int renew_batch(lease_session *s, size_t n)
{
    char why[LEASE__ERRMSG_SIZE];
    int64_t sent, now;
    int rc, r, failed = 0;
    size_t i, uncertain = 0;

    /* A result the store leaves unwritten reads as uncertain, never as
     * renewed. */
    for (i = 0; i < n; i++)
        s->results[i] = LEASE_ESTORE;
    memset(s->granted, 0, n * sizeof(*s->granted));
    sent = lease_clock_ns();
    rc = s->store->backend->renew_many(s->results, s->granted, s->store,
                                       s->grants, n, s->ttl_ms);
    now = lease_clock_ns();
    if (rc < 0)
        lease__strlcpy(why, lease_errmsg(), sizeof(why));
    for (i = 0; i < n; i++) {
        if (rc < 0)
            lease__seterr(rc, "renew '%s' (in a batch of %zu): %s",
                          s->grants[i].key, n, why);
        /* Only a refusal of this grant loses it: a failed call, or an
         * answer that is neither renewed nor refused, is uncertain. */
        r = rc < 0 ? LEASE_ESTORE : s->results[i];
        if (r != 0 && r != LEASE_ELOST)
            r = LEASE_ESTORE;
        failed |= judge(s, i, r, sent, now, &uncertain);
    }
    if (uncertain > 1 && lease__log_enabled(LEASE_LOG_WARN)) {
        char msg[160];

        snprintf(msg, sizeof(msg), "%zu more of the batch of %zu were not "
                 "renewed either (uncertain: retried before their deadlines)",
                 uncertain - 1, n);
        lease__log(LEASE_LOG_WARN, "renewal_failed", s->store->backend->name, msg);
    }
    return failed ? LEASE_ESTORE : 0;
}

/* Under mu (released between batches for the callbacks): renew every held
 * grant once. Returns when the next round is due: a period from `start`,
 * or sooner when some renewal was uncertain (several tries before the
 * deadline, as the keeper retries). */
static int64_t renew_round(lease_session *s, int64_t start)
{
    int64_t every = (int64_t)s->every_ms * 1000000, next = start + every;

    s->round++;
    while (!s->stop) {
        int64_t left, retry;
        size_t n = take_batch(s, batch_room(s), &left);

        if (n == 0)
            break;
        bound_timeout(s, left);
        if ((s->store->backend->renew_many ? renew_batch(s, n)
                                           : renew_each(s, n)) < 0) {
            retry = left / 4;
            if (retry > every / 2)
                retry = every / 2;
            if (retry < 1000000)
                retry = 1000000;
            if (lease_clock_ns() + retry < next)
                next = lease_clock_ns() + retry;
        }
        notify_lost(s);
        let_callers_in(s);
    }
    return next;
}

static void *run(void *arg)
{
    lease_session *s = arg;
    int64_t next = lease_clock_ns() + (int64_t)s->every_ms * 1000000;

    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        int64_t now = lease_clock_ns(), first = earliest_deadline(s);

        s->first_ns = first;

        /* Wake for the next round and for the first deadline, whichever
         * comes first: a grant whose renewals keep failing is lost when
         * its own deadline passes, not at the next round. */
        if (now < next && now < first) {
            atomic_store(&s->due_ns, next < first ? next : first);
            wait_locked(s, &s->cv, next < first ? next : first);
            atomic_store(&s->due_ns, INT64_MAX);
            continue;
        }
        expire(s, now);
        if (now >= next)
            next = renew_round(s, now);
        notify_lost(s);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- opening and closing ---- */

static int release_chunks(lease_session *s);

static int check_opts(char owner[LEASE_OWNER_BUFSZ], const lease_store *store,
                      const lease_session_opts *o)
{
    int rc;

    if (o == NULL || o->version != LEASE_SESSION_OPTS_VERSION)
        return lease__seterr(LEASE_EINVALID,
                             "options are NULL or not LEASE_SESSION_OPTS_INIT");
    if ((rc = lease__check_holder(owner, store, o->owner, o->ttl_ms, o->label)) < 0)
        return rc;
    if (o->renew_every_ms >= o->ttl_ms)
        return lease__seterr(LEASE_EINVALID,
                             "renewal period must be shorter than the ttl");
    return 0;
}

static void session_free(lease_session *s)
{
    size_t i;

    for (i = 0; i < s->n; i++)
        free(s->held[i]);
    free(s->held);
    free(s->index);
    free(s->batch);
    free(s->grants);
    free(s->results);
    free(s->granted);
    if (s->store)
        lease_store_close(s->store);
    free(s);
}

static void session_sync_init(lease_session *s)
{
    pthread_condattr_t ca;

    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_cond_init(&s->calls_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&s->cb_cv, NULL);
}

static void session_sync_destroy(lease_session *s)
{
    pthread_cond_destroy(&s->cb_cv);
    pthread_cond_destroy(&s->calls_cv);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
}

int lease_session_open(lease_session **out, lease_store *store,
                       const lease_session_opts *opts)
{
    char owner[LEASE_OWNER_BUFSZ];
    lease_session *s;
    int rc;

    if (out == NULL)
        return lease__seterr(LEASE_EINVALID, "out is NULL");
    *out = NULL;
    if (store == NULL)
        return lease__seterr(LEASE_EINVALID, "store is NULL");
    if ((rc = check_opts(owner, store, opts)) < 0)
        return rc;
    if ((s = calloc(1, sizeof(*s))) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    memcpy(s->owner, owner, sizeof(s->owner));
    lease__strlcpy(s->label, opts->label ? opts->label : "", sizeof(s->label));
    s->ttl_ms = opts->ttl_ms;
    s->every_ms = opts->renew_every_ms ? opts->renew_every_ms : opts->ttl_ms / 3;
    if (s->every_ms == 0)
        s->every_ms = 1;
    /* A store with one shared lease renews every grant with one request:
     * its batch is the whole session unless the application says. */
    s->batch_max = opts->batch_max ? opts->batch_max
                   : (store->backend->features & LEASE_FEATURE_SHARED)
                       ? SIZE_MAX
                       : SESSION_BATCH_DEFAULT;
    s->step_down = opts->step_down;
    s->on_lost = opts->on_lost;
    s->payload = opts->payload;
    atomic_init(&s->count, 0);
    atomic_init(&s->due_ns, INT64_MAX);
    s->first_ns = INT64_MAX;
    if ((rc = lease_store_open(&s->store, store->url)) < 0) {
        free(s);
        return rc;
    }
    lease_store_set_ttl_max(s->store, store->ttl_max_ms);
    /* The bound the application chose for its handle, not the default. */
    if ((rc = lease_store_set_timeout(s->store, store->timeout_ms)) < 0) {
        lease_store_close(s->store);
        free(s);
        return rc;
    }
    s->call_timeout_ms = store->timeout_ms;
    /* A store whose expiry can be shared (etcd) keeps every grant of the
     * session in one lease of its own, so that a round is one keep-alive. */
    if ((s->store->backend->features & LEASE_FEATURE_SHARED) &&
        (rc = s->store->backend->share_lease(s->store, s->ttl_ms)) < 0) {
        lease_store_close(s->store);
        free(s);
        return rc;
    }
    session_sync_init(s);
    if (pthread_create(&s->thread, NULL, run, s) != 0) {
        session_sync_destroy(s);
        session_free(s);
        return lease__seterr(LEASE_ENOMEM, "cannot start the session thread");
    }
    *out = s;
    return 0;
}

int lease_session_close(lease_session *s, int release)
{
    int rc = 0;

    if (s == NULL)
        return 0;
    if (on_own_thread(s))
        return check_session(s);
    /* No new calls; those in progress end first (a waiting acquire is woken
     * and gives up), so that nothing uses the session once it is freed. */
    lock_caller(s);
    s->closing = 1;
    pthread_cond_broadcast(&s->calls_cv);
    while (s->inflight > 0)
        pthread_cond_wait(&s->calls_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    /* Released while the thread still renews what is left: releasing
     * thousands of grants one by one can take longer than their ttl. */
    if (release)
        rc = release_chunks(s);
    lock_caller(s);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    session_sync_destroy(s);
    session_free(s);
    return rc;
}

/* ---- keeping grants ---- */

/* Under mu: callers free grants only while no callback can be using one. */
static void wait_callbacks(lease_session *s)
{
    while (s->cb_running)
        pthread_cond_wait(&s->cb_cv, &s->mu);
}

/* Under mu: one try (no waiting) for a key the session does not keep; on
 * success `h` is filled and kept. */
static int acquire_locked(lease_session *s, lease_held *h, const char *key,
                          lease_info *who)
{
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    int rc;

    o.owner = s->owner;
    o.ttl_ms = s->ttl_ms;
    o.label = s->label;
    if (s->closing)
        return lease__seterr(LEASE_EINVALID, "the session is closing");
    if ((rc = make_room(s)) < 0)
        return rc;
    lease_store_set_timeout(s->store, caller_timeout(s));
    memset(who, 0, sizeof(*who));
    if ((rc = lease_acquire(&h->grant, who, s->store, key, &o)) < 0)
        return rc;
    h->hash = key_hash(h->grant.key);
    atomic_store(&h->state, LEASE_KEEPER_HELD);
    atomic_store(&h->deadline_ns, h->grant.deadline_ns);
    atomic_store(&h->token, h->grant.token);
    keep(s, h);
    return 0;
}

static int try_acquire(lease_session *s, lease_held *h, const char *key,
                       lease_info *who)
{
    int rc;

    lock_caller(s);
    if (index_find(s, key))
        rc = lease__seterr(LEASE_EINVALID,
                           "'%s' is already kept by this session", key);
    else
        rc = acquire_locked(s, h, key, who);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Pause between two tries: full jitter in [backoff/2, backoff], never past
 * the moment the holder's lease should end nor past the wait's end. Close
 * cuts it short. */
static void acquire_pause(lease_session *s, uint64_t backoff, int rc,
                          uint64_t remaining_ms, uint64_t left_ms)
{
    uint64_t pause = backoff / 2 + lease__random_u64() % (backoff / 2 + 1);
    int64_t until;

    if (rc == LEASE_EBUSY && remaining_ms + 1 < pause)
        pause = remaining_ms + 1;
    if (pause > left_ms)
        pause = left_ms;
    until = lease_clock_ns() + (int64_t)(pause ? pause : 1) * 1000000;
    lock_caller(s);
    while (!s->closing && lease_clock_ns() < until)
        wait_locked(s, &s->calls_cv, until);
    pthread_mutex_unlock(&s->mu);
}

static int busy_timeout(const char *key, const lease_info *h)
{
    return lease__seterr(LEASE_ETIMEOUT,
                         "'%s' is held by %s%s(owner %s, token %llu), "
                         "%llu ms left",
                         key, h->label[0] ? h->label : "",
                         h->label[0] ? " " : "", h->owner[0] ? h->owner : "?",
                         (unsigned long long)h->token,
                         (unsigned long long)h->remaining_ms);
}

static int check_session_key(const lease_session *s, const char *key)
{
    int rc = check_session(s);

    return rc < 0 ? rc : lease__check_name("key", key);
}

int lease_session_acquire(lease_held **out, lease_info *holder,
                          lease_session *s, const char *key, uint64_t wait_ms,
                          lease_held_lost_cb on_lost, void *payload)
{
    uint64_t backoff = ACQUIRE_BACKOFF_MIN_MS;
    int64_t end;
    lease_held *h;
    int rc;

    if (out == NULL)
        return lease__seterr(LEASE_EINVALID, "out is NULL");
    *out = NULL;
    if ((rc = check_session_key(s, key)) < 0)
        return rc;
    if (wait_ms > LEASE__WAIT_MAX_MS)
        return lease__seterr(LEASE_EINVALID, "wait is longer than 24 h");
    if ((rc = call_begin(s)) < 0)
        return rc;
    if ((h = calloc(1, sizeof(*h))) == NULL) {
        call_end(s);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    end = lease_clock_ns() + (int64_t)wait_ms * 1000000;
    h->on_lost = on_lost;
    h->payload = payload;
    /* The mutex is held for one try at a time, never while waiting, so the
     * renewals of the session's other grants go on meanwhile. */
    for (;;) {
        lease_info who;
        int64_t left;

        if ((rc = try_acquire(s, h, key, &who)) == 0) {
            *out = h;
            call_end(s);
            return 0;
        }
        if (rc == LEASE_EBUSY && holder)
            *holder = who;
        if ((rc != LEASE_EBUSY && rc != LEASE_ESTORE) || wait_ms == 0)
            break;
        left = (end - lease_clock_ns()) / 1000000;
        if (left <= 0) {
            if (rc == LEASE_EBUSY)
                rc = busy_timeout(key, &who);
            break;
        }
        acquire_pause(s, backoff, rc, who.remaining_ms, (uint64_t)left);
        backoff = backoff * 2 > ACQUIRE_BACKOFF_MAX_MS ? ACQUIRE_BACKOFF_MAX_MS
                                                       : backoff * 2;
    }
    free(h);
    call_end(s);
    return rc;
}

/* ---- claim ---- */

static int cmp_key_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int check_claim_keys(const char *const *keys, size_t n)
{
    const char **sorted;
    size_t i;
    int rc = 0;

    for (i = 0; i < n; i++)
        if ((rc = lease__check_name("key", keys[i])) < 0)
            return rc;
    if ((sorted = malloc(n * sizeof(*sorted))) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    memcpy(sorted, keys, n * sizeof(*sorted));
    qsort(sorted, n, sizeof(*sorted), cmp_key_ptr);
    for (i = 1; i < n && rc == 0; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0)
            rc = lease__seterr(LEASE_EINVALID, "key '%s' is given twice",
                               sorted[i]);
    free(sorted);
    return rc;
}

/* One key of a claim: kept already (by this or another thread's call), or
 * one try. */
static int claim_one(lease_held **out, lease_session *s, const char *key)
{
    lease_held *h = calloc(1, sizeof(*h)), *found;
    lease_info who;
    int rc;

    if (h == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    lock_caller(s);
    if ((found = index_find(s, key)) != NULL) {
        free(h);
        h = found;
        rc = 0;
    } else if ((rc = acquire_locked(s, h, key, &who)) < 0) {
        free(h);
        h = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    *out = h;
    return rc;
}

int lease_session_claim(size_t *count, lease_held **out, lease_session *s,
                        const char *const *keys, size_t n, size_t want)
{
    size_t kept = 0, i, j, offset;
    int rc, failed = 0, answered = 0;

    if (count == NULL || out == NULL || s == NULL || keys == NULL)
        return lease__seterr(LEASE_EINVALID,
                             "count, out, session or keys is NULL");
    *count = 0;
    if ((rc = check_session(s)) < 0)
        return rc;
    if (n == 0 || want == 0 || want > n)
        return lease__seterr(LEASE_EINVALID,
                             "claim needs at least one key and 1 <= want <= n");
    memset(out, 0, n * sizeof(*out));
    if ((rc = check_claim_keys(keys, n)) < 0 || (rc = call_begin(s)) < 0)
        return rc;
    lock_caller(s);
    /* A lost grant still kept is no authority: it is not counted, and its
     * key is tried again only once the application releases it. */
    for (i = 0; i < n; i++)
        if ((out[i] = index_find(s, keys[i])) != NULL &&
            atomic_load(&out[i]->state) == LEASE_KEEPER_HELD)
            kept++;
    pthread_mutex_unlock(&s->mu);
    /* Replicas of different owners start at different keys, so that they
     * spread over the keys instead of all racing for the first ones. */
    offset = (size_t)((uint64_t)lease_advisory_key(s->owner) % n);
    for (j = 0; j < n && kept < want; j++) {
        i = (offset + j) % n;
        if (out[i])
            continue;
        rc = claim_one(&out[i], s, keys[i]);
        if (rc == 0 || rc == LEASE_EBUSY) {
            answered = 1;
            kept += rc == 0;
            continue;
        }
        /* The store failing: every further try would wait out a timeout. */
        failed = rc;
        break;
    }
    call_end(s);
    *count = kept;
    return failed && !answered ? failed : 0;
}

/* ---- accessors ---- */

int lease_held_valid(const lease_held *h)
{
    /* Both: the flag says the store refused us; the clock catches a pause
     * in which the session's thread could not run either. */
    return h != NULL && atomic_load(&h->state) == LEASE_KEEPER_HELD &&
           lease_clock_ns() < atomic_load(&h->deadline_ns);
}

uint64_t lease_held_remaining_ms(const lease_held *h)
{
    int64_t left;

    if (!lease_held_valid(h))
        return 0;
    left = atomic_load(&h->deadline_ns) - lease_clock_ns();
    return left > 0 ? (uint64_t)(left / 1000000) : 0;
}

int64_t lease_held_deadline_ns(const lease_held *h)
{
    return h ? atomic_load(&h->deadline_ns) : 0;
}

uint64_t lease_held_token(const lease_held *h)
{
    return h ? atomic_load(&h->token) : 0;
}

lease_keeper_state lease_held_state(const lease_held *h)
{
    return h ? (lease_keeper_state)atomic_load(&h->state) : LEASE_KEEPER_STOPPED;
}

const lease_grant *lease_held_grant(const lease_held *h)
{
    return h ? &h->grant : NULL;
}

/* ---- releasing ---- */

/*
 * Under mu, `h` already out of the index. A grant the store refused costs
 * no call. A grant lost for want of an answer (its deadline passed, or
 * step_down) may still be the key's lease in the store, and on etcd the
 * session's shared lease would keep it alive: it is released too, guarded
 * by its owner and token as every release (a no-op if another owner has
 * the key by now). Either way a lost grant answers LEASE_ELOST.
 */
static int release_one(lease_session *s, lease_held *h)
{
    int rc;

    if (atomic_load(&h->state) == LEASE_KEEPER_HELD || h->reason != LEASE_ELOST) {
        lease_store_set_timeout(s->store, caller_timeout(s));
        rc = lease_release(s->store, &h->grant);
        if (atomic_load(&h->state) == LEASE_KEEPER_HELD)
            return rc;
    }
    return lease__seterr(LEASE_ELOST, "'%s' was lost: its authority had ended",
                         h->grant.key);
}

int lease_session_release(lease_session *s, lease_held *h)
{
    int rc;

    if (s == NULL || h == NULL)
        return lease__seterr(LEASE_EINVALID, "session or held is NULL");
    if ((rc = check_session(s)) < 0 || (rc = call_begin(s)) < 0)
        return rc;
    lock_caller(s);
    wait_callbacks(s);
    if (index_find(s, h->grant.key) != h) {
        rc = lease__seterr(LEASE_EINVALID, "'%s' is not kept by this session",
                           h->grant.key);
        h = NULL;
    } else {
        unkeep(s, h);
        rc = release_one(s, h);
    }
    pthread_mutex_unlock(&s->mu);
    free(h);
    call_end(s);
    return rc;
}

/* Grants released per turn of the mutex by release_all: between two turns
 * the thread renews the rest, which may wait longer than their ttl for a
 * release of thousands one by one. */
#define RELEASE_CHUNK 32

static int release_chunks(lease_session *s)
{
    char first[LEASE__ERRMSG_SIZE];
    lease_held *chunk[RELEASE_CHUNK];
    size_t n, i;
    int rc = 0;

    do {
        lock_caller(s);
        wait_callbacks(s);
        for (n = 0; n < RELEASE_CHUNK && s->n > 0; n++) {
            chunk[n] = s->held[s->n - 1];
            unkeep(s, chunk[n]);
        }
        for (i = 0; i < n; i++) {
            int r = release_one(s, chunk[i]);

            if (r < 0 && rc == 0) {
                rc = r;
                lease__strlcpy(first, lease_errmsg(), sizeof(first));
            }
            free(chunk[i]);
        }
        pthread_mutex_unlock(&s->mu);
    } while (n == RELEASE_CHUNK);
    return rc < 0 ? lease__seterr(rc, "%s", first) : 0;
}

int lease_session_release_all(lease_session *s)
{
    int rc;

    if ((rc = check_session(s)) < 0 || (rc = call_begin(s)) < 0)
        return rc;
    rc = release_chunks(s);
    call_end(s);
    return rc;
}

size_t lease_session_count(const lease_session *s)
{
    /* An atomic copy of the number kept, so that a const session needs no
     * lock. */
    return s ? atomic_load(&s->count) : 0;
}
