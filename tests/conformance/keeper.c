/*
 * keeper.c - the keeper against a real store: background renewal, release
 * on stop, and a paused holder that comes back fenced.
 *
 *     lease_keeper_test URL        or    LEASE_TEST_STORE=URL lease_keeper_test
 *
 * Public API only, so it runs unchanged against every store. Renewal
 * failures (ESTORE from the store) cannot be injected generically; the CLI
 * tests cover them on SQLite.
 */
#include <stdatomic.h>

#include "conf_util.h"

struct lost_probe {
    atomic_int fired;
    atomic_int reason;
    int fd; /* >= 0: also write the reason there (a forked holder) */
};

static void on_lost(lease_keeper *k, int reason, void *payload)
{
    struct lost_probe *p = payload;

    (void)k;
    atomic_store(&p->reason, reason);
    atomic_fetch_add(&p->fired, 1);
    if (p->fd >= 0)
        conf_write_full(p->fd, &reason, sizeof(reason));
}

/* (a) A keeper renews in the background: after three ttls the lease is
 * still held with the same token, and stop(release=1) ends it. The ttl
 * (1 s) leaves room for the keeper's own connection, which the keeper
 * opens before its first renewal: on a loaded machine under ASan that
 * alone has taken longer than 300 ms. */
static void test_keeper_renews_and_releases(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    lease_keeper_opts ko = LEASE_KEEPER_OPTS_INIT;
    struct lost_probe p;
    lease_keeper *k = NULL;
    lease_store *s = NULL;
    lease_grant g, last;
    lease_info info;
    int64_t t_end;

    (void)state;
    conf_key(key, "renews");
    conf_owner(a);
    g = conf_acquire(key, a, 1000, "kept");
    memset(&p, 0, sizeof(p));
    p.fd = -1;
    ko.on_lost = on_lost;
    ko.payload = &p;
    /* Started from a handle that is closed at once: the keeper has its
     * own connection and never touches this one again. */
    CHECK_RC(0, lease_store_open(&s, conf_url));
    CHECK_RC(0, lease_keeper_start(&k, s, &g, &ko));
    lease_store_close(s);
    assert_non_null(k);
    ASSERT_U64_OP(lease_keeper_token(k), ==, g.token);
    assert_int_equal(lease_keeper_valid(k), 1);

    /* Let several ttls pass (a store may round the ttl up). */
    t_end = conf_now_ms() + (int64_t)g.ttl_ms * 3;
    conf_sleep_ms(t_end - conf_now_ms());

    assert_int_equal(atomic_load(&p.fired), 0);
    assert_int_equal(lease_keeper_valid(k), 1);
    assert_int_equal(lease_keeper_state_get(k), LEASE_KEEPER_HELD);
    ASSERT_U64_OP(lease_keeper_remaining_ms(k), >, 0);
    ASSERT_U64_OP(lease_keeper_remaining_ms(k), <=, g.ttl_ms);
    /* The deadline moved: the lease would be gone by now otherwise. */
    ASSERT_I64_OP(lease_keeper_deadline_ns(k), >, g.deadline_ns);
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.owner, a);
    ASSERT_U64_OP(info.token, ==, g.token);

    memset(&last, 0, sizeof(last));
    CHECK_RC(0, lease_keeper_stop(&last, k, 1));
    assert_string_equal(last.key, key);
    assert_string_equal(last.owner, a);
    ASSERT_U64_OP(last.token, ==, g.token);
    ASSERT_I64_OP(last.deadline_ns, >, g.deadline_ns);
    assert_int_equal(atomic_load(&p.fired), 0);
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 0);
    ASSERT_U64_OP(info.token, ==, g.token);
}

