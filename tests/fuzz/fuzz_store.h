/*
 * fuzz_store.h - the operations the store fuzz targets run against a fake
 * server, and what every outcome must satisfy: whatever the server said,
 * a call gives 0 or a LEASE_E* code with a message; a grant has a token in
 * 1 .. 2^63-1, a ttl of at least 1 ms within the cap and a local deadline
 * not yet passed; inspect, list, fence, data and history report tokens and
 * times in range.
 */
#ifndef LEASE_FUZZ_STORE_H
#define LEASE_FUZZ_STORE_H

#include <pthread.h>

#include "fuzz_util.h"

#define FUZZ_OWNER "6f1c2d3e-0000-4000-8000-00000000abcd"

static inline void fuzz_check_grant(const lease_grant *g)
{
    fuzz_check_token("acquire", g->token);
    if (g->ttl_ms == 0)
        fuzz_fail("acquire granted a ttl of 0 ms");
    fuzz_check_ttl("acquire", "ttl", g->ttl_ms);
    if (!lease_grant_valid(g))
        fuzz_fail("acquire succeeded with its local deadline already passed "
                  "(ttl %llu ms)", (unsigned long long)g->ttl_ms);
}

static inline void fuzz_store_reads(lease_store *s)
{
    lease_info info, *list = NULL;
    lease_history_entry *h = NULL;
    size_t n = 0, i;
    uint64_t mark = 0;
    void *value = NULL;
    int rc;

    if ((rc = lease_inspect(&info, s, "fuzz/key")) == 0)
        fuzz_check_info("inspect", &info);
    fuzz_check_rc("inspect", rc);
    if ((rc = lease_list(&list, &n, s, "fuzz/")) == 0)
        for (i = 0; i < n; i++)
            fuzz_check_info("list", &list[i]);
    fuzz_check_rc("list", rc);
    lease_list_free(list);
    if ((rc = lease_fence_advance(&mark, s, "fuzz/res", 7)) == 0 && mark < 7)
        fuzz_fail("fence_advance(7) accepted with mark %llu", (unsigned long long)mark);
    fuzz_check_rc("fence_advance", rc);
    if ((rc = lease_fence_mark(&mark, s, "fuzz/res")) == 0)
        fuzz_check_token("fence_mark", mark);
    fuzz_check_rc("fence_mark", rc);
    rc = lease_data_get(&value, &n, &mark, s, "fuzz/data");
    fuzz_check_rc("data_get", rc);
    if (rc == 0) {
        fuzz_check_token("data_get", mark);
        free(value);
    }
    if ((rc = lease_history(&h, &n, s, "fuzz/key", 0)) == 0)
        for (i = 0; i < n; i++) {
            fuzz_check_token("history", h[i].token);
            if ((unsigned)h[i].ended > LEASE_ENDED_LOST)
                fuzz_fail("history gave ended = %d", (int)h[i].ended);
        }
    fuzz_check_rc("history", rc);
    lease_history_free(h);
}

static inline void fuzz_store_run(lease_store *s)
{
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    lease_grant g;
    lease_info holder;
    int rc;

    o.owner = FUZZ_OWNER;
    o.ttl_ms = 5000;
    o.label = "fuzz";
    rc = lease_acquire(&g, &holder, s, "fuzz/key", &o);
    fuzz_check_rc("acquire", rc);
    if (rc == 0)
        fuzz_check_grant(&g);
    else if (lease_grant_init(&g, "fuzz/key", FUZZ_OWNER, 5, 5000) < 0)
        abort();
    fuzz_check_rc("renew", lease_renew(&g, s, 5000));
    fuzz_check_rc("guarded_put", lease_guarded_put(s, &g, "fuzz/data", "v", 1));
    fuzz_check_rc("release", lease_release(s, &g));
    fuzz_store_reads(s);
}

/*
 * A fake server's script, shared by the store targets: its own copy of
 * the input (a request that arrives late, after a client timeout, must
 * not read a finished input), split at 0x01 bytes into answers, and how
 * many requests came since the input began.
 */
typedef struct {
    pthread_mutex_t mu;
    uint8_t *input;
    fuzz_pieces answers;
    size_t requests;
    int port;
} fuzz_fake;

#define FUZZ_FAKE_INIT { PTHREAD_MUTEX_INITIALIZER, NULL, { { 0 }, { 0 }, 0 }, 0, 0 }

/* One input: the fake's new script, then every operation of the store at
 * url against it (inputs over 64 KiB are skipped: answers that large only
 * slow the fuzzer down). */
static inline void fuzz_store_input(fuzz_fake *f, const uint8_t *data, size_t size,
                                    const char *url)
{
    lease_store *s = NULL;
    int rc;

    if (size > 65536)
        return;
    pthread_mutex_lock(&f->mu);
    free(f->input);
    if ((f->input = malloc(size + 1)) == NULL)
        abort();
    memcpy(f->input, data, size);
    fuzz_split(&f->answers, f->input, size, 0x01);
    f->requests = 0;
    pthread_mutex_unlock(&f->mu);
    rc = lease_store_open_timeout(&s, url, 1000);
    fuzz_check_rc("open", rc);
    if (rc == 0) {
        fuzz_store_run(s);
        lease_store_close(s);
    }
}

#endif
