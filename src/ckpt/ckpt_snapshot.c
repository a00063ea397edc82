/* ckpt_snapshot.c - stage 1: host snapshots in /dev/shm.
 *
 * A slot is one file, SHM_DIR (ckpt_options.shm_dir, default /dev/shm)/
 * megascale-ckpt-<hash of the checkpoint root's real path>-r<rank>-s<slot>,
 * mapped shared: a 4 KiB binary header (magic, version, `complete`, job id,
 * step, offsets, sizes, CRC32C of the meta text), the meta text (JSON:
 * model, layout, trainer state, the runs with their data offsets) and the
 * data (per run: param, m, v, fp32).  Stage 1 clears `complete`, writes the
 * meta and the data (the copies cut into 4 MB pieces shared by the OpenMP
 * threads), then sets `complete` (release order), so a process
 * killed in the middle leaves a slot that the loader rejects.  The file
 * outlives the process; the job id (DIR/job) ties it to one checkpoint
 * directory, so a snapshot of a deleted run is never loaded.  Pages are
 * allocated when the slot is opened (fallocate), so stage 1 is a copy into
 * memory that is already there, and /dev/shm running full shows up then.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/fileio.h"
#include "base/log.h"
#include "ckpt/ckpt_internal.h"

#define SHM_MAGIC "MSCKSHM"
#define SHM_VERSION 1
#define HDR_BYTES 4096

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t complete; /* 1 once meta and data are written */
    uint64_t job;
    int64_t step;
    uint64_t meta_off, meta_len, meta_cap;
    uint64_t data_off, data_elems;
    uint64_t file_bytes;
    uint32_t meta_crc, pad;
} shm_header;

