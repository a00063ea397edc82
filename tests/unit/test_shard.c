/* test_shard.c - token shards: round trip of both versions, byte layout as
 * llm.c writes it, range checks on read, version-1 token limit, aborted
 * writers leaving nothing behind, and each kind of damaged file failing
 * with a specific message that names the file. */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "tmpdir.h"
#include "data/docs.h"
#include "data/shard.h"

/* Number of entries in tmpdir (excluding . and ..). */
static int dir_entries(void) {
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

/* A shard the way llm.c writes one: int header[256] then raw tokens;
 * `tok_bytes` may differ from count * token size to damage it. */
static void write_llmc(const char *p, int magic, int version, int count, const void *tok,
                       size_t tok_bytes) {
    int32_t header[256] = {0};
    FILE *f = fopen(p, "wb");
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    fwrite(header, sizeof header, 1, f);
    if (tok_bytes) fwrite(tok, 1, tok_bytes, f);
    fclose(f);
}

static void test_round_trip(int version) {
    enum { N = 5000 };
    uint32_t *tok = malloc(N * sizeof *tok);
    int32_t *got = malloc(N * sizeof *got);
    uint32_t limit = version == 1 ? 65536 : 200000;
    char name[32];
    data_shard_writer w;
    data_shard s;
    int mismatch = 0;
    snprintf(name, sizeof name, "rt_v%d.bin", version);
    for (int i = 0; i < N; i++)
        tok[i] = (uint32_t)(((uint64_t)i * 2654435761u) % limit);
    tok[0] = limit - 1;
    T_EQ_INT(data_shard_writer_open(&w, tpath(name), version), MS_OK);
    T_EQ_INT(data_shard_writer_put(&w, tok, 1), MS_OK);
    T_EQ_INT(data_shard_writer_put(&w, tok + 1, 4999 - 1), MS_OK); /* crosses the 4096 chunk */
    T_EQ_INT(data_shard_writer_put(&w, tok + 4999, 1), MS_OK);
    T_EQ_INT(data_shard_writer_put(&w, tok, 0), MS_OK);
    T_EQ_INT(w.n_tokens, N);
    T_OK(access(tpath(name), F_OK) != 0); /* not visible before commit */
    T_EQ_INT(data_shard_writer_commit(&w), MS_OK);
    data_shard_writer_abort(&w); /* harmless after commit */
    T_OK(access(tpath(name), F_OK) == 0);

    T_EQ_INT(data_shard_open(&s, tpath(name)), MS_OK);
    T_EQ_INT(s.version, version);
    T_EQ_INT(s.n_tokens, N);
    T_EQ_INT(s.map_len, 1024 + (size_t)N * (version == 1 ? 2 : 4));
    for (int i = 0; i < N; i++)
        mismatch += data_shard_token(&s, (uint64_t)i) != tok[i];
    T_EQ_INT(mismatch, 0);
    /* the header exactly as llm.c reads it */
    const int32_t *h = s.map;
    T_EQ_INT(h[0], 20240520);
    T_EQ_INT(h[1], version);
    T_EQ_INT(h[2], N);
    int nonzero = 0;
    for (int i = 3; i < 256; i++)
        nonzero += h[i] != 0;
    T_EQ_INT(nonzero, 0);

    T_EQ_INT(data_shard_read(&s, 0, N, got, (int)limit), MS_OK);
    mismatch = 0;
    for (int i = 0; i < N; i++)
        mismatch += got[i] != (int32_t)tok[i];
    T_EQ_INT(mismatch, 0);
    T_EQ_INT(data_shard_read(&s, 100, 7, got, (int)limit), MS_OK);
    T_EQ_INT(got[6], tok[106]);
    T_EQ_INT(data_shard_read(&s, N, 0, got, (int)limit), MS_OK); /* empty read at the end */
    T_EQ_INT(data_shard_read(&s, N - 10, 11, got, (int)limit), MS_ERR_RANGE);
    T_STR_CONTAINS(ms_errmsg(), name);
    T_STR_CONTAINS(ms_errmsg(),
                   "read of 11 tokens at position 4990 runs past the end (5000 tokens)");
    T_EQ_INT(data_shard_read(&s, UINT64_MAX, 2, got, (int)limit), MS_ERR_RANGE);
    T_EQ_INT(data_shard_read(&s, 0, 1, got, (int)(limit - 1)), MS_ERR_RANGE); /* tok[0] = limit-1 */
    T_STR_CONTAINS(ms_errmsg(), "at position 0 is >= vocab size");
    T_EQ_INT(data_shard_read(&s, 0, 1, got, 0), MS_ERR_ARG);
    /* rewritten in place at the same size (cp over it: the same inode): its
     * modification time tells (the new tokens were read silently) */
    struct timespec later[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_sec = 2000000000}};
    T_EQ_INT(utimensat(AT_FDCWD, tpath(name), later, 0), 0);
    T_EQ_INT(data_shard_read(&s, 100, 7, got, (int)limit), MS_ERR_IO);
    T_STR_CONTAINS(ms_errmsg(), "it was written to: rewritten in place");
    /* issue 13, defect 9: truncated under a reader (it was a SIGBUS in the
     * next read of the map), then replaced by another file */
    T_EQ_INT(truncate(tpath(name), 2048), 0);
    T_EQ_INT(data_shard_read(&s, 100, 7, got, (int)limit), MS_ERR_IO);
    T_STR_CONTAINS(ms_errmsg(), "changed on disk while the run read it (its size changed");
    T_STR_CONTAINS(ms_errmsg(), name);
    data_shard_close(&s);
    data_shard_close(&s); /* twice is harmless */
    free(tok);
    free(got);
}

