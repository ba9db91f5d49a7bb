/*
 * session.c - sessions (lease/session.h) against a real store: hundreds of
 * grants kept by one thread for several ttls, one grant taken over behind
 * the session's back, release on close, a store outage, and bad input.
 *
 *     lease_session_test URL      or    LEASE_TEST_STORE=URL lease_session_test
 *
 * Public API only, so it runs unchanged against every store. The outage
 * is made from outside the library: on SQLite another process holds the
 * database's write lock (BEGIN EXCLUSIVE, this program run again with
 * --hold-sqlite-lock); on a server store the session reaches the server
 * through conf_util.c's forwarder, which is then paused.
 */
#include <pthread.h>
#include <stdatomic.h>

#include <sqlite3.h>
#include <lease/sys/store.h>

#include "conf_util.h"

/* Short enough for three ttls to pass quickly, long enough for a batch of
 * 500 renewals on a loaded machine (a store may round it up: etcd). A
 * store without renew_many (the Kubernetes store) renews one grant per
 * round trip, so a round takes a millisecond or two per grant: it keeps
 * 200 grants, not 500, with a ttl that fits a round in a sixth, which is
 * what its users must give it too. */
#define TTL_BATCH_MS 1500
#define MANY_BATCH 500
#define TTL_ONE_BY_ONE_MS 3000
#define MANY_ONE_BY_ONE 200
static uint64_t TTL_MS;
static size_t MANY; /* grants kept at once in the tests of many */

static uint64_t suite_ttl(lease_store *via)
{
    if (TTL_MS == 0) {
        int batches = (via->backend->features & LEASE_FEATURE_RENEW_MANY) != 0;

        TTL_MS = batches ? TTL_BATCH_MS : TTL_ONE_BY_ONE_MS;
        MANY = batches ? MANY_BATCH : MANY_ONE_BY_ONE;
        printf("# ttl %llu ms, %zu grants (%s)\n", (unsigned long long)TTL_MS, MANY,
               batches ? "renewals in batches"
                       : "no renew_many: one renewal per round trip");
    }
    return TTL_MS;
}
#define FEW 50

typedef char conf_keybuf[LEASE_KEY_MAX + 1];

struct grant_probe {
    atomic_int fired;
    atomic_int reason;
};

struct session_probe {
    atomic_int fired, elost, estore, other;
    _Atomic(lease_held *) last;
};

static void on_session_lost(lease_session *s, lease_held *held, int reason,
                            void *payload)
{
    struct session_probe *p = payload;

    (void)s;
    atomic_store(&p->last, held);
    if (reason == LEASE_ELOST)
        atomic_fetch_add(&p->elost, 1);
    else if (reason == LEASE_ESTORE)
        atomic_fetch_add(&p->estore, 1);
    else
        atomic_fetch_add(&p->other, 1);
    atomic_fetch_add(&p->fired, 1);
}

static void on_grant_lost(lease_held *held, int reason, void *payload)
{
    struct grant_probe *p = payload;

    (void)held;
    atomic_store(&p->reason, reason);
    atomic_fetch_add(&p->fired, 1);
}

static void *conf_calloc(size_t n, size_t size)
{
    void *p = calloc(n, size);

    if (p == NULL)
        fail_msg("out of memory");
    return p;
}

static conf_keybuf *make_keys(const char *what, size_t n)
{
    conf_keybuf *keys = conf_calloc(n, sizeof(*keys));
    char name[64];
    size_t i;

    for (i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "%s/%zu", what, i);
        conf_key(keys[i], name);
    }
    return keys;
}

/* The session a test has open: closed by the teardown when the test failed
 * half-way, so that its thread does not call back into a finished test's
 * probes. */
static lease_session *live_session;

static int close_session(lease_session *s)
{
    if (s == live_session)
        live_session = NULL;
    return lease_session_close(s, 1);
}

/*
 * A session for `owner` with the suite's ttl, opened from a handle of `url`
 * that is closed at once: the session has its own connection and never
 * touches that handle again.
 */
static lease_session *open_session_batch(const char *url, const char *owner,
                                         struct session_probe *p, size_t batch_max)
{
    lease_session_opts so = LEASE_SESSION_OPTS_INIT;
    lease_session *s = NULL;
    lease_store *via = NULL;

