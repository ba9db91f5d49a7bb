/*
 * store_int.h - what the in-tree stores share, on top of the core's
 * internals (lease_int.h). Each store is one file that includes this and
 * nothing of another store; what two stores would otherwise each write
 * their own way lives here or in the core:
 *  - refusals: LEASE_ELOST for a renew, release, guarded put or guarded
 *    transaction that is not the holder's is lease__not_holder(), so every
 *    store says it the same way;
 *  - text: lease__hexval() for hex digits, lease__url_*() for URLs,
 *    lease__read_password_file() for ?password_file=;
 *  - limits: a value is at most LEASE__VALUE_MAX bytes (checked by the
 *    core before a slot runs; a store only sizes its answer limits by it);
 *  - range checks of what a server answers, below: a store never trusts
 *    a number it reads back.
 */
#ifndef LEASE_STORE_INT_H
#define LEASE_STORE_INT_H

#include "lease_int.h"

/* A ttl or a time left, in ms, read back from a store: at most this, so
 * that the core's arithmetic in nanoseconds stays within int64. */
#define LEASE__MS_MAX ((uint64_t)INT64_MAX / 1000000)

/* A token or a fencing mark read back from a store: 1 .. LEASE__TOKEN_MAX
 * (2^63-1, PostgreSQL's bigint and SQLite's integer). */
static inline int lease__token_ok(uint64_t v)
{
    return v >= 1 && v <= LEASE__TOKEN_MAX;
}

#endif
