/*
 * url.c - splitting store URLs, percent-decoding, and hiding passwords.
 *
 * Accepted form: scheme:[//[user[:password]@]hosts][path][?name=value&...]
 * "hosts" is kept raw (it may list several host:port pairs); the stores
 * split it themselves.
 */
#define _GNU_SOURCE /* strcasestr */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lease_int.h"

int lease__hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decode %XX escapes of s[0..n) into a new string; NULL on a bad escape or
 * an escaped NUL (which no C string could carry). */
static char *decode(const char *s, size_t n, int plus_is_space)
{
    char *out = malloc(n + 1), *o = out;
    size_t i;

    if (out == NULL)
        return NULL;
    for (i = 0; i < n; i++) {
        if (s[i] == '%') {
            int h, l;
            if (i + 2 >= n)
                goto bad;
            h = lease__hexval((unsigned char)s[i + 1]);
            l = lease__hexval((unsigned char)s[i + 2]);
            if (h < 0 || l < 0 || (h == 0 && l == 0))
                goto bad;
            *o++ = (char)(h * 16 + l);
            i += 2;
        } else if (plus_is_space && s[i] == '+') {
            *o++ = ' ';
        } else {
            *o++ = s[i];
        }
    }
    *o = '\0';
    return out;
bad:
    free(out);
    return NULL;
}

int lease__url_scheme(char *buf, size_t size, const char *text)
{
    size_t i;

    if (text == NULL || !isalpha((unsigned char)text[0]))
        return LEASE_EINVALID;
    for (i = 0; text[i] && text[i] != ':'; i++) {
        unsigned char c = (unsigned char)text[i];
        if (!isalnum(c) && c != '+' && c != '-' && c != '.')
            return LEASE_EINVALID;
        if (i + 1 >= size)
            return LEASE_EINVALID;
        buf[i] = (char)tolower(c);
    }
    if (text[i] != ':')
        return LEASE_EINVALID;
    buf[i] = '\0';
    return 0;
}

static int parse_query(lease__url *u, const char *q)
{
    while (*q) {
        const char *amp = strchr(q, '&'), *eq;
        size_t n = amp ? (size_t)(amp - q) : strlen(q);
        lease__url_kv *p;

        if (n > 0) {
            eq = memchr(q, '=', n);
            p = realloc(u->params, (u->nparams + 1) * sizeof(*p));
            if (p == NULL)
                return LEASE_ENOMEM;
            u->params = p;
            p = &u->params[u->nparams];
            p->name = decode(q, eq ? (size_t)(eq - q) : n, 1);
            p->value = eq ? decode(eq + 1, n - (size_t)(eq - q) - 1, 1)
                          : decode("", 0, 0);
            u->nparams++;
            if (p->name == NULL || p->value == NULL)
                return LEASE_EINVALID;
        }
        q += n;
        if (*q == '&')
            q++;
    }
    return 0;
}

/*
 * The user info, when an '@' follows "scheme://". Readers of URLs disagree
 * on where it ends: libpq at the first '@' before any '/', hiredis-style
 * splitters and libcurl elsewhere, some at the last '@'. A split other than
 * ours shows part of the password as a host name or a path in their
 * messages, so we accept only the form every reader splits alike: one '@',
 * with no '/' or '?' before it. Anything else is EINVALID, with a message
 * that quotes nothing of the URL.
 */
static int url_split_userinfo(lease__url *u, const char **auth)
{
    const char *a = *auth, *at = strrchr(a, '@'), *colon;

    /* "scheme:///path": no authority, so an '@' is part of the path
     * (a home directory may hold one) and no reader takes it otherwise. */
    if (at == NULL || *a == '/')
        return 0;
    if (memchr(a, '@', (size_t)(at - a)) != NULL)
        return lease__seterr(LEASE_EINVALID,
                             "the store URL has more than one '@': write an '@' "
                             "in a user name, password or parameter as %%40");
    if (strcspn(a, "/?") < (size_t)(at - a))
        return lease__seterr(LEASE_EINVALID,
                             "the store URL has an '@' after a '/' or '?': write "
                             "'@', '/' and '?' in a user name, password or "
                             "parameter as %%40, %%2F and %%3F");
    colon = memchr(a, ':', (size_t)(at - a));
    u->user = decode(a, (size_t)((colon ? colon : at) - a), 0);
    if (colon)
        u->password = decode(colon + 1, (size_t)(at - colon - 1), 0);
    if (u->user == NULL || (colon && u->password == NULL))
        return lease__seterr(LEASE_EINVALID,
                             "bad escape in the store URL's user info");
    *auth = at + 1;
    return 0;
}

