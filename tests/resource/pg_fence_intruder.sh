#!/usr/bin/env bash
# pg_fence_intruder.sh LEASE_BINARY KIT_DIR PG_SERVER_SCRIPT - the
# PostgreSQL fencing kit (resource/postgres/fence.sql) against roles that
# try to subvert it, on a server of its own (it needs a superuser to make
# the roles; scripts/pg-server.sh, stopped and removed on exit).
#
# The roles: fence_owner owns the schema app and installs the kit;
# fence_writer is the application, which checks its tokens; fence_intruder
# may create objects in app (until that is revoked). The intruder makes a
# lease_fence_mark of its own first, with a trigger that resets the mark: the
# install must refuse it, adopt nothing, and no stale token may pass. Then
# every other table or function the kit did not make (a view, a rule, a
# partitioned or unlogged table, other columns, constraints or indexes, an
# overload of the check ...) and a schema where other roles may create
# objects are refused the same way; functions the intruder left, named like
# built-ins, are never called, whatever the search_path. After a good
# install, each change another role could make (a trigger by a role granted
# TRIGGER, a new owner, a rule, row-level security, CREATE granted on the
# schema) makes lease_fence_check refuse every token (LF003) and leave the
# mark as it was, even a trigger committed after a REPEATABLE READ
# snapshot; lease_fence_problem() and the install report the owner's own
# changes to the table's definition. A table named lease_fence (the lease
# store's, or an older kit's) is the kit's business only when it has an
# older kit's column updated_at: then another role's is refused, never
# taken over; the store's, another role's too, is left alone.
. "$(dirname "$0")/../cli/lib.sh" "$@"

KIT=${2:?usage: $0 LEASE_BINARY KIT_DIR PG_SERVER_SCRIPT}
PG_SERVER=${3:?usage: $0 LEASE_BINARY KIT_DIR PG_SERVER_SCRIPT} # for lib_pg.sh
command -v psql >/dev/null 2>&1 || { echo "FATAL: psql is required" >&2; exit 1; }
. "$(dirname "$0")/../pg/lib_pg.sh"

pg_tmpdir
# Both exit traps: lib.sh's (its temp dir, background processes), then
# lib_pg.sh's (the server), which exits with the status it is given.
on_exit() {
    local rc=$?
    cleanup
    (exit "$rc")
    pg_cleanup
}
trap on_exit EXIT
pg_start db || exit 1
export PGCONNECT_TIMEOUT=10

# as ROLE PSQL_ARGS...: psql as ROLE over the server's Unix socket (trusted
# there), in the database lease.
as() {
    local role=$1
    shift
    "${BOUND[@]}" psql -h "$PG_T/db" -p "$PG_PORT" -U "$role" -d lease \
        -X -q -At -v ON_ERROR_STOP=1 -v VERBOSITY=verbose "$@"
}
# run ROLE PSQL_ARGS...: as, with stdout in $OUT, stderr in $ERR, the exit
# status in $RC.
run() {
    OUT=$(as "$@" 2>"$T/err")
    RC=$? ERR=$(cat "$T/err") LAST_CMD="psql as $1: ${*:2}"
}
# sql ROLE PSQL_ARGS...: must succeed; prints its output.
sql() {
    as "$@" 2>"$T/sql.err" || { fail "psql as $1 failed: $(cat "$T/sql.err")"; return 1; }
}
# install ROLE: fence.sql as ROLE, into the schema app.
install() {
    PGOPTIONS="-c search_path=app" run "$1" -f "$KIT/fence.sql"
    LAST_CMD="fence.sql as $1"
}
# check TOKEN: lease_fence_check of res/a as the writer, in its own
# transaction (the bigint cast picks the kit's function by its signature).
check() {
    run fence_writer -c "SELECT app.lease_fence_check('res/a', $1::bigint)"
    LAST_CMD="lease_fence_check('res/a', $1) as fence_writer"
}
# The mark of res/a.
mark() { sql postgres -c "SELECT mark FROM app.lease_fence_mark WHERE resource = 'res/a'"; }
# The functions in app that fence_owner owns: what an install left.
kit_functions() {
    sql postgres -c "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'app' AND p.proowner = 'fence_owner'::regrole"
}
# What the intruder's code did as another role: its trigger functions log
# the role they ran as into spy.ran_as, which anyone may write.
ran_as() { sql postgres -c "SELECT coalesce(string_agg(who, ','), '') FROM spy.ran_as"; }

