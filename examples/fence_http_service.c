/*
 * fence_http_service.c - a tiny HTTP service that keeps its own state and
 * fences every write itself, with lease_fence_local.
 *
 *   usage: fence_http_service [--port N] [--marks FILE] [--unfenced]
 *
 *   PUT /data/NAME   body: the value. Headers:
 *                      Lease-Key: <key>      the lease the writer holds
 *                      Lease-Token: <token>  its fencing token
 *                    200 stored; 409 Conflict when the token is below the
 *                    key's mark (the body says the mark); 400 when a header
 *                    is missing or bad; 413 for a body over 64 KiB.
 *   GET /data/NAME   200 with the value, 404 if never written.
 *
 * The mark is kept per lease key: tokens of one key are one sequence, and
 * every NAME written under a key is protected by that key's generations.
 * A NAME belongs to the key that first wrote it: a write to it under
 * another key is refused with 409 (else a stale holder could write under
 * a fresh key, whose mark is still empty).
 * A client under `lease run KEY` writes with
 *   curl -X PUT -H "Lease-Key: $LEASE_KEY" -H "Lease-Token: $LEASE_TOKEN" \
 *        --data-binary @file http://127.0.0.1:PORT/data/NAME
 * and a holder that was paused past its lease, after another took the key
 * and wrote, gets 409 instead of overwriting the newer value.
 *
 * It listens on 127.0.0.1 only (port 0, the default: any free port) and
 * prints "listening on 127.0.0.1:PORT" once it accepts connections. The
 * values live in memory; --unfenced accepts every write without a check
 * (the control run: what a service without the fence lets through);
 * --marks FILE keeps the marks in a file (a service
 * whose data outlives the process must keep its marks as long). SIGINT or
 * SIGTERM stops it. It uses the public API only.
 */
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease.h"

#define BODY_MAX (64 * 1024)
#define NAME_MAX_LEN 128

typedef struct item {
    struct item *next;
    char name[NAME_MAX_LEN + 1];
    char key[LEASE_KEY_MAX + 1];  /* the lease key that fences it */
    char *value;
    size_t len;
    uint64_t token;
} item;

static lease_fence_local *fence;
static int unfenced; /* --unfenced: the control, no check at all */
static item *items;
/* The check and the write it guards, as one step: a check that passed must
 * not be overtaken by a newer writer before its own write lands. */
static pthread_mutex_t write_mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
    char *body;
    size_t len;
    int too_big;
} upload;

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *fmt, ...)
{
    char text[512];
    struct MHD_Response *r;
    enum MHD_Result ret;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/plain");
    ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

/* Names are kept to [A-Za-z0-9._-]: they are echoed in replies. */
static int name_ok(const char *name)
{
    size_t n = strlen(name);

    return n >= 1 && n <= NAME_MAX_LEN &&
           strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                        "0123456789._-") == n;
}

static item *find(const char *name)
{
    item *it;

    for (it = items; it; it = it->next)
        if (strcmp(it->name, name) == 0)
            return it;
    return NULL;
}

static int store_value(const char *name, const char *key, const upload *u,
                       uint64_t token)
{
    item *it = find(name);
    char *copy = malloc(u->len + 1);

    if (copy == NULL)
        return -1;
    if (u->len)
        memcpy(copy, u->body, u->len);
    if (it == NULL) {
        if ((it = calloc(1, sizeof(*it))) == NULL) {
            free(copy);
            return -1;
        }
        snprintf(it->name, sizeof(it->name), "%s", name);
        snprintf(it->key, sizeof(it->key), "%s", key);
        it->next = items;
        items = it;
    }
    free(it->value);
    it->value = copy;
    it->len = u->len;
    it->token = token;
    return 0;
}

static enum MHD_Result handle_put(struct MHD_Connection *c, const char *name, upload *u)
{
    const char *key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Lease-Key");
    const char *tok = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Lease-Token");
    uint64_t token, mark = 0;
    item *it;
    int rc;

    if (u->too_big)
        return reply(c, MHD_HTTP_CONTENT_TOO_LARGE, "body over %d bytes\n", BODY_MAX);
    if (key == NULL || !lease_key_valid(key))
        return reply(c, MHD_HTTP_BAD_REQUEST, "missing or bad Lease-Key header\n");
    if (tok == NULL || lease_parse_token(&token, tok) < 0)
        return reply(c, MHD_HTTP_BAD_REQUEST,
                     "missing or bad Lease-Token header: 1 .. 2^63-1\n");
    pthread_mutex_lock(&write_mu);
    if (!unfenced && (it = find(name)) != NULL && strcmp(it->key, key) != 0) {
        pthread_mutex_unlock(&write_mu);
        return reply(c, MHD_HTTP_CONFLICT, "%s is fenced by another lease key\n", name);
    }
    rc = unfenced ? 0 : lease_fence_local_check(&mark, fence, key, token);
    if (rc == 0 && store_value(name, key, u, token) < 0)
        rc = LEASE_ENOMEM;
    pthread_mutex_unlock(&write_mu);
    if (rc == LEASE_ESTALE)
        return reply(c, MHD_HTTP_CONFLICT, "stale token %llu: the mark is %llu\n",
                     (unsigned long long)token, (unsigned long long)mark);
    if (rc < 0)
        return reply(c, MHD_HTTP_SERVICE_UNAVAILABLE, "not stored: %s\n",
                     lease_strerror(rc));
    return reply(c, MHD_HTTP_OK, "stored %s at token %llu\n", name,
                 (unsigned long long)token);
}

