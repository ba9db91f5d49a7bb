#!/usr/bin/env bash
# cli_basic: acquire, renew, release, show, ls, fence, --wait, and how the
# store is chosen (--store, LEASE_STORE, the XDG default).
. "$(dirname "$0")/lib.sh" "$@"

S=sqlite://$T/basic.db
export LEASE_STORE=$S
OWNER_B=6f1c2b7e-1d2a-4c3b-9e8f-0a1b2c3d4e5f

section "acquire --json on a fresh key"
call "$LEASE" acquire k --json --label holder-A
expect_rc 0 "acquire k"
assert_eq "$(jget "$OUT" .key)" k "acquire --json: key"
A_OWNER=$(jget "$OUT" .owner)
assert_match "$A_OWNER" "$UUID_RE" "acquire --json: owner is a UUID"
assert_eq "$(jget "$OUT" .token)" 1 "acquire --json: first token of a fresh key"
assert_eq "$(jget "$OUT" .ttl_ms)" 30000 "acquire --json: default ttl_ms"
assert_eq "$(jget "$OUT" .label)" holder-A "acquire --json: label"
assert_eq "$(jget "$OUT" '.valid_ms | type')" number "acquire --json: valid_ms is a number"
assert_eq "$(jget "$OUT" '[has("key","owner","token","ttl_ms","label","valid_ms")] | all')" \
    true "acquire --json: has key, owner, token, ttl_ms, label, valid_ms"
# remaining_ms, the name show, leader and the agent give the time left, is
# valid_ms's value: one name across the commands, the old one kept.
assert_eq "$(jget "$OUT" '.remaining_ms == .valid_ms and (.remaining_ms | type) == "number"')" \
    true "acquire --json: remaining_ms beside valid_ms, the same value"

section "acquire by another owner: busy"
call "$LEASE" acquire k --owner "$OWNER_B" --label holder-B
expect_error 3 "acquire k held by another owner"
assert_contains "$ERR" holder-A "busy message names the holder's label"

section "acquire again by the holder: same token"
call "$LEASE" acquire k --owner "$A_OWNER" --json
expect_rc 0 "re-acquire by the same owner"
assert_eq "$(jget "$OUT" .token)" 1 "re-acquire by the same owner keeps the token"
assert_eq "$(jget "$OUT" .owner)" "$A_OWNER" "re-acquire: owner"

section "renew"
call "$LEASE" renew k --owner "$A_OWNER" --token 1
expect_rc 0 "renew with the right owner and token"
call "$LEASE" renew k --owner "$A_OWNER" --token 1 --ttl 45s --json
expect_rc 0 "renew --ttl 45s --json"
assert_eq "$(jget "$OUT" .ttl_ms)" 45000 "renew --json: ttl_ms"
assert_eq "$(jget "$OUT" .token)" 1 "renew --json: token"
# The lease keeps its label through a renewal, with --ttl or without.
label_k=$("$LEASE" show k --json | jq -r .label)
assert_eq "$(jget "$OUT" .label)" "$label_k" "renew --ttl --json: the label the lease keeps"
call "$LEASE" acquire lab --label 'the label' --json
lab_owner=$(jget "$OUT" .owner)
lab_token=$(jget "$OUT" .token)
call "$LEASE" renew lab --owner "$lab_owner" --token "$lab_token" --ttl 20s --json
expect_rc 0 "renew lab --ttl 20s --json"
assert_eq "$(jget "$OUT" .label)" "the label" "renew --ttl --json: the label, not \"\""
call "$LEASE" renew lab --owner "$lab_owner" --token "$lab_token" --json
assert_eq "$(jget "$OUT" .label)" "the label" "renew --json: the label"
assert_eq "$(jget "$OUT" .ttl_ms)" 20000 "renew --json: the ttl of the last renewal is kept"
assert_eq "$(jget "$OUT" '.remaining_ms == .valid_ms and (.remaining_ms | type) == "number"')" \
    true "renew --json: remaining_ms beside valid_ms, the same value"
