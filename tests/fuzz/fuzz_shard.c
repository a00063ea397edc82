/* fuzz_shard.c - libFuzzer harness of the token shard reader
 * (src/data/shard.c, data_shard_open / data_shard_read): llm.c's format,
 * versions 1 (uint16 tokens) and 2 (uint32), and its llama-3 shards
 * (magic 20240801, version 7, uint32).
 *
 * The input is the shard.  The reader must reject it with a status or
 * accept it; never crash or read outside the file.  On a shard it accepts,
 * its size is the header's, every token reads back as the file holds it,
 * a token >= the vocabulary and a read past the end are MS_ERR_RANGE.
 */
#include <string.h>

#include "data/shard.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_init("fuzz_shard");
    return 0;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t token_at(const uint8_t *data, size_t tsize, uint64_t i) {
    const uint8_t *p = data + 4 * DATA_SHARD_HEADER_INTS + i * tsize;
    return tsize == 2 ? (uint32_t)(p[0] | p[1] << 8) : le32(p);
}

/* The largest vocabulary (INT32_MAX ids): a token >= INT32_MAX is out of
 * range for every vocabulary. */
static void check_shard(const data_shard *s, const uint8_t *data, size_t size) {
    size_t tsize = s->version == 1 ? 2 : 4;
    int32_t buf[256];
    uint32_t max = 0;
    uint64_t at = 0; /* where max is first */
    uint32_t magic = le32(data);
    MS_CHECK(s->magic == magic);
    MS_CHECK(magic == DATA_SHARD_MAGIC
                 ? s->version == 1 || s->version == 2
                 : magic == DATA_SHARD_MAGIC_LLAMA3 && s->version == DATA_SHARD_VERSION_LLAMA3);
    MS_CHECK(s->map_len == size && size == 4 * DATA_SHARD_HEADER_INTS + s->n_tokens * tsize);
    for (uint64_t pos = 0; pos < s->n_tokens;) {
        size_t n = s->n_tokens - pos < 256 ? (size_t)(s->n_tokens - pos) : 256, k = 0;
        while (k < n && token_at(data, tsize, pos + k) < INT32_MAX)
            k++;
        if (k < n) /* token pos + k is out of range */
            MS_CHECK(data_shard_read(s, pos, n, buf, INT32_MAX) == MS_ERR_RANGE);
        MS_CHECKF(data_shard_read(s, pos, k, buf, INT32_MAX) == MS_OK, "%s", ms_errmsg());
        for (size_t i = 0; i < n; i++) {
            uint32_t want = token_at(data, tsize, pos + i);
            if (i < k) MS_CHECK((uint32_t)buf[i] == want);
            if (want > max) max = want, at = pos + i;
        }
        pos += n;
    }
    if (max > 0) /* the largest token is out of a vocabulary of max ids */
        MS_CHECK(data_shard_read(s, at, 1, buf, max < INT32_MAX ? (int)max : INT32_MAX) ==
                 MS_ERR_RANGE);
    MS_CHECK(data_shard_read(s, s->n_tokens, 1, buf, 1 << 20) == MS_ERR_RANGE);
    MS_CHECK(data_shard_read(s, s->n_tokens, 0, buf, 1 << 20) == MS_OK);
    MS_CHECK(data_shard_read(s, 0, 1, buf, 0) == MS_ERR_ARG);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    data_shard s;
    ms_status rc = data_shard_open(&s, fuzz_file("in.bin", data, size));
    fuzz_said("shard", rc);
    if (rc != MS_OK) {
        MS_CHECKF(rc == MS_ERR_FORMAT, "unexpected status %s: %s", ms_status_name(rc), ms_errmsg());
        MS_CHECK(s.map == NULL);
        return 0;
    }
    check_shard(&s, data, size);
    data_shard_close(&s);
    return 0;
}
