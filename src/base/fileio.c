/* fileio.c - checked file I/O and atomic replace (see fileio.h).
 *
 * Every failure is reported with ms_error() as "<path>: <what>: <strerror>",
 * so a caller can print ms_errmsg() and the user knows which file failed and
 * why.  The atomic writer follows Redis' rdbSave: temp file next to the
 * target, fflush + fsync, rename, then fsync of the directory so the rename
 * itself is durable.
 */
#include "base/fileio.h"

#include "base/ctx.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <glob.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

/* Record "<path>: <op>: <strerror(err)>" and return `code`. */
static ms_status io_fail(ms_status code, const char *path, const char *op, int err) {
    return ms_error(code, "%s: %s: %s", path, op, strerror(err));
}

/* Status for a failed open(2)/stat(2): a missing file is NOTFOUND. */
static ms_status open_fail(const char *path, const char *op, int err) {
    return io_fail(err == ENOENT ? MS_ERR_NOTFOUND : MS_ERR_IO, path, op, err);
}

static const char *special_kind(const struct stat *sb);

ms_status ms_file_size(const char *path, uint64_t *size) {
    struct stat st;
    if (stat(path, &st) != 0) return open_fail(path, "stat", errno);
    if (!S_ISREG(st.st_mode)) /* bad input (exit 3), as ms_file_map says it: not storage's 4 */
        return ms_error(MS_ERR_FORMAT, "%s: not a regular file (%s)", path,
                        S_ISDIR(st.st_mode) ? "a directory" : special_kind(&st));
    *size = (uint64_t)st.st_size;
    return MS_OK;
}

/* Reads until EOF (the size from fstat is only a first guess, so files that
 * report size 0, like those in /proc, also work).  *data is NUL-terminated. */
ms_status ms_file_read_all(const char *path, char **data, size_t *len) {
    return ms_file_read_max(path, MS_FILE_READ_ALL_MAX, data, len);
}

ms_status ms_file_read_max(const char *path, size_t max, char **data, size_t *len) {
    ms_status rc = MS_OK;
    char *buf = NULL;
    size_t cap, n = 0;
    struct stat st;
    /* O_NONBLOCK for the open only: a FIFO without a writer blocked it for
     * ever (a `latest` or `job` file replaced by one hung `ckpt list`); its
     * reads then see the end at once, while a pipe with a writer (a
     * --config <(...)) is read to its end as before */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    *data = NULL;
    *len = 0;
    if (fd < 0) return open_fail(path, "open", errno);
    int fl = fcntl(fd, F_GETFL);
    if (fl == -1 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == -1) {
        rc = io_fail(MS_ERR_IO, path, "fcntl", errno);
        goto out;
    }
    if (fstat(fd, &st) != 0) {
        rc = io_fail(MS_ERR_IO, path, "fstat", errno);
        goto out;
    }
    if (S_ISDIR(st.st_mode)) { /* read(2) would say only "Is a directory" */
        rc = ms_error(MS_ERR_ARG, "%s is a directory, not a file", path);
        goto out;
    }
    if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > max) { /* said before a byte is read */
        rc = ms_error(MS_ERR_FORMAT, "%s: larger than %zu bytes (%llu)", path, max,
                      (unsigned long long)st.st_size);
        goto out;
    }
    cap = (st.st_size > 0 ? (size_t)st.st_size : 4096);
    if (cap > max) cap = max; /* the first read past max fails */
    cap += 2;
    for (;;) {
        if (!buf || n + 1 >= cap) {
            char *nb;
            if (buf) cap *= 2;
            nb = realloc(buf, cap);
            if (!nb) {
                rc = ms_error(MS_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, cap);
                goto out;
            }
            buf = nb;
        }
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0) {
            if (errno == EINTR) continue;
            rc = io_fail(MS_ERR_IO, path, "read", errno);
            goto out;
        }
        if (r == 0) break;
        n += (size_t)r;
        if (n > max) {
            rc = ms_error(MS_ERR_FORMAT, "%s: larger than %zu bytes", path, max);
            goto out;
        }
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return rc;
}

ms_status ms_fd_write_all(int fd, const char *what, const void *buf, size_t n) {
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, (const char *)buf + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return ms_error(MS_ERR_IO, "%s: write: %s", what, strerror(errno));
        if (w == 0) return ms_error(MS_ERR_IO, "%s: short write", what);
        off += (size_t)w;
    }
    return MS_OK;
}

