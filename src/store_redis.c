/*
 * store_redis.c - Redis, through hiredis: leases and tokens in server-side
 * scripts.
 *
 * URL: redis://[user:password@]host:port[/db][?param=value...]
 *   prefix=TEXT          key prefix (default "lease:")
 *   wait_replicas=N      after each acquisition, WAIT for N replicas
 *   wait_timeout=DUR     how long WAIT may take (default: the call timeout)
 *
 * Key layout (K is the lease key, R a fenced resource, N a data name):
 *   <prefix>{K}:lease    hash owner/label/token/ttl_ms, with the lease's
 *                        own expiry (PEXPIRE): Redis decides expiry
 *   <prefix>{K}:token    the key's token counter, never deleted or expired
 *   <prefix>{K}:history  the grant history (lease/history.h): a list of
 *                        cjson objects, newest grant at the head, trimmed
 *                        to LEASE_HISTORY_KEEP by each new grant; never
 *                        expired, like the counter. Every field is a string
 *                        (token, owner, label, ttl_ms, acquired_ms, ended =
 *                        held/released/expired/lost, ended_ms, expires_ms):
 *                        numbers as decimal strings stay exact, and cjson
 *                        round-trips every byte of a label. expires_ms is
 *                        the expiry the lease had when last extended, kept
 *                        because the lease hash leaves no trace when it
 *                        expires; it dates an expired grant. It ends in
 *                        :history, so list's "*:token" scan never sees it.
 *   <prefix>fence:{R}    high-water mark of a resource
 *   <prefix>data:{N}     hash value/token of a guarded value
 *   channel <prefix>released   a message with K on every release
 * The {…} hash tags keep a key's lease, counter and history in one slot.
 *
 * Each operation is one script, loaded once per connection and called by
 * hash (EVALSHA), loaded again on NOSCRIPT; every value travels as KEYS or
 * ARGV. The history is written by the same scripts that grant, extend and
 * end a lease, so no grant can happen without its entry. Tokens never go
 * backwards across a restart only when the server persists every write
 * before answering: appendonly yes with appendfsync always. The store
 * checks this on connect and logs a warning when it is not so. Across a
 * failover, asynchronous replication can lose grants (see docs/stores.md);
 * wait_replicas narrows that window.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <hiredis/hiredis.h>

#include "lease_int.h"

enum {
    SC_ACQUIRE,
    SC_RENEW,
    SC_RELEASE,
    SC_INSPECT,
    SC_FENCE,
    SC_PUT,
    SC_HISTORY,
    SC_HISTORY_LOST,
    SC_COUNT
};

/* Decimal strings compare as numbers by length, then bytes: exact for
 * every 64-bit token, where Lua's numbers would round above 2^53. */
#define LUA_GE "local function ge(a, b) if #a ~= #b then return #a > #b end " \
               "return a >= b end "

/*
 * History helpers, shared by the scripts that write or read entries.
 * now_ms: the server's wall clock from TIME (allowed in Redis >= 5 scripts,
 * which replicate their effects, and the only mode of Redis 7), as a
 * decimal string built with %d: Lua's tostring would print large numbers
 * in exponent form. head: the newest entry, decoded, or nil (also for an
 * entry that does not decode: the history is best kept, never a reason to
 * refuse a grant). ended_at: when a held entry that is no longer the lease
 * ended: its recorded expiry, but never later than now (the hash can also
 * vanish before its expiry, e.g. deleted by hand or by a client without
 * history; then the time it was found gone is the best bound).
 */
#define LUA_HIST                                                              \
    "local function now_ms() local t = redis.call('TIME') "                   \
    "  return string.format('%d', tonumber(t[1]) * 1000 + "                   \
    "                             math.floor(tonumber(t[2]) / 1000)) end "    \
    "local function plus(a, b) "                                              \
    "  return string.format('%d', tonumber(a) + tonumber(b)) end "            \
    "local function decode(v) "                                               \
    "  if not v then return nil end "                                         \
    "  local ok, e = pcall(cjson.decode, v) "                                 \
    "  if ok and type(e) == 'table' then return e end "                       \
    "  return nil end "                                                       \
    "local function head(k) return decode(redis.call('LINDEX', k, 0)) end "  \
    "local function ended_at(e, now) "                                        \
    "  local x = tonumber(e.expires_ms or '') "                               \
    "  if x and x > 0 and x <= tonumber(now) then return e.expires_ms end "   \
    "  return now end "

