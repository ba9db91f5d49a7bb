/*
 * bench_session.c - what holding many leases costs one process: a session
 * (one thread, one connection, batched renewals) against one keeper per
 * lease.
 *
 *   usage: bench_session --store URL --leases N --mode session|keepers
 *                        [--hold SEC] [--ttl-ms MS] [--renew-ms MS] [--batch B]
 *                        [--forward LISTEN_PORT:HOST:PORT] [--server-pids P,P...]
 *
 * Acquires N keys under a prefix of its own, holds them --hold seconds,
 * then releases them all, and prints one JSON line and one line for
 * people. Over the hold window it reports the process's TCP connections,
 * descriptors, threads, memory and CPU, the server's CPU (--server-pids:
 * those processes and their children), the grants lost, and the renewal
 * round trips per tick: with --forward the store URL must point at
 * 127.0.0.1:LISTEN_PORT, where a forwarder process relays to HOST:PORT
 * and counts request/response turns. For SQLite the count is of syncs
 * of the write-ahead log (one per commit).
 *
 * Ticks are the hold divided by --renew-ms: give a hold that is a multiple
 * of it for whole ticks.
 *
 * Keepers stop at the first acquire or keeper that fails (a server's
 * connection limit, the descriptor limit) and report how many they got.
 * Figures only: nothing here asserts a timing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "forwarder.h"
#include "lease.h"
#include "probe.h"

#define MAX_SERVER_PIDS 16

typedef struct bench_args {
    const char *url;
    size_t leases;
    int keepers;
    uint64_t hold_ms, ttl_ms, renew_ms;
    size_t batch;
    int fwd_listen, fwd_port;
    char fwd_host[64];
    pid_t server_pids[MAX_SERVER_PIDS];
    size_t nserver_pids;
} bench_args;

/* What one run measured (server_cpu_pct -1: no server to measure). */
typedef struct bench_result {
    size_t acquired;
    int acquire_rc;
    char acquire_err[512];
    double acquire_s, release_s;
    int release_rc;
    long tcp, fds, threads, rss_kb, hwm_kb;
    double cpu_pct, server_cpu_pct;
    double ticks;
    uint64_t turns, syncs;
    size_t lost;
} bench_result;

/* Both kinds of holders, kept for the release. */
typedef struct bench_hold {
    lease_session *session;
    lease_held **held;
    lease_keeper **keepers;
} bench_hold;

static unsigned long lost_count;
static unsigned long sync_count;

/*
 * SQLite's commits are counted here, outside the library: the program
 * exports fsync and fdatasync, so the dynamic linker binds libsqlite3's
 * calls to these, which make the system call and count it when it syncs
 * a write-ahead log. With synchronous=FULL each commit ends with one sync
 * of the log (a checkpoint adds one more); the directory and database
 * syncs of new connections and checkpoints are no commits.
 */
static void count_sync(int fd)
{
    char path[64], target[512];
    ssize_t n;

    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, target, sizeof(target) - 1);
    if (n > 4 && memcmp(target + n - 4, "-wal", 4) == 0)
        __atomic_add_fetch(&sync_count, 1, __ATOMIC_RELAXED);
}

int fdatasync(int fd)
{
    count_sync(fd);
    return (int)syscall(SYS_fdatasync, fd);
}

int fsync(int fd)
{
    count_sync(fd);
    return (int)syscall(SYS_fsync, fd);
}

static void on_session_lost(lease_session *s, lease_held *h, int reason, void *p)
{
    (void)s;
    (void)h;
    (void)reason;
    (void)p;
    __atomic_add_fetch(&lost_count, 1, __ATOMIC_RELAXED);
}

static void on_keeper_lost(lease_keeper *k, int reason, void *p)
{
    (void)k;
    (void)reason;
    (void)p;
    __atomic_add_fetch(&lost_count, 1, __ATOMIC_RELAXED);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_session --store URL --leases N --mode session|keepers\n"
            "                     [--hold SEC] [--ttl-ms MS] [--renew-ms MS] [--batch B]\n"
            "                     [--forward LISTEN_PORT:HOST:PORT] [--server-pids P,P...]\n");
    exit(2);
}

static uint64_t parse_u64(const char *s, const char *what)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || s[0] == '-') {
        fprintf(stderr, "bench_session: %s: not a number: '%s'\n", what, s);
        exit(2);
    }
    return (uint64_t)v;
}

static void parse_forward(bench_args *a, const char *s)
{
    char host[64];
    int lp, p;

    if (sscanf(s, "%d:%63[0-9.]:%d", &lp, host, &p) != 3 || lp <= 0 || lp > 65535 ||
        p <= 0 || p > 65535) {
        fprintf(stderr, "bench_session: --forward wants LISTEN_PORT:IPV4:PORT\n");
        exit(2);
    }
    a->fwd_listen = lp;
    a->fwd_port = p;
    memcpy(a->fwd_host, host, sizeof(host));
}

