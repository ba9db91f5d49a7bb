/*
 * history.c - the grant history (lease/history.h) against a real store:
 * every grant recorded with its token, owner, label and time, and how it
 * ended (released, expired, lost, or still held), newest first and bounded.
 *
 *     lease_history_test URL      or    LEASE_TEST_STORE=URL lease_history_test
 *
 * Public API only, so it runs unchanged against every store.
 */
#include "conf_util.h"

/* Stores on this host (tests use loopback servers) share its wall clock;
 * the slack covers rounding to whole milliseconds and slow machines. */
#define WALL_SLACK_MS 2000

static int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static lease_history_entry *read_history(size_t *n, const char *key, size_t max)
{
    lease_history_entry *h = NULL;

    *n = 0;
    CHECK_RC(0, lease_history(&h, n, conf_store, key, max));
    if (*n > 0)
        assert_non_null(h);
    else
        assert_null(h);
    return h;
}

static void check_entry(const lease_history_entry *e, const lease_grant *g,
                        lease_ended ended, int64_t before_ms, int64_t after_ms)
{
    if (e->ended != ended)
        fail_msg("token %" PRIu64 " ended '%s', expected '%s'", e->token,
                 lease_ended_name(e->ended), lease_ended_name(ended));
    ASSERT_U64_OP(e->token, ==, g->token);
    assert_string_equal(e->owner, g->owner);
    assert_string_equal(e->label, g->label);
    ASSERT_U64_OP(e->ttl_ms, ==, g->ttl_ms);
    ASSERT_I64_OP(e->acquired_ms, >=, before_ms - WALL_SLACK_MS);
    ASSERT_I64_OP(e->acquired_ms, <=, after_ms + WALL_SLACK_MS);
    if (ended == LEASE_ENDED_HELD)
        ASSERT_I64_OP(e->ended_ms, ==, 0);
    else if (e->ended_ms != 0)
        ASSERT_I64_OP(e->ended_ms, >=, e->acquired_ms);
}

/* A key never acquired has an empty history, not an error. */
static void test_history_empty(void **state)
{
    char key[LEASE_KEY_MAX + 1];
    size_t n;

    (void)state;
    conf_key(key, "never");
    read_history(&n, key, 0);
    assert_int_equal(n, 0);
}

/*
 * The four endings, newest first: A released; B stopped renewing, its ttl
 * ran out and C took the key (expired); C's renew came after its own
 * expiry and was refused (lost); D holds the key now (held).
 */
