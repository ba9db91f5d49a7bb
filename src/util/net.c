/*
 * net.c - name lookups and TCP connections for the stores whose client
 * library would do both without a bound (hiredis resolves and connects in
 * one blocking call; libpq resolves before its connect_timeout starts).
 *
 * A store call is bounded by its timeout as a whole, and getaddrinfo() has
 * no timeout of its own: a lookup runs on a thread of its own, which the
 * caller stops waiting for at its deadline. The thread finishes the lookup
 * and frees what it made; nothing else waits for it. A numeric address is
 * taken as it is, with no thread.
 *
 * Every socket is made close-on-exec and non-blocking in socket() itself,
 * so that no fork+exec of another thread can inherit it at any moment.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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

/* A lookup shared by the caller and the thread that runs it: whichever of
 * the two lets go of it last frees it. */
typedef struct net_lookup {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;           /* 2 while both hold it */
    int done;
    int err;            /* getaddrinfo's answer */
    struct addrinfo *res;
    char *host, *port;
} net_lookup;

static void lookup_unref(net_lookup *l)
{
    int last;

    pthread_mutex_lock(&l->mu);
    last = --l->refs == 0;
    pthread_mutex_unlock(&l->mu);
    if (!last)
        return;
    if (l->res)
        freeaddrinfo(l->res);
    free(l->host);
    free(l->port);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

static void *lookup_thread(void *arg)
{
    net_lookup *l = arg;
    struct addrinfo hints, *res = NULL;
    int err;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG;
    err = getaddrinfo(l->host, l->port, &hints, &res);
    pthread_mutex_lock(&l->mu);
    l->err = err;
    l->res = err == 0 ? res : NULL;
    l->done = 1;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    lookup_unref(l);
    return NULL;
}

static int lookup_failed(const lease_store *s, const char *host, const char *why)
{
    return lease__seterr(LEASE_ESTORE, "cannot connect to %s %s: cannot resolve %s: %s",
                         s->backend->name, s->url_redacted, host, why);
}

/* Start the lookup's thread with every signal blocked, so that a signal
 * meant for the program is never run on it. */
static int lookup_start(net_lookup *l)
{
    sigset_t all, old;
    pthread_attr_t a;
    pthread_t t;
    int rc;

    if (pthread_attr_init(&a) != 0)
        return -1;
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&t, &a, lookup_thread, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&a);
    return rc == 0 ? 0 : -1;
}

/* Wait for l until `end` (lease_clock_ns); 1 if it is done. */
static int lookup_wait(net_lookup *l, int64_t end)
{
    int done;

    pthread_mutex_lock(&l->mu);
    /* Bounded: each wait ends by `end`, and a late one leaves the loop. */
    while (!l->done && lease__cond_wait_until(&l->cv, &l->mu, end) == 0)
        ;
    done = l->done;
    pthread_mutex_unlock(&l->mu);
    return done;
}

static net_lookup *lookup_new(const char *host, const char *port)
{
    net_lookup *l = calloc(1, sizeof(*l));
    pthread_condattr_t ca;

    if (l == NULL)
        return NULL;
    l->host = strdup(host);
    l->port = strdup(port);
    if (l->host == NULL || l->port == NULL || pthread_mutex_init(&l->mu, NULL) != 0) {
        free(l->host);
        free(l->port);
        free(l);
        return NULL;
    }
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_cond_init(&l->cv, &ca) != 0) {
        pthread_condattr_destroy(&ca);
        pthread_mutex_destroy(&l->mu);
        free(l->host);
        free(l->port);
        free(l);
        return NULL;
    }
    pthread_condattr_destroy(&ca);
    l->refs = 2;
    return l;
}

int lease__net_resolve(struct addrinfo **out, const lease_store *s, const char *host,
                       int port, int64_t end)
{
    struct addrinfo hints;
    char ports[16];
    net_lookup *l;
    int err;

    *out = NULL;
    if (host == NULL || *host == '\0' || port < 0 || port > 65535)
        return lease__seterr(LEASE_EINVALID, "a host and a port 0..65535 are required");
    snprintf(ports, sizeof(ports), "%d", port);
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    if (getaddrinfo(host, ports, &hints, out) == 0)
        return 0;
    *out = NULL;
    if (lease_clock_ns() >= end)
        return lookup_failed(s, host, "no time left for the lookup");
    if ((l = lookup_new(host, ports)) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    if (lookup_start(l) < 0) {
        l->refs = 1;
        lookup_unref(l);
        return lease__seterr(LEASE_ESTORE, "cannot connect to %s %s: cannot start a "
                             "thread for the name lookup", s->backend->name,
                             s->url_redacted);
    }
    if (!lookup_wait(l, end)) {
        lookup_unref(l); /* the thread frees it when its lookup ends */
        return lease__seterr(LEASE_ESTORE, "cannot connect to %s %s: the name lookup "
                             "of %s gave no answer within the %llu ms timeout",
                             s->backend->name, s->url_redacted, host,
                             (unsigned long long)s->timeout_ms);
    }
    err = l->err;
    *out = l->res;
    l->res = NULL;
    lookup_unref(l);
    if (err != 0)
        return lookup_failed(s, host, err == EAI_SYSTEM ? strerror(errno)
                                                        : gai_strerror(err));
    if (*out == NULL)
        return lookup_failed(s, host, "no address");
    return 0;
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

    *fd = -1;
    if ((rc = lease__net_resolve(&res, s, host, port, end)) < 0)
        return rc;
    /* Bounded by the addresses of one answer, each tried until `end`. */
    for (a = res; a != NULL && lease_clock_ns() < end; a = a->ai_next) {
        if ((err = connect_addr(fd, a, end)) == 0)
            break;
    }
    freeaddrinfo(res);
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
