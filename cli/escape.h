/*
 * escape.h - the one escaping rule for everything the tool prints.
 *
 * Keys, labels, owners and messages are bytes chosen by users (or by
 * whoever can write to the store). They reach terminals and JSON readers:
 * - JSON: a byte that is not part of a valid UTF-8 sequence is shown as
 *   U+FFFD; the rest of the string is kept. A field is never dropped.
 * - text (ls, show, history, leader, errors): control characters (0x00-0x1f,
 *   0x7f), backslash and bytes that are not valid UTF-8 are written as
 *   \xNN (backslash as \\), so a value can neither move the cursor, set
 *   the terminal's title nor start a forged line.
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
