/*
 * lease.c - the operations of the public API: argument checks, local
 * deadlines, and the bounded wait of acquire. The store does one attempt;
 * everything around it lives here, once for every store.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease_int.h"

#define BACKOFF_MIN_DEFAULT_MS 10
#define BACKOFF_MAX_DEFAULT_MS 1000

static int check_store(const lease_store *s)
{
    if (s == NULL)
        return lease__seterr(LEASE_EINVALID, "store is NULL");
    return 0;
}

/* A grant given back by the caller: its strings must still be sound. */
int lease__check_grant(const lease_grant *g)
{
    int rc;

    if (g == NULL)
        return lease__seterr(LEASE_EINVALID, "grant is NULL");
    if (memchr(g->key, '\0', sizeof(g->key)) == NULL ||
        memchr(g->owner, '\0', sizeof(g->owner)) == NULL)
        return lease__seterr(LEASE_EINVALID, "grant is not initialised");
    if ((rc = lease__check_name("key", g->key)) < 0)
        return rc;
    if (!lease_owner_valid(g->owner))
        return lease__seterr(LEASE_EINVALID, "grant has no valid owner");
    if (g->token == 0 || g->token > LEASE__TOKEN_MAX)
        return lease__seterr(LEASE_EINVALID, "grant has no valid token");
    return 0;
}

static int busy_error(int code, const char *key, const lease_info *h)
{
    return lease__seterr(code,
                         "'%s' is held by %s%s(owner %s, token %llu), "
                         "%llu ms left",
                         key, h->label[0] ? h->label : "",
                         h->label[0] ? " " : "", h->owner[0] ? h->owner : "?",
                         (unsigned long long)h->token,
                         (unsigned long long)h->remaining_ms);
}

static int acquire_failed(const lease_store *s, int rc, int64_t start)
{
    lease__metric_acquire(s->backend->name, rc, lease_clock_ns() - start);
    return rc;
}

/*
 * Complete the grant the store made for req, sent at `sent`. A grant whose
 * local deadline has passed by the time the answer arrived (a slow or
 * trickling store) gives no authority: it is released, best-effort, and is
 * LEASE_ESTORE - never a success with no time left. While waiting this is
 * retried like any store failure.
 */
static int acquire_granted(lease_grant *g, lease_store *s,
                           const lease_request *req, int64_t sent)
{
    int64_t now = lease_clock_ns();
    char msg[LEASE__ERRMSG_SIZE];

    lease__strlcpy(g->key, req->key, sizeof(g->key));
    memcpy(g->owner, req->owner, sizeof(g->owner));
    lease__strlcpy(g->label, req->label, sizeof(g->label));
    g->deadline_ns = lease__deadline_ns(sent, g->ttl_ms);
    g->acquired_ns = sent;
    if (g->deadline_ns > now)
        return 0;
    snprintf(msg, sizeof(msg),
             "acquire '%s': the store answered after %lld ms, past the local "
             "deadline of the %llu ms lease: not taken as held (released)",
             req->key, (long long)((now - sent) / 1000000),
             (unsigned long long)g->ttl_ms);
    lease__log_state(LEASE_LOG_WARN, "acquire_too_late", s->backend->name, g, msg);
    (void)s->backend->release(s, g->key, g->owner, g->token);
    return lease__seterr(LEASE_ESTORE, "%s", msg);
}

/*
 * Pause between two attempts of a waiting acquire: full jitter in
 * [backoff/2, backoff], but never past the moment the holder's lease should
 * end (remaining_ms), nor past the end of the wait (left_ms >= 1). A store
 * that can notify is waited on instead of sleeping. 1 when `cancel` (NULL:
 * none) was fired, else 0.
 */
