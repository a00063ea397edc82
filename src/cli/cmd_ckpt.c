/* cmd_ckpt.c - `megascale ckpt`: list, inspect, verify, export and reshard
 * checkpoints (src/ckpt/ckpt.h), and list / remove host-memory snapshots
 * (of one checkpoint directory, or the orphans whose directory is gone). */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/fileio.h"
#include "ckpt/ckpt.h"
#include "ckpt/hf.h"
#include "cli/commands.h"
#include "cli/opts.h"

typedef struct {
    char *format, *out, *shm_dir, *save_dtype;
    int dp, remove, force;
    opts_list config; /* the --config files read (opts_check_output) */
} ckpt_cli;

#define O(name, type, field, def, help)                                                            \
    { name, type, offsetof(ckpt_cli, field), def, help, NULL, NULL, 0, 0 }
#define R(name, type, field, def, range, help)                                                     \
    { name, type, offsetof(ckpt_cli, field), def, help, NULL, range, 0, 0 }
#define OE(name, type, field, def, env, help)                                                      \
    { name, type, offsetof(ckpt_cli, field), def, help, env, NULL, 0, 0 }
static const opts_spec ckpt_opts[] = {
    O("format", OPT_T_STR, format, "safetensors", "export: output format (safetensors)"),
    O("out", OPT_T_STR, out, NULL, "export: the output file; reshard: the output directory"),
    O("save-dtype", OPT_T_STR, save_dtype, "f32", "export: the weights' dtype, f32 or bf16"),
    /* train's --dp range: a commit for more ranks is one no run can load */
    R("dp", OPT_T_INT, dp, "1", "[1,65536]", "reshard: data-parallel ranks of the new layout"),
    OPTS_FLAG("force", ckpt_cli, force,
              "export: 1 (or a bare --force) replaces an existing --out file (and config.json); "
              "shm --remove: also removes a snapshot newer than every commit"),
    OPTS_FLAG("remove", ckpt_cli, remove,
              "shm, shm-orphans: 1 (or a bare --remove) removes the snapshots listed"),
    OE("ckpt-shm-dir", OPT_T_STR, shm_dir, "/dev/shm", "MS_CKPT_SHM_DIR",
       "list, shm, shm-orphans: where the training run keeps its host-memory snapshots"),
    OPTS_CONFIG_FILES(ckpt_cli, config),
};
#define N_CKPT_OPTS ((int)(sizeof ckpt_opts / sizeof ckpt_opts[0]))

static const char *usage_text =
    "usage: megascale ckpt <command> PATH [options]\n\n"
    "  list DIR                  commits in DIR (quick check), latest, host-memory snapshots\n"
    "  inspect PATH              layout, step, sizes, trainer state and tensors of a commit\n"
    "  verify PATH               check every file size and CRC (a commit, or all in DIR)\n"
    "  export PATH --format safetensors --out FILE [--force]\n"
    "                            the weights as one Hugging Face GPT-2 file\n"
    "  reshard PATH --dp N --out DIR\n"
    "                            rewrite a commit for N data-parallel ranks\n"
    "  shm DIR [--remove 1]      host-memory snapshots of the job of DIR\n"
    "  shm-orphans [--remove 1]  your host-memory snapshots whose checkpoint directory is gone\n"
    "                            (never one that a live process holds)\n"
    "PATH is a step directory (DIR/step_00001234) or a checkpoint directory (its newest\n"
    "valid commit).";

static double total_mb(const ckpt_manifest *mf) {
    uint64_t b = 0;
    for (int i = 0; i < mf->n_files; i++)
        b += mf->files[i].bytes;
    return (double)b / 1e6;
}

