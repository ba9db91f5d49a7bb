/*
 * store_sqlite.c - the embedded store: one SQLite file, one host, no server.
 *
 * URLs: sqlite:relative/path.db, sqlite:///absolute/path.db
 * Parameters: synchronous=full (default) | extra | normal
 *
 * Why it is safe on one host:
 *  - Every write runs in BEGIN IMMEDIATE, so the check-then-write of
 *    acquire is atomic across processes. Waiting for the write lock is
 *    bounded by the handle's timeout; the wait polls every 1-2 ms (SQLite's
 *    own busy handler backs off to 100 ms sleeps, which lets a process in a
 *    tight loop starve the others), which keeps the lock close to fair.
 *  - WAL with synchronous=FULL: a committed token is on disk before the
 *    caller sees it, so a process killed with SIGKILL, or a power cut, can
 *    never make a token be issued twice. synchronous=normal trades that
 *    for speed (a power cut may lose the last grants; a killed process
 *    cannot) and is documented as such.
 *  - Expiry uses CLOCK_BOOTTIME together with the kernel's boot id, read
 *    inside each statement through two SQL functions (as PostgreSQL's
 *    clock_timestamp()): a wall-clock step cannot move it, and a row
 *    written during an earlier boot is expired, so a reboot ends every
 *    lease while keeping every token counter.
 *
 * The grant history (lease_history) is written in the transactions that
 * grant and release, so it cannot miss a grant; its times are the wall
 * clock, since people read them next to other logs.
 *
 * The SQLite file must not be shared by several hosts (e.g. over NFS):
 * their boot ids and clocks differ and file locking there is unreliable.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sqlite3.h>

#include "lease_int.h"

/*
 * PRAGMA user_version counts changes that an older build could not work
 * with: 1 is lease, lease_fence and lease_data. A table that older builds
 * simply ignore (lease_history) is created when missing and does not raise
 * it, so a file opened once by a newer build stays usable by older ones
 * (whose grants then leave gaps in the history).
 */
#define SCHEMA_VERSION 1

enum {
    ST_BEGIN,
    ST_COMMIT,
    ST_ROLLBACK,
    ST_ACQ_READ,
    ST_ACQ_EXTEND,
    ST_ACQ_GRANT,
    ST_RENEW,
    ST_RELEASE,
    ST_INSPECT,
    ST_LIST,
    ST_FENCE_RAISE,
    ST_FENCE_MARK,
    ST_CHECK_HOLDER,
    ST_DATA_PUT,
    ST_DATA_GET,
    ST_HIST_EXPIRE,
    ST_HIST_ADD,
    ST_HIST_PRUNE,
    ST_HIST_RELEASE,
    ST_HIST_LOST,
    ST_HIST_READ,
    ST_COUNT
};

/* "Is this row an unexpired lease?", on the store's clock. */
#define ALIVE "(owner IS NOT NULL AND boot_id = lease_boot_id() " \
              "AND expires_ms > lease_now_ms())"

/* The same, for the row of `lease l` in a join. */
#define L_ALIVE "(l.owner IS NOT NULL AND l.boot_id = lease_boot_id() " \
                "AND l.expires_ms > lease_now_ms())"
/* When the lease of `lease l` expires (expired), on the wall clock; 0 for
 * a row of an earlier boot, whose CLOCK_BOOTTIME cannot be converted. */
#define WALL_EXPIRY "(CASE WHEN l.boot_id = lease_boot_id() THEN " \
                    "lease_wall_ms() - (lease_now_ms() - l.expires_ms) ELSE 0 END)"

