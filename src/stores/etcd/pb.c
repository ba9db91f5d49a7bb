/*
 * etcd/pb.c - etcd's gRPC messages as the JSON gateway's shapes (see
 * etcd/pb.h): a schema of the messages the store sends and reads, an
 * encoder from the gateway's JSON, and a decoder into it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pb.h"
#include "stores/store_int.h"

/* ---- base64 (the gateway carries keys and values as base64) ----------- */

static const char b64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *lease__etcd_b64_encode(const void *data, size_t n)
{
    const unsigned char *p = data;
    char *out = malloc(4 * ((n + 2) / 3) + 1), *o = out;
    size_t i;

    if (out == NULL)
        return NULL;
    for (i = 0; i + 2 < n; i += 3) {
        *o++ = b64[p[i] >> 2];
        *o++ = b64[((p[i] & 3) << 4) | (p[i + 1] >> 4)];
        *o++ = b64[((p[i + 1] & 15) << 2) | (p[i + 2] >> 6)];
        *o++ = b64[p[i + 2] & 63];
    }
    if (i < n) {
        *o++ = b64[p[i] >> 2];
        if (i + 1 < n) {
            *o++ = b64[((p[i] & 3) << 4) | (p[i + 1] >> 4)];
            *o++ = b64[(p[i + 1] & 15) << 2];
        } else {
            *o++ = b64[(p[i] & 3) << 4];
            *o++ = '=';
        }
        *o++ = '=';
    }
    *o = '\0';
    return out;
}

/* The value of base64 digit c, or -1 (a pad, a NUL, anything else). */
static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Is `t` (n bytes) base64 as etcd writes it: padded to whole quads? */
int lease__etcd_b64_valid(const char *t, size_t n)
{
    size_t i, pads = 0;

    if (n % 4 != 0)
        return 0;
    for (i = 0; i < n; i++) {
        if (t[i] == '=' && i + 2 >= n)
            pads++;
        else if (pads || b64_value(t[i]) < 0)
            return 0;
    }
    return 1; /* a pad is followed by pads alone (the test above) */
}

/* Decode into a NUL-terminated buffer; NULL on bad input (anything but
 * lease__etcd_b64_valid's: nothing is read past a pad). */
char *lease__etcd_b64_decode(const char *in, size_t *len)
{
    size_t n = strlen(in), o = 0;
    char *out;
    unsigned v = 0;
    int bits = 0;

    if (!lease__etcd_b64_valid(in, n) || (out = malloc(n / 4 * 3 + 4)) == NULL)
        return NULL;
    for (; *in && *in != '='; in++) {
        v = (v << 6) | (unsigned)b64_value(*in); /* valid: a digit */
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)((v >> bits) & 0xff);
        }
    }
    out[o] = '\0';
    if (len)
        *len = o;
    return out;
}

/* ---- the schema ------------------------------------------------------- */

/* How deep messages may nest, either way: a txn nests txns, which etcd
 * bounds by its own limits; the store nests two. */
#define PB_DEPTH_MAX 16

/* Field types, as the gateway writes them: int64 and uint64 as decimal
 * strings, bool true or left out, bytes as base64, string as UTF-8, enum
 * by name, message as an object. */
enum { PB_I64, PB_U64, PB_BOOL, PB_BYTES, PB_STRING, PB_ENUM, PB_MSG };

typedef struct pb_msg pb_msg;

typedef struct {
    unsigned num;
    const char *name;   /* the proto name, which the gateway uses */
    int type;
    int repeated;
    const pb_msg *msg;  /* PB_MSG */
    const char *const *names; /* PB_ENUM: by number, NULL-terminated */
} pb_field;

struct pb_msg {
    const pb_field *fields;
    size_t n;
    int oneof; /* its fields are one oneof: of two sent, the last counts */
};

