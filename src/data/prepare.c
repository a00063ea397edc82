/* prepare.c - documents -> tokens -> shards, with progress. */
#include "data/prepare.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/timeutil.h"
#include "data/docbatch.h"
#include "data/docs.h"
#include "data/shard.h"

#define BLOCK_BYTES (16u << 20) /* encode large documents in ~16 MB blocks */

typedef struct {
    data_docs *docs;
    data_docbatch *batch; /* reads docs ahead, encodes the small ones */
    int done;             /* ran out */
} source;

/* The shards of one kind ("train" or "val"), NAME_KIND_NNNNNN.bin, each of
 * at most --shard-tokens tokens: the val split rotates as the training
 * tokens do (one val shard failed past a header's int32 count). */
typedef struct {
    const char *kind;
    data_shard_writer w;
    int open;          /* w holds a shard begun and not yet committed */
    int begun;         /* shards begun (staged): the next one's NNNNNN */
    uint64_t in_shard; /* tokens in the open one */
} shard_stream;

typedef struct {
    const data_prepare_config *cfg;
    data_prepare_stats *st;
    int version;
    shard_stream train, val;
    uint64_t total_bytes, val_bytes, done_bytes;
    double t0, last_report;
    uint32_t *ids;
    size_t n_ids, cap_ids;
    char **old; /* NAME's shards in out_dir before the run */
    int n_old;
    int published;             /* publish() succeeded */
    char made_from[4400];      /* the first directory of out_dir the run made ("": none) */
    int lock_fd;               /* the lock on NAME in out_dir (-1: not held) */
    char lock_path[4400];
    source src[DATA_PREPARE_MAX_INPUTS];
} prep;

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

/* The inputs, for a message about all of them: a file's path, an input's
 * name and its file count, or every input's name. */
static void inputs_text(const data_prepare_config *c, char *out, size_t n) {
    int files = 0;
    for (int i = 0; i < c->n_inputs; i++)
        files += c->inputs[i].n_paths;
    if (c->n_inputs == 1 && files == 1) {
        snprintf(out, n, "%s", c->inputs[0].paths[0]);
        return;
    }
    if (c->n_inputs == 1) {
        snprintf(out, n, "%s (%d files)", c->inputs[0].name, files);
        return;
    }
    size_t at = (size_t)snprintf(out, n, "all %d inputs (", c->n_inputs);
    for (int i = 0; i < c->n_inputs && at < n; i++)
        at += (size_t)snprintf(out + at, n - at, "%s%s", i ? ", " : "", c->inputs[i].name);
    if (at < n) snprintf(out + at, n - at, "; %d files)", files);
}

/* Shard `idx` of kind "train" or "val" in out_dir: its final name, or
 * (staged) the hidden name it is committed under until the whole run has
 * succeeded (".NAME_KIND_NNNNNN.bin.staged": no glob of shards matches it). */
static void shard_path(const prep *p, const char *kind, int idx, int staged, char *out, size_t n) {
    snprintf(out, n, "%s/%s%s_%s_%06d.bin%s", p->cfg->out_dir, staged ? "." : "", p->cfg->name,
             kind, idx, staged ? ".staged" : "");
}

static ms_status stream_open(prep *p, shard_stream *s) {
    char path[4400];
    if (s->begun > 999999) /* a seventh digit would sort the names out of order */
        return ms_error(MS_ERR_ARG,
                        "--shard-tokens %llu makes more than 1000000 %s shards: raise it "
                        "(the shards' six-digit names keep the glob in the documents' order)",
                        (unsigned long long)p->cfg->shard_tokens,
                        !strcmp(s->kind, "val") ? "validation" : "training");
    shard_path(p, s->kind, s->begun++, 1, path, sizeof path);
    MS_TRY(data_shard_writer_open(&s->w, path, p->version));
    s->open = 1;
    s->in_shard = 0;
    return MS_OK;
}

static ms_status stream_commit(prep *p, shard_stream *s) {
    s->open = 0;
    MS_TRY(data_shard_writer_commit(&s->w));
    p->st->shards++;
    return MS_OK;
}

/* Append ids to the val or the train shards, a new shard every
 * --shard-tokens tokens. */
