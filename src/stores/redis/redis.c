/*
 * stores/redis/redis.c - Redis, through hiredis: leases and tokens in server-side
 * scripts.
 *
 * URL: redis://[user:password@]host:port[/db][?param=value...]
 *   prefix=TEXT          key prefix (default "lease:")
 *   wait_replicas=N      after each acquisition, WAIT for N replicas
 *   wait_timeout=DUR     how long WAIT may take (default, and at most: what
 *                        is left of the call timeout)
 *   password_file=PATH   the password, from a file only its owner may read
 *                        (mode 0600 or stricter; one trailing newline is
 *                        dropped), so that it stays out of argv
 *   tokens=clock|counter how a new grant's token is made. clock (the
 *                        default): max(last token + 1, the server's clock
 *                        in microseconds), so that a promoted replica that
 *                        lost the last grants and their counter still
 *                        issues newer tokens; a clock more than a second
 *                        behind the last token is logged ("clock_behind")
 *                        and counted. counter: last token + 1. Both keep
 *                        the last token in the same counter key, so
 *                        handles of either mode can share a key.
 * Every parameter is checked before any connection is tried (EINVALID).
 *
 * Each call (connect, AUTH, SELECT, script loads, the command and its whole
 * reply) is bounded by the handle's timeout as a whole: the sockets are
 * non-blocking and every wait is a poll() for the time left (see
 * redis_begin), the name lookup and the connect included (the store makes
 * its sockets itself, lease__net_connect, and hands them to hiredis with
 * redisConnectFd: close-on-exec from socket() on). Every reply
 * is range-checked before use (see redis_num); a malformed one is
 * LEASE_ESTORE naming what was wrong.
 *
 * Key layout (K is the lease key, R a fenced resource, N a data name):
 *   <prefix>{K}:token    the key's record: one list, newest first, that is
 *                        the lease, the token counter and the grant history
 *                        (lease/history.h) at once. A grant is one item
 *                        "TOKEN OWNER TTL0 ACQUIRED_MS LIFE_MS TTL LABEL";
 *                        an end item above it says it was released or lost
 *                        (lib.lua has the grammar). The newest grant is the
 *                        lease while it has no end item and the server's
 *                        clock (TIME) is before its expiry; the newest
 *                        token is the counter (see tokens=). Never expired;
 *                        trimmed in batches to LEASE_HISTORY_KEEP grants or
 *                        a few more. One key and one write command per
 *                        acquire, renew or release: Redis 7 writes each
 *                        write command of a script to the AOF (and wraps
 *                        several in MULTI/EXEC), so that is what a grant
 *                        costs with appendfsync always. It ends in :token,
 *                        which list's "*:token" scan looks for.
 *   <prefix>{K}:lease    the layout of 0.1, with :token then a string (the
 *   <prefix>{K}:history  counter), :lease a hash with its own expiry and
 *                        :history cjson entries: every script gets them as
 *                        KEYS too, and the first that touches such a key
 *                        rewrites it into the record (migrate in lib.lua),
 *                        tokens going on from the counter.
 *   <prefix>fence:{R}    high-water mark of a resource
 *   <prefix>data:{N}     hash value/token of a guarded value
 *   channel <prefix>released   a message with K on every release
 * The {…} hash tags keep a key's keys in one slot.
 *
 * Each operation is one script, loaded once per connection and called by
 * hash (EVALSHA), loaded again on NOSCRIPT; every value travels as KEYS or
 * ARGV. The scripts are Lua files in src/stores/redis/, one per operation
 * (acquire.lua, renew.lua, ...; each says its KEYS, ARGV and reply), with
 * the helpers they share in lib.lua, which is sent in front of each; the
 * build embeds them as LEASE_REDIS_* (redis_text.h). To run one alone:
 *   cat lib.lua fence.lua > /tmp/f.lua && redis-cli --eval /tmp/f.lua KEY , ARG
 * renew_many (a session's batch) is no script of its own: it pipelines one
 * renew.lua call per grant, so each stays atomic on its own {K} keys.
 * The history is written by the same scripts that grant, extend and
 * end a lease, so no grant can happen without its entry. Tokens never go
 * backwards across a restart only when the server persists every write
 * before answering: appendonly yes with appendfsync always. The store
 * checks this on connect and logs a warning when it is not so. Across a
 * failover, asynchronous replication can lose grants (see docs/stores.md);
 * wait_replicas narrows that window.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>
#include <hiredis/hiredis.h>

#include "redis_text.h"
#include "stores/store_int.h"

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

/* A holder's renew and release write once (LSET, a few bytes of LPUSH)
 * and must go on when the server is out of memory: without the flag Redis
 * refuses a script whose first write is such a command, and every holder
 * would lose its lease at once. New grants stay refused then. */
#define ALLOW_OOM "#!lua flags=allow-oom\n"

/* The scripts, one file each in src/stores/redis/ (see the top of this
 * file), each sent with lib.lua's helpers in front. */
static const char *const scripts[SC_COUNT] = {
    [SC_ACQUIRE] = LEASE_REDIS_LIB LEASE_REDIS_ACQUIRE,
    [SC_RENEW] = ALLOW_OOM LEASE_REDIS_LIB LEASE_REDIS_RENEW,
    [SC_RELEASE] = ALLOW_OOM LEASE_REDIS_LIB LEASE_REDIS_RELEASE,
    [SC_INSPECT] = LEASE_REDIS_LIB LEASE_REDIS_INSPECT,
    [SC_FENCE] = LEASE_REDIS_LIB LEASE_REDIS_FENCE,
    [SC_PUT] = LEASE_REDIS_LIB LEASE_REDIS_PUT,
    [SC_HISTORY] = LEASE_REDIS_LIB LEASE_REDIS_HISTORY,
    [SC_HISTORY_LOST] = LEASE_REDIS_LIB LEASE_REDIS_HISTORY_LOST,
};

/* Commands to send at once (one, or a pipeline), in the wire format. */
typedef struct {
    char *buf;
    size_t len, cap;
} redis_out;

/* What one reply has cost so far (see redis_budget_install). */
typedef struct {
    redisReplyObjectFunctions fn;          /* ours, forwarding to... */
    const redisReplyObjectFunctions *base; /* ...hiredis's own */
    size_t objects, bytes;
    int over;                              /* refused one past the budget */
} redis_budget;

typedef struct {
    lease_store parent;
    redisContext *ctx;      /* commands */
    redisContext *sub;      /* pub/sub, opened by the first wait */
    redis_budget ctx_budget, sub_budget;
    int sub_dirty;          /* sub may hold part of a message */
    char host[256];
    int port;
    char *user, *password;  /* never printed */
    int password_from_file; /* ?password_file= */
    int db;
    char prefix[64];
    char chan[80];          /* the release channel, <prefix>released */
    int wait_replicas;
    uint64_t wait_timeout_ms;
    int tokens;             /* LEASE__TOKENS_CLOCK or _COUNTER (?tokens=) */
    char sha[SC_COUNT][41];
    int64_t deadline_ns;    /* of the call in progress (lease_clock_ns) */
    redis_out out;          /* the command being sent, kept for the next */
} redis_store;

static _Atomic int durability_warned;

/* ---- connection ------------------------------------------------------- */

static int redis_odd(const char *what, const char *detail)
{
    return lease__seterr(LEASE_ESTORE, "redis %s: malformed answer: %s", what,
                         detail);
}

/*
 * Every slot is one store call, bounded as a whole by the handle's timeout:
 * the slot sets the deadline once (redis_begin), and connect, AUTH, SELECT,
 * script loads, NOSCRIPT reloads, the command and every byte of the reply
 * share it. The sockets are non-blocking and each wait is a poll() for the
 * time left: hiredis's own socket timeouts bound each read(), so a server
 * trickling one byte at a time could stretch a call without end.
 */
static void redis_begin(redis_store *s)
{
    s->deadline_ns = lease_clock_ns() + (int64_t)s->parent.timeout_ms * 1000000;
}

static int64_t redis_left_ms(const redis_store *s)
{
    int64_t left = s->deadline_ns - lease_clock_ns();

    return left > 0 ? (left + 999999) / 1000000 : 0;
}

static void redis_drop(redis_store *s)
{
    if (s->ctx)
        redisFree(s->ctx);
    s->ctx = NULL;
}

static void redis_drop_sub(redis_store *s)
{
    if (s->sub)
        redisFree(s->sub);
    s->sub = NULL;
    s->sub_dirty = 0;
}

/* Server-sent text for a message: at most `size` - 1 bytes, control bytes
 * as '?', and the password (a hostile or odd server may echo what it was
 * sent) as "***". */
static const char *redis_server_text(char *buf, size_t size,
                                     const redis_store *s, const char *text)
{
    size_t n = 0, plen = s->password ? strlen(s->password) : 0;

    for (; text && *text && n + 4 < size; text++) {
        if (plen && strncmp(text, s->password, plen) == 0) {
            memcpy(buf + n, "***", 3);
            n += 3;
            text += plen - 1;
            continue;
        }
        buf[n++] = (unsigned char)*text < 0x20 || *text == 0x7f ? '?' : *text;
    }
    buf[n] = '\0';
    return buf;
}

