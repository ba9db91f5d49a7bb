/*
 * Prints, one per line, "struct field offset size" for every field of the
 * public structures the Python binding mirrors with ctypes, and
 * "struct - 0 sizeof" for each whole struct, as this compiler lays them
 * out; tests/python's test_args.py compares them with python/lease/_capi.py.
 */
#include <stddef.h>
#include <stdio.h>

#include <lease/election.h>
#include <lease/history.h>
#include <lease/keeper.h>
#include <lease/lease.h>
#include <lease/session.h>
#include <lease/types.h>

#define FIELD(s, f) \
    printf("%s %s %zu %zu\n", #s, #f, offsetof(s, f), sizeof(((s *)0)->f))
#define WHOLE(s) printf("%s - 0 %zu\n", #s, sizeof(s))

int main(void)
{
    static const lease_acquire_opts ai = LEASE_ACQUIRE_OPTS_INIT;
    static const lease_keeper_opts ki = LEASE_KEEPER_OPTS_INIT;
    static const lease_campaign_opts ci = LEASE_CAMPAIGN_OPTS_INIT;
    static const lease_session_opts si = LEASE_SESSION_OPTS_INIT;

    WHOLE(lease_grant);
    FIELD(lease_grant, key);
    FIELD(lease_grant, owner);
    FIELD(lease_grant, label);
    FIELD(lease_grant, token);
    FIELD(lease_grant, ttl_ms);
    FIELD(lease_grant, deadline_ns);
    FIELD(lease_grant, acquired_ns);
    WHOLE(lease_info);
    FIELD(lease_info, key);
    FIELD(lease_info, owner);
    FIELD(lease_info, label);
    FIELD(lease_info, token);
    FIELD(lease_info, held);
    FIELD(lease_info, remaining_ms);
    FIELD(lease_info, ttl_ms);
    FIELD(lease_info, state);
    WHOLE(lease_acquire_opts);
    FIELD(lease_acquire_opts, version);
    FIELD(lease_acquire_opts, owner);
    FIELD(lease_acquire_opts, ttl_ms);
    FIELD(lease_acquire_opts, label);
    FIELD(lease_acquire_opts, wait_ms);
    FIELD(lease_acquire_opts, backoff_min_ms);
    FIELD(lease_acquire_opts, backoff_max_ms);
    FIELD(lease_acquire_opts, cancel);
    WHOLE(lease_keeper_opts);
    FIELD(lease_keeper_opts, version);
    FIELD(lease_keeper_opts, renew_every_ms);
    FIELD(lease_keeper_opts, on_lost);
    FIELD(lease_keeper_opts, payload);
    FIELD(lease_keeper_opts, step_down);
    WHOLE(lease_history_entry);
    FIELD(lease_history_entry, token);
    FIELD(lease_history_entry, owner);
    FIELD(lease_history_entry, label);
    FIELD(lease_history_entry, ttl_ms);
    FIELD(lease_history_entry, acquired_ms);
    FIELD(lease_history_entry, ended);
    FIELD(lease_history_entry, ended_ms);
    WHOLE(lease_campaign_opts);
    FIELD(lease_campaign_opts, version);
    FIELD(lease_campaign_opts, ttl_ms);
    FIELD(lease_campaign_opts, label);
    FIELD(lease_campaign_opts, wait_ms);
    FIELD(lease_campaign_opts, on_stepdown);
    FIELD(lease_campaign_opts, payload);
    FIELD(lease_campaign_opts, cancel);
    WHOLE(lease_session_opts);
    FIELD(lease_session_opts, version);
    FIELD(lease_session_opts, owner);
    FIELD(lease_session_opts, ttl_ms);
    FIELD(lease_session_opts, label);
    FIELD(lease_session_opts, renew_every_ms);
    FIELD(lease_session_opts, batch_max);
    FIELD(lease_session_opts, on_lost);
    FIELD(lease_session_opts, payload);
    FIELD(lease_session_opts, step_down);
    /* The *_INIT values: "init struct field value". */
    printf("init lease_acquire_opts version %u\n", ai.version);
    printf("init lease_acquire_opts ttl_ms %llu\n", (unsigned long long)ai.ttl_ms);
    printf("init lease_acquire_opts wait_ms %llu\n", (unsigned long long)ai.wait_ms);
    printf("init lease_acquire_opts backoff_min_ms %llu\n",
           (unsigned long long)ai.backoff_min_ms);
    printf("init lease_acquire_opts backoff_max_ms %llu\n",
           (unsigned long long)ai.backoff_max_ms);
    printf("init lease_keeper_opts version %u\n", ki.version);
    printf("init lease_keeper_opts renew_every_ms %llu\n",
           (unsigned long long)ki.renew_every_ms);
    printf("init lease_keeper_opts step_down %d\n", ki.step_down);
    printf("init lease_campaign_opts version %u\n", ci.version);
    printf("init lease_campaign_opts ttl_ms %llu\n", (unsigned long long)ci.ttl_ms);
    printf("init lease_campaign_opts wait_ms %llu\n", (unsigned long long)ci.wait_ms);
    printf("init lease_session_opts version %u\n", si.version);
    printf("init lease_session_opts ttl_ms %llu\n", (unsigned long long)si.ttl_ms);
    printf("init lease_session_opts renew_every_ms %llu\n",
           (unsigned long long)si.renew_every_ms);
    printf("init lease_session_opts batch_max %zu\n", si.batch_max);
    printf("init lease_session_opts step_down %d\n", si.step_down);
    return 0;
}
