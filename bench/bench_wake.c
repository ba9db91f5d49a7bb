/*
 * bench_wake.c - how soon a waiting acquire takes a key over after its
 * holder releases it: the figure a local notification (the SQLite store's
 * wake files) is there to shrink.
 *
 *   usage: bench_wake --store URL [--rounds N] [--hold-ms H] [--key K]
 *
 * The parent is the holder, a forked child the waiter, each with its own
 * store handle. Each round: the holder acquires K, tells the waiter to
 * start a waiting acquire (wait 30 s, default backoff), holds the key for
 * a random H/10..H ms (so the release falls anywhere in the waiter's
 * backoff), releases it and notes when lease_release returned; the waiter
 * notes when its lease_acquire returned, releases and reports. The
 * latency is the second time minus the first (both CLOCK_MONOTONIC, one
 * host). Prints one line:
 *
 *   rounds=N p50_ms=X p90_ms=X max_ms=X min_ms=X
 *
 * Figures only: nothing here asserts a timing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_args.h"
#include "lease.h"

static void usage(void)
{
    fprintf(stderr, "usage: bench_wake --store URL [--rounds N] [--hold-ms H] "
                    "[--key K]\n");
    exit(2);
}

static int64_t mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void die(const char *who, const char *what)
{
    fprintf(stderr, "bench_wake: %s: %s: %s\n", who, what, lease_errmsg());
    _exit(1);
}

static int read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;

    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);

        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

/* The waiter: on each byte from `go`, a waiting acquire; the time it
 * returned goes back through `done`. */
static void waiter(int go, int done, const char *url, const char *key)
{
    char owner[LEASE_OWNER_BUFSZ], c;
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    lease_store *s;
    lease_grant g;

    if (lease_store_open(&s, url) < 0)
        die("waiter", "open");
    lease_owner_new(owner);
    o.owner = owner;
    o.ttl_ms = 30000;
    o.wait_ms = 30000;
    while (read_full(go, &c, 1) == 0) {
        int64_t t;

        if (lease_acquire(&g, NULL, s, key, &o) < 0)
            die("waiter", "acquire");
        t = mono_ns();
        if (lease_release(s, &g) < 0)
            die("waiter", "release");
        if (write(done, &t, sizeof(t)) != (ssize_t)sizeof(t))
            _exit(1);
    }
    lease_store_close(s);
    _exit(0);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

/* The holder's rounds; lat[i] gets round i's latency in ns. */
static void holder(int go, int done, const char *url, const char *key, long rounds,
                   long hold_ms, int64_t *lat)
{
    char owner[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    lease_store *s;
    lease_grant g;
    long i;

    if (lease_store_open(&s, url) < 0)
        die("holder", "open");
    lease_owner_new(owner);
    o.owner = owner;
    o.ttl_ms = 30000;
    o.wait_ms = 30000; /* the waiter's release may still be on its way */
    for (i = 0; i < rounds; i++) {
        int64_t rel, acq;
        long pause = hold_ms / 10 + rand() % (hold_ms - hold_ms / 10 + 1);

        if (lease_acquire(&g, NULL, s, key, &o) < 0)
            die("holder", "acquire");
        if (write(go, "g", 1) != 1)
            die("holder", "pipe");
        usleep((useconds_t)pause * 1000);
        if (lease_release(s, &g) < 0)
            die("holder", "release");
        rel = mono_ns();
        if (read_full(done, &acq, sizeof(acq)) < 0)
            die("holder", "the waiter died");
        lat[i] = acq - rel;
    }
    lease_store_close(s);
}

int main(int argc, char **argv)
{
    const char *url = NULL, *key = "bench/wake";
    long rounds = 50, hold_ms = 300, i;
    int go[2], done[2], status;
    int64_t *lat;
    pid_t pid;

    for (i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            usage();
        if (strcmp(argv[i], "--store") == 0)
            url = argv[++i];
        else if (strcmp(argv[i], "--rounds") == 0)
            rounds = bench_arg_long("bench_wake", argv[++i], 1, 1000000);
        else if (strcmp(argv[i], "--hold-ms") == 0)
            hold_ms = bench_arg_long("bench_wake", argv[++i], 10, 60000);
        else if (strcmp(argv[i], "--key") == 0)
            key = argv[++i];
        else
            usage();
    }
    if (url == NULL)
        usage();
    if ((lat = calloc((size_t)rounds, sizeof(*lat))) == NULL || pipe(go) < 0 ||
        pipe(done) < 0) {
        perror("bench_wake");
        return 1;
    }
    srand((unsigned)getpid());
    if ((pid = fork()) < 0) {
        perror("bench_wake: fork");
        return 1;
    }
    if (pid == 0) {
        close(go[1]);
        close(done[0]);
        waiter(go[0], done[1], url, key);
    }
    close(go[0]);
    close(done[1]);
    holder(go[1], done[0], url, key, rounds, hold_ms, lat);
    close(go[1]);
    waitpid(pid, &status, 0);
    qsort(lat, (size_t)rounds, sizeof(*lat), cmp_i64);
    printf("rounds=%ld p50_ms=%.2f p90_ms=%.2f max_ms=%.2f min_ms=%.2f\n", rounds,
           lat[(rounds - 1) / 2] / 1e6, lat[(rounds * 9 - 1) / 10] / 1e6,
           lat[rounds - 1] / 1e6, lat[0] / 1e6);
    free(lat);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
