/*
 * lease/log.h - the library's structured log: one JSON object per line.
 *
 * By default lines at LEASE_LOG_WARN and above go to stderr. An application
 * routes them into its own logger with lease_log_set(). Lines never contain
 * a password from a store URL.
 */
#ifndef LEASE_LOG_H
#define LEASE_LOG_H

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

#ifdef __cplusplus
}
#endif
#endif
