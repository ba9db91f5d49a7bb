/*
 * test_parse.c - the pure parsers: durations, tokens, store URLs, and the
 * redaction of passwords from URLs.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lease_int.h"

/* The last call (after lease_error_clear) recorded EINVALID and a message:
 * a parser that returns the code without saying why fails here. */
static void assert_einvalid_recorded(void)
{
    assert_int_equal(lease_errcode(), LEASE_EINVALID);
    assert_non_null(lease_errmsg());
    assert_true(lease_errmsg()[0] != '\0');
}

/* ... and the message contains `part` (for instance the rejected text, so
 * that the user sees what was wrong). */
static void assert_einvalid_saying(const char *part)
{
    assert_einvalid_recorded();
    if (strstr(lease_errmsg(), part) == NULL)
        fail_msg("the message '%s' does not contain '%s'", lease_errmsg(), part);
}

/* The call failed with EINVALID and left a message. */
static void assert_einvalid(int rc)
{
    assert_int_equal(rc, LEASE_EINVALID);
    assert_einvalid_recorded();
}

/* ---- lease_parse_duration ------------------------------------------- */

static void duration_ok(const char *text, uint64_t want)
{
    uint64_t ms = 12345;

    lease_error_clear();
    if (lease_parse_duration(&ms, text) != 0)
        fail_msg("duration '%s' rejected: %s", text, lease_errmsg());
    if (ms != want)
        fail_msg("duration '%s': got %llu, want %llu", text,
                 (unsigned long long)ms, (unsigned long long)want);
}

static void duration_bad(const char *text)
{
    uint64_t ms = 777;

    lease_error_clear();
    if (lease_parse_duration(&ms, text) != LEASE_EINVALID)
        fail_msg("duration '%s' accepted (got %llu ms)", text ? text : "(null)",
                 (unsigned long long)ms);
    /* The message quotes what was rejected. */
    if (text != NULL && text[0] != '\0')
        assert_einvalid_saying(text);
    else
        assert_einvalid_recorded();
    /* The output is left alone on failure. */
    assert_int_equal(ms, 777);
}

static void test_duration_valid(void **state)
{
    (void)state;
    duration_ok("250ms", 250);
    duration_ok("30s", 30000);
    duration_ok("5m", 300000);
    duration_ok("2h", 7200000);
    duration_ok("1m30s", 90000);
    duration_ok("0s", 0);
    duration_ok("1h1m1s1ms", 3661001);
    duration_ok("18446744073709551615ms", UINT64_MAX);
}

static void test_duration_invalid(void **state)
{
    static const char *const bad[] = {
        "", "10", "-5s", "+5s", "5 s", " 5s", "5s ", "1.5s", "s", "ms",
        "5x", "5msx", "5S", "5sec",
        "18446744073709551616ms", /* 2^64: does not fit */
        "99999999999999999h",     /* fits as a number, not in ms */
        "18446744073709551615ms1ms", /* the sum overflows */
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        duration_bad(bad[i]);
    duration_bad(NULL);

    lease_error_clear();
    assert_einvalid(lease_parse_duration(NULL, "5s"));
}

/* ---- lease_parse_token ---------------------------------------------- */

static void test_token_valid(void **state)
{
    uint64_t t = 0;

    (void)state;
    assert_int_equal(lease_parse_token(&t, "1"), 0);
    assert_int_equal(t, 1);
    assert_int_equal(lease_parse_token(&t, "42"), 0);
    assert_int_equal(t, 42);
    assert_int_equal(lease_parse_token(&t, "9223372036854775807"), 0);
    assert_true(t == (uint64_t)INT64_MAX);
}

static void test_token_invalid(void **state)
{
    static const char *const bad[] = {
        "0", "-1", "", "12a", " 1", "1 ", "+1", "9223372036854775808",
        "18446744073709551616", "99999999999999999999999", "0x10", "1.0",
    };
    size_t i;
    uint64_t t;

    (void)state;
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        t = 555;
        lease_error_clear();
        if (lease_parse_token(&t, bad[i]) != LEASE_EINVALID)
            fail_msg("token '%s' accepted (got %llu)", bad[i],
                     (unsigned long long)t);
        /* The message quotes what was rejected ('' for the empty one). */
        assert_einvalid_saying(bad[i][0] != '\0' ? bad[i] : "''");
        assert_int_equal(t, 555);
    }
    lease_error_clear();
    assert_einvalid(lease_parse_token(&t, NULL));
    lease_error_clear();
    assert_einvalid(lease_parse_token(NULL, "1"));
}

