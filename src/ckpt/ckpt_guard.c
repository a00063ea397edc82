/* ckpt_guard.c - what keeps a second run or a tool's --out from destroying
 * commits: the checkpoint directory's lock (one writing run at a time) and
 * the check that a tool's output is neither a checkpoint directory, nor in
 * one, nor a file of the commit it reads.
 *
 * The lock is flock(2) on DIR/lock, taken by rank 0 for the manager's
 * lifetime.  The kernel drops it when the process dies however it dies
 * (kill -9 included), so a job the supervisor stops and restarts on the same
 * directory gets it again; on NFS, Linux maps flock to byte-range locks that
 * the server arbitrates between hosts.  The holder writes "pid P on host H
 * since T" into the file, so a refused run can name it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/log.h"
#include "ckpt/ckpt_internal.h"

#define LOCK_NAME "lock"
#define LOCK_WAIT_TRIES 20 /* x 100 ms: a predecessor that is still exiting */

ms_status ckpt_dir_lock(const char *root, const char *flag, int *out) {
    char path[4200], holder[512] = "";
    *out = -1;
    snprintf(path, sizeof path, "%s/%s", root, LOCK_NAME);
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return ms_error(MS_ERR_IO, "%s: open: %s", path, strerror(errno));
    int rc = flock(fd, LOCK_EX | LOCK_NB), err = rc ? errno : 0;
    for (int k = 0; rc != 0 && err == EWOULDBLOCK && k < LOCK_WAIT_TRIES; k++) {
        usleep(100000);
        rc = flock(fd, LOCK_EX | LOCK_NB), err = rc ? errno : 0;
    }
    if (rc != 0) {
        ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
        holder[n > 0 ? n : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        close(fd);
        if (err != EWOULDBLOCK) return ms_error(MS_ERR_IO, "%s: flock: %s", path, strerror(err));
        return ms_error(MS_ERR_ARG,
                        "%s %s is in use by another run (%s holds %s); two runs "
                        "writing one checkpoint directory replace each other's commits: stop "
                        "that run, or give this one another %s",
                        flag, root,
                        *holder ? holder : "a process that has not yet written its name", path,
                        flag);
    }
    char host[256] = "?", when[32] = "?";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = 0;
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int n = snprintf(holder, sizeof holder, "pid %ld on host %s since %s\n", (long)getpid(), host,
                     when);
    /* the holder's name is a courtesy to the next run: a failure to write
     * it does not stop this one */
    if (ftruncate(fd, 0) != 0 || pwrite(fd, holder, (size_t)n, 0) != n)
        ms_warn("%s: could not write the holder's name: %s", path, strerror(errno));
    *out = fd;
    return MS_OK;
}

void ckpt_dir_unlock(int fd) {
    if (fd >= 0) close(fd); /* releases the flock */
}

/* 1 when dir holds what a checkpoint directory holds (step_* or .step_*
 * entries, latest, job, the lock unless lock is 0, or a manifest: a commit
 * itself), the name of the first such entry into what; 0 when it holds none;
 * -1 when it cannot be read (errno). */
static int ckpt_entry(const char *dir, int lock, char *what, size_t n) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) {
        const char *s = e->d_name;
        found = !strncmp(s, "step_", 5) || !strncmp(s, ".step_", 6) || !strcmp(s, "latest") ||
                !strcmp(s, "job") || (lock && !strcmp(s, LOCK_NAME)) || !strcmp(s, CKPT_MANIFEST);
        if (found) snprintf(what, n, "%s", s);
    }
    closedir(d);
    return found;
}

static int is_ckpt_dir(const char *dir, char *what, size_t n) {
    return ckpt_entry(dir, 1, what, n) > 0;
}

ms_status ckpt_out_still_new(const char *out, const char *tool) {
    char what[256];
    int found = ckpt_entry(out, 0, what, sizeof what); /* its own lock aside */
    if (found < 0) return ms_error(MS_ERR_IO, "%s: --out %s: %s", tool, out, strerror(errno));
    if (!found) return MS_OK;
    return ms_error(MS_ERR_ARG,
                    "%s: --out %s was written by another command meanwhile (it now holds %s); "
                    "nothing was written",
                    tool, out, what);
}

