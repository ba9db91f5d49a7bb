/*
 * stores/sqlite/sqlite.c - the embedded store: one SQLite file, one host, no server.
 *
 * URLs: sqlite:relative/path.db, sqlite:///absolute/path.db
 * Parameters: synchronous=full (default) | extra | normal
 *
 * Why it is safe on one host:
 *  - Every write runs in BEGIN IMMEDIATE, so the check-then-write of
 *    acquire is atomic across processes. Waiting for the write lock is
 *    bounded by the handle's timeout, once per call (all the statements of
 *    a call share one deadline); the wait polls every 1-2 ms (SQLite's
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
 * Waiters on one host are woken by a release through inotify (see "Wake
 * files" below) rather than by their polling alone.
 *
 * The SQLite file must not be shared by several hosts (e.g. over NFS):
 * their boot ids and clocks differ and file locking there is unreliable.
 *
 * The file is input too: whoever can write it (or its directory) can forge
 * leases, but must not be able to crash us, make us reissue a token, or
 * make us write into a file that is not ours. So the store opens only a
 * regular file that is not a symlink and is empty or starts with SQLite's
 * header, never an in-memory database (it would forget its tokens), and
 * range-checks every row it reads back (sqlite_row_* below).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <poll.h>
#include <unistd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sqlite3.h>

#include "stores/store_int.h"
#include "sqlite_text.h" /* LEASE_SQLITE_SCHEMA: sqlite/schema.sql */

/* SQLITE_OPEN_NOFOLLOW and SQLITE_CANTOPEN_SYMLINK came in SQLite 3.31. */
#if SQLITE_VERSION_NUMBER < 3031000
#error "the SQLite store needs SQLite 3.31 or newer (SQLITE_OPEN_NOFOLLOW)"
#endif

/*
 * PRAGMA user_version counts changes that an older build could not work
 * with: 1 is lease, lease_fence and lease_data. A table that older builds
 * simply ignore (lease_history) is created when missing and does not raise
 * it, so a file opened once by a newer build stays usable by older ones
 * (whose grants then leave gaps in the history). The tables are in
 * sqlite/schema.sql, all IF NOT EXISTS: run whole, it creates only what is
 * missing.
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
    ST_WAIT_HELD,
    ST_COUNT
};

/* "Is this row an unexpired lease?", on the store's clock. A TEXT expiry
 * compares greater than any integer in SQLite: without the typeof() a
 * forged 'abc' would be a lease that never ends. */
#define ALIVE "(owner IS NOT NULL AND boot_id = lease_boot_id() " \
              "AND typeof(expires_ms) = 'integer' AND expires_ms > lease_now_ms())"

/* The same, for the row of `lease l` in a join. */
#define L_ALIVE "(l.owner IS NOT NULL AND l.boot_id = lease_boot_id() " \
                "AND typeof(l.expires_ms) = 'integer' AND l.expires_ms > lease_now_ms())"

/* A lease row as it is stored, with the store's clock read in the same
 * statement: sqlite_row_info() checks every column before trusting it
 * (the file may have been written by anyone who can write it). */
#define ROW_COLS "key, owner, label, token, expires_ms, ttl_ms, boot_id, lease_now_ms()"
/* When the lease of `lease l` expires (expired), on the wall clock; 0 for
 * a row of an earlier boot, whose CLOCK_BOOTTIME cannot be converted. */
#define WALL_EXPIRY "(CASE WHEN l.boot_id = lease_boot_id() " \
                    "AND typeof(l.expires_ms) = 'integer' " \
                    "AND l.expires_ms BETWEEN 0 AND 4611686018427387903 THEN " \
                    "lease_wall_ms() - (lease_now_ms() - l.expires_ms) ELSE 0 END)"

static const char *const sql[ST_COUNT] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_ACQ_READ] = "SELECT " ROW_COLS " FROM lease WHERE key = ?1",
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
    [ST_INSPECT] = "SELECT " ROW_COLS " FROM lease WHERE key = ?1",
    /* Compare bytes, not LIKE patterns: a key may hold '%' or '_'. */
    [ST_LIST] =
        "SELECT " ROW_COLS " FROM lease "
        "WHERE substr(CAST(key AS BLOB), 1, ?2) = ?1 ORDER BY key",
    /* A mark that is not a sound token is never raised over: the read
     * that follows the refusal reports it as malformed. */
    [ST_FENCE_RAISE] =
        "INSERT INTO lease_fence (resource, mark) VALUES (?1, ?2) "
        "ON CONFLICT (resource) DO UPDATE SET mark = excluded.mark "
        "WHERE typeof(lease_fence.mark) = 'integer' AND lease_fence.mark >= 1 "
        "AND lease_fence.mark <= excluded.mark RETURNING mark",
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
    /* A waiter's look once its watch is set: is the key still held? */
    [ST_WAIT_HELD] = "SELECT 1 FROM lease WHERE key = ?1 AND " ALIVE,
};

typedef struct {
    lease_store parent;
    sqlite3 *db;
    sqlite3_stmt *st[ST_COUNT];
    char path[PATH_MAX];
    char boot_id[64];
    int64_t call_deadline; /* lease_clock_ns() at which this call gives up */
    char wake_dir[PATH_MAX]; /* "<file>-wake", absolute; "" when too long */
    mode_t wake_mode;        /* the database file's rw bits, for wake files */
    uid_t wake_uid;          /* the database file's owner */
    int wake_fd;             /* inotify, -1 until the first wait */
} sqlite_store;

/* Every operation (and the open) starts here: the busy waits of all its
 * statements together end at one deadline, so a call that meets the lock
 * several times still ends within the handle's timeout. */
static void sqlite_call_start(sqlite_store *s)
{
    s->call_deadline = lease_clock_ns() + (int64_t)s->parent.timeout_ms * 1000000;
}

/* Called by SQLite while the lock is taken: wait 1-2 ms and try again,
 * until the call's deadline. */
static int sqlite_busy_handler(void *arg, int count)
{
    sqlite_store *s = arg;
    int64_t left = s->call_deadline - lease_clock_ns();
    int64_t pause = 1000000 + (int64_t)(lease__random_u64() % 1000000);

    (void)count;
    if (left <= 0)
        return 0;
    lease__sleep_ns(pause < left ? pause : left);
    return 1;
}

static int sqlite_fail(sqlite_store *s, const char *what)
{
    if ((sqlite3_extended_errcode(s->db) & 0xff) == SQLITE_BUSY)
        return lease__seterr(LEASE_ESTORE,
                             "sqlite %s (%s): another process held the "
                             "database's lock for the whole timeout (%llu ms)",
                             what, s->path, (unsigned long long)s->parent.timeout_ms);
    return lease__seterr(LEASE_ESTORE, "sqlite %s (%s): %s", what, s->path,
                         sqlite3_errmsg(s->db));
}

static void sqlite_now_ms_fn(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    (void)argv;
    sqlite3_result_int64(ctx, lease_clock_ns() / 1000000);
}

