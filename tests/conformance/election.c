/*
 * election.c - leader election, its step-down policy, the structured log
 * and the metrics, against a real store.
 *
 *     lease_election_test URL      or    LEASE_TEST_STORE=URL lease_election_test
 *
 * Public API only, so it runs unchanged against every store. Every name
 * lives under "elect/<random uuid>/", so runs on a persistent store never
 * meet. Waits are bounded; nothing here asserts a duration. A store may
 * round a short ttl up (etcd: whole seconds): bounds use the granted ttl.
 *
 * The log sink and the metrics are process-wide: the tests that look at
 * them run while no other leadership or keeper of this process is alive.
 */
#include <pthread.h>
#include <stdatomic.h>

#include <jansson.h>

#include "conf_util.h"

/* ---- helpers ------------------------------------------------------------ */

static void elect_name(char out[LEASE_ELECTION_NAME_MAX + 1], const char *what)
{
    int n = snprintf(out, LEASE_ELECTION_NAME_MAX + 1, "%s%s", conf_prefix, what);

    if (n < 0 || n > LEASE_ELECTION_NAME_MAX)
        fail_msg("election name '%s%s' is too long", conf_prefix, what);
}

static lease_campaign_opts campaign_opts(uint64_t ttl_ms, const char *label,
                                         uint64_t wait_ms)
{
    lease_campaign_opts o = LEASE_CAMPAIGN_OPTS_INIT;

    o.ttl_ms = ttl_ms;
    o.label = label;
    o.wait_ms = wait_ms;
    return o;
}

/* What on_stepdown saw: how often, why, and (a forked leader) a pipe. */
struct stepdown_probe {
    atomic_int fired;
    atomic_int reason;
    atomic_int is_leader_inside; /* lease_election_is_leader() in the callback */
    int fd;                      /* >= 0: write the reason there too */
};

static void on_stepdown(lease_election *e, int reason, void *payload)
{
    struct stepdown_probe *p = payload;

    atomic_store(&p->is_leader_inside, lease_election_is_leader(e));
    atomic_store(&p->reason, reason);
    atomic_fetch_add(&p->fired, 1);
    if (p->fd >= 0)
        conf_write_full(p->fd, &reason, sizeof(reason));
}

static void probe_init(struct stepdown_probe *p, int fd)
{
    atomic_init(&p->fired, 0);
    atomic_init(&p->reason, 0);
    atomic_init(&p->is_leader_inside, -1);
    p->fd = fd;
}

/* Wait (bounded) until on_stepdown has fired; returns how often it did. */
static int wait_stepdown(struct stepdown_probe *p, uint64_t ttl_ms)
{
    int64_t end = conf_now_ms() + conf_expiry_bound_ms(ttl_ms);

    while (atomic_load(&p->fired) == 0 && conf_now_ms() < end)
        conf_sleep_ms(10);
    return atomic_load(&p->fired);
}

/* ---- (1) campaign, observe, resign, epochs, fencing --------------------- */

static void test_campaign_observe_resign(void **state)
{
    char name[LEASE_ELECTION_NAME_MAX + 1], key[LEASE_KEY_MAX + 1];
    char res[LEASE_KEY_MAX + 1];
    lease_campaign_opts oa = campaign_opts(30000, "candidate-a", 0);
    lease_campaign_opts ob = campaign_opts(30000, "candidate-b", 0);
    lease_election *a = NULL, *b = (lease_election *)&b;
    lease_cancel *cancel = NULL;
    struct stepdown_probe p;
    const lease_grant *ga;
    lease_info info;
    uint64_t epoch_a, epoch_b, mark = 0;

    (void)state;
    probe_init(&p, -1);
    oa.on_stepdown = on_stepdown;
    oa.payload = &p;
    elect_name(name, "basic");
    snprintf(key, sizeof(key), "election/%s", name);
    conf_key(res, "basic/storage");

    /* Nobody ever led it. */
    CHECK_FAIL(LEASE_ENOTFOUND, lease_leader_get(&info, conf_store, name));

    CHECK_RC(0, lease_campaign(&a, conf_store, name, &oa));
    assert_non_null(a);
    assert_int_equal(lease_election_is_leader(a), 1);
    epoch_a = lease_election_epoch(a);
    ASSERT_U64_OP(epoch_a, >=, 1);
    ASSERT_I64_OP(lease_election_deadline_ns(a), >, lease_clock_ns());
    ga = lease_election_grant(a);
    assert_non_null(ga);
    assert_string_equal(ga->key, key);
    assert_string_equal(ga->label, "candidate-a");
    assert_int_equal(lease_owner_valid(ga->owner), 1);
    ASSERT_U64_OP(ga->token, ==, epoch_a);
    ASSERT_U64_OP(ga->ttl_ms, >=, 30000);

    /* Observers see the leader: label, owner, epoch == its token, time left. */
    memset(&info, 0, sizeof(info));
    CHECK_RC(0, lease_leader_get(&info, conf_store, name));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.key, key);
    assert_string_equal(info.label, "candidate-a");
    assert_string_equal(info.owner, ga->owner);
    ASSERT_U64_OP(info.token, ==, epoch_a);
    ASSERT_U64_OP(info.remaining_ms, >, 0);
    ASSERT_U64_OP(info.remaining_ms, <=, ga->ttl_ms);
    /* It is the lease "election/NAME", visible to inspect as well. */
    CHECK_RC(0, lease_inspect(&info, conf_store, key));
    assert_int_equal(info.held, 1);
    ASSERT_U64_OP(info.token, ==, epoch_a);

    /* A second candidate: busy at once; with a wait shorter than the ttl,
     * a timeout. Neither leaves an election behind. */
    CHECK_FAIL(LEASE_EBUSY, lease_campaign(&b, conf_store, name, &ob));
    assert_null(b);
    ob.wait_ms = 300;
    b = (lease_election *)&b;
    CHECK_FAIL(LEASE_ETIMEOUT, lease_campaign(&b, conf_store, name, &ob));
    assert_null(b);
    /* A wait of a minute whose cancel handle is fired ends after its
     * first try, saying so (a handle not passed on would wait it out). */
    CHECK_RC(0, lease_cancel_new(&cancel));
    CHECK_RC(0, lease_cancel_fire(cancel));
    ob.wait_ms = 60000;
    ob.cancel = cancel;
    b = (lease_election *)&b;
    CHECK_FAIL(LEASE_ETIMEOUT, lease_campaign(&b, conf_store, name, &ob));
    assert_non_null(strstr(lease_errmsg(), "cancelled"));
    assert_null(b);
    ob.cancel = NULL;
    lease_cancel_free(cancel);
    assert_int_equal(lease_election_is_leader(a), 1);

    /* The leader carries its epoch into the resource's writes. */
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, epoch_a));
    ASSERT_U64_OP(mark, ==, epoch_a);

    /* Resign: nobody leads, the last epoch is still known. Resigning is
     * no step-down: on_stepdown is not called. */
    CHECK_RC(0, lease_resign(a));
    assert_int_equal(atomic_load(&p.fired), 0);
    memset(&info, 0, sizeof(info));
    CHECK_RC(0, lease_leader_get(&info, conf_store, name));
    assert_int_equal(info.held, 0);
    ASSERT_U64_OP(info.token, ==, epoch_a);

    /* The next leader has a greater epoch ... */
    ob.wait_ms = 0;
    CHECK_RC(0, lease_campaign(&b, conf_store, name, &ob));
    assert_non_null(b);
    epoch_b = lease_election_epoch(b);
    ASSERT_U64_OP(epoch_b, >, epoch_a);
    CHECK_RC(0, lease_leader_get(&info, conf_store, name));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.label, "candidate-b");
    ASSERT_U64_OP(info.token, ==, epoch_b);

    /* ... which the resource installs, and then the old epoch is stale. */
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, epoch_b));
    ASSERT_U64_OP(mark, ==, epoch_b);
    mark = 0;
    CHECK_FAIL(LEASE_ESTALE, lease_fence_advance(&mark, conf_store, res, epoch_a));
    ASSERT_U64_OP(mark, ==, epoch_b);
    /* The same epoch again is accepted (several writes of one leader). */
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, epoch_b));

    CHECK_RC(0, lease_resign(b));
    CHECK_RC(0, lease_resign(NULL));
    CHECK_RC(0, lease_leader_get(&info, conf_store, name));
    assert_int_equal(info.held, 0);
    ASSERT_U64_OP(info.token, ==, epoch_b);
}

