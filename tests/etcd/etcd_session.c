/*
 * etcd_session.c - sessions on etcd keep every grant in one etcd lease
 * (the store's share_lease and renew_many slots), against the server of
 * $LEASE_TEST_ETCD_URL (or argv[1]); without one it fails, it never skips.
 * Each run uses a fresh key prefix of its own.
 *
 *  - a session of 200 grants: every key is attached to one etcd lease,
 *    which lists exactly those keys, their meta/ keys and its shared/
 *    marker; tokens are the keys' create revisions, increasing;
 *  - renew_many of 200 grants (through the backend table) is one
 *    keep-alive, one LeaseTimeToLive and one Range, counted by etcd's own
 *    gRPC counters (/metrics), and refuses a wrong token and a deleted key
 *    alone; a session's round is one keep-alive too;
 *  - revoking the shared lease behind the session's back loses every
 *    grant (callbacks, LEASE_ELOST), and the next acquire gets a new one;
 *  - deleting one key behind its back loses that grant alone;
 *  - releasing one grant, from the session or from another handle by
 *    owner and token, leaves the shared lease and the other grants alone;
 *  - acquire, release, acquire again of one key in one session: two
 *    history entries with their tokens, the first one released;
 *  - a release whose outcome is unknown (a paused forwarder) leaves its
 *    key attached: the next renew_many deletes it, the other grants stay;
 *  - keys put on the shared lease behind the handle's back (orphans) are
 *    deleted by the next renew_many; the grants' keys stay;
 *  - a grant's key deleted and put again on the shared lease by someone
 *    else (a new create revision) is that grant lost, and an orphan;
 *  - a list of 64,000 keys, more than one answer may take to hold, is
 *    read a page at a time, each key once, in order.
 *
 * Plain grants (no share_lease) reuse the handle's etcd leases (issue 16):
 *  - a warm handle's acquire + release is two txns and a keep-alive, no
 *    LeaseGrant and no LeaseRevoke (etcd's counters), the key on the etcd
 *    lease the previous grant released, which is left idle, not revoked;
 *  - two grants held at once have an etcd lease each, holding only their
 *    own keys: renewing one does not keep the other, which expires;
 *  - an idle lease revoked behind the handle's back is replaced; another
 *    ttl gets another lease;
 *  - an acquire whose outcome is unknown (a paused forwarder) does not
 *    give its lease back: the next acquire does not reuse it;
 *  - the handle's HTTP connections are kept alive: the same TCP sockets
 *    (local ports) after 50 cycles as after the first.
 *
 * etcd is asked directly (libcurl, its JSON gateway) for what it holds:
 * the library's own answers would not show which etcd lease a key is on.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>

#include "lease.h"
#include "lease/session.h"
#include "lease/sys/store.h"
#include "conf_assert.h"
#include "conf_util.h"

#define TTL_MS 6000
#define MANY 200

static char url[512];     /* the server's URL with this run's prefix */
static char http[300];    /* "http://host:port" */
static char prefix[128];  /* "/etcd_session_<uuid>/" */
static char owner[LEASE_OWNER_BUFSZ];
static lease_store *store;
static const char *base_url; /* $LEASE_TEST_ETCD_URL or argv[1] */

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    nanosleep(&ts, NULL);
}

/* ---- etcd, asked directly ------------------------------------------------ */

static const char b64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *enc64(const char *s)
{
    size_t n = strlen(s), i;
    char *out = calloc(4 * (n / 3 + 1) + 1, 1), *o = out;

    assert_non_null(out);
    for (i = 0; i < n; i += 3) {
        unsigned v = (unsigned char)s[i] << 16;

        if (i + 1 < n)
            v |= (unsigned char)s[i + 1] << 8;
        if (i + 2 < n)
            v |= (unsigned char)s[i + 2];
        *o++ = b64[(v >> 18) & 63];
        *o++ = b64[(v >> 12) & 63];
        *o++ = i + 1 < n ? b64[(v >> 6) & 63] : '=';
        *o++ = i + 2 < n ? b64[v & 63] : '=';
    }
    return out;
}

static char *dec64(const char *s)
{
    char *out = calloc(strlen(s) + 1, 1);
    unsigned v = 0;
    int bits = 0;
    size_t o = 0;

    assert_non_null(out);
    for (; *s && *s != '='; s++) {
        const char *c = strchr(b64, *s);

        assert_non_null(c);
        v = (v << 6) | (unsigned)(c - b64);
        if ((bits += 6) >= 8) {
            bits -= 8;
            out[o++] = (char)((v >> bits) & 0xff);
        }
    }
    return out;
}

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
    char **buf = arg;
    size_t have = *buf ? strlen(*buf) : 0;
    char *b = realloc(*buf, have + size * n + 1);

    assert_non_null(b);
    memcpy(b + have, p, size * n);
    b[have + size * n] = '\0';
    *buf = b;
    return size * n;
}

/* GET (body NULL) or POST `path`; the answer's text, malloc'ed. */
static char *http_text(const char *path, const char *body)
{
    CURL *c = curl_easy_init();
    char u[400], *buf = NULL;
    long status = 0;

    assert_non_null(c);
    snprintf(u, sizeof(u), "%s%s", http, path);
    curl_easy_setopt(c, CURLOPT_URL, u);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &buf);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    if (body)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    if (curl_easy_perform(c) != CURLE_OK)
        fail_msg("%s: no answer", u);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    if (status != 200)
        fail_msg("%s: HTTP %ld: %s", u, status, buf ? buf : "");
    return buf;
}

/* POST a JSON request built by json_pack (taken); the answer. */
static json_t *etcd(const char *path, json_t *req)
{
    char *body = json_dumps(req, JSON_COMPACT), *text;
    json_t *res;

    assert_non_null(body);
    text = http_text(path, body);
    res = json_loads(text, 0, NULL);
    assert_non_null(res);
    free(body);
    free(text);
    json_decref(req);
    return res;
}

