/*
 * lease_int.h - what the core's files and the in-tree stores share.
 * Names with a double underscore (lease__) are internal and may change.
 */
#ifndef LEASE_INT_H
#define LEASE_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "lease.h"
#include "lease/sys/store.h"
#include "lease_config.h" /* generated: LEASE_WITH_<STORE> */

/* The greatest token any store keeps (PostgreSQL's bigint, SQLite's int). */
#define LEASE__TOKEN_MAX ((uint64_t)INT64_MAX)
#define LEASE__TIMEOUT_DEFAULT_MS 5000u
/* The largest value lease_guarded_put takes (checked by the core only;
 * the stores size their answer limits by it). */
#define LEASE__VALUE_MAX ((size_t)64 << 20)

/* core/error.c; the message is long enough for a key, a label, an owner and a
 * store's own message. */
#define LEASE__ERRMSG_SIZE 1024
#define lease__seterr lease_store_seterr
/* LEASE_ELOST for (key, token), said the same way by every store:
 * "<what> '<key>': token N of this owner is no longer the unexpired
 * lease<tail>" (what and tail may be NULL). */
int lease__not_holder(const char *what, const char *key, uint64_t token,
                      const char *tail);

/* util/util.c */
int64_t lease__mono_ns(void);           /* CLOCK_MONOTONIC, for condvars */
void lease__sleep_ns(int64_t ns);
/* Wait up to ms for a cancel handle to be fired: 1 if it was (core/cancel.c). */
int lease__cancel_wait(const lease_cancel *c, uint64_t ms);
/* Wait on cv (made with CLOCK_MONOTONIC), mu held, until `until` on
 * lease_clock_ns: pthread_cond_timedwait's answer (0 on a wake-up, which
 * may be spurious: the caller re-checks). Condition variables only take
 * CLOCK_MONOTONIC, so the BOOTTIME target becomes a relative wait; a
 * suspend makes it longer, and the caller's deadline check after it
 * catches what it missed. */
int lease__cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until);
uint64_t lease__random_u64(void);       /* for jitter; not for identities */
int lease__check_name(const char *what, const char *name);
int lease__check_ttl(const lease_store *store, uint64_t ttl_ms);
/* The longest wait or call timeout a caller may ask for: 24 h. */
#define LEASE__WAIT_MAX_MS (24ULL * 3600 * 1000)
/* core/lease.c: owner (made canonical), ttl and label of an acquisition. */
int lease__check_holder(char owner[LEASE_OWNER_BUFSZ], const lease_store *s,
                        const char *owner_in, uint64_t ttl_ms, const char *label);
int lease__canonical_owner(char out[LEASE_OWNER_BUFSZ], const char *owner);
void lease__strlcpy(char *dst, const char *src, size_t size);
/* Wipe a string that held a secret (a password, a token, a URL or a header
 * with one in it), then free it; NULL is a no-op. explicit_bzero: a memset
 * right before free is a dead store the compiler may drop. */
void lease__free_secret(char *s);
/* ?password_file=PATH: the file's password into *out (malloc'ed), held in
 * the secrets registry; the caller gives it back with
 * lease__secret_release() before freeing it. `store` names the store in
 * messages. A file the group or others may read or write, or a *out that
 * already holds the URL's password, is EINVALID. */
int lease__read_password_file(char **out, const char *store, const char *path);
/* The local deadline: sent_ns + ttl - margin for clock-rate drift. */
int64_t lease__deadline_ns(int64_t sent_ns, uint64_t ttl_ms);

/* util/net.c: for stores whose client library would resolve or connect
 * without a bound. Both end by `end` (lease_clock_ns) as a whole, the name
 * lookup included (on a thread of its own, left behind at `end`), and set
 * the message ("cannot connect to STORE URL: ...", LEASE_ESTORE) on failure.
 * lease__net_resolve: host's addresses for port (*out: lease__net_free()); a
 * numeric address needs no lookup. lease__net_connect: a TCP socket
 * connected to the first address that answers, close-on-exec and
 * non-blocking from socket() on, with TCP_NODELAY. */
struct addrinfo;
int lease__net_resolve(struct addrinfo **out, const lease_store *s, const char *host,
                       int port, int64_t end);
void lease__net_free(struct addrinfo *addrs);
int lease__net_connect(int *fd, const lease_store *s, const char *host, int port,
                       int64_t end);
