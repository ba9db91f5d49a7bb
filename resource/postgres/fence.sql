-- fence.sql - the fencing check inside a PostgreSQL resource.
--
-- Run it in the database that holds the protected data (any database, the
-- lease store's included), as the owner of the schema it should live in,
-- on PostgreSQL 12 or later:
--
--     psql "$APP_DATABASE_URL" -v ON_ERROR_STOP=1 -f /usr/share/lease/fence.sql
--
-- The objects go into the first schema of the session's search_path
-- (current_schema()): the table lease_fence_mark and the functions
-- lease_fence_check, lease_fence_problem and lease_fence_definition_problems.
-- The PostgreSQL lease store's own marks (`lease fence`) are in another
-- table, lease_fence (src/stores/pg/schema.sql): the kit may share a schema
-- with the store, and neither uses nor looks at the other's table.
-- The install is one transaction, which ends by checking what it leaves
-- (lease_fence_problem(), below) and refuses, with SQLSTATE LF003 and every
-- reason, to install in a schema it cannot trust: a lease_fence_mark that
-- is not the table this file makes, owned by the schema's owner (a table of
-- another role, with a trigger that resets the mark, would otherwise be
-- adopted, and its trigger run by every writer), functions of the kit's
-- names that are not the kit's, or a schema in which another role may
-- create objects (an overload whose signature a call matches better would
-- be called instead of the kit's function). It may be run again: on the
-- table it made it changes nothing, and the functions are replaced.
--
-- Upgrade: kits before this one kept their marks in a table named
-- lease_fence (resource, mark, updated_at), the name of the store's table.
-- Run this file again in their schema: in the same transaction as it
-- replaces the functions, it renames that table lease_fence_mark, marks
-- and grants with it, and leaves in its place a lease_fence of the store's
-- definition holding a copy of the marks with the same grants (a lease
-- store in that schema used the older kit's table as its own: its marks
-- must not go back either; drop the copy if no store uses the schema). It
-- does that only to a lease_fence that is exactly what the older kits made
-- (checked as the kit checks its own table); it refuses (LF003, nothing
-- changed) one that has their column updated_at but differs, or one beside
-- a lease_fence_mark (each may hold marks that must not be lost). A
-- lease_fence without updated_at (the store's) is left as it is.
--
-- Every name the functions use is qualified with their schema or resolved
-- in pg_catalog (their search_path is pg_catalog, pg_temp), so nothing
-- created in any schema, a temporary table named lease_fence_mark
-- included, can stand in for their table or for a built-in. Call the check
-- qualified, SCHEMA.lease_fence_check(...), when other roles may create
-- functions in a schema on your search_path.
--
-- Use: the first statement of the application's own write transaction,
--
--     BEGIN;
--     SELECT lease_fence_check('orders/eu', $token);
--     UPDATE orders SET ... WHERE ...;
--     COMMIT;
--
-- The check locks the resource's mark row until the transaction ends, so
-- the check and the write commit together, a transaction that rolls back
-- leaves the mark where it was, and a holder with an older token waits for
-- the newer one's transaction and is then refused. Under REPEATABLE READ or
-- SERIALIZABLE the waiting transaction is refused with a serialization
-- failure (SQLSTATE 40001) instead of LF001: either way it does not commit.
-- Before it writes, the check locks the table and runs
-- lease_fence_problem(false): once the table has a trigger, a rule,
-- row-level security or a child table, is unlogged, or is not the schema
-- owner's, or the schema grants CREATE to another role, it refuses every
-- token with LF003 until that is undone. SELECT lease_fence_problem() also
-- checks the table's definition, as the install does.
--
-- Errors:
--   LF001  stale fencing token: token < the resource's mark (DETAIL says both)
--   LF002  bad argument: NULL, token <= 0, resource empty or over 1024 bytes
--   LF003  the kit's table or schema is not as this file makes it (the
--          message says what differs); from the install: nothing installed

-- READ COMMITTED: each statement sees what committed before it, so the
-- upgrade's copy of an older kit's marks (below), made once the table is
-- locked, misses none, whatever the session's default isolation.
BEGIN ISOLATION LEVEL READ COMMITTED;

-- The schema to install in, kept for the blocks below (a setting local to
-- this transaction). From here the install's search_path is pg_catalog
-- and pg_temp: names it does not qualify are built-ins. The calls before
-- that are qualified, since the session's search_path may name schemas
-- before pg_catalog.
DO $schema$
DECLARE
    s text := pg_catalog.current_schema();
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'fence.sql: no schema of the search_path exists to install in'
            USING ERRCODE = 'LF003',
                  DETAIL = pg_catalog.format('search_path: %s',
                                             pg_catalog.current_setting('search_path'));
    END IF;
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    -- A temporary schema would take the kit away with the session.
    IF s LIKE 'pg\_%' OR s = 'information_schema' THEN
        RAISE EXCEPTION 'fence.sql: refusing to install in schema %: a system or temporary schema',
                        quote_ident(s)
            USING ERRCODE = 'LF003',
                  HINT = 'name the schema first in search_path (psql: PGOPTIONS="-c search_path=app")';
    END IF;
    PERFORM set_config('lease_fence_kit.schema', s, true);
END
$schema$;

-- The functions, with their schema written into them: @schema@ becomes the
-- schema as an identifier, @schema_name@ its name as a string literal.
-- They come before the table: the upgrade of an older kit's table (below)
-- checks it with lease_fence_definition_problems.
DO $functions$
DECLARE
    s text := current_setting('lease_fence_kit.schema');
    def text;
BEGIN
    FOREACH def IN ARRAY ARRAY[
$def$
-- What differs from fence.sql's kit in the schema nsp, owned by owner, and
-- in its table t (an ordinary table, or NULL) that only the owner can
-- change: the differences found, or an empty array, each naming the table
-- as it is named (lease_fence_mark; lease_fence, an older kit's). Each is
-- a way of running other code on the writers' calls (a function of the
-- kit's name, defaults, constraints, index expressions), or of moving the
-- marks (policies, a parent table). With nsp NULL, the table's alone: the
-- install looks so at an older kit's table before it takes it over.
CREATE OR REPLACE FUNCTION @schema@.lease_fence_definition_problems(nsp oid, owner oid, t oid)
RETURNS text[]
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
-- One plan, kept: the planner would otherwise plan a query on t again on
-- every call (a custom plan looks cheaper on the catalogs' statistics), and
-- planning costs several times what running it does.
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    functions text;
    problems text[];
BEGIN
    -- The kit's own are of its signatures (text 25, bigint 20, boolean 16,
    -- oid 26) and owned by the schema's owner.
    IF nsp IS NOT NULL THEN
        SELECT format('schema %s has functions named like the kit''s that are not the kit''s: ',
                      nsp::regnamespace)
               || string_agg(format('%s owned by %s', p.oid::regprocedure, p.proowner::regrole),
                             ', ' ORDER BY p.oid::regprocedure::text)
          INTO functions
          FROM pg_proc AS p
         WHERE p.pronamespace = nsp
           AND p.proname IN ('lease_fence_check', 'lease_fence_problem', 'lease_fence_definition_problems')
           AND NOT (p.proowner = owner AND CASE p.proname
                    WHEN 'lease_fence_check'
                    THEN p.pronargs = 2 AND p.proargtypes[0] = 25 AND p.proargtypes[1] = 20
                    WHEN 'lease_fence_problem' THEN p.pronargs = 1 AND p.proargtypes[0] = 16
                    ELSE p.pronargs = 3 AND p.proargtypes[0] = 26 AND p.proargtypes[1] = 26
                         AND p.proargtypes[2] = 26 END);
    END IF;
    IF t IS NULL THEN
        RETURN array_remove(ARRAY[functions], NULL);
    END IF;

    -- Each item a cheap test, described (a slower query) only when it fails.
    SELECT array_remove(ARRAY[
        functions,
        CASE WHEN am.amname IS DISTINCT FROM 'heap'
             THEN format('%I uses the access method %s, not heap', c.relname, am.amname) END,
        (SELECT quote_ident(c.relname) || ' has policies: ' || string_agg(quote_ident(p.polname), ', ' ORDER BY p.polname)
           FROM pg_policy AS p WHERE p.polrelid = t),
        (SELECT quote_ident(c.relname) || ' inherits from ' || string_agg(h.inhparent::regclass::text, ', '
                                                           ORDER BY h.inhseqno)
           FROM pg_inherits AS h WHERE h.inhrelid = t),
        -- Types by oid (a type named like a built-in prints as one), the
        -- built-ins' fixed oids: 'text'::regtype would parse the name on
        -- every call. text 25, bigint 20, timestamptz 1184; collation
        -- "default" 100.
        CASE WHEN (SELECT count(*) = 3 AND bool_and(CASE a.attname
                              WHEN 'resource' THEN a.atttypid = 25 AND a.attnotnull AND a.attcollation = 100
                              WHEN 'mark' THEN a.atttypid = 20 AND a.attnotnull
                              WHEN 'updated_at' THEN a.atttypid = 1184 AND NOT a.attnotnull
                              ELSE false END
                          AND a.atttypmod = -1 AND NOT a.atthasdef
                          AND a.attgenerated = '' AND a.attidentity = '')
                     FROM pg_attribute AS a
                    WHERE a.attrelid = t AND a.attnum > 0 AND NOT a.attisdropped)
             THEN NULL
             ELSE (SELECT format('%I has columns (%s), not (resource text NOT NULL, '
                                 'mark bigint NOT NULL, updated_at timestamp with time zone)',
                                 c.relname,
                                 string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod))
                                     || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
                                     || CASE WHEN a.attcollation NOT IN (0, 100)
                                             THEN ' COLLATE ' || (SELECT quote_ident(o.collname)
                                                                  FROM pg_collation AS o
                                                                 WHERE o.oid = a.attcollation)
                                             ELSE '' END
                                     || CASE WHEN a.attgenerated <> ''
                                             THEN ' GENERATED ALWAYS AS (' || pg_get_expr(d.adbin, t) || ')'
                                             WHEN a.atthasdef THEN ' DEFAULT ' || pg_get_expr(d.adbin, t)
                                             ELSE '' END
                                     || CASE WHEN a.attidentity <> '' THEN ' GENERATED AS IDENTITY'
                                             ELSE '' END,
                                     ', ' ORDER BY a.attnum))
                     FROM pg_attribute AS a
                     LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                    WHERE a.attrelid = t AND a.attnum > 0 AND NOT a.attisdropped) END,
        -- The primary key on resource and CHECK (mark > 0), as PostgreSQL
        -- prints them (NOT NULL constraints, 'n', are the columns'); an
        -- operator other than the built-in one would print qualified.
        CASE WHEN (SELECT count(*) = 2 AND bool_and(CASE k.contype
                              WHEN 'p' THEN k.conkey = ARRAY[(SELECT a.attnum FROM pg_attribute AS a
                                                              WHERE a.attrelid = t AND a.attname = 'resource')]
                                            AND NOT k.condeferrable
                              WHEN 'c' THEN pg_get_constraintdef(k.oid) = 'CHECK ((mark > 0))'
                              ELSE false END)
                     FROM pg_constraint AS k WHERE k.conrelid = t AND k.contype <> 'n')
             THEN NULL
             ELSE (SELECT format('%I has constraints (%s), not (CHECK ((mark > 0)), '
                                 'PRIMARY KEY (resource))',
                                 c.relname,
                                 string_agg(pg_get_constraintdef(k.oid), ', '
                                            ORDER BY pg_get_constraintdef(k.oid) COLLATE "C"))
                     FROM pg_constraint AS k WHERE k.conrelid = t AND k.contype <> 'n') END,
        -- The primary key's index alone, on the column, with text's default
        -- operator class (btree text_ops, 3126) and collation.
        (SELECT quote_ident(c.relname) || ' has indexes the kit does not make: '
                || string_agg(i.indexrelid::regclass::text, ', ' ORDER BY i.indexrelid::regclass::text)
           FROM pg_index AS i
          WHERE i.indrelid = t
            AND NOT (i.indisprimary AND i.indnatts = 1 AND i.indexprs IS NULL AND i.indpred IS NULL
                     AND i.indcollation[0] = 100 AND i.indclass[0] = 3126))
    ], NULL)
      INTO problems
      FROM pg_class AS c LEFT JOIN pg_am AS am ON am.oid = c.relam
     WHERE c.oid = t;
    RETURN problems;
END
$fn$
$def$,
$def$
-- NULL when the kit in @schema@ is as fence.sql makes it; otherwise every
-- difference found, joined by '; '. The install runs it, and so does every
-- lease_fence_check, with definition false: what other roles can do, and
-- what would lose the marks, is looked at each time: a trigger (a role
-- granted TRIGGER on the table may add one), a rule, row-level security, a
-- child table, an unlogged table (a crash empties it), a table that is not
-- the schema owner's (the owner of a schema may drop what is in it),
-- CREATE granted on the schema to another role (it could add a function of
-- the kit's name whose signature a call matches better). With definition
-- true, also such functions and the table's definition
-- (lease_fence_definition_problems), which only the schema's owner can
-- change, who could as well replace the functions.
CREATE OR REPLACE FUNCTION @schema@.lease_fence_problem(definition boolean DEFAULT true)
RETURNS text
LANGUAGE plpgsql
-- Volatile: in lease_fence_check, after its lock, the catalogs as they are
-- now (under READ COMMITTED), not as of the calling statement's start.
VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    k record;
    problems text[] := '{}';
BEGIN
    -- What every call looks at, in one query; what it then finds wrong is
    -- described by further queries (a plan of many nodes costs each call
    -- more to start than its lookups take).
    SELECT n.oid AS nsp, n.nspname, w.owner, c.oid AS rel, c.relkind, c.relowner, c.relpersistence,
           c.relrowsecurity OR c.relforcerowsecurity AS rls,
           c.relhastriggers, c.relhasrules, c.relhassubclass,
           (SELECT string_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END,
                              ', ' ORDER BY a.grantee)
              FROM aclexplode(n.nspacl) AS a
             WHERE a.privilege_type = 'CREATE'
               AND a.grantee <> n.nspowner AND a.grantee <> w.owner) AS creators
      INTO k
      FROM pg_namespace AS n
      -- Under pg_database_owner (the public schema since PostgreSQL 15)
      -- the owner is the database's.
      CROSS JOIN LATERAL (SELECT CASE WHEN n.nspowner::regrole::text = 'pg_database_owner'
                                      THEN (SELECT d.datdba FROM pg_database AS d
                                             WHERE d.datname = current_database())
                                      ELSE n.nspowner END AS owner) AS w
      LEFT JOIN pg_class AS c ON c.relnamespace = n.oid AND c.relname = 'lease_fence_mark'
     WHERE n.nspname = @schema_name@;
    IF NOT FOUND THEN
        RETURN format('there is no schema %I (renamed? run fence.sql in it again)', @schema_name@);
    END IF;

    IF k.creators IS NOT NULL THEN
        problems := problems || format('schema %I lets other roles create objects in it: %s',
                                       k.nspname, k.creators);
    END IF;
    -- Without a table, k's fields of it are NULL: none of the tests below
    -- holds.
    IF k.rel IS NULL THEN
        problems := problems || format('there is no table lease_fence_mark in schema %I', k.nspname);
    END IF;
    IF k.relowner <> k.owner THEN
        problems := problems || format('lease_fence_mark is owned by %s, not by the schema''s owner %s',
                                       k.relowner::regrole, k.owner::regrole);
    END IF;
    IF k.relkind <> 'r' THEN
        problems := problems || format('lease_fence_mark is %s, not an ordinary table',
            CASE k.relkind WHEN 'v' THEN 'a view' WHEN 'm' THEN 'a materialized view'
                           WHEN 'p' THEN 'a partitioned table' WHEN 'f' THEN 'a foreign table'
                           WHEN 'S' THEN 'a sequence' ELSE format('of relkind %L', k.relkind) END);
    END IF;
    IF k.relpersistence <> 'p' THEN
        problems := problems || 'lease_fence_mark is unlogged: a crash would empty it'::text;
    END IF;
    IF k.rls THEN
        problems := problems || 'lease_fence_mark has row-level security'::text;
    END IF;
    -- Each flag is true if the table has (or once had) such objects: false
    -- spares the lookup (the plan skips a scan whose flag is false).
    IF k.relhastriggers OR k.relhasrules OR k.relhassubclass THEN
        problems := problems || array_remove(ARRAY[
            (SELECT 'lease_fence_mark has triggers: ' || string_agg(quote_ident(g.tgname), ', ' ORDER BY g.tgname)
               FROM pg_trigger AS g WHERE k.relhastriggers AND g.tgrelid = k.rel),
            (SELECT 'lease_fence_mark has rules: ' || string_agg(quote_ident(r.rulename), ', ' ORDER BY r.rulename)
               FROM pg_rewrite AS r WHERE k.relhasrules AND r.ev_class = k.rel),
            (SELECT 'tables inherit from lease_fence_mark: '
                    || string_agg(h.inhrelid::regclass::text, ', ' ORDER BY h.inhrelid::regclass::text)
               FROM pg_inherits AS h WHERE k.relhassubclass AND h.inhparent = k.rel)
        ], NULL);
    END IF;
    IF definition THEN
        problems := problems || @schema@.lease_fence_definition_problems(
            k.nsp, k.owner, CASE WHEN k.relkind = 'r' THEN k.rel END);
    END IF;

    IF cardinality(problems) = 0 THEN
        RETURN NULL;
    END IF;
    RETURN array_to_string(problems, '; ');
END
$fn$
$def$,
$def$
CREATE OR REPLACE FUNCTION @schema@.lease_fence_check(resource text, token bigint)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
-- Not STRICT: a NULL argument must raise LF002, not return NULL (a caller
-- testing nothing would write unfenced).
CALLED ON NULL INPUT
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    accepted bigint;
    current_mark bigint;
    problem text;
BEGIN
    IF lease_fence_check.resource IS NULL OR lease_fence_check.token IS NULL THEN
        RAISE EXCEPTION 'lease_fence_check: resource and token must not be NULL'
            USING ERRCODE = 'LF002';
    END IF;
    IF lease_fence_check.token <= 0 THEN
        RAISE EXCEPTION 'lease_fence_check: token must be a positive integer'
            USING ERRCODE = 'LF002',
                  DETAIL = format('token %s', lease_fence_check.token);
    END IF;
    IF lease_fence_check.resource = ''
       OR octet_length(lease_fence_check.resource) > 1024 THEN
        RAISE EXCEPTION 'lease_fence_check: resource must be 1 to 1024 bytes long'
            USING ERRCODE = 'LF002',
                  DETAIL = format('%s bytes', octet_length(lease_fence_check.resource));
    END IF;

    -- The lock the INSERT below takes, taken first: a trigger, a rule or a
    -- policy (each needs a lock this one conflicts with) cannot be added
    -- between the look at the catalogs and the write.
    LOCK TABLE @schema@.lease_fence_mark IN ROW EXCLUSIVE MODE;
    problem := @schema@.lease_fence_problem(false);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'lease_fence_check: the fencing kit in schema % is not as fence.sql installs it: %',
                        quote_ident(@schema_name@), problem
            USING ERRCODE = 'LF003',
                  HINT = 'no token is accepted until that is undone; fence.sql, run again '
                         'as the schema''s owner, checks it';
    END IF;

    -- One statement inserts the first mark or raises an older one, and in
    -- either case (even when the WHERE leaves the row as it is) locks the
    -- row until the transaction ends: a concurrent check of the same
    -- resource waits here, then sees what this transaction committed.
    INSERT INTO @schema@.lease_fence_mark AS f (resource, mark, updated_at)
    VALUES (lease_fence_check.resource, lease_fence_check.token, now())
    ON CONFLICT (resource) DO UPDATE
        SET mark = EXCLUDED.mark, updated_at = EXCLUDED.updated_at
        WHERE f.mark <= EXCLUDED.mark
    RETURNING f.mark INTO accepted;
    IF FOUND THEN
        -- The row holds the token unless something changed it on the way
        -- (and a stale token is refused below only when the mark is
        -- greater): under REPEATABLE READ the catalogs read above are the
        -- snapshot's, and a trigger committed after it was not seen there.
        IF accepted IS DISTINCT FROM lease_fence_check.token THEN
            RAISE EXCEPTION 'lease_fence_check: the row of % holds mark % after writing %',
                            lease_fence_check.resource, accepted, lease_fence_check.token
                USING ERRCODE = 'LF003',
                      HINT = 'something on lease_fence_mark changed the write: see lease_fence_problem()';
        END IF;
        RETURN accepted;
    END IF;

    -- The row is locked by the statement above: its mark cannot move now.
    SELECT f.mark INTO current_mark FROM @schema@.lease_fence_mark AS f
        WHERE f.resource = lease_fence_check.resource;
    IF current_mark IS NULL OR current_mark <= lease_fence_check.token THEN
        RAISE EXCEPTION 'lease_fence_check: the row of % holds mark %, yet token % was not written',
                        lease_fence_check.resource, current_mark, lease_fence_check.token
            USING ERRCODE = 'LF003',
                  HINT = 'something on lease_fence_mark changed the write: see lease_fence_problem()';
    END IF;
    RAISE EXCEPTION 'stale fencing token'
        USING ERRCODE = 'LF001',
              DETAIL = format('token %s < mark %s', lease_fence_check.token, current_mark),
              HINT = 'a newer lease holder has written to this resource; roll back';
END
$fn$
$def$]
    LOOP
        EXECUTE replace(replace(def, '@schema_name@', quote_literal(s)), '@schema@', quote_ident(s));
    END LOOP;
