/*
 * fuzz_prom.h - a strict checker of Prometheus' text exposition format
 * (version 0.0.4), for the metrics fuzz target. It fails the run with the
 * offending line on the first thing a scraper could misread.
 */
#ifndef LEASE_FUZZ_PROM_H
#define LEASE_FUZZ_PROM_H

#include <ctype.h>
#include <math.h>

#include "fuzz_util.h"

#define PROM_MAX 64

typedef struct {
    char family[PROM_MAX][96];
    char type[PROM_MAX][16];
    size_t nfamilies;
    /* The histogram series being read: its labels without le. */
    char series[512];
    double last_bucket, inf_bucket;
    int have_inf;
} prom_state;

static inline int prom_name_char(int c, int first)
{
    return isalpha(c) || c == '_' || c == ':' || (!first && isdigit(c));
}

/* A metric or label name at *p; its length, 0 if none. */
static inline size_t prom_name(const char *p, int metric)
{
    size_t n = 0;

    while (p[n] && prom_name_char((unsigned char)p[n], n == 0) &&
           (metric || p[n] != ':'))
        n++;
    return n;
}

static inline double prom_value(const char *s, const char *line)
{
    char *end;
    double v;

    if (strcmp(s, "+Inf") == 0)
        return INFINITY;
    if (strcmp(s, "-Inf") == 0)
        return -INFINITY;
    if (strcmp(s, "NaN") == 0)
        return NAN;
    v = strtod(s, &end);
    if (end == s || *end != '\0' || isspace((unsigned char)*s))
        fuzz_fail("metrics: bad value '%s' in line: %s", s, line);
    return v;
}

static inline const char *prom_type_of(const prom_state *st, const char *name, size_t n)
{
    size_t i;

    for (i = 0; i < st->nfamilies; i++)
        if (strlen(st->family[i]) == n && strncmp(st->family[i], name, n) == 0)
            return st->type[i];
    return NULL;
}

static inline void prom_comment(prom_state *st, const char *line)
{
    const char *p = line + 2;
    size_t n;

    if (strncmp(line, "# HELP ", 7) != 0 && strncmp(line, "# TYPE ", 7) != 0)
        return; /* any other comment */
    p = line + 7;
    n = prom_name(p, 1);
    if (n == 0 || n >= sizeof(st->family[0]) || p[n] != ' ')
        fuzz_fail("metrics: bad name in line: %s", line);
    if (line[2] == 'H') {
        for (p += n + 1; *p; p++)
            if (*p == '\\' && p[1] != '\\' && p[1] != 'n')
                fuzz_fail("metrics: bad escape in HELP: %s", line);
            else if (*p == '\\')
                p++;
        return;
    }
    if (prom_type_of(st, p, n))
        fuzz_fail("metrics: second TYPE for a family: %s", line);
    if (strcmp(p + n + 1, "counter") && strcmp(p + n + 1, "gauge") &&
        strcmp(p + n + 1, "histogram") && strcmp(p + n + 1, "summary") &&
        strcmp(p + n + 1, "untyped"))
        fuzz_fail("metrics: unknown type: %s", line);
    if (st->nfamilies == PROM_MAX)
        fuzz_fail("metrics: more families than the checker keeps");
    memcpy(st->family[st->nfamilies], p, n);
    st->family[st->nfamilies][n] = '\0';
    strcpy(st->type[st->nfamilies], p + n + 1);
    st->nfamilies++;
}

/* Label set at *p ("{...}"): checked, copied without le into `rest`, le
 * into `le`. Returns the end of the set. */
