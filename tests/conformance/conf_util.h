/*
 * conf_util.h - what the four store-agnostic programs (the conformance
 * suite, the keeper, election and history tests) and the PostgreSQL store
 * tests (tests/pg/pg_test.h) share: finding the store URL, a random key
 * prefix per run, assertions that print the library's message
 * (conf_assert.h), bounded waits, and forked children.
 *
 * Only the public API (lease.h) is used, so that the four programs run
 * unchanged against every store.
 *
 * Forking: a store handle is a connection (an SQLite file with its locks,
 * a socket ...) and must never be shared by two processes. So the parent
 * closes its handle before every fork (conf_store_close) and opens a fresh
 * one afterwards (conf_store_open); each child opens its own, and never
 * touches what it inherited. Children never call cmocka's assertions: they
 * report plain facts over pipes, the parent asserts them, and children end
 * with _exit().
 */
#ifndef CONF_UTIL_H
#define CONF_UTIL_H

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lease.h"

/* The run's store URL, its handle in this (parent) process, and the key
 * prefix "<what>/<uuid>/" that keeps runs on a persistent store apart.
 * Defined once, in conf_util.c (the library lease_conf_util), so that the
 * files of a program made of several share them. */
extern const char *conf_url;
extern lease_store *conf_store;
extern char conf_prefix[64];

#include "conf_assert.h"

/* ---- time -------------------------------------------------------------- */

static inline int64_t conf_now_ms(void)
{
    return lease_clock_ns() / 1000000;
}

/* Only ever used to let a ttl pass, never to make a race come out right. */
static inline void conf_sleep_ms(int64_t ms)
{
    struct timespec ts;

    if (ms <= 0)
        return;
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)(ms % 1000) * 1000000;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* How long to wait for something that needs a lease of `ttl_ms` to end:
 * generous, because a store may round a short ttl up to whole seconds. */
static inline int64_t conf_expiry_bound_ms(uint64_t ttl_ms)
{
    return 10000 + 3 * (int64_t)ttl_ms;
}

/* ---- keys, owners, options -------------------------------------------- */

static inline void conf_key(char out[LEASE_KEY_MAX + 1], const char *name)
{
    int n = snprintf(out, LEASE_KEY_MAX + 1, "%s%s", conf_prefix, name);

    if (n < 0 || n > LEASE_KEY_MAX)
        fail_msg("test key '%s%s' is too long", conf_prefix, name);
}

static inline void conf_owner(char out[LEASE_OWNER_BUFSZ])
{
    CHECK_RC(0, lease_owner_new(out));
    assert_int_equal(lease_owner_valid(out), 1);
}

static inline lease_acquire_opts conf_opts(const char *owner, uint64_t ttl_ms,
                                           const char *label, uint64_t wait_ms)
{
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;

    o.owner = owner;
    o.ttl_ms = ttl_ms;
    o.label = label;
    o.wait_ms = wait_ms;
    return o;
}

/* Acquire a key that must be free for this owner; checks the grant. */
static inline lease_grant conf_acquire(const char *key, const char *owner,
                                       uint64_t ttl_ms, const char *label)
{
    lease_acquire_opts o = conf_opts(owner, ttl_ms, label, 0);
    lease_grant g;

    memset(&g, 0, sizeof(g));
    CHECK_RC(0, lease_acquire(&g, NULL, conf_store, key, &o));
    assert_string_equal(g.key, key);
    assert_string_equal(g.owner, owner);
    assert_string_equal(g.label, label ? label : "");
    ASSERT_U64_OP(g.token, >=, 1);
    ASSERT_U64_OP(g.ttl_ms, >=, ttl_ms);
    return g;
}

/* Poll inspect through `store` until it says the key is not held, within
 * a bound. Returns the last info. The bound only stops a broken store from
 * hanging the suite; a correct store always ends the loop by expiring the
 * lease. */
