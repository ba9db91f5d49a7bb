/*
 * lease/election.h - leader election on top of leases.
 *
 * A leader is the holder of the lease "election/NAME". Its epoch is its
 * fencing token: carry it into every write to a downstream system, which
 * rejects smaller epochs (lease_fence_advance), because a deposed leader
 * may still have writes in flight.
 *
 * Step-down policy, which the application cannot forget: as soon as a
 * renewal fails, or the local deadline comes within a quarter of the ttl,
 * the library reports leadership as uncertain (lease_election_is_leader
 * returns 0), stops renewing, and calls on_stepdown once. Ask
 * lease_election_is_leader() before each side effect, never a local
 * boolean.
 *
 * Threading: lease_election_is_leader, _epoch and _deadline_ns may be
 * called from any thread; lease_resign once, not from on_stepdown.
 */
#ifndef LEASE_ELECTION_H
#define LEASE_ELECTION_H

#include "types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lease_election lease_election;

/* Called once, from the renewing thread, when leadership ends without
 * lease_resign(): reason LEASE_ELOST or LEASE_ESTORE (uncertain). */
typedef void (*lease_stepdown_cb)(lease_election *election, int reason,
                                  void *payload);

/* 2 added `cancel`; a version 1 structure (without it) is still taken. */
#define LEASE_CAMPAIGN_OPTS_VERSION 2

typedef struct lease_campaign_opts {
    unsigned int version;          /* LEASE_CAMPAIGN_OPTS_VERSION */
    uint64_t ttl_ms;               /* required */
    const char *label;             /* shown to observers (host:pid, pod) */
    uint64_t wait_ms;              /* 0: try once; else wait at most this */
    lease_stepdown_cb on_stepdown; /* optional */
    void *payload;
    lease_cancel *cancel;          /* optional: ends the wait when fired
                                      (lease/lease.h) */
} lease_campaign_opts;

#define LEASE_CAMPAIGN_OPTS_INIT { LEASE_CAMPAIGN_OPTS_VERSION, 0, NULL, 0, NULL, NULL, NULL }

/* The largest election name: the key is "election/" + name. */
#define LEASE_ELECTION_NAME_MAX (LEASE_KEY_MAX - 9)

/*
 * Campaign for leadership of `name` with a fresh owner identity, waiting at
 * most opts->wait_ms. On success *out leads until lease_resign() or a step
 * down; LEASE_EBUSY / LEASE_ETIMEOUT when another candidate leads.
 */
int lease_campaign(lease_election **out, lease_store *store, const char *name,
                   const lease_campaign_opts *opts);

/* 1 while leading with certainty; 0 once uncertain, lost or resigned. */
int lease_election_is_leader(const lease_election *election);

/* The leader's epoch: its fencing token. */
uint64_t lease_election_epoch(const lease_election *election);

/* The local deadline of leadership, on lease_clock_ns(). */
int64_t lease_election_deadline_ns(const lease_election *election);

/* The grant behind the leadership (key, owner, label, token, ttl). */
const lease_grant *lease_election_grant(const lease_election *election);

/* Stop leading: stop renewing, release, free. NULL is allowed. */
int lease_resign(lease_election *election);

/*
 * Observe: the current leader of `name` (held == 1; label, owner, token =
 * epoch, remaining time) or none (held == 0). LEASE_ENOTFOUND if nobody
 * ever led it.
 */
int lease_leader_get(lease_info *out, lease_store *store, const char *name);

#ifdef __cplusplus
}
#endif
#endif
