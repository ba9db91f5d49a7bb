/*
 * json_count.h - for tests: what jansson holds, counted through
 * json_set_alloc_funcs as malloc hands it out (glibc: an 8-byte header,
 * steps of 16, 32 bytes at least), which is what the etcd codec's budget
 * counts (src/stores/etcd/pb.c). Header-only; one process, one thread.
 *
 *   json_count_start();  once, before jansson allocates anything
 *   json_count_reset();  peaks are counted from here, above what is live
 *   json_count_peak();   the most held at once since the reset
 */
#ifndef LEASE_TEST_JSON_COUNT_H
#define LEASE_TEST_JSON_COUNT_H

#include <stddef.h>
#include <stdlib.h>
#include <jansson.h>

static size_t json_count_live, json_count_base, json_count_top;

/* Each block carries its size in front (16 bytes: malloc's alignment). */
static void *json_count_malloc(size_t n)
{
    size_t *p = malloc(n + 16), c = (n + 8 + 15) & ~(size_t)15;

    if (p == NULL)
        return NULL;
    p[0] = c < 32 ? 32 : c;
    json_count_live += p[0];
    if (json_count_live > json_count_top)
        json_count_top = json_count_live;
    return p + 2;
}

static void json_count_free(void *q)
{
    size_t *p = q ? (size_t *)q - 2 : NULL;

    if (p == NULL)
        return;
    json_count_live -= p[0];
    free(p);
}

static void json_count_start(void)
{
    json_set_alloc_funcs(json_count_malloc, json_count_free);
}

static void json_count_reset(void)
{
    json_count_base = json_count_top = json_count_live;
}

static size_t json_count_peak(void)
{
    return json_count_top - json_count_base;
}

#endif
