/*
 * test_session.c - the core's session logic (lease/session.h) with an
 * in-memory fake store; the stores' own renew_many is tested against real
 * servers by tests/conformance/session.c. Checked here:
 *  - renew_many gets batches of at most batch_max covering every grant;
 *  - a store without renew_many gets one renew per grant;
 *  - a grant the store refuses is lost alone, its callbacks called once;
 *  - a failing batch loses its grants when their deadlines pass, not
 *    before (with step_down: at once);
 *  - release, release_all and close release in the store;
 *  - claim keeps at most `want`, counting keys already kept;
 *  - bad input is LEASE_EINVALID.
 * Waits for the session's thread are bounded polls, never a bare sleep.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <cmocka.h>

#include "lease_int.h"
#include "fake_slots.h"

#define A_OWNER "11111111-1111-4111-8111-111111111111"
#define B_OWNER "22222222-2222-4222-8222-222222222222"
#define TTL_MS 300
#define NKEYS 1100

typedef struct {
    char key[LEASE_KEY_MAX + 1];
    char owner[LEASE_OWNER_BUFSZ];
    uint64_t token;
    int held;
    int renewed;
} fake_key;

/* The fake store's keys and what it was asked, under mu: the session's
 * thread calls the store while the test reads it. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    fake_key keys[NKEYS];
    size_t n;
    uint64_t next_token;
    char refuse[LEASE_KEY_MAX + 1]; /* renewals of this key: LEASE_ELOST */
    int fail;                       /* every renewal: LEASE_ESTORE */
    int silent;                     /* renew_many: 0, results unwritten */
    size_t batch_max_seen;
    int many_calls, renew_calls, release_calls, history_lost_calls;
    int acquire_calls, fail_calls, share_calls, set_timeout_calls;
    uint64_t acquire_timeout_ms;    /* the handle's bound at the last acquire */
    uint64_t share_ttl_ms;
} fake;

typedef struct {
    lease_store parent;
} fake_store;

static fake_key *find_key(const char *key, int add)
{
    size_t i;

    for (i = 0; i < fake.n; i++)
        if (strcmp(fake.keys[i].key, key) == 0)
            return &fake.keys[i];
    if (!add || fake.n == NKEYS)
        return NULL;
    lease__strlcpy(fake.keys[fake.n].key, key, sizeof(fake.keys[0].key));
    return &fake.keys[fake.n++];
}

static int fake_open(lease_store **out, const char *url, uint64_t timeout_ms)
{
    fake_store *s = calloc(1, sizeof(*s));

    (void)url;
    (void)timeout_ms;
    if (s == NULL)
        return LEASE_ENOMEM;
    *out = &s->parent;
    return 0;
}

static void fake_close(lease_store *s)
{
    free(s);
}

/* Version 3 and later: the core allocates and frees the struct. */
static int fake_open3(lease_store *s, const char *url)
{
    (void)s;
    (void)url;
    return 0;
}

static void fake_close3(lease_store *s)
{
    (void)s;
}

