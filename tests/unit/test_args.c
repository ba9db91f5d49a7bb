/*
 * test_args.c - every public function checks its arguments first: a bad
 * one gives LEASE_EINVALID with a message, and nothing reaches the store.
 * Runs against a real SQLite store in a fresh temporary directory.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "lease_int.h"

#ifndef LEASE_TEST_DIR
#define LEASE_TEST_DIR "/tmp"
#endif

#define OWNER_A "6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f"
#define OWNER_A_UPPER "6F1C2D3E-4A5B-4C6D-8E9F-0A1B2C3D4E5F"

static char tmpdir[512];
static char url[600];
static lease_store *store;

/* ---- helpers ---------------------------------------------------------- */

/* `rc` must be `want` with a non-empty message; `what` names the call. */
static void expect_rc_at(int rc, int want, const char *what, int line)
{
    if (rc != want)
        fail_msg("line %d: %s: got %d (%s), want %s: %s", line, what, rc,
                 lease_error_name(rc), lease_error_name(want), lease_errmsg());
    if (want < 0) {
        if (lease_errcode() != want)
            fail_msg("line %d: %s: lease_errcode() is %d, want %d", line,
                     what, lease_errcode(), want);
        if (lease_errmsg()[0] == '\0')
            fail_msg("line %d: %s: no message", line, what);
    }
}

