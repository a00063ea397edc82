/* ckpt_snapshot.c - stage 1: host snapshots in /dev/shm.
 *
 * A slot is one file, SHM_DIR (ckpt_options.shm_dir, default /dev/shm)/
 * megascale-ckpt-<hash of the checkpoint root's real path>-r<rank>-s<slot>,
 * mapped shared: an 8 KiB binary header (magic, version, `complete`, job
 * id, step, offsets, sizes, CRC32C of the meta text and of the data, the
 * pid that opened it, the checkpoint root's real path), the meta text
 * (JSON: model, layout, trainer state, the runs with their data offsets)
 * and the data (per run: param, m, v, fp32).  Stage 1 clears `complete`,
 * writes the meta and the data (the copies cut into 4 MB pieces shared by
 * the OpenMP threads, each piece's CRC32C taken during its copy from host
 * memory or right after its copy from a device, while it is still in the
 * cache; the pieces' CRCs joined into the data's), then sets `complete`
 * (release order), so a process killed in the middle
 * leaves a slot that the loader rejects.  The data CRC is checked before a
 * snapshot is resumed from (ckpt_snap_verify) and before stage 2 writes it
 * to disk (ckpt_slot_verify), so a byte damaged in host memory is never
 * loaded nor committed.  The file outlives the process; the job id (DIR/job)
 * ties it to one checkpoint directory, so a snapshot of a deleted run is
 * never loaded.  Pages are allocated when the slot is opened (fallocate),
 * so stage 1 is a copy into memory that is already there, and /dev/shm
 * running full shows up then.
 *
 * A process holds a shared flock on each slot it has open (ckpt_slot_open
 * to ckpt_slot_close; the kernel drops it when the process dies), so
 * removal (ckpt_shm_list, ckpt_shm_remove_beyond, ckpt_shm_orphans) can
 * tell a live run's slot (never removed) from a dead one's: it takes the
 * exclusive lock without waiting first.  ckpt_shm_orphans finds (and
 * removes) the slots of this user whose recorded checkpoint directory no
 * longer exists: no path reaches them.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/fileio.h"
#include "base/hash.h"
#include "base/log.h"
#include "ckpt/ckpt_internal.h"

#define SHM_MAGIC "MSCKSHM"
#define SHM_VERSION 2
#define HDR_BYTES 8192
#define SHM_ROOT_MAX 4096

/* docs/formats.md, "Host-memory snapshots": little-endian, these offsets. */
typedef struct {
    char magic[8];                         /* 0: "MSCKSHM\0" */
    uint32_t version;                      /* 8: SHM_VERSION */
    uint32_t complete;                     /* 12: 1 once meta and data are written */
    uint64_t job;                          /* 16 */
    int64_t step;                          /* 24 */
    uint64_t meta_off, meta_len, meta_cap; /* 32, 40, 48: bytes */
    uint64_t data_off, data_elems;         /* 56 (bytes), 64 (floats) */
    uint64_t file_bytes;                   /* 72 */
    uint32_t meta_crc;                     /* 80: CRC32C of the meta text */
    uint32_t data_crc;                     /* 84: CRC32C of the data_elems * 4 data bytes */
    uint32_t pid;                          /* 88: the process that opened the slot last */
    uint32_t root_len;                     /* 92: strlen(root); 0: none recorded */
    char root[SHM_ROOT_MAX]; /* 96: real path of the checkpoint directory, NUL-terminated */
} shm_header;

_Static_assert(sizeof(shm_header) <= HDR_BYTES, "the snapshot header outgrew its bytes");
_Static_assert(offsetof(shm_header, complete) == 12 && offsetof(shm_header, data_off) == 56 &&
                   offsetof(shm_header, data_crc) == 84 && offsetof(shm_header, root) == 96,
               "docs/formats.md gives these offsets");

struct ckpt_slot {
    char path[4096];
    int fd; /* open while the slot is: it holds the shared flock */
    uint8_t *map;
    size_t len;
    shm_header *h;
};

static uint64_t round_page(uint64_t x) {
    return (x + 4095) / 4096 * 4096;
}

const char *ckpt_shm_dir(const char *shm_dir) {
    return shm_dir && *shm_dir ? shm_dir : "/dev/shm";
}

ms_status ckpt_shm_dir_check(const char *shm_dir) {
    struct stat sb;
    const char *shm = ckpt_shm_dir(shm_dir);
    int e = stat(shm, &sb) != 0 ? errno : S_ISDIR(sb.st_mode) ? 0 : ENOTDIR;
    if (e)
        return ms_error(MS_ERR_ARG,
                        "--ckpt-shm-dir %s (MS_CKPT_SHM_DIR): %s: the host-memory snapshots "
                        "need an existing directory",
                        shm, strerror(e));
    return MS_OK;
}

