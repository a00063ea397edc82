/* ckpt_tools.c - offline operations on commits: finding the newest valid
 * one, loading its parameters alone (megascale eval), export to one Hugging
 * Face GPT-2 safetensors file, and resharding to another data-parallel
 * layout.  Export and reshard validate the whole source commit (every
 * CRC) first, and refuse an output that could overwrite a commit
 * (ckpt_out_check). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/log.h"
#include "ckpt/ckpt_internal.h"
#include "ckpt/hf.h"

int ckpt_is_step_dir(const char *path) {
    char m[4300];
    struct stat sb;
    snprintf(m, sizeof m, "%s/%s", path, CKPT_MANIFEST);
    return stat(m, &sb) == 0 || ckpt_dir_step(path) >= 0;
}

#define CKPT_WHAT "a commit DIR/step_N or a checkpoint directory"

ms_status ckpt_check_path(const char *what, const char *path) {
    struct stat sb;
    char commit[4300];
    if (ckpt_latest_target(path, commit, sizeof commit)) return MS_OK; /* DIR/latest */
    if (stat(path, &sb) != 0 && errno == ENOENT)
        return ms_error(MS_ERR_NOTFOUND, "%s%s does not exist (a checkpoint is " CKPT_WHAT ")",
                        what, path);
    if (stat(path, &sb) != 0)
        return ms_error(MS_ERR_IO, "%s%s: stat: %s", what, path, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return ms_error(MS_ERR_ARG, "%s%s is a file, not a checkpoint (" CKPT_WHAT ")", what, path);
    return MS_OK;
}

ms_status ckpt_find_commit(const char *path, char *out, size_t n) {
    if (ckpt_latest_target(path, out, n)) return MS_OK; /* DIR/latest: the commit it names */
    MS_TRY(ckpt_check_path("", path));
    if (ckpt_is_step_dir(path)) {
        snprintf(out, n, "%s", path);
        return MS_OK;
    }
    int *steps = NULL, ns = 0;
    MS_TRY(ckpt_list_steps(path, &steps, &ns));
    for (int i = 0; i < ns; i++) {
        ckpt_step_path(out, n, path, steps[i]);
        if (ckpt_verify(out, NULL) == MS_OK) {
            free(steps);
            return MS_OK;
        }
        ms_warn("checkpoint: skipping %s: %s", out, ms_errmsg());
    }
    free(steps);
    return ms_error(MS_ERR_NOTFOUND, "%s: no valid checkpoint", path);
}

ms_status ckpt_load_params(const char *dir, gpt_model *m, comm_group *dp) {
    ckpt_reader *r = NULL;
    ms_status st = MS_OK;
    if (!dp || comm_group_rank(dp) == 0) {
        st = ckpt_reader_open(&r, dir, 1);
        if (st == MS_OK) st = ckpt_check_model(ckpt_reader_manifest(r), m, dir);
    }
    if (dp) { /* the reader's failure must not leave the others waiting */
        int32_t bad = st != MS_OK, any = 0;
        ms_status cs = comm_allreduce(dp, &bad, &any, 1, COMM_I32, COMM_MAX);
        if (cs != MS_OK)
            st = cs;
        else if (any && st == MS_OK)
            st = ms_error(MS_ERR_FORMAT, "%s: the reading rank failed (see its log)", dir);
    }
    if (st == MS_OK) st = ckpt_load_into(r, dp, m, NULL, 0);
    ckpt_reader_close(r);
    return st;
}

/* A CPU model of the commit's architecture (activations for one token),
 * its parameters loaded.  dp > 1: laid out for dp ZeRO ranks. */
static ms_status open_model(ckpt_reader *r, const char *dir, int dp, be_backend **be,
                            gpt_model **m) {
    gpt_config cfg = ckpt_reader_manifest(r)->model;
    MS_TRY(be_cpu_create(be, 1));
    MS_TRY(gpt_create_aligned(m, &cfg, *be, 1, 1, 16 * (size_t)dp));
    MS_TRY(ckpt_check_model(ckpt_reader_manifest(r), *m, dir));
    return ckpt_load_into(r, NULL, *m, NULL, 0);
}

static void close_model(be_backend *be, gpt_model *m) {
    gpt_destroy(m);
    if (be) be_destroy(be);
}