static const char *const sql[ST_COUNT] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_ACQ_READ] =
        "SELECT owner, label, token, expires_ms - lease_now_ms(), ttl_ms, "
        ALIVE " FROM lease WHERE key = ?1",
    [ST_ACQ_EXTEND] =
        "UPDATE lease SET expires_ms = lease_now_ms() + ?2, ttl_ms = ?2, "
        "label = ?3 WHERE key = ?1",
    /* The row is kept forever (release only clears the owner), so the
     * token counter survives release and expiry. */
    [ST_ACQ_GRANT] =
        "INSERT INTO lease (key, owner, label, token, boot_id, expires_ms, "
        "ttl_ms, acquired_ms) VALUES (?1, ?2, ?3, ?4, lease_boot_id(), "
        "lease_now_ms() + ?5, ?5, lease_now_ms()) "
        "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, "
        "label = excluded.label, token = excluded.token, "
        "boot_id = excluded.boot_id, expires_ms = excluded.expires_ms, "
        "ttl_ms = excluded.ttl_ms, acquired_ms = excluded.acquired_ms",
    [ST_RENEW] =
        "UPDATE lease SET expires_ms = lease_now_ms() + ?4, ttl_ms = ?4 "
        "WHERE key = ?1 AND owner = ?2 AND token = ?3 AND " ALIVE,
    [ST_RELEASE] =
        "UPDATE lease SET owner = NULL, label = '', expires_ms = 0 "
        "WHERE key = ?1 AND owner = ?2 AND token = ?3",
    [ST_INSPECT] =
        "SELECT key, owner, label, token, expires_ms - lease_now_ms(), "
        "ttl_ms, " ALIVE " FROM lease WHERE key = ?1",
    /* Compare bytes, not LIKE patterns: a key may hold '%' or '_'. */
    [ST_LIST] =
        "SELECT key, owner, label, token, expires_ms - lease_now_ms(), "
        "ttl_ms, " ALIVE " FROM lease "
        "WHERE substr(CAST(key AS BLOB), 1, ?2) = ?1 ORDER BY key",
    [ST_FENCE_RAISE] =
        "INSERT INTO lease_fence (resource, mark) VALUES (?1, ?2) "
        "ON CONFLICT (resource) DO UPDATE SET mark = excluded.mark "
        "WHERE lease_fence.mark <= excluded.mark RETURNING mark",
    [ST_FENCE_MARK] = "SELECT mark FROM lease_fence WHERE resource = ?1",
    [ST_CHECK_HOLDER] =
        "SELECT 1 FROM lease WHERE key = ?1 AND owner = ?2 AND token = ?3 "
        "AND " ALIVE,
    [ST_DATA_PUT] =
        "INSERT INTO lease_data (name, value, token, key) "
        "VALUES (?1, ?2, ?3, ?4) ON CONFLICT (name) DO UPDATE SET "
        "value = excluded.value, token = excluded.token, key = excluded.key",
    [ST_DATA_GET] = "SELECT value, token FROM lease_data WHERE name = ?1",
    /* History (ended: 0 held, 1 released, 2 expired, 3 lost, as
     * lease_ended). Run before the new grant overwrites the lease row,
     * whose expiry (on CLOCK_BOOTTIME) gives the old grant's end on the
     * wall clock; from an earlier boot that time is unknown (0). */
    [ST_HIST_EXPIRE] =
        "UPDATE lease_history SET ended = 2, ended_ms = COALESCE(("
        "SELECT " WALL_EXPIRY " FROM lease l WHERE l.key = ?1 AND l.token = ?2), 0) "
        "WHERE key = ?1 AND token = ?2 AND ended = 0",
    [ST_HIST_ADD] =
        "INSERT OR REPLACE INTO lease_history (key, token, owner, label, ttl_ms, "
        "acquired_ms) VALUES (?1, ?2, ?3, ?4, ?5, lease_wall_ms())",
    /* Tokens of a key are consecutive: keep the newest LEASE_HISTORY_KEEP. */
    [ST_HIST_PRUNE] = "DELETE FROM lease_history WHERE key = ?1 AND token <= ?2",
    [ST_HIST_RELEASE] =
        "UPDATE lease_history SET ended = 1, ended_ms = lease_wall_ms() "
        "WHERE key = ?1 AND token = ?2 AND owner = ?3 AND ended IN (0, 2)",
    /* Lost at the lease's expiry when the row still tells it, else now. */
    [ST_HIST_LOST] =
        "UPDATE lease_history SET ended = 3, ended_ms = CASE WHEN ended_ms > 0 "
        "THEN ended_ms ELSE COALESCE((SELECT NULLIF(" WALL_EXPIRY ", 0) FROM lease l "
        "WHERE l.key = ?1 AND l.token = ?2 AND l.owner IS NOT NULL), lease_wall_ms()) END "
        "WHERE key = ?1 AND token = ?2 AND owner = ?3 AND ended IN (0, 2)",
    [ST_HIST_READ] =
        "SELECT h.token, h.owner, h.label, h.ttl_ms, h.acquired_ms, h.ended, "
        "h.ended_ms, l.token = h.token AND l.owner = h.owner AND " L_ALIVE ", "
        "CASE WHEN l.token = h.token AND l.owner IS NOT NULL THEN " WALL_EXPIRY
        " ELSE 0 END FROM lease_history h LEFT JOIN lease l ON l.key = h.key "
        "WHERE h.key = ?1 ORDER BY h.token DESC LIMIT ?2",
};

