/*
 * store.c - finding a store by URL scheme, opening and closing it, and the
 * handle's settings. Nothing here knows any particular store.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease_int.h"

/* Stores registered by the application come first, then the built-in ones.
 * Each built-in store is compiled in only when its library was found. */
#define MAX_REGISTERED 8
static const lease_backend *registered[MAX_REGISTERED];
static size_t nregistered;

static const lease_backend *const builtin[] = {
    &lease__sqlite_backend,
    &lease__pg_backend,
    &lease__redis_backend,
    &lease__etcd_backend,
};

static int handles(const lease_backend *b, const char *scheme)
{
    const char *const *s;

    for (s = b->schemes; s && *s; s++)
        if (strcmp(*s, scheme) == 0)
            return 1;
    return 0;
}

const lease_backend *lease__backend_for(const char *scheme)
{
    size_t i;

    for (i = 0; i < nregistered; i++)
        if (handles(registered[i], scheme))
            return registered[i];
    for (i = 0; i < sizeof(builtin) / sizeof(builtin[0]); i++)
        if (handles(builtin[i], scheme))
            return builtin[i];
    return NULL;
}

int lease_backend_register(const lease_backend *b)
{
    if (b == NULL || b->version < 1 || b->version > LEASE_BACKEND_VERSION)
        return lease__seterr(LEASE_EINVALID,
                             "backend is NULL or of an unknown version");
    if (b->name == NULL || b->schemes == NULL || b->schemes[0] == NULL ||
        !b->open || !b->close || !b->acquire || !b->renew || !b->release ||
        !b->inspect || !b->list || !b->fence_advance || !b->fence_mark ||
        !b->guarded_put || !b->data_get)
        return lease__seterr(LEASE_EINVALID,
                             "backend '%s' lacks a required slot",
                             b->name ? b->name : "?");
    if (b->version >= 2 && !b->history != !b->history_lost)
        return lease__seterr(LEASE_EINVALID,
                             "backend '%s' must have both history slots or neither",
                             b->name);
    if (nregistered == MAX_REGISTERED)
        return lease__seterr(LEASE_ENOMEM, "too many registered backends");
    registered[nregistered++] = b;
    return 0;
}

int lease_store_open(lease_store **out, const char *url)
{
    return lease_store_open_timeout(out, url, LEASE__TIMEOUT_DEFAULT_MS);
}