static int acquire_pause(lease_store *s, const char *key, int rc,
                         uint64_t backoff, uint64_t remaining_ms,
                         uint64_t left_ms, const lease_cancel *cancel)
{
    uint64_t pause = backoff / 2 + lease__random_u64() % (backoff / 2 + 1);

    if (rc == LEASE_ESTORE)
        remaining_ms = UINT64_MAX / 2;
    if (remaining_ms + 1 < pause)
        pause = remaining_ms + 1;
    if (pause > left_ms)
        pause = left_ms;
    if (pause == 0)
        pause = 1;
    /* A store's own wait cannot be interrupted: a cancellable wait watches
     * its handle instead (see lease_cancel in lease/lease.h). */
    if (cancel)
        return lease__cancel_wait(cancel, pause);
    if (s->backend->wait_release && rc == LEASE_EBUSY) {
        int64_t before = lease_clock_ns();
        int wrc = s->backend->wait_release(s, key, pause);

        /* A notification channel that failed (the store restarting)
         * is one more store failure to retry: sleep out the pause. */
        if (wrc < 0 && wrc != LEASE_ETIMEOUT)
            lease__sleep_ns((int64_t)pause * 1000000 - (lease_clock_ns() - before));
    } else {
        lease__sleep_ns((int64_t)pause * 1000000);
    }
    return 0;
}

/* What an acquisition asks of its holder, for lease_acquire and sessions:
 * a UUID owner (canonical in `owner`), a ttl within the handle's cap, a
 * label of at most LEASE_LABEL_MAX bytes (NULL is ""). */
int lease__check_holder(char owner[LEASE_OWNER_BUFSZ], const lease_store *s,
                        const char *owner_in, uint64_t ttl_ms, const char *label)
{
    int rc;

    if ((rc = lease__canonical_owner(owner, owner_in)) < 0 ||
        (rc = lease__check_ttl(s, ttl_ms)) < 0)
        return rc;
    if (label && strnlen(label, LEASE_LABEL_MAX + 1) > LEASE_LABEL_MAX)
        return lease__seterr(LEASE_EINVALID, "label is longer than %d bytes",
                             LEASE_LABEL_MAX);
    return 0;
}

int lease_acquire(lease_grant *out, lease_info *holder, lease_store *s,
                  const char *key, const lease_acquire_opts *opts)
{
    char owner[LEASE_OWNER_BUFSZ];
    lease_request req;
    lease_info h;
    lease_grant g;
    const lease_cancel *cancel;
    uint64_t backoff, backoff_max;
    int64_t wait_end, start;
    int rc;

    if (out == NULL)
        return lease__seterr(LEASE_EINVALID, "out is NULL");
    if ((rc = check_store(s)) < 0 || (rc = lease__check_name("key", key)) < 0)
        return rc;
    /* Version 1 ended before `cancel`: never read it there. */
    if (opts == NULL || opts->version < 1 || opts->version > LEASE_ACQUIRE_OPTS_VERSION)
        return lease__seterr(LEASE_EINVALID,
                             "options are NULL or not LEASE_ACQUIRE_OPTS_INIT");
    cancel = opts->version >= 2 ? opts->cancel : NULL;
    if ((rc = lease__check_holder(owner, s, opts->owner, opts->ttl_ms, opts->label)) < 0)
        return rc;
    if (opts->wait_ms > LEASE__WAIT_MAX_MS)
        return lease__seterr(LEASE_EINVALID, "wait is longer than 24 h");

    req.key = key;
    req.owner = owner;
    req.label = opts->label ? opts->label : "";
    req.ttl_ms = opts->ttl_ms;
    backoff = opts->backoff_min_ms ? opts->backoff_min_ms : BACKOFF_MIN_DEFAULT_MS;
    backoff_max = opts->backoff_max_ms ? opts->backoff_max_ms : BACKOFF_MAX_DEFAULT_MS;
    if (backoff > backoff_max)
        backoff = backoff_max;
    start = lease_clock_ns();
    wait_end = start + (int64_t)opts->wait_ms * 1000000;

    /* Bounded: every pass either returns or sleeps at least 1 ms, and the
     * loop returns once wait_end has passed. */
    for (;;) {
        int64_t sent = lease_clock_ns(), left;

        memset(&g, 0, sizeof(g));
        memset(&h, 0, sizeof(h));
        rc = s->backend->acquire(&g, &h, s, &req);
        if (rc == 0 && (rc = acquire_granted(&g, s, &req, sent)) == 0) {
            *out = g;
            lease__metric_acquire(s->backend->name, 0, lease_clock_ns() - start);
            lease__log_state(LEASE_LOG_INFO, "acquired", s->backend->name, &g, NULL);
            return 0;
        }
        /* While waiting, a store failure is retried like a busy key (the
         * store may be restarting), but it is what the caller hears if the
         * wait ends on it: an unreachable store is never reported as busy. */
        if (rc != LEASE_EBUSY && (rc != LEASE_ESTORE || opts->wait_ms == 0))
            return acquire_failed(s, rc, start);
        if (rc == LEASE_EBUSY && holder)
            *holder = h;
        if (opts->wait_ms == 0)
            return acquire_failed(s, busy_error(LEASE_EBUSY, key, &h), start);
        left = (wait_end - lease_clock_ns()) / 1000000;
        if (left <= 0)
            return acquire_failed(s, rc == LEASE_ESTORE
                                         ? rc : busy_error(LEASE_ETIMEOUT, key, &h),
                                  start);
        /* Cancelled after a try whose outcome is unknown: that is what
         * the caller must hear (it may hold the lease; the same owner may
         * ask again to learn), not a plain end of the wait. */
        if (lease_cancel_fired(cancel) ||
            acquire_pause(s, key, rc, backoff, h.remaining_ms, (uint64_t)left, cancel))
            return acquire_failed(s, rc == LEASE_ESTORE
                                         ? rc
                                         : lease__seterr(LEASE_ETIMEOUT,
                                                         "acquire '%s': the wait was cancelled",
                                                         key),
                                  start);
        backoff = backoff * 2 > backoff_max ? backoff_max : backoff * 2;
    }
}

