/* prepare.c - documents -> tokens -> shards, with progress. */
#include "data/prepare.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/timeutil.h"
#include "data/shard.h"

#define BLOCK_BYTES (16u << 20) /* encode large documents in ~16 MB blocks */

typedef struct {
    const data_prepare_config *cfg;
    data_prepare_stats *st;
    int version;
    data_shard_writer train, val;
    int train_open, val_open, train_index;
    uint64_t in_train_shard;
    uint64_t total_bytes, val_bytes, done_bytes;
    double t0, last_report;
    uint32_t *ids;
    size_t n_ids, cap_ids;
    char **old; /* NAME's shards in out_dir before the run */
    int n_old, val_written;
} prep;

static int printable(unsigned char c) { return c >= 0x21 && c <= 0x7e; }

/* A cut at or after `from` where tokenisation cannot change (the rule of
 * data_tok_encode_parallel: just after a '\n' between two printable ASCII
 * bytes), or len if there is none. */
static size_t safe_cut(const char *t, size_t len, size_t from) {
    for (size_t i = from > 0 ? from : 1; i + 1 < len; i++)
        if (t[i] == '\n' && printable((unsigned char)t[i - 1]) && printable((unsigned char)t[i + 1]))
            return i + 1;
    return len;
}

static void progress(prep *p, int force) {
    double now = ms_now();
    if (p->cfg->quiet || (!force && now - p->last_report < 1.0)) return;
    p->last_report = now;
    double el = now - p->t0, mbs = (double)p->done_bytes / 1e6 / (el > 0 ? el : 1e-9);
    double frac = p->total_bytes ? (double)p->done_bytes / (double)p->total_bytes : 1;
    char eta[32];
    ms_fmt_duration(eta, sizeof eta, frac > 0 ? el / frac - el : 0);
    fprintf(stderr, "\r[prepare] %8.1f / %.1f MB %5.1f%% | %6.1f MB/s | %llu tokens | ETA %s   ",
            (double)p->done_bytes / 1e6, (double)p->total_bytes / 1e6, 100 * frac, mbs,
            (unsigned long long)p->st->tokens, eta);
    if (force) fputc('\n', stderr);
}

static ms_status open_train(prep *p) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s_train_%06d.bin", p->cfg->out_dir, p->cfg->name,
             p->train_index++);
    MS_TRY(data_shard_writer_open(&p->train, path, p->version));
    p->train_open = 1;
    p->in_train_shard = 0;
    return MS_OK;
}

/* Append ids to the val shard or to the train shards (rotating). */
static ms_status emit(prep *p, const uint32_t *ids, size_t n, int to_val) {
    p->st->tokens += n;
    if (to_val) {
        p->st->val_tokens += n;
        return data_shard_writer_put(&p->val, ids, n);
    }
    p->st->train_tokens += n;
    while (n > 0) {
        if (!p->train_open) MS_TRY(open_train(p));
        uint64_t room = p->cfg->shard_tokens - p->in_train_shard;
        size_t k = n < room ? n : (size_t)room;
        MS_TRY(data_shard_writer_put(&p->train, ids, k));
        p->in_train_shard += k;
        ids += k;
        n -= k;
        if (p->in_train_shard == p->cfg->shard_tokens) {
            p->train_open = 0;
            MS_TRY(data_shard_writer_commit(&p->train));
            p->st->shards++;
        }
    }
    return MS_OK;
}

/* Encode text[0, len) and emit it. */
static ms_status encode_emit(prep *p, const char *text, size_t len, int to_val) {
    p->n_ids = 0;
    if (p->cfg->tok) {
        MS_TRY(data_tok_encode_parallel(p->cfg->tok, text, len, p->cfg->threads, &p->ids,
                                        &p->n_ids, &p->cap_ids));
    } else {
        if (p->cap_ids < len) {
            uint32_t *g = realloc(p->ids, len * sizeof(uint32_t));
            if (!g) return ms_error(MS_ERR_NOMEM, "prepare: out of memory");
            p->ids = g;
            p->cap_ids = len;
        }
        for (size_t i = 0; i < len; i++) p->ids[i] = (unsigned char)text[i];
        p->n_ids = len;
    }
    return emit(p, p->ids, p->n_ids, to_val);
}

/* One document: blocks at safe cuts; the val/train boundary at a line break. */
static ms_status do_document(prep *p, const char *text, size_t len) {
    size_t pos = 0;
    while (pos < len) {
        int to_val = p->done_bytes < p->val_bytes;
        size_t want = pos + BLOCK_BYTES;
        if (to_val && p->done_bytes + BLOCK_BYTES > p->val_bytes) {
            size_t b = pos + (size_t)(p->val_bytes - p->done_bytes);
            const char *nl = b < len ? memchr(text + b, '\n', len - b) : NULL;
            want = nl ? (size_t)(nl - text) + 1 : len;
        } else {
            want = want < len ? safe_cut(text, len, want) : len;
        }
        MS_TRY(encode_emit(p, text + pos, want - pos, to_val));
        p->done_bytes += want - pos;
        pos = want;
        progress(p, 0);
    }
    int eot = p->cfg->tok ? data_tok_eot(p->cfg->tok) : -1;
    if (eot >= 0) {
        uint32_t e = (uint32_t)eot;
        MS_TRY(emit(p, &e, 1, p->done_bytes <= p->val_bytes && p->val_bytes > 0));
    }
    p->st->documents++;
    return MS_OK;
}

/* NAME's shards already in out_dir into p->old; without force, an error
 * naming them (a new data set would overwrite some and mix with the rest). */
