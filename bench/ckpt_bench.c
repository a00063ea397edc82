/* ckpt_bench.c - the measurements behind bench/ckpt, in one process on a
 * real model and optimiser (CPU backend):
 *   memcpy   a plain memcpy of the bytes stage 1 copies (params runs, m, v)
 *            into a buffer that is already faulted in;
 *   stage1   the stall of ckpt_manager_save (snapshot into /dev/shm);
 *   persist  stage 2 alone (shard + CRCs + fsync + manifest + commit), MB/s;
 *   steps    wall time per training step over blocks of 20 steps, without
 *            checkpoints and with one every 10 steps (at the block's steps
 *            0 and 10: the stage-1 stalls, and stage 2 running beside the
 *            steps as in the trainer), the two kinds of block alternating
 *            so both see the same machine load; between blocks the last
 *            persist is waited for, untimed, so a block without
 *            checkpoints never shares the machine with one;
 *   restore  ckpt_manager_resume from a /dev/shm snapshot and from the
 *            commit on disk (validation of every CRC included).
 * Prints "key value" lines for bench/ckpt to tabulate.
 * usage: ckpt_bench DIR [preset B T blocks reps] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/ctx.h"
#include "base/timeutil.h"
#include "ckpt/ckpt_internal.h"

typedef struct {
    be_backend *be;
    gpt_model *m;
    opt_state *o;
    int32_t *tok, *tgt;
    int B, T;
} model;

static void model_make(model *x, const char *preset, int B, int T) {
    gpt_config c;
    MS_CHECK(gpt_config_preset(&c, preset) == MS_OK);
    c.seq_max = T;
    MS_CHECK(gpt_config_validate(&c) == MS_OK);
    MS_CHECK(be_cpu_create(&x->be, 0) == MS_OK);
    MS_CHECK(gpt_create(&x->m, &c, x->be, B, T) == MS_OK);
    gpt_init(x->m, 1);
    opt_config oc = {OPT_ADAMW, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    MS_CHECK(opt_create(&x->o, &oc, x->m, NULL) == MS_OK);
    x->B = B;
    x->T = T;
    x->tok = malloc(sizeof(int32_t) * (size_t)B * (size_t)T);
    x->tgt = malloc(sizeof(int32_t) * (size_t)B * (size_t)T);
    for (int i = 0; i < B * T; i++) {
        x->tok[i] = (i * 7919) % c.vocab;
        x->tgt[i] = (i * 104729 + 1) % c.vocab;
    }
}

static void model_free(model *x) {
    opt_destroy(x->o);
    gpt_destroy(x->m);
    be_destroy(x->be);
    free(x->tok);
    free(x->tgt);
}

static void step(model *x) {
    gpt_zero_grads(x->m);
    gpt_forward_backward(x->m, x->tok, x->tgt, x->B, x->T, 1.0f / (float)(x->B * x->T));
    opt_stats st;
    MS_CHECK(opt_step(x->o, 1e-4f, &st) == MS_OK);
}

static ckpt_train_state state(model *x, int s) {
    ckpt_train_state st = {.step = s,
                           .opt_steps = opt_steps_done(x->o),
                           .seed = 1,
                           .cursor = {0, 0, (uint64_t)s},
                           .batch = x->B,
                           .seq = x->T};
    st.sched = (opt_schedule){OPT_SCHED_CONSTANT, 1e-4f, 0, 1000000, 0.1f};
    return st;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n ? v[n / 2] : 0;
}

/* Seconds per step over a block of 20 steps from step s0; with cm, a
 * checkpoint every 10 steps (as ckpt_manager_step would take them). */
static double run_block(model *x, ckpt_manager *cm, int s0) {
    double t0 = ms_now();
    for (int s = 0; s < 20; s++) {
        if (cm && s % 10 == 0) {
            ckpt_train_state st = state(x, s0 + s);
            MS_CHECK(ckpt_manager_save(cm, &st) == MS_OK);
        }
        step(x);
    }
    double dt = (ms_now() - t0) / 20;
    if (cm) MS_CHECK(ckpt_manager_wait(cm) == MS_OK); /* untimed */
    return dt;
}

