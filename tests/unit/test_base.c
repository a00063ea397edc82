/* test_base.c - unit tests for the base layer's file I/O (fileio.c), CRC32C
 * (crc32c.c) and counter-based RNG (rng.c).  Works in a fresh temporary
 * directory that it removes at the end. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/arena.h"
#include "base/ctx.h"
#include "base/fileio.h"
#include "base/rng.h"
#include "base/timeutil.h"
#include "check.h"
#include "tmpdir.h"

/* Exported by crc32c.c / rng.c for tests only (not in the headers). */
uint32_t ms_crc32c_portable(uint32_t crc, const void *data, size_t n);
uint32_t ms_crc32c_hw(uint32_t crc, const void *data, size_t n);
int ms_crc32c_hw_available(void);
void ms_rng_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

static int exists(const char *p) {
    return access(p, F_OK) == 0;
}

static void write_raw(const char *p, const char *s) {
    FILE *f = fopen(p, "wb");
    fputs(s, f);
    fclose(f);
}

/* Content of p (static buffer), "" if unreadable. */
static const char *slurp(const char *p) {
    static char buf[256];
    FILE *f = fopen(p, "rb");
    size_t n = 0;
    buf[0] = '\0';
    if (f) {
        n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
    }
    buf[n] = '\0';
    return buf;
}

static void test_file_basics(void) {
    uint64_t size = 0;
    char *data = NULL;
    size_t len = 0;
    const void *map;
    size_t mlen;
    const char *p = tpath("hello.txt");

    T_EQ_INT(ms_file_size(tpath("missing.bin"), &size), MS_ERR_NOTFOUND);
    T_STR_CONTAINS(ms_errmsg(), "missing.bin");
    T_STR_CONTAINS(ms_errmsg(), "No such file or directory");
    T_EQ_INT(ms_file_read_all(tpath("missing.bin"), &data, &len), MS_ERR_NOTFOUND);
    T_STR_CONTAINS(ms_errmsg(), "missing.bin: open: No such file or directory");
    T_EQ_INT(ms_file_map(tpath("missing.bin"), &map, &mlen), MS_ERR_NOTFOUND);
    T_STR_CONTAINS(ms_errmsg(), "missing.bin");

    T_EQ_INT(ms_file_write_atomic(p, "hello world", 11), MS_OK);
    T_EQ_INT(ms_file_size(p, &size), MS_OK);
    T_EQ_INT(size, 11);
    T_EQ_INT(ms_file_read_all(p, &data, &len), MS_OK);
    T_EQ_INT(len, 11);
    T_OK(data && strcmp(data, "hello world") == 0 && data[len] == '\0');
    free(data);

    T_EQ_INT(ms_file_map(p, &map, &mlen), MS_OK);
    T_EQ_INT(mlen, 11);
    T_OK(memcmp(map, "hello world", 11) == 0);
    ms_file_unmap(map, mlen);

    /* empty file: maps to length 0, reads to "" */
    T_EQ_INT(ms_file_write_atomic(tpath("empty"), "", 0), MS_OK);
    T_EQ_INT(ms_file_map(tpath("empty"), &map, &mlen), MS_OK);
    T_EQ_INT(mlen, 0);
    ms_file_unmap(map, mlen);
    T_EQ_INT(ms_file_read_all(tpath("empty"), &data, &len), MS_OK);
    T_EQ_INT(len, 0);
    T_OK(data && data[0] == '\0');
    free(data);

    /* a directory is not a regular file */
    T_EQ_INT(ms_file_size(tmpdir, &size), MS_ERR_FORMAT); /* bad input, not storage */
    T_STR_CONTAINS(ms_errmsg(), tmpdir);
    /* nor one to read whole: named as such, not read(2)'s "Is a directory" */
    T_EQ_INT(ms_file_read_all(tmpdir, &data, &len), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "is a directory, not a file");
    T_OK(data == NULL && len == 0);
}

static void test_pread(void) {
    const char *p = tpath("pread.bin");
    char buf[16] = {0};
    FILE *f;
    write_raw(p, "0123456789");
    f = fopen(p, "rb");
    T_OK(f != NULL);
    if (!f) return;
    T_EQ_INT(ms_file_pread(f, p, buf, 3, 4), MS_OK);
    T_OK(memcmp(buf, "456", 3) == 0);
    T_EQ_INT(ms_file_pread(f, p, buf, 2, 0), MS_OK);
    T_OK(memcmp(buf, "01", 2) == 0);
    T_EQ_INT(ms_file_pread(f, p, buf, 8, 6), MS_ERR_IO);
    T_STR_CONTAINS(ms_errmsg(), "pread.bin: short read: wanted 8 bytes at offset 6, got 4");
    fclose(f);
}

