/*
 * kube_checks.c - the parts of tests/kubernetes/kube_checks.sh that need
 * the library in-process (public API only):
 *
 *   kube_checks cloexec URL KEY   every descriptor the store opened (libcurl's
 *                                 sockets, its multi handle's socketpair) is
 *                                 close-on-exec, after an acquire, a list and
 *                                 a wait woken by a release
 *   kube_checks wake URL KEY      a waiter blocked in lease_acquire (--wait)
 *                                 gets the key once its holder releases it
 *                                 (the script checks, with the double's
 *                                 /fake/v1/stats, that it waited on a watch)
 *
 * Exit 0 when every check passed, 1 otherwise (with the reason on stderr).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lease.h>

#include "fd_check.h"

static const char *url;

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    nanosleep(&ts, NULL);
}

static lease_store *open_store(void)
{
    lease_store *s = NULL;
    int rc = lease_store_open(&s, url);

    if (rc != 0) {
        fprintf(stderr, "open: %s: %s\n", lease_error_name(rc), lease_errmsg());
        exit(1);
    }
    return s;
}

static int acquire(lease_grant *g, lease_store *s, const char *key, uint64_t ttl_ms,
                   uint64_t wait_ms)
{
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    char owner[LEASE_OWNER_BUFSZ];
    int rc;

    lease_owner_new(owner);
    o.owner = owner;
    o.ttl_ms = ttl_ms;
    o.wait_ms = wait_ms;
    o.label = "kube_checks";
    rc = lease_acquire(g, NULL, s, key, &o);
    if (rc != 0)
        fprintf(stderr, "acquire '%s': %s: %s\n", key, lease_error_name(rc), lease_errmsg());
    return rc;
}

typedef struct {
    lease_store *s;
    lease_grant g;
    int rc;
} releaser;

/* Release the holder's grant after the waiter has started waiting. */
static void *release_later(void *arg)
{
    releaser *r = arg;

    sleep_ms(700);
    r->rc = lease_release(r->s, &r->g);
    return NULL;
}

/* The holder releases on another thread while the waiter waits. */
static int wake(const char *key)
{
    lease_store *holder = open_store(), *waiter = open_store();
    releaser r;
    lease_grant got;
    pthread_t t;
    int rc;

    memset(&r, 0, sizeof(r));
    r.s = holder;
    if (acquire(&r.g, holder, key, 60000, 0) != 0)
        return 1;
    pthread_create(&t, NULL, release_later, &r);
    rc = acquire(&got, waiter, key, 60000, 30000);
    pthread_join(t, NULL);
    if (r.rc != 0)
        fprintf(stderr, "release: %s: %s\n", lease_error_name(r.rc), lease_errmsg());
    if (rc == 0 && got.token <= r.g.token) {
        fprintf(stderr, "the waiter got token %llu, not above the holder's %llu\n",
                (unsigned long long)got.token, (unsigned long long)r.g.token);
        rc = 1;
    }
    if (rc == 0)
        rc = lease_release(waiter, &got);
    lease_store_close(holder);
    lease_store_close(waiter);
    return rc != 0 || r.rc != 0;
}

static void bad_fd(int fd, const char *target, void *arg)
{
    int *bad = arg;

    fprintf(stderr, "descriptor %d (%s) is not close-on-exec\n", fd, target);
    (*bad)++;
}

static int cloexec(const char *key)
{
    lease_store *s;
    lease_grant g;
    char wkey[512];
    lease_info *list = NULL;
    size_t n = 0;
    int bad = 0, seen, rc;

    fd_check_note();
    s = open_store();
    if (acquire(&g, s, key, 30000, 0) != 0)
        return 1;
    rc = lease_list(&list, &n, s, key);
    lease_list_free(list);
    if (rc != 0)
        fprintf(stderr, "list: %s: %s\n", lease_error_name(rc), lease_errmsg());
    snprintf(wkey, sizeof(wkey), "%s-wake", key);
    /* A wait on a watch opens a connection of its own kind. */
    if (wake(wkey) != 0)
        rc = 1;
    seen = fd_check_cloexec(bad_fd, &bad);
    if (seen == 0) {
        fprintf(stderr, "no descriptor of the store was found: the check saw nothing\n");
        bad++;
    }
    lease_release(s, &g);
    lease_store_close(s);
    return rc != 0 || bad != 0;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s cloexec|wake URL KEY\n", argv[0]);
        return 2;
    }
    url = argv[2];
    if (strcmp(argv[1], "cloexec") == 0)
        return cloexec(argv[3]);
    if (strcmp(argv[1], "wake") == 0)
        return wake(argv[3]);
    fprintf(stderr, "unknown check '%s'\n", argv[1]);
    return 2;
}
