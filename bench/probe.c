/*
 * probe.c - see probe.h. Linux only: everything comes from /proc.
 */
#define _GNU_SOURCE
#include "probe.h"

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

long probe_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    long n = 0;

    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

static int cmp_ul(const void *a, const void *b)
{
    unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;

    return (x > y) - (x < y);
}

/* The socket inodes of this process, sorted; *n of them. */
static unsigned long *socket_inodes(size_t *n)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    unsigned long *v = NULL, ino;
    size_t cap = 0;
    char link[64];

    *n = 0;
    if (d == NULL)
        return NULL;
    while ((e = readdir(d)) != NULL) {
        ssize_t len;
        if (e->d_name[0] == '.')
            continue;
        len = readlinkat(dirfd(d), e->d_name, link, sizeof(link) - 1);
        if (len <= 0)
            continue;
        link[len] = '\0';
        if (sscanf(link, "socket:[%lu]", &ino) != 1)
            continue;
        if (*n == cap) {
            unsigned long *nv = realloc(v, (cap ? cap * 2 : 64) * sizeof(*v));
            if (nv == NULL)
                break;
            v = nv;
            cap = cap ? cap * 2 : 64;
        }
        v[(*n)++] = ino;
    }
    closedir(d);
    if (v != NULL)
        qsort(v, *n, sizeof(*v), cmp_ul);
    return v;
}

/* Established connections in one /proc/net table whose inode is ours. */
static long count_table(const char *file, const unsigned long *ino, size_t n)
{
    FILE *f = fopen(file, "re");
    char line[512];
    long count = 0;

    if (f == NULL)
        return 0;
    if (fgets(line, sizeof(line), f) == NULL) { /* the header */
        fclose(f);
        return 0;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned int st;
        unsigned long inode;
        /* sl local remote st tx:rx tr:when retrnsmt uid timeout inode */
        if (sscanf(line, "%*s %*s %*s %x %*s %*s %*s %*s %*s %lu", &st, &inode) != 2)
            continue;
        if (st == 0x01 && bsearch(&inode, ino, n, sizeof(*ino), cmp_ul) != NULL)
            count++;
    }
    fclose(f);
    return count;
}

long probe_tcp(void)
{
    size_t n;
    unsigned long *ino = socket_inodes(&n);
    long count;

    if (n == 0) {
        free(ino);
        return 0;
    }
    count = count_table("/proc/self/net/tcp", ino, n) +
            count_table("/proc/self/net/tcp6", ino, n);
    free(ino);
    return count;
}

long probe_status(const char *field)
{
    FILE *f = fopen("/proc/self/status", "re");
    char line[256];
    size_t len = strlen(field);
    long v = -1;

    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, field, len) == 0 && line[len] == ':') {
            v = strtol(line + len + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

double probe_self_cpu(void)
{
    struct rusage ru;

    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* ppid and utime + stime of one process; -1 when it is gone. The command
 * name may hold spaces and parentheses: fields start after the last ')'. */
static int proc_stat(pid_t pid, pid_t *ppid, uint64_t *ticks)
{
    char path[64], buf[1024], *p;
    unsigned long long ut, st;
    FILE *f;
    size_t n;
    int pp;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "re");
    if (f == NULL)
        return -1;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    p = strrchr(buf, ')');
    /* state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (p == NULL ||
        sscanf(p + 1, " %*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &pp,
               &ut, &st) != 3)
        return -1;
    *ppid = pp;
    *ticks = ut + st;
    return 0;
}

static int is_root(pid_t pid, const pid_t *roots, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (roots[i] == pid)
            return 1;
    return 0;
}

static int procs_add(probe_procs *p, size_t *cap, pid_t pid, uint64_t ticks)
{
    if (p->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        pid_t *np = realloc(p->pid, nc * sizeof(*np));
        uint64_t *nt;
        if (np == NULL)
            return -1;
        p->pid = np;
        nt = realloc(p->ticks, nc * sizeof(*nt));
        if (nt == NULL)
            return -1;
        p->ticks = nt;
        *cap = nc;
    }
    p->pid[p->n] = pid;
    p->ticks[p->n++] = ticks;
    return 0;
}

int probe_procs_take(probe_procs *out, const pid_t *roots, size_t nroots)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    size_t cap = 0;

    memset(out, 0, sizeof(*out));
    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL) {
        pid_t pid, ppid;
        uint64_t ticks;
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        pid = (pid_t)strtol(e->d_name, NULL, 10);
        if (proc_stat(pid, &ppid, &ticks) != 0)
            continue;
        if ((is_root(pid, roots, nroots) || is_root(ppid, roots, nroots)) &&
            procs_add(out, &cap, pid, ticks) != 0) {
            closedir(d);
            return -1;
        }
    }
    closedir(d);
    return 0;
}

double probe_procs_delta(const probe_procs *before, const probe_procs *after)
{
    uint64_t total = 0;
    size_t i, j;

    for (i = 0; i < after->n; i++) {
        uint64_t start = 0;
        for (j = 0; j < before->n; j++)
            if (before->pid[j] == after->pid[i])
                start = before->ticks[j];
        if (after->ticks[i] >= start)
            total += after->ticks[i] - start;
    }
    return (double)total / (double)sysconf(_SC_CLK_TCK);
}

void probe_procs_free(probe_procs *p)
{
    free(p->pid);
    free(p->ticks);
    memset(p, 0, sizeof(*p));
}
