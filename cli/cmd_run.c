/*
 * cmd_run.c - `lease run KEY -- CMD`: run a command under a lease, and stop
 * it before the lease's authority ends.
 *
 * The child runs in its own process group so that stopping it stops
 * everything it started (a shell's children too). Its authority is bounded
 * by the keeper's local deadline; the stop sequence is timed against that
 * deadline, not against the store:
 *
 *   term_at = deadline - grace - kill_margin   SIGTERM to the group
 *   kill_at = deadline - kill_margin           SIGKILL to the group
 *
 * so the child is gone before the deadline passes, even when renewals fail
 * silently (store unreachable). A lease the store says is lost starts the
 * same sequence at once.
 *
 * `lease hold` and `lease claim` (cmd_hold.c parses them) run their
 * command the same way under the grants of one session: its deadline is the
 * earliest of theirs, and the loss of any one of them stops the command.
 */
#define _GNU_SOURCE /* execvpe, pipe2 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "escape.h"

static const char usage_run[] =
    "usage: lease run KEY [--ttl DUR] [--wait DUR] [--label TEXT] [--grace DUR] [--json]\n"
    "                 [--pass-store] -- CMD [ARG...]\n"
    "\n"
    "Acquire KEY (waiting at most --wait), run CMD with LEASE_KEY, LEASE_TOKEN,\n"
    "LEASE_OWNER and LEASE_TTL_MS in its environment, renew in the background\n"
    "(every ttl/3), forward SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2\n"
    "to it, and release KEY when it exits. If the lease is lost, or renewals fail\n"
    "until the local deadline comes near, CMD's process group gets SIGTERM, then\n"
    "SIGKILL, so that it is gone before the deadline passes.\n"
    "  --ttl DUR     lease duration (default 30s)\n"
    "  --wait DUR    wait up to DUR for KEY (default: try once)\n"
    "  --label TEXT  holder label (default host:pid)\n"
    "  --grace DUR   time between SIGTERM and SIGKILL (default ttl/4, at most 10s)\n"
    "  --json        log events as JSON lines on stderr\n"
    "  --pass-store  give CMD the store URL (which may hold a password) as\n"
    "                LEASE_STORE; without it CMD's environment has no LEASE_STORE\n"
    "CMD inherits stdin, stdout, stderr and the descriptors you opened for it,\n"
    "nothing of the store's.\n"
    "exit: CMD's exit status (128+N if killed by signal N; 127 if CMD was not\n"
    "found, 126 if it could not be run); 4 if CMD had to be stopped because the\n"
    "lease was lost, or ran on past it (lost while running: lease itself was\n"
    "stopped past the deadline, or its release found KEY taken); 3, 6 or 7 if KEY\n"
    "could not be acquired.\n";

static const char usage_elect[] =
    "usage: lease elect NAME [--ttl DUR] [--wait DUR] [--label TEXT] [--grace DUR] [--json]\n"
    "                   [--pass-store] -- CMD [ARG...]\n"
    "\n"
    "Campaign for leadership of NAME (waiting at most --wait) and run CMD only while\n"
    "leader. CMD gets LEASE_KEY (election/NAME), LEASE_TOKEN and LEASE_EPOCH (the\n"
    "leader's epoch: carry it into every downstream write), LEASE_OWNER and\n"
    "LEASE_TTL_MS. Step-down policy: as soon as a renewal fails or the deadline\n"
    "comes near, leadership is uncertain and CMD's process group gets SIGTERM, then\n"
    "SIGKILL, so that it is gone before leadership ends. Options and exit codes as\n"
    "for lease run (4: CMD was stopped because leadership ended, or ran on past it;\n"
    "130: interrupted while campaigning).\n";

/* Wakes the main loop when authority ends. Both ends non-blocking: a
 * session may lose all its grants at once (a revoked etcd lease), one
 * byte each, and its thread must never block on a full pipe (the main
 * loop joins it after the child exits). A byte is only a wake-up, so a
 * byte dropped on a full pipe loses nothing. */
static int lost_pipe[2] = { -1, -1 };

/* Only a write to a pipe: the main loop does the rest. */
static void notify_lost(int reason)
{
    char c = reason == LEASE_ELOST ? 'L' : 'S';

    if (write(lost_pipe[1], &c, 1) < 0) {
        /* EAGAIN: the pipe is full of wake-ups already; anything else:
         * the deadline check stops the child anyway. */
    }
}

/* One grant a session lost, with its own reason. */
typedef struct {
    const lease_held *held;
    int reason;
    _Atomic int ready; /* set last: held and reason are written */
} lost_entry;

/*
 * The grants a session lost, as its thread reports them. There is room
 * for every grant the session can keep (each is lost once), so the
 * callback neither allocates nor waits for the main loop, which reads the
 * entries that are ready, in order.
 */
typedef struct {
    lost_entry *v;
    size_t cap;
    _Atomic size_t next; /* slots handed out to callbacks */
    size_t seen;         /* the main loop's: entries read */
} lost_record;

static void on_lost(lease_keeper *k, int reason, void *payload)
{
    (void)k;
    (void)payload;
    notify_lost(reason);
}

static void on_stepdown(lease_election *e, int reason, void *payload)
{
    (void)e;
    (void)payload;
    notify_lost(reason);
}

static void on_session_lost(lease_session *s, lease_held *h, int reason, void *payload)
{
    lost_record *r = payload;
    size_t i = atomic_fetch_add(&r->next, 1);

    (void)s;
    if (i < r->cap) {
        r->v[i].held = h;
        r->v[i].reason = reason;
        atomic_store_explicit(&r->v[i].ready, 1, memory_order_release);
    }
    notify_lost(reason);
}

/* A grant of a session, and its place in held[]: sorted by address, so
 * that a loss the session reports finds its grant in log n. */
typedef struct {
    const lease_held *held;
    size_t i;
} held_index;

