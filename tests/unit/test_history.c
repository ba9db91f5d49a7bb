/*
 * test_history.c - the core's side of the grant history, with a scripted
 * in-memory backend (the stores' own behaviour is tested against real
 * servers by tests/conformance/history.c):
 *  - backends register with both history slots or neither;
 *  - a backend without them gets LEASE_EUNSUPPORTED, not a crash;
 *  - entries still marked held are judged by inspect: only the current
 *    unexpired lease of the same owner stays held;
 *  - a renew refused with LEASE_ELOST marks the grant lost and still
 *    reports the store's own message;
 *  - the caller's max bounds the answer.
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

/* What the scripted store answers. */
static struct {
    lease_history_entry entries[4];
    size_t n;
    lease_info info;       /* inspect's answer */
    int inspect_rc;
    int renew_rc;
    int lost_calls;
    uint64_t lost_token;
    size_t max_seen;
} fake;

typedef struct {
    lease_store parent;
} fake_store;

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

static void fake_close(lease_store *s)
{
    free(s);
}

static int fake_acquire(lease_grant *out, lease_info *holder, lease_store *s,
                        const lease_request *req)
{
    (void)holder;
    (void)s;
    out->token = 7;
    out->ttl_ms = req->ttl_ms;
    return 0;
}

static int fake_renew(uint64_t *granted, lease_store *s, const char *key,
                      const char *owner, uint64_t token, uint64_t ttl_ms)
{
    (void)s;
    (void)key;
    (void)owner;
    (void)token;
    *granted = ttl_ms;
    if (fake.renew_rc)
        return lease_store_seterr(fake.renew_rc, "the store's own reason");
    return 0;
}

static int fake_release(lease_store *s, const char *key, const char *owner,
                        uint64_t token)
{
    (void)s;
    (void)key;
    (void)owner;
    (void)token;
    return 0;
}

static int fake_inspect(lease_info *out, lease_store *s, const char *key)
{
    (void)s;
    (void)key;
    if (fake.inspect_rc)
        return lease_store_seterr(fake.inspect_rc, "inspect failed");
    *out = fake.info;
    return 0;
}

static int fake_list(lease_store *s, const char *prefix, lease_list_cb cb, void *p)
{
    (void)s;
    (void)prefix;
    (void)cb;
    (void)p;
    return 0;
}

static int fake_history(lease_history_entry *out, size_t *n, lease_store *s,
                        const char *key, size_t max)
{
    size_t i;

    (void)s;
    (void)key;
    fake.max_seen = max;
    for (i = 0; i < fake.n && i < max; i++)
        out[i] = fake.entries[i];
    *n = i;
    return 0;
}

static int fake_history_lost(lease_store *s, const char *key, const char *owner,
                             uint64_t token)
{
    (void)s;
    (void)key;
    (void)owner;
    fake.lost_calls++;
    fake.lost_token = token;
    /* Whatever the slot does to the thread's message must not leak out. */
    lease_store_seterr(LEASE_ESTORE, "history write failed");
    return LEASE_ESTORE;
}

static const char *const fake_schemes[] = { "fakehist", NULL };
static const char *const v1_schemes[] = { "fakev1", NULL };

#define FAKE_SLOTS                                                              \
    .open = fake_open, .close = fake_close, .acquire = fake_acquire,            \
    .renew = fake_renew, .release = fake_release, .inspect = fake_inspect,      \
    .list = fake_list, .fence_advance = fake_fence_advance,                     \
    .fence_mark = fake_fence_mark, .guarded_put = fake_guarded_put,             \
    .data_get = fake_data_get

static const lease_backend fake_backend = {
    .version = 2, .name = "fakehist", .schemes = fake_schemes, FAKE_SLOTS,
    .history = fake_history, .history_lost = fake_history_lost,
};

/* A store written against version 1: its struct ends before the history
 * slots, so the core must not read them whatever they hold (here they are
 * set, to show that the version decides). */
static const lease_backend v1_backend = {
    .version = 1, .name = "fakev1", .schemes = v1_schemes, FAKE_SLOTS,
    .history = fake_history, .history_lost = fake_history_lost,
};

static lease_history_entry entry(uint64_t token, const char *owner, lease_ended ended)
{
    lease_history_entry e;

    memset(&e, 0, sizeof(e));
    e.token = token;
    lease__strlcpy(e.owner, owner, sizeof(e.owner));
    e.acquired_ms = 1000 * (int64_t)token;
    e.ended = ended;
    return e;
}

static lease_store *open_fake(const char *url)
{
    lease_store *s = NULL;

    assert_int_equal(lease_store_open(&s, url), 0);
    return s;
}