    memset(p, 0, sizeof(*p));
    CHECK_RC(0, lease_store_open(&via, url));
    so.owner = owner;
    so.ttl_ms = suite_ttl(via);
    so.label = "session";
    so.on_lost = on_session_lost;
    so.payload = p;
    so.batch_max = batch_max;
    CHECK_RC(0, lease_session_open(&s, via, &so));
    lease_store_close(via);
    assert_non_null(s);
    live_session = s;
    assert_int_equal(lease_session_count(s), 0);
    return s;
}

static lease_session *open_session(const char *url, const char *owner,
                                   struct session_probe *p)
{
    return open_session_batch(url, owner, p, 0);
}

/* Acquire the n keys one call each, each with its own probe; checks
 * every grant. Returns the largest ttl granted. */
static uint64_t acquire_all(lease_held **h, struct grant_probe *gp,
                            lease_session *s, conf_keybuf *keys, size_t n,
                            const char *owner)
{
    const lease_grant *g;
    uint64_t ttl = 0;
    size_t i;

    for (i = 0; i < n; i++) {
        memset(&gp[i], 0, sizeof(gp[i]));
        h[i] = NULL;
        CHECK_RC(0, lease_session_acquire(&h[i], NULL, s, keys[i], 0,
                                          on_grant_lost, &gp[i]));
        assert_non_null(h[i]);
        g = lease_held_grant(h[i]);
        assert_non_null(g);
        assert_string_equal(g->key, keys[i]);
        assert_string_equal(g->owner, owner);
        assert_string_equal(g->label, "session");
        ASSERT_U64_OP(g->token, >=, 1);
        ASSERT_U64_OP(g->ttl_ms, >=, TTL_MS);
        ASSERT_U64_OP(lease_held_token(h[i]), ==, g->token);
        if (g->ttl_ms > ttl)
            ttl = g->ttl_ms;
    }
    assert_int_equal(lease_session_count(s), n);
    return ttl;
}

/* The first grant that is not valid, or n. */
static size_t first_invalid(lease_held **h, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (!lease_held_valid(h[i]))
            return i;
    return n;
}

static void check_held_by(const char *key, const char *owner, uint64_t token)
{
    lease_info info;

    memset(&info, 0, sizeof(info));
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    if (!info.held || strcmp(info.owner, owner) != 0 || info.token != token)
        fail_msg("'%s': held %d by '%s' token %" PRIu64 ", expected held by '%s' "
                 "token %" PRIu64, key, info.held, info.owner, info.token, owner,
                 token);
}

/* Not held: released, expired, or never acquired at all (ENOTFOUND). */
static void check_free(const char *key)
{
    lease_info info;
    int rc;

    memset(&info, 0, sizeof(info));
    rc = lease_inspect(&info, conf_store, key);
    if (rc == LEASE_ENOTFOUND)
        return;
    CHECK_RC(0, rc);
    if (info.held)
        fail_msg("'%s' is still held by '%s' (token %" PRIu64 ")", key, info.owner,
                 info.token);
}

/* ---- 1 and 3: many grants kept for three ttls, released on close ------ */

/* Three ttls, looking every 100 ms that no grant was lost on the way: a
 * late batch would show here before it shows in the store. */
static void keep_for_three_ttls(lease_held **h, struct grant_probe *gp, size_t n,
                                const struct session_probe *sp, uint64_t ttl)
{
    int64_t end = conf_now_ms() + 3 * (int64_t)ttl;
    size_t bad, i;

    while (conf_now_ms() < end) {
        bad = first_invalid(h, n);
        if (bad < n)
            fail_msg("grant %zu ('%s') became invalid while the store was up "
                     "(state %d, %" PRId64 " ms past its deadline, %" PRId64
                     " ms after it was acquired)", bad, lease_held_grant(h[bad])->key,
                     (int)lease_held_state(h[bad]),
                     (lease_clock_ns() - lease_held_deadline_ns(h[bad])) / 1000000,
                     (lease_clock_ns() - lease_held_grant(h[bad])->acquired_ns) / 1000000);
        assert_int_equal(atomic_load(&sp->fired), 0);
        conf_sleep_ms(100);
    }
    for (i = 0; i < n; i++)
        assert_int_equal(atomic_load(&gp[i].fired), 0);
}