static const char schema_v1[] =
    "CREATE TABLE IF NOT EXISTS lease ("
    "  key         TEXT PRIMARY KEY,"
    "  owner       TEXT,"                          /* NULL when free */
    "  label       TEXT NOT NULL DEFAULT '',"
    "  token       INTEGER NOT NULL DEFAULT 0 CHECK (token >= 0),"
    "  boot_id     TEXT NOT NULL DEFAULT '',"      /* boot of expires_ms */
    "  expires_ms  INTEGER NOT NULL DEFAULT 0,"    /* CLOCK_BOOTTIME, ms */
    "  ttl_ms      INTEGER NOT NULL DEFAULT 0,"
    "  acquired_ms INTEGER NOT NULL DEFAULT 0"
    ") WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS lease_fence ("
    "  resource TEXT PRIMARY KEY,"
    "  mark     INTEGER NOT NULL CHECK (mark >= 0)"
    ") WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS lease_data ("
    "  name  TEXT PRIMARY KEY,"
    "  value BLOB NOT NULL,"
    "  token INTEGER NOT NULL,"
    "  key   TEXT NOT NULL"
    ") WITHOUT ROWID;";

static const char schema_history[] =
    "CREATE TABLE IF NOT EXISTS lease_history ("
    "  key         TEXT NOT NULL,"
    "  token       INTEGER NOT NULL,"
    "  owner       TEXT NOT NULL,"
    "  label       TEXT NOT NULL DEFAULT '',"
    "  ttl_ms      INTEGER NOT NULL DEFAULT 0,"
    "  acquired_ms INTEGER NOT NULL,"             /* wall clock, ms */
    "  ended       INTEGER NOT NULL DEFAULT 0,"   /* lease_ended */
    "  ended_ms    INTEGER NOT NULL DEFAULT 0,"   /* wall clock, ms; 0 unknown */
    "  PRIMARY KEY (key, token)"
    ") WITHOUT ROWID;";

typedef struct {
    lease_store parent;
    sqlite3 *db;
    sqlite3_stmt *st[ST_COUNT];
    char path[PATH_MAX];
    char boot_id[64];
    uint64_t timeout_ms;
    int64_t busy_since;
} sqlite_store;

/* Called by SQLite while the lock is taken: wait 1-2 ms and try again,
 * until the handle's timeout has passed since the first call. */
static int busy_handler(void *arg, int count)
{
    sqlite_store *s = arg;
    int64_t now = lease_clock_ns();

    if (count == 0)
        s->busy_since = now;
    if (now - s->busy_since >= (int64_t)s->timeout_ms * 1000000)
        return 0;
    lease__sleep_ns(1000000 + (int64_t)(lease__random_u64() % 1000000));
    return 1;
}

static int fail(sqlite_store *s, const char *what)
{
    return lease__seterr(LEASE_ESTORE, "sqlite %s (%s): %s", what, s->path,
                         sqlite3_errmsg(s->db));
}

static void now_ms_fn(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    (void)argv;
    sqlite3_result_int64(ctx, lease_clock_ns() / 1000000);
}