ms_status ckpt_export_hf(const char *dir, const char *out, ckpt_st_dtype dtype) {
    ckpt_reader *r = NULL;
    be_backend *be = NULL;
    gpt_model *m = NULL;
    ms_status st = ckpt_out_check(dir, out, 0, "ckpt export");
    if (st == MS_OK) st = ckpt_reader_open(&r, dir, 1);
    if (st == MS_OK) st = open_model(r, dir, 1, &be, &m);
    if (st == MS_OK) st = ckpt_hf_save(m, out, dtype);
    close_model(be, m);
    ckpt_reader_close(r);
    return st;
}

/* Rank `rank`'s shard of the new layout from the logical tensors. */
static ms_status reshard_rank(const char *root, int step, int rank, int dp, gpt_model *m,
                              const ckpt_tensor_info *tens, float *const *logical, cJSON **part) {
    ckpt_run *runs = NULL;
    int n = 0;
    MS_TRY(ckpt_runs_of_dp(m, dp, rank, &runs, &n));
    uint64_t elems = 3 * ckpt_runs_elems(runs, n), bytes = 0;
    float *data = malloc(elems * sizeof(float) + 4);
    uint32_t *crcs = calloc(3 * (size_t)n + 1, sizeof *crcs);
    ms_status st = data && crcs ? MS_OK : ms_error(MS_ERR_NOMEM, "reshard: out of memory");
    for (int i = 0; st == MS_OK && i < n; i++) {
        uint64_t c = runs[i].end - runs[i].begin;
        for (int k = 0; k < CKPT_NKINDS; k++)
            memcpy(data + runs[i].data_off + (uint64_t)k * c,
                   logical[3 * runs[i].tensor + k] + runs[i].begin, c * sizeof(float));
    }
    char staging[4200], name[96];
    ckpt_staging_path(staging, sizeof staging, root, step);
    ckpt_shard_name(name, sizeof name, rank, dp);
    if (st == MS_OK)
        st =
            ckpt_shard_write(staging, name, rank, step, tens, runs, n, data, crcs, &bytes, NULL, 0);
    if (st == MS_OK) {
        *part = ckpt_json_part(name, rank, bytes, tens, runs, n, crcs);
        if (!*part) st = ms_error(MS_ERR_NOMEM, "reshard: out of memory");
    }
    free(data);
    free(crcs);
    free(runs);
    return st;
}

