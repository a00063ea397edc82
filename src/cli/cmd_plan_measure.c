/* cmd_plan_measure.c - `megascale plan measure`: a cluster file for this
 * machine from measurements (src/diag/diag_costs.c).  Two runs:
 *   megascale plan measure --out one.json                 (one process: compute)
 *   mpirun -np N megascale plan measure --base one.json --out n.json   (the links)
 * The second copies the first's compute figures and adds the links as
 * measured with N ranks on this machine (gpus_per_node N). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/fileio.h"
#include "cli/commands.h"
#include "cli/opts.h"
#include "cli/plan_cli.h"
#include "diag/diag.h"

typedef struct {
    char *out, *base, *device, *name, *storage_dir;
    int threads, attn_b, attn_t, attn_c, attn_heads;
    opts_list config; /* the --config files read (opts_check_output) */
} measure_cli;

#define O(n, t, f, d, r, h)                                                                        \
    {                                                                                              \
        .name = n, .type = t, .offset = offsetof(measure_cli, f), .def = d, .help = h,             \
        .env = NULL, .range = r, .per_rank = 0                                                     \
    }
static const opts_spec measure_opts[] = {
    O("out", OPT_T_STR, out, NULL, NULL, "the cluster file to write"),
    O("base", OPT_T_STR, base, NULL, NULL,
      "a one-process measurement of this machine: measure the links only (under mpirun) and "
      "copy its compute figures"),
    O("device", OPT_T_STR, device, "cpu", NULL, "the backend measured: cpu or cuda"),
    O("threads", OPT_T_INT, threads, "1", "[0,1024]",
      "CPU threads per rank, as the jobs to plan will use (0: all cores)"),
    O("name", OPT_T_STR, name, "this-machine", NULL, "the cluster's name in the file"),
    O("storage-dir", OPT_T_STR, storage_dir, "/tmp", NULL,
      "directory whose write speed (with fsync) is measured"),
    O("attn-batch", OPT_T_INT, attn_b, "1", "[1,65536]", "attention shape timed: sequences"),
    O("attn-seq", OPT_T_INT, attn_t, "64", "[1,65536]", "attention shape timed: tokens"),
    O("attn-dim", OPT_T_INT, attn_c, "64", "[1,65536]", "attention shape timed: width"),
    O("attn-heads", OPT_T_INT, attn_heads, "4", "[1,4096]", "attention shape timed: heads"),
    OPTS_CONFIG_FILES(measure_cli, config),
};
#undef O
#define N_MEASURE_OPTS ((int)(sizeof measure_opts / sizeof measure_opts[0]))

static const char *usage_text =
    "usage: megascale plan measure --out FILE [--threads N]\n"
    "       mpirun -np N megascale plan measure --base FILE --out FILE_N\n\n"
    "Measures this machine for the planner: the backend's GEMM speed by size, operator\n"
    "overhead, element-wise, attention and optimizer speed, memory copy and storage (one\n"
    "process); with --base, under mpirun, the all-reduce latency and bandwidth between N\n"
    "ranks and the group creation time.  Writes a cluster file (docs/formats.md).";

static void compute_to_cluster(const measure_cli *o, const diag_costs *d, plan_cluster *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", o->name);
    char when[32];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    snprintf(c->source, sizeof c->source,
             "megascale plan measure on %s (%s backend, %d thread(s) a rank), %s; links not "
             "measured yet (mpirun ... plan measure --base)",
             d->device, o->device, d->threads, when);
    c->gpus_per_node = 1;
    double peak = 0;
    for (int i = 0; i < d->n_gemm; i++)
        if (d->gemm_gflops[i] > peak) peak = d->gemm_gflops[i];
    c->peak_flops = peak * 1e9;
    c->n_gemm = d->n_gemm;
    for (int i = 0; i < d->n_gemm; i++)
        c->gemm_n[i] = d->gemm_n[i], c->gemm_eff[i] = d->gemm_gflops[i] / peak;
    c->mem_gb = d->mem_gb;
    c->hbm_gbps = d->elem_gbps, c->hbm_eff = 1;
    c->launch_us = d->launch_us;
    c->opt_ns_per_param = d->opt_ns_per_param;
    c->transc_gbps = d->transc_gbps;
    c->ln_bwd_passes = d->ln_bwd_ratio; /* the planner's fused forward is one pass */
    /* the planner's attention: 3.5 x 4 b h s kv dh flops (forward + backward, kv = (s+1)/2) */
    double s = o->attn_t, flops = 3.5 * 4.0 * o->attn_b * o->attn_t * ((s + 1) / 2) * o->attn_c;
    double t = d->attn_s - 2 * d->launch_us * 1e-6;
    c->attn_eff = flops / (c->peak_flops * (t > 0 ? t : d->attn_s));
    if (c->attn_eff > 1) c->attn_eff = 1;
    c->intra = c->inter = (plan_link){.gbps = d->memcpy_gbps / 2, .lat_us = 0, .eff = 1};
    c->act_bytes = strcmp(o->device, "cuda") ? 4 : 2;
    c->grad_bytes = 4;
    c->cores = d->cores, c->threads = d->threads;
    c->pcie_gbps = d->memcpy_gbps;
    c->storage_gbps = d->storage_gbps > 0 ? d->storage_gbps : d->memcpy_gbps;
    c->store_op_us = 1, c->comm_init_ms = 0;
}

