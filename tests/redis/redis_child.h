/*
 * redis_child.h - run a piece of a test in a forked child and collect what
 * it reports, for the Redis tests.
 *
 * Why a child: some library state is per process (the Redis store warns
 * about durability once per process), so each case starts from a fresh
 * copy of a parent that never opened a Redis store. Children never call
 * cmocka's assertions: they write plain text lines to a pipe and end with
 * _exit(); the parent reads them (bounded) and asserts.
 */
#ifndef REDIS_CHILD_H
#define REDIS_CHILD_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The child's end of the pipe. */
static int child_fd = -1;

/* Write one line (a '\n' is added) to the parent. */
static void child_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void child_say(const char *fmt, ...)
{
    char buf[8192];
    va_list ap;
    int n;
    size_t off = 0;

    va_start(ap, fmt);
    n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(buf) - 2)
        n = (int)sizeof(buf) - 2;
    buf[n++] = '\n';
    while (off < (size_t)n) {
        ssize_t w = write(child_fd, buf + off, (size_t)n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        off += (size_t)w;
    }
}

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * Run fn(arg) in a child. Returns what it wrote (malloc'd, NUL-terminated;
 * the caller frees it) and its exit status in *status (-1 if it had to be
 * killed after timeout_ms). Never blocks longer than timeout_ms + a little.
 */
static char *run_child(void (*fn)(void *), void *arg, int timeout_ms, int *status)
{
    int fds[2], st = 0;
    pid_t pid;
    char *out = NULL;
    size_t len = 0, cap = 0;
    int64_t end = mono_ms() + timeout_ms;

    *status = -1;
    if (pipe(fds) != 0)
        return NULL;
    fflush(NULL);
    pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return NULL;
    }
    if (pid == 0) {
        /* cmocka catches crashes in the parent; a crash in the child must
         * end the child, with its signal, for the parent to see. */
        static const int sigs[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT };
        size_t i;
        for (i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
            signal(sigs[i], SIG_DFL);
        close(fds[0]);
        child_fd = fds[1];
        fn(arg);
        _exit(0);
    }
    close(fds[1]);
    for (;;) {
        struct pollfd p = { fds[0], POLLIN, 0 };
        int64_t left = end - mono_ms();
        char buf[4096];
        ssize_t n;

        if (left <= 0)
            break;
        if (poll(&p, 1, (int)left) <= 0)
            continue; /* EINTR or timeout: the loop re-checks the time */
        n = read(fds[0], buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* EOF: the child is done */
        if (len + (size_t)n + 1 > cap) {
            char *p2;
            cap = (len + (size_t)n + 1) * 2;
            p2 = realloc(out, cap);
            if (p2 == NULL)
                break;
            out = p2;
        }
        memcpy(out + len, buf, (size_t)n);
        len += (size_t)n;
    }
    close(fds[0]);
    if (mono_ms() >= end) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    } else {
        /* The pipe is closed: the child is exiting. Bounded anyway. */
        int64_t wend = mono_ms() + 5000;
        while (waitpid(pid, &st, WNOHANG) == 0) {
            if (mono_ms() >= wend) {
                kill(pid, SIGKILL);
                waitpid(pid, &st, 0);
                st = -1;
                break;
            }
            usleep(10000);
        }
        if (st != -1)
            *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (out == NULL)
        out = calloc(1, 1);
    else
        out[len] = '\0';
    return out;
}

#endif