/* FNV-1a 64 of the real path of root. */
static ms_status root_hash(const char *root, uint64_t *h) {
    char *rp = realpath(root, NULL);
    if (!rp) return ms_error(MS_ERR_IO, "%s: realpath: %s", root, strerror(errno));
    /* the basis of gpt_model.c's streams (FNV's, a digit short): the
     * snapshots' names depend on it, so snapshots of an older build are found */
    *h = ms_fnv1a_str(1469598103934665603ULL, rp);
    free(rp);
    return MS_OK;
}

ms_status ckpt_shm_path(char *buf, size_t n, const char *shm_dir, const char *root, int rank,
                        int slot) {
    uint64_t h = 0;
    MS_TRY(root_hash(root, &h));
    snprintf(buf, n, "%s/megascale-ckpt-%016" PRIx64 "-r%05d-s%d", ckpt_shm_dir(shm_dir), h, rank,
             slot);
    return MS_OK;
}

ms_status ckpt_job_id(const char *root, int create, uint64_t *job) {
    char path[4200], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/job", root);
    ms_status st = ms_file_read_all(path, &text, &len);
    if (st == MS_OK) {
        char *end;
        *job = strtoull(text, &end, 16);
        int bad = end == text || *job == 0;
        free(text);
        if (!bad) return MS_OK;
        if (!create) return ms_error(MS_ERR_FORMAT, "%s: not a job id", path);
    } else if (st != MS_ERR_NOTFOUND || !create) {
        return st;
    }
    return ckpt_job_new(root, job);
}

ms_status ckpt_job_new(const char *root, uint64_t *job) {
    char path[4200];
    snprintf(path, sizeof path, "%s/job", root);
    /* a fresh random id: nothing in /dev/shm can claim it */
    uint64_t x = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &x, sizeof x) != (ssize_t)sizeof x)
        x = (uint64_t)time(NULL) * 6364136223846793005ULL ^ (uint64_t)getpid();
    if (fd >= 0) close(fd);
    if (!x) x = 1;
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%016" PRIx64 "\n", x);
    MS_TRY(ms_file_write_atomic(path, buf, (size_t)n));
    *job = x;
    return MS_OK;
}

/* Open (creating) path and take its shared lock; again when a remover
 * unlinked it between the open and the lock (its exclusive lock, taken
 * first, makes this wait), so the lock is always on the file the name
 * holds.  -1 and errno on failure. */
static int open_locked(const char *path) {
    for (int tries = 0; tries < 100; tries++) {
        int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) return -1;
        struct stat a, b;
        int rc;
        while ((rc = flock(fd, LOCK_SH)) != 0 && errno == EINTR) {
        }
        if (rc == 0 && fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino)
            return fd;
        int err = errno;
        close(fd);
        if (rc != 0) {
            errno = err;
            return -1;
        }
    }
    errno = EAGAIN;
    return -1;
}

ms_status ckpt_slot_open(ckpt_slot **out, const char *path, const char *root, uint64_t data_elems,
                         size_t meta_cap) {
    ms_status st = MS_OK;
    ckpt_slot *s = calloc(1, sizeof *s);
    if (!s) return ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    snprintf(s->path, sizeof s->path, "%s", path);
    s->fd = -1;
    uint64_t moff = HDR_BYTES, mcap = round_page(meta_cap), doff = moff + mcap;
    uint64_t bytes = round_page(doff + data_elems * sizeof(float));
    struct stat sb;
    char *rp = root ? realpath(root, NULL) : NULL;
    int fresh = 0, fd = s->fd = open_locked(path);
    if (fd < 0) {
        st = ms_error(MS_ERR_IO, "%s: open snapshot: %s", path, strerror(errno));
        goto out;
    }
    if (fstat(fd, &sb) != 0) {
        st = ms_error(MS_ERR_IO, "%s: fstat snapshot: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) { /* (a FIFO opened O_RDWR: ftruncate said "Invalid argument") */
        st = ms_error(MS_ERR_FORMAT,
                      "%s: not a regular file (%s), where this rank's host-memory snapshot goes: "
                      "remove it, or give another --ckpt-shm-dir",
                      path, ms_file_kind(&sb));
        goto out;
    }
    fresh = sb.st_size == 0; /* made here (or an empty one): removed again on a failure */
    if ((uint64_t)sb.st_size != bytes && ftruncate(fd, (off_t)bytes)) {
        st = ms_error(MS_ERR_IO, "%s: size snapshot to %" PRIu64 " bytes: %s", path, bytes,
                      strerror(errno));
        goto out;
    }
    int err = posix_fallocate(fd, 0, (off_t)bytes);
    if (err) {
        st = ms_error(MS_ERR_IO, "%s: allocate %.1f MB for the snapshot: %s", path,
                      (double)bytes / 1e6, strerror(err));
        goto out;
    }
    s->map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        st = ms_error(MS_ERR_IO, "%s: mmap snapshot: %s", path, strerror(errno));
        goto out;
    }
    s->len = bytes;
    for (uint64_t off = 0; off < bytes; off += 4096) /* dirty every page now, not in stage 1 */
        ((volatile uint8_t *)s->map)[off] = s->map[off];
    s->h = (shm_header *)s->map;
    shm_header *h = s->h;
    if ((uint64_t)sb.st_size != bytes || memcmp(h->magic, SHM_MAGIC, 8) ||
        h->version != SHM_VERSION || h->meta_cap != mcap || h->data_elems != data_elems ||
        h->meta_off != moff || h->data_off != doff || h->file_bytes != bytes) {
        memset(h, 0, sizeof *h); /* another layout: start empty */
        memcpy(h->magic, SHM_MAGIC, 8);
        h->version = SHM_VERSION;
        h->meta_off = moff;
        h->meta_cap = mcap;
        h->data_off = doff;
        h->data_elems = data_elems;
        h->file_bytes = bytes;
        h->step = -1;
    }
    /* who holds it, and the directory it belongs to (ckpt_shm_orphans) */
    h->pid = (uint32_t)getpid();
    size_t rl = rp && strlen(rp) < SHM_ROOT_MAX ? strlen(rp) : 0;
    memset(h->root, 0, sizeof h->root);
    memcpy(h->root, rp ? rp : "", rl);
    h->root_len = (uint32_t)rl;
out:
    free(rp);
    if (st != MS_OK) { /* one this start made is not left behind, empty (a file-size limit, a
                          full /dev/shm) */
        ckpt_slot_close(s, fresh);
        return st;
    }
    *out = s;
    return MS_OK;
}

