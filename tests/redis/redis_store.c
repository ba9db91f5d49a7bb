/*
 * redis_store.c - Redis-specific behaviour of the store, through the public
 * API, against the shared server of $LEASE_TEST_REDIS_URL (or argv[1]);
 * without one it fails, it never skips.
 *
 *  - tokens are exact over the whole 64-bit range the library accepts
 *    (Lua's numbers are doubles: 2^53 and beyond must not be rounded, and
 *    no token may be printed as "1e+14");
 *  - the store reloads its scripts when the server forgot them (NOSCRIPT),
 *    also in the middle of list's pipelined inspects;
 *  - prefix= and /db keep stores apart;
 *  - keys with glob characters, braces and colons list exactly;
 *  - a password never shows in a message or in the redacted URL;
 *  - a key written in the layout before issue 16 (counter, lease hash,
 *    cjson history) reads the same and is migrated on first touch, its
 *    holder keeping the lease and its tokens going on from the counter;
 *  - an acquire + release cycle is two EVALSHAs, whose scripts run the
 *    fewest commands they can (watched with MONITOR).
 *
 * The test talks to the server directly with hiredis only to set up a
 * situation (a counter near a limit, a flushed script cache) and to look at
 * the store's key layout; every check of behaviour goes through lease.h.
 * Every run uses a fresh random key prefix, so the shared server needs no
 * cleaning.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "lease.h"
#include "conf_assert.h"

static const char *url;       /* the shared server */
static char counter_url[600]; /* the same with ?tokens=counter: tokens 1, 2... */
static char host[256];
static int port;
static char base[96];         /* "redis_store/<uuid>/" */
static redisContext *raw;     /* a plain connection, for setting up */

/* ---- a raw connection ----------------------------------------------------- */

/* redis://[user:password@]host:port[/db][?...]: host and port only (the
 * shared server of the tests has neither password nor db). */
static void parse_host_port(const char *u)
{
    const char *p = strstr(u, "://"), *at, *end, *colon;
    size_t n;

    assert_non_null(p);
    p += 3;
    end = p + strcspn(p, "/?");
    at = memchr(p, '@', (size_t)(end - p));
    if (at)
        p = at + 1;
    colon = memchr(p, ':', (size_t)(end - p));
    n = (size_t)((colon ? colon : end) - p);
    assert_true(n > 0 && n < sizeof(host));
    memcpy(host, p, n);
    host[n] = '\0';
    port = colon ? atoi(colon + 1) : 6379;
}

static redisReply *cmd(const char *fmt, ...)
{
    va_list ap;
    redisReply *r;

    va_start(ap, fmt);
    r = redisvCommand(raw, fmt, ap);
    va_end(ap);
    if (r == NULL)
        fail_msg("raw redis command '%s' failed: %s", fmt, raw->errstr);
    return r;
}

static void cmd_ok(const char *fmt, ...)
{
    va_list ap;
    redisReply *r;

    va_start(ap, fmt);
    r = redisvCommand(raw, fmt, ap);
    va_end(ap);
    if (r == NULL)
        fail_msg("raw redis command '%s' failed: %s", fmt, raw->errstr);
    if (r->type == REDIS_REPLY_ERROR)
        fail_msg("raw redis command '%s': %s", fmt, r->str);
    freeReplyObject(r);
}

static int setup(void **state)
{
    char owner[LEASE_OWNER_BUFSZ];
    struct timeval tv = { 5, 0 };

    (void)state;
    parse_host_port(url);
    raw = redisConnectWithTimeout(host, port, tv);
    if (raw == NULL || raw->err) {
        fprintf(stderr, "cannot connect to %s:%d: %s\n", host, port,
                raw ? raw->errstr : "out of memory");
        return -1;
    }
    redisSetTimeout(raw, tv);
    lease_owner_new(owner);
    snprintf(base, sizeof(base), "redis_store/%s/", owner);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    redisFree(raw);
    return 0;
}

/* Every store a case opens, closed by the teardown (also when an
 * assertion failed half-way). */
static lease_store *opened[8];
static int nopened;

static lease_store *open_url(const char *u)
{
    lease_store *s = NULL;

    assert_true(nopened < 8);
    CHECK_RC(0, lease_store_open(&s, u));
    opened[nopened++] = s;
    return s;
}

/* The last list a case asked for: freed by the next list and by the
 * teardown. */
static lease_info *list_of_case;

static lease_info *list_keys(size_t *n, lease_store *s, const char *prefix)
{
    lease_list_free(list_of_case);
    list_of_case = NULL;
    CHECK_RC(0, lease_list(&list_of_case, n, s, prefix));
    return list_of_case;
}

static int close_stores(void **state)
{
    (void)state;
    lease_list_free(list_of_case);
    list_of_case = NULL;
    while (nopened > 0)
        lease_store_close(opened[--nopened]);
    return 0;
}

