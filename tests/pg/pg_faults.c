/*
 * pg_faults.c - the PostgreSQL store when its server restarts or is gone.
 *
 *     with-server.sh scripts/pg-server.sh pg_faults restart|unreachable
 *
 * Run by with-server.sh, which starts a server of this test's own and
 * gives PG_TEST_URL, PG_TEST_DIR, PG_SERVER and PG_CLOSED_PORT (see
 * there); this program restarts or stops that server with pg-server.sh.
 *
 * restart:     a lease held across a crash-restart (-m immediate) keeps its
 *              owner and token, the token counter and the fencing marks
 *              survive, and the handle opened before the restart works
 *              again (ESTORE first at most, within a bounded retry loop).
 *              So does the grant history: every acknowledged grant's
 *              entry is there after the restart, field for field (token,
 *              owner, label, ttl, grant time, ending, end time); a grant
 *              held across it whose ttl ran out reads expired, dated by
 *              its lease_until (acquired + ttl, exactly), and lost, with
 *              the same date, once its holder's renew is refused; grants
 *              after the restart are recorded above, with greater tokens.
 * unreachable: a closed port, a server frozen with SIGSTOP, and a server
 *              stopped under an open handle: every call is LEASE_ESTORE,
 *              never EBUSY (nor ELOST, nor ETIMEOUT), and no message
 *              holds the password.
 */
#include "pg_test.h"

static const char *srv_script, *srv_dir, *closed_port;
static char *password;

/* Run `pg-server.sh CMD DIR` and wait for it (bounded). */
static void server(const char *cmd)
{
    int64_t t = conf_now_ms();
    pid_t pid;
    int st;

    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        fail_msg("fork: %s", strerror(errno));
    if (pid == 0) {
        execlp("bash", "bash", srv_script, cmd, srv_dir, (char *)NULL);
        _exit(127);
    }
    st = conf_reap(pid, 90000);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("pg-server.sh %s failed (status %d)", cmd, st);
    printf("# pg-server.sh %s: %" PRId64 " ms\n", cmd, conf_now_ms() - t);
}

/* ======================================================================
 * the grant history
 * ====================================================================== */

/* This host's wall clock in ms: the server's too (loopback, same host),
 * whose clock_timestamp() dates the history. */
static int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A grant and the wall-clock window of the call that made it. */
typedef struct timed_grant {
    lease_grant g;
    int64_t t0, t1;
} timed_grant;

static timed_grant timed_acquire(const char *key, const char *owner,
                                 uint64_t ttl_ms, const char *label)
{
    timed_grant t;

    t.t0 = wall_ms();
    t.g = conf_acquire(key, owner, ttl_ms, label);
    t.t1 = wall_ms();
    ASSERT_U64_OP(t.g.ttl_ms, ==, ttl_ms);
    return t;
}

static lease_history_entry *history_of(size_t *n, lease_store *s, const char *key)
{
    lease_history_entry *h = NULL;

    *n = 0;
    CHECK_RC(0, lease_history(&h, n, s, key, 0));
    if (*n > 0)
        assert_non_null(h);
    else
        assert_null(h);
    return h;
}

/*
 * The first history read through a handle whose connection died in the
 * restart: ESTORE (never a short or empty history, never another error)
 * until the handle reconnects; bounded (30 s).
 */
static lease_history_entry *history_after_restart(size_t *n, const char *key)
{
    lease_history_entry *h = NULL;
    int64_t end = conf_now_ms() + 30000;
    int rc, tries = 0;

    for (;;) {
        lease_error_clear();
        *n = 0;
        rc = lease_history(&h, n, conf_store, key, 0);
        tries++;
        if (rc == 0)
            break;
        if (rc != LEASE_ESTORE)
            fail_msg("history after the restart: %s (%s); only ESTORE may come "
                     "before the handle works again", lease_error_name(rc),
                     lease_errmsg());
        assert_null(h);
        assert_int_equal(*n, 0);
        ASSERT_NO_SECRET(lease_errmsg(), password);
        if (conf_now_ms() > end)
            fail_msg("history after the restart: still ESTORE after 30 s (%s)",
                     lease_errmsg());
        conf_sleep_ms(100);
    }
    printf("# the first history read after the restart: %d call(s)\n", tries);
    return h;
}

/* Entry e is the grant t, ended so, at a time in [end_lo, end_hi] (0 0
 * for held: no end time); granted within the call that made it. */
