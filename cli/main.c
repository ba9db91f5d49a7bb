/*
 * main.c - the `lease` command: acquire, renew, release, show, ls, history,
 * fence and help; `run` and `elect` live in cmd_run.c, `hold` and `claim`
 * in cmd_hold.c (their supervision in cmd_run.c), `leader` in
 * cmd_leader.c, `agent` in cmd_agent.c, `fence-sql` and `fence-install` in
 * cmd_fence_kit.c, `--version` in version.c, and what
 * they share (flags, errors, JSON) in util.c and escape.c.
 *
 * `agent` is the one command that serves HTTP: libmicrohttpd, and gnutls
 * under it, cost more to map and initialise than the rest of the tool
 * together, so with LEASE_CLI_MODULE_SUBDIR cmd_agent.c is a module of its
 * own (lease-agent.so beside the store modules), loaded for `agent` only.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "escape.h"

/* version.c; to go in cli.h beside cli_print_version. */
int cli_print_version_clients(FILE *out, int clients);
int cli_module_path(char *buf, size_t size, const char *file);

static const char usage_main[] =
    "usage: lease [--store URL | --store-file PATH] [--timeout DUR] COMMAND [ARGS]\n"
    "\n"
    "Distributed leases with fencing tokens.\n"
    "\n"
    "commands:\n"
    "  acquire KEY [--ttl DUR] [--owner UUID] [--label TEXT] [--wait DUR] [--json]\n"
    "  renew   KEY --owner UUID --token N [--ttl DUR] [--json]\n"
    "  release KEY --owner UUID --token N [--json]\n"
    "  show    KEY [--json]\n"
    "  ls      [PREFIX] [--json]\n"
    "  history KEY [--limit N] [--json]\n"
    "  run     KEY [--ttl DUR] [--wait DUR] [--label TEXT] [--grace DUR] [--json]\n"
    "          [--pass-store] -- CMD [ARG...]\n"
    "  hold    KEY... [--keys-from FILE] [--ttl DUR] [--wait DUR] [--label TEXT]\n"
    "          [--grace DUR] [--json] [--pass-store] -- CMD [ARG...]\n"
    "  claim   PREFIX --count K --of N [--ttl DUR] [--label TEXT] [--grace DUR]\n"
    "          [--json] [--pass-store] -- CMD [ARG...]\n"
    "  fence   RESOURCE TOKEN [--json]\n"
    "  fence-sql postgres|sqlite   the SQL of a database's fencing kit\n"
    "  fence-install [URL] [--from FILE] [--json]   the Redis fencing library\n"
    "  elect   NAME [--ttl DUR] [--wait DUR] [--label TEXT] [--grace DUR] [--json]\n"
    "          [--pass-store] -- CMD [ARG...]\n"
    "  leader  NAME [--watch] [--count N] [--for DUR] [--json]\n"
    "  agent   NAME --listen HOST:PORT [--label TEXT] [--ttl DUR] [--json]\n"
    "          [--max-connections N] [--max-per-ip N] [--idle-timeout DUR]\n"
    "  help    [COMMAND]   the usage of COMMAND (as 'lease COMMAND --help')\n"
    "\n"
    "global options (before or after the command):\n"
    "  --store URL     sqlite:path.db, sqlite:///abs/path.db, postgres://user:pw@host/db,\n"
    "                  redis://host:6379, etcd://host:2379[,host:2379...],\n"
    "                  etcds://host:2379 (TLS), kubernetes://host:443/namespace,\n"
    "                  kubernetes:///namespace (in a pod); see lease-stores(7)\n"
    "                  (default: $LEASE_STORE, then $XDG_STATE_HOME/lease/lease.db\n"
    "                  or ~/.local/state/lease/lease.db)\n"
    "  --store-file PATH  read the store URL from the first line of PATH, which\n"
    "                  must be readable by you alone (chmod 600)\n"
    "  --timeout DUR   bound on the whole of each store call (default 5s)\n"
    "  --help, -h      this text; --version: versions and the stores built in\n"
    "                  (--version --verbose: and each store module's client library)\n"
    "\n"
    "secrets: a password in --store URL is hidden from ps once parsed, but other\n"
    "  users may see it before; keep it out of argv with $LEASE_STORE (never\n"
    "  given to the command of run/elect/hold/claim unless --pass-store),\n"
    "  --store-file PATH, libpq's ~/.pgpass or $PGPASSFILE for postgres://, or\n"
    "  ?password_file=PATH (0600) in a redis:// or etcd:// URL.\n"
    "\n"
    "durations: 250ms, 30s, 5m, 1h, 1m30s\n"
    "exit codes: 0 ok, 1 other failure, 2 usage, 3 busy, 4 lease lost,\n"
    "            5 stale token (fenced), 6 store failed or unreachable, 7 timed out\n";

