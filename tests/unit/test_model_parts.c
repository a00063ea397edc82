/* test_model_parts.c - model configuration and parameter table, LR
 * schedules, the data loader's orders, cursor and windows, and the option
 * parser. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cli/opts.h"
#include "data/loader.h"
#include "data/shard.h"
#include "model/gpt.h"
#include "optim/optim.h"

static void test_config(void) {
    gpt_config c;
    T_EQ_INT(gpt_config_preset(&c, "d12"), MS_OK);
    T_EQ_INT(gpt_config_validate(&c), MS_OK);
    T_EQ_INT(c.vocab_pad, 50304);
    T_EQ_INT(gpt_config_num_params(&c), 124439808); /* Hugging Face's GPT-2 124M */
    T_EQ_INT(gpt_config_preset(&c, "d24"), MS_OK);
    T_EQ_INT(gpt_config_num_params(&c), 354823168); /* GPT-2 medium */
    T_EQ_INT(gpt_config_preset(&c, "nope"), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "nope");
    gpt_config_preset(&c, "d6");
    double f = gpt_flops_per_token(&c, 256);
    T_NEAR(f, 6.0 * (double)gpt_config_num_params(&c) + 12.0 * 6 * 256 * 384, 1);
    c.attn_window = 64;
    T_NEAR(gpt_flops_per_token(&c, 256),
           6.0 * (double)gpt_config_num_params(&c) + 12.0 * 6 * 64 * 384, 1);
    c.n_head = 7;
    T_EQ_INT(gpt_config_validate(&c), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "not divisible");
    gpt_config_preset(&c, "d6");
    c.seq_max = 10000000;
    T_EQ_INT(gpt_config_validate(&c), MS_OK);
    c.seq_max = 10000001; /* train's --seq-max range: an unbounded one was allocated */
    T_EQ_INT(gpt_config_validate(&c), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "seq-max must be in 1..10000000 (got 10000001)");
}

/* A model larger than the host's memory (dim 2^20: 53 TB of parameters) is
 * refused on the CPU backend before anything is allocated: MS_ERR_NOMEM
 * naming the need and the host's memory. */
static void test_host_memory(void) {
    be_backend *be;
    T_EQ_INT(be_cpu_create(&be, 1), MS_OK);
    T_OK(be_cpu_host_memory() > 0);
    gpt_config c;
    gpt_config_preset(&c, "d6");
    c.n_layer = 1;
    c.n_embd = 1 << 20;
    c.n_head = 1;
    c.vocab = 256;
    c.seq_max = 32;
    gpt_model *m = NULL;
    T_EQ_INT(gpt_create(&m, &c, be, 2, 16), MS_ERR_NOMEM);
    T_STR_CONTAINS(ms_errmsg(), "model: needs ");
    T_STR_CONTAINS(ms_errmsg(), "on backend cpu; this host has");
    T_OK(m == NULL);
    T_EQ_INT(be_cpu_check_host_memory("x", 1e3, "small"), MS_OK);
    be_destroy(be);
}

typedef struct {
    size_t b[16];
    int n;
} hook_log;

static void log_hook(void *ctx, size_t begin, size_t end) {
    hook_log *h = ctx;
    if (h->n < 8) {
        h->b[2 * h->n] = begin;
        h->b[2 * h->n + 1] = end;
    }
    h->n++;
}

typedef struct {
    int32_t ids[8];
    float rows[8 * 16];
    int n, calls;
} rows_log;

static void log_rows(void *ctx, const int32_t *ids, int n, const float *rows) {
    rows_log *r = ctx;
    r->calls++;
    r->n = n;
    memcpy(r->ids, ids, sizeof(int32_t) * (size_t)n);
    memcpy(r->rows, rows, sizeof(float) * 8 * 16); /* CPU backend: host memory */
}

/* One (1,8) micro-batch's gradients into g (host, n_elems). */
static void grads_of(gpt_model *m, const int32_t *tok, const int32_t *tgt, float *g) {
    gpt_zero_grads(m);
    gpt_forward_backward(m, tok, tgt, 1, 8, 1.0f / 8);
    memcpy(g, gpt_grads(m), sizeof(float) * gpt_num_elements(m));
}

/* The ranges partition the buffer in forward order (wte, wpe, blocks,
 * ln_f); the grad hook reports ln_f, the blocks last first, then the
 * embeddings; with a rows hook wte comes right after ln_f, wpe alone at
 * the end, and wte's gradient seen then plus the rows is the whole one. */