static void key_name(char *out, size_t size, const char *name)
{
    snprintf(out, size, "%s%s", base, name);
}

static void new_opts(lease_acquire_opts *o, char owner[LEASE_OWNER_BUFSZ],
                     uint64_t ttl_ms)
{
    lease_acquire_opts init = LEASE_ACQUIRE_OPTS_INIT;

    *o = init;
    lease_owner_new(owner);
    o->owner = owner;
    o->ttl_ms = ttl_ms;
    o->label = "redis_store";
}

/* ---- tokens over the whole 64-bit range ------------------------------- */

/* Set KEY's counter (the store's layout: lease:{KEY}:token) to `before`,
 * then acquire, renew, inspect, release, fence and acquire again through
 * the store of URL `u`: every token must be exactly before + 1 (then + 2).
 * Above the clock in microseconds (about 1.8e15) the default clock mode
 * follows the counter too, comparing decimal strings. */
static void token_after(const char *u, const char *name, const char *before,
                        uint64_t expected)
{
    char key[256], ctr[320], owner[LEASE_OWNER_BUFSZ], res[280];
    lease_acquire_opts o;
    lease_grant g, g2;
    lease_info info;
    uint64_t mark = 0;
    lease_store *s = open_url(u);

    key_name(key, sizeof(key), name);
    snprintf(ctr, sizeof(ctr), "lease:{%s}:token", key);
    cmd_ok("SET %s %s", ctr, before);

    new_opts(&o, owner, 30000);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, expected);
    /* A retried acquire by the same owner: the same token. */
    CHECK_RC(0, lease_acquire(&g2, NULL, s, key, &o));
    ASSERT_U64_OP(g2.token, ==, expected);
    CHECK_RC(0, lease_inspect(&info, s, key));
    assert_true(info.held);
    ASSERT_U64_OP(info.token, ==, expected);
    /* Renew and release compare the stored token with the grant's. */
    CHECK_RC(0, lease_renew(&g, s, 30000));
    CHECK_RC(0, lease_release(s, &g));
    CHECK_RC(0, lease_inspect(&info, s, key));
    assert_false(info.held);
    ASSERT_U64_OP(info.token, ==, expected);

    /* The fence compares exactly too. */
    snprintf(res, sizeof(res), "%sres", key);
    CHECK_RC(0, lease_fence_advance(&mark, s, res, expected));
    ASSERT_U64_OP(mark, ==, expected);
    CHECK_RC(LEASE_ESTALE, lease_fence_advance(&mark, s, res, expected - 1));
    ASSERT_U64_OP(mark, ==, expected);

    if (expected < UINT64_C(9223372036854775807)) {
        new_opts(&o, owner, 30000);
        CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
        ASSERT_U64_OP(g.token, ==, expected + 1);
        CHECK_RC(0, lease_release(s, &g));
        CHECK_RC(0, lease_fence_advance(&mark, s, res, expected + 1));
        ASSERT_U64_OP(mark, ==, expected + 1);
    } else {
        /* No token is left: the store fails, and writes no grant that
         * would make the key look held by an owner told it failed. */
        new_opts(&o, owner, 30000);
        CHECK_RC(LEASE_ESTORE, lease_acquire(&g, NULL, s, key, &o));
        CHECK_RC(0, lease_inspect(&info, s, key));
        assert_false(info.held);
        ASSERT_U64_OP(info.token, ==, expected);
    }
}

static void test_token_1e14(void **state)
{
    (void)state;
    /* %.14g, Lua 5.1's number format, prints 1e14 as "1e+14". Below the
     * clock in us: counter mode. */
    token_after(counter_url, "t-1e14", "99999999999999", UINT64_C(100000000000000));
}

static void test_token_2p53(void **state)
{
    (void)state;
    /* 2^53 + 1 is the first integer a double cannot hold. */
    token_after(url, "t-2p53", "9007199254740992", UINT64_C(9007199254740993));
}

static void test_token_max(void **state)
{
    (void)state;
    /* 2^63 - 1: the largest token lease_parse_token accepts. */
    token_after(url, "t-max", "9223372036854775806", UINT64_C(9223372036854775807));
}

static void test_fence_big_tokens(void **state)
{
    char res[256];
    uint64_t mark = 0;
    lease_store *s = open_url(url);

    (void)state;
    key_name(res, sizeof(res), "fence-big");
    /* Decimal strings of different lengths, and of equal length. */
    CHECK_RC(0, lease_fence_advance(&mark, s, res, UINT64_C(99999999999999)));
    CHECK_RC(0, lease_fence_advance(&mark, s, res, UINT64_C(100000000000000)));
    CHECK_RC(LEASE_ESTALE, lease_fence_advance(&mark, s, res, UINT64_C(99999999999999)));
    ASSERT_U64_OP(mark, ==, UINT64_C(100000000000000));
    CHECK_RC(0, lease_fence_advance(&mark, s, res, UINT64_C(9223372036854775806)));
    CHECK_RC(LEASE_ESTALE, lease_fence_advance(&mark, s, res, UINT64_C(9223372036854775805)));
    CHECK_RC(0, lease_fence_advance(&mark, s, res, UINT64_C(9223372036854775807)));
    CHECK_RC(LEASE_ESTALE, lease_fence_advance(&mark, s, res, UINT64_C(9223372036854775806)));
    CHECK_RC(0, lease_fence_mark(&mark, s, res));
    ASSERT_U64_OP(mark, ==, UINT64_C(9223372036854775807));
}