END
$functions$;

-- Kits before this one named their table lease_fence. An older kit's
-- table is a lease_fence with their column updated_at, which the lease
-- store's table of that name never has (any other lease_fence is not the
-- kit's business). It is taken over below (lease_fence_kit.older) only
-- when it is exactly what they made, owned by the schema's owner, and no
-- lease_fence_mark is there; otherwise what differs is kept
-- (lease_fence_kit.older_problem) for the last check, which then refuses
-- the install: a new, empty lease_fence_mark beside it would accept the
-- tokens its marks refuse.
DO $older$
DECLARE
    s text := current_setting('lease_fence_kit.schema');
    old record;
    problems text[];
BEGIN
    -- Set here whatever a session may have set before.
    PERFORM set_config('lease_fence_kit.older', 'off', true);
    PERFORM set_config('lease_fence_kit.older_problem', '', true);
    SELECT c.oid, c.relkind, c.relowner, w.owner,
           EXISTS (SELECT FROM pg_class AS m
                    WHERE m.relnamespace = n.oid AND m.relname = 'lease_fence_mark') AS has_mark
      INTO old
      FROM pg_namespace AS n
      -- The owner as lease_fence_problem() takes it (pg_database_owner:
      -- the database's).
      CROSS JOIN LATERAL (SELECT CASE WHEN n.nspowner::regrole::text = 'pg_database_owner'
                                      THEN (SELECT d.datdba FROM pg_database AS d
                                             WHERE d.datname = current_database())
                                      ELSE n.nspowner END AS owner) AS w
      JOIN pg_class AS c ON c.relnamespace = n.oid AND c.relname = 'lease_fence'
     WHERE n.nspname = s
       AND EXISTS (SELECT FROM pg_attribute AS a
                    WHERE a.attrelid = c.oid AND a.attname = 'updated_at' AND NOT a.attisdropped);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF old.has_mark THEN
        PERFORM set_config('lease_fence_kit.older_problem',
                           format('schema %I has both lease_fence, an older kit''s table, and '
                                  'lease_fence_mark, this kit''s: either may hold marks that must '
                                  'not be lost', s), true);
        RETURN;
    END IF;
    problems := array_remove(ARRAY[
        CASE WHEN old.relowner <> old.owner
             THEN format('lease_fence is owned by %s, not by the schema''s owner %s',
                         old.relowner::regrole, old.owner::regrole) END,
        CASE WHEN old.relkind <> 'r' THEN 'lease_fence is not an ordinary table' END], NULL);
    IF cardinality(problems) = 0 THEN
        -- The older kit's writers wait from here until the install ends:
        -- none commits a mark that the copy below would miss.
        EXECUTE format('LOCK TABLE %I.lease_fence IN ACCESS EXCLUSIVE MODE', s);
        -- Typed: the signature the install has just made, an exact match.
        EXECUTE format('SELECT %I.lease_fence_definition_problems(NULL::oid, NULL::oid, $1)', s)
            INTO problems USING old.oid;
    END IF;
    IF cardinality(problems) > 0 THEN
        PERFORM set_config('lease_fence_kit.older_problem',
                           'lease_fence, with the column updated_at of an older kit''s table, is not '
                           'as the older kits made it: ' || array_to_string(problems, '; '), true);
        RETURN;
    END IF;
    PERFORM set_config('lease_fence_kit.older', 'on', true);
END
$older$;

-- The kit's table, one row per protected resource: the greatest token it
-- has accepted (lease_fence_definition_problems() checks this definition:
-- change both). Or an older kit's, renamed, with its marks, its grants
-- and, where they are free, the constraint names a new table would have.
-- In its place, a lease_fence of the lease store's definition
-- (src/stores/pg/schema.sql: keep the two alike) with a copy of the marks
-- and the same grants: a lease store in this schema took the older kit's
-- table as its own (it uses any lease_fence it finds), and its marks must
-- not go back either; its prepared statements find the copy by name.
DO $table$
DECLARE
    s text := current_setting('lease_fence_kit.schema');
    rel oid;
    k record;
    copied bigint;
BEGIN
    IF current_setting('lease_fence_kit.older') <> 'on' THEN
        EXECUTE format($sql$
            CREATE TABLE IF NOT EXISTS %I.lease_fence_mark (
                resource   text PRIMARY KEY,
                mark       bigint NOT NULL CHECK (mark > 0),
                updated_at timestamptz
            ) USING heap $sql$, s);
        RETURN;
    END IF;
    SELECT c.oid INTO STRICT rel
      FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
     WHERE n.nspname = s AND c.relname = 'lease_fence';
    EXECUTE format('ALTER TABLE %I.lease_fence RENAME TO lease_fence_mark', s);
    FOR k IN SELECT o.conname, CASE o.contype WHEN 'p' THEN 'lease_fence_mark_pkey'
                                              ELSE 'lease_fence_mark_mark_check' END AS fresh
               FROM pg_constraint AS o WHERE o.conrelid = rel AND o.contype IN ('p', 'c')
    LOOP
        -- A primary key's name is its index's too, unique in the schema.
        IF NOT EXISTS (SELECT FROM pg_constraint AS o WHERE o.conrelid = rel AND o.conname = k.fresh)
           AND NOT EXISTS (SELECT FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
                            WHERE n.nspname = s AND c.relname = k.fresh) THEN
            EXECUTE format('ALTER TABLE %I.lease_fence_mark RENAME CONSTRAINT %I TO %I',
                           s, k.conname, k.fresh);
        END IF;
    END LOOP;
    EXECUTE format('CREATE TABLE %I.lease_fence (resource text PRIMARY KEY, '
                   'mark bigint NOT NULL CHECK (mark >= 0))', s);
    EXECUTE format('INSERT INTO %1$I.lease_fence (resource, mark) '
                   'SELECT m.resource, m.mark FROM %1$I.lease_fence_mark AS m', s);
    GET DIAGNOSTICS copied = ROW_COUNT;
    -- The privilege names are aclexplode's keywords; a role's name comes
    -- quoted from regrole.
    FOR k IN SELECT a.privilege_type, a.is_grantable,
                    CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee
               FROM pg_class AS c, aclexplode(c.relacl) AS a
              WHERE c.oid = rel AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON TABLE %I.lease_fence TO %s%s', k.privilege_type, s, k.grantee,
                       CASE WHEN k.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    RAISE NOTICE 'fence.sql: renamed %.lease_fence, an older kit''s table, to lease_fence_mark, '
                 'with its marks (% rows)', quote_ident(s), copied
        USING DETAIL = format('%I.lease_fence is now a copy of those marks, of the lease store''s '
                              'definition and with the same grants, for a lease store that kept '
                              'its marks in the older table; drop it if none did', s);
END
$table$;

-- Last, what the install leaves: in a schema it cannot trust, or with a
-- table it did not make, nothing of the above is committed.
DO $check$
DECLARE
    s text := current_setting('lease_fence_kit.schema');
    older text := nullif(current_setting('lease_fence_kit.older_problem'), '');
    problem text;
BEGIN
    EXECUTE format('SELECT %I.lease_fence_problem()', s) INTO problem;
    problem := concat_ws('; ', older, problem);
    IF problem <> '' THEN
        RAISE EXCEPTION 'fence.sql: refusing to install in schema %: %', quote_ident(s), problem
            USING ERRCODE = 'LF003',
                  DETAIL = CASE WHEN current_setting('lease_fence_kit.older') = 'on'
                                THEN 'lease_fence_mark is the older kit''s lease_fence, which '
                                     'this install renamed; rolled back: nothing changed'
                                ELSE 'nothing was installed' END,
                  HINT = 'fence.sql adopts only the lease_fence_mark it makes, owned by the schema''s '
                         'owner, with no triggers, rules, policies, other columns, constraints or '
                         'indexes, in a schema where no other role may create objects; run it as '
                         'the schema''s owner'
                         || CASE WHEN older IS NOT NULL
                                 THEN '. It takes over an older kit''s lease_fence (renamed '
                                      'lease_fence_mark, with its marks) only when it is what the '
                                      'older kits made and no lease_fence_mark is there: undo what '
                                      'differs, or keep the greater mark of each resource in '
                                      'lease_fence_mark and drop lease_fence'
                                 ELSE '' END;
    END IF;
END
$check$;

COMMIT;