static void check_entry(const lease_history_entry *e, const timed_grant *t,
                        lease_ended ended, int64_t end_lo, int64_t end_hi)
{
    if (e->token != t->g.token || e->ended != ended)
        fail_msg("history entry: token %" PRIu64 " %s, expected token %" PRIu64
                 " %s", e->token, lease_ended_name(e->ended), t->g.token,
                 lease_ended_name(ended));
    assert_string_equal(e->owner, t->g.owner);
    assert_string_equal(e->label, t->g.label);
    ASSERT_U64_OP(e->ttl_ms, ==, t->g.ttl_ms);
    ASSERT_I64_OP(e->acquired_ms, >=, t->t0);
    ASSERT_I64_OP(e->acquired_ms, <=, t->t1);
    ASSERT_I64_OP(e->ended_ms, >=, end_lo);
    ASSERT_I64_OP(e->ended_ms, <=, end_hi);
}

/* An entry that ended when its lease expired: at acquired + ttl (the
 * store dates it by lease_until). The eager history's acquired is
 * lease_until - ttl exactly; the deferred one's (pg.c, DEFERRED) is the
 * row's acquired_at, a clock reading of the same statement taken a few
 * microseconds after lease_until's: in whole milliseconds (floored) it can
 * be one more. */
static void check_expiry(const lease_history_entry *e, const timed_grant *t,
                         lease_ended ended)
{
    check_entry(e, t, ended, t->t0 + (int64_t)t->g.ttl_ms,
                t->t1 + (int64_t)t->g.ttl_ms);
    ASSERT_I64_OP(e->ended_ms, <=, e->acquired_ms + (int64_t)e->ttl_ms);
    ASSERT_I64_OP(e->ended_ms, >=, e->acquired_ms + (int64_t)e->ttl_ms - 1);
}

/* Two reads of a history are the same, entry by entry, field by field. */
static void check_same(const lease_history_entry *a, size_t na,
                       const lease_history_entry *b, size_t nb, const char *what)
{
    size_t i;

    if (na != nb)
        fail_msg("%s: %zu entries, expected %zu", what, na, nb);
    for (i = 0; i < na; i++)
        if (a[i].token != b[i].token || strcmp(a[i].owner, b[i].owner) != 0 ||
            strcmp(a[i].label, b[i].label) != 0 || a[i].ttl_ms != b[i].ttl_ms ||
            a[i].acquired_ms != b[i].acquired_ms || a[i].ended != b[i].ended ||
            a[i].ended_ms != b[i].ended_ms)
            fail_msg("%s, entry %zu: token %" PRIu64 " owner %s label '%s' ttl %"
                     PRIu64 " acquired %" PRId64 " %s at %" PRId64 "; expected "
                     "token %" PRIu64 " owner %s label '%s' ttl %" PRIu64
                     " acquired %" PRId64 " %s at %" PRId64, what, i, a[i].token,
                     a[i].owner, a[i].label, a[i].ttl_ms, a[i].acquired_ms,
                     lease_ended_name(a[i].ended), a[i].ended_ms, b[i].token,
                     b[i].owner, b[i].label, b[i].ttl_ms, b[i].acquired_ms,
                     lease_ended_name(b[i].ended), b[i].ended_ms);
}

/* ======================================================================
 * restart
 * ====================================================================== */