/* ---- (2) bad arguments, name limits ------------------------------------- */

static void test_campaign_bad_args(void **state)
{
    char name[LEASE_ELECTION_NAME_MAX + 2];
    lease_campaign_opts o = campaign_opts(30000, "bad", 0);
    lease_election *e = (lease_election *)&e;
    lease_info info;
    size_t n;

    (void)state;
    elect_name(name, "bad-args");
    CHECK_FAIL(LEASE_EINVALID, lease_campaign(NULL, conf_store, name, &o));
    CHECK_FAIL(LEASE_EINVALID, lease_campaign(&e, NULL, name, &o));
    assert_null(e);
    CHECK_FAIL(LEASE_EINVALID, lease_campaign(&e, conf_store, NULL, &o));
    CHECK_FAIL(LEASE_EINVALID, lease_campaign(&e, conf_store, "", &o));
    CHECK_FAIL(LEASE_EINVALID, lease_campaign(&e, conf_store, name, NULL));
    o.version = 999;
    CHECK_FAIL(LEASE_EINVALID, lease_campaign(&e, conf_store, name, &o));
    o = campaign_opts(0, "bad", 0);
    CHECK_FAIL(LEASE_EINVALID, lease_campaign(&e, conf_store, name, &o));
    assert_null(e);
    CHECK_FAIL(LEASE_EINVALID, lease_leader_get(&info, conf_store, ""));
    CHECK_FAIL(LEASE_EINVALID, lease_leader_get(&info, conf_store, NULL));
    /* Nothing was campaigned for under that name. */
    CHECK_FAIL(LEASE_ENOTFOUND, lease_leader_get(&info, conf_store, name));

    assert_int_equal(lease_election_is_leader(NULL), 0);
    ASSERT_U64_OP(lease_election_epoch(NULL), ==, 0);
    ASSERT_I64_OP(lease_election_deadline_ns(NULL), ==, 0);
    assert_null(lease_election_grant(NULL));

    /* The longest name (the key "election/" + name is LEASE_KEY_MAX
     * bytes) works; one byte more is EINVALID, before the store. */
    n = (size_t)snprintf(name, sizeof(name), "%smax-", conf_prefix);
    memset(name + n, 'x', LEASE_ELECTION_NAME_MAX - n);
    name[LEASE_ELECTION_NAME_MAX] = '\0';
    o = campaign_opts(30000, "longest", 0);
    CHECK_RC(0, lease_campaign(&e, conf_store, name, &o));
    assert_int_equal((int)strlen(lease_election_grant(e)->key), LEASE_KEY_MAX);
    CHECK_RC(0, lease_leader_get(&info, conf_store, name));
    assert_int_equal(info.held, 1);
    CHECK_RC(0, lease_resign(e));
    name[LEASE_ELECTION_NAME_MAX] = 'x';
    name[LEASE_ELECTION_NAME_MAX + 1] = '\0';
    e = (lease_election *)&e;
    CHECK_FAIL(LEASE_EINVALID, lease_campaign(&e, conf_store, name, &o));
    assert_null(e);
    CHECK_FAIL(LEASE_EINVALID, lease_leader_get(&info, conf_store, name));
}

/* ---- (3) step down when the store says the leadership is gone ----------- */

