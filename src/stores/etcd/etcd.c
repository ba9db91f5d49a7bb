/*
 * stores/etcd/etcd.c - etcd v3, over gRPC (libcurl's HTTP/2, messages by
 * etcd/pb.c) or through its JSON gateway (libcurl + jansson).
 *
 * URL: etcd://[user[:password]@]host:port[,host:port...][/prefix]
 *   (etcds:// for TLS)
 *   parameters for etcds: cacert=FILE, cert=FILE, key=FILE
 *   password_file=FILE: the user's password, from a file only its owner
 *   may read (chmod 600), so that it stays out of argv; one trailing
 *   newline is not part of it
 *   the prefix defaults to /lease/
 *   transport=grpc (the default): every call but the watch over gRPC,
 *   built as the gateway's JSON and transcoded at the edge (etcd/pb.h), so
 *   the rest of this file is one for both; transport=json: every call to
 *   the gateway
 *   Proxies from the environment (http_proxy ...) are never used.
 *
 * With a user, the store authenticates (/v3/auth/authenticate) at open and
 * sends the token with every request; a token that expired is renewed
 * once and the request sent again (etcd refuses it before applying it).
 *
 * Key layout under the prefix P (K a lease key, R a resource, N a name):
 *   P lease/K      value: the owner; attached to an etcd lease with the ttl
 *                  (one that no other key of the handle is on: see Pool,
 *                  below; or a session's shared one: below).
 *                  Its create_revision is the fencing token: the cluster's
 *                  revision when the key was created, strictly increasing.
 *   P meta/K       value: "<ttl_ms>\n<label>", same etcd lease
 *   P shared/I     empty; attached to etcd lease I (16 hex digits) itself,
 *                  so present exactly while I is a session's shared lease
 *   P seen/K       empty, rewritten by every grant (its mod_revision is
 *                  the last token); no lease, kept forever, so a key
 *                  that was acquired once is never "not found"
 *   P fence/R      the resource's mark, 20 zero-padded digits so that
 *                  etcd's byte-wise compare is a numeric compare
 *   P data/N, P datatok/N   a guarded value and the token that wrote it
 *   P history/L/K/I  one per grant (lease/history.h), no etcd lease (it
 *                  outlives the lease): "<owner>\n<ttl_ms>\n<acquired_ms>
 *                  \n<label>"; its create_revision is the grant's token.
 *                  I is 16 hex digits, unique per grant and known before
 *                  the acquire txn, unlike the token: the id of an etcd
 *                  lease granted for this grant, or 64 random bits under
 *                  a lease that other grants had or have (the pool's, a
 *                  session's). Nothing reads I: entries are found and
 *                  ordered by their create_revision.
 *   P ended/L/K/T  how grant T (20 zero-padded digits) ended:
 *                  "released\n<ms>" or "lost\n<ms>"; no etcd lease
 *   In both, L is K's length in 3 digits: keys may hold any byte but NUL,
 *   '/' included, so "history/a/" alone would also be a prefix of key
 *   "a/b"'s entries; "history/001/a/" cannot be ("a/b" is "003/a/b/").
 * `etcdctl get --prefix P` shows all of it.
 *
 * Expiry is etcd's lease TTL, in whole seconds with a server-side minimum:
 * the grant reports the TTL etcd actually granted, and the core's local
 * deadline uses that. Renew is a keep-alive of the etcd lease (which
 * restores its granted TTL).
 *
 * Pool (plain grants): a release leaves the key's etcd lease idle, with no
 * key on it, instead of revoking it, and the handle's next acquire of the
 * same TTL (whole seconds) keeps it alive and attaches its key to it
 * instead of granting one: a cycle is two raft writes (the acquire and
 * release txns), not four (grant, txn, txn, revoke). A pooled lease is
 * lent to one grant at a time, so a key that is not renewed still expires
 * after its own ttl whatever the handle's other keys do. The keep-alive
 * is sent after the core read its clock, so the TTL it restores is a lower
 * bound of the server's expiry from then, as a new grant's; with time to
 * spare it goes beside the acquire txn, on a second connection
 * (etcd_pair). A lease whose acquire txn got no answer may carry the key:
 * it leaves the pool (it expires with the key); so does one that ended
 * while idle (keep-alive TTL 0), was revoked, or that a renew moved the
 * key off. POOL_MAX leases (idle or lent), of one process (fork); close
 * revokes the idle ones within POOL_CLOSE_MS, the rest expire.
 *
 * Sessions (share_lease): the session's handle attaches every key it
 * acquires to one etcd lease of the session's ttl, granted at its first
 * acquire and kept alive at each acquire (so each grant reports the full
 * TTL). renew_many is then one keep-alive, one LeaseTimeToLive (the
 * keys attached) and one range (the P lease/ keys written since the last
 * round) for the whole batch, whatever its size: a grant is kept while
 * its key is attached and is still the key the handle attached, with that
 * token (create_revision) and owner.
 * When the shared lease ends (expiry, revoke) every grant in it is lost,
 * and the next acquire grants a new one. A key attached to the shared
 * lease that no record holds (a release or acquire whose outcome is
 * unknown, an acquire that failed after its txn, a put by anyone else
 * with the lease's id) would live as long as the session: renew_many
 * deletes such orphans, up to ORPHANS_MAX a round, each in a txn that
 * checks it is still the key read and on the shared lease, with the end
 * marker a release writes. A release, from any handle,
 * revokes a key's etcd lease only when no P shared/ marker says it is a
 * session's; the marker is written in the same txn as the first key, so
 * whoever sees a key on the lease sees it too. Stores written before
 * sessions ignore the marker.
 *
 * History: the acquire txn that creates P lease/K also creates its
 * history entry, and the release txn writes its end marker, so neither can
 * be left out by a client that dies between requests. The acquire txn also
 * counts K's entries (a txn's reads see its own earlier writes); past
 * LEASE_HISTORY_KEEP + HISTORY_SLACK the acquirer deletes the oldest ones
 * and their markers (two more round trips, once every HISTORY_SLACK grants).
 * An entry without a marker that is not the newest expired (a later grant
 * needed the key free); etcd keeps no record of when, so its ended_ms is 0.
 * Times are the client's wall clock: etcd's KV API has no server clock.
 *
 * Endpoints: a request that cannot connect to one member goes to the next;
 * a request that reached a member but got no (or a failed) answer is
 * LEASE_ESTORE: authority uncertain, never success.
 */
#define _GNU_SOURCE /* asprintf */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <curl/curl.h>
#include <jansson.h>

#include "pb.h"
#include "stores/store_http.h"
#include "stores/store_int.h"

#define MAX_ENDPOINTS 16
#define PAD 20 /* digits of a zero-padded mark */
/* History entries past LEASE_HISTORY_KEEP before an acquire prunes: the
 * prune costs two round trips, so it runs once every HISTORY_SLACK grants. */
#define HISTORY_SLACK 20
/* Deletes in one prune txn, below etcd's --max-txn-ops (128 by default);
 * a longer backlog goes at the next grants. */
#define PRUNE_MAX 100
/* "<len>/<key>/<20 digits>" and its NUL. */
#define HNAME_SZ (LEASE_KEY_MAX + PAD + 8)
/* etcd leases a handle keeps for reuse by plain grants, idle or in use:
 * one per grant held at once through the handle is reused, more are
 * granted (and revoked at release) as before. */
#define POOL_MAX 16
/* The most a close spends revoking the idle ones (then they expire). */
#define POOL_CLOSE_MS 1000
/* A pooled lease's keep-alive goes beside the acquire txn only when the
 * lease has this much more than the timeout left. */
#define PAIR_MARGIN_MS 1000
/* How etcd_pool_take lent its lease; etcd_pair's answers. */
enum { TAKE_FRESH, TAKE_KEPT, TAKE_PAIR };
#define PAIR_AGAIN 1
#define PAIR_NO_TTL UINT64_MAX

typedef struct {
    lease_store parent;
    CURL *curl;
    CURL *curl2;                    /* a pooled lease's keep-alive beside an
                                       acquire txn (etcd_pair); NULL until then */
    CURLM *multi;                   /* runs s->curl and s->curl2: see etcd_multi_new */
    char *endpoints[MAX_ENDPOINTS]; /* "http://host:port" */
    int nendpoints;
    int current;                    /* the endpoint that last answered */
    int grpc;                       /* calls over gRPC (transport=grpc, the
                                       default), but for the watch */
    lease__http_name names[MAX_ENDPOINTS]; /* member i's addresses, looked
                                       up by lease (etcd_resolve) */
    struct curl_slist *resolve[MAX_ENDPOINTS]; /* names[i]'s for curl, NULL
                                       for a numeric address */
    char resolve_msg[256];          /* why the last etcd_resolve failed */
    unsigned char h2[MAX_ENDPOINTS]; /* a gRPC call to member i just completed
                                       over HTTP/2: its connection is cached */
    char *prefix;
    size_t prefix_len;
    char *cacert, *cert, *key;
    char *user, *password;          /* etcd's auth, NULL without */
    int password_from_file;         /* held with lease__secret_hold */
    char *token;                    /* etcd's auth token, NULL without */
    int auth_refused;               /* the last answer: invalid token */
    int64_t end_ns;                 /* the current operation's deadline */
    int64_t last_revision;          /* from the last busy acquire: watch from here */
    /* Session mode (share_lease): every key this handle acquires goes into
     * one etcd lease, granted at the first acquire and again after it
     * ended. `rec` holds what the handle attached to the current one: the
     * etcd lease lists the keys, not their tokens, so renew_many compares
     * the tokens here. */
    int shared;                     /* share_lease was called */
    uint64_t shared_ttl_ms;         /* the session's ttl */
    int64_t shared_id;              /* the current shared etcd lease, 0: none */
    int shared_marked;              /* its shared/ marker is written */
    struct shared_rec **rec;        /* hash table of shared_rec, rec_size slots */
    size_t rec_size, rec_count;
    unsigned rec_round;             /* renew_many's pass, for shared_rec.seen */
    int64_t shared_checked;         /* the revision up to which renew_many read
                                       the P lease/ keys written (etcd_shared_changes) */
    /* Plain grants' etcd leases that this handle granted (see Pool at
     * the top), valid in process pool_pid only. */
    struct pool_lease {
        int64_t id;                 /* 0: a free slot */
        int64_t ttl_s;              /* the TTL it was asked for: the pool's key */
        uint64_t granted_ms;        /* the TTL etcd granted, which a keep-alive restores */
        int64_t refreshed_ns;       /* lease_clock_ns before its last grant or keep-alive */
        int idle;                   /* no key of this handle is attached to it */
    } pool[POOL_MAX];
    pid_t pool_pid;
} etcd_store;

typedef struct pool_lease pool_lease;

/* One key attached to the handle's shared etcd lease, with the token and
 * owner it was acquired with. */
typedef struct shared_rec {
    struct shared_rec *next;
    uint64_t token;
    unsigned seen;                  /* the last renew_many that found it attached */
    char owner[LEASE_OWNER_BUFSZ];
    char key[];
} shared_rec;

/* A malformed answer, said the same way everywhere. */
#define etcd_malformed(what, ...) \
    lease__seterr(LEASE_ESTORE, "etcd " what ": malformed answer: " __VA_ARGS__)

/* ---- requests --------------------------------------------------------- */

/*
 * The largest answer read into memory: past it the transfer is aborted, so
 * a broken or hostile member cannot grow the holder's memory without bound
 * (a 64 MB body once took the RSS to 182 MB). etcd caps a request at
 * 1.5 MiB by default (--max-request-bytes), so an answer about one key is
 * far below ANSWER_MAX; a page of a list (PAGE_KVS keys) and a session's
 * keys are bigger, and a guarded value may be up to 64 MiB, 4/3 of that
 * as base64. What an answer may take to hold once decoded is bounded
 * apart (etcd/pb.h, lease__json_budget).
 */
#define ANSWER_MAX ((size_t)4 << 20)
#define LIST_ANSWER_MAX ((size_t)32 << 20)
/* Descriptors looked at for libcurl's own (see etcd_multi_new). */
#define ETCD_FD_SCAN 65536
#define DATA_ANSWER_MAX (LEASE__VALUE_MAX / 3 * 4 + ((size_t)1 << 20))

typedef struct {
    char *data;
    size_t len, cap;
    size_t max;     /* the cap of what is held at once; 0: ANSWER_MAX */
    int64_t end_ns; /* the call's deadline, which decoding the answer keeps */
    int too_large;
    /* Watch streams: stop once this returns non-zero for a message. */
    int (*on_message)(json_t *msg, void *arg);
    void *arg;
    int stop;
    size_t scanned;
    /* A gRPC call's answer: grpc-status (in the headers or the trailers)
     * and grpc-message, as etcd sent them. */
    int grpc;
    int has_status;
    long grpc_status;
    char *grpc_msg;                 /* percent-decoded: any byte */
    size_t grpc_msg_len;
    /* etcd answered with an error: an HTTP status other than 200, or a
     * gRPC status other than OK (etcd_answer). */
    int refused;
} body;

/* Read the complete lines of a watch stream; 1 to stop the transfer. */
static int etcd_stream_lines(body *b)
{
    char *nl;

    while ((nl = memchr(b->data + b->scanned, '\n', b->len - b->scanned))) {
        char err[160];
        size_t n = (size_t)(nl - b->data - b->scanned);
        lease__json_budget budget = lease__json_budget_of(LEASE__JSON_HOLD_ANY, n, b->end_ns);
        json_t *msg;

        /* A message that cannot be read is no release: the watch goes on
         * (to its deadline, when that is what stopped it). */
        lease__json_load(&msg, b->data + b->scanned, n, &budget, err, sizeof(err));
        b->scanned = (size_t)(nl - b->data) + 1;
        if (msg) {
            int stop = b->on_message(msg, b->arg);
            json_decref(msg);
            if (stop) {
                b->stop = stop;
                return 1;
            }
        }
    }
    return 0;
}

static size_t etcd_on_data(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    body *b = userdata;
    size_t n = size * nmemb, max = b->max ? b->max : ANSWER_MAX;

    if (b->on_message && b->scanned > 0) {
        /* A stream keeps only what it has not read yet: the cap is then
         * on one message, not on the life of the watch. */
        memmove(b->data, b->data + b->scanned, b->len - b->scanned);
        b->len -= b->scanned;
        b->scanned = 0;
    }
    if (n > max || b->len > max - n) {
        b->too_large = 1;
        return 0; /* abort the transfer */
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p;

        if (cap > max + 1)
            cap = max + 1;
        if ((p = realloc(b->data, cap)) == NULL)
            return 0;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    b->data[b->len] = '\0';
    if (b->on_message && etcd_stream_lines(b))
        return 0; /* abort the transfer */
    return n;
}

/* The largest grpc-message kept: all of it is checked for credentials
 * before it is cut for a message (etcd_answer); a longer one is withheld. */
#define GRPC_MESSAGE_MAX 8192

/* The value of header line `line` (n bytes) when it is header `name`
 * (its length `nlen`, with the colon): *v and its length, without the
 * spaces around it and the line's end. */
static int etcd_header_is(const char **v, size_t *k, const char *line, size_t n,
                          const char *name, size_t nlen)
{
    if (n < nlen || strncasecmp(line, name, nlen) != 0)
        return 0;
    *v = line + nlen;
    *k = n - nlen;
    while (*k > 0 && (**v == ' ' || **v == '\t'))
        (*v)++, (*k)--;
    while (*k > 0 && ((*v)[*k - 1] == '\r' || (*v)[*k - 1] == '\n' || (*v)[*k - 1] == ' '))
        (*k)--;
    return 1;
}

/* A gRPC call's headers and trailers (libcurl gives both here): its
 * grpc-status and grpc-message. A status that is not all digits is
 * taken as no status at all (a malformed answer). */
static size_t etcd_on_header(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    body *b = userdata;
    size_t n = size * nmemb, k;
    const char *v;

    if (etcd_header_is(&v, &k, ptr, n, "grpc-status:", 12)) {
        size_t i;

        /* Read within the k bytes (libcurl's line has no NUL), 4 digits at most. */
        b->grpc_status = 0;
        for (i = 0; i < k && i < 5 && v[i] >= '0' && v[i] <= '9'; i++)
            b->grpc_status = b->grpc_status * 10 + (v[i] - '0');
        b->has_status = k > 0 && k <= 4 && i == k;
        if (!b->has_status)
            b->grpc_status = -1;
    } else if (etcd_header_is(&v, &k, ptr, n, "grpc-message:", 13)) {
        free(b->grpc_msg);
        b->grpc_msg = NULL;
        if (k <= GRPC_MESSAGE_MAX)
            b->grpc_msg = lease__etcd_pb_message(v, k, &b->grpc_msg_len);
        else if ((b->grpc_msg = strdup("(longer than 8 KiB: withheld)")) != NULL)
            b->grpc_msg_len = strlen(b->grpc_msg);
    }
    return n;
}

/* libcurl's sockets are made close-on-exec from the start (no window
 * between socket() and fcntl()): a child of `lease run` must not inherit
 * the store's connection and write on it. */
static curl_socket_t etcd_open_socket(void *clientp, curlsocktype purpose,
                                      struct curl_sockaddr *addr)
{
    (void)clientp;
    (void)purpose;
    return socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
}

/*
 * The fds in /proc/self/fd, as a bitmap of `*n` bytes (NULL if unreadable).
 */
static unsigned char *etcd_fd_snapshot(size_t *n)
{
    DIR *d = opendir("/proc/self/fd");
    unsigned char *map = calloc(ETCD_FD_SCAN / 8, 1);
    struct dirent *e;

    *n = ETCD_FD_SCAN / 8;
    while (d && map && (e = readdir(d)) != NULL) {
        long fd = strtol(e->d_name, NULL, 10);

        /* The directory's own descriptor is closed again below. */
        if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && fd >= 0 && fd < ETCD_FD_SCAN &&
            fd != dirfd(d))
            map[fd / 8] |= (unsigned char)(1u << (fd % 8));
    }
    if (d)
        closedir(d);
    return map;
}

/* Mark close-on-exec the descriptors open in `after` but not in `before`
 * (etcd_fd_snapshot's, of n bytes): all of them, or the Unix sockets
 * alone (unix_only). */
static void etcd_fds_cloexec(const unsigned char *before, const unsigned char *after,
                             size_t n, int unix_only)
{
    size_t i;

    for (i = 0; before && after && i < n * 8; i++) {
        int fd = (int)i, domain = 0, flags;
        socklen_t len = sizeof(domain);

        if (!(after[i / 8] & (1u << (i % 8))) || (before[i / 8] & (1u << (i % 8))))
            continue;
        if (unix_only && (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 ||
                          domain != AF_UNIX))
            continue;
        if ((flags = fcntl(fd, F_GETFD)) >= 0)
            fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
    }
}

/*
 * A multi handle whose descriptors are close-on-exec. libcurl 7.x makes a
 * socketpair in every multi handle (its "wakeup" pair, also made inside
 * curl_easy_perform) without SOCK_CLOEXEC, and no option reaches it: so
 * the store makes its own multi handle once, and marks the Unix sockets
 * that appeared while curl_multi_init ran. (Another thread creating a Unix
 * socket without close-on-exec at that very moment would get the flag
 * too; none in this library or the CLI does.)
 */
static CURLM *etcd_multi_new(void)
{
    size_t n;
    unsigned char *before = etcd_fd_snapshot(&n), *after;
    CURLM *m = curl_multi_init();

    after = etcd_fd_snapshot(&n);
    if (m)
        etcd_fds_cloexec(before, after, n, 1);
    free(before);
    free(after);
    return m;
}

/*
 * How long to wait for the sockets. Over HTTP/2, libcurl 7.88 may read an
 * answer's frames into its own buffer and hand on only part of them: the
 * rest waits for the next curl_multi_perform, which no socket event will
 * bring, so every answer larger than a read (a LeaseTimeToLive with a
 * session's keys) took the whole wait, 100 ms. Once an answer has begun
 * (its status line is in), the wait is 1 ms; before, 100 ms, so that a
 * request that waits on etcd costs no CPU.
 */
