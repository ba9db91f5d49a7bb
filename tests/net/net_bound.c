/*
 * net_bound.c - a store's connect is bounded by the handle's timeout with
 * the name lookup included, and its sockets are close-on-exec from
 * socket() on (no window in which another thread's fork+exec inherits
 * them).
 *
 *   net_bound URL      URL: a test server's, on 127.0.0.1
 *
 * This program defines getaddrinfo() and socket() itself, ahead of libc's
 * (its own are exported for the shared libraries, ENABLE_EXPORTS), so it
 * sees what the library and the client libraries under it ask for:
 *  - the name "slow.invalid" is a lookup that does not answer until the
 *    test lets it go (then 127.0.0.1): a store call on it must return,
 *    with ESTORE, while the lookup is still waiting, and the late answer
 *    serve the next call;
 *  - the name "lease-test.invalid" answers 127.0.0.1: the URL with it in
 *    place of 127.0.0.1 must work as the URL does, looked up by the store,
 *    with no lookup on the caller's thread (where nothing bounds it);
 *    Kubernetes, whose plain-HTTP URLs take only a local name, is given
 *    "localhost" (looked up by libc as always) instead;
 *  - the name "hang.invalid" does not answer until the end of the test;
 *  - the name "two.invalid" answers ::1 (where no test server listens)
 *    and 127.0.0.1 (PostgreSQL's ports, below);
 *  - every TCP socket made while a store runs is counted, and one made
 *    without SOCK_CLOEXEC is a failure, except under libpq, which makes
 *    its socket without it and sets FD_CLOEXEC in its next call (nothing
 *    outside libpq can reach that window).
 * Nothing goes out but to loopback: the names are never looked up.
 * Without a URL it fails; it never skips.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lease.h"
#include "../check.h"


static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int slow_waiting;  /* lookups of slow.invalid, hang.invalid not answered yet */
static int slow_calls;
static int slow_released;
static int hang_released; /* hang.invalid: as slow.invalid, let go at the end */
static int sockets_seen, sockets_bad;
static pthread_t main_thread;
static int named_on_caller; /* lookups of a test name with no bound */
static int named_seen;      /* lookups of the names that answer at once */

typedef int (*gai_fn)(const char *, const char *, const struct addrinfo *,
                      struct addrinfo **);

/* A lookup of a name that answers at once, counted, and where it ran. */
static void named_lookup(void)
{
    pthread_mutex_lock(&mu);
    named_seen++;
    if (pthread_equal(pthread_self(), main_thread))
        named_on_caller++;
    pthread_mutex_unlock(&mu);
}
typedef int (*socket_fn)(int, int, int);

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    gai_fn real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");

    if (node && (strcmp(node, "slow.invalid") == 0 || strcmp(node, "hang.invalid") == 0 ||
                 strcmp(node, "lease-test.invalid") == 0) &&
        hints && (hints->ai_flags & AI_NUMERICHOST))
        return EAI_NONAME; /* not an address: answered at once, as libc does */
    if (node && (strcmp(node, "slow.invalid") == 0 || strcmp(node, "hang.invalid") == 0)) {
        int *go = strcmp(node, "slow.invalid") == 0 ? &slow_released : &hang_released;
        struct timespec until;
        int released;

        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 20; /* bounded, should the test never let it go */
        pthread_mutex_lock(&mu);
        if (go == &slow_released)
            slow_calls++;
        slow_waiting++;
        while (!*go && pthread_cond_timedwait(&cv, &mu, &until) == 0)
            ;
        slow_waiting--;
        released = *go;
        pthread_cond_broadcast(&cv);
        pthread_mutex_unlock(&mu);
        if (!released)
            return EAI_NONAME;
        node = "127.0.0.1"; /* let go: the answer comes, late */
    }
    if (node && strcmp(node, "two.invalid") == 0) {
        struct addrinfo *v6 = NULL, *v4 = NULL, h = *hints;
        int rc;

        if (h.ai_flags & AI_NUMERICHOST)
            return EAI_NONAME;
        named_lookup();
        /* ::1 first, where no test server listens: refused, the next. */
        h.ai_flags = AI_NUMERICHOST;
        h.ai_family = AF_INET6;
        if ((rc = real("::1", service, &h, &v6)) != 0)
            return rc;
        h.ai_family = AF_INET;
        if ((rc = real("127.0.0.1", service, &h, &v4)) != 0) {
            freeaddrinfo(v6);
            return rc;
        }
        v6->ai_next = v4;
        *res = v6;
        return 0;
    }
    if (node && (strcmp(node, "lease-test.invalid") == 0 || strcmp(node, "localhost") == 0) &&
        !(hints && (hints->ai_flags & AI_NUMERICHOST))) {
        named_lookup();
        if (strcmp(node, "lease-test.invalid") == 0)
            node = "127.0.0.1";
    }
    return real(node, service, hints, res);
}