static void test_atomic(void) {
    ms_atomic_file af;
    char tmp[sizeof af.tmp];
    const char *p = tpath("atomic.txt");
    write_raw(p, "old");
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)getpid());

    /* abort: target untouched, temp removed */
    T_EQ_INT(ms_atomic_open(&af, p), MS_OK);
    T_OK(strcmp(af.tmp, tmp) == 0);
    T_EQ_INT(ms_atomic_write(&af, "new data", 8), MS_OK);
    T_OK(exists(tmp));
    T_OK(strcmp(slurp(p), "old") == 0);
    ms_atomic_abort(&af);
    T_OK(!exists(tmp));
    T_OK(strcmp(slurp(p), "old") == 0);
    ms_atomic_abort(&af); /* twice is harmless */

    /* commit: target replaced, temp gone */
    T_EQ_INT(ms_atomic_open(&af, p), MS_OK);
    T_EQ_INT(ms_atomic_write(&af, "new ", 4), MS_OK);
    T_EQ_INT(ms_atomic_printf(&af, "%d-%s", 42, "x"), MS_OK);
    T_OK(strcmp(slurp(p), "old") == 0);
    T_EQ_INT(ms_atomic_commit(&af), MS_OK);
    T_OK(strcmp(slurp(p), "new 42-x") == 0);
    T_OK(!exists(tmp));
    T_EQ_INT(ms_atomic_write(&af, "x", 1), MS_ERR_ARG); /* closed */
    ms_atomic_abort(&af);                               /* after commit: must not touch p */
    T_OK(strcmp(slurp(p), "new 42-x") == 0);

    /* a link is replaced by the new file (the target is untouched), but one to a file
     * descriptor (/dev/stdout: /proc/self/fd/1) is refused, naming it (before, `ckpt export
     * --out /dev/stdout > f` as root replaced the system's /dev/stdout); a temp file's name
     * taken by a link is never written through */
    char atomic_txt[512]; /* (tpath's buffers are reused) */
    snprintf(atomic_txt, sizeof atomic_txt, "%s", p);
    T_EQ_INT(ms_mkdirs(tpath("links")), MS_OK);
    T_OK(symlink("../atomic.txt", tpath("links/to_atomic")) == 0);
    T_EQ_INT(ms_file_write_atomic(tpath("links/to_atomic"), "replaced", 8), MS_OK);
    struct stat lsb;
    T_OK(lstat(tpath("links/to_atomic"), &lsb) == 0 && S_ISREG(lsb.st_mode));
    T_OK(strcmp(slurp(tpath("links/to_atomic")), "replaced") == 0);
    T_OK(strcmp(slurp(atomic_txt), "new 42-x") == 0);
    int regular_fd = open(atomic_txt, O_RDONLY); /* a descriptor on a regular file, as a
                                                      stdout redirected to one */
    char fd_link[64];
    snprintf(fd_link, sizeof fd_link, "/proc/self/fd/%d", regular_fd);
    T_OK(regular_fd >= 0 && symlink(fd_link, tpath("links/stdout")) == 0);
    T_OK(symlink("stdout", tpath("links/chain")) == 0);
    T_EQ_INT(ms_atomic_open(&af, tpath("links/chain")), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "links/chain names a file descriptor of this process");
    ms_atomic_abort(&af);
    T_OK(lstat(tpath("links/stdout"), &lsb) == 0 && S_ISLNK(lsb.st_mode));
    T_OK(ms_path_names_fd("/proc/self/fd/1") && ms_path_names_fd("/proc/123/fd/4") &&
         ms_path_names_fd("/proc/thread-self/fd/2") && ms_path_names_fd("/dev/fd/3") &&
         ms_path_names_fd("/dev/stdout"));
    T_OK(!ms_path_names_fd("/proc/self/cwd/run/fd/out.bin") &&
         !ms_path_names_fd("/proc/selfx/fd/1") && !ms_path_names_fd("/proc/1/root/x/fd/y"));
    if (regular_fd >= 0) close(regular_fd);
    char tmpname[600];
    snprintf(tmpname, sizeof tmpname, "%s.tmp.%ld", tpath("links/victim_out"), (long)getpid());
    write_raw(tpath("links/victim"), "victim");
    T_OK(symlink("victim", tmpname) == 0); /* (the unlink first removes this one: ours) */
    T_EQ_INT(ms_file_write_atomic(tpath("links/victim_out"), "out", 3), MS_OK);
    T_OK(strcmp(slurp(tpath("links/victim")), "victim") == 0);
    T_OK(strcmp(slurp(tpath("links/victim_out")), "out") == 0);

    /* open in a missing directory: error names the path and the directory,
     * not the temp file's "create ...tmp.PID: No such file or directory" */
    T_EQ_INT(ms_atomic_open(&af, tpath("nodir/x.bin")), MS_ERR_IO);
    T_STR_CONTAINS(ms_errmsg(), "nodir/x.bin: directory '");
    T_STR_CONTAINS(ms_errmsg(), "nodir' does not exist");
    T_OK(strstr(ms_errmsg(), ".tmp.") == NULL);
    ms_atomic_abort(&af);

    /* a target that is a directory is refused at open, before anything is
     * written (it failed only at the rename, after all the writing) */
    T_EQ_INT(ms_mkdirs(tpath("target_dir")), MS_OK);
    T_EQ_INT(ms_atomic_open(&af, tpath("target_dir")), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), "target_dir is a directory, not a file");
    T_OK(!af.f);
    ms_atomic_abort(&af);

    /* commit fails at rename (the target became a non-empty directory
     * meanwhile): the directory is untouched and the temp file is gone */
    T_EQ_INT(ms_atomic_open(&af, tpath("target")), MS_OK);
    snprintf(tmp, sizeof tmp, "%s", af.tmp);
    T_EQ_INT(ms_atomic_write(&af, "abc", 3), MS_OK);
    T_EQ_INT(ms_mkdirs(tpath("target/sub")), MS_OK);
    T_EQ_INT(ms_atomic_commit(&af), MS_ERR_IO);
    T_STR_CONTAINS(ms_errmsg(), "target: rename");
    T_STR_CONTAINS(ms_errmsg(), "Is a directory");
    T_OK(!exists(tmp));
    ms_atomic_abort(&af);
    T_OK(!exists(tmp));
    T_OK(exists(tpath("target/sub")));
}

