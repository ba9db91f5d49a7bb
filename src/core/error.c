/*
 * error.c - the error table and the per-thread message of the last error.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "lease_int.h"

static _Thread_local char errmsg[LEASE__ERRMSG_SIZE];
static _Thread_local int errcode;

const char *lease_error_name(int code)
{
    switch (code) {
    case 0:
        return "OK";
#define NAME_(name, value, msg) \
    case value:                 \
        return #name;
        LEASE_ERROR_MAP(NAME_)
#undef NAME_
    default:
        return "EUNKNOWN";
    }
}

const char *lease_strerror(int code)
{
    switch (code) {
    case 0:
        return "success";
#define MSG_(name, value, msg) \
    case value:                \
        return msg;
        LEASE_ERROR_MAP(MSG_)
#undef MSG_
    default:
        return "unknown error";
    }
}

const char *lease_errmsg(void)
{
    return errmsg;
}

int lease_errcode(void)
{
    return errcode;
}

void lease_error_clear(void)
{
    errmsg[0] = '\0';
    errcode = 0;
}

/* ---- secrets: the registry that every message is scrubbed against ---- */

/*
 * Secrets shorter than this are still scrubbed (a short password is still
 * a password), but only where they stand alone, not inside a run of
 * letters and digits: a password "ab" must not turn every "table" of a
 * message into "t**le". A URL quoted in a message delimits its password
 * (':' before, '@' after; '=' and '&' around a parameter), so the echoes
 * that matter are caught.
 */
#define SECRET_SHORT 4

typedef struct {
    char *text;
    size_t len;
    unsigned refs;
} secret_entry;

static pthread_mutex_t secrets_lock = PTHREAD_MUTEX_INITIALIZER;
static secret_entry *secrets;   /* longest first: a secret inside another */
static size_t nsecrets, capsecrets; /* one is replaced after it */

static secret_entry *secret_find(const char *text)
{
    size_t i;

    for (i = 0; i < nsecrets; i++)
        if (strcmp(secrets[i].text, text) == 0)
            return &secrets[i];
    return NULL;
}

static int secret_add_one(const char *text)
{
    secret_entry *e = secret_find(text), *grown;
    size_t len = strlen(text), i;

    if (len == 0)
        return 0;
    if (e != NULL) {
        e->refs++;
        return 0;
    }
    if (nsecrets == capsecrets) {
        size_t cap = capsecrets ? capsecrets * 2 : 16;
        if ((grown = realloc(secrets, cap * sizeof(*grown))) == NULL)
            return LEASE_ENOMEM;
        secrets = grown;
        capsecrets = cap;
    }
    for (i = nsecrets; i > 0 && secrets[i - 1].len < len; i--)
        secrets[i] = secrets[i - 1];
    if ((secrets[i].text = strdup(text)) == NULL) {
        for (; i < nsecrets; i++)
            secrets[i] = secrets[i + 1];
        return LEASE_ENOMEM;
    }
    secrets[i].len = len;
    secrets[i].refs = 1;
    nsecrets++;
    return 0;
}

static int secret_drop_one(const char *text)
{
    secret_entry *e = secret_find(text);
    size_t i;

    if (e == NULL || --e->refs > 0)
        return 0;
    memset(e->text, 0, e->len);
    free(e->text);
    for (i = (size_t)(e - secrets); i + 1 < nsecrets; i++)
        secrets[i] = secrets[i + 1];
    nsecrets--;
    return 0;
}

/* A secret as a JSON string shows it (log lines, the CLI's --json):
 * '"', '\\', control and, with ENSURE_ASCII, non-ASCII bytes escaped. */
static int secret_each_form(const char *text, int (*op)(const char *))
{
    static const size_t flags[2] = { JSON_ENCODE_ANY,
                                     JSON_ENCODE_ANY | JSON_ENSURE_ASCII };
    json_t *j = json_string(text);
    int rc = op(text), i;

    for (i = 0; i < 2 && j != NULL && rc == 0; i++) {
        char *dump = json_dumps(j, flags[i]);
        size_t n = dump ? strlen(dump) : 0;

        if (n >= 2 && (n - 2 != strlen(text) || memcmp(dump + 1, text, n - 2))) {
            dump[n - 1] = '\0';
            rc = op(dump + 1);
        }
        free(dump);
    }
    json_decref(j);
    return rc;
}

