/*
 * pg_store_txn.c - work done under a lease inside PostgreSQL: the guarded
 * transaction (the row locked, commit and rollback, timeouts), fencing on
 * the resource's side (the reference SQL's rebuild_state), and advisory
 * locks with their key (FNV-1a, computed here independently).
 */
#include "pg_store.h"

/* ======================================================================
 * lease_guarded_txn
 * ====================================================================== */

typedef struct txn_probe {
    PGconn *other;      /* another connection of ours */
    const char *key;
    const char *table;  /* a scratch table to write into */
    const char *value;
    int calls;
    int in_txn;
    char nowait_state[8]; /* SQLSTATE of FOR UPDATE NOWAIT on the lease row */
    char lock_timeout[32];
    char statement_timeout[32];
    int ret;            /* what the callback returns */
    const char *extra_sql; /* run after the insert (may fail on purpose) */
    char extra_state[8];
    int64_t extra_ms;
    int64_t sleep_ms;   /* client-side, after the writes: no statement runs */
} txn_probe;

static void show(PGconn *c, const char *what, char *out, size_t size)
{
    char sql[64];
    PGresult *r;

    snprintf(sql, sizeof(sql), "SHOW %s", what);
    r = PQexec(c, sql);
    snprintf(out, size, "%s", PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1
                                  ? PQgetvalue(r, 0, 0) : "?");
    PQclear(r);
}

static int txn_cb(void *native, void *payload)
{
    PGconn *conn = native;
    txn_probe *p = payload;
    char sql[256];
    const char *v[1];
    PGresult *r;

    p->calls++;
    p->in_txn = PQtransactionStatus(conn) == PQTRANS_INTRANS;
    show(conn, "lock_timeout", p->lock_timeout, sizeof(p->lock_timeout));
    show(conn, "statement_timeout", p->statement_timeout, sizeof(p->statement_timeout));
    if (p->other) {
        /* The lease row is locked FOR UPDATE by this transaction. */
        v[0] = p->key;
        r = PQexecParams(p->other, "SELECT 1 FROM coordination_lease "
                                   "WHERE resource_key = $1 FOR UPDATE NOWAIT",
                         1, NULL, v, NULL, NULL, 0);
        snprintf(p->nowait_state, sizeof(p->nowait_state), "%s",
                 PQresultErrorField(r, PG_DIAG_SQLSTATE)
                     ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : "ok");
        PQclear(r);
    }
    if (p->table) {
        v[0] = p->value;
        snprintf(sql, sizeof(sql), "INSERT INTO %s (v) VALUES ($1)", p->table);
        r = PQexecParams(conn, sql, 1, NULL, v, NULL, NULL, 0);
        PQclear(r);
    }
    if (p->extra_sql) {
        int64_t t = conf_now_ms();
        r = PQexec(conn, p->extra_sql);
        p->extra_ms = conf_now_ms() - t;
        snprintf(p->extra_state, sizeof(p->extra_state), "%s",
                 PQresultErrorField(r, PG_DIAG_SQLSTATE)
                     ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : "ok");
        PQclear(r);
    }
    if (p->sleep_ms)
        conf_sleep_ms(p->sleep_ms);
    return p->ret;
}

static long long count_value(PGconn *c, const char *table, const char *value)
{
    char sql[128];
    const char *v[1] = { value };

    snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s WHERE v = $1", table);
    return raw_ll(c, sql, 1, v);
}

/* The callback runs inside a transaction in which the lease row was
 * validated and locked FOR UPDATE; 0 commits, anything else rolls back
 * and is returned; a failed statement inside is never a commit. */
