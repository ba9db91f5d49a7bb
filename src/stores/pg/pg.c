/*
 * stores/pg/pg.c - PostgreSQL, through libpq: the reference lease table.
 *
 * URLs: postgres://[user[:password]@]host[:port][/db][?param=value...] or
 * postgresql://...; libpq reads the URL itself, so sslmode, PGPASSFILE,
 * PGSERVICE and the rest work as with psql. The store's own parameters are
 * taken out before libpq sees the URL:
 *   lease_table=NAME   the lease table (default coordination_lease)
 *   fence_table=NAME   high-water marks (default lease_fence)
 *   data_table=NAME    guarded values (default lease_data)
 *   history_table=NAME the grant history (default lease_history with the
 *                      default lease table, else <lease_table>_history)
 *   tokens=clock       (the default) a new grant's token is the greater of
 *                      the previous token + 1 and the server's clock in
 *                      microseconds since the epoch, so that a standby
 *                      promoted without the last grants (asynchronous
 *                      replication) still issues tokens newer than any it
 *                      lost, as long as its clock is not behind them;
 *   tokens=counter     the reference SQL's previous token + 1, exactly.
 * Both kinds mix on one table, with each other and with the reference
 * SQL: every grant is greater than the one before it.
 *
 * The lease table is the reference one, created if missing; an existing table
 * made by the reference SQL is used as it is (the optional holder_label
 * and lease_ttl_ms columns are used only if present). Acquire, renew and
 * release are the reference statements, one round trip each, prepared once
 * per connection, with clock_timestamp() as the only clock for expiry
 * (a clock token reads statement_timestamp(), see CLOCK_US). They name the
 * tables, so they are built here (one builder each, under "statements");
 * the tables' DDL and the catalog queries are files of their own in
 * src/stores/pg/ (schema.sql, history.sql: psql can run them alone).
 *
 * The grant history (lease/history.h) is one row per grant, primary key
 * (resource_key, fencing_token), written by the statements that grant and
 * end leases (data-modifying CTEs), so a grant is never left out (see
 * history.sql). On a lease table with acquired_at (the tables this version
 * makes) an entry is written once, when the grant ends, and the lease row
 * stands for the grant while it lasts (DEFERRED, below); on one without,
 * as tables made before it, an entry is written when the grant begins
 * (ended NULL: still held) and ended when it ends (sql_acquire_history).
 * It is created when missing, also next to tables made before it existed;
 * a role that may not create it (or not write it) still gets every other
 * operation, and lease_history() answers LEASE_EUNSUPPORTED saying why.
 *
 * Every call is bounded: queries go out asynchronously and the socket is
 * polled until the handle's timeout; a query with no answer in time drops
 * the connection (the next call reconnects) and reports LEASE_ESTORE, since
 * the outcome is unknown. The server also gets statement_timeout and
 * lock_timeout, so it gives up on its side too.
 */
#define _GNU_SOURCE /* vasprintf */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdarg.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <jansson.h>
#include <libpq-fe.h>

#include "pg_text.h"
#include "stores/store_int.h"

#define NOTIFY_CHANNEL "lease_release"

enum {
    ST_ACQUIRE,
    ST_HOLDER,
    ST_RENEW,
    ST_RENEW_MANY,
    ST_RENEW_MANY_WAIT,
    ST_RELEASE,
    ST_INSPECT,
    ST_LIST,
    ST_FENCE_RAISE,
    ST_FENCE_MARK,
    ST_CHECK_HOLDER,
    ST_DATA_PUT,
    ST_DATA_GET,
    ST_ANNOUNCE,     /* only with a waiting_until column */
    ST_WAIT_LOCK,    /* these two only without it */
    ST_WAIT_UNLOCK,
    ST_HISTORY,      /* these three only with a usable history table */
    ST_HISTORY_LOST,
    ST_HISTORY_CLEAN,
    ST_TAKEOVER,     /* these three only with a history written when */
    ST_RELEASE_AGAIN, /* grants end (see DEFERRED) */
    ST_HISTORY_PRUNE,
    ST_COUNT
};

/* Parameter types, declared when preparing so that every statement can
 * take the same parameters whether or not it uses them all. */
#define T_TEXT 25
#define T_BYTEA 17
#define T_INT8 20
#define T_UUID 2950
#define T_INTERVAL 1186
#define T_JSON 114

static const struct {
    int n;
    Oid types[5];
} params[ST_COUNT] = {
    [ST_ACQUIRE] = { 5, { T_TEXT, T_UUID, T_INTERVAL, T_TEXT, T_INT8 } },
    [ST_HOLDER] = { 1, { T_TEXT } },
    [ST_RENEW] = { 5, { T_TEXT, T_UUID, T_INT8, T_INTERVAL, T_INT8 } },
    [ST_RENEW_MANY] = { 3, { T_JSON, T_INTERVAL, T_INT8 } },
    [ST_RENEW_MANY_WAIT] = { 3, { T_JSON, T_INTERVAL, T_INT8 } },
    [ST_RELEASE] = { 3, { T_TEXT, T_UUID, T_INT8 } },
    [ST_INSPECT] = { 1, { T_TEXT } },
    [ST_LIST] = { 1, { T_BYTEA } },
    [ST_FENCE_RAISE] = { 2, { T_TEXT, T_INT8 } },
    [ST_FENCE_MARK] = { 1, { T_TEXT } },
    [ST_CHECK_HOLDER] = { 3, { T_TEXT, T_UUID, T_INT8 } },
    [ST_DATA_PUT] = { 5, { T_TEXT, T_UUID, T_INT8, T_TEXT, T_BYTEA } },
    [ST_DATA_GET] = { 1, { T_TEXT } },
    [ST_ANNOUNCE] = { 2, { T_TEXT, T_INTERVAL } },
    [ST_WAIT_LOCK] = { 1, { T_TEXT } },
    [ST_WAIT_UNLOCK] = { 1, { T_TEXT } },
    [ST_HISTORY] = { 2, { T_TEXT, T_INT8 } },
    [ST_HISTORY_LOST] = { 3, { T_TEXT, T_UUID, T_INT8 } },
    [ST_HISTORY_CLEAN] = { 1, { T_TEXT } },
    [ST_TAKEOVER] = { 5, { T_TEXT, T_UUID, T_INTERVAL, T_TEXT, T_INT8 } },
    [ST_RELEASE_AGAIN] = { 3, { T_TEXT, T_UUID, T_INT8 } },
    [ST_HISTORY_PRUNE] = { 1, { T_TEXT } },
};

typedef struct {
    lease_store parent;
    PGconn *conn;
    char *conninfo;        /* the URL without our parameters: never print */
    char *lease_table;     /* quoted identifiers */
    char *fence_table;
    char *data_table;
    char *history_table;
    char *history_why;     /* why there is no history; NULL when there is */
    int tokens;            /* LEASE__TOKENS_CLOCK or LEASE__TOKENS_COUNTER */
    int has_wait;          /* the lease table has waiting_until */
    int has_acquired;      /* ... and acquired_at */
    int deferred;          /* the history is written when grants end */
    char *sql[ST_COUNT];
    int prepared;          /* statements prepared on this connection */
    uint64_t server_timeout_ms; /* the server's statement and lock timeouts */
    int listening;
    int wait_locked;       /* holds a waiter's advisory lock (sql_wait_lock) */
    char state[6];         /* SQLSTATE of the last failed prepared statement */
} pg_store;

/* ---- connection and bounded calls ------------------------------------ */

static void pg_drop(pg_store *s)
{
    if (s->conn)
        PQfinish(s->conn);
    s->conn = NULL;
    s->prepared = 0;
    s->listening = 0;
    s->wait_locked = 0; /* a session lock ends with its session */
    s->server_timeout_ms = 0;
}

/* libpq's messages may end with a newline; keep them on one line. */
static const char *pgmsg(pg_store *s)
{
    static _Thread_local char buf[512];
    char *full = strdup(s->conn ? PQerrorMessage(s->conn) : "not connected");
    size_t n;

    /* Scrubbed whole, before it is cut: a cut could split a password that
     * libpq quotes (it echoes URLs it cannot read) and hide it from the
     * scrubber. */
    if (full == NULL) {
        lease__strlcpy(buf, "out of memory", sizeof(buf));
        return buf;
    }
    lease__scrub(full);
    lease__strlcpy(buf, full, sizeof(buf));
    free(full);
    n = strlen(buf);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    for (char *p = buf; *p; p++)
        if (*p == '\n')
            *p = ' ';
    return buf;
}

static int pg_fail(pg_store *s, const char *what)
{
    int rc = lease__seterr(LEASE_ESTORE, "postgres %s on %s: %s", what,
                           s->parent.url_redacted,
                           pgmsg(s));

    if (s->conn && PQstatus(s->conn) != CONNECTION_OK)
        pg_drop(s);
    return rc;
}

/* Wait for the answer of the query just sent; NULL on failure (message set). */
static PGresult *await(pg_store *s, const char *what, int64_t end)
{
    PGresult *res, *last = NULL;

    for (;;) {
        while (!PQisBusy(s->conn)) {
            res = PQgetResult(s->conn);
            if (res == NULL)
                return last;
            PQclear(last);
            last = res;
        }
        {
            int64_t left = (end - lease_clock_ns()) / 1000000;
            struct pollfd p = { PQsocket(s->conn), POLLIN, 0 };
            int n;

            if (left <= 0) {
                PQclear(last);
                lease__seterr(LEASE_ESTORE,
                              "postgres %s: no answer within %llu ms; the "
                              "outcome is unknown", what,
                              (unsigned long long)s->parent.timeout_ms);
                pg_drop(s);
                return NULL;
            }
            n = poll(&p, 1, (int)left);
            if (n < 0 && errno != EINTR) {
                PQclear(last);
                pg_fail(s, what);
                pg_drop(s);
                return NULL;
            }
            if (n > 0 && !PQconsumeInput(s->conn)) {
                PQclear(last);
                pg_fail(s, what);
                pg_drop(s);
                return NULL;
            }
        }
    }
}

/*
 * Run `sql` with n text parameters. 0 with *out the result (tuples or
 * command) for the caller to PQclear; else LEASE_ESTORE with the message
 * set, and in `state` the SQLSTATE of an error the server answered with
 * ("" when it did not answer, or the connection is gone).
 */
static int pg_run(PGresult **out, char state[6], pg_store *s, const char *sql, int n,
                  const char *const *vals, const char *what, int64_t end)
{
    static const Oid text[4] = { T_TEXT, T_TEXT, T_TEXT, T_TEXT };
    PGresult *res;
    const char *st;
    int rc;

    *out = NULL;
    state[0] = '\0';
    /* Without parameters, the simple protocol: sql may hold several
     * statements (the schema's DDL does). */
    if (n == 0 ? !PQsendQuery(s->conn, sql)
               : n > 4 || !PQsendQueryParams(s->conn, sql, n, text, vals, NULL, NULL, 0))
        return pg_fail(s, what);
    if ((res = await(s, what, end)) == NULL)
        return LEASE_ESTORE;
    if (PQresultStatus(res) == PGRES_COMMAND_OK ||
        PQresultStatus(res) == PGRES_TUPLES_OK) {
        *out = res;
        return 0;
    }
    st = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    if (st && s->conn && PQstatus(s->conn) == CONNECTION_OK)
        lease__strlcpy(state, st, 6);
    /* The primary message alone: the full one spans lines (LINE 1: ...). */
    rc = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY)
             ? lease__seterr(LEASE_ESTORE, "postgres %s: %s (SQLSTATE %s)", what,
                             PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY),
                             st ? st : "?")
             : lease__seterr(LEASE_ESTORE, "postgres %s: %s", what,
                             PQresultErrorMessage(res));
    PQclear(res);
    if (PQstatus(s->conn) != CONNECTION_OK)
        pg_drop(s);
    return rc;
}

/* A boolean in the answer: true only when the row and column are there and
 * say so. PQgetvalue() is NULL past the answer's rows or columns, which a
 * server (or whatever answers in its place) decides. */
static int pg_true(const PGresult *res, int row, int col)
{
    const char *v = PQgetvalue(res, row, col);

    return v != NULL && v[0] == 't';
}

/* pg_run() for a statement whose rows do not matter: run one command and
 * check it succeeded. */
static int pg_command(pg_store *s, const char *sql, const char *what, int64_t end)
{
    char state[6];
    PGresult *res;
    int rc = pg_run(&res, state, s, sql, 0, NULL, what, end);

    PQclear(res);
    return rc;
}

static int set_server_timeouts(pg_store *s, int64_t end);

static int prepare_all(pg_store *s, int64_t end)
{
    char name[16];
    int i;

    for (i = 0; i < ST_COUNT; i++) {
        PGresult *res;
        int ok;

        if (s->sql[i] == NULL) /* the history's, without a history table */
            continue;
        snprintf(name, sizeof(name), "lease_%d", i);
        if (!PQsendPrepare(s->conn, name, s->sql[i], params[i].n, params[i].types))
            return pg_fail(s, "prepare");
        if ((res = await(s, "prepare", end)) == NULL)
            return LEASE_ESTORE;
        ok = PQresultStatus(res) == PGRES_COMMAND_OK;
        if (!ok) {
            int rc = lease__seterr(LEASE_ESTORE, "postgres prepare: %s",
                                   PQresultErrorMessage(res));
            PQclear(res);
            return rc;
        }
        PQclear(res);
    }
    s->prepared = 1;
    return 0;
}

/* The server's statement_timeout and lock_timeout follow the handle's
 * timeout, so that it gives up when the client does. */
static int set_server_timeouts(pg_store *s, int64_t end)
{
    const char *v[1];
    char ms[32], state[6];
    PGresult *res;
    int rc;

    /* The server gives up on its side too; lock waits get the same bound
     * as a whole statement. */
    snprintf(ms, sizeof(ms), "%llu", (unsigned long long)s->parent.timeout_ms);
    v[0] = ms;
    rc = pg_run(&res, state, s,
             "SELECT set_config('statement_timeout', $1, false), "
             "set_config('lock_timeout', $1, false)",
             1, v, "set timeouts", end);
    PQclear(res);
    if (rc == 0)
        s->server_timeout_ms = s->parent.timeout_ms;
    return rc;
}

/* Drive PQconnectPoll until connected, failed, or `end`. */
static int connect_poll(pg_store *s, int64_t end)
{
    PostgresPollingStatusType st = PGRES_POLLING_WRITING;

    /* Bounded by `end`: every pass polls the socket until then at most. */
    while (st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
        int64_t left = (end - lease_clock_ns()) / 1000000;
        struct pollfd p = { PQsocket(s->conn), 0, 0 };
        int n;

        if (left <= 0) {
            int rc = lease__seterr(LEASE_ESTORE,
                                   "cannot connect to postgres %s: no answer within "
                                   "%llu ms",
                                   s->parent.url_redacted,
                                   (unsigned long long)s->parent.timeout_ms);
            pg_drop(s);
            return rc;
        }
        p.events = st == PGRES_POLLING_READING ? POLLIN : POLLOUT;
        n = p.fd < 0 ? 0 : poll(&p, 1, (int)left);
        if (n < 0 && errno != EINTR)
            break;
        if (n > 0 || p.fd < 0)
            st = PQconnectPoll(s->conn);
    }
    return 0;
}

/*
 * libpq marks its socket close-on-exec itself (it has since 9.x, and the
 * libpq here does: tests/pg/pg_hostile.sh checks a `lease run` child); this
 * makes sure of it for any libpq that would not, so that a child of
 * `lease run` never gets the store connection.
 */
static void pg_cloexec(pg_store *s)
{
    int fd = PQsocket(s->conn), fl;

    if (fd >= 0 && (fl = fcntl(fd, F_GETFD)) >= 0 && !(fl & FD_CLOEXEC))
        fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
}

static void ignore_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

/* The n-th comma-separated entry of list into buf ("" when list is NULL
 * or has none); -1 if it does not fit. */
static int pg_entry(char *buf, size_t size, const char *list, size_t n)
{
    buf[0] = '\0';
    /* Bounded by the list's commas. */
    while (list && n > 0 && (list = strchr(list, ',')) != NULL) {
        list++;
        n--;
    }
    if (list == NULL || n > 0)
        return 0;
    if (strcspn(list, ",") >= size)
        return -1;
    memcpy(buf, list, strcspn(list, ","));
    buf[strcspn(list, ",")] = '\0';
    return 0;
}

static size_t pg_count(const char *list)
{
    size_t n = 1;

    /* Bounded by the list's length. */
    while (list && (list = strchr(list, ',')) != NULL) {
        list++;
        n++;
    }
    return n;
}

/* Append one host entry (name, address, port) to the three lists. */
static void pg_add_host(FILE *f[3], int first, const char *h, const char *a, const char *p)
{
    fprintf(f[0], "%s%s", first ? "" : ",", h);
    fprintf(f[1], "%s%s", first ? "" : ",", a);
    fprintf(f[2], "%s%s", first ? "" : ",", p);
}

/* The value of keyword in libpq's options (NULL when unset). */
static const char *pg_opt(const PQconninfoOption *opts, const char *keyword)
{
    /* Bounded by libpq's list of keywords. */
    for (; opts && opts->keyword; opts++)
        if (strcmp(opts->keyword, keyword) == 0)
            return opts->val;
    return NULL;
}