/* A name of a store's URL looked up by lease__net_resolve for a client
 * library that takes addresses as libcurl's CURLOPT_RESOLVE does, so that
 * the library looks up no name itself: lease__net_name_entry sets *entry
 * to "host:port:addr[,addr...]" for authority ("host:port"; owned by n,
 * valid until the next call on n), or NULL for a numeric address (nothing
 * to look up). Looked up again each minute, within `end`; the addresses
 * it had serve while the resolver is slow or silent (net.c says how). */
typedef struct lease__net_name {
    char *entry;
    int64_t fresh_until;
} lease__net_name;
int lease__net_name_entry(const char **entry, lease__net_name *n, const lease_store *s,
                          const char *authority, int64_t end);
void lease__net_name_clear(lease__net_name *n);

/* util/url.c: URLs of the form scheme:[//[user[:password]@]hosts][path][?query] */
typedef struct lease__url_param {
    char *name;
    char *value;
} lease__url_kv;

typedef struct lease__url {
    char *scheme;       /* lower-cased */
    int has_authority;  /* "//" was present */
    char *user;         /* decoded, NULL if absent */
    char *password;     /* decoded, NULL if absent */
    char *hosts;        /* raw "host:port[,host:port]", "" if absent */
    char *path;         /* decoded; "/x/y" or, without authority, "x/y" */
    lease__url_kv *params;
    size_t nparams;
} lease__url;

int lease__url_parse(lease__url *out, const char *text);
void lease__url_free(lease__url *url);
const char *lease__url_param(const lease__url *url, const char *name);
/* ?tokens=clock|counter (default clock); EINVALID for another value. */
enum { LEASE__TOKENS_CLOCK = 0, LEASE__TOKENS_COUNTER = 1 };
int lease__url_tokens(int *mode, const lease__url *url);
int lease__url_tokens_refused(const char *why);
/* A copy of `text` with the password replaced by "***" (malloc'ed). */
char *lease__url_redact(const char *text);
/* The scheme of `text`, lower-cased, into buf; EINVALID if none. */
int lease__url_scheme(char *buf, size_t size, const char *text);
/* The value of one hex digit (either case), -1 for any other byte: for
 * %XX escapes here and the hex-escaped names of the PostgreSQL store. */
int lease__hexval(int c);

/* secrets (util/url.c, core/error.c) */
/* Called once per string of a store URL that may be a secret (the user
 * info's password as written, decoded and re-encoded, its pieces, and
 * the values of secret query parameters); non-zero stops the walk. */
typedef int (*lease__secret_fn)(const char *secret, void *arg);
int lease__url_secrets(const char *text, lease__secret_fn fn, void *arg);
/* Whether a query parameter of this (decoded) name carries a secret. */
int lease__url_secret_param(const char *name);
/* A process-wide registry of the secrets of every open store's URL,
 * refcounted per string: lease_store_open holds them before the store's
 * open runs (so libpq's, hiredis' and libcurl's messages are covered) and
 * lease_store_close releases them. */
int lease__secrets_hold(const char *url);
void lease__secrets_release(const char *url);
/* One secret that is not in the URL (a password read from a file):
 * held and released by the store that read it, as the URL's are. */
int lease__secret_hold(const char *secret);
void lease__secret_release(const char *secret);
/* Replace every registered secret in buf, in place; never makes it
 * longer. lease_store_seterr does this to every message it keeps. */
void lease__scrub(char *buf);

/* core/lease.c: the one meaning of info->state, from held, owner and what
 * the store said (see inspect in lease/sys/store.h). */
void lease__info_state(lease_info *info);
/* core/lease.c: key, owner and token of a grant given back by the caller. */
int lease__check_grant(const lease_grant *g);
/* lease_renew; with mark_lost 0 a refusal is not written to the history,
 * for a caller that must act on it first (the keeper). */
int lease__renew(lease_grant *g, lease_store *s, uint64_t ttl_ms, int mark_lost);

/* core/history.c: after a renew refused with LEASE_ELOST (keeps the error). */
void lease__history_lost(lease_store *store, const lease_grant *grant);

/* core/store.c: a clock-floored grant took last token + 1 because the
 * store's clock was behind it by behind_us (> 1 s): log and count. */
void lease__clock_behind(const char *store, const lease_request *req, uint64_t token,
                         uint64_t behind_us);