static enum MHD_Result handle_get(struct MHD_Connection *c, const char *name)
{
    struct MHD_Response *r;
    enum MHD_Result ret;
    item *it;

    pthread_mutex_lock(&write_mu);
    it = find(name);
    r = it ? MHD_create_response_from_buffer(it->len, it->value, MHD_RESPMEM_MUST_COPY)
           : NULL;
    pthread_mutex_unlock(&write_mu);
    if (it == NULL)
        return reply(c, MHD_HTTP_NOT_FOUND, "no such name\n");
    if (r == NULL)
        return MHD_NO;
    ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* MHD calls this first with no body (set up `upload`), then once per piece
 * of the body, then once more with nothing left: the request is whole. */
static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version,
                              const char *data, size_t *data_size, void **state)
{
    upload *u = *state;
    const char *name = strncmp(url, "/data/", 6) == 0 ? url + 6 : NULL;

    (void)cls;
    (void)version;
    if (u == NULL) {
        if ((u = calloc(1, sizeof(*u))) == NULL)
            return MHD_NO;
        *state = u;
        return MHD_YES;
    }
    if (*data_size > 0) {
        if (u->len + *data_size > BODY_MAX) {
            u->too_big = 1;
        } else {
            char *b = realloc(u->body, u->len + *data_size);
            if (b == NULL)
                return MHD_NO;
            memcpy(b + u->len, data, *data_size);
            u->body = b;
            u->len += *data_size;
        }
        *data_size = 0;
        return MHD_YES;
    }
    if (name == NULL || !name_ok(name))
        return reply(c, MHD_HTTP_NOT_FOUND, "use /data/NAME, NAME of [A-Za-z0-9._-]\n");
    if (strcmp(method, "PUT") == 0)
        return handle_put(c, name, u);
    if (strcmp(method, "GET") == 0)
        return handle_get(c, name);
    return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "PUT or GET\n");
}

static void request_done(void *cls, struct MHD_Connection *c, void **state,
                         enum MHD_RequestTerminationCode toe)
{
    upload *u = *state;

    (void)cls;
    (void)c;
    (void)toe;
    if (u != NULL) {
        free(u->body);
        free(u);
        *state = NULL;
    }
}

static int usage(void)
{
    fprintf(stderr, "usage: fence_http_service [--port N] [--marks FILE] [--unfenced]\n");
    return 2;
}

int main(int argc, char **argv)
{
    struct sockaddr_in sa = { .sin_family = AF_INET };
    const char *marks = NULL;
    struct MHD_Daemon *d;
    const union MHD_DaemonInfo *info;
    sigset_t stop;
    long port = 0;
    int i, sig;

    for (i = 1; i < argc; i++) {
        char *end;
        if (strcmp(argv[i], "--port") == 0 && i + 1 < argc) {
            port = strtol(argv[++i], &end, 10);
            if (*argv[i] == '\0' || *end || port < 0 || port > 65535)
                return usage();
        } else if (strcmp(argv[i], "--marks") == 0 && i + 1 < argc) {
            marks = argv[++i];
        } else if (strcmp(argv[i], "--unfenced") == 0) {
            unfenced = 1;
        } else {
            return usage();
        }
    }
    if (lease_fence_local_open(&fence, marks) < 0) {
        fprintf(stderr, "fence_http_service: %s\n", lease_errmsg());
        return 1;
    }
    /* Blocked before MHD starts its thread, so that only sigwait gets them. */
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                         handle, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                         MHD_OPTION_NOTIFY_COMPLETED, request_done, NULL,
                         MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (d == NULL || (info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)) == NULL) {
        fprintf(stderr, "fence_http_service: cannot listen on 127.0.0.1:%ld\n", port);
        lease_fence_local_close(fence);
        return 1;
    }
    printf("listening on 127.0.0.1:%u\n", (unsigned)info->port);
    fflush(stdout);
    sigwait(&stop, &sig);
    MHD_stop_daemon(d);
    lease_fence_local_close(fence);
    while (items) {
        item *next = items->next;
        free(items->value);
        free(items);
        items = next;
    }
    return 0;
}
