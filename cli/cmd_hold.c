/*
 * cmd_hold.c - `lease hold KEY... -- CMD` and `lease claim PREFIX --count K
 * --of N -- CMD`: run a command under many leases kept by one session. This
 * file reads their flags and keys; cmd_run.c takes the leases and runs and
 * stops the command, as for `lease run`.
 */
#define _GNU_SOURCE /* getline, strdup, fopen's "e" */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "escape.h"

/* More keys than this in one command is a mistake, not a plan: each is a
 * grant to renew and three variables in the command's environment. */
#define HOLD_KEYS_MAX 100000

/* exec(2) takes about 2 MB of arguments and environment in all, and 128
 * KiB per string. The variables the command gets for its keys must fit
 * with room to spare for the rest of its environment and arguments:
 * checked before anything is acquired. */
#define HOLD_ENV_MAX ((size_t)1 << 20)
#define HOLD_ENV_STRING_MAX ((size_t)128 << 10)

static const char usage_hold[] =
    "usage: lease hold KEY... [--keys-from FILE] [--ttl DUR] [--wait DUR] [--label TEXT]\n"
    "                  [--grace DUR] [--json] [--pass-store] -- CMD [ARG...]\n"
    "\n"
    "Acquire every KEY (each waiting at most --wait; in byte order, so that two\n"
    "holds of the same keys cannot each hold a key the other waits for) into one\n"
    "session, run CMD, renew them all in the background (every ttl/3, in\n"
    "batches), and release them when CMD exits. If any key cannot be acquired,\n"
    "or one is lost before CMD starts, the ones acquired are released and CMD is\n"
    "not run. CMD's authority ends with the earliest local deadline of the keys:\n"
    "if any one is lost, or renewals fail until that deadline comes near, CMD's\n"
    "process group gets SIGTERM, then SIGKILL, as with lease run.\n"
    "CMD gets LEASE_COUNT (the number of keys), LEASE_KEY_0, LEASE_TOKEN_0, ...\n"
    "LEASE_KEY_<n-1>, LEASE_TOKEN_<n-1> (in the order given), LEASE_OWNER and\n"
    "LEASE_TTL_MS; no LEASE_KEY nor LEASE_TOKEN.\n"
    "  --keys-from FILE  more keys, one per line ('-': stdin; a CRLF line end is\n"
    "                taken as one); blank lines and lines whose first non-blank\n"
    "                character is '#' (comments) are skipped; a key given twice\n"
    "                is a usage error\n"
    "  --ttl DUR     lease duration of every key (default 30s)\n"
    "  --wait DUR    wait up to DUR for each key, also through store failures\n"
    "                (default: try once)\n"
    "  --label TEXT  holder label (default host:pid)\n"
    "  --grace DUR   time between SIGTERM and SIGKILL (default ttl/4, at most 10s)\n"
    "  --json        log events as JSON lines on stderr (one acquired event per key)\n"
    "  --pass-store  give CMD the store URL (which may hold a password) as\n"
    "                LEASE_STORE; without it CMD's environment has no LEASE_STORE\n"
    "exit: as lease run: CMD's exit status (128+N if killed by signal N; 127 if\n"
    "CMD was not found, 126 if it could not be run); 4 if CMD had to be stopped\n"
    "because a key was lost, or ran on past one; 3, 6 or 7 if a key could not be\n"
    "acquired (the message names it), 4 if one was lost before CMD started; 2 for\n"
    "no key, a key given twice, keys too many for CMD's environment (1 MiB) or a\n"
    "bad flag.\n";

