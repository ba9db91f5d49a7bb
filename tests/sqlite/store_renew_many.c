/*
 * store_renew_many.c - a store's renew_many slot against a real store: every
 * grant of a batch answered as renew would answer it, in one call.
 *
 * The slot is internal (the core does not call it yet), so the test reaches
 * it through the backend table: include/lease/sys/store.h is public and a
 * lease_store starts with its `backend`. The same program runs on SQLite
 * (tests/sqlite) and PostgreSQL (tests/pg builds it from here).
 *
 * One batch mixes grants that must be renewed (some with hostile keys: a
 * quote, a backslash, a byte that is not UTF-8) with one of each refusal:
 * a wrong token, a released lease, an expired one, another owner's, a key
 * never acquired. Refused grants must read LEASE_ELOST and leave their key
 * as it was; renewed ones must have moved their expiry (renewed to a ttl
 * longer than they were acquired with, so remaining_ms shows it). Then a
 * key sent twice in one batch, and 1000 grants in one call. On PostgreSQL,
 * a grant whose row a guarded transaction holds locked past the call's
 * bound comes back uncertain (LEASE_ESTORE) while the rest of its batch is
 * renewed, and one whose row is locked for a moment (as a competitor's
 * acquire locks it) is renewed once the lock goes.
 *
 * usage: store_renew_many URL
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lease.h"
#include "lease/sys/store.h"

#include "../check.h"

#define FATAL(...)                                                             \
    do {                                                                       \
        fprintf(stderr, "FATAL: ");                                            \
        fprintf(stderr, __VA_ARGS__);                                          \
        fprintf(stderr, " (last error: %s)\n", lease_errmsg());                \
        exit(1);                                                               \
    } while (0)

#define TTL_ACQUIRE 10000u /* what the keys are taken with */
#define TTL_RENEW 60000u   /* what renew_many asks: remaining_ms shows it */
#define TTL_SHORT 300u     /* the grant left to expire */
#define NKEYS 50
#define NBIG 1000

/* What a refused grant's key must still be after the batch. */
enum { RENEWED, WRONG_TOKEN, RELEASED, EXPIRED, OTHER_OWNER, NEVER };

static const char *const kind_name[] = { "renewed", "wrong token", "released",
                                         "expired", "other owner", "never acquired" };

static char prefix[32];

static void key_name(char *out, size_t size, const char *part, size_t i)
{
    /* A few keys JSON and SQL must carry as they are. */
    static const char *const odd[] = { "\"quoted\"", "back\\slash", "bad\xff-utf8",
                                       "it's", "%_like" };

    if (i < sizeof(odd) / sizeof(odd[0]))
        snprintf(out, size, "%s%s-%s", prefix, part, odd[i]);
    else
        snprintf(out, size, "%s%s-%04zu", prefix, part, i);
}

static void acquire(lease_grant *g, lease_store *s, const char *key,
                    const char *owner, uint64_t ttl_ms)
{
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;

    o.owner = owner;
    o.ttl_ms = ttl_ms;
    if (lease_acquire(g, NULL, s, key, &o) != 0)
        FATAL("acquire '%s'", key);
}

static lease_info inspect(lease_store *s, const char *key)
{
    lease_info info;
    int rc = lease_inspect(&info, s, key);

    if (rc == LEASE_ENOTFOUND) {
        memset(&info, 0, sizeof(info));
        return info;
    }
    if (rc != 0)
        FATAL("inspect '%s'", key);
    return info;
}

/* Wait, bounded, until the store says `key` is no longer held. */
static void wait_expired(lease_store *s, const char *key)
{
    struct timespec pause = { 0, 50 * 1000000L };
    int i;

    for (i = 0; i < 200; i++) {
        if (!inspect(s, key).held)
            return;
        nanosleep(&pause, NULL);
    }
    FATAL("'%s' still held 10 s after a %u ms lease", key, TTL_SHORT);
}

static int call_renew_many(int *results, uint64_t *granted, lease_store *s,
                           const lease_grant *grants, size_t n, uint64_t ttl_ms)
{
    const lease_backend *b = s->backend;

    if (b->renew_many == NULL || !(b->features & LEASE_FEATURE_RENEW_MANY))
        FATAL("store %s has no renew_many", b->name);
    return b->renew_many(results, granted, s, grants, n, ttl_ms);
}

/* The ttl renew_many granted: exactly what was asked, unless the store
 * says it rounds ttls up. */
