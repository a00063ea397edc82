/* sup_dash_tail.c - a growing file read incrementally: what was appended
 * since the last read, line by line, a cut last line kept until it is
 * complete, and a replaced (another inode) or truncated file read again
 * from its start.  The run's files are only ever appended to, replaced
 * atomically (the metrics file after a restart) or rotated (compute.jsonl
 * renamed compute.jsonl.1: the rest of it is read there first), so this
 * sees every line once per version of the file. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "supervisor/sup_dash_internal.h"

void dash_tail_init(dash_tail *t, const char *path) {
    memset(t, 0, sizeof *t);
    snprintf(t->path, sizeof t->path, "%s", path);
}

void dash_tail_free(dash_tail *t) {
    free(t->partial);
    t->partial = NULL;
    t->plen = t->pcap = 0;
}

static int keep_partial(dash_tail *t, const char *p, size_t n) {
    if (t->skipping) return 0;
    if (t->plen + n > DASH_LINE_MAX) { /* an over-long line: skipped to its newline */
        t->skipping = 1;
        t->plen = 0;
        return 0;
    }
    if (t->plen + n > t->pcap) {
        size_t cap = t->pcap ? t->pcap : 4096;
        while (cap < t->plen + n)
            cap *= 2;
        char *q = realloc(t->partial, cap);
        if (!q) return -1;
        t->partial = q;
        t->pcap = cap;
    }
    memcpy(t->partial + t->plen, p, n);
    t->plen += n;
    return 0;
}

/* Lines of fd from t->off on, at most max_bytes of them; the bytes read,
 * or -1 (out of memory). */
static long read_lines(dash_tail *t, int fd, size_t max_bytes, dash_line_fn line, void *arg) {
    char buf[65536];
    size_t total = 0;
    while (total < max_bytes) {
        size_t want = sizeof buf < max_bytes - total ? sizeof buf : max_bytes - total;
        ssize_t got = pread(fd, buf, want, t->off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        t->off += got;
        total += (size_t)got;
        const char *p = buf, *end = buf + got;
        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            if (!nl) {
                if (keep_partial(t, p, (size_t)(end - p)) != 0) return -1;
                break;
            }
            size_t n = (size_t)(nl - p);
            int stop = 0;
            if (t->skipping) {
                t->skipping = 0;
            } else if (t->plen) {
                if (keep_partial(t, p, n) == 0 && !t->skipping)
                    stop = line(arg, t->partial, t->plen);
                t->plen = 0;
                t->skipping = 0;
            } else if (n <= DASH_LINE_MAX) {
                stop = line(arg, p, n);
            }
            p = nl + 1;
            if (stop) { /* the rest of this read from the next call: back to after this line */
                size_t rest = (size_t)(end - p);
                t->off -= (off_t)rest;
                return (long)(total - rest);
            }
        }
    }
    return (long)total;
}

/* The file read so far renamed PATH.1 (rotated: sup_writer_rotate): the
 * lines appended to it after the last read, before the new file's. */
static void read_rotated(dash_tail *t, size_t max_bytes, dash_line_fn line, void *arg) {
    char old[sizeof t->path + 2];
    snprintf(old, sizeof old, "%s.1", t->path);
    int fd = open(old, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_ino == t->ino && st.st_dev == t->dev &&
        st.st_size >= t->off)
        read_lines(t, fd, max_bytes, line, arg);
    close(fd);
}

int dash_tail_read(dash_tail *t, size_t max_bytes, dash_line_fn line, void *arg,
                   void (*replaced)(void *arg)) {
    /* O_NONBLOCK: a FIFO in a file's place (a run directory or a metrics
     * path named in the events) would block the open, and with it the
     * server's thread and its stop, for ever; it is refused below */
    int fd = open(t->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return errno == ENOENT ? 0 : -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -1;
    }
    int again = 0;
    if (t->ino && (st.st_ino != t->ino || st.st_dev != t->dev || st.st_size < t->off)) {
        if (st.st_ino != t->ino || st.st_dev != t->dev) read_rotated(t, max_bytes, line, arg);
        again = 1; /* another file now, or cut: from its start */
        t->off = 0;
        t->plen = 0;
        t->skipping = 0;
        if (replaced) replaced(arg);
    }
    t->ino = st.st_ino;
    t->dev = st.st_dev;
    t->size = st.st_size;
    long got = read_lines(t, fd, max_bytes, line, arg);
    close(fd);
    return got < 0 ? -1 : again;
}