/* ---- lease__url_parse ----------------------------------------------- */

static void test_url_relative(void **state)
{
    lease__url u;

    (void)state;
    assert_int_equal(lease__url_parse(&u, "sqlite:rel/path.db"), 0);
    assert_string_equal(u.scheme, "sqlite");
    assert_int_equal(u.has_authority, 0);
    assert_null(u.user);
    assert_null(u.password);
    assert_string_equal(u.hosts, "");
    assert_string_equal(u.path, "rel/path.db");
    assert_int_equal(u.nparams, 0);
    assert_null(lease__url_param(&u, "synchronous"));
    lease__url_free(&u);
}

static void test_url_absolute(void **state)
{
    lease__url u;

    (void)state;
    assert_int_equal(lease__url_parse(&u, "sqlite:///abs/p.db"), 0);
    assert_string_equal(u.scheme, "sqlite");
    assert_int_equal(u.has_authority, 1);
    assert_null(u.user);
    assert_null(u.password);
    assert_string_equal(u.hosts, "");
    assert_string_equal(u.path, "/abs/p.db");
    assert_int_equal(u.nparams, 0);
    lease__url_free(&u);

    assert_int_equal(lease__url_parse(&u, "SQLite:///x"), 0);
    assert_string_equal(u.scheme, "sqlite");
    assert_string_equal(u.path, "/x");
    lease__url_free(&u);
}

static void test_url_full(void **state)
{
    lease__url u;

    (void)state;
    assert_int_equal(
        lease__url_parse(&u, "postgres://user:p%40ss@h1:5432,h2:5433/db"
                             "?sslmode=require&table=t"),
        0);
    assert_string_equal(u.scheme, "postgres");
    assert_int_equal(u.has_authority, 1);
    assert_non_null(u.user);
    assert_string_equal(u.user, "user");
    assert_non_null(u.password);
    assert_string_equal(u.password, "p@ss");
    assert_string_equal(u.hosts, "h1:5432,h2:5433");
    assert_string_equal(u.path, "/db");
    assert_int_equal(u.nparams, 2);
    assert_non_null(lease__url_param(&u, "sslmode"));
    assert_string_equal(lease__url_param(&u, "sslmode"), "require");
    assert_non_null(lease__url_param(&u, "table"));
    assert_string_equal(lease__url_param(&u, "table"), "t");
    assert_null(lease__url_param(&u, "missing"));
    lease__url_free(&u);

    /* A user without a password. */
    assert_int_equal(lease__url_parse(&u, "redis://bob@h:6379/0"), 0);
    assert_string_equal(u.user, "bob");
    assert_null(u.password);
    assert_string_equal(u.hosts, "h:6379");
    assert_string_equal(u.path, "/0");
    lease__url_free(&u);
}

static void test_url_decoding(void **state)
{
    lease__url u;

    (void)state;
    assert_int_equal(lease__url_parse(&u, "sqlite:///tmp/a%20b%2Fc%41.db"), 0);
    assert_string_equal(u.path, "/tmp/a b/cA.db");
    lease__url_free(&u);

    /* Lower-case hex digits too. */
    assert_int_equal(lease__url_parse(&u, "sqlite:x%2fy%3a.db"), 0);
    assert_string_equal(u.path, "x/y:.db");
    lease__url_free(&u);

    /* Query values: %XX and '+' as a space. */
    assert_int_equal(lease__url_parse(&u, "sqlite:///x?a=b%26c&d=e+f&flag"), 0);
    assert_string_equal(lease__url_param(&u, "a"), "b&c");
    assert_string_equal(lease__url_param(&u, "d"), "e f");
    assert_non_null(lease__url_param(&u, "flag"));
    assert_string_equal(lease__url_param(&u, "flag"), "");
    lease__url_free(&u);
}

