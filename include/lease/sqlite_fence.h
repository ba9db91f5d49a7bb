/*
 * lease/sqlite_fence.h - the fencing check inside a SQLite resource.
 *
 * Adds the SQL function lease_fence(resource, token) to a connection. It
 * keeps, in the table
 *
 *     lease_fence(resource TEXT PRIMARY KEY,
 *                 mark INTEGER NOT NULL CHECK (mark > 0))
 *
 * of the connection's main database (created on first use), the greatest
 * token each resource has accepted. A call with token >= the mark raises the
 * mark to token and returns it (equality is accepted: several writes of one
 * lease generation); a call with a smaller token fails the statement with
 * "stale fencing token: token T < mark M" and changes nothing. resource is
 * TEXT of 1 to 1024 bytes and token an INTEGER >= 1; anything else (NULL,
 * a REAL, a string of digits) fails the statement with a message that says
 * which.
 *
 * Call it in the transaction of the write it guards, which must be
 * BEGIN IMMEDIATE so that no other connection writes between the check and
 * the commit:
 *
 *     BEGIN IMMEDIATE;
 *     SELECT lease_fence('orders/eu', ?1);    -- fails: ROLLBACK
 *     UPDATE orders SET ... ;
 *     COMMIT;
 *
 * The function is registered SQLITE_DIRECTONLY: triggers and views, which a
 * database file may carry, cannot call it.
 *
 * Two ways to get it:
 *
 *  - The loadable extension liblease_sqlite_fence.so, installed in the
 *    library directory: `.load liblease_sqlite_fence` in the sqlite3 shell,
 *    or sqlite3_load_extension(db, "liblease_sqlite_fence", NULL, &err)
 *    after sqlite3_enable_load_extension(db, 1). Its entry point is
 *    sqlite3_leasesqlitefence_init.
 *
 *  - Linked into the application: the static library
 *    liblease_sqlite_fence_static.a, with this header:
 *
 *        cc app.c -llease_sqlite_fence_static -lsqlite3
 *
 *    and lease_sqlite_fence_register(db) on each connection. Do not link
 *    the loadable extension instead: it calls SQLite only through the
 *    pointers SQLite hands it when it loads it.
 */
#ifndef LEASE_SQLITE_FENCE_H
#define LEASE_SQLITE_FENCE_H

#include <sqlite3.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Register lease_fence(resource, token) on db. Returns SQLITE_OK, or
 * SQLITE_MISUSE when db is NULL, or the error of sqlite3_create_function_v2.
 * The table is created by the function's first call, not here.
 */
int lease_sqlite_fence_register(sqlite3 *db);

#ifdef __cplusplus
}
#endif
#endif