int lease_renew(lease_grant *g, lease_store *s, uint64_t ttl_ms)
{
    return lease__renew(g, s, ttl_ms, 1);
}

int lease__renew(lease_grant *g, lease_store *s, uint64_t ttl_ms, int mark_lost)
{
    uint64_t granted = 0;
    int64_t sent;
    int rc;

    if ((rc = check_store(s)) < 0 || (rc = lease__check_grant(g)) < 0)
        return rc;
    if (ttl_ms == 0)
        ttl_ms = g->ttl_ms;
    if ((rc = lease__check_ttl(s, ttl_ms)) < 0)
        return rc;
    sent = lease_clock_ns();
    rc = s->backend->renew(&granted, s, g->key, g->owner, g->token, ttl_ms);
    if (granted == 0)
        granted = ttl_ms;
    /* An extension that arrives after its own local deadline gives no
     * authority: uncertain, like a renewal that got no answer. */
    if (rc == 0 && lease__deadline_ns(sent, granted) <= lease_clock_ns())
        rc = lease__seterr(LEASE_ESTORE, "renew '%s': the store answered after "
                           "%lld ms, past the local deadline of the %llu ms "
                           "lease", g->key,
                           (long long)((lease_clock_ns() - sent) / 1000000),
                           (unsigned long long)granted);
    lease__metric_renew(s->backend->name, rc == 0);
    if (rc < 0) {
        lease__log_state(LEASE_LOG_WARN, "renewal_failed", s->backend->name, g, lease_errmsg());
        if (rc == LEASE_ELOST && mark_lost)
            lease__history_lost(s, g);
        return rc;
    }
    g->ttl_ms = granted;
    g->deadline_ns = lease__deadline_ns(sent, g->ttl_ms);
    lease__log_state(LEASE_LOG_DEBUG, "renewed", s->backend->name, g, NULL);
    return 0;
}

int lease_release(lease_store *s, const lease_grant *g)
{
    int rc;

    if ((rc = check_store(s)) < 0 || (rc = lease__check_grant(g)) < 0)
        return rc;
    rc = s->backend->release(s, g->key, g->owner, g->token);
    if (rc == 0) {
        if (g->acquired_ns)
            lease__metric_held(s->backend->name, lease_clock_ns() - g->acquired_ns);
        lease__log_state(LEASE_LOG_INFO, "released", s->backend->name, g, NULL);
    }
    return rc;
}

/*
 * SQLite and PostgreSQL keep the owner of a lease that ran out and clear it
 * on release, so "not held, owner recorded" is EXPIRED; Redis and etcd
 * forget the owner with the lease and say EXPIRED themselves. Whatever a
 * store said, `held` decides HELD.
 */
void lease__info_state(lease_info *info)
{
    if (info->held)
        info->state = LEASE_STATE_HELD;
    else if (info->state == LEASE_STATE_EXPIRED || info->owner[0] != '\0')
        info->state = LEASE_STATE_EXPIRED;
    else
        info->state = LEASE_STATE_FREE;
}