/* Clear the last error, run `call`, and check its result. */
#define EXPECT_RC(want, call)                              \
    do {                                                   \
        lease_error_clear();                               \
        expect_rc_at((call), (want), #call, __LINE__);     \
    } while (0)
#define EXPECT_EINVALID(call) EXPECT_RC(LEASE_EINVALID, call)

static int rm_entry(const char *path, const struct stat *sb, int flag,
                    struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

static int chmod_entry(const char *path, const struct stat *sb, int flag,
                       struct FTW *ftw)
{
    (void)ftw;
    if (flag == FTW_D || flag == FTW_DP)
        chmod(path, (sb->st_mode & 07777) | 0700);
    return 0;
}

static void rm_rf(const char *path)
{
    chmod(path, 0700);
    nftw(path, chmod_entry, 16, FTW_PHYS);
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int setup(void **state)
{
    struct stat st;
    int rc;

    (void)state;
    if (stat(LEASE_TEST_DIR, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(tmpdir, sizeof(tmpdir), "%s/unit_args.XXXXXX", LEASE_TEST_DIR);
    else
        snprintf(tmpdir, sizeof(tmpdir), "/tmp/unit_args.XXXXXX");
    if (mkdtemp(tmpdir) == NULL) {
        fprintf(stderr, "mkdtemp(%s): %s\n", tmpdir, strerror(errno));
        return -1;
    }
    snprintf(url, sizeof(url), "sqlite://%s/a.db", tmpdir);
    rc = lease_store_open(&store, url);
    if (rc != 0) {
        fprintf(stderr, "lease_store_open(%s): %s\n", url, lease_errmsg());
        rm_rf(tmpdir);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    lease_store_close(store);
    store = NULL;
    rm_rf(tmpdir);
    return 0;
}

/* A grant that passes every check, built without touching the store. */
static void good_grant(lease_grant *g, const char *key)
{
    assert_int_equal(lease_grant_init(g, key, OWNER_A, 7, 10000), 0);
    g->deadline_ns = lease_clock_ns() + 10 * 1000000000LL;
}

static size_t count_keys(const char *prefix)
{
    lease_info *list = NULL;
    size_t n = 99;

    assert_int_equal(lease_list(&list, &n, store, prefix), 0);
    lease_list_free(list);
    return n;
}

static int is_v4_uuid(const char *s)
{
    size_t i;

    if (strlen(s) != 36)
        return 0;
    for (i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-')
                return 0;
        } else if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) {
            return 0;
        }
    }
    return s[14] == '4' && strchr("89ab", s[19]) != NULL;
}

/* ---- lease_store_open ------------------------------------------------- */

/* Open must fail with `want`, leave *out NULL, and not leak a password. */
static void open_fails(int want, const char *u, const char *in_msg)
{
    lease_store *s = (lease_store *)&s; /* anything but NULL */

    lease_error_clear();
    expect_rc_at(lease_store_open(&s, u), want, u ? u : "(null URL)", __LINE__);
    if (s != NULL) {
        fail_msg("open('%s') failed but left *out set", u);
    }
    if (in_msg && strstr(lease_errmsg(), in_msg) == NULL)
        fail_msg("open('%s'): message '%s' does not mention '%s'", u,
                 lease_errmsg(), in_msg);
    if (strstr(lease_errmsg(), "s3cr3tPw") != NULL)
        fail_msg("open('%s'): message '%s' shows the password", u,
                 lease_errmsg());
}

static void test_open_invalid(void **state)
{
    (void)state;
    EXPECT_EINVALID(lease_store_open(NULL, url));
    open_fails(LEASE_EINVALID, NULL, NULL);
    open_fails(LEASE_EINVALID, "", NULL);
    open_fails(LEASE_EINVALID, "nosuch://x", "nosuch");
    open_fails(LEASE_EINVALID, "NoSuch://u:s3cr3tPw@h/x", "nosuch");
    open_fails(LEASE_EINVALID, "/tmp/x.db", NULL);
    open_fails(LEASE_EINVALID, "sqlite://host/x.db", NULL);
    open_fails(LEASE_EINVALID, "sqlite://u:s3cr3tPw@host/x.db", NULL);
    open_fails(LEASE_EINVALID, "sqlite:///x?bogus=1", "bogus");
    open_fails(LEASE_EINVALID, "sqlite:///x?synchronous=sometimes", NULL);
    open_fails(LEASE_EINVALID, "sqlite:///x%zz.db", NULL);
    open_fails(LEASE_EINVALID, "sqlite:", NULL);
    open_fails(LEASE_EINVALID, "sqlite://", NULL);
}

static void test_open_unreachable(void **state)
{
    char u[1200], path[1100];
    int fd;

    (void)state;
    open_fails(LEASE_ESTORE, "sqlite:///nonexistent-dir-xyz/sub/a.db",
               "/nonexistent-dir-xyz/sub/a.db");

    /* Under a regular file: no one, not even root, can create that. */
    snprintf(path, sizeof(path), "%s/file.txt", tmpdir);
    fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    assert_true(fd >= 0);
    close(fd);
    snprintf(path, sizeof(path), "%s/file.txt/a.db", tmpdir);
    snprintf(u, sizeof(u), "sqlite://%s", path);
    open_fails(LEASE_ESTORE, u, path);
}

static void test_store_accessors(void **state)
{
    (void)state;
    assert_string_equal(lease_store_scheme(store), "sqlite");
    assert_string_equal(lease_store_url_redacted(store), url);
    assert_string_equal(lease_store_scheme(NULL), "");
    assert_string_equal(lease_store_url_redacted(NULL), "");
    lease_store_close(NULL);
}

static void test_set_timeout(void **state)
{
    (void)state;
    EXPECT_EINVALID(lease_store_set_timeout(store, 0));
    EXPECT_EINVALID(lease_store_set_timeout(NULL, 1000));
    EXPECT_EINVALID(lease_store_set_timeout(store, 24ULL * 3600 * 1000 + 1));
    assert_int_equal(store->timeout_ms, LEASE__TIMEOUT_DEFAULT_MS);
    EXPECT_RC(0, lease_store_set_timeout(store, 1000));
    assert_int_equal(store->timeout_ms, 1000);
    EXPECT_RC(0, lease_store_set_timeout(store, LEASE__TIMEOUT_DEFAULT_MS));

    EXPECT_EINVALID(lease_store_set_ttl_max(store, 0));
    EXPECT_EINVALID(lease_store_set_ttl_max(NULL, 1000));
    EXPECT_EINVALID(lease_store_set_ttl_max(store, UINT64_MAX));
    assert_int_equal(store->ttl_max_ms, LEASE_TTL_MAX_DEFAULT_MS);
}

/* ---- lease_acquire ---------------------------------------------------- */

static void test_acquire_invalid(void **state)
{
    char key256[257], label256[257];
    char owner36[] = "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz";
    char owner36b[] = "6f1c2d3e4a5b-4c6d-8e9f-0a1b2c3d4e5f0";
    lease_acquire_opts ok = LEASE_ACQUIRE_OPTS_INIT, o;
    lease_grant g, g0;
    lease_info h, h0;
    lease_info info;

    (void)state;
    memset(key256, 'k', 256);
    key256[256] = '\0';
    memset(label256, 'l', 256);
    label256[256] = '\0';
    ok.owner = OWNER_A;
    ok.ttl_ms = 1000;
    memset(&g0, 0xAB, sizeof(g0));
    memset(&h0, 0xCD, sizeof(h0));
    g = g0;
    h = h0;

    EXPECT_EINVALID(lease_acquire(NULL, &h, store, "args/k", &ok));
    EXPECT_EINVALID(lease_acquire(&g, &h, NULL, "args/k", &ok));
    EXPECT_EINVALID(lease_acquire(&g, &h, store, NULL, &ok));
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "", &ok));
    EXPECT_EINVALID(lease_acquire(&g, &h, store, key256, &ok));
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", NULL));

    o = ok;
    o.version = LEASE_ACQUIRE_OPTS_VERSION + 1;
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", &o));
    o.version = 0;
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", &o));

    o = ok;
    o.owner = NULL;
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", &o));
    o.owner = "";
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", &o));
    o.owner = "xyz";
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", &o));
    o.owner = owner36;
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", &o));
    o.owner = owner36b;
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", &o));
    o.owner = OWNER_A "0"; /* 37 characters */
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", &o));

    o = ok;
    o.ttl_ms = 0;
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", &o));
    o.ttl_ms = LEASE_TTL_MAX_DEFAULT_MS + 1;
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", &o));
    o.ttl_ms = UINT64_MAX;
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", &o));

    o = ok;
    o.label = label256;
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", &o));

    o = ok;
    o.wait_ms = 24ULL * 3600 * 1000 + 1;
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", &o));
    o.wait_ms = UINT64_MAX;
    EXPECT_EINVALID(lease_acquire(&g, &h, store, "args/k", &o));

    /* Nothing was written anywhere. */
    assert_memory_equal(&g, &g0, sizeof(g));
    assert_memory_equal(&h, &h0, sizeof(h));
    assert_int_equal(count_keys(""), 0);
    assert_int_equal(count_keys(NULL), 0);
    EXPECT_RC(LEASE_ENOTFOUND, lease_inspect(&info, store, "args/k"));
}

static void test_inspect_list_invalid(void **state)
{
    char key256[257];
    lease_info info, *list = (lease_info *)&list;
    size_t n = 5;

    (void)state;
    memset(key256, 'k', 256);
    key256[256] = '\0';
    EXPECT_EINVALID(lease_inspect(NULL, store, "k"));
    EXPECT_EINVALID(lease_inspect(&info, NULL, "k"));
    EXPECT_EINVALID(lease_inspect(&info, store, NULL));
    EXPECT_EINVALID(lease_inspect(&info, store, ""));
    EXPECT_EINVALID(lease_inspect(&info, store, key256));

    EXPECT_EINVALID(lease_list(NULL, &n, store, ""));
    EXPECT_EINVALID(lease_list(&list, NULL, store, ""));
    EXPECT_EINVALID(lease_list(&list, &n, NULL, ""));
    assert_null(list);
    assert_int_equal(n, 0);
    list = (lease_info *)&list;
    EXPECT_EINVALID(lease_list(&list, &n, store, key256));
    assert_null(list);
    lease_list_free(NULL);
}

/* ---- owners ----------------------------------------------------------- */

static void test_owner_new(void **state)
{
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];

    (void)state;
    assert_int_equal(lease_owner_new(a), 0);
    assert_int_equal(lease_owner_new(b), 0);
    assert_int_equal(strlen(a), LEASE_OWNER_LEN);
    if (!is_v4_uuid(a) || !is_v4_uuid(b))
        fail_msg("not canonical v4 UUIDs: '%s' '%s'", a, b);
    assert_int_equal(a[14], '4');
    assert_string_not_equal(a, b);
    assert_true(lease_owner_valid(a));
    EXPECT_EINVALID(lease_owner_new(NULL));
}

static void test_owner_valid(void **state)
{
    (void)state;
    assert_int_equal(lease_owner_valid(OWNER_A), 1);
    assert_int_equal(lease_owner_valid(OWNER_A_UPPER), 1);
    assert_int_equal(lease_owner_valid("6F1c2d3E-4a5B-4C6D-8e9f-0A1B2c3d4e5f"), 1);
    assert_int_equal(lease_owner_valid(NULL), 0);
    assert_int_equal(lease_owner_valid(""), 0);
    assert_int_equal(lease_owner_valid("xyz"), 0);
    assert_int_equal(lease_owner_valid("zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"), 0);
    assert_int_equal(lease_owner_valid("6f1c2d3e4a5b-4c6d-8e9f-0a1b2c3d4e5f0"), 0);
    assert_int_equal(lease_owner_valid("6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5"), 0);
    assert_int_equal(lease_owner_valid(OWNER_A " "), 0);
    assert_int_equal(lease_owner_valid("{6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e}"), 0);
}

static void test_owner_upper_case_stored_lower(void **state)
{
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    lease_grant g;
    lease_info info;

    (void)state;
    o.owner = OWNER_A_UPPER;
    o.ttl_ms = 60000;
    EXPECT_RC(0, lease_acquire(&g, NULL, store, "owner/upper", &o));
    assert_string_equal(g.owner, OWNER_A);
    assert_string_equal(g.key, "owner/upper");
    assert_true(g.token >= 1);
    EXPECT_RC(0, lease_inspect(&info, store, "owner/upper"));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.owner, OWNER_A);

    /* The same owner in lower case is the same holder. */
    o.owner = OWNER_A;
    {
        lease_grant g2;
        EXPECT_RC(0, lease_acquire(&g2, NULL, store, "owner/upper", &o));
        assert_int_equal(g2.token, g.token);
    }
    EXPECT_RC(0, lease_release(store, &g));
}