static void test_stepdown_on_lost(void **state)
{
    char name[LEASE_ELECTION_NAME_MAX + 1];
    lease_campaign_opts oa = campaign_opts(3000, "deposed", 0);
    lease_campaign_opts ob = campaign_opts(30000, "usurper", 0);
    struct stepdown_probe p;
    lease_election *a = NULL, *b = NULL;
    lease_grant ga;
    lease_info info;

    (void)state;
    elect_name(name, "lost");
    probe_init(&p, -1);
    oa.on_stepdown = on_stepdown;
    oa.payload = &p;
    CHECK_RC(0, lease_campaign(&a, conf_store, name, &oa));
    ga = *lease_election_grant(a);
    /* The leadership ends behind the leader's back, and another leads. */
    CHECK_RC(0, lease_release(conf_store, &ga));
    CHECK_RC(0, lease_campaign(&b, conf_store, name, &ob));
    ASSERT_U64_OP(lease_election_epoch(b), >, ga.token);

    /* The next renewal is refused: on_stepdown(ELOST), leadership over. */
    assert_int_equal(wait_stepdown(&p, ga.ttl_ms), 1);
    CHECK_RC(LEASE_ELOST, atomic_load(&p.reason));
    assert_int_equal(atomic_load(&p.is_leader_inside), 0);
    assert_int_equal(lease_election_is_leader(a), 0);
    ASSERT_U64_OP(lease_election_epoch(a), ==, ga.token);
    /* Resigning after a step-down touches nothing and calls nothing. */
    CHECK_RC(0, lease_resign(a));
    assert_int_equal(atomic_load(&p.fired), 1);
    CHECK_RC(0, lease_leader_get(&info, conf_store, name));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.label, "usurper");
    ASSERT_U64_OP(info.token, ==, lease_election_epoch(b));
    assert_int_equal(lease_election_is_leader(b), 1);
    CHECK_RC(0, lease_resign(b));
}

/* ---- (4) a paused leader steps down and is fenced ------------------------ */

struct paused_report {
    /* stage 1: leading, before the pause */
    int open_rc, campaign_rc, fence_rc, is_leader;
    uint64_t epoch, ttl_ms;
    /* stage 2: after SIGCONT */
    int is_leader_at_resume, stepdown_seen, stepdown_reason, is_leader_inside;
    int is_leader_after, stale_fence_rc, resign_rc, stepdown_count;
    uint64_t stale_fence_mark;
};

static void child_paused_leader(const char *name, const char *res, int rep_fd,
                                int cmd_fd)
{
    lease_campaign_opts o = campaign_opts(1000, "paused-leader", 0);
    struct stepdown_probe p;
    struct paused_report r;
    lease_election *e = NULL;
    lease_store *s = NULL;
    uint64_t mark = 0;
    int sd[2] = { -1, -1 };
    char c;

    memset(&r, 0, sizeof(r));
    r.open_rc = lease_store_open(&s, conf_url);
    if (r.open_rc == 0 && pipe(sd) == 0) {
        probe_init(&p, sd[1]);
        o.on_stepdown = on_stepdown;
        o.payload = &p;
        r.campaign_rc = lease_campaign(&e, s, name, &o);
        if (r.campaign_rc == 0) {
            r.epoch = lease_election_epoch(e);
            r.ttl_ms = lease_election_grant(e)->ttl_ms;
            r.is_leader = lease_election_is_leader(e);
            r.fence_rc = lease_fence_advance(&mark, s, res, r.epoch);
        }
    } else if (r.open_rc == 0) {
        r.open_rc = LEASE_ESTORE;
    }
    conf_write_full(rep_fd, &r, sizeof(r));
    if (r.open_rc || r.campaign_rc || r.fence_rc)
        _exit(2);

    /* The parent stops us here, wins the election, then says go. */
    if (conf_read_full(cmd_fd, &c, 1, conf_now_ms() + 120000) != 1)
        _exit(3);

    /* Resumed past the deadline: not leader, at once, whether or not the
     * renewing thread has run yet. */
    r.is_leader_at_resume = lease_election_is_leader(e);
    r.stepdown_seen = conf_read_full(sd[0], &r.stepdown_reason,
                                     sizeof(r.stepdown_reason),
                                     conf_now_ms() + conf_expiry_bound_ms(r.ttl_ms)) ==
                      sizeof(r.stepdown_reason);
    r.is_leader_inside = atomic_load(&p.is_leader_inside);
    r.is_leader_after = lease_election_is_leader(e);
    /* A write still in flight with the old epoch. */
    r.stale_fence_rc = lease_fence_advance(&r.stale_fence_mark, s, res, r.epoch);
    r.resign_rc = lease_resign(e);
    /* The renewing thread is joined: the count is final. */
    r.stepdown_count = atomic_load(&p.fired);
    conf_write_full(rep_fd, &r, sizeof(r));
    lease_store_close(s);
    _exit(0);
}