/* Wall-clock time for the history, which people read next to other logs. */
static void sqlite_wall_ms_fn(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    struct timespec ts;

    (void)argc;
    (void)argv;
    clock_gettime(CLOCK_REALTIME, &ts);
    sqlite3_result_int64(ctx, (sqlite3_int64)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

static void sqlite_boot_id_fn(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    sqlite_store *s = sqlite3_user_data(ctx);

    (void)argc;
    (void)argv;
    sqlite3_result_text(ctx, s->boot_id, -1, SQLITE_STATIC);
}

static int sqlite_read_boot_id(sqlite_store *s)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
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

static sqlite3_stmt *sqlite_stmt(sqlite_store *s, int which)
{
    sqlite3_stmt *st = s->st[which];

    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return st;
}

/* Run a statement, already bound, whose rows do not matter. */
static int sqlite_exec_st(sqlite_store *s, int which, const char *what)
{
    int rc = sqlite3_step(s->st[which]);

    sqlite3_reset(s->st[which]);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : sqlite_fail(s, what);
}

static int sqlite_begin(sqlite_store *s)
{
    return sqlite_exec_st(s, ST_BEGIN, "begin");
}

static int sqlite_commit(sqlite_store *s)
{
    int rc = sqlite_exec_st(s, ST_COMMIT, "commit");

    if (rc < 0 && !sqlite3_get_autocommit(s->db))
        sqlite_exec_st(s, ST_ROLLBACK, "rollback");
    return rc;
}

/* Roll back and pass `rc` through; keeps the first error's message. */
static int sqlite_rollback(sqlite_store *s, int rc)
{
    if (!sqlite3_get_autocommit(s->db)) {
        sqlite3_reset(s->st[ST_ROLLBACK]);
        sqlite3_step(s->st[ST_ROLLBACK]);
        sqlite3_reset(s->st[ST_ROLLBACK]);
    }
    return rc;
}

/* Where a malformed value was read, for the message. */
typedef struct {
    sqlite_store *s;
    const char *table;
    const char *key; /* the row's key once it is known to be sound */
} sqlite_rowctx;

static int sqlite_bad_row(const sqlite_rowctx *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A malformed row is LEASE_ESTORE naming what was wrong, never a value
 * guessed from it: a token read as 0 would be issued again. */
static int sqlite_bad_row(const sqlite_rowctx *r, const char *fmt, ...)
{
    char what[200];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    if (r->key)
        return lease__seterr(LEASE_ESTORE,
                             "sqlite store %s: malformed row of '%s' in table %s: %s",
                             r->s->path, r->key, r->table, what);
    return lease__seterr(LEASE_ESTORE, "sqlite store %s: malformed row in table %s: %s",
                         r->s->path, r->table, what);
}

static const char *sqlite_type_name(int type)
{
    switch (type) {
    case SQLITE_INTEGER:
        return "an integer";
    case SQLITE_FLOAT:
        return "a real number";
    case SQLITE_TEXT:
        return "text";
    case SQLITE_BLOB:
        return "a blob";
    default:
        return "NULL";
    }
}

/* Column `col` as an INTEGER in [min, max]; SQLite's affinity would
 * otherwise read 'abc' or 2.5 or NULL as some integer. */
static int sqlite_col_int(int64_t *out, const sqlite_rowctx *r, sqlite3_stmt *st,
                          int col, const char *name, int64_t min, int64_t max)
{
    int type = sqlite3_column_type(st, col);

    if (type != SQLITE_INTEGER)
        return sqlite_bad_row(r, "%s is %s, not an integer", name,
                              sqlite_type_name(type));
    *out = sqlite3_column_int64(st, col);
    if (*out < min || *out > max)
        return sqlite_bad_row(r, "%s %lld is out of range [%lld, %lld]", name,
                              (long long)*out, (long long)min, (long long)max);
    return 0;
}

/* Column `col` as TEXT of at most `max` bytes without NUL, into dst (of
 * max + 1 bytes); NULL reads as "" when null_ok. Never truncated: a key or
 * label cut short would name another lease. */
static int sqlite_col_text(char *dst, size_t max, const sqlite_rowctx *r,
                           sqlite3_stmt *st, int col, const char *name, int null_ok)
{
    int type = sqlite3_column_type(st, col);
    const unsigned char *t;
    size_t n;

    dst[0] = '\0';
    if (type == SQLITE_NULL && null_ok)
        return 0;
    if (type != SQLITE_TEXT)
        return sqlite_bad_row(r, "%s is %s, not text", name, sqlite_type_name(type));
    t = sqlite3_column_text(st, col);
    n = (size_t)sqlite3_column_bytes(st, col);
    if (t == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory reading %s", name);
    if (n > max)
        return sqlite_bad_row(r, "%s is %zu bytes long, more than %zu", name, n, max);
    if (memchr(t, '\0', n) != NULL)
        return sqlite_bad_row(r, "%s holds a NUL byte", name);
    memcpy(dst, t, n);
    dst[n] = '\0';
    return 0;
}

/* The owner column: NULL (free) when null_ok, else a UUID. */
static int sqlite_col_owner(char *dst, const sqlite_rowctx *r, sqlite3_stmt *st,
                            int col, int null_ok)
{
    int rc = sqlite_col_text(dst, LEASE_OWNER_LEN, r, st, col, "owner", null_ok);

    if (rc == 0 && sqlite3_column_type(st, col) != SQLITE_NULL &&
        !lease_owner_valid(dst))
        return sqlite_bad_row(r, "owner is not a UUID");
    return rc;
}

/* A fencing token or mark: 1 .. LEASE__TOKEN_MAX. */
static int sqlite_col_token(uint64_t *out, const sqlite_rowctx *r, sqlite3_stmt *st,
                            int col, const char *name)
{
    int64_t v;
    int rc = sqlite_col_int(&v, r, st, col, name, INT64_MIN, INT64_MAX);

    *out = 0;
    if (rc < 0)
        return rc;
    if (!lease__token_ok((uint64_t)v))
        return sqlite_bad_row(r, "%s %lld is out of range [1, %lld]", name,
                              (long long)v, (long long)LEASE__TOKEN_MAX);
    *out = (uint64_t)v;
    return 0;
}

/* Whether a row whose columns are sound is a live lease, and its times. */
static int sqlite_row_times(lease_info *out, const sqlite_rowctx *r, sqlite3_stmt *st)
{
    int64_t expires, ttl, now = sqlite3_column_int64(st, 7);
    const unsigned char *boot;
    int rc;

    if ((rc = sqlite_col_int(&expires, r, st, 4, "expires_ms", INT64_MIN, INT64_MAX)) < 0 ||
        (rc = sqlite_col_int(&ttl, r, st, 5, "ttl_ms", 0, (int64_t)LEASE__MS_MAX)) < 0)
        return rc;
    if (sqlite3_column_type(st, 6) != SQLITE_TEXT)
        return sqlite_bad_row(r, "boot_id is %s, not text",
                              sqlite_type_name(sqlite3_column_type(st, 6)));
    boot = sqlite3_column_text(st, 6);
    out->held = out->owner[0] != '\0' && boot != NULL &&
                strcmp((const char *)boot, r->s->boot_id) == 0 && expires > now;
    if (!out->held)
        return 0;
    /* now >= 0 (CLOCK_BOOTTIME) and expires > now: no overflow. A lease
     * always ends within its ttl of the store's clock; one that ends later
     * was not written by a lease store. */
    if (ttl < 1 || expires - now > ttl)
        return sqlite_bad_row(r, "the lease ends in %lld ms, beyond its ttl_ms of %lld",
                              (long long)(expires - now), (long long)ttl);
    out->remaining_ms = (uint64_t)(expires - now);
    out->ttl_ms = (uint64_t)ttl;
    return 0;
}

/* Columns ROW_COLS: key, owner, label, token, expires_ms, ttl_ms,
 * boot_id, now. */
static int sqlite_row_info(lease_info *out, sqlite_store *s, sqlite3_stmt *st)
{
    sqlite_rowctx r = { s, "lease", NULL };
    int rc;

    memset(out, 0, sizeof(*out));
    if ((rc = sqlite_col_text(out->key, LEASE_KEY_MAX, &r, st, 0, "key", 0)) < 0)
        return rc;
    if (out->key[0] == '\0')
        return sqlite_bad_row(&r, "key is empty");
    r.key = out->key;
    if ((rc = sqlite_col_owner(out->owner, &r, st, 1, 1)) < 0 ||
        (rc = sqlite_col_text(out->label, LEASE_LABEL_MAX, &r, st, 2, "label", 0)) < 0 ||
        (rc = sqlite_col_token(&out->token, &r, st, 3, "token")) < 0)
        return rc;
    return sqlite_row_times(out, &r, st);
}

static int sqlite_user_version(sqlite_store *s, int *version)
{
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(s->db, "PRAGMA user_version", -1, &st, NULL);

    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW)
        *version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? 0 : sqlite_fail(s, "read schema version");
}

/* Does the table exist? A read: no write lock for an up-to-date file. */
static int sqlite_has_table(sqlite_store *s, const char *name, int *yes)
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
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : sqlite_fail(s, "read the schema");
}

static int sqlite_setup(sqlite_store *s, const char *synchronous)
{
    char pragmas[128];
    int version = 0, history = 0, rc, i;

    sqlite3_extended_result_codes(s->db, 1);
    sqlite3_busy_handler(s->db, sqlite_busy_handler, s);
    if (sqlite3_create_function(s->db, "lease_now_ms", 0, SQLITE_UTF8, NULL,
                                sqlite_now_ms_fn, NULL, NULL) != SQLITE_OK ||
        sqlite3_create_function(s->db, "lease_wall_ms", 0, SQLITE_UTF8, NULL,
                                sqlite_wall_ms_fn, NULL, NULL) != SQLITE_OK ||
        sqlite3_create_function(s->db, "lease_boot_id", 0, SQLITE_UTF8, s,
                                sqlite_boot_id_fn, NULL, NULL) != SQLITE_OK)
        return sqlite_fail(s, "create functions");
    /* journal_mode=WAL is a property of the file: switching to it needs the
     * write lock once (the busy timeout lets many first openers queue);
     * once the file is in WAL mode this reads only. */
    snprintf(pragmas, sizeof(pragmas),
             "PRAGMA journal_mode=WAL; PRAGMA synchronous=%s;", synchronous);
    if (sqlite3_exec(s->db, pragmas, NULL, NULL, NULL) != SQLITE_OK)
        return sqlite_fail(s, "set journal mode");

    /* Read the version first: an open of an up-to-date file (every open
     * but the first) takes no write lock, so it is not held up by writers. */
    if ((rc = sqlite_user_version(s, &version)) < 0 ||
        (rc = sqlite_has_table(s, "lease_history", &history)) < 0)
        return rc;
    if (version < SCHEMA_VERSION || !history) {
        if (sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
            return sqlite_fail(s, "open schema transaction");
        if ((rc = sqlite_user_version(s, &version)) < 0) {
            sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
            return rc;
        }
        if (sqlite3_exec(s->db, LEASE_SQLITE_SCHEMA, NULL, NULL, NULL) != SQLITE_OK ||
            (version < 1 &&
             sqlite3_exec(s->db, "PRAGMA user_version = 1", NULL, NULL, NULL) != SQLITE_OK)) {
            rc = sqlite_fail(s, "create schema");
            sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
            return rc;
        }
        if (sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
            rc = sqlite_fail(s, "commit schema");
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
            return sqlite_fail(s, "prepare");
    return 0;
}

static void sqlite_close(lease_store *base)
{
    sqlite_store *s = (sqlite_store *)base;
    int i;

    for (i = 0; i < ST_COUNT; i++)
        sqlite3_finalize(s->st[i]);
    sqlite3_close(s->db);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    s->wake_fd = -1;
}

#define SQLITE_MEMORY_REFUSED \
    "an in-memory SQLite database is refused: a lease store that forgets " \
    "its tokens when the process exits would issue them again; name a file, " \
    "e.g. sqlite:///var/lib/app/lease.db"

/* The URL's path and parameters. Refused: in-memory databases (and
 * sqlite:///:memory:, which other URL readers such as SQLAlchemy take for
 * one), and names SQLite would read as URI filenames (this libsqlite3 may
 * be built with SQLITE_USE_URI): their parameters mode=memory, nolock=1,
 * immutable=1 or vfs= would each break a guarantee of the store. */
static int sqlite_check_url(const lease__url *u)
{
    size_t i;

    if (strcmp(u->hosts, ":memory:") == 0 || strcmp(u->path, ":memory:") == 0 ||
        strcmp(u->path, "/:memory:") == 0 ||
        (strncasecmp(u->path, "file:", 5) == 0 &&
         (strstr(u->path, ":memory:") || strstr(u->path, "mode=memory"))))
        return lease__seterr(LEASE_EINVALID, SQLITE_MEMORY_REFUSED);
    for (i = 0; i < u->nparams; i++)
        if (strcmp(u->params[i].name, "mode") == 0 &&
            strcasecmp(u->params[i].value, "memory") == 0)
            return lease__seterr(LEASE_EINVALID, SQLITE_MEMORY_REFUSED);
    if (u->user != NULL || u->password != NULL)
        return lease__seterr(LEASE_EINVALID,
                             "a sqlite URL has no user or password: the file's "
                             "permissions are what protects it");
    if (u->hosts[0] != '\0')
        return lease__seterr(LEASE_EINVALID,
                             "a sqlite URL names a file, not a host: use "
                             "sqlite:relative/path.db or sqlite:///absolute/path.db");
    if (u->path[0] == '\0')
        return lease__seterr(LEASE_EINVALID,
                             "a sqlite URL needs the path of a file, e.g. "
                             "sqlite:relative/path.db or sqlite:///absolute/path.db "
                             "(SQLite reads an empty name as a temporary database)");
    if (strlen(u->path) >= PATH_MAX)
        return lease__seterr(LEASE_EINVALID, "the sqlite URL's path is too long");
    if (strncasecmp(u->path, "file:", 5) == 0)
        return lease__seterr(LEASE_EINVALID,
                             "SQLite URI filenames (file:...) are refused: their "
                             "parameters (mode, nolock, immutable, vfs) could break "
                             "the store; write the path itself (./file:... for a "
                             "file whose name starts with 'file:')");
    for (i = 0; i < u->nparams; i++)
        if (strcmp(u->params[i].name, "tokens") == 0)
            return lease__url_tokens_refused("an SQLite file has no replica "
                                             "that could issue a token again");
        else if (strcmp(u->params[i].name, "synchronous") != 0)
            return lease__seterr(LEASE_EINVALID, "unknown sqlite URL parameter '%s'",
                                 u->params[i].name);
    return 0;
}

/* The file's path into path[PATH_MAX] and the synchronous= level. */
static int sqlite_parse_url(char *path, const char **sync, const char *url)
{
    lease__url u;
    const char *v;
    int rc;

    if ((rc = lease__url_parse(&u, url)) < 0)
        return rc;
    if ((rc = sqlite_check_url(&u)) < 0) {
        lease__url_free(&u);
        return rc;
    }
    v = lease__url_param(&u, "synchronous");
    if (v == NULL || strcasecmp(v, "full") == 0)
        *sync = "FULL";
    else if (strcasecmp(v, "extra") == 0)
        *sync = "EXTRA";
    else if (strcasecmp(v, "normal") == 0)
        *sync = "NORMAL";
    else
        rc = lease__seterr(LEASE_EINVALID,
                           "sqlite synchronous= must be full, extra or normal");
    lease__strlcpy(path, u.path, PATH_MAX);
    lease__url_free(&u);
    return rc;
}

/* `path` (shown as `shown`) absent (*exists 0) or a regular file that is
 * not a symlink. */
static int sqlite_check_entry(int *exists, const char *shown, const char *path)
{
    struct stat st;

    *exists = 0;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        return lease__seterr(LEASE_ESTORE, "cannot open sqlite store %s: %s",
                             shown, strerror(errno));
    }
    *exists = 1;
    if (S_ISLNK(st.st_mode))
        return lease__seterr(LEASE_ESTORE,
                             "sqlite store %s is a symbolic link: refused (a planted "
                             "link would make the store write into another file); "
                             "name the file itself", shown);
    if (!S_ISREG(st.st_mode))
        return lease__seterr(LEASE_ESTORE, "sqlite store %s is not a regular file",
                             shown);
    return 0;
}

/* The file to hand SQLite: its directory resolved (a symlinked directory
 * such as /var/run is fine: who can swap it can write the directory
 * anyway), the last component kept, so SQLITE_OPEN_NOFOLLOW, which also
 * refuses symlinks among the directories, only meets the file itself. */
static int sqlite_resolve_path(char *out, const char *path)
{
    char dir[PATH_MAX], real[PATH_MAX];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;

    if (*base == '\0' || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
        return lease__seterr(LEASE_EINVALID,
                             "sqlite store %s names a directory, not a file", path);
    if (slash == NULL)
        strcpy(dir, ".");
    else if (slash == path)
        strcpy(dir, "/");
    else
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    if (realpath(dir, real) == NULL)
        return lease__seterr(LEASE_ESTORE, "cannot open sqlite store %s: %s: %s",
                             path, dir, strerror(errno));
    if (snprintf(out, PATH_MAX, "%s/%s", strcmp(real, "/") == 0 ? "" : real,
                 base) >= PATH_MAX)
        return lease__seterr(LEASE_EINVALID, "sqlite store %s: path too long", path);
    return 0;
}

/*
 * Make `file` (resolved) ready for SQLite: absent, it is created 0600 (its
 * -wal, -shm and -journal files then get the same mode: SQLite gives them
 * the mode, and as root the owner, of the database file); present, it must
 * be a regular file, not a symlink, and so must the side files. SQLite
 * itself opens all of them with O_NOFOLLOW. What remains: whoever can write
 * the directory can replace the file by another regular file between these
 * checks and SQLite's open; sqlite_check_header() then reads through
 * SQLite's own descriptor, so a foreign file is still refused unwritten.
 */
static int sqlite_prepare_file(const char *shown, const char *file)
{
    static const char *const side[] = { "-wal", "-shm", "-journal" };
    char other[PATH_MAX + 16];
    int exists, rc, fd;
    size_t i;

    if ((rc = sqlite_check_entry(&exists, shown, file)) < 0)
        return rc;
    if (!exists) {
        /* O_EXCL | O_NOFOLLOW: a link planted meanwhile is not followed.
         * Closing at once is safe for SQLite's POSIX locks, which any
         * close() of the file drops: a file this call just created holds
         * none of this process yet. */
        fd = open(file, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST)
            return lease__seterr(LEASE_ESTORE, "cannot create sqlite store %s: %s",
                                 shown, strerror(errno));
        if (fd >= 0)
            close(fd);
        if ((rc = sqlite_check_entry(&exists, shown, file)) < 0)
            return rc;
    }
    for (i = 0; i < sizeof(side) / sizeof(side[0]); i++) {
        snprintf(other, sizeof(other), "%s%s", file, side[i]);
        if ((rc = sqlite_check_entry(&exists, other, other)) < 0)
            return rc;
    }
    return 0;
}

/* SQLite's own header check, made before any statement can write: a
 * non-empty file that does not start with "SQLite format 3\0" is refused.
 * Read through SQLite's descriptor, so the file checked is the file that
 * would be written. */
static int sqlite_check_header(sqlite_store *s)
{
    static const char magic[16] = "SQLite format 3";
    sqlite3_file *f = NULL;
    sqlite3_int64 size = 0;
    char head[16];

    if (sqlite3_file_control(s->db, "main", SQLITE_FCNTL_FILE_POINTER, &f) != SQLITE_OK ||
        f == NULL || f->pMethods == NULL || f->pMethods->xFileSize(f, &size) != SQLITE_OK)
        return lease__seterr(LEASE_ESTORE, "cannot open sqlite store %s: "
                             "cannot read its size", s->path);
    if (size == 0)
        return 0;
    if (size < (sqlite3_int64)sizeof(head) ||
        f->pMethods->xRead(f, head, (int)sizeof(head), 0) != SQLITE_OK ||
        memcmp(head, magic, sizeof(head)) != 0)
        return lease__seterr(LEASE_ESTORE,
                             "sqlite store %s is not an SQLite database (it does not "
                             "start with \"SQLite format 3\"): refused, nothing was "
                             "written to it", s->path);
    return 0;
}

/* Where the wake files of `file` (resolved, absolute) go, and their mode:
 * the database's own read and write bits, so whoever may release there
 * may touch them. No wake dir (polling only) when the path is too long. */
static void sqlite_wake_setup(sqlite_store *s, const char *file)
{
    struct stat st;
    int n = snprintf(s->wake_dir, sizeof(s->wake_dir), "%s-wake", file);

    if (n < 0 || (size_t)n >= sizeof(s->wake_dir) - 4)
        s->wake_dir[0] = '\0';
    s->wake_mode = stat(file, &st) == 0 ? (st.st_mode & 0666) | 0600 : 0600;
    s->wake_uid = stat(file, &st) == 0 ? st.st_uid : geteuid();
}

static int sqlite_open(lease_store *base, const char *url)
{
    char file[PATH_MAX];
    const char *sync = "FULL";
    sqlite_store *s = (sqlite_store *)base;
    int rc;

    s->wake_fd = -1;
    if ((rc = sqlite_parse_url(s->path, &sync, url)) < 0 ||
        (rc = sqlite_resolve_path(file, s->path)) < 0 ||
        (rc = sqlite_read_boot_id(s)) < 0 || (rc = sqlite_prepare_file(s->path, file)) < 0)
        return rc;
    /* The whole open (its lock waits included) is one call. */
    sqlite_call_start(s);
    if (sqlite3_open_v2(file, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOFOLLOW |
                                          SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        if (s->db && sqlite3_extended_errcode(s->db) == SQLITE_CANTOPEN_SYMLINK)
            rc = lease__seterr(LEASE_ESTORE, "sqlite store %s became a symbolic "
                               "link while it was opened: refused", s->path);
        else
            rc = lease__seterr(LEASE_ESTORE, "cannot open sqlite store %s: %s", s->path,
                               s->db ? sqlite3_errmsg(s->db) : "out of memory");
        sqlite_close(&s->parent);
        return rc;
    }
    if ((rc = sqlite_check_header(s)) < 0 || (rc = sqlite_setup(s, sync)) < 0) {
        sqlite_close(&s->parent);
        return rc;
    }
    sqlite_wake_setup(s, file);
    return 0;
}

/* The holder retried its own acquire (its answer was lost): same token,
 * expiry anew, so the holder's new local deadline is covered. */
static int sqlite_acquire_extend(lease_grant *out, sqlite_store *s,
                                 const lease_request *req, uint64_t token)
{
    sqlite3_stmt *st = sqlite_stmt(s, ST_ACQ_EXTEND);
    int rc;

    sqlite3_bind_text(st, 1, req->key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)req->ttl_ms);
    sqlite3_bind_text(st, 3, req->label, -1, SQLITE_STATIC);
    if ((rc = sqlite_exec_st(s, ST_ACQ_EXTEND, "acquire")) < 0)
        return sqlite_rollback(s, rc);
    if ((rc = sqlite_commit(s)) < 0)
        return rc;
    out->token = token;
    out->ttl_ms = req->ttl_ms;
    return 0;
}

/* A new grant with token + 1 and its history entry, in the open
 * transaction; `token` is the key's last one (0 for a new key). */
static int sqlite_acquire_grant(lease_grant *out, sqlite_store *s,
                                const lease_request *req, uint64_t token)
{
    sqlite3_stmt *st;
    int rc;

    if (!lease__token_ok(token + 1))
        return sqlite_rollback(s, lease__seterr(LEASE_ESTORE,
                                         "token counter of '%s' is exhausted",
                                         req->key));
    /* The previous grant, if it did not end otherwise, expired. */
    st = sqlite_stmt(s, ST_HIST_EXPIRE);
    sqlite3_bind_text(st, 1, req->key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)token);
    if ((rc = sqlite_exec_st(s, ST_HIST_EXPIRE, "acquire")) < 0)
        return sqlite_rollback(s, rc);
    st = sqlite_stmt(s, ST_ACQ_GRANT);
    sqlite3_bind_text(st, 1, req->key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, req->owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, req->label, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)(token + 1));
    sqlite3_bind_int64(st, 5, (sqlite3_int64)req->ttl_ms);
    if ((rc = sqlite_exec_st(s, ST_ACQ_GRANT, "acquire")) < 0)
        return sqlite_rollback(s, rc);
    st = sqlite_stmt(s, ST_HIST_ADD);
    sqlite3_bind_text(st, 1, req->key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)(token + 1));
    sqlite3_bind_text(st, 3, req->owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, req->label, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, (sqlite3_int64)req->ttl_ms);
    if ((rc = sqlite_exec_st(s, ST_HIST_ADD, "acquire")) < 0)
        return sqlite_rollback(s, rc);
    if (token + 1 > LEASE_HISTORY_KEEP) {
        st = sqlite_stmt(s, ST_HIST_PRUNE);
        sqlite3_bind_text(st, 1, req->key, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, (sqlite3_int64)(token + 1 - LEASE_HISTORY_KEEP));
        if ((rc = sqlite_exec_st(s, ST_HIST_PRUNE, "acquire")) < 0)
            return sqlite_rollback(s, rc);
    }
    if ((rc = sqlite_commit(s)) < 0)
        return rc;
    out->token = token + 1;
    out->ttl_ms = req->ttl_ms;
    return 0;
}

static int sqlite_acquire(lease_grant *out, lease_info *holder,
                          lease_store *base, const lease_request *req)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st;
    lease_info row;
    int rc, step;

    sqlite_call_start(s);
    if ((rc = sqlite_begin(s)) < 0)
        return rc;
    memset(&row, 0, sizeof(row));
    st = sqlite_stmt(s, ST_ACQ_READ);
    sqlite3_bind_text(st, 1, req->key, -1, SQLITE_STATIC);
    step = sqlite3_step(st);
    if (step == SQLITE_ROW)
        rc = sqlite_row_info(&row, s, st);
    else if (step != SQLITE_DONE)
        rc = sqlite_fail(s, "acquire");
    sqlite3_reset(st);
    if (rc < 0)
        return sqlite_rollback(s, rc);
    if (row.held && strcmp(row.owner, req->owner) == 0)
        return sqlite_acquire_extend(out, s, req, row.token);
    if (row.held) {
        *holder = row;
        return sqlite_rollback(s, LEASE_EBUSY);
    }
    return sqlite_acquire_grant(out, s, req, row.token);
}

/* Inside an open transaction: extend (key, owner, token) when it is the
 * live lease, else LEASE_ELOST without a message (the caller says it; a
 * batch would otherwise format one per refused grant). The one renew of
 * this store, shared by renew and renew_many so that both decide alike. */
static int sqlite_renew_in_txn(sqlite_store *s, const char *key, const char *owner,
                               uint64_t token, uint64_t ttl_ms)
{
    sqlite3_stmt *st = sqlite_stmt(s, ST_RENEW);
    int rc;

    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)token);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)ttl_ms);
    if ((rc = sqlite_exec_st(s, ST_RENEW, "renew")) < 0)
        return rc;
    return sqlite3_changes(s->db) == 1 ? 0 : LEASE_ELOST;
}

