/*
 * test_version.c - lease_version(), and the list of stores a build has:
 * lease_store_builtin(), lease_store_client_version(), the message for a
 * URL of a store the build lacks, and the metrics' store labels. Run in
 * the full build and in the SQLite-only one (scripts/test.sh), it checks
 * that each follows the configuration (lease_config.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lease_int.h"

static void test_version(void **state)
{
    char want[32];

    (void)state;
    snprintf(want, sizeof(want), "%d.%d.%d", LEASE_VERSION_MAJOR,
             LEASE_VERSION_MINOR, LEASE_VERSION_PATCH);
    assert_string_equal(LEASE_VERSION_STRING, want);
    assert_string_equal(lease_version(), want);
}

/* What this build should have, from its configuration. */
static const struct {
    const char *name;
    int built;
    const char *url;     /* one of its URLs */
    const char *client;  /* its client_version starts so */
} expected[] = {
    { "sqlite", 1, "sqlite:///nonexistent-dir/x.db", "SQLite 3." },
    { "postgres", LEASE_WITH_POSTGRES, "postgresql://127.0.0.1:1/db", "libpq " },
    { "redis", LEASE_WITH_REDIS, "redis://127.0.0.1:1", "hiredis " },
    { "etcd", LEASE_WITH_ETCD, "etcds://127.0.0.1:1", "libcurl " },
    { "kubernetes", LEASE_WITH_KUBERNETES, "kubernetes+http://127.0.0.1:1/ns", "libcurl " },
};
#define NEXPECTED (sizeof(expected) / sizeof(expected[0]))

static void test_builtin_list(void **state)
{
    size_t i, k = 0;

    (void)state;
    for (i = 0; i < NEXPECTED; i++) {
        if (!expected[i].built)
            continue;
        assert_non_null(lease_store_builtin(k));
        assert_string_equal(lease_store_builtin(k), expected[i].name);
        k++;
    }
    assert_null(lease_store_builtin(k));
    assert_null(lease_store_builtin(k + 1000));
    assert_null(lease_store_builtin((size_t)-1));
}

static void test_client_version(void **state)
{
    char buf[128];
    size_t i;

    (void)state;
    for (i = 0; i < NEXPECTED; i++) {
        int rc = lease_store_client_version(buf, sizeof(buf), expected[i].name);

        if (!expected[i].built) {
            assert_int_equal(rc, LEASE_ENOTFOUND);
            assert_string_equal(buf, "");
            continue;
        }
        assert_int_equal(rc, 0);
        assert_memory_equal(buf, expected[i].client, strlen(expected[i].client));
        /* Too small: an error and an empty string, never a cut version. */
        assert_int_equal(lease_store_client_version(buf, 4, expected[i].name),
                         LEASE_EINVALID);
        assert_string_equal(buf, "");
    }
    assert_int_equal(lease_store_client_version(NULL, 10, "sqlite"), LEASE_EINVALID);
    assert_int_equal(lease_store_client_version(buf, 0, "sqlite"), LEASE_EINVALID);
    assert_int_equal(lease_store_client_version(buf, sizeof(buf), NULL), LEASE_EINVALID);
    assert_int_equal(lease_store_client_version(buf, sizeof(buf), "other"),
                     LEASE_ENOTFOUND);
    assert_int_equal(lease_store_client_version(buf, sizeof(buf), "SQLITE"),
                     LEASE_ENOTFOUND);
}

/* A URL of a store this build lacks is EINVALID, says which store and
 * what the build has; an unknown scheme says what the build has. */
static void test_missing_store(void **state)
{
    char has[64] = "";
    lease_store *s = (lease_store *)&s;
    size_t i;
    const char *name;

    (void)state;
    for (i = 0; (name = lease_store_builtin(i)) != NULL; i++)
        snprintf(has + strlen(has), sizeof(has) - strlen(has), "%s%s",
                 i ? ", " : "", name);
    for (i = 0; i < NEXPECTED; i++) {
        char want[128];

        if (expected[i].built)
            continue;
        assert_int_equal(lease_store_open(&s, expected[i].url), LEASE_EINVALID);
        assert_null(s);
        snprintf(want, sizeof(want), "this build has no %s store; built with: %s",
                 expected[i].name, has);
        assert_non_null(strstr(lease_errmsg(), want));
    }
    assert_int_equal(lease_store_open(&s, "nosuch://h/x"), LEASE_EINVALID);
    assert_null(s);
    assert_non_null(strstr(lease_errmsg(), "unknown store URL scheme 'nosuch'"));
    assert_non_null(strstr(lease_errmsg(), has));
}

/* Metrics carry a series for each store of the build, none for the
 * others, and "other" for a store the application registered. */
static void test_metrics_labels(void **state)
{
    char *text = NULL, label[64];
    size_t i;

    (void)state;
    assert_int_equal(lease_metrics_text(&text), 0);
    for (i = 0; i < NEXPECTED; i++) {
        snprintf(label, sizeof(label), "lease_renewals_total{store=\"%s\"}",
                 expected[i].name);
        if (expected[i].built)
            assert_non_null(strstr(text, label));
        else
            assert_null(strstr(text, label));
    }
    assert_non_null(strstr(text, "lease_renewals_total{store=\"other\"}"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_builtin_list),
        cmocka_unit_test(test_client_version),
        cmocka_unit_test(test_missing_store),
        cmocka_unit_test(test_metrics_labels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
