/*
 * log.c - structured log lines, built with a JSON library (never by hand).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jansson.h>

#include "lease_int.h"

static lease_log_fn sink;
static void *sink_payload;
static lease_log_level min_level = LEASE_LOG_WARN;

static const char *const level_names[] = { "debug", "info", "warn", "error" };

void lease_log_set(lease_log_fn fn, void *payload, lease_log_level level)
{
    sink = fn;
    sink_payload = payload;
    min_level = level;
}

int lease__log_enabled(lease_log_level level)
{
    return level >= min_level && level < LEASE_LOG_OFF;
}

void lease__log(lease_log_level level, const char *event, const char *store,
                const char *message)
{
    struct timespec ts;
    struct tm tm;
    char when[96];
    json_t *o;
    char *line;

    if (!lease__log_enabled(level))
        return;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(when, sizeof(when), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    o = json_pack("{s:s, s:s, s:s, s:s, s:s?}", "time", when, "level",
                  level_names[level], "event", event, "store", store ? store : "",
                  "message", message);
    if (o == NULL)
        return;
    line = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(o);
    if (line == NULL)
        return;
    if (sink)
        sink(level, line, sink_payload);
    else
        fprintf(stderr, "%s\n", line);
    free(line);
}
