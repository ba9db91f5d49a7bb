/*
 * redis_clock.c - clock-floored tokens (issue 13), through the public API,
 * against the shared server of $LEASE_TEST_REDIS_URL (or argv[1]); without
 * one it fails, it never skips.
 *
 *  - by default (tokens=clock) a new grant's token is the server's clock in
 *    microseconds, unless the last token + 1 is greater: the server is on
 *    loopback, so its clock is this host's;
 *  - handles with ?tokens=counter and ?tokens=clock share one key's counter:
 *    alternating them, every token is newer, and a counter grant is exactly
 *    the last token + 1;
 *  - a counter set 10 minutes ahead of the clock: the next clock grant is
 *    that + 1, logged once as "clock_behind" and counted in
 *    lease_clock_behind_total{store="redis"};
 *  - ?tokens=bogus is refused at open, naming the values it accepts.
 *
 * hiredis is used only to set a counter ahead (as a clock set back would);
 * every check of behaviour goes through lease.h. Every run uses a fresh
 * random key prefix, so the shared server needs no cleaning.
 */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "lease.h"
#include "conf_assert.h"

static const char *url;       /* the shared server */
static char base[96];         /* "redis_clock/<uuid>/" */

/* How far apart this host's clock and a token may be: the server's clock
 * is this host's (loopback), read within one call. */
#define SLACK_US UINT64_C(5000000)

static uint64_t now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* The shared URL with one more query parameter. */
static void url_with(char *out, size_t size, const char *param)
{
    snprintf(out, size, "%s%s%s", url, strchr(url, '?') ? "&" : "?", param);
}

/* Every store a case opens, closed by the teardown (also when an
 * assertion failed half-way). */
static lease_store *opened[4];
static int nopened;

static lease_store *open_url(const char *u)
{
    lease_store *s = NULL;

    assert_true(nopened < 4);
    CHECK_RC(0, lease_store_open(&s, u));
    opened[nopened++] = s;
    return s;
}

static int close_stores(void **state)
{
    (void)state;
    while (nopened > 0)
        lease_store_close(opened[--nopened]);
    lease_log_set(NULL, NULL, LEASE_LOG_WARN);
    return 0;
}