static void test_url_bad_escapes(void **state)
{
    static const char *const bad[] = {
        "sqlite:///tmp/%zz.db",
        "sqlite:///tmp/x%4",
        "sqlite:///tmp/x%",
        "sqlite:///tmp/a%00b.db",
        "sqlite:x%g1",
        "postgres://u:p%zz@h/db",
        "postgres://u%0@h/db",
        "postgres://u:p%00@h/db",
        "sqlite:///x?a=%zz",
        "sqlite:///x?a%4=1",
        "sqlite:///x?a=%00",
    };
    size_t i;
    lease__url u;
    const char *at;
    char userinfo[32];

    (void)state;
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        lease_error_clear();
        if (lease__url_parse(&u, bad[i]) != LEASE_EINVALID)
            fail_msg("URL '%s' accepted", bad[i]);
        /* Refused with a message about the URL ("bad escape in the store
         * URL's path", "bad parameter in the store URL"), and without
         * echoing the URL: its user info may be a password. */
        assert_einvalid_saying(" in the store URL");
        if (strstr(lease_errmsg(), bad[i]) != NULL)
            fail_msg("the message for '%s' repeats the URL: %s", bad[i],
                     lease_errmsg());
        if ((at = strchr(bad[i], '@')) != NULL) {
            const char *info = strstr(bad[i], "://") + 3;

            snprintf(userinfo, sizeof(userinfo), "%.*s", (int)(at - info), info);
            if (strstr(lease_errmsg(), userinfo) != NULL)
                fail_msg("the message for '%s' repeats its user info: %s",
                         bad[i], lease_errmsg());
        }
        /* Nothing is left allocated for the caller to free. */
        assert_null(u.scheme);
        assert_null(u.path);
        assert_null(u.params);
    }
}

static void test_url_no_scheme(void **state)
{
    static const char *const bad[] = {
        "/tmp/x.db", "1abc:x", "", "sqlite", "sq lite:x", ":x",
        "x.db?a=b:c",
    };
    size_t i;
    lease__url u;
    char buf[32];

    (void)state;
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        lease_error_clear();
        if (lease__url_parse(&u, bad[i]) != LEASE_EINVALID)
            fail_msg("URL '%s' accepted", bad[i]);
        /* Refused for the missing scheme, not for something else. */
        assert_einvalid_saying("must start with a scheme");
        assert_int_equal(lease__url_scheme(buf, sizeof(buf), bad[i]),
                         LEASE_EINVALID);
    }
    lease_error_clear();
    assert_einvalid(lease__url_parse(&u, NULL));
}

static void test_url_scheme(void **state)
{
    char buf[8];

    (void)state;
    assert_int_equal(lease__url_scheme(buf, sizeof(buf), "SQLite:///x"), 0);
    assert_string_equal(buf, "sqlite");
    assert_int_equal(lease__url_scheme(buf, sizeof(buf), "a+b-c.d:x"), 0);
    assert_string_equal(buf, "a+b-c.d");
    /* Does not fit in the buffer (7 characters + NUL fit, 8 do not). */
    assert_int_equal(lease__url_scheme(buf, sizeof(buf), "abcdefg:x"), 0);
    assert_string_equal(buf, "abcdefg");
    assert_int_equal(lease__url_scheme(buf, sizeof(buf), "abcdefgh:x"),
                     LEASE_EINVALID);
}

static void test_url_duplicate_param(void **state)
{
    lease__url u;

    (void)state;
    assert_int_equal(
        lease__url_parse(&u, "sqlite:///x?synchronous=full&a=1&synchronous=normal"),
        0);
    assert_int_equal(u.nparams, 3);
    assert_string_equal(lease__url_param(&u, "synchronous"), "normal");
    assert_string_equal(lease__url_param(&u, "a"), "1");
    lease__url_free(&u);

    /* Empty pieces between '&' are skipped. */
    assert_int_equal(lease__url_parse(&u, "sqlite:///x?&&a=1&&"), 0);
    assert_int_equal(u.nparams, 1);
    assert_string_equal(lease__url_param(&u, "a"), "1");
    lease__url_free(&u);

    /* Freeing twice (the struct is zeroed) is harmless. */
    lease__url_free(&u);
    lease__url_free(NULL);
}

/* ---- lease__url_redact ---------------------------------------------- */