/* The limits themselves are allowed: 255-byte keys and labels, a ttl at
 * the cap, a wait of exactly 24 h. */
static void test_boundaries_accepted(void **state)
{
    char key255[256], label255[256];
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    lease_grant g;
    lease_info info;
    uint64_t mark = 0;

    (void)state;
    memset(key255, 'k', 255);
    key255[255] = '\0';
    memset(label255, 'l', 255);
    label255[255] = '\0';
    o.owner = OWNER_A;
    o.ttl_ms = LEASE_TTL_MAX_DEFAULT_MS;
    o.label = label255;
    o.wait_ms = 24ULL * 3600 * 1000;
    EXPECT_RC(0, lease_acquire(&g, NULL, store, key255, &o));
    assert_string_equal(g.key, key255);
    assert_string_equal(g.label, label255);
    assert_int_equal(g.ttl_ms, LEASE_TTL_MAX_DEFAULT_MS);
    EXPECT_RC(0, lease_inspect(&info, store, key255));
    assert_string_equal(info.key, key255);
    assert_string_equal(info.label, label255);
    EXPECT_RC(0, lease_renew(&g, store, 0));
    EXPECT_RC(0, lease_release(store, &g));

    EXPECT_RC(0, lease_fence_advance(&mark, store, key255, (uint64_t)INT64_MAX));
    assert_true(mark == (uint64_t)INT64_MAX);
    EXPECT_RC(0, lease_grant_init(&g, key255, OWNER_A, 1, 1));
}

