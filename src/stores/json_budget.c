/*
 * json_budget.c - what decoding an answer may cost (json_budget.h): the
 * count of what jansson will hold, kept by the etcd store's protobuf
 * decoder as it goes and by the JSON loader over the text before it
 * parses it, for the etcd and Kubernetes stores.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "json_budget.h"
#include "store_int.h"

/* ---- what decoding may cost ------------------------------------------ */

/* What a page of a list, a session's keys or anything else but a data
 * read may take to hold, however large the answer: etcd's answers of a few
 * keys take a few KiB, a page of a list (1000 keys, three key-values each)
 * about 3.4 MiB, a session's LeaseTimeToLive about 120 bytes a key; a
 * Kubernetes list page (500 Lease objects of some 40 values each, their
 * history annotations) a few MiB. The tests check the costs below against
 * jansson's own allocations (etcd_checks codec, fuzz_etcd_pb, fuzz_kube). */
#define HOLD_ANY_BYTES ((size_t)64 << 20)
#define HOLD_ANY_VALUES ((size_t)1 << 20)
/* A data read's answer: two key-values, and one value of up to
 * LEASE__VALUE_MAX. jansson's lexer holds a long string up to three times
 * while it reads it, and its value once. */
#define HOLD_VALUE_VALUES 4096
#define HOLD_VALUE_TIMES 4
#define HOLD_VALUE_BASE ((size_t)1 << 20)
/* Charges between two readings of the clock. */
#define SPEND_TICKS 1024

lease__json_budget lease__json_budget_of(int hold, size_t len, int64_t end_ns)
{
    lease__json_budget b = { HOLD_ANY_BYTES, HOLD_ANY_VALUES, end_ns };

    if (hold == LEASE__JSON_HOLD_VALUE) {
        /* Saturated well below SIZE_MAX, so that a count past it cannot
         * wrap (a size_t of 32 bits). */
        b.bytes = len > (SIZE_MAX / 4 - HOLD_VALUE_BASE) / HOLD_VALUE_TIMES
                      ? SIZE_MAX / 4
                      : HOLD_VALUE_BASE + len * HOLD_VALUE_TIMES;
        b.values = HOLD_VALUE_VALUES;
    }
    return b;
}

size_t lease__json_chunk(size_t n)
{
    n = (n + 8 + 15) & ~(size_t)15;
    return n < 32 ? 32 : n;
}

size_t lease__json_member(size_t name_len)
{
    return lease__json_chunk(56 + name_len + 1);
}

int lease__json_spend_add(lease__json_spend *s, size_t bytes, size_t values)
{
    s->bytes += bytes;
    s->values += values;
    if (s->bytes > s->b->bytes || s->values > s->b->values)
        s->over = LEASE__JSON_SPEND_MEMORY;
    else if (s->b->end_ns != 0 && ++s->ticks >= SPEND_TICKS) {
        s->ticks = 0;
        if (lease_clock_ns() >= s->b->end_ns)
            s->over = LEASE__JSON_SPEND_LATE;
    }
    return s->over ? -1 : 0;
}

int lease__json_spend_why(const lease__json_spend *s, const char *what, char *err,
                          size_t errsize)
{
    if (s->over == LEASE__JSON_SPEND_LATE) {
        snprintf(err, errsize, "%sthe call's timeout ran out while it was decoded", what);
        return LEASE__JSON_LATE;
    }
    snprintf(err, errsize, "%sthe answer would take more than %zu MiB or %zu values to hold",
             what, s->b->bytes >> 20, s->b->values);
    return -1;
}

/* ---- JSON text, counted before it is parsed ---------------------------- */

/* Containers whose kind the count keeps track of; deeper ones are counted
 * as both (an element's slot, a member's table growth). */
#define SCAN_DEPTH 64

typedef struct {
    lease__json_spend *s;
    size_t longest;   /* the longest token: the lexer's buffer holds it */
    size_t last;      /* the length of the last string (a member's name) */
    size_t run;       /* the length of a token outside strings so far */
    char first;       /* its first character */
    int want_name;    /* the next string is a member's name */
    size_t depth;
    unsigned char is_object[SCAN_DEPTH];
    size_t members[SCAN_DEPTH];
} json_scan;

/* A value starts: its slot, when it is an array's element. */
static size_t scan_slot(const json_scan *j)
{
    if (j->depth == 0 || (j->depth <= SCAN_DEPTH && j->is_object[j->depth - 1]))
        return 0;
    return LEASE__JSON_COST_ELEMENT;
}

/* A member's pair (its name the last string), and the growth of the
 * object's table: jansson doubles it when the ninth, seventeenth ...
 * member comes. */
static int scan_member(json_scan *j)
{
    size_t c = lease__json_member(j->last), *m;

    if (j->depth == 0 || j->depth > SCAN_DEPTH)
        return lease__json_spend_add(j->s, c + LEASE__JSON_COST_REHASH, 0);
    m = &j->members[j->depth - 1];
    if (*m >= 8 && (*m & (*m - 1)) == 0)
        c += lease__json_chunk(*m * 2 * 16);
    (*m)++;
    return lease__json_spend_add(j->s, c, 0);
}

