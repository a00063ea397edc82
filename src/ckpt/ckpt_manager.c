/* ckpt_manager.c - the trainer's side of checkpointing: when to save,
 * stage 1 into one of two /dev/shm slots, handing the slot to the stage-2
 * thread, choosing what to resume from, and the final checkpoint.
 *
 * Slots: the snapshot goes to the slot that does not hold the newest
 * snapshot, unless stage 2 is writing that one; then it replaces the newest
 * (which is then only queued, never being written).  So stage 1 never
 * overwrites what stage 2 reads, and a crash during stage 1 leaves the
 * newest complete snapshot intact.  When both slots are busy on some rank
 * (one being written, one queued: stage 2 is slower than the checkpoint
 * interval), every rank waits until its queued snapshot has been started
 * and then takes the checkpoint: none is skipped, so a restart redoes at
 * most --ckpt-every steps (training runs at the disk's pace meanwhile).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/ctx.h"
#include "base/fileio.h"
#include "base/finite.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "ckpt/ckpt_internal.h"

struct ckpt_manager {
    ckpt_options o;
    char root[4096], resume[4096], shm_dir[4096]; /* shm_dir: "" for /dev/shm */
    char resume_else[4096]; /* a restart's (o.restart_job): --resume PATH when the job has no
                             * state of its own to resume ("" none: a fresh start) */
    char previous[4300]; /* rank 0, --new-run: where the earlier run's commits went ("" none) */
    int previous_step;   /* and the newest of them (-1 none) */
    int saving;
    int lock_fd;        /* rank 0: ckpt_dir_lock of root, held until destroy; -1 none */
    int hold;           /* ckpt_manager_hold: no checkpoint while skipped steps are not made good */
    int stop_agreed;    /* the last ckpt_manager_step's agreed stop */
    int n_waits;        /* checkpoints that found both slots busy and waited */
    double wait_s;      /* the time they waited, in all (this rank) */
    double wait_warned; /* ms_now() of rank 0's last warning about it */
    void (*on_wait)(void *ctx); /* ckpt_manager_set_wait_hook */
    void *wait_ctx;
    gpt_model *m;
    opt_state *opt;
    par_zero *zero;
    be_backend *be;
    comm_group *dp;    /* the training dp group (NULL alone) */
    comm_group *wg;    /* every rank of the job (NULL alone) */
    int n_save;        /* runs[0, n_save) go to this rank's shard */
    comm_group *group; /* "ckpt": the stage-2 thread's group (NULL alone) */
    int rank, world, dp_size;
    ckpt_tensor_info *tensors;
    int n_tensors;
    ckpt_run *runs;
    int n_runs;
    uint64_t data_elems;
    ckpt_fault fault;
    uint64_t job;
    char optimizer[16];
    ckpt_slot *slots[2];
    int slot_step[2]; /* step of the complete snapshot held, -1 none */
    ckpt_persist *persist;
    int n_saved, last_saved, finished_ok;
    int accepted; /* ckpt_manager_accepted: the run goes on from here */
    double last_save_time, last_stall;
    char chosen[4300]; /* rank 0: the commit resumed from */
};

double ckpt_manager_last_stall(const ckpt_manager *cm) {
    return cm->last_stall;
}

/* Rank 0's status to every rank of g (others: a generic message). */
static ms_status share_status(comm_group *g, int rank, ms_status st, const char *what) {
    if (!g) return st;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ms_errmsg());
    int32_t v = (int32_t)st;
    MS_TRY(comm_broadcast(g, &v, 1, COMM_I32, 0));
    if (v != MS_OK) /* rank 0's reason on every rank: the one whose beat the driver reads first
                     * said only "see its log", and the fault named it */
        MS_TRY(comm_broadcast(g, msg, sizeof msg, COMM_U8, 0));
    msg[sizeof msg - 1] = 0;
    if (rank == 0) return st == MS_OK ? MS_OK : ms_error(st, "%s", msg);
    return v == MS_OK ? MS_OK : ms_error((ms_status)v, "rank 0 could not %s: %s", what, msg);
}

/* A new directory DIR/KIND-STAMP (previous-20261203-154500, or with -2,
 * -3, ... when that exists) into aside, for commits set aside whole. */
static ms_status make_aside(const char *root, const char *kind, char *aside, size_t n) {
    char stamp[32];
    time_t now = time(NULL);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime(&now));
    snprintf(aside, n, "%s/%s-%s", root, kind, stamp);
    for (int k = 2; mkdir(aside, 0755) != 0; k++) {
        if (errno != EEXIST || k > 99) return ms_error(MS_ERR_IO, "%s: %s", aside, strerror(errno));
        snprintf(aside, n, "%s/%s-%s-%d", root, kind, stamp, k);
    }
    return MS_OK;
}

/* Rank 0, a fresh start (no --resume, or a --resume of another directory's
 * checkpoint: foreign), the directory locked: an earlier run's commits
 * (step_* directories, or links to them) are refused, or with --new-run
 * moved, with DIR/latest and DIR/job, into DIR/previous-STAMP/.  The new
 * job id (new_job) comes after. */
static ms_status fresh_start(ckpt_manager *cm, int foreign) {
    DIR *dir = opendir(cm->root);
    if (!dir) return ms_error(MS_ERR_IO, "%s: %s", cm->root, strerror(errno));
    char newest[256] = "", path[4400];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", cm->root, e->d_name);
        /* a link to a directory counts: --resume auto would follow it (ckpt_list_steps) */
        if (strncmp(e->d_name, "step_", 5) || stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
            continue;
        n++;
        if (strcmp(e->d_name, newest) > 0) snprintf(newest, sizeof newest, "%s", e->d_name);
    }
    closedir(dir);
    if (!n) return MS_OK;
    cm->previous_step = ckpt_dir_step(newest);
    if (!cm->o.new_run && foreign) /* its commits would be pruned by this run's, or mixed in */
        return ms_error(MS_ERR_ARG,
                        "--resume %s is not a checkpoint of --ckpt-dir %s, which already holds "
                        "the checkpoints of another run (%d commit(s), the newest %s): pass "
                        "--new-run to move them to %s/previous-<date>/ first, or give another "
                        "--ckpt-dir",
                        cm->resume, cm->root, n, newest, cm->root);
    if (!cm->o.new_run)
        return ms_error(MS_ERR_ARG,
                        "%s already holds the checkpoints of a run (%d commit(s), the newest %s): "
                        "pass --resume auto to continue it, or --new-run to start a new run there "
                        "(its commits are moved to %s/previous-<date>/ first)",
                        cm->root, n, newest, cm->root);
    char aside[4300];
    MS_TRY(make_aside(cm->root, "previous", aside, sizeof aside));
    dir = opendir(cm->root);
    if (!dir) return ms_error(MS_ERR_IO, "%s: %s", cm->root, strerror(errno));
    ms_status st = MS_OK;
    while (st == MS_OK && (e = readdir(dir))) {
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", cm->root, e->d_name);
        int step = !strncmp(e->d_name, "step_", 5) && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
        if (!step && strcmp(e->d_name, "latest") && strcmp(e->d_name, "job")) continue;
        char to[4600];
        snprintf(to, sizeof to, "%s/%s", aside, e->d_name);
        if (rename(path, to) != 0)
            st = ms_error(MS_ERR_IO, "--new-run: move %s to %s: %s", path, aside, strerror(errno));
    }
    closedir(dir);
    if (st == MS_OK) {
        ms_warn("--new-run: the earlier run's %d commit(s) (newest %s) are now in %s", n, newest,
                aside);
        snprintf(cm->previous, sizeof cm->previous, "%s", aside);
    }
    return st;
}