static void test_session_keeps_many_and_close_releases(void **state)
{
    char a[LEASE_OWNER_BUFSZ];
    conf_keybuf *keys = make_keys("many", MANY);
    lease_held **h = conf_calloc(MANY, sizeof(*h));
    struct grant_probe *gp = conf_calloc(MANY, sizeof(*gp));
    uint64_t *token = conf_calloc(MANY, sizeof(*token));
    int64_t *deadline = conf_calloc(MANY, sizeof(*deadline));
    struct session_probe sp;
    lease_session *s;
    int64_t start;
    uint64_t ttl;
    size_t i;
    int rc;

    (void)state;
    conf_owner(a);
    s = open_session(conf_url, a, &sp);
    start = conf_now_ms();
    ttl = acquire_all(h, gp, s, keys, MANY, a);
    print_message("# %zu grants acquired in %" PRId64 " ms\n", MANY,
                  conf_now_ms() - start);
    for (i = 0; i < MANY; i++) {
        token[i] = lease_held_token(h[i]);
        deadline[i] = lease_held_deadline_ns(h[i]);
    }
    keep_for_three_ttls(h, gp, MANY, &sp, ttl);

    for (i = 0; i < MANY; i++) {
        assert_int_equal(lease_held_valid(h[i]), 1);
        assert_int_equal(lease_held_state(h[i]), LEASE_KEEPER_HELD);
        ASSERT_U64_OP(lease_held_token(h[i]), ==, token[i]);
        ASSERT_U64_OP(lease_held_remaining_ms(h[i]), >, 0);
        ASSERT_U64_OP(lease_held_remaining_ms(h[i]), <=, ttl);
        /* Renewed: the first deadline is long past. */
        ASSERT_I64_OP(lease_held_deadline_ns(h[i]), >, deadline[i]);
        check_held_by(keys[i], a, token[i]);
    }
    assert_int_equal(lease_session_count(s), MANY);

    /* 3: close(release=1) ends every grant in the store before it returns. */
    start = conf_now_ms();
    rc = close_session(s);
    print_message("# closed (releasing %zu grants) in %" PRId64 " ms\n", MANY,
                  conf_now_ms() - start);
    CHECK_RC(0, rc);
    assert_int_equal(atomic_load(&sp.fired), 0);
    for (i = 0; i < MANY; i++)
        check_free(keys[i]);
    free(keys);
    free(h);
    free(gp);
    free(token);
    free(deadline);
}

/* ---- callers acquiring and releasing while rounds of batches run ------- */

#define CHURN_KEYS 20
#define CHURN_BATCH 50 /* 500 grants: ten batches a round (200: four) */

struct churn {
    lease_session *s;
    conf_keybuf *keys;
    atomic_int stop, cycles, failed;
    char why[512];
};

/* Acquire and release keys of its own until told to stop (bounded); the
 * first failure is kept for the main thread to report. */
static void *churn_run(void *arg)
{
    struct churn *c = arg;
    int i;

    for (i = 0; i < 1000000 && !atomic_load(&c->stop); i++) {
        lease_held *h = NULL;
        const char *key = c->keys[i % CHURN_KEYS];
        int rc = lease_session_acquire(&h, NULL, c->s, key, 0, NULL, NULL);

        if (rc == 0)
            rc = lease_session_release(c->s, h);
        if (rc != 0) {
            snprintf(c->why, sizeof(c->why), "'%s': %s: %s", key,
                     lease_error_name(rc), lease_errmsg());
            atomic_store(&c->failed, 1);
            break;
        }
        atomic_fetch_add(&c->cycles, 1);
    }
    return NULL;
}

/* Two threads acquire and release over the session's connection while its
 * thread renews MANY grants in batches of 50 a round: no kept grant is lost,
 * no caller's call fails, and callers get in between batches. */