int lease__url_parse(lease__url *u, const char *text)
{
    char scheme[32];
    const char *p, *q, *path_end;
    int rc;

    memset(u, 0, sizeof(*u));
    if (lease__url_scheme(scheme, sizeof(scheme), text) < 0)
        return lease__seterr(LEASE_EINVALID,
                             "store URL must start with a scheme, "
                             "e.g. sqlite:///var/lib/app/lease.db");
    if ((u->scheme = strdup(scheme)) == NULL)
        return LEASE_ENOMEM;
    p = text + strlen(scheme) + 1;
    if (strncmp(p, "//", 2) == 0) {
        const char *auth = p + 2, *auth_end;

        u->has_authority = 1;
        if ((rc = url_split_userinfo(u, &auth)) < 0)
            goto fail;
        auth_end = auth + strcspn(auth, "/?");
        u->hosts = strndup(auth, (size_t)(auth_end - auth));
        p = auth_end;
    } else {
        u->hosts = strdup("");
    }
    q = strchr(p, '?');
    path_end = q ? q : p + strlen(p);
    u->path = decode(p, (size_t)(path_end - p), 0);
    if (u->hosts == NULL || u->path == NULL) {
        rc = lease__seterr(LEASE_EINVALID, "bad escape in the store URL's path");
        goto fail;
    }
    if (q && (rc = parse_query(u, q + 1)) < 0) {
        rc = lease__seterr(rc, "bad parameter in the store URL");
        goto fail;
    }
    return 0;
fail:
    lease__url_free(u);
    return rc;
}

void lease__url_free(lease__url *u)
{
    size_t i;

    if (u == NULL)
        return;
    for (i = 0; i < u->nparams; i++) {
        free(u->params[i].name);
        lease__free_secret(u->params[i].value); /* a ?password=, a ?token= */
    }
    free(u->params);
    free(u->scheme);
    free(u->user);
    lease__free_secret(u->password);
    free(u->hosts);
    free(u->path);
    memset(u, 0, sizeof(*u));
}

const char *lease__url_param(const lease__url *u, const char *name)
{
    size_t i;

    /* The last one wins, as in most URL readers. */
    for (i = u->nparams; i > 0; i--)
        if (strcmp(u->params[i - 1].name, name) == 0)
            return u->params[i - 1].value;
    return NULL;
}

/*
 * ?tokens=clock|counter, for the stores whose token counter can be lost
 * (Redis and PostgreSQL on a failover to a replica that lacks the last
 * grants, Kubernetes with a Lease object deleted): clock (the default)
 * floors a new grant's token at the server's clock in microseconds, so
 * that a counter that went back still issues newer tokens; counter is the
 * plain +1.
 */
int lease__url_tokens(int *mode, const lease__url *u)
{
    const char *v = lease__url_param(u, "tokens");

    *mode = LEASE__TOKENS_CLOCK;
    if (v == NULL || strcmp(v, "clock") == 0)
        return 0;
    if (strcmp(v, "counter") == 0) {
        *mode = LEASE__TOKENS_COUNTER;
        return 0;
    }
    return lease__seterr(LEASE_EINVALID, "tokens=%.32s: use tokens=clock (the "
                         "default) or tokens=counter", v);
}

/* ?tokens= on a store whose counter is never lost (SQLite, etcd): refused
 * with one list of the stores that take it (above), and the store's `why`. */
