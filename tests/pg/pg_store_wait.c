/*
 * pg_store_wait.c - many clients at once: LISTEN/NOTIFY waking a waiter,
 * waits bounded by the handle's timeout, a handle that stops listening
 * when its wait ends, and 32 connections racing for one key.
 */
#include <pthread.h>

#include "pg_store.h"

/* ======================================================================
 * waiting: LISTEN/NOTIFY wake-ups, and the bound
 * ====================================================================== */

/* The waiters' advisory lock class of the store (pg.c, WAIT_CLASS). */
#define WAIT_CLASS "1279607123"

/* Sessions of other processes idle after a LISTEN (the store's waiters). */
static long long listeners(PGconn *c)
{
    /* A waiter's last statement is its LISTEN, or, on a lease table with
     * waiting_until, the announcement it sends once listening; on one
     * without, it holds the waiters' advisory lock. */
    PGresult *r = PQexec(c, "SELECT count(*) FROM pg_stat_activity "
                            "WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid() AND state = 'idle' "
                            "AND (query ILIKE 'LISTEN%' "
                            "OR query LIKE '%SET waiting_until = greatest(%' "
                            "OR pid IN (SELECT pid FROM pg_locks WHERE "
                            "locktype = 'advisory' AND classid = " WAIT_CLASS
                            " AND mode = 'ShareLock' AND granted))");
    long long n = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1
                      ? atoll(PQgetvalue(r, 0, 0)) : -1;

    PQclear(r);
    return n;
}

/*
 * A holder with ttl 60 s; a waiter with wait_ms 10000 and
 * backoff_min_ms = backoff_max_ms = 30000, so that without a notification
 * its only tries are at once and when its wait ends. Another process
 * releases after ~300 ms (once the waiter is listening), and 4 s later
 * takes the key for itself with a 60 s ttl: a waiter that was not woken
 * by the release would find the key held at the end of its wait and time
 * out. It must have it: LEASE_OK, a greater token, and the late taker
 * gets EBUSY naming the waiter.
 */
static void notify_wakes_waiter(const char *url)
{
    char key[LEASE_KEY_MAX + 1], w[LEASE_OWNER_BUFSZ];
    int fds[2], st, rc;
    lease_acquire_opts o;
    lease_store *ws;
    lease_grant g;
    lease_info h;
    pg_rec held, rel, late;
    int64_t t;
    pid_t pid;

    conf_key(key, "notify/wake");
    conf_owner(w);
    conf_pipe(fds);
    conf_store_close();
    pid = conf_fork();
    if (pid == 0) {
        char ho[LEASE_OWNER_BUFSZ], lo[LEASE_OWNER_BUFSZ];
        lease_store *s;
        lease_grant hg, lg;
        lease_info li;
        lease_acquire_opts ho_opts;
        PGconn *c;
        long long base;
        int64_t t0, seen = -1;

        close(fds[0]);
        if (lease_store_open(&s, url) != 0 || lease_owner_new(ho) != 0 ||
            lease_owner_new(lo) != 0) {
            pg_send(fds[1], 1, -100, 0, NULL);
            _exit(10);
        }
        c = PQconnectdb(conf_url);
        base = listeners(c);
        ho_opts = conf_opts(ho, 60000, "holder", 0);
        rc = lease_acquire(&hg, NULL, s, key, &ho_opts);
        pg_send(fds[1], 1, rc, rc == 0 ? hg.token : 0, ho);
        if (rc != 0)
            _exit(11);
        /* Release after ~300 ms, once the waiter listens (at most 5 s). */
        t0 = conf_now_ms();
        for (;;) {
            int64_t el = conf_now_ms() - t0;
            if (seen < 0 && listeners(c) > base)
                seen = el;
            if (el >= 300 && (seen >= 0 || el >= 5000))
                break;
            conf_sleep_ms(10);
        }
        rc = lease_release(s, &hg);
        pg_send(fds[1], 2, rc, (uint64_t)seen, NULL);
        /* 4 s later, take the key (60 s): a waiter not woken loses it. */
        conf_sleep_ms(4000);
        ho_opts = conf_opts(lo, 60000, "late taker", 0);
        memset(&li, 0, sizeof(li));
        rc = lease_acquire(&lg, &li, s, key, &ho_opts);
        pg_send(fds[1], 3, rc, li.token, li.owner);
        PQfinish(c);
        lease_store_close(s);
        _exit(0);
    }
    close(fds[1]);
    held = pg_recv(fds[0], 30000, "holder acquired");
    if (held.rc != 0)
        fail_msg("the holder could not acquire: %s", lease_error_name(held.rc));
    CHECK_RC(0, lease_store_open(&ws, url));

    o = conf_opts(w, 60000, "waiter", 10000);
    o.backoff_min_ms = 30000;
    o.backoff_max_ms = 30000;
    memset(&g, 0, sizeof(g));
    t = conf_now_ms();
    rc = lease_acquire(&g, &h, ws, key, &o);
    t = conf_now_ms() - t;
    rel = pg_recv(fds[0], 30000, "holder released");
    late = pg_recv(fds[0], 30000, "late taker");
    st = conf_reap(pid, 30000);
    close(fds[0]);
    printf("# waiter (wait 10 s, backoff 30 s): %s after %" PRId64 " ms; holder "
           "saw it listening %" PRId64 " ms and released %" PRId64
           " ms after acquiring\n",
           lease_error_name(rc), t, (int64_t)rel.value, rel.t_ms - held.t_ms);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(rel.rc, 0);
    if (rc != 0)
        fail_msg("the waiter was not woken by the release: %s (%s)",
                 lease_error_name(rc), lease_errmsg());
    ASSERT_U64_OP(g.token, >, held.value);
    /* The late taker found the waiter holding it. */
    CHECK_RC(LEASE_EBUSY, late.rc);
    assert_string_equal(late.text, w);
    ASSERT_U64_OP(late.value, ==, g.token);
    CHECK_RC(0, lease_release(ws, &g));
    lease_store_close(ws);
    conf_store_open();
}

