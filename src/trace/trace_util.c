/* trace_util.c - rank-file listing, grid coordinates, JSON helpers and the
 * thread layout of a lane (nesting clamp, interval partitioning). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/jsonstr.h"
#include "trace/trace_internal.h"

typedef struct {
    int rank;
    char *path;
} rank_file;

static int cmp_rank_file(const void *a, const void *b) {
    const rank_file *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* The rank in "<prefix>NNNNN<suffix>" (at least one digit), or -1. */
static int rank_of_name(const char *name, const char *prefix, const char *suffix) {
    size_t np = strlen(prefix), ns = strlen(suffix), n = strlen(name);
    if (n <= np + ns || strncmp(name, prefix, np) || strcmp(name + n - ns, suffix)) return -1;
    long r = 0;
    for (size_t i = np; i < n - ns; i++) {
        if (name[i] < '0' || name[i] > '9' || r > (1L << 24)) return -1;
        r = r * 10 + (name[i] - '0');
    }
    return (int)r;
}

int trace_is_input_name(const char *name) {
    return rank_of_name(name, "events_r", ".jsonl") >= 0 ||
           rank_of_name(name, "events_r", ".jsonl.1") >= 0 ||
           rank_of_name(name, "events_r", ".jsonl.new") >= 0 ||
           rank_of_name(name, "hang_r", ".json") >= 0 || !strcmp(name, "hang_driver.json");
}

