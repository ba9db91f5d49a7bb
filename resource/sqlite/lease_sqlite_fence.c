/*
 * lease_sqlite_fence.c - lease_fence(resource, token): the fencing check
 * inside a SQLite resource (include/lease/sqlite_fence.h says how to use it).
 *
 * One source, built twice: as the loadable extension liblease_sqlite_fence.so,
 * which reaches SQLite only through the routines SQLite passes to its entry
 * point, and with SQLITE_CORE defined into liblease_sqlite_fence_static.a,
 * which calls the linked libsqlite3 directly. sqlite3ext.h makes the same
 * calls mean one or the other.
 */
#include <sqlite3ext.h>
SQLITE_EXTENSION_INIT1

#include <stddef.h>
#include <string.h>

#include "lease/sqlite_fence.h"

/* Longer names are refused rather than stored: the same bound as the
 * PostgreSQL kit, so one naming scheme fits both. */
#define FENCE_RESOURCE_MAX 1024

/* Schema-qualified, so that a temp table of the same name cannot stand in
 * for the real one. */
static const char fence_create_sql[] =
    "CREATE TABLE IF NOT EXISTS main.lease_fence ("
    " resource TEXT PRIMARY KEY,"
    " mark INTEGER NOT NULL CHECK (mark > 0))";
static const char fence_read_sql[] =
    "SELECT mark FROM main.lease_fence WHERE resource = ?1";
static const char fence_write_sql[] =
    "INSERT INTO main.lease_fence (resource, mark) VALUES (?1, ?2)"
    " ON CONFLICT (resource) DO UPDATE SET mark = excluded.mark";

/* The arguments, checked. NULL and a message on bad input. */
static const char *fence_args(sqlite3_value **argv, const unsigned char **resource,
                              int *resource_len, sqlite3_int64 *token)
{
    if (sqlite3_value_type(argv[0]) != SQLITE_TEXT)
        return "lease_fence: resource must be TEXT (not NULL, a number or a blob)";
    *resource = sqlite3_value_text(argv[0]);
    *resource_len = sqlite3_value_bytes(argv[0]);
    if (*resource == NULL || *resource_len < 1 || *resource_len > FENCE_RESOURCE_MAX)
        return "lease_fence: resource must be 1 to 1024 bytes long";
    /* A NUL inside would make two names look alike to C callers (and
     * PostgreSQL's text cannot hold one): refused, as in the PostgreSQL kit. */
    if (memchr(*resource, '\0', (size_t)*resource_len) != NULL)
        return "lease_fence: resource must not contain a NUL byte";
    /* A REAL or a string of digits is refused rather than converted: a
     * token that is not exactly the integer the lease gave is a bug in
     * the caller, and a silent rounding could let a stale write through. */
    if (sqlite3_value_type(argv[1]) != SQLITE_INTEGER)
        return "lease_fence: token must be an INTEGER (not NULL, text, a REAL or a blob)";
    *token = sqlite3_value_int64(argv[1]);
    if (*token <= 0)
        return "lease_fence: token must be a positive integer";
    return NULL;
}

/*
 * The current mark of resource into *mark (0 if the resource has none).
 * SQLITE_OK, SQLITE_CORRUPT when the stored mark is not a positive integer
 * (a table changed by hand: refusing is safer than guessing), or the error.
 */
static int fence_read(sqlite3 *db, const unsigned char *resource, int len,
                      sqlite3_int64 *mark)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, fence_read_sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    rc = sqlite3_bind_text(st, 1, (const char *)resource, len, SQLITE_TRANSIENT);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    *mark = 0;
    if (rc == SQLITE_ROW) {
        if (sqlite3_column_type(st, 0) != SQLITE_INTEGER || sqlite3_column_int64(st, 0) <= 0)
            rc = SQLITE_CORRUPT;
        else {
            *mark = sqlite3_column_int64(st, 0);
            rc = SQLITE_OK;
        }
    } else if (rc == SQLITE_DONE) {
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    return rc;
}

