/* log.h - rank-aware logging to stderr.
 *
 * Lines look like "[megascale r0 info] message"; an offline tool's
 * ("[megascale trace warn] ...") carry its name (ms_ctx.log_tag), not a
 * rank it does not have.  INFO and DEBUG are printed
 * only by rank 0 unless ms_ctx.log_all_ranks is set; WARN and ERROR always.
 * With a log file open (ms_log_open_file: `train --log-file`, or --out-dir's
 * train.log) every printed line is also appended there, after its UTC time,
 * one write(2) per line (O_APPEND: the lines of several ranks sharing the
 * file do not mix).  Thread-safe (one fprintf and one write per line).
 */
#ifndef MS_LOG_H
#define MS_LOG_H

#include "base/ctx.h"
#include "base/status.h"

void ms_log(ms_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A line printed as it is, without the "[megascale rN level]" prefix (a
 * command's final error line, the profile summary), to stderr and the log
 * file.  The text should not end with a newline. */
void ms_log_raw(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Append every line printed from now on to path too (created 0644); one
 * file per process, a second call replaces the first.  MS_ERR_IO naming
 * the file.  ms_log_close_file: stop (at exit, or before the file goes). */
ms_status ms_log_open_file(const char *path);
void ms_log_close_file(void);

#define ms_debug(...) ms_log(MS_LOG_DEBUG, __VA_ARGS__)
#define ms_info(...) ms_log(MS_LOG_INFO, __VA_ARGS__)
#define ms_warn(...) ms_log(MS_LOG_WARN, __VA_ARGS__)
#define ms_errorf(...) ms_log(MS_LOG_ERROR, __VA_ARGS__)

#endif