static const char usage_acquire[] =
    "usage: lease acquire KEY [--ttl DUR] [--owner UUID] [--label TEXT] [--wait DUR] [--json]\n"
    "\n"
    "Acquire KEY and print the grant. Keep the owner and token: renew and\n"
    "release need them, and every write to the protected resource carries the token.\n"
    "  --ttl DUR      lease duration (default 30s)\n"
    "  --owner UUID   owner identity (default: a new random one); acquiring again\n"
    "                 with the owner that holds the lease returns the same token\n"
    "  --label TEXT   holder label shown to people (default host:pid)\n"
    "  --wait DUR     wait up to DUR for the key to become free (default: try once)\n"
    "  --json         print {key, owner, token, ttl_ms, label, valid_ms,\n"
    "                 remaining_ms}; valid_ms and remaining_ms are one value, the\n"
    "                 time left before the local deadline\n"
    "exit: 0 acquired, 3 held by another, 7 still held after --wait, 6 store failed\n";

static const char usage_renew[] =
    "usage: lease renew KEY --owner UUID --token N [--ttl DUR] [--json]\n"
    "\n"
    "Extend the lease to the store's clock + ttl. An expired lease is never\n"
    "revived: acquire again, for a new token.\n"
    "  --owner UUID   the owner that acquired the lease (required)\n"
    "  --token N      the token it was granted (required)\n"
    "  --ttl DUR      new lease duration (default: the lease's current ttl)\n"
    "  --json         print the grant as acquire --json does, label the one the\n"
    "                 lease keeps (null if it could not be read)\n"
    "exit: 0 renewed, 4 lost (not the holder any more, or expired), 6 store failed\n";

static const char usage_release[] =
    "usage: lease release KEY --owner UUID --token N [--json]\n"
    "\n"
    "End the lease now; the token counter is kept, so the next holder still\n"
    "gets a greater token.\n"
    "  --owner UUID   the owner that acquired the lease (required)\n"
    "  --token N      the token it was granted (required)\n"
    "  --json         print {key, released, token}\n"
    "exit: 0 released, 4 not the holder (nothing changed), 6 store failed\n";

static const char usage_show[] =
    "usage: lease show KEY [--json]\n"
    "\n"
    "Show the state of KEY: held, expired or free, with owner, label, token\n"
    "and time left. --json prints {key, state, owner, label, token,\n"
    "remaining_ms, ttl_ms}; owner and label are null with no holder to show.\n"
    "exit: 0, or 1 if KEY was never acquired.\n";

static const char usage_ls[] =
    "usage: lease ls [PREFIX] [--json]\n"
    "\n"
    "List keys that start with PREFIX (all keys without one). --json prints\n"
    "one JSON array.\n";

static const char usage_history[] =
    "usage: lease history KEY [--limit N] [--json]\n"
    "\n"
    "The recent grants of KEY, newest first, for post-mortems: token, owner,\n"
    "label, ttl, when granted, and how each ended: held (still current),\n"
    "released, expired (the ttl ran out with no word from the holder) or lost\n"
    "(the holder was refused a renew: it was still running when its lease\n"
    "ended). Stores keep at least the newest 100 grants of a key. Times are\n"
    "UTC; --json prints one array. --limit N shows at most N, 1 to 200\n"
    "(default: all that are kept, up to 200).\n"
    "exit: 0 (also when nothing was recorded), 1 the store keeps no history,\n"
    "6 store failed\n";