static const char usage_claim[] =
    "usage: lease claim PREFIX --count K --of N [--ttl DUR] [--label TEXT] [--grace DUR]\n"
    "                   [--json] [--pass-store] -- CMD [ARG...]\n"
    "\n"
    "Work partitioning: claim up to K of the N shards PREFIX/0 .. PREFIX/<N-1>\n"
    "(each tried once, starting at a place that depends on the owner, so that\n"
    "replicas spread), run CMD under those claimed, and release them when CMD\n"
    "exits. Supervision as for lease hold: if any claimed shard is lost, CMD's\n"
    "process group is stopped. CMD gets LEASE_COUNT (shards claimed),\n"
    "LEASE_SHARDS (their numbers, ascending, space-separated: \"3 7 9\"),\n"
    "LEASE_SHARD_<i>, LEASE_KEY_<i> and LEASE_TOKEN_<i> for i = 0 .. LEASE_COUNT-1\n"
    "in shard order, LEASE_OWNER and LEASE_TTL_MS; no LEASE_KEY nor LEASE_TOKEN.\n"
    "  --count K     claim at most K shards (1 to N)\n"
    "  --of N        the number of shards (1 to 100000)\n"
    "  --ttl DUR     lease duration of every shard (default 30s)\n"
    "  --label TEXT  holder label (default host:pid)\n"
    "  --grace DUR   time between SIGTERM and SIGKILL (default ttl/4, at most 10s)\n"
    "  --json        log events as JSON lines on stderr (one acquired event per shard)\n"
    "  --pass-store  give CMD the store URL (which may hold a password) as\n"
    "                LEASE_STORE; without it CMD's environment has no LEASE_STORE\n"
    "exit: as lease hold; 3 if no shard could be claimed (all held by others); 2 if\n"
    "K shards would not fit in CMD's environment (LEASE_SHARDS under 128 KiB).\n";

typedef struct {
    cli_run_opts o;
    const char *keys_from, *count, *of;
    size_t cap; /* room in o.keys */
} hold_opts;

static void hold_free(hold_opts *h)
{
    size_t i;

    for (i = 0; i < h->o.nkeys; i++)
        free(h->o.keys[i]);
    free(h->o.keys);
    h->o.keys = NULL;
    h->o.nkeys = 0;
}

/* Appends a copy of key, checked as the library would check it. `where`
 * says where it came from, for the message. */
static int hold_add(hold_opts *h, cli_args *a, const char *key, const char *where)
{
    if (!lease_key_valid(key))
        return cli_usage(a->cmd, "%s: a key must be 1 to %d bytes", where, LEASE_KEY_MAX);
    if (h->o.nkeys >= HOLD_KEYS_MAX)
        return cli_usage(a->cmd, "more than %d keys", HOLD_KEYS_MAX);
    if (h->o.nkeys == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 16;
        char **keys = realloc(h->o.keys, cap * sizeof(*keys));

        if (keys == NULL)
            return cli_usage(a->cmd, "out of memory");
        h->o.keys = keys;
        h->cap = cap;
    }
    if ((h->o.keys[h->o.nkeys] = strdup(key)) == NULL)
        return cli_usage(a->cmd, "out of memory");
    h->o.nkeys++;
    return 0;
}

/* A line of --keys-from that holds no key: blank (only spaces and tabs,
 * or nothing), or a comment (its first other character is '#'), as in the
 * key lists people keep in files. */
static int no_key(const char *s)
{
    s += strspn(s, " \t\r");
    return *s == '\0' || *s == '#';
}

/* --keys-from FILE: one key per line, '-' for stdin. A key is the whole
 * line without its newline (it may hold spaces); a NUL byte cannot be in a
 * key, so a line with one is refused rather than cut short. A key that
 * starts with '#' is given as an argument. */
static int hold_read_keys(hold_opts *h, cli_args *a)
{
    int use_stdin = strcmp(h->keys_from, "-") == 0;
    FILE *f = use_stdin ? stdin : fopen(h->keys_from, "re");
    char *line = NULL, where[64];
    size_t size = 0, lineno = 0;
    ssize_t len;
    int rc = 0;

    if (f == NULL)
        return cli_usage(a->cmd, "--keys-from %s: %s", h->keys_from, strerror(errno));
    while (rc == 0 && (len = getline(&line, &size, f)) >= 0) {
        lineno++;
        if (len > 0 && line[len - 1] == '\n')
            line[--len] = '\0';
        /* A file written on Windows: CRLF ends the line, the CR is no
         * part of the key. */
        if (len > 0 && line[len - 1] == '\r')
            line[--len] = '\0';
        snprintf(where, sizeof(where), "--keys-from line %zu", lineno);
        if (strlen(line) != (size_t)len)
            rc = cli_usage(a->cmd, "%s holds a NUL byte", where);
        else if (!no_key(line))
            rc = hold_add(h, a, line, where);
    }
    if (rc == 0 && ferror(f))
        rc = cli_usage(a->cmd, "--keys-from %s: read error", h->keys_from);
    free(line);
    if (!use_stdin)
        fclose(f);
    return rc;
}

static int cmp_str_ptr(const void *x, const void *y)
{
    return strcmp(*(const char *const *)x, *(const char *const *)y);
}

/* A key given twice is a mistake (in a script, it hides a wrong list):
 * refused before anything is acquired. */