/* ---- grants, renew and release ---------------------------------------- */

static void test_grant_init(void **state)
{
    lease_grant g, g0;
    char key256[257];

    (void)state;
    memset(key256, 'k', 256);
    key256[256] = '\0';
    memset(&g0, 0xAB, sizeof(g0));
    g = g0;
    EXPECT_EINVALID(lease_grant_init(NULL, "k", OWNER_A, 1, 1000));
    EXPECT_EINVALID(lease_grant_init(&g, NULL, OWNER_A, 1, 1000));
    EXPECT_EINVALID(lease_grant_init(&g, "", OWNER_A, 1, 1000));
    EXPECT_EINVALID(lease_grant_init(&g, key256, OWNER_A, 1, 1000));
    EXPECT_EINVALID(lease_grant_init(&g, "k", OWNER_A, 0, 1000));
    EXPECT_EINVALID(lease_grant_init(&g, "k", OWNER_A, (uint64_t)INT64_MAX + 1, 1000));
    EXPECT_EINVALID(lease_grant_init(&g, "k", OWNER_A, UINT64_MAX, 1000));
    assert_memory_equal(&g, &g0, sizeof(g));
    EXPECT_EINVALID(lease_grant_init(&g, "k", NULL, 1, 1000));
    EXPECT_EINVALID(lease_grant_init(&g, "k", "xyz", 1, 1000));

    EXPECT_RC(0, lease_grant_init(&g, "k", OWNER_A_UPPER, (uint64_t)INT64_MAX, 1000));
    assert_string_equal(g.key, "k");
    assert_string_equal(g.owner, OWNER_A);
    assert_true(g.token == (uint64_t)INT64_MAX);
    assert_int_equal(g.ttl_ms, 1000);
    assert_int_equal(g.deadline_ns, 0);
    assert_int_equal(lease_grant_valid(&g), 0);
    assert_int_equal(lease_grant_remaining_ms(&g), 0);
    assert_int_equal(lease_grant_valid(NULL), 0);
    assert_int_equal(lease_grant_remaining_ms(NULL), 0);
}

