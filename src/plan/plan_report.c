/* plan_report.c - a prediction as a readable breakdown or as JSON. */
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "plan/plan.h"

static void part(FILE *f, const char *name, double s, double iter) {
    fprintf(f, "  %-26s %10.4f s  %5.1f%%\n", name, s, 100 * s / iter);
}

void plan_result_print(FILE *f, const plan_model *m, const plan_layout *l, const plan_cluster *c,
                       const plan_result *r) {
    fprintf(f, "model: %d layers, dim %d, %d heads, vocab %d, seq %d, %s block%s", m->layers,
            m->dim, m->heads, m->vocab, m->seq, m->parallel_block ? "parallel" : "serial",
            m->window ? "" : "\n");
    if (m->window) fprintf(f, ", window %d\n", m->window);
    fprintf(f, "cluster: %s (%d GPUs a node, %.3g TFLOP/s, %.0f GB)\n", c->name, c->gpus_per_node,
            c->peak_flops / 1e12, c->mem_gb);
    fprintf(f,
            "layout: %d GPUs = tp %d x pp %d x dp %d, vpp %d; batch %d = %d micro-batches of "
            "%d per DP rank\n",
            l->gpus, l->tp, l->pp, r->dp, l->vpp, l->batch, r->n_micro, l->micro);
    fprintf(f, "iteration %.4f s | %.0f tokens/s | MFU %.1f%% | memory %.1f GB per GPU%s\n",
            r->iter_s, r->tokens_per_s, 100 * r->mfu, r->memory_gb,
            r->fits ? "" : "  (does NOT fit)");
    /* the formula's full attention, and the attention computed (causal, in the window):
     * said with a window, or where the two differ by more than 5% (a long sequence) */
    int windowed = m->window > 0 && m->window < m->seq;
    if (windowed || r->mfu > 1 || r->mfu_window < 0.95 * r->mfu)
        fprintf(f,
                "  MFU counts full attention (Megatron's formula, as the papers do); with the "
                "attention computed (causal%s): %.1f%%%s\n",
                windowed ? ", the window's only" : ", half of it", 100 * r->mfu_window,
                r->mfu > 1 ? " (the GPUs compute far fewer attention FLOPs than the formula "
                             "counts: the first figure passes 100%)"
                           : "");
    fprintf(f, "step (slowest stage):\n");
    part(f, "compute", r->compute_s, r->iter_s);
    part(f, "tensor-parallel comm", r->tp_s, r->iter_s);
    part(f, "pipeline transfers", r->pp_s, r->iter_s);
    part(f, "pipeline bubble", r->bubble_s, r->iter_s);
    part(f, "data-parallel comm", r->dp_s, r->iter_s);
    if (r->dp_gather_comm_s > 0) { /* ZeRO's all-gather of the updated weights, within dp_s */
        char name[64];
        snprintf(name, sizeof name, "  weights' gather, %s",
                 r->dp_gather_elem_bytes >= 4 ? "fp32" : "16-bit");
        fprintf(f, "  %-26s %10.4f s  %5.1f%%  exposed of %.4f s, %.2f GB a rank a step\n", name,
                r->dp_gather_s, 100 * r->dp_gather_s / r->iter_s, r->dp_gather_comm_s,
                r->dp_gather_gb);
        if (r->dp_convert_s > 0) part(f, "  their 16-bit copy", r->dp_convert_s, r->iter_s);
    }
    part(f, "optimizer", r->optimizer_s, r->iter_s);
    part(f, "data + host", r->data_s, r->iter_s);
    fprintf(f,
            "memory per GPU: weights %.2f GB, gradients %.2f, optimizer %.2f, activations "
            "%.2f (%d micro-batch chunks in flight), reserved %.2f\n",
            r->mem_params_gb, r->mem_grads_gb, r->mem_optim_gb, r->mem_act_gb, r->in_flight,
            r->mem_reserved_gb);
}

char *plan_result_json(const plan_model *m, const plan_layout *l, const plan_cluster *c,
                       const plan_result *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "mfu", r->mfu);
    cJSON_AddNumberToObject(o, "mfu_window", r->mfu_window);
    cJSON_AddNumberToObject(o, "iter_s", r->iter_s);
    cJSON_AddNumberToObject(o, "tokens_per_s", r->tokens_per_s);
    cJSON_AddNumberToObject(o, "memory_gb_per_gpu", r->memory_gb);
    cJSON_AddBoolToObject(o, "fits", r->fits);
    cJSON_AddStringToObject(o, "cluster", c->name);
    cJSON *lay = cJSON_AddObjectToObject(o, "layout");
    cJSON_AddNumberToObject(lay, "gpus", l->gpus);
    cJSON_AddNumberToObject(lay, "tp", l->tp);
    cJSON_AddNumberToObject(lay, "pp", l->pp);
    cJSON_AddNumberToObject(lay, "dp", r->dp);
    cJSON_AddNumberToObject(lay, "vpp", l->vpp);
    cJSON_AddNumberToObject(lay, "batch", l->batch);
    cJSON_AddNumberToObject(lay, "micro_batch", l->micro);
    cJSON_AddNumberToObject(lay, "micro_batches", r->n_micro);
    cJSON *p = cJSON_AddObjectToObject(o, "parts");
    cJSON_AddNumberToObject(p, "compute", r->compute_s);
    cJSON_AddNumberToObject(p, "tp", r->tp_s);
    cJSON_AddNumberToObject(p, "pp", r->pp_s);
    cJSON_AddNumberToObject(p, "dp", r->dp_s);
    cJSON_AddNumberToObject(p, "bubble", r->bubble_s);
    cJSON_AddNumberToObject(p, "optimizer", r->optimizer_s);
    cJSON_AddNumberToObject(p, "data", r->data_s);
    cJSON *g = cJSON_AddObjectToObject(o, "dp_allgather"); /* of parts.dp */
    cJSON_AddNumberToObject(g, "exposed_s", r->dp_gather_s);
    cJSON_AddNumberToObject(g, "comm_s", r->dp_gather_comm_s);
    cJSON_AddNumberToObject(g, "gb", r->dp_gather_gb);
    cJSON_AddNumberToObject(g, "elem_bytes", r->dp_gather_elem_bytes);
    cJSON_AddNumberToObject(g, "convert_s", r->dp_convert_s);
    cJSON *mem = cJSON_AddObjectToObject(o, "memory");
    cJSON_AddNumberToObject(mem, "weights_gb", r->mem_params_gb);
    cJSON_AddNumberToObject(mem, "grads_gb", r->mem_grads_gb);
    cJSON_AddNumberToObject(mem, "optimizer_gb", r->mem_optim_gb);
    cJSON_AddNumberToObject(mem, "activations_gb", r->mem_act_gb);
    cJSON_AddNumberToObject(mem, "reserved_gb", r->mem_reserved_gb);
    cJSON_AddNumberToObject(mem, "in_flight", r->in_flight);
    cJSON_AddNumberToObject(o, "model_flops_per_token", r->model_flops_per_token);
    cJSON_AddNumberToObject(o, "flops_per_token_6n", plan_flops_per_token_6n(m));
    cJSON_AddNumberToObject(o, "bubble_fraction", r->bubble_fraction);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}