/* Drop a context after an I/O error, a timeout or a partly read reply:
 * it is unusable, and the next call reconnects. A context still being
 * connected is not the handle's yet: connect_one frees it. */
static void redis_forget(redis_store *s, redisContext *c)
{
    if (c != NULL && c == s->ctx)
        redis_drop(s);
    else if (c != NULL && c == s->sub)
        redis_drop_sub(s);
}

static int redis_fail_ctx(redis_store *s, redisContext *c, const char *what)
{
    char text[256];
    int rc = lease__seterr(LEASE_ESTORE, "redis %s on %s: %s", what,
                           s->parent.url_redacted,
                           c && c->errstr[0]
                               ? redis_server_text(text, sizeof(text), s, c->errstr)
                               : "connection lost");

    redis_forget(s, c);
    return rc;
}

static int redis_timed_out(redis_store *s, redisContext *c, const char *what)
{
    int rc = lease__seterr(LEASE_ESTORE,
                           "redis %s on %s: no complete answer within the "
                           "%llu ms timeout: the outcome is uncertain",
                           what,
                           s->parent.url_redacted,
                           (unsigned long long)s->parent.timeout_ms);

    redis_forget(s, c);
    return rc;
}

/* Wait until c's socket is ready for `events`, at most until the deadline. */
static int redis_poll(redis_store *s, redisContext *c, short events,
                      const char *what)
{
    /* Bounded: each pass returns, or poll() was interrupted and the time
     * left shrinks until it is 0. */
    for (;;) {
        int64_t left = redis_left_ms(s);
        struct pollfd p;
        int n;

        if (left <= 0)
            return redis_timed_out(s, c, what);
        p.fd = c->fd;
        p.events = events;
        p.revents = 0;
        n = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
        if (n > 0)
            return 0; /* also on POLLERR/POLLHUP: the read or write says why */
        if (n < 0 && errno != EINTR)
            return redis_fail_ctx(s, c, what);
    }
}

/* Replies larger than this are refused: the largest a store call expects is
 * a guarded value (64 MiB) with its framing. */
#define REDIS_REPLY_BYTES_MAX (LEASE__VALUE_MAX + ((size_t)1 << 20))

/* Arrays longer than this are refused: the longest a call expects is a
 * SCAN batch (COUNT 500) or a history (LEASE_HISTORY_KEEP entries). */
#define REDIS_ARRAY_MAX (1u << 20)

/*
 * redis_check_headers (below) sees only what is buffered and not parsed
 * yet; what hiredis has parsed it keeps as objects, one per element, with
 * no limit of its own on their number or total size: an array of a
 * million 64 MiB strings, each of them acceptable, would take gigabytes.
 * So hiredis's reply functions are wrapped, per connection, to count what
 * one reply has made, and to refuse an object past REDIS_ARRAY_MAX objects
 * or REDIS_REPLY_BYTES_MAX bytes (hiredis then fails the read, and the
 * connection is dropped). The count starts again with each reply.
 */
static int budget_take(const redisReadTask *t, size_t bytes)
{
    redis_budget *b = t->privdata;

    if (b->over || b->objects >= REDIS_ARRAY_MAX || bytes > REDIS_REPLY_BYTES_MAX - b->bytes) {
        b->over = 1;
        return -1;
    }
    b->objects++;
    b->bytes += bytes;
    return 0;
}

static void *budget_string(const redisReadTask *t, char *str, size_t len)
{
    redis_budget *b = t->privdata;

    return budget_take(t, len) < 0 ? NULL : b->base->createString(t, str, len);
}

/* hiredis 1 counts elements in a size_t, and has doubles and booleans
 * (RESP3): every slot it has is wrapped, since one left NULL makes it
 * hand back a placeholder pointer instead of an object. */
