/*
 * fake_slots.h - the slots of an in-memory fake store that the unit tests
 * of the core's own logic (test_history.c, test_backend.c) need only to
 * fill a table: no fencing marks, no guarded data.
 */
#ifndef LEASE_TEST_FAKE_SLOTS_H
#define LEASE_TEST_FAKE_SLOTS_H

#include "lease_int.h"

static int fake_fence_advance(uint64_t *mark, lease_store *s, const char *r, uint64_t t)
{
    (void)s;
    (void)r;
    *mark = t;
    return 0;
}

static int fake_fence_mark(uint64_t *mark, lease_store *s, const char *r)
{
    (void)s;
    (void)r;
    *mark = 0;
    return LEASE_ENOTFOUND;
}

static int fake_guarded_put(lease_store *s, const char *key, const char *owner,
                            uint64_t token, const char *name, const void *v, size_t n)
{
    (void)s;
    (void)key;
    (void)owner;
    (void)token;
    (void)name;
    (void)v;
    (void)n;
    return 0;
}

static int fake_data_get(void **v, size_t *n, uint64_t *t, lease_store *s, const char *name)
{
    (void)v;
    (void)n;
    (void)t;
    (void)s;
    (void)name;
    return LEASE_ENOTFOUND;
}

#endif
