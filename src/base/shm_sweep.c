/* shm_sweep.c - files left in shared memory by killed processes, found
 * through /proc and removed (see shm_sweep.h for why "unused" is known). */
#include "base/shm_sweep.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#define SWEEP_MAX 4096 /* files considered in one sweep */

typedef struct {
    dev_t dev;
    ino_t ino;
    uint64_t size;
    int used;
    char name[256];
} cand;

static double file_age(const struct stat *st) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    double m = (double)st->st_mtim.tv_sec + 1e-9 * (double)st->st_mtim.tv_nsec;
    double c = (double)st->st_ctim.tv_sec + 1e-9 * (double)st->st_ctim.tv_nsec;
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec - (m > c ? m : c);
}

static void mark(cand *c, int n, dev_t dev, ino_t ino) {
    for (int i = 0; i < n; i++)
        if (c[i].dev == dev && c[i].ino == ino) c[i].used = 1;
}

/* The effective uid of process pid (its status file), -1 if gone. */
static long proc_euid(const char *pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%s/status", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long uid = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long real, eff;
        if (sscanf(line, "Uid: %lu %lu", &real, &eff) == 2) {
            uid = (long)eff;
            break;
        }
    }
    fclose(f);
    return uid;
}

/* Mark the candidates process pid holds open.  0 read (or gone), -1 not
 * readable. */
static int scan_fds(const char *pid, cand *c, int n) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%s/fd", pid);
    DIR *d = opendir(path);
    if (!d) return errno == EACCES || errno == EPERM ? -1 : 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st;
        if (e->d_name[0] == '.') continue;
        if (fstatat(dirfd(d), e->d_name, &st, 0) == 0 && S_ISREG(st.st_mode))
            mark(c, n, st.st_dev, st.st_ino);
    }
    closedir(d);
    return 0;
}

/* Mark the candidates process pid maps ("start-end perms offset MAJ:MIN
 * inode path" a line).  0 read (or gone), -1 not readable. */
static int scan_maps(const char *pid, cand *c, int n) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%s/maps", pid);
    FILE *f = fopen(path, "r");
    if (!f) return errno == EACCES || errno == EPERM ? -1 : 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        unsigned maj, min;
        unsigned long long ino;
        if (sscanf(line, "%*s %*s %*s %x:%x %llu", &maj, &min, &ino) == 3 && ino)
            mark(c, n, makedev(maj, min), (ino_t)ino);
    }
    free(line);
    fclose(f);
    return 0;
}

/* Mark every candidate a live process maps or holds; the processes of this
 * user that cannot be read are counted in *unreadable. */
static void scan_procs(cand *c, int n, int *unreadable) {
    DIR *d = opendir("/proc");
    if (!d) { /* nothing can be known: every file counts as in use */
        for (int i = 0; i < n; i++)
            c[i].used = 1;
        return;
    }
    long me = (long)geteuid();
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        /* fds before maps: a file being created is held open until mapped */
        int a = scan_fds(e->d_name, c, n), b = scan_maps(e->d_name, c, n);
        if ((a || b) && (me == 0 || proc_euid(e->d_name) == me)) ++*unreadable;
    }
    closedir(d);
}

ms_status ms_sweep_unused(const char *dir, const char *prefix, double min_age_s, int do_remove,
                          ms_sweep_result *r) {
    memset(r, 0, sizeof *r);
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return MS_OK;
        return ms_error(MS_ERR_IO, "sweep %s: %s", dir, strerror(errno));
    }
    cand *c = NULL;
    size_t plen = strlen(prefix);
    uid_t me = geteuid();
    int n = 0, cap = 0;
    struct dirent *e;
    while (n < SWEEP_MAX && (e = readdir(d))) {
        struct stat st;
        if (strncmp(e->d_name, prefix, plen) || strlen(e->d_name) >= sizeof c[0].name) continue;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (!S_ISREG(st.st_mode) || st.st_uid != me || file_age(&st) < min_age_s) continue;
        if (n == cap) {
            cand *g = realloc(c, sizeof *c * (size_t)(cap = cap ? 2 * cap : 16));
            if (!g) {
                closedir(d);
                free(c);
                return ms_error(MS_ERR_NOMEM, "sweep %s: out of memory", dir);
            }
            c = g;
        }
        memset(&c[n], 0, sizeof c[n]);
        c[n].dev = st.st_dev;
        c[n].ino = st.st_ino;
        c[n].size = (uint64_t)st.st_size;
        snprintf(c[n].name, sizeof c[n].name, "%s", e->d_name);
        n++;
    }
    r->found = n;
    if (n) scan_procs(c, n, &r->unreadable);
    for (int i = 0; i < n; i++) {
        if (c[i].used) {
            r->in_use++;
            continue;
        }
        if (do_remove && unlinkat(dirfd(d), c[i].name, 0) != 0) continue;
        r->removed++;
        r->bytes += c[i].size;
    }
    closedir(d);
    free(c);
    return MS_OK;
}

void ms_shm_host_name(char *out, size_t n) {
    char h[256] = {0};
    if (gethostname(h, sizeof h - 1) != 0) h[0] = 0;
    h[strcspn(h, ".")] = 0;
    snprintf(out, n, "%s", h);
}

ms_status ms_sweep_mpi_shm(int do_remove, ms_sweep_result *r) {
    char host[256], prefix[300];
    ms_shm_host_name(host, sizeof host);
    if (!host[0]) {
        memset(r, 0, sizeof *r);
        return MS_OK;
    }
    snprintf(prefix, sizeof prefix, "vader_segment.%s.", host);
    return ms_sweep_unused("/dev/shm", prefix, 2.0, do_remove, r);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

int ms_sweep_mpirun_session(const char *tmp, long pid) {
    char host[256], path[4096];
    ms_shm_host_name(host, sizeof host);
    if (!host[0] || pid <= 0) return 0;
    snprintf(path, sizeof path, "%s/ompi.%s.%lu/pid.%ld", tmp && tmp[0] ? tmp : "/tmp", host,
             (unsigned long)geteuid(), pid);
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) return 0;
    return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) == 0 ? 1 : -1;
}
