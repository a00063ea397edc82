/* tmpdir.h - a per-test temporary directory for C test programs:
 * ms_tmpdir_make("name") creates /tmp/ms_test_name_XXXXXX (returns 0 on
 * failure), tpath("file") gives "<dir>/file" (a static rotating buffer, good
 * for 4 paths at a time), ms_tmpdir_remove() deletes the tree.  Header-only;
 * one directory per test program. */
#ifndef MS_TEST_TMPDIR_H
#define MS_TEST_TMPDIR_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static char tmpdir[128];

static inline int ms_tmpdir_make(const char *name) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ms_test_%s_XXXXXX", name);
    if (mkdtemp(tmpdir)) return 1;
    perror("mkdtemp");
    return 0;
}

/* "<tmpdir>/<name>" in a static rotating buffer. */
static inline const char *tpath(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static inline int ms_tmpdir_rm_entry(const char *p, const struct stat *sb, int type,
                                     struct FTW *ftw) {
    (void)sb, (void)type, (void)ftw;
    return remove(p);
}

static inline void ms_tmpdir_remove(void) {
    nftw(tmpdir, ms_tmpdir_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