void test_guarded_txn_locks_and_commits(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], table[40], name[13];
    char sql[128], *nowait;
    lease_grant g;
    lease_info info;
    txn_probe p;
    PGconn *c, *other;
    const char *kv[1];

    (void)state;
    pg_rand_name(name);
    snprintf(table, sizeof(table), "gt_%s", name);
    conf_key(key, "guarded/locks");
    conf_owner(a);
    c = raw_connect(conf_url);
    other = raw_connect(conf_url);
    snprintf(sql, sizeof(sql), "CREATE TABLE %s (v text)", table);
    raw_ok(c, sql);

    g = conf_acquire(key, a, 30000, "txn");
    memset(&p, 0, sizeof(p));
    p.other = other;
    p.key = key;
    p.table = table;
    p.value = "committed";
    CHECK_RC(0, lease_guarded_txn(conf_store, &g, txn_cb, &p));
    assert_int_equal(p.calls, 1);
    assert_int_equal(p.in_txn, 1);
    /* 55P03 lock_not_available: the row was locked by the transaction. */
    assert_string_equal(p.nowait_state, "55P03");
    assert_int_equal(count_value(c, table, "committed"), 1);
    /* ... and only while it lasted. */
    raw_ok(other, "BEGIN");
    kv[0] = key;
    nowait = raw_scalar(other, "SELECT 1 FROM coordination_lease WHERE "
                               "resource_key = $1 FOR UPDATE NOWAIT", 1, kv);
    free(nowait);
    raw_ok(other, "ROLLBACK");

    /* Non-zero: rolled back and returned. */
    memset(&p, 0, sizeof(p));
    p.table = table;
    p.value = "rolled back";
    p.ret = 7;
    assert_int_equal(lease_guarded_txn(conf_store, &g, txn_cb, &p), 7);
    assert_int_equal(p.calls, 1);
    assert_int_equal(count_value(c, table, "rolled back"), 0);

    /* A statement that failed inside, with the callback saying 0: not a
     * commit, ESTORE, and the handle still works afterwards. */
    memset(&p, 0, sizeof(p));
    p.table = table;
    p.value = "aborted";
    p.extra_sql = "SELECT 1/0";
    CHECK_FAIL(LEASE_ESTORE, lease_guarded_txn(conf_store, &g, txn_cb, &p));
    assert_string_equal(p.extra_state, "22012");
    assert_int_equal(count_value(c, table, "aborted"), 0);
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 1);
    CHECK_RC(0, lease_renew(&g, conf_store, 0));

    CHECK_RC(0, lease_release(conf_store, &g));
    snprintf(sql, sizeof(sql), "DROP TABLE %s", table);
    raw_ok(c, sql);
    PQfinish(other);
    PQfinish(c);
}

/* Missing row, another owner, another token, released, expired, taken
 * over: LEASE_ELOST and the callback is never called. */
void test_guarded_txn_elost(void **state)
{
    char key[LEASE_KEY_MAX + 1], key2[LEASE_KEY_MAX + 1], never[LEASE_KEY_MAX + 1];
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_grant g, x, short_g, gb;
    lease_acquire_opts o;
    txn_probe p;

    (void)state;
    conf_key(key, "guarded/elost");
    conf_key(key2, "guarded/elost-expired");
    conf_key(never, "guarded/never-acquired");
    conf_owner(a);
    conf_owner(b);
    memset(&p, 0, sizeof(p));

    /* missing row */
    CHECK_RC(0, lease_grant_init(&x, never, a, 1, 30000));
    CHECK_FAIL(LEASE_ELOST, lease_guarded_txn(conf_store, &x, txn_cb, &p));

    g = conf_acquire(key, a, 30000, NULL);
    /* mismatched owner */
    CHECK_RC(0, lease_grant_init(&x, key, b, g.token, 30000));
    CHECK_FAIL(LEASE_ELOST, lease_guarded_txn(conf_store, &x, txn_cb, &p));
    /* mismatched token (older and newer) */
    CHECK_RC(0, lease_grant_init(&x, key, a, g.token + 1, 30000));
    CHECK_FAIL(LEASE_ELOST, lease_guarded_txn(conf_store, &x, txn_cb, &p));
    if (g.token > 1) {
        CHECK_RC(0, lease_grant_init(&x, key, a, g.token - 1, 30000));
        CHECK_FAIL(LEASE_ELOST, lease_guarded_txn(conf_store, &x, txn_cb, &p));
    }
    /* released */
    CHECK_RC(0, lease_release(conf_store, &g));
    CHECK_FAIL(LEASE_ELOST, lease_guarded_txn(conf_store, &g, txn_cb, &p));

    /* expired (and nobody took it yet) */
    short_g = conf_acquire(key2, a, 150, NULL);
    (void)conf_wait_free(key2, 150);
    CHECK_FAIL(LEASE_ELOST, lease_guarded_txn(conf_store, &short_g, txn_cb, &p));
    /* taken over by another owner */
    o = conf_opts(b, 30000, NULL, 0);
    CHECK_RC(0, lease_acquire(&gb, NULL, conf_store, key2, &o));
    ASSERT_U64_OP(gb.token, >, short_g.token);
    CHECK_FAIL(LEASE_ELOST, lease_guarded_txn(conf_store, &short_g, txn_cb, &p));
    assert_int_equal(p.calls, 0);

    /* The rightful holder still gets in. */
    CHECK_RC(0, lease_guarded_txn(conf_store, &gb, txn_cb, &p));
    assert_int_equal(p.calls, 1);
    CHECK_RC(0, lease_release(conf_store, &gb));
}

