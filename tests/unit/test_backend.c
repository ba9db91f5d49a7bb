/*
 * test_backend.c - the core's side of the store interface, with tiny
 * in-memory stores (the real stores are tested against their servers by
 * tests/conformance):
 *  - a version-2 table, in memory that ends where version 2 ended, still
 *    registers and serves acquire, renew, release, inspect and list;
 *  - a version-3 store finds the core's part of its connection (redacted
 *    URL, timeout, ttl cap) filled when open3 runs, and a failed open3
 *    is not closed;
 *  - registration refuses a table whose features name a missing slot, or
 *    whose open slots do not match its version; the built-in tables pass;
 *  - list results come sorted by the core, whatever order the store walks;
 *  - `state` has one meaning, whatever the store could report.
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
#include "fake_slots.h"

#define A_OWNER "11111111-1111-4111-8111-111111111111"
#define B_OWNER "22222222-2222-4222-8222-222222222222"
#define MAX_KEYS 8

/*
 * One in-memory store shared by both fakes. Each key keeps what SQLite
 * keeps (owner until release, token forever); `forget_owner` makes inspect
 * answer like Redis and etcd, which lose the owner when a lease ends, and
 * then say EXPIRED themselves for a lease that ran out.
 */
typedef struct {
    char key[LEASE_KEY_MAX + 1];
    char owner[LEASE_OWNER_BUFSZ];
    uint64_t token;
    int64_t expires_ns;
    int released;
} fake_key;

static struct {
    fake_key keys[MAX_KEYS];
    size_t n;
    int forget_owner;
    int expired_flag;      /* the v3 fake reports EXPIRED itself */
    int garbage_state;     /* the v2 fake leaves junk where `state` is now */
    /* what open3 found in the core's part */
    char seen_redacted[128];
    uint64_t seen_timeout, seen_ttl_max;
    int open3_fail, closes;
} fake;

typedef struct {
    lease_store parent;
    int opened;
} fake_store;

static fake_key *find(const char *key)
{
    size_t i;

    for (i = 0; i < fake.n; i++)
        if (strcmp(fake.keys[i].key, key) == 0)
            return &fake.keys[i];
    return NULL;
}

static int live(const fake_key *k)
{
    return k->owner[0] && !k->released && k->expires_ns > lease_clock_ns();
}

static int fake_open(lease_store **out, const char *url, uint64_t timeout_ms)
{
    fake_store *s = calloc(1, sizeof(*s));

    (void)url;
    (void)timeout_ms;
    if (s == NULL)
        return LEASE_ENOMEM;
    *out = &s->parent;
    return 0;
}

static void fake_close_v2(lease_store *s)
{
    fake.closes++;
    free(s);
}

static int fake_open3(lease_store *base, const char *url)
{
    fake_store *s = (fake_store *)base;

    (void)url;
    lease__strlcpy(fake.seen_redacted, base->url_redacted ? base->url_redacted : "(null)",
                   sizeof(fake.seen_redacted));
    fake.seen_timeout = base->timeout_ms;
    fake.seen_ttl_max = base->ttl_max_ms;
    if (fake.open3_fail)
        return lease_store_seterr(LEASE_ESTORE, "cannot reach the fake");
    s->opened = 1;
    return 0;
}

static void fake_close_v3(lease_store *s)
{
    /* The core frees the struct: the fake only counts. */
    assert_int_equal(((fake_store *)s)->opened, 1);
    fake.closes++;
}

static int fake_acquire(lease_grant *out, lease_info *holder, lease_store *s,
                        const lease_request *req)
{
    fake_key *k = find(req->key);

    (void)s;
    if (k && live(k) && strcmp(k->owner, req->owner) != 0) {
        lease__strlcpy(holder->owner, k->owner, sizeof(holder->owner));
        holder->token = k->token;
        holder->held = 1;
        return LEASE_EBUSY;
    }
    if (k == NULL) {
        assert_true(fake.n < MAX_KEYS);
        k = &fake.keys[fake.n++];
        memset(k, 0, sizeof(*k));
        lease__strlcpy(k->key, req->key, sizeof(k->key));
    }
    if (!live(k) || strcmp(k->owner, req->owner) != 0)
        k->token++;
    lease__strlcpy(k->owner, req->owner, sizeof(k->owner));
    k->released = 0;
    k->expires_ns = lease_clock_ns() + (int64_t)req->ttl_ms * 1000000;
    out->token = k->token;
    out->ttl_ms = req->ttl_ms;
    return 0;
}

