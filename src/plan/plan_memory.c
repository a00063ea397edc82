/* plan_memory.c - memory per GPU: what the trainer allocates on a rank, buffer
 * by buffer (src/model/gpt_model.c's parameter table and activation arena,
 * src/optim, src/parallel/zero.c, src/train/train_pipeline.c, the
 * backend's op scratch and the peak probe's matrices), for every pipeline
 * stage; the busiest one counts.
 * With full recomputation (which the trainer does not run) the layers keep
 * their input only (Korthikanti et al. 2022) and one layer's activations
 * are rebuilt while its backward runs; with the trainer's --recompute gelu
 * or ln every block's GeLU or LayerNorm outputs share one buffer. */
#include <math.h>

#include "model/gpt.h"
#include "monitor/monitor.h"
#include "parallel/schedule.h"
#include "plan/plan.h"

/* The arena's pushes (base/arena.h, MS_ARENA_ALIGN) and the parameter table's
 * tensors (16 floats) are aligned. */
static double up(double bytes, double align) {
    return ceil(bytes / align) * align;
}
static double push(double bytes) {
    return up(bytes, 64);
}

/* The padded vocabulary (gpt_config_validate; a multiple of 128 tp with tp). */
static double vocab_pad(const plan_model *m, int tp) {
    double q = 128.0 * tp;
    return up(m->vocab, q);
}

/* A cluster of CPU machines (it has cores): the trainer's CPU backend. */
static int is_cpu(const plan_cluster *c) {
    return c->cores > 0;
}

/* Whether the attention keeps its score matrix: the CPU backend keeps
 * softmax's output, (B, heads, T, T) fp32; a GPU's flash kernel its
 * log-sum-exp, (B, heads, T). */
static int keeps_scores(const plan_cluster *c) {
    return is_cpu(c);
}

double plan_layer_act_bytes(const plan_model *m, int tp, int micro, plan_recompute rc, int flash,
                            double act_bytes) {
    double N = (double)micro * m->seq, C = m->dim, es = act_bytes;
    double Nl = N / tp, Ca = C / tp, F = 4 * C / tp, H = (double)m->heads / tp;
    if (rc == PLAN_RECOMPUTE_FULL) return push(Nl * C * es); /* the block's input */
    /* resid_in, ln1 (all-gathered: N rows), its mean and rstd, qkv, atty, the
     * attention state, fc_pre, fc_gelu; a serial block adds resid_mid, ln2 and its
     * statistics.  The trainer's --recompute gelu / ln point fc_gelu / ln1 and ln2 at the
     * model's one shared buffer (gpt_model.c push_layer): nothing of their own */
    int flags = plan_recompute_flags(rc);
    double scores = flash || rc == PLAN_RECOMPUTE_SELECTIVE ? 1 : m->seq;
    double ln = flags & GPT_RECOMPUTE_LN ? 0 : push(N * C * es);
    double gelu = flags & GPT_RECOMPUTE_GELU ? 0 : push(N * F * es);
    double b = push(Nl * C * es) + ln + 2 * push(Nl * 4) + push(N * 3 * Ca * es) +
               push(N * Ca * es) + push(micro * H * m->seq * scores * 4) + push(N * F * es) + gelu;
    if (!m->parallel_block) b += push(Nl * C * es) + ln + 2 * push(Nl * 4);
    return b;
}

/* One rank's parameter elements on pipeline stage s (gpt_model.c build_table):
 * each tensor aligned to 16 floats, each gradient range (wte; wpe; a block;
 * ln_f) to 16 dp (the trainer's range_align).  *wte: wte's padded range. */
