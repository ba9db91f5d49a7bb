/*
 * pg_store_clock.c - clock-floored tokens (?tokens=clock, the default): a
 * new grant's token is max(previous + 1, the server's clock in µs), so a
 * standby promoted without the last grants still issues newer tokens.
 * Checked here: tokens follow the clock, handles of both kinds and the
 * reference SQL mix on one key, a clock behind the tokens is reported, the
 * history keeps its bound with tokens that jump, and a bad value is
 * refused. The server runs on this host: its clock is ours.
 */
#include <time.h>

#include <lease/history.h>
#include <lease/log.h>
#include <lease/metrics.h>

#include "pg_store.h"

static uint64_t now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Acquire and release on `s`: the token. */
static uint64_t grant_release(lease_store *s, const char *key)
{
    char owner[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_grant g;

    conf_owner(owner);
    o = conf_opts(owner, 30000, NULL, 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    CHECK_RC(0, lease_release(s, &g));
    return g.token;
}

/* a. By default a token is the server's clock: within a few seconds of
 * ours, and growing. */
void test_clock_tokens_follow_the_clock(void **state)
{
    char key[LEASE_KEY_MAX + 1];
    uint64_t before, t1, t2, after;

    (void)state;
    conf_key(key, "clock/near");
    before = now_us();
    t1 = grant_release(conf_store, key);
    t2 = grant_release(conf_store, key);
    after = now_us();
    ASSERT_U64_OP(t1, >=, before - 5000000);
    ASSERT_U64_OP(t2, <=, after + 5000000);
    ASSERT_U64_OP(t2, >, t1);
}

/* b. One key, handles of both kinds in turn: every token greater than the
 * one before; a counter grant exactly the previous + 1. */
void test_clock_and_counter_handles_mix(void **state)
{
    char key[LEASE_KEY_MAX + 1], *url = url_with(conf_url, "tokens=counter");
    lease_store *counter;
    uint64_t prev = 0, t;
    int i;

    (void)state;
    conf_key(key, "clock/mix");
    CHECK_RC(0, lease_store_open(&counter, url));
    for (i = 0; i < 6; i++) {
        int use_counter = i % 3 != 0; /* clock, counter, counter, clock, ... */

        t = grant_release(use_counter ? counter : conf_store, key);
        ASSERT_U64_OP(t, >, prev);
        if (use_counter && prev != 0)
            ASSERT_U64_OP(t, ==, prev + 1);
        if (!use_counter)
            ASSERT_U64_OP(t, >, now_us() - 5000000);
        prev = t;
    }
    lease_store_close(counter);
    free(url);
}

/* c. The reference SQL's "+ 1" after a clock grant, and a clock grant
 * after it, on the table lease made. */
void test_clock_refsql_interop(void **state)
{
    char key[LEASE_KEY_MAX + 1], r1[LEASE_OWNER_BUFSZ];
    uint64_t t, rt;
    PGconn *c;

    (void)state;
    conf_key(key, "clock/refsql");
    conf_owner(r1);
    c = raw_connect(conf_url);
    t = grant_release(conf_store, key);
    rt = refsql_acquire(c, key, r1, "30 seconds");
    ASSERT_U64_OP(rt, ==, t + 1);
    assert_int_equal(refsql_rows(c, REFSQL_RELEASE, 3, key, r1, rt, NULL), 1);
    t = grant_release(conf_store, key);
    ASSERT_U64_OP(t, >, rt);
    ASSERT_U64_OP(t, >, now_us() - 5000000);
    PQfinish(c);
}

static int behind_lines;

static void count_clock_behind(lease_log_level level, const char *line, void *payload)
{
    (void)payload;
    if (level == LEASE_LOG_WARN && strstr(line, "\"clock_behind\"") != NULL)
        behind_lines++;
}

/* d. A token 10 minutes ahead of the clock (set by hand): the next grant
 * is that + 1, counted and logged as clock_behind. */
void test_clock_behind_is_reported(void **state)
{
    char key[LEASE_KEY_MAX + 1], ahead[24], *text;
    const char *v[2];
    uint64_t t;

    (void)state;
    conf_key(key, "clock/behind");
    (void)grant_release(conf_store, key);
    {
        PGconn *c = raw_connect(conf_url);

        snprintf(ahead, sizeof(ahead), "%" PRIu64, now_us() + 600000000u);
        v[0] = key;
        v[1] = ahead;
        PQclear(raw_exec(c, PGRES_COMMAND_OK, "UPDATE coordination_lease SET "
                         "fencing_token = $2::bigint WHERE resource_key = $1", 2, v));
        PQfinish(c);
    }
    lease_metrics_reset();
    behind_lines = 0;
    lease_log_set(count_clock_behind, NULL, LEASE_LOG_WARN);
    t = grant_release(conf_store, key);
    lease_log_set(NULL, NULL, LEASE_LOG_WARN);
    ASSERT_U64_OP(t, ==, strtoull(ahead, NULL, 10) + 1);
    assert_int_equal(behind_lines, 1);
    CHECK_RC(0, lease_metrics_text(&text));
    if (strstr(text, "lease_clock_behind_total{store=\"postgres\"} 1\n") == NULL)
        fail_msg("lease_clock_behind_total{store=\"postgres\"} is not 1:\n%s", text);
    free(text);
}

/* e. More than LEASE_HISTORY_KEEP grants with clock tokens (which jump):
 * exactly KEEP entries stay, the newest, and each earlier one reads as it
 * ended (released, or expired for the short ones). */
void test_clock_history_bound(void **state)
{
    char key[LEASE_KEY_MAX + 1], owner[LEASE_OWNER_BUFSZ];
    uint64_t tokens[LEASE_HISTORY_KEEP + 5];
    lease_history_entry *h;
    lease_acquire_opts o;
    lease_grant g;
    size_t n, i, total = sizeof(tokens) / sizeof(tokens[0]);

    (void)state;
    conf_key(key, "clock/history");
    for (i = 0; i < total; i++) {
        conf_owner(owner);
        /* Every 10th grant expires (a short ttl, waited out) instead. */
        o = conf_opts(owner, i % 10 == 5 ? 100 : 30000, NULL, 0);
        CHECK_RC(0, lease_acquire(&g, NULL, conf_store, key, &o));
        tokens[i] = g.token;
        if (i % 10 == 5)
            (void)conf_wait_free(key, 100);
        else if (i + 1 < total)
            CHECK_RC(0, lease_release(conf_store, &g));
    }
    CHECK_RC(0, lease_history(&h, &n, conf_store, key, LEASE_HISTORY_READ_MAX));
    assert_int_equal(n, LEASE_HISTORY_KEEP);
    for (i = 0; i < n; i++) {
        size_t k = total - 1 - i; /* newest first */
        lease_ended want = i == 0 ? LEASE_ENDED_HELD
                         : k % 10 == 5 ? LEASE_ENDED_EXPIRED : LEASE_ENDED_RELEASED;

        ASSERT_U64_OP(h[i].token, ==, tokens[k]);
        if (h[i].ended != want)
            fail_msg("grant %zu (token %" PRIu64 "): ended %d, expected %d", k,
                     tokens[k], (int)h[i].ended, (int)want);
    }
    lease_history_free(h);
    CHECK_RC(0, lease_release(conf_store, &g));
}

/* f. tokens= takes clock or counter only. */
void test_clock_bad_tokens_param(void **state)
{
    static const char *const bad[] = { "tokens=bogus", "tokens=", "tokens=Clock" };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_open_einvalid(conf_url, bad[i]);
}