static int fake_renew(uint64_t *granted, lease_store *s, const char *key,
                      const char *owner, uint64_t token, uint64_t ttl_ms)
{
    fake_key *k = find(key);

    (void)s;
    if (k == NULL || !live(k) || strcmp(k->owner, owner) != 0 || k->token != token)
        return lease__not_holder("renew", key, token, NULL);
    k->expires_ns = lease_clock_ns() + (int64_t)ttl_ms * 1000000;
    *granted = ttl_ms;
    return 0;
}

static int fake_release(lease_store *s, const char *key, const char *owner,
                        uint64_t token)
{
    fake_key *k = find(key);

    (void)s;
    if (k == NULL || strcmp(k->owner, owner) != 0 || k->token != token)
        return lease__not_holder("release", key, token, NULL);
    k->owner[0] = '\0';
    k->released = 1;
    return 0;
}

static void fill(lease_info *out, const fake_key *k)
{
    memset(out, 0, offsetof(lease_info, state));
    lease__strlcpy(out->key, k->key, sizeof(out->key));
    out->token = k->token;
    out->held = live(k);
    if (out->held || !fake.forget_owner)
        lease__strlcpy(out->owner, k->owner, sizeof(out->owner));
    if (out->held) {
        int64_t left = k->expires_ns - lease_clock_ns();

        out->remaining_ms = (uint64_t)(left / 1000000);
        out->ttl_ms = 1000;
    }
}

static int fake_inspect(lease_info *out, lease_store *s, const char *key)
{
    fake_key *k = find(key);

    (void)s;
    if (k == NULL)
        return lease_store_seterr(LEASE_ENOTFOUND, "'%s' was never acquired", key);
    fill(out, k);
    if (fake.expired_flag && !out->held && !k->released)
        out->state = LEASE_STATE_EXPIRED;
    return 0;
}

/* Walks the keys backwards: the order the store keeps is not key order. */
static int fake_list(lease_store *s, const char *prefix, lease_list_cb cb, void *p)
{
    size_t i;
    int rc = 0;

    (void)s;
    for (i = fake.n; i-- > 0 && rc == 0;) {
        lease_info info;

        if (strncmp(fake.keys[i].key, prefix, strlen(prefix)) != 0)
            continue;
        fill(&info, &fake.keys[i]);
        info.state = LEASE_STATE_FREE;
        if (fake.garbage_state)
            info.state = LEASE_STATE_EXPIRED; /* not a field of its lease_info */
        else if (fake.expired_flag && !info.held && !fake.keys[i].released)
            info.state = LEASE_STATE_EXPIRED;
        rc = cb(&info, p);
    }
    return rc;
}

static int fake_txn(lease_store *s, const char *key, const char *owner, uint64_t token,
                    int (*cb)(void *native, void *payload), void *payload)
{
    (void)s;
    (void)key;
    (void)owner;
    (void)token;
    return cb(NULL, payload);
}

static int fake_wait(lease_store *s, const char *key, uint64_t timeout_ms)
{
    (void)s;
    (void)key;
    (void)timeout_ms;
    return LEASE_ETIMEOUT;
}

static int fake_renew_many(int *results, uint64_t *granted, lease_store *s,
                           const lease_grant *grants, size_t n, uint64_t ttl_ms)
{
    (void)results;
    (void)granted;
    (void)s;
    (void)grants;
    (void)n;
    (void)ttl_ms;
    return LEASE_ESTORE;
}

static int fake_share(lease_store *s, uint64_t ttl_ms)
{
    (void)s;
    (void)ttl_ms;
    return 0;
}

static int fake_advisory(lease_store *s, int64_t lock_key, int try_only,
                         int (*cb)(void *native, void *payload), void *payload)
{
    (void)s;
    (void)lock_key;
    (void)try_only;
    return cb(NULL, payload);
}

static const char *const v2_schemes[] = { "fakev2", NULL };
static const char *const v3_schemes[] = { "fakev3", NULL };

