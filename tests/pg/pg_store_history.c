/*
 * pg_store_history.c - the grant history table: added to a database made
 * before it existed, a role without the rights to make it, the reference
 * SQL's statements in between (rows it cannot see end unended), and its
 * name from the URL.
 */
#include "pg_store.h"

/* ======================================================================
 * the grant history table
 * ====================================================================== */

/* The lease tables as the version before the grant history made them
 * (setup_schema of that version, word for word): no lease_history. */
#define PRE_HISTORY_DDL                                                       \
    "CREATE TABLE coordination_lease ("                                       \
    " resource_key text PRIMARY KEY,"                                         \
    " owner_id uuid,"                                                         \
    " lease_until timestamptz NOT NULL DEFAULT '-infinity'::timestamptz,"     \
    " fencing_token bigint NOT NULL DEFAULT 0 CHECK (fencing_token >= 0),"    \
    " holder_label text,"                                                     \
    " lease_ttl_ms bigint,"                                                   \
    " holder_token bigint);"                                                  \
    "CREATE TABLE lease_fence ("                                              \
    " resource text PRIMARY KEY,"                                             \
    " mark bigint NOT NULL CHECK (mark >= 0));"                               \
    "CREATE TABLE lease_data ("                                               \
    " name text PRIMARY KEY,"                                                 \
    " value bytea NOT NULL,"                                                  \
    " token bigint NOT NULL,"                                                 \
    " resource_key text NOT NULL);"

/* The history table as src/stores/pg/pg.c documents it, for an administrator
 * to create by hand; %s is the table. */
#define HISTORY_DDL_FMT                                                       \
    "CREATE TABLE %s (resource_key text, fencing_token bigint, "              \
    "owner_id uuid NOT NULL, holder_label text, lease_ttl_ms bigint NOT NULL, " \
    "acquired_at timestamptz NOT NULL, "                                      \
    "ended text CHECK (ended IN ('released', 'expired', 'lost')), "           \
    "ended_at timestamptz, PRIMARY KEY (resource_key, fencing_token))"

/* A new schema holding the pre-history tables, and a URL whose
 * search_path is that schema alone, so that the store's default names
 * (coordination_lease, lease_history ...) resolve, and are created, there
 * and nowhere else. The caller frees the URL and drops the schema. */
static char *pre_history_schema(PGconn *c, char *schema, size_t size,
                                const char *tag)
{
    char name[13], sql[128], params[128];

    pg_rand_name(name);
    snprintf(schema, size, "%s_%s", tag, name);
    snprintf(sql, sizeof(sql), "CREATE SCHEMA %s; SET search_path = %s", schema,
             schema);
    raw_ok(c, sql);
    raw_ok(c, PRE_HISTORY_DDL);
    raw_ok(c, "RESET search_path");
    snprintf(params, sizeof(params), "options=-c%%20search_path%%3D%s", schema);
    return url_with(conf_url, params);
}

/* Does schema.table exist? */
static int table_exists(PGconn *c, const char *schema, const char *table)
{
    char q[160], *v;
    const char *kv[1] = { q };
    int yes;

    snprintf(q, sizeof(q), "%s.%s", schema, table);
    v = raw_scalar(c, "SELECT (to_regclass($1) IS NOT NULL)::text", 1, kv);
    yes = strcmp(v, "true") == 0;
    free(v);
    return yes;
}

/* One expected entry of a history, newest first. */
typedef struct hist_want {
    uint64_t token;
    const char *owner;
    lease_ended ended;
} hist_want;