static int granted_ok(const lease_store *s, uint64_t granted)
{
    if (s->backend->features & LEASE_FEATURE_ROUNDS_TTL)
        return granted >= TTL_RENEW;
    return granted == TTL_RENEW;
}

/* Build the mixed batch: kinds[i] says what grants[i] is. */
static void mixed_batch(lease_grant *grants, int *kinds, lease_info *before,
                        lease_store *s, const char *a, const char *b)
{
    char key[LEASE_KEY_MAX + 1];
    size_t i;

    for (i = 0; i < NKEYS; i++) {
        kinds[i] = i < NKEYS - 5 ? RENEWED : (int)(i - (NKEYS - 5)) + WRONG_TOKEN;
        key_name(key, sizeof(key), "mix", i);
        switch (kinds[i]) {
        case RENEWED:
            acquire(&grants[i], s, key, a, TTL_ACQUIRE);
            break;
        case WRONG_TOKEN:
            acquire(&grants[i], s, key, a, TTL_ACQUIRE);
            grants[i].token++;
            break;
        case RELEASED:
            acquire(&grants[i], s, key, a, TTL_ACQUIRE);
            if (lease_release(s, &grants[i]) != 0)
                FATAL("release '%s'", key);
            break;
        case EXPIRED:
            acquire(&grants[i], s, key, a, TTL_SHORT);
            break;
        case OTHER_OWNER: /* b holds it; a presents b's token */
            acquire(&grants[i], s, key, b, TTL_ACQUIRE);
            snprintf(grants[i].owner, sizeof(grants[i].owner), "%s", a);
            break;
        default: /* never acquired: a made-up grant */
            memset(&grants[i], 0, sizeof(grants[i]));
            snprintf(grants[i].key, sizeof(grants[i].key), "%s", key);
            snprintf(grants[i].owner, sizeof(grants[i].owner), "%s", a);
            grants[i].token = 1;
            break;
        }
    }
    for (i = 0; i < NKEYS; i++)
        if (kinds[i] == EXPIRED)
            wait_expired(s, grants[i].key);
    for (i = 0; i < NKEYS; i++)
        before[i] = inspect(s, grants[i].key);
}

/* A refused grant's key is as it was: same holder, token, state, and an
 * expiry that did not move (remaining_ms can only have shrunk). */
static void check_unchanged(const lease_info *was, const lease_info *now, int kind)
{
    const char *what = kind_name[kind];

    CHECK(now->held == was->held && now->state == was->state,
          "%s '%s': state changed (%d -> %d)", what, was->key, was->state, now->state);
    CHECK(now->token == was->token, "%s '%s': token changed", what, was->key);
    CHECK(strcmp(now->owner, was->owner) == 0, "%s '%s': owner changed", what,
          was->key);
    CHECK(now->remaining_ms <= was->remaining_ms && now->remaining_ms <= TTL_ACQUIRE,
          "%s '%s': expiry moved (%" PRIu64 " -> %" PRIu64 " ms)", what, was->key,
          was->remaining_ms, now->remaining_ms);
}

static void test_mixed(lease_store *s, const char *a, const char *b)
{
    lease_grant grants[NKEYS];
    lease_info before[NKEYS], now;
    int kinds[NKEYS], results[NKEYS];
    uint64_t granted[NKEYS];
    size_t i;
    int rc;

    mixed_batch(grants, kinds, before, s, a, b);
    rc = call_renew_many(results, granted, s, grants, NKEYS, TTL_RENEW);
    CHECK(rc == 0, "mixed batch: renew_many returned %s", lease_error_name(rc));
    if (rc != 0)
        return;
    for (i = 0; i < NKEYS; i++) {
        now = inspect(s, grants[i].key);
        if (kinds[i] == RENEWED) {
            CHECK(results[i] == 0, "'%s': expected renewed, got %s", grants[i].key,
                  lease_error_name(results[i]));
            CHECK(granted_ok(s, granted[i]), "'%s': granted %" PRIu64 " ms",
                  grants[i].key, granted[i]);
            CHECK(now.held && now.token == grants[i].token &&
                      now.remaining_ms > TTL_ACQUIRE,
                  "'%s': renewed but its expiry did not move (%" PRIu64 " ms left)",
                  grants[i].key, now.remaining_ms);
            continue;
        }
        CHECK(results[i] == LEASE_ELOST, "%s '%s': expected ELOST, got %s",
              kind_name[kinds[i]], grants[i].key, lease_error_name(results[i]));
        check_unchanged(&before[i], &now, kinds[i]);
    }
}