/* Rank 0, a fresh start: a new job id, so that no /dev/shm snapshot of the
 * directory belongs to this run, with or without commits there (an earlier
 * run may have died before its first commit, leaving only snapshots: a
 * later --resume auto must not continue that run instead of this one).  A
 * complete snapshot of the previous job in rank 0's slots is refused as
 * commits are (fresh_start) when no --resume was given, unless --new-run
 * says to disown it: once the new id is written, nothing can continue that
 * run any more.  (Before, a warning told the user to stop and pass --resume
 * auto, which by then found the snapshot "written by another job" and
 * started from scratch.)  With a --resume of another directory (foreign)
 * the start is the user's explicit choice: the snapshot is disowned, with
 * a warning (`megascale launch` restarts such a job with --restart-job,
 * which keeps its own: restarts_job). */
static ms_status new_job(ckpt_manager *cm, int foreign, uint64_t old) {
    for (int k = 0; old && k < 2; k++) {
        char path[4300];
        ckpt_snap_view v;
        void *h;
        struct stat sb;
        if (ckpt_shm_path(path, sizeof path, cm->shm_dir, cm->root, 0, k) != MS_OK ||
            stat(path, &sb) != 0 || ckpt_snap_open(path, &v, &h) != MS_OK)
            continue;
        int mine = v.job == old, step = v.step;
        ckpt_snap_close(&v, h);
        if (mine && step <= cm->previous_step) continue; /* a commit holds it (set aside) */
        if (mine && !cm->o.new_run && !foreign)
            return ms_error(MS_ERR_ARG,
                            "%s: its earlier run left step %d in host memory (%s) and no commit "
                            "of it: pass --resume auto to continue that run, or --new-run to "
                            "start a new run there (the snapshot is then disowned and "
                            "overwritten); nothing was changed",
                            cm->root, step, path);
        if (mine)
            ms_warn("%s: the host-memory snapshot %s holds step %d of an earlier run in %s, "
                    "with no commit of it; this run disowns it (it cannot be continued any "
                    "more) and its checkpoints overwrite it",
                    cm->o.new_run ? "--new-run" : "--resume of another directory", path, step,
                    cm->root);
    }
    return ckpt_job_new(cm->root, &cm->job);
}