call "$LEASE" renew k --owner "$A_OWNER" --token 2
expect_error 4 "renew with a wrong token"
call "$LEASE" renew k --owner "$OWNER_B" --token 1
expect_error 4 "renew with a wrong owner"

section "release by a wrong owner or token changes nothing"
call "$LEASE" show k --json
expect_rc 0 "show k"
BEFORE=$(jget "$OUT" '[.state, .owner, .token, .label] | @tsv')
assert_eq "$(jget "$OUT" .state)" held "show before the bad release: held"
call "$LEASE" release k --owner "$OWNER_B" --token 1
expect_error 4 "release with a wrong owner"
call "$LEASE" release k --owner "$A_OWNER" --token 7
expect_error 4 "release with a wrong token"
call "$LEASE" show k --json
assert_eq "$(jget "$OUT" '[.state, .owner, .token, .label] | @tsv')" "$BEFORE" \
    "show after refused releases: unchanged"
assert_eq "$(jget "$OUT" .state)" held "still held after refused releases"
assert_eq "$(jget "$OUT" .owner)" "$A_OWNER" "same owner after refused releases"

section "release, show free, acquire again: next token"
call "$LEASE" release k --owner "$A_OWNER" --token 1
expect_rc 0 "release with the right owner and token"
call "$LEASE" show k --json
expect_rc 0 "show k after release"
assert_eq "$(jget "$OUT" .state)" free "state after release"
assert_eq "$(jget "$OUT" .owner)" null "owner after release"
# No holder: no label either, null as lease leader and the agent say it.
assert_eq "$(jget "$OUT" '.label | tostring')" null "label after release"
call "$LEASE" ls k --json
assert_eq "$(jget "$OUT" '[.[] | select(.key == "k") | .label, .owner] | map(tostring) | join(" ")')" \
    "null null" "ls --json: a free key's label and owner"
call "$LEASE" release k --owner "$A_OWNER" --token 1
expect_error 4 "releasing twice"
call "$LEASE" renew k --owner "$A_OWNER" --token 1
expect_error 4 "renewing a released lease"
call "$LEASE" acquire k --owner "$OWNER_B" --json
expect_rc 0 "acquire k after release"
assert_eq "$(jget "$OUT" .token)" 2 "token after release is the next one"
call "$LEASE" renew k --owner "$A_OWNER" --token 1
expect_error 4 "the old holder cannot renew the new lease"
call "$LEASE" show k --json
assert_eq "$(jget "$OUT" '[.state, .owner, .token] | @tsv')" "$(printf 'held\t%s\t2' "$OWNER_B")" \
    "show after the new acquisition"

section "show, ls"
call "$LEASE" show never-acquired --json
expect_error 1 "show of a never-acquired key"
call "$LEASE" show never-acquired
expect_error 1 "show (text) of a never-acquired key"

L=sqlite://$T/ls.db
for key in app/a app/b app/c/d apple other/x; do
    call "$LEASE" --store "$L" acquire "$key"
    expect_rc 0 "acquire $key for ls"
done
call "$LEASE" --store "$L" ls app/ --json
expect_rc 0 "ls app/ --json"
assert_eq "$(jget "$OUT" length)" 3 "ls app/: number of keys"
assert_eq "$(jget "$OUT" '[.[].key] | join(" ")')" "app/a app/b app/c/d" "ls app/: the keys, sorted"
assert_eq "$(jget "$OUT" '[.[] | has("key","state","owner","label","token","remaining_ms","ttl_ms")] | all')" \
    true "ls --json entries carry key, state, owner, label, token, remaining_ms, ttl_ms"
assert_eq "$(jget "$OUT" '[.[].state] | unique | join(" ")')" held "ls app/: states"
call "$LEASE" --store "$L" ls app --json
assert_eq "$(jget "$OUT" length)" 4 "ls app (no slash) also matches apple"
call "$LEASE" --store "$L" ls --json
expect_rc 0 "ls --json"
assert_eq "$(jget "$OUT" length)" 5 "ls without a prefix lists every key"
call "$LEASE" --store "$L" ls nomatch/ --json
expect_rc 0 "ls with a prefix that matches nothing"
assert_eq "$(jget "$OUT" length)" 0 "ls nomatch/: empty array"
# A prefix is bytes, not a pattern: % _ \ and case are taken literally.
W=sqlite://$T/wild.db
for key in 'a%b' axb 'a_c' abc 'A%B' 'a\b'; do
    call "$LEASE" --store "$W" acquire "$key"
    expect_rc 0 "acquire $key for ls"
