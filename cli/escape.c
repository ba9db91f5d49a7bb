/*
 * escape.c - the one escaping rule for what the tool prints (escape.h).
 * The UTF-8 validator is the library's (lease_utf8_len, lease_text_utf8 in
 * lease/log.h), so the tool's output and the library's log lines cannot
 * disagree on which bytes are valid.
 */
#include <stdlib.h>
#include <string.h>

#include "lease.h"
#include "escape.h"

json_t *cli_json_str(const char *s)
{
    char *fixed;
    json_t *j;

    if (s == NULL)
        return json_null();
    if ((fixed = lease_text_utf8(s)) == NULL)
        return json_null();
    j = json_string(fixed);
    free(fixed);
    return j ? j : json_null();
}

/* C0 controls, DEL, and C1 controls (U+0080-U+009F, C2 80-C2 9F in UTF-8:
 * some terminals take U+009B as CSI): none may reach a terminal raw. Nor
 * may the invisible format characters that reorder or break what is shown
 * without a control byte: zero-width and direction marks (U+200B-U+200F),
 * line and paragraph separators and bidirectional embeddings and overrides
 * (U+2028-U+202E), word joiners and isolates (U+2060-U+2069), and the
 * byte order mark (U+FEFF). */
static int escape_is_control(const unsigned char *p, size_t n)
{
    unsigned cp;

    if (n == 1)
        return *p < 0x20 || *p == 0x7f;
    if (n == 2)
        return p[0] == 0xc2 && p[1] < 0xa0;
    if (n != 3)
        return 0;
    cp = ((p[0] & 0x0fu) << 12) | ((p[1] & 0x3fu) << 6) | (p[2] & 0x3fu);
    return (cp >= 0x200b && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202e) ||
           (cp >= 0x2060 && cp <= 0x2069) || cp == 0xfeff;
}

void cli_put_text(FILE *f, const char *s)
{
    const unsigned char *p;

    if (s == NULL)
        return;
    for (p = (const unsigned char *)s; *p;) {
        size_t n = lease_utf8_len((const char *)p);

        if (*p == '\\') {
            fputs("\\\\", f);
            p++;
        } else if (n == 0) {
            fprintf(f, "\\x%02x", *p);
            p++;
        } else if (escape_is_control(p, n)) {
            for (; n > 0; n--, p++)
                fprintf(f, "\\x%02x", *p);
        } else {
            fwrite(p, 1, n, f);
            p += n;
        }
    }
}
