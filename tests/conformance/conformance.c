/*
 * conformance.c - the store conformance suite: every row of the lease
 * contract (docs/contract.md), checked through the public API only, so that it
 * runs unchanged against every store (SQLite, PostgreSQL, Redis, etcd ...).
 *
 *     lease_conformance URL        or    LEASE_TEST_STORE=URL lease_conformance
 *
 * Every key lives under "conf/<random uuid>/", so runs on a persistent store
 * never meet. Waits are bounded; sleeping only lets a ttl pass. A store may
 * round a ttl up (etcd: whole seconds): expiry-dependent steps use the
 * granted ttl and poll the store instead of assuming when a lease ends.
 */
#include <pthread.h>

#include "conf_util.h"

/* ======================================================================
 * acquire
 * ====================================================================== */

/* Row "acquire": a free key gives a token >= 1; another owner gets EBUSY
 * with the holder's label, owner, token and remaining time. */
static void test_acquire_free_then_busy(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_acquire_opts ob;
    lease_grant g, g2;
    lease_info h;

    (void)state;
    conf_key(key, "acquire/busy");
    conf_owner(a);
    conf_owner(b);
    g = conf_acquire(key, a, 30000, "holder-a");
    ASSERT_U64_OP(g.token, >=, 1);
    ASSERT_I64_OP(g.deadline_ns, >, 0);

    ob = conf_opts(b, 30000, "holder-b", 0);
    memset(&h, 0, sizeof(h));
    CHECK_FAIL(LEASE_EBUSY, lease_acquire(&g2, &h, conf_store, key, &ob));
    assert_string_equal(h.owner, a);
    assert_string_equal(h.label, "holder-a");
    ASSERT_U64_OP(h.token, ==, g.token);
    assert_int_equal(h.held, 1);
    ASSERT_U64_OP(h.remaining_ms, >, 0);
    ASSERT_U64_OP(h.remaining_ms, <=, g.ttl_ms);

    /* holder may be NULL */
    CHECK_FAIL(LEASE_EBUSY, lease_acquire(&g2, NULL, conf_store, key, &ob));

    CHECK_RC(0, lease_release(conf_store, &g));
}

/* Row "acquire by the owner that already holds": same grant, same token. */
static void test_acquire_retry_same_owner(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    char upper[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_grant g, g2;
    lease_info info;
    size_t i;

    (void)state;
    conf_key(key, "acquire/retry");
    conf_owner(a);
    conf_owner(b);
    g = conf_acquire(key, a, 30000, "retry");

    o = conf_opts(a, 30000, "retry", 0);
    CHECK_RC(0, lease_acquire(&g2, NULL, conf_store, key, &o));
    ASSERT_U64_OP(g2.token, ==, g.token);
    assert_string_equal(g2.owner, a);
    assert_string_equal(g2.key, key);
    ASSERT_U64_OP(g2.ttl_ms, >=, 30000);

    /* The same owner written in upper case is the same owner. */
    for (i = 0; a[i]; i++)
        upper[i] = (char)(a[i] >= 'a' && a[i] <= 'f' ? a[i] - 'a' + 'A' : a[i]);
    upper[i] = '\0';
    o = conf_opts(upper, 30000, "retry", 0);
    CHECK_RC(0, lease_acquire(&g2, NULL, conf_store, key, &o));
    ASSERT_U64_OP(g2.token, ==, g.token);
    assert_string_equal(g2.owner, a);

    /* With a wait it is granted at once too. */
    o = conf_opts(a, 30000, "retry", 5000);
    CHECK_RC(0, lease_acquire(&g2, NULL, conf_store, key, &o));
    ASSERT_U64_OP(g2.token, ==, g.token);

    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.owner, a);
    ASSERT_U64_OP(info.token, ==, g.token);

    /* Still nobody else's. */
    o = conf_opts(b, 30000, NULL, 0);
    CHECK_FAIL(LEASE_EBUSY, lease_acquire(&g2, NULL, conf_store, key, &o));

    /* The retried grant releases the one lease. */
    CHECK_RC(0, lease_release(conf_store, &g));
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 0);
}

/* ======================================================================
 * renew
 * ====================================================================== */

/* Row "renew": same owner and token, unexpired → expiry moves on. */
static void test_renew_ok(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    lease_grant g;
    lease_info info;
    int64_t before;

    (void)state;
    conf_key(key, "renew/ok");
    conf_owner(a);
    g = conf_acquire(key, a, 30000, "renewer");

    before = g.deadline_ns;
    CHECK_RC(0, lease_renew(&g, conf_store, 0));
    ASSERT_I64_OP(g.deadline_ns, >, before);
    ASSERT_U64_OP(g.ttl_ms, >=, 30000);

    /* A longer ttl: the store's expiry moves past the first one. */
    before = g.deadline_ns;
    CHECK_RC(0, lease_renew(&g, conf_store, 120000));
    ASSERT_U64_OP(g.ttl_ms, >=, 120000);
    ASSERT_I64_OP(g.deadline_ns, >, before);

    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.owner, a);
    ASSERT_U64_OP(info.token, ==, g.token);
    ASSERT_U64_OP(info.remaining_ms, <=, g.ttl_ms);
    /* 30 s was the old ttl: only the renewal can put more than that on
     * the store's clock (the margin is the other 90 s). */
    ASSERT_U64_OP(info.remaining_ms, >, 30000);

    CHECK_RC(0, lease_release(conf_store, &g));
}

static void assert_unchanged(const char *key, const lease_grant *g)
{
    lease_info info;

    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.key, key);
    assert_string_equal(info.owner, g->owner);
    assert_string_equal(info.label, g->label);
    ASSERT_U64_OP(info.token, ==, g->token);
}

/* Row "renew", otherwise: a wrong owner gets ELOST and changes nothing. */
static void test_renew_wrong_owner(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_grant g, bad;

    (void)state;
    conf_key(key, "renew/wrong-owner");
    conf_owner(a);
    conf_owner(b);
    g = conf_acquire(key, a, 30000, "right");
    bad = g;
    memcpy(bad.owner, b, sizeof(bad.owner));
    CHECK_FAIL(LEASE_ELOST, lease_renew(&bad, conf_store, 0));
    assert_unchanged(key, &g);

    /* A key never acquired: nothing to renew. */
    conf_key(bad.key, "renew/never-acquired");
    memcpy(bad.owner, a, sizeof(bad.owner));
    CHECK_FAIL(LEASE_ELOST, lease_renew(&bad, conf_store, 0));
    CHECK_FAIL(LEASE_ENOTFOUND,
               lease_inspect(&(lease_info){ 0 }, conf_store, bad.key));

    CHECK_RC(0, lease_release(conf_store, &g));
}

/* Row "renew", otherwise: a wrong token gets ELOST and changes nothing. */
static void test_renew_wrong_token(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    lease_grant g, first, bad;

    (void)state;
    conf_key(key, "renew/wrong-token");
    conf_owner(a);
    /* Two generations, so that both an older and a newer token exist. */
    first = conf_acquire(key, a, 30000, "gen");
    CHECK_RC(0, lease_release(conf_store, &first));
    g = conf_acquire(key, a, 30000, "gen");
    ASSERT_U64_OP(g.token, >, first.token);

    bad = g;
    bad.token = g.token + 1;
    CHECK_FAIL(LEASE_ELOST, lease_renew(&bad, conf_store, 0));
    assert_unchanged(key, &g);
    /* The same owner's previous generation is not the lease either. */
    CHECK_FAIL(LEASE_ELOST, lease_renew(&first, conf_store, 0));
    assert_unchanged(key, &g);

    CHECK_RC(0, lease_release(conf_store, &g));
}

/* Row "renew", otherwise: an expired lease is never revived, even when
 * nobody else took the key. */
static void test_renew_after_expiry(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    lease_grant g, again;
    lease_info info;

    (void)state;
    conf_key(key, "renew/expired");
    conf_owner(a);
    g = conf_acquire(key, a, 200, "short");
    info = conf_wait_free(key, g.ttl_ms);
    ASSERT_U64_OP(info.token, ==, g.token);

    CHECK_FAIL(LEASE_ELOST, lease_renew(&g, conf_store, 0));
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 0);
    ASSERT_U64_OP(info.token, ==, g.token);

    /* The same owner acquiring again is a new generation, not a revival. */
    again = conf_acquire(key, a, 30000, "short");
    ASSERT_U64_OP(again.token, >, g.token);
    CHECK_FAIL(LEASE_ELOST, lease_renew(&g, conf_store, 0));
    CHECK_RC(0, lease_release(conf_store, &again));
}

/* ======================================================================
 * release
 * ====================================================================== */

/* Row "release": the lease ends now, the counter is kept; a second
 * release is ELOST. */
static void test_release_ok(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_grant g, g2;
    lease_info info;

    (void)state;
    conf_key(key, "release/ok");
    conf_owner(a);
    conf_owner(b);
    g = conf_acquire(key, a, 30000, "releaser");
    CHECK_RC(0, lease_release(conf_store, &g));

    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 0);
    ASSERT_U64_OP(info.token, ==, g.token);

    CHECK_FAIL(LEASE_ELOST, lease_release(conf_store, &g));
    CHECK_FAIL(LEASE_ELOST, lease_renew(&g, conf_store, 0));

    /* Free at once, for anyone, with a greater token. */
    g2 = conf_acquire(key, b, 30000, "next");
    ASSERT_U64_OP(g2.token, >, g.token);
    /* The old grant cannot end the new lease. */
    CHECK_FAIL(LEASE_ELOST, lease_release(conf_store, &g));
    assert_unchanged(key, &g2);
    CHECK_RC(0, lease_release(conf_store, &g2));
}