int lease__url_tokens_refused(const char *why)
{
    return lease__seterr(LEASE_EINVALID, "tokens= is for the stores whose token "
                         "counter can be lost (redis, postgres, kubernetes): %s",
                         why);
}

/*
 * A query parameter whose value is a secret: any whose decoded name holds
 * "password" (libpq's password and sslpassword, and whatever a later store
 * adds), "secret" or "token", in any case, unless it names a file. Hiding a harmless value costs
 * nothing; showing a secret one cannot be undone.
 */
int lease__url_secret_param(const char *name)
{
    static const char *const words[] = { "password", "secret", "token" };
    size_t i, n = strlen(name);

    /* ...but not a file that holds one (redis' password_file=): its path
     * is no secret, and the store's messages about it must name it. */
    if (n >= 5 && strcasecmp(name + n - 5, "_file") == 0)
        return 0;
    /* ...nor tokens=clock|counter, how tokens are made: registering "clock"
     * as a secret would scrub that word from every message. */
    if (strcasecmp(name, "tokens") == 0)
        return 0;
    for (i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        if (strcasestr(name, words[i]) != NULL)
            return 1;
    return 0;
}

/* Where user info may start: after "scheme://"; else at the scheme's
 * ':' itself, which a reader of "scheme:user:password@host" may take as
 * the one before the password (and "u:pw@h" may have no scheme at all). */
static const char *url_body(const char *text)
{
    char scheme[32];
    size_t n;

    if (lease__url_scheme(scheme, sizeof(scheme), text) < 0)
        return text;
    n = strlen(scheme);
    return strncmp(text + n, "://", 3) == 0 ? text + n + 3 : text + n;
}

/*
 * The span that some reader may take as the user info's password: from
 * the first ':' to the LAST '@' (a reader that stops at the first '@' sees
 * a part of it). Wider than what our parser accepts, on purpose: the
 * redactor and the secret registry must cover every reader, and URLs the
 * parser refuses too, since their messages may quote them.
 */
static int url_password_span(const char *text, const char **from, const char **to)
{
    const char *body = url_body(text), *at = strrchr(body, '@'), *colon;

    if (at == NULL)
        return 0;
    colon = memchr(body, ':', (size_t)(at - body));
    if (colon == NULL)
        return 0;
    *from = colon + 1;
    *to = at;
    return 1;
}

/* Append s[0..n) to the buffer at *o. */
static void put(char **o, const char *s, size_t n)
{
    memcpy(*o, s, n);
    *o += n;
}

/* Whether the query item s[0..n) ("name=value") has a secret value; a name
 * that does not decode is taken as secret, to be safe. */
static int url_item_secret(const char *s, size_t n, const char **eq)
{
    char *name;
    int secret;

    *eq = memchr(s, '=', n);
    if (*eq == NULL)
        return 0;
    name = decode(s, (size_t)(*eq - s), 1);
    secret = name == NULL || lease__url_secret_param(name);
    free(name);
    return secret;
}

/* Mark the values of secret parameters among the items after q[-1]. */
static void url_mark_params(char *hide, const char *text, const char *q)
{
    while (*q) {
        size_t n = strcspn(q, "&");
        const char *eq;

        if (url_item_secret(q, n, &eq))
            memset(hide + (eq + 1 - text), 1, n - (size_t)(eq + 1 - q));
        q += n;
        if (*q == '&')
            q++;
    }
}

/*
 * Which bytes some reader may take as a secret: the user info's password
 * (url_password_span), and the values of secret parameters, read both from
 * the first '?' of all (a '?' inside a password starts the query for some)
 * and from the first '?' after the user info. A secret value may run past
 * the user info's end (an '@' in it): the marks overlap, and merge.
 */
static char *url_hidden(const char *text, size_t len)
{
    char *hide = calloc(len + 1, 1);
    const char *from, *to = text, *q;

    if (hide == NULL)
        return NULL;
    if (url_password_span(text, &from, &to))
        memset(hide + (from - text), 1, (size_t)(to - from));
    if ((q = strchr(text, '?')) != NULL)
        url_mark_params(hide, text, q + 1);
    if ((q = strchr(to, '?')) != NULL)
        url_mark_params(hide, text, q + 1);
    return hide;
}

char *lease__url_redact(const char *text)
{
    size_t len, i;
    char *out, *o, *hide;

    if (text == NULL)
        return strdup("");
    len = strlen(text);
    /* Every run of hidden bytes becomes "***": at most 3 bytes per byte. */
    out = malloc(len * 3 + 1);
    hide = url_hidden(text, len);
    if (out == NULL || hide == NULL) {
        free(out);
        free(hide);
        return NULL;
    }
    for (o = out, i = 0; i < len; i++) {
        if (!hide[i])
            *o++ = text[i];
        else if (i == 0 || !hide[i - 1])
            put(&o, "***", 3);
    }
    *o = '\0';
    free(hide);
    return out;
}

/* Percent-encode every byte but the unreserved ones, as a URL writer would. */
static char *url_encode(const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    char *out = malloc(strlen(s) * 3 + 1), *o = out;

    if (out == NULL)
        return NULL;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
            *o++ = (char)c;
        } else {
            *o++ = '%';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
        }
    }
    *o = '\0';
    return out;
}

