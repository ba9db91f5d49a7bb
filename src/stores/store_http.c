/*
 * stores/store_http.c - the HTTP client of the stores that speak HTTP and
 * JSON (see store_http.h for what it guarantees).
 */
#define _GNU_SOURCE /* asprintf */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include <curl/curl.h>

#include "store_int.h"
#include "store_http.h"

/* Descriptors looked at for libcurl's own (see http_multi_new). */
#define HTTP_FD_SCAN 65536
/* The default answer cap. */
#define HTTP_ANSWER_MAX ((size_t)4 << 20)

struct lease__http {
    CURL *curl;
    CURLM *multi;
    const lease_store *store;   /* for the lookup's messages */
    char *authority;            /* "host:port" of every request */
    lease__http_name name;      /* its addresses, looked up by lease */
};

typedef struct {
    char *data;
    size_t len, cap, max, scanned;
    int too_large, stopped;
    lease__http_line_fn on_line;
    void *arg;
    int64_t date_s;
    long retry_after_s;
    CURL *curl;         /* for the status of a stream's answer */
} http_body;

static pthread_once_t http_once = PTHREAD_ONCE_INIT;

static unsigned char *http_fd_snapshot(size_t *n);

/* libcurl's start-up may open files of its own without O_CLOEXEC (the
 * TLS key log that $SSLKEYLOGFILE asks for): whatever appeared while it
 * ran is made close-on-exec, so that no child inherits it. */
static void http_start(void)
{
    size_t n, i;
    unsigned char *before = http_fd_snapshot(&n), *after;
    int flags;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    after = http_fd_snapshot(&n);
    for (i = 0; before && after && i < n * 8; i++)
        if ((after[i / 8] & (1u << (i % 8))) && !(before[i / 8] & (1u << (i % 8))) &&
            (flags = fcntl((int)i, F_GETFD)) >= 0)
            fcntl((int)i, F_SETFD, flags | FD_CLOEXEC);
    free(before);
    free(after);
}

/* Hand a stream's complete lines to its reader; 1 when it says stop. */
static int http_lines(http_body *b)
{
    char *nl;

    while ((nl = memchr(b->data + b->scanned, '\n', b->len - b->scanned))) {
        size_t at = b->scanned, n = (size_t)(nl - b->data) - at;

        b->scanned = at + n + 1;
        if (n > 0 && b->on_line(b->data + at, n, b->arg)) {
            b->stopped = 1;
            return 1;
        }
    }
    return 0;
}

/* The status of the answer whose body arrives (its headers came first). */
static int http_status_2xx(const http_body *b)
{
    long status = 0;

    curl_easy_getinfo(b->curl, CURLINFO_RESPONSE_CODE, &status);
    return status >= 200 && status < 300;
}

static size_t http_on_data(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    http_body *b = userdata;
    size_t n = size * nmemb;

    if (b->on_line && b->scanned > 0) {
        /* A stream keeps only what it has not read yet: the cap is then
         * on one line, not on the life of the watch. */
        memmove(b->data, b->data + b->scanned, b->len - b->scanned);
        b->len -= b->scanned;
        b->scanned = 0;
    }
    if (n > b->max || b->len > b->max - n) {
        b->too_large = 1;
        return 0; /* abort the transfer */
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p;

        if (cap > b->max + 1)
            cap = b->max + 1;
        if ((p = realloc(b->data, cap)) == NULL)
            return 0;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    b->data[b->len] = '\0';
    if (b->on_line && !http_status_2xx(b)) {
        /* An error answer to a stream (a watch refused with 401, 403,
         * 429...) is no event: it is kept whole, for the status. */
        b->on_line = NULL;
    }
    if (b->on_line && http_lines(b))
        return 0; /* abort the transfer: the reader has what it waited for */
    return n;
}

/* Date and Retry-After: the server's clock (Kubernetes' expiry rule reads
 * it) and how long a 429 asks to wait. */
static size_t http_on_header(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    http_body *b = userdata;
    size_t n = size * nmemb;
    char line[256];

    if (n >= sizeof(line))
        return n;
    memcpy(line, ptr, n);
    line[n] = '\0';
    line[strcspn(line, "\r\n")] = '\0';
    if (strncasecmp(line, "Date:", 5) == 0) {
        time_t t = curl_getdate(line + 5, NULL);
        b->date_s = t > 0 ? (int64_t)t : -1;
    } else if (strncasecmp(line, "Retry-After:", 12) == 0) {
        const char *p = line + 12, *digits;
        long v = 0;

        while (*p == ' ' || *p == '\t')
            p++;
        digits = p;
        /* Seconds only (the HTTP-date form is not used by Kubernetes);
         * at least one digit: an empty value is no advice. */
        while (*p >= '0' && *p <= '9' && v < 100000)
            v = v * 10 + (*p++ - '0');
        b->retry_after_s = *p == '\0' && p > digits ? v : -1;
    }
    return n;
}

/* libcurl's sockets are made close-on-exec from the start (no window
 * between socket() and fcntl()). */
static curl_socket_t http_open_socket(void *clientp, curlsocktype purpose,
                                      struct curl_sockaddr *addr)
{
    (void)clientp;
    (void)purpose;
    return socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
}

/* The fds in /proc/self/fd, as a bitmap of `*n` bytes (NULL if unreadable). */
static unsigned char *http_fd_snapshot(size_t *n)
{
    DIR *d = opendir("/proc/self/fd");
    unsigned char *map = calloc(HTTP_FD_SCAN / 8, 1);
    struct dirent *e;

    *n = HTTP_FD_SCAN / 8;
    while (d && map && (e = readdir(d)) != NULL) {
        long fd = strtol(e->d_name, NULL, 10);

        if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && fd >= 0 && fd < HTTP_FD_SCAN &&
            fd != dirfd(d))
            map[fd / 8] |= (unsigned char)(1u << (fd % 8));
    }
    if (d)
        closedir(d);
    return map;
}

