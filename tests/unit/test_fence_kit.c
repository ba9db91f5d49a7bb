/*
 * test_fence_kit.c - lease_fence_kit_text: the PostgreSQL kit built into
 * the library is resource/postgres/fence.sql byte for byte, NUL-terminated,
 * its length right; another kind and NULL arguments are refused with
 * LEASE_EINVALID, a message, and *text NULL.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <lease.h>

static void postgres_is_fence_sql(void **state)
{
    static char want[1 << 20];
    const char *text = NULL;
    size_t len = 0, n;
    FILE *fp = fopen(LEASE_FENCE_SQL, "rb");

    (void)state;
    assert_non_null(fp);
    n = fread(want, 1, sizeof(want), fp);
    fclose(fp);
    /* A floor: an empty or truncated read cannot pass for the kit. */
    assert_true(n > 10000 && n < sizeof(want));
    assert_int_equal(lease_fence_kit_text(&text, &len, "postgres"), LEASE_OK);
    assert_non_null(text);
    assert_int_equal(len, n);
    assert_memory_equal(text, want, n);
    assert_int_equal(text[len], '\0');
    assert_int_equal(strlen(text), len);
    /* len is optional. */
    text = NULL;
    assert_int_equal(lease_fence_kit_text(&text, NULL, "postgres"), LEASE_OK);
    assert_non_null(strstr(text, "CREATE OR REPLACE FUNCTION @schema@.lease_fence_check("));
}

static void refused(void **state)
{
    const char *text = "x";
    size_t len = 7;

    (void)state;
    assert_int_equal(lease_fence_kit_text(&text, &len, "sqlite"), LEASE_EINVALID);
    assert_null(text);
    assert_int_equal(len, 7);
    assert_non_null(strstr(lease_errmsg(), "'sqlite'"));
    text = "x";
    assert_int_equal(lease_fence_kit_text(&text, &len, "Postgres"), LEASE_EINVALID);
    assert_null(text);
    text = "x";
    assert_int_equal(lease_fence_kit_text(&text, &len, ""), LEASE_EINVALID);
    assert_null(text);
    text = "x";
    assert_int_equal(lease_fence_kit_text(&text, &len, NULL), LEASE_EINVALID);
    assert_null(text);
    assert_int_equal(lease_fence_kit_text(NULL, &len, "postgres"), LEASE_EINVALID);
    assert_int_equal(lease_errcode(), LEASE_EINVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(postgres_is_fence_sql),
        cmocka_unit_test(refused),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
