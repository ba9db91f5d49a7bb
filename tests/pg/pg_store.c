/*
 * pg_store.c - the PostgreSQL store against a real server: the chapter's
 * schema and statements, table names from the URL, the grant history
 * table (added to old databases, missing rights, the chapter's SQL in
 * between), the guarded transaction, resource-side fencing, advisory
 * locks, LISTEN/NOTIFY wake-ups, 32 racing connections, and no password
 * in any message.
 *
 *     pg_store URL [TEST_NAME_PATTERN]
 *
 * URL is the shared test server's (scripts/test.sh exports it as
 * LEASE_TEST_PG_URL); without one the program fails, it never skips.
 * The pattern (cmocka's, '*' and '?') picks tests, so that ctest can run
 * the groups as separate tests. Every key lives under "pg/<uuid>/" and
 * every table or schema it makes has a random name, dropped at the end.
 * Waits are bounded; durations are printed, never asserted.
 */
#include <fnmatch.h>

#include "pg_test.h"

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

static void test_advisory_key_is_fnv1a(void **state)
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
 * the chapter's schema and statements
 * ====================================================================== */

/* Acquire with the chapter's statement: the token, or 0 when busy. */
static uint64_t chapter_acquire(PGconn *c, const char *key, const char *owner,
                                const char *interval)
{
    const char *v[3] = { key, owner, interval };
    PGresult *r = raw_exec(c, PGRES_TUPLES_OK, CHAPTER_ACQUIRE, 3, v);
    uint64_t tok = PQntuples(r) == 1 ? strtoull(PQgetvalue(r, 0, 0), NULL, 10) : 0;

    PQclear(r);
    return tok;
}

/* The chapter's renew, release and check: the number of rows. */
static int chapter_rows(PGconn *c, const char *sql, int n, const char *key,
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
        fail_msg("chapter SQL failed: %s", msg);
    }
    PQclear(r);
    return rows;
}

/*
 * A database where someone created coordination_lease with the chapter's
 * own DDL: lease uses it as it is (no column added), and leases written
 * by the chapter's raw statements and by lease interoperate, the token
 * continuing across both. The table is found under its default name
 * through search_path, given in the URL's libpq `options`.
 */
static void test_schema_chapter_table_interop(void **state)
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
    conf_key(key, "chapter/tenant-42");
    conf_owner(r1);
    conf_owner(r2);
    conf_owner(r3);
    conf_owner(l1);
    conf_owner(l2);

    c = raw_connect(conf_url);
    snprintf(sql, sizeof(sql), "CREATE SCHEMA %s; SET search_path = %s", schema,
             schema);
    raw_ok(c, sql);
    raw_ok(c, CHAPTER_DDL);

    snprintf(params, sizeof(params), "options=-c%%20search_path%%3D%s", schema);
    url = url_with(conf_url, params);
    CHECK_RC(0, lease_store_open(&s, url));

    /* Used as it is: the chapter's four columns, nothing added. */
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

    /* The chapter acquires: token 1. lease sees it and is refused. */
    assert_true(chapter_acquire(c, key, r1, "30 seconds") == 1);
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

    /* lease renews and releases the chapter's lease from (owner, token). */
    CHECK_RC(0, lease_grant_init(&raw, key, r1, 1, 30000));
    CHECK_RC(0, lease_renew(&raw, s, 0));
    CHECK_RC(0, lease_release(s, &raw));
    /* ... leaving the row as the chapter's release does. */
    kv[0] = key;
    snprintf(sql, sizeof(sql),
             "SELECT coalesce(owner_id::text, 'NULL') || ' ' || "
             "(lease_until = '-infinity') || ' ' || fencing_token "
             "FROM %s.coordination_lease WHERE resource_key = $1", schema);
    cols = raw_scalar(c, sql, 1, kv);
    assert_string_equal(cols, "NULL true 1");
    free(cols);

    /* lease acquires: token 2; the chapter is refused, renews it, runs the
     * guarded check on it, and releases it. */
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 2);
    assert_true(chapter_acquire(c, key, r2, "30 seconds") == 0);
    assert_int_equal(chapter_rows(c, CHAPTER_RENEW, 4, key, l1, 2, "30 seconds"), 1);
    assert_int_equal(chapter_rows(c, CHAPTER_RENEW, 4, key, r2, 2, "30 seconds"), 0);
    assert_int_equal(chapter_rows(c, CHAPTER_RENEW, 4, key, l1, 1, "30 seconds"), 0);
    raw_ok(c, "BEGIN");
    assert_int_equal(chapter_rows(c, CHAPTER_CHECK, 3, key, l1, 2, NULL), 1);
    raw_ok(c, "COMMIT");
    assert_int_equal(chapter_rows(c, CHAPTER_RELEASE, 3, key, l1, 1, NULL), 0);
    assert_int_equal(chapter_rows(c, CHAPTER_RELEASE, 3, key, l1, 2, NULL), 1);
    CHECK_RC(0, lease_inspect(&info, s, key));
    assert_int_equal(info.held, 0);
    ASSERT_U64_OP(info.token, ==, 2);
    /* lease's grant is gone: the chapter released it. */
    CHECK_FAIL(LEASE_ELOST, lease_renew(&g, s, 0));

    /* The chapter again: 3; lease after its release: 4. */
    assert_true(chapter_acquire(c, key, r2, "30 seconds") == 3);
    o = conf_opts(l2, 30000, NULL, 0);
    CHECK_FAIL(LEASE_EBUSY, lease_acquire(&g, NULL, s, key, &o));
    assert_int_equal(chapter_rows(c, CHAPTER_RELEASE, 3, key, r2, 3, NULL), 1);
    CHECK_RC(0, lease_acquire(&g, NULL, s, key, &o));
    ASSERT_U64_OP(g.token, ==, 4);
    CHECK_RC(0, lease_release(s, &g));

    /* Expiry by the store's clock works both ways: a short chapter lease
     * expires for lease, and the next holder gets a greater token. */
    assert_true(chapter_acquire(c, key, r3, "200 milliseconds") == 5);
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
        /* ... and a short lease of lease's expires for the chapter. */
        int64_t end = conf_now_ms() + conf_expiry_bound_ms(200);
        while ((t = chapter_acquire(c, key, r1, "30 seconds")) == 0 &&
               conf_now_ms() < end)
            conf_sleep_ms(20);
    }
    ASSERT_U64_OP(t, ==, 7);
    CHECK_FAIL(LEASE_ELOST, lease_renew(&g, s, 0));
    assert_int_equal(chapter_rows(c, CHAPTER_RELEASE, 3, key, r1, 7, NULL), 1);

    /* Names that are not valid UTF-8 live in the same table. */
    {
        char odd[LEASE_KEY_MAX + 1];
        conf_key(odd, "chapter/\xff\xfe");
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
 * columns) takes the chapter's raw statements too.
 */
