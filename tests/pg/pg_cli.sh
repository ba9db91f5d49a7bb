#!/usr/bin/env bash
# pg_cli.sh LEASE_BINARY - the `lease` command on PostgreSQL.
#
# Needs LEASE_TEST_PG_URL (the shared test server, set by scripts/test.sh);
# fails without it. Checks that rows written by the reference SQL run by hand (run
# with psql) and by `lease` interoperate, tokens continuing across both;
# that a Bobby-Tables key is stored and read back exactly and drops
# nothing; that an unreachable server (closed port, wrong password) is
# exit 6, never 3; and that no password reaches stderr.
. "$(dirname "$0")/../cli/lib.sh" "$@"
. "$(dirname "$0")/lib_pg.sh"

PGURL=${LEASE_TEST_PG_URL:-}
if [ -z "$PGURL" ]; then
    echo "FATAL: LEASE_TEST_PG_URL is not set: scripts/test.sh starts a PostgreSQL server and exports it" >&2
    exit 1
fi
command -v psql >/dev/null 2>&1 || { echo "FATAL: psql is required" >&2; exit 1; }

# The password of the URL (postgres://user:PW@host...), to look for leaks.
PW=$(printf '%s' "$PGURL" | sed -nE 's#^[a-z]+://[^:/@]+:([^@]*)@.*#\1#p')
P="cli/$(cat /proc/sys/kernel/random/uuid)/"
L() { call "$LEASE" --store "$PGURL" "$@"; }
case $PGURL in *\?*) CSEP='&' ;; *) CSEP='?' ;; esac
LC() { call "$LEASE" --store "$PGURL${CSEP}tokens=counter" "$@"; }
no_leak() {
    if [ -n "$PW" ]; then assert_not_contains "$ERR$OUT" "$PW" "$1: no password"; fi
}
# psql with the reference statements; variables :'key' :'owner' :'token' :'ttl'.
sql() {
    psql "$PGURL" -X -q -At -v ON_ERROR_STOP=1 "$@" 2>"$T/psql.err" || {
        fail "psql failed: $(cat "$T/psql.err")"
        return 1
    }
}
refsql_acquire() { # KEY OWNER TTL -> prints the token, or nothing when busy
    sql -v key="$1" -v owner="$2" -v ttl="$3" <<'SQL' | cut -d'|' -f1
INSERT INTO coordination_lease
(resource_key, owner_id, lease_until, fencing_token)
VALUES
(:'key', :'owner', clock_timestamp() + :'ttl'::interval, 1)
ON CONFLICT (resource_key) DO UPDATE
SET owner_id = EXCLUDED.owner_id,
lease_until = clock_timestamp() + :'ttl'::interval,
fencing_token = coordination_lease.fencing_token + 1
WHERE coordination_lease.lease_until <= clock_timestamp()
RETURNING fencing_token, lease_until;
SQL
}
refsql_release() { # KEY OWNER TOKEN -> prints the number of rows
    sql -v key="$1" -v owner="$2" -v token="$3" <<'SQL'
UPDATE coordination_lease
SET owner_id = NULL,
lease_until = '-infinity'::timestamptz
WHERE resource_key = :'key'
AND owner_id = :'owner'
AND fencing_token = :'token';
\echo :ROW_COUNT
SQL
}
uuid() { cat /proc/sys/kernel/random/uuid; }

