-- tables_exist.sql - are the lease, fence and data tables all there?
-- (Then the store runs no DDL, so a role without CREATE rights works on a
-- database prepared by someone else.)
-- $1, $2, $3: the lease, fence and data tables' quoted names.
SELECT to_regclass($1) IS NOT NULL
    AND to_regclass($2) IS NOT NULL
    AND to_regclass($3) IS NOT NULL
