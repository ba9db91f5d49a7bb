/*
 * version.c - `lease --version`: what a bug report needs. The tool's and
 * the library's versions (they differ when an older liblease.so is found
 * at run time), the stores this build has and the client library each
 * talks through, as linked at run time.
 *
 *   lease 0.1.0 (liblease 0.1.0)
 *   stores: sqlite, postgres, redis, etcd, kubernetes
 *   sqlite: SQLite 3.40.1
 *   postgres: module /usr/lib/x86_64-linux-gnu/lease/liblease-store-postgres.so (not loaded)
 *   ...
 *   agent: libmicrohttpd 0.9.75
 *
 * The "stores:" line is read by the shell completion; keep its form.
 *
 * liblease.so loads the PostgreSQL, Redis, etcd and Kubernetes stores from
 * modules on first use, so that a command on SQLite maps none of their client
 * libraries; asking a module its client library's version loads it. Plain
 * --version therefore names each module's file (and whether it is there)
 * and stays cheap; `lease --version --verbose` loads every module and
 * prints its client library as the SQLite line does. The agent's
 * libmicrohttpd likewise: `agent` is a module of the tool (main.c).
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef LEASE_CLI_AGENT_MODULE
#include <microhttpd.h>
#endif

#include "cli.h"
#include "escape.h"

/* version.c; to go in cli.h. */
int cli_module_path(char *buf, size_t size, const char *file);

/* The directory liblease.so was loaded from, resolved: the install puts
 * the tool's modules (under LEASE_CLI_MODULE_SUBDIR) and the SQLite fencing
 * extension beside it, wherever the prefix is (src/core/store.c finds its
 * own modules the same way). 0, or -1 if liblease's path is unknown or too
 * long. */
int cli_lib_dir(char *buf, size_t size)
{
    char dir[PATH_MAX], real[PATH_MAX];
    const char *slash;
    Dl_info info;
    int n;

    /* A string of liblease's own, not the function lease_version: in a
     * program built without PIE the function's address is the program's
     * PLT entry, and dladdr would name the program. */
    if (dladdr((const void *)lease_version(), &info) == 0 || info.dli_fname == NULL ||
        (slash = strrchr(info.dli_fname, '/')) == NULL ||
        (size_t)(slash - info.dli_fname) >= sizeof(dir))
        return -1;
    /* The loader's name may go through the run path ($ORIGIN/../lib). */
    memcpy(dir, info.dli_fname, (size_t)(slash - info.dli_fname));
    dir[slash - info.dli_fname] = '\0';
    n = snprintf(buf, size, "%s", realpath(dir, real) ? real : dir);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

/* A module of the tool or of liblease.so: <liblease's directory>/<subdir>/
 * <file>. 0, or -1 if liblease's path is unknown or too long. */
int cli_module_path(char *buf, size_t size, const char *file)
{
#ifdef LEASE_CLI_MODULE_SUBDIR
    char dir[PATH_MAX];
    int n;

    if (cli_lib_dir(dir, sizeof(dir)) < 0)
        return -1;
    n = snprintf(buf, size, "%s/%s/%s", dir, LEASE_CLI_MODULE_SUBDIR, file);
    return n < 0 || (size_t)n >= size ? -1 : 0;
#else
    (void)buf, (void)size, (void)file;
    return -1;
#endif
}

#ifdef LEASE_CLI_MODULE_SUBDIR
/* A module's line: "NAME: module PATH (not loaded)", or "(not installed)". */
static void print_module(FILE *out, const char *name, const char *file)
{
    char path[4096];
    struct stat st;

    fprintf(out, "%s: module ", name);
    if (cli_module_path(path, sizeof(path), file) < 0) {
        fprintf(out, "%s (liblease's directory unknown)\n", file);
        return;
    }
    cli_put_text(out, path);
    fprintf(out, " (%s)\n", stat(path, &st) == 0 ? "not loaded" : "not installed");
}
#endif

/* One store's line: its client library, or with modules and !clients, the
 * module that would be loaded for it. */
static void print_store(FILE *out, const char *name, int clients)
{
    char client[128];

#ifdef LEASE_CLI_MODULE_SUBDIR
    char file[64];

    if (!clients && strcmp(name, "sqlite") != 0) {
        snprintf(file, sizeof(file), "%s%s.so", LEASE_CLI_MODULE_PREFIX, name);
        print_module(out, name, file);
        return;
    }
#else
    (void)clients;
#endif
    if (lease_store_client_version(client, sizeof(client), name) == 0) {
        fprintf(out, "%s: %s\n", name, client);
        return;
    }
    fprintf(out, "%s: ", name);
    cli_put_text(out, lease_errmsg());
    fputc('\n', out);
}

/* The agent's HTTP library: with the agent a module, its file, or with
 * clients, the version of the libmicrohttpd that module loads. */
static void print_agent(FILE *out, int clients)
{
#ifdef LEASE_CLI_AGENT_MODULE
    const char *(*get_version)(void);
    char path[4096];
    void *h, *sym;

    if (!clients) {
        print_module(out, "agent", LEASE_CLI_AGENT_MODULE);
        return;
    }
    if (cli_module_path(path, sizeof(path), LEASE_CLI_AGENT_MODULE) < 0 ||
        (h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) == NULL ||
        (sym = dlsym(h, "MHD_get_version")) == NULL) {
        print_module(out, "agent", LEASE_CLI_AGENT_MODULE);
        return;
    }
    memcpy(&get_version, &sym, sizeof(get_version));
    fprintf(out, "agent: libmicrohttpd %s\n", get_version());
#else
    (void)clients;
    fprintf(out, "agent: libmicrohttpd %s\n", MHD_get_version());
#endif
}

/* clients: load every store module to print its client library (main.c:
 * --version --verbose). The prototype belongs in cli.h, with the other. */
int cli_print_version_clients(FILE *out, int clients);
int cli_print_version_clients(FILE *out, int clients)
{
    const char *name;
    size_t i;

    fprintf(out, "lease %s (liblease %s)\nstores:", LEASE_VERSION_STRING,
            lease_version());
    for (i = 0; (name = lease_store_builtin(i)) != NULL; i++)
        fprintf(out, "%s %s", i ? "," : "", name);
    fputc('\n', out);
    for (i = 0; (name = lease_store_builtin(i)) != NULL; i++)
        print_store(out, name, clients);
    print_agent(out, clients);
    return fflush(out) == 0 ? EXIT_OK : EXIT_FAIL;
}

int cli_print_version(FILE *out)
{
    return cli_print_version_clients(out, 0);
}
