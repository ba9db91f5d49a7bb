/*
 * pg_store.c - the PostgreSQL store against a real server, PostgreSQL's own
 * behaviour beyond the conformance suite. The tests live in files by
 * theme, declared in pg_store.h:
 *
 *   pg_store_refsql.c    the reference SQL and lease on the same tables;
 *                        table names from the URL
 *   pg_store_history.c   the grant history table
 *   pg_store_clock.c     clock-floored tokens (?tokens=clock, the default)
 *   pg_store_txn.c       the guarded transaction, resource-side fencing,
 *                        advisory locks
 *   pg_store_wait.c      LISTEN/NOTIFY wake-ups, bounded waits, 32 racing
 *                        connections
 *   pg_store_security.c  no password in any message, hostile keys
 *
 * This file runs them:
 *
 *     pg_store URL [TEST_NAME_PATTERN [URL_PARAMS]]
 *
 * URL is the shared test server's (scripts/test.sh exports it as
 * LEASE_TEST_PG_URL); without one the program fails, it never skips.
 * URL_PARAMS ("a=b&c=d") are added to it: the tests written for the
 * reference SQL's consecutive tokens (schema, history) run with
 * tokens=counter, the token kind they check to the number.
 * The pattern (cmocka's, '*' and '?') picks tests, so that ctest can run
 * the groups as separate tests. Every key lives under "pg/<uuid>/" and
 * every table or schema a test makes has a random name, dropped at the end.
 * Waits are bounded; durations are printed, never asserted.
 */
#include <fnmatch.h>

#include "pg_store.h"

int main(int argc, char **argv)
{
    static const struct CMUnitTest all[] = {
        CONF_TEST(test_advisory_key_is_fnv1a),
        CONF_TEST(test_schema_refsql_table_interop),
        CONF_TEST(test_schema_refsql_sql_on_lease_table),
        CONF_TEST(test_schema_table_names_from_url),
        CONF_TEST(test_history_table_added_to_old_database),
        CONF_TEST(test_history_without_rights),
        CONF_TEST(test_history_refsql_sql_interleaved),
        CONF_TEST(test_history_refsql_sql_interleaved_eager),
        CONF_TEST(test_history_table_name_from_url),
        CONF_TEST(test_history_pruned_in_batches),
        CONF_TEST(test_history_tokens_restarted),
        CONF_TEST(test_history_tokens_restarted_eager),
        CONF_TEST(test_clock_tokens_follow_the_clock),
        CONF_TEST(test_clock_and_counter_handles_mix),
        CONF_TEST(test_clock_refsql_interop),
        CONF_TEST(test_clock_behind_is_reported),
        CONF_TEST(test_clock_history_bound),
        CONF_TEST(test_clock_bad_tokens_param),
        CONF_TEST(test_guarded_txn_locks_and_commits),
        CONF_TEST(test_guarded_txn_elost),
        CONF_TEST(test_guarded_txn_timeouts),
        CONF_TEST(test_fence_resource_side),
        CONF_TEST(test_advisory_txn),
        CONF_TEST(test_wait_notify_wakes_waiter),
        CONF_TEST(test_wait_notify_wakes_waiter_reftable),
        CONF_TEST(test_wait_is_bounded),
        CONF_TEST(test_wait_timeout_stops_listening),
        CONF_TEST(test_wait_notify_only_announced),
        CONF_TEST(test_wait_column_added),
        CONF_TEST(test_trips_renew_is_one),
        CONF_TEST(test_race_32),
        CONF_TEST(test_security_no_password),
        CONF_TEST(test_security_hostile_keys),
    };
    struct CMUnitTest picked[sizeof(all) / sizeof(all[0])];
    size_t i, n = 0;
    int rc;

    if (argc < 2 || argv[1][0] == '\0') {
        fprintf(stderr, "%s: no PostgreSQL URL: give it as the first argument "
                        "(the tests pass $LEASE_TEST_PG_URL, which "
                        "scripts/test.sh sets)\n", argv[0]);
        return 1;
    }
    if (strncmp(argv[1], "postgres://", 11) != 0 &&
        strncmp(argv[1], "postgresql://", 13) != 0) {
        fprintf(stderr, "%s: not a postgres:// URL\n", argv[0]);
        return 1;
    }
    /* A pattern that picks nothing is an error, not a pass. */
    for (i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (argc < 3 || fnmatch(argv[2], all[i].name, 0) == 0)
            picked[n++] = all[i];
    if (n == 0) {
        fprintf(stderr, "%s: no test matches '%s'\n", argv[0], argv[2]);
        return 1;
    }
    if (argc > 3 && argv[3][0] != '\0') {
        char *args[2] = { argv[0], url_with(argv[1], argv[3]) };
        rc = conf_init(2, args, "pg"); /* conf_url: args[1], kept to the end */
    } else {
        rc = conf_init(2, argv, "pg");
    }
    if (rc != 0)
        return 1;
    rc = _cmocka_run_group_tests("postgres store", picked, n, NULL, NULL);
    conf_store_close();
    return rc;
}
