/*
 * election.c - leaders are lease holders with a step-down policy.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease_int.h"

struct lease_election {
    lease_keeper *keeper;
    lease_grant grant;
    const lease_backend *backend;
    lease_stepdown_cb on_stepdown;
    void *payload;
    _Atomic int stepped; /* leadership ended: counted and logged once */
};

static int election_key(char *key, size_t size, const char *name)
{
    int rc;

    if ((rc = lease__check_name("election name", name)) < 0)
        return rc;
    if (strlen(name) > LEASE_ELECTION_NAME_MAX)
        return lease__seterr(LEASE_EINVALID, "election name is longer than %d bytes",
                             LEASE_ELECTION_NAME_MAX);
    snprintf(key, size, "election/%s", name);
    return 0;
}

static void stepped_down(lease_keeper *k, int reason, void *payload)
{
    lease_election *e = payload;

    (void)k;
    atomic_store(&e->stepped, 1);
    lease__metric_leader(e->backend->name);
    lease__log_state(LEASE_LOG_WARN, "stepped_down", e->backend->name, &e->grant,
                     reason == LEASE_ELOST
                         ? "leadership lost: another candidate leads"
                         : "leadership uncertain: a renewal failed or the "
                           "deadline came near");
    if (e->on_stepdown)
        e->on_stepdown(e, reason, e->payload);
}

int lease_campaign(lease_election **out, lease_store *s, const char *name,
                   const lease_campaign_opts *opts)
{
    char key[LEASE_KEY_MAX + 1], owner[LEASE_OWNER_BUFSZ];
    lease_acquire_opts ao = LEASE_ACQUIRE_OPTS_INIT;
    lease_keeper_opts ko = LEASE_KEEPER_OPTS_INIT;
    lease_election *e;
    int rc;

    if (out == NULL)
        return lease__seterr(LEASE_EINVALID, "out is NULL");
    *out = NULL;
    if (s == NULL)
        return lease__seterr(LEASE_EINVALID, "store is NULL");
    /* Version 1 ended before `cancel`: never read it there. */
    if (opts == NULL || opts->version < 1 || opts->version > LEASE_CAMPAIGN_OPTS_VERSION)
        return lease__seterr(LEASE_EINVALID,
                             "options are NULL or not LEASE_CAMPAIGN_OPTS_INIT");
    if ((rc = election_key(key, sizeof(key), name)) < 0)
        return rc;
    if ((e = calloc(1, sizeof(*e))) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    if ((rc = lease_owner_new(owner)) < 0) {
        free(e);
        return rc;
    }
    ao.owner = owner;
    ao.ttl_ms = opts->ttl_ms;
    ao.label = opts->label;
    ao.wait_ms = opts->wait_ms;
    ao.cancel = opts->version >= 2 ? opts->cancel : NULL;
    if ((rc = lease_acquire(&e->grant, NULL, s, key, &ao)) < 0) {
        free(e);
        return rc;
    }
    e->backend = s->backend;
    e->on_stepdown = opts->on_stepdown;
    e->payload = opts->payload;
    ko.on_lost = stepped_down;
    ko.payload = e;
    ko.step_down = 1;
    if ((rc = lease_keeper_start(&e->keeper, s, &e->grant, &ko)) < 0) {
        lease_release(s, &e->grant);
        free(e);
        return rc;
    }
    lease__metric_leader(s->backend->name);
    lease__log_state(LEASE_LOG_INFO, "leader_elected", s->backend->name, &e->grant, NULL);
    *out = e;
    return 0;
}

int lease_election_is_leader(const lease_election *e)
{
    int64_t quarter;

    if (e == NULL || !lease_keeper_valid(e->keeper))
        return 0;
    /* The deadline coming near is uncertainty too. */
    quarter = (int64_t)e->grant.ttl_ms * 1000000 / 4;
    return lease_keeper_deadline_ns(e->keeper) - lease_clock_ns() > quarter;
}

uint64_t lease_election_epoch(const lease_election *e)
{
    return e ? e->grant.token : 0;
}

int64_t lease_election_deadline_ns(const lease_election *e)
{
    return e ? lease_keeper_deadline_ns(e->keeper) : 0;
}

const lease_grant *lease_election_grant(const lease_election *e)
{
    return e ? &e->grant : NULL;
}

int lease_resign(lease_election *e)
{
    int rc;

    if (e == NULL)
        return 0;
    /* After the join: a renewal failing during the resign has stepped
     * down (and counted) already, and must not be counted twice. */
    rc = lease_keeper_stop(NULL, e->keeper, 1);
    if (!atomic_load(&e->stepped)) {
        lease__metric_leader(e->backend->name);
        lease__log_state(LEASE_LOG_INFO, "stepped_down", e->backend->name,
                         &e->grant, "resigned");
    }
    free(e);
    return rc;
}

int lease_leader_get(lease_info *out, lease_store *s, const char *name)
{
    char key[LEASE_KEY_MAX + 1];
    int rc;

    if ((rc = election_key(key, sizeof(key), name)) < 0)
        return rc;
    return lease_inspect(out, s, key);
}