/* Row "release", otherwise: wrong owner or token → ELOST, nothing changes. */
static void test_release_wrong_owner_or_token(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_grant g, bad;
    lease_info info;

    (void)state;
    conf_key(key, "release/wrong");
    conf_owner(a);
    conf_owner(b);
    g = conf_acquire(key, a, 30000, "keep-me");

    bad = g;
    memcpy(bad.owner, b, sizeof(bad.owner));
    CHECK_FAIL(LEASE_ELOST, lease_release(conf_store, &bad));
    assert_unchanged(key, &g);

    bad = g;
    bad.token = g.token + 1;
    CHECK_FAIL(LEASE_ELOST, lease_release(conf_store, &bad));
    assert_unchanged(key, &g);

    if (g.token > 1) {
        bad.token = g.token - 1;
        CHECK_FAIL(LEASE_ELOST, lease_release(conf_store, &bad));
        assert_unchanged(key, &g);
    }

    /* A grant rebuilt from kept values (as the CLI does) works. */
    CHECK_RC(0, lease_grant_init(&bad, key, a, g.token, g.ttl_ms));
    CHECK_RC(0, lease_release(conf_store, &bad));
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 0);
    ASSERT_U64_OP(info.token, ==, g.token);
}

/* ======================================================================
 * inspect and list
 * ====================================================================== */

/* Row "inspect": ENOTFOUND for a key never acquired. */
static void test_inspect_never_acquired(void **state)
{
    char key[LEASE_KEY_MAX + 1];
    lease_info info, *list = NULL;
    size_t n = 99;

    (void)state;
    conf_key(key, "inspect/never");
    CHECK_FAIL(LEASE_ENOTFOUND, lease_inspect(&info, conf_store, key));
    CHECK_RC(0, lease_list(&list, &n, conf_store, key));
    assert_int_equal(n, 0);
    assert_null(list);
}

/* Row "inspect" of a held key: held, owner, label, token, remaining. */
static void test_inspect_held(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    lease_grant g;
    lease_info info;

    (void)state;
    conf_key(key, "inspect/held");
    conf_owner(a);
    g = conf_acquire(key, a, 60000, "host-1:4242");
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_string_equal(info.key, key);
    assert_int_equal(info.held, 1);
    assert_string_equal(info.owner, a);
    assert_string_equal(info.label, "host-1:4242");
    ASSERT_U64_OP(info.token, ==, g.token);
    ASSERT_U64_OP(info.remaining_ms, >, 0);
    ASSERT_U64_OP(info.remaining_ms, <=, g.ttl_ms);
    ASSERT_U64_OP(info.ttl_ms, ==, g.ttl_ms);
    CHECK_RC(0, lease_release(conf_store, &g));
}

