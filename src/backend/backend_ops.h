/* backend_ops.h - the backend ops that return nothing, listed once for the
 * op profilers of both backends (cpu/cpu_profile.c, cuda/cu_profile.cu):
 * X(op, (params), (args)) for each, the parameters as the be_backend table
 * declares them (backend.h).  A profiler defines X to write its timed
 * wrapper, then again to install it; the ops only one backend times are
 * listed in that backend's profiler. */
#ifndef MS_BACKEND_OPS_H
#define MS_BACKEND_OPS_H

#include "backend/backend.h"

#define BE_VOID_OPS(X)                                                                             \
    X(embedding_fwd,                                                                               \
      (be_backend * be, void *out, const int32_t *tok, const void *wte, const void *wpe, int B,    \
       int T, int C),                                                                              \
      (be, out, tok, wte, wpe, B, T, C))                                                           \
    X(embedding_bwd,                                                                               \
      (be_backend * be, float *dwte, float *dwpe, const void *dout, const int32_t *tok, int B,     \
       int T, int C),                                                                              \
      (be, dwte, dwpe, dout, tok, B, T, C))                                                        \
    X(layernorm_fwd,                                                                               \
      (be_backend * be, void *out, float *mean, float *rstd, const void *inp, const void *w,       \
       const void *b, int N, int C),                                                               \
      (be, out, mean, rstd, inp, w, b, N, C))                                                      \
    X(layernorm_bwd,                                                                               \
      (be_backend * be, void *dinp, float *dw, float *db, const void *dout, const void *inp,       \
       const void *w, const float *mean, const float *rstd, int N, int C),                         \
      (be, dinp, dw, db, dout, inp, w, mean, rstd, N, C))                                          \
    X(bias_bwd, (be_backend * be, float *dbias, const void *dout, int M, int N),                   \
      (be, dbias, dout, M, N))                                                                     \
    X(attention_fwd,                                                                               \
      (be_backend * be, void *out, void *state, const void *qkv, int B, int T, int C, int NH,      \
       int W),                                                                                     \
      (be, out, state, qkv, B, T, C, NH, W))                                                       \
    X(attention_bwd,                                                                               \
      (be_backend * be, void *dqkv, const void *dout, const void *out, const void *qkv,            \
       const void *state, int B, int T, int C, int NH, int W),                                     \
      (be, dqkv, dout, out, qkv, state, B, T, C, NH, W))                                           \
    X(gelu_fwd, (be_backend * be, void *out, const void *inp, size_t n), (be, out, inp, n))        \
    X(gelu_bwd, (be_backend * be, void *dinp, const void *inp, const void *dout, size_t n),        \
      (be, dinp, inp, dout, n))                                                                    \
    X(residual_add, (be_backend * be, void *out, const void *a, const void *b, size_t n),          \
      (be, out, a, b, n))                                                                          \
    X(bias_add, (be_backend * be, void *out, const void *bias, int M, int N),                      \
      (be, out, bias, M, N))                                                                       \
    X(add_f32, (be_backend * be, float *y, const float *x, size_t n), (be, y, x, n))               \
    X(adamw_step,                                                                                  \
      (be_backend * be, float *w, void *w_act, float *g, float *m, float *v, size_t n,             \
       float lr, float b1, float b2, float eps, float wd, int t, float gscale),                    \
      (be, w, w_act, g, m, v, n, lr, b1, b2, eps, wd, t, gscale))

/* X for installing: be->op = prof_op (the wrapper of the same name). */
#define BE_OP_INSTALL(op, params, args) be->op = prof_##op;

#endif