static inline lease_info conf_wait_free_on(lease_store *store, const char *key,
                                           uint64_t ttl_ms)
{
    int64_t end = conf_now_ms() + conf_expiry_bound_ms(ttl_ms);
    lease_info info;

    for (;;) {
        memset(&info, 0, sizeof(info));
        CHECK_RC(0, lease_inspect(&info, store, key));
        if (!info.held)
            return info;
        if (conf_now_ms() > end)
            fail_msg("'%s' (ttl %" PRIu64 " ms) is still held after %" PRId64
                     " ms: the lease never expired",
                     key, ttl_ms, conf_expiry_bound_ms(ttl_ms));
        conf_sleep_ms(20);
    }
}

/* conf_wait_free_on the suite's handle. */
static inline lease_info conf_wait_free(const char *key, uint64_t ttl_ms)
{
    return conf_wait_free_on(conf_store, key, ttl_ms);
}

/* ---- the store handle -------------------------------------------------- */

static inline void conf_store_close(void)
{
    lease_store_close(conf_store);
    conf_store = NULL;
}

static inline void conf_store_open(void)
{
    if (conf_store != NULL)
        return;
    CHECK_RC(0, lease_store_open(&conf_store, conf_url));
}

/* ---- children ---------------------------------------------------------- */

#define CONF_MAX_CHILDREN 64
extern pid_t conf_children[CONF_MAX_CHILDREN]; /* conf_util.c */

static inline pid_t conf_fork(void)
{
    pid_t pid;
    size_t i;

    if (conf_store != NULL)
        fail_msg("fork with the parent's store handle open");
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        fail_msg("fork: %s", strerror(errno));
    if (pid > 0) {
        for (i = 0; i < CONF_MAX_CHILDREN; i++)
            if (conf_children[i] == 0) {
                conf_children[i] = pid;
                break;
            }
        if (i == CONF_MAX_CHILDREN) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            fail_msg("too many children");
        }
    } else {
        /* The child's own list starts empty. */
        memset(conf_children, 0, sizeof(conf_children));
    }
    return pid;
}

/* Wait for a child (bounded); returns its wait status. */
static inline int conf_reap(pid_t pid, int64_t bound_ms)
{
    int64_t end = conf_now_ms() + bound_ms;
    int status = 0;
    size_t i;

    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR)
            fail_msg("waitpid(%d): %s", (int)pid, strerror(errno));
        if (conf_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            for (i = 0; i < CONF_MAX_CHILDREN; i++)
                if (conf_children[i] == pid)
                    conf_children[i] = 0;
            fail_msg("child %d did not end within %" PRId64 " ms", (int)pid,
                     bound_ms);
        }
        conf_sleep_ms(5);
    }
    for (i = 0; i < CONF_MAX_CHILDREN; i++)
        if (conf_children[i] == pid)
            conf_children[i] = 0;
    return status;
}

/* After a failed test: no child outlives it. */
static inline void conf_kill_children(void)
{
    size_t i;

    for (i = 0; i < CONF_MAX_CHILDREN; i++)
        if (conf_children[i] > 0) {
            kill(conf_children[i], SIGKILL);
            waitpid(conf_children[i], NULL, 0);
            conf_children[i] = 0;
        }
}

/* Read exactly n bytes before a deadline. Returns n, or the bytes read so
 * far on EOF or timeout (the caller asserts). */