int lease_inspect(lease_info *out, lease_store *s, const char *key)
{
    int rc;

    if (out == NULL)
        return lease__seterr(LEASE_EINVALID, "out is NULL");
    if ((rc = check_store(s)) < 0 || (rc = lease__check_name("key", key)) < 0)
        return rc;
    memset(out, 0, sizeof(*out));
    if ((rc = s->backend->inspect(out, s, key)) < 0)
        return rc;
    lease__info_state(out);
    return 0;
}

typedef struct {
    lease_info *items;
    size_t n, cap;
    size_t info_size; /* what the store's lease_info holds (see list_add) */
} list_acc;

static int list_add(const lease_info *info, void *payload)
{
    list_acc *acc = payload;

    if (acc->n == acc->cap) {
        size_t cap = acc->cap ? acc->cap * 2 : 16;
        lease_info *p = realloc(acc->items, cap * sizeof(*p));
        if (p == NULL)
            return lease__seterr(LEASE_ENOMEM, "out of memory listing keys");
        acc->items = p;
        acc->cap = cap;
    }
    /* A store built before version 3 passes a lease_info that ends before
     * `state`: copy no more than it has. */
    memset(&acc->items[acc->n], 0, sizeof(*info));
    memcpy(&acc->items[acc->n], info, acc->info_size);
    lease__info_state(&acc->items[acc->n++]);
    return 0;
}

/* Keys compare as bytes, as the stores' own order did (strcmp compares
 * unsigned chars). */
static int cmp_key(const void *a, const void *b)
{
    return strcmp(((const lease_info *)a)->key, ((const lease_info *)b)->key);
}

int lease_list(lease_info **out, size_t *count, lease_store *s,
               const char *prefix)
{
    list_acc acc = { NULL, 0, 0, sizeof(lease_info) };
    int rc;

    if (out == NULL || count == NULL)
        return lease__seterr(LEASE_EINVALID, "out or count is NULL");
    *out = NULL;
    *count = 0;
    if ((rc = check_store(s)) < 0)
        return rc;
    if (prefix == NULL)
        prefix = "";
    if (strnlen(prefix, LEASE_KEY_MAX + 1) > LEASE_KEY_MAX)
        return lease__seterr(LEASE_EINVALID, "prefix is longer than %d bytes",
                             LEASE_KEY_MAX);
    if (s->backend->version < 3)
        acc.info_size = offsetof(lease_info, state);
    rc = s->backend->list(s, prefix, list_add, &acc);
    if (rc < 0) {
        free(acc.items);
        return rc;
    }
    /* The stores walk in whatever order their keys come (a SCAN, escaped
     * names); the caller sees them in key order, once, here. */
    if (acc.n > 1)
        qsort(acc.items, acc.n, sizeof(*acc.items), cmp_key);
    *out = acc.items;
    *count = acc.n;
    return 0;
}

void lease_list_free(lease_info *list)
{
    free(list);
}

int lease_fence_advance(uint64_t *mark, lease_store *s, const char *resource,
                        uint64_t token)
{
    uint64_t m = 0;
    int rc;

    if ((rc = check_store(s)) < 0 ||
        (rc = lease__check_name("resource", resource)) < 0)
        return rc;
    if (token == 0 || token > LEASE__TOKEN_MAX)
        return lease__seterr(LEASE_EINVALID, "token must be 1 .. 2^63-1");
    rc = s->backend->fence_advance(&m, s, resource, token);
    if (mark && (rc == 0 || rc == LEASE_ESTALE))
        *mark = m;
    if (rc == LEASE_ESTALE) {
        lease_grant fenced;

        memset(&fenced, 0, sizeof(fenced));
        lease__strlcpy(fenced.key, resource, sizeof(fenced.key));
        fenced.token = token;
        lease__metric_fenced(s->backend->name);
        rc = lease__seterr(rc, "'%s' rejected token %llu: it has seen %llu",
                           resource, (unsigned long long)token,
                           (unsigned long long)m);
        lease__log_state(LEASE_LOG_WARN, "fenced", s->backend->name, &fenced, lease_errmsg());
    }
    return rc;
}