#define MSG_OF(name, oneof, ...)                                          \
    static const pb_field name##_f[] = { __VA_ARGS__ };                  \
    static const pb_msg name = { name##_f, sizeof(name##_f) / sizeof(name##_f[0]), oneof }
#define MSG(name, ...) MSG_OF(name, 0, __VA_ARGS__)

static const char *const sort_order[] = { "NONE", "ASCEND", "DESCEND", NULL };
static const char *const sort_target[] = { "KEY", "VERSION", "CREATE", "MOD", "VALUE", NULL };
static const char *const cmp_result[] = { "EQUAL", "GREATER", "LESS", "NOT_EQUAL", NULL };
static const char *const cmp_target[] = { "VERSION", "CREATE", "MOD", "VALUE", "LEASE", NULL };

/* etcdserverpb (rpc.proto) and mvccpb (kv.proto), the fields the store
 * uses and those etcd 3.4 answers with. */
MSG(header_m, { 1, "cluster_id", PB_U64, 0, NULL, NULL },
    { 2, "member_id", PB_U64, 0, NULL, NULL }, { 3, "revision", PB_I64, 0, NULL, NULL },
    { 4, "raft_term", PB_U64, 0, NULL, NULL });
MSG(kv_m, { 1, "key", PB_BYTES, 0, NULL, NULL },
    { 2, "create_revision", PB_I64, 0, NULL, NULL },
    { 3, "mod_revision", PB_I64, 0, NULL, NULL }, { 4, "version", PB_I64, 0, NULL, NULL },
    { 5, "value", PB_BYTES, 0, NULL, NULL }, { 6, "lease", PB_I64, 0, NULL, NULL });
MSG(range_req_m, { 1, "key", PB_BYTES, 0, NULL, NULL },
    { 2, "range_end", PB_BYTES, 0, NULL, NULL }, { 3, "limit", PB_I64, 0, NULL, NULL },
    { 4, "revision", PB_I64, 0, NULL, NULL }, { 5, "sort_order", PB_ENUM, 0, NULL, sort_order },
    { 6, "sort_target", PB_ENUM, 0, NULL, sort_target },
    { 7, "serializable", PB_BOOL, 0, NULL, NULL }, { 8, "keys_only", PB_BOOL, 0, NULL, NULL },
    { 9, "count_only", PB_BOOL, 0, NULL, NULL },
    { 10, "min_mod_revision", PB_I64, 0, NULL, NULL },
    { 11, "max_mod_revision", PB_I64, 0, NULL, NULL },
    { 12, "min_create_revision", PB_I64, 0, NULL, NULL },
    { 13, "max_create_revision", PB_I64, 0, NULL, NULL });
MSG(put_req_m, { 1, "key", PB_BYTES, 0, NULL, NULL }, { 2, "value", PB_BYTES, 0, NULL, NULL },
    { 3, "lease", PB_I64, 0, NULL, NULL }, { 4, "prev_kv", PB_BOOL, 0, NULL, NULL },
    { 5, "ignore_value", PB_BOOL, 0, NULL, NULL },
    { 6, "ignore_lease", PB_BOOL, 0, NULL, NULL });
MSG(delete_req_m, { 1, "key", PB_BYTES, 0, NULL, NULL },
    { 2, "range_end", PB_BYTES, 0, NULL, NULL }, { 3, "prev_kv", PB_BOOL, 0, NULL, NULL });
MSG(compare_m, { 1, "result", PB_ENUM, 0, NULL, cmp_result },
    { 2, "target", PB_ENUM, 0, NULL, cmp_target }, { 3, "key", PB_BYTES, 0, NULL, NULL },
    { 4, "version", PB_I64, 0, NULL, NULL }, { 5, "create_revision", PB_I64, 0, NULL, NULL },
    { 6, "mod_revision", PB_I64, 0, NULL, NULL }, { 7, "value", PB_BYTES, 0, NULL, NULL },
    { 8, "lease", PB_I64, 0, NULL, NULL }, { 64, "range_end", PB_BYTES, 0, NULL, NULL });
MSG(range_res_m, { 1, "header", PB_MSG, 0, &header_m, NULL },
    { 2, "kvs", PB_MSG, 1, &kv_m, NULL }, { 3, "more", PB_BOOL, 0, NULL, NULL },
    { 4, "count", PB_I64, 0, NULL, NULL });
MSG(put_res_m, { 1, "header", PB_MSG, 0, &header_m, NULL },
    { 2, "prev_kv", PB_MSG, 0, &kv_m, NULL });
MSG(delete_res_m, { 1, "header", PB_MSG, 0, &header_m, NULL },
    { 2, "deleted", PB_I64, 0, NULL, NULL }, { 3, "prev_kvs", PB_MSG, 1, &kv_m, NULL });
/* A txn nests txns; the request and answer op refer to it. */
static const pb_msg txn_req_m, txn_res_m;
MSG(request_op_m, { 1, "request_range", PB_MSG, 0, &range_req_m, NULL },
    { 2, "request_put", PB_MSG, 0, &put_req_m, NULL },
    { 3, "request_delete_range", PB_MSG, 0, &delete_req_m, NULL },
    { 4, "request_txn", PB_MSG, 0, &txn_req_m, NULL });
/* An op's answer is a oneof (decode_msg). */
MSG_OF(response_op_m, 1, { 1, "response_range", PB_MSG, 0, &range_res_m, NULL },
       { 2, "response_put", PB_MSG, 0, &put_res_m, NULL },
       { 3, "response_delete_range", PB_MSG, 0, &delete_res_m, NULL },
       { 4, "response_txn", PB_MSG, 0, &txn_res_m, NULL });
static const pb_field txn_req_f[] = { { 1, "compare", PB_MSG, 1, &compare_m, NULL },
                                      { 2, "success", PB_MSG, 1, &request_op_m, NULL },
                                      { 3, "failure", PB_MSG, 1, &request_op_m, NULL } };
static const pb_msg txn_req_m = { txn_req_f, 3, 0 };
static const pb_field txn_res_f[] = { { 1, "header", PB_MSG, 0, &header_m, NULL },
                                      { 2, "succeeded", PB_BOOL, 0, NULL, NULL },
                                      { 3, "responses", PB_MSG, 1, &response_op_m, NULL } };
static const pb_msg txn_res_m = { txn_res_f, 3, 0 };
MSG(grant_req_m, { 1, "TTL", PB_I64, 0, NULL, NULL }, { 2, "ID", PB_I64, 0, NULL, NULL });
MSG(grant_res_m, { 1, "header", PB_MSG, 0, &header_m, NULL }, { 2, "ID", PB_I64, 0, NULL, NULL },
    { 3, "TTL", PB_I64, 0, NULL, NULL }, { 4, "error", PB_STRING, 0, NULL, NULL });
MSG(id_req_m, { 1, "ID", PB_I64, 0, NULL, NULL });
MSG(header_res_m, { 1, "header", PB_MSG, 0, &header_m, NULL });
MSG(keepalive_res_m, { 1, "header", PB_MSG, 0, &header_m, NULL },
    { 2, "ID", PB_I64, 0, NULL, NULL }, { 3, "TTL", PB_I64, 0, NULL, NULL });
MSG(ttl_req_m, { 1, "ID", PB_I64, 0, NULL, NULL }, { 2, "keys", PB_BOOL, 0, NULL, NULL });
MSG(ttl_res_m, { 1, "header", PB_MSG, 0, &header_m, NULL }, { 2, "ID", PB_I64, 0, NULL, NULL },
    { 3, "TTL", PB_I64, 0, NULL, NULL }, { 4, "grantedTTL", PB_I64, 0, NULL, NULL },
    { 5, "keys", PB_BYTES, 1, NULL, NULL });
MSG(auth_req_m, { 1, "name", PB_STRING, 0, NULL, NULL },
    { 2, "password", PB_STRING, 0, NULL, NULL });
MSG(auth_res_m, { 1, "header", PB_MSG, 0, &header_m, NULL },
    { 2, "token", PB_STRING, 0, NULL, NULL });

/* The calls, by the gateway path the store names them with. `stream`: a
 * streaming call, whose messages the gateway gives under "result". */
static const struct {
    const char *path, *method;
    const pb_msg *req, *res;
    int stream;
} calls[] = {
    { "/v3/kv/range", "/etcdserverpb.KV/Range", &range_req_m, &range_res_m, 0 },
    { "/v3/kv/txn", "/etcdserverpb.KV/Txn", &txn_req_m, &txn_res_m, 0 },
    { "/v3/lease/grant", "/etcdserverpb.Lease/LeaseGrant", &grant_req_m, &grant_res_m, 0 },
    { "/v3/lease/revoke", "/etcdserverpb.Lease/LeaseRevoke", &id_req_m, &header_res_m, 0 },
    { "/v3/lease/keepalive", "/etcdserverpb.Lease/LeaseKeepAlive", &id_req_m,
      &keepalive_res_m, 1 },
    { "/v3/lease/timetolive", "/etcdserverpb.Lease/LeaseTimeToLive", &ttl_req_m,
      &ttl_res_m, 0 },
    { "/v3/auth/authenticate", "/etcdserverpb.Auth/Authenticate", &auth_req_m,
      &auth_res_m, 0 },
};
#define NCALLS (sizeof(calls) / sizeof(calls[0]))

static int call_of(const char *path)
{
    size_t i;

    for (i = 0; path && i < NCALLS; i++)
        if (strcmp(calls[i].path, path) == 0)
            return (int)i;
    return -1;
}

const char *lease__etcd_pb_method(const char *path)
{
    int i = call_of(path);

    return i < 0 ? NULL : calls[i].method;
}

static const pb_field *field_named(const pb_msg *m, const char *name)
{
    size_t i;

    for (i = 0; i < m->n; i++)
        if (strcmp(m->fields[i].name, name) == 0)
            return &m->fields[i];
    return NULL;
}

static const pb_field *field_numbered(const pb_msg *m, uint64_t num)
{
    size_t i;

    for (i = 0; i < m->n; i++)
        if (m->fields[i].num == num)
            return &m->fields[i];
    return NULL;
}

/* ---- encoding --------------------------------------------------------- */

typedef struct {
    unsigned char *p;
    size_t len, cap;
    int failed;
} buf;

static void put(buf *b, const void *data, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n > b->cap) {
        size_t cap = (b->len + n) * 2 + 64;
        unsigned char *p = realloc(b->p, cap);

        if (p == NULL) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void put_varint(buf *b, uint64_t v)
{
    unsigned char t[10];
    size_t n = 0;

    do {
        t[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v)
            t[n] |= 0x80;
        n++;
    } while (v);
    put(b, t, n);
}

static void put_bytes(buf *b, unsigned num, const void *data, size_t n)
{
    put_varint(b, (uint64_t)num << 3 | 2);
    put_varint(b, n);
    put(b, data, n);
}

int lease__etcd_json_int(int64_t *out, json_t *v)
{
    const char *t = json_string_value(v);
    char *end;

    *out = 0;
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 0;
    }
    if (t == NULL || json_string_length(v) > 20 ||
        !((*t >= '0' && *t <= '9') || (*t == '-' && t[1] >= '0' && t[1] <= '9')))
        return -1;
    errno = 0;
    *out = (int64_t)strtoll(t, &end, 10);
    if (*end == '\0' && errno == 0)
        return 0;
    *out = 0;
    return -1;
}

static int encode_msg(buf *b, const pb_msg *m, json_t *obj, int depth, char *err,
                      size_t errsize);

static int encode_value(buf *b, const pb_field *f, json_t *v, int depth, char *err,
                        size_t errsize)
{
    int64_t i = 0;
    size_t n;
    char *raw;

    switch (f->type) {
    case PB_I64:
    case PB_U64:
        if (lease__etcd_json_int(&i, v) < 0)
            break;
        put_varint(b, (uint64_t)f->num << 3);
        put_varint(b, (uint64_t)i);
        return 0;
    case PB_BOOL:
        if (!json_is_boolean(v))
            break;
        put_varint(b, (uint64_t)f->num << 3);
        put_varint(b, json_is_true(v));
        return 0;
    case PB_ENUM:
        if (json_is_string(v)) {
            for (i = 0; f->names[i] && strcmp(f->names[i], json_string_value(v)) != 0; i++)
                ;
            if (f->names[i] == NULL)
                break;
        } else if (!json_is_integer(v) || (i = json_integer_value(v)) < 0) {
            break;
        }
        put_varint(b, (uint64_t)f->num << 3);
        put_varint(b, (uint64_t)i);
        return 0;
    case PB_BYTES:
        if (!json_is_string(v) || (raw = lease__etcd_b64_decode(json_string_value(v), &n)) == NULL)
            break;
        put_bytes(b, f->num, raw, n);
        free(raw);
        return 0;
    case PB_STRING:
        if (!json_is_string(v))
            break;
        put_bytes(b, f->num, json_string_value(v), json_string_length(v));
        return 0;
    case PB_MSG: {
        buf sub = { NULL, 0, 0, 0 };
        int rc;

        if (!json_is_object(v))
            break;
        rc = encode_msg(&sub, f->msg, v, depth + 1, err, errsize);
        if (rc == 0)
            put_bytes(b, f->num, sub.p ? sub.p : (unsigned char *)"", sub.len);
        b->failed |= sub.failed;
        free(sub.p);
        return rc;
    }
    }
    snprintf(err, errsize, "field %s: a value of the wrong type", f->name);
    return -1;
}

static int encode_msg(buf *b, const pb_msg *m, json_t *obj, int depth, char *err,
                      size_t errsize)
{
    const char *name;
    json_t *v;

    if (depth > PB_DEPTH_MAX) {
        snprintf(err, errsize, "nested more than %d deep", PB_DEPTH_MAX);
        return -1;
    }
    json_object_foreach(obj, name, v) {
        const pb_field *f = field_named(m, name);
        size_t i;

        if (f == NULL) {
            snprintf(err, errsize, "no field %.64s in the message", name);
            return -1;
        }
        if (f->repeated != json_is_array(v)) {
            snprintf(err, errsize, "field %s: %s", f->name,
                     f->repeated ? "not a list" : "a list");
            return -1;
        }
        if (!f->repeated) {
            if (encode_value(b, f, v, depth, err, errsize) < 0)
                return -1;
            continue;
        }
        for (i = 0; i < json_array_size(v); i++)
            if (encode_value(b, f, json_array_get(v, i), depth, err, errsize) < 0)
                return -1;
    }
    return 0;
}

int lease__etcd_pb_request(unsigned char **out, size_t *len, const char *path,
                           json_t *req, char *err, size_t errsize)
{
    buf b = { NULL, 0, 0, 0 };
    unsigned char prefix[5] = { 0, 0, 0, 0, 0 };
    int i = call_of(path);

    *out = NULL;
    *len = 0;
    err[0] = '\0';
    if (i < 0 || !json_is_object(req)) {
        snprintf(err, errsize, "no gRPC call for %.64s", path ? path : "(null)");
        return -1;
    }
    put(&b, prefix, sizeof(prefix));
    if (encode_msg(&b, calls[i].req, req, 0, err, errsize) < 0 || b.failed ||
        b.len - 5 > UINT32_MAX) {
        if (b.failed)
            snprintf(err, errsize, "out of memory");
        else if (err[0] == '\0')
            snprintf(err, errsize, "larger than a gRPC message can be");
        free(b.p);
        return -1;
    }
    /* The gRPC frame: not compressed, then the length, big-endian. */
    b.p[1] = (unsigned char)((b.len - 5) >> 24);
    b.p[2] = (unsigned char)((b.len - 5) >> 16);
    b.p[3] = (unsigned char)((b.len - 5) >> 8);
    b.p[4] = (unsigned char)(b.len - 5);
    *out = b.p;
    *len = b.len;
    return 0;
}

/* ---- protobuf --------------------------------------------------------- */

typedef struct {
    const unsigned char *p, *end;
    lease__json_spend *s;
} rd;

/* A field of `n` bytes arrives: charge what its JSON takes. */
static int charge(rd *r, const pb_field *f, uint64_t n)
{
    size_t c = f->repeated ? LEASE__JSON_COST_ELEMENT : lease__json_member(strlen(f->name));

    switch (f->type) {
    case PB_MSG: c += LEASE__JSON_COST_OBJECT; break;
    case PB_BYTES:
        c += LEASE__JSON_COST_STRING + lease__json_chunk((size_t)(n + 2) / 3 * 4 + 1);
        break;
    case PB_STRING: c += LEASE__JSON_COST_STRING + lease__json_chunk((size_t)n + 1); break;
    case PB_BOOL: break;
    /* An int64 as a decimal string, an enum by its name (or a number). */
    default: c += LEASE__JSON_COST_STRING + lease__json_chunk(21); break;
    }
    return lease__json_spend_add(r->s, c, 1);
}

static int get_varint(uint64_t *v, rd *r)
{
    int shift;

    *v = 0;
    for (shift = 0; shift < 64 && r->p < r->end; shift += 7) {
        unsigned char c = *r->p++;

        /* The tenth byte may carry one bit only. */
        if (shift == 63 && c > 1)
            return -1;
        *v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80))
            return 0;
    }
    return -1;
}

