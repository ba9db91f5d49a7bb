/*
 * stale_owner.c - the stale-owner race, played by real processes.
 *
 *   usage: stale_owner [--store URL] [--ttl DUR]
 *
 * Three processes share one store:
 *   resource  a protected resource: it runs the fencing check on every write
 *             and appends accepted writes to its ledger
 *   worker A  acquires (token n), checks its authority, and is paused with
 *             SIGSTOP just before it sends a write
 *   worker B  acquires after A's lease expired (token n+1), installs its
 *             generation at the resource, and writes
 * Then A is resumed and sends the write it had prepared: the resource rejects
 * it as stale. B writes again and is accepted.
 *
 * Exit status: 0 when the resource rejected A's stale write and accepted
 * all of B's, 1 otherwise, 2 on bad usage. It uses the public API only.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lease.h"

#define KEY "demo/reconcile-tenant-42"
#define RESOURCE "demo/tenant-42-ledger"
#define LINE 200

static const char *store_url;
static uint64_t ttl_ms = 1000;
static int timeline[2]; /* every process -> parent: one line per event */
static int64_t t0;

/* Lines shorter than PIPE_BUF are written atomically by the kernel, so
 * events of several processes never interleave. */
static void say(const char *who, const char *fmt, ...)
{
    char line[LINE], msg[LINE - 16];
    va_list ap;
    int n;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    n = snprintf(line, sizeof(line), "%s|%s\n", who, msg);
    if (write(timeline[1], line, (size_t)n) < 0)
        _exit(1);
}

static lease_store *open_store(const char *who)
{
    lease_store *s;

    if (lease_store_open(&s, store_url) < 0) {
        say(who, "cannot open the store: %s", lease_errmsg());
        _exit(1);
    }
    return s;
}

/* ---- the protected resource ------------------------------------------ */

typedef struct {
    char worker;
    uint64_t token;
    char text[48];
} request;

static int req_pipe[2];
static int reply_pipe[2][2]; /* resource -> worker A (0), worker B (1) */

static void resource_main(void)
{
    lease_store *s = open_store("resource");
    request r;

    close(req_pipe[1]); /* so that read() sees the end once workers exit */

    /* Bounded: it serves until every writer has closed the pipe. */
    while (read(req_pipe[0], &r, sizeof(r)) == (ssize_t)sizeof(r)) {
        uint64_t mark = 0;
        int rc = lease_fence_advance(&mark, s, RESOURCE, r.token);
        char verdict = rc == 0 ? 'Y' : 'N';

        if (rc == 0) {
            say("resource", "ACCEPTED  %-22s from %c with token %llu "
                "(high-water mark now %llu)", r.text, r.worker,
                (unsigned long long)r.token, (unsigned long long)mark);
        } else if (rc == LEASE_ESTALE) {
            say("resource", "REJECTED  %-22s from %c: token %llu is stale, "
                "mark is %llu", r.text, r.worker,
                (unsigned long long)r.token, (unsigned long long)mark);
        } else {
            say("resource", "ERROR     %s: %s", r.text, lease_errmsg());
            verdict = 'E';
        }
        if (write(reply_pipe[r.worker - 'A'][1], &verdict, 1) != 1)
            break;
    }
    lease_store_close(s);
    _exit(0);
}

/* ---- the workers ---------------------------------------------------- */

static int cmd_pipe[2][2]; /* parent -> worker */

static char wait_cmd(int idx)
{
    char c = 0;

    if (read(cmd_pipe[idx][0], &c, 1) != 1)
        _exit(1);
    return c;
}

static char send_write(char worker, uint64_t token, const char *text)
{
    request r;
    char verdict = 'E';

    memset(&r, 0, sizeof(r));
    r.worker = worker;
    r.token = token;
    snprintf(r.text, sizeof(r.text), "%s", text);
    if (write(req_pipe[1], &r, sizeof(r)) != (ssize_t)sizeof(r) ||
        read(reply_pipe[worker - 'A'][0], &verdict, 1) != 1)
        return 'E';
    return verdict;
}