static const char usage_fence[] =
    "usage: lease fence RESOURCE TOKEN [--json]\n"
    "\n"
    "The fencing check a protected resource runs before every write: accept\n"
    "TOKEN if it is at least RESOURCE's high-water mark and raise the mark.\n"
    "Run it once right after acquiring to install the new generation.\n"
    "  --json   print {accepted, token, mark}, also when the token is stale\n"
    "exit: 0 accepted, 5 stale (an older generation), 6 store failed\n";

static const char usage_help[] =
    "usage: lease help [COMMAND]\n"
    "\n"
    "Print the usage of lease (the same as lease --help), or of COMMAND (the\n"
    "same as lease COMMAND --help), on stdout.\n"
    "exit: 0, or 2 if COMMAND is not a command of lease\n";

typedef struct {
    const char *key;
    const char *owner;
    const char *label;
    const char *token;
    const char *limit;
    uint64_t ttl_ms, wait_ms;
    int has_ttl;
} cmd_opts;

/*
 * Parse the words after the command. `allowed` lists the command's own
 * flags; positionals go to pos[0..maxpos).
 */
static int parse(cli_globals *g, cli_args *a, cmd_opts *o, const char *allowed,
                 const char **pos, int maxpos, int *npos, const char *usage)
{
    int rc = 0;

    for (a->i = 0; a->i < a->argc && rc == 0; a->i++) {
        const char *arg = a->argv[a->i], *v;

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(usage, stdout);
            return -1;
        }
        if (cli_parse_global(g, a, arg, &rc))
            continue;
        if (arg[0] == '-' && arg[1] != '\0') {
            char name[32];
            size_t n = strcspn(arg, "=");

            if (n >= sizeof(name) || arg[1] != '-')
                return cli_usage(a->cmd, "unknown option '%s'", arg);
            memcpy(name, arg, n);
            name[n] = '\0';
            /* Each command names the flags it takes, as " --ttl --owner ". */
            {
                char needle[40];
                snprintf(needle, sizeof(needle), " %s ", name);
                if (strstr(allowed, needle) == NULL)
                    return cli_usage(a->cmd, "unknown option '%s'", arg);
            }
            if ((v = cli_value(a, arg, &rc)) == NULL)
                return rc;
            if (strcmp(name, "--ttl") == 0) {
                rc = cli_duration(&o->ttl_ms, a->cmd, "--ttl", v, 0);
                o->has_ttl = 1;
            } else if (strcmp(name, "--wait") == 0) {
                rc = cli_duration(&o->wait_ms, a->cmd, "--wait", v, 1);
            } else if (strcmp(name, "--owner") == 0) {
                o->owner = v;
            } else if (strcmp(name, "--label") == 0) {
                o->label = v;
            } else if (strcmp(name, "--token") == 0) {
                o->token = v;
            } else if (strcmp(name, "--limit") == 0) {
                o->limit = v;
            }
            continue;
        }
        if (*npos >= maxpos)
            return cli_usage(a->cmd, "unexpected argument '%s'", arg);
        pos[(*npos)++] = arg;
    }
    return rc;
}

/* One line for acquire, renew, release; the key is the user's bytes. */
static void print_grant(const char *verb, const lease_grant *g, int detail)
{
    printf("%s ", verb);
    cli_put_text(stdout, g->key);
    printf(" token %llu", (unsigned long long)g->token);
    if (detail > 0)
        printf(" owner %s", g->owner);
    if (detail >= 0)
        printf(" ttl %llums", (unsigned long long)g->ttl_ms);
    putchar('\n');
}

static int need_key(cli_args *a, int npos, const char *what)
{
    if (npos < 1)
        return cli_usage(a->cmd, "missing %s", what);
    return 0;
}

