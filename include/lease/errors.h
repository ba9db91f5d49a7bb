/*
 * lease/errors.h - error codes, their names and messages, and the
 * per-thread message of the last error.
 *
 * Every function of liblease that can fail returns 0 on success or one of
 * the negative codes below. The codes, their names ("EBUSY") and their short
 * messages come from the single table LEASE_ERROR_MAP, so they cannot drift
 * apart.
 *
 * Thread safety: the "last error" is kept per thread. A failing call sets
 * it; a succeeding call leaves it as it was. Read it right after the call
 * that failed, on the same thread.
 */
#ifndef LEASE_ERRORS_H
#define LEASE_ERRORS_H

#ifdef __cplusplus
extern "C" {
#endif

/* XX(name, value, message). Values are stable: they are part of the ABI. */
#define LEASE_ERROR_MAP(XX)                                                   \
    XX(EINVALID, -1, "invalid argument")                                      \
    XX(EBUSY, -2, "lease is held by another owner")                           \
    XX(ELOST, -3, "not the holder of the lease any more")                     \
    XX(ESTALE, -4, "stale fencing token: an older generation was rejected")   \
    XX(ETIMEOUT, -5, "timed out")                                             \
    XX(ESTORE, -6, "store failed or unreachable: ownership is uncertain")     \
    XX(ENOTFOUND, -7, "not found")                                            \
    XX(ENOMEM, -8, "out of memory")                                           \
    XX(EUNSUPPORTED, -9, "not supported by this store")

typedef enum lease_error_code {
    LEASE_OK = 0,
#define LEASE_ERROR_ENUM_(name, value, msg) LEASE_##name = value,
    LEASE_ERROR_MAP(LEASE_ERROR_ENUM_)
#undef LEASE_ERROR_ENUM_
    LEASE_ERROR_MIN_ = -9
} lease_error_code;

/* "EBUSY" for LEASE_EBUSY, "OK" for 0, "EUNKNOWN" for anything else. */
const char *lease_error_name(int code);

/* The table's short message for a code ("lease is held by another owner"). */
const char *lease_strerror(int code);

/*
 * The detailed message of the last failure on this thread, e.g.
 * "acquire 'jobs/nightly': held by worker-2 (owner 6f1c...), 12034 ms left".
 * Never NULL: "" when no error was recorded. The string belongs to the
 * library and stays valid until the next failing call on this thread.
 * It never contains a password from a store URL.
 */
const char *lease_errmsg(void);

/* The code of the last failure on this thread (0 if none). */
int lease_errcode(void);

/* Forget the last error of this thread. */
void lease_error_clear(void);

#ifdef __cplusplus
}
#endif
#endif