static void test_grad_hook(gpt_model *m) {
    size_t want[16];
    int n = gpt_grad_ranges(m, want, 8);
    T_EQ_INT(n, 5); /* wte, wpe, 2 blocks, ln_f */
    T_EQ_INT(want[0], 0);
    for (int i = 1; i < n; i++)
        T_EQ_INT(want[2 * i], want[2 * i - 1]); /* contiguous, in buffer order */
    T_EQ_INT(want[2 * n - 1], gpt_num_elements(m));
    const gpt_param *wte = gpt_tensor(m, gpt_find(m, "wte.weight"));
    const gpt_param *wpe = gpt_tensor(m, gpt_find(m, "wpe.weight"));
    T_EQ_INT(want[1] <= wpe->offset, 1); /* wte alone in its range */
    hook_log h = {{0}, 0};
    gpt_set_grad_hook(m, log_hook, &h);
    int32_t tok[8] = {5, 2, 3, 5, 9, 2, 7, 5}, tgt[8] = {2, 3, 4, 5, 6, 7, 8, 9};
    size_t ne = gpt_num_elements(m);
    float *g0 = malloc(ne * sizeof(float)), *g1 = malloc(ne * sizeof(float));
    T_OK(g0 && g1);
    grads_of(m, tok, tgt, g0);
    size_t order[] = {8, 9, 6, 7, 4, 5, 0, 3}; /* ln_f, block 1, block 0, wte..wpe */
    T_EQ_INT(h.n, 4);
    for (int i = 0; i < 8; i++)
        T_EQ_INT(h.b[i], want[order[i]]);
    h.n = 0;
    rows_log r = {{0}, {0}, 0, 0};
    T_EQ_INT(gpt_rows_max(m), 8);
    gpt_set_rows_hook(m, log_rows, &r);
    grads_of(m, tok, tgt, g1);
    gpt_set_rows_hook(m, NULL, NULL);
    gpt_set_grad_hook(m, NULL, NULL);
    size_t order2[] = {8, 9, 0, 1, 6, 7, 4, 5, 2, 3}; /* ln_f, wte, block 1, block 0, wpe */
    T_EQ_INT(h.n, 5);
    for (int i = 0; i < 10; i++)
        T_EQ_INT(h.b[i], want[order2[i]]);
    T_EQ_INT(r.calls, 1);
    T_EQ_INT(r.n, 5); /* distinct tokens 2 3 5 7 9, ascending */
    int32_t ids[5] = {2, 3, 5, 7, 9};
    T_OK(memcmp(r.ids, ids, sizeof ids) == 0);
    int C = wte->local[1];
    for (int j = 0; j < r.n; j++)
        for (int c = 0; c < C; c++)
            g1[wte->offset + (size_t)ids[j] * C + c] += r.rows[j * C + c];
    for (int k = r.n * C; k < 8 * C; k++)
        T_NEAR(r.rows[k], 0, 0);
    double worst = 0;
    for (size_t k = 0; k < ne; k++) {
        double d = fabs((double)g1[k] - g0[k]) / (fabs(g0[k]) + 1e-6);
        if (d > worst) worst = d;
    }
    T_NEAR(worst, 0, 1e-5);
    free(g0);
    free(g1);
}

static void test_table(void) {
    be_backend *be;
    gpt_model *m;
    gpt_config c = {2, 2, 16, 100, 0, 8, GPT_BLOCK_PARALLEL, 0, 0};
    T_EQ_INT(be_cpu_create(&be, 1), MS_OK);
    T_EQ_INT(gpt_create(&m, &c, be, 1, 8), MS_OK);
    T_EQ_INT(gpt_num_tensors(m), 2 + 2 * 10 + 2); /* no ln_2 in the parallel block */
    T_OK(gpt_find(m, "h.1.ln_2.weight") < 0);
    int t = gpt_find(m, "h.1.mlp.c_fc.weight");
    T_OK(t >= 0);
    T_EQ_INT(gpt_tensor(m, t)->shape[0], 16);
    T_EQ_INT(gpt_tensor(m, t)->shape[1], 64);
    T_EQ_INT(gpt_tensor(m, t)->decay, 1);
    T_EQ_INT(gpt_tensor(m, gpt_find(m, "h.0.attn.c_attn.bias"))->decay, 0);
    T_EQ_INT(gpt_tensor(m, gpt_find(m, "wte.weight"))->shape[0], 128); /* padded */
    /* init: deterministic, LN gains 1, padded rows 0, std about 0.02 */
    gpt_init(m, 5);
    const float *w = gpt_params(m);
    const gpt_param *wte = gpt_tensor(m, gpt_find(m, "wte.weight"));
    double ss = 0;
    for (size_t i = 0; i < 100 * 16; i++)
        ss += (double)w[wte->offset + i] * w[wte->offset + i];
    T_NEAR(sqrt(ss / 1600), 0.02, 0.002);
    T_EQ_INT(w[wte->offset + 100 * 16], 0);
    T_EQ_INT(w[wte->offset + 128 * 16 - 1], 0);
    T_NEAR(w[gpt_tensor(m, gpt_find(m, "ln_f.weight"))->offset], 1.0, 0);
    float first = w[wte->offset];
    gpt_init(m, 5);
    T_NEAR(gpt_params(m)[wte->offset], first, 0);
    test_grad_hook(m);
    gpt_destroy(m);
    be_destroy(be);
}

/* opt_step consumes the gradients: on success every element of the buffer
 * is +0.0, so the next micro-batch accumulates the same gradients as after
 * gpt_zero_grads; a non-finite step leaves them as they were. */