static int same_file(const char *a, const char *b) {
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* 1 if path's directory is this --ckpt-dir, whatever the spelling. */
static int in_root(const ckpt_manager *cm, const char *path) {
    char parent[4300];
    snprintf(parent, sizeof parent, "%s", path);
    ms_path_dir(parent);
    return same_file(parent, cm->root);
}

/* 1 if --resume names a checkpoint outside this directory: not auto, not
 * DIR itself, DIR/latest or a DIR/step_N (existing or not), whatever the
 * spelling.  Such a run is another history here, as a fresh start is. */
static int resume_is_foreign(const ckpt_manager *cm) {
    char target[4300];
    const char *res = cm->resume;
    if (!res[0] || !strcmp(res, "auto")) return 0;
    if (ckpt_latest_target(res, target, sizeof target)) res = target;
    return !same_file(res, cm->root) && !in_root(cm, res);
}

/* 1 if --resume names one of this directory's own commits (DIR/step_N
 * with DIR the --ckpt-dir), its step in *step. */
static int resumes_own_commit(const ckpt_manager *cm, int *step) {
    *step = strcmp(cm->resume, "auto") ? ckpt_dir_step(cm->resume) : -1;
    return *step >= 0 && in_root(cm, cm->resume);
}

/* Rank 0, --resume DIR/step_N of this directory while it holds newer
 * commits (a rollback: to redo steps with other options, or past a bad
 * stretch): from here on those are another history, and --resume auto
 * (every restart under the supervisor) would take the newest of them
 * instead of this run's.  They are moved, with DIR/latest, into
 * DIR/abandoned-STAMP/ (nothing is deleted), and a new job id disowns the
 * /dev/shm snapshots of that history.  *rolled 1 if so. */
static ms_status rollback(ckpt_manager *cm, int *rolled) {
    int step, *steps = NULL, n = 0, newer = 0, snaps = 0;
    *rolled = 0;
    if (!resumes_own_commit(cm, &step)) return MS_OK;
    /* the commit first: a mistyped or damaged --resume moved the newer
     * commits away, then failed, and the next --resume auto went back to
     * the newest commit left */
    struct stat sb;
    if (stat(cm->resume, &sb) != 0)
        return ms_error(MS_ERR_NOTFOUND,
                        "--resume %s: %s (no such step directory; nothing was "
                        "moved)",
                        cm->resume, strerror(errno));
    MS_TRY(ckpt_list_steps(cm->root, &steps, &n));
    for (int i = 0; i < n; i++)
        newer += steps[i] > step;
    uint64_t job = 0; /* rank 0's snapshots of a later step: that history's too */
    for (int k = 0; ckpt_job_id(cm->root, 0, &job) == MS_OK && k < 2; k++) {
        char path[4300];
        ckpt_snap_view v;
        void *h;
        if (ckpt_shm_path(path, sizeof path, cm->shm_dir, cm->root, 0, k) != MS_OK ||
            stat(path, &sb) != 0 || ckpt_snap_open(path, &v, &h) != MS_OK)
            continue;
        snaps += v.job == job && v.step > step;
        ckpt_snap_close(&v, h);
    }
    /* with its data's CRCs where something is to be moved or disowned: a
     * damaged commit (a flipped byte) passed the manifest's checks, the
     * newer commits went aside, and only the load found the CRC, leaving
     * --resume auto nothing valid in DIR (the data is read twice then, once
     * here and once by the load: a rollback is a rare, deliberate start) */
    ckpt_reader *r = NULL;
    ms_status vs = ckpt_reader_open(&r, cm->resume, newer > 0 || snaps > 0);
    if (vs == MS_OK) vs = ckpt_check_model(ckpt_reader_manifest(r), cm->m, cm->resume);
    ckpt_reader_close(r);
    if (vs != MS_OK) {
        free(steps);
        return ms_error_wrap(vs, "--resume (nothing was moved)");
    }
    if (snaps)
        ms_warn("--resume %s: the host-memory snapshots of later steps in %s belong to another "
                "history from here on: this run disowns them",
                cm->resume, cm->shm_dir);
    *rolled = snaps > 0;
    ms_status st = MS_OK;
    char aside[4300], path[4400], to[4700];
    if (newer) st = make_aside(cm->root, "abandoned", aside, sizeof aside);
    for (int i = 0; st == MS_OK && newer && i < n; i++) {
        if (steps[i] <= step) continue;
        ckpt_step_path(path, sizeof path, cm->root, steps[i]);
        snprintf(to, sizeof to, "%s/step_%08d", aside, steps[i]);
        if (rename(path, to) != 0)
            st = ms_error(MS_ERR_IO, "--resume %s: move the newer %s to %s: %s", cm->resume, path,
                          aside, strerror(errno));
    }
    if (st == MS_OK && newer) {
        snprintf(path, sizeof path, "%s/latest", cm->root);
        snprintf(to, sizeof to, "%s/latest", aside);
        if (rename(path, to) != 0 && errno != ENOENT)
            st = ms_error(MS_ERR_IO, "--resume %s: move %s to %s: %s", cm->resume, path, aside,
                          strerror(errno));
    }
    if (st == MS_OK && newer) {
        ms_warn("--resume %s: the %d newer commit(s) of %s (another history from here on) are "
                "now in %s",
                cm->resume, newer, cm->root, aside);
        *rolled = 1;
    }
    free(steps);
    return st;
}

/* Rank 0: 1 if this start is a restart of the job o.restart_job names and
 * DIR/job still holds that id (the job's first start wrote it); a warning
 * when it holds another (the start is then made as a first one). */
static int restarts_job(const ckpt_manager *cm) {
    uint64_t cur = 0;
    if (!cm->o.restart_job) return 0;
    int known = ckpt_job_id(cm->root, 0, &cur) == MS_OK;
    if (known && cur == cm->o.restart_job) return 1;
    char said[64];
    if (known)
        snprintf(said, sizeof said, "says %016" PRIx64 " (another run's since)", cur);
    else
        snprintf(said, sizeof said, "is not there, or holds no job id");
    ms_warn("--restart-job %016" PRIx64 ": %s/job %s: started as the job's first start was",
            cm->o.restart_job, cm->root, said);
    return 0;
}

/* A --resume of another directory's checkpoint, checked before the fresh
 * start moves anything aside (--new-run): one that is not there, or not a
 * checkpoint, is an error that leaves the directory as it was.  (Before, a
 * mistyped path with --new-run set the earlier run's commits aside, then
 * the start failed, and the next --resume auto started from scratch;
 * without --new-run the error said the directory held another run's
 * checkpoints, and its advice, --new-run, led there.) */
static ms_status check_foreign_target(const ckpt_manager *cm) {
    char target[4300];
    const char *res = cm->resume;
    struct stat sb;
    if (ckpt_latest_target(res, target, sizeof target)) res = target;
    if (stat(res, &sb) != 0)
        return ms_error(MS_ERR_NOTFOUND, "--resume %s: %s (nothing was moved or changed)", res,
                        strerror(errno));
    MS_TRY(ckpt_check_path("--resume ", res));
    if (ckpt_is_step_dir(res)) return MS_OK;
    int *steps = NULL, n = 0;
    MS_TRY(ckpt_list_steps(res, &steps, &n));
    free(steps);
    if (n == 0)
        return ms_error(MS_ERR_NOTFOUND,
                        "--resume %s: neither a checkpoint (no %s) nor a directory of checkpoints "
                        "(no step_* directory); nothing was moved or changed",
                        res, CKPT_MANIFEST);
    return MS_OK;
}

static ms_status setup_dir(ckpt_manager *cm) {
    ms_status st = MS_OK;
    int32_t again = 0; /* a restart of the job (restarts_job): rank 0's, on every rank */
    if (cm->rank == 0 && (again = restarts_job(cm)) != 0) {
        st = ms_mkdirs(cm->root);
        if (st == MS_OK) st = ckpt_dir_lock(cm->root, "--ckpt-dir", &cm->lock_fd);
        cm->job = cm->o.restart_job;
        ms_info("resume: a restart of job %016" PRIx64 ": its own newest state in %s, else %s",
                cm->job, cm->root,
                !cm->resume[0] || !strcmp(cm->resume, "auto") ? "a fresh start" : cm->resume);
    } else if (cm->rank == 0) {
        int rolled = 0, foreign = resume_is_foreign(cm);
        char mf[4400];
        struct stat sb;
        snprintf(mf, sizeof mf, "%s/%s", cm->root, CKPT_MANIFEST);
        if (stat(mf, &sb) == 0) /* its nested commits would be pruned with it */
            st = ms_error(MS_ERR_ARG,
                          "--ckpt-dir %s is a commit (it holds %s), not a checkpoint directory: "
                          "give the directory that holds it (--resume takes a commit)",
                          cm->root, CKPT_MANIFEST);
        if (st == MS_OK) st = ms_mkdirs(cm->root);
        if (st == MS_OK)
            st = ckpt_dir_lock(cm->root, "--ckpt-dir", &cm->lock_fd); /* before writing anything */
        /* the earlier run's id, before --new-run moves DIR/job aside: its snapshot newer
         * than its commits (the only copy of that step) is still named as disowned */
        uint64_t old = 0; /* (not read after an error: its message is the one shared) */
        if (st != MS_OK || ckpt_job_id(cm->root, 0, &old) != MS_OK) old = 0;
        if (st == MS_OK && foreign) st = check_foreign_target(cm);
        if (st == MS_OK && (!cm->resume[0] || foreign)) st = fresh_start(cm, foreign);
        if (st == MS_OK && cm->resume[0] && !foreign) st = rollback(cm, &rolled);
        if (st == MS_OK)
            st = !cm->resume[0] || foreign ? new_job(cm, foreign, old)
                 : rolled                  ? ckpt_job_new(cm->root, &cm->job)
                                           : ckpt_job_id(cm->root, 1, &cm->job);
    }
    MS_TRY(share_status(cm->group, cm->rank, st, "create the checkpoint directory"));
    if (cm->group) MS_TRY(comm_broadcast(cm->group, &cm->job, 1, COMM_I64, 0));
    if (cm->group) MS_TRY(comm_broadcast(cm->group, &again, 1, COMM_I32, 0));
    if (again) { /* the job's own state first (as auto), then what its first start took */
        snprintf(cm->resume_else, sizeof cm->resume_else, "%s",
                 strcmp(cm->resume, "auto") ? cm->resume : "");
        snprintf(cm->resume, sizeof cm->resume, "auto");
    }
    ckpt_persist_config pc = {cm->root,
                              cm->o.keep,
                              cm->rank,
                              cm->world,
                              cm->dp_size,
                              cm->group,
                              gpt_get_config(cm->m),
                              cm->optimizer,
                              cm->tensors,
                              cm->n_tensors,
                              cm->runs,
                              cm->n_save,
                              &cm->fault,
                              gpt_tp_size(cm->m),
                              gpt_get_stage(cm->m) ? gpt_get_stage(cm->m)->pp : 1,
                              gpt_get_stage(cm->m) ? gpt_get_stage(cm->m)->vpp : 1};
    return ckpt_persist_start(&cm->persist, &pc);
}

ms_status ckpt_manager_create(ckpt_manager **out, const ckpt_options *o, gpt_model *m,
                              opt_state *opt, par_zero *zero) {
    return ckpt_manager_create_world(out, o, m, opt, zero,
                                     zero ? comm_group_world(par_zero_group(zero)) : NULL);
}

ms_status ckpt_manager_create_world(ckpt_manager **out, const ckpt_options *o, gpt_model *m,
                                    opt_state *opt, par_zero *zero, comm_world *w) {
    *out = NULL;
    int saving = o->dir && *o->dir;
    const char *res = o->resume ? o->resume : "";
    if (saving && o->keep < 1) return ms_error(MS_ERR_ARG, "--ckpt-keep must be >= 1");
    if (o->every_steps < 0 || o->every_min < 0)
        return ms_error(MS_ERR_ARG, "--ckpt-every / --ckpt-every-min must be >= 0");
    if (!strcmp(res, "auto") && !saving)
        return ms_error(MS_ERR_ARG, "--resume auto needs --ckpt-dir (where to look)");
    if (!saving && (o->every_steps > 0 || o->every_min > 0))
        return ms_error(MS_ERR_ARG, "--ckpt-every / --ckpt-every-min need --ckpt-dir");
    ckpt_manager *cm = calloc(1, sizeof *cm);
    if (!cm) return ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    cm->o = *o;
    cm->saving = saving;
    cm->lock_fd = -1;
    snprintf(cm->root, sizeof cm->root, "%s", saving ? o->dir : "");
    /* DIR/latest is the commit it names, from here on: a rollback to it was not seen as one
     * (the newer commits were replaced one by one, two histories mixed in DIR) */
    char target[4300], real[PATH_MAX];
    if (strcmp(res, "auto") && ckpt_latest_target(res, target, sizeof target)) res = target;
    /* ... and a --resume that is there, its real path: DIR/step_N/. or a link to one of DIR's
     * commits was not seen as DIR's own (a rollback to it was refused as another run's, and
     * the --new-run that the refusal advised moved the commit itself away) */
    if (res[0] && strcmp(res, "auto") && realpath(res, real)) res = real;
    snprintf(cm->resume, sizeof cm->resume, "%s", res);
    snprintf(cm->shm_dir, sizeof cm->shm_dir, "%s", o->shm_dir ? o->shm_dir : "");
    cm->m = m;
    cm->opt = opt;
    cm->zero = zero;
    cm->be = gpt_backend(m);
    cm->world = cm->dp_size = 1;
    cm->last_saved = cm->previous_step = -1;
    cm->slot_step[0] = cm->slot_step[1] = -1;
    cm->last_save_time = ms_now();
    snprintf(cm->optimizer, sizeof cm->optimizer, "%s", opt_kind_name(opt_get_config(opt)->kind));
    ms_status st = ckpt_fault_parse(o->fault, &cm->fault);
    if (zero) {
        cm->dp = par_zero_group(zero);
        cm->dp_size = comm_group_size(cm->dp);
    }
    if (st == MS_OK && w && comm_world_size(w) > 1) {
        cm->wg = comm_world_group(w);
        cm->rank = comm_world_rank(w);
        cm->world = comm_world_size(w);
        if (saving)
            st = comm_group_create_split(comm_world_group(w), 0, cm->rank, "ckpt", &cm->group);
    }
    if (st == MS_OK) st = ckpt_tensors_of(m, &cm->tensors, &cm->n_tensors);
    if (st == MS_OK) st = ckpt_runs_of_opt_save(m, opt, &cm->runs, &cm->n_runs, &cm->n_save);
    cm->data_elems = 3 * ckpt_runs_elems(cm->runs, cm->n_runs);
    if (st == MS_OK && saving) st = ckpt_shm_dir_check(cm->shm_dir);
    if (st == MS_OK && saving) st = setup_dir(cm);
    int n_orphans = 0;
    uint64_t orphan_bytes = 0;
    if (st == MS_OK && saving && cm->rank == 0 &&
        ckpt_shm_orphans(cm->shm_dir, 0, 0, &n_orphans, &orphan_bytes) == MS_OK && n_orphans)
        ms_warn("checkpoint: %d snapshot(s) in %s (%.1f MB) belong to checkpoint directories that "
                "are gone; `megascale ckpt shm-orphans --remove 1` removes them",
                n_orphans, ckpt_shm_dir(cm->shm_dir), (double)orphan_bytes / 1e6);
    if (st != MS_OK) {
        ckpt_manager_destroy(cm);
        return st;
    }
    *out = cm;
    return MS_OK;
}

/* Open both /dev/shm slots (keeping complete snapshots of this job). */
static ms_status ensure_slots(ckpt_manager *cm) {
    for (int k = 0; k < 2; k++) {
        if (cm->slots[k]) continue;
        char path[4300];
        MS_TRY(ckpt_shm_path(path, sizeof path, cm->shm_dir, cm->root, cm->rank, k));
        MS_TRY(ckpt_slot_open(&cm->slots[k], path, cm->root, cm->data_elems,
                              8192 + 96 * (size_t)cm->n_runs));
        cm->slot_step[k] = ckpt_slot_step(cm->slots[k], cm->job);
    }
    return MS_OK;
}

ms_status ckpt_manager_save(ckpt_manager *cm, const ckpt_train_state *st) {
    if (!cm->saving) return MS_OK;
    MS_TRY(ensure_slots(cm));
    /* with a fault armed (tests) the one before has committed: its point comes in order */
    if (cm->fault.serial) (void)ckpt_persist_wait(cm->persist, NULL);
    int newest = cm->slot_step[1] > cm->slot_step[0] ? 1 : 0;
    if (cm->slot_step[newest] < 0) newest = 1; /* none: write slot 0 */
    int s = ckpt_persist_claim(cm->persist, 1 - newest, newest);
    cm->slot_step[s] = -1;
    char *meta = ckpt_snap_meta(cm->job, st->step, cm->rank, cm->world, cm->dp_size,
                                gpt_get_config(cm->m), cm->optimizer, st, cm->runs, cm->n_runs);
    if (!meta) return ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    ckpt_snap_src src = {cm->be,     gpt_params(cm->m), cm->runs,
                         cm->n_runs, &cm->fault,        cm->n_saved == 0};
    double t0 = ms_now();
    ms_status rc = ckpt_slot_write(cm->slots[s], cm->job, st->step, meta, &src);
    cm->last_stall = ms_now() - t0;
    free(meta);
    if (rc != MS_OK) return rc;
    cm->slot_step[s] = st->step;
    ckpt_persist_enqueue(cm->persist, s, cm->slots[s], st, cm->n_saved == 0, cm->last_stall * 1e3);
    cm->n_saved++;
    cm->last_saved = st->step;
    cm->last_save_time = ms_now();
    ms_info("checkpoint: step %d: stage 1 copied %.1f MB to %s in %.1f ms; persisting in the "
            "background",
            st->step, (double)cm->data_elems * 4 / 1e6, ckpt_slot_path(cm->slots[s]),
            cm->last_stall * 1e3);
    return MS_OK;
}

/* Before the training thread waits for stage 2. */
static void waiting(ckpt_manager *cm) {
    if (cm->on_wait) cm->on_wait(cm->wait_ctx);
}

/* Both slots are busy on some rank: the snapshot of step `queued` still waits for stage 2
 * there.  Wait until this rank's queue has been started (the persist before it ended; at once
 * where it has been), so the slot that persist read is free.  Skipping the checkpoint instead
 * left the newest snapshot up to twice --ckpt-every steps (and more) behind, and replacing the
 * queued snapshot on one rank only sets the ranks' persists out of step (one rank's thread may
 * have started it already).  Rank 0 warns the first time, then at most once a minute. */
static void wait_busy(ckpt_manager *cm, int step, int queued) {
    waiting(cm);
    double s = ckpt_persist_wait_queued(cm->persist);
    cm->n_waits++;
    cm->wait_s += s;
    if (cm->rank != 0 || (cm->n_waits > 1 && ms_now() - cm->wait_warned < 60)) return;
    cm->wait_warned = ms_now();
    ms_warn("checkpoint: step %d: both snapshot slots were busy (step %d still waited for "
            "stage 2), so training waited %.2f s for the persist before it (persisting is slower "
            "than the checkpoint interval; %d checkpoint(s) waited so far, %.1f s in all)",
            step, queued, s, cm->n_waits, cm->wait_s);
}

ms_status ckpt_manager_step(ckpt_manager *cm, const ckpt_train_state *st) {
    if (ckpt_fault_hits(&cm->fault, "signal:term", st->step, 0)) {
        ms_warn("injected fault signal:term after step %d", st->step);
        raise(SIGTERM);
    }
    /* [2]: the step of a snapshot still queued for stage 2 on some rank (-1: none): then
     * every rank waits before its stage 1 (wait_busy), all alike */
    int32_t flags[3] = {ms_ctx_get()->stop != 0,
                        cm->saving && cm->rank == 0 && cm->o.every_min > 0 &&
                            ms_now() - cm->last_save_time >= cm->o.every_min * 60,
                        cm->persist ? ckpt_persist_queued_step(cm->persist) : -1};
    if (cm->wg) MS_TRY(comm_allreduce(cm->wg, flags, flags, 3, COMM_I32, COMM_MAX));
    if (flags[0] && !ms_ctx_get()->stop) ms_ctx_mut()->stop = 1; /* another rank was signalled */
    cm->stop_agreed = flags[0] != 0;
    if (!cm->saving || flags[0]) return MS_OK; /* stopping: the final checkpoint follows */
    if (!((cm->o.every_steps > 0 && st->step % cm->o.every_steps == 0) || flags[1])) return MS_OK;
    if (!cm->hold) {
        if (flags[2] >= 0 && cm->persist) wait_busy(cm, st->step, flags[2]);
        return ckpt_manager_save(cm, st);
    }
    if (cm->rank == 0)
        ms_warn("checkpoint: step %d: none taken, in a streak of skipped (non-finite) steps; the "
                "schedule resumes after a clean step",
                st->step);
    return MS_OK;
}

ms_status ckpt_manager_wait(ckpt_manager *cm) {
    return cm->persist ? ckpt_persist_wait(cm->persist, NULL) : MS_OK;
}

void ckpt_manager_commit_status(ckpt_manager *cm, int *last_commit, int *fail_streak, char *msg,
                                size_t n) {
    *last_commit = -1, *fail_streak = 0;
    if (msg && n) msg[0] = 0;
    if (cm && cm->persist) ckpt_persist_status(cm->persist, last_commit, fail_streak, msg, n);
}

void ckpt_manager_commit_warnings(ckpt_manager *cm, int *warned, int *step, char *msg, size_t n) {
    *warned = 0, *step = -1;
    if (msg && n) msg[0] = 0;
    if (cm && cm->persist) ckpt_persist_warnings(cm->persist, warned, step, msg, n);
}

int ckpt_manager_take_commits(ckpt_manager *cm, ckpt_commit_record *out, int max) {
    return cm && cm->persist && max > 0 ? ckpt_persist_take_commits(cm->persist, out, max) : 0;
}

int ckpt_manager_stop_agreed(const ckpt_manager *cm) {
    return cm->stop_agreed;
}

void ckpt_manager_hold(ckpt_manager *cm, int hold) {
    cm->hold = hold;
}

void ckpt_manager_set_wait_hook(ckpt_manager *cm, void (*fn)(void *ctx), void *ctx) {
    cm->on_wait = fn;
    cm->wait_ctx = ctx;
}

int ckpt_manager_waits(const ckpt_manager *cm) {
    return cm->n_waits;
}

void ckpt_manager_mark_stopped(ckpt_manager *cm, int step) {
    char path[4200], text[32];
    snprintf(path, sizeof path, "%s/%s", cm->root, CKPT_STOPPED);
    int len = snprintf(text, sizeof text, "step %d\n", step);
    if (ms_file_write_atomic(path, text, (size_t)len) != MS_OK)
        ms_warn("checkpoint: could not say the clean stop in %s: %s", path, ms_errmsg());
}

void ckpt_manager_accepted(ckpt_manager *cm) {
    if (!cm) return;
    cm->accepted = 1;
    if (cm->rank || !cm->saving) return;
    /* an earlier clean stop's word: this run is under way now */
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", cm->root, CKPT_STOPPED);
    if (unlink(path) != 0 && errno != ENOENT)
        ms_warn("checkpoint: could not remove %s: %s", path, strerror(errno));
}

const char *ckpt_manager_previous(const ckpt_manager *cm) {
    return cm ? cm->previous : "";
}

void ckpt_manager_set_node(ckpt_manager *cm, const char *node) {
    ms_fault_plan_set_node(&cm->fault.plan, node);
}

ms_status ckpt_manager_finish(ckpt_manager *cm, const ckpt_train_state *st) {
    if (!cm->saving) return MS_OK;
    waiting(cm); /* for the persists queued, and the final one's */
    if (cm->hold && cm->last_saved >= 0)
        ms_warn("no final checkpoint: step %d ends a streak of skipped (non-finite) steps; the "
                "newest checkpoint is step %d",
                st->step, cm->last_saved);
    else if (cm->hold)
        ms_warn("no final checkpoint: step %d ends a streak of skipped (non-finite) steps",
                st->step);
    else if (st->step > 0 && st->step != cm->last_saved) {
        /* wait for the queue (a collective-free way to keep every rank's persists in the
         * same order); its own status is reported below */
        if (cm->persist) (void)ckpt_persist_wait(cm->persist, NULL);
        MS_TRY(ckpt_manager_save(cm, st));
    }
    ms_status rc = ckpt_persist_wait(cm->persist, NULL);
    if (rc != MS_OK)
        return ms_error_wrap(rc, "the last checkpoint (step %d) was not committed", st->step);
    cm->finished_ok = 1;
    return MS_OK;
}

void ckpt_manager_destroy(ckpt_manager *cm) {
    if (!cm) return;
    ckpt_persist_stop(cm->persist);
    for (int k = 0; k < 2; k++) /* the commit holds it all after a clean finish; a start
                                 * refused after the slots were made leaves none it never filled */
        ckpt_slot_close(cm->slots[k], cm->finished_ok || (!cm->accepted && cm->slots[k] &&
                                                          ckpt_slot_is_empty(cm->slots[k])));
    if (cm->finished_ok && cm->rank == 0) ckpt_shm_remove_beyond(cm->root, cm->shm_dir, cm->world);
    ckpt_dir_unlock(cm->lock_fd);  /* after the last commit */
    comm_group_destroy(cm->group); /* wg and dp belong to the caller */
    free(cm->tensors);
    free(cm->runs);
    free(cm);
}

/* ---- resume -------------------------------------------------------------------- */

static int same_model(const gpt_config *a, const gpt_config *b) {
    return a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd &&
           a->vocab == b->vocab && a->seq_max == b->seq_max && a->block == b->block &&
           a->attn_window == b->attn_window;
}

/* 1 if a weight of the snapshot is NaN or Inf (the update before it made them so; the
 * persist refused its commit): a resume from it would stop at its first step again. */
static int snap_nonfinite(const ckpt_snap_view *v) {
    for (int i = 0; i < v->n_runs; i++) {
        const ckpt_run *r = &v->runs[i];
        if (r->data_off + (r->end - r->begin) > v->data_elems) return 0; /* ckpt_snap_matches's */
        if (ms_first_nonfinite(v->data + r->data_off, (size_t)(r->end - r->begin)) >= 0) return 1;
    }
    return 0;
}

/* Steps of this rank's usable /dev/shm snapshots (same job, layout, runs, finite weights;
 * the data's CRC is checked only for the one chosen: shm_verify). */
static void shm_local(ckpt_manager *cm, int64_t steps[2]) {
    static const char LAYOUT[] = "was written by another layout";
    char unused[4300] = ""; /* the newest snapshot not usable here, said once by rank 0 */
    const char *why = NULL;
    int unused_step = -1;
    for (int k = 0; k < 2; k++) {
        char path[4300];
        ckpt_snap_view v;
        void *h;
        steps[k] = -1;
        if (ckpt_shm_path(path, sizeof path, cm->shm_dir, cm->root, cm->rank, k) != MS_OK) continue;
        struct stat sb;
        if (stat(path, &sb) != 0) continue;
        ms_status st = ckpt_snap_open(path, &v, &h);
        if (st == MS_ERR_NOTFOUND) continue; /* a slot never filled: a normal end, no warning */
        if (st != MS_OK) {
            ms_warn("resume: ignoring a snapshot: %s", ms_errmsg()); /* the message names it */
            continue;
        }
        const char *other = v.job != cm->job ? "was written by another job"
                            : !same_model(&v.model, gpt_get_config(cm->m))
                                ? "was written by another model"
                            : v.rank != cm->rank || v.world != cm->world ||
                                    !ckpt_snap_matches(&v, cm->runs, cm->n_runs)
                                ? LAYOUT
                            : !snap_nonfinite(&v) ? NULL
                            /* damage in host memory reads alike: said as such (it was
                             * reported as weights an update made non-finite) */
                            : ckpt_snap_verify(path, &v) != MS_OK
                                ? "fails its data CRC (damaged in host memory: its weights "
                                  "read NaN or Inf)"
                                : "holds weights that are NaN or Inf";
        if (!other) {
            steps[k] = v.step;
        } else if (v.step > unused_step) {
            unused_step = v.step;
            why = other;
            snprintf(unused, sizeof unused, "%s", path);
        }
        ckpt_snap_close(&v, h);
    }
    if (why && cm->rank == 0) /* each rank's slots alike */
        ms_warn("resume: the host-memory snapshot %s (step %d) %s; it is not used%s", unused,
                unused_step, why,
                why != LAYOUT ? ""
                              : " (a snapshot resumes only the layout that wrote it: the newest "
                                "commit is loaded, and the steps after it are trained again)");
}

/* The newest snapshot step every rank of the job holds, -1 none. */
static ms_status shm_common(ckpt_manager *cm, const int64_t mine[2], int64_t *common) {
    int n = cm->wg ? cm->world : 1;
    int64_t *all = malloc(sizeof(int64_t) * 2 * (size_t)n);
    if (!all) return ms_error(MS_ERR_NOMEM, "checkpoint: out of memory");
    ms_status st = MS_OK;
    if (cm->wg)
        st = comm_allgather(cm->wg, mine, all, 2, COMM_I64);
    else
        memcpy(all, mine, sizeof(int64_t) * 2);
    *common = -1;
    for (int c = 0; st == MS_OK && c < 2; c++) {
        int64_t s = all[c]; /* rank 0's candidates */
        int everywhere = s >= 0;
        for (int r = 1; everywhere && r < n; r++)
            everywhere = all[2 * r] == s || all[2 * r + 1] == s;
        if (everywhere && s > *common) *common = s;
    }
    free(all);
    return st;
}

enum { RES_NONE = 0, RES_SHM = 1, RES_DISK = 2 };

/* 1 if the commit at path, or a file in it, cannot be opened for want of permission (EACCES,
 * EPERM): it is not damaged, and skipping it would have the run commit that step again over
 * it (an intact commit, chmod'ed, was deleted so); the first such name and error into why. */
static int commit_unreadable(const char *path, char *why, size_t n) {
    DIR *d = opendir(path);
    if (!d) {
        int e = errno;
        snprintf(why, n, "%s: %s", path, strerror(e));
        return e == EACCES || e == EPERM;
    }
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) {
            close(fd);
        } else if (errno == EACCES || errno == EPERM) {
            snprintf(why, n, "%s/%s: %s", path, e->d_name, strerror(errno));
            found = 1;
        }
    }
    closedir(d);
    return found;
}