static void test_mkdirs_glob(void) {
    char **paths = NULL;
    int n = 0;
    T_EQ_INT(ms_mkdirs(tpath("d/a/b//c/")), MS_OK);
    T_OK(exists(tpath("d/a/b/c")));
    T_EQ_INT(ms_mkdirs(tpath("d/a/b/c")), MS_OK); /* exists: ok */
    write_raw(tpath("d/file"), "x");
    T_EQ_INT(ms_mkdirs(tpath("d/file")), MS_ERR_IO);
    T_STR_CONTAINS(ms_errmsg(), "d/file");
    T_EQ_INT(ms_mkdirs(tpath("d/file/sub")), MS_ERR_IO);
    T_STR_CONTAINS(ms_errmsg(), "d/file");

    write_raw(tpath("d/b.bin"), "x");
    write_raw(tpath("d/a10.bin"), "x");
    write_raw(tpath("d/a.bin"), "x");
    write_raw(tpath("d/B.bin"), "x");
    write_raw(tpath("d/c.txt"), "x");
    T_EQ_INT(ms_glob(tpath("d/*.bin"), &paths, &n), MS_OK);
    T_EQ_INT(n, 4);
    if (n == 4) {
        T_STR_CONTAINS(paths[0], "d/B.bin"); /* byte order, not locale order */
        T_STR_CONTAINS(paths[1], "d/a.bin");
        T_STR_CONTAINS(paths[2], "d/a10.bin");
        T_STR_CONTAINS(paths[3], "d/b.bin");
    }
    ms_paths_free(paths, n);
    T_EQ_INT(ms_glob(tpath("d/c.txt"), &paths, &n), MS_OK); /* literal path */
    T_EQ_INT(n, 1);
    if (n == 1) T_OK(strcmp(paths[0], tpath("d/c.txt")) == 0);
    ms_paths_free(paths, n);
    T_EQ_INT(ms_glob(tpath("d/*.none"), &paths, &n), MS_ERR_NOTFOUND);
    T_EQ_INT(n, 0);
    T_STR_CONTAINS(ms_errmsg(), "d/*.none");

    /* a name with pattern characters: escaped, it matches only itself;
     * ms_glob_or_path takes an existing one as it is */
    T_EQ_INT(ms_mkdirs(tpath("g[1]")), MS_OK);
    T_EQ_INT(ms_mkdirs(tpath("g1")), MS_OK);
    write_raw(tpath("g[1]/s.bin"), "x");
    write_raw(tpath("g1/s.bin"), "x");
    char esc[4200], pat[4300];
    T_EQ_INT(ms_glob_escape(tpath("g[1]"), esc, sizeof esc), MS_OK);
    snprintf(pat, sizeof pat, "%s/*.bin", esc);
    T_EQ_INT(ms_glob(pat, &paths, &n), MS_OK);
    T_EQ_INT(n, 1);
    if (n == 1) T_OK(strcmp(paths[0], tpath("g[1]/s.bin")) == 0);
    ms_paths_free(paths, n);
    T_EQ_INT(ms_glob_or_path(tpath("g[1]/s.bin"), &paths, &n), MS_OK);
    T_EQ_INT(n, 1);
    if (n == 1) T_OK(strcmp(paths[0], tpath("g[1]/s.bin")) == 0);
    ms_paths_free(paths, n);
    T_EQ_INT(ms_glob(tpath("g[1]/s.bin"), &paths, &n), MS_OK); /* the pattern: g1's */
    T_EQ_INT(n, 1);
    if (n == 1) T_OK(strcmp(paths[0], tpath("g1/s.bin")) == 0);
    ms_paths_free(paths, n);
    T_EQ_INT(ms_glob_escape("a*b?c[d]\\e", esc, sizeof esc), MS_OK);
    T_OK(strcmp(esc, "a\\*b\\?c\\[d]\\\\e") == 0);
    T_EQ_INT(ms_glob_escape("abc", esc, 3), MS_ERR_RANGE);
}

/* A mapped file that another process truncates: reading its lost page is
 * a SIGBUS, which the handler turns into an error naming the file (exit 4),
 * not a bare "Bus error" (in a child: it ends the process). */
