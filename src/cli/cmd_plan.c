/* cmd_plan.c - `megascale plan`: the scale planner (src/plan/plan.h).
 *   megascale plan [--model NAME | --layers --dim --heads --vocab --seq] --gpus N
 *                  --cluster FILE|NAME [--tp --pp --vpp --batch --micro-batch]
 *                  [--features megatron|megascale|ours|LIST] [--search] [--json]
 *   megascale plan measure --out FILE [--base FILE]   (cmd_plan_measure.c)
 * Exit codes: 0, 2 usage (a bad option, a layout that does not divide), 3
 * a bad cluster file. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "cli/plan_cli.h"
#include "model/gpt.h"
#include "plan/plan.h"

#ifndef MS_DATA_DIR
#define MS_DATA_DIR "data"
#endif

typedef struct {
    char *model, *block, *cluster, *features, *recompute, *data_dir;
    int layers, dim, heads, vocab, seq, seq_max, window;
    int probe;
    int gpus, tp, pp, vpp, batch, micro;
    int json, search, top, max_vpp, max_micro, ckpt_every;
    double mtbf_hours, restart_s;
} plan_cli;

#define O(n, t, f, d, r, h)                                                                        \
    {                                                                                              \
        .name = n, .type = t, .offset = offsetof(plan_cli, f), .def = d, .help = h, .env = NULL,   \
        .range = r, .per_rank = 0                                                                  \
    }
static const opts_spec plan_opts[] = {
    O("model", OPT_T_STR, model, NULL, NULL,
      "model preset: megascale-175b (96 x 12288, 128 heads, vocab 64000, seq 2048), gpt3-175b, "
      "megascale-530b, or d6 d12 d24 d36 d48 (GPT-2); --layers ... override it"),
    O("layers", OPT_T_INT, layers, "0", "[0,100000]", "blocks (0: the preset's)"),
    O("dim", OPT_T_INT, dim, "0", "[0,1000000]", "model width (0: the preset's)"),
    O("heads", OPT_T_INT, heads, "0", "[0,100000]", "attention heads (0: the preset's)"),
    O("vocab", OPT_T_INT, vocab, "0", "[0,100000000]", "vocabulary (0: the preset's)"),
    O("seq", OPT_T_INT, seq, "0", "[0,10000000]", "tokens per sequence (0: the preset's)"),
    O("seq-max", OPT_T_INT, seq_max, "0", "[0,10000000]",
      "rows of the position table, the trainer's --seq-max (0: a trainer preset's, d6 ... d48: "
      "1024; else --seq)"),
    O("block", OPT_T_STR, block, NULL, NULL,
      "serial or parallel (default: from --features: parallel with megascale)"),
    O("window", OPT_T_INT, window, "-1", "[-1,10000000]",
      "sliding attention window (0: full; -1: 512 when --features has window, else full)"),
    O("gpus", OPT_T_INT, gpus, "0", "[0,16777216]", "GPUs (ranks) of the job"),
    O("cluster", OPT_T_STR, cluster, NULL, NULL,
      "cluster file, or a shipped one: a100-megascale, h100-node, h200-node, dev-cpu "
      "(data/clusters)"),
    O("tp", OPT_T_INT, tp, "0", "[0,65536]",
      "tensor-parallel ranks (inside a node; 0: 1, or searched with --search)"),
    O("pp", OPT_T_INT, pp, "0", "[0,65536]", "pipeline stages (0: 1, or searched with --search)"),
    O("vpp", OPT_T_INT, vpp, "0", "[0,65536]",
      "model chunks per stage (> 1: interleaved 1F1B; 0: 1, or searched with --search)"),
    O("batch", OPT_T_INT, batch, "0", "[0,1073741824]", "sequences per optimizer step, global"),
    O("micro-batch", OPT_T_INT, micro, "0", "[0,1073741824]",
      "sequences per micro-batch (0: 1, or searched with --search)"),
    O("features", OPT_T_STR, features, "megascale", NULL,
      "megatron, megascale, ours (this trainer: TP, PP and DP overlap, fused, async data, fp32 "
      "ZeRO gathers) or a comma list of parallel, window, tp-overlap, pp-overlap, dp-overlap, "
      "fused, data, lamb, fp32-gather (none: Megatron-LM's baseline)"),
    O("probe", OPT_T_INT, probe, "-1", "[-1,1]",
      "1: count the trainer's peak probe (three GEMM matrices on top of the rest), 0: not (a run "
      "given --peak-flops), -1: as the trainer does on this cluster (CPU or fp32: 1; a bf16 GPU, "
      "whose peak is in its table: 0)"),
    O("recompute", OPT_T_STR, recompute, NULL, NULL,
      "activation recomputation: the trainer's none, gelu, ln, gelu,ln (its --recompute; ln only "
      "with tp 1), or Megatron-LM's selective, full (default: selective with megatron, else "
      "none)"),
    OPTS_FLAG("json", plan_cli, json, "1 (or a bare --json): one JSON object"),
    OPTS_FLAG("search", plan_cli, search,
              "1 (or a bare --search): rank the layouts (tp, pp, vpp, micro-batch) that fit in "
              "memory"),
    O("top", OPT_T_INT, top, "10", "[1,1000]", "--search: layouts shown"),
    O("max-vpp", OPT_T_INT, max_vpp, "8", "[1,64]", "--search: largest vpp tried"),
    O("max-micro", OPT_T_INT, max_micro, "8", "[1,4096]", "--search: largest micro-batch tried"),
    O("mtbf-hours", OPT_T_DOUBLE, mtbf_hours, "20000", "(0,1e30]",
      "mean time between failures of one node, hours (for the ETTR)"),
    O("restart-s", OPT_T_DOUBLE, restart_s, "600", "[0,1e30]",
      "seconds from a failure to training again (detect, evict, restart, restore)"),
    O("ckpt-every", OPT_T_INT, ckpt_every, "0", "[0,)",
      "steps between checkpoints for the ETTR (0: Young/Daly's optimum)"),
    /* the environment as sample's and data's (the docs said so; plan read only the option) */
    {.name = "data-dir",
     .type = OPT_T_STR,
     .offset = offsetof(plan_cli, data_dir),
     .def = MS_DATA_DIR,
     .help = "where the shipped cluster files are (DIR/clusters/NAME.json)",
     .env = "MS_DATA_DIR",
     .range = NULL,
     .per_rank = 0},
};
#undef O
#define N_PLAN_OPTS ((int)(sizeof plan_opts / sizeof plan_opts[0]))