static void test_schema_chapter_sql_on_lease_table(void **state)
{
    char key[LEASE_KEY_MAX + 1], r1[LEASE_OWNER_BUFSZ], l1[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o;
    lease_grant g, raw;
    lease_info info;
    PGconn *c;

    (void)state;
    conf_key(key, "chapter/default-table");
    conf_owner(r1);
    conf_owner(l1);
    c = raw_connect(conf_url); /* default search_path: public */

    o = conf_opts(l1, 30000, "lease's label", 0);
    g = conf_acquire(key, l1, 30000, "lease's label");
    assert_true(chapter_acquire(c, key, r1, "30 seconds") == 0);
    assert_int_equal(chapter_rows(c, CHAPTER_RENEW, 4, key, l1, g.token, "30 seconds"), 1);
    assert_int_equal(chapter_rows(c, CHAPTER_RELEASE, 3, key, l1, g.token, NULL), 1);
    assert_true(chapter_acquire(c, key, r1, "30 seconds") == g.token + 1);
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
     * the holder before it (the chapter's upsert leaves holder_label as
     * it was). Checked last, so that the rest above still runs. */
    if (strcmp(info.label, "") != 0)
        fail_msg("a lease taken by the chapter's SQL (owner %s) is shown with "
                 "the previous holder's label '%s'", r1, info.label);
}

/* lease_table=, fence_table=, data_table=: plain and schema-qualified
 * names are used (and made); anything else is EINVALID. */
static void test_schema_table_names_from_url(void **state)
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
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *u = url_with(conf_url, bad[i]);
        lease_store *x = NULL;
        lease_error_clear();
        if (lease_store_open(&x, u) != LEASE_EINVALID)
            fail_msg("opening with %s: expected EINVALID, got %s (%s)", bad[i],
                     lease_error_name(lease_errcode()), lease_errmsg());
        assert_null(x);
        free(u);
    }
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

/* The history table as src/stores/pg.c documents it, for an administrator
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
static void test_history_table_added_to_old_database(void **state)
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
static void test_history_without_rights(void **state)
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

/*
 * Grants made by the chapter's raw SQL (which keeps no history) between
 * the library's: they are not in the history, and the library's entries
 * still end right. Each library grant ends the previous library entry:
 * released when the chapter's release UPDATE freed the key (time
 * unknown), expired when a raw grant came in between, expired at its
 * lease_until when nothing did. Tokens strictly decreasing, and held
 * only for the current lease, at every step.
 */