/* What the child's authority comes from: a kept lease, a leadership, or
 * the grants of a session (held[0..n), with their shard numbers for
 * claim, whether each one's loss was logged yet, the losses its thread
 * reported, and held[] by address). */
typedef struct {
    lease_keeper *keeper;
    lease_election *election;
    lease_session *session;
    lease_held **held;
    size_t *shard;
    unsigned char *lost_logged;
    size_t n;
    lost_record lost;
    held_index *index;
} authority;

/* A session's authority ends with the first of its grants' deadlines. */
static int64_t auth_deadline(const authority *au)
{
    int64_t first = INT64_MAX;
    size_t i;

    if (au->election)
        return lease_election_deadline_ns(au->election);
    if (au->keeper)
        return lease_keeper_deadline_ns(au->keeper);
    for (i = 0; i < au->n; i++) {
        int64_t d = lease_held_deadline_ns(au->held[i]);
        if (d < first)
            first = d;
    }
    return au->n ? first : 0;
}

/* A session's authority holds while every one of its grants does. */
static int auth_valid(const authority *au)
{
    size_t i;

    if (au->election)
        return lease_election_is_leader(au->election);
    if (au->keeper)
        return lease_keeper_valid(au->keeper);
    for (i = 0; i < au->n; i++)
        if (!lease_held_valid(au->held[i]))
            return 0;
    return au->n > 0;
}

/* After the session is closed: no callback can run any more. */
static void auth_free(authority *au)
{
    free(au->held);
    free(au->shard);
    free(au->lost_logged);
    free(au->lost.v);
    free(au->index);
    au->held = NULL;
    au->shard = NULL;
    au->lost_logged = NULL;
    au->lost.v = NULL;
    au->lost.cap = 0;
    au->index = NULL;
    au->n = 0;
}

/* Is a SIGINT, SIGTERM or SIGHUP pending? They are blocked while a long
 * wait goes on (the renewing thread must not take them), so the wait goes
 * in slices and asks between two. */
static int run_interrupted(void)
{
    sigset_t pending;

    sigpending(&pending);
    return sigismember(&pending, SIGINT) || sigismember(&pending, SIGTERM) ||
           sigismember(&pending, SIGHUP);
}

/* Campaign in slices, so that a SIGINT or SIGTERM (blocked: the renewing
 * thread must not take it) still ends a long wait promptly. */
static int campaign(lease_election **e, lease_store *s, const char *name,
                    lease_campaign_opts *co, uint64_t wait_ms)
{
    int64_t end = lease_clock_ns() + (int64_t)wait_ms * 1000000;
    int rc;

    for (;;) {
        int64_t left = (end - lease_clock_ns()) / 1000000;

        co->wait_ms = left <= 0 ? 0 : left > 200 ? 200 : (uint64_t)left;
        rc = lease_campaign(e, s, name, co);
        if ((rc != LEASE_EBUSY && rc != LEASE_ETIMEOUT) || left <= 200)
            return rc;
        if (run_interrupted())
            return 1;
    }
}

/* What an event names: one key and its token, or (key NULL) the `count`
 * grants of a hold or claim. `cmd` starts its text lines. */
typedef struct {
    int json;
    const char *key;
    uint64_t token;
    const char *cmd;
    size_t count;
} run_log;

static void event_prefix(const run_log *l)
{
    fprintf(stderr, "lease %s: ", l->cmd);
    if (l->key)
        cli_put_text(stderr, l->key);
    else
        fprintf(stderr, "%zu key%s", l->count, l->count == 1 ? "" : "s");
}

/* One event line on stderr: JSON with --json, short text otherwise.
 * Quiet events (acquired, released...) are only printed with --json.
 * The key is the user's bytes: escaped (escape.h), so that an event is
 * never dropped for a key that is not UTF-8 nor printed raw. */
static void event(const run_log *l, const char *name, int loud, json_t *extra)
{
    if (l->json) {
        json_t *o = l->key ? json_pack("{s:s, s:o, s:I, s:I}", "event", name,
                                       "key", cli_json_str(l->key),
                                       "token", (json_int_t)l->token,
                                       "t_ns", (json_int_t)lease_clock_ns())
                           : json_pack("{s:s, s:I, s:I}", "event", name,
                                       "count", (json_int_t)l->count,
                                       "t_ns", (json_int_t)lease_clock_ns());
        char *text;

        if (o && extra)
            json_object_update(o, extra);
        if (o && (text = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII)) != NULL) {
            fprintf(stderr, "%s\n", text);
            free(text);
        }
        json_decref(o);
    } else if (loud) {
        event_prefix(l);
        if (l->key)
            fprintf(stderr, ": %s (token %llu)\n", name, (unsigned long long)l->token);
        else
            fprintf(stderr, ": %s\n", name);
    }
    json_decref(extra);
}

/* An event of one grant of a session: its key and token. */
static void event_held(const run_log *l, const lease_held *h, const char *name,
                       int loud, json_t *extra)
{
    run_log one = *l;

    one.key = lease_held_grant(h)->key;
    one.token = lease_held_token(h);
    event(&one, name, loud, extra);
}

static int cmp_held_index(const void *x, const void *y)
{
    uintptr_t a = (uintptr_t)((const held_index *)x)->held;
    uintptr_t b = (uintptr_t)((const held_index *)y)->held;

    return a < b ? -1 : a > b;
}

/* held[] by address, once the grants are in place. 0 or LEASE_ENOMEM. */
static int auth_index(authority *au)
{
    size_t i;

    if ((au->index = malloc((au->n ? au->n : 1) * sizeof(*au->index))) == NULL)
        return LEASE_ENOMEM;
    for (i = 0; i < au->n; i++) {
        au->index[i].held = au->held[i];
        au->index[i].i = i;
    }
    qsort(au->index, au->n, sizeof(*au->index), cmp_held_index);
    return 0;
}

