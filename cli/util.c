/*
 * util.c - flag parsing, errors, exit codes and JSON output of the CLI.
 */
#define _GNU_SOURCE /* strcasestr, open_memstream */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "escape.h"

int cli_usage(const char *cmd, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "lease%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    /* The message may quote what the user typed: a key or label with
     * control bytes must not reach the terminal raw. */
    cli_put_text(stderr, msg);
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

    /* Library messages name keys and labels, which are anybody's bytes. */
    fprintf(stderr, "lease %s: %s: ", what, lease_error_name(rc));
    cli_put_text(stderr, *msg ? msg : lease_strerror(rc));
    fputc('\n', stderr);
    return cli_exit_code(rc);
}

/* The event whose library log line cli_log_except drops (NULL: none). */
static const char *log_dropped;

/* The library's default, a line on stderr, for every event but the one the
 * command prints as its own error: the same event once, not twice. */
static void log_sink(lease_log_level level, const char *line, void *payload)
{
    json_t *o = log_dropped ? json_loads(line, 0, NULL) : NULL;
    const char *event = json_string_value(json_object_get(o, "event"));
    int drop = event && strcmp(event, log_dropped) == 0;

    (void)level;
    (void)payload;
    json_decref(o);
    if (!drop)
        fprintf(stderr, "%s\n", line);
}

void cli_log_except(const char *event)
{
    log_dropped = event;
    lease_log_set(log_sink, NULL, LEASE_LOG_WARN);
}

/* The default URL's path is percent-encoded (lease_default_store_url
 * encodes a space, '%', '?', '#' and every non-ASCII byte): the directory
 * to make is the decoded one, the one the store then opens. */
static void url_path_decode(char *out, const char *in)
{
    for (; *in; in++) {
        if (in[0] == '%' && isxdigit((unsigned char)in[1]) &&
            isxdigit((unsigned char)in[2])) {
            char hex[3] = { in[1], in[2], '\0' };

            *out++ = (char)strtol(hex, NULL, 16);
            in += 2;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
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

        url_path_decode(dir, url + 9);
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

/* Is the URL query parameter name [name, end) one that holds a secret?
 * Wider than the library's rule on purpose: hiding too much in `ps` costs
 * nothing. */
static int store_arg_param_secret(const char *name, const char *end)
{
    static const char *const words[] = { "pass", "secret", "token" };
    char buf[64];
    size_t n = (size_t)(end - name), w;

    if (n >= sizeof(buf))
        n = sizeof(buf) - 1;
    memcpy(buf, name, n);
    buf[n] = '\0';
    for (w = 0; w < sizeof(words) / sizeof(words[0]); w++)
        if (strcasestr(buf, words[w]))
            return 1;
    return 0;
}

/* Appends [from, to) to *o, or, for a secret, at most three '*': never
 * more bytes than it replaces, so that the result fits where it was. */
static char *store_arg_put(char *o, const char *from, const char *to, int secret)
{
    size_t n = (size_t)(to - from);

    if (secret) {
        memset(o, '*', n < 3 ? n : 3);
        return o + (n < 3 ? n : 3);
    }
    memcpy(o, from, n);
    return o + n;
}

/*
 * Overwrites in place the secrets of a store URL that came on the command
 * line, so that /proc/PID/cmdline (ps) of a long `lease run`, `elect` or
 * `agent` shows "***": the password of the user-info (which, as libpq
 * reads it, ends at the LAST '@') and the value of every query parameter
 * whose name says it is a secret. Bytes left over become NULs.
 */
void cli_hide_url_secrets(char *arg)
{
    size_t len = strlen(arg);
    char *out = malloc(len + 1), *o;
    const char *auth = strstr(arg, "://"), *at = strrchr(arg, '@'), *p, *q;

    if (out == NULL) {
        memset(arg, '*', len); /* no memory: hide it all */
        return;
    }
    auth = auth ? auth + 3 : arg;
    if (at && at < auth)
        at = NULL;
    o = out;
    p = arg;
    if (at && (q = memchr(auth, ':', (size_t)(at - auth))) != NULL) {
        o = store_arg_put(o, p, q + 1, 0);
        o = store_arg_put(o, q + 1, at, 1);
        p = at;
    }
    if ((q = strchr(at ? at : auth, '?')) != NULL) {
        o = store_arg_put(o, p, q + 1, 0);
        for (p = q + 1; *p;) {
            const char *amp = p + strcspn(p, "&"), *eq = memchr(p, '=', (size_t)(amp - p));

            if (eq) {
                o = store_arg_put(o, p, eq + 1, 0);
                o = store_arg_put(o, eq + 1, amp, store_arg_param_secret(p, eq));
            } else {
                o = store_arg_put(o, p, amp, 0);
            }
            p = *amp ? amp + 1 : amp;
            if (*amp)
                *o++ = '&';
        }
    }
    o = store_arg_put(o, p, arg + len, 0);
    memset(arg, '\0', len);
    memcpy(arg, out, (size_t)(o - out));
    free(out);
}

/* The store URL this process uses, kept apart from argv (which is
 * redacted) and reachable until exit. */
static char *cli_store_url_copy;

static int store_url_set(cli_globals *g, cli_args *a, const char *url, int from_file)
{
    char *copy;

    /* $LEASE_STORE is the default: --store or --store-file replace it. */
    if (g->store_url && !g->store_from_env && g->store_from_file != from_file)
        return cli_usage(a->cmd, "give --store or --store-file, not both");
    if ((copy = strdup(url)) == NULL)
        return cli_usage(a->cmd, "out of memory");
    free(cli_store_url_copy);
    cli_store_url_copy = copy;
    g->store_url = copy;
    g->store_from_file = from_file;
    g->store_from_env = 0;
    return 0;
}

int cli_take_env_store(cli_globals *g)
{
    char *env = getenv("LEASE_STORE");

    if (env == NULL || *env == '\0')
        return 0;
    free(cli_store_url_copy);
    if ((cli_store_url_copy = strdup(env)) == NULL) {
        fputs("lease: out of memory\n", stderr);
        return EXIT_FAIL;
    }
    g->store_url = cli_store_url_copy;
    g->store_from_env = 1;
    /* getenv's bytes are the environment block itself: writable. */
    cli_hide_url_secrets(env);
    return 0;
}

/* The first line of a file only its owner can read, as ssh and libpq want
 * of their key and password files. Never prints what it read. */
static int store_file_read(cli_globals *g, cli_args *a, const char *path)
{
    char buf[4097];
    struct stat st;
    ssize_t n;
    int fd, rc;

    /* O_NONBLOCK: a FIFO must not wait for a writer (it is refused below). */
    if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) < 0)
        return cli_usage(a->cmd, "--store-file %s: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return cli_usage(a->cmd, "--store-file %s: not a regular file", path);
    }
    if ((st.st_mode & 077) != 0 || (st.st_uid != geteuid() && st.st_uid != 0)) {
        close(fd);
        return cli_usage(a->cmd, "--store-file %s: must be yours and readable by "
                         "you alone (chmod 600 %s)", path, path);
    }
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n < 0)
        return cli_usage(a->cmd, "--store-file %s: %s", path, strerror(errno));
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    if (buf[0] == '\0' || (size_t)n == sizeof(buf) - 1)
        return cli_usage(a->cmd, "--store-file %s: the first line must be a store "
                         "URL of at most %zu bytes", path, sizeof(buf) - 2);
    rc = store_url_set(g, a, buf, 1);
    memset(buf, 0, sizeof(buf));
    return rc;
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
        if ((*rc = store_url_set(g, a, v, 0)) == 0)
            cli_hide_url_secrets((char *)v); /* argv's own bytes: writable */
        return 1;
    }
    if (cli_flag_is(arg, "--store-file")) {
        if ((v = cli_value(a, arg, rc)) != NULL)
            *rc = store_file_read(g, a, v);
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
    /* The library refuses these above 24 h too, but only once a store is
     * open: say so before any connection. */
    if ((strcmp(flag, "--ttl") == 0 || strcmp(flag, "--wait") == 0 ||
         strcmp(flag, "--grace") == 0 || strcmp(flag, "--timeout") == 0) &&
        *ms > LEASE_TTL_MAX_DEFAULT_MS) {
        cli_usage(cmd, "%s must be at most 24h", flag);
        return EXIT_USAGE;
    }
    return 0;
}