int socket(int domain, int type, int protocol)
{
    socket_fn real = (socket_fn)dlsym(RTLD_NEXT, "socket");

    if ((domain == AF_INET || domain == AF_INET6) &&
        (type & 0xff) == SOCK_STREAM) {
        pthread_mutex_lock(&mu);
        sockets_seen++;
        if (!(type & SOCK_CLOEXEC))
            sockets_bad++;
        pthread_mutex_unlock(&mu);
    }
    return real(domain, type, protocol);
}

/* url with its first "127.0.0.1" replaced by host. */
static void with_host(char *out, size_t size, const char *url, const char *host)
{
    const char *at = strstr(url, "127.0.0.1");

    if (at == NULL) {
        snprintf(out, size, "%s", url);
        return;
    }
    snprintf(out, size, "%.*s%s%s", (int)(at - url), url, host, at + 9);
}

/* One call on url with a timeout of ms: 0 when the store answered (the
 * key was never acquired: ENOTFOUND), else its error. A store may connect
 * as it opens: then the open is the call. */
static int call_within(const char *url, uint64_t ms)
{
    lease_store *s = NULL;
    lease_info h;
    int rc = lease_store_open_timeout(&s, url, ms);

    if (rc == 0)
        rc = lease_inspect(&h, s, "net-bound");
    if (s)
        lease_store_close(s);
    return rc == LEASE_ENOTFOUND ? 0 : rc;
}

static int one_call(const char *url)
{
    return call_within(url, 300);
}

static void nap_ms(long ms)
{
    struct timespec t = { ms / 1000, (ms % 1000) * 1000000 };

    /* Bounded: an interrupted nap is not resumed. */
    nanosleep(&t, NULL);
}

/*
 * A child forked while a lookup of u is in flight (its thread left in the
 * parent) looks the name up itself: the child's call succeeds (its lookup
 * is answered: the lookups of the child are let go) where one that waited
 * for the parent's lookup would time out.
 */
static void forked_call(const char *u)
{
    int status = 0;
    pid_t pid = fork();

    if (pid == 0) {
        /* The child is this thread alone: the stub's lock is free unless
         * a parent thread held it at the fork. A child that hangs is
         * ended by the alarm, and fails. */
        alarm(30);
        pthread_mutex_init(&mu, NULL);
        main_thread = pthread_self();
        slow_released = 1;
        _exit(one_call(u) == 0 ? 0 : 1);
    }
    CHECK(pid > 0, "fork: %s", strerror(errno));
    if (pid <= 0)
        return;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid: %s", strerror(errno));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a child forked while the "
          "lookup was in flight could not look the name up itself (status %d)", status);
}

/*
 * A call on a name whose lookup does not answer ends within the timeout.
 * The store looks names up itself (etcd's too, whose libcurl is given the
 * addresses): a second call on that name waits for the same
 * lookup instead of starting one more (a resolver that hangs costs a
 * thread per name, not per call), and the answer, when it comes after
 * both have left, serves the next call, with no new lookup.
 */