static int64_t jint(json_t *o, const char *name)
{
    json_t *v = json_object_get(o, name);

    return json_is_string(v) ? strtoll(json_string_value(v), NULL, 10)
                             : json_integer_value(v);
}

/* "<prefix><kind><name>" as base64, for a request. */
static json_t *jkey(const char *kind, const char *name)
{
    char k[512], *e;
    json_t *j;

    snprintf(k, sizeof(k), "%s%s%s", prefix, kind, name);
    e = enc64(k);
    j = json_string(e);
    free(e);
    return j;
}

/* The etcd lease that P lease/key is attached to, and its create revision. */
static int64_t lease_of(const char *key, uint64_t *create_revision)
{
    json_t *res = etcd("/v3/kv/range", json_pack("{s:o}", "key", jkey("lease/", key)));
    json_t *kv = json_array_get(json_object_get(res, "kvs"), 0);
    int64_t id;

    if (kv == NULL)
        fail_msg("'%s' is not held in etcd", key);
    id = jint(kv, "lease");
    if (create_revision)
        *create_revision = (uint64_t)jint(kv, "create_revision");
    json_decref(res);
    return id;
}

static int key_exists(const char *kind, const char *key)
{
    json_t *res = etcd("/v3/kv/range", json_pack("{s:o, s:b}", "key", jkey(kind, key),
                                                 "count_only", 1));
    int n = (int)jint(res, "count");

    json_decref(res);
    return n;
}

/* The TTL of etcd lease `id` (-1: gone) and how many of its keys are
 * "<prefix><kind>..."; has_key: whether "<prefix>lease/<key>" is one. */
static int64_t lease_keys(int64_t id, const char *kind, size_t *count, const char *key,
                          int *has_key)
{
    json_t *res = etcd("/v3/lease/timetolive", json_pack("{s:I, s:b}", "ID", (json_int_t)id,
                                                         "keys", 1));
    json_t *keys = json_object_get(res, "keys");
    char want[512], full[512];
    int64_t ttl = jint(res, "TTL");
    size_t i;

    snprintf(want, sizeof(want), "%s%s", prefix, kind);
    snprintf(full, sizeof(full), "%slease/%s", prefix, key ? key : "");
    *count = 0;
    if (has_key)
        *has_key = 0;
    for (i = 0; i < json_array_size(keys); i++) {
        char *k = dec64(json_string_value(json_array_get(keys, i)));

        *count += strncmp(k, want, strlen(want)) == 0;
        if (has_key && key && strcmp(k, full) == 0)
            *has_key = 1;
        free(k);
    }
    json_decref(res);
    return ttl;
}

/* How many calls of gRPC method `method` etcd started (its own counter,
 * which the JSON gateway's requests go through; a method never called may
 * have no line yet). */
static long grpc_calls(const char *method)
{
    char *text = http_text("/metrics", NULL), *line, *save = NULL, want[96];
    double total = 0;
    int family = 0;

    snprintf(want, sizeof(want), "grpc_method=\"%s\"", method);
    for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "grpc_server_started_total{", 26) != 0)
            continue;
        family = 1;
        if (strstr(line, want) && strrchr(line, ' '))
            total += strtod(strrchr(line, ' ') + 1, NULL); /* may be 1.2e+06 */
    }
    free(text);
    if (!family)
        fail_msg("etcd's /metrics has no grpc_server_started_total");
    return (long)total;
}

/* ---- sessions ------------------------------------------------------------- */

static atomic_int lost_count[MANY];
static atomic_int lost_reason[MANY];

static void on_lost(lease_held *held, int reason, void *payload)
{
    size_t i = (size_t)(uintptr_t)payload;

    (void)held;
    atomic_store(&lost_reason[i], reason);
    atomic_fetch_add(&lost_count[i], 1);
}

static lease_session *session_open(void)
{
    lease_session_opts so = LEASE_SESSION_OPTS_INIT;
    lease_session *s = NULL;
    size_t i;

    for (i = 0; i < MANY; i++) {
        atomic_store(&lost_count[i], 0);
        atomic_store(&lost_reason[i], 0);
    }
    so.owner = owner;
    so.ttl_ms = TTL_MS;
    so.label = "etcd_session";
    CHECK_RC(0, lease_session_open(&s, store, &so));
    return s;
}

/* Acquire keys "<tag>/000" .. for n grants, grant i's callback counting
 * in lost_count[i]. */
static void session_take(lease_held **h, lease_session *s, const char *tag, size_t n)
{
    char key[64];
    size_t i;

    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s/%03zu", tag, i);
        CHECK_RC(0, lease_session_acquire(&h[i], NULL, s, key, 0, on_lost,
                                          (void *)(uintptr_t)i));
    }
}

/* Wait, at most four ttls, for held's deadline to move past `than`: a
 * round of renewals went by. */
static void wait_renewed(const lease_held *held, int64_t than)
{
    int i;

    for (i = 0; i < 4 * TTL_MS / 20 && lease_held_deadline_ns(held) <= than; i++)
        sleep_ms(20);
    if (lease_held_deadline_ns(held) <= than)
        fail_msg("no round of renewals in four ttls");
}

/* ---- tests ----------------------------------------------------------------- */

/* 200 grants, one etcd lease holding exactly their keys; tokens are the
 * keys' create revisions, increasing. */
