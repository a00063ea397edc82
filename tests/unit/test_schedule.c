/* test_schedule.c - unit tests for the pipeline schedules (schedule.c) and
 * their simulator/validator (schedule_check.c): argument errors, a grid of
 * every valid (kind, pp, vpp, n_micro) checked by the simulator and by
 * independent scans of the lists (FWD/BWD exactly once on the right stage,
 * FWD before BWD, receives posted early and waited late, in-flight bound),
 * bubble fractions against the textbook formulas, and broken schedules the
 * validator must reject (it can fail).  Both communication modes: the
 * decoupled lists reach the dependency-only bound with a transfer time and
 * never stall a compute on a send; the blocking lists are deadlock-free,
 * hold nothing in flight across a compute and run the same computes; in
 * both, each stage's sends to a peer come in the order the peer receives
 * them. */
#include <stdlib.h>

#include "check.h"
#include "parallel/schedule.h"

#define MAX_PP 8
#define MAX_VPP 4
#define MAX_M 16

/* ---- helpers to edit copies of plans ---- */

/* Deep copy of a plan, with room for `extra` more instructions per list. */
static par_plan plan_copy(const par_plan *src, int extra) {
    par_plan p = *src;
    p.lists = calloc((size_t)p.pp, sizeof *p.lists);
    p.lens = calloc((size_t)p.pp, sizeof *p.lens);
    for (int s = 0; s < p.pp; s++) {
        p.lens[s] = src->lens[s];
        p.lists[s] = malloc((size_t)(src->lens[s] + extra + 1) * sizeof(par_instr));
        memcpy(p.lists[s], src->lists[s], (size_t)src->lens[s] * sizeof(par_instr));
    }
    return p;
}

/* Index of the first instruction of stage s with this op (and, for WAIT,
 * waited op; mb < 0 matches any micro-batch), at or after `from`; -1. */
static int find(const par_plan *p, int s, int from, par_op op, par_op waits, int mb) {
    for (int i = from; i < p->lens[s]; i++) {
        const par_instr *in = &p->lists[s][i];
        if (in->op == op && (op != PAR_WAIT || in->waits == waits) && (mb < 0 || in->mb == mb))
            return i;
    }
    return -1;
}

/* Remove instruction i of stage s (a failed find() counts as a failure). */
static void remove_at(par_plan *p, int s, int i) {
    T_OK(i >= 0 && i < p->lens[s]);
    if (i < 0 || i >= p->lens[s]) return;
    memmove(&p->lists[s][i], &p->lists[s][i + 1], (size_t)(p->lens[s] - i - 1) * sizeof(par_instr));
    p->lens[s]--;
}

/* Move instruction `from` of stage s to position `to` (to <= from). */
static void move_to(par_plan *p, int s, int from, int to) {
    T_OK(to >= 0 && to <= from && from < p->lens[s]);
    if (to < 0 || to > from || from >= p->lens[s]) return;
    par_instr x = p->lists[s][from];
    memmove(&p->lists[s][to + 1], &p->lists[s][to], (size_t)(from - to) * sizeof(par_instr));
    p->lists[s][to] = x;
}

/* Validate and expect failure whose message contains `want`. */
static void expect_reject(const par_plan *p, const char *want, const char *what) {
    ms_status st = par_schedule_validate(p, 1, 2, NULL, NULL);
    T_EQ_INT(st, MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), want);
    if (st == MS_OK) fprintf(stderr, "  (broken schedule '%s' was accepted)\n", what);
}

/* ---- argument errors ---- */