/* ---- scripts forgotten by the server ------------------------------------ */

static void test_noscript_reload(void **state)
{
    char key[256], key2[256], owner[LEASE_OWNER_BUFSZ], res[280];
    lease_acquire_opts o;
    lease_grant g, g2;
    lease_info info;
    uint64_t mark;
    lease_store *s = open_url(url);

    (void)state;
    key_name(key, sizeof(key), "noscript");
    key_name(key2, sizeof(key2), "noscript2");
    snprintf(res, sizeof(res), "%sres", key);
    new_opts(&o, owner, 30000);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));

    /* The server forgets every script (as after a restart or a failover to
     * a replica that never loaded them): each call must load them again. */
    cmd_ok("SCRIPT FLUSH");
    CHECK_RC(0, lease_renew(&g, s, 30000));
    cmd_ok("SCRIPT FLUSH");
    CHECK_RC(0, lease_inspect(&info, s, key));
    ASSERT_U64_OP(info.token, ==, g.token);
    cmd_ok("SCRIPT FLUSH");
    CHECK_RC(0, lease_fence_advance(&mark, s, res, g.token));
    cmd_ok("SCRIPT FLUSH");
    CHECK_RC(0, lease_guarded_put(s, &g, res, "v", 1));
    cmd_ok("SCRIPT FLUSH");
    new_opts(&o, owner, 30000);
    CHECK_RC(0, lease_acquire(&g2, NULL, s, key2, &o));
    /* list pipelines its inspects: every one answered NOSCRIPT, and each
     * key is inspected again alone. */
    cmd_ok("SCRIPT FLUSH");
    {
        lease_info *list = NULL;
        size_t n = 0;

        CHECK_RC(0, lease_list(&list, &n, s, key));
        ASSERT_U64_OP(n, ==, 2);
        assert_string_equal(list[0].key, key);
        assert_string_equal(list[1].key, key2);
        ASSERT_U64_OP(list[1].token, ==, g2.token);
        lease_list_free(list);
    }
    cmd_ok("SCRIPT FLUSH");
    {
        lease_history_entry *h = NULL;
        size_t n = 0;

        CHECK_RC(0, lease_history(&h, &n, s, key, 0));
        ASSERT_U64_OP(n, ==, 1);
        ASSERT_U64_OP(h[0].token, ==, g.token);
        lease_history_free(h);
    }
    cmd_ok("SCRIPT FLUSH");
    CHECK_RC(0, lease_release(s, &g));
    CHECK_RC(0, lease_release(s, &g2));
}

/* ---- prefix= and /db ------------------------------------------------------ */

static void test_prefix_and_db_isolation(void **state)
{
    char key[256], owner[LEASE_OWNER_BUFSZ], u[4][700], lk[400];
    lease_acquire_opts o;
    lease_grant g[4];
    lease_info *list = NULL;
    size_t n = 0;
    lease_store *s[4];
    redisReply *r;
    int i;

    (void)state;
    key_name(key, sizeof(key), "iso");
    snprintf(u[0], sizeof(u[0]), "%s&prefix=pa:", counter_url);
    snprintf(u[1], sizeof(u[1]), "%s&prefix=pb:", counter_url);
    snprintf(u[2], sizeof(u[2]), "redis://%s:%d/1?prefix=pa:&tokens=counter", host, port);
    snprintf(u[3], sizeof(u[3]), "redis://%s:%d/2?prefix=pa:&tokens=counter", host, port);
    for (i = 0; i < 4; i++)
        s[i] = open_url(u[i]);
    /* The same key in four stores: four first holders, each token 1. */
    for (i = 0; i < 4; i++) {
        new_opts(&o, owner, 30000);
        CHECK_RC(0, lease_acquire(&g[i], NULL, s[i], key, &o));
        ASSERT_U64_OP(g[i].token, ==, 1);
    }
    /* Each store lists only its own key. */
    for (i = 0; i < 4; i++) {
        list = list_keys(&n, s[i], base);
        assert_int_equal((int)n, 1);
        assert_string_equal(list[0].owner, g[i].owner);
    }
    /* The layout: the record <prefix>{key}:token, in the URL's database,
     * its head the grant "1 OWNER ..." (see lib.lua). */
    snprintf(lk, sizeof(lk), "pb:{%s}:token", key);
    r = cmd("LINDEX %s 0", lk);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_int_equal(strncmp(r->str, "1 ", 2), 0);
    assert_int_equal(strncmp(r->str + 2, g[1].owner, strlen(g[1].owner)), 0);
    freeReplyObject(r);
    cmd_ok("SELECT 2");
    snprintf(lk, sizeof(lk), "pa:{%s}:token", key);
    r = cmd("LINDEX %s 0", lk);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_int_equal(strncmp(r->str + 2, g[3].owner, strlen(g[3].owner)), 0);
    freeReplyObject(r);
    cmd_ok("SELECT 0");
    for (i = 0; i < 4; i++) {
        CHECK_RC(0, lease_release(s[i], &g[i]));
    }
}