static void test_history_chapter_sql_interleaved(void **state)
{
    char key[LEASE_KEY_MAX + 1], r1[LEASE_OWNER_BUFSZ], r2[LEASE_OWNER_BUFSZ];
    char r3[LEASE_OWNER_BUFSZ], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    char cc[LEASE_OWNER_BUFSZ], d[LEASE_OWNER_BUFSZ], e[LEASE_OWNER_BUFSZ], *v;
    lease_grant ga, gb, gc, gd, ge;
    lease_history_entry *h;
    size_t n;
    PGconn *c;
    const char *kv[1];

    (void)state;
    conf_key(key, "history/chapter-sql");
    conf_owner(r1);
    conf_owner(r2);
    conf_owner(r3);
    conf_owner(a);
    conf_owner(b);
    conf_owner(cc);
    conf_owner(d);
    conf_owner(e);
    c = raw_connect(conf_url); /* default search_path: conf_store's tables */
    kv[0] = key;

    /* The chapter first: the row is its own (token 1), freed by its own
     * release; nothing in the history. */
    assert_true(chapter_acquire(c, key, r1, "30 seconds") == 1);
    assert_int_equal(chapter_rows(c, CHAPTER_RELEASE, 3, key, r1, 1, NULL), 1);
    hist_expect(conf_store, key, NULL, 0);

    /* The library: 2, released by the library. */
    ga = conf_acquire(key, a, 30000, "A");
    ASSERT_U64_OP(ga.token, ==, 2);
    {
        const hist_want w[] = { { 2, a, LEASE_ENDED_HELD } };
        hist_expect(conf_store, key, w, 1);
    }
    expect_unended_only(c, "lease_history", key, 2);
    CHECK_RC(0, lease_release(conf_store, &ga));

    /* The chapter: 3, released by the chapter; not in the history. */
    assert_true(chapter_acquire(c, key, r2, "30 seconds") == 3);
    {
        const hist_want w[] = { { 2, a, LEASE_ENDED_RELEASED } };
        hist_expect(conf_store, key, w, 1);
    }
    assert_int_equal(chapter_rows(c, CHAPTER_RELEASE, 3, key, r2, 3, NULL), 1);

    /* The library: 4. The chapter is refused and renews it (no change). */
    gb = conf_acquire(key, b, 30000, "B");
    ASSERT_U64_OP(gb.token, ==, 4);
    expect_unended_only(c, "lease_history", key, 4);
    assert_true(chapter_acquire(c, key, r3, "30 seconds") == 0);
    assert_int_equal(chapter_rows(c, CHAPTER_RENEW, 4, key, b, 4, "30 seconds"), 1);
    {
        const hist_want w[] = { { 4, b, LEASE_ENDED_HELD },
                                { 2, a, LEASE_ENDED_RELEASED } };
        hist_expect(conf_store, key, w, 2);
    }
    /* The chapter's release UPDATE ends the library's grant 4 (its holder
     * using raw SQL): read as released at once ... */
    assert_int_equal(chapter_rows(c, CHAPTER_RELEASE, 3, key, b, 4, NULL), 1);
    {
        const hist_want w[] = { { 4, b, LEASE_ENDED_RELEASED },
                                { 2, a, LEASE_ENDED_RELEASED } };
        hist_expect(conf_store, key, w, 2);
    }

    /* ... and recorded released by the library's next grant, 5. */
    gc = conf_acquire(key, cc, 300, "C");
    ASSERT_U64_OP(gc.token, ==, 5);
    {
        const hist_want w[] = { { 5, cc, LEASE_ENDED_HELD },
                                { 4, b, LEASE_ENDED_RELEASED },
                                { 2, a, LEASE_ENDED_RELEASED } };
        hist_expect(conf_store, key, w, 3);
    }
    expect_unended_only(c, "lease_history", key, 5);
    v = history_rows(c, "lease_history", key);
    assert_string_equal(v, "2:released,4:released,5:held");
    free(v);

    /* 5 runs out; the chapter takes the key (6) with a short lease that
     * runs out too. 5 reads expired (6 is not the library's). */
    (void)conf_wait_free(key, gc.ttl_ms);
    assert_true(chapter_acquire(c, key, r3, "300 milliseconds") == 6);
    {
        const hist_want w[] = { { 5, cc, LEASE_ENDED_EXPIRED },
                                { 4, b, LEASE_ENDED_RELEASED },
                                { 2, a, LEASE_ENDED_RELEASED } };
        hist_expect(conf_store, key, w, 3);
    }
    (void)conf_wait_free(key, 300);

    /* The library's 7 records 5 expired, though 6 came in between. */
    gd = conf_acquire(key, d, 300, "D");
    ASSERT_U64_OP(gd.token, ==, 7);
    {
        const hist_want w[] = { { 7, d, LEASE_ENDED_HELD },
                                { 5, cc, LEASE_ENDED_EXPIRED },
                                { 4, b, LEASE_ENDED_RELEASED },
                                { 2, a, LEASE_ENDED_RELEASED } };
        hist_expect(conf_store, key, w, 4);
    }
    expect_unended_only(c, "lease_history", key, 7);
    v = history_rows(c, "lease_history", key);
    assert_string_equal(v, "2:released,4:released,5:expired,7:held");
    free(v);

    /* 7 runs out with nothing in between: 8 records it expired at its
     * lease_until, which the store knows (acquired + ttl). */
    (void)conf_wait_free(key, gd.ttl_ms);
    ge = conf_acquire(key, e, 30000, "E");
    ASSERT_U64_OP(ge.token, ==, 8);
    {
        const hist_want w[] = { { 8, e, LEASE_ENDED_HELD },
                                { 7, d, LEASE_ENDED_EXPIRED },
                                { 5, cc, LEASE_ENDED_EXPIRED },
                                { 4, b, LEASE_ENDED_RELEASED },
                                { 2, a, LEASE_ENDED_RELEASED } };
        hist_expect(conf_store, key, w, 5);
    }
    expect_unended_only(c, "lease_history", key, 8);
    CHECK_RC(0, lease_history(&h, &n, conf_store, key, 2));
    assert_int_equal(n, 2);
    ASSERT_U64_OP(h[1].token, ==, 7);
    ASSERT_U64_OP(h[1].ttl_ms, ==, gd.ttl_ms);
    ASSERT_I64_OP(h[1].ended_ms, >=, h[1].acquired_ms + (int64_t)gd.ttl_ms - 1);
    ASSERT_I64_OP(h[1].ended_ms, <=, h[1].acquired_ms + (int64_t)gd.ttl_ms + 1);
    lease_history_free(h);

    /* Released: nothing is left unended. */
    CHECK_RC(0, lease_release(conf_store, &ge));
    v = history_rows(c, "lease_history", key);
    assert_string_equal(v, "2:released,4:released,5:expired,7:expired,8:released");
    free(v);
    assert_int_equal(raw_ll(c, "SELECT count(*) FROM lease_history "
                               "WHERE resource_key = $1 AND ended IS NULL", 1, kv), 0);
    PQfinish(c);
}

