/*
 * redis_durability.c - the Redis store's durability warning, seen through
 * the public log sink (lease_log_set).
 *
 * Tokens survive a restart only when the server persists every write before
 * answering (appendonly yes, appendfsync always). On open, the store asks
 * the server and logs ONE line with "event":"durability" per process when
 * it is not so, however many handles are opened; against a durable server
 * it logs nothing of the kind.
 *
 * usage: redis_durability DURABLE_URL NO_AOF_URL EVERYSEC_URL
 *   DURABLE_URL   appendonly yes, appendfsync always
 *   NO_AOF_URL    appendonly no (this one may carry a password: the line
 *                 must not show it)
 *   EVERYSEC_URL  appendonly yes, appendfsync everysec
 * redis_durability.sh starts the three servers and passes their URLs.
 *
 * Each case runs in a forked child (the warning is once per process), which
 * reports every log line it received and the results of its calls; the
 * parent asserts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <jansson.h>

#include "lease.h"
#include "redis_child.h"

static const char *url_durable, *url_noaof, *url_everysec;

/* ---- the child's side ------------------------------------------------- */

static void sink(lease_log_level level, const char *line, void *payload)
{
    (void)payload;
    child_say("LOG %d %s", (int)level, line);
}

/* Open n handles at once, then n more one after the other, and use one of
 * them: each open connects and may check the server's settings. */
