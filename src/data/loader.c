/* loader.c - sequential and shuffled batches over token shards. */
#include "data/loader.h"

#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/rng.h"
#include "data/shard.h"

struct data_loader {
    data_loader_config cfg;
    data_shard *shards;
    int n_shards;
    uint64_t total_tokens;
    /* shuffle: window w of the epoch is perm[w]; windows of shard s are
     * numbered from first_window[s] */
    uint64_t *first_window; /* n_shards + 1 */
    uint64_t n_windows;
    uint32_t *perm;
    uint64_t perm_epoch; /* epoch that perm holds */
    data_cursor cur;
    int32_t *row; /* T+1 tokens being read */
};

ms_status data_order_parse(const char *s, data_order *out) {
    if (!strcmp(s, "sequential"))
        *out = DATA_ORDER_SEQUENTIAL;
    else if (!strcmp(s, "shuffle"))
        *out = DATA_ORDER_SHUFFLE;
    else
        return ms_error(MS_ERR_ARG, "unknown data order '%s' (sequential or shuffle)", s);
    return MS_OK;
}

static void make_perm(data_loader *dl, uint64_t epoch) {
    for (uint64_t i = 0; i < dl->n_windows; i++)
        dl->perm[i] = (uint32_t)i;
    ms_rng r = ms_rng_make(dl->cfg.seed, 0x5eedda7aULL + epoch);
    for (uint64_t i = dl->n_windows; i > 1; i--) { /* Fisher-Yates */
        uint64_t j = ms_rng_next_below(&r, i);
        uint32_t t = dl->perm[i - 1];
        dl->perm[i - 1] = dl->perm[j];
        dl->perm[j] = t;
    }
    dl->perm_epoch = epoch;
}

/* Tokens of one optimiser step's batch, all ranks and calls (sequential). */
static uint64_t step_tokens(const data_loader_config *cfg) {
    uint64_t accum = cfg->accum > 1 ? (uint64_t)cfg->accum : 1;
    return (uint64_t)cfg->B * (uint64_t)cfg->T * (uint64_t)cfg->nranks * accum;
}

static ms_status open_shards(data_loader *dl) {
    char **paths = NULL;
    int n = 0;
    MS_TRY(ms_glob_or_path(dl->cfg.pattern, &paths, &n));
    ms_status st = MS_OK;
    dl->shards = calloc((size_t)n, sizeof *dl->shards);
    dl->first_window = calloc((size_t)n + 1, sizeof *dl->first_window);
    if (!dl->shards || !dl->first_window) {
        st = ms_error(MS_ERR_NOMEM, "data loader: out of memory");
        goto out;
    }
    uint64_t need = step_tokens(&dl->cfg) + 1;
    for (int i = 0; i < n; i++) {
        st = data_shard_open(&dl->shards[i], paths[i]);
        if (st) goto out;
        dl->n_shards = i + 1;
        const data_shard *a = &dl->shards[0], *b = &dl->shards[i];
        if (b->magic != a->magic || b->version != a->version) { /* two tokenizers' ids */
            st = ms_error(MS_ERR_FORMAT,
                          "%s: %s is %s shard (magic %u, version %d), but %s is %s one (magic "
                          "%u, version %d): the ids of two tokenizers; one run reads the shards "
                          "of one (give a pattern that matches those alone)",
                          dl->cfg.pattern, b->path, data_shard_kind(b), (unsigned)b->magic,
                          b->version, a->path, data_shard_kind(a), (unsigned)a->magic, a->version);
            goto out;
        }
        uint64_t nt = dl->shards[i].n_tokens;
        if (dl->cfg.order == DATA_ORDER_SEQUENTIAL && nt < need) {
            st = ms_error(
                MS_ERR_FORMAT,
                "%s: shard has %llu tokens, fewer than one step's batch needs (batch*T+1 = %llu)",
                paths[i], (unsigned long long)nt, (unsigned long long)need);
            goto out;
        }
        dl->total_tokens += nt;
        uint64_t w = nt > (uint64_t)dl->cfg.T ? (nt - 1) / (uint64_t)dl->cfg.T : 0;
        dl->first_window[i + 1] = dl->first_window[i] + w;
    }
    dl->n_windows = dl->first_window[n];
out:
    ms_paths_free(paths, n);
    return st;
}

