/* test_tp_model.c - the tensor-parallel model against the single-process
 * model in the same process, under mpirun (every rank of the world is one tp
 * rank): the parameter table (split rules, logical and local shapes), init
 * (the gathered shards are bitwise the single model's weights), and for the
 * serial and the parallel block (with a window), a vocabulary whose padding
 * falls inside the last rank's slice, and two accumulated micro-batches: the
 * losses and every gradient, gathered to its logical tensor, against the
 * single model's (relative L2 error per tensor).  Also forward-only losses
 * and an --init-from style load of a single-process file.
 * usage: mpirun -np {2,4} test_tp_model */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ckpt/hf.h"
#include "comm/comm.h"
#include "comm/env_options.h"
#include "model/gpt.h"
#include "tmpdir.h"

#define GRAD_TOL 2e-5 /* relative L2 per tensor: float summation order only */

static comm_group *tp;

/* The logical tensor i of the tp model m (gathered over tp) from its
 * buffer buf (params or grads), into out (logical numel). */
static void gather_logical(gpt_model *m, const float *buf, int i, float *out) {
    const gpt_param *p = gpt_tensor(m, i);
    int P = comm_group_size(tp);
    if (p->split == GPT_SPLIT_NONE) {
        memcpy(out, buf + p->offset, p->numel * sizeof(float));
        return;
    }
    float *parts = malloc((size_t)P * p->numel * sizeof(float));
    MS_CHECK(parts && comm_allgather(tp, buf + p->offset, parts, p->numel, COMM_F32) == MS_OK);
    for (int q = 0; q < P; q++)
        for (size_t j = 0; j < p->numel; j++)
            out[gpt_logical_index(m, i, q, j)] = parts[(size_t)q * p->numel + j];
    free(parts);
}

/* Every tensor of tp model b, gathered, against single model a: bitwise
 * (tol < 0) or relative L2 <= tol.  Returns the worst error. */
static double compare(gpt_model *a, const float *abuf, gpt_model *b, const float *bbuf, double tol,
                      const char *what) {
    double worst = 0;
    for (int i = 0; i < gpt_num_tensors(a); i++) {
        const gpt_param *p = gpt_tensor(a, i), *pb = gpt_tensor(b, gpt_find(b, p->name));
        size_t n = (size_t)pb->shape[0] * (size_t)(p->ndim > 1 ? p->shape[1] : 1); /* Vp(b) >= */
        float *full = calloc(n, sizeof(float));
        MS_CHECK(full);
        gather_logical(b, bbuf, gpt_find(b, p->name), full);
        if (!strcmp(p->name, "wte.weight")) n = (size_t)gpt_get_config(a)->vocab * p->shape[1];
        const float *ref = abuf + p->offset;
        double d = 0, r = 0;
        for (size_t j = 0; j < n; j++)
            d += ((double)full[j] - ref[j]) * ((double)full[j] - ref[j]),
                r += (double)ref[j] * ref[j];
        double e = tol < 0 ? (memcmp(full, ref, n * 4) != 0) : sqrt(d) / (r > 0 ? sqrt(r) : 1);
        for (size_t j = 0; tol < 0 && e > 0 && j < n; j++)
            if (full[j] != ref[j]) {
                fprintf(stderr, "  %s %s [%zu]: %g vs %g\n", what, p->name, j, full[j], ref[j]);
                break;
            }
        if (strstr(p->name, "c_attn.bias")) e = 0; /* the key bias: zero in exact arithmetic */
        if (getenv("MS_TEST_VERBOSE") && comm_group_rank(tp) == 0)
            printf("  %s %-24s %.3g\n", what, p->name, e);
        if (!(e <= (tol < 0 ? 0 : tol))) fprintf(stderr, "  %s %s: error %.3g\n", what, p->name, e);
        T_OK(e <= (tol < 0 ? 0 : tol));
        worst = e > worst ? e : worst;
        free(full);
    }
    return worst;
}

static void check_table(gpt_model *m, int P) {
    const gpt_param *q = gpt_tensor(m, gpt_find(m, "h.0.attn.c_attn.weight"));
    T_OK(q->split == GPT_SPLIT_QKV && q->shape[1] == 3 * 64 && q->local[1] == 3 * 64 / P);
    const gpt_param *w = gpt_tensor(m, gpt_find(m, "wte.weight"));
    T_OK(w->split == GPT_SPLIT_VOCAB && w->shape[0] % (128 * P) == 0 &&
         w->local[0] * P == w->shape[0]);
    T_EQ_INT(gpt_tensor(m, gpt_find(m, "h.1.mlp.c_proj.weight"))->split, GPT_SPLIT_ROWS);
    T_EQ_INT(gpt_tensor(m, gpt_find(m, "h.1.mlp.c_fc.bias"))->split, GPT_SPLIT_COLS);
    T_EQ_INT(gpt_tensor(m, gpt_find(m, "h.1.attn.c_proj.bias"))->split, GPT_SPLIT_NONE);
    T_EQ_INT(gpt_tensor(m, gpt_find(m, "wpe.weight"))->split, GPT_SPLIT_NONE);
}