ms_status trace_rank_files(const char *dir, const char *prefix, const char *suffix, int **ranks,
                           char ***paths, int *n) {
    *ranks = NULL;
    *paths = NULL;
    *n = 0;
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return ms_error(MS_ERR_NOTFOUND, "%s: no such run directory: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return ms_error(MS_ERR_NOTFOUND, "%s: not a directory", dir);
    DIR *d = opendir(dir);
    if (!d) return ms_error(MS_ERR_IO, "%s: opendir: %s", dir, strerror(errno));
    rank_file *files = NULL;
    int cnt = 0, cap = 0;
    ms_status st = MS_OK;
    for (struct dirent *e; st == MS_OK && (e = readdir(d));) {
        int r = rank_of_name(e->d_name, prefix, suffix);
        if (r < 0) continue;
        if (cnt == cap) {
            cap = cap ? 2 * cap : 64;
            rank_file *p = realloc(files, (size_t)cap * sizeof *p);
            if (!p) {
                st = ms_error(MS_ERR_NOMEM, "%s: out of memory", dir);
                break;
            }
            files = p;
        }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        files[cnt].rank = r;
        if (!(files[cnt].path = malloc(len))) {
            st = ms_error(MS_ERR_NOMEM, "%s: out of memory", dir);
            break;
        }
        snprintf(files[cnt++].path, len, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    if (cnt) qsort(files, (size_t)cnt, sizeof *files, cmp_rank_file);
    for (int i = 1; st == MS_OK && i < cnt; i++)
        if (files[i].rank == files[i - 1].rank)
            st = ms_error(MS_ERR_FORMAT, "%s and %s: two files for rank %d", files[i - 1].path,
                          files[i].path, files[i].rank);
    int *rk = st == MS_OK ? malloc((size_t)cnt * sizeof *rk + 1) : NULL;
    char **ps = st == MS_OK ? malloc((size_t)cnt * sizeof *ps + 1) : NULL;
    if (st == MS_OK && (!rk || !ps)) st = ms_error(MS_ERR_NOMEM, "%s: out of memory", dir);
    for (int i = 0; i < cnt; i++) {
        if (st == MS_OK) {
            rk[i] = files[i].rank;
            ps[i] = files[i].path;
        } else {
            free(files[i].path);
        }
    }
    free(files);
    if (st != MS_OK) {
        free(rk);
        free(ps);
        return st;
    }
    *ranks = rk;
    *paths = ps;
    *n = cnt;
    return MS_OK;
}

ms_status trace_fopen(const char *path, FILE **f) {
    *f = NULL;
    /* O_NONBLOCK: the open of a FIFO with no writer blocks without it */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return ms_error(MS_ERR_IO, "%s: open: %s", path, strerror(errno));
    struct stat sb;
    ms_status st = MS_OK;
    if (fstat(fd, &sb) != 0)
        st = ms_error(MS_ERR_IO, "%s: fstat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = ms_error(MS_ERR_FORMAT, "%s: not a regular file (%s): the trace tools read only files",
                      path,
                      S_ISFIFO(sb.st_mode)   ? "a FIFO"
                      : S_ISDIR(sb.st_mode)  ? "a directory"
                      : S_ISSOCK(sb.st_mode) ? "a socket"
                                             : "a device");
    if (st != MS_OK) {
        close(fd);
        return st;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (!(*f = fdopen(fd, "r"))) {
        int err = errno;
        close(fd);
        return ms_error(MS_ERR_IO, "%s: open: %s", path, strerror(err));
    }
    return MS_OK;
}

ms_status trace_read_file(const char *path, char **data, size_t *len) {
    FILE *f;
    *data = NULL;
    *len = 0;
    MS_TRY(trace_fopen(path, &f)); /* a regular file: the read below cannot block */
    fclose(f);
    return ms_file_read_all(path, data, len);
}

void trace_rank_files_free(int *ranks, char **paths, int n) {
    for (int i = 0; paths && i < n; i++)
        free(paths[i]);
    free(paths);
    free(ranks);
}

trace_coord trace_coord_of(int rank, trace_coord shape) {
    trace_coord c;
    c.tp = rank % shape.tp;
    c.dp = rank / shape.tp % shape.dp;
    c.pp = rank / (shape.tp * shape.dp);
    return c;
}

int trace_coord_cmp(trace_coord a, trace_coord b) {
    if (a.pp != b.pp) return a.pp < b.pp ? -1 : 1;
    if (a.dp != b.dp) return a.dp < b.dp ? -1 : 1;
    return (a.tp > b.tp) - (a.tp < b.tp);
}

const char *trace_coord_str(char *buf, size_t n, trace_coord c) {
    snprintf(buf, n, "(dp %d, pp %d, tp %d)", c.dp, c.pp, c.tp);
    return buf;
}

cJSON *trace_coord_json(trace_coord c) {
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddNumberToObject(o, "dp", c.dp) || !cJSON_AddNumberToObject(o, "pp", c.pp) ||
        !cJSON_AddNumberToObject(o, "tp", c.tp)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

int trace_coord_parse(const cJSON *o, trace_coord *c) {
    int64_t dp, pp, tp;
    if (!cJSON_IsObject(o) || !trace_json_int(o, "dp", 0, 1 << 24, &dp) ||
        !trace_json_int(o, "pp", 0, 1 << 24, &pp) || !trace_json_int(o, "tp", 0, 1 << 24, &tp))
        return 0;
    *c = (trace_coord){(int)dp, (int)pp, (int)tp};
    return 1;
}

cJSON *trace_json_add_text(cJSON *o, const char *key, const char *s) {
    char *t = strdup(s);
    if (!t) return NULL;
    ms_utf8_fix(t);
    cJSON *x = cJSON_AddStringToObject(o, key, t);
    free(t);
    return x;
}

int trace_json_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(x)) return 0;
    double d = x->valuedouble;
    if (!isfinite(d) || d != floor(d) || d < (double)lo || d > (double)hi) return 0;
    *v = d >= 9.2e18 ? INT64_MAX : (int64_t)d;
    return 1;
}

ms_status trace_json_print(const cJSON *j, FILE *f) {
    char *txt = j ? cJSON_PrintUnformatted(j) : NULL;
    if (!txt) return ms_error(MS_ERR_NOMEM, "out of memory printing JSON");
    fprintf(f, "%s\n", txt);
    free(txt);
    return MS_OK;
}

/* ---- thread layout ------------------------------------------------------- */

/* Order by start, longer (the parent) first, then by index (stable). */
static int before(const trace_span *spans, int a, int b) {
    const trace_span *x = &spans[a], *y = &spans[b];
    if (x->t0 != y->t0) return x->t0 < y->t0;
    if (x->t1 != y->t1) return x->t1 > y->t1;
    return a < b;
}

/* A bottom-up merge sort of idx (qsort has no context argument, and
 * qsort_r differs between glibc and BSD). */
static void sort_by_start(const trace_span *spans, int *idx, int n) {
    int *tmp = malloc(((size_t)n + 1) * sizeof *tmp), *src = idx, *dst = tmp;
    MS_CHECK(tmp);
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                dst[k++] = before(spans, src[j], src[i]) ? src[j++] : src[i++];
            while (i < mid)
                dst[k++] = src[i++];
            while (j < hi)
                dst[k++] = src[j++];
        }
        int *t = src;
        src = dst;
        dst = t;
    }
    if (src != idx) memcpy(idx, src, (size_t)n * sizeof *idx);
    free(tmp);
}

int trace_nest(trace_span *spans, int *idx, int n) {
    sort_by_start(spans, idx, n);
    int *stack = malloc(((size_t)n + 1) * sizeof *stack), top = 0, cut = 0;
    MS_CHECK(stack);
    for (int i = 0; i < n; i++) {
        trace_span *s = &spans[idx[i]];
        if (s->flags & TRACE_IS_MARK) continue;
        while (top && spans[stack[top - 1]].t1 <= s->t0)
            top--;
        if (top && s->t1 > spans[stack[top - 1]].t1) {
            s->t1 = spans[stack[top - 1]].t1;
            cut++;
        }
        stack[top++] = idx[i];
    }
    free(stack);
    return cut;
}

int trace_partition(const trace_span *spans, int *idx, int n, int *track) {
    sort_by_start(spans, idx, n);
    int64_t *end = malloc(((size_t)n + 1) * sizeof *end);
    int n_tracks = 0;
    MS_CHECK(end);
    for (int i = 0; i < n; i++) {
        const trace_span *s = &spans[idx[i]];
        int t = 0;
        if (s->flags & TRACE_IS_MARK) { /* an instant breaks no nesting */
            track[i] = 0;
            continue;
        }
        while (t < n_tracks && end[t] > s->t0)
            t++;
        if (t == n_tracks) n_tracks++;
        end[t] = s->t1; /* >= s->t0 >= the old end */
        track[i] = t;
    }
    free(end);
    return n_tracks ? n_tracks : 1;
}