/* The URL's value of keyword, else the one libpq would take without it
 * (set but empty counts as set, as it does for libpq). */
static const char *pg_pick(const PQconninfoOption *url, const PQconninfoOption *defs,
                           const char *keyword)
{
    const char *v = pg_opt(url, keyword);

    return v ? v : pg_opt(defs, keyword);
}

/* Append host list entry i (its name, port list entry, addresses) to the
 * three lists; *added counts the entries. A name that does not resolve is
 * left out (ESTORE, the message set), as libpq goes on to the next host. */
static int pg_host_entry(FILE *f[3], size_t *added, pg_store *s, const char *host,
                         const char *port, size_t i, int64_t end)
{
    struct addrinfo *res, *a;
    char h[1024], p[16], num[64];
    int rc;

    if (pg_entry(h, sizeof(h), host, i) < 0 ||
        pg_entry(p, sizeof(p), port, pg_count(port) > 1 ? i : 0) < 0)
        return lease__seterr(LEASE_EINVALID, "a host or port of the postgres URL is too long");
    if (h[0] == '\0' || h[0] == '/' || h[0] == '@') { /* a Unix socket */
        pg_add_host(f, !(*added)++, h, "", p);
        return 0;
    }
    if ((rc = lease__net_resolve(&res, &s->parent, h, 0, end)) < 0)
        return rc;
    /* Bounded by the addresses of one answer. */
    for (a = res; a != NULL; a = a->ai_next)
        if (getnameinfo(a->ai_addr, a->ai_addrlen, num, sizeof(num), NULL, 0,
                        NI_NUMERICHOST) == 0)
            pg_add_host(f, !(*added)++, h, num, p);
    lease__net_free(res);
    return 0;
}

/*
 * libpq looks host names up before its connect_timeout starts, with no
 * bound. So the store looks them up itself within the call's bound
 * (lease__net_resolve) and hands libpq the addresses as hostaddr, each
 * address a host entry of its own with its name (which TLS and .pgpass
 * go by) and port: out[0..2] are host, hostaddr and port lists, all NULL
 * when libpq has nothing to look up (a Unix socket, hostaddr= given) or
 * the URL names a service (whose file libpq reads, and which may name the
 * host). Host, hostaddr and port come from the URL, else from what libpq
 * would take (PQconndefaults: PGHOST, PGHOSTADDR, PGPORT, PGSERVICE's
 * file, 5432), so that the lists say what libpq would have used.
 * A name that does not resolve is left out, as libpq goes on to the next
 * host; none left is that name's error.
 */
static int pg_hostaddrs(char *out[3], pg_store *s, int64_t end)
{
    PQconninfoOption *opts = PQconninfoParse(s->conninfo, NULL), *defs = NULL;
    const char *host, *addr, *port;
    size_t len[3], i, nh, added = 0;
    FILE *f[3] = { NULL, NULL, NULL };
    int rc = 0, r;

    out[0] = out[1] = out[2] = NULL;
    /* libpq's defaults only where they can matter: PQconndefaults() also
     * finds the user's name (a passwd lookup through NSS, which may ask a
     * directory with no bound) and reads the service file. */
    if (opts && (!pg_opt(opts, "host") || !pg_opt(opts, "port") || getenv("PGHOSTADDR") ||
                 getenv("PGSERVICE")) &&
        (defs = PQconndefaults()) == NULL) {
        PQconninfoFree(opts);
        opts = NULL;
    }
    if (opts == NULL) {
        rc = lease__seterr(LEASE_ENOMEM, "out of memory");
        goto done;
    }
    host = pg_pick(opts, defs, "host");
    addr = pg_pick(opts, defs, "hostaddr");
    port = pg_pick(opts, defs, "port");
    nh = pg_count(host);
    /* Nothing to look up, or left to libpq (see above); or a port list
     * libpq refuses itself. */
    if (pg_opt(opts, "service") || host == NULL || *host == '\0' || (addr && *addr) ||
        (pg_count(port) > 1 && pg_count(port) != nh))
        goto done;
    for (i = 0; i < 3; i++)
        if ((f[i] = open_memstream(&out[i], &len[i])) == NULL)
            rc = lease__seterr(LEASE_ENOMEM, "out of memory");
    /* Each name has its share of the time left, so that one whose lookup
     * hangs leaves time for the next; one answered at once leaves its
     * share. Once a name has addresses, connecting to them is one more
     * share: a last name that hangs must not take all of it. */
    for (i = 0; i < nh && rc == 0; i++) {
        int64_t now = lease_clock_ns();

        if ((r = pg_host_entry(f, &added, s, host, port, i,
                               now + (end - now) / (int64_t)(nh - i + (added > 0)))) < 0 &&
            r != LEASE_ESTORE)
            rc = r;
    }
    if (rc == 0 && added == 0) /* every name failed: the last one's message */
        rc = LEASE_ESTORE;
done:
    for (i = 0; i < 3; i++)
        if (f[i] && fclose(f[i]) != 0 && rc == 0)
            rc = lease__seterr(LEASE_ENOMEM, "out of memory");
    if (rc < 0 || f[0] == NULL)
        for (i = 0; i < 3; i++) {
            free(out[i]);
            out[i] = NULL;
        }
    PQconninfoFree(opts);
    PQconninfoFree(defs);
    return rc;
}

/* Start libpq's connection to the URL, with the looked-up addresses and a
 * connect_timeout (whole seconds; libpq takes 1 as 2) unless the URL has
 * one, and drive it within `end`. */
static int pg_connect(pg_store *s, int64_t end)
{
    const char *keys[7], *vals[7];
    char ct[24], *hosts[3];
    int n = 0, rc;

    if ((rc = pg_hostaddrs(hosts, s, end)) < 0)
        return rc;
    keys[n] = "dbname";
    vals[n++] = s->conninfo;
    if (hosts[0]) {
        keys[n] = "host";
        vals[n++] = hosts[0];
        keys[n] = "hostaddr";
        vals[n++] = hosts[1];
        keys[n] = "port";
        vals[n++] = hosts[2];
    }
    if (!strstr(s->conninfo, "connect_timeout=")) {
        uint64_t sec = (s->parent.timeout_ms + 999) / 1000;
        snprintf(ct, sizeof(ct), "%llu", (unsigned long long)(sec < 2 ? 2 : sec));
        keys[n] = "connect_timeout";
        vals[n++] = ct;
    }
    keys[n] = "application_name";
    vals[n++] = "lease";
    keys[n] = vals[n] = NULL;
    /* Asynchronously, so that the handle's timeout bounds it. */
    s->conn = PQconnectStartParams(keys, vals, 1);
    for (n = 0; n < 3; n++)
        free(hosts[n]);
    if (s->conn == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    return connect_poll(s, end);
}

/* Connect if needed (bounded by `end`), and prepare. */
static int pg_ensure(pg_store *s, int64_t end)
{
    int rc;

    /* A changed handle timeout reaches the server here, within the call's
     * bound: sent when it changed, its round trip would have a bound of its
     * own, which a keeper shrinking its bound ahead of a renewal would wait
     * on as well. */
    if (s->conn && PQstatus(s->conn) == CONNECTION_OK && s->prepared)
        return s->server_timeout_ms != s->parent.timeout_ms
                   ? set_server_timeouts(s, end) : 0;
    if (s->conn == NULL || PQstatus(s->conn) != CONNECTION_OK) {
        pg_drop(s);
        if ((rc = pg_connect(s, end)) < 0)
            return rc;
        if (PQstatus(s->conn) != CONNECTION_OK) {
            rc = lease__seterr(LEASE_ESTORE, "cannot connect to postgres %s: %s",
                               s->parent.url_redacted,
                               pgmsg(s));
            pg_drop(s);
            return rc;
        }
        pg_cloexec(s);
        /* Server notices ("relation already exists, skipping") are not
         * errors; libpq would print them on stderr. */
        PQsetNoticeProcessor(s->conn, ignore_notice, NULL);
        if ((rc = set_server_timeouts(s, end)) < 0)
            return rc;
    } else if (s->server_timeout_ms != s->parent.timeout_ms &&
               (rc = set_server_timeouts(s, end)) < 0) {
        return rc;
    }
    if (s->sql[0] == NULL)
        return 0;
    return prepare_all(s, end);
}

/* The server gives up at the handle's timeout (statement_timeout,
 * lock_timeout) and answers with a clean error; the client waits a little
 * longer for that answer before it drops the connection as unanswered. */
#define ANSWER_GRACE_MS 250

static int64_t call_end(pg_store *s)
{
    return lease_clock_ns() + (int64_t)(s->parent.timeout_ms + ANSWER_GRACE_MS) * 1000000;
}

/*
 * Execute prepared statement `which` with text parameters; on success
 * *out is the result (PGRES_TUPLES_OK or COMMAND_OK) for the caller to
 * PQclear. A failed statement is LEASE_ESTORE; the connection is kept if
 * it is still sound.
 */
static int exec_prepared_by(PGresult **out, pg_store *s, int which,
                            const char *const *vals, const int *lens,
                            const int *fmts, const char *what, int64_t end)
{
    char name[16];
    PGresult *res;
    int rc;

    *out = NULL;
    s->state[0] = '\0';
    if ((rc = pg_ensure(s, end)) < 0)
        return rc;
    snprintf(name, sizeof(name), "lease_%d", which);
    if (!PQsendQueryPrepared(s->conn, name, params[which].n, vals, lens, fmts, 0))
        return pg_fail(s, what);
    if ((res = await(s, what, end)) == NULL)
        return LEASE_ESTORE;
    if (PQresultStatus(res) != PGRES_TUPLES_OK &&
        PQresultStatus(res) != PGRES_COMMAND_OK) {
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

        if (state)
            lease__strlcpy(s->state, state, sizeof(s->state));
        rc = lease__seterr(LEASE_ESTORE, "postgres %s: %s%s%s", what,
                           PQresultErrorMessage(res), state ? " SQLSTATE " : "",
                           state ? state : "");
        PQclear(res);
        if (PQstatus(s->conn) != CONNECTION_OK)
            pg_drop(s);
        return rc;
    }
    *out = res;
    return 0;
}

static int exec_prepared(PGresult **out, pg_store *s, int which,
                         const char *const *vals, const int *lens,
                         const int *fmts, const char *what)
{
    return exec_prepared_by(out, s, which, vals, lens, fmts, what, call_end(s));
}

/* ---- opening: URL, identifiers, schema -------------------------------- */

static int is_ours(const char *name)
{
    return strcmp(name, "lease_table") == 0 || strcmp(name, "fence_table") == 0 ||
           strcmp(name, "data_table") == 0 || strcmp(name, "history_table") == 0 ||
           strcmp(name, "tokens") == 0;
}

/* The URL without our own parameters, for libpq. */
static char *strip_params(const char *url)
{
    const char *q = strchr(url, '?'), *p;
    char *out;
    size_t len = 0;
    int first = 1;

    if (q == NULL)
        return strdup(url);
    out = malloc(strlen(url) + 1);
    if (out == NULL)
        return NULL;
    memcpy(out, url, (size_t)(q - url));
    len = (size_t)(q - url);
    for (p = q + 1; *p;) {
        size_t n = strcspn(p, "&");
        size_t nl = strcspn(p, "=&");
        char name[32];

        if (nl < sizeof(name)) {
            memcpy(name, p, nl);
            name[nl] = '\0';
        } else {
            name[0] = '\0';
        }
        if (n > 0 && !is_ours(name)) {
            out[len++] = first ? '?' : '&';
            memcpy(out + len, p, n);
            len += n;
            first = 0;
        }
        p += n;
        if (*p == '&')
            p++;
    }
    out[len] = '\0';
    return out;
}

/* Quote "schema.table" or "table" as identifiers; names are checked to be
 * plain identifiers so a URL cannot smuggle SQL in. */
static int pg_check_table(const char *name)
{
    const char *dot = strchr(name, '.');
    size_t i;

    for (i = 0; name[i]; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || c == '_' || c == '.' ||
              (i > 0 && c >= '0' && c <= '9')))
            return lease__seterr(LEASE_EINVALID,
                                 "table name '%.64s' must be lower-case letters, "
                                 "digits and '_' (optionally schema.table)", name);
    }
    if (i == 0 || i > 127 || (dot && strchr(dot + 1, '.')) || name[0] == '.' ||
        name[i - 1] == '.')
        return lease__seterr(LEASE_EINVALID, "bad table name '%.64s'", name);
    /* Each part must fit quote_table's buffer (and PostgreSQL's 63-byte
     * identifiers). */
    if ((dot ? (size_t)(dot - name) : i) >= 64 || (dot && strlen(dot + 1) >= 64))
        return lease__seterr(LEASE_EINVALID, "table name is too long");
    return 0;
}

static int quote_table(char **out, PGconn *conn, const char *name)
{
    char part[64], *a = NULL, *b = NULL;
    const char *dot = strchr(name, '.');
    int rc;

    if ((rc = pg_check_table(name)) < 0)
        return rc;
    if (dot) {
        if ((size_t)(dot - name) >= sizeof(part) || strlen(dot + 1) >= sizeof(part))
            return lease__seterr(LEASE_EINVALID, "table name is too long");
        memcpy(part, name, (size_t)(dot - name));
        part[dot - name] = '\0';
        a = PQescapeIdentifier(conn, part, strlen(part));
        b = PQescapeIdentifier(conn, dot + 1, strlen(dot + 1));
        if (a && b && (*out = malloc(strlen(a) + strlen(b) + 2)) != NULL)
            sprintf(*out, "%s.%s", a, b);
        else
            *out = NULL;
        PQfreemem(a);
        PQfreemem(b);
    } else {
        if (strlen(name) >= sizeof(part))
            return lease__seterr(LEASE_EINVALID, "table name is too long");
        a = PQescapeIdentifier(conn, name, strlen(name));
        *out = a ? strdup(a) : NULL;
        PQfreemem(a);
    }
    return *out ? 0 : lease__seterr(LEASE_ENOMEM, "out of memory");
}

static char *pg_fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));

static char *pg_fmt(const char *f, ...)
{
    va_list ap;
    char *out = NULL;

    va_start(ap, f);
    if (vasprintf(&out, f, ap) < 0)
        out = NULL;
    va_end(ap);
    return out;
}

/* ---- statements: one builder each, tables by name -------------------- */

/* The time left on the store's clock, in ms, 0 once past (and for the
 * reference SQL's '-infinity' of a released row). */
#define REMAINING(t) \
    "CASE WHEN " t ".lease_until > clock_timestamp() THEN " \
    "ceil(EXTRACT(EPOCH FROM " t ".lease_until - clock_timestamp()) * 1000)::bigint " \
    "ELSE 0 END"
#define ALIVE(t) "(" t ".owner_id IS NOT NULL AND " t ".lease_until > clock_timestamp())"

/* A timestamptz as ms since the epoch; 0 for NULL and the infinities. */
#define EPOCH_MS(x) \
    "CASE WHEN isfinite(" x ") THEN floor(EXTRACT(EPOCH FROM " x ") * 1000)::bigint " \
    "ELSE 0 END"

/* The optional columns describe the grant whose token is in holder_token:
 * a lease taken by the reference SQL run by hand leaves them as they were,
 * and must not be shown with its predecessor's label; nor a released one
 * (a deferred history's release leaves them: see DEFERRED). */
static const char *label_col(int has_label)
{
    return has_label ? "CASE WHEN l.holder_token = l.fencing_token "
                       "AND l.owner_id IS NOT NULL THEN l.holder_label END"
                     : "NULL::text";
}

static const char *ttl_col(int has_ttl)
{
    return has_ttl ? "CASE WHEN l.holder_token = l.fencing_token "
                     "AND l.owner_id IS NOT NULL THEN l.lease_ttl_ms END"
                   : "NULL::bigint";
}

/*
 * The server's clock in microseconds since the epoch, for clock tokens.
 * statement_timestamp() and not clock_timestamp(): it is the same for
 * every evaluation within the statement, so the initial token, the
 * updated token, holder_token and the clock returned to the caller are
 * all computed from one reading (clock_timestamp() changes between
 * evaluations, and a holder_token off by a microsecond from its token
 * would hide the holder's label and ttl).
 */
#define CLOCK_US "floor(extract(epoch from statement_timestamp()) * 1000000)::bigint"

/* The token of a new grant after `prev`: the reference SQL's prev + 1,
 * or with clock tokens at least the server's clock. */
static char *next_token(const pg_store *s, const char *prev)
{
    if (s->tokens == LEASE__TOKENS_COUNTER)
        return pg_fmt("%s + 1", prev);
    return pg_fmt("greatest(%s + 1, " CLOCK_US ")", prev);
}

/* The row is the acquiring owner's own unexpired lease: a retry, which
 * keeps its grant. */
#define RETRY "l.owner_id = EXCLUDED.owner_id AND l.lease_until > clock_timestamp()"

/* The reference upsert. One change: the owner that already holds the
 * unexpired lease may acquire again (a retry whose answer was lost)
 * and keeps its token, with a new expiry. `after_o`: it reads its row
 * from `o` first (see sql_acquire_history), hence SELECT instead of
 * VALUES. With a deferred history (see DEFERRED) a new grant also
 * records when it began (acquired_at), and `fast` takes only a key
 * that is free or the owner's own (sql_acquire_fast). With clock tokens
 * it also returns the clock it used (clock_us), for pg_acquire to tell
 * a clock behind the tokens. */
