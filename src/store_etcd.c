/*
 * store_etcd.c - etcd v3, through its JSON gateway (libcurl + jansson).
 *
 * URL: etcd://host:port[,host:port...][/prefix] (etcds:// for TLS)
 *   parameters for etcds: cacert=FILE, cert=FILE, key=FILE
 *   the prefix defaults to /lease/
 *
 * Key layout under the prefix P (K a lease key, R a resource, N a name):
 *   P lease/K      value: the owner; attached to an etcd lease with the ttl.
 *                  Its create_revision is the fencing token: the cluster's
 *                  revision when the key was created, strictly increasing.
 *   P meta/K       value: "<ttl_ms>\n<label>", same etcd lease
 *   P seen/K       empty, rewritten by every grant (its mod_revision is
 *                  the last token); no lease, kept forever, so a key
 *                  that was acquired once is never "not found"
 *   P fence/R      the resource's mark, 20 zero-padded digits so that
 *                  etcd's byte-wise compare is a numeric compare
 *   P data/N, P datatok/N   a guarded value and the token that wrote it
 *   P history/L/K/I  one per grant (lease/history.h), no etcd lease (it
 *                  outlives the lease): "<owner>\n<ttl_ms>\n<acquired_ms>
 *                  \n<label>"; its create_revision is the grant's token.
 *                  I is the grant's etcd lease id in 16 hex digits: unique
 *                  and known before the acquire txn, unlike the token.
 *   P ended/L/K/T  how grant T (20 zero-padded digits) ended:
 *                  "released\n<ms>" or "lost\n<ms>"; no etcd lease
 *   In both, L is K's length in 3 digits: keys may hold any byte but NUL,
 *   '/' included, so "history/a/" alone would also be a prefix of key
 *   "a/b"'s entries; "history/001/a/" cannot be ("a/b" is "003/a/b/").
 * `etcdctl get --prefix P` shows all of it.
 *
 * Expiry is etcd's lease TTL, in whole seconds with a server-side minimum:
 * the grant reports the TTL etcd actually granted, and the core's local
 * deadline uses that. Renew is a keep-alive of the etcd lease (which
 * restores its granted TTL).
 *
 * History: the acquire txn that creates P lease/K also creates its
 * history entry, and the release txn writes its end marker, so neither can
 * be left out by a client that dies between requests. The acquire txn also
 * counts K's entries (a txn's reads see its own earlier writes); past
 * LEASE_HISTORY_KEEP + HISTORY_SLACK the acquirer deletes the oldest ones
 * and their markers (two more round trips, once every HISTORY_SLACK grants).
 * An entry without a marker that is not the newest expired (a later grant
 * needed the key free); etcd keeps no record of when, so its ended_ms is 0.
 * Times are the client's wall clock: etcd's KV API has no server clock.
 *
 * Endpoints: a request that cannot connect to one member goes to the next;
 * a request that reached a member but got no (or a failed) answer is
 * LEASE_ESTORE: authority uncertain, never success.
 */
#define _GNU_SOURCE /* asprintf */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <curl/curl.h>
#include <jansson.h>

#include "lease_int.h"

#define MAX_ENDPOINTS 16
#define PAD 20 /* digits of a zero-padded mark */
/* History entries past LEASE_HISTORY_KEEP before an acquire prunes: the
 * prune costs two round trips, so it runs once every HISTORY_SLACK grants. */
#define HISTORY_SLACK 20
/* Deletes in one prune txn, below etcd's --max-txn-ops (128 by default);
 * a longer backlog goes at the next grants. */
#define PRUNE_MAX 100
/* "<len>/<key>/<20 digits>" and its NUL. */
#define HNAME_SZ (LEASE_KEY_MAX + PAD + 8)

typedef struct {
    lease_store parent;
    CURL *curl;
    char *endpoints[MAX_ENDPOINTS]; /* "http://host:port" */
    int nendpoints;
    int current;                    /* the endpoint that last answered */
    char *prefix;
    size_t prefix_len;
    char *cacert, *cert, *key;
    uint64_t timeout_ms;
    int64_t last_revision;          /* from the last busy acquire: watch from here */
} etcd_store;

/* ---- base64 (etcd's JSON carries keys and values as base64) ------------ */

static const char b64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const void *data, size_t n)
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