static void test_paused_leader_steps_down(void **state)
{
    char name[LEASE_ELECTION_NAME_MAX + 1], res[LEASE_KEY_MAX + 1];
    int rep[2], cmd[2], status, attempt, rc = LEASE_ETIMEOUT;
    lease_campaign_opts o;
    struct paused_report r;
    lease_election *e = NULL;
    lease_info info;
    uint64_t mark = 0, epoch;
    pid_t pid;
    char c = 'g';

    (void)state;
    elect_name(name, "paused");
    conf_key(res, "paused/storage");
    conf_pipe(rep);
    conf_pipe(cmd);
    conf_store_close();
    pid = conf_fork();
    if (pid == 0) {
        close(rep[0]);
        close(cmd[1]);
        child_paused_leader(name, res, rep[1], cmd[0]);
    }
    close(rep[1]);
    close(cmd[0]);
    conf_store_open();

    assert_int_equal(conf_read_full(rep[0], &r, sizeof(r), conf_now_ms() + 30000),
                     sizeof(r));
    CHECK_RC(0, r.open_rc);
    CHECK_RC(0, r.campaign_rc);
    CHECK_RC(0, r.fence_rc);
    assert_int_equal(r.is_leader, 1);
    ASSERT_U64_OP(r.epoch, >=, 1);

    /* Pause the leader past its ttl and campaign. If it was stopped in the
     * middle of a store call that holds a lock (SQLite's write lock, a row
     * lock), nobody can win until it runs again: let it run a moment and
     * pause it again. Its leadership is gone either way. */
    for (attempt = 0; attempt < 4 && rc != 0; attempt++) {
        if (attempt > 0) {
            kill(pid, SIGCONT);
            conf_sleep_ms(50);
        }
        kill(pid, SIGSTOP);
        assert_int_equal(waitpid(pid, &status, WUNTRACED), pid);
        assert_true(WIFSTOPPED(status));
        o = campaign_opts(30000, "successor", 3 * r.ttl_ms + 5000);
        rc = lease_campaign(&e, conf_store, name, &o);
        if (rc != 0)
            print_message("# attempt %d to win over the paused leader: %s: %s\n",
                          attempt, lease_error_name(rc), lease_errmsg());
    }
    CHECK_RC(0, rc);
    epoch = lease_election_epoch(e);
    ASSERT_U64_OP(epoch, >, r.epoch);
    CHECK_RC(0, lease_leader_get(&info, conf_store, name));
    assert_int_equal(info.held, 1);
    assert_string_equal(info.label, "successor");
    ASSERT_U64_OP(info.token, ==, epoch);
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, epoch));
    ASSERT_U64_OP(mark, ==, epoch);

    kill(pid, SIGCONT);
    assert_int_equal(conf_write_full(cmd[1], &c, 1), 0);
    assert_int_equal(conf_read_full(rep[0], &r, sizeof(r),
                                    conf_now_ms() + 2 * conf_expiry_bound_ms(r.ttl_ms)),
                     sizeof(r));
    status = conf_reap(pid, 30000);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(rep[0]);
    close(cmd[1]);

    assert_int_equal(r.is_leader_at_resume, 0);
    assert_int_equal(r.stepdown_seen, 1);
    if (r.stepdown_reason != LEASE_ELOST && r.stepdown_reason != LEASE_ESTORE)
        fail_msg("on_stepdown reason %s, expected ELOST or ESTORE",
                 lease_error_name(r.stepdown_reason));
    assert_int_equal(r.is_leader_inside, 0);
    assert_int_equal(r.is_leader_after, 0);
    CHECK_RC(LEASE_ESTALE, r.stale_fence_rc);
    ASSERT_U64_OP(r.stale_fence_mark, ==, epoch);
    CHECK_RC(0, r.resign_rc);
    assert_int_equal(r.stepdown_count, 1);

    /* The successor still leads, its mark still stands. */
    CHECK_RC(0, lease_leader_get(&info, conf_store, name));
    assert_int_equal(info.held, 1);
    ASSERT_U64_OP(info.token, ==, epoch);
    assert_int_equal(lease_election_is_leader(e), 1);
    CHECK_RC(0, lease_fence_mark(&mark, conf_store, res));
    ASSERT_U64_OP(mark, ==, epoch);
    CHECK_RC(0, lease_resign(e));
}

/* ---- (5) structured log lines ---------------------------------------------- */

#define LOG_MAX 256

struct log_sink {
    pthread_mutex_t mu;
    size_t n;
    int overflow;
    int levels[LOG_MAX];
    char *lines[LOG_MAX];
};

static struct log_sink sink_main, sink_warn, sink_off;

/* Called from any thread (the renewing one too): lock, copy, return. */
static void sink_fn(lease_log_level level, const char *line, void *payload)
{
    struct log_sink *s = payload;

    pthread_mutex_lock(&s->mu);
    if (s->n < LOG_MAX) {
        s->levels[s->n] = (int)level;
        s->lines[s->n] = strdup(line ? line : "(null)");
        s->n++;
    } else {
        s->overflow = 1;
    }
    pthread_mutex_unlock(&s->mu);
}

static void sink_init(struct log_sink *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
}

static void sink_free(struct log_sink *s)
{
    size_t i;

    for (i = 0; i < s->n; i++)
        free(s->lines[i]);
    pthread_mutex_destroy(&s->mu);
    memset(s, 0, sizeof(*s));
}

static int sink_count(struct log_sink *s)
{
    int n;

    pthread_mutex_lock(&s->mu);
    n = (int)s->n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void dump_sink(struct log_sink *s)
{
    size_t i;

    for (i = 0; i < s->n; i++)
        print_message("#   line %zu (level %d): %s\n", i, s->levels[i], s->lines[i]);
}

static const char *const level_name[] = { "debug", "info", "warn", "error" };

static int is_state_event(const char *ev)
{
    static const char *const names[] = { "acquired", "renewed", "renewal_failed",
                                         "lost", "released", "fenced",
                                         "leader_elected", "stepped_down" };
    size_t i;

    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(ev, names[i]) == 0)
            return 1;
    return 0;
}

/* "2026-11-30T05:20:01.123Z" */
static int time_ok(const char *t)
{
    static const char shape[] = "dddd-dd-ddTdd:dd:dd.dddZ";
    size_t i;

    if (strlen(t) != sizeof(shape) - 1)
        return 0;
    for (i = 0; shape[i]; i++) {
        if (shape[i] == 'd' ? (t[i] < '0' || t[i] > '9') : t[i] != shape[i])
            return 0;
    }
    return 1;
}

/* The password of a URL "scheme://user:PASSWORD@host..." or "" if none. */
static void url_password(char *out, size_t size, const char *url)
{
    const char *p = strstr(url, "://"), *at, *colon;

    out[0] = '\0';
    if (p == NULL)
        return;
    p += 3;
    at = strchr(p, '@');
    if (at == NULL)
        return;
    colon = memchr(p, ':', (size_t)(at - p));
    if (colon == NULL || at - colon - 1 <= 0 || (size_t)(at - colon) > size)
        return;
    memcpy(out, colon + 1, (size_t)(at - colon - 1));
    out[at - colon - 1] = '\0';
}

/*
 * Check every line of a sink (valid JSON object; time, level, event, store;
 * level as the callback was told and >= min; the state fields for state
 * events; no password) and return the state events as a JSON array of
 * objects, in the order they arrived. The caller json_decref()s it.
 */