static int fence_write(sqlite3 *db, const unsigned char *resource, int len,
                       sqlite3_int64 token)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, fence_write_sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    rc = sqlite3_bind_text(st, 1, (const char *)resource, len, SQLITE_TRANSIENT);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_int64(st, 2, token);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Fail the calling statement with db's message, or a fixed one. */
static void fence_fail(sqlite3_context *ctx, sqlite3 *db, int rc, const char *what)
{
    char *msg;

    if (rc == SQLITE_CORRUPT) {
        sqlite3_result_error(ctx, "lease_fence: a mark in the lease_fence table is not "
                             "a positive integer", -1);
        sqlite3_result_error_code(ctx, SQLITE_CORRUPT);
        return;
    }
    msg = sqlite3_mprintf("lease_fence: %s: %s", what, sqlite3_errmsg(db));
    if (msg == NULL) {
        sqlite3_result_error_nomem(ctx);
        return;
    }
    sqlite3_result_error(ctx, msg, -1);
    sqlite3_free(msg);
    /* BUSY and LOCKED stay what they are, so that the caller can retry. */
    sqlite3_result_error_code(ctx, rc);
}

static void fence_func(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    sqlite3 *db = sqlite3_context_db_handle(ctx);
    const unsigned char *resource = NULL;
    int len = 0, rc;
    sqlite3_int64 token = 0, mark = 0;
    const char *bad;

    if (argc != 2) { /* registered with 2: cannot happen */
        sqlite3_result_error(ctx, "lease_fence: takes (resource, token)", -1);
        return;
    }
    bad = fence_args(argv, &resource, &len, &token);
    if (bad != NULL) {
        sqlite3_result_error(ctx, bad, -1);
        return;
    }
    /* IF NOT EXISTS: after the first call this only reads the schema. */
    rc = sqlite3_exec(db, fence_create_sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        fence_fail(ctx, db, rc, "cannot create the lease_fence table");
        return;
    }
    rc = fence_read(db, resource, len, &mark);
    if (rc != SQLITE_OK) {
        fence_fail(ctx, db, rc, "cannot read the mark");
        return;
    }
    if (token < mark) {
        char *msg = sqlite3_mprintf("stale fencing token: token %lld < mark %lld",
                                    (long long)token, (long long)mark);
        if (msg == NULL) {
            sqlite3_result_error_nomem(ctx);
            return;
        }
        sqlite3_result_error(ctx, msg, -1);
        sqlite3_free(msg);
        return;
    }
    if (token > mark) {
        rc = fence_write(db, resource, len, token);
        if (rc != SQLITE_OK) {
            fence_fail(ctx, db, rc, "cannot advance the mark");
            return;
        }
    }
    sqlite3_result_int64(ctx, token);
}

int lease_sqlite_fence_register(sqlite3 *db)
{
    if (db == NULL)
        return SQLITE_MISUSE;
    /* Not DETERMINISTIC: it writes. DIRECTONLY: a trigger or a view in a
     * database file must not be able to move the marks. */
    return sqlite3_create_function_v2(db, "lease_fence", 2,
                                      SQLITE_UTF8 | SQLITE_DIRECTONLY, NULL,
                                      fence_func, NULL, NULL, NULL);
}

/* The entry point SQLite derives from the file name liblease_sqlite_fence:
 * the one symbol the module exports (it is built with hidden visibility). */
#if defined(__GNUC__)
#define FENCE_EXPORT __attribute__((visibility("default")))
#else
#define FENCE_EXPORT
#endif
FENCE_EXPORT int sqlite3_leasesqlitefence_init(sqlite3 *db, char **errmsg,
                                               const sqlite3_api_routines *api);
FENCE_EXPORT int sqlite3_leasesqlitefence_init(sqlite3 *db, char **errmsg,
                                  const sqlite3_api_routines *api)
{
    int rc;

    SQLITE_EXTENSION_INIT2(api);
    rc = lease_sqlite_fence_register(db);
    if (rc != SQLITE_OK && errmsg != NULL)
        *errmsg = sqlite3_mprintf("lease_fence: cannot register the function: %s",
                                  sqlite3_errstr(rc));
    return rc;
}
