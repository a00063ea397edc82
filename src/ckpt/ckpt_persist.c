/* ckpt_persist.c - stage 2: shard files, the commit protocol, keep-last-K,
 * and the background thread that runs them.
 *
 * One persist (for the snapshot of step N), on every rank of the "ckpt"
 * group: rank 0 makes an empty staging directory DIR/.step_N.tmp; all agree
 * it exists; each rank checks its snapshot's data against the CRC stage 1
 * recorded (a byte damaged in /dev/shm fails the persist, never becomes a
 * commit) and writes its shard there (safetensors: the header from
 * the writer, padded to 4 KiB, then the snapshot's data as it lies in
 * /dev/shm, with O_DIRECT where the filesystem has it; temp + fsync +
 * rename) with a CRC32C per slice; all exchange their parts of the manifest
 * (file, slices, CRCs, or the error that stopped them); rank 0, when every
 * rank succeeded, writes manifest.json (fsynced) into the staging directory,
 * renames it to DIR/step_N (the commit point; an older directory of the
 * same step is swapped out atomically and removed), fsyncs DIR, replaces
 * DIR/latest and removes commits beyond the newest K up to N.  Any failure
 * removes the staging directory and leaves every commit as it was.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/finite.h"
#include "base/events.h"
#include "base/fileio.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "ckpt/ckpt_internal.h"
#include "ckpt/safetensors.h"

/* ---- directories ------------------------------------------------------------- */

void ckpt_step_path(char *buf, size_t n, const char *root, int step) {
    snprintf(buf, n, "%s/step_%08d", root, step);
}

void ckpt_staging_path(char *buf, size_t n, const char *root, int step) {
    snprintf(buf, n, "%s/.step_%08d.tmp", root, step);
}

void ckpt_shard_name(char *buf, size_t n, int rank, int world) {
    snprintf(buf, n, "shard-%05d-of-%05d.safetensors", rank, world);
}

ms_status ckpt_rmdir_flat(const char *dir) {
    /* never through a symbolic link: a step_* link into another run's
     * directory must not cost that run its files */
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return MS_OK;
    if (fd < 0 && (errno == ELOOP || errno == ENOTDIR))
        return ms_error(MS_ERR_IO, "%s: not removed: a symbolic link or not a directory", dir);
    if (fd < 0) return ms_error(MS_ERR_IO, "%s: open directory: %s", dir, strerror(errno));
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return ms_error(MS_ERR_IO, "%s: opendir: %s", dir, strerror(errno));
    }
    ms_status st = MS_OK;
    struct dirent *e;
    while (st == MS_OK && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        /* a link inside is removed itself, never its target; a
         * subdirectory fails (EISDIR): a step directory holds none */
        if (unlinkat(dirfd(d), e->d_name, 0) != 0 && errno != ENOENT)
            st = ms_error(MS_ERR_IO, "%s/%s: unlink: %s", dir, e->d_name, strerror(errno));
    }
    closedir(d);
    if (st == MS_OK && rmdir(dir) != 0 && errno != ENOENT)
        st = ms_error(MS_ERR_IO, "%s: rmdir: %s", dir, strerror(errno));
    return st;
}

static int cmp_desc(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

ms_status ckpt_list_steps(const char *root, int **steps, int *n) {
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(root);
    if (!d)
        return errno == ENOENT ? MS_OK
                               : ms_error(MS_ERR_IO, "%s: opendir: %s", root, strerror(errno));
    int cap = 16, cnt = 0;
    int *v = malloc(sizeof(int) * (size_t)cap);
    struct dirent *e;
    while (v && (e = readdir(d))) {
        /* only the names a commit gets (step_%08d): "step_+0000040", a
         * ninth leading zero or an int overflow would be listed under the
         * name of another directory */
        const char *num = e->d_name + 5;
        size_t len = strlen(num);
        if (strncmp(e->d_name, "step_", 5) || len < 8 || len > 10 ||
            strspn(num, "0123456789") != len)
            continue;
        long long big = strtoll(num, NULL, 10);
        char canon[32];
        if (big > INT32_MAX) continue;
        int step = (int)big;
        snprintf(canon, sizeof canon, "%08d", step);
        if (strcmp(canon, num)) continue;
        char path[4400];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (cnt == cap) {
            int *nv = realloc(v, sizeof(int) * (size_t)(cap *= 2));
            if (!nv) {
                free(v);
                v = NULL;
                break;
            }
            v = nv;
        }
        v[cnt++] = step;
    }
    closedir(d);
    if (!v) return ms_error(MS_ERR_NOMEM, "%s: out of memory listing checkpoints", root);
    qsort(v, (size_t)cnt, sizeof *v, cmp_desc);
    *steps = v;
    *n = cnt;
    return MS_OK;
}

ms_status ckpt_staging_create(const char *root, int step) {
    char dir[4200];
    ckpt_staging_path(dir, sizeof dir, root, step);
    MS_TRY(ckpt_rmdir_flat(dir));
    if (mkdir(dir, 0777) != 0) return ms_error(MS_ERR_IO, "%s: mkdir: %s", dir, strerror(errno));
    return MS_OK;
}

static ms_status fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ms_error(MS_ERR_IO, "%s: open directory: %s", dir, strerror(errno));
    ms_status st = MS_OK;
    if (fsync(fd) != 0 && errno != EINVAL)
        st = ms_error(MS_ERR_IO, "%s: fsync directory: %s", dir, strerror(errno));
    close(fd);
    return st;
}