/* Skip a field of an unknown number: by its wire type. */
static int skip(rd *r, unsigned wire)
{
    uint64_t n;

    switch (wire) {
    case 0:
        return get_varint(&n, r);
    case 1:
        n = 8;
        break;
    case 2:
        if (get_varint(&n, r) < 0)
            return -1;
        break;
    case 5:
        n = 4;
        break;
    default: /* groups (3, 4) are not in etcd's API; 6 and 7 do not exist */
        return -1;
    }
    if (n > (uint64_t)(r->end - r->p))
        return -1;
    r->p += n;
    return 0;
}

/* Set obj[name] to v (taken), or, for a default value (NULL v), remove it:
 * the gateway leaves defaults out, and of a field sent twice the last
 * value counts. */
static int set_scalar(json_t *obj, const pb_field *f, json_t *v, int is_default)
{
    if (f->repeated)
        return v && json_array_append_new(json_object_get(obj, f->name), v) == 0 ? 0 : -1;
    if (is_default) {
        json_decref(v);
        json_object_del(obj, f->name);
        return 0;
    }
    return v && json_object_set_new(obj, f->name, v) == 0 ? 0 : -1;
}

static int decode_msg(json_t *obj, const pb_msg *m, rd *r, int depth, char *err,
                      size_t errsize);

