/*
 * cmd_agent.c - `lease agent NAME --listen HOST:PORT`: a sidecar that
 * campaigns for leadership on behalf of a local service written in any
 * language, and tells it over HTTP:
 *   GET /leader    {"name","leader","epoch","label","owner","remaining_ms","this_agent_leads"}
 *   GET /healthz   {"ok":true,"store":"sqlite"}
 *   GET /metrics   the library's metrics, Prometheus text format
 * The service asks /leader before each side effect and carries the epoch
 * into its writes; the agent steps down at the first failed renewal.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <microhttpd.h>

#include "cli.h"
#include "escape.h"

static const char usage_agent[] =
    "usage: lease agent NAME --listen HOST:PORT [--label TEXT] [--ttl DUR] [--json]\n"
    "                  [--max-connections N] [--max-per-ip N] [--idle-timeout DUR]\n"
    "\n"
    "Campaign for leadership of NAME for a local service, and serve on HOST:PORT\n"
    "(use a loopback address): GET /leader (JSON: name, leader, epoch, label,\n"
    "owner, remaining_ms, this_agent_leads), GET /healthz, GET /metrics\n"
    "(Prometheus). It campaigns again after losing leadership, and resigns on\n"
    "SIGINT or SIGTERM.\n"
    "  --listen HOST:PORT   the IPv4 address and port to serve on (required)\n"
    "  --label TEXT         holder label (default host:pid)\n"
    "  --ttl DUR            lease duration of the leadership (default 10s)\n"
    "  --json               print events (listening, leading) as JSON lines on\n"
    "                       stdout\n"
    "\n"
    "Limits on slow or idle clients (it polls with epoll: their number is not\n"
    "bounded by select()'s 1024 descriptors):\n"
    "  --max-connections N  connections served at once (default 4096; capped by\n"
    "                       the open-files limit, whose soft value is raised)\n"
    "  --max-per-ip N       connections from one client address (default: a\n"
    "                       quarter of --max-connections, 1024; 0: no limit);\n"
    "                       more are closed at once\n"
    "  --idle-timeout DUR   close a connection idle this long (default 10s,\n"
    "                       whole seconds, 1s to 1h)\n"
    "On loopback every local client shares 127.0.0.1: a health checker that must\n"
    "get through while another local process holds many connections can connect\n"
    "from another loopback address (e.g. curl --interface 127.0.0.2).\n"
    "Labels and names that are not valid UTF-8 are shown with U+FFFD in JSON.\n"
    "exit: 0 after SIGINT/SIGTERM, 2 usage, 6 store failed at start\n";

/*
 * Connection limits. The agent answers a local service, its health checker
 * and a metrics scraper: a handful of connections. The global limit bounds
 * descriptors and memory; the per-address limit is a quarter of it, so one
 * address (one misbehaving client, or on loopback every local process at
 * once) can hold at most that many, and clients from other addresses still
 * find free slots; the idle timeout gives back the slots of clients that
 * send nothing (or a partial request) for that long.
 */
#define AGENT_MAX_CONN_DEFAULT 4096u
#define AGENT_PER_IP_SHARE 4u /* per-address default: max_conn / this */
#define AGENT_PER_IP_UNSET UINT_MAX
#define AGENT_MAX_CONN_CAP 1000000u
#define AGENT_IDLE_DEFAULT_S 10u
/* Descriptors kept free for the store's connections, the SQLite files,
 * the epoll and signalling descriptors of the HTTP thread, stdio. */
#define AGENT_FD_RESERVE 64u

typedef struct agent_opts {
    const char *name, *listen_at, *label;
    uint64_t ttl_ms;
    unsigned max_conn, max_per_ip, idle_s;
    int per_ip_share;      /* max_per_ip is the default share of max_conn */
} agent_opts;

static volatile sig_atomic_t stopping;

static void agent_on_signal(int sig)
{
    (void)sig;
    stopping = 1;
}

/* What the HTTP thread serves, refreshed by the main loop. */
static struct {
    pthread_mutex_t mu;
    char name[LEASE_KEY_MAX + 1];
    char store[16];
    lease_info leader;
    int known;
    int ours;
} view = { .mu = PTHREAD_MUTEX_INITIALIZER }; /* the rest zero, whatever lease_info holds */

/* Takes body (malloc'ed; NULL when it could not be made: the connection
 * is closed, which is all that can be done without memory). */