section "the reference SQL and lease on one key"
# tokens=counter: the reference SQL's +1 on both sides, checked to the
# number (clock tokens mixed with it: pg_store_clock.c).
K="${P}tenant-42"
R1=$(uuid)
R2=$(uuid)
tok=$(refsql_acquire "$K" "$R1" "30 seconds")
assert_eq "$tok" 1 "the reference first acquire"
LC show "$K" --json
expect_rc 0 "show a lease taken by raw SQL"
assert_eq "$(jget "$OUT" .state)" held "state"
assert_eq "$(jget "$OUT" .owner)" "$R1" "owner"
assert_eq "$(jget "$OUT" .token)" 1 "token"
LC acquire "$K" --ttl 30s
expect_error 3 "acquire while the reference owner holds it"
assert_contains "$ERR" "$R1" "the busy message names the holder"
LC renew "$K" --owner "$R1" --token 1 --ttl 30s
expect_rc 0 "lease renews the reference lease"
LC release "$K" --owner "$R1" --token 1
expect_rc 0 "lease releases the reference lease"
LC acquire "$K" --ttl 30s --json
expect_rc 0 "acquire after the reference release"
assert_eq "$(jget "$OUT" .token)" 2 "the token continues"
O2=$(jget "$OUT" .owner)
assert_eq "$(refsql_acquire "$K" "$R2" "30 seconds")" "" "the reference SQL is refused while lease holds it"
assert_eq "$(refsql_release "$K" "$O2" 1)" 0 "the reference release with an old token changes nothing"
assert_eq "$(refsql_release "$K" "$O2" 2)" 1 "the reference SQL releases lease's lease"
LC renew "$K" --owner "$O2" --token 2
expect_error 4 "renew after the reference SQL released it"
assert_eq "$(refsql_acquire "$K" "$R2" "30 seconds")" 3 "the reference acquire continues the tokens"
LC show "$K" --json
assert_eq "$(jget "$OUT" .token)" 3 "show: token 3"
assert_eq "$(jget "$OUT" .owner)" "$R2" "show: the reference owner"
assert_eq "$(refsql_release "$K" "$R2" 3)" 1 "the reference SQL releases its own"
LC acquire "$K" --ttl 30s --json
assert_eq "$(jget "$OUT" .token)" 4 "lease after the reference SQL: 4"
LC release "$K" --owner "$(jget "$OUT" .owner)" --token 4
expect_rc 0 "release 4"
LC ls "$P" --json
assert_eq "$(jget "$OUT" '.[0].token')" 4 "ls shows the key with token 4"
assert_eq "$(jget "$OUT" '.[0].state')" free "ls: free"

section "a Bobby-Tables key"
BK="${P}x'); DROP TABLE coordination_lease; --"
L acquire "$BK" --ttl 30s --label "o'hara; --" --json
expect_rc 0 "acquire the Bobby-Tables key"
assert_eq "$(jget "$OUT" .key)" "$BK" "the key comes back exactly"
BO=$(jget "$OUT" .owner)
BT=$(jget "$OUT" .token)
L show "$BK" --json
assert_eq "$(jget "$OUT" .key)" "$BK" "show: the key"
assert_eq "$(jget "$OUT" .label)" "o'hara; --" "show: the label"
cnt=$(sql -v key="$BK" <<'SQL'
SELECT count(*) FROM coordination_lease WHERE resource_key = :'key';
SQL
)
assert_eq "$cnt" 1 "the raw row holds the key exactly"
BS="${P}semi;colon\\back\\slash\"dq'sq"
L acquire "$BS" --ttl 30s --json
assert_eq "$(jget "$OUT" .key)" "$BS" "quotes, semicolons and backslashes"
L release "$BS" --owner "$(jget "$OUT" .owner)" --token "$(jget "$OUT" .token)"
expect_rc 0 "release the backslash key"
L fence "$BK" 3
expect_rc 0 "fence a Bobby-Tables resource"
L fence "$BK" 2
expect_error 5 "fence: stale"
L release "$BK" --owner "$BO" --token "$BT"
expect_rc 0 "release the Bobby-Tables key"
reg=$(sql <<'SQL'
SELECT to_regclass('coordination_lease') IS NOT NULL AND to_regclass('lease_fence') IS NOT NULL;
SQL
)
assert_eq "$reg" t "coordination_lease and lease_fence still exist"

section "unreachable: a closed port"
CP=$(free_port)
BAD=$(printf '%s' "$PGURL" | sed -E "s#@([^:/@]+):[0-9]+#@\\1:$CP#")
assert_ne "$BAD" "$PGURL" "the URL was rewritten"
for args in "acquire k" "acquire k --wait 1s" "show k" "ls" "fence r 5" \
    "renew k --owner $R1 --token 1" "release k --owner $R1 --token 1"; do
    # shellcheck disable=SC2086
    call "$LEASE" --store "$BAD" $args
    expect_error 6 "lease $args on a closed port"
    no_leak "lease $args on a closed port"
done
call "$LEASE" --store "$BAD" acquire k
assert_contains "$ERR" "***" "the URL is shown redacted"

section "unreachable: a wrong password"
WRONG=Wr0ngCliPass-77
WP=$(printf '%s' "$PGURL" | sed -E "s#^([a-z]+://[^:/@]+):[^@]*@#\\1:$WRONG@#")
assert_ne "$WP" "$PGURL" "the URL was rewritten"
call "$LEASE" --store "$WP" acquire k
expect_error 6 "acquire with a wrong password"
assert_not_contains "$ERR" "$WRONG" "the wrong password is not shown"
assert_contains "$ERR" "***" "*** in its place"
no_leak "wrong password"
call "$LEASE" --store "$WP" show k --json
expect_error 6 "show with a wrong password"
assert_not_contains "$ERR" "$WRONG" "show: the wrong password is not shown"

finish