ms_status ms_file_pread(FILE *f, const char *path, void *dst, size_t n, uint64_t offset) {
    size_t got;
    if (offset > (uint64_t)INT64_MAX)
        return ms_error(MS_ERR_ARG, "%s: offset %llu out of range", path,
                        (unsigned long long)offset);
    if (fseeko(f, (off_t)offset, SEEK_SET) != 0) return io_fail(MS_ERR_IO, path, "seek", errno);
    got = fread(dst, 1, n, f);
    if (got == n) return MS_OK;
    if (ferror(f)) return io_fail(MS_ERR_IO, path, "read", errno);
    return ms_error(MS_ERR_IO,
                    "%s: short read: wanted %zu bytes at offset %llu, got %zu (end of file)", path,
                    n, (unsigned long long)offset, got);
}

/* An empty file cannot be mmap'd; it maps to a static empty buffer. */
static const char ms_empty_map[1];

/* The files mapped now, for the SIGBUS handler: reading a map's page past
 * the end of a file that shrank after it was mapped (another process
 * truncated or rewrote it) is a SIGBUS, which would kill the process with
 * no word of which file.  The handler names it and exits with the storage
 * code (4).  Slots are claimed with a compare-and-swap; a path is freed
 * only after its slot's address is cleared. */
#define MAPS_MAX 256
static struct {
    _Atomic(uintptr_t) addr;
    _Atomic(size_t) len;
    _Atomic(char *) path;
} g_maps[MAPS_MAX];
static atomic_int g_bus_installed;
static struct sigaction g_bus_prev; /* the handler before ours (MPI's, say) */
static void (*_Atomic g_bus_hook)(void); /* ms_file_set_sigbus_hook */

static void install_interrupt(void);

void ms_file_set_sigbus_hook(void (*fn)(void)) {
    atomic_store(&g_bus_hook, fn);
    if (fn) install_interrupt(); /* an interrupt runs it too */
}

/* The handler's line, built with async-signal-safe code only and written at once (the lines
 * of several ranks that hit it together stay whole). */
typedef struct {
    char b[4608];
    size_t n;
} bus_line;

static void put_str(bus_line *l, const char *s) {
    while (*s && l->n < sizeof l->b - 1)
        l->b[l->n++] = *s++;
}

static void put_u64(bus_line *l, uint64_t v) {
    char b[24];
    int i = (int)sizeof b - 1;
    b[i] = '\0';
    do
        b[--i] = (char)('0' + v % 10);
    while ((v /= 10) > 0 && i > 0);
    put_str(l, b + i);
}

/* ---- what an interrupted command removes ------------------------------- */

/* The files and directories a command has staged and not yet published (ms_cleanup_add):
 * an atomic writer's temp file, a reshard's staging directory.  A SIGINT, SIGTERM or SIGHUP
 * that ends the command (one left at its default action), and the SIGBUS exit, remove them
 * first, the newest first, with async-signal-safe calls only; then the signal takes its
 * course (the exit status says it).  Before, Ctrl-C left `.tmp.PID` files, and an
 * interrupted `ckpt reshard` its --out with a `job` file that every retry was refused on. */
#define CLEAN_MAX 128
static struct {
    atomic_int used;      /* claimed (compare-and-swap), then kind and seq, then path */
    _Atomic(char *) path; /* NULL: nothing to remove (free, or being filled) */
    atomic_int kind;
    atomic_long seq;
} g_clean[CLEAN_MAX];
static atomic_long g_clean_seq;
static atomic_int g_clean_installed;

int ms_unlinkat_matching(int dirfd, int (*want)(const char *name, const void *arg),
                         const void *arg) {
    char buf[4096] __attribute__((aligned(8)));
    int removed = 0;
    lseek(dirfd, 0, SEEK_SET);
    for (long n; (n = syscall(SYS_getdents64, dirfd, buf, sizeof buf)) > 0;)
        for (long off = 0; off < n;) {
            struct { /* linux_dirent64 */
                uint64_t ino;
                int64_t off;
                unsigned short reclen;
                unsigned char type;
                char name[];
            } *e = (void *)(buf + off);
            off += e->reclen;
            if (strcmp(e->name, ".") && strcmp(e->name, "..") && want(e->name, arg) &&
                unlinkat(dirfd, e->name, 0) == 0)
                removed++;
        }
    return removed;
}

static int any_name(const char *name, const void *arg) {
    (void)name, (void)arg;
    return 1;
}

static void clean_dir_files(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    /* again from the start while a pass removed something: entries removed while the
     * directory is read can make the read skip others */
    for (int pass = 0; pass < 16 && ms_unlinkat_matching(fd, any_name, NULL) > 0; pass++) {
    }
    close(fd);
    rmdir(dir);
}

static atomic_int g_clean_hold; /* ms_cleanup_hold */

void ms_cleanup_hold(int on) {
    atomic_store(&g_clean_hold, on != 0);
}

