#!/usr/bin/env bash
# cli_escape: keys and labels are anybody's bytes. `run`/`elect --json`
# keep emitting their events for a key that is not UTF-8; the text output
# of show, ls, history, acquire and the error messages never carries a raw
# control character (a label "\e]0;pwned\a\nforged" must neither set the
# terminal's title nor forge a line).
. "$(dirname "$0")/lib.sh" "$@"
export T

S=sqlite://$T/escape.db
export LEASE_STORE=$S
BADKEY=$'bad\xff\xfekey'
CTLKEY=$'ctl\e]0;pwned\a\nforged'
EVIL=$'\e]0;pwned\a\nforged line\r\e[2J'
BADLABEL=$'lab\xc3\x28el'
FFFD=$'\xef\xbf\xbd' # U+FFFD in UTF-8

# no_ctl FILE DESCRIPTION: no byte < 0x20 or 0x7f but newline and tab.
no_ctl() {
    if tr -d '\n\t' <"$1" | LC_ALL=C grep -q '[[:cntrl:]]'; then
        fail "$2: a control character in: $(od -c "$1" | head -20)"
    else
        pass
    fi
}

# lines FILE: how many lines.
lines() {
    wc -l <"$1" | tr -d ' '
}

section "run --json / elect --json with a key that is not UTF-8"
R=sqlite://$T/run.db
for cmd in run elect; do
    for key in "$BADKEY" "$CTLKEY"; do
        call "$LEASE" --store "$R" "$cmd" "$key" --json -- true
        expect_rc 0 "$cmd --json with key $(printf %q "$key")"
        printf '%s\n' "$ERR" | grep '^{' >"$T/ev.json"
        assert_eq "$(jq -c . "$T/ev.json" >/dev/null 2>&1 && echo ok)" ok \
            "$cmd $(printf %q "$key"): jq parses every event line"
        assert_eq "$(jq -s -r 'map(select(has("event"))) | map(.event) | join(" ")' "$T/ev.json" 2>&1)" \
            "acquired started exited released" "$cmd $(printf %q "$key"): every event is there"
        assert_eq "$(jq -s -r 'map(select(has("event"))) | map(.key | length > 0) | all' "$T/ev.json" 2>&1)" \
            true "$cmd $(printf %q "$key"): every event has its key"
        printf '%s\n' "$ERR" >"$T/ev.err"
        no_ctl "$T/ev.err" "$cmd --json $(printf %q "$key"): stderr"
    done
done
call "$LEASE" --store "$R" run "$BADKEY" --json -- true
assert_eq "$(printf '%s\n' "$ERR" | grep '^{' | head -1 | jq -r .key 2>&1)" "bad${FFFD}${FFFD}key" \
    "run --json: invalid bytes of the key are U+FFFD"

section "text output of show, ls, history with hostile labels and keys"
call "$LEASE" acquire evil --label "$EVIL" --ttl 10m
expect_rc 0 "acquire with a label of control characters"
call "$LEASE" acquire "$CTLKEY" --label "$BADLABEL" --ttl 10m
expect_rc 0 "acquire a key of control characters"
printf '%s\n' "$OUT" >"$T/acq.out"
no_ctl "$T/acq.out" "acquire: text output"
assert_eq "$(lines "$T/acq.out")" 1 "acquire: one line"
call "$LEASE" acquire "$BADKEY" --label plain --ttl 10m
expect_rc 0 "acquire a key that is not UTF-8"

"$LEASE" show evil >"$T/show.out" 2>&1
no_ctl "$T/show.out" "show: text output"
assert_eq "$(lines "$T/show.out")" 1 "show: one line, none forged"
assert_contains "$(cat "$T/show.out")" '\x1b]0;pwned\x07\x0aforged line\x0d\x1b[2J' \
    "show: the label's control characters as \\xNN"
"$LEASE" show "$CTLKEY" >"$T/show2.out" 2>&1
no_ctl "$T/show2.out" "show of a key with control characters"
assert_eq "$(lines "$T/show2.out")" 1 "show of a key with control characters: one line"
assert_contains "$(cat "$T/show2.out")" 'lab\xc3(el' "show: invalid UTF-8 as \\xNN"

"$LEASE" ls >"$T/ls.out" 2>&1
no_ctl "$T/ls.out" "ls: text output"
assert_eq "$(lines "$T/ls.out")" 3 "ls: one line per key (3), none forged"

for key in evil "$CTLKEY" "$BADKEY"; do
    "$LEASE" history "$key" >"$T/hist.out" 2>&1
    no_ctl "$T/hist.out" "history $(printf %q "$key"): text output"
    assert_eq "$(lines "$T/hist.out")" 2 "history $(printf %q "$key"): header and one grant"
done
"$LEASE" history "$CTLKEY-none" >"$T/hist1.out" 2>&1
no_ctl "$T/hist1.out" "history of an unknown key with control characters"
assert_eq "$(lines "$T/hist1.out")" 1 "history of an unknown key with control characters: one line"

section "JSON output keeps the exact label, and invalid bytes as U+FFFD"
call "$LEASE" show evil --json
assert_eq "$(jget "$OUT" .label)" "$EVIL" "show --json: the label, exactly"
call "$LEASE" ls --json
assert_eq "$(jget "$OUT" 'length')" 3 "ls --json: every key"
assert_eq "$(jget "$OUT" '[.[].key] | map(select(test("^bad"))) | .[0]')" "bad${FFFD}${FFFD}key" \
    "ls --json: a key that is not UTF-8 with U+FFFD"
call "$LEASE" history "$CTLKEY" --json
assert_eq "$(jget "$OUT" '.[0].label')" "lab${FFFD}(el" "history --json: label with U+FFFD"
call "$LEASE" release "$BADKEY" --owner "$(jget "$("$LEASE" show "$BADKEY" --json)" .owner)" --token 1 --json
expect_rc 0 "release --json of a key that is not UTF-8"
assert_eq "$(jget "$OUT" .released)" true "release --json: printed"

section "error messages"
call "$LEASE" show "$CTLKEY-missing"
expect_rc 1 "show of an unknown key"
printf '%s\n' "$ERR" >"$T/err1"
no_ctl "$T/err1" "show of an unknown key: the message"
assert_eq "$(lines "$T/err1")" 1 "show of an unknown key: one line"
call "$LEASE" acquire k $'--bogus\e[2J\nforged'
expect_rc 2 "an unknown option of control characters"
printf '%s\n' "$ERR" >"$T/err2"
no_ctl "$T/err2" "unknown option: the message"
assert_eq "$(lines "$T/err2")" 2 "unknown option: the message and the hint, nothing forged"
call "$LEASE" acquire evil --label x
expect_rc 3 "acquire of a held key"
printf '%s\n' "$ERR" >"$T/err3"
no_ctl "$T/err3" "busy: the message naming the holder's label"

finish
