/*
 * fuzz_util.h - what the libFuzzer targets share: the entry points'
 * prototypes, a loud failure for a broken property, splitting an input
 * into pieces, and a listening socket on loopback for the fake servers.
 *
 * Header-only and static: each target is one translation unit.
 */
#ifndef LEASE_FUZZ_UTIL_H
#define LEASE_FUZZ_UTIL_H

#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lease.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A property did not hold: say which, and abort so that libFuzzer keeps
 * the input as a crash (and the ctest run fails). */
static inline void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static inline void fuzz_fail(const char *fmt, ...)
{
    va_list ap;

    fputs("FUZZ PROPERTY FAILED: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

/* The input as a C string (it ends at the first NUL, as a C caller's would). */
static inline char *fuzz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);

    if (s == NULL)
        abort();
    memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* How many times `needle` occurs in `hay`, overlaps counted. */
static inline size_t fuzz_count(const char *hay, const char *needle)
{
    size_t n = 0, len = strlen(needle);
    const char *p = hay;

    if (len == 0)
        return 0;
    while ((p = strstr(p, needle)) != NULL) {
        n++;
        p++;
    }
    return n;
}

/* Pieces of an input separated by one byte (the fake servers answer
 * request i with piece i). Pointers into the input; at most FUZZ_PIECES. */
#define FUZZ_PIECES 64
typedef struct {
    const uint8_t *at[FUZZ_PIECES];
    size_t len[FUZZ_PIECES];
    size_t n;
} fuzz_pieces;

static inline void fuzz_split(fuzz_pieces *p, const uint8_t *data, size_t size, uint8_t sep)
{
    size_t start = 0, i;

    p->n = 0;
    for (i = 0; i <= size && p->n < FUZZ_PIECES; i++) {
        if (i == size || data[i] == sep) {
            p->at[p->n] = data + start;
            p->len[p->n] = i - start;
            p->n++;
            start = i + 1;
        }
    }
}

/* A listening TCP socket on 127.0.0.1 and an ephemeral port. */
static inline int fuzz_listen(int *port)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        abort();
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 16) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &alen) < 0)
        abort();
    *port = ntohs(a.sin_port);
    return fd;
}

/* A fake server's thread, with every signal blocked: libFuzzer's -timeout
 * alarm must reach the fuzzing thread, which it ignores anywhere else. */
static inline int fuzz_start_thread(pthread_t *t, void *(*fn)(void *), void *arg)
{
    sigset_t all, old;
    int rc;

    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0)
        pthread_detach(*t);
    return rc;
}

/* Write all of buf; the peer may have gone, which is not our failure. */
static inline void fuzz_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;

    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

/* Keep the library's log lines out of the fuzzer's output. */
static inline void fuzz_quiet_log(lease_log_level level, const char *line, void *payload)
{
    (void)level;
    (void)line;
    (void)payload;
}

/* The checks every store call's outcome must pass, whatever the store said. */
static inline void fuzz_check_rc(const char *what, int rc)
{
    /* LEASE_FUZZ_VERBOSE=1: say what each call gave (for writing seeds). */
    if (getenv("LEASE_FUZZ_VERBOSE"))
        fprintf(stderr, "%s: %s %s\n", what, lease_error_name(rc),
                rc < 0 ? lease_errmsg() : "");
    if (rc > 0 || rc < LEASE_EUNSUPPORTED)
        fuzz_fail("%s returned %d, not 0 or a LEASE_E* code", what, rc);
    if (rc < 0 && lease_errmsg()[0] == '\0')
        fuzz_fail("%s failed with %s and no message", what, lease_error_name(rc));
}

/* A token the store handed out: 1 .. 2^63-1, as lease_int.h documents. */
static inline void fuzz_check_token(const char *what, uint64_t token)
{
    if (token == 0 || token > (uint64_t)INT64_MAX)
        fuzz_fail("%s gave token %llu, outside 1 .. 2^63-1", what,
                  (unsigned long long)token);
}

/* A ttl or a remaining time the store reported: no more than the cap the
 * store accepts, plus a second for stores that round up to seconds. */
static inline void fuzz_check_ttl(const char *what, const char *field, uint64_t ms)
{
    if (ms > LEASE_TTL_MAX_DEFAULT_MS + 1000)
        fuzz_fail("%s gave %s %llu ms, above the 24 h cap", what, field,
                  (unsigned long long)ms);
}

static inline void fuzz_check_info(const char *what, const lease_info *info)
{
    if (info->held != 0 && info->held != 1)
        fuzz_fail("%s gave held = %d", what, info->held);
    if (info->token > (uint64_t)INT64_MAX)
        fuzz_fail("%s gave token %llu, above 2^63-1", what,
                  (unsigned long long)info->token);
    if (info->held) {
        fuzz_check_token(what, info->token);
        fuzz_check_ttl(what, "ttl", info->ttl_ms);
        fuzz_check_ttl(what, "remaining time", info->remaining_ms);
    }
}

#endif
