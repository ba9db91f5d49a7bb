/*
 * net.c - name lookups and TCP connections for the stores whose client
 * library would do both without a bound (hiredis resolves and connects in
 * one blocking call; libpq resolves before its connect_timeout starts).
 *
 * A store call is bounded by its timeout as a whole, and getaddrinfo() has
 * no timeout of its own: a lookup runs on a thread of its own, which the
 * caller stops waiting for at its deadline (the list of lookups below says
 * what becomes of a late answer). A numeric address is taken as it is,
 * with no thread.
 *
 * Every socket is made close-on-exec and non-blocking in socket() itself,
 * so that no fork+exec of another thread can inherit it at any moment.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "lease_int.h"

/*
 * The lookups in flight, one per name and port, in one list under one
 * lock: a call for a name already being looked up waits on that lookup
 * instead of starting another, so a resolver that hangs costs one thread
 * per name, not one per call (and at most NET_LOOKUPS_MAX in all). An
 * answer that comes after every caller has left is kept for the next call
 * of that name within NET_LATE_KEEP_NS, once: a resolver slower than the
 * timeout then still lets the call after it connect.
 */
#define NET_LOOKUPS_MAX 64
#define NET_LATE_MAX 64
#define NET_LATE_KEEP_NS (30 * (int64_t)1000000000)

typedef struct net_lookup {
    struct net_lookup *next;
    char *host, *port;
    int done;
    int err;            /* getaddrinfo's answer */
    int sys_errno;      /* errno on the lookup's thread, for EAI_SYSTEM */
    int waiters;        /* calls waiting for it */
    int64_t late_until; /* done with no one waiting: kept until then */
    struct addrinfo *res;
} net_lookup;

static pthread_mutex_t net_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t net_cv;    /* CLOCK_MONOTONIC; a lookup has ended */
static pthread_once_t net_once = PTHREAD_ONCE_INIT;
static net_lookup *net_lookups;
static int net_in_flight;
static int net_late; /* late answers kept */

/* Under net_mu: take l out of the list and free it. */
static void lookup_free(net_lookup *l)
{
    net_lookup **pp;

    /* Bounded by the list, at most NET_LOOKUPS_MAX and NET_LATE_MAX. */
    for (pp = &net_lookups; *pp != NULL; pp = &(*pp)->next)
        if (*pp == l) {
            *pp = l->next;
            break;
        }
    if (l->late_until)
        net_late--;
    if (l->res)
        freeaddrinfo(l->res);
    free(l->host);
    free(l->port);
    free(l);
}

static void cv_init(void)
{
    pthread_condattr_t ca;

    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&net_cv, &ca);
    pthread_condattr_destroy(&ca);
}

/*
 * fork(): the child has none of the lookup threads, so a lookup in flight
 * would never end there, and every call of its name in the child would
 * wait for it to its deadline (64 of them would refuse every name). Nor
 * may the child find net_mu held by a thread it does not have. So fork
 * takes the lock (released on both sides, as src/core/store.c's), and the
 * child starts with an empty list: there it is the only thread, with no
 * caller waiting on any lookup.
 */
static void fork_prepare(void)
{
    pthread_mutex_lock(&net_mu);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&net_mu);
}

static void fork_child(void)
{
    net_lookup *l;

    /* Bounded by the list, at most NET_LOOKUPS_MAX and NET_LATE_MAX. */
    while ((l = net_lookups) != NULL)
        lookup_free(l);
    net_in_flight = net_late = 0;
    cv_init();
    pthread_mutex_unlock(&net_mu);
}

static void net_init(void)
{
    cv_init();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static void *lookup_thread(void *arg)
{
    net_lookup *l = arg;
    struct addrinfo hints, *res = NULL;
    int err, e;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    /* No AI_ADDRCONFIG: it counts no loopback address, so a
     * host whose only IPv6 address is ::1 would lose localhost's ::1. An
     * address of a family the host cannot reach fails its connect at once,
     * leaving the time to the next address (lease__net_connect, libpq). */
    err = getaddrinfo(l->host, l->port, &hints, &res);
    e = errno;
    pthread_mutex_lock(&net_mu);
    l->err = err;
    l->sys_errno = e;
    l->res = err == 0 ? res : NULL;
    l->done = 1;
    net_in_flight--;
    if (l->waiters == 0) { /* everyone left: keep an answer for the next */
        if (err == 0 && l->res != NULL && net_late < NET_LATE_MAX) {
            l->late_until = lease_clock_ns() + NET_LATE_KEEP_NS;
            net_late++;
        } else {
            lookup_free(l);
        }
    }
    pthread_cond_broadcast(&net_cv);
    pthread_mutex_unlock(&net_mu);
    return NULL;
}

static int lookup_failed(const lease_store *s, const char *host, const char *why)
{
    return lease__seterr(LEASE_ESTORE, "cannot connect to %s %s: cannot resolve %s: %s",
                         s->backend->name, s->url_redacted, host, why);
}

/* Start the lookup's thread with every signal blocked, so that a signal
 * meant for the program is never run on it: 0 or pthread_create's error. */
static int lookup_start(net_lookup *l)
{
    sigset_t all, old;
    pthread_attr_t a;
    pthread_t t;
    int rc;

    if ((rc = pthread_attr_init(&a)) != 0)
        return rc;
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&t, &a, lookup_thread, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&a);
    return rc;
}

