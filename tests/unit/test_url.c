/*
 * test_url.c - the store URL parser and redactor, and the registry of
 * secrets that every message is scrubbed against (issue 10, items 1, 2).
 *
 * The property: whatever a password holds ('?', '/', '@', '#', '%', ...),
 * it never appears in the redacted URL, nor in a message that quotes the
 * URL while a store of that URL is open.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "lease_int.h"

/* The URLs of the issue, and more: every one carries SECRET somewhere. */
static const char *const leaky[] = {
    "postgres://u:SECRETpw@[::1]x/db",
    "postgres://u:SECRETpw@[::1:5432/db",
    "postgres://u:SEC?RETpw@h/db",
    "postgres://u:SEC/RETpw@h/db",
    "postgres://u:SEC#RETpw@h/db",
    "postgres://u:SEC@RETpw@h/db",
    "postgresql://u:SECRETpw@h1:1,h2:2/db?sslmode=disable",
    "postgres://u@h/db?password=SECRETpw",
    "postgres://u@h/db?sslpassword=SECRETpw&x=1",
    "postgres://u@h/db?x=1&SSLPassWord=SECRETpw",
    "postgres://u@h/db?pass%77ord=SECRETpw",
    "postgres://u@h/db?client_secret=SECRETpw",
    "postgres://u@h/db?api_token=SECRETpw",
    "postgres://u@h/db?password%zz=SECRETpw",
    "postgres://u:%53ECRETpw@h/db",
    "postgres:u:SECRETpw@h/db",
    "postgres://u:SECRETpw@h/db?application_name=a@b",
    "postgres://h:1/db?x=a&password=SECRETpw&y=b@c",
    "redis://:SECRETpw@127.0.0.1:1/0",
    "rediss://user:SECRETpw@127.0.0.1:1/0?prefix=x",
    "redis://user:SEC%3FRETpw@127.0.0.1:1",
    "etcd://u:SECRETpw@127.0.0.1:1/p",
    "etcds://127.0.0.1:1/p?password=SECRETpw",
    "u:SECRETpw@h",
    "POSTGRES://u:SECRETpw@h/db",
};

static void assert_hidden(const char *text, const char *secret)
{
    if (strstr(text, secret) != NULL)
        fail_msg("'%s' shows '%s'", text, secret);
}

static void test_redact_issue_urls(void **state)
{
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(leaky) / sizeof(leaky[0]); i++) {
        char *r = lease__url_redact(leaky[i]);

        assert_non_null(r);
        assert_hidden(r, "SECRET");
        assert_hidden(r, "RETpw");
        free(r);
    }
}

static void test_redact_keeps_the_rest(void **state)
{
    static const char *const cases[][2] = {
        { "postgres://u:pw@h:5432/db?sslmode=require&password=x",
          "postgres://u:***@h:5432/db?sslmode=require&password=***" },
        { "postgres://u:SEC?RET@h/db", "postgres://u:***@h/db" },
        { "postgres://u:SEC/RET@h/db", "postgres://u:***@h/db" },
        { "redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0" },
        { "redis://user@127.0.0.1:6379/0", "redis://user@127.0.0.1:6379/0" },
        { "sqlite:///home/a@b/x.db", "sqlite:///home/a@b/x.db" },
        { "postgres://h/db?sslpassword=a&lease_table=t",
          "postgres://h/db?sslpassword=***&lease_table=t" },
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *r = lease__url_redact(cases[i][0]);
        assert_string_equal(r, cases[i][1]);
        free(r);
    }
}

