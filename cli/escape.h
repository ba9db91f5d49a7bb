/*
 * escape.h - the one escaping rule for everything the tool prints.
 *
 * Keys, labels, owners and messages are bytes chosen by users (or by
 * whoever can write to the store). They reach terminals and JSON readers:
 * - JSON: a byte that is not part of a valid UTF-8 sequence is shown as
 *   U+FFFD; the rest of the string is kept. A field is never dropped.
 * - text (ls, show, history, leader, errors): control characters (0x00-0x1f,
 *   0x7f, and the C1 controls U+0080-U+009F, written as their two bytes
 *   \xc2\xNN), the invisible format characters that reorder or split a
 *   line (bidirectional overrides and isolates, zero-width marks, U+2028/9,
 *   U+FEFF: each of their bytes as \xNN), backslash and bytes that are not
 *   valid UTF-8 are written as \xNN (backslash as \\), so a value can
 *   neither move the cursor, set the terminal's title, reorder a column
 *   nor start a forged line.
 * Which bytes are valid UTF-8 is decided by the library (lease_utf8_len in
 * lease/log.h), the same rule its JSON log lines follow.
 */
#ifndef LEASE_CLI_ESCAPE_H
#define LEASE_CLI_ESCAPE_H

#include <stdio.h>
#include <jansson.h>

/* A JSON string for s (json null for NULL); never NULL itself. */
json_t *cli_json_str(const char *s);
/* Writes s to f under the text rule above. */
void cli_put_text(FILE *f, const char *s);

#endif