/* statement_timeout and lock_timeout follow the handle's timeout, and
 * bound what runs in the transaction. */
void test_guarded_txn_timeouts(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], table[40], name[13];
    char sql[160];
    lease_grant g;
    txn_probe p;
    PGconn *c, *locker;
    int64_t t;
    int rc;
    const char *kv[1];

    (void)state;
    pg_rand_name(name);
    snprintf(table, sizeof(table), "tt_%s", name);
    conf_key(key, "guarded/timeouts");
    conf_owner(a);
    c = raw_connect(conf_url);
    locker = raw_connect(conf_url);
    snprintf(sql, sizeof(sql), "CREATE TABLE %s (v text)", table);
    raw_ok(c, sql);
    g = conf_acquire(key, a, 30000, NULL);

    CHECK_RC(0, lease_store_set_timeout(conf_store, 1234));
    memset(&p, 0, sizeof(p));
    CHECK_RC(0, lease_guarded_txn(conf_store, &g, txn_cb, &p));
    assert_string_equal(p.lock_timeout, "1234ms");
    assert_string_equal(p.statement_timeout, "1234ms");

    CHECK_RC(0, lease_store_set_timeout(conf_store, 300));
    memset(&p, 0, sizeof(p));
    p.extra_sql = "SELECT pg_sleep(20)";
    CHECK_FAIL(LEASE_ESTORE, lease_guarded_txn(conf_store, &g, txn_cb, &p));
    assert_string_equal(p.lock_timeout, "300ms");
    assert_string_equal(p.statement_timeout, "300ms");
    /* 57014 query_canceled (statement timeout) */
    assert_string_equal(p.extra_state, "57014");
    printf("# pg_sleep(20) inside the guarded transaction, timeout 300 ms: "
           "cancelled after %" PRId64 " ms\n", p.extra_ms);

    /* A lock wait inside is bounded too. */
    raw_ok(locker, "BEGIN");
    snprintf(sql, sizeof(sql), "LOCK TABLE %s IN ACCESS EXCLUSIVE MODE", table);
    raw_ok(locker, sql);
    memset(&p, 0, sizeof(p));
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s", table);
    p.extra_sql = sql;
    CHECK_FAIL(LEASE_ESTORE, lease_guarded_txn(conf_store, &g, txn_cb, &p));
    /* 55P03 (lock_timeout) or 57014 (statement_timeout): both 300 ms. */
    if (strcmp(p.extra_state, "55P03") != 0 && strcmp(p.extra_state, "57014") != 0)
        fail_msg("a lock wait in the transaction ended with SQLSTATE %s",
                 p.extra_state);
    printf("# lock wait inside the guarded transaction, timeout 300 ms: "
           "SQLSTATE %s after %" PRId64 " ms\n", p.extra_state, p.extra_ms);
    raw_ok(locker, "ROLLBACK");

    /* Validating the lease waits for the row lock at most that long, and
     * does not claim the lease is lost: the answer is uncertain. */
    raw_ok(locker, "BEGIN");
    kv[0] = key;
    PQclear(raw_exec(locker, PGRES_TUPLES_OK, "SELECT 1 FROM coordination_lease "
                     "WHERE resource_key = $1 FOR UPDATE", 1, kv));
    memset(&p, 0, sizeof(p));
    lease_error_clear();
    t = conf_now_ms();
    rc = lease_guarded_txn(conf_store, &g, txn_cb, &p);
    t = conf_now_ms() - t;
    printf("# guarded transaction while another transaction holds the lease "
           "row, timeout 300 ms: %s after %" PRId64 " ms (%s)\n",
           lease_error_name(rc), t, lease_errmsg());
    if (rc != LEASE_ESTORE && rc != LEASE_ETIMEOUT)
        fail_msg("expected ESTORE or ETIMEOUT, got %s (%s)", lease_error_name(rc),
                 lease_errmsg());
    assert_int_equal(p.calls, 0);
    raw_ok(locker, "ROLLBACK");

    /* A callback that outlives the timeout in the client (no statement
     * to cancel): no COMMIT whose answer could not come in time, but a
     * rollback, ETIMEOUT, and nothing written; the handle works after. */
    memset(&p, 0, sizeof(p));
    p.table = table;
    p.value = "late";
    p.sleep_ms = 600;
    lease_error_clear();
    rc = lease_guarded_txn(conf_store, &g, txn_cb, &p);
    if (rc != LEASE_ETIMEOUT)
        fail_msg("a callback of 600 ms, timeout 300 ms: expected ETIMEOUT, got %s (%s)",
                 lease_error_name(rc), lease_errmsg());
    assert_int_equal(p.calls, 1);
    assert_int_equal(count_value(c, table, "late"), 0);

    CHECK_RC(0, lease_store_set_timeout(conf_store, 5000));
    memset(&p, 0, sizeof(p));
    CHECK_RC(0, lease_guarded_txn(conf_store, &g, txn_cb, &p));
    assert_string_equal(p.statement_timeout, "5s");
    assert_int_equal(p.calls, 1);
    CHECK_RC(0, lease_release(conf_store, &g));
    snprintf(sql, sizeof(sql), "DROP TABLE %s", table);
    raw_ok(c, sql);
    PQfinish(locker);
    PQfinish(c);
}