static void test_renew_release_invalid(void **state)
{
    lease_grant zero, g, g0, junk;

    (void)state;
    memset(&zero, 0, sizeof(zero));
    EXPECT_EINVALID(lease_renew(&zero, store, 1000));
    EXPECT_EINVALID(lease_renew(&zero, store, 0));
    EXPECT_EINVALID(lease_release(store, &zero));
    EXPECT_EINVALID(lease_renew(NULL, store, 1000));
    EXPECT_EINVALID(lease_release(store, NULL));

    /* A grant whose strings are not terminated. */
    memset(&junk, 'a', sizeof(junk));
    EXPECT_EINVALID(lease_renew(&junk, store, 1000));
    EXPECT_EINVALID(lease_release(store, &junk));

    good_grant(&g, "args/renew");
    g0 = g;
    EXPECT_EINVALID(lease_renew(&g, NULL, 1000));
    EXPECT_EINVALID(lease_release(NULL, &g));
    EXPECT_EINVALID(lease_renew(&g, store, LEASE_TTL_MAX_DEFAULT_MS + 1));
    EXPECT_EINVALID(lease_renew(&g, store, UINT64_MAX));
    g.token = 0;
    EXPECT_EINVALID(lease_renew(&g, store, 1000));
    EXPECT_EINVALID(lease_release(store, &g));
    g.token = (uint64_t)INT64_MAX + 1;
    EXPECT_EINVALID(lease_release(store, &g));
    g = g0;
    strcpy(g.owner, "not-an-owner");
    EXPECT_EINVALID(lease_renew(&g, store, 1000));
    EXPECT_EINVALID(lease_release(store, &g));
    g = g0;
    g.key[0] = '\0';
    EXPECT_EINVALID(lease_renew(&g, store, 1000));
    g = g0;
    g.ttl_ms = 0;
    EXPECT_EINVALID(lease_renew(&g, store, 0));
    assert_int_equal(g.ttl_ms, 0);
    g.ttl_ms = g0.ttl_ms;
    assert_memory_equal(&g, &g0, sizeof(g));

    /* A well-formed grant of a key never acquired: the store says lost. */
    EXPECT_RC(LEASE_ELOST, lease_renew(&g, store, 1000));
    EXPECT_RC(LEASE_ELOST, lease_release(store, &g));
    assert_int_equal(count_keys("args/"), 0);
}

/* ---- fencing and guarded writes --------------------------------------- */

static int txn_calls;

static int count_txn(void *native, void *payload)
{
    (void)native;
    (void)payload;
    txn_calls++;
    return 0;
}

static void test_fence_invalid(void **state)
{
    uint64_t mark = 99;
    char res256[257];

    (void)state;
    memset(res256, 'r', 256);
    res256[256] = '\0';
    EXPECT_EINVALID(lease_fence_advance(&mark, store, "args/res", 0));
    EXPECT_EINVALID(lease_fence_advance(&mark, store, "args/res", (uint64_t)INT64_MAX + 1));
    EXPECT_EINVALID(lease_fence_advance(&mark, store, "", 1));
    EXPECT_EINVALID(lease_fence_advance(&mark, store, NULL, 1));
    EXPECT_EINVALID(lease_fence_advance(&mark, store, res256, 1));
    EXPECT_EINVALID(lease_fence_advance(&mark, NULL, "args/res", 1));
    assert_int_equal(mark, 99);

    EXPECT_EINVALID(lease_fence_mark(NULL, store, "args/res"));
    EXPECT_EINVALID(lease_fence_mark(&mark, NULL, "args/res"));
    EXPECT_EINVALID(lease_fence_mark(&mark, store, ""));
    EXPECT_EINVALID(lease_fence_mark(&mark, store, NULL));
    EXPECT_RC(LEASE_ENOTFOUND, lease_fence_mark(&mark, store, "args/res"));
}