static int decode_varint_field(json_t *obj, const pb_field *f, uint64_t v)
{
    char t[24];

    switch (f->type) {
    case PB_I64:
        snprintf(t, sizeof(t), "%" PRId64, (int64_t)v);
        return set_scalar(obj, f, json_string(t), v == 0);
    case PB_U64:
        snprintf(t, sizeof(t), "%" PRIu64, v);
        return set_scalar(obj, f, json_string(t), v == 0);
    case PB_BOOL:
        return set_scalar(obj, f, json_true(), v == 0);
    case PB_ENUM: {
        size_t i;

        for (i = 0; f->names[i] && i < v; i++)
            ;
        /* An enum value newer than this codec: its number, as the gateway
         * writes one it does not know. */
        if (f->names[i] == NULL || i != v)
            return set_scalar(obj, f, json_integer((json_int_t)(v & INT64_MAX)), v == 0);
        return set_scalar(obj, f, json_string(f->names[i]), v == 0);
    }
    }
    return -1;
}

/* A length-delimited field, its bytes the whole of `in`. */
static int decode_len_field(json_t *obj, const pb_field *f, rd *in, int depth, char *err,
                            size_t errsize)
{
    const unsigned char *p = in->p;
    size_t n = (size_t)(in->end - in->p);
    json_t *v;
    char *t;

    if (f->type == PB_BYTES) {
        if ((t = lease__etcd_b64_encode(p, n)) == NULL)
            return -1;
        v = json_string(t);
        free(t);
        return set_scalar(obj, f, v, n == 0);
    }
    if (f->type == PB_STRING) {
        /* proto3 strings are UTF-8: jansson refuses anything else. No
         * NUL: the store reads them as C strings (a token cut short). */
        if (memchr(p, '\0', n) != NULL) {
            snprintf(err, errsize, "field %s: holds a NUL", f->name);
            return -1;
        }
        if ((v = json_stringn((const char *)p, n)) == NULL) {
            snprintf(err, errsize, "field %s: not UTF-8", f->name);
            return -1;
        }
        return set_scalar(obj, f, v, n == 0);
    }
    /* A message: a new element of a list, or merged into the one there. */
    {
        json_t *m;

        if (f->repeated) {
            /* etcd never sends an empty entry (a key-value has its key, an
             * op its answer): refused, so that a hostile answer cannot make
             * an object of every two bytes. */
            if (n == 0) {
                snprintf(err, errsize, "field %s: an empty entry", f->name);
                return -1;
            }
            if ((m = json_object()) == NULL)
                return -1;
            if (decode_msg(m, f->msg, in, depth + 1, err, errsize) < 0) {
                json_decref(m);
                return -1;
            }
            return json_array_append_new(json_object_get(obj, f->name), m);
        }
        if ((m = json_object_get(obj, f->name)) == NULL &&
            ((m = json_object()) == NULL || json_object_set_new(obj, f->name, m) < 0))
            return -1;
        return decode_msg(m, f->msg, in, depth + 1, err, errsize);
    }
}

