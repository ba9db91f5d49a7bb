#!/usr/bin/env bash
# sqlite_file: the SQLite store opens only its own file (issue 10 item 11).
# A path that is a symlink (to a file, to an empty file, dangling) or whose
# -wal/-shm is one, a file that is not an SQLite database, and anything that
# is not a regular file are refused with exit 6 and left byte for byte as
# they were; nothing is created at a link's target. A new file is made 0600
# (and so are its -wal and -shm); a symlinked *directory* on the way is fine.
. "$(dirname "$0")/../cli/lib.sh" "$@"

D=$T/files
mkdir -p "$D"

# refused NAME DESCRIPTION: acquire, show and ls on sqlite://$D/NAME all
# exit 6 with a message naming the file, and print nothing on stdout.
refused() {
    local name=$1 what=$2 args
    for args in "acquire k" "show k" "ls"; do
        # shellcheck disable=SC2086
        call "$LEASE" --store "sqlite://$D/$name" $args
        expect_error 6 "$what ($args)"
        assert_contains "$ERR" "$D/$name" "$what ($args): the message names the file"
    done
}

# same FILE COPY DESCRIPTION: FILE is byte for byte COPY.
same() {
    if cmp -s "$1" "$2"; then pass; else fail "$3: $1 was changed"; fi
}

section "a symlink to an unrelated file"
printf 'precious data\n' >"$D/victim.txt"
cp "$D/victim.txt" "$T/victim.orig"
ln -s victim.txt "$D/link.db"
refused link.db "symlink to a text file"
assert_contains "$ERR" "symbolic link" "the message says why"
same "$D/victim.txt" "$T/victim.orig" "the link's target"
assert_no_file "$D/victim.txt-wal" "no -wal beside the target"
assert_no_file "$D/link.db-wal" "no -wal beside the link"

section "a symlink to an empty file (SQLite would make it a database)"
: >"$D/empty.log"
ln -s empty.log "$D/link-empty.db"
refused link-empty.db "symlink to an empty file"
assert_eq "$(stat -c %s "$D/empty.log")" 0 "the empty target stays empty"

section "a dangling symlink (SQLite would create its target)"
ln -s new-target.txt "$D/dangling.db"
refused dangling.db "dangling symlink"
assert_no_file "$D/new-target.txt" "the link's target was not created"

section "a symlink to a real lease database"
call "$LEASE" --store "sqlite://$D/real.db" acquire k --json
expect_rc 0 "setup: a real store"
cp "$D/real.db" "$T/real.orig"
ln -s real.db "$D/link-real.db"
refused link-real.db "symlink to a lease database"
same "$D/real.db" "$T/real.orig" "the database behind the link"

section "files that are not SQLite databases"
printf 'precious\n' >"$D/small.txt"
head -c 20000 /dev/urandom >"$D/random.bin"
head -c 5000 /dev/zero >"$D/zeros.bin"
printf 'SQLite format 3' >"$D/short.db"           # 15 bytes: no NUL, too short
printf 'SQLite format 3\nnot really' >"$D/near.db" # the 16th byte is wrong
for f in small.txt random.bin zeros.bin short.db near.db; do
    cp "$D/$f" "$T/$f.orig"
    refused "$f" "foreign file $f"
    assert_contains "$ERR" "not an SQLite database" "$f: the message says why"
    same "$D/$f" "$T/$f.orig" "foreign file $f"
    assert_no_file "$D/$f-wal" "$f: no -wal made"
    assert_no_file "$D/$f-journal" "$f: no -journal made"
done

section "not a regular file"
mkfifo "$D/fifo.db"
refused fifo.db "a FIFO"
mkdir "$D/dir.db"
refused dir.db "a directory"
call "$LEASE" --store "sqlite://$D/" ls
expect_error 2 "a path ending in / names a directory"

section "a symlinked -wal or -shm"
call "$LEASE" --store "sqlite://$D/side.db" acquire k
expect_rc 0 "setup: a real store"
printf 'victim\n' >"$D/victim2.txt"
cp "$D/victim2.txt" "$T/victim2.orig"
for sfx in -wal -shm -journal; do
    ln -s victim2.txt "$D/side.db$sfx"
    refused side.db "$sfx is a symlink"
    assert_contains "$ERR" "side.db$sfx" "the message names the $sfx file"
    same "$D/victim2.txt" "$T/victim2.orig" "target of the $sfx link"
    rm "$D/side.db$sfx"
done
call "$LEASE" --store "sqlite://$D/side.db" show k --json
expect_rc 0 "the store works again once the links are gone"

section "what is accepted"
: >"$D/was-empty.db"
call "$LEASE" --store "sqlite://$D/was-empty.db" acquire k --json
expect_rc 0 "an empty file becomes the store"
assert_eq "$(head -c 15 "$D/was-empty.db")" "SQLite format 3" "it is a database now"
(umask 022 && "$LEASE" --store "sqlite://$D/fresh.db" acquire k >/dev/null 2>&1)
assert_eq "$(stat -c %a "$D/fresh.db")" 600 "a new file is made 0600 whatever the umask"
call "$LEASE" --store "sqlite://$D/fresh.db" run k2 --ttl 10s -- \
    stat -c %a "$D/fresh.db-wal" "$D/fresh.db-shm"
expect_rc 0 "run while the store is open"
assert_eq "$(printf "%s" "$OUT" | tr "\n" " ")" "600 600" "its -wal and -shm are 0600 too"
mkdir "$D/realdir"
ln -s realdir "$D/dirlink"
call "$LEASE" --store "sqlite://$D/dirlink/x.db" acquire k --json
expect_rc 0 "a symlinked directory on the path is fine"
assert_file "$D/realdir/x.db" "the file is made in the real directory"
(cd "$D" && "$LEASE" --store "sqlite:relative.db" acquire k >/dev/null 2>&1)
assert_file "$D/relative.db" "a relative path is relative to the working directory"

finish
