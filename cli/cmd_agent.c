/*
 * cmd_agent.c - `lease agent NAME --listen HOST:PORT`: a sidecar that
 * campaigns for leadership on behalf of a local service written in any
 * language, and tells it over HTTP:
 *   GET /leader    {"name","leader","epoch","label","owner","remaining_ms",
 *                   "this_agent_leads","known"}; 503 when not known
 *   GET /healthz   {"ok","store","store_reachable"}; 503 when unreachable
 *   GET /metrics   the library's metrics, Prometheus text format
 * The service asks /leader before each side effect and carries the epoch
 * into its writes; the agent steps down at the first failed renewal.
 * Every answer is judged when it is asked (see agent_leader_json).
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
    "owner, remaining_ms, this_agent_leads, known), GET /healthz (JSON: ok,\n"
    "store, store_reachable), GET /metrics (Prometheus). It says on stderr where\n"
    "it listens, campaigns again after losing leadership, and resigns on SIGINT\n"
    "or SIGTERM.\n"
    "Every answer is judged when asked. this_agent_leads: this agent leads by\n"
    "its local deadline (false as soon as it steps down). The other fields come\n"
    "from its own grant while it leads, else from its last read of the store,\n"
    "which serves for a quarter of --ttl (at most --timeout) from when it was\n"
    "sent, remaining_ms counting down from then. Otherwise (a failed read, an\n"
    "older one, a holder whose remaining_ms ran out) known is false; leader,\n"
    "epoch, label, owner and remaining_ms are null; the status is 503. While no\n"
    "read serves, /healthz says ok and store_reachable false, status 503.\n"
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
    "exit: 0 after SIGINT/SIGTERM, 1 cannot listen, 2 usage, 6 store failed at\n"
    "start\n";

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
    uint64_t call_ms;      /* the bound of a campaign (--timeout) */
    uint64_t view_ms;      /* the bound of a leader view (agent_bounds) */
    uint64_t pass_ms;      /* the longest wait of one pass of the loop */
} agent_opts;

static volatile sig_atomic_t stopping;

static void agent_on_signal(int sig)
{
    (void)sig;
    stopping = 1;
}

/*
 * What the HTTP thread serves. The main loop publishes the election it
 * holds and each leader view it reads; nothing here is an answer until a
 * request judges it, at that moment, on lease_clock_ns(): a cached verdict
 * would outlive the leadership or the view it was made from.
 */
