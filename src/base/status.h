/* status.h - status codes, error messages and always-on invariant checks.
 *
 * Two tiers of errors (see STYLE.md):
 *  - what can fail at run time (I/O, bad input, a vanished peer) returns an
 *    ms_status; the function that detects the failure records a message that
 *    names the file / tensor / rank with ms_error(), and callers propagate the
 *    code.  The message lives in a thread-local buffer (like errno), read with
 *    ms_errmsg().  Library code never calls exit().
 *  - broken invariants hit MS_CHECK, which prints file:line and aborts.
 * Thread-safe: the message buffer is per thread.
 */
#ifndef MS_STATUS_H
#define MS_STATUS_H

#include <stdarg.h>

typedef enum {
    MS_OK = 0,
    MS_ERR_IO,        /* open/read/write/fsync/rename failed */
    MS_ERR_FORMAT,    /* a file's content is malformed (magic, size, header) */
    MS_ERR_ARG,       /* bad option, config value or API argument */
    MS_ERR_NOMEM,     /* allocation failed */
    MS_ERR_RANGE,     /* a value out of range (token id >= vocab, shape) */
    MS_ERR_NOTFOUND,  /* a file or tensor that must exist does not */
    MS_ERR_NONFINITE, /* NaN/Inf in loss or gradients */
    MS_ERR_INTERNAL,  /* a vendor library call failed */
    MS_ERR_TIMEOUT,   /* an op did not finish in time (or can never finish: a peer is gone) */
} ms_status;

/* Short name of a status code ("io", "format", ...). */
const char *ms_status_name(ms_status s);

/* Record a printf-style message for this thread and return `code`.
 * Typical use: return ms_error(MS_ERR_FORMAT, "%s: bad magic %d", path, m); */
ms_status ms_error(ms_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefix the current message with more context: "ctx: <old message>". */
ms_status ms_error_wrap(ms_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last message recorded on this thread ("" if none). */
const char *ms_errmsg(void);

/* Whether the current message was already printed for the whole job (a
 * multi-rank command's rank 0 printed every rank's error once:
 * src/train/train_gate.c), so that main prints nothing more.  ms_error
 * clears it; ms_error_wrap keeps it. */
void ms_error_set_reported(int reported);
int ms_error_reported(void);

/* Abort with file:line and a message; used by MS_CHECK.  (The header is
 * also read by the CUDA sources, which nvcc and the emulator compile as C++.) */
#ifdef __cplusplus
[[noreturn]]
#else
_Noreturn
#endif
void ms_panic(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Always-on invariant check (not compiled out in release builds). */
#define MS_CHECK(cond)                                                                             \
    do {                                                                                           \
        if (__builtin_expect(!(cond), 0)) ms_panic(__FILE__, __LINE__, "check failed: %s", #cond); \
    } while (0)

#define MS_CHECKF(cond, ...)                                                                       \
    do {                                                                                           \
        if (__builtin_expect(!(cond), 0)) ms_panic(__FILE__, __LINE__, __VA_ARGS__);               \
    } while (0)

/* Propagate a failing status to the caller. */
#define MS_TRY(expr)                                                                               \
    do {                                                                                           \
        ms_status ms_try_s_ = (expr);                                                              \
        if (ms_try_s_ != MS_OK) return ms_try_s_;                                                  \
    } while (0)

#endif