static char *lease_upsert(const pg_store *s, int has_label, int has_ttl, int after_o,
                          int fast)
{
    int holder = has_label || has_ttl, clock = s->tokens == LEASE__TOKENS_CLOCK;
    char *first = next_token(s, "0"), *next = next_token(s, "l.fencing_token");
    char *token = NULL, *token_set = NULL, *sql = NULL;
    const char *init = clock ? first : "1";

    if (first && next)
        token = pg_fmt("CASE WHEN " RETRY " THEN l.fencing_token ELSE %s END", next);
    /* A new grant clears the waiters' announcements: whoever still waits
     * was woken by the release before it (or found the key free) and,
     * busy again, announces itself again, after this grant. A holder's
     * retry keeps them: they wait for its release. */
    if (token)
        token_set = pg_fmt("%s%s%s%s", holder ? ", holder_token = " : "",
                           holder ? token : "",
                           s->has_wait ? ", waiting_until = CASE WHEN " RETRY
                                         " THEN l.waiting_until END"
                                       : "",
                           s->deferred ? ", acquired_at = CASE WHEN " RETRY
                                         " THEN l.acquired_at ELSE clock_timestamp() END"
                                       : "");
    if (token_set)
        sql = pg_fmt(
            "INSERT INTO %s AS l (resource_key, owner_id, lease_until, fencing_token%s%s%s%s) "
            "%s$1, $2::uuid, clock_timestamp() + $3::interval, %s%s%s%s%s%s%s "
            "ON CONFLICT (resource_key) DO UPDATE "
            "SET owner_id = EXCLUDED.owner_id, "
            "lease_until = clock_timestamp() + $3::interval, "
            "fencing_token = %s%s%s%s "
            "WHERE %s "
            "RETURNING l.fencing_token%s%s",
            s->lease_table, has_label ? ", holder_label" : "",
            has_ttl ? ", lease_ttl_ms" : "", holder ? ", holder_token" : "",
            s->deferred ? ", acquired_at" : "",
            after_o ? "SELECT " : "VALUES (", init,
            has_label ? ", NULLIF($4, '')" : "", has_ttl ? ", $5::bigint" : "",
            holder ? ", " : "", holder ? init : "",
            s->deferred ? ", clock_timestamp()" : "",
            after_o ? " FROM (SELECT count(*) FROM o) AS locked" : ")", token,
            has_label ? ", holder_label = EXCLUDED.holder_label" : "",
            has_ttl ? ", lease_ttl_ms = EXCLUDED.lease_ttl_ms" : "", token_set,
            fast ? "l.owner_id IS NULL OR (" RETRY ")"
                 : "l.lease_until <= clock_timestamp() OR l.owner_id = EXCLUDED.owner_id",
            after_o ? ", l.lease_until" : "", clock ? ", " CLOCK_US " AS clock_us" : "");
    free(first);
    free(next);
    free(token);
    free(token_set);
    return sql;
}

/* Acquire without a history: the upsert alone. */
static char *sql_acquire(const pg_store *s, int has_label, int has_ttl)
{
    return lease_upsert(s, has_label, has_ttl, 0, 0);
}

/*
 * With a history, the same statement records the grant (one round
 * trip, one transaction). The history needs the row as it was before
 * the upsert: the previous token tells a new grant from a holder's
 * retry (which records nothing), and its lease_until is when the
 * previous grant expired. `o` reads it FOR UPDATE, so it is the
 * latest version, the very one the upsert then changes (a plain read
 * would see the statement's snapshot, older than the row a concurrent
 * acquire may have just committed); the upsert's source counts `o`,
 * so `o` runs, and locks, before the upsert touches the row.
 *   g  the new token, only when it is new;
 *   h  its entry, acquired when the expiry was computed (expiry -
 *      acquired is the ttl exactly). A plain INSERT: ON CONFLICT would
 *      make it a speculative insertion, one more WAL record (a
 *      confirmation) on every grant for a case that is nearly never
 *      there: a row already there for that token, a leftover of a lease
 *      table dropped and made anew (tokens restarted) or of another
 *      lease table sharing this history. That grant fails with a
 *      unique violation, and pg_acquire deletes the leftovers
 *      (sql_history_clean) and tries once more;
 *   q  the newest entry before it. Every grant ends the one before it,
 *      so that is the only one that may still be unended: the previous
 *      one expired at its lease_until (or was released by the reference
 *      SQL, which leaves owner_id NULL and writes no history); an older
 *      one (grants made by SQL that keeps no history came in between)
 *      at a time unknown. One index probe, where ending every unended
 *      entry of the key would read them all;
 *   e  ends it (by a scalar, so an index probe, not a scan of the key's
 *      entries). An UPDATE sees the statement's snapshot: if the previous
 *      grant committed after it was taken and expired before the row
 *      lock came (a ttl shorter than this statement), its entry is not
 *      found here and stays unended; it reads expired all the same (the
 *      core checks held entries), without a time, as it would if marked;
 *   d  deletes leftovers above the new token (one index probe, nothing
 *      found but after tokens restarted);
 *   k  only every HISTORY_PRUNE_EVERY-th token (on average, with clock
 *      tokens, whose low digits are the clock's): the oldest token to
 *      keep, the (KEEP-1)-th newest below the new one (with the new one,
 *      KEEP in all). By rank, not by arithmetic: clock tokens jump by
 *      millions, and a table shared by both kinds of tokens mixes steps of
 *      1 with such jumps. It reads the statement's snapshot, which never
 *      shows the row `h` inserts. Ranking a hundred entries on every
 *      grant cost as much as the rest of the statement;
 *   p  prunes the entries below k: so a key keeps between KEEP and
 *      KEEP + HISTORY_PRUNE_EVERY entries, and sql_history reads the
 *      newest KEEP, exactly what pruning on every grant kept.
 * h, e, d and p touch disjoint rows, as one statement must.
 */
#define HISTORY_PRUNE_EVERY 32

static char *sql_acquire_history(const pg_store *s, int has_label, int has_ttl)
{
    const char *lease_table = s->lease_table, *history_table = s->history_table;
    char *upsert = lease_upsert(s, has_label, has_ttl, 1, 0), *sql;

    if (upsert == NULL)
        return NULL;
    sql = pg_fmt(
        "WITH o AS MATERIALIZED (SELECT fencing_token AS token, "
        "lease_until AS until, owner_id AS owner FROM %s "
        "WHERE resource_key = $1 FOR UPDATE), "
        "a AS (%s), "
        "g AS (SELECT a.fencing_token AS token, a.lease_until AS until FROM a "
        "WHERE a.fencing_token IS DISTINCT FROM (SELECT o.token FROM o)), "
        "h AS (INSERT INTO %s AS h (resource_key, fencing_token, owner_id, "
        "holder_label, lease_ttl_ms, acquired_at) "
        "SELECT $1, g.token, $2::uuid, NULLIF($4, ''), $5::bigint, "
        "g.until - $3::interval FROM g), "
        "q AS MATERIALIZED (SELECT (SELECT x.fencing_token FROM %s AS x "
        "WHERE x.resource_key = $1 AND x.fencing_token < g.token "
        "ORDER BY x.fencing_token DESC LIMIT 1) AS token FROM g), "
        "e AS (UPDATE %s AS h SET "
        "ended = CASE WHEN h.fencing_token = o.token AND o.owner IS NULL "
        "THEN 'released' ELSE 'expired' END, "
        "ended_at = CASE WHEN h.fencing_token = o.token AND o.owner IS NOT NULL "
        "AND isfinite(o.until) THEN o.until END "
        "FROM q LEFT JOIN o ON true "
        "WHERE h.resource_key = $1 AND h.fencing_token = (SELECT token FROM q) "
        "AND h.ended IS NULL), "
        "d AS (DELETE FROM %s AS h USING g WHERE h.resource_key = $1 "
        "AND h.fencing_token > g.token), "
        "k AS (SELECT (SELECT min(x.token) FROM (SELECT y.fencing_token AS token "
        "FROM %s AS y WHERE y.resource_key = $1 AND y.fencing_token < g.token "
        "ORDER BY y.fencing_token DESC LIMIT %d) AS x) AS token "
        "FROM g WHERE g.token %% %d = 0), "
        "p AS (DELETE FROM %s AS h USING k WHERE h.resource_key = $1 "
        "AND h.fencing_token < k.token) "
        "SELECT fencing_token%s FROM a",
        lease_table, upsert, history_table, history_table, history_table,
        history_table, history_table, LEASE_HISTORY_KEEP - 1, HISTORY_PRUNE_EVERY,
        history_table,
        s->tokens == LEASE__TOKENS_CLOCK ? ", clock_us" : "");
    free(upsert);
    return sql;
}

/*
 * DEFERRED: a history written when grants end, not when they begin. It is
 * used when the lease table has acquired_at besides holder_label,
 * lease_ttl_ms and holder_token, as the tables this version makes have:
 * the lease row then describes the grant it holds (holder_token is its
 * token, acquired_at when it began), so a grant's entry is written once,
 * by the statement that ends it, from that row:
 *   release   inserts the entry, released (sql_release_deferred);
 *   takeover  an acquire that finds the lease ran out unreleased inserts
 *             that grant's entry, expired at its lease_until (sql_takeover);
 *   lost      a refused renew inserts it lost, or marks the entry a
 *             takeover wrote (sql_history_lost_deferred);
 * and the history reads the entries with the row's grant
 * (sql_history_deferred). An acquire + release cycle is then the reference
 * upsert and the reference release with one INSERT, where the eager
 * statements (sql_acquire_history) also lock the row ahead of the upsert,
 * update an entry at release and probe the index three times: most of
 * the cost of a cycle with a history, in CPU and WAL (docs/benchmarks.md).
 * The common acquire (sql_acquire_fast) takes a key only when it is free
 * (released, or never held) or the owner's own, when no entry needs
 * writing; a key whose lease ran out unreleased is taken by sql_takeover,
 * after sql_holder found no live holder: one round trip more, then only.
 * Pruning is a statement of its own (sql_history_prune), after a release
 * or takeover of every HISTORY_PRUNE_EVERY-th token.
 * What it does not record: a grant of the library's released by SQL run
 * by hand (the reference release leaves no owner in the row to write the
 * entry with); and clients of versions before this one, which write an
 * entry when a grant begins, leave out the library's grants they take
 * over, so all the clients of such a table must be of this version.
 */
static char *sql_acquire_fast(const pg_store *s, int has_label, int has_ttl)
{
    return lease_upsert(s, has_label, has_ttl, 0, 1);
}

/* The row as it was, locked, for the statements that write the entry of
 * the grant it holds (sql_takeover, sql_history_lost_deferred). */
#define ROW_BEFORE(table)                                                      \
    "o AS MATERIALIZED (SELECT fencing_token AS token, lease_until AS until, " \
    "owner_id AS owner, holder_token AS htoken, holder_label AS label, "       \
    "lease_ttl_ms AS ttl, acquired_at AS at FROM " table " "                   \
    "WHERE resource_key = $1 FOR UPDATE)"

/* The row describes its grant: one this version made (see DEFERRED). */
#define DESCRIBED(t, tok, htok, ttl, at) \
    "(" t "." htok " = " t "." tok " AND " t "." ttl " IS NOT NULL AND " t "." at " IS NOT NULL)"

/* An entry inserted where there may be one of its token already: a
 * leftover of a lease table made anew (tokens restarted, another owner)
 * is overwritten; this grant's own keeps the end it has (lost, say),
 * unless it has none, or one of `also` ("", or " OR h.ended = ..."). */
static char *entry_conflict(const char *also)
{
    return pg_fmt(
        "ON CONFLICT (resource_key, fencing_token) DO UPDATE SET "
        "owner_id = EXCLUDED.owner_id, "
        "holder_label = CASE WHEN h.owner_id = EXCLUDED.owner_id "
        "THEN h.holder_label ELSE EXCLUDED.holder_label END, "
        "lease_ttl_ms = CASE WHEN h.owner_id = EXCLUDED.owner_id "
        "THEN h.lease_ttl_ms ELSE EXCLUDED.lease_ttl_ms END, "
        "acquired_at = CASE WHEN h.owner_id = EXCLUDED.owner_id "
        "THEN h.acquired_at ELSE EXCLUDED.acquired_at END, "
        "ended = EXCLUDED.ended, ended_at = EXCLUDED.ended_at "
        "WHERE h.owner_id <> EXCLUDED.owner_id OR h.ended IS NULL%s",
        also);
}

#define ENTRY_COLUMNS \
    "(resource_key, fencing_token, owner_id, holder_label, lease_ttl_ms, " \
    "acquired_at, ended, ended_at)"

/*
 * A key whose lease ran out unreleased: the reference upsert after the row
 * was read and locked (`o`, as in sql_acquire_history), and the entry of
 * the grant it replaces, expired at its lease_until; only when the row
 * described it and it did end here (a new token: not a retry, not busy).
 */
static char *sql_takeover(const pg_store *s, int has_label, int has_ttl)
{
    char *upsert = lease_upsert(s, has_label, has_ttl, 1, 0);
    char *conflict = entry_conflict(""), *sql = NULL;

    if (upsert && conflict)
        sql = pg_fmt(
            "WITH " ROW_BEFORE("%s") ", a AS (%s), "
            "x AS (INSERT INTO %s AS h " ENTRY_COLUMNS " "
            "SELECT $1, o.token, o.owner, o.label, o.ttl, o.at, 'expired', o.until "
            "FROM o, a WHERE a.fencing_token <> o.token AND o.owner IS NOT NULL AND "
            DESCRIBED("o", "token", "htoken", "ttl", "at") " %s) "
            "SELECT fencing_token%s FROM a",
            s->lease_table, upsert, s->history_table, conflict,
            s->tokens == LEASE__TOKENS_CLOCK ? ", clock_us" : "");
    free(upsert);
    free(conflict);
    return sql;
}

/* Who holds a busy lease: acquire's second statement. */
static char *sql_holder(const pg_store *s, int has_label, int has_ttl)
{
    return pg_fmt(
        "SELECT l.owner_id::text, %s, l.fencing_token, " REMAINING("l") ", %s "
        "FROM %s l WHERE l.resource_key = $1 AND " ALIVE("l"),
        label_col(has_label), ttl_col(has_ttl), s->lease_table);
}

static char *sql_renew(const pg_store *s, int has_label, int has_ttl)
{
    (void)has_label;
    return pg_fmt(
        "UPDATE %s AS l SET lease_until = clock_timestamp() + $4::interval%s "
        "WHERE l.resource_key = $1 AND l.owner_id = $2::uuid "
        "AND l.fencing_token = $3 AND l.lease_until > clock_timestamp() "
        "RETURNING l.lease_until",
        s->lease_table, has_ttl ? ", lease_ttl_ms = $5::bigint" : "");
}

/*
 * sql_renew for many grants of one call: $1 a JSON array of
 * {"k": key, "o": owner, "t": token} (built by jansson), $2 the interval,
 * $3 the ttl in ms. The same conditions as sql_renew, row by row, so a
 * grant is renewed exactly when renew would have renewed it.
 *
 * A row locked by a transaction in progress (a guarded write holds the
 * lease row FOR UPDATE until it commits) is skipped rather than waited
 * for: one busy row must not hold up the batch until the timeout and make
 * every other grant uncertain. The answer is (key, token, renewed): the
 * renewed rows, then those that still read as this holder's in the
 * statement's snapshot but were not renewed (skipped, or changed under
 * it): uncertain, retried before their deadline. A key sent twice joins
 * its row twice; PostgreSQL updates the row once (an UPDATE ... FROM never
 * updates a row twice) and DISTINCT keeps the second part to one row.
 */
static char *sql_renew_many(const pg_store *s, int has_label, int has_ttl)
{
    (void)has_label;
    return pg_fmt(
        "WITH r AS (SELECT * FROM json_to_recordset($1::json) "
        "AS x(k text, o uuid, t bigint)), "
        "c AS (SELECT l.resource_key FROM %s AS l JOIN r ON "
        "l.resource_key = r.k AND l.owner_id = r.o AND l.fencing_token = r.t "
        "AND l.lease_until > clock_timestamp() FOR UPDATE OF l SKIP LOCKED), "
        "u AS (UPDATE %s AS l SET lease_until = clock_timestamp() + $2::interval%s "
        "FROM c WHERE l.resource_key = c.resource_key "
        "RETURNING l.resource_key, l.fencing_token) "
        "SELECT resource_key, fencing_token, true FROM u "
        "UNION ALL SELECT DISTINCT l.resource_key, l.fencing_token, false "
        "FROM %s AS l JOIN r ON l.resource_key = r.k AND l.owner_id = r.o "
        "AND l.fencing_token = r.t AND l.lease_until > clock_timestamp() "
        "WHERE l.resource_key NOT IN (SELECT resource_key FROM u)",
        s->lease_table, s->lease_table,
        has_ttl ? ", lease_ttl_ms = $3::bigint" : "", s->lease_table);
}

/*
 * sql_renew_many for the rows the first statement skipped: the same
 * conditions, waiting for the row locks (a competitor's acquire holds the
 * row for a moment; a guarded write until it commits) within what is left
 * of the call's bound. Only renewed rows come back (the flag is true).
 */