static long etcd_poll_ms(CURL *const *h, int n, int grpc)
{
    long code = 0;
    int i;

    /* Not for the watch (the gateway's, HTTP/1.1), whose answer begins at
     * once and then waits, maybe for long. */
    for (i = 0; grpc && i < n; i++)
        if (curl_easy_getinfo(h[i], CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code != 0)
            return 1;
    return 100;
}

/* curl_easy_perform of the n (1 or 2) easy handles h at once, on the
 * store's own multi handle; res[i] is h[i]'s result. curl ends a transfer
 * at its CURLOPT_TIMEOUT_MS; `hard_end` only guards this loop. */
static void etcd_multi_run(etcd_store *s, CURL *const *h, CURLcode *res, int n,
                           int64_t hard_end, int grpc)
{
    int running = 1, done = 0, added = 0, left, i;

    while (added < n && curl_multi_add_handle(s->multi, h[added]) == CURLM_OK)
        added++;
    for (i = 0; i < n; i++)
        res[i] = added == n ? CURLE_OPERATION_TIMEDOUT : CURLE_FAILED_INIT;
    while (added == n && done < n && lease_clock_ns() < hard_end) {
        CURLMsg *msg;
        CURLMcode mc = curl_multi_perform(s->multi, &running);

        while ((msg = curl_multi_info_read(s->multi, &left)) != NULL)
            for (i = 0; i < n; i++)
                if (msg->msg == CURLMSG_DONE && msg->easy_handle == h[i]) {
                    res[i] = msg->data.result;
                    done++;
                }
        if (mc != CURLM_OK ||
            (done < n && curl_multi_poll(s->multi, NULL, 0, etcd_poll_ms(h, n, grpc), NULL) !=
                             CURLM_OK)) {
            for (i = 0; i < n; i++)
                res[i] = CURLE_FAILED_INIT;
            break;
        }
    }
    for (i = 0; i < added; i++)
        curl_multi_remove_handle(s->multi, h[i]);
}

static CURLcode etcd_multi_perform(etcd_store *s, int64_t hard_end, int grpc)
{
    CURLcode result;

    etcd_multi_run(s, &s->curl, &result, 1, hard_end, grpc);
    return result;
}

/* Did the request fail before anything was sent? Only then may it go to
 * another member: anything later may have been applied. */
static int etcd_not_sent(CURLcode c)
{
    return c == CURLE_COULDNT_CONNECT || c == CURLE_COULDNT_RESOLVE_HOST ||
           c == CURLE_SSL_CONNECT_ERROR;
}

/*
 * The HTTP version of a gRPC call to member idx. Without TLS, HTTP/2 from
 * the first byte on a new connection (etcd tells gRPC from its gateway by
 * the preface and content-type): "prior knowledge". But libcurl 7.88
 * (Debian 12's) fails every call that reuses a prior-knowledge connection
 * ("Error in the HTTP2 framing layer": curl's fix came after 7.88.1), so a
 * call on a connection known to be there (s->h2) asks for HTTP/2 "over TLS"
 * instead, which reuses the cached HTTP/2 connection as it is; if that is
 * gone (etcd closed it), libcurl opens an HTTP/1.1 one, and the call meets
 * the gateway, which answers 404 and applies nothing: etcd_perform then
 * sends it again the first way (etcd_grpc_again). With TLS, ALPN chooses
 * HTTP/2 and every call asks the same.
 */
static int etcd_tls(const etcd_store *s, int idx)
{
    return strncmp(s->endpoints[idx], "https:", 6) == 0;
}

static void etcd_h2_version(etcd_store *s, CURL *c, int idx)
{
    if (etcd_tls(s, idx) || s->h2[idx]) {
        curl_easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
        return;
    }
    curl_easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE);
    curl_easy_setopt(c, CURLOPT_FRESH_CONNECT, 1L);
}

/* A gRPC call to member idx completed (cc) on easy handle c with answer
 * b: was it over HTTP/2 (its connection is cached for the next), or did it
 * reach the gateway over HTTP/1.1 (not applied: send it again,
 * etcd_h2_version)? */
static int etcd_grpc_again(etcd_store *s, CURL *c, CURLcode cc, const body *b, int idx)
{
    long version = 0, status = 0;
    int i;

    curl_easy_getinfo(c, CURLINFO_HTTP_VERSION, &version);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    s->h2[idx] = cc == CURLE_OK && version == CURL_HTTP_VERSION_2_0;
    /* One connection is cached (CURLMOPT_MAXCONNECTS): the others' are
     * gone. */
    for (i = 0; s->h2[idx] && i < s->nendpoints; i++)
        if (i != idx)
            s->h2[i] = 0;
    /* Only the gateway's 404 (no such path) says nothing was applied:
     * anything else that answered HTTP/1.1 is left to etcd_answer. */
    return cc == CURLE_OK && version != CURL_HTTP_VERSION_2_0 && status == 404 &&
           !b->has_status && !etcd_tls(s, idx);
}

/* The options of one request to member idx (its payload of `len` bytes);
 * a request over gRPC when b->grpc. curl_easy_reset() clears them all. */
static void etcd_setopts(etcd_store *s, CURL *c, int idx, const char *url,
                         struct curl_slist *hdr, const void *payload, size_t len, body *b,
                         int64_t left_ms, int64_t connect_ms)
{
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, payload);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, etcd_on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    if (b->grpc) {
        /* The two requests of etcd_pair share the connection rather than
         * open a second one. */
        etcd_h2_version(s, c, idx);
        curl_easy_setopt(c, CURLOPT_PIPEWAIT, 1L);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, etcd_on_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, b);
    } else if (s->grpc) {
        /* The watch, the one call left on the gateway (HTTP/1.1): on a
         * connection of its own, closed after, so that no HTTP/1.1
         * connection waits in the cache for a gRPC call to find. */
        curl_easy_setopt(c, CURLOPT_FRESH_CONNECT, 1L);
        curl_easy_setopt(c, CURLOPT_FORBID_REUSE, 1L);
    }
    curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, etcd_open_socket);
    if (s->resolve[idx])
        curl_easy_setopt(c, CURLOPT_RESOLVE, s->resolve[idx]);
    /* The whole request, connect included, within what is left of the
     * call's own deadline. */
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)left_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)connect_ms);
#if LIBCURL_VERSION_NUM >= 0x075700
    /* At the timeout, leave a name lookup still running on curl's resolver
     * thread behind (the thread frees its own part when it ends) rather
     * than wait for it: the lookup is bounded by the call's timeout too. */
    curl_easy_setopt(c, CURLOPT_QUICK_EXIT, 1L);
#endif
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE,
                     (curl_off_t)(b->max ? b->max : ANSWER_MAX));
    /* The cluster is reached directly: http_proxy, https_proxy and
     * ALL_PROXY in the environment are for the user's web traffic, and a
     * proxy would see every owner and token (and could answer for etcd). */
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    if (s->cacert)
        curl_easy_setopt(c, CURLOPT_CAINFO, s->cacert);
    if (s->cert)
        curl_easy_setopt(c, CURLOPT_SSLCERT, s->cert);
    if (s->key)
        curl_easy_setopt(c, CURLOPT_SSLKEY, s->key);
}

/* The headers of a request to `path` (NULL when out of memory), over gRPC
 * or to the gateway. etcd reads the token from the "authorization"
 * metadata of a gRPC call as from the gateway's header. */
static struct curl_slist *etcd_headers(const etcd_store *s, const char *path, int grpc)
{
    struct curl_slist *hdr = curl_slist_append(NULL, grpc ? "Content-Type: application/grpc"
                                                          : "Content-Type: application/json");
    char *auth = NULL;

    if (hdr && grpc && curl_slist_append(hdr, "TE: trailers") == NULL) {
        curl_slist_free_all(hdr);
        return NULL;
    }

    if (hdr && s->token && strcmp(path, "/v3/auth/authenticate") != 0) {
        struct curl_slist *h = NULL;

        if ((auth = lease__http_auth_header("", s->token)) != NULL)
            h = curl_slist_append(hdr, auth);
        lease__free_secret(auth);
        if (h == NULL) {
            lease__http_headers_free(hdr);
            hdr = NULL;
        }
    }
    return hdr;
}

/* A request of easy handle c ended with cc: may any of it have reached the
 * member (then it may have been applied)? A member that is down drops the
 * connection attempt instead of refusing it. Whether a timeout came before
 * anything was sent is told by the bytes of request sent, not by the
 * connect time, which is 0 on a reused keep-alive connection too. */
static int etcd_sent(CURL *c, CURLcode cc)
{
    long request_size = 0;
    curl_off_t uploaded = 0;

    /* Over HTTP/2 the body's bytes count, the headers' may not. */
    curl_easy_getinfo(c, CURLINFO_REQUEST_SIZE, &request_size);
    curl_easy_getinfo(c, CURLINFO_SIZE_UPLOAD_T, &uploaded);
    /* Bytes that went out count whatever the error: libcurl may have sent
     * the request on a reused connection that died, then failed to connect
     * again for its own retry. */
    if (request_size > 0 || uploaded > 0)
        return 1;
    return !etcd_not_sent(cc) && cc != CURLE_OPERATION_TIMEDOUT;
}

static void etcd_body_reset(body *b)
{
    b->len = 0;
    b->scanned = 0;
    b->too_large = 0;
}

/* A request's body: the gateway's JSON, or its gRPC message (binary). */
typedef struct {
    char *data;
    size_t len;
    int grpc;
} req_body;

/* The body of `req` (not taken) to `path`: over gRPC for every call
 * etcd/pb.c knows when s->grpc, else the gateway's JSON. */