/* Decode into a NUL-terminated buffer; NULL on bad input. */
static char *b64_decode(const char *in, size_t *len)
{
    size_t n = strlen(in), o = 0;
    char *out = malloc(n / 4 * 3 + 4);
    unsigned v = 0;
    int bits = 0;

    if (out == NULL)
        return NULL;
    for (; *in && *in != '='; in++) {
        const char *c = strchr(b64, *in);
        if (c == NULL || *in == '\0') {
            free(out);
            return NULL;
        }
        v = (v << 6) | (unsigned)(c - b64);
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

/* ---- requests --------------------------------------------------------- */

typedef struct {
    char *data;
    size_t len, cap;
    /* Watch streams: stop once this returns non-zero for a message. */
    int (*on_message)(json_t *msg, void *arg);
    void *arg;
    int stop;
    size_t scanned;
} body;

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    body *b = userdata;
    size_t n = size * nmemb;

    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p = realloc(b->data, cap);
        if (p == NULL)
            return 0;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    b->data[b->len] = '\0';
    if (b->on_message) {
        /* A stream of JSON objects, one per line. */
        char *nl;
        while ((nl = memchr(b->data + b->scanned, '\n', b->len - b->scanned))) {
            json_t *msg = json_loadb(b->data + b->scanned,
                                     (size_t)(nl - b->data - b->scanned), 0, NULL);
            b->scanned = (size_t)(nl - b->data) + 1;
            if (msg) {
                int stop = b->on_message(msg, b->arg);
                json_decref(msg);
                if (stop) {
                    b->stop = stop;
                    return 0; /* abort the transfer */
                }
            }
        }
    }
    return n;
}

/* Did the request fail before anything was sent? Only then may it go to
 * another member: anything later may have been applied. */
static int not_sent(CURLcode c)
{
    return c == CURLE_COULDNT_CONNECT || c == CURLE_COULDNT_RESOLVE_HOST ||
           c == CURLE_SSL_CONNECT_ERROR;
}

/*
 * POST `req` to path on the members, starting at the one that last
 * answered. On success *out is the parsed answer. timeout_ms bounds the
 * whole call.
 */
static int post(json_t **out, etcd_store *s, const char *path, json_t *req,
                uint64_t timeout_ms, body *stream, const char *what)
{
    char *payload = json_dumps(req, JSON_COMPACT);
    int64_t end = lease_clock_ns() + (int64_t)timeout_ms * 1000000;
    body local = { NULL, 0, 0, NULL, NULL, 0, 0 };
    body *b = stream ? stream : &local;
    CURLcode cc = CURLE_COULDNT_CONNECT;
    long status = 0;
    int tries, rc;

    *out = NULL;
    if (payload == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    for (tries = 0; tries < s->nendpoints; tries++) {
        int idx = (s->current + tries) % s->nendpoints;
        char url[512];
        struct curl_slist *hdr = NULL;
        int64_t left = (end - lease_clock_ns()) / 1000000;

        if (left <= 0 && tries > 0)
            break;
        if (left <= 0)
            left = 1;
        snprintf(url, sizeof(url), "%s%s", s->endpoints[idx], path);
        curl_easy_reset(s->curl);
        hdr = curl_slist_append(hdr, "Content-Type: application/json");
        curl_easy_setopt(s->curl, CURLOPT_URL, url);
        curl_easy_setopt(s->curl, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(s->curl, CURLOPT_POSTFIELDS, payload);
        curl_easy_setopt(s->curl, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(s->curl, CURLOPT_WRITEDATA, b);
        curl_easy_setopt(s->curl, CURLOPT_TIMEOUT_MS, (long)left);
        /* Leave time for the other members when one does not connect. */
        curl_easy_setopt(s->curl, CURLOPT_CONNECTTIMEOUT_MS,
                         (long)(left / (s->nendpoints - tries)) + 1);
        curl_easy_setopt(s->curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(s->curl, CURLOPT_PROTOCOLS_STR, "http,https");
        if (s->cacert)
            curl_easy_setopt(s->curl, CURLOPT_CAINFO, s->cacert);
        if (s->cert)
            curl_easy_setopt(s->curl, CURLOPT_SSLCERT, s->cert);
        if (s->key)
            curl_easy_setopt(s->curl, CURLOPT_SSLKEY, s->key);
        b->len = 0;
        b->scanned = 0;
        cc = curl_easy_perform(s->curl);
        curl_slist_free_all(hdr);
        if (cc == CURLE_OPERATION_TIMEDOUT && !stream) {
            /* A member that is down drops the connection attempt instead
             * of refusing it: a timeout before any connection was made
             * sent nothing, so the next member may have the request. */
            curl_off_t connected = 0;
            curl_easy_getinfo(s->curl, CURLINFO_CONNECT_TIME_T, &connected);
            if (connected == 0)
                cc = CURLE_COULDNT_CONNECT;
        }
        if (cc == CURLE_OK) {
            s->current = idx;
            break;
        }
        if (!not_sent(cc)) {
            /* Reached but unanswered: the outcome is unknown, and the next
             * request of this handle starts with another member. */
            s->current = (idx + 1) % s->nendpoints;
            break;
        }
    }
    free(payload);
    if (stream && stream->stop)
        return 0; /* the stream's reader got what it waited for */
    if (stream && cc == CURLE_OPERATION_TIMEDOUT) {
        free(local.data);
        return LEASE_ETIMEOUT;
    }
    if (cc != CURLE_OK) {
        rc = lease__seterr(LEASE_ESTORE, "etcd %s on %s: %s%s", what,
                           s->parent.url_redacted ? s->parent.url_redacted : "?",
                           curl_easy_strerror(cc),
                           not_sent(cc) ? " (no member reachable)"
                                        : " (the outcome is unknown)");
        free(local.data);
        return rc;
    }
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &status);
    *out = b->len ? json_loadb(b->data, b->len, 0, NULL) : NULL;
    if (status != 200 || *out == NULL || json_object_get(*out, "error")) {
        const char *msg = *out ? json_string_value(json_object_get(*out, "error")) : NULL;
        rc = lease__seterr(LEASE_ESTORE, "etcd %s: HTTP %ld%s%s", what, status,
                           msg ? ": " : "", msg ? msg : "");
        json_decref(*out);
        *out = NULL;
        free(local.data);
        return rc;
    }
    free(local.data);
    return 0;
}

static int call(json_t **out, etcd_store *s, const char *path, json_t *req,
                const char *what)
{
    int rc;

    if (req == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    rc = post(out, s, path, req, s->timeout_ms, NULL, what);
    json_decref(req);
    return rc;
}

/* ---- JSON helpers ------------------------------------------------------ */

/* int64 fields come as strings (proto3's JSON mapping), 0 when absent. */
static int64_t jint(json_t *o, const char *name)
{
    json_t *v = json_object_get(o, name);

    if (json_is_string(v))
        return strtoll(json_string_value(v), NULL, 10);
    if (json_is_integer(v))
        return json_integer_value(v);
    return 0;
}

static json_t *jb64(const void *data, size_t n)
{
    char *e = b64_encode(data, n);
    json_t *j = e ? json_string(e) : NULL;

    free(e);
    return j;
}

static json_t *jstr64(const char *s)
{
    return jb64(s, strlen(s));
}

/* The prefixed key "<prefix><kind><name>" as base64. */
static json_t *jkey(etcd_store *s, const char *kind, const char *name)
{
    char buf[512 + LEASE_KEY_MAX];

    snprintf(buf, sizeof(buf), "%s%s%s", s->prefix, kind, name);
    return jstr64(buf);
}

/* The end of the range of keys starting with "<prefix><kind><name>". */
static json_t *jrange_end(etcd_store *s, const char *kind, const char *name)
{
    char buf[512 + LEASE_KEY_MAX];
    size_t n = (size_t)snprintf(buf, sizeof(buf), "%s%s%s", s->prefix, kind, name);

    /* Add one to the last byte that is not 0xff (etcd's prefix end). */
    while (n > 0 && (unsigned char)buf[n - 1] == 0xff)
        n--;
    if (n == 0)
        return jstr64("\0");
    buf[n - 1] = (char)((unsigned char)buf[n - 1] + 1);
    return jb64(buf, n);
}

static char *kv_value(json_t *kv, size_t *len)
{
    const char *v = json_string_value(json_object_get(kv, "value"));

    return b64_decode(v ? v : "", len);
}

/* The kvs[0] of the i-th response of a txn, NULL if none. */
/* The kvs of the i-th response of a txn (a range's), or NULL. */
static json_t *txn_kvs(json_t *txn, size_t i)
{
    json_t *r = json_array_get(json_object_get(txn, "responses"), i);

    return json_object_get(json_object_get(r, "response_range"), "kvs");
}

static json_t *txn_kv(json_t *txn, size_t i)
{
    return json_array_get(txn_kvs(txn, i), 0);
}

static int txn_ok(json_t *txn)
{
    return json_is_true(json_object_get(txn, "succeeded"));
}

static json_t *op_range(json_t *key)
{
    return json_pack("{s:{s:o}}", "request_range", "key", key);
}

static json_t *op_put(json_t *key, json_t *value, int64_t lease)
{
    json_t *p = json_pack("{s:o, s:o}", "key", key, "value", value);

    if (p && lease)
        json_object_set_new(p, "lease", json_integer(lease));
    return json_pack("{s:o}", "request_put", p);
}

static json_t *op_delete(json_t *key)
{
    return json_pack("{s:{s:o}}", "request_delete_range", "key", key);
}

static json_t *cmp(json_t *key, const char *target, const char *result,
                   const char *field, json_t *value)
{
    return json_pack("{s:o, s:s, s:s, s:o}", "key", key, "target", target,
                     "result", result, field, value);
}

/* The compares of "(key, owner, token) is the current lease": the key was
 * created at `token` (an expired or released key is gone) and holds this
 * owner. Every write on behalf of a holder is guarded by them. */
static json_t *is_holder(etcd_store *s, const char *key, const char *owner,
                         uint64_t token)
{
    return json_pack("[o, o]",
                     cmp(jkey(s, "lease/", key), "CREATE", "EQUAL", "create_revision",
                         json_integer((json_int_t)token)),
                     cmp(jkey(s, "lease/", key), "VALUE", "EQUAL", "value",
                         jstr64(owner)));
}

static void pad(char out[PAD + 1], uint64_t v)
{
    snprintf(out, PAD + 1, "%0*llu", PAD, (unsigned long long)v);
}

/* ---- history helpers ------------------------------------------------------ */

/* "<len>/<key>/<suffix>", the name of a history/ or ended/ key of `key`
 * (suffix "" gives the prefix of all of them): see the key layout. */
static void hist_name(char out[HNAME_SZ], const char *key, const char *suffix)
{
    snprintf(out, HNAME_SZ, "%03zu/%s/%s", strlen(key), key, suffix);
}

/* The client's wall clock in ms: the KV API has no server time. */
static int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The body of a range request over every key starting with
 * "<prefix><kind><name>". */
static json_t *range_body(etcd_store *s, const char *kind, const char *name)
{
    return json_pack("{s:o, s:o}", "key", jkey(s, kind, name), "range_end",
                     jrange_end(s, kind, name));
}

/* A range over the history entries named by `name` (hist_name(.., "")),
 * in token order: sorted by create_revision, "ASCEND" or "DESCEND". */
static json_t *history_range(etcd_store *s, const char *name, const char *order)
{
    json_t *req = range_body(s, "history/", name);

    if (req) {
        json_object_set_new(req, "sort_order", json_string(order));
        json_object_set_new(req, "sort_target", json_string("CREATE"));
    }
    return req;
}

/* The count of the i-th response of a txn (a range's). */
static int64_t txn_count(json_t *txn, size_t i)
{
    json_t *r = json_array_get(json_object_get(txn, "responses"), i);

    return jint(json_object_get(r, "response_range"), "count");
}

/* ---- etcd leases -------------------------------------------------------- */

static int grant(int64_t *id, uint64_t *granted_ms, etcd_store *s, uint64_t ttl_ms)
{
    json_t *res;
    int rc;

    rc = call(&res, s, "/v3/lease/grant",
              json_pack("{s:I}", "TTL", (json_int_t)((ttl_ms + 999) / 1000)), "grant");
    if (rc < 0)
        return rc;
    *id = jint(res, "ID");
    *granted_ms = (uint64_t)jint(res, "TTL") * 1000;
    json_decref(res);
    if (*id == 0 || *granted_ms == 0)
        return lease__seterr(LEASE_ESTORE, "etcd grant: no lease in the answer");
    return 0;
}

static void revoke(etcd_store *s, int64_t id)
{
    json_t *res = NULL;

    if (call(&res, s, "/v3/lease/revoke", json_pack("{s:I}", "ID", (json_int_t)id),
             "revoke") == 0)
        json_decref(res);
}

/* Keep-alive; *ttl_ms 0 when the lease is gone. */
static int keepalive(uint64_t *ttl_ms, etcd_store *s, int64_t id)
{
    json_t *res;
    int rc = call(&res, s, "/v3/lease/keepalive",
                  json_pack("{s:I}", "ID", (json_int_t)id), "keep-alive");

    if (rc < 0)
        return rc;
    *ttl_ms = (uint64_t)jint(json_object_get(res, "result"), "TTL") * 1000;
    json_decref(res);
    return 0;
}

static uint64_t time_left_ms(etcd_store *s, int64_t id)
{
    json_t *res;
    int64_t ttl;

    if (id == 0 || call(&res, s, "/v3/lease/timetolive",
                        json_pack("{s:I}", "ID", (json_int_t)id), "time to live") < 0)
        return 0;
    ttl = jint(res, "TTL");
    json_decref(res);
    return ttl > 0 ? (uint64_t)ttl * 1000 : 0;
}

/* ---- operations ---------------------------------------------------------- */

/* Fill `info` from the lease and meta kvs (either may be NULL). */
static void fill_info(lease_info *info, etcd_store *s, const char *key,
                      json_t *lease_kv, json_t *meta_kv, uint64_t seen_token)
{
    char *owner, *meta;

    memset(info, 0, sizeof(*info));
    lease__strlcpy(info->key, key, sizeof(info->key));
    info->token = seen_token;
    if (lease_kv == NULL)
        return;
    owner = kv_value(lease_kv, NULL);
    lease__strlcpy(info->owner, owner ? owner : "", sizeof(info->owner));
    free(owner);
    info->held = 1;
    info->token = (uint64_t)jint(lease_kv, "create_revision");
    info->remaining_ms = time_left_ms(s, jint(lease_kv, "lease"));
    if (meta_kv && (meta = kv_value(meta_kv, NULL)) != NULL) {
        char *nl = strchr(meta, '\n');
        info->ttl_ms = strtoull(meta, NULL, 10);
        lease__strlcpy(info->label, nl ? nl + 1 : "", sizeof(info->label));
        free(meta);
    }
}

/*
 * Delete the oldest history entries of `key` beyond the newest
 * LEASE_HISTORY_KEEP, and the end markers of the deleted grants (all below
 * the oldest kept token). Best effort: the grant is made already, and what
 * is left goes at a later grant. It reads the entries afresh rather than
 * trusting the count of the acquire: two prunes racing each keep the top
 * LEASE_HISTORY_KEEP of what they read, and tokens only grow, so together
 * they never keep fewer.
 */
static void prune_history(etcd_store *s, const char *key)
{
    char name[HNAME_SZ], end[HNAME_SZ], tok[PAD + 1];
    json_t *res, *kvs, *req, *ops;
    size_t n, ndel, i;
    int64_t last;

    hist_name(name, key, "");
    if ((req = history_range(s, name, "ASCEND")) != NULL)
        json_object_set_new(req, "keys_only", json_true());
    if (call(&res, s, "/v3/kv/range", req, "prune history") < 0)
        return;
    kvs = json_object_get(res, "kvs");
    n = json_array_size(kvs);
    if (n <= LEASE_HISTORY_KEEP) {
        json_decref(res);
        return;
    }
    ndel = n - LEASE_HISTORY_KEEP;
    if (ndel > PRUNE_MAX)
        ndel = PRUNE_MAX;
    /* The entries' names (as etcd sent them, base64) ... */
    ops = json_array();
    for (i = 0; ops && i < ndel; i++)
        json_array_append_new(ops, op_delete(json_incref(json_object_get(
                                       json_array_get(kvs, i), "key"))));
    /* ... and the markers of every token up to the newest deleted one:
     * "ended/L/K/" up to (excluding) "ended/L/K/<its token + 1>". */
    last = jint(json_array_get(kvs, ndel - 1), "create_revision");
    json_decref(res);
    pad(tok, (uint64_t)last + 1);
    hist_name(end, key, tok);
    if (ops)
        json_array_append_new(ops, json_pack("{s:{s:o, s:o}}", "request_delete_range",
                                             "key", jkey(s, "ended/", name),
                                             "range_end", jkey(s, "ended/", end)));
    if (ops && call(&res, s, "/v3/kv/txn", json_pack("{s:o}", "success", ops),
                    "prune history") == 0)
        json_decref(res);
}

static int etcd_acquire(lease_grant *out, lease_info *holder, lease_store *base,
                        const lease_request *req)
{
    etcd_store *s = (etcd_store *)base;
    uint64_t granted = 0;
    json_t *res, *kv;
    char *metatext, *histtext, *owner;
    char hist[HNAME_SZ], hprefix[HNAME_SZ], hid[17];
    int64_t id;
    int rc;

    if ((rc = grant(&id, &granted, s, req->ttl_ms)) < 0)
        return rc;
    /* "<ttl_ms>\n<label>": the label is bytes, which JSON text could not
     * always carry; for the same reason the history entry is text with the
     * label last. */
    if (asprintf(&metatext, "%llu\n%s", (unsigned long long)granted, req->label) < 0)
        metatext = NULL;
    if (asprintf(&histtext, "%s\n%llu\n%lld\n%s", req->owner,
                 (unsigned long long)granted, (long long)wall_ms(), req->label) < 0)
        histtext = NULL;
    if (metatext == NULL || histtext == NULL) {
        free(metatext);
        free(histtext);
        revoke(s, id);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    snprintf(hid, sizeof(hid), "%016llx", (unsigned long long)id);
    hist_name(hist, req->key, hid);
    hist_name(hprefix, req->key, "");
    /* Create the key only if it does not exist, with the new etcd lease;
     * otherwise read who holds it. The seen/ key is written in the same
     * transaction, so its mod_revision is this grant's token: it tells a
     * free key's last token, and that the key was ever acquired. So is the
     * history entry, whose create_revision is then the token too; the
     * second compare makes sure it is a new key (an existing one would keep
     * an older create_revision), though etcd lease ids are not reused. The
     * count of the entries, this one included, tells when to prune. */
    rc = call(&res, s, "/v3/kv/txn",
              json_pack("{s:[o, o], s:[o, o, o, o, o], s:[o, o]}",
                        "compare",
                        cmp(jkey(s, "lease/", req->key), "CREATE", "EQUAL",
                            "create_revision", json_integer(0)),
                        cmp(jkey(s, "history/", hist), "CREATE", "EQUAL",
                            "create_revision", json_integer(0)),
                        "success",
                        op_put(jkey(s, "lease/", req->key), jstr64(req->owner), id),
                        op_put(jkey(s, "meta/", req->key), jstr64(metatext), id),
                        op_put(jkey(s, "seen/", req->key), jstr64(""), 0),
                        op_put(jkey(s, "history/", hist), jstr64(histtext), 0),
                        json_pack("{s:o}", "request_range",
                                  json_pack("{s:o, s:o, s:b}", "key",
                                            jkey(s, "history/", hprefix), "range_end",
                                            jrange_end(s, "history/", hprefix),
                                            "count_only", 1)),
                        "failure", op_range(jkey(s, "lease/", req->key)),
                        op_range(jkey(s, "meta/", req->key))),
              "acquire");
    free(metatext);
    free(histtext);
    if (rc < 0) {
        /* Unknown outcome: leave the etcd lease; it expires by itself. */
        return rc;
    }
    if (txn_ok(res)) {
        int64_t entries = txn_count(res, 4);

        out->token = (uint64_t)jint(json_object_get(res, "header"), "revision");
        out->ttl_ms = granted;
        json_decref(res);
        if (entries > LEASE_HISTORY_KEEP + HISTORY_SLACK) {
            /* The holder's time runs already: both prune requests get a
             * twentieth of the ttl at most, so a slow cluster costs the
             * holder a tenth of its lease, not the handle's timeout. */
            uint64_t saved = s->timeout_ms, budget = granted / 20 ? granted / 20 : 1;

            if (budget < s->timeout_ms)
                s->timeout_ms = budget;
            prune_history(s, req->key);
            s->timeout_ms = saved;
        }
        return 0;
    }
    s->last_revision = jint(json_object_get(res, "header"), "revision");
    kv = txn_kv(res, 0);
    if (kv == NULL) {
        /* The failure branch reads at the compares' revision: the key was
         * free, so the history compare failed. Nothing was written. */
        json_decref(res);
        revoke(s, id);
        return lease__seterr(LEASE_ESTORE, "acquire '%s': history entry %s "
                             "exists already; try again", req->key, hid);
    }
    owner = kv_value(kv, NULL);
    if (owner && strcmp(owner, req->owner) == 0) {
        /* A retried acquire by the holder: keep its etcd lease alive, same
         * token; the new etcd lease is not needed. */
        uint64_t ttl = 0;
        int64_t old = jint(kv, "lease");

        free(owner);
        revoke(s, id);
        out->token = (uint64_t)jint(kv, "create_revision");
        json_decref(res);
        if ((rc = keepalive(&ttl, s, old)) < 0)
            return rc;
        if (ttl == 0)
            return lease__seterr(LEASE_ESTORE, "'%s': the lease expired while "
                                 "being acquired again; try again", req->key);
        out->ttl_ms = ttl;
        return 0;
    }
    free(owner);
    revoke(s, id);
    fill_info(holder, s, req->key, kv, txn_kv(res, 1), 0);
    json_decref(res);
    return LEASE_EBUSY;
}

/* Is (key, owner, token) the current lease? Returns its etcd lease id. */
static int holder_lease(int64_t *id, etcd_store *s, const char *key,
                        const char *owner, uint64_t token, const char *what)
{
    json_t *res;
    int rc, ok;

    rc = call(&res, s, "/v3/kv/txn",
              json_pack("{s:o, s:[o]}",
                        "compare", is_holder(s, key, owner, token),
                        "success", op_range(jkey(s, "lease/", key))),
              what);
    if (rc < 0)
        return rc;
    ok = txn_ok(res) && txn_kv(res, 0);
    *id = ok ? jint(txn_kv(res, 0), "lease") : 0;
    json_decref(res);
    if (!ok)
        return lease__not_holder(what, key, token, NULL);
    return 0;
}

/*
 * A renew with another ttl: a keep-alive can only restore an etcd lease's
 * own TTL, so move the key to a new etcd lease in a transaction that
 * checks it is still this holder's (a put keeps create_revision, the
 * token), then revoke the old etcd lease.
 */
static int move_to_new_lease(uint64_t *granted_ms, etcd_store *s, const char *key,
                             const char *owner, uint64_t token, uint64_t ttl_ms,
                             int64_t old)
{
    json_t *res, *meta_kv;
    char *meta = NULL, *label, *metatext;
    int64_t id;
    int rc, ok;

    if ((rc = grant(&id, granted_ms, s, ttl_ms)) < 0)
        return rc;
    rc = call(&res, s, "/v3/kv/range", json_pack("{s:o}", "key", jkey(s, "meta/", key)),
              "renew");
    if (rc < 0) {
        revoke(s, id);
        return rc;
    }
    meta_kv = json_array_get(json_object_get(res, "kvs"), 0);
    meta = meta_kv ? kv_value(meta_kv, NULL) : NULL;
    json_decref(res);
    label = meta && strchr(meta, '\n') ? strchr(meta, '\n') + 1 : "";
    if (asprintf(&metatext, "%llu\n%s", (unsigned long long)*granted_ms, label) < 0)
        metatext = NULL;
    free(meta);
    if (metatext == NULL) {
        revoke(s, id);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    rc = call(&res, s, "/v3/kv/txn",
              json_pack("{s:o, s:[o, o]}",
                        "compare", is_holder(s, key, owner, token),
                        "success", op_put(jkey(s, "lease/", key), jstr64(owner), id),
                        op_put(jkey(s, "meta/", key), jstr64(metatext), id)),
              "renew");
    free(metatext);
    if (rc < 0)
        return rc;
    ok = txn_ok(res);
    json_decref(res);
    if (!ok) {
        revoke(s, id);
        return lease__not_holder("renew", key, token, NULL);
    }
    revoke(s, old);
    return 0;
}

static int etcd_renew(uint64_t *granted_ms, lease_store *base, const char *key,
                      const char *owner, uint64_t token, uint64_t ttl_ms)
{
    etcd_store *s = (etcd_store *)base;
    uint64_t current = 0;
    int64_t id;
    int rc;

    if ((rc = holder_lease(&id, s, key, owner, token, "renew")) < 0)
        return rc;
    if ((rc = keepalive(&current, s, id)) < 0)
        return rc;
    if (current == 0)
        return lease__seterr(LEASE_ELOST, "renew '%s': the lease expired", key);
    /* The keep-alive restored the TTL granted before; a longer ttl (beyond
     * the server's rounding) needs a new etcd lease. */
    if (ttl_ms > current)
        return move_to_new_lease(granted_ms, s, key, owner, token, ttl_ms, id);
    *granted_ms = current;
    return 0;
}

static int etcd_release(lease_store *base, const char *key, const char *owner,
                        uint64_t token)
{
    etcd_store *s = (etcd_store *)base;
    char ended[HNAME_SZ], tok[PAD + 1], *marker;
    json_t *res;
    int64_t id = 0;
    int rc, ok;

    pad(tok, token);
    hist_name(ended, key, tok);
    if (asprintf(&marker, "released\n%lld", (long long)wall_ms()) < 0)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    /* Delete only if the key is still the one created at `token` and
     * held by this owner; read its etcd lease on the way, then revoke.
     * The history's end marker goes in the same txn. */
    rc = call(&res, s, "/v3/kv/txn",
              json_pack("{s:o, s:[o, o, o, o]}",
                        "compare", is_holder(s, key, owner, token),
                        "success", op_range(jkey(s, "lease/", key)),
                        op_delete(jkey(s, "lease/", key)),
                        op_delete(jkey(s, "meta/", key)),
                        op_put(jkey(s, "ended/", ended), jstr64(marker), 0)),
              "release");
    free(marker);
    if (rc < 0)
        return rc;
    ok = txn_ok(res);
    if (ok && txn_kv(res, 0))
        id = jint(txn_kv(res, 0), "lease");
    json_decref(res);
    if (!ok)
        return lease__seterr(LEASE_ELOST,
                             "release '%s': this owner does not hold token %llu",
                             key, (unsigned long long)token);
    if (id)
        revoke(s, id);
    return 0;
}

/* One end marker: the token in its name, and its value. */
typedef struct {
    uint64_t token;
    lease_ended ended;
    int64_t ms;
} end_marker;

static int etcd_history(lease_history_entry *out, size_t *n, lease_store *base,
                        const char *key, size_t max)
{
    etcd_store *s = (etcd_store *)base;
    char name[HNAME_SZ];
    json_t *res, *entries, *marks, *rr;
    end_marker *m = NULL;
    size_t nm = 0, i, j;
    int rc;

    *n = 0;
    hist_name(name, key, "");
    /* Entries newest first (the token is the create_revision), and every
     * end marker (pruned with the entries, so few), in one txn: one
     * consistent revision. */
    if ((rr = history_range(s, name, "DESCEND")) != NULL)
        json_object_set_new(rr, "limit", json_integer((json_int_t)max));
    rc = call(&res, s, "/v3/kv/txn",
              json_pack("{s:[{s:o}, {s:o}]}", "success", "request_range", rr,
                        "request_range", range_body(s, "ended/", name)),
              "history");
    if (rc < 0)
        return rc;
    entries = txn_kvs(res, 0);
    marks = txn_kvs(res, 1);
    if (json_array_size(marks) &&
        (m = calloc(json_array_size(marks), sizeof(*m))) == NULL) {
        json_decref(res);
        return lease__seterr(LEASE_ENOMEM, "out of memory reading history");
    }
    for (i = 0; i < json_array_size(marks); i++) {
        json_t *kv = json_array_get(marks, i);
        const char *k64 = json_string_value(json_object_get(kv, "key"));
        size_t klen;
        char *k = b64_decode(k64 ? k64 : "", &klen), *v = kv_value(kv, NULL);

        /* "ended/L/K/<20 digits>" = "released\n<ms>" or "lost\n<ms>" */
        if (k && v && klen >= PAD) {
            m[nm].token = strtoull(k + klen - PAD, NULL, 10);
            m[nm].ended = strncmp(v, "released\n", 9) == 0 ? LEASE_ENDED_RELEASED
                          : strncmp(v, "lost\n", 5) == 0   ? LEASE_ENDED_LOST
                                                            : LEASE_ENDED_HELD;
            m[nm].ms = strtoll(strchr(v, '\n') ? strchr(v, '\n') + 1 : "", NULL, 10);
            if (m[nm].ended != LEASE_ENDED_HELD)
                nm++;
        }
        free(k);
        free(v);
    }
    for (i = 0; i < json_array_size(entries) && *n < max; i++) {
        json_t *kv = json_array_get(entries, i);
        lease_history_entry *e = &out[*n];
        char *v = kv_value(kv, NULL), *p, *nl;

        if (v == NULL)
            continue;
        memset(e, 0, sizeof(*e));
        e->token = (uint64_t)jint(kv, "create_revision");
        /* "<owner>\n<ttl_ms>\n<acquired_ms>\n<label>" */
        p = v;
        if ((nl = strchr(p, '\n')) != NULL) {
            *nl = '\0';
            lease__strlcpy(e->owner, p, sizeof(e->owner));
            p = nl + 1;
            e->ttl_ms = strtoull(p, &p, 10);
            if (*p == '\n')
                e->acquired_ms = strtoll(p + 1, &p, 10);
            if (*p == '\n')
                lease__strlcpy(e->label, p + 1, sizeof(e->label));
        }
        free(v);
        /* A grant with no end marker either still holds (the newest: the
         * core checks it against the lease) or ran out: a later grant
         * needed the key free. When it ran out etcd cannot tell. */
        e->ended = *n == 0 ? LEASE_ENDED_HELD : LEASE_ENDED_EXPIRED;
        for (j = 0; j < nm; j++)
            if (m[j].token == e->token) {
                e->ended = m[j].ended;
                e->ended_ms = m[j].ms;
                break;
            }
        (*n)++;
    }
    free(m);
    json_decref(res);
    return 0;
}

static int etcd_history_lost(lease_store *base, const char *key, const char *owner,
                             uint64_t token)
{
    etcd_store *s = (etcd_store *)base;
    char name[HNAME_SZ], ended[HNAME_SZ], tok[PAD + 1], *v, *marker;
    json_t *res, *req, *kv, *hkey;
    int rc, mine;

    /* The entry's name holds its etcd lease id, which the caller does not
     * know: find it by its create_revision, the token. */
    hist_name(name, key, "");
    req = range_body(s, "history/", name);
    if (req) {
        json_object_set_new(req, "min_create_revision", json_integer((json_int_t)token));
        json_object_set_new(req, "max_create_revision", json_integer((json_int_t)token));
    }
    if ((rc = call(&res, s, "/v3/kv/range", req, "history")) < 0)
        return rc;
    kv = json_array_get(json_object_get(res, "kvs"), 0);
    v = kv ? kv_value(kv, NULL) : NULL;
    mine = v && strncmp(v, owner, LEASE_OWNER_LEN) == 0 && v[LEASE_OWNER_LEN] == '\n';
    free(v);
    if (!mine) {
        /* Pruned, never recorded, or another owner's: nothing to mark. */
        json_decref(res);
        return 0;
    }
    hkey = json_incref(json_object_get(kv, "key"));
    json_decref(res);
    pad(tok, token);
    hist_name(ended, key, tok);
    if (asprintf(&marker, "lost\n%lld", (long long)wall_ms()) < 0) {
        json_decref(hkey);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    /* Only while the entry is there (a prune in between leaves no marker
     * behind) and has no marker yet: a release's stays, and so does an
     * earlier loss with its time. */
    rc = call(&res, s, "/v3/kv/txn",
              json_pack("{s:[o, o], s:[o]}",
                        "compare",
                        cmp(hkey, "CREATE", "EQUAL", "create_revision",
                            json_integer((json_int_t)token)),
                        cmp(jkey(s, "ended/", ended), "CREATE", "EQUAL",
                            "create_revision", json_integer(0)),
                        "success",
                        op_put(jkey(s, "ended/", ended), jstr64(marker), 0)),
              "history");
    free(marker);
    if (rc < 0)
        return rc;
    json_decref(res);
    return 0;
}

static int etcd_inspect(lease_info *out, lease_store *base, const char *key)
{
    etcd_store *s = (etcd_store *)base;
    json_t *res, *seen;
    uint64_t last = 0;
    int rc;

    rc = call(&res, s, "/v3/kv/txn",
              json_pack("{s:[o, o, o]}", "success", op_range(jkey(s, "lease/", key)),
                        op_range(jkey(s, "meta/", key)),
                        op_range(jkey(s, "seen/", key))),
              "inspect");
    if (rc < 0)
        return rc;
    seen = txn_kv(res, 2);
    if (seen == NULL && txn_kv(res, 0) == NULL) {
        json_decref(res);
        return lease__seterr(LEASE_ENOTFOUND, "'%s' was never acquired", key);
    }
    if (seen)
        last = (uint64_t)jint(seen, "mod_revision");
    fill_info(out, s, key, txn_kv(res, 0), txn_kv(res, 1), last);
    json_decref(res);
    return 0;
}

/* The lease key names of a range's kvs, "<prefix><kind>" (skip bytes)
 * cut off; NULL for a name that is not one (too long, holds a NUL). */
static char **kv_names(json_t *kvs, size_t skip)
{
    size_t i, n, count = json_array_size(kvs);
    char **names = calloc(count ? count : 1, sizeof(*names));

    for (i = 0; names && i < count; i++) {
        char *k = b64_decode(json_string_value(json_object_get(json_array_get(kvs, i),
                                                               "key")) ?: "", &n);

        if (k && n > skip && n - skip <= LEASE_KEY_MAX && memchr(k, '\0', n) == NULL) {
            memmove(k, k + skip, n - skip + 1);
            names[i] = k;
        } else {
            free(k);
        }
    }
    return names;
}

static void free_names(char **names, size_t count)
{
    size_t i;

    for (i = 0; names && i < count; i++)
        free(names[i]);
    free(names);
}

/* The kv of kvs whose name is `name`, walking *at forward: both lists are
 * in the same (byte) order, so the walk is one merge over the whole list. */
static json_t *kv_named(json_t *kvs, char **names, size_t *at, const char *name)
{
    size_t count = json_array_size(kvs);

    while (*at < count && (names[*at] == NULL || strcmp(names[*at], name) < 0))
        (*at)++;
    return *at < count && strcmp(names[*at], name) == 0 ? json_array_get(kvs, *at) : NULL;
}

/*
 * One txn reads the seen/, lease/ and meta/ keys under the prefix, at one
 * revision, each range in key order; a merge joins them. Only held keys
 * cost one more call each (the time left on their etcd lease).
 */
static int etcd_list(lease_store *base, const char *prefix, lease_list_cb cb,
                     void *payload)
{
    etcd_store *s = (etcd_store *)base;
    json_t *res, *kvs[3];
    char **names[3];
    size_t skip[3] = { s->prefix_len + 5, s->prefix_len + 6, s->prefix_len + 5 };
    size_t i, li = 0, mi = 0;
    int rc;

    rc = call(&res, s, "/v3/kv/txn",
              json_pack("{s:[{s:o}, {s:o}, {s:o}]}", "success",
                        "request_range", range_body(s, "seen/", prefix),
                        "request_range", range_body(s, "lease/", prefix),
                        "request_range", range_body(s, "meta/", prefix)),
              "list");
    if (rc < 0)
        return rc;
    for (i = 0; i < 3; i++) {
        kvs[i] = txn_kvs(res, i);
        names[i] = kv_names(kvs[i], skip[i]);
    }
    if (names[0] == NULL || names[1] == NULL || names[2] == NULL)
        rc = lease__seterr(LEASE_ENOMEM, "out of memory listing keys");
    for (i = 0; rc == 0 && i < json_array_size(kvs[0]); i++) {
        json_t *seen = json_array_get(kvs[0], i);
        lease_info info;

        if (names[0][i] == NULL)
            continue;
        fill_info(&info, s, names[0][i], kv_named(kvs[1], names[1], &li, names[0][i]),
                  kv_named(kvs[2], names[2], &mi, names[0][i]),
                  (uint64_t)jint(seen, "mod_revision"));
        rc = cb(&info, payload);
    }
    for (i = 0; i < 3; i++)
        free_names(names[i], json_array_size(kvs[i]));
    json_decref(res);
    return rc;
}

static int read_mark(uint64_t *mark, etcd_store *s, const char *resource)
{
    json_t *res, *kv;
    char *v;
    int rc = call(&res, s, "/v3/kv/range",
                  json_pack("{s:o}", "key", jkey(s, "fence/", resource)), "read mark");

    if (rc < 0)
        return rc;
    kv = json_array_get(json_object_get(res, "kvs"), 0);
    if (kv == NULL) {
        json_decref(res);
        return lease__seterr(LEASE_ENOTFOUND, "'%s' has no fencing mark", resource);
    }
    v = kv_value(kv, NULL);
    *mark = v ? strtoull(v, NULL, 10) : 0;
    free(v);
    json_decref(res);
    return 0;
}

static int etcd_fence_advance(uint64_t *mark, lease_store *base,
                              const char *resource, uint64_t token)
{
    etcd_store *s = (etcd_store *)base;
    char tok[PAD + 1], next[PAD + 1];
    int attempt, rc;

    pad(tok, token);
    pad(next, token + 1);
    /* Two transactions cover the two cases (etcd compares are ANDed):
     * raise an existing mark below token+1, or create a missing one. A
     * race between them is settled by the next pass; three are plenty. */
    for (attempt = 0; attempt < 3; attempt++) {
        json_t *res, *kv;
        char *v;
        int ok;

        rc = call(&res, s, "/v3/kv/txn",
                  json_pack("{s:[o, o], s:[o], s:[o]}",
                            "compare",
                            cmp(jkey(s, "fence/", resource), "CREATE", "GREATER",
                                "create_revision", json_integer(0)),
                            cmp(jkey(s, "fence/", resource), "VALUE", "LESS", "value",
                                jstr64(next)),
                            "success",
                            op_put(jkey(s, "fence/", resource), jstr64(tok), 0),
                            "failure", op_range(jkey(s, "fence/", resource))),
                  "fence");
        if (rc < 0)
            return rc;
        ok = txn_ok(res);
        kv = txn_kv(res, 0);
        if (ok) {
            json_decref(res);
            *mark = token;
            return 0;
        }
        if (kv) {
            v = kv_value(kv, NULL);
            *mark = v ? strtoull(v, NULL, 10) : 0;
            free(v);
            json_decref(res);
            return LEASE_ESTALE;
        }
        json_decref(res);
        rc = call(&res, s, "/v3/kv/txn",
                  json_pack("{s:[o], s:[o]}",
                            "compare",
                            cmp(jkey(s, "fence/", resource), "CREATE", "EQUAL",
                                "create_revision", json_integer(0)),
                            "success",
                            op_put(jkey(s, "fence/", resource), jstr64(tok), 0)),
                  "fence");
        if (rc < 0)
            return rc;
        ok = txn_ok(res);
        json_decref(res);
        if (ok) {
            *mark = token;
            return 0;
        }
    }
    return lease__seterr(LEASE_ESTORE, "fence '%s': the mark kept changing", resource);
}

static int etcd_fence_mark(uint64_t *mark, lease_store *base, const char *resource)
{
    return read_mark(mark, (etcd_store *)base, resource);
}

static int etcd_guarded_put(lease_store *base, const char *key, const char *owner,
                            uint64_t token, const char *name, const void *value,
                            size_t len)
{
    etcd_store *s = (etcd_store *)base;
    char tok[24];
    json_t *res;
    int rc, ok;

    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    rc = call(&res, s, "/v3/kv/txn",
              json_pack("{s:o, s:[o, o]}",
                        "compare", is_holder(s, key, owner, token),
                        "success", op_put(jkey(s, "data/", name), jb64(value, len), 0),
                        op_put(jkey(s, "datatok/", name), jstr64(tok), 0)),
              "guarded put");
    if (rc < 0)
        return rc;
    ok = txn_ok(res);
    json_decref(res);
    if (!ok)
        return lease__not_holder(NULL, key, token, "; nothing was written");
    return 0;
}

static int etcd_data_get(void **value, size_t *len, uint64_t *token,
                         lease_store *base, const char *name)
{
    etcd_store *s = (etcd_store *)base;
    json_t *res;
    int rc;

    rc = call(&res, s, "/v3/kv/txn",
              json_pack("{s:[o, o]}", "success", op_range(jkey(s, "data/", name)),
                        op_range(jkey(s, "datatok/", name))),
              "read data");
    if (rc < 0)
        return rc;
    if (txn_kv(res, 0) == NULL) {
        json_decref(res);
        return lease__seterr(LEASE_ENOTFOUND, "no data named '%s'", name);
    }
    *value = kv_value(txn_kv(res, 0), len);
    if (token) {
        char *t = txn_kv(res, 1) ? kv_value(txn_kv(res, 1), NULL) : NULL;
        *token = t ? strtoull(t, NULL, 10) : 0;
        free(t);
    }
    json_decref(res);
    return *value ? 0 : lease__seterr(LEASE_ENOMEM, "out of memory");
}

/* A watch message: stop at the first DELETE (release or expiry). */
static int on_watch(json_t *msg, void *arg)
{
    json_t *events = json_object_get(json_object_get(msg, "result"), "events");
    size_t i;

    (void)arg;
    for (i = 0; i < json_array_size(events); i++) {
        const char *type = json_string_value(json_object_get(json_array_get(events, i),
                                                             "type"));
        if (type && strcmp(type, "DELETE") == 0)
            return 1;
    }
    return 0;
}

static int etcd_wait_release(lease_store *base, const char *key, uint64_t timeout_ms)
{
    etcd_store *s = (etcd_store *)base;
    body stream = { NULL, 0, 0, on_watch, NULL, 0, 0 };
    json_t *req, *res = NULL;
    int rc;

    /* A watch costs a request; for a pause this short, just pause. */
    if (timeout_ms < 20) {
        lease__sleep_ns((int64_t)timeout_ms * 1000000);
        return LEASE_ETIMEOUT;
    }

    /* Watch from just after the revision at which the key was seen busy,
     * so a release in between is not missed. */
    req = json_pack("{s:{s:o}}", "create_request", "key", jkey(s, "lease/", key));
    if (req && s->last_revision > 0)
        json_object_set_new(json_object_get(req, "create_request"), "start_revision",
                            json_integer(s->last_revision + 1));
    if (req == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    rc = post(&res, s, "/v3/watch", req, timeout_ms, &stream, "watch");
    json_decref(req);
    json_decref(res);
    free(stream.data);
    if (rc == 0 && !stream.stop)
        return LEASE_ETIMEOUT; /* the stream ended without a release */
    return rc;
}

static int etcd_set_timeout(lease_store *base, uint64_t timeout_ms)
{
    ((etcd_store *)base)->timeout_ms = timeout_ms;
    return 0;
}

/* ---- open and close ---------------------------------------------------- */

static void etcd_close(lease_store *base)
{
    etcd_store *s = (etcd_store *)base;
    int i;

    if (s->curl)
        curl_easy_cleanup(s->curl);
    for (i = 0; i < s->nendpoints; i++)
        free(s->endpoints[i]);
    free(s->prefix);
    free(s->cacert);
    free(s->cert);
    free(s->key);
    free(s);
}

static int parse_url(etcd_store *s, const lease__url *u)
{
    const char *scheme = strcmp(u->scheme, "etcds") == 0 ? "https://" : "http://";
    const char *p = u->hosts;
    size_t i;

    if (!u->has_authority || *p == '\0')
        return lease__seterr(LEASE_EINVALID,
                             "an etcd URL names its members: etcd://host:port[,host:port...][/prefix]");
    if (u->user || u->password)
        return lease__seterr(LEASE_EINVALID, "etcd URLs take no user or password here");
    while (*p) {
        size_t n = strcspn(p, ",");
        char *e;

        if (n == 0 || n > 255 || s->nendpoints == MAX_ENDPOINTS)
            return lease__seterr(LEASE_EINVALID, "bad member list in the etcd URL");
        if ((e = malloc(strlen(scheme) + n + 1)) == NULL)
            return lease__seterr(LEASE_ENOMEM, "out of memory");
        sprintf(e, "%s%.*s", scheme, (int)n, p);
        s->endpoints[s->nendpoints++] = e;
        p += n;
        if (*p == ',')
            p++;
    }
    if (u->path[0] && strcmp(u->path, "/") != 0) {
        size_t n = strlen(u->path);
        if ((s->prefix = malloc(n + 2)) == NULL)
            return lease__seterr(LEASE_ENOMEM, "out of memory");
        strcpy(s->prefix, u->path);
        if (s->prefix[n - 1] != '/')
            strcat(s->prefix, "/");
    } else if ((s->prefix = strdup("/lease/")) == NULL) {
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    if (strlen(s->prefix) > 256)
        return lease__seterr(LEASE_EINVALID, "etcd prefix is too long");
    s->prefix_len = strlen(s->prefix);
    for (i = 0; i < u->nparams; i++) {
        const char *name = u->params[i].name, *v = u->params[i].value;
        char **slot = strcmp(name, "cacert") == 0 ? &s->cacert
                      : strcmp(name, "cert") == 0 ? &s->cert
                      : strcmp(name, "key") == 0  ? &s->key
                                                  : NULL;
        if (slot == NULL)
            return lease__seterr(LEASE_EINVALID, "unknown etcd URL parameter '%s'", name);
        if ((*slot = strdup(v)) == NULL)
            return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    return 0;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_start(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static int etcd_open(lease_store **out, const char *url, uint64_t timeout_ms)
{
    lease__url u;
    etcd_store *s;
    json_t *res = NULL;
    int rc;

    if ((rc = lease__url_parse(&u, url)) < 0)
        return rc;
    if ((s = calloc(1, sizeof(*s))) == NULL) {
        lease__url_free(&u);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    rc = parse_url(s, &u);
    lease__url_free(&u);
    s->timeout_ms = timeout_ms;
    pthread_once(&curl_once, curl_start);
    if (rc == 0 && (s->curl = curl_easy_init()) == NULL)
        rc = lease__seterr(LEASE_ENOMEM, "cannot start libcurl");
    /* Say hello to the cluster, so a wrong URL fails at open. */
    s->parent.url_redacted = lease__url_redact(url);
    if (rc == 0)
        rc = call(&res, s, "/v3/kv/range",
                  json_pack("{s:o, s:b}", "key", jkey(s, "seen/", ""), "count_only", 1),
                  "connect");
    json_decref(res);
    free(s->parent.url_redacted);
    s->parent.url_redacted = NULL;
    if (rc < 0) {
        etcd_close(&s->parent);
        return rc;
    }
    *out = &s->parent;
    return 0;
}

static const char *const etcd_schemes[] = { "etcd", "etcds", NULL };

const lease_backend lease__etcd_backend = {
    .version = LEASE_BACKEND_VERSION,
    .name = "etcd",
    .schemes = etcd_schemes,
    .features = LEASE_FEATURE_NOTIFY | LEASE_FEATURE_ROUNDS_TTL,
    .open = etcd_open,
    .close = etcd_close,
    .acquire = etcd_acquire,
    .renew = etcd_renew,
    .release = etcd_release,
    .inspect = etcd_inspect,
    .list = etcd_list,
    .fence_advance = etcd_fence_advance,
    .fence_mark = etcd_fence_mark,
    .guarded_put = etcd_guarded_put,
    .data_get = etcd_data_get,
    .guarded_txn = NULL,
    .wait_release = etcd_wait_release,
    .renew_many = NULL,
    .set_timeout = etcd_set_timeout,
    .advisory_txn = NULL,
    .history = etcd_history,
    .history_lost = etcd_history_lost,
};
