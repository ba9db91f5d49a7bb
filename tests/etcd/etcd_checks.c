/*
 * etcd_checks.c - checks of the etcd store and of src/util/util.c that need no
 * cmocka, driven by the scripts of this directory:
 *
 *   etcd_checks cloexec URL
 *       After an open, an acquire (a second one: the connection is reused),
 *       an inspect, a list and a release on a real etcd, every descriptor
 *       of the process is close-on-exec: a child of `lease run` inherits
 *       nothing of the store (issue 10, item 4).
 *
 *   etcd_checks parsers
 *       The local deadline of a ttl that a store answered (9e12 s and
 *       more) saturates instead of overflowing (issue 10, item 7;
 *       UBSan in the sanitizer build catches the overflow), and the
 *       duration and token parsers refuse what does not fit.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lease.h"
#include "lease_int.h"
#include "../fd_check.h"

static int failures;

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);          \
            fprintf(stderr, __VA_ARGS__);                                 \
            fputc('\n', stderr);                                          \
            failures++;                                                   \
        }                                                                 \
    } while (0)

static void bad_fd(int fd, const char *target, void *when)
{
    CHECK(0, "%s: fd %d (%s) is not close-on-exec", (const char *)when, fd, target);
}

/* Every descriptor above 2 that was not inherited has FD_CLOEXEC. */
static int check_fds(const char *when)
{
    int n = fd_check_cloexec(bad_fd, (void *)when);

    printf("%s: %d descriptors of the library checked\n", when, n);
    return n;
}

static int cloexec(const char *url)
{
    lease_store *s = NULL;
    lease_grant g;
    lease_info info, *list = NULL;
    size_t n = 0;
    char owner[LEASE_OWNER_BUFSZ];
    lease_acquire_opts o = LEASE_ACQUIRE_OPTS_INIT;
    int rc;

    fd_check_note();
    rc = lease_store_open(&s, url);
    CHECK(rc == 0, "open %s: %s", url, lease_errmsg());
    if (rc < 0)
        return 1;
    check_fds("after open");
    lease_owner_new(owner);
    o.owner = owner;
    o.ttl_ms = 10000;
    rc = lease_acquire(&g, NULL, s, "cloexec/k", &o);
    CHECK(rc == 0, "acquire: %s", lease_errmsg());
    rc = lease_acquire(&g, NULL, s, "cloexec/k", &o);
    CHECK(rc == 0, "acquire again: %s", lease_errmsg());
    /* The store's connection is open (keep-alive): it must be among them. */
    CHECK(check_fds("after acquire") >= 1, "after acquire: no descriptor of the library");
    CHECK(lease_inspect(&info, s, "cloexec/k") == 0, "inspect: %s", lease_errmsg());
    CHECK(lease_list(&list, &n, s, "cloexec/") == 0 && n == 1, "list: %s (%zu keys)",
          lease_errmsg(), n);
    lease_list_free(list);
    CHECK(lease_release(s, &g) == 0, "release: %s", lease_errmsg());
    check_fds("after inspect, list and release");
    lease_store_close(s);
    return failures ? 1 : 0;
}

static void duration_bad(const char *text)
{
    uint64_t ms = 0;

    CHECK(lease_parse_duration(&ms, text) == LEASE_EINVALID, "duration '%s' accepted", text);
}

static void token_bad(const char *text)
{
    uint64_t t = 0;

    CHECK(lease_parse_token(&t, text) == LEASE_EINVALID, "token '%s' accepted", text);
}

static int parsers(void)
{
    int64_t now = lease_clock_ns();
    uint64_t t = 0, ms = 0;
    static const char *const bad_durations[] = {
        "18446744073709551616ms", "307445734561825861m", "5124095576030432h",
        "18446744073709551615ms1ms", "-1s", "+1s", " 1s", "1s ", "1", "1x", "s",
        "1.5s", "0x10s", "1sm",
    };
    static const char *const bad_tokens[] = {
        "0", "-1", "9223372036854775808", "18446744073709551616", "1e3", " 1",
        "1 ", "+1", "", "00x", "99999999999999999999999",
    };
    size_t i;

    /* A ttl an etcd answer could carry, in ms: 9e12 s, and the most. */
    CHECK(lease__deadline_ns(now, 9000000000000ULL * 1000) > now,
          "deadline of a 9e12 s ttl is not in the future");
    CHECK(lease__deadline_ns(now, UINT64_MAX) > now + 4000000000000000000LL,
          "deadline of ttl UINT64_MAX ms is not far away");
    CHECK(lease__deadline_ns(INT64_MAX - 5, 1000) == INT64_MAX,
          "deadline near INT64_MAX does not saturate");
    CHECK(lease__deadline_ns(now, 1000) == now + 980000000,
          "deadline of 1 s: %lld", (long long)(lease__deadline_ns(now, 1000) - now));
    for (i = 0; i < sizeof(bad_durations) / sizeof(bad_durations[0]); i++)
        duration_bad(bad_durations[i]);
    CHECK(lease_parse_duration(&ms, "18446744073709551615ms") == 0 && ms == UINT64_MAX,
          "the largest duration");
    for (i = 0; i < sizeof(bad_tokens) / sizeof(bad_tokens[0]); i++)
        token_bad(bad_tokens[i]);
    CHECK(lease_parse_token(&t, "9223372036854775807") == 0 && t == INT64_MAX,
          "the largest token");
    CHECK(lease_parse_token(&t, "1") == 0 && t == 1, "the smallest token");
    CHECK(lease__check_name("key", "") == LEASE_EINVALID, "empty key");
    {
        char k[LEASE_KEY_MAX + 2];

        memset(k, 'k', sizeof(k) - 1);
        k[sizeof(k) - 1] = '\0';
        CHECK(lease__check_name("key", k) == LEASE_EINVALID, "key of 256 bytes");
        k[LEASE_KEY_MAX] = '\0';
        CHECK(lease__check_name("key", k) == 0, "key of 255 bytes");
    }
    printf("parsers: %d failures\n", failures);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "cloexec") == 0)
        return cloexec(argv[2]);
    if (argc == 2 && strcmp(argv[1], "parsers") == 0)
        return parsers();
    fprintf(stderr, "usage: etcd_checks cloexec URL | parsers\n");
    return 2;
}