static void redact_is(const char *in, const char *want)
{
    char *out = lease__url_redact(in);

    assert_non_null(out);
    if (strcmp(out, want) != 0)
        fail_msg("redact('%s') = '%s', want '%s'", in, out, want);
    free(out);
}

static void test_redact(void **state)
{
    (void)state;
    redact_is("redis://u:secret@h:1/0", "redis://u:***@h:1/0");
    /* A password holding '@' (escaped or not). */
    redact_is("redis://u:p%40ss@h:1/0", "redis://u:***@h:1/0");
    redact_is("redis://u:se@cret@h:1/0", "redis://u:***@h:1/0");
    /* A password holding ':'. */
    redact_is("redis://u:se:cret@h:1/0", "redis://u:***@h:1/0");
    /* No user name, only a password. */
    redact_is("redis://:secret@h:1/0", "redis://:***@h:1/0");
    /* As a query parameter, whatever the case of its name. */
    redact_is("postgres://h/db?password=secret", "postgres://h/db?password=***");
    redact_is("postgres://h/db?sslmode=require&PassWord=secret&x=1",
              "postgres://h/db?sslmode=require&PassWord=***&x=1");
    redact_is("postgres://u:secret@h/db?password=secret",
              "postgres://u:***@h/db?password=***");
    /* Other parameters whose names merely contain "password" are kept. */
    redact_is("postgres://h/db?password_file=/x", "postgres://h/db?password_file=/x");
    /* Nothing to hide: unchanged. */
    redact_is("sqlite:///var/lib/a.db", "sqlite:///var/lib/a.db");
    redact_is("sqlite:rel/a.db?synchronous=full", "sqlite:rel/a.db?synchronous=full");
    redact_is("redis://bob@h:1/0", "redis://bob@h:1/0");
    redact_is("postgres://h1:5432,h2:5433/db", "postgres://h1:5432,h2:5433/db");
    redact_is("", "");
    redact_is(NULL, "");
}

static void test_redact_never_leaks(void **state)
{
    static const char *const urls[] = {
        "redis://u:secret@h:1/0",
        "redis://:secret@h",
        "redis://u:secret@h",
        "redis://u:secret@",
        "redis://u:s%65cret@h:1/0",
        "redis://u:xsecretx@h1:1,h2:2/0?db=1",
        "redis://u:p@secret@h:1/0",
        "redis://u:secret@secret@h:1/0",
        "redis://u:secret:secret@h:1/0",
        "postgres://h/db?password=secret",
        "postgres://h/db?PASSWORD=secret",
        "postgres://h/db?a=1&password=secret",
        "postgres://h/db?password=secret&password=secret",
        "postgres://h/db?a=1&&password=secret&",
        "postgres://u:secret@h/db?password=secret",
        "postgres://u:secret@h?password=secret",
        "sqlite:x.db?password=secret",
        "sqlite:///x.db?password=secret",
        "etcd://root:secret@[::1]:2379,[::2]:2379/",
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(urls) / sizeof(urls[0]); i++) {
        char *out = lease__url_redact(urls[i]);

        assert_non_null(out);
        if (strstr(out, "secret") != NULL)
            fail_msg("redact('%s') = '%s' still shows the password", urls[i], out);
        assert_non_null(strstr(out, "***"));
        free(out);
    }
}

/*
 * Whatever the parser reads as a password (user info, or a "password"
 * query parameter once decoded) must not survive redaction. Known to fail
 * today for two URLs: see the comments.
 */
static void test_redact_agrees_with_parser(void **state)
{
    static const char *const urls[] = {
        "redis://u:secret@h:1/0",
        "postgres://h/db?password=secret",
        "postgres://u:secret@h/db?a=b&password=secret",
        /* "://" inside the query of a URL without authority: the redactor
         * takes it for the authority and leaves the real parameter. */
        "sqlite:x.db?next=a://u:p@h&password=secret",
        /* The parser decodes parameter names: this one is "password". */
        "postgres://h/db?pass%77ord=secret",
    };
    size_t i;
    int bugs = 0;

    (void)state;
    for (i = 0; i < sizeof(urls) / sizeof(urls[0]); i++) {
        lease__url u;
        const char *pw;
        char *out;

        assert_int_equal(lease__url_parse(&u, urls[i]), 0);
        out = lease__url_redact(urls[i]);
        assert_non_null(out);
        if (u.password && strstr(out, u.password) != NULL) {
            print_error("redact('%s') = '%s' shows the user-info password\n",
                        urls[i], out);
            bugs++;
        }
        pw = lease__url_param(&u, "password");
        if (pw && *pw && strstr(out, pw) != NULL) {
            print_error("redact('%s') = '%s' shows the password parameter\n",
                        urls[i], out);
            bugs++;
        }
        free(out);
        lease__url_free(&u);
    }
    if (bugs)
        fail_msg("%d password(s) survived redaction", bugs);
}

