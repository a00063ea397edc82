/* train_pipeline.c - runs one stage's pipeline schedule (par_schedule) over
 * a stage model (gpt_create_stage): the step's FWD / BWD of (micro-batch,
 * chunk) pairs on their activation sets (par_schedule_slots), activations
 * and gradients between stages as non-blocking sends / receives over the pp
 * group, posted and waited where the schedule says; then the sum of the
 * tied wte copies over the "embedding" group (first and last stage of each
 * (tp, dp) column) and the loss from the last stage to every stage.
 *
 * Overlap (--overlap pp, train_pipe_set_overlap).  Both lists are built at
 * plan time, each with its own activation-set map; the model gets as many
 * sets as the larger needs.  On: the decoupled PAR_COMM_OVERLAP list
 * (MegaScale's warm-up / steady / cool-down rules, see schedule.h), and the
 * tied-embedding sum overlapped with the first stage's cool-down: the last
 * stage's wte gradient is final after its last FWD of the last global
 * chunk (the classifier's backward runs there), so it posts the send of it
 * and the receive of the first stage's copy at once and goes on with its
 * cool-down; the first stage has posted the matching receive at the start
 * of the step, so the transfer runs while it computes; after its last BWD
 * it sends its own copy.  At the end each side adds the other's copy into
 * its own (be->add_f32): g0 + g1 on the first stage, g1 + g0 on the last,
 * the same bits, since one float addition of two operands is commutative,
 * and the bits the two-rank all-reduce gives.  Off: the coupled
 * PAR_COMM_BLOCKING list and a blocking all-reduce of the wte gradients
 * after the schedule.  The FWD/BWD order is the same, so the losses and
 * weights are bitwise those of overlap on (tests/mpi/test_overlap_pp.py).
 *
 * Buffers, all allocated at setup: the model's activation sets,
 * PAR_SEND_BUFS activation and as many gradient send buffers per local
 * chunk ((Nl,C) each; micro-batch mb uses buffer mb % PAR_SEND_BUFS, and
 * the schedule waits a send before its buffer is rewritten), one request
 * per posted op, and on the first and last stage one wte-sized f32
 * receive buffer for the other stage's copy.  Messages carry tag
 * 1 + (kind*G + sender's global chunk)*n_micro + mb (kind 0: activation, 1:
 * gradient; G = pp*vpp chunks), so each send matches exactly its receive. */
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "comm/grid.h"
#include "parallel/schedule.h"
#include "train/train_internal.h"

/* One communication mode's instruction list and its activation sets. */
typedef struct {
    par_instr *list;
    int n, n_slots;
    int *slot; /* [mb*vpp + chunk] */
} pipe_list;

struct train_pipe {
    comm_group *ppg, *emb; /* pipeline group (rank == stage); embedding group or NULL */
    int pp, vpp, stage, n_micro, G;
    pipe_list lists[2];  /* [PAR_COMM_OVERLAP], [PAR_COMM_BLOCKING] */
    const pipe_list *on; /* the one train_pipe_step runs (train_pipe_set_overlap) */
    int n_slots;         /* activation sets of the model: the larger count */
    gpt_model *m;
    be_backend *be;
    size_t rows;                  /* elements of one (Nl,C) message */
    comm_dtype act_dt;            /* their dtype: the backend's act dtype */
    void **act_send, **grad_send; /* [vpp * PAR_SEND_BUFS] device buffers */
    comm_req **req;               /* [4][n_micro*vpp]: SEND_ACT .. RECV_GRAD */
    /* the tied embedding (ends only): wte's gradient range, the other
     * stage's copy (device, f32), the exchange's two requests */
    size_t wte_off, wte_n;
    float *wte_peer;
    comm_req *emb_send, *emb_recv;
    double bubble; /* seconds waited on receives in the last step */
    int overlap;   /* train_pipe_set_overlap */
};

/* Build mode `comm`'s list of this stage and its activation sets. */
static ms_status plan_list(train_pipe *p, par_comm comm, pipe_list *l) {
    par_sched_kind kind = p->vpp > 1 ? PAR_SCHED_INTERLEAVED : PAR_SCHED_1F1B;
    ms_status st =
        par_schedule_comm(kind, comm, p->pp, p->vpp, p->n_micro, p->stage, &l->list, &l->n);
    if (st != MS_OK)
        return ms_error_wrap(st,
                             "--pp %d --vpp %d with %d micro-batch%s per step (--batch / (--dp x "
                             "--micro-batch))",
                             p->pp, p->vpp, p->n_micro, p->n_micro == 1 ? "" : "es");
    l->slot = malloc(sizeof(int) * (size_t)p->n_micro * p->vpp);
    if (!l->slot) return ms_error(MS_ERR_NOMEM, "pipeline: out of memory");
    MS_TRY(par_schedule_slots(l->list, l->n, p->vpp, p->n_micro, l->slot, &l->n_slots));
    if (l->n_slots > p->n_slots) p->n_slots = l->n_slots;
    return MS_OK;
}

