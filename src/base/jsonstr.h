/* jsonstr.h - a string as a JSON string literal, for the writers that print
 * JSON lines by hand (the event log, the trace tools' merged trace). */
#ifndef MS_JSONSTR_H
#define MS_JSONSTR_H

#include <stddef.h>

/* Bytes of the valid UTF-8 sequence at s (1 to 4), or 0: an invalid or cut
 * one (overlong forms, surrogates and code points past U+10FFFF are invalid). */
int ms_utf8_len(const unsigned char *s);

/* Replace in place every byte of s that is not part of a valid UTF-8
 * sequence with '?': a printed JSON text (cJSON passes a path's bytes
 * through) that every JSON reader takes. */
void ms_utf8_fix(char *s);

/* s as a JSON string literal (with quotes) into buf (n >= 10); '"', '\' and
 * control characters escaped, truncated to fit, never inside a character;
 * invalid UTF-8 bytes become '?'.  6 * strlen(s) + 10 bytes always hold it. */
const char *ms_json_quote(char *buf, size_t n, const char *s);

/* 1 if the JSON text s[0, n) holds a NUL byte, raw or escaped (\u0000 in a
 * string): cJSON's strings end at it, so a value "T\u0000junk" would be read
 * as "T" (a token compared by strlen passed with junk after it).  The
 * servers refuse such a line. */
int ms_json_has_nul(const char *s, size_t n);

#endif
