/*
 * test_net.c - lease__net_name_entry (src/util/net.c): what a store hands
 * libcurl as CURLOPT_RESOLVE for a name of its URL, and when it looks the
 * name up again. getaddrinfo() is this program's (it is linked ahead of
 * libc's): names ending in ".test" answer as the test says, with no
 * traffic; a fresh entry is made stale by setting its fresh_until to 0,
 * as a minute going by would.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "lease_int.h"

enum { ANSWER, HANG, NONAME, AGAIN, MEMORY };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int mode = ANSWER;
static const char *answer = "127.0.0.2";
static int lookups;  /* of .test names */
static int hanging;  /* lookups in HANG not let go yet */

typedef int (*gai_fn)(const char *, const char *, const struct addrinfo *,
                      struct addrinfo **);

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    gai_fn real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
    size_t n = node ? strlen(node) : 0;
    struct addrinfo h;
    struct timespec until;
    int m;

    if (n < 5 || strcmp(node + n - 5, ".test") != 0)
        return real(node, service, hints, res);
    if (hints && (hints->ai_flags & AI_NUMERICHOST))
        return EAI_NONAME;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10; /* bounded, should a test never let it go */
    pthread_mutex_lock(&mu);
    lookups++;
    m = mode;
    if (m == HANG) {
        hanging++;
        while (mode == HANG && pthread_cond_timedwait(&cv, &mu, &until) == 0)
            ;
        hanging--;
        m = mode == HANG ? NONAME : mode;
        pthread_cond_broadcast(&cv);
    }
    node = answer;
    pthread_mutex_unlock(&mu);
    if (m == NONAME)
        return EAI_NONAME;
    if (m == AGAIN)
        return EAI_AGAIN;
    if (m == MEMORY)
        return EAI_MEMORY;
    memset(&h, 0, sizeof(h));
    h.ai_socktype = SOCK_STREAM;
    h.ai_flags = AI_NUMERICHOST;
    return real(node, service, &h, res);
}

static lease_backend backend = { .name = "fake" };
static lease_store store = { .backend = &backend, .url_redacted = "fake://x",
                             .timeout_ms = 1000 };

static void set_mode(int m, const char *a)
{
    pthread_mutex_lock(&mu);
    mode = m;
    if (a)
        answer = a;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static int count(int *what)
{
    int v;

    pthread_mutex_lock(&mu);
    v = *what;
    pthread_mutex_unlock(&mu);
    return v;
}

/* Wait (bounded) for the hanging lookups to end, and a moment for their
 * thread to hand the answer over. */
static void let_go(int m, const char *a)
{
    struct timespec until, nap = { 0, 100 * 1000000 };

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    set_mode(m, a);
    pthread_mutex_lock(&mu);
    while (hanging > 0 && pthread_cond_timedwait(&cv, &mu, &until) == 0)
        ;
    assert_int_equal(hanging, 0);
    pthread_mutex_unlock(&mu);
    nanosleep(&nap, NULL);
}

static int entry_of(const char **e, lease__net_name *n, const char *authority)
{
    return lease__net_name_entry(e, n, &store, authority, lease_clock_ns() + 2000000000LL);
}

static void test_not_names(void **state)
{
    static const char *const bad[] = { "a.test:0", "a.test:65536", "a.test:12a", "a.test",
                                       ":80", "a.test:" };
    lease__net_name n = { NULL, 0 };
    const char *e = "x";
    char longer[400];
    size_t i;

    (void)state;
    /* Numeric addresses: nothing to look up, nothing for curl. */
    assert_int_equal(entry_of(&e, &n, "127.0.0.1:2379"), 0);
    assert_null(e);
    assert_int_equal(entry_of(&e, &n, "[::1]:2379"), 0);
    assert_null(e);
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(entry_of(&e, &n, bad[i]), LEASE_EINVALID);
        assert_null(e);
    }
    memset(longer, 'a', 300);
    strcpy(longer + 300, ".test:80");
    assert_int_equal(entry_of(&e, &n, longer), LEASE_EINVALID);
    assert_int_equal(count(&lookups), 0);
}