/* Checked before the store is opened, so bad input touches nothing. */
static int check_key(cli_args *a, const char *key, const char *what)
{
    if (!lease_key_valid(key))
        return cli_usage(a->cmd, "%s must be 1 to %d bytes", what, LEASE_KEY_MAX);
    return 0;
}

static int cmd_acquire(cli_globals *g, cli_args *a)
{
    cmd_opts o = { 0 };
    const char *pos[1];
    char owner[LEASE_OWNER_BUFSZ], label[LEASE_LABEL_MAX + 1];
    lease_acquire_opts ao = LEASE_ACQUIRE_OPTS_INIT;
    lease_grant grant;
    lease_info holder;
    lease_store *s;
    int npos = 0, rc;

    rc = parse(g, a, &o, " --ttl --owner --label --wait ", pos, 1, &npos,
               usage_acquire);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    if ((rc = need_key(a, npos, "KEY")) || (rc = check_key(a, pos[0], "KEY")))
        return rc;
    if (o.owner) {
        if (!lease_owner_valid(o.owner))
            return cli_usage(a->cmd, "--owner must be a UUID, e.g. %s",
                             "1b4e28ba-2fa1-11d2-883f-0016d3cca427");
        snprintf(owner, sizeof(owner), "%s", o.owner);
    } else if ((rc = lease_owner_new(owner)) < 0) {
        return cli_fail(rc, "acquire");
    }
    if ((rc = cli_check_label(a, o.label)))
        return rc;
    if (o.label == NULL) {
        cli_default_label(label, sizeof(label));
        o.label = label;
    }
    ao.owner = owner;
    ao.ttl_ms = o.has_ttl ? o.ttl_ms : DEFAULT_TTL_MS;
    ao.label = o.label;
    ao.wait_ms = o.wait_ms;
    if ((rc = cli_open_store(&s, g)))
        return rc;
    rc = lease_acquire(&grant, &holder, s, pos[0], &ao);
    lease_store_close(s);
    if (rc < 0)
        return cli_fail(rc, "acquire");
    if (g->json)
        cli_print_json(cli_grant_json(&grant));
    else
        print_grant("acquired", &grant, 1);
    return EXIT_OK;
}

/* renew and release: KEY --owner UUID --token N, checked into a grant. */
static int holder_args(lease_grant *grant, cli_args *a, const cmd_opts *o,
                       const char *const *pos, int npos)
{
    uint64_t token;
    int rc;

    if ((rc = need_key(a, npos, "KEY")))
        return rc;
    if (o->owner == NULL)
        return cli_usage(a->cmd, "--owner UUID is required");
    if (o->token == NULL)
        return cli_usage(a->cmd, "--token N is required");
    if (!lease_owner_valid(o->owner))
        return cli_usage(a->cmd, "--owner must be a UUID");
    if (lease_parse_token(&token, o->token) < 0)
        return cli_usage(a->cmd, "--token: %s", lease_errmsg());
    if (lease_grant_init(grant, pos[0], o->owner, token, o->ttl_ms) < 0)
        return cli_usage(a->cmd, "%s", lease_errmsg());
    return 0;
}

