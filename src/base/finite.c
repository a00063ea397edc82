/* finite.c - see finite.h. */
#include "base/finite.h"

#include <math.h>
#include <string.h>

int64_t ms_first_nonfinite(const float *x, size_t n) {
    enum { BLOCK = 4096 };
    for (size_t b = 0; b < n; b += BLOCK) {
        size_t e = b + BLOCK < n ? b + BLOCK : n;
        uint32_t bad = 0;
        for (size_t i = b; i < e; i++) {
            uint32_t u;
            memcpy(&u, x + i, sizeof u);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
        for (size_t i = b; bad && i < e; i++)
            if (!isfinite(x[i])) return (int64_t)i;
    }
    return -1;
}