#define FAKE_SLOTS                                                              \
    .acquire = fake_acquire, .renew = fake_renew, .release = fake_release,      \
    .inspect = fake_inspect, .list = fake_list,                                 \
    .fence_advance = fake_fence_advance, .fence_mark = fake_fence_mark,         \
    .guarded_put = fake_guarded_put, .data_get = fake_data_get

static const lease_backend v2_table = {
    .version = 2, .name = "fakev2", .schemes = v2_schemes,
    .open = fake_open, .close = fake_close_v2, FAKE_SLOTS,
};

static const lease_backend v3_table = {
    .version = 3, .name = "fakev3", .schemes = v3_schemes,
    .store_size = sizeof(fake_store), .open3 = fake_open3, .close = fake_close_v3,
    FAKE_SLOTS,
};

/* Both fakes, registered once. The version-2 table lives as a store
 * built before version 3 has it: in memory that ends where version 2
 * ended, so that reading a version-3 slot would read past it
 * (AddressSanitizer says so). */
static int setup(void **state)
{
    static lease_backend *v2_copy;

    (void)state;
    memset(&fake, 0, sizeof(fake));
    if (v2_copy == NULL) {
        v2_copy = malloc(offsetof(lease_backend, store_size));
        assert_non_null(v2_copy);
        memcpy(v2_copy, &v2_table, offsetof(lease_backend, store_size));
        assert_int_equal(lease_backend_register(v2_copy), 0);
        assert_int_equal(lease_backend_register(&v3_table), 0);
    }
    return 0;
}

static lease_store *open_url(const char *url)
{
    lease_store *s = NULL;

    assert_int_equal(lease_store_open(&s, url), 0);
    assert_non_null(s);
    return s;
}

static lease_acquire_opts opts_for(const char *owner)
{
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;

    o.owner = owner;
    o.ttl_ms = 10000;
    return o;
}

static void test_v2_table_still_works(void **state)
{
    lease_store *s = open_url("fakev2://user:secret@host/x");
    lease_acquire_opts o = opts_for(A_OWNER);
    lease_grant ga, gb;
    lease_info info, *items;
    size_t n;

    (void)state;
    /* The core's part is filled after a version-2 open, as before. */
    assert_string_equal(lease_store_url_redacted(s), "fakev2://user:***@host/x");
    assert_string_equal(lease_store_scheme(s), "fakev2");
    assert_int_equal(lease_acquire(&gb, NULL, s, "b", &o), 0);
    assert_int_equal(lease_acquire(&ga, NULL, s, "a", &o), 0);
    assert_int_equal(ga.token, 1);
    assert_int_equal(lease_renew(&ga, s, 5000), 0);
    assert_int_equal(ga.ttl_ms, 5000);
    assert_int_equal(lease_inspect(&info, s, "a"), 0);
    assert_true(info.held);
    assert_int_equal(info.state, LEASE_STATE_HELD);
    assert_string_equal(info.owner, A_OWNER);

    /* The store passes a lease_info of the old size: what lies where
     * `state` is now is not the store's, and is not read. */
    fake.garbage_state = 1;
    assert_int_equal(lease_release(s, &gb), 0);
    assert_int_equal(lease_list(&items, &n, s, ""), 0);
    assert_int_equal(n, 2);
    assert_string_equal(items[0].key, "a");
    assert_int_equal(items[0].state, LEASE_STATE_HELD);
    assert_string_equal(items[1].key, "b");
    assert_int_equal(items[1].state, LEASE_STATE_FREE);
    lease_list_free(items);

    assert_int_equal(lease_release(s, &ga), 0);
    assert_int_equal(lease_release(s, &ga), LEASE_ELOST);
    assert_non_null(strstr(lease_errmsg(), "no longer the unexpired lease"));
    assert_int_equal(lease_inspect(&info, s, "a"), 0);
    assert_false(info.held);
    assert_int_equal(info.state, LEASE_STATE_FREE);
    lease_store_close(s);
    assert_int_equal(fake.closes, 1);
}

