/* schedule_check.c - simulates the instruction lists of all pipeline ranks
 * together: message matching, deadlock and protocol checks, and timing for
 * the bubble fraction (see schedule.h).
 *
 * Semantics modelled: SEND_* / RECV_* only post; a posted operation
 * completes once the peer has posted the matching one (rendezvous: a send
 * does not complete before its receive is posted, and vice versa); WAIT
 * blocks until completion; FWD/BWD never block but fail if their inputs
 * are not there.  A message is named by (direction, mb, destination global
 * chunk).  Each local chunk has PAR_SEND_BUFS activation and as many
 * gradient send buffers, micro-batch mb writing buffer mb % PAR_SEND_BUFS:
 * the FWD (BWD) that writes one must come after the WAIT of the previous
 * send from it.  Time: each rank has a clock; FWD adds its cost
 * (t_fwd, or the stage's and chunk's in par_schedule_simulate), BWD its
 * t_bwd; a message completes t_p2p after both sides posted, and a WAIT
 * moves the clock to that time if it is later (par_schedule_validate:
 * communication is free, t_p2p = 0). */
#include <stdlib.h>
#include <string.h>

#include "parallel/schedule.h"

/* One message: side 0 is the send, side 1 the receive. */
typedef struct {
    unsigned char posted[2], waited[2];
    double time[2]; /* when each side was posted */
} sim_msg;

typedef struct {
    const par_plan *plan;
    int pp, vpp, m, G;           /* G: number of global chunks */
    const double *t_fwd, *t_bwd; /* [pp * vpp]: cost of (stage, chunk) */
    double t_p2p;
    int *pc;                              /* [pp] next instruction */
    double *clock;                        /* [pp] */
    double recv_wait, send_stall;         /* par_sim_stats */
    double *send_pending;                 /* [pp] send-wait time not yet followed by a compute */
    int *in_flight, *max_in_flight;       /* [pp] */
    sim_msg *msgs;                        /* [2 * m * G] */
    unsigned char *fwd, *bwd, *act, *grd; /* [pp * vpp * m]: done / input ready */
    int *buf_mb, *buf_pend; /* [pp * vpp * 2 * PAR_SEND_BUFS]: send buffer content / pending msg */
} sim;

/* Where a communication instruction's message lives. */
typedef struct {
    int key;  /* index into msgs */
    int side; /* 0 send, 1 receive */
    int dir;  /* 0 activation, 1 gradient */
} msg_ref;

static int pair_ix(const sim *S, int s, int mb, int c) {
    return (s * S->vpp + c) * S->m + mb;
}
/* The send buffer that (mb, chunk c, direction dir) of stage s writes. */
static int buf_ix(const sim *S, int s, int c, int dir, int mb) {
    return ((s * S->vpp + c) * 2 + dir) * PAR_SEND_BUFS + mb % PAR_SEND_BUFS;
}

static void sim_free(sim *S) {
    free(S->pc), free(S->clock), free(S->send_pending), free(S->in_flight), free(S->max_in_flight),
        free(S->msgs);
    free(S->fwd), free(S->bwd), free(S->act), free(S->grd), free(S->buf_mb), free(S->buf_pend);
}