/* ======================================================================
 * resource-side fencing
 * ====================================================================== */

typedef struct rebuild_probe {
    const char *schema;
    const char *key;
    const char *owner;
    uint64_t token;
    const char *state;
    int rows;
    int calls;
} rebuild_probe;

/* The reference UPDATE as the protected write of a guarded transaction. */
static int rebuild_cb(void *native, void *payload)
{
    rebuild_probe *p = payload;
    char sql[96], tok[24];
    const char *v[4] = { p->key, p->owner, tok, p->state };
    PGresult *r;

    p->calls++;
    snprintf(sql, sizeof(sql), "SET LOCAL search_path = %s", p->schema);
    PQclear(PQexec(native, sql));
    snprintf(tok, sizeof(tok), "%" PRIu64, p->token);
    r = PQexecParams(native, REFSQL_REBUILD, 4, refsql_rebuild_types, v, NULL,
                     NULL, 0);
    p->rows = PQresultStatus(r) == PGRES_COMMAND_OK ? atoi(PQcmdTuples(r)) : -1;
    PQclear(r);
    return p->rows == 1 ? 0 : 1;
}

/* The reference rebuild_state UPDATE in the resource's own transaction,
 * over plain libpq: the row count is the fencing verdict. */
static int rebuild(PGconn *c, const char *key, uint64_t token, const char *st)
{
    char tok[24];
    const char *v[4] = { key, NULL, tok, st };
    PGresult *r;
    int rows;

    snprintf(tok, sizeof(tok), "%" PRIu64, token);
    raw_ok(c, "BEGIN");
    r = raw_exec_types(c, PGRES_COMMAND_OK, REFSQL_REBUILD, 4,
                       refsql_rebuild_types, v);
    rows = atoi(PQcmdTuples(r));
    PQclear(r);
    raw_ok(c, "COMMIT");
    return rows;
}

