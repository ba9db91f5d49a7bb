/*
 * sqlite_fence_test.c - lease_fence(resource, token) from C.
 *
 * usage: sqlite_fence_test DIR [EXTENSION]
 *
 * Runs against SQLite files in a new directory under DIR, with the function linked in
 * (liblease_sqlite_fence_static.a, lease_sqlite_fence_register) and, when
 * EXTENSION (the path of liblease_sqlite_fence.so) is given, loaded with
 * sqlite3_load_extension. Exits 1 if any check failed.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "lease/sqlite_fence.h"

static int failures;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            failures++;                                                        \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
        }                                                                      \
    } while (0)

static char dir[512];

/* A fresh database file in dir, opened, with the function registered. */
static sqlite3 *open_db(const char *name, int fresh)
{
    char path[700];
    sqlite3 *db = NULL;

    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (fresh) {
        unlink(path);
    }
    if (sqlite3_open(path, &db) != SQLITE_OK) {
        fprintf(stderr, "FATAL: cannot open %s\n", path);
        exit(1);
    }
    CHECK(lease_sqlite_fence_register(db) == SQLITE_OK, "register: %s", sqlite3_errmsg(db));
    return db;
}

/*
 * SELECT lease_fence(?1, ?2) with the given binders' values; the result
 * (or -1) in *out, the error message (or "") in msg. Returns the step's
 * code: SQLITE_ROW on success.
 */
static int fence(sqlite3 *db, sqlite3_int64 *out, char *msg, size_t msgsz,
                 const char *sql_args, ...)
{
    char sql[256];
    sqlite3_stmt *st = NULL;
    int rc;
    va_list ap;

    snprintf(sql, sizeof sql, "SELECT lease_fence(%s)", sql_args);
    *out = -1;
    msg[0] = '\0';
    rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) {
        snprintf(msg, msgsz, "%s", sqlite3_errmsg(db));
        return rc;
    }
    va_start(ap, sql_args);
    for (int i = 1; i <= sqlite3_bind_parameter_count(st); i++) {
        int kind = va_arg(ap, int);
        if (kind == 't') {
            const char *s = va_arg(ap, const char *);
            int n = va_arg(ap, int);
            sqlite3_bind_text(st, i, s, n, SQLITE_TRANSIENT);
        } else {
            sqlite3_bind_int64(st, i, va_arg(ap, sqlite3_int64));
        }
    }
    va_end(ap);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *out = sqlite3_column_int64(st, 0);
    else
        snprintf(msg, msgsz, "%s", sqlite3_errmsg(db));
    sqlite3_finalize(st);
    return rc;
}

static sqlite3_int64 mark_of(sqlite3 *db, const char *resource)
{
    sqlite3_stmt *st = NULL;
    sqlite3_int64 m = -1;

    if (sqlite3_prepare_v2(db, "SELECT mark FROM lease_fence WHERE resource = ?1", -1, &st,
                           NULL) != SQLITE_OK)
        return -2;
    sqlite3_bind_text(st, 1, resource, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW)
        m = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return m;
}