ms_status train_pipe_plan(train_pipe **out, comm_grid *grid, comm_world *world, int vpp,
                          int n_micro) {
    *out = NULL;
    train_pipe *p = calloc(1, sizeof *p);
    if (!p) return ms_error(MS_ERR_NOMEM, "pipeline: out of memory");
    comm_grid_coord me = comm_grid_coord_of(grid);
    comm_grid_shape sh = comm_grid_shape_of(grid);
    p->ppg = comm_grid_group(grid, COMM_DIM_PP);
    p->overlap = 1;
    p->pp = sh.pp, p->vpp = vpp, p->stage = me.pp, p->n_micro = n_micro, p->G = sh.pp * vpp;
    ms_status st = plan_list(p, PAR_COMM_OVERLAP, &p->lists[PAR_COMM_OVERLAP]);
    if (st == MS_OK) st = plan_list(p, PAR_COMM_BLOCKING, &p->lists[PAR_COMM_BLOCKING]);
    if (st != MS_OK) goto out;
    p->on = &p->lists[PAR_COMM_OVERLAP];
    if (1 + 2 * p->G * n_micro > 32767) {
        st = ms_error(MS_ERR_ARG,
                      "--pp %d x --vpp %d with %d micro-batches per step (--batch / (--dp x "
                      "--micro-batch)) needs 1 + 2 x %d x %d message tags, more than the 32767 "
                      "MPI guarantees: raise --micro-batch or lower --vpp",
                      p->pp, p->vpp, n_micro, p->G, n_micro);
        goto out;
    }
    p->req = calloc(4 * (size_t)n_micro * vpp, sizeof *p->req);
    if (!p->req) {
        st = ms_error(MS_ERR_NOMEM, "pipeline: out of memory");
        goto out;
    }
    /* the tied embedding: first and last stage of each (tp, dp) column */
    int ends = p->stage == 0 || p->stage == p->pp - 1;
    st = comm_group_create_split(comm_world_group(world), ends ? me.tp + sh.tp * me.dp : -1,
                                 p->stage, "embedding", &p->emb);
out:
    if (st != MS_OK)
        train_pipe_destroy(p);
    else
        *out = p;
    return st;
}

int train_pipe_slots(const train_pipe *p) {
    return p->n_slots;
}

ms_status train_pipe_attach(train_pipe *p, gpt_model *m, int B, int T) {
    p->m = m;
    p->be = gpt_backend(m);
    p->rows = (size_t)B * T / (size_t)gpt_tp_size(m) * (size_t)gpt_get_config(m)->n_embd;
    p->act_dt = gpt_act_comm_dtype(m);
    size_t nb = (size_t)p->vpp * PAR_SEND_BUFS, bytes = p->rows * be_dtype_size(p->be->act_dtype);
    p->act_send = calloc(nb, sizeof(void *));
    p->grad_send = calloc(nb, sizeof(void *));
    if (!p->act_send || !p->grad_send) return ms_error(MS_ERR_NOMEM, "pipeline: out of memory");
    for (size_t b = 0; b < nb; b++) {
        p->act_send[b] = p->be->alloc(p->be, bytes);
        p->grad_send[b] = p->be->alloc(p->be, bytes);
        if (!p->act_send[b] || !p->grad_send[b])
            return ms_error(MS_ERR_NOMEM, "pipeline: cannot allocate %zu send buffers of %zu bytes",
                            2 * nb, bytes);
    }
    if (p->emb) {
        int t = gpt_find(m, "wte.weight");
        MS_CHECK(t >= 0);
        p->wte_off = gpt_tensor(m, t)->offset;
        p->wte_n = gpt_tensor(m, t)->numel;
        p->wte_peer = p->be->alloc(p->be, p->wte_n * sizeof(float));
        if (!p->wte_peer)
            return ms_error(MS_ERR_NOMEM,
                            "pipeline: cannot allocate the receive buffer of the tied wte "
                            "gradient (%zu floats)",
                            p->wte_n);
    }
    return MS_OK;
}