static void test_session_callers_during_rounds(void **state)
{
    char a[LEASE_OWNER_BUFSZ];
    conf_keybuf *keys = make_keys("rounds", MANY);
    lease_held **h = conf_calloc(MANY, sizeof(*h));
    struct grant_probe *gp = conf_calloc(MANY, sizeof(*gp));
    struct churn *c = conf_calloc(2, sizeof(*c));
    pthread_t t[2];
    struct session_probe sp;
    lease_session *s;
    uint64_t ttl;
    size_t i;

    (void)state;
    conf_owner(a);
    s = open_session_batch(conf_url, a, &sp, CHURN_BATCH);
    ttl = acquire_all(h, gp, s, keys, MANY, a);
    for (i = 0; i < 2; i++) {
        c[i].s = s;
        c[i].keys = make_keys(i ? "churnB" : "churnA", CHURN_KEYS);
        assert_int_equal(pthread_create(&t[i], NULL, churn_run, &c[i]), 0);
    }
    keep_for_three_ttls(h, gp, MANY, &sp, ttl);
    for (i = 0; i < 2; i++) {
        atomic_store(&c[i].stop, 1);
        assert_int_equal(pthread_join(t[i], NULL), 0);
    }
    for (i = 0; i < 2; i++) {
        if (atomic_load(&c[i].failed))
            fail_msg("a caller's call failed during the rounds: %s", c[i].why);
        print_message("# caller %zu: %d acquire+release cycles\n", i,
                      atomic_load(&c[i].cycles));
        assert_true(atomic_load(&c[i].cycles) > 0);
    }
    assert_int_equal(lease_session_count(s), MANY);
    CHECK_RC(0, close_session(s));
    assert_int_equal(atomic_load(&sp.fired), 0);
    for (i = 0; i < MANY; i += 50)
        check_free(keys[i]);
    for (i = 0; i < 2; i++) {
        check_free(c[i].keys[0]);
        free(c[i].keys);
    }
    free(c);
    free(keys);
    free(h);
    free(gp);
}

/* ---- 2: one grant taken over behind the session's back ----------------- */

/* Wait (at most two ttls) until the grant's own callback and the
 * session's have both run. */
static void wait_lost(const struct grant_probe *gp, const struct session_probe *sp,
                      uint64_t ttl)
{
    int64_t end = conf_now_ms() + 2 * (int64_t)ttl;

    while ((atomic_load(&gp->fired) == 0 || atomic_load(&sp->fired) == 0) &&
           conf_now_ms() < end)
        conf_sleep_ms(10);
    if (atomic_load(&gp->fired) == 0 || atomic_load(&sp->fired) == 0)
        fail_msg("the taken grant was not reported lost within two ttls "
                 "(%" PRIu64 " ms): grant callback %d, session callback %d",
                 2 * ttl, atomic_load(&gp->fired), atomic_load(&sp->fired));
}

static void check_only_victim_lost(lease_held **h, const struct grant_probe *gp,
                                   size_t n, size_t victim,
                                   const struct session_probe *sp)
{
    size_t i;

    assert_int_equal(atomic_load(&gp[victim].fired), 1);
    CHECK_RC(LEASE_ELOST, atomic_load(&gp[victim].reason));
    assert_int_equal(atomic_load(&sp->fired), 1);
    assert_int_equal(atomic_load(&sp->elost), 1);
    assert_ptr_equal(atomic_load(&sp->last), h[victim]);
    assert_int_equal(lease_held_valid(h[victim]), 0);
    ASSERT_U64_OP(lease_held_remaining_ms(h[victim]), ==, 0);
    assert_int_equal(lease_held_state(h[victim]), LEASE_KEEPER_LOST);
    for (i = 0; i < n; i++) {
        if (i == victim)
            continue;
        if (!lease_held_valid(h[i]) || atomic_load(&gp[i].fired) != 0)
            fail_msg("grant %zu ('%s') lost with the taken one: valid %d, "
                     "callback %d", i, lease_held_grant(h[i])->key,
                     lease_held_valid(h[i]), atomic_load(&gp[i].fired));
        assert_int_equal(lease_held_state(h[i]), LEASE_KEEPER_HELD);
    }
}

static void test_session_grant_taken_over(void **state)
{
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    conf_keybuf *keys = make_keys("taken", FEW);
    lease_held *h[FEW];
    struct grant_probe gp[FEW];
    struct session_probe sp;
    const size_t victim = 17;
    lease_session *s;
    lease_grant g, gb;
    uint64_t ttl;
    size_t i;

    (void)state;
    conf_owner(a);
    conf_owner(b);
    s = open_session(conf_url, a, &sp);
    ttl = acquire_all(h, gp, s, keys, FEW, a);

    /* From another handle: end the grant and take the key as b. */
    g = *lease_held_grant(h[victim]);
    CHECK_RC(0, lease_release(conf_store, &g));
    gb = conf_acquire(keys[victim], b, 30000, "thief");
    ASSERT_U64_OP(gb.token, >, g.token);

    wait_lost(&gp[victim], &sp, ttl);
    check_only_victim_lost(h, gp, FEW, victim, &sp);
    /* Once: a ttl more of renewal rounds reports nothing new. */
    conf_sleep_ms((int64_t)ttl);
    check_only_victim_lost(h, gp, FEW, victim, &sp);
    ASSERT_U64_OP(lease_held_token(h[victim]), ==, g.token);
    assert_int_equal(lease_session_count(s), FEW);

    /* Releasing the lost grant touches nothing in the store. */
    CHECK_RC(LEASE_ELOST, lease_session_release(s, h[victim]));
    assert_int_equal(lease_session_count(s), FEW - 1);
    check_held_by(keys[victim], b, gb.token);
    CHECK_RC(0, close_session(s));
    for (i = 0; i < FEW; i++)
        if (i != victim)
            check_free(keys[i]);
    check_held_by(keys[victim], b, gb.token);
    CHECK_RC(0, lease_release(conf_store, &gb));
    free(keys);
}