static int setup(void **state)
{
    (void)state;
    memset(&fake, 0, sizeof(fake));
    return 0;
}

static void test_register_needs_both_slots(void **state)
{
    static const char *const half_schemes[] = { "fakehalf", NULL };
    lease_backend half = { .version = 2, .name = "fakehalf",
                           .schemes = half_schemes, FAKE_SLOTS,
                           .history = fake_history };
    lease_store *s = NULL;

    (void)state;
    assert_int_equal(lease_backend_register(&half), LEASE_EINVALID);
    assert_non_null(strstr(lease_errmsg(), "history"));
    assert_int_equal(lease_store_open(&s, "fakehalf:x"), LEASE_EINVALID);
    half.history = NULL;
    half.history_lost = fake_history_lost;
    assert_int_equal(lease_backend_register(&half), LEASE_EINVALID);
}

static void test_v1_store_unsupported(void **state)
{
    lease_history_entry *h = (void *)1;
    lease_store *s = open_fake("fakev1:x");
    size_t n = 9;

    (void)state;
    assert_int_equal(lease_history(&h, &n, s, "k", 0), LEASE_EUNSUPPORTED);
    assert_null(h);
    assert_int_equal(n, 0);
    assert_non_null(strstr(lease_errmsg(), "fakev1"));
    /* ...and a refused renew does not reach for history_lost either. */
    {
        lease_grant g;

        assert_int_equal(lease_grant_init(&g, "k", A_OWNER, 7, 1000), 0);
        fake.renew_rc = LEASE_ELOST;
        assert_int_equal(lease_renew(&g, s, 0), LEASE_ELOST);
        assert_int_equal(fake.lost_calls, 0);
    }
    lease_store_close(s);
}

/* Held entries: the current lease of the same owner stays held; an older
 * token, another owner's entry or a lease that expired becomes expired. */
static void test_held_judged_by_inspect(void **state)
{
    lease_history_entry *h = NULL;
    lease_store *s = open_fake("fakehist:x");
    size_t n = 0;

    (void)state;
    fake.entries[0] = entry(9, A_OWNER, LEASE_ENDED_HELD);
    fake.entries[1] = entry(8, B_OWNER, LEASE_ENDED_HELD);
    fake.entries[2] = entry(7, A_OWNER, LEASE_ENDED_RELEASED);
    fake.n = 3;
    fake.info.held = 1;
    fake.info.token = 9;
    lease__strlcpy(fake.info.owner, A_OWNER, sizeof(fake.info.owner));
    assert_int_equal(lease_history(&h, &n, s, "k", 0), 0);
    assert_int_equal(n, 3);
    assert_int_equal(h[0].ended, LEASE_ENDED_HELD);
    assert_int_equal(h[1].ended, LEASE_ENDED_EXPIRED);
    assert_int_equal(h[2].ended, LEASE_ENDED_RELEASED);
    lease_history_free(h);

    /* The same token, but the lease ran out: expired. */
    fake.info.held = 0;
    assert_int_equal(lease_history(&h, &n, s, "k", 0), 0);
    assert_int_equal(h[0].ended, LEASE_ENDED_EXPIRED);
    lease_history_free(h);

    /* Held by the same token but another owner (cannot happen in a sound
     * store; the core still does not call it held). */
    fake.info.held = 1;
    lease__strlcpy(fake.info.owner, B_OWNER, sizeof(fake.info.owner));
    assert_int_equal(lease_history(&h, &n, s, "k", 0), 0);
    assert_int_equal(h[0].ended, LEASE_ENDED_EXPIRED);
    lease_history_free(h);
    lease_store_close(s);
}

/* When inspect fails, the history is not guessed at: the error is returned. */
static void test_inspect_failure_is_reported(void **state)
{
    lease_history_entry *h = (void *)1;
    lease_store *s = open_fake("fakehist:x");
    size_t n = 5;

    (void)state;
    fake.entries[0] = entry(3, A_OWNER, LEASE_ENDED_HELD);
    fake.n = 1;
    fake.inspect_rc = LEASE_ESTORE;
    assert_int_equal(lease_history(&h, &n, s, "k", 0), LEASE_ESTORE);
    assert_null(h);
    assert_int_equal(n, 0);
    lease_store_close(s);
}