done
for pair in 'a%=a%b' 'a_=a_c' 'a\=a\b' 'A=A%B' 'ax=axb'; do
    prefix=${pair%%=*}
    call "$LEASE" --store "$W" ls "$prefix" --json
    expect_rc 0 "ls '$prefix'"
    assert_eq "$(jget "$OUT" '[.[].key] | join(" ")')" "${pair#*=}" "ls '$prefix' takes the prefix literally"
done
call "$LEASE" --store "$W" show 'a%b' --json
assert_eq "$(jget "$OUT" .key)" 'a%b' "show 'a%b'"
call "$LEASE" --store "$W" acquire 'é/ü' --json
expect_rc 0 "acquire a UTF-8 key"
assert_eq "$(jget "$OUT" .key)" 'é/ü' "UTF-8 key in JSON"
call "$LEASE" --store "$W" ls 'é' --json
assert_eq "$(jget "$OUT" '[.[].key] | join(" ")')" 'é/ü' "ls of a UTF-8 prefix"

call "$LEASE" --store "$L" ls app/
expect_rc 0 "ls app/ (text)"
assert_eq "$(printf '%s\n' "$OUT" | grep -c .)" 3 "ls app/ (text): one line per key"

section "fence"
call "$LEASE" fence res 5
expect_rc 0 "fence res 5"
call "$LEASE" fence res 5 --json
expect_rc 0 "fence res 5 again (equality is accepted)"
assert_eq "$(jget "$OUT" .accepted)" true "fence res 5 --json: accepted"
assert_eq "$(jget "$OUT" .mark)" 5 "fence res 5 --json: mark"
call "$LEASE" fence res 4
expect_rc 5 "fence res 4 (stale)"
expect_stderr "fence res 4 (stale)"
# One line for one event: the tool's error, not the library's "fenced" log
# line as well (a program that routes the log still gets that).
assert_eq "$(printf '%s\n' "$ERR" | wc -l)" 1 "fence res 4: one line on stderr"
assert_eq "$ERR" "lease fence: ESTALE: 'res' rejected token 4: it has seen 5" \
    "fence res 4: the line is the tool's error"
call "$LEASE" fence res 4 --json
expect_rc 5 "fence res 4 --json (stale)"
assert_eq "$(printf '%s\n' "$ERR" | wc -l)" 1 "fence res 4 --json: one line on stderr"
assert_not_contains "$ERR" '"event"' "fence res 4 --json: no log line on stderr"
assert_eq "$(jget "$OUT" .accepted)" false "fence res 4 --json: accepted"
assert_eq "$(jget "$OUT" .mark)" 5 "fence res 4 --json: mark unchanged"
assert_eq "$(jget "$OUT" .token)" 4 "fence res 4 --json: token"
call "$LEASE" fence res 6 --json
expect_rc 0 "fence res 6"
assert_eq "$(jget "$OUT" .mark)" 6 "fence res 6: mark raised"
call "$LEASE" fence res 5
expect_rc 5 "fence res 5 after 6"
call "$LEASE" fence other-res 1 --json
expect_rc 0 "fence of another resource is independent"
assert_eq "$(jget "$OUT" .mark)" 1 "other resource's mark"