static void test_map_truncated(void) {
    const char *p = tpath("shrinks.bin");
    static char big[1 << 16];
    memset(big, 'a', sizeof big);
    FILE *f = fopen(p, "wb");
    T_OK(f && fwrite(big, 1, sizeof big, f) == sizeof big);
    if (f) fclose(f);
    int err[2];
    T_OK(pipe(err) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        const void *map;
        size_t len;
        dup2(err[1], 2);
        if (ms_file_map(p, &map, &len) != MS_OK || truncate(p, 0) != 0) _exit(1);
        volatile char c = ((const char *)map)[len - 1]; /* the page is gone: SIGBUS */
        (void)c;
        _exit(0);
    }
    close(err[1]);
    char out[1024] = "";
    size_t have = 0;
    ssize_t got;
    while (have < sizeof out - 1 && (got = read(err[0], out + have, sizeof out - 1 - have)) > 0)
        have += (size_t)got; /* the handler writes in pieces: read to the end */
    out[have] = 0;
    close(err[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    T_OK(WIFEXITED(status) && WEXITSTATUS(status) == 4);
    T_STR_CONTAINS(out, "shrinks.bin: the file changed on disk while it was read");
    T_OK(strncmp(out, "[megascale r0 error] ", 21) == 0); /* as ms_log's lines */
}

/* A SIGTERM that ends a command removes what it staged (ms_cleanup_add), the newest first: an
 * atomic writer's temp file, a staging directory's files and the directory, a directory it
 * made; what it dropped (published) stays, and the exit is the signal's.  A signal with a
 * handler of its own (a trainer's stop request) is left to it. */
static void test_cleanup_on_signal(void) {
    char out_dir[512], stage[512], kept[512], made[512];
    snprintf(out_dir, sizeof out_dir, "%s", tpath("clean_out"));
    snprintf(stage, sizeof stage, "%s", tpath("clean_out/.stage"));
    snprintf(kept, sizeof kept, "%s", tpath("clean_out/kept"));
    snprintf(made, sizeof made, "%s", tpath("clean_out/made"));
    pid_t pid = fork();
    if (pid == 0) {
        ms_atomic_file af;
        int dir_id = ms_cleanup_add(out_dir, MS_CLEAN_DIR);
        if (ms_mkdirs(stage) != MS_OK || ms_mkdirs(made) != MS_OK) _exit(1);
        write_raw(kept, "published");
        int kept_id = ms_cleanup_add(kept, MS_CLEAN_FILE);
        ms_cleanup_drop(kept_id); /* published: not removed */
        (void)ms_cleanup_add(made, MS_CLEAN_DIR);
        (void)ms_cleanup_add(stage, MS_CLEAN_DIR_FILES);
        write_raw(tpath("clean_out/.stage/a"), "a");
        write_raw(tpath("clean_out/.stage/b"), "b");
        if (ms_atomic_open(&af, tpath("clean_out/.stage/c")) != MS_OK ||
            ms_atomic_write(&af, "c", 1) != MS_OK)
            _exit(1);
        (void)dir_id;
        raise(SIGTERM);
        _exit(0); /* not reached */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    T_OK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
    T_OK(!exists(stage) && !exists(made));
    T_OK(exists(kept) && exists(out_dir)); /* out_dir: not empty, so kept */
    /* a handler of its own: the registry leaves the signal to it */
    pid = fork();
    if (pid == 0) {
        signal(SIGTERM, SIG_IGN);
        if (ms_mkdirs(tpath("clean_own")) != MS_OK) _exit(1);
        (void)ms_cleanup_add(tpath("clean_own"), MS_CLEAN_DIR);
        raise(SIGTERM);
        _exit(exists(tpath("clean_own")) ? 7 : 8);
    }
    waitpid(pid, &status, 0);
    T_OK(WIFEXITED(status) && WEXITSTATUS(status) == 7);
}

/* A bounded read: max bytes are fine, one more is an error, and an endless
 * file ends (issue 13, defect 13: the config parser read /dev/zero forever). */
static void test_read_max(void) {
    char *data = NULL;
    size_t len = 0;
    write_raw(tpath("ten"), "0123456789");
    T_EQ_INT(ms_file_read_max(tpath("ten"), 10, &data, &len), MS_OK);
    T_EQ_INT((int)len, 10);
    T_OK(data && data[10] == 0);
    free(data);
    T_EQ_INT(ms_file_read_max(tpath("ten"), 9, &data, &len), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "ten: larger than 9 bytes");
    T_OK(data == NULL && len == 0);
    T_EQ_INT(ms_file_read_max("/dev/zero", 100000, &data, &len), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "/dev/zero: larger than 100000 bytes");
}

/* Output paths checked before the work that writes them (issue 13, defect 5). */
static void test_path_writable(void) {
    ms_mkdirs(tpath("w/sub"));
    write_raw(tpath("w/file"), "x");
    T_EQ_INT(ms_path_check_writable(tpath("w/new.bin"), 0), MS_OK);
    T_EQ_INT(ms_path_check_writable(tpath("w/file"), 0), MS_OK); /* replaced */
    T_EQ_INT(ms_path_check_writable(tpath("w/sub"), 1), MS_OK);
    T_EQ_INT(ms_path_check_writable(tpath("w/new/deeper/"), 1), MS_OK); /* ms_mkdirs makes it */
    struct {
        const char *path;
        int is_dir;
        const char *needle;
    } bad[] = {
        {"w/none/x.bin", 0, "directory '"},
        {"w/sub", 0, "is a directory"},
        {"w/file", 1, "exists and is not a directory"},
        {"w/file/x.bin", 0, "w/file' is not a directory"},
        {"w/file/a/b", 1, "w/file' is not a directory"},
        {"", 0, "empty path"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *p = *bad[i].path ? tpath(bad[i].path) : "";
        T_EQ_INT(ms_path_check_writable(p, bad[i].is_dir), MS_ERR_ARG);
        T_STR_CONTAINS(ms_errmsg(), bad[i].needle);
    }
    T_STR_CONTAINS((ms_path_check_writable(tpath("w/none/x.bin"), 0), ms_errmsg()),
                   "w/none' does not exist");
    if (geteuid() != 0) { /* root writes anywhere */
        chmod(tpath("w/sub"), 0555);
        T_EQ_INT(ms_path_check_writable(tpath("w/sub/x.bin"), 0), MS_ERR_ARG);
        T_STR_CONTAINS(ms_errmsg(), "not writable");
        T_EQ_INT(ms_path_check_writable(tpath("w/sub/a/b"), 1), MS_ERR_ARG);
        chmod(tpath("w/sub"), 0755);
    }
    /* a kernel pseudo file system: no file can be made there, even by root
     * (whom access(2) lets through; others: its permission bits refuse) */
    const char *why = geteuid() == 0 ? "is on proc, a kernel pseudo file system" : "not writable";
    T_EQ_INT(ms_path_check_writable("/proc/x.png", 0), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), why);
    T_EQ_INT(ms_path_check_writable("/proc/new/dir", 1), MS_ERR_ARG);
    T_STR_CONTAINS(ms_errmsg(), why);
    if (geteuid() == 0) {
        T_EQ_INT(ms_path_check_writable("/proc", 1), MS_ERR_ARG);
        T_STR_CONTAINS(ms_errmsg(), "'/proc' is on proc");
    }
}

/* Two outputs that do not exist yet, in directories not made yet either (a --run-dir the
 * command makes): the same file by their absolute names (they compared as different, and
 * a train output was written over the driver's state). */
static void test_path_same(void) {
    ms_mkdirs(tpath("ps/d"));
    char rel[600], dot[600];
    T_OK(ms_path_same(tpath("ps/new/a.json"), tpath("ps/new/./a.json")));
    T_OK(ms_path_same(tpath("ps/new/a.json"), tpath("ps/new/x/../a.json")));
    T_OK(ms_path_same(tpath("ps/new/deeper/a"), tpath("ps/d/../new/deeper/a")));
    T_OK(!ms_path_same(tpath("ps/new/a.json"), tpath("ps/new/b.json")));
    T_OK(!ms_path_same(tpath("ps/new/a.json"), tpath("ps/other/a.json")));
    T_OK(ms_path_same(tpath("ps/d/a"), tpath("ps/d/a/"))); /* a trailing slash */
    /* relative to the working directory */
    char cwd[4096];
    T_OK(getcwd(cwd, sizeof cwd) != NULL);
    T_OK(chdir(tpath("ps")) == 0);
    snprintf(rel, sizeof rel, "new/a.json");
    snprintf(dot, sizeof dot, "%s", tpath("ps/new/a.json"));
    T_OK(ms_path_same(rel, dot));
    T_OK(ms_path_same("./new/q/../a.json", dot));
    T_OK(chdir(cwd) == 0);
    /* a file named in a directory not made yet */
    const char *const names[] = {"driver.json", "peak-*.json", NULL};
    char match[64] = "";
    T_OK(ms_path_named_in_dir(tpath("ps/run/driver.json"), tpath("ps/run"), names, match,
                              sizeof match));
    T_OK(!strcmp(match, "driver.json"));
    T_OK(ms_path_named_in_dir(tpath("ps/run/x/../peak-a.json"), tpath("ps/./run"), names, match,
                              sizeof match));
    T_OK(!ms_path_named_in_dir(tpath("ps/run/sub/driver.json"), tpath("ps/run"), names, NULL, 0));
    T_OK(!ms_path_named_in_dir(tpath("ps/run/w.bin"), tpath("ps/run"), names, NULL, 0));
    T_OK(!ms_path_named_in_dir(tpath("ps/d/driver.json"), tpath("ps/run"), names, NULL, 0));
}

/* ---- crc32c ---------------------------------------------------------- */

/* ms_alloc_aligned: a size whose rounding wraps is refused (it returned a
 * 64-byte block); an arena view never lies past its buffer. */
static void test_alloc_sizes(void) {
    T_OK(ms_alloc_aligned(SIZE_MAX - 9) == NULL);
    T_OK(ms_alloc_aligned_raw(SIZE_MAX) == NULL);
    void *p = ms_alloc_aligned(100);
    T_OK(p != NULL && ((uintptr_t)p % MS_ARENA_ALIGN) == 0);
    ms_free_aligned(p);
    p = ms_alloc_aligned(9 << 20); /* the huge-page path */
    T_OK(p != NULL && ((const char *)p)[(9 << 20) - 1] == 0);
    ms_free_aligned(p);
    char buf[256];
    ms_arena a;
    ms_arena_init(&a, buf, sizeof buf);
    T_OK(ms_arena_push(&a, 100) == buf);
    T_EQ_INT(ms_arena_used(&a), 100);
    pid_t pid = fork(); /* a push that would wrap: a panic, not a view past buf */
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        ms_arena_push(&a, SIZE_MAX - 10);
        _exit(0);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    T_OK(!(WIFEXITED(ws) && WEXITSTATUS(ws) == 0));
}

static void test_crc_vectors(void) {
    uint8_t buf[32];
    int hw = ms_crc32c_hw_available();
    printf("crc32c: hardware path %s\n", hw ? "available" : "not available (portable only)");
    T_EQ_INT(ms_crc32c(0, "123456789", 9), 0xE3069283u);
    T_EQ_INT(ms_crc32c_portable(0, "123456789", 9), 0xE3069283u);
    if (hw) T_EQ_INT(ms_crc32c_hw(0, "123456789", 9), 0xE3069283u);
    T_EQ_INT(ms_crc32c(0, "", 0), 0);
    /* RFC 3720 (iSCSI) appendix B.4 */
    memset(buf, 0, 32);
    T_EQ_INT(ms_crc32c(0, buf, 32), 0x8A9136AAu);
    T_EQ_INT(ms_crc32c_portable(0, buf, 32), 0x8A9136AAu);
    memset(buf, 0xFF, 32);
    T_EQ_INT(ms_crc32c(0, buf, 32), 0x62A8AB43u);
    T_EQ_INT(ms_crc32c_portable(0, buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    T_EQ_INT(ms_crc32c(0, buf, 32), 0x46DD794Eu);
    T_EQ_INT(ms_crc32c_portable(0, buf, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    T_EQ_INT(ms_crc32c(0, buf, 32), 0x113FDB5Cu);
    T_EQ_INT(ms_crc32c_portable(0, buf, 32), 0x113FDB5Cu);
}

static void test_crc_paths_agree(void) {
    enum { N = 200000 }; /* past 3 x 8 KiB: the hardware path's three-chain loop */
    uint8_t *buf = malloc(N + 16);
    ms_rng r = ms_rng_make(7, 0);
    int hw = ms_crc32c_hw_available(), bad_hw = 0, bad_inc = 0, cases = 0;
    for (int i = 0; i < N + 16; i++)
        buf[i] = (uint8_t)ms_rng_next_u64(&r);
    for (size_t len = 0; len < N; len = len < 300 ? len + 1 : len * 3 + 1) {
        for (size_t off = 0; off < 8; off++) {
            const uint8_t *p = buf + off;
            uint32_t sw = ms_crc32c_portable(0, p, len);
            size_t cut = len ? (size_t)ms_rng_next_below(&r, len + 1) : 0;
            uint32_t inc = ms_crc32c(ms_crc32c(0, p, cut), p + cut, len - cut);
            uint32_t inc_sw = ms_crc32c_portable(ms_crc32c_portable(0, p, cut), p + cut, len - cut);
            if (hw && ms_crc32c_hw(0, p, len) != sw) bad_hw++;
            if (ms_crc32c(0, p, len) != sw || inc != sw || inc_sw != sw) bad_inc++;
            cases++;
        }
    }
    printf("crc32c: %d random buffers compared\n", cases);
    T_EQ_INT(bad_hw, 0);
    T_EQ_INT(bad_inc, 0);
    free(buf);
}

/* ms_crc32c_copy copies and gives ms_crc32c's value; ms_crc32c_combine
 * joins the CRCs of two adjacent pieces; around the three-chain loop's
 * block sizes (3 x 256, 3 x 8192) and at odd offsets. */
static void test_crc_copy_combine(void) {
    enum { N = 100000 };
    uint8_t *src = malloc(N + 16), *dst = malloc(N + 16);
    ms_rng r = ms_rng_make(11, 0);
    for (int i = 0; i < N + 16; i++)
        src[i] = (uint8_t)ms_rng_next_u64(&r);
    const size_t lens[] = {0, 1, 7, 8, 767, 768, 769, 24575, 24576, 24577, 49153, 99999};
    int bad_copy = 0, bad_comb = 0, cases = 0;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (size_t off = 0; off < 8; off += 3) {
            size_t len = lens[li];
            const uint8_t *p = src + off;
            uint32_t want = ms_crc32c_portable(0, p, len);
            memset(dst, 0, N + 16);
            uint32_t got = ms_crc32c_copy(0, dst + (off ^ 5), p, len);
            if (got != want || memcmp(dst + (off ^ 5), p, len)) bad_copy++;
            size_t cut = len ? (size_t)ms_rng_next_below(&r, len + 1) : 0;
            uint32_t a = ms_crc32c(0, p, cut), b = ms_crc32c(0, p + cut, len - cut);
            if (ms_crc32c_combine(a, b, len - cut) != want) bad_comb++;
            /* a copy that continues a running CRC */
            if (ms_crc32c_copy(a, dst, p + cut, len - cut) != want) bad_copy++;
            cases++;
        }
    T_EQ_INT(ms_crc32c_combine(0, 0, 0), 0);
    T_EQ_INT(ms_crc32c_combine(ms_crc32c(0, "1234", 4), ms_crc32c(0, "56789", 5), 5), 0xE3069283u);
    printf("crc32c: copy and combine on %d cases\n", cases);
    T_EQ_INT(bad_copy, 0);
    T_EQ_INT(bad_comb, 0);
    free(src);
    free(dst);
}

/* ---- rng ------------------------------------------------------------- */

static void test_philox_kat(void) {
    /* Random123 tests/kat_vectors: counter[4] key[2] -> output[4] */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        ms_rng_philox4x32_10(kat[i], kat[i] + 4, out);
        for (int k = 0; k < 4; k++)
            T_EQ_INT(out[k], kat[i][6 + k]);
    }
    /* ms_rng_u64 is the first 64 bits of the block for key = seed,
     * counter = (counter, stream) */
    T_EQ_INT(ms_rng_u64(0, 0, 0), 0xe169c58d6627e8d5ull);
}

static void test_rng_pure(void) {
    ms_rng r = ms_rng_make(42, 3);
    int same = 1;
    T_EQ_INT(ms_rng_u64(1, 2, 3), ms_rng_u64(1, 2, 3));
    T_OK(ms_rng_u64(1, 2, 3) != ms_rng_u64(1, 2, 4));
    T_OK(ms_rng_u64(1, 2, 3) != ms_rng_u64(1, 3, 3));
    T_OK(ms_rng_u64(1, 2, 3) != ms_rng_u64(2, 2, 3));
    T_OK(ms_rng_normal(5, 1, 9) == ms_rng_normal(5, 1, 9));
    for (uint64_t i = 0; i < 100; i++)
        same &= ms_rng_next_u64(&r) == ms_rng_u64(42, 3, i);
    T_OK(same);
    T_EQ_INT(r.counter, 100);
    T_OK(ms_rng_next_uniform(&r) == ms_rng_uniform(42, 3, 100));
    T_EQ_INT(r.counter, 101);
}

static void test_rng_uniform(void) {
    enum { N = 1000000 };
    double s = 0, s2 = 0;
    int out_of_range = 0;
    float lo = 1, hi = 0;
    for (uint64_t i = 0; i < N; i++) {
        float u = ms_rng_uniform(123, 0, i);
        if (!(u >= 0.0f && u < 1.0f)) out_of_range++;
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
        s += u;
        s2 += (double)u * u;
    }
    double mean = s / N, var = s2 / N - mean * mean;
    T_EQ_INT(out_of_range, 0);
    T_NEAR(mean, 0.5, 0.002); /* sd of the mean ~0.0003 */
    T_NEAR(var, 1.0 / 12, 0.001);
    T_OK(lo < 1e-4 && hi > 1 - 1e-4);
}

static void test_rng_normal(void) {
    enum { N = 1000000 };
    double s = 0, s2 = 0, s4 = 0;
    int bad = 0, tail = 0;
    for (uint64_t i = 0; i < N; i++) {
        double z = ms_rng_normal(2024, 7, i);
        if (!isfinite(z)) bad++;
        if (fabs(z) > 3) tail++;
        s += z;
        s2 += z * z;
        s4 += z * z * z * z;
    }
    double mean = s / N, var = s2 / N - mean * mean;
    T_EQ_INT(bad, 0);
    T_NEAR(mean, 0.0, 0.005);  /* sd of the mean 0.001 */
    T_NEAR(var, 1.0, 0.01);    /* sd of the variance ~0.0014 */
    T_NEAR(s4 / N, 3.0, 0.05); /* kurtosis; sd ~0.01 */
    T_NEAR((double)tail / N, 0.0027, 0.0005);
}

/* The Box-Muller normal with libm's log and cos, as it was computed before
 * rng.c's own polynomials. */
static float normal_libm(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), (uint32_t)stream,
                       (uint32_t)(stream >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, o[4];
    ms_rng_philox4x32_10(ctr, key, o);
    uint64_t w0 = o[0] | (uint64_t)o[1] << 32, w1 = o[2] | (uint64_t)o[3] << 32;
    double u1 = (double)((w0 >> 11) + 1) * 0x1.0p-53, u2 = (double)(w1 >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2));
}

/* The normals are the same bits on every CPU (pinned here), the fill is the
 * scalar function bit for bit, and both are libm's Box-Muller rounded to
 * float but for rare one-ulp differences (~1 in 20M). */
static void test_rng_normal_bits(void) {
    static const struct {
        uint64_t seed, stream, counter;
        float z;
    } pin[] = {
        {1, 0, 0, -0x1.d1a254p-4},
        {1, 0, 1, -0x1.27859ep-2},
        {2024, 7, 123456789, 0x1.cf99ap+0},
        {16045690984503111693ULL, 81985529216486895ULL, 4294967295ULL, -0x1.68b2f4p-3},
        {5, 1, 9, -0x1.4e2ae8p+0},
    };
    for (size_t i = 0; i < sizeof pin / sizeof pin[0]; i++)
        T_OK(ms_rng_normal(pin[i].seed, pin[i].stream, pin[i].counter) == pin[i].z);
    static float out[1003];
    const int lens[] = {0, 1, 7, 33, 1003};
    for (int l = 0; l < 5; l++) { /* the counter's low word wraps inside the run */
        uint64_t c0 = 0xfffffff0ULL - (uint64_t)lens[l] / 2;
        out[0] = 123.0f;
        ms_rng_normal_fill(77, 0xabcdef, c0, 0.02f, out, (size_t)lens[l]);
        int same = 1;
        for (int j = 0; j < lens[l]; j++)
            same &= out[j] == 0.02f * ms_rng_normal(77, 0xabcdef, c0 + (uint64_t)j);
        T_OK(same);
        if (lens[l] == 0) T_OK(out[0] == 123.0f); /* n = 0 writes nothing */
    }
    enum { N = 1000000 };
    int differ = 0, worse = 0;
    for (uint64_t i = 0; i < N; i++) {
        float a = ms_rng_normal(31, 4, i), b = normal_libm(31, 4, i);
        if (a == b) continue;
        differ++;
        if (nextafterf(b, a) != a) worse++;
    }
    T_OK(differ <= 3);
    T_EQ_INT(worse, 0);
}

/* Pearson correlation of x and y over n samples. */
static double corr(const double *x, const double *y, int n) {
    double mx = 0, my = 0, sxy = 0, sxx = 0, syy = 0;
    for (int i = 0; i < n; i++)
        mx += x[i], my += y[i];
    mx /= n, my /= n;
    for (int i = 0; i < n; i++) {
        sxy += (x[i] - mx) * (y[i] - my);
        sxx += (x[i] - mx) * (x[i] - mx);
        syy += (y[i] - my) * (y[i] - my);
    }
    return sxy / sqrt(sxx * syy);
}

static void test_rng_independence(void) {
    enum { N = 200000 };
    double *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b), *c = malloc(N * sizeof *c);
    double *d = malloc(N * sizeof *d);
    for (int i = 0; i < N; i++) {
        a[i] = ms_rng_normal(1, 0, (uint64_t)i);
        b[i] = ms_rng_normal(1, 1, (uint64_t)i);     /* neighbouring stream */
        c[i] = ms_rng_normal(2, 0, (uint64_t)i);     /* neighbouring seed */
        d[i] = ms_rng_normal(1, 0, (uint64_t)i + 1); /* next counter */
    }
    /* sd of a correlation estimate is 1/sqrt(N) ~ 0.0022 */
    T_NEAR(corr(a, b, N), 0.0, 0.012);
    T_NEAR(corr(a, c, N), 0.0, 0.012);
    T_NEAR(corr(a, d, N), 0.0, 0.012);
    T_NEAR(corr(b, c, N), 0.0, 0.012);
    free(a), free(b), free(c), free(d);
}

/* ms_rng_mix64 is SplitMix64's output function: its known first outputs
 * from state 0 (the reference splitmix64.c), and the bytes of a run from
 * one base spread evenly (each bit set about half the time). */
static void test_rng_mix64(void) {
    const uint64_t g = 0x9E3779B97F4A7C15ull;
    T_OK(ms_rng_mix64(g) == 0xE220A8397B1DCDAFull);
    T_OK(ms_rng_mix64(2 * g) == 0x6E789E6AA1B965F4ull);
    T_OK(ms_rng_mix64(3 * g) == 0x06C45D188009454Full);
    enum { N = 1 << 16 };
    int ones[64] = {0};
    uint64_t base = ms_rng_u64(5, 3, 0);
    for (int j = 0; j < N; j++) {
        uint64_t z = ms_rng_mix_at(base, (uint64_t)j);
        for (int b = 0; b < 64; b++)
            ones[b] += (int)(z >> b & 1);
    }
    int off = 0;
    for (int b = 0; b < 64; b++)
        off += ones[b] < N / 2 - 1000 || ones[b] > N / 2 + 1000; /* 7.8 sigma */
    T_EQ_INT(off, 0);
}

static void test_rng_below(void) {
    enum { N = 120000 };
    ms_rng r = ms_rng_make(99, 5);
    int count[6] = {0}, too_big = 0, below_half = 0;
    /* n ~ 2/3 * 2^64: plain x % n would return values below 2^64/3 twice as
     * often (P(result < n/2) = 2/3); rejection makes it 1/2 */
    const uint64_t big = 0xAAAAAAAAAAAAAAABull;
    for (int i = 0; i < N; i++) {
        uint64_t v = ms_rng_next_below(&r, 6);
        if (v >= 6)
            too_big++;
        else
            count[v]++;
    }
    T_EQ_INT(too_big, 0);
    for (int k = 0; k < 6; k++)
        T_NEAR((double)count[k] / N, 1.0 / 6, 0.006); /* 5 sd */
    for (int i = 0; i < N; i++) {
        uint64_t v = ms_rng_next_below(&r, big);
        if (v >= big) too_big++;
        if (v < big / 2) below_half++;
    }
    T_EQ_INT(too_big, 0);
    T_NEAR((double)below_half / N, 0.5, 0.01);
    T_EQ_INT(ms_rng_next_below(&r, 1), 0);
    uint64_t before = r.counter;
    (void)ms_rng_next_below(&r, 1000);
    T_OK(r.counter > before);
}

/* The launchers' variables: Open MPI's first, then PMI / PMIx, then
 * Slurm's (srun --mpi=pmix sets no OMPI_* variables). */
static void test_ctx_launchers(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK",
                                       "OMPI_COMM_WORLD_SIZE",
                                       "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "OMPI_COMM_WORLD_LOCAL_SIZE",
                                       "PMI_RANK",
                                       "PMI_SIZE",
                                       "PMIX_RANK",
                                       "MPI_LOCALRANKID",
                                       "MPI_LOCALNRANKS",
                                       "SLURM_PROCID",
                                       "SLURM_NTASKS",
                                       "SLURM_LOCALID",
                                       "SLURM_TASKS_PER_NODE",
                                       "SLURM_NODEID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    ms_ctx_init();
    T_EQ_INT(ms_ctx_get()->world, 1);
    T_EQ_INT(ms_ctx_get()->local_size, 1);
    setenv("SLURM_PROCID", "13", 1);
    setenv("SLURM_NTASKS", "20", 1);
    setenv("SLURM_LOCALID", "5", 1);
    setenv("SLURM_TASKS_PER_NODE", "8(x2),4", 1);
    setenv("SLURM_NODEID", "1", 1);
    ms_ctx_init();
    T_EQ_INT(ms_ctx_get()->rank, 13);
    T_EQ_INT(ms_ctx_get()->world, 20);
    T_EQ_INT(ms_ctx_get()->local_rank, 5);
    T_EQ_INT(ms_ctx_get()->local_size, 8);
    setenv("SLURM_NODEID", "2", 1); /* the third node has 4 */
    ms_ctx_init();
    T_EQ_INT(ms_ctx_get()->local_size, 4);
    setenv("SLURM_TASKS_PER_NODE", "garbage", 1);
    ms_ctx_init();
    T_EQ_INT(ms_ctx_get()->local_size, 1);
    setenv("OMPI_COMM_WORLD_RANK", "3", 1); /* mpirun's own win */
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    ms_ctx_init();
    T_EQ_INT(ms_ctx_get()->rank, 3);
    T_EQ_INT(ms_ctx_get()->local_size, 2);
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    ms_ctx_init();
}

/* ms_deadline: a normalised time `seconds` from now; a huge or a negative
 * wait (a --comm-timeout of 1e300) neither overflows nor lies in the past. */
static void test_deadline(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    struct timespec d = ms_deadline(CLOCK_MONOTONIC, 2.5);
    double dt = (double)(d.tv_sec - now.tv_sec) + (d.tv_nsec - now.tv_nsec) / 1e9;
    T_OK(dt >= 2.5 && dt < 3.5 && d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
    double big[] = {1e10, 1e300, INFINITY};
    for (int i = 0; i < 3; i++) {
        d = ms_deadline(CLOCK_MONOTONIC, big[i]);
        T_OK(d.tv_sec >= now.tv_sec + 999999999 && d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
    }
    double small[] = {-5, NAN};
    for (int i = 0; i < 2; i++) {
        d = ms_deadline(CLOCK_MONOTONIC, small[i]);
        T_OK(d.tv_sec >= now.tv_sec && d.tv_sec <= now.tv_sec + 1 && d.tv_nsec >= 0 &&
             d.tv_nsec < 1000000000L);
    }
}

int main(void) {
    test_alloc_sizes();
    if (!ms_tmpdir_make("base")) {
        return 1;
    }
    test_file_basics();
    test_pread();
    test_atomic();
    test_mkdirs_glob();
    test_map_truncated();
    test_cleanup_on_signal();
    test_path_writable();
    test_path_same();
    test_read_max();
    test_crc_vectors();
    test_crc_paths_agree();
    test_crc_copy_combine();
    test_philox_kat();
    test_rng_pure();
    test_rng_uniform();
    test_rng_normal();
    test_rng_normal_bits();
    test_rng_independence();
    test_rng_below();
    test_rng_mix64();
    test_ctx_launchers();
    test_deadline();
    ms_tmpdir_remove();
    return ms_test_summary("test_base");
}