/* ---- internals: checks and the local deadline ------------------------ */

static void test_check_name(void **state)
{
    char big[LEASE_KEY_MAX + 2];

    (void)state;
    assert_int_equal(lease__check_name("key", "a"), 0);
    memset(big, 'k', sizeof(big));
    big[LEASE_KEY_MAX] = '\0';
    assert_int_equal(lease__check_name("key", big), 0);
    big[LEASE_KEY_MAX] = 'k';
    big[LEASE_KEY_MAX + 1] = '\0';
    lease_error_clear();
    assert_einvalid(lease__check_name("key", big));
    lease_error_clear();
    assert_einvalid(lease__check_name("key", ""));
    assert_non_null(strstr(lease_errmsg(), "key"));
    lease_error_clear();
    assert_einvalid(lease__check_name("resource", NULL));
    assert_non_null(strstr(lease_errmsg(), "resource"));
}

static void test_check_ttl(void **state)
{
    (void)state;
    assert_int_equal(lease__check_ttl(NULL, 1), 0);
    assert_int_equal(lease__check_ttl(NULL, LEASE_TTL_MAX_DEFAULT_MS), 0);
    lease_error_clear();
    assert_einvalid(lease__check_ttl(NULL, 0));
    lease_error_clear();
    assert_einvalid(lease__check_ttl(NULL, LEASE_TTL_MAX_DEFAULT_MS + 1));
    lease_error_clear();
    assert_einvalid(lease__check_ttl(NULL, UINT64_MAX));
}

static void test_canonical_owner(void **state)
{
    char out[LEASE_OWNER_BUFSZ];

    (void)state;
    assert_int_equal(
        lease__canonical_owner(out, "6F1C2D3E-4A5B-4C6D-8E9F-0A1B2C3D4E5F"), 0);
    assert_string_equal(out, "6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f");
    lease_error_clear();
    assert_einvalid(lease__canonical_owner(out, "xyz"));
    lease_error_clear();
    assert_einvalid(lease__canonical_owner(out, NULL));
    lease_error_clear();
    assert_einvalid(
        lease__canonical_owner(out, "6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f0"));
}

static void test_deadline(void **state)
{
    int64_t sent = lease_clock_ns();
    int64_t d = lease__deadline_ns(sent, 1000);

    (void)state;
    assert_true(d < sent + 1000 * 1000000LL);
    assert_true(d > sent);
    /* The margin is small: well over half the ttl is left. */
    assert_true(d > sent + 500 * 1000000LL);
    /* At the cap, no overflow. */
    d = lease__deadline_ns(sent, LEASE_TTL_MAX_DEFAULT_MS);
    assert_true(d > sent);
    assert_true(d < sent + (int64_t)LEASE_TTL_MAX_DEFAULT_MS * 1000000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duration_valid),
        cmocka_unit_test(test_duration_invalid),
        cmocka_unit_test(test_token_valid),
        cmocka_unit_test(test_token_invalid),
        cmocka_unit_test(test_url_relative),
        cmocka_unit_test(test_url_absolute),
        cmocka_unit_test(test_url_full),
        cmocka_unit_test(test_url_decoding),
        cmocka_unit_test(test_url_bad_escapes),
        cmocka_unit_test(test_url_no_scheme),
        cmocka_unit_test(test_url_scheme),
        cmocka_unit_test(test_url_duplicate_param),
        cmocka_unit_test(test_redact),
        cmocka_unit_test(test_redact_never_leaks),
        cmocka_unit_test(test_redact_agrees_with_parser),
        cmocka_unit_test(test_check_name),
        cmocka_unit_test(test_check_ttl),
        cmocka_unit_test(test_canonical_owner),
        cmocka_unit_test(test_deadline),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