/* Rank 0: what to resume from.  *reader is the validated commit. */
static ms_status choose(ckpt_manager *cm, int64_t shm_step, int *kind, int *step,
                        ckpt_reader **reader) {
    *kind = RES_NONE;
    *step = -1;
    char path[4300];
    struct stat sb;
    int is_auto = !strcmp(cm->resume, "auto");
    char target[4300];
    const char *res = cm->resume; /* DIR/latest: the commit it names */
    if (!is_auto && ckpt_latest_target(res, target, sizeof target)) res = target;
    if (!is_auto && stat(res, &sb) != 0)
        return ms_error(MS_ERR_NOTFOUND, "--resume %s: %s%s", res, strerror(errno),
                        ckpt_dir_step(res) >= 0 ? " (no such step directory)" : "");
    if (!is_auto) MS_TRY(ckpt_check_path("--resume ", res));
    /* a commit (it holds a manifest, or is named step_N: then a missing
     * manifest is reported as such, not looked for as a root's commits) */
    if (!is_auto && ckpt_is_step_dir(res)) {
        MS_TRY(ckpt_reader_open(reader, res, 1));
        snprintf(cm->chosen, sizeof cm->chosen, "%s", res);
        *kind = RES_DISK;
        *step = ckpt_reader_manifest(*reader)->step;
        return ckpt_check_model(ckpt_reader_manifest(*reader), cm->m, res);
    }
    const char *root = is_auto ? cm->root : res;
    int *steps = NULL, n = 0, bad = 0;
    MS_TRY(ckpt_list_steps(root, &steps, &n));
    for (int i = 0; i < n && *kind == RES_NONE; i++) {
        if (shm_step > steps[i]) break; /* the snapshot is newer than what is left */
        ckpt_step_path(path, sizeof path, root, steps[i]);
        char why[4600];
        if (ckpt_reader_open(reader, path, 1) == MS_OK) {
            *kind = RES_DISK;
            *step = steps[i];
        } else if (commit_unreadable(path, why, sizeof why)) {
            free(steps);
            return ms_error(MS_ERR_IO, /* (the caller says "resume: ") */
                            "%s cannot be read (%s): a permission problem, not damage; "
                            "fix it, or move the commit away, and start again (nothing was "
                            "changed)",
                            path, why);
        } else {
            ms_warn("resume: %s is not usable: %s; trying the previous checkpoint", path,
                    ms_errmsg());
            bad++;
        }
    }
    free(steps);
    if (*kind == RES_NONE && shm_step >= 0) {
        *kind = RES_SHM;
        *step = (int)shm_step;
    }
    if (*kind == RES_NONE && is_auto && cm->resume_else[0]) {
        /* a restart with no state of its own yet: what its first start resumed from */
        char own[sizeof cm->resume];
        snprintf(own, sizeof own, "%s", cm->resume);
        snprintf(cm->resume, sizeof cm->resume, "%s", cm->resume_else);
        ms_status st = choose(cm, -1, kind, step, reader);
        snprintf(cm->resume, sizeof cm->resume, "%s", own);
        if (st != MS_OK || *kind != RES_NONE) return st;
    }
    if (*kind == RES_DISK) {
        ckpt_step_path(cm->chosen, sizeof cm->chosen, root, *step);
        return ckpt_check_model(ckpt_reader_manifest(*reader), cm->m, cm->chosen);
    }
    if (*kind == RES_NONE && bad)
        return ms_error(MS_ERR_NOTFOUND, "%s: no valid checkpoint (%d damaged or incomplete)", root,
                        bad);
    if (*kind == RES_NONE && !is_auto)
        return ms_error(MS_ERR_NOTFOUND,
                        "--resume %s: neither a checkpoint (no %s) nor a directory of checkpoints "
                        "(no step_* directory)",
                        root, CKPT_MANIFEST);
    return MS_OK;
}

