/*
 * etcd_client.c - the etcd tests that need the public API itself (cmocka),
 * driven by the bash scripts of this directory, which start and stop the
 * etcd members:
 *
 *   etcd_client quorum URL KILL_CMD TOKEN_FILE
 *       Handles opened while the cluster is healthy; then KILL_CMD (run
 *       with sh -c) kills two of the three members. Every operation on the
 *       open handles must fail with LEASE_ESTORE (ownership uncertain),
 *       never EBUSY, ELOST, ENOTFOUND, ETIMEOUT or success; a keeper loses
 *       with LEASE_ESTORE. TOKEN_FILE receives the greatest token issued
 *       before the kill.
 *
 *   etcd_client ttl URL
 *       etcd leases are whole seconds with a server minimum: a 200 ms ttl
 *       is granted (and reported) rounded up, and the holder's local
 *       deadline comes from the granted ttl.
 *
 *   etcd_client unreachable HOST:PORT
 *       A member that cannot be reached because its connect times out (a
 *       host that is down drops the SYN, it does not refuse it) must not
 *       stop a request: etcd://<unreachable>,HOST:PORT must work.
 *
 * No assertion is about how long something took; the durations printed
 * are for people.
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <fcntl.h>

#include <cmocka.h>

#include "lease/errors.h"
#include "lease/types.h"
#include "lease/store.h"
#include "lease/lease.h"
#include "lease/fence.h"
#include "lease/keeper.h"

#include "conf_assert.h"

static int64_t now_ms(void)
{
    return lease_clock_ns() / 1000000;
}

static void sleep_ms(int64_t ms)
{
    struct timespec ts;

    if (ms <= 0)
        return;
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)(ms % 1000) * 1000000;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static const char *url;
static char prefix[64]; /* "<mode>/<uuid>/": runs never meet */

static void key_of(char out[LEASE_KEY_MAX + 1], const char *name)
{
    snprintf(out, LEASE_KEY_MAX + 1, "%s%s", prefix, name);
}

static lease_acquire_opts opts(const char *owner, uint64_t ttl_ms, uint64_t wait_ms)
{
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;

    o.owner = owner;
    o.ttl_ms = ttl_ms;
    o.label = "etcd-client";
    o.wait_ms = wait_ms;
    return o;
}

/* ======================================================================
 * quorum: two of three members gone
 * ====================================================================== */

#define OP_TIMEOUT_MS 1500

static const char *kill_cmd, *token_file;
static lease_store *qs;       /* opened while the cluster was healthy */
static char owner_a[LEASE_OWNER_BUFSZ], owner_b[LEASE_OWNER_BUFSZ];
static char held_key[LEASE_KEY_MAX + 1], res_key[LEASE_KEY_MAX + 1];
static lease_grant held;      /* owner_a's grant of held_key */
static lease_keeper *keeper;
static atomic_int lost_reason; /* set once by the keeper's thread */
static uint64_t max_token;

static void on_lost(lease_keeper *k, int reason, void *payload)
{
    (void)k;
    (void)payload;
    atomic_store(&lost_reason, reason);
}

static void test_quorum_before(void **state)
{
    char kept_key[LEASE_KEY_MAX + 1];
    lease_acquire_opts o;
    lease_keeper_opts ko = LEASE_KEEPER_OPTS_INIT;
    lease_grant kept;
    uint64_t mark = 0;
    FILE *f;

    (void)state;
    CHECK_RC(0, lease_store_open_timeout(&qs, url, OP_TIMEOUT_MS));
    CHECK_RC(0, lease_owner_new(owner_a));
    CHECK_RC(0, lease_owner_new(owner_b));
    key_of(held_key, "held");
    key_of(res_key, "res");
    key_of(kept_key, "kept");

    /* A long ttl: the lease outlives the outage (etcd keeps it). */
    o = opts(owner_a, 600000, 0);
    CHECK_RC(0, lease_acquire(&held, NULL, qs, held_key, &o));
    CHECK_RC(0, lease_fence_advance(&mark, qs, res_key, held.token));
    CHECK_RC(0, lease_guarded_put(qs, &held, res_key, "v1", 2));

    /* A keeper on its own connection, renewing every second. */
    o = opts(owner_a, 3000, 0);
    CHECK_RC(0, lease_acquire(&kept, NULL, qs, kept_key, &o));
    ko.on_lost = on_lost;
    CHECK_RC(0, lease_keeper_start(&keeper, qs, &kept, &ko));
    assert_int_equal(lease_keeper_valid(keeper), 1);

    max_token = held.token > kept.token ? held.token : kept.token;
    f = fopen(token_file, "w");
    assert_non_null(f);
    fprintf(f, "%" PRIu64 "\n", max_token);
    fclose(f);
    printf("tokens before the kill: held %" PRIu64 ", kept %" PRIu64 "\n",
           held.token, kept.token);

    printf("killing two members: %s\n", kill_cmd);
    fflush(stdout);
    assert_int_equal(system(kill_cmd), 0);
}

