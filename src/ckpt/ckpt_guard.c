/* ckpt_guard.c - what keeps a second run from destroying commits: the
 * checkpoint directory's lock (one writing run at a time).
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
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "ckpt/ckpt_internal.h"

#define LOCK_NAME "lock"
#define LOCK_WAIT_TRIES 20 /* x 100 ms: a predecessor that is still exiting */

ms_status ckpt_dir_lock(const char *root, int *out) {
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
                        "--ckpt-dir %s is in use by another run (%s holds %s); two runs "
                        "writing one checkpoint directory replace each other's commits: stop "
                        "that run, or give this one another --ckpt-dir",
                        root, *holder ? holder : "a process that has not yet written its name",
                        path);
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
