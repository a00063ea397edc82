/* cmd_data.c - `megascale data`: text to token shards, tokenizer training,
 * shard inspection.
 *   data prepare --input FILE|GLOB|DIR[:WEIGHT] ... --tokenizer gpt2|bytes|FILE --out DIR
 *   data tokenizer-train --input FILE|GLOB|DIR ... --vocab-size N --out FILE
 *   data inspect SHARD [--tokenizer gpt2|FILE] */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fileio.h"
#include "base/jsonstr.h"
#include "base/timeutil.h"
#include "cli/commands.h"
#include "cli/opts.h"
#include "data/docs.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"

typedef struct {
    opts_list input;
    char *out, *tokenizer, *name, *data_dir, *jsonl_field;
    double val_fraction;
    int count, vocab_size, threads, force, jsonl_skip_bad;
    uint64_t shard_tokens;
    opts_list config; /* the --config files read (opts_check_output) */
} data_config;

#define O(name, type, field, def, help)                                                            \
    { name, type, offsetof(data_config, field), def, help, NULL, NULL, 0, 0 }
#define R(name, type, field, def, range, help)                                                     \
    { name, type, offsetof(data_config, field), def, help, NULL, range, 0, 0 }
#define OE(name, type, field, def, env, help)                                                      \
    { name, type, offsetof(data_config, field), def, help, env, NULL, 0, 0 }
static const opts_spec data_opts[] = {
    O("input", OPT_T_LIST, input, NULL,
      "text: a file, a glob of files, or a directory; several --input are read in order, or "
      "blended by tokens when each ends in :WEIGHT (prepare)"),
    O("out", OPT_T_STR, out, NULL,
      "output: shard directory (prepare), tokenizer file (tokenizer-train)"),
    O("tokenizer", OPT_T_STR, tokenizer, "gpt2", "gpt2, bytes, or a tokenizer file"),
    OE("data-dir", OPT_T_STR, data_dir, MS_DATA_DIR, "MS_DATA_DIR",
       "directory of the shipped tokenizers (gpt2: DIR/gpt2.tok)"),
    O("name", OPT_T_STR, name, "data", "shard name prefix: NAME_train_000000.bin (prepare)"),
    R("val-fraction", OPT_T_DOUBLE, val_fraction, "0.01", "[0,1)",
      "share of the input for validation"),
    R("shard-tokens", OPT_T_U64, shard_tokens, "100000000", "[1,2147483647]",
      "tokens per training shard"),
    R("vocab-size", OPT_T_INT, vocab_size, "4096", "[257,16777216]",
      "vocabulary size (tokenizer-train): the 256 bytes, merges, and the end-of-text token"),
    R("threads", OPT_T_INT, threads, "0", "[0,1024]", "encoding threads (0: all cores)"),
    R("count", OPT_T_INT, count, "32", "[0,)", "tokens to show (inspect)"),
    O("jsonl-field", OPT_T_STR, jsonl_field, "text",
      "the member of each JSON object that holds the text, in .jsonl inputs"),
    R("jsonl-skip-bad", OPT_T_INT, jsonl_skip_bad, "0", "[0,1]",
      "1: skip bad .jsonl lines and count them (0: a bad line is an error naming FILE:LINE)"),
    OPTS_FLAG("force", data_config, force,
              "1 (or a bare --force) replaces what --out holds: prepare, the shards of --name (the "
              "old ones not rewritten "
              "are removed); tokenizer-train, the file (0: refuse)"),
    OPTS_CONFIG_FILES(data_config, config),
};
#define N_DATA_OPTS ((int)(sizeof data_opts / sizeof data_opts[0]))

/* Input files: a directory's regular files (sorted, its subdirectories
 * and hidden files left out), an existing file as it is, or a glob's
 * matches (the directories among them left out). */