/* "token:owner-prefix:ended ..." for failure messages. */
static void hist_describe(char *out, size_t size, const lease_history_entry *h,
                          size_t n)
{
    size_t i, used = 0;

    out[0] = '\0';
    for (i = 0; i < n && used + 1 < size; i++) {
        int w = snprintf(out + used, size - used, "%s%" PRIu64 ":%.8s:%s",
                         i ? " " : "", h[i].token, h[i].owner,
                         lease_ended_name(h[i].ended));
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

/*
 * lease_history(key) through `s` is exactly `want` (tokens, owners,
 * endings), and, whatever was expected: tokens strictly decreasing, an
 * entry reads held only when it is the current lease (inspect says so),
 * a held entry has no end time, and an end time, when known, is not
 * before the grant.
 */
static void hist_expect(lease_store *s, const char *key, const hist_want *want,
                        size_t n_want)
{
    lease_history_entry *h = NULL;
    lease_info info;
    char got[1024];
    size_t n = 0, i;
    int rc;

    CHECK_RC(0, lease_history(&h, &n, s, key, 0));
    hist_describe(got, sizeof(got), h, n);
    if (n != n_want)
        fail_msg("history of %s: %zu entries (%s), expected %zu", key, n, got,
                 n_want);
    if (n == 0) {
        assert_null(h);
        return;
    }
    memset(&info, 0, sizeof(info));
    rc = lease_inspect(&info, s, key);
    if (rc != 0 && rc != LEASE_ENOTFOUND)
        fail_msg("inspect %s: %s (%s)", key, lease_error_name(rc), lease_errmsg());
    for (i = 0; i < n; i++) {
        if (h[i].token != want[i].token || strcmp(h[i].owner, want[i].owner) != 0 ||
            h[i].ended != want[i].ended)
            fail_msg("history of %s, entry %zu: %" PRIu64 " %s %s, expected %"
                     PRIu64 " %s %s (whole history: %s)", key, i, h[i].token,
                     h[i].owner, lease_ended_name(h[i].ended), want[i].token,
                     want[i].owner, lease_ended_name(want[i].ended), got);
        if (i > 0 && h[i].token >= h[i - 1].token)
            fail_msg("history of %s: tokens not strictly decreasing (%s)", key, got);
        if (h[i].ended == LEASE_ENDED_HELD) {
            if (!(info.held && info.token == h[i].token &&
                  strcmp(info.owner, h[i].owner) == 0))
                fail_msg("history of %s: token %" PRIu64 " reads held, but the "
                         "current lease is %s token %" PRIu64 " (%s)", key,
                         h[i].token, info.held ? info.owner : "(none)",
                         info.token, got);
            ASSERT_I64_OP(h[i].ended_ms, ==, 0);
        } else if (h[i].ended_ms != 0) {
            ASSERT_I64_OP(h[i].ended_ms, >=, h[i].acquired_ms);
        }
    }
    lease_history_free(h);
}

/* The rows of `table` for `key`, oldest first: "token:ended,..." with
 * "held" for ended IS NULL ("" when none). Malloc'ed. */
static char *history_rows(PGconn *c, const char *table, const char *key)
{
    char sql[256];
    const char *v[1] = { key };

    snprintf(sql, sizeof(sql),
             "SELECT coalesce(string_agg(fencing_token || ':' || "
             "coalesce(ended, 'held'), ',' ORDER BY fencing_token), '') "
             "FROM %s WHERE resource_key = $1", table);
    return raw_scalar(c, sql, 1, v);
}

/* Right after a grant by the library (`token`), no other row of `table`
 * for `key` may be left unended (ended IS NULL): that grant ended them. */
static void expect_unended_only(PGconn *c, const char *table, const char *key,
                                uint64_t token)
{
    char sql[200], tok[24], rows[512], *r;
    const char *v[2] = { key, tok };
    long long n;

    snprintf(tok, sizeof(tok), "%" PRIu64, token);
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s WHERE resource_key = $1 "
             "AND ended IS NULL AND fencing_token <> $2::bigint", table);
    n = raw_ll(c, sql, 2, v);
    if (n != 0) {
        r = history_rows(c, table, key);
        snprintf(rows, sizeof(rows), "%s", r);
        free(r);
        fail_msg("after the library's grant %" PRIu64 " of %s, %lld earlier "
                 "rows of %s are still unended (rows: %s)", token, key, n, table,
                 rows);
    }
}

/*
 * A database made by the version before the grant history: the lease
 * tables, no lease_history, and a lease granted then (token 7, still
 * running). The next open creates the table; that lease, made before,
 * is not in it (an empty history, not an error); every grant from then
 * on is, and a second open finds the table and goes on with it.
 */
void test_history_table_added_to_old_database(void **state)
{
    char schema[40], table[64], key[LEASE_KEY_MAX + 1], x[LEASE_OWNER_BUFSZ];
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ], sql[256], *url, *rows;
    lease_store *s, *s2;
    lease_acquire_opts o;
    lease_grant g, gx;
    lease_info info, h;
    PGconn *c;
    const char *kv[2];

    (void)state;
    conf_key(key, "history/old-database");
    conf_owner(x);
    conf_owner(a);
    conf_owner(b);
    c = raw_connect(conf_url);
    url = pre_history_schema(c, schema, sizeof(schema), "hold");
    snprintf(table, sizeof(table), "%s.lease_history", schema);
    /* The earlier version's grant, as its acquire left the row. */
    kv[0] = key;
    kv[1] = x;
    snprintf(sql, sizeof(sql),
             "INSERT INTO %s.coordination_lease (resource_key, owner_id, "
             "lease_until, fencing_token, holder_label, lease_ttl_ms, holder_token) "
             "VALUES ($1, $2, clock_timestamp() + interval '60 seconds', 7, 'old', "
             "60000, 7)", schema);
    PQclear(raw_exec(c, PGRES_COMMAND_OK, sql, 2, kv));
    assert_false(table_exists(c, schema, "lease_history"));

    CHECK_RC(0, lease_store_open(&s, url));
    if (!table_exists(c, schema, "lease_history"))
        fail_msg("opening a database made before the grant history did not "
                 "create %s", table);
    /* The lease from before is intact and not in the history. */
    CHECK_RC(0, lease_inspect(&info, s, key));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.owner, x);
    ASSERT_U64_OP(info.token, ==, 7);
    assert_string_equal(info.label, "old");
    hist_expect(s, key, NULL, 0);
    o = conf_opts(a, 30000, "after the upgrade", 0);
    memset(&h, 0, sizeof(h));
    CHECK_FAIL(LEASE_EBUSY, lease_acquire(&g, &h, s, key, &o));
    assert_string_equal(h.owner, x);
    /* Its holder releases it through the new version: nothing to end. */
    CHECK_RC(0, lease_grant_init(&gx, key, x, 7, 60000));
    CHECK_RC(0, lease_release(s, &gx));
    hist_expect(s, key, NULL, 0);

    /* From now on every grant is recorded. */
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 8);
    {
        const hist_want w[] = { { 8, a, LEASE_ENDED_HELD } };
        hist_expect(s, key, w, 1);
    }
    rows = history_rows(c, table, key);
    assert_string_equal(rows, "8:held");
    free(rows);
    CHECK_RC(0, lease_release(s, &g));

    /* A second open finds the table present, checks it, and uses it. */
    CHECK_RC(0, lease_store_open(&s2, url));
    o = conf_opts(b, 30000, NULL, 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s2, key, &o));
    ASSERT_U64_OP(g.token, ==, 9);
    {
        const hist_want w[] = { { 9, b, LEASE_ENDED_HELD },
                                { 8, a, LEASE_ENDED_RELEASED } };
        hist_expect(s2, key, w, 2);
        hist_expect(s, key, w, 2);
    }
    CHECK_RC(0, lease_release(s2, &g));
    rows = history_rows(c, table, key);
    assert_string_equal(rows, "8:released,9:released");
    free(rows);

    lease_store_close(s2);
    lease_store_close(s);
    free(url);
    snprintf(sql, sizeof(sql), "DROP SCHEMA %s CASCADE", schema);
    raw_ok(c, sql);
    PQfinish(c);
}