void ckpt_slot_close(ckpt_slot *s, int remove) {
    if (!s) return;
    if (s->map) munmap(s->map, s->len);
    if (remove) unlink(s->path); /* before the lock goes: nobody removes a newer file */
    if (s->fd >= 0) close(s->fd);
    free(s);
}

const char *ckpt_slot_path(const ckpt_slot *s) {
    return s->path;
}

int ckpt_slot_step(const ckpt_slot *s, uint64_t job) {
    int done = __atomic_load_n(&s->h->complete, __ATOMIC_ACQUIRE);
    return done && s->h->job == job ? (int)s->h->step : -1;
}

int ckpt_slot_is_empty(const ckpt_slot *s) {
    return !__atomic_load_n(&s->h->complete, __ATOMIC_ACQUIRE);
}

const float *ckpt_slot_data(const ckpt_slot *s) {
    return (const float *)(s->map + s->h->data_off);
}

#define COPY_CHUNK ((size_t)1 << 20) /* elements */

typedef struct {
    float *dst;
    const float *src; /* NULL: data no run covers, only CRC'd */
    size_t n;
    int host;     /* src is host memory: copied and CRC'd in one pass (ms_crc32c_copy) */
    uint32_t crc; /* of dst[0, n) once done */
} copy_job;

/* The CRC32C of n bytes at p, in COPY_CHUNK pieces over the OpenMP threads
 * when parallel (joined with ms_crc32c_combine). */
static uint32_t data_crc(const uint8_t *p, uint64_t n, int parallel) {
    const uint64_t piece = COPY_CHUNK * sizeof(float);
    long np = (long)((n + piece - 1) / piece);
    uint32_t *c = parallel && np > 1 ? malloc(sizeof *c * (size_t)np) : NULL;
    if (!c) return ms_crc32c(0, p, n);
#pragma omp parallel for schedule(dynamic, 1)
    for (long i = 0; i < np; i++) {
        uint64_t off = (uint64_t)i * piece;
        c[i] = ms_crc32c(0, p + off, n - off < piece ? n - off : piece);
    }
    uint32_t crc = 0;
    for (long i = 0; i < np; i++) {
        uint64_t off = (uint64_t)i * piece;
        crc = ms_crc32c_combine(crc, c[i], n - off < piece ? n - off : piece);
    }
    free(c);
    return crc;
}

/* Append the jobs for dst[0, n) (from src, or CRC only when src is NULL),
 * COPY_CHUNK elements at most each. */
static ms_status add_jobs(copy_job **jobs, size_t *nj, size_t *cap, float *dst, const float *src,
                          size_t n, int host, const char *path) {
    for (size_t o = 0; o < n; o += COPY_CHUNK) {
        if (*nj == *cap) {
            size_t nc = *cap ? 2 * *cap : 256;
            copy_job *j2 = realloc(*jobs, nc * sizeof **jobs);
            if (!j2) return ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
            *jobs = j2;
            *cap = nc;
        }
        size_t c = n - o < COPY_CHUNK ? n - o : COPY_CHUNK;
        (*jobs)[(*nj)++] = (copy_job){dst + o, src ? src + o : NULL, c, host, 0};
    }
    return MS_OK;
}

/* The jobs that fill the data section in order: the runs' pieces, and CRC-
 * only jobs for what no run covers (so the jobs' CRCs join into the whole
 * section's). */
