# fake_lib.sh - what the tests against fake etcd members share (sourced
# after tests/cli/lib.sh): starting one, the bound on a call's time, and
# the checks of huge and costly answers.

# start_fake_member NAME INTERPRETER SCRIPT MODE [ARG...]: the fake member
# SCRIPT (of this directory) run by INTERPRETER; its port in $FPORT_<NAME>.
start_fake_member() {
    local name=$1 py=$2 script=$3 pf=$T/$1.port
    shift 3
    "$py" "$(dirname "${BASH_SOURCE[0]}")/$script" "$pf" "$@" &
    bg_register $!
    wait_for "the fake member '$name' listens" test -s "$pf" || die "no fake member"
    printf -v "FPORT_$name" '%s' "$(cat "$pf")"
}

# within_bound DESCRIPTION: the last timed call took under 10 s (for a
# --timeout 1s call: a generous bound, no assertion of its precision).
within_bound() {
    if [ "$MS" -lt 10000 ]; then pass; else fail "$1: took $MS ms (bound: 10000)$(_ctx)"; fi
}

# huge_answer_bounded URL SIZE: `lease show` against a member whose answer
# is SIZE (text, e.g. "128 MiB"): exit 6 saying so, with the memory of
# lease bounded at 64 MiB.
huge_answer_bounded() {
    call "${PEAK_RSS[@]}" "$LEASE" --store "$1" --timeout 20s show k
    expect_error 6 "a $2 answer"
    assert_contains "$ERR" "answer too large" "the message says the answer is too large"
    rss_within 65536 "reading a $2 answer"
}

# costly_answer URL WHAT CMD...: `lease --timeout 1s CMD...` against a member
# whose answer costs far more to decode than its size: exit 6 or 7, saying
# it is too costly or was not decoded in time, with lease's peak memory
# under 150 MB and the call back within the timeouts of its two operations
# (the open's and the command's) and 2 s more for a loaded machine.
costly_answer() {
    local url=$1 what=$2
    shift 2
    timed "${PEAK_RSS[@]}" "$LEASE" --store "$url" --timeout 1s "$@"
    expect_rc_in "6 7" "$what: ESTORE or ETIMEOUT"
    assert_match "$ERR" "to hold|timed out" "$what: the message says the answer costs too much or came too late"
    rss_within 153600 "$what"
    if [ "$MS" -lt 4000 ]; then pass; else
        fail "$what: took $MS ms (bound: two timeouts of 1 s, and 2 s)$(_ctx)"
    fi
}