/* ---- claim: work partitioning ------------------------------------------ */

static size_t count_kept(lease_held **out, const char *const *keys, size_t n)
{
    size_t i, kept = 0;

    for (i = 0; i < n; i++)
        if (out[i] != NULL) {
            assert_string_equal(lease_held_grant(out[i])->key, keys[i]);
            assert_int_equal(lease_held_valid(out[i]), 1);
            kept++;
        }
    return kept;
}

/* Want 3 of 5 with one taken by another owner, then all 5: keys already
 * kept count, the other owner's key is never kept. */
static void test_session_claim(void **state)
{
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    conf_keybuf *keys = make_keys("claim", 5);
    const char *kp[5];
    lease_held *out[5];
    struct session_probe sp;
    lease_session *s;
    lease_grant gb;
    size_t i, count = 99;

    (void)state;
    conf_owner(a);
    conf_owner(b);
    for (i = 0; i < 5; i++)
        kp[i] = keys[i];
    gb = conf_acquire(keys[2], b, 30000, "other");
    s = open_session(conf_url, a, &sp);

    CHECK_RC(0, lease_session_claim(&count, out, s, kp, 5, 3));
    assert_int_equal(count, 3);
    assert_null(out[2]);
    assert_int_equal(count_kept(out, kp, 5), 3);
    assert_int_equal(lease_session_count(s), 3);

    CHECK_RC(0, lease_session_claim(&count, out, s, kp, 5, 5));
    assert_int_equal(count, 4);
    assert_null(out[2]);
    assert_int_equal(count_kept(out, kp, 5), 4);
    assert_int_equal(lease_session_count(s), 4);
    for (i = 0; i < 5; i++)
        if (i != 2)
            check_held_by(keys[i], a, lease_held_token(out[i]));
    check_held_by(keys[2], b, gb.token);

    CHECK_RC(0, close_session(s));
    check_held_by(keys[2], b, gb.token);
    CHECK_RC(0, lease_release(conf_store, &gb));
    free(keys);
}

/* ---- 4: a store outage ------------------------------------------------- */

static int is_sqlite(void)
{
    return strncmp(conf_url, "sqlite:", 7) == 0;
}

/* sqlite:///abs/path.db or sqlite:rel/path.db, without its parameters. */
static void sqlite_path(char *out, size_t size, const char *url)
{
    const char *p = url + 7;
    size_t n;

    if (strncmp(p, "//", 2) == 0)
        p += 2;
    n = strcspn(p, "?");
    if (memchr(p, '%', n) != NULL || n == 0 || n >= size)
        fail_msg("cannot take a file name from this sqlite URL");
    memcpy(out, p, n);
    out[n] = '\0';
}

/* The --hold-sqlite-lock mode, in a process of its own (two connections of
 * one process would share its POSIX locks): take the database's write
 * lock, say 'L' on stdout, and keep it until stdin closes. */
static int hold_sqlite_lock(const char *path)
{
    sqlite3 *db = NULL;
    char c;

    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK ||
        sqlite3_busy_timeout(db, 30000) != SQLITE_OK ||
        sqlite3_exec(db, "BEGIN EXCLUSIVE", NULL, NULL, NULL) != SQLITE_OK) {
        fprintf(stderr, "cannot lock %s: %s\n", path,
                db ? sqlite3_errmsg(db) : "out of memory");
        return write(1, "E", 1) == 1 ? 1 : 2;
    }
    if (write(1, "L", 1) != 1)
        return 2;
    while (read(0, &c, 1) < 0 && errno == EINTR)
        ;
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(db);
    return 0;
}