# A fresh schema app, owned by fence_owner, in which fence_intruder may
# create objects and fence_writer may not.
reset_schema() {
    sql postgres >/dev/null <<'SQL'
DROP SCHEMA IF EXISTS app CASCADE;
CREATE SCHEMA app AUTHORIZATION fence_owner;
GRANT USAGE, CREATE ON SCHEMA app TO fence_intruder;
GRANT USAGE ON SCHEMA app TO fence_writer;
TRUNCATE spy.ran_as;
SQL
}

section "roles"
sql postgres >/dev/null <<'SQL'
CREATE ROLE fence_owner LOGIN;
CREATE ROLE fence_writer LOGIN;
CREATE ROLE fence_intruder LOGIN;
CREATE SCHEMA spy AUTHORIZATION fence_intruder;
GRANT USAGE ON SCHEMA spy TO PUBLIC;
CREATE SCHEMA wr AUTHORIZATION fence_writer;
SQL
sql fence_intruder >/dev/null <<'SQL'
CREATE TABLE spy.ran_as (who text NOT NULL);
GRANT INSERT ON spy.ran_as TO PUBLIC;
-- The intruder's trigger: whoever writes the mark, it becomes 1.
CREATE FUNCTION spy.reset_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO spy.ran_as VALUES (current_user);
    NEW.mark := 1;
    RETURN NEW;
END
$$;
GRANT EXECUTE ON FUNCTION spy.reset_mark() TO PUBLIC;
SQL
reset_schema && pass

section "the intruder's lease_fence_mark with a trigger that resets the mark: refused, nothing adopted"
sql fence_intruder >/dev/null <<'SQL'
CREATE TABLE app.lease_fence_mark (
    resource   text PRIMARY KEY,
    mark       bigint NOT NULL CHECK (mark > 0),
    updated_at timestamptz
);
CREATE TRIGGER reset_mark BEFORE INSERT OR UPDATE ON app.lease_fence_mark
    FOR EACH ROW EXECUTE FUNCTION spy.reset_mark();
GRANT SELECT, INSERT, UPDATE ON app.lease_fence_mark TO fence_writer;
SQL
install fence_owner
expect_rc 3 "fence.sql refuses the intruder's table"
assert_contains "$ERR" "LF003: fence.sql: refusing to install in schema app" "SQLSTATE LF003 and what it refused"
assert_contains "$ERR" "lease_fence_mark is owned by fence_intruder, not by the schema's owner fence_owner" \
    "the message names the table's owner"
assert_contains "$ERR" "lease_fence_mark has triggers: reset_mark" "the message names the trigger"
assert_eq "$(kit_functions)" 0 "nothing was installed"
check 100; assert_ne "$RC" 0 "no check runs against the intruder's table (token 100)"
check 5;   assert_ne "$RC" 0 "a stale token 5 after 100 is not accepted"
assert_eq "$(sql postgres -c "SELECT count(*) FROM app.lease_fence_mark")" 0 "nothing was written to the intruder's table"
assert_eq "$(ran_as)" "" "the intruder's trigger never ran"

# precreated WHO SQL PHRASE DESCRIPTION: in a fresh schema, WHO makes a
# lease_fence_mark (or a function) the kit did not make; fence.sql run by the
# owner must refuse it with PHRASE, and install nothing.
precreated() {
    reset_schema
    sql "$1" >/dev/null <<<"$2" || return
    install fence_owner
    expect_rc 3 "$4: refused"
    assert_contains "$ERR" "LF003: fence.sql: refusing to install in schema app" "$4: LF003"
    assert_contains "$ERR" "$3" "$4: the message says why"
    assert_eq "$(kit_functions)" 0 "$4: nothing was installed"
}
TABLE="(resource text PRIMARY KEY, mark bigint NOT NULL CHECK (mark > 0), updated_at timestamptz)"

section "other tables the kit did not make: refused"
precreated fence_intruder "CREATE TABLE app.lease_fence_mark $TABLE" \
    "lease_fence_mark is owned by fence_intruder, not by the schema's owner fence_owner" \
    "the kit's definition, made by the intruder"
precreated fence_intruder "CREATE TABLE app.real $TABLE;
    CREATE VIEW app.lease_fence_mark AS SELECT * FROM app.real" \
    "lease_fence_mark is a view, not an ordinary table" "a view"
precreated fence_intruder "CREATE TABLE app.lease_fence_mark $TABLE;
    CREATE RULE keep AS ON UPDATE TO app.lease_fence_mark DO INSTEAD NOTHING" \
    "lease_fence_mark has rules: keep" "a rule"