/* Where h is in held[]; n when it is none of them (a grant lost during a
 * claim is kept by the session but not counted). */
static size_t auth_find(const authority *au, const lease_held *h)
{
    held_index key = { h, 0 }, *found;

    if (au->index == NULL)
        return au->n;
    found = bsearch(&key, au->index, au->n, sizeof(*au->index), cmp_held_index);
    return found ? found->i : au->n;
}

/* Each grant the session's thread reported lost since the last call: one
 * "lost" event, once, with the reason the session gave for that grant. */
static void auth_log_lost(authority *au, const run_log *log)
{
    lost_record *r = &au->lost;

    while (r->seen < r->cap &&
           atomic_load_explicit(&r->v[r->seen].ready, memory_order_acquire)) {
        const lost_entry *e = &r->v[r->seen++];
        size_t i = auth_find(au, e->held);

        if (i == au->n || au->lost_logged[i])
            continue;
        au->lost_logged[i] = 1;
        event_held(log, au->held[i], "lost", 1,
                   json_pack("{s:s}", "reason", e->reason == LEASE_ELOST ? "ELOST" : "ESTORE"));
    }
}

/* Ends the authority; releases when `release` is set (the lease may still
 * be ours). A session releases each of its grants that is still valid,
 * whatever became of the others, and logs each release: LEASE_ELOST if
 * one of them found its key taken, else the first failure. */
static int auth_end(const authority *au, int release, const run_log *log)
{
    char key[LEASE_KEY_MAX + 1];
    run_log one = *log;
    int rc = 0, r;
    size_t i;

    if (au->election)
        return lease_resign(au->election);
    if (au->keeper)
        return lease_keeper_stop(NULL, au->keeper, release);
    for (i = 0; i < au->n; i++) {
        if (!lease_held_valid(au->held[i]))
            continue;
        /* The release frees the grant: its key is copied first. */
        snprintf(key, sizeof(key), "%s", lease_held_grant(au->held[i])->key);
        one.key = key;
        one.token = lease_held_token(au->held[i]);
        r = lease_session_release(au->session, au->held[i]);
        au->held[i] = NULL;
        event(&one, r == 0 ? "released" : "release_failed", r != 0, NULL);
        if (r == LEASE_ELOST || (rc == 0 && r < 0))
            rc = r;
    }
    /* What is left was lost. A grant lost for want of an answer may still
     * be held in the store: close releases it, guarded by owner and token
     * (a refused one costs nothing), so that its key is free before its
     * ttl runs out. Its outcome changes nothing here: it was reported. */
    lease_session_close(au->session, 1);
    return rc;
}

typedef cli_run_opts run_opts;

static int run_parse(cli_globals *g, cli_args *a, run_opts *o)
{
    int rc = 0;

    for (a->i = 0; a->i < a->argc && rc == 0; a->i++) {
        const char *arg = a->argv[a->i], *v;

        if (strcmp(arg, "--") == 0) {
            o->cmd_at = a->i + 1;
            break;
        }
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(o->elect ? usage_elect : usage_run, stdout);
            return -1;
        }
        if (cli_parse_global(g, a, arg, &rc))
            continue;
        if (cli_flag_is(arg, "--ttl")) {
            if ((v = cli_value(a, arg, &rc)))
                rc = cli_duration(&o->ttl_ms, a->cmd, "--ttl", v, 0);
        } else if (cli_flag_is(arg, "--wait")) {
            if ((v = cli_value(a, arg, &rc)))
                rc = cli_duration(&o->wait_ms, a->cmd, "--wait", v, 1);
        } else if (cli_flag_is(arg, "--grace")) {
            if ((v = cli_value(a, arg, &rc)))
                rc = cli_duration(&o->grace_ms, a->cmd, "--grace", v, 1);
            o->has_grace = 1;
        } else if (cli_flag_is(arg, "--label")) {
            o->label = cli_value(a, arg, &rc);
        } else if (strcmp(arg, "--pass-store") == 0) {
            o->pass_store = 1;
        } else if ((rc = cli_positional(a, arg, &o->key, " (put the command after --)"))) {
            return rc;
        }
    }
    return rc;
}

/* Everything the library would refuse, refused here first: exit 2 before
 * any connection. Then the stop timing, from the ttl: SIGKILL lands
 * kill_margin before the deadline (time to deliver it and reap), SIGTERM
 * `grace` before that. */
static int run_check(cli_args *a, run_opts *o)
{
    int rc;

    if (o->elect && (rc = cli_election_name(a, o->key)))
        return rc;
    if (o->key == NULL)
        return cli_usage(a->cmd, "missing KEY");
    if (!lease_key_valid(o->key))
        return cli_usage(a->cmd, "KEY must be 1 to %d bytes", LEASE_KEY_MAX);
    if ((rc = cli_check_label(a, o->label)))
        return rc;
    if (o->cmd_at < 0 || o->cmd_at >= a->argc)
        return cli_usage(a->cmd, "missing the command: lease %s %s -- CMD [ARG...]",
                         a->cmd, o->elect ? "NAME" : "KEY");
    return cli_run_timing(a, o);
}

int cli_run_timing(cli_args *a, cli_run_opts *o)
{
    if (a == NULL || o == NULL)
        return EXIT_FAIL;
    o->kill_margin_ms = o->ttl_ms / 20 > 1000 ? 1000 : o->ttl_ms / 20;
    if (o->kill_margin_ms == 0)
        o->kill_margin_ms = 1;
    if (!o->has_grace)
        o->grace_ms = o->ttl_ms / 4 > 10000 ? 10000 : o->ttl_ms / 4;
    if (o->grace_ms + o->kill_margin_ms >= o->ttl_ms)
        return cli_usage(a->cmd, "--grace must be well below the ttl");
    return 0;
}