/*
 * A multi handle whose descriptors are close-on-exec. libcurl 7.x makes a
 * socketpair in every multi handle (its "wakeup" pair) without
 * SOCK_CLOEXEC, and no option reaches it: so the Unix sockets that
 * appeared while curl_multi_init ran are marked. (Another thread creating
 * a Unix socket at that very moment would get the flag too; none in this
 * library or the CLI does.)
 */
static CURLM *http_multi_new(void)
{
    size_t n, i;
    unsigned char *before = http_fd_snapshot(&n), *after;
    CURLM *m = curl_multi_init();

    after = http_fd_snapshot(&n);
    for (i = 0; m && before && after && i < n * 8; i++) {
        int fd = (int)i, domain = 0, flags;
        socklen_t len = sizeof(domain);

        if (!(after[i / 8] & (1u << (i % 8))) || (before[i / 8] & (1u << (i % 8))))
            continue;
        if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 &&
            domain == AF_UNIX && (flags = fcntl(fd, F_GETFD)) >= 0)
            fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
    }
    free(before);
    free(after);
    return m;
}

lease__http *lease__http_new(const lease_store *store, const char *authority)
{
    lease__http *h = calloc(1, sizeof(*h));

    pthread_once(&http_once, http_start);
    if (h) {
        h->store = store;
        h->authority = strdup(authority);
    }
    if (h && (h->authority == NULL || (h->curl = curl_easy_init()) == NULL ||
              (h->multi = http_multi_new()) == NULL)) {
        lease__http_free(h);
        h = NULL;
    }
    return h;
}

void lease__http_free(lease__http *h)
{
    if (h == NULL)
        return;
    if (h->curl)
        curl_easy_cleanup(h->curl);
    if (h->multi)
        curl_multi_cleanup(h->multi);
    free(h->authority);
    lease__net_name_clear(&h->name.name);
    free(h);
}

/* Run the easy handle on the multi handle (whose descriptors are
 * close-on-exec, unlike curl_easy_perform's own). curl ends the transfer
 * at its CURLOPT_TIMEOUT_MS; `hard_end` only guards this loop. */
static CURLcode http_run(lease__http *h, int64_t hard_end)
{
    CURLcode res = CURLE_OPERATION_TIMEDOUT;
    int running = 1, done = 0, left;

    if (curl_multi_add_handle(h->multi, h->curl) != CURLM_OK)
        return CURLE_FAILED_INIT;
    while (!done && lease_clock_ns() < hard_end) {
        CURLMsg *msg;
        CURLMcode mc = curl_multi_perform(h->multi, &running);

        while ((msg = curl_multi_info_read(h->multi, &left)) != NULL)
            if (msg->msg == CURLMSG_DONE && msg->easy_handle == h->curl) {
                res = msg->data.result;
                done = 1;
            }
        if (mc != CURLM_OK ||
            (!done && curl_multi_poll(h->multi, NULL, 0, 100, NULL) != CURLM_OK)) {
            res = CURLE_FAILED_INIT;
            break;
        }
    }
    curl_multi_remove_handle(h->multi, h->curl);
    return res;
}

/* The headers of a request (NULL when out of memory). The token is in one
 * header, copied into the list (which lease__http_headers_free wipes);
 * the header built for it is wiped at once. */
static struct curl_slist *http_headers(const lease__http_req *r)
{
    struct curl_slist *hdr = curl_slist_append(NULL, "Accept: application/json"), *t;
    char ct[128];

    if (hdr && r->content_type) {
        snprintf(ct, sizeof(ct), "Content-Type: %s", r->content_type);
        if ((t = curl_slist_append(hdr, ct)) == NULL)
            goto fail;
    }
    /* No "Expect: 100-continue" for a larger body: a round trip more, or
     * a second's wait on a server that does not answer it. */
    if (hdr && r->body && (t = curl_slist_append(hdr, "Expect:")) == NULL)
        goto fail;
    if (hdr && r->bearer) {
        char *auth = lease__http_auth_header("Bearer ", r->bearer);

        t = auth ? curl_slist_append(hdr, auth) : NULL;
        lease__free_secret(auth);
        if (t == NULL)
            goto fail;
    }
    return hdr;
fail:
    lease__http_headers_free(hdr);
    return NULL;
}