static ms_status list_inputs(const char *in, char ***paths, int *n) {
    struct stat sb;
    if (stat(in, &sb) == 0 && !S_ISDIR(sb.st_mode)) return ms_glob_or_path(in, paths, n);
    if (stat(in, &sb) != 0) { /* a glob: the directories it matches left out, as below */
        MS_TRY(ms_glob_or_path(in, paths, n));
        int kept = 0, dirs = *n;
        char first[4200] = "";
        for (int i = 0; i < *n; i++) {
            if (stat((*paths)[i], &sb) == 0 && S_ISDIR(sb.st_mode)) {
                if (!first[0]) snprintf(first, sizeof first, "%s", (*paths)[i]);
                free((*paths)[i]);
            } else {
                (*paths)[kept++] = (*paths)[i];
            }
        }
        if (kept > 0) return *n = kept, MS_OK;
        ms_paths_free(*paths, 0);
        *paths = NULL;
        *n = 0;
        return ms_error(MS_ERR_NOTFOUND,
                        "%s: matches only directories (%s%s; a directory's files are read with "
                        "--input DIR)",
                        in, first, dirs > 1 ? ", ..." : "");
    }
    char pat[8400];
    MS_TRY(ms_glob_escape(in, pat, sizeof pat - 2));
    strcat(pat, "/*");
    ms_status st = ms_glob(pat, paths, n);
    int kept = 0;
    for (int i = 0; st == MS_OK && i < *n; i++) {
        if (stat((*paths)[i], &sb) == 0 && S_ISREG(sb.st_mode))
            (*paths)[kept++] = (*paths)[i];
        else
            free((*paths)[i]);
    }
    if (st == MS_OK) *n = kept;
    if (st == MS_OK && kept == 0) {
        ms_paths_free(*paths, 0);
        *paths = NULL;
        st = MS_ERR_NOTFOUND;
    }
    if (st == MS_ERR_NOTFOUND) return ms_error(st, "%s: directory has no files", in);
    return st;
}

/* The --input values, each FILE|GLOB|DIR with an optional ":WEIGHT" (the
 * text after the last ':' when it is a number; "a:3:1" is the file "a:3"
 * with weight 1), expanded into files.  *in[i].name is the path part
 * (malloc'd, like the paths); free with free_inputs. */
typedef struct {
    data_prepare_input v[DATA_PREPARE_MAX_INPUTS];
    int n;
} inputs;

static void free_inputs(inputs *in) {
    for (int i = 0; i < in->n; i++) {
        ms_paths_free(in->v[i].paths, in->v[i].n_paths);
        free((char *)in->v[i].name);
    }
    in->n = 0;
}

typedef struct {
    dev_t dev;
    ino_t ino;
    int input;
    const char *path;
} file_id;

static int cmp_file_id(const void *a, const void *b) {
    const file_id *x = a, *y = b;
    if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
    if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
    return (x->input > y->input) - (x->input < y->input);
}

/* A file that the inputs name twice (two --input that overlap: a file and its directory, a
 * glob, a link to it) is refused: its documents would be read twice, and with --val-fraction
 * be in both the validation and the training shards (before, it was read twice unsaid). */
