/*
 * conf_assert.h - cmocka assertions that say what the library said: the
 * code returned, its name, and lease_errmsg(). Shared by the conformance
 * programs and the store-specific tests; include it after <cmocka.h>,
 * <inttypes.h> and "lease.h".
 */
#ifndef CONF_ASSERT_H
#define CONF_ASSERT_H

#define CHECK_RC(expected, call)                                              \
    do {                                                                      \
        int rc_ = (call);                                                     \
        int exp_ = (expected);                                                \
        if (rc_ != exp_)                                                      \
            fail_msg("%s returned %s (%d), expected %s (%d); errmsg: %s",     \
                     #call, lease_error_name(rc_), rc_,                       \
                     lease_error_name(exp_), exp_, lease_errmsg());           \
    } while (0)

/* A failure must come with its code and a human message. */
#define CHECK_FAIL(expected, call)                                            \
    do {                                                                      \
        int rc_, exp_ = (expected);                                           \
        lease_error_clear();                                                  \
        rc_ = (call);                                                         \
        if (rc_ != exp_)                                                      \
            fail_msg("%s returned %s (%d), expected %s (%d); errmsg: %s",     \
                     #call, lease_error_name(rc_), rc_,                       \
                     lease_error_name(exp_), exp_, lease_errmsg());           \
        if (lease_errmsg()[0] == '\0')                                        \
            fail_msg("%s failed with %s but lease_errmsg() is empty", #call,  \
                     lease_error_name(rc_));                                  \
        if (lease_errcode() != exp_)                                          \
            fail_msg("%s failed with %s but lease_errcode() is %s", #call,    \
                     lease_error_name(rc_), lease_error_name(lease_errcode())); \
    } while (0)

#define ASSERT_U64_OP(a, op, b)                                               \
    do {                                                                      \
        uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                      \
        if (!(a_ op b_))                                                      \
            fail_msg("expected %s %s %s, but %" PRIu64 " %s %" PRIu64, #a,    \
                     #op, #b, a_, #op, b_);                                   \
    } while (0)

#define ASSERT_I64_OP(a, op, b)                                               \
    do {                                                                      \
        int64_t a_ = (int64_t)(a), b_ = (int64_t)(b);                         \
        if (!(a_ op b_))                                                      \
            fail_msg("expected %s %s %s, but %" PRId64 " %s %" PRId64, #a,    \
                     #op, #b, a_, #op, b_);                                   \
    } while (0)

#endif