static void worker_main(char name)
{
    char who[16], owner[LEASE_OWNER_BUFSZ];
    int idx = name - 'A';
    lease_acquire_opts ao = LEASE_ACQUIRE_OPTS_INIT;
    lease_keeper *keeper;
    lease_grant grant;
    lease_store *s;
    char c;

    snprintf(who, sizeof(who), "worker %c", name);
    s = open_store(who);
    lease_owner_new(owner);
    ao.owner = owner;
    ao.ttl_ms = ttl_ms;
    ao.label = name == 'A' ? "worker-A" : "worker-B";
    ao.wait_ms = ttl_ms * 5;
    if (lease_acquire(&grant, NULL, s, KEY, &ao) < 0) {
        say(who, "FAILED to acquire: %s", lease_errmsg());
        _exit(1);
    }
    say(who, "acquired token %llu (ttl %llu ms)", (unsigned long long)grant.token,
        (unsigned long long)grant.ttl_ms);
    if (lease_keeper_start(&keeper, s, &grant, NULL) < 0) {
        say(who, "FAILED to start the keeper: %s", lease_errmsg());
        _exit(1);
    }
    /* Bounded: the parent sends a finite script and then 'q'. */
    while ((c = wait_cmd(idx)) != 'q') {
        char verdict;

        if (c == 'i') {
            /* Install the new generation before doing any work, so the
             * previous owner is fenced off at once. */
            verdict = send_write(name, grant.token, "install generation");
            say(who, "installed token %llu at the resource: %s",
                (unsigned long long)grant.token,
                verdict == 'Y' ? "accepted" : "REFUSED");
        } else if (c == 'w') {
            int valid = lease_keeper_valid(keeper);
            say(who, "authority valid: %s; sending a write with token %llu",
                valid ? "yes" : "NO", (unsigned long long)grant.token);
            if (name == 'A') {
                /* The pause comes here, between the check and the send:
                 * the parent stops this process now. */
                say(who, "ready");
                wait_cmd(idx);
            }
            verdict = send_write(name, grant.token,
                                 name == 'A' ? "reconcile (stale state)"
                                             : "reconcile");
            say(who, "write %s", verdict == 'Y' ? "accepted" :
                                 verdict == 'N' ? "REJECTED as stale" : "failed");
            if (name == 'A') {
                int rc = lease_renew(&grant, s, 0);
                say(who, "after the pause: authority valid: %s, renew: %s",
                    lease_keeper_valid(keeper) ? "yes" : "no",
                    rc == 0 ? "ok" : lease_error_name(rc));
            }
        }
    }
    lease_keeper_stop(NULL, keeper, 1);
    lease_store_close(s);
    say(who, "released and exited");
    _exit(0);
}

/* ---- the parent: runs the script and prints the timeline --------------- */

typedef struct {
    int rejected_a, accepted_b, refused_b;
    uint64_t token_a, token_b;
} outcome;

static void note(outcome *o, const char *who, const char *msg)
{
    unsigned long long t;

    if (strcmp(who, "resource") == 0) {
        if (strncmp(msg, "REJECTED", 8) == 0 && strstr(msg, " from A"))
            o->rejected_a++;
        if (strncmp(msg, "ACCEPTED", 8) == 0 && strstr(msg, " from B"))
            o->accepted_b++;
        if (strncmp(msg, "ACCEPTED", 8) != 0 && strstr(msg, " from B"))
            o->refused_b++;
        if (strncmp(msg, "ACCEPTED", 8) == 0 && strstr(msg, " from A") &&
            o->token_b)
            o->rejected_a = -1000; /* a stale write got through */
    }
    if (sscanf(msg, "acquired token %llu", &t) == 1) {
        if (who[7] == 'A')
            o->token_a = t;
        else
            o->token_b = t;
    }
}

/* Print timeline lines until one from `who` starts with `prefix`, or fail
 * after `limit_ms`. */
static int expect(outcome *o, const char *who, const char *prefix, int limit_ms)
{
    static char buf[8192];
    static size_t len;
    int64_t end = lease_clock_ns() + (int64_t)limit_ms * 1000000;

    for (;;) {
        char *nl;

        while ((nl = memchr(buf, '\n', len)) != NULL) {
            char *bar = memchr(buf, '|', (size_t)(nl - buf)), *msg;
            int match;

            *nl = '\0';
            msg = bar ? bar + 1 : buf;
            if (bar)
                *bar = '\0';
            note(o, buf, msg);
            if (strcmp(msg, "ready") != 0)
                printf("%7.3fs  %-9s %s\n",
                       (double)(lease_clock_ns() - t0) / 1e9, buf, msg);
            match = strcmp(buf, who) == 0 && strncmp(msg, prefix, strlen(prefix)) == 0;
            len -= (size_t)(nl + 1 - buf);
            memmove(buf, nl + 1, len);
            if (match)
                return 0;
        }
        {
            int64_t left = (end - lease_clock_ns()) / 1000000;
            struct pollfd p = { timeline[0], POLLIN, 0 };
            ssize_t n;

            if (left <= 0 || poll(&p, 1, (int)left) <= 0) {
                printf("          (no '%s' from %s in time)\n", prefix, who);
                return -1;
            }
            n = read(timeline[0], buf + len, sizeof(buf) - 1 - len);
            if (n <= 0)
                return -1;
            len += (size_t)n;
        }
    }
}