static void http_setopts(CURL *c, const lease__http_req *r, struct curl_slist *hdr,
                         http_body *b, int64_t left_ms)
{
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, r->url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, r->method);
    if (r->body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, r->body);
    } else if (strcmp(r->method, "GET") == 0) {
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    }
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, http_on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, http_on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, b);
    curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, http_open_socket);
    /* The whole request, connect included, within what is left of the
     * operation's deadline. */
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)left_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)left_ms);
#if LIBCURL_VERSION_NUM >= 0x075700
    /* At the timeout, leave a name lookup still running on curl's resolver
     * thread behind (the thread frees its own part when it ends) rather
     * than wait for it: the lookup is bounded by the call's timeout too. */
    curl_easy_setopt(c, CURLOPT_QUICK_EXIT, 1L);
#endif
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    if (!r->on_line)
        curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)b->max);
    /* The server is reached directly: a proxy from the environment would
     * see every owner and token (and could answer for the server). */
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    if (r->cacert)
        curl_easy_setopt(c, CURLOPT_CAINFO, r->cacert);
}

/* A request of the easy handle ended with cc: may any of it have reached
 * the server? Told by the bytes of request sent, not by the connect time
 * (0 on a reused connection too). */
static int http_sent(CURL *c, CURLcode cc)
{
    long request_size = 0;

    if (cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST ||
        cc == CURLE_SSL_CONNECT_ERROR)
        return 0;
    curl_easy_getinfo(c, CURLINFO_REQUEST_SIZE, &request_size);
    return cc != CURLE_OPERATION_TIMEDOUT || request_size > 0;
}

static int http_failed(CURLcode cc, int sent, const http_body *b, const char *store,
                       const char *what, const char *where)
{
    const char *unknown = sent ? " (the outcome is unknown)" : "";

    if (b->too_large || cc == CURLE_FILESIZE_EXCEEDED)
        return lease__seterr(LEASE_ESTORE, "%s %s on %s: answer too large: more than "
                             "%zu bytes%s", store, what, where, b->max, unknown);
    if (cc == CURLE_OPERATION_TIMEDOUT)
        return lease__seterr(sent ? LEASE_ESTORE : LEASE_ETIMEOUT,
                             "%s %s on %s: timed out%s", store, what, where,
                             sent ? " waiting for the answer (the outcome is unknown)"
                                  : " before the request was sent");
    /* curl_easy_strerror() is a fixed text per code: it never echoes the
     * URL or a header. */
    return lease__seterr(LEASE_ESTORE, "%s %s on %s: %s%s", store, what, where,
                         curl_easy_strerror(cc), unknown);
}

int lease__http_do(lease__http_answer *a, int *sent, lease__http *h,
                   const lease__http_req *r, const char *store, const char *what,
                   const char *where)
{
    http_body b = { NULL, 0, 0, r->max ? r->max : HTTP_ANSWER_MAX, 0, 0, 0,
                    r->on_line, r->arg, -1, -1, h->curl };
    int64_t left_ms = (r->end_ns - lease_clock_ns()) / 1000000;
    struct curl_slist *hdr, *resolve = NULL;
    CURLcode cc;
    int rc = 0;

    memset(a, 0, sizeof(*a));
    a->date_s = a->retry_after_s = -1;
    *sent = 0;
    /* The server's addresses (lease__http_resolve); what the lookup took
     * is the request's no more. */
    if (left_ms > 0 &&
        (rc = lease__http_resolve(&resolve, &h->name, h->store, h->authority, r->end_ns)) < 0)
        return rc;
    if ((left_ms = (r->end_ns - lease_clock_ns()) / 1000000) <= 0)
        return lease__seterr(LEASE_ETIMEOUT, "%s %s on %s: the call's timeout ran out "
                             "before the request was sent", store, what, where);
    if ((hdr = http_headers(r)) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    http_setopts(h->curl, r, hdr, &b, left_ms);
    if (resolve)
        curl_easy_setopt(h->curl, CURLOPT_RESOLVE, resolve);
    cc = http_run(h, lease_clock_ns() + (left_ms + 2000) * 1000000);
    lease__http_headers_free(hdr);
    *sent = http_sent(h->curl, cc);
    a->date_s = b.date_s;
    a->retry_after_s = b.retry_after_s;
    if (b.stopped) {
        a->stopped = 1;
    } else if (r->on_line && cc == CURLE_OPERATION_TIMEDOUT && !b.too_large) {
        rc = LEASE_ETIMEOUT; /* the stream ran to its deadline */
    } else if (cc != CURLE_OK) {
        rc = http_failed(cc, *sent, &b, store, what, where);
    } else {
        curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, &a->status);
        a->data = b.data;
        a->len = b.len;
        b.data = NULL;
    }
    free(b.data);
    return rc;
}

void lease__http_answer_free(lease__http_answer *a)
{
    free(a->data);
    a->data = NULL;
    a->len = 0;
}

int lease__http_client_version(char *buf, size_t size)
{
    const curl_version_info_data *c = curl_version_info(CURLVERSION_NOW);

    return snprintf(buf, size, "libcurl %s", c && c->version ? c->version : "?");
}
