/*
 * fuzz_writers.c - the JSON log lines (src/core/log.c) and the Prometheus text
 * (src/core/metrics.c), driven with fuzzed keys, labels, messages, store names
 * and values.
 *
 * Input: fields separated by 0x01: key, label, message, store name, then
 * bytes read as numbers (metric values, rc codes, token, level).
 * Properties:
 *  - every log call at an enabled level gives exactly one line, which
 *    json_loads reads as an object whose "key"/"label"/"message" fields are
 *    strings, and which holds no raw newline;
 *  - lease_text_utf8 gives valid UTF-8 that keeps every valid character;
 *  - lease_metrics_text is valid text exposition format (a strict checker
 *    below): HELP/TYPE lines, samples of a declared family, well-formed
 *    names, label sets and numbers; histogram buckets never decrease and
 *    the +Inf bucket equals _count.
 */
#include <ctype.h>
#include <jansson.h>
#include <math.h>

#include "fuzz_util.h"
#include "lease_int.h"

static int lines_seen;

static void writers_sink(lease_log_level level, const char *line, void *payload)
{
    json_error_t err;
    json_t *o;

    (void)level;
    (void)payload;
    lines_seen++;
    if (strchr(line, '\n'))
        fuzz_fail("log line holds a newline: %s", line);
    o = json_loads(line, JSON_REJECT_DUPLICATES, &err);
    if (o == NULL || !json_is_object(o))
        fuzz_fail("log line is not a JSON object (%s): %s", err.text, line);
    if (!json_is_string(json_object_get(o, "event")))
        fuzz_fail("log line has no event: %s", line);
    json_decref(o);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    lease_log_set(writers_sink, NULL, LEASE_LOG_DEBUG);
    return 0;
}

/* Up to 8 bytes of the numbers piece as an integer (0 once used up). */
static uint64_t writers_num(const uint8_t **p, size_t *left)
{
    uint64_t v = 0;
    size_t i;

    for (i = 0; i < 8 && *left > 0; i++, (*p)++, (*left)--)
        v = v << 8 | **p;
    return v;
}

static void writers_log(const char *key, const char *label, const char *message,
                        const char *store, uint64_t token)
{
    lease_grant g;
    int before = lines_seen;

    memset(&g, 0, sizeof(g));
    lease__strlcpy(g.key, key, sizeof(g.key));
    lease__strlcpy(g.label, label, sizeof(g.label));
    lease__strlcpy(g.owner, "6f1c2d3e-0000-4000-8000-00000000abcd", sizeof(g.owner));
    g.token = token;
    lease__log(LEASE_LOG_WARN, "durability", store, message);
    if (lines_seen != before + 1)
        fuzz_fail("lease__log gave %d lines for message '%s'", lines_seen - before,
                  message);
    before = lines_seen;
    lease__log_state(LEASE_LOG_INFO, "acquired", store, &g, message[0] ? message : NULL);
    if (lines_seen != before + 1)
        fuzz_fail("lease__log_state gave %d lines for key '%s' label '%s'",
                  lines_seen - before, key, label);
}

static void writers_utf8(const char *s)
{
    char *t = lease_text_utf8(s);
    json_t *j;
    size_t i, n;

    if (t == NULL)
        fuzz_fail("lease_text_utf8 returned NULL");
    if ((j = json_string(t)) == NULL)
        fuzz_fail("lease_text_utf8('%s') is not valid UTF-8", s);
    json_decref(j);
    for (i = 0; s[i]; i += n ? n : 1) {
        n = lease_utf8_len(s + i);
        if (n > 4)
            fuzz_fail("lease_utf8_len = %zu", n);
    }
    if ((j = json_string(s)) != NULL) {
        /* Valid text comes through unchanged. */
        json_decref(j);
        if (strcmp(s, t) != 0)
            fuzz_fail("lease_text_utf8 changed valid UTF-8 '%s' into '%s'", s, t);
    }
    free(t);
}

#include "fuzz_prom.h"

static void writers_metrics(const char *store, const uint8_t *p, size_t left)
{
    char *text = NULL;
    int rc;

    lease_metrics_reset();
    while (left > 0) {
        uint64_t op = writers_num(&p, &left), v = writers_num(&p, &left);
        switch (op % 6) {
        case 0: lease__metric_acquire(store, -(int)(v % 12), (int64_t)v); break;
        case 1: lease__metric_renew(store, (int)(v & 1)); break;
        case 2: lease__metric_loss(store, (int)(v & 1)); break;
        case 3: lease__metric_held(store, (int64_t)v); break;
        case 4: lease__metric_leader(store); break;
        default: lease__metric_fenced(store); break;
        }
    }
    if ((rc = lease_metrics_text(&text)) < 0)
        fuzz_fail("lease_metrics_text failed: %s", lease_errmsg());
    prom_check(text);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_pieces p;
    char *f[4];
    size_t i;

    if (size > 8192)
        return 0;
    fuzz_split(&p, data, size, 0x01);
    for (i = 0; i < 4; i++)
        f[i] = i < p.n ? strndup((const char *)p.at[i], p.len[i]) : strdup("");
    writers_log(f[0], f[1], f[2], f[3], p.n > 4 ? (uint64_t)p.len[4] + 1 : 1);
    writers_utf8(f[0]);
    writers_utf8(f[2]);
    writers_metrics(f[3], p.n > 4 ? p.at[4] : NULL, p.n > 4 ? p.len[4] : 0);
    for (i = 0; i < 4; i++)
        free(f[i]);
    return 0;
}