static int cmd_renew(cli_globals *g, cli_args *a)
{
    cmd_opts o = { 0 };
    const char *pos[1];
    lease_grant grant;
    lease_info info;
    lease_store *s;
    json_t *j;
    int npos = 0, rc, known;

    rc = parse(g, a, &o, " --ttl --owner --token ", pos, 1, &npos, usage_renew);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    if ((rc = holder_args(&grant, a, &o, pos, npos)))
        return rc;
    if ((rc = cli_open_store(&s, g)))
        return rc;
    /* A renewal answers yes or no: the label the lease keeps is read from
     * the store, and without --ttl the ttl the holder chose when it
     * acquired (the grant's token names one grant of the key). */
    known = lease_inspect(&info, s, pos[0]) == 0 && info.held &&
            info.token == grant.token;
    if (known)
        memcpy(grant.label, info.label, sizeof(grant.label));
    if (!o.has_ttl)
        o.ttl_ms = known && info.ttl_ms > 0 ? info.ttl_ms : DEFAULT_TTL_MS;
    rc = lease_renew(&grant, s, o.ttl_ms);
    /* The read failed and the renewal did not (a store that missed one
     * answer): read once more. */
    if (rc == 0 && !known && g->json) {
        known = lease_inspect(&info, s, pos[0]) == 0 && info.held &&
                info.token == grant.token;
        if (known)
            memcpy(grant.label, info.label, sizeof(grant.label));
    }
    lease_store_close(s);
    if (rc < 0)
        return cli_fail(rc, "renew");
    if (g->json) {
        j = cli_grant_json(&grant);
        /* Unknown is null, never "" (a lease with no label). */
        if (!known)
            json_object_set_new(j, "label", json_null());
        cli_print_json(j);
    } else
        print_grant("renewed", &grant, 0);
    return EXIT_OK;
}

static int cmd_release(cli_globals *g, cli_args *a)
{
    cmd_opts o = { 0 };
    const char *pos[1];
    lease_grant grant;
    lease_store *s;
    int npos = 0, rc;

    rc = parse(g, a, &o, " --owner --token ", pos, 1, &npos, usage_release);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    if ((rc = holder_args(&grant, a, &o, pos, npos)))
        return rc;
    if ((rc = cli_open_store(&s, g)))
        return rc;
    rc = lease_release(s, &grant);
    lease_store_close(s);
    if (rc < 0)
        return cli_fail(rc, "release");
    if (g->json)
        cli_print_json(json_pack("{s:o, s:b, s:I}", "key", cli_json_str(grant.key),
                                 "released", 1, "token", (json_int_t)grant.token));
    else
        print_grant("released", &grant, -1);
    return EXIT_OK;
}

/*
 * The columns of show, ls and history: at least their classic widths (a
 * 32-column key, a 6-digit token), wider when a row needs it - the
 * 16-digit clock tokens of PostgreSQL, Redis and Kubernetes, a long key, a
 * 24 h ttl - so that every row of a listing, and history's header, line up.
 */
typedef struct {
    int key, token, left;
} info_cols;

/* Columns on a terminal: UTF-8 characters, not bytes (the escaped text is
 * valid UTF-8). */