static ms_status plan_copies(const ckpt_slot *s, const ckpt_snap_src *src, copy_job **out,
                             size_t *n_out) {
    float *data = (float *)(s->map + s->h->data_off);
    copy_job *jobs = NULL;
    size_t nj = 0, cap = 0;
    uint64_t at = 0; /* the next element of the section not yet planned */
    ms_status st = MS_OK;
    for (int i = 0; st == MS_OK && i < src->n_runs; i++) {
        const ckpt_run *r = &src->runs[i];
        size_t n = r->end - r->begin;
        for (int k = 0; st == MS_OK && k < 3; k++)
            for (uint64_t b = r->begin; st == MS_OK && b < r->end;) { /* a piece per box row */
                size_t pos = 0, len = ckpt_run_seg(r, b, &pos);
                const float *from =
                    k == 0 ? src->params + pos : (k == 1 ? r->mom : r->var) + (pos - r->state_off);
                uint64_t to = r->data_off + (uint64_t)k * n + (b - r->begin);
                if (to < at)
                    st = ms_error(MS_ERR_INTERNAL, "%s: snapshot runs overlap or are out of order",
                                  s->path);
                if (st == MS_OK && to > at)
                    st = add_jobs(&jobs, &nj, &cap, data + at, NULL, to - at, 0, s->path);
                if (st == MS_OK)
                    st = add_jobs(&jobs, &nj, &cap, data + to, from, len,
                                  !src->be->is_device(src->be, from), s->path);
                at = to + len;
                b += len;
            }
    }
    if (st == MS_OK && at < s->h->data_elems)
        st = add_jobs(&jobs, &nj, &cap, data + at, NULL, s->h->data_elems - at, 0, s->path);
    if (st != MS_OK) {
        free(jobs);
        return st;
    }
    *out = jobs;
    *n_out = nj;
    return MS_OK;
}

ms_status ckpt_slot_write(ckpt_slot *s, uint64_t job, int step, const char *meta,
                          const ckpt_snap_src *src) {
    shm_header *h = s->h;
    size_t ml = strlen(meta);
    if (ml + 1 > h->meta_cap)
        return ms_error(MS_ERR_INTERNAL, "%s: snapshot meta of %zu bytes exceeds %" PRIu64, s->path,
                        ml, h->meta_cap);
    if (ckpt_runs_elems(src->runs, src->n_runs) * 3 > h->data_elems)
        return ms_error(MS_ERR_INTERNAL, "%s: snapshot slot too small", s->path);
    copy_job *jobs = NULL;
    size_t nj = 0;
    MS_TRY(plan_copies(s, src, &jobs, &nj));
    __atomic_store_n(&h->complete, 0, __ATOMIC_RELEASE);
    h->job = job;
    h->step = step;
    memcpy(s->map + h->meta_off, meta, ml + 1);
    h->meta_len = ml;
    h->meta_crc = ms_crc32c(0, meta, ml);
    /* the copies, shared by the threads: from host memory copied and CRC'd
     * in one pass; from a device one to_host per piece, then its CRC while
     * it is in the cache (and other threads' copies run meanwhile) */
    be_backend *be = src->be;
    be->sync(be); /* what a host-memory source holds is final */
    for (int half = 0; half < 2; half++) {
        long lo = half ? (long)nj / 2 : 0, hi = half ? (long)nj : (long)nj / 2;
        if (half) ckpt_fault_kill(src->fault, "stage1:mid", step, src->fault_first);
#pragma omp parallel for schedule(dynamic, 1)
        for (long j = lo; j < hi; j++) {
            copy_job *c = &jobs[j];
            size_t bytes = c->n * sizeof(float);
            if (c->host) {
                c->crc = ms_crc32c_copy(0, c->dst, c->src, bytes);
                continue;
            }
            if (c->src) be->to_host(be, c->dst, c->src, bytes);
            c->crc = ms_crc32c(0, c->dst, bytes);
        }
    }
    uint32_t crc = 0;
    for (size_t j = 0; j < nj; j++)
        crc = ms_crc32c_combine(crc, jobs[j].crc, jobs[j].n * sizeof(float));
    free(jobs);
    h->data_crc = crc;
    __atomic_store_n(&h->complete, 1, __ATOMIC_RELEASE);
    return MS_OK;
}

ms_status ckpt_slot_verify(const ckpt_slot *s) {
    const shm_header *h = s->h;
    uint32_t crc = data_crc(s->map + h->data_off, h->data_elems * sizeof(float), 0);
    if (crc == h->data_crc) return MS_OK;
    return ms_error(MS_ERR_FORMAT,
                    "%s: the snapshot of step %" PRId64
                    " fails its data CRC (CRC32C 0x%08x, the header says 0x%08x): damaged in "
                    "host memory",
                    s->path, h->step, crc, h->data_crc);
}