/* Allocate and reset the simulation state; MS_ERR_NOMEM on failure. */
static ms_status sim_init(sim *S, const par_plan *plan, const par_sim_costs *c) {
    memset(S, 0, sizeof *S);
    S->plan = plan;
    S->pp = plan->pp, S->vpp = plan->vpp, S->m = plan->n_micro, S->G = plan->pp * plan->vpp;
    S->t_fwd = c->t_fwd, S->t_bwd = c->t_bwd, S->t_p2p = c->t_p2p;
    size_t pp = (size_t)S->pp, pairs = pp * (size_t)S->vpp * (size_t)S->m;
    size_t bufs = pp * (size_t)S->vpp * 2 * PAR_SEND_BUFS;
    S->pc = calloc(pp, sizeof *S->pc);
    S->clock = calloc(pp, sizeof *S->clock);
    S->send_pending = calloc(pp, sizeof *S->send_pending);
    S->in_flight = calloc(pp, sizeof *S->in_flight);
    S->max_in_flight = calloc(pp, sizeof *S->max_in_flight);
    S->msgs = calloc(2 * (size_t)S->m * (size_t)S->G, sizeof *S->msgs);
    S->fwd = calloc(pairs, 1), S->bwd = calloc(pairs, 1);
    S->act = calloc(pairs, 1), S->grd = calloc(pairs, 1);
    S->buf_mb = malloc(bufs * sizeof *S->buf_mb);
    S->buf_pend = malloc(bufs * sizeof *S->buf_pend);
    if (!S->pc || !S->clock || !S->send_pending || !S->in_flight || !S->max_in_flight || !S->msgs ||
        !S->fwd || !S->bwd || !S->act || !S->grd || !S->buf_mb || !S->buf_pend) {
        sim_free(S);
        return ms_error(MS_ERR_NOMEM, "pipeline validate: state for pp=%d vpp=%d n_micro=%d", S->pp,
                        S->vpp, S->m);
    }
    for (size_t i = 0; i < bufs; i++)
        S->buf_mb[i] = -1, S->buf_pend[i] = -1;
    return MS_OK;
}

/* Record a protocol error at instruction pc of stage s. */
static ms_status proto(const sim *S, int s, const char *why, const char *more) {
    char ib[96];
    const par_instr *ins = &S->plan->lists[s][S->pc[s]];
    return ms_error(MS_ERR_ARG, "protocol: stage %d #%d %s: %s%s", s, S->pc[s],
                    par_instr_str(ins, ib, sizeof ib), why, more ? more : "");
}

/* Resolve a send or receive (op) on (mb, chunk) of stage s to its message,
 * checking the pipeline ends and the peer. */
static ms_status resolve(const sim *S, int s, par_op op, const par_instr *ins, msg_ref *r) {
    int g = ins->chunk * S->pp + s, dst, peer;
    r->side = op == PAR_RECV_ACT || op == PAR_RECV_GRAD;
    r->dir = op == PAR_SEND_GRAD || op == PAR_RECV_GRAD;
    if (op == PAR_SEND_ACT || op == PAR_RECV_GRAD) {
        if (g == S->G - 1)
            return proto(S, s,
                         "the last model chunk neither sends activations nor receives "
                         "gradients",
                         NULL);
        dst = op == PAR_SEND_ACT ? g + 1 : g;
        peer = (g + 1) % S->pp;
    } else {
        if (g == 0)
            return proto(S, s,
                         "the first model chunk neither receives activations nor sends "
                         "gradients",
                         NULL);
        dst = op == PAR_RECV_ACT ? g : g - 1;
        peer = (g - 1) % S->pp;
    }
    if (ins->peer != peer) {
        char why[64];
        snprintf(why, sizeof why, "%d (model chunk %d's neighbour lives there)", peer, g);
        return proto(S, s, "wrong peer stage, expected ", why);
    }
    r->key = (r->dir * S->m + ins->mb) * S->G + dst;
    return MS_OK;
}

/* Range checks on an instruction's fields. */
static ms_status check_fields(const sim *S, int s, const par_instr *ins) {
    if (ins->op < PAR_FWD || ins->op > PAR_WAIT) return proto(S, s, "unknown op", NULL);
    if (ins->mb < 0 || ins->mb >= S->m) return proto(S, s, "micro-batch out of range", NULL);
    if (ins->chunk < 0 || ins->chunk >= S->vpp) return proto(S, s, "chunk out of range", NULL);
    if (ins->op == PAR_WAIT && (ins->waits < PAR_SEND_ACT || ins->waits > PAR_RECV_GRAD))
        return proto(S, s, "WAIT on something that is not a send or receive", NULL);
    return MS_OK;
}

/* FWD/BWD: inputs present, no double run, send buffer free; advances the
 * clock and the in-flight count. */
