/*
 * pg_test.h - what the PostgreSQL tests share on top of the conformance
 * suite's helpers (conf_util.h: CHECK_RC, CHECK_FAIL, forked children,
 * bounded reads): plain libpq connections for the reference SQL run by hand, URL
 * surgery, and checks that no password leaks into a message.
 *
 * As in conf_util.h, children never call cmocka's assertions: they report
 * facts over pipes and end with _exit(); the parent asserts.
 */
#ifndef PG_TEST_H
#define PG_TEST_H

#include <libpq-fe.h>

#include "conf_util.h"

/* ---- the reference SQL, word for word (section 4) ------------------------ */

#define REFSQL_DDL                                                           \
    "CREATE TABLE coordination_lease (\n"                                     \
    "resource_key text PRIMARY KEY,\n"                                        \
    "owner_id uuid,\n"                                                        \
    "lease_until timestamptz NOT NULL DEFAULT '-infinity'::timestamptz,\n"    \
    "fencing_token bigint NOT NULL DEFAULT 0 CHECK (fencing_token >= 0)\n"    \
    ");"

/* $1 key, $2 owner, $3 interval */
#define REFSQL_ACQUIRE                                                       \
    "INSERT INTO coordination_lease\n"                                        \
    "(resource_key, owner_id, lease_until, fencing_token)\n"                  \
    "VALUES\n"                                                                \
    "($1, $2, clock_timestamp() + $3::interval, 1)\n"                         \
    "ON CONFLICT (resource_key) DO UPDATE\n"                                  \
    "SET owner_id = EXCLUDED.owner_id,\n"                                     \
    "lease_until = clock_timestamp() + $3::interval,\n"                       \
    "fencing_token = coordination_lease.fencing_token + 1\n"                  \
    "WHERE coordination_lease.lease_until <= clock_timestamp()\n"             \
    "RETURNING fencing_token, lease_until;"

/* $1 key, $2 owner, $3 token, $4 interval */
#define REFSQL_RENEW                                                         \
    "UPDATE coordination_lease\n"                                             \
    "SET lease_until = clock_timestamp() + $4::interval\n"                    \
    "WHERE resource_key = $1\n"                                               \
    "AND owner_id = $2\n"                                                     \
    "AND fencing_token = $3\n"                                                \
    "AND lease_until > clock_timestamp()\n"                                   \
    "RETURNING lease_until;"

/* $1 key, $2 owner, $3 token */
#define REFSQL_RELEASE                                                       \
    "UPDATE coordination_lease\n"                                             \
    "SET owner_id = NULL,\n"                                                  \
    "lease_until = '-infinity'::timestamptz\n"                                \
    "WHERE resource_key = $1\n"                                               \
    "AND owner_id = $2\n"                                                     \
    "AND fencing_token = $3;"

/* $1 key, $2 owner, $3 token: exactly one row, locked */
#define REFSQL_CHECK                                                         \
    "SELECT 1\n"                                                              \
    "FROM coordination_lease\n"                                               \
    "WHERE resource_key = $1\n"                                               \
    "AND owner_id = $2\n"                                                     \
    "AND fencing_token = $3\n"                                                \
    "AND lease_until > clock_timestamp()\n"                                   \
    "FOR UPDATE;"

/* $1 key, ($2 owner, unused), $3 token, $4 state */
#define REFSQL_REBUILD                                                       \
    "UPDATE rebuild_state\n"                                                  \
    "SET state = $4,\n"                                                       \
    "last_fencing_token = GREATEST(last_fencing_token, $3)\n"                 \
    "WHERE resource_key = $1\n"                                               \
    "AND last_fencing_token <= $3;"

/* The parameter types of REFSQL_REBUILD: $2 is not used by the statement,
 * so its type must be given. */
static const Oid refsql_rebuild_types[4] = { 25 /* text */, 2950 /* uuid */,
                                              20 /* int8 */, 25 /* text */ };

/* ---- plain libpq --------------------------------------------------------- */