/* What cannot be written: said before measuring, not after it. */
static ms_status check_paths(const measure_cli *o) {
    ms_status st = ms_path_check_replaceable(o->out);
    if (st != MS_OK) return ms_error_wrap(st, "--out");
    if (ms_path_is_input(o->out, o->base, NULL, 0))
        return ms_error(MS_ERR_ARG,
                        "--out %s is the --base file: an output never replaces an input; write "
                        "the N-rank cluster to another file",
                        o->out);
    MS_TRY(opts_check_output(measure_opts, N_MEASURE_OPTS, o, "--out", o->out, NULL));
    if (!o->storage_dir || !*o->storage_dir) return MS_OK;
    return ms_path_check_dir("--storage-dir", o->storage_dir,
                             "the directory whose speed is measured");
}

static int measure(const measure_cli *o) {
    diag_cost_config cfg = {.device = o->device,
                            .threads = o->threads,
                            .comm_only = !!o->base,
                            .storage_dir = o->storage_dir,
                            .attn_b = o->attn_b,
                            .attn_t = o->attn_t,
                            .attn_c = o->attn_c,
                            .attn_heads = o->attn_heads};
    plan_cluster c;
    ms_status cs = check_paths(o);
    if (cs != MS_OK) return cli_fail("plan measure", cs);
    if (o->base) {
        ms_status st = plan_cluster_load(o->base, &c);
        if (st != MS_OK) return cli_fail("plan measure", ms_error_wrap(st, "--base"));
    }
    diag_costs d;
    ms_status st = diag_measure_costs(&cfg, &d);
    if (st != MS_OK) return cli_fail("plan measure", st);
    if (!o->base) {
        compute_to_cluster(o, &d, &c);
    } else {
        if (d.rank != 0) return 0;
        c.gpus_per_node = d.ranks;
        /* the latency a step sees: between compute phases, if that is the larger */
        double lat = d.busy_lat_us > d.lat_us ? d.busy_lat_us : d.lat_us;
        c.intra = c.inter = (plan_link){.gbps = d.link_gbps, .lat_us = lat, .eff = 1};
        c.store_op_us = d.lat_us > 0 ? d.lat_us : 1;
        /* the cores the ranks share, in effect (measured with all of them running) */
        double cores = d.shared_cores;
        c.cores = cores < 0.25 ? 0.25 : cores > d.ranks ? d.ranks : cores;
        c.comm_init_ms = d.group_init_ms;
        c.overlap_exposed = 1 - d.overlap_eff;
        char *cut = strstr(c.source, "; links not measured");
        if (cut) *cut = 0;
        size_t len = strlen(c.source);
        snprintf(c.source + len, sizeof c.source - len, "; links: %d ranks on this machine",
                 d.ranks);
    }
    st = plan_cluster_save(&c, o->out);
    if (st != MS_OK) return cli_fail("plan measure", st);
    fprintf(stderr, "plan measure: wrote %s (peak %.1f GFLOP/s, %d ranks a node)\n", o->out,
            c.peak_flops / 1e9, c.gpus_per_node);
    return 0;
}

int cmd_plan_measure(int argc, char **argv) {
    measure_cli o;
    memset(&o, 0, sizeof o);
    char *pos[1];
    int npos = 0, help = 0, rc = 0;
    ms_status st = opts_parse(measure_opts, N_MEASURE_OPTS, &o, argc, argv, pos, 0, &npos, &help);
    if (help)
        opts_print_help(measure_opts, N_MEASURE_OPTS, usage_text);
    else if (st == MS_OK && !o.out)
        rc =
            cli_fail("plan measure", ms_error(MS_ERR_ARG, "--out: give the cluster file to write"));
    else if (st != MS_OK)
        rc = cli_fail("plan measure", st);
    else if (o.attn_c % o.attn_heads)
        rc = cli_fail("plan measure",
                      ms_error(MS_ERR_ARG, "--attn-dim %d is not divisible by --attn-heads %d",
                               o.attn_c, o.attn_heads));
    else
        rc = measure(&o);
    opts_free(measure_opts, N_MEASURE_OPTS, &o);
    return rc;
}