static const char *usage_text =
    "usage: megascale plan --cluster FILE|NAME --gpus N [--model NAME | --layers L --dim H\n"
    "                      --heads A --vocab V --seq S] --batch B [--micro-batch b]\n"
    "                      [--tp T --pp P --vpp V] [--features megatron|megascale|ours|LIST]\n"
    "                      [--search] [--json]\n"
    "       megascale plan measure --out FILE [--base FILE] (megascale plan measure --help)\n\n"
    "Predicts the step time, MFU and memory per GPU of training the model on the cluster\n"
    "with the layout (dp = gpus / (tp x pp)), part by part, and what scale costs: group\n"
    "initialisation, checkpoint stall and restore, the effective training time ratio with\n"
    "failures.  --search ranks the layouts that fit.  docs/planning.md.";

typedef struct {
    const char *name;
    plan_model m;
} model_preset;

static const model_preset presets[] = {
    {"megascale-175b", {.layers = 96, .dim = 12288, .heads = 128, .vocab = 64000, .seq = 2048}},
    {"gpt3-175b", {.layers = 96, .dim = 12288, .heads = 96, .vocab = 50257, .seq = 2048}},
    {"megascale-530b", {.layers = 105, .dim = 20480, .heads = 160, .vocab = 64000, .seq = 2048}},
};

