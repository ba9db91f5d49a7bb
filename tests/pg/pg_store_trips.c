/*
 * pg_store_trips.c - round trips per call, counted by a forwarder between
 * the store and the server (bench/forwarder.c: a turn each time the client
 * speaks after the server did). Counts are behaviour, not timing.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "pg_store.h"
#include "../../bench/forwarder.h"

/* A loopback port free a moment ago (the kernel's pick). */
static int free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* A forwarder to conf_url's server; its URL in `url`. */
static void start_forwarder(bench_forwarder *f, char *url, size_t size)
{
    char host[256], port[16];
    int i, lp = -1;

    if (conf_url_hostport(host, sizeof(host), port, sizeof(port), conf_url) != 0)
        fail_msg("no single host:port in the test URL");
    /* The port may be taken between free_port() and the forwarder's bind. */
    for (i = 0; i < 5; i++) {
        lp = free_port();
        if (lp > 0 && bench_forwarder_start(f, lp, host, atoi(port)) == 0)
            break;
        lp = -1;
    }
    if (lp < 0)
        fail_msg("could not start a forwarder");
    if (conf_url_via(url, size, conf_url, lp) != 0)
        fail_msg("could not point the test URL at the forwarder");
}

/*
 * A renewal is one round trip, also when the caller sets the same timeout
 * before each one, as keepers and sessions do (lease_store_set_timeout
 * skips an unchanged value; PostgreSQL would pay a set_config round trip
 * for it). A changed timeout is one more round trip, once, made by the
 * next call within its own bound (not by lease_store_set_timeout, whose
 * round trip a keeper's renewal bound would not count). Acquire and
 * release are one each, and a release of one token in 32 one more: the
 * history's prune (pg.c, history_prune: token % HISTORY_PRUNE_EVERY).
 */
#define PRUNE_EVERY 32
void test_trips_renew_is_one(void **state)
{
    char key[LEASE_KEY_MAX + 1], owner[LEASE_OWNER_BUFSZ], url[1024];
    bench_forwarder f;
    lease_acquire_opts o;
    lease_store *s;
    lease_grant g;
    uint64_t t0;
    int i;

    (void)state;
    conf_key(key, "trips/renew");
    conf_owner(owner);
    start_forwarder(&f, url, sizeof(url));
    CHECK_RC(0, lease_store_open(&s, url));
    o = conf_opts(owner, 30000, NULL, 0);
    t0 = bench_forwarder_turns(&f);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(bench_forwarder_turns(&f) - t0, ==, 1);

    t0 = bench_forwarder_turns(&f);
    CHECK_RC(0, lease_store_set_timeout(s, 4000));
    ASSERT_U64_OP(bench_forwarder_turns(&f) - t0, ==, 0);
    CHECK_RC(0, lease_renew(&g, s, 30000));
    ASSERT_U64_OP(bench_forwarder_turns(&f) - t0, ==, 2);
    t0 = bench_forwarder_turns(&f);
    for (i = 0; i < 5; i++) {
        CHECK_RC(0, lease_store_set_timeout(s, 4000));
        CHECK_RC(0, lease_renew(&g, s, 30000));
    }
    if (bench_forwarder_turns(&f) - t0 != 5)
        fail_msg("5 renewals (each after setting the same timeout) took %llu "
                 "round trips, not 5",
                 (unsigned long long)(bench_forwarder_turns(&f) - t0));

    t0 = bench_forwarder_turns(&f);
    CHECK_RC(0, lease_release(s, &g));
    ASSERT_U64_OP(bench_forwarder_turns(&f) - t0, ==, g.token % PRUNE_EVERY == 0 ? 2 : 1);
    lease_store_close(s);
    bench_forwarder_stop(&f);
}
