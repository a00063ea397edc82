/* cmd_diag.c - `megascale diag`: the node self-test (src/diag/diag.h).
 * Exit code 0 when every check passes, CLI_EXIT_DIAG_FAIL (9) when one
 * fails, 2 on a usage error. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/ctx.h"
#include "base/fault.h"
#include "base/fileio.h"
#include "base/node.h"
#include "cli/commands.h"
#include "cli/opts.h"
#include "diag/diag.h"

typedef struct {
    char *device, *history, *history_dir, *node_map, *storage_dir, *inject_fault;
    int threads, gemm_n, gemm_speed_n, mem_mb, storage_mb, json, fail_exit;
    double slow_factor, min_mem_gbps, comm_timeout;
    opts_list config; /* the --config files read (opts_check_output) */
} diag_cli;

#define O(name, type, field, def, help)                                                            \
    { name, type, offsetof(diag_cli, field), def, help, NULL, NULL, 0, 0 }
#define R(name, type, field, def, range, help)                                                     \
    { name, type, offsetof(diag_cli, field), def, help, NULL, range, 0, 0 }
static const opts_spec diag_opts[] = {
    O("device", OPT_T_STR, device, "cpu", "the backend whose GEMM is checked: cpu or cuda"),
    R("threads", OPT_T_INT, threads, "0", "[0,1024]",
      "CPU threads for the GEMM and memory checks (0: all)"),
    R("gemm-n", OPT_T_INT, gemm_n, "256", "[1,4096]",
      "gemm: size of the products checked against the host reference (n x n x n)"),
    R("gemm-speed-n", OPT_T_INT, gemm_speed_n, "0", "[0,32768]",
      "gemm: size of the timed product (0: 2048 in fp32, 8192 in bf16)"),
    O("history", OPT_T_STR, history, NULL,
      "JSON-lines file of this node's past gemm and memory results: compared with, and "
      "appended to when a check passes (default: none)"),
    O("history-dir", OPT_T_STR, history_dir, NULL,
      "a directory of histories, one per node: DIR/NODE.jsonl (created if missing; instead of "
      "--history)"),
    O("node-map", OPT_T_STR, node_map, NULL,
      "node names NAME,NAME,...: under mpirun rank r is on node names[r * n / world] "
      "(default: the host name); names the report, the --history-dir file and :node=NAME "
      "faults"),
    R("slow-factor", OPT_T_DOUBLE, slow_factor, "0.7", "[0,1]",
      "gemm, memory: fail below this fraction of the history's median (of 3 runs or more)"),
    R("mem-mb", OPT_T_INT, mem_mb, "256", "[1,65536]",
      "memory: MB of each of the two copied buffers"),
    R("min-mem-gbps", OPT_T_DOUBLE, min_mem_gbps, "0", "[0,)",
      "memory: fail below this bandwidth in GB/s (0: report only)"),
    R("comm-timeout", OPT_T_DOUBLE, comm_timeout, "30", "(0,1e6]",
      "comm: seconds an op may take before the check fails (a broken peer)"),
    O("storage-dir", OPT_T_STR, storage_dir, NULL,
      "storage: directory to write the test file into (default: the check is skipped)"),
    R("storage-mb", OPT_T_INT, storage_mb, "64", "[1,1048576]",
      "storage: MB written, fsynced and read back"),
    R("fail-exit", OPT_T_INT, fail_exit, "1", "[0,1]",
      "1: exit 9 when a check fails; 0: exit 0 all the same (the report says what failed: "
      "under mpirun a failing rank's exit would cut the other ranks' reports short)"),
    OPTS_FLAG("json", diag_cli, json,
              "1 prints one JSON object instead of the table (a bare --json means 1)"),
    O("inject-fault", OPT_T_STR, inject_fault, NULL,
      "faults for tests (docs/operations.md): diag:gemm, diag:memory, diag:comm, diag:storage "
      "make that check fail as on bad hardware, diag:nan a NaN in the GEMM's result, diag:slow "
      "makes the GEMM 10x as slow (diag:blip too, but the supervisor measures again without "
      "it); KIND:RANK: one rank only; KIND:node=NAME: the ranks of that node"),
    OPTS_CONFIG_FILES(diag_cli, config),
};
#define N_DIAG_OPTS ((int)(sizeof diag_opts / sizeof diag_opts[0]))

static const char *usage_text =
    "usage: megascale diag [--device cpu|cuda] [--history FILE | --history-dir DIR]\n"
    "                      [--node-map NAMES] [--storage-dir DIR] [--json]\n\n"
    "Node self-test: gemm (correctness against a host reference, speed against --history),\n"
    "memory (bandwidth), comm (loopback and all-reduce; run it under mpirun for several ranks)\n"
    "and storage (write, fsync, read back in --storage-dir).  Prints a table and\n"
    "'diag: PASS' or 'diag: FAIL (checks)'.  Exit code 0: all passed, 9: a check failed,\n"
    "2: usage error.";

/* The whole report in one write, so the reports of ranks under mpirun do
 * not interleave line by line. */
