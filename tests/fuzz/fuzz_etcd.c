/*
 * fuzz_etcd.c - the etcd store reading answers it cannot trust.
 *
 * A fake etcd (fuzz_http.h) answers the store's requests with the input,
 * split at 0x01 bytes into answers, after its opening request ("{}"). It
 * speaks the JSON gateway (?transport=json); the gRPC transport's codec is
 * fuzz_etcd_pb's.
 *
 * The store then runs acquire, renew, guarded put, release, inspect, list,
 * fence advance and mark, data get and history. Properties, whatever the
 * answers: no crash, leak or undefined behaviour; every outcome is 0 or a
 * LEASE_E* code with a message; a grant has a token in 1 .. 2^63-1, a ttl
 * of at least 1 ms and within the cap, and a local deadline not yet passed;
 * inspect/list/history/fence report tokens and times in range.
 */
#define _GNU_SOURCE /* strcasestr, accept4 */
#include "fuzz_http.h"

/* The opening request (a range read) is answered "{}". */
static fuzz_http_fake etcd_fake = { FUZZ_FAKE_INIT, "{}", "", -1 };

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_http_start(&etcd_fake);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char url[64];

    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d/fuzz?transport=json", etcd_fake.fake.port);
    fuzz_store_input(&etcd_fake.fake, data, size, url);
    return 0;
}
