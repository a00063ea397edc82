/* jsonstr.c - JSON string quoting and UTF-8 checks (see jsonstr.h). */
#include "base/jsonstr.h"

#include <stdio.h>
#include <string.h>

int ms_utf8_len(const unsigned char *s) {
    unsigned c = s[0];
    int n = c < 0x80             ? 1
            : (c & 0xe0) == 0xc0 ? 2
            : (c & 0xf0) == 0xe0 ? 3
            : (c & 0xf8) == 0xf0 ? 4
                                 : 0;
    if (n <= 1) return n;
    unsigned cp = c & (0x7f >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0; /* also the terminating 0 */
        cp = cp << 6 | (s[i] & 0x3f);
    }
    static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

const char *ms_json_quote(char *buf, size_t n, const char *s) {
    size_t o = 0;
    buf[o++] = '"';
    for (; *s && o + 8 < n; s++) {
        unsigned char ch = (unsigned char)*s;
        int len = ch >= 0x80 ? ms_utf8_len((const unsigned char *)s) : 1;
        if (len > 1) { /* whole, or not at all when it does not fit */
            if (o + (size_t)len + 2 > n) break;
            memcpy(buf + o, s, (size_t)len);
            o += (size_t)len, s += len - 1;
        } else if (!len) {
            buf[o++] = '?';
        } else if (ch == '"' || ch == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)ch;
        } else if (ch < 0x20) {
            o += (size_t)snprintf(buf + o, n - o, "\\u%04x", ch);
        } else {
            buf[o++] = (char)ch;
        }
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return buf;
}

void ms_utf8_fix(char *s) {
    for (unsigned char *p = (unsigned char *)s; p && *p;) {
        int n = ms_utf8_len(p);
        if (n)
            p += n;
        else
            *p++ = '?';
    }
}

int ms_json_has_nul(const char *s, size_t n) {
    if (memchr(s, 0, n)) return 1;
    /* a backslash is only valid inside a string, so no string state is kept: each escape is
     * looked at and stepped over whole (an escaped backslash before "u0000" is text) */
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '\\') continue;
        if (s[i + 1] == 'u' && i + 5 < n && !memcmp(s + i + 2, "0000", 4)) return 1;
        i++;
    }
    return 0;
}
