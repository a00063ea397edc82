/* status.c - status names, per-thread error messages, panic. */
#include "base/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char ms_msg[2048];
static _Thread_local int ms_reported;

const char *ms_status_name(ms_status s) {
    switch (s) {
    case MS_OK:
        return "ok";
    case MS_ERR_IO:
        return "io";
    case MS_ERR_FORMAT:
        return "format";
    case MS_ERR_ARG:
        return "argument";
    case MS_ERR_NOMEM:
        return "out of memory";
    case MS_ERR_RANGE:
        return "range";
    case MS_ERR_NOTFOUND:
        return "not found";
    case MS_ERR_NONFINITE:
        return "non-finite";
    case MS_ERR_INTERNAL:
        return "internal";
    case MS_ERR_TIMEOUT:
        return "timeout";
    }
    return "unknown";
}

ms_status ms_error(ms_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ms_msg, sizeof ms_msg, fmt, ap);
    va_end(ap);
    ms_reported = 0;
    return code;
}

void ms_error_set_reported(int reported) {
    ms_reported = reported;
}

int ms_error_reported(void) {
    return ms_reported;
}

ms_status ms_error_wrap(ms_status code, const char *fmt, ...) {
    char prefix[1024], old[sizeof ms_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, ms_msg, sizeof old);
    snprintf(ms_msg, sizeof ms_msg, "%s: %s", prefix, old);
    return code;
}

const char *ms_errmsg(void) {
    return ms_msg;
}

void ms_panic(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "megascale: fatal: %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}