static const char *const scripts[SC_COUNT] = {
    /* KEYS: lease, counter, history. ARGV: owner, label, ttl_ms, keep. */
    [SC_ACQUIRE] =
        LUA_HIST
        "local cur = redis.call('HGET', KEYS[1], 'owner') "
        "if cur then "
        "  if cur == ARGV[1] then "
        "    redis.call('HSET', KEYS[1], 'label', ARGV[2], 'ttl_ms', ARGV[3]) "
        "    redis.call('PEXPIRE', KEYS[1], ARGV[3]) "
        "    local t = redis.call('HGET', KEYS[1], 'token') "
        /* A retry by the holder is no new grant: no entry, but it extends
         * the lease like a renew, so the entry's expiry follows. */
        "    local e = head(KEYS[3]) "
        "    if e and e.token == t and e.ended == 'held' then "
        "      e.expires_ms = plus(now_ms(), ARGV[3]) "
        "      redis.call('LSET', KEYS[3], 0, cjson.encode(e)) "
        "    end "
        "    return {1, t} "
        "  end "
        "  local h = redis.call('HMGET', KEYS[1], 'owner', 'label', 'token', 'ttl_ms') "
        "  return {0, h[1], h[2], h[3], tostring(redis.call('PTTL', KEYS[1])), h[4]} "
        "end "
        /* GET after INCR: Lua numbers are doubles, the string is exact. */
        "redis.call('INCR', KEYS[2]) "
        "local t = redis.call('GET', KEYS[2]) "
        "redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'label', ARGV[2], "
        "           'token', t, 'ttl_ms', ARGV[3]) "
        "redis.call('PEXPIRE', KEYS[1], ARGV[3]) "
        /* No unexpired lease existed, so a previous grant still marked held
         * ran out. Only the head can be: every grant made here pushes its
         * entry, and every earlier one was ended by the grant after it. */
        "local now = now_ms() "
        "local p = head(KEYS[3]) "
        "if p and p.ended == 'held' then "
        "  p.ended = 'expired' "
        "  p.ended_ms = ended_at(p, now) "
        "  redis.call('LSET', KEYS[3], 0, cjson.encode(p)) "
        "end "
        "redis.call('LPUSH', KEYS[3], cjson.encode({token = t, owner = ARGV[1], "
        "  label = ARGV[2], ttl_ms = ARGV[3], acquired_ms = now, ended = 'held', "
        "  ended_ms = '0', expires_ms = plus(now, ARGV[3])})) "
        "redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[4]) - 1) "
        "return {1, t}",
    /* KEYS: lease, history. ARGV: owner, token, ttl_ms. A missing
     * (expired) hash is never revived. The entry keeps the new expiry, to
     * date the grant if it runs out. */
    [SC_RENEW] =
        LUA_HIST
        "local h = redis.call('HMGET', KEYS[1], 'owner', 'token') "
        "if h[1] == ARGV[1] and h[2] == ARGV[2] then "
        "  redis.call('PEXPIRE', KEYS[1], ARGV[3]) "
        "  redis.call('HSET', KEYS[1], 'ttl_ms', ARGV[3]) "
        "  local e = head(KEYS[2]) "
        "  if e and e.token == ARGV[2] and e.ended == 'held' then "
        "    e.expires_ms = plus(now_ms(), ARGV[3]) "
        "    redis.call('LSET', KEYS[2], 0, cjson.encode(e)) "
        "  end "
        "  return 1 "
        "end "
        "return 0",
    /* KEYS: lease, history. ARGV: owner, token, channel, key. Compare
     * before deleting: a plain DEL would remove a successor's lease. The
     * current lease's entry is the head (the newest grant). */
    [SC_RELEASE] =
        LUA_HIST
        "local h = redis.call('HMGET', KEYS[1], 'owner', 'token') "
        "if h[1] == ARGV[1] and h[2] == ARGV[2] then "
        "  redis.call('DEL', KEYS[1]) "
        "  local e = head(KEYS[2]) "
        "  if e and e.token == ARGV[2] and e.ended == 'held' then "
        "    e.ended = 'released' "
        "    e.ended_ms = now_ms() "
        "    redis.call('LSET', KEYS[2], 0, cjson.encode(e)) "
        "  end "
        "  redis.call('PUBLISH', ARGV[3], ARGV[4]) "
        "  return 1 "
        "end "
        "return 0",
    /* KEYS: lease, counter. */
    [SC_INSPECT] =
        "local c = redis.call('GET', KEYS[2]) "
        "if not c then return {0} end "
        "local h = redis.call('HMGET', KEYS[1], 'owner', 'label', 'token', 'ttl_ms') "
        "return {1, c, h[1] or '', h[2] or '', h[3] or '', "
        "        tostring(redis.call('PTTL', KEYS[1])), h[4] or ''}",
    /* KEYS: mark. ARGV: token. Equality is accepted. */
    [SC_FENCE] =
        LUA_GE
        "local m = redis.call('GET', KEYS[1]) or '0' "
        "if ge(ARGV[1], m) then redis.call('SET', KEYS[1], ARGV[1]) return {1, ARGV[1]} end "
        "return {0, m}",
    /* KEYS: lease, data. ARGV: owner, token, value. Applied only while the
     * lease's owner and token are current (an expired hash is gone). */
    [SC_PUT] =
        "local h = redis.call('HMGET', KEYS[1], 'owner', 'token') "
        "if h[1] == ARGV[1] and h[2] == ARGV[2] then "
        "  redis.call('HSET', KEYS[2], 'value', ARGV[3], 'token', ARGV[2]) "
        "  return 1 "
        "end "
        "return 0",
    /* KEYS: history, lease. ARGV: max. Newest first, each entry as
     * {token, owner, label, ttl_ms, acquired_ms, ended, ended_ms}. A held
     * entry that is not the lease in the same atomic read ran out: say
     * expired here, where its recorded expiry is at hand. */
    [SC_HISTORY] =
        LUA_HIST
        "local now = now_ms() "
        "local h = redis.call('HMGET', KEYS[2], 'owner', 'token') "
        "local out = {} "
        "for _, v in ipairs(redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)) do "
        "  local e = decode(v) "
        "  if e and e.token then "
        "    local ended, ended_ms = e.ended or 'held', e.ended_ms or '0' "
        "    if ended == 'held' and not (h[1] == e.owner and h[2] == e.token) then "
        "      ended, ended_ms = 'expired', ended_at(e, now) "
        "    end "
        "    out[#out + 1] = {e.token, e.owner or '', e.label or '', "
        "                     e.ttl_ms or '0', e.acquired_ms or '0', ended, ended_ms} "
        "  end "
        "end "
        "return out",
    /* KEYS: history, lease. ARGV: owner, token. The grant whose renew was
     * refused: lost, unless released; an end time it already has (a
     * successor's takeover found it expired) is kept. Not while it is still
     * the lease, which only a stray call could ask. Tokens are unique per
     * key, so the walk (at most the kept entries) stops at the first. */
    [SC_HISTORY_LOST] =
        LUA_HIST
        "local h = redis.call('HMGET', KEYS[2], 'owner', 'token') "
        "if h[1] == ARGV[1] and h[2] == ARGV[2] then return 0 end "
        "for i, v in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do "
        "  local e = decode(v) "
        "  if e and e.token == ARGV[2] then "
        "    if e.owner ~= ARGV[1] or e.ended == 'released' then return 0 end "
        "    if not e.ended_ms or e.ended_ms == '0' then "
        "      e.ended_ms = ended_at(e, now_ms()) "
        "    end "
        "    e.ended = 'lost' "
        "    redis.call('LSET', KEYS[1], i - 1, cjson.encode(e)) "
        "    return 1 "
        "  end "
        "end "
        "return 0",
};