precreated fence_intruder "CREATE TABLE app.lease_fence_mark $TABLE;
    ALTER TABLE app.lease_fence_mark ENABLE ROW LEVEL SECURITY;
    CREATE POLICY everyone ON app.lease_fence_mark USING (true)" \
    "lease_fence_mark has row-level security" "row-level security"
precreated fence_intruder "CREATE TABLE app.lease_fence_mark $TABLE;
    CREATE POLICY everyone ON app.lease_fence_mark USING (true)" \
    "lease_fence_mark has policies: everyone" "a policy"
precreated fence_intruder "CREATE TABLE app.lease_fence_mark (resource text, mark bigint NOT NULL,
    updated_at timestamptz) PARTITION BY LIST (resource)" \
    "lease_fence_mark is a partitioned table, not an ordinary table" "a partitioned table"
precreated fence_intruder "CREATE FUNCTION app.lease_fence_check(resource text, token integer)
    RETURNS bigint LANGUAGE sql AS 'SELECT token::bigint'" \
    "schema app has functions named like the kit's that are not the kit's: app.lease_fence_check(text,integer) owned by fence_intruder" \
    "an overload of lease_fence_check"
# Made by the owner itself, but not as the kit makes it.
precreated fence_owner "CREATE UNLOGGED TABLE app.lease_fence_mark $TABLE" \
    "lease_fence_mark is unlogged" "an unlogged table (a crash would empty it)"
precreated fence_owner "CREATE TABLE app.lease_fence_mark (resource text PRIMARY KEY,
    mark bigint NOT NULL, updated_at timestamptz)" \
    "lease_fence_mark has constraints (PRIMARY KEY (resource)), not (CHECK ((mark > 0)), PRIMARY KEY (resource))" \
    "no CHECK (mark > 0)"
precreated fence_owner "CREATE TABLE app.lease_fence_mark (resource text PRIMARY KEY,
    mark integer NOT NULL CHECK (mark > 0), updated_at timestamptz)" \
    "lease_fence_mark has columns (resource text NOT NULL, mark integer NOT NULL, updated_at timestamp with time zone)" \
    "mark an integer"
precreated fence_owner "CREATE TABLE app.lease_fence_mark (resource text PRIMARY KEY,
    mark bigint NOT NULL DEFAULT 1 CHECK (mark > 0), updated_at timestamptz, note text)" \
    "lease_fence_mark has columns (resource text NOT NULL, mark bigint NOT NULL DEFAULT 1, updated_at timestamp with time zone, note text)" \
    "a default and another column"
precreated fence_owner "CREATE TABLE app.lease_fence_mark $TABLE;
    CREATE INDEX by_time ON app.lease_fence_mark ((mark + 0))" \
    "lease_fence_mark has indexes the kit does not make: app.by_time" "an expression index"
precreated fence_owner "CREATE TABLE app.parent (x int);
    CREATE TABLE app.lease_fence_mark $TABLE INHERITS (app.parent)" \
    "lease_fence_mark inherits from app.parent" "a parent table"
precreated fence_owner "CREATE TABLE app.lease_fence_mark $TABLE;
    CREATE TABLE app.child () INHERITS (app.lease_fence_mark)" \
    "tables inherit from lease_fence_mark: app.child" "a child table"

section "a lease_fence (the name of the store's table and of older kits'): the kit's only if an older kit's"
# The store's definition, even another role's with a trigger: not the
# kit's table, left alone; the kit installs and its checks never touch it.
reset_schema
sql fence_intruder >/dev/null <<'SQL'
CREATE TABLE app.lease_fence (resource text PRIMARY KEY, mark bigint NOT NULL CHECK (mark >= 0));
CREATE TRIGGER reset_mark BEFORE INSERT OR UPDATE ON app.lease_fence
    FOR EACH ROW EXECUTE FUNCTION spy.reset_mark();
SQL
sql postgres -c "REVOKE CREATE ON SCHEMA app FROM fence_intruder"
install fence_owner; expect_rc 0 "fence.sql beside another role's lease_fence of the store's definition"
sql fence_owner -c "GRANT SELECT, INSERT, UPDATE ON app.lease_fence_mark TO fence_writer"
check 100; expect_rc 0 "token 100"
check 5; expect_rc 1 "token 5 after 100"
assert_contains "$ERR" "LF001: stale fencing token" "refused as stale"
assert_eq "$(ran_as)" "" "the trigger on lease_fence never ran"
# An older kit's definition (the column updated_at), another role's: an
# upgrade would take it over, the intruder's trigger with it. Refused.
reset_schema
sql fence_intruder >/dev/null <<SQL
CREATE TABLE app.lease_fence $TABLE;
CREATE TRIGGER reset_mark BEFORE INSERT OR UPDATE ON app.lease_fence
    FOR EACH ROW EXECUTE FUNCTION spy.reset_mark();