/* ---- shards ------------------------------------------------------------------- */

/* Injected faults on a file about to be written: leave half of it in the
 * writer's temp name (as a crash or a full disk would) and fail or die. */
static ms_status shard_fault(ckpt_st_writer *w, const char *path, const char *kind_point,
                             const ckpt_fault *f, int step, int first) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    uint64_t size = 0;
    MS_TRY(ckpt_st_write(w, tmp));
    if (ms_file_size(tmp, &size) == MS_OK && truncate(tmp, (off_t)(size / 2)) != 0)
        return ms_error(MS_ERR_IO, "%s: truncate: %s", tmp, strerror(errno));
    ckpt_fault_kill(f, "stage2:mid-shard", step, first);
    unlink(tmp); /* the atomic writer removes its temp file on failure */
    return ckpt_fault_io_error(tmp, !strcmp(kind_point, "io:enospc-shard") ? "write" : "fsync",
                               !strcmp(kind_point, "io:enospc-shard") ? ENOSPC : EIO);
}

static ms_status pwrite_all(int fd, const char *path, const void *buf, size_t n, uint64_t off) {
    for (size_t done = 0; done < n;) {
        ssize_t w = pwrite(fd, (const char *)buf + done, n - done, (off_t)(off + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return ms_error(MS_ERR_IO, "%s: write: %s", path, strerror(w < 0 ? errno : EIO));
        done += (size_t)w;
    }
    return MS_OK;
}

/* Write hdr (hlen, a multiple of 4 KiB) then n bytes of data to path
 * atomically (temp file, fsync, rename).  Page-aligned data goes with
 * O_DIRECT where the filesystem allows it: no copy through the page cache,
 * so stage 2 takes little CPU (and memory bandwidth) from training; the
 * last partial block, and everything on filesystems without O_DIRECT
 * (tmpfs), is written normally. */
static ms_status write_direct(const char *path, const char *hdr, size_t hlen, const void *data,
                              size_t n) {
    char tmp[4500];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), fdd = -1;
    if (fd < 0) return ms_error(MS_ERR_IO, "%s: create %s: %s", path, tmp, strerror(errno));
    ms_status st = pwrite_all(fd, tmp, hdr, hlen, 0);
    size_t direct = (uintptr_t)data % 4096 == 0 && hlen % 4096 == 0 ? n / 4096 * 4096 : 0, done = 0;
    if (st == MS_OK && direct) fdd = open(tmp, O_WRONLY | O_DIRECT | O_CLOEXEC);
    while (st == MS_OK && fdd >= 0 && done < direct) {
        size_t chunk = direct - done < ((size_t)64 << 20) ? direct - done : (size_t)64 << 20;
        ssize_t w = pwrite(fdd, (const char *)data + done, chunk, (off_t)(hlen + done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EINVAL && done == 0) break; /* no O_DIRECT here */
        if (w <= 0)
            st = ms_error(MS_ERR_IO, "%s: write: %s", tmp, strerror(w < 0 ? errno : EIO));
        else
            done += (size_t)w;
        if (st == MS_OK && done % 4096) break; /* short write: the rest normally */
    }
    if (st == MS_OK) st = pwrite_all(fd, tmp, (const char *)data + done, n - done, hlen + done);
    if (st == MS_OK && fsync(fd) != 0)
        st = ms_error(MS_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
    if (fdd >= 0) close(fdd);
    if (close(fd) != 0 && st == MS_OK)
        st = ms_error(MS_ERR_IO, "%s: close: %s", tmp, strerror(errno));
    if (st == MS_OK && rename(tmp, path) != 0)
        st = ms_error(MS_ERR_IO, "%s: rename from %s: %s", path, tmp, strerror(errno));
    if (st != MS_OK) unlink(tmp);
    return st;
}

/* The runs' data lies in one buffer in the order the shard's tensors are
 * added (param, m, v of each run), so the data section is that buffer. */
static int runs_contiguous(const ckpt_run *runs, int n_runs, uint64_t *elems) {
    uint64_t off = 0;
    for (int i = 0; i < n_runs; i++) {
        if (runs[i].data_off != off) return 0;
        off += 3 * (runs[i].end - runs[i].begin);
    }
    *elems = off;
    return 1;
}

ms_status ckpt_shard_write(const char *dir, const char *name, int rank, int step,
                           const ckpt_tensor_info *tensors, const ckpt_run *runs, int n_runs,
                           const float *data, uint32_t *crcs, uint64_t *bytes,
                           const ckpt_fault *fault, int fault_first) {
    char path[4400], key[96], buf[32];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ckpt_st_writer *w = ckpt_st_writer_create();
    ms_status st = w ? MS_OK : ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; st == MS_OK && i < n_runs; i++) {
        const ckpt_run *r = &runs[i];
        int64_t n = (int64_t)(r->end - r->begin);
        for (int k = 0; st == MS_OK && k < CKPT_NKINDS; k++) {
            const float *src = data + r->data_off + (uint64_t)k * (uint64_t)n;
            crcs[3 * i + k] = ms_crc32c(0, src, (size_t)n * sizeof(float));
            /* a weight an update made NaN or Inf is not committed: a resume from it could not
             * go on (the trainer stops on it at the next step, and the commit before stands) */
            int64_t bad = k == CKPT_PARAM ? ms_first_nonfinite(src, (size_t)n) : -1;
            if (bad >= 0) {
                st = ms_error(MS_ERR_NONFINITE,
                              "%s: tensor '%s' holds a non-finite weight (%g at element %lld)",
                              path, tensors[r->tensor].name, (double)src[bad],
                              (long long)(r->begin + (uint64_t)bad));
                break;
            }
            ckpt_run_key(key, sizeof key, tensors[r->tensor].name, k, r);
            st = ckpt_st_writer_add(w, key, CKPT_ST_F32, 1, &n, src);
        }
    }
    snprintf(buf, sizeof buf, "%d", step);
    if (st == MS_OK) st = ckpt_st_writer_meta(w, "format", "megascale-ckpt-shard");
    if (st == MS_OK) st = ckpt_st_writer_meta(w, "step", buf);
    snprintf(buf, sizeof buf, "%d", rank);
    if (st == MS_OK) st = ckpt_st_writer_meta(w, "rank", buf);
    if (st == MS_OK) {
        const char *pts[] = {"stage2:mid-shard", "io:enospc-shard", "io:eio-fsync-shard"};
        for (int i = 0; i < 3; i++)
            if (ckpt_fault_hits(fault, pts[i], step, fault_first)) {
                st = shard_fault(w, path, pts[i], fault, step, fault_first);
                goto out;
            }
        uint64_t elems = 0;
        char *hdr = NULL;
        size_t hlen = 0;
        if (runs_contiguous(runs, n_runs, &elems)) {
            st = ckpt_st_writer_header(w, 4096, &hdr, &hlen);
            if (st == MS_OK) st = write_direct(path, hdr, hlen, data, elems * sizeof(float));
            if (st == MS_OK) st = fsync_dir(dir);
            free(hdr);
        } else {
            st = ckpt_st_write(w, path);
        }
    }
    if (st == MS_OK) st = ms_file_size(path, bytes);
out:
    ckpt_st_writer_destroy(w);
    return st;
}

/* ---- commit -------------------------------------------------------------------- */

/* Remove commits older than `step` beyond the newest keep-1 of them, and
 * staging directories left by crashed persists.  Symbolic links and
 * non-directories named step_* are left alone. */
static void prune(const char *root, int step, int keep) {
    int *steps = NULL, n = 0, kept = 1; /* `step` itself */
    char path[4200];
    if (ckpt_list_steps(root, &steps, &n) != MS_OK) return;
    for (int i = 0; i < n; i++) {
        if (steps[i] >= step) continue; /* newer ones (another history) stay */
        ckpt_step_path(path, sizeof path, root, steps[i]);
        struct stat sb; /* a link (into another run?) is not ours: neither counted nor removed */
        if (lstat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            ms_info("checkpoint: not pruning %s: a symbolic link or not a directory", path);
            continue;
        }
        if (kept++ < keep) continue;
        /* out of sight first, in one rename: killed while its files went one by one, the
         * commit was left with a manifest and no shard, which verify, list and every resume
         * then reported as damaged; a hidden leftover goes with the next pruning (below) */
        char hidden[4300];
        snprintf(hidden, sizeof hidden, "%s/.step_%08d.prune.tmp", root, steps[i]);
        (void)ckpt_rmdir_flat(hidden);
        if (rename(path, hidden) != 0)
            ms_warn("checkpoint: could not remove %s: rename to %s: %s", path, hidden,
                    strerror(errno));
        else if (ckpt_rmdir_flat(hidden) == MS_OK)
            ms_info("checkpoint: removed %s (keeping the newest %d)", path, keep);
        else
            ms_warn("checkpoint: could not remove %s (now %s): %s", path, hidden, ms_errmsg());
    }
    free(steps);
    DIR *d = opendir(root);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (!strncmp(e->d_name, ".step_", 6) && l > 4 && !strcmp(e->d_name + l - 4, ".tmp")) {
            snprintf(path, sizeof path, "%s/%s", root, e->d_name);
            ckpt_rmdir_flat(path);
        }
    }
    if (d) closedir(d);
}

/* Write the manifest into the staging directory (faults first). */
static ms_status write_manifest(const char *staging, const char *text, const ckpt_fault *f,
                                int step, int first) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", staging, CKPT_MANIFEST);
    int enospc = ckpt_fault_hits(f, "io:enospc-manifest", step, first);
    if (enospc || ckpt_fault_hits(f, "io:eio-fsync-manifest", step, first)) {
        char tmp[4500];
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
        MS_TRY(ms_file_write_atomic(tmp, text, strlen(text) / 2));
        unlink(tmp);
        return ckpt_fault_io_error(tmp, enospc ? "write" : "fsync", enospc ? ENOSPC : EIO);
    }
    return ms_file_write_atomic(path, text, strlen(text));
}

