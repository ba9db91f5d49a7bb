/*
 * util.c - flag parsing, errors, exit codes and JSON output of the CLI.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

int cli_usage(const char *cmd, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "lease%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'lease %s%s--help'.\n", cmd ? cmd : "", cmd ? " " : "");
    return EXIT_USAGE;
}

int cli_exit_code(int rc)
{
    switch (rc) {
    case 0:
        return EXIT_OK;
    case LEASE_EINVALID:
        return EXIT_USAGE;
    case LEASE_EBUSY:
        return EXIT_BUSY;
    case LEASE_ELOST:
        return EXIT_LOST;
    case LEASE_ESTALE:
        return EXIT_STALE;
    case LEASE_ESTORE:
        return EXIT_STORE;
    case LEASE_ETIMEOUT:
        return EXIT_TIMEOUT;
    default:
        return EXIT_FAIL;
    }
}

int cli_fail(int rc, const char *what)
{
    const char *msg = lease_errmsg();

    fprintf(stderr, "lease %s: %s: %s\n", what, lease_error_name(rc),
            *msg ? msg : lease_strerror(rc));
    return cli_exit_code(rc);
}

static int mkdir_p(char *dir)
{
    char *p;

    for (p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
            *p = '/';
            return -1;
        }
        *p = '/';
    }
    return mkdir(dir, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

int cli_open_store(lease_store **out, const cli_globals *g)
{
    char url[4096];
    int rc;

    if (g->store_url) {
        if (strlen(g->store_url) >= sizeof(url))
            return cli_usage(NULL, "--store URL is too long");
        strcpy(url, g->store_url);
    } else if ((rc = lease_default_store_url(url, sizeof(url))) < 0) {
        return cli_fail(rc, "store");
    } else if (strncmp(url, "sqlite:///", 10) == 0 && !getenv("LEASE_STORE")) {
        /* The default file lives in a directory nobody made yet. */
        char dir[4096];
        char *slash;

        strcpy(dir, url + 9);
        slash = strrchr(dir, '/');
        if (slash && slash != dir) {
            *slash = '\0';
            if (mkdir_p(dir) != 0) {
                fprintf(stderr, "lease: cannot create %s: %s\n", dir,
                        strerror(errno));
                return EXIT_STORE;
            }
        }
    }
    if ((rc = lease_store_open_timeout(out, url,
                                       g->timeout_ms ? g->timeout_ms : 5000)) < 0)
        return cli_fail(rc, "store");
    return 0;
}