static void test_guarded_invalid(void **state)
{
    lease_grant g, zero;
    void *value = (void *)&value;
    size_t len = 3;
    uint64_t token = 9;
    char name256[257];

    (void)state;
    memset(name256, 'n', 256);
    name256[256] = '\0';
    memset(&zero, 0, sizeof(zero));
    good_grant(&g, "args/guard");

    EXPECT_EINVALID(lease_guarded_put(store, &g, "args/data", NULL, 5));
    EXPECT_EINVALID(lease_guarded_put(store, &g, "", "v", 1));
    EXPECT_EINVALID(lease_guarded_put(store, &g, NULL, "v", 1));
    EXPECT_EINVALID(lease_guarded_put(store, &g, name256, "v", 1));
    EXPECT_EINVALID(lease_guarded_put(store, &zero, "args/data", "v", 1));
    EXPECT_EINVALID(lease_guarded_put(store, NULL, "args/data", "v", 1));
    EXPECT_EINVALID(lease_guarded_put(NULL, &g, "args/data", "v", 1));

    EXPECT_EINVALID(lease_data_get(NULL, &len, &token, store, "args/data"));
    EXPECT_EINVALID(lease_data_get(&value, NULL, &token, store, "args/data"));
    EXPECT_EINVALID(lease_data_get(&value, &len, &token, store, ""));
    EXPECT_EINVALID(lease_data_get(&value, &len, &token, NULL, "args/data"));
    assert_null(value);
    assert_int_equal(len, 0);
    EXPECT_RC(LEASE_ENOTFOUND, lease_data_get(&value, &len, &token, store, "args/data"));
    free(value);

    txn_calls = 0;
    EXPECT_EINVALID(lease_guarded_txn(store, &g, NULL, NULL));
    EXPECT_EINVALID(lease_guarded_txn(store, &zero, count_txn, NULL));
    EXPECT_EINVALID(lease_guarded_txn(store, NULL, count_txn, NULL));
    EXPECT_EINVALID(lease_guarded_txn(NULL, &g, count_txn, NULL));
    assert_int_equal(txn_calls, 0);
    /* Well-formed, but nobody holds the key: lost, and cb not called. */
    EXPECT_RC(LEASE_ELOST, lease_guarded_txn(store, &g, count_txn, NULL));
    assert_int_equal(txn_calls, 0);
    assert_int_equal(count_keys("args/"), 0);
}

/* ---- the keeper ------------------------------------------------------- */

/* lease_keeper_start must refuse a grant (otherwise well formed, with a
 * deadline) that has this key, token and ttl. Returns 1 (after saying why)
 * when it does not, so that one test can report every case. */
static int keeper_start_accepts(const char *key, uint64_t token,
                                uint64_t ttl_ms, const char *what)
{
    lease_keeper *k = (lease_keeper *)&k;
    lease_grant g;
    int rc;

    good_grant(&g, "args/keep");
    strcpy(g.key, key);
    g.token = token;
    g.ttl_ms = ttl_ms;
    lease_error_clear();
    rc = lease_keeper_start(&k, store, &g, NULL);
    if (rc == 0) {
        /* Stop the keeper it wrongly started (without a release). */
        lease_keeper_stop(NULL, k, 0);
        print_error("lease_keeper_start accepted a grant with %s\n", what);
        return 1;
    }
    if (rc != LEASE_EINVALID || lease_errmsg()[0] == '\0' || k != NULL) {
        print_error("lease_keeper_start, grant with %s: %d (%s) '%s'\n", what,
                    rc, lease_error_name(rc), lease_errmsg());
        return 1;
    }
    return 0;
}