/* The brief's example: token 70000 at position 17 with GPT-2's padded vocab. */
static void test_vocab_check(void) {
    uint32_t tok[32];
    int32_t got[32];
    data_shard_writer w;
    data_shard s;
    for (int i = 0; i < 32; i++)
        tok[i] = (uint32_t)i * 1000;
    tok[17] = 70000;
    T_EQ_INT(data_shard_writer_open(&w, tpath("train.bin"), 2), MS_OK);
    T_EQ_INT(data_shard_writer_put(&w, tok, 32), MS_OK);
    T_EQ_INT(data_shard_writer_commit(&w), MS_OK);
    T_EQ_INT(data_shard_open(&s, tpath("train.bin")), MS_OK);
    T_EQ_INT(data_shard_read(&s, 0, 32, got, 50304), MS_ERR_RANGE);
    T_STR_CONTAINS(ms_errmsg(), "train.bin: token 70000 at position 17 is >= vocab size 50304");
    T_EQ_INT(data_shard_read(&s, 0, 17, got, 50304), MS_OK);
    T_EQ_INT(data_shard_read(&s, 18, 14, got, 50304), MS_OK);
    T_EQ_INT(got[13], 31000);
    T_EQ_INT(data_shard_read(&s, 17, 1, got, 70001), MS_OK);
    T_EQ_INT(got[0], 70000);
    data_shard_close(&s);
}

static void test_writer_failures(void) {
    uint32_t tok[4] = {1, 2, 70000, 3};
    data_shard_writer w;
    int before = dir_entries();
    /* version 1 cannot hold 70000: nothing of the call is written */
    T_EQ_INT(data_shard_writer_open(&w, tpath("v1.bin"), 1), MS_OK);
    T_EQ_INT(data_shard_writer_put(&w, tok, 2), MS_OK);
    T_EQ_INT(data_shard_writer_put(&w, tok, 4), MS_ERR_RANGE);
    T_STR_CONTAINS(ms_errmsg(), "v1.bin");
    T_STR_CONTAINS(ms_errmsg(), "token 70000 at position 4 does not fit a version 1");
    T_EQ_INT(w.n_tokens, 2);
    T_EQ_INT(dir_entries(), before + 1); /* only the temp file */
    data_shard_writer_abort(&w);
    T_OK(access(tpath("v1.bin"), F_OK) != 0);
    T_EQ_INT(dir_entries(), before); /* temp file removed */

    /* abort after writing: nothing at the final path, no temp file */
    T_EQ_INT(data_shard_writer_open(&w, tpath("aborted.bin"), 2), MS_OK);
    T_EQ_INT(data_shard_writer_put(&w, tok, 4), MS_OK);
    data_shard_writer_abort(&w);
    T_OK(access(tpath("aborted.bin"), F_OK) != 0);
    T_EQ_INT(dir_entries(), before);

    /* a target that is a directory is refused at open, before any write,
     * and leaves nothing behind */
    mkdir(tpath("dirtarget"), 0777);
    fclose(fopen(tpath("dirtarget/x"), "wb"));
    T_EQ_INT(data_shard_writer_open(&w, tpath("dirtarget"), 2), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "dirtarget is a directory");
    T_EQ_INT(dir_entries(), before + 1); /* just the directory, no temp file */
    T_OK(access(tpath("dirtarget/x"), F_OK) == 0);
    remove(tpath("dirtarget/x"));
    remove(tpath("dirtarget"));

    T_EQ_INT(data_shard_writer_open(&w, tpath("v3.bin"), 3), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "v3.bin: shard version 3");
    data_shard_writer_abort(&w);
    T_EQ_INT(data_shard_writer_open(&w, tpath("nodir/x.bin"), 1), MS_ERR_IO);
    T_STR_CONTAINS(ms_errmsg(), "nodir/x.bin");
    data_shard_writer_abort(&w);
    T_EQ_INT(dir_entries(), before);
}