/* Wall-clock time for the history, which people read next to other logs. */
static void wall_ms_fn(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    struct timespec ts;

    (void)argc;
    (void)argv;
    clock_gettime(CLOCK_REALTIME, &ts);
    sqlite3_result_int64(ctx, (sqlite3_int64)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

static void boot_id_fn(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    sqlite_store *s = sqlite3_user_data(ctx);

    (void)argc;
    (void)argv;
    sqlite3_result_text(ctx, s->boot_id, -1, SQLITE_STATIC);
}

static int read_boot_id(sqlite_store *s)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    size_t n;

    if (f == NULL)
        return lease__seterr(LEASE_ESTORE,
                             "sqlite store needs /proc/sys/kernel/random/boot_id "
                             "to end leases on reboot, and cannot read it");
    n = fread(s->boot_id, 1, sizeof(s->boot_id) - 1, f);
    fclose(f);
    while (n > 0 && (s->boot_id[n - 1] == '\n' || s->boot_id[n - 1] == ' '))
        n--;
    s->boot_id[n] = '\0';
    if (n == 0)
        return lease__seterr(LEASE_ESTORE, "empty boot id");
    return 0;
}

static sqlite3_stmt *stmt(sqlite_store *s, int which)
{
    sqlite3_stmt *st = s->st[which];

    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return st;
}

/* Run a statement, already bound, whose rows do not matter. */
static int exec_st(sqlite_store *s, int which, const char *what)
{
    int rc = sqlite3_step(s->st[which]);

    sqlite3_reset(s->st[which]);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : fail(s, what);
}

static int begin(sqlite_store *s)
{
    return exec_st(s, ST_BEGIN, "begin");
}

static int commit(sqlite_store *s)
{
    int rc = exec_st(s, ST_COMMIT, "commit");

    if (rc < 0 && !sqlite3_get_autocommit(s->db))
        exec_st(s, ST_ROLLBACK, "rollback");
    return rc;
}

/* Roll back and pass `rc` through; keeps the first error's message. */
static int rollback(sqlite_store *s, int rc)
{
    if (!sqlite3_get_autocommit(s->db)) {
        sqlite3_reset(s->st[ST_ROLLBACK]);
        sqlite3_step(s->st[ST_ROLLBACK]);
        sqlite3_reset(s->st[ST_ROLLBACK]);
    }
    return rc;
}

static void col_text(char *dst, size_t size, sqlite3_stmt *st, int col)
{
    const unsigned char *t = sqlite3_column_text(st, col);

    lease__strlcpy(dst, t ? (const char *)t : "", size);
}

static uint64_t col_u64(sqlite3_stmt *st, int col)
{
    sqlite3_int64 v = sqlite3_column_int64(st, col);

    return v > 0 ? (uint64_t)v : 0;
}

/* Columns: key, owner, label, token, remaining, ttl, alive. */
static void row_info(lease_info *out, sqlite3_stmt *st)
{
    memset(out, 0, sizeof(*out));
    col_text(out->key, sizeof(out->key), st, 0);
    col_text(out->owner, sizeof(out->owner), st, 1);
    col_text(out->label, sizeof(out->label), st, 2);
    out->token = col_u64(st, 3);
    out->held = sqlite3_column_int(st, 6) != 0;
    out->remaining_ms = out->held ? col_u64(st, 4) : 0;
    out->ttl_ms = out->held ? col_u64(st, 5) : 0;
}

static int user_version(sqlite_store *s, int *version)
{
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(s->db, "PRAGMA user_version", -1, &st, NULL);

    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW)
        *version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? 0 : fail(s, "read schema version");
}

