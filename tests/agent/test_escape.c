/*
 * test_escape.c - the one escaping rule (docs/conventions.md, "Printed
 * output"): the library's UTF-8 validator (lease_utf8_len, lease_text_utf8)
 * and the tool's writers built on it (cli/escape.c), byte for byte; and the
 * validator agrees with jansson's on random strings, so that a string the
 * rule calls valid is never one that json_string() refuses (which would
 * drop a field or a log line).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <jansson.h>

#include "lease.h"
#include "escape.h"

static void test_utf8_len(void **state)
{
    static const struct {
        const char *s;
        size_t len;
    } cases[] = {
        { "", 0 },
        { "a", 1 },
        { "\x7f", 1 },
        { "\x1b", 1 },
        { "\xc2\x80", 2 },             /* U+0080, the first two-byte one */
        { "\xc3\xa9", 2 },             /* e acute */
        { "\xe2\x82\xac", 3 },         /* euro sign */
        { "\xef\xbf\xbd", 3 },         /* U+FFFD itself */
        { "\xf0\x9f\x98\x80", 4 },     /* an emoji */
        { "\xf4\x8f\xbf\xbf", 4 },     /* U+10FFFF, the last one */
        { "\x80", 0 },                 /* a stray continuation byte */
        { "\xbf", 0 },
        { "\xc0\x80", 0 },             /* overlong NUL */
        { "\xc1\xbf", 0 },             /* overlong */
        { "\xe0\x80\x80", 0 },         /* overlong */
        { "\xe0\x9f\xbf", 0 },         /* overlong U+07FF */
        { "\xf0\x8f\xbf\xbf", 0 },     /* overlong U+FFFF */
        { "\xed\xa0\x80", 0 },         /* surrogate U+D800 */
        { "\xed\xbf\xbf", 0 },         /* surrogate U+DFFF */
        { "\xf4\x90\x80\x80", 0 },     /* U+110000 */
        { "\xf5\x80\x80\x80", 0 },
        { "\xfe", 0 },
        { "\xff", 0 },
        { "\xc3", 0 },                 /* cut short by the end */
        { "\xe2\x82", 0 },
        { "\xf0\x9f\x98", 0 },
        { "\xc3(", 0 },                /* cut short by an ASCII byte */
        { "\xe2\x82\xc3\xa9", 0 },
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (lease_utf8_len(cases[i].s) != cases[i].len)
            fail_msg("case %zu: lease_utf8_len = %zu, want %zu", i,
                     lease_utf8_len(cases[i].s), cases[i].len);
    }
}

static void test_text_utf8(void **state)
{
    char *s;

    (void)state;
    assert_null(lease_text_utf8(NULL));
    s = lease_text_utf8("");
    assert_string_equal(s, "");
    free(s);
    /* Valid characters (controls included) are kept, each invalid byte is
     * one U+FFFD, a sequence cut short by the end too. */
    s = lease_text_utf8("a\xff" "b\xc3\xa9\x1b\xed\xa0\x80\xe2\x82");
    assert_string_equal(s, "a\xef\xbf\xbd" "b\xc3\xa9\x1b\xef\xbf\xbd\xef\xbf\xbd"
                           "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    free(s);
}

/* What cli_put_text writes for s. */
static char *put_text(const char *s)
{
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);

    assert_non_null(f);
    cli_put_text(f, s);
    assert_int_equal(fclose(f), 0);
    return buf;
}

