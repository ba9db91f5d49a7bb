/*
 * lease/store.h - opening a store by URL, and the clocks.
 *
 * A store is chosen by the scheme of its URL:
 *   sqlite:relative/path.db      embedded SQLite store (the default)
 *   sqlite:///absolute/path.db
 *   (postgres://, redis://, etcd://, kubernetes:// as their stores are
 *   built in)
 *
 * Threading: a lease_store is one connection. It may move between threads
 * but must not be used by two threads at once; open one per thread. The
 * library's globals (the backend table) are read-only after start-up.
 */
#ifndef LEASE_STORE_H
#define LEASE_STORE_H

#include "types.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Open a store. On success *out is a new handle that the caller closes with
 * lease_store_close(). On failure *out is NULL and the code is:
 *   LEASE_EINVALID  malformed URL or unknown scheme
 *   LEASE_ESTORE    the store could not be opened or reached
 * The URL may hold a password; it never appears in any message.
 */
int lease_store_open(lease_store **out, const char *url);

/*
 * As lease_store_open(), with every wait of the opening (connecting,
 * creating the schema, waiting for a lock) and then every call bounded by
 * timeout_ms instead of the default 5000 ms.
 */
int lease_store_open_timeout(lease_store **out, const char *url,
                             uint64_t timeout_ms);

/* Close a store and free it. NULL is allowed. */
void lease_store_close(lease_store *store);

/* The store's scheme ("sqlite"). Owned by the store. */
const char *lease_store_scheme(const lease_store *store);

/* The store's URL with any password replaced by "***". Owned by the store. */
const char *lease_store_url_redacted(const lease_store *store);

/*
 * Bound every store call of this handle to `timeout_ms` (default 5000 ms):
 * a call that cannot finish in time fails with LEASE_ESTORE or
 * LEASE_ETIMEOUT, never blocks longer. 0 is EINVALID.
 */
int lease_store_set_timeout(lease_store *store, uint64_t timeout_ms);

/* Raise or lower the largest ttl this handle accepts (default 24 h). */
int lease_store_set_ttl_max(lease_store *store, uint64_t ttl_max_ms);

/*
 * The store URL an application should use when none was given: the
 * environment variable LEASE_STORE if set and not empty, otherwise
 * "sqlite:///$XDG_STATE_HOME/lease/lease.db" (XDG_STATE_HOME defaults to
 * ~/.local/state). Writes at most `size` bytes including the NUL; returns 0,
 * LEASE_EINVALID if buf/size are unusable or the result does not fit, or
 * LEASE_ENOTFOUND when neither LEASE_STORE, XDG_STATE_HOME nor HOME is set.
 * It creates no directory.
 */
int lease_default_store_url(char *buf, size_t size);

/*
 * The clock of local deadlines, in nanoseconds: CLOCK_BOOTTIME, which a
 * wall-clock step cannot move and which keeps counting while the machine is
 * suspended (a suspended holder must wake up with its authority expired).
 */
int64_t lease_clock_ns(void);

#ifdef __cplusplus
}
#endif
#endif