/* Row "inspect" of a released key: held 0, the token kept. */
static void test_inspect_released(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    lease_grant g;
    lease_info info;

    (void)state;
    conf_key(key, "inspect/released");
    conf_owner(a);
    g = conf_acquire(key, a, 60000, "gone");
    CHECK_RC(0, lease_release(conf_store, &g));
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_string_equal(info.key, key);
    assert_int_equal(info.held, 0);
    assert_string_equal(info.owner, ""); /* "" when free */
    ASSERT_U64_OP(info.token, ==, g.token);
    ASSERT_U64_OP(info.remaining_ms, ==, 0);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Row "list(prefix)": exactly the keys under the prefix, sorted, free ones
 * included. */
static void test_list_prefix_sorted(void **state)
{
    static const char *const inside[] = { "m", "b", "z/1", "b/a", "a", "ab", "a-", "B" };
    static const char *const outside[] = { "lis", "listx", "list", "lisu/x", "list0/a" };
    enum { NIN = sizeof(inside) / sizeof(inside[0]) };
    char keys[NIN][LEASE_KEY_MAX + 1], other[LEASE_KEY_MAX + 1];
    char prefix[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    const char *sorted[NIN];
    lease_grant g[NIN];
    lease_info *list = NULL;
    size_t n = 0, i;

    (void)state;
    conf_owner(a);
    conf_key(prefix, "list/");
    for (i = 0; i < NIN; i++) {
        char name[64];
        snprintf(name, sizeof(name), "list/%s", inside[i]);
        conf_key(keys[i], name);
        g[i] = conf_acquire(keys[i], a, 60000, inside[i]);
        sorted[i] = keys[i];
    }
    /* Every other key released: free keys are listed too. */
    for (i = 0; i < NIN; i += 2)
        CHECK_RC(0, lease_release(conf_store, &g[i]));
    for (i = 0; i < sizeof(outside) / sizeof(outside[0]); i++) {
        conf_key(other, outside[i]);
        conf_acquire(other, a, 60000, NULL);
    }
    qsort(sorted, NIN, sizeof(sorted[0]), cmp_str);

    CHECK_RC(0, lease_list(&list, &n, conf_store, prefix));
    if (n != NIN) {
        for (i = 0; i < n; i++)
            print_error("  listed: %s\n", list[i].key);
        fail_msg("list('%s') gave %zu keys, expected %d", prefix, n, (int)NIN);
    }
    for (i = 0; i < n; i++) {
        size_t j;
        assert_string_equal(list[i].key, sorted[i]);
        for (j = 0; j < NIN; j++)
            if (strcmp(keys[j], list[i].key) == 0)
                break;
        assert_true(j < NIN);
        ASSERT_U64_OP(list[i].token, ==, g[j].token);
        assert_int_equal(list[i].held, j % 2 == 1);
        if (list[i].held) {
            assert_string_equal(list[i].owner, a);
            assert_string_equal(list[i].label, inside[j]);
            ASSERT_U64_OP(list[i].remaining_ms, >, 0);
            ASSERT_U64_OP(list[i].remaining_ms, <=, g[j].ttl_ms);
        }
    }
    lease_list_free(list);

    /* The whole run's prefix holds both groups, still sorted. */
    CHECK_RC(0, lease_list(&list, &n, conf_store, conf_prefix));
    ASSERT_U64_OP(n, >=, NIN + sizeof(outside) / sizeof(outside[0]));
    for (i = 0; i < n; i++) {
        assert_memory_equal(list[i].key, conf_prefix, strlen(conf_prefix));
        if (i > 0 && strcmp(list[i - 1].key, list[i].key) >= 0)
            fail_msg("list is not sorted: '%s' before '%s'", list[i - 1].key,
                     list[i].key);
    }
    lease_list_free(list);

    /* A prefix that matches nothing. */
    conf_key(other, "list/nothing-here/");
    CHECK_RC(0, lease_list(&list, &n, conf_store, other));
    assert_int_equal(n, 0);
    assert_null(list);
}

/* Row "inspect / list": a key holding LIKE, quoting and escape characters
 * round-trips exactly, and is not a pattern for list. */
static void test_key_special_chars(void **state)
{
    static const char *const name = "odd/a%b_c'd\"e\\f;g --h*?[x]{y}$(z)`é日本";
    static const char *const decoys[] = { "odd/aXbYc'd\"e\\f;g --h*?[x]{y}$(z)`é日本",
                                          "odd/a%bZc", "odd/abc", "odd/a\\%b",
                                          "odd/g*x", "odd/g?", "odd/gz", "odd/g[a]" };
    char key[LEASE_KEY_MAX + 1], other[LEASE_KEY_MAX + 1], pre[LEASE_KEY_MAX + 1];
    char a[LEASE_OWNER_BUFSZ];
    const char *label = "lbl '%_\\; \"x\"";
    lease_grant g;
    lease_info info, *list = NULL;
    size_t n = 0, i;

    (void)state;
    conf_owner(a);
    conf_key(key, name);
    g = conf_acquire(key, a, 60000, label);
    assert_string_equal(g.key, key);
    for (i = 0; i < sizeof(decoys) / sizeof(decoys[0]); i++) {
        conf_key(other, decoys[i]);
        conf_acquire(other, a, 60000, NULL);
    }

    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_string_equal(info.key, key);
    assert_string_equal(info.label, label);
    ASSERT_U64_OP(info.token, ==, g.token);
    assert_int_equal(info.held, 1);

    /* Exactly the key itself, as a prefix. */
    CHECK_RC(0, lease_list(&list, &n, conf_store, key));
    assert_int_equal(n, 1);
    assert_string_equal(list[0].key, key);
    assert_string_equal(list[0].label, label);
    lease_list_free(list);

    /* '%' and '_' in the prefix match only themselves. */
    conf_key(pre, "odd/a%");
    CHECK_RC(0, lease_list(&list, &n, conf_store, pre));
    if (n != 2) {
        for (i = 0; i < n; i++)
            print_error("  listed: %s\n", list[i].key);
        fail_msg("list('%s') gave %zu keys, expected 2", pre, n);
    }
    /* the decoy "odd/a%bZc" sorts first: 'Z' < '_' */
    conf_key(other, "odd/a%bZc");
    assert_string_equal(list[0].key, other);
    assert_string_equal(list[1].key, key);
    lease_list_free(list);

    conf_key(pre, "odd/a%b_");
    CHECK_RC(0, lease_list(&list, &n, conf_store, pre));
    assert_int_equal(n, 1);
    assert_string_equal(list[0].key, key);
    lease_list_free(list);

    /* A backslash is not an escape. */
    conf_key(pre, "odd/a\\");
    CHECK_RC(0, lease_list(&list, &n, conf_store, pre));
    assert_int_equal(n, 1);
    conf_key(other, "odd/a\\%b");
    assert_string_equal(list[0].key, other);
    lease_list_free(list);

    /* Glob characters ('*', '?', '[') are not patterns either. */
    conf_key(pre, "odd/g*");
    CHECK_RC(0, lease_list(&list, &n, conf_store, pre));
    assert_int_equal(n, 1);
    conf_key(other, "odd/g*x");
    assert_string_equal(list[0].key, other);
    lease_list_free(list);
    conf_key(pre, "odd/g?");
    CHECK_RC(0, lease_list(&list, &n, conf_store, pre));
    assert_int_equal(n, 1);
    conf_key(other, "odd/g?");
    assert_string_equal(list[0].key, other);
    lease_list_free(list);
    conf_key(pre, "odd/g[");
    CHECK_RC(0, lease_list(&list, &n, conf_store, pre));
    assert_int_equal(n, 1);
    conf_key(other, "odd/g[a]");
    assert_string_equal(list[0].key, other);
    lease_list_free(list);

    /* A lookalike is a different key. */
    conf_key(other, "odd/a_b%c'd\"e\\f;g --h");
    CHECK_FAIL(LEASE_ENOTFOUND, lease_inspect(&info, conf_store, other));

    CHECK_RC(0, lease_release(conf_store, &g));
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 0);
}

/* "key: 1–255 bytes, no NUL": any other byte is a key byte, UTF-8 or
 * not, control characters included; list order is plain byte order
 * (unsigned), the same for every store (PostgreSQL: COLLATE "C"). */
static void test_key_arbitrary_bytes(void **state)
{
    static const char *const names[] = { "bytes/\xff\xfe", "bytes/\x01\t\n\r",
                                         "bytes/\x7f", "bytes/Z", "bytes/a",
                                         "bytes/\xc3\xa9", "bytes/ " };
    enum { N = sizeof(names) / sizeof(names[0]) };
    char keys[N][LEASE_KEY_MAX + 1], prefix[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    const char *sorted[N];
    lease_grant g[N];
    lease_info info, *list = NULL;
    size_t n = 0, i;

    (void)state;
    conf_owner(a);
    for (i = 0; i < N; i++) {
        conf_key(keys[i], names[i]);
        g[i] = conf_acquire(keys[i], a, 60000, names[i]);
        sorted[i] = keys[i];
    }
    for (i = 0; i < N; i++) {
        CHECK_RC(0, lease_inspect(&info, conf_store, keys[i]));
        assert_string_equal(info.key, keys[i]);
        assert_string_equal(info.label, names[i]);
        ASSERT_U64_OP(info.token, ==, g[i].token);
    }
    qsort(sorted, N, sizeof(sorted[0]), cmp_str);
    conf_key(prefix, "bytes/");
    CHECK_RC(0, lease_list(&list, &n, conf_store, prefix));
    assert_int_equal(n, N);
    for (i = 0; i < n; i++)
        assert_string_equal(list[i].key, sorted[i]);
    lease_list_free(list);
    conf_key(prefix, "bytes/\xff");
    CHECK_RC(0, lease_list(&list, &n, conf_store, prefix));
    assert_int_equal(n, 1);
    assert_string_equal(list[0].key, keys[0]);
    lease_list_free(list);
    for (i = 0; i < N; i++)
        CHECK_RC(0, lease_release(conf_store, &g[i]));
}

/* ======================================================================
 * expiry and token order
 * ====================================================================== */

/* Row "acquire" after expiry: expiry is the store's clock + ttl; then
 * another owner gets a greater token. */
static void test_expiry_then_other_owner(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_grant g, g2, g3;
    lease_info info;

    (void)state;
    conf_key(key, "expiry/other");
    conf_owner(a);
    conf_owner(b);
    g = conf_acquire(key, a, 200, "short");
    info = conf_wait_free(key, g.ttl_ms);
    ASSERT_U64_OP(info.token, ==, g.token);

    g2 = conf_acquire(key, b, 30000, "next");
    ASSERT_U64_OP(g2.token, >, g.token);

    /* The old owner is now the other one: EBUSY, not its old lease. */
    o = conf_opts(a, 200, "short", 0);
    CHECK_FAIL(LEASE_EBUSY, lease_acquire(&g3, &info, conf_store, key, &o));
    assert_string_equal(info.owner, b);
    ASSERT_U64_OP(info.token, ==, g2.token);
    CHECK_FAIL(LEASE_ELOST, lease_release(conf_store, &g));
    CHECK_RC(0, lease_release(conf_store, &g2));
}

/* Tokens are never reused: 1000 acquire/release cycles on one key. */
static void test_tokens_increase_1000_cycles(void **state)
{
    char key[LEASE_KEY_MAX + 1], owners[2][LEASE_OWNER_BUFSZ];
    uint64_t prev = 0;
    int i;

    (void)state;
    conf_key(key, "cycles/1000");
    conf_owner(owners[0]);
    conf_owner(owners[1]);
    for (i = 0; i < 1000; i++) {
        lease_acquire_opts o = conf_opts(owners[i % 3 == 0], 30000, "cycle", 0);
        lease_grant g;
        int rc = lease_acquire(&g, NULL, conf_store, key, &o);

        if (rc != 0)
            fail_msg("cycle %d: acquire: %s: %s", i, lease_error_name(rc),
                     lease_errmsg());
        if (g.token <= prev)
            fail_msg("cycle %d: token %" PRIu64 " after %" PRIu64, i, g.token,
                     prev);
        prev = g.token;
        rc = lease_release(conf_store, &g);
        if (rc != 0)
            fail_msg("cycle %d: release: %s: %s", i, lease_error_name(rc),
                     lease_errmsg());
    }
}

/* "not after the store restarts": a new connection continues the count. */
static void test_tokens_survive_reopen(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    lease_grant g, g2;
    lease_info info;

    (void)state;
    conf_key(key, "reopen");
    conf_owner(a);
    g = conf_acquire(key, a, 30000, NULL);
    CHECK_RC(0, lease_release(conf_store, &g));
    conf_store_close();
    conf_store_open();
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    ASSERT_U64_OP(info.token, ==, g.token);
    g2 = conf_acquire(key, a, 30000, NULL);
    ASSERT_U64_OP(g2.token, >, g.token);
    CHECK_RC(0, lease_release(conf_store, &g2));
}

/* ======================================================================
 * killed holders
 * ====================================================================== */

/* Child: acquire/release in a loop, reporting every token granted. It runs
 * until killed (bounded, in case the parent is gone). It starts only when
 * the parent says so: a tight write loop can keep SQLite's (unfair) write
 * lock busy long enough that the parent could not even open its handle. */
static void child_cycle_and_report(const char *key, int out_fd, int go_fd)
{
    char owner[LEASE_OWNER_BUFSZ];
    lease_store *s = NULL;
    int64_t end = conf_now_ms() + 60000;
    lease_acquire_opts o;
    int rc;
    char c;

    if (lease_store_open(&s, conf_url) != 0 || lease_owner_new(owner) != 0)
        _exit(2);
    if (conf_read_full(go_fd, &c, 1, end) != 1)
        _exit(7);
    o = conf_opts(owner, 300, "cycler", 0);
    while (conf_now_ms() < end) {
        lease_grant g;
        if (lease_acquire(&g, NULL, s, key, &o) != 0)
            _exit(3);
        if (conf_write_full(out_fd, &g.token, sizeof(g.token)) != 0)
            _exit(4);
        /* ELOST: the short ttl ran out first (a slow machine) */
        rc = lease_release(s, &g);
        if (rc != 0 && rc != LEASE_ELOST)
            _exit(5);
    }
    _exit(6);
}

/* Tokens keep increasing after a holder is killed with SIGKILL in the
 * middle of its acquire/release loop. */
static void test_tokens_after_sigkill_mid_loop(void **state)
{
    char key[LEASE_KEY_MAX + 1], b[LEASE_OWNER_BUFSZ];
    uint64_t tokens[4096], max = 0;
    size_t n = 0, i;
    int fds[2], go[2], status;
    lease_acquire_opts o;
    lease_grant g;
    pid_t pid;
    char c = 'g';

    (void)state;
    conf_key(key, "kill/loop");
    conf_owner(b);
    conf_pipe(fds);
    conf_pipe(go);
    conf_store_close();
    pid = conf_fork();
    if (pid == 0) {
        close(fds[0]);
        close(go[1]);
        child_cycle_and_report(key, fds[1], go[0]);
    }
    close(fds[1]);
    close(go[0]);
    conf_store_open();
    assert_int_equal(conf_write_full(go[1], &c, 1), 0);
    close(go[1]);

    /* Let it run a while, then kill it wherever it is. */
    while (n < 40) {
        size_t got = conf_read_full(fds[0], &tokens[n], sizeof(tokens[0]),
                                    conf_now_ms() + 30000);
        if (got != sizeof(tokens[0]))
            fail_msg("the cycling child stopped reporting after %zu tokens", n);
        n++;
    }
    kill(pid, SIGKILL);
    status = conf_reap(pid, 10000);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    /* What it wrote before dying. */
    while (n < sizeof(tokens) / sizeof(tokens[0]) &&
           conf_read_full(fds[0], &tokens[n], sizeof(tokens[0]),
                          conf_now_ms() + 5000) == sizeof(tokens[0]))
        n++;
    close(fds[0]);

    for (i = 0; i < n; i++) {
        if (i > 0 && tokens[i] <= tokens[i - 1])
            fail_msg("child got token %" PRIu64 " after %" PRIu64, tokens[i],
                     tokens[i - 1]);
        if (tokens[i] > max)
            max = tokens[i];
    }
    /* It may have died holding the lease: wait out its ttl. */
    o = conf_opts(b, 30000, "after-kill", (uint64_t)conf_expiry_bound_ms(300));
    CHECK_RC(0, lease_acquire(&g, NULL, conf_store, key, &o));
    ASSERT_U64_OP(g.token, >, max);
    CHECK_RC(0, lease_release(conf_store, &g));
}

struct held_report {
    int rc;
    uint64_t token;
    uint64_t ttl_ms;
    char owner[LEASE_OWNER_BUFSZ];
};

/* Child: acquire once, report, then hold until killed or the parent's
 * end of `wait_fd` closes. */
static void child_acquire_and_hold(const char *key, uint64_t ttl_ms,
                                   int out_fd, int wait_fd)
{
    struct held_report r;
    lease_store *s = NULL;
    lease_acquire_opts o;
    lease_grant g;
    char c;

    memset(&r, 0, sizeof(r));
    r.rc = lease_store_open(&s, conf_url);
    if (r.rc == 0)
        r.rc = lease_owner_new(r.owner);
    if (r.rc == 0) {
        o = conf_opts(r.owner, ttl_ms, "doomed", 0);
        r.rc = lease_acquire(&g, NULL, s, key, &o);
        r.token = r.rc == 0 ? g.token : 0;
        r.ttl_ms = r.rc == 0 ? g.ttl_ms : 0;
    }
    conf_write_full(out_fd, &r, sizeof(r));
    while (read(wait_fd, &c, 1) < 0 && errno == EINTR)
        ;
    _exit(0);
}

/* A holder killed while holding: the next holder (waiting) gets a
 * greater token once the ttl has passed. */
static void test_tokens_after_sigkill_holding(void **state)
{
    char key[LEASE_KEY_MAX + 1], b[LEASE_OWNER_BUFSZ];
    int rep[2], hold[2], status, rc;
    struct held_report r;
    lease_acquire_opts o;
    lease_grant g;
    lease_info h;
    pid_t pid;

    (void)state;
    conf_key(key, "kill/holding");
    conf_owner(b);
    conf_pipe(rep);
    conf_pipe(hold);
    conf_store_close();
    pid = conf_fork();
    if (pid == 0) {
        close(rep[0]);
        close(hold[1]);
        child_acquire_and_hold(key, 1500, rep[1], hold[0]);
    }
    close(rep[1]);
    close(hold[0]);
    conf_store_open();
    assert_int_equal(conf_read_full(rep[0], &r, sizeof(r), conf_now_ms() + 30000),
                     sizeof(r));
    if (r.rc != 0)
        fail_msg("child could not acquire: %s", lease_error_name(r.rc));

    /* While it lives it holds the key (unless its ttl already ran out). */
    o = conf_opts(b, 30000, "next", 0);
    memset(&h, 0, sizeof(h));
    rc = lease_acquire(&g, &h, conf_store, key, &o);
    if (rc == LEASE_EBUSY) {
        assert_string_equal(h.owner, r.owner);
        ASSERT_U64_OP(h.token, ==, r.token);
        assert_string_equal(h.label, "doomed");
    } else {
        CHECK_RC(0, rc);
        ASSERT_U64_OP(g.token, >, r.token);
        CHECK_RC(0, lease_release(conf_store, &g));
    }

    kill(pid, SIGKILL);
    status = conf_reap(pid, 10000);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    close(rep[0]);
    close(hold[1]);

    o = conf_opts(b, 30000, "next", (uint64_t)conf_expiry_bound_ms(r.ttl_ms));
    CHECK_RC(0, lease_acquire(&g, NULL, conf_store, key, &o));
    ASSERT_U64_OP(g.token, >, r.token);
    CHECK_RC(0, lease_release(conf_store, &g));
}

/* ======================================================================
 * 16 processes racing
 * ====================================================================== */

#define RACERS 16
#define RACE_ROUNDS 20

struct race_report {
    int rc;
    uint64_t token;          /* won: ours; EBUSY: the holder's */
    char owner[LEASE_OWNER_BUFSZ];       /* ours */
    char holder_owner[LEASE_OWNER_BUFSZ]; /* EBUSY: the holder's */
};

static void child_race(const char *key, int ready_fd, int go_fd, int res_fd)
{
    struct race_report r;
    lease_store *s = NULL;
    lease_acquire_opts o;
    lease_grant g;
    lease_info h;
    char c = 'r';

    memset(&r, 0, sizeof(r));
    r.rc = lease_store_open(&s, conf_url);
    if (r.rc == 0)
        r.rc = lease_owner_new(r.owner);
    conf_write_full(ready_fd, &c, 1);
    /* Everyone starts together: the parent closes the "go" pipe. */
    while (read(go_fd, &c, 1) < 0 && errno == EINTR)
        ;
    if (r.rc == 0) {
        o = conf_opts(r.owner, 30000, "racer", 0);
        memset(&h, 0, sizeof(h));
        r.rc = lease_acquire(&g, &h, s, key, &o);
        if (r.rc == 0) {
            r.token = g.token;
        } else if (r.rc == LEASE_EBUSY) {
            r.token = h.token;
            memcpy(r.holder_owner, h.owner, sizeof(r.holder_owner));
        }
    }
    conf_write_full(res_fd, &r, sizeof(r));
    lease_store_close(s);
    _exit(0);
}

/* Row "acquire" under contention: 16 processes, 20 rounds, exactly one
 * winner per round, and the tokens rise round over round. */
static void test_race_16_processes(void **state)
{
    char key[LEASE_KEY_MAX + 1];
    uint64_t prev = 0;
    int round;

    (void)state;
    conf_key(key, "race/16");
    for (round = 0; round < RACE_ROUNDS; round++) {
        struct race_report r[RACERS];
        int ready[2], go[2], res[2], i, winner = -1, busy = 0;
        pid_t pids[RACERS];
        int64_t end;
        lease_grant g;
        char c;

        conf_pipe(ready);
        conf_pipe(go);
        conf_pipe(res);
        conf_store_close();
        for (i = 0; i < RACERS; i++) {
            pids[i] = conf_fork();
            if (pids[i] == 0) {
                close(ready[0]);
                close(go[1]);
                close(res[0]);
                child_race(key, ready[1], go[0], res[1]);
            }
        }
        close(ready[1]);
        close(go[0]);
        close(res[1]);
        conf_store_open();

        end = conf_now_ms() + 60000;
        for (i = 0; i < RACERS; i++)
            if (conf_read_full(ready[0], &c, 1, end) != 1)
                fail_msg("round %d: only %d of %d racers got ready", round, i,
                         RACERS);
        close(go[1]); /* go */
        for (i = 0; i < RACERS; i++)
            if (conf_read_full(res[0], &r[i], sizeof(r[i]), end) != sizeof(r[i]))
                fail_msg("round %d: only %d of %d racers reported", round, i,
                         RACERS);
        for (i = 0; i < RACERS; i++) {
            int status = conf_reap(pids[i], 30000);
            assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
        close(ready[0]);
        close(res[0]);

        for (i = 0; i < RACERS; i++) {
            if (r[i].rc == 0) {
                if (winner >= 0)
                    fail_msg("round %d: two winners, tokens %" PRIu64
                             " and %" PRIu64, round, r[winner].token, r[i].token);
                winner = i;
            } else if (r[i].rc == LEASE_EBUSY) {
                busy++;
            } else {
                fail_msg("round %d: a racer got %s", round,
                         lease_error_name(r[i].rc));
            }
        }
        if (winner < 0)
            fail_msg("round %d: no winner among %d racers", round, RACERS);
        assert_int_equal(busy, RACERS - 1);
        for (i = 0; i < RACERS; i++)
            if (i != winner) {
                /* Each loser saw the winner's lease, not some other one. */
                assert_string_equal(r[i].holder_owner, r[winner].owner);
                ASSERT_U64_OP(r[i].token, ==, r[winner].token);
            }
        ASSERT_U64_OP(r[winner].token, >, prev);
        prev = r[winner].token;

        /* Free the key for the next round, from the reported values. */
        CHECK_RC(0, lease_grant_init(&g, key, r[winner].owner, r[winner].token,
                                     30000));
        CHECK_RC(0, lease_release(conf_store, &g));
    }
}

/* ======================================================================
 * acquire with wait
 * ====================================================================== */

/* Row "acquire with wait": a holder that never releases; its lease
 * expires and the waiter gets it with a greater token. */
static void test_wait_for_expiry(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_grant ga, gb;

    (void)state;
    conf_key(key, "wait/expiry");
    conf_owner(a);
    conf_owner(b);
    ga = conf_acquire(key, a, 300, "never-releases");
    o = conf_opts(b, 30000, "waiter", 5000 + 3 * ga.ttl_ms);
    CHECK_RC(0, lease_acquire(&gb, NULL, conf_store, key, &o));
    ASSERT_U64_OP(gb.token, >, ga.token);
    assert_string_equal(gb.owner, b);
    CHECK_FAIL(LEASE_ELOST, lease_renew(&ga, conf_store, 0));
    assert_unchanged(key, &gb);
    CHECK_RC(0, lease_release(conf_store, &gb));
}

/* Child: acquire with a long ttl, report, release after ~100 ms, report
 * the release's result. */
static void child_hold_then_release(const char *key, int out_fd, int wait_fd)
{
    struct held_report r;
    lease_store *s = NULL;
    lease_acquire_opts o;
    lease_grant g;
    int rc;
    char c;

    memset(&r, 0, sizeof(r));
    r.rc = lease_store_open(&s, conf_url);
    if (r.rc == 0)
        r.rc = lease_owner_new(r.owner);
    if (r.rc == 0) {
        o = conf_opts(r.owner, 30000, "releases-soon", 0);
        r.rc = lease_acquire(&g, NULL, s, key, &o);
        r.token = r.rc == 0 ? g.token : 0;
    }
    conf_write_full(out_fd, &r, sizeof(r));
    if (r.rc != 0)
        _exit(2);
    conf_sleep_ms(100);
    rc = lease_release(s, &g);
    conf_write_full(out_fd, &rc, sizeof(rc));
    lease_store_close(s);
    while (read(wait_fd, &c, 1) < 0 && errno == EINTR)
        ;
    _exit(0);
}

/* Row "acquire with wait": a holder (another process) that releases; the
 * waiter gets the key. The holder's ttl is 30 s, so only the release can
 * let the waiter in. */
static void test_wait_for_release(void **state)
{
    char key[LEASE_KEY_MAX + 1], b[LEASE_OWNER_BUFSZ];
    int rep[2], hold[2], rc = -100, status;
    struct held_report r;
    lease_acquire_opts o;
    lease_grant g;
    pid_t pid;

    (void)state;
    conf_key(key, "wait/release");
    conf_owner(b);
    conf_pipe(rep);
    conf_pipe(hold);
    conf_store_close();
    pid = conf_fork();
    if (pid == 0) {
        close(rep[0]);
        close(hold[1]);
        child_hold_then_release(key, rep[1], hold[0]);
    }
    close(rep[1]);
    close(hold[0]);
    conf_store_open();
    assert_int_equal(conf_read_full(rep[0], &r, sizeof(r), conf_now_ms() + 30000),
                     sizeof(r));
    if (r.rc != 0)
        fail_msg("child could not acquire: %s", lease_error_name(r.rc));

    o = conf_opts(b, 30000, "waiter", 20000);
    CHECK_RC(0, lease_acquire(&g, NULL, conf_store, key, &o));
    ASSERT_U64_OP(g.token, >, r.token);

    assert_int_equal(conf_read_full(rep[0], &rc, sizeof(rc), conf_now_ms() + 30000),
                     sizeof(rc));
    CHECK_RC(0, rc); /* the child's release */
    close(hold[1]);
    status = conf_reap(pid, 30000);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(rep[0]);
    assert_unchanged(key, &g);
    CHECK_RC(0, lease_release(conf_store, &g));
}

/* Row "acquire with wait", otherwise: ETIMEOUT, with the holder. */
static void test_wait_timeout(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_grant ga, gb;
    lease_info h;

    (void)state;
    conf_key(key, "wait/timeout");
    conf_owner(a);
    conf_owner(b);
    ga = conf_acquire(key, a, 60000, "long-holder");
    o = conf_opts(b, 30000, "impatient", 300);
    memset(&h, 0, sizeof(h));
    CHECK_FAIL(LEASE_ETIMEOUT, lease_acquire(&gb, &h, conf_store, key, &o));
    assert_string_equal(h.owner, a);
    assert_string_equal(h.label, "long-holder");
    ASSERT_U64_OP(h.token, ==, ga.token);
    ASSERT_U64_OP(h.remaining_ms, >, 0);
    ASSERT_U64_OP(h.remaining_ms, <=, ga.ttl_ms);
    assert_unchanged(key, &ga);
    CHECK_RC(0, lease_release(conf_store, &ga));
}

/* A waiter on its own thread, with a cancel handle: what it got back. */
struct cancel_waiter {
    pthread_t thread;
    const char *key;
    lease_acquire_opts opts;
    lease_info holder;
    int rc;
    char msg[512];
};

static void *cancel_waiter_run(void *arg)
{
    struct cancel_waiter *w = arg;
    lease_grant g;

    memset(&w->holder, 0, sizeof(w->holder));
    w->rc = lease_acquire(&g, &w->holder, conf_store, w->key, &w->opts);
    snprintf(w->msg, sizeof(w->msg), "%s", lease_errmsg());
    if (w->rc == 0)
        (void)lease_release(conf_store, &g);
    return NULL;
}

/* "Acquire with wait", cancelled: firing the handle from another thread
 * ends a wait of a minute with LEASE_ETIMEOUT saying so, the holder
 * described and untouched. Without the handle working the wait would run
 * its minute and end with another message. */
static void test_wait_cancelled(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    struct cancel_waiter w;
    lease_cancel *c = NULL;
    lease_grant ga;

    (void)state;
    conf_key(key, "wait/cancelled");
    conf_owner(a);
    conf_owner(b);
    ga = conf_acquire(key, a, 60000, "long-holder");
    CHECK_RC(0, lease_cancel_new(&c));
    assert_int_equal(lease_cancel_fired(c), 0);
    memset(&w, 0, sizeof(w));
    w.key = key;
    w.opts = conf_opts(b, 30000, "cancelled", 60000);
    w.opts.cancel = c;
    assert_int_equal(pthread_create(&w.thread, NULL, cancel_waiter_run, &w), 0);
    conf_sleep_ms(100); /* most likely mid-pause; either way it must end */
    CHECK_RC(0, lease_cancel_fire(c));
    CHECK_RC(0, lease_cancel_fire(c)); /* again: a no-op */
    assert_int_equal(pthread_join(w.thread, NULL), 0);
    if (w.rc != LEASE_ETIMEOUT || strstr(w.msg, "cancelled") == NULL)
        fail_msg("cancelled wait: %s: %s", lease_error_name(w.rc), w.msg);
    assert_int_equal(lease_cancel_fired(c), 1);
    assert_string_equal(w.holder.owner, a);
    assert_unchanged(key, &ga);
    lease_cancel_free(c);
    CHECK_RC(0, lease_release(conf_store, &ga));
}

/* A fired handle stops further tries, not the first: a free key is had.
 * Options of version 1 end before `cancel`, which is never read there. */
static void test_wait_cancel_first_try_and_v1(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_cancel *c = NULL;
    lease_grant ga, gb;

    (void)state;
    conf_key(key, "wait/cancel-first");
    conf_owner(a);
    conf_owner(b);
    CHECK_RC(0, lease_cancel_new(&c));
    CHECK_RC(0, lease_cancel_fire(c));
    o = conf_opts(a, 30000, "first", 60000);
    o.cancel = c;
    CHECK_RC(0, lease_acquire(&ga, NULL, conf_store, key, &o));
    lease_cancel_free(c);

    o = conf_opts(b, 30000, "v1", 50);
    o.version = 1;
    o.cancel = (lease_cancel *)(uintptr_t)1; /* would crash if read */
    CHECK_FAIL(LEASE_ETIMEOUT, lease_acquire(&gb, NULL, conf_store, key, &o));
    assert_null(strstr(lease_errmsg(), "cancelled"));
    assert_unchanged(key, &ga);
    CHECK_RC(0, lease_release(conf_store, &ga));

    CHECK_FAIL(LEASE_EINVALID, lease_cancel_new(NULL));
    assert_int_equal(lease_cancel_fire(NULL), LEASE_EINVALID);
    assert_int_equal(lease_cancel_fired(NULL), 0);
    lease_cancel_free(NULL);
}

/* ======================================================================
 * the local deadline
 * ====================================================================== */

/* "Time": the holder's deadline is the time the request was sent, plus
 * the granted ttl, minus a margin. */
static void test_local_deadline(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_grant g;
    int64_t t0;

    (void)state;
    conf_key(key, "deadline");
    conf_owner(a);
    o = conf_opts(a, 60000, NULL, 0);
    t0 = lease_clock_ns();
    CHECK_RC(0, lease_acquire(&g, NULL, conf_store, key, &o));
    ASSERT_U64_OP(g.ttl_ms, >=, 60000);
    ASSERT_I64_OP(g.deadline_ns, >, t0);
    ASSERT_I64_OP(g.deadline_ns, <=, t0 + (int64_t)g.ttl_ms * 1000000);
    assert_int_equal(lease_grant_valid(&g), 1);
    ASSERT_U64_OP(lease_grant_remaining_ms(&g), <=, g.ttl_ms);
    ASSERT_U64_OP(lease_grant_remaining_ms(&g), >, 0);

    t0 = lease_clock_ns();
    CHECK_RC(0, lease_renew(&g, conf_store, 90000));
    ASSERT_U64_OP(g.ttl_ms, >=, 90000);
    ASSERT_I64_OP(g.deadline_ns, >, t0);
    ASSERT_I64_OP(g.deadline_ns, <=, t0 + (int64_t)g.ttl_ms * 1000000);

    /* A retried acquire sets the deadline anew as well. */
    o = conf_opts(a, 60000, NULL, 0);
    t0 = lease_clock_ns();
    CHECK_RC(0, lease_acquire(&g, NULL, conf_store, key, &o));
    ASSERT_I64_OP(g.deadline_ns, >, t0);
    ASSERT_I64_OP(g.deadline_ns, <=, t0 + (int64_t)g.ttl_ms * 1000000);
    CHECK_RC(0, lease_release(conf_store, &g));
}

/* ======================================================================
 * fencing
 * ====================================================================== */

/* "fence_advance": accept token >= mark (equality too), raise the mark;
 * otherwise ESTALE with the current mark, nothing changed. */
static void test_fence_advance(void **state)
{
    char res[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    uint64_t mark = 0;
    lease_grant g;
    lease_info info;

    (void)state;
    conf_key(res, "fence/resource");
    conf_owner(a);
    CHECK_FAIL(LEASE_ENOTFOUND, lease_fence_mark(&mark, conf_store, res));

    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, 5));
    ASSERT_U64_OP(mark, ==, 5);
    mark = 0;
    CHECK_RC(0, lease_fence_mark(&mark, conf_store, res));
    ASSERT_U64_OP(mark, ==, 5);

    mark = 0;
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, 5));
    ASSERT_U64_OP(mark, ==, 5);

    mark = 0;
    CHECK_FAIL(LEASE_ESTALE, lease_fence_advance(&mark, conf_store, res, 4));
    ASSERT_U64_OP(mark, ==, 5);
    mark = 0;
    CHECK_RC(0, lease_fence_mark(&mark, conf_store, res));
    ASSERT_U64_OP(mark, ==, 5);

    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, 7));
    ASSERT_U64_OP(mark, ==, 7);
    CHECK_RC(0, lease_fence_advance(NULL, conf_store, res, 7));

    CHECK_FAIL(LEASE_EINVALID, lease_fence_advance(&mark, conf_store, res, 0));
    CHECK_FAIL(LEASE_ESTALE, lease_fence_advance(NULL, conf_store, res, 1));
    CHECK_RC(0, lease_fence_mark(&mark, conf_store, res));
    ASSERT_U64_OP(mark, ==, 7);

    /* Marks live apart from leases: same name, no effect either way. */
    CHECK_FAIL(LEASE_ENOTFOUND, lease_inspect(&info, conf_store, res));
    g = conf_acquire(res, a, 30000, NULL);
    CHECK_RC(0, lease_fence_mark(&mark, conf_store, res));
    ASSERT_U64_OP(mark, ==, 7);
    CHECK_RC(0, lease_release(conf_store, &g));

    /* A large token (the range every store keeps). */
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, (uint64_t)INT64_MAX));
    ASSERT_U64_OP(mark, ==, (uint64_t)INT64_MAX);
    CHECK_FAIL(LEASE_ESTALE, lease_fence_advance(&mark, conf_store, res, 8));
    ASSERT_U64_OP(mark, ==, (uint64_t)INT64_MAX);
    CHECK_FAIL(LEASE_EINVALID,
               lease_fence_advance(&mark, conf_store, res, (uint64_t)INT64_MAX + 1));
    CHECK_FAIL(LEASE_EINVALID, lease_fence_advance(&mark, conf_store, res, UINT64_MAX));
    CHECK_RC(0, lease_fence_mark(&mark, conf_store, res));
    ASSERT_U64_OP(mark, ==, (uint64_t)INT64_MAX);
}