static void test_one_lease(void **state)
{
    static lease_held *h[MANY];
    lease_session *s = session_open();
    size_t n = 0, i;
    uint64_t rev, last = 0;
    int64_t id;

    (void)state;
    session_take(h, s, "one", MANY);
    id = lease_of(lease_held_grant(h[0])->key, NULL);
    assert_true(id > 0);
    for (i = 0; i < MANY; i++) {
        assert_true(lease_of(lease_held_grant(h[i])->key, &rev) == id);
        ASSERT_U64_OP(lease_held_token(h[i]), ==, rev);
        ASSERT_U64_OP(lease_held_token(h[i]), >, last);
        last = lease_held_token(h[i]);
    }
    assert_true(lease_keys(id, "lease/", &n, NULL, NULL) > 0);
    assert_int_equal(n, MANY);
    lease_keys(id, "meta/", &n, NULL, NULL);
    assert_int_equal(n, MANY);
    lease_keys(id, "shared/", &n, NULL, NULL);
    assert_int_equal(n, 1);
    CHECK_RC(0, lease_session_close(s, 1));
    /* Released: the keys are gone; the shared lease runs out by itself. */
    assert_int_equal(key_exists("lease/", "one/000"), 0);
    assert_int_equal(key_exists("meta/", "one/199"), 0);
}

/* renew_many through the backend: one keep-alive, one LeaseTimeToLive and
 * one Range (the keys written since the last round) for 200 grants,
 * whatever their results. */
static void test_renew_many_one_keepalive(void **state)
{
    static lease_grant g[MANY + 2];
    static int results[MANY + 2];
    static uint64_t granted[MANY + 2];
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    lease_store *h = NULL;
    long ka, ttl, txn, range, grant;
    char key[64];
    size_t i;

    (void)state;
    CHECK_RC(0, lease_store_open(&h, url));
    assert_true(h->backend->features & LEASE_FEATURE_SHARED);
    assert_true(h->backend->features & LEASE_FEATURE_RENEW_MANY);
    CHECK_RC(0, h->backend->share_lease(h, TTL_MS));
    o.owner = owner;
    o.ttl_ms = TTL_MS;
    for (i = 0; i < MANY + 2; i++) {
        snprintf(key, sizeof(key), "many/%03zu", i);
        CHECK_RC(0, lease_acquire(&g[i], NULL, h, key, &o));
    }
    g[MANY].token++; /* a token that is not the key's */
    json_decref(etcd("/v3/kv/deleterange",
                     json_pack("{s:o}", "key", jkey("lease/", g[MANY + 1].key))));
    ka = grpc_calls("LeaseKeepAlive");
    ttl = grpc_calls("LeaseTimeToLive");
    txn = grpc_calls("Txn");
    range = grpc_calls("Range");
    grant = grpc_calls("LeaseGrant");
    for (i = 0; i < MANY + 2; i++)
        results[i] = 12345;
    CHECK_RC(0, h->backend->renew_many(results, granted, h, g, MANY + 2, TTL_MS));
    assert_int_equal(grpc_calls("LeaseKeepAlive") - ka, 1);
    assert_int_equal(grpc_calls("LeaseTimeToLive") - ttl, 1);
    assert_int_equal(grpc_calls("Txn") - txn, 0);
    assert_int_equal(grpc_calls("Range") - range, 1);
    assert_int_equal(grpc_calls("LeaseGrant") - grant, 0);
    for (i = 0; i < MANY; i++) {
        CHECK_RC(0, results[i]);
        ASSERT_U64_OP(granted[i], >=, TTL_MS);
    }
    CHECK_RC(LEASE_ELOST, results[MANY]);
    CHECK_RC(LEASE_ELOST, results[MANY + 1]);
    /* renew of one grant keeps the shared lease and checks the key. */
    CHECK_RC(0, h->backend->renew(&granted[0], h, g[0].key, owner, g[0].token, TTL_MS));
    ASSERT_U64_OP(granted[0], >=, TTL_MS);
    CHECK_RC(LEASE_ELOST, h->backend->renew(&granted[0], h, g[MANY].key, owner,
                                            g[MANY].token, TTL_MS));
    assert_true(lease_of(g[0].key, NULL) == lease_of(g[MANY - 1].key, NULL));
    lease_store_close(h);
}

/* Wait until every grant's deadline moved: a whole round went by (the
 * next one is a third of a ttl away). */
static void wait_round(lease_held *const *h, size_t n)
{
    static int64_t before[MANY];
    size_t i;

    for (i = 0; i < n; i++)
        before[i] = lease_held_deadline_ns(h[i]);
    for (i = 0; i < n; i++)
        wait_renewed(h[i], before[i]);
}

/*
 * A session's round of renewals: one keep-alive and one LeaseTimeToLive
 * for its 200 grants (one renew each would be 200 keep-alives). The
 * window holds one whole round; it may catch the requests of one more, if
 * it opened while a round that had sent its requests still updated the
 * deadlines.
 */
static void test_session_round(void **state)
{
    static lease_held *h[MANY];
    lease_session *s = session_open();
    long ka, ttl;

    (void)state;
    session_take(h, s, "round", MANY);
    wait_round(h, MANY);
    ka = grpc_calls("LeaseKeepAlive");
    ttl = grpc_calls("LeaseTimeToLive");
    wait_round(h, MANY);
    ka = grpc_calls("LeaseKeepAlive") - ka;
    ttl = grpc_calls("LeaseTimeToLive") - ttl;
    printf("# one round or two: %ld keep-alives, %ld LeaseTimeToLive\n", ka, ttl);
    assert_true(ka >= 1 && ka <= 2);
    assert_int_equal(ttl, ka);
    CHECK_RC(0, lease_session_close(s, 1));
}

/* Wait, at most four ttls, for grant i's loss to be reported. */
static void wait_lost(size_t i)
{
    int t;

    for (t = 0; t < 4 * TTL_MS / 20 && atomic_load(&lost_count[i]) == 0; t++)
        sleep_ms(20);
    if (atomic_load(&lost_count[i]) == 0)
        fail_msg("grant %zu was not reported lost in four ttls", i);
}