static char *sql_renew_many_wait(const pg_store *s, int has_label, int has_ttl)
{
    (void)has_label;
    return pg_fmt(
        "UPDATE %s AS l SET lease_until = clock_timestamp() + $2::interval%s "
        "FROM json_to_recordset($1::json) AS r(k text, o uuid, t bigint) "
        "WHERE l.resource_key = r.k AND l.owner_id = r.o "
        "AND l.fencing_token = r.t AND l.lease_until > clock_timestamp() "
        "RETURNING l.resource_key, l.fencing_token, true",
        s->lease_table, has_ttl ? ", lease_ttl_ms = $3::bigint" : "");
}

/*
 * Waiters on a lease table without waiting_until announce themselves by
 * holding, while they wait, a shared session-level advisory lock on
 * (WAIT_CLASS, hashtext(key as stored)), taken before they look whether
 * the key is free; a release tries the same lock exclusively for its
 * transaction and notifies only when it cannot have it. Either the
 * release tries first, and holds the lock until it has committed, so
 * the waiter gets its lock only then and finds the key free, or the
 * waiter holds it first and the release notifies. A crashed waiter's
 * lock ends with its session. Nothing is written: no WAL, no row, and a
 * table made by the reference SQL needs no column. The two-int4 form is
 * a lock space of its own, apart from the bigint keys of
 * lease_advisory_txn; two keys of one hash only cost a notification.
 */
#define WAIT_CLASS "1279607123" /* 0x4c454153, "LEAS" */
#define WAIT_LOCK(fn, key) fn "(" WAIT_CLASS ", hashtext(" key "))"

/* The end of a release statement: the notification (see below), from the
 * released row `r`; %s: the test of waiting_until, if the table has it. */
#define RELEASE_NOTIFY                                                          \
    "SELECT CASE WHEN %sNOT " WAIT_LOCK("pg_try_advisory_xact_lock", "r.resource_key") \
    " THEN pg_notify('" NOTIFY_CHANNEL "', r.resource_key) END FROM r"

/* The reference release, and a notification for waiters in the same
 * round trip (sent on commit, so only for a release that happened), only
 * when a waiter announced itself: NOTIFY takes a database-wide lock at
 * commit, held through the WAL flush, so notifying every release would
 * commit releases one at a time. Waiters announce themselves in the
 * row's waiting_until where the table has it (sql_announce), and by the
 * advisory lock above where it has not; a release on a table with the
 * column checks both, so a waiter on a handle opened before the column
 * was added is still heard. The row is updated, so the waiting_until
 * read is the latest committed one: a waiter's announcement that
 * committed first is seen (the release waits for its row lock and reads
 * the new row), and a waiter that announces after this release finds
 * the key free itself.
 * With a history, the same statement ends the grant's entry; only a
 * release that happened does (FROM r). The reference release accepts
 * the owner of an expired lease nobody took since; if its renew was
 * refused first, the grant stays lost: its authority had ended. */
static char *sql_release(const pg_store *s, int has_label, int has_ttl)
{
    const char *history_table = s->history_why ? NULL : s->history_table;

    return pg_fmt(
        "WITH r AS (UPDATE %s SET owner_id = NULL, "
        "lease_until = '-infinity'::timestamptz%s%s "
        "WHERE resource_key = $1 AND owner_id = $2::uuid AND fencing_token = $3 "
        "RETURNING resource_key%s)%s%s%s " RELEASE_NOTIFY,
        s->lease_table, has_label ? ", holder_label = NULL" : "",
        has_ttl ? ", lease_ttl_ms = NULL" : "",
        s->has_wait ? ", waiting_until" : "",
        history_table ? ", h AS (UPDATE " : "", history_table ? history_table : "",
        history_table ? " AS h SET ended = 'released', ended_at = clock_timestamp() "
                        "FROM r WHERE h.resource_key = $1 AND h.fencing_token = $3 "
                        "AND h.owner_id = $2::uuid "
                        "AND (h.ended IS NULL OR h.ended = 'expired'))" : "",
        s->has_wait ? "r.waiting_until > clock_timestamp() OR " : "");
}

/*
 * The reference release, and the grant's entry, released, from what the
 * row says of it (see DEFERRED): the row keeps its label and ttl, which
 * only a held lease shows (label_col). A plain INSERT: one already there
 * (the grant marked lost, or a leftover: see entry_conflict) fails the
 * statement with a unique violation, and pg_release runs
 * sql_release_again: the same with the conflict resolved, and the
 * leftovers above the token deleted.
 */
static char *release_deferred(const pg_store *s, int again)
{
    char *conflict = again ? entry_conflict(" OR h.ended = 'expired'") : pg_fmt("%s", "");
    char *sql = NULL;

    if (conflict)
        sql = pg_fmt(
            "WITH r AS (UPDATE %s SET owner_id = NULL, "
            "lease_until = '-infinity'::timestamptz "
            "WHERE resource_key = $1 AND owner_id = $2::uuid AND fencing_token = $3 "
            "RETURNING resource_key, fencing_token, holder_token, holder_label, "
            "lease_ttl_ms, acquired_at%s), "
            "h AS (INSERT INTO %s AS h " ENTRY_COLUMNS " "
            "SELECT $1, r.fencing_token, $2::uuid, r.holder_label, r.lease_ttl_ms, "
            "r.acquired_at, 'released', clock_timestamp() FROM r WHERE "
            DESCRIBED("r", "fencing_token", "holder_token", "lease_ttl_ms", "acquired_at")
            " %s)%s%s%s " RELEASE_NOTIFY,
            s->lease_table, s->has_wait ? ", waiting_until" : "", s->history_table,
            conflict, again ? ", d AS (DELETE FROM " : "", again ? s->history_table : "",
            again ? " AS h USING r WHERE h.resource_key = $1 "
                    "AND h.fencing_token > r.fencing_token)" : "",
            s->has_wait ? "r.waiting_until > clock_timestamp() OR " : "");
    free(conflict);
    return sql;
}

static char *sql_release_deferred(const pg_store *s, int has_label, int has_ttl)
{
    (void)has_label;
    (void)has_ttl;
    return release_deferred(s, 0);
}

static char *sql_release_again(const pg_store *s)
{
    return release_deferred(s, 1);
}

/*
 * A waiter announces itself until $2 from now, on a listening connection,
 * so that the release notifies. Only while the lease is held, by the
 * acquire's own test (a lease_until past is free): no row means free,
 * try again now. The announcement is a row update, so it and a release
 * of the same row are ordered: either it commits first and the release
 * reads it, or it waits for the release and then finds the key free.
 * It expires on its own, so a waiter that crashed costs releases a
 * notification for one wait at most.
 */
static char *sql_announce(const pg_store *s)
{
    return pg_fmt(
        "UPDATE %s AS l SET waiting_until = "
        "greatest(l.waiting_until, clock_timestamp() + $2::interval) "
        "WHERE l.resource_key = $1 AND l.lease_until > clock_timestamp() "
        "RETURNING 1",
        s->lease_table);
}

/* The waiter's lock (see WAIT_CLASS), taken before
 * it looks at the row (with sql_holder, a statement of its own, so that
 * its snapshot comes after the lock), given back when the wait ends. */
static char *sql_wait_lock(const pg_store *s)
{
    (void)s;
    return pg_fmt("SELECT " WAIT_LOCK("pg_advisory_lock_shared", "$1") ", 1");
}

static char *sql_wait_unlock(const pg_store *s)
{
    (void)s;
    return pg_fmt("SELECT " WAIT_LOCK("pg_advisory_unlock_shared", "$1"));
}

static char *sql_inspect(const pg_store *s, int has_label, int has_ttl)
{
    return pg_fmt(
        "SELECT l.resource_key, l.owner_id::text, %s, l.fencing_token, "
        REMAINING("l") ", %s, " ALIVE("l") " "
        "FROM %s l WHERE l.resource_key = $1",
        label_col(has_label), ttl_col(has_ttl), s->lease_table);
}

/* Prefixes compare bytes (no LIKE: keys may hold '%' and '_'). */
static char *sql_list(const pg_store *s, int has_label, int has_ttl)
{
    return pg_fmt(
        "SELECT l.resource_key, l.owner_id::text, %s, l.fencing_token, "
        REMAINING("l") ", %s, " ALIVE("l") " "
        "FROM %s l WHERE substring(convert_to(l.resource_key, 'UTF8') FROM 1 "
        "FOR length($1::bytea)) = $1::bytea "
        "OR left(l.resource_key, 1) = chr(65535)",
        label_col(has_label), ttl_col(has_ttl), s->lease_table);
}

static char *sql_fence_raise(const pg_store *s)
{
    return pg_fmt(
        "INSERT INTO %s AS f (resource, mark) VALUES ($1, $2) "
        "ON CONFLICT (resource) DO UPDATE SET mark = EXCLUDED.mark "
        "WHERE f.mark <= EXCLUDED.mark RETURNING f.mark",
        s->fence_table);
}

static char *sql_fence_mark(const pg_store *s)
{
    return pg_fmt("SELECT mark FROM %s WHERE resource = $1", s->fence_table);
}

/* The reference guarded-transaction check: exactly one row, locked. */
static char *sql_check_holder(const pg_store *s)
{
    return pg_fmt(
        "SELECT 1 FROM %s WHERE resource_key = $1 AND owner_id = $2::uuid "
        "AND fencing_token = $3 AND lease_until > clock_timestamp() FOR UPDATE",
        s->lease_table);
}

static char *sql_data_put(const pg_store *s)
{
    return pg_fmt(
        "WITH holder AS (SELECT 1 FROM %s WHERE resource_key = $1 "
        "AND owner_id = $2::uuid AND fencing_token = $3 "
        "AND lease_until > clock_timestamp() FOR UPDATE) "
        "INSERT INTO %s AS d (name, value, token, resource_key) "
        "SELECT $4, $5::bytea, $3, $1 FROM holder "
        "ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, "
        "token = EXCLUDED.token, resource_key = EXCLUDED.resource_key "
        "RETURNING 1",
        s->lease_table, s->data_table);
}

static char *sql_data_get(const pg_store *s)
{
    return pg_fmt("SELECT value, token FROM %s WHERE name = $1", s->data_table);
}

/*
 * Newest first. An entry still unended whose grant the lease row
 * shows ended is told here, with the time the row has, in the same
 * snapshot: expired at its lease_until, or released by SQL that
 * keeps no history (owner_id NULL), time unknown. Any other
 * unended entry stays held, for the core to check with inspect.
 * The newest LEASE_HISTORY_KEEP at most: the older ones that batched
 * pruning (sql_acquire_history) has not deleted yet are not shown.
 */
/* An entry's columns as lease_history wants them (pg_history_row), `h`
 * the entry and `l` the key's lease row. */
#define ENTRY_READ                                                             \
    "h.fencing_token, h.owner_id::text, h.holder_label, "                      \
    "h.lease_ttl_ms, " EPOCH_MS("h.acquired_at") ", "                          \
    "CASE WHEN h.ended IS NOT NULL THEN h.ended "                              \
    "WHEN l.fencing_token = h.fencing_token AND l.owner_id IS NULL "           \
    "THEN 'released' "                                                         \
    "WHEN l.fencing_token = h.fencing_token AND l.owner_id = h.owner_id "      \
    "AND l.lease_until <= clock_timestamp() THEN 'expired' END, "              \
    "CASE WHEN h.ended IS NOT NULL THEN " EPOCH_MS("h.ended_at") " "           \
    "WHEN l.fencing_token = h.fencing_token AND l.owner_id = h.owner_id "      \
    "AND l.lease_until <= clock_timestamp() THEN " EPOCH_MS("l.lease_until") " " \
    "ELSE 0 END"

static char *sql_history(const pg_store *s)
{
    return pg_fmt(
        "SELECT " ENTRY_READ " "
        "FROM %s h LEFT JOIN %s l ON l.resource_key = h.resource_key "
        "WHERE h.resource_key = $1 ORDER BY h.fencing_token DESC "
        "LIMIT least($2, %d)",
        s->history_table, s->lease_table, LEASE_HISTORY_KEEP);
}

/*
 * The same with a deferred history (see DEFERRED): the entries, and the
 * grant the row describes while it has no entry (held, or expired when
 * its lease ran out). While the row holds a grant, the only entry of its
 * token is the grant's own, marked lost (or unended, by an older
 * version); any other entry of that token or above is a leftover of a
 * lease table made anew, not shown (sql_history_prune and
 * sql_release_again delete or overwrite them).
 */
#define OWN_ENTRY(h, l) \
    h ".owner_id = " l ".owner_id AND (" h ".ended IS NULL OR " h ".ended = 'lost')"

static char *sql_history_deferred(const pg_store *s)
{
    return pg_fmt(
        "SELECT * FROM (SELECT " ENTRY_READ " "
        "FROM %s h LEFT JOIN %s l ON l.resource_key = h.resource_key "
        "WHERE h.resource_key = $1 AND (l.fencing_token IS NULL "
        "OR h.fencing_token < l.fencing_token OR (h.fencing_token = l.fencing_token "
        "AND (l.owner_id IS NULL OR (" OWN_ENTRY("h", "l") ")))) "
        "UNION ALL SELECT l.fencing_token, l.owner_id::text, l.holder_label, "
        "l.lease_ttl_ms, " EPOCH_MS("l.acquired_at") ", "
        "CASE WHEN l.lease_until <= clock_timestamp() THEN 'expired' END, "
        "CASE WHEN l.lease_until <= clock_timestamp() THEN " EPOCH_MS("l.lease_until")
        " ELSE 0 END "
        "FROM %s l WHERE l.resource_key = $1 AND l.owner_id IS NOT NULL AND "
        DESCRIBED("l", "fencing_token", "holder_token", "lease_ttl_ms", "acquired_at")
        " AND NOT EXISTS (SELECT 1 FROM %s x WHERE x.resource_key = $1 "
        "AND x.fencing_token = l.fencing_token AND " OWN_ENTRY("x", "l") ")) AS e "
        "ORDER BY 1 DESC LIMIT least($2, %d)",
        s->history_table, s->lease_table, s->lease_table, s->history_table,
        LEASE_HISTORY_KEEP);
}

/*
 * A deferred history's pruning: the key's entries below its newest
 * LEASE_HISTORY_KEEP, and the leftovers above the row's token (none is
 * live: an entry is written with a token the row has or had, in the same
 * transaction, so a snapshot that shows an entry shows that row too).
 * By rank, as in sql_acquire_history.
 */
static char *sql_history_prune(const pg_store *s)
{
    return pg_fmt(
        "WITH l AS (SELECT fencing_token AS token FROM %s WHERE resource_key = $1), "
        "k AS (SELECT min(x.token) AS token FROM (SELECT y.fencing_token AS token "
        "FROM %s AS y, l WHERE y.resource_key = $1 AND y.fencing_token <= l.token "
        "ORDER BY y.fencing_token DESC LIMIT %d) AS x) "
        "DELETE FROM %s AS h USING l, k WHERE h.resource_key = $1 "
        "AND (h.fencing_token < k.token OR h.fencing_token > l.token)",
        s->lease_table, s->history_table, LEASE_HISTORY_KEEP, s->history_table);
}

/* The history's leftovers of a key (see sql_acquire_history): entries
 * above the lease row's token, in one snapshot, in which a grant's entry
 * and its lease row are committed together, so no live entry is above. */
static char *sql_history_clean(const pg_store *s)
{
    return pg_fmt(
        "DELETE FROM %s AS h WHERE h.resource_key = $1 AND h.fencing_token > "
        "coalesce((SELECT l.fencing_token FROM %s AS l "
        "WHERE l.resource_key = $1), 0)",
        s->history_table, s->lease_table);
}

/* A refused renew: lost, unless released. It ended when its lease
 * expired: a time already recorded (a successor found it expired),
 * else the lease row's, while the row still has this grant, else
 * (the row was released by raw SQL, say) now. */
static char *sql_history_lost(const pg_store *s)
{
    return pg_fmt(
        "UPDATE %s AS h SET ended = 'lost', "
        "ended_at = coalesce(h.ended_at, (SELECT l.lease_until FROM %s l "
        "WHERE l.resource_key = $1 AND l.fencing_token = $3 "
        "AND l.owner_id = $2::uuid AND isfinite(l.lease_until) "
        "AND l.lease_until <= clock_timestamp()), clock_timestamp()) "
        "WHERE h.resource_key = $1 AND h.fencing_token = $3 "
        "AND h.owner_id = $2::uuid AND h.ended IS DISTINCT FROM 'released'",
        s->history_table, s->lease_table);
}

/*
 * The same with a deferred history: the entry a takeover wrote is marked
 * lost, or else, while the row still holds the grant, the entry is
 * written lost, dated by when its lease ran out (or now, if it had not).
 * The row is locked first, so that a release or takeover of the grant
 * (which lock it too) comes wholly before or after.
 */
