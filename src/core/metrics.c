/*
 * metrics.c - counters and histograms, per store scheme, kept with atomics
 * so that any thread can count without a lock.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease_int.h"

/* Per store of lease__stores (the project's one list), then "other" for a
 * store the application registered. */
#define NSTORES (LEASE__NSTORES + 1)

/* Bucket bounds in seconds: waits are short, holds are long. */
static const double wait_bounds[] = { 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60 };
static const double held_bounds[] = { 0.1, 1, 10, 60, 300, 900, 3600, 21600, 86400 };
#define NWAIT (sizeof(wait_bounds) / sizeof(wait_bounds[0]))
#define NHELD (sizeof(held_bounds) / sizeof(held_bounds[0]))

typedef struct {
    _Atomic uint64_t buckets[16]; /* per bound, not cumulative; last: +Inf */
    _Atomic uint64_t count;
    _Atomic uint64_t sum_ns;
} histogram;

static struct {
    _Atomic uint64_t acq[NSTORES][3];
    _Atomic uint64_t renewals[NSTORES];
    _Atomic uint64_t renewal_failures[NSTORES];
    _Atomic uint64_t losses[NSTORES][2];
    _Atomic uint64_t leader[NSTORES];
    _Atomic uint64_t fenced[NSTORES];
    _Atomic uint64_t clock_behind[NSTORES];
    histogram wait[NSTORES];
    histogram held[NSTORES];
} m;

static size_t store_index(const char *store)
{
    size_t i;

    for (i = 0; i < LEASE__NSTORES; i++)
        if (store && strcmp(store, lease__stores[i].name) == 0)
            return i;
    return NSTORES - 1;
}

static const char *store_label(size_t s)
{
    return s < LEASE__NSTORES ? lease__stores[s].name : "other";
}

/* Series only for the stores this build has: a scrape never shows a store
 * that cannot be used. */
static int shown(size_t s)
{
    return s >= LEASE__NSTORES || lease__stores[s].backend != NULL;
}

static void observe(histogram *h, const double *bounds, size_t n, int64_t ns)
{
    double secs = (double)ns / 1e9;
    size_t i;

    if (ns < 0)
        ns = 0;
    for (i = 0; i < n && secs > bounds[i]; i++)
        ;
    atomic_fetch_add(&h->buckets[i], 1);
    atomic_fetch_add(&h->count, 1);
    atomic_fetch_add(&h->sum_ns, (uint64_t)ns);
}

void lease__metric_acquire(const char *store, int rc, int64_t wait_ns)
{
    size_t s = store_index(store);
    int outcome = rc == 0 ? 0 : (rc == LEASE_EBUSY || rc == LEASE_ETIMEOUT) ? 1 : 2;

    atomic_fetch_add(&m.acq[s][outcome], 1);
    observe(&m.wait[s], wait_bounds, NWAIT, wait_ns);
}

void lease__metric_renew(const char *store, int ok)
{
    size_t s = store_index(store);

    atomic_fetch_add(ok ? &m.renewals[s] : &m.renewal_failures[s], 1);
}

void lease__metric_loss(const char *store, int uncertain)
{
    atomic_fetch_add(&m.losses[store_index(store)][uncertain ? 1 : 0], 1);
}

void lease__metric_held(const char *store, int64_t held_ns)
{
    observe(&m.held[store_index(store)], held_bounds, NHELD, held_ns);
}

void lease__metric_leader(const char *store)
{
    atomic_fetch_add(&m.leader[store_index(store)], 1);
}

void lease__metric_fenced(const char *store)
{
    atomic_fetch_add(&m.fenced[store_index(store)], 1);
}

void lease__metric_clock_behind(const char *store)
{
    atomic_fetch_add(&m.clock_behind[store_index(store)], 1);
}

void lease_metrics_reset(void)
{
    memset(&m, 0, sizeof(m));
}