/* "NAME=value" in a new string (NULL when out of memory). */
static char *run_env_var(const char *name, const char *value)
{
    size_t n = strlen(name), m = strlen(value);
    char *s = malloc(n + m + 2);

    if (s) {
        memcpy(s, name, n);
        s[n] = '=';
        memcpy(s + n + 1, value, m + 1);
    }
    return s;
}

/* Frees what run_env_build() made: its first `ours` entries (the rest
 * point into environ) and the array. */
static void run_env_free(char **env, size_t ours)
{
    size_t i;

    for (i = 0; i < ours; i++)
        free(env[i]);
    free(env);
}

/* Is entry "STEM<digits>=..."? */
static int run_env_numbered(const char *entry, const char *stem)
{
    size_t n = strlen(stem);
    const char *p = entry + n;

    if (strncmp(entry, stem, n) != 0 || !isdigit((unsigned char)*p))
        return 0;
    while (isdigit((unsigned char)*p))
        p++;
    return *p == '=';
}

/* Names the child gets from us alone: the user's own are dropped, so that
 * a LEASE_TOKEN of an outer run, or a LEASE_KEY_3 of an outer hold, is never
 * mistaken for this one's. And LEASE_STORE, which may hold a password,
 * unless --pass-store. */
static int run_env_replaced(const char *entry)
{
    static const char *const names[] = { "LEASE_STORE=", "LEASE_KEY=", "LEASE_TOKEN=",
                                         "LEASE_OWNER=", "LEASE_TTL_MS=", "LEASE_EPOCH=",
                                         "LEASE_COUNT=", "LEASE_SHARDS=" };
    static const char *const stems[] = { "LEASE_KEY_", "LEASE_TOKEN_", "LEASE_SHARD_" };
    size_t i;

    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strncmp(entry, names[i], strlen(names[i])) == 0)
            return 1;
    for (i = 0; i < sizeof(stems) / sizeof(stems[0]); i++)
        if (run_env_numbered(entry, stems[i]))
            return 1;
    return 0;
}

/*
 * A session's grants, into env[*k ...]: LEASE_COUNT, then LEASE_KEY_<i> and
 * LEASE_TOKEN_<i> for each (and for claim LEASE_SHARD_<i>, and LEASE_SHARDS,
 * the shard numbers in ascending order, space-separated). Each key is the
 * whole value of a variable of its own, so that no byte a key may hold
 * (spaces, '=', newlines) can make it ambiguous. An entry left NULL means
 * out of memory.
 */
static void run_env_grants(char **env, size_t *k, const authority *au)
{
    char name[48], num[32], *shards = NULL;
    size_t i, len = 0;

    snprintf(num, sizeof(num), "%zu", au->n);
    env[(*k)++] = run_env_var("LEASE_COUNT", num);
    /* A shard number is at most 20 digits, plus a space. */
    if (au->shard && (shards = malloc(au->n * 21 + 1)) != NULL)
        shards[0] = '\0';
    for (i = 0; i < au->n; i++) {
        snprintf(name, sizeof(name), "LEASE_KEY_%zu", i);
        env[(*k)++] = run_env_var(name, lease_held_grant(au->held[i])->key);
        snprintf(name, sizeof(name), "LEASE_TOKEN_%zu", i);
        snprintf(num, sizeof(num), "%llu", (unsigned long long)lease_held_token(au->held[i]));
        env[(*k)++] = run_env_var(name, num);
        if (au->shard == NULL)
            continue;
        snprintf(name, sizeof(name), "LEASE_SHARD_%zu", i);
        snprintf(num, sizeof(num), "%zu", au->shard[i]);
        env[(*k)++] = run_env_var(name, num);
        if (shards)
            len += (size_t)sprintf(shards + len, "%s%s", i ? " " : "", num);
    }
    if (au->shard)
        env[(*k)++] = shards ? run_env_var("LEASE_SHARDS", shards) : NULL;
    free(shards);
}

/*
 * The child's environment, built before fork: after fork in a process with
 * a renewing thread only async-signal-safe calls are safe, so no setenv()
 * there. The first *ours entries are new strings (run_env_free()).
 */
static char **run_env_build(const authority *au, const lease_grant *g, const run_opts *o,
                            const char *store_url, size_t *ours)
{
    extern char **environ;
    char num[32], **env;
    size_t n = 0, k = 0, i;

    while (environ[n])
        n++;
    if ((env = calloc(n + 8 + 3 * au->n + 2, sizeof(*env))) == NULL)
        return NULL;
    /* A session's command gets no LEASE_KEY nor LEASE_TOKEN: one written
     * for lease run must not take one grant for all of them. */
    if (au->session) {
        run_env_grants(env, &k, au);
    } else {
        env[k++] = run_env_var("LEASE_KEY", g->key);
        snprintf(num, sizeof(num), "%llu", (unsigned long long)g->token);
        env[k++] = run_env_var("LEASE_TOKEN", num);
    }
    env[k++] = run_env_var("LEASE_OWNER", g->owner);
    snprintf(num, sizeof(num), "%llu", (unsigned long long)g->token);
    if (o->elect)
        env[k++] = run_env_var("LEASE_EPOCH", num);
    snprintf(num, sizeof(num), "%llu", (unsigned long long)g->ttl_ms);
    env[k++] = run_env_var("LEASE_TTL_MS", num);
    if (o->pass_store && store_url)
        env[k++] = run_env_var("LEASE_STORE", store_url);
    *ours = k;
    for (i = 0; i < k; i++) {
        if (env[i] == NULL) {
            run_env_free(env, k);
            return NULL;
        }
    }
    for (i = 0; i < n; i++)
        if (!run_env_replaced(environ[i]))
            env[k++] = environ[i];
    return env;
}

/* The command the user typed, for the child's one error line: run, elect,
 * hold and claim all start their command here. */
static const char *run_cmd_name(const cli_run_opts *o)
{
    if (o->elect)
        return "elect";
    if (o->keys != NULL)
        return o->want ? "claim" : "hold";
    return "run";
}

