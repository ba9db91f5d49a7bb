#!/usr/bin/env bash
# sqlite_recipe.sh LEASE_BINARY EXTENSION FENCING_MD - the sqlite3 shell
# recipes of docs/fencing.md, read from the page at test time (each ```sql
# block right after a "<!-- fencing-sqlite-recipe -->" line) and run by
# sqlite3 as they are shown, with one replacement, the one the page asks
# for: its .load path becomes the one `lease fence-sql sqlite` prints, the
# build's extension. A stale token must leave the database as it was and
# the shell exit non-zero; a fresh one must write.
. "$(dirname "$0")/../cli/lib.sh" "$@"

EXT=${2:?usage: $0 LEASE_BINARY EXTENSION FENCING_MD}
DOC=${3:?usage: $0 LEASE_BINARY EXTENSION FENCING_MD}
[ -f "$EXT" ] || { echo "FATAL: no extension at '$EXT'" >&2; exit 1; }
[ -f "$DOC" ] || { echo "FATAL: no page at '$DOC'" >&2; exit 1; }
# The path the page shows in .load and tells its readers to replace.
DOC_LOAD=/usr/lib/x86_64-linux-gnu/liblease_sqlite_fence
MARKER='<!-- fencing-sqlite-recipe -->'

section "the .load path of lease fence-sql sqlite: the build's extension"
call "$LEASE" fence-sql sqlite
expect_rc 0 "lease fence-sql sqlite"
LOAD=$(printf '%s\n' "$OUT" | sed -n 's/^--     \.load //p')
assert_eq "$LOAD" "$(cd "$(dirname "$EXT")" && pwd -P)/$(basename "$EXT" .so)" \
    "the extension beside the liblease that lease runs with, without .so"
[ -n "$LOAD" ] || die "lease fence-sql sqlite printed no .load line"

section "the recipe blocks of $DOC"
# Each marked block, from the line after its opening fence to its closing
# one, as recipe-1.sql, recipe-2.sql...; a marker not followed by a ```sql
# fence, or a block left open, is an error of the page.
awk -v marker="$MARKER" -v dir="$T" '
    $0 == marker { want = 1; next }
    want { if ($0 != "```sql") { print "marker not followed by ```sql at line " NR; exit 1 }
           want = 0; inside = 1; n++; file = dir "/recipe-" n ".sql"; printf "" > file; next }
    inside && $0 == "```" { inside = 0; close(file); next }
    inside { print > file }
    END { if (want || inside) { print "marked block left open"; exit 1 } }
' "$DOC" >"$T/awk.out" 2>&1 || die "reading the blocks: $(cat "$T/awk.out")"
RECIPES=("$T"/recipe-*.sql)
[ -f "${RECIPES[0]}" ] || RECIPES=()
assert_eq "${#RECIPES[@]}" 2 "the page marks two recipes (the single statement, the transaction)"
for r in ${RECIPES[@]+"${RECIPES[@]}"}; do
    assert_eq "$(grep -c -F -x ".load $DOC_LOAD" "$r")" 1 \
        "$(basename "$r"): one '.load $DOC_LOAD' line, the path the page says to replace"
    text=$(cat "$r")
    # A bash replacement, not sed: the printed path is inserted as it is.
    printf '%s\n' "${text//"$DOC_LOAD"/"$LOAD"}" >"${r%.sql}.run"
done
[ "${#RECIPES[@]}" -gt 0 ] || die "no recipe block on the page"

# The token the recipes write with: the value of their `.parameter set
# :token N` line, the same in both.
TOKEN=$(sed -n 's/^\.parameter set :token \([0-9][0-9]*\)$/\1/p' "${RECIPES[@]}" | sort -u)
[[ "$TOKEN" =~ ^[0-9]+$ ]] && [ "$TOKEN" -gt 1 ] ||
    die "the recipes' token: '.parameter set :token N' gives '$TOKEN'"

# app_db NAME MARK: an application database with the rows the recipes
# write (orders 7 and 8, pending), and, for MARK > 0, the mark of
# orders/eu at MARK, set by the extension itself.
app_db() {
    DB=$T/$1.db
    sqlite3 -bail "$DB" "CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)" \
        "INSERT INTO orders VALUES (7, 'pending'), (8, 'pending')" ||
        die "cannot make $DB"
    if [ "$2" -gt 0 ]; then
        sqlite3 -bail "$DB" ".load ${EXT%.so}" "SELECT lease_fence('orders/eu', $2)" >/dev/null ||
            die "cannot set the mark in $DB"
    fi
}
dump() { sqlite3 -bail "$1" .dump; }
status() { sqlite3 -bail "$1" "SELECT id || ':' || status FROM orders ORDER BY id" | paste -sd ' '; }
mark() { sqlite3 -bail "$1" "SELECT mark FROM lease_fence WHERE resource = 'orders/eu'"; }

# run RECIPE DB: the recipe through the sqlite3 shell, on stdin, as a
# script is run; stdout in $OUT, stderr in $ERR, the status in $RC.
run() {
    "${BOUND[@]}" sqlite3 "$2" <"$1" >"$T/out" 2>"$T/err"
    RC=$? OUT=$(cat "$T/out") ERR=$(cat "$T/err") LAST_CMD="sqlite3 $(basename "$2") < $(basename "$1")"
}

for r in ${RECIPES[@]+"${RECIPES[@]}"}; do
    name=$(basename "$r" .sql)
    section "$name, stale: the mark $((TOKEN + 1)) is newer than the token $TOKEN"
    app_db "$name-stale" $((TOKEN + 1))
    before=$(dump "$DB")
    run "${r%.sql}.run" "$DB"
    assert_ne "$RC" 0 "$name: the shell exits non-zero"
    assert_contains "$ERR" "stale fencing token: token $TOKEN < mark $((TOKEN + 1))" \
        "$name: refused by lease_fence"
    assert_eq "$(status "$DB")" "7:pending 8:pending" "$name: no row written"
    assert_eq "$(dump "$DB")" "$before" "$name: the database is as it was"

    section "$name, fresh: the mark $((TOKEN - 1)), then none yet"
    for m in $((TOKEN - 1)) 0; do
        app_db "$name-fresh-$m" "$m"
        run "${r%.sql}.run" "$DB"
        expect_rc 0 "$name (mark $m): the script succeeds"
        assert_eq "$ERR" "" "$name (mark $m): no error"
        assert_eq "$(status "$DB")" "7:shipped 8:pending" "$name (mark $m): order 7 written"
        assert_eq "$(mark "$DB")" "$TOKEN" "$name (mark $m): the mark is the token"
    done
done

finish