/* The commit over an older directory of its step where the file system has
 * no atomic exchange (NFS answers RENAME_EXCHANGE with EINVAL): the old one
 * is moved aside to DIR/.step_N.old.tmp, the new one takes its name, and the
 * old one is removed.  Killed between the two renames, DIR has no step_N:
 * the commits before it stand, the step's /dev/shm snapshot is persisted
 * again on resume, and the next commit's pruning removes both hidden
 * directories (.step_*.tmp). */
static ms_status replace_moving_aside(const char *root, int step, const char *staging,
                                      const char *final) {
    char aside[4300];
    snprintf(aside, sizeof aside, "%s/.step_%08d.old.tmp", root, step);
    (void)ckpt_rmdir_flat(aside); /* a leftover of a kill between the renames */
    if (rename(final, aside) != 0)
        return ms_error(MS_ERR_IO, "%s: move aside to %s (no atomic exchange here): %s", final,
                        aside, strerror(errno));
    if (rename(staging, final) != 0) {
        ms_status st = ms_error(MS_ERR_IO, "%s: rename to %s: %s", staging, final, strerror(errno));
        if (rename(aside, final) != 0) /* the older directory back under its name */
            ms_warn("checkpoint: %s could not be moved back to %s: %s", aside, final,
                    strerror(errno));
        return st;
    }
    ms_warn("checkpoint: replaced an older %s (this file system has no atomic exchange: the older "
            "one was moved aside first)",
            final);
    ckpt_rmdir_flat(aside);
    return MS_OK;
}