static int sqlite_renew(uint64_t *granted_ms, lease_store *base,
                        const char *key, const char *owner, uint64_t token,
                        uint64_t ttl_ms)
{
    sqlite_store *s = (sqlite_store *)base;
    int rc;

    /* IMMEDIATE first, so lease_now_ms() is read after the lock is held:
     * a renew that waited on the lock must not revive a lease that
     * expired meanwhile. */
    sqlite_call_start(s);
    if ((rc = sqlite_begin(s)) < 0)
        return rc;
    rc = sqlite_renew_in_txn(s, key, owner, token, ttl_ms);
    if (rc == LEASE_ELOST)
        rc = lease__not_holder("renew", key, token, NULL);
    if (rc < 0)
        return sqlite_rollback(s, rc);
    if ((rc = sqlite_commit(s)) < 0)
        return rc;
    *granted_ms = ttl_ms;
    return 0;
}

/*
 * Every grant renewed as sqlite_renew would, in one transaction: one wait
 * for the lock (bounded by the call's deadline) and one sync to disk for
 * the whole batch. A refused grant changes nothing, so the others are
 * still committed; any other failure rolls the whole batch back, and no
 * result is then meaningful. Renew writes no history on this store, so
 * neither does this.
 */
static int sqlite_renew_many(int *results, uint64_t *granted_ms, lease_store *base,
                             const lease_grant *grants, size_t n, uint64_t ttl_ms)
{
    sqlite_store *s = (sqlite_store *)base;
    size_t i;
    int rc;

    sqlite_call_start(s);
    if ((rc = sqlite_begin(s)) < 0)
        return rc;
    for (i = 0; i < n; i++) {
        rc = sqlite_renew_in_txn(s, grants[i].key, grants[i].owner,
                                 grants[i].token, ttl_ms);
        if (rc < 0 && rc != LEASE_ELOST)
            return sqlite_rollback(s, rc);
        results[i] = rc;
        granted_ms[i] = rc == 0 ? ttl_ms : 0;
    }
    return sqlite_commit(s);
}