void ckpt_slot_damage(ckpt_slot *s) {
    uint64_t bytes = s->h->data_elems * sizeof(float);
    if (bytes) s->map[s->h->data_off + bytes / 2] ^= 0x10;
}

char *ckpt_snap_meta(uint64_t job, int step, int rank, int world, int dp, const gpt_config *model,
                     const char *optimizer, const ckpt_train_state *tr, const ckpt_run *runs,
                     int n_runs) {
    char jid[24];
    snprintf(jid, sizeof jid, "%016" PRIx64, job);
    cJSON *o = cJSON_CreateObject(), *rs;
    int ok = o && cJSON_AddStringToObject(o, "format", "megascale-shm-snapshot") &&
             cJSON_AddStringToObject(o, "job", jid) && cJSON_AddNumberToObject(o, "step", step) &&
             cJSON_AddNumberToObject(o, "rank", rank) &&
             cJSON_AddNumberToObject(o, "world", world) && cJSON_AddNumberToObject(o, "dp", dp) &&
             cJSON_AddItemToObject(o, "model", ckpt_json_model(model)) &&
             cJSON_AddStringToObject(o, "optimizer", optimizer) &&
             cJSON_AddItemToObject(o, "trainer", ckpt_json_trainer(tr)) &&
             (rs = cJSON_AddArrayToObject(o, "runs"));
    for (int i = 0; ok && i < n_runs; i++) {
        double v[6] = {
            runs[i].tensor,           (double)runs[i].begin,      (double)runs[i].end,
            (double)runs[i].data_off, (double)runs[i].box_off[0], (double)runs[i].box_off[1]};
        cJSON *a = cJSON_CreateDoubleArray(v, 6);
        ok = a && cJSON_AddItemToArray(rs, a);
        if (!ok) cJSON_Delete(a);
    }
    char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return text;
}

typedef struct {
    const void *map;
    size_t len;
} snap_handle;

/* Parse the meta JSON of a snapshot into view. */
static ms_status parse_meta(const char *path, const char *text, size_t len, ckpt_snap_view *v) {
    ms_status st = MS_OK;
    cJSON *o = cJSON_ParseWithLength(text, len);
    const cJSON *x, *rs, *r;
    if (!o) return ms_error(MS_ERR_FORMAT, "%s: snapshot meta is not JSON", path);
#define NUM(key, dst)                                                                              \
    if (st == MS_OK) {                                                                             \
        x = cJSON_GetObjectItemCaseSensitive(o, key);                                              \
        if (!cJSON_IsNumber(x))                                                                    \
            st = ms_error(MS_ERR_FORMAT, "%s: snapshot meta lacks '%s'", path, key);               \
        else                                                                                       \
            dst = (int)x->valuedouble;                                                             \
    }
    NUM("step", v->step);
    NUM("rank", v->rank);
    NUM("world", v->world);
    NUM("dp", v->dp);
#undef NUM
    if (st == MS_OK)
        st = ckpt_json_model_parse(cJSON_GetObjectItemCaseSensitive(o, "model"), &v->model, path);
    if (st == MS_OK)
        st = ckpt_json_trainer_parse(cJSON_GetObjectItemCaseSensitive(o, "trainer"), &v->trainer,
                                     path);
    x = cJSON_GetObjectItemCaseSensitive(o, "optimizer");
    if (st == MS_OK && cJSON_IsString(x))
        snprintf(v->optimizer, sizeof v->optimizer, "%s", x->valuestring);
    rs = cJSON_GetObjectItemCaseSensitive(o, "runs");
    if (st == MS_OK && !cJSON_IsArray(rs))
        st = ms_error(MS_ERR_FORMAT, "%s: snapshot meta lacks 'runs'", path);
    if (st == MS_OK) {
        v->n_runs = cJSON_GetArraySize(rs);
        v->runs = calloc((size_t)v->n_runs + 1, sizeof *v->runs);
        if (!v->runs) st = ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    }
    int i = 0;
    if (st != MS_OK) rs = NULL;
    cJSON_ArrayForEach(r, rs) {
        double d[6] = {0, 0, 0, 0, 0, 0};
        for (int k = 0; k < 6; k++) {
            const cJSON *e = cJSON_GetArrayItem(r, k);
            d[k] = cJSON_IsNumber(e) ? e->valuedouble : (k < 4 ? -1 : 0);
        }
        ckpt_run *run = &v->runs[i++];
        run->tensor = (int)d[0];
        run->begin = (uint64_t)d[1];
        run->end = (uint64_t)d[2];
        run->data_off = (uint64_t)d[3];
        run->box_off[0] = (int64_t)d[4];
        run->box_off[1] = (int64_t)d[5];
        if (d[0] < 0 || d[1] < 0 || d[2] < d[1] || d[3] < 0 ||
            run->data_off + 3 * (run->end - run->begin) > v->data_elems) {
            st = ms_error(MS_ERR_FORMAT, "%s: snapshot run %d is out of range", path, i - 1);
            break;
        }
    }
    cJSON_Delete(o);
    return st;
}

