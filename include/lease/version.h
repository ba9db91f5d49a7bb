/*
 * lease/version.h - the version of the headers, and of the library at run
 * time. CMake reads the version of the project from the three numbers here.
 */
#ifndef LEASE_VERSION_H
#define LEASE_VERSION_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LEASE_VERSION_MAJOR 0
#define LEASE_VERSION_MINOR 1
#define LEASE_VERSION_PATCH 0
#define LEASE_VERSION_STRING "0.1.0"

/*
 * The version of the library linked at run time ("0.1.0"), which may be
 * newer than the LEASE_VERSION_STRING an application was compiled with.
 */
const char *lease_version(void);

/*
 * The name of the i-th store built into this library, in a fixed order
 * ("sqlite" first, then those of "postgres", "redis", "etcd" that were found
 * when it was built), or NULL past the last: for i = 0; name != NULL; i++.
 */
const char *lease_store_builtin(size_t i);

/*
 * The client library a built-in store talks through, as linked at run time:
 * "SQLite 3.40.1", "libpq 15.8", "hiredis 0.14.1",
 * "libcurl 7.88.1, jansson 2.14". Writes at most `size` bytes including the
 * NUL. 0, LEASE_EINVALID for a NULL or too small buffer, LEASE_ENOTFOUND if
 * `store` is not a store of this build.
 */
int lease_store_client_version(char *buf, size_t size, const char *store);

#ifdef __cplusplus
}
#endif
#endif