static void test_history_endings(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ],
        c[LEASE_OWNER_BUFSZ], d[LEASE_OWNER_BUFSZ];
    int64_t t[5], released_at, lost_at;
    int rc;
    lease_grant ga, gb, gc, gd;
    lease_history_entry *h;
    size_t n;

    (void)state;
    conf_key(key, "endings");
    conf_owner(a);
    conf_owner(b);
    conf_owner(c);
    conf_owner(d);

    t[0] = wall_ms();
    ga = conf_acquire(key, a, 30000, "alpha");
    t[1] = wall_ms();
    CHECK_RC(0, lease_release(conf_store, &ga));
    released_at = wall_ms();

    gb = conf_acquire(key, b, 300, "beta");
    conf_wait_free(key, gb.ttl_ms);
    t[2] = wall_ms();
    gc = conf_acquire(key, c, 300, "gamma");
    conf_wait_free(key, gc.ttl_ms);
    /* The refused renew comes well after the expiry, so that the two
     * times can be told apart below. */
    conf_sleep_ms(1500);
    CHECK_FAIL(LEASE_ELOST, lease_renew(&gc, conf_store, 0));
    lost_at = wall_ms();
    /* Some stores let the owner of an expired lease that nobody took
     * release it (the reference release does); either way the grant stays
     * lost: its authority had ended before. */
    rc = lease_release(conf_store, &gc);
    if (rc != 0 && rc != LEASE_ELOST)
        fail_msg("release after the refused renew: %s (%s)", lease_error_name(rc),
                 lease_errmsg());

    t[3] = wall_ms();
    gd = conf_acquire(key, d, 60000, "delta");
    t[4] = wall_ms();
    ASSERT_U64_OP(ga.token, <, gb.token);
    ASSERT_U64_OP(gb.token, <, gc.token);
    ASSERT_U64_OP(gc.token, <, gd.token);

    h = read_history(&n, key, 0);
    assert_int_equal(n, 4);
    check_entry(&h[0], &gd, LEASE_ENDED_HELD, t[3], t[4]);
    check_entry(&h[1], &gc, LEASE_ENDED_LOST, t[2], lost_at);
    check_entry(&h[2], &gb, LEASE_ENDED_EXPIRED, t[1], t[2]);
    check_entry(&h[3], &ga, LEASE_ENDED_RELEASED, t[0], t[1]);
    /* Released and lost are times the store knows. */
    ASSERT_I64_OP(h[3].ended_ms, >=, t[1] - WALL_SLACK_MS);
    ASSERT_I64_OP(h[3].ended_ms, <=, released_at + WALL_SLACK_MS);
    ASSERT_I64_OP(h[1].ended_ms, >, 0);
    ASSERT_I64_OP(h[1].ended_ms, <=, lost_at + WALL_SLACK_MS);
    /* An expiry, when the store can tell it, is before the next grant. */
    if (h[2].ended_ms != 0)
        ASSERT_I64_OP(h[2].ended_ms, <=, h[1].acquired_ms + WALL_SLACK_MS);
    /* Every store but etcd (whose leases leave no record of their end)
     * dates expired and lost grants by when the lease expired, not by
     * when someone found out. */
    if (strcmp(lease_store_scheme(conf_store), "etcd") != 0) {
        ASSERT_I64_OP(h[2].ended_ms, >, 0);
        ASSERT_I64_OP(h[2].ended_ms, <=, h[2].acquired_ms + (int64_t)h[2].ttl_ms + 1000);
        ASSERT_I64_OP(h[1].ended_ms, <=, h[1].acquired_ms + (int64_t)h[1].ttl_ms + 1000);
    }
    lease_history_free(h);

    /* max bounds the answer, newest first. */
    h = read_history(&n, key, 2);
    assert_int_equal(n, 2);
    ASSERT_U64_OP(h[0].token, ==, gd.token);
    ASSERT_U64_OP(h[1].token, ==, gc.token);
    lease_history_free(h);

    /* Releasing D ends the last entry. */
    CHECK_RC(0, lease_release(conf_store, &gd));
    h = read_history(&n, key, 1);
    assert_int_equal(n, 1);
    check_entry(&h[0], &gd, LEASE_ENDED_RELEASED, t[3], t[4]);
    lease_history_free(h);
}

/* A holder that paused past its ttl while another owner took the key:
 * its refused renew turns "expired" into "lost" (it was alive, and found
 * out), and the new owner's grant stays held. */
static void test_history_lost_after_takeover(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_grant ga, gb;
    lease_history_entry *h;
    size_t n;

    (void)state;
    conf_key(key, "takeover");
    conf_owner(a);
    conf_owner(b);
    ga = conf_acquire(key, a, 300, "paused");
    conf_wait_free(key, ga.ttl_ms);
    gb = conf_acquire(key, b, 60000, "successor");

    h = read_history(&n, key, 0);
    assert_int_equal(n, 2);
    assert_int_equal(h[0].ended, LEASE_ENDED_HELD);
    assert_int_equal(h[1].ended, LEASE_ENDED_EXPIRED);
    lease_history_free(h);

    CHECK_FAIL(LEASE_ELOST, lease_renew(&ga, conf_store, 0));
    h = read_history(&n, key, 0);
    assert_int_equal(n, 2);
    ASSERT_U64_OP(h[0].token, ==, gb.token);
    assert_int_equal(h[0].ended, LEASE_ENDED_HELD);
    ASSERT_U64_OP(h[1].token, ==, ga.token);
    assert_string_equal(h[1].owner, a);
    assert_int_equal(h[1].ended, LEASE_ENDED_LOST);
    lease_history_free(h);

    /* A release refused to the stale holder changes nothing either. */
    CHECK_FAIL(LEASE_ELOST, lease_release(conf_store, &ga));
    h = read_history(&n, key, 0);
    assert_int_equal(n, 2);
    assert_int_equal(h[0].ended, LEASE_ENDED_HELD);
    assert_int_equal(h[1].ended, LEASE_ENDED_LOST);
    lease_history_free(h);
    CHECK_RC(0, lease_release(conf_store, &gb));
}

