/*
 * probe.h - what a process costs, read from /proc and getrusage: its
 * descriptors, TCP connections, threads, memory and CPU, and the CPU of
 * a server's processes.
 */
#ifndef BENCH_PROBE_H
#define BENCH_PROBE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Open descriptors of this process. */
long probe_fds(void);

/* Established TCP connections (IPv4 and IPv6) of this process. */
long probe_tcp(void);

/* A field of /proc/self/status in kB or as a count ("VmRSS", "Threads"),
 * -1 when absent. */
long probe_status(const char *field);

/* CPU seconds (user + system) of this process, every thread. */
double probe_self_cpu(void);

/*
 * CPU clock ticks of a server: the given processes and their direct
 * children (PostgreSQL's backends), one entry per process so that a
 * process that appears or goes between two snapshots is counted right.
 */
typedef struct probe_procs {
    size_t n;
    pid_t *pid;
    uint64_t *ticks;
} probe_procs;

int probe_procs_take(probe_procs *out, const pid_t *roots, size_t nroots);
/* CPU seconds spent by the server between two snapshots. */
double probe_procs_delta(const probe_procs *before, const probe_procs *after);
void probe_procs_free(probe_procs *p);

#endif
