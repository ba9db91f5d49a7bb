/*
 * version.c - `lease --version`: what a bug report needs. The tool's and
 * the library's versions (they differ when an older liblease.so is found
 * at run time), the stores this build has and the client library each
 * talks through, as linked at run time.
 *
 *   lease 0.1.0 (liblease 0.1.0)
 *   stores: sqlite, postgres, redis, etcd
 *   sqlite: SQLite 3.40.1
 *   ...
 *   agent: libmicrohttpd 0.9.75
 *
 * The "stores:" line is read by the shell completion; keep its form.
 */
#include <microhttpd.h>

#include "cli.h"

int cli_print_version(FILE *out)
{
    char client[128];
    const char *name;
    size_t i;

    fprintf(out, "lease %s (liblease %s)\nstores:", LEASE_VERSION_STRING,
            lease_version());
    for (i = 0; (name = lease_store_builtin(i)) != NULL; i++)
        fprintf(out, "%s %s", i ? "," : "", name);
    fputc('\n', out);
    for (i = 0; (name = lease_store_builtin(i)) != NULL; i++)
        if (lease_store_client_version(client, sizeof(client), name) == 0)
            fprintf(out, "%s: %s\n", name, client);
    fprintf(out, "agent: libmicrohttpd %s\n", MHD_get_version());
    return fflush(out) == 0 ? EXIT_OK : EXIT_FAIL;
}