static void test_args(void) {
    par_instr *list = (par_instr *)1;
    int n = 7;
    T_EQ_INT(par_schedule(PAR_SCHED_1F1B, 4, 2, 8, 0, &list, &n), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "vpp=2");
    T_OK(list == NULL && n == 0);
    T_EQ_INT(par_schedule(PAR_SCHED_INTERLEAVED, 4, 2, 6, 0, &list, &n), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "n_micro=6");
    T_STR_CONTAINS(ms_errmsg(), "pp=4");
    T_EQ_INT(par_schedule(PAR_SCHED_INTERLEAVED, 1, 2, 4, 0, &list, &n), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "pp=1");
    T_EQ_INT(par_schedule(PAR_SCHED_1F1B, 0, 1, 4, 0, &list, &n), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "pp=0");
    T_EQ_INT(par_schedule(PAR_SCHED_1F1B, 2, 1, 0, 0, &list, &n), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "n_micro=0");
    T_EQ_INT(par_schedule(PAR_SCHED_1F1B, 2, 1, 4, 2, &list, &n), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "stage=2");
    T_EQ_INT(par_schedule((par_sched_kind)7, 2, 1, 4, 0, &list, &n), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "unknown kind 7");
    T_EQ_INT(par_schedule_comm(PAR_SCHED_1F1B, (par_comm)5, 2, 1, 4, 0, &list, &n), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "unknown communication mode 5");
    T_OK(list == NULL && n == 0);
    double f = -1;
    T_EQ_INT(par_schedule_bubble_fraction(PAR_SCHED_INTERLEAVED, 3, 2, 4, &f), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "n_micro=4");
    par_plan plan;
    T_EQ_INT(par_plan_build(PAR_SCHED_1F1B, 2, 3, 4, &plan), MS_ERR_ARG);
    T_OK(plan.lists == NULL);
    par_plan_free(&plan);
}

/* ---- independent scans of the lists ---- */

/* The in-flight bound the schedule is designed for, computed here from
 * Megatron's warmup counts (not through the library). */
static int in_flight_bound(par_sched_kind kind, int pp, int vpp, int m, int s) {
    int total = m * vpp, w;
    if (kind == PAR_SCHED_1F1B)
        w = pp - s; /* warmup pp-s-1 activations plus the steady phase's one */
    else if (m == pp)
        w = total; /* Megatron: all warmup */
    else
        w = (pp - s - 1) * 2 + (vpp - 1) * pp + 1;
    return w < total ? w : total;
}

/* Does this compute instruction on stage s need a receive, and which? */
static int needed_recv(const par_instr *in, int pp, int vpp, int s) {
    int g = in->chunk * pp + s;
    if (in->op == PAR_FWD) return g > 0 ? PAR_RECV_ACT : -1;
    return g < pp * vpp - 1 ? PAR_RECV_GRAD : -1;
}

/* Scan stage s's list: each (mb, chunk) FWD'd and BWD'd once, FWD first;
 * receives posted before the previous compute and waited right before use;
 * max in-flight within the bound.  Returns the number of problems (printed). */
static int scan_stage(const par_plan *p, int s, int *in_flight_out) {
    static int fpos[MAX_VPP][MAX_M], bpos[MAX_VPP][MAX_M];
    int bad = 0, prev_compute = -1, in_flight = 0, max_if = 0;
    const par_instr *L = p->lists[s];
    memset(fpos, -1, sizeof fpos), memset(bpos, -1, sizeof bpos);
    for (int i = 0; i < p->lens[s]; i++) {
        const par_instr *in = &L[i];
        if (in->op != PAR_FWD && in->op != PAR_BWD) continue;
        int *pos = in->op == PAR_FWD ? &fpos[in->chunk][in->mb] : &bpos[in->chunk][in->mb];
        bad += *pos >= 0; /* duplicate */
        *pos = i;
        in_flight += in->op == PAR_FWD ? 1 : -1;
        if (in_flight > max_if) max_if = in_flight;
        int rv = needed_recv(in, p->pp, p->vpp, s);
        if (rv >= 0) {
            /* waited right before (possibly after a send-buffer WAIT, which
             * the generator puts first) and posted before the previous compute */
            int ok_wait = i > 0 && L[i - 1].op == PAR_WAIT && (int)L[i - 1].waits == rv &&
                          L[i - 1].mb == in->mb && L[i - 1].chunk == in->chunk;
            int post = -1;
            for (int j = 0; j < i; j++)
                if ((int)L[j].op == rv && L[j].mb == in->mb && L[j].chunk == in->chunk) post = j;
            int ok_post = post >= 0 && (prev_compute < 0 || post < prev_compute);
            if (!ok_wait || !ok_post) {
                fprintf(stderr, "  stage %d #%d: recv not posted early / waited late\n", s, i);
                bad++;
            }
        }
        prev_compute = i;
    }
    for (int c = 0; c < p->vpp; c++)
        for (int mb = 0; mb < p->n_micro; mb++)
            if (fpos[c][mb] < 0 || bpos[c][mb] < 0 || fpos[c][mb] > bpos[c][mb]) {
                fprintf(stderr, "  stage %d: (mb=%d,c=%d) fwd #%d bwd #%d\n", s, mb, c, fpos[c][mb],
                        bpos[c][mb]);
                bad++;
            }
    *in_flight_out = max_if;
    return bad;
}

