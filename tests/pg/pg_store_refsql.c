/*
 * pg_store_refsql.c - the reference SQL (the statements of pg_test.h, word
 * for word) and the store on the same tables: a table made with the
 * reference DDL used as it is, the reference statements on the table lease
 * makes, the token continuing across both, and tables named by the URL.
 */
#include "pg_store.h"

/* ======================================================================
 * the reference schema and statements
 * ====================================================================== */

/* Acquire with the reference statement: the token, or 0 when busy. */
uint64_t refsql_acquire(PGconn *c, const char *key, const char *owner,
                                const char *interval)
{
    const char *v[3] = { key, owner, interval };
    PGresult *r = raw_exec(c, PGRES_TUPLES_OK, REFSQL_ACQUIRE, 3, v);
    uint64_t tok = PQntuples(r) == 1 ? strtoull(PQgetvalue(r, 0, 0), NULL, 10) : 0;

    PQclear(r);
    return tok;
}

/* The reference renew, release and check: the number of rows. */
int refsql_rows(PGconn *c, const char *sql, int n, const char *key,
                        const char *owner, uint64_t token, const char *interval)
{
    char tok[24];
    const char *v[4] = { key, owner, tok, interval };
    PGresult *r;
    int rows = -1; /* fail_msg does not return; -O2 cannot tell */

    snprintf(tok, sizeof(tok), "%" PRIu64, token);
    r = PQexecParams(c, sql, n, NULL, v, NULL, NULL, 0);
    if (PQresultStatus(r) == PGRES_TUPLES_OK)
        rows = PQntuples(r);
    else if (PQresultStatus(r) == PGRES_COMMAND_OK)
        rows = atoi(PQcmdTuples(r));
    else {
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", PQresultErrorMessage(r));
        PQclear(r);
        fail_msg("reference SQL failed: %s", msg);
    }
    PQclear(r);
    return rows;
}

/*
 * A database where someone created coordination_lease with the reference SQL's
 * own DDL: lease uses it as it is (no column added), and leases written
 * by the reference raw statements and by lease interoperate, the token
 * continuing across both. The table is found under its default name
 * through search_path, given in the URL's libpq `options`.
 */
