/*
 * lease/types.h - the plain data types shared by the whole API.
 *
 * Grants and infos are plain structs with fixed buffers, so the caller owns
 * them outright (on the stack or anywhere else) and nothing in them needs
 * freeing.
 */
#ifndef LEASE_TYPES_H
#define LEASE_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A key (and a fenced resource name) is 1..255 bytes with no NUL. */
#define LEASE_KEY_MAX 255
/* A holder label is free text for people, at most 255 bytes. */
#define LEASE_LABEL_MAX 255
/* An owner is a UUID in canonical lower-case text: 36 characters. */
#define LEASE_OWNER_LEN 36
#define LEASE_OWNER_BUFSZ (LEASE_OWNER_LEN + 1)
/* Default cap on a ttl: 24 h (raise it with lease_store_set_ttl_max). */
#define LEASE_TTL_MAX_DEFAULT_MS (24ULL * 3600 * 1000)

/* Opaque handle on one connection to one store. See lease/store.h. */
typedef struct lease_store lease_store;

/* A handle that ends a wait early (lease/lease.h: lease_cancel_new). */
typedef struct lease_cancel lease_cancel;

/*
 * What a successful acquisition gives the holder.
 *
 * `deadline_ns` is the holder's *local* deadline on lease_clock_ns(): the
 * time at which the acquire (or the last renew) was sent, plus the granted
 * ttl, minus a safety margin for clock-rate drift. Past it the holder must
 * treat its authority as lost, whatever the store may still say.
 */
typedef struct lease_grant {
    char key[LEASE_KEY_MAX + 1];
    char owner[LEASE_OWNER_BUFSZ];
    char label[LEASE_LABEL_MAX + 1];
    uint64_t token;      /* fencing generation, >= 1 */
    uint64_t ttl_ms;     /* ttl granted by the store (may be rounded up) */
    int64_t deadline_ns; /* local deadline, on lease_clock_ns() */
    int64_t acquired_ns; /* when the acquire was sent, on lease_clock_ns() */
} lease_grant;

/*
 * The state of a key, the same on every store:
 *  FREE     never held, or its last lease was released;
 *  HELD     an unexpired lease exists;
 *  EXPIRED  its last lease ran out (or was lost) and was never released.
 */
typedef enum lease_state {
    LEASE_STATE_FREE = 0,
    LEASE_STATE_HELD = 1,
    LEASE_STATE_EXPIRED = 2
} lease_state;

/* What inspect and list report about one key. */
typedef struct lease_info {
    char key[LEASE_KEY_MAX + 1];
    char owner[LEASE_OWNER_BUFSZ]; /* "" when free */
    char label[LEASE_LABEL_MAX + 1];
    uint64_t token;        /* current (or last) generation; 0 if none yet */
    int held;              /* 1: an unexpired lease exists; 0: free/expired */
    uint64_t remaining_ms; /* time left on the store's clock when held */
    uint64_t ttl_ms;       /* ttl of the current lease when held */
    lease_state state;     /* held == (state == LEASE_STATE_HELD) */
} lease_info;

#ifdef __cplusplus
}
#endif
#endif