/*
 * A role that may not create the history table, where none exists: the
 * store opens and does everything but the history, and lease_history()
 * says why (EUNSUPPORTED, naming the table, no password). The same when
 * the table exists but the role has no rights on it. Once it has them, a
 * fresh open records grants.
 *
 * The test server gives us one role (the database owner, which may not
 * create roles), so that role takes the rights away from itself: an
 * owner can revoke its own privileges, and PostgreSQL then refuses it
 * like any other role (only a superuser is exempt, hence the check).
 * Putting them back stands for the administrator's GRANT.
 */
void test_history_without_rights(void **state)
{
    char schema[40], table[64], key[LEASE_KEY_MAX + 1], sql[512], msg[1024];
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ], *url, *pw, *v, *rows;
    lease_store *s1, *s2, *s3;
    lease_acquire_opts o;
    lease_grant ga, gb, g;
    lease_info info, h;
    lease_history_entry *he, dummy;
    size_t n;
    PGconn *c;

    (void)state;
    conf_key(key, "history/no-rights");
    conf_owner(a);
    conf_owner(b);
    pw = url_password(conf_url);
    c = raw_connect(conf_url);
    v = raw_scalar(c, "SELECT rolsuper::text FROM pg_roles "
                      "WHERE rolname = current_user", 0, NULL);
    if (strcmp(v, "false") != 0)
        fail_msg("the test role is a superuser: privileges cannot be taken away "
                 "from it, so this test cannot make a role without them (use "
                 "the URL of an ordinary role, as scripts/pg-server.sh makes)");
    free(v);
    url = pre_history_schema(c, schema, sizeof(schema), "hnr");
    snprintf(table, sizeof(table), "%s.lease_history", schema);
    snprintf(sql, sizeof(sql), "REVOKE CREATE ON SCHEMA %s FROM CURRENT_USER",
             schema);
    raw_ok(c, sql);
    snprintf(sql, sizeof(sql), "SELECT has_schema_privilege('%s', 'CREATE')::text",
             schema);
    v = raw_scalar(c, sql, 0, NULL);
    assert_string_equal(v, "false");
    free(v);

    /* No table, and no right to create it: the store opens all the same. */
    CHECK_RC(0, lease_store_open(&s1, url));
    assert_false(table_exists(c, schema, "lease_history"));

    /* ... and acquire, busy, renew, release work as before. */
    o = conf_opts(a, 30000, "no history", 0);
    CHECK_RC(0, lease_acquire(&ga, NULL, s1, key, &o));
    ASSERT_U64_OP(ga.token, ==, 1);
    CHECK_RC(0, lease_acquire(&g, NULL, s1, key, &o)); /* the holder's retry */
    ASSERT_U64_OP(g.token, ==, 1);
    CHECK_RC(0, lease_inspect(&info, s1, key));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.owner, a);
    assert_string_equal(info.label, "no history");
    o = conf_opts(b, 30000, NULL, 0);
    memset(&h, 0, sizeof(h));
    CHECK_FAIL(LEASE_EBUSY, lease_acquire(&gb, &h, s1, key, &o));
    assert_string_equal(h.owner, a);
    ASSERT_U64_OP(h.token, ==, 1);
    CHECK_RC(0, lease_renew(&ga, s1, 0));
    CHECK_RC(0, lease_release(s1, &ga));
    /* A refused renew is ELOST, not the missing history's EUNSUPPORTED
     * (the core then tries to mark the entry lost). */
    CHECK_FAIL(LEASE_ELOST, lease_renew(&ga, s1, 0));
    CHECK_RC(0, lease_acquire(&gb, NULL, s1, key, &o));
    ASSERT_U64_OP(gb.token, ==, 2);
    CHECK_RC(0, lease_release(s1, &gb));

    /* The history alone is refused, saying why. */
    he = &dummy; /* must come back NULL */
    n = 99;
    CHECK_FAIL(LEASE_EUNSUPPORTED, lease_history(&he, &n, s1, key, 0));
    snprintf(msg, sizeof(msg), "%s", lease_errmsg());
    printf("# no right to create the history table: %s\n", msg);
    assert_null(he);
    assert_int_equal(n, 0);
    if (strstr(msg, "lease_history") == NULL)
        fail_msg("the message does not name the history table: %s", msg);
    ASSERT_NO_SECRET(msg, pw);
    assert_false(table_exists(c, schema, "lease_history"));

    /* A privileged role creates the table but grants this one nothing. */
    snprintf(sql, sizeof(sql), "GRANT CREATE ON SCHEMA %s TO CURRENT_USER", schema);
    raw_ok(c, sql);
    snprintf(sql, sizeof(sql), HISTORY_DDL_FMT, table);
    raw_ok(c, sql);
    snprintf(sql, sizeof(sql), "REVOKE CREATE ON SCHEMA %s FROM CURRENT_USER; "
             "REVOKE ALL ON %s FROM CURRENT_USER", schema, table);
    raw_ok(c, sql);
    CHECK_RC(0, lease_store_open(&s2, url));
    o = conf_opts(a, 30000, NULL, 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s2, key, &o));
    ASSERT_U64_OP(g.token, ==, 3);
    CHECK_RC(0, lease_release(s2, &g));
    CHECK_FAIL(LEASE_EUNSUPPORTED, lease_history(&he, &n, s2, key, 0));
    snprintf(msg, sizeof(msg), "%s", lease_errmsg());
    printf("# no rights on the history table: %s\n", msg);
    if (strstr(msg, "lease_history") == NULL)
        fail_msg("the message does not name the history table: %s", msg);
    ASSERT_NO_SECRET(msg, pw);
    lease_store_close(s2);

    /* Rights granted: a fresh open records the grants. */
    snprintf(sql, sizeof(sql), "GRANT SELECT, INSERT, UPDATE, DELETE ON %s "
             "TO CURRENT_USER", table);
    raw_ok(c, sql);
    CHECK_RC(0, lease_store_open(&s3, url));
    o = conf_opts(b, 30000, "recorded", 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s3, key, &o));
    ASSERT_U64_OP(g.token, ==, 4);
    {
        const hist_want w[] = { { 4, b, LEASE_ENDED_HELD } };
        hist_expect(s3, key, w, 1);
    }
    CHECK_RC(0, lease_release(s3, &g));
    {
        const hist_want w[] = { { 4, b, LEASE_ENDED_RELEASED } };
        hist_expect(s3, key, w, 1);
    }
    rows = history_rows(c, table, key);
    assert_string_equal(rows, "4:released");
    free(rows);
    /* The first handle decided at its open, and still has none. */
    CHECK_FAIL(LEASE_EUNSUPPORTED, lease_history(&he, &n, s1, key, 0));

    lease_store_close(s3);
    lease_store_close(s1);
    free(url);
    free(pw);
    snprintf(sql, sizeof(sql), "DROP SCHEMA %s CASCADE", schema);
    raw_ok(c, sql);
    PQfinish(c);
}