static ms_status model_of(const plan_cli *o, plan_model *m) {
    memset(m, 0, sizeof *m);
    if (o->model) {
        size_t i = 0;
        while (i < sizeof presets / sizeof presets[0] && strcmp(presets[i].name, o->model))
            i++;
        if (i < sizeof presets / sizeof presets[0]) {
            *m = presets[i].m;
        } else {
            gpt_config g;
            ms_status st = gpt_config_preset(&g, o->model);
            if (st != MS_OK)
                return ms_error(MS_ERR_ARG,
                                "--model %s: unknown (megascale-175b, gpt3-175b, "
                                "megascale-530b, d6, d12, d24, d36, d48)",
                                o->model);
            *m = (plan_model){.layers = g.n_layer,
                              .dim = g.n_embd,
                              .heads = g.n_head,
                              .vocab = g.vocab,
                              .seq = g.seq_max,
                              .seq_max = g.seq_max};
        }
    }
    if (o->layers) m->layers = o->layers;
    if (o->dim) m->dim = o->dim;
    if (o->heads) m->heads = o->heads;
    if (o->vocab) m->vocab = o->vocab;
    if (o->seq_max) m->seq_max = o->seq_max;
    /* without --seq, a preset's sequence is as long as its table allows */
    if (o->seq)
        m->seq = o->seq;
    else if (m->seq_max > 0 && m->seq > m->seq_max)
        m->seq = m->seq_max;
    return MS_OK;
}

/* --features: a preset or a list; also sets the block and window defaults
 * (*parallel, *window: 1 / 512 when the list names them). */
static ms_status features_of(const char *s, plan_features *f, int *parallel, int *window) {
    memset(f, 0, sizeof *f);
    *parallel = *window = 0;
    if (!strcmp(s, "megatron")) {
        f->recompute = PLAN_RECOMPUTE_SELECTIVE;
        return MS_OK;
    }
    if (!strcmp(s, "megascale"))
        s = "parallel,window,tp-overlap,pp-overlap,dp-overlap,fused,data,lamb";
    if (!strcmp(s, "ours")) { /* this trainer: also its pipeline's limit on message tags */
        f->pipe_tags = 1;
        s = "tp-overlap,pp-overlap,dp-overlap,fused,data,fp32-gather";
    }
    if (!*s)
        return ms_error(MS_ERR_ARG, "--features is empty (megatron, megascale, ours, a list, or "
                                    "none)");
    size_t len = strlen(s); /* (strtok passed over an empty entry: "fused,,lamb") */
    if (strstr(s, ",,") || s[0] == ',' || (len && s[len - 1] == ','))
        return ms_error(MS_ERR_ARG, "--features %s: an empty entry in the list", s);
    /* the whole list (before, a copy of 255 characters dropped what came after) */
    char *buf = strdup(s);
    if (!buf) return ms_error(MS_ERR_NOMEM, "--features: out of memory");
    ms_status st = MS_OK;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && st == MS_OK;
         t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "parallel"))
            *parallel = 1;
        else if (!strcmp(t, "window"))
            *window = 1;
        else if (!strcmp(t, "tp-overlap"))
            f->tp_overlap = 1;
        else if (!strcmp(t, "pp-overlap"))
            f->pp_overlap = 1;
        else if (!strcmp(t, "dp-overlap"))
            f->dp_overlap = 1;
        else if (!strcmp(t, "fused"))
            f->fused = 1;
        else if (!strcmp(t, "data"))
            f->async_data = 1;
        else if (!strcmp(t, "lamb"))
            f->lamb = 1;
        else if (!strcmp(t, "fp32-gather"))
            f->fp32_gather = 1;
        else if (!strcmp(t, "megatron") || !strcmp(t, "megascale") || !strcmp(t, "ours"))
            st = ms_error(MS_ERR_ARG,
                          "--features %s: '%s' is a preset, given alone (--features %s); a "
                          "list names features: parallel, window, tp-overlap, pp-overlap, "
                          "dp-overlap, fused, data, lamb, fp32-gather",
                          s, t, t);
        else if (strcmp(t, "none"))
            st = ms_error(MS_ERR_ARG,
                          "--features: unknown feature '%s' (megatron, megascale, ours, or a "
                          "list of parallel, window, tp-overlap, pp-overlap, dp-overlap, fused, "
                          "data, lamb, fp32-gather, none)",
                          t);
    }
    free(buf);
    return st;
}