void test_schema_refsql_table_interop(void **state)
{
    char schema[32], name[13], sql[512], key[LEASE_KEY_MAX + 1];
    char r1[LEASE_OWNER_BUFSZ], r2[LEASE_OWNER_BUFSZ], l1[LEASE_OWNER_BUFSZ];
    char l2[LEASE_OWNER_BUFSZ], r3[LEASE_OWNER_BUFSZ], params[128];
    char *url, *cols;
    lease_store *s;
    lease_acquire_opts o;
    lease_grant g, raw;
    lease_info info, h;
    PGconn *c;
    uint64_t t;
    const char *kv[1];

    (void)state;
    pg_rand_name(name);
    snprintf(schema, sizeof(schema), "ch_%s", name);
    conf_key(key, "refsql/tenant-42");
    conf_owner(r1);
    conf_owner(r2);
    conf_owner(r3);
    conf_owner(l1);
    conf_owner(l2);

    c = raw_connect(conf_url);
    snprintf(sql, sizeof(sql), "CREATE SCHEMA %s; SET search_path = %s", schema,
             schema);
    raw_ok(c, sql);
    raw_ok(c, REFSQL_DDL);

    snprintf(params, sizeof(params), "options=-c%%20search_path%%3D%s", schema);
    url = url_with(conf_url, params);
    CHECK_RC(0, lease_store_open(&s, url));

    /* Used as it is: the reference four columns, nothing added. */
    snprintf(sql, sizeof(sql),
             "SELECT string_agg(column_name || ':' || data_type, ',' "
             "ORDER BY ordinal_position) FROM information_schema.columns "
             "WHERE table_schema = '%s' AND table_name = 'coordination_lease'",
             schema);
    cols = raw_scalar(c, sql, 0, NULL);
    assert_string_equal(cols, "resource_key:text,owner_id:uuid,"
                              "lease_until:timestamp with time zone,"
                              "fencing_token:bigint");
    free(cols);

    /* The reference SQL acquires: token 1. lease sees it and is refused. */
    assert_true(refsql_acquire(c, key, r1, "30 seconds") == 1);
    CHECK_RC(0, lease_inspect(&info, s, key));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.owner, r1);
    ASSERT_U64_OP(info.token, ==, 1);
    assert_string_equal(info.label, "");
    ASSERT_U64_OP(info.remaining_ms, >, 0);
    ASSERT_U64_OP(info.remaining_ms, <=, 30000);
    o = conf_opts(l1, 30000, "lease-1", 0);
    memset(&h, 0, sizeof(h));
    CHECK_FAIL(LEASE_EBUSY, lease_acquire(&g, &h, s, key, &o));
    assert_string_equal(h.owner, r1);
    ASSERT_U64_OP(h.token, ==, 1);

    /* lease renews and releases the reference lease from (owner, token). */
    CHECK_RC(0, lease_grant_init(&raw, key, r1, 1, 30000));
    CHECK_RC(0, lease_renew(&raw, s, 0));
    CHECK_RC(0, lease_release(s, &raw));
    /* ... leaving the row as the reference release does. */
    kv[0] = key;
    snprintf(sql, sizeof(sql),
             "SELECT coalesce(owner_id::text, 'NULL') || ' ' || "
             "(lease_until = '-infinity') || ' ' || fencing_token "
             "FROM %s.coordination_lease WHERE resource_key = $1", schema);
    cols = raw_scalar(c, sql, 1, kv);
    assert_string_equal(cols, "NULL true 1");
    free(cols);

    /* lease acquires: token 2; the reference SQL is refused, renews it, runs the
     * guarded check on it, and releases it. */
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 2);
    assert_true(refsql_acquire(c, key, r2, "30 seconds") == 0);
    assert_int_equal(refsql_rows(c, REFSQL_RENEW, 4, key, l1, 2, "30 seconds"), 1);
    assert_int_equal(refsql_rows(c, REFSQL_RENEW, 4, key, r2, 2, "30 seconds"), 0);
    assert_int_equal(refsql_rows(c, REFSQL_RENEW, 4, key, l1, 1, "30 seconds"), 0);
    raw_ok(c, "BEGIN");
    assert_int_equal(refsql_rows(c, REFSQL_CHECK, 3, key, l1, 2, NULL), 1);
    raw_ok(c, "COMMIT");
    assert_int_equal(refsql_rows(c, REFSQL_RELEASE, 3, key, l1, 1, NULL), 0);
    assert_int_equal(refsql_rows(c, REFSQL_RELEASE, 3, key, l1, 2, NULL), 1);
    CHECK_RC(0, lease_inspect(&info, s, key));
    assert_int_equal(info.held, 0);
    ASSERT_U64_OP(info.token, ==, 2);
    /* lease's grant is gone: the reference SQL released it. */
    CHECK_FAIL(LEASE_ELOST, lease_renew(&g, s, 0));

    /* The reference SQL again: 3; lease after its release: 4. */
    assert_true(refsql_acquire(c, key, r2, "30 seconds") == 3);
    o = conf_opts(l2, 30000, NULL, 0);
    CHECK_FAIL(LEASE_EBUSY, lease_acquire(&g, NULL, s, key, &o));
    assert_int_equal(refsql_rows(c, REFSQL_RELEASE, 3, key, r2, 3, NULL), 1);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 4);
    CHECK_RC(0, lease_release(s, &g));

    /* Expiry by the store's clock works both ways: a short reference-SQL lease
     * expires for lease, and the next holder gets a greater token. */
    assert_true(refsql_acquire(c, key, r3, "200 milliseconds") == 5);
    {
        lease_store *keep = conf_store;
        conf_store = s;
        (void)conf_wait_free(key, 200);
        conf_store = keep;
    }
    o = conf_opts(l1, 200, NULL, 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 6);
    t = 0;
    {
        /* ... and a short lease of lease's expires for the reference SQL. */
        int64_t end = conf_now_ms() + conf_expiry_bound_ms(200);
        while ((t = refsql_acquire(c, key, r1, "30 seconds")) == 0 &&
               conf_now_ms() < end)
            conf_sleep_ms(20);
    }
    ASSERT_U64_OP(t, ==, 7);
    CHECK_FAIL(LEASE_ELOST, lease_renew(&g, s, 0));
    assert_int_equal(refsql_rows(c, REFSQL_RELEASE, 3, key, r1, 7, NULL), 1);

    /* Names that are not valid UTF-8 live in the same table. */
    {
        char odd[LEASE_KEY_MAX + 1];
        conf_key(odd, "refsql/\xff\xfe");
        o = conf_opts(l1, 30000, NULL, 0);
        CHECK_RC(0, lease_acquire(&g, NULL, s, odd, &o));
        CHECK_RC(0, lease_inspect(&info, s, odd));
        assert_string_equal(info.key, odd);
        CHECK_RC(0, lease_release(s, &g));
    }

    lease_store_close(s);
    free(url);
    snprintf(sql, sizeof(sql), "DROP SCHEMA %s CASCADE", schema);
    raw_ok(c, sql);
    PQfinish(c);
}