static void test_opt_consumes(opt_kind kind) {
    be_backend *be;
    gpt_model *m;
    opt_state *o;
    gpt_config c = {2, 2, 16, 100, 0, 8, GPT_BLOCK_SERIAL, 0, 0};
    T_EQ_INT(be_cpu_create(&be, 2), MS_OK);
    T_EQ_INT(gpt_create(&m, &c, be, 1, 8), MS_OK);
    gpt_init(m, 7);
    opt_config oc = {kind, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    T_EQ_INT(opt_create(&o, &oc, m, NULL), MS_OK);
    size_t ne = gpt_num_elements(m);
    float *g = gpt_grads(m), *want = malloc(ne * sizeof(float)), *was = malloc(ne * sizeof(float));
    T_OK(want && was);
    int32_t tok[8] = {5, 2, 3, 5, 9, 2, 7, 5}, tgt[8] = {2, 3, 4, 5, 6, 7, 8, 9};
    opt_stats st;
    for (int s = 0; s < 2; s++) {
        if (s == 0) gpt_zero_grads(m);
        gpt_forward_backward(m, tok, tgt, 1, 8, 1.0f / 8);
        if (s == 1) { /* no zeroing since the first update: the same as zeroed */
            memcpy(was, g, ne * sizeof(float));
            grads_of(m, tok, tgt, want);
            T_OK(memcmp(was, want, ne * sizeof(float)) == 0);
        }
        size_t nonzero = 0;
        for (size_t i = 0; i < ne; i++)
            nonzero += g[i] != 0.0f;
        T_OK(nonzero > ne / 2);
        T_EQ_INT(opt_step(o, 1e-3f, &st), MS_OK);
        size_t left = 0;
        for (size_t i = 0; i < ne; i++)
            left += g[i] != 0.0f || signbit(g[i]);
        T_EQ_INT(left, 0);
    }
    gpt_forward_backward(m, tok, tgt, 1, 8, 1.0f / 8);
    g[ne / 2] = NAN;
    memcpy(was, g, ne * sizeof(float));
    T_EQ_INT(opt_step(o, 1e-3f, &st), MS_ERR_NONFINITE);
    T_OK(memcmp(was, g, ne * sizeof(float)) == 0);
    free(want);
    free(was);
    opt_destroy(o);
    gpt_destroy(m);
    be_destroy(be);
}

static void test_schedule(void) {
    opt_schedule s = {OPT_SCHED_COSINE, 1.0f, 10, 111, 0.1f};
    T_NEAR(opt_lr_at(&s, 0), 0.1, 1e-7);
    T_NEAR(opt_lr_at(&s, 9), 1.0, 1e-7);
    T_NEAR(opt_lr_at(&s, 10), 1.0, 1e-7);
    T_NEAR(opt_lr_at(&s, 60), 0.55, 1e-6);
    T_NEAR(opt_lr_at(&s, 110), 0.1, 1e-7);
    T_NEAR(opt_lr_at(&s, 500), 0.1, 1e-7);
    s.kind = OPT_SCHED_CONSTANT;
    T_NEAR(opt_lr_at(&s, 100), 1.0, 0);
}

/* A shard whose token i is start + i, so tokens name their position. */
static void write_seq_shard(const char *path, uint32_t n, uint32_t start) {
    data_shard_writer w;
    T_EQ_INT(data_shard_writer_open(&w, path, 1), MS_OK);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t t = start + i;
        data_shard_writer_put(&w, &t, 1);
    }
    T_EQ_INT(data_shard_writer_commit(&w), MS_OK);
}

/* The file order and data_loader_windows (the fixed validation set):
 * windows of T+1 at stride T, shard by shard from each start, read by
 * index without moving the cursor; no per-shard size check, and a range
 * past the last window is an error naming the pattern. */
static void test_windows(const char *pat, const char *dir) {
    data_loader_config c = {pat, 64, 10, 60000, DATA_ORDER_FILE, 1, 0, 1, 1}; /* B > a shard */
    data_loader *dl;
    T_EQ_INT(data_loader_open(&dl, &c), MS_OK);
    T_EQ_INT((int)data_loader_num_windows(dl), 99 + 49);
    int32_t in[3 * 10], tg[3 * 10];
    T_EQ_INT(data_loader_windows(dl, 0, 3, in, tg), MS_OK);
    T_EQ_INT(in[0], 0);
    T_EQ_INT(in[10], 10);
    T_EQ_INT(in[29], 29);
    T_EQ_INT(tg[9], 10);
    T_EQ_INT(tg[29], 30);
    T_EQ_INT(data_loader_windows(dl, 98, 2, in, tg),
             MS_OK); /* the last of a_000, the first of a_001 */
    T_EQ_INT(in[0], 980);
    T_EQ_INT(tg[9], 990);
    T_EQ_INT(in[10], 1000);
    T_EQ_INT(tg[19], 1010);
    T_EQ_INT(data_loader_windows(dl, 147, 1, in, tg), MS_OK);
    T_EQ_INT(in[0], 1480);
    T_EQ_INT(tg[9], 1490);
    T_EQ_INT(data_loader_windows(dl, 147, 2, in, tg), MS_ERR_RANGE);
    T_STR_CONTAINS(ms_errmsg(), "a_*.bin");
    T_STR_CONTAINS(ms_errmsg(), "holds 148");
    int32_t b[64 * 10], bt[64 * 10]; /* the cursor did not move: batch 0 is windows 0..63 */
    T_EQ_INT(data_loader_next(dl, b, bt), MS_OK);
    T_EQ_INT(b[0], 0);
    T_EQ_INT(b[63 * 10], 630);
    data_loader_close(dl);
    /* a shard shorter than T+1 holds no window, and is no error */
    char path[512], tiny[512];
    snprintf(path, sizeof path, "%s/t_000.bin", dir);
    write_seq_shard(path, 5, 0);
    snprintf(path, sizeof path, "%s/t_001.bin", dir);
    write_seq_shard(path, 21, 100);
    snprintf(tiny, sizeof tiny, "%s/t_*.bin", dir);
    c.pattern = tiny;
    T_EQ_INT(data_loader_open(&dl, &c), MS_OK);
    T_EQ_INT((int)data_loader_num_windows(dl), 2);
    T_EQ_INT(data_loader_windows(dl, 0, 2, in, tg), MS_OK);
    T_EQ_INT(in[0], 100);
    T_EQ_INT(in[10], 110);
    data_loader_close(dl);
}

