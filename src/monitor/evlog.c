/* evlog.c - the event log's flusher thread and line format (see evlog.h). */
#include "monitor/evlog.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/events.h"
#include "base/fileio.h"
#include "base/jsonstr.h"
#include "base/log.h"
#include "base/timeutil.h"

struct mon_evlog {
    FILE *f;
    char path[4096];
    double flush_s;
    mon_identity id;      /* for the header of each file */
    long long max_bytes;  /* the log and its .1 together; 0: unbounded */
    ms_event last_clock;  /* flusher: the latest clock sample written */
    int have_clock;       /* flusher */
    int rotate_failed;    /* flusher: warned once, rotation off */
    int rotating;         /* flusher: writing the new file's first lines */
    int rotated;          /* flusher: this flush has rotated the log once already */
    int rotate_warned;    /* flusher: said that a flush holds more than half the bound */
    long long bytes;      /* flusher: the size of the current file */
    long long base_bytes; /* flusher: its header and clock line */
    long long opened_ns;  /* the first header's wall_ns: each rotated header repeats it */
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;         /* under mu */
    uint64_t dropped; /* flusher: drops already reported */
    int write_failed; /* flusher: warned once */
    /* flusher: a failed write cuts the file back to its last whole line */
    long long good;      /* the file's size at its last good flush */
    uint64_t lost;       /* events a failed write lost, not reported yet */
    uint64_t batch;      /* events put since the last good flush */
    int clock_unflushed; /* a clock line put since the last good flush */
    int clock_lost;      /* the latest clock line was lost: put it again */
    int need_header;     /* the header was lost: put it again */
};

/* An interned name as a JSON string: names are mostly identifiers chosen by
 * the code, but a group's or a kernel shape's name is data, so every one is
 * escaped (a '"' in one would make the line unreadable to the trace tools). */
#define QUOTED_NAME (6 * MS_EV_NAME_MAX + 10)
static const char *quote_name(char q[QUOTED_NAME], uint16_t id) {
    return ms_json_quote(q, QUOTED_NAME, ms_ev_name(id));
}

/* The optional arguments of e as ',"key":value' pairs; the bytes written. */
static int put_args(FILE *f, const ms_event *e) {
    const ms_ev_args *a = &e->a;
    int n = 0;
    char q[QUOTED_NAME];
    if (a->has & MS_EV_STEP) n += fprintf(f, ",\"step\":%d", a->step);
    if (a->has & MS_EV_MB) n += fprintf(f, ",\"mb\":%d", a->mb);
    if (a->has & MS_EV_CHUNK) n += fprintf(f, ",\"chunk\":%d", a->chunk);
    if (a->has & MS_EV_GROUP) n += fprintf(f, ",\"group\":%s", quote_name(q, a->group));
    if (a->has & MS_EV_OP) n += fprintf(f, ",\"op\":%s", quote_name(q, a->op));
    if (a->has & MS_EV_SEQ) n += fprintf(f, ",\"seq\":%lld", (long long)a->seq);
    if (a->has & MS_EV_PEER) n += fprintf(f, ",\"peer\":%d", a->peer);
    if (a->has & MS_EV_TAG) n += fprintf(f, ",\"tag\":%d", a->tag);
    if (a->has & MS_EV_BYTES) n += fprintf(f, ",\"bytes\":%lld", (long long)a->bytes);
    if (a->has & MS_EV_POSTED) n += fprintf(f, ",\"posted\":%lld", (long long)a->posted);
    return n;
}

static int put_header(FILE *f, const mon_identity *id, long long *opened_ns);
static void rotate(mon_evlog *l);