static json_t *check_lines(struct log_sink *s, lease_log_level min, const char *password)
{
    const char *scheme = lease_store_scheme(conf_store);
    json_t *events = json_array();
    size_t i;

    pthread_mutex_lock(&s->mu);
    if (s->overflow)
        fail_msg("more than %d log lines", LOG_MAX);
    for (i = 0; i < s->n; i++) {
        const char *line = s->lines[i], *ev, *lvl, *t, *store;
        json_error_t jerr;
        json_t *o = json_loads(line, 0, &jerr);

        if (o == NULL || !json_is_object(o))
            fail_msg("log line %zu is not a JSON object (%s): %s", i, jerr.text, line);
        if (strchr(line, '\n'))
            fail_msg("log line %zu has a newline: %s", i, line);
        if (password[0] && strstr(line, password))
            fail_msg("log line %zu holds the store's password: %s", i, line);
        if (s->levels[i] < (int)min || s->levels[i] > LEASE_LOG_ERROR)
            fail_msg("log line %zu at level %d arrived with the minimum %d: %s", i,
                     s->levels[i], (int)min, line);
        t = json_string_value(json_object_get(o, "time"));
        lvl = json_string_value(json_object_get(o, "level"));
        ev = json_string_value(json_object_get(o, "event"));
        store = json_string_value(json_object_get(o, "store"));
        if (t == NULL || !time_ok(t))
            fail_msg("log line %zu: bad or missing \"time\": %s", i, line);
        if (lvl == NULL || strcmp(lvl, level_name[s->levels[i]]) != 0)
            fail_msg("log line %zu: \"level\" is not \"%s\" as passed to the "
                     "callback: %s", i, level_name[s->levels[i]], line);
        if (ev == NULL || store == NULL)
            fail_msg("log line %zu: no \"event\" or \"store\": %s", i, line);
        if (strcmp(store, scheme) != 0)
            fail_msg("log line %zu: store is not \"%s\": %s", i, scheme, line);
        if (is_state_event(ev)) {
            if (!json_is_string(json_object_get(o, "key")) ||
                !json_is_string(json_object_get(o, "owner")) ||
                !json_is_string(json_object_get(o, "label")) ||
                !json_is_integer(json_object_get(o, "token")))
                fail_msg("log line %zu: a state event without key, owner, label "
                         "and token: %s", i, line);
            json_array_append(events, o);
        }
        json_decref(o);
    }
    pthread_mutex_unlock(&s->mu);
    return events;
}

/* Expect the next state event (skipping "renewed" lines of elections,
 * which a renewing thread may add at any time) to be exactly this. */
struct expect {
    const char *event, *level, *key, *owner, *label;
    uint64_t token;
};

static void expect_events(json_t *events, const struct expect *want, size_t nwant,
                          struct log_sink *s)
{
    size_t i = 0, w;

    for (w = 0; w < nwant; w++) {
        json_t *o = NULL;
        const char *ev = NULL, *key;

        for (; i < json_array_size(events); i++) {
            o = json_array_get(events, i);
            ev = json_string_value(json_object_get(o, "event"));
            key = json_string_value(json_object_get(o, "key"));
            if (strcmp(ev, "renewed") == 0 && strncmp(key, "election/", 9) == 0 &&
                strcmp(want[w].event, "renewed") != 0)
                continue;
            break;
        }
        if (i == json_array_size(events)) {
            dump_sink(s);
            fail_msg("log: no line for event %zu \"%s\" (key %s)", w, want[w].event,
                     want[w].key);
        }
        if (strcmp(ev, want[w].event) != 0 ||
            strcmp(json_string_value(json_object_get(o, "level")), want[w].level) != 0 ||
            strcmp(json_string_value(json_object_get(o, "key")), want[w].key) != 0 ||
            strcmp(json_string_value(json_object_get(o, "owner")), want[w].owner) != 0 ||
            strcmp(json_string_value(json_object_get(o, "label")), want[w].label) != 0 ||
            (uint64_t)json_integer_value(json_object_get(o, "token")) != want[w].token) {
            char *text = json_dumps(o, JSON_COMPACT);
            dump_sink(s);
            fail_msg("log: state event %zu is %s, expected event %s level %s key %s "
                     "owner \"%s\" label \"%s\" token %" PRIu64,
                     w, text ? text : "?", want[w].event, want[w].level, want[w].key,
                     want[w].owner, want[w].label, want[w].token);
        }
        i++;
    }
    for (; i < json_array_size(events); i++) {
        json_t *o = json_array_get(events, i);
        const char *ev = json_string_value(json_object_get(o, "event"));
        const char *key = json_string_value(json_object_get(o, "key"));
        if (strcmp(ev, "renewed") == 0 && strncmp(key, "election/", 9) == 0)
            continue;
        dump_sink(s);
        fail_msg("log: an unexpected state event after the expected ones: %s", ev);
    }
}