struct outage {
    char url[1024];       /* what the session connects to */
    conf_forwarder *fwd;  /* a server store: the forwarder in between */
    pid_t locker;         /* SQLite: the process holding the lock */
    int to_locker;        /* closing it ends the lock */
};

/* For teardown after a failed test: no forwarder outlives it. */
static conf_forwarder *live_forwarder;

static void outage_prepare(struct outage *o)
{
    char host[256], port[32];

    memset(o, 0, sizeof(*o));
    o->to_locker = -1;
    if (is_sqlite()) {
        snprintf(o->url, sizeof(o->url), "%s", conf_url);
        return;
    }
    if (conf_url_hostport(host, sizeof(host), port, sizeof(port), conf_url) != 0)
        fail_msg("the store URL has no single host:port to put a forwarder in front of");
    o->fwd = live_forwarder = conf_forwarder_start(host, port);
    assert_non_null(o->fwd);
    if (conf_url_via(o->url, sizeof(o->url), conf_url, conf_forwarder_port(o->fwd)) != 0)
        fail_msg("cannot rewrite the store URL for the forwarder");
}

static void outage_lock_sqlite(struct outage *o)
{
    char path[4096], c = 0;
    int cmd[2], rep[2];

    sqlite_path(path, sizeof(path), conf_url);
    conf_pipe(cmd);
    conf_pipe(rep);
    conf_store_close();
    o->locker = conf_fork();
    if (o->locker == 0) {
        /* Only stdin and stdout: the lock ends when the parent closes its
         * end of stdin, so no other copy of that end may live on here. */
        if (dup2(cmd[0], 0) < 0 || dup2(rep[1], 1) < 0)
            _exit(126);
        close(cmd[0]);
        close(cmd[1]);
        close(rep[0]);
        close(rep[1]);
        execl("/proc/self/exe", "lease_session_test", "--hold-sqlite-lock", path,
              (char *)NULL);
        _exit(127);
    }
    close(cmd[0]);
    close(rep[1]);
    /* conf_store is opened again after the outage (outage_end): opening
     * a SQLite handle may need the lock the child is taking. */
    o->to_locker = cmd[1];
    assert_int_equal(conf_read_full(rep[0], &c, 1, conf_now_ms() + 30000), 1);
    close(rep[0]);
    if (c != 'L')
        fail_msg("the child could not take the SQLite lock");
}

/* Returns once the outage is in force: nothing sent from now on reaches
 * the store. */
static void outage_begin(struct outage *o)
{
    if (o->fwd != NULL)
        conf_forwarder_pause(o->fwd);
    else
        outage_lock_sqlite(o);
}

static void outage_end(struct outage *o)
{
    int status;

    if (o->fwd != NULL) {
        conf_forwarder_resume(o->fwd);
        return;
    }
    close(o->to_locker);
    o->to_locker = -1;
    status = conf_reap(o->locker, 30000);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    conf_store_open();
}

/*
 * One look at a grant during the outage. Its deadline may still move, by
 * a renewal sent before the outage began, so never past out_ns + ttl;
 * whenever the clock is past the deadline read just before, valid() must
 * be 0. Returns valid().
 */
static int look_at_grant(const lease_held *h, int64_t out_ns, uint64_t ttl,
                         int64_t before_ns, size_t *moved)
{
    int64_t d1 = lease_held_deadline_ns(h), now = lease_clock_ns(), d2;
    int valid = lease_held_valid(h);

    d2 = lease_held_deadline_ns(h);
    if (d2 > out_ns + (int64_t)ttl * 1000000)
        fail_msg("'%s': deadline moved %" PRId64 " ms past the outage's start + ttl:"
                 " a renewal cannot have succeeded", lease_held_grant(h)->key,
                 (d2 - out_ns) / 1000000 - (int64_t)ttl);
    if (d1 == d2 && now > d1 && valid)
        fail_msg("'%s' is valid %" PRId64 " us past its deadline during an outage",
                 lease_held_grant(h)->key, (now - d1) / 1000);
    if (d2 > before_ns)
        (*moved)++;
    return valid;
}

/* Poll until every grant is invalid and every callback ran: the local
 * deadlines, then at most one store timeout (5 s) for the batch in
 * progress, then slack. */