/* The seed's scenario: the new holder installs its generation at the
 * resource at once, so the old holder is fenced. */
static void test_fence_fences_old_holder(void **state)
{
    char key[LEASE_KEY_MAX + 1], res[LEASE_KEY_MAX + 1];
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_grant ga, gb;
    uint64_t mark = 0;

    (void)state;
    conf_key(key, "fence/lock");
    conf_key(res, "fence/storage");
    conf_owner(a);
    conf_owner(b);
    ga = conf_acquire(key, a, 200, "old");
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, ga.token));
    conf_wait_free(key, ga.ttl_ms);
    gb = conf_acquire(key, b, 30000, "new");
    ASSERT_U64_OP(gb.token, >, ga.token);
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, gb.token));
    /* The old holder's late write is refused. */
    CHECK_FAIL(LEASE_ESTALE, lease_fence_advance(&mark, conf_store, res, ga.token));
    ASSERT_U64_OP(mark, ==, gb.token);
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, gb.token));
    CHECK_RC(0, lease_release(conf_store, &gb));
}

/* ======================================================================
 * guarded writes
 * ====================================================================== */

static void assert_data(const char *name, const void *bytes, size_t len,
                        uint64_t token)
{
    void *v = NULL;
    size_t n = 12345;
    uint64_t t = 0;

    CHECK_RC(0, lease_data_get(&v, &n, &t, conf_store, name));
    assert_non_null(v);
    assert_int_equal(n, len);
    if (len)
        assert_memory_equal(v, bytes, len);
    assert_int_equal(((char *)v)[n], '\0');
    ASSERT_U64_OP(t, ==, token);
    free(v);
}