typedef struct {
    lease_store parent;
    redisContext *ctx;      /* commands */
    redisContext *sub;      /* pub/sub, opened by the first wait */
    char host[256];
    int port;
    char *user, *password;  /* never printed */
    int db;
    char prefix[64];
    int wait_replicas;
    uint64_t wait_timeout_ms;
    char sha[SC_COUNT][41];
    uint64_t timeout_ms;
} redis_store;

static _Atomic int durability_warned;

/* ---- connection ------------------------------------------------------- */

static struct timeval tv_ms(uint64_t ms)
{
    struct timeval tv;

    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)((ms % 1000) * 1000);
    return tv;
}

static void drop(redis_store *s)
{
    if (s->ctx)
        redisFree(s->ctx);
    s->ctx = NULL;
}

static void drop_sub(redis_store *s)
{
    if (s->sub)
        redisFree(s->sub);
    s->sub = NULL;
}

static int fail_ctx(redis_store *s, redisContext *c, const char *what)
{
    int rc = lease__seterr(LEASE_ESTORE, "redis %s on %s: %s", what,
                           s->parent.url_redacted ? s->parent.url_redacted : "?",
                           c && c->errstr[0] ? c->errstr : "connection lost");

    /* After an I/O error a context is unusable: the next call reconnects. */
    if (c == s->ctx)
        drop(s);
    else if (c == s->sub)
        drop_sub(s);
    return rc;
}

/* Run a command with binary-safe arguments; *out must be freed. */
static int call(redisReply **out, redis_store *s, redisContext *c, int argc,
                const char **argv, const size_t *lens, const char *what)
{
    redisReply *r = redisCommandArgv(c, argc, argv, lens);

    *out = NULL;
    if (r == NULL)
        return fail_ctx(s, c, what);
    if (r->type == REDIS_REPLY_ERROR) {
        int rc = lease__seterr(LEASE_ESTORE, "redis %s: %s", what, r->str);
        *out = r; /* the caller may look at NOSCRIPT */
        return rc;
    }
    *out = r;
    return 0;
}

static int simple(redis_store *s, redisContext *c, const char *what, int argc,
                  const char **argv)
{
    redisReply *r;
    int rc = call(&r, s, c, argc, argv, NULL, what);

    freeReplyObject(r);
    return rc;
}

