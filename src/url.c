/*
 * url.c - splitting store URLs, percent-decoding, and hiding passwords.
 *
 * Accepted form: scheme:[//[user[:password]@]hosts][path][?name=value&...]
 * "hosts" is kept raw (it may list several host:port pairs); the stores
 * split it themselves.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lease_int.h"

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
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
            h = hexval((unsigned char)s[i + 1]);
            l = hexval((unsigned char)s[i + 2]);
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
        const char *auth = p + 2, *auth_end = auth + strcspn(auth, "/?");
        const char *at = NULL, *s;

        u->has_authority = 1;
        /* A password may hold '@' only escaped (%40). Readers disagree on
         * where an unescaped one ends the user info (libpq takes the first,
         * others the last), and a wrong split shows part of the password
         * as a host name in their errors: refuse it. */
        for (s = auth; s < auth_end; s++) {
            if (*s != '@')
                continue;
            if (at) {
                rc = lease__seterr(LEASE_EINVALID,
                                   "the store URL has more than one '@' before the "
                                   "host: write an '@' in a user name or password "
                                   "as %%40");
                goto fail;
            }
            at = s;
        }
        if (at) {
            const char *colon = memchr(auth, ':', (size_t)(at - auth));
            u->user = decode(auth, (size_t)((colon ? colon : at) - auth), 0);
            if (colon)
                u->password = decode(colon + 1, (size_t)(at - colon - 1), 0);
            if (u->user == NULL || (colon && u->password == NULL)) {
                rc = lease__seterr(LEASE_EINVALID,
                                   "bad escape in the store URL's user info");
                goto fail;
            }
            auth = at + 1;
        }
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
        free(u->params[i].value);
    }
    free(u->params);
    free(u->scheme);
    free(u->user);
    free(u->password);
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

/* Append s[0..n) to the buffer at *o. */
static void put(char **o, const char *s, size_t n)
{
    memcpy(*o, s, n);
    *o += n;
}

char *lease__url_redact(const char *text)
{
    const char *auth, *auth_end, *at = NULL, *colon = NULL, *s, *q;
    char *out, *o;

    if (text == NULL)
        return strdup("");
    /* Every replacement is no longer than "***" plus what it replaces. */
    out = malloc(strlen(text) * 2 + 8);
    if (out == NULL)
        return NULL;
    o = out;
    s = text;
    /* Only a "//" right after the scheme starts an authority: "://" later
     * on (inside a parameter, say) is not one. */
    {
        char scheme[32];
        auth = NULL;
        if (lease__url_scheme(scheme, sizeof(scheme), text) == 0 &&
            strncmp(text + strlen(scheme), "://", 3) == 0)
            auth = text + strlen(scheme);
    }
    if (auth != NULL) {
        auth += 3;
        auth_end = auth + strcspn(auth, "/?");
        for (const char *c = auth; c < auth_end; c++)
            if (*c == '@')
                at = c;
        if (at)
            colon = memchr(auth, ':', (size_t)(at - auth));
        if (colon) {
            /* "scheme://user:" then "***" then "@rest". */
            put(&o, text, (size_t)(colon + 1 - text));
            put(&o, "***", 3);
            s = at;
        }
    }
    /* A password may also come as a query parameter (libpq reads one). */
    q = strchr(s, '?');
    if (q == NULL) {
        put(&o, s, strlen(s));
    } else {
        put(&o, s, (size_t)(q + 1 - s));
        s = q + 1;
        while (*s) {
            size_t n = strcspn(s, "&");
            const char *eq = memchr(s, '=', n);
            /* Compare the decoded name, as the parser will read it; a
             * name that does not decode is hidden too, to be safe. */
            char *name = eq ? decode(s, (size_t)(eq - s), 1) : NULL;
            int secret = eq && (name == NULL || strcasecmp(name, "password") == 0);

            free(name);
            if (secret) {
                put(&o, s, (size_t)(eq + 1 - s));
                put(&o, "***", 3);
            } else {
                put(&o, s, n);
            }
            s += n;
            if (*s == '&')
                put(&o, s++, 1);
        }
    }
    *o = '\0';
    return out;
}