/* Kubernetes writes one object at a time, so a value named apart from the
 * key cannot be written atomically with the lease check: its store
 * answers guarded_put and data_get with EUNSUPPORTED (docs/stores.md). */
static int no_guarded_put(void)
{
    return strncmp(lease_store_scheme(conf_store), "kubernetes", 10) == 0;
}

static void assert_guarded_put_unsupported(const lease_grant *g, const char *name)
{
    void *v = NULL;
    size_t n = 0;

    CHECK_FAIL(LEASE_EUNSUPPORTED, lease_guarded_put(conf_store, g, name, "x", 1));
    CHECK_FAIL(LEASE_EUNSUPPORTED, lease_data_get(&v, &n, NULL, conf_store, name));
    assert_null(v);
}

/* The ttl of a grant that writes, then expires (see test_guarded_put). */
#define GUARD_TTL_MS 3000

/* "Guarded write in the coordination store itself": applied only while
 * (owner, token) is the current, unexpired lease. */
static void test_guarded_put(void **state)
{
    static const unsigned char bin[] = { 'a', 0, 'b', 0xff, 0, '\n', 'z' };
    char key[LEASE_KEY_MAX + 1], name[LEASE_KEY_MAX + 1], empty[LEASE_KEY_MAX + 1];
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_grant ga, gb;
    lease_info info;
    void *v = NULL;
    size_t n = 0;

    (void)state;
    conf_key(key, "guard/lock");
    conf_key(name, "guard/data");
    conf_key(empty, "guard/empty");
    conf_owner(a);
    conf_owner(b);
    if (no_guarded_put()) {
        ga = conf_acquire(key, a, 30000, "writer-a");
        assert_guarded_put_unsupported(&ga, name);
        CHECK_RC(0, lease_release(conf_store, &ga));
        return;
    }
    CHECK_FAIL(LEASE_ENOTFOUND, lease_data_get(&v, &n, NULL, conf_store, name));

    /* A ttl that outlasts the writes (a slow store must not fail them),
     * then shortened by a renew so that it expires soon. Not 30 s: etcd
     * cannot shorten a lease (its renew restores the granted TTL), so
     * there the wait below is this ttl. */
    ga = conf_acquire(key, a, GUARD_TTL_MS, "writer-a");
    CHECK_RC(0, lease_guarded_put(conf_store, &ga, name, bin, sizeof(bin)));
    assert_data(name, bin, sizeof(bin), ga.token);
    CHECK_RC(0, lease_guarded_put(conf_store, &ga, empty, NULL, 0));
    assert_data(empty, "", 0, ga.token);
    CHECK_RC(0, lease_guarded_put(conf_store, &ga, empty, "", 0));
    assert_data(empty, "", 0, ga.token);
    CHECK_FAIL(LEASE_EINVALID, lease_guarded_put(conf_store, &ga, empty, NULL, 1));
    CHECK_FAIL(LEASE_EINVALID, lease_guarded_put(conf_store, &ga, "", "x", 1));
    /* Data names live apart from lease keys. */
    CHECK_FAIL(LEASE_ENOTFOUND, lease_inspect(&info, conf_store, name));
    /* token may be NULL */
    CHECK_RC(0, lease_data_get(&v, &n, NULL, conf_store, name));
    free(v);

    /* The lease expires, another owner takes it: the old grant writes
     * nothing. */
    CHECK_RC(0, lease_renew(&ga, conf_store, 200));
    conf_wait_free(key, ga.ttl_ms);
    gb = conf_acquire(key, b, 30000, "writer-b");
    ASSERT_U64_OP(gb.token, >, ga.token);
    CHECK_FAIL(LEASE_ELOST, lease_guarded_put(conf_store, &ga, name, "stale", 5));
    assert_data(name, bin, sizeof(bin), ga.token);
    CHECK_FAIL(LEASE_ELOST, lease_guarded_put(conf_store, &ga, empty, "x", 1));
    assert_data(empty, "", 0, ga.token);

    CHECK_RC(0, lease_guarded_put(conf_store, &gb, name, "fresh", 5));
    assert_data(name, "fresh", 5, gb.token);

    /* Released: the grant writes nothing either. */
    CHECK_RC(0, lease_release(conf_store, &gb));
    CHECK_FAIL(LEASE_ELOST, lease_guarded_put(conf_store, &gb, name, "late", 4));
    assert_data(name, "fresh", 5, gb.token);
}