/* One event as one JSON line; a log past half its bound rotates after it. */
static void put_event(void *ctx, const ms_event *e) {
    mon_evlog *l = ctx;
    FILE *f = l->f;
    int n;
    if (e->kind == MS_EV_CLOCK) {
        l->last_clock = *e;
        l->have_clock = 1;
        l->clock_unflushed = 1;
        n = fprintf(f, "{\"type\":\"clock\",\"mono_ns\":%lld,\"offset_ns\":%lld,\"err_ns\":%lld}\n",
                    (long long)e->t0, (long long)e->a.bytes, (long long)e->a.seq);
    } else {
        char name[QUOTED_NAME], lane[QUOTED_NAME];
        quote_name(name, e->name);
        quote_name(lane, e->lane);
        if (e->kind == MS_EV_MARK)
            n = fprintf(f, "{\"type\":\"mark\",\"name\":%s,\"lane\":%s,\"t\":%lld", name, lane,
                        (long long)e->t0);
        else
            n = fprintf(f, "{\"type\":\"span\",\"name\":%s,\"lane\":%s,\"t0\":%lld,\"t1\":%lld",
                        name, lane, (long long)e->t0, (long long)e->t1);
        n += put_args(f, e);
        n += fprintf(f, "}\n");
        l->batch++;
    }
    l->bytes += n > 0 ? n : 0;
    /* past the header and clock line: every file holds at least one event.  Once a flush:
     * a flush of more than half the bound rotated twice, the second over the first's .1, and
     * the threads drained first (the training thread's compute lane) were lost for good */
    if (l->max_bytes > 0 && !l->rotating && !l->rotate_failed && l->bytes > l->base_bytes &&
        l->bytes >= l->max_bytes / 2) {
        if (!l->rotated) {
            rotate(l);
            l->rotated = 1;
        } else if (!l->rotate_warned) {
            l->rotate_warned = 1;
            ms_warn("%s: one flush of events holds more than half of --trace-max-mb %.3g: the "
                    "log goes past its bound rather than lose the events before (give a larger "
                    "--trace-max-mb)",
                    l->path, (double)l->max_bytes / 1e6);
        }
    }
}

/* After a failed write (a full disk): what the stream holds and the part
 * of a line the disk took are thrown away, the file cut back to its size
 * at the last good flush, so that the next write starts a whole line.
 * (Before, the part stayed and the next line was glued to it once space
 * came back: a line no reader could parse, and `trace merge` refused the
 * whole log.)  The events lost are counted in the next "dropped" line. */
static void cut_back(mon_evlog *l, uint64_t unreported) {
    __fpurge(l->f);
    clearerr(l->f);
    if (ftruncate(fileno(l->f), (off_t)l->good) != 0 || fseeko(l->f, (off_t)l->good, SEEK_SET) != 0)
        return; /* cannot: the log may keep the part (the reader then stops there) */
    l->bytes = l->good;
    l->lost = unreported + l->batch;
    l->clock_lost |= l->clock_unflushed && l->have_clock;
    l->need_header = l->good == 0;
}

/* Write what the recorder holds; report new drops. */
static void flush_once(mon_evlog *l) {
    uint64_t dropped = 0;
    l->batch = 0, l->clock_unflushed = 0, l->rotated = 0;
    if (l->need_header) {
        int n = put_header(l->f, &l->id, &l->opened_ns);
        l->bytes += n > 0 ? n : 0;
        l->base_bytes = l->bytes;
        l->need_header = 0;
    }
    if (l->clock_lost) { /* the latest sample, lost with a failed write: the merge needs one */
        ms_event clock = l->last_clock;
        l->clock_lost = 0;
        put_event(l, &clock);
    }
    ms_ev_drain(put_event, l, &dropped);
    uint64_t unreported = dropped - l->dropped + l->lost;
    l->dropped = dropped;
    if (unreported) {
        int n = fprintf(l->f, "{\"type\":\"dropped\",\"count\":%llu}\n",
                        (unsigned long long)unreported);
        l->bytes += n > 0 ? n : 0;
    }
    if (fflush(l->f) != 0 || ferror(l->f)) {
        if (!l->write_failed)
            ms_warn("%s: cannot write the event log: %s (tracing goes on in memory; the events "
                    "lost are counted in the log once it can be written again)",
                    l->path, strerror(errno));
        l->write_failed = 1;
        cut_back(l, unreported);
        return;
    }
    l->lost = 0;
    l->good = l->bytes;
}