/* Blocking lists: every op posted after a compute is waited before the
 * next compute (nothing in flight across a FWD/BWD).  Problems printed. */
static int scan_blocking(const par_plan *p, int s) {
    int open = 0, bad = 0; /* posted and not yet waited */
    for (int i = 0; i < p->lens[s]; i++) {
        par_op op = p->lists[s][i].op;
        if (op == PAR_FWD || op == PAR_BWD) {
            if (open)
                fprintf(stderr, "  stage %d #%d: %d ops in flight over a compute\n", s, i, open);
            bad += open != 0;
        } else {
            open += op == PAR_WAIT ? -1 : 1;
        }
    }
    return bad + (open != 0);
}

/* Both modes run the same FWD/BWD sequence on every stage (the reason they
 * compute the same bits).  Returns the number of differences. */
static int same_compute_order(const par_plan *a, const par_plan *b) {
    int bad = 0;
    for (int s = 0; s < a->pp; s++) {
        int i = 0, j = 0;
        for (;;) {
            while (i < a->lens[s] && a->lists[s][i].op != PAR_FWD && a->lists[s][i].op != PAR_BWD)
                i++;
            while (j < b->lens[s] && b->lists[s][j].op != PAR_FWD && b->lists[s][j].op != PAR_BWD)
                j++;
            if (i == a->lens[s] || j == b->lens[s]) {
                bad += i != a->lens[s] || j != b->lens[s];
                break;
            }
            const par_instr *x = &a->lists[s][i++], *y = &b->lists[s][j++];
            bad += x->op != y->op || x->mb != y->mb || x->chunk != y->chunk;
        }
    }
    return bad;
}

/* For every ordered pair of stages (a -> b): a's sends to b and b's
 * receives from a name the same messages in the same order (NCCL matches
 * point-to-point by order, not by tag; see comm.h).  Problems printed. */
static int same_peer_order(const par_plan *p) {
    int G = p->pp * p->vpp, m = p->n_micro, bad = 0;
    int *key = malloc(sizeof(int) * 2 * (size_t)m * (size_t)G);
    for (int a = 0; a < p->pp; a++)
        for (int b = 0; b < p->pp; b++) {
            int ns = 0, nr = 0, wrong = 0;
            for (int i = 0; i < p->lens[a]; i++) { /* (dir, mb, destination chunk) */
                const par_instr *in = &p->lists[a][i];
                int g = in->chunk * p->pp + a;
                if ((in->op == PAR_SEND_ACT || in->op == PAR_SEND_GRAD) && in->peer == b)
                    key[ns++] =
                        in->op == PAR_SEND_ACT ? in->mb * G + g + 1 : (m + in->mb) * G + g - 1;
            }
            for (int i = 0; i < p->lens[b] && !wrong; i++) {
                const par_instr *in = &p->lists[b][i];
                int g = in->chunk * p->pp + b;
                if ((in->op == PAR_RECV_ACT || in->op == PAR_RECV_GRAD) && in->peer == a) {
                    int k = ((in->op == PAR_RECV_GRAD ? m : 0) + in->mb) * G + g;
                    wrong = nr >= ns || key[nr] != k;
                    nr++;
                }
            }
            if (wrong || nr != ns)
                fprintf(stderr, "  stage %d -> %d: sends and receives differ at message %d\n", a, b,
                        nr - 1);
            bad += wrong || nr != ns;
        }
    free(key);
    return bad;
}