static ms_status exec_compute(sim *S, int s, const par_instr *ins) {
    int bwd = ins->op == PAR_BWD, g = ins->chunk * S->pp + s;
    int ix = pair_ix(S, s, ins->mb, ins->chunk);
    int needs_in = bwd ? g < S->G - 1 : g > 0, sends = bwd ? g > 0 : g < S->G - 1;
    if ((bwd ? S->bwd : S->fwd)[ix]) return proto(S, s, "runs a second time", NULL);
    if (bwd && !S->fwd[ix]) return proto(S, s, "BWD before its FWD", NULL);
    if (needs_in && !(bwd ? S->grd : S->act)[ix])
        return proto(S, s,
                     bwd ? "BWD before its gradient arrived (no completed RECV_GRAD)"
                         : "FWD before its activation arrived (no completed RECV_ACT)",
                     NULL);
    int b = buf_ix(S, s, ins->chunk, bwd, ins->mb);
    if (sends && S->buf_pend[b] >= 0) {
        char why[96];
        snprintf(why, sizeof why, " (mb=%d) has not completed: buffer reused before its WAIT",
                 S->buf_mb[b]);
        return proto(S, s,
                     bwd ? "rewrites the gradient send buffer whose SEND_GRAD"
                         : "rewrites the activation send buffer whose SEND_ACT",
                     why);
    }
    (bwd ? S->bwd : S->fwd)[ix] = 1;
    S->buf_mb[b] = ins->mb;
    int sc = s * S->vpp + ins->chunk;
    S->clock[s] += bwd ? S->t_bwd[sc] : S->t_fwd[sc];
    S->send_stall += S->send_pending[s];
    S->send_pending[s] = 0;
    S->in_flight[s] += bwd ? -1 : 1;
    if (S->in_flight[s] > S->max_in_flight[s]) S->max_in_flight[s] = S->in_flight[s];
    return MS_OK;
}

/* SEND_* / RECV_*: post once; a send needs its data still in the buffer. */
static ms_status exec_post(sim *S, int s, const par_instr *ins) {
    msg_ref r;
    MS_TRY(resolve(S, s, ins->op, ins, &r));
    sim_msg *msg = &S->msgs[r.key];
    if (msg->posted[r.side]) return proto(S, s, "posted twice", NULL);
    if (r.side == 0) {
        int ix = pair_ix(S, s, ins->mb, ins->chunk);
        int b = buf_ix(S, s, ins->chunk, r.dir, ins->mb);
        if (!(r.dir ? S->bwd : S->fwd)[ix])
            return proto(S, s,
                         r.dir ? "sends a gradient before its BWD"
                               : "sends an activation before its FWD",
                         NULL);
        if (S->buf_mb[b] != ins->mb)
            return proto(S, s, "send buffer no longer holds this micro-batch", NULL);
        S->buf_pend[b] = r.key;
    }
    msg->posted[r.side] = 1;
    msg->time[r.side] = S->clock[s];
    return MS_OK;
}

/* WAIT: the op must have been posted here and not waited yet; blocks
 * (*blocked = 1) until the peer posted the matching op. */
static ms_status exec_wait(sim *S, int s, const par_instr *ins, int *blocked) {
    msg_ref r;
    MS_TRY(resolve(S, s, ins->waits, ins, &r));
    sim_msg *msg = &S->msgs[r.key];
    if (!msg->posted[r.side]) return proto(S, s, "WAIT for an operation never posted", NULL);
    if (msg->waited[r.side]) return proto(S, s, "WAIT twice for one operation", NULL);
    if (!msg->posted[1 - r.side]) {
        *blocked = 1;
        return MS_OK;
    }
    double t =
        msg->time[1 - r.side] > msg->time[r.side] ? msg->time[1 - r.side] : msg->time[r.side];
    t += S->t_p2p; /* the transfer starts once both sides are posted */
    if (t > S->clock[s]) {
        if (r.side)
            S->recv_wait += t - S->clock[s];
        else
            S->send_pending[s] += t - S->clock[s];
        S->clock[s] = t;
    }
    msg->waited[r.side] = 1;
    int ix = pair_ix(S, s, ins->mb, ins->chunk);
    if (r.side == 1)
        (r.dir ? S->grd : S->act)[ix] = 1;
    else {
        int b = buf_ix(S, s, ins->chunk, r.dir, ins->mb);
        if (S->buf_pend[b] == r.key) S->buf_pend[b] = -1;
    }
    return MS_OK;
}