/* Does the table exist? A read: no write lock for an up-to-date file. */
static int has_table(sqlite_store *s, const char *name, int *yes)
{
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(s->db, "SELECT 1 FROM sqlite_master WHERE "
                                "type = 'table' AND name = ?1", -1, &st, NULL);

    if (rc == SQLITE_OK) {
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
        *yes = rc == SQLITE_ROW;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : fail(s, "read the schema");
}

static int setup(sqlite_store *s, const char *synchronous, uint64_t timeout_ms)
{
    char pragmas[128];
    int version = 0, history = 0, rc, i;

    sqlite3_extended_result_codes(s->db, 1);
    s->timeout_ms = timeout_ms;
    sqlite3_busy_handler(s->db, busy_handler, s);
    if (sqlite3_create_function(s->db, "lease_now_ms", 0, SQLITE_UTF8, NULL,
                                now_ms_fn, NULL, NULL) != SQLITE_OK ||
        sqlite3_create_function(s->db, "lease_wall_ms", 0, SQLITE_UTF8, NULL,
                                wall_ms_fn, NULL, NULL) != SQLITE_OK ||
        sqlite3_create_function(s->db, "lease_boot_id", 0, SQLITE_UTF8, s,
                                boot_id_fn, NULL, NULL) != SQLITE_OK)
        return fail(s, "create functions");
    /* journal_mode=WAL is a property of the file: switching to it needs the
     * write lock once (the busy timeout lets many first openers queue);
     * once the file is in WAL mode this reads only. */
    snprintf(pragmas, sizeof(pragmas),
             "PRAGMA journal_mode=WAL; PRAGMA synchronous=%s;", synchronous);
    if (sqlite3_exec(s->db, pragmas, NULL, NULL, NULL) != SQLITE_OK)
        return fail(s, "set journal mode");

    /* Read the version first: an open of an up-to-date file (every open
     * but the first) takes no write lock, so it is not held up by writers. */
    if ((rc = user_version(s, &version)) < 0 ||
        (rc = has_table(s, "lease_history", &history)) < 0)
        return rc;
    if (version < SCHEMA_VERSION || !history) {
        if (sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
            return fail(s, "open schema transaction");
        if ((rc = user_version(s, &version)) < 0) {
            sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
            return rc;
        }
        if ((version < 1 &&
             (sqlite3_exec(s->db, schema_v1, NULL, NULL, NULL) != SQLITE_OK ||
              sqlite3_exec(s->db, "PRAGMA user_version = 1", NULL, NULL, NULL) != SQLITE_OK)) ||
            sqlite3_exec(s->db, schema_history, NULL, NULL, NULL) != SQLITE_OK) {
            rc = fail(s, "create schema");
            sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
            return rc;
        }
        if (sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
            rc = fail(s, "commit schema");
            sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
            return rc;
        }
    }
    if (version > SCHEMA_VERSION)
        return lease__seterr(LEASE_ESTORE,
                             "sqlite store %s has schema version %d, newer "
                             "than this build knows (%d)",
                             s->path, version, SCHEMA_VERSION);
    for (i = 0; i < ST_COUNT; i++)
        if (sqlite3_prepare_v3(s->db, sql[i], -1, SQLITE_PREPARE_PERSISTENT,
                               &s->st[i], NULL) != SQLITE_OK)
            return fail(s, "prepare");
    return 0;
}

static void sqlite_close(lease_store *base)
{
    sqlite_store *s = (sqlite_store *)base;
    int i;

    for (i = 0; i < ST_COUNT; i++)
        sqlite3_finalize(s->st[i]);
    sqlite3_close(s->db);
    free(s);
}

static int sqlite_open(lease_store **out, const char *url, uint64_t timeout_ms)
{
    lease__url u;
    sqlite_store *s;
    const char *sync;
    int rc;

    if ((rc = lease__url_parse(&u, url)) < 0)
        return rc;
    if (u.hosts[0] != '\0') {
        lease__url_free(&u);
        return lease__seterr(LEASE_EINVALID,
                             "a sqlite URL names a file, not a host: use "
                             "sqlite:relative/path.db or sqlite:///absolute/path.db");
    }
    if (u.path[0] == '\0' || strlen(u.path) >= PATH_MAX) {
        lease__url_free(&u);
        return lease__seterr(LEASE_EINVALID, "sqlite URL has no usable path");
    }
    sync = lease__url_param(&u, "synchronous");
    if (sync == NULL)
        sync = "FULL";
    else if (strcasecmp(sync, "full") == 0)
        sync = "FULL";
    else if (strcasecmp(sync, "extra") == 0)
        sync = "EXTRA";
    else if (strcasecmp(sync, "normal") == 0)
        sync = "NORMAL";
    else {
        lease__url_free(&u);
        return lease__seterr(LEASE_EINVALID,
                             "sqlite synchronous= must be full, extra or normal");
    }
    for (size_t i = 0; i < u.nparams; i++)
        if (strcmp(u.params[i].name, "synchronous") != 0) {
            rc = lease__seterr(LEASE_EINVALID, "unknown sqlite URL parameter '%s'",
                               u.params[i].name);
            lease__url_free(&u);
            return rc;
        }
    if ((s = calloc(1, sizeof(*s))) == NULL) {
        lease__url_free(&u);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    lease__strlcpy(s->path, u.path, sizeof(s->path));
    lease__url_free(&u);
    if ((rc = read_boot_id(s)) < 0) {
        free(s);
        return rc;
    }
    if (sqlite3_open_v2(s->path, &s->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                            SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        rc = lease__seterr(LEASE_ESTORE, "cannot open sqlite store %s: %s",
                           s->path,
                           s->db ? sqlite3_errmsg(s->db) : "out of memory");
        sqlite_close(&s->parent);
        return rc;
    }
    if ((rc = setup(s, sync, timeout_ms)) < 0) {
        sqlite_close(&s->parent);
        return rc;
    }
    *out = &s->parent;
    return 0;
}

static int sqlite_set_timeout(lease_store *base, uint64_t timeout_ms)
{
    sqlite_store *s = (sqlite_store *)base;

    s->timeout_ms = timeout_ms;
    return 0;
}

static int sqlite_acquire(lease_grant *out, lease_info *holder,
                          lease_store *base, const lease_request *req)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st;
    uint64_t token = 0;
    int rc, step;

    if ((rc = begin(s)) < 0)
        return rc;
    st = stmt(s, ST_ACQ_READ);
    sqlite3_bind_text(st, 1, req->key, -1, SQLITE_STATIC);
    step = sqlite3_step(st);
    if (step == SQLITE_ROW) {
        int alive = sqlite3_column_int(st, 5);
        const unsigned char *owner = sqlite3_column_text(st, 0);

        token = col_u64(st, 2);
        if (alive && owner && strcmp((const char *)owner, req->owner) == 0) {
            /* A retried acquire by the holder: same token, expiry anew,
             * so the holder's new local deadline is covered. */
            sqlite3_reset(st);
            st = stmt(s, ST_ACQ_EXTEND);
            sqlite3_bind_text(st, 1, req->key, -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 2, (sqlite3_int64)req->ttl_ms);
            sqlite3_bind_text(st, 3, req->label, -1, SQLITE_STATIC);
            if ((rc = exec_st(s, ST_ACQ_EXTEND, "acquire")) < 0)
                return rollback(s, rc);
            if ((rc = commit(s)) < 0)
                return rc;
            out->token = token;
            out->ttl_ms = req->ttl_ms;
            return 0;
        }
        if (alive) {
            memset(holder, 0, sizeof(*holder));
            lease__strlcpy(holder->key, req->key, sizeof(holder->key));
            col_text(holder->owner, sizeof(holder->owner), st, 0);
            col_text(holder->label, sizeof(holder->label), st, 1);
            holder->token = token;
            holder->held = 1;
            holder->remaining_ms = col_u64(st, 3);
            holder->ttl_ms = col_u64(st, 4);
            sqlite3_reset(st);
            return rollback(s, LEASE_EBUSY);
        }
    } else if (step != SQLITE_DONE) {
        rc = fail(s, "acquire");
        sqlite3_reset(st);
        return rollback(s, rc);
    }
    sqlite3_reset(st);
    if (token >= LEASE__TOKEN_MAX)
        return rollback(s, lease__seterr(LEASE_ESTORE,
                                         "token counter of '%s' is exhausted",
                                         req->key));
    /* The previous grant, if it did not end otherwise, expired. */
    st = stmt(s, ST_HIST_EXPIRE);
    sqlite3_bind_text(st, 1, req->key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)token);
    if ((rc = exec_st(s, ST_HIST_EXPIRE, "acquire")) < 0)
        return rollback(s, rc);
    st = stmt(s, ST_ACQ_GRANT);
    sqlite3_bind_text(st, 1, req->key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, req->owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, req->label, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)(token + 1));
    sqlite3_bind_int64(st, 5, (sqlite3_int64)req->ttl_ms);
    if ((rc = exec_st(s, ST_ACQ_GRANT, "acquire")) < 0)
        return rollback(s, rc);
    st = stmt(s, ST_HIST_ADD);
    sqlite3_bind_text(st, 1, req->key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)(token + 1));
    sqlite3_bind_text(st, 3, req->owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, req->label, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, (sqlite3_int64)req->ttl_ms);
    if ((rc = exec_st(s, ST_HIST_ADD, "acquire")) < 0)
        return rollback(s, rc);
    if (token + 1 > LEASE_HISTORY_KEEP) {
        st = stmt(s, ST_HIST_PRUNE);
        sqlite3_bind_text(st, 1, req->key, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, (sqlite3_int64)(token + 1 - LEASE_HISTORY_KEEP));
        if ((rc = exec_st(s, ST_HIST_PRUNE, "acquire")) < 0)
            return rollback(s, rc);
    }
    if ((rc = commit(s)) < 0)
        return rc;
    out->token = token + 1;
    out->ttl_ms = req->ttl_ms;
    return 0;
}