static redisContext *connect_one(redis_store *s, int *rc)
{
    struct timeval tv = tv_ms(s->timeout_ms);
    redisContext *c = redisConnectWithTimeout(s->host, s->port, tv);
    char db[16];

    if (c == NULL) {
        *rc = lease__seterr(LEASE_ENOMEM, "out of memory");
        return NULL;
    }
    if (c->err) {
        *rc = lease__seterr(LEASE_ESTORE, "cannot connect to redis %s: %s",
                            s->parent.url_redacted, c->errstr);
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    redisEnableKeepAlive(c);
    if (s->password) {
        const char *a3[3] = { "AUTH", s->user, s->password };
        const char *a2[2] = { "AUTH", s->password };
        redisReply *r = s->user && *s->user ? redisCommandArgv(c, 3, a3, NULL)
                                            : redisCommandArgv(c, 2, a2, NULL);
        /* The server's answer names no password; still, say only that
         * authentication failed. */
        if (r == NULL || r->type == REDIS_REPLY_ERROR) {
            *rc = lease__seterr(LEASE_ESTORE, "redis %s: authentication failed",
                                s->parent.url_redacted);
            freeReplyObject(r);
            redisFree(c);
            return NULL;
        }
        freeReplyObject(r);
    }
    if (s->db) {
        const char *a[2] = { "SELECT", db };
        redisReply *r;
        snprintf(db, sizeof(db), "%d", s->db);
        r = redisCommandArgv(c, 2, a, NULL);
        if (r == NULL || r->type == REDIS_REPLY_ERROR) {
            *rc = lease__seterr(LEASE_ESTORE, "redis SELECT %d: %s", s->db,
                                r ? r->str : c->errstr);
            freeReplyObject(r);
            redisFree(c);
            return NULL;
        }
        freeReplyObject(r);
    }
    *rc = 0;
    return c;
}

static int load_scripts(redis_store *s)
{
    int i, rc;

    for (i = 0; i < SC_COUNT; i++) {
        const char *a[3] = { "SCRIPT", "LOAD", scripts[i] };
        redisReply *r;

        if ((rc = call(&r, s, s->ctx, 3, a, NULL, "script load")) < 0) {
            freeReplyObject(r);
            return rc;
        }
        if (r->type != REDIS_REPLY_STRING || r->len != 40) {
            freeReplyObject(r);
            return lease__seterr(LEASE_ESTORE, "redis SCRIPT LOAD: odd reply");
        }
        memcpy(s->sha[i], r->str, 41);
        freeReplyObject(r);
    }
    return 0;
}

/* Tokens never go backwards across a restart only if every write is on
 * disk before the answer: say so, once per process, when it is not. */
static void check_durability(redis_store *s)
{
    const char *a[3] = { "CONFIG", "GET", "append*" };
    int aof = 0, always = 0;
    redisReply *r;
    size_t i;

    if (durability_warned || call(&r, s, s->ctx, 3, a, NULL, "config get") < 0) {
        if (!durability_warned)
            freeReplyObject(r);
        return;
    }
    if (r && r->type == REDIS_REPLY_ARRAY) {
        for (i = 0; i + 1 < r->elements; i += 2) {
            const char *k = r->element[i]->str, *v = r->element[i + 1]->str;
            if (k && v && strcmp(k, "appendonly") == 0)
                aof = strcmp(v, "yes") == 0;
            if (k && v && strcmp(k, "appendfsync") == 0)
                always = strcmp(v, "always") == 0;
        }
        if (!aof || !always) {
            char msg[512];
            durability_warned = 1;
            snprintf(msg, sizeof(msg),
                     "redis server %s:%d runs with appendonly %s, appendfsync "
                     "%s: after a restart tokens may be issued again; use "
                     "appendonly yes and appendfsync always",
                     s->host, s->port, aof ? "yes" : "no",
                     always ? "always" : "not always");
            lease__log(LEASE_LOG_WARN, "durability", "redis", msg);
        }
    }
    freeReplyObject(r);
}

static int ensure(redis_store *s)
{
    int rc;

    if (s->ctx)
        return 0;
    if ((s->ctx = connect_one(s, &rc)) == NULL)
        return rc;
    if ((rc = load_scripts(s)) < 0) {
        drop(s);
        return rc;
    }
    check_durability(s);
    if (s->ctx == NULL) /* the connection dropped during the check */
        return LEASE_ESTORE;
    return 0;
}

/* EVALSHA, reloading the scripts once if the server forgot them. */
static int eval(redisReply **out, redis_store *s, int which, int nkeys,
                const char **args, const size_t *lens, int nargs,
                const char *what)
{
    const char *argv[12];
    size_t lv[12];
    char nk[8];
    int i, rc, attempt;

    *out = NULL;
    snprintf(nk, sizeof(nk), "%d", nkeys);
    for (attempt = 0; attempt < 2; attempt++) {
        redisReply *r;

        if ((rc = ensure(s)) < 0)
            return rc;
        argv[0] = "EVALSHA";
        lv[0] = 7;
        argv[1] = s->sha[which];
        lv[1] = 40;
        argv[2] = nk;
        lv[2] = strlen(nk);
        for (i = 0; i < nargs; i++) {
            argv[3 + i] = args[i];
            lv[3 + i] = lens ? lens[i] : strlen(args[i]);
        }
        rc = call(&r, s, s->ctx, 3 + nargs, argv, lv, what);
        if (rc == 0) {
            *out = r;
            return 0;
        }
        if (r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0 &&
            attempt == 0) {
            freeReplyObject(r);
            if ((rc = load_scripts(s)) < 0)
                return rc;
            continue;
        }
        freeReplyObject(r);
        return rc;
    }
    return rc;
}

/* ---- keys ---------------------------------------------------------------- */

/* <prefix>{name}<suffix>, binary-safe for every byte but NUL. */
static size_t key_of(char *out, size_t size, const redis_store *s,
                     const char *kind, const char *name, const char *suffix)
{
    int n = snprintf(out, size, "%s%s{%s}%s", s->prefix, kind, name, suffix);

    return n < 0 ? 0 : (size_t)n;
}

#define KEYBUF (64 + 16 + LEASE_KEY_MAX + 16)

static uint64_t str_u64(const redisReply *r)
{
    if (r == NULL)
        return 0;
    if (r->type == REDIS_REPLY_INTEGER)
        return r->integer > 0 ? (uint64_t)r->integer : 0;
    if (r->type == REDIS_REPLY_STRING && r->str[0] != '-')
        return strtoull(r->str, NULL, 10);
    return 0;
}

static void str_copy(char *dst, size_t size, const redisReply *r)
{
    lease__strlcpy(dst, r && r->type == REDIS_REPLY_STRING ? r->str : "", size);
}

/* ---- operations ------------------------------------------------------------ */

static int wait_for_replicas(redis_store *s)
{
    char n[16], ms[24];
    const char *a[3] = { "WAIT", n, ms };
    redisReply *r;
    int rc;

    snprintf(n, sizeof(n), "%d", s->wait_replicas);
    snprintf(ms, sizeof(ms), "%llu", (unsigned long long)s->wait_timeout_ms);
    if ((rc = call(&r, s, s->ctx, 3, a, NULL, "wait")) < 0) {
        freeReplyObject(r);
        return rc;
    }
    rc = r->type == REDIS_REPLY_INTEGER && r->integer >= s->wait_replicas
             ? 0
             : lease__seterr(LEASE_ESTORE,
                             "granted on the primary, but only %lld of %d "
                             "replicas acknowledged it in time: ownership is "
                             "uncertain (acquiring again with the same owner "
                             "is safe)",
                             r->type == REDIS_REPLY_INTEGER ? r->integer : 0LL,
                             s->wait_replicas);
    freeReplyObject(r);
    return rc;
}

static int redis_acquire(lease_grant *out, lease_info *holder, lease_store *base,
                         const lease_request *req)
{
    redis_store *s = (redis_store *)base;
    char lk[KEYBUF], ck[KEYBUF], hk[KEYBUF], ttl[24], keep[24];
    const char *args[7];
    redisReply *r;
    int rc;

    key_of(lk, sizeof(lk), s, "", req->key, ":lease");
    key_of(ck, sizeof(ck), s, "", req->key, ":token");
    key_of(hk, sizeof(hk), s, "", req->key, ":history");
    snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)req->ttl_ms);
    /* The script trims the history to this many grants: the C constant is
     * the one definition of the bound. */
    snprintf(keep, sizeof(keep), "%d", LEASE_HISTORY_KEEP);
    args[0] = lk;
    args[1] = ck;
    args[2] = hk;
    args[3] = req->owner;
    args[4] = req->label;
    args[5] = ttl;
    args[6] = keep;
    if ((rc = eval(&r, s, SC_ACQUIRE, 3, args, NULL, 7, "acquire")) < 0)
        return rc;
    /* A reply of another shape is a store failure, never busy or success. */
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER ||
        (r->element[0]->integer == 1 && str_u64(r->element[1]) == 0) ||
        (r->element[0]->integer != 1 && r->element[0]->integer != 0)) {
        freeReplyObject(r);
        return lease__seterr(LEASE_ESTORE, "redis acquire: odd reply");
    }
    if (r->element[0]->integer == 1) {
        out->token = str_u64(r->element[1]);
        out->ttl_ms = req->ttl_ms;
        freeReplyObject(r);
        drop_sub(s); /* stop listening once the wait is over */
        if (s->wait_replicas > 0)
            return wait_for_replicas(s);
        return 0;
    }
    memset(holder, 0, sizeof(*holder));
    lease__strlcpy(holder->key, req->key, sizeof(holder->key));
    if (r->elements >= 6) {
        str_copy(holder->owner, sizeof(holder->owner), r->element[1]);
        str_copy(holder->label, sizeof(holder->label), r->element[2]);
        holder->token = str_u64(r->element[3]);
        holder->remaining_ms = str_u64(r->element[4]);
        holder->ttl_ms = str_u64(r->element[5]);
        holder->held = 1;
    }
    freeReplyObject(r);
    return LEASE_EBUSY;
}