/* ---- keys with glob characters, braces and colons --------------------------- */

static void test_odd_keys_list_exactly(void **state)
{
    static const char *const names[] = {
        "g/a*b", "g/a?b", "g/a[b]", "g/a\\b", "g/{x}", "g/a}b", "g/a{b",
        "g/a:token", "g/a:lease", "g/ab",
    };
    const size_t count = sizeof(names) / sizeof(names[0]);
    char key[256], prefix[256], owner[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_grant g;
    lease_info *list = NULL, info;
    size_t n = 0, i;
    lease_store *s = open_url(counter_url);

    (void)state;
    for (i = 0; i < count; i++) {
        key_name(key, sizeof(key), names[i]);
        new_opts(&o, owner, 30000);
        CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
        ASSERT_U64_OP(g.token, ==, 1);
        CHECK_RC(0, lease_inspect(&info, s, key));
        assert_string_equal(info.owner, owner);
    }
    key_name(prefix, sizeof(prefix), "g/");
    list = list_keys(&n, s, prefix);
    if (n != count)
        fail_msg("list('g/') found %zu keys, expected %zu", n, count);
    /* A prefix with glob characters matches itself only. */
    key_name(prefix, sizeof(prefix), "g/a*");
    list = list_keys(&n, s, prefix);
    assert_int_equal((int)n, 1);
    key_name(key, sizeof(key), "g/a*b");
    assert_string_equal(list[0].key, key);
    key_name(prefix, sizeof(prefix), "g/a?");
    list = list_keys(&n, s, prefix);
    assert_int_equal((int)n, 1);
    key_name(prefix, sizeof(prefix), "g/a[");
    list = list_keys(&n, s, prefix);
    assert_int_equal((int)n, 1);
    key_name(prefix, sizeof(prefix), "g/a:");
    list = list_keys(&n, s, prefix);
    assert_int_equal((int)n, 2);
}

/* ---- passwords ----------------------------------------------------------- */

static void test_password_never_shown(void **state)
{
    static const char pw[] = "Very-Secret-pw-42";
    char u[512];
    lease_store *s = NULL;
    int rc;

    (void)state;
    /* The shared server has no password: AUTH fails, and says so without
     * the password. */
    snprintf(u, sizeof(u), "redis://someone:%s@%s:%d/0", pw, host, port);
    lease_error_clear();
    rc = lease_store_open(&s, u);
    assert_null(s);
    CHECK_RC(LEASE_ESTORE, rc);
    if (strstr(lease_errmsg(), pw))
        fail_msg("the password shows in: %s", lease_errmsg());
    assert_true(lease_errmsg()[0] != '\0');

    /* Without a user name too. */
    snprintf(u, sizeof(u), "redis://:%s@%s:%d", pw, host, port);
    rc = lease_store_open(&s, u);
    CHECK_RC(LEASE_ESTORE, rc);
    if (strstr(lease_errmsg(), pw))
        fail_msg("the password shows in: %s", lease_errmsg());

    /* The redacted URL of an open store hides it (no password: as is). */
    s = open_url(url);
    assert_null(strstr(lease_store_url_redacted(s), "***"));
    assert_string_equal(lease_store_scheme(s), "redis");
}

/* ---- the layout before issue 16, read and migrated ------------------------ */

/* The server's clock in ms (TIME), to date entries written by hand. */
static int64_t server_ms(void)
{
    redisReply *r = cmd("TIME");
    int64_t ms;

    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal((int)r->elements, 2);
    ms = (int64_t)strtoll(r->element[0]->str, NULL, 10) * 1000 +
         strtoll(r->element[1]->str, NULL, 10) / 1000;
    freeReplyObject(r);
    return ms;
}

/* One history entry as the old scripts wrote it: a cjson object of
 * strings, pushed at the head of lease:{key}:history. */
static void old_entry(const char *key, const char *token, const char *owner,
                      const char *label_json, int64_t acquired, const char *ended,
                      int64_t ended_ms, int64_t expires)
{
    char e[1024];

    snprintf(e, sizeof(e),
             "{\"token\":\"%s\",\"owner\":\"%s\",\"label\":\"%s\",\"ttl_ms\":"
             "\"30000\",\"acquired_ms\":\"%" PRId64 "\",\"ended\":\"%s\","
             "\"ended_ms\":\"%" PRId64 "\",\"expires_ms\":\"%" PRId64 "\"}",
             token, owner, label_json, acquired, ended, ended_ms, expires);
    cmd_ok("LPUSH lease:{%s}:history %s", key, e);
}

static const char old_a[] = "0a0a0a0a-aaaa-4aaa-8aaa-00000000000a";
static const char old_c[] = "0c0c0c0c-cccc-4ccc-8ccc-00000000000c";
static const char old_d[] = "0d0d0d0d-dddd-4ddd-8ddd-00000000000d";

/* A key as the old layout left it while A held token 41: counter 41, the
 * lease hash with its own expiry, four history entries (released, lost,
 * expired unnoticed, held). */
static int64_t old_layout_held(const char *key)
{
    int64_t now = server_ms();

    cmd_ok("SET lease:{%s}:token 41", key);
    cmd_ok("HSET lease:{%s}:lease owner %s label %s token 41 ttl_ms 30000",
           key, old_a, "old holder");
    cmd_ok("PEXPIRE lease:{%s}:lease 30000", key);
    old_entry(key, "38", old_c, "a \\\"q\\\" \\u00e9 b", now - 9000, "released",
              now - 8000, now + 21000);
    old_entry(key, "39", old_c, "", now - 8000, "lost", now - 6000, now - 6000);
    old_entry(key, "40", old_d, "d", now - 6000, "held", 0, now - 5000);
    old_entry(key, "41", old_a, "old holder", now - 100, "held", 0, now + 29900);
    return now;
}

/* The old layout is read as it was and migrated on first touch: the holder
 * keeps its lease (inspect, busy, its retry, renew, release), the history
 * keeps every entry, tokens go on from the counter, and an old client's
 * next step (INCR of the counter) fails instead of granting beside it. */
static void test_old_layout_held(void **state)
{
    char key[256], owner[LEASE_OWNER_BUFSZ];
    lease_store *s = open_url(counter_url);
    lease_acquire_opts o;
    lease_history_entry *h = NULL;
    lease_info info, holder;
    lease_grant g, gb;
    redisReply *r;
    size_t n = 0;
    int64_t now;

    (void)state;
    key_name(key, sizeof(key), "old-held");
    now = old_layout_held(key);
    CHECK_RC(0, lease_inspect(&info, s, key));
    assert_true(info.held);
    assert_string_equal(info.owner, old_a);
    assert_string_equal(info.label, "old holder");
    ASSERT_U64_OP(info.token, ==, 41);
    ASSERT_U64_OP(info.remaining_ms, <=, 30000);
    ASSERT_U64_OP(info.ttl_ms, ==, 30000);
    /* Migrated: the record is a list, the old keys are gone, and the old
     * acquire's INCR of the counter fails. */
    r = cmd("TYPE lease:{%s}:token", key);
    assert_string_equal(r->str, "list");
    freeReplyObject(r);
    r = cmd("EXISTS lease:{%s}:lease lease:{%s}:history", key, key);
    assert_int_equal((int)r->integer, 0);
    freeReplyObject(r);
    r = cmd("INCR lease:{%s}:token", key);
    assert_int_equal(r->type, REDIS_REPLY_ERROR);
    freeReplyObject(r);

    new_opts(&o, owner, 30000);
    CHECK_RC(LEASE_EBUSY, lease_acquire(&gb, &holder, s, key, &o));
    assert_string_equal(holder.owner, old_a);
    ASSERT_U64_OP(holder.token, ==, 41);

    CHECK_RC(0, lease_history(&h, &n, s, key, 0));
    assert_int_equal((int)n, 4);
    ASSERT_U64_OP(h[0].token, ==, 41);
    assert_int_equal(h[0].ended, LEASE_ENDED_HELD);
    assert_string_equal(h[0].owner, old_a);
    ASSERT_I64_OP(h[0].acquired_ms, ==, now - 100);
    ASSERT_U64_OP(h[1].token, ==, 40);
    assert_int_equal(h[1].ended, LEASE_ENDED_EXPIRED);
    ASSERT_I64_OP(h[1].ended_ms, ==, now - 5000);
    assert_string_equal(h[1].label, "d");
    ASSERT_U64_OP(h[2].token, ==, 39);
    assert_int_equal(h[2].ended, LEASE_ENDED_LOST);
    ASSERT_I64_OP(h[2].ended_ms, ==, now - 6000);
    assert_string_equal(h[2].label, "");
    ASSERT_U64_OP(h[3].token, ==, 38);
    assert_int_equal(h[3].ended, LEASE_ENDED_RELEASED);
    ASSERT_I64_OP(h[3].ended_ms, ==, now - 8000);
    ASSERT_I64_OP(h[3].acquired_ms, ==, now - 9000);
    assert_string_equal(h[3].label, "a \"q\" \xc3\xa9 b");
    ASSERT_U64_OP(h[3].ttl_ms, ==, 30000);
    lease_history_free(h);

    /* The holder's retry gets its own token; renew and release go on. */
    o.owner = old_a;
    o.label = "old holder";
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 41);
    CHECK_RC(0, lease_renew(&g, s, 30000));
    CHECK_RC(0, lease_release(s, &g));
    new_opts(&o, owner, 30000);
    CHECK_RC(0, lease_acquire(&gb, NULL, s, key, &o));
    ASSERT_U64_OP(gb.token, ==, 42);
    CHECK_RC(0, lease_history(&h, &n, s, key, 0));
    assert_int_equal((int)n, 5);
    assert_int_equal(h[1].ended, LEASE_ENDED_RELEASED);
    ASSERT_U64_OP(h[1].token, ==, 41);
    lease_history_free(h);
    CHECK_RC(0, lease_release(s, &gb));
}