static void slow_lookup(const char *url)
{
    char u[1024];
    struct timespec until;
    int rc, waiting, calls;

    with_host(u, sizeof(u), url, "slow.invalid");
    rc = one_call(u);
    pthread_mutex_lock(&mu);
    waiting = slow_waiting;
    pthread_mutex_unlock(&mu);
    CHECK(rc == LEASE_ESTORE, "a call whose lookup does not answer: ESTORE, got %d: %s",
          rc, lease_errmsg());
    CHECK(strstr(lease_errmsg(), "name lookup of slow.invalid") != NULL,
          "the message says which lookup gave no answer: %s", lease_errmsg());
    CHECK(slow_calls >= 1, "slow.invalid was looked up (%d)", slow_calls);
    CHECK(waiting >= 1, "the call returned while its lookup still waited (%d "
          "waiting): it did not wait for the lookup", waiting);
    forked_call(u);

    rc = one_call(u);
    CHECK(rc == LEASE_ESTORE, "a second call on the name: ESTORE, got %d: %s", rc,
          lease_errmsg());
    CHECK(slow_calls == 1, "the second call joined the lookup in flight: %d "
          "lookups", slow_calls);

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    pthread_mutex_lock(&mu);
    slow_released = 1;
    pthread_cond_broadcast(&cv);
    /* Bounded by `until`. */
    while (slow_waiting > 0 && pthread_cond_timedwait(&cv, &mu, &until) == 0)
        ;
    calls = slow_calls;
    pthread_mutex_unlock(&mu);
    /* The lookup's thread may not have handed its answer over yet: then
     * this call joins it for the moment that takes, and passes the same.
     * The pause only makes the answer kept (what is checked) near certain
     * to be the one found, not the lookup still in flight. */
    nap_ms(200);
    rc = one_call(u);
    CHECK(rc == 0, "the call after a late answer used it: got %d: %s", rc, lease_errmsg());
    CHECK(slow_calls == calls, "the call after a late answer looked the name up "
          "again (%d lookups, %d before)", slow_calls, calls);
    /* Once: the call after that looks the name up anew. */
    rc = one_call(u);
    CHECK(rc == 0, "the call after that: got %d: %s", rc, lease_errmsg());
    CHECK(slow_calls == calls + 1, "a late answer served twice (%d lookups, %d "
          "before)", slow_calls, calls);
}

/* A name that resolves to the server works as its address does, looked
 * up by the store (not the client library under it, which would do it
 * with no bound or with a thread per call), and every socket made
 * meanwhile is close-on-exec from socket() on. */
static void named_host(const char *url, const char *name, int libpq)
{
    char u[1024], owner[LEASE_OWNER_BUFSZ], key[64];
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    lease_keeper *k = NULL;
    lease_store *s = NULL;
    lease_grant g, g2;
    lease_info h;
    int rc, seen, bad;

    with_host(u, sizeof(u), url, name);
    lease_owner_new(owner);
    snprintf(key, sizeof(key), "net-bound-%.8s", owner);
    pthread_mutex_lock(&mu);
    sockets_seen = sockets_bad = named_seen = 0;
    pthread_mutex_unlock(&mu);
    rc = lease_store_open(&s, u);
    CHECK(rc == 0, "open %s: %s", u, lease_errmsg());
    if (rc < 0)
        return;
    o.owner = owner;
    o.ttl_ms = 5000;
    rc = lease_acquire(&g, &h, s, key, &o);
    CHECK(rc == 0, "acquire through a host name: %s", lease_errmsg());
    if (rc == 0) {
        /* A keeper (a second handle) and a wait (a store's second socket,
         * where it has one) make the other connections. */
        rc = lease_keeper_start(&k, s, &g, NULL);
        CHECK(rc == 0, "keeper: %s", lease_errmsg());
        lease_owner_new(owner);
        o.wait_ms = 200;
        rc = lease_acquire(&g2, &h, s, key, &o);
        CHECK(rc == LEASE_ETIMEOUT, "a wait for the held key: ETIMEOUT, got %d: %s",
              rc, lease_errmsg());
        if (k)
            CHECK(lease_keeper_stop(NULL, k, 1) == 0, "keeper stop: %s", lease_errmsg());
    }
    lease_store_close(s);
    pthread_mutex_lock(&mu);
    seen = sockets_seen;
    bad = sockets_bad;
    pthread_mutex_unlock(&mu);
    CHECK(seen >= 2, "the store made its sockets here (%d seen)", seen);
    CHECK(named_seen >= 1, "%s was not looked up by the store (%d lookups)", name,
          named_seen);
    CHECK(named_on_caller == 0, "the name was looked up %d times on the caller's "
          "thread, with no bound", named_on_caller);
    if (!libpq)
        CHECK(bad == 0, "%d of %d TCP sockets were made without SOCK_CLOEXEC", bad, seen);
}

