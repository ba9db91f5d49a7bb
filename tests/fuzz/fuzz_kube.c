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
 * inspect/list/history/fence report tokens and times in range.
 */
#define _GNU_SOURCE /* strcasestr, accept4 */
#include "fuzz_http.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char url[160];

    snprintf(url, sizeof(url), "kubernetes+http://127.0.0.1:%d/fuzz?token_file=%s",
             kube_fake.fake.port, token_file);
    fuzz_store_input(&kube_fake.fake, data, size, url);
    return 0;
}