/* The parser: one '@', before any '/' or '?'; else EINVALID, quietly. */
static void test_parse_userinfo(void **state)
{
    static const char *const refused[] = {
        "postgres://u:SEC?RETpw@h/db", "postgres://u:SEC/RETpw@h/db",
        "postgres://u:SEC@RETpw@h/db", "redis://h:1/0?x=SECRETpw@b",
    };
    lease__url u;
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        assert_int_equal(lease__url_parse(&u, refused[i]), LEASE_EINVALID);
        assert_hidden(lease_errmsg(), "SEC");
        assert_hidden(lease_errmsg(), "RETpw");
    }
    assert_int_equal(lease__url_parse(&u, "postgres://u:SEC#RET@h:5/db?a=b"), 0);
    assert_string_equal(u.user, "u");
    assert_string_equal(u.password, "SEC#RET");
    assert_string_equal(u.hosts, "h:5");
    assert_string_equal(u.path, "/db");
    lease__url_free(&u);
    assert_int_equal(lease__url_parse(&u, "redis://u:p%40s%2Fs%3F@h/0"), 0);
    assert_string_equal(u.password, "p@s/s?");
    assert_string_equal(u.hosts, "h");
    lease__url_free(&u);
    /* No authority: an '@' in a path (a home directory) is only a byte. */
    assert_int_equal(lease__url_parse(&u, "sqlite:///home/a@b/x.db"), 0);
    assert_string_equal(u.path, "/home/a@b/x.db");
    assert_null(u.password);
    lease__url_free(&u);
}

static void test_secret_params(void **state)
{
    (void)state;
    assert_true(lease__url_secret_param("password"));
    assert_true(lease__url_secret_param("sslpassword"));
    assert_true(lease__url_secret_param("PASSWORD"));
    assert_true(lease__url_secret_param("client_secret"));
    assert_true(lease__url_secret_param("token"));
    assert_false(lease__url_secret_param("sslmode"));
    assert_false(lease__url_secret_param("lease_table"));
    /* A file that holds a password is named in messages about it. */
    assert_false(lease__url_secret_param("password_file"));
    /* tokens=clock|counter holds "token" but no secret: were it one,
     * "clock" would be scrubbed from every message. */
    assert_false(lease__url_secret_param("tokens"));
    assert_true(lease__url_secret_param("tokens_x"));
}

/* ?tokens=: clock by default, counter on request, nothing else. */
static void test_tokens_param(void **state)
{
    static const struct { const char *url; int rc, mode; } cases[] = {
        { "redis://h:1", 0, LEASE__TOKENS_CLOCK },
        { "redis://h:1?tokens=clock", 0, LEASE__TOKENS_CLOCK },
        { "redis://h:1?tokens=counter", 0, LEASE__TOKENS_COUNTER },
        { "redis://h:1?tokens=counter&tokens=clock", 0, LEASE__TOKENS_CLOCK },
        { "redis://h:1?tokens=", LEASE_EINVALID, 0 },
        { "redis://h:1?tokens=Clock", LEASE_EINVALID, 0 },
        { "redis://h:1?tokens=ms", LEASE_EINVALID, 0 },
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        lease__url u;
        int mode = -1;

        assert_int_equal(lease__url_parse(&u, cases[i].url), 0);
        assert_int_equal(lease__url_tokens(&mode, &u), cases[i].rc);
        if (cases[i].rc == 0)
            assert_int_equal(mode, cases[i].mode);
        else
            assert_non_null(strstr(lease_errmsg(), "tokens=clock"));
        lease__url_free(&u);
    }
}

/* A password a store read from a file, not from the URL. */
static void test_scrub_file_secret(void **state)
{
    (void)state;
    assert_int_equal(lease__secret_hold("from-a-file"), 0);
    lease_store_seterr(LEASE_ESTORE, "AUTH from-a-file refused");
    assert_string_equal(lease_errmsg(), "AUTH *** refused");
    lease__secret_release("from-a-file");
    lease_store_seterr(LEASE_ESTORE, "AUTH from-a-file refused");
    assert_string_equal(lease_errmsg(), "AUTH from-a-file refused");
}

