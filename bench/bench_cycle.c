/*
 * bench_cycle.c - acquire + release cycles per second, the figure the
 * yardsticks in bench/compare.sh (pgbench, redis-benchmark, redis-py,
 * python-etcd3) are measured by.
 *
 *   usage: bench_cycle --store URL [--clients C] [--seconds S]
 *                      [--keys K] [--ttl-ms T] [--prefix P]
 *
 * C processes, each with its own store handle and owner, loop
 * lease_acquire + lease_release for S seconds. Client c's i-th cycle
 * uses key P/k<(c * K / C + i) % K>, so clients walk disjoint windows of
 * the key space and rarely meet; a meeting is counted as busy, not as a
 * cycle. Prints one line:
 *
 *   cycles_per_s=N cycles=N busy=N seconds=S clients=C
 *
 * Figures only: nothing here asserts a timing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_args.h"
#include "lease.h"

struct counts {
    long long cycles;
    long long busy;
};

static void usage(void)
{
    fprintf(stderr, "usage: bench_cycle --store URL [--clients C] [--seconds S] "
                    "[--keys K] [--ttl-ms T] [--prefix P]\n");
    exit(2);
}

static void client(int fd, const char *url, const char *prefix, int c, int clients,
                   int keys, int64_t ttl_ms, int64_t end_ns)
{
    char owner[LEASE_OWNER_BUFSZ], key[256];
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    struct counts n = { 0, 0 };
    lease_store *s;
    lease_grant g;
    long long i;

    if (lease_store_open(&s, url) < 0) {
        fprintf(stderr, "bench_cycle: %s\n", lease_errmsg());
        _exit(1);
    }
    lease_owner_new(owner);
    o.owner = owner;
    o.ttl_ms = ttl_ms;
    for (i = 0; lease_clock_ns() < end_ns; i++) {
        int rc;

        snprintf(key, sizeof(key), "%s/k%lld", prefix,
                 ((long long)c * keys / clients + i) % keys);
        rc = lease_acquire(&g, NULL, s, key, &o);
        if (rc == LEASE_EBUSY) {
            n.busy++;
            continue;
        }
        if (rc < 0 || lease_release(s, &g) < 0) {
            fprintf(stderr, "bench_cycle: %s\n", lease_errmsg());
            _exit(1);
        }
        n.cycles++;
    }
    lease_store_close(s);
    if (write(fd, &n, sizeof(n)) != (ssize_t)sizeof(n))
        _exit(1);
    _exit(0);
}

int main(int argc, char **argv)
{
    const char *url = NULL, *prefix = NULL;
    long clients = 1, seconds = 5, keys = 1000, ttl_ms = 30000;
    char dflt[64], owner[LEASE_OWNER_BUFSZ];
    struct counts total = { 0, 0 };
    int64_t t0, end_ns;
    int fds[2], failed = 0, i, st;

    for (i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            usage();
        if (strcmp(argv[i], "--store") == 0)
            url = argv[++i];
        else if (strcmp(argv[i], "--clients") == 0)
            clients = bench_arg_long("bench_cycle", argv[++i], 1, 256);
        else if (strcmp(argv[i], "--seconds") == 0)
            seconds = bench_arg_long("bench_cycle", argv[++i], 1, 3600);
        else if (strcmp(argv[i], "--keys") == 0)
            keys = bench_arg_long("bench_cycle", argv[++i], 1, 10000000);
        else if (strcmp(argv[i], "--ttl-ms") == 0)
            ttl_ms = bench_arg_long("bench_cycle", argv[++i], 1, 86400000);
        else if (strcmp(argv[i], "--prefix") == 0)
            prefix = argv[++i];
        else
            usage();
    }
    if (url == NULL)
        usage();
    if (prefix == NULL) {
        lease_owner_new(owner);
        snprintf(dflt, sizeof(dflt), "cycle/%.8s", owner);
        prefix = dflt;
    }
    if (pipe(fds) != 0) {
        perror("bench_cycle: pipe");
        return 1;
    }
    t0 = lease_clock_ns();
    end_ns = t0 + (int64_t)seconds * 1000000000;
    for (i = 0; i < clients; i++) {
        pid_t pid = fork();

        if (pid < 0) {
            perror("bench_cycle: fork");
            return 1;
        }
        if (pid == 0) {
            close(fds[0]);
            client(fds[1], url, prefix, i, (int)clients, (int)keys, ttl_ms, end_ns);
        }
    }
    close(fds[1]);
    for (i = 0; i < clients; i++) {
        struct counts n;

        if (read(fds[0], &n, sizeof(n)) != (ssize_t)sizeof(n)) {
            failed = 1;
            break;
        }
        total.cycles += n.cycles;
        total.busy += n.busy;
    }
    close(fds[0]);
    while (wait(&st) > 0)
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed = 1;
    if (failed) {
        fprintf(stderr, "bench_cycle: a client failed\n");
        return 1;
    }
    printf("cycles_per_s=%.0f cycles=%lld busy=%lld seconds=%.2f clients=%ld\n",
           (double)total.cycles / ((double)(lease_clock_ns() - t0) / 1e9), total.cycles,
           total.busy, (double)(lease_clock_ns() - t0) / 1e9, clients);
    return 0;
}