#if HIREDIS_MAJOR >= 1
static void *budget_array(const redisReadTask *t, size_t elements)
{
    redis_budget *b = t->privdata;
    size_t n = elements;
#else
static void *budget_array(const redisReadTask *t, int elements)
{
    redis_budget *b = t->privdata;
    size_t n = elements > 0 ? (size_t)elements : 0;
#endif

    return budget_take(t, n * sizeof(void *)) < 0 ? NULL : b->base->createArray(t, elements);
}

static void *budget_integer(const redisReadTask *t, long long value)
{
    redis_budget *b = t->privdata;

    return budget_take(t, 0) < 0 ? NULL : b->base->createInteger(t, value);
}

static void *budget_nil(const redisReadTask *t)
{
    redis_budget *b = t->privdata;

    return budget_take(t, 0) < 0 ? NULL : b->base->createNil(t);
}

#if HIREDIS_MAJOR >= 1
static void *budget_double(const redisReadTask *t, double value, char *str, size_t len)
{
    redis_budget *b = t->privdata;

    return budget_take(t, len) < 0 ? NULL : b->base->createDouble(t, value, str, len);
}

static void *budget_bool(const redisReadTask *t, int value)
{
    redis_budget *b = t->privdata;

    return budget_take(t, 0) < 0 ? NULL : b->base->createBool(t, value);
}
#endif

static void budget_reset(redisContext *c)
{
    redis_budget *b = c->reader->privdata;

    if (b != NULL) {
        b->objects = b->bytes = 0;
        b->over = 0;
    }
}

/* On a new connection, before its first reply (AUTH's). */
static void redis_budget_install(redisContext *c, redis_budget *b)
{
    memset(b, 0, sizeof(*b));
    b->base = c->reader->fn;
    if (b->base == NULL)
        return; /* no objects made: nothing to count */
    b->fn.createString = budget_string;
    b->fn.createArray = budget_array;
    b->fn.createInteger = budget_integer;
    b->fn.createNil = budget_nil;
#if HIREDIS_MAJOR >= 1
    b->fn.createDouble = b->base->createDouble ? budget_double : NULL;
    b->fn.createBool = b->base->createBool ? budget_bool : NULL;
#endif
    b->fn.freeObject = b->base->freeObject;
    c->reader->fn = &b->fn;
    c->reader->privdata = b;
}

/* hiredis failed to parse: a reply past the budget says so, anything else
 * is the context's error. */
static int redis_parse_failed(redis_store *s, redisContext *c, const char *what)
{
    redis_budget *b = c->reader->privdata;
    int rc;

    if (b == NULL || !b->over)
        return redis_fail_ctx(s, c, what);
    rc = lease__seterr(LEASE_ESTORE, "redis %s: malformed answer: a reply of more than "
                       "%u objects or %zu bytes, more than the store ever asks for",
                       what, REDIS_ARRAY_MAX, REDIS_REPLY_BYTES_MAX);
    redis_forget(s, c);
    return rc;
}

/*
 * The type of the item hiredis is in the middle of, as its type byte ('$',
 * '*', or '+' for any other line), or 0 when it is at the start of one:
 * hiredis consumes an item's type byte as soon as it has come, and the rest
 * of the header only once its line (and, for a string, its content) is
 * whole, so its cursor can sit just after a type byte.
 */
static char redis_pending_type(const redisReader *r)
{
    const redisReadTask *t;

    if (r->ridx < 0)
        return 0;
#if HIREDIS_MAJOR >= 1
    if (r->task == NULL || r->ridx >= r->tasks || r->task[r->ridx] == NULL)
        return 0;
    t = r->task[r->ridx];
#else
    if (r->ridx >= (int)(sizeof(r->rstack) / sizeof(r->rstack[0])))
        return 0;
    t = &r->rstack[r->ridx];
#endif
    if (t->type < 0)
        return 0;
    return t->type == REDIS_REPLY_STRING ? '$' : t->type == REDIS_REPLY_ARRAY ? '*' : '+';
}

/*
 * hiredis allocates an array for the length a header announces before any
 * element has come, and keeps no limit of its own: a server could ask it for
 * gigabytes with a few bytes. So the headers of what is buffered and not yet
 * parsed are checked first; the first may have lost its type byte to
 * hiredis already (redis_pending_type). 0 when they are sound so far.
 */
/* The first "\r\n" in [p, end), where hiredis ends a line (a bare "\n"
 * does not); NULL when it is still to come. */
static const char *redis_crlf(const char *p, const char *end)
{
    /* Bounded: each pass moves past one '\r'. */
    while (p < end && (p = memchr(p, '\r', (size_t)(end - p))) != NULL) {
        if (p + 1 >= end)
            return NULL;
        if (p[1] == '\n')
            return p;
        p++;
    }
    return NULL;
}

static int redis_check_headers(redis_store *s, redisContext *c, const char *what)
{
    const char *p = c->reader->buf + c->reader->pos;
    const char *end = c->reader->buf + c->reader->len;
    char type = redis_pending_type(c->reader);
    int rc;

    /* Bounded: every pass moves p forward by a line at least. */
    while (p < end) {
        const char *cr = redis_crlf(p, end), *nl;
        const char *digits;
        char num[24];
        size_t n;
        long long v = 0;

        if (cr == NULL)
            return 0; /* the rest of the header is still to come */
        nl = cr + 1;
        if (type == 0 && p == cr)
            break; /* a line with no type: not what hiredis takes */
        if (type == 0)
            type = *p++;
        digits = p;
        /* The bytes between the type and the line's end. */
        n = (size_t)(cr - digits);
        if ((type == '*' || type == '$') && n >= sizeof(num))
            break; /* no length of a sane reply is that long */
        memcpy(num, digits, n < sizeof(num) ? n : 0);
        num[n < sizeof(num) ? n : 0] = '\0';
        if (type == '*' || type == '$')
            v = strtoll(num, NULL, 10);
        if ((type == '*' && v > (long long)REDIS_ARRAY_MAX) ||
            (type == '$' && v > (long long)REDIS_REPLY_BYTES_MAX))
            break;
        if (type == '$' && v >= 0) {
            if ((size_t)(end - nl - 1) < (size_t)v + 2)
                return 0; /* the payload is still to come */
            nl += v + 2;
        }
        p = nl + 1;
        type = 0;
    }
    if (p >= end)
        return 0;
    rc = redis_odd(what, type == '*' ? "an array longer than the store ever sends"
                                     : "a string longer than the store ever sends");
    redis_forget(s, c);
    return rc;
}

/*
 * Commands go out through send() with MSG_NOSIGNAL, not hiredis's
 * redisBufferWrite: its write(2) raises SIGPIPE on a connection the server
 * has closed (an idle timeout, a restart), which would kill the
 * application, and keeping that off around write(2) took four signal-mask
 * system calls per command. Here a command is one system call, the socket
 * polled for room only when it is full; EPIPE is an error like any other.
 * hiredis only parses the replies (redis_queue formats the commands); its
 * own output buffer stays empty.
 */
static int redis_send(redis_store *s, redisContext *c, const char *buf,
                      size_t len, const char *what)
{
    /* Bounded: every pass sends bytes, or waits in redis_poll, which ends
     * at the deadline. */
    while (len > 0) {
        ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL);
        int rc;

        if (n > 0) {
            buf += n;
            len -= (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if ((rc = redis_poll(s, c, POLLOUT, what)) < 0)
                return rc;
        } else {
            rc = lease__seterr(LEASE_ESTORE, "redis %s on %s: %s", what,
                               s->parent.url_redacted,
                               n < 0 ? strerror(errno) : "connection lost");
            redis_forget(s, c);
            return rc;
        }
    }
    return 0;
}

/* v in decimal at buf (21 bytes at least), NUL-terminated; returns its
 * length. The numbers of the hot path, without snprintf's parsing. */
static size_t dec_u64(char *buf, uint64_t v)
{
    char digits[20];
    size_t k = 0, i = 0;

    do {
        digits[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    while (k > 0)
        buf[i++] = digits[--k];
    buf[i] = '\0';
    return i;
}

/* "<type><n>\r\n" at p; returns the bytes written (at most 23). */
static size_t resp_head(char *p, char type, size_t n)
{
    size_t i = 1 + dec_u64(p + 1, n);

    p[0] = type;
    p[i++] = '\r';
    p[i++] = '\n';
    return i;
}

/* Append one command with binary-safe arguments (lens NULL: C strings) to
 * o in the protocol: "*argc", then "$len" and the bytes of each argument.
 * Written here rather than by hiredis's redisFormatCommandArgv, which
 * prints every length with sprintf: on the hot path that was most of the
 * client's own work per command. LEASE_ENOMEM when there is no memory. */
static int redis_queue(redis_out *o, int argc, const char **argv,
                       const size_t *lens)
{
    size_t need = 24, cap, len;
    char *p;
    int i;

    for (i = 0; i < argc; i++)
        need += (lens ? lens[i] : strlen(argv[i])) + 26;
    if (o->len + need > o->cap) {
        char *b;

        for (cap = o->cap ? o->cap : 512; cap < o->len + need; cap *= 2)
            ;
        if ((b = realloc(o->buf, cap)) == NULL)
            return lease__seterr(LEASE_ENOMEM, "out of memory");
        o->buf = b;
        o->cap = cap;
    }
    p = o->buf + o->len;
    p += resp_head(p, '*', (size_t)argc);
    for (i = 0; i < argc; i++) {
        len = lens ? lens[i] : strlen(argv[i]);
        p += resp_head(p, '$', len);
        memcpy(p, argv[i], len);
        p += len;
        *p++ = '\r';
        *p++ = '\n';
    }
    o->len = (size_t)(p - o->buf);
    return 0;
}

/* Send o's commands on c and empty o; a buffer grown past 64 KiB (a large
 * guarded value, a long pipeline) is given back rather than kept. */
static int redis_flush(redis_store *s, redisContext *c, redis_out *o,
                       const char *what)
{
    int rc = redis_send(s, c, o->buf, o->len, what);

    /* Wiped once sent: AUTH's password goes through this buffer, which is
     * kept for the next command (and freed or reallocated later). */
    if (o->len > 0)
        memset(o->buf, 0, o->len);
    o->len = 0;
    if (o->cap > ((size_t)64 << 10)) {
        free(o->buf);
        o->buf = NULL;
        o->cap = 0;
    }
    return rc;
}

/* Read one complete reply from c (to be freed): every command was sent
 * before (redis_send), so this only reads. */
static int redis_read(redisReply **out, redis_store *s, redisContext *c,
                      const char *what)
{
    void *reply = NULL;
    int rc;

    *out = NULL;
    /* Bounded by the deadline: every pass waits in redis_poll. */
    for (;;) {
        if ((rc = redis_check_headers(s, c, what)) < 0)
            return rc;
        if (redisGetReplyFromReader(c, &reply) != REDIS_OK)
            return redis_parse_failed(s, c, what);
        if (reply != NULL) {
            budget_reset(c);
            break;
        }
        if (c->reader->len > REDIS_REPLY_BYTES_MAX) {
            rc = lease__seterr(LEASE_ESTORE, "redis %s: reply larger than %zu bytes",
                               what, REDIS_REPLY_BYTES_MAX);
            redis_forget(s, c);
            return rc;
        }
        if ((rc = redis_poll(s, c, POLLIN, what)) < 0)
            return rc;
        if (redisBufferRead(c) != REDIS_OK)
            return redis_fail_ctx(s, c, what);
    }
    *out = reply;
    return 0;
}

/* Run a command with binary-safe arguments; *out must be freed. */
static int redis_call(redisReply **out, redis_store *s, redisContext *c, int argc,
                      const char **argv, const size_t *lens, const char *what)
{
    redisReply *r;
    int rc;

    *out = NULL;
    s->out.len = 0;
    if ((rc = redis_queue(&s->out, argc, argv, lens)) < 0 ||
        (rc = redis_flush(s, c, &s->out, what)) < 0 ||
        (rc = redis_read(&r, s, c, what)) < 0)
        return rc;
    if (r->type == REDIS_REPLY_ERROR) {
        char text[256];

        rc = lease__seterr(LEASE_ESTORE, "redis %s: %s", what,
                           redis_server_text(text, sizeof(text), s, r->str));
        *out = r; /* the caller may look at NOSCRIPT */
        return rc;
    }
    *out = r;
    return 0;
}

static int redis_simple(redis_store *s, redisContext *c, const char *what, int argc,
                        const char **argv)
{
    redisReply *r;
    int rc = redis_call(&r, s, c, argc, argv, NULL, what);

    freeReplyObject(r);
    return rc;
}

/*
 * The socket is ours (lease__net_connect): close-on-exec and non-blocking
 * from socket() on, where hiredis's own connect makes it without
 * close-on-exec and resolves the name with no bound. hiredis takes it as a
 * connected, blocking context; clear REDIS_BLOCK, for the polls of
 * redis_send and redis_read (hiredis treats EAGAIN as "no data yet" only
 * without it).
 */
static redisContext *redis_context(redis_store *s, int *rc)
{
    redisContext *c;
    int fd;

    if ((*rc = lease__net_connect(&fd, &s->parent, s->host, s->port,
                                  s->deadline_ns)) < 0)
        return NULL;
    if ((c = redisConnectFd(fd)) == NULL) {
        close(fd);
        *rc = lease__seterr(LEASE_ENOMEM, "out of memory");
        return NULL;
    }
    c->flags &= ~REDIS_BLOCK;
    return c;
}

static int redis_auth(redis_store *s, redisContext *c)
{
    const char *a3[3] = { "AUTH", s->user, s->password };
    const char *a2[2] = { "AUTH", s->password };
    redisReply *r;
    int rc;

    rc = s->user && *s->user ? redis_call(&r, s, c, 3, a3, NULL, "AUTH")
                             : redis_call(&r, s, c, 2, a2, NULL, "AUTH");
    /* The server's refusal: say only that authentication failed, its text
     * could repeat what it was sent. */
    if (rc < 0 && r != NULL)
        rc = lease__seterr(LEASE_ESTORE, "redis %s: authentication failed",
                           s->parent.url_redacted);
    freeReplyObject(r);
    return rc;
}

static redisContext *connect_one(redis_store *s, redis_budget *budget, int *rc)
{
    redisContext *c;
    char db[16];

    if (redis_left_ms(s) <= 0) {
        *rc = redis_timed_out(s, NULL, "connect");
        return NULL;
    }
    if ((c = redis_context(s, rc)) == NULL)
        return NULL;
    redis_budget_install(c, budget);
    redisEnableKeepAlive(c);
    if (s->password && (*rc = redis_auth(s, c)) < 0) {
        redisFree(c);
        return NULL;
    }
    if (s->db) {
        const char *a[2] = { "SELECT", db };
        snprintf(db, sizeof(db), "%d", s->db);
        if ((*rc = redis_simple(s, c, "SELECT", 2, a)) < 0) {
            redisFree(c);
            return NULL;
        }
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

        if ((rc = redis_call(&r, s, s->ctx, 3, a, NULL, "script load")) < 0) {
            freeReplyObject(r);
            return rc;
        }
        if (r->type != REDIS_REPLY_STRING || r->len != 40 ||
            strspn(r->str, "0123456789abcdefABCDEF") != 40) {
            freeReplyObject(r);
            return redis_odd("script load", "not a 40-digit SHA1");
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

    if (durability_warned || redis_call(&r, s, s->ctx, 3, a, NULL, "config get") < 0) {
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

static int redis_ensure(redis_store *s)
{
    int rc;

    if (s->ctx)
        return 0;
    if ((s->ctx = connect_one(s, &s->ctx_budget, &rc)) == NULL)
        return rc;
    if ((rc = load_scripts(s)) < 0) {
        redis_drop(s);
        return rc;
    }
    check_durability(s);
    if (s->ctx == NULL) /* the connection dropped during the check */
        return LEASE_ESTORE;
    return 0;
}

/* EVALSHA, the script, the key count, then KEYS and ARGV: the most any
 * script takes is 8 (acquire). */
#define EVAL_ARGV_MAX 12

/* The command line of EVALSHA <script> <nkeys> args... into argv/lv;
 * `nk` (>= 21 bytes) holds the key count's text. Returns argc. Shared by
 * redis_eval and the pipelined renewals, so both send the same command. */
static int eval_argv(const char **argv, size_t *lv, char *nk,
                     const redis_store *s, int which, int nkeys,
                     const char **args, const size_t *lens, int nargs)
{
    int i;

    dec_u64(nk, (uint64_t)nkeys);
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
    return 3 + nargs;
}

/* The server lost its scripts (a restart, a failover, SCRIPT FLUSH). */
static int redis_noscript(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && r->str &&
           strncmp(r->str, "NOSCRIPT", 8) == 0;
}

/* EVALSHA, reloading the scripts once if the server forgot them. */
static int redis_eval(redisReply **out, redis_store *s, int which, int nkeys,
                      const char **args, const size_t *lens, int nargs,
                      const char *what)
{
    const char *argv[EVAL_ARGV_MAX];
    size_t lv[EVAL_ARGV_MAX];
    char nk[24];
    int argc, rc, attempt;

    *out = NULL;
    for (attempt = 0; attempt < 2; attempt++) {
        redisReply *r;

        if ((rc = redis_ensure(s)) < 0)
            return rc;
        argc = eval_argv(argv, lv, nk, s, which, nkeys, args, lens, nargs);
        rc = redis_call(&r, s, s->ctx, argc, argv, lv, what);
        if (rc == 0) {
            *out = r;
            return 0;
        }
        if (redis_noscript(r) && attempt == 0) {
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

/* <prefix><kind>{name}<suffix>, binary-safe for every byte but NUL, cut
 * to size - 1 bytes (KEYBUF holds the longest). Copied part by part:
 * snprintf's format parsing, three keys per call, was a fifth of the
 * client's own work on the hot path. */
static void key_of(char *out, size_t size, const redis_store *s,
                   const char *kind, const char *name, const char *suffix)
{
    const char *part[6] = { s->prefix, kind, "{", name, "}", suffix };
    size_t n = 0, i, len;

    for (i = 0; i < 6; i++) {
        len = strlen(part[i]);
        if (len > size - 1 - n)
            len = size - 1 - n;
        memcpy(out + n, part[i], len);
        n += len;
    }
    out[n] = '\0';
}

#define KEYBUF (64 + 16 + LEASE_KEY_MAX + 16)

/* The first three KEYS of every lease script: the key's record
 * (<prefix>{K}:token), then the old layout's lease hash and history, which
 * the scripts migrate from on first touch (see lib.lua). */
typedef struct {
    char ck[KEYBUF], lk[KEYBUF], hk[KEYBUF];
} record_keys;

static void record_keys_of(record_keys *k, const redis_store *s,
                           const char *key)
{
    key_of(k->ck, sizeof(k->ck), s, "", key, ":token");
    key_of(k->lk, sizeof(k->lk), s, "", key, ":lease");
    key_of(k->hk, sizeof(k->hk), s, "", key, ":history");
}

/* What the store answers is input too: every number and string is checked
 * before use, and a reply of another shape is LEASE_ESTORE naming what was
 * wrong, never a default value, EBUSY, ELOST or success. Here: a decimal
 * string (or integer) reply within [min, max] into *out; -1 if it is
 * anything else (sign, blanks, overflow, another type). */
static int redis_num(uint64_t *out, const redisReply *r, uint64_t min,
                     uint64_t max)
{
    uint64_t v = 0;
    size_t i;

    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_INTEGER) {
        if (r->integer < 0)
            return -1;
        v = (uint64_t)r->integer;
    } else if (r->type == REDIS_REPLY_STRING) {
        if (r->len == 0 || r->len > 20)
            return -1;
        for (i = 0; i < r->len; i++) {
            unsigned d = (unsigned)((unsigned char)r->str[i] - '0');
            if (d > 9 || v > (UINT64_MAX - d) / 10)
                return -1;
            v = v * 10 + d;
        }
    } else {
        return -1;
    }
    if (v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/* A token or a fencing mark: a number lease__token_ok() accepts into
 * *out; -1 (and *out untouched) otherwise. */
static int redis_token(uint64_t *out, const redisReply *r)
{
    uint64_t v;

    if (redis_num(&v, r, 0, UINT64_MAX) < 0 || !lease__token_ok(v))
        return -1;
    *out = v;
    return 0;
}

/* A string reply that fits dst (with its NUL) and holds no NUL; -1 else. */
static int redis_str(char *dst, size_t size, const redisReply *r)
{
    if (r == NULL || r->type != REDIS_REPLY_STRING || r->len >= size ||
        memchr(r->str, '\0', r->len) != NULL)
        return -1;
    memcpy(dst, r->str, r->len);
    dst[r->len] = '\0';
    return 0;
}

/* An array reply of exactly n elements, those from index `first` on
 * strings; -1 otherwise. */
static int redis_array(const redisReply *r, size_t n, size_t first)
{
    size_t i;

    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != n)
        return -1;
    for (i = 0; i < n; i++)
        if (r->element[i] == NULL ||
            (i >= first && r->element[i]->type != REDIS_REPLY_STRING))
            return -1;
    return 0;
}

/* The 0/1 an integer reply must be; -1 for anything else. */
static int redis_flag(const redisReply *r)
{
    if (r == NULL || r->type != REDIS_REPLY_INTEGER ||
        (r->integer != 0 && r->integer != 1))
        return -1;
    return (int)r->integer;
}

/* The holder of an unexpired lease, from owner, label, token, pttl and ttl
 * replies; -1 with the message set when one is out of range. */
static int redis_holder(lease_info *h, const char *what,
                        const redisReply *const *f)
{
    uint64_t pttl;

    if (redis_str(h->owner, sizeof(h->owner), f[0]) < 0 ||
        !lease_owner_valid(h->owner))
        return redis_odd(what, "the holder's owner is not a UUID");
    if (redis_str(h->label, sizeof(h->label), f[1]) < 0)
        return redis_odd(what, "the holder's label is not text of at most 255 bytes");
    if (redis_token(&h->token, f[2]) < 0)
        return redis_odd(what, "the holder's token is not 1 .. 2^63-1");
    if (redis_num(&h->ttl_ms, f[4], 1, LEASE__MS_MAX) < 0)
        return redis_odd(what, "the lease's ttl is out of range");
    /* Redis says -1 for a key without expiry: a lease that never ends. */
    if (redis_num(&pttl, f[3], 0, h->ttl_ms) < 0)
        return redis_odd(what, "the lease's remaining time is not 0 .. its ttl");
    h->remaining_ms = pttl;
    h->held = 1;
    return 0;
}

/* ---- operations ------------------------------------------------------------ */

/* The WAIT timeout: what the URL asks, but within the call's deadline, with
 * a margin for the reply to arrive before it. */
static uint64_t redis_wait_ms(const redis_store *s)
{
    int64_t left = redis_left_ms(s);
    uint64_t cap = left > 4 ? (uint64_t)(left - left / 4) : 1;

    return s->wait_timeout_ms < cap ? s->wait_timeout_ms : cap;
}

/* WAIT for the replicas after a grant of `token` to `owner`. Too few is
 * ESTORE whose message names the owner and the token: the caller (a
 * command-line user with a generated owner, too) needs the owner to retry
 * safely, and the token to recognise the grant it gets back. */
static int wait_for_replicas(redis_store *s, const char *owner, uint64_t token)
{
    char n[16], ms[24], err[LEASE__ERRMSG_SIZE];
    const char *a[3] = { "WAIT", n, ms };
    redisReply *r;
    int rc;

    snprintf(n, sizeof(n), "%d", s->wait_replicas);
    snprintf(ms, sizeof(ms), "%llu", (unsigned long long)redis_wait_ms(s));
    if ((rc = redis_call(&r, s, s->ctx, 3, a, NULL, "wait")) < 0) {
        freeReplyObject(r);
        /* The grant was made before the WAIT failed: as uncertain as too
         * few replicas, and the retry needs the same owner. */
        lease__strlcpy(err, lease_errmsg(), sizeof(err));
        return lease__seterr(rc, "token %llu granted to owner %s on the "
                             "primary, then %s: ownership is uncertain "
                             "(acquiring again with this owner is safe)",
                             (unsigned long long)token, owner, err);
    }
    rc = r->type == REDIS_REPLY_INTEGER && r->integer >= s->wait_replicas
             ? 0
             : lease__seterr(LEASE_ESTORE,
                             "token %llu granted to owner %s on the primary, "
                             "but only %lld of %d replicas acknowledged it in "
                             "time: ownership is uncertain (acquiring again "
                             "with this owner is safe: the same token while "
                             "the grant lasts)",
                             (unsigned long long)token, owner,
                             r->type == REDIS_REPLY_INTEGER ? r->integer : 0LL,
                             s->wait_replicas);
    freeReplyObject(r);
    return rc;
}

/* The acquire script's reply: {1, token, clock_us} for a new grant, {1,
 * token} for the holder's retry (*clock_us is then 0: no new token, nothing
 * to compare), or {0, owner, label, token, pttl, ttl}. Returns 0 (granted),
 * LEASE_EBUSY or LEASE_ESTORE. */
static int acquire_reply(uint64_t *token, uint64_t *clock_us,
                         lease_info *holder, const redisReply *r)
{
    int granted = r->type == REDIS_REPLY_ARRAY && r->elements >= 1
                      ? redis_flag(r->element[0]) : -1;

    *clock_us = 0;
    if (granted == 1) {
        if ((r->elements != 2 && r->elements != 3) ||
            redis_token(token, r->element[1]) < 0)
            return redis_odd("acquire", "the token is not 1 .. 2^63-1");
        if (r->elements == 3 &&
            redis_num(clock_us, r->element[2], 1, INT64_MAX) < 0)
            return redis_odd("acquire", "the server's clock is not 1 .. 2^63-1 us");
        return 0;
    }
    if (granted != 0 || r->elements != 6)
        return redis_odd("acquire", "not {1, token} nor {0, holder...}");
    if (redis_holder(holder, "acquire",
                     (const redisReply *const *)r->element + 1) < 0)
        return LEASE_ESTORE;
    return LEASE_EBUSY;
}

/* In clock mode a new token above the clock by more than a second
 * followed the counter (+1), not the clock: the server's clock is behind
 * the tokens issued before (a clock set back, or a failover to a host with
 * a slower clock). Still correct, but no longer clock-floored: say so. */
static void redis_check_clock(const redis_store *s, const lease_request *req,
                              uint64_t token, uint64_t clock_us)
{
    if (s->tokens == LEASE__TOKENS_CLOCK && clock_us > 0 &&
        token > clock_us + 1000000)
        lease__clock_behind(s->parent.backend ? s->parent.backend->name : "redis",
                            req, token, token - clock_us);
}

static int redis_acquire(lease_grant *out, lease_info *holder, lease_store *base,
                         const lease_request *req)
{
    redis_store *s = (redis_store *)base;
    char ttl[24], keep[24];
    record_keys k;
    const char *args[8];
    redisReply *r;
    uint64_t clock_us;
    int rc;

    redis_begin(s);
    record_keys_of(&k, s, req->key);
    dec_u64(ttl, req->ttl_ms);
    /* The script keeps at least this many grants: the C constant is the
     * one definition of the bound. */
    dec_u64(keep, LEASE_HISTORY_KEEP);
    args[0] = k.ck;
    args[1] = k.lk;
    args[2] = k.hk;
    args[3] = req->owner;
    args[4] = req->label;
    args[5] = ttl;
    args[6] = keep;
    args[7] = s->tokens == LEASE__TOKENS_COUNTER ? "counter" : "clock";
    if ((rc = redis_eval(&r, s, SC_ACQUIRE, 3, args, NULL, 8, "acquire")) < 0)
        return rc;
    memset(holder, 0, sizeof(*holder));
    lease__strlcpy(holder->key, req->key, sizeof(holder->key));
    rc = acquire_reply(&out->token, &clock_us, holder, r);
    freeReplyObject(r);
    if (rc < 0)
        return rc;
    redis_check_clock(s, req, out->token, clock_us);
    out->ttl_ms = req->ttl_ms;
    redis_drop_sub(s); /* stop listening once the wait is over */
    if (s->wait_replicas > 0)
        return wait_for_replicas(s, req->owner, out->token);
    return 0;
}

/* The 0/1 of the renew, release and put scripts: 1 and 0 are the answer;
 * anything else is a store failure, never ELOST. */
static int redis_outcome(const redisReply *r, const char *what)
{
    int v = redis_flag(r);

    return v < 0 ? redis_odd(what, "not the integer 0 or 1") : v;
}

/* The KEYS and ARGV of renew.lua for one grant: the record keys, owner,
 * token, ttl_ms, in args[0..6) (the buffers are the caller's). */
typedef struct {
    record_keys k;
    char tok[24], ttl[24];
    const char *args[6];
} renew_args;

static void renew_args_of(renew_args *a, const redis_store *s, const char *key,
                          const char *owner, uint64_t token, uint64_t ttl_ms)
{
    record_keys_of(&a->k, s, key);
    dec_u64(a->tok, token);
    dec_u64(a->ttl, ttl_ms);
    a->args[0] = a->k.ck;
    a->args[1] = a->k.lk;
    a->args[2] = a->k.hk;
    a->args[3] = owner;
    a->args[4] = a->tok;
    a->args[5] = a->ttl;
}

/* What renew.lua's reply means for (key, token): 0 extended, LEASE_ELOST
 * (with the message) or LEASE_ESTORE for anything but 0 or 1. */
static int renew_outcome(const redisReply *r, const char *key, uint64_t token)
{
    int rc = redis_outcome(r, "renew");

    if (rc < 0)
        return rc;
    return rc == 0 ? lease__not_holder("renew", key, token, NULL) : 0;
}

static int redis_renew(uint64_t *granted_ms, lease_store *base, const char *key,
                       const char *owner, uint64_t token, uint64_t ttl_ms)
{
    redis_store *s = (redis_store *)base;
    renew_args a;
    redisReply *r;
    int rc;

    redis_begin(s);
    renew_args_of(&a, s, key, owner, token, ttl_ms);
    if ((rc = redis_eval(&r, s, SC_RENEW, 3, a.args, NULL, 6, "renew")) < 0)
        return rc;
    rc = renew_outcome(r, key, token);
    freeReplyObject(r);
    if (rc < 0)
        return rc;
    *granted_ms = ttl_ms;
    return 0;
}

/* Send one EVALSHA of renew.lua per grant on the command connection, all
 * in one send (the replies are read after). */
static int renew_many_send(redis_store *s, const lease_grant *grants, size_t n,
                           uint64_t ttl_ms)
{
    const char *argv[EVAL_ARGV_MAX];
    size_t lv[EVAL_ARGV_MAX], i;
    char nk[24];
    renew_args a;
    int argc, rc = 0;

    s->out.len = 0;
    for (i = 0; i < n && rc == 0; i++) {
        renew_args_of(&a, s, grants[i].key, grants[i].owner, grants[i].token,
                      ttl_ms);
        argc = eval_argv(argv, lv, nk, s, SC_RENEW, 3, a.args, NULL, 6);
        rc = redis_queue(&s->out, argc, argv, lv);
    }
    return rc < 0 ? rc : redis_flush(s, s->ctx, &s->out, "renew");
}

/*
 * Read the n replies of renew_many_send into results[]. Every reply is read
 * even after an error reply, so that the connection stays in step for the
 * retry after NOSCRIPT (*noscript set) or the next call. Any other error
 * reply fails the whole call (LEASE_ESTORE: that grant's outcome is
 * unknown, and a batch is one store call). A malformed reply drops the
 * connection at once, the rest of the batch unread, as redis.c does for
 * every malformed answer.
 */
static int renew_many_read(int *results, int *noscript, redis_store *s,
                           const lease_grant *grants, size_t n)
{
    size_t i;
    int rc, failed = 0;

    *noscript = 0;
    for (i = 0; i < n; i++) {
        redisReply *r;

        if ((rc = redis_read(&r, s, s->ctx, "renew")) < 0)
            return rc;
        if (redis_noscript(r)) {
            *noscript = 1;
        } else if (r->type == REDIS_REPLY_ERROR) {
            char text[256];

            if (!failed)
                failed = lease__seterr(LEASE_ESTORE, "redis renew of '%s': %s",
                                       grants[i].key,
                                       redis_server_text(text, sizeof(text), s, r->str));
        } else if ((results[i] = renew_outcome(r, grants[i].key,
                                               grants[i].token)) == LEASE_ESTORE) {
            freeReplyObject(r);
            redis_drop(s);
            return LEASE_ESTORE;
        }
        freeReplyObject(r);
    }
    return failed;
}

/*
 * renew for n grants in one round trip: the n EVALSHA calls are pipelined
 * (written together, then the n replies read), bounded as a whole by the
 * handle's timeout like every slot. The scripts run one by one, each atomic
 * on its own grant's {K} keys, so the batch is valid whatever slot each
 * key hashes to. After NOSCRIPT on any reply (the grants before it may have
 * been renewed: renewing again is harmless) the scripts are loaded again
 * and the whole batch sent once more.
 */
static int redis_renew_many(int *results, uint64_t *granted_ms,
                            lease_store *base, const lease_grant *grants,
                            size_t n, uint64_t ttl_ms)
{
    redis_store *s = (redis_store *)base;
    int rc, noscript = 0, attempt;
    size_t i;

    redis_begin(s);
    for (attempt = 0; attempt < 2 && n > 0; attempt++) {
        if ((rc = redis_ensure(s)) < 0 ||
            (rc = renew_many_send(s, grants, n, ttl_ms)) < 0 ||
            (rc = renew_many_read(results, &noscript, s, grants, n)) < 0)
            return rc;
        if (!noscript)
            break;
        if (attempt == 0 && (rc = load_scripts(s)) < 0)
            return rc;
    }
    if (noscript)
        return lease__seterr(LEASE_ESTORE,
                             "redis renew: the server forgot the scripts "
                             "again after they were loaded (NOSCRIPT)");
    for (i = 0; i < n; i++)
        granted_ms[i] = results[i] == 0 ? ttl_ms : 0;
    return 0;
}

static int redis_release(lease_store *base, const char *key, const char *owner,
                         uint64_t token)
{
    redis_store *s = (redis_store *)base;
    char tok[24];
    record_keys k;
    const char *args[7] = { k.ck, k.lk, k.hk, owner, tok, s->chan, key };
    redisReply *r;
    int rc;

    redis_begin(s);
    record_keys_of(&k, s, key);
    dec_u64(tok, token);
    if ((rc = redis_eval(&r, s, SC_RELEASE, 3, args, NULL, 7, "release")) < 0)
        return rc;
    rc = redis_outcome(r, "release");
    freeReplyObject(r);
    if (rc < 0)
        return rc;
    if (rc == 0)
        return lease__not_holder("release", key, token, NULL);
    return 0;
}

/* The inspect script's reply, for `key`: {0} for a key never acquired
 * (ENOTFOUND), else {1, counter, owner, label, token, pttl, ttl, ended}
 * with empty strings for a free key, and ended "released" or "expired"
 * for a key without a lease ("" while one exists). Frees r. */
static int inspect_reply(lease_info *out, redisReply *r, const char *key)
{
    int found = r->type == REDIS_REPLY_ARRAY && r->elements >= 1
                    ? redis_flag(r->element[0]) : -1;
    const redisReply *const *f = (const redisReply *const *)r->element;
    int rc = 0;

    memset(out, 0, sizeof(*out));
    lease__strlcpy(out->key, key, sizeof(out->key));
    if (found == 0 && r->elements == 1)
        rc = lease__seterr(LEASE_ENOTFOUND, "'%s' was never acquired", key);
    else if (found != 1 || redis_array(r, 8, 1) < 0)
        rc = redis_odd("inspect", "not {0} nor {1, and seven strings}");
    else if (redis_token(&out->token, f[1]) < 0)
        rc = redis_odd("inspect", "the token counter is not 1 .. 2^63-1");
    else if (f[2]->len > 0 && redis_holder(out, "inspect", f + 2) < 0)
        rc = LEASE_ESTORE;
    /* A free key reports its last token: the counter. */
    else if (f[2]->len == 0 && strcmp(f[7]->str, "expired") == 0)
        out->state = LEASE_STATE_EXPIRED;
    freeReplyObject(r);
    return rc;
}

static int inspect_one(lease_info *out, redis_store *s, const char *key)
{
    record_keys k;
    const char *args[3] = { k.ck, k.lk, k.hk };
    redisReply *r;
    int rc;

    record_keys_of(&k, s, key);
    if ((rc = redis_eval(&r, s, SC_INSPECT, 3, args, NULL, 3, "inspect")) < 0)
        return rc;
    return inspect_reply(out, r, key);
}

static int redis_inspect(lease_info *out, lease_store *base, const char *key)
{
    redis_store *s = (redis_store *)base;

    redis_begin(s);
    return inspect_one(out, s, key);
}

/*
 * Inspect n keys in one pipelined round trip: infos[*got ...] receive the
 * ones that exist. A script the server lost (NOSCRIPT) or any other error
 * reply falls back to one inspect for that key.
 */
static int inspect_many(lease_info *infos, size_t *got, redis_store *s,
                        char (*names)[LEASE_KEY_MAX + 1], size_t n)
{
    record_keys k;
    size_t i;
    int rc = 0;

    if ((rc = redis_ensure(s)) < 0)
        return rc;
    s->out.len = 0;
    for (i = 0; i < n && rc == 0; i++) {
        const char *argv[6] = { "EVALSHA", s->sha[SC_INSPECT], "3", k.ck, k.lk, k.hk };

        record_keys_of(&k, s, names[i]);
        rc = redis_queue(&s->out, 6, argv, NULL);
    }
    if (rc < 0 || (rc = redis_flush(s, s->ctx, &s->out, "list")) < 0)
        return rc;
    /* Read every reply that was sent; a failure or a malformed answer
     * drops the connection, so that none is left in flight. */
    for (i = 0; i < n; i++) {
        redisReply *r;

        if ((rc = redis_read(&r, s, s->ctx, "list")) < 0)
            return rc;
        if (r->type == REDIS_REPLY_ERROR) {
            freeReplyObject(r);
            continue; /* again below, alone */
        }
        rc = inspect_reply(&infos[*got], r, names[i]);
        if (rc == 0)
            (*got)++;
        else if (rc != LEASE_ENOTFOUND) {
            redis_drop(s);
            return rc;
        }
        names[i][0] = '\0'; /* done */
    }
    for (i = 0; i < n; i++) {
        if (names[i][0] == '\0')
            continue;
        if ((rc = inspect_one(&infos[*got], s, names[i])) == 0)
            (*got)++;
        else if (rc != LEASE_ENOTFOUND)
            return rc;
    }
    return 0;
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

/*
 * One SCAN reply: {cursor, {key...}}. The cursor goes to `cursor`, and the
 * lease keys that match `prefix` (keys <prefix>{name}:token) to batch[*nb],
 * which has room for every key of the reply (malloc'ed here).
 */
static int scan_reply(char cursor[32], char (**batch)[LEASE_KEY_MAX + 1],
                      size_t *nb, const redis_store *s, const char *prefix,
                      const redisReply *r)
{
    size_t i, plen = strlen(s->prefix), klen = strlen(prefix);
    uint64_t c;

    *nb = 0;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[1]->type != REDIS_REPLY_ARRAY)
        return redis_odd("list", "SCAN did not answer {cursor, {keys}}");
    if (redis_num(&c, r->element[0], 0, UINT64_MAX) < 0 ||
        r->element[0]->type != REDIS_REPLY_STRING)
        return redis_odd("list", "the SCAN cursor is not a decimal string");
    memcpy(cursor, r->element[0]->str, r->element[0]->len + 1);
    /* COUNT is a hint: size the batch by what came. */
    free(*batch);
    *batch = malloc((r->element[1]->elements ? r->element[1]->elements : 1) *
                    sizeof(**batch));
    if (*batch == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    for (i = 0; i < r->element[1]->elements; i++) {
        const redisReply *k = r->element[1]->element[i];
        size_t len, n;

        if (k->type != REDIS_REPLY_STRING)
            return redis_odd("list", "SCAN gave a key that is not a string");
        /* <prefix>{name}:token, name 1..LEASE_KEY_MAX bytes without NUL;
         * a server that ignores MATCH may send others: skip them. */
        len = k->len;
        if (len < plen + 9 || memcmp(k->str, s->prefix, plen) != 0 ||
            k->str[plen] != '{' || memcmp(k->str + len - 7, "}:token", 7) != 0)
            continue;
        n = len - plen - 8;
        if (n > LEASE_KEY_MAX || memchr(k->str + plen + 1, '\0', n) ||
            n < klen || memcmp(k->str + plen + 1, prefix, klen) != 0)
            continue;
        memcpy((*batch)[*nb], k->str + plen + 1, n);
        (*batch)[(*nb)++][n] = '\0';
    }
    return 0;
}

static int redis_list(lease_store *base, const char *prefix, lease_list_cb cb,
                      void *payload)
{
    redis_store *s = (redis_store *)base;
    char pat[2 * (64 + LEASE_KEY_MAX) + 16], ep[2 * 64 + 2], ek[2 * LEASE_KEY_MAX + 2];
    char cursor[32] = "0";
    lease_info *infos = NULL;
    char (*batch)[LEASE_KEY_MAX + 1] = NULL;
    size_t n = 0, cap = 0, i;
    int rc, rounds;

    redis_begin(s);
    if ((rc = redis_ensure(s)) < 0)
        return rc;
    glob_escape(ep, sizeof(ep), s->prefix);
    glob_escape(ek, sizeof(ek), prefix);
    snprintf(pat, sizeof(pat), "%s{%s*:token", ep, ek);
    /* Bounded: SCAN ends when the cursor comes back to 0, and the whole
     * walk by the call's deadline; the round cap only guards against a
     * server that never says so. */
    for (rounds = 0; rounds < 1000000; rounds++) {
        const char *a[6] = { "SCAN", cursor, "MATCH", pat, "COUNT", "500" };
        redisReply *r;
        size_t nb = 0;

        if ((rc = redis_ensure(s)) < 0)
            goto out;
        if ((rc = redis_call(&r, s, s->ctx, 6, a, NULL, "list")) < 0) {
            freeReplyObject(r);
            goto out;
        }
        rc = scan_reply(cursor, &batch, &nb, s, prefix, r);
        freeReplyObject(r);
        if (rc < 0)
            goto out;
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
    /* In SCAN's order: the core sorts. */
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

    redis_begin(s);
    key_of(fk, sizeof(fk), s, "fence:", resource, "");
    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    if ((rc = redis_eval(&r, s, SC_FENCE, 1, args, NULL, 2, "fence")) < 0)
        return rc;
    ok = redis_array(r, 2, 2) == 0 ? redis_flag(r->element[0]) : -1;
    /* Accepted: the mark is the token; refused: a mark above it. */
    if (ok < 0 || redis_token(mark, r->element[1]) < 0 ||
        (ok == 1 && *mark != token) || (ok == 0 && *mark <= token)) {
        freeReplyObject(r);
        return redis_odd("fence", "not {1, token} nor {0, a higher mark}");
    }
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

    redis_begin(s);
    key_of(fk, sizeof(fk), s, "fence:", resource, "");
    if ((rc = redis_ensure(s)) < 0)
        return rc;
    if ((rc = redis_call(&r, s, s->ctx, 2, a, NULL, "read mark")) < 0) {
        freeReplyObject(r);
        return rc;
    }
    if (r->type == REDIS_REPLY_NIL)
        rc = lease__seterr(LEASE_ENOTFOUND, "'%s' has no fencing mark", resource);
    else if (redis_token(mark, r) < 0 || r->type != REDIS_REPLY_STRING)
        rc = redis_odd("read mark", "the mark is not 1 .. 2^63-1");
    freeReplyObject(r);
    return rc;
}

/*
 * lease_fence_install: the Redis kit is a Functions library
 * (resource/redis/lease_fence.lua), loaded over the store's own connection
 * so that its AUTH, TLS and bound on the call serve the install too.
 * Functions belong to the server, not to a database or a key prefix: one
 * install serves every database on it (and replaces another's copy).
 * The answer is the library's name: a bulk string, nothing else.
 */
static int redis_install_kit(lease_store *base, const char *kit, size_t len)
{
    redis_store *s = (redis_store *)base;
    const char *a[4] = { "FUNCTION", "LOAD", "REPLACE", kit };
    size_t lens[4] = { 8, 4, 7, len };
    redisReply *r;
    int rc;

    redis_begin(s);
    if ((rc = redis_ensure(s)) < 0)
        return rc;
    if ((rc = redis_call(&r, s, s->ctx, 4, a, lens, "function load")) == 0 &&
        (r->type != REDIS_REPLY_STRING || r->len == 0 || r->len > LEASE_KEY_MAX))
        rc = redis_odd("function load", "not the library's name");
    freeReplyObject(r);
    return rc;
}

static int redis_guarded_put(lease_store *base, const char *key,
                             const char *owner, uint64_t token, const char *name,
                             const void *value, size_t len)
{
    redis_store *s = (redis_store *)base;
    char dk[KEYBUF], tok[24];
    record_keys k;
    const char *args[7] = { k.ck, k.lk, k.hk, dk, owner, tok, value };
    size_t lens[7];
    int i, rc;
    redisReply *r;

    redis_begin(s);
    record_keys_of(&k, s, key);
    key_of(dk, sizeof(dk), s, "data:", name, "");
    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    for (i = 0; i < 6; i++)
        lens[i] = strlen(args[i]);
    lens[6] = len; /* the value is binary */
    if ((rc = redis_eval(&r, s, SC_PUT, 4, args, lens, 7, "guarded put")) < 0)
        return rc;
    rc = redis_outcome(r, "guarded put");
    freeReplyObject(r);
    if (rc < 0)
        return rc;
    if (rc == 0)
        return lease__not_holder(NULL, key, token, "; nothing was written");
    return 0;
}

/* HMGET value token: {nil, nil} for no data, else {value, token}. */
static int data_reply(void **value, size_t *len, uint64_t *token,
                      const redisReply *r, const char *name)
{
    uint64_t t;
    char *copy;

    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_NIL &&
        r->element[1]->type == REDIS_REPLY_NIL)
        return lease__seterr(LEASE_ENOTFOUND, "no data named '%s'", name);
    if (redis_array(r, 2, 0) < 0 || redis_token(&t, r->element[1]) < 0)
        return redis_odd("read data", "not {value, token 1 .. 2^63-1}");
    if ((copy = malloc(r->element[0]->len + 1)) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    memcpy(copy, r->element[0]->str, r->element[0]->len);
    copy[r->element[0]->len] = '\0';
    *value = copy;
    *len = r->element[0]->len;
    if (token)
        *token = t;
    return 0;
}

static int redis_data_get(void **value, size_t *len, uint64_t *token,
                          lease_store *base, const char *name)
{
    redis_store *s = (redis_store *)base;
    char dk[KEYBUF];
    const char *a[4] = { "HMGET", dk, "value", "token" };
    redisReply *r;
    int rc;

    redis_begin(s);
    key_of(dk, sizeof(dk), s, "data:", name, "");
    if ((rc = redis_ensure(s)) < 0)
        return rc;
    if ((rc = redis_call(&r, s, s->ctx, 4, a, NULL, "read data")) < 0) {
        freeReplyObject(r);
        return rc;
    }
    rc = data_reply(value, len, token, r, name);
    freeReplyObject(r);
    return rc;
}

/* One message of the subscription, until s->deadline_ns: LEASE_ETIMEOUT
 * when none came, keeping the subscription, unless a message may be half
 * read (bytes came since the last whole message and the buffer was not
 * empty after it): then the connection is dropped, as the rest would be
 * misread. */
static int sub_read(redisReply **out, redis_store *s)
{
    redisContext *c = s->sub;
    void *reply = NULL;

    /* Bounded by the deadline: each pass polls for the time left. */
    for (;;) {
        int64_t left;
        struct pollfd p;
        int n, rc;

        if ((rc = redis_check_headers(s, c, "wait for release")) < 0)
            return rc;
        if (redisGetReplyFromReader(c, &reply) != REDIS_OK)
            return redis_parse_failed(s, c, "wait for release");
        if (reply != NULL) {
            budget_reset(c);
            if (c->reader->pos == c->reader->len)
                s->sub_dirty = 0;
            *out = reply;
            return 0;
        }
        if ((left = redis_left_ms(s)) <= 0) {
            if (!s->sub_dirty)
                return LEASE_ETIMEOUT;
            return redis_timed_out(s, c, "wait for release");
        }
        if (c->reader->len > REDIS_REPLY_BYTES_MAX) {
            rc = redis_odd("wait for release", "message too large");
            redis_drop_sub(s);
            return rc;
        }
        p.fd = c->fd;
        p.events = POLLIN;
        p.revents = 0;
        n = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
        if (n < 0 && errno != EINTR)
            return redis_fail_ctx(s, c, "wait for release");
        if (n > 0 && redisBufferRead(c) != REDIS_OK)
            return redis_fail_ctx(s, c, "wait for release");
        if (n > 0)
            s->sub_dirty = 1;
    }
}

/* Wait on the release channel, over a second connection (a subscribed
 * connection can run no other command). Subscribing is a store call,
 * bounded by the handle's timeout; the wait after it by timeout_ms. */
static int redis_wait_release(lease_store *base, const char *key,
                              uint64_t timeout_ms)
{
    redis_store *s = (redis_store *)base;
    int64_t end = lease_clock_ns() + (int64_t)timeout_ms * 1000000;
    int rc;

    if (s->sub == NULL) {
        const char *a[2] = { "SUBSCRIBE", s->chan };

        redis_begin(s);
        if ((s->sub = connect_one(s, &s->sub_budget, &rc)) == NULL)
            return rc;
        if ((rc = redis_simple(s, s->sub, "subscribe", 2, a)) < 0) {
            redis_drop_sub(s);
            return rc;
        }
    }
    /* Bounded by `end`: every read waits at most until then. */
    s->deadline_ns = end;
    for (;;) {
        redisReply *r = NULL; /* set whenever sub_read returns 0 */
        int match;

        if ((rc = sub_read(&r, s)) < 0)
            return rc;
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

/* One history entry {token, owner, label, ttl_ms, acquired_ms, ended,
 * ended_ms}; -1 with the message set when a field is out of range. */
static int history_entry(lease_history_entry *e, const redisReply *r)
{
    const redisReply *const *f = (const redisReply *const *)r->element;
    uint64_t acquired, ended;

    memset(e, 0, sizeof(*e));
    if (redis_array(r, 7, 0) < 0)
        return redis_odd("history", "an entry is not seven strings");
    if (redis_token(&e->token, f[0]) < 0)
        return redis_odd("history", "an entry's token is not 1 .. 2^63-1");
    if (redis_str(e->owner, sizeof(e->owner), f[1]) < 0 ||
        redis_str(e->label, sizeof(e->label), f[2]) < 0)
        return redis_odd("history", "an entry's owner or label is too long");
    if (redis_num(&e->ttl_ms, f[3], 0, LEASE__MS_MAX) < 0 ||
        redis_num(&acquired, f[4], 0, INT64_MAX) < 0 ||
        redis_num(&ended, f[6], 0, INT64_MAX) < 0)
        return redis_odd("history", "an entry's ttl or times are out of range");
    e->acquired_ms = (int64_t)acquired;
    e->ended = ended_of(f[5]);
    e->ended_ms = e->ended == LEASE_ENDED_HELD ? 0 : (int64_t)ended;
    return 0;
}

static int redis_history(lease_history_entry *out, size_t *n, lease_store *base,
                         const char *key, size_t max)
{
    redis_store *s = (redis_store *)base;
    char mx[24];
    record_keys k;
    const char *args[4] = { k.ck, k.lk, k.hk, mx };
    redisReply *r;
    size_t i;
    int rc = 0;

    redis_begin(s);
    *n = 0;
    record_keys_of(&k, s, key);
    snprintf(mx, sizeof(mx), "%zu", max);
    if ((rc = redis_eval(&r, s, SC_HISTORY, 3, args, NULL, 4, "history")) < 0)
        return rc;
    /* Check the whole reply before handing anything out: a malformed one
     * is a store failure, never a short history. */
    if (r->type != REDIS_REPLY_ARRAY || r->elements > max)
        rc = redis_odd("history", "not an array of at most the entries asked");
    for (i = 0; rc == 0 && i < r->elements; i++)
        if (history_entry(&out[i], r->element[i]) < 0)
            rc = LEASE_ESTORE;
    if (rc == 0)
        *n = r->elements;
    freeReplyObject(r);
    return rc;
}

static int redis_history_lost(lease_store *base, const char *key,
                              const char *owner, uint64_t token)
{
    redis_store *s = (redis_store *)base;
    char tok[24];
    record_keys k;
    const char *args[5] = { k.ck, k.lk, k.hk, owner, tok };
    redisReply *r;
    int rc;

    redis_begin(s);
    record_keys_of(&k, s, key);
    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    if ((rc = redis_eval(&r, s, SC_HISTORY_LOST, 3, args, NULL, 5, "history lost")) < 0)
        return rc;
    /* 1 marked, 0 nothing to mark (pruned, released, another owner): both
     * are success. */
    rc = redis_flag(r) < 0 ? redis_odd("history lost", "not the integer 0 or 1") : 0;
    freeReplyObject(r);
    return rc;
}

/* ---- open and close ------------------------------------------------------ */

static void redis_close(lease_store *base)
{
    redis_store *s = (redis_store *)base;

    redis_drop(s);
    redis_drop_sub(s);
    free(s->out.buf);
    free(s->user);
    if (s->password) {
        if (s->password_from_file)
            lease__secret_release(s->password);
        lease__free_secret(s->password);
    }
}

/* The query parameters (see the top of this file), each checked before
 * any connection is tried. */
static int redis_parse_params(redis_store *s, const lease__url *u)
{
    const char *v;
    char *end;
    size_t i;
    int rc;

    lease__strlcpy(s->prefix, "lease:", sizeof(s->prefix));
    if ((rc = lease__url_tokens(&s->tokens, u)) < 0)
        return rc;
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
        } else if (strcmp(name, "tokens") == 0) {
            /* read by lease__url_tokens, above */
        } else if (strcmp(name, "password_file") == 0) {
            rc = lease__read_password_file(&s->password, "redis", v);
            if (rc < 0)
                return rc;
            s->password_from_file = 1;
        } else {
            return lease__seterr(LEASE_EINVALID, "unknown redis URL parameter '%s'",
                                 name);
        }
    }
    return 0;
}

static int redis_parse_url(redis_store *s, const lease__url *u)
{
    const char *colon;
    char *end;
    int rc;

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
        if (!isdigit((unsigned char)colon[1]) || *end != '\0' || p < 1 || p > 65535)
            return lease__seterr(LEASE_EINVALID, "bad port in the redis URL");
        s->port = (int)p;
    }
    if (u->path[0] && strcmp(u->path, "/") != 0) {
        long db = strtol(u->path + 1, &end, 10);
        if (!isdigit((unsigned char)u->path[1]) || *end != '\0' || db < 0 ||
            db > 1000000)
            return lease__seterr(LEASE_EINVALID, "redis database must be a number");
        s->db = (int)db;
    }
    if ((u->user && *u->user && !(s->user = strdup(u->user))) ||
        (u->password && !(s->password = strdup(u->password))))
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    if ((rc = redis_parse_params(s, u)) < 0)
        return rc;
    snprintf(s->chan, sizeof(s->chan), "%sreleased", s->prefix);
    /* A user without a password would connect without AUTH, as the
     * default user: say so rather than run as someone else. */
    if (s->user && !s->password)
        return lease__seterr(LEASE_EINVALID, "redis: a user needs a password "
                             "(in the URL or password_file)");
    return 0;
}

static int redis_open(lease_store *base, const char *url)
{
    redis_store *s = (redis_store *)base;
    lease__url u;
    int rc;

    if ((rc = lease__url_parse(&u, url)) < 0)
        return rc;
    rc = redis_parse_url(s, &u);
    lease__url_free(&u);
    if (s->wait_timeout_ms == 0)
        s->wait_timeout_ms = s->parent.timeout_ms;
    redis_begin(s);
    if (rc == 0)
        rc = redis_ensure(s);
    if (rc < 0)
        redis_close(&s->parent);
    return rc;
}

/* For lease --version. hiredis has no run-time version call; this is the
 * version of the headers the store was compiled with (its SONAME pins
 * the ABI). */
int lease__redis_client_version(char *buf, size_t size)
{
    return snprintf(buf, size, "hiredis %d.%d.%d", HIREDIS_MAJOR,
                    HIREDIS_MINOR, HIREDIS_PATCH);
}

const lease_backend lease__redis_backend = {
    .version = LEASE_BACKEND_VERSION,
    .name = "redis",
    .schemes = lease__redis_schemes,
    .features = LEASE_FEATURE_NOTIFY | LEASE_FEATURE_RENEW_MANY,
    .store_size = sizeof(redis_store),
    .open3 = redis_open,
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
    .renew_many = redis_renew_many,
    .set_timeout = NULL, /* redis_begin reads parent.timeout_ms */
    .advisory_txn = NULL,
    .history = redis_history,
    .history_lost = redis_history_lost,
    .install_kit = redis_install_kit,
};
