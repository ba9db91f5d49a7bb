/*
 * store.c - finding a store by URL scheme, checking and registering store
 * tables, opening and closing a connection, and the handle's settings.
 * lease__stores below is the project's one list of stores; PostgreSQL,
 * Redis, etcd and Kubernetes are optional (LEASE_WITH_<STORE>), and one this
 * build was configured without keeps its entry with no backend, so that its
 * scheme gets "this build has no ... store". In liblease.so
 * (LEASE_STORE_MODULES) those four are modules, loaded here on first use (module_get). Beyond
 * that list nothing here knows any particular store.
 */
#if LEASE_STORE_MODULES
#define _GNU_SOURCE /* dladdr */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if LEASE_STORE_MODULES
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#endif

#include "lease_int.h"

/* Stores registered by the application come first, then the built-in ones. */
#define MAX_REGISTERED 8
static const lease_backend *registered[MAX_REGISTERED];
static size_t nregistered;

const char *const lease__sqlite_schemes[] = { "sqlite", NULL };
const char *const lease__pg_schemes[] = { "postgres", "postgresql", NULL };
const char *const lease__redis_schemes[] = { "redis", NULL };
const char *const lease__etcd_schemes[] = { "etcd", "etcds", NULL };
const char *const lease__kubernetes_schemes[] = { "kubernetes", "kubernetes+http", NULL };

/* The backend of a store module before it is loaded: "in this build", no
 * slot (version 0, so that lease__backend_check would refuse it). */
const lease_backend lease__module_placeholder = { 0 };

/* A store built as a module of liblease.so: "in this build", its tables
 * in the file named, loaded on first use. */
#define MODULE_STORE(name, schemes) \
    { name, schemes, &lease__module_placeholder, NULL, \
      LEASE_MODULE_PREFIX name ".so" }
#define ABSENT_STORE(name, schemes) { name, schemes, NULL, NULL, NULL }

/* Every store of the project, in this order in every listing. */
const lease__store_entry lease__stores[LEASE__NSTORES] = {
    { "sqlite", lease__sqlite_schemes, &lease__sqlite_backend,
      lease__sqlite_client_version, NULL },
#if LEASE_WITH_POSTGRES && LEASE_STORE_MODULES
    MODULE_STORE("postgres", lease__pg_schemes),
#elif LEASE_WITH_POSTGRES
    { "postgres", lease__pg_schemes, &lease__pg_backend, lease__pg_client_version, NULL },
#else
    ABSENT_STORE("postgres", lease__pg_schemes),
#endif
#if LEASE_WITH_REDIS && LEASE_STORE_MODULES
    MODULE_STORE("redis", lease__redis_schemes),
#elif LEASE_WITH_REDIS
    { "redis", lease__redis_schemes, &lease__redis_backend, lease__redis_client_version,
      NULL },
#else
    ABSENT_STORE("redis", lease__redis_schemes),
#endif
#if LEASE_WITH_ETCD && LEASE_STORE_MODULES
    MODULE_STORE("etcd", lease__etcd_schemes),
#elif LEASE_WITH_ETCD
    { "etcd", lease__etcd_schemes, &lease__etcd_backend, lease__etcd_client_version, NULL },
#else
    ABSENT_STORE("etcd", lease__etcd_schemes),
#endif
#if LEASE_WITH_KUBERNETES && LEASE_STORE_MODULES
    MODULE_STORE("kubernetes", lease__kubernetes_schemes),
#elif LEASE_WITH_KUBERNETES
    { "kubernetes", lease__kubernetes_schemes, &lease__kubernetes_backend,
      lease__kubernetes_client_version, NULL },
#else
    ABSENT_STORE("kubernetes", lease__kubernetes_schemes),
#endif
};

#if LEASE_STORE_MODULES
/* The loaded modules, per entry of lease__stores: set once, under the lock,
 * and read without it. A module is never unloaded (its tables are in use
 * by any open store), and a failed load is not remembered, so that a module
 * installed later is found. */
static const lease__store_module *_Atomic loaded[LEASE__NSTORES];
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * The directory of liblease.so, resolved once, when the loader maps the
 * library: dladdr gives the name the loader used, which may be relative
 * (LD_LIBRARY_PATH=lib, a relative run path) and so would follow any
 * chdir the program made since if it were resolved at the first use of a
 * module. Empty when it cannot be found: no module loads then.
 */
