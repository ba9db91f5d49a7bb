/*
 * conf_util.c - the state conf_util.h declares: one copy per program,
 * shared by all of its files.
 */
#include "conf_util.h"

const char *conf_url;
lease_store *conf_store;
char conf_prefix[64];
pid_t conf_children[CONF_MAX_CHILDREN];

/* ---- the pausable TCP forwarder ----------------------------------------- */

#include <fcntl.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#define FWD_MAX_PAIRS 64

enum fwd_cmd { FWD_NONE, FWD_PAUSE, FWD_RESUME, FWD_STOP };

struct conf_forwarder {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t done;
    enum fwd_cmd cmd;  /* under mu: what the thread is asked to do */
    int listen_fd, wake[2], port, paused;
    struct sockaddr_storage up; /* the real server */
    socklen_t up_len;
    int pair[FWD_MAX_PAIRS][2]; /* client, upstream; -1 when unused */
};

static void fwd_close_pair(conf_forwarder *f, size_t i)
{
    close(f->pair[i][0]);
    close(f->pair[i][1]);
    f->pair[i][0] = f->pair[i][1] = -1;
}

static void fwd_close_all(conf_forwarder *f)
{
    size_t i;

    for (i = 0; i < FWD_MAX_PAIRS; i++)
        if (f->pair[i][0] >= 0)
            fwd_close_pair(f, i);
}

/* A new client: while paused it is dropped at once (a server that is
 * gone), else it gets its own connection to the server. */
