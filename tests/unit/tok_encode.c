/* tok_encode.c - encode a file with a tokenizer; helper of the js-tiktoken
 * parity test (tests/node/parity.sh) and of bench/tokenize.
 *
 *   tok_encode [--tok gpt2|FILE] [--threads N] IN OUT
 *       writes the ids of IN to OUT as little-endian uint32 (serial encode,
 *       or data_tok_encode_parallel with N > 1 threads)
 *   tok_encode --bench [--tok gpt2|FILE] [--reps R] [--threads N] IN
 *       times the serial encode and the N-thread parallel encode of IN (best
 *       of R runs each) and prints "key value" lines: bytes, tokens,
 *       serial_mbps, parallel_mbps, threads, same_ids (1 if both agree).
 *   tok_encode --train VOCAB IN OUT
 *       learns a VOCAB-id tokenizer from IN (data_tok_train), saves it to OUT
 *       and prints "train_seconds S" and "bytes_per_token B" (on IN).
 *   tok_encode --classes
 *       prints GPT-2's character classes (tokenizer_gpt2.c): "unicode V",
 *       then "FIRST LAST C" (hex code points, C: L, N or S) for each maximal
 *       range of one class; code points in none are the "other" class.  The
 *       parity test compares them with node's \p{L}, \p{N}, \p{White_Space}.
 * Exit status 0, or 1 with the error on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/timeutil.h"
#include "data/tokenizer.h"
#include "data/tokenizer_internal.h"

static int fail(const char *what) {
    fprintf(stderr, "tok_encode: %s: %s\n", what, ms_errmsg());
    return 1;
}

static int bench(const data_tokenizer *t, const char *text, size_t len, int reps, int threads) {
    uint32_t *a = NULL, *b = NULL;
    size_t na = 0, ca = 0, nb = 0, cb = 0;
    double best1 = 1e30, bestp = 1e30;
    for (int r = 0; r < reps; r++) {
        na = 0;
        double t0 = ms_now();
        if (data_tok_encode(t, text, len, &a, &na, &ca) != MS_OK) return fail("encode");
        double t1 = ms_now();
        nb = 0;
        if (data_tok_encode_parallel(t, text, len, threads, &b, &nb, &cb) != MS_OK)
            return fail("encode_parallel");
        double t2 = ms_now();
        if (t1 - t0 < best1) best1 = t1 - t0;
        if (t2 - t1 < bestp) bestp = t2 - t1;
    }
    int same = na == nb && memcmp(a, b, na * sizeof *a) == 0;
    printf("bytes %zu\ntokens %zu\nbytes_per_token %.3f\nserial_mbps %.2f\nparallel_mbps %.2f\n"
           "threads %d\nsame_ids %d\n",
           len, na, (double)len / (double)(na ? na : 1), len / best1 / 1e6, len / bestp / 1e6,
           threads, same);
    free(a);
    free(b);
    return same ? 0 : 1;
}

static int train(const char *in, const char *out, int vocab) {
    char *text = NULL;
    size_t len, n = 0, cap = 0;
    uint32_t *ids = NULL;
    data_tokenizer *t = NULL;
    int rc = 1;
    if (ms_file_read_all(in, &text, &len) != MS_OK) return fail("read");
    double t0 = ms_now();
    if (data_tok_train(text, &len, 1, vocab, &t, NULL, NULL) != MS_OK) {
        rc = fail("train");
        goto out;
    }
    double dt = ms_now() - t0;
    if (data_tok_save(t, out) != MS_OK || data_tok_encode(t, text, len, &ids, &n, &cap) != MS_OK) {
        rc = fail(out);
        goto out;
    }
    printf("train_seconds %.3f\nvocab %d\nbytes_per_token %.3f\n", dt, data_tok_vocab_size(t),
           (double)len / (double)(n ? n : 1));
    rc = 0;
out:
    free(ids);
    free(text);
    data_tok_free(t);
    return rc;
}

static int classes(void) {
    printf("unicode %s\n", tok_unicode_version());
    uint32_t first = 0;
    int k = tok_uclass(0);
    for (uint32_t c = 1; c <= 0x110000; c++) {
        int kc = c < 0x110000 ? tok_uclass(c) : -1;
        if (kc == k) continue;
        if (k != TOK_U_OTHER) printf("%x %x %c\n", first, c - 1, k);
        first = c;
        k = kc;
    }
    return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--classes")) return classes();
    const char *tok = "gpt2", *in = NULL, *out = NULL;
    int threads = 1, reps = 3, do_bench = 0, rc = 1, vocab = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tok") && i + 1 < argc)
            tok = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--train") && i + 1 < argc)
            vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bench"))
            do_bench = 1;
        else if (!in)
            in = argv[i];
        else if (!out)
            out = argv[i];
        else
            in = NULL, i = argc;
    }
    if (!in || (!do_bench && !out) || reps < 1 || threads < 1) {
        fprintf(stderr, "usage: tok_encode [--tok gpt2|FILE] [--threads N] IN OUT\n"
                        "       tok_encode --bench [--tok gpt2|FILE] [--reps R] [--threads N] IN\n"
                        "       tok_encode --train VOCAB IN OUT\n"
                        "       tok_encode --classes\n");
        return 2;
    }
    if (vocab) return train(in, out, vocab);
    data_tokenizer *t = NULL;
    char *text = NULL;
    size_t len;
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    /* "gpt2" from $MS_DATA_DIR, as megascale --data-dir would (NULL: compiled in) */
    if (data_tok_load(&t, tok, getenv("MS_DATA_DIR")) != MS_OK) return fail("load");
    if (ms_file_read_all(in, &text, &len) != MS_OK) {
        rc = fail("read");
        goto out;
    }
    if (do_bench) {
        rc = bench(t, text, len, reps, threads);
        goto out;
    }
    ms_status s = threads > 1 ? data_tok_encode_parallel(t, text, len, threads, &ids, &n, &cap)
                              : data_tok_encode(t, text, len, &ids, &n, &cap);
    if (s != MS_OK) {
        rc = fail("encode");
        goto out;
    }
    /* ids are written in host order; the test machines are little-endian. */
    if (ms_file_write_atomic(out, ids, n * sizeof *ids) != MS_OK) {
        rc = fail("write");
        goto out;
    }
    fprintf(stderr, "tok_encode: %s: %zu bytes -> %zu tokens (%s)\n", in, len, n, data_tok_name(t));
    rc = 0;
out:
    free(ids);
    free(text);
    data_tok_free(t);
    return rc;
}
