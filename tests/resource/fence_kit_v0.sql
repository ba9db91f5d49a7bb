-- fence_kit_v0.sql - a test fixture: resource/postgres/fence.sql as shipped
-- before the kit's table was renamed lease_fence_mark, byte for byte below
-- this header. Its table, lease_fence (resource, mark, updated_at), is the
-- one every earlier kit made; tests/resource/pg_fence_store.sh installs it,
-- sets marks, then runs the current fence.sql over it, which must rename
-- the table and keep every mark. Do not edit: it stands for installations
-- that exist.

-- fence.sql - the fencing check inside a PostgreSQL resource.
--
-- Run it in the database that holds the protected data (any database, not
-- only the lease store's), as the owner of the schema it should live in,
-- on PostgreSQL 12 or later:
--
--     psql "$APP_DATABASE_URL" -v ON_ERROR_STOP=1 -f /usr/share/lease/fence.sql
--
-- The objects go into the first schema of the session's search_path
-- (current_schema()): the table lease_fence and the functions
-- lease_fence_check, lease_fence_problem and lease_fence_definition_problems.
-- The install is one transaction, which ends by checking what it leaves
-- (lease_fence_problem(), below) and refuses, with SQLSTATE LF003 and every
-- reason, to install in a schema it cannot trust: a lease_fence that is
-- not the table this file makes, owned by the schema's owner (a table of
-- another role, with a trigger that resets the mark, would otherwise be
-- adopted, and its trigger run by every writer), functions of the kit's
-- names that are not the kit's, or a schema in which another role may
-- create objects (an overload whose signature a call matches better would
-- be called instead of the kit's function). It may be run again: on the
-- table it made it changes nothing, and the functions are replaced.
--
-- Every name the functions use is qualified with their schema or resolved
-- in pg_catalog (their search_path is pg_catalog, pg_temp), so nothing
-- created in any schema, a temporary table named lease_fence included, can
-- stand in for their table or for a built-in. Call the check qualified,
-- SCHEMA.lease_fence_check(...), when other roles may create functions in
-- a schema on your search_path.
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

BEGIN;

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

-- One row per protected resource: the greatest token it has accepted.
-- lease_fence_definition_problems() checks this definition: change both.
DO $table$
BEGIN
    EXECUTE format($sql$
        CREATE TABLE IF NOT EXISTS %I.lease_fence (
            resource   text PRIMARY KEY,
            mark       bigint NOT NULL CHECK (mark > 0),
            updated_at timestamptz
        ) USING heap $sql$, current_setting('lease_fence_kit.schema'));
END
$table$;

-- The functions, with their schema written into them: @schema@ becomes the
-- schema as an identifier, @schema_name@ its name as a string literal.
DO $functions$
DECLARE
    s text := current_setting('lease_fence_kit.schema');
    def text;
BEGIN
    FOREACH def IN ARRAY ARRAY[
$def$
-- What differs from fence.sql's kit in the schema nsp, owned by owner, and
-- in its table t (an ordinary table, or NULL) that only the owner can
-- change: the differences found, or an empty array. Each is a way of
-- running other code on the writers' calls (a function of the kit's name,
-- defaults, constraints, index expressions), or of moving the marks
-- (policies, a parent table).
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
    IF t IS NULL THEN
        RETURN array_remove(ARRAY[functions], NULL);
    END IF;

    -- Each item a cheap test, described (a slower query) only when it fails.
    SELECT array_remove(ARRAY[
        functions,
        CASE WHEN am.amname IS DISTINCT FROM 'heap'
             THEN format('lease_fence uses the access method %s, not heap', am.amname) END,
        (SELECT 'lease_fence has policies: ' || string_agg(quote_ident(p.polname), ', ' ORDER BY p.polname)
           FROM pg_policy AS p WHERE p.polrelid = t),
        (SELECT 'lease_fence inherits from ' || string_agg(h.inhparent::regclass::text, ', '
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
             ELSE (SELECT format('lease_fence has columns (%s), not (resource text NOT NULL, '
                                 'mark bigint NOT NULL, updated_at timestamp with time zone)',
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
             ELSE (SELECT format('lease_fence has constraints (%s), not (CHECK ((mark > 0)), '
                                 'PRIMARY KEY (resource))',
                                 string_agg(pg_get_constraintdef(k.oid), ', '
                                            ORDER BY pg_get_constraintdef(k.oid) COLLATE "C"))
                     FROM pg_constraint AS k WHERE k.conrelid = t AND k.contype <> 'n') END,
        -- The primary key's index alone, on the column, with text's default
        -- operator class (btree text_ops, 3126) and collation.
        (SELECT 'lease_fence has indexes the kit does not make: '
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
      LEFT JOIN pg_class AS c ON c.relnamespace = n.oid AND c.relname = 'lease_fence'
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
        problems := problems || format('there is no table lease_fence in schema %I', k.nspname);
    END IF;
    IF k.relowner <> k.owner THEN
        problems := problems || format('lease_fence is owned by %s, not by the schema''s owner %s',
                                       k.relowner::regrole, k.owner::regrole);
    END IF;
    IF k.relkind <> 'r' THEN
        problems := problems || format('lease_fence is %s, not an ordinary table',
            CASE k.relkind WHEN 'v' THEN 'a view' WHEN 'm' THEN 'a materialized view'
                           WHEN 'p' THEN 'a partitioned table' WHEN 'f' THEN 'a foreign table'
                           WHEN 'S' THEN 'a sequence' ELSE format('of relkind %L', k.relkind) END);
    END IF;
    IF k.relpersistence <> 'p' THEN
        problems := problems || 'lease_fence is unlogged: a crash would empty it'::text;
    END IF;
    IF k.rls THEN
        problems := problems || 'lease_fence has row-level security'::text;
    END IF;
    -- Each flag is true if the table has (or once had) such objects: false
    -- spares the lookup (the plan skips a scan whose flag is false).
    IF k.relhastriggers OR k.relhasrules OR k.relhassubclass THEN
        problems := problems || array_remove(ARRAY[
            (SELECT 'lease_fence has triggers: ' || string_agg(quote_ident(g.tgname), ', ' ORDER BY g.tgname)
               FROM pg_trigger AS g WHERE k.relhastriggers AND g.tgrelid = k.rel),
            (SELECT 'lease_fence has rules: ' || string_agg(quote_ident(r.rulename), ', ' ORDER BY r.rulename)
               FROM pg_rewrite AS r WHERE k.relhasrules AND r.ev_class = k.rel),
            (SELECT 'tables inherit from lease_fence: '
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
    LOCK TABLE @schema@.lease_fence IN ROW EXCLUSIVE MODE;
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
    INSERT INTO @schema@.lease_fence AS f (resource, mark, updated_at)
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
                      HINT = 'something on lease_fence changed the write: see lease_fence_problem()';
        END IF;
        RETURN accepted;
    END IF;

    -- The row is locked by the statement above: its mark cannot move now.
    SELECT f.mark INTO current_mark FROM @schema@.lease_fence AS f
        WHERE f.resource = lease_fence_check.resource;
    IF current_mark IS NULL OR current_mark <= lease_fence_check.token THEN
        RAISE EXCEPTION 'lease_fence_check: the row of % holds mark %, yet token % was not written',
                        lease_fence_check.resource, current_mark, lease_fence_check.token
            USING ERRCODE = 'LF003',
                  HINT = 'something on lease_fence changed the write: see lease_fence_problem()';
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

-- Last, what the install leaves: in a schema it cannot trust, or with a
-- table it did not make, nothing of the above is committed.
DO $check$
DECLARE
    s text := current_setting('lease_fence_kit.schema');
    problem text;
BEGIN
    EXECUTE format('SELECT %I.lease_fence_problem()', s) INTO problem;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'fence.sql: refusing to install in schema %: %', quote_ident(s), problem
            USING ERRCODE = 'LF003',
                  HINT = 'fence.sql adopts only the lease_fence it makes, owned by the schema''s '
                         'owner, with no triggers, rules, policies, other columns, constraints or '
                         'indexes, in a schema where no other role may create objects; run it as '
                         'the schema''s owner';
    END IF;
END
$check$;

COMMIT;