int lease__secret_hold(const char *secret)
{
    int rc;

    pthread_mutex_lock(&secrets_lock);
    rc = secret_each_form(secret, secret_add_one);
    pthread_mutex_unlock(&secrets_lock);
    return rc < 0 ? LEASE_ENOMEM : 0;
}

void lease__secret_release(const char *secret)
{
    pthread_mutex_lock(&secrets_lock);
    secret_each_form(secret, secret_drop_one);
    pthread_mutex_unlock(&secrets_lock);
}

static int secret_hold_cb(const char *text, void *arg)
{
    (void)arg;
    return secret_each_form(text, secret_add_one);
}

static int secret_release_cb(const char *text, void *arg)
{
    (void)arg;
    return secret_each_form(text, secret_drop_one);
}

int lease__secrets_hold(const char *url)
{
    int rc;

    pthread_mutex_lock(&secrets_lock);
    rc = lease__url_secrets(url, secret_hold_cb, NULL);
    pthread_mutex_unlock(&secrets_lock);
    return rc < 0 ? LEASE_ENOMEM : 0;
}

void lease__secrets_release(const char *url)
{
    pthread_mutex_lock(&secrets_lock);
    lease__url_secrets(url, secret_release_cb, NULL);
    pthread_mutex_unlock(&secrets_lock);
}

static int secret_word_byte(const char *p)
{
    return isalnum((unsigned char)*p);
}

/* Replace the occurrences of e in buf; "***", or as many '*' when shorter. */
static void secret_scrub_entry(char *buf, const secret_entry *e)
{
    size_t rep = e->len < 3 ? e->len : 3;
    char *p = buf;

    while ((p = strstr(p, e->text)) != NULL) {
        if (e->len < SECRET_SHORT &&
            ((p > buf && secret_word_byte(p - 1)) || secret_word_byte(p + e->len))) {
            p++;
            continue;
        }
        memset(p, '*', rep);
        memmove(p + rep, p + e->len, strlen(p + e->len) + 1);
        p += rep;
    }
}

void lease__scrub(char *buf)
{
    size_t i;

    if (buf == NULL)
        return;
    pthread_mutex_lock(&secrets_lock);
    for (i = 0; i < nsecrets; i++)
        secret_scrub_entry(buf, &secrets[i]);
    pthread_mutex_unlock(&secrets_lock);
}

int lease_store_seterr(int code, const char *fmt, ...)
{
    char small[4 * LEASE__ERRMSG_SIZE], *buf = small;
    va_list ap, again;
    int n;

    /* fmt may use the old message (e.g. to add context), so format aside,
     * whole: scrubbed before it is cut to size, a secret that straddles
     * the cut (a client library may quote a URL of any length) is still
     * whole, and found. */
    va_start(ap, fmt);
    va_copy(again, ap);
    n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof(small) && (buf = malloc((size_t)n + 1)) != NULL)
        vsnprintf(buf, (size_t)n + 1, fmt, again);
    va_end(again);
    if (buf == NULL) {
        /* The cut text may end in the start of a secret: say nothing. */
        lease__strlcpy(errmsg, "(message withheld: out of memory)", sizeof(errmsg));
    } else {
        lease__scrub(buf);
        lease__strlcpy(errmsg, buf, sizeof(errmsg));
        if (buf != small)
            free(buf);
    }
    errcode = code;
    return code;
}

int lease__not_holder(const char *what, const char *key, uint64_t token,
                      const char *tail)
{
    return lease_store_seterr(LEASE_ELOST,
                              "%s%s'%s': token %llu of this owner is no longer "
                              "the unexpired lease%s",
                              what ? what : "", what ? " " : "", key,
                              (unsigned long long)token, tail ? tail : "");
}