/* Under net_mu: the lookup of host:port to wait for (waiters counted),
 * started if there is none. Late answers past their time are dropped on
 * the way. */
static int lookup_get(net_lookup **out, const lease_store *s, const char *host,
                      const char *port)
{
    int64_t now = lease_clock_ns();
    net_lookup *l, *next;
    int err;

    *out = NULL;
    /* Bounded by the list, at most NET_LOOKUPS_MAX and NET_LATE_MAX. */
    for (l = net_lookups; l != NULL; l = next) {
        next = l->next;
        if (l->done && l->waiters == 0 && l->late_until < now)
            lookup_free(l);
    }
    for (l = net_lookups; l != NULL; l = l->next)
        if (strcmp(l->host, host) == 0 && strcmp(l->port, port) == 0) {
            l->waiters++;
            *out = l;
            return 0;
        }
    if (net_in_flight >= NET_LOOKUPS_MAX)
        return lookup_failed(s, host, "too many name lookups without an answer in "
                             "this process");
    if ((l = calloc(1, sizeof(*l))) == NULL || (l->host = strdup(host)) == NULL ||
        (l->port = strdup(port)) == NULL) {
        if (l)
            free(l->host);
        free(l);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    l->next = net_lookups;
    net_lookups = l;
    if ((err = lookup_start(l)) != 0) {
        lookup_free(l);
        return lease__seterr(LEASE_ESTORE, "cannot connect to %s %s: cannot start a "
                             "thread for the name lookup: %s", s->backend->name,
                             s->url_redacted, strerror(err));
    }
    net_in_flight++;
    l->waiters = 1;
    *out = l;
    return 0;
}

/* A copy of the answer's addresses that the caller owns (lease__net_free):
 * the lookup's own may be shared by several callers. */
static int addrs_copy(struct addrinfo **out, const struct addrinfo *res)
{
    struct addrinfo **tail = out;

    *out = NULL;
    /* Bounded by the addresses of one answer. */
    for (; res != NULL; res = res->ai_next) {
        struct addrinfo *a = calloc(1, sizeof(*a) + res->ai_addrlen);

        if (a == NULL) {
            lease__net_free(*out);
            *out = NULL;
            return lease__seterr(LEASE_ENOMEM, "out of memory");
        }
        a->ai_family = res->ai_family;
        a->ai_socktype = res->ai_socktype;
        a->ai_protocol = res->ai_protocol;
        a->ai_addrlen = res->ai_addrlen;
        a->ai_addr = (struct sockaddr *)(a + 1);
        memcpy(a->ai_addr, res->ai_addr, res->ai_addrlen);
        *tail = a;
        tail = &a->ai_next;
    }
    return 0;
}

void lease__net_free(struct addrinfo *addrs)
{
    /* Bounded by the list, made by addrs_copy. */
    while (addrs != NULL) {
        struct addrinfo *next = addrs->ai_next;

        free(addrs);
        addrs = next;
    }
}

/* Under net_mu: the answer of a lookup that is done, for a caller. */
static int lookup_answer(struct addrinfo **out, const lease_store *s, const net_lookup *l,
                         const char *host)
{
    char why[128];

    if (l->err == 0 && l->res != NULL)
        return addrs_copy(out, l->res);
    if (l->err == 0)
        return lookup_failed(s, host, "no address");
    if (l->err == EAI_SYSTEM)
        snprintf(why, sizeof(why), "%s", l->sys_errno ? strerror(l->sys_errno)
                                                      : "system error");
    else
        snprintf(why, sizeof(why), "%s", gai_strerror(l->err));
    return lookup_failed(s, host, why);
}

/* The resolver's answer that the name has no address (not a failure of
 * the resolver or of this process). */
static int answer_gone(int err)
{
#ifdef EAI_NODATA
    if (err == EAI_NODATA)
        return 1;
#endif
    return err == EAI_NONAME || err == 0;
}

/* lease__net_resolve; *gone tells a failure that is the resolver's
 * answer that the name has no address from any other (no answer in time,
 * EAI_AGAIN, too many lookups, out of memory or threads). */
static int net_resolve(struct addrinfo **out, int *gone, const lease_store *s,
                       const char *host, int port, int64_t end)
{
    struct addrinfo hints, *res;
    char ports[16];
    net_lookup *l;
    int rc;

    *out = NULL;
    *gone = 0;
    if (host == NULL || *host == '\0' || port < 0 || port > 65535)
        return lease__seterr(LEASE_EINVALID, "a host and a port 0..65535 are required");
    snprintf(ports, sizeof(ports), "%d", port);
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    if (getaddrinfo(host, ports, &hints, &res) == 0) {
        rc = addrs_copy(out, res);
        freeaddrinfo(res);
        return rc;
    }
    if (lease_clock_ns() >= end)
        return lookup_failed(s, host, "no time left for the lookup");
    pthread_once(&net_once, net_init);
    pthread_mutex_lock(&net_mu);
    if ((rc = lookup_get(&l, s, host, ports)) < 0) {
        pthread_mutex_unlock(&net_mu);
        return rc;
    }
    /* Bounded: each wait ends by `end`, and a late one leaves the loop. */
    while (!l->done && lease__cond_wait_until(&net_cv, &net_mu, end) == 0)
        ;
    l->waiters--;
    *gone = l->done && answer_gone(l->err);
    if (!l->done) /* the thread keeps it, and its answer for the next call */
        rc = lease__seterr(LEASE_ESTORE, "cannot connect to %s %s: the name lookup of "
                           "%s gave no answer within the %llu ms timeout",
                           s->backend->name, s->url_redacted, host,
                           (unsigned long long)s->timeout_ms);
    else
        rc = lookup_answer(out, s, l, host);
    if (l->done && l->waiters == 0)
        lookup_free(l);
    pthread_mutex_unlock(&net_mu);
    return rc;
}

int lease__net_resolve(struct addrinfo **out, const lease_store *s, const char *host,
                       int port, int64_t end)
{
    int gone;

    return net_resolve(out, &gone, s, host, port, end);
}

/*
 * A name for libcurl's CURLOPT_RESOLVE (lease_int.h). Looked up again
 * after NET_NAME_FRESH_NS, as libcurl's own cache would. While a new
 * lookup is slow (NET_NAME_STALE_WAIT_NS) or fails for any reason but the
 * resolver's answer that the name has no address (silence, EAI_AGAIN, no
 * thread, too many lookups), the addresses it had serve (tried again
 * after NET_NAME_RETRY_NS): a connection to them worked until now, and a
 * slow resolver must not take a call's time once a minute. A name the
 * resolver says is gone is gone.
 */
#define NET_NAME_FRESH_NS (60 * (int64_t)1000000000)
#define NET_NAME_STALE_WAIT_NS (50 * (int64_t)1000000)
#define NET_NAME_RETRY_NS (1 * (int64_t)1000000000)

/* "host:port:addr[,addr...]" from an answer (IPv6 in brackets; a scoped
 * address, which curl's parser takes for no address, left out); NULL
 * when none is left or out of memory. */
static char *name_entry(const char *host, int port, const struct addrinfo *res)
{
    char num[INET6_ADDRSTRLEN + 8], *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int n = 0;

    if (f == NULL)
        return NULL;
    fprintf(f, "%s:%d:", host, port);
    /* Bounded by the addresses of one answer. */
    for (; res != NULL; res = res->ai_next)
        if (getnameinfo(res->ai_addr, res->ai_addrlen, num, sizeof(num), NULL, 0,
                        NI_NUMERICHOST) == 0 && strchr(num, '%') == NULL)
            fprintf(f, res->ai_family == AF_INET6 ? "%s[%s]" : "%s%s", n++ ? "," : "", num);
    if (fclose(f) != 0 || n == 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

int lease__net_name_entry(const char **entry, lease__net_name *n, const lease_store *s,
                          const char *authority, int64_t end)
{
    const char *colon = strrchr(authority, ':');
    struct addrinfo *res;
    struct in_addr v4;
    char host[256], *e;
    int64_t now = lease_clock_ns(), wait_end = end;
    long port;
    int rc, gone;

    *entry = NULL;
    if (authority[0] == '[') /* an IPv6 address: nothing to look up */
        return 0;
    if (colon == NULL || colon == authority || (size_t)(colon - authority) >= sizeof(host) ||
        (port = strtol(colon + 1, &e, 10)) <= 0 || port > 65535 || *e != '\0')
        return lease__seterr(LEASE_EINVALID, "'%.64s' is not host:port", authority);
    snprintf(host, sizeof(host), "%.*s", (int)(colon - authority), authority);
    if (inet_pton(AF_INET, host, &v4) == 1)
        return 0;
    if (n->entry && now < n->fresh_until) {
        *entry = n->entry;
        return 0;
    }
    if (n->entry && now + NET_NAME_STALE_WAIT_NS < end)
        wait_end = now + NET_NAME_STALE_WAIT_NS;
    if ((rc = net_resolve(&res, &gone, s, host, (int)port, wait_end)) == 0) {
        e = name_entry(host, (int)port, res);
        lease__net_free(res);
        if (e == NULL && n->entry == NULL)
            return lookup_failed(s, host, "no address curl takes, or out of memory");
        if (e) {
            free(n->entry);
            n->entry = e;
        }
        n->fresh_until = now + (e ? NET_NAME_FRESH_NS : NET_NAME_RETRY_NS);
    } else if (!gone && n->entry) {
        n->fresh_until = now + NET_NAME_RETRY_NS;
    } else {
        lease__net_name_clear(n);
        return rc;
    }
    *entry = n->entry;
    return 0;
}

void lease__net_name_clear(lease__net_name *n)
{
    free(n->entry);
    n->entry = NULL;
    n->fresh_until = 0;
}

/* Connect a socket to one address until `end`: 0, or an errno value. */
static int connect_addr(int *fd, const struct addrinfo *a, int64_t end)
{
    int sfd, err = 0;
    socklen_t len = sizeof(err);

    *fd = -1;
    sfd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                 a->ai_protocol);
    if (sfd < 0)
        return errno;
    if (connect(sfd, a->ai_addr, a->ai_addrlen) < 0) {
        if (errno != EINPROGRESS) {
            err = errno;
            close(sfd);
            return err;
        }
        /* Bounded: each poll ends by `end`, an interrupted one goes on with
         * the time left. */
        for (;;) {
            int64_t left = (end - lease_clock_ns() + 999999) / 1000000;
            struct pollfd p = { sfd, POLLOUT, 0 };
            int n;

            if (left <= 0) {
                close(sfd);
                return ETIMEDOUT;
            }
            n = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
            if (n > 0)
                break;
            if (n < 0 && errno != EINTR) {
                err = errno;
                close(sfd);
                return err;
            }
        }
        if (getsockopt(sfd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        if (err != 0) {
            close(sfd);
            return err;
        }
    }
    *fd = sfd;
    return 0;
}

int lease__net_connect(int *fd, const lease_store *s, const char *host, int port,
                       int64_t end)
{
    struct addrinfo *res, *a;
    int rc, err = 0, one = 1;
    int64_t left = 0;

    *fd = -1;
    if ((rc = lease__net_resolve(&res, s, host, port, end)) < 0)
        return rc;
    for (a = res; a != NULL; a = a->ai_next)
        left++;
    /* Bounded by the addresses of one answer. Each has its share of the
     * time left, so that one that drops packets (a broken IPv6 route)
     * leaves time for the next; one that fails at once leaves its share. */
    for (a = res; a != NULL && lease_clock_ns() < end; a = a->ai_next, left--) {
        int64_t now = lease_clock_ns();

        if ((err = connect_addr(fd, a, now + (end - now) / left)) == 0)
            break;
    }
    lease__net_free(res);
    if (*fd < 0) {
        if (err == 0 || err == ETIMEDOUT)
            return lease__seterr(LEASE_ESTORE, "cannot connect to %s %s: no "
                                 "connection within the %llu ms timeout",
                                 s->backend->name, s->url_redacted,
                                 (unsigned long long)s->timeout_ms);
        return lease__seterr(LEASE_ESTORE, "cannot connect to %s %s: %s",
                             s->backend->name, s->url_redacted, strerror(err));
    }
    /* Small requests and answers: do not hold one back for the next. */
    (void)setsockopt(*fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return 0;
}