static int hold_no_duplicates(hold_opts *h, cli_args *a)
{
    char **sorted = malloc(h->o.nkeys * sizeof(*sorted));
    size_t i;
    int rc = 0;

    if (sorted == NULL)
        return cli_usage(a->cmd, "out of memory");
    memcpy(sorted, h->o.keys, h->o.nkeys * sizeof(*sorted));
    qsort(sorted, h->o.nkeys, sizeof(*sorted), cmp_str_ptr);
    for (i = 1; i < h->o.nkeys && rc == 0; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0)
            rc = cli_usage(a->cmd, "key '%s' is given twice", sorted[i]);
    free(sorted);
    return rc;
}

/* The flags of hold (claim = 0) and claim; the words that are not flags
 * are hold's keys, or claim's PREFIX. -1 after --help. */
static int hold_parse(cli_globals *g, cli_args *a, hold_opts *h, int claim)
{
    int rc = 0;

    for (a->i = 0; a->i < a->argc && rc == 0; a->i++) {
        const char *arg = a->argv[a->i], *v;

        if (strcmp(arg, "--") == 0) {
            h->o.cmd_at = a->i + 1;
            break;
        }
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(claim ? usage_claim : usage_hold, stdout);
            return -1;
        }
        if (cli_parse_global(g, a, arg, &rc))
            continue;
        if (cli_flag_is(arg, "--ttl")) {
            if ((v = cli_value(a, arg, &rc)))
                rc = cli_duration(&h->o.ttl_ms, a->cmd, "--ttl", v, 0);
        } else if (!claim && cli_flag_is(arg, "--wait")) {
            if ((v = cli_value(a, arg, &rc)))
                rc = cli_duration(&h->o.wait_ms, a->cmd, "--wait", v, 1);
        } else if (cli_flag_is(arg, "--grace")) {
            if ((v = cli_value(a, arg, &rc)))
                rc = cli_duration(&h->o.grace_ms, a->cmd, "--grace", v, 1);
            h->o.has_grace = 1;
        } else if (cli_flag_is(arg, "--label")) {
            h->o.label = cli_value(a, arg, &rc);
        } else if (strcmp(arg, "--pass-store") == 0) {
            h->o.pass_store = 1;
        } else if (!claim && cli_flag_is(arg, "--keys-from")) {
            h->keys_from = cli_value(a, arg, &rc);
        } else if (claim && cli_flag_is(arg, "--count")) {
            h->count = cli_value(a, arg, &rc);
        } else if (claim && cli_flag_is(arg, "--of")) {
            h->of = cli_value(a, arg, &rc);
        } else if (claim) {
            rc = cli_positional(a, arg, &h->o.key, " (put the command after --)");
        } else if (arg[0] == '-' && arg[1] != '\0') {
            rc = cli_usage(a->cmd, "unknown option '%s'", arg);
        } else {
            rc = hold_add(h, a, arg, "KEY");
        }
    }
    return rc;
}

/* A whole number from 1 to max, for --count and --of. */
static int hold_number(size_t *out, cli_args *a, const char *flag, const char *text,
                       size_t max)
{
    uint64_t v;

    if (text == NULL)
        return cli_usage(a->cmd, "%s is required", flag);
    if (lease_parse_token(&v, text) < 0 || v == 0 || v > max)
        return cli_usage(a->cmd, "%s must be a whole number from 1 to %zu", flag, max);
    *out = (size_t)v;
    return 0;
}

/* claim: --count K --of N checked, and the keys PREFIX/0 .. PREFIX/(N-1). */
static int claim_keys(hold_opts *h, cli_args *a)
{
    char key[LEASE_KEY_MAX + 32];
    size_t n, i;
    int rc;

    if (h->o.key == NULL)
        return cli_usage(a->cmd, "missing PREFIX");
    if ((rc = hold_number(&n, a, "--of", h->of, HOLD_KEYS_MAX)) ||
        (rc = hold_number(&h->o.want, a, "--count", h->count, n)))
        return rc;
    /* The longest key is the last shard's: checked once, for all. */
    snprintf(key, sizeof(key), "%s/%zu", h->o.key, n - 1);
    if (strlen(h->o.key) > LEASE_KEY_MAX || !lease_key_valid(key))
        return cli_usage(a->cmd, "PREFIX is too long: PREFIX/%zu must be at most %d bytes",
                         n - 1, LEASE_KEY_MAX);
    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s/%zu", h->o.key, i);
        if ((rc = hold_add(h, a, key, "PREFIX")))
            return rc;
    }
    return 0;
}