static void test_loader(const char *dir) {
    char path[512], pat[512];
    snprintf(path, sizeof path, "%s/a_000.bin", dir);
    write_seq_shard(path, 1000, 0);
    snprintf(path, sizeof path, "%s/a_001.bin", dir);
    write_seq_shard(path, 500, 1000);
    snprintf(pat, sizeof pat, "%s/a_*.bin", dir);
    int32_t in[4 * 10], tg[4 * 10];
    /* sequential: batch k = tokens from k*B*T, llm.c's order */
    data_loader_config c = {pat, 4, 10, 60000, DATA_ORDER_SEQUENTIAL, 1, 0, 1, 1};
    data_loader *dl;
    T_EQ_INT(data_loader_open(&dl, &c), MS_OK);
    T_EQ_INT(data_loader_num_shards(dl), 2);
    for (int k = 0; k < 3; k++) {
        T_EQ_INT(data_loader_next(dl, in, tg), MS_OK);
        T_EQ_INT(in[0], k * 40);
        T_EQ_INT(in[39], k * 40 + 39);
        T_EQ_INT(tg[39], k * 40 + 40);
        T_EQ_INT(tg[9], in[10]);
    }
    /* a checkpoint's cursor that the shards cannot hold (the data set
     * changed): refused, naming the pattern, the index and the count, and the
     * loader stays where it was (issue 13, defect 1) */
    data_cursor here = data_loader_cursor(dl), far = {0, 2, 0, 0}, huge = {0, 1ull << 40, 0, 0};
    data_cursor past = {0, 1, 501, 0}, end = {0, 1, 480, 0};
    T_EQ_INT(data_loader_seek(dl, far), MS_ERR_RANGE);
    T_STR_CONTAINS(ms_errmsg(), "a_*.bin");
    T_STR_CONTAINS(ms_errmsg(), "shard index 2, but the data has 2 shard(s)");
    T_EQ_INT(data_loader_seek(dl, huge), MS_ERR_RANGE);
    T_STR_CONTAINS(ms_errmsg(), "shard index 1099511627776");
    T_EQ_INT(data_loader_seek(dl, past), MS_ERR_RANGE);
    T_STR_CONTAINS(ms_errmsg(), "token 501 of shard index 1");
    T_STR_CONTAINS(ms_errmsg(), "a_001.bin), which has only 500 tokens");
    T_EQ_INT((int)data_loader_cursor(dl).pos, (int)here.pos);
    T_EQ_INT(data_loader_next(dl, in, tg), MS_OK);
    T_EQ_INT(in[0], 3 * 40);
    /* near the end of the last shard: the next batch wraps to the first */
    T_EQ_INT(data_loader_seek(dl, end), MS_OK);
    T_EQ_INT(data_loader_next(dl, in, tg), MS_OK);
    T_EQ_INT(in[0], 0);
    T_EQ_INT((int)data_loader_cursor(dl).epoch, 1);
    data_loader_close(dl);
    /* shuffle: every window once per epoch, deterministic, resumable */
    c.order = DATA_ORDER_SHUFFLE;
    c.B = 3;
    T_EQ_INT(data_loader_open(&dl, &c), MS_OK);
    int nw = 999 / 10 + 499 / 10; /* 99 + 49 windows */
    int *seen = calloc(1500, sizeof(int));
    int32_t in3[30], tg3[30], first[30];
    for (int b = 0; b < nw / 3; b++) {
        T_EQ_INT(data_loader_next(dl, in3, tg3), MS_OK);
        if (b == 0) memcpy(first, in3, sizeof first);
        for (int r = 0; r < 3; r++) {
            int off = in3[r * 10] < 1000 ? in3[r * 10] : in3[r * 10] - 1000;
            T_EQ_INT(off % 10, 0); /* windows start at multiples of T in their shard */
            T_EQ_INT(tg3[r * 10], in3[r * 10] + 1);
            seen[in3[r * 10]]++;
        }
    }
    int dup = 0;
    for (int i = 0; i < 1500; i++)
        dup += seen[i] > 1;
    T_EQ_INT(dup, 0);
    data_cursor cur = data_loader_cursor(dl);
    T_EQ_INT(data_loader_next(dl, in3, tg3), MS_OK);
    int32_t after[30];
    memcpy(after, in3, sizeof after);
    T_EQ_INT(data_loader_seek(dl, cur), MS_OK);
    T_EQ_INT(data_loader_next(dl, in3, tg3), MS_OK);
    T_OK(memcmp(after, in3, sizeof after) == 0);
    data_loader_close(dl);
    T_EQ_INT(data_loader_open(&dl, &c), MS_OK);
    T_EQ_INT(data_loader_next(dl, in3, tg3), MS_OK);
    T_OK(memcmp(first, in3, sizeof first) == 0);
    data_loader_close(dl);
    free(seen);
    /* data parallel: ranks 0 and 1 with B=2 together read what one rank with
     * B=4 reads, in both orders, batch after batch (including epoch wraps) */
    for (int order = 0; order < 2; order++) {
        data_loader_config one = {pat, 4, 10, 60000, (data_order)order, 7, 0, 1, 1};
        data_loader_config r0 = {pat, 2, 10, 60000, (data_order)order, 7, 0, 2, 1};
        data_loader_config r1 = {pat, 2, 10, 60000, (data_order)order, 7, 1, 2, 1};
        data_loader *l1, *l0r, *l1r;
        T_EQ_INT(data_loader_open(&l1, &one), MS_OK);
        T_EQ_INT(data_loader_open(&l0r, &r0), MS_OK);
        T_EQ_INT(data_loader_open(&l1r, &r1), MS_OK);
        int same = 1;
        for (int b = 0; b < 60; b++) {
            int32_t a[40], at[40], x[20], xt[20], y[20], yt[20];
            data_loader_next(l1, a, at);
            data_loader_next(l0r, x, xt);
            data_loader_next(l1r, y, yt);
            same &= !memcmp(a, x, sizeof x) && !memcmp(a + 20, y, sizeof y);
            same &= !memcmp(at, xt, sizeof xt) && !memcmp(at + 20, yt, sizeof yt);
        }
        T_OK(same);
        data_loader_close(l1);
        data_loader_close(l0r);
        data_loader_close(l1r);
        /* ... and with gradient accumulation (B=1, 2 calls a step on each of
         * 2 ranks): call j of rank r reads row 2j + r of the one-rank batch;
         * a step's batch moves to the next shard whole (sequential: a
         * per-call decision split the step at 960 of a_000's 1000 tokens) */
        data_loader_config a0 = {pat, 1, 10, 60000, (data_order)order, 7, 0, 2, 2};
        data_loader_config a1 = {pat, 1, 10, 60000, (data_order)order, 7, 1, 2, 2};
        T_EQ_INT(data_loader_open(&l1, &one), MS_OK);
        T_EQ_INT(data_loader_open(&l0r, &a0), MS_OK);
        T_EQ_INT(data_loader_open(&l1r, &a1), MS_OK);
        for (int b = 0; b < 60; b++) {
            int32_t a[40], at[40], x[10], xt[10];
            data_loader_next(l1, a, at);
            for (int j = 0; j < 4; j++) {
                data_loader_next(j % 2 ? l1r : l0r, x, xt);
                same &= !memcmp(a + 10 * j, x, sizeof x);
                same &= !memcmp(at + 10 * j, xt, sizeof xt);
            }
        }
        T_OK(same);
        data_loader_close(l1);
        data_loader_close(l0r);
        data_loader_close(l1r);
    }
    /* too small for one batch */
    c.order = DATA_ORDER_SEQUENTIAL;
    c.B = 64;
    T_EQ_INT(data_loader_open(&dl, &c), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "a_001.bin");
    test_windows(pat, dir);
}

