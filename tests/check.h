/*
 * check.h - the tests' CHECK: count a failed condition, say where and why
 * (with the library's last error), and go on; main() exits 1 when
 * `failures` is not 0. Header-only, shared by the programs that are not
 * cmocka tests.
 */
#ifndef LEASE_TEST_CHECK_H
#define LEASE_TEST_CHECK_H

#include <stdio.h>

#include "lease.h"

static int failures;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            failures++;                                                        \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, " (last error: %s)\n", lease_errmsg());            \
        }                                                                      \
    } while (0)

#endif