static void test_log_lines(void **state)
{
    char key[LEASE_KEY_MAX + 1], res[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ];
    char name[LEASE_ELECTION_NAME_MAX + 1], name2[LEASE_ELECTION_NAME_MAX + 1];
    char ekey[LEASE_KEY_MAX + 1], ekey2[LEASE_KEY_MAX + 1], password[256];
    char eowner[LEASE_OWNER_BUFSZ], downer[LEASE_OWNER_BUFSZ], uowner[LEASE_OWNER_BUFSZ];
    lease_campaign_opts co;
    struct stepdown_probe p;
    lease_election *e = NULL, *d = NULL, *u = NULL;
    lease_grant g, stale, gd;
    uint64_t mark, fmark, epoch, depoch, uepoch;
    json_t *events;
    int n_before;

    (void)state;
    url_password(password, sizeof(password), conf_url);
    conf_key(key, "log/lock");
    conf_key(res, "log/storage");
    elect_name(name, "log");
    elect_name(name2, "log-lost");
    snprintf(ekey, sizeof(ekey), "election/%s", name);
    snprintf(ekey2, sizeof(ekey2), "election/%s", name2);
    conf_owner(a);

    /* ---- everything, from debug up ---- */
    sink_init(&sink_main);
    lease_log_set(sink_fn, &sink_main, LEASE_LOG_DEBUG);
    g = conf_acquire(key, a, 30000, "log-label");
    CHECK_RC(0, lease_renew(&g, conf_store, 0));
    stale = g;
    CHECK_RC(0, lease_release(conf_store, &g));
    CHECK_FAIL(LEASE_ELOST, lease_renew(&stale, conf_store, 0));
    /* The resource's mark: stale tokens below are taken from it, not from
     * later grants (a store's tokens may grow by more than one, etcd's do). */
    fmark = g.token + 10;
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, fmark));
    CHECK_FAIL(LEASE_ESTALE, lease_fence_advance(&mark, conf_store, res, fmark - 1));
    co = campaign_opts(30000, "log-leader", 0);
    CHECK_RC(0, lease_campaign(&e, conf_store, name, &co));
    epoch = lease_election_epoch(e);
    snprintf(eowner, sizeof(eowner), "%s", lease_election_grant(e)->owner);
    CHECK_RC(0, lease_resign(e));
    /* A leadership taken away: lost, then stepped down, from the renewing
     * thread. */
    probe_init(&p, -1);
    co = campaign_opts(3000, "log-deposed", 0);
    co.on_stepdown = on_stepdown;
    co.payload = &p;
    CHECK_RC(0, lease_campaign(&d, conf_store, name2, &co));
    gd = *lease_election_grant(d);
    depoch = gd.token;
    snprintf(downer, sizeof(downer), "%s", gd.owner);
    CHECK_RC(0, lease_release(conf_store, &gd));
    /* (The step-down first, so that the order of the lines is known.) */
    assert_int_equal(wait_stepdown(&p, gd.ttl_ms), 1);
    CHECK_RC(0, lease_resign(d));
    co = campaign_opts(30000, "log-usurper", 0);
    CHECK_RC(0, lease_campaign(&u, conf_store, name2, &co));
    uepoch = lease_election_epoch(u);
    snprintf(uowner, sizeof(uowner), "%s", lease_election_grant(u)->owner);
    CHECK_RC(0, lease_resign(u));
    lease_log_set(NULL, NULL, LEASE_LOG_WARN);

    {
        const struct expect want[] = {
            { "acquired", "info", key, a, "log-label", g.token },
            { "renewed", "debug", key, a, "log-label", g.token },
            { "released", "info", key, a, "log-label", g.token },
            { "renewal_failed", "warn", key, a, "log-label", g.token },
            { "fenced", "warn", res, "", "", fmark - 1 },
            { "acquired", "info", ekey, eowner, "log-leader", epoch },
            { "leader_elected", "info", ekey, eowner, "log-leader", epoch },
            { "released", "info", ekey, eowner, "log-leader", epoch },
            { "stepped_down", "info", ekey, eowner, "log-leader", epoch },
            { "acquired", "info", ekey2, downer, "log-deposed", depoch },
            { "leader_elected", "info", ekey2, downer, "log-deposed", depoch },
            { "released", "info", ekey2, downer, "log-deposed", depoch },
            { "renewal_failed", "warn", ekey2, downer, "log-deposed", depoch },
            { "lost", "warn", ekey2, downer, "log-deposed", depoch },
            { "stepped_down", "warn", ekey2, downer, "log-deposed", depoch },
            { "acquired", "info", ekey2, uowner, "log-usurper", uepoch },
            { "leader_elected", "info", ekey2, uowner, "log-usurper", uepoch },
            { "released", "info", ekey2, uowner, "log-usurper", uepoch },
            { "stepped_down", "info", ekey2, uowner, "log-usurper", uepoch },
        };
        events = check_lines(&sink_main, LEASE_LOG_DEBUG, password);
        expect_events(events, want, sizeof(want) / sizeof(want[0]), &sink_main);
        json_decref(events);
    }
    sink_free(&sink_main);

    /* ---- warn and above only ---- */
    sink_init(&sink_warn);
    lease_log_set(sink_fn, &sink_warn, LEASE_LOG_WARN);
    g = conf_acquire(key, a, 30000, "log-label");
    CHECK_RC(0, lease_renew(&g, conf_store, 0));
    stale = g;
    CHECK_RC(0, lease_release(conf_store, &g));
    CHECK_FAIL(LEASE_ELOST, lease_renew(&stale, conf_store, 0));
    CHECK_FAIL(LEASE_ESTALE, lease_fence_advance(&mark, conf_store, res, fmark - 2));
    co = campaign_opts(30000, "log-leader", 0);
    CHECK_RC(0, lease_campaign(&e, conf_store, name, &co));
    CHECK_RC(0, lease_resign(e));
    lease_log_set(NULL, NULL, LEASE_LOG_WARN);
    {
        const struct expect want[] = {
            { "renewal_failed", "warn", key, a, "log-label", g.token },
            { "fenced", "warn", res, "", "", fmark - 2 },
        };
        events = check_lines(&sink_warn, LEASE_LOG_WARN, password);
        expect_events(events, want, sizeof(want) / sizeof(want[0]), &sink_warn);
        json_decref(events);
    }
    sink_free(&sink_warn);

    /* ---- off: nothing at all ---- */
    sink_init(&sink_off);
    lease_log_set(sink_fn, &sink_off, LEASE_LOG_OFF);
    n_before = sink_count(&sink_off);
    CHECK_FAIL(LEASE_ESTALE, lease_fence_advance(&mark, conf_store, res, fmark - 3));
    g = conf_acquire(key, a, 30000, "log-label");
    CHECK_RC(0, lease_release(conf_store, &g));
    lease_log_set(NULL, NULL, LEASE_LOG_WARN);
    assert_int_equal(sink_count(&sink_off), n_before);
    sink_free(&sink_off);
}

/* Names and labels are bytes: quotes, backslashes, control characters,
 * UTF-8 and bytes that are not UTF-8. Each line stays one JSON object on
 * one line, in ASCII; UTF-8 text comes back as it was, and a string that
 * is not UTF-8 has its non-ASCII bytes shown as U+FFFD. */