static ms_status do_list(const char *root, const char *shm_dir) {
    int *steps = NULL, n = 0;
    char path[4300], *latest = NULL;
    size_t ll = 0;
    MS_TRY(ckpt_shm_dir_check(shm_dir)); /* first: it came after the listing */
    MS_TRY(ckpt_list_steps(root, &steps, &n));
    snprintf(path, sizeof path, "%s/latest", root);
    if (ms_file_read_all(path, &latest, &ll) == MS_OK) latest[strcspn(latest, "\n")] = '\0';
    if (!n) printf("no checkpoints in %s\n", root);
    int latest_seen = 0;
    for (int i = 0; i < n; i++) {
        ckpt_manifest mf;
        ckpt_step_path(path, sizeof path, root, steps[i]);
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        int is_latest = latest && !strcmp(latest, base);
        latest_seen |= is_latest;
        ms_status st = ckpt_validate(path, 0, &mf); /* quick: sizes and headers */
        if (st == MS_OK) {
            char when[32];
            time_t t = (time_t)mf.created;
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
            char vpp[24] = ""; /* the interleaved pipeline's chunks per stage, when > 1 */
            if (mf.vpp > 1) snprintf(vpp, sizeof vpp, " (vpp %d)", mf.vpp);
            printf("%s  step %8d  committed  dp %d x tp %d x pp %d%s  %d file(s)  %.1f MB  %s%s\n",
                   path, mf.step, mf.dp, mf.tp, mf.pp, vpp, mf.n_files, total_mb(&mf), when,
                   is_latest ? "  (latest)" : "");
            ckpt_manifest_free(&mf);
        } else {
            printf("%s  step %8d  NOT LOADABLE: %s%s\n", path, steps[i], ms_errmsg(),
                   is_latest ? "  (latest)" : "");
        }
    }
    if (latest && *latest && !latest_seen) /* a resume would not find what it names */
        printf("%s/latest names %s, which is not a commit in %s (a resume takes the newest valid "
               "commit)\n",
               root, latest, root);
    free(steps);
    free(latest);
    return ckpt_shm_list(root, shm_dir, 0, 0);
}

static ms_status do_inspect(const char *arg) {
    char dir[4300];
    ckpt_manifest mf;
    MS_TRY(ckpt_find_commit(arg, dir, sizeof dir));
    MS_TRY(ckpt_verify(dir, &mf));
    const gpt_config *c = &mf.model;
    const ckpt_train_state *s = &mf.trainer;
    uint64_t params = 0;
    for (int i = 0; i < mf.n_tensors; i++)
        params += (uint64_t)mf.tensors[i].shape[0] *
                  (uint64_t)(mf.tensors[i].ndim > 1 ? mf.tensors[i].shape[1] : 1);
    printf("checkpoint %s (format version %d, all CRCs verified%s)\n", dir, mf.version,
           mf.version < 2 ? "; written before manifests had a checksum: its fields are unchecked"
                          : ", the manifest's too");
    printf("step       %d (optimizer updates %d)\n", mf.step, s->opt_steps);
    printf("layout     world %d = dp %d x tp %d x pp %d (vpp %d)\n", mf.world, mf.dp, mf.tp, mf.pp,
           mf.vpp);
    printf("model      %d layers, dim %d, %d heads, vocab %d, seq-max %d, %s block, window %d\n",
           c->n_layer, c->n_embd, c->n_head, c->vocab, c->seq_max, gpt_block_name(c->block),
           c->attn_window);
    printf("size       %.2fM parameters; %d tensors x (param, m, v) in %d slices; %.1f MB in "
           "%d file(s)\n",
           (double)params / 1e6, mf.n_tensors, mf.n_slices, total_mb(&mf), mf.n_files);
    printf("optimizer  %s, lr %g (%s, warmup %d, total %d, floor %g)\n", mf.optimizer,
           (double)s->sched.lr, s->sched.kind == OPT_SCHED_COSINE ? "cosine" : "constant",
           s->sched.warmup, s->sched.total, (double)s->sched.floor);
    printf("data       cursor epoch %" PRIu64 ", shard %" PRIu64 ", pos %" PRIu64
           "; batch %d x seq %d; seed %" PRIu64 "\n",
           s->cursor.epoch, s->cursor.shard, s->cursor.pos, s->batch, s->seq, s->seed);
    for (int i = 0; i < mf.n_files; i++)
        printf("file       %s (rank %d, %" PRIu64 " bytes)\n", mf.files[i].name, mf.files[i].rank,
               mf.files[i].bytes);
    for (int t = 0; t < mf.n_tensors; t++) {
        int ns = 0;
        for (int i = 0; i < mf.n_slices; i++)
            ns += mf.slices[i].tensor == t;
        char shape[64];
        if (mf.tensors[t].ndim > 1)
            snprintf(shape, sizeof shape, "(%" PRId64 ", %" PRId64 ")", mf.tensors[t].shape[0],
                     mf.tensors[t].shape[1]);
        else
            snprintf(shape, sizeof shape, "(%" PRId64 ")", mf.tensors[t].shape[0]);
        printf("tensor     %-28s %-14s F32  %d slice(s)\n", mf.tensors[t].name, shape, ns);
    }
    ckpt_manifest_free(&mf);
    return MS_OK;
}

/* "ok" for a valid commit, with a note when its manifest (format version
 * 1) has no checksum of its own: its fields were not verified. */
static ms_status verify_one(const char *path) {
    ckpt_manifest mf;
    MS_TRY(ckpt_verify(path, &mf));
    printf("%s: ok%s\n", path,
           mf.version < 2 ? " (format version 1, written before manifests had a checksum: "
                            "the data's CRCs are verified, the manifest's fields are not)"
                          : "");
    ckpt_manifest_free(&mf);
    return MS_OK;
}

