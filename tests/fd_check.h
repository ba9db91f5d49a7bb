/*
 * fd_check.h - for tests: are the descriptors the library opened
 * close-on-exec? Header-only, shared by the stores' tests.
 *
 *   fd_check_note();              before the library runs: what the process
 *                                 inherited (ctest's log, a shell's pipes)
 *   n = fd_check_cloexec(bad, a); calls bad(fd, target, a) for each newer
 *                                 descriptor above 2 without FD_CLOEXEC;
 *                                 returns how many newer ones it looked at
 */
#ifndef LEASE_TEST_FD_CHECK_H
#define LEASE_TEST_FD_CHECK_H

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define FD_CHECK_MAX 4096
static unsigned char fd_check_inherited[FD_CHECK_MAX];

static void fd_check_note(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;

    /* Bounded by the process's descriptors. */
    while (d && (e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] != '.' && fd >= 0 && fd < FD_CHECK_MAX && fd != dirfd(d))
            fd_check_inherited[fd] = 1;
    }
    if (d)
        closedir(d);
}

static int fd_check_cloexec(void (*bad)(int fd, const char *target, void *arg),
                            void *arg)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int seen = 0;

    if (d == NULL) {
        bad(-1, "cannot list /proc/self/fd", arg);
        return 0;
    }
    while ((e = readdir(d)) != NULL) {
        char path[64], target[256];
        int fd = atoi(e->d_name), flags;
        ssize_t n;

        if (e->d_name[0] == '.' || fd <= 2 || fd == dirfd(d) ||
            (fd < FD_CHECK_MAX && fd_check_inherited[fd]))
            continue;
        seen++;
        flags = fcntl(fd, F_GETFD);
        if (flags >= 0 && (flags & FD_CLOEXEC))
            continue;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        n = readlink(path, target, sizeof(target) - 1);
        target[n > 0 ? n : 0] = '\0';
        bad(fd, target, arg);
    }
    closedir(d);
    return seen;
}

#endif