static ms_status emit(prep *p, const uint32_t *ids, size_t n, int to_val) {
    shard_stream *s = to_val ? &p->val : &p->train;
    p->st->tokens += n;
    *(to_val ? &p->st->val_tokens : &p->st->train_tokens) += n;
    while (n > 0) {
        if (!s->open) MS_TRY(stream_open(p, s));
        uint64_t room = p->cfg->shard_tokens - s->in_shard;
        size_t k = n < room ? n : (size_t)room;
        MS_TRY(data_shard_writer_put(&s->w, ids, k));
        s->in_shard += k;
        ids += k;
        n -= k;
        if (s->in_shard == p->cfg->shard_tokens) MS_TRY(stream_commit(p, s));
    }
    return MS_OK;
}

/* Bytes of ids[0, n) up to and including the first token that reaches
 * `bytes`: the number of those tokens (n if they never reach it). */
static size_t token_cut(const data_tokenizer *tok, const uint32_t *ids, size_t n, size_t bytes) {
    size_t at = 0, k = 0;
    while (k < n && at < bytes)
        at += tok ? data_tok_token_len(tok, ids[k++]) : (k++, 1);
    return k;
}

/* Encode text[0, len) and emit it: tokens that start before byte `cut` to
 * val, the rest to train (cut 0: all train; cut >= len: all val).  The text
 * is cut nowhere else than the caller's safe places, so a cut inside it
 * falls between two tokens of the unbroken tokenisation. */
static ms_status encode_emit(prep *p, const char *text, size_t len, size_t cut) {
    p->n_ids = 0;
    if (p->cfg->tok) {
        MS_TRY(data_tok_encode_parallel(p->cfg->tok, text, len, p->cfg->threads, &p->ids, &p->n_ids,
                                        &p->cap_ids));
    } else {
        if (p->cap_ids < len) {
            uint32_t *g = realloc(p->ids, len * sizeof(uint32_t));
            if (!g) return ms_error(MS_ERR_NOMEM, "prepare: out of memory");
            p->ids = g;
            p->cap_ids = len;
        }
        for (size_t i = 0; i < len; i++)
            p->ids[i] = (unsigned char)text[i];
        p->n_ids = len;
    }
    size_t k = cut >= len ? p->n_ids : token_cut(p->cfg->tok, p->ids, p->n_ids, cut);
    if (k > 0) MS_TRY(emit(p, p->ids, k, 1));
    return k < p->n_ids ? emit(p, p->ids + k, p->n_ids - k, 0) : MS_OK;
}

/* Where a document of `used` input bytes at input position pos goes: the
 * text offset of its val/train cut (0: all train, len: all val).  Whole
 * documents go to the side holding more of their bytes; one that crosses
 * the mark and is larger than the val share is cut at the mark. */
static size_t val_cut(const prep *p, uint64_t pos, uint64_t used, size_t len) {
    uint64_t mark = p->val_bytes;
    if (mark == 0 || pos >= mark) return 0;
    if (pos + used <= mark) return len;
    if (used <= mark) return 2 * (mark - pos) >= used ? len : 0;
    /* the crossing document is cut: at the mark, in its text's bytes (JSONL:
     * scaled from the line's bytes), at least one byte */
    double c = (double)(mark - pos) * (double)len / (double)used;
    size_t cut = (size_t)c < len ? (size_t)c : len - 1;
    return cut > 0 ? cut : 1;
}

/* The end of a document whose val/train cut was `cut` (see val_cut): its
 * end-of-text token on the side of its last token, the counts. */
static ms_status end_document(prep *p, size_t cut, size_t len, uint64_t pos0, uint64_t used) {
    p->done_bytes = pos0 + used;
    int eot = p->cfg->tok ? data_tok_eot(p->cfg->tok) : -1;
    if (eot >= 0) {
        uint32_t e = (uint32_t)eot;
        MS_TRY(emit(p, &e, 1, cut >= len));
    }
    if (cut >= len) p->st->val_documents++;
    if (cut > 0 && cut < len) p->st->val_cut = 1;
    p->st->documents++;
    p->st->text_bytes += len;
    progress(p, 0);
    return MS_OK;
}

/* A large document, as text: encoded in blocks cut at data_tok_next_cut's
 * places (one block when there is none), the val/train split in the token
 * stream (see val_cut). */
