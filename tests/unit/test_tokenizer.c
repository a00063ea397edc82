/* test_tokenizer.c - the BPE tokenizer (src/data/tokenizer*.c): GPT-2 ids
 * known from js-tiktoken, GPT-2's pattern without PCRE2 (tokenizer_gpt2.c)
 * against PCRE2 on random text, lossless round trips of arbitrary bytes,
 * parallel encode == serial encode, concurrent encodes, training on the
 * embedded corpus, save/load, and the errors for corrupt files and bad ids.
 * usage: test_tokenizer KJV.txt.gz */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/fileio.h"
#include "base/rng.h"
#include "base/timeutil.h"
#include "check.h"
#include "data/tokenizer.h"
#include "data/tokenizer_internal.h"

static char tmpdir[] = "/tmp/ms_test_tok_XXXXXX";

/* ---- helpers ---- */

typedef struct {
    uint32_t *v;
    size_t n, cap;
} ids_buf;

static int encode(const data_tokenizer *t, const char *s, size_t len, ids_buf *b) {
    b->n = 0;
    ms_status rc = data_tok_encode(t, s, len, &b->v, &b->n, &b->cap);
    if (rc != MS_OK) fprintf(stderr, "encode: %s\n", ms_errmsg());
    return rc == MS_OK;
}

/* decode(encode(s)) == s; prints where it differs. */
static int round_trip(const data_tokenizer *t, const char *s, size_t len, ids_buf *b) {
    char *d = NULL;
    size_t dl = 0;
    if (!encode(t, s, len, b)) return 0;
    if (data_tok_decode(t, b->v, b->n, &d, &dl) != MS_OK) {
        fprintf(stderr, "decode: %s\n", ms_errmsg());
        return 0;
    }
    int ok = dl == len && memcmp(d, s, len) == 0;
    if (!ok) {
        size_t i = 0;
        while (i < len && i < dl && d[i] == s[i])
            i++;
        fprintf(stderr, "round trip differs: len %zu vs %zu, first difference at byte %zu\n", len,
                dl, i);
    }
    free(d);
    return ok;
}

static int ids_equal(const uint32_t *a, size_t na, const uint32_t *b, size_t nb) {
    if (na != nb) {
        fprintf(stderr, "  %zu ids vs %zu ids\n", na, nb);
        return 0;
    }
    for (size_t i = 0; i < na; i++)
        if (a[i] != b[i]) {
            fprintf(stderr, "  id %zu: %u vs %u\n", i, a[i], b[i]);
            return 0;
        }
    return 1;
}