static int text_cols(const char *s)
{
    int n = 0;

    for (; *s; s++)
        n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

static int num_cols(unsigned long long v)
{
    int n = 1;

    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

static int max_int(int a, int b)
{
    return a > b ? a : b;
}

static void info_cols_of(info_cols *c, const lease_info *items, size_t n)
{
    size_t i;

    c->key = 32;
    c->token = 6;
    c->left = 6;
    for (i = 0; i < n; i++) {
        char *key = cli_text(items[i].key);

        if (key)
            c->key = max_int(c->key, text_cols(key));
        free(key);
        c->token = max_int(c->token, num_cols(items[i].token));
        if (items[i].held)
            c->left = max_int(c->left, num_cols(items[i].remaining_ms));
    }
}

/* s, then spaces up to `width` columns. */
static void put_padded(const char *s, int width)
{
    fputs(s, stdout);
    for (width -= text_cols(s); width > 0; width--)
        putchar(' ');
}

/* Keys, labels and owners come from anybody who can write to the store:
 * escaped (escape.h), so that none can move the cursor or forge a line. */
static void print_info(const lease_info *i, const info_cols *c)
{
    const char *state = cli_state_name(i);
    char *key = cli_text(i->key);

    put_padded(key ? key : "?", c->key);
    free(key);
    /* A free key ends its row at its token: no padding at the end. */
    if (!i->held && i->owner[0] == '\0') {
        printf(" %-8s token %llu\n", state, (unsigned long long)i->token);
        return;
    }
    printf(" %-8s token %-*llu", state, c->token, (unsigned long long)i->token);
    /* An expired lease still names its last holder (as --json does), with
     * "-" where a held one has its time left. */
    if (i->held)
        printf(" %*llums left  ", c->left, (unsigned long long)i->remaining_ms);
    else
        printf(" %*s  ", c->left + 7, "-");
    cli_put_text(stdout, i->label[0] ? i->label : "-");
    fputs(" (", stdout);
    cli_put_text(stdout, i->owner);
    fputs(")\n", stdout);
}

static int cmd_show(cli_globals *g, cli_args *a)
{
    cmd_opts o = { 0 };
    const char *pos[1];
    lease_info info;
    lease_store *s;
    int npos = 0, rc;

    rc = parse(g, a, &o, " ", pos, 1, &npos, usage_show);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    if ((rc = need_key(a, npos, "KEY")) || (rc = check_key(a, pos[0], "KEY")))
        return rc;
    if ((rc = cli_open_store(&s, g)))
        return rc;
    rc = lease_inspect(&info, s, pos[0]);
    lease_store_close(s);
    if (rc < 0)
        return cli_fail(rc, "show");
    if (g->json) {
        cli_print_json(cli_info_json(&info));
    } else {
        info_cols c;

        info_cols_of(&c, &info, 1);
        print_info(&info, &c);
    }
    return EXIT_OK;
}

static int cmd_ls(cli_globals *g, cli_args *a)
{
    cmd_opts o = { 0 };
    const char *pos[1] = { "" };
    lease_info *items;
    lease_store *s;
    size_t n, i;
    int npos = 0, rc;

    rc = parse(g, a, &o, " ", pos, 1, &npos, usage_ls);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    if (strlen(pos[0]) > LEASE_KEY_MAX)
        return cli_usage(a->cmd, "PREFIX must be at most %d bytes", LEASE_KEY_MAX);
    if ((rc = cli_open_store(&s, g)))
        return rc;
    rc = lease_list(&items, &n, s, pos[0]);
    lease_store_close(s);
    if (rc < 0)
        return cli_fail(rc, "ls");
    if (g->json) {
        json_t *arr = json_array();
        for (i = 0; i < n; i++)
            json_array_append_new(arr, cli_info_json(&items[i]));
        cli_print_json(arr);
    } else {
        info_cols c;

        info_cols_of(&c, items, n);
        for (i = 0; i < n; i++)
            print_info(&items[i], &c);
    }
    lease_list_free(items);
    return EXIT_OK;
}

static void print_history(const lease_history_entry *h, size_t n)
{
    int wtok = 8, wttl = 9; /* wider for a row that needs it (info_cols) */
    size_t i;

    for (i = 0; i < n; i++) {
        wtok = max_int(wtok, num_cols(h[i].token));
        wttl = max_int(wttl, num_cols(h[i].ttl_ms) + 2); /* "ms" */
    }
    printf("%-*s %-24s %-9s %-24s %-*s %s\n", wtok, "TOKEN", "ACQUIRED", "ENDED",
           "ENDED AT", wttl, "TTL", "LABEL (OWNER)");
    for (i = 0; i < n; i++) {
        char acquired[40], ended[40], ttl[24];

        cli_format_wall(acquired, sizeof(acquired), h[i].acquired_ms);
        cli_format_wall(ended, sizeof(ended), h[i].ended_ms);
        snprintf(ttl, sizeof(ttl), "%llums", (unsigned long long)h[i].ttl_ms);
        printf("%-*llu %-24s %-9s %-24s %-*s ", wtok, (unsigned long long)h[i].token,
               acquired, lease_ended_name(h[i].ended), ended, wttl, ttl);
        cli_put_text(stdout, h[i].label[0] ? h[i].label : "-");
        fputs(" (", stdout);
        cli_put_text(stdout, h[i].owner);
        fputs(")\n", stdout);
    }
}

static int cmd_history(cli_globals *g, cli_args *a)
{
    cmd_opts o = { 0 };
    const char *pos[1];
    lease_history_entry *h;
    lease_store *s;
    uint64_t limit = 0;
    size_t n, i;
    int npos = 0, rc;

    rc = parse(g, a, &o, " --limit ", pos, 1, &npos, usage_history);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    if ((rc = need_key(a, npos, "KEY")) || (rc = check_key(a, pos[0], "KEY")))
        return rc;
    if (o.limit && (lease_parse_token(&limit, o.limit) < 0 || limit > LEASE_HISTORY_READ_MAX))
        return cli_usage(a->cmd, "--limit must be a whole number from 1 to %d",
                         LEASE_HISTORY_READ_MAX);
    if ((rc = cli_open_store(&s, g)))
        return rc;
    rc = lease_history(&h, &n, s, pos[0], (size_t)limit);
    lease_store_close(s);
    if (rc < 0)
        return cli_fail(rc, "history");
    if (g->json) {
        json_t *arr = json_array();
        for (i = 0; i < n; i++)
            json_array_append_new(arr, cli_history_json(&h[i]));
        cli_print_json(arr);
    } else if (n == 0) {
        fputs("no grants recorded for ", stdout);
        cli_put_text(stdout, pos[0]);
        putchar('\n');
    } else {
        print_history(h, n);
    }
    lease_history_free(h);
    return EXIT_OK;
}

static int cmd_fence(cli_globals *g, cli_args *a)
{
    cmd_opts o = { 0 };
    const char *pos[2];
    uint64_t token, mark = 0;
    lease_store *s;
    int npos = 0, rc;

    rc = parse(g, a, &o, " ", pos, 2, &npos, usage_fence);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    if (npos < 2)
        return cli_usage(a->cmd, "expected RESOURCE TOKEN");
    if ((rc = check_key(a, pos[0], "RESOURCE")))
        return rc;
    if (lease_parse_token(&token, pos[1]) < 0)
        return cli_usage(a->cmd, "TOKEN: %s", lease_errmsg());
    if ((rc = cli_open_store(&s, g)))
        return rc;
    cli_log_except("fenced");
    rc = lease_fence_advance(&mark, s, pos[0], token);
    lease_store_close(s);
    if (rc < 0 && rc != LEASE_ESTALE)
        return cli_fail(rc, "fence");
    if (g->json)
        cli_print_json(json_pack("{s:b, s:I, s:I}", "accepted", rc == 0,
                                 "token", (json_int_t)token,
                                 "mark", (json_int_t)mark));
    else if (rc == 0)
        printf("accepted token %llu (mark %llu)\n", (unsigned long long)token,
               (unsigned long long)mark);
    if (rc == LEASE_ESTALE) {
        fputs("lease fence: ESTALE: ", stderr);
        cli_put_text(stderr, lease_errmsg());
        fputc('\n', stderr);
        return EXIT_STALE;
    }
    return EXIT_OK;
}

typedef struct {
    const char *name;
    int (*fn)(cli_globals *, cli_args *);
} command;

static int cmd_help(cli_globals *g, cli_args *a);

#ifdef LEASE_CLI_AGENT_MODULE
/* `agent`: cmd_agent() of the agent module, which resolves the tool's
 * helpers (cli_fail, cli_open_store...) against this executable. */
static int cmd_agent_module(cli_globals *g, cli_args *a)
{
    int (*fn)(cli_globals *, cli_args *);
    const char *version;
    char path[4096];
    void *h, *sym;

    if (cli_module_path(path, sizeof(path), LEASE_CLI_AGENT_MODULE) < 0) {
        fprintf(stderr, "lease agent: cannot find the directory of liblease\n");
        return EXIT_FAIL;
    }
    if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) == NULL ||
        (sym = dlsym(h, "cmd_agent")) == NULL) {
        const char *why = dlerror();

        fputs("lease agent: cannot load the agent module: ", stderr);
        cli_put_text(stderr, why ? why : path);
        fputc('\n', stderr);
        return EXIT_FAIL;
    }
    /* Another version's module would read this tool's structs wrongly. */
    if ((version = dlsym(h, "cli_agent_version")) == NULL ||
        strcmp(version, LEASE_VERSION_STRING) != 0) {
        fputs("lease agent: the agent module ", stderr);
        cli_put_text(stderr, path);
        fprintf(stderr, " is not of lease %s\n", LEASE_VERSION_STRING);
        dlclose(h);
        return EXIT_FAIL;
    }
    /* POSIX: a function's address may go through void *. */
    memcpy(&fn, &sym, sizeof(fn));
    return fn(g, a);
}
#define CMD_AGENT cmd_agent_module
#else
#define CMD_AGENT cmd_agent
#endif

