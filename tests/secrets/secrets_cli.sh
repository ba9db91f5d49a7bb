#!/usr/bin/env bash
# secrets_cli.sh - a password in a store URL never reaches stdout or stderr
# (issue 10, items 1 and 2), whatever it holds and wherever it sits: in the
# user info, in ?password= / ?sslpassword= / any *password* parameter,
# percent-encoded, with '?', '/', '@', '#' or '&' inside, in URLs that libpq
# or our own parser cannot read (their messages quote the URL), for every
# scheme, through --store, $LEASE_STORE and --store-file, in text and --json
# output. No server is needed: every host is 127.0.0.1 port 1 (nothing
# listens there) or a URL that is refused before any connection.
#
# The CLI has no log-level option (the library logs warnings and errors to
# stderr by default), so stderr is where a log line would show a password.
#
# usage: secrets_cli.sh PATH_TO_LEASE_BINARY

. "$(dirname "$0")/../cli/lib.sh" "$@"

# The password is HEAD + one awkward byte (or escape) + TAIL. Neither piece
# may appear: a reader that splits the password at the awkward byte would
# print one of them on its own.
HEAD=Hx7qZ
TAIL=Wk3pR
SEPS=("" "?" "/" "@" "#" ":" "+" "%40" "%3F" "%26")

# assert_no_secret DESCRIPTION: neither piece in the last call's output.
assert_no_secret() {
    local what
    for what in "$HEAD" "$TAIL" x7qZ k3pR; do
        assert_not_contains "$OUT$ERR" "$what" "$1: '$what' of the password"
    done
}

# try DESCRIPTION ARGS...: the command fails, says why, shows no password.
try() {
    local d=$1
    shift
    call "$LEASE" --timeout 1s "$@"
    assert_ne "$RC" 0 "$d: refused or unreachable"
    expect_stderr "$d"
    assert_no_secret "$d"
}

# The URLs of the issue, as written there.
section "the URLs of issue 10"
for url in "postgres://u:SECRETpw@[::1]x/db" "postgres://u:SECRETpw@[::1:5432/db" \
    "postgres://u:SEC?RET@h/db" "postgres://u:SEC/RET@h/db"; do
    call "$LEASE" --timeout 1s --store "$url" show k
    expect_rc 2 "$url: a URL that cannot be read is a usage error"
    expect_stderr "$url"
    for what in SECRET SEC RET; do
        assert_not_contains "$OUT$ERR" "$what" "$url: '$what'"
    done
done

# Every scheme, every place, every awkward byte.
urls_for() {
    local scheme=$1 sep pw
    for sep in "${SEPS[@]}"; do
        pw="$HEAD$sep$TAIL"
        printf '%s\n' \
            "$scheme://u:$pw@127.0.0.1:1/db" \
            "$scheme://u@127.0.0.1:1/db?password=$pw" \
            "$scheme://127.0.0.1:1/db?sslmode=disable&sslpassword=$pw"
    done
    pw="$HEAD$TAIL"
    printf '%s\n' \
        "$scheme://:$pw@127.0.0.1:1" \
        "$scheme://127.0.0.1:1/db?PassWord=$pw&x=1" \
        "$scheme://u:%48x7qZ%57k3pR@127.0.0.1:1/db" \
        "$scheme://u@127.0.0.1:1/db?pass%77ord=$pw" \
        "$scheme://u:$pw@[::1]x/db" \
        "$scheme://u:$pw@[::1:5432/db" \
        "$scheme://u:$pw@127.0.0.1:99999/db" \
        "$scheme://u:$pw@127.0.0.1:1/db?no_such_parameter=1" \
        "$scheme://u:$pw@127.0.0.1:1/db?lease_table=bad;name" \
        "$scheme://u:$pw@127.0.0.1:1,127.0.0.1:2/db" \
        "$scheme:u:$pw@127.0.0.1:1" \
        "$scheme://u:$pw@127.0.0.1:1/db?application_name=a@b"
}

for scheme in postgres postgresql redis rediss etcd etcds; do
    section "$scheme://"
    n=0
    while IFS= read -r url; do
        n=$((n + 1))
        if [ $((n % 2)) = 0 ]; then
            try "$scheme URL $n ($url), show" --store "$url" show k
        else
            try "$scheme URL $n ($url), acquire --json" --store "$url" acquire k --json
        fi
    done < <(urls_for "$scheme")
    assert_eq "$n" 42 "$scheme: every URL was tried"
done

section "other ways to give the URL, other commands"
for url in "postgres://u:$HEAD@$TAIL@127.0.0.1:1/db" "redis://u:$HEAD?$TAIL@127.0.0.1:1/0" \
    "postgres://u@127.0.0.1:1/db?sslpassword=$HEAD/$TAIL" "etcd://u:$HEAD#$TAIL@127.0.0.1:1"; do
    call env LEASE_STORE="$url" "$LEASE" --timeout 1s ls
    assert_ne "$RC" 0 "LEASE_STORE=$url"
    assert_no_secret "LEASE_STORE=$url"
    printf '%s\n' "$url" >"$T/store-url"
    chmod 600 "$T/store-url"
    try "--store-file with $url" --store-file "$T/store-url" show k --json
    for args in "ls --json" "history k --json" "fence res 8" "leader k --json" \
        "release k --owner 6f1c8a34-5a2e-4e43-9d3c-2f1f7a9b8c01 --token 1" \
        "run k -- true"; do
        # shellcheck disable=SC2086
        try "$url, $args" --store "$url" $args
    done
done

finish