typedef struct {
    int n;
    double x;
    char *s;
    int k;
    double b, r;
    opts_list l;
} demo_opts;

/* The range column: each bound, open or closed, from every source; a
 * DOUBLE is finite even without a range. */
static void test_opts_ranges(const char *dir) {
    opts_spec spec[] = {
        {"x", OPT_T_DOUBLE, offsetof(demo_opts, x), "0.5", "any number", NULL, NULL, 0, 0},
        {"k", OPT_T_INT, offsetof(demo_opts, k), "1", "a count", "MS_TEST_DEMO_K", "[1,8]", 0, 0},
        {"b", OPT_T_DOUBLE, offsetof(demo_opts, b), "0.9", "a decay", NULL, "[0,1)", 0, 0},
        {"r", OPT_T_DOUBLE, offsetof(demo_opts, r), "1e-3", "a rate", NULL, "(0,)", 0, 0},
    };
    const int n = (int)(sizeof spec / sizeof spec[0]);
    demo_opts o = {0};
    char *pos[1];
    int np, help;
    char *good[] = {"--k", "8", "--b", "0", "--r", "1e-30", "--x", "-1e300"};
    T_EQ_INT(opts_parse(spec, n, &o, 8, good, pos, 0, &np, &help), MS_OK);
    T_EQ_INT(o.k, 8);
    T_NEAR(o.b, 0, 0);
    char *sub[] = {"--r", "1e-310"}; /* subnormal: strtod says ERANGE, the value is fine */
    T_EQ_INT(opts_parse(spec, n, &o, 2, sub, pos, 0, &np, &help), MS_OK);
    T_NEAR(o.r, 1e-310, 1e-320);
    struct {
        const char *opt, *val, *needle;
    } bad[] = {
        {"--k", "0", "--k must be in [1,8], got '0'"},
        {"--k", "9", "--k must be in [1,8], got '9'"},
        {"--k", "-1", "--k must be in [1,8]"},
        {"--b", "1", "--b must be in [0,1), got '1'"},
        {"--b", "-0.1", "--b must be in [0,1)"},
        {"--b", "nan", "--b expects a finite number, got 'nan'"},
        {"--r", "0", "--r must be > 0, got '0'"},
        {"--r", "-inf", "--r expects a finite number"},
        {"--r", "inf", "--r expects a finite number"},
        {"--x", "inf", "--x expects a finite number, got 'inf'"},
        {"--x", "NaN", "--x expects a finite number"},
        {"--x", "1e999", "--x: '1e999' is beyond the largest number"},
        {"--r", "1e-400", "--r must be > 0, got '1e-400'"}, /* underflow: 0, then the range */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *a[] = {(char *)bad[i].opt, (char *)bad[i].val};
        T_EQ_INT(opts_parse(spec, n, &o, 2, a, pos, 0, &np, &help), MS_ERR_ARG);
        T_STR_CONTAINS(ms_errmsg(), bad[i].needle);
        T_STR_CONTAINS(ms_errmsg(), "command line");
    }
    /* a config file and the environment are held to the same range */
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/range.cfg", dir);
    FILE *f = fopen(cfg, "w");
    fprintf(f, "k = 2\nb = 1.5\n");
    fclose(f);
    char *a1[] = {"--config", cfg};
    T_EQ_INT(opts_parse(spec, n, &o, 2, a1, pos, 0, &np, &help), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "range.cfg:2: --b must be in [0,1), got '1.5'");
    setenv("MS_TEST_DEMO_K", "100", 1);
    T_EQ_INT(opts_parse(spec, n, &o, 0, NULL, pos, 0, &np, &help), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "environment MS_TEST_DEMO_K: --k must be in [1,8], got '100'");
    unsetenv("MS_TEST_DEMO_K");
    /* a default outside its range is refused like any other value */
    spec[1].def = "0";
    T_EQ_INT(opts_parse(spec, n, &o, 0, NULL, pos, 0, &np, &help), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "default: --k");
    opts_free(spec, n, &o);
}