static const command commands[] = {
    { "acquire", cmd_acquire }, { "renew", cmd_renew },
    { "release", cmd_release }, { "show", cmd_show },
    { "ls", cmd_ls },           { "history", cmd_history },
    { "run", cmd_run },         { "hold", cmd_hold },
    { "claim", cmd_claim },
    { "fence", cmd_fence },     { "fence-sql", cmd_fence_sql },
    { "fence-install", cmd_fence_install },
    { "elect", cmd_elect },
    { "leader", cmd_leader },   { "agent", CMD_AGENT },
    { "help", cmd_help },
};

static const command *command_find(const char *name)
{
    size_t c;

    for (c = 0; c < sizeof(commands) / sizeof(commands[0]); c++)
        if (strcmp(name, commands[c].name) == 0)
            return &commands[c];
    return NULL;
}

/* `lease help COMMAND` runs `lease COMMAND --help`, so that the two can
 * never print different texts. */
static int cmd_help(cli_globals *g, cli_args *a)
{
    char help_flag[] = "--help";
    char *help_argv[] = { help_flag, NULL };
    const char *name = NULL;
    const command *c;
    cli_args sub;
    int rc;

    for (a->i = 0; a->i < a->argc; a->i++) {
        const char *arg = a->argv[a->i];

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(usage_help, stdout);
            return EXIT_OK;
        }
        /* Accepted after every command, this one too. */
        if (cli_parse_global(g, a, arg, &rc)) {
            if (rc)
                return rc;
            continue;
        }
        if ((rc = cli_positional(a, arg, &name, NULL)))
            return rc;
    }
    if (name == NULL) {
        fputs(usage_main, stdout);
        return EXIT_OK;
    }
    if ((c = command_find(name)) == NULL)
        return cli_usage(NULL, "unknown command '%s'", name);
    sub.argc = 1;
    sub.argv = help_argv;
    sub.i = 0;
    sub.cmd = c->name;
    return c->fn(g, &sub);
}