ms_status data_loader_open(data_loader **out, const data_loader_config *cfg) {
    *out = NULL;
    if (cfg->B < 1 || cfg->T < 1) return ms_error(MS_ERR_ARG, "data loader: bad batch shape");
    if (cfg->nranks < 1 || cfg->rank < 0 || cfg->rank >= cfg->nranks)
        return ms_error(MS_ERR_ARG, "data loader: rank %d of %d", cfg->rank, cfg->nranks);
    data_loader *dl = calloc(1, sizeof *dl);
    if (!dl) return ms_error(MS_ERR_NOMEM, "data loader: out of memory");
    dl->cfg = *cfg;
    dl->row = malloc(sizeof(int32_t) * ((size_t)cfg->T + 1));
    ms_status st = dl->row ? open_shards(dl) : ms_error(MS_ERR_NOMEM, "data loader: out of memory");
    if (st == MS_OK && cfg->order == DATA_ORDER_SHUFFLE) {
        /* one step's rows (the micro-batches of every rank), whatever the layout */
        uint64_t rows = step_tokens(cfg) / (uint64_t)cfg->T;
        if (dl->n_windows < rows) {
            st = ms_error(MS_ERR_FORMAT,
                          "%s: %llu tokens make only %llu windows of T+1=%d, fewer than one "
                          "step's batch of %llu",
                          cfg->pattern, (unsigned long long)dl->total_tokens,
                          (unsigned long long)dl->n_windows, cfg->T + 1, (unsigned long long)rows);
        } else if (dl->n_windows > UINT32_MAX) {
            st = ms_error(MS_ERR_RANGE, "%s: too many windows to shuffle", cfg->pattern);
        } else {
            dl->perm = malloc(sizeof(uint32_t) * dl->n_windows);
            if (!dl->perm)
                st = ms_error(MS_ERR_NOMEM, "data loader: out of memory");
            else
                make_perm(dl, 0);
        }
    }
    if (st != MS_OK) {
        data_loader_close(dl);
        return st;
    }
    *out = dl;
    return MS_OK;
}

void data_loader_close(data_loader *dl) {
    if (!dl) return;
    for (int i = 0; i < dl->n_shards; i++)
        data_shard_close(&dl->shards[i]);
    free(dl->shards);
    free(dl->first_window);
    free(dl->perm);
    free(dl->row);
    free(dl);
}

/* Copy T+1 tokens at pos of shard s into row r of inputs/targets. */
static ms_status read_row(data_loader *dl, int s, uint64_t pos, int r, int32_t *inp, int32_t *tgt,
                          int32_t *tmp) {
    int T = dl->cfg.T;
    MS_TRY(data_shard_read(&dl->shards[s], pos, (size_t)T + 1, tmp, dl->cfg.vocab));
    memcpy(inp + (size_t)r * T, tmp, sizeof(int32_t) * (size_t)T);
    memcpy(tgt + (size_t)r * T, tmp + 1, sizeof(int32_t) * (size_t)T);
    return MS_OK;
}

static ms_status next_sequential(data_loader *dl, int32_t *inp, int32_t *tgt, int32_t *tmp) {
    uint64_t BT = (uint64_t)dl->cfg.B * dl->cfg.T, call = BT * (uint64_t)dl->cfg.nranks;
    uint64_t span = step_tokens(&dl->cfg);
    data_cursor *c = &dl->cur;
    if (c->sub == 0 && c->pos + span + 1 > dl->shards[c->shard].n_tokens) {
        c->pos = 0;
        if (++c->shard == (uint64_t)dl->n_shards) {
            c->shard = 0;
            c->epoch++;
        }
    }
    uint64_t start = c->pos + call * c->sub + BT * (uint64_t)dl->cfg.rank;
    for (int r = 0; r < dl->cfg.B; r++)
        MS_TRY(read_row(dl, (int)c->shard, start + (uint64_t)r * dl->cfg.T, r, inp, tgt, tmp));
    if (++c->sub * call >= span) { /* the step's last call */
        c->sub = 0;
        c->pos += span;
    }
    return MS_OK;
}

/* Window w (in file order) into row r. */
static ms_status read_window(data_loader *dl, uint64_t w, int r, int32_t *inp, int32_t *tgt,
                             int32_t *tmp) {
    int s = 0;
    while (dl->first_window[s + 1] <= w)
        s++; /* few shards: linear scan */
    uint64_t pos = (w - dl->first_window[s]) * (uint64_t)dl->cfg.T;
    return read_row(dl, s, pos, r, inp, tgt, tmp);
}