static char module_dir[PATH_MAX];

__attribute__((constructor)) static void module_dir_find(void)
{
    static const char anchor = 0;
    char dir[PATH_MAX];
    const char *slash;
    Dl_info info;

    if (dladdr(&anchor, &info) == 0 || info.dli_fname == NULL ||
        (slash = strrchr(info.dli_fname, '/')) == NULL ||
        (size_t)(slash - info.dli_fname) >= sizeof(dir))
        return;
    memcpy(dir, info.dli_fname, (size_t)(slash - info.dli_fname));
    dir[slash - info.dli_fname] = '\0';
    if (realpath(dir, module_dir) == NULL || module_dir[0] != '/')
        module_dir[0] = '\0';
}

/* A fork while another thread loads a module must not leave the child
 * with the lock held for good: taken around fork, released on both sides. */
static void load_lock_take(void)
{
    pthread_mutex_lock(&load_lock);
}

static void load_lock_give(void)
{
    pthread_mutex_unlock(&load_lock);
}

__attribute__((constructor)) static void load_lock_atfork(void)
{
    pthread_atfork(load_lock_take, load_lock_give, load_lock_give);
}

/* <directory of liblease.so>/LEASE_MODULE_SUBDIR/<file>. */
static int module_path(char *buf, size_t size, const char *file)
{
    int n;

    if (module_dir[0] == '\0')
        return lease__seterr(LEASE_EINVALID,
                             "cannot find the directory of liblease to load %s", file);
    n = snprintf(buf, size, "%s/%s/%s", module_dir, LEASE_MODULE_SUBDIR, file);
    if (n < 0 || (size_t)n >= size)
        return lease__seterr(LEASE_EINVALID, "the path of %s is too long", file);
    return 0;
}

/* What the module's entry point returned, checked as a registered table is. */
static int module_check(const lease__store_entry *e, const char *path,
                        const lease__store_module *m)
{
    if (m == NULL || m->abi != LEASE__MODULE_ABI)
        return lease__seterr(LEASE_EINVALID,
                             "the %s store's module %s is of another module ABI",
                             e->name, path);
    if (m->lease_version == NULL || strcmp(m->lease_version, LEASE_VERSION_STRING) != 0)
        return lease__seterr(LEASE_EINVALID,
                             "the %s store's module %s was built for liblease %s, "
                             "this is liblease %s", e->name, path,
                             m->lease_version ? m->lease_version : "?",
                             LEASE_VERSION_STRING);
    if (m->name == NULL || strcmp(m->name, e->name) != 0 || !m->client_version ||
        lease__backend_check(m->backend) < 0 ||
        m->backend->schemes != e->schemes)
        return lease__seterr(LEASE_EINVALID,
                             "the %s store's module %s is not that store's",
                             e->name, path);
    return 0;
}

/* dlopen the module of entry i. RTLD_LOCAL: its client library's symbols
 * stay out of the global scope; RTLD_NOW: a missing symbol fails here, not
 * in the middle of an acquire. */
static int module_load(size_t i, const lease__store_module **out)
{
    const lease__store_entry *e = &lease__stores[i];
    char path[PATH_MAX];
    struct stat st;
    lease__store_module_fn entry;
    void *h, *sym;
    int rc;

    if ((rc = module_path(path, sizeof(path), e->module)) < 0)
        return rc;
    if (stat(path, &st) != 0 && errno == ENOENT)
        return lease__seterr(LEASE_EINVALID,
                             "the %s store is a module that is not installed: "
                             "no %s", e->name, path);
    if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) == NULL) {
        const char *why = dlerror();

        return lease__seterr(LEASE_EINVALID, "cannot load the %s store's module: %s",
                             e->name, why ? why : path);
    }
    /* POSIX: a function's address may go through void *. */
    if ((sym = dlsym(h, LEASE__MODULE_ENTRY)) != NULL)
        memcpy(&entry, &sym, sizeof(entry));
    if (sym == NULL)
        rc = lease__seterr(LEASE_EINVALID, "the %s store's module %s has no %s",
                           e->name, path, LEASE__MODULE_ENTRY);
    else if ((rc = module_check(e, path, *out = entry())) == 0)
        return 0;
    dlclose(h);
    return rc;
}

