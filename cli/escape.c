/*
 * escape.c - the one escaping rule for what the tool prints (escape.h).
 */
#include <stdlib.h>
#include <string.h>

#include "escape.h"

/* The length of the valid UTF-8 sequence at s (1-4), or 0 if the byte at s
 * does not start one. Overlong forms, surrogates and code points above
 * U+10FFFF are not valid. */
static size_t utf8_len(const unsigned char *s)
{
    unsigned c = s[0];
    size_t n, i;
    unsigned cp, min;

    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2; cp = c & 0x1f; min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3; cp = c & 0x0f; min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4; cp = c & 0x07; min = 0x10000;
    } else {
        return 0;
    }
    for (i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

json_t *cli_json_str(const char *s)
{
    const unsigned char *p;
    char *fixed, *o;
    json_t *j;

    if (s == NULL)
        return json_null();
    if ((j = json_string(s)) != NULL)
        return j;
    if ((fixed = malloc(strlen(s) * 3 + 1)) == NULL)
        return json_null();
    for (p = (const unsigned char *)s, o = fixed; *p;) {
        size_t n = utf8_len(p);
        if (n == 0) {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
            p++;
        } else {
            memcpy(o, p, n);
            o += n;
            p += n;
        }
    }
    *o = '\0';
    j = json_string(fixed);
    free(fixed);
    return j ? j : json_null();
}

void cli_put_text(FILE *f, const char *s)
{
    const unsigned char *p;

    if (s == NULL)
        return;
    for (p = (const unsigned char *)s; *p;) {
        size_t n = utf8_len(p);
        if (*p == '\\') {
            fputs("\\\\", f);
            p++;
        } else if (n == 0 || *p < 0x20 || *p == 0x7f) {
            fprintf(f, "\\x%02x", *p);
            p++;
        } else {
            fwrite(p, 1, n, f);
            p += n;
        }
    }
}
