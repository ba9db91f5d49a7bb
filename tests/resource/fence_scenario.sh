# fence_scenario.sh - the stale holder, played by real processes; shared by
# pg_fence.sh and sqlite_fence.sh. Source it after tests/cli/lib.sh, from
# a script that defines
#
#   init_row NAME                  the data row NAME, with the value "init"
#   read_row NAME                  prints the row's value
#   write_row WHO TOKEN MODE NAME  writes WHO into the row NAME as the lease
#                                  holder of TOKEN: MODE kit runs the fencing
#                                  check and the write in one transaction,
#                                  MODE plain the write alone (the control)
#
# scenario NAME MODE: holder A acquires the lease NAME (ttl 1s) in the store
# $LEASE_STORE and stops (SIGSTOP) right after, before it writes: the pause of
# a garbage collection or a frozen VM, put where it hurts and made certain
# by having A stop itself. Stopped, A cannot renew; holder B acquires NAME
# (`--wait` returns once A's lease is past its ttl), gets a newer token and
# writes. Then A is continued (SIGCONT) and writes with its old token.
# Sets A_TOKEN, B_TOKEN and A_RC (A's exit status); A's stderr is left in
# $T/a-FILE.err, FILE being NAME with each / made a _.

# The process is stopped (state T), or gone.
stopped_or_gone() {
    local st
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    st=${st##*) }
    case $st in T*|t*|Z*|X*) return 0 ;; esac
    return 1
}

scenario() {
    local name=$1 mode=$2 a st f=${1//\//_}
    A_TOKEN='' B_TOKEN='' A_RC=''
    init_row "$name"
    (
        "$LEASE" acquire "$name" --ttl 1s --json >"$T/a-$f.json" || exit 90
        kill -STOP "$BASHPID"
        write_row A "$(jq -r .token "$T/a-$f.json")" "$mode" "$name"
    ) 2>"$T/a-$f.err" &
    a=$!
    bg_register "$a"
    wait_for "holder A acquires $name and stops" stopped_or_gone "$a" || return 1
    st=$(cat "/proc/$a/stat" 2>/dev/null)
    st=${st##*) }
    case $st in
    T*|t*) pass ;;
    *) fail "holder A ended instead of stopping: $(cat "$T/a-$f.err")"; return 1 ;;
    esac
    A_TOKEN=$(jq -r .token "$T/a-$f.json")

    call "$LEASE" acquire "$name" --ttl 60s --wait 30s --json
    expect_rc 0 "holder B acquires $name once A's lease has expired"
    B_TOKEN=$(jget "$OUT" .token)
    assert_gt "$B_TOKEN" "$A_TOKEN" "B's token is newer than A's"
    write_row B "$B_TOKEN" "$mode" "$name" >"$T/b-$f.out" 2>"$T/b-$f.err"
    assert_eq "$?" 0 "B's write ($mode) succeeds: $(cat "$T/b-$f.err")"
    assert_eq "$(read_row "$name")" B "the row holds B's write"

    kill -CONT "$a"
    wait_exit "$a" A_RC "holder A, continued"
}