/* Run stage s's next instruction, or report it blocked. */
static ms_status sim_step(sim *S, int s, int *blocked) {
    const par_instr *ins = &S->plan->lists[s][S->pc[s]];
    *blocked = 0;
    MS_TRY(check_fields(S, s, ins));
    switch (ins->op) {
    case PAR_FWD:
    case PAR_BWD:
        return exec_compute(S, s, ins);
    case PAR_WAIT:
        return exec_wait(S, s, ins, blocked);
    default:
        return exec_post(S, s, ins);
    }
}

/* Deadlock message naming every blocked stage's instruction. */
static ms_status report_deadlock(const sim *S) {
    char msg[1536], ib[96];
    size_t len = (size_t)snprintf(msg, sizeof msg, "deadlock: no stage can progress;");
    for (int s = 0; s < S->pp && len < sizeof msg; s++) {
        if (S->pc[s] >= S->plan->lens[s])
            len += (size_t)snprintf(msg + len, sizeof msg - len, " stage %d finished;", s);
        else
            len += (size_t)snprintf(msg + len, sizeof msg - len, " stage %d blocked at #%d %s;", s,
                                    S->pc[s],
                                    par_instr_str(&S->plan->lists[s][S->pc[s]], ib, sizeof ib));
    }
    return ms_error(MS_ERR_ARG, "%s", msg);
}

/* Name the stage and op of one side of message `key`. */
static void describe_side(const sim *S, int key, int side, char *buf, size_t size) {
    int dst = key % S->G, mb = (key / S->G) % S->m, dir = key / S->G / S->m;
    int g = side == 1 ? dst : (dir ? dst + 1 : dst - 1);
    static const par_op ops[2][2] = {{PAR_SEND_ACT, PAR_RECV_ACT}, {PAR_SEND_GRAD, PAR_RECV_GRAD}};
    snprintf(buf, size, "%s(mb=%d,c=%d) of stage %d", par_op_name(ops[dir][side]), mb, g / S->pp,
             g % S->pp);
}

/* After every list ran to its end: all messages matched and waited, all
 * FWD/BWD present (messages first: an unmatched one is the more specific
 * error when a list stops early). */
static ms_status final_checks(const sim *S) {
    char a[96], b[96];
    for (int key = 0; key < 2 * S->m * S->G; key++) {
        const sim_msg *msg = &S->msgs[key];
        for (int side = 0; side < 2; side++) {
            if (!msg->posted[side]) continue;
            describe_side(S, key, side, a, sizeof a);
            describe_side(S, key, 1 - side, b, sizeof b);
            if (!msg->posted[1 - side])
                return ms_error(MS_ERR_ARG, "protocol: unmatched %s: no %s is ever posted", a, b);
            if (!msg->waited[side])
                return ms_error(MS_ERR_ARG, "protocol: %s is posted but never waited", a);
        }
    }
    for (int s = 0; s < S->pp; s++)
        for (int c = 0; c < S->vpp; c++)
            for (int mb = 0; mb < S->m; mb++) {
                int ix = pair_ix(S, s, mb, c);
                if (!S->fwd[ix] || !S->bwd[ix])
                    return ms_error(MS_ERR_ARG, "protocol: stage %d never runs %s(mb=%d,c=%d)", s,
                                    S->fwd[ix] ? "BWD" : "FWD", mb, c);
            }
    return MS_OK;
}

/* Run all stages round-robin, each as far as it can, until all finish or
 * none can move. */
static ms_status sim_run(sim *S) {
    for (;;) {
        int progressed = 0, all_done = 1;
        for (int s = 0; s < S->pp; s++) {
            while (S->pc[s] < S->plan->lens[s]) {
                int blocked;
                MS_TRY(sim_step(S, s, &blocked));
                if (blocked) break;
                S->pc[s]++;
                progressed = 1;
            }
            if (S->pc[s] < S->plan->lens[s]) all_done = 0;
        }
        if (all_done) return final_checks(S);
        if (!progressed) return report_deadlock(S);
    }
}