static void parse_pids(bench_args *a, const char *s)
{
    char *copy = strdup(s), *save = NULL, *tok;

    if (copy == NULL)
        exit(1);
    for (tok = strtok_r(copy, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        uint64_t pid = parse_u64(tok, "--server-pids");
        if (a->nserver_pids == MAX_SERVER_PIDS || pid == 0 || pid > 0x7fffffff) {
            fprintf(stderr, "bench_session: --server-pids: 1..%d process ids\n",
                    MAX_SERVER_PIDS);
            exit(2);
        }
        a->server_pids[a->nserver_pids++] = (pid_t)pid;
    }
    free(copy);
}

static void parse_args(bench_args *a, int argc, char **argv)
{
    int i;

    memset(a, 0, sizeof(*a));
    a->hold_ms = 60000;
    a->ttl_ms = 30000;
    a->renew_ms = 10000;
    for (i = 1; i + 1 < argc; i += 2) {
        const char *o = argv[i], *v = argv[i + 1];
        if (strcmp(o, "--store") == 0)
            a->url = v;
        else if (strcmp(o, "--leases") == 0)
            a->leases = (size_t)parse_u64(v, o);
        else if (strcmp(o, "--mode") == 0 &&
                 (strcmp(v, "session") == 0 || strcmp(v, "keepers") == 0))
            a->keepers = strcmp(v, "keepers") == 0;
        else if (strcmp(o, "--hold") == 0)
            a->hold_ms = parse_u64(v, o) * 1000;
        else if (strcmp(o, "--ttl-ms") == 0)
            a->ttl_ms = parse_u64(v, o);
        else if (strcmp(o, "--renew-ms") == 0)
            a->renew_ms = parse_u64(v, o);
        else if (strcmp(o, "--batch") == 0)
            a->batch = (size_t)parse_u64(v, o);
        else if (strcmp(o, "--forward") == 0)
            parse_forward(a, v);
        else if (strcmp(o, "--server-pids") == 0)
            parse_pids(a, v);
        else
            usage();
    }
    if (i != argc || a->url == NULL || a->leases == 0 || a->leases > 1000000 ||
        a->hold_ms == 0 || a->renew_ms == 0 || a->renew_ms >= a->ttl_ms)
        usage();
}

/* Thousands of keepers and their connections need more descriptors than
 * the usual soft limit of 1024. */
static void raise_nofile(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static double secs_since(int64_t t0)
{
    return (double)(lease_clock_ns() - t0) / 1e9;
}

static void note_error(bench_result *r, int rc, size_t i)
{
    r->acquire_rc = rc;
    snprintf(r->acquire_err, sizeof(r->acquire_err), "lease %zu: %s", i + 1,
             lease_errmsg());
}

static void key_of(char *key, size_t size, const char *prefix, size_t i)
{
    snprintf(key, size, "%s/k%06zu", prefix, i);
}

/* One session for every key; the handle `store` is closed once the
 * session has its own connection, so that the session's is the only one. */
static int acquire_session(bench_hold *h, bench_result *r, const bench_args *a,
                           lease_store *store, const char *owner, const char *prefix)
{
    lease_session_opts so = LEASE_SESSION_OPTS_INIT;
    char key[LEASE_KEY_MAX + 1];
    int64_t t0 = lease_clock_ns();
    size_t i;
    int rc;

    so.owner = owner;
    so.ttl_ms = a->ttl_ms;
    so.renew_every_ms = a->renew_ms;
    so.batch_max = a->batch;
    so.label = "bench_session";
    so.on_lost = on_session_lost;
    rc = lease_session_open(&h->session, store, &so);
    lease_store_close(store);
    if (rc < 0) {
        note_error(r, rc, 0);
        return rc;
    }
    for (i = 0; i < a->leases; i++) {
        key_of(key, sizeof(key), prefix, i);
        rc = lease_session_acquire(&h->held[i], NULL, h->session, key, 0, NULL, NULL);
        if (rc < 0) {
            note_error(r, rc, i);
            break;
        }
        r->acquired++;
    }
    r->acquire_s = secs_since(t0);
    return rc;
}

/* One acquire and one keeper per key, stopping at the first failure;
 * a grant whose keeper could not start is released at once. */
static int acquire_keepers(bench_hold *h, bench_result *r, const bench_args *a,
                           lease_store *store, const char *owner, const char *prefix)
{
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    lease_keeper_opts ko = LEASE_KEEPER_OPTS_INIT;
    char key[LEASE_KEY_MAX + 1];
    int64_t t0 = lease_clock_ns();
    lease_grant g;
    size_t i;
    int rc = 0;

    o.owner = owner;
    o.ttl_ms = a->ttl_ms;
    o.label = "bench_session";
    ko.renew_every_ms = a->renew_ms;
    ko.on_lost = on_keeper_lost;
    for (i = 0; i < a->leases; i++) {
        key_of(key, sizeof(key), prefix, i);
        rc = lease_acquire(&g, NULL, store, key, &o);
        if (rc < 0) {
            note_error(r, rc, i);
            break;
        }
        rc = lease_keeper_start(&h->keepers[i], store, &g, &ko);
        if (rc < 0) {
            note_error(r, rc, i);
            (void)lease_release(store, &g);
            break;
        }
        r->acquired++;
    }
    r->acquire_s = secs_since(t0);
    lease_store_close(store);
    return rc;
}

static size_t count_invalid(const bench_hold *h, size_t n)
{
    size_t i, bad = 0;

    for (i = 0; i < n; i++) {
        if (h->held != NULL && h->held[i] != NULL && !lease_held_valid(h->held[i]))
            bad++;
        if (h->keepers != NULL && h->keepers[i] != NULL && !lease_keeper_valid(h->keepers[i]))
            bad++;
    }
    return bad;
}

static void sleep_until(int64_t deadline_ns)
{
    int64_t now;

    while ((now = lease_clock_ns()) < deadline_ns) {
        int64_t left = deadline_ns - now;
        struct timespec ts = { (time_t)(left / 1000000000), (long)(left % 1000000000) };
        nanosleep(&ts, NULL);
    }
}

/* Hold every grant for the window and measure what holding costs. */
static void hold(bench_result *r, const bench_hold *h, const bench_args *a,
                 const bench_forwarder *fwd)
{
    probe_procs p0, p1;
    uint64_t turns0 = bench_forwarder_turns(fwd);
    unsigned long syncs0 = __atomic_load_n(&sync_count, __ATOMIC_RELAXED);
    double cpu0 = probe_self_cpu(), wall;
    int64_t t0 = lease_clock_ns();

    probe_procs_take(&p0, a->server_pids, a->nserver_pids);
    sleep_until(t0 + (int64_t)a->hold_ms * 1000000);
    wall = secs_since(t0);
    r->cpu_pct = 100.0 * (probe_self_cpu() - cpu0) / wall;
    probe_procs_take(&p1, a->server_pids, a->nserver_pids);
    r->server_cpu_pct = a->nserver_pids ? 100.0 * probe_procs_delta(&p0, &p1) / wall : -1;
    probe_procs_free(&p0);
    probe_procs_free(&p1);
    r->turns = bench_forwarder_turns(fwd) - turns0;
    r->syncs = __atomic_load_n(&sync_count, __ATOMIC_RELAXED) - syncs0;
    r->ticks = wall * 1000.0 / (double)a->renew_ms;
    r->tcp = probe_tcp();
    r->fds = probe_fds();
    r->threads = probe_status("Threads");
    r->rss_kb = probe_status("VmRSS");
    r->hwm_kb = probe_status("VmHWM");
    r->lost = count_invalid(h, a->leases);
    if (r->lost < __atomic_load_n(&lost_count, __ATOMIC_RELAXED))
        r->lost = __atomic_load_n(&lost_count, __ATOMIC_RELAXED);
}

static void release(bench_result *r, bench_hold *h, size_t n)
{
    int64_t t0 = lease_clock_ns();
    size_t i;

    r->release_rc = 0;
    /* What an application does when it stops: close releases in chunks
     * while the session's thread still renews the grants not yet released. */
    if (h->session != NULL)
        r->release_rc = lease_session_close(h->session, 1);
    for (i = 0; h->keepers != NULL && i < n; i++) {
        int rc;
        if (h->keepers[i] == NULL)
            continue;
        rc = lease_keeper_stop(NULL, h->keepers[i], 1);
        if (rc < 0 && r->release_rc == 0)
            r->release_rc = rc;
    }
    r->release_s = secs_since(t0);
}

static json_t *result_json(const bench_result *r, const bench_args *a,
                           const char *scheme, int forwarded)
{
    json_t *j = json_pack(
        "{s:s, s:s, s:I, s:I, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
        "s:f, s:f, s:I, s:f, s:f}",
        "store", scheme, "mode", a->keepers ? "keepers" : "session",
        "leases", (json_int_t)a->leases, "acquired", (json_int_t)r->acquired,
        "acquire_s", r->acquire_s, "hold_s", (json_int_t)(a->hold_ms / 1000),
        "ttl_ms", (json_int_t)a->ttl_ms, "renew_ms", (json_int_t)a->renew_ms,
        "batch", (json_int_t)a->batch, "tcp_connections", (json_int_t)r->tcp,
        "fds", (json_int_t)r->fds, "threads", (json_int_t)r->threads,
        "rss_kb", (json_int_t)r->rss_kb, "hwm_kb", (json_int_t)r->hwm_kb,
        "cpu_pct", r->cpu_pct, "ticks", r->ticks, "lost", (json_int_t)r->lost,
        "release_s", r->release_s,
        "server_cpu_pct", r->server_cpu_pct);

    if (j == NULL)
        return NULL;
    if (a->nserver_pids == 0)
        json_object_set_new(j, "server_cpu_pct", json_null());
    json_object_set_new(j, "acquire_error", r->acquire_rc < 0 ? json_string(r->acquire_err)
                                                              : json_null());
    json_object_set_new(j, "release_error", r->release_rc < 0
                                                ? json_string(lease_error_name(r->release_rc))
                                                : json_null());
    /* Round trips only where they were counted: through the forwarder, or
     * SQLite's commits. */
    json_object_set_new(j, "turns", forwarded ? json_integer((json_int_t)r->turns) : json_null());
    json_object_set_new(j, "turns_per_tick",
                        forwarded ? json_real((double)r->turns / r->ticks) : json_null());
    json_object_set_new(j, "syncs", json_integer((json_int_t)r->syncs));
    json_object_set_new(j, "syncs_per_tick", json_real((double)r->syncs / r->ticks));
    return j;
}

static void report(const bench_result *r, const bench_args *a, const char *scheme,
                   int forwarded)
{
    json_t *j = result_json(r, a, scheme, forwarded);
    char *line = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;

    printf("%s\n", line ? line : "{}");
    free(line);
    json_decref(j);
    printf("# %s %s: %zu/%zu acquired in %.1f s; held %.0f s: %ld TCP, %ld fds, "
           "%ld threads, RSS %.1f MB (peak %.1f), CPU %.2f %%",
           scheme, a->keepers ? "keepers" : "session", r->acquired, a->leases,
           r->acquire_s, (double)a->hold_ms / 1000, r->tcp, r->fds, r->threads,
           r->rss_kb / 1024.0, r->hwm_kb / 1024.0, r->cpu_pct);
    if (a->nserver_pids)
        printf(", server CPU %.2f %%", r->server_cpu_pct);
    if (forwarded)
        printf(", %.1f round trips/tick", (double)r->turns / r->ticks);
    else
        printf(", %.1f commits/tick", (double)r->syncs / r->ticks);
    printf(", lost %zu; released in %.1f s\n", r->lost, r->release_s);
    if (r->acquire_rc < 0)
        printf("# stopped at: %s\n", r->acquire_err);
}

int main(int argc, char **argv)
{
    bench_args a;
    bench_result r;
    bench_hold h;
    bench_forwarder fwd;
    lease_store *store;
    char owner[LEASE_OWNER_BUFSZ], prefix[64], scheme[32];
    int rc;

    parse_args(&a, argc, argv);
    raise_nofile();
    memset(&fwd, 0, sizeof(fwd));
    memset(&r, 0, sizeof(r));
    memset(&h, 0, sizeof(h));
    /* The forwarder forks: before any thread of ours or of the library. */
    if (a.fwd_listen && bench_forwarder_start(&fwd, a.fwd_listen, a.fwd_host, a.fwd_port) != 0)
        return 1;
    if (lease_store_open(&store, a.url) < 0) {
        fprintf(stderr, "bench_session: %s\n", lease_errmsg());
        bench_forwarder_stop(&fwd);
        return 1;
    }
    snprintf(scheme, sizeof(scheme), "%s", lease_store_scheme(store));
    lease_owner_new(owner);
    snprintf(prefix, sizeof(prefix), "bench-session/%.8s", owner);
    if (a.keepers)
        h.keepers = calloc(a.leases, sizeof(*h.keepers));
    else
        h.held = calloc(a.leases, sizeof(*h.held));
    if (h.keepers == NULL && h.held == NULL) {
        lease_store_close(store);
        bench_forwarder_stop(&fwd);
        return 1;
    }
    rc = a.keepers ? acquire_keepers(&h, &r, &a, store, owner, prefix)
                   : acquire_session(&h, &r, &a, store, owner, prefix);
    if (r.acquired > 0)
        hold(&r, &h, &a, &fwd);
    release(&r, &h, a.leases);
    bench_forwarder_stop(&fwd);
    report(&r, &a, scheme, a.fwd_listen != 0);
    free(h.keepers);
    free(h.held);
    /* Keepers stopping at a server's limit is a result; a session that
     * could not hold every key, or any grant lost, is a failure. */
    return (rc < 0 && !a.keepers) || r.lost > 0 ? 1 : 0;
}
