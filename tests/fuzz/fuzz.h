/* fuzz.h - what the libFuzzer harnesses (tests/fuzz/fuzz_*.c) share.
 *
 * The readers take paths, so each input is written to a file in the
 * harness's own temporary directory (tests/tmpdir.h's, removed at exit) and
 * the reader runs on it through its real entry point.
 * Nothing is written anywhere else.  Test code: one process, one thread;
 * the directory is the only state.  A harness's own checks use MS_CHECK,
 * whose abort libFuzzer reports as a crash with the input that caused it.
 * With MS_FUZZ_VERBOSE=1 in the environment a harness prints what the
 * reader said of each input (fuzz_said): to see why a seed is rejected.
 */
#ifndef MS_FUZZ_H
#define MS_FUZZ_H

#include <fcntl.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/status.h"
#include "tmpdir.h"

/* Create the temporary directory (once, from LLVMFuzzerInitialize):
 * $TMPDIR/ms_test_NAME_XXXXXX (/tmp without TMPDIR, or where the path
 * would not fit tmpdir.h's buffer).  (A crash skips the
 * atexit removal: smoke.sh points TMPDIR into its build directory.) */
static inline void fuzz_init(const char *name) {
    const char *base = getenv("TMPDIR");
    if (tmpdir[0]) return;
    if (!base || !*base ||
        (size_t)snprintf(tmpdir, sizeof tmpdir, "%s/ms_test_%s_XXXXXX", base, name) >=
            sizeof tmpdir)
        snprintf(tmpdir, sizeof tmpdir, "/tmp/ms_test_%s_XXXXXX", name); /* too long: /tmp */
    MS_CHECKF(mkdtemp(tmpdir) != NULL, "fuzz: cannot create %s", tmpdir);
    atexit(ms_tmpdir_remove);
}

/* Write data[0, size) to the file `name` in the temporary directory and
 * return its path (tpath's rotating buffer).  A new file each time: on ext4
 * a file truncated and rewritten is flushed to disk at close (auto_da_alloc),
 * 100 times slower. */
static inline const char *fuzz_file(const char *name, const uint8_t *data, size_t size) {
    const char *path = tpath(name);
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    MS_CHECKF(fd >= 0, "fuzz: cannot create %s", path);
    for (size_t off = 0; off < size;) {
        ssize_t n = write(fd, data + off, size - off);
        MS_CHECKF(n > 0, "fuzz: cannot write %s", path);
        off += (size_t)n;
    }
    MS_CHECK(close(fd) == 0);
    return path;
}

/* With MS_FUZZ_VERBOSE set: "WHAT: ok" or "WHAT: <status>: <message>". */
static inline void fuzz_said(const char *what, ms_status rc) {
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("MS_FUZZ_VERBOSE") != NULL;
    if (!verbose) return;
    if (rc == MS_OK)
        fprintf(stderr, "%s: ok\n", what);
    else
        fprintf(stderr, "%s: %s: %s\n", what, ms_status_name(rc), ms_errmsg());
}

/* Every byte of p[0, n), so that a pointer outside the reader's buffers
 * faults here, under AddressSanitizer. */
static inline uint8_t fuzz_touch(const void *p, size_t n) {
    volatile uint8_t x = 0;
    for (size_t i = 0; i < n; i++)
        x ^= ((const uint8_t *)p)[i];
    return x;
}

#endif