static ms_status inputs(const plan_cli *o, const plan_cluster *c, plan_model *m, plan_layout *l,
                        plan_features *f) {
    MS_TRY(model_of(o, m));
    int parallel, window;
    MS_TRY(features_of(o->features, f, &parallel, &window));
    /* the trainer without --peak-flops probes, but reads a bf16 GPU's peak from its table */
    f->peak_probe = o->probe >= 0 ? o->probe : c->cores > 0 || c->act_bytes >= 4;
    m->parallel_block = parallel;
    if (o->block && !strcmp(o->block, "parallel"))
        m->parallel_block = 1;
    else if (o->block && !strcmp(o->block, "serial"))
        m->parallel_block = 0;
    else if (o->block)
        return ms_error(MS_ERR_ARG, "--block %s: serial or parallel", o->block);
    m->window = o->window >= 0 ? o->window : window ? 512 : 0;
    if (o->recompute) { /* Megatron-LM's modes, or the trainer's own (its parser) */
        int flags = 0;
        if (!strcmp(o->recompute, "selective"))
            f->recompute = PLAN_RECOMPUTE_SELECTIVE;
        else if (!strcmp(o->recompute, "full"))
            f->recompute = PLAN_RECOMPUTE_FULL;
        else if (gpt_recompute_parse(o->recompute, &flags) == MS_OK)
            f->recompute = plan_recompute_of_flags(flags);
        else
            return ms_error(MS_ERR_ARG,
                            "--recompute %s: the trainer's none, gelu, ln or gelu,ln, or "
                            "Megatron-LM's selective or full",
                            o->recompute);
    }
    if (o->gpus < 1) return ms_error(MS_ERR_ARG, "--gpus: give the job's GPU count (>= 1)");
    if (o->batch < 1) return ms_error(MS_ERR_ARG, "--batch: give the global batch (sequences)");
    /* 0: 1, or with --search what the search picks (a value given: fixed) */
    int unset = o->search ? 0 : 1;
    *l = (plan_layout){.gpus = o->gpus,
                       .tp = o->tp ? o->tp : unset,
                       .pp = o->pp ? o->pp : unset,
                       .vpp = o->vpp ? o->vpp : unset,
                       .batch = o->batch,
                       .micro = o->micro ? o->micro : unset};
    if (o->search) { /* the model and the batch only: the search picks the rest */
        plan_layout one = {.gpus = 1, .tp = 1, .pp = 1, .vpp = 1, .batch = 1, .micro = 1};
        MS_TRY(plan_check(m, &one));
        /* what the command line fixed, each value on its own: its own reason, not "no
         * layout is valid" naming the batch */
        /* a tp given is taken as without --search (a tp group may span two
         * nodes' GPUs, as the trainer allows: --tp 3 on nodes of 8 was
         * planned without --search and refused with it); the search's own
         * choices divide the node */
        if (l->tp && (m->heads % l->tp || l->tp > c->gpus_per_node))
            return ms_error(MS_ERR_ARG,
                            "--search --tp %d: tp must divide --heads %d and be at most the "
                            "node's %d GPUs",
                            l->tp, m->heads, c->gpus_per_node);
        if (l->pp && m->layers % l->pp)
            return ms_error(MS_ERR_ARG, "--search --pp %d does not divide the %d layers", l->pp,
                            m->layers);
        if (l->vpp > 1 && l->pp == 1)
            return ms_error(MS_ERR_ARG, "--search --vpp %d needs --pp >= 2 (or --pp left out)",
                            l->vpp);
        /* products in 64 bits: --tp, --pp and --vpp go up to 65536 each */
        if (l->vpp && l->pp && m->layers % ((long long)l->pp * l->vpp))
            return ms_error(MS_ERR_ARG, "--search --pp %d --vpp %d: %d layers are not %lld chunks",
                            l->pp, l->vpp, m->layers, (long long)l->pp * l->vpp);
        int tp = l->tp ? l->tp : 1, pp = l->pp ? l->pp : 1;
        if (l->gpus % ((long long)tp * pp))
            return ms_error(MS_ERR_ARG, "--search: --gpus %d is not a multiple of tp %d x pp %d",
                            l->gpus, tp, pp);
        if (l->tp) MS_TRY(plan_check_features(f, l)); /* once tp x pp is known to fit */
        return MS_OK;
    }
    MS_TRY(plan_check(m, l));
    return plan_check_features(f, l);
}

/* Why a search found nothing: no layout was valid for the batch, or none fitted (the
 * smallest need, part by part). */
