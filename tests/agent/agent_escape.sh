#!/usr/bin/env bash
# agent_escape: labels, names and keys that are not valid UTF-8 or that hold
# control characters (issue 10 item 9), with the one escaping rule of
# docs/conventions.md: in JSON, invalid bytes are U+FFFD and nothing is
# dropped; in text, control characters, backslash and invalid bytes are \xNN.
# (a) an agent whose election name and label are not UTF-8: /leader is 200
#     with JSON that jq parses, the label as U+FFFD; its --json events parse;
#     `lease leader --json` prints parseable JSON, exit 0; `lease leader`
#     text shows \xNN, no raw byte;
# (b) a label $'\x1b]0;pwned\x07\nforged': /leader and `lease leader --json`
#     carry it JSON-escaped; the text is one line with no escape, bell or
#     newline from the label;
# (c) the renewal_failed log line of a non-UTF-8 key whose renewal fails,
#     for `lease renew` and for the keeper of `lease run`, is still written,
#     as JSON with the key as U+FFFD.
# Every wait is a bounded loop.
. "$(dirname "$0")/../cli/lib.sh" "$@"
. "$(dirname "$0")/../cli/agent_lib.sh"

for tool in curl ss shuf; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "FATAL: '$tool' is required by agent_escape but was not found in PATH" >&2
        exit 1
    fi
done

DB=$T/escape.db
export LEASE_STORE=sqlite://$DB
FFFD=$'\xef\xbf\xbd'


# get PORT PATH: "HTTP_CODE BODY" of GET http://127.0.0.1:PORT/PATH.
get() {
    curl -s --noproxy "*" --max-time 2 -w '%{http_code} ' -o "$T/body" \
        "http://127.0.0.1:$1$2" && cat "$T/body"
}