/* Open this rank's snapshot of `step` of this job (path: its slot file,
 * 4300 bytes); MS_ERR_NOTFOUND when neither slot holds it. */
static ms_status shm_open_step(ckpt_manager *cm, int step, char *path, ckpt_snap_view *v,
                               void **h) {
    for (int k = 0; k < 2; k++) {
        MS_TRY(ckpt_shm_path(path, 4300, cm->shm_dir, cm->root, cm->rank, k));
        if (ckpt_snap_open(path, v, h) != MS_OK) continue;
        if (v->step == step && v->job == cm->job) return MS_OK;
        ckpt_snap_close(v, *h);
    }
    return ms_error(MS_ERR_NOTFOUND, "rank %d: the snapshot of step %d vanished", cm->rank, step);
}

/* This rank's snapshot of `step` against its data CRC (a warning naming
 * the slot file if it fails). */
static ms_status shm_verify(ckpt_manager *cm, int step) {
    char path[4300];
    ckpt_snap_view v;
    void *h;
    ms_status st = shm_open_step(cm, step, path, &v, &h);
    if (st == MS_OK) {
        st = ckpt_snap_verify(path, &v);
        ckpt_snap_close(&v, h);
    }
    if (st != MS_OK) ms_warn("resume: not resuming from %s", ms_errmsg());
    return st;
}

