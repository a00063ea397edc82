/* log.c - rank-aware logging, to stderr and an optional log file. */
#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The line to the log file, after its UTC time (one write: O_APPEND keeps
 * the lines of several processes whole). */
static void to_file(const char *line) {
    int fd = ms_ctx_get()->log_fd;
    if (fd < 0) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char buf[4200];
    int n = (int)strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    n += snprintf(buf + n, sizeof buf - (size_t)n, ".%03ldZ %s\n", ts.tv_nsec / 1000000, line);
    if (n > (int)sizeof buf - 1) {
        n = (int)sizeof buf - 1;
        buf[n - 1] = '\n';
    }
    ssize_t w = write(fd, buf, (size_t)n);
    (void)w; /* a full disk must not stop the run: the lines still go to stderr */
}

static void emit(const char *line) {
    if (fprintf(stderr, "%s\n", line) < 0 && errno == EPIPE)
        ms_ctx_mut()->stop = ms_ctx_mut()->stop_here = 1; /* nobody reads the log any more:
                                                            stop, with a final checkpoint */
    to_file(line);
}

void ms_log(ms_log_level lvl, const char *fmt, ...) {
    const ms_ctx *c = ms_ctx_get();
    if (lvl < c->log_level) return;
    if (lvl < MS_LOG_WARN && c->rank != 0 && !c->log_all_ranks) return;
    static const char *names[] = {"debug", "info", "warn", "error"};
    char line[4096];
    int n = c->log_tag[0]
                ? snprintf(line, sizeof line, "[megascale %s %s] ", c->log_tag, names[lvl])
                : snprintf(line, sizeof line, "[megascale r%d %s] ", c->rank, names[lvl]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    emit(line);
}

void ms_log_raw(const char *fmt, ...) {
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    emit(line);
}

ms_status ms_log_open_file(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return ms_error(MS_ERR_IO, "%s: cannot open the log file: %s", path, strerror(errno));
    ms_log_close_file();
    ms_ctx_mut()->log_fd = fd;
    return MS_OK;
}

void ms_log_close_file(void) {
    ms_ctx *c = ms_ctx_mut();
    if (c->log_fd >= 0) close(c->log_fd);
    c->log_fd = -1;
}