void ms_cleanup_run(void) {
    if (atomic_load(&g_clean_hold)) return; /* publishing: what is staged may be published */
    for (;;) { /* the newest entry first: a directory's files before the directory */
        int best = -1;
        long best_seq = -1;
        for (int i = 0; i < CLEAN_MAX; i++)
            if (atomic_load(&g_clean[i].path) && atomic_load(&g_clean[i].seq) > best_seq)
                best = i, best_seq = atomic_load(&g_clean[i].seq);
        if (best < 0) return;
        char *p = atomic_exchange(&g_clean[best].path, NULL);
        if (!p) continue;
        int kind = atomic_load(&g_clean[best].kind);
        if (kind == MS_CLEAN_FILE)
            unlink(p);
        else if (kind == MS_CLEAN_DIR)
            rmdir(p);
        else
            clean_dir_files(p); /* (p is not freed: free is not async-signal-safe) */
    }
}

/* What the command would remove on any failure: its hook's, then the registry's (nothing
 * while it publishes: ms_cleanup_hold). */
static void cleanup_all(void) {
    if (atomic_load(&g_clean_hold)) return;
    void (*hook)(void) = atomic_load(&g_bus_hook);
    if (hook) hook();
    ms_cleanup_run();
}

static void on_interrupt(int sig) {
    cleanup_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_interrupt(void) {
    if (atomic_exchange(&g_clean_installed, 1)) return;
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        struct sigaction old, sa;
        /* only a signal left at its default (the end of the process): a trainer's stop
         * request, the driver's and the dashboard's are theirs */
        if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL ||
            (old.sa_flags & SA_SIGINFO))
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_interrupt;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}

int ms_cleanup_add(const char *path, ms_clean_kind kind) {
    install_interrupt();
    char *p = strdup(path);
    if (!p) return 0; /* not removed on a signal, as before */
    for (int i = 0; i < CLEAN_MAX; i++) {
        int free_slot = 0;
        if (!atomic_compare_exchange_strong(&g_clean[i].used, &free_slot, 1)) continue;
        atomic_store(&g_clean[i].kind, (int)kind);
        atomic_store(&g_clean[i].seq, atomic_fetch_add(&g_clean_seq, 1));
        atomic_store(&g_clean[i].path, p);
        return i + 1;
    }
    free(p);
    return 0;
}

void ms_cleanup_drop(int id) {
    if (id < 1 || id > CLEAN_MAX) return;
    free(atomic_exchange(&g_clean[id - 1].path, NULL));
    atomic_store(&g_clean[id - 1].used, 0);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < MAPS_MAX; i++) {
        uintptr_t base = atomic_load(&g_maps[i].addr);
        size_t len = atomic_load(&g_maps[i].len);
        const char *path = atomic_load(&g_maps[i].path);
        if (!base || a < base || a - base >= len || !path) continue;
        bus_line l;
        const ms_ctx *c = ms_ctx_get();
        l.n = 0; /* ms_log's prefix: "[megascale r3 error] " */
        put_str(&l, "[megascale ");
        if (c->log_tag[0]) {
            put_str(&l, c->log_tag);
        } else {
            put_str(&l, "r");
            put_u64(&l, c->rank > 0 ? (uint64_t)c->rank : 0);
        }
        put_str(&l, " error] ");
        put_str(&l, path);
        put_str(&l, ": the file changed on disk while it was read (byte ");
        put_u64(&l, a - base);
        put_str(&l, " of the ");
        put_u64(&l, len);
        put_str(&l, " it had is gone: was it truncated or rewritten by another process?)");
        l.b[l.n++] = '\n';
        for (size_t o = 0; o < l.n;) {
            ssize_t w = write(2, l.b + o, l.n - o);
            if (w <= 0) break;
            o += (size_t)w;
        }
        cleanup_all();
        _exit(4);
    }
    sigaction(sig, &g_bus_prev, NULL); /* not a mapped file's page: the crash it is, */
    raise(sig);                        /* handled as before ours */
}

static void map_register(const void *data, size_t len, const char *path) {
    if (!atomic_exchange(&g_bus_installed, 1)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, &g_bus_prev);
    }
    char *p = strdup(path);
    if (!p) return; /* no name to give: the plain SIGBUS */
    for (int i = 0; i < MAPS_MAX; i++) {
        uintptr_t zero = 0;
        if (atomic_load(&g_maps[i].addr) == 0 &&
            atomic_compare_exchange_strong(&g_maps[i].addr, &zero, (uintptr_t)1)) {
            atomic_store(&g_maps[i].len, len);
            atomic_store(&g_maps[i].path, p);
            atomic_store(&g_maps[i].addr, (uintptr_t)data);
            return;
        }
    }
    free(p);
}

static void map_unregister(const void *data) {
    for (int i = 0; i < MAPS_MAX; i++)
        if (atomic_load(&g_maps[i].addr) == (uintptr_t)data) {
            char *p = atomic_exchange(&g_maps[i].path, NULL);
            atomic_store(&g_maps[i].len, 0);
            atomic_store(&g_maps[i].addr, 0);
            free(p);
            return;
        }
}

