/*
 * fuzz_kube.c - the Kubernetes store reading answers it cannot trust.
 *
 * A fake API server (fuzz_http.h) answers the store's requests with the
 * input, split at 0x01 bytes into answers, after its opening probe (a
 * discovery document that lists leases).
 *
 * The store then runs acquire, renew, guarded put, release, inspect, list,
 * (a watch when a wait is asked: a stream cut by the close),
 * fence advance and mark, data get and history. Properties, whatever the
 * answers: no crash, leak or undefined behaviour; every outcome is 0 or a
 * LEASE_E* code with a message; a grant has a token in 1 .. 2^63-1, a ttl
 * of at least 1 ms and within the cap, and a local deadline not yet passed;
 * inspect/list/history/fence report tokens and times in range; what
 * jansson held (counted through its allocator as tests/etcd/json_count.h
 * counts, below) stayed within the budget of one answer (src/stores/json_budget.h) and
 * the little the store builds beside it. Each input is also one answer
 * to the decoder the store reads every answer with, its budget cut to
 * 256 bytes .. 64 KiB (picked by the input's length), which jansson's
 * peak must stay within.
 */
#define _GNU_SOURCE /* strcasestr, accept4 */
#include "fuzz_http.h"
#include <malloc.h>
#include "stores/json_budget.h"

/*
 * What jansson holds, as malloc hands it out (glibc: an 8-byte header,
 * steps of 16, 32 bytes at least), which is what the budget counts. Not
 * tests/etcd/json_count.h's size header: the store's and the core's
 * json_dumps texts are plain malloc blocks they free() themselves, so the
 * size comes from malloc_usable_size (glibc: the block less its header;
 * ASan: what was asked), the same at both ends. One thread uses jansson.
 */
static size_t count_live, count_base, count_top;

static size_t count_block(void *p)
{
    size_t c = (malloc_usable_size(p) + 8 + 15) & ~(size_t)15;

    return c < 32 ? 32 : c;
}

static void *count_malloc(size_t n)
{
    void *p = malloc(n);

    if (p && (count_live += count_block(p)) > count_top)
        count_top = count_live;
    return p;
}

/* A json_dumps text that its caller free()s stays counted: a little
 * more than held, never less. */
static void count_free(void *p)
{
    if (p)
        count_live -= count_block(p);
    free(p);
}

static void count_reset(void)
{
    count_base = count_top = count_live;
}

/* What the store holds beside the answer it decodes: the object it
 * edits, its history, the request it writes. */
#define STORE_SLACK ((size_t)1 << 20)

/* The opening probe gets a discovery document that lists leases; every
 * answer has a Date, which the store reads for expiry. */
static fuzz_http_fake kube_fake = {
    FUZZ_FAKE_INIT,
    "{\"kind\":\"APIResourceList\",\"resources\":[{\"name\":\"leases\",\"namespaced\":true}]}",
    "Date: Tue, 01 Dec 2026 04:00:00 GMT\r\n", -1
};

/* The bearer token the store reads at open, in a file of its own,
 * removed when the fuzzer exits. */
static char token_file[64];

static void remove_token_file(void)
{
    unlink(token_file);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    int fd;

    (void)argc;
    (void)argv;
    json_set_alloc_funcs(count_malloc, count_free); /* before jansson allocates */
    strcpy(token_file, "/tmp/fuzz_kube_token.XXXXXX");
    if ((fd = mkstemp(token_file)) < 0)
        abort();
    if (write(fd, "fuzz-token", 10) != 10) /* a file: fuzz_write_all sends */
        abort();
    close(fd);
    atexit(remove_token_file);
    fuzz_http_start(&kube_fake);
    return 0;
}

/* The input as one answer to the store's decoder, within a small budget. */
static void decode_within(const uint8_t *data, size_t size)
{
    lease__json_budget b = lease__json_budget_of(LEASE__JSON_HOLD_ANY, size, 0);
    char err[160];
    json_t *j = NULL;
    int rc;

    b.bytes = (size_t)256 << (size % 9);
    b.values = b.bytes / 16;
    count_reset();
    rc = lease__json_load(&j, (const char *)data, size, &b, err, sizeof(err));
    if (count_top - count_base > b.bytes)
        fuzz_fail("the decoder held %zu bytes, past the budget of %zu", count_top - count_base,
                  b.bytes);
    if ((rc == 0) != (j != NULL) || (rc < 0 && rc != -1))
        fuzz_fail("the decoder answered %d with%s a value", rc, j ? "" : "out");
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lease__json_budget any = lease__json_budget_of(LEASE__JSON_HOLD_ANY, size, 0);
    char url[160];

    snprintf(url, sizeof(url), "kubernetes+http://127.0.0.1:%d/fuzz?token_file=%s",
             kube_fake.fake.port, token_file);
    count_reset();
    fuzz_store_input(&kube_fake.fake, data, size, url);
    if (count_top - count_base > any.bytes + STORE_SLACK)
        fuzz_fail("the store held %zu bytes of JSON, past an answer's budget of %zu",
                  count_top - count_base, any.bytes);
    decode_within(data, size);
    return 0;
}