/* The module of entry i, loaded once, whichever thread comes first. */
static int module_get(size_t i, const lease__store_module **out)
{
    const lease__store_module *m = atomic_load(&loaded[i]);
    int rc = 0;

    if (m == NULL) {
        pthread_mutex_lock(&load_lock);
        if ((m = atomic_load(&loaded[i])) == NULL &&
            (rc = module_load(i, &m)) == 0)
            atomic_store(&loaded[i], m);
        pthread_mutex_unlock(&load_lock);
    }
    *out = m;
    return rc;
}
#endif

/* The backend and client_version of entry i, its module loaded if it is
 * one; the error when that fails. */
static int entry_tables(size_t i, const lease_backend **backend,
                        int (**client_version)(char *, size_t))
{
#if LEASE_STORE_MODULES
    const lease__store_module *m;
    int rc;

    if (lease__stores[i].module) {
        if ((rc = module_get(i, &m)) < 0)
            return rc;
        *backend = m->backend;
        *client_version = m->client_version;
        return 0;
    }
#endif
    *backend = lease__stores[i].backend;
    *client_version = lease__stores[i].client_version;
    return 0;
}

static int in_list(const char *const *list, const char *scheme)
{
    for (; list && *list; list++)
        if (strcmp(*list, scheme) == 0)
            return 1;
    return 0;
}

/* "sqlite, redis": the stores of this build, for messages. */
static void builtin_names(char *buf, size_t size)
{
    size_t i, len = 0;

    buf[0] = '\0';
    for (i = 0; i < LEASE__NSTORES && len < size; i++)
        if (lease__stores[i].backend)
            len += (size_t)snprintf(buf + len, size - len, "%s%s",
                                    len ? ", " : "", lease__stores[i].name);
}

/* The error for a scheme no store of this process handles: a store of the
 * project this build was configured without, or no store at all. */
static int no_backend(const char *scheme)
{
    char names[64];
    size_t i;

    builtin_names(names, sizeof(names));
    for (i = 0; i < LEASE__NSTORES; i++)
        if (in_list(lease__stores[i].schemes, scheme))
            return lease__seterr(LEASE_EINVALID,
                                 "this build has no %s store; built with: %s",
                                 lease__stores[i].name, names);
    return lease__seterr(LEASE_EINVALID,
                         "unknown store URL scheme '%s' (this build has: %s)",
                         scheme, names);
}

/* The backend of a scheme: an application's first, then the project's (its
 * module loaded on first use); the error when none, or its module fails. */
static int backend_lookup(const char *scheme, const lease_backend **out)
{
    int (*client_version)(char *, size_t);
    size_t i;

    for (i = 0; i < nregistered; i++)
        if (in_list(registered[i]->schemes, scheme)) {
            *out = registered[i];
            return 0;
        }
    for (i = 0; i < LEASE__NSTORES; i++)
        if (lease__stores[i].backend && in_list(lease__stores[i].schemes, scheme))
            return entry_tables(i, out, &client_version);
    return no_backend(scheme);
}

const lease_backend *lease__backend_for(const char *scheme)
{
    const lease_backend *b = NULL;

    return backend_lookup(scheme, &b) == 0 ? b : NULL;
}

const char *lease_version(void)
{
    return LEASE_VERSION_STRING;
}

const char *lease_store_builtin(size_t i)
{
    size_t k;

    for (k = 0; k < LEASE__NSTORES; k++)
        if (lease__stores[k].backend && i-- == 0)
            return lease__stores[k].name;
    return NULL;
}

int lease_store_client_version(char *buf, size_t size, const char *store)
{
    size_t i;
    int rc;

    if (buf == NULL || size == 0)
        return lease__seterr(LEASE_EINVALID, "buf is NULL or size is 0");
    buf[0] = '\0';
    if (store == NULL)
        return lease__seterr(LEASE_EINVALID, "store is NULL");
    for (i = 0; i < LEASE__NSTORES; i++) {
        const lease_backend *b;
        int (*client_version)(char *, size_t);

        if (!lease__stores[i].backend || strcmp(lease__stores[i].name, store) != 0)
            continue;
        if ((rc = entry_tables(i, &b, &client_version)) < 0)
            return rc; /* the module did not load */
        if ((rc = client_version(buf, size)) < 0 ||
            (size_t)rc >= size) {
            buf[0] = '\0';
            return lease__seterr(LEASE_EINVALID, "buffer too small");
        }
        return 0;
    }
    return lease__seterr(LEASE_ENOTFOUND, "this build has no store '%s'", store);
}

