/* schedule.c - builds the per-rank instruction lists of the 1F1B and
 * interleaved 1F1B pipeline schedules (see schedule.h).
 *
 * Two passes: compute_order() gives the order of FWD/BWD on a stage, exactly
 * as Megatron-LM's forward_backward_pipelining_{without,with}_interleaving
 * runs them; then the communication is placed around that order, either
 * decoupled (emit_overlap: receives posted one compute ahead and waited
 * right before use, sends posted right after the producing compute and
 * waited before their buffer is rewritten, two computes of the chunk and
 * direction later, or at the end) or coupled and blocking (emit_blocking).
 * Both keep the compute order, so they compute the same bits. */
#include "parallel/schedule.h"

#include <stdlib.h>

/* One compute step of a stage: FWD or BWD of (mb, local chunk). */
typedef struct {
    int bwd;
    int mb;
    int chunk;
} par_step;

const char *par_sched_kind_name(par_sched_kind kind) {
    switch (kind) {
    case PAR_SCHED_1F1B:
        return "1f1b";
    case PAR_SCHED_INTERLEAVED:
        return "interleaved";
    }
    return "unknown";
}

/* Validate a configuration; MS_ERR_ARG with the offending values. */
ms_status par_schedule_check_args(par_sched_kind kind, int pp, int vpp, int n_micro) {
    if (kind != PAR_SCHED_1F1B && kind != PAR_SCHED_INTERLEAVED)
        return ms_error(MS_ERR_ARG, "pipeline schedule: unknown kind %d", (int)kind);
    const char *name = par_sched_kind_name(kind);
    if (pp < 1 || vpp < 1 || n_micro < 1)
        return ms_error(MS_ERR_ARG,
                        "pipeline schedule %s: pp=%d, vpp=%d, n_micro=%d must all be >= 1", name,
                        pp, vpp, n_micro);
    if (kind == PAR_SCHED_1F1B && vpp != 1)
        return ms_error(MS_ERR_ARG,
                        "pipeline schedule 1f1b: vpp=%d but the non-interleaved schedule needs "
                        "vpp=1 (use the interleaved schedule for virtual stages)",
                        vpp);
    if (kind == PAR_SCHED_INTERLEAVED && pp < 2)
        return ms_error(MS_ERR_ARG,
                        "pipeline schedule interleaved: pp=%d (vpp=%d) but interleaving needs "
                        "pp >= 2",
                        pp, vpp);
    if (kind == PAR_SCHED_INTERLEAVED && n_micro % pp != 0)
        return ms_error(MS_ERR_ARG,
                        "pipeline schedule interleaved: n_micro=%d is not a multiple of pp=%d "
                        "(vpp=%d)",
                        n_micro, pp, vpp);
    return MS_OK;
}

int par_schedule_warmup(par_sched_kind kind, int pp, int vpp, int n_micro, int stage) {
    if (kind == PAR_SCHED_1F1B) {
        int w = pp - stage - 1;
        return w < n_micro ? w : n_micro;
    }
    int total = n_micro * vpp;
    /* Megatron runs everything as warmup when n_micro == pp. */
    if (n_micro == pp) return total;
    int w = (pp - stage - 1) * 2 + (vpp - 1) * pp;
    return w < total ? w : total;
}

/* Interleaved: the k-th virtual micro-batch of a stage in forward (bwd=0)
 * or backward (bwd=1) order.  Micro-batches go in groups of pp through all
 * vpp chunks (Megatron's get_model_chunk_id / microbatch id). */
static par_step interleaved_step(int pp, int vpp, int k, int bwd) {
    int in_group = k % (pp * vpp);
    int chunk = in_group / pp;
    par_step st = {bwd, (k / (pp * vpp)) * pp + k % pp, bwd ? vpp - 1 - chunk : chunk};
    return st;
}

/* The k-th FWD (bwd=0) or BWD (bwd=1) of a stage in schedule order. */
static par_step nth_step(par_sched_kind kind, int pp, int vpp, int k, int bwd) {
    if (kind == PAR_SCHED_INTERLEAVED) return interleaved_step(pp, vpp, k, bwd);
    par_step st = {bwd, k, 0};
    return st;
}

/* The order of FWD/BWD on `stage`: warmup FWDs, steady 1F1B pairs (one FWD
 * then one BWD), cooldown BWDs.  steps has room for 2*n_micro*vpp entries;
 * returns the count. */
