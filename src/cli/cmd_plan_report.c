/* cmd_plan_report.c - `megascale plan`'s output: the step's breakdown and
 * what running at scale costs (group initialisation at 1k-16k ranks,
 * checkpoint stall and restore, ETTR against failure rate and checkpoint
 * interval, the --ckpt-every to choose). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/plan_cli.h"

typedef struct {
    plan_ckpt_cost ck;
    int nodes;
    double opt_s; /* Young/Daly's interval, at least the persist less the stall */
    int paced;    /* the persist made it longer than Young/Daly's */
    int every;    /* steps: the user's, or the optimum's */
    double ettr;  /* at `every` */
} scale_view;

/* A checkpoint interval of `s` seconds in steps: at least 1, at most INT_MAX (a node MTBF of
 * 1e15 hours and a fast step gave more steps than an int holds, printed negative). */
static int steps_of(double s, double iter_s) {
    double n = round(s / iter_s);
    return n < 1 ? 1 : n > INT_MAX ? INT_MAX : (int)n;
}

/* The rows of the ETTR table: a quarter, half, one, two and four times the interval to choose,
 * in steps, each once (a step longer than a quarter of the interval, or intervals past INT_MAX
 * steps, round several to the same count: the table printed and marked them all), ascending,
 * into every[ETTR_ROWS]; returns how many. */
#define ETTR_ROWS 5
static int ettr_rows(double opt_s, double iter_s, int *every) {
    static const double k[ETTR_ROWS] = {0.25, 0.5, 1, 2, 4};
    int n = 0;
    for (int i = 0; i < ETTR_ROWS; i++) {
        int e = steps_of(opt_s * k[i], iter_s);
        if (n == 0 || e > every[n - 1]) every[n++] = e;
    }
    return n;
}

/* Hours with the fewest decimals (up to 3) that keep them within 0.5%, so that the table's
 * columns, a factor of 2 apart, never read the same (--mtbf-hours 1 printed 0h, 0h, 1h, 2h);
 * else, and from a million on, three significant digits.  Returns buf. */
static const char *hours(char *buf, size_t size, double h) {
    for (int d = 0; d <= 3 && h < 1e6; d++) {
        double p = pow(10, d);
        if (fabs(round(h * p) / p - h) <= 0.005 * h) {
            snprintf(buf, size, "%.*f", d, h);
            return buf;
        }
    }
    snprintf(buf, size, "%.3g", h);
    return buf;
}

static scale_view scale_of(const plan_model *m, const plan_layout *l, const plan_cluster *c,
                           const plan_result *r, const plan_scale_args *sa) {
    scale_view v;
    v.ck = plan_ckpt_time(m, l, c);
    v.nodes = (l->gpus + c->gpus_per_node - 1) / c->gpus_per_node;
    v.opt_s = plan_ckpt_interval_best(&v.ck, sa->mtbf_hours, v.nodes);
    v.paced = v.opt_s > plan_ckpt_interval_opt(sa->mtbf_hours, v.nodes, v.ck.stall_s);
    v.every = sa->ckpt_every > 0 ? sa->ckpt_every : steps_of(v.opt_s, r->iter_s);
    double every_s = v.every * r->iter_s;
    v.ettr =
        plan_ettr(sa->mtbf_hours, v.nodes, every_s, plan_ckpt_stall(&v.ck, every_s), sa->restart_s);
    return v;
}