/* A key sent twice (a session never does; it must not break the call). */
static void test_duplicate(lease_store *s, const char *a)
{
    lease_grant grants[3];
    int results[3];
    uint64_t granted[3];
    char key[LEASE_KEY_MAX + 1];
    int rc;

    key_name(key, sizeof(key), "dup", 99);
    acquire(&grants[0], s, key, a, TTL_ACQUIRE);
    grants[1] = grants[0];
    grants[2] = grants[0];
    grants[2].token++;
    rc = call_renew_many(results, granted, s, grants, 3, TTL_RENEW);
    CHECK(rc == 0, "duplicate key: renew_many returned %s", lease_error_name(rc));
    if (rc != 0)
        return;
    CHECK(results[0] == 0 && results[1] == 0,
          "duplicate key: both copies must be renewed (%s, %s)",
          lease_error_name(results[0]), lease_error_name(results[1]));
    CHECK(results[2] == LEASE_ELOST, "duplicate key, wrong token: got %s",
          lease_error_name(results[2]));
    CHECK(inspect(s, key).remaining_ms > TTL_ACQUIRE, "duplicate key: not renewed");
}

/* 1000 grants in one call, one of them refused. */
static void test_big(lease_store *s, const char *a)
{
    lease_grant *grants = calloc(NBIG, sizeof(*grants));
    int *results = calloc(NBIG, sizeof(*results));
    uint64_t *granted = calloc(NBIG, sizeof(*granted));
    char key[LEASE_KEY_MAX + 1], big_prefix[64];
    lease_info *list = NULL;
    size_t i, count = 0, renewed = 0;
    int rc;

    if (grants == NULL || results == NULL || granted == NULL)
        FATAL("out of memory");
    for (i = 0; i < NBIG; i++) {
        key_name(key, sizeof(key), "big", i);
        acquire(&grants[i], s, key, a, TTL_ACQUIRE);
    }
    grants[NBIG / 2].token++;
    rc = call_renew_many(results, granted, s, grants, NBIG, TTL_RENEW);
    CHECK(rc == 0, "%d grants: renew_many returned %s", NBIG, lease_error_name(rc));
    for (i = 0; rc == 0 && i < NBIG; i++)
        CHECK(results[i] == (i == NBIG / 2 ? LEASE_ELOST : 0) &&
                  (results[i] != 0 || granted_ok(s, granted[i])),
              "%d grants: '%s' got %s", NBIG, grants[i].key,
              lease_error_name(results[i]));
    snprintf(big_prefix, sizeof(big_prefix), "%sbig-", prefix);
    if (lease_list(&list, &count, s, big_prefix) != 0)
        FATAL("list");
    for (i = 0; i < count; i++)
        renewed += list[i].held && list[i].remaining_ms > TTL_ACQUIRE;
    CHECK(count == NBIG && renewed == NBIG - 1,
          "%d grants: %zu keys listed, %zu renewed (expected %d)", NBIG, count,
          renewed, NBIG - 1);
    lease_list_free(list);
    free(grants);
    free(results);
    free(granted);
}

/* PostgreSQL: renew_many over a second connection, from inside a guarded
 * transaction that holds the first grant's row FOR UPDATE. */
typedef struct {
    lease_store *other;
    lease_grant *grants;
    int results[3];
    uint64_t granted[3];
    int rc;
} locked_call;

static int renew_while_locked(void *native, void *payload)
{
    locked_call *c = payload;

    (void)native;
    c->rc = call_renew_many(c->results, c->granted, c->other, c->grants, 3,
                            TTL_RENEW);
    return 0;
}