static void test_put_text(void **state)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        { "plain host:42", "plain host:42" },
        { "caf\xc3\xa9 \xe2\x82\xac", "caf\xc3\xa9 \xe2\x82\xac" },
        { "back\\slash", "back\\\\slash" },
        { "\x1b]0;pwned\x07\nforged", "\\x1b]0;pwned\\x07\\x0aforged" },
        { "\r\t\x7f", "\\x0d\\x09\\x7f" },
        { "\xff\xfe", "\\xff\\xfe" },
        { "csi\xc2\x9b" "31m", "csi\\xc2\\x9b31m" },  /* C1 CSI */
        { "\xc2\xa0nbsp", "\xc2\xa0nbsp" },           /* U+00A0 is not C1 */
        { "\xed\xa0\x80", "\\xed\\xa0\\x80" },
        { "cut\xe2\x82", "cut\\xe2\\x82" },
        /* Format characters that reorder or split a line: RLO, LS, ZWSP,
         * RLI, BOM; their neighbours U+2010 and U+206A stay as they are. */
        { "x\xe2\x80\xae" "evil", "x\\xe2\\x80\\xaeevil" },
        { "a\xe2\x80\xa8" "b", "a\\xe2\\x80\\xa8b" },
        { "z\xe2\x80\x8bw", "z\\xe2\\x80\\x8bw" },
        { "\xe2\x81\xa7" "iso", "\\xe2\\x81\\xa7iso" },
        { "\xef\xbb\xbf" "bom", "\\xef\\xbb\\xbfbom" },
        { "\xe2\x80\x90\xe2\x81\xaa", "\xe2\x80\x90\xe2\x81\xaa" },
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *out = put_text(cases[i].in);

        if (strcmp(out, cases[i].out) != 0)
            fail_msg("case %zu: cli_put_text wrote '%s', want '%s'", i, out, cases[i].out);
        free(out);
    }
    {
        char *out = put_text(NULL);

        assert_string_equal(out, "");
        free(out);
    }
}

static void test_json_str(void **state)
{
    json_t *j;
    char *text;

    (void)state;
    j = cli_json_str(NULL);
    assert_true(json_is_null(j));
    json_decref(j);
    j = cli_json_str("\xff" "a\xc3\xa9\x1b");
    assert_non_null(j);
    text = json_dumps(j, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
    assert_string_equal(text, "\"\\uFFFDa\\u00E9\\u001B\"");
    free(text);
    json_decref(j);
}

/* A small deterministic generator: the same strings on every run. */
static uint32_t rng_state = 12345;
static uint32_t rng(void)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return rng_state >> 8;
}

/* Random strings biased towards the bytes that make UTF-8 hard. */
static void random_string(char *s, size_t max)
{
    static const unsigned char hard[] = { 0x80, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf, 0xe0,
                                          0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff, 0x9f,
                                          0xa0, 0x8f, 0x90, 'a' };
    size_t n = rng() % max, i;

    for (i = 0; i < n; i++) {
        unsigned char c = rng() % 2 ? hard[rng() % sizeof(hard)] : (unsigned char)(rng() % 256);
        s[i] = (char)(c ? c : 'z');
    }
    s[n] = '\0';
}

static void test_agrees_with_jansson(void **state)
{
    char s[16];
    int i, valid_seen = 0;

    (void)state;
    for (i = 0; i < 200000; i++) {
        const char *p;
        int valid = 1;
        json_t *j;

        random_string(s, sizeof(s));
        for (p = s; *p;) {
            size_t n = lease_utf8_len(p);

            if (n == 0) {
                valid = 0;
                break;
            }
            p += n;
        }
        j = json_string(s);
        if ((j != NULL) != valid)
            fail_msg("lease_utf8_len says %s, jansson %s, for a string of %zu bytes",
                     valid ? "valid" : "invalid", j ? "valid" : "invalid", strlen(s));
        valid_seen += valid;
        json_decref(j);
        /* And the repaired copy is always valid for jansson. */
        {
            char *fixed = lease_text_utf8(s);

            assert_non_null(fixed);
            j = json_string(fixed);
            assert_non_null(j);
            json_decref(j);
            free(fixed);
        }
    }
    /* The generator made both kinds. */
    assert_true(valid_seen > 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_len),
        cmocka_unit_test(test_text_utf8),
        cmocka_unit_test(test_put_text),
        cmocka_unit_test(test_json_str),
        cmocka_unit_test(test_agrees_with_jansson),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
