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
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"

static const char usage_run[] =
    "usage: lease run KEY [--ttl DUR] [--wait DUR] [--label TEXT] [--grace DUR] [--json] -- CMD [ARG...]\n"
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
    "exit: CMD's exit status (128+N if killed by signal N); 4 if CMD had to be\n"
    "stopped because the lease was lost; 3, 6 or 7 if KEY could not be acquired.\n";

static const char usage_elect[] =
    "usage: lease elect NAME [--ttl DUR] [--wait DUR] [--label TEXT] [--grace DUR] [--json] -- CMD [ARG...]\n"
    "\n"
    "Campaign for leadership of NAME (waiting at most --wait) and run CMD only while\n"
    "leader. CMD gets LEASE_KEY (election/NAME), LEASE_TOKEN and LEASE_EPOCH (the\n"
    "leader's epoch: carry it into every downstream write), LEASE_OWNER and\n"
    "LEASE_TTL_MS. Step-down policy: as soon as a renewal fails or the deadline\n"
    "comes near, leadership is uncertain and CMD's process group gets SIGTERM, then\n"
    "SIGKILL, so that it is gone before leadership ends. Options and exit codes as\n"
    "for lease run (4: CMD was stopped because leadership ended).\n";

static int lost_pipe[2] = { -1, -1 };

/* Only a write to a pipe: the main loop does the rest. */
static void notify_lost(int reason)
{
    char c = reason == LEASE_ELOST ? 'L' : 'S';

    if (write(lost_pipe[1], &c, 1) < 0) {
        /* Nothing to do: the deadline check stops the child anyway. */
    }
}

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

/* What the child's authority comes from: a kept lease or a leadership. */
typedef struct {
    lease_keeper *keeper;
    lease_election *election;
} authority;

static int64_t auth_deadline(const authority *au)
{
    return au->election ? lease_election_deadline_ns(au->election)
                        : lease_keeper_deadline_ns(au->keeper);
}

static int auth_valid(const authority *au)
{
    return au->election ? lease_election_is_leader(au->election)
                        : lease_keeper_valid(au->keeper);
}

static int auth_end(const authority *au, int release)
{
    if (au->election)
        return lease_resign(au->election);
    return lease_keeper_stop(NULL, au->keeper, release);
}

/* Campaign in slices, so that a SIGINT or SIGTERM (blocked: the renewing
 * thread must not take it) still ends a long wait promptly. */
static int campaign(lease_election **e, lease_store *s, const char *name,
                    lease_campaign_opts *co, uint64_t wait_ms, const sigset_t *mask)
{
    int64_t end = lease_clock_ns() + (int64_t)wait_ms * 1000000;
    int rc;

    for (;;) {
        int64_t left = (end - lease_clock_ns()) / 1000000;
        sigset_t pending;

        co->wait_ms = left <= 0 ? 0 : left > 200 ? 200 : (uint64_t)left;
        rc = lease_campaign(e, s, name, co);
        if ((rc != LEASE_EBUSY && rc != LEASE_ETIMEOUT) || left <= 200)
            return rc;
        sigpending(&pending);
        if (sigismember(&pending, SIGINT) || sigismember(&pending, SIGTERM) ||
            sigismember(&pending, SIGHUP))
            return 1; /* interrupted */
        (void)mask;
    }
}

typedef struct {
    int json;
    const char *key;
    uint64_t token;
} run_log;

/* One event line on stderr: JSON with --json, short text otherwise.
 * Quiet events (acquired, released...) are only printed with --json. */
static void event(const run_log *l, const char *name, int loud, json_t *extra)
{
    if (l->json) {
        json_t *o = json_pack("{s:s, s:s, s:I, s:I}", "event", name,
                              "key", l->key, "token", (json_int_t)l->token,
                              "t_ns", (json_int_t)lease_clock_ns());
        if (extra)
            json_object_update(o, extra);
        {
            char *text = json_dumps(o, JSON_COMPACT);
            if (text) {
                fprintf(stderr, "%s\n", text);
                free(text);
            }
        }
        json_decref(o);
    } else if (loud) {
        fprintf(stderr, "lease run: %s: %s (token %llu)\n", l->key, name,
                (unsigned long long)l->token);
    }
    json_decref(extra);
}

