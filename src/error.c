/*
 * error.c - the error table and the per-thread message of the last error.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "lease_int.h"

static _Thread_local char errmsg[LEASE__ERRMSG_SIZE];
static _Thread_local int errcode;

const char *lease_error_name(int code)
{
    switch (code) {
    case 0:
        return "OK";
#define NAME_(name, value, msg) \
    case value:                 \
        return #name;
        LEASE_ERROR_MAP(NAME_)
#undef NAME_
    default:
        return "EUNKNOWN";
    }
}

const char *lease_strerror(int code)
{
    switch (code) {
    case 0:
        return "success";
#define MSG_(name, value, msg) \
    case value:                \
        return msg;
        LEASE_ERROR_MAP(MSG_)
#undef MSG_
    default:
        return "unknown error";
    }
}

const char *lease_errmsg(void)
{
    return errmsg;
}

int lease_errcode(void)
{
    return errcode;
}

void lease_error_clear(void)
{
    errmsg[0] = '\0';
    errcode = 0;
}

int lease_store_seterr(int code, const char *fmt, ...)
{
    char buf[LEASE__ERRMSG_SIZE];
    va_list ap;

    /* fmt may use the old message (e.g. to add context), so format aside. */
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    memcpy(errmsg, buf, sizeof(errmsg));
    errcode = code;
    return code;
}

int lease__not_holder(const char *what, const char *key, uint64_t token,
                      const char *tail)
{
    return lease_store_seterr(LEASE_ELOST,
                              "%s%s'%s': token %llu of this owner is no longer "
                              "the unexpired lease%s",
                              what ? what : "", what ? " " : "", key,
                              (unsigned long long)token, tail ? tail : "");
}