/* The makespan that only the compute order and each message's transfer
 * time t_p2p allow: a FWD/BWD starts when its stage finished the compute
 * before it and its input arrived (producer's end + t_p2p).  Computed here
 * from the lists' FWD/BWD alone, with FWD costing 1 and BWD 2, as a bound
 * no placement of waits can beat.  -1 if the order cannot finish. */
static double dependency_bound(const par_plan *p, double t_p2p) {
    int pp = p->pp, m = p->n_micro, G = pp * p->vpp;
    double *end = malloc(sizeof(double) * 2 * (size_t)G * (size_t)m), *clk = calloc((size_t)pp, 8);
    int *pc = calloc((size_t)pp, sizeof(int));
    for (int i = 0; i < 2 * G * m; i++)
        end[i] = -1; /* [bwd][g][mb]: not run yet */
    double makespan = 0;
    for (int moved = 1; moved;) {
        moved = 0;
        for (int s = 0; s < pp; s++)
            for (; pc[s] < p->lens[s]; pc[s]++) {
                const par_instr *in = &p->lists[s][pc[s]];
                if (in->op != PAR_FWD && in->op != PAR_BWD) continue;
                int bwd = in->op == PAR_BWD, g = in->chunk * pp + s;
                int dep = bwd ? (g + 1 < G ? g + 1 : -1) : g - 1;
                double t = clk[s];
                if (dep >= 0) {
                    double d = end[(bwd * G + dep) * m + in->mb];
                    if (d < 0) break; /* input not produced yet */
                    if (d + t_p2p > t) t = d + t_p2p;
                }
                clk[s] = end[(bwd * G + g) * m + in->mb] = t + (bwd ? 2 : 1);
                if (clk[s] > makespan) makespan = clk[s];
                moved = 1;
            }
    }
    for (int s = 0; s < pp; s++)
        if (pc[s] < p->lens[s]) makespan = -1;
    free(end), free(clk), free(pc);
    return makespan;
}

/* With a transfer time: the decoupled lists reach the dependency bound and
 * no stage ever waits on a send before a compute (MegaScale's rules); the
 * blocking ones are never faster.  Returns the number of problems. */
static int check_transfer(const par_plan *over, const par_plan *blk) {
    int n = over->pp * over->vpp, bad = 0;
    double *f = malloc(sizeof(double) * 2 * (size_t)n);
    for (int i = 0; i < n; i++)
        f[i] = 1, f[n + i] = 2;
    static const double t_p2p[] = {0.1, 0.25, 0.5, 1.0};
    for (int k = 0; k < 4; k++) {
        par_sim_costs c = {.t_fwd = f, .t_bwd = f + n, .t_p2p = t_p2p[k]};
        par_sim_stats so, sb;
        if (par_schedule_simulate(over, &c, &so, NULL) != MS_OK ||
            par_schedule_simulate(blk, &c, &sb, NULL) != MS_OK) {
            fprintf(stderr, "  t_p2p %g: %s\n", t_p2p[k], ms_errmsg());
            bad++;
            continue;
        }
        double lb = dependency_bound(over, t_p2p[k]);
        if (fabs(so.makespan - lb) > 1e-9 || so.send_stall != 0 || sb.makespan < so.makespan) {
            fprintf(stderr,
                    "  t_p2p %g: decoupled makespan %g (bound %g, send stall %g), blocking %g\n",
                    t_p2p[k], so.makespan, lb, so.send_stall, sb.makespan);
            bad++;
        }
    }
    free(f);
    return bad;
}

/* All checks for one valid configuration, both communication modes;
 * returns 1 if all passed. */