void train_pipe_destroy(train_pipe *p) {
    if (!p) return;
    for (int i = 0; p->req && i < 4 * p->n_micro * p->vpp; i++)
        if (p->req[i]) comm_wait(p->req[i]);
    comm_wait(p->emb_send);
    comm_wait(p->emb_recv);
    for (int b = 0; p->be && b < p->vpp * PAR_SEND_BUFS; b++) {
        if (p->act_send && p->act_send[b]) p->be->free(p->be, p->act_send[b]);
        if (p->grad_send && p->grad_send[b]) p->be->free(p->be, p->grad_send[b]);
    }
    if (p->wte_peer) p->be->free(p->be, p->wte_peer);
    comm_group_destroy(p->emb);
    free(p->act_send);
    free(p->grad_send);
    free(p->req);
    for (int k = 0; k < 2; k++) {
        free(p->lists[k].slot);
        free(p->lists[k].list);
    }
    free(p);
}

int train_pipe_last_stage(const train_pipe *p) {
    return p->stage == p->pp - 1;
}

double train_pipe_bubble(const train_pipe *p) {
    return p->bubble;
}

void train_pipe_set_overlap(train_pipe *p, int on) {
    p->overlap = on;
    p->on = &p->lists[on ? PAR_COMM_OVERLAP : PAR_COMM_BLOCKING];
}

long long train_pipe_wait_ns(const train_pipe *p) {
    return comm_group_wait_ns(p->ppg) + comm_group_wait_ns(p->emb);
}

/* The request slot of a posted op on (mb, chunk). */
static comm_req **req_of(train_pipe *p, par_op op, int mb, int c) {
    MS_CHECK(op >= PAR_SEND_ACT && op <= PAR_RECV_GRAD);
    return &p->req[((size_t)(op - PAR_SEND_ACT) * p->n_micro + mb) * p->vpp + c];
}

static int tag_of(const train_pipe *p, int grad, int sender_chunk, int mb) {
    return 1 + (grad * p->G + sender_chunk) * p->n_micro + mb;
}

/* The send buffer micro-batch mb of local chunk c writes (act or grad). */
static void *send_buf(const train_pipe *p, int grad, int mb, int c) {
    return (grad ? p->grad_send : p->act_send)[c * PAR_SEND_BUFS + mb % PAR_SEND_BUFS];
}

/* Post or wait one communication instruction. */
static ms_status run_comm(train_pipe *p, const par_instr *in) {
    int g = in->chunk * p->pp + p->stage, k = p->on->slot[in->mb * p->vpp + in->chunk];
    switch (in->op) {
    case PAR_SEND_ACT:
        return comm_send_start(p->ppg, send_buf(p, 0, in->mb, in->chunk), p->rows, p->act_dt,
                               in->peer, tag_of(p, 0, g, in->mb),
                               req_of(p, in->op, in->mb, in->chunk));
    case PAR_RECV_ACT:
        return comm_recv_start(p->ppg, gpt_chunk_input(p->m, in->chunk, k), p->rows, p->act_dt,
                               in->peer, tag_of(p, 0, g - 1, in->mb),
                               req_of(p, in->op, in->mb, in->chunk));
    case PAR_SEND_GRAD:
        return comm_send_start(p->ppg, send_buf(p, 1, in->mb, in->chunk), p->rows, p->act_dt,
                               in->peer, tag_of(p, 1, g, in->mb),
                               req_of(p, in->op, in->mb, in->chunk));
    case PAR_RECV_GRAD:
        return comm_recv_start(p->ppg, gpt_chunk_dout(p->m, in->chunk, k), p->rows, p->act_dt,
                               in->peer, tag_of(p, 1, g + 1, in->mb),
                               req_of(p, in->op, in->mb, in->chunk));
    case PAR_WAIT: {
        comm_req **r = req_of(p, in->waits, in->mb, in->chunk);
        double t0 = ms_now();
        ms_status st = comm_wait(*r);
        *r = NULL;
        if (in->waits == PAR_RECV_ACT || in->waits == PAR_RECV_GRAD) p->bubble += ms_now() - t0;
        return st;
    }
    default:
        return ms_error(MS_ERR_INTERNAL, "pipeline: op %d is not communication", (int)in->op);
    }
}

/* This stage's tied wte gradient (ends only). */
static float *wte_grad(train_pipe *p) {
    return gpt_grads(p->m) + p->wte_off;
}

/* Overlapped exchange, the first stage: the receive of the last stage's
 * copy, posted before the schedule so that the last stage's send (in the
 * middle of its cool-down) finds it.  The peer is group rank 1 - ours. */
static ms_status emb_post_recv(train_pipe *p) {
    return comm_recv_start(p->emb, p->wte_peer, p->wte_n, COMM_F32, 1 - comm_group_rank(p->emb), 1,
                           &p->emb_recv);
}

/* Overlapped exchange: send this stage's final copy (and, on the last
 * stage, post the receive of the first stage's, which comes at the end). */