static void test_log_hostile_text(void **state)
{
    char name[LEASE_ELECTION_NAME_MAX + 1], shown[LEASE_KEY_MAX * 3 + 1];
    char password[256];
    static const char label[] = "l\xc3\xa9 \"q\" \\ \n\t\x01 end";
    lease_campaign_opts co = campaign_opts(30000, label, 0);
    lease_election *e = NULL;
    char owner[LEASE_OWNER_BUFSZ];
    uint64_t epoch;
    json_t *events;
    size_t i;

    (void)state;
    url_password(password, sizeof(password), conf_url);
    elect_name(name, "odd/\xff\"\\\n\x02");
    snprintf(shown, sizeof(shown), "election/%sodd/\xef\xbf\xbd\"\\\n\x02", conf_prefix);

    sink_init(&sink_main);
    lease_log_set(sink_fn, &sink_main, LEASE_LOG_INFO);
    CHECK_RC(0, lease_campaign(&e, conf_store, name, &co));
    epoch = lease_election_epoch(e);
    snprintf(owner, sizeof(owner), "%s", lease_election_grant(e)->owner);
    assert_string_equal(lease_election_grant(e)->label, label);
    CHECK_RC(0, lease_resign(e));
    lease_log_set(NULL, NULL, LEASE_LOG_WARN);

    pthread_mutex_lock(&sink_main.mu);
    for (i = 0; i < sink_main.n; i++) {
        const unsigned char *c;
        for (c = (const unsigned char *)sink_main.lines[i]; *c; c++)
            if (*c < 0x20 || *c >= 0x7f)
                fail_msg("log line %zu has the raw byte 0x%02x: %s", i, *c,
                         sink_main.lines[i]);
    }
    pthread_mutex_unlock(&sink_main.mu);
    {
        const struct expect want[] = {
            { "acquired", "info", shown, owner, label, epoch },
            { "leader_elected", "info", shown, owner, label, epoch },
            { "released", "info", shown, owner, label, epoch },
            { "stepped_down", "info", shown, owner, label, epoch },
        };
        events = check_lines(&sink_main, LEASE_LOG_INFO, password);
        expect_events(events, want, sizeof(want) / sizeof(want[0]), &sink_main);
        json_decref(events);
    }
    sink_free(&sink_main);
}

/* ---- (6) metrics ------------------------------------------------------------ */

/* The value of one series, e.g. lease_renewals_total{store="sqlite"};
 * fails the test if it is missing or appears twice. */
static double metric(const char *text, const char *series)
{
    size_t len = strlen(series);
    const char *line = text, *found = NULL;
    double v = -1;

    while (line && *line) {
        const char *nl = strchr(line, '\n');
        if (line[0] != '#' && strncmp(line, series, len) == 0 && line[len] == ' ') {
            if (found)
                fail_msg("metrics: %s appears twice", series);
            found = line;
        }
        line = nl ? nl + 1 : NULL;
    }
    if (found == NULL)
        fail_msg("metrics: no series %s in:\n%s", series, text);
    if (sscanf(found + len + 1, "%lf", &v) != 1)
        fail_msg("metrics: %s has no number", series);
    return v;
}

static void expect_metric(const char *text, const char *fmt, const char *scheme,
                          double want)
{
    char series[256];
    double got;

    snprintf(series, sizeof(series), fmt, scheme);
    got = metric(text, series);
    if (got != want)
        fail_msg("metrics: %s is %g, expected %g", series, got, want);
}

/* Every sample line has the shape NAME{LABELS} VALUE, and every sample of
 * another store than ours is 0 (nothing else ran since the reset). */
static void check_metric_lines(const char *text, const char *scheme)
{
    char ours[64];
    const char *line = text;
    size_t n = strlen(text);

    if (n == 0 || text[n - 1] != '\n')
        fail_msg("metrics text does not end with a newline");
    snprintf(ours, sizeof(ours), "store=\"%s\"", scheme);
    while (*line) {
        const char *nl = strchr(line, '\n');
        char buf[512], *sp;
        size_t l = (size_t)(nl - line);

        if (l >= sizeof(buf))
            fail_msg("metrics line too long");
        memcpy(buf, line, l);
        buf[l] = '\0';
        line = nl + 1;
        if (buf[0] == '#') {
            if (strncmp(buf, "# HELP lease_", 13) != 0 && strncmp(buf, "# TYPE lease_", 13) != 0)
                fail_msg("metrics: odd comment line: %s", buf);
            continue;
        }
        sp = strrchr(buf, ' ');
        if (strncmp(buf, "lease_", 6) != 0 || sp == NULL || sp[-1] != '}' ||
            strchr(buf, '{') == NULL || strstr(buf, "store=\"") == NULL)
            fail_msg("metrics: a sample that is not NAME{LABELS} VALUE: %s", buf);
        if (strstr(buf, ours) == NULL && strtod(sp + 1, NULL) != 0)
            fail_msg("metrics: another store counted something: %s", buf);
    }
}

static void promtool_check(const char *text)
{
    char path[] = "/tmp/lease-metrics-XXXXXX", cmd[256];
    size_t len = strlen(text);
    int fd = mkstemp(path), status;

    if (fd < 0)
        fail_msg("mkstemp: %s", strerror(errno));
    if (conf_write_full(fd, text, len) != 0) {
        close(fd);
        unlink(path);
        fail_msg("cannot write %s", path);
    }
    close(fd);
    snprintf(cmd, sizeof(cmd), "promtool check metrics < '%s'", path);
    status = system(cmd);
    unlink(path);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("`promtool check metrics` failed (status %d) on:\n%s", status, text);
}