/* Every call below must fail with ESTORE and a message; the time each one
 * took is printed, not asserted. */
#define EXPECT_ESTORE(call)                                                   \
    do {                                                                      \
        int64_t t0_ = now_ms();                                               \
        int rc_;                                                              \
        lease_error_clear();                                                  \
        rc_ = (call);                                                         \
        printf("  %-60.60s -> %s after %" PRId64 " ms\n", #call,             \
               lease_error_name(rc_), now_ms() - t0_);                        \
        fflush(stdout);                                                       \
        if (rc_ != LEASE_ESTORE)                                              \
            fail_msg("%s returned %s (%d), expected ESTORE; errmsg: %s",      \
                     #call, lease_error_name(rc_), rc_, lease_errmsg());      \
        if (lease_errmsg()[0] == '\0')                                        \
            fail_msg("%s gave ESTORE without a message", #call);              \
    } while (0)

static void test_quorum_ops_estore(void **state)
{
    char fresh[LEASE_KEY_MAX + 1];
    lease_acquire_opts o;
    lease_grant g;
    lease_info info, *list = NULL;
    lease_store *s2 = NULL;
    size_t n = 0, len = 0;
    uint64_t mark = 0, tok = 0;
    void *value = NULL;

    (void)state;
    key_of(fresh, "fresh");
    o = opts(owner_b, 30000, 0);
    EXPECT_ESTORE(lease_acquire(&g, NULL, qs, fresh, &o));
    /* Held by another owner: still ESTORE, never "busy" from a guess. */
    EXPECT_ESTORE(lease_acquire(&g, NULL, qs, held_key, &o));
    /* The holder retrying its acquire. */
    o = opts(owner_a, 600000, 0);
    EXPECT_ESTORE(lease_acquire(&g, NULL, qs, held_key, &o));
    /* With a wait: the wait ends on a store failure, never ETIMEOUT. */
    o = opts(owner_b, 30000, 1000);
    EXPECT_ESTORE(lease_acquire(&g, NULL, qs, fresh, &o));
    g = held;
    EXPECT_ESTORE(lease_renew(&g, qs, 0));
    EXPECT_ESTORE(lease_release(qs, &held));
    EXPECT_ESTORE(lease_inspect(&info, qs, held_key));
    EXPECT_ESTORE(lease_list(&list, &n, qs, prefix));
    lease_list_free(list);
    EXPECT_ESTORE(lease_fence_advance(&mark, qs, res_key, held.token));
    EXPECT_ESTORE(lease_fence_mark(&mark, qs, res_key));
    EXPECT_ESTORE(lease_guarded_put(qs, &held, res_key, "v2", 2));
    EXPECT_ESTORE(lease_data_get(&value, &len, &tok, qs, res_key));
    free(value);
    /* A new handle cannot be opened either. */
    EXPECT_ESTORE(lease_store_open_timeout(&s2, url, OP_TIMEOUT_MS));
    assert_null(s2);
}

static void test_quorum_keeper_lost(void **state)
{
    int64_t end = now_ms() + 30000; /* bounded; the keeper's ttl is 3 s */

    (void)state;
    /* The state turns LOST just before on_lost runs: wait for both. */
    while ((lease_keeper_state_get(keeper) == LEASE_KEEPER_HELD ||
            atomic_load(&lost_reason) == 0) && now_ms() < end)
        sleep_ms(20);
    assert_int_equal(lease_keeper_state_get(keeper), LEASE_KEEPER_LOST);
    assert_int_equal(atomic_load(&lost_reason), LEASE_ESTORE);
    assert_int_equal(lease_keeper_valid(keeper), 0);
    assert_int_equal(lease_keeper_remaining_ms(keeper), 0);
    lease_keeper_stop(NULL, keeper, 0);
    keeper = NULL;
    lease_store_close(qs);
    qs = NULL;
}

/* ======================================================================
 * ttl: rounded up to etcd's granularity, and the deadline follows it
 * ====================================================================== */

/* The grant's deadline comes from `granted`, sent between t0 and t1:
 * at least half of it lies after t0 (a safety margin is taken off, never
 * half), and none of it beyond t1 + granted. A deadline computed from a
 * 200 ms ttl fails the first unless the call itself took ~800 ms or more. */
static void check_deadline(const lease_grant *g, int64_t t0, int64_t t1)
{
    int64_t granted_ns = (int64_t)g->ttl_ms * 1000000;

    ASSERT_I64_OP(g->deadline_ns - t0, >=, granted_ns / 2);
    ASSERT_I64_OP(g->deadline_ns - t1, <=, granted_ns);
}

static void test_ttl_rounding(void **state)
{
    char key[LEASE_KEY_MAX + 1], owner[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_keeper *k = NULL;
    lease_store *s;
    lease_grant g, last;
    lease_info info;
    int64_t t0, t1, first_deadline, end;
    static const uint64_t asked[] = { 1, 200, 999, 1000, 1001, 2500 };
    size_t i;

    (void)state;
    CHECK_RC(0, lease_store_open(&s, url));
    for (i = 0; i < sizeof(asked) / sizeof(asked[0]); i++) {
        char name[32];

        snprintf(name, sizeof(name), "k%" PRIu64, asked[i]);
        key_of(key, name);
        CHECK_RC(0, lease_owner_new(owner));
        o = opts(owner, asked[i], 0);
        t0 = lease_clock_ns();
        CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
        t1 = lease_clock_ns();
        printf("asked %" PRIu64 " ms, granted %" PRIu64 " ms\n", asked[i], g.ttl_ms);
        /* Rounded up, to whole seconds, at least etcd's 1 s. */
        ASSERT_U64_OP(g.ttl_ms, >=, asked[i]);
        ASSERT_U64_OP(g.ttl_ms, >=, 1000);
        ASSERT_U64_OP(g.ttl_ms % 1000, ==, 0);
        check_deadline(&g, t0, t1);
        /* The store reports the granted ttl too. */
        CHECK_RC(0, lease_inspect(&info, s, key));
        assert_int_equal(info.held, 1);
        ASSERT_U64_OP(info.token, ==, g.token);
        ASSERT_U64_OP(info.ttl_ms, ==, g.ttl_ms);
        ASSERT_U64_OP(info.remaining_ms, <=, g.ttl_ms);
        CHECK_RC(0, lease_release(s, &g));
    }

    /* Renew with a short ttl: rounded up the same way. */
    key_of(key, "renew");
    CHECK_RC(0, lease_owner_new(owner));
    o = opts(owner, 200, 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    t0 = lease_clock_ns();
    CHECK_RC(0, lease_renew(&g, s, 200));
    t1 = lease_clock_ns();
    ASSERT_U64_OP(g.ttl_ms, >=, 1000);
    ASSERT_U64_OP(g.ttl_ms % 1000, ==, 0);
    check_deadline(&g, t0, t1);

    /* A keeper of a grant asked with 200 ms holds it past the first
     * deadline: it renews on the granted ttl's schedule. */
    first_deadline = g.deadline_ns;
    CHECK_RC(0, lease_keeper_start(&k, s, &g, NULL));
    end = now_ms() + 30000;
    while (lease_clock_ns() < first_deadline + 500 * 1000000LL && now_ms() < end &&
           lease_keeper_state_get(k) == LEASE_KEEPER_HELD)
        sleep_ms(20);
    assert_int_equal(lease_keeper_state_get(k), LEASE_KEEPER_HELD);
    assert_int_equal(lease_keeper_valid(k), 1);
    ASSERT_I64_OP(lease_keeper_deadline_ns(k), >, first_deadline);
    CHECK_RC(0, lease_keeper_stop(&last, k, 1));
    ASSERT_U64_OP(last.ttl_ms, >=, 1000);
    CHECK_RC(0, lease_inspect(&info, s, key));
    assert_int_equal(info.held, 0);
    lease_store_close(s);
}

/* ======================================================================
 * unreachable: a member whose connect times out
 * ====================================================================== */

static int blackhole_fd = -1;
static int filler_fd[8];
static char blackhole_url[256];

/* A loopback port whose connects time out: a listener with a backlog of 0
 * whose queue is full (nobody accepts) drops new SYNs, as a host that is
 * down would. Checked with a probe that must not connect. */
static void make_blackhole(uint16_t *port)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    struct pollfd p;
    int probe, i, r;

    blackhole_fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(blackhole_fd >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(blackhole_fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(blackhole_fd, 0), 0);
    assert_int_equal(getsockname(blackhole_fd, (struct sockaddr *)&a, &alen), 0);
    *port = ntohs(a.sin_port);
    for (i = 0; i < 8; i++) {
        filler_fd[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        assert_true(filler_fd[i] >= 0);
        r = connect(filler_fd[i], (struct sockaddr *)&a, sizeof(a));
        assert_true(r == 0 || errno == EINPROGRESS);
    }
    sleep_ms(100);
    probe = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    assert_true(probe >= 0);
    r = connect(probe, (struct sockaddr *)&a, sizeof(a));
    if (r == 0)
        fail_msg("the probe connected at once: cannot make an unreachable port here");
    assert_int_equal(errno, EINPROGRESS);
    p.fd = probe;
    p.events = POLLOUT;
    p.revents = 0;
    r = poll(&p, 1, 500);
    if (r != 0)
        fail_msg("the probe's connect ended within 500 ms (revents 0x%x): this "
                 "kernel does not drop SYNs to a full listen queue, so the test "
                 "cannot make an unreachable member", p.revents);
    close(probe);
}

static void test_unreachable_member(void **state)
{
    char key[LEASE_KEY_MAX + 1], owner[LEASE_OWNER_BUFSZ];
    const char *live = *state;
    lease_acquire_opts o;
    lease_store *s = NULL;
    lease_grant g;
    lease_info info;
    uint16_t port;
    int64_t t0;
    int rc;

    make_blackhole(&port);
    snprintf(blackhole_url, sizeof(blackhole_url), "etcd://127.0.0.1:%u,%s",
             (unsigned)port, live);
    printf("URL %s (the first member's connects time out)\n", blackhole_url);
    key_of(key, "k");
    CHECK_RC(0, lease_owner_new(owner));

    /* 3 s for the whole call: the first member gets its share of it to
     * connect (the store divides the time left among the members). */
    t0 = now_ms();
    rc = lease_store_open_timeout(&s, blackhole_url, 3000);
    printf("open -> %s after %" PRId64 " ms: %s\n", lease_error_name(rc),
           now_ms() - t0, rc ? lease_errmsg() : "");
    if (rc != 0)
        fail_msg("opening %s failed with %s: a member whose connect timed out "
                 "was not skipped (%s)", blackhole_url, lease_error_name(rc),
                 lease_errmsg());
    o = opts(owner, 30000, 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    CHECK_RC(0, lease_inspect(&info, s, key));
    assert_string_equal(info.owner, owner);
    CHECK_RC(0, lease_release(s, &g));
    lease_store_close(s);
}

static int unreachable_teardown(void **state)
{
    int i;

    (void)state;
    for (i = 0; i < 8; i++)
        if (filler_fd[i] > 0)
            close(filler_fd[i]);
    if (blackhole_fd >= 0)
        close(blackhole_fd);
    return 0;
}

/* ====================================================================== */

static int usage(void)
{
    fprintf(stderr, "usage: etcd_client quorum URL KILL_CMD TOKEN_FILE\n"
                    "       etcd_client ttl URL\n"
                    "       etcd_client unreachable HOST:PORT\n");
    return 2;
}

int main(int argc, char **argv)
{
    char uuid[LEASE_OWNER_BUFSZ];

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3)
        return usage();
    if (lease_owner_new(uuid) != 0)
        return 1;
    snprintf(prefix, sizeof(prefix), "etcd-%s/%s/", argv[1], uuid);

    if (strcmp(argv[1], "quorum") == 0 && argc == 5) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_quorum_before),
            cmocka_unit_test(test_quorum_ops_estore),
            cmocka_unit_test(test_quorum_keeper_lost),
        };
        url = argv[2];
        kill_cmd = argv[3];
        token_file = argv[4];
        return cmocka_run_group_tests_name("etcd quorum loss", tests, NULL, NULL);
    }
    if (strcmp(argv[1], "ttl") == 0 && argc == 3) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_ttl_rounding),
        };
        url = argv[2];
        return cmocka_run_group_tests_name("etcd ttl rounding", tests, NULL, NULL);
    }
    if (strcmp(argv[1], "unreachable") == 0 && argc == 3) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test_prestate_setup_teardown(test_unreachable_member, NULL,
                                                     unreachable_teardown, argv[2]),
        };
        return cmocka_run_group_tests_name("etcd unreachable member", tests, NULL, NULL);
    }
    return usage();
}