void test_wait_notify_wakes_waiter(void **state)
{
    (void)state;
    notify_wakes_waiter(conf_url);
}

/*
 * The same on the reference SQL's table, without waiting_until: the
 * waiter announces itself by the store's advisory lock, and the release,
 * which notifies only a waiter holding it, wakes it.
 */
void test_wait_notify_wakes_waiter_reftable(void **state)
{
    char name[13], sql[512], params[64], *url;
    PGconn *c = raw_connect(conf_url);

    (void)state;
    pg_rand_name(name);
    snprintf(sql, sizeof(sql), "CREATE TABLE wr_%s (resource_key text PRIMARY KEY, "
             "owner_id uuid, lease_until timestamptz NOT NULL DEFAULT "
             "'-infinity'::timestamptz, fencing_token bigint NOT NULL DEFAULT 0 "
             "CHECK (fencing_token >= 0))", name);
    raw_ok(c, sql);
    snprintf(params, sizeof(params), "lease_table=wr_%s", name);
    url = url_with(conf_url, params);
    notify_wakes_waiter(url);
    free(url);
    snprintf(sql, sizeof(sql), "DROP TABLE wr_%s, wr_%s_history", name, name);
    raw_ok(c, sql);
    PQfinish(c);
}

static long long wait_locks(PGconn *c, const char *key);

/* A waiter on its own handle and thread: acquire `key` as `owner`,
 * waiting up to 20 s, then give the lease back. */
typedef struct column_waiter {
    const char *url, *key, *owner;
    int rc;
} column_waiter;

static void *column_waiter_run(void *arg)
{
    column_waiter *w = arg;
    lease_acquire_opts o = conf_opts(w->owner, 30000, NULL, 20000);
    lease_store *st = NULL;
    lease_grant g;

    if ((w->rc = lease_store_open(&st, w->url)) == 0 &&
        (w->rc = lease_acquire(&g, NULL, st, w->key, &o)) == 0)
        w->rc = lease_release(st, &g);
    lease_store_close(st);
    return NULL;
}

/*
 * waiting_until added while clients run: a handle opened before it (its
 * release looks at the waiters' advisory lock only) must still hear a
 * waiter opened after it (which announces in the row): so that waiter
 * holds the lock as well while it waits, and is woken.
 */