static ms_status do_text(prep *p, const char *text, size_t len, uint64_t used) {
    uint64_t pos0 = p->done_bytes;
    size_t cut = val_cut(p, pos0, used, len);
    size_t pos = 0;
    while (pos < len) {
        size_t want = pos + BLOCK_BYTES;
        want = want < len ? data_tok_next_cut(p->cfg->tok, text, len, want) : len;
        size_t c = cut <= pos ? 0 : cut - pos; /* relative to the block */
        MS_TRY(encode_emit(p, text + pos, want - pos, c));
        pos = want;
        p->done_bytes = pos0 + (uint64_t)((double)used * (double)pos / (double)len);
        progress(p, 0);
    }
    return end_document(p, cut, len, pos0, used);
}

/* A small document, already encoded: ids (n) of its len bytes. */
static ms_status do_ids(prep *p, const uint32_t *ids, size_t n, size_t len, uint64_t used) {
    uint64_t pos0 = p->done_bytes;
    size_t cut = val_cut(p, pos0, used, len);
    size_t k = cut >= len ? n : token_cut(p->cfg->tok, ids, n, cut);
    if (k > 0) MS_TRY(emit(p, ids, k, 1));
    if (k < n) MS_TRY(emit(p, ids + k, n - k, 0));
    return end_document(p, cut, len, pos0, used);
}

/* b past "NAME_KIND_" and its digits (at least one), or NULL when b does
 * not begin so. */
static const char *past_shard_number(const char *b, const char *name, const char *kind) {
    size_t nl = strlen(name), kl = strlen(kind);
    if (strncmp(b, name, nl) || b[nl] != '_' || strncmp(b + nl + 1, kind, kl) ||
        b[nl + 1 + kl] != '_')
        return NULL;
    const char *d = b + nl + kl + 2, *e = d;
    while (*e >= '0' && *e <= '9')
        e++;
    return e > d ? e : NULL;
}

/* Whether path (out_dir/...) is a shard of NAME of this kind:
 * NAME_KIND_<digits>.bin exactly (not another name's shard that the glob
 * also matched: NAME "data" and "data_train_train_000000.bin"). */
static int is_shard_of(const char *path, const char *out_dir, const char *name, const char *kind) {
    const char *e = past_shard_number(path + strlen(out_dir) + 1, name, kind);
    return e && !strcmp(e, ".bin");
}

/* NAME's shards already in out_dir into p->old; without force, an error
 * naming them (a new data set would overwrite some and mix with the rest). */
