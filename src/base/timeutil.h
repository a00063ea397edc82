/* timeutil.h - monotonic clock and wall-clock helpers.  Thread-safe. */
#ifndef MS_TIMEUTIL_H
#define MS_TIMEUTIL_H

#include <stddef.h>

double ms_now(void);      /* seconds, CLOCK_MONOTONIC */
double ms_wall_now(void); /* seconds since the epoch */
/* Format a duration like "1h02m", "3m05s", "12.3s" into buf. */
void ms_fmt_duration(char *buf, size_t n, double seconds);

#endif