static void open_many(const char *url, int n)
{
    lease_store *s[8] = { 0 };
    char owner[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    lease_grant g;
    int i, rc;

    if (n > 8)
        n = 8;
    for (i = 0; i < n; i++) {
        rc = lease_store_open(&s[i], url);
        child_say("OPEN %d %s", rc, rc < 0 ? lease_errmsg() : "");
    }
    lease_owner_new(owner);
    o.owner = owner;
    o.ttl_ms = 5000;
    if (s[0]) {
        char key[96];
        snprintf(key, sizeof(key), "durability/%s", owner);
        rc = lease_acquire(&g, NULL, s[0], key, &o);
        child_say("ACQUIRE %d %s", rc, rc < 0 ? lease_errmsg() : "");
        if (rc == 0) {
            rc = lease_release(s[0], &g);
            child_say("RELEASE %d %s", rc, rc < 0 ? lease_errmsg() : "");
        }
    }
    for (i = 0; i < n; i++)
        lease_store_close(s[i]);
    for (i = 0; i < n; i++) {
        lease_store *t = NULL;
        rc = lease_store_open(&t, url);
        child_say("OPEN %d %s", rc, rc < 0 ? lease_errmsg() : "");
        lease_store_close(t);
    }
}

static void child_durable(void *arg)
{
    (void)arg;
    lease_log_set(sink, NULL, LEASE_LOG_DEBUG);
    open_many(url_durable, 4);
}

static void child_noaof(void *arg)
{
    (void)arg;
    lease_log_set(sink, NULL, LEASE_LOG_DEBUG);
    open_many(url_noaof, 4);
}

static void child_everysec(void *arg)
{
    (void)arg;
    lease_log_set(sink, NULL, LEASE_LOG_DEBUG);
    open_many(url_everysec, 3);
}

/* A durable server first (no line, and no "already warned" state left
 * behind), then a non-durable one: its line must still come, once. */
static void child_durable_then_noaof(void *arg)
{
    (void)arg;
    lease_log_set(sink, NULL, LEASE_LOG_DEBUG);
    open_many(url_durable, 2);
    child_say("MARK durable-done");
    open_many(url_noaof, 2);
}

/* ---- the parent's side ------------------------------------------------ */

/* What a case holds, freed by the teardown even when an assertion failed. */
static char *report_of_case;
static json_t *lines_of_case[8];
static int nlines_of_case;

static int free_case(void **state)
{
    (void)state;
    free(report_of_case);
    report_of_case = NULL;
    while (nlines_of_case > 0)
        json_decref(lines_of_case[--nlines_of_case]);
    return 0;
}

/* The "LOG" lines of a report that carry "event":"durability", parsed. */
typedef struct {
    int count;
    json_t *first;   /* the first such line, parsed (or NULL) */
    int first_level; /* its lease_log_level */
    int bad_json;    /* LOG lines that are not one JSON object */
} dur_lines;

static dur_lines scan(const char *report, const char *stop_at)
{
    dur_lines d = { 0, NULL, -1, 0 };
    const char *p = report;

    while (p && *p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char *line = strndup(p, len);

        if (stop_at && strcmp(line, stop_at) == 0) {
            free(line);
            break;
        }
        if (strncmp(line, "LOG ", 4) == 0) {
            int level = atoi(line + 4);
            const char *js = strchr(line + 4, ' ');
            json_error_t err;
            json_t *o = js ? json_loads(js + 1, 0, &err) : NULL;

            if (o == NULL || !json_is_object(o)) {
                d.bad_json++;
            } else {
                const char *ev = json_string_value(json_object_get(o, "event"));
                if (ev && strcmp(ev, "durability") == 0) {
                    if (d.count++ == 0) {
                        d.first_level = level;
                        if (nlines_of_case < 8) { /* kept until the teardown */
                            lines_of_case[nlines_of_case++] = json_incref(o);
                            d.first = o;
                        }
                    }
                }
            }
            json_decref(o);
        }
        free(line);
        p = nl ? nl + 1 : NULL;
    }
    return d;
}

/* Every call of the child succeeded. */
static void check_calls(const char *report)
{
    const char *p = report;

    while (p && *p) {
        if (strncmp(p, "OPEN ", 5) == 0 || strncmp(p, "ACQUIRE ", 8) == 0 ||
            strncmp(p, "RELEASE ", 8) == 0) {
            const char *num = strchr(p, ' ') + 1;
            if (atoi(num) != 0) {
                const char *nl = strchr(p, '\n');
                fail_msg("a call in the child failed: %.*s",
                         (int)(nl ? nl - p : (ptrdiff_t)strlen(p)), p);
            }
        }
        p = strchr(p, '\n');
        if (p)
            p++;
    }
}

static char *run(void (*fn)(void *))
{
    int status;
    char *report = run_child(fn, NULL, 30000, &status);

    assert_non_null(report);
    report_of_case = report;
    if (status != 0)
        fail_msg("the child ended with status %d; it said:\n%s", status, report);
    check_calls(report);
    print_message("child report:\n%s", report);
    return report;
}

static void check_line(const dur_lines *d, const char *needle)
{
    const char *msg;

    assert_non_null(d->first);
    assert_int_equal(d->first_level, LEASE_LOG_WARN);
    assert_string_equal(json_string_value(json_object_get(d->first, "level")), "warn");
    assert_string_equal(json_string_value(json_object_get(d->first, "store")), "redis");
    msg = json_string_value(json_object_get(d->first, "message"));
    assert_non_null(msg);
    if (strstr(msg, needle) == NULL)
        fail_msg("the durability message should mention '%s': %s", needle, msg);
}

static void no_password(const char *report, const char *url)
{
    /* redis://[user:]password@host... : find the password, if any. */
    const char *at = strrchr(url, '@'), *colon, *start = strstr(url, "://");
    char pw[256];

    if (at == NULL || start == NULL)
        return;
    start += 3;
    colon = memchr(start, ':', (size_t)(at - start));
    if (colon == NULL || (size_t)(at - colon - 1) >= sizeof(pw) || at == colon + 1)
        return;
    memcpy(pw, colon + 1, (size_t)(at - colon - 1));
    pw[at - colon - 1] = '\0';
    if (strstr(report, pw))
        fail_msg("the password of the store URL appears in what the library logged or said");
}

static void test_durable_server_no_warning(void **state)
{
    char *report = run(child_durable);
    dur_lines d = scan(report, NULL);

    (void)state;
    assert_int_equal(d.bad_json, 0);
    if (d.count != 0)
        fail_msg("a durable server (appendonly yes, appendfsync always) got %d "
                 "durability line(s)", d.count);
}

static void test_no_aof_warns_once(void **state)
{
    char *report = run(child_noaof);
    dur_lines d = scan(report, NULL);

    (void)state;
    assert_int_equal(d.bad_json, 0);
    if (d.count != 1)
        fail_msg("appendonly no, 8 handles opened: expected exactly 1 durability "
                 "line, got %d", d.count);
    check_line(&d, "appendonly no");
    no_password(report, url_noaof);
}

static void test_everysec_warns_once(void **state)
{
    char *report = run(child_everysec);
    dur_lines d = scan(report, NULL);

    (void)state;
    assert_int_equal(d.bad_json, 0);
    if (d.count != 1)
        fail_msg("appendfsync everysec, 6 handles opened: expected exactly 1 "
                 "durability line, got %d", d.count);
    check_line(&d, "appendfsync");
}

static void test_durable_then_noaof(void **state)
{
    char *report = run(child_durable_then_noaof);
    dur_lines before = scan(report, "MARK durable-done");
    dur_lines all = scan(report, NULL);

    (void)state;
    assert_non_null(strstr(report, "MARK durable-done"));
    assert_int_equal(before.count, 0);
    if (all.count != 1)
        fail_msg("a durable server, then a non-durable one in the same process: "
                 "expected exactly 1 durability line, got %d", all.count);
    check_line(&all, "appendonly no");
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_durable_server_no_warning, free_case),
        cmocka_unit_test_teardown(test_no_aof_warns_once, free_case),
        cmocka_unit_test_teardown(test_everysec_warns_once, free_case),
        cmocka_unit_test_teardown(test_durable_then_noaof, free_case),
    };

    if (argc != 4) {
        fprintf(stderr, "usage: %s DURABLE_URL NO_AOF_URL EVERYSEC_URL\n", argv[0]);
        return 1;
    }
    url_durable = argv[1];
    url_noaof = argv[2];
    url_everysec = argv[3];
    return cmocka_run_group_tests(tests, NULL, NULL);
}
