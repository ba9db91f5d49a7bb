/*
 * fuzz_etcd_pb.c - the etcd store's gRPC codec (src/stores/etcd_pb.c) on
 * input it cannot trust: the first byte picks a call and a part, the rest
 * is the input.
 *
 *   answers   the rest as one framed message (or, with bit 0x80, as the
 *             whole body) to the call's answer decoder;
 *   requests  with bit 0x40, the rest as JSON to the call's request
 *             encoder (the store only encodes JSON it built, but the
 *             encoder must refuse anything else cleanly);
 *   messages  always, the rest as a grpc-message header's text, decoded
 *             then made printable.
 *
 * Properties: no crash, leak or undefined behaviour; a decoder either
 * answers a JSON object that jansson can write out (valid UTF-8) and an
 * empty reason, or refuses with a reason and no object; an encoder either
 * gives a frame whose length prefix is its size less five, or refuses with
 * a reason; a decoded grpc-message holds no control byte.
 */
#include "fuzz_util.h"
#include "stores/etcd_pb.h"

static const char *const paths[] = {
    "/v3/kv/range", "/v3/kv/txn", "/v3/lease/grant", "/v3/lease/revoke",
    "/v3/lease/keepalive", "/v3/lease/timetolive", "/v3/auth/authenticate",
};

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
    rc = lease__etcd_pb_answer(&j, path, body, n, LEASE__ETCD_HOLD_ANY, err, sizeof(err));
    if (rc == 0) {
        if (!json_is_object(j) || err[0] != '\0')
            fuzz_fail("%s: decoded, but not to an object, or with a reason '%s'", path, err);
        if ((text = json_dumps(j, JSON_COMPACT)) == NULL)
            fuzz_fail("%s: the decoded answer cannot be written out", path);
        free(text);
    } else if (rc != -1 || j != NULL || err[0] == '\0') {
        fuzz_fail("%s: refused (%d) without a reason, or with an object", path, rc);
    }
    json_decref(j);
    free(body);
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
    path = paths[(data[0] & 0x3f) % (sizeof(paths) / sizeof(paths[0]))];
    if (data[0] & 0x40)
        request(path, data + 1, size - 1);
    else
        answer(path, data + 1, size - 1, data[0] & 0x80);
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