static void test_restart_lease_and_counter_survive(void **state)
{
    char key[LEASE_KEY_MAX + 1], counter[LEASE_KEY_MAX + 1], res[LEASE_KEY_MAX + 1];
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ], c[LEASE_OWNER_BUFSZ];
    char cyc_owner[3][LEASE_OWNER_BUFSZ];
    char seen[256] = "";
    lease_acquire_opts o;
    lease_grant ga, gb, g;
    timed_grant tga, tgb, tg, cyc[3];
    int64_t rel[3][2], t_up;
    lease_history_entry *hk, *hc, *h;
    size_t nk, nc, n;
    lease_info info;
    lease_store *fresh;
    uint64_t last = 0, mark;
    void *val;
    size_t len;
    int i, rc = -1;
    int64_t t, end;

    (void)state;
    conf_key(key, "restart/held");
    conf_key(counter, "restart/counter");
    conf_key(res, "restart/resource");
    conf_owner(a);
    conf_owner(b);
    CHECK_RC(0, lease_store_set_timeout(conf_store, 2000));

    tga = timed_acquire(key, a, 120000, "held across the restart");
    ga = tga.g;
    CHECK_RC(0, lease_guarded_put(conf_store, &ga, key, "before", 6));
    for (i = 0; i < 3; i++) {
        conf_owner(cyc_owner[i]);
        cyc[i] = timed_acquire(counter, cyc_owner[i], 60000, NULL);
        ASSERT_U64_OP(cyc[i].g.token, >, last);
        last = cyc[i].g.token;
        rel[i][0] = wall_ms();
        CHECK_RC(0, lease_release(conf_store, &cyc[i].g));
        rel[i][1] = wall_ms();
    }
    tgb = timed_acquire(counter, b, 120000, "counter holder");
    gb = tgb.g;
    ASSERT_U64_OP(gb.token, >, last);
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, gb.token));

    /* The history before the restart, as acknowledged. */
    hk = history_of(&nk, conf_store, key);
    assert_int_equal(nk, 1);
    check_entry(&hk[0], &tga, LEASE_ENDED_HELD, 0, 0);
    hc = history_of(&nc, conf_store, counter);
    assert_int_equal(nc, 4);
    check_entry(&hc[0], &tgb, LEASE_ENDED_HELD, 0, 0);
    for (i = 0; i < 3; i++)
        check_entry(&hc[3 - i], &cyc[i], LEASE_ENDED_RELEASED, rel[i][0], rel[i][1]);

    server("restart");

    /* The handle from before the restart: ESTORE (its connection died)
     * until it reconnects, then the lease as it was. Nothing else. */
    t = conf_now_ms();
    end = t + 30000;
    for (i = 0; conf_now_ms() < end; i++) {
        lease_error_clear();
        rc = lease_inspect(&info, conf_store, key);
        if (strlen(seen) < sizeof(seen) - 16)
            snprintf(seen + strlen(seen), sizeof(seen) - strlen(seen), "%s%s",
                     i ? "," : "", lease_error_name(rc));
        if (rc == 0)
            break;
        if (rc != LEASE_ESTORE)
            fail_msg("inspect after the restart: %s (%s); only ESTORE may come "
                     "before the handle works again", lease_error_name(rc),
                     lease_errmsg());
        ASSERT_NO_SECRET(lease_errmsg(), password);
        conf_sleep_ms(100);
    }
    printf("# the old handle after the restart: %s (%" PRId64 " ms)\n", seen,
           conf_now_ms() - t);
    CHECK_RC(0, rc);
    t_up = wall_ms();
    assert_int_equal(info.held, 1);
    assert_string_equal(info.owner, a);
    ASSERT_U64_OP(info.token, ==, ga.token);
    assert_string_equal(info.label, "held across the restart");
    /* Every acknowledged grant's entry, exactly as before the restart. */
    h = history_of(&n, conf_store, key);
    check_same(h, n, hk, nk, "history of the held key after the restart");
    lease_history_free(h);
    h = history_of(&n, conf_store, counter);
    check_same(h, n, hc, nc, "history of the counter key after the restart");
    lease_history_free(h);

    /* Still the holder: renew works, others are refused. */
    CHECK_RC(0, lease_renew(&ga, conf_store, 0));
    conf_owner(c);
    o = conf_opts(c, 60000, NULL, 0);
    CHECK_FAIL(LEASE_EBUSY, lease_acquire(&g, NULL, conf_store, key, &o));

    /* The counter: the next token is greater than every one before. */
    CHECK_RC(0, lease_inspect(&info, conf_store, counter));
    assert_string_equal(info.owner, b);
    ASSERT_U64_OP(info.token, ==, gb.token);
    CHECK_RC(0, lease_release(conf_store, &gb));
    tg = timed_acquire(counter, c, 60000, "after the restart");
    g = tg.g;
    ASSERT_U64_OP(g.token, >, gb.token);
    /* Recorded above the grants from before, which are unchanged but for
     * the release of the one that was held. */
    h = history_of(&n, conf_store, counter);
    assert_int_equal(n, 5);
    check_entry(&h[0], &tg, LEASE_ENDED_HELD, 0, 0);
    check_entry(&h[1], &tgb, LEASE_ENDED_RELEASED, t_up, tg.t0);
    check_same(h + 2, 3, hc + 1, 3, "history of the counter key, the released grants");
    lease_history_free(h);
    CHECK_RC(0, lease_release(conf_store, &g));

    /* Marks and guarded data too. */
    CHECK_RC(0, lease_fence_mark(&mark, conf_store, res));
    ASSERT_U64_OP(mark, ==, gb.token);
    CHECK_FAIL(LEASE_ESTALE, lease_fence_advance(&mark, conf_store, res, gb.token - 1));
    CHECK_RC(0, lease_data_get(&val, &len, NULL, conf_store, key));
    assert_int_equal(len, 6);
    assert_memory_equal(val, "before", 6);
    free(val);

    /* A new handle sees the same. */
    CHECK_RC(0, lease_store_open(&fresh, conf_url));
    CHECK_RC(0, lease_inspect(&info, fresh, key));
    assert_string_equal(info.owner, a);
    ASSERT_U64_OP(info.token, ==, ga.token);
    /* ... and the history of the held key exactly as it was (renewed
     * since, which changes no entry). */
    h = history_of(&n, fresh, key);
    check_same(h, n, hk, nk, "history of the held key after the restart");
    lease_history_free(h);
    lease_store_close(fresh);
    CHECK_RC(0, lease_release(conf_store, &ga));
    h = history_of(&n, conf_store, key);
    assert_int_equal(n, 1);
    check_entry(&h[0], &tga, LEASE_ENDED_RELEASED, t_up, wall_ms());
    lease_history_free(h);
    lease_history_free(hk);
    lease_history_free(hc);
}