ms_status ckpt_commit(const char *root, int step, const char *manifest, int keep,
                      const ckpt_fault *fault, int fault_first, char *warn, size_t warn_n) {
    char staging[4200], final[4200], latest[4200], text[64];
    if (warn && warn_n) warn[0] = 0;
    ckpt_staging_path(staging, sizeof staging, root, step);
    ckpt_step_path(final, sizeof final, root, step);
    MS_TRY(write_manifest(staging, manifest, fault, step, fault_first));
    ckpt_fault_kill(fault, "stage2:after-manifest", step, fault_first);
    if (rename(staging, final) != 0) {
        if (errno != ENOTEMPTY && errno != EEXIST)
            return ms_error(MS_ERR_IO, "%s: rename to %s: %s", staging, final, strerror(errno));
        /* an older directory of this step (another history, or damaged):
         * swap atomically, then remove the old one */
        int no_exchange = ckpt_fault_hits(fault, "io:noexchange", step, fault_first);
        if (!no_exchange && renameat2(AT_FDCWD, staging, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
            ms_warn("checkpoint: replaced an older %s", final);
            ckpt_rmdir_flat(staging);
        } else if (no_exchange || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
            MS_TRY(replace_moving_aside(root, step, staging, final));
        } else {
            return ms_error(MS_ERR_IO, "%s: exchange with %s: %s", staging, final, strerror(errno));
        }
    }
    /* the rename is done: step N is committed and loads, whatever the
     * directory's fsync says (before, its failure was reported as "NOT
     * committed", and the commit was neither counted nor pruned after) */
    ms_status synced = ckpt_fault_hits(fault, "io:eio-fsync-commit", step, fault_first)
                           ? ms_error(MS_ERR_IO, "%s: fsync directory: %s", root, strerror(EIO))
                           : fsync_dir(root);
    if (synced != MS_OK) {
        char w[1024];
        snprintf(w, sizeof w,
                 "checkpoint: step %d is committed (%s is in place), but %s: a crash or power "
                 "loss before the file system writes the directory back may undo the commit",
                 step, final, ms_errmsg());
        ms_warn("%s", w);
        if (warn && warn_n) snprintf(warn, warn_n, "%s", w); /* the supervisor is told */
    }
    ckpt_fault_kill(fault, "stage2:after-commit", step, fault_first);
    snprintf(latest, sizeof latest, "%s/latest", root);
    int n = snprintf(text, sizeof text, "step_%08d\n", step);
    ms_status st = ms_file_write_atomic(latest, text, (size_t)n);
    if (st != MS_OK) { /* the commit stands; the loader scans the directory anyway */
        char w[1024];
        snprintf(w, sizeof w, "checkpoint: step %d is committed but %s was not updated: %s", step,
                 latest, ms_errmsg());
        ms_warn("%s", w);
        if (warn && warn_n && !warn[0]) snprintf(warn, warn_n, "%s", w);
    }
    prune(root, step, keep < 1 ? 1 : keep);
    return MS_OK;
}

/* ---- the stage-2 thread ------------------------------------------------------------ */

struct ckpt_persist {
    ckpt_persist_config cfg;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit;
    int queued, running; /* slot indices, -1 none */
    ckpt_slot *qslot;
    ckpt_train_state qtr;
    int qfirst;
    double qstall_ms; /* stage 1 of the queued slot */
    ms_status last;
    char last_msg[1024];
    int last_commit;
    int fail_streak; /* persists that failed since the last commit */
    /* rank 0: the commits that stood with a warning (the disk), the last one's step and text */
    int warned, warned_step;
    char warned_msg[512];
    /* rank 0: the commits not yet taken (ckpt_persist_take_commits), oldest first */
    ckpt_commit_record commits[CKPT_COMMIT_QUEUE];
    int n_commits;
};

/* What one persist learnt: this rank's shard size; on rank 0, after the
 * commit, the size of every rank's shard together and when it committed. */
typedef struct {
    uint64_t bytes, total;
    double commit_mono, commit_wall; /* ms_now(), ms_wall_now() */
    char warning[512];               /* a commit that stood with a warning: what it said */
} persist_result;

/* All ranks learn whether any rank failed, and the lowest that did (MIN of
 * the failed ranks): the others' error names it ("rank 3 failed to ..."),
 * which the supervisor takes for the fault's rank. */
static ms_status agree(const ckpt_persist *p, ms_status mine, const char *what) {
    if (!p->cfg.group) return mine;
    int32_t me = mine != MS_OK ? p->cfg.rank : INT32_MAX, first = INT32_MAX;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ms_errmsg());
    MS_TRY(comm_allreduce(p->cfg.group, &me, &first, 1, COMM_I32, COMM_MIN));
    if (mine != MS_OK) return ms_error(mine, "%s", msg);
    if (first != INT32_MAX)
        return ms_error(MS_ERR_IO, "rank %d failed to %s (see its log)", (int)first, what);
    return MS_OK;
}