/* What to resume from, on every rank: rank 0 chooses (dec: kind, step;
 * *reader: the validated commit), the others learn it.  A /dev/shm
 * snapshot chosen is first checked against its data CRC on every rank;
 * when one fails, that step is dropped from mine (every rank's candidate
 * steps) and the choice is made again: the other snapshot or a commit.
 * So the data is read for its CRC only when a snapshot is to be loaded. */
static ms_status decide(ckpt_manager *cm, int64_t mine[2], int32_t dec[2], ckpt_reader **reader) {
    for (int round = 0;; round++) {
        dec[0] = RES_NONE, dec[1] = -1; /* (an early return below decides nothing) */
        MS_CHECK(round < 3); /* each round drops one of the two candidates */
        int64_t shm_step = -1;
        MS_TRY(shm_common(cm, mine, &shm_step));
        int kind = RES_NONE, step = -1;
        ms_status st = cm->rank == 0 ? choose(cm, shm_step, &kind, &step, reader) : MS_OK;
        st = share_status(cm->wg, cm->rank, st, "choose a checkpoint to resume from");
        /* no decision when the choice failed, on every rank alike: rank 0's kind (the commit
         * it opened, of another model) took it into the outcome's all-reduce below its
         * caller, which the other ranks skipped: it waited there until they had gone */
        dec[0] = st == MS_OK ? kind : RES_NONE;
        dec[1] = st == MS_OK ? step : -1;
        if (st == MS_OK && cm->wg) st = comm_broadcast(cm->wg, dec, 2, COMM_I32, 0);
        if (st != MS_OK || dec[0] != RES_SHM) return st;
        int32_t bad = shm_verify(cm, dec[1]) != MS_OK, any = bad;
        if (cm->wg) MS_TRY(comm_allreduce(cm->wg, &bad, &any, 1, COMM_I32, COMM_MAX));
        if (!any) return MS_OK;
        for (int k = 0; k < 2; k++)
            if (mine[k] == dec[1]) mine[k] = -1;
    }
}