static int exec(sqlite3 *db, const char *sql)
{
    return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

/* Accept, accept equal, advance, refuse older, in a table made on first use. */
static void test_marks(sqlite3 *db)
{
    sqlite3_int64 r;
    char msg[256];

    CHECK(lease_sqlite_fence_register(NULL) == SQLITE_MISUSE, "register(NULL)");
    CHECK(fence(db, &r, msg, sizeof msg, "'res/a', 5") == SQLITE_ROW && r == 5,
          "first token accepted: %s", msg);
    CHECK(mark_of(db, "res/a") == 5, "the table was made and holds the mark");
    CHECK(fence(db, &r, msg, sizeof msg, "'res/a', 5") == SQLITE_ROW && r == 5,
          "equal token accepted: %s", msg);
    CHECK(fence(db, &r, msg, sizeof msg, "?1, ?2", 't', "res/a", -1,
                'i', (sqlite3_int64)1700000000000001LL) == SQLITE_ROW
              && r == 1700000000000001LL, "a clock-sized token advances the mark: %s", msg);
    CHECK(fence(db, &r, msg, sizeof msg, "'res/a', 6") == SQLITE_ERROR,
          "an older token is refused");
    CHECK(strcmp(msg, "stale fencing token: token 6 < mark 1700000000000001") == 0,
          "the stale message: '%s'", msg);
    CHECK(mark_of(db, "res/a") == 1700000000000001LL, "a refused token leaves the mark");
    CHECK(fence(db, &r, msg, sizeof msg, "'res/b', 1") == SQLITE_ROW && r == 1,
          "resources are apart: %s", msg);
}

/* Each bad argument is refused with a message that names it. */
static void test_bad_input(sqlite3 *db)
{
    static char big[10241];
    sqlite3_int64 r;
    char msg[256];
    struct {
        const char *args, *want;
    } cases[] = {
        {"'r', NULL", "token must be an INTEGER"},
        {"NULL, 1", "resource must be TEXT"},
        {"'r', '7'", "token must be an INTEGER"},
        {"'r', 7.0", "token must be an INTEGER"},
        {"'r', x'07'", "token must be an INTEGER"},
        {"7, 7", "resource must be TEXT"},
        {"'r', 0", "token must be a positive integer"},
        {"'r', -1", "token must be a positive integer"},
        {"'r', -9223372036854775808", "token must be a positive integer"},
        {"'', 1", "resource must be 1 to 1024 bytes long"},
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(fence(db, &r, msg, sizeof msg, cases[i].args) == SQLITE_ERROR
                  && strstr(msg, cases[i].want) != NULL,
              "lease_fence(%s): want '%s', got '%s'", cases[i].args, cases[i].want, msg);
    }
    memset(big, 'x', sizeof big - 1);
    CHECK(fence(db, &r, msg, sizeof msg, "?1, 1", 't', big, 10240) == SQLITE_ERROR
              && strstr(msg, "1 to 1024 bytes") != NULL, "a 10 kB resource: '%s'", msg);
    CHECK(fence(db, &r, msg, sizeof msg, "?1, 1", 't', big, 1025) == SQLITE_ERROR,
          "a 1025-byte resource");
    CHECK(fence(db, &r, msg, sizeof msg, "?1, 1", 't', big, 1024) == SQLITE_ROW,
          "a 1024-byte resource is accepted: %s", msg);
    CHECK(fence(db, &r, msg, sizeof msg, "?1, 1", 't', "a\0b", 3) == SQLITE_ERROR
              && strstr(msg, "NUL") != NULL, "a NUL inside the resource: '%s'", msg);
    CHECK(fence(db, &r, msg, sizeof msg, "'r'") != SQLITE_ROW, "one argument");
}

/* A rolled-back transaction does not move the mark; a committed one does. */
static void test_transactions(sqlite3 *db)
{
    sqlite3_int64 r;
    char msg[256];

    exec(db, "CREATE TABLE data (id INTEGER PRIMARY KEY, v TEXT);"
             "INSERT INTO data VALUES (1, 'init')");
    CHECK(fence(db, &r, msg, sizeof msg, "'res/t', 10") == SQLITE_ROW, "mark 10: %s", msg);
    CHECK(exec(db, "BEGIN IMMEDIATE") == SQLITE_OK, "begin");
    CHECK(fence(db, &r, msg, sizeof msg, "'res/t', 20") == SQLITE_ROW, "20 in a txn: %s", msg);
    exec(db, "UPDATE data SET v = 'rolled back' WHERE id = 1");
    CHECK(exec(db, "ROLLBACK") == SQLITE_OK, "rollback");
    CHECK(mark_of(db, "res/t") == 10, "the rollback undid the mark: %lld",
          (long long)mark_of(db, "res/t"));
    /* One statement: the check fails the UPDATE, which writes nothing. */
    CHECK(exec(db, "UPDATE data SET v = 'stale' WHERE id = 1 AND lease_fence('res/t', 9) > 0")
              == SQLITE_ERROR, "a stale check inside an UPDATE fails it");
    CHECK(exec(db, "UPDATE data SET v = 'fresh' WHERE id = 1 AND lease_fence('res/t', 11) > 0")
              == SQLITE_OK, "a fresh one lets it through: %s", sqlite3_errmsg(db));
    CHECK(mark_of(db, "res/t") == 11, "and advances the mark");
}

/* Triggers and views, which a database file may carry, cannot call it. */
static void test_direct_only(sqlite3 *db)
{
    CHECK(exec(db, "CREATE VIEW fence_view AS SELECT lease_fence('res/v', 99) AS m") == SQLITE_OK,
          "create view: %s", sqlite3_errmsg(db));
    CHECK(exec(db, "SELECT * FROM fence_view") != SQLITE_OK, "a view cannot call it");
    CHECK(mark_of(db, "res/v") == -1, "and no mark was made");
}

/* A mark that is not a positive integer (the table edited by hand) is an error. */
static void test_corrupt_mark(sqlite3 *db)
{
    sqlite3_int64 r;
    char msg[256];

    /* 'x' > 0 in SQLite's ordering: the CHECK lets it in. */
    CHECK(exec(db, "INSERT INTO lease_fence VALUES ('res/c', 'x')") == SQLITE_OK,
          "insert a bad mark: %s", sqlite3_errmsg(db));
    CHECK(fence(db, &r, msg, sizeof msg, "'res/c', 5") != SQLITE_ROW
              && strstr(msg, "not a positive integer") != NULL,
          "a bad stored mark is refused: '%s'", msg);
}

/*
 * Two connections to one file: while the newer holder's BEGIN IMMEDIATE
 * transaction is open, the older one cannot write at all; once it commits,
 * the older one's check is refused.
 */
static void test_two_connections(void)
{
    sqlite3 *newer = open_db("two.db", 1), *older = open_db("two.db", 0);
    sqlite3_int64 r;
    char msg[256];

    sqlite3_busy_timeout(older, 0);
    CHECK(fence(newer, &r, msg, sizeof msg, "'res/2', 5") == SQLITE_ROW, "mark 5: %s", msg);
    CHECK(exec(newer, "BEGIN IMMEDIATE") == SQLITE_OK, "newer: begin");
    CHECK(fence(newer, &r, msg, sizeof msg, "'res/2', 20") == SQLITE_ROW, "newer: 20: %s", msg);
    CHECK(exec(older, "BEGIN IMMEDIATE") == SQLITE_BUSY, "older: BEGIN IMMEDIATE waits");
    CHECK(fence(older, &r, msg, sizeof msg, "'res/2', 10") == SQLITE_BUSY,
          "older: a check outside a transaction cannot write either: '%s'", msg);
    CHECK(exec(newer, "COMMIT") == SQLITE_OK, "newer: commit");
    CHECK(exec(older, "BEGIN IMMEDIATE") == SQLITE_OK, "older: begin after the commit");
    CHECK(fence(older, &r, msg, sizeof msg, "'res/2', 10") == SQLITE_ERROR
              && strcmp(msg, "stale fencing token: token 10 < mark 20") == 0,
          "older: refused once the newer committed: '%s'", msg);
    exec(older, "ROLLBACK");
    CHECK(mark_of(older, "res/2") == 20, "the mark is the newer one's");
    sqlite3_close(older);
    sqlite3_close(newer);
}

/* The loadable extension, loaded by path: the same function. */
static void test_extension(const char *path)
{
    char file[700];
    sqlite3 *db = NULL;
    char *err = NULL;
    sqlite3_int64 r;
    char msg[256];

    snprintf(file, sizeof file, "%s/ext.db", dir);
    unlink(file);
    if (sqlite3_open(file, &db) != SQLITE_OK) {
        fprintf(stderr, "FATAL: cannot open %s\n", file);
        exit(1);
    }
    CHECK(fence(db, &r, msg, sizeof msg, "'r', 1") != SQLITE_ROW, "not there before loading");
    sqlite3_enable_load_extension(db, 1);
    CHECK(sqlite3_load_extension(db, path, NULL, &err) == SQLITE_OK, "load %s: %s", path,
          err ? err : "?");
    sqlite3_free(err);
    CHECK(fence(db, &r, msg, sizeof msg, "'res/e', 7") == SQLITE_ROW && r == 7, "loaded: %s", msg);
    CHECK(fence(db, &r, msg, sizeof msg, "'res/e', 6") == SQLITE_ERROR
              && strcmp(msg, "stale fencing token: token 6 < mark 7") == 0,
          "loaded: stale refused: '%s'", msg);
    CHECK(fence(db, &r, msg, sizeof msg, "'res/e', 0") == SQLITE_ERROR, "loaded: 0 refused");
    sqlite3_close(db);
}

int main(int argc, char **argv)
{
    sqlite3 *db;

    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s DIR [EXTENSION]\n", argv[0]);
        return 2;
    }
    /* A directory of its own under DIR: fresh files, whatever ran before. */
    snprintf(dir, sizeof dir, "%s/resource-fence-XXXXXX", argv[1]);
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    db = open_db("fence.db", 1);
    test_marks(db);
    test_bad_input(db);
    test_transactions(db);
    test_direct_only(db);
    test_corrupt_mark(db);
    sqlite3_close(db);
    test_two_connections();
    if (argc == 3)
        test_extension(argv[2]);
    if (failures) {
        fprintf(stderr, "sqlite_fence_test: %d checks FAILED\n", failures);
        return 1;
    }
    printf("sqlite_fence_test: all checks passed\n");
    return 0;
}