static inline size_t conf_read_full(int fd, void *buf, size_t n,
                                    int64_t deadline_ms)
{
    size_t got = 0;

    while (got < n) {
        struct pollfd p = { fd, POLLIN, 0 };
        int64_t left = deadline_ms - conf_now_ms();
        ssize_t r;

        if (left <= 0)
            break;
        r = poll(&p, 1, left > 1000 ? 1000 : (int)left);
        if (r < 0 && errno != EINTR)
            break;
        if (r <= 0)
            continue;
        r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return got;
}

/* Writes of at most PIPE_BUF bytes to a pipe are atomic: a child killed
 * mid-loop leaves whole records or none. */
static inline int conf_write_full(int fd, const void *buf, size_t n)
{
    size_t done = 0;

    while (done < n) {
        ssize_t w = write(fd, (const char *)buf + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        done += (size_t)w;
    }
    return 0;
}

static inline void conf_pipe(int fds[2])
{
    if (pipe(fds) != 0)
        fail_msg("pipe: %s", strerror(errno));
}

/* ---- per-test setup and teardown ---------------------------------------- */

static inline int conf_setup(void **state)
{
    (void)state;
    if (conf_store == NULL && lease_store_open(&conf_store, conf_url) != 0) {
        /* not the URL itself: it may hold a password */
        print_error("cannot reopen the store: %s\n", lease_errmsg());
        return -1;
    }
    return 0;
}

static inline int conf_teardown(void **state)
{
    (void)state;
    conf_kill_children();
    return 0;
}

#define CONF_TEST(f) cmocka_unit_test_setup_teardown(f, conf_setup, conf_teardown)

/*
 * The URL comes from argv[1] or LEASE_TEST_STORE. Without one the run
 * fails: a conformance suite that skips silently proves nothing.
 */
static inline int conf_init(int argc, char **argv, const char *what)
{
    char uuid[LEASE_OWNER_BUFSZ];

    conf_url = argc > 1 ? argv[1] : getenv("LEASE_TEST_STORE");
    if (conf_url == NULL || conf_url[0] == '\0') {
        fprintf(stderr,
                "%s: no store URL: give it as the first argument or in "
                "LEASE_TEST_STORE (e.g. sqlite:///tmp/conformance.db)\n",
                argv[0]);
        return -1;
    }
    /* A child that died must not kill the runner when we write to it. */
    signal(SIGPIPE, SIG_IGN);
    if (lease_owner_new(uuid) != 0) {
        fprintf(stderr, "%s: lease_owner_new: %s\n", argv[0], lease_errmsg());
        return -1;
    }
    snprintf(conf_prefix, sizeof(conf_prefix), "%s/%s/", what, uuid);
    if (lease_store_open(&conf_store, conf_url) != 0) {
        /* The URL may hold a password: print the library's message only. */
        fprintf(stderr, "%s: cannot open the store: %s (%s)\n", argv[0],
                lease_errmsg(), lease_error_name(lease_errcode()));
        return -1;
    }
    printf("# store %s (scheme %s), key prefix %s\n",
           lease_store_url_redacted(conf_store), lease_store_scheme(conf_store),
           conf_prefix);
    return 0;
}

/* ---- a pausable TCP forwarder (conf_util.c) ------------------------------ */

/*
 * Store outages for the server stores: a client pointed at the forwarder
 * (127.0.0.1, an ephemeral port) reaches the real server through it until
 * conf_forwarder_pause(), which closes every forwarded connection and from
 * then on accepts new ones only to close them at once: every call fails
 * fast, as against a server that went away. conf_forwarder_resume()
 * forwards again. One thread, poll(); enough for a test's few connections.
 */
typedef struct conf_forwarder conf_forwarder;

/* Forward to host:port (resolved now). NULL with a message on stderr. */
conf_forwarder *conf_forwarder_start(const char *host, const char *port);
int conf_forwarder_port(const conf_forwarder *f);
/* Both return once the forwarder thread has done it. */
void conf_forwarder_pause(conf_forwarder *f);
void conf_forwarder_resume(conf_forwarder *f);
/* Closes everything and joins the thread. NULL is allowed. */
void conf_forwarder_stop(conf_forwarder *f);

/*
 * A server store URL's single host:port (scheme://[user[:pw]@]host[:port]
 * /...): host and port out (the scheme's default port when it has none).
 * -1 for a URL without a host or with several (etcd://a:1,b:2).
 */
int conf_url_hostport(char *host, size_t hostsz, char *port, size_t portsz,
                      const char *url);
/* The same URL with its host:port replaced by 127.0.0.1:port. -1 when it
 * does not fit or has no single host. */
int conf_url_via(char *out, size_t outsz, const char *url, int port);

#endif