/* The log has reached half its bound: it becomes PATH.1 (replacing the
 * older one) and a new PATH starts with the header and the latest clock
 * sample, so that it stands alone.  The new file is written under a
 * temporary name first: PATH is missing only between two renames.  A
 * failure says so once and leaves the log growing. */
static void rotate(mon_evlog *l) {
    char older[4200], fresh[4200];
    snprintf(older, sizeof older, "%s.1", l->path);
    snprintf(fresh, sizeof fresh, "%s.new", l->path);
    FILE *f = fopen(fresh, "w"), *old = l->f;
    long long bytes = l->bytes;
    l->rotating = 1;
    if (f) {
        int n = put_header(f, &l->id, &l->opened_ns);
        l->f = f;
        l->bytes = n > 0 ? n : 0;
        ms_event clock = l->last_clock; /* put_event sets it */
        if (l->have_clock) put_event(l, &clock);
        l->base_bytes = l->bytes;
    }
    l->rotating = 0;
    if (!f || fflush(f) != 0 || rename(l->path, older) != 0) {
        ms_warn("%s: cannot rotate the event log (%s): it grows past --trace-max-mb", l->path,
                strerror(errno));
        l->rotate_failed = 1;
        l->f = old;
        l->bytes = bytes;
        if (f) fclose(f);
        unlink(fresh);
        return;
    }
    /* the new file's first lines are on disk; the events before went with the old one */
    l->good = l->bytes, l->batch = 0, l->clock_unflushed = 0;
    if (rename(fresh, l->path) != 0) { /* the log goes on in fresh: never reopened "w" */
        ms_warn("%s: cannot rename %s to it: %s (the log goes on there, unrotated)", l->path, fresh,
                strerror(errno));
        l->rotate_failed = 1;
    }
    fclose(old);
}