static int sqlite_renew(uint64_t *granted_ms, lease_store *base,
                        const char *key, const char *owner, uint64_t token,
                        uint64_t ttl_ms)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st;
    int rc;

    /* IMMEDIATE first, so lease_now_ms() is read after the lock is held:
     * a renew that waited on the lock must not revive a lease that
     * expired meanwhile. */
    if ((rc = begin(s)) < 0)
        return rc;
    st = stmt(s, ST_RENEW);
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)token);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)ttl_ms);
    if ((rc = exec_st(s, ST_RENEW, "renew")) < 0)
        return rollback(s, rc);
    if (sqlite3_changes(s->db) != 1)
        return rollback(s, lease__not_holder("renew", key, token, NULL));
    if ((rc = commit(s)) < 0)
        return rc;
    *granted_ms = ttl_ms;
    return 0;
}

static int sqlite_release(lease_store *base, const char *key,
                          const char *owner, uint64_t token)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st;
    int rc;

    if ((rc = begin(s)) < 0)
        return rc;
    st = stmt(s, ST_RELEASE);
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)token);
    if ((rc = exec_st(s, ST_RELEASE, "release")) < 0)
        return rollback(s, rc);
    if (sqlite3_changes(s->db) != 1)
        return rollback(s, lease__seterr(LEASE_ELOST,
                                         "release '%s': this owner does not "
                                         "hold token %llu",
                                         key, (unsigned long long)token));
    st = stmt(s, ST_HIST_RELEASE);
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)token);
    sqlite3_bind_text(st, 3, owner, -1, SQLITE_STATIC);
    if ((rc = exec_st(s, ST_HIST_RELEASE, "release")) < 0)
        return rollback(s, rc);
    return commit(s);
}