/*
 * history_table=NAME: the history goes to that table (plain or
 * schema.table), made when missing, and nowhere else; a table of that
 * name that is not a history is left alone (the store opens without a
 * history, saying so); a name that is not a plain lower-case identifier
 * is refused at open with EINVALID.
 */
static void test_history_table_name_from_url(void **state)
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
    v = history_rows(c, ht, key);
    assert_string_equal(v, "1:released,2:held");
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
    /* ... and not in the default table, which the default handle reads. */
    assert_int_equal(raw_ll(c, "SELECT count(*) FROM lease_history "
                               "WHERE resource_key = $1", 1, kv), 0);
    hist_expect(conf_store, key, NULL, 0);
    CHECK_RC(0, lease_release(s, &g));
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
static void test_guarded_txn_locks_and_commits(void **state)
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
static void test_guarded_txn_elost(void **state)
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
static void test_guarded_txn_timeouts(void **state)
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

/* The chapter's UPDATE as the protected write of a guarded transaction. */
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
    r = PQexecParams(native, CHAPTER_REBUILD, 4, chapter_rebuild_types, v, NULL,
                     NULL, 0);
    p->rows = PQresultStatus(r) == PGRES_COMMAND_OK ? atoi(PQcmdTuples(r)) : -1;
    PQclear(r);
    return p->rows == 1 ? 0 : 1;
}

/* The chapter's rebuild_state UPDATE in the resource's own transaction,
 * over plain libpq: the row count is the fencing verdict. */