/* A feature bit and the slot that provides it. */
static int lacks_feature_slot(const lease_backend *b)
{
    unsigned int f = b->features;

    return ((f & LEASE_FEATURE_NOTIFY) && !b->wait_release) ||
           ((f & LEASE_FEATURE_TXN) && !b->guarded_txn) ||
           ((f & LEASE_FEATURE_RENEW_MANY) && !b->renew_many) ||
           ((f & LEASE_FEATURE_ADVISORY) && !b->advisory_txn) ||
           ((f & LEASE_FEATURE_SHARED) &&
            (b->version < 4 || !b->share_lease || !b->renew_many));
}

int lease__backend_check(const lease_backend *b)
{
    if (b == NULL || b->version < 1 || b->version > LEASE_BACKEND_VERSION)
        return lease__seterr(LEASE_EINVALID,
                             "backend is NULL or of an unknown version");
    if (b->name == NULL || b->schemes == NULL || b->schemes[0] == NULL ||
        !b->close || !b->acquire || !b->renew || !b->release ||
        !b->inspect || !b->list || !b->fence_advance || !b->fence_mark ||
        !b->guarded_put || !b->data_get)
        return lease__seterr(LEASE_EINVALID,
                             "backend '%s' lacks a required slot",
                             b->name ? b->name : "?");
    /* store_size and open3 exist only in a table of version 3 or later:
     * an older one ends before them. */
    if (b->version < 3 ? !b->open
                       : !b->open3 || b->open || b->store_size < sizeof(lease_store))
        return lease__seterr(LEASE_EINVALID,
                             "backend '%s' needs %s", b->name,
                             b->version < 3 ? "open"
                                            : "open3 and store_size (and no open)");
    if (b->version >= 2 && !b->history != !b->history_lost)
        return lease__seterr(LEASE_EINVALID,
                             "backend '%s' must have both history slots or neither",
                             b->name);
    if (lacks_feature_slot(b))
        return lease__seterr(LEASE_EINVALID,
                             "backend '%s' names a feature whose slot it lacks",
                             b->name);
    return 0;
}

int lease_backend_register(const lease_backend *b)
{
    int rc;

    if ((rc = lease__backend_check(b)) < 0)
        return rc;
    if (nregistered == MAX_REGISTERED)
        return lease__seterr(LEASE_ENOMEM, "too many registered backends");
    registered[nregistered++] = b;
    return 0;
}

int lease_store_open(lease_store **out, const char *url)
{
    return lease_store_open_timeout(out, url, LEASE__TIMEOUT_DEFAULT_MS);
}

/* Give back the strings of the core's part: the URL may hold a password,
 * so it is not left in freed memory, and its secrets leave the registry. */
static void free_parent(char *url, char *redacted)
{
    if (url) {
        lease__secrets_release(url);
        lease__free_secret(url);
    }
    free(redacted);
}

/* The core's part of a connection: the same before (version 3) or after
 * (earlier versions) the store's open. */