INSERT INTO app.lease_fence VALUES ('res/a', 100, now());
SQL
sql postgres -c "REVOKE CREATE ON SCHEMA app FROM fence_intruder; TRUNCATE spy.ran_as"
install fence_owner
expect_rc 3 "fence.sql refuses another role's lease_fence of an older kit's definition"
assert_contains "$ERR" "LF003: fence.sql: refusing to install in schema app: lease_fence, with the column updated_at of an older kit's table, is not as the older kits made it: lease_fence is owned by fence_intruder, not by the schema's owner fence_owner" \
    "says why"
assert_eq "$(kit_functions)" 0 "nothing was installed"
assert_eq "$(sql postgres -c "SELECT to_regclass('app.lease_fence_mark') IS NULL")" t "nothing was renamed or made"
assert_eq "$(ran_as)" "" "the intruder's trigger never ran"

section "no schema to install in, or a system one: refused"
PGOPTIONS="-c search_path=nosuch" run fence_owner -f "$KIT/fence.sql"
expect_rc 3 "a search_path of no schema"
assert_contains "$ERR" "LF003: fence.sql: no schema of the search_path exists to install in" "says so"
PGOPTIONS="-c search_path=pg_catalog" run fence_owner -f "$KIT/fence.sql"
expect_rc 3 "pg_catalog first"
assert_contains "$ERR" "LF003: fence.sql: refusing to install in schema pg_catalog: a system or temporary schema" \
    "says so"
run fence_owner -c "CREATE TEMP TABLE x (a int)" -c "SET search_path = pg_temp" -f "$KIT/fence.sql"
expect_rc 3 "the session's temporary schema"
assert_match "$ERR" "refusing to install in schema pg_temp_[0-9]+: a system or temporary schema" "says so"

section "the kit run by a role that is not the schema's owner: refused"
reset_schema
install fence_intruder
expect_rc 3 "fence.sql as fence_intruder is refused"
assert_contains "$ERR" "lease_fence_mark is owned by fence_intruder, not by the schema's owner fence_owner" \
    "the table would be the intruder's"
assert_eq "$(sql postgres -c "SELECT count(*) FROM pg_class WHERE relnamespace = 'app'::regnamespace")" 0 \
    "nothing was left behind"

section "a schema where another role may create objects: refused"
reset_schema
# While it may, the intruder leaves functions that a call of a built-in
# would pick: cardinality(text[]) matches a text[] better than the built-in
# cardinality(anyarray), format(text, bigint, bigint) the DETAIL of a stale
# token better than format(text, VARIADIC "any"), and spy's set_config and
# current_schema come first on a search_path that names spy before
# pg_catalog. Each logs who ran it (format with a notice: a refused check
# rolls back what it wrote).
sql fence_intruder >/dev/null <<'SQL'
CREATE FUNCTION app.format(f text, a bigint, b bigint) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'intruder function ran as %', current_user;
    RETURN pg_catalog.format(f, a, b);
END
$$;
CREATE FUNCTION app.cardinality(a text[]) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO spy.ran_as VALUES (current_user);
    RETURN pg_catalog.cardinality(a);
END
$$;
CREATE FUNCTION spy.current_schema() RETURNS name LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO spy.ran_as VALUES (current_user);
    RETURN pg_catalog.current_schema();
END
$$;
CREATE FUNCTION spy.set_config(text, text, boolean) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO spy.ran_as VALUES (current_user);
    RETURN pg_catalog.set_config($1, $2, $3);
END
$$;
SQL
install fence_owner
expect_rc 3 "fence.sql refuses a schema that grants CREATE to fence_intruder"
assert_contains "$ERR" "schema app lets other roles create objects in it: fence_intruder" \
    "the message names the role"
sql postgres -c "REVOKE CREATE ON SCHEMA app FROM fence_intruder; GRANT CREATE ON SCHEMA app TO PUBLIC"
install fence_owner
expect_rc 3 "fence.sql refuses a schema that grants CREATE to PUBLIC"
assert_contains "$ERR" "schema app lets other roles create objects in it: PUBLIC" "the message names PUBLIC"
sql postgres -c "REVOKE CREATE ON SCHEMA app FROM PUBLIC"

