/* timeutil.h - monotonic clock and wall-clock helpers.  Thread-safe. */
#ifndef MS_TIMEUTIL_H
#define MS_TIMEUTIL_H

#include <stddef.h>
#include <time.h>

double ms_now(void);      /* seconds, CLOCK_MONOTONIC */
double ms_wall_now(void); /* seconds since the epoch */
/* The absolute time `seconds` from now on `clock` (CLOCK_REALTIME for
 * pthread_cond_timedwait's default and pthread_timedjoin_np,
 * CLOCK_MONOTONIC for a condition variable set to it).  seconds is taken
 * in [0, 1e9] (NaN: 0): a longer wait is "never" in practice, and the
 * nanoseconds must not overflow. */
struct timespec ms_deadline(clockid_t clock, double seconds);
/* Format a duration like "1h02m", "3m05s", "12.3s" into buf. */
void ms_fmt_duration(char *buf, size_t n, double seconds);

#endif
