/* slowio.c - an LD_PRELOAD shim for the tests: a slow disk under the
 * driver's run directory (a stalled NFS or Lustre mount).  Every write(),
 * fflush() and rename() on a file whose path (/proc/self/fd/N, or the
 * rename's names) contains one of the comma-separated words of
 * MS_SLOWIO_MATCH sleeps MS_SLOWIO_DELAY seconds (default 2) first.
 * MS_SLOWIO_LOG, if set, is a file this appends "PID CALL PATH SECONDS"
 * lines to, one per delayed call (what was slowed, for the test).
 *
 * Only the process it is preloaded into is slowed: it removes itself from
 * LD_PRELOAD at load, so the children (mpirun, the ranks, diag) run at
 * full speed.  Used by tests/supervisor/test_slow_disk.py. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char g_match[1024];
static double g_delay = 2.0;
static char g_log[4096];

__attribute__((constructor)) static void slowio_init(void) {
    const char *m = getenv("MS_SLOWIO_MATCH"), *d = getenv("MS_SLOWIO_DELAY"),
               *l = getenv("MS_SLOWIO_LOG");
    snprintf(g_match, sizeof g_match, "%s", m ? m : "");
    if (d) g_delay = atof(d);
    snprintf(g_log, sizeof g_log, "%s", l ? l : "");
    unsetenv("LD_PRELOAD"); /* not in the children */
}

static int matches(const char *path) {
    char words[sizeof g_match];
    snprintf(words, sizeof words, "%s", g_match);
    for (char *save = NULL, *w = strtok_r(words, ",", &save); w; w = strtok_r(NULL, ",", &save))
        if (*w && strstr(path, w)) return 1;
    return 0;
}

static void stall(const char *call, const char *path) {
    int saved = errno;
    struct timespec ts = {(time_t)g_delay, (long)((g_delay - (double)(time_t)g_delay) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    if (g_log[0]) {
        static ssize_t (*real_write)(int, const void *, size_t);
        if (!real_write)
            real_write = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
        int fd = open(g_log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            char line[4400];
            int n =
                snprintf(line, sizeof line, "%d %s %s %.2f\n", (int)getpid(), call, path, g_delay);
            if (n > 0 && real_write) real_write(fd, line, (size_t)n < sizeof line ? (size_t)n : 0);
            close(fd);
        }
    }
    errno = saved;
}

static void slow_fd(const char *call, int fd) {
    if (!g_match[0] || fd < 0) return;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = 0;
    if (matches(path)) stall(call, path);
}

ssize_t write(int fd, const void *buf, size_t n) {
    static ssize_t (*real)(int, const void *, size_t);
    if (!real) real = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    slow_fd("write", fd);
    return real(fd, buf, n);
}

int fflush(FILE *f) {
    static int (*real)(FILE *);
    if (!real) real = (int (*)(FILE *))dlsym(RTLD_NEXT, "fflush");
    if (f) slow_fd("fflush", fileno(f));
    return real(f);
}

int rename(const char *from, const char *to) {
    static int (*real)(const char *, const char *);
    if (!real) real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
    if (g_match[0] && (matches(from) || matches(to))) stall("rename", to);
    return real(from, to);
}