/* An expired lease that nobody took is not enough either. */
static void test_guarded_put_expired_untaken(void **state)
{
    char key[LEASE_KEY_MAX + 1], name[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    lease_grant g;

    (void)state;
    conf_key(key, "guard2/lock");
    conf_key(name, "guard2/data");
    conf_owner(a);
    g = conf_acquire(key, a, GUARD_TTL_MS, NULL); /* see test_guarded_put */
    if (no_guarded_put()) {
        assert_guarded_put_unsupported(&g, name);
        CHECK_RC(0, lease_release(conf_store, &g));
        return;
    }
    CHECK_RC(0, lease_guarded_put(conf_store, &g, name, "v1", 2));
    CHECK_RC(0, lease_renew(&g, conf_store, 200));
    conf_wait_free(key, g.ttl_ms);
    CHECK_FAIL(LEASE_ELOST, lease_guarded_put(conf_store, &g, name, "v2", 2));
    assert_data(name, "v1", 2, g.token);
}

struct txn_probe {
    int calls;
    int ret;
    void *native;
};

static int txn_cb(void *native, void *payload)
{
    struct txn_probe *p = payload;

    p->calls++;
    p->native = native;
    return p->ret;
}

/* "For SQL stores this is also offered as a transaction": the callback
 * runs only while the lease is current; other stores say EUNSUPPORTED. */
static void test_guarded_txn(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    const char *scheme = lease_store_scheme(conf_store);
    struct txn_probe p;
    lease_grant g, stale, gb;

    (void)state;
    conf_key(key, "txn/lock");
    conf_owner(a);
    conf_owner(b);
    g = conf_acquire(key, a, 30000, "txn");

    memset(&p, 0, sizeof(p));
    if (strcmp(scheme, "sqlite") != 0 && strcmp(scheme, "postgres") != 0) {
        CHECK_FAIL(LEASE_EUNSUPPORTED, lease_guarded_txn(conf_store, &g, txn_cb, &p));
        assert_int_equal(p.calls, 0);
        CHECK_RC(0, lease_release(conf_store, &g));
        return;
    }

    CHECK_RC(0, lease_guarded_txn(conf_store, &g, txn_cb, &p));
    assert_int_equal(p.calls, 1);
    assert_non_null(p.native);

    /* The callback's own result rolls back and comes back. */
    memset(&p, 0, sizeof(p));
    p.ret = 42;
    assert_int_equal(lease_guarded_txn(conf_store, &g, txn_cb, &p), 42);
    assert_int_equal(p.calls, 1);

    /* Stale grants: a wrong token, a wrong owner, a released lease, and
     * the old grant once another owner holds the key. */
    memset(&p, 0, sizeof(p));
    stale = g;
    stale.token = g.token + 1;
    CHECK_FAIL(LEASE_ELOST, lease_guarded_txn(conf_store, &stale, txn_cb, &p));
    stale = g;
    memcpy(stale.owner, b, sizeof(stale.owner));
    CHECK_FAIL(LEASE_ELOST, lease_guarded_txn(conf_store, &stale, txn_cb, &p));
    CHECK_RC(0, lease_release(conf_store, &g));
    CHECK_FAIL(LEASE_ELOST, lease_guarded_txn(conf_store, &g, txn_cb, &p));
    gb = conf_acquire(key, b, 30000, "txn-b");
    CHECK_FAIL(LEASE_ELOST, lease_guarded_txn(conf_store, &g, txn_cb, &p));
    assert_int_equal(p.calls, 0);
    CHECK_RC(0, lease_guarded_txn(conf_store, &gb, txn_cb, &p));
    assert_int_equal(p.calls, 1);
    CHECK_RC(0, lease_release(conf_store, &gb));
}

/* ...and an expired one. */
static void test_guarded_txn_expired(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    const char *scheme = lease_store_scheme(conf_store);
    struct txn_probe p;
    lease_grant g;

    (void)state;
    conf_key(key, "txn/expired");
    conf_owner(a);
    g = conf_acquire(key, a, 200, NULL);
    conf_wait_free(key, g.ttl_ms);
    memset(&p, 0, sizeof(p));
    if (strcmp(scheme, "sqlite") != 0 && strcmp(scheme, "postgres") != 0)
        CHECK_FAIL(LEASE_EUNSUPPORTED, lease_guarded_txn(conf_store, &g, txn_cb, &p));
    else
        CHECK_FAIL(LEASE_ELOST, lease_guarded_txn(conf_store, &g, txn_cb, &p));
    assert_int_equal(p.calls, 0);
}

/* ======================================================================
 * bad input
 * ====================================================================== */

static size_t count_under_prefix(void)
{
    lease_info *list = NULL;
    size_t n = 0;

    CHECK_RC(0, lease_list(&list, &n, conf_store, conf_prefix));
    lease_list_free(list);
    return n;
}

/* "EINVALID (bad argument)": rejected before the store, changing nothing. */
static void test_bad_input_changes_nothing(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    char k255[LEASE_KEY_MAX + 1], k256[LEASE_KEY_MAX + 2];
    char label256[LEASE_LABEL_MAX + 2];
    size_t before, plen = strlen(conf_prefix);
    lease_acquire_opts o;
    lease_grant g, held, bad;
    lease_info info, *list = NULL;
    lease_store *s = NULL;
    uint64_t mark;
    void *v = NULL;
    size_t n = 0;

    (void)state;
    conf_key(key, "bad/key");
    conf_owner(a);
    conf_owner(b);
    memcpy(k256, conf_prefix, plen);
    memset(k256 + plen, 'k', sizeof(k256) - 1 - plen);
    k256[sizeof(k256) - 1] = '\0';
    assert_int_equal(strlen(k256), 256);
    memcpy(k255, k256, 255);
    k255[255] = '\0';
    memset(label256, 'l', sizeof(label256) - 1);
    label256[sizeof(label256) - 1] = '\0';

    before = count_under_prefix();

    o = conf_opts(a, 30000, NULL, 0);
    CHECK_FAIL(LEASE_EINVALID, lease_acquire(&g, NULL, conf_store, "", &o));
    CHECK_FAIL(LEASE_EINVALID, lease_acquire(&g, NULL, conf_store, k256, &o));
    CHECK_FAIL(LEASE_EINVALID, lease_acquire(&g, NULL, conf_store, NULL, &o));
    CHECK_FAIL(LEASE_EINVALID, lease_acquire(&g, NULL, conf_store, key, NULL));
    CHECK_FAIL(LEASE_EINVALID, lease_acquire(NULL, NULL, conf_store, key, &o));
    CHECK_FAIL(LEASE_EINVALID, lease_acquire(&g, NULL, NULL, key, &o));
    o.ttl_ms = 0;
    CHECK_FAIL(LEASE_EINVALID, lease_acquire(&g, NULL, conf_store, key, &o));
    o.ttl_ms = LEASE_TTL_MAX_DEFAULT_MS + 1;
    CHECK_FAIL(LEASE_EINVALID, lease_acquire(&g, NULL, conf_store, key, &o));
    o.ttl_ms = UINT64_MAX;
    CHECK_FAIL(LEASE_EINVALID, lease_acquire(&g, NULL, conf_store, key, &o));
    o = conf_opts("not-a-uuid", 30000, NULL, 0);
    CHECK_FAIL(LEASE_EINVALID, lease_acquire(&g, NULL, conf_store, key, &o));
    o = conf_opts(NULL, 30000, NULL, 0);
    CHECK_FAIL(LEASE_EINVALID, lease_acquire(&g, NULL, conf_store, key, &o));
    o = conf_opts(a, 30000, label256, 0);
    CHECK_FAIL(LEASE_EINVALID, lease_acquire(&g, NULL, conf_store, key, &o));
    o = conf_opts(a, 30000, NULL, 0);
    o.version = 999;
    CHECK_FAIL(LEASE_EINVALID, lease_acquire(&g, NULL, conf_store, key, &o));
    o = conf_opts(a, 30000, NULL, UINT64_MAX);
    CHECK_FAIL(LEASE_EINVALID, lease_acquire(&g, NULL, conf_store, key, &o));

    CHECK_FAIL(LEASE_EINVALID, lease_inspect(&info, conf_store, ""));
    CHECK_FAIL(LEASE_EINVALID, lease_inspect(&info, conf_store, k256));
    CHECK_FAIL(LEASE_EINVALID, lease_inspect(&info, conf_store, NULL));
    CHECK_FAIL(LEASE_EINVALID, lease_fence_advance(&mark, conf_store, "", 1));
    CHECK_FAIL(LEASE_EINVALID, lease_fence_advance(&mark, conf_store, k256, 1));
    CHECK_FAIL(LEASE_EINVALID, lease_fence_mark(&mark, conf_store, NULL));
    CHECK_FAIL(LEASE_EINVALID, lease_grant_init(&bad, key, "not-a-uuid", 1, 1000));
    CHECK_FAIL(LEASE_EINVALID, lease_grant_init(&bad, key, a, 0, 1000));
    CHECK_FAIL(LEASE_EINVALID, lease_grant_init(&bad, "", a, 1, 1000));
    CHECK_FAIL(LEASE_EINVALID, lease_inspect(NULL, conf_store, key));
    CHECK_FAIL(LEASE_EINVALID, lease_list(NULL, &n, conf_store, conf_prefix));
    CHECK_FAIL(LEASE_EINVALID, lease_list(&list, NULL, conf_store, conf_prefix));
    CHECK_FAIL(LEASE_EINVALID, lease_list(&list, &n, conf_store, k256));
    CHECK_FAIL(LEASE_EINVALID, lease_data_get(&v, &n, NULL, conf_store, ""));
    CHECK_FAIL(LEASE_EINVALID, lease_data_get(&v, &n, NULL, conf_store, k256));

    /* Nothing was created: not the key, not a truncated 255-byte one. */
    assert_int_equal(count_under_prefix(), before);
    CHECK_FAIL(LEASE_ENOTFOUND, lease_inspect(&info, conf_store, key));
    CHECK_FAIL(LEASE_ENOTFOUND, lease_inspect(&info, conf_store, k255));

    /* Against a held lease: bad renewals and releases change nothing. */
    held = conf_acquire(key, a, 60000, "held");
    bad = held;
    CHECK_FAIL(LEASE_EINVALID, lease_renew(&bad, conf_store, LEASE_TTL_MAX_DEFAULT_MS + 1));
    CHECK_FAIL(LEASE_EINVALID, lease_renew(&bad, conf_store, UINT64_MAX));
    CHECK_FAIL(LEASE_EINVALID, lease_renew(NULL, conf_store, 0));
    bad.token = 0;
    CHECK_FAIL(LEASE_EINVALID, lease_renew(&bad, conf_store, 0));
    CHECK_FAIL(LEASE_EINVALID, lease_release(conf_store, &bad));
    bad = held;
    strcpy(bad.owner, "not-a-uuid");
    CHECK_FAIL(LEASE_EINVALID, lease_renew(&bad, conf_store, 0));
    CHECK_FAIL(LEASE_EINVALID, lease_release(conf_store, &bad));
    bad = held;
    memcpy(bad.owner, b, sizeof(bad.owner));
    CHECK_FAIL(LEASE_ELOST, lease_renew(&bad, conf_store, 0));
    CHECK_FAIL(LEASE_ELOST, lease_release(conf_store, &bad));
    bad = held;
    bad.token = held.token + 1;
    CHECK_FAIL(LEASE_ELOST, lease_renew(&bad, conf_store, 0));
    CHECK_FAIL(LEASE_ELOST, lease_release(conf_store, &bad));
    CHECK_FAIL(no_guarded_put() ? LEASE_EUNSUPPORTED : LEASE_ELOST,
               lease_guarded_put(conf_store, &bad, key, "x", 1));
    assert_unchanged(key, &held);
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    ASSERT_U64_OP(info.remaining_ms, >, 0);
    assert_int_equal(count_under_prefix(), before + 1);
    CHECK_RC(0, lease_release(conf_store, &held));

    /* Bad URLs. */
    CHECK_FAIL(LEASE_EINVALID, lease_store_open(&s, ""));
    assert_null(s);
    CHECK_FAIL(LEASE_EINVALID, lease_store_open(&s, "no-such-scheme://x/y"));
    assert_null(s);
    CHECK_FAIL(LEASE_EINVALID, lease_store_open(&s, NULL));
    assert_null(s);
}

/* "key: 1–255 bytes": the longest key works everywhere. */
static void test_key_255_bytes(void **state)
{
    char k255[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    char label[LEASE_LABEL_MAX + 1];
    size_t plen = strlen(conf_prefix);
    lease_acquire_opts o;
    lease_grant g, g2;
    lease_info info, *list = NULL;
    size_t n = 0;
    uint64_t mark = 0;

    (void)state;
    conf_owner(a);
    conf_owner(b);
    memcpy(k255, conf_prefix, plen);
    memset(k255 + plen, 'q', LEASE_KEY_MAX - plen);
    k255[LEASE_KEY_MAX] = '\0';
    assert_int_equal(strlen(k255), 255);

    memset(label, 'L', LEASE_LABEL_MAX);
    label[LEASE_LABEL_MAX] = '\0';
    g = conf_acquire(k255, a, 30000, label);
    assert_string_equal(g.key, k255);
    CHECK_RC(0, lease_inspect(&info, conf_store, k255));
    assert_string_equal(info.key, k255);
    assert_string_equal(info.label, label);
    assert_int_equal(info.held, 1);
    CHECK_RC(0, lease_list(&list, &n, conf_store, k255));
    assert_int_equal(n, 1);
    assert_string_equal(list[0].key, k255);
    lease_list_free(list);
    CHECK_RC(0, lease_renew(&g, conf_store, 0));
    o = conf_opts(b, 30000, NULL, 0);
    CHECK_FAIL(LEASE_EBUSY, lease_acquire(&g2, NULL, conf_store, k255, &o));
    if (no_guarded_put()) {
        assert_guarded_put_unsupported(&g, k255);
    } else {
        CHECK_RC(0, lease_guarded_put(conf_store, &g, k255, "v", 1));
        assert_data(k255, "v", 1, g.token);
    }
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, k255, g.token));
    CHECK_RC(0, lease_release(conf_store, &g));
    g2 = conf_acquire(k255, b, 30000, NULL);
    ASSERT_U64_OP(g2.token, >, g.token);
    CHECK_RC(0, lease_release(conf_store, &g2));
}