/* A field of a oneof message arrives: the others are gone, as protobuf's
 * parsers have it (the same field again merges, as any field does). */
static void oneof_clear(json_t *obj, const pb_msg *m, const pb_field *f)
{
    size_t i;

    for (i = 0; i < m->n; i++)
        if (&m->fields[i] != f)
            json_object_del(obj, m->fields[i].name);
}

/* -1, with why: past the budget (its memory or its deadline), or out of
 * memory. */
static int over_or_oom(const rd *r, const pb_field *f, char *err, size_t errsize)
{
    char what[64];

    snprintf(what, sizeof(what), "field %s: ", f->name);
    if (r->s->over)
        lease__json_spend_why(r->s, what, err, errsize);
    else
        snprintf(err, errsize, "%sout of memory", what);
    return -1;
}

static int decode_msg(json_t *obj, const pb_msg *m, rd *r, int depth, char *err,
                      size_t errsize)
{
    if (depth > PB_DEPTH_MAX) {
        snprintf(err, errsize, "nested more than %d deep", PB_DEPTH_MAX);
        return -1;
    }
    while (r->p < r->end) {
        uint64_t tag, v;
        const pb_field *f;
        unsigned wire;
        rd sub;

        if (get_varint(&tag, r) < 0 || tag >> 3 == 0 || tag >> 3 > 0x1fffffff) {
            snprintf(err, errsize, "a bad field tag");
            return -1;
        }
        wire = (unsigned)(tag & 7);
        if ((f = field_numbered(m, tag >> 3)) == NULL) {
            if (lease__json_spend_add(r->s, 0, 0) < 0) {
                lease__json_spend_why(r->s, "", err, errsize);
                return -1;
            }
            if (skip(r, wire) < 0) {
                snprintf(err, errsize, "field %" PRIu64 ": cut short or of a bad wire type",
                         tag >> 3);
                return -1;
            }
            continue;
        }
        if (m->oneof)
            oneof_clear(obj, m, f);
        if (f->repeated && json_object_get(obj, f->name) == NULL &&
            (lease__json_spend_add(r->s,
                                   LEASE__JSON_COST_ARRAY + lease__json_member(strlen(f->name)),
                                   1) < 0 ||
             json_object_set_new(obj, f->name, json_array()) < 0))
            return over_or_oom(r, f, err, errsize);
        if (f->type == PB_BYTES || f->type == PB_STRING || f->type == PB_MSG) {
            if (wire != 2 || get_varint(&v, r) < 0 || v > (uint64_t)(r->end - r->p)) {
                snprintf(err, errsize, "field %s: not of length-delimited type, or cut short",
                         f->name);
                return -1;
            }
            if (charge(r, f, v) < 0)
                return over_or_oom(r, f, err, errsize);
            sub = (rd){ r->p, r->p + v, r->s };
            r->p += v;
            if (decode_len_field(obj, f, &sub, depth, err, errsize) < 0) {
                if (err[0] == '\0')
                    snprintf(err, errsize, "field %s: out of memory", f->name);
                return -1;
            }
            continue;
        }
        if (wire != 0 || get_varint(&v, r) < 0) {
            snprintf(err, errsize, "field %s: not a varint, or cut short", f->name);
            return -1;
        }
        if (charge(r, f, 0) < 0 || decode_varint_field(obj, f, v) < 0)
            return over_or_oom(r, f, err, errsize);
    }
    return 0;
}