/* Open must fail with `code` and a message containing `what`. */
static void expect_bad(const char *name, ms_status code, const char *what) {
    data_shard s;
    T_EQ_INT(data_shard_open(&s, tpath(name)), code);
    T_STR_CONTAINS(ms_errmsg(), what);
    T_OK(s.map == NULL);
}

static void test_bad_files(void) {
    uint16_t tok16[1000] = {0};
    uint32_t tok32[10] = {0};
    data_shard s;
    write_llmc(tpath("train.bin"), 12345, 1, 10, tok16, 20);
    expect_bad("train.bin", MS_ERR_FORMAT,
               "train.bin: bad magic 12345 (expected 20240520, or 20240801 for llm.c's llama-3 "
               "shards): not a token shard");
    write_llmc(tpath("v3.bin"), 20240520, 3, 10, tok16, 20);
    expect_bad("v3.bin", MS_ERR_FORMAT, "v3.bin: unsupported version 3 (expected 1 or 2)");
    write_llmc(tpath("trunc.bin"), 20240520, 1, 1000, tok16, 2000 - 1024);
    expect_bad(
        "trunc.bin", MS_ERR_FORMAT,
        "trunc.bin: truncated: header says 1000 tokens (3024 bytes) but file has 2000 bytes");
    write_llmc(tpath("trunc2.bin"), 20240520, 2, 10, tok32, 36);
    expect_bad("trunc2.bin", MS_ERR_FORMAT,
               "trunc2.bin: truncated: header says 10 tokens (1064 bytes) but file has 1060 bytes");
    write_llmc(tpath("long.bin"), 20240520, 1, 10, tok16, 22);
    expect_bad(
        "long.bin", MS_ERR_FORMAT,
        "long.bin: size mismatch: header says 10 tokens (1044 bytes) but file has 1046 bytes");
    write_llmc(tpath("negcount.bin"), 20240520, 1, -5, tok16, 0);
    expect_bad("negcount.bin", MS_ERR_FORMAT, "negcount.bin: bad token count -5");
    FILE *f = fopen(tpath("short.bin"), "wb");
    fwrite(tok16, 1, 100, f);
    fclose(f);
    expect_bad("short.bin", MS_ERR_FORMAT,
               "short.bin: truncated: file has 100 bytes, less than the 1024-byte header");
    fclose(fopen(tpath("empty.bin"), "wb"));
    expect_bad("empty.bin", MS_ERR_FORMAT, "empty.bin: truncated: file has 0 bytes");
    expect_bad("missing.bin", MS_ERR_NOTFOUND, "missing.bin: open: No such file or directory");

    /* an llm.c-written shard (version 1) with zero and with some tokens */
    write_llmc(tpath("llmc0.bin"), 20240520, 1, 0, NULL, 0);
    T_EQ_INT(data_shard_open(&s, tpath("llmc0.bin")), MS_OK);
    T_EQ_INT(s.n_tokens, 0);
    data_shard_close(&s);
    for (int i = 0; i < 1000; i++)
        tok16[i] = (uint16_t)(50256 - i);
    write_llmc(tpath("llmc.bin"), 20240520, 1, 1000, tok16, 2000);
    T_EQ_INT(data_shard_open(&s, tpath("llmc.bin")), MS_OK);
    T_EQ_INT(s.n_tokens, 1000);
    T_EQ_INT(data_shard_token(&s, 999), 50256 - 999);
    data_shard_close(&s);

    /* llm.c's llama-3 shards: magic 20240801, version 7, uint32 tokens */
    uint32_t big[10];
    for (int i = 0; i < 10; i++)
        big[i] = 128000u + (uint32_t)i * 25; /* above uint16 */
    write_llmc(tpath("llama3.bin"), 20240801, 7, 10, big, 40);
    T_EQ_INT(data_shard_open(&s, tpath("llama3.bin")), MS_OK);
    T_EQ_INT(s.n_tokens, 10);
    T_EQ_INT(s.token_bytes, 4);
    T_EQ_INT(data_shard_token(&s, 9), 128225);
    int32_t got[10];
    T_EQ_INT(data_shard_read(&s, 0, 10, got, 128256), MS_OK);
    T_EQ_INT(got[1], 128025);
    T_EQ_INT(data_shard_read(&s, 0, 10, got, 50257), MS_ERR_RANGE); /* a GPT-2 vocabulary */
    data_shard_close(&s);
    write_llmc(tpath("llama3v1.bin"), 20240801, 1, 10, big, 40);
    expect_bad("llama3v1.bin", MS_ERR_FORMAT,
               "llama3v1.bin: unsupported version 1 of a llama-3 shard (expected 7)");
    write_llmc(tpath("llama3short.bin"), 20240801, 7, 10, big, 20); /* uint16-sized body */
    expect_bad("llama3short.bin", MS_ERR_FORMAT, "header says 10 tokens (1064 bytes)");
}

