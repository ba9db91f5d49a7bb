/*
 * cmd_fence_kit.c - the resource-side fencing kits from the command line
 * (docs/fencing.md): `lease fence-sql postgres|sqlite` prints the SQL a
 * protected database needs, `lease fence-install [URL]` loads the Redis
 * Functions library into a Redis server through the library's Redis store
 * (lease_fence_install), so the tool links no Redis client of its own.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "escape.h"
#include "fence_sql.h" /* generated from resource/postgres/fence.sql, byte for byte */
#include "fence_text.h" /* generated from resource/redis/lease_fence.lua */

static const char usage_fence_sql[] =
    "usage: lease fence-sql postgres|sqlite\n"
    "\n"
    "Print the SQL of a resource-side fencing kit on stdout, for the database\n"
    "that holds the protected data: postgres prints fence.sql (the table\n"
    "lease_fence_mark and the function lease_fence_check), to pipe into psql\n"
    "as the owner of the schema it goes into (it refuses a lease_fence_mark it\n"
    "did not make, or a schema where other roles may create objects; run\n"
    "again over an older kit, it renames that kit's table lease_fence to\n"
    "lease_fence_mark, keeping its marks);\n"
    "sqlite prints the table that lease_fence() of the liblease_sqlite_fence\n"
    "extension keeps its marks in, and how to use it: the .load line names the\n"
    "extension by its path in this install.\n"
    "  lease fence-sql postgres | psql \"$APP_DB\" -v ON_ERROR_STOP=1\n"
    "exit: 0, or 2 if the kind is neither postgres nor sqlite\n";

static const char usage_fence_install[] =
    "usage: lease fence-install [URL] [--from FILE] [--json]\n"
    "\n"
    "Load the fencing library lease_fence (FCALL lease_fence_set, ...) into the\n"
    "Redis server at URL with FUNCTION LOAD REPLACE (Redis 7.0 or later).\n"
    "URL: redis://[user:password@]host:port[/db][?password_file=PATH], the lease\n"
    "store's URL forms; default: the store URL (--store, --store-file or\n"
    "$LEASE_STORE) when it is a redis:// one. A password in URL is hidden from\n"
    "ps once parsed.\n"
    "  --from FILE    load FILE instead of the copy built into lease\n"
    "  --json         print {installed, library}\n"
    "exit: 0 installed, 1 other failure (or no Redis store in this build),\n"
    "2 usage, 6 the server failed or refused\n";

/* The table lease_fence() creates on its first call (resource/sqlite/
 * lease_sqlite_fence.c), for a schema made ahead of time, and the how-to:
 * comments, so that the whole text loads in sqlite3 as it is. Between the
 * two halves, the .load line of the extension this install has. */
static const char fence_sql_sqlite_head[] =
    "-- The SQLite fencing kit: lease_fence(resource, token), from the loadable\n"
    "-- extension liblease_sqlite_fence (or lease_sqlite_fence_register() in C).\n"
    "-- It keeps the greatest token each resource has accepted (its mark) in\n"
    "-- this table of the main database, and creates the table on its first\n"
    "-- call if it is missing.\n"
    "--\n"
    "-- Use, in each connection that writes the protected data (here a sqlite3\n"
    "-- shell script; the .load line names the extension of this install):\n"
    "-- the check inside the protected write, which a stale token fails as a\n"
    "-- whole,\n"
    "--\n"
    "--     .bail on\n";

static const char fence_sql_sqlite_tail[] =
    "--     UPDATE ... WHERE ... AND lease_fence('resource', 42) > 0;\n"
    "--\n"
    "-- or, for several writes, the check first in their transaction:\n"
    "--\n"
    "--     BEGIN IMMEDIATE;\n"
    "--     SELECT lease_fence('resource', 42);   -- 42: the lease's token\n"
    "--     UPDATE ...;                           -- the protected writes\n"
    "--     COMMIT;\n"
    "--\n"
    "-- A token smaller than the mark fails its statement (\"stale fencing\n"
    "-- token\"). .bail on stops the script at that error, before any later\n"
    "-- write or COMMIT runs, so the open transaction is never committed:\n"
    "-- without it the shell goes on to the next line. See docs/fencing.md.\n";

static const char fence_sql_sqlite_table[] =
    "CREATE TABLE IF NOT EXISTS main.lease_fence (\n"
    "    resource TEXT PRIMARY KEY,\n"
    "    mark INTEGER NOT NULL CHECK (mark > 0)\n"
    ");\n";

/* s as one argument of a sqlite3 shell dot-command: bare when the shell
 * would take it as it is, else in double quotes, in which the shell reads
 * \", \\ and octal \NNN escapes (a space would split a bare argument). */