static int etcd_payload(req_body *p, const etcd_store *s, const char *path, json_t *req)
{
    char err[160];
    unsigned char *bin;

    memset(p, 0, sizeof(*p));
    if (req == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    if (!s->grpc || lease__etcd_pb_method(path) == NULL) {
        p->data = json_dumps(req, JSON_COMPACT);
        p->len = p->data ? strlen(p->data) : 0;
        return p->data ? 0 : lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    if (lease__etcd_pb_request(&bin, &p->len, path, req, err, sizeof(err)) < 0)
        return lease__seterr(strcmp(err, "out of memory") == 0 ? LEASE_ENOMEM : LEASE_ESTORE,
                             "etcd %s: the request cannot be encoded: %s", path, err);
    p->data = (char *)bin;
    p->grpc = 1;
    return 0;
}

/* Forget an answer's gRPC status (a body read again). */
static void etcd_body_grpc_reset(body *b, int grpc)
{
    b->grpc = grpc;
    b->has_status = 0;
    b->grpc_status = -1;
    free(b->grpc_msg);
    b->grpc_msg = NULL;
    b->refused = 0;
}

/* The URL of `path` on member idx: the gRPC method's for a gRPC body. */
static void etcd_url(char *url, size_t size, const etcd_store *s, int idx, const char *path,
                     int grpc)
{
    snprintf(url, size, "%s%s", s->endpoints[idx],
             grpc ? lease__etcd_pb_method(path) : path);
}

/* Member idx's addresses, for etcd_setopts to give curl, looked up within
 * `end` (lease__http_resolve). CURLE_OK, or CURLE_COULDNT_RESOLVE_HOST
 * with lease's message kept for etcd_failed (then nothing may be sent to
 * idx). */
static CURLcode etcd_resolve(etcd_store *s, int idx, int64_t end)
{
    s->resolve_msg[0] = '\0';
    if (lease__http_resolve(&s->resolve[idx], &s->names[idx], &s->parent,
                            strstr(s->endpoints[idx], "://") + 3, end) < 0) {
        snprintf(s->resolve_msg, sizeof(s->resolve_msg), "%s", lease_errmsg());
        return CURLE_COULDNT_RESOLVE_HOST;
    }
    return CURLE_OK;
}

/* One request to member idx; *sent tells whether any of it may have
 * reached the member (then it may have been applied). */
static CURLcode etcd_perform(int *sent, etcd_store *s, int idx, const char *path,
                             const req_body *pl, body *b, int64_t left_ms,
                             int tries_left)
{
    char url[512];
    struct curl_slist *hdr = etcd_headers(s, path, pl->grpc);
    int64_t t0 = lease_clock_ns(), end;
    CURLcode cc = CURLE_OPERATION_TIMEDOUT;
    int again;

    *sent = 0;
    if (hdr == NULL)
        return CURLE_OUT_OF_MEMORY;
    /* The lookup has the connect's share of the time (etcd_setopts), and
     * what it took is the request's no more. */
    if ((cc = etcd_resolve(s, idx, t0 + (left_ms / tries_left + 1) * 1000000)) == CURLE_OK &&
        (left_ms -= (lease_clock_ns() - t0) / 1000000) <= 0)
        cc = CURLE_OPERATION_TIMEDOUT;
    if (cc != CURLE_OK) {
        lease__http_headers_free(hdr);
        return cc;
    }
    end = lease_clock_ns() + (left_ms + 2000) * 1000000;
    etcd_url(url, sizeof(url), s, idx, path, pl->grpc);
    for (again = 0; again < 2; again++) {
        etcd_body_reset(b);
        etcd_body_grpc_reset(b, pl->grpc);
        /* Leave time for the other members when one does not connect. */
        etcd_setopts(s, s->curl, idx, url, hdr, pl->data, pl->len, b, left_ms,
                     left_ms / tries_left + 1);
        cc = etcd_multi_perform(s, end, pl->grpc);
        if (!pl->grpc || !etcd_grpc_again(s, s->curl, cc, b, idx))
            break;
        if ((left_ms = (end - lease_clock_ns()) / 1000000 - 2000) <= 0) {
            cc = CURLE_OPERATION_TIMEDOUT;
            break;
        }
    }
    lease__http_headers_free(hdr);
    *sent = etcd_sent(s->curl, cc);
    return cc;
}

/* The message of a request that got no answer. */
static int etcd_failed(etcd_store *s, CURLcode cc, int sent, int idx,
                       int64_t waited_ms, const body *b, const char *what)
{
    const char *url = s->parent.url_redacted;

    if (b->too_large || cc == CURLE_FILESIZE_EXCEEDED)
        return lease__seterr(LEASE_ESTORE, "etcd %s on %s: answer too large: %s "
                             "sent more than %zu bytes (the outcome is unknown)",
                             what, url, s->endpoints[idx],
                             b->max ? b->max : ANSWER_MAX);
    if (cc == CURLE_OPERATION_TIMEDOUT && sent)
        return lease__seterr(LEASE_ESTORE, "etcd %s on %s: timed out after %lld ms "
                             "waiting for the answer of %s (the outcome is unknown)",
                             what, url, (long long)waited_ms, s->endpoints[idx]);
    if (cc == CURLE_COULDNT_RESOLVE_HOST && s->resolve_msg[0])
        return lease__seterr(LEASE_ESTORE, "etcd %s on %s: %s (no member reachable)", what,
                             url, s->resolve_msg);
    /* curl_easy_strerror() is a fixed text per code: it never echoes the
     * URL (and etcd URLs carry no password). */
    return lease__seterr(LEASE_ESTORE, "etcd %s on %s: %s%s%s", what, url,
                         curl_easy_strerror(cc),
                         sent ? " (the outcome is unknown)" : " (no member reachable)",
                         b->grpc && (cc == CURLE_GOT_NOTHING || cc == CURLE_HTTP2 ||
                                     cc == CURLE_HTTP2_STREAM ||
                                     cc == CURLE_WEIRD_SERVER_REPLY)
                             ? "; a server that does not speak gRPC answers so: is this "
                               "etcd's client URL? (?transport=json uses its JSON gateway)"
                             : "");
}

/* Type-check what etcd answered (see etcd_check_json, below). */
static int etcd_check_answer(json_t *j, const char *what);

/* etcd's message of a refusal (len bytes, any byte among them), for ours:
 * cut short, since it is the server's text, not ours, and withheld when
 * it repeats the password or the token (the whole of it is looked at, as
 * sent, before it is cut or made printable). */
static const char *etcd_their_message(const etcd_store *s, const char *msg, size_t len)
{
    if (msg && ((s->password && memmem(msg, len, s->password, strlen(s->password))) ||
                (s->token && memmem(msg, len, s->token, strlen(s->token)))))
        return "(etcd's message is withheld: it holds a credential)";
    return msg;
}

/* What decoding the answer in b may cost: what it may hold, one value
 * whole for a data read (the one call given DATA_ANSWER_MAX), else
 * anything (etcd/pb.h, HOLD_*); and the time left of the call. */
static lease__json_budget etcd_budget(const body *b)
{
    return lease__json_budget_of(b->max == DATA_ANSWER_MAX ? LEASE__JSON_HOLD_VALUE
                                                           : LEASE__JSON_HOLD_ANY,
                                 b->len, b->end_ns);
}

/* An answer that could not be decoded (rc, err): malformed, too costly
 * to hold, or not decoded within the call's timeout (outcome unknown). */
static int etcd_undecoded(int rc, const char *what, const char *err)
{
    if (rc == LEASE__JSON_LATE)
        return lease__seterr(LEASE_ESTORE, "etcd %s: timed out decoding the answer: %s "
                             "(the outcome is unknown)", what, err);
    return lease__seterr(LEASE_ESTORE, "etcd %s: malformed answer: %s", what, err);
}

/* The gRPC answer of a request to `path` that completed: an HTTP/2 200,
 * then grpc-status 0 and one message (decoded to the gateway's JSON), or
 * grpc-status and grpc-message of a refusal. */
static int etcd_grpc_answer(json_t **out, etcd_store *s, long status, body *b,
                            const char *path, const char *what)
{
    char err[160];
    const char *msg = etcd_their_message(s, b->grpc_msg, b->grpc_msg_len);
    lease__json_budget budget = etcd_budget(b);
    int rc;

    if (msg && msg == b->grpc_msg)
        lease__etcd_pb_printable(b->grpc_msg, b->grpc_msg_len); /* one line */

    if (status != 200)
        return lease__seterr(LEASE_ESTORE, "etcd %s: HTTP %ld to a gRPC call (is %s "
                             "an etcd client URL? ?transport=json uses etcd's JSON "
                             "gateway instead)", what, status, s->parent.url_redacted);
    if (!b->has_status)
        return lease__seterr(LEASE_ESTORE, "etcd %s: malformed answer: no grpc-status",
                             what);
    if (b->grpc_status != 0) {
        b->refused = 1;
        /* 16 is UNAUTHENTICATED; etcd says "invalid auth token" too. */
        s->auth_refused = b->grpc_status == 16 || (msg && strstr(msg, "invalid auth token"));
        return lease__seterr(LEASE_ESTORE, "etcd %s: gRPC status %ld%s%.200s", what,
                             b->grpc_status, msg ? ": " : "", msg ? msg : "");
    }
    if ((rc = lease__etcd_pb_answer(out, path, (const unsigned char *)b->data, b->len,
                                    &budget, err, sizeof(err))) < 0)
        return etcd_undecoded(rc, what, err);
    if (etcd_check_answer(*out, what) == 0)
        return 0;
    json_decref(*out);
    *out = NULL;
    return LEASE_ESTORE;
}

/* The answer of a request of easy handle c to `path` that completed: HTTP
 * status, JSON, types; or gRPC's (etcd_grpc_answer). */
static int etcd_answer(json_t **out, etcd_store *s, CURL *c, body *b, const char *path,
                       const char *what)
{
    long status = 0;
    const char *msg;
    char err[160] = "";
    lease__json_budget budget = etcd_budget(b);
    int rc;

    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    *out = NULL;
    if (b->grpc)
        return etcd_grpc_answer(out, s, status, b, path, what);
    rc = b->len ? lease__json_load(out, b->data, b->len, &budget, err, sizeof(err)) : 0;
    if (rc < 0 && err[0] != '\0') {
        b->refused = status != 200;
        return etcd_undecoded(rc, what, err);
    }
    if (status == 200 && json_is_object(*out) && json_object_get(*out, "error") == NULL) {
        if (etcd_check_answer(*out, what) == 0)
            return 0;
        json_decref(*out);
        *out = NULL;
        return LEASE_ESTORE;
    }
    msg = json_string_value(json_object_get(*out, "error"));
    if (msg == NULL)
        msg = json_string_value(json_object_get(*out, "message"));
    b->refused = status != 200;
    s->auth_refused = status == 401 || (msg && strstr(msg, "invalid auth token"));
    msg = etcd_their_message(s, msg, msg ? strlen(msg) : 0);
    rc = status == 200 && msg == NULL
             ? lease__seterr(LEASE_ESTORE, "etcd %s: malformed answer: not a JSON object",
                             what)
             : lease__seterr(LEASE_ESTORE, "etcd %s: HTTP %ld%s%.200s", what, status,
                             msg ? ": " : "", msg ? msg : "");
    json_decref(*out);
    *out = NULL;
    return rc;
}

/*
 * POST `req` to path on the members, starting at the one that last
 * answered, all of it before `end` (lease_clock_ns). On success *out is the
 * parsed answer, of at most `max` bytes (0: ANSWER_MAX). With `stream`, the
 * answer is a watch stream read by its callback.
 */
static int etcd_post(json_t **out, etcd_store *s, const char *path, json_t *req,
                     int64_t end, body *stream, size_t max, const char *what)
{
    body local = { .max = max };
    body *b = stream ? stream : &local;

    b->end_ns = end;
    CURLcode cc = CURLE_OPERATION_TIMEDOUT;
    int64_t t0 = 0;
    int tries, idx = s->current, sent = 0, attempts = 0, rc, wipe_answer = 0;
    req_body pl;

    *out = NULL;
    if ((rc = etcd_payload(&pl, s, path, req)) < 0)
        return rc;
    for (tries = 0; tries < s->nendpoints; tries++) {
        int64_t left = (end - lease_clock_ns()) / 1000000;

        if (left <= 0)
            break;
        idx = (s->current + tries) % s->nendpoints;
        t0 = lease_clock_ns();
        attempts++;
        cc = etcd_perform(&sent, s, idx, path, &pl, b, left, s->nendpoints - tries);
        if (cc == CURLE_OK) {
            s->current = idx;
            break;
        }
        if (sent) {
            /* Reached but unanswered: the outcome is unknown, and the next
             * request of this handle starts with another member. */
            s->current = (idx + 1) % s->nendpoints;
            break;
        }
    }
    /* Authenticate's request body holds the password, its answer body the
     * token: these two buffers are wiped before they are freed. */
    if (strcmp(path, "/v3/auth/authenticate") == 0) {
        explicit_bzero(pl.data, pl.len);
        wipe_answer = 1;
    }
    free(pl.data);
    if (stream && stream->stop)
        rc = 0; /* the stream's reader got what it waited for */
    else if (attempts == 0)
        rc = lease__seterr(LEASE_ETIMEOUT, "etcd %s: the call's timeout ran out "
                           "before this request was sent", what);
    else if (stream && cc == CURLE_OPERATION_TIMEDOUT && !b->too_large)
        rc = LEASE_ETIMEOUT;
    else if (cc != CURLE_OK)
        rc = etcd_failed(s, cc, sent, idx, (lease_clock_ns() - t0) / 1000000, b, what);
    else
        rc = etcd_answer(out, s, s->curl, b, path, what);
    if (wipe_answer && local.data)
        explicit_bzero(local.data, local.cap);
    free(local.data);
    free(b->grpc_msg);
    b->grpc_msg = NULL;
    return rc;
}

/* Each operation of the store is bounded as a whole by the timeout, however
 * many requests it makes: its first request sets the deadline. */
static void etcd_begin(etcd_store *s)
{
    s->end_ns = lease_clock_ns() + (int64_t)s->parent.timeout_ms * 1000000;
}

/* Wipe the string o[name] in place (a password, a token) before o goes. */
static void etcd_wipe_member(json_t *o, const char *name)
{
    json_t *v = json_object_get(o, name);

    if (json_is_string(v))
        explicit_bzero((char *)json_string_value(v), json_string_length(v));
}

/*
 * Authenticate as s->user: the token goes with every later request. Within
 * the current call's deadline. The password is only in the request body,
 * built by jansson; never in a message.
 */
static int etcd_authenticate(etcd_store *s)
{
    json_t *req = json_pack("{s:s, s:s}", "name", s->user, "password", s->password);
    json_t *res = NULL;
    const char *tok;
    size_t i, n;
    int rc;

    lease__free_secret(s->token);
    s->token = NULL;
    if (req == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    rc = etcd_post(&res, s, "/v3/auth/authenticate", req, s->end_ns, NULL, 0,
                   "authenticate");
    etcd_wipe_member(req, "password");
    json_decref(req);
    if (rc < 0)
        return rc;
    tok = json_string_value(json_object_get(res, "token"));
    n = tok ? strlen(tok) : 0;
    /* It goes into an HTTP header: printable ASCII only. */
    for (i = 0; i < n && tok[i] > ' ' && tok[i] < 127; i++)
        ;
    if (n == 0 || n > 4096 || i != n)
        rc = etcd_malformed("authenticate", "the token is missing, longer than 4096 "
                            "bytes or not printable ASCII");
    else if ((s->token = strdup(tok)) == NULL)
        rc = lease__seterr(LEASE_ENOMEM, "out of memory");
    etcd_wipe_member(res, "token");
    json_decref(res);
    return rc;
}

static int etcd_call_max(json_t **out, etcd_store *s, const char *path, json_t *req,
                         size_t max, const char *what)
{
    int rc;

    if (req == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    s->auth_refused = 0;
    rc = etcd_post(out, s, path, req, s->end_ns, NULL, max, what);
    /* An expired token: etcd refused the request before applying it, so
     * it is sent again, once, with a new token. */
    if (rc == LEASE_ESTORE && s->auth_refused && s->user &&
        (rc = etcd_authenticate(s)) == 0)
        rc = etcd_post(out, s, path, req, s->end_ns, NULL, max, what);
    json_decref(req);
    return rc;
}

static int etcd_call(json_t **out, etcd_store *s, const char *path, json_t *req,
                     const char *what)
{
    return etcd_call_max(out, s, path, req, 0, what);
}

/* ---- JSON helpers ------------------------------------------------------ */

/* int64 fields, 0 when absent (proto3 leaves out zeros). The answer was
 * type-checked by etcd_check_answer. */
static int64_t etcd_jint(json_t *o, const char *name)
{
    int64_t x = 0;

    lease__etcd_json_int(&x, json_object_get(o, name));
    return x;
}

static int etcd_in(const char *const *names, const char *name)
{
    for (; *names; names++)
        if (strcmp(*names, name) == 0)
            return 1;
    return 0;
}

/* The fields this store reads, by the JSON type etcd gives them. */
static const char *const etcd_int_fields[] = {
    "revision", "create_revision", "mod_revision", "version", "lease", "count",
    "ID", "TTL", "grantedTTL", NULL
};
static const char *const etcd_b64_fields[] = { "key", "value", NULL };
static const char *const etcd_list_fields[] = { "kvs", "responses", "events", NULL };
static const char *const etcd_object_fields[] = {
    "header", "result", "response_range", "response_put", "response_delete_range",
    "kv", "prev_kv", NULL
};

/* What is wrong with field `name` holding `v`, or NULL. */
static const char *etcd_field_problem(const char *name, json_t *v)
{
    size_t i;

    if (etcd_in(etcd_int_fields, name)) {
        int64_t x;

        return lease__etcd_json_int(&x, v) == 0 ? NULL : "is not a 64-bit integer";
    }
    if (etcd_in(etcd_b64_fields, name))
        return json_is_string(v) &&
                       lease__etcd_b64_valid(json_string_value(v), json_string_length(v))
                   ? NULL
                   : "is not base64 text";
    if (etcd_in(etcd_object_fields, name))
        return json_is_object(v) ? NULL : "is not an object";
    if (strcmp(name, "succeeded") == 0 || strcmp(name, "more") == 0)
        return json_is_boolean(v) ? NULL : "is not true or false";
    if (!etcd_in(etcd_list_fields, name))
        return NULL;
    if (!json_is_array(v))
        return "is not an array";
    for (i = 0; i < json_array_size(v); i++)
        if (!json_is_object(json_array_get(v, i)))
            return "holds something that is not an object";
    return NULL;
}

/* Walk the answer; `bad` gets what is wrong with the first bad field. */
static int etcd_check_json(json_t *j, int depth, char *bad, size_t size)
{
    const char *name, *problem;
    json_t *v;
    size_t i;

    if (depth > 16) {
        snprintf(bad, size, "nested more than 16 deep");
        return -1;
    }
    if (json_is_array(j)) {
        for (i = 0; i < json_array_size(j); i++)
            if (etcd_check_json(json_array_get(j, i), depth + 1, bad, size) < 0)
                return -1;
        return 0;
    }
    json_object_foreach(j, name, v) {
        if ((problem = etcd_field_problem(name, v)) != NULL) {
            /* The name is one of ours: the lists above. */
            snprintf(bad, size, "field '%s' %s", name, problem);
            return -1;
        }
        if (etcd_check_json(v, depth + 1, bad, size) < 0)
            return -1;
    }
    return 0;
}

static int etcd_check_answer(json_t *j, const char *what)
{
    char bad[128];

    if (etcd_check_json(j, 0, bad, sizeof(bad)) < 0)
        return lease__seterr(LEASE_ESTORE, "etcd %s: malformed answer: %s", what, bad);
    return 0;
}


/* A revision that is used as a token: 1 .. 2^63-1 (a revision is an int64;
 * etcd's first is 1). */
static int etcd_token_field(uint64_t *out, json_t *o, const char *name,
                            const char *what)
{
    int64_t v = etcd_jint(o, name);

    if (!lease__token_ok((uint64_t)v))
        return lease__seterr(LEASE_ESTORE, "etcd %s: malformed answer: %s %lld is "
                             "not a token (1 .. 2^63-1)", what, name, (long long)v);
    *out = (uint64_t)v;
    return 0;
}

/* A decimal token we wrote as text (a mark, a datatok/ value, a marker's
 * name): 1 .. 2^63-1, digits only. */
static int etcd_token_text(uint64_t *out, const char *text, size_t n)
{
    uint64_t v = 0;
    size_t i;

    if (text == NULL || n == 0 || n > PAD)
        return -1;
    for (i = 0; i < n; i++) {
        uint64_t d = (uint64_t)(text[i] - '0');

        /* Only overflow is checked here: the range is lease__token_ok's. */
        if (text[i] < '0' || text[i] > '9' || v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    if (!lease__token_ok(v))
        return -1;
    *out = v;
    return 0;
}

/* The greatest ttl, in seconds, an etcd lease of this store may report:
 * the store's cap, or etcd's own minimum ttl (3/2 of an election timeout,
 * at most 50 s) when that is more. Anything above is not an answer. */
static int64_t etcd_ttl_max_s(const etcd_store *s)
{
    int64_t cap = (int64_t)((s->parent.ttl_max_ms ? s->parent.ttl_max_ms
                                                  : LEASE_TTL_MAX_DEFAULT_MS) / 1000) + 1;

    return cap > 75 ? cap : 75;
}

static json_t *etcd_jb64(const void *data, size_t n)
{
    char *e = lease__etcd_b64_encode(data, n);
    json_t *j = e ? json_string(e) : NULL;

    free(e);
    return j;
}

static json_t *etcd_jstr64(const char *s)
{
    return etcd_jb64(s, strlen(s));
}

/* The prefixed key "<prefix><kind><name>" as base64. */
static json_t *etcd_jkey(etcd_store *s, const char *kind, const char *name)
{
    char buf[512 + LEASE_KEY_MAX];

    snprintf(buf, sizeof(buf), "%s%s%s", s->prefix, kind, name);
    return etcd_jstr64(buf);
}

/* The end of the range of keys starting with "<prefix><kind><name>". */
static json_t *etcd_jrange_end(etcd_store *s, const char *kind, const char *name)
{
    char buf[512 + LEASE_KEY_MAX];
    size_t n = (size_t)snprintf(buf, sizeof(buf), "%s%s%s", s->prefix, kind, name);

    /* Add one to the last byte that is not 0xff (etcd's prefix end). */
    while (n > 0 && (unsigned char)buf[n - 1] == 0xff)
        n--;
    if (n == 0)
        return etcd_jstr64("\0");
    buf[n - 1] = (char)((unsigned char)buf[n - 1] + 1);
    return etcd_jb64(buf, n);
}

/* A bytes field of a kv ("key", "value"), decoded: *len bytes and a NUL,
 * malloc'ed; "" when etcd left it out (empty). NULL when out of memory
 * (the answer was type-checked: it is base64). */
static char *etcd_kv_bytes(json_t *kv, const char *field, size_t *len)
{
    const char *v = json_string_value(json_object_get(kv, field));

    return lease__etcd_b64_decode(v ? v : "", len);
}

static char *etcd_kv_value(json_t *kv, size_t *len)
{
    return etcd_kv_bytes(kv, "value", len);
}

/* The kvs of the i-th response of a txn (a range's), or NULL. */
static json_t *etcd_txn_kvs(json_t *txn, size_t i)
{
    json_t *r = json_array_get(json_object_get(txn, "responses"), i);

    return json_object_get(json_object_get(r, "response_range"), "kvs");
}

/* The kvs[0] of the i-th response of a txn, NULL if none. */
static json_t *etcd_txn_kv(json_t *txn, size_t i)
{
    return json_array_get(etcd_txn_kvs(txn, i), 0);
}

static int etcd_txn_ok(json_t *txn)
{
    return json_is_true(json_object_get(txn, "succeeded"));
}

static json_t *etcd_op_range(json_t *key)
{
    return json_pack("{s:{s:o}}", "request_range", "key", key);
}

static json_t *etcd_op_put(json_t *key, json_t *value, int64_t lease)
{
    json_t *p = json_pack("{s:o, s:o}", "key", key, "value", value);

    if (p && lease)
        json_object_set_new(p, "lease", json_integer(lease));
    return json_pack("{s:o}", "request_put", p);
}

static json_t *etcd_op_delete(json_t *key)
{
    return json_pack("{s:{s:o}}", "request_delete_range", "key", key);
}

static json_t *etcd_cmp(json_t *key, const char *target, const char *result,
                        const char *field, json_t *value)
{
    return json_pack("{s:o, s:s, s:s, s:o}", "key", key, "target", target,
                     "result", result, field, value);
}

/* The compares of "(key, owner, token) is the current lease": the key was
 * created at `token` (an expired or released key is gone) and holds this
 * owner. Every write on behalf of a holder is guarded by them. */
static json_t *etcd_is_holder(etcd_store *s, const char *key, const char *owner,
                              uint64_t token)
{
    return json_pack("[o, o]",
                     etcd_cmp(etcd_jkey(s, "lease/", key), "CREATE", "EQUAL", "create_revision",
                         json_integer((json_int_t)token)),
                     etcd_cmp(etcd_jkey(s, "lease/", key), "VALUE", "EQUAL", "value",
                         etcd_jstr64(owner)));
}

static void etcd_pad(char out[PAD + 1], uint64_t v)
{
    snprintf(out, PAD + 1, "%0*llu", PAD, (unsigned long long)v);
}

/* ---- history helpers ------------------------------------------------------ */

/* "<len>/<key>/<suffix>", the name of a history/ or ended/ key of `key`
 * (suffix "" gives the prefix of all of them): see the key layout. */
static void etcd_hist_name(char out[HNAME_SZ], const char *key, const char *suffix)
{
    snprintf(out, HNAME_SZ, "%03zu/%s/%s", strlen(key), key, suffix);
}

/* The client's wall clock in ms: the KV API has no server time. */
static int64_t etcd_wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The body of a range request over every key starting with
 * "<prefix><kind><name>". */
static json_t *etcd_range_body(etcd_store *s, const char *kind, const char *name)
{
    return json_pack("{s:o, s:o}", "key", etcd_jkey(s, kind, name), "range_end",
                     etcd_jrange_end(s, kind, name));
}

/* A range over the history entries named by `name` (etcd_hist_name(.., "")),
 * in token order: sorted by create_revision, "ASCEND" or "DESCEND". */
static json_t *etcd_history_range(etcd_store *s, const char *name, const char *order)
{
    json_t *req = etcd_range_body(s, "history/", name);

    if (req) {
        json_object_set_new(req, "sort_order", json_string(order));
        json_object_set_new(req, "sort_target", json_string("CREATE"));
    }
    return req;
}

/* The count of the i-th response of a txn (a range's). */
static int64_t etcd_txn_count(json_t *txn, size_t i)
{
    json_t *r = json_array_get(json_object_get(txn, "responses"), i);

    return etcd_jint(json_object_get(r, "response_range"), "count");
}

/* ---- etcd leases -------------------------------------------------------- */

/* An etcd lease's TTL (seconds) into ms, when it is within 1 .. the most
 * this store can have granted. */
static int etcd_ttl_ms(uint64_t *ms, const etcd_store *s, int64_t ttl, const char *what)
{
    if (ttl < 1 || ttl > etcd_ttl_max_s(s))
        return lease__seterr(LEASE_ESTORE, "etcd %s: malformed answer: TTL %lld s is "
                             "not within 1 .. %lld s", what, (long long)ttl,
                             (long long)etcd_ttl_max_s(s));
    *ms = (uint64_t)ttl * 1000;
    return 0;
}

/* ---- the pool of plain grants' etcd leases ------------------------------- */

/*
 * The pool is this process's: a child of fork() starts with an empty one
 * (the parent's leases stay the parent's), since two processes attaching
 * keys to one etcd lease would keep each other's keys alive.
 */
static void etcd_pool_own(etcd_store *s)
{
    pid_t pid = getpid();

    if (s->pool_pid != pid) {
        memset(s->pool, 0, sizeof(s->pool));
        s->pool_pid = pid;
    }
}

static pool_lease *etcd_pool_find(etcd_store *s, int64_t id)
{
    int i;

    etcd_pool_own(s);
    for (i = 0; id != 0 && i < POOL_MAX; i++)
        if (s->pool[i].id == id)
            return &s->pool[i];
    return NULL;
}

/* The lease leaves the pool (revoked, ended, or a key of unknown fate may
 * be attached): never reused, it expires by itself or with its key. */
static void etcd_pool_forget(etcd_store *s, int64_t id)
{
    pool_lease *p = etcd_pool_find(s, id);

    if (p)
        memset(p, 0, sizeof(*p));
}

/* A new lease of `ttl_ms` in use by a grant: a free slot, else the slot
 * refreshed longest ago is forgotten (an idle lease then expires by
 * itself, an attached one is revoked at its release like any other). */
static void etcd_pool_add(etcd_store *s, int64_t id, uint64_t ttl_ms, uint64_t granted_ms,
                          int64_t refreshed_ns)
{
    pool_lease *p = NULL;
    int i;

    etcd_pool_own(s);
    for (i = 0; i < POOL_MAX; i++) {
        pool_lease *q = &s->pool[i];

        if (q->id == 0) {
            p = q;
            break;
        }
        if (p == NULL || q->refreshed_ns < p->refreshed_ns)
            p = q;
    }
    p->id = id;
    p->ttl_s = (int64_t)((ttl_ms + 999) / 1000);
    p->granted_ms = granted_ms;
    p->refreshed_ns = refreshed_ns;
    p->idle = 0;
}

/* A new etcd lease; *revision (unless NULL): the cluster's revision then,
 * which every key attached to the lease is written after. */
static int etcd_grant(int64_t *id, uint64_t *granted_ms, int64_t *revision, etcd_store *s,
                      uint64_t ttl_ms)
{
    json_t *res;
    int rc;

    rc = etcd_call(&res, s, "/v3/lease/grant",
              json_pack("{s:I}", "TTL", (json_int_t)((ttl_ms + 999) / 1000)), "grant");
    if (rc < 0)
        return rc;
    *id = etcd_jint(res, "ID");
    if (revision)
        *revision = etcd_jint(json_object_get(res, "header"), "revision");
    rc = etcd_ttl_ms(granted_ms, s, etcd_jint(res, "TTL"), "grant");
    json_decref(res);
    if (rc == 0 && *id <= 0)
        rc = etcd_malformed("grant", "lease ID %lld is not a lease (1 .. 2^63-1)",
                            (long long)*id);
    return rc;
}

/* Best effort, within what is left of the call: an etcd lease left
 * behind expires by itself. The error of the call it cleans up after is
 * the one the caller reports, so it is kept. */
static void etcd_revoke(etcd_store *s, int64_t id)
{
    char saved[LEASE__ERRMSG_SIZE];
    int code = lease_errcode();
    json_t *res = NULL;

    etcd_pool_forget(s, id);
    lease__strlcpy(saved, lease_errmsg(), sizeof(saved));
    if (etcd_call(&res, s, "/v3/lease/revoke", json_pack("{s:I}", "ID", (json_int_t)id),
             "revoke") == 0)
        json_decref(res);
    else if (code < 0)
        lease__seterr(code, "%s", saved);
}

/* A keep-alive's answer (taken); *ttl_ms 0 when the lease is gone. */
static int etcd_keepalive_ttl(uint64_t *ttl_ms, etcd_store *s, json_t *res)
{
    /* etcd answers a lease that is gone with a TTL of 0 (left out). */
    int64_t ttl = etcd_jint(json_object_get(res, "result"), "TTL");

    json_decref(res);
    *ttl_ms = 0;
    return ttl == 0 ? 0 : etcd_ttl_ms(ttl_ms, s, ttl, "keep-alive");
}

/* Keep-alive; *ttl_ms 0 when the lease is gone. */
static int etcd_keepalive(uint64_t *ttl_ms, etcd_store *s, int64_t id)
{
    json_t *res;
    int rc = etcd_call(&res, s, "/v3/lease/keepalive",
                  json_pack("{s:I}", "ID", (json_int_t)id), "keep-alive");

    return rc < 0 ? rc : etcd_keepalive_ttl(ttl_ms, s, res);
}

/* etcd_pair's two transfers ended (cc): the keep-alive's TTL into *ka_ms,
 * the txn's answer into *res. */
static int etcd_pair_answers(json_t **res, uint64_t *ka_ms, etcd_store *s, CURL *const *h,
                             const CURLcode *cc, body *b, int64_t t0)
{
    json_t *ka = NULL;
    int rc, idx = s->current;

    if (cc[1] == CURLE_OK &&
        etcd_answer(&ka, s, h[1], &b[1], "/v3/lease/keepalive", "keep-alive") == 0 &&
        etcd_keepalive_ttl(ka_ms, s, ka) < 0)
        *ka_ms = PAIR_NO_TTL;
    if (cc[0] != CURLE_OK) {
        if (!etcd_sent(h[0], cc[0]))
            return PAIR_AGAIN;
        s->current = (idx + 1) % s->nendpoints; /* as etcd_post */
        return etcd_failed(s, cc[0], 1, idx, (lease_clock_ns() - t0) / 1000000, &b[0],
                           "acquire");
    }
    s->auth_refused = 0;
    if ((rc = etcd_answer(res, s, h[0], &b[0], "/v3/kv/txn", "acquire")) == 0)
        return 0;
    /* etcd refused the txn, so it was not applied: for an expired auth
     * token, or for the lease that ended after all. */
    if (b[0].refused && (s->auth_refused ||
                         (*ka_ms == 0 && strstr(lease_errmsg(), "lease not found"))))
        return PAIR_AGAIN;
    return rc;
}

/*
 * An idle pooled lease's keep-alive and the acquire txn (taken) that
 * attaches a key to it, sent at once to the member that last answered (two
 * streams of one connection over gRPC, two connections to the gateway):
 * one round trip where one after the other takes two. The
 * txn needs nothing of the keep-alive: the lease outlives both, kept alive
 * or not (see etcd_pool_take). 0: the txn's answer in *res, the TTL the
 * keep-alive restored in *ka_ms (0: the lease ended; PAIR_NO_TTL: no
 * usable answer); PAIR_AGAIN: the txn surely was not applied (not sent,
 * or refused), and the caller starts over one request at a time, which
 * fails over to other members and authenticates again; < 0: the txn's
 * error, its outcome maybe unknown.
 */
static int etcd_pair(json_t **res, uint64_t *ka_ms, etcd_store *s, int64_t id, json_t *txn)
{
    static const char *const path[2] = { "/v3/kv/txn", "/v3/lease/keepalive" };
    json_t *ka = json_pack("{s:I}", "ID", (json_int_t)id);
    char url[512];
    req_body pl[2];
    struct curl_slist *hdr[2] = { NULL, NULL };
    body b[2];
    CURL *h[2];
    CURLcode cc[2];
    int64_t t0 = lease_clock_ns(), left = (s->end_ns - t0) / 1000000;
    int i, rc = PAIR_AGAIN, ok, again;

    *res = NULL;
    *ka_ms = PAIR_NO_TTL;
    memset(b, 0, sizeof(b));
    b[0].end_ns = b[1].end_ns = s->end_ns;
    if (s->curl2 == NULL)
        s->curl2 = curl_easy_init();
    h[0] = s->curl;
    h[1] = s->curl2;
    ok = etcd_payload(&pl[0], s, path[0], txn) == 0;
    ok = etcd_payload(&pl[1], s, path[1], ka) == 0 && ok;
    json_decref(txn);
    json_decref(ka);
    for (i = 0; ok && i < 2; i++)
        ok = (hdr[i] = etcd_headers(s, path[i], pl[i].grpc)) != NULL;
    /* Over gRPC, only on a connection that is there: two new ones would be
     * opened at once, not one shared (etcd_h2_version). */
    if (ok && h[1] && left > 0 &&
        !(s->grpc && !s->h2[s->current] && !etcd_tls(s, s->current)) &&
        etcd_resolve(s, s->current, t0 + (left / s->nendpoints + 1) * 1000000) == CURLE_OK &&
        (left = (s->end_ns - lease_clock_ns()) / 1000000) > 0) {
        for (i = 0; i < 2; i++) {
            etcd_url(url, sizeof(url), s, s->current, path[i], pl[i].grpc);
            etcd_body_grpc_reset(&b[i], pl[i].grpc);
            etcd_setopts(s, h[i], s->current, url, hdr[i], pl[i].data, pl[i].len, &b[i],
                         left, left / s->nendpoints + 1);
        }
        etcd_multi_run(s, h, cc, 2, lease_clock_ns() + (left + 2000) * 1000000, s->grpc);
        /* The gateway answered the txn (a gRPC call): it was not applied.
         * The keep-alive it answered is a keep-alive without an answer. */
        again = s->grpc && etcd_grpc_again(s, h[0], cc[0], &b[0], s->current);
        if (s->grpc && etcd_grpc_again(s, h[1], cc[1], &b[1], s->current))
            cc[1] = CURLE_GOT_NOTHING;
        rc = again ? PAIR_AGAIN : etcd_pair_answers(res, ka_ms, s, h, cc, b, t0);
    }
    for (i = 0; i < 2; i++) {
        free(pl[i].data);
        lease__http_headers_free(hdr[i]);
        free(b[i].data);
        free(b[i].grpc_msg);
    }
    return rc;
}

/*
 * The etcd lease a plain grant of `ttl_ms` attaches its key to, with its
 * full TTL: an idle one of the pool asked with the same TTL, kept alive
 * (a keep-alive is no raft write, a grant is), or else a new one. The
 * keep-alive is sent after the core read its clock for the grant's local
 * deadline, so the TTL it restores may be reported as granted, as a new
 * lease's. *how: TAKE_FRESH, granted for this grant alone (its id is the
 * grant's); TAKE_KEPT, kept alive; TAKE_PAIR (with may_pair): not yet
 * kept alive, the acquire sends the keep-alive beside its txn.
 */
static int etcd_pool_take(int64_t *id, uint64_t *granted_ms, int *how, etcd_store *s,
                          uint64_t ttl_ms, int may_pair)
{
    int64_t ttl_s = (int64_t)((ttl_ms + 999) / 1000), now, left_ms;
    int i, rc;

    etcd_pool_own(s);
    for (i = 0; i < POOL_MAX; i++) {
        pool_lease *p = &s->pool[i];

        if (p->id == 0 || !p->idle || p->ttl_s != ttl_s)
            continue;
        now = lease_clock_ns();
        left_ms = ((int64_t)p->granted_ms * 1000000 - (now - p->refreshed_ns)) / 1000000;
        /* Ran out while idle (by this clock): not worth a request. */
        if (left_ms <= 0) {
            memset(p, 0, sizeof(*p));
            continue;
        }
        /* Outlives the call by far, kept alive or not: its keep-alive may
         * go beside the acquire txn (etcd_pair), in use meanwhile. */
        if (may_pair && left_ms > (int64_t)s->parent.timeout_ms + PAIR_MARGIN_MS) {
            *id = p->id;
            *granted_ms = p->granted_ms;
            p->idle = 0;
            *how = TAKE_PAIR;
            return 0;
        }
        /* Out of the pool while unanswered: nothing is attached to it, so
         * a keep-alive that failed leaves a lease that expires by itself. */
        *id = p->id;
        memset(p, 0, sizeof(*p));
        if ((rc = etcd_keepalive(granted_ms, s, *id)) < 0)
            return rc;
        if (*granted_ms == 0)
            continue; /* ended while idle (expired, revoked) */
        etcd_pool_add(s, *id, ttl_ms, *granted_ms, now);
        *how = TAKE_KEPT;
        return 0;
    }
    now = lease_clock_ns();
    if ((rc = etcd_grant(id, granted_ms, NULL, s, ttl_ms)) < 0)
        return rc;
    etcd_pool_add(s, *id, ttl_ms, *granted_ms, now);
    *how = TAKE_FRESH;
    return 0;
}

/* A lease the pool lent to an acquire that did not attach its key (busy, a
 * retry by the holder, an error before the txn): idle again. */
static void etcd_pool_put_back(etcd_store *s, int64_t id)
{
    pool_lease *p = etcd_pool_find(s, id);

    if (p)
        p->idle = 1;
}

/* The time left on etcd lease `id`; 0 when it ran out. */
static int etcd_time_left_ms(uint64_t *ms, etcd_store *s, int64_t id)
{
    json_t *res;
    int64_t ttl;
    int rc;

    *ms = 0;
    if (id <= 0)
        return etcd_malformed("time to live", "lease %lld is not a lease (1 .. 2^63-1)",
                              (long long)id);
    rc = etcd_call(&res, s, "/v3/lease/timetolive", json_pack("{s:I}", "ID", (json_int_t)id),
              "time to live");
    if (rc < 0)
        return rc;
    ttl = etcd_jint(res, "TTL");
    json_decref(res);
    /* -1: the lease expired (or was revoked) after the key was read. A TTL
     * of 0 is a lease in its last second. */
    if (ttl == -1 || ttl == 0)
        return 0;
    return etcd_ttl_ms(ms, s, ttl, "time to live");
}

/* ---- the shared etcd lease of a session handle --------------------------- */

static size_t etcd_rec_hash(const char *key)
{
    size_t h = 14695981039346656037ull;

    for (; *key; key++)
        h = (h ^ (unsigned char)*key) * 1099511628211ull;
    return h;
}

/* The link that points at `key`'s record, or the NULL that ends its chain. */
static shared_rec **etcd_rec_link(etcd_store *s, const char *key)
{
    shared_rec **at = &s->rec[etcd_rec_hash(key) & (s->rec_size - 1)];

    while (*at && strcmp((*at)->key, key) != 0)
        at = &(*at)->next;
    return at;
}

static shared_rec *etcd_rec_find(etcd_store *s, const char *key)
{
    return s->rec_size ? *etcd_rec_link(s, key) : NULL;
}

static void etcd_rec_del(etcd_store *s, const char *key)
{
    shared_rec **at, *r;

    if (s->rec_size == 0 || (r = *(at = etcd_rec_link(s, key))) == NULL)
        return;
    *at = r->next;
    free(r);
    s->rec_count--;
}

/* Drop the records that renew_many's pass `keep` did not see attached
 * (every record when keep is 0: no pass is numbered 0). */
static void etcd_rec_sweep(etcd_store *s, unsigned keep)
{
    size_t i;

    for (i = 0; i < s->rec_size; i++) {
        shared_rec **at = &s->rec[i], *r;

        while ((r = *at) != NULL) {
            if (keep != 0 && r->seen == keep) {
                at = &r->next;
                continue;
            }
            *at = r->next;
            free(r);
            s->rec_count--;
        }
    }
}

/* Twice the slots, the records rehashed; the table stays when out of memory
 * (its chains just grow longer). */
static void etcd_rec_grow(etcd_store *s)
{
    size_t size = s->rec_size ? s->rec_size * 2 : 64, i;
    shared_rec **tab = calloc(size, sizeof(*tab));

    if (tab == NULL)
        return;
    for (i = 0; i < s->rec_size; i++) {
        shared_rec *r, *next;

        for (r = s->rec[i]; r; r = next) {
            size_t h = etcd_rec_hash(r->key) & (size - 1);

            next = r->next;
            r->next = tab[h];
            tab[h] = r;
        }
    }
    free(s->rec);
    s->rec = tab;
    s->rec_size = size;
}

static int etcd_rec_put(etcd_store *s, const char *key, const char *owner,
                        uint64_t token)
{
    shared_rec *r;
    size_t n = strlen(key);

    if (s->rec_count >= s->rec_size)
        etcd_rec_grow(s);
    if (s->rec_size == 0)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    if ((r = etcd_rec_find(s, key)) == NULL) {
        shared_rec **at = &s->rec[etcd_rec_hash(key) & (s->rec_size - 1)];

        if ((r = calloc(1, sizeof(*r) + n + 1)) == NULL)
            return lease__seterr(LEASE_ENOMEM, "out of memory");
        memcpy(r->key, key, n + 1);
        r->next = *at;
        *at = r;
        s->rec_count++;
    }
    r->token = token;
    r->seen = 0;
    lease__strlcpy(r->owner, owner, sizeof(r->owner));
    return 0;
}

/* The shared etcd lease ended (or may have): the next acquire grants a new
 * one, and every grant made under this one is lost. */
static void etcd_forget_shared(etcd_store *s)
{
    s->shared_id = 0;
    s->shared_marked = 0;
    etcd_rec_sweep(s, 0);
}

/*
 * The shared etcd lease an acquire attaches its key to, with its full TTL:
 * a keep-alive of the current one, sent after the core read its clock for
 * the grant's local deadline, so the TTL it restores may be reported as
 * granted (the time already elapsed on the lease is not). A lease that
 * ended is replaced by a new one.
 */
static int etcd_shared_lease(int64_t *id, uint64_t *granted_ms, etcd_store *s)
{
    int rc;

    *granted_ms = 0;
    if (s->shared_id != 0) {
        if ((rc = etcd_keepalive(granted_ms, s, s->shared_id)) < 0)
            return rc;
        if (*granted_ms == 0)
            etcd_forget_shared(s);
    }
    if (s->shared_id == 0) {
        if ((rc = etcd_grant(&s->shared_id, granted_ms, &s->shared_checked, s,
                             s->shared_ttl_ms)) < 0) {
            s->shared_id = 0;
            return rc;
        }
        s->shared_marked = 0;
    }
    *id = s->shared_id;
    return 0;
}

/* "shared/<etcd lease id in 16 hex digits>": present, attached to the
 * lease itself, while a lease is a session's (see the key layout). */
static json_t *etcd_shared_marker(etcd_store *s, int64_t id)
{
    char hex[17];

    snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)id);
    return etcd_jkey(s, "shared/", hex);
}

/*
 * Revoke a per-grant etcd lease a key was taken off (released, moved):
 * never a session's shared lease, which holds the session's other keys,
 * whichever handle let go of the key. When whether it is shared cannot be
 * read, it is left alone: it expires by itself.
 */
static void etcd_revoke_unless_shared(etcd_store *s, int64_t id)
{
    char saved[LEASE__ERRMSG_SIZE];
    int code = lease_errcode();
    json_t *res = NULL;
    int shared;

    if (s->shared && id == s->shared_id)
        return;
    etcd_pool_forget(s, id);
    lease__strlcpy(saved, lease_errmsg(), sizeof(saved));
    if (etcd_call(&res, s, "/v3/kv/range",
                  json_pack("{s:o, s:b}", "key", etcd_shared_marker(s, id), "count_only", 1),
                  "release") < 0) {
        if (code < 0)
            lease__seterr(code, "%s", saved);
        return;
    }
    shared = etcd_jint(res, "count") != 0;
    json_decref(res);
    if (!shared)
        etcd_revoke(s, id);
}

/* An acquire's own etcd lease that it did not attach its key to after
 * all: back to the pool idle; the handle's shared lease stays as it is. */
static void etcd_drop_lease(etcd_store *s, int64_t id)
{
    if (!(s->shared && id == s->shared_id))
        etcd_pool_put_back(s, id);
}

/* ---- operations ---------------------------------------------------------- */

/* "<ttl_ms>\n<label>" of a meta/ kv into info. */
static int etcd_read_meta(lease_info *info, const etcd_store *s, json_t *meta_kv)
{
    size_t len = 0;
    char *meta = etcd_kv_value(meta_kv, &len), *nl, *end;
    unsigned long long ttl;
    int rc = 0;

    if (meta == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    nl = memchr(meta, '\n', len);
    errno = 0;
    ttl = strtoull(meta, &end, 10);
    if (nl == NULL || end != nl || meta[0] < '0' || meta[0] > '9' || errno != 0 ||
        ttl == 0 || ttl > (unsigned long long)etcd_ttl_max_s(s) * 1000)
        rc = etcd_malformed("inspect", "the ttl of the meta/ value is not a number "
                            "of ms within 1 .. %lld s", (long long)etcd_ttl_max_s(s));
    else if (len - (size_t)(nl + 1 - meta) > LEASE_LABEL_MAX ||
             memchr(nl + 1, '\0', len - (size_t)(nl + 1 - meta)))
        rc = etcd_malformed("inspect", "the label of the meta/ value is longer than "
                            "%d bytes or holds a NUL", LEASE_LABEL_MAX);
    if (rc == 0) {
        info->ttl_ms = ttl;
        lease__strlcpy(info->label, nl + 1, sizeof(info->label));
    }
    free(meta);
    return rc;
}

/* Fill `info` from the lease and meta kvs (either may be NULL); the seen/
 * token is the last token of a key that is not held. */
static int etcd_fill_info(lease_info *info, etcd_store *s, const char *key,
                          json_t *lease_kv, json_t *meta_kv, uint64_t seen_token)
{
    char *owner;
    int rc;

    memset(info, 0, sizeof(*info));
    lease__strlcpy(info->key, key, sizeof(info->key));
    info->token = seen_token;
    if (lease_kv == NULL)
        return 0;
    owner = etcd_kv_value(lease_kv, NULL);
    if (owner == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    rc = lease_owner_valid(owner) ? 0
                                  : etcd_malformed("inspect", "the owner of '%s' "
                                                   "is not a UUID", key);
    lease__strlcpy(info->owner, owner, sizeof(info->owner));
    free(owner);
    info->held = 1;
    if (rc == 0)
        rc = etcd_token_field(&info->token, lease_kv, "create_revision", "inspect");
    if (rc == 0)
        rc = etcd_time_left_ms(&info->remaining_ms, s, etcd_jint(lease_kv, "lease"));
    if (rc == 0 && meta_kv)
        rc = etcd_read_meta(info, s, meta_kv);
    return rc;
}

/*
 * Delete the oldest history entries of `key` beyond the newest
 * LEASE_HISTORY_KEEP, and the end markers of the deleted grants (all below
 * the oldest kept token). Best effort: the grant is made already, and what
 * is left goes at a later grant. It reads the entries afresh rather than
 * trusting the count of the acquire: two prunes racing each keep the top
 * LEASE_HISTORY_KEEP of what they read, and tokens only grow, so together
 * they never keep fewer.
 */
static void etcd_prune_history(etcd_store *s, const char *key)
{
    char name[HNAME_SZ], end[HNAME_SZ], tok[PAD + 1];
    json_t *res, *kvs, *req, *ops;
    size_t n, ndel, i;
    int64_t last;

    etcd_hist_name(name, key, "");
    if ((req = etcd_history_range(s, name, "ASCEND")) != NULL)
        json_object_set_new(req, "keys_only", json_true());
    if (etcd_call(&res, s, "/v3/kv/range", req, "prune history") < 0)
        return;
    kvs = json_object_get(res, "kvs");
    n = json_array_size(kvs);
    if (n <= LEASE_HISTORY_KEEP) {
        json_decref(res);
        return;
    }
    ndel = n - LEASE_HISTORY_KEEP;
    if (ndel > PRUNE_MAX)
        ndel = PRUNE_MAX;
    /* The entries' names (as etcd sent them, base64) ... */
    ops = json_array();
    for (i = 0; ops && i < ndel; i++)
        json_array_append_new(ops, etcd_op_delete(json_incref(json_object_get(
                                       json_array_get(kvs, i), "key"))));
    /* ... and the markers of every token up to the newest deleted one:
     * "ended/L/K/" up to (excluding) "ended/L/K/<its token + 1>". */
    last = etcd_jint(json_array_get(kvs, ndel - 1), "create_revision");
    json_decref(res);
    if (!lease__token_ok((uint64_t)last) || !lease__token_ok((uint64_t)last + 1)) {
        json_decref(ops);
        return; /* not a revision: delete nothing rather than guess */
    }
    etcd_pad(tok, (uint64_t)last + 1);
    etcd_hist_name(end, key, tok);
    if (ops)
        json_array_append_new(ops, json_pack("{s:{s:o, s:o}}", "request_delete_range",
                                             "key", etcd_jkey(s, "ended/", name),
                                             "range_end", etcd_jkey(s, "ended/", end)));
    if (ops && etcd_call(&res, s, "/v3/kv/txn", json_pack("{s:o}", "success", ops),
                    "prune history") == 0)
        json_decref(res);
}

/* The acquire txn succeeded: the token is its revision. Takes `res`. */
static int etcd_acquired(lease_grant *out, etcd_store *s, json_t *res, int64_t id,
                         uint64_t granted, const lease_request *req)
{
    int64_t entries = etcd_txn_count(res, 4);
    int rc = etcd_token_field(&out->token, json_object_get(res, "header"), "revision",
                              "acquire");

    json_decref(res);
    if (rc < 0) {
        /* Best effort: no token, no grant. A plain grant's key goes with
         * its etcd lease; a session's key stays on the shared lease
         * without a record: renew_many deletes it. */
        if (!s->shared)
            etcd_revoke(s, id);
        return rc;
    }
    if (s->shared) {
        s->shared_marked = 1;
        if ((rc = etcd_rec_put(s, req->key, req->owner, out->token)) < 0)
            return rc;
    }
    out->ttl_ms = granted;
    if (entries > LEASE_HISTORY_KEEP + HISTORY_SLACK) {
        /* The holder's time runs already: both prune requests get a
         * twentieth of the ttl at most, so a slow cluster costs the
         * holder a tenth of its lease, not the handle's timeout. */
        int64_t saved = s->end_ns;
        int64_t budget = lease_clock_ns() + (int64_t)(granted / 20 ? granted / 20 : 1) * 1000000;

        if (budget < s->end_ns)
            s->end_ns = budget;
        etcd_prune_history(s, req->key);
        s->end_ns = saved;
    }
    return 0;
}

/* The put of a shared lease's marker, attached to the lease itself. */
static json_t *etcd_op_mark_shared(etcd_store *s, int64_t id)
{
    return etcd_op_put(etcd_shared_marker(s, id), etcd_jstr64(""), id);
}

/* A retried acquire by the holder: keep its etcd lease alive, same token;
 * the lease taken for the acquire is not needed. */
static int etcd_retried(lease_grant *out, etcd_store *s, json_t *kv, int64_t id,
                        const lease_request *req)
{
    uint64_t ttl = 0;
    int rc;

    if (etcd_jint(kv, "lease") != id)
        etcd_drop_lease(s, id);
    rc = etcd_token_field(&out->token, kv, "create_revision", "acquire");
    if (rc < 0 || (rc = etcd_keepalive(&ttl, s, etcd_jint(kv, "lease"))) < 0)
        return rc;
    if (ttl == 0)
        return lease__seterr(LEASE_ESTORE, "'%s': the lease expired while "
                             "being acquired again; try again", req->key);
    out->ttl_ms = ttl;
    return 0;
}

/*
 * A retried acquire by the holder on a session handle. A key on another
 * etcd lease (taken through another handle, or under a shared lease since
 * replaced) moves to the shared one, keeping its token (a put keeps
 * create_revision), so that the session's keep-alives keep it; the lease
 * it leaves expires by itself.
 */
static int etcd_adopt(lease_grant *out, etcd_store *s, json_t *kv, const lease_request *req,
                      int64_t id, uint64_t granted, const char *metatext)
{
    json_t *res, *txn;
    int rc, ok;

    if ((rc = etcd_token_field(&out->token, kv, "create_revision", "acquire")) < 0)
        return rc;
    if (etcd_jint(kv, "lease") != id) {
        txn = json_pack("{s:o, s:[o, o]}",
                        "compare", etcd_is_holder(s, req->key, req->owner, out->token),
                        "success",
                        etcd_op_put(etcd_jkey(s, "lease/", req->key), etcd_jstr64(req->owner), id),
                        etcd_op_put(etcd_jkey(s, "meta/", req->key), etcd_jstr64(metatext), id));
        if (txn && !s->shared_marked)
            json_array_append_new(json_object_get(txn, "success"), etcd_op_mark_shared(s, id));
        if ((rc = etcd_call(&res, s, "/v3/kv/txn", txn, "acquire")) < 0)
            return rc;
        ok = etcd_txn_ok(res);
        json_decref(res);
        if (!ok)
            return lease__seterr(LEASE_ESTORE, "acquire '%s': the lease changed while "
                                 "being acquired again; try again", req->key);
        s->shared_marked = 1;
    }
    out->ttl_ms = granted;
    return etcd_rec_put(s, req->key, req->owner, out->token);
}

/* The acquire txn failed: a retry by the holder, or busy. Takes `res`. */
static int etcd_not_acquired(lease_grant *out, lease_info *holder, etcd_store *s,
                             json_t *res, int64_t id, uint64_t granted,
                             const lease_request *req, const char *metatext,
                             const char *hid)
{
    json_t *kv = etcd_txn_kv(res, 0);
    char *owner;
    int rc;

    s->last_revision = etcd_jint(json_object_get(res, "header"), "revision");
    if (kv == NULL) {
        /* The failure branch reads at the compares' revision: the key was
         * free, so the history compare failed. Nothing was written. */
        json_decref(res);
        etcd_drop_lease(s, id);
        return lease__seterr(LEASE_ESTORE, "acquire '%s': history entry %s "
                             "exists already; try again", req->key, hid);
    }
    owner = etcd_kv_value(kv, NULL);
    if (owner && strcmp(owner, req->owner) == 0) {
        free(owner);
        rc = s->shared ? etcd_adopt(out, s, kv, req, id, granted, metatext)
                       : etcd_retried(out, s, kv, id, req);
        json_decref(res);
        return rc;
    }
    free(owner);
    etcd_drop_lease(s, id);
    rc = etcd_fill_info(holder, s, req->key, kv, etcd_txn_kv(res, 1), 0);
    json_decref(res);
    return rc < 0 ? rc : LEASE_EBUSY;
}

/*
 * The I of a grant's history entry, known before the acquire txn and
 * unique per grant: the id of an etcd lease granted for this grant
 * (`fresh`: etcd does not reuse ids); under a lease that other grants had
 * or have (the pool's, a session's; the same key released and acquired
 * again among them), 64 random bits.
 */
static int etcd_history_id(char out[17], int fresh, int64_t id)
{
    uint64_t v = (uint64_t)id;

    if (!fresh && getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
        return lease__seterr(LEASE_ESTORE, "getrandom failed: %s", strerror(errno));
    snprintf(out, 17, "%016llx", (unsigned long long)v);
    return 0;
}

/*
 * Create the key only if it does not exist, with etcd lease `id`;
 * otherwise read who holds it. The seen/ key is written in the same
 * transaction, so its mod_revision is this grant's token: it tells a free
 * key's last token, and that the key was ever acquired. So is the history
 * entry, whose create_revision is then the token too; the second compare
 * makes sure it is a new key (an existing one would keep an older
 * create_revision). The count of the entries, this one included, tells
 * when to prune. A session's first grant under a shared lease also marks
 * the lease shared, last (the count stays the fifth response): whoever
 * sees the key attached to the lease sees the mark.
 */
static json_t *etcd_acquire_txn(etcd_store *s, const lease_request *req, int64_t id,
                                const char *metatext, const char *histtext,
                                const char *hist)
{
    char hprefix[HNAME_SZ];
    json_t *txn;

    etcd_hist_name(hprefix, req->key, "");
    txn = json_pack("{s:[o, o], s:[o, o, o, o, o], s:[o, o]}",
                    "compare",
                    etcd_cmp(etcd_jkey(s, "lease/", req->key), "CREATE", "EQUAL",
                        "create_revision", json_integer(0)),
                    etcd_cmp(etcd_jkey(s, "history/", hist), "CREATE", "EQUAL",
                        "create_revision", json_integer(0)),
                    "success",
                    etcd_op_put(etcd_jkey(s, "lease/", req->key), etcd_jstr64(req->owner), id),
                    etcd_op_put(etcd_jkey(s, "meta/", req->key), etcd_jstr64(metatext), id),
                    etcd_op_put(etcd_jkey(s, "seen/", req->key), etcd_jstr64(""), 0),
                    etcd_op_put(etcd_jkey(s, "history/", hist), etcd_jstr64(histtext), 0),
                    json_pack("{s:o}", "request_range",
                              json_pack("{s:o, s:o, s:b}", "key",
                                        etcd_jkey(s, "history/", hprefix), "range_end",
                                        etcd_jrange_end(s, "history/", hprefix),
                                        "count_only", 1)),
                    "failure", etcd_op_range(etcd_jkey(s, "lease/", req->key)),
                    etcd_op_range(etcd_jkey(s, "meta/", req->key)));
    if (txn && s->shared && !s->shared_marked)
        json_array_append_new(json_object_get(txn, "success"), etcd_op_mark_shared(s, id));
    return txn;
}

/*
 * The acquire txn beside the keep-alive of the pooled lease `id` it
 * attaches the key to (etcd_pair). *granted: the TTL the keep-alive
 * restored. A key attached while the keep-alive got no answer is asked for
 * again; one whose lease ended (or whose TTL cannot be told) is revoked
 * with its lease: a grant is never reported without its TTL.
 */
static int etcd_paired_txn(json_t **res, uint64_t *granted, etcd_store *s, int64_t id,
                           json_t *txn)
{
    int64_t t0 = lease_clock_ns();
    uint64_t ka = 0;
    pool_lease *p;
    int rc = etcd_pair(res, &ka, s, id, txn);

    if (rc != 0)
        return rc;
    if (etcd_txn_ok(*res) && ka == PAIR_NO_TTL) {
        t0 = lease_clock_ns();
        if ((rc = etcd_keepalive(&ka, s, id)) < 0)
            ka = 0;
    }
    if (etcd_txn_ok(*res) && ka == 0) {
        json_decref(*res);
        *res = NULL;
        /* Whatever stopped the keep-alive (its own timeout included), the
         * outcome is a store's that could not say: ESTORE, which a waiting
         * acquire retries, never ETIMEOUT, which would end its wait. */
        rc = lease__seterr(LEASE_ESTORE, rc == 0
                               ? "acquire: its etcd lease ended while being acquired; try again"
                               : "acquire: the etcd lease's TTL could not be told after the "
                                 "key was attached; ownership is uncertain");
        etcd_revoke(s, id);
        return rc;
    }
    if (ka == 0)
        etcd_pool_forget(s, id); /* ended while idle: nothing attached */
    else if (ka != PAIR_NO_TTL) {
        *granted = ka;
        if ((p = etcd_pool_find(s, id)) != NULL) {
            p->refreshed_ns = t0;
            p->granted_ms = ka;
        }
    }
    return 0;
}

/* The txn's answer (rc, res) of an acquire with etcd lease `id`. */
static int etcd_acquire_answer(lease_grant *out, lease_info *holder, etcd_store *s,
                               const lease_request *req, int rc, json_t *res, int64_t id,
                               uint64_t granted, const char *metatext, const char *hid)
{
    if (rc < 0) {
        /* Unknown outcome: leave the etcd lease; it expires by itself. A
         * session forgets the key: whether it is attached now, and with
         * which token, cannot be told, and a grant it cannot vouch for is
         * reported lost rather than kept. Attached all the same, the key
         * is an orphan that the next renew_many deletes. A plain grant's
         * lease leaves the pool: its key may be attached. */
        if (s->shared)
            etcd_rec_del(s, req->key);
        else
            etcd_pool_forget(s, id);
        return rc;
    }
    if (etcd_txn_ok(res))
        return etcd_acquired(out, s, res, id, granted, req);
    return etcd_not_acquired(out, holder, s, res, id, granted, req, metatext, hid);
}

/* One attempt; PAIR_AGAIN: start over without etcd_pair (may_pair 0). */
static int etcd_acquire_once(lease_grant *out, lease_info *holder, etcd_store *s,
                             const lease_request *req, int may_pair)
{
    uint64_t granted = 0;
    json_t *res = NULL, *txn;
    char *metatext = NULL, *histtext = NULL;
    char hist[HNAME_SZ], hid[17];
    int64_t id;
    int rc, how = TAKE_KEPT;

    rc = s->shared ? etcd_shared_lease(&id, &granted, s)
                   : etcd_pool_take(&id, &granted, &how, s, req->ttl_ms, may_pair);
    if (rc < 0)
        return rc;
    if (s->shared && granted < req->ttl_ms)
        return lease__seterr(LEASE_EINVALID, "acquire '%s': this handle keeps a "
                             "session's grants, whose ttl is %llu ms, not %llu ms",
                             req->key, (unsigned long long)granted,
                             (unsigned long long)req->ttl_ms);
    /* "<ttl_ms>\n<label>": the label is bytes, which JSON text could not
     * always carry; for the same reason the history entry is text with the
     * label last. */
    if (asprintf(&metatext, "%llu\n%s", (unsigned long long)granted, req->label) < 0)
        metatext = NULL;
    if (asprintf(&histtext, "%s\n%llu\n%lld\n%s", req->owner,
                 (unsigned long long)granted, (long long)etcd_wall_ms(), req->label) < 0)
        histtext = NULL;
    rc = metatext && histtext ? etcd_history_id(hid, how == TAKE_FRESH, id)
                              : lease__seterr(LEASE_ENOMEM, "out of memory");
    if (rc < 0) {
        free(metatext);
        free(histtext);
        etcd_drop_lease(s, id);
        return rc;
    }
    etcd_hist_name(hist, req->key, hid);
    txn = etcd_acquire_txn(s, req, id, metatext, histtext, hist);
    free(histtext);
    rc = how == TAKE_PAIR ? etcd_paired_txn(&res, &granted, s, id, txn)
                          : etcd_call(&res, s, "/v3/kv/txn", txn, "acquire");
    if (rc == PAIR_AGAIN)
        etcd_pool_forget(s, id); /* not attached: it expires by itself */
    else
        rc = etcd_acquire_answer(out, holder, s, req, rc, res, id, granted, metatext, hid);
    free(metatext);
    return rc;
}

static int etcd_acquire(lease_grant *out, lease_info *holder, lease_store *base,
                        const lease_request *req)
{
    etcd_store *s = (etcd_store *)base;
    int rc;

    etcd_begin(s);
    if ((rc = etcd_acquire_once(out, holder, s, req, 1)) == PAIR_AGAIN)
        rc = etcd_acquire_once(out, holder, s, req, 0);
    return rc;
}

/* Is (key, owner, token) the current lease? Returns its etcd lease id. */
static int etcd_holder_lease(int64_t *id, etcd_store *s, const char *key,
                             const char *owner, uint64_t token, const char *what)
{
    json_t *res;
    int rc, ok;

    rc = etcd_call(&res, s, "/v3/kv/txn",
              json_pack("{s:o, s:[o]}",
                        "compare", etcd_is_holder(s, key, owner, token),
                        "success", etcd_op_range(etcd_jkey(s, "lease/", key))),
              what);
    if (rc < 0)
        return rc;
    ok = etcd_txn_ok(res) && etcd_txn_kv(res, 0);
    *id = ok ? etcd_jint(etcd_txn_kv(res, 0), "lease") : 0;
    json_decref(res);
    if (!ok)
        return lease__not_holder(what, key, token, NULL);
    if (*id <= 0)
        return lease__seterr(LEASE_ESTORE, "etcd %s: malformed answer: the key has "
                             "lease %lld, not an etcd lease", what, (long long)*id);
    return 0;
}

/*
 * A renew with another ttl: a keep-alive can only restore an etcd lease's
 * own TTL, so move the key to a new etcd lease in a transaction that
 * checks it is still this holder's (a put keeps create_revision, the
 * token), then revoke the old etcd lease.
 */
static int etcd_move_to_new_lease(uint64_t *granted_ms, etcd_store *s, const char *key,
                                  const char *owner, uint64_t token, uint64_t ttl_ms,
                                  int64_t old)
{
    json_t *res, *meta_kv;
    char *meta = NULL, *label, *metatext;
    int64_t id, t0 = lease_clock_ns();
    int rc, ok;

    if ((rc = etcd_grant(&id, granted_ms, NULL, s, ttl_ms)) < 0)
        return rc;
    rc = etcd_call(&res, s, "/v3/kv/range", json_pack("{s:o}", "key", etcd_jkey(s, "meta/", key)),
              "renew");
    if (rc < 0) {
        etcd_revoke(s, id);
        return rc;
    }
    meta_kv = json_array_get(json_object_get(res, "kvs"), 0);
    meta = meta_kv ? etcd_kv_value(meta_kv, NULL) : NULL;
    json_decref(res);
    label = meta && strchr(meta, '\n') ? strchr(meta, '\n') + 1 : "";
    if (asprintf(&metatext, "%llu\n%s", (unsigned long long)*granted_ms, label) < 0)
        metatext = NULL;
    free(meta);
    if (metatext == NULL) {
        etcd_revoke(s, id);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    rc = etcd_call(&res, s, "/v3/kv/txn",
              json_pack("{s:o, s:[o, o]}",
                        "compare", etcd_is_holder(s, key, owner, token),
                        "success", etcd_op_put(etcd_jkey(s, "lease/", key), etcd_jstr64(owner), id),
                        etcd_op_put(etcd_jkey(s, "meta/", key), etcd_jstr64(metatext), id)),
              "renew");
    free(metatext);
    if (rc < 0)
        return rc;
    ok = etcd_txn_ok(res);
    json_decref(res);
    if (!ok) {
        etcd_revoke(s, id);
        return lease__not_holder("renew", key, token, NULL);
    }
    etcd_revoke_unless_shared(s, old);
    /* The key alone is on the new lease: its release may pool it. */
    etcd_pool_add(s, id, ttl_ms, *granted_ms, t0);
    return 0;
}

/* A renew within the call's deadline, set by the caller (etcd_begin). */
static int etcd_renew_one(uint64_t *granted_ms, etcd_store *s, const char *key,
                          const char *owner, uint64_t token, uint64_t ttl_ms)
{
    uint64_t current = 0;
    int64_t id, t0;
    pool_lease *p;
    int rc;

    if ((rc = etcd_holder_lease(&id, s, key, owner, token, "renew")) < 0)
        return rc;
    t0 = lease_clock_ns();
    if ((rc = etcd_keepalive(&current, s, id)) < 0)
        return rc;
    if (current == 0 && s->shared && id == s->shared_id)
        etcd_forget_shared(s);
    if (current == 0) {
        etcd_pool_forget(s, id);
        return lease__seterr(LEASE_ELOST, "renew '%s': the lease expired", key);
    }
    if ((p = etcd_pool_find(s, id)) != NULL) {
        p->refreshed_ns = t0;
        p->granted_ms = current;
    }
    /* A session's key stays on the shared lease, whose TTL is the
     * session's: moving it would take it out of the session's batches. */
    if (s->shared && id == s->shared_id) {
        *granted_ms = current;
        return 0;
    }
    /* The keep-alive restored the TTL granted before; a longer ttl (beyond
     * the server's rounding) needs a new etcd lease. */
    if (ttl_ms > current)
        return etcd_move_to_new_lease(granted_ms, s, key, owner, token, ttl_ms, id);
    *granted_ms = current;
    return 0;
}

static int etcd_renew(uint64_t *granted_ms, lease_store *base, const char *key,
                      const char *owner, uint64_t token, uint64_t ttl_ms)
{
    etcd_store *s = (etcd_store *)base;

    etcd_begin(s);
    return etcd_renew_one(granted_ms, s, key, owner, token, ttl_ms);
}

static int etcd_release(lease_store *base, const char *key, const char *owner,
                        uint64_t token)
{
    etcd_store *s = (etcd_store *)base;
    char ended[HNAME_SZ], tok[PAD + 1], *marker;
    json_t *res;
    pool_lease *p;
    int64_t id = 0;
    int rc, ok;

    etcd_begin(s);
    etcd_pad(tok, token);
    etcd_hist_name(ended, key, tok);
    if (asprintf(&marker, "released\n%lld", (long long)etcd_wall_ms()) < 0)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    /* Delete only if the key is still the one created at `token` and
     * held by this owner; read its etcd lease on the way, then revoke it
     * unless it is shared.
     * The history's end marker goes in the same txn. */
    rc = etcd_call(&res, s, "/v3/kv/txn",
              json_pack("{s:o, s:[o, o, o, o]}",
                        "compare", etcd_is_holder(s, key, owner, token),
                        "success", etcd_op_range(etcd_jkey(s, "lease/", key)),
                        etcd_op_delete(etcd_jkey(s, "lease/", key)),
                        etcd_op_delete(etcd_jkey(s, "meta/", key)),
                        etcd_op_put(etcd_jkey(s, "ended/", ended), etcd_jstr64(marker), 0)),
              "release");
    free(marker);
    if (rc < 0) {
        /* Unknown outcome: the caller lets the grant go all the same. A
         * session forgets the key, so that its next renew_many deletes it
         * as an orphan if it is still attached to the shared lease. */
        if (s->shared)
            etcd_rec_del(s, key);
        return rc;
    }
    ok = etcd_txn_ok(res);
    if (ok && etcd_txn_kv(res, 0))
        id = etcd_jint(etcd_txn_kv(res, 0), "lease");
    json_decref(res);
    if (s->shared)
        etcd_rec_del(s, key);
    if (!ok)
        return lease__not_holder("release", key, token, NULL);
    /* A lease of this handle's pool that the key was attached to has no
     * key left (the pool lends a lease to one grant at a time): idle, no
     * revoke. Any other per-grant etcd lease goes with its key; a
     * session's shared lease keeps the session's other keys. */
    if (id > 0 && (p = etcd_pool_find(s, id)) != NULL && !p->idle)
        p->idle = 1;
    else if (id > 0)
        etcd_revoke_unless_shared(s, id);
    return 0;
}

/* One end marker: the token in its name, and its value. */
typedef struct {
    uint64_t token;
    lease_ended ended;
    int64_t ms;
} end_marker;

/* A decimal number of ms at *p, up to the next '\n' or the end. */
static int etcd_ms_text(int64_t *out, const char **p)
{
    char *end;
    long long v;

    if (**p < '0' || **p > '9')
        return -1;
    errno = 0;
    v = strtoll(*p, &end, 10);
    if (errno != 0 || (*end != '\n' && *end != '\0'))
        return -1;
    *out = v;
    *p = end;
    return 0;
}

/* An end marker "ended/L/K/<20 digits>" = "released\n<ms>" or "lost\n<ms>":
 * 1 when read, 0 for a value of another kind, < 0 when malformed. */
static int etcd_read_marker(end_marker *m, json_t *kv)
{
    const char *k64 = json_string_value(json_object_get(kv, "key"));
    size_t klen = 0, vlen = 0;
    char *k = lease__etcd_b64_decode(k64 ? k64 : "", &klen), *v = etcd_kv_value(kv, &vlen);
    const char *p = v ? strchr(v, '\n') : NULL;
    int rc = 1;

    if (k == NULL || v == NULL)
        rc = lease__seterr(LEASE_ENOMEM, "out of memory reading history");
    else if (klen < PAD || etcd_token_text(&m->token, k + klen - PAD, PAD) < 0 ||
             p == NULL || (p++, etcd_ms_text(&m->ms, &p) < 0) || *p != '\0')
        rc = etcd_malformed("history", "an end marker is not <token> = <how>\\n<ms>");
    else if (strncmp(v, "released\n", 9) == 0)
        m->ended = LEASE_ENDED_RELEASED;
    else if (strncmp(v, "lost\n", 5) == 0)
        m->ended = LEASE_ENDED_LOST;
    else
        rc = 0;
    free(k);
    free(v);
    return rc;
}

/* A history entry: "<owner>\n<ttl_ms>\n<acquired_ms>\n<label>". */
static int etcd_read_entry(lease_history_entry *e, json_t *kv)
{
    size_t len = 0;
    char *v = etcd_kv_value(kv, &len);
    const char *p = v;
    int64_t ttl = 0;
    int rc;

    if (v == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory reading history");
    memset(e, 0, sizeof(*e));
    rc = etcd_token_field(&e->token, kv, "create_revision", "history");
    if (rc == 0 && (len < LEASE_OWNER_LEN + 1 || v[LEASE_OWNER_LEN] != '\n' ||
                    memchr(v, '\0', len) != NULL))
        rc = 1;
    if (rc == 0) {
        v[LEASE_OWNER_LEN] = '\0';
        p = v + LEASE_OWNER_LEN + 1;
        if (!lease_owner_valid(v) || etcd_ms_text(&ttl, &p) < 0 || *p != '\n' ||
            ttl <= 0 || (p++, etcd_ms_text(&e->acquired_ms, &p) < 0) || *p != '\n' ||
            strlen(p + 1) > LEASE_LABEL_MAX)
            rc = 1;
    }
    if (rc == 0) {
        lease__strlcpy(e->owner, v, sizeof(e->owner));
        e->ttl_ms = (uint64_t)ttl;
        lease__strlcpy(e->label, p + 1, sizeof(e->label));
    }
    free(v);
    if (rc == 1)
        rc = etcd_malformed("history", "the entry of token %llu is not "
                            "<owner>\\n<ttl_ms>\\n<acquired_ms>\\n<label>",
                            (unsigned long long)e->token);
    return rc;
}

static int etcd_history(lease_history_entry *out, size_t *n, lease_store *base,
                        const char *key, size_t max)
{
    etcd_store *s = (etcd_store *)base;
    char name[HNAME_SZ];
    json_t *res, *entries, *marks, *rr;
    end_marker *m = NULL;
    size_t nm = 0, i, j;
    int rc;

    *n = 0;
    etcd_begin(s);
    etcd_hist_name(name, key, "");
    /* Entries newest first (the token is the create_revision), and every
     * end marker (pruned with the entries, so few), in one txn: one
     * consistent revision. */
    if ((rr = etcd_history_range(s, name, "DESCEND")) != NULL)
        json_object_set_new(rr, "limit", json_integer((json_int_t)max));
    rc = etcd_call(&res, s, "/v3/kv/txn",
              json_pack("{s:[{s:o}, {s:o}]}", "success", "request_range", rr,
                        "request_range", etcd_range_body(s, "ended/", name)),
              "history");
    if (rc < 0)
        return rc;
    entries = etcd_txn_kvs(res, 0);
    marks = etcd_txn_kvs(res, 1);
    if (json_array_size(marks) &&
        (m = calloc(json_array_size(marks), sizeof(*m))) == NULL) {
        json_decref(res);
        return lease__seterr(LEASE_ENOMEM, "out of memory reading history");
    }
    for (i = 0; rc == 0 && i < json_array_size(marks); i++) {
        int got = etcd_read_marker(&m[nm], json_array_get(marks, i));

        if (got < 0)
            rc = got;
        else
            nm += (size_t)got;
    }
    for (i = 0; rc == 0 && i < json_array_size(entries) && *n < max; i++) {
        lease_history_entry *e = &out[*n];

        if ((rc = etcd_read_entry(e, json_array_get(entries, i))) < 0)
            break;
        /* A grant with no end marker either still holds (the newest: the
         * core checks it against the lease) or ran out: a later grant
         * needed the key free. When it ran out etcd cannot tell. */
        e->ended = *n == 0 ? LEASE_ENDED_HELD : LEASE_ENDED_EXPIRED;
        for (j = 0; j < nm; j++)
            if (m[j].token == e->token) {
                e->ended = m[j].ended;
                e->ended_ms = m[j].ms;
                break;
            }
        (*n)++;
    }
    free(m);
    json_decref(res);
    return rc < 0 ? rc : 0;
}

static int etcd_history_lost(lease_store *base, const char *key, const char *owner,
                             uint64_t token)
{
    etcd_store *s = (etcd_store *)base;
    char name[HNAME_SZ], ended[HNAME_SZ], tok[PAD + 1], *v, *marker;
    json_t *res, *req, *kv, *hkey;
    int rc, mine;

    /* The entry's name holds an id the caller does not know (see the key
     * layout): find it by its create_revision, the token. */
    etcd_begin(s);
    etcd_hist_name(name, key, "");
    req = etcd_range_body(s, "history/", name);
    if (req) {
        json_object_set_new(req, "min_create_revision", json_integer((json_int_t)token));
        json_object_set_new(req, "max_create_revision", json_integer((json_int_t)token));
    }
    if ((rc = etcd_call(&res, s, "/v3/kv/range", req, "history")) < 0)
        return rc;
    kv = json_array_get(json_object_get(res, "kvs"), 0);
    v = kv ? etcd_kv_value(kv, NULL) : NULL;
    mine = v && strncmp(v, owner, LEASE_OWNER_LEN) == 0 && v[LEASE_OWNER_LEN] == '\n';
    free(v);
    if (!mine) {
        /* Pruned, never recorded, or another owner's: nothing to mark. */
        json_decref(res);
        return 0;
    }
    hkey = json_incref(json_object_get(kv, "key"));
    json_decref(res);
    etcd_pad(tok, token);
    etcd_hist_name(ended, key, tok);
    if (asprintf(&marker, "lost\n%lld", (long long)etcd_wall_ms()) < 0) {
        json_decref(hkey);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    /* Only while the entry is there (a prune in between leaves no marker
     * behind) and has no marker yet: a release's stays, and so does an
     * earlier loss with its time. */
    rc = etcd_call(&res, s, "/v3/kv/txn",
              json_pack("{s:[o, o], s:[o]}",
                        "compare",
                        etcd_cmp(hkey, "CREATE", "EQUAL", "create_revision",
                            json_integer((json_int_t)token)),
                        etcd_cmp(etcd_jkey(s, "ended/", ended), "CREATE", "EQUAL",
                            "create_revision", json_integer(0)),
                        "success",
                        etcd_op_put(etcd_jkey(s, "ended/", ended), etcd_jstr64(marker), 0)),
              "history");
    free(marker);
    if (rc < 0)
        return rc;
    json_decref(res);
    return 0;
}

/* The ended/ key of grant `token` of `key`: its end marker, if any. */
static json_t *etcd_marker_key(etcd_store *s, const char *key, uint64_t token)
{
    char ended[HNAME_SZ], tok[PAD + 1];

    etcd_pad(tok, token);
    etcd_hist_name(ended, key, tok);
    return etcd_jkey(s, "ended/", ended);
}

/*
 * The state of a key without a lease (etcd drops lease/K alike on a
 * release and on expiry), from the answer to a read of its last grant's
 * end marker (its kv, NULL when there is none): the grant ran out unless
 * the marker says "released". *state is left as it is then.
 */
static int etcd_marker_state(lease_state *state, json_t *kv)
{
    char *v = kv ? etcd_kv_value(kv, NULL) : NULL;

    if (kv && v == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    if (v == NULL || strncmp(v, "released\n", 9) != 0)
        *state = LEASE_STATE_EXPIRED;
    free(v);
    return 0;
}

/* inspect's key, if it is not held and was granted once: one more request
 * reads its last grant's end marker. */
static int etcd_unheld_state(lease_info *info, etcd_store *s, const char *key)
{
    json_t *res;
    int rc;

    if (info->held || info->token == 0)
        return 0;
    rc = etcd_call(&res, s, "/v3/kv/range",
                   json_pack("{s:o}", "key", etcd_marker_key(s, key, info->token)),
                   "inspect");
    if (rc < 0)
        return rc;
    rc = etcd_marker_state(&info->state, json_array_get(json_object_get(res, "kvs"), 0));
    json_decref(res);
    return rc;
}

static int etcd_inspect(lease_info *out, lease_store *base, const char *key)
{
    etcd_store *s = (etcd_store *)base;
    json_t *res, *seen;
    uint64_t last = 0;
    int rc;

    etcd_begin(s);
    rc = etcd_call(&res, s, "/v3/kv/txn",
              json_pack("{s:[o, o, o]}", "success", etcd_op_range(etcd_jkey(s, "lease/", key)),
                        etcd_op_range(etcd_jkey(s, "meta/", key)),
                        etcd_op_range(etcd_jkey(s, "seen/", key))),
              "inspect");
    if (rc < 0)
        return rc;
    seen = etcd_txn_kv(res, 2);
    if (seen == NULL && etcd_txn_kv(res, 0) == NULL) {
        json_decref(res);
        return lease__seterr(LEASE_ENOTFOUND, "'%s' was never acquired", key);
    }
    rc = seen ? etcd_token_field(&last, seen, "mod_revision", "inspect") : 0;
    if (rc == 0)
        rc = etcd_fill_info(out, s, key, etcd_txn_kv(res, 0), etcd_txn_kv(res, 1), last);
    json_decref(res);
    return rc < 0 ? rc : etcd_unheld_state(out, s, key);
}

/* The lease key names of a range's kvs, "<prefix><kind>" (skip bytes)
 * cut off; NULL for a name that is not one (too long, holds a NUL). */
static char **etcd_kv_names(json_t *kvs, size_t skip)
{
    size_t i, n, count = json_array_size(kvs);
    char **names = calloc(count ? count : 1, sizeof(*names));

    for (i = 0; names && i < count; i++) {
        char *k = etcd_kv_bytes(json_array_get(kvs, i), "key", &n);

        if (k && n > skip && n - skip <= LEASE_KEY_MAX && memchr(k, '\0', n) == NULL) {
            memmove(k, k + skip, n - skip + 1);
            names[i] = k;
        } else {
            free(k);
        }
    }
    return names;
}

static void etcd_free_names(char **names, size_t count)
{
    size_t i;

    for (i = 0; names && i < count; i++)
        free(names[i]);
    free(names);
}

/* The kv of kvs whose name is `name`, walking *at forward: both lists are
 * in the same (byte) order, so the walk is one merge over the whole list. */
static json_t *etcd_kv_named(json_t *kvs, char **names, size_t *at, const char *name)
{
    size_t count = json_array_size(kvs);

    while (*at < count && (names[*at] == NULL || strcmp(names[*at], name) < 0))
        (*at)++;
    return *at < count && strcmp(names[*at], name) == 0 ? json_array_get(kvs, *at) : NULL;
}

/* Reads in one txn of list's end markers: etcd's default --max-txn-ops. */
#define MARKERS_MAX 128

/* Read the end markers of `ops` (ranges) in one txn: the answer of op j
 * gives states[at[j]]. Takes `ops`. */
static int etcd_read_markers(lease_state *states, etcd_store *s, json_t *ops,
                             const size_t *at)
{
    size_t j, n = json_array_size(ops);
    json_t *res;
    int rc;

    /* Each request of a list has the whole timeout: see etcd_list. */
    etcd_begin(s);
    rc = etcd_call(&res, s, "/v3/kv/txn", json_pack("{s:o}", "success", ops), "list");
    if (rc < 0)
        return rc;
    for (j = 0; rc == 0 && j < n; j++)
        rc = etcd_marker_state(&states[at[j]], etcd_txn_kv(res, j));
    json_decref(res);
    return rc;
}

/*
 * The states of the listed keys that are not held, as etcd_unheld_state
 * gives inspect's: states[i] for the i-th seen/ kv (kvs[0]) of the first
 * `count`, found from
 * the end markers of all such keys, read in txns of at most MARKERS_MAX
 * ranges. A key whose seen/ token is malformed is left out: the walk that
 * delivers the keys reports it when it gets there. *out is freed by the
 * caller.
 */
static int etcd_list_states(lease_state **out, etcd_store *s, json_t *kvs[3],
                            char **names[3], size_t count)
{
    size_t i, li = 0, n = 0, at[MARKERS_MAX];
    lease_state *states = calloc(count ? count : 1, sizeof(*states));
    json_t *ops = json_array();
    int rc = 0;

    for (i = 0; rc == 0 && states && ops && i < count; i++) {
        int64_t last = etcd_jint(json_array_get(kvs[0], i), "mod_revision");

        if (names[0][i] == NULL || !lease__token_ok((uint64_t)last) ||
            etcd_kv_named(kvs[1], names[1], &li, names[0][i]) != NULL)
            continue;
        if (json_array_append_new(ops, etcd_op_range(etcd_marker_key(s, names[0][i],
                                                                     (uint64_t)last))) < 0)
            break;
        at[n++] = i;
        if (n == MARKERS_MAX) {
            rc = etcd_read_markers(states, s, ops, at);
            ops = json_array();
            n = 0;
        }
    }
    if (rc == 0 && (states == NULL || ops == NULL || i < count))
        rc = lease__seterr(LEASE_ENOMEM, "out of memory listing keys");
    if (rc == 0 && n > 0) {
        rc = etcd_read_markers(states, s, ops, at);
        ops = NULL;
    }
    json_decref(ops);
    if (rc < 0) {
        free(states);
        return rc;
    }
    *out = states;
    return 0;
}

/*
 * Key-values a range of a page reads (a list's, renew_many's): a list's
 * page of three ranges takes about 3.4 MiB to hold with keys of a few
 * dozen bytes, 8 MiB with the longest keys and labels, within the budget
 * of an answer (etcd/pb.h) however many keys there are.
 */
#define PAGE_KVS 1000
/* The most pages a walk reads (10^8 keys): a member that always says
 * "more" cannot keep it going. */
#define PAGES_MAX 100000

/*
 * A range of at most PAGE_KVS of the keys "<prefix><kind><name>" whose name
 * starts with `prefix`, in key order, from name `from` (its n bytes) on,
 * or from the name just after it (`after`), at revision rev (0: the
 * current one): the pages of one walk read one revision.
 */
static json_t *etcd_page_range(etcd_store *s, const char *kind, const char *prefix,
                               const char *from, size_t n, int after, int64_t rev)
{
    char buf[512 + LEASE_KEY_MAX + 1];
    size_t k = (size_t)snprintf(buf, sizeof(buf), "%s%s", s->prefix, kind);
    json_t *r;

    if (k + n + 1 > sizeof(buf))
        return NULL;
    memcpy(buf + k, from, n);
    k += n;
    if (after)
        buf[k++] = '\0'; /* the first name after `from` */
    r = json_pack("{s:o, s:o, s:I}", "key", etcd_jb64(buf, k), "range_end",
                  etcd_jrange_end(s, kind, prefix), "limit", (json_int_t)PAGE_KVS);
    if (r && rev > 0)
        json_object_set_new(r, "revision", json_integer(rev));
    return r;
}

/* Names a (an bytes) and b (bn) in etcd's order, byte by byte: < 0, 0 or
 * > 0. */
static int etcd_name_cmp(const char *a, size_t an, const char *b, size_t bn)
{
    int c = memcmp(a, b, an < bn ? an : bn);

    return c != 0 ? c : an < bn ? -1 : an > bn;
}

/* Where a page ends: a range of PAGE_KVS (etcd_page_range) asked from
 * `from` (fn bytes; past it with `after`) that has more past its last kv
 * (etcd's "more") ends at that kv's name, malloc'ed into *name (*n bytes),
 * which must be past where it started (so that a walk ends); NULL when
 * the range is whole. */
typedef struct {
    const char *kind, *from;
    size_t fn;
    int after;
} page_at;

static int etcd_range_cut(char **name, size_t *n, etcd_store *s, json_t *range,
                          const page_at *at, const char *what)
{
    json_t *kvs = json_object_get(range, "kvs");
    size_t skip = s->prefix_len + strlen(at->kind), len = 0;
    char *k;
    int c;

    *name = NULL;
    *n = 0;
    if (!json_is_true(json_object_get(range, "more")) || json_array_size(kvs) == 0)
        return 0;
    if ((k = etcd_kv_bytes(json_array_get(kvs, json_array_size(kvs) - 1), "key", &len)) ==
        NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    if (len < skip || memcmp(k, s->prefix, s->prefix_len) != 0 ||
        memcmp(k + s->prefix_len, at->kind, skip - s->prefix_len) != 0 ||
        (c = etcd_name_cmp(k + skip, len - skip, at->from, at->fn)) < 0 ||
        (c == 0 && at->after)) {
        free(k);
        return lease__seterr(LEASE_ESTORE, "etcd %s: malformed answer: a key past the "
                             "range asked for", what);
    }
    memmove(k, k + skip, len - skip);
    *name = k;
    *n = len - skip;
    return 0;
}

/* A list's page: the first seen/ kvs, up to the first name a range of the
 * page was cut before (past it, the other ranges may lack its key-values),
 * and that name (*cut, malloc'ed, *cut_len bytes: the next page starts
 * after it); *cut NULL: the page ends the list. */
typedef struct {
    json_t *res, *kvs[3];
    char **names[3];
    size_t count;
    char *cut;
    size_t cut_len;
} list_page;

static void etcd_list_page_free(list_page *pg)
{
    size_t i;

    for (i = 0; i < 3; i++)
        etcd_free_names(pg->names[i], json_array_size(pg->kvs[i]));
    free(pg->cut);
    json_decref(pg->res);
}

/* Read a page of the seen/, lease/ and meta/ keys of names starting with
 * `prefix`, from `from` (n bytes; past it with `after`), in one txn at
 * revision *rev (0: the current one, which *rev becomes). */
static int etcd_list_page(list_page *pg, etcd_store *s, const char *prefix, const char *from,
                          size_t n, int after, int64_t *rev)
{
    static const char *const kinds[3] = { "seen/", "lease/", "meta/" };
    size_t i, len;
    char *cut;
    int rc;

    memset(pg, 0, sizeof(*pg));
    etcd_begin(s);
    rc = etcd_call_max(&pg->res, s, "/v3/kv/txn",
                       json_pack("{s:[{s:o}, {s:o}, {s:o}]}", "success",
                                 "request_range",
                                 etcd_page_range(s, kinds[0], prefix, from, n, after, *rev),
                                 "request_range",
                                 etcd_page_range(s, kinds[1], prefix, from, n, after, *rev),
                                 "request_range",
                                 etcd_page_range(s, kinds[2], prefix, from, n, after, *rev)),
                       LIST_ANSWER_MAX, "list");
    if (rc < 0)
        return rc;
    if (*rev == 0)
        *rev = etcd_jint(json_object_get(pg->res, "header"), "revision");
    for (i = 0; i < 3; i++) {
        json_t *r = json_array_get(json_object_get(pg->res, "responses"), i);

        pg->kvs[i] = etcd_txn_kvs(pg->res, i);
        pg->names[i] = etcd_kv_names(pg->kvs[i], s->prefix_len + strlen(kinds[i]));
        if (pg->names[i] == NULL)
            rc = lease__seterr(LEASE_ENOMEM, "out of memory listing keys");
        if (rc == 0) {
            page_at at = { kinds[i], from, n, after };

            rc = etcd_range_cut(&cut, &len, s, json_object_get(r, "response_range"), &at,
                                "list");
        }
        if (rc == 0 && cut &&
            (pg->cut == NULL || etcd_name_cmp(cut, len, pg->cut, pg->cut_len) < 0)) {
            free(pg->cut);
            pg->cut = cut;
            pg->cut_len = len;
        } else if (rc == 0) {
            free(cut);
        }
    }
    for (pg->count = 0; rc == 0 && pg->count < json_array_size(pg->kvs[0]); pg->count++) {
        const char *name = pg->names[0][pg->count];

        if (pg->cut && name &&
            etcd_name_cmp(name, strlen(name), pg->cut, pg->cut_len) > 0)
            break;
    }
    return rc;
}

/*
 * Deliver a page's keys: the states of those not held from their end
 * markers (etcd_list_states), then each key in order; a held key costs
 * one more call as it is delivered, its time left, bounded by the
 * timeout of its own (the walk is not).
 */
static int etcd_list_deliver(etcd_store *s, list_page *pg, lease_list_cb cb, void *payload)
{
    size_t i, li = 0, mi = 0;
    lease_state *states = NULL;
    int rc = etcd_list_states(&states, s, pg->kvs, pg->names, pg->count);

    for (i = 0; rc == 0 && i < pg->count; i++) {
        json_t *seen = json_array_get(pg->kvs[0], i);
        const char *name = pg->names[0][i];
        lease_info info;
        uint64_t last = 0;

        if (name == NULL)
            continue;
        etcd_begin(s);
        rc = etcd_token_field(&last, seen, "mod_revision", "list");
        if (rc == 0)
            rc = etcd_fill_info(&info, s, name,
                                etcd_kv_named(pg->kvs[1], pg->names[1], &li, name),
                                etcd_kv_named(pg->kvs[2], pg->names[2], &mi, name), last);
        if (rc == 0 && !info.held && info.token != 0)
            info.state = states[i];
        if (rc == 0)
            rc = cb(&info, payload);
    }
    free(states);
    return rc;
}

/*
 * A list reads the seen/, lease/ and meta/ keys under the prefix a page
 * at a time (PAGE_KVS key-values of each), each page one txn at the
 * revision of the first, so the whole list is one revision's however long
 * it is (a revision etcd compacted meanwhile ends it: ESTORE); a merge
 * joins the three ranges. A page ends before the first name one of its
 * ranges was cut at, and the next starts after the last it delivered.
 */
static int etcd_list(lease_store *base, const char *prefix, lease_list_cb cb,
                     void *payload)
{
    etcd_store *s = (etcd_store *)base;
    list_page pg;
    char *from = NULL;
    size_t n = strlen(prefix), pages;
    int64_t rev = 0;
    int rc;

    /* Each page starts past the names of the one before. */
    for (pages = 1;; pages++) {
        if (pages > PAGES_MAX) {
            rc = etcd_malformed("list", "more than %d pages of keys", PAGES_MAX);
            break;
        }
        if ((rc = etcd_list_page(&pg, s, prefix, from ? from : prefix, n, from != NULL,
                                 &rev)) == 0)
            rc = etcd_list_deliver(s, &pg, cb, payload);
        free(from);
        from = pg.cut;
        n = pg.cut_len;
        pg.cut = NULL;
        etcd_list_page_free(&pg);
        if (rc != 0 || from == NULL)
            break;
    }
    free(from);
    return rc;
}

/* The value of a fence/ kv: the mark, as PAD digits. */
static int etcd_mark_value(uint64_t *mark, json_t *kv, const char *resource)
{
    size_t len = 0;
    char *v = etcd_kv_value(kv, &len);
    int rc = 0;

    if (v == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    if (etcd_token_text(mark, v, len) < 0)
        rc = etcd_malformed("fence", "the mark of '%s' is not a token (1 .. 2^63-1)",
                            resource);
    free(v);
    return rc;
}

static int etcd_read_mark(uint64_t *mark, etcd_store *s, const char *resource)
{
    json_t *res, *kv;
    int rc = etcd_call(&res, s, "/v3/kv/range",
                  json_pack("{s:o}", "key", etcd_jkey(s, "fence/", resource)), "read mark");

    if (rc < 0)
        return rc;
    kv = json_array_get(json_object_get(res, "kvs"), 0);
    if (kv == NULL) {
        json_decref(res);
        return lease__seterr(LEASE_ENOTFOUND, "'%s' has no fencing mark", resource);
    }
    rc = etcd_mark_value(mark, kv, resource);
    json_decref(res);
    return rc;
}

static int etcd_fence_advance(uint64_t *mark, lease_store *base,
                              const char *resource, uint64_t token)
{
    etcd_store *s = (etcd_store *)base;
    char tok[PAD + 1], next[PAD + 1];
    int attempt, rc;

    etcd_begin(s);
    etcd_pad(tok, token);
    etcd_pad(next, token + 1);
    /* Two transactions cover the two cases (etcd compares are ANDed):
     * raise an existing mark below token+1, or create a missing one. A
     * race between them is settled by the next pass; three are plenty. */
    for (attempt = 0; attempt < 3; attempt++) {
        json_t *res, *kv;
        int ok;

        rc = etcd_call(&res, s, "/v3/kv/txn",
                  json_pack("{s:[o, o], s:[o], s:[o]}",
                            "compare",
                            etcd_cmp(etcd_jkey(s, "fence/", resource), "CREATE", "GREATER",
                                "create_revision", json_integer(0)),
                            etcd_cmp(etcd_jkey(s, "fence/", resource), "VALUE", "LESS", "value",
                                etcd_jstr64(next)),
                            "success",
                            etcd_op_put(etcd_jkey(s, "fence/", resource), etcd_jstr64(tok), 0),
                            "failure", etcd_op_range(etcd_jkey(s, "fence/", resource))),
                  "fence");
        if (rc < 0)
            return rc;
        ok = etcd_txn_ok(res);
        kv = etcd_txn_kv(res, 0);
        if (ok) {
            json_decref(res);
            *mark = token;
            return 0;
        }
        if (kv) {
            rc = etcd_mark_value(mark, kv, resource);
            json_decref(res);
            return rc < 0 ? rc : LEASE_ESTALE;
        }
        json_decref(res);
        rc = etcd_call(&res, s, "/v3/kv/txn",
                  json_pack("{s:[o], s:[o]}",
                            "compare",
                            etcd_cmp(etcd_jkey(s, "fence/", resource), "CREATE", "EQUAL",
                                "create_revision", json_integer(0)),
                            "success",
                            etcd_op_put(etcd_jkey(s, "fence/", resource), etcd_jstr64(tok), 0)),
                  "fence");
        if (rc < 0)
            return rc;
        ok = etcd_txn_ok(res);
        json_decref(res);
        if (ok) {
            *mark = token;
            return 0;
        }
    }
    return lease__seterr(LEASE_ESTORE, "fence '%s': the mark kept changing", resource);
}

static int etcd_fence_mark(uint64_t *mark, lease_store *base, const char *resource)
{
    etcd_begin((etcd_store *)base);
    return etcd_read_mark(mark, (etcd_store *)base, resource);
}

static int etcd_guarded_put(lease_store *base, const char *key, const char *owner,
                            uint64_t token, const char *name, const void *value,
                            size_t len)
{
    etcd_store *s = (etcd_store *)base;
    char tok[24];
    json_t *res;
    int rc, ok;

    etcd_begin(s);
    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    rc = etcd_call(&res, s, "/v3/kv/txn",
              json_pack("{s:o, s:[o, o]}",
                        "compare", etcd_is_holder(s, key, owner, token),
                        "success", etcd_op_put(etcd_jkey(s, "data/", name), etcd_jb64(value, len), 0),
                        etcd_op_put(etcd_jkey(s, "datatok/", name), etcd_jstr64(tok), 0)),
              "guarded put");
    if (rc < 0)
        return rc;
    ok = etcd_txn_ok(res);
    json_decref(res);
    if (!ok)
        return lease__not_holder(NULL, key, token, "; nothing was written");
    return 0;
}

static int etcd_data_get(void **value, size_t *len, uint64_t *token,
                         lease_store *base, const char *name)
{
    etcd_store *s = (etcd_store *)base;
    json_t *res;
    size_t tlen = 0;
    char *t = NULL;
    uint64_t tok = 0;
    int rc;

    etcd_begin(s);
    /* The value may be up to 64 MiB, the one answer allowed that much. */
    rc = etcd_call_max(&res, s, "/v3/kv/txn",
                  json_pack("{s:[o, o]}", "success", etcd_op_range(etcd_jkey(s, "data/", name)),
                            etcd_op_range(etcd_jkey(s, "datatok/", name))),
                  DATA_ANSWER_MAX, "read data");
    if (rc < 0)
        return rc;
    if (etcd_txn_kv(res, 0) == NULL || etcd_txn_kv(res, 1) == NULL) {
        json_decref(res);
        return lease__seterr(LEASE_ENOTFOUND, "no data named '%s'", name);
    }
    *value = etcd_kv_value(etcd_txn_kv(res, 0), len);
    t = etcd_kv_value(etcd_txn_kv(res, 1), &tlen);
    json_decref(res);
    if (*value == NULL || t == NULL)
        rc = lease__seterr(LEASE_ENOMEM, "out of memory");
    else if (etcd_token_text(&tok, t, tlen) < 0)
        rc = etcd_malformed("read data", "the token of '%s' is not 1 .. 2^63-1", name);
    free(t);
    if (rc < 0) {
        free(*value);
        *value = NULL;
        return rc;
    }
    if (token)
        *token = tok;
    return 0;
}

/* A watch message: stop at the first DELETE (release or expiry). */
static int etcd_on_watch(json_t *msg, void *arg)
{
    json_t *events = json_object_get(json_object_get(msg, "result"), "events");
    size_t i;

    (void)arg;
    for (i = 0; i < json_array_size(events); i++) {
        const char *type = json_string_value(json_object_get(json_array_get(events, i),
                                                             "type"));
        if (type && strcmp(type, "DELETE") == 0)
            return 1;
    }
    return 0;
}

static int etcd_wait_release(lease_store *base, const char *key, uint64_t timeout_ms)
{
    etcd_store *s = (etcd_store *)base;
    body stream = { .on_message = etcd_on_watch };
    json_t *req, *res = NULL;
    int rc;

    /* A watch costs a request; for a pause this short, just pause. */
    if (timeout_ms < 20) {
        lease__sleep_ns((int64_t)timeout_ms * 1000000);
        return LEASE_ETIMEOUT;
    }

    /* Watch from just after the revision at which the key was seen busy,
     * so a release in between is not missed. */
    req = json_pack("{s:{s:o}}", "create_request", "key", etcd_jkey(s, "lease/", key));
    if (req && s->last_revision > 0 && s->last_revision < INT64_MAX)
        json_object_set_new(json_object_get(req, "create_request"), "start_revision",
                            json_integer(s->last_revision + 1));
    if (req == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    s->end_ns = lease_clock_ns() + (int64_t)timeout_ms * 1000000;
    s->auth_refused = 0;
    rc = etcd_post(&res, s, "/v3/watch", req, s->end_ns, &stream, 0, "watch");
    /* An expired auth token: renewed once, as etcd_call_max does. */
    if (rc == LEASE_ESTORE && s->auth_refused && s->user && !stream.stop &&
        (rc = etcd_authenticate(s)) == 0)
        rc = etcd_post(&res, s, "/v3/watch", req, s->end_ns, &stream, 0, "watch");
    json_decref(req);
    json_decref(res);
    free(stream.data);
    if (rc == 0 && !stream.stop)
        return LEASE_ETIMEOUT; /* the stream ended without a release */
    return rc;
}

/* ---- sessions: one shared etcd lease, renewed once a batch ---------------- */

static int etcd_share_lease(lease_store *base, uint64_t ttl_ms)
{
    etcd_store *s = (etcd_store *)base;

    if (s == NULL || ttl_ms == 0)
        return lease__seterr(LEASE_EINVALID, "share_lease: no store or a zero ttl");
    if (s->shared_id != 0)
        return lease__seterr(LEASE_EINVALID, "share_lease: the handle has a shared "
                             "lease already");
    /* The etcd lease is granted at the first acquire: a session that never
     * acquires costs etcd nothing. */
    s->shared = 1;
    s->shared_ttl_ms = ttl_ms;
    return 0;
}

/*
 * Keys attached to the shared lease that no grant of the handle holds:
 * left by a release or an acquire whose outcome is unknown, or by an
 * acquire that failed after its txn (the handle keeps no record of them),
 * or attached by anyone else with the lease's id. Every keep-alive of the
 * shared lease would keep them, so nobody could take them while the
 * session lives: each round deletes up to ORPHANS_MAX of them, the rest
 * at the next rounds.
 */
#define ORPHANS_MAX 64

typedef struct {
    char *key[ORPHANS_MAX];
    size_t n;
} orphan_list;

static void etcd_orphans_free(orphan_list *o)
{
    size_t i;

    for (i = 0; i < o->n; i++)
        free(o->key[i]);
    o->n = 0;
}

/* Note K, once: the list is short, a scan is enough. When it is full, or
 * out of memory, K waits for a later round. */
static void etcd_orphan_add(orphan_list *o, const char *key)
{
    size_t i;

    if (o == NULL || o->n >= ORPHANS_MAX)
        return;
    for (i = 0; i < o->n; i++)
        if (strcmp(o->key[i], key) == 0)
            return;
    if ((o->key[o->n] = strdup(key)) != NULL)
        o->n++;
}

/* The K of "<prefix><kind>K" (n bytes), or NULL when k is not one. */
static const char *etcd_key_of(const etcd_store *s, const char *k, size_t n,
                               const char *kind)
{
    size_t skip = s->prefix_len + strlen(kind);

    if (n <= skip || n - skip > LEASE_KEY_MAX || memchr(k, '\0', n) != NULL ||
        strncmp(k, s->prefix, s->prefix_len) != 0 ||
        strncmp(k + s->prefix_len, kind, strlen(kind)) != 0)
        return NULL;
    return k + skip;
}

/* One key of a LeaseTimeToLive answer: mark its record seen when it is
 * "P lease/K" and K is in the record; a "P lease/K" or "P meta/K" whose K
 * has no record is an orphan. */
static int etcd_shared_key_seen(etcd_store *s, json_t *k64, orphan_list *orphans)
{
    const char *t = json_string_value(k64), *name;
    size_t n = 0;
    char *k;
    shared_rec *r;

    if (t == NULL || !lease__etcd_b64_valid(t, json_string_length(k64)))
        return etcd_malformed("time to live", "a key of the lease is not base64 text");
    if ((k = lease__etcd_b64_decode(t, &n)) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    if ((name = etcd_key_of(s, k, n, "lease/")) != NULL) {
        if ((r = etcd_rec_find(s, name)) != NULL)
            r->seen = s->rec_round;
        else
            etcd_orphan_add(orphans, name);
    } else if ((name = etcd_key_of(s, k, n, "meta/")) != NULL &&
               etcd_rec_find(s, name) == NULL) {
        etcd_orphan_add(orphans, name);
    }
    free(k);
    return 0;
}

/*
 * The keys attached to the shared lease, from one LeaseTimeToLive: marks
 * the records found with this pass's number and lists the keys attached
 * without a record (orphans). 1 when the lease is gone
 * (TTL -1), 0 when read. The keys are the whole session's: the answer may
 * be as large as a list's.
 */
static int etcd_shared_keys(etcd_store *s, orphan_list *orphans)
{
    json_t *res, *keys;
    int64_t ttl;
    size_t i;
    int rc;

    rc = etcd_call_max(&res, s, "/v3/lease/timetolive",
                       json_pack("{s:I, s:b}", "ID", (json_int_t)s->shared_id, "keys", 1),
                       LIST_ANSWER_MAX, "time to live");
    if (rc < 0)
        return rc;
    ttl = etcd_jint(res, "TTL");
    keys = json_object_get(res, "keys");
    if (ttl == -1)
        rc = 1;
    else if (ttl < 0 || ttl > etcd_ttl_max_s(s))
        rc = etcd_malformed("time to live", "TTL %lld s is not within -1 .. %lld s",
                            (long long)ttl, (long long)etcd_ttl_max_s(s));
    else if (etcd_jint(res, "ID") != s->shared_id)
        rc = etcd_malformed("time to live", "the answer is about lease %lld, not %lld",
                            (long long)etcd_jint(res, "ID"), (long long)s->shared_id);
    else if (keys != NULL && !json_is_array(keys))
        rc = etcd_malformed("time to live", "the keys are not a list");
    for (i = 0; rc == 0 && i < json_array_size(keys); i++)
        rc = etcd_shared_key_seen(s, json_array_get(keys, i), orphans);
    json_decref(res);
    return rc;
}

/* Is `kv` (a P lease/ kv of K) the key the record of K says the handle
 * attached: on the shared lease, created at the grant's token, with its
 * owner? */
static int etcd_rec_is(const etcd_store *s, const shared_rec *r, json_t *kv)
{
    size_t n = 0;
    char *owner = etcd_kv_value(kv, &n);
    int same = owner && n == strlen(r->owner) && strcmp(owner, r->owner) == 0 &&
               etcd_jint(kv, "lease") == s->shared_id &&
               (uint64_t)etcd_jint(kv, "create_revision") == r->token;

    free(owner);
    return same;
}

/* A P lease/ kv written since the last round: when its record was found
 * attached and it is not the key the record says, the grant is lost (its
 * record no longer seen), and the key, on the lease, an orphan. */
static int etcd_shared_change(etcd_store *s, json_t *kv, orphan_list *orphans)
{
    size_t n = 0;
    char *k = etcd_kv_bytes(kv, "key", &n);
    const char *name = k ? etcd_key_of(s, k, n, "lease/") : NULL;
    shared_rec *r = name ? etcd_rec_find(s, name) : NULL;

    if (k == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    if (r && r->seen == s->rec_round && !etcd_rec_is(s, r, kv)) {
        r->seen = 0;
        if (etcd_jint(kv, "lease") == s->shared_id)
            etcd_orphan_add(orphans, name);
    }
    free(k);
    return 0;
}

/*
 * After the LeaseTimeToLive that found the records' keys attached: the
 * P lease/ keys written since the last round (mod_revision past
 * s->shared_checked). A key attached to the shared lease is a grant's only
 * while it is the key the handle created: one deleted and put again on the
 * lease by anyone else has a new create_revision, and may have the owner's
 * text too. Its record is then no longer seen (the grant is lost), and the
 * key, on the lease, is an orphan. Every write to a key on the lease comes
 * after the lease's grant, whose revision the first round starts from, so
 * none escapes a round. The keys listed are those that other clients
 * wrote under the prefix in one round too, usually few, and read a page
 * at a time.
 */
static int etcd_shared_changes(etcd_store *s, orphan_list *orphans)
{
    json_t *req, *res = NULL, *kvs;
    char *from = NULL, *next = NULL;
    size_t i, n = 0, pages = 0;
    int64_t rev = 0;
    int rc;

    /* A page at a time (PAGE_KVS), at the revision of the first; each page
     * starts past the keys of the one before. */
    do {
        page_at at = { "lease/", from ? from : "", from ? n : 0, from != NULL };

        if (++pages > PAGES_MAX) {
            free(from);
            return etcd_malformed("time to live", "more than %d pages of keys", PAGES_MAX);
        }
        req = etcd_page_range(s, at.kind, "", at.from, at.fn, at.after, rev);
        if (req)
            json_object_set_new(req, "min_mod_revision", json_integer(s->shared_checked + 1));
        if ((rc = etcd_call_max(&res, s, "/v3/kv/range", req, LIST_ANSWER_MAX,
                                "time to live")) < 0) {
            free(from);
            return rc;
        }
        if (rev == 0)
            rev = etcd_jint(json_object_get(res, "header"), "revision");
        kvs = json_object_get(res, "kvs");
        for (i = 0; rc == 0 && i < json_array_size(kvs); i++)
            rc = etcd_shared_change(s, json_array_get(kvs, i), orphans);
        if (rc == 0)
            rc = etcd_range_cut(&next, &n, s, res, &at, "time to live");
        json_decref(res);
        free(from);
        from = next;
        next = NULL;
    } while (rc == 0 && from != NULL);
    free(from);
    if (rc == 0 && rev > s->shared_checked)
        s->shared_checked = rev;
    return rc;
}

/*
 * The guarded delete of one orphan, as read in `kv` (its P lease/K; NULL
 * when only P meta/K was left): a txn of its own inside the round's one,
 * so that each key's compares decide for that key alone. The key goes
 * only while it is still the one read (its create_revision and owner) and
 * on the shared lease; its end marker is written as a release writes it.
 * NULL when the key is not this lease's (any more) or out of memory.
 */
static json_t *etcd_orphan_op(etcd_store *s, const char *key, json_t *kv,
                              const char *marker)
{
    char ended[HNAME_SZ], tok[PAD + 1];
    const char *v;
    uint64_t token = 0;
    json_t *txn;

    if (kv == NULL) {
        txn = json_pack("{s:[o, o], s:[o]}", "compare",
                        etcd_cmp(etcd_jkey(s, "lease/", key), "CREATE", "EQUAL",
                                 "create_revision", json_integer(0)),
                        etcd_cmp(etcd_jkey(s, "meta/", key), "LEASE", "EQUAL", "lease",
                                 json_integer((json_int_t)s->shared_id)),
                        "success", etcd_op_delete(etcd_jkey(s, "meta/", key)));
        return txn ? json_pack("{s:o}", "request_txn", txn) : NULL;
    }
    if (etcd_jint(kv, "lease") != s->shared_id ||
        etcd_token_field(&token, kv, "create_revision", "orphan cleanup") < 0)
        return NULL;
    /* The value as etcd sent it (base64, checked): etcd leaves out an
     * empty one. */
    v = json_string_value(json_object_get(kv, "value"));
    etcd_pad(tok, token);
    etcd_hist_name(ended, key, tok);
    txn = json_pack("{s:[o, o, o], s:[o, o, o]}", "compare",
                    etcd_cmp(etcd_jkey(s, "lease/", key), "CREATE", "EQUAL",
                             "create_revision", json_integer((json_int_t)token)),
                    etcd_cmp(etcd_jkey(s, "lease/", key), "VALUE", "EQUAL", "value",
                             json_string(v ? v : "")),
                    etcd_cmp(etcd_jkey(s, "lease/", key), "LEASE", "EQUAL", "lease",
                             json_integer((json_int_t)s->shared_id)),
                    "success", etcd_op_delete(etcd_jkey(s, "lease/", key)),
                    etcd_op_delete(etcd_jkey(s, "meta/", key)),
                    etcd_op_put(etcd_jkey(s, "ended/", ended), etcd_jstr64(marker), 0));
    return txn ? json_pack("{s:o}", "request_txn", txn) : NULL;
}

/* The guarded deletes of the orphans read in `res` (one range each, in
 * the list's order), or NULL when there is none or the answer does not
 * have one response per orphan. */
static json_t *etcd_orphan_ops(etcd_store *s, const orphan_list *o, json_t *res)
{
    json_t *ops, *op;
    char *marker;
    size_t i;

    if (json_array_size(json_object_get(res, "responses")) != o->n) {
        etcd_malformed("orphan cleanup", "%zu responses to %zu ranges",
                       json_array_size(json_object_get(res, "responses")), o->n);
        return NULL;
    }
    if (asprintf(&marker, "released\n%lld", (long long)etcd_wall_ms()) < 0)
        return NULL;
    if ((ops = json_array()) == NULL) {
        free(marker);
        return NULL;
    }
    for (i = 0; i < o->n; i++)
        if ((op = etcd_orphan_op(s, o->key[i], etcd_txn_kv(res, i), marker)) != NULL)
            json_array_append_new(ops, op);
    free(marker);
    if (json_array_size(ops) == 0) {
        json_decref(ops);
        return NULL;
    }
    return ops;
}

/*
 * Delete the orphans, best effort: one txn reads their keys, one deletes
 * those still on the shared lease, each under its own compares (ORPHANS_MAX
 * of them stay within etcd's --max-txn-ops). What fails waits for a later
 * round. The round's results are already decided; the cleanup gets a
 * twentieth of the ttl at most, as the history's prune does, and the
 * call's error state is kept.
 */
static void etcd_clean_orphans(etcd_store *s, orphan_list *o, uint64_t ttl_ms)
{
    char saved[LEASE__ERRMSG_SIZE];
    int code = lease_errcode();
    int64_t end = s->end_ns;
    int64_t budget = lease_clock_ns() + (int64_t)(ttl_ms / 20 ? ttl_ms / 20 : 1) * 1000000;
    json_t *read, *res = NULL, *ops;
    size_t i;

    if (o->n == 0 || (read = json_array()) == NULL)
        return;
    lease__strlcpy(saved, lease_errmsg(), sizeof(saved));
    if (budget < s->end_ns)
        s->end_ns = budget;
    /* A range that could not be built leaves the answer one response
     * short, which etcd_orphan_ops refuses. */
    for (i = 0; i < o->n; i++)
        json_array_append_new(read, etcd_op_range(etcd_jkey(s, "lease/", o->key[i])));
    if (etcd_call(&res, s, "/v3/kv/txn", json_pack("{s:o}", "success", read),
                          "orphan cleanup") == 0) {
        ops = etcd_orphan_ops(s, o, res);
        json_decref(res);
        res = NULL;
        if (ops && etcd_call(&res, s, "/v3/kv/txn", json_pack("{s:o}", "success", ops),
                             "orphan cleanup") == 0)
            json_decref(res);
    }
    s->end_ns = end;
    if (code < 0)
        lease__seterr(code, "%s", saved);
}

/* Every grant of the batch lost: the shared lease ended. */
static int etcd_all_lost(int *results, uint64_t *granted_ms, etcd_store *s, size_t n)
{
    size_t i;

    etcd_forget_shared(s);
    for (i = 0; i < n; i++) {
        results[i] = LEASE_ELOST;
        granted_ms[i] = 0;
    }
    return 0;
}

/* A grant is renewed when its key is attached (this pass saw it) and the
 * handle attached it with this token and owner. */
static void etcd_renew_results(int *results, uint64_t *granted_ms, etcd_store *s,
                               const lease_grant *grants, size_t n, uint64_t ttl)
{
    size_t i;

    /* A key no longer attached never comes back to this lease but through
     * an acquire on this handle, which records it again. */
    etcd_rec_sweep(s, s->rec_round);
    for (i = 0; i < n; i++) {
        const shared_rec *r = etcd_rec_find(s, grants[i].key);
        int held = r && r->token == grants[i].token &&
                   strcmp(r->owner, grants[i].owner) == 0;

        results[i] = held ? 0 : LEASE_ELOST;
        granted_ms[i] = held ? ttl : 0;
    }
}

/*
 * A session handle's batch, whatever its size: one keep-alive of the
 * shared lease, then one LeaseTimeToLive for the keys attached to it and
 * one range for the keys written since the last round. A grant is renewed
 * when its key is attached and is the key the handle attached, with this
 * token and owner; every grant is lost when the lease ended.
 * Then the keys attached that no record holds (orphans) are deleted.
 * Without share_lease: one renew per grant.
 */
static int etcd_renew_many(int *results, uint64_t *granted_ms, lease_store *base,
                           const lease_grant *grants, size_t n, uint64_t ttl_ms)
{
    etcd_store *s = (etcd_store *)base;
    orphan_list orphans = { { NULL }, 0 };
    uint64_t ttl = 0;
    size_t i;
    int rc;

    /* One call, one deadline: without a shared lease, grant after grant
     * within it (those past it fail at once, uncertain). */
    etcd_begin(s);
    if (!s->shared) {
        for (i = 0; i < n; i++)
            results[i] = etcd_renew_one(&granted_ms[i], s, grants[i].key, grants[i].owner,
                                        grants[i].token, ttl_ms);
        return 0;
    }
    if (s->shared_id == 0)
        return etcd_all_lost(results, granted_ms, s, n);
    if ((rc = etcd_keepalive(&ttl, s, s->shared_id)) < 0)
        return rc;
    if (ttl == 0)
        return etcd_all_lost(results, granted_ms, s, n);
    if (++s->rec_round == 0)
        s->rec_round = 1; /* 0 is no pass */
    rc = etcd_shared_keys(s, &orphans);
    if (rc == 0)
        rc = etcd_shared_changes(s, &orphans);
    if (rc == 0) {
        etcd_renew_results(results, granted_ms, s, grants, n, ttl);
        /* After the results: the orphans were listed by the same
         * LeaseTimeToLive, and this handle attaches nothing in between. */
        etcd_clean_orphans(s, &orphans, ttl);
    }
    etcd_orphans_free(&orphans);
    return rc == 1 ? etcd_all_lost(results, granted_ms, s, n) : rc;
}

/* ---- open and close ---------------------------------------------------- */

/*
 * The pool's idle leases are revoked, within POOL_CLOSE_MS at most (the
 * rest expire by themselves: no key is attached to them). Those in use
 * hold keys that outlive the handle; a child of fork leaves the parent's.
 */
static void etcd_pool_close(etcd_store *s)
{
    uint64_t budget = s->parent.timeout_ms < POOL_CLOSE_MS ? s->parent.timeout_ms
                                                            : POOL_CLOSE_MS;
    int i;

    if (s->curl == NULL || s->multi == NULL || s->pool_pid != getpid())
        return;
    s->end_ns = lease_clock_ns() + (int64_t)budget * 1000000;
    for (i = 0; i < POOL_MAX && lease_clock_ns() < s->end_ns; i++)
        if (s->pool[i].id != 0 && s->pool[i].idle)
            etcd_revoke(s, s->pool[i].id);
}

static void etcd_close(lease_store *base)
{
    etcd_store *s = (etcd_store *)base;
    int i;

    etcd_pool_close(s);
    etcd_rec_sweep(s, 0);
    free(s->rec);
    if (s->curl)
        curl_easy_cleanup(s->curl);
    if (s->curl2)
        curl_easy_cleanup(s->curl2);
    if (s->multi)
        curl_multi_cleanup(s->multi);
    for (i = 0; i < s->nendpoints; i++) {
        free(s->endpoints[i]);
        lease__net_name_clear(&s->names[i].name);
    }
    free(s->prefix);
    free(s->cacert);
    free(s->cert);
    free(s->key);
    free(s->user);
    if (s->password) {
        if (s->password_from_file)
            lease__secret_release(s->password);
        lease__free_secret(s->password);
    }
    lease__free_secret(s->token);
}

/* "host:port", "[v6]:port": what a member may be, checked before any
 * connection so that a typo is EINVALID, not an unreachable store. */
static int etcd_member_valid(const char *p, size_t n)
{
    size_t h = 0, port_at;
    unsigned long port = 0;

    if (n > 0 && p[0] == '[') {
        for (h = 1; h < n && p[h] != ']'; h++)
            if (!strchr("0123456789abcdefABCDEF:.", p[h]))
                return 0;
        if (h >= n || h == 1)
            return 0;
        h++;
    } else {
        for (; h < n && p[h] != ':'; h++)
            if (!((p[h] >= 'a' && p[h] <= 'z') || (p[h] >= 'A' && p[h] <= 'Z') ||
                  (p[h] >= '0' && p[h] <= '9') || p[h] == '.' || p[h] == '-' ||
                  p[h] == '_'))
                return 0;
        if (h == 0)
            return 0;
    }
    if (h >= n || p[h] != ':' || n - h - 1 < 1 || n - h - 1 > 5)
        return 0;
    for (port_at = h + 1; port_at < n; port_at++) {
        if (p[port_at] < '0' || p[port_at] > '9')
            return 0;
        port = port * 10 + (unsigned long)(p[port_at] - '0');
    }
    return port >= 1 && port <= 65535;
}

static int etcd_parse_members(etcd_store *s, const lease__url *u)
{
    const char *scheme = strcmp(u->scheme, "etcds") == 0 ? "https://" : "http://";
    const char *p = u->hosts;

    if (!u->has_authority || *p == '\0')
        return lease__seterr(LEASE_EINVALID,
                             "an etcd URL names its members: etcd://host:port[,host:port...][/prefix]");
    if ((u->password || u->user) && (u->user == NULL || *u->user == '\0'))
        return lease__seterr(LEASE_EINVALID, "an etcd URL with a password names its user");
    if (u->user && ((s->user = strdup(u->user)) == NULL ||
                    (u->password && (s->password = strdup(u->password)) == NULL)))
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    while (*p) {
        size_t n = strcspn(p, ",");
        char *e;

        if (s->nendpoints == MAX_ENDPOINTS)
            return lease__seterr(LEASE_EINVALID, "an etcd URL names at most %d members",
                                 MAX_ENDPOINTS);
        if (n == 0 || n > 255 || !etcd_member_valid(p, n))
            return lease__seterr(LEASE_EINVALID, "bad member '%.*s' in the etcd URL: "
                                 "expected host:port or [v6 address]:port",
                                 (int)(n > 64 ? 64 : n), p);
        if ((e = malloc(strlen(scheme) + n + 1)) == NULL)
            return lease__seterr(LEASE_ENOMEM, "out of memory");
        sprintf(e, "%s%.*s", scheme, (int)n, p);
        s->endpoints[s->nendpoints++] = e;
        p += n;
        if (*p == ',' && *++p == '\0')
            return lease__seterr(LEASE_EINVALID, "the etcd URL's member list ends with ','");
    }
    return 0;
}

static int etcd_parse_prefix(etcd_store *s, const lease__url *u)
{
    if (u->path[0] && strcmp(u->path, "/") != 0) {
        size_t n = strlen(u->path);
        if ((s->prefix = malloc(n + 2)) == NULL)
            return lease__seterr(LEASE_ENOMEM, "out of memory");
        strcpy(s->prefix, u->path);
        if (s->prefix[n - 1] != '/')
            strcat(s->prefix, "/");
    } else if ((s->prefix = strdup("/lease/")) == NULL) {
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    if (strlen(s->prefix) > 256)
        return lease__seterr(LEASE_EINVALID, "etcd prefix is too long");
    s->prefix_len = strlen(s->prefix);
    return 0;
}

/* ?cacert=, ?cert=, ?key=: files for etcds://, each once, readable now. */
static int etcd_parse_tls_param(etcd_store *s, const lease__url *u, const char *name,
                                const char *v)
{
    char **slot = strcmp(name, "cacert") == 0 ? &s->cacert
                  : strcmp(name, "cert") == 0 ? &s->cert
                                              : &s->key;

    if (strcmp(u->scheme, "etcds") != 0)
        return lease__seterr(LEASE_EINVALID, "?%s= is for etcds:// (TLS) only", name);
    if (*slot != NULL)
        return lease__seterr(LEASE_EINVALID, "?%s= is given twice", name);
    if (v == NULL || *v == '\0' || access(v, R_OK) != 0)
        return lease__seterr(LEASE_EINVALID, "?%s=: cannot read '%.200s'", name,
                             v ? v : "");
    if ((*slot = strdup(v)) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    return 0;
}

static int etcd_parse_params(etcd_store *s, const lease__url *u)
{
    size_t i;
    int rc = 0;

    for (i = 0; rc == 0 && i < u->nparams; i++) {
        const char *name = u->params[i].name, *v = u->params[i].value;

        if (strcmp(name, "cacert") == 0 || strcmp(name, "cert") == 0 ||
            strcmp(name, "key") == 0)
            rc = etcd_parse_tls_param(s, u, name, v);
        else if (strcmp(name, "password_file") == 0) {
            rc = lease__read_password_file(&s->password, "etcd", v ? v : "");
            s->password_from_file = rc == 0;
        } else if (strcmp(name, "transport") == 0) {
            if (v && strcmp(v, "grpc") == 0)
                s->grpc = 1;
            else if (v && strcmp(v, "json") == 0)
                s->grpc = 0;
            else
                rc = lease__seterr(LEASE_EINVALID, "?transport= is grpc (the default) "
                                   "or json (etcd's JSON gateway), not '%.32s'",
                                   v ? v : "");
        } else if (strcmp(name, "tokens") == 0)
            rc = lease__url_tokens_refused("etcd's tokens are revisions "
                                           "agreed by consensus, never issued "
                                           "twice");
        else
            rc = lease__seterr(LEASE_EINVALID, "unknown etcd URL parameter '%.64s' "
                               "(known: cacert, cert, key, password_file, transport)", name);
    }
    if (rc == 0 && !s->cert != !s->key)
        rc = lease__seterr(LEASE_EINVALID, "?cert= and ?key= go together");
    if (rc == 0 && !s->user != !s->password)
        rc = lease__seterr(LEASE_EINVALID, s->user ? "an etcd URL with a user takes a "
                           "password (user:password@ or ?password_file=)"
                                                   : "?password_file= needs a user "
                           "(etcd://user@host:port?password_file=...)");
    return rc;
}

static int etcd_parse_url(etcd_store *s, const lease__url *u)
{
    int rc;

    if ((rc = etcd_parse_members(s, u)) < 0 || (rc = etcd_parse_prefix(s, u)) < 0)
        return rc;
    return etcd_parse_params(s, u);
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

/* libcurl's start-up may open files of its own without O_CLOEXEC: the
 * TLS key log that $SSLKEYLOGFILE names (OpenSSL's backend opens it in
 * curl_global_init). Whatever appeared while it ran is made close-on-exec,
 * so that a child of `lease run` does not inherit it, as the Kubernetes
 * store's HTTP client (store_http.c, not linked into this store) does. */
static void etcd_curl_start(void)
{
    size_t n;
    unsigned char *before = etcd_fd_snapshot(&n), *after;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    after = etcd_fd_snapshot(&n);
    etcd_fds_cloexec(before, after, n, 0);
    free(before);
    free(after);
}

static int etcd_open(lease_store *base, const char *url)
{
    etcd_store *s = (etcd_store *)base;
    lease__url u;
    json_t *res = NULL;
    int rc;

    if ((rc = lease__url_parse(&u, url)) < 0)
        return rc;
    s->grpc = 1;
    rc = etcd_parse_url(s, &u);
    lease__url_free(&u);
    pthread_once(&curl_once, etcd_curl_start);
    if (rc == 0 && ((s->curl = curl_easy_init()) == NULL ||
                    (s->multi = etcd_multi_new()) == NULL))
        rc = lease__seterr(LEASE_ENOMEM, "cannot start libcurl");
    /* Over gRPC one connection carries every call (etcd_pair's two as
     * streams of it), and an HTTP/1.1 one left by a call that met the
     * gateway (etcd_h2_version) must not stay for the next to reuse. */
    if (rc == 0 && s->grpc)
        curl_multi_setopt(s->multi, CURLMOPT_MAXCONNECTS, 1L);
    /* Say hello to the cluster, so a wrong URL fails at open. */
    etcd_begin(s);
    if (rc == 0 && s->user)
        rc = etcd_authenticate(s);
    if (rc == 0)
        rc = etcd_call(&res, s, "/v3/kv/range",
                  json_pack("{s:o, s:b}", "key", etcd_jkey(s, "seen/", ""), "count_only", 1),
                  "connect");
    json_decref(res);
    if (rc < 0)
        etcd_close(&s->parent);
    return rc;
}

/* For lease --version: libcurl and jansson as linked at run time. */
int lease__etcd_client_version(char *buf, size_t size)
{
    const curl_version_info_data *c = curl_version_info(CURLVERSION_NOW);

    return snprintf(buf, size, "libcurl %s, jansson %s",
                    c && c->version ? c->version : "?", jansson_version_str());
}

const lease_backend lease__etcd_backend = {
    .version = LEASE_BACKEND_VERSION,
    .name = "etcd",
    .schemes = lease__etcd_schemes,
    .features = LEASE_FEATURE_NOTIFY | LEASE_FEATURE_ROUNDS_TTL |
                LEASE_FEATURE_RENEW_MANY | LEASE_FEATURE_SHARED,
    .store_size = sizeof(etcd_store),
    .open3 = etcd_open,
    .close = etcd_close,
    .acquire = etcd_acquire,
    .renew = etcd_renew,
    .release = etcd_release,
    .inspect = etcd_inspect,
    .list = etcd_list,
    .fence_advance = etcd_fence_advance,
    .fence_mark = etcd_fence_mark,
    .guarded_put = etcd_guarded_put,
    .data_get = etcd_data_get,
    .guarded_txn = NULL,
    .wait_release = etcd_wait_release,
    .renew_many = etcd_renew_many,
    .set_timeout = NULL, /* etcd_begin reads parent.timeout_ms */
    .advisory_txn = NULL,
    .history = etcd_history,
    .history_lost = etcd_history_lost,
    .share_lease = etcd_share_lease,
};