static enum MHD_Result agent_reply(struct MHD_Connection *c, unsigned code,
                                   const char *type, char *body)
{
    struct MHD_Response *r;
    enum MHD_Result ret;

    if (body == NULL)
        return MHD_NO;
    r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

/* The /leader object. The name and label are the users' bytes and the
 * owner is the store's: json_pack's "s" refuses invalid UTF-8 and would
 * turn the whole answer into a 404, so they go through cli_json_str.
 * Called with view.mu held. */
static json_t *agent_leader_json(void)
{
    const lease_info *l = &view.leader;

    return json_pack("{s:o, s:b, s:I, s:o, s:o, s:I, s:b}",
                     "name", cli_json_str(view.name), "leader", l->held,
                     "epoch", (json_int_t)l->token,
                     "label", cli_json_str(l->held ? l->label : NULL),
                     "owner", cli_json_str(l->held ? l->owner : NULL),
                     "remaining_ms", (json_int_t)l->remaining_ms,
                     "this_agent_leads", view.ours);
}

static enum MHD_Result agent_handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version,
                              const char *upload, size_t *upload_size, void **ptr)
{
    char *body = NULL;
    json_t *o;

    (void)cls;
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)ptr;
    if (strcmp(method, "GET") != 0)
        return agent_reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", strdup("GET only\n"));
    if (strcmp(url, "/metrics") == 0) {
        if (lease_metrics_text(&body) < 0)
            return agent_reply(c, 500, "text/plain", strdup("metrics failed\n"));
        return agent_reply(c, 200, "text/plain; version=0.0.4", body);
    }
    if (strcmp(url, "/leader") != 0 && strcmp(url, "/healthz") != 0)
        return agent_reply(c, MHD_HTTP_NOT_FOUND, "text/plain", strdup("not found\n"));
    pthread_mutex_lock(&view.mu);
    if (strcmp(url, "/leader") == 0)
        o = agent_leader_json();
    else
        o = json_pack("{s:b, s:s, s:b}", "ok", 1, "store", view.store,
                      "store_reachable", view.known);
    pthread_mutex_unlock(&view.mu);
    body = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(o);
    if (body == NULL)
        return agent_reply(c, 500, "text/plain", strdup("out of memory\n"));
    return agent_reply(c, 200, "application/json", body);
}

/* MHD's own messages (a client over a limit, a broken request). A flood of
 * connections makes one per connection: at most AGENT_LOG_BURST a second
 * reach stderr, and the number left out is said with the next message of
 * a later second. MHD may quote what a client sent: escaped as text. */
#define AGENT_LOG_BURST 5
static void agent_http_log(void *cls, const char *fmt, va_list ap)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static time_t window;
    static unsigned shown, dropped;
    time_t now = time(NULL);
    char msg[512];
    size_t len;

    (void)cls;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    len = strlen(msg);
    if (len > 0 && msg[len - 1] == '\n')
        msg[len - 1] = '\0';
    pthread_mutex_lock(&mu);
    if (now != window) {
        if (dropped)
            fprintf(stderr, "lease agent: http: %u more messages left out\n", dropped);
        window = now;
        shown = dropped = 0;
    }
    if (shown < AGENT_LOG_BURST) {
        shown++;
        fputs("lease agent: http: ", stderr);
        cli_put_text(stderr, msg);
        fputc('\n', stderr);
    } else {
        dropped++;
    }
    pthread_mutex_unlock(&mu);
}

static int agent_parse_listen(struct sockaddr_in *sa, const char *text)
{
    const char *colon = strrchr(text, ':');
    char host[64];
    char *end;
    long port;

    if (colon == NULL || (size_t)(colon - text) >= sizeof(host))
        return -1;
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    if (strcmp(host, "localhost") == 0)
        strcpy(host, "127.0.0.1");
    port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || port < 1 || port > 65535)
        return -1;
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

/* A whole number for --max-connections / --max-per-ip, 0 allowed only
 * where it means "no limit". */
static int agent_count(unsigned *out, cli_args *a, const char *flag, const char *v,
                       unsigned min)
{
    uint64_t n;

    if (v == NULL)
        return EXIT_USAGE;
    if (strcmp(v, "0") == 0)
        n = 0;
    else if (lease_parse_token(&n, v) < 0)
        n = UINT64_MAX;
    if (n < min || n > AGENT_MAX_CONN_CAP)
        return cli_usage(a->cmd, "%s must be a whole number from %u to %u", flag, min,
                         AGENT_MAX_CONN_CAP);
    *out = (unsigned)n;
    return 0;
}