static int redis_renew(uint64_t *granted_ms, lease_store *base, const char *key,
                       const char *owner, uint64_t token, uint64_t ttl_ms)
{
    redis_store *s = (redis_store *)base;
    char lk[KEYBUF], hk[KEYBUF], tok[24], ttl[24];
    const char *args[5] = { lk, hk, owner, tok, ttl };
    redisReply *r;
    int rc, ok;

    key_of(lk, sizeof(lk), s, "", key, ":lease");
    key_of(hk, sizeof(hk), s, "", key, ":history");
    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)ttl_ms);
    if ((rc = eval(&r, s, SC_RENEW, 2, args, NULL, 5, "renew")) < 0)
        return rc;
    ok = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (!ok)
        return lease__not_holder("renew", key, token, NULL);
    *granted_ms = ttl_ms;
    return 0;
}

static int redis_release(lease_store *base, const char *key, const char *owner,
                         uint64_t token)
{
    redis_store *s = (redis_store *)base;
    char lk[KEYBUF], hk[KEYBUF], tok[24], chan[96];
    const char *args[6] = { lk, hk, owner, tok, chan, key };
    redisReply *r;
    int rc, ok;

    key_of(lk, sizeof(lk), s, "", key, ":lease");
    key_of(hk, sizeof(hk), s, "", key, ":history");
    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    snprintf(chan, sizeof(chan), "%sreleased", s->prefix);
    if ((rc = eval(&r, s, SC_RELEASE, 2, args, NULL, 6, "release")) < 0)
        return rc;
    ok = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (!ok)
        return lease__seterr(LEASE_ELOST,
                             "release '%s': this owner does not hold token %llu",
                             key, (unsigned long long)token);
    return 0;
}

/* The inspect script's reply, for `key`; ENOTFOUND for a key never
 * acquired. Frees r. */
static int inspect_reply(lease_info *out, redisReply *r, const char *key)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->integer != 1 || r->elements < 7) {
        freeReplyObject(r);
        return lease__seterr(LEASE_ENOTFOUND, "'%s' was never acquired", key);
    }
    memset(out, 0, sizeof(*out));
    lease__strlcpy(out->key, key, sizeof(out->key));
    str_copy(out->owner, sizeof(out->owner), r->element[2]);
    out->held = out->owner[0] != '\0';
    str_copy(out->label, sizeof(out->label), r->element[3]);
    /* A free key reports its last token: the counter. */
    out->token = out->held ? str_u64(r->element[4]) : str_u64(r->element[1]);
    out->remaining_ms = out->held ? str_u64(r->element[5]) : 0;
    out->ttl_ms = out->held ? str_u64(r->element[6]) : 0;
    freeReplyObject(r);
    return 0;
}

static int redis_inspect(lease_info *out, lease_store *base, const char *key)
{
    redis_store *s = (redis_store *)base;
    char lk[KEYBUF], ck[KEYBUF];
    const char *args[2] = { lk, ck };
    redisReply *r;
    int rc;

    key_of(lk, sizeof(lk), s, "", key, ":lease");
    key_of(ck, sizeof(ck), s, "", key, ":token");
    if ((rc = eval(&r, s, SC_INSPECT, 2, args, NULL, 2, "inspect")) < 0)
        return rc;
    return inspect_reply(out, r, key);
}

/*
 * Inspect n keys in one pipelined round trip: infos[*got ...] receive the
 * ones that exist. A script the server lost (NOSCRIPT) or any other error
 * reply falls back to one inspect for that key.
 */
static int inspect_many(lease_info *infos, size_t *got, redis_store *s,
                        char (*names)[LEASE_KEY_MAX + 1], size_t n)
{
    char lk[KEYBUF], ck[KEYBUF];
    size_t i, sent = 0;
    int rc = 0;

    if ((rc = ensure(s)) < 0)
        return rc;
    for (i = 0; i < n; i++) {
        const char *argv[5] = { "EVALSHA", s->sha[SC_INSPECT], "2", lk, ck };

        key_of(lk, sizeof(lk), s, "", names[i], ":lease");
        key_of(ck, sizeof(ck), s, "", names[i], ":token");
        if (redisAppendCommandArgv(s->ctx, 5, argv, NULL) != REDIS_OK)
            break;
        sent++;
    }
    /* Read every reply that was queued, even after a failure, so that the
     * connection is not left with answers in flight. */
    for (i = 0; i < sent; i++) {
        redisReply *r = NULL;

        if (s->ctx == NULL || redisGetReply(s->ctx, (void **)&r) != REDIS_OK || r == NULL) {
            if (s->ctx)
                rc = fail_ctx(s, s->ctx, "list");
            return rc < 0 ? rc : lease__seterr(LEASE_ESTORE, "redis list: no reply");
        }
        if (r->type == REDIS_REPLY_ERROR) {
            freeReplyObject(r);
            continue; /* again below, alone */
        }
        if (inspect_reply(&infos[*got], r, names[i]) == 0)
            (*got)++;
        names[i][0] = '\0'; /* done */
    }
    if (sent < n)
        return fail_ctx(s, s->ctx, "list");
    for (i = 0; i < n; i++) {
        if (names[i][0] == '\0')
            continue;
        if ((rc = redis_inspect(&infos[*got], &s->parent, names[i])) == 0)
            (*got)++;
        else if (rc != LEASE_ENOTFOUND)
            return rc;
    }
    return 0;
}

static int cmp_info(const void *a, const void *b)
{
    return strcmp(((const lease_info *)a)->key, ((const lease_info *)b)->key);
}

/* Escape glob characters so the prefix matches itself only. */
static void glob_escape(char *out, size_t size, const char *in)
{
    size_t n = 0;

    for (; *in && n + 2 < size; in++) {
        if (strchr("*?[]\\", *in))
            out[n++] = '\\';
        out[n++] = *in;
    }
    out[n] = '\0';
}

