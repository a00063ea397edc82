/* fuzz_tokenizer.c - libFuzzer harness of the tokenizer file reader
 * (src/data/tokenizer.c, data_tok_load; data/gpt2.tok's format), and of
 * encode/decode with the vocabulary and pattern a file brings.
 *
 * Each input is loaded twice: as it is, and with its header's file size and
 * both CRC32Cs made right (so that the fuzzer gets past the checksums to the
 * sections behind them).  The reader must reject a file with a status or
 * accept it; never crash or leak.  With a tokenizer it accepts, decode(encode(x))
 * is x for x = the input's first bytes and a fixed text (tokenizer.h's
 * promise for any bytes), every id is below the vocabulary size, and an id
 * at the vocabulary size is MS_ERR_RANGE.  Encoding may fail only where the
 * file's pattern runs into PCRE2's match or stack limit (MS_ERR_INTERNAL).
 */
#include <string.h>

#include "base/crc32c.h"
#include "data/tokenizer.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_init("fuzz_tokenizer");
    return 0;
}

static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void check_codec(const data_tokenizer *t, const char *text, size_t len) {
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0, out_len = 0;
    char *out = NULL;
    uint32_t vocab = (uint32_t)data_tok_vocab_size(t);
    ms_status rc = data_tok_encode(t, text, len, &ids, &n, &cap);
    if (rc != MS_OK) { /* the file's pattern hit PCRE2's match or stack limit */
        MS_CHECKF(rc == MS_ERR_INTERNAL || rc == MS_ERR_NOMEM, "encode: %s: %s", ms_status_name(rc),
                  ms_errmsg());
        free(ids);
        return;
    }
    for (size_t i = 0; i < n; i++)
        MS_CHECK(ids[i] < vocab);
    MS_CHECKF(data_tok_decode(t, ids, n, &out, &out_len) == MS_OK, "%s", ms_errmsg());
    MS_CHECKF(out_len == len && memcmp(out, text, len) == 0 && out[len] == 0,
              "decode(encode(x)) != x (%zu bytes, %zu ids, %zu bytes back)", len, n, out_len);
    free(out);
    out = NULL;
    MS_CHECK(data_tok_decode(t, &vocab, 1, &out, &out_len) == MS_ERR_RANGE);
    free(out);
    free(ids);
}

static void load(const uint8_t *data, size_t size) {
    static const char text[] =
        "Hello, world!\n  \t 12345 <|endoftext|> caf\xc3\xa9 \xf0\x9f\x98\x80"
        " \xff\xfe\xc0\x80 \xed\xa0\x80 's 're\r\n";
    data_tokenizer *t = NULL;
    ms_status rc = data_tok_load(&t, fuzz_file("in.tok", data, size), NULL);
    fuzz_said("tokenizer", rc);
    if (rc != MS_OK) {
        MS_CHECKF(t == NULL && (rc == MS_ERR_FORMAT || rc == MS_ERR_NOMEM),
                  "unexpected status %s: %s", ms_status_name(rc), ms_errmsg());
        return;
    }
    MS_CHECK(data_tok_vocab_size(t) >= 256 && data_tok_name(t));
    MS_CHECK(data_tok_eot(t) == -1 || data_tok_eot(t) < data_tok_vocab_size(t));
    check_codec(t, text, sizeof text - 1);
    check_codec(t, (const char *)data, size < 512 ? size : 512);
    data_tok_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load(data, size);
    if (size < 64) return 0;
    uint8_t *fixed = malloc(size);
    MS_CHECK(fixed != NULL);
    memcpy(fixed, data, size);
    wr32(fixed + 48, (uint32_t)size); /* u64 file_size */
    wr32(fixed + 52, (uint32_t)((uint64_t)size >> 32));
    wr32(fixed + 56, ms_crc32c(0, fixed + 64, size - 64));
    wr32(fixed + 60, ms_crc32c(0, fixed, 60));
    load(fixed, size);
    free(fixed);
    return 0;
}