static ms_status do_verify(const char *arg) {
    if (ckpt_is_step_dir(arg)) return verify_one(arg);
    int *steps = NULL, n = 0, bad = 0;
    char path[4300];
    MS_TRY(ckpt_list_steps(arg, &steps, &n));
    if (!n) {
        free(steps);
        return ms_error(MS_ERR_NOTFOUND, "%s: no checkpoints", arg);
    }
    for (int i = 0; i < n; i++) {
        ckpt_step_path(path, sizeof path, arg, steps[i]);
        if (verify_one(path) != MS_OK) {
            printf("%s: FAILED: %s\n", path, ms_errmsg());
            bad++;
        }
    }
    free(steps);
    if (bad) return ms_error(MS_ERR_FORMAT, "%s: %d of %d checkpoints failed", arg, bad, n);
    return MS_OK;
}

/* An option of another ckpt command, given to this one (a value other than its default): a
 * usage error naming the commands it belongs to (before, `ckpt list DIR --remove 1` listed and
 * removed nothing, exit 0; `reshard --force` or `export --dp 2` were ignored). */
static ms_status check_options_belong(const char *cmd, const ckpt_cli *o) {
    static const struct {
        const char *opt, *cmds; /* cmds: " list shm " (spaces around each) */
    } own[] = {{"--out", " export reshard "}, {"--format", " export "},
               {"--save-dtype", " export "},  {"--dp", " reshard "},
               {"--force", " export shm "},   {"--remove", " shm shm-orphans "}};
    const int given[] = {o->out != NULL,
                         o->format && strcmp(o->format, "safetensors"),
                         o->save_dtype && strcmp(o->save_dtype, "f32"),
                         o->dp != 1,
                         o->force != 0,
                         o->remove != 0};
    char key[64];
    snprintf(key, sizeof key, " %s ", cmd);
    for (size_t i = 0; i < sizeof own / sizeof *own; i++)
        if (given[i] && !strstr(own[i].cmds, key))
            return ms_error(MS_ERR_ARG,
                            "ckpt %s takes no %s (an option of ckpt%.*s); nothing was done", cmd,
                            own[i].opt, (int)strlen(own[i].cmds) - 1, own[i].cmds);
    return MS_OK;
}