/* What a path that is neither a regular file nor a directory is, or NULL. */
static const char *special_kind(const struct stat *sb) {
    return S_ISCHR(sb->st_mode)                           ? "a character device"
           : S_ISBLK(sb->st_mode)                         ? "a block device"
           : S_ISFIFO(sb->st_mode)                        ? "a FIFO"
           : S_ISSOCK(sb->st_mode)                        ? "a socket"
           : S_ISREG(sb->st_mode) || S_ISDIR(sb->st_mode) ? NULL
                                                          : "not a regular file";
}

const char *ms_file_kind(const struct stat *sb) {
    return S_ISDIR(sb->st_mode) ? "a directory" : special_kind(sb);
}

ms_status ms_file_map(const char *path, const void **data, size_t *len) {
    ms_status rc = MS_OK;
    struct stat st;
    void *p;
    /* O_NONBLOCK: a FIFO without a writer blocked open(2) for ever; it is refused below (the
     * flag means nothing to a regular file) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    *data = NULL;
    *len = 0;
    if (fd < 0) return open_fail(path, "open", errno);
    if (fstat(fd, &st) != 0) {
        rc = io_fail(MS_ERR_IO, path, "fstat", errno);
        goto out;
    }
    if (!S_ISREG(st.st_mode)) { /* bad input, as the trace tools' (exit 3, not storage's 4) */
        const char *kind = special_kind(&st);
        rc = ms_error(MS_ERR_FORMAT, "%s: not a regular file (%s)", path,
                      S_ISDIR(st.st_mode) ? "a directory"
                      : kind              ? kind
                                          : "?");
        goto out;
    }
    if (st.st_size == 0) {
        *data = ms_empty_map;
        goto out;
    }
    p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        rc = io_fail(MS_ERR_IO, path, "mmap", errno);
        goto out;
    }
    *data = p;
    *len = (size_t)st.st_size;
    map_register(p, *len, path);
out:
    close(fd);
    return rc;
}

void ms_file_unmap(const void *data, size_t len) {
    if (data && len > 0 && data != (const void *)ms_empty_map) {
        map_unregister(data);
        munmap((void *)data, len);
    }
}

/* ---- atomic writer ---------------------------------------------------- */

static ms_status refuse_special(const char *path, const char *kind) {
    return ms_error(MS_ERR_ARG,
                    "%s is %s, not a regular file: this output is written whole and renamed "
                    "into place, which would replace it (give a file name)",
                    path, kind);
}

/* 1 if cur is /proc/(N|self|thread-self)/fd/... */
static int proc_fd_path(const char *cur) {
    if (strncmp(cur, "/proc/", 6)) return 0;
    const char *p = cur + 6, *q = p;
    while (*q >= '0' && *q <= '9')
        q++;
    if (q == p) {
        if (!strncmp(p, "self/", 5))
            q = p + 4;
        else if (!strncmp(p, "thread-self/", 12))
            q = p + 11;
        else
            return 0;
    }
    return !strncmp(q, "/fd/", 4);
}

int ms_path_names_fd(const char *path) {
    char cur[4096], link[4096];
    snprintf(cur, sizeof cur, "%s", path);
    for (int hops = 0; hops < 40; hops++) {
        if (proc_fd_path(cur) || !strncmp(cur, "/dev/fd/", 8) || !strcmp(cur, "/dev/stdout") ||
            !strcmp(cur, "/dev/stderr") || !strcmp(cur, "/dev/stdin"))
            return 1;
        struct stat sb;
        if (lstat(cur, &sb) != 0 || !S_ISLNK(sb.st_mode)) return 0;
        ssize_t k = readlink(cur, link, sizeof link - 1);
        if (k <= 0 || k >= (ssize_t)sizeof link - 1) return 0; /* (stat says the rest) */
        link[k] = '\0';
        const char *slash = strrchr(cur, '/');
        char next[8192];
        if (link[0] == '/' || !slash)
            snprintf(next, sizeof next, "%s", link);
        else
            snprintf(next, sizeof next, "%.*s/%s", (int)(slash - cur), cur, link);
        snprintf(cur, sizeof cur, "%s", next);
    }
    return 0;
}

/* What the rename into place would replace that is no file of its own: a device or a FIFO
 * (before, `ckpt export --out /dev/null` as root replaced /dev/null), a link to a file
 * descriptor (before, as root, `ckpt export --out /dev/stdout > f` replaced the system's
 * /dev/stdout): MS_ERR_ARG naming it; else MS_OK. */
static ms_status refuse_unreplaceable(const char *path) {
    struct stat sb;
    if (stat(path, &sb) == 0 && special_kind(&sb)) return refuse_special(path, special_kind(&sb));
    if (ms_path_names_fd(path))
        return ms_error(MS_ERR_ARG,
                        "%s names a file descriptor of this process (a link the system keeps): "
                        "this output is written whole and renamed into place, which would "
                        "replace it (give a file name)",
                        path);
    return MS_OK;
}