/* stop(release=0) leaves the lease to the caller, still renewable. */
static void test_keeper_stop_without_release(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    lease_keeper *k = NULL;
    lease_grant g, last;
    lease_info info;

    (void)state;
    conf_key(key, "no-release");
    conf_owner(a);
    g = conf_acquire(key, a, 30000, "kept");
    CHECK_RC(0, lease_keeper_start(&k, conf_store, &g, NULL));
    CHECK_RC(0, lease_keeper_stop(&last, k, 0));
    ASSERT_U64_OP(last.token, ==, g.token);
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 1);
    ASSERT_U64_OP(info.token, ==, g.token);
    CHECK_RC(0, lease_renew(&last, conf_store, 0));
    CHECK_RC(0, lease_release(conf_store, &last));
    CHECK_RC(0, lease_keeper_stop(NULL, NULL, 1)); /* NULL is allowed */
}

/* The store says "not yours any more" (here: the lease was released
 * behind the keeper's back): on_lost(ELOST) once, valid() turns 0, and
 * stop(release=1) touches nothing. */
static void test_keeper_lost_when_released_elsewhere(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ], b[LEASE_OWNER_BUFSZ];
    lease_keeper_opts ko = LEASE_KEEPER_OPTS_INIT;
    struct lost_probe p;
    lease_keeper *k = NULL;
    lease_grant g, gb;
    lease_info info;
    int64_t end;

    (void)state;
    conf_key(key, "lost");
    conf_owner(a);
    conf_owner(b);
    g = conf_acquire(key, a, 3000, "kept");
    memset(&p, 0, sizeof(p));
    p.fd = -1;
    ko.on_lost = on_lost;
    ko.payload = &p;
    ko.renew_every_ms = 100;
    CHECK_RC(0, lease_keeper_start(&k, conf_store, &g, &ko));
    CHECK_RC(0, lease_release(conf_store, &g));
    gb = conf_acquire(key, b, 30000, "thief");

    end = conf_now_ms() + conf_expiry_bound_ms(g.ttl_ms);
    while (atomic_load(&p.fired) == 0 && conf_now_ms() < end)
        conf_sleep_ms(10);
    assert_int_equal(atomic_load(&p.fired), 1);
    assert_int_equal(atomic_load(&p.reason), LEASE_ELOST);
    assert_int_equal(lease_keeper_valid(k), 0);
    ASSERT_U64_OP(lease_keeper_remaining_ms(k), ==, 0);
    assert_int_equal(lease_keeper_state_get(k), LEASE_KEEPER_LOST);
    CHECK_RC(0, lease_keeper_stop(NULL, k, 1));
    assert_int_equal(atomic_load(&p.fired), 1);
    /* The new holder's lease is untouched. */
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.owner, b);
    ASSERT_U64_OP(info.token, ==, gb.token);
    CHECK_RC(0, lease_release(conf_store, &gb));
}