int main(int argc, char **argv)
{
    cli_globals g = { NULL, 0, 0, 0, 0 };
    cli_args a = { argc - 1, argv + 1, 0, NULL };
    const command *c;
    int rc = 0;

    if ((rc = cli_take_env_store(&g)) != 0)
        return rc;
    /* Global options before the command. */
    for (a.i = 0; a.i < a.argc; a.i++) {
        const char *arg = a.argv[a.i];

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(usage_main, stdout);
            return EXIT_OK;
        }
        /* --verbose after it loads the store modules, to print their
         * client libraries (version.c). */
        if (strcmp(arg, "--version") == 0) {
            if (a.i + 1 < a.argc && strcmp(a.argv[a.i + 1], "--verbose") == 0)
                return cli_print_version_clients(stdout, 1);
            return cli_print_version(stdout);
        }
        if (cli_parse_global(&g, &a, arg, &rc)) {
            if (rc)
                return rc;
            continue;
        }
        if (arg[0] == '-')
            return cli_usage(NULL, "unknown option '%s'", arg);
        break;
    }
    if (a.i >= a.argc) {
        fputs(usage_main, stderr);
        return EXIT_USAGE;
    }
    if ((c = command_find(a.argv[a.i])) != NULL) {
        cli_args sub = { a.argc - a.i - 1, a.argv + a.i + 1, 0, c->name };
        return c->fn(&g, &sub);
    }
    return cli_usage(NULL, "unknown command '%s'", a.argv[a.i]);
}