static ms_status search_none(const plan_cli *o, const plan_model *m, const plan_layout *l,
                             const plan_features *f, const plan_cluster *c,
                             const plan_search_tally *t, const plan_candidate *small) {
    int tried = t->tried, over_cap = t->over_cap;
    if (!tried && over_cap)
        return ms_error(MS_ERR_ARG,
                        "no layout was planned: the %d valid for --batch %d all have a pipeline "
                        "of more (micro-batch, chunk) pairs a step than the planner simulates "
                        "(pp x vpp x micro-batches <= %d); --batch counts sequences, not tokens",
                        over_cap, l->batch, PLAN_MAX_PIPE_PAIRS);
    if (!tried) {
        char fixed[160] = ""; /* what the command line fixed */
        if (l->tp || l->pp || l->vpp || l->micro)
            snprintf(fixed, sizeof fixed, " (fixed by the command line:%s%.0d%s%.0d%s%.0d%s%.0d)",
                     l->tp ? " --tp " : "", l->tp, l->pp ? " --pp " : "", l->pp,
                     l->vpp ? " --vpp " : "", l->vpp, l->micro ? " --micro-batch " : "", l->micro);
        if (t->refused) /* the batch divided: say what refused them, not the batch */
            return ms_error(MS_ERR_ARG,
                            "no layout is valid: %d with dp x micro-batch dividing --batch %d "
                            "%s refused%s; the first: %s",
                            t->refused, l->batch, t->refused > 1 ? "were all" : "was", fixed,
                            t->refused_why);
        return ms_error(MS_ERR_ARG,
                        "no layout is valid: with tp dividing --heads %d (and the node's %d GPUs "
                        "where --gpus %d spans nodes), pp dividing the %d layers and --gpus / tp, "
                        "and a micro-batch of a power of two up to --max-micro %d, --batch %d is "
                        "never a multiple of dp x micro-batch%s",
                        m->heads, c->gpus_per_node, l->gpus, m->layers, o->max_micro, l->batch,
                        fixed);
    }
    const plan_layout *b = &small->layout;
    const plan_result *r = &small->result;
    char capped[160] = "";
    if (over_cap)
        snprintf(capped, sizeof capped,
                 " (%d more valid layouts were not planned: pipelines of more than %d "
                 "(micro-batch, chunk) pairs a step)",
                 over_cap, PLAN_MAX_PIPE_PAIRS);
    return ms_error(MS_ERR_ARG,
                    "no layout of the %d tried fits in %.0f GB per GPU%s: the smallest need is "
                    "%.1f GB (tp %d, pp %d, vpp %d, dp %d, micro-batch %d: weights %.1f, "
                    "gradients %.1f, optimizer %.1f, activations %.1f, reserved %.1f)%s",
                    tried, c->mem_gb, capped, r->memory_gb, b->tp, b->pp, b->vpp, r->dp, b->micro,
                    r->mem_params_gb, r->mem_grads_gb, r->mem_optim_gb, r->mem_act_gb,
                    r->mem_reserved_gb,
                    /* the hint only where dropping activations could close the gap */
                    f->recompute != PLAN_RECOMPUTE_FULL && r->mem_act_gb > r->memory_gb - c->mem_gb
                        ? "; --recompute full keeps less activation memory"
                        : "");
}