struct ckpt_slot {
    char path[4096];
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

/* FNV-1a 64 of the real path of root. */
static ms_status root_hash(const char *root, uint64_t *h) {
    char *rp = realpath(root, NULL);
    if (!rp) return ms_error(MS_ERR_IO, "%s: realpath: %s", root, strerror(errno));
    uint64_t x = 1469598103934665603ULL;
    for (const char *s = rp; *s; s++)
        x = (x ^ (uint8_t)*s) * 1099511628211ULL;
    free(rp);
    *h = x;
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

ms_status ckpt_slot_open(ckpt_slot **out, const char *path, uint64_t data_elems, size_t meta_cap) {
    ms_status st = MS_OK;
    ckpt_slot *s = calloc(1, sizeof *s);
    if (!s) return ms_error(MS_ERR_NOMEM, "%s: out of memory", path);
    snprintf(s->path, sizeof s->path, "%s", path);
    uint64_t moff = HDR_BYTES, mcap = round_page(meta_cap), doff = moff + mcap;
    uint64_t bytes = round_page(doff + data_elems * sizeof(float));
    struct stat sb;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        st = ms_error(MS_ERR_IO, "%s: open snapshot: %s", path, strerror(errno));
        goto out;
    }
    if (fstat(fd, &sb) != 0 || ((uint64_t)sb.st_size != bytes && ftruncate(fd, (off_t)bytes))) {
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
        h->version != SHM_VERSION || h->meta_cap != mcap || h->data_elems != data_elems) {
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
out:
    if (fd >= 0) close(fd);
    if (st != MS_OK) {
        ckpt_slot_close(s, 0);
        return st;
    }
    *out = s;
    return MS_OK;
}

void ckpt_slot_close(ckpt_slot *s, int remove) {
    if (!s) return;
    if (s->map) munmap(s->map, s->len);
    if (remove) unlink(s->path);
    free(s);
}

const char *ckpt_slot_path(const ckpt_slot *s) {
    return s->path;
}

int ckpt_slot_step(const ckpt_slot *s, uint64_t job) {
    int done = __atomic_load_n(&s->h->complete, __ATOMIC_ACQUIRE);
    return done && s->h->job == job ? (int)s->h->step : -1;
}

const float *ckpt_slot_data(const ckpt_slot *s) {
    return (const float *)(s->map + s->h->data_off);
}

#define COPY_CHUNK ((size_t)1 << 20) /* elements */

typedef struct {
    float *dst;
    const float *src;
    size_t n;
} copy_job;

ms_status ckpt_slot_write(ckpt_slot *s, uint64_t job, int step, const char *meta,
                          const ckpt_snap_src *src) {
    shm_header *h = s->h;
    size_t ml = strlen(meta);
    if (ml + 1 > h->meta_cap)
        return ms_error(MS_ERR_INTERNAL, "%s: snapshot meta of %zu bytes exceeds %" PRIu64, s->path,
                        ml, h->meta_cap);
    if (ckpt_runs_elems(src->runs, src->n_runs) * 3 > h->data_elems)
        return ms_error(MS_ERR_INTERNAL, "%s: snapshot slot too small", s->path);
    __atomic_store_n(&h->complete, 0, __ATOMIC_RELEASE);
    h->job = job;
    h->step = step;
    memcpy(s->map + h->meta_off, meta, ml + 1);
    h->meta_len = ml;
    h->meta_crc = ms_crc32c(0, meta, ml);
    /* the copies, cut into pieces of at most 4 MB, shared by the threads */
    float *data = (float *)(s->map + h->data_off);
    be_backend *be = src->be;
    size_t nj = 0, cap = 0;
    copy_job *jobs = NULL;
    for (int i = 0; i < src->n_runs; i++) {
        const ckpt_run *r = &src->runs[i];
        size_t n = r->end - r->begin;
        for (int k = 0; k < 3; k++)
            for (uint64_t b = r->begin; b < r->end;) { /* one piece per box row if strided */
                size_t pos = 0, len = ckpt_run_seg(r, b, &pos);
                const float *from =
                    k == 0 ? src->params + pos : (k == 1 ? r->mom : r->var) + (pos - r->state_off);
                float *to = data + r->data_off + (size_t)k * n + (b - r->begin);
                for (size_t o = 0; o < len; o += COPY_CHUNK) {
                    if (nj == cap) {
                        cap = cap ? 2 * cap : 256;
                        copy_job *nj2 = realloc(jobs, cap * sizeof *jobs);
                        if (!nj2) {
                            free(jobs);
                            return ms_error(MS_ERR_NOMEM, "%s: out of memory", s->path);
                        }
                        jobs = nj2;
                    }
                    size_t c = len - o < COPY_CHUNK ? len - o : COPY_CHUNK;
                    jobs[nj++] = (copy_job){to + o, from + o, c};
                }
                b += len;
            }
    }
    for (int half = 0; half < 2; half++) {
        long lo = half ? (long)nj / 2 : 0, hi = half ? (long)nj : (long)nj / 2;
        if (half) ckpt_fault_kill(src->fault, "stage1:mid", step, src->fault_first);
#pragma omp parallel for schedule(dynamic, 1)
        for (long j = lo; j < hi; j++)
            be->to_host(be, jobs[j].dst, jobs[j].src, jobs[j].n * sizeof(float));
    }
    free(jobs);
    __atomic_store_n(&h->complete, 1, __ATOMIC_RELEASE);
    return MS_OK;
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

ms_status ckpt_snap_open(const char *path, ckpt_snap_view *v, void **handle) {
    const void *map = NULL;
    size_t len = 0;
    memset(v, 0, sizeof *v);
    *handle = NULL;
    MS_TRY(ms_file_map(path, &map, &len));
    const shm_header *h = map;
    const uint8_t *p = map;
    ms_status st = MS_OK;
    if (len < HDR_BYTES || memcmp(h->magic, SHM_MAGIC, 8) || h->version != SHM_VERSION)
        st =
            ms_error(MS_ERR_FORMAT, "%s: not a megascale snapshot (version %d)", path, SHM_VERSION);
    else if (h->file_bytes != len || h->meta_off + h->meta_cap > len ||
             h->data_off + h->data_elems * sizeof(float) > len || h->meta_len >= h->meta_cap)
        st = ms_error(MS_ERR_FORMAT, "%s: snapshot sizes disagree with the file (%zu bytes)", path,
                      len);
    else if (!__atomic_load_n(&h->complete, __ATOMIC_ACQUIRE))
        st = ms_error(MS_ERR_FORMAT,
                      "%s: incomplete snapshot of step %" PRId64
                      " (the process died during stage 1)",
                      path, h->step);
    else if (ms_crc32c(0, p + h->meta_off, h->meta_len) != h->meta_crc)
        st = ms_error(MS_ERR_FORMAT, "%s: snapshot meta fails its CRC", path);
    if (st == MS_OK) {
        v->data_elems = h->data_elems;
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

void ckpt_snap_close(ckpt_snap_view *v, void *handle) {
    snap_handle *sh = handle;
    free(v->runs);
    memset(v, 0, sizeof *v);
    if (sh) {
        ms_file_unmap(sh->map, sh->len);
        free(sh);
    }
}

void ckpt_shm_remove_beyond(const char *root, const char *shm_dir, int world) {
    uint64_t h = 0;
    char pat[4200];
    char **paths = NULL;
    int n = 0;
    if (root_hash(root, &h) != MS_OK) return;
    snprintf(pat, sizeof pat, "%s/megascale-ckpt-%016" PRIx64 "-r*-s*", ckpt_shm_dir(shm_dir), h);
    if (ms_glob(pat, &paths, &n) != MS_OK) return;
    for (int i = 0; i < n; i++) {
        const char *r = paths[i] + strlen(pat) - 6; /* "-r00001-s0" */
        if (!strncmp(r, "-r", 2) && atoi(r + 2) >= world) unlink(paths[i]);
    }
    ms_paths_free(paths, n);
}

ms_status ckpt_shm_list(const char *root, const char *shm_dir, int remove) {
    uint64_t h = 0, job = 0;
    char pat[4200];
    char **paths = NULL;
    int n = 0;
    MS_TRY(root_hash(root, &h));
    if (ckpt_job_id(root, 0, &job) != MS_OK) job = 0;
    snprintf(pat, sizeof pat, "%s/megascale-ckpt-%016" PRIx64 "-r*-s*", ckpt_shm_dir(shm_dir), h);
    if (ms_glob(pat, &paths, &n) != MS_OK) {
        printf("no /dev/shm snapshots of %s\n", root);
        return MS_OK;
    }
    for (int i = 0; i < n; i++) {
        ckpt_snap_view v;
        void *hd;
        if (ckpt_snap_open(paths[i], &v, &hd) == MS_OK) {
            printf("shm  step %8d  rank %d of %d  %s%s\n", v.step, v.rank, v.world, paths[i],
                   v.job == job ? "" : "  (another job: ignored)");
            ckpt_snap_close(&v, hd);
        } else {
            printf("shm  invalid         %s  (%s)\n", paths[i], ms_errmsg());
        }
        if (remove && unlink(paths[i]) == 0) printf("     removed %s\n", paths[i]);
    }
    ms_paths_free(paths, n);
    return MS_OK;
}