/* The shared lease revoked behind the session's back: every grant lost. */
static void test_revoke_loses_all(void **state)
{
    enum { N = 20 };
    lease_held *h[N], *again;
    lease_session *s = session_open();
    int64_t id;
    size_t i;

    (void)state;
    session_take(h, s, "revoke", N);
    id = lease_of(lease_held_grant(h[0])->key, NULL);
    json_decref(etcd("/v3/lease/revoke", json_pack("{s:I}", "ID", (json_int_t)id)));
    for (i = 0; i < N; i++) {
        wait_lost(i);
        assert_int_equal(atomic_load(&lost_reason[i]), LEASE_ELOST);
        assert_int_equal(atomic_load(&lost_count[i]), 1);
        assert_int_equal(lease_held_state(h[i]), LEASE_KEEPER_LOST);
        assert_false(lease_held_valid(h[i]));
    }
    /* The next acquire gets a new shared lease. */
    CHECK_RC(0, lease_session_acquire(&again, NULL, s, "revoke/again", 0, NULL, NULL));
    assert_true(lease_of("revoke/again", NULL) != id);
    assert_true(lease_held_valid(again));
    /* The lost grants are not released: close says so. */
    CHECK_RC(LEASE_ELOST, lease_session_close(s, 1));
}

/* One key deleted behind the session's back: that grant alone is lost. */
static void test_delete_one(void **state)
{
    enum { N = 10 };
    lease_held *h[N];
    lease_session *s = session_open();
    size_t i;

    (void)state;
    session_take(h, s, "delete", N);
    json_decref(etcd("/v3/kv/deleterange",
                     json_pack("{s:o}", "key", jkey("lease/", "delete/003"))));
    wait_lost(3);
    assert_int_equal(atomic_load(&lost_reason[3]), LEASE_ELOST);
    /* The others were in the same round, and the next. */
    wait_renewed(h[0], lease_held_deadline_ns(h[0]));
    for (i = 0; i < N; i++)
        if (i != 3) {
            assert_int_equal(atomic_load(&lost_count[i]), 0);
            assert_true(lease_held_valid(h[i]));
        }
    /* The lost grants are not released: close says so. */
    CHECK_RC(LEASE_ELOST, lease_session_close(s, 1));
}

/* Releasing one grant (by the session, then by another handle with owner
 * and token) leaves the shared lease and the other grants alone. */
static void test_release_one(void **state)
{
    enum { N = 5 };
    lease_held *h[N];
    lease_session *s = session_open();
    lease_grant other;
    size_t n = 0, i;
    int64_t id;
    int has = 1;

    (void)state;
    session_take(h, s, "release", N);
    id = lease_of("release/001", NULL);
    CHECK_RC(0, lease_session_release(s, h[0]));
    assert_true(lease_keys(id, "lease/", &n, "release/000", &has) > 0);
    assert_int_equal(n, N - 1);
    assert_false(has);
    /* Another handle (the test's own) releases by owner and token. */
    other = *lease_held_grant(h[1]);
    CHECK_RC(0, lease_release(store, &other));
    assert_int_equal(key_exists("lease/", "release/001"), 0);
    assert_true(lease_keys(id, "lease/", &n, "release/002", &has) > 0);
    assert_int_equal(n, N - 2);
    assert_true(has);
    wait_lost(1); /* the session learns it at its next round */
    wait_renewed(h[4], lease_held_deadline_ns(h[4]));
    for (i = 2; i < N; i++) {
        assert_int_equal(atomic_load(&lost_count[i]), 0);
        assert_true(lease_held_valid(h[i]));
        assert_true(lease_of(lease_held_grant(h[i])->key, NULL) == id);
    }
    /* The lost grants are not released: close says so. */
    CHECK_RC(LEASE_ELOST, lease_session_close(s, 1));
}

/* Acquire, release, acquire again: two history entries, each with its
 * token, the first released and the second held. */
static void test_history_twice(void **state)
{
    lease_held *h;
    lease_session *s = session_open();
    lease_history_entry *e = NULL;
    uint64_t t1, t2;
    size_t n = 0;

    (void)state;
    CHECK_RC(0, lease_session_acquire(&h, NULL, s, "hist/x", 0, NULL, NULL));
    t1 = lease_held_token(h);
    CHECK_RC(0, lease_session_release(s, h));
    CHECK_RC(0, lease_session_acquire(&h, NULL, s, "hist/x", 0, NULL, NULL));
    t2 = lease_held_token(h);
    ASSERT_U64_OP(t2, >, t1);
    CHECK_RC(0, lease_history(&e, &n, store, "hist/x", 10));
    assert_int_equal(n, 2);
    ASSERT_U64_OP(e[0].token, ==, t2);
    assert_int_equal(e[0].ended, LEASE_ENDED_HELD);
    ASSERT_U64_OP(e[1].token, ==, t1);
    assert_int_equal(e[1].ended, LEASE_ENDED_RELEASED);
    assert_string_equal(e[0].owner, owner);
    assert_string_equal(e[1].owner, owner);
    lease_history_free(e);
    CHECK_RC(0, lease_session_close(s, 1));
    CHECK_RC(0, lease_history(&e, &n, store, "hist/x", 10));
    assert_int_equal(n, 2);
    assert_int_equal(e[0].ended, LEASE_ENDED_RELEASED);
    lease_history_free(e);
}

/* A session handle (share_lease) on `u`, holding keys "<tag>/000" .. for
 * n grants. */
