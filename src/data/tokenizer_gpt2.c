/* tokenizer_gpt2.c - GPT-2's pre-tokenisation pattern (DATA_TOK_GPT2_PATTERN)
 * without a regex engine, on the Unicode tables of tokenizer_unicode.h:
 *
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *
 * The first alternative that matches at a place wins, each as long as it
 * can be; what it means for one character class c of L, N, S (\s) and O
 * (everything else), with ' ' the one character U+0020:
 *   - "'" then s, t, re, ve, m, ll or d (ASCII, case-sensitive): that piece;
 *   - ' ' then a c other than S: the ' ' and the longest run of c;
 *   - a c other than S: the longest run of c (an O run takes quotes too);
 *   - S: the longest S run, less its last character when it is two or more
 *     characters long and something follows (\s+(?!\S) backs off by one so
 *     that the next piece is " word"); one character then is a piece alone.
 * Every character falls into one case, so the pieces cover the text.
 *
 * Why not PCRE2: the classes would be those of the system's libpcre2
 * (Unicode 14 in 10.42: 14k letters and numbers of Unicode 15-17 were "other"
 * there), so ids depended on the machine, and PCRE2's \s also matches U+180E,
 * which tiktoken and JavaScript do not.  Patterns other than GPT-2's still
 * run through PCRE2 (tok_split). */
#include "data/tokenizer_internal.h"

#include "data/tokenizer_unicode.h"

const char *tok_unicode_version(void) {
    return TOK_UNICODE_VERSION;
}

int tok_uclass(uint32_t c) {
    return c < TOK_UCLASS_END ? tok_ublock[tok_ustage1[c >> 8]][c & 255] : TOK_U_OTHER;
}

/* Class of the character at s[0] (valid UTF-8) and its byte length. */
static inline int class_at(const uint8_t *s, size_t *len) {
    uint32_t c = s[0];
    if (c < 0x80) {
        *len = 1;
        return tok_ublock[0][c];
    }
    if (c < 0xe0) {
        *len = 2;
        c = (c & 0x1f) << 6 | (s[1] & 0x3f);
    } else if (c < 0xf0) {
        *len = 3;
        c = (c & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    } else {
        *len = 4;
        c = (c & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 | (uint32_t)(s[2] & 0x3f) << 6 |
            (s[3] & 0x3f);
    }
    return tok_uclass(c);
}

/* End of the run of class k that starts at s[i]. */
static size_t run_end(const uint8_t *s, size_t n, size_t i, int k) {
    size_t l;
    while (i < n && class_at(s + i, &l) == k)
        i += l;
    return i;
}

/* Length of the contraction at s[0] == '\'' ('s 't 're 've 'm 'll 'd), or 0. */
static size_t contraction(const uint8_t *s, size_t n) {
    if (n >= 2 && (s[1] == 's' || s[1] == 't' || s[1] == 'm' || s[1] == 'd')) return 2;
    if (n >= 3 && ((s[1] == 'r' && s[2] == 'e') || (s[1] == 'v' && s[2] == 'e') ||
                   (s[1] == 'l' && s[2] == 'l')))
        return 3;
    return 0;
}

ms_status tok_gpt2_split(const uint8_t *s, size_t n, tok_piece_fn fn, void *ctx) {
    size_t i = 0;
    while (i < n) {
        size_t l, e;
        int k = class_at(s + i, &l);
        if (s[i] == '\'' && (e = contraction(s + i, n - i)) != 0) {
            e += i;
        } else if (k != TOK_U_SPACE) {
            e = run_end(s, n, i, k);
        } else if (s[i] == ' ' && i + 1 < n && (k = class_at(s + i + 1, &l)) != TOK_U_SPACE) {
            e = run_end(s, n, i + 1, k); /* " ?X+" */
        } else {
            /* \s+(?!\S), or \s+ for one character before a non-space */
            size_t last = i;
            for (e = i; e < n && class_at(s + e, &l) == TOK_U_SPACE; e += l)
                last = e;
            if (e < n && last > i) e = last;
        }
        MS_TRY(fn(ctx, s + i, e - i));
        i = e;
    }
    return MS_OK;
}