static int redis_list(lease_store *base, const char *prefix, lease_list_cb cb,
                      void *payload)
{
    redis_store *s = (redis_store *)base;
    char pat[2 * (64 + LEASE_KEY_MAX) + 16], ep[2 * 64 + 2], ek[2 * LEASE_KEY_MAX + 2];
    char cursor[32] = "0";
    lease_info *infos = NULL;
    char (*batch)[LEASE_KEY_MAX + 1] = NULL;
    size_t n = 0, cap = 0, i, plen = strlen(s->prefix);
    int rc, rounds;

    if ((rc = ensure(s)) < 0)
        return rc;
    glob_escape(ep, sizeof(ep), s->prefix);
    glob_escape(ek, sizeof(ek), prefix);
    snprintf(pat, sizeof(pat), "%s{%s*:token", ep, ek);
    /* Bounded: SCAN ends when the cursor comes back to 0; the round cap
     * only guards against a server that never says so. */
    for (rounds = 0; rounds < 1000000; rounds++) {
        const char *a[6] = { "SCAN", cursor, "MATCH", pat, "COUNT", "500" };
        redisReply *r;
        size_t nb = 0;

        if ((rc = call(&r, s, s->ctx, 6, a, NULL, "list")) < 0) {
            freeReplyObject(r);
            goto out;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            freeReplyObject(r);
            rc = lease__seterr(LEASE_ESTORE, "redis SCAN: odd reply");
            goto out;
        }
        lease__strlcpy(cursor, r->element[0]->str, sizeof(cursor));
        /* COUNT is a hint: size the batch by what came. */
        free(batch);
        batch = malloc((r->element[1]->elements ? r->element[1]->elements : 1) *
                       sizeof(*batch));
        if (batch == NULL) {
            freeReplyObject(r);
            rc = lease__seterr(LEASE_ENOMEM, "out of memory");
            goto out;
        }
        for (i = 0; i < r->element[1]->elements; i++) {
            const redisReply *k = r->element[1]->element[i];
            char name[LEASE_KEY_MAX + 1];
            size_t len = k->len;

            /* <prefix>{name}:token */
            if (len < plen + 8 || k->str[plen] != '{' || len - plen - 8 > LEASE_KEY_MAX)
                continue;
            memcpy(name, k->str + plen + 1, len - plen - 8);
            name[len - plen - 8] = '\0';
            if (strncmp(name, prefix, strlen(prefix)) != 0)
                continue;
            memcpy(batch[nb++], name, sizeof(name));
        }
        freeReplyObject(r);
        /* Room for the batch, then one pipelined round trip for it. */
        if (n + nb > cap) {
            size_t want = cap ? cap : 32;
            lease_info *p;

            while (want < n + nb)
                want *= 2;
            if ((p = realloc(infos, want * sizeof(*p))) == NULL) {
                rc = lease__seterr(LEASE_ENOMEM, "out of memory");
                goto out;
            }
            infos = p;
            cap = want;
        }
        if (nb > 0 && (rc = inspect_many(infos, &n, s, batch, nb)) < 0)
            goto out;
        if (strcmp(cursor, "0") == 0)
            break;
    }
    if (n > 0)
        qsort(infos, n, sizeof(*infos), cmp_info);
    for (i = 0; i < n && rc == 0; i++)
        rc = cb(&infos[i], payload);
out:
    free(batch);
    free(infos);
    return rc;
}

static int redis_fence_advance(uint64_t *mark, lease_store *base,
                               const char *resource, uint64_t token)
{
    redis_store *s = (redis_store *)base;
    char fk[KEYBUF], tok[24];
    const char *args[2] = { fk, tok };
    redisReply *r;
    int rc, ok;

    key_of(fk, sizeof(fk), s, "fence:", resource, "");
    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    if ((rc = eval(&r, s, SC_FENCE, 1, args, NULL, 2, "fence")) < 0)
        return rc;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER ||
        r->element[1]->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        return lease__seterr(LEASE_ESTORE, "redis fence: odd reply");
    }
    ok = r->element[0]->integer == 1;
    *mark = str_u64(r->element[1]);
    freeReplyObject(r);
    return ok ? 0 : LEASE_ESTALE;
}

static int redis_fence_mark(uint64_t *mark, lease_store *base,
                            const char *resource)
{
    redis_store *s = (redis_store *)base;
    char fk[KEYBUF];
    const char *a[2] = { "GET", fk };
    redisReply *r;
    int rc;

    key_of(fk, sizeof(fk), s, "fence:", resource, "");
    if ((rc = ensure(s)) < 0)
        return rc;
    if ((rc = call(&r, s, s->ctx, 2, a, NULL, "read mark")) < 0) {
        freeReplyObject(r);
        return rc;
    }
    if (r->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        return lease__seterr(LEASE_ENOTFOUND, "'%s' has no fencing mark", resource);
    }
    *mark = str_u64(r);
    freeReplyObject(r);
    return 0;
}

static int redis_guarded_put(lease_store *base, const char *key,
                             const char *owner, uint64_t token, const char *name,
                             const void *value, size_t len)
{
    redis_store *s = (redis_store *)base;
    char lk[KEYBUF], dk[KEYBUF], tok[24];
    const char *args[5] = { lk, dk, owner, tok, value };
    size_t lens[5];
    redisReply *r;
    int rc, ok;

    key_of(lk, sizeof(lk), s, "", key, ":lease");
    key_of(dk, sizeof(dk), s, "data:", name, "");
    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    lens[0] = strlen(lk);
    lens[1] = strlen(dk);
    lens[2] = strlen(owner);
    lens[3] = strlen(tok);
    lens[4] = len;
    if ((rc = eval(&r, s, SC_PUT, 2, args, lens, 5, "guarded put")) < 0)
        return rc;
    ok = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (!ok)
        return lease__not_holder(NULL, key, token, "; nothing was written");
    return 0;
}