static lease_store *shared_handle(lease_grant *g, const char *u, const char *tag, size_t n)
{
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    lease_store *h = NULL;
    char key[64];
    size_t i;

    CHECK_RC(0, lease_store_open(&h, u));
    CHECK_RC(0, h->backend->share_lease(h, TTL_MS));
    o.owner = owner;
    o.ttl_ms = TTL_MS;
    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s/%03zu", tag, i);
        CHECK_RC(0, lease_acquire(&g[i], NULL, h, key, &o));
    }
    return h;
}

/* renew_many of the n grants, all renewed, `rounds` times. */
static void renew_rounds(lease_store *h, const lease_grant *g, size_t n, int rounds)
{
    int results[8];
    uint64_t granted[8];
    size_t i;

    assert_true(n <= 8);
    while (rounds-- > 0) {
        CHECK_RC(0, h->backend->renew_many(results, granted, h, g, n, TTL_MS));
        for (i = 0; i < n; i++) {
            CHECK_RC(0, results[i]);
            ASSERT_U64_OP(granted[i], >=, TTL_MS);
        }
    }
}

/* The newest history entry of `key` ended as `ended`. */
static void assert_last_ended(const char *key, lease_ended ended)
{
    lease_history_entry *e = NULL;
    size_t n = 0;

    CHECK_RC(0, lease_history(&e, &n, store, key, 1));
    assert_int_equal(n, 1);
    assert_int_equal(e[0].ended, ended);
    lease_history_free(e);
}

/* A loopback forwarder to the test's etcd, and in via[size] a URL of the
 * test's prefix that goes through it. */
static conf_forwarder *forwarder_to_etcd(char *via, size_t size)
{
    char host[256], port[16];
    conf_forwarder *f;

    assert_int_equal(conf_url_hostport(host, sizeof(host), port, sizeof(port), base_url), 0);
    f = conf_forwarder_start(host, port);
    assert_non_null(f);
    snprintf(via, size, "etcd://127.0.0.1:%d%.*s", conf_forwarder_port(f),
             (int)strlen(prefix) - 1, prefix);
    return f;
}

/*
 * A release whose outcome is unknown (the member cannot be reached: a
 * paused forwarder) leaves the key attached to the shared lease, and the
 * caller lets the grant go. Once the member is back, a round or two of
 * renew_many deletes the key (and its meta/ key, with a release's end
 * marker), and the other grants stay held on the same lease.
 */
static void test_release_unknown(void **state)
{
    lease_grant g[3], keep[2];
    char via[600];
    conf_forwarder *f;
    lease_store *h;
    int64_t id;

    (void)state;
    f = forwarder_to_etcd(via, sizeof(via));
    h = shared_handle(g, via, "unknown", 3);
    id = lease_of("unknown/001", NULL);
    conf_forwarder_pause(f);
    assert_true(lease_release(h, &g[1]) < 0);
    conf_forwarder_resume(f);
    /* The release did not reach etcd: the key is still attached. */
    assert_true(lease_of("unknown/001", NULL) == id);
    keep[0] = g[0];
    keep[1] = g[2];
    renew_rounds(h, keep, 2, 2);
    assert_int_equal(key_exists("lease/", "unknown/001"), 0);
    assert_int_equal(key_exists("meta/", "unknown/001"), 0);
    assert_last_ended("unknown/001", LEASE_ENDED_RELEASED);
    assert_true(lease_of("unknown/000", NULL) == id);
    assert_true(lease_of("unknown/002", NULL) == id);
    assert_int_equal(key_exists("meta/", "unknown/002"), 1);
    /* The key is free for anyone else. */
    {
        lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
        lease_grant other;
        char someone[LEASE_OWNER_BUFSZ];

        assert_int_equal(lease_owner_new(someone), 0);
        o.owner = someone;
        o.ttl_ms = TTL_MS;
        CHECK_RC(0, lease_acquire(&other, NULL, store, "unknown/001", &o));
        CHECK_RC(0, lease_release(store, &other));
    }
    CHECK_RC(0, lease_release(h, &g[0]));
    CHECK_RC(0, lease_release(h, &g[2]));
    lease_store_close(h);
    conf_forwarder_stop(f);
}

/*
 * Keys attached to the shared lease behind the session's back (a put
 * with its id, as an acquire whose answer was lost leaves one): the next
 * renew_many deletes P lease/K and P meta/K that no grant of the handle
 * holds, and leaves the grants' keys and any other key alone.
 */
static void test_orphan_deleted(void **state)
{
    lease_grant g[2];
    lease_store *h;
    int64_t id;
    char *v;

    (void)state;
    h = shared_handle(g, url, "orphan", 2);
    id = lease_of("orphan/000", NULL);
    v = enc64(owner);
    json_decref(etcd("/v3/kv/put", json_pack("{s:o, s:s, s:I}", "key",
                                             jkey("lease/", "orphan/x"), "value", v,
                                             "lease", (json_int_t)id)));
    json_decref(etcd("/v3/kv/put", json_pack("{s:o, s:s, s:I}", "key",
                                             jkey("meta/", "orphan/y"), "value", v,
                                             "lease", (json_int_t)id)));
    json_decref(etcd("/v3/kv/put", json_pack("{s:o, s:s, s:I}", "key",
                                             jkey("other/", "orphan/z"), "value", v,
                                             "lease", (json_int_t)id)));
    free(v);
    assert_true(lease_of("orphan/x", NULL) == id);
    renew_rounds(h, g, 2, 1);
    assert_int_equal(key_exists("lease/", "orphan/x"), 0);
    assert_int_equal(key_exists("meta/", "orphan/y"), 0);
    assert_int_equal(key_exists("other/", "orphan/z"), 1);
    assert_true(lease_of("orphan/000", NULL) == id);
    assert_true(lease_of("orphan/001", NULL) == id);
    assert_int_equal(key_exists("meta/", "orphan/001"), 1);
    renew_rounds(h, g, 2, 1); /* still held the round after */
    CHECK_RC(0, lease_release(h, &g[0]));
    CHECK_RC(0, lease_release(h, &g[1]));
    lease_store_close(h);
}