/* A text input rewritten in place while it is read, at the same size (no SIGBUS): an error
 * naming it once its text was read, not tokens of old and new text mixed (prepare made
 * shards of both, exit 0). */
static void test_docs_rewritten(void) {
    char a[600], b[600];
    snprintf(a, sizeof a, "%s", tpath("doc_a.txt"));
    snprintf(b, sizeof b, "%s", tpath("doc_b.txt"));
    FILE *f = fopen(a, "w");
    fputs("the first document\n", f);
    fclose(f);
    f = fopen(b, "w");
    fputs("the second one\n", f);
    fclose(f);
    char *paths[] = {a, b};
    data_docs *d = NULL;
    const char *text;
    size_t len;
    uint64_t used;
    T_EQ_INT(data_docs_open(&d, paths, 2, NULL, 0), MS_OK);
    T_EQ_INT(data_docs_next(d, &text, &len, &used), MS_OK);
    T_OK(text && len == 19 && !strncmp(text, "the first document", 18));
    int fd = open(a, O_WRONLY); /* in place, the same size, a later time */
    T_OK(fd >= 0 && pwrite(fd, "THE", 3, 0) == 3);
    struct timespec later[2] = {{0, UTIME_OMIT}, {time(NULL) + 5, 0}};
    T_OK(futimens(fd, later) == 0);
    close(fd);
    T_EQ_INT(data_docs_next(d, &text, &len, &used), MS_ERR_IO);
    T_STR_CONTAINS(ms_errmsg(), "doc_a.txt: the file changed on disk while it was read");
    data_docs_close(d);
    /* left alone: both documents, no error */
    T_EQ_INT(data_docs_open(&d, paths, 2, NULL, 0), MS_OK);
    T_EQ_INT(data_docs_next(d, &text, &len, &used), MS_OK);
    T_EQ_INT(data_docs_next(d, &text, &len, &used), MS_OK);
    T_OK(text && len == 15);
    T_EQ_INT(data_docs_next(d, &text, &len, &used), MS_OK);
    T_OK(text == NULL);
    data_docs_close(d);
}

int main(void) {
    if (!ms_tmpdir_make("shard")) {
        return 1;
    }
    test_round_trip(1);
    test_round_trip(2);
    test_vocab_check();
    test_writer_failures();
    test_bad_files();
    test_docs_rewritten();
    ms_tmpdir_remove();
    return ms_test_summary("test_shard");
}
