/*
 * lease/metrics.h - what the leases are doing, for Prometheus.
 *
 * The library counts, per store scheme, in every process:
 *   lease_acquisitions_total{store,outcome}   outcome: granted, busy, error
 *   lease_acquire_wait_seconds{store}         histogram: time in lease_acquire
 *   lease_renewals_total{store}
 *   lease_renewal_failures_total{store}
 *   lease_losses_total{store,reason}          reason: lost (the store said so),
 *                                             uncertain (renewals failed: the
 *                                             local deadline passed, or a leader
 *                                             stepped down at the first failure)
 *   lease_held_seconds{store}                 histogram: acquire to release/loss
 *   lease_leader_transitions_total{store}     elections won and lost
 *   lease_fence_rejections_total{store}       stale tokens rejected by fencing
 *   lease_clock_behind_total{store}           clock-floored grants that followed the
 *                                             last token: the store clock was behind
 * Counting is lock-free and safe from any thread.
 */
#ifndef LEASE_METRICS_H
#define LEASE_METRICS_H

#ifdef __cplusplus
extern "C" {
#endif

/*
 * All metrics in Prometheus' text exposition format (version 0.0.4), as a
 * new string in *out that the caller frees with free().
 */
int lease_metrics_text(char **out);

/* Set every metric back to zero (for tests and benchmarks). */
void lease_metrics_reset(void);

#ifdef __cplusplus
}
#endif
#endif