/* Decimal digits of v. */
static size_t digits(size_t v)
{
    size_t d = 1;

    while (v >= 10) {
        v /= 10;
        d++;
    }
    return d;
}

/*
 * The command's environment for the keys, as cmd_run.c builds it, within
 * exec's limits: LEASE_COUNT; per grant LEASE_KEY_<i>=KEY and
 * LEASE_TOKEN_<i>=TOKEN (20 digits at most), and for claim LEASE_SHARD_<i>
 * and LEASE_SHARDS, each string with its NUL and its pointer. Claim
 * counts its K grants as long as the longest key. Exit 2 if it is too big.
 */
static int hold_env_fits(const hold_opts *h, cli_args *a)
{
    size_t n = h->o.want ? h->o.want : h->o.nkeys, d = digits(h->o.nkeys);
    size_t keymax = 0, keys = 0, shards = 0, total, i;

    for (i = 0; i < h->o.nkeys; i++) {
        size_t len = strlen(h->o.keys[i]);
        keys += len;
        keymax = len > keymax ? len : keymax;
    }
    if (h->o.want) {
        keys = n * keymax;
        shards = sizeof("LEASE_SHARDS=") + n * (d + 1);
        if (shards >= HOLD_ENV_STRING_MAX)
            return cli_usage(a->cmd, "LEASE_SHARDS for %zu shards would take %zu bytes: one "
                             "variable of the command's environment must be under %zu KiB; "
                             "claim fewer (--count)", n, shards, HOLD_ENV_STRING_MAX >> 10);
    }
    if (sizeof("LEASE_TOKEN_=") + d + 20 + keymax >= HOLD_ENV_STRING_MAX)
        return cli_usage(a->cmd, "a key is too long for the command's environment");
    total = sizeof("LEASE_COUNT=") + d + sizeof(char *) + shards + keys +
            n * (sizeof("LEASE_KEY_=") + sizeof("LEASE_TOKEN_=") + 2 * d + 20 +
                 2 * sizeof(char *));
    if (h->o.want)
        total += n * (sizeof("LEASE_SHARD_=") + 2 * d + sizeof(char *));
    if (total >= HOLD_ENV_MAX)
        return cli_usage(a->cmd, "%zu keys would take %zu bytes of the command's environment "
                         "(LEASE_KEY_<i>, LEASE_TOKEN_<i>...): that must be under %zu KiB; "
                         "%s fewer", n, total, HOLD_ENV_MAX >> 10,
                         h->o.want ? "claim" : "hold");
    return 0;
}

/* Everything the library would refuse, refused here first: exit 2 before
 * any connection, and nothing acquired. */
static int hold_check(hold_opts *h, cli_args *a, int claim)
{
    int rc;

    if (claim) {
        if ((rc = claim_keys(h, a)))
            return rc;
    } else {
        if (h->keys_from && (rc = hold_read_keys(h, a)))
            return rc;
        if (h->o.nkeys == 0)
            return cli_usage(a->cmd, "no keys: give KEY... or --keys-from FILE");
        if ((rc = hold_no_duplicates(h, a)))
            return rc;
    }
    if ((rc = hold_env_fits(h, a)) || (rc = cli_check_label(a, h->o.label)))
        return rc;
    if (h->o.cmd_at < 0 || h->o.cmd_at >= a->argc)
        return cli_usage(a->cmd, "missing the command: lease %s %s -- CMD [ARG...]",
                         a->cmd, claim ? "PREFIX --count K --of N" : "KEY...");
    return cli_run_timing(a, &h->o);
}

static int hold_or_claim(cli_globals *g, cli_args *a, int claim)
{
    hold_opts h;
    int rc;

    memset(&h, 0, sizeof(h));
    h.o.ttl_ms = DEFAULT_TTL_MS;
    h.o.cmd_at = -1;
    if ((rc = hold_parse(g, a, &h, claim)) || (rc = hold_check(&h, a, claim))) {
        hold_free(&h);
        return rc < 0 ? EXIT_OK : rc;
    }
    rc = cli_run_supervise(g, a, &h.o);
    hold_free(&h);
    return rc;
}

int cmd_hold(cli_globals *g, cli_args *a)
{
    return hold_or_claim(g, a, 0);
}

int cmd_claim(cli_globals *g, cli_args *a)
{
    return hold_or_claim(g, a, 1);
}