static void test_keeper_invalid(void **state)
{
    lease_keeper *k = (lease_keeper *)&k;
    lease_keeper_opts o = LEASE_KEEPER_OPTS_INIT;
    lease_grant g, zero;

    (void)state;
    memset(&zero, 0, sizeof(zero));
    good_grant(&g, "args/keep");
    g.ttl_ms = 1000;

    EXPECT_EINVALID(lease_keeper_start(NULL, store, &g, NULL));
    EXPECT_EINVALID(lease_keeper_start(&k, store, NULL, NULL));
    assert_null(k);
    k = (lease_keeper *)&k;
    EXPECT_EINVALID(lease_keeper_start(&k, NULL, &g, NULL));
    assert_null(k);
    k = (lease_keeper *)&k;
    EXPECT_EINVALID(lease_keeper_start(&k, store, &zero, NULL));
    assert_null(k);
    EXPECT_EINVALID(lease_keeper_start(&k, store, &zero, &o));

    o.renew_every_ms = 1000; /* == ttl */
    EXPECT_EINVALID(lease_keeper_start(&k, store, &g, &o));
    o.renew_every_ms = 5000; /* > ttl */
    EXPECT_EINVALID(lease_keeper_start(&k, store, &g, &o));
    o.renew_every_ms = UINT64_MAX;
    EXPECT_EINVALID(lease_keeper_start(&k, store, &g, &o));
    assert_null(k);

    o.renew_every_ms = 100;
    o.version = LEASE_KEEPER_OPTS_VERSION + 1;
    EXPECT_EINVALID(lease_keeper_start(&k, store, &g, &o));
    assert_null(k);

    /* A grant from lease_grant_init has no deadline: not keepable. */
    assert_int_equal(lease_grant_init(&g, "args/keep", OWNER_A, 7, 1000), 0);
    EXPECT_EINVALID(lease_keeper_start(&k, store, &g, NULL));
    assert_null(k);

    /* The read-only calls on no keeper. */
    assert_int_equal(lease_keeper_valid(NULL), 0);
    assert_int_equal(lease_keeper_remaining_ms(NULL), 0);
    assert_int_equal(lease_keeper_token(NULL), 0);
    assert_int_equal(lease_keeper_deadline_ns(NULL), 0);
    assert_int_equal(lease_keeper_state_get(NULL), LEASE_KEEPER_STOPPED);
    assert_int_equal(lease_keeper_stop(NULL, NULL, 1), 0);
    assert_int_equal(count_keys("args/"), 0);
}

/*
 * The grant's fields are checked as lease_renew() checks them: a keeper
 * must not start (second connection, thread) on a grant that its first
 * renewal will refuse, and report that later as a lost lease.
 */
static void test_keeper_grant_fields(void **state)
{
    lease_keeper *k = NULL;
    lease_grant bad;
    int bugs = 0;

    (void)state;
    bugs += keeper_start_accepts("", 7, 1000, "an empty key");
    bugs += keeper_start_accepts("args/keep", 0, 1000, "token 0");
    bugs += keeper_start_accepts("args/keep", (uint64_t)INT64_MAX + 1, 1000,
                                 "a token above 2^63-1");
    bugs += keeper_start_accepts("args/keep", 7, LEASE_TTL_MAX_DEFAULT_MS + 1,
                                 "a ttl above the store's cap");
    good_grant(&bad, "args/keep");
    strcpy(bad.owner, "not-an-owner");
    EXPECT_EINVALID(lease_keeper_start(&k, store, &bad, NULL));
    assert_null(k);
    assert_int_equal(count_keys("args/"), 0);
    if (bugs)
        fail_msg("lease_keeper_start accepted %d bad grant(s)", bugs);
}

/* ---- lease_default_store_url ------------------------------------------ */

typedef struct {
    const char *name;
    char *saved; /* NULL: was unset */
} saved_env;

static void env_save(saved_env *e, const char *name)
{
    const char *v = getenv(name);

    e->name = name;
    e->saved = v ? strdup(v) : NULL;
}

static void env_restore(saved_env *e)
{
    if (e->saved) {
        setenv(e->name, e->saved, 1);
        free(e->saved);
    } else {
        unsetenv(e->name);
    }
}