static pid_t start_child(char **argv, char **env, const char *cmd, sigset_t *oldmask)
{
    pid_t pid = fork();

    if (pid == 0) {
        setpgid(0, 0);
        /* If `lease run` dies, nothing renews: the child must not outlive it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1)
            _exit(127);
        sigprocmask(SIG_SETMASK, oldmask, NULL);
        execvpe(argv[0], argv, env);
        int err = errno; /* fprintf may change errno before the exit code reads it */
        fprintf(stderr, "lease %s: cannot run %s: %s\n", cmd, argv[0], strerror(err));
        _exit(err == ENOENT ? 127 : 126);
    }
    if (pid > 0)
        setpgid(pid, pid); /* also here: no race with the first kill */
    return pid;
}

/* Starts the child with the environment of run_env_build(). */
static pid_t run_spawn(char **argv, const authority *au, const lease_grant *g,
                       const run_opts *o, const cli_globals *gl, sigset_t *oldmask)
{
    const char *url = gl->store_url ? gl->store_url : getenv("LEASE_STORE");
    size_t ours = 0;
    char **env = run_env_build(au, g, o, url, &ours);
    pid_t pid;

    if (env == NULL) {
        errno = ENOMEM;
        return -1;
    }
    pid = start_child(argv, env, run_cmd_name(o), oldmask);
    run_env_free(env, ours);
    return pid;
}

/* The signals we forward, and SIGCHLD: read from a signalfd. */
static void run_sigmask(sigset_t *mask)
{
    sigemptyset(mask);
    sigaddset(mask, SIGCHLD);
    sigaddset(mask, SIGINT);
    sigaddset(mask, SIGTERM);
    sigaddset(mask, SIGHUP);
    sigaddset(mask, SIGQUIT);
    sigaddset(mask, SIGUSR1);
    sigaddset(mask, SIGUSR2);
}

/* run: acquire the lease, then keep it renewed. The forwarded signals are
 * blocked before the renewing thread starts: it inherits the mask, and
 * signalfd only sees signals blocked in every thread (otherwise SIGTERM
 * could kill us from that thread). The lease is acquired before that, so
 * that a long --wait stays interruptible. A negative LEASE_E* code, 0, or
 * an exit code (the error already printed). */
static int run_keep(authority *au, lease_grant *grant, lease_store *s,
                    const run_opts *o, const sigset_t *mask, sigset_t *oldmask)
{
    lease_acquire_opts ao = LEASE_ACQUIRE_OPTS_INIT;
    lease_keeper_opts ko = LEASE_KEEPER_OPTS_INIT;
    char owner[LEASE_OWNER_BUFSZ];
    int rc;

    if ((rc = lease_owner_new(owner)) < 0)
        return rc;
    ao.owner = owner;
    ao.ttl_ms = o->ttl_ms;
    ao.label = o->label;
    ao.wait_ms = o->wait_ms;
    if ((rc = lease_acquire(grant, NULL, s, o->key, &ao)) < 0)
        return rc;
    sigprocmask(SIG_BLOCK, mask, oldmask);
    ko.on_lost = on_lost;
    if ((rc = lease_keeper_start(&au->keeper, s, grant, &ko)) < 0) {
        rc = cli_fail(rc, "run");
        lease_release(s, grant);
    }
    return rc;
}

/* elect: campaign with the signals blocked from the start (the election
 * starts its renewing thread itself). */
static int run_lead(authority *au, lease_grant *grant, lease_store *s,
                    const run_opts *o, const sigset_t *mask, sigset_t *oldmask)
{
    lease_campaign_opts co = LEASE_CAMPAIGN_OPTS_INIT;
    int rc;

    sigprocmask(SIG_BLOCK, mask, oldmask);
    co.ttl_ms = o->ttl_ms;
    co.label = o->label;
    co.on_stepdown = on_stepdown;
    rc = campaign(&au->election, s, o->key, &co, o->wait_ms);
    if (rc == 1) {
        fputs("lease elect: interrupted while campaigning for '", stderr);
        cli_put_text(stderr, o->key);
        fputs("'\n", stderr);
        return 130;
    }
    if (rc == 0)
        *grant = *lease_election_grant(au->election);
    return rc;
}

/* hold: one key into the session, waiting at most wait_ms in slices as
 * campaign() does. A store failure is retried too while the wait lasts
 * (an outage may be shorter than the wait), after a pause: it may come
 * back at once. 1 if interrupted. */
static int hold_one(lease_held **h, lease_session *se, const char *key, uint64_t wait_ms)
{
    int64_t end = lease_clock_ns() + (int64_t)wait_ms * 1000000;
    int rc;

    for (;;) {
        int64_t left = (end - lease_clock_ns()) / 1000000;
        uint64_t slice = left <= 0 ? 0 : left > 200 ? 200 : (uint64_t)left;

        rc = lease_session_acquire(h, NULL, se, key, slice, NULL, NULL);
        if ((rc != LEASE_EBUSY && rc != LEASE_ETIMEOUT && rc != LEASE_ESTORE) || left <= 200)
            break;
        if (rc == LEASE_ESTORE)
            poll(NULL, 0, 100);
        if (run_interrupted())
            return 1;
    }
    /* A last slice of 0 ms says busy: after a wait, that is a timeout. */
    return rc == LEASE_EBUSY && wait_ms > 0 ? LEASE_ETIMEOUT : rc;
}

static int cmp_key_ptr(const void *x, const void *y)
{
    return strcmp(**(char **const *)x, **(char **const *)y);
}

/* hold: the keys in byte order (strcmp's), so that two holds of the same
 * keys given in different orders take them in the same order and one of
 * them waits for the other, instead of each holding a key the other waits
 * for. NULL when out of memory. */