typedef struct {
    char *buf;
    size_t len, cap;
    int failed;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (b->failed)
        return;
    for (;;) {
        va_start(ap, fmt);
        /* Before the first growth buf is NULL, and NULL + 0 is undefined. */
        n = vsnprintf(b->buf ? b->buf + b->len : NULL, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        {
            size_t cap = (b->cap + (size_t)n + 1) * 2;
            char *p = realloc(b->buf, cap);
            if (p == NULL) {
                b->failed = 1;
                return;
            }
            b->buf = p;
            b->cap = cap;
        }
    }
}

static void counter(sbuf *b, const char *name, const char *help,
                    _Atomic uint64_t *values, size_t stride)
{
    size_t s;

    put(b, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    for (s = 0; s < NSTORES; s++)
        if (shown(s))
            put(b, "%s{store=\"%s\"} %llu\n", name, store_label(s),
            (unsigned long long)atomic_load(&values[s * stride]));
}

static void hist(sbuf *b, const char *name, const char *help, histogram *hs,
                 const double *bounds, size_t n)
{
    size_t s, i;

    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (s = 0; s < NSTORES; s++) {
        uint64_t cum = 0;
        const char *store = store_label(s);

        if (!shown(s))
            continue;
        for (i = 0; i < n; i++) {
            cum += atomic_load(&hs[s].buckets[i]);
            put(b, "%s_bucket{store=\"%s\",le=\"%g\"} %llu\n", name, store,
                bounds[i], (unsigned long long)cum);
        }
        cum += atomic_load(&hs[s].buckets[n]);
        put(b, "%s_bucket{store=\"%s\",le=\"+Inf\"} %llu\n", name, store,
            (unsigned long long)cum);
        put(b, "%s_sum{store=\"%s\"} %.9f\n", name, store,
            (double)atomic_load(&hs[s].sum_ns) / 1e9);
        put(b, "%s_count{store=\"%s\"} %llu\n", name, store,
            (unsigned long long)atomic_load(&hs[s].count));
    }
}

int lease_metrics_text(char **out)
{
    static const char *const outcomes[] = { "granted", "busy", "error" };
    static const char *const reasons[] = { "lost", "uncertain" };
    sbuf b = { NULL, 0, 0, 0 };
    size_t s, o;

    if (out == NULL)
        return lease__seterr(LEASE_EINVALID, "out is NULL");
    *out = NULL;
    put(&b, "# HELP lease_acquisitions_total Acquisition attempts by outcome.\n"
            "# TYPE lease_acquisitions_total counter\n");
    for (s = 0; s < NSTORES; s++)
        for (o = 0; o < 3 && shown(s); o++)
            put(&b, "lease_acquisitions_total{store=\"%s\",outcome=\"%s\"} %llu\n",
                store_label(s), outcomes[o], (unsigned long long)atomic_load(&m.acq[s][o]));
    hist(&b, "lease_acquire_wait_seconds", "Time spent in lease_acquire.", m.wait,
         wait_bounds, NWAIT);
    counter(&b, "lease_renewals_total", "Successful renewals.", m.renewals, 1);
    counter(&b, "lease_renewal_failures_total", "Failed renewals.",
            m.renewal_failures, 1);
    put(&b, "# HELP lease_losses_total Leases lost while held: the store said so "
            "(lost), or renewals failed (uncertain).\n"
            "# TYPE lease_losses_total counter\n");
    for (s = 0; s < NSTORES; s++)
        for (o = 0; o < 2 && shown(s); o++)
            put(&b, "lease_losses_total{store=\"%s\",reason=\"%s\"} %llu\n", store_label(s),
                reasons[o], (unsigned long long)atomic_load(&m.losses[s][o]));
    hist(&b, "lease_held_seconds", "Time from acquisition to release or loss.",
         m.held, held_bounds, NHELD);
    counter(&b, "lease_leader_transitions_total",
            "Leadership gained or given up by this process.", m.leader, 1);
    counter(&b, "lease_fence_rejections_total",
            "Writes rejected by the fencing check for a stale token.", m.fenced, 1);
    counter(&b, "lease_clock_behind_total",
            "Grants whose clock-floored token followed the last token because the "
            "store's clock was behind it by more than a second.", m.clock_behind, 1);
    if (b.failed) {
        free(b.buf);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    *out = b.buf;
    return 0;
}