static int fake_acquire(lease_grant *out, lease_info *holder, lease_store *s,
                        const lease_request *req)
{
    fake_key *k;
    int rc = 0;

    pthread_mutex_lock(&mu);
    fake.acquire_calls++;
    fake.acquire_timeout_ms = s->timeout_ms;
    if ((k = find_key(req->key, 1)) == NULL) {
        rc = lease_store_seterr(LEASE_ESTORE, "fake store full");
    } else if (k->held && strcmp(k->owner, req->owner) != 0) {
        lease__strlcpy(holder->key, k->key, sizeof(holder->key));
        memcpy(holder->owner, k->owner, sizeof(holder->owner));
        holder->token = k->token;
        holder->held = 1;
        holder->remaining_ms = 1000;
        rc = LEASE_EBUSY;
    } else {
        if (!k->held) {
            k->token = ++fake.next_token;
            k->held = 1;
            memcpy(k->owner, req->owner, sizeof(k->owner));
        }
        out->token = k->token;
        out->ttl_ms = req->ttl_ms;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* Under mu. */
static int renew_one(const char *key, const char *owner, uint64_t token)
{
    fake_key *k;

    if (fake.fail)
        return lease_store_seterr(LEASE_ESTORE, "fake store down");
    k = find_key(key, 0);
    if (strcmp(fake.refuse, key) == 0 || k == NULL || !k->held ||
        strcmp(k->owner, owner) != 0 || k->token != token)
        return lease_store_seterr(LEASE_ELOST, "not the holder");
    k->renewed++;
    return 0;
}

static int fake_renew(uint64_t *granted, lease_store *s, const char *key,
                      const char *owner, uint64_t token, uint64_t ttl_ms)
{
    int rc;

    (void)s;
    pthread_mutex_lock(&mu);
    fake.renew_calls++;
    rc = renew_one(key, owner, token);
    pthread_mutex_unlock(&mu);
    *granted = ttl_ms;
    return rc;
}

static int fake_renew_many(int *results, uint64_t *granted, lease_store *s,
                           const lease_grant *grants, size_t n, uint64_t ttl_ms)
{
    size_t i;

    (void)s;
    pthread_mutex_lock(&mu);
    fake.many_calls++;
    if (n > fake.batch_max_seen)
        fake.batch_max_seen = n;
    if (fake.fail) {
        fake.fail_calls++;
        pthread_mutex_unlock(&mu);
        return lease_store_seterr(LEASE_ESTORE, "fake store down");
    }
    if (fake.silent) {
        pthread_mutex_unlock(&mu);
        return 0;
    }
    for (i = 0; i < n; i++) {
        results[i] = renew_one(grants[i].key, grants[i].owner, grants[i].token);
        granted[i] = ttl_ms;
    }
    pthread_mutex_unlock(&mu);
    return 0;
}

static int fake_release(lease_store *s, const char *key, const char *owner,
                        uint64_t token)
{
    fake_key *k;
    int rc = LEASE_ELOST;

    (void)s;
    pthread_mutex_lock(&mu);
    fake.release_calls++;
    k = find_key(key, 0);
    if (k && k->held && strcmp(k->owner, owner) == 0 && k->token == token) {
        k->held = 0;
        rc = 0;
    }
    pthread_mutex_unlock(&mu);
    return rc == 0 ? 0 : lease_store_seterr(rc, "not the holder");
}

static int fake_inspect(lease_info *out, lease_store *s, const char *key)
{
    (void)out;
    (void)s;
    (void)key;
    return LEASE_ENOTFOUND;
}

static int fake_list(lease_store *s, const char *prefix, lease_list_cb cb, void *p)
{
    (void)s;
    (void)prefix;
    (void)cb;
    (void)p;
    return 0;
}

static int fake_history(lease_history_entry *out, size_t *n, lease_store *s,
                        const char *key, size_t max)
{
    (void)out;
    (void)s;
    (void)key;
    (void)max;
    *n = 0;
    return 0;
}

static int fake_history_lost(lease_store *s, const char *key, const char *owner,
                             uint64_t token)
{
    (void)s;
    (void)key;
    (void)owner;
    (void)token;
    pthread_mutex_lock(&mu);
    fake.history_lost_calls++;
    pthread_mutex_unlock(&mu);
    return 0;
}

static int fake_set_timeout(lease_store *s, uint64_t timeout_ms)
{
    (void)s;
    (void)timeout_ms;
    pthread_mutex_lock(&mu);
    fake.set_timeout_calls++;
    pthread_mutex_unlock(&mu);
    return 0;
}

static int fake_share(lease_store *s, uint64_t ttl_ms)
{
    (void)s;
    pthread_mutex_lock(&mu);
    fake.share_calls++;
    fake.share_ttl_ms = ttl_ms;
    pthread_mutex_unlock(&mu);
    return 0;
}

static const char *const many_schemes[] = { "fakesess", NULL };
static const char *const one_schemes[] = { "fakesess1", NULL };
static const char *const shared_schemes[] = { "fakeshared", NULL };

#define FAKE_SLOTS .open = fake_open, .close = fake_close, FAKE_CALLS
#define FAKE_CALLS                                                              \
    .acquire = fake_acquire,                                                    \
    .renew = fake_renew, .release = fake_release, .inspect = fake_inspect,      \
    .list = fake_list, .fence_advance = fake_fence_advance,                     \
    .fence_mark = fake_fence_mark, .guarded_put = fake_guarded_put,             \
    .data_get = fake_data_get, .history = fake_history,                         \
    .history_lost = fake_history_lost, .set_timeout = fake_set_timeout

static const lease_backend many_backend = {
    .version = 2, .name = "fakesess", .schemes = many_schemes,
    .features = LEASE_FEATURE_RENEW_MANY, FAKE_SLOTS,
    .renew_many = fake_renew_many,
};

/* A store whose grants share one store-side lease (as etcd's). */
static const lease_backend shared_backend = {
    .version = 4, .name = "fakeshared", .schemes = shared_schemes,
    .features = LEASE_FEATURE_RENEW_MANY | LEASE_FEATURE_SHARED,
    .store_size = sizeof(fake_store), .open3 = fake_open3,
    .close = fake_close3, FAKE_CALLS,
    .renew_many = fake_renew_many, .share_lease = fake_share,
};

/* The fallback: no renew_many, one renew per grant. */
static const lease_backend one_backend = {
    .version = 2, .name = "fakesess1", .schemes = one_schemes, FAKE_SLOTS,
};

/* ---- helpers ---- */

static int fake_get(const int *field)
{
    int v;

    pthread_mutex_lock(&mu);
    v = *field;
    pthread_mutex_unlock(&mu);
    return v;
}

static uint64_t fake_get_u64(const uint64_t *field)
{
    uint64_t v;

    pthread_mutex_lock(&mu);
    v = *field;
    pthread_mutex_unlock(&mu);
    return v;
}

static void fake_set_fail(int fail)
{
    pthread_mutex_lock(&mu);
    fake.fail = fail;
    pthread_mutex_unlock(&mu);
}

static int renewed(const char *key)
{
    fake_key *k;
    int v;

    pthread_mutex_lock(&mu);
    k = find_key(key, 0);
    v = k ? k->renewed : -1;
    pthread_mutex_unlock(&mu);
    return v;
}

static void pause_ms(int ms)
{
    lease__sleep_ns((int64_t)ms * 1000000);
}

/* Poll until every key has been renewed at least `times` times; 1 if so
 * within 3 s. */
static int wait_renewed(const char *const *keys, size_t n, int times)
{
    int i;

    for (i = 0; i < 1500; i++) {
        size_t j;

        for (j = 0; j < n && renewed(keys[j]) >= times; j++)
            ;
        if (j == n)
            return 1;
        pause_ms(2);
    }
    return 0;
}

static lease_store *store_for;
static _Atomic int session_lost_calls, session_lost_reason;

static void on_session_lost(lease_session *s, lease_held *h, int reason, void *p)
{
    (void)s;
    (void)h;
    (void)p;
    atomic_store(&session_lost_reason, reason);
    atomic_fetch_add(&session_lost_calls, 1);
}

static void on_held_lost(lease_held *h, int reason, void *payload)
{
    _Atomic int *calls = payload;

    (void)h;
    (void)reason;
    atomic_fetch_add(calls, 1);
}

static lease_session *open_session(const char *url, size_t batch_max,
                                   int step_down)
{
    lease_session_opts o = LEASE_SESSION_OPTS_INIT;
    lease_session *s = NULL;

    assert_int_equal(lease_store_open(&store_for, url), 0);
    o.owner = A_OWNER;
    o.ttl_ms = TTL_MS;
    o.batch_max = batch_max;
    o.step_down = step_down;
    o.on_lost = on_session_lost;
    assert_int_equal(lease_session_open(&s, store_for, &o), 0);
    lease_store_close(store_for);
    store_for = NULL;
    return s;
}

static lease_held *take(lease_session *s, const char *key, _Atomic int *calls)
{
    lease_held *h = NULL;

    assert_int_equal(lease_session_acquire(&h, NULL, s, key, 0,
                                           calls ? on_held_lost : NULL, calls),
                     0);
    assert_non_null(h);
    return h;
}

static int setup(void **state)
{
    (void)state;
    pthread_mutex_lock(&mu);
    memset(&fake, 0, sizeof(fake));
    pthread_mutex_unlock(&mu);
    atomic_store(&session_lost_calls, 0);
    atomic_store(&session_lost_reason, 0);
    return 0;
}

/* ---- tests ---- */

static void test_batches_cover_every_grant(void **state)
{
    static const char *const keys[] = { "b0", "b1", "b2", "b3", "b4",
                                        "b5", "b6", "b7", "b8", "b9" };
    lease_session *s = open_session("fakesess:x", 4, 0);
    lease_held *h[10];
    size_t i;

    (void)state;
    for (i = 0; i < 10; i++)
        h[i] = take(s, keys[i], NULL);
    assert_int_equal(lease_session_count(s), 10);
    assert_true(wait_renewed(keys, 10, 2));
    pthread_mutex_lock(&mu);
    assert_true(fake.batch_max_seen >= 1 && fake.batch_max_seen <= 4);
    assert_true(fake.many_calls >= 6); /* 3 batches a round, 2 rounds */
    assert_int_equal(fake.renew_calls, 0);
    pthread_mutex_unlock(&mu);
    for (i = 0; i < 10; i++) {
        assert_true(lease_held_valid(h[i]));
        assert_int_equal(lease_held_state(h[i]), LEASE_KEEPER_HELD);
        assert_true(lease_held_remaining_ms(h[i]) > 0);
        assert_string_equal(lease_held_grant(h[i])->key, keys[i]);
        assert_int_equal(lease_held_token(h[i]), lease_held_grant(h[i])->token);
    }
    assert_int_equal(lease_session_close(s, 1), 0);
    assert_int_equal(fake_get(&fake.release_calls), 10);
}

static void test_fallback_one_renew_per_grant(void **state)
{
    static const char *const keys[] = { "f0", "f1", "f2" };
    lease_session *s = open_session("fakesess1:x", 0, 0);
    size_t i;

    (void)state;
    for (i = 0; i < 3; i++)
        take(s, keys[i], NULL);
    assert_true(wait_renewed(keys, 3, 2));
    assert_true(fake_get(&fake.renew_calls) >= 6);
    assert_int_equal(fake_get(&fake.many_calls), 0);
    assert_int_equal(lease_session_close(s, 1), 0);
}

static void test_refused_grant_lost_alone(void **state)
{
    static const char *const others[] = { "r0", "r2" };
    lease_session *s = open_session("fakesess:x", 0, 0);
    _Atomic int c0 = 0, c1 = 0, c2 = 0;
    lease_held *h0 = take(s, "r0", &c0), *h1 = take(s, "r1", &c1),
               *h2 = take(s, "r2", &c2);
    int i, before;

    (void)state;
    pthread_mutex_lock(&mu);
    strcpy(fake.refuse, "r1");
    pthread_mutex_unlock(&mu);
    for (i = 0; i < 1500 && (atomic_load(&c1) == 0 ||
                             fake_get(&fake.history_lost_calls) == 0); i++)
        pause_ms(2);
    assert_int_equal(lease_held_state(h1), LEASE_KEEPER_LOST);
    assert_false(lease_held_valid(h1));
    assert_int_equal(lease_held_remaining_ms(h1), 0);
    /* The others go on being renewed, and nothing is called twice. */
    before = renewed("r0");
    assert_true(wait_renewed(others, 2, before + 2));
    assert_int_equal(atomic_load(&c1), 1);
    assert_int_equal(atomic_load(&session_lost_calls), 1);
    assert_int_equal(atomic_load(&session_lost_reason), LEASE_ELOST);
    assert_int_equal(atomic_load(&c0), 0);
    assert_int_equal(atomic_load(&c2), 0);
    assert_int_equal(fake_get(&fake.history_lost_calls), 1);
    assert_true(lease_held_valid(h0) && lease_held_valid(h2));
    /* A grant the store refused is freed without asking the store again. */
    before = fake_get(&fake.release_calls);
    assert_int_equal(lease_session_release(s, h1), LEASE_ELOST);
    assert_int_equal(fake_get(&fake.release_calls), before);
    assert_int_equal(lease_session_count(s), 2);
    assert_int_equal(lease_session_close(s, 1), 0);
    assert_int_equal(fake_get(&fake.release_calls), before + 2);
}

/* Poll until `h` is lost (3 s at most); *seen gets the clock just after
 * the first look that found it lost. */
static void wait_lost(const lease_held *h, int64_t *seen)
{
    int i;

    for (i = 0; i < 3000; i++) {
        /* The clock is read after the state: never earlier than the loss. */
        if (lease_held_state(h) == LEASE_KEEPER_LOST) {
            *seen = lease_clock_ns();
            return;
        }
        pause_ms(1);
    }
    fail_msg("the grant was never lost");
}

/* The state turns lost before the callbacks run (on the session's
 * thread): poll (3 s at most) until `n` session callbacks have run. */
static int wait_lost_calls(int n)
{
    int i;

    for (i = 0; i < 3000 && atomic_load(&session_lost_calls) < n; i++)
        pause_ms(1);
    return atomic_load(&session_lost_calls);
}

static void test_failed_batch_lost_at_deadline(void **state)
{
    static const char *const keys[] = { "d0", "d1" };
    lease_session *s = open_session("fakesess:x", 0, 0);
    lease_held *h0 = take(s, "d0", NULL), *h1 = take(s, "d1", NULL);
    int64_t seen0 = 0, seen1 = 0;
    int calls;

    (void)state;
    assert_true(wait_renewed(keys, 2, 1));
    fake_set_fail(1);
    calls = fake_get(&fake.many_calls);
    wait_lost(h0, &seen0);
    wait_lost(h1, &seen1);
    /* Not before its deadline (which stopped moving with the failures),
     * and not long after it: the thread wakes for the deadline. */
    assert_true(seen0 >= lease_held_deadline_ns(h0));
    assert_true(seen1 >= lease_held_deadline_ns(h1));
    assert_true(seen0 - lease_held_deadline_ns(h0) < 150 * 1000000LL);
    /* Retried sooner than the period: at least a few tries in < 300 ms. */
    assert_true(fake_get(&fake.many_calls) - calls >= 3);
    assert_int_equal(wait_lost_calls(2), 2);
    assert_int_equal(atomic_load(&session_lost_reason), LEASE_ESTORE);
    /* Lost for want of an answer, not refused: the store may still hold
     * them, so they are released (guarded) all the same. */
    assert_int_equal(lease_session_release_all(s), LEASE_ELOST);
    assert_int_equal(fake_get(&fake.release_calls), 2);
    assert_int_equal(lease_session_close(s, 1), 0);
}

static void test_step_down_lost_at_once(void **state)
{
    static const char *const keys[] = { "s0" };
    lease_session *s = open_session("fakesess:x", 0, 1);
    lease_held *h = take(s, "s0", NULL);
    int64_t seen = 0;

    (void)state;
    assert_true(wait_renewed(keys, 1, 1));
    fake_set_fail(1);
    wait_lost(h, &seen);
    assert_true(seen < lease_held_deadline_ns(h));
    assert_int_equal(fake_get(&fake.many_calls) > 0, 1);
    assert_int_equal(wait_lost_calls(1), 1);
    assert_int_equal(atomic_load(&session_lost_reason), LEASE_ESTORE);
    /* Stepped down, not refused: the store may still hold it (an etcd
     * session's shared lease would keep it alive), so close releases it. */
    assert_int_equal(lease_session_close(s, 1), LEASE_ELOST);
    assert_int_equal(fake_get(&fake.release_calls), 1);
}

static void test_release_paths(void **state)
{
    lease_session *s = open_session("fakesess:x", 0, 0);
    lease_held *h = take(s, "p0", NULL);

    (void)state;
    take(s, "p1", NULL);
    take(s, "p2", NULL);
    assert_int_equal(lease_session_release(s, h), 0);
    assert_int_equal(fake_get(&fake.release_calls), 1);
    assert_int_equal(lease_session_count(s), 2);
    /* Released: the key may be acquired again, by the session too. */
    h = take(s, "p0", NULL);
    assert_int_equal(lease_session_release_all(s), 0);
    assert_int_equal(fake_get(&fake.release_calls), 4);
    assert_int_equal(lease_session_count(s), 0);
    take(s, "p3", NULL);
    take(s, "p4", NULL);
    assert_int_equal(lease_session_close(s, 1), 0);
    assert_int_equal(fake_get(&fake.release_calls), 6);
    /* Without release, nothing is sent. */
    s = open_session("fakesess:x", 0, 0);
    take(s, "p5", NULL);
    assert_int_equal(lease_session_close(s, 0), 0);
    assert_int_equal(fake_get(&fake.release_calls), 6);
    assert_int_equal(lease_session_close(NULL, 1), 0);
}

static void test_bad_input(void **state)
{
    static const char *const dup[] = { "x0", "x1", "x0" };
    const char *const with_null[] = { "x0", NULL };
    char long_key[LEASE_KEY_MAX + 2];
    lease_session_opts o = LEASE_SESSION_OPTS_INIT;
    lease_session *s = NULL;
    lease_store *st = NULL;
    lease_held *out[3], *h = NULL;
    size_t count = 9;

    (void)state;
    memset(long_key, 'k', sizeof(long_key) - 1);
    long_key[sizeof(long_key) - 1] = '\0';
    assert_int_equal(lease_store_open(&st, "fakesess:x"), 0);
    o.owner = A_OWNER;
    o.ttl_ms = TTL_MS;
    assert_int_equal(lease_session_open(NULL, st, &o), LEASE_EINVALID);
    assert_int_equal(lease_session_open(&s, NULL, &o), LEASE_EINVALID);
    assert_int_equal(lease_session_open(&s, st, NULL), LEASE_EINVALID);
    o.version = 99;
    assert_int_equal(lease_session_open(&s, st, &o), LEASE_EINVALID);
    o.version = LEASE_SESSION_OPTS_VERSION;
    o.owner = "not-a-uuid";
    assert_int_equal(lease_session_open(&s, st, &o), LEASE_EINVALID);
    o.owner = NULL;
    assert_int_equal(lease_session_open(&s, st, &o), LEASE_EINVALID);
    o.owner = A_OWNER;
    o.ttl_ms = 0;
    assert_int_equal(lease_session_open(&s, st, &o), LEASE_EINVALID);
    o.ttl_ms = TTL_MS;
    o.renew_every_ms = TTL_MS;
    assert_int_equal(lease_session_open(&s, st, &o), LEASE_EINVALID);
    assert_null(s);
    o.renew_every_ms = 0;
    assert_int_equal(lease_session_open(&s, st, &o), 0);
    lease_store_close(st);

    assert_int_equal(lease_session_acquire(NULL, NULL, s, "x0", 0, NULL, NULL),
                     LEASE_EINVALID);
    assert_int_equal(lease_session_acquire(&h, NULL, NULL, "x0", 0, NULL, NULL),
                     LEASE_EINVALID);
    assert_int_equal(lease_session_acquire(&h, NULL, s, NULL, 0, NULL, NULL),
                     LEASE_EINVALID);
    assert_int_equal(lease_session_acquire(&h, NULL, s, "", 0, NULL, NULL),
                     LEASE_EINVALID);
    assert_int_equal(lease_session_acquire(&h, NULL, s, long_key, 0, NULL, NULL),
                     LEASE_EINVALID);
    assert_int_equal(lease_session_acquire(&h, NULL, s, "x0", 25ULL * 3600 * 1000,
                                           NULL, NULL), LEASE_EINVALID);
    take(s, "x0", NULL);
    assert_int_equal(lease_session_acquire(&h, NULL, s, "x0", 0, NULL, NULL),
                     LEASE_EINVALID);
    assert_null(h);

    assert_int_equal(lease_session_claim(NULL, out, s, dup, 2, 1), LEASE_EINVALID);
    assert_int_equal(lease_session_claim(&count, NULL, s, dup, 2, 1), LEASE_EINVALID);
    assert_int_equal(lease_session_claim(&count, out, NULL, dup, 2, 1), LEASE_EINVALID);
    assert_int_equal(lease_session_claim(&count, out, s, NULL, 2, 1), LEASE_EINVALID);
    assert_int_equal(lease_session_claim(&count, out, s, dup, 0, 1), LEASE_EINVALID);
    assert_int_equal(lease_session_claim(&count, out, s, dup, 2, 0), LEASE_EINVALID);
    assert_int_equal(lease_session_claim(&count, out, s, dup, 2, 3), LEASE_EINVALID);
    assert_int_equal(lease_session_claim(&count, out, s, with_null, 2, 1),
                     LEASE_EINVALID);
    assert_int_equal(lease_session_claim(&count, out, s, dup, 3, 1), LEASE_EINVALID);
    assert_int_equal(count, 0);

    assert_int_equal(lease_session_release(NULL, h), LEASE_EINVALID);
    assert_int_equal(lease_session_release(s, NULL), LEASE_EINVALID);
    assert_int_equal(lease_session_release_all(NULL), LEASE_EINVALID);
    assert_int_equal(lease_session_count(NULL), 0);
    assert_false(lease_held_valid(NULL));
    assert_int_equal(lease_held_remaining_ms(NULL), 0);
    assert_int_equal(lease_held_deadline_ns(NULL), 0);
    assert_int_equal(lease_held_token(NULL), 0);
    assert_int_equal(lease_held_state(NULL), LEASE_KEEPER_STOPPED);
    assert_null(lease_held_grant(NULL));
    assert_int_equal(lease_session_close(s, 1), 0);
}

static size_t non_null(lease_held *const *out, size_t n)
{
    size_t i, k = 0;

    for (i = 0; i < n; i++)
        k += out[i] != NULL;
    return k;
}

static void test_claim(void **state)
{
    static const char *const keys[] = { "c0", "c1", "c2", "c3", "c4", "c5" };
    lease_acquire_opts ao = LEASE_ACQUIRE_OPTS_INIT;
    lease_session *s = open_session("fakesess:x", 0, 0);
    lease_grant g1, g4;
    lease_store *other = NULL;
    lease_held *out[6], *c2 = take(s, "c2", NULL);
    size_t count = 0;

    (void)state;
    assert_int_equal(lease_store_open(&other, "fakesess:x"), 0);
    ao.owner = B_OWNER;
    ao.ttl_ms = TTL_MS;
    assert_int_equal(lease_acquire(&g1, NULL, other, "c1", &ao), 0);
    assert_int_equal(lease_acquire(&g4, NULL, other, "c4", &ao), 0);
    /* c2, already kept, counts towards want. */
    assert_int_equal(lease_session_claim(&count, out, s, keys, 6, 3), 0);
    assert_int_equal(count, 3);
    assert_int_equal(non_null(out, 6), 3);
    assert_ptr_equal(out[2], c2);
    assert_null(out[1]);
    assert_null(out[4]);
    assert_int_equal(lease_session_count(s), 3);
    /* More than can be had: every free key, and still 0. */
    assert_int_equal(lease_session_claim(&count, out, s, keys, 6, 6), 0);
    assert_int_equal(count, 4);
    assert_int_equal(non_null(out, 6), 4);
    assert_null(out[1]);
    assert_null(out[4]);
    assert_int_equal(lease_session_count(s), 4);
    assert_int_equal(lease_release(other, &g1), 0);
    assert_int_equal(lease_release(other, &g4), 0);
    lease_store_close(other);
    assert_int_equal(lease_session_close(s, 1), 0);
}

/* A store that answers the call but leaves results unwritten renewed
 * nothing that the session can know of: the grants run out at their
 * deadlines, uncertain (ESTORE), never kept as if renewed. */
static void test_unwritten_results_are_uncertain(void **state)
{
    lease_session *s = open_session("fakesess:x", 0, 0);
    _Atomic int c = 0;
    lease_held *h = take(s, "u0", &c);
    int64_t deadline = lease_held_deadline_ns(h), seen = 0;
    int i;

    (void)state;
    pthread_mutex_lock(&mu);
    fake.silent = 1;
    pthread_mutex_unlock(&mu);
    wait_lost(h, &seen);
    assert_true(seen >= deadline);
    /* The state changes first; the callbacks follow, without the mutex:
     * the grant's own, then the session's. */
    for (i = 0; i < 1500 && atomic_load(&session_lost_calls) == 0; i++)
        pause_ms(2);
    assert_int_equal(atomic_load(&c), 1);
    assert_int_equal(atomic_load(&session_lost_reason), LEASE_ESTORE);
    assert_int_equal(lease_session_close(s, 0), 0);
}

/* From a loss callback (the session's own thread) a call that would wait
 * for that thread is refused instead of hanging. */
static lease_session *cb_session;
static _Atomic int cb_rc = 1;

static void on_lost_calls_release(lease_held *h, int reason, void *payload)
{
    (void)reason;
    (void)payload;
    atomic_store(&cb_rc, lease_session_release(cb_session, h));
}

static void test_callback_may_not_call_back(void **state)
{
    lease_held *h = NULL;
    int i;

    (void)state;
    cb_session = open_session("fakesess:x", 0, 0);
    assert_int_equal(lease_session_acquire(&h, NULL, cb_session, "cb0", 0,
                                           on_lost_calls_release, NULL), 0);
    pthread_mutex_lock(&mu);
    strcpy(fake.refuse, "cb0");
    pthread_mutex_unlock(&mu);
    for (i = 0; i < 1500 && atomic_load(&cb_rc) == 1; i++)
        pause_ms(2);
    assert_int_equal(atomic_load(&cb_rc), LEASE_EINVALID);
    assert_int_equal(lease_session_count(cb_session), 1);
    assert_int_equal(lease_session_release(cb_session, h), LEASE_ELOST);
    assert_int_equal(lease_session_close(cb_session, 1), 0);
}

/* A lost grant still kept is no authority: claim does not count it, and
 * takes another key instead. */
static void test_claim_skips_lost(void **state)
{
    static const char *const keys[] = { "k0", "k1" };
    lease_session *s = open_session("fakesess:x", 0, 0);
    _Atomic int c = 0;
    lease_held *lost = take(s, "k0", &c), *out[2];
    size_t count = 9;
    int64_t seen;

    (void)state;
    pthread_mutex_lock(&mu);
    strcpy(fake.refuse, "k0");
    pthread_mutex_unlock(&mu);
    wait_lost(lost, &seen);
    assert_int_equal(lease_session_claim(&count, out, s, keys, 2, 1), 0);
    assert_int_equal(count, 1);
    assert_ptr_equal(out[0], lost);
    assert_non_null(out[1]);
    assert_true(lease_held_valid(out[1]));
    assert_int_equal(lease_session_close(s, 1), LEASE_ELOST);
}

static void test_acquire_waits_then_times_out(void **state)
{
    lease_acquire_opts ao = LEASE_ACQUIRE_OPTS_INIT;
    lease_session *s = open_session("fakesess:x", 0, 0);
    lease_store *other = NULL;
    lease_held *h = NULL;
    lease_info who;
    lease_grant g;
    int64_t start;

    (void)state;
    assert_int_equal(lease_store_open(&other, "fakesess:x"), 0);
    ao.owner = B_OWNER;
    ao.ttl_ms = TTL_MS;
    assert_int_equal(lease_acquire(&g, NULL, other, "w0", &ao), 0);
    memset(&who, 0, sizeof(who));
    assert_int_equal(lease_session_acquire(&h, &who, s, "w0", 0, NULL, NULL),
                     LEASE_EBUSY);
    assert_string_equal(who.owner, B_OWNER);
    memset(&who, 0, sizeof(who));
    start = lease_clock_ns();
    assert_int_equal(lease_session_acquire(&h, &who, s, "w0", 120, NULL, NULL),
                     LEASE_ETIMEOUT);
    assert_true(lease_clock_ns() - start >= 100 * 1000000LL);
    assert_string_equal(who.owner, B_OWNER);
    assert_null(h);
    assert_int_equal(lease_release(other, &g), 0);
    assert_int_equal(lease_session_acquire(&h, &who, s, "w0", 120, NULL, NULL), 0);
    assert_non_null(h);
    lease_store_close(other);
    assert_int_equal(lease_session_close(s, 1), 0);
}

/* close while another thread waits in acquire for a key held elsewhere:
 * the waiter gives up with LEASE_EINVALID instead of using a freed
 * session (ASan would see it), and close does not wait out its wait. */
static lease_session *waiting_session;
static _Atomic int waiter_rc = 1;
static char waiter_msg[256];

static void *waiter(void *arg)
{
    lease_held *h = NULL;
    int rc;

    (void)arg;
    rc = lease_session_acquire(&h, NULL, waiting_session, "c0", 20000, NULL, NULL);
    lease__strlcpy(waiter_msg, lease_errmsg(), sizeof(waiter_msg));
    atomic_store(&waiter_rc, rc);
    return NULL;
}

static void test_close_ends_waiting_acquire(void **state)
{
    lease_acquire_opts ao = LEASE_ACQUIRE_OPTS_INIT;
    lease_store *other = NULL;
    pthread_t t;
    lease_grant g;
    int i;

    (void)state;
    assert_int_equal(lease_store_open(&other, "fakesess:x"), 0);
    ao.owner = B_OWNER;
    ao.ttl_ms = TTL_MS;
    assert_int_equal(lease_acquire(&g, NULL, other, "c0", &ao), 0);
    waiting_session = open_session("fakesess:x", 0, 0);
    take(waiting_session, "c1", NULL);
    atomic_store(&waiter_rc, 1);
    assert_int_equal(pthread_create(&t, NULL, waiter, NULL), 0);
    /* The waiter has tried twice: it is in its wait. */
    for (i = 0; i < 1500 && fake_get(&fake.acquire_calls) < 3; i++)
        pause_ms(2);
    assert_true(fake_get(&fake.acquire_calls) >= 3);
    assert_int_equal(lease_session_close(waiting_session, 1), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(atomic_load(&waiter_rc), LEASE_EINVALID);
    assert_non_null(strstr(waiter_msg, "closing"));
    assert_int_equal(fake_get(&fake.release_calls), 1); /* c1 */
    lease_store_close(other);
}

/* A batch that fails says so once (and once more for the rest of it), not
 * once per grant per retry: an outage of a session of thousands of grants
 * must not write thousands of lines per retry. */
static _Atomic int warn_renewal_failed;

static void count_warnings(lease_log_level level, const char *line, void *p)
{
    (void)p;
    if (level == LEASE_LOG_WARN && strstr(line, "\"renewal_failed\""))
        atomic_fetch_add(&warn_renewal_failed, 1);
}

static void test_failed_batch_warns_once(void **state)
{
    lease_session *s = open_session("fakesess:x", 0, 0);
    char key[16];
    int i, fails;

    (void)state;
    for (i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "w%d", i);
        take(s, key, NULL);
    }
    atomic_store(&warn_renewal_failed, 0);
    lease_log_set(count_warnings, NULL, LEASE_LOG_WARN);
    fake_set_fail(1);
    for (i = 0; i < 1500 && fake_get(&fake.fail_calls) < 3; i++)
        pause_ms(2);
    assert_int_equal(lease_session_close(s, 0), 0);
    lease_log_set(NULL, NULL, LEASE_LOG_WARN);
    fails = fake_get(&fake.fail_calls);
    assert_true(fails >= 3);
    assert_true(atomic_load(&warn_renewal_failed) >= fails);
    assert_true(atomic_load(&warn_renewal_failed) <= 2 * fails);
}

/* While grants are kept, a caller's store call is bounded by half the time
 * to the earliest deadline, not by the handle's (longer) timeout: the
 * thread cannot renew while a caller's call holds the connection. */
static void test_caller_bounded_by_deadline(void **state)
{
    lease_session *s = open_session("fakesess:x", 0, 0);

    (void)state;
    take(s, "t0", NULL);
    take(s, "t1", NULL);
    assert_true(fake_get_u64(&fake.acquire_timeout_ms) >= 1);
    assert_true(fake_get_u64(&fake.acquire_timeout_ms) <= TTL_MS / 2);
    assert_int_equal(lease_session_close(s, 1), 0);
}

/* A store whose grants share one store-side lease is told once, with the
 * session's ttl, and renews the whole session in one batch. */
static void test_shared_lease_one_batch(void **state)
{
    lease_session *s = open_session("fakeshared:x", 0, 0);
    const char *keys[1];
    char key[16];
    int i;

    (void)state;
    assert_int_equal(fake_get(&fake.share_calls), 1);
    for (i = 0; i < 1050; i++) {
        snprintf(key, sizeof(key), "s%d", i);
        take(s, key, NULL);
    }
    keys[0] = "s0";
    assert_true(wait_renewed(keys, 1, 1));
    keys[0] = "s1049";
    assert_true(wait_renewed(keys, 1, 1));
    pthread_mutex_lock(&mu);
    assert_int_equal(fake.share_ttl_ms, TTL_MS);
    assert_int_equal(fake.batch_max_seen, 1050);
    pthread_mutex_unlock(&mu);
    assert_int_equal(lease_session_close(s, 1), 0);
    assert_int_equal(fake_get(&fake.share_calls), 1);
}

/* Another thread releases a grant while its loss callback runs: the
 * release waits for the callback (which still uses the grant) to return,
 * then answers LEASE_ELOST; nothing is freed under the callback. */
static _Atomic int cb_entered, cb_may_return, cb_done, release_started;
static _Atomic int release_rc = 1, done_at_release;
static lease_session *rel_session;
static lease_held *rel_held;

static void on_lost_slowly(lease_held *h, int reason, void *payload)
{
    int i;

    (void)reason;
    (void)payload;
    atomic_store(&cb_entered, 1);
    for (i = 0; i < 1500 && !atomic_load(&cb_may_return); i++)
        pause_ms(2);
    pause_ms(30);
    /* Still ours: the grant must not have been freed meanwhile. */
    if (strcmp(lease_held_grant(h)->key, "r0") == 0)
        atomic_store(&cb_done, 1);
}

static void *releaser(void *arg)
{
    int rc;

    (void)arg;
    atomic_store(&release_started, 1);
    rc = lease_session_release(rel_session, rel_held);
    atomic_store(&done_at_release, atomic_load(&cb_done));
    atomic_store(&release_rc, rc);
    return NULL;
}

static void test_release_waits_for_callback(void **state)
{
    pthread_t t;
    int i;

    (void)state;
    rel_session = open_session("fakesess:x", 0, 0);
    assert_int_equal(lease_session_acquire(&rel_held, NULL, rel_session, "r0", 0,
                                           on_lost_slowly, NULL), 0);
    pthread_mutex_lock(&mu);
    strcpy(fake.refuse, "r0");
    pthread_mutex_unlock(&mu);
    for (i = 0; i < 1500 && !atomic_load(&cb_entered); i++)
        pause_ms(2);
    assert_true(atomic_load(&cb_entered));
    assert_int_equal(pthread_create(&t, NULL, releaser, NULL), 0);
    for (i = 0; i < 1500 && !atomic_load(&release_started); i++)
        pause_ms(2);
    pause_ms(20); /* let it reach the session's lock */
    atomic_store(&cb_may_return, 1);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(atomic_load(&release_rc), LEASE_ELOST);
    assert_int_equal(atomic_load(&done_at_release), 1);
    assert_int_equal(lease_session_count(rel_session), 0);
    assert_int_equal(fake_get(&fake.release_calls), 0);
    assert_int_equal(lease_session_close(rel_session, 1), 0);
}

/* A timeout set again unchanged is not passed to the store (PostgreSQL pays
 * a round trip for it): rounds of a steady session send none. */
static void test_unchanged_timeout_not_sent(void **state)
{
    static const char *const keys[] = { "u0" };
    lease_store *st = NULL;
    lease_session *s;
    int before;

    (void)state;
    assert_int_equal(lease_store_open(&st, "fakesess:x"), 0);
    before = fake_get(&fake.set_timeout_calls);
    assert_int_equal(lease_store_set_timeout(st, 777), 0);
    assert_int_equal(lease_store_set_timeout(st, 777), 0);
    assert_int_equal(fake_get(&fake.set_timeout_calls), before + 1);
    assert_int_equal(lease_store_set_timeout(st, 778), 0);
    assert_int_equal(fake_get(&fake.set_timeout_calls), before + 2);
    lease_store_close(st);

    s = open_session("fakesess:x", 0, 0);
    take(s, "u0", NULL);
    assert_true(wait_renewed(keys, 1, 2));
    before = fake_get(&fake.set_timeout_calls);
    assert_true(wait_renewed(keys, 1, 5));
    /* Three more rounds, at the same bound: nothing sent. */
    assert_int_equal(fake_get(&fake.set_timeout_calls), before);
    assert_int_equal(lease_session_close(s, 1), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_batches_cover_every_grant, setup),
        cmocka_unit_test_setup(test_fallback_one_renew_per_grant, setup),
        cmocka_unit_test_setup(test_refused_grant_lost_alone, setup),
        cmocka_unit_test_setup(test_failed_batch_lost_at_deadline, setup),
        cmocka_unit_test_setup(test_step_down_lost_at_once, setup),
        cmocka_unit_test_setup(test_release_paths, setup),
        cmocka_unit_test_setup(test_bad_input, setup),
        cmocka_unit_test_setup(test_claim, setup),
        cmocka_unit_test_setup(test_acquire_waits_then_times_out, setup),
        cmocka_unit_test_setup(test_unwritten_results_are_uncertain, setup),
        cmocka_unit_test_setup(test_callback_may_not_call_back, setup),
        cmocka_unit_test_setup(test_claim_skips_lost, setup),
        cmocka_unit_test_setup(test_close_ends_waiting_acquire, setup),
        cmocka_unit_test_setup(test_failed_batch_warns_once, setup),
        cmocka_unit_test_setup(test_caller_bounded_by_deadline, setup),
        cmocka_unit_test_setup(test_shared_lease_one_batch, setup),
        cmocka_unit_test_setup(test_release_waits_for_callback, setup),
        cmocka_unit_test_setup(test_unchanged_timeout_not_sent, setup),
    };

    if (lease_backend_register(&many_backend) < 0 ||
        lease_backend_register(&shared_backend) < 0 ||
        lease_backend_register(&one_backend) < 0) {
        fprintf(stderr, "cannot register the fake stores: %s\n", lease_errmsg());
        return 1;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