/* hist_expect with `eager` or `deferred`, whichever history `s` keeps. */
#define HIST_EXPECT(s, key, deferred, eager_want, deferred_want)                \
    do {                                                                      \
        if (deferred)                                                         \
            hist_expect(s, key, deferred_want,                                \
                        sizeof(deferred_want) / sizeof(deferred_want[0]));    \
        else                                                                  \
            hist_expect(s, key, eager_want,                                   \
                        sizeof(eager_want) / sizeof(eager_want[0]));          \
    } while (0)

/* The rows of the history table for `key` are `eager` or `deferred`. */
static void rows_expect(PGconn *c, const char *key, int deferred, const char *eager,
                        const char *deferred_rows)
{
    char *v = history_rows(c, "lease_history", key);

    assert_string_equal(v, deferred ? deferred_rows : eager);
    free(v);
}

/*
 * Grants made by the reference SQL run by hand (which keeps no history)
 * between the library's, through `s` and the raw connection `c`, whose
 * tables are the same. They are not in the history, and the library's
 * entries still end right. With an eager history (a lease table without
 * acquired_at: entries written when grants begin), each library grant
 * ends the previous library entry: released when the reference release
 * UPDATE freed the key (time unknown), expired when a raw grant came in
 * between, expired at its lease_until when nothing did. With a deferred
 * one (entries written when grants end, src/stores/pg/pg.c DEFERRED), a
 * library grant that the reference SQL released or took over is not in
 * the history (the row no longer says whose it was), every other one is.
 * Tokens strictly decreasing, and held only for the current lease, at
 * every step.
 */
