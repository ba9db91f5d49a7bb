#!/usr/bin/env bash
# cli_secrets: a password in a store URL stays out of `ps` and out of the
# environment of the command that `lease run` / `lease elect` start; the
# URL can come from a 0600 --store-file instead of argv.
#
# Needs LEASE_TEST_PG_URL (a PostgreSQL URL with a password, as
# scripts/test.sh exports it): fails without it, never skips. A fake Redis
# (python3 on 127.0.0.1, accepts and never answers) keeps a `lease` process
# connecting long enough to read its /proc/PID/cmdline.
. "$(dirname "$0")/lib.sh" "$@"
export T

PG=${LEASE_TEST_PG_URL:-}
[ -n "$PG" ] || die "LEASE_TEST_PG_URL is not set: start a server (scripts/test.sh does)"
[[ "$PG" =~ ^postgres(ql)?://[^:/@]+:([^@]+)@ ]] || die "LEASE_TEST_PG_URL has no password: $PG"
PG_PW=${BASH_REMATCH[2]}
# The children below must not see it through the test's own environment.
unset LEASE_TEST_PG_URL LEASE_TEST_REDIS_URL LEASE_TEST_ETCD_URL
command -v python3 >/dev/null || die "python3 is required"
S=sqlite://$T/secrets.db
export LEASE_STORE=$S

# cmdline PID: the process's argv as one line, NULs as spaces.
cmdline() {
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null
}

# A child that writes its environment to $T/NAME.env and waits (bounded)
# for $T/stop, so that its parent's argv can be read meanwhile.
child_script() {
    echo "env > \"\$T/$1.env.tmp\"; mv \"\$T/$1.env.tmp\" \"\$T/$1.env\";" \
        "i=0; while [ \$i -lt 400 ] && [ ! -e \"\$T/stop\" ]; do sleep 0.05; i=\$((i+1)); done"
}

# hold NAME ARG...: start `lease ARG...` in the background (its command is
# child_script NAME), wait until the child wrote its environment, and check
# that /proc/PID/cmdline of `lease` has no password; then let it end.
hold() {
    local name=$1 pid rc cl
    shift
    rm -f "$T/stop" "$T/$name.env"
    "$LEASE" "$@" -- sh -c "$(child_script "$name")" >"$T/$name.out" 2>"$T/$name.err" &
    pid=$!
    bg_register "$pid"
    wait_for "$name: the child started" test -e "$T/$name.env"
    cl=$(cmdline "$pid")
    assert_contains "$cl" " -- sh -c " "$name: /proc/$pid/cmdline was read ($cl)"
    assert_not_contains "$cl" "$PG_PW" "$name: the password in /proc/PID/cmdline"
    touch "$T/stop"
    wait_exit "$pid" rc "$name"
    assert_eq "$rc" 0 "$name: lease exits with its command's status$(printf '\n%s' "$(cat "$T/$name.err")")"
}

section "run: --store URL with a password, hidden from ps"
hold run-store --store "$PG" run secrets-run --ttl 5s
assert_not_contains "$(cat "$T/run-store.env" 2>/dev/null)" "$PG_PW" "run: the password in the child's env"
assert_not_contains "$(cat "$T/run-store.env" 2>/dev/null)" "LEASE_STORE=" "run: no LEASE_STORE in the child's env"
assert_contains "$(cat "$T/run-store.env" 2>/dev/null)" "LEASE_KEY=secrets-run" "run: the child has LEASE_KEY"

section "run/elect: --store=URL form, and the query parameter form of a secret"
hold run-store-eq run secrets-eq --store="$PG" --ttl 5s
hold elect-store elect secrets-elect --store "$PG" --ttl 5s
assert_not_contains "$(cat "$T/elect-store.env" 2>/dev/null)" "$PG_PW" "elect: the password in the child's env"
assert_contains "$(cat "$T/elect-store.env" 2>/dev/null)" "LEASE_EPOCH=" "elect: the child has LEASE_EPOCH"

# The same password as a query parameter, which libpq reads as well.
PG_Q=${PG/:$PG_PW@/@}
case $PG_Q in *\?*) PG_Q="$PG_Q&password=$PG_PW" ;; *) PG_Q="$PG_Q?password=$PG_PW" ;; esac
hold run-store-param run secrets-param --store "$PG_Q" --ttl 5s