ms_status ms_atomic_open(ms_atomic_file *af, const char *path) {
    af->f = NULL;
    af->path[0] = '\0';
    af->tmp[0] = '\0';
    af->clean = 0;
    if (strlen(path) >= sizeof af->path - 32)
        return ms_error(MS_ERR_ARG, "%.64s...: path longer than %zu bytes", path,
                        sizeof af->path - 33);
    struct stat sb; /* the rename would fail at the end, after all the writing */
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return ms_error(MS_ERR_ARG, "%s is a directory, not a file (give a file name in it)", path);
    MS_TRY(refuse_unreplaceable(path));
    strcpy(af->path, path);
    snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%ld", path, (long)getpid());
    af->clean = ms_cleanup_add(af->tmp, MS_CLEAN_FILE); /* first: a signal at any time finds it */
    /* a new file of that name, never through a link planted there (a dead process's file of
     * the same pid is removed first) */
    unlink(af->tmp);
    int tfd = open(af->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    af->f = tfd >= 0 ? fdopen(tfd, "wb") : NULL;
    if (!af->f && tfd >= 0) close(tfd);
    if (!af->f) {
        int err = errno;
        ms_status rc;
        char why[600];
        /* a missing or unwritable directory is named as such ("a/b: directory
         * 'a' does not exist"), not as the temp file's libc error (the code
         * stays MS_ERR_IO: a checkpoint directory gone mid-run is storage) */
        if ((err == ENOENT || err == ENOTDIR || err == EACCES) &&
            ms_path_check_writable(path, 0) != MS_OK) {
            snprintf(why, sizeof why, "%s", ms_errmsg());
            rc = ms_error(MS_ERR_IO, "%s", why);
        } else {
            rc = ms_error(MS_ERR_IO, "%s: create %s: %s", path, af->tmp, strerror(err));
        }
        af->tmp[0] = '\0'; /* nothing was created: abort must not unlink */
        ms_cleanup_drop(af->clean);
        af->clean = 0;
        return rc;
    }
    return MS_OK;
}

ms_status ms_atomic_write(ms_atomic_file *af, const void *data, size_t n) {
    if (!af->f) return ms_error(MS_ERR_ARG, "%s: write to a closed atomic file", af->path);
    if (n > 0 && fwrite(data, 1, n, af->f) != n) return io_fail(MS_ERR_IO, af->tmp, "write", errno);
    return MS_OK;
}

ms_status ms_atomic_printf(ms_atomic_file *af, const char *fmt, ...) {
    va_list ap;
    int r;
    if (!af->f) return ms_error(MS_ERR_ARG, "%s: write to a closed atomic file", af->path);
    va_start(ap, fmt);
    r = vfprintf(af->f, fmt, ap);
    va_end(ap);
    if (r < 0) return io_fail(MS_ERR_IO, af->tmp, "write", errno);
    return MS_OK;
}

/* fsync the directory holding `path` so a rename into it is durable.
 * Filesystems that cannot fsync a directory (EINVAL) are accepted. */
static ms_status fsync_parent_dir(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    ms_status rc = MS_OK;
    int fd;
    if (!slash)
        strcpy(dir, ".");
    else if (slash == path)
        strcpy(dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return io_fail(MS_ERR_IO, dir, "open directory", errno);
    if (fsync(fd) != 0 && errno != EINVAL) rc = io_fail(MS_ERR_IO, dir, "fsync directory", errno);
    close(fd);
    return rc;
}

/* On success the temp file has become `path` and the writer is empty.  On
 * failure the temp file is removed here already (the writer is closed either
 * way); calling ms_atomic_abort afterwards, as the header asks, is harmless.
 * A failure after the rename (fsync of the directory) leaves the new file in
 * place but reports that it may not be durable. */
ms_status ms_atomic_commit(ms_atomic_file *af) {
    FILE *f = af->f;
    ms_status rc = MS_OK;
    if (!f) return ms_error(MS_ERR_ARG, "%s: commit of a closed atomic file", af->path);
    af->f = NULL; /* closed below whatever happens */
    if (fflush(f) != 0)
        rc = io_fail(MS_ERR_IO, af->tmp, "write", errno);
    else if (fsync(fileno(f)) != 0)
        rc = io_fail(MS_ERR_IO, af->tmp, "fsync", errno);
    if (fclose(f) != 0 && rc == MS_OK) rc = io_fail(MS_ERR_IO, af->tmp, "close", errno);
    if (rc == MS_OK && rename(af->tmp, af->path) != 0)
        rc = ms_error(MS_ERR_IO, "%s: rename from %s: %s", af->path, af->tmp, strerror(errno));
    if (rc != MS_OK) unlink(af->tmp);
    af->tmp[0] = '\0'; /* the temp name is gone; abort must not unlink */
    ms_cleanup_drop(af->clean);
    af->clean = 0;
    return rc != MS_OK ? rc : fsync_parent_dir(af->path);
}

void ms_atomic_abort(ms_atomic_file *af) {
    if (af->f) fclose(af->f);
    af->f = NULL;
    if (af->tmp[0]) unlink(af->tmp);
    af->tmp[0] = '\0';
    ms_cleanup_drop(af->clean);
    af->clean = 0;
}

ms_status ms_file_write_atomic(const char *path, const void *data, size_t n) {
    ms_atomic_file af;
    ms_status rc = ms_atomic_open(&af, path);
    if (rc == MS_OK) rc = ms_atomic_write(&af, data, n);
    if (rc == MS_OK) rc = ms_atomic_commit(&af);
    ms_atomic_abort(&af); /* no-op after a successful commit */
    return rc;
}

/* ---- directories and globs -------------------------------------------- */

ms_status ms_mkdirs(const char *path) {
    char buf[4096];
    struct stat st;
    size_t n = strlen(path);
    if (n == 0) return ms_error(MS_ERR_ARG, "mkdirs: empty path");
    if (n >= sizeof buf) return ms_error(MS_ERR_ARG, "%.64s...: path too long", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        if (buf[i - 1] == '/') continue; /* "a//b" */
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return io_fail(MS_ERR_IO, buf, "mkdir", errno);
        buf[i] = c;
    }
    if (stat(path, &st) != 0) return io_fail(MS_ERR_IO, path, "stat", errno);
    if (!S_ISDIR(st.st_mode)) return ms_error(MS_ERR_IO, "%s: exists and is not a directory", path);
    return MS_OK;
}

void ms_path_dir(char *d) {
    size_t n = strlen(d);
    while (n > 1 && d[n - 1] == '/')
        d[--n] = 0;
    char *slash = strrchr(d, '/');
    if (!slash)
        strcpy(d, ".");
    else if (slash == d)
        d[1] = 0;
    else
        *slash = 0;
}

/* The kernel pseudo file system directory dir is on (proc, sysfs, ...),
 * where no output can be made, not even by root, whom access(2) lets
 * through; NULL if none (or dir cannot be asked). */
static const char *pseudo_fs(const char *dir) {
    static const struct {
        uint32_t magic;
        const char *name;
    } fs[] = {{PROC_SUPER_MAGIC, "proc"},
              {SYSFS_MAGIC, "sysfs"},
              {CGROUP_SUPER_MAGIC, "cgroup"},
              {CGROUP2_SUPER_MAGIC, "cgroup2"},
              {DEBUGFS_MAGIC, "debugfs"},
              {TRACEFS_MAGIC, "tracefs"},
              {SECURITYFS_MAGIC, "securityfs"},
              {PSTOREFS_MAGIC, "pstore"},
              {BPF_FS_MAGIC, "bpf"}};
    struct statfs sf;
    if (statfs(dir, &sf) != 0) return NULL;
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++)
        if ((uint32_t)sf.f_type == fs[i].magic) return fs[i].name;
    return NULL;
}

/* MS_OK if directory dir, existing and writable by access(2), can hold a
 * new file of path; else MS_ERR_ARG naming both. */
static ms_status check_dir_makes_files(const char *path, const char *dir) {
    const char *fs = pseudo_fs(dir);
    if (fs)
        return ms_error(MS_ERR_ARG,
                        "%s: directory '%s' is on %s, a kernel pseudo file system: no file can "
                        "be made there",
                        path, dir, fs);
    return MS_OK;
}

ms_status ms_path_check_replaceable(const char *path) {
    MS_TRY(ms_path_check_writable(path, 0));
    return refuse_unreplaceable(path);
}

ms_status ms_path_check_writable(const char *path, int is_dir) {
    char d[4096];
    struct stat st;
    size_t n = strlen(path);
    if (n == 0) return ms_error(MS_ERR_ARG, "empty path");
    if (n >= sizeof d) return ms_error(MS_ERR_ARG, "%.64s...: path too long", path);
    if (stat(path, &st) == 0) {
        if (is_dir && !S_ISDIR(st.st_mode))
            return ms_error(MS_ERR_ARG, "%s: exists and is not a directory", path);
        if (!is_dir && S_ISDIR(st.st_mode))
            return ms_error(MS_ERR_ARG, "%s: is a directory, not a file", path);
        if (access(path, W_OK | (is_dir ? X_OK : 0)) != 0)
            return ms_error(MS_ERR_ARG, "%s: not writable: %s", path, strerror(errno));
        if (is_dir) return check_dir_makes_files(path, path);
    } else if (errno != ENOENT && errno != ENOTDIR) {
        return ms_error(MS_ERR_ARG, "%s: stat: %s", path, strerror(errno));
    }
    memcpy(d, path, n + 1);
    for (;;) { /* the directory that will hold it, or the nearest existing ancestor */
        ms_path_dir(d);
        if (stat(d, &st) == 0) {
            if (!S_ISDIR(st.st_mode))
                return ms_error(MS_ERR_ARG, "%s: '%s' is not a directory", path, d);
            if (access(d, W_OK | X_OK) != 0)
                return ms_error(MS_ERR_ARG, "%s: directory '%s' is not writable: %s", path, d,
                                strerror(errno));
            return check_dir_makes_files(path, d);
        }
        if (errno == ENOTDIR) continue; /* a file further up: named when reached */
        if (errno != ENOENT)
            return ms_error(MS_ERR_ARG, "%s: directory '%s': %s", path, d, strerror(errno));
        if (!is_dir || !strcmp(d, ".") || !strcmp(d, "/")) /* the latter: a removed cwd */
            return ms_error(MS_ERR_ARG, "%s: directory '%s' does not exist", path, d);
    }
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* glob(3) sorts with the locale's collation; the result is re-sorted with
 * strcmp so the order is the same on every machine. */
ms_status ms_glob(const char *pattern, char ***paths, int *count) {
    glob_t g;
    ms_status rc = MS_OK;
    char **out = NULL;
    size_t i = 0;
    *paths = NULL;
    *count = 0;
    int r = glob(pattern, 0, NULL, &g);
    if (r == GLOB_NOMATCH) return ms_error(MS_ERR_NOTFOUND, "%s: no files match", pattern);
    if (r == GLOB_NOSPACE) return ms_error(MS_ERR_NOMEM, "%s: glob: out of memory", pattern);
    if (r != 0) return ms_error(MS_ERR_IO, "%s: glob: read error", pattern);
    if (g.gl_pathc > (size_t)INT32_MAX) {
        rc = ms_error(MS_ERR_RANGE, "%s: too many matches (%zu)", pattern, g.gl_pathc);
        goto out;
    }
    out = calloc(g.gl_pathc ? g.gl_pathc : 1, sizeof *out);
    if (!out) {
        rc = ms_error(MS_ERR_NOMEM, "%s: glob: out of memory", pattern);
        goto out;
    }
    for (i = 0; i < g.gl_pathc; i++) {
        out[i] = strdup(g.gl_pathv[i]);
        if (!out[i]) {
            rc = ms_error(MS_ERR_NOMEM, "%s: glob: out of memory", pattern);
            goto out;
        }
    }
    qsort(out, g.gl_pathc, sizeof *out, cmp_str);
    *paths = out;
    *count = (int)g.gl_pathc;
    out = NULL;
out:
    if (out) ms_paths_free(out, (int)i);
    globfree(&g);
    return rc;
}

ms_status ms_glob_or_path(const char *pattern, char ***paths, int *count) {
    struct stat sb;
    if (stat(pattern, &sb) != 0) return ms_glob(pattern, paths, count);
    char **out = calloc(1, sizeof *out);
    if (out) out[0] = strdup(pattern);
    if (!out || !out[0]) {
        free(out);
        return ms_error(MS_ERR_NOMEM, "%s: out of memory", pattern);
    }
    *paths = out;
    *count = 1;
    return MS_OK;
}

ms_status ms_glob_escape(const char *s, char *out, size_t cap) {
    size_t n = 0;
    for (const char *c = s; *c; c++) {
        if (n + 3 > cap) return ms_error(MS_ERR_RANGE, "%s: path too long for a pattern", s);
        if (strchr("\\*?[", *c)) out[n++] = '\\';
        out[n++] = *c;
    }
    if (n + 1 > cap) return ms_error(MS_ERR_RANGE, "%s: path too long for a pattern", s);
    out[n] = '\0';
    return MS_OK;
}

void ms_paths_free(char **paths, int count) {
    if (!paths) return;
    for (int i = 0; i < count; i++)
        free(paths[i]);
    free(paths);
}

int ms_path_is_input(const char *out, const char *in, char *match, size_t cap) {
    struct stat so, si;
    char **paths = NULL;
    int n = 0, hit = 0;
    if (!out || !*out || !in || !*in || stat(out, &so) != 0 || S_ISDIR(so.st_mode)) return 0;
    if (ms_glob_or_path(in, &paths, &n) != MS_OK) return 0; /* named by the reader */
    for (int i = 0; i < n && !hit; i++) {
        hit = stat(paths[i], &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino;
        if (hit && match && cap) snprintf(match, cap, "%s", paths[i]);
    }
    ms_paths_free(paths, n);
    return hit;
}

/* path's parent directory into parent ("." for a bare name, "/" at the root); returns its
 * last name. */
static const char *split_parent(const char *path, char *parent, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (slash == path)
        snprintf(parent, cap, "/");
    else
        snprintf(parent, cap, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    return slash ? slash + 1 : path;
}

/* path as an absolute path that may not exist yet: its longest existing ancestor resolved
 * (realpath: links, "..", "."), the names below it appended ("." dropped, ".." taking off the
 * name before it).  "" when it does not fit in cap or no ancestor resolves. */
static void resolved_loose(const char *path, char *out, size_t cap) {
    char head[PATH_MAX], real[PATH_MAX], tail[PATH_MAX] = "";
    out[0] = 0;
    if (snprintf(head, sizeof head, "%s", path) >= (int)sizeof head) return;
    for (;;) {
        if (realpath(head, real)) break;
        if (!strcmp(head, ".") || !strcmp(head, "/")) return; /* a working directory gone */
        char *slash = strrchr(head, '/');
        while (slash && slash > head && slash[1] == 0) { /* "a/b/": the trailing slash */
            *slash = 0;
            slash = strrchr(head, '/');
        }
        char t[PATH_MAX];
        const char *name = slash ? slash + 1 : head;
        if (snprintf(t, sizeof t, "%s%s%s", name, *tail ? "/" : "", tail) >= (int)sizeof t) return;
        snprintf(tail, sizeof tail, "%s", t);
        if (!slash)
            snprintf(head, sizeof head, ".");
        else if (slash == head)
            snprintf(head, sizeof head, "/");
        else
            *slash = 0;
    }
    size_t len = strlen(real);
    for (char *save = NULL, *n = strtok_r(tail, "/", &save); n; n = strtok_r(NULL, "/", &save)) {
        if (!strcmp(n, ".")) continue;
        if (!strcmp(n, "..")) {
            char *slash = strrchr(real, '/');
            len = slash && slash != real ? (size_t)(slash - real) : 1;
            real[len] = 0;
            continue;
        }
        int k = snprintf(real + len, sizeof real - len, "%s%s", len > 1 ? "/" : "", n);
        if (k < 0 || (size_t)k >= sizeof real - len) return;
        len += (size_t)k;
    }
    snprintf(out, cap, "%s", real);
}

int ms_path_same(const char *a, const char *b) {
    struct stat sa, sb;
    if (!a || !*a || !b || !*b) return 0;
    int ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (ea || eb) return 0;
    /* neither exists yet: by their absolute names, directories not made yet included (two
     * outputs in a --run-dir the command makes were "different") */
    char ra[PATH_MAX], rb[PATH_MAX];
    resolved_loose(a, ra, sizeof ra);
    resolved_loose(b, rb, sizeof rb);
    return *ra && !strcmp(ra, rb);
}

int ms_path_named_in_dir(const char *file, const char *dir, const char *const *names, char *match,
                         size_t cap) {
    if (!file || !*file || !dir || !*dir) return 0;
    char parent[4096];
    const char *base = split_parent(file, parent, sizeof parent);
    struct stat sp, sd;
    int ep = stat(parent, &sp) == 0, ed = stat(dir, &sd) == 0;
    if (ep && ed && (sp.st_dev != sd.st_dev || sp.st_ino != sd.st_ino)) return 0;
    if (ep != ed) return 0;
    if (!ep) { /* neither made yet: by their absolute names */
        char rp[PATH_MAX], rd[PATH_MAX];
        resolved_loose(parent, rp, sizeof rp);
        resolved_loose(dir, rd, sizeof rd);
        if (!*rp || strcmp(rp, rd)) return 0;
    }
    for (int i = 0; names && names[i]; i++)
        if (fnmatch(names[i], base, FNM_PERIOD) == 0) {
            if (match && cap) snprintf(match, cap, "%s", names[i]);
            return 1;
        }
    return 0;
}

int ms_path_in_dir(const char *file, const char *dir, const char *const *names, char *match,
                   size_t cap) {
    char esc[4300], pat[4400];
    if (!dir || !*dir || ms_glob_escape(dir, esc, sizeof esc) != MS_OK) return 0;
    for (int i = 0; names && names[i]; i++) {
        snprintf(pat, sizeof pat, "%s/%s", esc, names[i]);
        if (ms_path_is_input(file, pat, match, cap)) return 1;
    }
    return 0;
}

ms_status ms_path_check_dir(const char *opt, const char *path, const char *what) {
    struct stat sb;
    int err = stat(path, &sb) != 0 ? errno : 0;
    if (!err && S_ISDIR(sb.st_mode)) return MS_OK;
    return ms_error(MS_ERR_ARG, "%s %s %s%s%s%s", opt, path,
                    err == ENOENT ? "does not exist"
                    : err         ? strerror(err)
                                  : "is a file, not a directory",
                    what ? " (" : "", what ? what : "", what ? ")" : "");
}
