/*
 * lease/parse.h - parsing the values people type: durations and tokens.
 * Pure functions, safe from any thread.
 */
#ifndef LEASE_PARSE_H
#define LEASE_PARSE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Parse a duration such as "250ms", "30s", "5m", "2h" or "1m30s" into
 * milliseconds. Units are required (ms, s, m, h); no sign, no spaces, no
 * fractions. LEASE_EINVALID for anything else, including a value that does
 * not fit in 64 bits. "0s" parses as 0: callers decide whether 0 is allowed.
 */
int lease_parse_duration(uint64_t *ms, const char *text);

/*
 * Parse a fencing token: decimal digits only, 1 .. 2^63-1 (the range every
 * store can keep). LEASE_EINVALID otherwise.
 */
int lease_parse_token(uint64_t *token, const char *text);

#ifdef __cplusplus
}
#endif
#endif
