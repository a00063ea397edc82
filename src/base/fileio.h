/* fileio.h - checked file I/O: every failure returns a status whose message
 * names the file and the errno text.  Atomic replace follows Redis' rdbSave:
 * write "<path>.tmp.<pid>", fflush, fsync, rename over <path>, fsync the
 * directory.  A reader therefore sees either the old file or the new one.
 * Thread-safe (no shared state).
 */
#ifndef MS_FILEIO_H
#define MS_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

/* Size of a regular file; MS_ERR_FORMAT (bad input) naming what else it is (a directory, a
 * FIFO, a device), MS_ERR_NOTFOUND or MS_ERR_IO when it cannot be stat()ed. */
ms_status ms_file_size(const char *path, uint64_t *size);
struct stat;
/* What a file that is not a regular one is, for messages ("a directory", "a FIFO", "a
 * character device", ...); NULL for a regular file. */
const char *ms_file_kind(const struct stat *sb);

/* The most ms_file_read_all reads: none of the files it reads whole (a
 * tokenizer, a state, a dump, a history) comes near it, and a stream given
 * by mistake (/dev/zero, a multi-GB data shard) ends in an error naming it,
 * not in all of memory.  A run's own files that grow with its scale (a
 * checkpoint manifest, the metrics) use ms_file_read_max without it. */
#define MS_FILE_READ_ALL_MAX ((size_t)1 << 30)
/* Read a whole file into a malloc'd buffer (caller frees); a NUL byte is
 * appended (not counted in *len) so text can be parsed in place.  A
 * directory is MS_ERR_ARG, "PATH is a directory, not a file"; one larger
 * than MS_FILE_READ_ALL_MAX MS_ERR_FORMAT, "PATH: larger than N bytes". */
ms_status ms_file_read_all(const char *path, char **data, size_t *len);
/* The same for a file that must hold at most max bytes (a config file):
 * more is MS_ERR_FORMAT naming the file and the limit, without reading
 * further (/dev/zero ends). */
ms_status ms_file_read_max(const char *path, size_t max, char **data, size_t *len);

/* Write all n bytes of buf to fd (retrying short writes and EINTR), or fail
 * naming `what` (a path, "stdout") and the errno text ("short write" when
 * write returns 0). */
ms_status ms_fd_write_all(int fd, const char *what, const void *buf, size_t n);

/* Read exactly n bytes at offset, or fail naming path and what was short. */
ms_status ms_file_pread(FILE *f, const char *path, void *dst, size_t n, uint64_t offset);

/* Read-only memory map of a whole file.  ms_file_unmap releases it.  A
 * page read past the end of a file that shrank meanwhile (SIGBUS) prints
 * the file's name, calls the hook set below, and exits with 4. */
ms_status ms_file_map(const char *path, const void **data, size_t *len);
/* The function the SIGBUS exit above calls first (NULL: none), and a SIGINT, SIGTERM or
 * SIGHUP that ends the process (ms_cleanup_add): what the command removes on any failure.  It
 * runs in a signal handler, so it may call only async-signal-safe functions (unlink, rmdir,
 * open, getdents64, close). */
void ms_file_set_sigbus_hook(void (*fn)(void));

/* What a command has staged and not yet published, removed when a SIGINT, SIGTERM or SIGHUP
 * left at its default action ends the process (or the SIGBUS exit above), the newest entry
 * first, before the signal takes its course.  ms_cleanup_add installs that handler once (only
 * for a signal nobody else handles: a trainer's stop request stays its own) and returns an id
 * for ms_cleanup_drop (0: not registered, out of slots or memory; dropping 0 is a no-op).
 * Drop the entry once the path is published or removed by the command itself. */
typedef enum {
    MS_CLEAN_FILE = 1, /* unlink */
    MS_CLEAN_DIR,      /* rmdir: only if empty (a directory the command made) */
    MS_CLEAN_DIR_FILES /* its files (not subdirectories), then rmdir: a staging directory */
} ms_clean_kind;
int ms_cleanup_add(const char *path, ms_clean_kind kind);
/* Unlink each entry of the open directory dirfd (read from its start) whose name want(name,
 * arg) takes ("." and ".." never): the number removed.  Async-signal-safe (getdents64,
 * unlinkat), for the signal handlers' cleanup; removing while reading may skip entries, so a
 * caller that must remove all calls it again until it removes none. */
int ms_unlinkat_matching(int dirfd, int (*want)(const char *name, const void *arg),
                         const void *arg);
void ms_cleanup_drop(int id);
/* Remove what is registered now: the signal handlers' work, async-signal-safe, before the
 * process ends (the entries are not released for reuse). */
void ms_cleanup_run(void);
/* on: the command publishes what it staged (a rename that makes it a commit, and what follows
 * it): a signal meanwhile removes nothing (it could catch the staged files half renamed, and
 * remove a committed output's); off: as before.  A signal then leaves what a kill leaves. */
void ms_cleanup_hold(int on);
void ms_file_unmap(const void *data, size_t len);

/* Atomic writer.  ms_atomic_open creates the temp file; ms_atomic_write
 * appends; ms_atomic_commit flushes, fsyncs, renames and fsyncs the
 * directory; ms_atomic_abort removes the temp file.  After any failed call the
 * writer must still be closed with ms_atomic_abort; the target path is never
 * touched unless commit succeeds.  A path that is a symbolic link is replaced
 * by the new file (the rename's semantics), except a link to a file descriptor
 * (/dev/stdout), which is refused: the system keeps it.  The temp file is made
 * new (O_EXCL), never opened through a link planted at its name. */