/* A waiting acquire rides through a restart: while it waits, ESTORE is
 * retried; and a keeper with a ttl longer than the outage keeps its lease. */
static void test_restart_waiting_acquire_and_keeper(void **state)
{
    char key[LEASE_KEY_MAX + 1], kk[LEASE_KEY_MAX + 1];
    char a[LEASE_OWNER_BUFSZ], k[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_keeper_opts ko = LEASE_KEEPER_OPTS_INIT;
    lease_keeper *keeper;
    lease_grant g, kg, last;
    timed_grant tkg;
    lease_history_entry *hk, *h;
    size_t nk, n;
    lease_info info;
    int64_t t, t_up, t_rel;
    int rc;

    (void)state;
    conf_key(key, "restart/waiter");
    conf_key(kk, "restart/kept");
    conf_owner(a);
    conf_owner(k);
    CHECK_RC(0, lease_store_set_timeout(conf_store, 2000));

    tkg = timed_acquire(kk, k, 10000, "kept");
    kg = tkg.g;
    hk = history_of(&nk, conf_store, kk);
    assert_int_equal(nk, 1);
    check_entry(&hk[0], &tkg, LEASE_ENDED_HELD, 0, 0);
    ko.renew_every_ms = 300;
    CHECK_RC(0, lease_keeper_start(&keeper, conf_store, &kg, &ko));

    /* Make sure the old connection is in use before the restart. */
    CHECK_FAIL(LEASE_ENOTFOUND, lease_inspect(&info, conf_store, key));
    server("restart");
    o = conf_opts(a, 30000, NULL, 20000);
    t = conf_now_ms();
    lease_error_clear();
    rc = lease_acquire(&g, NULL, conf_store, key, &o);
    printf("# waiting acquire right after the restart: %s after %" PRId64 " ms\n",
           lease_error_name(rc), conf_now_ms() - t);
    CHECK_RC(0, rc);
    t_up = wall_ms();
    CHECK_RC(0, lease_release(conf_store, &g));
    /* The grant made right after the restart, and its release. */
    h = history_of(&n, conf_store, key);
    assert_int_equal(n, 1);
    ASSERT_U64_OP(h[0].token, ==, g.token);
    assert_string_equal(h[0].owner, a);
    assert_string_equal(h[0].label, "");
    ASSERT_U64_OP(h[0].ttl_ms, ==, 30000);
    assert_int_equal(h[0].ended, LEASE_ENDED_RELEASED);
    ASSERT_I64_OP(h[0].acquired_ms, <=, t_up);
    ASSERT_I64_OP(h[0].ended_ms, >=, t_up);
    ASSERT_I64_OP(h[0].ended_ms, <=, wall_ms());
    lease_history_free(h);

    /* The keeper renewed through it (its ttl is 10 s, the outage about 1). */
    t = conf_now_ms();
    while (conf_now_ms() - t < 1500)
        conf_sleep_ms(50);
    assert_int_equal(lease_keeper_state_get(keeper), LEASE_KEEPER_HELD);
    assert_int_equal(lease_keeper_valid(keeper), 1);
    ASSERT_U64_OP(lease_keeper_token(keeper), ==, kg.token);
    CHECK_RC(0, lease_inspect(&info, conf_store, kk));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.owner, k);
    ASSERT_U64_OP(info.token, ==, kg.token);
    /* Its entry: the same, still held (renewals change no entry). */
    h = history_of(&n, conf_store, kk);
    check_same(h, n, hk, nk, "history of the kept key after the restart");
    lease_history_free(h);
    t_rel = wall_ms();
    CHECK_RC(0, lease_keeper_stop(&last, keeper, 1));
    ASSERT_U64_OP(last.token, ==, kg.token);
    h = history_of(&n, conf_store, kk);
    assert_int_equal(n, 1);
    check_entry(&h[0], &tkg, LEASE_ENDED_RELEASED, t_rel, wall_ms());
    lease_history_free(h);
    lease_history_free(hk);
}

/* Sessions of other processes idle after a LISTEN (the store's waiters),
 * or after the announcement a waiter sends once listening (a lease table
 * with waiting_until). */
static long long listeners(PGconn *c)
{
    PGresult *r = PQexec(c, "SELECT count(*) FROM pg_stat_activity "
                            "WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid() AND state = 'idle' "
                            "AND (query ILIKE 'LISTEN%' "
                            "OR query LIKE '%SET waiting_until = greatest(%')");
    long long n = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1
                      ? atoll(PQgetvalue(r, 0, 0)) : -1;

    PQclear(r);
    return n;
}

/*
 * The server restarts while an acquire waits for a held key: "while
 * waiting, a store failure is retried like a busy key (the store may be
 * restarting)" (src/core/lease.c), so the waiter gets the key once the holder's
 * ttl (3 s) has run out, well within its 20 s wait.
 */