static int run_search(const plan_cli *o, const plan_model *m, const plan_layout *l,
                      const plan_features *f, const plan_cluster *c) {
    plan_candidate *best = calloc((size_t)o->top, sizeof *best), small;
    if (!best) return cli_fail("plan", ms_error(MS_ERR_NOMEM, "out of memory"));
    plan_search_tally t;
    ms_status st = plan_search(m, l, f, c, o->max_vpp, o->max_micro, best, o->top, &t, &small);
    if (st != MS_OK) {
        free(best);
        return cli_fail("plan", st);
    }
    int n = t.n, tried = t.tried, fit = t.fit, over_cap = t.over_cap;
    if (o->json) {
        printf("{\"tried\":%d,\"fit\":%d,\"over_cap\":%d,\"refused\":%d,\"layouts\":[", tried, fit,
               over_cap, t.refused);
        for (int i = 0; i < n; i++) {
            char *j = plan_result_json(m, &best[i].layout, c, &best[i].result);
            printf("%s%s", i ? "," : "", j ? j : "null");
            free(j);
        }
        printf("]");
        if (!n && tried) { /* none fits: the layout that needs the least memory */
            char *j = plan_result_json(m, &small.layout, c, &small.result);
            printf(",\"smallest\":%s", j ? j : "null");
            free(j);
        }
        printf("}\n");
    } else if (n) {
        printf("%d layouts tried on %d GPUs of %s; %d fit in %.0f GB, the best %d:\n", tried,
               l->gpus, c->name, fit, c->mem_gb, n);
        printf("%4s %4s %4s %4s %5s | %9s %7s %9s\n", "tp", "pp", "vpp", "dp", "micro", "iter s",
               "MFU", "mem GB");
        for (int i = 0; i < n; i++) {
            const plan_layout *b = &best[i].layout;
            const plan_result *r = &best[i].result;
            printf("%4d %4d %4d %4d %5d | %9.3f %6.1f%% %9.1f\n", b->tp, b->pp, b->vpp, r->dp,
                   b->micro, r->iter_s, 100 * r->mfu, r->memory_gb);
        }
    }
    if (!o->json && n && over_cap) /* the ranking leaves them out: say so */
        printf("%d more valid layouts were not planned: their pipelines have more (micro-batch, "
               "chunk) pairs a step than the planner simulates (pp x vpp x micro-batches <= %d)\n",
               over_cap, PLAN_MAX_PIPE_PAIRS);
    free(best);
    return n ? 0 : cli_fail("plan", search_none(o, m, l, f, c, &t, &small));
}

int cmd_plan(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "measure")) return cmd_plan_measure(argc - 1, argv + 1);
    plan_cli o;
    memset(&o, 0, sizeof o);
    char *pos[1];
    int npos = 0, help = 0, rc = 0;
    ms_status st = opts_parse(plan_opts, N_PLAN_OPTS, &o, argc, argv, pos, 1, &npos, &help);
    plan_model m;
    plan_layout l;
    plan_features f;
    plan_cluster c;
    if (help) {
        opts_print_help(plan_opts, N_PLAN_OPTS, usage_text);
        goto out;
    }
    if (st == MS_OK && npos)
        st = ms_error(MS_ERR_ARG, "unexpected argument '%s' (plan takes options, or 'measure')",
                      pos[0]);
    if (st == MS_OK)
        st = opts_check_dir(plan_opts, N_PLAN_OPTS, &o, "data-dir",
                            "the shipped clusters: DIR/clusters");
    if (st == MS_OK && !o.cluster)
        st = ms_error(MS_ERR_ARG, "--cluster: give a cluster file or a shipped name "
                                  "(a100-megascale, h100-node, h200-node, dev-cpu)");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/clusters", o.data_dir && *o.data_dir ? o.data_dir : MS_DATA_DIR);
    if (st == MS_OK) st = plan_cluster_find(o.cluster, dir, &c);
    if (st == MS_OK) st = inputs(&o, &c, &m, &l, &f);
    if (st != MS_OK) {
        rc = cli_fail("plan", st);
        goto out;
    }
    /* a cluster file of `plan measure` without its second, mpirun step: its links are
     * placeholders (latency 0, the memory's bandwidth), so a prediction of more than one rank
     * would be silently too fast (before, only the file's "source" said so) */
    if ((l.gpus > 1 || o.search) && strstr(c.source, "links not measured"))
        fprintf(stderr,
                "megascale plan: warning: --cluster %s: its links were not measured (%s): the "
                "communication below is a placeholder; measure them with `mpirun -np N "
                "megascale plan measure --base %s --out FILE`\n",
                o.cluster, c.source, o.cluster);
    if (o.search) {
        rc = run_search(&o, &m, &l, &f, &c);
        goto out;
    }
    plan_result r;
    st = plan_predict(&m, &l, &f, &c, &r);
    if (st != MS_OK) {
        rc = cli_fail("plan", st);
        goto out;
    }
    plan_scale_args sa = {
        .mtbf_hours = o.mtbf_hours, .restart_s = o.restart_s, .ckpt_every = o.ckpt_every};
    rc = plan_cli_report(stdout, o.json, &m, &l, &c, &r, &sa);
out:
    opts_free(plan_opts, N_PLAN_OPTS, &o);
    return rc;
}