static ms_status no_file_twice(const inputs *in) {
    size_t total = 0;
    for (int i = 0; i < in->n; i++)
        total += (size_t)in->v[i].n_paths;
    file_id *f = malloc((total + 1) * sizeof *f);
    if (!f) return ms_error(MS_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (int i = 0; i < in->n; i++)
        for (int j = 0; j < in->v[i].n_paths; j++) {
            struct stat sb;
            if (stat(in->v[i].paths[j], &sb) != 0) continue; /* the reader says why */
            f[k++] = (file_id){sb.st_dev, sb.st_ino, i, in->v[i].paths[j]};
        }
    qsort(f, k, sizeof *f, cmp_file_id);
    ms_status st = MS_OK;
    for (size_t i = 1; i < k && st == MS_OK; i++) {
        if (f[i].dev != f[i - 1].dev || f[i].ino != f[i - 1].ino) continue;
        const file_id *a = &f[i - 1], *b = &f[i];
        if (a->input == b->input)
            st = ms_error(MS_ERR_ARG,
                          "--input %s reads one file twice (%s and %s: a link to it?): its "
                          "documents would be read twice; give each file once",
                          in->v[a->input].name, a->path, b->path);
        else
            st = ms_error(MS_ERR_ARG,
                          "--input %s and --input %s both read %s: its documents would be read "
                          "twice (with --val-fraction, in both the validation and the training "
                          "shards); give each file once",
                          in->v[a->input].name, in->v[b->input].name, b->path);
    }
    free(f);
    return st;
}

static ms_status parse_inputs(const opts_list *l, inputs *in) {
    memset(in, 0, sizeof *in);
    if (l->n == 0) return ms_error(MS_ERR_ARG, "--input is required");
    if (l->n > DATA_PREPARE_MAX_INPUTS)
        return ms_error(MS_ERR_ARG, "at most %d --input (got %d)", DATA_PREPARE_MAX_INPUTS, l->n);
    for (int i = 0; i < l->n; i++) {
        const char *v = l->v[i], *colon = strrchr(v, ':');
        char *end = NULL;
        double w = colon && colon[1] ? strtod(colon + 1, &end) : 0;
        int weighted = colon && colon[1] && end && !*end;
        size_t plen = weighted ? (size_t)(colon - v) : strlen(v);
        if (weighted && !(w >= 1e-9 && w <= 1e9)) /* a denormal is no share of a blend */
            return ms_error(MS_ERR_ARG, "--input %s: the weight must be a number in [1e-9, 1e9]",
                            v);
        if (plen == 0) return ms_error(MS_ERR_ARG, "--input '%s': no file, glob or directory", v);
        data_prepare_input *d = &in->v[in->n];
        char *name = strndup(v, plen);
        if (!name) return ms_error(MS_ERR_NOMEM, "out of memory");
        d->name = name;
        d->weight = weighted ? w : 0;
        in->n++;
        ms_status st = list_inputs(name, &d->paths, &d->n_paths);
        if (st != MS_OK) return ms_error_wrap(st, "--input"); /* "--input: X*: no files match" */
    }
    MS_TRY(no_file_twice(in));
    for (int i = 0; i < in->n; i++)
        if ((in->v[i].weight > 0) != (in->v[0].weight > 0))
            return ms_error(MS_ERR_ARG,
                            "--input %s has %s weight and --input %s %s: give every --input a "
                            ":WEIGHT (blending) or none (read in order)",
                            in->v[0].name, in->v[0].weight > 0 ? "a" : "no", in->v[i].name,
                            in->v[i].weight > 0 ? "has one" : "has none");
    return MS_OK;
}

ms_status cli_tokenizer_load(data_tokenizer **tok, const char *name, const char *data_dir,
                             const char *names) {
    ms_status st = data_tok_load(tok, name, data_dir);
    struct stat sb; /* a mistyped name ("gpt3"): no file of that name, and no path (before,
                     * the error was only "gpt3: open: No such file or directory") */
    if (st != MS_OK && strcmp(name, "gpt2") && !strchr(name, '/') && stat(name, &sb) != 0 &&
        errno == ENOENT)
        return ms_error(MS_ERR_NOTFOUND,
                        "--tokenizer %s: no such tokenizer: not a file, and not a built-in one "
                        "(%s); give one of those, or the path of a tokenizer file (`megascale "
                        "data tokenizer-train` writes one)",
                        name, names);
    return st == MS_OK ? MS_OK : ms_error_wrap(st, "--tokenizer");
}

/* NULL tokenizer for "bytes". */
static ms_status load_tokenizer(const char *name, const char *data_dir, data_tokenizer **tok) {
    *tok = NULL;
    if (!strcmp(name, "bytes")) return MS_OK;
    return cli_tokenizer_load(tok, name, data_dir, "gpt2, bytes");
}

/* The summary's lines for each input (several inputs only). */
static void print_inputs(const inputs *in, const data_prepare_stats *ps) {
    double wsum = 0;
    for (int i = 0; i < in->n; i++)
        wsum += in->v[i].weight;
    uint64_t mixed = ps->mixed_tokens ? ps->mixed_tokens : ps->tokens;
    for (int i = 0; i < in->n; i++) {
        const data_prepare_input_stats *s = &ps->in[i];
        fprintf(stderr, "  input %s: %llu document(s), %llu tokens (%.1f%% of all", in->v[i].name,
                (unsigned long long)s->documents, (unsigned long long)s->tokens,
                ps->tokens ? 100.0 * (double)s->tokens / (double)ps->tokens : 0);
        if (wsum > 0)
            fprintf(stderr, "; weight %g asks %.1f%%, got %.1f%% while every input lasted",
                    in->v[i].weight, 100.0 * in->v[i].weight / wsum,
                    mixed ? 100.0 * (double)s->mixed_tokens / (double)mixed : 0);
        fprintf(stderr, ")\n");
    }
    if (wsum > 0 && ps->first_out >= 0 && mixed < ps->tokens)
        fprintf(stderr,
                "  every input lasted for the first %llu tokens (%.1f%%): then %s ran out and the "
                "others went on without it (no input is repeated)\n",
                (unsigned long long)mixed, 100.0 * (double)mixed / (double)ps->tokens,
                in->v[ps->first_out].name);
}

static ms_status prepare(const data_config *dc) {
    if (!dc->out) return ms_error(MS_ERR_ARG, "prepare needs --out DIR");
    /* the shard directory (made if missing), before the inputs are read */
    ms_status st = ms_path_check_writable(dc->out, 1);
    if (st != MS_OK) return ms_error_wrap(st, "--out");
    inputs in;
    st = parse_inputs(&dc->input, &in);
    data_tokenizer *tok = NULL;
    if (st == MS_OK) st = load_tokenizer(dc->tokenizer, dc->data_dir, &tok);
    data_prepare_stats ps;
    if (st == MS_OK) {
        data_prepare_config pc = {.inputs = in.v,
                                  .n_inputs = in.n,
                                  .jsonl_field = dc->jsonl_field,
                                  .jsonl_skip_bad = dc->jsonl_skip_bad,
                                  .tok = tok,
                                  .out_dir = dc->out,
                                  .name = dc->name,
                                  .val_fraction = dc->val_fraction,
                                  .shard_tokens = dc->shard_tokens,
                                  .threads = dc->threads,
                                  .force = dc->force};
        st = data_prepare(&pc, &ps);
    }
    if (st == MS_OK) {
        char text[64] = ""; /* JSONL: the texts are less than the files */
        if (ps.text_bytes != ps.bytes)
            snprintf(text, sizeof text, " (%.1f MB of text)", (double)ps.text_bytes / 1e6);
        fprintf(stderr,
                "prepared %llu document(s), %.1f MB%s -> %llu tokens (%.2f bytes/token; "
                "%llu train, %llu val) in %d shard(s) under %s, %.1fs (%.1f MB/s)\n",
                (unsigned long long)ps.documents, (double)ps.bytes / 1e6, text,
                (unsigned long long)ps.tokens,
                ps.tokens ? (double)ps.text_bytes / (double)ps.tokens : 0,
                (unsigned long long)ps.train_tokens, (unsigned long long)ps.val_tokens, ps.shards,
                dc->out, ps.seconds, (double)ps.bytes / 1e6 / (ps.seconds > 0 ? ps.seconds : 1e-9));
        if (ps.val_tokens)
            fprintf(stderr, "  val: %llu whole document(s)%s, %.2f%% of the tokens\n",
                    (unsigned long long)ps.val_documents,
                    ps.val_cut ? " and the head of the next, cut between two of its tokens" : "",
                    100.0 * (double)ps.val_tokens / (double)ps.tokens);
        if (dc->val_fraction > 0 && !ps.val_tokens && dc->val_fraction * (double)ps.bytes < 1)
            fprintf(stderr,
                    "note: no validation shard was written: --val-fraction %g of %llu byte(s) "
                    "is less than one byte (give more text or a larger --val-fraction; 0 "
                    "asks for none)\n",
                    dc->val_fraction, (unsigned long long)ps.bytes);
        if (!strcmp(dc->tokenizer, "bytes") && ps.documents > 1)
            fprintf(stderr,
                    "note: --tokenizer bytes has no end-of-text id: the %llu documents follow "
                    "each other with nothing between them (a tokenizer file has one)\n",
                    (unsigned long long)ps.documents);
        if (in.n > 1) print_inputs(&in, &ps);
        for (int i = 0; i < in.n; i++)
            if (ps.in[i].skipped)
                fprintf(stderr,
                        "--jsonl-skip-bad: skipped %llu bad line(s) of %s (the first: %s)\n",
                        (unsigned long long)ps.in[i].skipped, in.v[i].name, ps.in[i].first_skipped);
    }
    if (st == MS_OK && ps.leftovers_removed)
        fprintf(stderr, "removed %d staged file(s) of %s that a killed run left in %s\n",
                ps.leftovers_removed, dc->name, dc->out);
    if (st == MS_OK && ps.stale_removed)
        fprintf(stderr, "--force: removed %d old shard(s) of %s that this run did not rewrite\n",
                ps.stale_removed, dc->name);
    data_tok_free(tok);
    free_inputs(&in);
    return st;
}

static void train_progress(void *ctx, int done, int total) {
    double *t0 = ctx;
    fprintf(stderr, "\r[tokenizer-train] %d/%d merges, %.1fs   ", done, total, ms_now() - *t0);
}

/* Every document of the inputs, in order, concatenated (a JSONL file's
 * texts, not its JSON) into *all (malloc'd), and where each ends (*ends,
 * malloc'd, *n_docs of them). */
static ms_status read_documents(const data_config *dc, const inputs *in, char **all, size_t *total,
                                size_t **ends, size_t *n_docs) {
    ms_status st = MS_OK;
    size_t cap_docs = 0;
    *all = NULL;
    *total = 0;
    *ends = NULL;
    *n_docs = 0;
    for (int i = 0; i < in->n && st == MS_OK; i++) {
        if (in->v[i].weight > 0) {
            st = ms_error(MS_ERR_ARG,
                          "--input %s:%g: tokenizer-train reads every input once, without "
                          "weights",
                          in->v[i].name, in->v[i].weight);
            break;
        }
        data_docs *d = NULL;
        st = data_docs_open(&d, in->v[i].paths, in->v[i].n_paths, dc->jsonl_field,
                            dc->jsonl_skip_bad);
        for (;;) {
            const char *text;
            size_t len;
            uint64_t used;
            if (st == MS_OK) st = data_docs_next(d, &text, &len, &used);
            if (st != MS_OK || !text) break;
            char *g = realloc(*all, *total + len + 1);
            if (!g) {
                st = ms_error(MS_ERR_NOMEM, "%s: out of memory", data_docs_path(d));
                break;
            }
            *all = g;
            memcpy(*all + *total, text, len);
            *total += len;
            if (*n_docs == cap_docs) {
                size_t nc = cap_docs ? 2 * cap_docs : 1024;
                size_t *e = realloc(*ends, nc * sizeof *e);
                if (!e) {
                    st = ms_error(MS_ERR_NOMEM, "%s: out of memory", data_docs_path(d));
                    break;
                }
                *ends = e;
                cap_docs = nc;
            }
            (*ends)[(*n_docs)++] = *total;
        }
        data_docs_close(d);
    }
    return st;
}

/* The tokenizer file --out: not one of the inputs, and not an existing file
 * unless --force (checked before the training's minutes). */
static ms_status check_tokenizer_out(const data_config *dc, const inputs *in) {
    struct stat o, sb;
    if (stat(dc->out, &o) != 0 || S_ISDIR(o.st_mode)) { /* a directory: no --force helps */
        ms_status st = ms_path_check_writable(dc->out, 0);
        return st == MS_OK ? MS_OK : ms_error_wrap(st, "--out");
    }
    /* a device or a FIFO: no --force helps (the file renamed over it would replace it) */
    if (!S_ISREG(o.st_mode)) return ms_error_wrap(ms_path_check_replaceable(dc->out), "--out");
    MS_TRY(opts_check_output(data_opts, N_DATA_OPTS, dc, "--out", dc->out, NULL));
    for (int i = 0; i < in->n; i++)
        for (int k = 0; k < in->v[i].n_paths; k++)
            if (stat(in->v[i].paths[k], &sb) == 0 && sb.st_dev == o.st_dev && sb.st_ino == o.st_ino)
                return ms_error(MS_ERR_ARG, "--out %s is the input %s: it would be overwritten",
                                dc->out, in->v[i].paths[k]);
    if (!dc->force)
        return ms_error(MS_ERR_ARG,
                        "--out %s exists: --force 1 replaces it, or choose another "
                        "--out",
                        dc->out);
    ms_status st = ms_path_check_writable(dc->out, 0);
    return st == MS_OK ? MS_OK : ms_error_wrap(st, "--out");
}

static ms_status tokenizer_train(const data_config *dc) {
    if (!dc->out) return ms_error(MS_ERR_ARG, "tokenizer-train needs --out FILE");
    inputs in;
    char *all = NULL;
    size_t total = 0, *ends = NULL, n_docs = 0;
    ms_status st = parse_inputs(&dc->input, &in);
    if (st == MS_OK) st = check_tokenizer_out(dc, &in);
    if (st == MS_OK) st = read_documents(dc, &in, &all, &total, &ends, &n_docs);
    if (st == MS_OK && total == 0) st = ms_error(MS_ERR_FORMAT, "%s: input is empty", in.v[0].name);
    data_tokenizer *tok = NULL;
    double t0 = ms_now();
    if (st == MS_OK)
        st = data_tok_train(all, ends, n_docs, dc->vocab_size, &tok, train_progress, &t0);
    fputc('\n', stderr);
    if (st == MS_OK) st = data_tok_save(tok, dc->out);
    if (st == MS_OK) {
        uint32_t *ids = NULL;
        size_t nid = 0, cap = 0;
        st = data_tok_encode_parallel(tok, all, total, dc->threads, &ids, &nid, &cap);
        if (st == MS_OK)
            fprintf(stderr, "wrote %s: vocabulary %d, %.2f bytes/token on the training text\n",
                    dc->out, data_tok_vocab_size(tok), nid ? (double)total / (double)nid : 0);
        if (st == MS_OK && data_tok_vocab_size(tok) < dc->vocab_size)
            fprintf(stderr,
                    "note: --vocab-size %d asked for %d merges; the text had a pair left to "
                    "merge for %d only (every piece of it one token, or its merge past the "
                    "65535-byte limit of a token), so the vocabulary is %d: a larger text gives "
                    "more\n",
                    dc->vocab_size, dc->vocab_size - 257, data_tok_vocab_size(tok) - 257,
                    data_tok_vocab_size(tok));
        free(ids);
    }
    data_tok_free(tok);
    free(all);
    free(ends);
    free_inputs(&in);
    return st;
}

/* 1 if the valid UTF-8 sequence s[0, k) (k >= 2) is a C1 control (U+0080..U+009F: NEL, CSI
 * for a terminal) or a bidirectional override or isolate (U+202A..U+202E, U+2066..U+2069:
 * they reorder what a terminal shows after them). */
static int invisible_control(const char *s, int k) {
    const unsigned char *u = (const unsigned char *)s;
    unsigned cp = k == 2   ? (u[0] & 0x1fu) << 6 | (u[1] & 0x3fu)
                  : k == 3 ? (u[0] & 0x0fu) << 12 | (u[1] & 0x3fu) << 6 | (u[2] & 0x3fu)
                           : 0x10000;
    return cp < 0xa0 || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

/* s[0, n) as a quoted string's body: valid UTF-8 as it is; control characters (C0, DEL, C1,
 * bidirectional overrides) and the bytes of no valid UTF-8 sequence as \xHH (they went to
 * the terminal raw) */
static void print_bytes(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        /* a sequence's length by its lead byte, so that ms_utf8_len reads within s */
        int need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        int k = c < 0x80 || (size_t)need > n - i ? 0 : ms_utf8_len((const unsigned char *)s + i);
        if (c == '\n') {
            printf("\\n");
        } else if (c == '"' || c == '\\') {
            printf("\\%c", c);
        } else if (c >= 32 && c < 127) {
            putchar(c);
        } else if (k > 1 && !invisible_control(s + i, k)) {
            fwrite(s + i, 1, (size_t)k, stdout);
            i += (size_t)k - 1;
        } else if (k > 1) { /* a control as a code point: its bytes, escaped */
            for (int b = 0; b < k; b++)
                printf("\\x%02x", (unsigned char)s[i + (size_t)b]);
            i += (size_t)k - 1;
        } else {
            printf("\\x%02x", c);
        }
    }
}

static ms_status inspect(const char *path, const data_config *dc) {
    data_shard s;
    MS_TRY(data_shard_open(&s, path));
    printf("%s\n  magic %u%s, version %d (%s tokens), %llu tokens, %zu bytes\n", path, s.magic,
           s.magic == DATA_SHARD_MAGIC_LLAMA3 ? " (llm.c llama-3)" : "", s.version,
           s.token_bytes == 2 ? "uint16" : "uint32", (unsigned long long)s.n_tokens, s.map_len);
    uint32_t maxv = 0;
    for (uint64_t i = 0; i < s.n_tokens; i++) {
        uint32_t t = data_shard_token(&s, i);
        if (t > maxv) maxv = t;
    }
    size_t n = s.n_tokens < (uint64_t)dc->count ? (size_t)s.n_tokens : (size_t)dc->count;
    uint32_t *ids = malloc((n ? n : 1) * sizeof(uint32_t));
    ms_status st = ids ? MS_OK : ms_error(MS_ERR_NOMEM, "out of memory");
    if (s.n_tokens)
        printf("  largest token id %u\n  first %zu tokens:", maxv, n);
    else
        printf("  no tokens:");
    for (size_t i = 0; st == MS_OK && i < n; i++)
        printf(" %u", ids[i] = data_shard_token(&s, i));
    printf("\n");
    /* every id below 256 with the default tokenizer: a bytes shard, or a
     * GPT-2 one of plain ASCII text (a validation shard cut mid-document has
     * no end-of-text): both decodings are shown */
    int both = maxv < 256 && !strcmp(dc->tokenizer, "gpt2");
    for (int pass = 0; pass < 1 + both; pass++) {
        const char *tn = both && pass == 0 ? "bytes" : dc->tokenizer;
        if (st == MS_OK && s.magic == DATA_SHARD_MAGIC_LLAMA3 &&
            (!strcmp(tn, "gpt2") || !strcmp(tn, "bytes"))) { /* its ids are llama-3's */
            printf("  decoded: not shown (a llama-3 shard: --tokenizer FILE with its tokenizer "
                   "shows the text)\n");
            break;
        }
        data_tokenizer *tok = NULL;
        if (st == MS_OK) st = load_tokenizer(tn, dc->data_dir, &tok);
        if (st != MS_OK) break;
        int unknown = 0; /* an id the tokenizer has no bytes for: <|id N|> */
        printf("  decoded (%s%s): \"", tok ? data_tok_name(tok) : "bytes",
               both && pass == 0 ? ", as every id is below 256" : "");
        /* the bytes of a run of known ids printed at once: a character split over tokens
         * (GPT-2's byte-level merges split most emoji and CJK) is whole again */
        char *run = NULL;
        size_t run_len = 0, run_cap = 0;
        for (size_t i = 0; st == MS_OK && i <= n; i++) {
            char *text = NULL, c = i < n ? (char)ids[i] : 0;
            size_t len = 0;
            int known = i < n && (tok ? data_tok_decode(tok, &ids[i], 1, &text, &len) == MS_OK
                                      : ids[i] < 256);
            if (known && !tok) text = &c, len = 1;
            if (known && run_len + len > run_cap) {
                size_t cap = 2 * (run_len + len) + 64;
                char *r = realloc(run, cap);
                if (!r) st = ms_error(MS_ERR_NOMEM, "out of memory");
                if (r) run = r, run_cap = cap;
            }
            if (known && st == MS_OK) {
                memcpy(run + run_len, text, len);
                run_len += len;
            } else if (st == MS_OK) { /* an unknown id, or the end: the run so far first */
                print_bytes(run, run_len);
                run_len = 0;
                if (i < n) printf("<|id %u|>", ids[i]), unknown++;
            }
            if (tok) free(text);
        }
        free(run);
        printf("\"\n");
        if (unknown)
            printf("  ids shown beyond the %s tokenizer's %d: %d (was the shard made with "
                   "another --tokenizer?)\n",
                   tok ? data_tok_name(tok) : "bytes", tok ? data_tok_vocab_size(tok) : 256,
                   unknown);
        data_tok_free(tok);
    }
    free(ids);
    data_shard_close(&s);
    return st;
}

int cmd_data(int argc, char **argv) {
    data_config dc = {0};
    char *pos[2];
    int npos = 0, help = 0, rc = 0;
    ms_status st = opts_parse(data_opts, N_DATA_OPTS, &dc, argc, argv, pos, 2, &npos, &help);
    if (st == MS_OK)
        st = opts_check_dir(data_opts, N_DATA_OPTS, &dc, "data-dir",
                            "the shipped tokenizers: DIR/gpt2.tok");
    const char *sub = npos > 0 ? pos[0] : "";
    if (help || (st == MS_OK && npos == 0)) {
        opts_print_help(
            data_opts, N_DATA_OPTS,
            "usage: megascale data prepare --input TEXT[:WEIGHT] ... --out DIR [--tokenizer gpt2]\n"
            "       megascale data tokenizer-train --input TEXT --vocab-size N --out FILE\n"
            "       megascale data inspect SHARD [--tokenizer gpt2|FILE]");
        rc = help ? 0 : 2;
    } else if (st != MS_OK) {
        rc = cli_fail("data", st);
    } else if (!strcmp(sub, "prepare") && npos == 1) {
        if ((st = prepare(&dc)) != MS_OK) rc = cli_fail("data prepare", st);
    } else if (!strcmp(sub, "tokenizer-train") && npos == 1) {
        if ((st = tokenizer_train(&dc)) != MS_OK) rc = cli_fail("data tokenizer-train", st);
    } else if (!strcmp(sub, "inspect") && npos == 2) {
        if ((st = inspect(pos[1], &dc)) != MS_OK) rc = cli_fail("data inspect", st);
    } else if ((!strcmp(sub, "prepare") || !strcmp(sub, "tokenizer-train")) && npos > 1) {
        /* an unquoted glob (`--input texts/NAME_*`): the shell gave --input the first
         * file and left the others as arguments */
        fprintf(stderr,
                "megascale data %s: error: unexpected argument '%s': inputs are given with "
                "--input; if --input was given a glob, the shell expanded it into several "
                "files: quote the pattern, as in --input 'DIR/*.txt' (or repeat --input)\n",
                sub, pos[1]);
        rc = 2;
    } else {
        fprintf(stderr, "megascale data: error: expected 'prepare', 'tokenizer-train' or "
                        "'inspect SHARD'\n");
        rc = 2;
    }
    opts_free(data_opts, N_DATA_OPTS, &dc);
    return rc;
}