section "installed by the schema's owner, three times (the third from lease fence-sql)"
# The first with the intruder's schema before pg_catalog on the search_path.
PGOPTIONS="-c search_path=app,spy,pg_catalog" run fence_owner -f "$KIT/fence.sql"
LAST_CMD="fence.sql as fence_owner, search_path app, spy, pg_catalog"
expect_rc 0 "fence.sql"
install fence_owner; expect_rc 0 "fence.sql again"
"$LEASE" fence-sql postgres >"$T/fence.sql" || fail "lease fence-sql postgres failed"
PGOPTIONS="-c search_path=app" run fence_owner -f "$T/fence.sql"
expect_rc 0 "lease fence-sql postgres | psql"
sql fence_owner -c "GRANT SELECT, INSERT, UPDATE ON app.lease_fence_mark TO fence_writer"
check 100; expect_rc 0 "token 100"
check 5;   expect_rc 1 "token 5 after 100"
assert_contains "$ERR" "LF001: stale fencing token" "refused as stale"
assert_eq "$(mark)" 100 "the mark is 100"
run fence_writer -c "SELECT app.lease_fence_problem()"
expect_rc 0 "lease_fence_problem() as the writer"
assert_eq "$OUT" "" "no problem to report"
PGOPTIONS="-c search_path=spy,app,pg_catalog" check 6
expect_rc 1 "token 6, the writer's search_path naming spy and app"
assert_contains "$ERR" "LF001: stale fencing token" "refused as stale"
assert_not_contains "$ERR" "intruder function ran" "the intruder's format did not make the DETAIL"
PGOPTIONS="-c search_path=spy,app,pg_catalog" check 100
expect_rc 0 "token 100 again, the same search_path"
assert_eq "$(ran_as)" "" "none of the intruder's functions ran, at the install or in a check"

# altered SQL_AS_ROLE ROLE PHRASE DESCRIPTION UNDO_ROLE UNDO_SQL: after ROLE
# runs SQL, the writer's check refuses any token with LF003 and PHRASE, the
# mark stays 100; after the undo the check runs again.
altered() {
    sql "$2" >/dev/null <<<"$1" || return
    local token
    for token in 5 200; do
        check $token
        expect_rc 1 "$4: token $token refused"
        assert_contains "$ERR" "LF003: lease_fence_check: the fencing kit in schema app is not as fence.sql installs it" \
            "$4: token $token: LF003"
        assert_contains "$ERR" "$3" "$4: token $token: the message says why"
    done
    assert_eq "$(mark)" 100 "$4: the mark is still 100"
    assert_eq "$(ran_as)" "" "$4: no trigger of the intruder's ran"
    sql "$5" >/dev/null <<<"$6" || return
    check 5; expect_rc 1 "$4 undone: token 5"
    assert_contains "$ERR" "LF001: stale fencing token" "$4 undone: refused as stale"
}

section "changed after the install: lease_fence_check refuses to run"
# GRANT ALL gives TRIGGER too: the writer can hang a trigger on the marks.
sql fence_owner -c "GRANT ALL ON app.lease_fence_mark TO fence_writer"
altered "CREATE TRIGGER reset_mark BEFORE INSERT OR UPDATE ON app.lease_fence_mark
    FOR EACH ROW EXECUTE FUNCTION spy.reset_mark()" fence_writer \
    "lease_fence_mark has triggers: reset_mark" "a trigger added by a role granted ALL" \
    fence_owner "DROP TRIGGER reset_mark ON app.lease_fence_mark"
sql fence_owner -c "REVOKE ALL ON app.lease_fence_mark FROM fence_writer;
    GRANT SELECT, INSERT, UPDATE ON app.lease_fence_mark TO fence_writer"
altered "ALTER TABLE app.lease_fence_mark OWNER TO fence_intruder" postgres \
    "lease_fence_mark is owned by fence_intruder, not by the schema's owner fence_owner" "a new owner" \
    postgres "ALTER TABLE app.lease_fence_mark OWNER TO fence_owner"
altered "CREATE RULE keep AS ON UPDATE TO app.lease_fence_mark DO INSTEAD NOTHING" fence_owner \
    "lease_fence_mark has rules: keep" "a rule" fence_owner "DROP RULE keep ON app.lease_fence_mark"