int lease_store_open_timeout(lease_store **out, const char *url,
                             uint64_t timeout_ms)
{
    char scheme[32];
    const lease_backend *b;
    lease_store *s = NULL;
    int rc;

    if (out == NULL)
        return lease__seterr(LEASE_EINVALID, "out is NULL");
    *out = NULL;
    if (url == NULL || *url == '\0')
        return lease__seterr(LEASE_EINVALID, "store URL is empty");
    if (timeout_ms == 0 || timeout_ms > 24ULL * 3600 * 1000)
        return lease__seterr(LEASE_EINVALID,
                             "timeout must be between 1 ms and 24 h");
    if (lease__url_scheme(scheme, sizeof(scheme), url) < 0)
        return lease__seterr(LEASE_EINVALID,
                             "store URL has no scheme: expected e.g. "
                             "sqlite:///var/lib/app/lease.db");
    if ((b = lease__backend_for(scheme)) == NULL)
        return lease__seterr(LEASE_EINVALID,
                             "unknown store URL scheme '%s' (this build "
                             "knows: sqlite, postgres, postgresql, redis, etcd, etcds)", scheme);
    /* Before the store's open: libpq, hiredis and libcurl may quote the
     * URL in their messages, and every message is scrubbed of these. */
    if ((rc = lease__secrets_hold(url)) < 0)
        return lease__seterr(rc, "out of memory");
    if ((rc = b->open(&s, url, timeout_ms)) < 0) {
        lease__secrets_release(url);
        return rc;
    }
    s->backend = b;
    s->url = strdup(url);
    s->url_redacted = lease__url_redact(url);
    s->timeout_ms = timeout_ms;
    s->ttl_max_ms = LEASE_TTL_MAX_DEFAULT_MS;
    if (s->url == NULL || s->url_redacted == NULL) {
        if (s->url == NULL)
            lease__secrets_release(url); /* close cannot, without it */
        lease_store_close(s);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    if (b->set_timeout && (rc = b->set_timeout(s, s->timeout_ms)) < 0) {
        lease_store_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void lease_store_close(lease_store *s)
{
    char *url, *red;

    if (s == NULL)
        return;
    url = s->url;
    red = s->url_redacted;
    s->backend->close(s);
    if (url) {
        lease__secrets_release(url);
        /* The URL may hold a password: do not leave it in freed memory. */
        memset(url, 0, strlen(url));
        free(url);
    }
    free(red);
}

const char *lease_store_scheme(const lease_store *s)
{
    return s ? s->backend->name : "";
}

const char *lease_store_url_redacted(const lease_store *s)
{
    return s && s->url_redacted ? s->url_redacted : "";
}

int lease_store_set_timeout(lease_store *s, uint64_t timeout_ms)
{
    if (s == NULL)
        return lease__seterr(LEASE_EINVALID, "store is NULL");
    if (timeout_ms == 0 || timeout_ms > 24ULL * 3600 * 1000)
        return lease__seterr(LEASE_EINVALID,
                             "timeout must be between 1 ms and 24 h");
    s->timeout_ms = timeout_ms;
    return s->backend->set_timeout ? s->backend->set_timeout(s, timeout_ms) : 0;
}

int lease_store_set_ttl_max(lease_store *s, uint64_t ttl_max_ms)
{
    if (s == NULL)
        return lease__seterr(LEASE_EINVALID, "store is NULL");
    if (ttl_max_ms == 0 || ttl_max_ms > (uint64_t)INT64_MAX / 1000000)
        return lease__seterr(LEASE_EINVALID, "ttl cap out of range");
    s->ttl_max_ms = ttl_max_ms;
    return 0;
}

/* Append `dir` to buf as a URL path: '%', '?' and '#' (and anything that
 * is not printable ASCII) are percent-encoded so the parser reads back
 * exactly `dir`. Returns the new length, or size when it does not fit. */
static size_t put_path(char *buf, size_t len, size_t size, const char *dir)
{
    static const char hex[] = "0123456789ABCDEF";

    for (; *dir && len < size; dir++) {
        unsigned char c = (unsigned char)*dir;

        if (c == '%' || c == '?' || c == '#' || c <= 0x20 || c >= 0x7f) {
            if (len + 3 >= size)
                return size;
            buf[len++] = '%';
            buf[len++] = hex[c >> 4];
            buf[len++] = hex[c & 15];
        } else {
            buf[len++] = (char)c;
        }
    }
    return len;
}

int lease_default_store_url(char *buf, size_t size)
{
    const char *env = getenv("LEASE_STORE"), *state = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME"), *base, *tail;
    size_t len;

    if (buf == NULL || size == 0)
        return lease__seterr(LEASE_EINVALID, "buffer is NULL or empty");
    if (env && *env) {
        if (strlen(env) >= size)
            return lease__seterr(LEASE_EINVALID, "store URL does not fit");
        strcpy(buf, env);
        return 0;
    }
    if (state && *state == '/') {
        base = state;
        tail = "/lease/lease.db";
    } else if (home && *home == '/') {
        base = home;
        tail = "/.local/state/lease/lease.db";
    } else {
        return lease__seterr(LEASE_ENOTFOUND,
                             "no store given, and neither LEASE_STORE, "
                             "XDG_STATE_HOME nor HOME is set");
    }
    len = put_path(buf, 0, size, "sqlite://");
    len = put_path(buf, len, size, base);
    len = put_path(buf, len, size, tail);
    if (len >= size)
        return lease__seterr(LEASE_EINVALID, "store URL does not fit");
    buf[len] = '\0';
    return 0;
}