static void on_lost(lease_keeper *k, int reason, void *payload)
{
    (void)k;
    *(volatile int *)payload = reason;
}

/* A keeper whose renew the store refuses (its lease ran out and another
 * owner took the key, while its own clock still gave it time) reports the
 * loss, and the grant reads lost once the keeper has stopped. */
static void test_history_keeper_loss(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_keeper_opts ko = LEASE_KEEPER_OPTS_INIT;
    volatile int reason = 0;
    lease_keeper *k = NULL;
    lease_history_entry *h;
    lease_grant ga, gb;
    int64_t end;
    size_t n;

    (void)state;
    conf_key(key, "keeper");
    conf_owner(a);
    conf_owner(b);
    ga = conf_acquire(key, a, 300, "kept");
    conf_wait_free(key, ga.ttl_ms);
    gb = conf_acquire(key, b, 60000, "successor");
    /* A holder whose local deadline is still ahead (a clock that ran
     * slow): only the store can tell it that it lost. */
    ga.deadline_ns = lease_clock_ns() + (int64_t)60000 * 1000000;
    ga.ttl_ms = 60000;
    ko.on_lost = on_lost;
    ko.payload = (void *)&reason;
    ko.renew_every_ms = 100;
    CHECK_RC(0, lease_keeper_start(&k, conf_store, &ga, &ko));
    end = conf_now_ms() + 10000;
    while (reason == 0 && conf_now_ms() < end)
        conf_sleep_ms(10);
    assert_int_equal(reason, LEASE_ELOST);
    CHECK_RC(0, lease_keeper_stop(NULL, k, 1));

    h = read_history(&n, key, 0);
    assert_int_equal(n, 2);
    ASSERT_U64_OP(h[0].token, ==, gb.token);
    assert_int_equal(h[0].ended, LEASE_ENDED_HELD);
    ASSERT_U64_OP(h[1].token, ==, ga.token);
    assert_int_equal(h[1].ended, LEASE_ENDED_LOST);
    lease_history_free(h);
    CHECK_RC(0, lease_release(conf_store, &gb));
}

/* Renewals and a retried acquire by the holder keep one grant: one entry. */
static void test_history_one_entry_per_grant(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_grant g, again;
    lease_history_entry *h;
    size_t n;
    int i;

    (void)state;
    conf_key(key, "one");
    conf_owner(a);
    g = conf_acquire(key, a, 30000, "once");
    for (i = 0; i < 3; i++)
        CHECK_RC(0, lease_renew(&g, conf_store, 0));
    o = conf_opts(a, 30000, "once", 0);
    CHECK_RC(0, lease_acquire(&again, NULL, conf_store, key, &o));
    ASSERT_U64_OP(again.token, ==, g.token);
    h = read_history(&n, key, 0);
    assert_int_equal(n, 1);
    ASSERT_U64_OP(h[0].token, ==, g.token);
    assert_int_equal(h[0].ended, LEASE_ENDED_HELD);
    lease_history_free(h);
    CHECK_RC(0, lease_release(conf_store, &g));
}

/* Keys are separate histories, also when one key is a prefix of another,
 * and labels come back byte for byte. */