section "LEASE_STORE is not given to the child unless --pass-store"
LEASE_STORE=$PG hold env-pg run secrets-env --ttl 5s
assert_not_contains "$(cat "$T/env-pg.env" 2>/dev/null)" "$PG_PW" "LEASE_STORE=PG: the password in the child's env"
assert_not_contains "$(cat "$T/env-pg.env" 2>/dev/null)" "LEASE_STORE=" "LEASE_STORE=PG: dropped from the child's env"
LEASE_STORE=$PG hold env-pg-elect elect secrets-env-elect --ttl 5s
assert_not_contains "$(cat "$T/env-pg-elect.env" 2>/dev/null)" "LEASE_STORE=" "elect: LEASE_STORE dropped"
call "$LEASE" run secrets-sqlite -- sh -c 'env'
expect_rc 0 "run with LEASE_STORE (sqlite)"
assert_not_contains "$OUT" "LEASE_STORE=" "run: LEASE_STORE dropped from the child's env"
call "$LEASE" run secrets-sqlite --pass-store -- sh -c 'env'
expect_rc 0 "run --pass-store"
assert_contains "$OUT" "LEASE_STORE=$S" "run --pass-store: the child gets LEASE_STORE"
call "$LEASE" --store "$S" run secrets-sqlite --pass-store -- sh -c 'printf %s "$LEASE_STORE"'
assert_eq "$OUT" "$S" "run --store URL --pass-store: the child gets the URL in use"
call "$LEASE" elect secrets-sqlite --pass-store -- sh -c 'env'
expect_rc 0 "elect --pass-store"
assert_contains "$OUT" "LEASE_STORE=$S" "elect --pass-store: the child gets LEASE_STORE"
# The user's own LEASE_TOKEN (say, of an outer run) is replaced, not kept.
call env LEASE_TOKEN=999999 LEASE_EPOCH=888888 "$LEASE" run secrets-sqlite -- sh -c 'env'
assert_not_contains "$OUT" "LEASE_TOKEN=999999" "the user's LEASE_TOKEN is replaced"
assert_not_contains "$OUT" "LEASE_EPOCH=" "run: no stale LEASE_EPOCH"
assert_eq "$(printf '%s\n' "$OUT" | grep -c '^LEASE_TOKEN=')" 1 "one LEASE_TOKEN"

section "agent: --store URL with a password, hidden from ps"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$LEASE" agent secrets-agent --listen "127.0.0.1:$PORT" --store "$PG" --json \
    >"$T/agent.out" 2>"$T/agent.err" &
AGENT=$!
bg_register "$AGENT"
wait_for "the agent listens" grep -q listening "$T/agent.out"
assert_not_contains "$(cmdline "$AGENT")" "$PG_PW" "agent: the password in /proc/PID/cmdline"
assert_contains "$(cmdline "$AGENT")" "agent secrets-agent" "agent: its cmdline was read"
kill -TERM "$AGENT"
wait_exit "$AGENT" rc "agent"

section "a process still connecting (fake Redis that never answers)"
start_mute_server
for form in "--store redis://user:hunter2@127.0.0.1:$MPORT/0" \
    "--store=redis://:hunter2@127.0.0.1:$MPORT"; do
    rm -f "$T/mute.accepted"
    # shellcheck disable=SC2086
    "$LEASE" --timeout 20s $form run secrets-mute -- true >"$T/mute.out" 2>"$T/mute.err" &
    pid=$!
    bg_register "$pid"
    wait_for "connected to the fake Redis ($form)" test -e "$T/mute.accepted"
    cl=$(cmdline "$pid")
    assert_contains "$cl" "secrets-mute" "$form: cmdline was read"
    assert_not_contains "$cl" hunter2 "$form: the password in /proc/PID/cmdline"
    assert_contains "$cl" "127.0.0.1:$MPORT" "$form: the rest of the URL is kept"
    kill -TERM "$pid" 2>/dev/null
    wait_exit "$pid" rc "lease connecting to the fake Redis"
    assert_not_contains "$(cat "$T/mute.err")" hunter2 "$form: the password on stderr"