static int agent_idle(agent_opts *o, cli_args *a, const char *v)
{
    uint64_t ms;
    int rc;

    if (v == NULL)
        return EXIT_USAGE;
    if ((rc = cli_duration(&ms, a->cmd, "--idle-timeout", v, 0)))
        return rc;
    if (ms < 1000 || ms > 3600 * 1000)
        return cli_usage(a->cmd, "--idle-timeout must be from 1s to 1h");
    /* MHD counts whole seconds: round up, never shorten what was asked. */
    o->idle_s = (unsigned)((ms + 999) / 1000);
    return 0;
}

/* One flag of the agent's own (not a global one); 1 if it was one. */
static int agent_flag(agent_opts *o, cli_args *a, const char *arg, int *rc)
{
    const char *v;

    if (cli_flag_is(arg, "--listen")) {
        o->listen_at = cli_value(a, arg, rc);
    } else if (cli_flag_is(arg, "--label")) {
        o->label = cli_value(a, arg, rc);
    } else if (cli_flag_is(arg, "--ttl")) {
        if ((v = cli_value(a, arg, rc)))
            *rc = cli_duration(&o->ttl_ms, a->cmd, "--ttl", v, 0);
    } else if (cli_flag_is(arg, "--max-connections")) {
        if ((v = cli_value(a, arg, rc)))
            *rc = agent_count(&o->max_conn, a, "--max-connections", v, 1);
    } else if (cli_flag_is(arg, "--max-per-ip")) {
        if ((v = cli_value(a, arg, rc)))
            *rc = agent_count(&o->max_per_ip, a, "--max-per-ip", v, 0);
    } else if (cli_flag_is(arg, "--idle-timeout")) {
        if ((v = cli_value(a, arg, rc)))
            *rc = agent_idle(o, a, v);
    } else {
        return 0;
    }
    return 1;
}

/* Parses the command line into o; EXIT_OK with *help set for --help. */
static int agent_parse(agent_opts *o, cli_globals *g, cli_args *a, int *help)
{
    int rc = 0;

    for (a->i = 0; a->i < a->argc && rc == 0; a->i++) {
        const char *arg = a->argv[a->i];

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            *help = 1;
            return EXIT_OK;
        }
        if (cli_parse_global(g, a, arg, &rc) || agent_flag(o, a, arg, &rc))
            continue;
        if ((rc = cli_positional(a, arg, &o->name, NULL)))
            return rc;
    }
    if (rc || (rc = cli_election_name(a, o->name)) || (rc = cli_check_label(a, o->label)))
        return rc;
    if (o->listen_at == NULL)
        return cli_usage(a->cmd, "--listen HOST:PORT is required");
    if ((o->per_ip_share = o->max_per_ip == AGENT_PER_IP_UNSET))
        o->max_per_ip = (o->max_conn + AGENT_PER_IP_SHARE - 1) / AGENT_PER_IP_SHARE;
    if (o->max_per_ip > o->max_conn)
        return cli_usage(a->cmd, "--max-per-ip must be at most --max-connections");
    return 0;
}

/*
 * Descriptors for max_conn connections: the soft RLIMIT_NOFILE is often
 * 1024 while the hard one is much higher. Raise the soft limit as far as
 * needed (never above the hard one), then cap max_conn by what is there,
 * so that accept() never fails with EMFILE under the library's own feet.
 */
static void agent_fit_nofile(agent_opts *o)
{
    rlim_t need = (rlim_t)o->max_conn + AGENT_FD_RESERVE;
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need
                                                                        : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        unsigned fit = rl.rlim_cur > 2 * AGENT_FD_RESERVE
                           ? (unsigned)(rl.rlim_cur - AGENT_FD_RESERVE) : AGENT_FD_RESERVE;

        fprintf(stderr, "lease agent: open-files limit %llu: serving at most %u "
                "connections, not %u\n", (unsigned long long)rl.rlim_cur, fit, o->max_conn);
        o->max_conn = fit;
        /* The default share follows the capped total: one address must
         * never be able to take every slot, /healthz's included. */
        if (o->per_ip_share)
            o->max_per_ip = (fit + AGENT_PER_IP_SHARE - 1) / AGENT_PER_IP_SHARE;
        else if (o->max_per_ip > fit)
            o->max_per_ip = fit;
    }
}

/* The HTTP thread. MHD_USE_AUTO picks epoll on Linux (poll elsewhere):
 * select() cannot watch a descriptor >= FD_SETSIZE (1024), and MHD closes
 * every connection past it, /healthz included. MHD opens its listening,
 * accepted, epoll and signalling descriptors close-on-exec. */