static void watch_outage(lease_held **h, const struct grant_probe *gp,
                         const int64_t *before, size_t n,
                         const struct session_probe *sp, int64_t out_ns,
                         uint64_t ttl)
{
    int64_t end = out_ns / 1000000 + (int64_t)ttl + 5000 + 5000;
    size_t i, valid, fired, moved;

    for (;;) {
        valid = fired = moved = 0;
        for (i = 0; i < n; i++) {
            valid += (size_t)look_at_grant(h[i], out_ns, ttl, before[i], &moved);
            fired += atomic_load(&gp[i].fired) != 0;
        }
        if (valid == 0 && fired == n && (size_t)atomic_load(&sp->fired) >= n)
            break;
        if (conf_now_ms() > end)
            fail_msg("%zu ms into the outage: %zu of %zu grants still valid, "
                     "%zu grant callbacks, %d session callbacks",
                     (size_t)(conf_now_ms() - out_ns / 1000000), valid, n, fired,
                     atomic_load(&sp->fired));
        conf_sleep_ms(10);
    }
    if (moved > 0)
        print_message("# %zu deadlines moved by renewals sent before the outage\n",
                      moved);
}

static void test_session_outage_ends_authority(void **state)
{
    char a[LEASE_OWNER_BUFSZ];
    conf_keybuf *keys = make_keys("outage", FEW);
    lease_held *h[FEW];
    struct grant_probe gp[FEW];
    int64_t before[FEW], out_ns;
    struct session_probe sp;
    struct outage o;
    lease_session *s;
    uint64_t ttl;
    size_t i;
    int rc;

    (void)state;
    conf_owner(a);
    outage_prepare(&o);
    s = open_session(o.url, a, &sp);
    ttl = acquire_all(h, gp, s, keys, FEW, a);
    for (i = 0; i < FEW; i++)
        before[i] = lease_held_deadline_ns(h[i]);

    outage_begin(&o);
    out_ns = lease_clock_ns();
    watch_outage(h, gp, before, FEW, &sp, out_ns, ttl);
    for (i = 0; i < FEW; i++) {
        assert_int_equal(atomic_load(&gp[i].fired), 1);
        CHECK_RC(LEASE_ESTORE, atomic_load(&gp[i].reason));
        assert_int_equal(lease_held_state(h[i]), LEASE_KEEPER_LOST);
        ASSERT_U64_OP(lease_held_remaining_ms(h[i]), ==, 0);
    }
    assert_int_equal(atomic_load(&sp.fired), FEW);
    assert_int_equal(atomic_load(&sp.estore), FEW);

    outage_end(&o);
    /* Every grant is lost: nothing of them is released (ELOST) or all is. */
    rc = close_session(s);
    if (rc != 0 && rc != LEASE_ELOST)
        fail_msg("close after the outage: %s (%s)", lease_error_name(rc),
                 lease_errmsg());
    conf_forwarder_stop(o.fwd);
    live_forwarder = NULL;
    free(keys);
}

/* ---- 5: bad input ------------------------------------------------------ */

static void check_bad_open(const char *owner, uint64_t ttl, uint64_t every,
                           unsigned int version)
{
    lease_session_opts so = LEASE_SESSION_OPTS_INIT;
    lease_session *s = NULL;

    so.version = version;
    so.owner = owner;
    so.ttl_ms = ttl;
    so.renew_every_ms = every;
    CHECK_FAIL(LEASE_EINVALID, lease_session_open(&s, conf_store, &so));
    assert_null(s);
}

static void test_session_open_bad_input(void **state)
{
    lease_session_opts so = LEASE_SESSION_OPTS_INIT;
    char a[LEASE_OWNER_BUFSZ];
    lease_session *s = NULL;

    (void)state;
    conf_owner(a);
    check_bad_open("not-an-owner", TTL_MS, 0, LEASE_SESSION_OPTS_VERSION);
    check_bad_open(NULL, TTL_MS, 0, LEASE_SESSION_OPTS_VERSION);
    check_bad_open(a, 0, 0, LEASE_SESSION_OPTS_VERSION);
    check_bad_open(a, TTL_MS, TTL_MS, LEASE_SESSION_OPTS_VERSION);
    check_bad_open(a, TTL_MS, 0, 999);
    so.owner = a;
    so.ttl_ms = TTL_MS;
    CHECK_FAIL(LEASE_EINVALID, lease_session_open(&s, NULL, &so));
    CHECK_FAIL(LEASE_EINVALID, lease_session_open(&s, conf_store, NULL));
    CHECK_FAIL(LEASE_EINVALID, lease_session_open(NULL, conf_store, &so));
    assert_null(s);
    CHECK_RC(0, lease_session_close(NULL, 1)); /* NULL is allowed */
}

