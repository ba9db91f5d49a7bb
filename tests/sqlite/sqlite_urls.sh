#!/usr/bin/env bash
# sqlite_urls: URLs that would make a store that forgets its tokens (an
# in-memory or temporary database) or that SQLite would read as a URI
# filename (whose mode=, nolock=, immutable=, vfs= break guarantees) are
# refused with exit 2 (EINVALID) and a message saying why; nothing is
# created. A plain file is still accepted.
. "$(dirname "$0")/../cli/lib.sh" "$@"

cd "$T" || die "cd $T"

# refused URL WHY DESCRIPTION: exit 2 for acquire and show, WHY in the message.
refused() {
    local url=$1 why=$2 what=$3 args
    for args in "acquire k" "show k"; do
        # shellcheck disable=SC2086
        call "$LEASE" --store "$url" $args
        expect_error 2 "$what: $url ($args)"
        assert_contains "$ERR" "$why" "$what: $url ($args): the message says why"
    done
}

section "in-memory databases"
for url in 'sqlite::memory:' 'sqlite://:memory:' \
    'sqlite:file::memory:' 'sqlite:file::memory:%3Fcache=shared' \
    'sqlite:file:x.db%3Fmode=memory' 'sqlite:x.db?mode=memory' \
    'sqlite:x.db?mode=MEMORY&synchronous=full'; do
    refused "$url" "in-memory" "an in-memory database"
done
# (sqlite:///:memory:, which SQLAlchemy reads as in-memory, is refused too;
# not tried here: were it accepted, it would make the file /:memory:.)

section "no path"
for url in 'sqlite:' 'sqlite://' 'sqlite:?synchronous=full' 'sqlite://?synchronous=full'; do
    refused "$url" "needs the path of a file" "no path"
done

section "SQLite URI filenames"
for url in 'sqlite:file:x.db' 'sqlite:file:x.db%3Fnolock=1' 'sqlite:FILE:x.db%3Fimmutable=1' \
    "sqlite:file://$T/uri.db"; do
    refused "$url" "URI filenames" "a URI filename"
done
for url in 'sqlite:x.db?nolock=1' 'sqlite:x.db?immutable=1' 'sqlite:x.db?vfs=unix-none' \
    'sqlite:x.db?cache=shared'; do
    refused "$url" "unknown sqlite URL parameter" "a SQLite URI parameter"
done

section "tokens= is not for SQLite"
for url in 'sqlite:x.db?tokens=clock' 'sqlite:x.db?tokens=counter'; do
    refused "$url" "tokens= is for the stores whose token counter can be lost" "tokens="
done

section "user info and hosts"
# (Paths inside $T: were they accepted, nothing is made outside it.)
refused "sqlite://user:pw@$T/x.db" "no user or password" "user info"
assert_not_contains "$ERR" "pw@" "the password is not shown"
refused "sqlite://host$T/x.db" "not a host" "a host"

assert_eq "$(find "$T" -mindepth 1 -not -path "$T/home*" -not -name out -not -name err | head -5)" "" \
    "nothing was created by any refused URL"

section "what is accepted"
call "$LEASE" --store 'sqlite:./file:x.db' acquire k --json
expect_rc 0 "./file:x.db is a plain file name"
assert_file "$T/file:x.db" "made in the working directory"
call "$LEASE" --store 'sqlite:x.db?synchronous=normal' acquire k --json
expect_rc 0 "synchronous=normal"
assert_file "$T/x.db" "x.db made"

finish