static void refsql_interleaved(lease_store *s, PGconn *c, int deferred)
{
    char key[LEASE_KEY_MAX + 1], r1[LEASE_OWNER_BUFSZ], r2[LEASE_OWNER_BUFSZ];
    char r3[LEASE_OWNER_BUFSZ], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    char cc[LEASE_OWNER_BUFSZ], d[LEASE_OWNER_BUFSZ], e[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_grant ga, gb, gc, gd, ge;
    lease_history_entry *h;
    size_t n;
    const char *kv[1];

    conf_key(key, deferred ? "history/refsql-deferred" : "history/refsql-eager");
    conf_owner(r1);
    conf_owner(r2);
    conf_owner(r3);
    conf_owner(a);
    conf_owner(b);
    conf_owner(cc);
    conf_owner(d);
    conf_owner(e);
    kv[0] = key;

    /* The reference SQL first: the row is its own (token 1), freed by its own
     * release; nothing in the history. */
    assert_true(refsql_acquire(c, key, r1, "30 seconds") == 1);
    assert_int_equal(refsql_rows(c, REFSQL_RELEASE, 3, key, r1, 1, NULL), 1);
    hist_expect(s, key, NULL, 0);

    /* The library: 2, released by the library. */
    o = conf_opts(a, 30000, "A", 0);
    CHECK_RC(0, lease_acquire(&ga, NULL, s, key, &o));
    ASSERT_U64_OP(ga.token, ==, 2);
    {
        const hist_want w[] = { { 2, a, LEASE_ENDED_HELD } };
        hist_expect(s, key, w, 1);
    }
    expect_unended_only(c, "lease_history", key, 2);
    CHECK_RC(0, lease_release(s, &ga));

    /* The reference SQL: 3, released by the reference SQL; not in the history. */
    assert_true(refsql_acquire(c, key, r2, "30 seconds") == 3);
    {
        const hist_want w[] = { { 2, a, LEASE_ENDED_RELEASED } };
        hist_expect(s, key, w, 1);
    }
    assert_int_equal(refsql_rows(c, REFSQL_RELEASE, 3, key, r2, 3, NULL), 1);

    /* The library: 4. The reference SQL is refused and renews it (no change). */
    o = conf_opts(b, 30000, "B", 0);
    CHECK_RC(0, lease_acquire(&gb, NULL, s, key, &o));
    ASSERT_U64_OP(gb.token, ==, 4);
    expect_unended_only(c, "lease_history", key, 4);
    assert_true(refsql_acquire(c, key, r3, "30 seconds") == 0);
    assert_int_equal(refsql_rows(c, REFSQL_RENEW, 4, key, b, 4, "30 seconds"), 1);
    {
        const hist_want w[] = { { 4, b, LEASE_ENDED_HELD },
                                { 2, a, LEASE_ENDED_RELEASED } };
        hist_expect(s, key, w, 2);
    }
    /* The reference release UPDATE ends the library's grant 4 (its holder
     * using raw SQL): read as released at once, or, deferred, gone. */
    assert_int_equal(refsql_rows(c, REFSQL_RELEASE, 3, key, b, 4, NULL), 1);
    {
        const hist_want w[] = { { 4, b, LEASE_ENDED_RELEASED },
                                { 2, a, LEASE_ENDED_RELEASED } };
        const hist_want wd[] = { { 2, a, LEASE_ENDED_RELEASED } };
        HIST_EXPECT(s, key, deferred, w, wd);
    }

    /* ... and recorded released by the library's next grant, 5. */
    o = conf_opts(cc, 300, "C", 0);
    CHECK_RC(0, lease_acquire(&gc, NULL, s, key, &o));
    ASSERT_U64_OP(gc.token, ==, 5);
    {
        const hist_want w[] = { { 5, cc, LEASE_ENDED_HELD },
                                { 4, b, LEASE_ENDED_RELEASED },
                                { 2, a, LEASE_ENDED_RELEASED } };
        const hist_want wd[] = { { 5, cc, LEASE_ENDED_HELD },
                                 { 2, a, LEASE_ENDED_RELEASED } };
        HIST_EXPECT(s, key, deferred, w, wd);
    }
    expect_unended_only(c, "lease_history", key, 5);
    rows_expect(c, key, deferred, "2:released,4:released,5:held", "2:released");

    /* 5 runs out; the reference SQL takes the key (6) with a short lease that
     * runs out too. 5 reads expired (6 is not the library's), or, deferred,
     * is gone with the row's record of it. */
    (void)conf_wait_free_on(s, key, gc.ttl_ms);
    assert_true(refsql_acquire(c, key, r3, "300 milliseconds") == 6);
    {
        const hist_want w[] = { { 5, cc, LEASE_ENDED_EXPIRED },
                                { 4, b, LEASE_ENDED_RELEASED },
                                { 2, a, LEASE_ENDED_RELEASED } };
        const hist_want wd[] = { { 2, a, LEASE_ENDED_RELEASED } };
        HIST_EXPECT(s, key, deferred, w, wd);
    }
    (void)conf_wait_free_on(s, key, 300);

    /* The library's 7 records 5 expired, though 6 came in between (eager);
     * deferred, it takes the raw grant's expired lease over and writes no
     * entry for it. */
    o = conf_opts(d, 300, "D", 0);
    CHECK_RC(0, lease_acquire(&gd, NULL, s, key, &o));
    ASSERT_U64_OP(gd.token, ==, 7);
    {
        const hist_want w[] = { { 7, d, LEASE_ENDED_HELD },
                                { 5, cc, LEASE_ENDED_EXPIRED },
                                { 4, b, LEASE_ENDED_RELEASED },
                                { 2, a, LEASE_ENDED_RELEASED } };
        const hist_want wd[] = { { 7, d, LEASE_ENDED_HELD },
                                 { 2, a, LEASE_ENDED_RELEASED } };
        HIST_EXPECT(s, key, deferred, w, wd);
    }
    expect_unended_only(c, "lease_history", key, 7);
    rows_expect(c, key, deferred, "2:released,4:released,5:expired,7:held",
                "2:released");

    /* 7 runs out with nothing in between: 8 records it expired at its
     * lease_until, which the store knows (acquired + ttl). */
    (void)conf_wait_free_on(s, key, gd.ttl_ms);
    o = conf_opts(e, 30000, "E", 0);
    CHECK_RC(0, lease_acquire(&ge, NULL, s, key, &o));
    ASSERT_U64_OP(ge.token, ==, 8);
    {
        const hist_want w[] = { { 8, e, LEASE_ENDED_HELD },
                                { 7, d, LEASE_ENDED_EXPIRED },
                                { 5, cc, LEASE_ENDED_EXPIRED },
                                { 4, b, LEASE_ENDED_RELEASED },
                                { 2, a, LEASE_ENDED_RELEASED } };
        const hist_want wd[] = { { 8, e, LEASE_ENDED_HELD },
                                 { 7, d, LEASE_ENDED_EXPIRED },
                                 { 2, a, LEASE_ENDED_RELEASED } };
        HIST_EXPECT(s, key, deferred, w, wd);
    }
    expect_unended_only(c, "lease_history", key, 8);
    rows_expect(c, key, deferred, "2:released,4:released,5:expired,7:expired,8:held",
                "2:released,7:expired");
    CHECK_RC(0, lease_history(&h, &n, s, key, 2));
    assert_int_equal(n, 2);
    ASSERT_U64_OP(h[1].token, ==, 7);
    ASSERT_U64_OP(h[1].ttl_ms, ==, gd.ttl_ms);
    ASSERT_I64_OP(h[1].ended_ms, >=, h[1].acquired_ms + (int64_t)gd.ttl_ms - 1);
    ASSERT_I64_OP(h[1].ended_ms, <=, h[1].acquired_ms + (int64_t)gd.ttl_ms + 1);
    lease_history_free(h);

    /* Released: nothing is left unended. */
    CHECK_RC(0, lease_release(s, &ge));
    rows_expect(c, key, deferred, "2:released,4:released,5:expired,7:expired,8:released",
                "2:released,7:expired,8:released");
    assert_int_equal(raw_ll(c, "SELECT count(*) FROM lease_history "
                               "WHERE resource_key = $1 AND ended IS NULL", 1, kv), 0);
}

/* Deferred: the store's own tables (made with acquired_at). */
void test_history_refsql_sql_interleaved(void **state)
{
    PGconn *c = raw_connect(conf_url); /* default search_path: conf_store's tables */

    (void)state;
    refsql_interleaved(conf_store, c, 1);
    PQfinish(c);
}

/* Eager: the lease table of the version before the history, which has
 * no acquired_at, in a schema of its own. */
void test_history_refsql_sql_interleaved_eager(void **state)
{
    char schema[40], sql[160];
    char *url = NULL;
    lease_store *s;
    PGconn *c = raw_connect(conf_url);

    (void)state;
    url = pre_history_schema(c, schema, sizeof(schema), "hre");
    snprintf(sql, sizeof(sql), "SET search_path = %s", schema);
    raw_ok(c, sql);
    CHECK_RC(0, lease_store_open(&s, url));
    refsql_interleaved(s, c, 0);
    lease_store_close(s);
    raw_ok(c, "RESET search_path");
    snprintf(sql, sizeof(sql), "DROP SCHEMA %s CASCADE", schema);
    raw_ok(c, sql);
    free(url);
    PQfinish(c);
}

/*
 * history_table=NAME: the history goes to that table (plain or
 * schema.table), made when missing, and nowhere else; a table of that
 * name that is not a history is left alone (the store opens without a
 * history, saying so); a name that is not a plain lower-case identifier
 * is refused at open with EINVALID.
 */
void test_history_table_name_from_url(void **state)
{
    char name[13], ht[40], hq[64], nh[40], params[128], sql[512], msg[1024];
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    char *url, *pw, *v;
    lease_store *s;
    lease_acquire_opts o;
    lease_grant g;
    lease_history_entry *he;
    size_t n, i;
    PGconn *c;
    const char *kv[1];
    static const char *const bad[] = {
        "history_table=Upper",   "history_table=x%3Bdrop", "history_table=a.b.c",
        "history_table=",        "history_table=x%22y",    "history_table=.x",
        "history_table=x.",      "history_table=1abc",     "history_table=x%20y",
        "history_table=lease-history",
    };

    (void)state;
    pg_rand_name(name);
    snprintf(ht, sizeof(ht), "th_%s", name);
    snprintf(hq, sizeof(hq), "thq_%s.grants", name);
    snprintf(nh, sizeof(nh), "tn_%s", name);
    conf_key(key, "history/table-name");
    conf_owner(a);
    conf_owner(b);
    pw = url_password(conf_url);
    c = raw_connect(conf_url);
    kv[0] = key;

    /* A plain name: made, and the grants are there. */
    snprintf(params, sizeof(params), "history_table=%s", ht);
    url = url_with(conf_url, params);
    CHECK_RC(0, lease_store_open(&s, url));
    free(url);
    o = conf_opts(a, 30000, "named", 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    CHECK_RC(0, lease_release(s, &g));
    o = conf_opts(b, 30000, NULL, 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 2);
    {
        const hist_want w[] = { { 2, b, LEASE_ENDED_HELD },
                                { 1, a, LEASE_ENDED_RELEASED } };
        hist_expect(s, key, w, 2);
    }
    /* The held grant 2 has no entry yet: it is written when it ends (the
     * store's own lease table has acquired_at: a deferred history). */
    v = history_rows(c, ht, key);
    assert_string_equal(v, "1:released");
    free(v);
    snprintf(sql, sizeof(sql), "SELECT owner_id::text || ' ' || holder_label || ' ' "
             "|| lease_ttl_ms FROM %s WHERE resource_key = $1 AND fencing_token = 1",
             ht);
    v = raw_scalar(c, sql, 1, kv);
    {
        char want[128];
        snprintf(want, sizeof(want), "%s named 30000", a);
        assert_string_equal(v, want);
    }
    free(v);
    /* ... and not in the default table, which the default handle reads:
     * it shows the lease row's grant alone, which the two share. */
    assert_int_equal(raw_ll(c, "SELECT count(*) FROM lease_history "
                               "WHERE resource_key = $1", 1, kv), 0);
    {
        const hist_want w[] = { { 2, b, LEASE_ENDED_HELD } };
        hist_expect(conf_store, key, w, 1);
    }
    CHECK_RC(0, lease_release(s, &g));
    v = history_rows(c, ht, key);
    assert_string_equal(v, "1:released,2:released");
    free(v);
    lease_store_close(s);

    /* schema.table */
    snprintf(sql, sizeof(sql), "CREATE SCHEMA thq_%s", name);
    raw_ok(c, sql);
    snprintf(params, sizeof(params), "history_table=%s", hq);
    url = url_with(conf_url, params);
    CHECK_RC(0, lease_store_open(&s, url));
    free(url);
    o = conf_opts(a, 30000, NULL, 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 3);
    CHECK_RC(0, lease_release(s, &g));
    v = history_rows(c, hq, key);
    assert_string_equal(v, "3:released");
    free(v);
    lease_store_close(s);

    /* A table of that name that is something else: used for nothing, left
     * as it was; the store works without a history and says why. */
    snprintf(sql, sizeof(sql), "CREATE TABLE %s (resource_key text, note text); "
             "INSERT INTO %s VALUES ('k', 'mine')", nh, nh);
    raw_ok(c, sql);
    snprintf(params, sizeof(params), "history_table=%s", nh);
    url = url_with(conf_url, params);
    CHECK_RC(0, lease_store_open(&s, url));
    free(url);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 4);
    CHECK_RC(0, lease_release(s, &g));
    CHECK_FAIL(LEASE_EUNSUPPORTED, lease_history(&he, &n, s, key, 0));
    snprintf(msg, sizeof(msg), "%s", lease_errmsg());
    printf("# history_table naming another kind of table: %s\n", msg);
    if (strstr(msg, nh) == NULL)
        fail_msg("the message does not name the table %s: %s", nh, msg);
    ASSERT_NO_SECRET(msg, pw);
    snprintf(sql, sizeof(sql), "SELECT string_agg(resource_key || '=' || note, ',') "
             "FROM %s", nh);
    v = raw_scalar(c, sql, 0, NULL);
    assert_string_equal(v, "k=mine");
    free(v);
    lease_store_close(s);

    /* Another lease table has tokens of its own, so a history of its own:
     * <lease_table>_history by default. The default table's history keeps
     * its row for the same key and a different token 1 does not replace
     * or prune it. */
    o = conf_opts(a, 30000, "default-table", 0);
    CHECK_RC(0, lease_acquire(&g, NULL, conf_store, key, &o));
    ASSERT_U64_OP(g.token, ==, 5);
    CHECK_RC(0, lease_release(conf_store, &g));
    snprintf(params, sizeof(params), "lease_table=tl_%s", name);
    url = url_with(conf_url, params);
    CHECK_RC(0, lease_store_open(&s, url));
    free(url);
    o = conf_opts(b, 30000, "other-table", 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 1);
    CHECK_RC(0, lease_release(s, &g));
    lease_store_close(s);
    snprintf(sql, sizeof(sql), "tl_%s_history", name);
    v = history_rows(c, sql, key);
    assert_string_equal(v, "1:released");
    free(v);
    v = history_rows(c, "lease_history", key);
    assert_string_equal(v, "5:released");
    free(v);

    /* Names that are not plain lower-case identifiers: EINVALID. */
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *u = url_with(conf_url, bad[i]);
        lease_store *x = NULL;
        int rc;
        lease_error_clear();
        rc = lease_store_open(&x, u);
        free(u);
        if (rc != LEASE_EINVALID) {
            snprintf(msg, sizeof(msg), "%s", lease_errmsg());
            lease_store_close(x); /* it may have opened */
            fail_msg("opening with %s: expected EINVALID, got %s (%s)", bad[i],
                     lease_error_name(rc), msg);
        }
        assert_null(x);
        if (lease_errmsg()[0] == '\0')
            fail_msg("opening with %s: EINVALID without a message", bad[i]);
        ASSERT_NO_SECRET(lease_errmsg(), pw);
    }
    v = raw_scalar(c, "SELECT (to_regclass('\"Upper\"') IS NULL AND "
                      "to_regclass('\"1abc\"') IS NULL)::text", 0, NULL);
    assert_string_equal(v, "true");
    free(v);

    snprintf(sql, sizeof(sql), "DROP TABLE %s, %s; DROP SCHEMA thq_%s CASCADE", ht,
             nh, name);
    raw_ok(c, sql);
    snprintf(sql, sizeof(sql), "DROP TABLE tl_%s, tl_%s_history", name, name);
    raw_ok(c, sql);
    free(pw);
    PQfinish(c);
}