static void test_locked_row(lease_store *s, const char *url, const char *a)
{
    lease_grant grants[3];
    char key[LEASE_KEY_MAX + 1];
    locked_call c;
    size_t i;
    int rc;

    memset(&c, 0, sizeof(c));
    for (i = 0; i < 3; i++) {
        snprintf(key, sizeof(key), "%slocked-%zu", prefix, i);
        acquire(&grants[i], s, key, a, TTL_ACQUIRE);
    }
    /* The batch waits for the lock within its bound, here held by this
     * very thread until the call gives up: 2 s. */
    if (lease_store_open(&c.other, url) != 0 ||
        lease_store_set_timeout(c.other, 2000) != 0)
        FATAL("open a second connection");
    c.grants = grants;
    rc = lease_guarded_txn(s, &grants[0], renew_while_locked, &c);
    CHECK(rc == 0, "guarded txn: %s", lease_error_name(rc));
    CHECK(c.rc == 0, "locked row: renew_many returned %s", lease_error_name(c.rc));
    CHECK(c.results[0] == LEASE_ESTORE, "locked row: got %s, not uncertain",
          lease_error_name(c.results[0]));
    for (i = 1; i < 3; i++)
        CHECK(c.results[i] == 0 && granted_ok(s, c.granted[i]),
              "locked row: the unlocked '%s' got %s", grants[i].key,
              lease_error_name(c.results[i]));
    CHECK(inspect(s, grants[1].key).remaining_ms > TTL_ACQUIRE,
          "locked row: the unlocked grant was not renewed");
    lease_store_close(c.other);
}

/* A guarded transaction on another thread holds the first grant's row for
 * 300 ms, as a competitor's acquire holds it for a moment; renew_many,
 * started while it does, renews it too once the lock goes. */
typedef struct {
    lease_store *s;
    lease_grant *g;
    atomic_int locked;
    int rc;
} brief_lock;

static int hold_briefly(void *native, void *payload)
{
    brief_lock *b = payload;
    struct timespec ts = { 0, 300 * 1000000L };

    (void)native;
    atomic_store(&b->locked, 1);
    nanosleep(&ts, NULL);
    return 0;
}

static void *brief_locker(void *arg)
{
    brief_lock *b = arg;

    b->rc = lease_guarded_txn(b->s, b->g, hold_briefly, b);
    return NULL;
}

static void test_brief_lock(lease_store *s, const char *url, const char *a)
{
    lease_grant grants[2];
    char key[LEASE_KEY_MAX + 1];
    lease_store *other = NULL;
    int results[2];
    uint64_t granted[2];
    brief_lock b;
    pthread_t t;
    size_t i;
    int rc, n;

    for (i = 0; i < 2; i++) {
        snprintf(key, sizeof(key), "%sbrief-%zu", prefix, i);
        acquire(&grants[i], s, key, a, TTL_ACQUIRE);
    }
    if (lease_store_open(&other, url) != 0)
        FATAL("open a second connection");
    memset(&b, 0, sizeof(b));
    b.s = s;
    b.g = &grants[0];
    if (pthread_create(&t, NULL, brief_locker, &b) != 0)
        FATAL("thread");
    for (n = 0; n < 5000 && !atomic_load(&b.locked); n++) {
        struct timespec ts = { 0, 1000000L };
        nanosleep(&ts, NULL);
    }
    rc = call_renew_many(results, granted, other, grants, 2, TTL_RENEW);
    pthread_join(t, NULL);
    CHECK(b.rc == 0, "brief lock: guarded txn: %s", lease_error_name(b.rc));
    CHECK(rc == 0, "brief lock: renew_many returned %s", lease_error_name(rc));
    for (i = 0; rc == 0 && i < 2; i++)
        CHECK(results[i] == 0 && granted_ok(s, granted[i]),
              "brief lock: '%s' got %s, not renewed", grants[i].key,
              lease_error_name(results[i]));
    CHECK(inspect(s, grants[0].key).remaining_ms > TTL_ACQUIRE,
          "brief lock: the briefly locked grant was not renewed");
    lease_store_close(other);
}

int main(int argc, char **argv)
{
    char a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_store *s = NULL;

    if (argc != 2) {
        fprintf(stderr, "usage: store_renew_many URL\n");
        return 2;
    }
    if (lease_store_open(&s, argv[1]) != 0)
        FATAL("open the store");
    if (lease_owner_new(a) != 0 || lease_owner_new(b) != 0)
        FATAL("owner");
    /* Keys of this run only: the database may be shared with other runs. */
    snprintf(prefix, sizeof(prefix), "rmany-%.8s-", a);
    test_mixed(s, a, b);
    test_duplicate(s, a);
    test_big(s, a);
    if (strcmp(s->backend->name, "postgres") == 0)
        test_locked_row(s, argv[1], a);
    if (strcmp(s->backend->name, "postgres") == 0)
        test_brief_lock(s, argv[1], a);
    if (failures == 0)
        printf("renew_many on %s: all checks passed\n", s->backend->name);
    lease_store_close(s);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    return 0;
}
