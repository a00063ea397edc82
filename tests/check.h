/* check.h - tiny assertion helpers for C test programs.  Each failed check
 * prints both sides with file:line and counts a failure; a test program
 * ends with `return ms_test_summary("name");`, which prints
 * "N passed, N failed" and returns non-zero on any failure. */
#ifndef MS_TEST_CHECK_H
#define MS_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int ms_t_pass, ms_t_fail;

#define T_OK(cond)                                                                                 \
    do {                                                                                           \
        if (cond)                                                                                  \
            ms_t_pass++;                                                                           \
        else {                                                                                     \
            ms_t_fail++;                                                                           \
            fprintf(stderr, "%s:%d: FAIL: %s\n", __FILE__, __LINE__, #cond);                       \
        }                                                                                          \
    } while (0)

#define T_EQ_INT(a, b)                                                                             \
    do {                                                                                           \
        long long ta_ = (long long)(a), tb_ = (long long)(b);                                      \
        if (ta_ == tb_)                                                                            \
            ms_t_pass++;                                                                           \
        else {                                                                                     \
            ms_t_fail++;                                                                           \
            fprintf(stderr, "%s:%d: FAIL: %s == %s (%lld vs %lld)\n", __FILE__, __LINE__, #a, #b,  \
                    ta_, tb_);                                                                     \
        }                                                                                          \
    } while (0)

#define T_NEAR(a, b, tol)                                                                          \
    do {                                                                                           \
        double ta_ = (double)(a), tb_ = (double)(b);                                               \
        if (fabs(ta_ - tb_) <= (tol))                                                              \
            ms_t_pass++;                                                                           \
        else {                                                                                     \
            ms_t_fail++;                                                                           \
            fprintf(stderr, "%s:%d: FAIL: %s ~ %s (%.9g vs %.9g, tol %g)\n", __FILE__, __LINE__,   \
                    #a, #b, ta_, tb_, (double)(tol));                                              \
        }                                                                                          \
    } while (0)

#define T_STR_CONTAINS(hay, needle)                                                                \
    do {                                                                                           \
        const char *th_ = (hay), *tn_ = (needle);                                                  \
        if (th_ && strstr(th_, tn_))                                                               \
            ms_t_pass++;                                                                           \
        else {                                                                                     \
            ms_t_fail++;                                                                           \
            fprintf(stderr, "%s:%d: FAIL: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__,   \
                    th_ ? th_ : "(null)", tn_);                                                    \
        }                                                                                          \
    } while (0)

static inline int ms_test_summary(const char *name) {
    printf("%s: %d passed, %d failed\n", name, ms_t_pass, ms_t_fail);
    return ms_t_fail ? 1 : 0;
}

#endif