/*
 * The table lease creates itself (with its optional label and ttl
 * columns) takes the reference raw statements too.
 */
void test_schema_refsql_sql_on_lease_table(void **state)
{
    char key[LEASE_KEY_MAX + 1], r1[LEASE_OWNER_BUFSZ], l1[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_grant g, raw;
    lease_info info;
    PGconn *c;

    (void)state;
    conf_key(key, "refsql/default-table");
    conf_owner(r1);
    conf_owner(l1);
    c = raw_connect(conf_url); /* default search_path: public */

    o = conf_opts(l1, 30000, "lease's label", 0);
    g = conf_acquire(key, l1, 30000, "lease's label");
    assert_true(refsql_acquire(c, key, r1, "30 seconds") == 0);
    assert_int_equal(refsql_rows(c, REFSQL_RENEW, 4, key, l1, g.token, "30 seconds"), 1);
    assert_int_equal(refsql_rows(c, REFSQL_RELEASE, 3, key, l1, g.token, NULL), 1);
    assert_true(refsql_acquire(c, key, r1, "30 seconds") == g.token + 1);
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.owner, r1);
    ASSERT_U64_OP(info.token, ==, g.token + 1);
    CHECK_RC(0, lease_grant_init(&raw, key, r1, g.token + 1, 30000));
    CHECK_RC(0, lease_release(conf_store, &raw));
    CHECK_RC(0, lease_acquire(&g, NULL, conf_store, key, &o));
    ASSERT_U64_OP(g.token, ==, raw.token + 1);
    CHECK_RC(0, lease_release(conf_store, &g));
    PQfinish(c);
    /* The raw holder gave no label: inspect must not show the label of
     * the holder before it (the reference upsert leaves holder_label as
     * it was). Checked last, so that the rest above still runs. */
    if (strcmp(info.label, "") != 0)
        fail_msg("a lease taken by the reference SQL (owner %s) is shown with "
                 "the previous holder's label '%s'", r1, info.label);
}

/* lease_table=, fence_table=, data_table=: plain and schema-qualified
 * names are used (and made); anything else is EINVALID. */