/* Every rank's part (JSON text) gathered to all; parts[r] parsed. */
static ms_status gather_parts(const ckpt_persist *p, const char *mine, cJSON **parts) {
    int world = p->cfg.world;
    if (!p->cfg.group) {
        parts[0] = cJSON_Parse(mine);
        return parts[0] ? MS_OK : ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    }
    int64_t len = (int64_t)strlen(mine) + 1, maxlen = 0;
    MS_TRY(comm_allreduce(p->cfg.group, &len, &maxlen, 1, COMM_I64, COMM_MAX));
    char *send = calloc((size_t)maxlen, 1), *recv = calloc((size_t)maxlen * (size_t)world, 1);
    ms_status st = send && recv ? MS_OK : ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    if (st == MS_OK) {
        memcpy(send, mine, (size_t)len);
        st = comm_allgather(p->cfg.group, send, recv, (size_t)maxlen, COMM_U8);
    }
    for (int r = 0; st == MS_OK && r < world; r++) {
        parts[r] = cJSON_Parse(recv + (size_t)r * (size_t)maxlen);
        if (!parts[r]) st = ms_error(MS_ERR_FORMAT, "checkpoint: rank %d sent a bad part", r);
    }
    free(send);
    free(recv);
    return st;
}

/* Rank 0: the manifest from the parts, or the first rank's error; *total:
 * the bytes of every rank's shard (the parts' "file" entries). */