/*
 * Pruning in batches: the acquire prunes every 32nd token (consecutive
 * counter tokens here), so a key keeps between LEASE_HISTORY_KEEP and
 * KEEP + 31 rows, never more, and lease_history() shows exactly the newest
 * KEEP, as when every grant pruned.
 */
void test_history_pruned_in_batches(void **state)
{
    enum { GRANTS = LEASE_HISTORY_KEEP + 70 };
    char key[LEASE_KEY_MAX + 1], owner[LEASE_OWNER_BUFSZ];
    lease_history_entry *h;
    lease_grant g;
    long long rows, most = 0;
    const char *kv[1];
    size_t n, i;
    PGconn *c;

    (void)state;
    conf_key(key, "history/batches");
    conf_owner(owner);
    c = raw_connect(conf_url);
    kv[0] = key;
    for (i = 0; i < GRANTS; i++) {
        g = conf_acquire(key, owner, 30000, NULL);
        CHECK_RC(0, lease_release(conf_store, &g));
        rows = raw_ll(c, "SELECT count(*) FROM lease_history WHERE resource_key = $1",
                      1, kv);
        if (rows > most)
            most = rows;
    }
    printf("# %d grants: at most %lld history rows for the key, %lld at the end\n",
           (int)GRANTS, most, rows);
    ASSERT_I64_OP(most, <=, LEASE_HISTORY_KEEP + 31);
    ASSERT_I64_OP(rows, >=, LEASE_HISTORY_KEEP);
    CHECK_RC(0, lease_history(&h, &n, conf_store, key, LEASE_HISTORY_READ_MAX));
    assert_int_equal(n, LEASE_HISTORY_KEEP);
    for (i = 0; i < n; i++) {
        ASSERT_U64_OP(h[i].token, ==, g.token - i);
        assert_int_equal(h[i].ended, LEASE_ENDED_RELEASED);
    }
    lease_history_free(h);
    PQfinish(c);
}