static pid_t start_child(char **argv, const lease_grant *g, sigset_t *oldmask,
                         int elect)
{
    pid_t pid = fork();

    if (pid == 0) {
        char buf[32];

        setpgid(0, 0);
        /* If `lease run` dies, nothing renews: the child must not outlive it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1)
            _exit(127);
        sigprocmask(SIG_SETMASK, oldmask, NULL);
        setenv("LEASE_KEY", g->key, 1);
        setenv("LEASE_OWNER", g->owner, 1);
        snprintf(buf, sizeof(buf), "%llu", (unsigned long long)g->token);
        setenv("LEASE_TOKEN", buf, 1);
        if (elect)
            setenv("LEASE_EPOCH", buf, 1);
        snprintf(buf, sizeof(buf), "%llu", (unsigned long long)g->ttl_ms);
        setenv("LEASE_TTL_MS", buf, 1);
        execvp(argv[0], argv);
        fprintf(stderr, "lease run: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    if (pid > 0)
        setpgid(pid, pid); /* also here: no race with the first kill */
    return pid;
}

static int supervise(cli_globals *g, cli_args *a, int elect)
{
    const char *key = NULL, *label = NULL;
    char owner[LEASE_OWNER_BUFSZ], deflabel[LEASE_LABEL_MAX + 1];
    char ekey[LEASE_KEY_MAX + 1];
    lease_campaign_opts co = LEASE_CAMPAIGN_OPTS_INIT;
    authority au = { NULL, NULL };
    uint64_t ttl_ms = DEFAULT_TTL_MS, wait_ms = 0, grace_ms = 0, kill_margin_ms;
    int has_grace = 0, rc = 0, cmd_at = -1, status = 0, stopped_for_loss = 0;
    lease_acquire_opts ao = LEASE_ACQUIRE_OPTS_INIT;
    lease_keeper_opts ko = LEASE_KEEPER_OPTS_INIT;
    lease_grant grant;
    lease_store *s;
    sigset_t mask, oldmask;
    int sfd;
    pid_t child;
    int64_t term_sent = 0, kill_sent = 0, kill_at_fixed = 0;
    run_log log = { 0, NULL, 0 };

    for (a->i = 0; a->i < a->argc && rc == 0; a->i++) {
        const char *arg = a->argv[a->i], *v;

        if (strcmp(arg, "--") == 0) {
            cmd_at = a->i + 1;
            break;
        }
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(elect ? usage_elect : usage_run, stdout);
            return EXIT_OK;
        }
        if (cli_parse_global(g, a, arg, &rc))
            continue;
        if (cli_flag_is(arg, "--ttl")) {
            if ((v = cli_value(a, arg, &rc)))
                rc = cli_duration(&ttl_ms, a->cmd, "--ttl", v, 0);
        } else if (cli_flag_is(arg, "--wait")) {
            if ((v = cli_value(a, arg, &rc)))
                rc = cli_duration(&wait_ms, a->cmd, "--wait", v, 1);
        } else if (cli_flag_is(arg, "--grace")) {
            if ((v = cli_value(a, arg, &rc)))
                rc = cli_duration(&grace_ms, a->cmd, "--grace", v, 1);
            has_grace = 1;
        } else if (cli_flag_is(arg, "--label")) {
            label = cli_value(a, arg, &rc);
        } else if ((rc = cli_positional(a, arg, &key, " (put the command after --)"))) {
            return rc;
        }
    }
    if (rc || (elect && (rc = cli_election_name(a, key))))
        return rc;
    if (key == NULL)
        return cli_usage(a->cmd, "missing KEY");
    if (!lease_key_valid(key))
        return cli_usage(a->cmd, "KEY must be 1 to %d bytes", LEASE_KEY_MAX);
    if (cmd_at < 0 || cmd_at >= a->argc)
        return cli_usage(a->cmd, "missing the command: lease %s %s -- CMD [ARG...]",
                         a->cmd, elect ? "NAME" : "KEY");
    if (elect) {
        snprintf(ekey, sizeof(ekey), "election/%s", key);
        log.key = ekey;
    } else {
        log.key = key;
    }
    log.json = g->json;

    /* Stop timing, from the ttl: SIGKILL lands kill_margin before the
     * deadline (time to deliver it and reap), SIGTERM `grace` before that. */
    kill_margin_ms = ttl_ms / 20 > 1000 ? 1000 : ttl_ms / 20;
    if (kill_margin_ms == 0)
        kill_margin_ms = 1;
    if (!has_grace)
        grace_ms = ttl_ms / 4 > 10000 ? 10000 : ttl_ms / 4;
    if (grace_ms + kill_margin_ms >= ttl_ms)
        return cli_usage(a->cmd, "--grace must be well below the ttl");

    if ((rc = lease_owner_new(owner)) < 0)
        return cli_fail(rc, "run");
    if (label == NULL) {
        cli_default_label(deflabel, sizeof(deflabel));
        label = deflabel;
    }
    ao.owner = owner;
    ao.ttl_ms = ttl_ms;
    ao.label = label;
    ao.wait_ms = wait_ms;
    if ((rc = cli_open_store(&s, g)))
        return rc;
    if (pipe(lost_pipe) != 0) {
        perror("lease run: pipe");
        lease_store_close(s);
        return EXIT_FAIL;
    }
    /* Block the signals we forward before a renewing thread starts: it
     * inherits the mask, and signalfd only sees signals blocked in every
     * thread (otherwise SIGTERM could kill us from that thread). A lease
     * is acquired before that, so that a long --wait stays interruptible. */
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    sigaddset(&mask, SIGQUIT);
    sigaddset(&mask, SIGUSR1);
    sigaddset(&mask, SIGUSR2);
    if (elect) {
        sigprocmask(SIG_BLOCK, &mask, &oldmask);
        co.ttl_ms = ttl_ms;
        co.label = label;
        co.on_stepdown = on_stepdown;
        rc = campaign(&au.election, s, key, &co, wait_ms, &mask);
        if (rc == 1) {
            fprintf(stderr, "lease elect: interrupted while campaigning for '%s'\n", key);
            lease_store_close(s);
            return 130;
        }
        if (rc == 0)
            grant = *lease_election_grant(au.election);
    } else {
        rc = lease_acquire(&grant, NULL, s, key, &ao);
    }
    if (rc < 0) {
        lease_store_close(s);
        return cli_fail(rc, a->cmd);
    }
    log.token = grant.token;
    event(&log, "acquired", 0,
          json_pack("{s:s, s:I, s:I}", "owner", grant.owner, "ttl_ms",
                    (json_int_t)grant.ttl_ms, "deadline_ns",
                    (json_int_t)grant.deadline_ns));

    if (!elect) {
        sigprocmask(SIG_BLOCK, &mask, &oldmask);
        ko.on_lost = on_lost;
        if ((rc = lease_keeper_start(&au.keeper, s, &grant, &ko)) < 0) {
            rc = cli_fail(rc, "run");
            lease_release(s, &grant);
            lease_store_close(s);
            return rc;
        }
    }
    lease_store_close(s);

    sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    child = start_child(a->argv + cmd_at, &grant, &oldmask, elect);
    if (sfd < 0 || child < 0) {
        perror("lease run: cannot start the command");
        if (child > 0)
            kill(-child, SIGKILL);
        auth_end(&au, 1);
        return EXIT_FAIL;
    }
    event(&log, "started", 0, json_pack("{s:i}", "pid", (int)child));

    /* Bounded: every pass waits at most 50 ms, and the stop sequence ends
     * the child (SIGKILL cannot be ignored) before the local deadline. */
    for (;;) {
        struct pollfd fds[2] = { { sfd, POLLIN, 0 }, { lost_pipe[0], POLLIN, 0 } };
        int64_t now, deadline = auth_deadline(&au);
        int64_t term_at = deadline - (int64_t)(grace_ms + kill_margin_ms) * 1000000;
        int64_t kill_at = deadline - (int64_t)kill_margin_ms * 1000000;
        int64_t next;
        int timeout_ms;

        if (kill_at_fixed)
            kill_at = kill_at_fixed;
        now = lease_clock_ns();
        /* A leader stops at once when leadership becomes uncertain. */
        if (elect && !auth_valid(&au))
            stopped_for_loss = 1;
        if (!term_sent && (now >= term_at || stopped_for_loss)) {
            stopped_for_loss = 1;
            term_sent = now;
            /* Once stopping, the kill time is fixed: a late renewal must
             * not push it beyond the deadline we started from. */
            if (!kill_at_fixed) {
                kill_at_fixed = now + (int64_t)grace_ms * 1000000;
                if (kill_at_fixed > kill_at)
                    kill_at_fixed = kill_at;
                kill_at = kill_at_fixed;
            }
            kill(-child, SIGTERM);
            event(&log, "stopping", 1,
                  json_pack("{s:s, s:I}", "signal", "SIGTERM", "deadline_ns",
                            (json_int_t)deadline));
        }
        if (term_sent && !kill_sent && now >= kill_at) {
            kill_sent = now;
            kill(-child, SIGKILL);
            event(&log, "stopping", 1,
                  json_pack("{s:s, s:I}", "signal", "SIGKILL", "deadline_ns",
                            (json_int_t)deadline));
        }
        next = term_sent ? (kill_sent ? now + 50000000 : kill_at) : term_at;
        timeout_ms = (int)((next - now) / 1000000);
        if (timeout_ms < 0)
            timeout_ms = 0;
        if (timeout_ms > 50)
            timeout_ms = 50;
        if (poll(fds, 2, timeout_ms) < 0 && errno != EINTR)
            break;
        if (fds[1].revents & POLLIN) {
            char c = 0;
            if (read(lost_pipe[0], &c, 1) == 1 && !stopped_for_loss) {
                stopped_for_loss = 1;
                event(&log, "lost", 1,
                      json_pack("{s:s}", "reason",
                                c == 'L' ? "ELOST" : "ESTORE"));
            }
        }
        if (fds[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            if (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si) &&
                si.ssi_signo != SIGCHLD) {
                kill(-child, (int)si.ssi_signo);
                event(&log, "forwarded", 0,
                      json_pack("{s:i}", "signal", (int)si.ssi_signo));
            }
        }
        if (waitpid(child, &status, WNOHANG) == child)
            break;
    }
    {
        int64_t exited = lease_clock_ns();
        int64_t deadline = auth_deadline(&au);
        int code = WIFEXITED(status) ? WEXITSTATUS(status)
                                     : 128 + WTERMSIG(status);
        int valid = auth_valid(&au);

        /* Anything the child left in its group goes with it. */
        kill(-child, SIGKILL);
        event(&log, "exited", stopped_for_loss,
              json_pack("{s:i, s:I, s:I, s:b}", "code", code, "exited_ns",
                        (json_int_t)exited, "deadline_ns", (json_int_t)deadline,
                        "before_deadline", exited < deadline));
        /* Release whenever the lease may still be ours, so the next holder
         * need not wait for the ttl; a lost lease gives ELOST, harmlessly. */
        rc = auth_end(&au, valid);
        if (valid)
            event(&log, rc == 0 ? "released" : "release_failed", rc != 0, NULL);
        close(sfd);
        return stopped_for_loss ? EXIT_LOST : code;
    }
}

int cmd_run(cli_globals *g, cli_args *a)
{
    return supervise(g, a, 0);
}

int cmd_elect(cli_globals *g, cli_args *a)
{
    return supervise(g, a, 1);
}
