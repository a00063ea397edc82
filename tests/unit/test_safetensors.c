/* test_safetensors.c - safetensors writer/reader round trip, layout
 * (8-aligned data section, gap-free, reference-compatible), writer argument
 * checks, and hand-made corrupt files that must each fail with
 * MS_ERR_FORMAT and a message naming the file (and the tensor). */
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/timeutil.h"
#include "check.h"
#include "tmpdir.h"
#include "ckpt/safetensors.h"

/* Write a safetensors-like file: header length `hlen` (use -1 for the
 * length of json), the json text, then `ndata` bytes of data. */
static void write_st(const char *p, int64_t hlen, const char *json, size_t ndata) {
    FILE *f = fopen(p, "wb");
    uint64_t n = hlen < 0 ? strlen(json) : (uint64_t)hlen;
    uint8_t le[8];
    for (int k = 0; k < 8; k++)
        le[k] = (uint8_t)(n >> (8 * k));
    fwrite(le, 1, 8, f);
    fwrite(json, 1, strlen(json), f);
    for (size_t i = 0; i < ndata; i++)
        fputc((int)(i & 0xFF), f);
    fclose(f);
}

static void test_round_trip(void) {
    float f32[6] = {1.5f, -2.25f, 3.0f, 0.0f, -0.0f, 1e30f};
    uint16_t bf16[5] = {0x3F80, 0x4000, 0xBF80, 0x0000, 0x7F80};
    uint8_t u8[3] = {1, 2, 255};
    int64_t i64[2] = {INT64_MIN, 1234567890123ll};
    int32_t scalar = -77;
    uint16_t f16[1] = {0};
    const int64_t s23[2] = {2, 3}, s5[1] = {5}, s3[1] = {3}, s2[1] = {2}, s04[2] = {0, 4};
    const char *names[6] = {"w.f32", "bf16", "bytes", "steps", "scalar", "empty"};
    const char *p = tpath("rt.safetensors");
    ckpt_st_writer *w = ckpt_st_writer_create();
    ckpt_st_file *f = NULL;

    T_OK(w != NULL);
    T_EQ_INT(ckpt_st_writer_add(w, names[0], CKPT_ST_F32, 2, s23, f32), MS_OK);
    T_EQ_INT(ckpt_st_writer_add(w, names[1], CKPT_ST_BF16, 1, s5, bf16), MS_OK);
    T_EQ_INT(ckpt_st_writer_add(w, names[2], CKPT_ST_U8, 1, s3, u8), MS_OK);
    T_EQ_INT(ckpt_st_writer_add(w, names[3], CKPT_ST_I64, 1, s2, i64), MS_OK);
    T_EQ_INT(ckpt_st_writer_add(w, names[4], CKPT_ST_I32, 0, NULL, &scalar), MS_OK);
    T_EQ_INT(ckpt_st_writer_add(w, names[5], CKPT_ST_F16, 2, s04, f16), MS_OK);
    T_EQ_INT(ckpt_st_writer_meta(w, "format", "pt"), MS_OK);
    T_EQ_INT(ckpt_st_writer_meta(w, "step", "1"), MS_OK);
    T_EQ_INT(ckpt_st_writer_meta(w, "step", "1234"), MS_OK); /* last value wins */
    T_EQ_INT(ckpt_st_write(w, p), MS_OK);
    ckpt_st_writer_destroy(w);

    T_EQ_INT(ckpt_st_open(&f, p), MS_OK);
    if (!f) return;
    T_OK(strcmp(ckpt_st_path(f), p) == 0);
    T_EQ_INT(ckpt_st_count(f), 6);
    const void *want[6] = {f32, bf16, u8, i64, &scalar, f16};
    const size_t nbytes[6] = {24, 10, 3, 16, 4, 0};
    const int ndim[6] = {2, 1, 1, 1, 0, 2};
    const ckpt_st_dtype dt[6] = {CKPT_ST_F32, CKPT_ST_BF16, CKPT_ST_U8,
                                 CKPT_ST_I64, CKPT_ST_I32,  CKPT_ST_F16};
    for (int i = 0; i < 6 && i < ckpt_st_count(f); i++) {
        const ckpt_st_tensor *t = ckpt_st_get(f, i);
        T_OK(strcmp(t->name, names[i]) == 0); /* insertion order */
        T_EQ_INT(t->dtype, dt[i]);
        T_EQ_INT(t->ndim, ndim[i]);
        T_EQ_INT(t->nbytes, nbytes[i]);
        T_OK(nbytes[i] == 0 || memcmp(t->data, want[i], nbytes[i]) == 0);
        T_EQ_INT((uintptr_t)t->data % ckpt_st_dtype_size(t->dtype), 0); /* aligned */
        T_OK(ckpt_st_find(f, names[i]) == t);
    }
    const ckpt_st_tensor *t = ckpt_st_find(f, "w.f32");
    T_OK(t && t->shape[0] == 2 && t->shape[1] == 3);
    t = ckpt_st_find(f, "empty");
    T_OK(t && t->shape[0] == 0 && t->shape[1] == 4);
    T_OK(ckpt_st_find(f, "nope") == NULL);
    T_OK(ckpt_st_find(f, "__metadata__") == NULL);
    T_OK(ckpt_st_meta(f, "format") && strcmp(ckpt_st_meta(f, "format"), "pt") == 0);
    T_OK(ckpt_st_meta(f, "step") && strcmp(ckpt_st_meta(f, "step"), "1234") == 0);
    T_OK(ckpt_st_meta(f, "missing") == NULL);
    ckpt_st_close(f);
}