/*
 * PostgreSQL: a host and port that libpq would take from its environment
 * (PGHOST, PGPORT) are what the store looks up and connects to, within the
 * bound: two hosts, each of them a name, and no port in the URL; and a
 * name in the URL with two addresses (the first refused), no port in the
 * URL: PGPORT's port for both, as libpq would use (a list of hosts with no
 * ports in a URL is libpq's 5432 for each, PGPORT or not).
 */
static void pg_defaults(const char *url)
{
    const char *at = strstr(url, "127.0.0.1:");
    char u[1024], port[16];
    size_t n;
    int rc;

    n = strspn(at + 10, "0123456789");
    snprintf(port, sizeof(port), "%.*s", (int)(n < 15 ? n : 15), at + 10);
    /* postgres://user:password@/db: no host, no port */
    snprintf(u, sizeof(u), "%.*s%s", (int)(at - url), url, at + 10 + n);
    setenv("PGHOST", "lease-test.invalid,lease-test.invalid", 1);
    setenv("PGPORT", port, 1);
    pthread_mutex_lock(&mu);
    named_on_caller = 0;
    pthread_mutex_unlock(&mu);
    rc = one_call(u);
    CHECK(rc == 0, "with PGHOST and PGPORT: got %d: %s", rc, lease_errmsg());
    CHECK(named_on_caller == 0, "PGHOST's name was looked up %d times on the caller's "
          "thread, with no bound", named_on_caller);
    /* A first name whose lookup hangs leaves the second its share, and a
     * last one leaves the connect to the first its share. */
    setenv("PGHOST", "hang.invalid,lease-test.invalid", 1);
    rc = call_within(u, 2000);
    CHECK(rc == 0, "PGHOST's second name after one that hangs: got %d: %s", rc,
          lease_errmsg());
    setenv("PGHOST", "lease-test.invalid,hang.invalid", 1);
    rc = call_within(u, 2000);
    CHECK(rc == 0, "PGHOST's first name before one that hangs: got %d: %s", rc,
          lease_errmsg());
    unsetenv("PGHOST");
    pthread_mutex_lock(&mu);
    named_on_caller = 0;
    pthread_mutex_unlock(&mu);
    snprintf(u, sizeof(u), "%.*stwo.invalid%s", (int)(at - url), url, at + 10 + n);
    rc = one_call(u);
    CHECK(rc == 0, "a name of two addresses, no port, PGPORT: got %d: %s", rc,
          lease_errmsg());
    CHECK(named_on_caller == 0, "two.invalid was looked up %d times on the caller's "
          "thread, with no bound", named_on_caller);
    unsetenv("PGPORT");
}

int main(int argc, char **argv)
{
    struct timespec until;

    if (argc < 2 || argv[1][0] == '\0' || strstr(argv[1], "127.0.0.1") == NULL) {
        fprintf(stderr, "usage: net_bound URL (a test server's, on 127.0.0.1: "
                        "scripts/test.sh starts them)\n");
        return 1;
    }
    main_thread = pthread_self();
    lease_log_set(NULL, NULL, LEASE_LOG_OFF);
    /* Kubernetes over plain HTTP takes only a local name: localhost,
     * which libcurl would answer itself (no lookup); the store does. */
    if (strncmp(argv[1], "kubernetes", 10) == 0) {
        named_host(argv[1], "localhost", 0);
    } else {
        slow_lookup(argv[1]);
        named_host(argv[1], "lease-test.invalid", strncmp(argv[1], "postgres", 8) == 0);
    }
    if (strncmp(argv[1], "postgres", 8) == 0)
        pg_defaults(argv[1]);

    /* Let the lookups go, and see them end before exit (bounded). */
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    pthread_mutex_lock(&mu);
    slow_released = hang_released = 1;
    pthread_cond_broadcast(&cv);
    while (slow_waiting > 0 && pthread_cond_timedwait(&cv, &mu, &until) == 0)
        ;
    CHECK(slow_waiting == 0, "%d lookups still waiting at the end", slow_waiting);
    pthread_mutex_unlock(&mu);
    if (failures) {
        fprintf(stderr, "net_bound: %d checks FAILED\n", failures);
        return 1;
    }
    printf("net_bound: ok\n");
    return 0;
}
