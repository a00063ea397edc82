/* strnum.h - how text reads as a number, where two modules must agree: the
 * option parser (src/cli/opts.c: the value of a bare-able flag) and the
 * supervisor (src/supervisor/sup_driver.c: which of a job's arguments an
 * option it rewrites takes up).  Pure functions; thread-safe. */
#ifndef MS_STRNUM_H
#define MS_STRNUM_H

#include <ctype.h>

/* 1 if s is an integer in decimal, "0", "-3", "+1" (no spaces). */
static inline int ms_str_is_integer(const char *s) {
    if (*s == '-' || *s == '+') s++;
    if (!isdigit((unsigned char)*s)) return 0;
    while (isdigit((unsigned char)*s))
        s++;
    return !*s;
}

#endif
