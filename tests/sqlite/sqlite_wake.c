/*
 * sqlite_wake.c - a release wakes the waiters of its key (issue 16, goal
 * 4): the SQLite store's wake files, seen from outside, in real processes.
 *
 *  - woken: a waiter whose every pause between tries is 5 to 10 minutes
 *    (backoff and wait of 10 minutes, a holder's ttl of 10 minutes)
 *    acquires within the test's bound of 60 s after the release: only the
 *    release's notification can explain that, never its polling;
 *  - a waiter killed with SIGKILL while it waits leaves nothing that stops
 *    the next waiter from being woken the same way;
 *  - where the wake files cannot be made (the wake directory's name taken
 *    by a regular file), releases still succeed and a waiter still gets
 *    the key by polling, with no error.
 *
 * The waiter counts as waiting once /proc shows an inotify watch among its
 * descriptors (bounded too): the release then cannot come before its wait.
 * Nothing here measures a time; the bounds only keep a broken build from
 * hanging.
 *
 * usage: sqlite_wake DIR (a writable directory for the database files)
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lease.h"

#include "../check.h"

#define MINUTES_10 600000u
#define BOUND_MS 60000

static void sleep_ms(long ms)
{
    usleep((useconds_t)ms * 1000);
}

static lease_store *open_store(const char *url)
{
    lease_store *s = NULL;

    if (lease_store_open(&s, url) < 0) {
        fprintf(stderr, "FATAL: open %s: %s\n", url, lease_errmsg());
        exit(1);
    }
    return s;
}

/* The holder's grant of `key`, for `ttl_ms`. */
static void hold(lease_grant *g, lease_store *s, const char *key, uint64_t ttl_ms)
{
    char owner[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;

    lease_owner_new(owner);
    o.owner = owner;
    o.ttl_ms = ttl_ms;
    if (lease_acquire(g, NULL, s, key, &o) < 0) {
        fprintf(stderr, "FATAL: hold %s: %s\n", key, lease_errmsg());
        exit(1);
    }
}

/* A child that waits for `key` with pauses of backoff_ms between tries
 * and exits 0 once it holds it (1 on any error, with the message). */
static pid_t spawn_waiter(const char *url, const char *key, uint64_t backoff_ms)
{
    pid_t pid = fork();

    if (pid == 0) {
        char owner[LEASE_OWNER_BUFSZ];
        lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
        lease_store *s = open_store(url);
        lease_grant g;
        int rc;

        lease_owner_new(owner);
        o.owner = owner;
        o.ttl_ms = MINUTES_10;
        o.wait_ms = MINUTES_10;
        o.backoff_min_ms = backoff_ms;
        o.backoff_max_ms = backoff_ms;
        rc = lease_acquire(&g, NULL, s, key, &o);
        if (rc < 0)
            fprintf(stderr, "waiter: %s: %s\n", lease_error_name(rc), lease_errmsg());
        _exit(rc == 0 ? 0 : 1);
    }
    if (pid < 0) {
        perror("FATAL: fork");
        exit(1);
    }
    return pid;
}

/* Does process `pid` hold an inotify watch? */
static int has_watch(pid_t pid)
{
    char dir[64], path[320], line[256];
    struct dirent *e;
    DIR *d;
    int found = 0;

    snprintf(dir, sizeof(dir), "/proc/%d/fdinfo", (int)pid);
    if ((d = opendir(dir)) == NULL)
        return 0;
    while (!found && (e = readdir(d)) != NULL) {
        FILE *f;

        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if ((f = fopen(path, "re")) == NULL)
            continue;
        while (!found && fgets(line, sizeof(line), f))
            found = strncmp(line, "inotify wd:", 11) == 0;
        fclose(f);
    }
    closedir(d);
    return found;
}

/* Wait (bounded) until the waiter watches its wake file. */
static int wait_for_watch(pid_t pid)
{
    int ms;

    for (ms = 0; ms < BOUND_MS; ms += 5) {
        if (has_watch(pid))
            return 1;
        sleep_ms(5);
    }
    return 0;
}

/* The child's exit status, or -1 (and the child killed) past the bound. */
static int reap(pid_t pid)
{
    int ms, status;

    for (ms = 0; ms < BOUND_MS; ms += 5) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        sleep_ms(5);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

/* Hold `key`, let a waiter whose polling would take minutes watch for it,
 * release: the waiter must get it within the bound. */
static void woken_by_release(const char *url, lease_store *s, const char *key,
                             const char *what)
{
    lease_grant g;
    pid_t pid;
    int rc;

    hold(&g, s, key, MINUTES_10);
    pid = spawn_waiter(url, key, MINUTES_10);
    CHECK(wait_for_watch(pid), "%s: the waiter never watched its wake file", what);
    rc = lease_release(s, &g);
    CHECK(rc == 0, "%s: release: %s", what, lease_error_name(rc));
    rc = reap(pid);
    CHECK(rc == 0, "%s: the waiter was not woken by the release (exit %d; its "
          "polling would take minutes)", what, rc);
}

/* A waiter killed while it waits, then the same again with a new one. */
static void killed_waiter(const char *url, lease_store *s)
{
    lease_grant g;
    pid_t pid;
    int status, rc;

    hold(&g, s, "killed", MINUTES_10);
    pid = spawn_waiter(url, "killed", MINUTES_10);
    CHECK(wait_for_watch(pid), "killed: the waiter never watched its wake file");
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    rc = lease_release(s, &g);
    CHECK(rc == 0, "killed: release with a dead waiter: %s", lease_error_name(rc));
    woken_by_release(url, s, "killed", "after a killed waiter");
}

/* The wake directory's name taken by a regular file: no wake files, the
 * waiter polls (every 50 ms) and still gets the key; nothing fails. */
static void no_wake_files(const char *dir)
{
    char url[4200], path[4200];
    struct stat st;
    lease_store *s;
    lease_grant g;
    pid_t pid;
    FILE *f;
    int rc;

    snprintf(url, sizeof(url), "sqlite://%s/nowake.db", dir);
    snprintf(path, sizeof(path), "%s/nowake.db-wake", dir);
    if ((f = fopen(path, "w")) == NULL) {
        perror("FATAL: create the blocking file");
        exit(1);
    }
    fclose(f);
    s = open_store(url);
    hold(&g, s, "nowake", MINUTES_10);
    pid = spawn_waiter(url, "nowake", 50);
    sleep_ms(300); /* a few polls; a release before them is fine too */
    rc = lease_release(s, &g);
    CHECK(rc == 0, "no wake files: release: %s", lease_error_name(rc));
    rc = reap(pid);
    CHECK(rc == 0, "no wake files: the polling waiter did not get the key (exit %d)", rc);
    CHECK(stat(path, &st) == 0 && S_ISREG(st.st_mode),
          "no wake files: the file in the way is left as it was");
    lease_store_close(s);
}

/* A wake directory anyone may write to (as if another user had made it
 * first in a shared directory) is not used: the waiter creates no file in
 * it and polls (every 50 ms), and still gets the key. */
static void foreign_wake_dir(const char *dir)
{
    char url[4200], path[4200];
    struct dirent *e;
    lease_store *s;
    lease_grant g;
    int rc, entries = 0;
    pid_t pid;
    DIR *d;

    snprintf(url, sizeof(url), "sqlite://%s/foreign.db", dir);
    snprintf(path, sizeof(path), "%s/foreign.db-wake", dir);
    if (mkdir(path, 0700) != 0 || chmod(path, 0777) != 0) {
        perror("FATAL: make the world-writable wake directory");
        exit(1);
    }
    s = open_store(url);
    hold(&g, s, "foreign", MINUTES_10);
    pid = spawn_waiter(url, "foreign", 50);
    sleep_ms(300); /* several waits; a release before them is fine too */
    rc = lease_release(s, &g);
    CHECK(rc == 0, "foreign wake dir: release: %s", lease_error_name(rc));
    rc = reap(pid);
    CHECK(rc == 0, "foreign wake dir: the polling waiter did not get the key (exit %d)", rc);
    if ((d = opendir(path)) != NULL) {
        while ((e = readdir(d)) != NULL)
            entries += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
        closedir(d);
    }
    CHECK(entries == 0, "foreign wake dir: %d file(s) were made in a directory "
          "anyone may write to", entries);
    lease_store_close(s);
}

int main(int argc, char **argv)
{
    char url[4200], dir[4096];
    lease_store *s;

    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    /* A fresh directory: no lease left by an earlier run. */
    snprintf(dir, sizeof(dir), "%s/sqlite_wake.XXXXXX", argv[1]);
    if (mkdtemp(dir) == NULL) {
        perror("FATAL: mkdtemp");
        return 1;
    }
    snprintf(url, sizeof(url), "sqlite://%s/wake.db", dir);
    s = open_store(url);
    woken_by_release(url, s, "woken", "woken");
    killed_waiter(url, s);
    lease_store_close(s);
    no_wake_files(dir);
    foreign_wake_dir(dir);
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
