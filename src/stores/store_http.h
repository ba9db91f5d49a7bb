/*
 * store_http.h - the HTTP client the stores that speak HTTP+JSON share
 * (libcurl): one easy handle on one multi handle per store connection,
 *  - every request bounded as a whole (connect included) by a deadline on
 *    lease_clock_ns(), which the store sets once per operation;
 *  - every descriptor close-on-exec (libcurl's sockets and the wake-up
 *    socketpair of its multi handle), so a child of `lease run` inherits
 *    no connection to the store;
 *  - an answer size cap, so a hostile server cannot grow the process;
 *  - no proxy from the environment (it would see every owner and token);
 *  - an optional CA file and Bearer token; the token is only ever put in
 *    the request's header, and the messages here never show it (they name
 *    the redacted URL the caller passes and curl's fixed texts);
 *  - line-by-line streaming for watches.
 * What a status means is the store's business: a completed exchange is 0
 * with the status, the body and the Date and Retry-After headers.
 */
#ifndef LEASE_STORE_HTTP_H
#define LEASE_STORE_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <curl/curl.h>

#include "lease_int.h"

typedef struct lease__http lease__http;

/* Called for each complete line of a streamed answer (no newline, not
 * NUL-terminated); non-zero stops the transfer and the request is 0. */
typedef int (*lease__http_line_fn)(const char *line, size_t n, void *arg);

typedef struct lease__http_req {
    const char *method;       /* "GET", "POST", "PUT", "PATCH", "DELETE" */
    const char *url;          /* full URL; never shown in a message */
    const char *content_type; /* NULL: none sent */
    const char *body;         /* NULL: none */
    size_t body_len;
    const char *bearer;       /* NULL: no Authorization header */
    const char *cacert;       /* NULL: the system's CAs */
    size_t max;               /* answer cap in bytes (a stream: per line) */
    int64_t end_ns;           /* deadline on lease_clock_ns() */
    lease__http_line_fn on_line; /* non-NULL: a stream */
    void *arg;
} lease__http_req;

typedef struct lease__http_answer {
    long status;
    char *data;          /* NUL-terminated, malloc'ed (free it); NULL if empty */
    size_t len;
    int64_t date_s;      /* the Date header as Unix seconds, -1 without */
    long retry_after_s;  /* the Retry-After header in seconds, -1 without */
    int stopped;         /* a stream's reader stopped it */
} lease__http_answer;

/* NULL when out of memory. Starts libcurl once per process. Every request
 * goes to authority ("host:port" of its URLs), whose name lease looks up
 * (lease__net_name_entry; `store` names it in messages), not curl. */
lease__http *lease__http_new(const lease_store *store, const char *authority);
void lease__http_free(lease__http *h);

/*
 * One request. 0 when an answer came (any status: a->status) or when a
 * stream's reader stopped it (a->stopped). LEASE_ETIMEOUT when the
 * deadline passed first (for a stream: it ran to its deadline, no
 * message), LEASE_ESTORE for any other failure, with "<store> <what> on
 * <where>: ..." as the message;
 * *sent says whether any of the request may have reached the server
 * (then it may have been applied).
 */
int lease__http_do(lease__http_answer *a, int *sent, lease__http *h,
                   const lease__http_req *r, const char *store, const char *what,
                   const char *where);

void lease__http_answer_free(lease__http_answer *a);

/* "Authorization: " scheme token, malloc'ed (NULL when out of memory):
 * built here rather than by asprintf, which leaves copies of what it
 * formats in memory it frees unwiped. Free it with lease__free_secret. */
static inline char *lease__http_auth_header(const char *scheme, const char *token)
{
    static const char name[] = "Authorization: ";
    size_t a = sizeof(name) - 1, b = strlen(scheme), c = strlen(token);
    char *h = malloc(a + b + c + 1);

    if (h == NULL)
        return NULL;
    memcpy(h, name, a);
    memcpy(h + a, scheme, b);
    memcpy(h + a + b, token, c + 1);
    return h;
}

/* Free a header list, wiping each header first: curl_slist_append keeps
 * its own copy of an Authorization header, the token in it. Shared with
 * etcd's requests, which build their headers themselves. */
static inline void lease__http_headers_free(struct curl_slist *hdr)
{
    struct curl_slist *t;

    for (t = hdr; t; t = t->next)
        if (t->data)
            explicit_bzero(t->data, strlen(t->data));
    curl_slist_free_all(hdr);
}

/* A name of the store's URLs for curl: its addresses, looked up by lease
 * (lease__net_name_entry), as the one-entry list CURLOPT_RESOLVE takes, so
 * that curl looks no name up itself (its own lookup would start a thread
 * per request while the resolver hangs, each left running at the
 * timeout; lease's is one per name, and its late answer serves). */
typedef struct lease__http_name {
    lease__net_name name;
    struct curl_slist node;
} lease__http_name;

/* *list: what to give CURLOPT_RESOLVE for authority ("host:port"), NULL
 * for a numeric address (nothing to look up); valid until the next call on
 * n. A failure is lease__net_name_entry's (the message set). */
static inline int lease__http_resolve(struct curl_slist **list, lease__http_name *n,
                                      const lease_store *s, const char *authority,
                                      int64_t end)
{
    const char *entry;
    int rc = lease__net_name_entry(&entry, &n->name, s, authority, end);

    *list = NULL;
    if (rc < 0)
        return rc;
    n->node.data = (char *)entry;
    n->node.next = NULL;
    if (entry)
        *list = &n->node;
    return 0;
}

/* "libcurl 7.88.1" as linked at run time. */
int lease__http_client_version(char *buf, size_t size);

#endif
