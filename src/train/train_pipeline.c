/* train_pipeline.c - runs one stage's pipeline schedule (par_schedule) over
 * a stage model (gpt_create_stage): the step's FWD / BWD of (micro-batch,
 * chunk) pairs on their activation sets (par_schedule_slots), activations
 * and gradients between stages as non-blocking sends / receives over the pp
 * group, posted and waited where the schedule says; then the sum of the
 * tied wte copies over the "embedding" group (first and last stage of each
 * (tp, dp) column) and the loss from the last stage to every stage.
 *
 * Buffers, all allocated at setup: the model's activation sets, one (Nl,C)
 * activation and one gradient send buffer per local chunk (the schedule
 * waits a send before its buffer is rewritten), one request per posted op.
 * Messages carry tag 1 + (kind*G + sender's global chunk)*n_micro + mb
 * (kind 0: activation, 1: gradient; G = pp*vpp chunks), so each send
 * matches exactly its receive. */
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "comm/grid.h"
#include "parallel/schedule.h"
#include "train/train_internal.h"

struct train_pipe {
    comm_group *ppg, *emb; /* pipeline group (rank == stage); embedding group or NULL */
    int pp, vpp, stage, n_micro, G;
    par_instr *list;
    int n, n_slots;
    int *slot; /* [mb*vpp + chunk] */
    gpt_model *m;
    be_backend *be;
    size_t rows;                  /* elements of one (Nl,C) message */
    comm_dtype act_dt;            /* their dtype: the backend's act dtype */
    void **act_send, **grad_send; /* [vpp] device buffers */
    comm_req **req;               /* [4][n_micro*vpp]: SEND_ACT .. RECV_GRAD */
    double bubble;                /* seconds waited on receives in the last step */
    int overlap;                  /* train_pipe_set_overlap */
};

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
    par_sched_kind kind = vpp > 1 ? PAR_SCHED_INTERLEAVED : PAR_SCHED_1F1B;
    ms_status st = par_schedule(kind, p->pp, vpp, n_micro, p->stage, &p->list, &p->n);
    if (st != MS_OK) {
        ms_error_wrap(st,
                      "--pp %d --vpp %d with %d micro-batches per step (--batch / (--dp x "
                      "--micro-batch))",
                      p->pp, vpp, n_micro);
        goto out;
    }
    if (1 + 2 * p->G * n_micro > 32767) {
        st = ms_error(MS_ERR_ARG, "pipeline: %d chunks x %d micro-batches exceed the message tags",
                      p->G, n_micro);
        goto out;
    }
    p->slot = malloc(sizeof(int) * (size_t)n_micro * vpp);
    p->req = calloc(4 * (size_t)n_micro * vpp, sizeof *p->req);
    st = p->slot && p->req ? par_schedule_slots(p->list, p->n, vpp, n_micro, p->slot, &p->n_slots)
                           : ms_error(MS_ERR_NOMEM, "pipeline: out of memory");
    if (st != MS_OK) goto out;
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
    p->act_send = calloc((size_t)p->vpp, sizeof(void *));
    p->grad_send = calloc((size_t)p->vpp, sizeof(void *));
    if (!p->act_send || !p->grad_send) return ms_error(MS_ERR_NOMEM, "pipeline: out of memory");
    for (int c2 = 0; c2 < p->vpp; c2++) {
        p->act_send[c2] = p->be->alloc(p->be, p->rows * be_dtype_size(p->be->act_dtype));
        p->grad_send[c2] = p->be->alloc(p->be, p->rows * be_dtype_size(p->be->act_dtype));
        if (!p->act_send[c2] || !p->grad_send[c2])
            return ms_error(MS_ERR_NOMEM, "pipeline: cannot allocate send buffers");
    }
    return MS_OK;
}

void train_pipe_destroy(train_pipe *p) {
    if (!p) return;
    for (int i = 0; p->req && i < 4 * p->n_micro * p->vpp; i++)
        if (p->req[i]) comm_wait(p->req[i]);
    for (int c = 0; p->be && c < p->vpp; c++) {
        if (p->act_send && p->act_send[c]) p->be->free(p->be, p->act_send[c]);
        if (p->grad_send && p->grad_send[c]) p->be->free(p->be, p->grad_send[c]);
    }
    comm_group_destroy(p->emb);
    free(p->act_send);
    free(p->grad_send);
    free(p->req);
    free(p->slot);
    free(p->list);
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

/* Post or wait one communication instruction. */
static ms_status run_comm(train_pipe *p, const par_instr *in) {
    int g = in->chunk * p->pp + p->stage, k = p->slot[in->mb * p->vpp + in->chunk];
    switch (in->op) {
    case PAR_SEND_ACT:
        return comm_send_start(p->ppg, p->act_send[in->chunk], p->rows, p->act_dt, in->peer,
                               tag_of(p, 0, g, in->mb), req_of(p, in->op, in->mb, in->chunk));
    case PAR_RECV_ACT:
        return comm_recv_start(p->ppg, gpt_chunk_input(p->m, in->chunk, k), p->rows, p->act_dt,
                               in->peer, tag_of(p, 0, g - 1, in->mb),
                               req_of(p, in->op, in->mb, in->chunk));
    case PAR_SEND_GRAD:
        return comm_send_start(p->ppg, p->grad_send[in->chunk], p->rows, p->act_dt, in->peer,
                               tag_of(p, 1, g, in->mb), req_of(p, in->op, in->mb, in->chunk));
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

/* Sum the wte gradients of the first and the last stage (the tied copies). */
static ms_status sum_embedding(train_pipe *p) {
    if (!p->emb) return MS_OK;
    int t = gpt_find(p->m, "wte.weight");
    MS_CHECK(t >= 0);
    float *g = gpt_grads(p->m) + gpt_tensor(p->m, t)->offset;
    return comm_allreduce(p->emb, g, g, gpt_tensor(p->m, t)->numel, COMM_F32, COMM_SUM);
}

ms_status train_pipe_step(train_pipe *p, const int32_t *inp, const int32_t *tgt, int B, int T,
                          float dloss, double *loss) {
    size_t N = (size_t)B * T;
    double sum = 0;
    p->bubble = 0;
    for (int i = 0; i < p->n; i++) {
        const par_instr *in = &p->list[i];
        int k = p->slot[in->mb * p->vpp + in->chunk], final = in->mb == p->n_micro - 1;
        if (in->op == PAR_FWD || in->op == PAR_BWD) gpt_trace_micro_batch(p->m, in->mb);
        if (in->op == PAR_FWD)
            sum += gpt_chunk_forward(p->m, in->chunk, k, inp + in->mb * N, tgt + in->mb * N, B, T,
                                     dloss, 1, p->act_send[in->chunk], final);
        else if (in->op == PAR_BWD)
            gpt_chunk_backward(p->m, in->chunk, k, B, T, p->grad_send[in->chunk], final);
        else
            MS_TRY(run_comm(p, in));
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
        gpt_chunk_forward(p->m, c, 0, inp, tgt, B, T, 1.0f, 0, p->act_send[c], 0);
        MS_TRY(gpt_take_error(p->m));
        if (g + 1 < p->G)
            MS_TRY(comm_send(p->ppg, p->act_send[c], rows, p->act_dt, (p->stage + 1) % p->pp, 0));
    }
    return MS_OK;
}