/* A STR option's choices (its range "a|bb|c"): a value that is none of
 * them refused from every source, the source named (a variable's name);
 * --config with a UTF-8 byte-order mark read as without it. */
static void test_opts_choices(const char *dir) {
    opts_spec spec[] = {
        {"s", OPT_T_STR, offsetof(demo_opts, s), "a", "a choice", "MS_TEST_DEMO_S", "a|bb|c", 0, 0},
        {"k", OPT_T_INT, offsetof(demo_opts, k), "1", "a count", NULL, "[1,8]", 0, 0},
    };
    const int n = (int)(sizeof spec / sizeof spec[0]);
    demo_opts o = {0};
    char *pos[1];
    int np, help;
    char *good[] = {"--s", "bb"};
    T_EQ_INT(opts_parse(spec, n, &o, 2, good, pos, 0, &np, &help), MS_OK);
    T_OK(!strcmp(o.s, "bb"));
    const char *bad[] = {"b", "bbb", "", "a|bb", "C"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *a[] = {"--s", (char *)bad[i]};
        T_EQ_INT(opts_parse(spec, n, &o, 2, a, pos, 0, &np, &help), MS_ERR_ARG);
        T_STR_CONTAINS(ms_errmsg(), "command line: --s: \"");
        T_STR_CONTAINS(ms_errmsg(), "\" is not a, bb or c");
    }
    setenv("MS_TEST_DEMO_S", "fp16", 1);
    T_EQ_INT(opts_parse(spec, n, &o, 0, NULL, pos, 0, &np, &help), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "environment MS_TEST_DEMO_S: --s: \"fp16\" is not a, bb or c");
    unsetenv("MS_TEST_DEMO_S");
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/bom.cfg", dir);
    FILE *f = fopen(cfg, "w");
    fprintf(f, "\xEF\xBB\xBFk = 3\ns = c\n");
    fclose(f);
    char *a1[] = {"--config", cfg};
    T_EQ_INT(opts_parse(spec, n, &o, 2, a1, pos, 0, &np, &help), MS_OK);
    T_EQ_INT(o.k, 3);
    T_OK(!strcmp(o.s, "c"));
    opts_free(spec, n, &o);
}

/* A repeatable option: each occurrence appends, a later source replaces an
 * earlier one's list (the command line a config file's), JSON as an array. */