healthy() {
    local r
    r=$(get "$1" /healthz) || return 1
    [ "${r%% *}" = 200 ] && [ "$(jget "${r#* }" .ok)" = true ]
}

# leads PORT: the agent at PORT answers /leader with 200 and leads.
leads() {
    local r
    r=$(get "$1" /leader) || return 1
    [ "${r%% *}" = 200 ] && [ "$(jget "${r#* }" .this_agent_leads)" = true ]
}

# start_agent VAR NAME LABEL: `lease agent NAME --label LABEL --json` on a
# free port; sets ${VAR}_PID and ${VAR}_PORT once /healthz answers, then
# waits (a check that can fail) until /leader says that it leads.
start_agent() {
    agent_on_free_port "${1}_PID" "${1}_PORT" "$1" "$T/$1.err" healthy launch_agent "$@"
    wait_for "agent $1: /leader answers 200 and says it leads" leads "$PORT"
}

# launch_agent VAR NAME LABEL: exec the agent on $PORT.
launch_agent() {
    exec "$LEASE" agent "$2" --listen "127.0.0.1:$PORT" --ttl 5s --label "$3" \
        --json >"$T/$1.out" 2>"$T/$1.err"
}

# no_raw_controls TEXT DESCRIPTION: TEXT holds no byte 0x00-0x1f or 0x7f but
# newlines, and no byte that is not part of valid UTF-8.
no_raw_controls() {
    local bad
    bad=$(printf '%s' "$1" | tr -d '\n' | LC_ALL=C tr -d '\040-\176' | od -An -c | head -c 200)
    if [ -z "$bad" ]; then pass; else
        fail "$2: raw bytes in the output: $bad"
    fi
}

section "(a) a name and a label that are not UTF-8"
NAME_A=$'e\xffa'
start_agent A "$NAME_A" $'\xff\xfe'
R=$(get "$A_PORT" /leader)
echo "    /leader: $R"
assert_eq "${R%% *}" 200 "/leader answers 200"
BODY=${R#* }
assert_eq "$(jget "$BODY" '.label')" "$FFFD$FFFD" "/leader: the label with U+FFFD"
assert_eq "$(jget "$BODY" '.name')" "e${FFFD}a" "/leader: the name with U+FFFD"
assert_eq "$(jget "$BODY" '[.leader, .this_agent_leads] | map(tostring) | join(" ")')" "true true" \
    "/leader: leader and this_agent_leads"
assert_match "$(jget "$BODY" .owner)" "$UUID_RE" "/leader: the owner is a UUID"
EPOCH_A=$(jget "$BODY" .epoch)
assert_match "$EPOCH_A" '^[1-9][0-9]*$' "/leader: the epoch"
assert_eq "$(jq -r 'select(.event == "leading") | .name' "$T/A.out" 2>&1)" "e${FFFD}a" \
    "the agent's --json leading event parses, the name with U+FFFD"
assert_eq "$(jq -r 'select(.event == "listening") | .name' "$T/A.out" 2>&1)" "e${FFFD}a" \
    "the agent's --json listening event parses"
call "$LEASE" leader "$NAME_A" --json
expect_rc 0 "lease leader --json"
assert_eq "$(jget "$OUT" '[.leader, .epoch, .label, .name] | map(tostring) | join(" ")')" \
    "true $EPOCH_A $FFFD$FFFD e${FFFD}a" "lease leader --json: parseable, the label with U+FFFD"
call "$LEASE" leader "$NAME_A"
expect_rc 0 "lease leader"
assert_match "$OUT" '^e\\xffa: leader \\xff\\xfe \(owner [0-9a-f-]{36}\) epoch [0-9]+, [0-9]+ms left$' \
    "lease leader: name and label as \\xNN"
no_raw_controls "$OUT" "lease leader"

section "(b) a label that sets the terminal title and forges a line"
EVIL=$'\x1b]0;pwned\x07\nforged'
start_agent B evil "$EVIL"
R=$(get "$B_PORT" /leader)
echo "    /leader: $R"
assert_eq "${R%% *}" 200 "/leader answers 200"
BODY=${R#* }
assert_eq "$(jget "$BODY" '.label')" "$EVIL" "/leader: the label, JSON-escaped, reads back exactly"
no_raw_controls "$BODY" "/leader's body"
call "$LEASE" leader evil --json
expect_rc 0 "lease leader --json"
assert_eq "$(jget "$OUT" .label)" "$EVIL" "lease leader --json: the label reads back exactly"
assert_eq "$(printf '%s\n' "$OUT" | wc -l)" 1 "lease leader --json: one line"
call "$LEASE" leader evil
expect_rc 0 "lease leader"
echo "    text: $OUT"
assert_eq "$(printf '%s\n' "$OUT" | wc -l)" 1 "lease leader: one line, no forged one"
assert_contains "$OUT" 'leader \x1b]0;pwned\x07\x0aforged (owner ' "lease leader: the label as \\xNN"
no_raw_controls "$OUT" "lease leader"
for v in A B; do
    pid_var=${v}_PID
    kill -TERM "${!pid_var}"
    wait_exit "${!pid_var}" agent_rc "agent $v after SIGTERM"
    assert_eq "$agent_rc" 0 "agent $v exits 0 after SIGTERM (and, under ASan, without a leak)"
done
call "$LEASE" leader 'back\slash'
expect_rc 1 "lease leader of a name that never had a leader"

section "(c) renewal_failed is logged for a key that is not UTF-8"
# A valid two-byte character (e with acute) is kept; only the invalid
# bytes are replaced, the same way in the tool's JSON and in the log line.
KEY=$'k\xc3\xa9\xff\xfe\x1b'
KEY_JSON=k$'\xc3\xa9'$FFFD$FFFD$'\x1b'
call "$LEASE" acquire "$KEY" --ttl 1m --json
expect_rc 0 "acquire a non-UTF-8 key"
OWNER=$(jget "$OUT" .owner)
TOKEN=$(jget "$OUT" .token)
assert_eq "$(jget "$OUT" .key)" "$KEY_JSON" "acquire --json: the key with U+FFFD"
# Another owner takes the row, as a store writer could: the renew is refused.
sqlite3 -cmd '.timeout 5000' "$DB" \
    "UPDATE lease SET owner = '00000000-0000-4000-8000-000000000001'" ||
    die "cannot change the owner in $DB"
call "$LEASE" renew "$KEY" --owner "$OWNER" --token "$TOKEN"
expect_rc 4 "renew after the owner changed"
LINE=$(printf '%s\n' "$ERR" | grep '"event":"renewal_failed"')
echo "    log: $LINE"
assert_eq "$(jget "$LINE" '[.level, .event, .store, .key, .owner, .token] | map(tostring) | join(" ")')" \
    "warn renewal_failed sqlite $KEY_JSON $OWNER $TOKEN" \
    "lease renew: the renewal_failed line, the key with U+FFFD"
assert_contains "$(jget "$LINE" .message)" "$KEY_JSON" "the line's message names the key, with U+FFFD"

RKEY=$'run\xc3('
"$LEASE" run "$RKEY" --ttl 1500ms -- sleep 60 >"$T/run.out" 2>"$T/run.err" &
RUN_PID=$!
bg_register "$RUN_PID"
wait_for "lease run holds the key" key_state_is "$RKEY" held
sqlite3 -cmd '.timeout 5000' "$DB" \
    "UPDATE lease SET owner = '00000000-0000-4000-8000-000000000002' WHERE owner <> '00000000-0000-4000-8000-000000000001'" ||
    die "cannot change the owner in $DB"
renewal_logged() {
    grep -q '"event":"renewal_failed"' "$T/run.err"
}
WAIT_TRIES=400 wait_for "the keeper of lease run logs renewal_failed" renewal_logged
LINE=$(grep '"event":"renewal_failed"' "$T/run.err" | head -n 1)
echo "    log: $LINE"
assert_eq "$(jget "$LINE" '[.event, .key] | map(tostring) | join(" ")')" \
    "renewal_failed run$FFFD(" "lease run: the keeper's renewal_failed line, the key with U+FFFD"
wait_exit "$RUN_PID" run_rc "lease run after losing its lease"
assert_ne "$run_rc" 0 "lease run fails after losing its lease"

finish