ms_status ckpt_reshard(const char *dir, int dp, const char *out_root) {
    if (dp < 1) return ms_error(MS_ERR_ARG, "reshard: --dp must be >= 1 (got %d)", dp);
    MS_TRY(ckpt_out_check(dir, out_root, 1, "ckpt reshard"));
    ckpt_reader *r = NULL;
    be_backend *be = NULL;
    gpt_model *m = NULL;
    ckpt_tensor_info *tens = NULL;
    float **logical = NULL;
    cJSON **parts = calloc((size_t)dp, sizeof *parts);
    char *text = NULL;
    int nt = 0, staged = 0;
    uint64_t job;
    ms_status st = parts ? ckpt_reader_open(&r, dir, 1) : ms_error(MS_ERR_NOMEM, "out of memory");
    if (st == MS_OK) st = open_model(r, dir, dp, &be, &m);
    if (st == MS_OK) st = ckpt_tensors_of(m, &tens, &nt);
    if (st == MS_OK && !(logical = calloc(3 * (size_t)nt, sizeof *logical)))
        st = ms_error(MS_ERR_NOMEM, "reshard: out of memory");
    for (int t = 0; st == MS_OK && t < nt; t++)
        for (int k = 0; st == MS_OK && k < CKPT_NKINDS; k++) {
            logical[3 * t + k] = calloc(ckpt_numel(&tens[t]) + 1, sizeof(float));
            st = logical[3 * t + k] ? ckpt_reader_tensor(r, t, k, logical[3 * t + k])
                                    : ms_error(MS_ERR_NOMEM, "reshard: out of memory");
        }
    const ckpt_manifest *mf = r ? ckpt_reader_manifest(r) : NULL;
    /* what this call makes, to be removed if it fails: --out itself, its
     * job file (left, it made --out "a checkpoint directory" that every
     * retry was refused) */
    char job_path[4200];
    struct stat jb;
    snprintf(job_path, sizeof job_path, "%s/job", out_root);
    int made_out = stat(out_root, &jb) != 0, made_job = 0, clean[4] = {0, 0, 0, 0};
    /* ... and by a SIGINT or SIGTERM meanwhile (Ctrl-C: it left them) */
    if (st == MS_OK && made_out) clean[0] = ms_cleanup_add(out_root, MS_CLEAN_DIR);
    if (st == MS_OK) st = ms_mkdirs(out_root);
    /* one writer of --out at a time, its lock file made here removed again if this fails:
     * another reshard started at the same moment passed the check above too (the load of
     * the commit takes seconds), and the two wrote into one staging directory (before: one
     * failed on a file the other renamed, or both did); the lock held, nothing else may be
     * there yet */
    char lock_path[4200];
    snprintf(lock_path, sizeof lock_path, "%s/lock", out_root);
    int lock_fd = -1, made_lock = st == MS_OK && stat(lock_path, &jb) != 0;
    if (st == MS_OK) st = ckpt_dir_lock(out_root, "--out", &lock_fd);
    if (st != MS_OK) made_lock = 0; /* not held: never this call's to remove */
    if (made_lock) clean[3] = ms_cleanup_add(lock_path, MS_CLEAN_FILE); /* before out's rmdir */
    if (st == MS_OK) st = ckpt_out_still_new(out_root, "ckpt reshard");
    if (st == MS_OK) made_job = stat(job_path, &jb) != 0;
    if (st == MS_OK && made_job) clean[1] = ms_cleanup_add(job_path, MS_CLEAN_FILE);
    if (st == MS_OK) st = ckpt_job_id(out_root, 1, &job);
    char staging_dir[4200] = "";
    if (st == MS_OK) {
        ckpt_staging_path(staging_dir, sizeof staging_dir, out_root, mf->step);
        clean[2] = ms_cleanup_add(staging_dir, MS_CLEAN_DIR_FILES);
        st = ckpt_staging_create(out_root, mf->step);
    }
    staged = st == MS_OK;
    for (int rk = 0; st == MS_OK && rk < dp; rk++)
        st = reshard_rank(out_root, mf->step, rk, dp, m, tens, logical, &parts[rk]);
    if (st == MS_OK) {
        ckpt_commit_info ci = {mf->step, dp, dp, &mf->model, mf->optimizer, &mf->trainer, tens, nt};
        text = ckpt_manifest_text(&ci, parts, dp);
        ms_cleanup_hold(1); /* the commit's rename publishes it: a signal removes nothing now */
        st = text ? ckpt_commit(out_root, mf->step, text, INT_MAX, NULL, 0, NULL, 0)
                  : ms_error(MS_ERR_NOMEM, "reshard: out of memory");
    }
    for (int i = 3; i >= 0; i--) /* committed (the job file is its own then), or removed below */
        ms_cleanup_drop(clean[i]);
    ms_cleanup_hold(0);
    if (st != MS_OK && made_lock) unlink(lock_path); /* held still: a waiter retries */
    ckpt_dir_unlock(lock_fd);
    if (st != MS_OK && (staged || made_job || made_out)) {
        /* only what this call created; the first error is reported */
        char staging[4200], msg[2048];
        snprintf(msg, sizeof msg, "%s", ms_errmsg());
        if (staged) {
            ckpt_staging_path(staging, sizeof staging, out_root, mf->step);
            if (ckpt_rmdir_flat(staging) != MS_OK) ms_warn("reshard: %s", ms_errmsg());
        }
        int *left = NULL, n_left = 1;
        if (made_job && ckpt_list_steps(out_root, &left, &n_left) == MS_OK &&
            n_left == 0) /* no commit made it (a failed fsync after the rename keeps one) */
            unlink(job_path);
        free(left);
        if (made_out) rmdir(out_root); /* only if empty: as it was, absent */
        st = ms_error(st, "%s", msg);
    }
    for (int i = 0; parts && i < dp; i++)
        cJSON_Delete(parts[i]);
    for (int i = 0; logical && i < 3 * nt; i++)
        free(logical[i]);
    free(logical);
    free(parts);
    free(text);
    free(tens);
    close_model(be, m);
    ckpt_reader_close(r);
    return st;
}