/* Shuffle, and file order (the identity permutation). */
static ms_status next_shuffle(data_loader *dl, int32_t *inp, int32_t *tgt, int32_t *tmp) {
    data_cursor *c = &dl->cur;
    if (dl->n_windows == 0)
        return ms_error(MS_ERR_FORMAT, "%s: no window of T+1=%d tokens", dl->cfg.pattern,
                        dl->cfg.T + 1);
    uint64_t first = c->pos + (uint64_t)dl->cfg.rank * dl->cfg.B;
    for (int r = 0; r < dl->cfg.B; r++) {
        uint64_t g = first + (uint64_t)r; /* global window counter */
        uint64_t epoch = g / dl->n_windows;
        if (dl->perm && dl->perm_epoch != epoch) make_perm(dl, epoch);
        uint64_t w = dl->perm ? dl->perm[g % dl->n_windows] : g % dl->n_windows;
        MS_TRY(read_window(dl, w, r, inp, tgt, tmp));
    }
    c->pos += (uint64_t)dl->cfg.B * dl->cfg.nranks;
    c->epoch = c->pos / dl->n_windows;
    return MS_OK;
}

ms_status data_loader_next(data_loader *dl, int32_t *inputs, int32_t *targets) {
    return dl->cfg.order == DATA_ORDER_SEQUENTIAL ? next_sequential(dl, inputs, targets, dl->row)
                                                  : next_shuffle(dl, inputs, targets, dl->row);
}

ms_status data_loader_windows(data_loader *dl, uint64_t first, int n, int32_t *inputs,
                              int32_t *targets) {
    MS_CHECK(n >= 1);
    if (first + (uint64_t)n > dl->n_windows)
        return ms_error(MS_ERR_RANGE,
                        "%s: windows %llu..%llu of T+1=%d tokens asked, but the data holds %llu",
                        dl->cfg.pattern, (unsigned long long)first,
                        (unsigned long long)(first + (uint64_t)n - 1), dl->cfg.T + 1,
                        (unsigned long long)dl->n_windows);
    for (int r = 0; r < n; r++)
        MS_TRY(read_window(dl, first + (uint64_t)r, r, inputs, targets, dl->row));
    return MS_OK;
}

data_cursor data_loader_cursor(const data_loader *dl) {
    return dl->cur;
}

ms_status data_loader_seek(data_loader *dl, data_cursor c) {
    if (dl->cfg.order == DATA_ORDER_SEQUENTIAL) {
        if (c.shard >= (uint64_t)dl->n_shards)
            return ms_error(MS_ERR_RANGE,
                            "%s: the data position to continue from is shard index %llu, but the "
                            "data has %d shard(s) (indices 0..%d): the data set changed",
                            dl->cfg.pattern, (unsigned long long)c.shard, dl->n_shards,
                            dl->n_shards - 1);
        const data_shard *s = &dl->shards[c.shard];
        if (c.pos > s->n_tokens)
            return ms_error(MS_ERR_RANGE,
                            "%s: the data position to continue from is token %llu of shard index "
                            "%llu (%s), which has only %llu tokens: the data set changed",
                            dl->cfg.pattern, (unsigned long long)c.pos, (unsigned long long)c.shard,
                            s->path, (unsigned long long)s->n_tokens);
    }
    dl->cur = c;
    return MS_OK;
}

void data_loader_rewind(data_loader *dl) {
    data_cursor c = {0, 0, 0, 0};
    dl->cur = c;
}

uint64_t data_loader_total_tokens(const data_loader *dl) {
    return dl->total_tokens;
}
uint64_t data_loader_num_windows(const data_loader *dl) {
    return dl->n_windows;
}
ms_status data_loader_check_same_kind(const data_loader *a, const char *a_opt, const data_loader *b,
                                      const char *b_opt) {
    if (!a->n_shards || !b->n_shards) return MS_OK;
    const data_shard *x = &a->shards[0], *y = &b->shards[0];
    if (x->magic == y->magic && x->version == y->version) return MS_OK;
    return ms_error(MS_ERR_FORMAT,
                    "%s %s is %s shard, but %s %s is %s one: the ids of two tokenizers (its "
                    "loss would mean nothing); give shards that one tokenizer made",
                    b_opt, y->path, data_shard_kind(y), a_opt, x->path, data_shard_kind(x));
}

int data_loader_num_shards(const data_loader *dl) {
    return dl->n_shards;
}