void test_wait_column_added(void **state)
{
    char name[13], sql[512], params[64], key[LEASE_KEY_MAX + 1];
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ], *url;
    PGconn *c = raw_connect(conf_url);
    column_waiter w;
    lease_store *s;
    lease_acquire_opts o;
    lease_grant g;
    pthread_t t;
    long long n;
    int i;

    (void)state;
    pg_rand_name(name);
    conf_key(key, "notify/column-added");
    conf_owner(a);
    conf_owner(b);
    snprintf(sql, sizeof(sql), "CREATE TABLE wc_%s (resource_key text PRIMARY KEY, "
             "owner_id uuid, lease_until timestamptz NOT NULL DEFAULT "
             "'-infinity'::timestamptz, fencing_token bigint NOT NULL DEFAULT 0 "
             "CHECK (fencing_token >= 0))", name);
    raw_ok(c, sql);
    snprintf(params, sizeof(params), "lease_table=wc_%s", name);
    url = url_with(conf_url, params);
    CHECK_RC(0, lease_store_open(&s, url));
    o = conf_opts(a, 30000, NULL, 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    snprintf(sql, sizeof(sql), "ALTER TABLE wc_%s ADD COLUMN waiting_until timestamptz",
             name);
    raw_ok(c, sql);
    w.url = url;
    w.key = key;
    w.owner = b;
    w.rc = 1;
    assert_int_equal(pthread_create(&t, NULL, column_waiter_run, &w), 0);
    /* Bounded: 10 s for the waiter to start waiting. The waiter gives the
     * lock back between two pieces of its wait, so the count that ends
     * the loop is the one checked, not a second reading. */
    for (i = 0, n = 0; i < 500 && (n = wait_locks(c, key)) == 0; i++)
        conf_sleep_ms(20);
    assert_int_equal(n, 1);
    CHECK_RC(0, lease_release(s, &g));
    pthread_join(t, NULL);
    assert_int_equal(w.rc, 0);
    lease_store_close(s);
    free(url);
    snprintf(sql, sizeof(sql), "DROP TABLE wc_%s, wc_%s_history", name, name);
    raw_ok(c, sql);
    PQfinish(c);
}

/* Waiting stays bounded: 500 ms against a 60 s holder. */
void test_wait_is_bounded(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_store *other;
    lease_acquire_opts o;
    lease_grant g, g2;
    lease_info h;
    int64_t t;

    (void)state;
    conf_key(key, "notify/bounded");
    conf_owner(a);
    conf_owner(b);
    g = conf_acquire(key, a, 60000, "long holder");
    CHECK_RC(0, lease_store_open(&other, conf_url));
    o = conf_opts(b, 60000, NULL, 500);
    memset(&h, 0, sizeof(h));
    t = conf_now_ms();
    CHECK_FAIL(LEASE_ETIMEOUT, lease_acquire(&g2, &h, other, key, &o));
    printf("# wait 500 ms against a 60 s holder: ETIMEOUT after %" PRId64 " ms\n",
           conf_now_ms() - t);
    assert_string_equal(h.owner, a);
    ASSERT_U64_OP(h.token, ==, g.token);
    /* Other keys' releases do not end the wait early with a wrong answer. */
    lease_store_close(other);
    CHECK_RC(0, lease_release(conf_store, &g));
}

typedef struct notify_probe {
    int calls;
    int pending; /* notifications libpq had received for this connection */
} notify_probe;

static int count_notifies_cb(void *native, void *payload)
{
    notify_probe *p = payload;
    PGnotify *n;

    p->calls++;
    (void)PQconsumeInput(native);
    while ((n = PQnotifies(native)) != NULL) {
        p->pending++;
        PQfreemem(n);
    }
    return 0;
}

/* Release and re-acquire `n` other keys: n notifications on the channel. */
static void churn(const char *tag, int n)
{
    char key[LEASE_KEY_MAX + 1], owner[LEASE_OWNER_BUFSZ], name[64];
    lease_grant g;
    int i;

    conf_owner(owner);
    for (i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "notify/churn-%s-%d", tag, i);
        conf_key(key, name);
        g = conf_acquire(key, owner, 30000, NULL);
        CHECK_RC(0, lease_release(conf_store, &g));
    }
}

/*
 * A wait that ended (ETIMEOUT) leaves nothing behind: the handle does not
 * keep listening, so releases of other keys made later are not delivered
 * to it and do not pile up in its memory (libpq keeps every notification
 * it receives until PQnotifies is called, which nothing does outside a
 * wait). Seen from inside a guarded transaction of that handle.
 */
