/*
 * lease/fence.h - the resource side: fencing checks and guarded writes.
 *
 * A fencing token only protects a resource that checks it. The resource
 * keeps a high-water mark (the greatest token it has accepted) and rejects
 * every write that carries a smaller one.
 */
#ifndef LEASE_FENCE_H
#define LEASE_FENCE_H

#include "types.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The fencing check a protected resource runs on every write, and the call
 * that installs a new generation right after an acquisition.
 *
 * Accepts when token >= the resource's high-water mark, raising the mark to
 * token, atomically and durably; equality is accepted (several writes of one
 * generation). Otherwise LEASE_ESTALE and nothing changes. Either way *mark
 * (if not NULL) receives the mark after the call. `resource` follows the
 * rules of a key; its marks live apart from the leases. token must be >= 1.
 */
int lease_fence_advance(uint64_t *mark, lease_store *store,
                        const char *resource, uint64_t token);

/* Read a resource's mark without changing it. LEASE_ENOTFOUND if none. */
int lease_fence_mark(uint64_t *mark, lease_store *store, const char *resource);

/* The longest fencing kit lease_fence_install() takes. */
#define LEASE_KIT_MAX (1u << 20)

/*
 * Install a resource-side fencing kit (docs/fencing.md) into the server
 * behind `store`, through the handle's own connection and credentials.
 * Redis: `kit` is the text of lease_fence.lua, loaded with FUNCTION LOAD
 * REPLACE (Redis 7.0 or later; the library is the server's, for every
 * database on it). `kit` holds len bytes (1 .. LEASE_KIT_MAX, no NUL byte
 * among them). LEASE_EUNSUPPORTED on the other stores (PostgreSQL: pipe
 * `lease fence-sql postgres` into psql; SQLite: load the extension),
 * LEASE_ESTORE with the server's message when it refused, LEASE_EINVALID
 * for a bad argument. Installing twice is fine.
 */
int lease_fence_install(lease_store *store, const char *kit, size_t len);

/*
 * The text of a resource-side fencing kit, as built into this library, for
 * a program that installs the kit over a database connection of its own
 * (the Python package does; docs/fencing.md). kind "postgres":
 * resource/postgres/fence.sql byte for byte, what `lease fence-sql postgres`
 * prints: one script with its own BEGIN and COMMIT, to run as the owner of
 * the schema it goes into. *text receives static storage, NUL-terminated,
 * that the caller must not free or change; *len (if not NULL) its length
 * without the NUL. LEASE_EINVALID, *text NULL, when text or kind is NULL
 * or kind names no kit built in.
 */
int lease_fence_kit_text(const char **text, size_t *len, const char *kind);

/*
 * Guarded write into the store itself: put `value` (len bytes, may be 0)
 * under the data name `name` only if `grant` (key, owner, token) is still
 * the key's current, unexpired lease, checked in the same transaction or
 * script as the write. LEASE_ELOST, changing nothing, otherwise.
 * Data names follow the rules of a key and live apart from lease keys.
 */
int lease_guarded_put(lease_store *store, const lease_grant *grant,
                      const char *name, const void *value, size_t len);

/*
 * Read a value written by lease_guarded_put(). *value is a NUL-terminated
 * copy (the NUL is not counted in *len) that the caller frees with free().
 * *token (if not NULL) receives the generation that wrote it.
 * LEASE_ENOTFOUND if the name was never written.
 */
int lease_data_get(void **value, size_t *len, uint64_t *token,
                   lease_store *store, const char *name);

/*
 * The caller's own statements, run inside a transaction in which the lease
 * was validated and locked. `native` is the store's connection:
 *   sqlite    sqlite3 *
 * Return 0 to commit; any other value rolls back and is returned by
 * lease_guarded_txn(). Do not commit, roll back or close `native`, and keep
 * the work short: it holds the lease row locked, which delays takeover.
 */
typedef int (*lease_txn_cb)(void *native, void *payload);

