/*
 * json_budget.h - what decoding one answer of a store may cost, in memory
 * and in time, whatever its transport: the etcd store's protobuf decoder
 * (etcd/pb.c) counts what it builds as it goes, the JSON loader (the etcd
 * gateway's answers, every Kubernetes answer) counts the text before it
 * parses it. Memory is what the answer's JSON values take to hold (what
 * jansson allocates for each, malloc's rounding included, its lexer's
 * buffer for the JSON; a field's base64 while it is encoded aside) and
 * how many values there are; decoding stops at end_ns. jansson spends
 * about 224 bytes on an object, so the cost of an answer is not its size:
 * 32 MiB of empty entries would take 2 GiB.
 *
 * Linked into each store that decodes answers (CMakeLists.txt): a store
 * module carries its own copy.
 */
#ifndef LEASE_JSON_BUDGET_H
#define LEASE_JSON_BUDGET_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

typedef struct lease__json_budget {
    size_t bytes;    /* the most the decoded answer may take to hold */
    size_t values;   /* the most JSON values it may have */
    int64_t end_ns;  /* the deadline on lease_clock_ns(); 0: none */
} lease__json_budget;

/* What an answer is expected to hold, which sets its budget. */
enum {
    LEASE__JSON_HOLD_ANY,  /* anything: 64 MiB and 2^20 values, whatever its size */
    LEASE__JSON_HOLD_VALUE /* one value (a data read): 1 MiB + 4 x the answer, 4096 values */
};

/* The budget of an answer of len bytes that holds `hold`, decoded by end_ns. */
lease__json_budget lease__json_budget_of(int hold, size_t len, int64_t end_ns);

/* What the decoders answer when the budget's deadline passed first. */
#define LEASE__JSON_LATE (-2)

/*
 * The JSON text of `len` bytes parsed (jansson) into *out: 0; -1 when it
 * is not JSON (err[0] is '\0') or (err set) what it would take to hold is
 * past the budget, counted before anything is parsed; LEASE__JSON_LATE
 * (err says so) when the budget's deadline passed first.
 */
int lease__json_load(json_t **out, const char *data, size_t len,
                     const lease__json_budget *budget, char *err, size_t errsize);

/* ---- for a decoder that counts as it builds (etcd/pb.c) ---------------- */

/*
 * What jansson 2.14 allocates for a value, as malloc hands it out (glibc:
 * 8 bytes of header, steps of 16, 32 at least: lease__json_chunk),
 * measured and taken as upper bounds:
 *   an object: 224 (its table of 8 buckets), and for each member its pair
 *   (56 bytes and the name: lease__json_member); past 8 members the table
 *   doubles, the old one freed after the new is made: 48 a member covers it;
 *   an array: 128, and 24 an element (its table doubles likewise);
 *   a string: 48 and its text; a number 32; true, false and null none.
 */
enum {
    LEASE__JSON_COST_OBJECT = 224,
    LEASE__JSON_COST_REHASH = 48,
    LEASE__JSON_COST_ARRAY = 128,
    LEASE__JSON_COST_ELEMENT = 24,
    LEASE__JSON_COST_STRING = 48,
    LEASE__JSON_COST_NUMBER = 32
};

/* A block of n bytes as malloc hands it out. */
size_t lease__json_chunk(size_t n);
/* An object's member named by name_len bytes. */
size_t lease__json_member(size_t name_len);

/* One decoding's count against its budget. */
typedef struct {
    const lease__json_budget *b;
    size_t bytes, values;
    unsigned ticks;   /* charges since the clock was read */
    int over;         /* LEASE__JSON_SPEND_* once past the budget */
} lease__json_spend;

enum { LEASE__JSON_SPEND_MEMORY = 1, LEASE__JSON_SPEND_LATE };

/* Values of `bytes` in all are about to be made: -1 when that is past the
 * budget, or its deadline has passed (s->over says which). The counts stay
 * below the budget but for the last charge, a field of the answer at
 * most: they cannot wrap. */
int lease__json_spend_add(lease__json_spend *s, size_t bytes, size_t values);

/* Why decoding stopped, after `what` ("field kvs: ") into err: -1, or
 * LEASE__JSON_LATE for the deadline. */
int lease__json_spend_why(const lease__json_spend *s, const char *what, char *err,
                          size_t errsize);

#endif