/* Do the header's sizes lie within the file's len bytes?  Each compared
 * without overflow: 2^62 floats are 0 bytes in 64 bits, and such a size
 * passed, its data CRC that of no bytes at all. */
static int sizes_fit(const shm_header *h, size_t len) {
    const uint64_t n = len;
    return h->file_bytes == n && h->meta_off <= n && h->meta_cap <= n - h->meta_off &&
           h->meta_len < h->meta_cap && h->data_off <= n &&
           h->data_elems <= (n - h->data_off) / sizeof(float);
}

ms_status ckpt_snap_open(const char *path, ckpt_snap_view *v, void **handle) {
    const void *map = NULL;
    size_t len = 0;
    memset(v, 0, sizeof *v);
    *handle = NULL;
    MS_TRY(ms_file_map(path, &map, &len));
    const shm_header *h = map;
    const uint8_t *p = map;
    ms_status st = MS_OK;
    if (len < HDR_BYTES || memcmp(h->magic, SHM_MAGIC, 8))
        st = ms_error(MS_ERR_FORMAT, "%s: not a megascale snapshot", path);
    else if (h->version != SHM_VERSION)
        st = ms_error(MS_ERR_FORMAT, "%s: a snapshot of format version %u, this build reads %d",
                      path, h->version, SHM_VERSION);
    else if (!sizes_fit(h, len))
        st = ms_error(MS_ERR_FORMAT,
                      "%s: snapshot sizes disagree with the file (%zu bytes; the header says "
                      "%" PRIu64 " bytes, meta %" PRIu64 " of %" PRIu64 " at %" PRIu64 ", %" PRIu64
                      " floats at %" PRIu64 ")",
                      path, len, h->file_bytes, h->meta_len, h->meta_cap, h->meta_off,
                      h->data_elems, h->data_off);
    else if (!__atomic_load_n(&h->complete, __ATOMIC_ACQUIRE))
        st = h->step < 0 ? ms_error(MS_ERR_NOTFOUND, /* nothing there yet: not a fault */
                                    "%s: an empty snapshot slot (the process ended before its "
                                    "first stage-1 copy)",
                                    path)
                         : ms_error(MS_ERR_FORMAT,
                                    "%s: incomplete snapshot of step %" PRId64
                                    " (the process died during stage 1)",
                                    path, h->step);
    else if (ms_crc32c(0, p + h->meta_off, h->meta_len) != h->meta_crc)
        st = ms_error(MS_ERR_FORMAT, "%s: snapshot meta fails its CRC", path);
    if (st == MS_OK) {
        v->data_elems = h->data_elems;
        v->data_crc = h->data_crc;
        v->job = h->job;
        v->complete = 1;
        st = parse_meta(path, (const char *)p + h->meta_off, h->meta_len, v);
        if (st == MS_OK && v->step != h->step)
            st = ms_error(MS_ERR_FORMAT, "%s: snapshot header step %" PRId64 " != meta step %d",
                          path, h->step, v->step);
        v->data = (const float *)(p + h->data_off);
    }
    snap_handle *sh = st == MS_OK ? malloc(sizeof *sh) : NULL;
    if (st == MS_OK && !sh) st = ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    if (st != MS_OK) {
        free(v->runs);
        memset(v, 0, sizeof *v);
        ms_file_unmap(map, len);
        return st;
    }
    sh->map = map;
    sh->len = len;
    *handle = sh;
    return MS_OK;
}

ms_status ckpt_snap_verify(const char *path, const ckpt_snap_view *v) {
    uint32_t crc = data_crc((const uint8_t *)v->data, v->data_elems * sizeof(float), 1);
    if (crc == v->data_crc) return MS_OK;
    return ms_error(MS_ERR_FORMAT,
                    "%s: the snapshot of step %d fails its data CRC (CRC32C 0x%08x, the header "
                    "says 0x%08x): damaged in host memory",
                    path, v->step, crc, v->data_crc);
}

void ckpt_snap_close(ckpt_snap_view *v, void *handle) {
    snap_handle *sh = handle;
    free(v->runs);
    memset(v, 0, sizeof *v);
    if (sh) {
        ms_file_unmap(sh->map, sh->len);
        free(sh);
    }
}

/* Unlink path if it still names the file fd (whose exclusive lock the
 * caller holds): 0, or -1 and errno. */
static int unlink_locked(int fd, const char *path) {
    struct stat a, b;
    if (fstat(fd, &a) != 0 || stat(path, &b) != 0) return -1;
    if (a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
        errno = ENOENT; /* replaced since: that file is not ours to remove */
        return -1;
    }
    return unlink(path);
}

/* Remove the slot file path unless a live process holds it: its exclusive
 * lock, without waiting.  0 removed (or already gone), 1 held (*pid: the
 * process that opened it last), 2 not a regular file (no snapshot: kept),
 * -1 and errno. */