void test_schema_table_names_from_url(void **state)
{
    char name[13], params[256], sql[512], key[LEASE_KEY_MAX + 1];
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ], lt[64], ft[64], dt[64];
    char *url, *url_sq, *v;
    lease_store *s, *s2, *sq;
    lease_acquire_opts o;
    lease_grant g;
    lease_info info;
    uint64_t mark;
    void *val;
    size_t len;
    PGconn *c;
    const char *kv[1];
    static const char *const bad[] = {
        "lease_table=Upper", "lease_table=x%3Bdrop", "lease_table=a.b.c",
        "lease_table=", "fence_table=x%22y", "data_table=.x",
        "lease_table=1abc", "fence_table=x%20y",
    };
    size_t i;

    (void)state;
    pg_rand_name(name);
    snprintf(lt, sizeof(lt), "tl_%s", name);
    snprintf(ft, sizeof(ft), "tf_%s", name);
    snprintf(dt, sizeof(dt), "td_%s", name);
    conf_key(key, "tables/k");
    conf_owner(a);
    conf_owner(b);
    c = raw_connect(conf_url);

    snprintf(params, sizeof(params), "lease_table=%s&fence_table=%s&data_table=%s",
             lt, ft, dt);
    url = url_with(conf_url, params);
    CHECK_RC(0, lease_store_open(&s, url));
    o = conf_opts(a, 30000, "tables", 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 1);
    CHECK_RC(0, lease_fence_advance(&mark, s, key, g.token));
    CHECK_RC(0, lease_guarded_put(s, &g, key, "v", 1));

    /* The rows are in the named tables, and nowhere else. */
    kv[0] = key;
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s WHERE resource_key = $1", lt);
    assert_int_equal(raw_ll(c, sql, 1, kv), 1);
    snprintf(sql, sizeof(sql), "SELECT mark FROM %s WHERE resource = $1", ft);
    assert_int_equal(raw_ll(c, sql, 1, kv), 1);
    snprintf(sql, sizeof(sql), "SELECT token FROM %s WHERE name = $1", dt);
    assert_int_equal(raw_ll(c, sql, 1, kv), 1);
    assert_int_equal(raw_ll(c, "SELECT count(*) FROM coordination_lease "
                               "WHERE resource_key = $1", 1, kv), 0);
    assert_int_equal(raw_ll(c, "SELECT count(*) FROM lease_fence "
                               "WHERE resource = $1", 1, kv), 0);
    assert_int_equal(raw_ll(c, "SELECT count(*) FROM lease_data "
                               "WHERE name = $1", 1, kv), 0);
    CHECK_FAIL(LEASE_ENOTFOUND, lease_inspect(&info, conf_store, key));

    /* A second handle on the same tables continues the tokens. */
    CHECK_RC(0, lease_store_open(&s2, url));
    CHECK_RC(0, lease_release(s2, &g));
    o = conf_opts(b, 30000, NULL, 0);
    CHECK_RC(0, lease_acquire(&g, NULL, s2, key, &o));
    ASSERT_U64_OP(g.token, ==, 2);
    CHECK_RC(0, lease_data_get(&val, &len, NULL, s2, key));
    assert_memory_equal(val, "v", 1);
    free(val);
    CHECK_RC(0, lease_release(s2, &g));
    lease_store_close(s2);
    lease_store_close(s);

    /* schema.table */
    snprintf(sql, sizeof(sql), "CREATE SCHEMA sq_%s", name);
    raw_ok(c, sql);
    snprintf(params, sizeof(params),
             "lease_table=sq_%s.leases&fence_table=sq_%s.marks&data_table=sq_%s.vals",
             name, name, name);
    url_sq = url_with(conf_url, params);
    CHECK_RC(0, lease_store_open(&sq, url_sq));
    o = conf_opts(a, 30000, NULL, 0);
    CHECK_RC(0, lease_acquire(&g, NULL, sq, key, &o));
    ASSERT_U64_OP(g.token, ==, 1);
    CHECK_RC(0, lease_fence_advance(&mark, sq, key, 7));
    CHECK_RC(0, lease_guarded_put(sq, &g, key, "w", 1));
    snprintf(sql, sizeof(sql),
             "SELECT (SELECT count(*) FROM sq_%s.leases WHERE resource_key = $1) "
             "+ (SELECT mark FROM sq_%s.marks WHERE resource = $1) "
             "+ (SELECT count(*) FROM sq_%s.vals WHERE name = $1)",
             name, name, name);
    assert_int_equal(raw_ll(c, sql, 1, kv), 1 + 7 + 1);
    CHECK_RC(0, lease_release(sq, &g));
    lease_store_close(sq);

    /* Names that are not plain lower-case identifiers are refused before
     * any SQL is built from them. */
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_open_einvalid(conf_url, bad[i]);
    /* ... and the default table is still there. */
    v = raw_scalar(c, "SELECT to_regclass('coordination_lease') IS NOT NULL", 0, NULL);
    assert_string_equal(v, "t");
    free(v);

    snprintf(sql, sizeof(sql), "DROP TABLE %s, %s, %s; DROP SCHEMA sq_%s CASCADE",
             lt, ft, dt, name);
    raw_ok(c, sql);
    free(url);
    free(url_sq);
    PQfinish(c);
}
