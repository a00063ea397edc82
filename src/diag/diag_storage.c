/* diag_storage.c - the storage check: write a file of --storage-mb MB of
 * random bytes into --storage-dir, fsync it, drop it from the page cache,
 * read it back, compare CRC32Cs, remove it.  MB/s both ways; any error
 * fails the check naming the file and the errno text. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/fileio.h"
#include "base/rng.h"
#include "base/timeutil.h"
#include "diag/diag_internal.h"

#define ST_CHUNK ((size_t)1 << 20)

static ms_status io_err(const char *path, const char *op) {
    return ms_error(MS_ERR_IO, "%s: %s: %s", path, op, strerror(errno));
}

/* Write mb chunks of random words; *crc of what was written; fsync. */
static ms_status write_file(const char *path, uint64_t *buf, int mb, uint64_t seed, uint32_t *crc) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return io_err(path, "create");
    ms_status st = MS_OK;
    *crc = 0;
    for (int c = 0; c < mb && st == MS_OK; c++) {
        uint64_t base = ms_rng_u64(seed, 4, (uint64_t)c); /* a draw a chunk (ms_rng_mix64) */
        for (size_t i = 0; i < ST_CHUNK / 8; i++)
            buf[i] = ms_rng_mix_at(base, i);
        *crc = ms_crc32c(*crc, buf, ST_CHUNK);
        st = ms_fd_write_all(fd, path, buf, ST_CHUNK);
    }
    if (st == MS_OK && fsync(fd) != 0) st = io_err(path, "fsync");
    if (st == MS_OK) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); /* read from the device */
    if (close(fd) != 0 && st == MS_OK) st = io_err(path, "close");
    return st;
}

/* Read the file back (mb chunks); *crc of what was read. */
static ms_status read_file(const char *path, uint64_t *buf, int mb, int corrupt, uint32_t *crc) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return io_err(path, "open for reading");
    ms_status st = MS_OK;
    *crc = 0;
    for (int c = 0; c < mb && st == MS_OK; c++) {
        for (size_t off = 0; off < ST_CHUNK && st == MS_OK;) {
            ssize_t n = read(fd, (char *)buf + off, ST_CHUNK - off);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0)
                st = n < 0 ? io_err(path, "read")
                           : ms_error(MS_ERR_IO, "%s: shorter than written (%zu of %d MB)", path,
                                      (size_t)c, mb);
            else
                off += (size_t)n;
        }
        if (corrupt && c == mb / 2) ((unsigned char *)buf)[12345] ^= 0x01; /* injected */
        *crc = ms_crc32c(*crc, buf, ST_CHUNK);
    }
    close(fd);
    return st;
}

/* Write, read back and compare; the rates into r. */
static ms_status round_trip(const diag_config *c, const char *path, int corrupt, diag_result *r) {
    uint64_t *buf = malloc(ST_CHUNK);
    if (!buf) return ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    uint32_t wcrc = 0, rcrc = 0;
    double t0 = ms_now();
    ms_status st = write_file(path, buf, c->storage_mb, (uint64_t)(t0 * 1e6), &wcrc);
    double t1 = ms_now();
    if (st == MS_OK) st = read_file(path, buf, c->storage_mb, corrupt, &rcrc);
    double t2 = ms_now();
    free(buf);
    if (unlink(path) != 0 && errno != ENOENT && st == MS_OK) st = io_err(path, "remove");
    MS_TRY(st);
    r->value = c->storage_mb * 1.048576 / (t1 - t0 > 0 ? t1 - t0 : 1e-9);
    r->aux[0] = c->storage_mb * 1.048576 / (t2 - t1 > 0 ? t2 - t1 : 1e-9);
    if (wcrc != rcrc)
        return ms_error(MS_ERR_IO, "%s: read back CRC32C %08x != written %08x (%d MB)", path, rcrc,
                        wcrc, c->storage_mb);
    return MS_OK;
}

void diag_check_storage(const diag_config *c, const diag_report *rep, diag_result *r) {
    *r = (diag_result){.name = "storage", .ok = 1, .unit = "MB/s", .aux_name = {"read_mbps"}};
    if (!c->storage_dir || !*c->storage_dir) {
        r->skipped = 1;
        diag_detail(r, "skipped: no --storage-dir DIR given");
        return;
    }
    struct stat sb; /* a directory missing on this node (a lost mount, a typo) said as such */
    if (stat(c->storage_dir, &sb) != 0) {
        int e = errno;
        r->ok = 0;
        diag_detail(r, "FAILED: --storage-dir %s: %s%s", c->storage_dir, strerror(e),
                    e == ENOENT ? " on this node (a missing mount? every node of a job needs it)"
                                : "");
        return;
    }
    char path[4300];
    snprintf(path, sizeof path, "%s/.megascale-diag-%s-%d-r%d.tmp", c->storage_dir, rep->host,
             (int)getpid(), rep->rank);
    int corrupt = diag_fault(c, "diag:storage", rep->rank);
    ms_status st = round_trip(c, path, corrupt, r);
    if (st != MS_OK) {
        r->ok = 0;
        diag_detail(r, "FAILED: %s%s", ms_errmsg(),
                    corrupt ? " [injected fault diag:storage]" : "");
        return;
    }
    diag_detail(r, "%d MB in %s: write + fsync %.0f MB/s, read %.0f MB/s, CRC32C match",
                c->storage_mb, c->storage_dir, r->value, r->aux[0]);
}