static int slot_remove(const char *path, uint32_t *pid) {
    /* O_NONBLOCK: a FIFO of the name (anyone may make one in /dev/shm) hung the open */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK), rc = 0;
    if (fd < 0) return errno == ENOENT ? 0 : errno == ELOOP ? 2 : -1; /* ELOOP: a link */
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return 2;
    }
    shm_header h;
    *pid = pread(fd, &h, sizeof h, 0) >= (ssize_t)offsetof(shm_header, root) ? h.pid : 0;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0)
        rc = errno == EWOULDBLOCK ? 1 : -1;
    else if (unlink_locked(fd, path) != 0)
        rc = errno == ENOENT ? 0 : -1;
    int err = errno;
    close(fd);
    errno = err;
    return rc;
}

/* The pattern of the snapshots in shm_dir of one job (job: its root's hash
 * in hex) or of all (job "*"): shm_dir escaped, so that only its own files
 * match whatever characters its name holds. */
static ms_status snap_pattern(char *pat, size_t cap, const char *shm_dir, const char *job) {
    char dir[8400];
    MS_TRY(ms_glob_escape(ckpt_shm_dir(shm_dir), dir, sizeof dir));
    if ((size_t)snprintf(pat, cap, "%s/megascale-ckpt-%s-r*-s*", dir, job) >= cap)
        return ms_error(MS_ERR_RANGE, "%s: path too long", shm_dir);
    return MS_OK;
}

void ckpt_shm_remove_beyond(const char *root, const char *shm_dir, int world) {
    uint64_t h = 0;
    char pat[8600], job[20];
    char **paths = NULL;
    int n = 0;
    uint32_t pid;
    if (root_hash(root, &h) != MS_OK) return;
    snprintf(job, sizeof job, "%016" PRIx64, h);
    if (snap_pattern(pat, sizeof pat, shm_dir, job) != MS_OK) return;
    if (ms_glob(pat, &paths, &n) != MS_OK) return;
    size_t pre = strlen(ckpt_shm_dir(shm_dir)) + strlen("/megascale-ckpt-") + 16;
    for (int i = 0; i < n; i++) {
        const char *r = paths[i] + pre; /* "-r00001-s0" */
        if (!strncmp(r, "-r", 2) && atoi(r + 2) >= world) slot_remove(paths[i], &pid);
    }
    ms_paths_free(paths, n);
}

/* The step of root's newest commit that passes the quick check (sizes and
 * headers), or -1 when it has none. */
static int newest_commit(const char *root) {
    int *steps = NULL, n = 0, best = -1;
    if (ckpt_list_steps(root, &steps, &n) != MS_OK) return -1;
    for (int i = 0; i < n && best < 0; i++) { /* newest first */
        char dir[4300];
        ckpt_manifest mf;
        ckpt_step_path(dir, sizeof dir, root, steps[i]);
        if (ckpt_validate(dir, 0, &mf) == MS_OK) {
            best = mf.step;
            ckpt_manifest_free(&mf);
        }
    }
    free(steps);
    return best;
}

ms_status ckpt_shm_list(const char *root, const char *shm_dir, int remove, int force) {
    uint64_t h = 0, job = 0;
    char pat[8600], hex[20];
    char **paths = NULL;
    int n = 0;
    MS_TRY(ckpt_shm_dir_check(shm_dir));
    MS_TRY(root_hash(root, &h));
    if (ckpt_job_id(root, 0, &job) != MS_OK) job = 0;
    snprintf(hex, sizeof hex, "%016" PRIx64, h);
    MS_TRY(snap_pattern(pat, sizeof pat, shm_dir, hex));
    if (ms_glob(pat, &paths, &n) != MS_OK) {
        printf("no host-memory snapshots of %s in %s\n", root, ckpt_shm_dir(shm_dir));
        return MS_OK;
    }
    int newest = newest_commit(root);
    for (int i = 0; i < n; i++) {
        ckpt_snap_view v;
        void *hd;
        int only = 0, step = -1; /* a state of this job newer than every commit: its only copy */
        if (ckpt_snap_open(paths[i], &v, &hd) == MS_OK && ckpt_snap_verify(paths[i], &v) == MS_OK) {
            only = v.job == job && v.step > newest;
            step = v.step;
            printf("shm  step %8d  rank %d of %d  %s%s\n", v.step, v.rank, v.world, paths[i],
                   v.job != job ? "  (another job: ignored)"
                   : only       ? "  (newer than every commit: train --resume auto persists it)"
                                : "");
        } else {
            printf("shm  invalid         %s  (%s)\n", paths[i], ms_errmsg());
        }
        ckpt_snap_close(&v, hd);
        if (remove && only && !force) {
            printf("     kept %s: step %d is newer than every commit (%s%d), its only copy: "
                   "--force 1 removes it\n",
                   paths[i], step, newest < 0 ? "none" : "the newest is step ",
                   newest < 0 ? 0 : newest);
            continue;
        }
        uint32_t pid = 0;
        int rc = remove ? slot_remove(paths[i], &pid) : 0;
        if (remove && rc == 0) printf("     removed %s\n", paths[i]);
        if (remove && rc == 1)
            printf("     kept %s: a live process holds it (pid %u opened it)\n", paths[i], pid);
        if (remove && rc == 2) printf("     kept %s: not a regular file (no snapshot)\n", paths[i]);
        if (remove && rc < 0) printf("     could not remove %s: %s\n", paths[i], strerror(errno));
    }
    ms_paths_free(paths, n);
    return MS_OK;
}