int cli_flag_is(const char *arg, const char *name)
{
    size_t n = strlen(name);

    return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

const char *cli_value(cli_args *a, const char *arg, int *rc)
{
    const char *eq = strchr(arg, '=');

    if (eq)
        return eq + 1;
    if (a->i + 1 >= a->argc) {
        *rc = cli_usage(a->cmd, "%s needs a value", arg);
        return NULL;
    }
    return a->argv[++a->i];
}

int cli_parse_global(cli_globals *g, cli_args *a, const char *arg, int *rc)
{
    const char *v;

    if (cli_flag_is(arg, "--store")) {
        if ((v = cli_value(a, arg, rc)) == NULL)
            return 1;
        if (*v == '\0') {
            *rc = cli_usage(a->cmd, "--store needs a URL");
            return 1;
        }
        g->store_url = v;
        return 1;
    }
    if (cli_flag_is(arg, "--timeout")) {
        if ((v = cli_value(a, arg, rc)) == NULL)
            return 1;
        if (cli_duration(&g->timeout_ms, a->cmd, "--timeout", v, 0) != 0)
            *rc = EXIT_USAGE;
        return 1;
    }
    if (strcmp(arg, "--json") == 0) {
        g->json = 1;
        return 1;
    }
    return 0;
}

int cli_duration(uint64_t *ms, const char *cmd, const char *flag,
                 const char *text, int allow_zero)
{
    if (lease_parse_duration(ms, text) < 0) {
        cli_usage(cmd, "%s: %s", flag, lease_errmsg());
        return EXIT_USAGE;
    }
    if (!allow_zero && *ms == 0) {
        cli_usage(cmd, "%s must be more than 0", flag);
        return EXIT_USAGE;
    }
    if (strcmp(flag, "--ttl") == 0 && *ms > LEASE_TTL_MAX_DEFAULT_MS) {
        cli_usage(cmd, "--ttl must be at most 24h");
        return EXIT_USAGE;
    }
    return 0;
}

void cli_default_label(char *buf, size_t size)
{
    char host[256];

    if (gethostname(host, sizeof(host)) != 0)
        strcpy(host, "localhost");
    host[sizeof(host) - 1] = '\0';
    snprintf(buf, size, "%s:%ld", host, (long)getpid());
}

void cli_print_json(json_t *obj)
{
    char *text = json_dumps(obj, JSON_COMPACT | JSON_ENSURE_ASCII);

    if (text) {
        puts(text);
        free(text);
    }
    json_decref(obj);
    fflush(stdout);
}

/* Keys and labels are bytes; JSON wants UTF-8. Invalid bytes are shown
 * as U+FFFD rather than dropping the whole field. */
static json_t *jstr(const char *s)
{
    json_t *j = json_string(s);
    char *fixed, *o;

    if (j)
        return j;
    fixed = malloc(strlen(s) * 3 + 1);
    if (fixed == NULL)
        return json_null();
    for (o = fixed; *s; s++) {
        if ((unsigned char)*s < 0x80) {
            *o++ = *s;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
        }
    }
    *o = '\0';
    j = json_string(fixed);
    free(fixed);
    return j ? j : json_null();
}

json_t *cli_grant_json(const lease_grant *g)
{
    return json_pack("{s:o, s:s, s:I, s:I, s:o, s:I}",
                     "key", jstr(g->key),
                     "owner", g->owner,
                     "token", (json_int_t)g->token,
                     "ttl_ms", (json_int_t)g->ttl_ms,
                     "label", jstr(g->label),
                     "valid_ms", (json_int_t)lease_grant_remaining_ms(g));
}

json_t *cli_info_json(const lease_info *i)
{
    const char *state = i->held ? "held" : i->owner[0] ? "expired" : "free";

    return json_pack("{s:o, s:s, s:o, s:o, s:I, s:I, s:I}",
                     "key", jstr(i->key),
                     "state", state,
                     "owner", i->owner[0] ? json_string(i->owner) : json_null(),
                     "label", jstr(i->label),
                     "token", (json_int_t)i->token,
                     "remaining_ms", (json_int_t)i->remaining_ms,
                     "ttl_ms", (json_int_t)i->ttl_ms);
}

void cli_format_wall(char *buf, size_t size, int64_t ms)
{
    time_t secs = (time_t)(ms / 1000);
    struct tm tm;

    if (ms <= 0 || gmtime_r(&secs, &tm) == NULL) {
        snprintf(buf, size, "-");
        return;
    }
    snprintf(buf, size, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (int)(ms % 1000));
}

/* Times as both RFC 3339 text for people and integers for programs;
 * an unknown end time is null. */
json_t *cli_history_json(const lease_history_entry *e)
{
    char acquired[40], ended[40];

    cli_format_wall(acquired, sizeof(acquired), e->acquired_ms);
    cli_format_wall(ended, sizeof(ended), e->ended_ms);
    return json_pack("{s:I, s:s, s:o, s:I, s:s, s:I, s:s, s:o, s:o}",
                     "token", (json_int_t)e->token,
                     "owner", e->owner,
                     "label", jstr(e->label),
                     "ttl_ms", (json_int_t)e->ttl_ms,
                     "acquired", acquired,
                     "acquired_ms", (json_int_t)e->acquired_ms,
                     "ended", lease_ended_name(e->ended),
                     "ended_at", e->ended_ms > 0 ? json_string(ended) : json_null(),
                     "ended_ms", e->ended_ms > 0 ? json_integer(e->ended_ms) : json_null());
}

int cli_positional(cli_args *a, const char *arg, const char **slot, const char *hint)
{
    if (arg[0] == '-' && arg[1] != '\0')
        return cli_usage(a->cmd, "unknown option '%s'", arg);
    if (*slot != NULL)
        return cli_usage(a->cmd, "unexpected argument '%s'%s", arg, hint ? hint : "");
    *slot = arg;
    return 0;
}

int cli_election_name(cli_args *a, const char *name)
{
    if (name == NULL)
        return cli_usage(a->cmd, "missing NAME");
    if (!lease_key_valid(name) || strlen(name) > LEASE_ELECTION_NAME_MAX)
        return cli_usage(a->cmd, "NAME must be 1 to %d bytes", LEASE_ELECTION_NAME_MAX);
    return 0;
}

