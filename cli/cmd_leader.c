/*
 * cmd_leader.c - `lease leader NAME`: who leads, and (--watch) every change.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "escape.h"

static const char usage_leader[] =
    "usage: lease leader NAME [--watch] [--count N] [--for DUR] [--json]\n"
    "\n"
    "Show the leader of election NAME: its label, owner, epoch and time left.\n"
    "With --watch, print the leader again at every transition (a new epoch, or\n"
    "no leader), until --count N transitions were printed after the first line,\n"
    "--for DUR passed, or the command is interrupted. --json prints one JSON\n"
    "object per line: {name, leader (true while one leads), label, owner,\n"
    "epoch, remaining_ms}.\n"
    "exit: 0; 1 if NAME never had a leader (without --watch); 6 store failed\n";

/* NAME, the label and the owner are bytes from the user or the store:
 * printed under the one escaping rule (escape.h), never raw. */
static void print_leader(const cli_globals *g, const char *name, const lease_info *i)
{
    if (g->json) {
        cli_print_json(json_pack("{s:o, s:b, s:o, s:o, s:I, s:I}",
                                 "name", cli_json_str(name), "leader", i->held,
                                 "label", cli_json_str(i->held ? i->label : NULL),
                                 "owner", cli_json_str(i->held ? i->owner : NULL),
                                 "epoch", (json_int_t)i->token, "remaining_ms",
                                 (json_int_t)i->remaining_ms));
        return;
    }
    cli_put_text(stdout, name);
    if (i->held) {
        fputs(": leader ", stdout);
        cli_put_text(stdout, i->label[0] ? i->label : "-");
        fputs(" (owner ", stdout);
        cli_put_text(stdout, i->owner);
        printf(") epoch %llu, %llums left\n", (unsigned long long)i->token,
               (unsigned long long)i->remaining_ms);
    } else {
        printf(": no leader (last epoch %llu)\n", (unsigned long long)i->token);
    }
    fflush(stdout);
}

int cmd_leader(cli_globals *g, cli_args *a)
{
    const char *name = NULL, *v;
    uint64_t count = 0, for_ms = 0;
    int watch = 0, rc = 0, seen = 0;
    lease_info cur, last;
    lease_store *s;
    int64_t end;

    for (a->i = 0; a->i < a->argc && rc == 0; a->i++) {
        const char *arg = a->argv[a->i];

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(usage_leader, stdout);
            return EXIT_OK;
        }
        if (cli_parse_global(g, a, arg, &rc))
            continue;
        if (strcmp(arg, "--watch") == 0) {
            watch = 1;
        } else if (cli_flag_is(arg, "--count")) {
            if ((v = cli_value(a, arg, &rc)) && lease_parse_token(&count, v) < 0)
                return cli_usage(a->cmd, "--count must be a whole number from 1");
        } else if (cli_flag_is(arg, "--for")) {
            if ((v = cli_value(a, arg, &rc)))
                rc = cli_duration(&for_ms, a->cmd, "--for", v, 0);
        } else if ((rc = cli_positional(a, arg, &name, NULL))) {
            return rc;
        }
    }
    if (rc || (rc = cli_election_name(a, name)))
        return rc;
    if ((count || for_ms) && !watch)
        return cli_usage(a->cmd, "--count and --for go with --watch");
    if ((rc = cli_open_store(&s, g)))
        return rc;
    if (!watch) {
        rc = lease_leader_get(&cur, s, name);
        lease_store_close(s);
        if (rc < 0)
            return cli_fail(rc, "leader");
        print_leader(g, name, &cur);
        return EXIT_OK;
    }
    end = for_ms ? lease_clock_ns() + (int64_t)for_ms * 1000000 : 0;
    memset(&last, 0, sizeof(last));
    /* Bounded by --count, --for, or the user's interrupt. */
    for (;;) {
        struct timespec pause = { 0, 100 * 1000000 };

        rc = lease_leader_get(&cur, s, name);
        if (rc == LEASE_ENOTFOUND) {
            memset(&cur, 0, sizeof(cur));
            rc = 0;
        }
        if (rc < 0) {
            lease_store_close(s);
            return cli_fail(rc, "leader");
        }
        if (!seen || cur.held != last.held || cur.token != last.token ||
            strcmp(cur.owner, last.owner) != 0) {
            print_leader(g, name, &cur);
            last = cur;
            /* The first line is the state found, then N transitions. */
            if (seen++ && count && (uint64_t)seen > count)
                break;
        }
        if (end && lease_clock_ns() >= end)
            break;
        nanosleep(&pause, NULL);
    }
    lease_store_close(s);
    return EXIT_OK;
}