static char ***hold_order(const run_opts *o)
{
    char ***order = malloc(o->nkeys * sizeof(*order));
    size_t i;

    if (order == NULL)
        return NULL;
    for (i = 0; i < o->nkeys; i++)
        order[i] = &o->keys[i];
    qsort(order, o->nkeys, sizeof(*order), cmp_key_ptr);
    return order;
}

/* hold: every key, in byte order, each into its place in held[] (the order
 * given, which LEASE_KEY_<i> keeps). On a key that cannot be had, the exit
 * code (the message names the key); the caller's close releases the
 * others. */
static int session_hold(authority *au, const run_opts *o, const char *cmd)
{
    char ***order = hold_order(o);
    size_t k, i = 0, got = 0;
    int rc = 0;

    if (order == NULL) {
        fprintf(stderr, "lease %s: out of memory\n", cmd);
        return EXIT_FAIL;
    }
    for (k = 0; k < o->nkeys && rc == 0; k++, got += rc == 0) {
        i = (size_t)(order[k] - o->keys);
        rc = hold_one(&au->held[i], au->session, o->keys[i], o->wait_ms);
    }
    free(order);
    if (rc == 0) {
        au->n = o->nkeys;
        return 0;
    }
    if (rc == 1) {
        rc = 130;
        fprintf(stderr, "lease %s: interrupted while waiting for ", cmd);
    } else {
        rc = cli_fail(rc, cmd);
        fprintf(stderr, "lease %s: could not acquire ", cmd);
    }
    cli_put_text(stderr, o->keys[i]);
    if (got == 0)
        fputs("; no key was acquired before it\n", stderr);
    else
        fprintf(stderr, "; releasing the %zu key%s acquired before it\n", got,
                got == 1 ? "" : "s");
    return rc;
}

/* claim: up to `want` of the shards; au->held and au->shard get those held,
 * in shard order. None: exit 3. */
static int session_claim(authority *au, const run_opts *o, const char *cmd)
{
    lease_held **out = calloc(o->nkeys, sizeof(*out));
    size_t count = 0, i;
    int rc;

    if (out == NULL) {
        fprintf(stderr, "lease %s: out of memory\n", cmd);
        return EXIT_FAIL;
    }
    rc = lease_session_claim(&count, out, au->session, (const char *const *)o->keys,
                             o->nkeys, o->want);
    for (i = 0; rc == 0 && i < o->nkeys; i++) {
        if (out[i] && lease_held_state(out[i]) == LEASE_KEEPER_HELD) {
            au->held[au->n] = out[i];
            au->shard[au->n++] = i;
        }
    }
    free(out);
    if (rc < 0)
        return cli_fail(rc, cmd);
    if (au->n == 0) {
        fprintf(stderr, "lease %s: EBUSY: none of the %zu shards ", cmd, o->nkeys);
        cli_put_text(stderr, o->key);
        fprintf(stderr, "/0 .. ");
        cli_put_text(stderr, o->key);
        fprintf(stderr, "/%zu could be claimed: all are held by others\n", o->nkeys - 1);
        return EXIT_BUSY;
    }
    return 0;
}

/* hold and claim: a session whose thread starts with the signals blocked
 * (it inherits the mask), then the keys. On failure every key acquired is
 * released. 0, a negative LEASE_E* code or an exit code. */
static int run_session(authority *au, lease_store *s, const run_opts *o, const char *cmd,
                       const sigset_t *mask, sigset_t *oldmask)
{
    lease_session_opts so = LEASE_SESSION_OPTS_INIT;
    char owner[LEASE_OWNER_BUFSZ];
    int rc;

    if ((rc = lease_owner_new(owner)) < 0)
        return rc;
    au->held = calloc(o->nkeys, sizeof(*au->held));
    au->lost_logged = calloc(o->nkeys, 1);
    au->lost.v = calloc(o->nkeys, sizeof(*au->lost.v));
    au->lost.cap = o->nkeys;
    if (o->want)
        au->shard = calloc(o->nkeys, sizeof(*au->shard));
    if (au->held == NULL || au->lost_logged == NULL || au->lost.v == NULL ||
        (o->want && au->shard == NULL)) {
        fprintf(stderr, "lease %s: out of memory\n", cmd);
        return EXIT_FAIL;
    }
    so.owner = owner;
    so.ttl_ms = o->ttl_ms;
    so.label = o->label;
    so.on_lost = on_session_lost;
    so.payload = &au->lost;
    sigprocmask(SIG_BLOCK, mask, oldmask);
    if ((rc = lease_session_open(&au->session, s, &so)) < 0)
        return rc;
    rc = o->want ? session_claim(au, o, cmd) : session_hold(au, o, cmd);
    if (rc == 0 && auth_index(au) < 0) {
        fprintf(stderr, "lease %s: out of memory\n", cmd);
        rc = EXIT_FAIL;
    }
    if (rc != 0) {
        lease_session_close(au->session, 1);
        au->session = NULL;
        au->n = 0;
    }
    return rc;
}

/* Opens the store, takes the authority, closes the store (the keeper,
 * election or session keeps its own connection). 0, or the exit code. */
static int run_acquire(authority *au, lease_grant *grant, cli_globals *g,
                       cli_args *a, const run_opts *o, sigset_t *oldmask)
{
    lease_store *s;
    sigset_t mask;
    int rc;

    if ((rc = cli_open_store(&s, g)))
        return rc;
    run_sigmask(&mask);
    if (o->keys)
        rc = run_session(au, s, o, a->cmd, &mask, oldmask);
    else if (o->elect)
        rc = run_lead(au, grant, s, o, &mask, oldmask);
    else
        rc = run_keep(au, grant, s, o, &mask, oldmask);
    /* A session's command gets the owner and ttl of its first grant
     * (every grant of a session has both the same). */
    if (rc == 0 && o->keys)
        *grant = *lease_held_grant(au->held[0]);
    if (rc < 0)
        rc = cli_fail(rc, a->cmd);
    lease_store_close(s);
    return rc;
}

