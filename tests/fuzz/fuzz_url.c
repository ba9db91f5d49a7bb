/*
 * fuzz_url.c - the store URL parser and the password redactor.
 *
 * Properties, for any input text:
 *  - parse, param lookup and redact never crash, leak or read out of bounds;
 *  - the redacted text, parsed again, gives no password away: its user
 *    password and "*password*" parameters, decoded, are not the input's;
 *  - a password the parser found (user info, or any parameter whose name
 *    contains "password") does not survive in the redacted text;
 *  - what libpq would take as the password of a postgres URL (user info up
 *    to the last '@') does not survive in the redacted text either;
 *  - a lease_store_open that fails before connecting (unknown scheme, or a
 *    redis/etcd URL the parser rejects) names no password in its message
 *    (compared with the message for the same URL with the password
 *    replaced, so that fixed words of the message are no false alarm).
 *
 * "Does not survive" is counted, so that a password that is also a host
 * name is not a false alarm: the redacted text must hold fewer copies of the
 * secret than the input did (redaction removes at least the one that was
 * the password). Secrets holding '*' are skipped: "***" could form them.
 */
#include <ctype.h>
#include <strings.h>

#include "fuzz_util.h"
#include "lease_int.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    lease_log_set(fuzz_quiet_log, NULL, LEASE_LOG_OFF);
    return 0;
}

static int url_is_secret_name(const char *name)
{
    char *low = strdup(name);
    int secret;
    size_t i;

    if (low == NULL)
        abort();
    for (i = 0; low[i]; i++)
        low[i] = (char)tolower((unsigned char)low[i]);
    /* As documented: a "*_file" parameter names a file, not a secret. */
    secret = strstr(low, "password") != NULL &&
             !(i >= 5 && strcmp(low + i - 5, "_file") == 0);
    free(low);
    return secret;
}

/* `out` (the redacted text or a message) must hold fewer copies of `secret`
 * than `text` did. */
static void url_check_hidden(const char *what, const char *secret,
                             const char *text, const char *out)
{
    if (secret == NULL || secret[0] == '\0' || strchr(secret, '*'))
        return;
    if (fuzz_count(out, secret) >= fuzz_count(text, secret) &&
        fuzz_count(out, secret) > 0)
        fuzz_fail("%s: password '%s' of '%s' survives in '%s'", what, secret,
                  text, out);
}

/* Checks against the parser's own view; only when no escape can make the
 * raw text differ from the decoded value. */
static void url_check_parsed(const lease__url *u, const char *text, const char *red)
{
    size_t i;

    if (strpbrk(text, "%+") != NULL)
        return;
    url_check_hidden("redact (user info)", u->password, text, red);
    for (i = 0; i < u->nparams; i++)
        if (url_is_secret_name(u->params[i].name))
            url_check_hidden("redact (parameter)", u->params[i].value, text, red);
}

/* Does `v`, a value read back from the redacted text, give away `secret`,
 * the decoded password of the input? Equal, or holding it while the input
 * held it only once (as the password): then it cannot come from elsewhere. */
static int url_gives_away(const char *v, const char *secret, const char *text)
{
    if (secret == NULL || secret[0] == '\0' || strchr(secret, '*'))
        return 0;
    return strcmp(v, secret) == 0 ||
           (strlen(secret) >= 4 && strstr(v, secret) && fuzz_count(text, secret) <= 1);
}

/* The redacted text read back must not give a password away: compared
 * decoded, this also covers passwords written with escapes. */
static void url_check_reparse(const lease__url *u, const char *text, const char *red)
{
    lease__url r;
    size_t i, j;

    if (lease__url_parse(&r, red) < 0)
        return;
    for (i = 0; i <= r.nparams; i++) {
        const char *v = i < r.nparams ? r.params[i].value : r.password;
        if (v == NULL || (i < r.nparams && !url_is_secret_name(r.params[i].name)))
            continue;
        for (j = 0; j <= u->nparams; j++) {
            const char *secret = j < u->nparams ? u->params[j].value : u->password;
            if (j < u->nparams && !url_is_secret_name(u->params[j].name))
                continue;
            if (url_gives_away(v, secret, text))
                fuzz_fail("redact('%s') = '%s' reads back with password '%s'", text,
                          red, v);
        }
    }
    lease__url_free(&r);
}