static int sqlite_history(lease_history_entry *out, size_t *n, lease_store *base,
                          const char *key, size_t max)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st = stmt(s, ST_HIST_READ);
    int step;

    *n = 0;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)max);
    while ((step = sqlite3_step(st)) == SQLITE_ROW && *n < max) {
        lease_history_entry *e = &out[(*n)++];
        int ended = sqlite3_column_int(st, 5);

        memset(e, 0, sizeof(*e));
        e->token = col_u64(st, 0);
        col_text(e->owner, sizeof(e->owner), st, 1);
        col_text(e->label, sizeof(e->label), st, 2);
        e->ttl_ms = col_u64(st, 3);
        e->acquired_ms = sqlite3_column_int64(st, 4);
        e->ended = ended >= 0 && ended <= LEASE_ENDED_LOST ? (lease_ended)ended
                                                            : LEASE_ENDED_EXPIRED;
        e->ended_ms = sqlite3_column_int64(st, 6);
        /* Not ended by anyone, and no longer the live lease: it ran out,
         * at the expiry the lease row still has. */
        if (e->ended == LEASE_ENDED_HELD && !sqlite3_column_int(st, 7)) {
            e->ended = LEASE_ENDED_EXPIRED;
            e->ended_ms = sqlite3_column_int64(st, 8);
        }
    }
    sqlite3_reset(st);
    if (step != SQLITE_ROW && step != SQLITE_DONE)
        return fail(s, "history");
    return 0;
}

static int sqlite_history_lost(lease_store *base, const char *key, const char *owner,
                               uint64_t token)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st = stmt(s, ST_HIST_LOST);

    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)token);
    sqlite3_bind_text(st, 3, owner, -1, SQLITE_STATIC);
    return exec_st(s, ST_HIST_LOST, "history");
}

static int sqlite_inspect(lease_info *out, lease_store *base, const char *key)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st = stmt(s, ST_INSPECT);
    int step;

    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    step = sqlite3_step(st);
    if (step == SQLITE_ROW) {
        row_info(out, st);
        sqlite3_reset(st);
        return 0;
    }
    sqlite3_reset(st);
    if (step == SQLITE_DONE)
        return lease__seterr(LEASE_ENOTFOUND, "'%s' was never acquired", key);
    return fail(s, "inspect");
}

static int sqlite_list(lease_store *base, const char *prefix, lease_list_cb cb,
                       void *payload)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st = stmt(s, ST_LIST);
    lease_info info;
    int step, rc = 0;

    sqlite3_bind_blob(st, 1, prefix, (int)strlen(prefix), SQLITE_STATIC);
    sqlite3_bind_int(st, 2, (int)strlen(prefix));
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        row_info(&info, st);
        if ((rc = cb(&info, payload)) != 0)
            break;
    }
    if (rc == 0 && step != SQLITE_DONE)
        rc = fail(s, "list");
    sqlite3_reset(st);
    return rc;
}

static int read_mark(uint64_t *mark, sqlite_store *s, const char *resource)
{
    sqlite3_stmt *st = stmt(s, ST_FENCE_MARK);
    int step;

    sqlite3_bind_text(st, 1, resource, -1, SQLITE_STATIC);
    step = sqlite3_step(st);
    if (step == SQLITE_ROW)
        *mark = col_u64(st, 0);
    sqlite3_reset(st);
    if (step == SQLITE_ROW)
        return 0;
    if (step == SQLITE_DONE)
        return lease__seterr(LEASE_ENOTFOUND, "'%s' has no fencing mark",
                             resource);
    return fail(s, "read fencing mark");
}

static int sqlite_fence_advance(uint64_t *mark, lease_store *base,
                                const char *resource, uint64_t token)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st;
    int rc, step;

    if ((rc = begin(s)) < 0)
        return rc;
    st = stmt(s, ST_FENCE_RAISE);
    sqlite3_bind_text(st, 1, resource, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)token);
    step = sqlite3_step(st);
    if (step == SQLITE_ROW) {
        *mark = col_u64(st, 0);
        /* Step to the end so the statement's write is complete. */
        step = sqlite3_step(st);
    }
    sqlite3_reset(st);
    if (step != SQLITE_DONE)
        return rollback(s, fail(s, "fence"));
    if (sqlite3_changes(s->db) == 1)
        return commit(s);
    /* The upsert's WHERE refused: the mark is above the token. */
    rc = read_mark(mark, s, resource);
    return rollback(s, rc < 0 ? rc : LEASE_ESTALE);
}