static double stage_params(const plan_model *m, int t, int p, int d, int s, double *wte) {
    double C = m->dim, a = 16.0 * d, n = 0;
    int first = s == 0, last = s == p - 1;
    *wte = first || last ? up(up(vocab_pad(m, t) / t * C, 16), a) : 0;
    n += *wte;
    if (first) n += up(up((double)plan_seq_max(m) * C, 16), a); /* wpe: seq-max rows */
    /* a block: the split tensors (c_attn w b, c_fc w b: columns; the projections'
     * weights: rows) over t, LayerNorms and the projections' biases whole */
    double split[] = {C * 3 * C / t, 3 * C / t, C * C / t, C * 4 * C / t, 4 * C / t, 4 * C * C / t};
    double block = up(C, 16) * (m->parallel_block ? 4 : 6); /* ln_1 (ln_2) w b, 2 biases */
    for (size_t i = 0; i < sizeof split / sizeof *split; i++)
        block += up(split[i], 16);
    n += (double)m->layers / p * up(block, a);
    if (last) n += up(2 * up(C, 16), a); /* ln_f w b */
    return n;
}

/* Activation sets of stage s in closed form (plan.h): w + 1, and a set for the receive posted
 * a compute ahead where the stage receives activations. */
int plan_stage_sets(int pp, int vpp, int n_micro, int s) {
    par_sched_kind kind = vpp > 1 ? PAR_SCHED_INTERLEAVED : PAR_SCHED_1F1B;
    long long pairs = (long long)n_micro * vpp;
    long long sets = par_schedule_warmup(kind, pp, vpp, n_micro, s) + 1 + (vpp > 1 || s > 0);
    return (int)(sets < pairs ? sets : pairs);
}

/* The backend's op scratch (be->reserve with the model's limits).  CPU:
 * per-thread LayerNorm partials (2C) and attention dS blocks (64 x T), the
 * classifier's fp32 logits chunk (one process's tp only: the tensor-parallel
 * classifier keeps its chunk in the model), with 16-bit activations the fp32
 * copies (3 of B T 4C), a LayerNorm's weights and the chunk's 16-bit
 * gradient.  GPU: one buffer, the largest need; the classifier's bf16 chunk
 * (at most 512 MB) or the attention's D (B, heads, T) fp32. */
static double backend_scratch(const plan_model *m, const plan_cluster *c, int t, int micro) {
    double N = (double)micro * m->seq, C = m->dim, Vp = t > 1 ? 0 : vocab_pad(m, 1);
    if (keeps_scores(c)) {
        double th = c->threads >= 1 ? c->threads : 1;
        double cls = 0;
        if (Vp > 0) {
            double rows = fmin(fmax(floor((double)(64 << 20) / Vp), 16), N);
            rows = ceil(N / ceil(N / rows)); /* the fewest equal chunks */
            cls = rows * Vp;
        }
        double b = 4 * (th * up(2 * C, 16) + th * up(64.0 * m->seq, 16) + cls);
        if (c->act_bytes < 4) b += 4 * (3 * N * 4 * C + 2 * C) + 2 * cls;
        return b;
    }
    double cls = 0;
    if (Vp > 0) {
        double rows = floor((double)(512 << 20) / (Vp * 2));
        if (rows > 256) rows = floor(rows / 64) * 64;
        cls = fmin(fmax(rows, 1), N) * Vp * 2;
    }
    return fmax(cls, N * m->heads * 4);
}

/* The model's activation arena on a stage holding `sets` activation sets of
 * lc blocks (pp > 1), or every block (one stage): the blocks' saved tensors
 * and, once, the output stage and the backward's scratch (gpt_model.c
 * layout_acts). */