static char *read_gz(const char *path, size_t *len) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "gzip -dc '%s'", path);
    FILE *f = popen(cmd, "r");
    size_t cap = 1 << 20, n = 0, r;
    char *buf = malloc(cap);
    if (!f || !buf) return NULL;
    while ((r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    if (pclose(f) != 0 || n == 0) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* Random text from pieces that stress the pre-tokeniser and UTF-8 handling. */
static size_t random_text(ms_rng *r, char *out, size_t max) {
    static const char *const pieces[] = {
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "\n\n",
        "   \n",
        "\0",
        "a",
        "Z",
        "hello",
        " world",
        "'s",
        "'LL",
        "'ve",
        "123",
        " 4567",
        ".",
        ",!?",
        "--",
        "é",
        "東京",
        "🚀",
        "ا",
        "४२",
        "\xc2\xa0",     /* NBSP: Unicode space */
        "\xe3\x80\x80", /* ideographic space */
        "\xc2\x85",     /* NEL */
        "\xff",
        "\xfe\xfe",         /* never valid */
        "\xc0\x80",         /* overlong NUL */
        "\xed\xa0\x80",     /* surrogate */
        "\xf4\x90\x80\x80", /* above U+10FFFF */
        "\xe2\x82",         /* truncated euro sign */
        "\x80",
        "\xf0\x9f", /* stray continuation, truncated emoji */
    };
    static const size_t lens[] = {1, 2, 1, 1, 2, 2, 4, 1, 1, 1, 5, 6, 2, 3, 3, 3, 5, 1,
                                  3, 2, 2, 6, 4, 2, 6, 2, 3, 2, 1, 2, 2, 3, 4, 2, 1, 2};
    size_t np = sizeof pieces / sizeof *pieces, n = 0;
    MS_CHECK(np == sizeof lens / sizeof *lens);
    while (n < max) {
        uint64_t k = ms_rng_next_u64(r) % (np + 1);
        if (k == np) { /* a uniformly random byte */
            out[n++] = (char)(ms_rng_next_u64(r) & 0xff);
            continue;
        }
        if (n + lens[k] > max) break;
        memcpy(out + n, pieces[k], lens[k]);
        n += lens[k];
    }
    return n;
}

/* ---- tests ---- */

static void test_gpt2_known(const data_tokenizer *t) {
    static const struct {
        const char *text;
        uint32_t ids[32];
        size_t n;
    } cases[] = {
        {"Hello world", {15496, 995}, 2},
        {"In the beginning God created the heaven and the earth.\n",
         {818, 262, 3726, 1793, 2727, 262, 9538, 290, 262, 4534, 13, 198},
         12},
        {"I'm here, you're there; they've said 'we'll' and I'd DON'T",
         {40,  1101, 994,  11, 345, 821, 612,  26,    484, 1053, 531,
          705, 732,  1183, 6,  290, 314, 1549, 23917, 6,   51},
         21},
        {"  leading spaces\t\ttabs\n\n\nnewlines   ",
         {220, 3756, 9029, 197, 197, 8658, 82, 628, 198, 3605, 6615, 220, 220, 220},
         14},
        {"1234567 3.14159 x\xc2\xb2", {10163, 2231, 3134, 513, 13, 1415, 19707, 2124, 31185}, 9},
        {"na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x9a\x80 "
         "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xe0\xa5\xaa\xe0\xa5\xa8",
         {2616,  38776, 40304, 851, 10545, 251,   109, 12859, 105, 12520, 248, 222,
          47048, 26897, 148,   255, 39848, 12919, 220, 24231, 103, 24231, 101},
         23},
        /* special-token text is ordinary text */
        {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}, 7},
        /* U+180E is not White_Space (Unicode 6.3 on): "other", as in tiktoken
         * and JavaScript; PCRE2's \s took it: "a", " \u180e", " b", "\u180e\u180e",
         * " ", " ", "\u180e", "c" (now " ", " \u180e", "c"). */
        {"a \xe1\xa0\x8e b\xe1\xa0\x8e\xe1\xa0\x8e  \xe1\xa0\x8e"
         "c",
         {64, 28053, 254, 236, 275, 157, 254, 236, 157, 254, 236, 220, 28053, 254, 236, 66},
         16},
        /* U+0085 is White_Space (tiktoken's \s; not JavaScript's): "a", " ",
         * "\u0085", "b", "\u0085\u0085", " c". */
        {"a \xc2\x85"
         "b\xc2\x85\xc2\x85 c",
         {64, 220, 126, 227, 65, 126, 227, 126, 227, 269},
         10},
        /* U+FEFF is not (JavaScript's \s takes it): "a", " \ufeff", "b", ... */
        {"a \xef\xbb\xbf"
         "b\xef\xbb\xbf\xef\xbb\xbf c",
         {64, 27332, 119, 123, 65, 171, 119, 123, 171, 119, 123, 269},
         12},
        /* Letters and digits of Unicode 15-17 (Tai Yo U+1E6C0, Kirat Rai
         * digits U+16D70, CJK Ext H U+31350, Kawi U+11F04): "x\u{1e6c0}\u{1e6c1}",
         * "'s", " 7\u{16d70}\u{16d71}9", " \u{31350}\u{31351}"; with PCRE2 10.42
         * (Unicode 14) they were "other": "x", "\u{1e6c0}\u{1e6c1}'", "s", ... */
        {"x\xf0\x9e\x9b\x80\xf0\x9e\x9b\x81's 7\xf0\x96\xb5\xb0\xf0\x96\xb5\xb1"
         "9 \xf0\xb1\x8d\x90\xf0\xb1\x8d\x91",
         {87,  172, 252, 249, 222, 172, 252, 249, 223, 338, 767, 172, 244, 113, 108,
          172, 244, 113, 109, 24,  220, 172, 109, 235, 238, 172, 109, 235, 239},
         29},
        {"'re\xf0\x91\xbc\x84'll", {821, 172, 239, 120, 226, 1183}, 6},
    };
    ids_buf b = {0};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        T_OK(encode(t, cases[c].text, strlen(cases[c].text), &b));
        int same = ids_equal(b.v, b.n, cases[c].ids, cases[c].n);
        if (!same) fprintf(stderr, "  text: \"%s\"\n", cases[c].text);
        T_OK(same);
    }
    /* 100 'a's: one piece longer than the short-piece path (heap BPE). */
    char as[201];
    memset(as, 'a', 200);
    as[200] = 0;
    T_OK(encode(t, as, 100, &b));
    T_EQ_INT(b.n, 25);
    int all = 1;
    for (size_t i = 0; i < b.n; i++)
        all &= b.v[i] == 24794; /* "aaaa" */
    T_OK(all);
    /* Appending: the buffer keeps what it had. */
    b.n = 0;
    T_EQ_INT(data_tok_encode(t, "Hello", 5, &b.v, &b.n, &b.cap), MS_OK);
    T_EQ_INT(data_tok_encode(t, " world", 6, &b.v, &b.n, &b.cap), MS_OK);
    T_EQ_INT(b.n, 2);
    T_EQ_INT(b.v[0], 15496);
    T_EQ_INT(b.v[1], 995);
    /* Empty text: nothing appended. */
    T_EQ_INT(data_tok_encode(t, "", 0, &b.v, &b.n, &b.cap), MS_OK);
    T_EQ_INT(b.n, 2);
    free(b.v);
}

/* Piece ends of a tok_split, in order. */
typedef struct {
    const uint8_t *base;
    size_t *end;
    size_t n, cap;
} piece_list;

static ms_status add_piece(void *ctx, const uint8_t *p, size_t n) {
    piece_list *l = ctx;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 4096;
        l->end = realloc(l->end, l->cap * sizeof *l->end);
        MS_CHECK(l->end);
    }
    l->end[l->n++] = (size_t)(p - l->base) + n;
    return MS_OK;
}