static void raw_quiet(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

/* `url` without its tokens= parameter (the store's, which libpq refuses:
 * pg_store may run with tokens=counter in the URL); malloc'ed. */
static inline char *url_without_tokens(const char *url)
{
    char *out = strdup(url), *q = out ? strchr(out, '?') : NULL, *p;

    if (out == NULL)
        fail_msg("out of memory");
    for (p = q ? q + 1 : NULL; p && *p;) {
        size_t n = strcspn(p, "&");

        if (strncmp(p, "tokens=", 7) == 0 && n >= 7) {
            memmove(p, p + n + (p[n] == '&'), strlen(p + n + (p[n] == '&')) + 1);
            continue;
        }
        p += n + (p[n] == '&');
    }
    if (q) {
        size_t len = strlen(out);
        while (len > 0 && (out[len - 1] == '&' || out[len - 1] == '?'))
            out[--len] = '\0';
    }
    return out;
}

/* A libpq connection of our own to `url` (no lease_* parameters in it
 * but tokens=, taken out here). Never prints the URL: it holds a password. */
static inline PGconn *raw_connect(const char *url)
{
    char *plain = url_without_tokens(url);
    PGconn *c = PQconnectdb(plain);

    free(plain);
    if (c == NULL || PQstatus(c) != CONNECTION_OK) {
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", c ? PQerrorMessage(c) : "out of memory");
        PQfinish(c);
        fail_msg("cannot connect to the test server with libpq: %s", msg);
    }
    PQsetNoticeProcessor(c, raw_quiet, NULL); /* "drop cascades to ..." */
    return c;
}

/* Run `sql` with text parameters (types may be NULL) and expect `want`
 * (PGRES_COMMAND_OK or PGRES_TUPLES_OK). The caller PQclear()s. */
static inline PGresult *raw_exec_types(PGconn *c, ExecStatusType want,
                                       const char *sql, int n, const Oid *types,
                                       const char *const *vals)
{
    PGresult *r = PQexecParams(c, sql, n, types, vals, NULL, NULL, 0);

    if (r == NULL || PQresultStatus(r) != want) {
        char msg[600];
        snprintf(msg, sizeof(msg), "%s", r ? PQresultErrorMessage(r)
                                           : PQerrorMessage(c));
        PQclear(r);
        fail_msg("SQL failed (%s): %s", msg, sql);
    }
    return r;
}

static inline PGresult *raw_exec(PGconn *c, ExecStatusType want, const char *sql,
                                 int n, const char *const *vals)
{
    return raw_exec_types(c, want, sql, n, NULL, vals);
}

/* A statement that must succeed; the result is dropped. */
static inline void raw_ok(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);

    if (r == NULL || (PQresultStatus(r) != PGRES_COMMAND_OK &&
                      PQresultStatus(r) != PGRES_TUPLES_OK)) {
        char msg[600];
        snprintf(msg, sizeof(msg), "%s", r ? PQresultErrorMessage(r)
                                           : PQerrorMessage(c));
        PQclear(r);
        fail_msg("SQL failed (%s): %s", msg, sql);
    }
    PQclear(r);
}

/* The single value of a one-row, one-column query, as a malloc'ed string
 * ("<null>" for NULL). */
static inline char *raw_scalar(PGconn *c, const char *sql, int n,
                               const char *const *vals)
{
    PGresult *r = raw_exec(c, PGRES_TUPLES_OK, sql, n, vals);
    char *out;

    if (PQntuples(r) != 1 || PQnfields(r) < 1) {
        int rows = PQntuples(r);
        PQclear(r);
        fail_msg("expected one row, got %d: %s", rows, sql);
    }
    out = strdup(PQgetisnull(r, 0, 0) ? "<null>" : PQgetvalue(r, 0, 0));
    PQclear(r);
    if (out == NULL)
        fail_msg("out of memory");
    return out;
}

static inline long long raw_ll(PGconn *c, const char *sql, int n,
                               const char *const *vals)
{
    char *s = raw_scalar(c, sql, n, vals);
    long long v = strtoll(s, NULL, 10);

    free(s);
    return v;
}

/* ---- names and URLs --------------------------------------------------- */

/* 12 random lower-case hex digits: a name part no other run uses. */
static inline void pg_rand_name(char out[13])
{
    char u[LEASE_OWNER_BUFSZ];
    size_t i, o = 0;

    CHECK_RC(0, lease_owner_new(u));
    for (i = 0; u[i] && o < 12; i++)
        if (u[i] != '-' && i > 14) /* skip the version nibble area */
            out[o++] = u[i];
    out[o] = '\0';
}