static double arena_bytes(const plan_model *m, const plan_layout *l, const plan_features *f,
                          const plan_cluster *c, int sets) {
    int t = l->tp, pipe = l->pp > 1;
    double N = (double)l->micro * m->seq, C = m->dim, es = c->act_bytes;
    double Nl = N / t, Ca = C / t, F = 4 * C / t, Vp = vocab_pad(m, t);
    double lc = (double)m->layers / (l->pp * l->vpp);
    double layer = plan_layer_act_bytes(m, t, l->micro, f->recompute, !keeps_scores(c), es);
    double a = pipe ? sets * lc * layer + push(sets * N * 4) + push(sets * Nl * C * es)
                    : m->layers * layer;
    int flags = plan_recompute_flags(f->recompute); /* the shared recompute buffers, once */
    if (flags & GPT_RECOMPUTE_GELU) a += push(N * F * es);
    if (flags & GPT_RECOMPUTE_LN) a += push(N * C * es);
    /* x_final, ln_f's output (N rows), mean, rstd; losses, tokens, targets */
    a += push(Nl * C * es) + push(N * C * es) + 2 * push(Nl * 4) + 3 * push(N * 4);
    /* the backward's one copy of scratch: dresid, dln, datty, tmp, the fp32 logits
     * row, dqkv, dfc, dfc_pre */
    a += push(Nl * C * es) + push(N * C * es) + push(N * Ca * es) + push(N * C * es) +
         push(Vp * 4) + push(N * 3 * Ca * es) + 2 * push(N * F * es);
    if (t == 1 && !pipe) a += push(N * C * 4) + push(N * 4); /* wte's rows (gpt_set_rows_hook) */
    if (t > 1) { /* dfull, the reduce-scatter's buffer, the vocabulary-parallel classifier */
        double rows = fmin(fmax(floor((double)(16 << 20) / (Vp / t)), 16), N);
        a += 2 * push(N * C * es) + push(rows * Vp / t * es) + push(t * rows * 3 * 4) +
             push(6 * C * 4);
    }
    if (f->recompute == PLAN_RECOMPUTE_FULL) /* the block whose backward recomputes it, less */
        a += plan_layer_act_bytes(m, t, l->micro, PLAN_RECOMPUTE_NONE, !keeps_scores(c), es) -
             push(Nl * C * es); /* its input, kept already (it was counted twice) */
    return a;
}

/* The peak probe's three n x n matrices (monitor.c probe_once), allocated on
 * top of everything the rank holds: the model, optimizer, arena and buffers
 * are all allocated before the first probe, and the warm-up's probes at steps
 * 2 and 3 find the same. */
static double probe_bytes(const plan_features *f, const plan_cluster *c) {
    if (!f->peak_probe) return 0;
    double n = mon_peak_probe_dim(!is_cpu(c), c->act_bytes < 4);
    return 3 * n * n * c->act_bytes;
}

ms_status plan_memory(const plan_model *m, const plan_layout *l, const plan_features *f,
                      const plan_cluster *c, plan_result *r) {
    int t = l->tp, p = l->pp, d = l->gpus / (l->tp * l->pp);
    int n_micro = l->batch / (d * l->micro);
    double gb = 1e9, es = c->act_bytes, N = (double)l->micro * m->seq;
    double best = -1;
    for (int s = 0; s < p; s++) {
        int sets = p > 1 ? plan_stage_sets(p, l->vpp, n_micro, s) : 1;
        double wte, n = stage_params(m, t, p, d, s, &wte);
        /* fp32 master weights (the only copy with fp32 activations) and the 16-bit
         * copy; fp32 gradients, whole; AdamW/LAMB's m and v: this rank's ZeRO shard */
        double params = n * 4 + (es < 4 ? n * es : 0), grads = n * 4, optim = 8 * n / d;
        double act = arena_bytes(m, l, f, c, sets) + backend_scratch(m, c, t, l->micro);
        if (p > 1) /* the send buffers of activations and gradients; the tied wte's copy */
            act += 2.0 * l->vpp * PAR_SEND_BUFS * (N / t * m->dim * es) + wte * 4;
        if (d > 1 && t == 1 && p == 1) /* ZeRO's all-gathered embedding rows */
            act += 4 * N * m->dim * d;
        if (d > 1 && keeps_scores(c)) /* wte's reduce-scatter by exchange (no NCCL) */
            act += 4 * (d - 1) * (wte / d);
        act += probe_bytes(f, c);
        double total = params + grads + optim + act;
        if (total <= best) continue;
        best = total;
        r->mem_params_gb = params / gb;
        r->mem_grads_gb = grads / gb;
        r->mem_optim_gb = optim / gb;
        r->mem_act_gb = act / gb;
        r->in_flight = sets;
    }
    r->mem_reserved_gb = c->reserved_gb;
    r->memory_gb =
        r->mem_params_gb + r->mem_grads_gb + r->mem_optim_gb + r->mem_act_gb + r->mem_reserved_gb;
    r->fits = r->memory_gb <= c->mem_gb;
    return MS_OK;
}