static inline const char *prom_labels(const char *p, const char *line, char *rest,
                               size_t rsize, char *le, size_t lsize)
{
    size_t r = 0;

    le[0] = rest[0] = '\0';
    if (*p != '{')
        return p;
    for (p++; *p != '}';) {
        size_t n = prom_name(p, 0), v = 0;
        int is_le = n == 2 && strncmp(p, "le", 2) == 0;
        char val[256];

        if (n == 0 || p[n] != '=' || p[n + 1] != '"')
            fuzz_fail("metrics: bad label in line: %s", line);
        if (!is_le && r + n + 1 < rsize) {
            memcpy(rest + r, p, n + 1);
            r += n + 1;
        }
        for (p += n + 2; *p != '"'; p++) {
            if (*p == '\0' || *p == '\n')
                fuzz_fail("metrics: unterminated label value: %s", line);
            if (*p == '\\' && p[1] != '\\' && p[1] != '"' && p[1] != 'n')
                fuzz_fail("metrics: bad escape in label value: %s", line);
            if (v + 2 < sizeof(val))
                val[v++] = *p;
            if (*p == '\\')
                val[v++] = *++p;
        }
        val[v] = '\0';
        if (is_le)
            lease__strlcpy(le, val, lsize);
        else if (r + v + 2 < rsize) {
            memcpy(rest + r, val, v);
            r += v;
            rest[r++] = ',';
        }
        p++;
        if (*p == ',')
            p++;
        else if (*p != '}')
            fuzz_fail("metrics: bad label separator in line: %s", line);
    }
    rest[r] = '\0';
    return p + 1;
}

static inline void prom_histogram(prom_state *st, const char *suffix, const char *rest,
                           const char *le, double v, const char *line)
{
    if (strcmp(suffix, "_bucket") == 0) {
        double bound;
        if (le[0] == '\0')
            fuzz_fail("metrics: bucket without le: %s", line);
        bound = prom_value(le, line);
        if (strcmp(st->series, rest) != 0) {
            lease__strlcpy(st->series, rest, sizeof(st->series));
            st->last_bucket = 0;
            st->have_inf = 0;
        }
        if (v < st->last_bucket)
            fuzz_fail("metrics: bucket below the one before: %s", line);
        st->last_bucket = v;
        if (isinf(bound)) {
            st->have_inf = 1;
            st->inf_bucket = v;
        }
    } else if (strcmp(suffix, "_count") == 0) {
        if (strcmp(st->series, rest) != 0 || !st->have_inf || st->inf_bucket != v)
            fuzz_fail("metrics: _count does not match the +Inf bucket: %s", line);
    } else if (strcmp(suffix, "_sum") != 0) {
        fuzz_fail("metrics: histogram sample with suffix '%s': %s", suffix, line);
    }
}

static inline void prom_sample(prom_state *st, const char *line)
{
    size_t n = prom_name(line, 1), i;
    const char *type = NULL, *p, *suffix = "";
    char rest[512], le[64];
    double v;

    if (n == 0)
        fuzz_fail("metrics: line starts with no name: %s", line);
    type = prom_type_of(st, line, n);
    for (i = 0; type == NULL && i < 3; i++) {
        static const char *const sfx[] = { "_bucket", "_sum", "_count" };
        size_t k = strlen(sfx[i]);
        if (n > k && strncmp(line + n - k, sfx[i], k) == 0 &&
            (type = prom_type_of(st, line, n - k)) != NULL)
            suffix = sfx[i];
    }
    if (type == NULL)
        fuzz_fail("metrics: sample of an undeclared family: %s", line);
    p = prom_labels(line + n, line, rest, sizeof(rest), le, sizeof(le));
    if (*p != ' ')
        fuzz_fail("metrics: no space before the value: %s", line);
    v = prom_value(p + 1, line);
    if (strcmp(type, "counter") == 0 && !(v >= 0))
        fuzz_fail("metrics: counter below zero: %s", line);
    if (strcmp(type, "histogram") == 0)
        prom_histogram(st, suffix, rest, le, v, line);
}

static inline void prom_check(const char *text)
{
    prom_state st;
    const char *p = text;

    memset(&st, 0, sizeof(st));
    if (text[0] == '\0' || text[strlen(text) - 1] != '\n')
        fuzz_fail("metrics: text does not end with a newline");
    while (*p) {
        const char *nl = strchr(p, '\n');
        char *line = strndup(p, (size_t)(nl - p));

        if (line == NULL)
            abort();
        if (line[0] == '#')
            prom_comment(&st, line);
        else if (line[0] != '\0')
            prom_sample(&st, line);
        free(line);
        p = nl + 1;
    }
}

#endif
