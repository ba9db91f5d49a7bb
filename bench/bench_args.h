/*
 * bench_args.h - the command-line numbers of the benchmark programs:
 * a whole number in a range, or a usage error (exit 2) naming the program.
 */
#ifndef BENCH_ARGS_H
#define BENCH_ARGS_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static inline long bench_arg_long(const char *prog, const char *s, long lo, long hi)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "%s: '%s' is not a number in %ld..%ld\n", prog, s, lo, hi);
        exit(2);
    }
    return v;
}

#endif
