#!/usr/bin/env bash
# etcd_auth (issue 10, item 5): a member with etcd's auth enabled.
#  - the user's password from ?password_file= (0600; refused with group or
#    other permissions, before any connection) or from the URL;
#  - a wrong password is ESTORE, and no message shows it, even when the
#    server repeats it (a fake member, fake_etcd.py, does);
#  - an auth token that expires (--auth-token-ttl 2) under a holder that
#    renews for longer than that is renewed: the holder keeps its lease.
. "$(dirname "$0")/etcd_lib.sh" "$@"
command -v python3 >/dev/null || die "python3 is required"

PW='Pw-0f-r00t-7731'
section "a member with auth enabled, tokens valid for 2 s"
cp=$(free_port) && pp=$(free_port) || die "free ports"
mkdir -p "$ED/a1"
nohup etcd --name a1 --data-dir "$ED/a1/data" \
    --listen-client-urls "http://127.0.0.1:$cp" --advertise-client-urls "http://127.0.0.1:$cp" \
    --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
    --initial-cluster "a1=http://127.0.0.1:$pp" --auth-token-ttl 2 >"$ED/a1/log" 2>&1 &
echo $! >"$ED/a1/pid"
ready() { curl -fs -m 1 "http://127.0.0.1:$cp/health" | grep -q '"health":"true"'; }
wait_for "the member is healthy" ready || die "no member"
ectl_at "$cp" user add root --new-user-password="$PW" >/dev/null 2>&1 || die "user add"
ectl_at "$cp" auth enable >/dev/null 2>&1
wait_for "auth is enabled" bash -c \
    "curl -s -m 1 -X POST -d '{\"key\":\"YQ==\"}' http://127.0.0.1:$cp/v3/kv/range | grep -q 'user name is empty'"

printf '%s\n' "$PW" >"$T/pw"
chmod 600 "$T/pw"
FILEURL="etcd://root@127.0.0.1:$cp?password_file=$T/pw"

section "the password from a file, from the URL"
call "$LEASE" --store "$FILEURL" acquire au/k --ttl 10s --json
expect_rc 0 "acquire with ?password_file="
assert_token "$(jget "$OUT" .token)" "acquire with ?password_file=: a token"
call "$LEASE" --store "etcd://root:$PW@127.0.0.1:$cp" show au/k --json
expect_rc 0 "show with the password in the URL"
assert_eq "$(jget "$OUT" .state)" "held" "show: held"
call "$LEASE" --store "etcd://127.0.0.1:$cp" show au/k
expect_error 6 "no user: etcd refuses"

section "wrong passwords are refused and never shown"
call "$LEASE" --store "etcd://root:Wr0ng-In-Url-42@127.0.0.1:$cp" show au/k
expect_error 6 "a wrong password in the URL"
assert_not_contains "$ERR" "Wr0ng-In-Url-42" "the wrong password is not shown"
printf 'Wr0ng-In-File-43\n' >"$T/bad"
chmod 600 "$T/bad"
call "$LEASE" --store "etcd://root@127.0.0.1:$cp?password_file=$T/bad" show au/k
expect_error 6 "a wrong password in the file"
assert_not_contains "$ERR" "Wr0ng-In-File-43" "the file's wrong password is not shown"

section "bad password files: exit 2 before any connection"
chmod 640 "$T/pw"
call "$LEASE" --store "$FILEURL" show au/k
expect_error 2 "a password file the group may read"
assert_contains "$ERR" "chmod 600" "the message says what to do"
chmod 600 "$T/pw"
call "$LEASE" --store "etcd://127.0.0.1:$cp?password_file=$T/pw" show au/k
expect_error 2 "a password file without a user"
call "$LEASE" --store "etcd://root:x@127.0.0.1:$cp?password_file=$T/pw" show au/k
expect_error 2 "a password in the URL and a password file"
call "$LEASE" --store "etcd://root@127.0.0.1:$cp?password_file=$T/none" show au/k
expect_error 2 "a password file that does not exist"
: >"$T/empty"
chmod 600 "$T/empty"
call "$LEASE" --store "etcd://root@127.0.0.1:$cp?password_file=$T/empty" show au/k
expect_error 2 "an empty password file"

section "an auth token that expires under a renewing holder"
# etcd's simple tokens live 2 s after their last use; ttl 9 s: renewals
# about every 3 s for 8 s, each after the token expired.
call "$LEASE" --store "$FILEURL" run au/run --ttl 9s -- sleep 8
expect_rc 0 "run for 8 s, renewing every 3 s, with tokens of 2 s: the lease is kept"
call "$LEASE" --store "$FILEURL" history au/run --json
assert_eq "$(jget "$OUT" '.[0].ended')" "released" "the grant ended released, not lost"

section "a server that repeats the password in its answer"
pf=$T/fake.port
python3 "$HERE/fake_etcd.py" "$pf" script "$T/echo.json" &
bg_register $!
printf '{"/v3/auth/authenticate": {"error": "no user root with password Ech0-Me-99 (Ech0-Me-99)"}}\n' \
    >"$T/echo.json"
wait_for "the fake member listens" test -s "$pf" || die "no fake member"
call "$LEASE" --store "etcd://root:Ech0-Me-99@127.0.0.1:$(cat "$pf")?transport=json" show k
expect_error 6 "the fake refuses"
assert_not_contains "$ERR" "Ech0-Me-99" "the password the server repeated is not shown"
printf 'Ech0-Me-99\n' >"$T/echo.pw"
chmod 600 "$T/echo.pw"
call "$LEASE" --store "etcd://root@127.0.0.1:$(cat "$pf")?password_file=$T/echo.pw&transport=json" show k
expect_error 6 "the fake refuses (password from a file)"
assert_not_contains "$ERR" "Ech0-Me-99" "the file's password the server repeated is not shown"

finish