static void test_fresh_and_stale(void **state)
{
    lease__net_name n = { NULL, 0 };
    const char *e;
    int before;

    (void)state;
    set_mode(ANSWER, "127.0.0.2");
    assert_int_equal(entry_of(&e, &n, "stale.test:2379"), 0);
    assert_string_equal(e, "stale.test:2379:127.0.0.2");
    /* Fresh: no lookup. */
    before = count(&lookups);
    assert_int_equal(entry_of(&e, &n, "stale.test:2379"), 0);
    assert_string_equal(e, "stale.test:2379:127.0.0.2");
    assert_int_equal(count(&lookups), before);

    /* A minute later, the resolver hangs: the old addresses serve, and
     * the call does not wait for the lookup (its time, 20 s, is past the
     * hanging lookup's own 10 s: one that waited would see it end). */
    n.fresh_until = 0;
    set_mode(HANG, NULL);
    assert_int_equal(lease__net_name_entry(&e, &n, &store, "stale.test:2379",
                                           lease_clock_ns() + 20000000000LL), 0);
    assert_string_equal(e, "stale.test:2379:127.0.0.2");
    assert_int_equal(count(&hanging), 1);
    /* Its answer, late, is the next call's. */
    let_go(ANSWER, "127.0.0.3");
    before = count(&lookups);
    n.fresh_until = 0;
    assert_int_equal(entry_of(&e, &n, "stale.test:2379"), 0);
    assert_string_equal(e, "stale.test:2379:127.0.0.3");
    assert_int_equal(count(&lookups), before);

    /* A silent resolver (EAI_AGAIN): the old addresses serve, and it is
     * asked again a second later, not at every call. */
    n.fresh_until = 0;
    set_mode(AGAIN, NULL);
    assert_int_equal(entry_of(&e, &n, "stale.test:2379"), 0);
    assert_string_equal(e, "stale.test:2379:127.0.0.3");
    assert_true(n.fresh_until > lease_clock_ns());
    before = count(&lookups);
    assert_int_equal(entry_of(&e, &n, "stale.test:2379"), 0);
    assert_int_equal(count(&lookups), before);

    /* So does any failure of the lookup itself (here the resolver's
     * memory): it says nothing of the name. */
    n.fresh_until = 0;
    set_mode(MEMORY, NULL);
    assert_int_equal(entry_of(&e, &n, "stale.test:2379"), 0);
    assert_string_equal(e, "stale.test:2379:127.0.0.3");

    /* A name the resolver says is gone is gone. */
    n.fresh_until = 0;
    set_mode(NONAME, NULL);
    assert_int_equal(entry_of(&e, &n, "stale.test:2379"), LEASE_ESTORE);
    assert_null(e);
    assert_null(n.entry);
    assert_non_null(strstr(lease_errmsg(), "stale.test"));
    lease__net_name_clear(&n);
}

static void test_first_lookup(void **state)
{
    lease__net_name n = { NULL, 0 };
    const char *e = "x";

    (void)state;
    /* No old addresses: a lookup that hangs fails the call at its end. */
    set_mode(HANG, NULL);
    assert_int_equal(lease__net_name_entry(&e, &n, &store, "first.test:80",
                                           lease_clock_ns() + 100000000LL),
                     LEASE_ESTORE);
    assert_null(e);
    assert_non_null(strstr(lease_errmsg(), "gave no answer"));
    let_go(NONAME, NULL);

    /* IPv6 in brackets, as curl parses it. */
    set_mode(ANSWER, "::1");
    assert_int_equal(entry_of(&e, &n, "six.test:443"), 0);
    assert_string_equal(e, "six.test:443:[::1]");
    lease__net_name_clear(&n);
    assert_null(n.entry);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_not_names),
        cmocka_unit_test(test_fresh_and_stale),
        cmocka_unit_test(test_first_lookup),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