/* The counter ahead of the history (grants from before the store kept
 * one) and a held entry whose hash expired: the next token follows the
 * counter, and the entry says when it expired. */
static void test_old_layout_counter_ahead(void **state)
{
    char key[256], owner[LEASE_OWNER_BUFSZ];
    lease_store *s = open_url(counter_url);
    lease_store *clock = open_url(url);
    lease_acquire_opts o;
    lease_history_entry *h = NULL;
    lease_info info;
    lease_grant g;
    size_t n = 0;
    int64_t now;

    (void)state;
    key_name(key, sizeof(key), "old-ahead");
    now = server_ms();
    cmd_ok("SET lease:{%s}:token 77", key);
    old_entry(key, "70", old_d, "gone", now - 5000, "held", 0, now - 2000);
    CHECK_RC(0, lease_inspect(&info, s, key));
    assert_false(info.held);
    assert_int_equal(info.state, LEASE_STATE_EXPIRED);
    ASSERT_U64_OP(info.token, ==, 77);
    new_opts(&o, owner, 30000);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 78);
    CHECK_RC(0, lease_history(&h, &n, s, key, 0));
    assert_int_equal((int)n, 2);
    ASSERT_U64_OP(h[1].token, ==, 70);
    assert_int_equal(h[1].ended, LEASE_ENDED_EXPIRED);
    ASSERT_I64_OP(h[1].ended_ms, ==, now - 2000);
    lease_history_free(h);
    CHECK_RC(0, lease_release(s, &g));

    /* Clock mode on an old key whose counter is far ahead of the clock:
     * still counter + 1. */
    key_name(key, sizeof(key), "old-ahead-clock");
    cmd_ok("SET lease:{%s}:token 9000000000000000", key);
    CHECK_RC(0, lease_acquire(&g, NULL, clock, key, &o));
    ASSERT_U64_OP(g.token, ==, UINT64_C(9000000000000001));
    CHECK_RC(0, lease_release(clock, &g));
}