int cmd_ckpt(int argc, char **argv) {
    ckpt_cli o = {0};
    char *pos[2] = {NULL, NULL};
    int npos = 0, help = 0, rc = 0;
    ms_status st = opts_parse(ckpt_opts, N_CKPT_OPTS, &o, argc, argv, pos, 2, &npos, &help);
    if (help || (st == MS_OK && npos == 0)) {
        opts_print_help(ckpt_opts, N_CKPT_OPTS, usage_text);
        opts_free(ckpt_opts, N_CKPT_OPTS, &o);
        return help ? 0 : 2;
    }
    const char *cmd = pos[0], *path = npos > 1 ? pos[1] : NULL;
    char dir[4300], target[4300], root[4300];
    if (path && ckpt_latest_target(path, target, sizeof target)) {
        if (strcmp(cmd, "list") && strcmp(cmd, "shm")) { /* DIR/latest: the commit it names */
            path = target;
        } else { /* ... and for the tools of a whole directory, that directory */
            snprintf(root, sizeof root, "%s", path);
            ms_path_dir(root);
            path = root;
        }
    } else if (path && cmd && (!strcmp(cmd, "list") || !strcmp(cmd, "shm")) &&
               ckpt_is_step_dir(path)) { /* a commit: its directory's (it found none, exit 0) */
        char real[PATH_MAX]; /* DIR/step_N/. or a link to a commit: the directory it lies in */
        snprintf(root, sizeof root, "%s", realpath(path, real) ? real : path);
        ms_path_dir(root);
        path = root;
    }
    static const char *const cmds[] = {"list",    "inspect", "verify",     "export",
                                       "reshard", "shm",     "shm-orphans"};
    int known = 0, orphans = cmd && !strcmp(cmd, "shm-orphans"); /* cmd NULL: a parse error */
    for (size_t i = 0; cmd && i < sizeof cmds / sizeof cmds[0]; i++)
        known |= !strcmp(cmd, cmds[i]);
    if (st == MS_OK && !known) /* before its PATH is looked at */
        st = ms_error(MS_ERR_ARG,
                      "unknown ckpt command '%s' (list, inspect, verify, export, "
                      "reshard, shm, shm-orphans)",
                      cmd);
    else if (st == MS_OK && orphans && path)
        st = ms_error(MS_ERR_ARG, "ckpt shm-orphans takes no PATH (--ckpt-shm-dir DIR: "
                                  "where to look)");
    else if (st == MS_OK && !path && !orphans)
        st = ms_error(MS_ERR_ARG, "ckpt %s: expected a PATH (see megascale ckpt --help)", cmd);
    else if (st == MS_OK && (st = check_options_belong(cmd, &o)) != MS_OK)
        ; /* said */
    else if (st == MS_OK && path) {
        char what[64];
        snprintf(what, sizeof what, "ckpt %.40s: ", cmd);
        st = ckpt_check_path(what, path);
    }
    if (st != MS_OK) {
        /* fall through to the error */
    } else if (!strcmp(cmd, "list")) {
        st = do_list(path, o.shm_dir);
    } else if (!strcmp(cmd, "inspect")) {
        st = do_inspect(path);
    } else if (!strcmp(cmd, "verify")) {
        st = do_verify(path);
    } else if (!strcmp(cmd, "export")) {
        if (!o.out || !*o.out)
            st = ms_error(MS_ERR_ARG, "ckpt export: --out FILE is required");
        else if (strcmp(o.format, "safetensors"))
            st = ms_error(MS_ERR_ARG, "ckpt export: --format %s (only safetensors)", o.format);
        char hf[4200] = ""; /* the config.json written beside the weights */
        if (st == MS_OK) ckpt_hf_config_path(o.out, hf, sizeof hf);
        /* the checkpoint tools' own check first: it says more (the commit it reads, "lies in") */
        if (st == MS_OK) st = ckpt_out_precheck(path, o.out, 0, "ckpt export");
        if (st == MS_OK) st = opts_check_output(ckpt_opts, N_CKPT_OPTS, &o, "--out", o.out, NULL);
        if (st == MS_OK)
            st = opts_check_output(ckpt_opts, N_CKPT_OPTS, &o, "--out's config.json", hf, NULL);
        struct stat so; /* a directory or a FIFO where config.json goes: said before the weights
                           are written (it failed after them, exit 4; --force removed a FIFO) */
        if (st == MS_OK && hf[0] && stat(hf, &so) == 0 && !S_ISREG(so.st_mode))
            st = ms_error(MS_ERR_ARG,
                          "ckpt export: %s is %s, where the export writes the config.json of "
                          "--out %s: remove it, or choose another --out; nothing was written",
                          hf, ms_file_kind(&so), o.out);
        /* an export already there is a saved model too */
        if (st == MS_OK && !o.force && stat(o.out, &so) == 0 && S_ISREG(so.st_mode))
            st = ms_error(MS_ERR_ARG,
                          "ckpt export: --out %s exists: --force 1 replaces it, or choose another "
                          "--out; nothing was written",
                          o.out);
        /* ... and so is a config.json beside it (another model's, of its
         * pytorch_model.bin: it was replaced, or removed, without --force) */
        if (st == MS_OK && !o.force && hf[0] && stat(hf, &so) == 0 && S_ISREG(so.st_mode))
            st = ms_error(MS_ERR_ARG,
                          "ckpt export: %s exists beside --out %s (the export writes its own "
                          "config.json there): --force 1 replaces it, or choose another "
                          "directory; nothing was written",
                          hf, o.out);
        ckpt_st_dtype dt = CKPT_ST_F32; /* a usage error before the checkpoint is read */
        if (st == MS_OK) st = ckpt_hf_dtype_parse(o.save_dtype, &dt);
        if (st == MS_OK) st = ckpt_find_commit(path, dir, sizeof dir);
        if (st == MS_OK) st = ckpt_export_hf(dir, o.out, dt);
        if (st == MS_OK) printf("exported %s to %s\n", dir, o.out);
    } else if (!strcmp(cmd, "reshard")) {
        if (!o.out || !*o.out) st = ms_error(MS_ERR_ARG, "ckpt reshard: --out DIR is required");
        if (st == MS_OK) st = ckpt_out_precheck(path, o.out, 1, "ckpt reshard");
        if (st == MS_OK) st = ckpt_find_commit(path, dir, sizeof dir);
        if (st == MS_OK) st = ckpt_reshard(dir, o.dp, o.out);
        if (st == MS_OK) printf("resharded %s for dp %d into %s\n", dir, o.dp, o.out);
    } else if (!strcmp(cmd, "shm")) {
        st = ckpt_shm_list(path, o.shm_dir, o.remove, o.force);
    } else { /* shm-orphans */
        st = ckpt_shm_orphans(o.shm_dir, o.remove, 1, NULL, NULL);
    }
    if (st != MS_OK) rc = cli_fail("ckpt", st);
    opts_free(ckpt_opts, N_CKPT_OPTS, &o);
    return rc;
}
