/*
 * bench_lease.c - how fast a store grants, renews, releases and fences.
 *
 *   usage: bench_lease [--store URL] [--ops N] [--procs P]
 *
 * Prints latency percentiles per operation for one process, then the
 * throughput of P processes contending for P distinct keys and for one
 * shared key. Figures only: nothing here asserts a timing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lease.h"

static const char *url;
static int ops = 2000;
static int procs = 4;

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

static void report(const char *what, int64_t *lat, int n)
{
    int64_t total = 0;
    int i;

    for (i = 0; i < n; i++)
        total += lat[i];
    qsort(lat, (size_t)n, sizeof(*lat), cmp_i64);
    printf("%-22s n=%-6d mean %8.1f us  p50 %8.1f us  p99 %8.1f us  max %8.1f us\n",
           what, n, (double)total / n / 1e3, (double)lat[n / 2] / 1e3,
           (double)lat[(n * 99) / 100] / 1e3, (double)lat[n - 1] / 1e3);
}

static lease_store *open_or_die(void)
{
    lease_store *s;

    if (lease_store_open(&s, url) < 0) {
        fprintf(stderr, "bench_lease: %s\n", lease_errmsg());
        exit(1);
    }
    return s;
}

static void single(const char *prefix)
{
    lease_store *s = open_or_die();
    int64_t *acq = calloc((size_t)ops, sizeof(int64_t));
    int64_t *ren = calloc((size_t)ops, sizeof(int64_t));
    int64_t *rel = calloc((size_t)ops, sizeof(int64_t));
    int64_t *fen = calloc((size_t)ops, sizeof(int64_t));
    char owner[LEASE_OWNER_BUFSZ], key[128], res[128];
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    lease_grant g;
    int i;

    lease_owner_new(owner);
    o.owner = owner;
    o.ttl_ms = 10000;
    snprintf(key, sizeof(key), "%s/single", prefix);
    snprintf(res, sizeof(res), "%s/resource", prefix);
    for (i = 0; i < ops; i++) {
        int64_t t = lease_clock_ns();
        if (lease_acquire(&g, NULL, s, key, &o) < 0)
            goto fail;
        acq[i] = lease_clock_ns() - t;
        t = lease_clock_ns();
        if (lease_renew(&g, s, 0) < 0)
            goto fail;
        ren[i] = lease_clock_ns() - t;
        t = lease_clock_ns();
        if (lease_fence_advance(NULL, s, res, g.token) < 0)
            goto fail;
        fen[i] = lease_clock_ns() - t;
        t = lease_clock_ns();
        if (lease_release(s, &g) < 0)
            goto fail;
        rel[i] = lease_clock_ns() - t;
    }
    report("acquire", acq, ops);
    report("renew", ren, ops);
    report("fence_advance", fen, ops);
    report("release", rel, ops);
    free(acq);
    free(ren);
    free(rel);
    free(fen);
    lease_store_close(s);
    return;
fail:
    fprintf(stderr, "bench_lease: %s\n", lease_errmsg());
    exit(1);
}

/* P processes, each acquiring and releasing its own key, or all the same
 * key; prints grants per second over all processes. */
static void contended(const char *prefix, int shared)
{
    int64_t t0 = lease_clock_ns();
    int p, granted = 0, busy = 0;
    int fds[2];

    if (pipe(fds) != 0)
        exit(1);
    for (p = 0; p < procs; p++) {
        if (fork() == 0) {
            lease_store *s = open_or_die();
            char owner[LEASE_OWNER_BUFSZ], key[128];
            lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
            lease_grant g;
            int counts[2] = { 0, 0 }, i;

            lease_owner_new(owner);
            o.owner = owner;
            o.ttl_ms = 10000;
            if (shared)
                snprintf(key, sizeof(key), "%s/shared", prefix);
            else
                snprintf(key, sizeof(key), "%s/own-%d", prefix, p);
            for (i = 0; i < ops / procs; i++) {
                int rc = lease_acquire(&g, NULL, s, key, &o);
                if (rc == 0) {
                    counts[0]++;
                    lease_release(s, &g);
                } else if (rc == LEASE_EBUSY) {
                    counts[1]++;
                } else {
                    fprintf(stderr, "bench_lease: %s\n", lease_errmsg());
                    _exit(1);
                }
            }
            if (write(fds[1], counts, sizeof(counts)) != sizeof(counts))
                _exit(1);
            lease_store_close(s);
            _exit(0);
        }
    }
    close(fds[1]);
    for (p = 0; p < procs; p++) {
        int counts[2];
        if (read(fds[0], counts, sizeof(counts)) == sizeof(counts)) {
            granted += counts[0];
            busy += counts[1];
        }
    }
    close(fds[0]);
    while (wait(NULL) > 0)
        ;
    printf("%d procs, %-11s %8.0f attempts/s  (%d granted, %d busy)\n", procs,
           shared ? "one key:" : "own keys:",
           (granted + busy) / ((double)(lease_clock_ns() - t0) / 1e9), granted,
           busy);
}

int main(int argc, char **argv)
{
    char prefix[64], owner[LEASE_OWNER_BUFSZ], dflt[256];
    int i;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--store") == 0 && i + 1 < argc)
            url = argv[++i];
        else if (strcmp(argv[i], "--ops") == 0 && i + 1 < argc)
            ops = atoi(argv[++i]);
        else if (strcmp(argv[i], "--procs") == 0 && i + 1 < argc)
            procs = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_lease [--store URL] [--ops N] [--procs P]\n");
            return 2;
        }
    }
    if (ops < 10 || procs < 1 || procs > 64) {
        fprintf(stderr, "bench_lease: --ops must be >= 10, --procs 1..64\n");
        return 2;
    }
    if (url == NULL) {
        snprintf(dflt, sizeof(dflt), "sqlite:///tmp/lease-bench-%ld.db", (long)getpid());
        url = dflt;
    }
    lease_owner_new(owner);
    snprintf(prefix, sizeof(prefix), "bench/%.8s", owner);
    {
        lease_store *s = open_or_die();
        printf("store %s\n", lease_store_url_redacted(s));
        lease_store_close(s);
    }
    single(prefix);
    contended(prefix, 0);
    contended(prefix, 1);
    return 0;
}