static void test_opts_list(const char *dir) {
    opts_spec spec[] = {
        {"in", OPT_T_LIST, offsetof(demo_opts, l), "d", "inputs", NULL, NULL, 0, 0},
        {"n", OPT_T_INT, offsetof(demo_opts, n), "3", "an int", NULL, NULL, 0, 0},
    };
    demo_opts o = {0};
    char *pos[1];
    int np, help;
    T_EQ_INT(opts_parse(spec, 2, &o, 0, NULL, pos, 0, &np, &help), MS_OK);
    T_EQ_INT(o.l.n, 1);
    T_OK(!strcmp(o.l.v[0], "d"));
    char *a1[] = {"--in", "a", "--n", "4", "--in=b:2"};
    T_EQ_INT(opts_parse(spec, 2, &o, 5, a1, pos, 0, &np, &help), MS_OK);
    T_EQ_INT(o.l.n, 2);
    T_OK(!strcmp(o.l.v[0], "a") && !strcmp(o.l.v[1], "b:2"));
    char *js = opts_to_json(spec, 2, &o, NULL);
    T_STR_CONTAINS(js, "\"in\":[\"a\",\"b:2\"]");
    free(js);
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/list.cfg", dir);
    FILE *f = fopen(cfg, "w");
    fprintf(f, "in = x\nn = 5\nin = y\n");
    fclose(f);
    char *a2[] = {"--config", cfg};
    T_EQ_INT(opts_parse(spec, 2, &o, 2, a2, pos, 0, &np, &help), MS_OK);
    T_EQ_INT(o.l.n, 2);
    T_OK(!strcmp(o.l.v[0], "x") && !strcmp(o.l.v[1], "y"));
    char *a3[] = {"--config", cfg, "--in", "z"};
    T_EQ_INT(opts_parse(spec, 2, &o, 4, a3, pos, 0, &np, &help), MS_OK);
    T_EQ_INT(o.l.n, 1);
    T_OK(!strcmp(o.l.v[0], "z"));
    T_EQ_INT(o.n, 5);
    opts_free(spec, 2, &o);
    T_EQ_INT(o.l.n, 0);
    T_OK(o.l.v == NULL);
}

static void test_opts(const char *dir) {
    opts_spec spec[] = {
        {"n", OPT_T_INT, offsetof(demo_opts, n), "3", "an int", NULL, NULL, 0, 0},
        {"x", OPT_T_DOUBLE, offsetof(demo_opts, x), "0.5", "a number", "MS_TEST_DEMO_X", NULL, 0,
         0},
        {"s", OPT_T_STR, offsetof(demo_opts, s), "hi", "a string", NULL, NULL, 0, 0},
    };
    demo_opts o = {0};
    char *pos[2];
    int np, help;
    char *a1[] = {"--n", "7", "--s=abc", "file"};
    T_EQ_INT(opts_parse(spec, 3, &o, 4, a1, pos, 2, &np, &help), MS_OK);
    T_EQ_INT(o.n, 7);
    T_NEAR(o.x, 0.5, 0);
    T_OK(!strcmp(o.s, "abc"));
    T_EQ_INT(np, 1);
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/c.cfg", dir);
    FILE *f = fopen(cfg, "w");
    fprintf(f, "# comment\nn = 9\nx=2.5 # trailing\n");
    fclose(f);
    char *a2[] = {"--config", cfg, "--x", "4"};
    T_EQ_INT(opts_parse(spec, 3, &o, 4, a2, pos, 2, &np, &help), MS_OK);
    T_EQ_INT(o.n, 9);
    T_NEAR(o.x, 4, 0); /* command line wins */
    char *a3[] = {"--n", "1.5"};
    T_EQ_INT(opts_parse(spec, 3, &o, 2, a3, pos, 2, &np, &help), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "--n expects an integer");
    char *a4[] = {"--nope", "1"};
    T_EQ_INT(opts_parse(spec, 3, &o, 2, a4, pos, 2, &np, &help), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "--nope");
    char *a5[] = {"--n"};
    T_EQ_INT(opts_parse(spec, 3, &o, 1, a5, pos, 2, &np, &help), MS_ERR_ARG);
    /* the environment column: over the config file, under the command line */
    setenv("MS_TEST_DEMO_X", "6.5", 1);
    char *a6[] = {"--config", cfg};
    T_EQ_INT(opts_parse(spec, 3, &o, 2, a6, pos, 2, &np, &help), MS_OK);
    T_NEAR(o.x, 6.5, 0);
    T_EQ_INT(opts_parse(spec, 3, &o, 4, a2, pos, 2, &np, &help), MS_OK);
    T_NEAR(o.x, 4, 0);
    setenv("MS_TEST_DEMO_X", "six", 1);
    T_EQ_INT(opts_parse(spec, 3, &o, 0, NULL, pos, 2, &np, &help), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "environment MS_TEST_DEMO_X");
    unsetenv("MS_TEST_DEMO_X");
    /* a NUL byte is named, not a silent end of the file; /dev/zero ends */
    f = fopen(cfg, "wb");
    fwrite("n = 9\nx = 1\0\ns = 1\n", 1, 20, f);
    fclose(f);
    T_EQ_INT(opts_parse(spec, 3, &o, 2, a6, pos, 2, &np, &help), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "c.cfg:2: a NUL byte");
    char *a7[] = {"--config", "/dev/zero"};
    T_EQ_INT(opts_parse(spec, 3, &o, 2, a7, pos, 2, &np, &help), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "/dev/zero: larger than");
    /* train_data = "a b.bin": the key's underscores are dashes, the quotes go */
    opts_spec named[] = {
        {"train-data", OPT_T_STR, offsetof(demo_opts, s), NULL, "a path", NULL, NULL, 0, 0},
        {"n", OPT_T_INT, offsetof(demo_opts, n), "3", "an int", NULL, NULL, 0, 0},
    };
    demo_opts q = {0};
    f = fopen(cfg, "w");
    fprintf(f, "train_data = \"shards/a b.bin\"  # quoted\nn = '5'\n");
    fclose(f);
    T_EQ_INT(opts_parse(named, 2, &q, 2, a6, pos, 2, &np, &help), MS_OK);
    T_OK(q.s && !strcmp(q.s, "shards/a b.bin"));
    T_EQ_INT(q.n, 5);
    opts_free(named, 2, &q);
    char *js = opts_to_json(spec, 3, &o, NULL);
    T_STR_CONTAINS(js, "\"n\":");
    T_STR_CONTAINS(js, "\"s\":\"hi\"");
    free(js);
    const char *const secret[] = {"s", NULL}; /* a secret's value is never written */
    js = opts_to_json(spec, 3, &o, secret);
    T_STR_CONTAINS(js, "\"s\":\"(secret)\"");
    T_OK(js && !strstr(js, "hi"));
    free(js);
    opts_free(spec, 3, &o);
}