static int compute_order(par_sched_kind kind, int pp, int vpp, int n_micro, int stage,
                         par_step *steps) {
    int total = n_micro * vpp;
    int warm = par_schedule_warmup(kind, pp, vpp, n_micro, stage);
    int n = 0, f = 0, b = 0;
    for (; f < warm; f++)
        steps[n++] = nth_step(kind, pp, vpp, f, 0);
    for (; f < total; f++, b++) {
        steps[n++] = nth_step(kind, pp, vpp, f, 0);
        steps[n++] = nth_step(kind, pp, vpp, b, 1);
    }
    for (; b < total; b++)
        steps[n++] = nth_step(kind, pp, vpp, b, 1);
    return n;
}

/* The receive a step needs before it can run: PAR_RECV_ACT for a FWD of
 * any but the first global chunk, PAR_RECV_GRAD for a BWD of any but the
 * last; -1 if none.  *peer gets the source stage. */
static int step_recv(const par_step *st, int pp, int vpp, int stage, int *peer) {
    int g = st->chunk * pp + stage, last = pp * vpp - 1;
    if (!st->bwd && g > 0) {
        *peer = (g - 1) % pp;
        return PAR_RECV_ACT;
    }
    if (st->bwd && g < last) {
        *peer = (g + 1) % pp;
        return PAR_RECV_GRAD;
    }
    return -1;
}

/* The send a step produces: PAR_SEND_ACT after a FWD of any but the last
 * global chunk, PAR_SEND_GRAD after a BWD of any but the first; -1 if none.
 * *peer gets the destination stage. */
static int step_send(const par_step *st, int pp, int vpp, int stage, int *peer) {
    int g = st->chunk * pp + stage, last = pp * vpp - 1;
    if (!st->bwd && g < last) {
        *peer = (g + 1) % pp;
        return PAR_SEND_ACT;
    }
    if (st->bwd && g > 0) {
        *peer = (g - 1) % pp;
        return PAR_SEND_GRAD;
    }
    return -1;
}

static par_instr mk(par_op op, int mb, int chunk, int peer) {
    par_instr in = {op, mb, chunk, peer, PAR_WAIT};
    return in;
}

static par_instr mk_wait(const par_instr *posted) {
    par_instr in = {PAR_WAIT, posted->mb, posted->chunk, posted->peer, posted->op};
    return in;
}

/* Append the post of the receive step `st` needs, if any. */
static void post_recv(const par_step *st, int pp, int vpp, int stage, par_instr *out, int *n) {
    int peer, op = step_recv(st, pp, vpp, stage, &peer);
    if (op >= 0) out[(*n)++] = mk((par_op)op, st->mb, st->chunk, peer);
}

/* PAR_COMM_OVERLAP: place decoupled communication around a compute order
 * (see schedule.h).  pend[(chunk*2 + dir)*PAR_SEND_BUFS + mb%PAR_SEND_BUFS]
 * holds the unwaited send of each send buffer (op == PAR_WAIT when none).
 * out has room for 5*n_steps + 2*vpp*PAR_SEND_BUFS. */
static int emit_overlap(const par_step *steps, int n_steps, int pp, int vpp, int stage,
                        par_instr *pend, par_instr *out) {
    int n = 0;
    for (int b = 0; b < 2 * vpp * PAR_SEND_BUFS; b++)
        pend[b].op = PAR_WAIT;
    for (int i = 0; i < n_steps; i++) {
        const par_step *st = &steps[i];
        if (i == 0) post_recv(st, pp, vpp, stage, out, &n);
        if (i + 1 < n_steps) post_recv(&steps[i + 1], pp, vpp, stage, out, &n);
        par_instr *buf = &pend[(st->chunk * 2 + st->bwd) * PAR_SEND_BUFS + st->mb % PAR_SEND_BUFS];
        if (buf->op != PAR_WAIT) { /* this step rewrites a buffer still being sent */
            out[n++] = mk_wait(buf);
            buf->op = PAR_WAIT;
        }
        int peer, op = step_recv(st, pp, vpp, stage, &peer);
        if (op >= 0) {
            par_instr r = mk((par_op)op, st->mb, st->chunk, peer);
            out[n++] = mk_wait(&r);
        }
        out[n++] = mk(st->bwd ? PAR_BWD : PAR_FWD, st->mb, st->chunk, -1);
        op = step_send(st, pp, vpp, stage, &peer);
        if (op >= 0) {
            out[n] = mk((par_op)op, st->mb, st->chunk, peer);
            *buf = out[n++];
        }
    }
    for (int b = 0; b < 2 * vpp * PAR_SEND_BUFS; b++)
        if (pend[b].op != PAR_WAIT) out[n++] = mk_wait(&pend[b]);
    return n;
}

