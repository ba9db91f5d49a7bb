/*
 * pg_failover_client.c - the client of the failover test (pg_failover.sh).
 *
 *     pg_failover_client URL CTLDIR BOUND_S
 *
 * Opens URL (a multi-host URL with target_session_attrs=read-write) and,
 * until CTLDIR/stop appears or BOUND_S seconds have passed, acquires one
 * key with a fresh owner each time and releases it again. One line per
 * attempt on stdout:
 *
 *   OK <token> <phase> <ms>    acquire returned LEASE_OK with <token>
 *   ERR <code> <ms> <message>  anything else (ESTORE while the primary is
 *                              gone and the standby not yet promoted)
 *
 * <ms> is the wall clock (CLOCK_REALTIME, ms since the epoch), only to
 * line the events up with the test script's; <phase> says when the
 * acknowledgement came, against the markers the test creates:
 * CTLDIR/killing just before it kills the primary, CTLDIR/promoted once
 * `pg_ctl promote` returned:
 *   old   no "killing" yet when the answer had arrived: the old primary's
 *   pre   "killing" but no "promoted" yet when the answer had arrived
 *   post  "promoted" existed before the acquire was sent
 *   mid   sent before "promoted", answered after
 * A fresh owner each time: a retried acquire by the owner that already
 * holds the lease gets the same token by contract, which is not a new
 * grant.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lease.h"

static int exists(const char *dir, const char *name)
{
    char path[4096];
    struct stat st;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

static long long now_ms(void)
{
    return (long long)(lease_clock_ns() / 1000000);
}

static long long wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    char owner[LEASE_OWNER_BUFSZ], key[LEASE_KEY_MAX + 1], id[LEASE_OWNER_BUFSZ];
    const char *url, *ctl;
    lease_store *s = NULL;
    long long start, bound;
    int rc, i;

    if (argc != 4) {
        fprintf(stderr, "usage: %s URL CTLDIR BOUND_S\n", argv[0]);
        return 2;
    }
    url = argv[1];
    ctl = argv[2];
    bound = atoll(argv[3]) * 1000;
    start = now_ms();
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (lease_owner_new(id) != 0)
        return 1;
    snprintf(key, sizeof(key), "failover/%s", id);

    /* The primary is up when we start; still, bounded retries. */
    for (i = 0; i < 50 && (rc = lease_store_open_timeout(&s, url, 2000)) != 0; i++)
        sleep_ms(100);
    if (s == NULL) {
        fprintf(stderr, "cannot open the store: %s\n", lease_errmsg());
        return 1;
    }
    fprintf(stderr, "# client on %s, key %s\n", lease_store_url_redacted(s), key);

    while (!exists(ctl, "stop") && now_ms() - start < bound) {
        lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
        lease_grant g;
        int before, after, killing;

        if (lease_owner_new(owner) != 0)
            return 1;
        o.owner = owner;
        o.ttl_ms = 2000;
        /* A lease left held by a release lost in the failover ends
         * within its ttl: wait that long for it. */
        o.wait_ms = 3000;
        before = exists(ctl, "promoted");
        rc = lease_acquire(&g, NULL, s, key, &o);
        killing = exists(ctl, "killing");
        after = exists(ctl, "promoted");
        if (rc == 0) {
            printf("OK %llu %s %lld\n", (unsigned long long)g.token,
                   before ? "post" : after ? "mid" : killing ? "pre" : "old",
                   wall_ms());
            (void)lease_release(s, &g);
        } else {
            printf("ERR %s %lld %s\n", lease_error_name(rc), wall_ms(),
                   lease_errmsg());
            sleep_ms(20);
        }
    }
    lease_store_close(s);
    return 0;
}