static char *rebuild_row(PGconn *c, const char *key)
{
    const char *v[1] = { key };

    return raw_scalar(c, "SELECT state || ' ' || last_fencing_token FROM "
                         "rebuild_state WHERE resource_key = $1", 1, v);
}

void test_fence_resource_side(void **state)
{
    char key[LEASE_KEY_MAX + 1], key2[LEASE_KEY_MAX + 1], res[LEASE_KEY_MAX + 1];
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ], sql[256], *row;
    char name[13], schema[32];
    lease_grant ga, gb;
    lease_acquire_opts o;
    rebuild_probe p;
    uint64_t mark = 0;
    PGconn *c;
    const char *kv[1];

    (void)state;
    pg_rand_name(name);
    snprintf(schema, sizeof(schema), "rs_%s", name);
    conf_key(key, "fence/raw-row");
    conf_key(key2, "fence/rebuild");
    conf_key(res, "fence/ledger");
    conf_owner(a);
    conf_owner(b);
    c = raw_connect(conf_url);

    /* lease_fence_advance: the mark lives in the store, durably. */
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, 5));
    ASSERT_U64_OP(mark, ==, 5);
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, 5));
    ASSERT_U64_OP(mark, ==, 5);
    mark = 0;
    CHECK_FAIL(LEASE_ESTALE, lease_fence_advance(&mark, conf_store, res, 4));
    ASSERT_U64_OP(mark, ==, 5);
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, 9));
    ASSERT_U64_OP(mark, ==, 9);
    kv[0] = res;
    assert_int_equal(raw_ll(c, "SELECT mark FROM lease_fence WHERE resource = $1",
                            1, kv), 9);
    CHECK_FAIL(LEASE_ESTALE, lease_fence_advance(&mark, conf_store, res, 8));
    assert_int_equal(raw_ll(c, "SELECT mark FROM lease_fence WHERE resource = $1",
                            1, kv), 9);

    /* The reference resource table and its conditional UPDATE. */
    snprintf(sql, sizeof(sql),
             "CREATE SCHEMA %s; SET search_path = %s; "
             "CREATE TABLE rebuild_state (resource_key text PRIMARY KEY, "
             "state text, last_fencing_token bigint NOT NULL DEFAULT 0)",
             schema, schema);
    raw_ok(c, sql);
    kv[0] = key;
    PQclear(raw_exec(c, PGRES_COMMAND_OK, "INSERT INTO rebuild_state "
                     "(resource_key, state) VALUES ($1, 'new')", 1, kv));
    assert_int_equal(rebuild(c, key, 5, "by-5"), 1);
    assert_int_equal(rebuild(c, key, 4, "by-4"), 0); /* stale: 0 rows */
    row = rebuild_row(c, key);
    assert_string_equal(row, "by-5 5");
    free(row);
    assert_int_equal(rebuild(c, key, 5, "by-5-again"), 1); /* same generation */
    assert_int_equal(rebuild(c, key, 7, "by-7"), 1);
    assert_int_equal(rebuild(c, key, 6, "by-6"), 0);
    row = rebuild_row(c, key);
    assert_string_equal(row, "by-7 7");
    free(row);

    /* With the lease, on a fresh resource row: A writes under its token in
     * a guarded transaction; A pauses past its ttl; B takes over with a
     * greater token and writes; A's late writes are refused, by the lease
     * check and by the resource's own check. */
    kv[0] = key2;
    PQclear(raw_exec(c, PGRES_COMMAND_OK, "INSERT INTO rebuild_state "
                     "(resource_key, state) VALUES ($1, 'new')", 1, kv));
    ga = conf_acquire(key2, a, 1500, "A");
    memset(&p, 0, sizeof(p));
    p.schema = schema;
    p.key = key2;
    p.owner = a;
    p.token = ga.token;
    p.state = "A";
    CHECK_RC(0, lease_guarded_txn(conf_store, &ga, rebuild_cb, &p));
    assert_int_equal(p.calls, 1);
    assert_int_equal(p.rows, 1);

    (void)conf_wait_free(key2, 1500);
    o = conf_opts(b, 30000, "B", 0);
    CHECK_RC(0, lease_acquire(&gb, NULL, conf_store, key2, &o));
    ASSERT_U64_OP(gb.token, >, ga.token);
    memset(&p, 0, sizeof(p));
    p.schema = schema;
    p.key = key2;
    p.owner = b;
    p.token = gb.token;
    p.state = "B";
    CHECK_RC(0, lease_guarded_txn(conf_store, &gb, rebuild_cb, &p));
    assert_int_equal(p.rows, 1);

    memset(&p, 0, sizeof(p));
    p.schema = schema;
    p.key = key2;
    p.owner = a;
    p.token = ga.token;
    p.state = "A-late";
    CHECK_FAIL(LEASE_ELOST, lease_guarded_txn(conf_store, &ga, rebuild_cb, &p));
    assert_int_equal(p.calls, 0);
    /* A's write reaching the resource directly (no lease check) with its
     * old token updates nothing. */
    assert_int_equal(rebuild(c, key2, ga.token, "A-late"), 0);
    row = rebuild_row(c, key2);
    {
        char want[64];
        snprintf(want, sizeof(want), "B %" PRIu64, gb.token);
        assert_string_equal(row, want);
    }
    free(row);

    CHECK_RC(0, lease_release(conf_store, &gb));
    snprintf(sql, sizeof(sql), "DROP SCHEMA %s CASCADE", schema);
    raw_ok(c, sql);
    PQfinish(c);
}

