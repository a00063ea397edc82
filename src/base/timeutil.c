/* timeutil.c - clocks and duration formatting. */
#include "base/timeutil.h"

#include <stdio.h>
#include <time.h>

double ms_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double ms_wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ms_fmt_duration(char *buf, size_t n, double s) {
    if (s < 0 || s != s) s = 0;
    if (s < 60)
        snprintf(buf, n, "%.1fs", s);
    else if (s < 3600)
        snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else
        snprintf(buf, n, "%dh%02dm", (int)(s / 3600), ((int)s % 3600) / 60);
}

struct timespec ms_deadline(clockid_t clock, double seconds) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    if (!(seconds > 0)) seconds = 0; /* NaN too */
    if (seconds > 1e9) seconds = 1e9;
    long long ns = ts.tv_nsec + (long long)(seconds * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    return ts;
}