static void put_dot_arg(FILE *out, const char *s)
{
    const unsigned char *p;

    if (s[0] != '\0' && s[strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                    "0123456789/._+-")] == '\0') {
        fputs(s, out);
        return;
    }
    fputc('"', out);
    for (p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p < 0x20 || *p >= 0x7f) /* the line stays one comment line */
            fprintf(out, "\\%03o", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}

/* The .load line: the extension beside liblease.so, where the install puts
 * both, by its path (the loader's search path may not hold that directory),
 * without the suffix, which .load adds. 1 if the extension is there, 0 if
 * not, -1 if liblease's directory is unknown (the bare name, then). */
static int put_sqlite_load(FILE *out)
{
    char dir[PATH_MAX], path[PATH_MAX + 64];
    struct stat st;

    fputs("--     .load ", out);
    if (cli_lib_dir(dir, sizeof(dir)) < 0) {
        fputs("liblease_sqlite_fence\n", out);
        return -1;
    }
    snprintf(path, sizeof(path), "%s/liblease_sqlite_fence", dir);
    put_dot_arg(out, path);
    fputc('\n', out);
    strcat(path, ".so");
    return stat(path, &st) == 0;
}

int cmd_fence_sql(cli_globals *g, cli_args *a)
{
    const char *kind = NULL;
    int rc = 0;

    for (a->i = 0; a->i < a->argc; a->i++) {
        const char *arg = a->argv[a->i];

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(usage_fence_sql, stdout);
            return EXIT_OK;
        }
        /* Accepted as after every command, though no store is opened. */
        if (cli_parse_global(g, a, arg, &rc)) {
            if (rc)
                return rc;
            continue;
        }
        if ((rc = cli_positional(a, arg, &kind, NULL)))
            return rc;
    }
    if (kind == NULL)
        return cli_usage(a->cmd, "missing the kind: postgres or sqlite");
    if (strcmp(kind, "postgres") == 0) {
        /* fwrite, not fputs: the file's bytes exactly, its length known. */
        fwrite(lease_fence_sql_postgres, 1, sizeof(lease_fence_sql_postgres), stdout);
    } else if (strcmp(kind, "sqlite") == 0) {
        int found;

        fputs(fence_sql_sqlite_head, stdout);
        found = put_sqlite_load(stdout);
        fputs(fence_sql_sqlite_tail, stdout);
        if (found == 0)
            fputs("-- No liblease_sqlite_fence.so is at the path of .load: this install\n"
                  "-- left the extension out.\n",
                  stdout);
        else if (found < 0)
            fputs("-- lease cannot tell the directory of its liblease: .load by the bare\n"
                  "-- name finds the extension only on the loader's search path.\n",
                  stdout);
        fputs(fence_sql_sqlite_table, stdout);
    } else {
        return cli_usage(a->cmd, "unknown kind '%s': postgres or sqlite", kind);
    }
    /* A pipe into psql that closed early must not pass for success. */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "lease fence-sql: cannot write the SQL: %s\n", strerror(errno));
        return EXIT_FAIL;
    }
    return EXIT_OK;
}

/* Redis is the store with a kit to install; PostgreSQL's is SQL that
 * `lease fence-sql postgres` prints for psql, since opening a lease store
 * on the application's database would create the lease tables there. */
static int is_redis_url(const char *url)
{
    return url != NULL && (strncasecmp(url, "redis://", 8) == 0 ||
                           strncasecmp(url, "rediss://", 9) == 0);
}

static int no_memory(void)
{
    fputs("lease fence-install: out of memory\n", stderr);
    return EXIT_FAIL;
}

typedef struct {
    char *url;        /* a copy: argv's bytes are redacted */
    const char *from; /* --from FILE, or NULL: the built-in copy */
} fence_install_opts;

/* The URL argument (at most one), hidden from ps once copied. */
static int fence_install_url(cli_args *a, fence_install_opts *o, char *arg)
{
    /* A second URL is refused without being quoted: it may hold a
     * password too, hidden here before anything can print it. */
    if (o->url != NULL) {
        cli_hide_url_secrets(arg);
        return cli_usage(a->cmd, "takes one URL");
    }
    if ((o->url = strdup(arg)) == NULL)
        return no_memory();
    cli_hide_url_secrets(arg);
    return 0;
}

