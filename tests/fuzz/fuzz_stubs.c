/* fuzz_stubs.c - what the harnesses link but never call.
 *
 * The fuzz build compiles only the files that hold the readers
 * (CMakeLists.txt).  Two of them hold more: ckpt_layout.c (the manifest's
 * state names, next to the model's slice layout) and optim.c (the LR
 * schedule's names, next to the optimiser step) call into the model,
 * the communicator and ZeRO; the trainer's option table (cmd_train.c) sits
 * next to its call into the trainer.  Those calls are on no path a reader
 * takes, so they end here: a panic naming the function, should one ever be
 * reached.  Keeping the real files (not copies of the parsing functions)
 * keeps the real code under test.
 */
#include "base/ctx.h"
#include "base/log.h"
#include "ckpt/ckpt.h"
#include "ckpt/hf.h"
#include "cli/commands.h"
#include "comm/comm.h"
#include "model/gpt.h"
#include "parallel/zero.h"
#include "train/train.h"

#define UNREACHED(fn) ms_panic(__FILE__, __LINE__, "fuzz build: %s is not built in", fn)

ms_status comm_allreduce(comm_group *g, const void *send, void *recv, size_t count, comm_dtype dt,
                         comm_redop op) {
    UNREACHED("comm_allreduce");
}
be_backend *gpt_backend(const gpt_model *m) {
    UNREACHED("gpt_backend");
}
const gpt_config *gpt_get_config(const gpt_model *m) {
    UNREACHED("gpt_get_config");
}
const gpt_stage *gpt_get_stage(const gpt_model *m) {
    UNREACHED("gpt_get_stage");
}
int gpt_grad_ranges(const gpt_model *m, size_t *bounds, int max_ranges) {
    UNREACHED("gpt_grad_ranges");
}
float *gpt_grads(gpt_model *m) {
    UNREACHED("gpt_grads");
}
size_t gpt_num_elements(const gpt_model *m) {
    UNREACHED("gpt_num_elements");
}
size_t gpt_activation_bytes(const gpt_model *m) {
    UNREACHED("gpt_activation_bytes");
}
ms_status be_cpu_check_host_memory(const char *what, double need, const char *parts) {
    UNREACHED("be_cpu_check_host_memory");
}
int gpt_num_tensors(const gpt_model *m) {
    UNREACHED("gpt_num_tensors");
}
float *gpt_params(gpt_model *m) {
    UNREACHED("gpt_params");
}
void *gpt_params_act(gpt_model *m) {
    UNREACHED("gpt_params_act");
}
const gpt_param *gpt_tensor(const gpt_model *m, int i) {
    UNREACHED("gpt_tensor");
}
comm_group *gpt_tp_group(const gpt_model *m) {
    UNREACHED("gpt_tp_group");
}
int gpt_tp_rank(const gpt_model *m) {
    UNREACHED("gpt_tp_rank");
}
comm_group *par_zero_group(const par_zero *z) {
    UNREACHED("par_zero_group");
}
int par_zero_num_shards(const par_zero *z) {
    UNREACHED("par_zero_num_shards");
}
void par_zero_shard(const par_zero *z, int i, size_t *begin, size_t *end) {
    UNREACHED("par_zero_shard");
}
ms_status par_zero_gather_shard(par_zero *z, int i) {
    UNREACHED("par_zero_gather_shard");
}
ms_status train_run(const train_config *cfg) {
    UNREACHED("train_run");
}
ms_status train_check_outputs(const train_config *tc) {
    UNREACHED("train_check_outputs");
}
ms_status train_check_not_input(const train_config *tc, const char *opt, const char *path) {
    UNREACHED("train_check_not_input");
}
ms_status train_check_hparams(const train_config *tc) {
    UNREACHED("train_check_hparams");
}
void train_trace_dir(const train_config *tc, char *out, size_t cap) {
    UNREACHED("train_trace_dir");
}
void ckpt_hf_config_path(const char *path, char *out, size_t n) {
    UNREACHED("ckpt_hf_config_path");
}
ms_status train_gate_early(const char *cmd, ms_status st) {
    UNREACHED("train_gate_early");
}
void ms_ctx_catch_signals(void) {
    UNREACHED("ms_ctx_catch_signals");
}
/* fileio.c's SIGBUS line takes ms_log's prefix from the context (base/ctx.c would bring the
 * process's with it): an empty one, rank 0 */
const ms_ctx *ms_ctx_get(void) {
    static ms_ctx none;
    return &none;
}
int cli_fail(const char *cmd, ms_status st) {
    UNREACHED("cli_fail");
}

/* The readers' warnings (a JSONL line's lone surrogate read as U+FFFD): said to nobody, as a
 * harness runs millions of inputs (base/log.c would bring the process context with it). */
void ms_log(ms_log_level lvl, const char *fmt, ...) {
    (void)lvl, (void)fmt;
}

/* The harnesses are built without OpenMP (its pragmas are ignored): the
 * encoder's thread count "all cores" is one thread here. */
int omp_get_max_threads(void) {
    return 1;
}

/* opts_check_output's (cli/opts.c): commands check their outputs, the config harness parses */
int ckpt_is_part(const char *path, char *what, size_t n) {
    UNREACHED("ckpt_is_part");
}