/* A string of n characters (escapes counted as they are written) closed:
 * the lexer's copy of it (the quotes too) becomes the value, or is held
 * while the member it names is read. */
static int scan_string(json_scan *j, size_t n)
{
    int name = j->want_name;

    j->last = n;
    j->want_name = 0;
    if (n + 2 > j->longest)
        j->longest = n + 2;
    size_t value = name ? 0 : LEASE__JSON_COST_STRING + scan_slot(j);

    return lease__json_spend_add(j->s, lease__json_chunk(n + 3) + value, 1);
}

/* The token outside strings that ended: a number (32 bytes), or true,
 * false, null (none), or not JSON. */
static int scan_token(json_scan *j)
{
    int number = j->first == '-' || (j->first >= '0' && j->first <= '9');

    if (j->run == 0)
        return 0;
    if (j->run > j->longest)
        j->longest = j->run;
    j->run = 0;
    return lease__json_spend_add(j->s, (number ? LEASE__JSON_COST_NUMBER : 0) + scan_slot(j),
                                 1);
}

static int scan_open(json_scan *j, int object)
{
    size_t c = scan_slot(j) + (object ? LEASE__JSON_COST_OBJECT : LEASE__JSON_COST_ARRAY);

    if (j->depth < SCAN_DEPTH) {
        j->is_object[j->depth] = (unsigned char)object;
        j->members[j->depth] = 0;
    }
    j->depth++;
    j->want_name = object;
    return lease__json_spend_add(j->s, c, 1);
}

/* One structural character outside strings (the token before it ended). */
static int scan_char(json_scan *j, char c)
{
    switch (c) {
    case '{': return scan_open(j, 1);
    case '[': return scan_open(j, 0);
    case '}':
    case ']':
        if (j->depth > 0)
            j->depth--;
        return 0;
    case ':': return scan_member(j);
    case ',':
        j->want_name = j->depth > 0 && j->depth <= SCAN_DEPTH && j->is_object[j->depth - 1];
        return 0;
    default: return 0;
    }
}

/* Count what parsing the text may take, before it is parsed: what its
 * values take, and the lexer's buffer (grown by doubling, the old one
 * freed after the new is made: three times the longest token). */
static int json_scan_text(lease__json_spend *s, const char *t, size_t len)
{
    json_scan j;
    size_t i, start = 0;
    int in_string = 0, rc = 0;

    memset(&j, 0, sizeof(j));
    j.s = s;
    for (i = 0; i < len && rc == 0; i++) {
        char c = t[i];

        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"' && (in_string = 0) == 0)
                rc = scan_string(&j, i - start);
            continue;
        }
        if (c != '"' && (c == '\0' || strchr("{}[]:, \t\r\n", c) == NULL)) {
            if (j.run++ == 0)
                j.first = c;
            continue;
        }
        rc = scan_token(&j); /* the token before this character ended */
        if (rc == 0 && c == '"') {
            in_string = 1;
            start = i + 1;
        } else if (rc == 0) {
            rc = scan_char(&j, c);
        }
    }
    if (rc == 0 && in_string)
        rc = scan_string(&j, len - start);
    if (rc == 0)
        rc = scan_token(&j);
    return rc < 0 ? rc : lease__json_spend_add(s, 3 * lease__json_chunk(j.longest + 3), 0);
}

/* json_load_callback's reader of the text, which stops at the deadline. */
typedef struct {
    const char *t;
    size_t len, at;
    lease__json_spend *s;
} json_feed;

/* jansson asks for 1 KiB at a time: the clock is read at each. */
static size_t json_feed_read(void *buffer, size_t buflen, void *data)
{
    json_feed *f = data;
    size_t n = f->len - f->at < buflen ? f->len - f->at : buflen;

    if (n > 0 && f->s->b->end_ns != 0 && lease_clock_ns() >= f->s->b->end_ns) {
        f->s->over = LEASE__JSON_SPEND_LATE;
        return (size_t)-1; /* jansson's "error": the parse stops here */
    }
    memcpy(buffer, f->t + f->at, n);
    f->at += n;
    return n;
}

int lease__json_load(json_t **out, const char *data, size_t len,
                          const lease__json_budget *budget, char *err, size_t errsize)
{
    lease__json_spend s = { budget, 0, 0, 0, 0 };
    json_feed f = { data, len, 0, &s };

    *out = NULL;
    err[0] = '\0';
    if (json_scan_text(&s, data, len) < 0)
        return lease__json_spend_why(&s, "", err, errsize);
    *out = json_load_callback(json_feed_read, &f, 0, NULL);
    if (*out == NULL && s.over)
        return lease__json_spend_why(&s, "", err, errsize);
    return *out ? 0 : -1;
}