static size_t put_utf8(uint8_t *s, uint32_t c) {
    if (c < 0x80) return s[0] = (uint8_t)c, 1;
    if (c < 0x800) return s[0] = (uint8_t)(0xc0 | c >> 6), s[1] = (uint8_t)(0x80 | (c & 63)), 2;
    if (c < 0x10000) {
        s[0] = (uint8_t)(0xe0 | c >> 12);
        s[1] = (uint8_t)(0x80 | (c >> 6 & 63));
        s[2] = (uint8_t)(0x80 | (c & 63));
        return 3;
    }
    s[0] = (uint8_t)(0xf0 | c >> 18);
    s[1] = (uint8_t)(0x80 | (c >> 12 & 63));
    s[2] = (uint8_t)(0x80 | (c >> 6 & 63));
    s[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

/* GPT-2's class of c by PCRE2 (UTF + UCP: the system's Unicode tables). */
static int pcre2_class(pcre2_code *const cls[3], pcre2_match_data *md, uint32_t c) {
    uint8_t b[4];
    size_t n = put_utf8(b, c);
    static const int k[3] = {TOK_U_LETTER, TOK_U_NUMBER, TOK_U_SPACE};
    for (int i = 0; i < 3; i++)
        if (pcre2_match(cls[i], b, n, 0, 0, md, NULL) >= 0) return k[i];
    return TOK_U_OTHER;
}

/* tok_gpt2_split cuts random text where PCRE2 with DATA_TOK_GPT2_PATTERN
 * does, on every code point whose class both give (the text mixes ASCII,
 * contractions, every kind of whitespace, marks, letters and digits of many
 * scripts, astral and private-use code points, noncharacters and invalid
 * bytes).  They differ, in classes only: U+180E, which PCRE2's \s takes and
 * White_Space does not, and the code points one Unicode version assigned and
 * the other does not have ('.' on one side). */
static void test_gpt2_split(void) {
    static const uint32_t ranges[][2] = {
        {0x20, 0x7e},       {0x20, 0x20},       {0x9, 0xd},         {0x1c, 0x1f},
        {0x80, 0x24f},      {0x300, 0x36f},     {0x370, 0x52f},     {0x600, 0x6ff},
        {0x900, 0x97f},     {0xe00, 0xe7f},     {0x1680, 0x1680},   {0x1800, 0x18af},
        {0x2000, 0x206f},   {0x2150, 0x218b},   {0x2460, 0x24ff},   {0x3000, 0x303f},
        {0x4e00, 0x4e3f},   {0xac00, 0xac3f},   {0xfdd0, 0xfdef},   {0xfe00, 0xfeff},
        {0xfff0, 0xffff},   {0x10570, 0x105ff}, {0x11f00, 0x11f5f}, {0x16d40, 0x16d7f},
        {0x1d400, 0x1d7ff}, {0x1e6c0, 0x1e6ff}, {0x1f300, 0x1f3ff}, {0x20000, 0x2003f},
        {0x31350, 0x3138f}, {0xe0000, 0xe01ff}, {0xf0000, 0xf003f}, {0x10fff0, 0x10ffff},
    };
    static const char *const bits[] = {"'s", "'t", "'re", "'ve", "'m", "'ll",  "'d",  "'S",
                                       "'x", "''", " ",   "  ",  "\n", "\xff", "\xc2"};
    size_t nr = sizeof ranges / sizeof *ranges, nb = sizeof bits / sizeof *bits;
    const char *pats[3] = {"^\\p{L}", "^\\p{N}", "^\\s"};
    pcre2_code *cls[3], *re = NULL;
    int jit;
    for (int i = 0; i < 3; i++)
        T_EQ_INT(tok_compile("test", pats[i], &cls[i], &jit), MS_OK);
    T_EQ_INT(tok_compile("test", DATA_TOK_GPT2_PATTERN, &re, &jit), MS_OK);
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    MS_CHECK(md);

    /* The classes: the same but for U+180E and assigned-in-one-version code points. */
    uint8_t *same = calloc(0x110000, 1);
    MS_CHECK(same);
    int unexplained = 0, differ = 0;
    for (uint32_t c = 0; c < 0x110000; c++) {
        if (c >= 0xd800 && c <= 0xdfff) continue;
        int a = tok_uclass(c), b = pcre2_class(cls, md, c);
        same[c] = a == b;
        if (a == b) continue;
        differ++;
        if (c != 0x180e && a != TOK_U_OTHER && b != TOK_U_OTHER) {
            if (unexplained++ < 5) fprintf(stderr, "  U+%04X: ours %c, PCRE2 %c\n", c, a, b);
        }
    }
    T_EQ_INT(unexplained, 0);
    T_EQ_INT(tok_uclass(0x180e), TOK_U_OTHER);
    T_EQ_INT(tok_uclass(0x85), TOK_U_SPACE);
    T_EQ_INT(tok_uclass(0xfeff), TOK_U_OTHER);
    T_EQ_INT(tok_uclass(0x1e6c0), TOK_U_LETTER); /* Tai Yo, Unicode 17 */
    printf("gpt2 split: Unicode %s tables, %d code points classed otherwise by PCRE2\n",
           tok_unicode_version(), differ);

    ms_rng r = ms_rng_make(11, 3);
    size_t max = 1 << 14;
    uint8_t *s = malloc(max + 8);
    piece_list ours = {0}, ref = {0};
    int fails = 0, texts = 400;
    size_t total = 0;
    for (int k = 0; k < texts; k++) {
        size_t n = 0, len = ms_rng_next_below(&r, max);
        while (n < len) {
            if (ms_rng_next_below(&r, 4) == 0) {
                const char *b = bits[ms_rng_next_below(&r, nb)];
                memcpy(s + n, b, strlen(b));
                n += strlen(b);
                continue;
            }
            const uint32_t *g = ranges[ms_rng_next_below(&r, nr)];
            uint32_t c = g[0] + (uint32_t)ms_rng_next_below(&r, g[1] - g[0] + 1);
            uint64_t rep = ms_rng_next_below(&r, 8) == 0 ? ms_rng_next_below(&r, 40) : 1;
            if (!same[c]) continue;
            for (uint64_t i = 0; i < rep && n < len; i++)
                n += put_utf8(s + n, c);
        }
        total += n;
        ours.base = ref.base = s;
        ours.n = ref.n = 0;
        T_EQ_INT(tok_split(NULL, 0, (const char *)s, n, add_piece, &ours), MS_OK);
        T_EQ_INT(tok_split(re, jit, (const char *)s, n, add_piece, &ref), MS_OK);
        size_t i = 0;
        while (i < ours.n && i < ref.n && ours.end[i] == ref.end[i])
            i++;
        if (i < ours.n || i < ref.n) {
            size_t at = i ? ours.end[i - 1] : 0;
            if (fails++ < 3) {
                fprintf(stderr, "  text %d: piece %zu from byte %zu ends at %zd (PCRE2 %zd):", k, i,
                        at, i < ours.n ? (ssize_t)ours.end[i] : -1,
                        i < ref.n ? (ssize_t)ref.end[i] : -1);
                for (size_t j = at; j < n && j < at + 24; j++)
                    fprintf(stderr, " %02x", s[j]);
                fprintf(stderr, "\n");
            }
        }
    }
    T_EQ_INT(fails, 0);
    printf("gpt2 split: %d random texts, %zu bytes, cut as PCRE2 cuts them\n", texts - fails,
           total);
    free(ours.end);
    free(ref.end);
    free(s);
    free(same);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    for (int i = 0; i < 3; i++)
        pcre2_code_free(cls[i]);
}

static void test_round_trips(const data_tokenizer *t) {
    ms_rng r = ms_rng_make(7, 1);
    ids_buf b = {0};
    size_t max = 1 << 16;
    char *s = malloc(max);
    int fails = 0, cases = 0;
    /* Random texts of many lengths (0 .. 64 KiB). */
    for (size_t len = 0; len < max; len = len < 64 ? len + 1 : len * 5 / 4) {
        size_t n = random_text(&r, s, len);
        cases++;
        if (!round_trip(t, s, n, &b)) fails++;
    }
    /* Uniformly random bytes. */
    for (int k = 0; k < 50; k++) {
        size_t n = ms_rng_next_u64(&r) % 5000;
        for (size_t i = 0; i < n; i++)
            s[i] = (char)(ms_rng_next_u64(&r) & 0xff);
        cases++;
        if (!round_trip(t, s, n, &b)) fails++;
    }
    T_EQ_INT(fails, 0);
    printf("round trips: %d random texts ok\n", cases - fails);
    free(s);

    /* Long runs: one huge whitespace piece, a look-ahead over it, digits,
     * punctuation, a long run of one letter, NULs. */
    size_t big = 300000;
    char *l = malloc(big + 2);
    const char fills[] = {' ', '\n', '\t', '7', '!', 'x', '\0'};
    for (size_t f = 0; f < sizeof fills; f++) {
        memset(l, fills[f], big);
        l[big] = 'y';
        T_OK(round_trip(t, l, big, &b));
        T_OK(round_trip(t, l, big + 1, &b));
    }
    /* Spaces then a word: GPT-2 leaves the last space to the word. */
    memset(l, ' ', 1000);
    memcpy(l + 1000, "word", 4);
    T_OK(encode(t, l, 1004, &b));
    T_OK(b.n >= 2 && b.v[b.n - 1] == 1573); /* " word" */
    T_OK(round_trip(t, l, 1004, &b));
    free(l);
    free(b.v);
}

static void test_decode_errors(const data_tokenizer *t) {
    uint32_t ids[3] = {15496, 50257, 995};
    char *out = NULL;
    size_t len = 0;
    T_EQ_INT(data_tok_decode(t, ids, 3, &out, &len), MS_ERR_RANGE);
    T_STR_CONTAINS(ms_errmsg(), "50257");
    T_STR_CONTAINS(ms_errmsg(), "position 1");
    T_OK(out == NULL);
    uint32_t eot[2] = {15496, 50256};
    T_EQ_INT(data_tok_decode(t, eot, 2, &out, &len), MS_OK);
    T_OK(len == 18 && memcmp(out, "Hello<|endoftext|>", 18) == 0);
    free(out);
    T_EQ_INT(data_tok_decode(t, NULL, 0, &out, &len), MS_OK);
    T_EQ_INT(len, 0);
    free(out);
}

/* Parallel encode gives the serial ids, also around places that are not
 * safe to cut; several threads encoding at once agree with one thread. */
static void test_parallel(const data_tokenizer *t, const char *kjv, size_t kjv_len) {
    ids_buf a = {0}, p = {0};
    T_OK(encode(t, kjv, kjv_len, &a));
    T_EQ_INT(data_tok_encode_parallel(t, kjv, kjv_len, 2, &p.v, &p.n, &p.cap), MS_OK);
    T_OK(ids_equal(a.v, a.n, p.v, p.n));
    printf("gpt2 on the corpus: %zu bytes, %zu tokens, %.3f bytes/token\n", kjv_len, a.n,
           (double)kjv_len / (double)a.n);

    /* 3 MB of tricky line ends: space before '\n', '\n' before space, blank
     * lines, Unicode space before '\n', invalid bytes next to '\n'. */
    static const char *const lines[] = {"a \nb",   "a\n b",   "a\n\nb",     "x\xe3\x80\x80\nz",
                                        "q\n\xff", "\xfe\nq", "end.\nNext", "7\n8",
                                        "w\n"};
    size_t cap = 3 << 20, n = 0;
    char *s = malloc(cap);
    ms_rng r = ms_rng_make(3, 3);
    while (n + 16 < cap) {
        const char *l = lines[ms_rng_next_u64(&r) % (sizeof lines / sizeof *lines)];
        size_t m = strlen(l);
        memcpy(s + n, l, m);
        n += m;
    }
    T_OK(encode(t, s, n, &a));
    p.n = 0;
    T_EQ_INT(data_tok_encode_parallel(t, s, n, 3, &p.v, &p.n, &p.cap), MS_OK);
    T_OK(ids_equal(a.v, a.n, p.v, p.n));
    /* Random text with newlines, 2.5 MB. */
    n = random_text(&r, s, 5 << 19);
    T_OK(encode(t, s, n, &a));
    p.n = 0;
    T_EQ_INT(data_tok_encode_parallel(t, s, n, 2, &p.v, &p.n, &p.cap), MS_OK);
    T_OK(ids_equal(a.v, a.n, p.v, p.n));

    /* Concurrent calls on one tokenizer. */
    enum { K = 8 };
    size_t off[K + 1];
    for (int k = 0; k <= K; k++)
        off[k] = kjv_len / K * (size_t)k;
    off[K] = kjv_len;
    ids_buf mt[K];
    memset(mt, 0, sizeof mt);
    int ok[K];
#pragma omp parallel for num_threads(4) schedule(dynamic, 1)
    for (int k = 0; k < K; k++)
        ok[k] = encode(t, kjv + off[k], off[k + 1] - off[k], &mt[k]);
    int same = 1;
    for (int k = 0; k < K; k++) {
        T_OK(ok[k]);
        T_OK(encode(t, kjv + off[k], off[k + 1] - off[k], &a));
        same &= ids_equal(a.v, a.n, mt[k].v, mt[k].n);
        free(mt[k].v);
    }
    T_OK(same);
    free(s);
    free(a.v);
    free(p.v);
}

static void progress(void *ctx, int done, int total) {
    int *calls = ctx;
    (*calls)++;
    (void)done;
    (void)total;
}

static void test_train(const char *kjv, size_t kjv_len) {
    data_tokenizer *t = NULL, *t2 = NULL;
    int calls = 0;
    double t0 = ms_now();
    T_EQ_INT(data_tok_train(kjv, &kjv_len, 1, 4096, &t, progress, &calls), MS_OK);
    double dt = ms_now() - t0;
    if (!t) {
        fprintf(stderr, "train: %s\n", ms_errmsg());
        return;
    }
    T_EQ_INT(data_tok_vocab_size(t), 4096);
    T_EQ_INT(data_tok_eot(t), 4095);
    T_STR_CONTAINS(data_tok_name(t), "bpe4096");
    T_OK(calls >= 2);
    ids_buf a = {0}, b = {0};
    T_OK(round_trip(t, kjv, kjv_len, &a));
    double bpt = (double)kjv_len / (double)a.n;
    printf("trained 4096 on the corpus in %.2fs: %zu tokens, %.3f bytes/token\n", dt, a.n, bpt);
    T_OK(bpt > 3.5); /* bytes alone would be 1.0; GPT-2 gets ~4.1 */
    uint32_t maxid = 0;
    for (size_t i = 0; i < a.n; i++)
        maxid = a.v[i] > maxid ? a.v[i] : maxid;
    T_OK(maxid < 4095 && maxid > 3000);
    /* Save, load: same vocabulary and ids. */
    char path[256];
    snprintf(path, sizeof path, "%s/kjv4096.tok", tmpdir);
    T_EQ_INT(data_tok_save(t, path), MS_OK);
    T_EQ_INT(data_tok_load(&t2, path, NULL), MS_OK);
    if (t2) {
        T_EQ_INT(data_tok_vocab_size(t2), 4096);
        T_EQ_INT(data_tok_eot(t2), 4095);
        T_STR_CONTAINS(data_tok_name(t2), "bpe4096");
        T_OK(encode(t2, kjv, kjv_len, &b));
        T_OK(ids_equal(a.v, a.n, b.v, b.n));
        data_tok_free(t2);
    }
    /* Arbitrary bytes round-trip with a trained vocabulary too. */
    ms_rng r = ms_rng_make(11, 2);
    char *s = malloc(20000);
    size_t n = random_text(&r, s, 20000);
    T_OK(round_trip(t, s, n, &b));
    free(s);
    data_tok_free(t);

    /* Deterministic, and a small corpus stops early with a smaller vocab. */
    const char *tiny = "ab ab ab abc abc";
    size_t tiny_len = strlen(tiny);
    T_EQ_INT(data_tok_train(tiny, &tiny_len, 1, 1000, &t, NULL, NULL), MS_OK);
    T_EQ_INT(data_tok_train(tiny, &tiny_len, 1, 1000, &t2, NULL, NULL), MS_OK);
    if (t && t2) {
        T_OK(data_tok_vocab_size(t) < 1000 && data_tok_vocab_size(t) > 257);
        T_EQ_INT(data_tok_vocab_size(t), data_tok_vocab_size(t2));
        T_OK(round_trip(t, tiny, strlen(tiny), &a));
        T_EQ_INT(a.n, 5); /* "ab", " ab", " ab", " abc", " abc" */
        T_OK(encode(t2, tiny, strlen(tiny), &b));
        T_OK(ids_equal(a.v, a.n, b.v, b.n));
    }
    data_tok_free(t);
    data_tok_free(t2);
    T_EQ_INT(data_tok_train(tiny, &tiny_len, 1, 256, &t, NULL, NULL), MS_ERR_ARG);
    T_OK(t == NULL);

    /* No token spans two documents: "xy" in each of many documents gives
     * "xy" and nothing longer (one text of them all would learn "xyxy"...). */
    char docs[400];
    size_t ends[200];
    for (int i = 0; i < 200; i++) {
        memcpy(docs + 2 * i, "xy", 2);
        ends[i] = 2 * (size_t)i + 2;
    }
    T_EQ_INT(data_tok_train(docs, ends, 200, 300, &t, NULL, NULL), MS_OK);
    if (t) {
        T_EQ_INT(data_tok_vocab_size(t), 258); /* the bytes, "xy", <|endoftext|> */
        T_OK(encode(t, docs, sizeof docs, &b));
        T_EQ_INT(b.n, 200);
    }
    data_tok_free(t);
    free(a.v);
    free(b.v);
}

/* ---- training against a reference: every pair counted, whole words rewritten ---- */

typedef struct {
    uint32_t *sym;
    size_t len;
    int64_t count;
} ref_word;

typedef struct {
    char bytes[64][256]; /* ids 256.. (the test's tokens are short) */
    size_t n[64];
    int n_tokens; /* ids in use, the 256 bytes included */
} ref_vocab;

static size_t ref_tok(const ref_vocab *v, uint32_t id, char *out) {
    if (id < 256) {
        out[0] = (char)id;
        return 1;
    }
    memcpy(out, v->bytes[id - 256], v->n[id - 256]);
    return v->n[id - 256];
}

typedef struct {
    uint64_t key;
    int64_t count;
} ref_pair;

static int ref_pair_cmp(const void *x, const void *y) {
    uint64_t a = ((const ref_pair *)x)->key, b = ((const ref_pair *)y)->key;
    return a < b ? -1 : a > b;
}

/* The trainer's rule: the most frequent pair (all adjacent positions of each
 * word, weighted by its count), ties to the lower (a, b); its bytes' id if a
 * token already has them, else a new one; merged left to right. */
static int ref_train(ref_word *w, int n_words, int max_tokens, ref_vocab *v) {
    v->n_tokens = 256;
    while (v->n_tokens < max_tokens) {
        int64_t best = 0;
        uint32_t ba = 0, bb = 0;
        size_t np = 0;
        for (int x = 0; x < n_words; x++)
            np += w[x].len ? w[x].len - 1 : 0;
        ref_pair *p = malloc((np ? np : 1) * sizeof *p);
        np = 0;
        for (int x = 0; x < n_words; x++)
            for (size_t i = 0; i + 1 < w[x].len; i++)
                p[np++] = (ref_pair){(uint64_t)w[x].sym[i] << 32 | w[x].sym[i + 1], w[x].count};
        qsort(p, np, sizeof *p, ref_pair_cmp);
        for (size_t i = 0; i < np;) { /* ascending keys: a tie keeps the first, the lower */
            uint64_t key = p[i].key;
            int64_t c = 0;
            for (; i < np && p[i].key == key; i++)
                c += p[i].count;
            if (c > best) best = c, ba = (uint32_t)(key >> 32), bb = (uint32_t)key;
        }
        free(p);
        if (!best) break;
        char cat[512];
        size_t n = ref_tok(v, ba, cat);
        n += ref_tok(v, bb, cat + n);
        uint32_t m = (uint32_t)v->n_tokens;
        for (int t = 256; t < v->n_tokens; t++)
            if (v->n[t - 256] == n && !memcmp(v->bytes[t - 256], cat, n)) m = (uint32_t)t;
        if (m == (uint32_t)v->n_tokens) {
            if (v->n_tokens - 256 >= 64 || n > 256) return 0;
            memcpy(v->bytes[m - 256], cat, n);
            v->n[m - 256] = n;
            v->n_tokens++;
        }
        for (int x = 0; x < n_words; x++) {
            size_t j = 0;
            for (size_t i = 0; i < w[x].len; j++)
                if (i + 1 < w[x].len && w[x].sym[i] == ba && w[x].sym[i + 1] == bb)
                    w[x].sym[j] = m, i += 2;
                else
                    w[x].sym[j] = w[x].sym[i++];
            w[x].len = j;
        }
    }
    return 1;
}

/* Words that repeat their pairs many times, overlapping ones among them
 * ("aaaa", "abab"), and one long word: the trainer rewrites a word only
 * around the merged pair; its vocabulary must be the reference's. */
static void test_train_reference(void) {
    static const char *const words[] = {"aaaaaaaa", " abababab", " aab", " ba", " aaaaa",
                                        " abba",    " bbbbbbb",  " ab",  " a",  " cabab"};
    static const int counts[] = {1, 5, 2, 7, 1, 4, 2, 9, 6, 3}; /* the first has no space */
    enum { N_WORDS = 11, LONG = 3001 };
    char *text = malloc(20000);
    ref_word w[N_WORDS];
    ms_rng r = ms_rng_make(5, 9);
    size_t n = 0;
    for (int x = 0; x < N_WORDS; x++) {
        const char *s = x < 10 ? words[x] : NULL;
        size_t len = s ? strlen(s) : LONG;
        w[x].sym = malloc(len * sizeof *w[x].sym);
        w[x].len = len;
        w[x].count = x < 10 ? counts[x] : 1;
        for (size_t i = 0; i < len; i++) /* the long word: " " and runs of a, b and c */
            w[x].sym[i] = s        ? (uint8_t)s[i]
                          : i == 0 ? ' '
                                   : "abc"[ms_rng_next_below(&r, 3) ? 0 : 1 + (i & 1)];
        for (int c = 0; c < w[x].count; c++)
            for (size_t i = 0; i < len; i++)
                text[n++] = (char)w[x].sym[i];
    }
    ref_vocab v;
    T_OK(ref_train(w, N_WORDS, 256 + 40, &v));
    data_tokenizer *t = NULL;
    T_EQ_INT(data_tok_train(text, &n, 1, 256 + 40 + 1, &t, NULL, NULL), MS_OK);
    if (t) {
        T_EQ_INT(data_tok_vocab_size(t), v.n_tokens + 1);
        int same = data_tok_vocab_size(t) == v.n_tokens + 1;
        for (int id = 256; same && id < v.n_tokens; id++) {
            char *got = NULL, want[256];
            size_t got_n = 0, want_n = ref_tok(&v, (uint32_t)id, want);
            uint32_t u = (uint32_t)id;
            T_EQ_INT(data_tok_decode(t, &u, 1, &got, &got_n), MS_OK);
            same = got && got_n == want_n && !memcmp(got, want, want_n);
            if (!same)
                fprintf(stderr, "token %d: got '%.*s', the reference '%.*s'\n", id, (int)got_n,
                        got ? got : "", (int)want_n, want);
            free(got);
        }
        T_OK(same);
    }
    data_tok_free(t);
    for (int x = 0; x < N_WORDS; x++)
        free(w[x].sym);
    free(text);
}

/* Load `data` written to a file; expect `code` and a message naming the
 * file and containing `what`. */
static void expect_load_error(const void *data, size_t len, ms_status code, const char *what) {
    char path[256];
    data_tokenizer *t = NULL;
    snprintf(path, sizeof path, "%s/bad.tok", tmpdir);
    MS_CHECK(ms_file_write_atomic(path, data, len) == MS_OK);
    ms_status rc = data_tok_load(&t, path, NULL);
    T_EQ_INT(rc, code);
    T_OK(t == NULL);
    T_STR_CONTAINS(ms_errmsg(), path);
    T_STR_CONTAINS(ms_errmsg(), what);
    data_tok_free(t);
}

static void put32(uint8_t *p, uint32_t v) {
    memcpy(p, &v, 4);
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
/* Recompute both checksums after an edit (so the content checks run). */
static void reseal(uint8_t *b, size_t len) {
    put32(b + 56, ms_crc32c(0, b + 64, len - 64));
    put32(b + 60, ms_crc32c(0, b, 60));
}

static void test_files(const data_tokenizer *gpt2) {
    char path[256], *orig = NULL, *saved = NULL;
    size_t olen = 0, slen = 0;
    data_tokenizer *t = NULL;
    /* Our writer produces the shipped file byte for byte. */
    snprintf(path, sizeof path, "%s/gpt2.tok", tmpdir);
    T_EQ_INT(data_tok_save(gpt2, path), MS_OK);
    T_EQ_INT(ms_file_read_all(path, &saved, &slen), MS_OK);
    const char *dd = getenv("MS_DATA_DIR");
    char shipped[4200];
    snprintf(shipped, sizeof shipped, "%s/gpt2.tok", dd && *dd ? dd : MS_TEST_DATA_DIR);
    T_EQ_INT(ms_file_read_all(shipped, &orig, &olen), MS_OK);
    T_OK(orig && saved && olen == slen && memcmp(orig, saved, olen) == 0);
    T_EQ_INT(data_tok_load(&t, path, NULL), MS_OK);
    if (t) T_EQ_INT(data_tok_vocab_size(t), 50257);
    data_tok_free(t);
    if (!orig) return;
    uint8_t *b = malloc(olen);

    expect_load_error("", 0, MS_ERR_FORMAT, "truncated");
    expect_load_error(orig, 40, MS_ERR_FORMAT, "truncated");
    expect_load_error(orig, olen / 2, MS_ERR_FORMAT, "truncated");
    expect_load_error(orig, olen - 1, MS_ERR_FORMAT, "truncated");
    const char foreign[] = "{\"this\": \"is a JSON file, not a tokenizer at all, really\"}\n....";
    expect_load_error(foreign, sizeof foreign, MS_ERR_FORMAT, "bad magic");
    memcpy(b, orig, olen);
    b[olen / 2] ^= 0x20; /* one flipped bit in the token bytes */
    expect_load_error(b, olen, MS_ERR_FORMAT, "body checksum");
    memcpy(b, orig, olen);
    b[17] ^= 1; /* token count */
    expect_load_error(b, olen, MS_ERR_FORMAT, "header checksum");
    memcpy(b, orig, olen);
    put32(b + 8, 2);
    reseal(b, olen);
    expect_load_error(b, olen, MS_ERR_FORMAT, "version 2");
    {
        uint8_t *c = malloc(olen + 7);
        memcpy(c, orig, olen);
        memset(c + olen, 0, 7);
        expect_load_error(c, olen + 7, MS_ERR_FORMAT, "trailing bytes");
        free(c);
    }
    /* Content errors behind valid checksums.  Body: name (4), pattern, then
     * u16 lengths; the first 256 tokens of GPT-2 are single bytes. */
    uint32_t name_len = get32((const uint8_t *)orig + 24),
             pat_len = get32((const uint8_t *)orig + 28);
    size_t lens = 64 + name_len + pat_len, toks = lens + 2 * 50256;
    memcpy(b, orig, olen);
    b[lens] = 2; /* token 0 claims 2 bytes: lengths no longer add up */
    reseal(b, olen);
    expect_load_error(b, olen, MS_ERR_FORMAT, "token lengths add up");
    memcpy(b, orig, olen);
    b[toks + 1] = b[toks]; /* token 1 = token 0: a duplicate */
    reseal(b, olen);
    expect_load_error(b, olen, MS_ERR_FORMAT, "same bytes as token");
    memcpy(b, orig, olen);
    b[64 + 1] = 0; /* a NUL in the name: it loaded as "g" and saved as another file */
    reseal(b, olen);
    expect_load_error(b, olen, MS_ERR_FORMAT, "the name contains a NUL byte");
    memcpy(b, orig, olen);
    b[64 + name_len] = '('; /* unbalanced parenthesis in the pattern */
    reseal(b, olen);
    expect_load_error(b, olen, MS_ERR_FORMAT, "pattern");
    memcpy(b, orig, olen);
    put32(b + olen - 13 - 8, 7); /* the special token's id */
    reseal(b, olen);
    expect_load_error(b, olen, MS_ERR_FORMAT, "special token id 7");

    /* Missing files are NOTFOUND, naming the path; "gpt2" is read from the
     * data_dir given (megascale's --data-dir), "" or NULL: the one compiled in. */
    snprintf(path, sizeof path, "%s/none.tok", tmpdir);
    T_EQ_INT(data_tok_load(&t, path, NULL), MS_ERR_NOTFOUND);
    T_STR_CONTAINS(ms_errmsg(), path);
    unlink(path);
    snprintf(path, sizeof path, "%s/gpt2.tok", tmpdir);
    T_EQ_INT(data_tok_load(&t, "gpt2", tmpdir), MS_OK); /* the copy saved above */
    data_tok_free(t);
    T_EQ_INT(data_tok_load(&t, path, tmpdir), MS_OK); /* a path ignores data_dir */
    data_tok_free(t);
    unlink(path);
    T_EQ_INT(data_tok_load(&t, "gpt2", tmpdir), MS_ERR_NOTFOUND);
    T_STR_CONTAINS(ms_errmsg(), path);
    T_EQ_INT(data_tok_load(&t, "gpt2", ""), MS_OK); /* the shipped one */
    if (t) T_EQ_INT(data_tok_vocab_size(t), 50257);
    data_tok_free(t);
    free(b);
    free(orig);
    free(saved);
}

/* A tokenizer file of the 256 bytes, `extra` (one token) and <|endoftext|>,
 * with pre-tokenisation pattern `pat`, loaded. */
static data_tokenizer *custom_tokenizer(const char *pat, const char *extra) {
    const char *name = "custom", *eot = "<|endoftext|>";
    size_t nl = strlen(name), pl = strlen(pat), xl = strlen(extra), el = strlen(eot);
    size_t len = 64 + nl + pl + 2 * 257 + 256 + xl + 8 + el;
    uint8_t *b = calloc(1, len), *p = b + 64;
    memcpy(b, "MSTOKBPE", 8);
    put32(b + 8, 1);
    put32(b + 12, 64);
    put32(b + 16, 257);
    put32(b + 20, 1);
    put32(b + 24, (uint32_t)nl);
    put32(b + 28, (uint32_t)pl);
    uint64_t tb = 256 + xl, sb = el, fs = len;
    memcpy(b + 32, &tb, 8);
    memcpy(b + 40, &sb, 8);
    memcpy(b + 48, &fs, 8);
    memcpy(p, name, nl), p += nl;
    memcpy(p, pat, pl), p += pl;
    for (int i = 0; i < 257; i++, p += 2)
        p[0] = (uint8_t)(i < 256 ? 1 : xl);
    for (int i = 0; i < 256; i++)
        *p++ = (uint8_t)i;
    memcpy(p, extra, xl), p += xl;
    put32(p, 257), put32(p + 4, (uint32_t)el), p += 8;
    memcpy(p, eot, el);
    reseal(b, len);
    char path[256];
    data_tokenizer *t = NULL;
    snprintf(path, sizeof path, "%s/custom.tok", tmpdir);
    MS_CHECK(ms_file_write_atomic(path, b, len) == MS_OK);
    T_EQ_INT(data_tok_load(&t, path, NULL), MS_OK);
    free(b);
    return t;
}

/* A pattern other than GPT-2's may match across a '\n' ("x\ny" is one
 * piece of `[^ ]+| +`, encoded x + "\ny"): the parallel encode and
 * `data prepare`'s blocks must not cut there.  Before, 2 threads gave
 * x, '\n', y at every chunk boundary and --threads changed the shards. */
static void test_custom_pattern(const data_tokenizer *gpt2) {
    data_tokenizer *t = custom_tokenizer("[^ ]+| +", "\ny");
    if (!t) return;
    size_t cap = 3 << 20, n = 0;
    char *s = malloc(cap);
    while (n + 8 < cap)
        n += (size_t)snprintf(s + n, cap - n, "ab x\ny\n");
    ids_buf a = {0}, p = {0};
    T_OK(encode(t, s, n, &a));
    T_EQ_INT(a.n, n / 7 * 6); /* "ab", ' ', "x", "\ny", "\n"... : one merge a line */
    T_EQ_INT(data_tok_encode_parallel(t, s, n, 2, &p.v, &p.n, &p.cap), MS_OK);
    T_OK(ids_equal(a.v, a.n, p.v, p.n));
    T_EQ_INT(data_tok_next_cut(t, s, n, 1 << 20), n); /* no safe place at all */
    T_EQ_INT(data_tok_next_cut(gpt2, s, n, 1 << 20), (1 << 20) / 7 * 7 + 5); /* "x\n|y" */
    T_EQ_INT(data_tok_next_cut(NULL, s, n, 1 << 20), 1 << 20);
    T_EQ_INT(data_tok_next_cut(gpt2, "a\nb", 3, 0), 2);
    T_EQ_INT(data_tok_next_cut(gpt2, "a \nb", 4, 0), 4);
    data_tok_free(t);
    /* A match that outgrows PCRE2's default JIT stack (a group repeated 10^5
     * times) runs again on a large one: one piece, as the interpreter gives. */
    t = custom_tokenizer("(?:ab)+|[^a]", "\ny");
    if (t) {
        n = 0;
        for (int k = 0; k < 100000; k++)
            s[n++] = 'a', s[n++] = 'b';
        s[n++] = '\n', s[n++] = 'y';
        T_OK(encode(t, s, n, &a));
        T_EQ_INT(a.n, 200002); /* 2 x 10^5 bytes, then '\n', 'y' */
        T_OK(round_trip(t, s, n, &a));
    }
    data_tok_free(t);
    free(s);
    free(a.v);
    free(p.v);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_tokenizer KJV.txt.gz\n");
        return 2;
    }
    MS_CHECK(mkdtemp(tmpdir));
    data_tokenizer *gpt2 = NULL;
    T_EQ_INT(data_tok_load(&gpt2, "gpt2", getenv("MS_DATA_DIR")), MS_OK);
    if (!gpt2) {
        fprintf(stderr, "load gpt2: %s\n", ms_errmsg());
        return ms_test_summary("test_tokenizer");
    }
    T_EQ_INT(data_tok_vocab_size(gpt2), 50257);
    T_EQ_INT(data_tok_eot(gpt2), 50256);
    T_STR_CONTAINS(data_tok_name(gpt2), "gpt2");
    size_t kjv_len = 0;
    char *kjv = read_gz(argv[1], &kjv_len);
    T_OK(kjv != NULL);

    test_gpt2_known(gpt2);
    test_gpt2_split();
    test_round_trips(gpt2);
    test_decode_errors(gpt2);
    test_files(gpt2);
    if (kjv) {
        test_parallel(gpt2, kjv, kjv_len);
        test_custom_pattern(gpt2);
        test_train(kjv, kjv_len);
        test_train_reference();
    }
    data_tok_free(gpt2);
    free(kjv);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return ms_test_summary("test_tokenizer");
}
