/* sup_writer.c - the driver's file writes off its loop: one thread that
 * appends the lines of events.jsonl and compute.jsonl and replaces
 * driver.json, so that a slow or stalled disk under the run directory (an
 * NFS or Lustre mount that stalls writes for seconds) does not stop the
 * loop reading beats and answering the control socket (docs/operations.md,
 * "a slow disk").
 *
 * The loop hands over finished text only (the JSON is built there); the
 * writer takes everything queued at once and writes each file's lines in
 * one write() (in order; a stall is paid once per batch, not per line).
 * Lines of a file opened with a bound are dropped, and counted, once that
 * many bytes wait; the other files' lines are never dropped.  A replaced
 * file keeps only its newest text (temp file + rename, as before).
 *
 * Thread-safety: every function here is called from the driver's thread;
 * the writer thread touches only what mu guards, and the files. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "supervisor/sup_internal.h"

#define MAX_FILES 4

typedef struct {
    int fd;
    char path[4096];
    size_t bound; /* 0: none; else bytes waiting past which lines are dropped */
    char *buf;    /* queued text */
    size_t len, cap;
    long dropped; /* lines dropped over the bound, in all */
    uint64_t rotate; /* 0: none; else past this size the file becomes PATH.1, a new one starts */
    /* the writer thread's own (after the open): */
    uint64_t size;  /* the file's size as written (from its open) */
    int rot_failed; /* a rotation failed: the file goes on growing */
    int warned;   /* a failed write was said */
} wfile;

struct sup_writer {
    pthread_mutex_t mu;
    pthread_cond_t work, done; /* work: something queued or stop; done: a batch written */
    pthread_t th;
    int stop, exited;
    wfile f[MAX_FILES];
    int n;
    /* the replaced file (driver.json): its newest text, not yet taken */
    char *state, state_path[4200];
    unsigned long state_gen, state_done; /* saves queued; the newest one written (or failed) */
    int state_warned;
};

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static struct timespec mono_deadline(double s) {
    double t = mono_now() + (s > 0 ? s : 0);
    struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
    return ts;
}

/* All of text to fd (a short write continues); 0, or -1 with errno. */
static int write_all(int fd, const char *text, size_t len) {
    while (len) {
        ssize_t k = write(fd, text, len);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        text += k;
        len -= (size_t)k;
    }
    return 0;
}

/* f past its rotation size: renamed PATH.1 (replacing the older one), a
 * new PATH started; on failure the file goes on growing (said once).  On
 * the writer thread: f->fd, f->size and f->rot_failed are its own. */
static void rotate_file(wfile *f) {
    char old[4200];
    snprintf(old, sizeof old, "%s.1", f->path);
    int fd = -1;
    if (rename(f->path, old) == 0)
        fd = open(f->path, O_WRONLY | O_APPEND | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr,
                "megascale launch: warning: %s: cannot rename it %s and start it again (%s); "
                "it goes on growing\n",
                f->path, old, strerror(errno));
        f->rot_failed = 1;
        return;
    }
    close(f->fd);
    f->fd = fd;
    f->size = 0;
}

/* path replaced by text: a temp file renamed over it (a reader never sees
 * half of it).  Not fsynced: it is rewritten every second. */
static int replace_file(const char *path, const char *text) {
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int ok = fd >= 0 && write_all(fd, text, strlen(text)) == 0;
    int e = errno;
    if (fd >= 0 && close(fd) != 0 && ok) ok = 0, e = errno;
    if (ok && rename(tmp, path) != 0) ok = 0, e = errno;
    if (!ok) unlink(tmp);
    errno = e;
    return ok ? 0 : -1;
}

static void *writer_main(void *arg) {
    sup_writer *w = arg;
    char *batch[MAX_FILES] = {0};
    size_t blen[MAX_FILES] = {0};
    pthread_mutex_lock(&w->mu);
    for (;;) {
        int any = w->state != NULL;
        for (int i = 0; i < w->n; i++)
            any |= w->f[i].len > 0;
        if (!any) {
            if (w->stop) {
                for (int i = 0; i < w->n; i++) /* a close may block on such a disk too */
                    close(w->f[i].fd), w->f[i].fd = -1;
                break;
            }
            pthread_cond_wait(&w->work, &w->mu);
            continue;
        }
        /* take everything queued: the loop queues on meanwhile */
        int n = w->n;
        uint64_t rot[MAX_FILES];
        for (int i = 0; i < n; i++) {
            rot[i] = w->f[i].rotate;
            batch[i] = w->f[i].buf, blen[i] = w->f[i].len;
            w->f[i].buf = NULL, w->f[i].len = w->f[i].cap = 0;
        }
        char *state = w->state, path[sizeof w->state_path];
        unsigned long gen = w->state_gen;
        snprintf(path, sizeof path, "%s", w->state_path);
        w->state = NULL;
        pthread_mutex_unlock(&w->mu);
        int failed[MAX_FILES] = {0}, errs[MAX_FILES] = {0}, state_err = 0;
        for (int i = 0; i < n; i++) {
            if (blen[i] && write_all(w->f[i].fd, batch[i], blen[i]) != 0)
                failed[i] = 1, errs[i] = errno;
            else if (blen[i] && (w->f[i].size += blen[i]) >= rot[i] && rot[i] &&
                     !w->f[i].rot_failed)
                rotate_file(&w->f[i]); /* whole lines written: it ends at one */
            free(batch[i]);
            batch[i] = NULL;
        }
        int state_failed = state && replace_file(path, state) != 0;
        if (state_failed) state_err = errno;
        free(state);
        pthread_mutex_lock(&w->mu);
        for (int i = 0; i < n; i++)
            if (failed[i] && !w->f[i].warned) {
                w->f[i].warned = 1;
                fprintf(stderr, "megascale launch: warning: %s: lines not written: %s\n",
                        w->f[i].path, strerror(errs[i]));
            }
        if (state_failed && !w->state_warned) {
            w->state_warned = 1;
            fprintf(stderr, "megascale launch: warning: %s not saved: %s\n", path,
                    strerror(state_err));
        }
        if (state) w->state_done = gen;
        pthread_cond_broadcast(&w->done);
    }
    w->exited = 1;
    pthread_cond_broadcast(&w->done);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

sup_writer *sup_writer_start(char *why, size_t n) {
    sup_writer *w = calloc(1, sizeof *w);
    pthread_condattr_t ca;
    if (!w) return snprintf(why, n, "out of memory"), NULL;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->work, &ca);
    pthread_cond_init(&w->done, &ca);
    pthread_condattr_destroy(&ca);
    /* the driver's signals (SIGTERM, SIGINT, SIGHUP) go to its loop, not here */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&w->th, NULL, writer_main, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        snprintf(why, n, "cannot start the file writer thread: %s", strerror(rc));
        free(w);
        return NULL;
    }
    return w;
}

