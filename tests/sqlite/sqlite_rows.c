/*
 * sqlite_rows.c - what the library reads back from an SQLite file that
 * another process wrote, through the API the CLI does not reach:
 * lease_data_get() on a lease_data row whose value or token is malformed,
 * and lease_fence_mark() on a forged mark. Each is LEASE_ESTORE with a
 * message naming the column, never a value guessed from the row.
 *
 * usage: sqlite_rows DIR (a writable directory for the database file)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sqlite3.h>

#include "lease.h"

#include "../check.h"

/* Run one statement on the file with the plain SQLite API, as another
 * process would. */
static void sql(const char *path, const char *text)
{
    sqlite3 *db = NULL;
    char *err = NULL;

    if (sqlite3_open(path, &db) != SQLITE_OK ||
        sqlite3_exec(db, text, NULL, NULL, &err) != SQLITE_OK) {
        fprintf(stderr, "FATAL: %s: %s\n", text, err ? err : sqlite3_errmsg(db));
        exit(1);
    }
    sqlite3_close(db);
}

/* lease_data_get on `name` fails with ESTORE and a message holding `word`. */
static void expect_malformed_data(lease_store *s, const char *name, const char *word)
{
    void *value = NULL;
    size_t len = 0;
    uint64_t token = 0;
    int rc = lease_data_get(&value, &len, &token, s, name);

    CHECK(rc == LEASE_ESTORE, "data_get '%s': expected ESTORE, got %s", name,
          lease_error_name(rc));
    CHECK(strstr(lease_errmsg(), "malformed") && strstr(lease_errmsg(), word),
          "data_get '%s': the message names '%s'", name, word);
    CHECK(value == NULL, "data_get '%s': no value handed out", name);
    free(value);
}

static void expect_malformed_mark(lease_store *s, const char *resource)
{
    uint64_t mark = 0;
    int rc = lease_fence_mark(&mark, s, resource);

    CHECK(rc == LEASE_ESTORE, "fence_mark '%s': expected ESTORE, got %s", resource,
          lease_error_name(rc));
    CHECK(strstr(lease_errmsg(), "mark") != NULL, "fence_mark '%s': the message names mark",
          resource);
}

/* Open the store at `url`, or stop: everything below needs it. */
static lease_store *open_store(const char *url)
{
    lease_store *s = NULL;

    if (lease_store_open(&s, url) != 0) {
        fprintf(stderr, "FATAL: open %s: %s\n", url, lease_errmsg());
        exit(1);
    }
    return s;
}

/* A store with one lease, one guarded value 'v' and one fencing mark 'res'. */
static void fill(const char *url)
{
    lease_acquire_opts opts = LEASE_ACQUIRE_OPTS_INIT;
    char owner[LEASE_OWNER_BUFSZ];
    lease_store *s = open_store(url);
    uint64_t mark = 0;
    lease_grant g;

    opts.owner = owner;
    opts.ttl_ms = 3600000;
    if (lease_owner_new(owner) != 0 || lease_acquire(&g, NULL, s, "k", &opts) != 0 ||
        lease_guarded_put(s, &g, "v", "hello", 5) != 0 ||
        lease_fence_advance(&mark, s, "res", g.token) != 0) {
        fprintf(stderr, "FATAL: setup: %s\n", lease_errmsg());
        exit(1);
    }
    lease_store_close(s);
}

int main(int argc, char **argv)
{
    char path[4096], url[4200];
    lease_store *s;
    void *value = NULL;
    size_t len = 0;
    uint64_t token = 0;

    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    snprintf(path, sizeof(path), "%s/sqlite_rows.db", argv[1]);
    remove(path);
    snprintf(url, sizeof(url), "sqlite://%s", path);
    fill(url);
    s = open_store(url);

    CHECK(lease_data_get(&value, &len, &token, s, "v") == 0 && len == 5 && token == 1,
          "the sound value reads back");
    free(value);

    /* lease_data's constraints (NOT NULL, the INTEGER affinity) let these
     * through: a hostile writer needs nothing more than the sqlite3 CLI. */
    sql(path, "INSERT INTO lease_data SELECT 'tok-text', value, 'abc', key FROM lease_data WHERE name = 'v';"
              "INSERT INTO lease_data SELECT 'tok-neg', value, -3, key FROM lease_data WHERE name = 'v';"
              "INSERT INTO lease_data SELECT 'tok-zero', value, 0, key FROM lease_data WHERE name = 'v';"
              "INSERT INTO lease_data SELECT 'tok-real', value, 1.5, key FROM lease_data WHERE name = 'v';"
              "INSERT INTO lease_data SELECT 'val-int', 42, token, key FROM lease_data WHERE name = 'v';");
    expect_malformed_data(s, "tok-text", "token");
    expect_malformed_data(s, "tok-neg", "token");
    expect_malformed_data(s, "tok-zero", "token");
    expect_malformed_data(s, "tok-real", "token");
    expect_malformed_data(s, "val-int", "value");

    sql(path, "PRAGMA ignore_check_constraints = 1; UPDATE lease_fence SET mark = -7");
    expect_malformed_mark(s, "res");
    sql(path, "UPDATE lease_fence SET mark = 'high'");
    expect_malformed_mark(s, "res");

    lease_store_close(s);
    remove(path);
    if (failures) {
        fprintf(stderr, "sqlite_rows: %d checks FAILED\n", failures);
        return 1;
    }
    printf("sqlite_rows: all checks passed\n");
    return 0;
}
