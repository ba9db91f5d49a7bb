/*
 * fuzz_parse.c - the parsers of what people type: durations, tokens, keys
 * and owners (include/lease/parse.h, lease.h).
 *
 * Each parser is compared with a plain reference written from its
 * documentation, computed in 128 bits so that overflow is seen, not had:
 *  - duration: one or more <digits><unit>, unit ms|s|m|h ("ms" read first),
 *    nothing else; EINVALID when the total does not fit in 64 bits;
 *  - token: digits only, 1 .. 2^63-1;
 *  - key: 1 .. LEASE_KEY_MAX bytes;
 *  - owner: a UUID in text form, and lease_grant_init keeps it lower-cased.
 */
#include <ctype.h>

#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    lease_log_set(fuzz_quiet_log, NULL, LEASE_LOG_OFF);
    return 0;
}

typedef unsigned __int128 u128;

/* The documented grammar of a duration; 0 with *ms set, or -1. */
static int parse_ref_duration(uint64_t *ms, const char *s)
{
    u128 total = 0;

    if (*s == '\0')
        return -1;
    while (*s) {
        u128 v = 0, mult;

        if (!isdigit((unsigned char)*s))
            return -1;
        for (; isdigit((unsigned char)*s); s++) {
            v = v * 10 + (u128)(*s - '0');
            if (v > UINT64_MAX)
                return -1;
        }
        if (s[0] == 'm' && s[1] == 's') {
            mult = 1;
            s += 2;
        } else if (*s == 's' || *s == 'm' || *s == 'h') {
            mult = *s == 's' ? 1000 : *s == 'm' ? 60000 : 3600000;
            s++;
        } else {
            return -1;
        }
        total += v * mult;
        if (total > UINT64_MAX)
            return -1;
    }
    *ms = (uint64_t)total;
    return 0;
}

static int parse_ref_token(uint64_t *token, const char *s)
{
    u128 v = 0;

    if (*s == '\0')
        return -1;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s))
            return -1;
        v = v * 10 + (u128)(*s - '0');
        if (v > (u128)INT64_MAX)
            return -1;
    }
    if (v == 0)
        return -1;
    *token = (uint64_t)v;
    return 0;
}

static int parse_ref_owner(const char *s)
{
    size_t i;

    if (strlen(s) != 36)
        return 0;
    for (i = 0; i < 36; i++) {
        int dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? s[i] != '-' : !isxdigit((unsigned char)s[i]))
            return 0;
    }
    return 1;
}

static void parse_check_duration(const char *text)
{
    uint64_t got = 0, want = 0;
    int rc = lease_parse_duration(&got, text), ref = parse_ref_duration(&want, text);

    fuzz_check_rc("lease_parse_duration", rc);
    if ((rc == 0) != (ref == 0))
        fuzz_fail("lease_parse_duration('%s') = %d, the grammar says %s", text, rc,
                  ref == 0 ? "valid" : "invalid");
    if (rc == 0 && got != want)
        fuzz_fail("lease_parse_duration('%s') = %llu ms, expected %llu", text,
                  (unsigned long long)got, (unsigned long long)want);
}

static void parse_check_token(const char *text)
{
    uint64_t got = 0, want = 0;
    int rc = lease_parse_token(&got, text), ref = parse_ref_token(&want, text);

    fuzz_check_rc("lease_parse_token", rc);
    if ((rc == 0) != (ref == 0))
        fuzz_fail("lease_parse_token('%s') = %d, the grammar says %s", text, rc,
                  ref == 0 ? "valid" : "invalid");
    if (rc == 0 && got != want)
        fuzz_fail("lease_parse_token('%s') = %llu, expected %llu", text,
                  (unsigned long long)got, (unsigned long long)want);
}

static void parse_check_names(const char *text)
{
    size_t n = strlen(text);
    lease_grant g;
    int valid = lease_owner_valid(text), rc;
    size_t i;

    if (lease_key_valid(text) != (n >= 1 && n <= LEASE_KEY_MAX))
        fuzz_fail("lease_key_valid of a %zu-byte key = %d", n, lease_key_valid(text));
    if (valid != parse_ref_owner(text))
        fuzz_fail("lease_owner_valid('%s') = %d", text, valid);
    rc = lease_grant_init(&g, "fuzz/key", text, 1, 1000);
    fuzz_check_rc("lease_grant_init", rc);
    if ((rc == 0) != valid)
        fuzz_fail("lease_grant_init with owner '%s' = %d", text, rc);
    for (i = 0; rc == 0 && i < 36; i++)
        if (tolower((unsigned char)text[i]) != g.owner[i])
            fuzz_fail("lease_grant_init kept owner '%s' as '%s'", text, g.owner);
    rc = lease_grant_init(&g, text, "00000000-0000-4000-8000-000000000000", 1, 1000);
    fuzz_check_rc("lease_grant_init", rc);
    if ((rc == 0) != (n >= 1 && n <= LEASE_KEY_MAX))
        fuzz_fail("lease_grant_init with a %zu-byte key = %d", n, rc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text;

    if (size > 1024)
        return 0;
    text = fuzz_cstr(data, size);
    parse_check_duration(text);
    parse_check_token(text);
    parse_check_names(text);
    free(text);
    return 0;
}
