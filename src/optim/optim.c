/* optim.c - AdamW / LAMB updates over the model's parameter table. */
#include "optim/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct opt_state {
    opt_config cfg;
    gpt_model *m;
    be_backend *be;
    float *mom, *var; /* fp32 (n_elems) on the backend */
    int t;
};

ms_status opt_kind_parse(const char *s, opt_kind *out) {
    if (!strcmp(s, "adamw"))
        *out = OPT_ADAMW;
    else if (!strcmp(s, "lamb"))
        *out = OPT_LAMB;
    else
        return ms_error(MS_ERR_ARG, "unknown optimizer '%s' (adamw or lamb)", s);
    return MS_OK;
}

const char *opt_kind_name(opt_kind k) {
    return k == OPT_LAMB ? "lamb" : "adamw";
}

ms_status opt_sched_parse(const char *s, opt_sched_kind *out) {
    if (!strcmp(s, "constant"))
        *out = OPT_SCHED_CONSTANT;
    else if (!strcmp(s, "cosine"))
        *out = OPT_SCHED_COSINE;
    else
        return ms_error(MS_ERR_ARG, "unknown lr schedule '%s' (constant or cosine)", s);
    return MS_OK;
}

float opt_lr_at(const opt_schedule *sc, int s) {
    if (sc->warmup > 0 && s < sc->warmup) return sc->lr * (float)(s + 1) / (float)sc->warmup;
    if (sc->kind == OPT_SCHED_CONSTANT) return sc->lr;
    int span = sc->total - 1 - sc->warmup;
    double frac = span > 0 ? (double)(s - sc->warmup) / span : 1.0;
    if (frac > 1) frac = 1;
    if (frac < 0) frac = 0;
    double coeff = 0.5 * (1.0 + cos(M_PI * frac)); /* 1 -> 0 */
    double lo = (double)sc->lr * sc->floor;
    return (float)(lo + coeff * ((double)sc->lr - lo));
}

ms_status opt_create(opt_state **out, const opt_config *cfg, gpt_model *m) {
    *out = NULL;
    opt_state *o = calloc(1, sizeof *o);
    if (!o) return ms_error(MS_ERR_NOMEM, "optimizer: out of host memory");
    o->cfg = *cfg;
    o->m = m;
    o->be = gpt_backend(m);
    size_t bytes = gpt_num_elements(m) * sizeof(float);
    o->mom = o->be->alloc(o->be, bytes);
    o->var = o->be->alloc(o->be, bytes);
    if (!o->mom || !o->var) {
        ms_error(MS_ERR_NOMEM, "optimizer: cannot allocate %.1f MB of state on %s",
                 2.0 * (double)bytes / 1e6, o->be->name);
        opt_destroy(o);
        return MS_ERR_NOMEM;
    }
    *out = o;
    return MS_OK;
}

void opt_destroy(opt_state *o) {
    if (!o) return;
    if (o->mom) o->be->free(o->be, o->mom);
    if (o->var) o->be->free(o->be, o->var);
    free(o);
}

int opt_steps_done(const opt_state *o) {
    return o->t;
}

/* LAMB over one tensor: moments + direction, then the trust-ratio step. */
static void lamb_tensor(opt_state *o, const gpt_param *p, float lr, float gscale, int t) {
    be_backend *be = o->be;
    const opt_config *c = &o->cfg;
    float *w = gpt_params(o->m) + p->offset, *g = gpt_grads(o->m) + p->offset;
    float wd = p->decay ? c->weight_decay : 0.0f;
    double w_sq = 0, u_sq = 0;
    be->lamb_moments(be, g, w, o->mom + p->offset, o->var + p->offset, p->numel, c->beta1, c->beta2,
                     c->eps, wd, t, gscale, &w_sq, &u_sq);
    double wn = sqrt(w_sq), un = sqrt(u_sq);
    double ratio = (wn > 0 && un > 0) ? wn / un : 1.0;
    be->lamb_apply(be, w, NULL, g, p->numel, (float)(lr * ratio));
}

ms_status opt_step(opt_state *o, float lr, opt_stats *stats) {
    be_backend *be = o->be;
    gpt_model *m = o->m;
    const opt_config *c = &o->cfg;
    size_t n = gpt_num_elements(m);
    float *g = gpt_grads(m);
    double sq = be->sum_squares(be, g, n);
    stats->grad_norm = sqrt(sq);
    stats->clip_scale = 1.0f;
    /* Any NaN/Inf element makes the sum of squares non-finite, so this one
     * pass is also the non-finite check. */
    if (!isfinite(sq))
        return ms_error(MS_ERR_NONFINITE, "non-finite gradient (global norm %g); update skipped",
                        stats->grad_norm);
    if (c->grad_clip > 0) { /* torch.nn.utils.clip_grad_norm_ */
        double coef = c->grad_clip / (stats->grad_norm + 1e-6);
        if (coef < 1.0) stats->clip_scale = (float)coef;
    }
    int t = ++o->t;
    int nt = gpt_num_tensors(m);
    for (int i = 0; i < nt; i++) {
        const gpt_param *p = gpt_tensor(m, i);
        if (c->kind == OPT_LAMB) {
            lamb_tensor(o, p, lr, stats->clip_scale, t);
        } else {
            float wd = p->decay ? c->weight_decay : 0.0f;
            be->adamw_step(be, gpt_params(m) + p->offset, NULL, g + p->offset, o->mom + p->offset,
                           o->var + p->offset, p->numel, lr, c->beta1, c->beta2, c->eps, wd, t,
                           stats->clip_scale);
        }
    }
    gpt_params_updated(m);
    return MS_OK;
}