/* A bare-able flag (opts_spec.bare): `--k` alone is 1; the next argument
 * is its value only when it reads as an integer (then its range applies);
 * `--k=0` always is; an option or a positional after it is left alone. */
static void test_opts_bare(void) {
    typedef struct {
        const char *what;
        int argc;
        char *argv[3];
        ms_status rc;
        int k, n, npos;
        const char *err; /* in the message when rc is an error */
    } bare_case;
    static const bare_case cases[] = {
        {"bare, last", 1, {"--k"}, MS_OK, 1, 3, 0, NULL},
        {"--k 0", 2, {"--k", "0"}, MS_OK, 0, 3, 0, NULL},
        {"--k 1", 2, {"--k", "1"}, MS_OK, 1, 3, 0, NULL},
        {"--k=0", 1, {"--k=0"}, MS_OK, 0, 3, 0, NULL},
        {"--k=1", 1, {"--k=1"}, MS_OK, 1, 3, 0, NULL},
        {"bare, then an option", 3, {"--k", "--n", "7"}, MS_OK, 1, 7, 0, NULL},
        {"bare, then a positional", 2, {"--k", "DIR"}, MS_OK, 1, 3, 1, NULL},
        {"bare, then a number-like positional", 2, {"--k", "0x"}, MS_OK, 1, 3, 1, NULL},
        {"--k 2: out of range", 2, {"--k", "2"}, MS_ERR_ARG, 0, 3, 0, "--k must be in [0,1]"},
        {"--k -1: out of range", 2, {"--k", "-1"}, MS_ERR_ARG, 0, 3, 0, "--k must be in [0,1]"},
        {"--k=: not a value", 1, {"--k="}, MS_ERR_ARG, 0, 3, 0, "--k expects an integer"},
        {"--n still needs its value", 2, {"--k", "--n"}, MS_ERR_ARG, 0, 3, 0, "--n needs a value"},
    };
    opts_spec spec[] = {
        OPTS_FLAG("k", demo_opts, k, "a flag"),
        {"n", OPT_T_INT, offsetof(demo_opts, n), "3", "an int", NULL, NULL, 0, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const bare_case *t = &cases[c];
        demo_opts o = {0};
        char *pos[1] = {NULL}, *argv[3];
        int np = 0, help = 0;
        memcpy(argv, t->argv, sizeof argv);
        ms_status st = opts_parse(spec, 2, &o, t->argc, argv, pos, 1, &np, &help);
        if (st != t->rc) fprintf(stderr, "case '%s': %s\n", t->what, ms_errmsg());
        T_EQ_INT(st, t->rc);
        if (t->rc != MS_OK) {
            T_STR_CONTAINS(ms_errmsg(), t->err);
            continue;
        }
        T_EQ_INT(o.k, t->k);
        T_EQ_INT(o.n, t->n);
        T_EQ_INT(np, t->npos);
        if (t->npos) T_OK(pos[0] == argv[1]);
    }
}

int main(void) {
    char dir[] = "/tmp/ms_parts_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_config();
    test_host_memory();
    test_table();
    test_schedule();
    test_opt_consumes(OPT_ADAMW);
    test_opt_consumes(OPT_LAMB);
    test_loader(dir);
    test_opts(dir);
    test_opts_list(dir);
    test_opts_ranges(dir);
    test_opts_choices(dir);
    test_opts_bare();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return ms_test_summary("test_model_parts");
}