/* Call fn for s[0..n) as written, decoded both ways, and re-encoded. */
static int url_emit_forms(const char *s, size_t n, lease__secret_fn fn, void *arg)
{
    char *raw = strndup(s, n), *forms[4] = { NULL, NULL, NULL, NULL };
    int rc = 0, i;

    if (raw == NULL)
        return LEASE_ENOMEM;
    forms[0] = decode(s, n, 0);
    forms[1] = decode(s, n, 1);
    forms[2] = forms[0] ? url_encode(forms[0]) : NULL;
    rc = fn(raw, arg);
    for (i = 0; i < 3 && rc == 0; i++)
        if (forms[i] != NULL)
            rc = fn(forms[i], arg);
    for (i = 0; i < 3; i++)
        free(forms[i]);
    free(raw);
    return rc;
}

/* The user info's password, whole and as the pieces that a reader which
 * splits it at '/', '?', '#' or '@' may quote (pieces of 4 bytes or more:
 * shorter ones would hide too much of every message). */
static int url_password_secrets(const char *text, lease__secret_fn fn, void *arg)
{
    const char *from, *to, *p;
    int rc;

    if (!url_password_span(text, &from, &to))
        return 0;
    if ((rc = url_emit_forms(from, (size_t)(to - from), fn, arg)) < 0)
        return rc;
    for (p = from; p < to;) {
        size_t n = strcspn(p, "/?#@");

        if (p + n > to)
            n = (size_t)(to - p);
        if (n >= 4 && n < (size_t)(to - from) &&
            (rc = url_emit_forms(p, n, fn, arg)) < 0)
            return rc;
        p += n + 1;
    }
    return 0;
}

/* The values of secret parameters among the items after q[-1]. */
static int url_param_secrets(const char *q, lease__secret_fn fn, void *arg)
{
    int rc;

    while (*q) {
        size_t n = strcspn(q, "&");
        const char *eq;

        if (url_item_secret(q, n, &eq) &&
            (rc = url_emit_forms(eq + 1, n - (size_t)(eq + 1 - q), fn, arg)) < 0)
            return rc;
        q += n;
        if (*q == '&')
            q++;
    }
    return 0;
}

int lease__url_secrets(const char *text, lease__secret_fn fn, void *arg)
{
    const char *from, *to = text, *q;
    int rc;

    if (text == NULL)
        return 0;
    if ((rc = url_password_secrets(text, fn, arg)) < 0)
        return rc;
    url_password_span(text, &from, &to);
    /* As url_hidden reads them: from the first '?' of all, and from the
     * first after the user info. */
    if ((q = strchr(text, '?')) != NULL && (rc = url_param_secrets(q + 1, fn, arg)) < 0)
        return rc;
    if ((q = strchr(to, '?')) != NULL && (rc = url_param_secrets(q + 1, fn, arg)) < 0)
        return rc;
    return 0;
}
