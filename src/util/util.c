/*
 * util.c - clocks, randomness, argument checks and the parsers.
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/random.h>
#include <time.h>
#include <uuid/uuid.h>

#include "lease_int.h"

int64_t lease_clock_ns(void)
{
    struct timespec ts;

    /* BOOTTIME, not MONOTONIC: MONOTONIC stops while the machine is
     * suspended, and a holder that slept through its ttl must wake up
     * with its deadline passed. */
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t lease__mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int lease__cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until)
{
    int64_t delta = until - lease_clock_ns();
    int64_t wake = lease__mono_ns() + (delta > 0 ? delta : 0);
    struct timespec ts;

    ts.tv_sec = (time_t)(wake / 1000000000);
    ts.tv_nsec = (long)(wake % 1000000000);
    return pthread_cond_timedwait(cv, mu, &ts);
}

void lease__sleep_ns(int64_t ns)
{
    struct timespec ts;

    if (ns <= 0)
        return;
    ts.tv_sec = (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

uint64_t lease__random_u64(void)
{
    /* A per-thread xorshift seeded from the OS: jitter needs spread, not
     * secrecy, and must not cost a system call on every backoff. */
    static _Thread_local uint64_t state;

    while (state == 0) {
        if (getrandom(&state, sizeof(state), 0) != (ssize_t)sizeof(state))
            state = (uint64_t)lease__mono_ns() | 1u;
    }
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

void lease__strlcpy(char *dst, const char *src, size_t size)
{
    size_t n = strlen(src);

    if (n >= size)
        n = size - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

void lease__free_secret(char *s)
{
    if (s == NULL)
        return;
    explicit_bzero(s, strlen(s));
    free(s);
}

int lease__check_name(const char *what, const char *name)
{
    size_t n;

    if (name == NULL)
        return lease__seterr(LEASE_EINVALID, "%s is NULL", what);
    n = strnlen(name, LEASE_KEY_MAX + 1);
    if (n == 0)
        return lease__seterr(LEASE_EINVALID, "%s is empty", what);
    if (n > LEASE_KEY_MAX)
        return lease__seterr(LEASE_EINVALID, "%s is longer than %d bytes",
                             what, LEASE_KEY_MAX);
    return 0;
}

int lease_key_valid(const char *key)
{
    size_t n;

    if (key == NULL)
        return 0;
    n = strnlen(key, LEASE_KEY_MAX + 1);
    return n >= 1 && n <= LEASE_KEY_MAX;
}

int lease__check_ttl(const lease_store *store, uint64_t ttl_ms)
{
    uint64_t cap = store ? store->ttl_max_ms : LEASE_TTL_MAX_DEFAULT_MS;

    if (ttl_ms == 0)
        return lease__seterr(LEASE_EINVALID, "ttl must be at least 1 ms");
    if (ttl_ms > cap)
        return lease__seterr(LEASE_EINVALID,
                             "ttl of %llu ms is above the cap of %llu ms",
                             (unsigned long long)ttl_ms,
                             (unsigned long long)cap);
    return 0;
}

int lease_owner_valid(const char *owner)
{
    uuid_t u;

    if (owner == NULL || strnlen(owner, LEASE_OWNER_LEN + 1) != LEASE_OWNER_LEN)
        return 0;
    return uuid_parse(owner, u) == 0;
}

int lease__canonical_owner(char out[LEASE_OWNER_BUFSZ], const char *owner)
{
    uuid_t u;

    if (!lease_owner_valid(owner))
        return lease__seterr(LEASE_EINVALID,
                             "owner must be a UUID in text form "
                             "(xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)");
    uuid_parse(owner, u);
    uuid_unparse_lower(u, out);
    return 0;
}

int lease_owner_new(char out[LEASE_OWNER_BUFSZ])
{
    uuid_t u;
    unsigned char raw[16];

    if (out == NULL)
        return lease__seterr(LEASE_EINVALID, "owner buffer is NULL");
    /* getrandom() blocks only until the kernel's pool is first seeded,
     * and fails loudly instead of falling back to a weak source. */
    if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw))
        return lease__seterr(LEASE_ESTORE, "getrandom failed: %s",
                             strerror(errno));
    raw[6] = (unsigned char)((raw[6] & 0x0f) | 0x40); /* version 4 */
    raw[8] = (unsigned char)((raw[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    memcpy(u, raw, sizeof(u));
    uuid_unparse_lower(u, out);
    return 0;
}

int64_t lease__deadline_ns(int64_t sent_ns, uint64_t ttl_ms)
{
    int64_t ttl_ns, span;

    /* A ttl comes from the store too (a hostile one may answer 9e12 s):
     * saturate rather than overflow, so a huge ttl is "far away", never a
     * deadline in the past or undefined behaviour. */
    if (ttl_ms > (uint64_t)(INT64_MAX / 1000000))
        ttl_ms = (uint64_t)(INT64_MAX / 1000000);
    ttl_ns = (int64_t)ttl_ms * 1000000;
    /* 2% off for clock-rate drift between the store and this host: real
     * drift is parts per million, so this covers it with a wide margin. */
    span = ttl_ns - ttl_ns / 50;
    if (sent_ns > 0 && span > INT64_MAX - sent_ns)
        return INT64_MAX;
    return sent_ns + span;
}

uint64_t lease_grant_remaining_ms(const lease_grant *grant)
{
    int64_t left;

    if (grant == NULL)
        return 0;
    left = grant->deadline_ns - lease_clock_ns();
    return left > 0 ? (uint64_t)(left / 1000000) : 0;
}

int lease_grant_valid(const lease_grant *grant)
{
    return grant != NULL && grant->deadline_ns > lease_clock_ns();
}

int lease_grant_init(lease_grant *out, const char *key, const char *owner,
                     uint64_t token, uint64_t ttl_ms)
{
    int rc;

    if (out == NULL)
        return lease__seterr(LEASE_EINVALID, "grant is NULL");
    if ((rc = lease__check_name("key", key)) < 0)
        return rc;
    if (token == 0 || token > LEASE__TOKEN_MAX)
        return lease__seterr(LEASE_EINVALID, "token must be 1 .. 2^63-1");
    memset(out, 0, sizeof(*out));
    if ((rc = lease__canonical_owner(out->owner, owner)) < 0)
        return rc;
    lease__strlcpy(out->key, key, sizeof(out->key));
    out->token = token;
    out->ttl_ms = ttl_ms;
    return 0;
}

static int parse_u64_digits(uint64_t *out, const char **p)
{
    uint64_t v = 0;
    const char *s = *p;

    if (*s < '0' || *s > '9')
        return -1;
    for (; *s >= '0' && *s <= '9'; s++) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    *p = s;
    return 0;
}

int lease_parse_duration(uint64_t *ms, const char *text)
{
    const char *p = text;
    uint64_t total = 0;

    if (ms == NULL || text == NULL)
        return lease__seterr(LEASE_EINVALID, "duration is NULL");
    if (*p == '\0')
        return lease__seterr(LEASE_EINVALID, "duration is empty");
    while (*p) {
        uint64_t v, mult;

        if (parse_u64_digits(&v, &p) < 0)
            return lease__seterr(LEASE_EINVALID,
                                 "bad duration '%.64s': expected a number "
                                 "with a unit, e.g. 250ms, 30s, 5m", text);
        if (strncmp(p, "ms", 2) == 0) {
            mult = 1;
            p += 2;
        } else if (*p == 's') {
            mult = 1000;
            p++;
        } else if (*p == 'm') {
            mult = 60000;
            p++;
        } else if (*p == 'h') {
            mult = 3600000;
            p++;
        } else {
            return lease__seterr(LEASE_EINVALID,
                                 "bad duration '%.64s': unit must be ms, s, "
                                 "m or h", text);
        }
        if (v > UINT64_MAX / mult || total > UINT64_MAX - v * mult)
            return lease__seterr(LEASE_EINVALID,
                                 "duration '%.64s' is too large", text);
        total += v * mult;
    }
    *ms = total;
    return 0;
}

int lease_parse_token(uint64_t *token, const char *text)
{
    const char *p = text;
    uint64_t v;

    if (token == NULL || text == NULL)
        return lease__seterr(LEASE_EINVALID, "token is NULL");
    if (parse_u64_digits(&v, &p) < 0 || *p != '\0' || v == 0 ||
        v > LEASE__TOKEN_MAX)
        return lease__seterr(LEASE_EINVALID,
                             "bad token '%.64s': expected a whole number "
                             "from 1 to 9223372036854775807", text);
    *token = v;
    return 0;
}

/*
 * ?password_file=PATH of a store URL: the password in a file, so that it
 * stays out of argv and the environment. As libpq's PGPASSFILE, a file
 * that the group or others may read or write is refused; one trailing
 * newline (or CRLF) is not part of the password.
 */
int lease__read_password_file(char **out, const char *store, const char *path)
{
    char buf[1025];
    struct stat st;
    size_t len = 0;
    int fd, rc = 0;

    if (*out != NULL)
        return lease__seterr(LEASE_EINVALID, "a %s URL takes a password or "
                             "password_file=, not both", store);
    /* O_NONBLOCK: opening a FIFO must not wait for a writer. */
    if (*path == '\0' ||
        (fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) < 0)
        return lease__seterr(LEASE_EINVALID, "%s password_file= '%.200s': %s",
                             store, path, *path ? strerror(errno) : "empty path");
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
        rc = lease__seterr(LEASE_EINVALID, "%s password_file= '%.200s' is not "
                           "a regular file", store, path);
    else if (st.st_mode & (S_IRWXG | S_IRWXO))
        rc = lease__seterr(LEASE_EINVALID, "%s password_file= '%.200s' has "
                           "group or other permissions (%03o): chmod 600 it",
                           store, path, (unsigned)(st.st_mode & 0777));
    else if (st.st_uid != geteuid() && st.st_uid != 0)
        rc = lease__seterr(LEASE_EINVALID, "%s password_file= '%.200s' must be "
                           "yours (or root's), as ssh wants of its keys", store, path);
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
        rc = lease__seterr(LEASE_EINVALID, "%s password_file= '%.200s' must "
                           "hold one password of 1 .. 1024 bytes, without NUL",
                           store, path);
    if (rc == 0 && (*out = strndup(buf, len)) == NULL)
        rc = lease__seterr(LEASE_ENOMEM, "out of memory");
    /* Hidden from every later message, as the URL's own password is. */
    if (rc == 0 && (rc = lease__secret_hold(*out)) < 0) {
        free(*out);
        *out = NULL;
    }
    memset(buf, 0, sizeof(buf));
    return rc;
}