static struct {
    pthread_mutex_t mu;
    char name[LEASE_KEY_MAX + 1];
    char store[16];
    /* The campaign's election, NULL when none; it is unpublished (under
     * mu) before it is resigned, so a request never reads a freed one. */
    lease_election *election;
    lease_info leader;     /* the last view read from the store */
    int64_t read_ns;       /* when that read was sent; 0: no good read */
    int64_t view_ns;       /* how long a view serves after its read */
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

/* Milliseconds from now until at_ns, 0 once it has passed. */
static json_int_t agent_ms_until(int64_t at_ns, int64_t now)
{
    return at_ns > now ? (json_int_t)((at_ns - now) / 1000000) : 0;
}

/* The last view read serves until its bound after the read was sent.
 * Called with view.mu held. */
static int agent_view_fresh(int64_t now)
{
    return view.read_ns != 0 && now - view.read_ns < view.view_ns;
}

/* A /leader object that names a leader (or says there is none). The name
 * and label are the users' bytes and the owner is the store's: json_pack's
 * "s" refuses invalid UTF-8 and would turn the whole answer into a 404, so
 * they go through cli_json_str. Called with view.mu held. */
static json_t *agent_leader_pack(int held, uint64_t epoch, const char *label,
                                 const char *owner, json_int_t remaining_ms, int ours)
{
    return json_pack("{s:o, s:b, s:I, s:o, s:o, s:I, s:b, s:b}",
                     "name", cli_json_str(view.name), "leader", held,
                     "epoch", (json_int_t)epoch, "label", cli_json_str(label),
                     "owner", cli_json_str(owner), "remaining_ms", remaining_ms,
                     "this_agent_leads", ours, "known", 1);
}

/*
 * The /leader object at `now`; *known says whether it names the leader.
 *  - This agent leads (lease_election_is_leader: its local deadline, at
 *    this moment): its own grant, remaining_ms to that deadline.
 *  - Else the last view, while it is fresh, with remaining_ms counted down
 *    from when its read was sent (the store measured it later: never an
 *    overstatement). A holder whose time ran out in the view may have
 *    renewed or not: not known.
 *  - Else not known: leader, epoch, label, owner and remaining_ms are
 *    null, this_agent_leads false. The last holder seen is never shown as
 *    the holder: it may have been replaced since.
 * Called with view.mu held.
 */
static json_t *agent_leader_json(int64_t now, int *known)
{
    const lease_info *l = &view.leader;
    json_int_t left;

    *known = 1;
    if (view.election && lease_election_is_leader(view.election)) {
        const lease_grant *g = lease_election_grant(view.election);

        return agent_leader_pack(1, g->token, g->label, g->owner,
                                 agent_ms_until(lease_election_deadline_ns(view.election), now),
                                 1);
    }
    left = (json_int_t)l->remaining_ms - (json_int_t)((now - view.read_ns) / 1000000);
    if (agent_view_fresh(now) && !l->held)
        return agent_leader_pack(0, l->token, NULL, NULL, 0, 0);
    if (agent_view_fresh(now) && left > 0)
        return agent_leader_pack(1, l->token, l->label, l->owner, left, 0);
    *known = 0;
    return json_pack("{s:o, s:n, s:n, s:n, s:n, s:n, s:b, s:b}",
                     "name", cli_json_str(view.name), "leader", "epoch", "label", "owner",
                     "remaining_ms", "this_agent_leads", 0, "known", 0);
}

/* /leader and /healthz: 200 when the answer is known, else 503 (a load
 * balancer takes the agent out of service while it cannot tell). */
static enum MHD_Result agent_answer(struct MHD_Connection *c, int leader)
{
    char *body = NULL;
    int64_t now;
    json_t *o;
    int good;

    pthread_mutex_lock(&view.mu);
    now = lease_clock_ns();
    if (leader) {
        o = agent_leader_json(now, &good);
    } else {
        good = agent_view_fresh(now);
        o = json_pack("{s:b, s:s, s:b}", "ok", good, "store", view.store,
                      "store_reachable", good);
    }
    pthread_mutex_unlock(&view.mu);
    body = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(o);
    if (body == NULL)
        return agent_reply(c, 500, "text/plain", strdup("out of memory\n"));
    return agent_reply(c, good ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE,
                       "application/json", body);
}

static enum MHD_Result agent_handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version,
                              const char *upload, size_t *upload_size, void **ptr)
{
    char *body = NULL;

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
    if (strcmp(url, "/leader") == 0 || strcmp(url, "/healthz") == 0)
        return agent_answer(c, strcmp(url, "/leader") == 0);
    return agent_reply(c, MHD_HTTP_NOT_FOUND, "text/plain", strdup("not found\n"));
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

/*
 * The bound of a leader view, and of the read that makes it: a quarter of
 * the ttl, the margin within which a leader steps down (a host too slow to
 * refresh the view within it is too slow to lead), at most the bound of a
 * store call (--timeout). One pass of the loop waits at most a quarter of
 * that, and at most 200 ms, so that a store that answers refreshes the
 * view several times within its bound.
 */
static void agent_bounds(agent_opts *o, const cli_globals *g)
{
    o->call_ms = g->timeout_ms ? g->timeout_ms : 5000; /* the library's default */
    o->view_ms = o->ttl_ms / 4 < o->call_ms ? o->ttl_ms / 4 : o->call_ms;
    if (o->view_ms == 0)
        o->view_ms = 1;
    o->pass_ms = o->view_ms / 4 < 200 ? o->view_ms / 4 : 200;
    if (o->pass_ms == 0)
        o->pass_ms = 1;
}

static void agent_pause(uint64_t ms)
{
    struct timespec pause = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000 };

    nanosleep(&pause, NULL);
}

/* What requests judge leadership by (NULL: none). */
static void agent_publish(lease_election *e)
{
    pthread_mutex_lock(&view.mu);
    view.election = e;
    pthread_mutex_unlock(&view.mu);
}