static int check_config(par_sched_kind kind, int pp, int vpp, int m) {
    par_plan p, b;
    par_sim_stats st12, st11, stb;
    int sim_if[MAX_PP], blk_if[MAX_PP], bad = 0;
    if (par_plan_build(kind, pp, vpp, m, &p) != MS_OK) {
        fprintf(stderr, "  build failed: %s\n", ms_errmsg());
        return 0;
    }
    if (par_plan_build_comm(kind, PAR_COMM_BLOCKING, pp, vpp, m, &b) != MS_OK) {
        fprintf(stderr, "  blocking build failed: %s\n", ms_errmsg());
        par_plan_free(&p);
        return 0;
    }
    double want = (double)(pp - 1) / (vpp * m);
    if (par_schedule_validate(&p, 1, 2, &st12, sim_if) != MS_OK ||
        par_schedule_validate(&p, 1, 1, &st11, NULL) != MS_OK) {
        fprintf(stderr, "  validate failed: %s\n", ms_errmsg());
        bad++;
    } else if (fabs(st12.bubble_fraction - want) > 1e-12 ||
               fabs(st11.bubble_fraction - want) > 1e-12) {
        fprintf(stderr, "  bubble %.9g (tb=2) %.9g (tb=1), formula %.9g\n", st12.bubble_fraction,
                st11.bubble_fraction, want);
        bad++;
    }
    /* blocking: deadlock-free, and with free communication the same bubble */
    if (par_schedule_validate(&b, 1, 2, &stb, blk_if) != MS_OK) {
        fprintf(stderr, "  blocking validate failed: %s\n", ms_errmsg());
        bad++;
    } else if (fabs(stb.bubble_fraction - want) > 1e-12) {
        fprintf(stderr, "  blocking bubble %.9g, formula %.9g\n", stb.bubble_fraction, want);
        bad++;
    }
    bad += same_compute_order(&p, &b) + same_peer_order(&p) + same_peer_order(&b);
    if (!bad) bad += check_transfer(&p, &b);
    for (int s = 0; s < pp && !bad; s++) {
        int mif, bound = in_flight_bound(kind, pp, vpp, m, s);
        bad += scan_stage(&p, s, &mif) + scan_blocking(&b, s);
        if (mif > bound || mif != sim_if[s] || blk_if[s] != sim_if[s])
            fprintf(stderr, "  stage %d in flight %d (simulator %d, blocking %d), bound %d\n", s,
                    mif, sim_if[s], blk_if[s], bound),
                bad++;
    }
    par_plan_free(&p);
    par_plan_free(&b);
    if (bad)
        fprintf(stderr, "  ^ %s pp=%d vpp=%d n_micro=%d\n", par_sched_kind_name(kind), pp, vpp, m);
    return !bad;
}

/* Every (kind, pp 1..8, vpp 1..4, n_micro 1..16): valid ones pass all
 * checks, invalid ones are refused with MS_ERR_ARG. */
static void test_grid(void) {
    int valid = 0, invalid = 0;
    for (int k = 0; k < 2; k++)
        for (int pp = 1; pp <= MAX_PP; pp++)
            for (int vpp = 1; vpp <= MAX_VPP; vpp++)
                for (int m = 1; m <= MAX_M; m++) {
                    par_sched_kind kind = (par_sched_kind)k;
                    if (par_schedule_check_args(kind, pp, vpp, m) != MS_OK) {
                        par_plan p;
                        T_EQ_INT(par_plan_build(kind, pp, vpp, m, &p), MS_ERR_ARG);
                        invalid++;
                        continue;
                    }
                    T_OK(check_config(kind, pp, vpp, m));
                    valid++;
                }
    /* 1F1B: 8*16 configs with vpp=1; interleaved: pp>=2, m%pp==0, any vpp. */
    int want_valid = MAX_PP * MAX_M;
    for (int pp = 2; pp <= MAX_PP; pp++)
        want_valid += MAX_VPP * (MAX_M / pp);
    T_EQ_INT(valid, want_valid);
    T_EQ_INT(valid + invalid, 2 * MAX_PP * MAX_VPP * MAX_M);
    printf("grid: %d valid configurations checked, %d invalid refused\n", valid, invalid);
}

/* ---- bubble fraction ---- */