static ms_status find_old(prep *p) {
    const data_prepare_config *c = p->cfg;
    static const char *kinds[] = {"train", "val"};
    char dir[8200], nm[512];
    MS_TRY(ms_glob_escape(c->out_dir, dir, sizeof dir));
    MS_TRY(ms_glob_escape(c->name, nm, sizeof nm));
    for (int k = 0; k < 2; k++) {
        char pat[8800], **paths = NULL;
        int n = 0, kept = 0;
        snprintf(pat, sizeof pat, "%s/%s_%s_*.bin", dir, nm, kinds[k]);
        ms_status st = ms_glob(pat, &paths, &n);
        if (st == MS_ERR_NOTFOUND) continue;
        MS_TRY(st);
        for (int i = 0; i < n; i++) {
            if (is_shard_of(paths[i], c->out_dir, c->name, kinds[k]))
                paths[kept++] = paths[i];
            else
                free(paths[i]);
        }
        n = kept;
        if (n == 0) {
            free(paths);
            continue;
        }
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

/* No input is one of the shards this run replaces (--force with an --input
 * that includes --out): they would be read back as text while rewritten. */
static ms_status inputs_not_old(const prep *p) {
    const data_prepare_config *c = p->cfg;
    if (p->n_old == 0) return MS_OK;
    struct stat *old = calloc((size_t)p->n_old, sizeof *old), b;
    if (!old) return ms_error(MS_ERR_NOMEM, "out of memory");
    for (int o = 0; o < p->n_old; o++)
        if (stat(p->old[o], &old[o]) != 0) old[o].st_ino = 0; /* gone: matches no input */
    ms_status st = MS_OK;
    for (int i = 0; st == MS_OK && i < c->n_inputs; i++)
        for (int k = 0; st == MS_OK && k < c->inputs[i].n_paths; k++) {
            if (stat(c->inputs[i].paths[k], &b) != 0) continue;
            for (int o = 0; o < p->n_old; o++)
                if (old[o].st_ino && old[o].st_dev == b.st_dev && old[o].st_ino == b.st_ino) {
                    st = ms_error(MS_ERR_ARG,
                                  "--input %s: %s is a shard of %s that this run replaces; give "
                                  "the text inputs only, or another --out",
                                  c->inputs[i].name, c->inputs[i].paths[k], c->out_dir);
                    break;
                }
        }
    free(old);
    return st;
}

/* Every shard of the run is committed under its staged name: give each its
 * final name (replacing an old shard of that name), then make the renames
 * durable.  Until here a failed run changed nothing in out_dir. */
static ms_status publish(prep *p) {
    char from[4400], to[4400];
    const shard_stream *kinds[] = {&p->val, &p->train};
    for (int j = 0; j < 2; j++)
        for (int k = 0; k < kinds[j]->begun; k++) {
            shard_path(p, kinds[j]->kind, k, 1, from, sizeof from);
            shard_path(p, kinds[j]->kind, k, 0, to, sizeof to);
            if (rename(from, to) != 0)
                return ms_error(MS_ERR_IO, "%s: rename from %s: %s", to, from, strerror(errno));
        }
    int fd = open(p->cfg->out_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return ms_error(MS_ERR_IO, "%s: open directory: %s", p->cfg->out_dir, strerror(errno));
    ms_status st = MS_OK;
    if (fsync(fd) != 0 && errno != EINVAL)
        st = ms_error(MS_ERR_IO, "%s: fsync directory: %s", p->cfg->out_dir, strerror(errno));
    close(fd);
    return st;
}

/* A failed run: remove the shards it staged (those not yet published). */
static void unstage(prep *p) {
    char path[4400];
    const shard_stream *kinds[] = {&p->val, &p->train};
    for (int j = 0; j < 2; j++)
        for (int k = 0; k < kinds[j]->begun; k++) {
            shard_path(p, kinds[j]->kind, k, 1, path, sizeof path);
            unlink(path);
        }
}

/* One run at a time writes shards of NAME in out_dir: an flock on
 * DIR/.NAME.prepare.lock, held until the run ends (the kernel drops it when
 * the process dies), removed with it.  The file is checked to be the one
 * locked, as a run that ends removes it between another's open and flock. */
static ms_status lock_out(prep *p) {
    const data_prepare_config *c = p->cfg;
    if ((size_t)snprintf(p->lock_path, sizeof p->lock_path, "%s/.%s.prepare.lock", c->out_dir,
                         c->name) >= sizeof p->lock_path)
        return ms_error(MS_ERR_ARG, "--out %s: path too long", c->out_dir);
    for (;;) {
        int fd = open(p->lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0) return ms_error(MS_ERR_IO, "%s: open: %s", p->lock_path, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(fd);
            if (e == EWOULDBLOCK)
                return ms_error(MS_ERR_ARG,
                                "another `megascale data prepare` is writing shards named %s_* "
                                "in %s (it holds %s): wait for it to end, or choose another "
                                "--out or --name",
                                c->name, c->out_dir, p->lock_path);
            return ms_error(MS_ERR_IO, "%s: flock: %s", p->lock_path, strerror(e));
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(p->lock_path, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino) {
            p->lock_fd = fd;
            return MS_OK;
        }
        close(fd); /* removed by the run that held it: take the new one */
    }
}

static void unlock_out(prep *p) {
    if (p->lock_fd < 0) return;
    unlink(p->lock_path); /* while held: a run waiting on it sees another inode */
    close(p->lock_fd);
    p->lock_fd = -1;
}

/* 1 if base (a name in out_dir) is ".NAME_KIND_NNNNNN.bin.staged", or that
 * with the ".tmp.PID" of its atomic write: what a killed run left. */
static int is_leftover(const char *base, const char *name, const char *kind) {
    const char *e = base[0] == '.' ? past_shard_number(base + 1, name, kind) : NULL;
    if (!e || strncmp(e, ".bin.staged", 11)) return 0;
    e += 11;
    if (!*e) return 1;
    if (strncmp(e, ".tmp.", 5) || !e[5]) return 0;
    for (e += 5; *e >= '0' && *e <= '9'; e++)
        ;
    return !*e;
}

/* The staged shards (and their temporary files) of NAME that a run killed
 * part way left in out_dir: removed (under the lock, so no live run's). */
static ms_status remove_leftovers(prep *p) {
    const data_prepare_config *c = p->cfg;
    char dir[8200], nm[512];
    MS_TRY(ms_glob_escape(c->out_dir, dir, sizeof dir));
    MS_TRY(ms_glob_escape(c->name, nm, sizeof nm));
    static const char *kinds[] = {"train", "val"};
    for (int k = 0; k < 2; k++) {
        char pat[8800], **paths = NULL;
        int n = 0;
        snprintf(pat, sizeof pat, "%s/.%s_%s_*.bin.staged*", dir, nm, kinds[k]);
        ms_status st = ms_glob(pat, &paths, &n);
        if (st == MS_ERR_NOTFOUND) continue;
        MS_TRY(st);
        for (int i = 0; st == MS_OK && i < n; i++) {
            const char *slash = strrchr(paths[i], '/');
            if (!is_leftover(slash ? slash + 1 : paths[i], c->name, kinds[k])) continue;
            if (unlink(paths[i]) != 0 && errno != ENOENT)
                st = ms_error(MS_ERR_IO, "%s: remove what a killed run left: %s", paths[i],
                              strerror(errno));
            else
                p->st->leftovers_removed++;
        }
        ms_paths_free(paths, n);
        MS_TRY(st);
    }
    return MS_OK;
}

/* The first directory of path that does not exist (into out; "" if all do). */
static void first_missing(const char *path, char *out, size_t n) {
    out[0] = 0;
    char buf[4400];
    if ((size_t)snprintf(buf, sizeof buf, "%s", path) >= sizeof buf) return;
    struct stat sb;
    while (stat(buf, &sb) != 0 && errno == ENOENT) {
        snprintf(out, n, "%s", buf);
        char up[4400];
        snprintf(up, sizeof up, "%s", buf);
        ms_path_dir(up);
        if (!strcmp(up, buf)) break; /* "." or "/" */
        snprintf(buf, sizeof buf, "%s", up);
    }
}

/* The run a SIGBUS would end (an input truncated while it is read: fileio.c's handler
 * names the file and exits 4): what a failed run removes, removed first from the handler,
 * with async-signal-safe calls only (the staged shards, the lock, the directories made).
 * Before, that exit left all three under --out. */
static prep *g_bus_prep;

static int staged_of(const char *entry, const void *name) {
    return is_leftover(entry, name, "train") || is_leftover(entry, name, "val");
}

static void bus_cleanup(void) {
    prep *p = g_bus_prep;
    if (!p || p->published) return;
    int fd = open(p->cfg->out_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    for (int pass = 0; fd >= 0 && pass < 16 && ms_unlinkat_matching(fd, staged_of, p->cfg->name);
         pass++) {
    }
    if (fd >= 0) close(fd);
    if (p->lock_fd >= 0) unlink(p->lock_path);
    static char d[sizeof p->made_from];
    size_t stop = strlen(p->made_from), len = strlen(p->cfg->out_dir);
    if (!stop || len >= sizeof d) return;
    memcpy(d, p->cfg->out_dir, len + 1);
    while (len >= stop && rmdir(d) == 0) { /* the deepest first, each only if empty */
        char *slash = strrchr(d, '/');
        if (!slash || slash == d) return;
        *slash = 0;
        len = (size_t)(slash - d);
    }
}

/* A failed run: the directories it made for out_dir, removed again (the
 * deepest first, each only if empty). */
static void remove_made_dirs(const prep *p) {
    if (!p->made_from[0]) return;
    char d[4400];
    snprintf(d, sizeof d, "%s", p->cfg->out_dir);
    size_t stop = strlen(p->made_from);
    while (strlen(d) >= stop) {
        if (rmdir(d) != 0) return;
        char up[4400];
        snprintf(up, sizeof up, "%s", d);
        ms_path_dir(up);
        if (!strcmp(up, d)) return;
        snprintf(d, sizeof d, "%s", up);
    }
}

/* force: remove the old shards that this run did not rewrite. */
static ms_status remove_stale(prep *p) {
    for (int i = 0; i < p->n_old; i++) {
        char mine[4400];
        int rewritten = 0;
        const shard_stream *kinds[] = {&p->val, &p->train};
        for (int j = 0; j < 2; j++)
            for (int k = 0; !rewritten && k < kinds[j]->begun; k++) {
                shard_path(p, kinds[j]->kind, k, 0, mine, sizeof mine);
                rewritten = !strcmp(p->old[i], mine);
            }
        if (rewritten) continue;
        if (remove(p->old[i]) != 0)
            return ms_error(MS_ERR_IO, "%s: remove the old shard: %s", p->old[i], strerror(errno));
        p->st->stale_removed++;
    }
    return MS_OK;
}

/* The input the next document comes from, or -1 when all ran out: the
 * first one left, or when blending the one with the fewest tokens per unit
 * of weight (ties to the earlier one). */
static int pick(const prep *p) {
    int best = -1;
    double bv = 0;
    for (int i = 0; i < p->cfg->n_inputs; i++) {
        if (p->src[i].done) continue;
        const data_prepare_input *in = &p->cfg->inputs[i];
        if (in->weight <= 0) return i;
        double v = (double)p->st->in[i].tokens / in->weight;
        if (best < 0 || v < bv) {
            best = i;
            bv = v;
        }
    }
    return best;
}

/* Input s ran out (after `used` more bytes). */
static void ran_out(prep *p, int s, uint64_t used) {
    p->done_bytes += used;
    p->st->in[s].bytes += used;
    p->src[s].done = 1;
    if (p->st->first_out >= 0) return;
    p->st->first_out = s; /* the first to run out: the blend's end */
    p->st->mixed_tokens = p->st->tokens;
    for (int i = 0; i < p->cfg->n_inputs; i++)
        p->st->in[i].mixed_tokens = p->st->in[i].tokens;
}

/* Documents from the inputs, in the blended order, into the shards. */
static ms_status blend(prep *p) {
    const data_prepare_config *c = p->cfg;
    for (int i = 0; i < c->n_inputs; i++) {
        MS_TRY(data_docs_open(&p->src[i].docs, c->inputs[i].paths, c->inputs[i].n_paths,
                              c->jsonl_field, c->jsonl_skip_bad));
        MS_TRY(data_docbatch_create(&p->src[i].batch, p->src[i].docs, c->tok, c->threads));
    }
    for (int s; (s = pick(p)) >= 0;) {
        data_prepare_input_stats *is = &p->st->in[s];
        data_docbatch_doc d;
        int end;
        uint64_t t0 = p->st->tokens;
        MS_TRY(data_docbatch_next(p->src[s].batch, &d, &end));
        if (end) {
            if (!is->documents && c->inputs[s].weight > 0) /* its share is of nothing */
                return ms_error(MS_ERR_FORMAT,
                                "--input %s:%g: no document to blend (an empty input%s): give "
                                "inputs that hold text, or leave this one out",
                                c->inputs[s].name, c->inputs[s].weight,
                                c->jsonl_skip_bad ? ", or every line skipped" : "");
            ran_out(p, s, d.used);
            continue;
        }
        is->bytes += d.used;
        if (d.text) { /* the last document read: the reader names its file */
            ms_status st = do_text(p, d.text, d.len, d.used);
            if (st != MS_OK) return ms_error_wrap(st, "%s", data_docs_path(p->src[s].docs));
        } else {
            MS_TRY(do_ids(p, d.ids, d.n_ids, d.len, d.used));
        }
        is->documents++;
        is->tokens += p->st->tokens - t0;
    }
    for (int i = 0; i < c->n_inputs; i++) {
        const char *first;
        p->st->in[i].skipped = data_docs_skipped(p->src[i].docs, &first);
        snprintf(p->st->in[i].first_skipped, sizeof p->st->in[i].first_skipped, "%s", first);
    }
    if (p->st->documents == 0) {
        char what[1024];
        inputs_text(c, what, sizeof what);
        return ms_error(MS_ERR_FORMAT, "%s: no documents in the input (%llu bytes)", what,
                        (unsigned long long)p->total_bytes);
    }
    return MS_OK;
}

static ms_status run(prep *p) {
    const data_prepare_config *c = p->cfg;
    for (int i = 0; i < c->n_inputs; i++)
        for (int k = 0; k < c->inputs[i].n_paths; k++) {
            uint64_t sz;
            MS_TRY(ms_file_size(c->inputs[i].paths[k], &sz));
            p->total_bytes += sz;
        }
    char what[1024];
    inputs_text(c, what, sizeof what);
    if (p->total_bytes == 0) return ms_error(MS_ERR_FORMAT, "%s: input is empty (0 bytes)", what);
    p->val_bytes = (uint64_t)((double)p->total_bytes * c->val_fraction);
    first_missing(c->out_dir, p->made_from, sizeof p->made_from);
    MS_TRY(ms_mkdirs(c->out_dir));
    MS_TRY(lock_out(p)); /* then what is in out_dir holds until the run ends */
    MS_TRY(find_old(p));
    MS_TRY(inputs_not_old(p));
    MS_TRY(remove_leftovers(p));
    MS_TRY(blend(p));
    if (p->st->train_tokens == 0) /* whole documents go to val: a few large ones can take all */
        return ms_error(MS_ERR_ARG,
                        "no training tokens: every document went to the validation split "
                        "(--val-fraction %g of %llu bytes: the split keeps whole documents, so "
                        "with few documents its share can take them all); give more text or a "
                        "smaller --val-fraction",
                        c->val_fraction, (unsigned long long)p->total_bytes);
    if (p->val.open) MS_TRY(stream_commit(p, &p->val));
    if (p->train.open) MS_TRY(stream_commit(p, &p->train));
    ms_cleanup_hold(1); /* publishing: a signal now leaves what a kill leaves (it removed the
                           shards not yet renamed, after some were) */
    ms_status st = publish(p);
    if (st == MS_OK) p->published = 1;
    ms_cleanup_hold(0);
    MS_TRY(st);
    return remove_stale(p);
}

ms_status data_prepare(const data_prepare_config *cfg, data_prepare_stats *stats) {
    memset(stats, 0, sizeof *stats);
    stats->first_out = -1;
    if (!(cfg->val_fraction >= 0 && cfg->val_fraction < 1))
        return ms_error(MS_ERR_ARG, "val fraction must be in [0, 1) (got %g)", cfg->val_fraction);
    if (cfg->shard_tokens < 1 || cfg->shard_tokens > INT32_MAX) /* the header's count: int32 */
        return ms_error(MS_ERR_ARG,
                        "--shard-tokens %llu: a shard holds 1 to %d tokens (its header's count "
                        "is an int32)",
                        (unsigned long long)cfg->shard_tokens, INT32_MAX);
    if (cfg->n_inputs < 1 || cfg->n_inputs > DATA_PREPARE_MAX_INPUTS)
        return ms_error(MS_ERR_ARG, "prepare takes 1 to %d inputs (got %d)",
                        DATA_PREPARE_MAX_INPUTS, cfg->n_inputs);
    for (int i = 0; i < cfg->n_inputs; i++)
        if (!(cfg->inputs[i].weight >= 0) ||
            (cfg->inputs[i].weight > 0) != (cfg->inputs[0].weight > 0))
            return ms_error(MS_ERR_ARG,
                            "input %s: weight %g: give every input a weight > 0, or none",
                            cfg->inputs[i].name, cfg->inputs[i].weight);
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
    p.train.kind = "train";
    p.val.kind = "val";
    int vocab = cfg->tok ? data_tok_vocab_size(cfg->tok) : 256;
    p.version = vocab <= 65536 ? 1 : 2;
    p.t0 = p.last_report = ms_now();
    p.lock_fd = -1;
    g_bus_prep = &p;
    ms_file_set_sigbus_hook(bus_cleanup);
    ms_status st = run(&p);
    ms_file_set_sigbus_hook(NULL);
    g_bus_prep = NULL;
    if (p.train.open) data_shard_writer_abort(&p.train.w);
    if (p.val.open) data_shard_writer_abort(&p.val.w);
    if (st != MS_OK && !p.published) unstage(&p);
    unlock_out(&p);
    if (st != MS_OK && !p.published) remove_made_dirs(&p); /* as it was: absent */
    free(p.ids);
    for (int i = 0; i < cfg->n_inputs; i++) {
        data_docbatch_free(p.src[i].batch);
        data_docs_close(p.src[i].docs);
    }
    ms_paths_free(p.old, p.n_old);
    stats->bytes = p.done_bytes;
    stats->seconds = ms_now() - p.t0;
    if (st == MS_OK)
        progress(&p, 1);
    else if (!cfg->quiet)
        fputc('\n', stderr);
    return st;
}