/*
 * Wake files: how a release wakes the waiters of its key on this host.
 *
 * Next to the database, the directory "<file>-wake" holds one empty file
 * per bucket of keys (WAKE_BUCKETS, named by a hash of the key). A waiter
 * creates its key's file if needed, watches it with inotify, then looks
 * once more whether the key is held, and sleeps in poll() until the file
 * is touched or its pause ends. A release touches the file (utimensat,
 * one syscall, no fsync) after its commit: since the watch is set before
 * that last look, a release either commits before the look (which then
 * sees the key free) or touches the file after the watch exists, so no
 * release falls between the two.
 *
 * Nothing here can block anyone: a waiter that dies takes its inotify
 * descriptor (and with it its watch) to the kernel's grave; a file that
 * nobody watches costs a release one syscall. When the files cannot be
 * made or watched (a read-only directory, another user's files, no
 * inotify left), the waiter sleeps out its pause instead: that is the
 * polling with backoff of a store without notification, with no error.
 * Every wait stays bounded by the pause the core gives it, so a lost or
 * forged touch costs at most one pause, and a spurious one an extra try.
 * Several keys share a bucket: a release may wake the waiters of another
 * key, which simply try again.
 */
#define WAKE_BUCKETS 256u
#define WAKE_EVENTS (IN_ATTRIB | IN_MODIFY | IN_CLOSE_WRITE | IN_DELETE_SELF | \
                     IN_MOVE_SELF)