/* The record's head is the counter: an item there that is none of the
 * record's kinds is a store failure, never a guess that would restart the
 * tokens. */
static void test_record_malformed_head(void **state)
{
    char key[256], owner[LEASE_OWNER_BUFSZ];
    lease_store *s = open_url(counter_url);
    lease_acquire_opts o;
    lease_info info;
    lease_grant g;

    (void)state;
    key_name(key, sizeof(key), "bad-head");
    cmd_ok("RPUSH lease:{%s}:token %s", key, "not an item");
    new_opts(&o, owner, 30000);
    CHECK_RC(LEASE_ESTORE, lease_acquire(&g, NULL, s, key, &o));
    CHECK_RC(LEASE_ESTORE, lease_inspect(&info, s, key));
}

/*
 * A server out of memory (maxmemory reached, noeviction) refuses new
 * grants, but a holder must still renew and release: otherwise every
 * lease is lost at once and waiters sleep out whole ttls. The renew and
 * release scripts carry allow-oom; acquire does not.
 */
static void test_full_server_renew_release(void **state)
{
    char key[256], other[256], owner[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_grant g, g2;
    lease_info info;
    lease_store *s = open_url(url);
    int acquired, renewed, released;

    (void)state;
    key_name(key, sizeof(key), "oom");
    key_name(other, sizeof(other), "oom-other");
    new_opts(&o, owner, 30000);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    cmd_ok("CONFIG SET maxmemory-policy noeviction");
    cmd_ok("CONFIG SET maxmemory 1");
    new_opts(&o, owner, 30000);
    acquired = lease_acquire(&g2, NULL, s, other, &o);
    renewed = lease_renew(&g, s, 30000);
    released = lease_release(s, &g);
    /* Put the server back before any assert can end the test. */
    cmd_ok("CONFIG SET maxmemory 0");
    assert_int_equal(acquired, LEASE_ESTORE); /* the server was full */
    assert_int_equal(renewed, 0);
    assert_int_equal(released, 0);
    CHECK_RC(0, lease_inspect(&info, s, key));
    assert_false(info.held);
}

/* The record is trimmed: after three times LEASE_HISTORY_KEEP grants it
 * holds at most what a batch trim allows (two items a grant, and one
 * batch of 40 above that), and the history still has at least the
 * newest KEEP, newest first. */
static void test_record_trimmed(void **state)
{
    char key[256], rk[300], owner[LEASE_OWNER_BUFSZ];
    lease_history_entry *h = NULL;
    lease_acquire_opts o;
    lease_store *s = open_url(url);
    lease_grant g;
    redisReply *r;
    size_t n = 0, i;
    int k;

    (void)state;
    key_name(key, sizeof(key), "trimmed");
    snprintf(rk, sizeof(rk), "lease:{%s}:token", key);
    for (k = 0; k < 3 * LEASE_HISTORY_KEEP; k++) {
        new_opts(&o, owner, 30000);
        CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
        CHECK_RC(0, lease_release(s, &g));
    }
    r = cmd("LLEN %s", rk);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    assert_true(r->integer <= 2 * LEASE_HISTORY_KEEP + 40);
    freeReplyObject(r);
    CHECK_RC(0, lease_history(&h, &n, s, key, 0));
    assert_true(n >= LEASE_HISTORY_KEEP);
    assert_int_equal(h[0].token, g.token);
    for (i = 1; i < n; i++)
        assert_true(h[i].token < h[i - 1].token);
    lease_history_free(h);
}

/* ---- what a cycle costs the server -------------------------------------- */

/* One MONITOR line: the client ("lua" for a command a script ran, else
 * host:port) into addr and the command's name into name; 0, or -1 for a
 * line of another shape. Lines look like
 *   1796098175.819309 [0 127.0.0.1:49542] "EVALSHA" "..." ... */
static int monitor_line(const char *line, char *addr, size_t asize, char *name,
                        size_t nsize)
{
    const char *a = strchr(line, '['), *sp, *close, *q, *q2;

    if (a == NULL || (close = strchr(a, ']')) == NULL ||
        (sp = memchr(a, ' ', (size_t)(close - a))) == NULL ||
        (q = strchr(close, '"')) == NULL || (q2 = strchr(q + 1, '"')) == NULL ||
        (size_t)(close - sp - 1) >= asize || (size_t)(q2 - q - 1) >= nsize)
        return -1;
    memcpy(addr, sp + 1, (size_t)(close - sp - 1));
    addr[close - sp - 1] = '\0';
    memcpy(name, q + 1, (size_t)(q2 - q - 1));
    name[q2 - q - 1] = '\0';
    return 0;
}

/*
 * Two acquire + release cycles on one key, watched with MONITOR: the
 * store's connection sends exactly one EVALSHA per operation (no TYPE,
 * EXISTS, PING, SCRIPT LOAD or read of its own around it), and the
 * scripts run, each, the fewest commands they can: acquire LRANGE (the
 * record's head), TIME, LPUSH (the grant); release the same and PUBLISH.
 * What a script runs is its server time (each redis.call about a
 * microsecond, the issue 16 measurements), so one more command here fails
 * the test. Scripts are atomic: the "lua" lines right after an EVALSHA
 * are that script's, whatever else the shared server runs.
 */
static void test_cycle_commands(void **state)
{
    static const char *const want[4] = { "LRANGE TIME LPUSH",
                                         "LRANGE TIME LPUSH PUBLISH",
                                         "LRANGE TIME LPUSH",
                                         "LRANGE TIME LPUSH PUBLISH" };
    char key[256], rk[300], owner[LEASE_OWNER_BUFSZ], marker[300];
    char store_addr[64] = "", addr[64], name[64], got[4][128];
    struct timeval tv = { 5, 0 };
    lease_acquire_opts o;
    lease_store *s = open_url(url);
    redisContext *mon = redisConnectWithTimeout(host, port, tv);
    redisReply *r;
    int i, n = 0, mine = -1, lines;

    (void)state;
    key_name(key, sizeof(key), "cycle-commands");
    snprintf(rk, sizeof(rk), "\"lease:{%s}:token\"", key);
    snprintf(marker, sizeof(marker), "%s-done", key);
    assert_true(mon != NULL && mon->err == 0);
    redisSetTimeout(mon, tv);
    r = redisCommand(mon, "MONITOR");
    assert_non_null(r);
    freeReplyObject(r);
    for (i = 0; i < 2; i++) {
        lease_grant g;

        new_opts(&o, owner, 30000);
        CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
        CHECK_RC(0, lease_release(s, &g));
    }
    cmd_ok("ECHO %s", marker);
    memset(got, 0, sizeof(got));
    /* Bounded: at most 200000 lines, each read within 5 s. */
    for (lines = 0; lines < 200000; lines++) {
        void *reply = NULL;

        if (redisGetReply(mon, &reply) != REDIS_OK || reply == NULL)
            fail_msg("MONITOR ended before the marker: %s", mon->errstr);
        r = reply;
        if (r->type == REDIS_REPLY_STATUS && strstr(r->str, marker) != NULL) {
            freeReplyObject(r);
            break;
        }
        if (r->type != REDIS_REPLY_STATUS ||
            monitor_line(r->str, addr, sizeof(addr), name, sizeof(name)) < 0) {
            freeReplyObject(r);
            continue;
        }
        if (strcmp(addr, "lua") == 0) {
            if (mine >= 0 && strlen(got[mine]) + strlen(name) + 2 < sizeof(got[0]))
                snprintf(got[mine] + strlen(got[mine]),
                         sizeof(got[0]) - strlen(got[mine]), "%s%s",
                         got[mine][0] ? " " : "", name);
        } else if (store_addr[0] == '\0' && strstr(r->str, rk) != NULL) {
            snprintf(store_addr, sizeof(store_addr), "%s", addr);
        }
        if (strcmp(addr, "lua") != 0) {
            mine = -1;
            if (store_addr[0] != '\0' && strcmp(addr, store_addr) == 0) {
                /* Every command of the store's connection from its first
                 * call on is one of the four EVALSHAs of the key. */
                if (strcmp(name, "EVALSHA") != 0 || strstr(r->str, rk) == NULL)
                    fail_msg("the store sent %s besides its EVALSHAs", name);
                assert_true(n < 4);
                mine = n++;
            }
        }
        freeReplyObject(r);
    }
    redisFree(mon);
    assert_int_equal(n, 4);
    for (i = 0; i < 4; i++)
        if (strcmp(got[i], want[i]) != 0)
            fail_msg("script %d of the cycles ran '%s', not '%s'", i, got[i],
                     want[i]);
}

int main(int argc, char **argv)
{
    /* Three groups, run as three ctest tests so that each failure has a
     * name: "tokens" (issued tokens over the whole 64-bit range), "layout"
     * (keys of the layout before issue 16) and "store" (everything else).
     * No group argument: all. */
    const struct CMUnitTest tokens[] = {
        cmocka_unit_test_teardown(test_token_1e14, close_stores),
        cmocka_unit_test_teardown(test_token_2p53, close_stores),
        cmocka_unit_test_teardown(test_token_max, close_stores),
    };
    const struct CMUnitTest store[] = {
        cmocka_unit_test_teardown(test_fence_big_tokens, close_stores),
        cmocka_unit_test_teardown(test_noscript_reload, close_stores),
        cmocka_unit_test_teardown(test_prefix_and_db_isolation, close_stores),
        cmocka_unit_test_teardown(test_odd_keys_list_exactly, close_stores),
        cmocka_unit_test_teardown(test_password_never_shown, close_stores),
        cmocka_unit_test_teardown(test_full_server_renew_release, close_stores),
        cmocka_unit_test_teardown(test_record_trimmed, close_stores),
        cmocka_unit_test_teardown(test_cycle_commands, close_stores),
    };
    const struct CMUnitTest layout[] = {
        cmocka_unit_test_teardown(test_old_layout_held, close_stores),
        cmocka_unit_test_teardown(test_old_layout_counter_ahead, close_stores),
        cmocka_unit_test_teardown(test_record_malformed_head, close_stores),
    };
    const char *group = argc > 2 ? argv[2] : "";
    int failed = 0;

    url = argc > 1 ? argv[1] : getenv("LEASE_TEST_REDIS_URL");
    if (url == NULL || url[0] == '\0') {
        fprintf(stderr, "redis_store: no server: pass a redis:// URL or set "
                        "LEASE_TEST_REDIS_URL (scripts/test.sh starts one)\n");
        return 1;
    }
    if (strncmp(url, "redis://", 8) != 0) {
        fprintf(stderr, "redis_store: '%s' is not a redis:// URL\n", url);
        return 1;
    }
    snprintf(counter_url, sizeof(counter_url), "%s%stokens=counter", url,
             strchr(url, '?') ? "&" : "?");
    if (strcmp(group, "") != 0 && strcmp(group, "tokens") != 0 &&
        strcmp(group, "store") != 0 && strcmp(group, "layout") != 0) {
        fprintf(stderr, "usage: redis_store [URL [tokens|store|layout]]\n");
        return 1;
    }
    if (group[0] == '\0' || strcmp(group, "tokens") == 0)
        failed += cmocka_run_group_tests_name("tokens", tokens, setup, teardown);
    if (group[0] == '\0' || strcmp(group, "store") == 0)
        failed += cmocka_run_group_tests_name("store", store, setup, teardown);
    if (group[0] == '\0' || strcmp(group, "layout") == 0)
        failed += cmocka_run_group_tests_name("layout", layout, setup, teardown);
    return failed ? 1 : 0;
}