/*
 * A lease table dropped and made anew restarts its counter tokens while
 * its history keeps the old entries: the first new grant's token is one
 * of them. The grant still succeeds, and the history then shows the new
 * grants only, not the leftovers above them. Eager (the table made anew
 * without acquired_at): the acquire's history insert is a plain INSERT;
 * on the unique violation the store deletes the key's entries above the
 * lease row's token and tries once more. Deferred (made anew by the
 * store): the held grant has no entry and the history does not show the
 * leftovers above it; its release meets the leftover of its token, and
 * runs again overwriting it and deleting those above.
 */
static void tokens_restarted(int deferred)
{
    char name[13], params[64], sql[512], ht[40], key[LEASE_KEY_MAX + 1];
    char owner[LEASE_OWNER_BUFSZ], *url, *v;
    lease_acquire_opts o;
    lease_store *s;
    lease_grant g;
    PGconn *c;
    int i;

    pg_rand_name(name);
    conf_key(key, "history/restarted");
    conf_owner(owner);
    c = raw_connect(conf_url);
    snprintf(params, sizeof(params), "lease_table=tr_%s", name);
    snprintf(ht, sizeof(ht), "tr_%s_history", name);
    url = url_with(conf_url, params);
    CHECK_RC(0, lease_store_open(&s, url));
    o = conf_opts(owner, 30000, NULL, 0);
    for (i = 0; i < 3; i++) {
        CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
        CHECK_RC(0, lease_release(s, &g));
    }
    ASSERT_U64_OP(g.token, ==, 3);
    lease_store_close(s);
    snprintf(sql, sizeof(sql), "DROP TABLE tr_%s", name);
    raw_ok(c, sql);
    if (!deferred) {
        snprintf(sql, sizeof(sql), "CREATE TABLE tr_%s (resource_key text PRIMARY KEY, "
                 "owner_id uuid, lease_until timestamptz NOT NULL DEFAULT "
                 "'-infinity'::timestamptz, fencing_token bigint NOT NULL DEFAULT 0, "
                 "holder_label text, lease_ttl_ms bigint, holder_token bigint)", name);
        raw_ok(c, sql);
    }

    CHECK_RC(0, lease_store_open(&s, url));
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 1);
    {
        const hist_want w[] = { { 1, owner, LEASE_ENDED_HELD } };
        hist_expect(s, key, w, 1);
    }
    v = history_rows(c, ht, key);
    assert_string_equal(v, deferred ? "1:released,2:released,3:released" : "1:held");
    free(v);
    CHECK_RC(0, lease_release(s, &g));
    v = history_rows(c, ht, key);
    assert_string_equal(v, "1:released");
    free(v);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 2);
    CHECK_RC(0, lease_release(s, &g));
    v = history_rows(c, ht, key);
    assert_string_equal(v, "1:released,2:released");
    free(v);
    lease_store_close(s);
    free(url);
    snprintf(sql, sizeof(sql), "DROP TABLE tr_%s, %s", name, ht);
    raw_ok(c, sql);
    PQfinish(c);
}

void test_history_tokens_restarted(void **state)
{
    (void)state;
    tokens_restarted(1);
}

void test_history_tokens_restarted_eager(void **state)
{
    (void)state;
    tokens_restarted(0);
}