/* PAR_COMM_BLOCKING: the computes in units, and at every boundary between
 * two units the sends of the unit before and the receives of the unit
 * after are posted together and all waited at once, so no transfer
 * overlaps a compute.  The units are Megatron-LM's: every compute of 1F1B,
 * and in interleaved 1F1B every warm-up FWD, every cool-down BWD and every
 * steady (FWD, BWD) pair (send_forward_backward_recv_forward_backward).
 * Posting the whole boundary before waiting any of it keeps this
 * deadlock-free under rendezvous (par_schedule_validate, every
 * configuration of the unit tests); single computes as units in
 * interleaved's steady phase are not (with pp 8, vpp 2, 16 micro-batches,
 * a ring of stages each blocks sending a gradient that its neighbour only
 * receives at its following boundary).
 * `pair_from` / `pair_to`: the step indices of the steady phase whose
 * (FWD, BWD) pairs are units (pair_from == pair_to: none).  out has room
 * for 5*n_steps (a compute, its receive and send, two WAITs). */
static int emit_blocking(const par_step *steps, int n_steps, int pair_from, int pair_to, int pp,
                         int vpp, int stage, par_instr *out) {
    int n = 0, unit = 0; /* steps[unit..i) is the unit before the boundary at i */
    for (int i = 0; i <= n_steps; i++) {
        if (i < n_steps && i > pair_from && i < pair_to && (i - pair_from) % 2) {
            out[n++] = mk(steps[i].bwd ? PAR_BWD : PAR_FWD, steps[i].mb, steps[i].chunk, -1);
            continue; /* the BWD of a steady pair: same unit as its FWD */
        }
        int end = i < n_steps && i >= pair_from && i < pair_to ? i + 2 : i + 1;
        if (end > n_steps) end = n_steps;
        int first = n, peer, op;
        for (int j = unit; j < i; j++)
            if ((op = step_send(&steps[j], pp, vpp, stage, &peer)) >= 0)
                out[n++] = mk((par_op)op, steps[j].mb, steps[j].chunk, peer);
        for (int j = i; j < end; j++)
            post_recv(&steps[j], pp, vpp, stage, out, &n);
        for (int j = first, posted = n; j < posted; j++)
            out[n++] = mk_wait(&out[j]);
        if (i < n_steps)
            out[n++] = mk(steps[i].bwd ? PAR_BWD : PAR_FWD, steps[i].mb, steps[i].chunk, -1);
        unit = i;
    }
    return n;
}

ms_status par_schedule_comm(par_sched_kind kind, par_comm comm, int pp, int vpp, int n_micro,
                            int stage, par_instr **out, int *n) {
    *out = NULL;
    *n = 0;
    MS_TRY(par_schedule_check_args(kind, pp, vpp, n_micro));
    if (comm != PAR_COMM_OVERLAP && comm != PAR_COMM_BLOCKING)
        return ms_error(MS_ERR_ARG, "pipeline schedule %s: unknown communication mode %d",
                        par_sched_kind_name(kind), (int)comm);
    if (stage < 0 || stage >= pp)
        return ms_error(MS_ERR_ARG, "pipeline schedule %s: stage=%d out of range (pp=%d)",
                        par_sched_kind_name(kind), stage, pp);
    size_t n_steps = 2 * (size_t)n_micro * (size_t)vpp;
    size_t n_bufs = 2 * (size_t)vpp * PAR_SEND_BUFS;
    size_t cap = 5 * n_steps + n_bufs;
    par_step *steps = malloc(n_steps * sizeof *steps);
    par_instr *pend = malloc(n_bufs * sizeof *pend);
    par_instr *list = malloc(cap * sizeof *list);
    if (!steps || !pend || !list) {
        free(steps), free(pend), free(list);
        return ms_error(MS_ERR_NOMEM, "pipeline schedule: %zu instructions for stage %d", cap,
                        stage);
    }
    int ns = compute_order(kind, pp, vpp, n_micro, stage, steps);
    MS_CHECK((size_t)ns == n_steps);
    int len;
    if (comm == PAR_COMM_OVERLAP) {
        len = emit_overlap(steps, ns, pp, vpp, stage, pend, list);
    } else { /* interleaved: the steady phase's (FWD, BWD) pairs are units */
        int warm = par_schedule_warmup(kind, pp, vpp, n_micro, stage);
        int steady = kind == PAR_SCHED_INTERLEAVED ? n_micro * vpp - warm : 0;
        len = emit_blocking(steps, ns, warm, warm + 2 * steady, pp, vpp, stage, list);
    }
    MS_CHECK((size_t)len <= cap);
    free(steps);
    free(pend);
    *out = list;
    *n = len;
    return MS_OK;
}