int sup_writer_open(sup_writer *w, const char *path, size_t bound, char *why, size_t n) {
    if (w->n >= MAX_FILES) return snprintf(why, n, "%s: too many files", path), -1;
    /* O_CLOEXEC: mpirun and diag do not inherit it */
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666); /* as fopen "a" */
    if (fd < 0) return snprintf(why, n, "%s: %s", path, strerror(errno)), -1;
    pthread_mutex_lock(&w->mu);
    int k = w->n;
    wfile *f = &w->f[k];
    memset(f, 0, sizeof *f);
    f->fd = fd;
    f->bound = bound;
    struct stat st;
    f->size = fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    snprintf(f->path, sizeof f->path, "%s", path);
    w->n++;
    pthread_mutex_unlock(&w->mu);
    return k;
}

int sup_writer_line(sup_writer *w, int k, const char *text, size_t len) {
    if (!w || k < 0 || k >= w->n) return -1;
    pthread_mutex_lock(&w->mu);
    wfile *f = &w->f[k];
    int rc = 0;
    if (f->bound && f->len + len + 1 > f->bound) {
        f->dropped++;
        rc = -1;
    } else if (f->len + len + 1 > f->cap) {
        size_t cap = f->cap ? f->cap : 4096;
        while (cap < f->len + len + 1)
            cap *= 2;
        char *b = realloc(f->buf, cap);
        if (b)
            f->buf = b, f->cap = cap;
        else
            f->dropped++, rc = -1;
    }
    if (rc == 0) {
        memcpy(f->buf + f->len, text, len);
        f->buf[f->len + len] = '\n';
        f->len += len + 1;
        pthread_cond_signal(&w->work);
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

void sup_writer_rotate(sup_writer *w, int k, uint64_t max_bytes) {
    if (!w || k < 0 || k >= w->n) return;
    pthread_mutex_lock(&w->mu);
    w->f[k].rotate = max_bytes;
    pthread_mutex_unlock(&w->mu);
}

long sup_writer_dropped(sup_writer *w, int k) {
    if (!w || k < 0 || k >= w->n) return 0;
    pthread_mutex_lock(&w->mu);
    long d = w->f[k].dropped;
    pthread_mutex_unlock(&w->mu);
    return d;
}

unsigned long sup_writer_replace(sup_writer *w, const char *path, char *text) {
    pthread_mutex_lock(&w->mu);
    free(w->state); /* not written yet: the newer text has all it said */
    w->state = text;
    snprintf(w->state_path, sizeof w->state_path, "%s", path);
    unsigned long gen = ++w->state_gen;
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->mu);
    return gen;
}

int sup_writer_wait(sup_writer *w, unsigned long gen, double timeout_s) {
    struct timespec dl = mono_deadline(timeout_s);
    pthread_mutex_lock(&w->mu);
    while (w->state_done < gen && !w->exited &&
           pthread_cond_timedwait(&w->done, &w->mu, &dl) != ETIMEDOUT) {
    }
    int rc = w->state_done >= gen ? 0 : -1;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int sup_writer_stop(sup_writer *w, double timeout_s) {
    if (!w) return 0;
    struct timespec dl = mono_deadline(timeout_s);
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->work);
    while (!w->exited && pthread_cond_timedwait(&w->done, &w->mu, &dl) != ETIMEDOUT) {
    }
    int exited = w->exited;
    pthread_mutex_unlock(&w->mu);
    if (!exited) {
        /* the disk is stuck: the thread is left blocked in its write, and w
         * with it (the process ends next) */
        fprintf(stderr,
                "megascale launch: warning: the disk under the run directory took no write for "
                "%.0f s; exiting without the driver's last lines (events.jsonl, compute.jsonl) "
                "and state (driver.json)\n",
                timeout_s);
        return -1;
    }
    pthread_join(w->th, NULL);
    for (int i = 0; i < w->n; i++)
        free(w->f[i].buf);
    free(w->state);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->work);
    pthread_cond_destroy(&w->done);
    free(w);
    return 0;
}