/* Messages: libpq and friends quote what they cannot read. */
static void test_scrub_messages(void **state)
{
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(leaky) / sizeof(leaky[0]); i++) {
        assert_int_equal(lease__secrets_hold(leaky[i]), 0);
        lease_store_seterr(LEASE_ESTORE, "invalid URI: \"%s\"", leaky[i]);
        assert_hidden(lease_errmsg(), "SECRET");
        assert_hidden(lease_errmsg(), "RETpw");
        lease__secrets_release(leaky[i]);
        /* Released: the registry forgets it. */
        lease_store_seterr(LEASE_ESTORE, "x SECRETpw y");
        assert_string_equal(lease_errmsg(), "x SECRETpw y");
    }
}

static void test_scrub_refcount_and_forms(void **state)
{
    const char *url = "redis://:pa%22ss%5Cw0rd%C3%A9@h:1/0";
    char buf[256];

    (void)state;
    assert_int_equal(lease__secrets_hold(url), 0);
    assert_int_equal(lease__secrets_hold(url), 0);
    lease__secrets_release(url);
    /* Still held once: decoded, as written, and as JSON shows it. */
    strcpy(buf, "a pa\"ss\\w0rd\xc3\xa9 b pa%22ss%5Cw0rd%C3%A9 c "
                "pa\\\"ss\\\\w0rd\\u00E9 d");
    lease__scrub(buf);
    assert_string_equal(buf, "a *** b *** c *** d");
    lease__secrets_release(url);
    strcpy(buf, "pa%22ss");
    lease__scrub(buf);
    assert_string_equal(buf, "pa%22ss");
}

/* A short password is scrubbed where it stands alone, not inside words. */
static void test_scrub_short(void **state)
{
    const char *url = "postgres://u:ab@h/db";
    char buf[128];

    (void)state;
    assert_int_equal(lease__secrets_hold(url), 0);
    strcpy(buf, "table ab postgres://u:ab@h/db; about: ab");
    lease__scrub(buf);
    assert_string_equal(buf, "table ** postgres://u:**@h/db; about: **");
    lease__secrets_release(url);
}

/* A message cut to size must not end in the first bytes of a secret. */
static void test_scrub_cut(void **state)
{
    const char *url = "redis://:LONGSECRETVALUE@h:1";
    char pad[LEASE__ERRMSG_SIZE];

    (void)state;
    memset(pad, 'x', sizeof(pad));
    pad[LEASE__ERRMSG_SIZE - 5] = '\0'; /* 4 bytes of the secret would fit */
    assert_int_equal(lease__secrets_hold(url), 0);
    lease_store_seterr(LEASE_ESTORE, "%sLONGSECRETVALUE", pad);
    assert_hidden(lease_errmsg(), "LONG");
    lease__secrets_release(url);
}

/* A message longer than any fixed buffer (libpq quotes a URL of any
 * length) is scrubbed whole before it is cut: no piece of a long password
 * survives the cut. */
static void test_scrub_long_password(void **state)
{
    size_t n = 6000;
    char *pw = malloc(n + 1), *url = malloc(n + 64);

    (void)state;
    assert_non_null(pw);
    assert_non_null(url);
    memset(pw, 'Q', n);
    pw[n] = '\0';
    snprintf(url, n + 64, "postgres://u:%s@[::1]x/db", pw);
    assert_int_equal(lease__secrets_hold(url), 0);
    lease_store_seterr(LEASE_ESTORE, "invalid URI: \"%s\"", url);
    assert_hidden(lease_errmsg(), "QQQQ");
    lease__secrets_release(url);
    free(pw);
    free(url);
}

