/*
 * fuzz_kube.c - the Kubernetes store reading answers it cannot trust.
 *
 * A fake API server runs in a thread of this process on 127.0.0.1 (an ephemeral
 * port, kept for the whole run). The input is split at 0x01 bytes into
 * answers; after the store's opening probe (always answered with a
 * discovery document that lists leases),
 * request i gets answer i (cycling). An answer that starts with "HTTP/" is
 * sent as it is (a raw response); any other is the body of a 200 with a
 * correct Content-Length. Every connection is closed after one answer, so
 * no call waits for bytes that never come: the fuzzer stays fast.
 *
 * The store then runs acquire, renew, guarded put, release, inspect, list,
 * (a watch when a wait is asked: a stream cut by the close),
 * fence advance and mark, data get and history. Properties, whatever the
 * answers: no crash, leak or undefined behaviour; every outcome is 0 or a
 * LEASE_E* code with a message; a grant has a token in 1 .. 2^63-1, a ttl
 * of at least 1 ms and within the cap, and a local deadline not yet passed;
 * inspect/list/history/fence report tokens and times in range.
 */
#define _GNU_SOURCE /* strcasestr, accept4 */
#include <poll.h>
#include <pthread.h>

#include "fuzz_util.h"
#include "lease_int.h"
#include "fuzz_store.h"

/* The answers point into `input`, the fake's own copy: a request that
 * arrives late (after a client timeout) must not read a finished input. */
static struct {
    pthread_mutex_t mu;
    uint8_t *input;
    fuzz_pieces answers;
    size_t requests; /* since the input began */
    int port;
} kube_fake = { PTHREAD_MUTEX_INITIALIZER, NULL, { { 0 }, { 0 }, 0 }, 0, 0 };

/* Read one HTTP request (headers and a Content-Length body); 0 at EOF. */
static int kube_read_request(int fd)
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

static void kube_answer(int fd)
{
    static const char probe[] = "{\"kind\":\"APIResourceList\",\"resources\":"
                                "[{\"name\":\"leases\",\"namespaced\":true}]}";
    const uint8_t *at = (const uint8_t *)probe;
    size_t len = sizeof(probe) - 1, i;
    char head[160];

    pthread_mutex_lock(&kube_fake.mu);
    i = kube_fake.requests++;
    if (i > 0 && kube_fake.answers.n > 0) {
        i = (i - 1) % kube_fake.answers.n;
        at = kube_fake.answers.at[i];
        len = kube_fake.answers.len[i];
    }
    if (len >= 5 && memcmp(at, "HTTP/", 5) == 0) {
        fuzz_write_all(fd, at, len);
    } else {
        int n = snprintf(head, sizeof(head),
                         "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         "Date: Tue, 01 Dec 2026 04:00:00 GMT\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n", len);
        fuzz_write_all(fd, head, (size_t)n);
        fuzz_write_all(fd, at, len);
    }
    pthread_mutex_unlock(&kube_fake.mu);
}

static void *kube_serve(void *arg)
{
    int lfd = *(int *)arg;

    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            poll(NULL, 0, 10); /* out of descriptors, say: do not spin */
            continue;
        }
        if (kube_read_request(fd))
            kube_answer(fd);
        shutdown(fd, SHUT_WR);
        close(fd);
    }
    return NULL;
}

/* The bearer token the store reads at open, in a file of its own,
 * removed when the fuzzer exits. */
static char token_file[64];

static void remove_token_file(void)
{
    unlink(token_file);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static int lfd;
    pthread_t t;
    int fd;

    (void)argc;
    (void)argv;
    lease_log_set(fuzz_quiet_log, NULL, LEASE_LOG_OFF);
    /* The fake is on loopback: no proxy may stand in between. */
    unsetenv("http_proxy");
    unsetenv("HTTP_PROXY");
    unsetenv("all_proxy");
    unsetenv("ALL_PROXY");
    strcpy(token_file, "/tmp/fuzz_kube_token.XXXXXX");
    if ((fd = mkstemp(token_file)) < 0)
        abort();
    if (write(fd, "fuzz-token", 10) != 10) /* a file: fuzz_write_all sends */
        abort();
    close(fd);
    atexit(remove_token_file);
    lfd = fuzz_listen(&kube_fake.port);
    if (fuzz_start_thread(&t, kube_serve, &lfd) != 0)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char url[160];
    lease_store *s = NULL;
    int rc;

    if (size > 65536)
        return 0;
    pthread_mutex_lock(&kube_fake.mu);
    free(kube_fake.input);
    if ((kube_fake.input = malloc(size + 1)) == NULL)
        abort();
    memcpy(kube_fake.input, data, size);
    fuzz_split(&kube_fake.answers, kube_fake.input, size, 0x01);
    kube_fake.requests = 0;
    pthread_mutex_unlock(&kube_fake.mu);
    snprintf(url, sizeof(url), "kubernetes+http://127.0.0.1:%d/fuzz?token_file=%s",
             kube_fake.port, token_file);
    rc = lease_store_open_timeout(&s, url, 1000);
    fuzz_check_rc("open", rc);
    if (rc == 0) {
        fuzz_store_run(s);
        lease_store_close(s);
    }
    return 0;
}