static ms_status find_old(prep *p) {
    const data_prepare_config *c = p->cfg;
    static const char *kinds[] = {"train", "val"};
    for (int k = 0; k < 2; k++) {
        char pat[4400], **paths = NULL;
        int n = 0;
        snprintf(pat, sizeof pat, "%s/%s_%s_*.bin", c->out_dir, c->name, kinds[k]);
        ms_status st = ms_glob(pat, &paths, &n);
        if (st == MS_ERR_NOTFOUND) continue;
        MS_TRY(st);
        char **all = realloc(p->old, sizeof *all * (size_t)(p->n_old + n));
        if (!all) {
            ms_paths_free(paths, n);
            return ms_error(MS_ERR_NOMEM, "out of memory");
        }
        p->old = all;
        memcpy(p->old + p->n_old, paths, sizeof *paths * (size_t)n);
        p->n_old += n;
        free(paths); /* the strings now belong to p->old */
    }
    if (p->n_old == 0 || c->force) return MS_OK;
    return ms_error(MS_ERR_ARG,
                    "%s already holds %d shard(s) named %s_* (%s%s): the new ones would "
                    "overwrite some and mix with the others; --force replaces them (the old "
                    "shards are removed), or choose another --out or --name",
                    c->out_dir, p->n_old, c->name, p->old[0], p->n_old > 1 ? ", ..." : "");
}

/* force: remove the old shards that this run did not rewrite. */
static ms_status remove_stale(prep *p) {
    const data_prepare_config *c = p->cfg;
    for (int i = 0; i < p->n_old; i++) {
        char mine[4400];
        int rewritten = 0;
        snprintf(mine, sizeof mine, "%s/%s_val_000000.bin", c->out_dir, c->name);
        rewritten = p->val_written && !strcmp(p->old[i], mine);
        for (int k = 0; !rewritten && k < p->train_index; k++) {
            snprintf(mine, sizeof mine, "%s/%s_train_%06d.bin", c->out_dir, c->name, k);
            rewritten = !strcmp(p->old[i], mine);
        }
        if (rewritten) continue;
        if (remove(p->old[i]) != 0)
            return ms_error(MS_ERR_IO, "%s: remove the old shard: %s", p->old[i], strerror(errno));
        p->st->stale_removed++;
    }
    return MS_OK;
}

static ms_status run(prep *p) {
    const data_prepare_config *c = p->cfg;
    for (int i = 0; i < c->n_inputs; i++) {
        uint64_t sz;
        MS_TRY(ms_file_size(c->inputs[i], &sz));
        p->total_bytes += sz;
    }
    if (p->total_bytes == 0)
        return ms_error(MS_ERR_FORMAT, "%s: input is empty (%d file(s), 0 bytes)",
                        c->n_inputs ? c->inputs[0] : "(no input)", c->n_inputs);
    p->val_bytes = (uint64_t)((double)p->total_bytes * c->val_fraction);
    MS_TRY(find_old(p));
    MS_TRY(ms_mkdirs(c->out_dir));
    if (p->val_bytes > 0) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s_val_000000.bin", c->out_dir, c->name);
        MS_TRY(data_shard_writer_open(&p->val, path, p->version));
        p->val_open = 1;
    }
    for (int i = 0; i < c->n_inputs; i++) {
        char *text = NULL;
        size_t len = 0;
        MS_TRY(ms_file_read_all(c->inputs[i], &text, &len));
        ms_status st = len ? do_document(p, text, len) : MS_OK;
        free(text);
        if (st != MS_OK) return ms_error_wrap(st, "%s", c->inputs[i]);
    }
    if (p->val_open) {
        p->val_open = 0;
        MS_TRY(data_shard_writer_commit(&p->val));
        p->st->shards++;
        p->val_written = 1;
    }
    if (p->train_open) {
        p->train_open = 0;
        MS_TRY(data_shard_writer_commit(&p->train));
        p->st->shards++;
    }
    return remove_stale(p);
}

ms_status data_prepare(const data_prepare_config *cfg, data_prepare_stats *stats) {
    memset(stats, 0, sizeof *stats);
    if (!(cfg->val_fraction >= 0 && cfg->val_fraction < 1))
        return ms_error(MS_ERR_ARG, "val fraction must be in [0, 1) (got %g)", cfg->val_fraction);
    if (cfg->shard_tokens < 1) return ms_error(MS_ERR_ARG, "shard size must be >= 1 token");
    /* the name becomes part of a file name under --out: nothing that leaves it */
    if (!cfg->name || !*cfg->name || strchr(cfg->name, '/') || cfg->name[0] == '.' ||
        strlen(cfg->name) > 200)
        return ms_error(MS_ERR_ARG,
                        "--name '%s': a shard name prefix is a plain file name (no '/', not "
                        "starting with '.', at most 200 bytes)",
                        cfg->name ? cfg->name : "");
    prep p;
    memset(&p, 0, sizeof p);
    p.cfg = cfg;
    p.st = stats;
    int vocab = cfg->tok ? data_tok_vocab_size(cfg->tok) : 256;
    p.version = vocab <= 65536 ? 1 : 2;
    p.t0 = p.last_report = ms_now();
    ms_status st = run(&p);
    if (p.train_open) data_shard_writer_abort(&p.train);
    if (p.val_open) data_shard_writer_abort(&p.val);
    free(p.ids);
    ms_paths_free(p.old, p.n_old);
    stats->bytes = p.done_bytes;
    stats->seconds = ms_now() - p.t0;
    if (st == MS_OK) progress(&p, 1);
    else if (!cfg->quiet) fputc('\n', stderr);
    return st;
}