/* Where the stop sequence stands. */
typedef struct {
    pid_t child;
    int stopped_for_loss;
    int64_t term_sent, kill_sent, kill_at_fixed;
} run_stop;

/*
 * One pass of the stop sequence, timed against the local deadline:
 *   term_at = deadline - grace - kill_margin   SIGTERM to the group
 *   kill_at = deadline - kill_margin           SIGKILL to the group
 * Returns how long poll() may wait (at most 50 ms).
 */
static int run_stop_step(run_stop *st, const authority *au, const run_opts *o,
                         const run_log *log)
{
    int64_t now, deadline = auth_deadline(au), next;
    int64_t term_at = deadline - (int64_t)(o->grace_ms + o->kill_margin_ms) * 1000000;
    int64_t kill_at = st->kill_at_fixed ? st->kill_at_fixed
                                        : deadline - (int64_t)o->kill_margin_ms * 1000000;
    int timeout_ms;

    now = lease_clock_ns();
    /* A leader stops at once when leadership becomes uncertain. */
    if (o->elect && !auth_valid(au))
        st->stopped_for_loss = 1;
    if (!st->term_sent && (now >= term_at || st->stopped_for_loss)) {
        st->stopped_for_loss = 1;
        st->term_sent = now;
        /* Once stopping, the kill time is fixed: a late renewal must not
         * push it beyond the deadline we started from. */
        if (!st->kill_at_fixed) {
            st->kill_at_fixed = now + (int64_t)o->grace_ms * 1000000;
            if (st->kill_at_fixed > kill_at)
                st->kill_at_fixed = kill_at;
            kill_at = st->kill_at_fixed;
        }
        kill(-st->child, SIGTERM);
        event(log, "stopping", 1, json_pack("{s:s, s:I}", "signal", "SIGTERM",
                                            "deadline_ns", (json_int_t)deadline));
    }
    if (st->term_sent && !st->kill_sent && now >= kill_at) {
        st->kill_sent = now;
        kill(-st->child, SIGKILL);
        event(log, "stopping", 1, json_pack("{s:s, s:I}", "signal", "SIGKILL",
                                            "deadline_ns", (json_int_t)deadline));
    }
    next = st->term_sent ? (st->kill_sent ? now + 50000000 : kill_at) : term_at;
    timeout_ms = (int)((next - now) / 1000000);
    return timeout_ms < 0 ? 0 : timeout_ms > 50 ? 50 : timeout_ms;
}

/* Reads the wake-ups waiting in the pipe, many at a time (a session may
 * have written one per grant): the first one's reason, or 0 if none.
 * Bounded: a full pipe is drained in a few reads, and what a thread
 * writes meanwhile wakes the next pass. */
static char lost_drain(void)
{
    char buf[4096], first = 0;
    ssize_t got;
    int reads;

    for (reads = 0; reads < 64; reads++) {
        got = read(lost_pipe[0], buf, sizeof(buf));
        if (got <= 0)
            break;
        if (first == 0)
            first = buf[0];
    }
    return first;
}

/* Waits for the child, forwarding signals and stopping it in time.
 * Bounded: every pass waits at most 50 ms, and the stop sequence ends the
 * child (SIGKILL cannot be ignored) before the local deadline. */
static int run_wait(run_stop *st, int sfd, authority *au,
                    const run_opts *o, const run_log *log)
{
    int status = 0;
    char c;

    for (;;) {
        struct pollfd fds[2] = { { sfd, POLLIN, 0 }, { lost_pipe[0], POLLIN, 0 } };
        int timeout_ms = run_stop_step(st, au, o, log);

        if (poll(fds, 2, timeout_ms) < 0 && errno != EINTR)
            break;
        if ((fds[1].revents & POLLIN) && (c = lost_drain()) != 0) {
            /* A session names each grant lost, with its own reason;
             * a keeper or an election has one lease to lose. */
            if (au->session)
                auth_log_lost(au, log);
            else if (!st->stopped_for_loss)
                event(log, "lost", 1, json_pack("{s:s}", "reason",
                                                c == 'L' ? "ELOST" : "ESTORE"));
            st->stopped_for_loss = 1;
        }
        if (fds[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            if (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si) &&
                si.ssi_signo != SIGCHLD) {
                kill(-st->child, (int)si.ssi_signo);
                event(log, "forwarded", 0, json_pack("{s:i}", "signal", (int)si.ssi_signo));
            }
        }
        if (waitpid(st->child, &status, WNOHANG) == st->child)
            break;
    }
    return status;
}

/* After the child: end its group, log, release while the lease may still
 * be ours (so the next holder need not wait for the ttl). A child whose
 * exit was seen only after the local deadline (the supervisor was stopped
 * or starved, so it could not stop the child in time), or whose release
 * found the lease taken, ran without authority at some point: that is
 * said ("lost while running") and exits 4, not the child's code, so that a
 * scheduler does not take the work for done under the lease. A child
 * stopped in time for a loss exits 4 as well, without that line. */
static int run_finish(const run_stop *st, int status, const authority *au,
                      const run_log *log)
{
    int64_t exited = lease_clock_ns(), deadline = auth_deadline(au);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    int valid = auth_valid(au), rc;
    const char *why = NULL;

    kill(-st->child, SIGKILL);
    event(log, "exited", st->stopped_for_loss,
          json_pack("{s:i, s:I, s:I, s:b}", "code", code, "exited_ns",
                    (json_int_t)exited, "deadline_ns", (json_int_t)deadline,
                    "before_deadline", exited < deadline));
    rc = auth_end(au, valid, log);
    if (valid && !au->session)
        event(log, rc == 0 ? "released" : "release_failed", rc != 0, NULL);
    if (exited >= deadline)
        why = "the lease ended before the command's exit was seen";
    else if (valid && rc == LEASE_ELOST)
        why = "its release found the lease taken";
    if (why) {
        event(log, "lost_while_running", 0,
              json_pack("{s:i, s:s}", "code", code, "reason", why));
        if (!log->json) {
            event_prefix(log);
            if (log->key)
                fprintf(stderr, ": lost while running (token %llu)",
                        (unsigned long long)log->token);
            else
                fputs(": lost while running", stderr);
            fprintf(stderr, ": %s; the command exited %d, lease exits 4\n", why, code);
        }
        return EXIT_LOST;
    }
    return st->stopped_for_loss ? EXIT_LOST : code;
}