ms_status par_schedule_simulate(const par_plan *plan, const par_sim_costs *costs,
                                par_sim_stats *stats, int *max_in_flight) {
    if (!plan || !plan->lists || !plan->lens || plan->pp < 1 || plan->vpp < 1 || plan->n_micro < 1)
        return ms_error(MS_ERR_ARG, "pipeline validate: empty or malformed plan");
    int n = plan->pp * plan->vpp;
    if (!costs || !costs->t_fwd || !costs->t_bwd || !(costs->t_p2p >= 0))
        return ms_error(MS_ERR_ARG, "pipeline simulate: missing costs or t_p2p < 0");
    for (int i = 0; i < n; i++)
        if (!(costs->t_fwd[i] > 0) || !(costs->t_bwd[i] > 0))
            return ms_error(MS_ERR_ARG,
                            "pipeline validate: costs t_fwd=%g t_bwd=%g (stage %d chunk %d) must "
                            "be > 0",
                            costs->t_fwd[i], costs->t_bwd[i], i / plan->vpp, i % plan->vpp);
    sim S;
    MS_TRY(sim_init(&S, plan, costs));
    ms_status st = sim_run(&S);
    if (st == MS_OK) {
        par_sim_stats r = {0, 0, 0, 0, S.recv_wait, S.send_stall};
        double busy = 0;
        for (int s = 0; s < S.pp; s++) {
            double b = 0;
            for (int c = 0; c < S.vpp; c++)
                b += (double)S.m * (S.t_fwd[s * S.vpp + c] + S.t_bwd[s * S.vpp + c]);
            if (b > busy) busy = b;
            if (S.clock[s] > r.makespan) r.makespan = S.clock[s];
            if (S.max_in_flight[s] > r.max_in_flight) r.max_in_flight = S.max_in_flight[s];
            if (max_in_flight) max_in_flight[s] = S.max_in_flight[s];
        }
        r.busy = busy;
        r.bubble_fraction = (r.makespan - r.busy) / r.busy;
        if (stats) *stats = r;
    }
    sim_free(&S);
    return st;
}

ms_status par_schedule_validate(const par_plan *plan, double t_fwd, double t_bwd,
                                par_sim_stats *stats, int *max_in_flight) {
    if (!plan || !plan->lists || !plan->lens || plan->pp < 1 || plan->vpp < 1 || plan->n_micro < 1)
        return ms_error(MS_ERR_ARG, "pipeline validate: empty or malformed plan");
    if (!(t_fwd > 0) || !(t_bwd > 0))
        return ms_error(MS_ERR_ARG, "pipeline validate: costs t_fwd=%g t_bwd=%g must be > 0", t_fwd,
                        t_bwd);
    size_t n = (size_t)plan->pp * (size_t)plan->vpp;
    double *f = malloc(2 * n * sizeof *f);
    if (!f)
        return ms_error(MS_ERR_NOMEM, "pipeline validate: costs for pp=%d vpp=%d", plan->pp,
                        plan->vpp);
    for (size_t i = 0; i < n; i++)
        f[i] = t_fwd, f[n + i] = t_bwd;
    par_sim_costs c = {.t_fwd = f, .t_bwd = f + n, .t_p2p = 0};
    ms_status st = par_schedule_simulate(plan, &c, stats, max_in_flight);
    free(f);
    return st;
}

ms_status par_schedule_bubble_fraction(par_sched_kind kind, int pp, int vpp, int n_micro,
                                       double *frac) {
    par_plan plan;
    par_sim_stats stats = {0, 0, 0, 0, 0, 0};
    *frac = 0;
    MS_TRY(par_plan_build(kind, pp, vpp, n_micro, &plan));
    ms_status st = par_schedule_validate(&plan, PAR_COST_FWD, PAR_COST_BWD, &stats, NULL);
    par_plan_free(&plan);
    if (st != MS_OK)
        return ms_error_wrap(st, "pipeline schedule %s pp=%d vpp=%d n_micro=%d",
                             par_sched_kind_name(kind), pp, vpp, n_micro);
    *frac = stats.bubble_fraction;
    return MS_OK;
}