/* One slot for ckpt_shm_orphans: 0 not an orphan (or not this user's, or
 * held, or no snapshot at all: said when print), 1 an orphan (removed when
 * remove), 2 no directory recorded (an older format); *bytes its size. */
static int orphan_one(const char *path, int remove, int print, uint64_t *bytes) {
    struct stat sb;
    shm_header h;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK), rc = 0; /* a FIFO */
    if (fd < 0) { /* a link (ELOOP): said, as another kind of file is (it was skipped unsaid) */
        if (print && errno == ELOOP)
            printf("kept     %s  (a symbolic link, not a snapshot)\n", path);
        return 0;
    }
    if (fstat(fd, &sb) != 0 || sb.st_uid != geteuid()) goto out;
    if (!S_ISREG(sb.st_mode)) {
        if (print) printf("kept     %s  (%s, not a snapshot)\n", path, ms_file_kind(&sb));
        goto out;
    }
    *bytes = (uint64_t)sb.st_size;
    ssize_t got = pread(fd, &h, sizeof h, 0);
    if (got != (ssize_t)sizeof h || memcmp(h.magic, SHM_MAGIC, 8)) {
        if (print)
            printf("unknown  %s  (not a snapshot: %s; kept)\n", path,
                   got != (ssize_t)sizeof h ? "shorter than a snapshot's header"
                                            : "no snapshot's magic");
        goto out; /* (not one of an older format: that one has the magic) */
    }
    if (h.version != SHM_VERSION || h.root_len == 0 || h.root_len >= SHM_ROOT_MAX) {
        if (print)
            printf("unknown  %s  (no checkpoint directory recorded: format version %u; kept)\n",
                   path, h.version);
        rc = 2;
        goto out;
    }
    h.root[h.root_len] = 0;
    struct stat rb;
    if (stat(h.root, &rb) == 0 || (errno != ENOENT && errno != ENOTDIR)) goto out;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (print)
            printf("held     %s  (%s is gone, but a live process holds it: pid %u; kept)\n", path,
                   h.root, h.pid);
        goto out;
    }
    rc = 1;
    if (remove && unlink_locked(fd, path) == 0) {
        if (print)
            printf("removed  %s  (%s is gone; %.1f MB)\n", path, h.root, (double)*bytes / 1e6);
    } else if (remove) { /* ENOENT: replaced by a new run's slot since */
        if (print && errno != ENOENT) printf("failed   %s: unlink: %s\n", path, strerror(errno));
        rc = 0;
    } else if (print) {
        printf("orphan   %s  (%s is gone; %.1f MB)\n", path, h.root, (double)*bytes / 1e6);
    }
out:
    close(fd);
    return rc;
}

ms_status ckpt_shm_orphans(const char *shm_dir, int remove, int print, int *n_orphans,
                           uint64_t *orphan_bytes) {
    char pat[8600];
    char **paths = NULL;
    int n = 0, found = 0, unknown = 0;
    uint64_t total = 0;
    const char *dir = ckpt_shm_dir(shm_dir);
    MS_TRY(ckpt_shm_dir_check(shm_dir));
    MS_TRY(snap_pattern(pat, sizeof pat, shm_dir, "*"));
    if (ms_glob(pat, &paths, &n) != MS_OK) n = 0;
    for (int i = 0; i < n; i++) {
        uint64_t b = 0;
        int rc = orphan_one(paths[i], remove, print, &b);
        if (rc == 1) found++, total += b;
        unknown += rc == 2;
    }
    ms_paths_free(paths, n);
    if (print && !found)
        printf("no orphaned snapshots in %s (of %d snapshot file(s))\n", dir, n);
    else if (print)
        printf("%d orphaned snapshot(s), %.1f MB%s\n", found, (double)total / 1e6,
               remove ? ", removed" : "; --remove 1 removes them");
    if (print && unknown)
        printf(
            "%d snapshot file(s) of an older format record no directory: `megascale ckpt shm DIR "
            "--remove 1` removes those of an existing DIR, rm the others when no run uses "
            "them\n",
            unknown);
    if (n_orphans) *n_orphans = found;
    if (orphan_bytes) *orphan_bytes = total;
    return MS_OK;
}