int main(int argc, char **argv) {
    ms_ctx_init(); /* MS_LOG_LEVEL */
    if (argc < 2) {
        fprintf(stderr, "usage: ckpt_bench DIR [preset B T steps rounds reps]\n");
        return 2;
    }
    const char *dir = argv[1], *preset = argc > 2 ? argv[2] : "d6";
    int B = argc > 3 ? atoi(argv[3]) : 4, T = argc > 4 ? atoi(argv[4]) : 64;
    int cycles = argc > 5 ? atoi(argv[5]) : 6, reps = argc > 6 ? atoi(argv[6]) : 5;
    model x;
    model_make(&x, preset, B, T);
    ckpt_run *runs;
    int nr;
    MS_CHECK(ckpt_runs_of_opt(x.m, x.o, &runs, &nr) == MS_OK);
    uint64_t elems = 3 * ckpt_runs_elems(runs, nr);
    printf("params %zu\n", gpt_num_elements(x.m));
    printf("bytes %llu\n", (unsigned long long)(elems * 4));
    step(&x); /* m, v non-zero; pages touched */

    /* memcpy of the same bytes, into a faulted-in buffer */
    float *dst = malloc(elems * 4);
    memset(dst, 1, elems * 4);
    double *v = malloc(sizeof(double) * (size_t)(reps > cycles ? reps : cycles) * 4 + 64);
    for (int r = 0; r < reps; r++) {
        double t0 = ms_now();
        for (int i = 0; i < nr; i++) {
            size_t n = runs[i].end - runs[i].begin;
            float *d = dst + runs[i].data_off;
            memcpy(d, gpt_params(x.m) + runs[i].param_off, n * 4);
            memcpy(d + n, runs[i].mom, n * 4);
            memcpy(d + 2 * n, runs[i].var, n * 4);
        }
        v[r] = ms_now() - t0;
    }
    printf("memcpy_ms %.3f\n", median(v, reps) * 1e3);
    free(dst);

    /* stage 1 stall and stage 2 alone */
    char root[4096];
    snprintf(root, sizeof root, "%s/ckpt", dir);
    const char *shm = getenv("MS_CKPT_SHM_DIR"); /* NULL: /dev/shm */
    ckpt_options o = {root, 0, 0, 2, "", shm, NULL, 0, 0};
    ckpt_manager *cm;
    MS_CHECK(ckpt_manager_create(&cm, &o, x.m, x.o, NULL) == MS_OK);
    ckpt_train_state st0 = state(&x, 0), got;
    int found;
    MS_CHECK(ckpt_manager_resume(cm, &st0, &got, &found) == MS_OK); /* opens the slots */
    double *p = v + reps;
    for (int r = 0; r < reps; r++) {
        ckpt_train_state st = state(&x, 1000 + r);
        MS_CHECK(ckpt_manager_save(cm, &st) == MS_OK);
        v[r] = ckpt_manager_last_stall(cm);
        double t0 = ms_now();
        MS_CHECK(ckpt_manager_wait(cm) == MS_OK);
        p[r] = ms_now() - t0;
    }
    printf("stage1_ms %.3f\n", median(v, reps) * 1e3);
    printf("persist_ms %.3f\n", median(p, reps) * 1e3);
    printf("persist_mb_s %.1f\n", (double)elems * 4 / 1e6 / median(p, reps));
    ckpt_manager_destroy(cm);

    /* step time: blocks without / with checkpoints, alternated.  The same run goes on
     * (--resume auto): a fresh start in a directory of commits is refused, and the restore
     * below reads this run's commits */
    double *a = v, *b = v + cycles;
    o.resume = "auto";
    MS_CHECK(ckpt_manager_create(&cm, &o, x.m, x.o, NULL) == MS_OK);
    MS_CHECK(ckpt_manager_resume(cm, &st0, &got, &found) == MS_OK);
    step(&x); /* warm-up */
    for (int r = 0; r < cycles; r++) {
        a[r] = run_block(&x, NULL, 0);
        b[r] = run_block(&x, cm, 2000 + 20 * r);
    }
    ckpt_manager_destroy(cm);
    double sa = median(a, cycles), sb = median(b, cycles);
    printf("step_ms_none %.3f\n", sa * 1e3);
    printf("step_ms_every10 %.3f\n", sb * 1e3);

    /* restore: a snapshot newer than every commit (its persist fails on
     * purpose), then the commit on disk */
    ckpt_options fo = o;
    fo.fault = "io:enospc-shard@9000";
    MS_CHECK(ckpt_manager_create(&cm, &fo, x.m, x.o, NULL) == MS_OK);
    MS_CHECK(ckpt_manager_resume(cm, &st0, &got, &found) == MS_OK);
    ckpt_train_state s9 = state(&x, 9000);
    MS_CHECK(ckpt_manager_save(cm, &s9) == MS_OK);
    (void)ckpt_manager_wait(cm); /* fails: injected */
    ckpt_manager_destroy(cm);
    model y;
    model_make(&y, preset, B, T);
    ckpt_options ro = {root, 0, 0, 100, "auto", shm, NULL, 0, 0};
    for (int r = 0; r < 2; r++) {
        if (r == 1) MS_CHECK(ckpt_shm_list(root, shm, 1, 1) == MS_OK); /* drop the snapshots */
        if (r == 1 && getenv("MS_BENCH_DROP_CACHES"))
            if (system("sync; echo 3 > /proc/sys/vm/drop_caches") != 0)
                fprintf(stderr, "could not drop the page cache\n");
        MS_CHECK(ckpt_manager_create(&cm, &ro, y.m, y.o, NULL) == MS_OK);
        double t0 = ms_now();
        MS_CHECK(ckpt_manager_resume(cm, &st0, &got, &found) == MS_OK && found);
        double dt = ms_now() - t0;
        printf("%s %.3f (step %d)\n", r == 0 ? "restore_shm_ms" : "restore_disk_ms", dt * 1e3,
               got.step);
        ckpt_manager_destroy(cm);
    }
    MS_CHECK(ckpt_shm_list(root, shm, 1, 1) == MS_OK);
    model_free(&y);
    model_free(&x);
    free(runs);
    free(v);
    return 0;
}
