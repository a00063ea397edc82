/* fuzz_lines.h - an input as lines, for the harnesses of the supervisor's
 * line parsers (fuzz_beat.c, fuzz_dash.c).  Each line is copied into a
 * buffer of its exact length (no NUL after it), as a socket or file reader
 * would hand it over, so that a read past its end is AddressSanitizer's. */
#ifndef MS_FUZZ_LINES_H
#define MS_FUZZ_LINES_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

/* fn(arg, line, len) for each '\n'-terminated line of data[0, size) and the
 * unterminated rest, if any (without the '\n'). */
static inline void fuzz_each_line(const uint8_t *data, size_t size,
                                  void (*fn)(void *arg, const char *line, size_t len), void *arg) {
    for (size_t off = 0; off < size;) {
        const uint8_t *nl = memchr(data + off, '\n', size - off);
        size_t len = nl ? (size_t)(nl - (data + off)) : size - off;
        char *line = malloc(len ? len : 1);
        MS_CHECK(line != NULL);
        memcpy(line, data + off, len);
        fn(arg, line, len);
        free(line);
        off += len + (nl != NULL);
    }
}

#endif