/* max bounds the answer, newest first; 0 asks for all a store keeps. */
static void test_max_bounds_the_answer(void **state)
{
    lease_history_entry *h = NULL;
    lease_store *s = open_fake("fakehist:x");
    size_t n = 0;

    (void)state;
    fake.entries[0] = entry(3, A_OWNER, LEASE_ENDED_RELEASED);
    fake.entries[1] = entry(2, A_OWNER, LEASE_ENDED_LOST);
    fake.entries[2] = entry(1, A_OWNER, LEASE_ENDED_EXPIRED);
    fake.n = 3;
    fake.info.token = 3;
    assert_int_equal(lease_history(&h, &n, s, "k", 2), 0);
    assert_int_equal(fake.max_seen, 2);
    assert_int_equal(n, 2);
    assert_int_equal(h[0].token, 3);
    assert_int_equal(h[1].token, 2);
    lease_history_free(h);
    assert_int_equal(lease_history(&h, &n, s, "k", 0), 0);
    assert_true(fake.max_seen >= LEASE_HISTORY_KEEP);
    assert_int_equal(n, 3);
    /* Ended entries are reported as the store recorded them. */
    assert_int_equal(h[0].ended, LEASE_ENDED_RELEASED);
    assert_int_equal(h[1].ended, LEASE_ENDED_LOST);
    assert_int_equal(h[2].ended, LEASE_ENDED_EXPIRED);
    lease_history_free(h);
    lease_store_close(s);
}

/* inspect runs before the read: a grant newer than the lease it saw (made
 * in between) stays held, and with no lease at all nothing is held. */
static void test_newer_than_inspect_stays_held(void **state)
{
    lease_history_entry *h = NULL;
    lease_store *s = open_fake("fakehist:x");
    size_t n = 0;

    (void)state;
    fake.entries[0] = entry(10, B_OWNER, LEASE_ENDED_HELD);
    fake.entries[1] = entry(9, A_OWNER, LEASE_ENDED_HELD);
    fake.n = 2;
    fake.info.held = 0; /* inspect saw token 9 expired */
    fake.info.token = 9;
    lease__strlcpy(fake.info.owner, A_OWNER, sizeof(fake.info.owner));
    assert_int_equal(lease_history(&h, &n, s, "k", 0), 0);
    assert_int_equal(n, 2);
    assert_int_equal(h[0].ended, LEASE_ENDED_HELD);
    assert_int_equal(h[1].ended, LEASE_ENDED_EXPIRED);
    lease_history_free(h);

    fake.inspect_rc = LEASE_ENOTFOUND;
    assert_int_equal(lease_history(&h, &n, s, "k", 0), 0);
    assert_int_equal(h[0].ended, LEASE_ENDED_EXPIRED);
    assert_int_equal(h[1].ended, LEASE_ENDED_EXPIRED);
    lease_history_free(h);
    lease_store_close(s);
}

/* A refused renew marks the grant lost, and the caller still sees the
 * store's reason for the refusal, not the history slot's. */
static void test_refused_renew_marks_lost(void **state)
{
    lease_store *s = open_fake("fakehist:x");
    lease_grant g;

    (void)state;
    assert_int_equal(lease_grant_init(&g, "k", A_OWNER, 7, 1000), 0);
    assert_int_equal(lease_renew(&g, s, 0), 0);
    assert_int_equal(fake.lost_calls, 0);
    fake.renew_rc = LEASE_ESTORE; /* uncertain is not lost */
    assert_int_equal(lease_renew(&g, s, 0), LEASE_ESTORE);
    assert_int_equal(fake.lost_calls, 0);
    fake.renew_rc = LEASE_ELOST;
    assert_int_equal(lease_renew(&g, s, 0), LEASE_ELOST);
    assert_int_equal(fake.lost_calls, 1);
    assert_int_equal(fake.lost_token, 7);
    assert_string_equal(lease_errmsg(), "the store's own reason");
    assert_int_equal(lease_errcode(), LEASE_ELOST);
    lease_store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_register_needs_both_slots, setup),
        cmocka_unit_test_setup(test_v1_store_unsupported, setup),
        cmocka_unit_test_setup(test_held_judged_by_inspect, setup),
        cmocka_unit_test_setup(test_inspect_failure_is_reported, setup),
        cmocka_unit_test_setup(test_max_bounds_the_answer, setup),
        cmocka_unit_test_setup(test_newer_than_inspect_stays_held, setup),
        cmocka_unit_test_setup(test_refused_renew_marks_lost, setup),
    };

    lease_log_set(NULL, NULL, LEASE_LOG_OFF);
    if (lease_backend_register(&fake_backend) != 0 ||
        lease_backend_register(&v1_backend) != 0) {
        fprintf(stderr, "register: %s\n", lease_errmsg());
        return 1;
    }
    return cmocka_run_group_tests_name("unit_history", tests, NULL, NULL);
}