/* "<bucket>", the name of key's file in the wake directory, into
 * out[size]; -1 without a wake dir. */
static int sqlite_wake_name(char *out, size_t size, const sqlite_store *s,
                            const char *key)
{
    uint32_t h = 2166136261u; /* FNV-1a: stable across processes and builds */
    const unsigned char *p;
    int n;

    if (s->wake_dir[0] == '\0')
        return -1;
    for (p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 16777619u;
    n = snprintf(out, size, "%02x", (unsigned)(h % WAKE_BUCKETS));
    return n > 0 && (size_t)n < size ? 0 : -1;
}

/* The wake directory, opened without following a link, if it is one the
 * database's users made: owned by us or by the database's owner, and
 * writable by no one the database itself does not let write. Another's
 * directory (made first where others may create files) could be used to
 * hide releases or to watch them: -1, and waiters poll. */
static int sqlite_wake_dir(const sqlite_store *s)
{
    struct stat st;
    int dir = open(s->wake_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

    if (dir >= 0 && (fstat(dir, &st) != 0 ||
                     (st.st_uid != geteuid() && st.st_uid != s->wake_uid) ||
                     ((st.st_mode & 0022) & ~((s->wake_mode & 0066) >> 1)))) {
        close(dir);
        dir = -1;
    }
    return dir;
}

/* After a committed release: wake whoever watches key's file. Failure
 * (no such file: nobody ever waited; not ours to touch) is not an error:
 * the waiters' polling still finds the key free. */
static void sqlite_wake(const sqlite_store *s, const char *key)
{
    char name[8];
    int dir;

    if (sqlite_wake_name(name, sizeof(name), s, key) == 0 &&
        (dir = sqlite_wake_dir(s)) >= 0) {
        (void)utimensat(dir, name, NULL, AT_SYMLINK_NOFOLLOW);
        close(dir);
    }
}

/* Open (creating it if needed) key's wake file without following a link
 * planted in its place, as a descriptor on a regular file; -1 if not. */
static int sqlite_wake_open(const sqlite_store *s, const char *key)
{
    mode_t dmode = s->wake_mode | ((s->wake_mode & 0444) >> 2);
    char name[8];
    struct stat st;
    int dir, fd;

    if (sqlite_wake_name(name, sizeof(name), s, key) < 0)
        return -1;
    if (mkdir(s->wake_dir, dmode) != 0 && errno != EEXIST)
        return -1;
    if ((dir = sqlite_wake_dir(s)) < 0)
        return -1;
    /* The umask narrowed what mkdir and O_CREAT gave: the other users of
     * the database (a shared group) must be able to create and touch the
     * files too, as SQLite does for its -wal and -shm files. Only ours. */
    if (fstat(dir, &st) == 0 && st.st_uid == geteuid() && (st.st_mode & 0777) != dmode)
        (void)fchmod(dir, dmode);
    /* O_NONBLOCK: a FIFO put there must not hang the open. */
    fd = openat(dir, name, O_RDONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                s->wake_mode);
    close(dir);
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        return -1;
    }
    if (fd >= 0 && st.st_uid == geteuid() && (st.st_mode & 0777) != s->wake_mode)
        (void)fchmod(fd, s->wake_mode);
    return fd;
}

/* A watch on key's wake file (its wd), or -1 when waking cannot work here. */
static int sqlite_wake_watch(sqlite_store *s, const char *key)
{
    char proc[64];
    int fd, wd;

    if (s->wake_dir[0] == '\0' || (fd = sqlite_wake_open(s, key)) < 0)
        return -1;
    /* One inotify instance per wait, not per handle: a user has few of
     * them (128 by default, for all their programs), and a handle that
     * waited once may live long. */
    if (s->wake_fd < 0 && (s->wake_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) < 0) {
        close(fd);
        return -1;
    }
    /* Through /proc: the watch is on the very file just checked. */
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
    wd = inotify_add_watch(s->wake_fd, proc, WAKE_EVENTS);
    close(fd);
    return wd;
}

/* Read every queued event; 1 if one is for `wd` (or the queue overflowed,
 * which may have dropped one). */
static int sqlite_wake_drain(sqlite_store *s, int wd)
{
    union {
        struct inotify_event ev;
        char buf[4096];
    } u;
    struct inotify_event ev;
    ssize_t n;
    size_t off;
    int hit = 0;

    while ((n = read(s->wake_fd, u.buf, sizeof(u.buf))) > 0) {
        for (off = 0; off + sizeof(ev) <= (size_t)n; off += sizeof(ev) + ev.len) {
            memcpy(&ev, u.buf + off, sizeof(ev));
            if (ev.wd == wd || (ev.mask & IN_Q_OVERFLOW))
                hit = 1;
        }
    }
    return hit;
}

/* Is key held right now? An unreadable answer counts as held: the wait
 * that follows is bounded anyway. */
static int sqlite_wait_held(sqlite_store *s, const char *key)
{
    sqlite3_stmt *st = sqlite_stmt(s, ST_WAIT_HELD);
    int step;

    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    step = sqlite3_step(st);
    sqlite3_reset(st);
    return step != SQLITE_DONE;
}

/* Sleep in poll() until a touch of `wd` finds key free (0) or `end`
 * passes (ETIMEOUT). A touch for another key of the bucket, or a key taken
 * again at once, costs a read, not a write transaction. */
static int sqlite_wake_poll(sqlite_store *s, const char *key, int wd, int64_t end)
{
    struct pollfd p;
    int64_t left;
    int n;

    for (;;) {
        left = end - lease_clock_ns();
        if (left <= 0)
            return LEASE_ETIMEOUT;
        p.fd = s->wake_fd;
        p.events = POLLIN;
        p.revents = 0;
        left = (left + 999999) / 1000000;
        n = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
        if (n < 0 && errno != EINTR) {
            lease__sleep_ns(end - lease_clock_ns());
            return LEASE_ETIMEOUT;
        }
        if (n > 0 && sqlite_wake_drain(s, wd) && !sqlite_wait_held(s, key))
            return 0;
    }
}

/* The wait_release slot: woken by a release of key's bucket, or by the
 * key found free, within timeout_ms (the core's pause). */
static int sqlite_wait_release(lease_store *base, const char *key,
                               uint64_t timeout_ms)
{
    sqlite_store *s = (sqlite_store *)base;
    int64_t end = lease_clock_ns() + (int64_t)timeout_ms * 1000000;
    int wd, rc;

    if (key == NULL)
        return lease__seterr(LEASE_EINVALID, "key is NULL");
    sqlite_call_start(s);
    if ((wd = sqlite_wake_watch(s, key)) < 0) {
        if (s->wake_fd >= 0)
            close(s->wake_fd);
        s->wake_fd = -1;
        lease__sleep_ns(end - lease_clock_ns());
        return LEASE_ETIMEOUT;
    }
    /* Events queued before the look are covered by it. */
    (void)sqlite_wake_drain(s, -2);
    rc = sqlite_wait_held(s, key) ? sqlite_wake_poll(s, key, wd, end) : 0;
    close(s->wake_fd);
    s->wake_fd = -1;
    return rc;
}

static int sqlite_release(lease_store *base, const char *key,
                          const char *owner, uint64_t token)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st;
    int rc;

    sqlite_call_start(s);
    if ((rc = sqlite_begin(s)) < 0)
        return rc;
    st = sqlite_stmt(s, ST_RELEASE);
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)token);
    if ((rc = sqlite_exec_st(s, ST_RELEASE, "release")) < 0)
        return sqlite_rollback(s, rc);
    if (sqlite3_changes(s->db) != 1)
        return sqlite_rollback(s, lease__not_holder("release", key, token, NULL));
    st = sqlite_stmt(s, ST_HIST_RELEASE);
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)token);
    sqlite3_bind_text(st, 3, owner, -1, SQLITE_STATIC);
    if ((rc = sqlite_exec_st(s, ST_HIST_RELEASE, "release")) < 0)
        return sqlite_rollback(s, rc);
    if ((rc = sqlite_commit(s)) < 0)
        return rc;
    sqlite_wake(s, key);
    return 0;
}