static ms_status emit(const diag_report *r, void *arg) {
    int json = *(const int *)arg;
    char *text = NULL;
    size_t len = 0;
    if (json) {
        text = diag_report_json(r);
        len = text ? strlen(text) : 0;
    } else {
        FILE *m = open_memstream(&text, &len);
        if (m) diag_report_print(r, m);
        if (m) fclose(m);
    }
    char *nl = text && json ? realloc(text, len + 2) : text;
    if (!nl) {
        free(text);
        return ms_error(MS_ERR_NOMEM, "out of memory formatting the report");
    }
    text = nl;
    if (json) text[len++] = '\n';
    /* one write(2), not stdio's: a pipe's 4 KB buffer split a report in two
     * writes, and another rank's report landed between them under mpirun */
    fflush(stdout);
    (void)ms_fd_write_all(STDOUT_FILENO, "stdout", text, len); /* as stdio: not an error */
    free(text);
    return MS_OK;
}

/* --inject-fault, with the self-test's kinds only (a trainer's "exit"
 * would never fire here: better say so). */
static ms_status parse_faults(ms_fault_plan *plan, const char *spec) {
    MS_TRY(ms_fault_parse(plan, spec, "--inject-fault"));
    int world = ms_ctx_get()->world > 0 ? ms_ctx_get()->world : 1;
    for (int i = 0; i < plan->n; i++) {
        if (strncmp(plan->f[i].kind, "diag:", 5))
            return ms_error(MS_ERR_ARG,
                            "--inject-fault: '%s' is not a fault of the self-test (diag:gemm, "
                            "diag:nan, diag:memory, diag:comm, diag:storage, diag:slow, "
                            "diag:blip)",
                            plan->f[i].kind);
        /* (a rank the run does not have: it passed, as if the fault had been tried) */
        if (plan->f[i].rank >= world)
            return ms_error(MS_ERR_ARG,
                            "--inject-fault: %s:%d: rank %d is not one of this run's %d "
                            "process(es); it would never fire",
                            plan->f[i].kind, plan->f[i].rank, plan->f[i].rank, world);
    }
    return MS_OK;
}

static void to_config(const diag_cli *o, const ms_fault_plan *plan, const char *node,
                      diag_config *c) {
    *c = (diag_config){.device = o->device,
                       .threads = o->threads,
                       .gemm_n = o->gemm_n,
                       .gemm_speed_n = o->gemm_speed_n,
                       .slow_factor = o->slow_factor,
                       .history = o->history,
                       .history_dir = o->history_dir,
                       .node = node,
                       .mem_mb = o->mem_mb,
                       .min_mem_gbps = o->min_mem_gbps,
                       .comm_timeout = o->comm_timeout,
                       .storage_mb = o->storage_mb,
                       .storage_dir = o->storage_dir,
                       .faults = plan,
                       .emit = emit,
                       .emit_arg = (void *)&o->json};
}

int cmd_diag(int argc, char **argv) {
    diag_cli o = {0};
    char *pos[1];
    int npos = 0, help = 0, rc = 0;
    ms_status st = opts_parse(diag_opts, N_DIAG_OPTS, &o, argc, argv, pos, 0, &npos, &help);
    ms_fault_plan plan = {.n = 0};
    diag_config c;
    diag_report r;
    if (help) {
        opts_print_help(diag_opts, N_DIAG_OPTS, usage_text);
        goto out;
    }
    char node[MS_NODE_NAME_MAX] = "";
    if (st == MS_OK) st = parse_faults(&plan, o.inject_fault);
    if (st == MS_OK)
        st = ms_node_of(o.node_map, ms_ctx_get()->rank, ms_ctx_get()->world, node, "--node-map");
    ms_fault_plan_set_node(&plan, node); /* "diag:gemm:node=NAME" fails that node only */
    to_config(&o, &plan, node, &c);
    char mine[MS_NODE_NAME_MAX + 8]; /* --history-dir's file of this node (diag.c) */
    snprintf(mine, sizeof mine, "%s.jsonl", node);
    const char *const hist_dir_files[] = {mine, NULL};
    if (st == MS_OK)
        st = opts_check_output(diag_opts, N_DIAG_OPTS, &o, "--history", o.history, NULL);
    if (st == MS_OK)
        st = opts_check_output(diag_opts, N_DIAG_OPTS, &o, "--history-dir", o.history_dir,
                               hist_dir_files);
    if (st == MS_OK && o.storage_dir && !*o.storage_dir) /* (it skipped the check unsaid) */
        st = ms_error(MS_ERR_ARG, "--storage-dir is empty: give the directory whose writes are "
                                  "checked, or leave the option out to skip that check");
    if (st == MS_OK) st = diag_config_check(&c);
    if (st == MS_OK) st = diag_run(&c, &r);
    if (st != MS_OK)
        rc = cli_fail("diag", st);
    else
        rc = r.ok || !o.fail_exit ? 0 : CLI_EXIT_DIAG_FAIL;
out:
    opts_free(diag_opts, N_DIAG_OPTS, &o);
    return rc;
}
