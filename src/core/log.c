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

size_t lease_utf8_len(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned c = u[0], cp, min;
    size_t n, i;

    if (c == 0)
        return 0;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2; cp = c & 0x1f; min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3; cp = c & 0x0f; min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4; cp = c & 0x07; min = 0x10000;
    } else {
        return 0;
    }
    /* A NUL fails the continuation test, so this stops at the string's end. */
    for (i = 1; i < n; i++) {
        if ((u[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (u[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

char *lease_text_utf8(const char *s)
{
    char *out, *o;

    /* Each invalid byte grows to 3 bytes, at most. */
    if (s == NULL || (out = malloc(strlen(s) * 3 + 1)) == NULL)
        return NULL;
    for (o = out; *s;) {
        size_t n = lease_utf8_len(s);

        if (n == 0) {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
            s++;
        } else {
            memcpy(o, s, n);
            o += n;
            s += n;
        }
    }
    *o = '\0';
    return out;
}

/* A JSON string for bytes chosen by users or by the store (json null for
 * NULL). jansson refuses invalid UTF-8, and a NULL in json_pack drops the
 * whole line: the bytes are repaired first, so a field is never lost. Always
 * through lease_text_utf8, so the rule is ours, the same as the tool's. */
static json_t *log_json_text(const char *s)
{
    json_t *j;
    char *fixed;

    if (s == NULL || (fixed = lease_text_utf8(s)) == NULL)
        return json_null();
    j = json_string(fixed);
    free(fixed);
    return j ? j : json_null();
}

/* Emit one object as a line; takes the reference to `o`. */
static void emit(lease_log_level level, json_t *o)
{
    struct timespec ts;
    struct tm tm;
    char when[96];
    char *line;
    json_t *line_obj;

    if (o == NULL)
        return;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(when, sizeof(when), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    /* Time and level first, for people reading the lines. */
    line_obj = json_pack("{s:s, s:s}", "time", when, "level", level_names[level]);
    if (line_obj != NULL)
        json_object_update(line_obj, o);
    json_decref(o);
    line = line_obj ? json_dumps(line_obj, JSON_COMPACT | JSON_ENSURE_ASCII |
                                               JSON_PRESERVE_ORDER)
                    : NULL;
    json_decref(line_obj);
    if (line == NULL)
        return;
    /* A store's message may quote a password its client library echoed;
     * the line is scrubbed whole, in the form JSON gave the secret. */
    lease__scrub(line);
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
    emit(level, json_pack("{s:o, s:o, s:o}", "event", log_json_text(event),
                          "store", log_json_text(store ? store : ""),
                          "message", log_json_text(message)));
}

void lease__log_state(lease_log_level level, const char *event,
                      const char *store, const lease_grant *grant,
                      const char *detail)
{
    if (!lease__log_enabled(level))
        return;
    emit(level, json_pack("{s:o, s:o, s:o, s:o, s:o, s:I, s:o}",
                          "event", log_json_text(event),
                          "store", log_json_text(store ? store : ""),
                          "key", log_json_text(grant->key),
                          "owner", log_json_text(grant->owner),
                          "label", log_json_text(grant->label),
                          "token", (json_int_t)grant->token,
                          "message", log_json_text(detail)));
}
