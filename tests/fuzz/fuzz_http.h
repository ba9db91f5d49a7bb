/*
 * fuzz_http.h - a fake HTTP server for the store targets that speak HTTP
 * (etcd's JSON gateway, the Kubernetes API), in a thread of the fuzzer on
 * 127.0.0.1 (an ephemeral port, kept for the whole run).
 *
 * The first request (the store's opening one) gets `first`; request i
 * after it gets answer i of the input (cycling). An answer that starts
 * with "HTTP/" is sent as it is (a raw response); any other is the body
 * of a 200 with a correct Content-Length and `headers`. Every connection
 * is closed after one answer, so no call waits for bytes that never come:
 * the fuzzer stays fast.
 *
 * It uses strcasestr and accept4: the target defines _GNU_SOURCE before
 * any include.
 */
#ifndef LEASE_FUZZ_HTTP_H
#define LEASE_FUZZ_HTTP_H

#include <poll.h>
#include <pthread.h>
#include <string.h>

#include "fuzz_util.h"
#include "lease_int.h"
#include "fuzz_store.h"

typedef struct {
    fuzz_fake fake;
    const char *first;   /* the body answering the opening request */
    const char *headers; /* more header lines of a 200, each ending in CRLF */
    int lfd;
} fuzz_http_fake;

/* Read one HTTP request (headers and a Content-Length body); 0 at EOF. */
static inline int fuzz_http_read_request(int fd)
{
    char buf[65536];
    size_t len = 0;
    char *end = NULL, *cl;
    long body = 0;

    while (end == NULL || len < (size_t)(end - buf) + 4 + (size_t)body) {
        struct pollfd pfd = { fd, POLLIN, 0 };
        ssize_t r;
        if (len == sizeof(buf) - 1 || poll(&pfd, 1, 2000) <= 0)
            return 0;
        if ((r = recv(fd, buf + len, sizeof(buf) - 1 - len, 0)) <= 0)
            return 0;
        len += (size_t)r;
        buf[len] = '\0';
        if (end == NULL && (end = strstr(buf, "\r\n\r\n")) != NULL) {
            if ((cl = strcasestr(buf, "\r\nContent-Length:")) != NULL && cl < end)
                body = strtol(cl + 17, NULL, 10);
            if (strcasestr(buf, "\r\nExpect: 100-continue") != NULL)
                fuzz_write_all(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25);
        }
    }
    return 1;
}

static inline void fuzz_http_answer(fuzz_http_fake *f, int fd)
{
    const uint8_t *at = (const uint8_t *)f->first;
    size_t len = strlen(f->first), i;
    char head[256];

    pthread_mutex_lock(&f->fake.mu);
    i = f->fake.requests++;
    if (i > 0 && f->fake.answers.n > 0) {
        i = (i - 1) % f->fake.answers.n;
        at = f->fake.answers.at[i];
        len = f->fake.answers.len[i];
    }
    if (len >= 5 && memcmp(at, "HTTP/", 5) == 0) {
        fuzz_write_all(fd, at, len);
    } else {
        int n = snprintf(head, sizeof(head),
                         "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%s"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                         f->headers, len);
        fuzz_write_all(fd, head, (size_t)n);
        fuzz_write_all(fd, at, len);
    }
    pthread_mutex_unlock(&f->fake.mu);
}

static inline void *fuzz_http_serve(void *arg)
{
    fuzz_http_fake *f = arg;

    for (;;) {
        int fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            poll(NULL, 0, 10); /* out of descriptors, say: do not spin */
            continue;
        }
        if (fuzz_http_read_request(fd))
            fuzz_http_answer(f, fd);
        shutdown(fd, SHUT_WR);
        close(fd);
    }
    return NULL;
}

/* Quiet logs, no proxy (the fake is on loopback: nothing may stand in
 * between), and the fake listening. */
static inline void fuzz_http_start(fuzz_http_fake *f)
{
    pthread_t t;

    lease_log_set(fuzz_quiet_log, NULL, LEASE_LOG_OFF);
    unsetenv("http_proxy");
    unsetenv("HTTP_PROXY");
    unsetenv("all_proxy");
    unsetenv("ALL_PROXY");
    f->lfd = fuzz_listen(&f->fake.port);
    if (fuzz_start_thread(&t, fuzz_http_serve, f) != 0)
        abort();
}

#endif
