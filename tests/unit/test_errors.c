/*
 * test_errors.c - the error table, and the per-thread last error.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "lease_int.h"

typedef struct {
    int code;
    const char *name;   /* "EBUSY", from the macro's name */
    const char *msg;
} error_row;

static const error_row rows[] = {
#define ROW_(name, value, msg) { LEASE_##name, #name, msg },
    LEASE_ERROR_MAP(ROW_)
#undef ROW_
};
#define NROWS (sizeof(rows) / sizeof(rows[0]))

static void test_table(void **state)
{
    size_t i, j;

    (void)state;
    assert_int_equal(NROWS, 9);
    for (i = 0; i < NROWS; i++) {
        const char *name = lease_error_name(rows[i].code);
        const char *msg = lease_strerror(rows[i].code);

        assert_true(rows[i].code < 0);
        assert_non_null(name);
        assert_string_equal(name, rows[i].name);
        assert_true(name[0] == 'E');
        assert_non_null(msg);
        assert_true(msg[0] != '\0');
        assert_string_equal(msg, rows[i].msg);
        assert_string_not_equal(msg, lease_strerror(12345));
        for (j = 0; j < i; j++) {
            assert_int_not_equal(rows[i].code, rows[j].code);
            assert_string_not_equal(rows[i].name, rows[j].name);
        }
    }
    /* The ABI values the header promises. */
    assert_int_equal(LEASE_EINVALID, -1);
    assert_int_equal(LEASE_EBUSY, -2);
    assert_int_equal(LEASE_ELOST, -3);
    assert_int_equal(LEASE_ESTALE, -4);
    assert_int_equal(LEASE_ETIMEOUT, -5);
    assert_int_equal(LEASE_ESTORE, -6);
    assert_int_equal(LEASE_ENOTFOUND, -7);
    assert_int_equal(LEASE_ENOMEM, -8);
    assert_int_equal(LEASE_EUNSUPPORTED, -9);
}

static void test_unknown_and_ok(void **state)
{
    static const int unknown[] = { 1, 42, -10, -100, 12345, -2147483647 - 1 };
    size_t i;

    (void)state;
    assert_string_equal(lease_error_name(0), "OK");
    assert_true(lease_strerror(0)[0] != '\0');
    for (i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        assert_string_equal(lease_error_name(unknown[i]), "EUNKNOWN");
        assert_non_null(lease_strerror(unknown[i]));
        assert_true(lease_strerror(unknown[i])[0] != '\0');
    }
}

static void test_seterr_and_clear(void **state)
{
    char big[3000];

    (void)state;
    lease_error_clear();
    assert_int_equal(lease_errcode(), 0);
    assert_non_null(lease_errmsg());
    assert_string_equal(lease_errmsg(), "");

    assert_int_equal(lease_store_seterr(LEASE_EBUSY, "key '%s' held by %d", "k", 7),
                     LEASE_EBUSY);
    assert_int_equal(lease_errcode(), LEASE_EBUSY);
    assert_string_equal(lease_errmsg(), "key 'k' held by 7");

    /* A new failure replaces the old one. */
    assert_int_equal(lease_store_seterr(LEASE_ESTORE, "down"), LEASE_ESTORE);
    assert_int_equal(lease_errcode(), LEASE_ESTORE);
    assert_string_equal(lease_errmsg(), "down");

    /* The message may quote the previous one. */
    assert_int_equal(lease_store_seterr(LEASE_ESTORE, "open: %s", lease_errmsg()),
                     LEASE_ESTORE);
    assert_string_equal(lease_errmsg(), "open: down");

    /* A message longer than the buffer is cut, not overflowed. */
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    lease_store_seterr(LEASE_EINVALID, "%s", big);
    assert_true(strlen(lease_errmsg()) > 0);
    assert_true(strlen(lease_errmsg()) < sizeof(big) - 1);
    assert_int_equal(lease_errcode(), LEASE_EINVALID);

    lease_error_clear();
    assert_int_equal(lease_errcode(), 0);
    assert_string_equal(lease_errmsg(), "");

    /* A succeeding call leaves the last error as it was. */
    lease_store_seterr(LEASE_ENOTFOUND, "gone");
    {
        uint64_t ms;
        assert_int_equal(lease_parse_duration(&ms, "1s"), 0);
    }
    assert_int_equal(lease_errcode(), LEASE_ENOTFOUND);
    assert_string_equal(lease_errmsg(), "gone");
    lease_error_clear();
}

typedef struct {
    int code_before;
    char msg_before[64];
    int code_after;
    char msg_after[64];
} thread_seen;

static void *other_thread(void *arg)
{
    thread_seen *seen = arg;

    /* A new thread starts with no error, whatever the main thread has. */
    seen->code_before = lease_errcode();
    snprintf(seen->msg_before, sizeof(seen->msg_before), "%s", lease_errmsg());
    lease_store_seterr(LEASE_ETIMEOUT, "from the other thread");
    seen->code_after = lease_errcode();
    snprintf(seen->msg_after, sizeof(seen->msg_after), "%s", lease_errmsg());
    return NULL;
}

static void test_per_thread(void **state)
{
    pthread_t t;
    thread_seen seen;

    (void)state;
    memset(&seen, 0, sizeof(seen));
    lease_store_seterr(LEASE_EBUSY, "from the main thread");
    assert_int_equal(pthread_create(&t, NULL, other_thread, &seen), 0);
    assert_int_equal(pthread_join(t, NULL), 0);

    assert_int_equal(seen.code_before, 0);
    assert_string_equal(seen.msg_before, "");
    assert_int_equal(seen.code_after, LEASE_ETIMEOUT);
    assert_string_equal(seen.msg_after, "from the other thread");

    /* The main thread's error is unchanged. */
    assert_int_equal(lease_errcode(), LEASE_EBUSY);
    assert_string_equal(lease_errmsg(), "from the main thread");
    lease_error_clear();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_unknown_and_ok),
        cmocka_unit_test(test_seterr_and_clear),
        cmocka_unit_test(test_per_thread),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