static ms_status emb_post_send(train_pipe *p) {
    int peer = 1 - comm_group_rank(p->emb);
    MS_TRY(comm_send_start(p->emb, wte_grad(p), p->wte_n, COMM_F32, peer, 1, &p->emb_send));
    if (!p->emb_recv)
        MS_TRY(comm_recv_start(p->emb, p->wte_peer, p->wte_n, COMM_F32, peer, 1, &p->emb_recv));
    return MS_OK;
}

/* Overlapped exchange, after the schedule: wait both sides, then own +=
 * the other's copy (the send must be done before the buffer changes). */
static ms_status emb_finish(train_pipe *p) {
    ms_status st = comm_wait(p->emb_recv), st2 = comm_wait(p->emb_send);
    p->emb_recv = p->emb_send = NULL;
    MS_TRY(st);
    MS_TRY(st2);
    p->be->add_f32(p->be, wte_grad(p), p->wte_peer, p->wte_n);
    return MS_OK;
}

/* Sum the wte gradients of the first and the last stage (the tied copies):
 * the overlapped exchange's end, or a blocking all-reduce with overlap off. */
static ms_status sum_embedding(train_pipe *p) {
    if (!p->emb) return MS_OK;
    if (p->overlap) return emb_finish(p);
    return comm_allreduce(p->emb, wte_grad(p), wte_grad(p), p->wte_n, COMM_F32, COMM_SUM);
}

/* Is `in` the compute after which this stage's wte copy is final?  The
 * last FWD of the last global chunk (its classifier backward) on the last
 * stage, the last BWD of global chunk 0 (the embedding's) on the first. */
static int wte_final(const train_pipe *p, const par_instr *in) {
    if (!p->emb || in->mb != p->n_micro - 1) return 0;
    if (p->stage == p->pp - 1) return in->op == PAR_FWD && in->chunk == p->vpp - 1;
    return in->op == PAR_BWD && in->chunk == 0;
}

ms_status train_pipe_step(train_pipe *p, const int32_t *inp, const int32_t *tgt, int B, int T,
                          float dloss, double *loss) {
    size_t N = (size_t)B * T;
    double sum = 0;
    p->bubble = 0;
    int exchange = p->emb && p->overlap; /* the overlapped embedding sum */
    if (exchange && p->stage == 0) MS_TRY(emb_post_recv(p));
    for (int i = 0; i < p->on->n; i++) {
        const par_instr *in = &p->on->list[i];
        int k = p->on->slot[in->mb * p->vpp + in->chunk], final = in->mb == p->n_micro - 1;
        if (in->op == PAR_FWD || in->op == PAR_BWD) gpt_trace_micro_batch(p->m, in->mb);
        if (in->op == PAR_FWD)
            sum += gpt_chunk_forward(p->m, in->chunk, k, inp + in->mb * N, tgt + in->mb * N, B, T,
                                     dloss, 1, send_buf(p, 0, in->mb, in->chunk), final);
        else if (in->op == PAR_BWD)
            gpt_chunk_backward(p->m, in->chunk, k, B, T, send_buf(p, 1, in->mb, in->chunk), final);
        else
            MS_TRY(run_comm(p, in));
        if (exchange && wte_final(p, in)) MS_TRY(emb_post_send(p));
    }
    MS_TRY(gpt_take_error(p->m)); /* a tensor-parallel collective failed */
    MS_TRY(sum_embedding(p));
    gpt_embedding_grads_ready(p->m); /* ZeRO: the embeddings' reduce-scatter */
    *loss = sum;
    return comm_broadcast(p->ppg, loss, 1, COMM_F64, p->pp - 1);
}

ms_status train_pipe_eval(train_pipe *p, const int32_t *inp, const int32_t *tgt, int B, int T) {
    size_t rows = (size_t)B * T / (size_t)gpt_tp_size(p->m) * (size_t)gpt_get_config(p->m)->n_embd;
    MS_CHECK(rows <= p->rows);
    for (int g = p->stage; g < p->G; g += p->pp) {
        int c = g / p->pp;
        if (g > 0)
            MS_TRY(comm_recv(p->ppg, gpt_chunk_input(p->m, c, 0), rows, p->act_dt,
                             (p->stage + p->pp - 1) % p->pp, 0));
        void *out = send_buf(p, 0, 0, c);
        gpt_chunk_forward(p->m, c, 0, inp, tgt, B, T, 1.0f, 0, out, 0);
        MS_TRY(gpt_take_error(p->m));
        if (g + 1 < p->G)
            MS_TRY(comm_send(p->ppg, out, rows, p->act_dt, (p->stage + 1) % p->pp, 0));
    }
    return MS_OK;
}