static void *flusher(void *arg) {
    mon_evlog *l = arg;
    ms_ev_thread_init(0);
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        struct timespec ts = ms_deadline(CLOCK_MONOTONIC, l->flush_s);
        pthread_cond_timedwait(&l->cv, &l->mu, &ts);
        pthread_mutex_unlock(&l->mu);
        flush_once(l);
        pthread_mutex_lock(&l->mu);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* The header line; *opened_ns: 0 for a log's first (set to its wall_ns), else that wall_ns,
 * written as opened_wall_ns (a rotated file: the ranks of a run rotate at their own times,
 * and the tools tell the run's logs by when they were opened). */
static int put_header(FILE *f, const mon_identity *id, long long *opened_ns) {
    char host[256] = "unknown", quoted[6 * sizeof host + 10];
    gethostname(host, sizeof host - 1);
    ms_json_quote(quoted, sizeof quoted, host);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    long long mono = (long long)ms_ev_now();
    long long wall_ns = (long long)wall.tv_sec * 1000000000LL + wall.tv_nsec;
    int dp = id->has_grid ? id->dp : id->rank, DP = id->has_grid ? id->DP : id->world;
    char opened[96] = "";
    int o = 0;
    if (*opened_ns)
        o = snprintf(opened, sizeof opened, ",\"opened_wall_ns\":%lld", *opened_ns);
    else
        *opened_ns = wall_ns;
    if (id->run) snprintf(opened + o, sizeof opened - (size_t)o, ",\"run\":\"%016llx\"", id->run);
    return fprintf(f,
                   "{\"type\":\"header\",\"version\":1,\"rank\":%d,\"world\":%d,\"host\":%s,"
                   "\"pid\":%d,\"coord\":{\"dp\":%d,\"pp\":%d,\"tp\":%d},\"shape\":{\"dp\":%d,"
                   "\"pp\":%d,\"tp\":%d},\"mono_ns\":%lld,\"wall_ns\":%lld%s}\n",
                   id->rank, id->world, quoted, (int)getpid(), dp, id->has_grid ? id->pp : 0,
                   id->has_grid ? id->tp : 0, DP, id->has_grid ? id->PP : 1,
                   id->has_grid ? id->TP : 1, mono, wall_ns, opened);
}

/* The files a rank leaves in the trace directory: its event log, the
 * log's older half (rotated: --trace-max-mb) and its hang dump (written by comm_dump.c at the path
 * setup_trace gives it). */
static const char *const rank_files[] = {"events_r%05d.jsonl", "events_r%05d.jsonl.1",
                                         "hang_r%05d.json"};
#define N_RANK_FILES (sizeof rank_files / sizeof rank_files[0])

/* The rank a file name of rank_files[] is for; -1 if it is none of them.  %05d writes at
 * least 5 digits: a rank from 100000 on has more. */
static int rank_of_file(const char *name) {
    for (size_t k = 0; k < N_RANK_FILES; k++) {
        const char *pat = rank_files[k], *pct = strchr(pat, '%');
        size_t pre = (size_t)(pct - pat), i = pre;
        if (strncmp(name, pat, pre) != 0) continue;
        long r = 0;
        for (; name[i] >= '0' && name[i] <= '9' && r <= INT_MAX / 10 - 1; i++)
            r = r * 10 + (name[i] - '0');
        if (i >= pre + 5 && !strcmp(name + i, pct + 4)) return (int)r;
    }
    return -1;
}

/* DIR/prev/ takes DIR/name (the attempt before this one): renamed there,
 * replacing the older one; if DIR has none, its older copy is removed, so
 * that DIR/prev holds one attempt, not two mixed.  Renames are atomic. */
static void move_to_prev(const char *dir, const char *prev, const char *name) {
    char from[4200], to[4200];
    snprintf(from, sizeof from, "%s/%s", dir, name);
    snprintf(to, sizeof to, "%s/%s", prev, name);
    if (rename(from, to) == 0) return;
    if (errno != ENOENT)
        ms_warn("%s: cannot move it to %s (it is replaced): %s", from, prev, strerror(errno));
    else if (unlink(to) != 0 && errno != ENOENT)
        ms_warn("%s: cannot remove it (an older attempt's file): %s", to, strerror(errno));
}

/* Each rank moves only its own files. */
static void move_rank_to_prev(const char *dir, const char *prev, int r) {
    for (size_t k = 0; k < N_RANK_FILES; k++) {
        char name[64];
        snprintf(name, sizeof name, rank_files[k], r);
        move_to_prev(dir, prev, name);
    }
}

/* What the supervisor knew when it asked for the hang dumps (sup_driver.c
 * writes it beside them): it goes with them. */
#define HANG_DRIVER_FILE "hang_driver.json"

/* Before this rank's log replaces its older one (a restart in the same
 * directory), keep the attempt before in DIR/prev/: that is the one that
 * failed.  Rank 0 also moves the supervisor's HANG_DRIVER_FILE and the
 * files of ranks >= world (the attempt before had more ranks) and clears
 * those of prev, which no rank of this run owns.  Failing keeps nothing but
 * does not stop the run. */
static void keep_previous(const char *dir, int rank, int world) {
    char prev[4200], mine[4200];
    snprintf(prev, sizeof prev, "%s/prev", dir);
    int any = access(prev, F_OK) == 0; /* a first run makes no empty prev/ */
    for (size_t k = 0; k < N_RANK_FILES && !any; k++) {
        char name[64];
        snprintf(name, sizeof name, rank_files[k], rank);
        snprintf(mine, sizeof mine, "%s/%s", dir, name);
        any = access(mine, F_OK) == 0;
    }
    snprintf(mine, sizeof mine, "%s/" HANG_DRIVER_FILE, dir);
    any |= rank == 0 && access(mine, F_OK) == 0;
    if (!any) return;
    if (ms_mkdirs(prev) != MS_OK) {
        ms_warn("%s (the previous attempt's trace files are replaced)", ms_errmsg());
        return;
    }
    move_rank_to_prev(dir, prev, rank);
    if (rank != 0) return;
    move_to_prev(dir, prev, HANG_DRIVER_FILE);
    /* the ranks first, then the moves: a rank moved twice would lose its files */
    int *stale = NULL, n = 0, cap = 0;
    const char *dirs[] = {dir, prev};
    for (int i = 0; i < 2; i++) {
        DIR *d = opendir(dirs[i]);
        for (struct dirent *e; d && (e = readdir(d));) {
            int r = rank_of_file(e->d_name), seen = 0;
            for (int j = 0; j < n && !seen; j++)
                seen = stale[j] == r;
            if (r < world || seen) continue;
            if (n == cap) {
                int *p = realloc(stale, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *p);
                if (!p) break;
                stale = p;
            }
            stale[n++] = r;
        }
        if (d) closedir(d);
    }
    for (int j = 0; j < n; j++)
        move_rank_to_prev(dir, prev, stale[j]);
    free(stale);
}

ms_status mon_evlog_open(mon_evlog **out, const char *dir, const mon_identity *id, double flush_s,
                         long long max_bytes) {
    *out = NULL;
    char mine[4200], left[4300];
    /* a name cut to fit would be another file's (l->path, and its ".new") */
    if ((size_t)snprintf(mine, sizeof mine, "%s/events_r%05d.jsonl", dir, id->rank) >=
        sizeof((mon_evlog *)0)->path - 8)
        return ms_error(MS_ERR_ARG, "--trace-dir %.64s...: path too long for its event log", dir);
    MS_TRY(ms_mkdirs(dir));
    /* a rotation cut short after its first rename (killed, or its second
     * rename failed, the log going on in .new): the .new is the attempt's
     * newest log, kept as its log (before, it was removed below) */
    snprintf(left, sizeof left, "%s.new", mine);
    if (access(mine, F_OK) != 0 && access(left, F_OK) == 0 && rename(left, mine) != 0)
        ms_warn("%s: cannot rename it to %s (the newest events of the attempt before are lost): "
                "%s",
                left, mine, strerror(errno));
    keep_previous(dir, id->rank, id->world);
    mon_evlog *l = calloc(1, sizeof *l);
    if (!l) return ms_error(MS_ERR_NOMEM, "event log: out of memory");
    snprintf(l->path, sizeof l->path, "%s", mine);
    l->flush_s = flush_s > 0 ? flush_s : 0.2;
    l->id = *id;
    l->max_bytes = max_bytes > 0 ? max_bytes : 0;
    char fresh[sizeof l->path + 8];
    snprintf(fresh, sizeof fresh, "%s.new", l->path);
    unlink(fresh); /* a rotation's new file, left by a rank killed in the middle of it */
    l->f = fopen(l->path, "w");
    if (!l->f) {
        ms_status st = ms_error(MS_ERR_IO, "%s: open the event log: %s", l->path, strerror(errno));
        free(l);
        return st;
    }
    int n = put_header(l->f, id, &l->opened_ns);
    l->bytes = l->base_bytes = n > 0 ? n : 0;
    /* on disk now: a rank killed before the first flush still says who it
     * was (an empty log names no host, rank or coordinates) */
    if (fflush(l->f) != 0) {
        l->write_failed = 1;
        ms_warn("%s: cannot write the event log: %s (tracing goes on in memory)", l->path,
                strerror(errno));
        cut_back(l, 0); /* the header again at the next flush */
    } else {
        l->good = l->bytes;
    }
    ms_ev_reset(); /* what was recorded before the log existed has no header */
    pthread_mutex_init(&l->mu, NULL);
    pthread_condattr_t ca; /* the flush interval on the monotonic clock (a wall clock
                            * stepped back held the log's writes back that long) */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    ms_ev_enable(1);
    int rc = pthread_create(&l->thread, NULL, flusher, l);
    if (rc != 0) {
        ms_ev_enable(0);
        fclose(l->f);
        free(l);
        return ms_error(MS_ERR_INTERNAL, "event log: cannot start its thread: %s", strerror(rc));
    }
    l->started = 1;
    *out = l;
    return MS_OK;
}

void mon_evlog_close(mon_evlog *l) {
    if (!l) return;
    ms_ev_enable(0);
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    if (l->started) pthread_join(l->thread, NULL);
    flush_once(l);
    fclose(l->f);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
}

const char *mon_evlog_path(const mon_evlog *l) {
    return l ? l->path : "";
}
