/*
 * lease.h - liblease: distributed leases with fencing tokens.
 *
 * Conventions (docs/conventions.md says them at length):
 *  - every public name starts with lease_ / LEASE_;
 *  - functions return 0 or a negative LEASE_E* code; the detailed message
 *    of the last failure is per thread: lease_errmsg();
 *  - out-parameters come first; what comes back through a pointer-to-pointer
 *    belongs to the caller and is freed with the named function;
 *  - a lease_store is one connection: use it from one thread at a time.
 */
#ifndef LEASE_H
#define LEASE_H

#include "lease/version.h"
#include "lease/errors.h"
#include "lease/types.h"
#include "lease/store.h"
#include "lease/lease.h"
#include "lease/fence.h"
#include "lease/keeper.h"
#include "lease/session.h"
#include "lease/election.h"
#include "lease/history.h"
#include "lease/parse.h"
#include "lease/log.h"
#include "lease/metrics.h"

#endif