/* base + "?"/"&" + params, malloc'ed. */
static inline char *url_with(const char *base, const char *params)
{
    size_t n = strlen(base) + strlen(params) + 2;
    char *out = malloc(n);

    if (out == NULL)
        fail_msg("out of memory");
    snprintf(out, n, "%s%c%s", base, strchr(base, '?') ? '&' : '?', params);
    return out;
}

/* Opening base with params must be refused with EINVALID, and leave no
 * handle. */
static inline void expect_open_einvalid(const char *base, const char *params)
{
    char *u = url_with(base, params);
    lease_store *x = NULL;

    lease_error_clear();
    if (lease_store_open(&x, u) != LEASE_EINVALID)
        fail_msg("opening with %s: expected EINVALID, got %s (%s)", params,
                 lease_error_name(lease_errcode()), lease_errmsg());
    assert_null(x);
    free(u);
}

/*
 * Split "scheme://user:password@rest": the password (malloc'ed, "" when
 * there is none) and a copy of the URL with the password replaced by
 * `other` (malloc'ed; "user:other@" is inserted when there was none).
 */
static inline char *url_password(const char *url)
{
    const char *auth = strstr(url, "://"), *at, *colon, *end;

    if (auth == NULL)
        return strdup("");
    auth += 3;
    end = auth + strcspn(auth, "/?");
    at = NULL;
    for (const char *p = auth; p < end; p++)
        if (*p == '@')
            at = p;
    if (at == NULL || (colon = memchr(auth, ':', (size_t)(at - auth))) == NULL)
        return strdup("");
    return strndup(colon + 1, (size_t)(at - colon - 1));
}

static inline char *url_replace_password(const char *url, const char *other)
{
    const char *auth = strstr(url, "://"), *at = NULL, *colon = NULL, *end;
    size_t n = strlen(url) + strlen(other) + 16;
    char *out = malloc(n);

    if (out == NULL || auth == NULL)
        fail_msg("cannot rewrite the test URL");
    auth += 3;
    end = auth + strcspn(auth, "/?");
    for (const char *p = auth; p < end; p++)
        if (*p == '@')
            at = p;
    if (at)
        colon = memchr(auth, ':', (size_t)(at - auth));
    if (at && colon)
        snprintf(out, n, "%.*s%s%s", (int)(colon + 1 - url), url, other, at);
    else if (at)
        snprintf(out, n, "%.*s:%s%s", (int)(at - url), url, other, at);
    else
        snprintf(out, n, "%.*slease:%s@%s", (int)(auth - url), url, other, auth);
    return out;
}

/* The message of the last failure must not hold `secret` (if any). */
#define ASSERT_NO_SECRET(text, secret)                                        \
    do {                                                                      \
        const char *sec_t_ = (text), *sec_s_ = (secret);                      \
        if (sec_s_ && strlen(sec_s_) >= 4 && strstr(sec_t_, sec_s_) != NULL)  \
            fail_msg("a password leaked into a message: %s", sec_t_);         \
    } while (0)

/* ---- small child/parent records ------------------------------------------ */

typedef struct pg_rec {
    int kind;
    int rc;
    uint64_t value;
    int64_t t_ms;
    char text[256]; /* an owner, or a message */
} pg_rec;

static inline void pg_send(int fd, int kind, int rc, uint64_t value,
                           const char *text)
{
    pg_rec r;

    memset(&r, 0, sizeof(r));
    r.kind = kind;
    r.rc = rc;
    r.value = value;
    r.t_ms = conf_now_ms();
    if (text)
        snprintf(r.text, sizeof(r.text), "%s", text);
    (void)conf_write_full(fd, &r, sizeof(r));
}

/* Read one record before a deadline; fails the test otherwise. */
static inline pg_rec pg_recv(int fd, int64_t bound_ms, const char *what)
{
    pg_rec r;

    memset(&r, 0, sizeof(r));
    if (conf_read_full(fd, &r, sizeof(r), conf_now_ms() + bound_ms) != sizeof(r))
        fail_msg("no report from the child (%s) within %" PRId64 " ms", what,
                 bound_ms);
    return r;
}

#endif
