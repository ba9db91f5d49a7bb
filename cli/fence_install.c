/*
 * fence_install.c - `lease fence-install redis://...`: load the fencing
 * library (resource/redis/lease_fence.lua) into a Redis server with
 * FUNCTION LOAD REPLACE, so that the protected data's own writes can run
 * the check (FCALL lease_fence_set).
 *
 * It takes the Redis store's URL forms (redis://[user:password@]host:port
 * [/db][?password_file=PATH], the lease store's other parameters allowed
 * and ignored), so one URL serves both. The tool uses only liblease's
 * public API, which has no Redis connection to lend, hence its own small
 * parser and hiredis directly. No message carries the password: they name
 * the server by a URL rebuilt without it.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "cli.h"
#include "fence_text.h" /* generated from resource/redis/lease_fence.lua */

#define FENCE_LIB_NAME "lease_fence"
#define FENCE_TIMEOUT_S 5
#define SECRET_MAX 1024
#define SCRIPT_MAX ((off_t)1 << 20)

typedef struct {
    char host[256];
    int port, db;
    char *user, *password;   /* decoded; the password is never printed */
    char shown[FENCE_URL_SHOWN_MAX]; /* the URL for messages, without the password */
} fence_url;

static int say(char *err, size_t errsz, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int say(char *err, size_t errsz, int code, const char *fmt, ...)
{
    va_list ap;

    if (err != NULL && errsz > 0) {
        va_start(ap, fmt);
        vsnprintf(err, errsz, fmt, ap);
        va_end(ap);
    }
    return code;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* s[0..n) with %XX decoded, malloc'ed; NULL on a bad escape or %00. */
static char *decode(const char *s, size_t n)
{
    char *out = malloc(n + 1), *o = out;
    size_t i;

    for (i = 0; out != NULL && i < n; i++) {
        int h, l;
        if (s[i] != '%') {
            *o++ = s[i];
            continue;
        }
        if (i + 2 >= n || (h = hexval((unsigned char)s[i + 1])) < 0 ||
            (l = hexval((unsigned char)s[i + 2])) < 0 || (h == 0 && l == 0)) {
            free(out);
            return NULL;
        }
        *o++ = (char)(h * 16 + l);
        i += 2;
    }
    if (out != NULL)
        *o = '\0';
    return out;
}

static void secret_free(char *s)
{
    if (s != NULL) {
        memset(s, 0, strlen(s));
        free(s);
    }
}

static void url_free(fence_url *u)
{
    free(u->user);
    secret_free(u->password);
    u->user = u->password = NULL;
}

/* The password from a file only its owner (or root) may read, as the
 * Redis store takes it: one trailing newline dropped, 1 .. 1024 bytes. */
static int read_password_file(fence_url *u, const char *path, char *err, size_t errsz)
{
    char buf[SECRET_MAX + 1];
    struct stat st;
    size_t len = 0;
    int fd, rc = 0;

    if (u->password != NULL)
        return say(err, errsz, LEASE_EINVALID, "a redis URL takes a password or "
                   "password_file=, not both");
    /* O_NONBLOCK: opening a FIFO must not wait for a writer. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return say(err, errsz, LEASE_EINVALID, "redis password_file= '%.200s': %s",
                   path, strerror(errno));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (st.st_mode & 077) ||
        (st.st_uid != geteuid() && st.st_uid != 0))
        rc = say(err, errsz, LEASE_EINVALID, "redis password_file= '%.200s' must be "
                 "a regular file of yours (or root's), mode 0600 or stricter", path);
    /* Bounded: each pass reads at least one byte or ends. */
    while (rc == 0 && len < sizeof(buf)) {
        ssize_t n = read(fd, buf + len, sizeof(buf) - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    if (rc == 0 && len > 0 && buf[len - 1] == '\n')
        len -= len > 1 && buf[len - 2] == '\r' ? 2 : 1;
    if (rc == 0 && (len == 0 || len >= sizeof(buf) || memchr(buf, '\0', len)))
        rc = say(err, errsz, LEASE_EINVALID, "redis password_file= '%.200s' must hold "
                 "one password of 1 .. %d bytes, without NUL", path, SECRET_MAX);
    if (rc == 0 && (u->password = strndup(buf, len)) == NULL)
        rc = say(err, errsz, LEASE_ENOMEM, "out of memory");
    memset(buf, 0, sizeof(buf));
    return rc;
}

/* ?name=value&...: password_file= read, the lease store's own parameters
 * allowed (the same URL serves both), anything else refused. */
static int parse_query(fence_url *u, const char *q, char *err, size_t errsz)
{
    static const char *const store_params[] = { "prefix", "wait_replicas",
                                                "wait_timeout", "tokens", NULL };
    int rc = 0;

    while (rc == 0 && *q) {
        size_t n = strcspn(q, "&"), k;
        const char *eq = memchr(q, '=', n);
        char *name = decode(q, eq ? (size_t)(eq - q) : n);
        char *value = eq ? decode(eq + 1, n - (size_t)(eq + 1 - q)) : strdup("");

        if (name == NULL || value == NULL) {
            rc = say(err, errsz, LEASE_EINVALID, "bad %% escape in the redis URL's query");
        } else if (strcmp(name, "password_file") == 0) {
            rc = read_password_file(u, value, err, errsz);
        } else {
            for (k = 0; store_params[k] && strcmp(name, store_params[k]) != 0; k++)
                ;
            if (store_params[k] == NULL)
                rc = say(err, errsz, LEASE_EINVALID,
                         "unknown redis URL parameter '%.100s'", name);
        }
        free(name);
        secret_free(value);
        q += n + (q[n] == '&');
    }
    return rc;
}

/* host[:port] or [v6][:port] of hosts[0..n). */
static int parse_host(fence_url *u, const char *h, size_t n, char *err, size_t errsz)
{
    const char *end = h + n, *colon;
    size_t hl;

    if (n > 0 && h[0] == '[') {
        const char *close = memchr(h, ']', n);
        if (close == NULL || (close + 1 < end && close[1] != ':'))
            return say(err, errsz, LEASE_EINVALID, "bad host in the redis URL");
        hl = (size_t)(close - h - 1);
        colon = close + 1 < end ? close + 1 : NULL;
        h++;
    } else {
        colon = memchr(h, ':', n);
        hl = colon ? (size_t)(colon - h) : n;
    }
    if (hl == 0 || hl >= sizeof(u->host) || memchr(h, ',', hl))
        return say(err, errsz, LEASE_EINVALID, "a redis URL names one server: "
                   "redis://[user:password@]host:port[/db]");
    memcpy(u->host, h, hl);
    u->host[hl] = '\0';
    u->port = 6379;
    if (colon) {
        char digits[8], *stop;
        long p;
        size_t dl = (size_t)(end - colon - 1);
        if (dl == 0 || dl >= sizeof(digits))
            return say(err, errsz, LEASE_EINVALID, "bad port in the redis URL");
        memcpy(digits, colon + 1, dl);
        digits[dl] = '\0';
        p = strtol(digits, &stop, 10);
        if (!isdigit((unsigned char)digits[0]) || *stop || p < 1 || p > 65535)
            return say(err, errsz, LEASE_EINVALID, "bad port in the redis URL");
        u->port = (int)p;
    }
    return 0;
}

/* The URL for messages: the password as ***, an IPv6 host in brackets. */
static void shown_url(fence_url *u)
{
    int v6 = strchr(u->host, ':') != NULL, named = u->user && *u->user;

    snprintf(u->shown, sizeof(u->shown), "redis://%s%s%s%s%s%s:%d/%d",
             named ? u->user : "", u->password ? ":***" : "",
             named || u->password ? "@" : "", v6 ? "[" : "", u->host,
             v6 ? "]" : "", u->port, u->db);
}

/*
 * The user info, when the URL has an '@'. Readers of URLs disagree on
 * where it ends (the first '@', the last, the first '/' or '?'), and a
 * split other than ours would show part of the password as a host, a path
 * or a parameter in a message. So, as the store's own parser does, only
 * the form every reader splits alike: one '@', with no '/' or '?' before
 * it; the messages quote nothing of the URL.
 */
static int parse_userinfo(fence_url *u, const char **auth, char *err, size_t errsz)
{
    const char *a = *auth, *at = strrchr(a, '@'), *colon;

    if (at == NULL)
        return 0;
    if (memchr(a, '@', (size_t)(at - a)) != NULL)
        return say(err, errsz, LEASE_EINVALID, "the redis URL has more than one '@': "
                   "write an '@' in a user name or password as %%40");
    if (strcspn(a, "/?") < (size_t)(at - a))
        return say(err, errsz, LEASE_EINVALID, "the redis URL has an '@' after a '/' or "
                   "'?': write '@', '/' and '?' in a user name or password as %%40, "
                   "%%2F and %%3F");
    colon = memchr(a, ':', (size_t)(at - a));
    u->user = decode(a, (size_t)((colon ? colon : at) - a));
    if (colon)
        u->password = decode(colon + 1, (size_t)(at - colon - 1));
    if (u->user == NULL || (colon && u->password == NULL))
        return say(err, errsz, LEASE_EINVALID, "bad %% escape in the redis URL's user info");
    *auth = at + 1;
    return 0;
}

/* redis://[user:password@]host[:port][/db][?query] */
static int parse_url(fence_url *u, const char *url, char *err, size_t errsz)
{
    const char *auth, *rest, *q;
    int rc;

    if (strncasecmp(url, "rediss://", 9) == 0)
        return say(err, errsz, LEASE_EINVALID, "rediss:// (TLS) is not supported: "
                   "lease talks to Redis without TLS; use a redis:// URL");
    if (strncasecmp(url, "redis://", 8) != 0)
        return say(err, errsz, LEASE_EINVALID, "fence-install takes a redis:// URL");
    auth = url + 8;
    if ((rc = parse_userinfo(u, &auth, err, errsz)) < 0)
        return rc;
    rest = auth + strcspn(auth, "/?");
    if ((rc = parse_host(u, auth, (size_t)(rest - auth), err, errsz)) < 0)
        return rc;
    if (*rest == '/' && rest[1] != '\0' && rest[1] != '?') {
        char *stop;
        long db = strtol(rest + 1, &stop, 10);
        if (!isdigit((unsigned char)rest[1]) || (*stop && *stop != '?') || db < 0 ||
            db > 1000000)
            return say(err, errsz, LEASE_EINVALID, "redis database must be a number");
        u->db = (int)db;
    }
    q = strchr(rest, '?');
    if (q != NULL && (rc = parse_query(u, q + 1, err, errsz)) < 0)
        return rc;
    /* AUTH with a user name takes a password: without one, the server
     * would be used as the default user, which is not what was asked. */
    if (u->user && *u->user && u->password == NULL)
        return say(err, errsz, LEASE_EINVALID, "the redis URL names a user without a "
                   "password: a user needs a password (user:password@, or "
                   "?password_file=PATH)");
    shown_url(u);
    return 0;
}

/* The library's text: the file given, or the copy built into the tool. */
static int script_text(char **out, const char *path, char *err, size_t errsz)
{
    struct stat st;
    size_t got = 0;
    int fd;

    if (path == NULL)
        return (*out = strdup(LEASE_RESOURCE_LEASE_FENCE)) ? 0
                   : say(err, errsz, LEASE_ENOMEM, "out of memory");
    if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) < 0)
        return say(err, errsz, LEASE_EINVALID, "%.200s: %s", path, strerror(errno));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size == 0 ||
        st.st_size > SCRIPT_MAX) {
        close(fd);
        return say(err, errsz, LEASE_EINVALID, "%.200s: not a regular file of "
                   "1 byte .. 1 MiB", path);
    }
    if ((*out = malloc((size_t)st.st_size + 1)) == NULL) {
        close(fd);
        return say(err, errsz, LEASE_ENOMEM, "out of memory");
    }
    /* Bounded: each pass reads at least one byte or ends. */
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, *out + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    (*out)[got] = '\0';
    return 0;
}

/* The server's error text, fit for a message: the password (which a hostile
 * or odd server could echo) and control bytes replaced by '?'. */
static void server_text(char *buf, size_t size, const fence_url *u, const char *text)
{
    size_t n = 0, plen = u->password ? strlen(u->password) : 0;

    while (*text && n + 1 < size) {
        if (plen && strncmp(text, u->password, plen) == 0) {
            buf[n++] = '?';
            text += plen;
            continue;
        }
        buf[n++] = (unsigned char)*text < 0x20 || *text == 0x7f ? '?' : *text;
        text++;
    }
    buf[n] = '\0';
}

/* One command; a hiredis or server error becomes LEASE_ESTORE in err,
 * naming `what` (not the arguments: AUTH's are secret). */
static int command(redisReply **out, redisContext *c, const fence_url *u, int argc,
                   const char **argv, const char *what, char *err, size_t errsz)
{
    char text[256];

    *out = redisCommandArgv(c, argc, argv, NULL);
    if (*out == NULL) {
        server_text(text, sizeof(text), u, c->errstr);
        return say(err, errsz, LEASE_ESTORE, "redis %s: %s: %s", u->shown, what, text);
    }
    if ((*out)->type == REDIS_REPLY_ERROR) {
        server_text(text, sizeof(text), u, (*out)->str);
        return say(err, errsz, LEASE_ESTORE, "redis %s: %s: %s%s", u->shown, what, text,
                   strstr(text, "unknown command") ? " (Redis Functions need Redis 7.0 or later)"
                                                   : "");
    }
    return 0;
}

/* Connected, authenticated, database selected; the socket close-on-exec. */
static redisContext *connect_server(const fence_url *u, int *rc, char *err, size_t errsz)
{
    struct timeval tv = { FENCE_TIMEOUT_S, 0 };
    redisContext *c = redisConnectWithTimeout(u->host, u->port, tv);
    redisReply *r = NULL;
    char db[16], text[256];
    int fl;

    if (c == NULL) {
        *rc = say(err, errsz, LEASE_ENOMEM, "out of memory");
        return NULL;
    }
    if (c->err) {
        server_text(text, sizeof(text), u, c->errstr);
        *rc = say(err, errsz, LEASE_ESTORE, "cannot connect to redis %s: %s", u->shown, text);
        redisFree(c);
        return NULL;
    }
    /* hiredis makes its socket without SOCK_CLOEXEC; nothing runs a child
     * in between: the tool has one thread here. */
    if ((fl = fcntl(c->fd, F_GETFD)) < 0 || fcntl(c->fd, F_SETFD, fl | FD_CLOEXEC) < 0 ||
        redisSetTimeout(c, tv) != REDIS_OK) {
        *rc = say(err, errsz, LEASE_ESTORE, "redis %s: cannot set up the socket", u->shown);
        redisFree(c);
        return NULL;
    }
    *rc = 0;
    if (u->password) {
        const char *a3[3] = { "AUTH", u->user, u->password };
        const char *a2[2] = { "AUTH", u->password };
        *rc = u->user && *u->user ? command(&r, c, u, 3, a3, "AUTH", err, errsz)
                                  : command(&r, c, u, 2, a2, "AUTH", err, errsz);
        if (*rc < 0 && r != NULL) /* the refusal's text could repeat what it was sent */
            *rc = say(err, errsz, LEASE_ESTORE, "redis %s: authentication failed", u->shown);
        freeReplyObject(r);
        r = NULL;
    }
    if (*rc == 0 && u->db) {
        const char *a[2] = { "SELECT", db };
        snprintf(db, sizeof(db), "%d", u->db);
        *rc = command(&r, c, u, 2, a, "SELECT", err, errsz);
        freeReplyObject(r);
    }
    if (*rc < 0) {
        redisFree(c);
        return NULL;
    }
    return c;
}

int fence_install_redis(const char *url, const char *lua_path, char *shown,
                        size_t shownsz, char *err, size_t errsz)
{
    fence_url u;
    redisContext *c = NULL;
    redisReply *r = NULL;
    char *text = NULL;
    int rc;

    if (err != NULL && errsz > 0)
        err[0] = '\0';
    if (shown != NULL && shownsz > 0)
        shown[0] = '\0';
    if (url == NULL)
        return say(err, errsz, LEASE_EINVALID, "no redis URL");
    memset(&u, 0, sizeof(u));
    if ((rc = parse_url(&u, url, err, errsz)) == 0 &&
        (rc = script_text(&text, lua_path, err, errsz)) == 0 &&
        (c = connect_server(&u, &rc, err, errsz)) != NULL) {
        const char *a[4] = { "FUNCTION", "LOAD", "REPLACE", text };
        rc = command(&r, c, &u, 4, a, "FUNCTION LOAD", err, errsz);
        if (rc == 0 && (r->type != REDIS_REPLY_STRING || strcmp(r->str, FENCE_LIB_NAME) != 0))
            rc = say(err, errsz, LEASE_ESTORE, "redis %s: FUNCTION LOAD answered something "
                     "other than the library's name '" FENCE_LIB_NAME "'", u.shown);
        if (rc == 0 && shown != NULL && shownsz > 0)
            snprintf(shown, shownsz, "%s", u.shown);
    }
    freeReplyObject(r);
    if (c != NULL)
        redisFree(c);
    free(text);
    url_free(&u);
    return rc;
}
