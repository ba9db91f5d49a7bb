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

/* Emit one object as a line; takes the reference to `o`. */
static void emit(lease_log_level level, json_t *o)
{
    struct timespec ts;
    struct tm tm;
    char when[96];
    char *line;

    if (o == NULL)
        return;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(when, sizeof(when), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    /* Time and level first, for people reading the lines. */
    {
        json_t *line_obj = json_pack("{s:s, s:s}", "time", when, "level",
                                     level_names[level]);
        json_object_update(line_obj, o);
        json_decref(o);
        o = line_obj;
    }
    line = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER)
             : NULL;
    json_decref(o);
    if (line == NULL)
        return;
    if (sink)
        sink(level, line, sink_payload);
    else
        fprintf(stderr, "%s\n", line);
    free(line);
}

void lease__log(lease_log_level level, const char *event, const char *store,
                const char *message)
{
    if (!lease__log_enabled(level))
        return;
    emit(level, json_pack("{s:s, s:s, s:s?}", "event", event, "store",
                          store ? store : "", "message", message));
}

/* Keys and labels are bytes; JSON strings must be UTF-8. Bytes that are
 * not are shown as U+FFFD rather than dropping the field. */
static json_t *text(const char *s)
{
    json_t *j = json_string(s);
    char *fixed, *o;

    if (j)
        return j;
    if ((fixed = malloc(strlen(s) * 3 + 1)) == NULL)
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

void lease__log_state(lease_log_level level, const char *event,
                      const char *store, const lease_grant *grant,
                      const char *detail)
{
    if (!lease__log_enabled(level))
        return;
    emit(level, json_pack("{s:s, s:s, s:o, s:s, s:o, s:I, s:s?}", "event", event,
                          "store", store ? store : "",
                          "key", text(grant->key), "owner", grant->owner,
                          "label", text(grant->label),
                          "token", (json_int_t)grant->token, "message", detail));
}