altered "ALTER TABLE app.lease_fence_mark ENABLE ROW LEVEL SECURITY" fence_owner \
    "lease_fence_mark has row-level security" "row-level security" \
    fence_owner "ALTER TABLE app.lease_fence_mark DISABLE ROW LEVEL SECURITY"
altered "ALTER TABLE app.lease_fence_mark SET UNLOGGED" fence_owner "lease_fence_mark is unlogged" "unlogged" \
    fence_owner "ALTER TABLE app.lease_fence_mark SET LOGGED"
altered "GRANT CREATE ON SCHEMA app TO fence_intruder" fence_owner \
    "schema app lets other roles create objects in it: fence_intruder" "CREATE granted on the schema" \
    fence_owner "REVOKE CREATE ON SCHEMA app FROM fence_intruder"
altered "ALTER SCHEMA app OWNER TO fence_intruder" postgres \
    "lease_fence_mark is owned by fence_owner, not by the schema's owner fence_intruder" "a new schema owner" \
    postgres "ALTER SCHEMA app OWNER TO fence_owner"

section "the table's definition changed by its owner: the install and lease_fence_problem() say so"
# Only the owner can change these, who could as well replace the function:
# each check does not look at them (it would cost it several times over).
sql fence_owner -c "CREATE INDEX by_time ON app.lease_fence_mark (updated_at)"
install fence_owner
expect_rc 3 "fence.sql refuses the table with another index"
assert_contains "$ERR" "lease_fence_mark has indexes the kit does not make: app.by_time" "the message names it"
run fence_writer -c "SELECT app.lease_fence_problem()"
expect_rc 0 "lease_fence_problem()"
assert_eq "$OUT" "lease_fence_mark has indexes the kit does not make: app.by_time" "says the same"
sql fence_owner -c "DROP INDEX app.by_time"
install fence_owner; expect_rc 0 "fence.sql, the index dropped"

section "a trigger committed after a REPEATABLE READ snapshot, before the check"
# The check reads the catalogs as of the transaction's snapshot: a trigger
# committed after it is not seen there, but the row the INSERT wrote, or
# did not write, shows it. rr_trigger EVENTS PHRASE: the trigger on EVENTS.
sql fence_owner -c "GRANT TRIGGER ON app.lease_fence_mark TO fence_writer"
rr_trigger() {
    run fence_writer <<SQL
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT 1;
\\! psql -h "$PG_T/db" -p "$PG_PORT" -U fence_writer -d lease -X -q -v ON_ERROR_STOP=1 -c "CREATE TRIGGER reset_mark BEFORE $1 ON app.lease_fence_mark FOR EACH ROW EXECUTE FUNCTION spy.reset_mark()"
SELECT app.lease_fence_check('res/a', 150::bigint);
COMMIT;
SQL
    expect_rc 3 "$1: the check in the older snapshot fails"
    assert_contains "$ERR" "LF003: lease_fence_check: the row of res/a holds mark $2" \
        "$1: the changed write is refused"
    assert_eq "$(mark)" 100 "$1: the mark is still 100"
    check 5; expect_rc 1 "$1: the next check"
    assert_contains "$ERR" "lease_fence_mark has triggers: reset_mark" "$1: the next check sees the trigger"
    sql fence_owner -c "DROP TRIGGER reset_mark ON app.lease_fence_mark"
}
rr_trigger "UPDATE" "1 after writing 150"
rr_trigger "INSERT OR UPDATE" "100, yet token 150 was not written"
assert_eq "$(ran_as)" "" "what the triggers wrote was rolled back"
check 5; expect_rc 1 "token 5, the trigger gone"; assert_contains "$ERR" "LF001" "stale"
check 150; expect_rc 0 "token 150, the trigger gone"
assert_eq "$(mark)" 150 "the mark is 150"

section "the public schema: the database's owner installs it"
# Since PostgreSQL 15 public belongs to pg_database_owner, whose one member
# is the database's owner (lease); before, to the bootstrap superuser, with
# CREATE for PUBLIC.
PGOPTIONS="-c search_path=public" run lease -f "$KIT/fence.sql"
if [ "$(sql postgres -c "SHOW server_version_num")" -ge 150000 ]; then
    expect_rc 0 "fence.sql in public, as the database's owner"
    run lease -c "SELECT public.lease_fence_problem()"
    expect_rc 0 "lease_fence_problem() in public"
    assert_eq "$OUT" "" "no problem to report"
else
    expect_rc 3 "fence.sql refuses public, where PUBLIC may create objects"
    assert_contains "$ERR" "schema public lets other roles create objects in it: PUBLIC" "says why"
fi

finish