static char *sql_history_lost_deferred(const pg_store *s)
{
    return pg_fmt(
        "WITH " ROW_BEFORE("%s") ", "
        "u AS (UPDATE %s AS h SET ended = 'lost', "
        "ended_at = coalesce(h.ended_at, clock_timestamp()) "
        "FROM (SELECT count(*) FROM o) AS locked "
        "WHERE h.resource_key = $1 AND h.fencing_token = $3 "
        "AND h.owner_id = $2::uuid AND h.ended IS DISTINCT FROM 'released' "
        "RETURNING 1) "
        "INSERT INTO %s AS h " ENTRY_COLUMNS " "
        "SELECT $1, o.token, o.owner, o.label, o.ttl, o.at, 'lost', "
        "CASE WHEN o.until <= clock_timestamp() THEN o.until ELSE clock_timestamp() END "
        "FROM o WHERE o.token = $3 AND o.owner = $2::uuid AND "
        DESCRIBED("o", "token", "htoken", "ttl", "at")
        " AND NOT EXISTS (SELECT 1 FROM u) "
        "ON CONFLICT (resource_key, fencing_token) DO UPDATE SET "
        "owner_id = EXCLUDED.owner_id, holder_label = EXCLUDED.holder_label, "
        "lease_ttl_ms = EXCLUDED.lease_ttl_ms, acquired_at = EXCLUDED.acquired_at, "
        "ended = EXCLUDED.ended, ended_at = EXCLUDED.ended_at "
        "WHERE h.owner_id <> EXCLUDED.owner_id",
        s->lease_table, s->history_table, s->history_table);
}

/*
 * Every statement, by its builder: `cols` for those that depend on the
 * lease table's optional columns, `plain` for the others. Acquire has one
 * builder per case; the history's statements exist only with a history,
 * each kind of history (eager, or DEFERRED) with its own.
 */
enum { ALWAYS, WITHOUT_HISTORY, EAGER, DEFERRED, NOT_DEFERRED, WITH_WAITING };

static const struct {
    int st;
    int when;
    char *(*cols)(const pg_store *s, int has_label, int has_ttl);
    char *(*plain)(const pg_store *s);
} builders[] = {
    { ST_ACQUIRE, WITHOUT_HISTORY, .cols = sql_acquire },
    { ST_ACQUIRE, EAGER, .cols = sql_acquire_history },
    { ST_ACQUIRE, DEFERRED, .cols = sql_acquire_fast },
    { ST_TAKEOVER, DEFERRED, .cols = sql_takeover },
    { ST_HOLDER, ALWAYS, .cols = sql_holder },
    { ST_RENEW, ALWAYS, .cols = sql_renew },
    { ST_RENEW_MANY, ALWAYS, .cols = sql_renew_many },
    { ST_RENEW_MANY_WAIT, ALWAYS, .cols = sql_renew_many_wait },
    { ST_RELEASE, NOT_DEFERRED, .cols = sql_release },
    { ST_RELEASE, DEFERRED, .cols = sql_release_deferred },
    { ST_RELEASE_AGAIN, DEFERRED, .plain = sql_release_again },
    { ST_INSPECT, ALWAYS, .cols = sql_inspect },
    { ST_LIST, ALWAYS, .cols = sql_list },
    { ST_FENCE_RAISE, ALWAYS, .plain = sql_fence_raise },
    { ST_FENCE_MARK, ALWAYS, .plain = sql_fence_mark },
    { ST_CHECK_HOLDER, ALWAYS, .plain = sql_check_holder },
    { ST_DATA_PUT, ALWAYS, .plain = sql_data_put },
    { ST_DATA_GET, ALWAYS, .plain = sql_data_get },
    { ST_ANNOUNCE, WITH_WAITING, .plain = sql_announce },
    { ST_WAIT_LOCK, ALWAYS, .plain = sql_wait_lock },
    { ST_WAIT_UNLOCK, ALWAYS, .plain = sql_wait_unlock },
    { ST_HISTORY, EAGER, .plain = sql_history },
    { ST_HISTORY, DEFERRED, .plain = sql_history_deferred },
    { ST_HISTORY_LOST, EAGER, .plain = sql_history_lost },
    { ST_HISTORY_LOST, DEFERRED, .plain = sql_history_lost_deferred },
    { ST_HISTORY_CLEAN, EAGER, .plain = sql_history_clean },
    { ST_HISTORY_PRUNE, DEFERRED, .plain = sql_history_prune },
};

static int wanted(const pg_store *s, int when)
{
    int history = s->history_why == NULL;

    switch (when) {
    case WITHOUT_HISTORY:
        return !history;
    case EAGER:
        return history && !s->deferred;
    case DEFERRED:
        return s->deferred;
    case NOT_DEFERRED:
        return !s->deferred;
    case WITH_WAITING:
        return s->has_wait;
    }
    return 1;
}

/* The statements, from the quoted table names, the lease table's optional
 * columns and whether there is a history (setup_history said). A deferred
 * history needs every optional column but waiting_until. */
