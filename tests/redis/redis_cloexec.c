/*
 * redis_cloexec.c - every descriptor the Redis store opens is close-on-exec
 * (issue 10, item 4): hiredis opens its sockets without it, and a `lease
 * run` child once wrote commands on the keeper's authenticated connection.
 *
 * Against the shared server of $LEASE_TEST_REDIS_URL (or argv[1]); without
 * one it fails, it never skips. It opens the store, makes it use every kind
 * of connection it has - the command connection, the pub/sub connection of
 * a wait, a reconnection after the server closed the first one, and a
 * keeper's own handle - and then checks every descriptor of the process in
 * /proc/self/fd above 2 for FD_CLOEXEC, while all of them are still open.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "lease.h"
#include "../fd_check.h"
#include "../check.h"


static void bad_fd(int fd, const char *target, void *when)
{
    CHECK(0, "%s: fd %d (%s) is not close-on-exec", (const char *)when, fd, target);
}

/* Every fd above 2 is close-on-exec; returns how many were looked at. */
static int check_fds(const char *when)
{
    return fd_check_cloexec(bad_fd, (void *)when);
}

/* The port of redis://127.0.0.1:PORT[/...]: the shared test server's. */
static int port_of(const char *url)
{
    const char *p = strrchr(url, ':');

    return p ? atoi(p + 1) : 0;
}

/* Count the sockets open now (to know that the store's are among them). */
static int count_sockets(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    if (d == NULL)
        return 0;
    while ((e = readdir(d)) != NULL) {
        char path[64], target[256];
        ssize_t len;

        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", atoi(e->d_name));
        len = readlink(path, target, sizeof(target) - 1);
        if (len > 0 && strncmp(target, "socket:", 7) == 0 && len < 256)
            n++;
    }
    closedir(d);
    return n;
}

/*
 * Make the server close every connection of this process (found by their
 * local ports), through a plain connection that is closed again before any
 * check. Returns how many were closed.
 */
static int kill_my_connections(const char *host, int port)
{
    redisContext *raw = redisConnect(host, port);
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int killed = 0;

    CHECK(raw != NULL && raw->err == 0, "raw connection to %s:%d", host, port);
    if (raw == NULL || raw->err || d == NULL) {
        if (raw)
            redisFree(raw);
        if (d)
            closedir(d);
        return 0;
    }
    while ((e = readdir(d)) != NULL) {
        struct sockaddr_in a;
        socklen_t alen = sizeof(a);
        char addr[64];
        int fd = atoi(e->d_name);
        redisReply *r;

        if (e->d_name[0] == '.' || fd == raw->fd ||
            getsockname(fd, (struct sockaddr *)&a, &alen) < 0 ||
            a.sin_family != AF_INET)
            continue;
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", ntohs(a.sin_port));
        r = redisCommand(raw, "CLIENT KILL ADDR %s", addr);
        /* The filter form answers how many clients it closed. */
        if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 1)
            killed++;
        freeReplyObject(r);
    }
    closedir(d);
    redisFree(raw);
    return killed;
}

int main(int argc, char **argv)
{
    const char *base = argc > 1 ? argv[1] : getenv("LEASE_TEST_REDIS_URL");
    char url[512], key[64], owner[LEASE_OWNER_BUFSZ], other[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    lease_keeper *k = NULL;
    lease_store *s = NULL;
    lease_grant g, g2;
    lease_info h;
    int rc;

    if (base == NULL || *base == '\0') {
        fprintf(stderr, "LEASE_TEST_REDIS_URL is not set: start a server "
                        "(scripts/test.sh does)\n");
        return 1;
    }
    fd_check_note();
    lease_log_set(NULL, NULL, LEASE_LOG_OFF);
    lease_owner_new(owner);
    lease_owner_new(other);
    snprintf(url, sizeof(url), "%s%sprefix=cloexec-%.8s:", base,
             strchr(base, '?') ? "&" : "?", owner);
    snprintf(key, sizeof(key), "k-%.8s", owner);

    rc = lease_store_open(&s, url);
    CHECK(rc == 0, "open: %s", lease_errmsg());
    if (rc < 0)
        return 1;
    o.owner = owner;
    o.ttl_ms = 3000;
    rc = lease_acquire(&g, &h, s, key, &o);
    CHECK(rc == 0, "acquire: %s", lease_errmsg());

    /* A keeper: a second handle, renewing on its own thread. */
    rc = lease_keeper_start(&k, s, &g, NULL);
    CHECK(rc == 0, "keeper: %s", lease_errmsg());

    /* A wait for the held key: the store subscribes on a second socket
     * (still open afterwards: the wait ends busy, not granted). */
    o.owner = other;
    o.wait_ms = 300;
    rc = lease_acquire(&g2, &h, s, key, &o);
    CHECK(rc == LEASE_ETIMEOUT, "the wait ends in ETIMEOUT, got %d: %s", rc,
          lease_errmsg());
    CHECK(count_sockets() >= 3,
          "the command, pub/sub and keeper connections are open (%d sockets)",
          count_sockets());
    CHECK(check_fds("after acquire, keeper and wait") >= 3,
          "no descriptors seen");

    /* A reconnection: the server closes the store's connections, then it
     * connects anew (the first call may hear of the loss). */
    CHECK(kill_my_connections("127.0.0.1", port_of(base)) >= 3,
          "the server closed the store's connections");
    rc = lease_inspect(&h, s, key);
    if (rc == LEASE_ESTORE)
        rc = lease_inspect(&h, s, key);
    CHECK(rc == 0, "inspect after reconnecting: %s", lease_errmsg());
    o.wait_ms = 200;
    rc = lease_acquire(&g2, &h, s, key, &o);
    CHECK(rc == LEASE_ETIMEOUT, "the second wait ends in ETIMEOUT, got %d: %s",
          rc, lease_errmsg());
    check_fds("after reconnecting");

    /* The keeper's connection was closed too: its release may hear of it
     * (the lease then runs out in its 3 s). */
    rc = lease_keeper_stop(NULL, k, 1);
    CHECK(rc == 0 || rc == LEASE_ESTORE, "keeper stop and release: %s",
          lease_errmsg());
    lease_store_close(s);

    if (failures) {
        fprintf(stderr, "redis_cloexec: %d checks FAILED\n", failures);
        return 1;
    }
    printf("redis_cloexec: every descriptor is close-on-exec\n");
    return 0;
}