int lease__etcd_pb_answer(json_t **out, const char *path, const unsigned char *body,
                          size_t len, const lease__json_budget *budget, char *err,
                          size_t errsize)
{
    int i = call_of(path);
    uint32_t n;
    size_t top;
    lease__json_spend s = { budget, 0, 0, 0, 0 };
    json_t *obj;
    rd r = { body + 5, body + len, &s };

    *out = NULL;
    err[0] = '\0';
    if (i < 0) {
        snprintf(err, errsize, "no gRPC call for %.64s", path ? path : "(null)");
        return -1;
    }
    if (len < 5) {
        snprintf(err, errsize, "%zu bytes, no gRPC message", len);
        return -1;
    }
    n = (uint32_t)body[1] << 24 | (uint32_t)body[2] << 16 | (uint32_t)body[3] << 8 | body[4];
    if (body[0] != 0) {
        snprintf(err, errsize, "a compressed message (flag %u), never asked for", body[0]);
        return -1;
    }
    if ((size_t)n != len - 5) {
        snprintf(err, errsize, "a message of %" PRIu32 " bytes in a body of %zu", n, len - 5);
        return -1;
    }
    /* The answer's object, and the one a stream's goes in. */
    top = LEASE__JSON_COST_OBJECT;
    if (calls[i].stream)
        top += LEASE__JSON_COST_OBJECT + lease__json_member(6);
    if (lease__json_spend_add(&s, top, 1 + calls[i].stream) < 0)
        return lease__json_spend_why(&s, "", err, errsize);
    if ((obj = json_object()) == NULL) {
        snprintf(err, errsize, "out of memory");
        return -1;
    }
    if (decode_msg(obj, calls[i].res, &r, 0, err, errsize) < 0) {
        json_decref(obj);
        return s.over == LEASE__JSON_SPEND_LATE ? LEASE__JSON_LATE : -1;
    }
    if (calls[i].stream) {
        json_t *wrap = json_object();

        if (wrap == NULL || json_object_set_new(wrap, "result", obj) < 0) {
            json_decref(wrap);
            snprintf(err, errsize, "out of memory");
            return -1;
        }
        obj = wrap;
    }
    *out = obj;
    return 0;
}

char *lease__etcd_pb_message(const char *text, size_t n, size_t *len)
{
    char *out = malloc(n + 1);
    size_t i, o = 0;

    *len = 0;
    if (out == NULL)
        return NULL;
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        int hi, lo;

        if (c == '%' && i + 2 < n &&
            (hi = lease__hexval((unsigned char)text[i + 1])) >= 0 &&
            (lo = lease__hexval((unsigned char)text[i + 2])) >= 0) {
            c = (unsigned char)(hi << 4 | lo);
            i += 2;
        }
        out[o++] = (char)c;
    }
    out[o] = '\0';
    *len = o;
    return out;
}

void lease__etcd_pb_printable(char *msg, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++)
        if ((unsigned char)msg[i] < ' ' || msg[i] == 127)
            msg[i] = '?';
}