static void test_restart_during_wait(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    int fds[2], st;
    lease_grant held;
    timed_grant th;
    lease_history_entry *h;
    size_t n;
    pg_rec got;
    PGconn *c;
    pid_t pid;
    int64_t t;
    long long base;

    (void)state;
    conf_key(key, "restart/during-wait");
    conf_owner(a);
    th = timed_acquire(key, a, 3000, "holder");
    held = th.g;
    c = raw_connect(conf_url);
    base = listeners(c);
    conf_pipe(fds);
    conf_store_close();
    pid = conf_fork();
    if (pid == 0) {
        char w[LEASE_OWNER_BUFSZ];
        lease_store *s;
        lease_acquire_opts o;
        lease_grant g;
        int rc;

        close(fds[0]);
        if (lease_store_open_timeout(&s, conf_url, 2000) != 0 ||
            lease_owner_new(w) != 0) {
            pg_send(fds[1], 1, -100, 0, NULL);
            _exit(10);
        }
        o = conf_opts(w, 30000, "waiter", 20000);
        /* Long pauses, so that it sits in its LISTEN (each pause is cut
         * to the holder's remaining time anyway). */
        o.backoff_min_ms = 20000;
        o.backoff_max_ms = 20000;
        memset(&g, 0, sizeof(g));
        rc = lease_acquire(&g, NULL, s, key, &o);
        /* Its owner on success (for the history), else the message. */
        pg_send(fds[1], 1, rc, rc == 0 ? g.token : 0, rc == 0 ? w : lease_errmsg());
        lease_store_close(s);
        _exit(0);
    }
    close(fds[1]);
    conf_store_open();
    t = conf_now_ms();
    while (listeners(c) <= base && conf_now_ms() - t < 5000)
        conf_sleep_ms(10);
    PQfinish(c);
    printf("# the waiter listens after %" PRId64 " ms; restarting\n",
           conf_now_ms() - t);
    server("restart");
    got = pg_recv(fds[0], 40000, "waiter's result");
    st = conf_reap(pid, 10000);
    close(fds[0]);
    printf("# the waiter (wait 20 s) across the restart: %s after %" PRId64
           " ms%s%s\n", lease_error_name(got.rc), got.t_ms - t,
           got.rc ? ": " : "", got.rc ? got.text : "");
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (got.rc != 0)
        fail_msg("a waiting acquire ended with %s when the server restarted "
                 "during its wait", lease_error_name(got.rc));
    ASSERT_U64_OP(got.value, >, held.token);

    /* The holder's grant, held across the restart, ran out after it: the
     * waiter's grant found it expired at its lease_until, and is recorded
     * above it (still held: the child left without releasing). */
    h = history_after_restart(&n, key);
    assert_int_equal(n, 2);
    ASSERT_U64_OP(h[0].token, ==, got.value);
    assert_string_equal(h[0].owner, got.text);
    assert_string_equal(h[0].label, "waiter");
    ASSERT_U64_OP(h[0].ttl_ms, ==, 30000);
    assert_int_equal(h[0].ended, LEASE_ENDED_HELD);
    ASSERT_I64_OP(h[0].acquired_ms, >=, h[1].ended_ms);
    check_expiry(&h[1], &th, LEASE_ENDED_EXPIRED);
    lease_history_free(h);
}

/*
 * Every ending survives the crash-restart. On one key: released, expired
 * (found by the next grant), lost (a renew refused after the expiry) and
 * held (a label with quotes, a backslash and UTF-8), read after the
 * restart through the handle from before it: the same entries, field by
 * field. Two grants of 300 ms are held when the server goes down; their
 * ttl runs out across the restart: one reads expired at its lease_until,
 * the other's holder comes back, is refused, and reads lost at the same
 * time. The holder of the first key releases after the restart, and the
 * next grant is recorded above, with a greater token.
 */