/* "Messages never contain a password from a store URL": neither the
 * redacted URL of the store under test, nor the message of a failed open
 * of the same kind of store with a password in its URL. */
static void test_no_password_in_messages(void **state)
{
    static const char *const secret = "s3cr3t-Pw0rd";
    const char *scheme = lease_store_scheme(conf_store);
    const char *auth = strstr(conf_url, "://"), *at, *colon;
    char url[512], pw[256];
    lease_store *s = NULL;
    int rc;

    (void)state;
    /* The password of the URL under test, if it has one. */
    if (auth != NULL) {
        auth += 3;
        at = strchr(auth, '@');
        colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
        if (colon && at - colon - 1 > 0 && (size_t)(at - colon - 1) < sizeof(pw)) {
            memcpy(pw, colon + 1, (size_t)(at - colon - 1));
            pw[at - colon - 1] = '\0';
            if (strstr(lease_store_url_redacted(conf_store), pw) != NULL)
                fail_msg("the redacted URL shows the password");
        }
    }

    /* A store of the same kind that cannot be opened (port 1 refuses). */
    snprintf(url, sizeof(url), "%s://lease:%s@127.0.0.1:1/none?password=%s",
             scheme, secret, secret);
    lease_error_clear();
    rc = lease_store_open(&s, url);
    if (rc == 0) {
        if (strstr(lease_store_url_redacted(s), secret) != NULL)
            fail_msg("redacted URL '%s' shows the password",
                     lease_store_url_redacted(s));
        lease_store_close(s);
    } else {
        assert_null(s);
        assert_true(rc == LEASE_EINVALID || rc == LEASE_ESTORE);
        assert_true(lease_errmsg()[0] != '\0');
        if (strstr(lease_errmsg(), secret) != NULL)
            fail_msg("the message of a failed open shows the password: %s",
                     lease_errmsg());
    }
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        CONF_TEST(test_acquire_free_then_busy),
        CONF_TEST(test_acquire_retry_same_owner),
        CONF_TEST(test_renew_ok),
        CONF_TEST(test_renew_wrong_owner),
        CONF_TEST(test_renew_wrong_token),
        CONF_TEST(test_renew_after_expiry),
        CONF_TEST(test_release_ok),
        CONF_TEST(test_release_wrong_owner_or_token),
        CONF_TEST(test_inspect_never_acquired),
        CONF_TEST(test_inspect_held),
        CONF_TEST(test_inspect_released),
        CONF_TEST(test_list_prefix_sorted),
        CONF_TEST(test_key_special_chars),
        CONF_TEST(test_key_arbitrary_bytes),
        CONF_TEST(test_expiry_then_other_owner),
        CONF_TEST(test_tokens_increase_1000_cycles),
        CONF_TEST(test_tokens_survive_reopen),
        CONF_TEST(test_tokens_after_sigkill_mid_loop),
        CONF_TEST(test_tokens_after_sigkill_holding),
        CONF_TEST(test_race_16_processes),
        CONF_TEST(test_wait_for_expiry),
        CONF_TEST(test_wait_for_release),
        CONF_TEST(test_wait_timeout),
        CONF_TEST(test_wait_cancelled),
        CONF_TEST(test_wait_cancel_first_try_and_v1),
        CONF_TEST(test_local_deadline),
        CONF_TEST(test_fence_advance),
        CONF_TEST(test_fence_fences_old_holder),
        CONF_TEST(test_guarded_put),
        CONF_TEST(test_guarded_put_expired_untaken),
        CONF_TEST(test_guarded_txn),
        CONF_TEST(test_guarded_txn_expired),
        CONF_TEST(test_bad_input_changes_nothing),
        CONF_TEST(test_key_255_bytes),
        CONF_TEST(test_no_password_in_messages),
    };
    int failed;

    if (conf_init(argc, argv, "conf") != 0)
        return 2;
    failed = cmocka_run_group_tests_name("lease_conformance", tests, NULL, NULL);
    conf_store_close();
    return failed ? 1 : 0;
}