static void tell(int idx, char c)
{
    if (write(cmd_pipe[idx][1], &c, 1) != 1)
        perror("stale_owner: tell");
}

static pid_t spawn(void (*fn)(char), char arg)
{
    pid_t pid = fork();

    if (pid == 0) {
        fn(arg);
        _exit(0);
    }
    return pid;
}

static void resource_trampoline(char unused)
{
    (void)unused;
    resource_main();
}

int main(int argc, char **argv)
{
    char default_url[512];
    outcome o = { 0, 0, 0, 0, 0 };
    pid_t res, a, b;
    int i, ok, limit;

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--store") == 0 && i + 1 < argc) {
            store_url = argv[++i];
        } else if (strcmp(argv[i], "--ttl") == 0 && i + 1 < argc) {
            if (lease_parse_duration(&ttl_ms, argv[++i]) < 0 || ttl_ms < 100) {
                fprintf(stderr, "stale_owner: --ttl must be a duration of at least 100ms\n");
                return 2;
            }
        } else {
            fprintf(stderr, "usage: stale_owner [--store URL] [--ttl DUR]\n");
            return 2;
        }
    }
    if (store_url == NULL) {
        snprintf(default_url, sizeof(default_url),
                 "sqlite:///tmp/lease-stale-owner-%ld.db", (long)getpid());
        store_url = default_url;
    }
    limit = (int)ttl_ms * 6 + 5000;
    if (pipe(timeline) || pipe(req_pipe) || pipe(reply_pipe[0]) ||
        pipe(reply_pipe[1]) || pipe(cmd_pipe[0]) || pipe(cmd_pipe[1])) {
        perror("stale_owner: pipe");
        return 1;
    }
    {
        lease_store *s;
        if (lease_store_open(&s, store_url) < 0) {
            fprintf(stderr, "stale_owner: %s\n", lease_errmsg());
            return 1;
        }
        printf("store %s, key %s, resource %s, ttl %llu ms\n\n",
               lease_store_url_redacted(s), KEY, RESOURCE,
               (unsigned long long)ttl_ms);
        lease_store_close(s);
    }
    t0 = lease_clock_ns();
    res = spawn(resource_trampoline, 0);
    a = spawn(worker_main, 'A');
    ok = expect(&o, "worker A", "acquired", limit) == 0;
    if (ok) {
        tell(0, 'i');
        ok = expect(&o, "worker A", "installed", limit) == 0;
    }
    if (ok) {
        tell(0, 'w');
        ok = expect(&o, "worker A", "ready", limit) == 0;
    }
    if (ok) {
        kill(a, SIGSTOP);
        printf("%7.3fs  %-9s worker A is paused (SIGSTOP) past its ttl, "
               "its write still unsent\n",
               (double)(lease_clock_ns() - t0) / 1e9, "demo");
        b = spawn(worker_main, 'B');
        ok = expect(&o, "worker B", "acquired", limit) == 0;
        if (ok) {
            tell(1, 'i');
            ok = expect(&o, "worker B", "installed", limit) == 0;
        }
        if (ok) {
            tell(1, 'w');
            ok = expect(&o, "worker B", "write", limit) == 0;
        }
        printf("%7.3fs  %-9s worker A resumes (SIGCONT) and sends the write it "
               "prepared\n", (double)(lease_clock_ns() - t0) / 1e9, "demo");
        kill(a, SIGCONT);
        tell(0, 'g');
        if (ok)
            ok = expect(&o, "worker A", "after the pause", limit) == 0;
        if (ok) {
            tell(1, 'w');
            ok = expect(&o, "worker B", "write", limit) == 0;
        }
        tell(1, 'q');
        if (ok)
            expect(&o, "worker B", "released", limit);
        waitpid(b, NULL, 0);
    }
    kill(a, SIGCONT);
    tell(0, 'q');
    waitpid(a, NULL, 0);
    close(req_pipe[1]);
    waitpid(res, NULL, 0);

    ok = ok && o.token_b > o.token_a && o.rejected_a == 1 &&
         o.accepted_b == 3 && o.refused_b == 0;
    printf("\n%s: A held token %llu, B token %llu; the resource rejected %d "
           "stale write(s) from A and accepted %d write(s) from B.\n",
           ok ? "PASS" : "FAIL", (unsigned long long)o.token_a,
           (unsigned long long)o.token_b, o.rejected_a < 0 ? 0 : o.rejected_a,
           o.accepted_b);
    if (store_url == default_url) {
        char path[600];
        snprintf(path, sizeof(path), "%s", default_url + 9);
        unlink(path);
        strcat(path, "-wal");
        unlink(path);
        path[strlen(path) - 4] = '\0';
        strcat(path, "-shm");
        unlink(path);
    }
    return ok ? 0 : 1;
}