/* ?password_file= must be a regular file, only its owner's, and yours. */
static void test_password_file_rules(void **state)
{
    char path[] = "/tmp/lease-pwfile-XXXXXX";
    char *pw = NULL;
    int fd;

    (void)state;
    assert_true((fd = mkstemp(path)) >= 0);
    assert_int_equal(write(fd, "pw-from-file\n", 13), 13);
    close(fd);
    assert_int_equal(chmod(path, 0600), 0);
    assert_int_equal(lease__read_password_file(&pw, "redis", path), 0);
    assert_string_equal(pw, "pw-from-file");
    lease_store_seterr(LEASE_ESTORE, "server said: pw-from-file");
    assert_hidden(lease_errmsg(), "pw-from-file");
    lease__secret_release(pw);
    /* Given once already (the URL's own password): refused. */
    assert_int_equal(lease__read_password_file(&pw, "redis", path), LEASE_EINVALID);
    free(pw);
    pw = NULL;
    assert_int_equal(chmod(path, 0640), 0);
    assert_int_equal(lease__read_password_file(&pw, "redis", path), LEASE_EINVALID);
    assert_null(pw);
    assert_int_equal(chmod(path, 0600), 0);
    if (geteuid() == 0) { /* someone else's file: only root can make one */
        assert_int_equal(chown(path, 65534, 65534), 0);
        assert_int_equal(lease__read_password_file(&pw, "redis", path), LEASE_EINVALID);
        assert_non_null(strstr(lease_errmsg(), "must be yours"));
        assert_null(pw);
    }
    unlink(path);
}

/* Random passwords of awkward bytes, in every place a URL takes one. */
static void test_property_random_passwords(void **state)
{
    static const char alphabet[] = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
                                   "/?#@:%&=+;[] \"\\!$'()*,";
    static const char *const templates[] = {
        "postgres://user:%s@127.0.0.1:1/db",
        "postgresql://user:%s@[::1]x/db",
        "postgres://user:%s@[::1:5432/db",
        "redis://:%s@127.0.0.1:1/0",
        "rediss://u:%s@127.0.0.1:1/0?prefix=x",
        "etcds://u:%s@127.0.0.1:1,127.0.0.1:2/p",
        "postgres://user@127.0.0.1:1/db?password=%s",
        "postgres://user@127.0.0.1:1/db?x=1&sslpassword=%s",
    };
    unsigned seed = 12345;
    int round;

    (void)state;
    for (round = 0; round < 2000; round++) {
        char pw[24], url[256], *red;
        size_t t = (size_t)round % (sizeof(templates) / sizeof(templates[0]));
        int n = 6 + (int)(rand_r(&seed) % 12), i;
        int in_query = strstr(templates[t], "=%s") != NULL;

        for (i = 0; i < n; i++) {
            pw[i] = alphabet[rand_r(&seed) % (sizeof(alphabet) - 1)];
            /* In a query the value ends at '&': what follows is not it. */
            if (in_query && pw[i] == '&')
                pw[i] = 'Q';
        }
        pw[n] = '\0';
        snprintf(url, sizeof(url), templates[t], pw);
        red = lease__url_redact(url);
        assert_non_null(red);
        if (strstr(red, pw) != NULL)
            fail_msg("redacted '%s' shows the password of '%s'", red, url);
        free(red);
        assert_int_equal(lease__secrets_hold(url), 0);
        lease_store_seterr(LEASE_ESTORE, "cannot read \"%s\" (%s)", url, pw);
        if (strstr(lease_errmsg(), pw) != NULL)
            fail_msg("message '%s' shows the password", lease_errmsg());
        lease__secrets_release(url);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redact_issue_urls),
        cmocka_unit_test(test_redact_keeps_the_rest),
        cmocka_unit_test(test_parse_userinfo),
        cmocka_unit_test(test_secret_params),
        cmocka_unit_test(test_tokens_param),
        cmocka_unit_test(test_scrub_messages),
        cmocka_unit_test(test_scrub_file_secret),
        cmocka_unit_test(test_scrub_refcount_and_forms),
        cmocka_unit_test(test_scrub_short),
        cmocka_unit_test(test_scrub_cut),
        cmocka_unit_test(test_scrub_long_password),
        cmocka_unit_test(test_password_file_rules),
        cmocka_unit_test(test_property_random_passwords),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
