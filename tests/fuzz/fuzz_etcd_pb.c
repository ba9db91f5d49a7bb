/*
 * fuzz_etcd_pb.c - the etcd store's gRPC codec (src/stores/etcd/pb.c) on
 * input it cannot trust: the first byte picks a call (its low six bits
 * modulo the calls), a budget (the same bits divided by the calls: 256
 * bytes to 64 KiB, or the store's own for anything) and a part, the rest
 * is the input.
 *
 *   answers   the rest as one framed message (or, with bit 0x80, as the
 *             whole body) to the call's answer decoder, and as text to
 *             the gateway's JSON loader;
 *   requests  with bit 0x40, the rest as JSON to the call's request
 *             encoder (the store only encodes JSON it built, but the
 *             encoder must refuse anything else cleanly);
 *   messages  always, the rest as a grpc-message header's text, decoded
 *             then made printable.
 *
 * Properties: no crash, leak or undefined behaviour; a decoder either
 * answers a JSON object that jansson can write out (valid UTF-8) and an
 * empty reason, or refuses with a reason and no object; what jansson held
 * while a decoder or the JSON loader ran (counted through its allocator,
 * tests/etcd/json_count.h) never went past the budget's bytes, whatever
 * the answer; an encoder either
 * gives a frame whose length prefix is its size less five, or refuses with
 * a reason; a decoded grpc-message holds no control byte.
 */
#include "fuzz_util.h"
#include "stores/etcd/pb.h"
#include "../etcd/json_count.h"

static const char *const paths[] = {
    "/v3/kv/range", "/v3/kv/txn", "/v3/lease/grant", "/v3/lease/revoke",
    "/v3/lease/keepalive", "/v3/lease/timetolive", "/v3/auth/authenticate",
};
#define NPATHS (sizeof(paths) / sizeof(paths[0]))

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* Before jansson allocates anything; what it writes out (json_dumps)
     * is freed by json_count_free then. */
    json_count_start();
    return 0;
}

static lease__json_budget budget;

/* What jansson held since json_count_reset() stayed within the budget. */
static void held_within(const char *path, const char *what)
{
    if (json_count_peak() > budget.bytes)
        fuzz_fail("%s: %s held %zu bytes, past the budget of %zu", path, what,
                  json_count_peak(), budget.bytes);
}

static void answer(const char *path, const uint8_t *data, size_t size, int raw)
{
    unsigned char *body = malloc(size + 5);
    char err[160];
    json_t *j = NULL;
    char *text;
    size_t n = size;
    int rc;

    if (body == NULL)
        return;
    if (raw) {
        memcpy(body, data, size);
    } else {
        body[0] = 0;
        body[1] = (unsigned char)(size >> 24);
        body[2] = (unsigned char)(size >> 16);
        body[3] = (unsigned char)(size >> 8);
        body[4] = (unsigned char)size;
        memcpy(body + 5, data, size);
        n = size + 5;
    }
    json_count_reset();
    rc = lease__etcd_pb_answer(&j, path, body, n, &budget, err, sizeof(err));
    held_within(path, "decoding");
    if (rc == 0) {
        if (!json_is_object(j) || err[0] != '\0')
            fuzz_fail("%s: decoded, but not to an object, or with a reason '%s'", path, err);
        if ((text = json_dumps(j, JSON_COMPACT)) == NULL)
            fuzz_fail("%s: the decoded answer cannot be written out", path);
        json_decref(j);
        /* The same answer as the gateway's JSON. */
        json_count_reset();
        rc = lease__json_load(&j, text, strlen(text), &budget, err, sizeof(err));
        held_within(path, "loading the decoded answer as JSON");
        if (rc == 0 && !json_is_object(j))
            fuzz_fail("%s: the decoded answer as JSON loads as another type", path);
        json_count_free(text);
    } else if (rc != -1 || j != NULL || err[0] == '\0') {
        fuzz_fail("%s: refused (%d) without a reason, or with an object", path, rc);
    }
    json_decref(j);
    free(body);
}

/* The input as the gateway's JSON answer. */
static void json_text(const char *path, const uint8_t *data, size_t size)
{
    json_t *j = NULL;
    char err[160] = "";
    int rc;

    json_count_reset();
    rc = lease__json_load(&j, (const char *)data, size, &budget, err, sizeof(err));
    held_within(path, "loading JSON");
    if ((rc == 0) != (j != NULL) || (rc < -1 && err[0] == '\0'))
        fuzz_fail("%s: JSON loaded (%d) with no value, or refused with one", path, rc);
    json_decref(j);
}

static void request(const char *path, const uint8_t *data, size_t size)
{
    json_t *req = json_loadb((const char *)data, size, 0, NULL);
    unsigned char *out = NULL;
    size_t len = 0;
    char err[160] = "";

    if (req == NULL)
        return;
    if (lease__etcd_pb_request(&out, &len, path, req, err, sizeof(err)) == 0) {
        if (out == NULL || len < 5 || out[0] != 0 ||
            ((size_t)out[1] << 24 | (size_t)out[2] << 16 | (size_t)out[3] << 8 | out[4]) !=
                len - 5)
            fuzz_fail("%s: an encoded request with a bad frame", path);
        /* What was encoded decodes as protobuf, whatever the answer's
         * schema makes of it: no crash. */
        answer(path, out + 5, len - 5, 0);
    } else if (out != NULL || err[0] == '\0') {
        fuzz_fail("%s: a request refused without a reason", path);
    }
    free(out);
    json_decref(req);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path;
    char *m;
    size_t i, len;

    if (size < 1)
        return 0;
    path = paths[(data[0] & 0x3f) % NPATHS];
    budget = lease__json_budget_of(LEASE__JSON_HOLD_ANY, size, 0);
    if ((data[0] & 0x3f) / NPATHS < 9)
        budget.bytes = (size_t)256 << ((data[0] & 0x3f) / NPATHS);
    if (data[0] & 0x40)
        request(path, data + 1, size - 1);
    else {
        answer(path, data + 1, size - 1, data[0] & 0x80);
        json_text(path, data + 1, size - 1);
    }
    if ((m = lease__etcd_pb_message((const char *)data + 1, size - 1, &len)) != NULL) {
        if (len > size - 1)
            fuzz_fail("grpc-message: %zu bytes decoded from %zu", len, size - 1);
        lease__etcd_pb_printable(m, len);
        for (i = 0; i < len; i++)
            if ((unsigned char)m[i] < ' ' || m[i] == 127)
                fuzz_fail("grpc-message: a control byte 0x%02x kept", (unsigned char)m[i]);
        free(m);
    }
    return 0;
}