static void test_bubble(void) {
    static const int pps[] = {2, 3, 4, 8}, vpps[] = {1, 2, 3, 4}, mults[] = {1, 2, 4};
    for (int a = 0; a < 4; a++)
        for (int c = 0; c < 3; c++) {
            int pp = pps[a], m = pp * mults[c];
            double f1 = -1;
            T_EQ_INT(par_schedule_bubble_fraction(PAR_SCHED_1F1B, pp, 1, m, &f1), MS_OK);
            T_NEAR(f1, (double)(pp - 1) / m, 1e-12);
            for (int b = 0; b < 4; b++) {
                int vpp = vpps[b];
                double fi = -1;
                T_EQ_INT(par_schedule_bubble_fraction(PAR_SCHED_INTERLEAVED, pp, vpp, m, &fi),
                         MS_OK);
                T_NEAR(fi, (double)(pp - 1) / (vpp * m), 1e-12);
                if (vpp > 1) T_OK(fi < f1);
            }
        }
    double f[3];
    T_EQ_INT(par_schedule_bubble_fraction(PAR_SCHED_1F1B, 4, 1, 8, &f[0]), MS_OK);
    T_EQ_INT(par_schedule_bubble_fraction(PAR_SCHED_INTERLEAVED, 4, 2, 8, &f[1]), MS_OK);
    T_EQ_INT(par_schedule_bubble_fraction(PAR_SCHED_INTERLEAVED, 4, 4, 8, &f[2]), MS_OK);
    T_NEAR(f[0], 0.375, 1e-12);
    T_NEAR(f[1], 0.1875, 1e-12);
    T_NEAR(f[2], 0.09375, 1e-12);
    printf("bubble pp=4 n_micro=8: vpp=1 %.5f, vpp=2 %.5f, vpp=4 %.5f\n", f[0], f[1], f[2]);
    /* 1F1B with fewer micro-batches than stages: still (p-1)/m. */
    T_EQ_INT(par_schedule_bubble_fraction(PAR_SCHED_1F1B, 8, 1, 3, &f[0]), MS_OK);
    T_NEAR(f[0], 7.0 / 3.0, 1e-12);
    /* No pipeline, no bubble. */
    T_EQ_INT(par_schedule_bubble_fraction(PAR_SCHED_1F1B, 1, 1, 5, &f[0]), MS_OK);
    T_NEAR(f[0], 0.0, 0);
}

/* ---- broken schedules the validator must reject ---- */

/* Dropped receive post (its WAIT kept), and dropped post + WAIT. */
static void test_dropped_recv(par_sched_kind kind, int pp, int vpp, int m) {
    par_plan base, p;
    T_EQ_INT(par_plan_build(kind, pp, vpp, m, &base), MS_OK);
    p = plan_copy(&base, 0);
    remove_at(&p, 1, find(&p, 1, 0, PAR_RECV_ACT, PAR_WAIT, 1));
    expect_reject(&p, "WAIT for an operation never posted", "recv post dropped");
    par_plan_free(&p);

    p = plan_copy(&base, 0);
    remove_at(&p, 1, find(&p, 1, 0, PAR_RECV_ACT, PAR_WAIT, 1));
    remove_at(&p, 1, find(&p, 1, 0, PAR_WAIT, PAR_RECV_ACT, 1));
    expect_reject(&p, "FWD before its activation arrived", "recv post and wait dropped");
    par_plan_free(&p);

    p = plan_copy(&base, 0); /* backward side: no gradient for stage 0 */
    remove_at(&p, 0, find(&p, 0, 0, PAR_RECV_GRAD, PAR_WAIT, 0));
    remove_at(&p, 0, find(&p, 0, 0, PAR_WAIT, PAR_RECV_GRAD, 0));
    expect_reject(&p, "BWD before its gradient arrived", "grad recv dropped");
    par_plan_free(&p);

    p = plan_copy(&base, 0); /* a send dropped: its receiver waits forever */
    remove_at(&p, 0, find(&p, 0, 0, PAR_SEND_ACT, PAR_WAIT, 0));
    remove_at(&p, 0, find(&p, 0, 0, PAR_WAIT, PAR_SEND_ACT, 0));
    expect_reject(&p, "deadlock", "send dropped");
    T_STR_CONTAINS(ms_errmsg(), "stage 1 blocked at");
    T_STR_CONTAINS(ms_errmsg(), "WAIT(RECV_ACT mb=0,c=0,from=0)");
    par_plan_free(&p);
    par_plan_free(&base);
}

