/*
 * etcd_checks.c - checks of the etcd store and of src/util/util.c that need no
 * cmocka, driven by the scripts of this directory:
 *
 *   etcd_checks cloexec URL
 *       After an open, an acquire (a second one: the connection is reused),
 *       an inspect, a list and a release on a real etcd, every descriptor
 *       of the process is close-on-exec: a child of `lease run` inherits
 *       nothing of the store (issue 10, item 4).
 *
 *   etcd_checks parsers
 *       The local deadline of a ttl that a store answered (9e12 s and
 *       more) saturates instead of overflowing (issue 10, item 7;
 *       UBSan in the sanitizer build catches the overflow), and the
 *       duration and token parsers refuse what does not fit.
 *
 *   etcd_checks codec
 *       The gRPC codec (src/stores/etcd/pb.c): requests encode to the
 *       protobuf bytes etcd's rpc.proto gives them; answers decode to the
 *       gateway's JSON (int64 as strings, bytes as base64, defaults left
 *       out, a stream's message under "result"), skipping unknown fields,
 *       the last value of a field sent twice winning, a message sent twice
 *       merged, the last member of a oneof winning; what is cut short, of
 *       a wrong wire type, compressed, not UTF-8, nested too deep or an
 *       empty list entry is refused; what decoding an answer may cost is
 *       bounded by its budget, whatever its size (what jansson holds is
 *       counted through its allocator here), and by its deadline.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lease.h"
#include "lease_int.h"
#include "stores/etcd/pb.h"
#include "../fd_check.h"
#include "../check.h"
#include "json_count.h"


static void bad_fd(int fd, const char *target, void *when)
{
    CHECK(0, "%s: fd %d (%s) is not close-on-exec", (const char *)when, fd, target);
}

/* Every descriptor above 2 that was not inherited has FD_CLOEXEC. */
static int check_fds(const char *when)
{
    int n = fd_check_cloexec(bad_fd, (void *)when);

    printf("%s: %d descriptors of the library checked\n", when, n);
    return n;
}