static void test_v3_open_sees_core_fields(void **state)
{
    lease_store *s = NULL;

    (void)state;
    assert_int_equal(lease_store_open_timeout(&s, "fakev3://u:pw@h/db", 1234), 0);
    assert_string_equal(fake.seen_redacted, "fakev3://u:***@h/db");
    assert_int_equal(fake.seen_timeout, 1234);
    assert_int_equal(fake.seen_ttl_max, LEASE_TTL_MAX_DEFAULT_MS);
    assert_ptr_equal(s->backend, &v3_table);
    lease_store_close(s);
    assert_int_equal(fake.closes, 1);

    /* A failed open3 cleaned up after itself: close is not called, and
     * the core frees what it allocated (ASan would see a leak). */
    fake.open3_fail = 1;
    s = (lease_store *)1;
    assert_int_equal(lease_store_open(&s, "fakev3://h"), LEASE_ESTORE);
    assert_null(s);
    assert_int_equal(fake.closes, 1);
    assert_non_null(strstr(lease_errmsg(), "cannot reach the fake"));
}

static void test_register_checks_features(void **state)
{
    static const char *const f_schemes[] = { "fakefeat", NULL };
    static const struct {
        unsigned int feature;
        const char *slot;
    } needs[] = {
        { LEASE_FEATURE_TXN, "guarded_txn" },
        { LEASE_FEATURE_NOTIFY, "wait_release" },
        { LEASE_FEATURE_RENEW_MANY, "renew_many" },
        { LEASE_FEATURE_ADVISORY, "advisory_txn" },
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(needs) / sizeof(needs[0]); i++) {
        lease_backend b = { .version = 3, .name = "fakefeat", .schemes = f_schemes,
                            .store_size = sizeof(fake_store), .open3 = fake_open3,
                            .close = fake_close_v3, FAKE_SLOTS };

        b.features = needs[i].feature;
        assert_int_equal(lease_backend_register(&b), LEASE_EINVALID);
        assert_non_null(strstr(lease_errmsg(), "feature"));
        /* With its slot the same table is sound (checked, not registered:
         * the registry is small). */
        b.guarded_txn = needs[i].feature == LEASE_FEATURE_TXN ? fake_txn : NULL;
        b.wait_release = needs[i].feature == LEASE_FEATURE_NOTIFY ? fake_wait : NULL;
        b.renew_many = needs[i].feature == LEASE_FEATURE_RENEW_MANY ? fake_renew_many : NULL;
        b.advisory_txn = needs[i].feature == LEASE_FEATURE_ADVISORY ? fake_advisory : NULL;
        assert_int_equal(lease__backend_check(&b), 0);
        (void)needs[i].slot;
    }
    {
        lease_backend b = v3_table;

        b.features = LEASE_FEATURE_ROUNDS_TTL; /* no slot needed */
        assert_int_equal(lease__backend_check(&b), 0);
        b.open3 = NULL;
        assert_int_equal(lease_backend_register(&b), LEASE_EINVALID);
        b.open3 = fake_open3;
        b.store_size = sizeof(lease_store) - 1;
        assert_int_equal(lease_backend_register(&b), LEASE_EINVALID);
        b.store_size = sizeof(fake_store);
        b.open = fake_open; /* a version-3 table opens with open3 only */
        assert_int_equal(lease_backend_register(&b), LEASE_EINVALID);
        b = v2_table;
        b.open = NULL;
        assert_int_equal(lease_backend_register(&b), LEASE_EINVALID);
        b = v3_table;
        b.version = LEASE_BACKEND_VERSION + 1;
        assert_int_equal(lease_backend_register(&b), LEASE_EINVALID);
        /* SHARED needs share_lease, a table of version 4, and renew_many. */
        b = v3_table;
        b.version = 4;
        b.features = LEASE_FEATURE_SHARED;
        b.share_lease = fake_share;
        assert_int_equal(lease_backend_register(&b), LEASE_EINVALID);
        b.renew_many = fake_renew_many;
        assert_int_equal(lease__backend_check(&b), 0);
        b.version = 3;
        assert_int_equal(lease_backend_register(&b), LEASE_EINVALID);
        b.version = 4;
        b.share_lease = NULL;
        assert_int_equal(lease_backend_register(&b), LEASE_EINVALID);
    }
    /* The built-in tables meet what registration asks of others. */
    for (i = 0; i < LEASE__NSTORES; i++)
        if (lease__stores[i].backend) {
            assert_int_equal(lease__backend_check(lease__stores[i].backend), 0);
            assert_int_equal(lease__stores[i].backend->version, LEASE_BACKEND_VERSION);
        }
}