static void test_default_store_url(void **state)
{
    saved_env env[3];
    char buf[256];

    (void)state;
    env_save(&env[0], "LEASE_STORE");
    env_save(&env[1], "XDG_STATE_HOME");
    env_save(&env[2], "HOME");

    setenv("LEASE_STORE", "sqlite:///from/env.db", 1);
    setenv("XDG_STATE_HOME", "/x", 1);
    setenv("HOME", "/h", 1);
    EXPECT_RC(0, lease_default_store_url(buf, sizeof(buf)));
    assert_string_equal(buf, "sqlite:///from/env.db");

    unsetenv("LEASE_STORE");
    EXPECT_RC(0, lease_default_store_url(buf, sizeof(buf)));
    assert_string_equal(buf, "sqlite:///x/lease/lease.db");

    /* Empty LEASE_STORE counts as unset. */
    setenv("LEASE_STORE", "", 1);
    EXPECT_RC(0, lease_default_store_url(buf, sizeof(buf)));
    assert_string_equal(buf, "sqlite:///x/lease/lease.db");
    unsetenv("LEASE_STORE");

    unsetenv("XDG_STATE_HOME");
    EXPECT_RC(0, lease_default_store_url(buf, sizeof(buf)));
    assert_string_equal(buf, "sqlite:///h/.local/state/lease/lease.db");

    /* Exactly fits, and one byte short. */
    EXPECT_RC(0, lease_default_store_url(buf, strlen("sqlite:///h/.local/state/lease/lease.db") + 1));
    EXPECT_EINVALID(lease_default_store_url(buf, strlen("sqlite:///h/.local/state/lease/lease.db")));
    EXPECT_EINVALID(lease_default_store_url(buf, 5));
    EXPECT_EINVALID(lease_default_store_url(buf, 0));
    EXPECT_EINVALID(lease_default_store_url(NULL, sizeof(buf)));

    setenv("LEASE_STORE", "sqlite:///a/rather/long/path/to/the/lease.db", 1);
    EXPECT_EINVALID(lease_default_store_url(buf, 10));
    unsetenv("LEASE_STORE");

    unsetenv("HOME");
    EXPECT_RC(LEASE_ENOTFOUND, lease_default_store_url(buf, sizeof(buf)));

    env_restore(&env[0]);
    env_restore(&env[1]);
    env_restore(&env[2]);
}

/*
 * The default URL must name the file under the directory in the
 * environment, whatever characters that directory holds: '%' and '?' are
 * special in a URL and must come out escaped.
 */
/*
 * The default URL must name the file under the directory in the
 * environment, whatever characters that directory holds: '%' and '?' are
 * special in a URL and must come out escaped. Returns 1 (after saying why)
 * when it does not.
 */
static int default_url_wrong(const char *home)
{
    char buf[512], want[512];
    lease__url u;
    int bad;

    setenv("HOME", home, 1);
    EXPECT_RC(0, lease_default_store_url(buf, sizeof(buf)));
    snprintf(want, sizeof(want), "%s/.local/state/lease/lease.db", home);
    lease_error_clear();
    if (lease__url_parse(&u, buf) != 0) {
        print_error("HOME='%s': default URL '%s' does not parse: %s\n", home,
                    buf, lease_errmsg());
        return 1;
    }
    bad = strcmp(u.path, want) != 0 || u.nparams != 0;
    if (bad)
        print_error("HOME='%s': default URL '%s' names '%s' (%zu parameters), "
                    "want '%s'\n", home, buf, u.path, u.nparams, want);
    lease__url_free(&u);
    return bad;
}

static void test_default_store_url_escapes(void **state)
{
    saved_env env[3];
    int bugs = 0;

    (void)state;
    env_save(&env[0], "LEASE_STORE");
    env_save(&env[1], "XDG_STATE_HOME");
    env_save(&env[2], "HOME");
    unsetenv("LEASE_STORE");
    unsetenv("XDG_STATE_HOME");

    bugs += default_url_wrong("/home/plain");
    bugs += default_url_wrong("/home/with space");
    bugs += default_url_wrong("/home/100%");
    bugs += default_url_wrong("/home/a%41b");
    bugs += default_url_wrong("/home/what?now");

    env_restore(&env[0]);
    env_restore(&env[1]);
    env_restore(&env[2]);
    if (bugs)
        fail_msg("%d default URL(s) do not name the right file", bugs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        /* First, while the store is empty: nothing may be written. */
        cmocka_unit_test(test_acquire_invalid),
        cmocka_unit_test(test_inspect_list_invalid),
        cmocka_unit_test(test_renew_release_invalid),
        cmocka_unit_test(test_fence_invalid),
        cmocka_unit_test(test_guarded_invalid),
        cmocka_unit_test(test_keeper_invalid),
        cmocka_unit_test(test_keeper_grant_fields),
        cmocka_unit_test(test_open_invalid),
        cmocka_unit_test(test_open_unreachable),
        cmocka_unit_test(test_store_accessors),
        cmocka_unit_test(test_set_timeout),
        cmocka_unit_test(test_owner_new),
        cmocka_unit_test(test_owner_valid),
        cmocka_unit_test(test_owner_upper_case_stored_lower),
        cmocka_unit_test(test_boundaries_accepted),
        cmocka_unit_test(test_grant_init),
        cmocka_unit_test(test_default_store_url),
        cmocka_unit_test(test_default_store_url_escapes),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