static void test_restart_history_endings(void **state)
{
    static const char odd[] = "held \"q\" 'x' \\ caf\xc3\xa9 %_;";
    char key[LEASE_KEY_MAX + 1], down[LEASE_KEY_MAX + 1], late[LEASE_KEY_MAX + 1];
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ], c[LEASE_OWNER_BUFSZ],
        d[LEASE_OWNER_BUFSZ], e[LEASE_OWNER_BUFSZ], f[LEASE_OWNER_BUFSZ];
    timed_grant ta, tb, tc, td, tdown, tlate, tnext;
    lease_history_entry *before, *h;
    size_t nbefore, n;
    int64_t rel0, rel1, t_up, t_rel;
    int rc;

    (void)state;
    conf_key(key, "restart/history/endings");
    conf_key(down, "restart/history/down");
    conf_key(late, "restart/history/late");
    conf_owner(a);
    conf_owner(b);
    conf_owner(c);
    conf_owner(d);
    conf_owner(e);
    conf_owner(f);
    CHECK_RC(0, lease_store_set_timeout(conf_store, 2000));

    ta = timed_acquire(key, a, 30000, "released");
    rel0 = wall_ms();
    CHECK_RC(0, lease_release(conf_store, &ta.g));
    rel1 = wall_ms();
    tb = timed_acquire(key, b, 300, "expired");
    conf_wait_free(key, 300);
    tc = timed_acquire(key, c, 300, "lost");
    conf_wait_free(key, 300);
    CHECK_FAIL(LEASE_ELOST, lease_renew(&tc.g, conf_store, 0));
    td = timed_acquire(key, d, 120000, odd);
    tdown = timed_acquire(down, e, 300, "down");
    tlate = timed_acquire(late, f, 300, "late");

    before = history_of(&nbefore, conf_store, key);
    assert_int_equal(nbefore, 4);
    check_entry(&before[0], &td, LEASE_ENDED_HELD, 0, 0);
    check_expiry(&before[1], &tc, LEASE_ENDED_LOST);
    check_expiry(&before[2], &tb, LEASE_ENDED_EXPIRED);
    check_entry(&before[3], &ta, LEASE_ENDED_RELEASED, rel0, rel1);

    server("restart");

    h = history_after_restart(&n, key);
    t_up = wall_ms();
    check_same(h, n, before, nbefore, "history after the restart");
    lease_history_free(h);

    /* Held at the crash, expired since (a bounded wait: the restart may
     * have been quicker than 300 ms). */
    conf_wait_free(down, 300);
    h = history_of(&n, conf_store, down);
    assert_int_equal(n, 1);
    check_expiry(&h[0], &tdown, LEASE_ENDED_EXPIRED);
    lease_history_free(h);

    /* Held at the crash; its holder's renew after the restart is refused. */
    conf_wait_free(late, 300);
    CHECK_FAIL(LEASE_ELOST, lease_renew(&tlate.g, conf_store, 0));
    h = history_of(&n, conf_store, late);
    assert_int_equal(n, 1);
    check_expiry(&h[0], &tlate, LEASE_ENDED_LOST);
    lease_history_free(h);
    /* The reference release still accepts the owner of an expired lease
     * nobody took; the grant stays lost, with its time. */
    rc = lease_release(conf_store, &tlate.g);
    if (rc != 0 && rc != LEASE_ELOST)
        fail_msg("release after the refused renew: %s (%s)", lease_error_name(rc),
                 lease_errmsg());
    h = history_of(&n, conf_store, late);
    assert_int_equal(n, 1);
    check_expiry(&h[0], &tlate, LEASE_ENDED_LOST);
    lease_history_free(h);

    /* The holder from before the restart renews and releases; the next
     * grant goes above, the older entries unchanged. */
    CHECK_RC(0, lease_renew(&td.g, conf_store, 0));
    t_rel = wall_ms();
    CHECK_RC(0, lease_release(conf_store, &td.g));
    tnext = timed_acquire(key, a, 30000, "after the restart");
    ASSERT_U64_OP(tnext.g.token, >, td.g.token);
    h = history_of(&n, conf_store, key);
    assert_int_equal(n, 5);
    check_entry(&h[0], &tnext, LEASE_ENDED_HELD, 0, 0);
    check_entry(&h[1], &td, LEASE_ENDED_RELEASED, t_rel, tnext.t0);
    ASSERT_I64_OP(h[1].ended_ms, >=, t_up);
    check_same(h + 2, 3, before + 1, 3, "history after the restart, the ended grants");
    lease_history_free(h);
    lease_history_free(before);
    CHECK_RC(0, lease_release(conf_store, &tnext.g));
}

/* ======================================================================
 * unreachable
 * ====================================================================== */

/* The URL with its port replaced by `port` (every host of a list). */
static char *with_port(const char *url, const char *port, int hosts)
{
    const char *at = strchr(url, '@'), *hp = at ? at + 1 : strstr(url, "://") + 3;
    const char *colon = strchr(hp, ':'), *rest = hp + strcspn(hp, "/?");
    char *out = malloc(strlen(url) + 64 * (size_t)hosts);
    char *o = out;
    int i;

    if (out == NULL || colon == NULL || colon > rest)
        fail_msg("cannot rewrite the URL's port");
    memcpy(o, url, (size_t)(hp - url));
    o += hp - url;
    for (i = 0; i < hosts; i++)
        o += sprintf(o, "%s%.*s:%s", i ? "," : "", (int)(colon - hp), hp, port);
    strcpy(o, rest);
    return out;
}

#define CHECK_ESTORE(call)                                                    \
    do {                                                                      \
        int64_t t_ = conf_now_ms();                                           \
        CHECK_FAIL(LEASE_ESTORE, call);                                       \
        printf("#   %-58s ESTORE after %5" PRId64 " ms\n", #call,             \
               conf_now_ms() - t_);                                           \
        ASSERT_NO_SECRET(lease_errmsg(), password);                           \
    } while (0)