static void test_metrics(void **state)
{
    char key[LEASE_KEY_MAX + 1], res[LEASE_KEY_MAX + 1], a[LEASE_OWNER_BUFSZ],
        b[LEASE_OWNER_BUFSZ], name[LEASE_ELECTION_NAME_MAX + 1];
    const char *scheme = lease_store_scheme(conf_store);
    lease_campaign_opts co;
    lease_acquire_opts ob;
    struct stepdown_probe p;
    lease_election *d = NULL, *u = NULL;
    lease_grant g, g2, stale, gd;
    char *text = NULL;
    uint64_t mark;

    (void)state;
    conf_key(key, "metrics/lock");
    conf_key(res, "metrics/storage");
    elect_name(name, "metrics");
    conf_owner(a);
    conf_owner(b);

    /* ---- leases ---- */
    lease_metrics_reset();
    CHECK_RC(0, lease_metrics_text(&text));
    check_metric_lines(text, scheme);
    expect_metric(text, "lease_acquisitions_total{store=\"%s\",outcome=\"granted\"}", scheme, 0);
    free(text);

    g = conf_acquire(key, a, 30000, "metrics");
    ob = conf_opts(b, 30000, "other", 0);
    CHECK_FAIL(LEASE_EBUSY, lease_acquire(&g2, NULL, conf_store, key, &ob));
    CHECK_RC(0, lease_renew(&g, conf_store, 0));
    stale = g;
    CHECK_RC(0, lease_release(conf_store, &g));
    CHECK_FAIL(LEASE_ELOST, lease_renew(&stale, conf_store, 0));
    CHECK_RC(0, lease_fence_advance(&mark, conf_store, res, g.token + 1));
    CHECK_FAIL(LEASE_ESTALE, lease_fence_advance(&mark, conf_store, res, g.token));

    CHECK_RC(0, lease_metrics_text(&text));
    check_metric_lines(text, scheme);
    expect_metric(text, "lease_acquisitions_total{store=\"%s\",outcome=\"granted\"}", scheme, 1);
    expect_metric(text, "lease_acquisitions_total{store=\"%s\",outcome=\"busy\"}", scheme, 1);
    expect_metric(text, "lease_acquisitions_total{store=\"%s\",outcome=\"error\"}", scheme, 0);
    expect_metric(text, "lease_acquire_wait_seconds_count{store=\"%s\"}", scheme, 2);
    expect_metric(text, "lease_acquire_wait_seconds_bucket{store=\"%s\",le=\"+Inf\"}", scheme, 2);
    expect_metric(text, "lease_renewals_total{store=\"%s\"}", scheme, 1);
    expect_metric(text, "lease_renewal_failures_total{store=\"%s\"}", scheme, 1);
    expect_metric(text, "lease_losses_total{store=\"%s\",reason=\"lost\"}", scheme, 0);
    expect_metric(text, "lease_losses_total{store=\"%s\",reason=\"uncertain\"}", scheme, 0);
    expect_metric(text, "lease_held_seconds_count{store=\"%s\"}", scheme, 1);
    expect_metric(text, "lease_held_seconds_bucket{store=\"%s\",le=\"+Inf\"}", scheme, 1);
    expect_metric(text, "lease_leader_transitions_total{store=\"%s\"}", scheme, 0);
    expect_metric(text, "lease_fence_rejections_total{store=\"%s\"}", scheme, 1);
    promtool_check(text);
    free(text);

    /* ---- leadership: won, lost (taken away), won again, resigned ---- */
    lease_metrics_reset();
    probe_init(&p, -1);
    co = campaign_opts(3000, "metrics-deposed", 0);
    co.on_stepdown = on_stepdown;
    co.payload = &p;
    CHECK_RC(0, lease_campaign(&d, conf_store, name, &co));
    gd = *lease_election_grant(d);
    co = campaign_opts(30000, "metrics-usurper", 0);
    CHECK_FAIL(LEASE_EBUSY, lease_campaign(&u, conf_store, name, &co));
    CHECK_RC(0, lease_release(conf_store, &gd));
    CHECK_RC(0, lease_campaign(&u, conf_store, name, &co));
    assert_int_equal(wait_stepdown(&p, gd.ttl_ms), 1);
    CHECK_RC(LEASE_ELOST, atomic_load(&p.reason));
    CHECK_RC(0, lease_resign(d));
    CHECK_RC(0, lease_resign(u));

    CHECK_RC(0, lease_metrics_text(&text));
    check_metric_lines(text, scheme);
    expect_metric(text, "lease_acquisitions_total{store=\"%s\",outcome=\"granted\"}", scheme, 2);
    expect_metric(text, "lease_acquisitions_total{store=\"%s\",outcome=\"busy\"}", scheme, 1);
    expect_metric(text, "lease_acquisitions_total{store=\"%s\",outcome=\"error\"}", scheme, 0);
    expect_metric(text, "lease_acquire_wait_seconds_count{store=\"%s\"}", scheme, 3);
    expect_metric(text, "lease_renewal_failures_total{store=\"%s\"}", scheme, 1);
    expect_metric(text, "lease_losses_total{store=\"%s\",reason=\"lost\"}", scheme, 1);
    expect_metric(text, "lease_losses_total{store=\"%s\",reason=\"uncertain\"}", scheme, 0);
    /* won (deposed), stepped down, won (usurper), resigned; resigning
     * after the step-down is no transition. */
    expect_metric(text, "lease_leader_transitions_total{store=\"%s\"}", scheme, 4);
    expect_metric(text, "lease_fence_rejections_total{store=\"%s\"}", scheme, 0);
    promtool_check(text);
    free(text);

    lease_metrics_reset();
    CHECK_FAIL(LEASE_EINVALID, lease_metrics_text(NULL));
}

/* After a log test, failed or not: the default sink again. */
static int log_teardown(void **state)
{
    lease_log_set(NULL, NULL, LEASE_LOG_WARN);
    return conf_teardown(state);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        CONF_TEST(test_campaign_observe_resign),
        CONF_TEST(test_campaign_bad_args),
        CONF_TEST(test_stepdown_on_lost),
        CONF_TEST(test_paused_leader_steps_down),
        cmocka_unit_test_setup_teardown(test_log_lines, conf_setup, log_teardown),
        cmocka_unit_test_setup_teardown(test_log_hostile_text, conf_setup, log_teardown),
        CONF_TEST(test_metrics),
    };
    int failed;

    if (conf_init(argc, argv, "elect") != 0)
        return 2;
    failed = cmocka_run_group_tests_name("lease_election", tests, NULL, NULL);
    conf_store_close();
    return failed ? 1 : 0;
}
