/*
 * pg_store.h - what the files of the pg_store program share: the test
 * functions main() runs (pg_store.c), and the reference SQL's acquire and
 * row count (pg_store_refsql.c), which the history tests use too. The
 * reference SQL is the schema and statements in pg_test.h (REFSQL_*),
 * word for word: what an application that never runs lease writes, and
 * what lease's own tables must keep accepting.
 */
#ifndef PG_STORE_H
#define PG_STORE_H

#include "pg_test.h"

/* Acquire with the reference statement: the token, or 0 when busy. */
uint64_t refsql_acquire(PGconn *c, const char *key, const char *owner,
                         const char *interval);
/* The reference renew, release and check: the number of rows. */
int refsql_rows(PGconn *c, const char *sql, int n, const char *key,
                 const char *owner, uint64_t token, const char *interval);

/* pg_store_refsql.c */
void test_schema_refsql_table_interop(void **state);
void test_schema_refsql_sql_on_lease_table(void **state);
void test_schema_table_names_from_url(void **state);

/* pg_store_history.c */
void test_history_table_added_to_old_database(void **state);
void test_history_without_rights(void **state);
void test_history_refsql_sql_interleaved(void **state);
void test_history_refsql_sql_interleaved_eager(void **state);
void test_history_table_name_from_url(void **state);
void test_history_pruned_in_batches(void **state);
void test_history_tokens_restarted(void **state);
void test_history_tokens_restarted_eager(void **state);

/* pg_store_clock.c */
void test_clock_tokens_follow_the_clock(void **state);
void test_clock_and_counter_handles_mix(void **state);
void test_clock_refsql_interop(void **state);
void test_clock_behind_is_reported(void **state);
void test_clock_history_bound(void **state);
void test_clock_bad_tokens_param(void **state);

/* pg_store_txn.c */
void test_advisory_key_is_fnv1a(void **state);
void test_guarded_txn_locks_and_commits(void **state);
void test_guarded_txn_elost(void **state);
void test_guarded_txn_timeouts(void **state);
void test_fence_resource_side(void **state);
void test_advisory_txn(void **state);

/* pg_store_wait.c */
void test_wait_notify_wakes_waiter(void **state);
void test_wait_notify_wakes_waiter_reftable(void **state);
void test_wait_is_bounded(void **state);
void test_wait_timeout_stops_listening(void **state);
void test_wait_notify_only_announced(void **state);
void test_wait_column_added(void **state);
void test_race_32(void **state);

/* pg_store_trips.c */
void test_trips_renew_is_one(void **state);

/* pg_store_security.c */
void test_security_no_password(void **state);
void test_security_hostile_keys(void **state);

#endif