static int rebuild(PGconn *c, const char *key, uint64_t token, const char *st)
{
    char tok[24];
    const char *v[4] = { key, NULL, tok, st };
    PGresult *r;
    int rows;

    snprintf(tok, sizeof(tok), "%" PRIu64, token);
    raw_ok(c, "BEGIN");
    r = raw_exec_types(c, PGRES_COMMAND_OK, CHAPTER_REBUILD, 4,
                       chapter_rebuild_types, v);
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

static void test_fence_resource_side(void **state)
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

    /* The chapter's resource table and its conditional UPDATE. */
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

static void test_advisory_txn(void **state)
{
    char key[LEASE_KEY_MAX + 1], ks[24], *v, wait_msg[512];
    int lockp[2], gop[2], st, rc, wait_rc;
    adv_probe p;
    int64_t k, t;
    PGconn *c;
    pid_t pid;
    const char *kv[1];

    (void)state;
    /* The chapter's "tenant-42", with this run's prefix so that runs on a
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

/* ======================================================================
 * waiting: LISTEN/NOTIFY wake-ups, and the bound
 * ====================================================================== */

/* Sessions of other processes idle after a LISTEN (the store's waiters). */
static long long listeners(PGconn *c)
{
    PGresult *r = PQexec(c, "SELECT count(*) FROM pg_stat_activity "
                            "WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid() AND state = 'idle' "
                            "AND query ILIKE 'LISTEN%'");
    long long n = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1
                      ? atoll(PQgetvalue(r, 0, 0)) : -1;

    PQclear(r);
    return n;
}

/*
 * A holder with ttl 60 s; a waiter with wait_ms 10000 and
 * backoff_min_ms = backoff_max_ms = 30000, so that without a notification
 * its only tries are at once and when its wait ends. Another process
 * releases after ~300 ms (once the waiter is listening), and 4 s later
 * takes the key for itself with a 60 s ttl: a waiter that was not woken
 * by the release would find the key held at the end of its wait and time
 * out. It must have it: LEASE_OK, a greater token, and the late taker
 * gets EBUSY naming the waiter.
 */
static void test_wait_notify_wakes_waiter(void **state)
{
    char key[LEASE_KEY_MAX + 1], w[LEASE_OWNER_BUFSZ];
    int fds[2], st, rc;
    lease_acquire_opts o;
    lease_grant g;
    lease_info h;
    pg_rec held, rel, late;
    int64_t t;
    pid_t pid;

    (void)state;
    conf_key(key, "notify/wake");
    conf_owner(w);
    conf_pipe(fds);
    conf_store_close();
    pid = conf_fork();
    if (pid == 0) {
        char ho[LEASE_OWNER_BUFSZ], lo[LEASE_OWNER_BUFSZ];
        lease_store *s;
        lease_grant hg, lg;
        lease_info li;
        lease_acquire_opts ho_opts;
        PGconn *c;
        long long base;
        int64_t t0, seen = -1;

        close(fds[0]);
        if (lease_store_open(&s, conf_url) != 0 || lease_owner_new(ho) != 0 ||
            lease_owner_new(lo) != 0) {
            pg_send(fds[1], 1, -100, 0, NULL);
            _exit(10);
        }
        c = PQconnectdb(conf_url);
        base = listeners(c);
        ho_opts = conf_opts(ho, 60000, "holder", 0);
        rc = lease_acquire(&hg, NULL, s, key, &ho_opts);
        pg_send(fds[1], 1, rc, rc == 0 ? hg.token : 0, ho);
        if (rc != 0)
            _exit(11);
        /* Release after ~300 ms, once the waiter listens (at most 5 s). */
        t0 = conf_now_ms();
        for (;;) {
            int64_t el = conf_now_ms() - t0;
            if (seen < 0 && listeners(c) > base)
                seen = el;
            if (el >= 300 && (seen >= 0 || el >= 5000))
                break;
            conf_sleep_ms(10);
        }
        rc = lease_release(s, &hg);
        pg_send(fds[1], 2, rc, (uint64_t)seen, NULL);
        /* 4 s later, take the key (60 s): a waiter not woken loses it. */
        conf_sleep_ms(4000);
        ho_opts = conf_opts(lo, 60000, "late taker", 0);
        memset(&li, 0, sizeof(li));
        rc = lease_acquire(&lg, &li, s, key, &ho_opts);
        pg_send(fds[1], 3, rc, li.token, li.owner);
        PQfinish(c);
        lease_store_close(s);
        _exit(0);
    }
    close(fds[1]);
    held = pg_recv(fds[0], 30000, "holder acquired");
    if (held.rc != 0)
        fail_msg("the holder could not acquire: %s", lease_error_name(held.rc));
    conf_store_open();

    o = conf_opts(w, 60000, "waiter", 10000);
    o.backoff_min_ms = 30000;
    o.backoff_max_ms = 30000;
    memset(&g, 0, sizeof(g));
    t = conf_now_ms();
    rc = lease_acquire(&g, &h, conf_store, key, &o);
    t = conf_now_ms() - t;
    rel = pg_recv(fds[0], 30000, "holder released");
    late = pg_recv(fds[0], 30000, "late taker");
    st = conf_reap(pid, 30000);
    close(fds[0]);
    printf("# waiter (wait 10 s, backoff 30 s): %s after %" PRId64 " ms; holder "
           "saw it listening %" PRId64 " ms and released %" PRId64
           " ms after acquiring\n",
           lease_error_name(rc), t, (int64_t)rel.value, rel.t_ms - held.t_ms);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(rel.rc, 0);
    if (rc != 0)
        fail_msg("the waiter was not woken by the release: %s (%s)",
                 lease_error_name(rc), lease_errmsg());
    ASSERT_U64_OP(g.token, >, held.value);
    /* The late taker found the waiter holding it. */
    CHECK_RC(LEASE_EBUSY, late.rc);
    assert_string_equal(late.text, w);
    ASSERT_U64_OP(late.value, ==, g.token);
    CHECK_RC(0, lease_release(conf_store, &g));
}

/* Waiting stays bounded: 500 ms against a 60 s holder. */
static void test_wait_is_bounded(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_store *other;
    lease_acquire_opts o;
    lease_grant g, g2;
    lease_info h;
    int64_t t;

    (void)state;
    conf_key(key, "notify/bounded");
    conf_owner(a);
    conf_owner(b);
    g = conf_acquire(key, a, 60000, "long holder");
    CHECK_RC(0, lease_store_open(&other, conf_url));
    o = conf_opts(b, 60000, NULL, 500);
    memset(&h, 0, sizeof(h));
    t = conf_now_ms();
    CHECK_FAIL(LEASE_ETIMEOUT, lease_acquire(&g2, &h, other, key, &o));
    printf("# wait 500 ms against a 60 s holder: ETIMEOUT after %" PRId64 " ms\n",
           conf_now_ms() - t);
    assert_string_equal(h.owner, a);
    ASSERT_U64_OP(h.token, ==, g.token);
    /* Other keys' releases do not end the wait early with a wrong answer. */
    lease_store_close(other);
    CHECK_RC(0, lease_release(conf_store, &g));
}

typedef struct notify_probe {
    int calls;
    int pending; /* notifications libpq had received for this connection */
} notify_probe;

static int count_notifies_cb(void *native, void *payload)
{
    notify_probe *p = payload;
    PGnotify *n;

    p->calls++;
    (void)PQconsumeInput(native);
    while ((n = PQnotifies(native)) != NULL) {
        p->pending++;
        PQfreemem(n);
    }
    return 0;
}

/* Release and re-acquire `n` other keys: n notifications on the channel. */
static void churn(const char *tag, int n)
{
    char key[LEASE_KEY_MAX + 1], owner[LEASE_OWNER_BUFSZ], name[64];
    lease_grant g;
    int i;

    conf_owner(owner);
    for (i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "notify/churn-%s-%d", tag, i);
        conf_key(key, name);
        g = conf_acquire(key, owner, 30000, NULL);
        CHECK_RC(0, lease_release(conf_store, &g));
    }
}

/*
 * A wait that ended (ETIMEOUT) leaves nothing behind: the handle does not
 * keep listening, so releases of other keys made later are not delivered
 * to it and do not pile up in its memory (libpq keeps every notification
 * it receives until PQnotifies is called, which nothing does outside a
 * wait). Seen from inside a guarded transaction of that handle.
 */
static void test_wait_timeout_stops_listening(void **state)
{
    char key[LEASE_KEY_MAX + 1], mine[LEASE_KEY_MAX + 1];
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_store *w;
    lease_acquire_opts o;
    lease_grant g, held, gm;
    notify_probe p1, p2;

    (void)state;
    conf_key(key, "notify/timed-out");
    conf_key(mine, "notify/guarded");
    conf_owner(a);
    conf_owner(b);
    held = conf_acquire(key, a, 60000, NULL);
    gm = conf_acquire(mine, a, 60000, NULL);
    CHECK_RC(0, lease_store_open(&w, conf_url));
    o = conf_opts(b, 60000, NULL, 300);
    CHECK_FAIL(LEASE_ETIMEOUT, lease_acquire(&g, NULL, w, key, &o));

    churn("a", 50);
    memset(&p1, 0, sizeof(p1));
    CHECK_RC(0, lease_guarded_txn(w, &gm, count_notifies_cb, &p1));
    churn("b", 50);
    memset(&p2, 0, sizeof(p2));
    CHECK_RC(0, lease_guarded_txn(w, &gm, count_notifies_cb, &p2));
    printf("# a handle whose wait timed out: %d notifications of other keys' "
           "releases received after it, %d more after its next call\n",
           p1.pending, p2.pending);
    lease_store_close(w);
    CHECK_RC(0, lease_release(conf_store, &held));
    CHECK_RC(0, lease_release(conf_store, &gm));
    assert_int_equal(p1.calls, 1);
    assert_int_equal(p2.calls, 1);
    if (p2.pending != 0)
        fail_msg("the handle still listens after its wait timed out: %d "
                 "notifications of unrelated releases reached it after its "
                 "next call (and accumulate in libpq for its lifetime)",
                 p2.pending);
}

/* ======================================================================
 * 32 connections racing for one key
 * ====================================================================== */

#define RACERS 32
#define ROUNDS 10

static void test_race_32(void **state)
{
    char key[LEASE_KEY_MAX + 1];
    int go[ROUNDS][2], res[2], r, i, st;
    pid_t pids[RACERS];
    uint64_t last = 0;
    int64_t t0;

    (void)state;
    conf_key(key, "race/one-key");
    for (r = 0; r < ROUNDS; r++)
        conf_pipe(go[r]);
    conf_pipe(res);
    conf_store_close();
    for (i = 0; i < RACERS; i++) {
        pids[i] = conf_fork();
        if (pids[i] == 0) {
            lease_store *s;
            int j;
            close(res[0]);
            for (j = 0; j < ROUNDS; j++)
                close(go[j][1]);
            if (lease_store_open_timeout(&s, conf_url, 20000) != 0) {
                pg_send(res[1], 0, -100, 0, NULL);
                _exit(10);
            }
            pg_send(res[1], 0, 0, 0, NULL); /* ready */
            for (j = 0; j < ROUNDS; j++) {
                char ch, owner[LEASE_OWNER_BUFSZ];
                lease_acquire_opts o;
                lease_grant g;
                int rc;
                /* The go-pipe: EOF when the parent closes it. */
                if (conf_read_full(go[j][0], &ch, 1, conf_now_ms() + 120000) != 0)
                    _exit(12);
                if (lease_owner_new(owner) != 0)
                    _exit(13);
                o = conf_opts(owner, 60000, "racer", 0);
                memset(&g, 0, sizeof(g));
                rc = lease_acquire(&g, NULL, s, key, &o);
                pg_send(res[1], j + 1, rc, rc == 0 ? g.token : 0, owner);
            }
            lease_store_close(s);
            _exit(0);
        }
    }
    close(res[1]);
    for (r = 0; r < ROUNDS; r++)
        close(go[r][0]);
    for (i = 0; i < RACERS; i++) {
        pg_rec rec = pg_recv(res[0], 60000, "racer ready");
        if (rec.rc != 0)
            fail_msg("a racer could not open the store");
    }
    conf_store_open();
    t0 = conf_now_ms();
    for (r = 0; r < ROUNDS; r++) {
        int winners = 0, busy = 0;
        pg_rec win;
        lease_grant g;

        memset(&win, 0, sizeof(win));
        close(go[r][1]); /* go */
        for (i = 0; i < RACERS; i++) {
            pg_rec rec = pg_recv(res[0], 60000, "racer result");
            if (rec.kind != r + 1)
                fail_msg("round %d: a result of round %d", r + 1, rec.kind);
            if (rec.rc == 0) {
                winners++;
                win = rec;
            } else if (rec.rc == LEASE_EBUSY) {
                busy++;
            } else {
                fail_msg("round %d: a racer got %s (neither OK nor EBUSY)", r + 1,
                         lease_error_name(rec.rc));
            }
        }
        if (winners != 1)
            fail_msg("round %d: %d winners, %d busy (exactly one must win)", r + 1,
                     winners, busy);
        assert_int_equal(busy, RACERS - 1);
        ASSERT_U64_OP(win.value, >, last);
        last = win.value;
        {
            lease_info info;
            CHECK_RC(0, lease_inspect(&info, conf_store, key));
            assert_int_equal(info.held, 1);
            assert_string_equal(info.owner, win.text);
            ASSERT_U64_OP(info.token, ==, win.value);
        }
        CHECK_RC(0, lease_grant_init(&g, key, win.text, win.value, 60000));
        CHECK_RC(0, lease_release(conf_store, &g));
    }
    printf("# %d rounds of %d racers: one winner each, last token %" PRIu64
           ", %" PRId64 " ms\n", ROUNDS, RACERS, last, conf_now_ms() - t0);
    for (i = 0; i < RACERS; i++) {
        st = conf_reap(pids[i], 60000);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    close(res[0]);
}

/* ======================================================================
 * security: passwords, hostile keys
 * ====================================================================== */

static void test_security_no_password(void **state)
{
    static const char wrong[] = "Wr0ngPassw0rd-93f1";
    char *real = url_password(conf_url), *bad, *u;
    lease_store *s = NULL;
    const char *auth;
    char multi[512], hostport[128];

    (void)state;
    /* The handle's redacted URL. */
    assert_non_null(strstr(lease_store_url_redacted(conf_store), "***"));
    ASSERT_NO_SECRET(lease_store_url_redacted(conf_store), real);

    /* Wrong password: ESTORE, "***" in place of the password. */
    bad = url_replace_password(conf_url, wrong);
    CHECK_FAIL(LEASE_ESTORE, lease_store_open(&s, bad));
    assert_null(s);
    printf("# wrong password: %s\n", lease_errmsg());
    ASSERT_NO_SECRET(lease_errmsg(), wrong);
    ASSERT_NO_SECRET(lease_errmsg(), real);
    assert_non_null(strstr(lease_errmsg(), "***"));
    CHECK_FAIL(LEASE_ESTORE, lease_store_open_timeout(&s, bad, 800));
    ASSERT_NO_SECRET(lease_errmsg(), wrong);

    /* A password given as a libpq parameter is hidden as well. */
    {
        char nopw[512], *q;
        const char *at;
        /* postgres://lease@host:port/lease?password=wrong */
        auth = strstr(conf_url, "://") + 3;
        at = strchr(auth, '@');
        if (at) {
            const char *colon = memchr(auth, ':', (size_t)(at - auth));
            snprintf(nopw, sizeof(nopw), "%.*s%s",
                     (int)((colon ? colon : at) - conf_url), conf_url, at);
        } else {
            snprintf(nopw, sizeof(nopw), "%s", conf_url);
        }
        q = url_with(nopw, "password=Wr0ngPassw0rd-93f1&sslmode=disable");
        CHECK_FAIL(LEASE_ESTORE, lease_store_open(&s, q));
        printf("# wrong password as a parameter: %s\n", lease_errmsg());
        ASSERT_NO_SECRET(lease_errmsg(), wrong);
        free(q);
        if (real[0]) {
            /* the right one as a parameter opens, and is not shown */
            char pw[160];
            snprintf(pw, sizeof(pw), "password=%s", real);
            q = url_with(nopw, pw);
            CHECK_RC(0, lease_store_open(&s, q));
            ASSERT_NO_SECRET(lease_store_url_redacted(s), real);
            lease_store_close(s);
            s = NULL;
            free(q);
        }
    }

    /* Several hosts (as for a failover pair), wrong password. */
    auth = strstr(bad, "@") + 1;
    snprintf(hostport, sizeof(hostport), "%.*s", (int)strcspn(auth, "/?"), auth);
    snprintf(multi, sizeof(multi), "%.*s%s,%s%s", (int)(auth - bad), bad, hostport,
             hostport, auth + strlen(hostport));
    u = url_with(multi, "target_session_attrs=read-write");
    CHECK_FAIL(LEASE_ESTORE, lease_store_open(&s, u));
    printf("# wrong password, two hosts: %s\n", lease_errmsg());
    ASSERT_NO_SECRET(lease_errmsg(), wrong);
    assert_non_null(strstr(lease_errmsg(), "***"));
    free(u);

    /* A password with escaped characters: neither form shows. */
    {
        char *esc = url_replace_password(conf_url, "Wr%40ng%3Apw%2Fx");
        CHECK_FAIL(LEASE_ESTORE, lease_store_open(&s, esc));
        ASSERT_NO_SECRET(lease_errmsg(), "Wr%40ng%3Apw%2Fx");
        ASSERT_NO_SECRET(lease_errmsg(), "Wr@ng:pw/x");
        free(esc);
    }
    free(bad);
    free(real);

    /* An '@' the user did not escape: lease reads the password up to the
     * last '@' (src/util/url.c is lenient there), so all of it is the password
     * and no part of it may show, whatever libpq makes of the URL. */
    {
        char *raw_at = url_replace_password(conf_url, "Wr0ng@Tail-5150");
        char msg[1024];
        int rc;
        lease_error_clear();
        rc = lease_store_open(&s, raw_at);
        snprintf(msg, sizeof(msg), "%s", lease_errmsg());
        free(raw_at);
        printf("# a password with an unescaped '@': %s\n", msg);
        assert_int_not_equal(rc, 0);
        ASSERT_NO_SECRET(msg, "Wr0ng@Tail-5150");
        ASSERT_NO_SECRET(msg, "Tail-5150");
        ASSERT_NO_SECRET(msg, "Wr0ng");
    }
}

static int walk_found;

static void test_security_hostile_keys(void **state)
{
    static const char *const names[] = {
        "x'); DROP TABLE coordination_lease; --",
        "'; DROP TABLE lease_fence; --",
        "a'b\"c;d\\e",
        "back\\\\slash\\",
        "semi;colon;;",
        "100%_like_%",
        "$1 $2::uuid ?",
        "tab\tnew\nline",
        "\xff\xfe not utf-8 '; --",
        "\xef\xbf\xbfstarts with U+FFFF",
        "E'\\x00' \\0",
    };
    char a[LEASE_OWNER_BUFSZ], key[LEASE_KEY_MAX + 1], prefix[LEASE_KEY_MAX + 1];
    lease_grant g;
    lease_info info, *list;
    size_t i, n, j;
    uint64_t mark, tok;
    void *val;
    size_t len;
    PGconn *c;
    char *v;

    (void)state;
    conf_owner(a);
    conf_key(prefix, "hostile/");
    c = raw_connect(conf_url);
    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char label[LEASE_LABEL_MAX + 1];
        const char value[] = "v'al\0ue\\;";

        conf_key(key, "hostile/");
        strncat(key, names[i], LEASE_KEY_MAX - strlen(key));
        snprintf(label, sizeof(label), "label %s", names[i]);
        g = conf_acquire(key, a, 30000, label);
        CHECK_RC(0, lease_inspect(&info, conf_store, key));
        assert_string_equal(info.key, key);
        assert_string_equal(info.label, label);
        assert_int_equal(info.held, 1);
        CHECK_RC(0, lease_fence_advance(&mark, conf_store, key, g.token));
        CHECK_RC(0, lease_fence_mark(&mark, conf_store, key));
        ASSERT_U64_OP(mark, ==, g.token);
        CHECK_RC(0, lease_guarded_put(conf_store, &g, key, value, sizeof(value)));
        CHECK_RC(0, lease_data_get(&val, &len, &tok, conf_store, key));
        assert_int_equal(len, sizeof(value));
        assert_memory_equal(val, value, sizeof(value));
        ASSERT_U64_OP(tok, ==, g.token);
        free(val);
        /* A UTF-8 key is stored as it is (the chapter's SQL finds it);
         * PostgreSQL text cannot hold the others at all. */
        if (names[i][0] != '\xff') {
            const char *kv[1] = { key };
            assert_int_equal(raw_ll(c, "SELECT count(*) FROM coordination_lease "
                                       "WHERE resource_key = $1", 1, kv), 1);
        }
    }
    CHECK_RC(0, lease_list(&list, &n, conf_store, prefix));
    assert_int_equal(n, sizeof(names) / sizeof(names[0]));
    walk_found = 0;
    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        conf_key(key, "hostile/");
        strncat(key, names[i], LEASE_KEY_MAX - strlen(key));
        for (j = 0; j < n; j++)
            if (strcmp(list[j].key, key) == 0) {
                walk_found++;
                assert_int_equal(list[j].held, 1);
                assert_string_equal(list[j].owner, a);
                CHECK_RC(0, lease_grant_init(&g, key, a, list[j].token, 30000));
            }
        CHECK_RC(0, lease_release(conf_store, &g));
    }
    assert_int_equal(walk_found, (int)(sizeof(names) / sizeof(names[0])));
    lease_list_free(list);

    /* A key that starts with U+FFFF (the store's escape mark for names
     * that are not UTF-8) reads back exactly, and lists under its prefix. */
    snprintf(key, sizeof(key), "\xef\xbf\xbf%sstarts-with-the-mark", conf_prefix);
    snprintf(prefix, sizeof(prefix), "\xef\xbf\xbf%s", conf_prefix);
    g = conf_acquire(key, a, 30000, "\xef\xbf\xbf label");
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_string_equal(info.key, key);
    assert_string_equal(info.label, "\xef\xbf\xbf label");
    CHECK_RC(0, lease_list(&list, &n, conf_store, prefix));
    assert_int_equal(n, 1);
    assert_string_equal(list[0].key, key);
    lease_list_free(list);
    CHECK_RC(0, lease_release(conf_store, &g));
    /* Every table is still there. */
    v = raw_scalar(c, "SELECT (to_regclass('coordination_lease') IS NOT NULL "
                      "AND to_regclass('lease_fence') IS NOT NULL "
                      "AND to_regclass('lease_data') IS NOT NULL)::text", 0, NULL);
    assert_string_equal(v, "true");
    free(v);
    PQfinish(c);
}

