/*
 * forwarder.c - see forwarder.h. One process, one epoll loop, blocking
 * writes: the servers measured here read requests as fast as they come
 * and buffer their answers, so a write to either side never waits long.
 */
#define _GNU_SOURCE
#include "forwarder.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* Enough for 1,000 keepers and the benchmark's own connection. */
#define FWD_PAIRS 4096
#define FWD_LISTEN_TAG UINT64_MAX
/* Large reads keep a pipelined batch in as few pieces as the kernel
 * allows, so that the server's first answers seldom split it. */
#define FWD_BUF (1 << 20)

enum { SIDE_CLIENT = 0, SIDE_SERVER = 1, SIDE_NONE = 2 };

typedef struct fwd_pair {
    int fd[2];
    int last; /* who spoke last: SIDE_CLIENT, SIDE_SERVER or SIDE_NONE */
} fwd_pair;

typedef struct fwd_loop {
    int ep;
    int lfd;
    struct sockaddr_in target;
    fwd_pair *pairs;
    uint64_t *turns;
    char *buf;
} fwd_loop;

static int listen_on(int port)
{
    struct sockaddr_in a;
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return -1;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 4096) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void nodelay(int fd)
{
    int one = 1;

    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void pair_close(fwd_loop *l, size_t i)
{
    int s;

    for (s = 0; s < 2; s++) {
        if (l->pairs[i].fd[s] >= 0) {
            epoll_ctl(l->ep, EPOLL_CTL_DEL, l->pairs[i].fd[s], NULL);
            close(l->pairs[i].fd[s]);
            l->pairs[i].fd[s] = -1;
        }
    }
}

static int watch(fwd_loop *l, int fd, uint64_t tag)
{
    struct epoll_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    return epoll_ctl(l->ep, EPOLL_CTL_ADD, fd, &ev);
}

/* Accept one client and connect it to the server. A connection that
 * cannot be relayed is closed: the client sees its server go away. */
static void accept_one(fwd_loop *l)
{
    int c = accept4(l->lfd, NULL, NULL, SOCK_CLOEXEC), s;
    size_t i;

    if (c < 0)
        return;
    for (i = 0; i < FWD_PAIRS && l->pairs[i].fd[0] >= 0; i++)
        ;
    s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (i == FWD_PAIRS || s < 0 ||
        connect(s, (struct sockaddr *)&l->target, sizeof(l->target)) != 0) {
        if (s >= 0)
            close(s);
        close(c);
        return;
    }
    nodelay(c);
    nodelay(s);
    l->pairs[i].fd[SIDE_CLIENT] = c;
    l->pairs[i].fd[SIDE_SERVER] = s;
    l->pairs[i].last = SIDE_NONE;
    if (watch(l, c, (uint64_t)i << 1 | SIDE_CLIENT) != 0 ||
        watch(l, s, (uint64_t)i << 1 | SIDE_SERVER) != 0)
        pair_close(l, i);
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Relay what one side sent; a client speaking after its server is a turn. */
static void relay(fwd_loop *l, size_t i, int side)
{
    fwd_pair *p = &l->pairs[i];
    ssize_t n;

    if (p->fd[side] < 0)
        return;
    n = read(p->fd[side], l->buf, FWD_BUF);
    if (n < 0 && errno == EINTR)
        return;
    if (n <= 0) {
        pair_close(l, i);
        return;
    }
    if (side == SIDE_CLIENT && p->last != SIDE_CLIENT)
        __atomic_add_fetch(l->turns, 1, __ATOMIC_RELAXED);
    p->last = side;
    if (write_all(p->fd[!side], l->buf, (size_t)n) != 0)
        pair_close(l, i);
}

static void serve(fwd_loop *l, pid_t parent)
{
    struct epoll_event evs[64];
    int i, n;

    for (;;) {
        n = epoll_wait(l->ep, evs, 64, 1000);
        if (getppid() != parent)
            return;
        for (i = 0; i < n; i++) {
            uint64_t tag = evs[i].data.u64;
            if (tag == FWD_LISTEN_TAG)
                accept_one(l);
            else
                relay(l, (size_t)(tag >> 1), (int)(tag & 1));
        }
    }
}

static void child(int lfd, const struct sockaddr_in *target, uint64_t *turns,
                  pid_t parent)
{
    fwd_loop l;
    size_t i;

    /* The benchmark may die without stopping us; never outlive it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(0);
    memset(&l, 0, sizeof(l));
    l.lfd = lfd;
    l.target = *target;
    l.turns = turns;
    l.ep = epoll_create1(EPOLL_CLOEXEC);
    l.pairs = calloc(FWD_PAIRS, sizeof(*l.pairs));
    l.buf = malloc(FWD_BUF);
    if (l.ep < 0 || l.pairs == NULL || l.buf == NULL ||
        watch(&l, lfd, FWD_LISTEN_TAG) != 0)
        _exit(1);
    for (i = 0; i < FWD_PAIRS; i++)
        l.pairs[i].fd[0] = l.pairs[i].fd[1] = -1;
    serve(&l, parent);
    _exit(0);
}

int bench_forwarder_start(bench_forwarder *f, int listen_port, const char *host,
                          int port)
{
    struct sockaddr_in target;
    pid_t parent = getpid();
    int lfd;

    memset(f, 0, sizeof(*f));
    memset(&target, 0, sizeof(target));
    target.sin_family = AF_INET;
    target.sin_port = htons((uint16_t)port);
    if (port <= 0 || port > 65535 || listen_port <= 0 || listen_port > 65535 ||
        inet_pton(AF_INET, host, &target.sin_addr) != 1) {
        fprintf(stderr, "forwarder: want an IPv4 address and ports 1..65535\n");
        return -1;
    }
    f->turns = mmap(NULL, sizeof(*f->turns), PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (f->turns == MAP_FAILED) {
        f->turns = NULL;
        return -1;
    }
    /* Listening before the fork: the first connect cannot come too early. */
    lfd = listen_on(listen_port);
    if (lfd < 0) {
        fprintf(stderr, "forwarder: cannot listen on 127.0.0.1:%d: %s\n",
                listen_port, strerror(errno));
        return -1;
    }
    f->pid = fork();
    if (f->pid == 0)
        child(lfd, &target, f->turns, parent);
    close(lfd);
    if (f->pid < 0) {
        fprintf(stderr, "forwarder: fork: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

uint64_t bench_forwarder_turns(const bench_forwarder *f)
{
    return f->turns ? __atomic_load_n(f->turns, __ATOMIC_RELAXED) : 0;
}

void bench_forwarder_stop(bench_forwarder *f)
{
    if (f->pid > 0) {
        kill(f->pid, SIGTERM);
        waitpid(f->pid, NULL, 0);
        f->pid = 0;
    }
    if (f->turns != NULL) {
        munmap(f->turns, sizeof(*f->turns));
        f->turns = NULL;
    }
}