/* One row of ST_HIST_READ: token, owner, label, ttl_ms, acquired_ms,
 * ended, ended_ms, then (computed) whether it is the live lease and when
 * it expired. */
static int sqlite_row_history(lease_history_entry *e, sqlite_store *s,
                              sqlite3_stmt *st, const char *key)
{
    sqlite_rowctx r = { s, "lease_history", key };
    int64_t ttl, ended;
    int rc;

    memset(e, 0, sizeof(*e));
    if ((rc = sqlite_col_token(&e->token, &r, st, 0, "token")) < 0 ||
        (rc = sqlite_col_owner(e->owner, &r, st, 1, 0)) < 0 ||
        (rc = sqlite_col_text(e->label, LEASE_LABEL_MAX, &r, st, 2, "label", 0)) < 0 ||
        (rc = sqlite_col_int(&ttl, &r, st, 3, "ttl_ms", 0, (int64_t)LEASE__MS_MAX)) < 0 ||
        (rc = sqlite_col_int(&e->acquired_ms, &r, st, 4, "acquired_ms", 0, INT64_MAX)) < 0 ||
        (rc = sqlite_col_int(&ended, &r, st, 5, "ended", LEASE_ENDED_HELD,
                             LEASE_ENDED_LOST)) < 0 ||
        (rc = sqlite_col_int(&e->ended_ms, &r, st, 6, "ended_ms", 0, INT64_MAX)) < 0)
        return rc;
    e->ttl_ms = (uint64_t)ttl;
    e->ended = (lease_ended)ended;
    /* Not ended by anyone, and no longer the live lease: it ran out,
     * at the expiry the lease row still has (WALL_EXPIRY: 0 if unknown). */
    if (e->ended == LEASE_ENDED_HELD && !sqlite3_column_int(st, 7)) {
        e->ended = LEASE_ENDED_EXPIRED;
        e->ended_ms = sqlite3_column_int64(st, 8);
        if (e->ended_ms < 0)
            e->ended_ms = 0;
    }
    return 0;
}