static int build_sql(pg_store *s, int has_label, int has_ttl)
{
    size_t i;

    s->deferred = s->history_why == NULL && has_label && has_ttl && s->has_acquired;
    for (i = 0; i < sizeof(builders) / sizeof(builders[0]); i++) {
        int st = builders[i].st;

        if (!wanted(s, builders[i].when))
            continue;
        s->sql[st] = builders[i].cols ? builders[i].cols(s, has_label, has_ttl)
                                      : builders[i].plain(s);
        if (s->sql[st] == NULL)
            return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    return 0;
}

/* ---- schema: tables made when missing (src/stores/pg/) -------------- */

/*
 * A .sql file written for psql's variables (:lease_table ...) made into
 * what the server gets: each :name the table's quoted name, so the file
 * a DBA runs with psql -v and the one the store runs are the same. Any
 * other name is a mistake in the file, said as such rather than sent. As
 * psql does, a cast (::) and what is inside quotes are left alone.
 */
static int sql_subst(char **out, const pg_store *s, const char *sql)
{
    const struct {
        const char *name, *value;
    } vars[] = {
        { "lease_table", s->lease_table },
        { "fence_table", s->fence_table },
        { "data_table", s->data_table },
        { "history_table", s->history_table },
    };
    size_t size = 0, n, i, nvars = sizeof(vars) / sizeof(vars[0]);
    int quoted = 0;
    FILE *f;

    *out = NULL;
    if ((f = open_memstream(out, &size)) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    for (; *sql; sql += n) {
        n = 1;
        if (*sql == '\'')
            quoted = !quoted;
        if (quoted || sql[0] != ':' || sql[1] == ':' || !islower((unsigned char)sql[1])) {
            n = sql[0] == ':' && sql[1] == ':' && !quoted ? 2 : 1;
            fwrite(sql, 1, n, f);
            continue;
        }
        n = strspn(sql + 1, "abcdefghijklmnopqrstuvwxyz0123456789_");
        for (i = 0; i < nvars; i++)
            if (strlen(vars[i].name) == n && strncmp(vars[i].name, sql + 1, n) == 0)
                break;
        if (i == nvars || vars[i].value == NULL) {
            fclose(f);
            free(*out);
            *out = NULL;
            return lease__seterr(LEASE_ESTORE, "postgres: the store's SQL names "
                                 "an unknown variable ':%.*s' (a bug in liblease)",
                                 (int)n, sql + 1);
        }
        fputs(vars[i].value, f);
        n++;
    }
    if (fclose(f) != 0 || *out == NULL) {
        free(*out);
        *out = NULL;
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    return 0;
}

/* Creating tables happens under a transaction-level advisory lock, so that
 * many processes opening a fresh database at once do not race on CREATE. */
static void schema_lock(char *buf, size_t size)
{
    snprintf(buf, size, "SELECT pg_advisory_xact_lock(%lld)",
             (long long)lease_advisory_key("lease schema"));
}

/* The lease, fence and data tables (schema.sql), in one transaction. */
static int create_schema(pg_store *s, int64_t end)
{
    char *ddl, lock[96];
    int rc;

    if ((rc = sql_subst(&ddl, s, LEASE_PG_SCHEMA)) < 0)
        return rc;
    schema_lock(lock, sizeof(lock));
    if ((rc = pg_command(s, "BEGIN", "create schema", end)) < 0 ||
        (rc = pg_command(s, lock, "create schema", end)) < 0 ||
        (rc = pg_command(s, ddl, "create schema", end)) < 0 ||
        (rc = pg_command(s, "COMMIT", "create schema", end)) < 0) {
        if (s->conn)
            pg_command(s, "ROLLBACK", "rollback", end);
    }
    free(ddl);
    return rc;
}

/*
 * Create what is missing, then see which optional columns the lease
 * table has.
 */
static int setup_schema(pg_store *s, int *has_label, int *has_ttl, int64_t end)
{
    const char *v[1] = { s->lease_table };
    const char *v3[3] = { s->lease_table, s->fence_table, s->data_table };
    char state[6];
    PGresult *res;
    int rc, exists;

    /* Existing tables are used as they are: no DDL, so a role without
     * CREATE rights works on a database prepared by someone else. */
    if ((rc = pg_run(&res, state, s, LEASE_PG_TABLES_EXIST, 3, v3,
                     "look for tables", end)) < 0)
        return rc;
    exists = PQntuples(res) == 1 && pg_true(res, 0, 0);
    PQclear(res);
    if (!exists && (rc = create_schema(s, end)) < 0)
        return rc;

    if ((rc = pg_run(&res, state, s, LEASE_PG_LEASE_COLUMNS, 1, v,
                     "read table columns", end)) < 0)
        return rc;
    if (PQntuples(res) != 1) {
        PQclear(res);
        return lease__seterr(LEASE_ESTORE, "postgres read table columns: no row");
    }
    *has_label = pg_true(res, 0, 0);
    *has_ttl = pg_true(res, 0, 1);
    s->has_wait = pg_true(res, 0, 2);
    s->has_acquired = pg_true(res, 0, 3);
    PQclear(res);
    return 0;
}

/* Go on without a history, keeping why for lease_history(). */
static int no_history(pg_store *s, const char *why)
{
    size_t n;

    free(s->history_why);
    s->history_why = pg_fmt("%s", why);
    if (s->history_why == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    /* libpq's messages end with a newline; keep it on one line. */
    n = strlen(s->history_why);
    while (n > 0 && (s->history_why[n - 1] == '\n' || s->history_why[n - 1] == ' '))
        s->history_why[--n] = '\0';
    for (char *p = s->history_why; *p; p++)
        if (*p == '\n')
            *p = ' ';
    return 0;
}

/*
 * A server error that says the history cannot be had here, as opposed to
 * one that may pass.
 */
static int history_refused(pg_store *s, const char *state)
{
    /* Only a clear, lasting refusal: class 42 (no privilege, not a table,
     * ...) or no such schema. Anything else (a deadlock, out of memory or
     * disk, a read-only server in the middle of a failover, a timeout)
     * fails the open like any other table would, rather than leaving this
     * handle silently without a history for its whole life. */
    return s->conn != NULL &&
           (strncmp(state, "42", 2) == 0 || strcmp(state, "3F000") == 0);
}

/* A query about the history table failed: fail the open, or, for a
 * lasting refusal, go on without a history, saying what could not be
 * done ("look for", "read the definition of"). */
static int history_unreadable(pg_store *s, const char *state, int rc, const char *what)
{
    char why[768];

    if (!history_refused(s, state))
        return rc;
    snprintf(why, sizeof(why), "cannot %s table %s: %s", what, s->history_table,
             lease_errmsg());
    return no_history(s, why);
}

/* The missing history table (history.sql), under the schema lock, in a
 * transaction of its own. A refusal leaves the store without a history
 * (history_why set, 0 returned); any other failure fails the open. */
static int create_history(pg_store *s, int64_t end)
{
    char state[6] = "", lock[96], why[768], err[512], *ddl;
    PGresult *res;
    int rc, i, refused;

    if ((rc = sql_subst(&ddl, s, LEASE_PG_HISTORY)) < 0)
        return rc;
    schema_lock(lock, sizeof(lock));
    {
        const char *steps[4] = { "BEGIN", lock, ddl, "COMMIT" };

        for (i = 0, rc = 0; i < 4 && rc == 0; i++) {
            if ((rc = pg_run(&res, state, s, steps[i], 0, NULL,
                             "create history table", end)) < 0)
                break;
            /* A COMMIT of a failed transaction answers ROLLBACK. */
            if (i == 3 && strcmp(PQcmdStatus(res), "COMMIT") != 0)
                rc = lease__seterr(LEASE_ESTORE, "postgres create history "
                                   "table: not committed");
            PQclear(res);
        }
    }
    free(ddl);
    if (rc == 0)
        return 0;
    refused = history_refused(s, state);
    lease__strlcpy(err, lease_errmsg(), sizeof(err));
    if (s->conn && PQtransactionStatus(s->conn) != PQTRANS_IDLE)
        pg_command(s, "ROLLBACK", "rollback", end);
    if (!refused)
        return lease__seterr(rc, "%s", err);
    snprintf(why, sizeof(why), "table %s is missing and could not be "
             "created (%s); open the store once as a role that may "
             "create it, or grant this one that, then open again",
             s->history_table, err);
    return no_history(s, why);
}

/* Made by us or someone else: the columns and the key the statements
 * use, and the rights they need; else no history, saying why. */
static int check_history(pg_store *s, int64_t end)
{
    const char *v[1] = { s->history_table };
    char state[6], why[768];
    PGresult *res;
    int rc;

    if ((rc = pg_run(&res, state, s, LEASE_PG_HISTORY_CHECK, 1, v,
                     "read the history table", end)) < 0)
        return history_unreadable(s, state, rc, "read the definition of");
    if (PQntuples(res) != 1 || !pg_true(res, 0, 0)) {
        PQclear(res);
        snprintf(why, sizeof(why), "table %s is not a grant history table (it "
                 "needs the columns resource_key, fencing_token, owner_id, "
                 "holder_label, lease_ttl_ms, acquired_at, ended, ended_at and "
                 "the primary key (resource_key, fencing_token)); name another "
                 "with history_table=NAME", s->history_table);
        return no_history(s, why);
    }
    if (!pg_true(res, 0, 1)) {
        PQclear(res);
        snprintf(why, sizeof(why), "this role may not select, insert, update "
                 "and delete in table %s; grant it that and open the store "
                 "again", s->history_table);
        return no_history(s, why);
    }
    PQclear(res);
    return 0;
}

/*
 * The history table: created when missing, since it is optional: tables
 * made before it existed (which setup_schema leaves alone) get one, and a
 * role that may not create it, or may not read and write an existing one,
 * or a table of that name that is something else, leaves the store
 * without a history (history() says why) rather than failing it. Then
 * acquire and release use their statements without one.
 */
static int setup_history(pg_store *s, int64_t end)
{
    const char *v[1] = { s->history_table };
    char state[6];
    PGresult *res;
    int rc, exists;

    if ((rc = pg_run(&res, state, s, LEASE_PG_HISTORY_EXISTS, 1, v,
                     "look for the history table", end)) < 0)
        return history_unreadable(s, state, rc, "look for");
    exists = PQntuples(res) == 1 && pg_true(res, 0, 0);
    PQclear(res);
    if (!exists && ((rc = create_history(s, end)) < 0 || s->history_why))
        return rc;
    return check_history(s, end);
}

static void pg_close(lease_store *base)
{
    pg_store *s = (pg_store *)base;
    int i;

    pg_drop(s);
    lease__free_secret(s->conninfo); /* may hold a password */
    free(s->lease_table);
    free(s->fence_table);
    free(s->data_table);
    free(s->history_table);
    free(s->history_why);
    for (i = 0; i < ST_COUNT; i++)
        free(s->sql[i]);
}

static int quote_history(pg_store *s, const char *name, int derived)
{
    int rc = quote_table(&s->history_table, s->conn, name ? name : "lease_history");

    if (rc == LEASE_EINVALID && derived)
        return lease__seterr(rc, "the history table's name, '%.64s' (lease_table "
                             "and _history), is not usable: %s; give "
                             "history_table=NAME", name, lease_errmsg());
    return rc;
}

/* "5432" or "5432,,5433" (one per host; empty for the default). */
static int pg_check_ports(const char *ports)
{
    const char *p = ports;

    while (*p) {
        size_t n = strcspn(p, ","), i;
        unsigned long v = 0;

        for (i = 0; i < n; i++) {
            if (!isdigit((unsigned char)p[i]) || (v = v * 10 + (unsigned long)(p[i] - '0')) > 65535)
                return lease__seterr(LEASE_EINVALID, "bad port in the postgres URL");
        }
        if (n > 0 && v == 0)
            return lease__seterr(LEASE_EINVALID, "bad port in the postgres URL");
        p += n;
        if (*p == ',')
            p++;
    }
    return 0;
}

/*
 * libpq's own reading of the URL, before any connection: a URL it cannot
 * read is the caller's mistake (EINVALID), not an unreachable store. Its
 * message may quote the URL; lease_store_seterr scrubs the password.
 */
/* libpq checks the values of these options only when it connects: check
 * them here, so that a typo is EINVALID (exit 2) with the store unreachable
 * too. The lists are libpq 15's. */
static int pg_check_option(const char *keyword, const char *val)
{
    static const struct {
        const char *keyword, *values;
    } words[] = {
        { "sslmode", " disable allow prefer require verify-ca verify-full " },
        { "gssencmode", " disable prefer require " },
        { "channel_binding", " disable prefer require " },
        { "target_session_attrs",
          " any read-write read-only primary standby prefer-standby " },
    };
    static const char *const numbers[] = { "keepalives", "keepalives_idle",
                                           "keepalives_interval", "keepalives_count",
                                           "tcp_user_timeout" };
    char word[40];
    size_t i;

    for (i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        const char *v = words[i].values;

        if (strcmp(keyword, words[i].keyword) != 0)
            continue;
        if (strlen(val) + 3 <= sizeof(word) && strchr(val, ' ') == NULL) {
            snprintf(word, sizeof(word), " %s ", val);
            if (strstr(v, word) != NULL)
                return 0;
        }
        return lease__seterr(LEASE_EINVALID, "%s= in the postgres URL must be one "
                             "of:%.*s", keyword, (int)strlen(v) - 1, v);
    }
    for (i = 0; i < sizeof(numbers) / sizeof(numbers[0]); i++)
        if (strcmp(keyword, numbers[i]) == 0 &&
            (val[0] == '\0' || strspn(val, "0123456789") != strlen(val) ||
             strlen(val) > 9))
            return lease__seterr(LEASE_EINVALID, "%s= in the postgres URL must be "
                                 "a number", keyword);
    return 0;
}

static int pg_check_conninfo(const char *conninfo)
{
    char *err = NULL;
    PQconninfoOption *opts = PQconninfoParse(conninfo, &err), *o;
    int rc = 0;

    if (opts == NULL) {
        if (err == NULL)
            return lease__seterr(LEASE_ENOMEM, "out of memory");
        for (size_t n = strlen(err); n > 0 && (err[n - 1] == '\n' || err[n - 1] == ' ');)
            err[--n] = '\0';
        rc = lease__seterr(LEASE_EINVALID, "bad postgres URL: %s", err);
        PQfreemem(err);
        return rc;
    }
    for (o = opts; o->keyword && rc == 0; o++) {
        if (o->val == NULL)
            continue;
        if (strcmp(o->keyword, "port") == 0)
            rc = pg_check_ports(o->val);
        else if (strcmp(o->keyword, "connect_timeout") == 0 &&
                 (o->val[0] == '\0' || strspn(o->val, "0123456789") != strlen(o->val) ||
                  strlen(o->val) > 9))
            rc = lease__seterr(LEASE_EINVALID, "connect_timeout= in the postgres "
                               "URL must be a number of seconds");
        else
            rc = pg_check_option(o->keyword, o->val);
    }
    PQconninfoFree(opts);
    return rc;
}

/*
 * Everything about the URL that can be checked without the server, so
 * that bad input is EINVALID before any connection is tried. *ht becomes
 * the history table's name (maybe derived into `derived`).
 */
static int pg_check_url(const lease__url *u, const char *conninfo,
                        char derived[140], const char **ht)
{
    static const char *const names[] = { "lease_table", "fence_table",
                                         "data_table", "history_table" };
    const char *lt = lease__url_param(u, "lease_table");
    size_t i;
    int rc;

    /* libpq reads "postgres:x" as a database name, not as a URL. */
    if (!u->has_authority)
        return lease__seterr(LEASE_EINVALID, "a postgres URL starts with "
                             "postgres:// or postgresql://");
    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        const char *v = lease__url_param(u, names[i]);
        if (v && (rc = pg_check_table(v)) < 0)
            return rc;
    }
    /* Tokens are per lease table: two lease tables must not share a
     * history, whose rows are keyed by token. So the default history
     * follows the lease table: lease_history for the default one,
     * <lease_table>_history for any other. */
    *ht = lease__url_param(u, "history_table");
    if (*ht == NULL && lt != NULL && strcmp(lt, "coordination_lease") != 0) {
        if (strlen(lt) + sizeof("_history") > 140)
            return lease__seterr(LEASE_EINVALID, "bad table name '%.64s'", lt);
        snprintf(derived, 140, "%s_history", lt);
        *ht = derived;
        if ((rc = pg_check_table(derived)) < 0)
            return lease__seterr(rc, "the history table's name, '%.64s' (lease_table "
                                 "and _history), is not usable: %s; give "
                                 "history_table=NAME", derived, lease_errmsg());
    }
    return pg_check_conninfo(conninfo);
}

/* Tables, schema, history and statements on a fresh connection. */
static int pg_setup(pg_store *s, const lease__url *u, const char *ht,
                    int derived, int64_t end)
{
    const char *lt = lease__url_param(u, "lease_table");
    const char *ft = lease__url_param(u, "fence_table");
    const char *dt = lease__url_param(u, "data_table");
    int has_label = 0, has_ttl = 0, rc;

    if ((rc = quote_table(&s->lease_table, s->conn, lt ? lt : "coordination_lease")) < 0 ||
        (rc = quote_table(&s->fence_table, s->conn, ft ? ft : "lease_fence")) < 0 ||
        (rc = quote_table(&s->data_table, s->conn, dt ? dt : "lease_data")) < 0 ||
        (rc = quote_history(s, ht, derived)) < 0 ||
        (rc = setup_schema(s, &has_label, &has_ttl, end)) < 0 ||
        (rc = setup_history(s, end)) < 0 ||
        (rc = build_sql(s, has_label, has_ttl)) < 0)
        return rc;
    return prepare_all(s, end);
}

static int pg_open(lease_store *base, const char *url)
{
    const char *ht = NULL;
    char derived[140];
    int64_t end;
    lease__url u;
    pg_store *s = (pg_store *)base;
    int rc;

    if ((rc = lease__url_parse(&u, url)) < 0)
        return rc;
    if ((s->conninfo = strip_params(url)) == NULL) {
        rc = lease__seterr(LEASE_ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = pg_check_url(&u, s->conninfo, derived, &ht)) < 0 ||
        (rc = lease__url_tokens(&s->tokens, &u)) < 0)
        goto fail;
    /* One deadline for the whole open: connect (every host), schema and
     * statements. The first connect prepares nothing: the statements are
     * built from the table names, which need the connection to be quoted. */
    end = call_end(s);
    if ((rc = pg_ensure(s, end)) < 0 ||
        (rc = pg_setup(s, &u, ht, ht == derived, end)) < 0)
        goto fail;
    lease__url_free(&u);
    return 0;
fail:
    lease__url_free(&u);
    pg_close(&s->parent);
    return rc;
}

/* ---- names: bytes in, UTF-8 text in the table ------------------------ */

/*
 * Keys, labels and resource names are bytes (1..255, no NUL), while a
 * PostgreSQL text column holds only valid UTF-8. A name that is valid UTF-8
 * is stored as it is, so rows written by the reference SQL and by
 * lease interoperate. Any other name (or one that starts with U+FFFF) is
 * stored as U+FFFF followed by its bytes in hex: still text, never equal to
 * a name stored as it is, and read back exactly.
 */
#define ESC "\xef\xbf\xbf" /* U+FFFF, a noncharacter */
#define ESC_LEN 3
#define ENC_SIZE (ESC_LEN + 2 * LEASE_LABEL_MAX + 1)

/* Valid UTF-8 by the library's one rule (lease/log.h). */
static int utf8_valid(const char *p)
{
    size_t n;

    while ((n = lease_utf8_len(p)) > 0)
        p += n;
    return *p == '\0';
}

static const char *pg_enc(char out[ENC_SIZE], const char *name)
{
    static const char hex[] = "0123456789abcdef";
    size_t i, n = strlen(name);
    char *o = out;

    if (utf8_valid(name) && strncmp(name, ESC, ESC_LEN) != 0)
        return name;
    if (n > LEASE_LABEL_MAX)
        n = LEASE_LABEL_MAX;
    memcpy(o, ESC, ESC_LEN);
    o += ESC_LEN;
    for (i = 0; i < n; i++) {
        *o++ = hex[(unsigned char)name[i] >> 4];
        *o++ = hex[(unsigned char)name[i] & 15];
    }
    *o = '\0';
    return out;
}

static void pg_dec(char *out, size_t size, const char *stored)
{
    size_t n = 0;

    if (strncmp(stored, ESC, ESC_LEN) != 0) {
        lease__strlcpy(out, stored, size);
        return;
    }
    for (stored += ESC_LEN; stored[0] && stored[1] && n + 1 < size; stored += 2) {
        int h = lease__hexval((unsigned char)stored[0]);
        int l = lease__hexval((unsigned char)stored[1]);
        if (h < 0 || l < 0 || (h == 0 && l == 0))
            break;
        out[n++] = (char)(h * 16 + l);
    }
    out[n] = '\0';
}

/* ---- the operations --------------------------------------------------- */

static void ttl_text(char *buf, size_t size, uint64_t ttl_ms)
{
    snprintf(buf, size, "%llu milliseconds", (unsigned long long)ttl_ms);
}

static void u64_text(char *buf, size_t size, uint64_t v)
{
    snprintf(buf, size, "%llu", (unsigned long long)v);
}

/* What the server answers is input too: the statement's columns, and as
 * many rows as it can give. */
static int pg_want(const PGresult *res, int cols, int max_rows, const char *what)
{
    if (PQnfields(res) != cols)
        return lease__seterr(LEASE_ESTORE, "postgres %s: the answer has %d columns, "
                             "expected %d", what, PQnfields(res), cols);
    if (max_rows >= 0 && PQntuples(res) > max_rows)
        return lease__seterr(LEASE_ESTORE, "postgres %s: the answer has %d rows, "
                             "expected at most %d", what, PQntuples(res), max_rows);
    return 0;
}

/* A number column's text: digits only, within uint64_t; else -1. */
static int pg_digits(uint64_t *out, const char *v)
{
    unsigned long long x = 0;
    char *end = NULL;

    errno = 0;
    if (v && isdigit((unsigned char)v[0]))
        x = strtoull(v, &end, 10);
    if (end == NULL || *end != '\0' || errno != 0)
        return -1;
    *out = x;
    return 0;
}

static int pg_out_of_range(const char *v, uint64_t min, uint64_t max,
                           const char *what)
{
    return lease__seterr(LEASE_ESTORE, "postgres answered a %s out of range "
                         "('%.24s'; expected %llu..%llu)", what,
                         v && strspn(v, "-0123456789") == strlen(v) ? v : "?",
                         (unsigned long long)min, (unsigned long long)max);
}

/*
 * A number column: digits only, within [min, max], else LEASE_ESTORE
 * naming it. NULL reads as 0 when `nullable` (optional columns), else is
 * malformed too.
 */
static int pg_u64(uint64_t *out, const PGresult *res, int row, int col,
                  uint64_t min, uint64_t max, int nullable, const char *what)
{
    const char *v = PQgetvalue(res, row, col);
    uint64_t x = 0;

    *out = 0;
    if (PQgetisnull(res, row, col)) {
        if (nullable)
            return 0;
        return lease__seterr(LEASE_ESTORE, "postgres answered NULL for the %s", what);
    }
    if (pg_digits(&x, v) < 0 || x < min || x > max)
        return pg_out_of_range(v, min, max, what);
    *out = x;
    return 0;
}

/* A fencing token or mark: lease__token_ok(), or also 0 when `zero_ok`
 * (a lease row never granted, a fence row made with mark 0 by hand). */
static int pg_token(uint64_t *out, const PGresult *res, int row, int col,
                    int zero_ok, const char *what)
{
    const char *v = PQgetvalue(res, row, col);
    uint64_t x = 0;

    *out = 0;
    if (PQgetisnull(res, row, col))
        return lease__seterr(LEASE_ESTORE, "postgres answered NULL for the %s", what);
    if (pg_digits(&x, v) < 0 || !(lease__token_ok(x) || (zero_ok && x == 0)))
        return pg_out_of_range(v, zero_ok ? 0 : 1, LEASE__TOKEN_MAX, what);
    *out = x;
    return 0;
}

/* A name column, decoded back to the bytes it stands for. */
static void val_text(char *dst, size_t size, const PGresult *res, int row, int col)
{
    pg_dec(dst, size, PQgetisnull(res, row, col) ? "" : PQgetvalue(res, row, col));
}

/* A held lease names its owner, a uuid as text. */
static int pg_owner(char *dst, size_t size, const PGresult *res, int row, int col)
{
    if (PQgetisnull(res, row, col) || PQgetlength(res, row, col) != 36)
        return lease__seterr(LEASE_ESTORE, "postgres answered a held lease "
                             "without a valid owner");
    val_text(dst, size, res, row, col);
    return 0;
}

/* Columns: key, owner, label, token, remaining, ttl, alive. */
static int pg_row_info(lease_info *out, const PGresult *res, int row)
{
    const char *alive = PQgetvalue(res, row, 6);
    int rc;

    memset(out, 0, sizeof(*out));
    if (PQgetisnull(res, row, 0) || PQgetisnull(res, row, 6) ||
        (strcmp(alive, "t") != 0 && strcmp(alive, "f") != 0))
        return lease__seterr(LEASE_ESTORE, "postgres answered a lease row "
                             "without a key or a held flag");
    val_text(out->key, sizeof(out->key), res, row, 0);
    out->held = alive[0] == 't';
    val_text(out->label, sizeof(out->label), res, row, 2);
    if (!out->held) {
        /* Released or expired: a token (0 if never granted). Release
         * clears the owner, expiry leaves it: the owner tells them apart. */
        if (!PQgetisnull(res, row, 1))
            out->state = LEASE_STATE_EXPIRED;
        return pg_token(&out->token, res, row, 3, 1, "fencing token");
    }
    if ((rc = pg_owner(out->owner, sizeof(out->owner), res, row, 1)) < 0 ||
        (rc = pg_token(&out->token, res, row, 3, 0, "fencing token")) < 0 ||
        (rc = pg_u64(&out->remaining_ms, res, row, 4, 0, LEASE__MS_MAX, 0,
                     "remaining time")) < 0)
        return rc;
    return pg_u64(&out->ttl_ms, res, row, 5, 1, LEASE__MS_MAX, 1, "ttl");
}

static int pg_unlisten(pg_store *s, int64_t end)
{
    int rc = 0;

    if (s->listening && s->conn) {
        rc = pg_command(s, "UNLISTEN " NOTIFY_CHANNEL, "unlisten", end);
        s->listening = 0;
    }
    return rc;
}

/* Columns: owner, label, token, remaining, ttl; no row or one. */
static int pg_holder(lease_info *holder, const PGresult *res)
{
    int rc;

    if ((rc = pg_want(res, 5, 1, "acquire")) < 0 || PQntuples(res) == 0)
        return rc;
    val_text(holder->label, sizeof(holder->label), res, 0, 1);
    if ((rc = pg_owner(holder->owner, sizeof(holder->owner), res, 0, 0)) < 0 ||
        (rc = pg_token(&holder->token, res, 0, 2, 0, "holder's fencing token")) < 0 ||
        (rc = pg_u64(&holder->remaining_ms, res, 0, 3, 0, LEASE__MS_MAX, 0,
                     "holder's remaining time")) < 0 ||
        (rc = pg_u64(&holder->ttl_ms, res, 0, 4, 1, LEASE__MS_MAX, 1, "holder's ttl")) < 0)
        return rc;
    holder->held = 1;
    return 0;
}

/*
 * The granted row: its token and, with clock tokens, the clock the server
 * used. A token more than a second past that clock took previous + 1:
 * the server's clock is behind tokens issued before (lease__clock_behind).
 */
static int pg_granted(lease_grant *out, const pg_store *s, const lease_request *req,
                      const PGresult *res)
{
    uint64_t clock_us = 0;
    int rc;

    out->ttl_ms = req->ttl_ms;
    if ((rc = pg_token(&out->token, res, 0, 0, 0, "fencing token")) < 0 ||
        s->tokens != LEASE__TOKENS_CLOCK)
        return rc;
    /* The clock is after 1970 and a token itself (it may become one). */
    if ((rc = pg_u64(&clock_us, res, 0, 1, 1, LEASE__TOKEN_MAX, 0,
                     "clock (microseconds)")) < 0)
        return rc;
    if (out->token > clock_us + 1000000)
        lease__clock_behind("postgres", req, out->token, out->token - clock_us);
    return 0;
}

/* The acquire statement; once more, after deleting the history's
 * leftovers of the key, when the new grant's entry met one (a unique
 * violation: see sql_acquire_history). v: the key first. */
static int acquire_exec(PGresult **res, pg_store *s, const char *const *v, int64_t end)
{
    PGresult *clean;
    int rc = exec_prepared_by(res, s, ST_ACQUIRE, v, NULL, NULL, "acquire", end);

    if (rc != LEASE_ESTORE || s->sql[ST_HISTORY_CLEAN] == NULL ||
        strcmp(s->state, "23505") != 0)
        return rc;
    if ((rc = exec_prepared_by(&clean, s, ST_HISTORY_CLEAN, v, NULL, NULL,
                               "acquire (history leftovers)", end)) < 0)
        return rc;
    PQclear(clean);
    return exec_prepared_by(res, s, ST_ACQUIRE, v, NULL, NULL, "acquire", end);
}

/* An acquire statement's answer (taken): 1 and *out for a grant, 0 for
 * none (busy), or an error. */
static int acquire_answer(lease_grant *out, pg_store *s, const lease_request *req,
                          PGresult *res, int64_t end)
{
    int rc = pg_want(res, s->tokens == LEASE__TOKENS_CLOCK ? 2 : 1, 1, "acquire");

    if (rc == 0 && PQntuples(res) == 1 && (rc = pg_granted(out, s, req, res)) == 0) {
        /* A waiter that got the lease stops listening: an idle listener
         * would pile notifications up on its socket. */
        pg_unlisten(s, end);
        rc = 1;
    }
    PQclear(res);
    return rc;
}

/* A deferred history's pruning (sql_history_prune), after a statement
 * that wrote the entry of `token`'s grant or of the one before it, for
 * one token in HISTORY_PRUNE_EVERY (with clock tokens, on average). Best
 * effort: what it leaves the next one deletes. v: the key first. */
static void history_prune(pg_store *s, const char *const *v, uint64_t token, int64_t end)
{
    PGresult *res;

    if (s->deferred && token % HISTORY_PRUNE_EVERY == 0 &&
        exec_prepared_by(&res, s, ST_HISTORY_PRUNE, v, NULL, NULL, "prune history",
                         end) == 0)
        PQclear(res);
}

/*
 * The acquire statement, then, when it granted nothing, who holds the
 * lease (one more round trip, only on this path); with a deferred history,
 * a lease that ran out unreleased, which the acquire statement leaves
 * alone, is taken by sql_takeover then. The three within one bound.
 */
static int pg_acquire(lease_grant *out, lease_info *holder, lease_store *base,
                      const lease_request *req)
{
    pg_store *s = (pg_store *)base;
    char ttl[48], ttl_ms[24], ek[ENC_SIZE], el[ENC_SIZE];
    const char *v[5];
    int64_t end = call_end(s);
    PGresult *res;
    int rc, held;

    ttl_text(ttl, sizeof(ttl), req->ttl_ms);
    u64_text(ttl_ms, sizeof(ttl_ms), req->ttl_ms);
    v[0] = pg_enc(ek, req->key);
    v[1] = req->owner;
    v[2] = ttl;
    v[3] = pg_enc(el, req->label);
    v[4] = ttl_ms;
    if ((rc = acquire_exec(&res, s, v, end)) < 0 ||
        (rc = acquire_answer(out, s, req, res, end)) != 0)
        return rc < 0 ? rc : 0;
    if ((rc = exec_prepared_by(&res, s, ST_HOLDER, v, NULL, NULL, "acquire", end)) < 0)
        return rc;
    memset(holder, 0, sizeof(*holder));
    lease__strlcpy(holder->key, req->key, sizeof(holder->key));
    held = PQntuples(res) > 0;
    rc = pg_holder(holder, res);
    PQclear(res);
    if (rc < 0)
        return rc;
    /* Without a deferred history, no row means the lease ended between
     * the two statements: still busy for this attempt; the caller's next
     * try will get it. */
    if (held || !s->deferred)
        return LEASE_EBUSY;
    if ((rc = exec_prepared_by(&res, s, ST_TAKEOVER, v, NULL, NULL, "acquire", end)) < 0 ||
        (rc = acquire_answer(out, s, req, res, end)) < 0)
        return rc;
    if (rc == 0)
        return LEASE_EBUSY; /* taken by another in between */
    history_prune(s, v, out->token, end);
    return 0;
}

static int pg_renew(uint64_t *granted_ms, lease_store *base, const char *key,
                    const char *owner, uint64_t token, uint64_t ttl_ms)
{
    pg_store *s = (pg_store *)base;
    char tok[24], ttl[48], ms[24], ek[ENC_SIZE];
    const char *v[5] = { pg_enc(ek, key), owner, tok, ttl, ms };
    PGresult *res;
    int rc, n;

    u64_text(tok, sizeof(tok), token);
    ttl_text(ttl, sizeof(ttl), ttl_ms);
    u64_text(ms, sizeof(ms), ttl_ms);
    if ((rc = exec_prepared(&res, s, ST_RENEW, v, NULL, NULL, "renew")) < 0)
        return rc;
    rc = pg_want(res, 1, 1, "renew");
    n = PQntuples(res);
    PQclear(res);
    if (rc < 0)
        return rc;
    if (n != 1)
        return lease__not_holder("renew", key, token, NULL);
    *granted_ms = ttl_ms;
    return 0;
}

/* One grant as sent by renew_many: its key as stored (pg_enc), pointing
 * into the JSON sent, its token, and its place in the caller's arrays. */
typedef struct {
    const char *key;
    uint64_t token;
    size_t i;
} pg_sent;

static int sent_cmp(const void *a, const void *b)
{
    const pg_sent *x = a, *y = b;
    int c = strcmp(x->key, y->key);

    if (c != 0)
        return c;
    return x->token < y->token ? -1 : x->token > y->token;
}

/*
 * The grants as one JSON array for json_to_recordset, built by jansson
 * (never by hand: keys may hold quotes, backslashes, any byte); `sent`
 * points at its keys, so the array lives until the answer is matched.
 * Keys go through pg_enc as in every other statement: what is not UTF-8
 * is stored hex-escaped (and jansson takes only UTF-8).
 */
static json_t *renew_many_json(pg_sent *sent, const lease_grant *grants, size_t n)
{
    json_t *arr = json_array(), *g;
    char ek[ENC_SIZE];
    size_t i;

    for (i = 0; arr && i < n; i++) {
        g = json_pack("{s:s, s:s, s:I}", "k", pg_enc(ek, grants[i].key), "o",
                      grants[i].owner, "t", (json_int_t)grants[i].token);
        if (g == NULL || json_array_append_new(arr, g) < 0) {
            json_decref(arr);
            return NULL;
        }
        sent[i].key = json_string_value(json_object_get(g, "k"));
        sent[i].token = grants[i].token;
        sent[i].i = i;
    }
    return arr;
}

/* One row of the answer: its grants (more than one only if the caller sent
 * a key twice) are renewed, or uncertain when the row was skipped. */
static int renew_many_row(int *results, uint64_t *granted_ms, pg_sent *hit,
                          const pg_sent *end, const pg_sent *want, int renewed,
                          uint64_t ttl_ms)
{
    if (results[hit->i] != LEASE_ELOST)
        return lease__seterr(LEASE_ESTORE, "postgres renew: the answer "
                             "names one key twice");
    for (; hit < end && sent_cmp(hit, want) == 0; hit++) {
        results[hit->i] = renewed ? 0 : LEASE_ESTORE;
        granted_ms[hit->i] = renewed ? ttl_ms : 0;
    }
    return 0;
}

/*
 * Each row of the answer (key, token, renewed) must be a grant that was
 * sent, and come once: renewed, or skipped (locked by a transaction in
 * progress: uncertain, LEASE_ESTORE). A grant not in the answer was
 * refused (LEASE_ELOST, preset). Anything else is a malformed answer,
 * LEASE_ESTORE. `sent` is sorted by sent_cmp.
 */
static int renew_many_match(int *results, uint64_t *granted_ms, const PGresult *res,
                            pg_sent *sent, size_t n, uint64_t ttl_ms)
{
    int row, rows = PQntuples(res), rc;
    pg_sent want, *hit;

    for (row = 0; row < rows; row++) {
        const char *renewed = PQgetvalue(res, row, 2);

        if (PQgetisnull(res, row, 0) || PQgetisnull(res, row, 2) ||
            (strcmp(renewed, "t") != 0 && strcmp(renewed, "f") != 0))
            return lease__seterr(LEASE_ESTORE, "postgres renew: the answer has "
                                 "a NULL key or a flag that is not a boolean");
        if ((rc = pg_token(&want.token, res, row, 1, 0, "fencing token")) < 0)
            return rc;
        want.key = PQgetvalue(res, row, 0);
        hit = bsearch(&want, sent, n, sizeof(*sent), sent_cmp);
        if (hit == NULL)
            return lease__seterr(LEASE_ESTORE, "postgres renew: the answer "
                                 "names a key and token it was not sent");
        while (hit > sent && sent_cmp(hit - 1, &want) == 0)
            hit--;
        if ((rc = renew_many_row(results, granted_ms, hit, sent + n, &want,
                                 renewed[0] == 't', ttl_ms)) < 0)
            return rc;
    }
    return 0;
}

/* One statement (`which`) over n grants: results[i] for grants[i], a
 * grant absent from the answer refused (LEASE_ELOST). */
static int renew_many_once(int *results, uint64_t *granted_ms, pg_store *s, int which,
                           const lease_grant *grants, size_t n, uint64_t ttl_ms,
                           int64_t end)
{
    char ttl[48], ms[24], *text = NULL;
    const char *v[3] = { NULL, ttl, ms };
    pg_sent *sent;
    PGresult *res = NULL;
    json_t *arr = NULL;
    size_t i;
    int rc;

    for (i = 0; i < n; i++) {
        results[i] = LEASE_ELOST;
        granted_ms[i] = 0;
    }
    if ((sent = malloc((n ? n : 1) * sizeof(*sent))) == NULL ||
        (arr = renew_many_json(sent, grants, n)) == NULL ||
        (text = json_dumps(arr, JSON_COMPACT)) == NULL) {
        rc = lease__seterr(LEASE_ENOMEM, "postgres renew: out of memory "
                           "building the grants' JSON");
        goto out;
    }
    qsort(sent, n, sizeof(*sent), sent_cmp);
    ttl_text(ttl, sizeof(ttl), ttl_ms);
    u64_text(ms, sizeof(ms), ttl_ms);
    v[0] = text;
    if ((rc = exec_prepared_by(&res, s, which, v, NULL, NULL, "renew", end)) < 0)
        goto out;
    if ((rc = pg_want(res, 3, (int)n, "renew")) == 0)
        rc = renew_many_match(results, granted_ms, res, sent, n, ttl_ms);
out:
    PQclear(res);
    free(text);
    json_decref(arr);
    free(sent);
    return rc;
}

/*
 * The grants whose rows the batch skipped (uncertain: locked by a
 * transaction in progress) get one more statement that waits for the
 * locks, bounded by what is left of the call: a row locked for a moment
 * (a competitor's acquire) is renewed rather than left uncertain, which
 * with step_down would be a loss. A lock held past the bound leaves its
 * grant uncertain; the rest of the batch was renewed already.
 */
static void renew_skipped(int *results, uint64_t *granted_ms, pg_store *s,
                          const lease_grant *grants, size_t n, uint64_t ttl_ms,
                          int64_t end)
{
    lease_grant *again;
    size_t *idx, i, m = 0;
    uint64_t *g2;
    int *r2;

    for (i = 0; i < n; i++)
        m += results[i] == LEASE_ESTORE;
    if (m == 0 || lease_clock_ns() >= end)
        return;
    again = malloc(m * sizeof(*again));
    idx = malloc(m * sizeof(*idx));
    r2 = malloc(m * sizeof(*r2));
    g2 = malloc(m * sizeof(*g2));
    if (again && idx && r2 && g2) {
        for (i = 0, m = 0; i < n; i++)
            if (results[i] == LEASE_ESTORE) {
                idx[m] = i;
                again[m++] = grants[i];
            }
        if (renew_many_once(r2, g2, s, ST_RENEW_MANY_WAIT, again, m, ttl_ms, end) == 0)
            for (i = 0; i < m; i++) {
                results[idx[i]] = r2[i];
                granted_ms[idx[i]] = g2[i];
            }
    }
    free(again);
    free(idx);
    free(r2);
    free(g2);
}

/*
 * Every grant in ONE statement (sql_renew_many), bounded by the handle's
 * timeout as any call: the renewed ones come back, those whose rows were
 * locked are tried once more waiting for the locks (renew_skipped), the
 * others were refused (LEASE_ELOST, as renew would say). The ttl is
 * granted exactly.
 */
static int pg_renew_many(int *results, uint64_t *granted_ms, lease_store *base,
                         const lease_grant *grants, size_t n, uint64_t ttl_ms)
{
    pg_store *s = (pg_store *)base;
    int64_t end = call_end(s);
    int rc;

    if (n > INT_MAX)
        return lease__seterr(LEASE_EINVALID, "too many grants in one renewal");
    rc = renew_many_once(results, granted_ms, s, ST_RENEW_MANY, grants, n, ttl_ms, end);
    if (rc == 0)
        renew_skipped(results, granted_ms, s, grants, n, ttl_ms, end);
    return rc;
}

/* With a deferred history, a unique violation of the entry (see
 * release_deferred) is resolved by sql_release_again, within the bound. */
static int pg_release(lease_store *base, const char *key, const char *owner,
                      uint64_t token)
{
    pg_store *s = (pg_store *)base;
    char tok[24], ek[ENC_SIZE];
    const char *v[3] = { pg_enc(ek, key), owner, tok };
    int64_t end = call_end(s);
    PGresult *res;
    int rc, n;

    u64_text(tok, sizeof(tok), token);
    rc = exec_prepared_by(&res, s, ST_RELEASE, v, NULL, NULL, "release", end);
    if (rc == LEASE_ESTORE && s->deferred && strcmp(s->state, "23505") == 0)
        rc = exec_prepared_by(&res, s, ST_RELEASE_AGAIN, v, NULL, NULL, "release", end);
    if (rc < 0)
        return rc;
    rc = pg_want(res, 1, 1, "release");
    n = PQntuples(res);
    PQclear(res);
    if (rc < 0)
        return rc;
    if (n != 1)
        return lease__not_holder("release", key, token, NULL);
    history_prune(s, v, token, end);
    return 0;
}

static int pg_inspect(lease_info *out, lease_store *base, const char *key)
{
    pg_store *s = (pg_store *)base;
    char ek[ENC_SIZE];
    const char *v[1] = { pg_enc(ek, key) };
    PGresult *res;
    int rc;

    if ((rc = exec_prepared(&res, s, ST_INSPECT, v, NULL, NULL, "inspect")) < 0)
        return rc;
    if ((rc = pg_want(res, 7, 1, "inspect")) < 0) {
        PQclear(res);
        return rc;
    }
    if (PQntuples(res) != 1) {
        PQclear(res);
        return lease__seterr(LEASE_ENOTFOUND, "'%s' was never acquired", key);
    }
    rc = pg_row_info(out, res, 0);
    PQclear(res);
    return rc;
}

static int pg_list(lease_store *base, const char *prefix, lease_list_cb cb,
                   void *payload)
{
    pg_store *s = (pg_store *)base;
    const char *v[1] = { prefix };
    int len[1] = { (int)strlen(prefix) }, fmt1[1] = { 1 };
    size_t plen = strlen(prefix);
    lease_info info;
    PGresult *res;
    int rc = 0, i, n;

    if ((rc = exec_prepared(&res, s, ST_LIST, v, len, fmt1, "list")) < 0)
        return rc;
    if ((rc = pg_want(res, 7, -1, "list")) < 0) {
        PQclear(res);
        return rc;
    }
    n = PQntuples(res);
    /* Escaped names all come back (they cannot be matched in SQL): keep
     * those with the prefix. The core sorts them. */
    for (i = 0; i < n && rc == 0; i++) {
        rc = pg_row_info(&info, res, i);
        if (rc == 0 && strncmp(info.key, prefix, plen) == 0)
            rc = cb(&info, payload);
    }
    PQclear(res);
    return rc;
}

static int pg_read_mark(uint64_t *mark, pg_store *s, const char *resource)
{
    char er[ENC_SIZE];
    const char *v[1] = { pg_enc(er, resource) };
    PGresult *res;
    int rc;

    if ((rc = exec_prepared(&res, s, ST_FENCE_MARK, v, NULL, NULL, "read mark")) < 0)
        return rc;
    if ((rc = pg_want(res, 1, 1, "read mark")) < 0 || PQntuples(res) != 1) {
        PQclear(res);
        return rc < 0 ? rc : lease__seterr(LEASE_ENOTFOUND,
                                           "'%s' has no fencing mark", resource);
    }
    rc = pg_token(mark, res, 0, 0, 1, "fencing mark");
    PQclear(res);
    return rc;
}

static int pg_fence_advance(uint64_t *mark, lease_store *base,
                            const char *resource, uint64_t token)
{
    pg_store *s = (pg_store *)base;
    char tok[24], er[ENC_SIZE];
    const char *v[2] = { pg_enc(er, resource), tok };
    PGresult *res;
    int rc;

    u64_text(tok, sizeof(tok), token);
    if ((rc = exec_prepared(&res, s, ST_FENCE_RAISE, v, NULL, NULL, "fence")) < 0)
        return rc;
    if ((rc = pg_want(res, 1, 1, "fence")) < 0) {
        PQclear(res);
        return rc;
    }
    if (PQntuples(res) == 1) {
        /* The mark written is the token itself. */
        rc = pg_u64(mark, res, 0, 0, token, token, 0, "fencing mark");
        PQclear(res);
        return rc;
    }
    PQclear(res);
    /* Refused by the upsert's WHERE: the mark is above the token. Marks
     * only grow, so what we read now is at least that mark. */
    rc = pg_read_mark(mark, s, resource);
    return rc < 0 ? rc : LEASE_ESTALE;
}

static int pg_fence_mark(uint64_t *mark, lease_store *base, const char *resource)
{
    return pg_read_mark(mark, (pg_store *)base, resource);
}

static int pg_guarded_put(lease_store *base, const char *key, const char *owner,
                          uint64_t token, const char *name, const void *value,
                          size_t len)
{
    pg_store *s = (pg_store *)base;
    char tok[24], ek[ENC_SIZE], en[ENC_SIZE];
    const char *v[5] = { pg_enc(ek, key), owner, tok, pg_enc(en, name), value };
    /* The core let through at most LEASE__VALUE_MAX bytes: an int. */
    int lens[5] = { 0, 0, 0, 0, (int)len }, fmts[5] = { 0, 0, 0, 0, 1 };
    PGresult *res;
    int rc, n;

    u64_text(tok, sizeof(tok), token);
    if ((rc = exec_prepared(&res, s, ST_DATA_PUT, v, lens, fmts, "guarded put")) < 0)
        return rc;
    rc = pg_want(res, 1, 1, "guarded put");
    n = PQntuples(res);
    PQclear(res);
    if (rc < 0)
        return rc;
    if (n != 1)
        return lease__not_holder(NULL, key, token, "; nothing was written");
    return 0;
}

static int pg_data_get(void **value, size_t *len, uint64_t *token,
                       lease_store *base, const char *name)
{
    pg_store *s = (pg_store *)base;
    char en[ENC_SIZE];
    const char *v[1] = { pg_enc(en, name) };
    unsigned char *raw;
    uint64_t tok;
    size_t n;
    PGresult *res;
    int rc;
    char *copy;

    if ((rc = exec_prepared(&res, s, ST_DATA_GET, v, NULL, NULL, "read data")) < 0)
        return rc;
    if ((rc = pg_want(res, 2, 1, "read data")) < 0 || PQntuples(res) != 1) {
        PQclear(res);
        return rc < 0 ? rc : lease__seterr(LEASE_ENOTFOUND, "no data named '%s'", name);
    }
    if ((rc = pg_token(&tok, res, 0, 1, 0, "data's fencing token")) < 0 ||
        PQgetisnull(res, 0, 0)) {
        PQclear(res);
        return rc < 0 ? rc : lease__seterr(LEASE_ESTORE, "postgres answered NULL "
                                           "for the value of '%s'", name);
    }
    raw = PQunescapeBytea((const unsigned char *)PQgetvalue(res, 0, 0), &n);
    if (token)
        *token = tok;
    PQclear(res);
    if (raw == NULL || (copy = malloc(n + 1)) == NULL) {
        PQfreemem(raw);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    memcpy(copy, raw, n);
    copy[n] = '\0';
    PQfreemem(raw);
    *value = copy;
    *len = n;
    return 0;
}

/* A time in the history, ms since the epoch: NULL (not known) is 0. */
static int pg_ms(int64_t *out, const PGresult *res, int row, int col, const char *what)
{
    uint64_t x;
    int rc = pg_u64(&x, res, row, col, 0, INT64_MAX, 1, what);

    *out = (int64_t)x;
    return rc;
}

static int no_history_err(pg_store *s)
{
    return lease__seterr(LEASE_EUNSUPPORTED,
                         "postgres %s keeps no grant history: %s",
                         s->parent.url_redacted,
                         s->history_why);
}

/* Columns: token, owner, label, ttl, acquired, ended (NULL: held), ended. */
static int pg_history_row(lease_history_entry *e, const PGresult *res, int i)
{
    const char *ended = PQgetvalue(res, i, 5);
    int rc, how;

    memset(e, 0, sizeof(*e));
    if ((rc = pg_token(&e->token, res, i, 0, 0, "history's fencing token")) < 0 ||
        (rc = pg_owner(e->owner, sizeof(e->owner), res, i, 1)) < 0 ||
        (rc = pg_u64(&e->ttl_ms, res, i, 3, 1, LEASE__MS_MAX, 0, "history's ttl")) < 0)
        return rc;
    val_text(e->label, sizeof(e->label), res, i, 2);
    if ((rc = pg_ms(&e->acquired_ms, res, i, 4, "history's acquired time")) < 0)
        return rc;
    how = PQgetisnull(res, i, 5) ? LEASE_ENDED_HELD
          : strcmp(ended, "released") == 0 ? LEASE_ENDED_RELEASED
          : strcmp(ended, "lost") == 0     ? LEASE_ENDED_LOST
          : strcmp(ended, "expired") == 0  ? LEASE_ENDED_EXPIRED
                                           : -1;
    if (how < 0)
        return lease__seterr(LEASE_ESTORE, "postgres answered an unknown end "
                             "of a grant in the history");
    e->ended = (lease_ended)how;
    if (e->ended == LEASE_ENDED_HELD)
        return 0;
    return pg_ms(&e->ended_ms, res, i, 6, "history's end time");
}

static int pg_history(lease_history_entry *out, size_t *n, lease_store *base,
                      const char *key, size_t max)
{
    pg_store *s = (pg_store *)base;
    char lim[24], ek[ENC_SIZE];
    const char *v[2] = { pg_enc(ek, key), lim };
    PGresult *res;
    int rc, i, rows;

    *n = 0;
    if (s->history_why)
        return no_history_err(s);
    u64_text(lim, sizeof(lim), max);
    if ((rc = exec_prepared(&res, s, ST_HISTORY, v, NULL, NULL, "history")) < 0)
        return rc;
    rows = PQntuples(res);
    if ((rc = pg_want(res, 7, max > INT_MAX ? -1 : (int)max, "history")) < 0) {
        PQclear(res);
        return rc;
    }
    for (i = 0; i < rows && (size_t)i < max && rc == 0; i++)
        rc = pg_history_row(&out[i], res, i);
    *n = rc < 0 ? 0 : (size_t)i;
    PQclear(res);
    return rc;
}

static int pg_history_lost(lease_store *base, const char *key, const char *owner,
                           uint64_t token)
{
    pg_store *s = (pg_store *)base;
    char tok[24], ek[ENC_SIZE];
    const char *v[3] = { pg_enc(ek, key), owner, tok };
    PGresult *res;
    int rc;

    if (s->history_why)
        return no_history_err(s);
    u64_text(tok, sizeof(tok), token);
    /* No row matched (pruned, another owner, released) is not an error. */
    if ((rc = exec_prepared(&res, s, ST_HISTORY_LOST, v, NULL, NULL,
                            "history lost")) < 0)
        return rc;
    PQclear(res);
    return 0;
}

/* Finish a transaction the caller's callback ran in. */
static int finish_txn(pg_store *s, int cbrc, int64_t end)
{
    char state[6];
    PGresult *res;
    int rc;

    if (cbrc != 0) {
        pg_command(s, "ROLLBACK", "rollback", end);
        return cbrc;
    }
    if (PQtransactionStatus(s->conn) != PQTRANS_INTRANS) {
        pg_command(s, "ROLLBACK", "rollback", end);
        return lease__seterr(LEASE_ESTORE,
                             "the transaction failed inside the callback; "
                             "nothing was committed");
    }
    /* Past the handle's timeout (the callback took it, or the statements
     * before it): a COMMIT sent now would get no more than the answer's
     * grace, and without its answer nobody could say whether the writes
     * committed. Roll back instead, within that grace (or drop the
     * connection, which rolls back too): the answer is certain. */
    if (lease_clock_ns() >= end - (int64_t)ANSWER_GRACE_MS * 1000000) {
        pg_command(s, "ROLLBACK", "rollback", end);
        return lease__seterr(LEASE_ETIMEOUT,
                             "the transaction outlived the handle's timeout "
                             "(%llu ms) before its commit; rolled back, nothing "
                             "was committed",
                             (unsigned long long)s->parent.timeout_ms);
    }
    if ((rc = pg_run(&res, state, s, "COMMIT", 0, NULL, "commit", end)) < 0)
        return rc;
    /* A COMMIT of a failed transaction answers ROLLBACK: not a success. */
    if (strcmp(PQcmdStatus(res), "COMMIT") != 0)
        rc = lease__seterr(LEASE_ESTORE, "postgres commit: the transaction "
                           "was rolled back");
    PQclear(res);
    return rc;
}

static int pg_guarded_txn(lease_store *base, const char *key, const char *owner,
                          uint64_t token, int (*cb)(void *native, void *payload),
                          void *payload)
{
    pg_store *s = (pg_store *)base;
    int64_t end = call_end(s);
    char tok[24], ek[ENC_SIZE];
    const char *v[3] = { pg_enc(ek, key), owner, tok };
    PGresult *res;
    int rc, n;

    u64_text(tok, sizeof(tok), token);
    if ((rc = pg_ensure(s, end)) < 0 || (rc = pg_command(s, "BEGIN", "begin", end)) < 0)
        return rc;
    /* the reference pattern: lock and validate the lease row, exactly one
     * row, under the bounded lock_timeout and statement_timeout. */
    if ((rc = exec_prepared_by(&res, s, ST_CHECK_HOLDER, v, NULL, NULL,
                               "guarded transaction", end)) < 0) {
        if (s->conn)
            pg_command(s, "ROLLBACK", "rollback", end);
        return rc;
    }
    n = PQntuples(res);
    PQclear(res);
    if (n != 1) {
        pg_command(s, "ROLLBACK", "rollback", end);
        return lease__not_holder(NULL, key, token, "; nothing was run");
    }
    return finish_txn(s, cb(s->conn, payload), end);
}

static int pg_advisory_txn(lease_store *base, int64_t lock_key, int try_only,
                           int (*cb)(void *native, void *payload), void *payload)
{
    pg_store *s = (pg_store *)base;
    int64_t end = call_end(s);
    char k[24], state[6];
    const char *v[1] = { k };
    PGresult *res;
    int rc;

    snprintf(k, sizeof(k), "%lld", (long long)lock_key);
    if ((rc = pg_ensure(s, end)) < 0 || (rc = pg_command(s, "BEGIN", "begin", end)) < 0)
        return rc;
    if ((rc = pg_run(&res, state, s,
                  try_only ? "SELECT pg_try_advisory_xact_lock($1::bigint)"
                           : "SELECT pg_advisory_xact_lock($1::bigint), true",
                  1, v, "advisory lock", end)) < 0) {
        /* 55P03 lock_not_available (lock_timeout) or 57014 query_canceled
         * (statement_timeout): the lock was not granted in time. */
        if (strcmp(state, "55P03") == 0 || strcmp(state, "57014") == 0)
            rc = lease__seterr(LEASE_ETIMEOUT, "advisory lock %lld: not granted "
                               "within %llu ms", (long long)lock_key,
                               (unsigned long long)s->parent.timeout_ms);
        if (s->conn)
            pg_command(s, "ROLLBACK", "rollback", end);
        return rc;
    }
    if (!pg_true(res, 0, try_only ? 0 : 1)) {
        PQclear(res);
        pg_command(s, "ROLLBACK", "rollback", end);
        return lease__seterr(LEASE_EBUSY, "advisory lock %lld is held by "
                             "another transaction", (long long)lock_key);
    }
    PQclear(res);
    return finish_txn(s, cb(s->conn, payload), end);
}

/*
 * Take the waiter's lock (WAIT_CLASS), then, in a
 * statement of its own (a snapshot taken after the lock), see whether the
 * key is held. 1 when it is free: no release will come, try again now.
 */
static int pg_wait_lock(pg_store *s, const char *stored, int64_t end)
{
    const char *v[1] = { stored };
    PGresult *res;
    int rc, n;

    if ((rc = exec_prepared_by(&res, s, ST_WAIT_LOCK, v, NULL, NULL, "announce a wait",
                               end)) < 0)
        return rc;
    s->wait_locked = 1; /* it answered: taken, whatever the answer says */
    rc = pg_want(res, 2, 1, "announce a wait");
    n = PQntuples(res);
    PQclear(res);
    if (rc < 0 || n != 1)
        return rc < 0 ? rc : lease__seterr(LEASE_ESTORE, "postgres announce a "
                                           "wait: no row");
    if ((rc = exec_prepared_by(&res, s, ST_HOLDER, v, NULL, NULL, "announce a wait",
                               end)) < 0)
        return rc;
    rc = pg_want(res, 5, 1, "announce a wait");
    n = PQntuples(res);
    PQclear(res);
    return rc < 0 ? rc : n == 0;
}

/*
 * Listening (committed first), announce the wait, so that the release
 * notifies: by the waiter's lock (pg_wait_lock) and, where the table has
 * waiting_until, in the lease row until the wait ends (sql_announce). The
 * lock is taken on a table with the column too: a handle opened before
 * the column was added releases checking the lock only. 1 when the key is
 * free already: no release will come, try again now.
 */
static int pg_announce(pg_store *s, const char *stored, uint64_t timeout_ms,
                       int64_t end)
{
    char until[48];
    const char *v[2] = { stored, until };
    PGresult *res;
    int rc, n;

    if ((rc = pg_wait_lock(s, stored, end)) != 0 || s->sql[ST_ANNOUNCE] == NULL)
        return rc;
    ttl_text(until, sizeof(until), timeout_ms);
    if ((rc = exec_prepared_by(&res, s, ST_ANNOUNCE, v, NULL, NULL, "announce a wait",
                               end)) < 0)
        return rc;
    rc = pg_want(res, 1, 1, "announce a wait");
    n = PQntuples(res);
    PQclear(res);
    return rc < 0 ? rc : n == 0;
}

/*
 * A wait ends: give the waiter's lock back, then stop listening (an idle
 * listener would pile up every release in the database on this
 * connection). A lock that could not be given back ends with the session:
 * kept, it would have every release of the key notify.
 */
static int pg_wait_done(pg_store *s, const char *stored)
{
    const char *v[1] = { stored };
    int64_t end = call_end(s); /* the two statements in one bound */
    PGresult *res;
    int rc;

    if (s->wait_locked && s->conn) {
        s->wait_locked = 0;
        if ((rc = exec_prepared_by(&res, s, ST_WAIT_UNLOCK, v, NULL, NULL,
                                   "end a wait", end)) < 0) {
            pg_drop(s);
            return rc;
        }
        PQclear(res);
    }
    return pg_unlisten(s, end);
}

/* A wait that failed half-way: the connection, if it still works, stops
 * listening and gives the lock back (best effort: the error is the
 * wait's); else it is dropped, which does both. */
static int pg_wait_failed(pg_store *s, const char *stored, int rc)
{
    char msg[LEASE__ERRMSG_SIZE];

    lease__strlcpy(msg, lease_errmsg(), sizeof(msg));
    if (s->conn && PQstatus(s->conn) == CONNECTION_OK && pg_wait_done(s, stored) < 0)
        return lease__seterr(rc, "%s", msg);
    if (s->conn && PQstatus(s->conn) != CONNECTION_OK)
        pg_drop(s);
    return rc;
}

static int pg_wait_release(lease_store *base, const char *key, uint64_t timeout_ms)
{
    pg_store *s = (pg_store *)base;
    int64_t end = lease_clock_ns() + (int64_t)timeout_ms * 1000000;
    char ek[ENC_SIZE];
    const char *stored = pg_enc(ek, key); /* notifications carry this form */
    int64_t setup = call_end(s); /* connect, listen and announce: one bound */
    int rc;

    if ((rc = pg_ensure(s, setup)) < 0)
        return rc;
    if (!s->listening) {
        if ((rc = pg_command(s, "LISTEN " NOTIFY_CHANNEL, "listen", setup)) < 0)
            return rc;
        s->listening = 1;
    }
    /* A failed announce too stops listening, or every release in the
     * database would pile up on a connection that may never wait again. */
    if ((rc = pg_announce(s, stored, timeout_ms, setup)) != 0)
        return rc < 0 ? pg_wait_failed(s, stored, rc) : pg_wait_done(s, stored);
    /* Bounded by `end`: each pass polls at most until then. */
    for (;;) {
        PGnotify *n;
        int64_t left;
        struct pollfd p;

        if (!PQconsumeInput(s->conn))
            return pg_wait_failed(s, stored, pg_fail(s, "wait for release"));
        while ((n = PQnotifies(s->conn)) != NULL) {
            int match = strcmp(n->extra, stored) == 0;
            PQfreemem(n);
            if (match)
                return pg_wait_done(s, stored);
        }
        left = (end - lease_clock_ns()) / 1000000;
        if (left <= 0) {
            if ((rc = pg_wait_done(s, stored)) < 0)
                return rc;
            return LEASE_ETIMEOUT;
        }
        p.fd = PQsocket(s->conn);
        p.events = POLLIN;
        p.revents = 0;
        if (poll(&p, 1, (int)left) < 0 && errno != EINTR)
            return pg_wait_failed(s, stored, pg_fail(s, "wait for release"));
    }
}

/* For lease --version: libpq as linked at run time. PQlibVersion() is
 * major * 10000 + minor since libpq 10. */
int lease__pg_client_version(char *buf, size_t size)
{
    int v = PQlibVersion();

    return snprintf(buf, size, "libpq %d.%d", v / 10000, v % 10000);
}

const lease_backend lease__pg_backend = {
    .version = LEASE_BACKEND_VERSION,
    .name = "postgres",
    .schemes = lease__pg_schemes,
    .features = LEASE_FEATURE_TXN | LEASE_FEATURE_NOTIFY | LEASE_FEATURE_ADVISORY |
                LEASE_FEATURE_RENEW_MANY,
    .store_size = sizeof(pg_store),
    .open3 = pg_open,
    .close = pg_close,
    .acquire = pg_acquire,
    .renew = pg_renew,
    .release = pg_release,
    .inspect = pg_inspect,
    .list = pg_list,
    .fence_advance = pg_fence_advance,
    .fence_mark = pg_fence_mark,
    .guarded_put = pg_guarded_put,
    .data_get = pg_data_get,
    .guarded_txn = pg_guarded_txn,
    .wait_release = pg_wait_release,
    .renew_many = pg_renew_many,
    .advisory_txn = pg_advisory_txn,
    .history = pg_history,
    .history_lost = pg_history_lost,
};