/* ======================================================================
 * lease_advisory_key: FNV-1a (64-bit), computed here independently
 * ====================================================================== */

/* FNV-1a as published (Fowler, Noll, Vo): offset basis 14695981039346656037,
 * prime 1099511628211; for each byte: hash ^= byte, then hash *= prime. */
static int64_t fnv1a64_signed(const char *s)
{
    uint64_t h = 14695981039346656037ULL;
    int64_t out;

    for (; *s; s++) {
        h ^= (uint64_t)(unsigned char)*s;
        h *= 1099511628211ULL;
    }
    memcpy(&out, &h, sizeof(out)); /* two's complement reading */
    return out;
}

void test_advisory_key_is_fnv1a(void **state)
{
    (void)state;
    /* Values computed outside this code base (Python:
     * h=0xcbf29ce484222325; for b in key: h=((h^b)*0x100000001b3)%2**64). */
    ASSERT_I64_OP(fnv1a64_signed("tenant-42"), ==, 2973703394120846818LL);
    ASSERT_I64_OP(lease_advisory_key("tenant-42"), ==, fnv1a64_signed("tenant-42"));
    ASSERT_I64_OP(lease_advisory_key("tenant-42"), ==, 2973703394120846818LL);
    /* The empty string gives the offset basis; "a" is the published test
     * vector 0xaf63dc4c8601ec8c, negative when read as signed. */
    ASSERT_U64_OP((uint64_t)fnv1a64_signed(""), ==, 0xcbf29ce484222325ULL);
    ASSERT_U64_OP((uint64_t)fnv1a64_signed("a"), ==, 0xaf63dc4c8601ec8cULL);
    ASSERT_I64_OP(lease_advisory_key("a"), ==, fnv1a64_signed("a"));
    ASSERT_I64_OP(lease_advisory_key("a"), ==, -5808556873153909620LL);
    ASSERT_I64_OP(lease_advisory_key("\xff\x01 x'; --"), ==,
                  fnv1a64_signed("\xff\x01 x'; --"));
}

/* ======================================================================
 * advisory locks
 * ====================================================================== */

typedef struct adv_probe {
    int calls;
    int locks;          /* advisory locks this backend holds */
    uint64_t locked;    /* the key of that lock, from pg_locks */
    int objsubid;
    int ret;
    int lock_fd, go_fd; /* child: report "locked", wait for "go" */
} adv_probe;

