/*
 * stores/kubernetes/kubernetes.c - Kubernetes Lease objects (coordination.k8s.io/v1),
 * through the API server's REST interface (libcurl + jansson, store_http).
 *
 * URL: kubernetes://HOST:PORT/NAMESPACE[?token_file=PATH&cacert=PATH]  (HTTPS)
 *      kubernetes:///NAMESPACE       in a pod: KUBERNETES_SERVICE_HOST/PORT
 *      kubernetes+http://HOST:PORT/NAMESPACE?token_file=PATH
 *                                    plain HTTP: loopback and tests only
 *   token_file defaults to the service account's (below), cacert too
 *   (HTTPS only); max_skew=SECONDS (0..3600, default 2): see Expiry;
 *   tokens=clock|counter (default clock): see kube_next_token.
 * The bearer token is read from the file at open, and once more when the
 * server answers 401 (projected service-account tokens rotate); it is held
 * in the secrets registry like a password, and sent in a header only.
 *
 * One Lease object per key. A key that is a DNS-1123 subdomain and does not
 * start with "liblease-" is the object's name; any other key is
 * "liblease-k-<readable part>-<24 hex: the first 96 bits of its SHA-256>"
 * (kube_hashed_name: libcrypto).
 * Annotations (values percent-encoded where a byte is not printable ASCII):
 *   liblease/key      the exact key, checked on every read (two keys never
 *                     share an object: a mismatch is LEASE_ESTORE)
 *   liblease/token    the fencing counter: +1 in the same CAS write (a PUT
 *                     with the resourceVersion read, or the POST that
 *                     creates the object) that gives the lease a new holder,
 *                     kept on release
 *   liblease/label    the holder's label
 *   liblease/history  the last LEASE_HISTORY_KEEP grants, a JSON array
 *                     written in the same CAS write as acquire and release
 * spec: holderIdentity (the owner; absent once released), leaseDurationSeconds
 * (the ttl rounded up to whole seconds, reported as granted), acquireTime and
 * renewTime (MicroTime, this client's wall clock, as client-go writes them),
 * leaseTransitions (+1 on every change of holder).
 * Fencing marks live in objects of their own, "liblease-f-<part>-<hash>",
 * with annotations liblease/resource and liblease/mark.
 *
 * Answers are input: at most 4 MiB (a watch event, a line), decoded within
 * the budget of json_budget.h (what jansson would hold, counted before it
 * is parsed) and the call's deadline; times are strict RFC 3339; a list's
 * continue token is never one given before (kube_list_next).
 *
 * Expiry: renewTime is written with the holder's clock, so it alone cannot
 * end a lease. What a handle compares is the holder's record: holderIdentity,
 * leaseDurationSeconds, acquireTime, renewTime, leaseTransitions and our
 * token (client-go compares its observed record too), never the
 * resourceVersion, which any write moves (a history mark, a label). A
 * candidate takes over a held lease when either
 *  (a) this handle has seen the same record unchanged for
 *      leaseDurationSeconds on its own monotonic clock (client-go's rule), or
 *  (b) the API server's clock (the Date header, 1 s resolution) is past
 *      renewTime + leaseDurationSeconds + max_skew + 1 s, which trusts the
 *      holder's clock to be within max_skew of the server's (NTP-synced
 *      nodes), and this handle has also seen the record unchanged for half
 *      the duration, and has never seen this holder renew with a renewTime
 *      already past (b) (kube_skew_seen: its clock is behind, and (a) alone
 *      decides from then on); max_skew=0 turns (b) off.
 * (b) only shortens a wait, from the duration to half of it: a holder that
 * renews at least every half duration (liblease every third, client-go every
 * RetryPeriod, 2 s of 15 by default) is seen renewing before (b) can fire,
 * whatever its clock says, and one seen renewing is held to (a). Only a
 * holder that renews less often than that and whose clock is off by more
 * than max_skew can be taken over while it lives.
 * inspect reports by (a) and by (b)'s clock test alone: what it says grants
 * nothing, and a fresh process (every `lease show`) would otherwise report
 * a lease dead for hours as held. docs/stores.md explains.
 *
 * The holder's side (renew, the same owner's acquire) must prove its lease
 * alive instead (kube_holder_alive): the record holds the holderIdentity,
 * token, renewTime and duration this process wrote less than a duration ago
 * (half of one when (b)'s clock test holds), or the server's clock vouches
 * for renewTime. Other fields and annotations may change meanwhile: no
 * write that leaves those four alone costs the holder its lease. A renewal
 * that can neither prove the lease alive nor see it ended by (b)'s clock
 * test is LEASE_ESTORE and writes nothing (kube_read_held).
 *
 * Every write carries the resourceVersion it read: 409 Conflict means
 * another writer came first, and the operation reads again and decides
 * again (bounded), never writes blindly. guarded_put and data_get are
 * LEASE_EUNSUPPORTED: Kubernetes has no write across two objects, so a
 * value named apart from the key cannot be written atomically with the
 * lease check.
 */
#define _GNU_SOURCE /* timegm */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>
#include <openssl/evp.h>

#include "stores/json_budget.h"
#include "stores/store_int.h"
#include "stores/store_http.h"

#define SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount/"
#define GROUP_PATH "/apis/coordination.k8s.io/v1"
#define NAME_MAX_K 253
#define RV_MAX 64
#define TOKEN_FILE_MAX 65536
#define SEEN_SLOTS 128
#define CAS_TRIES 4
#define LIST_PAGE 500
#define ANSWER_MAX ((size_t)4 << 20)
/* The largest granted ttl, in s, so that ms stay within LEASE__MS_MAX. */
#define DURATION_MAX ((int64_t)(LEASE__MS_MAX / 1000))

/* kube_call's answers besides 0 and the LEASE_E* codes. */
enum { KUBE_NOTFOUND = 1, KUBE_CONFLICT = 2 };

/* A holder's record, what a renewal changes (Expiry): absent fields are
 * INT64_MIN; the holder as a hash (a new holder writes new times too). */
typedef struct {
    uint64_t holder_h;
    uint64_t token;
    int64_t duration_s, acquire_us, renew_us, transitions;
} kube_record;

/* The record this handle saw for an object, and since when (rule (a) of
 * Expiry); whether it saw this holder's record change (a renewal), and
 * whether such a renewal already failed rule (b)'s clock test (skewed).
 * One slot per hash bucket: an evicted entry only restarts the
 * observation, which errs on the side of waiting. */
typedef struct {
    char name[NAME_MAX_K + 1];
    kube_record rec;
    int64_t first_ns;
    int renewed, skewed;
} seen_rec;

/* The record this process wrote itself, and when that write was sent
 * (kube_holder_alive): one per object it holds, in a hash table that
 * grows with them (a session may hold thousands). Process-wide, not per
 * handle: a keeper renews on a handle of its own what another acquired.
 * Named "<base>/<namespace>/<object>". */
typedef struct written_rec {
    struct written_rec *next;
    kube_record rec;
    int64_t sent_ns;
    char name[];
} written_rec;

typedef struct {
    lease_store parent;
    lease__http *http;
    char *base;         /* "https://host:port" */
    char *token_file;   /* NULL: no Authorization header (kubernetes+http) */
    char *token;        /* held with lease__secret_hold */
    char *cacert;
    char ns[64];
    int max_skew_s;
    int tokens;         /* LEASE__TOKENS_CLOCK or _COUNTER (?tokens=) */
    int64_t end_ns;     /* the current operation's deadline */
    seen_rec seen[SEEN_SLOTS];
} kube_store;

/* One Lease object as read, checked. Pointers borrow from obj. */
typedef struct {
    json_t *obj;        /* owned */
    char rv[RV_MAX + 1];
    int has_key;
    char key[LEASE_KEY_MAX + 1];
    uint64_t token;
    const char *holder; /* "" when none */
    char label[LEASE_LABEL_MAX + 1];
    int64_t duration_s; /* 0: absent */
    int has_renew, has_acquire;
    int64_t renew_us;   /* Unix µs */
    int64_t acquire_us; /* Unix µs */
    int64_t transitions;
    int64_t date_s;     /* the answer's Date, -1 without */
} kube_lease;

#define kube_malformed(what, ...) \
    lease__seterr(LEASE_ESTORE, "kubernetes " what ": malformed answer: " __VA_ARGS__)

/* ---- names ------------------------------------------------------------- */

