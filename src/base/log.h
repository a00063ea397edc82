/* log.h - rank-aware logging to stderr.
 *
 * Lines look like "[megascale r0 info] message".  INFO and DEBUG are printed
 * only by rank 0 unless ms_ctx.log_all_ranks is set; WARN and ERROR always.
 * Thread-safe (one fprintf per line).
 */
#ifndef MS_LOG_H
#define MS_LOG_H

#include "base/ctx.h"

void ms_log(ms_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define ms_debug(...) ms_log(MS_LOG_DEBUG, __VA_ARGS__)
#define ms_info(...) ms_log(MS_LOG_INFO, __VA_ARGS__)
#define ms_warn(...) ms_log(MS_LOG_WARN, __VA_ARGS__)
#define ms_errorf(...) ms_log(MS_LOG_ERROR, __VA_ARGS__)

#endif