/*
 * In one short transaction: lock and validate that `grant` is the key's
 * current, unexpired lease (exactly one row), run `cb`, commit.
 * LEASE_ELOST (cb not called) when the lease is missing, held by another
 * owner or token, or expired. LEASE_EUNSUPPORTED for stores without
 * transactions. LEASE_ESTORE if the commit failed: the writes are gone.
 * On a server (PostgreSQL) the whole call is bounded by the handle's
 * timeout: LEASE_ETIMEOUT, rolled back and nothing committed, when that
 * timeout passed before the commit could be sent (cb ran too long); a
 * commit sent and not answered in time is LEASE_ESTORE with a message that
 * says the outcome is unknown (the writes may have committed). SQLite
 * commits locally, whatever the time.
 */
int lease_guarded_txn(lease_store *store, const lease_grant *grant,
                      lease_txn_cb cb, void *payload);

/*
 * The stable mapping from a text key to an advisory lock's 64-bit key:
 * FNV-1a (64-bit) over the key's bytes, read as a two's-complement signed
 * number. Every participant that locks "tenant-42" locks the same number,
 * whatever its language: the algorithm is documented in docs/stores.md.
 */
int64_t lease_advisory_key(const char *key);

/*
 * Short database-only work under a transaction-level advisory lock
 * (PostgreSQL's pg_advisory_xact_lock, or pg_try_advisory_xact_lock when
 * try_only): begin, lock lease_advisory_key(key), run cb with the native
 * connection, commit (0) or roll back (anything else, which is returned).
 * The lock ends with the transaction, so a pooled connection never keeps it.
 * LEASE_EBUSY when try_only and another transaction holds the lock;
 * LEASE_ETIMEOUT when the lock was not granted within the handle's timeout,
 * or when that timeout passed before the commit (rolled back, as in
 * lease_guarded_txn()); LEASE_EUNSUPPORTED for stores without advisory
 * locks.
 */
int lease_advisory_txn(lease_store *store, const char *key, int try_only,
                       lease_txn_cb cb, void *payload);

/*
 * The fencing check inside a service that keeps its own state: the marks
 * live in the process (and, given a path, in a file of the service), not in
 * a lease store, so the check and the write it guards can share one lock.
 *
 * lease_fence_local_open: with path NULL the marks are in memory only (they
 * start over when the process does: only for state that does too). With a
 * path they are loaded from that file, and every advance is written to it
 * and fsync'ed before the check returns (a temp file renamed over it, then
 * the directory fsync'ed). The file is locked for the handle's life (flock
 * on "<path>.lock", made beside it at the first open, which also writes an
 * empty file of marks): LEASE_EBUSY if another handle or process has it.
 * A file that is cut short or altered, or missing while its lock file is
 * there (deleted, a volume not mounted), is LEASE_ESTORE, never an empty
 * set of marks. Free the handle with lease_fence_local_close().
 */
typedef struct lease_fence_local lease_fence_local;

int lease_fence_local_open(lease_fence_local **out, const char *path);

/*
 * Accept `token` for `resource` (the rules of a key) when it is at least
 * the resource's mark, raising the mark to it; equality is accepted. A
 * resource without a mark accepts any token. LEASE_ESTALE, changing
 * nothing, when token < mark. LEASE_ESTORE when the advance could not be
 * written: the write must not go ahead (the mark stays raised in memory,
 * and the next accepted check writes it again). *mark (if not NULL)
 * receives the mark after the call. token must be 1 .. 2^63-1. Safe from
 * any thread; checks of one handle are serialized.
 */
int lease_fence_local_check(uint64_t *mark, lease_fence_local *f,
                            const char *resource, uint64_t token);

/* Read a resource's mark. LEASE_ENOTFOUND if it has none. Any thread. */
int lease_fence_local_mark(uint64_t *mark, lease_fence_local *f,
                           const char *resource);

/* Close the handle and drop the file's lock. NULL is allowed. */
void lease_fence_local_close(lease_fence_local *f);

#ifdef __cplusplus
}
#endif
#endif