/* One "acquired" event per grant: the keeper's or leader's, or each of a
 * session's with its own key and token (and shard, for claim). */
static void log_acquired(const authority *au, const lease_grant *grant, const run_log *log)
{
    size_t i;

    if (au->session == NULL) {
        event(log, "acquired", 0,
              json_pack("{s:s, s:I, s:I}", "owner", grant->owner, "ttl_ms",
                        (json_int_t)grant->ttl_ms, "deadline_ns",
                        (json_int_t)grant->deadline_ns));
        return;
    }
    for (i = 0; i < au->n; i++) {
        const lease_grant *g = lease_held_grant(au->held[i]);
        json_t *extra = json_pack("{s:s, s:I, s:I}", "owner", g->owner, "ttl_ms",
                                  (json_int_t)g->ttl_ms, "deadline_ns",
                                  (json_int_t)g->deadline_ns);

        if (extra && au->shard)
            json_object_set_new(extra, "shard", json_integer((json_int_t)au->shard[i]));
        event_held(log, au->held[i], "acquired", 0, extra);
    }
}

/*
 * hold and claim: when the command starts, every grant must still be
 * valid with more time left than the stop sequence needs, or the command
 * would start with a stale token (a key taken while `hold --wait` waited
 * for a later one) or be stopped as soon as it starts. 0, or EXIT_LOST
 * once the key is named and every grant still held released.
 */
static int auth_fresh(authority *au, const run_opts *o, const run_log *log)
{
    uint64_t need = o->grace_ms + o->kill_margin_ms;
    const lease_held *h;
    size_t i;

    if (au->session == NULL)
        return 0;
    auth_log_lost(au, log);
    for (i = 0; i < au->n; i++) {
        h = au->held[i];
        if (lease_held_valid(h) && lease_held_remaining_ms(h) > need)
            continue;
        fprintf(stderr, "lease %s: ", log->cmd);
        cli_put_text(stderr, lease_held_grant(h)->key);
        fprintf(stderr, " %s before the command could start (it must have more than "
                "%llu ms left: the grace and the kill margin); releasing the keys, "
                "the command is not run\n",
                lease_held_valid(h) ? "had too little time left" : "was lost",
                (unsigned long long)need);
        auth_end(au, 1, log);
        return EXIT_LOST;
    }
    return 0;
}

int cli_run_supervise(cli_globals *g, cli_args *a, cli_run_opts *o)
{
    authority au;
    run_log log = { 0, NULL, 0, "run", 0 };
    run_stop st = { 0, 0, 0, 0, 0 };
    char ekey[LEASE_KEY_MAX + 1];
    lease_grant grant;
    sigset_t mask, oldmask;
    int rc, sfd;

    if (g == NULL || a == NULL || o == NULL || (o->keys == NULL && o->key == NULL) ||
        (o->keys && o->nkeys == 0))
        return EXIT_FAIL;
    memset(&au, 0, sizeof(au));
    snprintf(ekey, sizeof(ekey), "election/%s", o->key ? o->key : "");
    /* run and elect name their one key in every event; hold and claim
     * name each grant's in its own events, the count in the others. */
    if (o->keys)
        log.cmd = a->cmd;
    else
        log.key = o->elect ? ekey : o->key;
    log.json = g->json;
    if (o->label == NULL) {
        cli_default_label(o->deflabel, sizeof(o->deflabel));
        o->label = o->deflabel;
    }
    /* Close-on-exec, as every descriptor: a child must not write on it. */
    if (lost_pipe[0] < 0 && pipe2(lost_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        perror("lease run: pipe");
        return EXIT_FAIL;
    }
    if ((rc = run_acquire(&au, &grant, g, a, o, &oldmask))) {
        auth_free(&au);
        return rc;
    }
    log.token = grant.token;
    log.count = au.n;
    log_acquired(&au, &grant, &log);
    if ((rc = auth_fresh(&au, o, &log))) {
        auth_free(&au);
        return rc;
    }
    run_sigmask(&mask);
    sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    st.child = sfd < 0 ? -1 : run_spawn(a->argv + o->cmd_at, &au, &grant, o, g, &oldmask);
    if (sfd < 0 || st.child < 0) {
        fprintf(stderr, "lease %s: cannot start the command: %s\n", log.cmd, strerror(errno));
        auth_end(&au, 1, &log);
        auth_free(&au);
        if (sfd >= 0)
            close(sfd);
        return EXIT_FAIL;
    }
    event(&log, "started", 0, json_pack("{s:i}", "pid", (int)st.child));
    rc = run_finish(&st, run_wait(&st, sfd, &au, o, &log), &au, &log);
    close(sfd);
    auth_free(&au);
    return rc;
}

static int supervise(cli_globals *g, cli_args *a, int elect)
{
    run_opts o;
    int rc;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = DEFAULT_TTL_MS;
    o.cmd_at = -1;
    o.elect = elect;
    if ((rc = run_parse(g, a, &o)) || (rc = run_check(a, &o)))
        return rc < 0 ? EXIT_OK : rc;
    return cli_run_supervise(g, a, &o);
}

int cmd_run(cli_globals *g, cli_args *a)
{
    return supervise(g, a, 0);
}

int cmd_elect(cli_globals *g, cli_args *a)
{
    return supervise(g, a, 1);
}