int cli_check_label(cli_args *a, const char *label)
{
    if (label && strnlen(label, LEASE_LABEL_MAX + 1) > LEASE_LABEL_MAX)
        return cli_usage(a->cmd, "--label must be at most %d bytes", LEASE_LABEL_MAX);
    return 0;
}

char *cli_text(const char *s)
{
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);

    if (f == NULL)
        return NULL;
    cli_put_text(f, s ? s : "");
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
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

/* valid_ms and remaining_ms are one value: the time left before the
 * grant's local deadline. remaining_ms is the name show, leader and the
 * agent give the time left; valid_ms stays, as it always was. */
json_t *cli_grant_json(const lease_grant *g)
{
    json_int_t left = (json_int_t)lease_grant_remaining_ms(g);

    return json_pack("{s:o, s:s, s:I, s:I, s:o, s:I, s:I}",
                     "key", cli_json_str(g->key),
                     "owner", g->owner,
                     "token", (json_int_t)g->token,
                     "ttl_ms", (json_int_t)g->ttl_ms,
                     "label", cli_json_str(g->label),
                     "valid_ms", left,
                     "remaining_ms", left);
}

const char *cli_state_name(const lease_info *i)
{
    switch (i->state) {
    case LEASE_STATE_HELD:
        return "held";
    case LEASE_STATE_EXPIRED:
        return "expired";
    default:
        return "free";
    }
}

/* A key with no holder to show (free, or expired where the store forgot
 * the holder) has a null owner and a null label, as leader and the agent
 * show no leader: "" would read as a holder whose label is empty. */
json_t *cli_info_json(const lease_info *i)
{
    const char *state = cli_state_name(i);
    int no_label = !i->held && i->label[0] == '\0';

    return json_pack("{s:o, s:s, s:o, s:o, s:I, s:I, s:I}",
                     "key", cli_json_str(i->key),
                     "state", state,
                     "owner", i->owner[0] ? json_string(i->owner) : json_null(),
                     "label", no_label ? json_null() : cli_json_str(i->label),
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
                     "label", cli_json_str(e->label),
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