static int fill_parent(lease_store *s, const lease_backend *b, const char *url,
                       uint64_t timeout_ms)
{
    s->backend = b;
    s->url = strdup(url);
    s->url_redacted = lease__url_redact(url);
    s->timeout_ms = timeout_ms;
    s->ttl_max_ms = LEASE_TTL_MAX_DEFAULT_MS;
    if (s->url == NULL || s->url_redacted == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    return 0;
}

/* Version 3: the core allocates the connection and fills its part first.
 * The URL's secrets are held by the caller; from here on they go with
 * s->url, or are released here when there is none. */
static int open_v3(lease_store **out, const lease_backend *b, const char *url,
                   uint64_t timeout_ms)
{
    lease_store *s = calloc(1, b->store_size);
    int rc;

    if (s == NULL) {
        lease__secrets_release(url);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    if ((rc = fill_parent(s, b, url, timeout_ms)) < 0 || (rc = b->open3(s, url)) < 0) {
        if (s->url == NULL)
            lease__secrets_release(url);
        free_parent(s->url, s->url_redacted);
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* Versions 1 and 2: the store allocates, the core fills its part after. */
static int open_v2(lease_store **out, const lease_backend *b, const char *url,
                   uint64_t timeout_ms)
{
    lease_store *s = NULL;
    int rc;

    if ((rc = b->open(&s, url, timeout_ms)) < 0) {
        lease__secrets_release(url);
        return rc;
    }
    if ((rc = fill_parent(s, b, url, timeout_ms)) < 0) {
        if (s->url == NULL)
            lease__secrets_release(url); /* close cannot, without it */
        lease_store_close(s);
        return rc;
    }
    *out = s;
    return 0;
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
    if (timeout_ms == 0 || timeout_ms > LEASE__WAIT_MAX_MS)
        return lease__seterr(LEASE_EINVALID,
                             "timeout must be between 1 ms and 24 h");
    if (lease__url_scheme(scheme, sizeof(scheme), url) < 0)
        return lease__seterr(LEASE_EINVALID,
                             "store URL has no scheme: expected e.g. "
                             "sqlite:///var/lib/app/lease.db");
    if ((rc = backend_lookup(scheme, &b)) < 0)
        return rc;
    /* Before the store's open: libpq, hiredis and libcurl may quote the
     * URL in their messages, and every message is scrubbed of these. */
    if ((rc = lease__secrets_hold(url)) < 0)
        return lease__seterr(rc, "out of memory");
    rc = b->version >= 3 ? open_v3(&s, b, url, timeout_ms)
                         : open_v2(&s, b, url, timeout_ms);
    if (rc < 0)
        return rc;
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
    int core_owned;

    if (s == NULL)
        return;
    url = s->url;
    red = s->url_redacted;
    core_owned = s->backend->version >= 3;
    s->backend->close(s);
    if (core_owned)
        free(s);
    free_parent(url, red);
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
    uint64_t old;
    int rc;

    if (s == NULL)
        return lease__seterr(LEASE_EINVALID, "store is NULL");
    if (timeout_ms == 0 || timeout_ms > LEASE__WAIT_MAX_MS)
        return lease__seterr(LEASE_EINVALID,
                             "timeout must be between 1 ms and 24 h");
    /* Unchanged: nothing to tell the store. A keeper or a session sets the
     * bound before every renewal. The stores here read the value at each
     * call (PostgreSQL sends its server-side timeouts with the next call,
     * within that call's bound, when they differ); the slot is for a store
     * that must be told at once. */
    if (timeout_ms == s->timeout_ms)
        return 0;
    old = s->timeout_ms;
    s->timeout_ms = timeout_ms;
    /* A store that could not apply it keeps the old value, so that setting
     * the same value again tries again instead of being skipped. */
    if (s->backend->set_timeout && (rc = s->backend->set_timeout(s, timeout_ms)) < 0) {
        s->timeout_ms = old;
        return rc;
    }
    return 0;
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

/*
 * A clock-floored token (?tokens=clock) is max(last + 1, the store's clock
 * in microseconds). When last + 1 won by more than a second, the store's
 * clock is behind tokens it issued before (it was set back, or a primary
 * with a clock ahead issued them): tokens still grow, but a failover to a
 * server that far behind could issue one again, which is the case the
 * floor cannot cover. One warning per such grant, and a counter.
 */
void lease__clock_behind(const char *store, const lease_request *req, uint64_t token,
                         uint64_t behind_us)
{
    lease_grant g;
    char detail[160];

    lease__metric_clock_behind(store);
    if (!lease__log_enabled(LEASE_LOG_WARN))
        return;
    memset(&g, 0, sizeof(g));
    lease__strlcpy(g.key, req->key, sizeof(g.key));
    lease__strlcpy(g.owner, req->owner, sizeof(g.owner));
    lease__strlcpy(g.label, req->label, sizeof(g.label));
    g.token = token;
    snprintf(detail, sizeof(detail), "the store's clock is %llu ms behind the last "
             "token; this token follows it (+1) instead of the clock",
             (unsigned long long)(behind_us / 1000));
    lease__log_state(LEASE_LOG_WARN, "clock_behind", store, &g, detail);
}