int ckpt_latest_target(const char *path, char *out, size_t n) {
    struct stat sb;
    if (!path || !*path || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > 64)
        return 0;
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (strcmp(base, "latest")) return 0;
    char text[80] = {0};
    FILE *f = fopen(path, "r");
    size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    while (got && (text[got - 1] == '\n' || text[got - 1] == '\r' || text[got - 1] == ' '))
        text[--got] = 0;
    size_t digits = strncmp(text, "step_", 5) ? 0 : strspn(text + 5, "0123456789");
    if (!digits || digits > 10 || 5 + digits != got) return 0;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", path);
    ms_path_dir(dir);
    if (snprintf(out, n, "%s/%s", dir, text) >= (int)n) return 0;
    return stat(out, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int ckpt_is_checkpoint(const char *path) {
    char what[256], commit[4300];
    return is_ckpt_dir(path, what, sizeof what) || ckpt_latest_target(path, commit, sizeof commit);
}

int ckpt_is_part(const char *path, char *what, size_t n) {
    char dir[4200], kind[256];
    struct stat sb;
    if (!path || !*path || (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))) return 0;
    snprintf(dir, sizeof dir, "%s", path);
    ms_path_dir(dir);
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    char manifest[4300]; /* a commit: its manifest, not a step_N name alone */
    snprintf(manifest, sizeof manifest, "%s/%s", dir, CKPT_MANIFEST);
    if (stat(manifest, &sb) == 0) { /* a new file too: the commit is pruned with it in it */
        snprintf(what, n, "%s the commit %s", stat(path, &sb) == 0 ? "a file of" : "inside", dir);
        return 1;
    }
    if (stat(path, &sb) != 0) return 0;
    if ((!strcmp(base, "latest") || !strcmp(base, "job") || !strcmp(base, LOCK_NAME)) &&
        is_ckpt_dir(dir, kind, sizeof kind)) {
        snprintf(what, n, "the '%s' file of the checkpoint directory %s", base, dir);
        return 1;
    }
    return 0;
}

static int same_inode(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* The file of the commit src that is out (same inode), if any, into name. */
static int src_file_is(const char *src, const struct stat *out, char *name, size_t n) {
    DIR *d = opendir(src);
    if (!d) return 0;
    struct dirent *e;
    struct stat sb;
    int found = 0;
    while (!found && (e = readdir(d))) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || !strcmp(e->d_name, ".."))) continue;
        found = fstatat(dirfd(d), e->d_name, &sb, 0) == 0 && same_inode(&sb, out);
        if (found) snprintf(name, n, "%s", e->d_name);
    }
    closedir(d);
    return found;
}

/* The checks of ckpt_out_check that need no source. */
static ms_status out_common(const char *out, int is_dir, const char *tool) {
    char parent[4200], what[256];
    struct stat so;
    if (stat(out, &so) == 0 && S_ISDIR(so.st_mode) && is_ckpt_dir(out, what, sizeof what))
        return ms_error(MS_ERR_ARG,
                        "%s: --out %s is a checkpoint directory (it holds %s%s); writing there "
                        "could replace its commits: choose a new or empty directory; nothing "
                        "was written",
                        tool, out, what,
                        what[0] == '.' ? ": a checkpoint being written there now, or one a "
                                         "crash left part way"
                                       : "");
    /* the directory out goes into */
    snprintf(parent, sizeof parent, "%s", out);
    size_t l = strlen(parent);
    while (l > 1 && parent[l - 1] == '/')
        parent[--l] = 0;
    char *slash = strrchr(parent, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else
        slash[slash == parent ? 1 : 0] = 0;
    if (is_ckpt_dir(parent, what, sizeof what))
        return ms_error(MS_ERR_ARG,
                        "%s: --out %s lies in %s, a checkpoint directory (it holds %s); writing "
                        "there could replace its commits: choose another place; nothing was "
                        "written",
                        tool, out, parent, what);
    /* not at the end, after the work; a file is renamed into place: no device or FIFO */
    ms_status st = is_dir ? ms_path_check_writable(out, 1) : ms_path_check_replaceable(out);
    return st == MS_OK ? MS_OK : ms_error_wrap(st, "%s: --out", tool);
}

ms_status ckpt_out_check(const char *src, const char *out, int is_dir, const char *tool) {
    char buf[4200], what[256];
    struct stat so, ss, sr;
    snprintf(buf, sizeof buf, "%s/..", src);
    int have_src = stat(src, &ss) == 0, have_root = stat(buf, &sr) == 0;
    if (stat(out, &so) == 0) {
        if ((have_src && same_inode(&so, &ss)) || (have_root && same_inode(&so, &sr)))
            return ms_error(MS_ERR_ARG,
                            "%s: --out %s is the checkpoint %s reads from (or its directory); "
                            "nothing was written",
                            tool, out, src);
        if (!S_ISDIR(so.st_mode) && have_src && src_file_is(src, &so, what, sizeof what))
            return ms_error(MS_ERR_ARG,
                            "%s: --out %s is %s/%s, a file of the checkpoint being read; nothing "
                            "was written",
                            tool, out, src, what);
    }
    return out_common(out, is_dir, tool);
}

ms_status ckpt_out_precheck(const char *path, const char *out, int is_dir, const char *tool) {
    return ckpt_is_step_dir(path) ? ckpt_out_check(path, out, is_dir, tool)
                                  : out_common(out, is_dir, tool);
}