/* core/log.c */
int lease__log_enabled(lease_log_level level);
void lease__log(lease_log_level level, const char *event, const char *store,
                const char *message);

/* State changes, as one log line each, with what identifies the lease:
 * key, owner, holder label, token and store. `detail` may be NULL. */
void lease__log_state(lease_log_level level, const char *event,
                      const char *store, const lease_grant *grant,
                      const char *detail);

/* core/metrics.c */
void lease__metric_acquire(const char *store, int rc, int64_t wait_ns);
void lease__metric_renew(const char *store, int ok);
void lease__metric_loss(const char *store, int uncertain);
void lease__metric_held(const char *store, int64_t held_ns);
void lease__metric_leader(const char *store);
void lease__metric_fenced(const char *store);
void lease__metric_clock_behind(const char *store);

/* core/store.c */
const lease_backend *lease__backend_for(const char *scheme);
/* What lease_backend_register checks (the built-in tables pass it too:
 * tests/unit/test_backend.c). */
int lease__backend_check(const lease_backend *backend);

/*
 * The stores this project has, whether or not this build has them: the one
 * list behind the backend table, the message for a scheme this build lacks,
 * the metrics' store labels and lease_store_builtin(). A store whose library
 * was not found at configure time (LEASE_WITH_<STORE>) has backend NULL.
 *
 * In liblease.so (LEASE_STORE_MODULES) PostgreSQL, Redis, etcd and
 * Kubernetes are modules, loaded on first use so that a program on SQLite never maps
 * libpq, hiredis or libcurl: their entry has `module` (the file name) and
 * `backend` points at lease__module_placeholder, a table with no slots that
 * only says "in this build"; only core/store.c reads `backend` as a table,
 * and it swaps the module's own in (lease__backend_for). In liblease.a
 * every store is built in and `module` is NULL.
 */
typedef struct lease__store_entry {
    const char *name;             /* "postgres": metrics label, --version */
    const char *const *schemes;   /* URL schemes, NULL-terminated */
    const lease_backend *backend; /* NULL: not in this build */
    /* "libpq 15.8": the client library as linked at run time (NULL for a
     * module: the module's own). */
    int (*client_version)(char *buf, size_t size);
    const char *module;           /* "liblease-store-postgres.so", or NULL */
} lease__store_entry;

extern const lease_backend lease__module_placeholder;

/*
 * A store module's one export (src/stores/store_module.c): dlsym'ed by
 * core/store.c, which refuses a module of another ABI or another liblease
 * version (a module calls lease__ internals, exported under the private
 * version node LEASE_PRIVATE of src/liblease.map, which are no API and
 * change between any two versions).
 */
#define LEASE__MODULE_ABI 1
#define LEASE__MODULE_ENTRY "lease__store_module_entry"
typedef struct lease__store_module {
    int abi;                      /* LEASE__MODULE_ABI */
    const char *lease_version;    /* LEASE_VERSION_STRING it was built with */
    const char *name;             /* the store's name in lease__stores */
    const lease_backend *backend;
    int (*client_version)(char *buf, size_t size);
} lease__store_module;
typedef const lease__store_module *(*lease__store_module_fn)(void);
const lease__store_module *lease__store_module_entry(void);

#define LEASE__NSTORES 5
extern const char *const lease__sqlite_schemes[];
extern const char *const lease__pg_schemes[];
extern const char *const lease__redis_schemes[];
extern const char *const lease__etcd_schemes[];
extern const char *const lease__kubernetes_schemes[];
extern const lease__store_entry lease__stores[LEASE__NSTORES];

/* Built-in stores, each compiled only when its library was found. */
extern const lease_backend lease__sqlite_backend;
int lease__sqlite_client_version(char *buf, size_t size);
#if LEASE_WITH_POSTGRES
extern const lease_backend lease__pg_backend;
int lease__pg_client_version(char *buf, size_t size);
#endif
#if LEASE_WITH_REDIS
extern const lease_backend lease__redis_backend;
int lease__redis_client_version(char *buf, size_t size);
#endif
#if LEASE_WITH_ETCD
extern const lease_backend lease__etcd_backend;
int lease__etcd_client_version(char *buf, size_t size);
#endif
#if LEASE_WITH_KUBERNETES
extern const lease_backend lease__kubernetes_backend;
int lease__kubernetes_client_version(char *buf, size_t size);
#endif

#endif