typedef struct {
    FILE *f;
    char path[4096];
    char tmp[4096 + 32];
    int clean; /* the temp file's ms_cleanup_add id (0: none) */
} ms_atomic_file;

ms_status ms_atomic_open(ms_atomic_file *af, const char *path);
/* 1 if path, or a symbolic link on the way from it, names one of this process's file
 * descriptors (/dev/stdout, /dev/fd/1, /proc/self/fd/1, /proc/PID/fd/N): a link the system
 * keeps, which a rename into place would replace by a regular file. */
int ms_path_names_fd(const char *path);
ms_status ms_atomic_write(ms_atomic_file *af, const void *data, size_t n);
ms_status ms_atomic_printf(ms_atomic_file *af, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
ms_status ms_atomic_commit(ms_atomic_file *af);
void ms_atomic_abort(ms_atomic_file *af);

/* Convenience: atomically replace `path` with `n` bytes. */
ms_status ms_file_write_atomic(const char *path, const void *data, size_t n);

/* path cut to its directory in place ("a/b/" -> "a", "b" -> ".", "/a" -> "/"). */
void ms_path_dir(char *path);

/* mkdir -p; ok if it exists. */
ms_status ms_mkdirs(const char *path);

/* Whether a later write to `path` can succeed, checked before the work
 * that produces it (an output path named by an option).  is_dir 0: a file
 * written there (created, replaced atomically or appended): path is not a
 * directory, its directory exists and is writable, and an existing file is
 * writable.  is_dir 1: a directory made with ms_mkdirs: it is a writable
 * directory, or its nearest existing ancestor is.  A directory on a kernel
 * pseudo file system (/proc, /sys, ...) is not, even for root.  MS_ERR_ARG
 * naming the path and the directory at fault. */
ms_status ms_path_check_writable(const char *path, int is_dir);
/* ms_path_check_writable(path, 0) for a file written whole and renamed
 * into place (ms_atomic_open): an existing path that is not a regular file
 * (a device such as /dev/null, a FIFO, a socket) is refused too, since the
 * rename would replace it (as root, /dev/null itself). */
ms_status ms_path_check_replaceable(const char *path);

/* Expand a glob pattern into a sorted list of paths (caller frees with
 * ms_paths_free).  No match is MS_ERR_NOTFOUND naming the pattern. */
ms_status ms_glob(const char *pattern, char ***paths, int *count);

/* ms_glob for a pattern a user gave: one that names an existing file or
 * directory as it is ("a[1].txt") is that path alone, whatever else it
 * would match. */
ms_status ms_glob_or_path(const char *pattern, char ***paths, int *count);

/* s with glob(3)'s special characters (\ * ? [) escaped, into out (cap
 * bytes): a pattern matching only s, to put a user's directory or name
 * into a pattern.  MS_ERR_RANGE naming s when it does not fit. */
ms_status ms_glob_escape(const char *s, char *out, size_t cap);
void ms_paths_free(char **paths, int count);

/* A directory that option opt names for reading (--data-dir DIR): MS_OK,
 * or MS_ERR_ARG "OPT PATH does not exist" / "OPT PATH is a file, not a
 * directory" (what = what it should hold, in words, appended in parentheses;
 * may be NULL). */
ms_status ms_path_check_dir(const char *opt, const char *path, const char *what);

/* Whether writing the output `out` would replace or append to one of the
 * inputs that `in` names (a path, or a pattern a user gave, read as
 * ms_glob_or_path reads it): the same file, by device and inode, whatever
 * the spelling ("./a", a link).  An output or input that does not exist
 * (yet) is none.  Returns 1 and copies the input's path into match (cap
 * bytes; may be NULL) when it is one, else 0. */
int ms_path_is_input(const char *out, const char *in, char *match, size_t cap);
/* Whether paths a and b name the same file, one that may not exist yet (two outputs a
 * command will write): by device and inode when both exist; when neither does, by their
 * absolute names (the longest existing ancestor's real path, then the names below it: also
 * in directories not made yet); one that exists and one that does not are different.  1 or
 * 0. */
int ms_path_same(const char *a, const char *b);
/* Whether `file` (that may not exist yet) lies directly in directory dir (that may not exist
 * yet either: then by absolute names, as ms_path_same) under a name that matches one of the
 * fnmatch(3) patterns names (NULL-terminated): a file a command will write there.  Returns 1 and
 * copies the matching pattern into match (cap bytes; may be NULL). */
int ms_path_named_in_dir(const char *file, const char *dir, const char *const *names, char *match,
                         size_t cap);
/* Whether the file `file` is one of the files directly in directory dir
 * whose names match one of the glob(3) patterns names (NULL-terminated):
 * the files a command writes into dir, or reads from it.  By identity, as
 * ms_path_is_input; a file or a directory that does not exist is none.
 * Returns 1 and copies the file's path in dir into match (cap bytes; may
 * be NULL) when it is one, else 0. */
int ms_path_in_dir(const char *file, const char *dir, const char *const *names, char *match,
                   size_t cap);

#endif
