/* cmd_data.c - `megascale data`: text to token shards, shard inspection.
 *   data prepare --input FILE|GLOB|DIR --tokenizer bytes --out DIR
 *   data inspect SHARD
 * The byte-level tokenizer (one token per byte, vocab 256) is built in; the
 * BPE tokenizers come with the data pipeline. */
#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fileio.h"
#include "base/timeutil.h"
#include "cli/commands.h"
#include "cli/opts.h"
#include "data/shard.h"

typedef struct {
    char *input, *out, *tokenizer, *name;
    double val_fraction;
    int count;
} data_config;

#define O(name, type, field, def, help)                                                            \
    { name, type, offsetof(data_config, field), def, help }
static const opts_spec data_opts[] = {
    O("input", OPT_T_STR, input, NULL, "text file, glob of files, or directory (prepare)"),
    O("out", OPT_T_STR, out, NULL, "output directory for the shards (prepare)"),
    O("tokenizer", OPT_T_STR, tokenizer, "bytes", "tokenizer (prepare): bytes"),
    O("name", OPT_T_STR, name, "data", "shard name prefix: NAME_train_000000.bin (prepare)"),
    O("val-fraction", OPT_T_DOUBLE, val_fraction, "0.01",
      "share of tokens for validation (prepare)"),
    O("count", OPT_T_INT, count, "32", "tokens to show (inspect)"),
};
#define N_DATA_OPTS ((int)(sizeof data_opts / sizeof data_opts[0]))

/* Input files: a directory's regular files (sorted) or a glob. */
static ms_status list_inputs(const char *in, char ***paths, int *n) {
    struct stat sb;
    if (stat(in, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char pat[4200];
        snprintf(pat, sizeof pat, "%s/*", in);
        return ms_glob(pat, paths, n);
    }
    return ms_glob(in, paths, n);
}

/* Write tokens[lo, hi) of a byte buffer as one version-1 shard. */
static ms_status write_shard(const char *path, const unsigned char *buf, size_t lo, size_t hi) {
    data_shard_writer w;
    MS_TRY(data_shard_writer_open(&w, path, 1));
    uint32_t chunk[4096];
    ms_status st = MS_OK;
    for (size_t i = lo; i < hi && st == MS_OK;) {
        size_t k = 0;
        while (k < 4096 && i < hi)
            chunk[k++] = buf[i++];
        st = data_shard_writer_put(&w, chunk, k);
    }
    if (st == MS_OK)
        st = data_shard_writer_commit(&w);
    else
        data_shard_writer_abort(&w);
    return st;
}

static ms_status prepare(const data_config *dc) {
    if (!dc->input || !dc->out) return ms_error(MS_ERR_ARG, "prepare needs --input and --out");
    if (strcmp(dc->tokenizer, "bytes") != 0)
        return ms_error(MS_ERR_ARG, "tokenizer '%s' is not available (built in: bytes)",
                        dc->tokenizer);
    if (!(dc->val_fraction >= 0 && dc->val_fraction < 1))
        return ms_error(MS_ERR_ARG, "--val-fraction must be in [0, 1)");
    char **paths = NULL;
    int n = 0;
    MS_TRY(list_inputs(dc->input, &paths, &n));
    ms_status st = ms_mkdirs(dc->out);
    unsigned char *all = NULL;
    size_t total = 0;
    double t0 = ms_now();
    for (int i = 0; i < n && st == MS_OK; i++) {
        char *text = NULL;
        size_t len = 0;
        st = ms_file_read_all(paths[i], &text, &len);
        if (st != MS_OK) break;
        unsigned char *grown = realloc(all, total + len + 1);
        if (!grown) {
            free(text);
            st = ms_error(MS_ERR_NOMEM, "%s: out of memory", paths[i]);
            break;
        }
        all = grown;
        memcpy(all + total, text, len);
        total += len;
        free(text);
        fprintf(stderr, "\rread %d/%d files, %.1f MB", i + 1, n, (double)total / 1e6);
    }
    fprintf(stderr, "\n");
    if (st == MS_OK && total < 2) st = ms_error(MS_ERR_FORMAT, "%s: input is empty", dc->input);
    if (st == MS_OK) {
        size_t nval = (size_t)((double)total * dc->val_fraction);
        char path[4300];
        snprintf(path, sizeof path, "%s/%s_val_000000.bin", dc->out, dc->name);
        if (nval >= 2) st = write_shard(path, all, 0, nval);
        snprintf(path, sizeof path, "%s/%s_train_000000.bin", dc->out, dc->name);
        if (st == MS_OK) st = write_shard(path, all, nval, total);
        if (st == MS_OK)
            fprintf(stderr, "prepared %zu tokens (%zu train, %zu val) in %s in %.1fs\n", total,
                    total - nval, nval, dc->out, ms_now() - t0);
    }
    free(all);
    ms_paths_free(paths, n);
    return st;
}

static ms_status inspect(const char *path, int count) {
    data_shard s;
    MS_TRY(data_shard_open(&s, path));
    printf("%s\n  magic %d, version %d (%s tokens), %llu tokens, %zu bytes\n", path,
           DATA_SHARD_MAGIC, s.version, s.version == 1 ? "uint16" : "uint32",
           (unsigned long long)s.n_tokens, s.map_len);
    uint32_t maxv = 0;
    for (uint64_t i = 0; i < s.n_tokens; i++) {
        uint32_t t = data_shard_token(&s, i);
        if (t > maxv) maxv = t;
    }
    printf("  largest token id %u\n  first tokens:", maxv);
    for (uint64_t i = 0; i < s.n_tokens && i < (uint64_t)count; i++)
        printf(" %u", data_shard_token(&s, i));
    printf("\n");
    if (maxv < 256) {
        printf("  as bytes: \"");
        for (uint64_t i = 0; i < s.n_tokens && i < (uint64_t)count; i++) {
            int c = (int)data_shard_token(&s, i);
            if (c == '\n')
                printf("\\n");
            else if (c >= 32 && c < 127)
                putchar(c);
            else
                printf("\\x%02x", c);
        }
        printf("\"\n");
    }
    data_shard_close(&s);
    return MS_OK;
}

int cmd_data(int argc, char **argv) {
    data_config dc = {0};
    char *pos[2];
    int npos = 0, help = 0, rc = 0;
    ms_status st = opts_parse(data_opts, N_DATA_OPTS, &dc, argc, argv, pos, 2, &npos, &help);
    if (help || (st == MS_OK && npos == 0)) {
        opts_print_help(data_opts, N_DATA_OPTS,
                        "usage: megascale data prepare --input TEXT --out DIR [options]\n"
                        "       megascale data inspect SHARD");
        rc = help ? 0 : 2;
    } else if (st != MS_OK) {
        rc = cli_fail("data", st);
    } else if (!strcmp(pos[0], "prepare") && npos == 1) {
        if ((st = prepare(&dc)) != MS_OK) rc = cli_fail("data prepare", st);
    } else if (!strcmp(pos[0], "inspect") && npos == 2) {
        if ((st = inspect(pos[1], dc.count)) != MS_OK) rc = cli_fail("data inspect", st);
    } else {
        fprintf(stderr, "megascale data: error: expected 'prepare' or 'inspect SHARD'\n");
        rc = 2;
    }
    opts_free(data_opts, N_DATA_OPTS, &dc);
    return rc;
}
