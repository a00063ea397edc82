/* gpt_tp_vocab.c - the vocabulary-parallel ends of the model under tensor
 * parallelism: token embedding and the fused tied classifier with
 * cross-entropy, wte split by rows over tp (rank r holds ids
 * r*Vp/tp .. (r+1)*Vp/tp-1, gpt_vocab_slice).
 *
 * Embedding: every rank looks up all N tokens in its slice (other tokens
 * contribute 0; rank 0 adds the position embedding), and a reduce-scatter
 * sums the slices into this rank's Nl rows of the residual stream (each sum
 * has one non-zero term, so it equals a single process's lookup bitwise).
 * Backward: the gradient of the Nl rows is all-gathered, each rank adds the
 * rows of its own tokens to its wte rows; rank 0 adds all rows to wpe's
 * gradient and broadcasts it (wpe is replicated).
 *
 * Classifier over the all-gathered final LayerNorm output (N,C), in chunks
 * of m->cls_rows rows: each rank computes logits for its vocabulary slice
 * and per-row (max, sum-exp, target logit), the statistics are all-gathered
 * over tp and combined in rank order (every rank gets the same losses), and
 * the gradient is formed without ever gathering full-vocabulary logits:
 * dwte for the local rows only, dx as partial sums that the final
 * LayerNorm's backward reduce-scatters to the sequence shards.
 */
#include "model/gpt_internal.h"

void gpt_tp_embed_fwd(gpt_model *m, int B, int T) {
    be_backend *be = m->be;
    int C = m->cfg.n_embd, N = B * T, v0, Vl, Vs;
    gpt_vocab_slice(m, m->tp_rank, &v0, &Vl, &Vs);
    be->embedding_slice_fwd(be, m->tmp, m->tokens, gpt_w(m, m->t_wte),
                            m->tp_rank == 0 ? gpt_w(m, m->t_wpe) : NULL, B, T, C, v0, Vl);
    gpt_tp_reduce_scatter(m, m->layers[0].resid_in, m->tmp, (size_t)(N / m->tp) * C);
}

void gpt_tp_embed_bwd(gpt_model *m, int B, int T) {
    be_backend *be = m->be;
    int C = m->cfg.n_embd, N = B * T, v0, Vl, Vs;
    gpt_vocab_slice(m, m->tp_rank, &v0, &Vl, &Vs);
    gpt_tp_allgather(m, m->dfull, m->dresid, (size_t)(N / m->tp) * C);
    float *dwpe = gpt_g(m, m->t_wpe);
    be->embedding_slice_bwd(be, gpt_g(m, m->t_wte), m->tp_rank == 0 ? dwpe : NULL, m->dfull,
                            m->tokens, B, T, C, v0, Vl);
    gpt_tp_broadcast_f32(m, dwpe, gpt_tensor(m, m->t_wpe)->numel);
}

void gpt_tp_classifier(gpt_model *m, int N, float dloss, int grad) {
    be_backend *be = m->be;
    int C = m->cfg.n_embd, P = m->tp, v0, Vl, Vs;
    gpt_vocab_slice(m, m->tp_rank, &v0, &Vl, &Vs);
    size_t es = be_dtype_size(be->act_dtype);
    int nchunks = (N + m->cls_rows - 1) / m->cls_rows, R = (N + nchunks - 1) / nchunks;
    const void *wte = gpt_w(m, m->t_wte);
    for (int r0 = 0; r0 < N; r0 += R) {
        int rb = N - r0 < R ? N - r0 : R;
        const void *x = (const char *)m->lnf + (size_t)r0 * C * es;
        float *mine = m->cls_stats + (size_t)m->tp_rank * rb * 3;
        be->classifier_slice_stats(be, mine, m->cls_logits, x, wte, m->targets + r0, rb, C, Vs, v0);
        gpt_tp_allgather_f32(m, m->cls_stats, mine, (size_t)rb * 3);
        be->classifier_slice_finish(be, m->losses + r0,
                                    grad ? (char *)m->dln + (size_t)r0 * C * es : NULL,
                                    grad ? gpt_g(m, m->t_wte) : NULL, m->cls_logits, x, wte,
                                    m->targets + r0, m->cls_stats, P, rb, C, Vs, v0, dloss);
    }
}