section "acquire --wait"
call "$LEASE" acquire w --ttl 500ms --json
expect_rc 0 "acquire w --ttl 500ms"
W_TOKEN=$(jget "$OUT" .token)
call "$LEASE" acquire w --owner "$OWNER_B" --wait 5s --json
expect_rc 0 "acquire --wait 5s of a key held for 500ms"
assert_gt "$(jget "$OUT" .token)" "$W_TOKEN" "token after waiting"
assert_eq "$(jget "$OUT" .owner)" "$OWNER_B" "owner after waiting"
call "$LEASE" acquire long --ttl 30s
expect_rc 0 "acquire long --ttl 30s"
call "$LEASE" acquire long --owner "$OWNER_B" --wait 200ms
expect_error 7 "acquire --wait 200ms of a key held for 30s"

section "expired lease"
call "$LEASE" acquire e --ttl 100ms --label gone --json
expect_rc 0 "acquire e --ttl 100ms"
E_OWNER=$(jget "$OUT" .owner)
wait_for "e expires" key_state_is e expired
# SQLite keeps the holder that did not renew in time: shown, label too.
call "$LEASE" show e --json
assert_eq "$(jget "$OUT" '[.state, .owner, .label] | @tsv')" "$(printf 'expired\t%s\tgone' "$E_OWNER")" \
    "show of an expired lease: the holder the store kept, with its label"
call "$LEASE" renew e --owner "$E_OWNER" --token 1
expect_error 4 "renewing an expired lease"
call "$LEASE" acquire e --owner "$E_OWNER" --json
expect_rc 0 "re-acquire an expired lease by its old owner"
assert_eq "$(jget "$OUT" .token)" 2 "an expired lease is not revived with its old token"

section "default store: XDG_STATE_HOME"
call env -u LEASE_STORE XDG_STATE_HOME="$T/state" "$LEASE" acquire dk
expect_rc 0 "acquire with the default store"
assert_file "$T/state/lease/lease.db" "default store file under XDG_STATE_HOME"
call env -u LEASE_STORE XDG_STATE_HOME="$T/state" "$LEASE" show dk --json
expect_rc 0 "show with the default store"
assert_eq "$(jget "$OUT" .state)" held "the default store kept the lease"
call "$LEASE" --store "sqlite://$T/state/lease/lease.db" show dk --json
expect_rc 0 "the default store is the file under XDG_STATE_HOME"

section "default store: HOME when XDG_STATE_HOME is unset"
call env -u LEASE_STORE -u XDG_STATE_HOME HOME="$T/h2" "$LEASE" acquire hk
expect_rc 0 "acquire with the HOME default"
assert_file "$T/h2/.local/state/lease/lease.db" "default store file under ~/.local/state"

section "LEASE_STORE"
call env LEASE_STORE="sqlite://$T/env.db" XDG_STATE_HOME="$T/state" "$LEASE" acquire envkey
expect_rc 0 "acquire with LEASE_STORE"
assert_file "$T/env.db" "LEASE_STORE's file"
call "$LEASE" --store "sqlite://$T/env.db" show envkey
expect_rc 0 "the key is in LEASE_STORE's file"
call env -u LEASE_STORE XDG_STATE_HOME="$T/state" "$LEASE" show envkey
expect_rc 1 "the key is not in the default store"
call env LEASE_STORE="sqlite://$T/env.db" "$LEASE" --store "sqlite://$T/flag.db" acquire flagkey
expect_rc 0 "--store wins over LEASE_STORE"
call "$LEASE" --store "sqlite://$T/flag.db" show flagkey
expect_rc 0 "the key is in --store's file"
call env LEASE_STORE="sqlite://$T/env.db" "$LEASE" show flagkey
expect_rc 1 "the key is not in LEASE_STORE's file"

section "--store before or after the command"
P=sqlite://$T/pos.db
call env -u LEASE_STORE "$LEASE" --store "$P" acquire before
expect_rc 0 "--store before the command"
call env -u LEASE_STORE "$LEASE" acquire after --store "$P"
expect_rc 0 "--store after the command"
call env -u LEASE_STORE "$LEASE" acquire eq "--store=$P"
expect_rc 0 "--store=URL after the command"
call env -u LEASE_STORE "$LEASE" ls --store "$P" --json
expect_rc 0 "ls --store after the command"
assert_eq "$(jget "$OUT" '[.[].key] | join(" ")')" "after before eq" "all three keys in the same store"

finish