/* Bad arguments to lease_keeper_start. */
static void test_keeper_bad_args(void **state)
{
    char key[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    lease_keeper_opts ko = LEASE_KEEPER_OPTS_INIT;
    lease_keeper *k = (lease_keeper *)&k;
    lease_grant g, bad;

    (void)state;
    conf_key(key, "bad-args");
    conf_owner(a);
    g = conf_acquire(key, a, 30000, NULL);
    CHECK_FAIL(LEASE_EINVALID, lease_keeper_start(&k, conf_store, NULL, NULL));
    assert_null(k);
    CHECK_FAIL(LEASE_EINVALID, lease_keeper_start(&k, NULL, &g, NULL));
    ko.renew_every_ms = g.ttl_ms;
    CHECK_FAIL(LEASE_EINVALID, lease_keeper_start(&k, conf_store, &g, &ko));
    ko = (lease_keeper_opts)LEASE_KEEPER_OPTS_INIT;
    ko.version = 999;
    CHECK_FAIL(LEASE_EINVALID, lease_keeper_start(&k, conf_store, &g, &ko));
    /* A grant rebuilt by hand has no local deadline to keep. */
    CHECK_RC(0, lease_grant_init(&bad, key, a, g.token, g.ttl_ms));
    CHECK_FAIL(LEASE_EINVALID, lease_keeper_start(&k, conf_store, &bad, NULL));
    assert_null(k);
    assert_int_equal(lease_keeper_valid(NULL), 0);
    CHECK_RC(0, lease_release(conf_store, &g));
}

/* ---- (b) a paused holder ------------------------------------------------ */

struct paused_report {
    /* stage 1, before the pause */
    int open_rc, acquire_rc, first_fence_rc, keeper_rc;
    uint64_t token, ttl_ms;
    /* stage 2, after SIGCONT */
    int valid_at_resume, grant_valid_at_resume;
    int lost_fired, lost_reason, valid, state, renew_rc, fence_rc, stop_rc;
    uint64_t fence_mark;
};

static void child_paused_holder(const char *key, const char *res, int rep_fd,
                                int cmd_fd)
{
    lease_keeper_opts ko = LEASE_KEEPER_OPTS_INIT;
    struct paused_report r;
    struct lost_probe p;
    char owner[LEASE_OWNER_BUFSZ], c;
    lease_keeper *k = NULL;
    lease_store *s = NULL;
    lease_acquire_opts o;
    lease_grant g;
    uint64_t mark = 0;
    int lost[2] = { -1, -1 };

    memset(&r, 0, sizeof(r));
    memset(&g, 0, sizeof(g));
    r.open_rc = lease_store_open(&s, conf_url);
    if (r.open_rc == 0 && lease_owner_new(owner) == 0 && pipe(lost) == 0) {
        o = conf_opts(owner, 500, "paused-holder", 0);
        r.acquire_rc = lease_acquire(&g, NULL, s, key, &o);
        r.token = g.token;
        r.ttl_ms = g.ttl_ms;
        if (r.acquire_rc == 0)
            r.first_fence_rc = lease_fence_advance(&mark, s, res, g.token);
        memset(&p, 0, sizeof(p));
        p.fd = lost[1];
        ko.on_lost = on_lost;
        ko.payload = &p;
        if (r.acquire_rc == 0)
            r.keeper_rc = lease_keeper_start(&k, s, &g, &ko);
    } else if (r.open_rc == 0) {
        r.open_rc = LEASE_ESTORE;
    }
    conf_write_full(rep_fd, &r, sizeof(r));
    if (r.open_rc || r.acquire_rc || r.first_fence_rc || r.keeper_rc)
        _exit(2);

    /* The parent stops us here, takes the key, and then says go. */
    if (conf_read_full(cmd_fd, &c, 1, conf_now_ms() + 120000) != 1)
        _exit(3);

    /* Resumed past the local deadline: not valid, whether or not the
     * keeper's thread has run yet. */
    r.valid_at_resume = lease_keeper_valid(k);
    r.grant_valid_at_resume = lease_grant_valid(&g);

    /* The keeper must notice on its own (bounded wait for its callback). */
    r.lost_fired = conf_read_full(lost[0], &r.lost_reason, sizeof(r.lost_reason),
                                  conf_now_ms() + conf_expiry_bound_ms(g.ttl_ms)) ==
                   sizeof(r.lost_reason);
    r.valid = lease_keeper_valid(k);
    r.state = (int)lease_keeper_state_get(k);
    r.renew_rc = lease_renew(&g, s, 0);
    r.fence_rc = lease_fence_advance(&r.fence_mark, s, res, g.token);
    r.stop_rc = lease_keeper_stop(NULL, k, 1);
    conf_write_full(rep_fd, &r, sizeof(r));
    lease_store_close(s);
    _exit(0);
}

/* (b) A holder is paused (SIGSTOP) past its ttl; another takes the key
 * and installs its generation at the resource. When the holder resumes,
 * its keeper reports the loss, valid() is 0, renew is ELOST, and its old
 * token is fenced at the resource. */
static void test_keeper_paused_holder_is_fenced(void **state)
{
    char key[LEASE_KEY_MAX + 1], res[LEASE_KEY_MAX + 1], b[LEASE_OWNER_BUFSZ];
    int rep[2], cmd[2], status, attempt, rc = LEASE_ETIMEOUT;
    struct paused_report r;
    lease_acquire_opts o;
    lease_grant g;
    lease_info info;
    uint64_t mark = 0;
    pid_t pid;
    char c = 'g';

    (void)state;
    conf_key(key, "paused/lock");
    conf_key(res, "paused/storage");
    conf_owner(b);
    conf_pipe(rep);
    conf_pipe(cmd);
    conf_store_close();
    pid = conf_fork();
    if (pid == 0) {
        close(rep[0]);
        close(cmd[1]);
        child_paused_holder(key, res, rep[1], cmd[0]);
    }
    close(rep[1]);
    close(cmd[0]);
    conf_store_open();

    assert_int_equal(conf_read_full(rep[0], &r, sizeof(r), conf_now_ms() + 30000),
                     sizeof(r));
    CHECK_RC(0, r.open_rc);
    CHECK_RC(0, r.acquire_rc);
    CHECK_RC(0, r.first_fence_rc);
    CHECK_RC(0, r.keeper_rc);

    /* Pause the holder. If it happens to be stopped in the middle of a
     * store call that holds a lock (SQLite's write lock, a row lock), no
     * one can take the key until it runs again: let it run for a moment
     * and pause it again. Its authority is gone either way. */
    for (attempt = 0; attempt < 4 && rc != 0; attempt++) {
        if (attempt > 0) {
            kill(pid, SIGCONT);
            conf_sleep_ms(50);
        }
        kill(pid, SIGSTOP);
        assert_int_equal(waitpid(pid, &status, WUNTRACED), pid);
        assert_true(WIFSTOPPED(status));
        o = conf_opts(b, 30000, "successor", 3 * r.ttl_ms + 5000);
        rc = lease_acquire(&g, NULL, conf_store, key, &o);
        if (rc != 0)
            print_message("# attempt %d to take the paused holder's key: %s: %s\n",
                          attempt, lease_error_name(rc), lease_errmsg());
    }
    CHECK_RC(0, rc);
    ASSERT_U64_OP(g.token, >, r.token);
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, g.token));
    ASSERT_U64_OP(mark, ==, g.token);

    kill(pid, SIGCONT);
    assert_int_equal(conf_write_full(cmd[1], &c, 1), 0);
    assert_int_equal(conf_read_full(rep[0], &r, sizeof(r),
                                    conf_now_ms() + 2 * conf_expiry_bound_ms(r.ttl_ms)),
                     sizeof(r));
    status = conf_reap(pid, 30000);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(rep[0]);
    close(cmd[1]);

    assert_int_equal(r.valid_at_resume, 0);
    assert_int_equal(r.grant_valid_at_resume, 0);
    assert_int_equal(r.lost_fired, 1);
    if (r.lost_reason != LEASE_ELOST && r.lost_reason != LEASE_ESTORE)
        fail_msg("on_lost reason %s, expected ELOST or ESTORE",
                 lease_error_name(r.lost_reason));
    assert_int_equal(r.valid, 0);
    assert_int_equal(r.state, LEASE_KEEPER_LOST);
    CHECK_RC(LEASE_ELOST, r.renew_rc);
    CHECK_RC(LEASE_ESTALE, r.fence_rc);
    ASSERT_U64_OP(r.fence_mark, ==, g.token);
    CHECK_RC(0, r.stop_rc);

    /* The successor still holds the key, its mark still stands. */
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.owner, b);
    ASSERT_U64_OP(info.token, ==, g.token);
    CHECK_RC(0, lease_fence_mark(&mark, conf_store, res));
    ASSERT_U64_OP(mark, ==, g.token);
    CHECK_RC(0, lease_release(conf_store, &g));
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        CONF_TEST(test_keeper_renews_and_releases),
        CONF_TEST(test_keeper_stop_without_release),
        CONF_TEST(test_keeper_lost_when_released_elsewhere),
        CONF_TEST(test_keeper_bad_args),
        CONF_TEST(test_keeper_paused_holder_is_fenced),
    };
    int failed;

    if (conf_init(argc, argv, "keeper") != 0)
        return 2;
    failed = cmocka_run_group_tests_name("lease_keeper", tests, NULL, NULL);
    conf_store_close();
    return failed ? 1 : 0;
}