static int redis_data_get(void **value, size_t *len, uint64_t *token,
                          lease_store *base, const char *name)
{
    redis_store *s = (redis_store *)base;
    char dk[KEYBUF];
    const char *a[4] = { "HMGET", dk, "value", "token" };
    redisReply *r;
    char *copy;
    int rc;

    key_of(dk, sizeof(dk), s, "data:", name, "");
    if ((rc = ensure(s)) < 0)
        return rc;
    if ((rc = call(&r, s, s->ctx, 4, a, NULL, "read data")) < 0) {
        freeReplyObject(r);
        return rc;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        return lease__seterr(LEASE_ENOTFOUND, "no data named '%s'", name);
    }
    if ((copy = malloc(r->element[0]->len + 1)) == NULL) {
        freeReplyObject(r);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    memcpy(copy, r->element[0]->str, r->element[0]->len);
    copy[r->element[0]->len] = '\0';
    *value = copy;
    *len = r->element[0]->len;
    if (token)
        *token = str_u64(r->element[1]);
    freeReplyObject(r);
    return 0;
}

/* Wait on the release channel, over a second connection (a subscribed
 * connection can run no other command). */
static int redis_wait_release(lease_store *base, const char *key,
                              uint64_t timeout_ms)
{
    redis_store *s = (redis_store *)base;
    int64_t end = lease_clock_ns() + (int64_t)timeout_ms * 1000000;
    int rc;

    if (s->sub == NULL) {
        char chan[96];
        const char *a[2] = { "SUBSCRIBE", chan };

        snprintf(chan, sizeof(chan), "%sreleased", s->prefix);
        if ((s->sub = connect_one(s, &rc)) == NULL)
            return rc;
        if ((rc = simple(s, s->sub, "subscribe", 2, a)) < 0) {
            drop_sub(s);
            return rc;
        }
    }
    /* Bounded by `end`: each pass reads with a socket timeout of the time
     * left, and returns when it runs out. */
    for (;;) {
        int64_t left = (end - lease_clock_ns()) / 1000000;
        void *reply = NULL;
        redisReply *r;
        int match;

        if (left <= 0)
            return LEASE_ETIMEOUT;
        redisSetTimeout(s->sub, tv_ms((uint64_t)left));
        if (redisGetReply(s->sub, &reply) != REDIS_OK) {
            int timed_out = s->sub->err == REDIS_ERR_IO &&
                            (errno == EAGAIN || errno == EWOULDBLOCK);
            drop_sub(s); /* a timed-out read leaves the context unusable */
            if (timed_out)
                return LEASE_ETIMEOUT;
            return lease__seterr(LEASE_ESTORE, "redis wait for release: "
                                 "connection lost");
        }
        r = reply;
        match = r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                r->element[2]->type == REDIS_REPLY_STRING &&
                strcmp(r->element[2]->str, key) == 0;
        freeReplyObject(r);
        if (match)
            return 0;
    }
}

/* ---- grant history --------------------------------------------------------- */

static lease_ended ended_of(const redisReply *r)
{
    static const lease_ended all[] = { LEASE_ENDED_HELD, LEASE_ENDED_RELEASED,
                                       LEASE_ENDED_EXPIRED, LEASE_ENDED_LOST };
    size_t i;

    if (r && r->type == REDIS_REPLY_STRING)
        for (i = 0; i < sizeof(all) / sizeof(all[0]); i++)
            if (strcmp(r->str, lease_ended_name(all[i])) == 0)
                return all[i];
    /* Unknown to this version: it ended somehow, and "held" would claim a
     * lease that the read found gone. */
    return LEASE_ENDED_EXPIRED;
}

static int64_t str_i64(const redisReply *r)
{
    uint64_t v = str_u64(r);

    return v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v;
}

static int redis_history(lease_history_entry *out, size_t *n, lease_store *base,
                         const char *key, size_t max)
{
    redis_store *s = (redis_store *)base;
    char hk[KEYBUF], lk[KEYBUF], mx[24];
    const char *args[3] = { hk, lk, mx };
    redisReply *r;
    size_t i;
    int rc;

    *n = 0;
    key_of(hk, sizeof(hk), s, "", key, ":history");
    key_of(lk, sizeof(lk), s, "", key, ":lease");
    snprintf(mx, sizeof(mx), "%zu", max);
    if ((rc = eval(&r, s, SC_HISTORY, 2, args, NULL, 3, "history")) < 0)
        return rc;
    /* Check the whole reply before filling anything: a malformed one is a
     * store failure, never a short history. */
    if (r->type != REDIS_REPLY_ARRAY || r->elements > max) {
        freeReplyObject(r);
        return lease__seterr(LEASE_ESTORE, "redis history: odd reply");
    }
    for (i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        size_t j;

        if (e->type != REDIS_REPLY_ARRAY || e->elements != 7) {
            freeReplyObject(r);
            return lease__seterr(LEASE_ESTORE, "redis history: odd reply");
        }
        for (j = 0; j < 7; j++)
            if (e->element[j]->type != REDIS_REPLY_STRING) {
                freeReplyObject(r);
                return lease__seterr(LEASE_ESTORE, "redis history: odd reply");
            }
    }
    for (i = 0; i < r->elements; i++) {
        const redisReply *const *f = (const redisReply *const *)r->element[i]->element;
        lease_history_entry *e = &out[i];

        memset(e, 0, sizeof(*e));
        e->token = str_u64(f[0]);
        str_copy(e->owner, sizeof(e->owner), f[1]);
        str_copy(e->label, sizeof(e->label), f[2]);
        e->ttl_ms = str_u64(f[3]);
        e->acquired_ms = str_i64(f[4]);
        e->ended = ended_of(f[5]);
        e->ended_ms = e->ended == LEASE_ENDED_HELD ? 0 : str_i64(f[6]);
    }
    *n = r->elements;
    freeReplyObject(r);
    return 0;
}

static int redis_history_lost(lease_store *base, const char *key,
                              const char *owner, uint64_t token)
{
    redis_store *s = (redis_store *)base;
    char hk[KEYBUF], lk[KEYBUF], tok[24];
    const char *args[4] = { hk, lk, owner, tok };
    redisReply *r;
    int rc;

    key_of(hk, sizeof(hk), s, "", key, ":history");
    key_of(lk, sizeof(lk), s, "", key, ":lease");
    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    if ((rc = eval(&r, s, SC_HISTORY_LOST, 2, args, NULL, 4, "history lost")) < 0)
        return rc;
    /* 1 marked, 0 nothing to mark (pruned, released, another owner): both
     * are success. */
    rc = r->type == REDIS_REPLY_INTEGER
             ? 0
             : lease__seterr(LEASE_ESTORE, "redis history lost: odd reply");
    freeReplyObject(r);
    return rc;
}

static int redis_set_timeout(lease_store *base, uint64_t timeout_ms)
{
    redis_store *s = (redis_store *)base;

    s->timeout_ms = timeout_ms;
    if (s->ctx)
        redisSetTimeout(s->ctx, tv_ms(timeout_ms));
    return 0;
}

/* ---- open and close ------------------------------------------------------ */

static void redis_close(lease_store *base)
{
    redis_store *s = (redis_store *)base;

    drop(s);
    drop_sub(s);
    free(s->user);
    if (s->password) {
        memset(s->password, 0, strlen(s->password));
        free(s->password);
    }
    free(s);
}

static int parse_url(redis_store *s, const lease__url *u)
{
    const char *colon, *v;
    char *end;
    size_t i;

    if (!u->has_authority || u->hosts[0] == '\0' || strchr(u->hosts, ','))
        return lease__seterr(LEASE_EINVALID,
                             "a redis URL names one server: redis://[user:password@]host:port[/db]");
    colon = strrchr(u->hosts, ':');
    if (u->hosts[0] == '[') { /* [::1]:6379 */
        const char *close = strchr(u->hosts, ']');
        if (close == NULL || (size_t)(close - u->hosts - 1) >= sizeof(s->host))
            return lease__seterr(LEASE_EINVALID, "bad host in the redis URL");
        memcpy(s->host, u->hosts + 1, (size_t)(close - u->hosts - 1));
        s->host[close - u->hosts - 1] = '\0';
        colon = close[1] == ':' ? close + 1 : NULL;
    } else {
        size_t n = colon ? (size_t)(colon - u->hosts) : strlen(u->hosts);
        if (n == 0 || n >= sizeof(s->host))
            return lease__seterr(LEASE_EINVALID, "bad host in the redis URL");
        memcpy(s->host, u->hosts, n);
        s->host[n] = '\0';
    }
    s->port = 6379;
    if (colon) {
        long p = strtol(colon + 1, &end, 10);
        if (*end != '\0' || p < 1 || p > 65535)
            return lease__seterr(LEASE_EINVALID, "bad port in the redis URL");
        s->port = (int)p;
    }
    if (u->path[0] && strcmp(u->path, "/") != 0) {
        long db = strtol(u->path + 1, &end, 10);
        if (*end != '\0' || db < 0 || db > 1000000)
            return lease__seterr(LEASE_EINVALID, "redis database must be a number");
        s->db = (int)db;
    }
    if ((u->user && *u->user && !(s->user = strdup(u->user))) ||
        (u->password && !(s->password = strdup(u->password))))
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    lease__strlcpy(s->prefix, "lease:", sizeof(s->prefix));
    for (i = 0; i < u->nparams; i++) {
        const char *name = u->params[i].name;
        v = u->params[i].value;
        if (strcmp(name, "prefix") == 0) {
            if (strlen(v) >= sizeof(s->prefix) || strchr(v, '{') || strchr(v, '}'))
                return lease__seterr(LEASE_EINVALID,
                                     "redis prefix= must be under 64 bytes, without braces");
            lease__strlcpy(s->prefix, v, sizeof(s->prefix));
        } else if (strcmp(name, "wait_replicas") == 0) {
            long n = strtol(v, &end, 10);
            if (*v == '\0' || *end != '\0' || n < 0 || n > 100)
                return lease__seterr(LEASE_EINVALID, "wait_replicas= must be 0..100");
            s->wait_replicas = (int)n;
        } else if (strcmp(name, "wait_timeout") == 0) {
            if (lease_parse_duration(&s->wait_timeout_ms, v) < 0 || s->wait_timeout_ms == 0)
                return lease__seterr(LEASE_EINVALID,
                                     "wait_timeout= must be a duration, e.g. 100ms");
        } else {
            return lease__seterr(LEASE_EINVALID, "unknown redis URL parameter '%s'",
                                 name);
        }
    }
    return 0;
}

static int redis_open(lease_store **out, const char *url, uint64_t timeout_ms)
{
    lease__url u;
    redis_store *s;
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
    if (s->wait_timeout_ms == 0)
        s->wait_timeout_ms = timeout_ms;
    /* Messages during open name the URL: the core sets this field after
     * open returns, so keep a redacted copy until then. */
    s->parent.url_redacted = lease__url_redact(url);
    if (rc == 0)
        rc = ensure(s);
    free(s->parent.url_redacted);
    s->parent.url_redacted = NULL;
    if (rc < 0) {
        redis_close(&s->parent);
        return rc;
    }
    *out = &s->parent;
    return 0;
}

static const char *const redis_schemes[] = { "redis", NULL };

const lease_backend lease__redis_backend = {
    .version = LEASE_BACKEND_VERSION,
    .name = "redis",
    .schemes = redis_schemes,
    .features = LEASE_FEATURE_NOTIFY,
    .open = redis_open,
    .close = redis_close,
    .acquire = redis_acquire,
    .renew = redis_renew,
    .release = redis_release,
    .inspect = redis_inspect,
    .list = redis_list,
    .fence_advance = redis_fence_advance,
    .fence_mark = redis_fence_mark,
    .guarded_put = redis_guarded_put,
    .data_get = redis_data_get,
    .guarded_txn = NULL,
    .wait_release = redis_wait_release,
    .renew_many = NULL,
    .set_timeout = redis_set_timeout,
    .advisory_txn = NULL,
    .history = redis_history,
    .history_lost = redis_history_lost,
};