static int fence_install_parse(cli_globals *g, cli_args *a, fence_install_opts *o)
{
    int rc = 0;

    for (a->i = 0; a->i < a->argc; a->i++) {
        char *arg = a->argv[a->i];

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(usage_fence_install, stdout);
            return -1;
        }
        if (cli_parse_global(g, a, arg, &rc)) {
            if (rc)
                return rc;
            continue;
        }
        if (cli_flag_is(arg, "--from")) {
            if ((o->from = cli_value(a, arg, &rc)) == NULL)
                return rc;
            if (*o->from == '\0')
                return cli_usage(a->cmd, "--from needs a file name");
            continue;
        }
        if (arg[0] == '-' && arg[1] != '\0')
            return cli_usage(a->cmd, "unknown option '%s'", arg);
        if ((rc = fence_install_url(a, o, arg)))
            return rc;
    }
    if (o->url == NULL && is_redis_url(g->store_url) &&
        (o->url = strdup(g->store_url)) == NULL)
        return no_memory();
    if (o->url == NULL)
        return cli_usage(a->cmd, "no redis URL: give one, or a redis:// --store");
    if (strncasecmp(o->url, "rediss://", 9) == 0)
        return cli_usage(a->cmd, "rediss:// (TLS) is not supported by the Redis store");
    /* Not quoted: a URL of another store may carry a password too. */
    if (!is_redis_url(o->url))
        return cli_usage(a->cmd, "not a redis:// URL (PostgreSQL and SQLite: see "
                         "`lease fence-sql`)");
    return 0;
}

/* The library's text: the file given (1 byte .. LEASE_KIT_MAX), or the
 * copy built into the tool. 0, or the exit code. */
static int kit_text(char **out, size_t *len, const char *path)
{
    struct stat st;
    int fd;

    if (path == NULL) {
        if ((*out = strdup(LEASE_RESOURCE_LEASE_FENCE)) == NULL)
            return no_memory();
        *len = strlen(*out);
        return 0;
    }
    /* Non-blocking: a FIFO given by mistake must not hang the open. */
    if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) < 0) {
        fprintf(stderr, "lease fence-install: %s: %s\n", path, strerror(errno));
        return EXIT_USAGE;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size == 0 ||
        st.st_size > (off_t)LEASE_KIT_MAX) {
        close(fd);
        fprintf(stderr, "lease fence-install: %s: not a regular file of 1 byte .. 1 MiB\n",
                path);
        return EXIT_USAGE;
    }
    if ((*out = malloc((size_t)st.st_size + 1)) == NULL) {
        close(fd);
        return no_memory();
    }
    /* Bounded: each pass reads at least one byte or ends. */
    for (*len = 0; *len < (size_t)st.st_size;) {
        ssize_t n = read(fd, *out + *len, (size_t)st.st_size - *len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        *len += (size_t)n;
    }
    close(fd);
    (*out)[*len] = '\0';
    /* A file that shrank or failed under us: never install a prefix. */
    if (*len != (size_t)st.st_size) {
        fprintf(stderr, "lease fence-install: %s: read %zu of %lld bytes\n", path, *len,
                (long long)st.st_size);
        free(*out);
        *out = NULL;
        return EXIT_FAIL;
    }
    return 0;
}

/* The URL copy may hold a password: wiped before it is freed. */
static void url_copy_free(char *url)
{
    if (url != NULL) {
        memset(url, 0, strlen(url));
        free(url);
    }
}

/* Opens the store at url through the library (its URL forms, password
 * files, TLS and timeouts) and installs the kit over that connection. */
static int fence_install_run(const cli_globals *g, const char *url, const char *kit,
                             size_t len)
{
    cli_globals at = *g;
    lease_store *s;
    int rc;

    at.store_url = url;
    if ((rc = cli_open_store(&s, &at)))
        return rc;
    if ((rc = lease_fence_install(s, kit, len)) < 0) {
        rc = cli_fail(rc, "fence-install");
    } else if (g->json) {
        cli_print_json(json_pack("{s:b, s:s}", "installed", 1, "library", "lease_fence"));
        rc = EXIT_OK;
    } else {
        /* Never the URL as given: the library's copy is without password. */
        fputs("installed lease_fence into ", stdout);
        cli_put_text(stdout, lease_store_url_redacted(s));
        putchar('\n');
        rc = EXIT_OK;
    }
    lease_store_close(s);
    return rc;
}

/* Is the Redis store in this build (built in, or a module)? */
static int has_redis_store(void)
{
    const char *name;
    size_t i;

    for (i = 0; (name = lease_store_builtin(i)) != NULL; i++)
        if (strcmp(name, "redis") == 0)
            return 1;
    return 0;
}

int cmd_fence_install(cli_globals *g, cli_args *a)
{
    fence_install_opts o = { NULL, NULL };
    char *kit = NULL;
    size_t len = 0;
    int rc = fence_install_parse(g, a, &o);

    if (rc == 0 && !has_redis_store()) {
        fputs("lease fence-install: this lease was built without Redis support\n", stderr);
        rc = EXIT_FAIL;
    }
    if (rc == 0 && (rc = kit_text(&kit, &len, o.from)) == 0)
        rc = fence_install_run(g, o.url, kit, len);
    free(kit);
    url_copy_free(o.url);
    return rc < 0 ? EXIT_OK : rc;
}