static int sqlite_history(lease_history_entry *out, size_t *n, lease_store *base,
                          const char *key, size_t max)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st = sqlite_stmt(s, ST_HIST_READ);
    int step = SQLITE_DONE, rc = 0;

    sqlite_call_start(s);
    *n = 0;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)max);
    while (*n < max && (step = sqlite3_step(st)) == SQLITE_ROW)
        if ((rc = sqlite_row_history(&out[(*n)++], s, st, key)) < 0)
            break;
    if (rc == 0 && *n < max && step != SQLITE_DONE)
        rc = sqlite_fail(s, "history");
    sqlite3_reset(st);
    if (rc < 0)
        *n = 0;
    return rc;
}

static int sqlite_history_lost(lease_store *base, const char *key, const char *owner,
                               uint64_t token)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st = sqlite_stmt(s, ST_HIST_LOST);

    sqlite_call_start(s);
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)token);
    sqlite3_bind_text(st, 3, owner, -1, SQLITE_STATIC);
    return sqlite_exec_st(s, ST_HIST_LOST, "history");
}

static int sqlite_inspect(lease_info *out, lease_store *base, const char *key)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st = sqlite_stmt(s, ST_INSPECT);
    int step, rc;

    sqlite_call_start(s);
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    step = sqlite3_step(st);
    if (step == SQLITE_ROW)
        rc = sqlite_row_info(out, s, st);
    else if (step == SQLITE_DONE)
        rc = lease__seterr(LEASE_ENOTFOUND, "'%s' was never acquired", key);
    else
        rc = sqlite_fail(s, "inspect");
    sqlite3_reset(st);
    return rc;
}