static void print_scale(FILE *f, const plan_model *m, const plan_layout *l, const plan_cluster *c,
                        const plan_result *r, const plan_scale_args *sa) {
    int ranks[PLAN_INIT_SCALES], n_scales = plan_init_scales(l->tp, l->pp, ranks);
    fprintf(f,
            "\ngroup initialisation (tp %d, pp %d): ranks, groups, ours (one split per "
            "dimension), a store barrier per group%s\n",
            l->tp, l->pp,
            n_scales < PLAN_INIT_SCALES || ranks[0] != 1024
                ? " (a job is whole tp x pp replicas: the multiples of tp x pp nearest to 1k-16k)"
                : "");
    for (int i = 0; i < n_scales; i++) {
        int n = ranks[i];
        plan_init_cost g = plan_init_time(c, n, l->tp, l->pp);
        fprintf(f, "  %6d ranks %6d groups  %8.1f s  %10.1f s\n", n, g.groups, g.ours_s,
                g.barrier_s);
    }
    scale_view v = scale_of(m, l, c, r, sa);
    fprintf(f,
            "checkpoint: %.2f GB per GPU; stall %.2f s (to host memory), persist %.1f s in "
            "the background, restore %.1f s (one reader per shard + broadcast; %.1f s if "
            "every rank reads)\n",
            v.ck.state_gb_per_gpu, v.ck.stall_s, v.ck.persist_s, v.ck.restore_s,
            v.ck.restore_all_s);
    char h1[32], h2[32];
    fprintf(f, "failures: %d nodes, node MTBF %s h -> a failure every %s h; restart %.0f s\n",
            v.nodes, hours(h1, sizeof h1, sa->mtbf_hours),
            hours(h2, sizeof h2, sa->mtbf_hours / v.nodes), sa->restart_s);
    fprintf(f, "ETTR by checkpoint interval (steps) and node MTBF:\n  %10s", "every");
    static const double mt[] = {0.25, 0.5, 1, 2};
    for (int j = 0; j < 4; j++)
        fprintf(f, " %8sh", hours(h1, sizeof h1, sa->mtbf_hours * mt[j]));
    fprintf(f, "\n");
    int opt = steps_of(v.opt_s, r->iter_s), every[ETTR_ROWS];
    int rows = ettr_rows(v.opt_s, r->iter_s, every);
    for (int i = 0; i < rows; i++) {
        fprintf(f, "  %10d", every[i]);
        double every_s = every[i] * r->iter_s;
        for (int j = 0; j < 4; j++)
            fprintf(f, " %8.1f%%",
                    100 * plan_ettr(sa->mtbf_hours * mt[j], v.nodes, every_s,
                                    plan_ckpt_stall(&v.ck, every_s), sa->restart_s));
        fprintf(f, "%s\n",
                every[i] != opt ? ""
                : v.paced       ? "   <- the persist's time (Young/Daly's is shorter)"
                                : "   <- Young/Daly");
    }
    fprintf(f, "choose --ckpt-every %d (every %.0f s): ETTR %.1f%%\n", v.every, v.every * r->iter_s,
            100 * v.ettr);
}

static char *scale_json(const plan_model *m, const plan_layout *l, const plan_cluster *c,
                        const plan_result *r, const plan_scale_args *sa) {
    scale_view v = scale_of(m, l, c, r, sa);
    char *s = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&s, &len);
    if (!mf) return NULL;
    fprintf(mf, "{\"init\":[");
    int ranks[PLAN_INIT_SCALES], n_scales = plan_init_scales(l->tp, l->pp, ranks);
    for (int i = 0; i < n_scales; i++) {
        plan_init_cost g = plan_init_time(c, ranks[i], l->tp, l->pp);
        fprintf(mf, "%s{\"ranks\":%d,\"groups\":%d,\"ours_s\":%.6g,\"barrier_s\":%.6g}",
                i ? "," : "", ranks[i], g.groups, g.ours_s, g.barrier_s);
    }
    fprintf(mf,
            "],\"ckpt\":{\"state_gb_per_gpu\":%.6g,\"stall_s\":%.6g,\"persist_s\":%.6g,"
            "\"restore_s\":%.6g,\"restore_all_s\":%.6g},\"nodes\":%d,\"ckpt_interval_opt_s\":"
            "%.6g,\"ckpt_every\":%d,\"ettr\":%.6g}",
            v.ck.state_gb_per_gpu, v.ck.stall_s, v.ck.persist_s, v.ck.restore_s, v.ck.restore_all_s,
            v.nodes, v.opt_s, v.every, v.ettr);
    fclose(mf);
    return s;
}

int plan_cli_report(FILE *f, int json, const plan_model *m, const plan_layout *l,
                    const plan_cluster *c, const plan_result *r, const plan_scale_args *sa) {
    if (!json) {
        plan_result_print(f, m, l, c, r);
        print_scale(f, m, l, c, r, sa);
        return 0;
    }
    char *j = plan_result_json(m, l, c, r), *s = scale_json(m, l, c, r, sa);
    int rc = 0;
    if (!j || !s || !*j) {
        rc = cli_fail("plan", ms_error(MS_ERR_NOMEM, "out of memory formatting the result"));
    } else {
        j[strlen(j) - 1] = 0; /* drop the closing brace, add "scale" */
        fprintf(f, "%s,\"scale\":%s}\n", j, s);
    }
    free(j);
    free(s);
    return rc;
}