/*
 * Read the leader into the view, within the view's bound. A failed read
 * leaves no view: the last one may name a holder replaced since. The first
 * failure after a good read, and the first good read after failures, are
 * said on stderr (the library's message names no password).
 */
static void agent_read(lease_store *s, const agent_opts *o)
{
    static int failing;
    lease_info cur;
    int64_t sent;
    int rc;

    lease_store_set_timeout(s, o->view_ms);
    sent = lease_clock_ns();
    rc = lease_leader_get(&cur, s, o->name);
    if (rc == LEASE_ENOTFOUND) { /* nobody ever led: an answer, no leader */
        memset(&cur, 0, sizeof(cur));
        rc = 0;
    }
    pthread_mutex_lock(&view.mu);
    if (rc == 0)
        view.leader = cur;
    view.read_ns = rc == 0 ? sent : 0;
    pthread_mutex_unlock(&view.mu);
    if (rc < 0 && !failing) {
        fputs("lease agent: cannot read the leader from the store: ", stderr);
        cli_put_text(stderr, lease_errmsg());
        fputs("; /leader and /healthz answer 503 until a read succeeds\n", stderr);
    } else if (rc == 0 && failing) {
        fputs("lease agent: the store answers again\n", stderr);
    }
    failing = rc < 0;
}

/* One pass of the campaign: campaign when not leading (stepped down or
 * never won), then read the leader. Waits at most o->pass_ms, plus the
 * bounds of its store calls. */
static void agent_step(cli_globals *g, lease_store *s, const agent_opts *o,
                       lease_election **e)
{
    lease_campaign_opts co = LEASE_CAMPAIGN_OPTS_INIT;
    int rc;

    if (*e && !lease_election_is_leader(*e)) {
        agent_publish(NULL); /* before it is freed */
        lease_resign(*e);    /* stepped down: campaign again */
        *e = NULL;
    }
    if (*e == NULL) {
        co.ttl_ms = o->ttl_ms;
        co.label = o->label;
        co.wait_ms = o->pass_ms;
        lease_store_set_timeout(s, o->call_ms);
        rc = lease_campaign(e, s, o->name, &co);
        if (rc == 0) {
            agent_publish(*e);
            if (g->json)
                cli_print_json(json_pack("{s:s, s:o, s:I}", "event", "leading", "name",
                                         cli_json_str(o->name), "epoch",
                                         (json_int_t)lease_election_epoch(*e)));
        }
        if (rc < 0 && rc != LEASE_EBUSY && rc != LEASE_ETIMEOUT)
            agent_pause(o->pass_ms);
    } else {
        agent_pause(o->pass_ms / 2);
    }
    agent_read(s, o);
}

/* Once, on stderr: where the agent serves, for whom, on which store. */
static void agent_say_listening(const agent_opts *o, const struct sockaddr_in *sa)
{
    char addr[INET_ADDRSTRLEN];

    if (inet_ntop(AF_INET, &sa->sin_addr, addr, sizeof(addr)) == NULL)
        snprintf(addr, sizeof(addr), "?");
    fprintf(stderr, "lease agent: listening on http://%s:%u/ (GET /leader, /healthz, "
            "/metrics) for the leadership of ", addr, (unsigned)ntohs(sa->sin_port));
    cli_put_text(stderr, o->name);
    fprintf(stderr, " on the %s store\n", view.store);
}

#ifdef LEASE_CLI_AGENT_MODULE_BUILD
/* Which tool this module was built with: cli_globals and cli_args are
 * passed as they are, so the tool loads only a module of its own version. */
const char cli_agent_version[] = LEASE_VERSION_STRING;
#endif

int cmd_agent(cli_globals *g, cli_args *a)
{
    agent_opts o = { NULL, NULL, NULL, 10000, AGENT_MAX_CONN_DEFAULT,
                     AGENT_PER_IP_UNSET, AGENT_IDLE_DEFAULT_S, 0, 0, 0, 0 };
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
    agent_bounds(&o, g);
    snprintf(view.name, sizeof(view.name), "%s", o.name);
    snprintf(view.store, sizeof(view.store), "%s", lease_store_scheme(s));
    view.view_ns = (int64_t)o.view_ms * 1000000;

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
    agent_say_listening(&o, &sa);
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