static void fwd_accept(conf_forwarder *f)
{
    int c = accept(f->listen_fd, NULL, NULL), u;
    size_t i;

    if (c < 0)
        return;
    fcntl(c, F_SETFD, FD_CLOEXEC);
    if (f->paused) {
        close(c);
        return;
    }
    u = socket(f->up.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (u < 0 || connect(u, (struct sockaddr *)&f->up, f->up_len) != 0) {
        if (u >= 0)
            close(u);
        close(c);
        return;
    }
    for (i = 0; i < FWD_MAX_PAIRS; i++)
        if (f->pair[i][0] < 0) {
            f->pair[i][0] = c;
            f->pair[i][1] = u;
            return;
        }
    close(u);
    close(c);
}

/* Copy what `from` has to `to`. 0, or -1 when the pair is over. A blocking
 * send is enough: both ends are live clients and servers reading them. */
static int fwd_relay(int from, int to)
{
    char buf[16384];
    ssize_t n = recv(from, buf, sizeof(buf), 0), done = 0;

    if (n < 0 && errno == EINTR)
        return 0;
    if (n <= 0)
        return -1;
    while (done < n) {
        ssize_t w = send(to, buf + done, (size_t)(n - done), MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        done += w;
    }
    return 0;
}

/* Carry out a command from the test's thread; 1 when told to stop. */
static int fwd_command(conf_forwarder *f)
{
    char b[16];
    int stop;

    while (read(f->wake[0], b, sizeof(b)) > 0)
        ;
    pthread_mutex_lock(&f->mu);
    if (f->cmd == FWD_PAUSE || f->cmd == FWD_STOP)
        fwd_close_all(f);
    if (f->cmd == FWD_PAUSE)
        f->paused = 1;
    else if (f->cmd == FWD_RESUME)
        f->paused = 0;
    stop = f->cmd == FWD_STOP;
    f->cmd = FWD_NONE;
    pthread_cond_broadcast(&f->done);
    pthread_mutex_unlock(&f->mu);
    return stop;
}

static void *fwd_main(void *arg)
{
    conf_forwarder *f = arg;
    struct pollfd p[2 + 2 * FWD_MAX_PAIRS];
    size_t i, n;

    for (;;) {
        p[0] = (struct pollfd){ f->wake[0], POLLIN, 0 };
        p[1] = (struct pollfd){ f->listen_fd, POLLIN, 0 };
        for (i = 0, n = 2; i < FWD_MAX_PAIRS; i++, n += 2) {
            p[n] = (struct pollfd){ f->pair[i][0], POLLIN, 0 };
            p[n + 1] = (struct pollfd){ f->pair[i][1], POLLIN, 0 };
        }
        if (poll(p, n, -1) < 0)
            continue;
        if ((p[0].revents & POLLIN) && fwd_command(f))
            return NULL;
        if (p[1].revents & POLLIN)
            fwd_accept(f);
        for (i = 0; i < FWD_MAX_PAIRS; i++) {
            short ra = p[2 + 2 * i].revents, rb = p[3 + 2 * i].revents;
            if (f->pair[i][0] < 0 || p[2 + 2 * i].fd != f->pair[i][0])
                continue; /* closed, or a new pair after this poll */
            if (((ra & (POLLIN | POLLHUP | POLLERR)) &&
                 fwd_relay(f->pair[i][0], f->pair[i][1]) < 0) ||
                ((rb & (POLLIN | POLLHUP | POLLERR)) &&
                 fwd_relay(f->pair[i][1], f->pair[i][0]) < 0))
                fwd_close_pair(f, i);
        }
    }
}

static int fwd_listen(conf_forwarder *f)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    f->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (f->listen_fd < 0 || bind(f->listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(f->listen_fd, 64) != 0 ||
        getsockname(f->listen_fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    f->port = ntohs(a.sin_port);
    return 0;
}

/* The thread's wake-up pipe: the read end never blocks (it is drained). */
static int fwd_pipe(int fds[2])
{
    if (pipe(fds) != 0)
        return -1;
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    return 0;
}

conf_forwarder *conf_forwarder_start(const char *host, const char *port)
{
    struct addrinfo hints, *ai = NULL;
    conf_forwarder *f = calloc(1, sizeof(*f));
    size_t i;
    int rc;

    if (f == NULL)
        return NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    if ((rc = getaddrinfo(host, port, &hints, &ai)) != 0) {
        fprintf(stderr, "forwarder: %s:%s: %s\n", host, port, gai_strerror(rc));
        free(f);
        return NULL;
    }
    memcpy(&f->up, ai->ai_addr, ai->ai_addrlen);
    f->up_len = ai->ai_addrlen;
    freeaddrinfo(ai);
    for (i = 0; i < FWD_MAX_PAIRS; i++)
        f->pair[i][0] = f->pair[i][1] = -1;
    f->listen_fd = -1;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->done, NULL);
    if (fwd_listen(f) != 0 || fwd_pipe(f->wake) != 0 ||
        pthread_create(&f->thread, NULL, fwd_main, f) != 0) {
        fprintf(stderr, "forwarder: %s\n", strerror(errno));
        if (f->listen_fd >= 0)
            close(f->listen_fd);
        free(f);
        return NULL;
    }
    return f;
}

int conf_forwarder_port(const conf_forwarder *f)
{
    return f->port;
}

static void fwd_ask(conf_forwarder *f, enum fwd_cmd cmd)
{
    pthread_mutex_lock(&f->mu);
    f->cmd = cmd;
    while (write(f->wake[1], "x", 1) < 0 && errno == EINTR)
        ;
    while (f->cmd != FWD_NONE)
        pthread_cond_wait(&f->done, &f->mu);
    pthread_mutex_unlock(&f->mu);
}

void conf_forwarder_pause(conf_forwarder *f)
{
    fwd_ask(f, FWD_PAUSE);
}

void conf_forwarder_resume(conf_forwarder *f)
{
    fwd_ask(f, FWD_RESUME);
}

void conf_forwarder_stop(conf_forwarder *f)
{
    if (f == NULL)
        return;
    fwd_ask(f, FWD_STOP);
    pthread_join(f->thread, NULL);
    close(f->listen_fd);
    close(f->wake[0]);
    close(f->wake[1]);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->done);
    free(f);
}

/* Where the authority's host:port is in url: [*b, *e). -1 if none, or
 * several hosts. */
static int url_hostport_span(size_t *b, size_t *e, const char *url)
{
    const char *p = strstr(url, "://"), *end, *at;

    if (p == NULL)
        return -1;
    p += 3;
    end = p + strcspn(p, "/?#");
    for (at = end; at > p && at[-1] != '@'; at--)
        ;
    if (at == end || memchr(at, ',', (size_t)(end - at)) != NULL)
        return -1;
    *b = (size_t)(at - url);
    *e = (size_t)(end - url);
    return 0;
}

static const char *url_default_port(const char *url)
{
    if (strncmp(url, "postgres", 8) == 0)
        return "5432";
    if (strncmp(url, "redis", 5) == 0)
        return "6379";
    return "2379"; /* etcd */
}

int conf_url_hostport(char *host, size_t hostsz, char *port, size_t portsz,
                      const char *url)
{
    size_t b, e, hl;
    const char *hp, *colon;

    if (url_hostport_span(&b, &e, url) != 0)
        return -1;
    hp = url + b;
    if (hp[0] == '[') { /* [v6]:port */
        const char *close_br = memchr(hp, ']', e - b);
        if (close_br == NULL)
            return -1;
        hl = (size_t)(close_br - hp - 1);
        hp++;
        colon = close_br[1] == ':' ? close_br + 1 : NULL;
    } else {
        colon = memchr(hp, ':', e - b);
        hl = colon ? (size_t)(colon - hp) : e - b;
    }
    if (hl == 0 || hl >= hostsz)
        return -1;
    memcpy(host, hp, hl);
    host[hl] = '\0';
    if (snprintf(port, portsz, "%.*s", colon ? (int)(url + e - colon - 1) : 0,
                 colon ? colon + 1 : "") >= (int)portsz)
        return -1;
    if (port[0] == '\0' && snprintf(port, portsz, "%s", url_default_port(url)) >= (int)portsz)
        return -1;
    return 0;
}

int conf_url_via(char *out, size_t outsz, const char *url, int port)
{
    size_t b, e;
    int n;

    if (url_hostport_span(&b, &e, url) != 0)
        return -1;
    n = snprintf(out, outsz, "%.*s127.0.0.1:%d%s", (int)b, url, port, url + e);
    return n < 0 || (size_t)n >= outsz ? -1 : 0;
}