static ms_status commit_parts(ckpt_persist *p, const ckpt_train_state *tr, cJSON **parts, int first,
                              uint64_t *total, char *warn, size_t warn_n) {
    const ckpt_persist_config *c = &p->cfg;
    *total = 0;
    for (int r = 0; r < c->world; r++) { /* the ranks persist the same steps in the same order */
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(parts[r], "step");
        if (!cJSON_IsNumber(ps) || (int)ps->valuedouble != tr->step)
            return ms_error(MS_ERR_INTERNAL,
                            "rank %d persisted the checkpoint of step %d while rank 0 persisted "
                            "step %d (the ranks' checkpoints went out of step)",
                            r, cJSON_IsNumber(ps) ? (int)ps->valuedouble : -1, tr->step);
    }
    for (int r = 0; r < c->world; r++) {
        const cJSON *err = cJSON_GetObjectItemCaseSensitive(parts[r], "error");
        if (cJSON_IsString(err)) return ms_error(MS_ERR_IO, "rank %d: %s", r, err->valuestring);
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(parts[r], "file");
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(f, "bytes");
        if (cJSON_IsNumber(b)) *total += (uint64_t)b->valuedouble;
    }
    ckpt_commit_info ci = {tr->step,     c->world, c->dp,      c->model,
                           c->optimizer, tr,       c->tensors, c->n_tensors};
    char *text = ckpt_manifest_text_layout(&ci, parts, c->world, c->tp, c->pp, c->vpp);
    if (!text) return ms_error(MS_ERR_NOMEM, "checkpoint: out of memory building the manifest");
    ms_status st = ckpt_commit(c->root, tr->step, text, c->keep, c->fault, first, warn, warn_n);
    free(text);
    return st;
}