/* Compare the saved state with this run's and say what differs. */
static void compare_state(const ckpt_train_state *saved, const ckpt_train_state *now) {
    if (saved->seed != now->seed)
        ms_warn("resume: the checkpoint was trained with --seed %" PRIu64 ", this run has %" PRIu64
                " (the data order follows this run's)",
                saved->seed, now->seed);
    if (memcmp(&saved->sched, &now->sched, sizeof saved->sched))
        ms_warn("resume: the LR schedule differs from the checkpoint's (lr %g/%g, warmup %d/%d, "
                "steps %d/%d); this run's applies",
                saved->sched.lr, now->sched.lr, saved->sched.warmup, now->sched.warmup,
                saved->sched.total, now->sched.total);
    if (saved->batch != now->batch || saved->seq != now->seq)
        ms_warn("resume: batch %d x seq %d differs from the checkpoint's %d x %d%s", now->batch,
                now->seq, saved->batch, saved->seq,
                saved->seq != now->seq && !strcmp(now->data_order, "shuffle")
                    ? " (the shuffle's data position counts windows of seq+1 tokens: it now "
                      "names another place in the epoch)"
                    : "");
    if (saved->optimizer[0] && now->optimizer[0] && strcmp(saved->optimizer, now->optimizer))
        ms_warn("resume: --optimizer %s differs from the checkpoint's %s; its moments are taken "
                "as they are",
                now->optimizer, saved->optimizer);
    const struct {
        const char *opt;
        double was, is;
    } hp[] = {{"--beta1", saved->beta1, now->beta1},
              {"--beta2", saved->beta2, now->beta2},
              {"--eps", saved->eps, now->eps},
              {"--weight-decay", saved->weight_decay, now->weight_decay},
              {"--grad-clip", saved->grad_clip, now->grad_clip}};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++)
        if (isfinite(hp[i].was) && isfinite(hp[i].is) && hp[i].was != hp[i].is)
            ms_warn("resume: %s %g differs from the checkpoint's %g; this run's applies", hp[i].opt,
                    hp[i].is, hp[i].was);
    if (saved->train_data[0] && strcmp(saved->train_data, now->train_data))
        ms_warn("resume: --train-data '%s' differs from the checkpoint's '%s': the data cursor "
                "(epoch, shard, position) continues in the new data",
                now->train_data, saved->train_data);
    else if (saved->data_shards && now->data_shards &&
             (saved->data_shards != now->data_shards || saved->data_tokens != now->data_tokens))
        ms_warn("resume: the data set under --train-data '%s' changed since the checkpoint "
                "(%" PRIu64 " shard(s), %" PRIu64 " tokens then; %" PRIu64 " and %" PRIu64
                " now): the data cursor (epoch, shard, position) continues in other data, so "
                "some of it may be seen twice and some not at all",
                now->train_data, saved->data_shards, saved->data_tokens, now->data_shards,
                now->data_tokens);
    if (saved->train_data[0] && strcmp(saved->val_data, now->val_data))
        ms_warn("resume: --val-data '%s' differs from the checkpoint's '%s': validation losses "
                "are not comparable across the resume",
                now->val_data, saved->val_data);
    else if (saved->val_batches && now->val_batches && saved->val_batches != now->val_batches)
        ms_warn("resume: --val-batches %d differs from the checkpoint's %d: the validation set "
                "is another, so validation losses are not comparable across the resume",
                now->val_batches, saved->val_batches);
}