/* Reorderings that deadlock: stage 0 waits for the gradient of mb 0 before
 * running the FWD it depends on. */
static void test_deadlock(par_sched_kind kind, int pp, int vpp, int m) {
    par_plan base, p;
    T_EQ_INT(par_plan_build(kind, pp, vpp, m, &base), MS_OK);
    p = plan_copy(&base, 0);
    int c_last = vpp - 1; /* stage 0's first gradient arrives for its last chunk */
    int post = find(&p, 0, 0, PAR_RECV_GRAD, PAR_WAIT, 0);
    while (post >= 0 && p.lists[0][post].chunk != c_last)
        post = find(&p, 0, post + 1, PAR_RECV_GRAD, PAR_WAIT, 0);
    int wait = find(&p, 0, post, PAR_WAIT, PAR_RECV_GRAD, 0);
    T_OK(post >= 0 && wait > post);
    if (post >= 0 && wait > post) move_to(&p, 0, post, 0), move_to(&p, 0, wait, 1);
    expect_reject(&p, "deadlock", "grad wait moved to the front");
    T_STR_CONTAINS(ms_errmsg(), "stage 0 blocked at #1 WAIT(RECV_GRAD mb=0");
    par_plan_free(&p);
    par_plan_free(&base);
}

/* The smallest swap deadlock: pp=2, n_micro=1, stage 0 waits for the
 * gradient before posting the activation send it depends on. */
static void test_swap_deadlock(void) {
    par_plan base, p;
    T_EQ_INT(par_plan_build(PAR_SCHED_1F1B, 2, 1, 1, &base), MS_OK);
    T_EQ_INT(par_schedule_validate(&base, 1, 2, NULL, NULL), MS_OK);
    p = plan_copy(&base, 0);
    int i = find(&p, 0, 0, PAR_SEND_ACT, PAR_WAIT, 0);
    int ok = i >= 0 && i + 1 < p.lens[0] && p.lists[0][i + 1].op == PAR_WAIT &&
             p.lists[0][i + 1].waits == PAR_RECV_GRAD;
    T_OK(ok);
    if (ok) {
        par_instr t = p.lists[0][i];
        p.lists[0][i] = p.lists[0][i + 1];
        p.lists[0][i + 1] = t;
    }
    expect_reject(&p, "deadlock", "send/wait swapped");
    T_STR_CONTAINS(ms_errmsg(), "stage 0 blocked at #2 WAIT(RECV_GRAD mb=0,c=0,from=1)");
    T_STR_CONTAINS(ms_errmsg(), "stage 1 blocked at #1 WAIT(RECV_ACT mb=0,c=0,from=0)");
    par_plan_free(&p);
    par_plan_free(&base);
}

/* Send-buffer reuse, never-waited send, wrong peer, duplicate post. */
static void test_send_errors(par_sched_kind kind, int pp, int vpp, int m) {
    par_plan base, p;
    T_EQ_INT(par_plan_build(kind, pp, vpp, m, &base), MS_OK);
    p = plan_copy(&base, 0);
    remove_at(&p, 0, find(&p, 0, 0, PAR_WAIT, PAR_SEND_ACT, 0));
    expect_reject(&p, "buffer reused before its WAIT", "send wait dropped");
    par_plan_free(&p);

    p = plan_copy(&base, 0); /* the last instruction waits a send */
    T_EQ_INT(p.lists[0][p.lens[0] - 1].op, PAR_WAIT);
    p.lens[0]--;
    expect_reject(&p, "posted but never waited", "final send wait dropped");
    par_plan_free(&p);

    p = plan_copy(&base, 0);
    int i = find(&p, 0, 0, PAR_SEND_ACT, PAR_WAIT, 0);
    T_OK(i >= 0);
    if (i >= 0) p.lists[0][i].peer = pp - 1;
    expect_reject(&p, "wrong peer stage, expected 1", "send to the wrong stage");
    par_plan_free(&p);

    p = plan_copy(&base, 1);
    i = find(&p, 1, 0, PAR_RECV_ACT, PAR_WAIT, 0);
    T_OK(i >= 0);
    if (i >= 0) {
        memmove(&p.lists[1][i + 1], &p.lists[1][i], (size_t)(p.lens[1] - i) * sizeof(par_instr));
        p.lens[1]++;
    }
    expect_reject(&p, "posted twice", "recv posted twice");
    par_plan_free(&p);
    par_plan_free(&base);
}