static int adv_cb(void *native, void *payload)
{
    adv_probe *p = payload;
    PGresult *r;

    p->calls++;
    r = PQexec(native, "SELECT classid::bigint, objid::bigint, objsubid "
                       "FROM pg_locks WHERE locktype = 'advisory' "
                       "AND pid = pg_backend_pid() AND granted");
    if (PQresultStatus(r) == PGRES_TUPLES_OK) {
        p->locks = PQntuples(r);
        if (p->locks == 1) {
            p->locked = (strtoull(PQgetvalue(r, 0, 0), NULL, 10) << 32) |
                        strtoull(PQgetvalue(r, 0, 1), NULL, 10);
            p->objsubid = atoi(PQgetvalue(r, 0, 2));
        }
    } else {
        p->locks = -1;
    }
    PQclear(r);
    if (p->lock_fd >= 0) {
        char ch = 'L', go = 0;
        (void)conf_write_full(p->lock_fd, &ch, 1);
        (void)conf_read_full(p->go_fd, &go, 1, conf_now_ms() + 60000);
    }
    return p->ret;
}

/* Holders of the advisory lock numbered `k`, seen from another session. */
static long long adv_holders(PGconn *c, int64_t k)
{
    char ks[24];
    const char *v[1] = { ks };

    snprintf(ks, sizeof(ks), "%lld", (long long)k);
    return raw_ll(c, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                     "AND granted AND objsubid = 1 "
                     "AND classid::bigint = ($1::bigint >> 32) & 4294967295 "
                     "AND objid::bigint = $1::bigint & 4294967295",
                  1, v);
}

