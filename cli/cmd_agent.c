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
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <microhttpd.h>

#include "cli.h"

static const char usage_agent[] =
    "usage: lease agent NAME --listen HOST:PORT [--label TEXT] [--ttl DUR] [--json]\n"
    "\n"
    "Campaign for leadership of NAME for a local service, and serve on HOST:PORT\n"
    "(use a loopback address): GET /leader (JSON: name, leader, epoch, label,\n"
    "owner, remaining_ms, this_agent_leads), GET /healthz, GET /metrics\n"
    "(Prometheus). It campaigns again after losing leadership, and resigns on\n"
    "SIGINT or SIGTERM.\n"
    "exit: 0 after SIGINT/SIGTERM, 2 usage, 6 store failed at start\n";

static volatile sig_atomic_t stopping;

static void on_signal(int sig)
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
} view = { PTHREAD_MUTEX_INITIALIZER, "", "", { "", "", "", 0, 0, 0, 0 }, 0, 0 };

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code,
                             const char *type, char *body)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    enum MHD_Result ret;

    MHD_add_response_header(r, "Content-Type", type);
    ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
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
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", strdup("GET only\n"));
    if (strcmp(url, "/metrics") == 0) {
        if (lease_metrics_text(&body) < 0)
            return reply(c, 500, "text/plain", strdup("metrics failed\n"));
        return reply(c, 200, "text/plain; version=0.0.4", body);
    }
    pthread_mutex_lock(&view.mu);
    if (strcmp(url, "/leader") == 0) {
        const lease_info *l = &view.leader;
        o = json_pack("{s:s, s:b, s:I, s:s?, s:s?, s:I, s:b}", "name", view.name,
                      "leader", l->held, "epoch", (json_int_t)l->token, "label",
                      l->held ? l->label : NULL, "owner", l->held ? l->owner : NULL,
                      "remaining_ms", (json_int_t)l->remaining_ms,
                      "this_agent_leads", view.ours);
    } else if (strcmp(url, "/healthz") == 0) {
        o = json_pack("{s:b, s:s, s:b}", "ok", 1, "store", view.store,
                      "store_reachable", view.known);
    } else {
        o = NULL;
    }
    pthread_mutex_unlock(&view.mu);
    if (o == NULL)
        return reply(c, MHD_HTTP_NOT_FOUND, "text/plain", strdup("not found\n"));
    body = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(o);
    return reply(c, 200, "application/json", body ? body : strdup("{}"));
}

static int parse_listen(struct sockaddr_in *sa, const char *text)
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

int cmd_agent(cli_globals *g, cli_args *a)
{
    const char *name = NULL, *listen_at = NULL, *label = NULL, *v;
    char deflabel[LEASE_LABEL_MAX + 1];
    uint64_t ttl_ms = 10000;
    struct sockaddr_in sa;
    struct MHD_Daemon *d;
    lease_election *e = NULL;
    lease_store *s;
    struct sigaction act;
    int rc = 0;

    for (a->i = 0; a->i < a->argc && rc == 0; a->i++) {
        const char *arg = a->argv[a->i];

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(usage_agent, stdout);
            return EXIT_OK;
        }
        if (cli_parse_global(g, a, arg, &rc))
            continue;
        if (cli_flag_is(arg, "--listen")) {
            listen_at = cli_value(a, arg, &rc);
        } else if (cli_flag_is(arg, "--label")) {
            label = cli_value(a, arg, &rc);
        } else if (cli_flag_is(arg, "--ttl")) {
            if ((v = cli_value(a, arg, &rc)))
                rc = cli_duration(&ttl_ms, a->cmd, "--ttl", v, 0);
        } else if ((rc = cli_positional(a, arg, &name, NULL))) {
            return rc;
        }
    }
    if (rc || (rc = cli_election_name(a, name)))
        return rc;
    if (listen_at == NULL)
        return cli_usage(a->cmd, "--listen HOST:PORT is required");
    if (parse_listen(&sa, listen_at) < 0)
        return cli_usage(a->cmd, "--listen must be IPV4:PORT, e.g. 127.0.0.1:8080");
    if (label == NULL) {
        cli_default_label(deflabel, sizeof(deflabel));
        label = deflabel;
    }
    if ((rc = cli_open_store(&s, g)))
        return rc;
    snprintf(view.name, sizeof(view.name), "%s", name);
    snprintf(view.store, sizeof(view.store), "%s", lease_store_scheme(s));

    /* Block SIGPIPE; SIGINT/SIGTERM only set a flag the loop reads. */
    signal(SIGPIPE, SIG_IGN);
    memset(&act, 0, sizeof(act));
    act.sa_handler = on_signal;
    sigaction(SIGINT, &act, NULL);
    sigaction(SIGTERM, &act, NULL);

    d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL,
                         NULL, handle, NULL, MHD_OPTION_SOCK_ADDR,
                         (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned int)10, MHD_OPTION_END);
    if (d == NULL) {
        fprintf(stderr, "lease agent: cannot listen on %s: %s\n", listen_at,
                strerror(errno));
        lease_store_close(s);
        return EXIT_FAIL;
    }
    if (g->json)
        cli_print_json(json_pack("{s:s, s:s, s:s}", "event", "listening", "name", name,
                                 "listen", listen_at));

    /* Runs until SIGINT or SIGTERM; every pass waits at most 200 ms. */
    while (!stopping) {
        lease_campaign_opts co = LEASE_CAMPAIGN_OPTS_INIT;
        lease_info cur;
        int have;

        if (e && !lease_election_is_leader(e)) {
            lease_resign(e); /* stepped down: campaign again */
            e = NULL;
        }
        if (e == NULL) {
            co.ttl_ms = ttl_ms;
            co.label = label;
            co.wait_ms = 200;
            rc = lease_campaign(&e, s, name, &co);
            if (rc == 0 && g->json)
                cli_print_json(json_pack("{s:s, s:s, s:I}", "event", "leading", "name",
                                         name, "epoch",
                                         (json_int_t)lease_election_epoch(e)));
            if (rc < 0 && rc != LEASE_EBUSY && rc != LEASE_ETIMEOUT) {
                struct timespec pause = { 0, 200 * 1000000 };
                nanosleep(&pause, NULL);
            }
        } else {
            struct timespec pause = { 0, 100 * 1000000 };
            nanosleep(&pause, NULL);
        }
        have = lease_leader_get(&cur, s, name) == 0;
        pthread_mutex_lock(&view.mu);
        if (have)
            view.leader = cur;
        view.known = have;
        view.ours = e != NULL && lease_election_is_leader(e) && have &&
                    cur.token == lease_election_epoch(e);
        pthread_mutex_unlock(&view.mu);
    }
    MHD_stop_daemon(d);
    lease_resign(e);
    lease_store_close(s);
    return EXIT_OK;
}