int lease_fence_mark(uint64_t *mark, lease_store *s, const char *resource)
{
    int rc;

    if (mark == NULL)
        return lease__seterr(LEASE_EINVALID, "mark is NULL");
    if ((rc = check_store(s)) < 0 ||
        (rc = lease__check_name("resource", resource)) < 0)
        return rc;
    return s->backend->fence_mark(mark, s, resource);
}

int lease_fence_install(lease_store *s, const char *kit, size_t len)
{
    char *copy;
    int rc;

    if ((rc = check_store(s)) < 0)
        return rc;
    if (kit == NULL || len == 0 || len > LEASE_KIT_MAX)
        return lease__seterr(LEASE_EINVALID, "kit must be 1 .. %u bytes",
                             LEASE_KIT_MAX);
    /* A NUL inside would be cut off by the store's client library: the
     * server would install a prefix of what the caller gave. */
    if (memchr(kit, '\0', len) != NULL)
        return lease__seterr(LEASE_EINVALID, "kit holds a NUL byte");
    /* The slot exists only in a table of version 5 or later. */
    if (s->backend->version < 5 || s->backend->install_kit == NULL)
        return lease__seterr(LEASE_EUNSUPPORTED,
                             "store '%s' has no fencing kit to install",
                             s->backend->name);
    /* A NUL-terminated copy: the caller's bytes need not be, and a client
     * library that takes a C string (libpq) must not read past them. */
    if ((copy = malloc(len + 1)) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    memcpy(copy, kit, len);
    copy[len] = '\0';
    rc = s->backend->install_kit(s, copy, len);
    free(copy);
    return rc;
}

int lease_guarded_put(lease_store *s, const lease_grant *g, const char *name,
                      const void *value, size_t len)
{
    int rc;

    if ((rc = check_store(s)) < 0 || (rc = lease__check_grant(g)) < 0 ||
        (rc = lease__check_name("data name", name)) < 0)
        return rc;
    if (value == NULL && len > 0)
        return lease__seterr(LEASE_EINVALID, "value is NULL");
    if (len > LEASE__VALUE_MAX)
        return lease__seterr(LEASE_EINVALID, "value is larger than %zu MiB",
                             LEASE__VALUE_MAX >> 20);
    return s->backend->guarded_put(s, g->key, g->owner, g->token, name,
                                   value ? value : "", len);
}

int lease_data_get(void **value, size_t *len, uint64_t *token, lease_store *s,
                   const char *name)
{
    int rc;

    if (value == NULL || len == NULL)
        return lease__seterr(LEASE_EINVALID, "value or len is NULL");
    *value = NULL;
    *len = 0;
    if ((rc = check_store(s)) < 0 ||
        (rc = lease__check_name("data name", name)) < 0)
        return rc;
    return s->backend->data_get(value, len, token, s, name);
}

int lease_guarded_txn(lease_store *s, const lease_grant *g, lease_txn_cb cb,
                      void *payload)
{
    int rc;

    if ((rc = check_store(s)) < 0 || (rc = lease__check_grant(g)) < 0)
        return rc;
    if (cb == NULL)
        return lease__seterr(LEASE_EINVALID, "callback is NULL");
    if (s->backend->guarded_txn == NULL)
        return lease__seterr(LEASE_EUNSUPPORTED,
                             "the %s store has no transactions for your own "
                             "statements; use lease_guarded_put",
                             s->backend->name);
    return s->backend->guarded_txn(s, g->key, g->owner, g->token, cb, payload);
}

int64_t lease_advisory_key(const char *key)
{
    uint64_t h = 0xcbf29ce484222325ULL;

    if (key == NULL)
        return 0;
    for (; *key; key++) {
        h ^= (unsigned char)*key;
        h *= 0x100000001b3ULL;
    }
    return (int64_t)h;
}

int lease_advisory_txn(lease_store *s, const char *key, int try_only,
                       lease_txn_cb cb, void *payload)
{
    int rc;

    if ((rc = check_store(s)) < 0 || (rc = lease__check_name("key", key)) < 0)
        return rc;
    if (cb == NULL)
        return lease__seterr(LEASE_EINVALID, "callback is NULL");
    if (s->backend->advisory_txn == NULL)
        return lease__seterr(LEASE_EUNSUPPORTED,
                             "the %s store has no advisory locks", s->backend->name);
    return s->backend->advisory_txn(s, lease_advisory_key(key), try_only != 0,
                                    cb, payload);
}