/* One persist of slot s (see the file comment). */
static ms_status persist_one(ckpt_persist *p, ckpt_slot *s, const ckpt_train_state *tr, int first,
                             persist_result *res) {
    const ckpt_persist_config *c = &p->cfg;
    char staging[4200], name[96];
    int step = tr->step;
    memset(res, 0, sizeof *res); /* before any return: the caller logs res->bytes */
    ckpt_staging_path(staging, sizeof staging, c->root, step);
    ms_status st = c->rank == 0 ? ckpt_staging_create(c->root, step) : MS_OK;
    MS_TRY(agree(p, st, "create the staging directory"));
    ckpt_fault_kill(c->fault, "stage2:start", step, first);
    ckpt_shard_name(name, sizeof name, c->rank, c->world);
    uint32_t *crcs = calloc(3 * (size_t)c->n_runs + 1, sizeof *crcs);
    cJSON **parts = calloc((size_t)c->world, sizeof *parts);
    cJSON *mine = NULL;
    char *text = NULL;
    uint64_t *bytes = &res->bytes;
    st = crcs && parts ? MS_OK : ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    if (st == MS_OK && ckpt_fault_hits(c->fault, "stage2:flip-shm", step, first)) {
        ms_warn("injected fault stage2:flip-shm at the checkpoint of step %d: one bit of %s "
                "flipped",
                step, ckpt_slot_path(s));
        ckpt_slot_damage(s);
    }
    double slow_ms = st == MS_OK ? ckpt_fault_delay_ms(c->fault, "stage2:slow", step, first) : 0;
    if (slow_ms > 0) { /* a slow disk: this persist takes that much longer */
        ms_info("injected fault stage2:slow: the persist of step %d sleeps %.0f ms", step, slow_ms);
        usleep((useconds_t)(slow_ms * 1e3));
    }
    if (st == MS_OK) st = ckpt_slot_verify(s); /* what goes to disk is what stage 1 copied */
    if (st == MS_OK)
        st = ckpt_shard_write(staging, name, c->rank, step, c->tensors, c->runs, c->n_runs,
                              ckpt_slot_data(s), crcs, bytes, c->fault, first);
    if (st == MS_OK) ckpt_fault_kill(c->fault, "stage2:after-shard", step, first);
    if (st == MS_OK) {
        mine = ckpt_json_part(name, c->rank, *bytes, c->tensors, c->runs, c->n_runs, crcs);
    } else {
        mine = cJSON_CreateObject();
        if (mine) cJSON_AddStringToObject(mine, "error", ms_errmsg());
    }
    /* the step travels with the part: rank 0 commits only parts of its own step */
    if (mine && !cJSON_AddNumberToObject(mine, "step", step)) {
        cJSON_Delete(mine);
        mine = NULL;
    }
    text = mine ? cJSON_PrintUnformatted(mine) : NULL;
    if (!text) {
        st = ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
        goto out;
    }
    ms_status own = st;
    char own_msg[1024];
    snprintf(own_msg, sizeof own_msg, "%s", ms_errmsg());
    st = gather_parts(p, text, parts); /* also the barrier: every shard is fsynced */
    if (st == MS_OK && c->rank == 0) {
        st = commit_parts(p, tr, parts, first, &res->total, res->warning, sizeof res->warning);
        res->commit_mono = ms_now(); /* committed (DIR/latest and the pruning done too) */
        res->commit_wall = ms_wall_now();
        if (st != MS_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", ms_errmsg());
            ckpt_rmdir_flat(staging);
            ms_error(st, "%s", msg);
        }
    }
    st = agree(p, st, "commit"); /* every rank learns rank 0's verdict */
    if (own != MS_OK) st = ms_error(own, "%s", own_msg);
out:
    for (int r = 0; parts && r < c->world; r++)
        cJSON_Delete(parts[r]);
    free(parts);
    free(text);
    cJSON_Delete(mine);
    free(crcs);
    return st;
}

static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *persist_main(void *arg) {
    ckpt_persist *p = arg;
    setpriority(PRIO_PROCESS, (id_t)gettid(), 10); /* training comes first */
    comm_thread_set_background(1); /* its waits are not the training's (the heartbeats) */
    static _Atomic uint16_t c_lane, c_persist;
    ms_ev_thread_init(ms_ev_id(&c_lane, "ckpt"));
    uint16_t persist = ms_ev_id(&c_persist, "persist");
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->queued < 0)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->queued < 0) break;
        int slot = p->queued, first = p->qfirst;
        ckpt_slot *s = p->qslot;
        ckpt_train_state tr = p->qtr;
        double stall_ms = p->qstall_ms;
        p->queued = -1;
        p->running = slot;
        pthread_cond_broadcast(&p->cv); /* ckpt_persist_wait_queued: started */
        pthread_mutex_unlock(&p->mu);

        double t0 = ms_now(), c0 = thread_cpu();
        int64_t e0 = ms_ev_now();
        persist_result res;
        ms_status st = persist_one(p, s, &tr, first, &res);
        double dt = ms_now() - t0;
        uint64_t bytes = res.bytes;
        ms_ev_args ea = {.has = MS_EV_STEP | MS_EV_BYTES, .step = tr.step, .bytes = (int64_t)bytes};
        ms_ev_span(persist, 0, e0, ms_ev_now(), &ea);
        ms_debug("checkpoint: step %d: stage 2 took %.3f s, %.3f s of CPU", tr.step, dt,
                 thread_cpu() - c0);
        char dir[4200];
        ckpt_step_path(dir, sizeof dir, p->cfg.root, tr.step);
        if (st == MS_OK)
            ms_info("checkpoint: step %d committed to %s (stage 2: %.1f MB from rank 0 in %.2f s, "
                    "%.0f MB/s)",
                    tr.step, dir, (double)bytes / 1e6, dt, (double)bytes / 1e6 / (dt > 0 ? dt : 1));
        else
            ms_warn("checkpoint: step %d was NOT committed: %s; the older commits are untouched",
                    tr.step, ms_errmsg());

        pthread_mutex_lock(&p->mu);
        p->running = -1;
        p->last = st;
        snprintf(p->last_msg, sizeof p->last_msg, "%s", st == MS_OK ? "" : ms_errmsg());
        if (st == MS_OK) p->last_commit = tr.step;
        p->fail_streak = st == MS_OK ? 0 : p->fail_streak + 1;
        if (st == MS_OK && res.warning[0]) {
            p->warned++;
            p->warned_step = tr.step;
            snprintf(p->warned_msg, sizeof p->warned_msg, "%s", res.warning);
        }
        if (st == MS_OK && p->cfg.rank == 0) {
            ckpt_commit_record c = {tr.step, res.total, stall_ms, (res.commit_mono - t0) * 1e3,
                                    res.commit_wall};
            if (p->n_commits == CKPT_COMMIT_QUEUE) { /* nobody takes them: drop the oldest */
                memmove(p->commits, p->commits + 1, sizeof *p->commits * (CKPT_COMMIT_QUEUE - 1));
                p->n_commits--;
            }
            p->commits[p->n_commits++] = c;
        }
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ms_status ckpt_persist_start(ckpt_persist **out, const ckpt_persist_config *cfg) {
    *out = NULL;
    ckpt_persist *p = calloc(1, sizeof *p);
    if (!p) return ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    p->cfg = *cfg;
    p->queued = p->running = -1;
    p->last_commit = -1;
    p->warned_step = -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->thread, NULL, persist_main, p) != 0) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        free(p);
        return ms_error(MS_ERR_INTERNAL, "checkpoint: cannot start the persist thread");
    }
    *out = p;
    return MS_OK;
}