static void run_case(be_backend *be, gpt_block block, int W, int V) {
    int P = comm_group_size(tp), B = 2, T = 16, N = B * T;
    gpt_config c = {.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab = V, .seq_max = 20};
    c.block = block, c.attn_window = W;
    gpt_model *a, *b;
    T_EQ_INT(gpt_create(&a, &c, be, B, T), MS_OK);
    T_EQ_INT(gpt_create_tp(&b, &c, be, B, T, 16, tp), MS_OK);
    check_table(b, P);
    gpt_init(a, 77);
    gpt_init(b, 77);
    compare(a, gpt_params(a), b, gpt_params(b), -1, "init");
    int32_t *tok = malloc(sizeof(int32_t) * 2 * N), *tgt = malloc(sizeof(int32_t) * 2 * N);
    for (int i = 0; i < 2 * N; i++) /* the same on every rank */
        tok[i] = (i * 7919 + 13) % V, tgt[i] = (i * 104729 + 5) % V;
    tgt[0] = V - 1;
    gpt_zero_grads(a);
    gpt_zero_grads(b);
    for (int k = 0; k < 2; k++) { /* two micro-batches accumulate */
        float la = gpt_forward_backward(a, tok + k * N, tgt + k * N, B, T, 1.0f / (2 * N));
        float lb = gpt_forward_backward(b, tok + k * N, tgt + k * N, B, T, 1.0f / (2 * N));
        T_NEAR(lb / la, 1.0, 2e-6);
    }
    T_EQ_INT(gpt_take_error(b), MS_OK);
    double e = compare(a, gpt_grads(a), b, gpt_grads(b), GRAD_TOL, "grad");
    float fa = gpt_forward_loss(a, tok, tgt, B, T), fb = gpt_forward_loss(b, tok, tgt, B, T);
    T_NEAR(fb / fa, 1.0, 2e-6);
    /* a single-process file loads into the shards (and saves back the same) */
    const char *f1 = tpath("a.st"), *f2 = tpath("b.st");
    if (comm_group_rank(tp) == 0) T_EQ_INT(ckpt_hf_save(a, f1, CKPT_ST_F32), MS_OK);
    T_EQ_INT(comm_barrier(tp), MS_OK);
    gpt_init(b, 5);
    T_EQ_INT(ckpt_hf_load(b, f1), MS_OK);
    compare(a, gpt_params(a), b, gpt_params(b), -1, "load");
    T_EQ_INT(ckpt_hf_save(b, f2, CKPT_ST_F32), MS_OK);
    T_EQ_INT(comm_barrier(tp), MS_OK);
    gpt_init(a, 5);
    T_EQ_INT(ckpt_hf_load(a, f2), MS_OK);
    compare(a, gpt_params(a), b, gpt_params(b), -1, "save");
    if (comm_group_rank(tp) == 0)
        printf("tp %d %s W=%d V=%d: loss %.6f / %.6f, worst grad rel err %.2e\n", P,
               gpt_block_name(block), W, V, fa, fb, e);
    T_EQ_INT(comm_barrier(tp), MS_OK);
    free(tok);
    free(tgt);
    gpt_destroy(a);
    gpt_destroy(b);
}

int main(int argc, char **argv) {
    comm_world *w;
    comm_options co = ms_test_comm_options(); /* MS_COMM_TIMEOUT, MS_COMM_NCCL_SYNC */
    MS_CHECK(comm_world_init(&w, &argc, &argv, &co) == MS_OK);
    tp = comm_world_group(w);
    be_backend *be;
    MS_CHECK(be_cpu_create(&be, 1) == MS_OK);
    if (comm_group_rank(tp) == 0) MS_CHECK(ms_tmpdir_make("tp_model"));
    MS_CHECK(comm_broadcast(tp, tmpdir, sizeof tmpdir, COMM_U8, 0) == MS_OK); /* one dir */
    run_case(be, GPT_BLOCK_SERIAL, 0, 211);
    run_case(be, GPT_BLOCK_PARALLEL, 5, 256);
    run_case(be, GPT_BLOCK_SERIAL, 3, 300);
    /* errors: heads not divisible by tp */
    if (comm_group_size(tp) > 1) {
        gpt_config c = {.n_layer = 1, .n_head = 3, .n_embd = 48, .vocab = 100, .seq_max = 8};
        gpt_model *m;
        T_EQ_INT(gpt_create_tp(&m, &c, be, 1, 8, 16, tp), MS_ERR_ARG);
        T_STR_CONTAINS(ms_errmsg(), "heads");
        c.n_head = 4;
        T_EQ_INT(gpt_create_tp(&m, &c, be, 1, 7, 16, tp), MS_ERR_ARG);
        T_STR_CONTAINS(ms_errmsg(), "sequence parallelism");
    }
    if (comm_group_rank(tp) == 0) ms_tmpdir_remove();
    be_destroy(be);
    int rc = ms_test_summary("test_tp_model");
    MS_CHECK(comm_world_finalize(w) == MS_OK);
    return rc;
}