/* The layout the reference reader requires: data section 8-aligned (header
 * padded with spaces), tensors gap-free and covering the data section. */
static void test_layout(void) {
    const char *p = tpath("rt.safetensors");
    char *data = NULL;
    size_t len = 0;
    uint64_t hlen = 0;
    T_EQ_INT(ms_file_read_all(p, &data, &len), MS_OK);
    if (!data || len < 8) return;
    for (int k = 7; k >= 0; k--)
        hlen = hlen << 8 | (uint8_t)data[k];
    T_EQ_INT((8 + hlen) % 8, 0);
    T_EQ_INT(data[8], '{');
    T_OK(hlen <= len - 8);
    T_OK(strstr(data + 8, "\"__metadata__\":{\"format\":\"pt\",\"step\":\"1234\"}") != NULL);
    T_OK(strstr(data + 8, "\"shape\":[]") != NULL); /* the 0-d scalar */
    /* total data = 24 + 10 + 3 + 16 + 4 + 0 bytes, no gaps */
    T_EQ_INT(len - 8 - hlen, 57);
    /* 8-byte I64 first, then the 4-byte ones in insertion order */
    T_OK(strstr(data + 8, "\"steps\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}"));
    T_OK(
        strstr(data + 8, "\"w.f32\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[16,40]}"));
    T_OK(strstr(data + 8, "\"scalar\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[40,44]}"));
    free(data);
}

static void test_writer_errors(void) {
    ckpt_st_writer *w = ckpt_st_writer_create();
    const int64_t neg[2] = {2, -1}, big[3] = {INT64_MAX, INT64_MAX, 4};
    float x[4] = {0};
    ckpt_st_file *f = NULL;
    T_EQ_INT(ckpt_st_writer_add(w, "a", CKPT_ST_F32, 1, (int64_t[]){4}, x), MS_OK);
    T_EQ_INT(ckpt_st_writer_add(w, "a", CKPT_ST_F32, 1, (int64_t[]){4}, x), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "duplicate tensor \"a\"");
    T_EQ_INT(ckpt_st_writer_add(w, "n", CKPT_ST_F32, 2, neg, x), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "\"n\": negative dimension -1");
    T_EQ_INT(ckpt_st_writer_add(w, "o", CKPT_ST_F32, 3, big, x), MS_ERR_ARG);
    T_EQ_INT(ckpt_st_writer_add(w, "__metadata__", CKPT_ST_F32, 1, (int64_t[]){4}, x), MS_ERR_ARG);
    T_EQ_INT(ckpt_st_writer_add(w, "", CKPT_ST_F32, 1, (int64_t[]){4}, x), MS_ERR_ARG);
    T_EQ_INT(ckpt_st_writer_add(w, "d", (ckpt_st_dtype)42, 1, (int64_t[]){4}, x), MS_ERR_ARG);
    T_EQ_INT(ckpt_st_writer_add(w, "m", CKPT_ST_F32, 9, big, x), MS_ERR_ARG);
    T_EQ_INT(ckpt_st_writer_add(w, "z", CKPT_ST_F32, 1, (int64_t[]){4}, NULL), MS_ERR_ARG);
    /* a failed write leaves nothing behind */
    T_EQ_INT(ckpt_st_write(w, tpath("nodir/x.safetensors")), MS_ERR_IO);
    T_STR_CONTAINS(ms_errmsg(), "nodir/x.safetensors");
    T_OK(access(tpath("nodir"), F_OK) != 0);
    ckpt_st_writer_destroy(w);

    /* an empty writer makes a valid empty file */
    w = ckpt_st_writer_create();
    T_EQ_INT(ckpt_st_write(w, tpath("empty.safetensors")), MS_OK);
    ckpt_st_writer_destroy(w);
    T_EQ_INT(ckpt_st_open(&f, tpath("empty.safetensors")), MS_OK);
    if (f) T_EQ_INT(ckpt_st_count(f), 0);
    ckpt_st_close(f);
}