void ckpt_persist_enqueue(ckpt_persist *p, int slot, ckpt_slot *s, const ckpt_train_state *tr,
                          int first, double stall_ms) {
    pthread_mutex_lock(&p->mu);
    p->queued = slot;
    p->qslot = s;
    p->qtr = *tr;
    p->qfirst = first;
    p->qstall_ms = stall_ms;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

int ckpt_persist_queued_step(ckpt_persist *p) {
    pthread_mutex_lock(&p->mu);
    int step = p->queued >= 0 ? p->qtr.step : -1;
    pthread_mutex_unlock(&p->mu);
    return step;
}

int ckpt_persist_claim(ckpt_persist *p, int prefer, int fallback) {
    pthread_mutex_lock(&p->mu);
    int s = p->running == prefer ? fallback : prefer, queued = p->queued;
    pthread_mutex_unlock(&p->mu);
    /* replacing a queued snapshot here, on one rank only, set the ranks' persists out of step */
    MS_CHECKF(queued < 0, "checkpoint: stage 1 found slot %d still queued for stage 2", queued);
    return s;
}

double ckpt_persist_wait_queued(ckpt_persist *p) {
    double t0 = ms_now();
    pthread_mutex_lock(&p->mu);
    while (p->queued >= 0)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return ms_now() - t0;
}

ms_status ckpt_persist_wait(ckpt_persist *p, int *last_commit) {
    pthread_mutex_lock(&p->mu);
    while (p->queued >= 0 || p->running >= 0)
        pthread_cond_wait(&p->cv, &p->mu);
    ms_status st = p->last;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", p->last_msg);
    if (last_commit) *last_commit = p->last_commit;
    pthread_mutex_unlock(&p->mu);
    return st == MS_OK ? MS_OK : ms_error(st, "%s", msg);
}

void ckpt_persist_status(ckpt_persist *p, int *last_commit, int *fail_streak, char *msg, size_t n) {
    pthread_mutex_lock(&p->mu);
    *last_commit = p->last_commit;
    *fail_streak = p->fail_streak;
    if (msg && n) snprintf(msg, n, "%s", p->fail_streak ? p->last_msg : "");
    pthread_mutex_unlock(&p->mu);
}

void ckpt_persist_warnings(ckpt_persist *p, int *warned, int *step, char *msg, size_t n) {
    pthread_mutex_lock(&p->mu);
    *warned = p->warned;
    *step = p->warned_step;
    if (msg && n) snprintf(msg, n, "%s", p->warned_msg);
    pthread_mutex_unlock(&p->mu);
}

int ckpt_persist_take_commits(ckpt_persist *p, ckpt_commit_record *out, int max) {
    pthread_mutex_lock(&p->mu);
    int n = p->n_commits < max ? p->n_commits : max;
    if (n > 0) {
        memcpy(out, p->commits, sizeof *out * (size_t)n);
        memmove(p->commits, p->commits + n, sizeof *p->commits * (size_t)(p->n_commits - n));
        p->n_commits -= n;
    }
    pthread_mutex_unlock(&p->mu);
    return n > 0 ? n : 0;
}

void ckpt_persist_stop(ckpt_persist *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}