static int cloexec(const char *url)
{
    lease_store *s = NULL;
    lease_grant g;
    lease_info info, *list = NULL;
    size_t n = 0;
    char owner[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    int rc;

    fd_check_note();
    rc = lease_store_open(&s, url);
    CHECK(rc == 0, "open %s: %s", url, lease_errmsg());
    if (rc < 0)
        return 1;
    check_fds("after open");
    lease_owner_new(owner);
    o.owner = owner;
    o.ttl_ms = 10000;
    rc = lease_acquire(&g, NULL, s, "cloexec/k", &o);
    CHECK(rc == 0, "acquire: %s", lease_errmsg());
    rc = lease_acquire(&g, NULL, s, "cloexec/k", &o);
    CHECK(rc == 0, "acquire again: %s", lease_errmsg());
    /* The store's connection is open (keep-alive): it must be among them. */
    CHECK(check_fds("after acquire") >= 1, "after acquire: no descriptor of the library");
    CHECK(lease_inspect(&info, s, "cloexec/k") == 0, "inspect: %s", lease_errmsg());
    CHECK(lease_list(&list, &n, s, "cloexec/") == 0 && n == 1, "list: %s (%zu keys)",
          lease_errmsg(), n);
    lease_list_free(list);
    CHECK(lease_release(s, &g) == 0, "release: %s", lease_errmsg());
    check_fds("after inspect, list and release");
    lease_store_close(s);
    return failures ? 1 : 0;
}

static void duration_bad(const char *text)
{
    uint64_t ms = 0;

    CHECK(lease_parse_duration(&ms, text) == LEASE_EINVALID, "duration '%s' accepted", text);
}

static void token_bad(const char *text)
{
    uint64_t t = 0;

    CHECK(lease_parse_token(&t, text) == LEASE_EINVALID, "token '%s' accepted", text);
}

static int parsers(void)
{
    int64_t now = lease_clock_ns();
    uint64_t t = 0, ms = 0;
    static const char *const bad_durations[] = {
        "18446744073709551616ms", "307445734561825861m", "5124095576030432h",
        "18446744073709551615ms1ms", "-1s", "+1s", " 1s", "1s ", "1", "1x", "s",
        "1.5s", "0x10s", "1sm",
    };
    static const char *const bad_tokens[] = {
        "0", "-1", "9223372036854775808", "18446744073709551616", "1e3", " 1",
        "1 ", "+1", "", "00x", "99999999999999999999999",
    };
    size_t i;

    /* A ttl an etcd answer could carry, in ms: 9e12 s, and the most. */
    CHECK(lease__deadline_ns(now, 9000000000000ULL * 1000) > now,
          "deadline of a 9e12 s ttl is not in the future");
    CHECK(lease__deadline_ns(now, UINT64_MAX) > now + 4000000000000000000LL,
          "deadline of ttl UINT64_MAX ms is not far away");
    CHECK(lease__deadline_ns(INT64_MAX - 5, 1000) == INT64_MAX,
          "deadline near INT64_MAX does not saturate");
    CHECK(lease__deadline_ns(now, 1000) == now + 980000000,
          "deadline of 1 s: %lld", (long long)(lease__deadline_ns(now, 1000) - now));
    for (i = 0; i < sizeof(bad_durations) / sizeof(bad_durations[0]); i++)
        duration_bad(bad_durations[i]);
    CHECK(lease_parse_duration(&ms, "18446744073709551615ms") == 0 && ms == UINT64_MAX,
          "the largest duration");
    for (i = 0; i < sizeof(bad_tokens) / sizeof(bad_tokens[0]); i++)
        token_bad(bad_tokens[i]);
    CHECK(lease_parse_token(&t, "9223372036854775807") == 0 && t == INT64_MAX,
          "the largest token");
    CHECK(lease_parse_token(&t, "1") == 0 && t == 1, "the smallest token");
    CHECK(lease__check_name("key", "") == LEASE_EINVALID, "empty key");
    {
        char k[LEASE_KEY_MAX + 2];

        memset(k, 'k', sizeof(k) - 1);
        k[sizeof(k) - 1] = '\0';
        CHECK(lease__check_name("key", k) == LEASE_EINVALID, "key of 256 bytes");
        k[LEASE_KEY_MAX] = '\0';
        CHECK(lease__check_name("key", k) == 0, "key of 255 bytes");
    }
    printf("parsers: %d failures\n", failures);
    return failures ? 1 : 0;
}

/* Hex digits into bytes (a fixture: the tests' own hex is well-formed). */
static size_t unhex(unsigned char *out, size_t size, const char *hex)
{
    size_t n = 0;

    for (; hex[0] && hex[1] && n < size; hex += 2)
        out[n++] = (unsigned char)(lease__hexval(hex[0]) << 4 | lease__hexval(hex[1]));
    return n;
}

/* `req` (JSON text) to `path` encodes to the gRPC body `hex`. */
static void encodes(const char *path, const char *req, const char *hex)
{
    unsigned char want[256], *got = NULL;
    size_t n = unhex(want, sizeof(want), hex), len = 0, i;
    json_t *j = json_loads(req, 0, NULL);
    char err[160] = "", text[600] = "";

    CHECK(j != NULL, "fixture %s is not JSON", req);
    CHECK(lease__etcd_pb_request(&got, &len, path, j, err, sizeof(err)) == 0,
          "encode %s %s: %s", path, req, err);
    for (i = 0; got && i < len && i < 250; i++)
        snprintf(text + 2 * i, sizeof(text) - 2 * i, "%02x", got[i]);
    CHECK(got && len == n && memcmp(got, want, n) == 0, "encode %s %s: %s, expected %s",
          path, req, text, hex);
    free(got);
    json_decref(j);
}

static void encode_refused(const char *path, const char *req)
{
    unsigned char *got = NULL;
    size_t len = 0;
    json_t *j = json_loads(req, 0, NULL);
    char err[160] = "";

    CHECK(lease__etcd_pb_request(&got, &len, path, j, err, sizeof(err)) < 0 && got == NULL &&
              err[0],
          "encode %s %s: accepted", path, req);
    free(got);
    json_decref(j);
}

/* The gRPC body of one message of `hex`. */
/* The gRPC frame of a message of n bytes, in b[0..4]: not compressed,
 * then the length. */
static void frame(unsigned char *b, size_t n)
{
    b[0] = 0;
    b[1] = (unsigned char)(n >> 24);
    b[2] = (unsigned char)(n >> 16);
    b[3] = (unsigned char)(n >> 8);
    b[4] = (unsigned char)n;
}

static size_t framed(unsigned char *out, size_t size, const char *hex)
{
    size_t n = unhex(out + 5, size - 5, hex);

    frame(out, n);
    return n + 5;
}

/* The answer `hex` (a message) to `path` decodes to the JSON `want`. */
static void decodes(const char *path, const char *hex, const char *want)
{
    unsigned char body[512];
    size_t n = framed(body, sizeof(body), hex);
    json_t *got = NULL, *w = json_loads(want, 0, NULL);
    char err[160] = "", *text;
    lease__json_budget b = lease__json_budget_of(LEASE__JSON_HOLD_ANY, n, 0);

    CHECK(lease__etcd_pb_answer(&got, path, body, n, &b, err, sizeof(err)) == 0,
          "decode %s %s: %s", path, hex, err);
    text = got ? json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    CHECK(w && got && json_equal(got, w), "decode %s %s: %s, expected %s", path, hex,
          text ? text : "(nothing)", want);
    json_count_free(text);
    json_decref(got);
    json_decref(w);
}

/* The body `body` (n bytes) to `path` is refused, saying why. */
static void body_refused(const char *path, const unsigned char *body, size_t n,
                         const char *what)
{
    json_t *got = NULL;
    char err[160] = "";
    lease__json_budget b = lease__json_budget_of(LEASE__JSON_HOLD_ANY, n, 0);

    CHECK(lease__etcd_pb_answer(&got, path, body, n, &b, err, sizeof(err)) < 0 && got == NULL &&
              err[0],
          "decode %s: %s accepted", path, what);
    json_decref(got);
}

static void refused(const char *path, const char *hex, const char *what)
{
    unsigned char body[512];

    body_refused(path, body, framed(body, sizeof(body), hex), what);
}

/* n bytes of `unit` (u bytes) repeated, as one framed message in a
 * malloc'ed body (*len bytes). */
static unsigned char *repeated(size_t *len, const void *unit, size_t u, size_t n)
{
    size_t m = n / u * u, i;
    unsigned char *b = malloc(5 + m);

    if (b == NULL)
        return NULL;
    frame(b, m);
    for (i = 0; i < m; i += u)
        memcpy(b + 5 + i, unit, u);
    *len = 5 + m;
    return b;
}

/* n entries of `entry` (bytes, each under 128) as one framed Range answer
 * in a malloc'ed body (*len bytes). */
static unsigned char *range_of(size_t *len, const unsigned char *entry, size_t elen,
                               size_t n)
{
    unsigned char unit[130];

    unit[0] = 0x12; /* kvs, length-delimited */
    unit[1] = (unsigned char)elen;
    memcpy(unit + 2, entry, elen);
    return repeated(len, unit, elen + 2, n * (elen + 2));
}

/* v as a protobuf varint at p; its length. */
static size_t varint(unsigned char *p, size_t v)
{
    size_t n = 0;

    for (; v > 0x7f; v >>= 7)
        p[n++] = (unsigned char)((v & 0x7f) | 0x80);
    p[n++] = (unsigned char)v;
    return n;
}

/* The answer a decoder gave (rc, got, err) with budget b, checked as
 * `what`: jansson held no more than the budget's bytes meanwhile, and a
 * refusal says it is for the answer's cost (or deadline). rc. */
static int within(int rc, json_t *got, const char *err, const lease__json_budget *b,
                  const char *what)
{
    CHECK(json_count_peak() <= b->bytes, "%s: jansson held %zu bytes, past the budget of %zu",
          what, json_count_peak(), b->bytes);
    if (rc < 0)
        CHECK(got == NULL && strstr(err, rc == LEASE__JSON_LATE ? "timeout" : "to hold"),
              "%s: refused (%d), but not for its cost: %s", what, rc, err);
    return rc;
}

/* Decoding `body` (len bytes) as a Range answer with budget b: 0 when it
 * decodes to `kvs` key-values, or the decoder's refusal (within()).
 * *json: the answer as the gateway's JSON, when asked. */
static int range_within(const unsigned char *body, size_t len, const lease__json_budget *b,
                        size_t kvs, char **json, const char *what)
{
    json_t *got = NULL;
    char err[160] = "";
    int rc;

    json_count_reset();
    rc = within(lease__etcd_pb_answer(&got, "/v3/kv/range", body, len, b, err, sizeof(err)),
                got, err, b, what);
    if (rc == 0) {
        CHECK(json_array_size(json_object_get(got, "kvs")) == kvs, "%s: %zu key-values decoded",
              what, json_array_size(json_object_get(got, "kvs")));
        if (json)
            *json = json_dumps(got, JSON_COMPACT);
    }
    json_decref(got);
    return rc;
}

/* The same for the gateway's JSON text (len bytes): 0 when it loads with
 * `kvs` key-values. */
static int json_within(const char *text, size_t len, const lease__json_budget *b, size_t kvs,
                       const char *what)
{
    json_t *got = NULL;
    char err[160] = "";
    int rc;

    json_count_reset();
    rc = within(lease__json_load(&got, text, len, b, err, sizeof(err)), got, err, b, what);
    if (rc == 0)
        CHECK(json_array_size(json_object_get(got, "kvs")) == kvs, "%s: %zu key-values loaded",
              what, json_array_size(json_object_get(got, "kvs")));
    json_decref(got);
    return rc;
}

/* `size` bytes of key-values without a value ("/lease/seen/ab" and three
 * revisions, 28 bytes each) as one framed Range answer; *count of them. */
static unsigned char *seen_kvs(size_t *len, size_t *count, size_t size)
{
    unsigned char kv[32];
    size_t n = 0;

    kv[n++] = 0x0a; /* key */
    kv[n++] = 14;
    memcpy(kv + n, "/lease/seen/ab", 14);
    n += 14;
    memcpy(kv + n, "\x10\xa0\x9c\x01\x18\xa0\x9c\x01\x20\x01", 10); /* revisions, version */
    n += 10;
    *count = size / (n + 2);
    return range_of(len, kv, n, *count);
}

/* One key-value with a 3 MiB value decodes as a data read. */
static void value_read(void)
{
    lease__json_budget value;
    size_t count = (size_t)3 << 20;
    unsigned char *b = malloc(count + 32);

    if (b != NULL) {
        unsigned char head[16];
        size_t m = 5, h = 0;

        head[h++] = 0x0a; /* key "a" */
        head[h++] = 1;
        head[h++] = 'a';
        head[h++] = 0x2a; /* value, then its length */
        h += varint(head + h, count);
        b[m++] = 0x12; /* kvs: an entry of the head and the value */
        m += varint(b + m, h + count);
        memcpy(b + m, head, h);
        m += h;
        memset(b + m, 'v', count);
        m += count;
        frame(b, m - 5);
        value = lease__json_budget_of(LEASE__JSON_HOLD_VALUE, m, 0);
        CHECK(range_within(b, m, &value, 1, NULL, "a 3 MiB value") == 0,
              "one 3 MiB value decodes as a data read");
        free(b);
    }
}

/*
 * What decoding an answer may cost is bounded by its budget (etcd_pb.h),
 * not by its size, and jansson never holds more than that meanwhile:
 *  - 1 MiB of key-values without a value (37,000 of them, about 33 MiB
 *    as JSON values) decode as a list, over gRPC and as the gateway's
 *    JSON; not as the answer to a data read (too many values), nor with
 *    a budget of 8 MiB; with the deadline passed, neither decodes;
 *  - 4 MiB of them (about 130 MiB as JSON values), 4 MiB of 4-byte
 *    entries and 32 MiB of empty txn answers (2 GiB) are refused within
 *    64 MiB, and 4 MiB of empty objects as JSON before parsing;
 *  - one 3 MiB value decodes as a data read.
 */
static void codec_budget(void)
{
    unsigned char *b;
    size_t len = 0, count = 0, i;
    char *text = NULL;
    lease__json_budget any, tight, late, value;

    b = seen_kvs(&len, &count, (size_t)1 << 20);
    any = lease__json_budget_of(LEASE__JSON_HOLD_ANY, len, 0);
    value = lease__json_budget_of(LEASE__JSON_HOLD_VALUE, len, 0);
    tight = late = any;
    tight.bytes = (size_t)8 << 20;
    late.end_ns = lease_clock_ns() - 1;
    CHECK(b && range_within(b, len, &any, count, &text, "1 MiB of value-less key-values") == 0,
          "1 MiB of value-less key-values over gRPC decode as a list");
    CHECK(b && range_within(b, len, &value, count, NULL, "the same as a data read") == -1,
          "the same key-values are refused as the answer to a data read");
    CHECK(b && range_within(b, len, &tight, count, NULL, "the same within 8 MiB") == -1,
          "the same key-values are refused within 8 MiB");
    CHECK(b && range_within(b, len, &late, count, NULL, "the same, late") == LEASE__JSON_LATE,
          "the same key-values past the deadline are LEASE__JSON_LATE");
    free(b);
    if (text) {
        CHECK(json_within(text, strlen(text), &any, count, "them as JSON") == 0,
              "the same key-values as the gateway's JSON (%zu bytes) load", strlen(text));
        CHECK(json_within(text, strlen(text), &tight, count, "them as JSON in 8 MiB") == -1,
              "the same key-values as JSON are refused within 8 MiB");
        CHECK(json_within(text, strlen(text), &late, count, "them as JSON, late") ==
                  LEASE__JSON_LATE,
              "the same key-values as JSON past the deadline are LEASE__JSON_LATE");
        json_count_free(text);
    }
    b = seen_kvs(&len, &count, (size_t)4 << 20);
    CHECK(b && range_within(b, len, &any, count, NULL, "4 MiB of key-values") == -1,
          "4 MiB of value-less key-values over gRPC are refused");
    free(b);
    b = repeated(&len, "\x12\x02\x78\x00", 4, (size_t)4 << 20); /* kvs {field 15} */
    CHECK(b && range_within(b, len, &any, 0, NULL, "4-byte entries") == -1,
          "4 MiB of 4-byte entries over gRPC are refused");
    free(b);
    b = repeated(&len, "\x1a\x02\x12\x00", 4, ((size_t)32 << 20) - 16); /* an empty put's */
    if (b) {
        json_t *got = NULL;
        char err[160] = "";

        json_count_reset();
        CHECK(within(lease__etcd_pb_answer(&got, "/v3/kv/txn", b, len, &any, err, sizeof(err)),
                     got, err, &any, "32 MiB of empty txn answers") == -1,
              "32 MiB of empty txn answers are refused");
        free(b);
    }
    len = ((size_t)4 << 20) / 3 * 3;
    if ((text = malloc(len + 2)) != NULL) {
        for (i = 0; i < len; i += 3)
            memcpy(text + i, i == 0 ? "[{}" : ",{}", 3);
        text[len++] = ']';
        CHECK(json_within(text, len, &any, 0, "4 MiB of {}") == -1 && json_count_peak() == 0,
              "4 MiB of empty objects as JSON are refused before parsing");
        free(text);
    }
    value_read();
}

static int codec(void)
{
    unsigned char body[600];
    size_t n, i;
    char *m;

    /* Requests, field by field as rpc.proto numbers them. */
    encodes("/v3/lease/keepalive", "{\"ID\": 7}", "00000000020807");
    encodes("/v3/lease/grant", "{\"TTL\": 30}", "0000000002081e");
    encodes("/v3/lease/revoke", "{\"ID\": \"300\"}", "000000000308ac02");
    encodes("/v3/lease/timetolive", "{\"ID\": 1, \"keys\": true}", "000000000408011001");
    encodes("/v3/kv/range",
            "{\"key\": \"YQ==\", \"range_end\": \"Yg==\", \"limit\": 2, "
            "\"sort_order\": \"DESCEND\", \"sort_target\": \"CREATE\", "
            "\"count_only\": true}",
            "000000000e0a0161120162180228023002" "4801");
    encodes("/v3/kv/txn",
            "{\"compare\": [{\"key\": \"YQ==\", \"target\": \"CREATE\", "
            "\"result\": \"EQUAL\", \"create_revision\": 0}], "
            "\"success\": [{\"request_put\": {\"key\": \"YQ==\", \"value\": \"Yg==\", "
            "\"lease\": -1}}], \"failure\": [{\"request_range\": {\"key\": \"YQ==\"}}]}",
            "00000000" "27" "0a091a0161100108002800"
            "1213" "1211" "0a0161120162" "18ffffffffffffffffff01"
            "1a05" "0a03" "0a0161");
    encodes("/v3/auth/authenticate", "{\"name\": \"r\", \"password\": \"p\"}",
            "00000000060a0172120170");
    encode_refused("/v3/kv/txn", "{\"nosuch\": 1}");
    encode_refused("/v3/kv/txn", "{\"compare\": {\"key\": \"YQ==\"}}");
    encode_refused("/v3/kv/range", "{\"key\": \"not base64!\"}");
    encode_refused("/v3/kv/range", "{\"sort_order\": \"SIDEWAYS\"}");
    encode_refused("/v3/kv/range", "{\"limit\": \"12x\"}");
    encode_refused("/v3/watch", "{}");
    CHECK(lease__etcd_pb_method("/v3/watch") == NULL, "the watch stays on the gateway");
    CHECK(strcmp(lease__etcd_pb_method("/v3/kv/txn"), "/etcdserverpb.KV/Txn") == 0,
          "the txn's method");

    /* Answers as the gateway writes them. */
    decodes("/v3/kv/range",
            "0a0218051213" "0a0161100318032001" "2a0162" "3007" "7d00000000" "2001",
            "{\"header\": {\"revision\": \"5\"}, \"kvs\": [{\"key\": \"YQ==\", "
            "\"create_revision\": \"3\", \"mod_revision\": \"3\", \"version\": \"1\", "
            "\"value\": \"Yg==\", \"lease\": \"7\"}], \"count\": \"1\"}");
    decodes("/v3/lease/keepalive", "0a02180510071803",
            "{\"result\": {\"header\": {\"revision\": \"5\"}, \"ID\": \"7\", "
            "\"TTL\": \"3\"}}");
    decodes("/v3/lease/timetolive", "10011802200a2a00" "2a0161",
            "{\"ID\": \"1\", \"TTL\": \"2\", \"grantedTTL\": \"10\", "
            "\"keys\": [\"\", \"YQ==\"]}");
    decodes("/v3/kv/txn", "1001" "1a0a" "0a08" "0a02180612020a00",
            "{\"succeeded\": true, \"responses\": [{\"response_range\": "
            "{\"header\": {\"revision\": \"6\"}, \"kvs\": [{}]}}]}");
    /* Defaults left out; negative and large numbers; unknown enum values
     * by number; unknown fields (every wire type) skipped. */
    decodes("/v3/kv/txn", "1000", "{}");
    decodes("/v3/kv/range", "0a0b18ffffffffffffffffff01", "{\"header\": {\"revision\": \"-1\"}}");
    decodes("/v3/kv/range", "0a0b08ffffffffffffffffff01",
            "{\"header\": {\"cluster_id\": \"18446744073709551615\"}}");
    decodes("/v3/kv/range", "f80601" "fa0602abcd" "fd0601020304" "f9060102030405060708" "2002",
            "{\"count\": \"2\"}");
    /* Twice: the last value wins, a default one removes it; messages merge. */
    decodes("/v3/kv/range", "20052006", "{\"count\": \"6\"}");
    decodes("/v3/kv/range", "20052000", "{}");
    decodes("/v3/kv/range", "0a0218050a022002",
            "{\"header\": {\"revision\": \"5\", \"raft_term\": \"2\"}}");
    decodes("/v3/auth/authenticate", "1205746f6b656e", "{\"token\": \"token\"}");
    /* Base64 as etcd writes it: padded quads, nothing after a pad. */
    {
        static const struct {
            const char *t;
            size_t n;
            int ok;
        } b[] = { { "", 0, 1 }, { "YQ==", 4, 1 }, { "YWI=", 4, 1 }, { "YWJj", 4, 1 },
                  { "Y", 1, 0 }, { "YQ=", 3, 0 }, { "YQ=A", 4, 0 }, { "Y===", 4, 0 },
                  { "YQ==YQ==", 8, 0 }, { "YQ==x", 5, 0 }, { "Y!==", 4, 0 },
                  { "Y\0==", 4, 0 } };
        size_t k, len;
        char *d;

        for (k = 0; k < sizeof(b) / sizeof(b[0]); k++) {
            CHECK(lease__etcd_b64_valid(b[k].t, b[k].n) == b[k].ok, "base64 '%s' (%zu): %s",
                  b[k].t, b[k].n, b[k].ok ? "valid" : "not valid");
            if (strlen(b[k].t) != b[k].n)
                continue;
            d = lease__etcd_b64_decode(b[k].t, &len);
            CHECK((d != NULL) == b[k].ok, "base64 '%s' %s", b[k].t,
                  b[k].ok ? "decodes" : "is refused by the decoder");
            free(d);
        }
        d = lease__etcd_b64_decode("YWI=", &len);
        CHECK(d && len == 2 && memcmp(d, "ab", 3) == 0, "base64 'YWI=' is \"ab\"");
        free(d);
    }
    refused("/v3/auth/authenticate", "1203610062", "a string with a NUL");
    /* A ResponseOp's answer is a oneof: of two, the last one counts. */
    decodes("/v3/kv/txn", "1a08" "0a02" "2001" "1202" "0a00",
            "{\"responses\": [{\"response_put\": {\"header\": {}}}]}");
    decodes("/v3/kv/txn", "1a08" "1202" "0a00" "0a02" "2001",
            "{\"responses\": [{\"response_range\": {\"count\": \"1\"}}]}");

    /* Refused. */
    refused("/v3/kv/range", "0a", "a field cut before its length");
    refused("/v3/kv/range", "0aff01", "a length past the end");
    refused("/v3/kv/range", "0a80808080808080808080", "an 11-byte varint");
    refused("/v3/kv/range", "1001", "a message field as a varint");
    refused("/v3/kv/range", "1000", "a message field as a varint 0");
    refused("/v3/kv/range", "2202abcd", "an int64 field as bytes");
    refused("/v3/kv/range", "0b0c", "a known field (header) of wire type 3");
    refused("/v3/kv/range", "2b2c", "a group (wire type 3) of an unknown field");
    refused("/v3/kv/range", "1200", "an empty entry of kvs");
    refused("/v3/kv/txn", "1a00", "an empty entry of responses");
    refused("/v3/kv/range", "00", "field number 0");
    refused("/v3/kv/range", "f8ffffffff0f01", "a field number past 2^29");
    refused("/v3/kv/range", "fd06010203", "a fixed32 cut short");
    refused("/v3/auth/authenticate", "1202ff61", "a string that is not UTF-8");
    {
        /* A txn answer nested 18 deep: from an empty TxnResponse, each of
         * nine turns wraps it in ResponseOp{response_txn} inside
         * TxnResponse{responses}. */
        int d;

        {
            unsigned char msg[200];
            size_t len = 0;

            for (d = 0; d < 9; d++) {
                unsigned char t[200];
                size_t k = len;

                /* ResponseOp{4: TxnResponse(msg)} */
                t[0] = 0x22;
                t[1] = (unsigned char)k;
                memcpy(t + 2, msg, k);
                /* TxnResponse{3: ResponseOp} */
                msg[0] = 0x1a;
                msg[1] = (unsigned char)(k + 2);
                memcpy(msg + 2, t, k + 2);
                len = k + 4;
            }
            body[0] = 0;
            body[1] = body[2] = body[3] = 0;
            body[4] = (unsigned char)len;
            memcpy(body + 5, msg, len);
            body_refused("/v3/kv/txn", body, len + 5, "nested 18 deep");
        }
    }
    n = framed(body, sizeof(body), "2001");
    body[0] = 1;
    body_refused("/v3/kv/range", body, n, "a compressed message");
    n = framed(body, sizeof(body), "2001");
    body[4] = 3;
    body_refused("/v3/kv/range", body, n, "a frame longer than its body");
    n = framed(body, sizeof(body), "2001");
    body_refused("/v3/kv/range", body, n - 1, "a body shorter than its frame");
    body_refused("/v3/kv/range", body, 4, "no frame");
    n = framed(body, sizeof(body), "2001");
    memcpy(body + n, body, n);
    body_refused("/v3/kv/range", body, 2 * n, "two messages to a unary call");
    n = framed(body, sizeof(body), "2001");
    body[n] = 0x20;
    body[n + 1] = 0x02;
    body_refused("/v3/kv/range", body, n + 2, "bytes after the message");
    body_refused("/v3/watch", body, n, "an answer to a call that is not gRPC's");

    /* grpc-message: percent-escapes decoded, control bytes shown as '?'. */
    m = lease__etcd_pb_message("a%41%zz%0a\x01%00b%", sizeof("a%41%zz%0a\x01%00b%") - 1, &n);
    CHECK(m && n == 10 && memcmp(m, "aA%zz\n\x01\0b%", 10) == 0,
          "grpc-message decoded: %zu bytes", n);
    if (m)
        lease__etcd_pb_printable(m, n);
    CHECK(m && n == 10 && memcmp(m, "aA%zz???b%", 10) == 0, "grpc-message printable");
    free(m);
    for (i = 0; i < 3; i++) {
        static const char *const b64[][2] = { { "", "" }, { "a", "YQ==" }, { "abcd", "YWJjZA==" } };
        char *e = lease__etcd_b64_encode(b64[i][0], strlen(b64[i][0]));

        CHECK(e && strcmp(e, b64[i][1]) == 0, "base64 of '%s': %s", b64[i][0], e);
        free(e);
    }
    {
        /* Every byte value, so every digit of the alphabet, both ways. */
        unsigned char all[256];
        char *e, *d;
        size_t len = 0;

        for (i = 0; i < sizeof(all); i++)
            all[i] = (unsigned char)i;
        e = lease__etcd_b64_encode(all, sizeof(all));
        d = e ? lease__etcd_b64_decode(e, &len) : NULL;
        CHECK(d && len == sizeof(all) && memcmp(d, all, len) == 0,
              "base64 of the 256 byte values decodes to them");
        free(e);
        free(d);
    }
    codec_budget();
    printf("codec: %d failures\n", failures);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "cloexec") == 0)
        return cloexec(argv[2]);
    if (argc == 2 && strcmp(argv[1], "parsers") == 0)
        return parsers();
    if (argc == 2 && strcmp(argv[1], "codec") == 0) {
        /* Before jansson allocates anything; what it writes out (json_dumps)
         * is freed by json_count_free then. */
        json_count_start();
        return codec();
    }
    fprintf(stderr, "usage: etcd_checks cloexec URL | parsers | codec\n");
    return 2;
}