/* Where the password is for a reader that ends the user info at the last
 * '@' (libpq, per issue 10): from the first ':' after "//" to that '@'.
 * 0 and *from, *len set, or -1 when there is none. */
static int url_lastat_span(const char *text, size_t *from, size_t *len)
{
    const char *auth = strstr(text, "://"), *at, *colon;

    if (auth == NULL)
        return -1;
    auth += 3;
    if ((at = strrchr(auth, '@')) == NULL ||
        (colon = memchr(auth, ':', (size_t)(at - auth))) == NULL)
        return -1;
    *from = (size_t)(colon + 1 - text);
    *len = (size_t)(at - colon - 1);
    return 0;
}

static char *url_lastat_password(const char *text)
{
    size_t from, len;

    return url_lastat_span(text, &from, &len) < 0 ? NULL : strndup(text + from, len);
}

/* Would lease_store_open fail before any connection? Only for an unknown
 * scheme, or a redis/etcd URL that its parser rejects (those stores parse
 * first). No other URL is opened: it could name any host. */
static int url_open_is_offline(const char *text)
{
    char scheme[32];
    lease__url u;

    if (lease__url_scheme(scheme, sizeof(scheme), text) < 0 ||
        lease__backend_for(scheme) == NULL)
        return 1;
    if (strcmp(scheme, "redis") != 0 && strcmp(scheme, "etcd") != 0 &&
        strcmp(scheme, "etcds") != 0)
        return 0;
    if (lease__url_parse(&u, text) == 0) {
        lease__url_free(&u);
        return 0;
    }
    return 1;
}

/* The message of a failed open of `text`, copied. */
static char *url_open_message(const char *text)
{
    lease_store *s = NULL;
    int rc = lease_store_open_timeout(&s, text, 100);

    if (rc == 0)
        fuzz_fail("lease_store_open('%s') succeeded without a store", text);
    fuzz_check_rc("lease_store_open", rc);
    return strdup(lease_errmsg());
}

/* The message must hold the password no more often than the message of
 * the same URL with the password swapped for a stand-in of other letters:
 * what the two share (fixed words, other parts of the URL) is no leak. */
static void url_check_open(const char *text)
{
    char *secret, *msg, *other_text, *other_msg;
    size_t from, len, i;
    char stand_in = 'Q';

    if (!url_open_is_offline(text))
        return;
    msg = url_open_message(text);
    if (url_lastat_span(text, &from, &len) < 0 || len == 0) {
        free(msg);
        return;
    }
    secret = strndup(text + from, len);
    other_text = strdup(text);
    for (i = 0; strchr(secret, stand_in) && i < 4; i++)
        stand_in = "QXJZ"[i];
    memset(other_text + from, stand_in, len);
    if (!strchr(secret, '*') && !strchr(secret, stand_in) &&
        url_open_is_offline(other_text)) {
        other_msg = url_open_message(other_text);
        if (fuzz_count(msg, secret) > fuzz_count(other_msg, secret))
            fuzz_fail("lease_store_open('%s') names the password '%s': %s", text,
                      secret, msg);
        free(other_msg);
    }
    free(other_text);
    free(secret);
    free(msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text, *red, *pq;
    lease__url u;

    if (size > 4096)
        return 0;
    text = fuzz_cstr(data, size);
    red = lease__url_redact(text);
    if (red == NULL)
        fuzz_fail("lease__url_redact returned NULL");
    if (lease__url_parse(&u, text) == 0) {
        (void)lease__url_param(&u, "password");
        (void)lease__url_param(&u, "prefix");
        url_check_parsed(&u, text, red);
        url_check_reparse(&u, text, red);
        lease__url_free(&u);
    }
    if (strncasecmp(text, "postgres", 8) == 0) {
        pq = url_lastat_password(text);
        url_check_hidden("redact (libpq's user info)", pq, text, red);
        free(pq);
    }
    url_check_open(text);
    free(red);
    free(text);
    return 0;
}
