/*
 * test_fence_local.c - lease_fence_local: the in-process marks of a service
 * that keeps its own state. Threads racing to advance one mark, the marks
 * kept across a reopen, a file cut short or altered refused with a clear
 * error, the file's lock, and bad arguments.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "lease_int.h"

#define THREADS 8
#define PER_THREAD 2000

/* A fresh directory under LEASE_TEST_DIR for one test's file. */
static void fresh_path(char *buf, size_t size, const char *name)
{
    char dir[512];

    snprintf(dir, sizeof(dir), "%s/fence_local.XXXXXX", LEASE_TEST_DIR);
    assert_non_null(mkdtemp(dir));
    snprintf(buf, size, "%s/%s", dir, name);
}

static void write_file(const char *path, const char *text, size_t len)
{
    FILE *fp = fopen(path, "wb");

    assert_non_null(fp);
    assert_int_equal(fwrite(text, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
}

static char *read_file(const char *path, size_t *len)
{
    static char buf[1 << 16];
    FILE *fp = fopen(path, "rb");

    assert_non_null(fp);
    *len = fread(buf, 1, sizeof(buf) - 1, fp);
    buf[*len] = '\0';
    fclose(fp);
    return buf;
}

typedef struct {
    lease_fence_local *f;
    uint64_t base;
    int errors;          /* a refusal that was not ESTALE, or a bad mark */
    uint64_t accepted_max;
} racer;

/* Each thread offers its own rising tokens, interleaved with the others'
 * (token = i * THREADS + base): after every accepted check the mark is at
 * least the token, after every refusal greater than it. */
static void *race(void *arg)
{
    racer *r = arg;
    uint64_t i, mark;

    for (i = 1; i <= PER_THREAD; i++) {
        uint64_t token = i * THREADS + r->base;
        int rc = lease_fence_local_check(&mark, r->f, "shared", token);
        if (rc == 0 && mark == token)
            r->accepted_max = token;
        else if (!(rc == LEASE_ESTALE && mark > token))
            r->errors++;
    }
    return NULL;
}

static void test_threads(void **state)
{
    lease_fence_local *f;
    pthread_t t[THREADS];
    racer r[THREADS];
    uint64_t mark, best = 0;
    int i;

    (void)state;
    assert_int_equal(lease_fence_local_open(&f, NULL), 0);
    for (i = 0; i < THREADS; i++) {
        r[i] = (racer){ .f = f, .base = (uint64_t)i };
        assert_int_equal(pthread_create(&t[i], NULL, race, &r[i]), 0);
    }
    for (i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(t[i], NULL), 0);
        assert_int_equal(r[i].errors, 0);
        if (r[i].accepted_max > best)
            best = r[i].accepted_max;
    }
    /* The mark is the greatest token any thread offered: the last one of
     * the thread with the greatest base, whoever came last. */
    assert_int_equal(lease_fence_local_mark(&mark, f, "shared"), 0);
    assert_int_equal(mark, (uint64_t)PER_THREAD * THREADS + THREADS - 1);
    assert_true(best <= mark);
    lease_fence_local_close(f);
}

static void test_semantics(void **state)
{
    lease_fence_local *f;
    uint64_t mark = 99;

    (void)state;
    assert_int_equal(lease_fence_local_open(&f, NULL), 0);
    assert_int_equal(lease_fence_local_mark(&mark, f, "r"), LEASE_ENOTFOUND);
    assert_int_equal(lease_fence_local_check(&mark, f, "r", 41), 0);
    assert_int_equal(mark, 41);
    assert_int_equal(lease_fence_local_check(&mark, f, "r", 41), 0); /* equal */
    assert_int_equal(lease_fence_local_check(&mark, f, "r", 42), 0);
    assert_int_equal(lease_fence_local_check(&mark, f, "r", 41), LEASE_ESTALE);
    assert_int_equal(mark, 42);
    assert_non_null(strstr(lease_errmsg(), "41 < mark 42"));
    /* Resources are apart. */
    assert_int_equal(lease_fence_local_check(&mark, f, "other", 1), 0);
    assert_int_equal(lease_fence_local_check(NULL, f, "r", LEASE__TOKEN_MAX), 0);
    assert_int_equal(lease_fence_local_mark(&mark, f, "r"), 0);
    assert_int_equal(mark, LEASE__TOKEN_MAX);
    lease_fence_local_close(f);
    lease_fence_local_close(NULL);
}

static void test_persist(void **state)
{
    char path[600], odd[4] = { 'a', '\n', ' ', '\0' };
    lease_fence_local *f, *g;
    uint64_t mark;

    (void)state;
    fresh_path(path, sizeof(path), "marks");
    assert_int_equal(lease_fence_local_open(&f, path), 0);
    assert_int_equal(lease_fence_local_check(&mark, f, "tenant-42", 7), 0);
    assert_int_equal(lease_fence_local_check(&mark, f, odd, 9223372036854775807ULL), 0);
    assert_int_equal(lease_fence_local_check(&mark, f, "tenant-42", 8), 0);
    /* One handle per file: a second one (or process) is refused. */
    assert_int_equal(lease_fence_local_open(&g, path), LEASE_EBUSY);
    assert_null(g);
    lease_fence_local_close(f);

    assert_int_equal(lease_fence_local_open(&f, path), 0);
    assert_int_equal(lease_fence_local_mark(&mark, f, "tenant-42"), 0);
    assert_int_equal(mark, 8);
    assert_int_equal(lease_fence_local_mark(&mark, f, odd), 0);
    assert_int_equal(mark, 9223372036854775807ULL);
    assert_int_equal(lease_fence_local_check(&mark, f, "tenant-42", 7), LEASE_ESTALE);
    assert_int_equal(mark, 8);
    lease_fence_local_close(f);
}

/* The marks file made at the first open, then deleted: the marks are lost,
 * and the next open refuses instead of starting over with none. */
static void test_missing_file(void **state)
{
    char path[600], lock[620];
    lease_fence_local *f;
    uint64_t mark;
    size_t len;

    (void)state;
    fresh_path(path, sizeof(path), "marks");
    assert_int_equal(lease_fence_local_open(&f, path), 0);
    lease_fence_local_close(f);
    (void)read_file(path, &len); /* written at the first open */
    assert_true(len > 0);
    assert_int_equal(lease_fence_local_open(&f, path), 0);
    assert_int_equal(lease_fence_local_check(&mark, f, "r", 5), 0);
    lease_fence_local_close(f);
    assert_int_equal(unlink(path), 0);
    f = (lease_fence_local *)1;
    assert_int_equal(lease_fence_local_open(&f, path), LEASE_ESTORE);
    assert_null(f);
    assert_non_null(strstr(lease_errmsg(), "missing"));
    /* Removing the lock file is the knowing way to start over. */
    snprintf(lock, sizeof(lock), "%s.lock", path);
    assert_int_equal(unlink(lock), 0);
    assert_int_equal(lease_fence_local_open(&f, path), 0);
    assert_int_equal(lease_fence_local_mark(&mark, f, "r"), LEASE_ENOTFOUND);
    lease_fence_local_close(f);
}

/* Open a file holding `text`: it must be refused as corrupt. */
static void expect_corrupt(const char *path, const char *text, size_t len)
{
    lease_fence_local *f = (lease_fence_local *)1;

    write_file(path, text, len);
    assert_int_equal(lease_fence_local_open(&f, path), LEASE_ESTORE);
    assert_null(f);
    assert_non_null(strstr(lease_errmsg(), "corrupt or cut short"));
}

static void test_corrupt(void **state)
{
    char path[600], good[1 << 16], bad[1 << 16];
    lease_fence_local *f;
    uint64_t mark;
    size_t len, cut;
    char *p;

    (void)state;
    fresh_path(path, sizeof(path), "marks");
    assert_int_equal(lease_fence_local_open(&f, path), 0);
    assert_int_equal(lease_fence_local_check(&mark, f, "a", 5), 0);
    assert_int_equal(lease_fence_local_check(&mark, f, "b", 6), 0);
    lease_fence_local_close(f);
    p = read_file(path, &len);
    memcpy(good, p, len + 1);

    /* Cut short at every length: each is refused, none read as fewer marks. */
    for (cut = 0; cut < len; cut++)
        expect_corrupt(path, good, cut);
    /* One digit of a mark changed: the checksum no longer matches. */
    memcpy(bad, good, len + 1);
    p = strstr(bad, "\n5 ");
    assert_non_null(p);
    p[1] = '4';
    expect_corrupt(path, bad, len);
    /* Garbage after the end line. */
    memcpy(bad, good, len);
    memcpy(bad + len, "x\n", 2);
    expect_corrupt(path, bad, len + 2);
    expect_corrupt(path, "hello\n", 6);

    /* The untouched file still opens. */
    write_file(path, good, len);
    assert_int_equal(lease_fence_local_open(&f, path), 0);
    assert_int_equal(lease_fence_local_mark(&mark, f, "b"), 0);
    assert_int_equal(mark, 6);
    lease_fence_local_close(f);
}

static void test_bad_input(void **state)
{
    char path[600], longname[LEASE_KEY_MAX + 2];
    lease_fence_local *f;
    uint64_t mark;

    (void)state;
    assert_int_equal(lease_fence_local_open(NULL, NULL), LEASE_EINVALID);
    assert_int_equal(lease_fence_local_open(&f, ""), LEASE_EINVALID);
    assert_null(f);
    assert_int_equal(lease_fence_local_open(&f, "/nonexistent-dir/x/marks"), LEASE_EINVALID);
    assert_null(f);
    fresh_path(path, sizeof(path), "");
    assert_int_equal(lease_fence_local_open(&f, path), LEASE_EINVALID); /* a directory */

    assert_int_equal(lease_fence_local_open(&f, NULL), 0);
    assert_int_equal(lease_fence_local_check(&mark, NULL, "r", 1), LEASE_EINVALID);
    assert_int_equal(lease_fence_local_check(&mark, f, NULL, 1), LEASE_EINVALID);
    assert_int_equal(lease_fence_local_check(&mark, f, "", 1), LEASE_EINVALID);
    assert_int_equal(lease_fence_local_check(&mark, f, "r", 0), LEASE_EINVALID);
    assert_int_equal(lease_fence_local_check(&mark, f, "r", LEASE__TOKEN_MAX + 1),
                     LEASE_EINVALID);
    memset(longname, 'k', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_int_equal(lease_fence_local_check(&mark, f, longname, 1), LEASE_EINVALID);
    assert_int_equal(lease_fence_local_mark(NULL, f, "r"), LEASE_EINVALID);
    assert_int_equal(lease_fence_local_mark(&mark, NULL, "r"), LEASE_EINVALID);
    /* None of them made a mark. */
    assert_int_equal(lease_fence_local_mark(&mark, f, "r"), LEASE_ENOTFOUND);
    lease_fence_local_close(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_semantics),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_persist),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
