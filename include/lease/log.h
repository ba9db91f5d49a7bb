/*
 * lease/log.h - the library's structured log: one JSON object per line.
 *
 * By default lines at LEASE_LOG_WARN and above go to stderr. An application
 * routes them into its own logger with lease_log_set(). Lines never contain
 * a password from a store URL.
 */
#ifndef LEASE_LOG_H
#define LEASE_LOG_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lease_log_level {
    LEASE_LOG_DEBUG = 0,
    LEASE_LOG_INFO = 1,
    LEASE_LOG_WARN = 2,
    LEASE_LOG_ERROR = 3,
    LEASE_LOG_OFF = 4
} lease_log_level;

/*
 * Receives one line: a JSON object without a trailing newline, e.g.
 * {"time":"2026-11-30T05:20:01.123Z","level":"warn","event":"durability",
 *  "store":"redis","message":"..."}. Called from whichever thread logged;
 * it must be thread-safe and must not call back into the library.
 */
typedef void (*lease_log_fn)(lease_log_level level, const char *line,
                             void *payload);

/*
 * Send lines at `min_level` and above to `fn` (NULL: stderr). Call it at
 * start-up, before other threads use the library.
 */
void lease_log_set(lease_log_fn fn, void *payload, lease_log_level min_level);

/*
 * Keys, labels, owners and store messages are bytes; a JSON string must be
 * UTF-8. The log lines and the `lease` tool follow one rule to show them
 * (docs/conventions.md, "Printed output"), built on these two functions,
 * which are safe from any thread.
 *
 * lease_utf8_len: the length in bytes (1 to 4) of the valid UTF-8 character
 * that starts at `s`, or 0 when the byte at `s` starts none (a stray
 * continuation byte, an overlong form, a surrogate, a code point above
 * U+10FFFF, a sequence cut short) or is the terminating NUL. It never reads
 * past that NUL.
 */
size_t lease_utf8_len(const char *s);

/*
 * A copy of the string `s` in which every byte that is not part of a valid
 * UTF-8 character is replaced by U+FFFD (EF BF BD); valid characters,
 * control characters included, are kept. The copy is malloc'ed: free it
 * with free(). NULL when out of memory or `s` is NULL.
 */
char *lease_text_utf8(const char *s);

#ifdef __cplusplus
}
#endif
#endif