done

section "LEASE_STORE's password is hidden in lease's own environment too"
# The child may read /proc/PPID/environ: lease's environment block itself.
LEASE_STORE=$PG call "$LEASE" run secrets-environ --ttl 5s -- \
    sh -c 'tr "\0" "\n" </proc/$PPID/environ'
expect_rc 0 "run: the child read its parent's environment"
assert_contains "$OUT" "LEASE_STORE=" "run: LEASE_STORE is in the parent's environment"
assert_not_contains "$OUT" "$PG_PW" "run: the password in /proc/PPID/environ"
LEASE_STORE=$PG call "$LEASE" show secrets-environ --json
expect_rc 0 "LEASE_STORE with a password still opens the store"

section "--store-file PATH"
mkfifo "$T/url-fifo"
call "$LEASE" --store-file "$T/url-fifo" show k
expect_error 2 "--store-file of a FIFO is refused, without waiting for a writer"
printf '%s\n' "$PG" >"$T/url-600"
chmod 600 "$T/url-600"
hold store-file --store-file "$T/url-600" run secrets-file --ttl 5s
assert_not_contains "$(cat "$T/store-file.env" 2>/dev/null)" "$PG_PW" "--store-file: the password in the child's env"
call "$LEASE" --store-file "$T/url-600" show secrets-file --json
expect_rc 0 "--store-file 0600: the URL is read"
assert_eq "$(jget "$OUT" .key)" secrets-file "--store-file: the store of the URL in the file"
printf '%s' "$S" >"$T/url-nonl"
chmod 600 "$T/url-nonl"
call "$LEASE" acquire viafile --store-file "$T/url-nonl" --json
expect_rc 0 "--store-file without a trailing newline, after the command"
call "$LEASE" --store "$S" show viafile --json
assert_eq "$(jget "$OUT" .state)" held "--store-file: the same store as --store"
for mode in 644 640 604 620 602 660; do
    cp "$T/url-600" "$T/url-$mode"
    chmod "$mode" "$T/url-$mode"
    call "$LEASE" --store-file "$T/url-$mode" show secrets-file
    expect_error 2 "--store-file with mode $mode is refused"
    assert_contains "$ERR" "chmod 600" "--store-file $mode: says how to fix it"
    assert_not_contains "$ERR" "$PG_PW" "--store-file $mode: the password on stderr"
done
call "$LEASE" run k --store-file "$T/url-644" -- touch "$T/ran-644"
expect_error 2 "run --store-file 0644 is refused"
assert_no_file "$T/ran-644" "run --store-file 0644: the command did not run"
call "$LEASE" --store-file "$T/nonexistent" ls
expect_error 2 "--store-file of a missing file"
: >"$T/url-empty"
chmod 600 "$T/url-empty"
call "$LEASE" --store-file "$T/url-empty" ls
expect_error 2 "--store-file of an empty file"
call "$LEASE" --store-file "$T" ls
expect_error 2 "--store-file of a directory"
call "$LEASE" --store "$S" --store-file "$T/url-600" ls
expect_error 2 "--store and --store-file together"
call "$LEASE" --store-file
expect_error 2 "--store-file without a value"

section "--help says how to keep secrets out of argv"
call "$LEASE" --help
for word in LEASE_STORE --store-file PGPASSFILE password_file; do
    assert_contains "$OUT" "$word" "lease --help mentions $word"
done
call "$LEASE" run --help
assert_contains "$OUT" "--pass-store" "lease run --help mentions --pass-store"

finish