void test_advisory_txn(void **state)
{
    char key[LEASE_KEY_MAX + 1], ks[24], *v, wait_msg[512];
    int lockp[2], gop[2], st, rc, wait_rc;
    adv_probe p;
    int64_t k, t;
    PGconn *c;
    pid_t pid;
    const char *kv[1];

    (void)state;
    /* The reference "tenant-42", with this run's prefix so that runs on a
     * shared server never meet. */
    conf_key(key, "tenant-42");
    k = lease_advisory_key(key);
    ASSERT_I64_OP(k, ==, fnv1a64_signed(key));
    snprintf(ks, sizeof(ks), "%lld", (long long)k);
    kv[0] = ks;
    c = raw_connect(conf_url);

    /* Inside: this transaction holds exactly the lock lease_advisory_key
     * names (a bigint key shows as classid = high, objid = low half). */
    memset(&p, 0, sizeof(p));
    p.lock_fd = p.go_fd = -1;
    CHECK_RC(0, lease_advisory_txn(conf_store, key, 1, adv_cb, &p));
    assert_int_equal(p.calls, 1);
    assert_int_equal(p.locks, 1);
    ASSERT_U64_OP(p.locked, ==, (uint64_t)k);
    assert_int_equal(p.objsubid, 1);
    assert_int_equal(adv_holders(c, k), 0); /* gone with the transaction */
    memset(&p, 0, sizeof(p));
    p.lock_fd = p.go_fd = -1;
    CHECK_RC(0, lease_advisory_txn(conf_store, key, 0, adv_cb, &p));
    assert_int_equal(p.locks, 1);
    ASSERT_U64_OP(p.locked, ==, (uint64_t)k);
    assert_int_equal(adv_holders(c, k), 0);
    /* A non-zero answer rolls back, is returned, and frees the lock too. */
    memset(&p, 0, sizeof(p));
    p.lock_fd = p.go_fd = -1;
    p.ret = 3;
    assert_int_equal(lease_advisory_txn(conf_store, key, 1, adv_cb, &p), 3);
    assert_int_equal(adv_holders(c, k), 0);

    /* Another process, with its own handle, holds it inside its callback. */
    conf_pipe(lockp);
    conf_pipe(gop);
    conf_store_close();
    pid = conf_fork();
    if (pid == 0) {
        lease_store *s;
        adv_probe q;
        close(lockp[0]);
        close(gop[1]);
        if (lease_store_open(&s, conf_url) != 0)
            _exit(10);
        memset(&q, 0, sizeof(q));
        q.lock_fd = lockp[1];
        q.go_fd = gop[0];
        rc = lease_advisory_txn(s, key, 0, adv_cb, &q);
        lease_store_close(s);
        _exit(rc == 0 && q.calls == 1 && q.locks == 1 ? 0 : 11);
    }
    close(lockp[1]);
    close(gop[0]);
    {
        char ch = 0;
        if (conf_read_full(lockp[0], &ch, 1, conf_now_ms() + 30000) != 1 || ch != 'L')
            fail_msg("the child never reported holding the advisory lock");
    }
    conf_store_open();
    assert_int_equal(adv_holders(c, k), 1);

    /* try_only: EBUSY at once, callback not called. */
    memset(&p, 0, sizeof(p));
    p.lock_fd = p.go_fd = -1;
    t = conf_now_ms();
    CHECK_FAIL(LEASE_EBUSY, lease_advisory_txn(conf_store, key, 1, adv_cb, &p));
    printf("# advisory try_only against a holder: EBUSY after %" PRId64 " ms\n",
           conf_now_ms() - t);
    assert_int_equal(p.calls, 0);

    /* waiting: bounded by the handle's timeout, ETIMEOUT. */
    CHECK_RC(0, lease_store_set_timeout(conf_store, 300));
    t = conf_now_ms();
    lease_error_clear();
    rc = lease_advisory_txn(conf_store, key, 0, adv_cb, &p);
    t = conf_now_ms() - t;
    printf("# advisory wait against a holder, timeout 300 ms: %s after %" PRId64
           " ms (%s)\n", lease_error_name(rc), t, lease_errmsg());
    /* Asserted at the end, so that the rest still runs if it is wrong. */
    wait_rc = rc;
    snprintf(wait_msg, sizeof(wait_msg), "%s", lease_errmsg());
    assert_int_equal(p.calls, 0);
    CHECK_RC(0, lease_store_set_timeout(conf_store, 5000));

    /* Any program that maps "…/tenant-42" with FNV-1a meets the same lock. */
    raw_ok(c, "BEGIN");
    v = raw_scalar(c, "SELECT pg_try_advisory_xact_lock($1::bigint)", 1, kv);
    assert_string_equal(v, "f");
    free(v);
    raw_ok(c, "ROLLBACK");

    /* The holder finishes; its lock ends with its transaction. */
    {
        char go = 'G';
        assert_int_equal(conf_write_full(gop[1], &go, 1), 0);
    }
    st = conf_reap(pid, 30000);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    close(lockp[0]);
    close(gop[1]);
    assert_int_equal(adv_holders(c, k), 0);

    memset(&p, 0, sizeof(p));
    p.lock_fd = p.go_fd = -1;
    CHECK_RC(0, lease_advisory_txn(conf_store, key, 1, adv_cb, &p));
    assert_int_equal(p.calls, 1);
    raw_ok(c, "BEGIN");
    v = raw_scalar(c, "SELECT pg_try_advisory_xact_lock($1::bigint)", 1, kv);
    assert_string_equal(v, "t");
    free(v);
    /* ... and the other way round: a raw holder makes lease wait/refuse. */
    memset(&p, 0, sizeof(p));
    p.lock_fd = p.go_fd = -1;
    CHECK_FAIL(LEASE_EBUSY, lease_advisory_txn(conf_store, key, 1, adv_cb, &p));
    raw_ok(c, "ROLLBACK");
    CHECK_RC(0, lease_advisory_txn(conf_store, key, 0, adv_cb, &p));
    assert_int_equal(p.calls, 1);
    PQfinish(c);

    /* "LEASE_ETIMEOUT when the lock was not granted within the handle's
     * timeout" (fence.h). */
    if (wait_rc != LEASE_ETIMEOUT)
        fail_msg("waiting for a held advisory lock with timeout 300 ms gave %s "
                 "(%s), expected ETIMEOUT", lease_error_name(wait_rc), wait_msg);
}