static void test_unreachable_closed_port(void **state)
{
    char *u1 = with_port(conf_url, closed_port, 1);
    char *u2 = with_port(conf_url, closed_port, 2);
    char *u3 = url_with(u2, "target_session_attrs=read-write");
    lease_store *s = NULL;

    (void)state;
    printf("# a loopback port nobody listens on (%s):\n", closed_port);
    CHECK_ESTORE(lease_store_open(&s, u1));
    assert_null(s);
    printf("#   message: %s\n", lease_errmsg());
    assert_non_null(strstr(lease_errmsg(), "***"));
    CHECK_ESTORE(lease_store_open_timeout(&s, u1, 500));
    CHECK_ESTORE(lease_store_open(&s, u3));
    assert_null(s);
    free(u1);
    free(u2);
    free(u3);
}

static int never_cb(void *native, void *payload)
{
    (void)native;
    ++*(int *)payload;
    return 0;
}

static void test_unreachable_server_stopped(void **state)
{
    char key[LEASE_KEY_MAX + 1], other[LEASE_KEY_MAX + 1];
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_acquire_opts ob, ow, oa;
    lease_grant g, g2;
    lease_info info, *list;
    lease_store *s2 = NULL;
    uint64_t mark;
    void *val;
    size_t len, n;
    int calls = 0;

    (void)state;
    conf_key(key, "gone/held");
    conf_key(other, "gone/free");
    conf_owner(a);
    conf_owner(b);
    CHECK_RC(0, lease_store_set_timeout(conf_store, 1000));
    g = conf_acquire(key, a, 60000, NULL);
    CHECK_RC(0, lease_guarded_put(conf_store, &g, key, "x", 1));

    server("stop");
    printf("# the server was stopped under an open handle:\n");
    ob = conf_opts(b, 60000, NULL, 0);
    ow = conf_opts(b, 60000, NULL, 1500);
    oa = conf_opts(a, 60000, NULL, 0);
    /* The key is held by a, but the store cannot say so: not EBUSY. */
    CHECK_ESTORE(lease_acquire(&g2, NULL, conf_store, key, &ob));
    printf("#   message: %s\n", lease_errmsg());
    CHECK_ESTORE(lease_acquire(&g2, NULL, conf_store, key, &ow));
    CHECK_ESTORE(lease_acquire(&g2, NULL, conf_store, key, &oa));
    CHECK_ESTORE(lease_acquire(&g2, NULL, conf_store, other, &ob));
    CHECK_ESTORE(lease_renew(&g, conf_store, 0));
    CHECK_ESTORE(lease_inspect(&info, conf_store, key));
    CHECK_ESTORE(lease_list(&list, &n, conf_store, ""));
    CHECK_ESTORE(lease_release(conf_store, &g));
    CHECK_ESTORE(lease_fence_advance(&mark, conf_store, key, 5));
    CHECK_ESTORE(lease_fence_mark(&mark, conf_store, key));
    CHECK_ESTORE(lease_guarded_put(conf_store, &g, key, "y", 1));
    CHECK_ESTORE(lease_data_get(&val, &len, NULL, conf_store, key));
    CHECK_ESTORE(lease_guarded_txn(conf_store, &g, never_cb, &calls));
    CHECK_ESTORE(lease_advisory_txn(conf_store, key, 1, never_cb, &calls));
    CHECK_ESTORE(lease_advisory_txn(conf_store, key, 0, never_cb, &calls));
    assert_int_equal(calls, 0);
    CHECK_ESTORE(lease_store_open(&s2, conf_url));
    assert_null(s2);
    /* Still ESTORE the second time round (a reconnect attempt each call). */
    CHECK_ESTORE(lease_acquire(&g2, NULL, conf_store, key, &ob));
    CHECK_ESTORE(lease_inspect(&info, conf_store, key));
}

/* ---- a server that does not answer (SIGSTOP) ------------------------- */

static pid_t frozen[64];
static size_t nfrozen;

/* Stop (SIGSTOP) this test's own server: its postmaster and every child
 * of it, found by pid (DIR/data/postmaster.pid, /proc/PID/task/PID/children). */