/* Acquire KEY with a new owner and release it at once: the token. */
static uint64_t grant(lease_store *s, const char *key)
{
    char owner[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    lease_grant g;

    lease_owner_new(owner);
    o.owner = owner;
    o.ttl_ms = 30000;
    o.label = "redis_clock";
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    CHECK_RC(0, lease_release(s, &g));
    return g.token;
}

/* ---- (a) the default: tokens from the clock -------------------------------- */

static void test_clock_tokens_by_default(void **state)
{
    char key[160];
    lease_store *s = open_url(url);
    uint64_t before, tok, prev;
    int i;

    (void)state;
    snprintf(key, sizeof(key), "%sclock", base);
    before = now_us();
    tok = grant(s, key);
    if (tok + SLACK_US < before || tok > now_us() + SLACK_US)
        fail_msg("first token %" PRIu64 " is not within 5 s of the clock %" PRIu64
                 " us", tok, before);
    for (i = 0; i < 5; i++) {
        prev = tok;
        tok = grant(s, key);
        ASSERT_U64_OP(tok, >, prev);
        ASSERT_U64_OP(tok, <=, now_us() + SLACK_US);
    }
}

/* ---- (b) both modes on one key ------------------------------------------- */

static void test_modes_share_one_counter(void **state)
{
    char key[160], cu[600];
    lease_store *counter, *clock;
    uint64_t prev, tok;
    int i;

    (void)state;
    url_with(cu, sizeof(cu), "tokens=counter");
    counter = open_url(cu);
    url_with(cu, sizeof(cu), "tokens=clock");
    clock = open_url(cu);
    snprintf(key, sizeof(key), "%sswitch", base);
    /* A fresh key in counter mode: 1, 2. */
    prev = grant(counter, key);
    ASSERT_U64_OP(prev, ==, 1);
    for (i = 0; i < 8; i++) {
        int by_clock = i % 2 == 0;

        tok = grant(by_clock ? clock : counter, key);
        ASSERT_U64_OP(tok, >, prev);
        if (by_clock)
            ASSERT_U64_OP(tok + SLACK_US, >=, now_us());
        else
            ASSERT_U64_OP(tok, ==, prev + 1);
        prev = tok;
    }
}

/* ---- (c) a clock behind the last token -------------------------------------- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static int clock_behind_lines;
static char clock_behind_line[1024];

static void on_log(lease_log_level level, const char *line, void *payload)
{
    (void)payload;
    if (level == LEASE_LOG_WARN && strstr(line, "\"event\":\"clock_behind\"")) {
        pthread_mutex_lock(&log_mu);
        clock_behind_lines++;
        snprintf(clock_behind_line, sizeof(clock_behind_line), "%s", line);
        pthread_mutex_unlock(&log_mu);
    }
}

/* KEY's counter (the store's layout: lease:{KEY}:token) set to `value`
 * with a plain connection. */
static void set_counter(const char *key, uint64_t value)
{
    char host[256] = "127.0.0.1";
    const char *p = strstr(url, "://"), *colon;
    struct timeval tv = { 5, 0 };
    redisContext *c;
    redisReply *r;
    size_t n;

    /* redis://host:port[/db][?...]: the shared server has no password. */
    assert_non_null(p);
    p += 3;
    colon = strchr(p, ':');
    assert_non_null(colon);
    n = (size_t)(colon - p);
    assert_true(n > 0 && n < sizeof(host));
    memcpy(host, p, n);
    host[n] = '\0';
    c = redisConnectWithTimeout(host, atoi(colon + 1), tv);
    if (c == NULL || c->err)
        fail_msg("cannot connect to %s: %s", url, c ? c->errstr : "out of memory");
    r = redisCommand(c, "SET lease:{%s}:token %" PRIu64, key, value);
    if (r == NULL || r->type == REDIS_REPLY_ERROR)
        fail_msg("SET of the counter failed: %s", r ? r->str : c->errstr);
    freeReplyObject(r);
    redisFree(c);
}

static void test_clock_behind_is_logged_and_counted(void **state)
{
    char key[160], *text = NULL;
    lease_store *s = open_url(url);
    uint64_t ahead = now_us() + UINT64_C(600000000); /* 10 minutes */

    (void)state;
    snprintf(key, sizeof(key), "%sbehind", base);
    set_counter(key, ahead);
    lease_metrics_reset();
    lease_log_set(on_log, NULL, LEASE_LOG_WARN);
    ASSERT_U64_OP(grant(s, key), ==, ahead + 1);
    lease_log_set(NULL, NULL, LEASE_LOG_WARN);

    CHECK_RC(0, lease_metrics_text(&text));
    if (strstr(text, "lease_clock_behind_total{store=\"redis\"} 1\n") == NULL)
        fail_msg("no lease_clock_behind_total{store=\"redis\"} 1 in:\n%s", text);
    free(text);
    pthread_mutex_lock(&log_mu);
    assert_int_equal(clock_behind_lines, 1);
    assert_non_null(strstr(clock_behind_line, key));
    pthread_mutex_unlock(&log_mu);
}

/* ---- (d) an unknown mode ------------------------------------------------------ */

static void test_bogus_mode_refused(void **state)
{
    char u[600];
    lease_store *s = NULL;

    (void)state;
    url_with(u, sizeof(u), "tokens=bogus");
    CHECK_RC(LEASE_EINVALID, lease_store_open(&s, u));
    assert_null(s);
    if (strstr(lease_errmsg(), "tokens=clock") == NULL ||
        strstr(lease_errmsg(), "tokens=counter") == NULL)
        fail_msg("the message does not name tokens=clock|counter: %s",
                 lease_errmsg());
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_clock_tokens_by_default, close_stores),
        cmocka_unit_test_teardown(test_modes_share_one_counter, close_stores),
        cmocka_unit_test_teardown(test_clock_behind_is_logged_and_counted, close_stores),
        cmocka_unit_test_teardown(test_bogus_mode_refused, close_stores),
    };
    char owner[LEASE_OWNER_BUFSZ];

    url = argc > 1 ? argv[1] : getenv("LEASE_TEST_REDIS_URL");
    if (url == NULL || url[0] == '\0') {
        fprintf(stderr, "redis_clock: no server: pass a redis:// URL or set "
                        "LEASE_TEST_REDIS_URL (scripts/test.sh starts one)\n");
        return 1;
    }
    if (strncmp(url, "redis://", 8) != 0 || strchr(url, '@') != NULL) {
        fprintf(stderr, "redis_clock: '%s' is not a redis:// URL without a "
                        "password\n", url);
        return 1;
    }
    lease_owner_new(owner);
    snprintf(base, sizeof(base), "redis_clock/%s/", owner);
    return cmocka_run_group_tests_name("clock", tests, NULL, NULL) ? 1 : 0;
}
