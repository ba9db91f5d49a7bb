/*
 * app.c - the program the install tests build against an installed
 * liblease (pkg-config, CMake, static): open the store named by argv[1],
 * acquire a key, check the fencing token, release, and print
 *
 *   liblease VERSION (headers VERSION)
 *   token N
 *
 * Exit 0 only if every step worked.
 */
#include <inttypes.h>
#include <stdio.h>

#include <lease.h>

int main(int argc, char **argv)
{
    lease_acquire_opts opts = LEASE_ACQUIRE_OPTS_INIT;
    char owner[LEASE_OWNER_BUFSZ];
    lease_store *store;
    lease_grant grant;
    int rc;

    if (argc != 2) {
        fprintf(stderr, "usage: %s STORE_URL\n", argv[0]);
        return 2;
    }
    if (lease_store_open(&store, argv[1]) < 0) {
        fprintf(stderr, "open: %s\n", lease_errmsg());
        return 1;
    }
    if (lease_owner_new(owner) < 0) {
        fprintf(stderr, "owner: %s\n", lease_errmsg());
        lease_store_close(store);
        return 1;
    }
    opts.owner = owner;
    opts.ttl_ms = 30000;
    opts.label = "install-test";
    if ((rc = lease_acquire(&grant, NULL, store, "install/consumer", &opts)) < 0) {
        fprintf(stderr, "acquire: %s: %s\n", lease_error_name(rc), lease_errmsg());
        lease_store_close(store);
        return 1;
    }
    if (grant.token < 1) {
        fprintf(stderr, "acquire gave token %" PRIu64 ", expected >= 1\n", grant.token);
        lease_store_close(store);
        return 1;
    }
    if ((rc = lease_release(store, &grant)) < 0) {
        fprintf(stderr, "release: %s: %s\n", lease_error_name(rc), lease_errmsg());
        lease_store_close(store);
        return 1;
    }
    lease_store_close(store);
    printf("liblease %s (headers %s)\ntoken %" PRIu64 "\n", lease_version(),
           LEASE_VERSION_STRING, grant.token);
    return 0;
}