/* n keys "<prefix>lease/<tag>NNNN" put by someone else, on no lease. */
static void put_others(const char *tag, size_t n)
{
    char key[64];
    size_t i, j;
    json_t *ops;

    for (i = 0; i < n; i += 100) {
        ops = json_array();
        for (j = i; j < i + 100 && j < n; j++) {
            snprintf(key, sizeof(key), "%s%04zu", tag, j);
            json_array_append_new(ops, json_pack("{s:{s:o, s:s}}", "request_put", "key",
                                                 jkey("lease/", key), "value", ""));
        }
        json_decref(etcd("/v3/kv/txn", json_pack("{s:o}", "success", ops)));
    }
}

/*
 * A grant's key deleted and put again on the shared lease by another
 * client (the same owner text, the lease's id): still attached, but a new
 * key, with a new create revision. renew_many reports that grant lost and
 * the other one renewed, the round after too; renew says lost; the key put
 * behind the handle's back is an orphan, which the rounds delete. 1,100
 * keys that sort before it, written meanwhile, put it on the second page
 * of the keys the round reads.
 */
static void test_reput_lost(void **state)
{
    lease_grant g[2];
    lease_store *h;
    int results[2], round;
    uint64_t granted[2], rev = 0;
    int64_t id;
    char *v;

    (void)state;
    h = shared_handle(g, url, "reput", 2);
    id = lease_of("reput/000", NULL);
    json_decref(etcd("/v3/kv/deleterange",
                     json_pack("{s:o}", "key", jkey("lease/", "reput/000"))));
    v = enc64(owner);
    json_decref(etcd("/v3/kv/put", json_pack("{s:o, s:s, s:I}", "key",
                                             jkey("lease/", "reput/000"), "value", v,
                                             "lease", (json_int_t)id)));
    free(v);
    assert_true(lease_of("reput/000", &rev) == id);
    ASSERT_U64_OP(rev, >, g[0].token);
    put_others("reput/+", 1100);
    for (round = 0; round < 2; round++) {
        results[0] = results[1] = 12345;
        CHECK_RC(0, h->backend->renew_many(results, granted, h, g, 2, TTL_MS));
        CHECK_RC(LEASE_ELOST, results[0]);
        CHECK_RC(0, results[1]);
        ASSERT_U64_OP(granted[1], >=, TTL_MS);
    }
    CHECK_RC(LEASE_ELOST, h->backend->renew(&granted[0], h, g[0].key, owner, g[0].token,
                                            TTL_MS));
    assert_int_equal(key_exists("lease/", "reput/000"), 0);
    assert_true(lease_of("reput/001", NULL) == id);
    CHECK_RC(0, lease_release(h, &g[1]));
    lease_store_close(h);
    json_decref(etcd("/v3/kv/deleterange", json_pack("{s:o, s:o}", "key", jkey("lease/", "reput/+"),
                                                     "range_end", jkey("lease/", "reput/,"))));
}

/* ---- lists longer than a page ------------------------------------------- */

#define LIST_KEYS 64000

/* Key i of the long list: 192 bytes, in the order of i. */
static void list_key(char *out, size_t size, size_t i)
{
    snprintf(out, size, "pages/%0180d%06zu", 0, i);
}

/* What a list delivered, key by key (the backend's list callback). */
static int on_listed(const lease_info *info, void *payload)
{
    size_t *n = payload;
    char key[256];

    if (*n == 0) {
        /* After the first page was read: a key that sorts last, which the
         * list, reading the first page's revision, must not see. */
        list_key(key, sizeof(key), LIST_KEYS);
        json_decref(etcd("/v3/kv/put", json_pack("{s:o, s:s}", "key", jkey("seen/", key),
                                                 "value", "")));
    }
    list_key(key, sizeof(key), *n);
    if (strcmp(info->key, key) != 0)
        fail_msg("key %zu of the list is '%.20s...', not '%.20s...'", *n, info->key, key);
    assert_int_equal(info->state, LEASE_STATE_EXPIRED);
    (*n)++;
    return 0;
}

/*
 * A list longer than a page (1000 keys) and than one answer may take to
 * hold (64 MiB: about 55,000 of these keys' seen/ key-values), read a page
 * at a time at one revision: 64,000 keys acquired once (their seen/ keys,
 * put directly, 128 a txn; no end marker: expired), each listed once, in
 * order; a key put once the first page was read is not in it, and is in
 * the next list.
 */
static void test_list_pages(void **state)
{
    lease_info *list = NULL;
    size_t n = 0, i, j;
    char key[256];
    json_t *ops;

    (void)state;
    for (i = 0; i < LIST_KEYS; i += 128) {
        ops = json_array();
        for (j = i; j < i + 128 && j < LIST_KEYS; j++) {
            list_key(key, sizeof(key), j);
            json_array_append_new(ops, json_pack("{s:{s:o, s:s}}", "request_put", "key",
                                                 jkey("seen/", key), "value", ""));
        }
        json_decref(etcd("/v3/kv/txn", json_pack("{s:o}", "success", ops)));
    }
    CHECK_RC(0, store->backend->list(store, "pages/", on_listed, &n));
    assert_int_equal(n, LIST_KEYS);
    CHECK_RC(0, lease_list(&list, &n, store, "pages/"));
    assert_int_equal(n, LIST_KEYS + 1);
    lease_list_free(list);
    json_decref(etcd("/v3/kv/deleterange", json_pack("{s:o, s:o}", "key", jkey("seen/", "pages/"),
                                                     "range_end", jkey("seen/", "pages0"))));
}