static int kube_alnum(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

/* A DNS-1123 label (namespaces): [a-z0-9-], alnum at both ends, <= 63. */
static int kube_dns_label(const char *p, size_t n)
{
    size_t i;

    if (n == 0 || n > 63 || !kube_alnum(p[0]) || !kube_alnum(p[n - 1]))
        return 0;
    for (i = 0; i < n; i++)
        if (!kube_alnum(p[i]) && p[i] != '-')
            return 0;
    return 1;
}

/* A DNS-1123 subdomain (object names): dot-separated labels, <= 253. */
static int kube_dns_subdomain(const char *p)
{
    size_t n = strlen(p), i = 0;

    if (n == 0 || n > NAME_MAX_K)
        return 0;
    while (i <= n) {
        size_t len = strcspn(p + i, ".");

        if (!kube_dns_label(p + i, len))
            return 0;
        i += len + 1;
    }
    return 1;
}

static uint64_t kube_fnv64(const char *p)
{
    uint64_t h = 0xcbf29ce484222325ULL;

    for (; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ULL;
    return h;
}

/* "<prefix><readable part>-<hash>": the readable part keeps [a-z0-9] of
 * the text (upper case folded), other runs become one '-', 40 at most;
 * the hash is the first 96 bits of the text's SHA-256, in 24 hex digits:
 * no one can make a key whose name is another's (FNV-1a, which it was,
 * let a crafted key take a victim's object, which the liblease/key check
 * then refused to the victim). 0, or LEASE_ESTORE when libcrypto cannot
 * hash (out of memory, a provider missing). */
static int kube_hashed_name(char out[NAME_MAX_K + 1], const char *prefix, const char *text)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0, i;
    char part[41], hex[25];
    size_t n = 0;
    const char *p;

    if (EVP_Digest(text, strlen(text), md, &md_len, EVP_sha256(), NULL) != 1 || md_len < 12)
        return lease__seterr(LEASE_ESTORE, "kubernetes: cannot hash '%.255s' into an object "
                             "name (libcrypto's SHA-256 failed)", text);
    for (i = 0; i < 12; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    for (p = text; *p && n < sizeof(part) - 1; p++) {
        int c = tolower((unsigned char)*p);

        if (kube_alnum(c))
            part[n++] = (char)c;
        else if (n > 0 && part[n - 1] != '-')
            part[n++] = '-';
    }
    while (n > 0 && part[n - 1] == '-')
        n--;
    part[n] = '\0';
    snprintf(out, NAME_MAX_K + 1, "%s%s%s%s", prefix, part, n ? "-" : "", hex);
    return 0;
}

/* A key's object name: the key itself when it is a DNS-1123 subdomain not
 * starting with "liblease-", else hashed (kube_hashed_name). */
static int kube_key_name(char out[NAME_MAX_K + 1], const char *key)
{
    if (kube_dns_subdomain(key) && strncmp(key, "liblease-", 9) != 0) {
        lease__strlcpy(out, key, NAME_MAX_K + 1);
        return 0;
    }
    return kube_hashed_name(out, "liblease-k-", key);
}

/* ---- text -------------------------------------------------------------- */

/* Annotation values are JSON strings, which must be UTF-8: a key or label
 * (any byte but NUL) is kept with every byte outside printable ASCII, and
 * '%', as %XX. NULL when out of memory. */
static char *kube_encode(const char *in)
{
    size_t n = strlen(in), i, o = 0;
    char *out = malloc(n * 3 + 1);

    for (i = 0; out && i < n; i++) {
        unsigned char c = (unsigned char)in[i];

        if (c > ' ' && c < 127 && c != '%')
            out[o++] = (char)c;
        else
            o += (size_t)sprintf(out + o, "%%%02X", c);
    }
    if (out)
        out[o] = '\0';
    return out;
}

/* The inverse, into out[size]; -1 for bad escapes, a NUL or too long. */
static int kube_decode(char *out, size_t size, const char *in)
{
    size_t o = 0;

    for (; *in; in++) {
        int c = (unsigned char)*in;

        if (c == '%') {
            int hi = lease__hexval(in[1]), lo = hi < 0 ? -1 : lease__hexval(in[2]);

            if (lo < 0 || (c = hi * 16 + lo) == 0)
                return -1;
            in += 2;
        }
        if (o + 1 >= size)
            return -1;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return 0;
}

/* Digits only, 1 .. LEASE__TOKEN_MAX. */
static int kube_parse_token(uint64_t *out, const char *t)
{
    uint64_t v = 0;
    size_t i;

    if (t == NULL || *t == '\0' || strlen(t) > 19)
        return -1;
    for (i = 0; t[i]; i++) {
        if (t[i] < '0' || t[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(t[i] - '0');
    }
    if (!lease__token_ok(v))
        return -1;
    *out = v;
    return 0;
}

static int64_t kube_wall_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* MicroTime, as client-go writes it: "2026-12-01T03:04:05.123456Z". */
static void kube_microtime(char out[64], int64_t us)
{
    time_t sec = (time_t)(us / 1000000);
    struct tm tm;

    gmtime_r(&sec, &tm);
    snprintf(out, 64, "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (int)(us % 1000000));
}

/* The n digits at t as a number in lo .. hi; -1 for anything else (a
 * sign, a space: sscanf's %d would take "-1"). t holds n characters. */
static int kube_digits(const char *t, int n, int lo, int hi)
{
    int v = 0, i;

    for (i = 0; i < n; i++) {
        if (t[i] < '0' || t[i] > '9')
            return -1;
        v = v * 10 + (t[i] - '0');
    }
    return v >= lo && v <= hi ? v : -1;
}

/* RFC 3339, "YYYY-MM-DDTHH:MM:SS[.fraction](Z|+hh:mm|-hh:mm)", digits
 * only where it has digits, each field in its range (second 60: a leap
 * second); -1 if not. */
static int kube_parse_time(int64_t *us, const char *t)
{
    struct tm tm;
    int y, mo, d, h, mi, s, oh = 0, om = 0, sign = 0;
    int64_t frac = 0, scale = 1000000;
    const char *p;

    memset(&tm, 0, sizeof(tm));
    if (t == NULL || strlen(t) < 20 || strlen(t) > 40 || t[4] != '-' || t[7] != '-' ||
        t[10] != 'T' || t[13] != ':' || t[16] != ':' ||
        (y = kube_digits(t, 4, 1970, 9999)) < 0 || (mo = kube_digits(t + 5, 2, 1, 12)) < 0 ||
        (d = kube_digits(t + 8, 2, 1, 31)) < 0 || (h = kube_digits(t + 11, 2, 0, 23)) < 0 ||
        (mi = kube_digits(t + 14, 2, 0, 59)) < 0 || (s = kube_digits(t + 17, 2, 0, 60)) < 0)
        return -1;
    p = t + 19;
    if (*p == '.') {
        if (p[1] < '0' || p[1] > '9')
            return -1; /* a fraction has a digit at least */
        for (p++; *p >= '0' && *p <= '9'; p++)
            if (scale > 1)
                frac += (*p - '0') * (scale /= 10);
    }
    if (*p == 'Z' && p[1] == '\0')
        sign = 0;
    else if ((*p == '+' || *p == '-') && strlen(p) == 6 && p[3] == ':' &&
             (oh = kube_digits(p + 1, 2, 0, 23)) >= 0 && (om = kube_digits(p + 4, 2, 0, 59)) >= 0)
        sign = *p == '+' ? 1 : -1;
    else
        return -1;
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = s;
    *us = ((int64_t)timegm(&tm) - sign * (oh * 3600 + om * 60)) * 1000000 + frac;
    return 0;
}

/* ---- requests ---------------------------------------------------------- */

static void kube_begin(kube_store *s)
{
    s->end_ns = lease_clock_ns() + (int64_t)s->parent.timeout_ms * 1000000;
}

static void kube_token_drop(kube_store *s)
{
    if (s->token) {
        lease__secret_release(s->token);
        lease__free_secret(s->token);
        s->token = NULL;
    }
}

/* Read the bearer token from s->token_file: printable ASCII, trailing
 * white space dropped. EINVALID (a configuration error) when the file is
 * missing, unreadable, not a regular file, empty or not a token. Opened
 * without blocking and refused unless it is a regular file: a FIFO (or a
 * device) would block the open or the read past any timeout. */
static int kube_token_read(kube_store *s)
{
    char *buf = malloc(TOKEN_FILE_MAX + 1);
    int fd = open(s->token_file, O_RDONLY | O_NONBLOCK | O_CLOEXEC), err = errno;
    ssize_t got = 0, r = 0;
    struct stat st;
    size_t i;

    if (buf == NULL) {
        if (fd >= 0)
            close(fd);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        free(buf);
        return lease__seterr(LEASE_EINVALID, "kubernetes: the token file '%.200s' is not "
                             "a regular file", s->token_file);
    }
    while (fd >= 0 && got < TOKEN_FILE_MAX &&
           (r = read(fd, buf + got, (size_t)(TOKEN_FILE_MAX - got))) > 0)
        got += r;
    if (fd >= 0) {
        err = errno;
        close(fd);
    }
    if (fd < 0 || r < 0) {
        free(buf);
        return lease__seterr(LEASE_EINVALID, "kubernetes: cannot read the token file "
                             "'%.200s': %s", s->token_file, strerror(err));
    }
    while (got > 0 && isspace((unsigned char)buf[got - 1]))
        got--;
    buf[got] = '\0';
    for (i = 0; i < (size_t)got && buf[i] > ' ' && buf[i] < 127; i++)
        ;
    if (got == 0 || got >= TOKEN_FILE_MAX || i != (size_t)got) {
        memset(buf, 0, (size_t)got);
        free(buf);
        return lease__seterr(LEASE_EINVALID, "kubernetes: the token file '%.200s' is "
                             "empty, too large or not one printable token", s->token_file);
    }
    kube_token_drop(s);
    s->token = buf;
    if (lease__secret_hold(buf) < 0) {
        memset(buf, 0, (size_t)got);
        free(buf);
        s->token = NULL;
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    return 0;
}

/* The server's message of a failed answer (a metav1 Status), cut short;
 * withheld if it repeats the token. */
static const char *kube_status_message(const kube_store *s, json_t *j)
{
    const char *msg = json_string_value(json_object_get(j, "message"));

    if (msg && s->token && strstr(msg, s->token))
        return "(the server's message is withheld: it holds the token)";
    return msg ? msg : "";
}

/* What a status other than 2xx, 404 and 409 means to the user. */
static int kube_refused(kube_store *s, long status, json_t *j, const char *what)
{
    const char *url = s->parent.url_redacted, *msg = kube_status_message(s, j);

    if (status == 401)
        return lease__seterr(LEASE_ESTORE, "kubernetes %s on %s: unauthorized (HTTP 401): "
                             "the bearer token was refused; check token_file", what, url);
    if (status == 403)
        return lease__seterr(LEASE_ESTORE, "kubernetes %s on %s: forbidden (RBAC: the "
                             "service account needs get/list/watch/create/update on "
                             "leases.coordination.k8s.io in namespace %s): %.200s",
                             what, url, s->ns, msg);
    return lease__seterr(LEASE_ESTORE, "kubernetes %s on %s: HTTP %ld%s%.200s", what, url,
                         status, *msg ? ": " : "", msg);
}

/* A 429: wait as asked (1 s without Retry-After) when the call's deadline
 * leaves room for it, else the error. 1: sent again. */
static int kube_throttled(kube_store *s, const lease__http_answer *a, const char *what)
{
    int64_t wait_ns = (a->retry_after_s >= 0 ? a->retry_after_s : 1) * 1000000000LL;

    /* "Retry-After: 0" is no reason to send back to back until the
     * deadline: a tenth of a second at least. */
    if (wait_ns < 100000000)
        wait_ns = 100000000;

    if (lease_clock_ns() + wait_ns < s->end_ns) {
        lease__sleep_ns(wait_ns);
        return 1;
    }
    return lease__seterr(LEASE_ETIMEOUT, "kubernetes %s on %s: too many requests (HTTP "
                         "429): the server asks to retry after %ld s, past the call's "
                         "timeout", what, s->parent.url_redacted,
                         a->retry_after_s >= 0 ? a->retry_after_s : 1L);
}

/* One request, with its 401 (token re-read once: projected tokens rotate;
 * a 401 is refused before anything is applied) and 429 retries. */
static int kube_exchange(lease__http_answer *a, kube_store *s, const char *method,
                         const char *path, const char *payload, const char *ctype,
                         const char *what, lease__http_line_fn on_line, void *arg)
{
    char url[1024];
    lease__http_req r;
    int sent, rc, reread = 0;

    snprintf(url, sizeof(url), "%s%s", s->base, path);
    for (;;) {
        memset(&r, 0, sizeof(r));
        r.method = method;
        r.url = url;
        r.body = payload;
        r.body_len = payload ? strlen(payload) : 0;
        r.content_type = payload ? ctype : NULL;
        r.bearer = s->token;
        r.cacert = s->cacert;
        r.max = ANSWER_MAX;
        r.end_ns = s->end_ns;
        r.on_line = on_line;
        r.arg = arg;
        rc = lease__http_do(a, &sent, s->http, &r, "kubernetes", what,
                            s->parent.url_redacted);
        if (rc < 0 || a->stopped)
            return rc;
        if (a->status == 401 && !reread && s->token_file) {
            reread = 1;
            if (kube_token_read(s) == 0) {
                lease__http_answer_free(a);
                continue;
            }
        }
        if (a->status == 429) {
            lease__http_answer_free(a);
            if ((rc = kube_throttled(s, a, what)) == 1)
                continue;
            return rc;
        }
        return 0;
    }
}

/*
 * An answer's JSON text decoded within what it may cost (json_budget.h:
 * what jansson would hold is counted over the text before it is parsed,
 * 64 MiB and 2^20 values at most, where 4 MiB of "{}," would take 300 MB)
 * and by the deadline end_ns: 0 with *out (NULL for an empty answer or
 * one that is not JSON: the caller says what it expected), or
 * LEASE_ESTORE with why (the outcome of a write is then unknown).
 */
static int kube_json(json_t **out, const char *data, size_t len, int64_t end_ns,
                     const char *what)
{
    lease__json_budget b = lease__json_budget_of(LEASE__JSON_HOLD_ANY, len, end_ns);
    char err[160];
    int rc;

    *out = NULL;
    if (len == 0)
        return 0;
    rc = lease__json_load(out, data, len, &b, err, sizeof(err));
    if (rc == LEASE__JSON_LATE)
        return lease__seterr(LEASE_ESTORE, "kubernetes %s: timed out decoding the answer: "
                             "%s (the outcome is unknown)", what, err);
    if (rc < 0 && err[0] != '\0')
        return lease__seterr(LEASE_ESTORE, "kubernetes %s: malformed answer: %s", what, err);
    return 0;
}

/*
 * method path [body]: 0 with *out the JSON object of a 2xx answer,
 * KUBE_NOTFOUND, KUBE_CONFLICT (409: a stale resourceVersion or
 * AlreadyExists), or an error with its message. *date_s: the Date header.
 */
static int kube_call(json_t **out, int64_t *date_s, kube_store *s, const char *method,
                     const char *path, json_t *body, const char *what)
{
    char *payload = body ? json_dumps(body, JSON_COMPACT) : NULL;
    lease__http_answer a;
    json_t *j;
    int rc;

    *out = NULL;
    if (body && payload == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    rc = kube_exchange(&a, s, method, path, payload, "application/json", what, NULL, NULL);
    free(payload);
    if (rc < 0)
        return rc;
    if (date_s)
        *date_s = a.date_s;
    rc = kube_json(&j, a.data, a.len, s->end_ns, what);
    lease__http_answer_free(&a);
    if (rc < 0)
        return rc;
    if (a.status >= 200 && a.status < 300 && json_is_object(j)) {
        *out = j;
        return 0;
    }
    /* A 404 is an object's (or its namespace's) absence only when the
     * Status names what is missing: a route the server does not know yet
     * (an API server starting, an aggregator warming up) names nothing,
     * and taking it for "gone" would turn a store error into ELOST. */
    if (a.status == 404 &&
        json_is_string(json_object_get(json_object_get(j, "details"), "name")))
        rc = KUBE_NOTFOUND;
    else if (a.status == 409)
        rc = KUBE_CONFLICT;
    else if (a.status >= 200 && a.status < 300)
        rc = lease__seterr(LEASE_ESTORE, "kubernetes %s: malformed answer: not a JSON "
                           "object", what);
    else
        rc = kube_refused(s, a.status, j, what);
    json_decref(j);
    return rc;
}

static void kube_path(char *out, size_t size, const kube_store *s, const char *name)
{
    snprintf(out, size, GROUP_PATH "/namespaces/%s/leases%s%s", s->ns, name ? "/" : "",
             name ? name : "");
}

/* ---- reading a Lease --------------------------------------------------- */

static void kube_lease_free(kube_lease *l)
{
    json_decref(l->obj);
    l->obj = NULL;
}

static json_t *kube_annotations(json_t *obj)
{
    return json_object_get(json_object_get(obj, "metadata"), "annotations");
}

static const char *kube_annotation(json_t *obj, const char *name)
{
    return json_string_value(json_object_get(kube_annotations(obj), name));
}

/* metadata: the name asked for, an opaque resourceVersion of bounded
 * length, annotations an object of strings if present. */
static int kube_check_meta(char rv[RV_MAX + 1], json_t *obj, const char *name)
{
    json_t *meta = json_object_get(obj, "metadata"), *ann = json_object_get(meta, "annotations");
    const char *n = json_string_value(json_object_get(meta, "name"));
    const char *v = json_string_value(json_object_get(meta, "resourceVersion"));
    const char *k;
    json_t *x;

    if (!json_is_object(meta) || n == NULL || (name && strcmp(n, name) != 0))
        return kube_malformed("read", "metadata.name is missing or not '%.253s'",
                              name ? name : "?");
    if (v == NULL || *v == '\0' || strlen(v) > RV_MAX)
        return kube_malformed("read", "object %.253s: resourceVersion missing or longer "
                              "than %d bytes", n, RV_MAX);
    if (ann && !json_is_object(ann))
        return kube_malformed("read", "object %.253s: annotations not an object", n);
    json_object_foreach(ann, k, x)
        if (!json_is_string(x))
            return kube_malformed("read", "object %.253s: annotation %.64s not a string",
                                  n, k);
    lease__strlcpy(rv, v, RV_MAX + 1);
    return 0;
}

/* spec: holder, duration, renewTime, transitions, range-checked. */
static int kube_read_spec(kube_lease *l, const char *name)
{
    json_t *spec = json_object_get(l->obj, "spec"), *v;
    const char *t;

    l->holder = "";
    if (spec && !json_is_object(spec))
        return kube_malformed("read", "object %.253s: spec not an object", name);
    if ((v = json_object_get(spec, "holderIdentity")) && !json_is_null(v)) {
        if (!json_is_string(v) || json_string_length(v) > 1024)
            return kube_malformed("read", "object %.253s: holderIdentity", name);
        l->holder = json_string_value(v);
    }
    if ((v = json_object_get(spec, "leaseDurationSeconds")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > DURATION_MAX)
            return kube_malformed("read", "object %.253s: leaseDurationSeconds not "
                                  "1..%lld", name, (long long)DURATION_MAX);
        l->duration_s = json_integer_value(v);
    }
    if ((t = json_string_value(json_object_get(spec, "renewTime"))) != NULL) {
        if (kube_parse_time(&l->renew_us, t) < 0)
            return kube_malformed("read", "object %.253s: renewTime '%.40s'", name, t);
        l->has_renew = 1;
    }
    if ((t = json_string_value(json_object_get(spec, "acquireTime"))) != NULL) {
        if (kube_parse_time(&l->acquire_us, t) < 0)
            return kube_malformed("read", "object %.253s: acquireTime '%.40s'", name, t);
        l->has_acquire = 1;
    }
    if ((v = json_object_get(spec, "leaseTransitions")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > INT32_MAX)
            return kube_malformed("read", "object %.253s: leaseTransitions", name);
        l->transitions = json_integer_value(v);
    }
    if (*l->holder && l->duration_s == 0)
        return kube_malformed("read", "object %.253s: held without leaseDurationSeconds",
                              name);
    return 0;
}

/* Our annotations: the key (checked against `key`), token, label. An
 * object of another client (no liblease/key) is taken only under the key's
 * own name, with token 0. */
static int kube_read_ours(kube_lease *l, const char *name, const char *key)
{
    const char *k = kube_annotation(l->obj, "liblease/key");
    const char *t = kube_annotation(l->obj, "liblease/token");
    const char *lb = kube_annotation(l->obj, "liblease/label");

    if (k) {
        if (kube_decode(l->key, sizeof(l->key), k) < 0)
            return kube_malformed("read", "object %.253s: liblease/key", name);
        l->has_key = 1;
        if (key && strcmp(l->key, key) != 0)
            return lease__seterr(LEASE_ESTORE, "kubernetes: object %.253s holds key "
                                 "'%.255s', not '%.255s'", name, l->key, key);
    } else if (key && strcmp(name, key) != 0) {
        return lease__seterr(LEASE_ESTORE, "kubernetes: object %.253s has no liblease/key "
                             "annotation: it is not the object of key '%.255s'", name, key);
    }
    if (t ? kube_parse_token(&l->token, t) < 0 : l->has_key)
        return kube_malformed("read", "object %.253s: liblease/token is not a number "
                              "1..2^63-1", name);
    if (lb && kube_decode(l->label, sizeof(l->label), lb) < 0)
        return kube_malformed("read", "object %.253s: liblease/label", name);
    return 0;
}

/* Check and take an object read (its reference) into *l. */
static int kube_lease_from(kube_lease *l, json_t *obj, int64_t date_s, const char *name,
                           const char *key)
{
    int rc;

    memset(l, 0, sizeof(*l));
    l->obj = obj;
    l->date_s = date_s;
    if ((rc = kube_check_meta(l->rv, obj, name)) < 0 ||
        (rc = kube_read_spec(l, name)) < 0 || (rc = kube_read_ours(l, name, key)) < 0)
        kube_lease_free(l);
    return rc;
}

/* GET the object of key: 0, KUBE_NOTFOUND or an error. */
static int kube_get(kube_lease *l, kube_store *s, const char *name, const char *key)
{
    char path[512];
    json_t *obj;
    int64_t date_s = -1;
    int rc;

    memset(l, 0, sizeof(*l));
    l->holder = ""; /* a new object has no holder */
    kube_path(path, sizeof(path), s, name);
    rc = kube_call(&obj, &date_s, s, "GET", path, NULL, "read");
    l->date_s = date_s; /* a missing object's too: its first token */
    if (rc != 0)
        return rc;
    return kube_lease_from(l, obj, date_s, name, key);
}

/*
 * GET a list of the namespace's Leases, `query` its query string: 0 with
 * *res and its items (NULL when there are none), or an error. A list is
 * never 404 or 409: either is a server not answering as the API does.
 */
static int kube_get_list(json_t **res, json_t **items, int64_t *date_s, kube_store *s,
                         const char *query, const char *what)
{
    char path[1024];
    int rc;

    *items = NULL;
    kube_path(path, sizeof(path), s, NULL);
    lease__strlcpy(path + strlen(path), query, sizeof(path) - strlen(path));
    if ((rc = kube_call(res, date_s, s, "GET", path, NULL, what)) != 0)
        return rc == KUBE_NOTFOUND || rc == KUBE_CONFLICT
                   ? lease__seterr(LEASE_ESTORE, "kubernetes %s: malformed answer: HTTP %d "
                                   "on a list", what, rc == KUBE_NOTFOUND ? 404 : 409)
                   : rc;
    *items = json_object_get(*res, "items");
    if (*items != NULL && !json_is_array(*items) && !json_is_null(*items)) {
        json_decref(*res);
        *res = NULL;
        *items = NULL;
        return lease__seterr(LEASE_ESTORE, "kubernetes %s: malformed answer: items is "
                             "not an array", what);
    }
    return 0;
}

/*
 * Read key's object through a list of that one name, for a watch: the
 * list's resourceVersion is the server's latest, where the object's own
 * may be old (a lease renewed rarely) and already outside the server's
 * window of events, which would make every watch from it answer 410
 * Gone at once. 0 with *l and list_rv, KUBE_NOTFOUND, or an error.
 */
static int kube_get_listed(kube_lease *l, char list_rv[RV_MAX + 1], kube_store *s,
                           const char *name, const char *key)
{
    char query[NAME_MAX_K + 64];
    json_t *res = NULL, *items;
    int64_t date_s = -1;
    const char *rv;
    int rc;

    memset(l, 0, sizeof(*l));
    snprintf(query, sizeof(query), "?fieldSelector=metadata.name%%3D%s", name);
    if ((rc = kube_get_list(&res, &items, &date_s, s, query, "read")) != 0)
        return rc;
    rv = json_string_value(json_object_get(json_object_get(res, "metadata"),
                                           "resourceVersion"));
    if (rv == NULL || *rv == '\0' || strlen(rv) > RV_MAX)
        rc = kube_malformed("read", "the list has no resourceVersion of at most %d bytes",
                            RV_MAX);
    else if (json_array_size(items) > 1)
        rc = kube_malformed("read", "%zu objects named '%s'", json_array_size(items), name);
    else if (json_array_size(items) == 0)
        rc = KUBE_NOTFOUND;
    else
        rc = kube_lease_from(l, json_incref(json_array_get(items, 0)), date_s, name, key);
    if (rc >= 0 && rv)
        lease__strlcpy(list_rv, rv, RV_MAX + 1);
    json_decref(res);
    return rc;
}

/* ---- expiry -------------------------------------------------------------- */

static void kube_record_of(kube_record *r, const kube_lease *l)
{
    memset(r, 0, sizeof(*r));
    r->holder_h = kube_fnv64(l->holder);
    r->token = l->token;
    r->duration_s = l->duration_s;
    r->acquire_us = l->has_acquire ? l->acquire_us : INT64_MIN;
    r->renew_us = l->has_renew ? l->renew_us : INT64_MIN;
    r->transitions = l->transitions;
}

static int kube_record_eq(const kube_record *a, const kube_record *b)
{
    return a->holder_h == b->holder_h && a->token == b->token &&
           a->duration_s == b->duration_s && a->acquire_us == b->acquire_us &&
           a->renew_us == b->renew_us && a->transitions == b->transitions;
}

static seen_rec *kube_seen_slot(kube_store *s, const char *name)
{
    return &s->seen[kube_fnv64(name) % SEEN_SLOTS];
}

/* Note that this handle saw (or wrote, at at_ns) the record of l. A new
 * record of the same holder is a renewal seen; a new holder starts over. */
static void kube_seen_note(kube_store *s, const char *name, const kube_lease *l,
                           int64_t at_ns)
{
    seen_rec *e = kube_seen_slot(s, name);
    kube_record r;
    int same_name = strcmp(e->name, name) == 0;

    kube_record_of(&r, l);
    if (same_name && kube_record_eq(&e->rec, &r))
        return;
    if (same_name && e->rec.holder_h == r.holder_h) {
        e->renewed = 1;
    } else {
        lease__strlcpy(e->name, name, sizeof(e->name));
        e->renewed = e->skewed = 0;
    }
    e->rec = r;
    e->first_ns = at_ns;
}

/*
 * Rule (b)'s clock test at the server's second date_s with a margin of
 * skew_s: the seconds until the server's clock is past renewTime +
 * duration + skew_s + 1 s, <= 0 once it is (renewTime rounded up, the Date
 * rounded down: both err towards "still held"); INT64_MAX without a Date or
 * a renewTime.
 */
static int64_t kube_clock_wait_s(const kube_lease *l, int skew_s, int64_t date_s)
{
    if (date_s <= 0 || !l->has_renew)
        return INT64_MAX;
    return (l->renew_us + 999999) / 1000000 + l->duration_s + skew_s + 1 - date_s;
}

/* The same with this handle's max_skew: INT64_MAX when rule (b) is off. */
static int64_t kube_rule_b_wait(const kube_store *s, const kube_lease *l, int64_t date_s)
{
    return s->max_skew_s > 0 ? kube_clock_wait_s(l, s->max_skew_s, date_s) : INT64_MAX;
}

/*
 * Was the renewal this handle saw (e, the current record of a holder whose
 * earlier record it saw) already past rule (b)'s clock test when it was
 * first seen? Then the holder wrote a renewTime its own clock put that far
 * back: its clock is behind, and rule (b) must not be applied to it. The
 * server's second at first sight is taken from above (the Date now, plus
 * one, minus the whole seconds since), erring towards "skewed", which only
 * leaves rule (a) to decide.
 */
static int kube_skew_seen(const kube_store *s, const seen_rec *e, const kube_lease *l,
                          int64_t now)
{
    int64_t since_s = (now - e->first_ns) / 1000000000;

    return e->renewed && l->date_s > 0 &&
           kube_rule_b_wait(s, l, l->date_s + 1 - since_s) <= 0;
}

/*
 * May this handle treat the held lease l as ended (see Expiry at the top)?
 * 1 yes, 0 no with *left_ms the time until it may. A lease with no holder
 * is free (1). `taking`: to take it over (or renew it), rule (b) also
 * needs half the duration of watching; inspect reports by the clock test
 * alone (what it says is no grant, and a fresh process, as every `lease
 * show` is, would otherwise report a lease dead for hours as held).
 */
static int kube_expired(kube_store *s, const char *name, const kube_lease *l, int taking,
                        uint64_t *left_ms)
{
    int64_t now = lease_clock_ns(), dur_ms = l->duration_s * 1000, seen_ms, left, clock_s;
    seen_rec *e;

    *left_ms = 0;
    if (*l->holder == '\0')
        return 1;
    kube_seen_note(s, name, l, now);
    e = kube_seen_slot(s, name);
    seen_ms = (now - e->first_ns) / 1000000;
    if (seen_ms >= dur_ms)
        return 1; /* rule (a): unchanged for the whole duration */
    left = dur_ms - seen_ms;
    if (!e->skewed && kube_skew_seen(s, e, l, now))
        e->skewed = 1;
    clock_s = kube_rule_b_wait(s, l, l->date_s);
    if (!e->skewed && clock_s != INT64_MAX) {
        /* rule (b): the clock test, and half the duration unchanged. */
        int64_t watch = taking ? dur_ms / 2 - seen_ms : 0;
        int64_t b = clock_s * 1000 > watch ? clock_s * 1000 : watch;

        if (b <= 0)
            return 1;
        if (b < left)
            left = b;
    }
    *left_ms = (uint64_t)left;
    return 0;
}

static struct {
    pthread_mutex_t mu;
    written_rec **chain;    /* size chains */
    size_t size, count;
} written = { PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0 };

/* "<base>/<namespace>/<name>" into buf (sized for the longest). */
#define WNAME_SIZE (512 + 64 + NAME_MAX_K + 3)
static void kube_written_name(char buf[WNAME_SIZE], const kube_store *s, const char *name)
{
    snprintf(buf, WNAME_SIZE, "%s/%s/%s", s->base, s->ns, name);
}

/* The link to full's entry, or to the end of its chain (NULL: no table).
 * Under written.mu. */
static written_rec **kube_written_link(const char *full)
{
    written_rec **p;

    if (written.size == 0)
        return NULL;
    for (p = &written.chain[kube_fnv64(full) % written.size]; *p; p = &(*p)->next)
        if (strcmp((*p)->name, full) == 0)
            break;
    return p;
}

/* Twice as many chains; nothing is lost when there is no memory. */
static void kube_written_grow(void)
{
    size_t size = written.size ? written.size * 2 : 64, i;
    written_rec **t = calloc(size, sizeof(*t)), *e;

    if (t == NULL)
        return;
    for (i = 0; i < written.size; i++)
        while ((e = written.chain[i]) != NULL) {
            written.chain[i] = e->next;
            e->next = t[kube_fnv64(e->name) % size];
            t[kube_fnv64(e->name) % size] = e;
        }
    free(written.chain);
    written.chain = t;
    written.size = size;
}

/* Note this process's write of l to name, sent at sent_ns. Without
 * memory the note is lost, which only makes the holder's side stricter
 * (kube_holder_alive falls back on the server's clock). */
static void kube_written_put(const kube_store *s, const char *name, const kube_lease *l,
                             int64_t sent_ns)
{
    char full[WNAME_SIZE];
    written_rec **p, *e;

    kube_written_name(full, s, name);
    pthread_mutex_lock(&written.mu);
    if (written.count >= written.size * 2)
        kube_written_grow();
    if ((p = kube_written_link(full)) != NULL && (e = *p) == NULL &&
        (e = calloc(1, sizeof(*e) + strlen(full) + 1)) != NULL) {
        strcpy(e->name, full);
        *p = e;
        written.count++;
    }
    if (p && e) {
        kube_record_of(&e->rec, l);
        e->sent_ns = sent_ns;
    }
    pthread_mutex_unlock(&written.mu);
}

static void kube_written_del(const kube_store *s, const char *name)
{
    char full[WNAME_SIZE];
    written_rec **p, *e;

    kube_written_name(full, s, name);
    pthread_mutex_lock(&written.mu);
    if ((p = kube_written_link(full)) != NULL && (e = *p) != NULL) {
        *p = e->next;
        free(e);
        written.count--;
    }
    pthread_mutex_unlock(&written.mu);
}

/* When this process sent the write of l's holderIdentity, token, renewTime
 * and duration, as l has them now; -1 if it did not. */
static int64_t kube_written_at(const kube_store *s, const char *name, const kube_lease *l)
{
    char full[WNAME_SIZE];
    written_rec **p;
    kube_record r;
    int64_t at = -1;

    kube_record_of(&r, l);
    kube_written_name(full, s, name);
    pthread_mutex_lock(&written.mu);
    if ((p = kube_written_link(full)) != NULL && *p && (*p)->rec.holder_h == r.holder_h &&
        (*p)->rec.token == r.token && (*p)->rec.renew_us == r.renew_us &&
        (*p)->rec.duration_s == r.duration_s)
        at = (*p)->sent_ns;
    pthread_mutex_unlock(&written.mu);
    return at;
}

/*
 * May the holder's side (renew, the same owner's acquire) treat the lease
 * l as still its own? kube_expired errs towards "still held", which is
 * right for a candidate and wrong here: a fresh handle, or one whose slot
 * was taken by another name, would start counting rule (a) only now and so
 * revive a lease that ended long ago. So a holder needs proof that it is
 * alive:
 *  - this process wrote the holderIdentity, token, renewTime and duration
 *    that l has, less than the duration ago (timed from when the write was
 *    sent: every record that holds them is newer, so no candidate can have
 *    seen one unchanged for the duration yet), and less than half of it ago
 *    when rule (b)'s clock test holds (its clock is behind: a candidate may
 *    take over after half the duration unchanged), tested with no margin,
 *    as the boldest candidate's max_skew would, or without a Date to test
 *    it. Annotations (a history mark, by whichever process) and the other
 *    spec fields may have changed meanwhile: that only restarts every
 *    candidate's observation later;
 *  - or the server's clock (its second rounded up) is before renewTime -
 *    max_skew + duration (renewTime rounded down), which no candidate's
 *    rule (b) can pass.
 */
static int kube_holder_alive(kube_store *s, const char *name, const kube_lease *l)
{
    int64_t at = kube_written_at(s, name, l), dur_ns = l->duration_s * 1000000000;

    if (at >= 0) {
        int64_t age = lease_clock_ns() - at;

        if (age < dur_ns &&
            (age < dur_ns / 2 || (l->date_s > 0 && kube_clock_wait_s(l, 0, l->date_s) > 0)))
            return 1;
    }
    return s->max_skew_s > 0 && l->date_s > 0 && l->has_renew &&
           l->date_s + 1 + s->max_skew_s < l->renew_us / 1000000 + l->duration_s;
}

/* inspect's view of l (key: the key asked, or l's own for list). */
static void kube_fill_info(lease_info *info, kube_store *s, const char *name,
                           const kube_lease *l, const char *key)
{
    uint64_t left = 0;
    int expired = kube_expired(s, name, l, 0, &left);

    memset(info, 0, sizeof(*info));
    lease__strlcpy(info->key, key, sizeof(info->key));
    lease__strlcpy(info->owner, l->holder, sizeof(info->owner));
    lease__strlcpy(info->label, l->label, sizeof(info->label));
    info->token = l->token;
    info->held = !expired;
    if (!expired) {
        info->remaining_ms = left;
        info->ttl_ms = (uint64_t)l->duration_s * 1000;
    }
}

/* ---- history (an annotation: newest first) --------------------------------
 * [[token, owner, label (encoded), ttl_ms, acquired_ms, ended, ended_ms], ...] */

static json_t *kube_history_of(json_t *obj)
{
    const char *t = kube_annotation(obj, "liblease/history");
    lease__json_budget b = lease__json_budget_of(LEASE__JSON_HOLD_ANY, t ? strlen(t) : 0, 0);
    char err[160];
    json_t *h = NULL;

    /* Anything but an array (someone else's edit, or one that would cost
     * more than an answer may: json_budget.h) starts a new record rather
     * than keep the key from being granted: the history is a record of
     * grants, not what decides them. NULL: out of memory. Its text came
     * in an answer already decoded within the call's deadline. */
    if (t)
        lease__json_load(&h, t, strlen(t), &b, err, sizeof(err));
    if (!json_is_array(h)) {
        json_decref(h);
        h = json_array();
    }
    return h;
}

static int kube_history_entry(lease_history_entry *e, json_t *a)
{
    json_int_t v[5];
    const char *owner, *label;
    size_t i;

    memset(e, 0, sizeof(*e));
    if (!json_is_array(a) || json_array_size(a) != 7 ||
        (owner = json_string_value(json_array_get(a, 1))) == NULL ||
        (label = json_string_value(json_array_get(a, 2))) == NULL ||
        strlen(owner) >= sizeof(e->owner) ||
        kube_decode(e->label, sizeof(e->label), label) < 0)
        return -1;
    for (i = 0; i < 5; i++) {
        json_t *x = json_array_get(a, i == 0 ? 0 : i + 2);

        if (!json_is_integer(x) || (v[i] = json_integer_value(x)) < 0)
            return -1;
    }
    if (!lease__token_ok((uint64_t)v[0]) || (uint64_t)v[1] > LEASE__MS_MAX || v[3] > 3)
        return -1;
    e->token = (uint64_t)v[0];
    lease__strlcpy(e->owner, owner, sizeof(e->owner));
    e->ttl_ms = (uint64_t)v[1];
    e->acquired_ms = v[2];
    e->ended = (lease_ended)v[3];
    e->ended_ms = v[4];
    return 0;
}

/* Set entry i's ending. */
static void kube_history_end(json_t *h, size_t i, lease_ended how, int64_t ms)
{
    json_t *a = json_array_get(h, i);

    json_array_set_new(a, 5, json_integer(how));
    json_array_set_new(a, 6, json_integer(ms));
}

/* A new grant: the previous one, if HELD, EXPIRED at its known end. */
static int kube_history_grant(json_t *h, const kube_lease *old, uint64_t token,
                              const lease_request *req, uint64_t ttl_ms, int64_t now_ms)
{
    lease_history_entry prev;
    char *label = kube_encode(req->label);
    json_t *e;

    if (json_array_size(h) > 0 && kube_history_entry(&prev, json_array_get(h, 0)) == 0 &&
        prev.ended == LEASE_ENDED_HELD)
        kube_history_end(h, 0, LEASE_ENDED_EXPIRED,
                         old->has_renew ? old->renew_us / 1000 + old->duration_s * 1000 : 0);
    e = label ? json_pack("[I,s,s,I,I,i,i]", (json_int_t)token, req->owner, label,
                          (json_int_t)ttl_ms, (json_int_t)now_ms, 0, 0)
              : NULL;
    free(label);
    if (e == NULL || json_array_insert_new(h, 0, e) < 0)
        return -1;
    while (json_array_size(h) > LEASE_HISTORY_KEEP)
        json_array_remove(h, json_array_size(h) - 1);
    return 0;
}

/* Index of (token[, owner]) in h, -1 if none. */
static long kube_history_find(json_t *h, uint64_t token, const char *owner,
                              lease_history_entry *e)
{
    size_t i;

    for (i = 0; i < json_array_size(h); i++)
        if (kube_history_entry(e, json_array_get(h, i)) == 0 && e->token == token &&
            (owner == NULL || strcmp(e->owner, owner) == 0))
            return (long)i;
    return -1;
}

static int kube_set_history(json_t *obj, json_t *h)
{
    char *text = json_dumps(h, JSON_COMPACT);
    int rc = text ? json_object_set_new(kube_annotations(obj), "liblease/history",
                                        json_string(text))
                  : -1;

    free(text);
    return rc;
}

/* ---- writing a Lease ----------------------------------------------------- */

/* A new object for `name` with empty annotations and spec (NULL: ENOMEM). */
static json_t *kube_new_object(const char *name)
{
    return json_pack("{s:s, s:s, s:{s:s, s:{}}, s:{}}", "apiVersion",
                     "coordination.k8s.io/v1", "kind", "Lease", "metadata", "name", name,
                     "annotations", "spec");
}

/* Make sure obj has metadata.annotations and spec objects. */
static int kube_prepare(json_t *obj)
{
    json_t *meta = json_object_get(obj, "metadata");

    if (!json_is_object(json_object_get(meta, "annotations")) &&
        json_object_set_new(meta, "annotations", json_object()) < 0)
        return -1;
    if (!json_is_object(json_object_get(obj, "spec")) &&
        json_object_set_new(obj, "spec", json_object()) < 0)
        return -1;
    /* Not ours to send back: the server keeps them. */
    json_object_del(meta, "managedFields");
    return 0;
}

static int kube_annotate(json_t *obj, const char *name, const char *value)
{
    return json_object_set_new(kube_annotations(obj), name, json_string(value));
}

static int kube_annotate_encoded(json_t *obj, const char *name, const char *raw)
{
    char *v = kube_encode(raw);
    int rc = v ? kube_annotate(obj, name, v) : -1;

    free(v);
    return rc;
}

/* PUT (with the rv inside obj) or POST it: 0, KUBE_CONFLICT, or an error.
 * The record written is noted as seen by this handle from before the
 * write; a grant's or a renewal's also as this process's own (its proof of
 * life), a release ends that. A history mark changes no record: the time
 * this handle has seen the lease unchanged goes on, it revives nothing. */
static int kube_write(kube_store *s, const char *name, json_t *obj, int create,
                      const char *what)
{
    char path[512], rv[RV_MAX + 1];
    int64_t t0 = lease_clock_ns();
    json_t *res = NULL;
    kube_lease w;
    int rc;

    kube_path(path, sizeof(path), s, create ? NULL : name);
    rc = kube_call(&res, NULL, s, create ? "POST" : "PUT", path, obj, what);
    if (rc == KUBE_NOTFOUND && create)
        rc = lease__seterr(LEASE_ESTORE, "kubernetes %s on %s: 404 on create: does "
                           "namespace %s exist?", what, s->parent.url_redacted, s->ns);
    else if (rc == KUBE_NOTFOUND)
        rc = KUBE_CONFLICT; /* deleted since it was read: read again */
    if (rc == 0 && strcmp(what, "fence") == 0)
        rc = kube_check_meta(rv, res, name);
    else if (rc == 0 && (rc = kube_lease_from(&w, json_incref(res), -1, name, NULL)) == 0) {
        kube_seen_note(s, name, &w, t0);
        if (strcmp(what, "acquire") == 0 || strcmp(what, "renew") == 0)
            kube_written_put(s, name, &w, t0);
        else if (strcmp(what, "release") == 0)
            kube_written_del(s, name);
        kube_lease_free(&w);
    }
    json_decref(res);
    return rc;
}

/* ttl in whole seconds, rounded up, at least 1. */
static int64_t kube_duration(uint64_t ttl_ms)
{
    int64_t d = (int64_t)((ttl_ms + 999) / 1000);

    return d < 1 ? 1 : d > DURATION_MAX ? DURATION_MAX : d;
}

/* The spec of a holder's write: renewTime now, and for a new grant the
 * holder, acquireTime and the transition count. */
static int kube_set_spec(json_t *obj, const char *owner, int64_t duration_s,
                         int new_grant, const kube_lease *old, int64_t now_us)
{
    json_t *spec = json_object_get(obj, "spec");
    /* Before holderIdentity is replaced: old->holder points into it. */
    int changed = strcmp(old->holder, owner) != 0;
    char now[64];
    int rc = 0;

    kube_microtime(now, now_us);
    rc |= json_object_set_new(spec, "leaseDurationSeconds", json_integer(duration_s));
    rc |= json_object_set_new(spec, "renewTime", json_string(now));
    if (new_grant) {
        rc |= json_object_set_new(spec, "holderIdentity", json_string(owner));
        rc |= json_object_set_new(spec, "acquireTime", json_string(now));
        if (changed)
            rc |= json_object_set_new(spec, "leaseTransitions",
                                      json_integer(old->transitions + 1));
    }
    return rc ? -1 : 0;
}

/* The object of a grant: the key, the token, label, spec, history. */
static int kube_grant_object(json_t **out, const char *name, kube_lease *old,
                             const lease_request *req, uint64_t token, int new_grant)
{
    int64_t now_us = kube_wall_us(), dur = kube_duration(req->ttl_ms);
    json_t *obj = old->obj ? json_incref(old->obj) : kube_new_object(name), *h = NULL;
    char tok[24];
    int rc = obj ? kube_prepare(obj) : -1;

    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    if (rc == 0)
        rc = kube_annotate_encoded(obj, "liblease/key", req->key) |
             kube_annotate(obj, "liblease/token", tok) |
             kube_annotate_encoded(obj, "liblease/label", req->label) |
             kube_set_spec(obj, req->owner, dur, new_grant, old, now_us);
    if (rc == 0 && new_grant)
        rc = (h = kube_history_of(obj)) == NULL ||
                     kube_history_grant(h, old, token, req, (uint64_t)dur * 1000,
                                        now_us / 1000) < 0 ||
                     kube_set_history(obj, h) < 0
                 ? -1
                 : 0;
    json_decref(h);
    if (rc != 0) {
        json_decref(obj);
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    *out = obj;
    return 0;
}

/* ---- acquire, renew, release --------------------------------------------- */

/*
 * The token of a grant. The counter lives in the object, so an object that
 * was deleted (kubectl delete) starts again: with tokens=clock (the
 * default, as on Redis and PostgreSQL) a new holder's token is at least
 * the API server's clock in µs (its Date, whole seconds), which has moved
 * past every token the deleted object gave out unless it was deleted and
 * created again within the second of its last grant. The same owner's
 * retry keeps its token.
 */
static uint64_t kube_next_token(const kube_store *s, const kube_lease *l, int create,
                                int new_grant)
{
    uint64_t next = create ? 1 : l->token + 1, clock_us;

    if (!new_grant)
        return l->token;
    if (s->tokens != LEASE__TOKENS_CLOCK || l->date_s <= 0 ||
        (uint64_t)l->date_s > LEASE__TOKEN_MAX / 1000000)
        return next;
    clock_us = (uint64_t)l->date_s * 1000000;
    return clock_us > next ? clock_us : next;
}

/* One read-decide-write round of acquire: 0, EBUSY, KUBE_CONFLICT or an
 * error. */
static int kube_acquire_once(lease_grant *out, lease_info *holder, kube_store *s,
                             const char *name, const lease_request *req)
{
    kube_lease l;
    uint64_t left, token;
    json_t *obj = NULL;
    int rc, create, expired, other, new_grant;

    rc = kube_get(&l, s, name, req->key);
    if (rc < 0)
        return rc;
    create = rc == KUBE_NOTFOUND;
    expired = create || kube_expired(s, name, &l, 1, &left);
    /* The same owner keeps its token only while it can tell that its
     * lease is alive (kube_holder_alive); else a new grant, newer token. */
    other = !create && strcmp(l.holder, req->owner) != 0;
    new_grant = expired || other || !kube_holder_alive(s, name, &l);
    if (!expired && other) {
        kube_fill_info(holder, s, name, &l, req->key);
        kube_lease_free(&l);
        return lease__seterr(LEASE_EBUSY, "kubernetes: '%.255s' is held", req->key);
    }
    token = kube_next_token(s, &l, create, new_grant);
    if (!lease__token_ok(token)) {
        kube_lease_free(&l);
        return lease__seterr(LEASE_ESTORE, "kubernetes: '%.255s': the token counter is "
                             "at its maximum", req->key);
    }
    if ((rc = kube_grant_object(&obj, name, &l, req, token, new_grant)) == 0)
        rc = kube_write(s, name, obj, create, "acquire");
    json_decref(obj);
    kube_lease_free(&l);
    if (rc == 0) {
        out->token = token;
        out->ttl_ms = (uint64_t)kube_duration(req->ttl_ms) * 1000;
    }
    return rc;
}

/* A compare-and-swap that lost every one of its `tries` (409 Conflict
 * each time): another writer kept changing the object. */
static int kube_conflict_error(const kube_store *s, const char *what, const char *key,
                               int tries)
{
    return lease__seterr(LEASE_ESTORE, "kubernetes %s on %s: '%.255s' changed under "
                         "every one of %d attempts (409 Conflict)", what,
                         s->parent.url_redacted, key, tries);
}

static int kube_acquire(lease_grant *out, lease_info *holder, lease_store *base,
                        const lease_request *req)
{
    kube_store *s = (kube_store *)base;
    char name[NAME_MAX_K + 1];
    int rc = KUBE_CONFLICT, i;

    kube_begin(s);
    if (kube_key_name(name, req->key) < 0)
        return LEASE_ESTORE;
    /* A 409 means another writer came first: read again and decide again
     * (busy, or free once more), never write over it. */
    for (i = 0; i < CAS_TRIES && rc == KUBE_CONFLICT; i++)
        rc = kube_acquire_once(out, holder, s, name, req);
    if (rc == KUBE_CONFLICT)
        rc = kube_conflict_error(s, "acquire", req->key, CAS_TRIES);
    return rc;
}

/*
 * Read the lease of (key, owner, token) and check it is the current one:
 * 0 with *l, ELOST (said by lease__not_holder), ESTORE, or an error. A
 * renewal (`renewing`) must also prove the lease alive (kube_holder_alive):
 * it must not revive one. One that cannot, while the server's clock does
 * not say the lease ran out either (a ttl too short for max_skew to vouch
 * for, max_skew=0), cannot tell whether the lease lives: it is ESTORE,
 * "uncertain" as the contract defines it, and writes nothing. Saying ELOST
 * there would be a guess: a second process renewing with the holder's
 * owner and token, a moment after the holder's own renewal, would be told
 * the lease was lost while it is held, and the history mark that follows
 * an ELOST would record a live grant as lost. A release ends the lease
 * either way.
 */
static int kube_read_held(kube_lease *l, kube_store *s, const char *name, int renewing,
                          const char *key, const char *owner, uint64_t token)
{
    const char *what = renewing ? "renew" : "release";
    uint64_t left;
    int rc = kube_get(l, s, name, key), ended;

    if (rc == KUBE_NOTFOUND)
        return lease__not_holder(what, key, token, NULL);
    if (rc < 0)
        return rc;
    ended = l->token != token || strcmp(l->holder, owner) != 0 ||
            kube_expired(s, name, l, 1, &left);
    if (!ended && (!renewing || kube_holder_alive(s, name, l)))
        return 0;
    if (!ended && kube_rule_b_wait(s, l, l->date_s) > 0) {
        kube_lease_free(l);
        return lease__seterr(LEASE_ESTORE, "kubernetes renew of '%.255s' (token %llu): "
                             "cannot tell whether the lease is still alive: this process "
                             "did not write its current renewTime, and the API server's "
                             "clock cannot vouch for it (leaseDurationSeconds %lld, "
                             "max_skew=%d); nothing was written", key,
                             (unsigned long long)token, (long long)l->duration_s,
                             s->max_skew_s);
    }
    kube_written_del(s, name); /* nothing of it is this process's now */
    kube_lease_free(l);
    return lease__not_holder(what, key, token, NULL);
}

static int kube_renew(uint64_t *granted_ms, lease_store *base, const char *key,
                      const char *owner, uint64_t token, uint64_t ttl_ms)
{
    kube_store *s = (kube_store *)base;
    char name[NAME_MAX_K + 1];
    int rc = KUBE_CONFLICT, i;

    kube_begin(s);
    if (kube_key_name(name, key) < 0)
        return LEASE_ESTORE;
    /* A 409: read again; still ours with the same token, write again. */
    for (i = 0; i < CAS_TRIES && rc == KUBE_CONFLICT; i++) {
        kube_lease l;
        json_t *spec;
        char now[64];

        if ((rc = kube_read_held(&l, s, name, 1, key, owner, token)) < 0)
            return rc;
        kube_microtime(now, kube_wall_us());
        spec = json_object_get(l.obj, "spec");
        rc = kube_prepare(l.obj) | json_object_set_new(spec, "renewTime", json_string(now)) |
             json_object_set_new(spec, "leaseDurationSeconds",
                                 json_integer(kube_duration(ttl_ms)));
        rc = rc ? lease__seterr(LEASE_ENOMEM, "out of memory")
                : kube_write(s, name, l.obj, 0, "renew");
        kube_lease_free(&l);
    }
    if (rc == KUBE_CONFLICT)
        rc = kube_conflict_error(s, "renew", key, CAS_TRIES);
    if (rc == 0)
        *granted_ms = (uint64_t)kube_duration(ttl_ms) * 1000;
    return rc;
}

/* The release write: holder cleared, token kept, history RELEASED. */
static int kube_release_object(kube_lease *l, uint64_t token)
{
    lease_history_entry e;
    json_t *h = kube_history_of(l->obj);
    long at = h ? kube_history_find(h, token, NULL, &e) : -1;
    int rc = kube_prepare(l->obj);

    json_object_del(json_object_get(l->obj, "spec"), "holderIdentity");
    if (at >= 0 && e.ended != LEASE_ENDED_LOST) {
        kube_history_end(h, (size_t)at, LEASE_ENDED_RELEASED, kube_wall_us() / 1000);
        rc |= kube_set_history(l->obj, h);
    }
    json_decref(h);
    return rc ? lease__seterr(LEASE_ENOMEM, "out of memory") : 0;
}

static int kube_release(lease_store *base, const char *key, const char *owner,
                        uint64_t token)
{
    kube_store *s = (kube_store *)base;
    char name[NAME_MAX_K + 1];
    int rc = KUBE_CONFLICT, i;

    kube_begin(s);
    if (kube_key_name(name, key) < 0)
        return LEASE_ESTORE;
    for (i = 0; i < CAS_TRIES && rc == KUBE_CONFLICT; i++) {
        kube_lease l;

        if ((rc = kube_read_held(&l, s, name, 0, key, owner, token)) < 0)
            return rc;
        if ((rc = kube_release_object(&l, token)) == 0)
            rc = kube_write(s, name, l.obj, 0, "release");
        kube_lease_free(&l);
    }
    if (rc == KUBE_CONFLICT)
        rc = kube_conflict_error(s, "release", key, CAS_TRIES);
    return rc;
}

/* ---- inspect, list --------------------------------------------------------- */

static int kube_inspect(lease_info *out, lease_store *base, const char *key)
{
    kube_store *s = (kube_store *)base;
    char name[NAME_MAX_K + 1];
    kube_lease l;
    int rc;

    kube_begin(s);
    if (kube_key_name(name, key) < 0)
        return LEASE_ESTORE;
    rc = kube_get(&l, s, name, key);
    if (rc == KUBE_NOTFOUND)
        return lease__seterr(LEASE_ENOTFOUND, "kubernetes: no lease '%.255s'", key);
    if (rc < 0)
        return rc;
    kube_fill_info(out, s, name, &l, key);
    kube_lease_free(&l);
    return 0;
}

/* One item of a list page: ours (liblease/key) and under the prefix. */
static int kube_list_item(kube_store *s, json_t *item, int64_t date_s, const char *prefix,
                          lease_list_cb cb, void *payload)
{
    const char *name = json_string_value(json_object_get(json_object_get(item, "metadata"),
                                                         "name"));
    lease_info info;
    kube_lease l;
    int rc;

    if (kube_annotation(item, "liblease/key") == NULL)
        return 0; /* another client's Lease, or a fencing mark */
    if (name == NULL)
        return kube_malformed("list", "an item has no metadata.name");
    if ((rc = kube_lease_from(&l, json_incref(item), date_s, name, NULL)) < 0)
        return rc;
    if (strncmp(l.key, prefix, strlen(prefix)) == 0) {
        kube_fill_info(&info, s, name, &l, l.key);
        rc = cb(&info, payload) ? 1 : 0;
    }
    kube_lease_free(&l);
    return rc;
}

/* The next page's continue token of a list page (NULL: the last page),
 * checked: URL-safe bytes only (it goes into the query), and never one
 * the list was given before (in `given`, which it joins), which would
 * have the list print the same pages again until its timeout. */
static int kube_list_next(const char **next, json_t *res, json_t *given)
{
    const char *t = json_string_value(json_object_get(json_object_get(res, "metadata"),
                                                      "continue"));

    *next = NULL;
    if (t == NULL || *t == '\0')
        return 0;
    if (strlen(t) >= 512 ||
        strspn(t, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                  "0123456789-_.~=") != strlen(t))
        return kube_malformed("list", "continue token");
    if (json_object_get(given, t) != NULL)
        return kube_malformed("list", "the server repeated a continue token");
    if (json_object_set(given, t, json_true()) < 0)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    *next = t;
    return 0;
}

static int kube_list(lease_store *base, const char *prefix, lease_list_cb cb, void *payload)
{
    kube_store *s = (kube_store *)base;
    char query[600], cont[512] = "";
    json_t *given = json_object();
    int rc = 0;

    if (given == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    kube_begin(s);
    do {
        json_t *res = NULL, *items;
        int64_t date_s = -1;
        const char *next;
        size_t i;

        snprintf(query, sizeof(query), "?limit=%d%s%s", LIST_PAGE,
                 *cont ? "&continue=" : "", cont);
        if ((rc = kube_get_list(&res, &items, &date_s, s, query, "list")) != 0)
            break;
        /* Checked before the page's items are handed on: a page given
         * again is not listed twice. */
        rc = kube_list_next(&next, res, given);
        for (i = 0; rc == 0 && i < json_array_size(items); i++)
            rc = kube_list_item(s, json_array_get(items, i), date_s, prefix, cb, payload);
        lease__strlcpy(cont, rc == 0 && next ? next : "", sizeof(cont));
        json_decref(res);
    } while (rc == 0 && *cont);
    json_decref(given);
    return rc < 0 ? rc : 0;
}

/* ---- fencing marks -------------------------------------------------------- */

/* GET resource's mark object: 0 with *obj and *mark, KUBE_NOTFOUND, or
 * an error (another resource's object is LEASE_ESTORE). */
static int kube_read_mark(json_t **obj, uint64_t *mark, kube_store *s, const char *name,
                          const char *resource)
{
    char path[512], rv[RV_MAX + 1], res[LEASE_KEY_MAX + 1];
    const char *r, *m;
    int rc;

    kube_path(path, sizeof(path), s, name);
    if ((rc = kube_call(obj, NULL, s, "GET", path, NULL, "fence")) != 0)
        return rc;
    r = kube_annotation(*obj, "liblease/resource");
    m = kube_annotation(*obj, "liblease/mark");
    if ((rc = kube_check_meta(rv, *obj, name)) == 0) {
        if (r == NULL || kube_decode(res, sizeof(res), r) < 0 || strcmp(res, resource) != 0)
            rc = lease__seterr(LEASE_ESTORE, "kubernetes: object %.253s does not hold the "
                               "mark of resource '%.255s'", name, resource);
        else if (kube_parse_token(mark, m) < 0)
            rc = kube_malformed("fence", "object %.253s: liblease/mark is not a number "
                                "1..2^63-1", name);
    }
    if (rc < 0) {
        json_decref(*obj);
        *obj = NULL;
    }
    return rc;
}

/* One round of fence_advance: read, decide, CAS write. */
static int kube_fence_once(uint64_t *mark, kube_store *s, const char *name,
                           const char *resource, uint64_t token)
{
    json_t *obj = NULL;
    char tok[24];
    int rc = kube_read_mark(&obj, mark, s, name, resource), create = rc == KUBE_NOTFOUND;

    if (rc < 0)
        return rc;
    if (!create && token <= *mark) {
        json_decref(obj);
        return token == *mark ? 0 : LEASE_ESTALE;
    }
    if (create)
        obj = kube_new_object(name);
    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    rc = obj == NULL || kube_prepare(obj) < 0 ||
                 kube_annotate_encoded(obj, "liblease/resource", resource) < 0 ||
                 kube_annotate(obj, "liblease/mark", tok) < 0
             ? lease__seterr(LEASE_ENOMEM, "out of memory")
             : kube_write(s, name, obj, create, "fence");
    json_decref(obj);
    if (rc == 0)
        *mark = token;
    return rc;
}

static int kube_fence_advance(uint64_t *mark, lease_store *base, const char *resource,
                              uint64_t token)
{
    kube_store *s = (kube_store *)base;
    char name[NAME_MAX_K + 1];
    int rc = KUBE_CONFLICT, i;

    kube_begin(s);
    if (kube_hashed_name(name, "liblease-f-", resource) < 0)
        return LEASE_ESTORE;
    /* A 409: another advance came first; reading again and deciding again
     * is safe, as an advance only ever raises the mark. */
    for (i = 0; i < CAS_TRIES * 2 && rc == KUBE_CONFLICT; i++)
        rc = kube_fence_once(mark, s, name, resource, token);
    if (rc == LEASE_ESTALE)
        return lease__seterr(LEASE_ESTALE, "kubernetes: token %llu is below the mark %llu "
                             "of '%.255s'", (unsigned long long)token,
                             (unsigned long long)*mark, resource);
    if (rc == KUBE_CONFLICT)
        rc = kube_conflict_error(s, "fence", resource, CAS_TRIES * 2);
    return rc;
}

static int kube_fence_mark(uint64_t *mark, lease_store *base, const char *resource)
{
    kube_store *s = (kube_store *)base;
    char name[NAME_MAX_K + 1];
    json_t *obj = NULL;
    int rc;

    kube_begin(s);
    if (kube_hashed_name(name, "liblease-f-", resource) < 0)
        return LEASE_ESTORE;
    rc = kube_read_mark(&obj, mark, s, name, resource);
    json_decref(obj);
    if (rc == KUBE_NOTFOUND || rc == KUBE_CONFLICT)
        return lease__seterr(LEASE_ENOTFOUND, "kubernetes: no mark for '%.255s'", resource);
    return rc;
}

/* Kubernetes writes one object at a time: a value named apart from the
 * key cannot be written in the same atomic step as the lease check. */
static int kube_guarded_put(lease_store *base, const char *key, const char *owner,
                            uint64_t token, const char *name, const void *value, size_t len)
{
    (void)base, (void)key, (void)owner, (void)token, (void)name, (void)value, (void)len;
    return lease__seterr(LEASE_EUNSUPPORTED, "kubernetes: guarded writes are not supported: "
                         "the API server has no write across two objects, so the value "
                         "could not be written atomically with the lease check (use "
                         "lease_fence_advance and fence the resource itself)");
}

static int kube_data_get(void **value, size_t *len, uint64_t *token, lease_store *base,
                         const char *name)
{
    (void)value, (void)len, (void)token, (void)base, (void)name;
    return lease__seterr(LEASE_EUNSUPPORTED, "kubernetes: guarded values are not supported");
}

/* ---- history ------------------------------------------------------------ */

static int kube_history(lease_history_entry *out, size_t *n, lease_store *base,
                        const char *key, size_t max)
{
    kube_store *s = (kube_store *)base;
    char name[NAME_MAX_K + 1];
    kube_lease l;
    json_t *h;
    size_t i;
    int rc;

    *n = 0;
    kube_begin(s);
    if (kube_key_name(name, key) < 0)
        return LEASE_ESTORE;
    if ((rc = kube_get(&l, s, name, key)) == KUBE_NOTFOUND)
        return 0;
    if (rc < 0)
        return rc;
    if ((h = kube_history_of(l.obj)) == NULL)
        rc = kube_malformed("history", "object %.253s: liblease/history", name);
    for (i = 0; rc == 0 && i < json_array_size(h) && *n < max; i++)
        if (kube_history_entry(&out[(*n)++], json_array_get(h, i)) < 0)
            rc = kube_malformed("history", "object %.253s: entry %zu", name, i);
    json_decref(h);
    kube_lease_free(&l);
    return rc;
}

/* One round of history_lost: 0 when done or nothing to mark. */
static int kube_lost_once(kube_store *s, const char *name, const char *key,
                          const char *owner, uint64_t token)
{
    lease_history_entry e;
    kube_lease l;
    json_t *h;
    long at;
    int rc = kube_get(&l, s, name, key);

    if (rc == KUBE_NOTFOUND)
        return 0;
    if (rc < 0)
        return rc;
    h = kube_history_of(l.obj);
    at = h ? kube_history_find(h, token, owner, &e) : -1;
    if (at >= 0 && e.ended != LEASE_ENDED_RELEASED && e.ended != LEASE_ENDED_LOST) {
        int64_t ended = e.ended_ms;

        if (ended == 0)
            ended = l.token == token && l.has_renew
                        ? l.renew_us / 1000 + l.duration_s * 1000
                        : kube_wall_us() / 1000;
        kube_history_end(h, (size_t)at, LEASE_ENDED_LOST, ended);
        rc = kube_prepare(l.obj) < 0 || kube_set_history(l.obj, h) < 0
                 ? lease__seterr(LEASE_ENOMEM, "out of memory")
                 : kube_write(s, name, l.obj, 0, "history");
    }
    json_decref(h);
    kube_lease_free(&l);
    return rc;
}

static int kube_history_lost(lease_store *base, const char *key, const char *owner,
                             uint64_t token)
{
    kube_store *s = (kube_store *)base;
    char name[NAME_MAX_K + 1];
    int rc = KUBE_CONFLICT, i;

    kube_begin(s);
    if (kube_key_name(name, key) < 0)
        return LEASE_ESTORE;
    for (i = 0; i < CAS_TRIES && rc == KUBE_CONFLICT; i++)
        rc = kube_lost_once(s, name, key, owner, token);
    return rc == KUBE_CONFLICT ? lease__seterr(LEASE_ESTORE, "kubernetes history on %s: "
                                               "'%.255s' kept changing",
                                               s->parent.url_redacted, key)
                               : rc;
}

/* ---- waits: a watch on the object ----------------------------------------- */

typedef struct {
    kube_store *s;
    const char *name;
    char holder[LEASE_OWNER_BUFSZ + 1024];
    int rc;             /* an event that could not be decoded: its error */
} watch_ctx;

/* One watch event: stop when the holder changed or the object went, or on
 * an ERROR (410 Gone ...: the core reads again), or on an object that does
 * not read as a Lease (the core's read says what is wrong). A renewal is
 * noted as a new record seen (rule (a) restarts; rule (b) may learn that
 * the holder's clock is behind). An event that would cost more to decode
 * than an answer may, or not by the wait's deadline, ends the wait with
 * its error (w->rc). */
static int kube_on_event(const char *line, size_t n, void *arg)
{
    watch_ctx *w = arg;
    json_t *ev, *obj;
    const char *type, *name;
    kube_lease l;
    int stop = 0;

    if ((w->rc = kube_json(&ev, line, n, w->s->end_ns, "watch")) < 0)
        return 1;
    obj = json_object_get(ev, "object");
    type = json_string_value(json_object_get(ev, "type"));
    name = json_string_value(json_object_get(json_object_get(obj, "metadata"), "name"));
    if (type == NULL || strcmp(type, "ERROR") == 0)
        stop = 1; /* a Status, or not an event: end the wait, the core retries */
    else if (name && strcmp(name, w->name) == 0) {
        if (strcmp(type, "DELETED") == 0 ||
            kube_lease_from(&l, json_incref(obj), -1, w->name, NULL) < 0)
            stop = 1;
        else {
            if (strcmp(l.holder, w->holder) != 0)
                stop = 1;
            else
                kube_seen_note(w->s, w->name, &l, lease_clock_ns());
            kube_lease_free(&l);
        }
    }
    json_decref(ev);
    return stop;
}

/* "…&resourceVersion=RV": the opaque rv, percent-encoded for the query. */
static void kube_query_escape(char *out, size_t size, const char *in)
{
    size_t o = 0;

    for (; *in && o + 4 < size; in++) {
        unsigned char c = (unsigned char)*in;

        if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, size - o, "%%%02X", c);
    }
    out[o] = '\0';
}

/* Watch `name` from rv for at most bound_ms: 0 woken (or the stream
 * ended: the core reads again), LEASE_ETIMEOUT, or an error. */
static int kube_watch(kube_store *s, watch_ctx *w, const char *rv, uint64_t bound_ms)
{
    char path[1024], erv[3 * RV_MAX + 4]; /* every byte escaped, never cut */
    lease__http_answer a;
    int rc;

    kube_query_escape(erv, sizeof(erv), rv);
    kube_path(path, sizeof(path), s, NULL);
    snprintf(path + strlen(path), sizeof(path) - strlen(path),
             "?watch=1&fieldSelector=metadata.name%%3D%s&resourceVersion=%s"
             "&timeoutSeconds=%llu&allowWatchBookmarks=true",
             w->name, erv, (unsigned long long)(bound_ms / 1000 + 1));
    s->end_ns = lease_clock_ns() + (int64_t)bound_ms * 1000000;
    rc = kube_exchange(&a, s, "GET", path, NULL, NULL, "watch", kube_on_event, w);
    if (rc == 0 && w->rc < 0)
        rc = w->rc;
    else if (rc == 0 && !a.stopped && a.status >= 300) {
        json_t *j;

        /* 410 Gone: the rv left the server's window; the core reads again. */
        if ((rc = kube_json(&j, a.data, a.len, s->end_ns, "watch")) == 0 && a.status != 410)
            rc = kube_refused(s, a.status, j, "watch");
        json_decref(j);
    }
    lease__http_answer_free(&a);
    return rc;
}

static int kube_wait_release(lease_store *base, const char *key, uint64_t timeout_ms)
{
    kube_store *s = (kube_store *)base;
    watch_ctx w;
    char name[NAME_MAX_K + 1], rv[RV_MAX + 1];
    uint64_t left = 0, bound, spent;
    int64_t t0;
    kube_lease l;
    int rc;

    /* A watch costs a request; for a pause this short, just pause. */
    if (timeout_ms < 20) {
        lease__sleep_ns((int64_t)timeout_ms * 1000000);
        return LEASE_ETIMEOUT;
    }
    if (kube_key_name(name, key) < 0)
        return LEASE_ESTORE;
    t0 = lease_clock_ns();
    /* The read is one call like any other; the watch gets the wait. */
    s->end_ns = t0 +
                (int64_t)(timeout_ms < s->parent.timeout_ms ? timeout_ms
                                                            : s->parent.timeout_ms) * 1000000;
    if ((rc = kube_get_listed(&l, rv, s, name, key)) == KUBE_NOTFOUND)
        return 0;
    if (rc < 0)
        return rc;
    rc = kube_expired(s, name, &l, 1, &left);
    memset(&w, 0, sizeof(w));
    w.s = s;
    w.name = name;
    lease__strlcpy(w.holder, l.holder, sizeof(w.holder));
    kube_lease_free(&l);
    if (rc)
        return 0; /* free, or may be taken now */
    /* What the read left of the wait. */
    spent = (uint64_t)((lease_clock_ns() - t0) / 1000000);
    if (spent >= timeout_ms)
        return LEASE_ETIMEOUT;
    timeout_ms -= spent;
    /* Bounded by when the lease may have expired, so that a holder that
     * stops renewing (no event at all) wakes the waiter too. */
    bound = left + 50 < timeout_ms ? left + 50 : timeout_ms;
    rc = kube_watch(s, &w, rv, bound);
    if (rc == LEASE_ETIMEOUT)
        return bound < timeout_ms ? 0 : LEASE_ETIMEOUT;
    return rc;
}

/* ---- open, close ------------------------------------------------------------ */

static void kube_close(lease_store *base)
{
    kube_store *s = (kube_store *)base;

    lease__http_free(s->http);
    s->http = NULL;
    kube_token_drop(s);
    free(s->base);
    free(s->token_file);
    free(s->cacert);
}

/* "host:port" or "[v6]:port", checked before any connection. */
static int kube_host_valid(const char *p)
{
    size_t n = strlen(p), i;
    const char *colon = strrchr(p, ':');

    if (n == 0 || n > 255 || colon == NULL || colon == p || colon[1] == '\0' ||
        strlen(colon + 1) > 5 || atoi(colon + 1) < 1 || atoi(colon + 1) > 65535)
        return 0;
    for (i = 0; p + i < colon; i++)
        if (!isalnum((unsigned char)p[i]) && !strchr(".-_[]:", p[i]))
            return 0;
    for (i = 1; colon[i]; i++)
        if (!isdigit((unsigned char)colon[i]))
            return 0;
    return p[0] != '[' || colon[-1] == ']';
}

/* In a pod: the API server from KUBERNETES_SERVICE_HOST/PORT. */
static int kube_in_cluster(char *out, size_t size)
{
    const char *h = getenv("KUBERNETES_SERVICE_HOST"), *p = getenv("KUBERNETES_SERVICE_PORT");

    if (h == NULL || *h == '\0')
        return lease__seterr(LEASE_EINVALID, "kubernetes:///NAMESPACE is for a pod: "
                             "KUBERNETES_SERVICE_HOST is not set (give host:port)");
    snprintf(out, size, strchr(h, ':') ? "[%s]:%s" : "%s:%s", h, p && *p ? p : "443");
    if (!kube_host_valid(out))
        return lease__seterr(LEASE_EINVALID, "KUBERNETES_SERVICE_HOST/PORT is not a "
                             "host and port: '%.200s'", out);
    return 0;
}

static int kube_parse_params(kube_store *s, const lease__url *u, int tls)
{
    size_t i;

    for (i = 0; i < u->nparams; i++) {
        const char *name = u->params[i].name, *v = u->params[i].value ? u->params[i].value : "";
        char **slot = strcmp(name, "token_file") == 0 ? &s->token_file
                      : strcmp(name, "cacert") == 0   ? &s->cacert
                                                      : NULL;
        char *end;

        if (strcmp(name, "tokens") == 0)
            continue; /* read by lease__url_tokens, below */
        if (strcmp(name, "max_skew") == 0) {
            long x = strtol(v, &end, 10);

            if (*v == '\0' || *end || x < 0 || x > 3600)
                return lease__seterr(LEASE_EINVALID, "?max_skew= takes 0..3600 seconds");
            s->max_skew_s = (int)x;
            continue;
        }
        if (slot == NULL)
            return lease__seterr(LEASE_EINVALID, "unknown kubernetes URL parameter '%.64s' "
                                 "(known: token_file, cacert, max_skew, tokens)", name);
        if (slot == &s->cacert && !tls)
            return lease__seterr(LEASE_EINVALID, "?cacert= is for kubernetes:// (HTTPS)");
        if (*slot || *v == '\0')
            return lease__seterr(LEASE_EINVALID, "?%s= is given twice or empty", name);
        if ((*slot = strdup(v)) == NULL)
            return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    if (lease__url_tokens(&s->tokens, u) < 0)
        return LEASE_EINVALID;
    /* HTTPS defaults to the mounted service account's token and CA. */
    if (tls && s->token_file == NULL && (s->token_file = strdup(SA_DIR "token")) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    if (tls && s->cacert == NULL && access(SA_DIR "ca.crt", R_OK) == 0 &&
        (s->cacert = strdup(SA_DIR "ca.crt")) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    if (s->cacert && access(s->cacert, R_OK) != 0)
        return lease__seterr(LEASE_EINVALID, "?cacert=: cannot read '%.200s'", s->cacert);
    return 0;
}

/* host:port names this host: 127.0.0.0/8, [::1] or localhost. */
static int kube_loopback(const char *hostport)
{
    size_t n = strcspn(hostport, ":");

    /* 127.x.y.z in digits and dots only: "127.example.com" is a name. */
    if (strncmp(hostport, "127.", 4) == 0 && hostport[n] == ':')
        return strspn(hostport, "0123456789.") == n;
    return strncmp(hostport, "[::1]:", 6) == 0 || strncasecmp(hostport, "localhost:", 10) == 0;
}

static int kube_parse_url(kube_store *s, const lease__url *u)
{
    int tls = strcmp(u->scheme, "kubernetes") == 0;
    const char *ns = u->path[0] == '/' ? u->path + 1 : u->path;
    char host[300];
    int rc;

    s->max_skew_s = 2;
    if (!u->has_authority || u->user || u->password)
        return lease__seterr(LEASE_EINVALID, "a kubernetes URL is kubernetes://HOST:PORT/"
                             "NAMESPACE, kubernetes:///NAMESPACE or kubernetes+http://"
                             "HOST:PORT/NAMESPACE (no user or password: ?token_file=)");
    if (!kube_dns_label(ns, strlen(ns)))
        return lease__seterr(LEASE_EINVALID, "kubernetes namespace '%.200s' is not a DNS "
                             "label (1-63 of a-z, 0-9 and '-', alphanumeric at both ends)", ns);
    strcpy(s->ns, ns);
    if (*u->hosts == '\0' && !tls)
        return lease__seterr(LEASE_EINVALID, "kubernetes+http:// names its host and port");
    if (*u->hosts == '\0' && (rc = kube_in_cluster(host, sizeof(host))) < 0)
        return rc;
    if (*u->hosts && (strlen(u->hosts) >= sizeof(host) || !kube_host_valid(u->hosts)))
        return lease__seterr(LEASE_EINVALID, "bad host '%.64s' in the kubernetes URL: "
                             "expected host:port or [v6 address]:port", u->hosts);
    if (*u->hosts)
        strcpy(host, u->hosts);
    if (!tls && !kube_loopback(host))
        return lease__seterr(LEASE_EINVALID, "kubernetes+http:// is plain HTTP, for a "
                             "server on this host only (127.0.0.0/8, [::1], localhost): "
                             "the bearer token would cross the network in clear; use "
                             "kubernetes://");
    if (asprintf(&s->base, "%s://%s", tls ? "https" : "http", host) < 0) {
        s->base = NULL;
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    }
    return kube_parse_params(s, u, tls);
}

/* Is this a Kubernetes API server with Leases? Asked at open, so that a
 * wrong URL fails there with a clear message. */
static int kube_probe(kube_store *s)
{
    lease__http_answer a;
    json_t *j, *r;
    size_t i;
    int rc = kube_exchange(&a, s, "GET", GROUP_PATH, NULL, NULL, "connect", NULL, NULL);
    int found = 0;

    if (rc < 0)
        return rc;
    if ((rc = kube_json(&j, a.data, a.len, s->end_ns, "connect")) < 0) {
        lease__http_answer_free(&a);
        return rc;
    }
    json_array_foreach(json_object_get(j, "resources"), i, r)
        found |= json_is_string(json_object_get(r, "name")) &&
                 strcmp(json_string_value(json_object_get(r, "name")), "leases") == 0;
    /* 401 and 403 say what is wrong with the credentials; a 5xx is a
     * server in trouble; anything else without Leases is no Kubernetes. */
    if (a.status == 401 || a.status == 403 || a.status >= 500)
        rc = kube_refused(s, a.status, j, "connect");
    else if (a.status != 200 || !found)
        rc = lease__seterr(LEASE_ESTORE, "kubernetes open of %s: not a Kubernetes API "
                           "server (HTTP %ld and no leases at " GROUP_PATH ")",
                           s->parent.url_redacted, a.status);
    json_decref(j);
    lease__http_answer_free(&a);
    return rc;
}

static int kube_open(lease_store *base, const char *url)
{
    kube_store *s = (kube_store *)base;
    lease__url u;
    int rc;

    if ((rc = lease__url_parse(&u, url)) < 0)
        return rc;
    rc = kube_parse_url(s, &u);
    lease__url_free(&u);
    if (rc == 0 && s->token_file)
        rc = kube_token_read(s);
    if (rc == 0 && (s->http = lease__http_new(&s->parent, strstr(s->base, "://") + 3)) == NULL)
        rc = lease__seterr(LEASE_ENOMEM, "cannot start libcurl");
    kube_begin(s);
    if (rc == 0)
        rc = kube_probe(s);
    if (rc < 0)
        kube_close(&s->parent);
    return rc;
}

/* For lease --version: libcurl and jansson as linked at run time. */
int lease__kubernetes_client_version(char *buf, size_t size)
{
    char curl[64];

    lease__http_client_version(curl, sizeof(curl));
    return snprintf(buf, size, "%s, jansson %s", curl, jansson_version_str());
}

const lease_backend lease__kubernetes_backend = {
    .version = LEASE_BACKEND_VERSION,
    .name = "kubernetes",
    .schemes = lease__kubernetes_schemes,
    .features = LEASE_FEATURE_NOTIFY | LEASE_FEATURE_ROUNDS_TTL,
    .store_size = sizeof(kube_store),
    .open3 = kube_open,
    .close = kube_close,
    .acquire = kube_acquire,
    .renew = kube_renew,
    .release = kube_release,
    .inspect = kube_inspect,
    .list = kube_list,
    .fence_advance = kube_fence_advance,
    .fence_mark = kube_fence_mark,
    .guarded_put = kube_guarded_put,
    .data_get = kube_data_get,
    .wait_release = kube_wait_release,
    .history = kube_history,
    .history_lost = kube_history_lost,
};
