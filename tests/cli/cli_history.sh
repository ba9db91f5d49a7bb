#!/usr/bin/env bash
# cli_history: `lease history KEY [--limit N] [--json]` after a run that
# released, an owner killed with SIGKILL (expired), a holder whose renew came
# too late (lost) and a current holder (held); the upgrade of an SQLite file
# made before the history existed; bad flags.
. "$(dirname "$0")/lib.sh" "$@"

S=sqlite://$T/history.db
export LEASE_STORE=$S

section "a key never acquired has an empty history"
call "$LEASE" history never
expect_rc 0 "history of a key never acquired"
assert_contains "$OUT" "no grants recorded" "history: says nothing was recorded"
call "$LEASE" history never --json
expect_rc 0 "history --json of a key never acquired"
assert_eq "$OUT" "[]" "history --json: empty array"

section "released: lease run, whose command ends"
call "$LEASE" run job --ttl 2s --label runner -- true
expect_rc 0 "lease run -- true"

section "expired: the owning process is killed with SIGKILL"
"$LEASE" run job --ttl 1s --label doomed -- sleep 60 >/dev/null 2>&1 &
RUN_PID=$!
bg_register "$RUN_PID"
wait_for "job held by the doomed run" key_state_is job held
kill_tree "$RUN_PID"
wait "$RUN_PID" 2>/dev/null
wait_for "job expired after the kill" key_state_is job expired

section "lost: a holder renews after its lease ran out"
call "$LEASE" acquire job --ttl 300ms --label late --json
expect_rc 0 "acquire job by the late holder"
LATE_OWNER=$(jget "$OUT" .owner)
LATE_TOKEN=$(jget "$OUT" .token)
wait_for "job expired under the late holder" key_state_is job expired
call "$LEASE" renew job --owner "$LATE_OWNER" --token "$LATE_TOKEN"
expect_error 4 "renew after expiry"

section "held: the current holder"
call "$LEASE" acquire job --ttl 60s --label current --json
expect_rc 0 "acquire job by the current holder"
CUR_TOKEN=$(jget "$OUT" .token)

section "history --json, newest first"
call "$LEASE" history job --json
expect_rc 0 "history job --json"
assert_eq "$(jget "$OUT" 'length')" 4 "four grants"
assert_eq "$(jget "$OUT" '[.[].ended] | join(",")')" "held,lost,expired,released" \
    "endings, newest first"
assert_eq "$(jget "$OUT" '[.[].label] | join(",")')" "current,late,doomed,runner" \
    "labels, newest first"
assert_eq "$(jget "$OUT" '.[0].token')" "$CUR_TOKEN" "newest entry is the current token"
assert_eq "$(jget "$OUT" '.[1].owner')" "$LATE_OWNER" "the lost entry's owner"
assert_eq "$(jget "$OUT" '[.[].token] | . == (sort | reverse) and (unique | length) == 4')" \
    true "tokens strictly decreasing"
assert_eq "$(jget "$OUT" '.[0].ended_at')" null "a held grant has no end time"
assert_eq "$(jget "$OUT" '.[3].ended_ms >= .[3].acquired_ms')" true \
    "released after acquired"
assert_eq "$(jget "$OUT" '[.[] | has("token","owner","label","ttl_ms","acquired","acquired_ms","ended","ended_at","ended_ms")] | all')" \
    true "every entry has token, owner, label, ttl_ms, acquired(_ms), ended, ended_at, ended_ms"
assert_match "$(jget "$OUT" '.[0].acquired')" \
    '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$' "acquired is RFC 3339 UTC"

section "history in text, and --limit"
call "$LEASE" history job
expect_rc 0 "history job"
assert_eq "$(printf '%s\n' "$OUT" | wc -l)" 5 "a header and four lines"
assert_contains "$OUT" "TOKEN" "text: header"
assert_eq "$(printf '%s\n' "$OUT" | sed -n 2p | awk '{print $1, $3}')" "$CUR_TOKEN held" \
    "text: newest first, held"
assert_contains "$(printf '%s\n' "$OUT" | sed -n 5p)" "released" "text: oldest released"
call "$LEASE" history job --limit 2 --json
expect_rc 0 "history --limit 2"
assert_eq "$(jget "$OUT" '[.[].ended] | join(",")')" "held,lost" "--limit 2: the newest two"

section "bad flags: usage (2), nothing changed"
BEFORE=$("$LEASE" history job --json)
for args in "history" "history job --limit 0" "history job --limit x" \
    "history job --limit -3" "history job extra" "history job --bogus" \
    "history job --limit" "history job --limit 201"; do
    # shellcheck disable=SC2086
    call "$LEASE" $args
    expect_error 2 "lease $args"
done
call "$LEASE" history ""
expect_error 2 "history of an empty key"
assert_eq "$("$LEASE" history job --json)" "$BEFORE" "history unchanged by refused commands"
call "$LEASE" history --help
expect_rc 0 "history --help"
assert_contains "$OUT" "usage: lease history" "history --help prints its usage"

section "an SQLite file from before the history is upgraded in place"
OLD=$T/old.db
sqlite3 "$OLD" >/dev/null <<'SQL' || die "cannot make the old store"
PRAGMA journal_mode=WAL;
CREATE TABLE lease (key TEXT PRIMARY KEY, owner TEXT, label TEXT NOT NULL DEFAULT '',
  token INTEGER NOT NULL DEFAULT 0 CHECK (token >= 0), boot_id TEXT NOT NULL DEFAULT '',
  expires_ms INTEGER NOT NULL DEFAULT 0, ttl_ms INTEGER NOT NULL DEFAULT 0,
  acquired_ms INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE TABLE lease_fence (resource TEXT PRIMARY KEY, mark INTEGER NOT NULL CHECK (mark >= 0)) WITHOUT ROWID;
CREATE TABLE lease_data (name TEXT PRIMARY KEY, value BLOB NOT NULL, token INTEGER NOT NULL,
  key TEXT NOT NULL) WITHOUT ROWID;
INSERT INTO lease (key, owner, token) VALUES ('old', NULL, 41);
INSERT INTO lease_fence VALUES ('res', 41);
PRAGMA user_version = 1;
SQL
call "$LEASE" --store "sqlite://$OLD" history old --json
expect_rc 0 "history on an old file"
assert_eq "$OUT" "[]" "nothing recorded before the upgrade"
assert_eq "$(sqlite3 "$OLD" "SELECT count(*) FROM sqlite_master WHERE name = 'lease_history'")" 1 \
    "the history table was added"
assert_eq "$(sqlite3 "$OLD" 'PRAGMA user_version')" 1 \
    "schema version still 1: builds that know no history keep working on the file"
call "$LEASE" --store "sqlite://$OLD" acquire old --label upgraded --json
expect_rc 0 "acquire on the upgraded file"
assert_eq "$(jget "$OUT" .token)" 42 "the token counter survived the upgrade"
call "$LEASE" --store "sqlite://$OLD" history old --json
assert_eq "$(jget "$OUT" '[.[] | "\(.token) \(.ended) \(.label)"] | join(",")')" \
    "42 held upgraded" "the first grant after the upgrade is recorded"
call "$LEASE" --store "sqlite://$OLD" fence res 40
expect_error 5 "the fence mark survived the upgrade"

finish