static void test_list_sorted_by_core(void **state)
{
    static const char *const keys[] = { "m", "\xc3\xa9t\xc3\xa9", "a/2", "z", "a/10", "A" };
    static const char *const sorted[] = { "A", "a/10", "a/2", "m", "z", "\xc3\xa9t\xc3\xa9" };
    lease_store *s = open_url("fakev3://h");
    lease_acquire_opts o = opts_for(A_OWNER);
    lease_info *items;
    lease_grant g;
    size_t i, n;

    (void)state;
    for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        assert_int_equal(lease_acquire(&g, NULL, s, keys[i], &o), 0);
    /* The fake walks backwards from insertion order: "A", "a/10", "z"... */
    assert_int_equal(lease_list(&items, &n, s, ""), 0);
    assert_int_equal(n, 6);
    for (i = 0; i < n; i++)
        assert_string_equal(items[i].key, sorted[i]);
    lease_list_free(items);
    assert_int_equal(lease_list(&items, &n, s, "a/"), 0);
    assert_int_equal(n, 2);
    assert_string_equal(items[0].key, "a/10");
    assert_string_equal(items[1].key, "a/2");
    lease_list_free(items);
    lease_store_close(s);
}

/* Acquire "held", "expired" (a 30 ms lease left to run out) and
 * "released". */
static lease_store *three_states(void)
{
    lease_store *s = open_url("fakev3://h");
    lease_acquire_opts o = opts_for(A_OWNER);
    lease_grant g;

    assert_int_equal(lease_acquire(&g, NULL, s, "held", &o), 0);
    assert_int_equal(lease_acquire(&g, NULL, s, "released", &o), 0);
    assert_int_equal(lease_release(s, &g), 0);
    o.ttl_ms = 30;
    assert_int_equal(lease_acquire(&g, NULL, s, "expired", &o), 0);
    lease__sleep_ns(60 * 1000000);
    return s;
}

static void check_states(lease_store *s)
{
    static const struct {
        const char *key;
        lease_state state;
    } want[] = {
        { "expired", LEASE_STATE_EXPIRED },
        { "held", LEASE_STATE_HELD },
        { "released", LEASE_STATE_FREE },
    };
    lease_info info, *items;
    size_t i, n;

    assert_int_equal(lease_list(&items, &n, s, ""), 0);
    assert_int_equal(n, 3);
    for (i = 0; i < 3; i++) {
        assert_int_equal(lease_inspect(&info, s, want[i].key), 0);
        assert_int_equal(info.state, want[i].state);
        assert_int_equal(info.held, want[i].state == LEASE_STATE_HELD);
        assert_string_equal(items[i].key, want[i].key);
        assert_int_equal(items[i].state, want[i].state);
        assert_int_equal(items[i].held, want[i].state == LEASE_STATE_HELD);
    }
    lease_list_free(items);
}

/* A store that keeps the owner of a lease that ran out (SQLite,
 * PostgreSQL): the core tells expired from released by the owner. */
static void test_state_from_owner(void **state)
{
    lease_store *s = three_states();

    (void)state;
    check_states(s);
    lease_store_close(s);
}

/* A store that forgets the owner with the lease (Redis, etcd) says
 * EXPIRED itself; without that word the key would read free. */
static void test_state_from_store(void **state)
{
    lease_store *s = three_states();
    lease_info info;

    (void)state;
    fake.forget_owner = 1;
    fake.expired_flag = 1;
    check_states(s);
    fake.expired_flag = 0;
    assert_int_equal(lease_inspect(&info, s, "expired"), 0);
    assert_int_equal(info.state, LEASE_STATE_FREE);
    lease_store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_v2_table_still_works, setup),
        cmocka_unit_test_setup(test_v3_open_sees_core_fields, setup),
        cmocka_unit_test_setup(test_register_checks_features, setup),
        cmocka_unit_test_setup(test_list_sorted_by_core, setup),
        cmocka_unit_test_setup(test_state_from_owner, setup),
        cmocka_unit_test_setup(test_state_from_store, setup),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