static int sqlite_fence_mark(uint64_t *mark, lease_store *base,
                             const char *resource)
{
    return read_mark(mark, (sqlite_store *)base, resource);
}

/* Inside an open transaction: is (key, owner, token) the live lease? */
static int check_holder(sqlite_store *s, const char *key, const char *owner,
                        uint64_t token)
{
    sqlite3_stmt *st = stmt(s, ST_CHECK_HOLDER);
    int step;

    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)token);
    step = sqlite3_step(st);
    sqlite3_reset(st);
    if (step == SQLITE_ROW)
        return 0;
    if (step == SQLITE_DONE)
        return lease__not_holder(NULL, key, token, "; nothing was written");
    return fail(s, "check lease");
}

static int sqlite_guarded_put(lease_store *base, const char *key,
                              const char *owner, uint64_t token,
                              const char *name, const void *value, size_t len)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st;
    int rc;

    if ((rc = begin(s)) < 0)
        return rc;
    if ((rc = check_holder(s, key, owner, token)) < 0)
        return rollback(s, rc);
    st = stmt(s, ST_DATA_PUT);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_blob64(st, 2, value, len, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)token);
    sqlite3_bind_text(st, 4, key, -1, SQLITE_STATIC);
    if ((rc = exec_st(s, ST_DATA_PUT, "guarded put")) < 0)
        return rollback(s, rc);
    return commit(s);
}

static int sqlite_data_get(void **value, size_t *len, uint64_t *token,
                           lease_store *base, const char *name)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st = stmt(s, ST_DATA_GET);
    int step, rc = 0;

    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    step = sqlite3_step(st);
    if (step == SQLITE_ROW) {
        const void *v = sqlite3_column_blob(st, 0);
        size_t n = (size_t)sqlite3_column_bytes(st, 0);
        char *copy = malloc(n + 1);

        if (copy == NULL) {
            rc = lease__seterr(LEASE_ENOMEM, "out of memory");
        } else {
            if (n)
                memcpy(copy, v, n);
            copy[n] = '\0';
            *value = copy;
            *len = n;
            if (token)
                *token = col_u64(st, 1);
        }
    } else if (step == SQLITE_DONE) {
        rc = lease__seterr(LEASE_ENOTFOUND, "no data named '%s'", name);
    } else {
        rc = fail(s, "read data");
    }
    sqlite3_reset(st);
    return rc;
}

static int sqlite_guarded_txn(lease_store *base, const char *key,
                              const char *owner, uint64_t token,
                              int (*cb)(void *native, void *payload),
                              void *payload)
{
    sqlite_store *s = (sqlite_store *)base;
    int rc;

    /* BEGIN IMMEDIATE holds the database's write lock until the end: no
     * acquisition can pass this holder while the caller's statements run,
     * which is what SELECT ... FOR UPDATE gives on a server. */
    if ((rc = begin(s)) < 0)
        return rc;
    if ((rc = check_holder(s, key, owner, token)) < 0)
        return rollback(s, rc);
    rc = cb(s->db, payload);
    if (rc != 0)
        return rollback(s, rc);
    if (sqlite3_get_autocommit(s->db))
        return lease__seterr(LEASE_ESTORE,
                             "the transaction ended inside the callback "
                             "(an error rolled it back); nothing is known to "
                             "be written");
    return commit(s);
}

static const char *const sqlite_schemes[] = { "sqlite", NULL };

const lease_backend lease__sqlite_backend = {
    .version = LEASE_BACKEND_VERSION,
    .name = "sqlite",
    .schemes = sqlite_schemes,
    .features = LEASE_FEATURE_TXN,
    .open = sqlite_open,
    .close = sqlite_close,
    .acquire = sqlite_acquire,
    .renew = sqlite_renew,
    .release = sqlite_release,
    .inspect = sqlite_inspect,
    .list = sqlite_list,
    .fence_advance = sqlite_fence_advance,
    .fence_mark = sqlite_fence_mark,
    .guarded_put = sqlite_guarded_put,
    .data_get = sqlite_data_get,
    .guarded_txn = sqlite_guarded_txn,
    .wait_release = NULL,
    .renew_many = NULL,
    .set_timeout = sqlite_set_timeout,
    .history = sqlite_history,
    .history_lost = sqlite_history_lost,
};