static void test_history_keys_apart(void **state)
{
    static const char label[] = "multi\nline \"q\" '%_\\; \xff\xfe \xc3\xa9";
    char k1[LEASE_KEY_MAX + 1], k2[LEASE_KEY_MAX + 1], k3[LEASE_KEY_MAX + 1],
        a[LEASE_OWNER_BUFSZ];
    lease_grant g1, g2, g3;
    lease_history_entry *h;
    size_t n;

    (void)state;
    conf_key(k1, "apart");
    conf_key(k2, "apart/child");
    conf_key(k3, "apart\xff");
    conf_owner(a);
    g1 = conf_acquire(k1, a, 30000, label);
    g2 = conf_acquire(k2, a, 30000, "child");
    CHECK_RC(0, lease_release(conf_store, &g2));
    g2 = conf_acquire(k2, a, 30000, "child again");
    g3 = conf_acquire(k3, a, 30000, "");

    h = read_history(&n, k1, 0);
    assert_int_equal(n, 1);
    ASSERT_U64_OP(h[0].token, ==, g1.token);
    assert_string_equal(h[0].label, label);
    lease_history_free(h);
    h = read_history(&n, k2, 0);
    assert_int_equal(n, 2);
    assert_string_equal(h[0].label, "child again");
    assert_string_equal(h[1].label, "child");
    assert_int_equal(h[1].ended, LEASE_ENDED_RELEASED);
    lease_history_free(h);
    h = read_history(&n, k3, 0);
    assert_int_equal(n, 1);
    assert_string_equal(h[0].label, "");
    lease_history_free(h);
    CHECK_RC(0, lease_release(conf_store, &g1));
    CHECK_RC(0, lease_release(conf_store, &g2));
    CHECK_RC(0, lease_release(conf_store, &g3));
}

/* The history is bounded: after KEEP + 30 grants the newest KEEP are all
 * there, in order, and the first grants are gone. */
static void test_history_bounded(void **state)
{
    enum { GRANTS = LEASE_HISTORY_KEEP + 30 };
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    uint64_t tokens[GRANTS];
    lease_history_entry *h;
    lease_grant g;
    size_t n, i;

    (void)state;
    conf_key(key, "bounded");
    conf_owner(a);
    for (i = 0; i < GRANTS; i++) {
        g = conf_acquire(key, a, 30000, "cycle");
        tokens[i] = g.token;
        CHECK_RC(0, lease_release(conf_store, &g));
    }
    h = read_history(&n, key, 0);
    ASSERT_U64_OP(n, >=, LEASE_HISTORY_KEEP);
    /* "a few more in between": never the whole run. */
    ASSERT_U64_OP(n, <, GRANTS);
    for (i = 0; i < n; i++) {
        ASSERT_U64_OP(h[i].token, ==, tokens[GRANTS - 1 - i]);
        assert_int_equal(h[i].ended, LEASE_ENDED_RELEASED);
    }
    lease_history_free(h);
}

/* Bad arguments are refused with EINVALID and a message. */
static void test_history_bad_input(void **state)
{
    char key[LEASE_KEY_MAX + 1], big[LEASE_KEY_MAX + 2];
    lease_history_entry *h = NULL;
    size_t n = 7;

    (void)state;
    conf_key(key, "bad");
    memset(big, 'k', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    CHECK_FAIL(LEASE_EINVALID, lease_history(NULL, &n, conf_store, key, 0));
    CHECK_FAIL(LEASE_EINVALID, lease_history(&h, NULL, conf_store, key, 0));
    CHECK_FAIL(LEASE_EINVALID, lease_history(&h, &n, NULL, key, 0));
    CHECK_FAIL(LEASE_EINVALID, lease_history(&h, &n, conf_store, NULL, 0));
    CHECK_FAIL(LEASE_EINVALID, lease_history(&h, &n, conf_store, "", 0));
    CHECK_FAIL(LEASE_EINVALID, lease_history(&h, &n, conf_store, big, 0));
    assert_null(h);
    assert_int_equal(n, 0);
    assert_string_equal(lease_ended_name(LEASE_ENDED_LOST), "lost");
    assert_string_equal(lease_ended_name((lease_ended)42), "unknown");
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        CONF_TEST(test_history_empty),
        CONF_TEST(test_history_endings),
        CONF_TEST(test_history_lost_after_takeover),
        CONF_TEST(test_history_keeper_loss),
        CONF_TEST(test_history_one_entry_per_grant),
        CONF_TEST(test_history_keys_apart),
        CONF_TEST(test_history_bounded),
        CONF_TEST(test_history_bad_input),
    };
    int failed;

    if (conf_init(argc, argv, "hist") != 0)
        return 2;
    failed = cmocka_run_group_tests_name("lease_history", tests, NULL, NULL);
    conf_store_close();
    return failed ? 1 : 0;
}
