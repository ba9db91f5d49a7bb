/*
 * store_module.c - the one export of a store module of liblease.so
 * (liblease-store-postgres.so and the others, CMakeLists.txt): compiled once
 * per module beside the store's own file, with LEASE_MODULE_NAME ("postgres"),
 * LEASE_MODULE_BACKEND (lease__pg_backend) and LEASE_MODULE_CLIENT_VERSION
 * (lease__pg_client_version) defined. core/store.c dlopens the module on the
 * first use of one of its schemes, finds this function by name and checks
 * what it returns: the ABI, the liblease version the module was built with,
 * and the backend table (lease__backend_check, as for any store).
 *
 * The store's code calls the core's lease__ helpers in liblease.so (error,
 * log, metrics, secrets, URL parsing), exported to modules under the private
 * version node LEASE_PRIVATE: a module holds no copy of the core, so the
 * per-thread error, the log and metrics sinks and the secrets registry are
 * the application's one set.
 */
#include "lease_int.h"

#if !defined(LEASE_MODULE_NAME) || !defined(LEASE_MODULE_BACKEND) || \
    !defined(LEASE_MODULE_CLIENT_VERSION)
#error "store_module.c needs LEASE_MODULE_NAME, _BACKEND and _CLIENT_VERSION"
#endif

extern const lease_backend LEASE_MODULE_BACKEND;
int LEASE_MODULE_CLIENT_VERSION(char *buf, size_t size);

__attribute__((visibility("default")))
const lease__store_module *lease__store_module_entry(void)
{
    static const lease__store_module module = {
        LEASE__MODULE_ABI, LEASE_VERSION_STRING, LEASE_MODULE_NAME,
        &LEASE_MODULE_BACKEND, LEASE_MODULE_CLIENT_VERSION
    };

    return &module;
}
