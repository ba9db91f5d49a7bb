-- history_exists.sql - is the history table there?
-- $1: the history table's quoted name.
SELECT to_regclass($1) IS NOT NULL