static int sqlite_list(lease_store *base, const char *prefix, lease_list_cb cb,
                       void *payload)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st = sqlite_stmt(s, ST_LIST);
    lease_info info;
    int step, rc = 0;

    sqlite_call_start(s);
    sqlite3_bind_blob(st, 1, prefix, (int)strlen(prefix), SQLITE_STATIC);
    sqlite3_bind_int(st, 2, (int)strlen(prefix));
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        if ((rc = sqlite_row_info(&info, s, st)) < 0 ||
            (rc = cb(&info, payload)) != 0)
            break;
    }
    if (rc == 0 && step != SQLITE_DONE)
        rc = sqlite_fail(s, "list");
    sqlite3_reset(st);
    return rc;
}

static int sqlite_read_mark(uint64_t *mark, sqlite_store *s, const char *resource)
{
    sqlite_rowctx r = { s, "lease_fence", resource };
    sqlite3_stmt *st = sqlite_stmt(s, ST_FENCE_MARK);
    int step, rc;

    sqlite3_bind_text(st, 1, resource, -1, SQLITE_STATIC);
    step = sqlite3_step(st);
    if (step == SQLITE_ROW)
        rc = sqlite_col_token(mark, &r, st, 0, "mark");
    else if (step == SQLITE_DONE)
        rc = lease__seterr(LEASE_ENOTFOUND, "'%s' has no fencing mark", resource);
    else
        rc = sqlite_fail(s, "read fencing mark");
    sqlite3_reset(st);
    return rc;
}

static int sqlite_fence_advance(uint64_t *mark, lease_store *base,
                                const char *resource, uint64_t token)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st;
    int rc, step;

    sqlite_call_start(s);
    if ((rc = sqlite_begin(s)) < 0)
        return rc;
    st = sqlite_stmt(s, ST_FENCE_RAISE);
    sqlite3_bind_text(st, 1, resource, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)token);
    step = sqlite3_step(st);
    if (step == SQLITE_ROW) {
        sqlite_rowctx r = { s, "lease_fence", resource };

        if ((rc = sqlite_col_token(mark, &r, st, 0, "mark")) < 0) {
            sqlite3_reset(st);
            return sqlite_rollback(s, rc);
        }
        /* Step to the end so the statement's write is complete. */
        step = sqlite3_step(st);
    }
    if (step != SQLITE_DONE) {
        rc = sqlite_fail(s, "fence");
        sqlite3_reset(st);
        return sqlite_rollback(s, rc);
    }
    sqlite3_reset(st);
    if (sqlite3_changes(s->db) == 1)
        return sqlite_commit(s);
    /* The upsert's WHERE refused: the mark is above the token. */
    rc = sqlite_read_mark(mark, s, resource);
    return sqlite_rollback(s, rc < 0 ? rc : LEASE_ESTALE);
}

static int sqlite_fence_mark(uint64_t *mark, lease_store *base,
                             const char *resource)
{
    sqlite_store *s = (sqlite_store *)base;

    sqlite_call_start(s);
    return sqlite_read_mark(mark, s, resource);
}

/* Inside an open transaction: is (key, owner, token) the live lease? */
static int sqlite_check_holder(sqlite_store *s, const char *key, const char *owner,
                        uint64_t token)
{
    sqlite3_stmt *st = sqlite_stmt(s, ST_CHECK_HOLDER);
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
    return sqlite_fail(s, "check lease");
}

static int sqlite_guarded_put(lease_store *base, const char *key,
                              const char *owner, uint64_t token,
                              const char *name, const void *value, size_t len)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st;
    int rc;

    sqlite_call_start(s);
    if ((rc = sqlite_begin(s)) < 0)
        return rc;
    if ((rc = sqlite_check_holder(s, key, owner, token)) < 0)
        return sqlite_rollback(s, rc);
    st = sqlite_stmt(s, ST_DATA_PUT);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_blob64(st, 2, value, len, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)token);
    sqlite3_bind_text(st, 4, key, -1, SQLITE_STATIC);
    if ((rc = sqlite_exec_st(s, ST_DATA_PUT, "guarded put")) < 0)
        return sqlite_rollback(s, rc);
    return sqlite_commit(s);
}

/* A lease_data row: the value (a BLOB as written, or TEXT) and its token. */
static int sqlite_row_data(void **value, size_t *len, uint64_t *token,
                           sqlite_store *s, sqlite3_stmt *st, const char *name)
{
    sqlite_rowctx r = { s, "lease_data", name };
    int type = sqlite3_column_type(st, 0);
    uint64_t tok;
    const void *v;
    size_t n;
    char *copy;
    int rc;

    if (type != SQLITE_BLOB && type != SQLITE_TEXT)
        return sqlite_bad_row(&r, "value is %s, not a blob", sqlite_type_name(type));
    if ((rc = sqlite_col_token(&tok, &r, st, 1, "token")) < 0)
        return rc;
    v = sqlite3_column_blob(st, 0);
    n = (size_t)sqlite3_column_bytes(st, 0);
    if ((copy = malloc(n + 1)) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    if (n)
        memcpy(copy, v, n);
    copy[n] = '\0';
    *value = copy;
    *len = n;
    if (token)
        *token = tok;
    return 0;
}

static int sqlite_data_get(void **value, size_t *len, uint64_t *token,
                           lease_store *base, const char *name)
{
    sqlite_store *s = (sqlite_store *)base;
    sqlite3_stmt *st = sqlite_stmt(s, ST_DATA_GET);
    int step, rc;

    sqlite_call_start(s);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    step = sqlite3_step(st);
    if (step == SQLITE_ROW)
        rc = sqlite_row_data(value, len, token, s, st, name);
    else if (step == SQLITE_DONE)
        rc = lease__seterr(LEASE_ENOTFOUND, "no data named '%s'", name);
    else
        rc = sqlite_fail(s, "read data");
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
    sqlite_call_start(s);
    if ((rc = sqlite_begin(s)) < 0)
        return rc;
    if ((rc = sqlite_check_holder(s, key, owner, token)) < 0)
        return sqlite_rollback(s, rc);
    rc = cb(s->db, payload);
    if (rc != 0)
        return sqlite_rollback(s, rc);
    if (sqlite3_get_autocommit(s->db))
        return lease__seterr(LEASE_ESTORE,
                             "the transaction ended inside the callback "
                             "(an error rolled it back); nothing is known to "
                             "be written");
    return sqlite_commit(s);
}


/* For lease --version: the SQLite this process runs, not the one it was
 * compiled against. */
int lease__sqlite_client_version(char *buf, size_t size)
{
    return snprintf(buf, size, "SQLite %s", sqlite3_libversion());
}

const lease_backend lease__sqlite_backend = {
    .version = LEASE_BACKEND_VERSION,
    .name = "sqlite",
    .schemes = lease__sqlite_schemes,
    .features = LEASE_FEATURE_TXN | LEASE_FEATURE_RENEW_MANY | LEASE_FEATURE_NOTIFY,
    .store_size = sizeof(sqlite_store),
    .open3 = sqlite_open,
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
    .wait_release = sqlite_wait_release,
    .renew_many = sqlite_renew_many,
    .set_timeout = NULL, /* each call reads parent.timeout_ms */
    .history = sqlite_history,
    .history_lost = sqlite_history_lost,
};