/* Lists cut short (unmatched messages), BWD before FWD, missing BWD. */
static void test_incomplete(void) {
    par_plan base, p;
    T_EQ_INT(par_plan_build(PAR_SCHED_1F1B, 2, 1, 1, &base), MS_OK);
    p = plan_copy(&base, 0);
    p.lens[1] = 0;                                             /* stage 1 does nothing */
    p.lens[0] = find(&p, 0, 0, PAR_SEND_ACT, PAR_WAIT, 0) + 1; /* stage 0 stops after its send */
    T_OK(p.lens[0] > 0);
    expect_reject(&p, "unmatched SEND_ACT(mb=0,c=0) of stage 0", "lists cut short");
    T_STR_CONTAINS(ms_errmsg(), "no RECV_ACT(mb=0,c=0) of stage 1 is ever posted");
    par_plan_free(&p);
    par_plan_free(&base);

    T_EQ_INT(par_plan_build(PAR_SCHED_1F1B, 1, 1, 2, &base), MS_OK);
    T_EQ_INT(base.lens[0], 4); /* no pipeline: FWD BWD FWD BWD */
    p = plan_copy(&base, 0);
    par_instr t = p.lists[0][0];
    p.lists[0][0] = p.lists[0][1];
    p.lists[0][1] = t;
    expect_reject(&p, "BWD before its FWD", "FWD/BWD swapped");
    par_plan_free(&p);
    p = plan_copy(&base, 0);
    p.lens[0]--;
    expect_reject(&p, "never runs BWD(mb=1,c=0)", "last BWD dropped");
    par_plan_free(&p);
    p = plan_copy(&base, 0);
    p.lists[0][2].mb = 0;
    expect_reject(&p, "runs a second time", "FWD repeated");
    par_plan_free(&p);
    par_plan_free(&base);
}

/* Printing helpers produce readable names. */
static void test_print(void) {
    char buf[96];
    par_instr f = {PAR_FWD, 3, 1, -1, PAR_WAIT};
    par_instr s = {PAR_SEND_ACT, 3, 1, 2, PAR_WAIT};
    par_instr w = {PAR_WAIT, 0, 0, 1, PAR_RECV_GRAD};
    T_STR_CONTAINS(par_instr_str(&f, buf, sizeof buf), "FWD(mb=3,c=1)");
    T_STR_CONTAINS(par_instr_str(&s, buf, sizeof buf), "SEND_ACT(mb=3,c=1,to=2)");
    T_STR_CONTAINS(par_instr_str(&w, buf, sizeof buf), "WAIT(RECV_GRAD mb=0,c=0,from=1)");
    par_instr *list;
    int n;
    T_EQ_INT(par_schedule(PAR_SCHED_INTERLEAVED, 2, 2, 2, 1, &list, &n), MS_OK);
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull) par_schedule_print(devnull, list, n), fclose(devnull);
    T_EQ_INT(list[0].op, PAR_RECV_ACT); /* stage 1 starts by posting its receives */
    free(list);
}

int main(void) {
    test_args();
    test_grid();
    test_bubble();
    test_dropped_recv(PAR_SCHED_1F1B, 4, 1, 8);
    test_dropped_recv(PAR_SCHED_INTERLEAVED, 4, 2, 8);
    test_deadlock(PAR_SCHED_1F1B, 4, 1, 8);
    test_deadlock(PAR_SCHED_INTERLEAVED, 4, 2, 8);
    test_deadlock(PAR_SCHED_INTERLEAVED, 2, 4, 2);
    test_swap_deadlock();
    test_send_errors(PAR_SCHED_1F1B, 4, 1, 8);
    test_send_errors(PAR_SCHED_INTERLEAVED, 4, 3, 8);
    test_incomplete();
    test_print();
    return ms_test_summary("test_schedule");
}