static void freeze_server(void)
{
    char path[4096], buf[4096];
    FILE *f;
    pid_t pm = 0;
    char *p, *endp;

    snprintf(path, sizeof(path), "%s/data/postmaster.pid", srv_dir);
    if ((f = fopen(path, "r")) == NULL || fscanf(f, "%d", &pm) != 1 || pm <= 0)
        fail_msg("cannot read %s", path);
    fclose(f);
    nfrozen = 0;
    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)pm, (int)pm);
    buf[0] = '\0';
    if ((f = fopen(path, "r")) != NULL) {
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    if (kill(pm, SIGSTOP) != 0)
        fail_msg("SIGSTOP %d: %s", (int)pm, strerror(errno));
    frozen[nfrozen++] = pm;
    for (p = buf; *p && nfrozen < sizeof(frozen) / sizeof(frozen[0]); p = endp) {
        long child = strtol(p, &endp, 10);
        if (endp == p)
            break;
        if (child > 0 && kill((pid_t)child, SIGSTOP) == 0)
            frozen[nfrozen++] = (pid_t)child;
    }
    printf("# froze the server: postmaster %d and %zu children\n", (int)pm,
           nfrozen - 1);
}

static void thaw_server(void)
{
    size_t i;

    for (i = 0; i < nfrozen; i++)
        kill(frozen[i], SIGCONT);
    nfrozen = 0;
}

static int thaw_teardown(void **state)
{
    thaw_server();
    return conf_teardown(state);
}

/* A server that accepts nothing and answers nothing: every call ends
 * with ESTORE (never EBUSY, never a hang), and the handle works again
 * once the server does. Durations are printed against the handle's
 * timeout (1000 ms). */
static void test_unreachable_server_frozen(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_acquire_opts ob;
    lease_grant g, g2;
    lease_info info;
    int64_t t, end;
    int rc = -1;

    (void)state;
    conf_key(key, "frozen/held");
    conf_owner(a);
    conf_owner(b);
    CHECK_RC(0, lease_store_set_timeout(conf_store, 1000));
    g = conf_acquire(key, a, 60000, NULL);
    ob = conf_opts(b, 60000, NULL, 0);

    freeze_server();
    printf("# the server is frozen (SIGSTOP); handle timeout 1000 ms:\n");
    CHECK_ESTORE(lease_acquire(&g2, NULL, conf_store, key, &ob));
    printf("#   message: %s\n", lease_errmsg());
    CHECK_ESTORE(lease_renew(&g, conf_store, 0));
    CHECK_ESTORE(lease_inspect(&info, conf_store, key));
    {
        lease_store *s2 = NULL;
        CHECK_ESTORE(lease_store_open_timeout(&s2, conf_url, 500));
        assert_null(s2);
    }
    thaw_server();

    t = conf_now_ms();
    end = t + 30000;
    while (conf_now_ms() < end && (rc = lease_inspect(&info, conf_store, key)) != 0) {
        if (rc != LEASE_ESTORE)
            fail_msg("inspect after the thaw: %s (%s)", lease_error_name(rc),
                     lease_errmsg());
        conf_sleep_ms(100);
    }
    printf("#   after SIGCONT the handle works again in %" PRId64 " ms\n",
           conf_now_ms() - t);
    CHECK_RC(0, rc);
    assert_string_equal(info.owner, a);
    ASSERT_U64_OP(info.token, ==, g.token);
    CHECK_RC(0, lease_renew(&g, conf_store, 0));
    CHECK_RC(0, lease_release(conf_store, &g));
}

int main(int argc, char **argv)
{
    static const struct CMUnitTest restart[] = {
        CONF_TEST(test_restart_lease_and_counter_survive),
        CONF_TEST(test_restart_waiting_acquire_and_keeper),
        CONF_TEST(test_restart_during_wait),
        CONF_TEST(test_restart_history_endings),
    };
    static const struct CMUnitTest unreachable[] = {
        CONF_TEST(test_unreachable_closed_port),
        cmocka_unit_test_setup_teardown(test_unreachable_server_frozen, conf_setup,
                                        thaw_teardown),
        CONF_TEST(test_unreachable_server_stopped),
    };
    char *args[2];
    const char *mode = argc > 1 ? argv[1] : "";
    int rc;

    srv_script = getenv("PG_SERVER");
    srv_dir = getenv("PG_TEST_DIR");
    closed_port = getenv("PG_CLOSED_PORT");
    args[0] = argv[0];
    args[1] = getenv("PG_TEST_URL");
    if (!srv_script || !srv_dir || !closed_port || !args[1] || !args[1][0]) {
        fprintf(stderr, "%s: run me through tests/pg/with-server.sh\n", argv[0]);
        return 1;
    }
    if (strcmp(mode, "restart") != 0 && strcmp(mode, "unreachable") != 0) {
        fprintf(stderr, "usage: %s restart|unreachable\n", argv[0]);
        return 2;
    }
    password = url_password(args[1]);
    if (conf_init(2, args, "faults") != 0)
        return 1;
    if (strcmp(mode, "restart") == 0)
        rc = cmocka_run_group_tests_name("postgres restart", restart, NULL, NULL);
    else
        rc = cmocka_run_group_tests_name("postgres unreachable", unreachable,
                                         NULL, NULL);
    conf_store_close();
    free(password);
    return rc;
}