ms_status par_schedule(par_sched_kind kind, int pp, int vpp, int n_micro, int stage,
                       par_instr **out, int *n) {
    return par_schedule_comm(kind, PAR_COMM_OVERLAP, pp, vpp, n_micro, stage, out, n);
}

ms_status par_plan_build_comm(par_sched_kind kind, par_comm comm, int pp, int vpp, int n_micro,
                              par_plan *plan) {
    par_plan p = {kind, comm, pp, vpp, n_micro, NULL, NULL};
    *plan = p;
    MS_TRY(par_schedule_check_args(kind, pp, vpp, n_micro));
    p.lists = calloc((size_t)pp, sizeof *p.lists);
    p.lens = calloc((size_t)pp, sizeof *p.lens);
    if (!p.lists || !p.lens) {
        par_plan_free(&p);
        return ms_error(MS_ERR_NOMEM, "pipeline plan: %d stages", pp);
    }
    for (int s = 0; s < pp; s++) {
        ms_status st = par_schedule_comm(kind, comm, pp, vpp, n_micro, s, &p.lists[s], &p.lens[s]);
        if (st != MS_OK) {
            par_plan_free(&p);
            return st;
        }
    }
    *plan = p;
    return MS_OK;
}

ms_status par_plan_build(par_sched_kind kind, int pp, int vpp, int n_micro, par_plan *plan) {
    return par_plan_build_comm(kind, PAR_COMM_OVERLAP, pp, vpp, n_micro, plan);
}

void par_plan_free(par_plan *plan) {
    if (plan->lists)
        for (int s = 0; s < plan->pp; s++)
            free(plan->lists[s]);
    free(plan->lists);
    free(plan->lens);
    plan->lists = NULL;
    plan->lens = NULL;
}

const char *par_op_name(par_op op) {
    switch (op) {
    case PAR_FWD:
        return "FWD";
    case PAR_BWD:
        return "BWD";
    case PAR_SEND_ACT:
        return "SEND_ACT";
    case PAR_RECV_ACT:
        return "RECV_ACT";
    case PAR_SEND_GRAD:
        return "SEND_GRAD";
    case PAR_RECV_GRAD:
        return "RECV_GRAD";
    case PAR_WAIT:
        return "WAIT";
    }
    return "?";
}

/* "to" for sends, "from" for receives. */
static const char *peer_word(par_op op) {
    return op == PAR_SEND_ACT || op == PAR_SEND_GRAD ? "to" : "from";
}

const char *par_instr_str(const par_instr *ins, char *buf, size_t size) {
    switch (ins->op) {
    case PAR_FWD:
    case PAR_BWD:
        snprintf(buf, size, "%s(mb=%d,c=%d)", par_op_name(ins->op), ins->mb, ins->chunk);
        break;
    case PAR_WAIT:
        snprintf(buf, size, "WAIT(%s mb=%d,c=%d,%s=%d)", par_op_name(ins->waits), ins->mb,
                 ins->chunk, peer_word(ins->waits), ins->peer);
        break;
    default:
        snprintf(buf, size, "%s(mb=%d,c=%d,%s=%d)", par_op_name(ins->op), ins->mb, ins->chunk,
                 peer_word(ins->op), ins->peer);
        break;
    }
    return buf;
}

void par_schedule_print(FILE *f, const par_instr *list, int n) {
    char buf[96];
    for (int i = 0; i < n; i++)
        fprintf(f, "%4d  %s\n", i, par_instr_str(&list[i], buf, sizeof buf));
}