/* Each call fails with EINVALID and a message and changes nothing. */
#define CHECK_UNCHANGED(call)                                                 \
    do {                                                                      \
        CHECK_FAIL(LEASE_EINVALID, call);                                     \
        assert_int_equal(lease_session_count(s), 1);                          \
    } while (0)

static void test_session_bad_input(void **state)
{
    char a[LEASE_OWNER_BUFSZ];
    conf_keybuf *k = make_keys("bad", 3);
    const char *ks[3] = { k[1], k[2], k[0] }, *dup[3] = { k[1], k[2], k[1] },
               *hole[3] = { k[1], NULL, k[2] };
    lease_held *h = NULL, *h2 = NULL, *out[3];
    struct session_probe sp;
    lease_session *s;
    size_t count = 0;

    (void)state;
    conf_owner(a);
    s = open_session(conf_url, a, &sp);
    CHECK_RC(0, lease_session_acquire(&h, NULL, s, k[0], 0, NULL, NULL));
    assert_int_equal(lease_session_count(s), 1);

    CHECK_UNCHANGED(lease_session_acquire(&h2, NULL, s, k[0], 0, NULL, NULL));
    CHECK_UNCHANGED(lease_session_acquire(NULL, NULL, s, k[1], 0, NULL, NULL));
    CHECK_UNCHANGED(lease_session_acquire(&h2, NULL, NULL, k[1], 0, NULL, NULL));
    CHECK_UNCHANGED(lease_session_acquire(&h2, NULL, s, NULL, 0, NULL, NULL));
    CHECK_UNCHANGED(lease_session_acquire(&h2, NULL, s, "", 0, NULL, NULL));

    CHECK_UNCHANGED(lease_session_claim(&count, out, s, ks, 0, 1));
    CHECK_UNCHANGED(lease_session_claim(&count, out, s, ks, 3, 0));
    CHECK_UNCHANGED(lease_session_claim(&count, out, s, ks, 3, 4));
    CHECK_UNCHANGED(lease_session_claim(&count, out, s, dup, 3, 1));
    CHECK_UNCHANGED(lease_session_claim(&count, out, s, hole, 3, 1));
    CHECK_UNCHANGED(lease_session_claim(&count, out, s, NULL, 3, 1));
    CHECK_UNCHANGED(lease_session_claim(NULL, out, s, ks, 3, 1));
    CHECK_UNCHANGED(lease_session_claim(&count, NULL, s, ks, 3, 1));
    CHECK_UNCHANGED(lease_session_claim(&count, out, NULL, ks, 3, 1));
    CHECK_UNCHANGED(lease_session_release(s, NULL));
    CHECK_UNCHANGED(lease_session_release(NULL, h));

    /* Nothing reached the store: the other keys are free, k[0] still kept. */
    check_free(k[1]);
    check_free(k[2]);
    assert_int_equal(lease_held_valid(h), 1);
    check_held_by(k[0], a, lease_held_token(h));
    CHECK_RC(0, close_session(s));
    check_free(k[0]);
    assert_int_equal(atomic_load(&sp.fired), 0);
    free(k);
}

static int session_teardown(void **state)
{
    lease_session_close(live_session, 0);
    live_session = NULL;
    conf_forwarder_stop(live_forwarder);
    live_forwarder = NULL;
    return conf_teardown(state);
}

#define SESSION_TEST(f) cmocka_unit_test_setup_teardown(f, conf_setup, session_teardown)

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        SESSION_TEST(test_session_keeps_many_and_close_releases),
        SESSION_TEST(test_session_callers_during_rounds),
        SESSION_TEST(test_session_grant_taken_over),
        SESSION_TEST(test_session_claim),
        SESSION_TEST(test_session_outage_ends_authority),
        SESSION_TEST(test_session_open_bad_input),
        SESSION_TEST(test_session_bad_input),
    };
    int failed;

    if (argc == 3 && strcmp(argv[1], "--hold-sqlite-lock") == 0)
        return hold_sqlite_lock(argv[2]);
    if (conf_init(argc, argv, "session") != 0)
        return 2;
    (void)suite_ttl(conf_store); /* and MANY, which the tests size arrays by */
    failed = cmocka_run_group_tests_name("lease_session", tests, NULL, NULL);
    conf_store_close();
    return failed ? 1 : 0;
}
