/*
 * forwarder.h - a loopback TCP forwarder, in a process of its own, that
 * counts request/response turns between a client and its server.
 *
 * The benchmark counts round trips outside the library: its store URL
 * points at the forwarder, which relays every connection to the real
 * server and counts a turn each time a client sends after its server last
 * spoke on that connection. A pipelined batch is one turn; a request
 * answered before the next is sent is one turn each. The forwarder is a
 * separate process so that its CPU is charged neither to the client nor
 * to the server.
 */
#ifndef BENCH_FORWARDER_H
#define BENCH_FORWARDER_H

#include <stdint.h>
#include <sys/types.h>

typedef struct bench_forwarder {
    pid_t pid;
    uint64_t *turns; /* shared with the forwarder process */
} bench_forwarder;

/*
 * Listen on 127.0.0.1:listen_port and relay each connection to
 * host:port. Call before any thread is started (it forks). 0 or -1 with
 * a message on stderr.
 */
int bench_forwarder_start(bench_forwarder *f, int listen_port, const char *host,
                          int port);

/* Turns counted so far over every connection. */
uint64_t bench_forwarder_turns(const bench_forwarder *f);

/* Stop the forwarder process and wait for it. */
void bench_forwarder_stop(bench_forwarder *f);

#endif