static struct MHD_Daemon *agent_http_start(const agent_opts *o, struct sockaddr_in *sa)
{
    return MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0, NULL,
                            NULL, agent_handle, NULL,
                            /* First, so that MHD's own start-up notes use it. */
                            MHD_OPTION_EXTERNAL_LOGGER, agent_http_log, NULL,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)sa,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned int)o->max_conn,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)o->max_per_ip,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)o->idle_s,
                            MHD_OPTION_END);
}

/* One pass of the campaign: campaign when not leading (stepped down or
 * never won), then refresh what /leader serves. Waits at most ~200 ms. */
static void agent_step(cli_globals *g, lease_store *s, const agent_opts *o,
                       lease_election **e)
{
    lease_campaign_opts co = LEASE_CAMPAIGN_OPTS_INIT;
    lease_info cur;
    int have, rc;

    if (*e && !lease_election_is_leader(*e)) {
        lease_resign(*e); /* stepped down: campaign again */
        *e = NULL;
    }
    if (*e == NULL) {
        co.ttl_ms = o->ttl_ms;
        co.label = o->label;
        co.wait_ms = 200;
        rc = lease_campaign(e, s, o->name, &co);
        if (rc == 0 && g->json)
            cli_print_json(json_pack("{s:s, s:o, s:I}", "event", "leading", "name",
                                     cli_json_str(o->name), "epoch",
                                     (json_int_t)lease_election_epoch(*e)));
        if (rc < 0 && rc != LEASE_EBUSY && rc != LEASE_ETIMEOUT) {
            struct timespec pause = { 0, 200 * 1000000 };
            nanosleep(&pause, NULL);
        }
    } else {
        struct timespec pause = { 0, 100 * 1000000 };
        nanosleep(&pause, NULL);
    }
    have = lease_leader_get(&cur, s, o->name) == 0;
    pthread_mutex_lock(&view.mu);
    if (have)
        view.leader = cur;
    view.known = have;
    view.ours = *e != NULL && lease_election_is_leader(*e) && have &&
                cur.token == lease_election_epoch(*e);
    pthread_mutex_unlock(&view.mu);
}

#ifdef LEASE_CLI_AGENT_MODULE_BUILD
/* Which tool this module was built with: cli_globals and cli_args are
 * passed as they are, so the tool loads only a module of its own version. */
const char cli_agent_version[] = LEASE_VERSION_STRING;
#endif

int cmd_agent(cli_globals *g, cli_args *a)
{
    agent_opts o = { NULL, NULL, NULL, 10000, AGENT_MAX_CONN_DEFAULT,
                     AGENT_PER_IP_UNSET, AGENT_IDLE_DEFAULT_S, 0 };
    char deflabel[LEASE_LABEL_MAX + 1];
    struct sockaddr_in sa;
    struct MHD_Daemon *d;
    lease_election *e = NULL;
    lease_store *s;
    struct sigaction act;
    int rc, help = 0;

    if ((rc = agent_parse(&o, g, a, &help)) || help) {
        if (help)
            fputs(usage_agent, stdout);
        return rc;
    }
    if (agent_parse_listen(&sa, o.listen_at) < 0)
        return cli_usage(a->cmd, "--listen must be IPV4:PORT, e.g. 127.0.0.1:8080");
    if (o.label == NULL) {
        cli_default_label(deflabel, sizeof(deflabel));
        o.label = deflabel;
    }
    if ((rc = cli_open_store(&s, g)))
        return rc;
    snprintf(view.name, sizeof(view.name), "%s", o.name);
    snprintf(view.store, sizeof(view.store), "%s", lease_store_scheme(s));

    /* Block SIGPIPE; SIGINT/SIGTERM only set a flag the loop reads. */
    signal(SIGPIPE, SIG_IGN);
    memset(&act, 0, sizeof(act));
    act.sa_handler = agent_on_signal;
    sigaction(SIGINT, &act, NULL);
    sigaction(SIGTERM, &act, NULL);

    agent_fit_nofile(&o);
    if ((d = agent_http_start(&o, &sa)) == NULL) {
        fprintf(stderr, "lease agent: cannot listen on %s: %s\n", o.listen_at,
                strerror(errno));
        lease_store_close(s);
        return EXIT_FAIL;
    }
    if (g->json)
        cli_print_json(json_pack("{s:s, s:o, s:s}", "event", "listening", "name",
                                 cli_json_str(o.name), "listen", o.listen_at));
    /* Runs until SIGINT or SIGTERM; every pass waits at most 200 ms. */
    while (!stopping)
        agent_step(g, s, &o, &e);
    MHD_stop_daemon(d);
    lease_resign(e);
    lease_store_close(s);
    return EXIT_OK;
}