/* Files from other writers: the reference implementation's doc example and
 * an unpadded header with tensors out of header order (and an empty one)
 * are accepted; a hole in the data section, or bytes after the last
 * tensor, are not (the reference loader's rule: every byte a tensor's;
 * before, both were taken, an appended-to file as good). */
static void expect_bad(const char *name, int64_t hlen, const char *json, size_t ndata,
                       const char *what);

static void test_foreign_files(void) {
    ckpt_st_file *f = NULL;
    write_st(tpath("ref.safetensors"), -1,
             "{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16);
    T_EQ_INT(ckpt_st_open(&f, tpath("ref.safetensors")), MS_OK);
    if (f) {
        const ckpt_st_tensor *t = ckpt_st_find(f, "test");
        T_OK(t && t->nbytes == 16 && ((const uint8_t *)t->data)[15] == 15);
        ckpt_st_close(f);
    }
    write_st(tpath("order.safetensors"), -1,
             "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]},"
             "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
             "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,1]}}  ",
             5);
    T_EQ_INT(ckpt_st_open(&f, tpath("order.safetensors")), MS_OK);
    if (f) {
        T_EQ_INT(ckpt_st_count(f), 3);
        T_OK(strcmp(ckpt_st_get(f, 0)->name, "b") == 0); /* header order */
        T_EQ_INT(((const uint8_t *)ckpt_st_find(f, "b")->data)[0], 3);
        ckpt_st_close(f);
    }
    static const char *const gap =
        "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[8,10]},"
        "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}";
    expect_bad("gap.safetensors", -1, gap, 10,
               "data bytes [3, 8) belong to no tensor (before \"b\")");
    expect_bad("trail.safetensors", -1,
               "{\"a\":{\"dtype\":\"U8\",\"shape\":[3],"
               "\"data_offsets\":[0,3]}}",
               103,
               "100 byte(s) after the last tensor's data (the data section is 103 bytes, the "
               "tensors end at 3)");
}

/* One corrupt file: open must fail with MS_ERR_FORMAT, name the file and
 * contain `what` (and the tensor, when `what` includes it). */
static void expect_bad(const char *name, int64_t hlen, const char *json, size_t ndata,
                       const char *what) {
    ckpt_st_file *f = (ckpt_st_file *)1;
    write_st(tpath(name), hlen, json, ndata);
    ms_status rc = ckpt_st_open(&f, tpath(name));
    T_EQ_INT(rc, MS_ERR_FORMAT);
    T_OK(f == NULL);
    T_STR_CONTAINS(ms_errmsg(), name);
    T_STR_CONTAINS(ms_errmsg(), what);
    if (rc != MS_ERR_FORMAT) fprintf(stderr, "  (case %s)\n", name);
}

static void test_corrupt(void) {
    const char *ok_a = "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    char json[512];
    FILE *fp = fopen(tpath("tiny.safetensors"), "wb");
    ckpt_st_file *f = NULL;
    fwrite("\x05\0\0\0\0", 1, 5, fp);
    fclose(fp);
    T_EQ_INT(ckpt_st_open(&f, tpath("tiny.safetensors")), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "tiny.safetensors: file is 5 bytes, shorter than the 8-byte");
    fclose(fopen(tpath("zero.safetensors"), "wb"));
    T_EQ_INT(ckpt_st_open(&f, tpath("zero.safetensors")), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "zero.safetensors");
    T_EQ_INT(ckpt_st_open(&f, tpath("missing.safetensors")), MS_ERR_NOTFOUND);
    T_STR_CONTAINS(ms_errmsg(), "missing.safetensors");

    expect_bad("hlen_past_end.st", 1000, "{}", 0, "runs past the end of the file");
    expect_bad("hlen_huge.st", 200000000, "{}", 0,
               "hlen_huge.st: not a safetensors file: its first 8 bytes, the header length, read "
               "more than the 100000000-byte limit");
    /* no safetensors file at all: what it looks like, not its "header length" */
    expect_bad("hlen_past_end_no_json.st", 1000, "xy", 0,
               "not a safetensors file: its header length runs past the end of the file, and no "
               "JSON header follows it");
    const int32_t shard[4] = {20240520, 1, 2, 0}; /* a token shard's header (data/shard.h) */
    fp = fopen(tpath("shard.bin"), "wb");
    fwrite(shard, sizeof shard, 1, fp);
    fclose(fp);
    T_EQ_INT(ckpt_st_open(&f, tpath("shard.bin")), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "shard.bin: not a safetensors file: it is a token shard (magic "
                                "20240520), not weights");
    fp = fopen(tpath("words.txt"), "wb");
    fputs("some words, not weights\n", fp);
    fclose(fp);
    T_EQ_INT(ckpt_st_open(&f, tpath("words.txt")), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "words.txt: not a safetensors file: it looks like a text file");
    expect_bad("bad_json.st", -1, "{\"a\": {\"dtype\": ", 0, "not valid JSON");
    expect_bad("trailing.st", -1, "{} x", 0, "not valid JSON");
    expect_bad("not_object.st", -1, "[1, 2]", 0, "not a JSON object");
    fp = fopen(tpath("nul.st"), "wb");
    fwrite("\x04\0\0\0\0\0\0\0{}\0 ", 1, 12, fp);
    fclose(fp);
    T_EQ_INT(ckpt_st_open(&f, tpath("nul.st")), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "nul.st: header contains a NUL byte");
    expect_bad("entry_not_obj.st", -1, "{\"t1\": 3}", 0, "\"t1\": entry is not a JSON object");
    expect_bad("no_dtype.st", -1, "{\"t1\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "\"t1\": missing \"dtype\"");
    expect_bad("no_shape.st", -1, "{\"t1\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8,
               "\"t1\": missing \"shape\"");
    expect_bad("no_offsets.st", -1, "{\"t1\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8,
               "\"t1\": missing \"data_offsets\"");
    expect_bad("bad_dtype.st", -1,
               "{\"t1\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 8,
               "\"t1\": unknown dtype \"F8_E4M3\"");
    expect_bad("dtype_num.st", -1, "{\"t1\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "\"t1\": \"dtype\" is not a string");
    expect_bad("neg_dim.st", -1,
               "{\"t1\":{\"dtype\":\"F32\",\"shape\":[-1,2],\"data_offsets\":[0,8]}}", 8,
               "\"t1\": negative dimension -1");
    expect_bad("frac_dim.st", -1,
               "{\"t1\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 8,
               "\"t1\": shape entry 0 is not an integer");
    expect_bad("many_dims.st", -1,
               "{\"t1\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
               8, "\"t1\": 9 dimensions");
    expect_bad("size.st", -1,
               "{\"t1\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 16,
               "\"t1\": shape has 4 elements of F32 (16 bytes) but data_offsets span 12 bytes");
    expect_bad("past_data.st", -1,
               "{\"t1\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
               "\"t1\": data_offsets [0, 16] beyond the data section (8 bytes)");
    expect_bad("backwards.st", -1,
               "{\"t1\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,2]}}", 8,
               "\"t1\": data_offsets [4, 2] end before begin");
    expect_bad("offs_shape.st", -1,
               "{\"t1\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0]}}", 8,
               "\"t1\": \"data_offsets\" is not [begin, end]");
    expect_bad("offs_neg.st", -1,
               "{\"t1\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[-2,0]}}", 8,
               "\"t1\": \"data_offsets\" is not [begin, end]");
    snprintf(json, sizeof json,
             "{%s,\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", ok_a);
    expect_bad("overlap.st", -1, json, 16, "tensors \"a\" [0, 8) and \"b\" [4, 12) overlap");
    snprintf(json, sizeof json, "{%s,%s}", ok_a, ok_a);
    expect_bad("dup.st", -1, json, 8, "duplicate tensor \"a\"");
    snprintf(json, sizeof json, "{\"__metadata__\":{\"k\":1},%s}", ok_a);
    expect_bad("meta_num.st", -1, json, 8, "\"__metadata__\" value for key \"k\" is not a string");
    snprintf(json, sizeof json, "{\"__metadata__\":[\"k\"],%s}", ok_a);
    expect_bad("meta_arr.st", -1, json, 8, "\"__metadata__\" is not a JSON object");
}

/* A good file cut short: the last tensor's span leaves the data section. */
/* Issue 13, defect 7: a header with many metadata keys must not take
 * quadratic time (the duplicate check was O(n^2): 200k keys, minutes),
 * and a duplicate among them is still found, by name. */
static void test_many_meta_keys(void) {
    enum { N = 100000 };
    size_t cap = (size_t)N * 24 + 256, len = 0;
    char *json = malloc(cap);
    T_OK(json != NULL);
    if (!json) return;
    len += (size_t)snprintf(json + len, cap - len, "{\"__metadata__\":{");
    for (int i = 0; i < N; i++)
        len += (size_t)snprintf(json + len, cap - len, "%s\"k%d\":\"v\"", i ? "," : "", i);
    snprintf(json + len, cap - len,
             "},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}");
    write_st(tpath("meta.safetensors"), -1, json, 8);
    ckpt_st_file *f = NULL;
    double t0 = ms_now();
    T_EQ_INT(ckpt_st_open(&f, tpath("meta.safetensors")), MS_OK);
    double took = ms_now() - t0;
    T_OK(took < 10.0); /* about 0.1 s; the quadratic check took minutes */
    if (f) ckpt_st_close(f);
    char *dup = strstr(json, "\"k77777\"");
    T_OK(dup != NULL);
    if (dup) memcpy(dup, "\"k12345\"", 8); /* the same length: a duplicate of an earlier key */
    write_st(tpath("meta_dup.safetensors"), -1, json, 8);
    f = (ckpt_st_file *)1;
    T_EQ_INT(ckpt_st_open(&f, tpath("meta_dup.safetensors")), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "duplicate \"__metadata__\" key \"k12345\"");
    free(json);
}

static void test_truncated_file(void) {
    char *data = NULL;
    size_t len = 0;
    ckpt_st_file *f = NULL;
    T_EQ_INT(ms_file_read_all(tpath("rt.safetensors"), &data, &len), MS_OK);
    if (!data) return;
    T_EQ_INT(ms_file_write_atomic(tpath("cut.safetensors"), data, len - 5), MS_OK);
    T_EQ_INT(ckpt_st_open(&f, tpath("cut.safetensors")), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "cut.safetensors: tensor \"");
    T_STR_CONTAINS(ms_errmsg(), "beyond the data section (52 bytes): file truncated?");
    T_EQ_INT(ms_file_write_atomic(tpath("cut2.safetensors"), data, 20), MS_OK);
    T_EQ_INT(ckpt_st_open(&f, tpath("cut2.safetensors")), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "cut2.safetensors: header length");
    free(data);
}

int main(void) {
    if (!ms_tmpdir_make("st")) {
        return 1;
    }
    T_EQ_INT(ckpt_st_dtype_size(CKPT_ST_BF16), 2);
    T_OK(strcmp(ckpt_st_dtype_name(CKPT_ST_I64), "I64") == 0);
    test_round_trip();
    test_layout();
    test_writer_errors();
    test_foreign_files();
    test_corrupt();
    test_truncated_file();
    test_many_meta_keys();
    ms_tmpdir_remove();
    return ms_test_summary("test_safetensors");
}
