/* log.c - rank-aware logging. */
#include "base/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

void ms_log(ms_log_level lvl, const char *fmt, ...) {
    const ms_ctx *c = ms_ctx_get();
    if (lvl < c->log_level) return;
    if (lvl < MS_LOG_WARN && c->rank != 0 && !c->log_all_ranks) return;
    static const char *names[] = {"debug", "info", "warn", "error"};
    char line[4096];
    int n = snprintf(line, sizeof line, "[megascale r%d %s] ", c->rank, names[lvl]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (fprintf(stderr, "%s\n", line) < 0 && errno == EPIPE)
        ms_ctx_mut()->stop = 1; /* nobody reads the log any more: stop, with a final checkpoint */
}
