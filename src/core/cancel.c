/*
 * cancel.c - handles that end a wait early (lease/lease.h).
 *
 * A flag for the check before each try, and an eventfd that a pause polls,
 * so that a fire wakes a pause at once instead of at its end. Firing is
 * async-signal-safe: an atomic store and a write(2).
 */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "lease_int.h"

struct lease_cancel {
    atomic_int fired;
    int fd; /* eventfd: readable once fired */
};

int lease_cancel_new(lease_cancel **out)
{
    lease_cancel *c;

    if (out == NULL)
        return lease__seterr(LEASE_EINVALID, "out is NULL");
    *out = NULL;
    if ((c = calloc(1, sizeof(*c))) == NULL)
        return lease__seterr(LEASE_ENOMEM, "out of memory");
    if ((c->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        int e = errno;

        free(c);
        return lease__seterr(LEASE_ENOMEM, "cancel handle: eventfd: %s",
                             strerror(e));
    }
    atomic_init(&c->fired, 0);
    *out = c;
    return 0;
}

int lease_cancel_fire(lease_cancel *c)
{
    uint64_t one = 1;
    ssize_t n;

    /* No lease__seterr here: it is not async-signal-safe. */
    if (c == NULL)
        return LEASE_EINVALID;
    if (atomic_exchange(&c->fired, 1))
        return 0;
    /* The counter cannot overflow on one write; EAGAIN would mean it is
     * readable already, which is all a waiter needs. */
    do
        n = write(c->fd, &one, sizeof(one));
    while (n < 0 && errno == EINTR);
    return 0;
}

int lease_cancel_fired(const lease_cancel *c)
{
    return c != NULL && atomic_load(&((lease_cancel *)c)->fired);
}

void lease_cancel_free(lease_cancel *c)
{
    if (c == NULL)
        return;
    close(c->fd);
    free(c);
}

/* Wait up to ms for `c` to be fired: 1 if it was (now or before), else 0.
 * Bounded: each poll waits at most what is left of ms. */
int lease__cancel_wait(const lease_cancel *c, uint64_t ms)
{
    int64_t end = lease_clock_ns() + (int64_t)ms * 1000000;

    for (;;) {
        struct pollfd p = { .fd = c->fd, .events = POLLIN, .revents = 0 };
        int64_t left;

        if (lease_cancel_fired(c))
            return 1;
        left = (end - lease_clock_ns()) / 1000000;
        if (left <= 0)
            return 0;
        if (poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left) < 0 && errno != EINTR)
            lease__sleep_ns(left * 1000000); /* cannot poll: pause as before */
    }
}