int main(int argc, char **argv)
{
    static const struct CMUnitTest all[] = {
        CONF_TEST(test_advisory_key_is_fnv1a),
        CONF_TEST(test_schema_chapter_table_interop),
        CONF_TEST(test_schema_chapter_sql_on_lease_table),
        CONF_TEST(test_schema_table_names_from_url),
        CONF_TEST(test_history_table_added_to_old_database),
        CONF_TEST(test_history_without_rights),
        CONF_TEST(test_history_chapter_sql_interleaved),
        CONF_TEST(test_history_table_name_from_url),
        CONF_TEST(test_guarded_txn_locks_and_commits),
        CONF_TEST(test_guarded_txn_elost),
        CONF_TEST(test_guarded_txn_timeouts),
        CONF_TEST(test_fence_resource_side),
        CONF_TEST(test_advisory_txn),
        CONF_TEST(test_wait_notify_wakes_waiter),
        CONF_TEST(test_wait_is_bounded),
        CONF_TEST(test_wait_timeout_stops_listening),
        CONF_TEST(test_race_32),
        CONF_TEST(test_security_no_password),
        CONF_TEST(test_security_hostile_keys),
    };
    struct CMUnitTest picked[sizeof(all) / sizeof(all[0])];
    size_t i, n = 0;
    int rc;

    if (argc < 2 || argv[1][0] == '\0') {
        fprintf(stderr, "%s: no PostgreSQL URL: give it as the first argument "
                        "(the tests pass $LEASE_TEST_PG_URL, which "
                        "scripts/test.sh sets)\n", argv[0]);
        return 1;
    }
    if (strncmp(argv[1], "postgres://", 11) != 0 &&
        strncmp(argv[1], "postgresql://", 13) != 0) {
        fprintf(stderr, "%s: not a postgres:// URL\n", argv[0]);
        return 1;
    }
    /* A pattern that picks nothing is an error, not a pass. */
    for (i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (argc < 3 || fnmatch(argv[2], all[i].name, 0) == 0)
            picked[n++] = all[i];
    if (n == 0) {
        fprintf(stderr, "%s: no test matches '%s'\n", argv[0], argv[2]);
        return 1;
    }
    if (conf_init(2, argv, "pg") != 0)
        return 1;
    rc = _cmocka_run_group_tests("postgres store", picked, n, NULL, NULL);
    conf_store_close();
    return rc;
}