/* Each rank loads its own snapshot of `step`. */
static ms_status load_shm(ckpt_manager *cm, int step, ckpt_train_state *out, char *from,
                          size_t nfrom) {
    char path[4300];
    ckpt_snap_view v;
    void *h;
    MS_TRY(shm_open_step(cm, step, path, &v, &h));
    ms_status st = ckpt_load_snapshot(&v, cm->m, cm->runs, cm->n_runs);
    *out = v.trainer;
    snprintf(from, nfrom, "%s (host-memory snapshot)", path);
    ckpt_snap_close(&v, h);
    return st;
}

/* After resuming from a snapshot that no commit holds: persist it now. */
static ms_status persist_resumed(ckpt_manager *cm, int step, const ckpt_train_state *tr) {
    MS_TRY(ensure_slots(cm));
    for (int k = 0; k < 2; k++)
        if (cm->slot_step[k] == step) {
            ckpt_persist_enqueue(cm->persist, k, cm->slots[k], tr, 0, NAN); /* stage 1: before */
            return MS_OK;
        }
    return MS_OK;
}

ms_status ckpt_manager_resume(ckpt_manager *cm, const ckpt_train_state *now, ckpt_train_state *out,
                              int *found) {
    *found = 0;
    if (!cm->resume[0]) return cm->saving ? ensure_slots(cm) : MS_OK;
    double t0 = ms_now();
    int64_t mine[2] = {-1, -1};
    if (cm->saving && !strcmp(cm->resume, "auto")) shm_local(cm, mine);
    int32_t dec[2] = {RES_NONE, -1};
    ckpt_reader *reader = NULL;
    ms_status st = decide(cm, mine, dec, &reader);
    char from[4400] = "";
    ckpt_train_state saved;
    memset(&saved, 0, sizeof saved);
    if (st == MS_OK && dec[0] == RES_DISK) {
        /* dp rank 0 of each (tp, pp) position reads the commit rank 0 chose
         * and broadcasts each logical tensor it needs over its dp group */
        if (cm->wg) st = comm_broadcast(cm->wg, cm->chosen, sizeof cm->chosen, COMM_U8, 0);
        int dp_rank = cm->dp ? comm_group_rank(cm->dp) : 0;
        if (st == MS_OK && !reader && dp_rank == 0) st = ckpt_reader_open(&reader, cm->chosen, 0);
        if (cm->wg) {
            int32_t bad = st != MS_OK, any = 0;
            ms_status cs = comm_allreduce(cm->wg, &bad, &any, 1, COMM_I32, COMM_MAX);
            if (cs != MS_OK && st == MS_OK) st = cs;
            if (st == MS_OK && any)
                st = ms_error(MS_ERR_IO, "another rank could not read %s", cm->chosen);
        }
        if (reader) saved = ckpt_reader_manifest(reader)->trainer;
        if (st == MS_OK) st = ckpt_load_into(reader, cm->dp, cm->m, cm->runs, cm->n_runs);
        snprintf(from, sizeof from, "%s", cm->chosen);
    } else if (st == MS_OK && dec[0] == RES_SHM) {
        st = load_shm(cm, dec[1], &saved, from, sizeof from);
        if (cm->wg) { /* every rank loaded, before the gather: one that failed skipped it, and
                       * its dp peers waited in it for --comm-timeout */
            int32_t bad = st != MS_OK, any = 0;
            ms_status cs = comm_allreduce(cm->wg, &bad, &any, 1, COMM_I32, COMM_MAX);
            if (cs != MS_OK && st == MS_OK) st = cs;
            if (st == MS_OK && any)
                st = ms_error(MS_ERR_IO, "another rank could not load its snapshot");
        }
        if (st == MS_OK && cm->zero) { /* each rank holds its own runs: gather the rest */
            st = par_zero_gather_start(cm->zero);
            if (st == MS_OK) st = par_zero_gather_wait_all(cm->zero);
            gpt_params_updated(cm->m);
        }
    }
    if (dec[0] != RES_NONE && cm->wg) { /* every rank's outcome; rank 0's trainer state */
        int32_t bad = st != MS_OK, any = bad;
        ms_status cs = comm_allreduce(cm->wg, &bad, &any, 1, COMM_I32, COMM_MAX);
        if (cs != MS_OK && st == MS_OK) st = cs;
        if (st == MS_OK && any) st = ms_error(MS_ERR_IO, "another rank could not load its state");
        if (st == MS_OK) st = comm_broadcast(cm->wg, &saved, sizeof saved, COMM_U8, 0);
    }
    ckpt_reader_close(reader);
    if (st != MS_OK) return ms_error_wrap(st, "resume");
    if (dec[0] == RES_NONE) {
        ms_info("resume: no checkpoint in %s yet; starting from scratch", cm->root);
        return cm->saving ? ensure_slots(cm) : MS_OK;
    }
    /* the cursor's pos counts shuffled windows or tokens: read in the other
     * order it is another place in the data (every rank: the state is rank 0's) */
    if (saved.data_order[0] && now->data_order[0] && strcmp(saved.data_order, now->data_order))
        return ms_error(MS_ERR_ARG,
                        "resume: --data-order %s differs from the checkpoint's %s (%s): its data "
                        "position (epoch %llu, shard %llu, pos %llu) has no meaning in the other "
                        "order; resume with --data-order %s",
                        now->data_order, saved.data_order, from,
                        (unsigned long long)saved.cursor.epoch,
                        (unsigned long long)saved.cursor.shard,
                        (unsigned long long)saved.cursor.pos, saved.data_order);
    opt_set_steps(cm->opt, saved.opt_steps);
    if (cm->rank == 0) compare_state(&saved, now); /* the same on every rank: said once */
    *out = saved;
    *found = 1;
    cm->last_saved = saved.step; /* nothing new to save at this step */
    ms_info("resume: continuing at step %d from %s, loaded in %.1f ms", saved.step, from,
            (ms_now() - t0) * 1e3);
    if (cm->saving)
        MS_TRY(dec[0] == RES_SHM ? persist_resumed(cm, dec[1], &saved) : ensure_slots(cm));
    return MS_OK;
}