/* ---- plain grants: the handle's pool of etcd leases ----------------------- */

static lease_store *plain_handle(const char *u)
{
    lease_store *h = NULL;

    CHECK_RC(0, lease_store_open(&h, u));
    return h;
}

static void plain_acquire(lease_grant *g, lease_store *h, const char *key, uint64_t ttl_ms)
{
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;

    o.owner = owner;
    o.ttl_ms = ttl_ms;
    CHECK_RC(0, lease_acquire(g, NULL, h, key, &o));
}

/* A released grant's etcd lease stays (idle, no key) and the next grant
 * of the handle takes it; a warm cycle is two txns and a keep-alive. */
static void test_plain_reuse(void **state)
{
    lease_store *h = plain_handle(url);
    lease_grant g;
    long grants, revokes, txns, kas;
    char key[64];
    size_t n = 0;
    int64_t id;
    int i;

    (void)state;
    plain_acquire(&g, h, "plain/a", TTL_MS);
    id = lease_of("plain/a", NULL);
    CHECK_RC(0, lease_release(h, &g));
    assert_true(lease_keys(id, "", &n, NULL, NULL) > 0); /* not revoked */
    assert_int_equal(n, 0);
    grants = grpc_calls("LeaseGrant");
    revokes = grpc_calls("LeaseRevoke");
    txns = grpc_calls("Txn");
    kas = grpc_calls("LeaseKeepAlive");
    for (i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "plain/%d", i);
        plain_acquire(&g, h, key, TTL_MS);
        assert_true(lease_of(key, NULL) == id);
        CHECK_RC(0, lease_release(h, &g));
    }
    assert_int_equal(grpc_calls("LeaseGrant") - grants, 0);
    assert_int_equal(grpc_calls("LeaseRevoke") - revokes, 0);
    assert_int_equal(grpc_calls("Txn") - txns, 20);
    assert_int_equal(grpc_calls("LeaseKeepAlive") - kas, 10);
    lease_store_close(h);
    /* close revokes the idle lease */
    assert_true(lease_keys(id, "", &n, NULL, NULL) <= 0);
}

/* Two grants of one handle with the same ttl: an etcd lease each, with
 * only its own keys; renewing one does not keep the other alive. */
static void test_plain_apart(void **state)
{
    lease_store *h = plain_handle(url);
    lease_grant a, b, c;
    lease_info info;
    int64_t ia, ib;
    size_t n = 0;
    int has = 0, i;

    (void)state;
    plain_acquire(&a, h, "apart/a", 2000);
    CHECK_RC(0, lease_release(h, &a)); /* one idle lease in the pool */
    plain_acquire(&a, h, "apart/a", 2000);
    plain_acquire(&b, h, "apart/b", 2000);
    ia = lease_of("apart/a", NULL);
    ib = lease_of("apart/b", NULL);
    assert_true(ia != ib);
    assert_true(lease_keys(ib, "", &n, "apart/b", &has) > 0);
    assert_int_equal(n, 2); /* lease/apart/b, meta/apart/b */
    assert_true(has);
    /* a renewed for three of b's ttls: b expires all the same */
    for (i = 0; i < 20; i++) {
        CHECK_RC(0, lease_renew(&a, h, 0));
        sleep_ms(300);
    }
    CHECK_RC(0, lease_inspect(&info, h, "apart/b"));
    assert_int_equal(info.state, LEASE_STATE_EXPIRED);
    CHECK_RC(0, lease_inspect(&info, h, "apart/a"));
    assert_int_equal(info.state, LEASE_STATE_HELD);
    /* b's lease ended while the handle had it: a new one for c. */
    plain_acquire(&c, h, "apart/c", 2000);
    assert_true(lease_of("apart/c", NULL) != ib);
    assert_true(lease_of("apart/c", NULL) != ia);
    CHECK_RC(0, lease_release(h, &c));
    CHECK_RC(0, lease_release(h, &a));
    lease_store_close(h);
}

/* An idle lease revoked behind the handle's back is replaced; a grant
 * with another ttl does not take an idle lease of another ttl. */
static void test_plain_idle_gone(void **state)
{
    lease_store *h = plain_handle(url);
    lease_grant g;
    int64_t id, id2;
    size_t n = 0;

    (void)state;
    plain_acquire(&g, h, "idle/a", TTL_MS);
    id = lease_of("idle/a", NULL);
    CHECK_RC(0, lease_release(h, &g));
    json_decref(etcd("/v3/lease/revoke", json_pack("{s:I}", "ID", (json_int_t)id)));
    plain_acquire(&g, h, "idle/b", TTL_MS);
    id2 = lease_of("idle/b", NULL);
    assert_true(id2 != id);
    assert_true(lease_keys(id2, "", &n, NULL, NULL) >= TTL_MS / 1000 - 1);
    CHECK_RC(0, lease_release(h, &g));
    plain_acquire(&g, h, "idle/c", 2 * TTL_MS);
    assert_true(lease_of("idle/c", NULL) != id2);
    assert_true(lease_keys(lease_of("idle/c", NULL), "", &n, NULL, NULL) > TTL_MS / 1000);
    CHECK_RC(0, lease_release(h, &g));
    lease_store_close(h);
}

/* An acquire that got no answer may have attached its key: its lease is
 * not lent again. A ttl far above the timeout, so that the txn goes with
 * the idle lease's keep-alive (etcd_pair), as in the benchmarks. */