void test_wait_timeout_stops_listening(void **state)
{
    char key[LEASE_KEY_MAX + 1], mine[LEASE_KEY_MAX + 1];
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_store *w;
    lease_acquire_opts o;
    lease_grant g, held, gm;
    notify_probe p1, p2;

    (void)state;
    conf_key(key, "notify/timed-out");
    conf_key(mine, "notify/guarded");
    conf_owner(a);
    conf_owner(b);
    held = conf_acquire(key, a, 60000, NULL);
    gm = conf_acquire(mine, a, 60000, NULL);
    CHECK_RC(0, lease_store_open(&w, conf_url));
    o = conf_opts(b, 60000, NULL, 300);
    CHECK_FAIL(LEASE_ETIMEOUT, lease_acquire(&g, NULL, w, key, &o));

    churn("a", 50);
    memset(&p1, 0, sizeof(p1));
    CHECK_RC(0, lease_guarded_txn(w, &gm, count_notifies_cb, &p1));
    churn("b", 50);
    memset(&p2, 0, sizeof(p2));
    CHECK_RC(0, lease_guarded_txn(w, &gm, count_notifies_cb, &p2));
    printf("# a handle whose wait timed out: %d notifications of other keys' "
           "releases received after it, %d more after its next call\n",
           p1.pending, p2.pending);
    lease_store_close(w);
    CHECK_RC(0, lease_release(conf_store, &held));
    CHECK_RC(0, lease_release(conf_store, &gm));
    assert_int_equal(p1.calls, 1);
    assert_int_equal(p2.calls, 1);
    if (p2.pending != 0)
        fail_msg("the handle still listens after its wait timed out: %d "
                 "notifications of unrelated releases reached it after its "
                 "next call (and accumulate in libpq for its lifetime)",
                 p2.pending);
}

/* ======================================================================
 * notifying only announced waiters
 * ====================================================================== */

#define SENTINEL "lease-test-sentinel"

/*
 * Notifications for `key` that `listener` (listening on lease_release)
 * got before a sentinel that `other` sends now: notifications arrive in
 * commit order, so one sent by a release that returned before this call
 * is always here before the sentinel. No timing involved.
 */
static int notified_before_sentinel(PGconn *listener, PGconn *other, const char *key)
{
    int64_t end = conf_now_ms() + 20000;
    int count = 0;

    raw_ok(other, "NOTIFY lease_release, '" SENTINEL "'");
    for (;;) {
        struct pollfd p = { PQsocket(listener), POLLIN, 0 };
        PGnotify *n;

        if (!PQconsumeInput(listener))
            fail_msg("listener: %s", PQerrorMessage(listener));
        while ((n = PQnotifies(listener)) != NULL) {
            int sentinel = strcmp(n->extra, SENTINEL) == 0;

            count += strcmp(n->extra, key) == 0;
            PQfreemem(n);
            if (sentinel)
                return count;
        }
        if (conf_now_ms() > end)
            fail_msg("the sentinel notification did not arrive within 20 s");
        (void)poll(&p, 1, 200);
    }
}

/* Acquire and release `key` on `s`: the notifications it caused. */
static int cycle_notifies(lease_store *s, PGconn *listener, PGconn *other,
                          const char *key, const char *owner, const char *announce)
{
    lease_acquire_opts o = conf_opts(owner, 30000, NULL, 0);
    lease_grant g;

    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    if (announce)
        raw_ok(other, announce);
    CHECK_RC(0, lease_release(s, &g));
    return notified_before_sentinel(listener, other, key);
}

/* Take (lock != 0) or give back the waiters' advisory lock of `key` on
 * `c`, as the store's waiter does on a table without waiting_until. */
static void wait_lock(PGconn *c, const char *key, int lock)
{
    const char *v[1] = { key };
    char *r = raw_scalar(c, lock ? "SELECT pg_advisory_lock_shared(" WAIT_CLASS
                                   ", hashtext($1))::text"
                                 : "SELECT pg_advisory_unlock_shared(" WAIT_CLASS
                                   ", hashtext($1))::text", 1, v);

    free(r);
}

/* Sessions holding the waiters' advisory lock of `key`. */
static long long wait_locks(PGconn *c, const char *key)
{
    const char *v[1] = { key };

    return raw_ll(c, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                     "AND classid = " WAIT_CLASS " AND objid = hashtext($1)::oid "
                     "AND mode = 'ShareLock'", 1, v);
}

/*
 * On a lease table with waiting_until (made by the store), a release
 * notifies only when a waiter announced itself and the announcement has
 * not expired; a new grant clears announcements; a waiter announces
 * itself. On a table without the column (the reference SQL's), a release
 * notifies only while a waiter holds the waiters' advisory lock of the
 * key, and a waiter takes it for its wait and gives it back; a release on
 * a table with the column hears such a waiter too.
 */