static void test_plain_unknown(void **state)
{
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    char via[600];
    conf_forwarder *f;
    lease_store *h;
    lease_grant g;
    int64_t id;

    (void)state;
    f = forwarder_to_etcd(via, sizeof(via));
    h = plain_handle(via);
    plain_acquire(&g, h, "unknown/a", 5 * TTL_MS);
    id = lease_of("unknown/a", NULL);
    CHECK_RC(0, lease_release(h, &g));
    conf_forwarder_pause(f);
    o.owner = owner;
    o.ttl_ms = 5 * TTL_MS;
    assert_true(lease_acquire(&g, NULL, h, "unknown/b", &o) < 0);
    assert_non_null(strstr(lease_errmsg(), "acquire"));
    conf_forwarder_resume(f);
    plain_acquire(&g, h, "unknown/c", 5 * TTL_MS);
    assert_true(lease_of("unknown/c", NULL) != id);
    CHECK_RC(0, lease_release(h, &g));
    lease_store_close(h);
    conf_forwarder_stop(f);
}

/* The local ports of this process's TCP sockets connected to `peer_port`,
 * sorted; how many. */
static size_t peer_sockets(int *ports, size_t max, int peer_port)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    size_t n = 0, i, j;

    assert_non_null(d);
    while ((e = readdir(d)) != NULL && n < max) {
        struct sockaddr_storage a, b;
        socklen_t la = sizeof(a), lb = sizeof(b);
        int fd = atoi(e->d_name), type = 0;
        socklen_t lt = sizeof(type);

        if (e->d_name[0] == '.' || fd == dirfd(d) ||
            getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &lt) < 0 || type != SOCK_STREAM ||
            getpeername(fd, (struct sockaddr *)&b, &lb) < 0 || b.ss_family != AF_INET ||
            ntohs(((struct sockaddr_in *)&b)->sin_port) != peer_port ||
            getsockname(fd, (struct sockaddr *)&a, &la) < 0)
            continue;
        ports[n++] = ntohs(((struct sockaddr_in *)&a)->sin_port);
    }
    closedir(d);
    for (i = 1; i < n; i++)
        for (j = i; j > 0 && ports[j - 1] > ports[j]; j--) {
            int t = ports[j];

            ports[j] = ports[j - 1];
            ports[j - 1] = t;
        }
    return n;
}

/* HTTP keep-alive: 50 cycles (and renewals) on the connections that the
 * first cycles opened (the test's own handle has its own, unused
 * meanwhile), none opened after. A ttl far above the timeout, so that the
 * keep-alive goes beside the txn, on the handle's second connection. */
static void test_plain_keepalive(void **state)
{
    char host[256], port[16];
    int first[16], after[16];
    size_t nf, na;
    lease_store *h;
    lease_grant g;
    int i;

    (void)state;
    assert_int_equal(conf_url_hostport(host, sizeof(host), port, sizeof(port), base_url), 0);
    h = plain_handle(url);
    plain_acquire(&g, h, "conn/0", 5 * TTL_MS);
    CHECK_RC(0, lease_release(h, &g));
    plain_acquire(&g, h, "conn/1", 5 * TTL_MS); /* the keep-alive beside the txn */
    CHECK_RC(0, lease_release(h, &g));
    nf = peer_sockets(first, 16, atoi(port));
    assert_true(nf >= 1);
    for (i = 0; i < 50; i++) {
        plain_acquire(&g, h, "conn/x", 5 * TTL_MS);
        CHECK_RC(0, lease_renew(&g, h, 0));
        CHECK_RC(0, lease_release(h, &g));
    }
    na = peer_sockets(after, 16, atoi(port));
    assert_int_equal(na, nf);
    for (i = 0; i < (int)nf; i++)
        assert_int_equal(after[i], first[i]);
    lease_store_close(h);
}

static int setup(void **state)
{
    char host[256], port[16], u[LEASE_OWNER_BUFSZ];
    const char *base = base_url;

    (void)state;
    if (conf_url_hostport(host, sizeof(host), port, sizeof(port), base) < 0) {
        fprintf(stderr, "etcd_session: '%s' is not an etcd URL with one member\n", base);
        return -1;
    }
    if (lease_owner_new(u) < 0 || lease_owner_new(owner) < 0)
        return -1;
    snprintf(http, sizeof(http), "http://%s:%s", host, port);
    snprintf(prefix, sizeof(prefix), "/etcd_session_%s/", u);
    snprintf(url, sizeof(url), "etcd://%s:%s%.*s", host, port,
             (int)strlen(prefix) - 1, prefix);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (lease_store_open(&store, url) < 0) {
        fprintf(stderr, "etcd_session: %s\n", lease_errmsg());
        return -1;
    }
    printf("# %s\n", url);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    lease_store_close(store);
    return 0;
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_lease),
        cmocka_unit_test(test_renew_many_one_keepalive),
        cmocka_unit_test(test_session_round),
        cmocka_unit_test(test_revoke_loses_all),
        cmocka_unit_test(test_delete_one),
        cmocka_unit_test(test_release_one),
        cmocka_unit_test(test_history_twice),
        cmocka_unit_test(test_release_unknown),
        cmocka_unit_test(test_orphan_deleted),
        cmocka_unit_test(test_reput_lost),
        cmocka_unit_test(test_list_pages),
        cmocka_unit_test(test_plain_reuse),
        cmocka_unit_test(test_plain_apart),
        cmocka_unit_test(test_plain_idle_gone),
        cmocka_unit_test(test_plain_unknown),
        cmocka_unit_test(test_plain_keepalive),
    };
    const char *base = argc > 1 ? argv[1] : getenv("LEASE_TEST_ETCD_URL");

    base_url = base;
    if (base == NULL || strncmp(base, "etcd://", 7) != 0) {
        fprintf(stderr, "etcd_session: pass an etcd:// URL or set LEASE_TEST_ETCD_URL "
                        "(scripts/test.sh starts a server)\n");
        return 1;
    }
    return cmocka_run_group_tests_name("etcd_session", tests, setup, teardown)
               ? 1 : 0;
}