void test_wait_notify_only_announced(void **state)
{
    char name[13], key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    char params[64], sql[512], *url, *v;
    lease_store *s, *w;
    lease_acquire_opts o;
    lease_grant g, g2;
    PGconn *listener, *other;

    (void)state;
    pg_rand_name(name);
    conf_key(key, "notify/announced");
    conf_owner(a);
    conf_owner(b);
    listener = raw_connect(conf_url);
    other = raw_connect(conf_url);
    raw_ok(listener, "LISTEN lease_release");
    snprintf(params, sizeof(params), "lease_table=wn_%s", name);
    url = url_with(conf_url, params);
    CHECK_RC(0, lease_store_open(&s, url));

    /* Nobody waits: no notification. */
    assert_int_equal(cycle_notifies(s, listener, other, key, a, NULL), 0);
    /* A waiter holding the advisory lock (a handle opened before the
     * column was added): notified. */
    wait_lock(other, key, 1);
    assert_int_equal(cycle_notifies(s, listener, other, key, a, NULL), 1);
    wait_lock(other, key, 0);
    /* A waiter announced (as sql_announce does): notified. */
    snprintf(sql, sizeof(sql), "UPDATE wn_%s SET waiting_until = clock_timestamp() "
             "+ interval '1 minute'", name);
    assert_int_equal(cycle_notifies(s, listener, other, key, a, sql), 1);
    /* The announcement outlives that release, but the next grant clears
     * it: the waiters it stood for were woken. */
    o = conf_opts(a, 30000, NULL, 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    snprintf(sql, sizeof(sql), "SELECT (waiting_until IS NULL)::text FROM wn_%s", name);
    v = raw_scalar(other, sql, 0, NULL);
    assert_string_equal(v, "true");
    free(v);
    CHECK_RC(0, lease_release(s, &g));
    assert_int_equal(notified_before_sentinel(listener, other, key), 0);
    /* An expired announcement (a waiter that crashed): no notification. */
    snprintf(sql, sizeof(sql), "UPDATE wn_%s SET waiting_until = clock_timestamp() "
             "- interval '1 second'", name);
    assert_int_equal(cycle_notifies(s, listener, other, key, a, sql), 0);

    /* A waiter that times out announced itself, for about its wait. */
    o = conf_opts(a, 30000, NULL, 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    CHECK_RC(0, lease_store_open(&w, url));
    o = conf_opts(b, 30000, NULL, 300);
    CHECK_FAIL(LEASE_ETIMEOUT, lease_acquire(&g2, NULL, w, key, &o));
    lease_store_close(w);
    snprintf(sql, sizeof(sql), "SELECT (waiting_until > clock_timestamp() - "
             "interval '1 minute' AND waiting_until < clock_timestamp() + "
             "interval '1 minute')::text FROM wn_%s", name);
    v = raw_scalar(other, sql, 0, NULL);
    assert_string_equal(v, "true");
    free(v);
    CHECK_RC(0, lease_release(s, &g));
    (void)notified_before_sentinel(listener, other, key);
    lease_store_close(s);
    free(url);

    /* The reference SQL's table, without the column: the lock. */
    snprintf(sql, sizeof(sql), "CREATE TABLE wo_%s (resource_key text PRIMARY KEY, "
             "owner_id uuid, lease_until timestamptz NOT NULL DEFAULT "
             "'-infinity'::timestamptz, fencing_token bigint NOT NULL DEFAULT 0 "
             "CHECK (fencing_token >= 0))", name);
    raw_ok(other, sql);
    snprintf(params, sizeof(params), "lease_table=wo_%s", name);
    url = url_with(conf_url, params);
    CHECK_RC(0, lease_store_open(&s, url));
    assert_int_equal(cycle_notifies(s, listener, other, key, a, NULL), 0);
    wait_lock(other, key, 1);
    assert_int_equal(wait_locks(other, key), 1);
    assert_int_equal(cycle_notifies(s, listener, other, key, a, NULL), 1);
    wait_lock(other, key, 0);
    assert_int_equal(cycle_notifies(s, listener, other, key, a, NULL), 0);
    /* A waiter that times out held the lock for its wait (the release
     * that would have woken it is test_wait_notify_wakes_waiter_reftable)
     * and gave it back, its handle still open. */
    o = conf_opts(a, 30000, NULL, 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    CHECK_RC(0, lease_store_open(&w, url));
    o = conf_opts(b, 30000, NULL, 300);
    CHECK_FAIL(LEASE_ETIMEOUT, lease_acquire(&g2, NULL, w, key, &o));
    assert_int_equal(wait_locks(other, key), 0);
    lease_store_close(w);
    CHECK_RC(0, lease_release(s, &g));
    (void)notified_before_sentinel(listener, other, key);
    lease_store_close(s);
    free(url);

    snprintf(sql, sizeof(sql), "DROP TABLE wn_%s, wn_%s_history, wo_%s, wo_%s_history",
             name, name, name, name);
    raw_ok(other, sql);
    PQfinish(listener);
    PQfinish(other);
}

/* ======================================================================
 * 32 connections racing for one key
 * ====================================================================== */

#define RACERS 32
#define ROUNDS 10

void test_race_32(void **state)
{
    char key[LEASE_KEY_MAX + 1];
    int go[ROUNDS][2], res[2], r, i, st;
    pid_t pids[RACERS];
    uint64_t last = 0;
    int64_t t0;

    (void)state;
    conf_key(key, "race/one-key");
    for (r = 0; r < ROUNDS; r++)
        conf_pipe(go[r]);
    conf_pipe(res);
    conf_store_close();
    for (i = 0; i < RACERS; i++) {
        pids[i] = conf_fork();
        if (pids[i] == 0) {
            lease_store *s;
            int j;
            close(res[0]);
            for (j = 0; j < ROUNDS; j++)
                close(go[j][1]);
            if (lease_store_open_timeout(&s, conf_url, 20000) != 0) {
                pg_send(res[1], 0, -100, 0, NULL);
                _exit(10);
            }
            pg_send(res[1], 0, 0, 0, NULL); /* ready */
            for (j = 0; j < ROUNDS; j++) {
                char ch, owner[LEASE_OWNER_BUFSZ];
                lease_acquire_opts o;
                lease_grant g;
                int rc;
                /* The go-pipe: EOF when the parent closes it. */
                if (conf_read_full(go[j][0], &ch, 1, conf_now_ms() + 120000) != 0)
                    _exit(12);
                if (lease_owner_new(owner) != 0)
                    _exit(13);
                o = conf_opts(owner, 60000, "racer", 0);
                memset(&g, 0, sizeof(g));
                rc = lease_acquire(&g, NULL, s, key, &o);
                pg_send(res[1], j + 1, rc, rc == 0 ? g.token : 0, owner);
            }
            lease_store_close(s);
            _exit(0);
        }
    }
    close(res[1]);
    for (r = 0; r < ROUNDS; r++)
        close(go[r][0]);
    for (i = 0; i < RACERS; i++) {
        pg_rec rec = pg_recv(res[0], 60000, "racer ready");
        if (rec.rc != 0)
            fail_msg("a racer could not open the store");
    }
    conf_store_open();
    t0 = conf_now_ms();
    for (r = 0; r < ROUNDS; r++) {
        int winners = 0, busy = 0;
        pg_rec win;
        lease_grant g;

        memset(&win, 0, sizeof(win));
        close(go[r][1]); /* go */
        for (i = 0; i < RACERS; i++) {
            pg_rec rec = pg_recv(res[0], 60000, "racer result");
            if (rec.kind != r + 1)
                fail_msg("round %d: a result of round %d", r + 1, rec.kind);
            if (rec.rc == 0) {
                winners++;
                win = rec;
            } else if (rec.rc == LEASE_EBUSY) {
                busy++;
            } else {
                fail_msg("round %d: a racer got %s (neither OK nor EBUSY)", r + 1,
                         lease_error_name(rec.rc));
            }
        }
        if (winners != 1)
            fail_msg("round %d: %d winners, %d busy (exactly one must win)", r + 1,
                     winners, busy);
        assert_int_equal(busy, RACERS - 1);
        ASSERT_U64_OP(win.value, >, last);
        last = win.value;
        {
            lease_info info;
            CHECK_RC(0, lease_inspect(&info, conf_store, key));
            assert_int_equal(info.held, 1);
            assert_string_equal(info.owner, win.text);
            ASSERT_U64_OP(info.token, ==, win.value);
        }
        CHECK_RC(0, lease_grant_init(&g, key, win.text, win.value, 60000));
        CHECK_RC(0, lease_release(conf_store, &g));
    }
    printf("# %d rounds of %d racers: one winner each, last token %" PRIu64
           ", %" PRId64 " ms\n", ROUNDS, RACERS, last, conf_now_ms() - t0);
    for (i = 0; i < RACERS; i++) {
        st = conf_reap(pids[i], 60000);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    close(res[0]);
}
