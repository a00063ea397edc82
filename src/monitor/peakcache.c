/* peakcache.c - the probed peak kept per host, so a restart does not probe. */
#include "monitor/peakcache.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/cpu_isa.h"
#include "base/ctx.h"
#include "base/fileio.h"
#include "base/log.h"
#include "base/node.h"

#define CACHE_FORMAT "megascale-peak-cache"
#define CACHE_VERSION 1
#define CACHE_ENTRIES 8
#define CACHE_MAX_BYTES (64 * 1024)

/* A note about the cache: a warning on the host's first rank (each host
 * says it once), the same line at debug level on its other ranks. */
static void note(const char *path, const char *what) {
    ms_log(ms_ctx_get()->local_rank == 0 ? MS_LOG_WARN : MS_LOG_DEBUG, "peak cache %s: %s", path,
           what);
}

/* What makes a probed peak valid, as a JSON object (caller deletes). */
static cJSON *peak_key(const be_backend *be) {
    char host[MS_NODE_NAME_MAX] = "", blas[320] = "", bin[96] = "unknown";
    if (ms_node_of(NULL, 0, 1, host, "the host name") != MS_OK) snprintf(host, sizeof host, "host");
    struct stat sb; /* the binary: a rebuilt one may run other kernels */
    if (stat("/proc/self/exe", &sb) == 0)
        snprintf(bin, sizeof bin, "%lld bytes, modified %lld.%09ld", (long long)sb.st_size,
                 (long long)sb.st_mtim.tv_sec, (long)sb.st_mtim.tv_nsec);
    int cpu = !strcmp(be->name, "cpu"), bf16 = be->act_dtype == BE_BF16;
    int local = ms_ctx_get()->local_size;
    cJSON *k = cJSON_CreateObject();
    cJSON_AddStringToObject(k, "host", host);
    cJSON_AddStringToObject(k, "backend", be->name);
    cJSON_AddStringToObject(k, "device", be->device_name);
    cJSON_AddStringToObject(k, "dtype", bf16 ? "bf16" : "fp32");
    cJSON_AddNumberToObject(k, "threads", be->threads);
    cJSON_AddNumberToObject(k, "ranks_on_host", local > 1 ? local : 1);
    cJSON_AddNumberToObject(k, "probe_n", mon_peak_probe_n(be));
    cJSON_AddStringToObject(k, "gemm",
                            !cpu   ? ""
                            : bf16 ? "onednn-bf16"
                                   : be_cpu_gemm_value(be_cpu_gemm_own(be)));
    cJSON_AddStringToObject(k, "blas", cpu ? be_cpu_blas_describe(blas, sizeof blas) : "");
    cJSON_AddStringToObject(k, "cpu_isa", ms_cpu_isa_built());
    cJSON_AddStringToObject(k, "binary", bin);
    return k;
}

static void value_text(const cJSON *v, char *out, size_t n) {
    if (cJSON_IsString(v))
        snprintf(out, n, "\"%.100s\"", v->valuestring);
    else if (cJSON_IsNumber(v))
        snprintf(out, n, "%g", v->valuedouble);
    else
        snprintf(out, n, "%s", v ? "(not a string or number)" : "(none)");
}

/* 1 if `have` (an entry's key) holds every field of `want` (this rank's)
 * with the same value; else 0, naming the first that differs in why. */
static int key_match(const cJSON *have, const cJSON *want, char *why, size_t n) {
    for (const cJSON *w = want->child; w; w = w->next) {
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(have, w->string);
        int same = cJSON_IsString(w) ? cJSON_IsString(h) && !strcmp(h->valuestring, w->valuestring)
                                     : cJSON_IsNumber(h) && h->valuedouble == w->valuedouble;
        if (!same) {
            char hv[128], wv[128];
            value_text(h, hv, sizeof hv);
            value_text(w, wv, sizeof wv);
            snprintf(why, n, "made for %s %s, this rank's is %s", w->string, hv, wv);
            return 0;
        }
    }
    return 1;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* NULL if entry e is well formed, else what is wrong with it. */
static const char *entry_bad(const cJSON *e) {
    if (!cJSON_IsObject(e)) return "not an object";
    double probes = num(e, "probes"), fp32 = num(e, "fp32_flops");
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(e, "written");
    if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(e, "key"))) return "no \"key\" object";
    if (!(num(e, "flops") > 0) || !isfinite(num(e, "flops")))
        return "\"flops\" is not a positive number";
    if (!(probes >= 1 && probes <= MON_PEAK_PROBES) || probes != floor(probes))
        return "\"probes\" is not a whole number from 1 to 3";
    if (!(fp32 >= 0) || !isfinite(fp32)) return "\"fp32_flops\" is not a number >= 0";
    if (!cJSON_IsString(w) || strlen(w->valuestring) > 64) return "\"written\" is not a time";
    return NULL;
}

/* The cache at path, checked (caller deletes), or NULL: *missing set when
 * there is no file, else why it cannot be used. */
static cJSON *cache_read(const char *path, int *missing, char *why, size_t n) {
    struct stat sb;
    *missing = 0;
    if (stat(path, &sb) != 0 && errno == ENOENT) return *missing = 1, NULL;
    char *text = NULL;
    size_t len = 0;
    if (ms_file_read_max(path, CACHE_MAX_BYTES, &text, &len) != MS_OK) {
        snprintf(why, n, "cannot be read (%s)", ms_errmsg());
        return NULL;
    }
    cJSON *doc = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(doc, "format");
    const cJSON *entries = cJSON_GetObjectItemCaseSensitive(doc, "entries");
    if (!cJSON_IsObject(doc)) {
        snprintf(why, n, "not a JSON object (corrupt)");
    } else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, CACHE_FORMAT)) {
        snprintf(why, n, "not a peak cache (no \"format\": \"%s\")", CACHE_FORMAT);
    } else if (num(doc, "version") != CACHE_VERSION) {
        snprintf(why, n, "version %g, this binary reads %d", num(doc, "version"), CACHE_VERSION);
    } else if (!cJSON_IsArray(entries)) {
        snprintf(why, n, "no \"entries\" array");
    } else {
        int i = 0;
        for (const cJSON *e = entries->child; e; e = e->next, i++) {
            const char *bad = entry_bad(e);
            if (bad) {
                snprintf(why, n, "entry %d: %s", i, bad);
                goto bad;
            }
        }
        return doc;
    }
bad:
    cJSON_Delete(doc);
    return NULL;
}

int mon_peak_cache_load(mon_peak *p, const be_backend *be, const char *dir) {
    p->cache_path[0] = 0;
    if (!dir || !*dir || !strcmp(dir, "none")) return 0;
    cJSON *key = peak_key(be);
    const char *host = cJSON_GetObjectItemCaseSensitive(key, "host")->valuestring;
    snprintf(p->cache_path, sizeof p->cache_path, "%s%speak-%s.json", dir,
             dir[strlen(dir) - 1] == '/' ? "" : "/", host);
    int missing = 0;
    char why[512] = "", scratch[512];
    cJSON *doc = cache_read(p->cache_path, &missing, why, sizeof why);
    const cJSON *hit = NULL, *entries = cJSON_GetObjectItemCaseSensitive(doc, "entries");
    for (const cJSON *e = doc ? entries->child : NULL; e && !hit; e = e->next)
        if (key_match(cJSON_GetObjectItemCaseSensitive(e, "key"), key,
                      e == entries->child ? why : scratch, sizeof why))
            hit = e;
    if (hit) {
        p->from_probe = p->cached = 1;
        p->flops = p->probed = num(hit, "flops");
        p->fp32_flops = num(hit, "fp32_flops");
        p->probes = (int)num(hit, "probes");
        p->probes_run = 0;
        /* the size the probes had: less than the key's on a slow device (an
         * entry written before it was kept: the key's) */
        double used = num(hit, "probe_used");
        p->probe_n = used >= 1 && used < mon_peak_probe_n(be) ? (int)used : mon_peak_probe_n(be);
        snprintf(p->source, sizeof p->source,
                 "cached in %.300s: best of %d GEMM probe%s (%d^3, %s) on %.128s, taken %.64s",
                 p->cache_path, p->probes, p->probes == 1 ? "" : "s", p->probe_n,
                 be->act_dtype == BE_BF16 ? "bf16" : "fp32", be->device_name,
                 cJSON_GetObjectItemCaseSensitive(hit, "written")->valuestring);
    } else if (missing) {
        ms_info("peak cache %s: none yet: probing, then writing it", p->cache_path);
    } else {
        char line[700];
        if (doc) /* a good file, for other ranks or runs */
            snprintf(line, sizeof line, "no entry for this rank (%s%s): probing, then adding one",
                     why[0] ? "the newest was " : "it holds none", why);
        else
            snprintf(line, sizeof line, "%s: ignored, probing, then rewriting it", why);
        note(p->cache_path, line);
    }
    cJSON_Delete(doc);
    cJSON_Delete(key);
    return hit != NULL;
}

/* The entry for p under key (key moved into it). */
static cJSON *entry_new(const mon_peak *p, cJSON *key) {
    char when[32] = "";
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddItemToObject(e, "key", key);
    cJSON_AddNumberToObject(e, "flops", p->probed);
    cJSON_AddNumberToObject(e, "fp32_flops", p->fp32_flops > 0 ? p->fp32_flops : 0);
    cJSON_AddNumberToObject(e, "probes", p->probes);
    cJSON_AddNumberToObject(e, "probe_used", p->probe_n);
    cJSON_AddStringToObject(e, "written", when);
    cJSON_AddNumberToObject(e, "rank", ms_ctx_get()->rank);
    cJSON_AddNumberToObject(e, "pid", (double)getpid());
    return e;
}

/* Under the lock: the file again; p's entry first, then the other keys'
 * (at most CACHE_ENTRIES in all), unless it already holds this key with
 * as many probes.  mon_peak_cache_save's return value. */
static int save_locked(const mon_peak *p, const be_backend *be) {
    int missing;
    char why[512], scratch[512];
    cJSON *old = cache_read(p->cache_path, &missing, why, sizeof why);
    cJSON *key = peak_key(be), *doc = cJSON_CreateObject(), *entries;
    cJSON_AddStringToObject(doc, "format", CACHE_FORMAT);
    cJSON_AddNumberToObject(doc, "version", CACHE_VERSION);
    entries = cJSON_AddArrayToObject(doc, "entries");
    int kept = 1, done = 0;
    mon_peak best = *p; /* this key's best: the higher of this process's and the entry's */
    const cJSON *olds = cJSON_GetObjectItemCaseSensitive(old, "entries");
    for (const cJSON *e = old ? olds->child : NULL; e && !done; e = e->next) {
        if (key_match(cJSON_GetObjectItemCaseSensitive(e, "key"), key, scratch, sizeof scratch)) {
            /* another rank of this host wrote it: kept when it is as good, else this one
             * with the higher peak of the two (the ranks of a host probe at once and read
             * different peaks: the lower one, written last, halved the peak the next start
             * read, and its MFU doubled at the same speed) */
            double f = num(e, "flops"), f32 = num(e, "fp32_flops");
            int probes = (int)num(e, "probes");
            done = probes >= p->probes && f >= p->probed &&
                   !(p->fp32_flops > 0 && !(f32 >= p->fp32_flops));
            if (f > best.probed) best.probed = f;
            if (f32 > best.fp32_flops) best.fp32_flops = f32; /* each peak the higher, on its own */
            if (probes > best.probes) best.probes = probes;
        } else if (kept++ < CACHE_ENTRIES) {
            cJSON_AddItemToArray(entries, cJSON_Duplicate(e, 1));
        }
    }
    cJSON_InsertItemInArray(entries, 0, entry_new(&best, key));
    char *text = done ? NULL : cJSON_Print(doc);
    int rc = done ? 0 : 1;
    if (!done && (!text || ms_file_write_atomic(p->cache_path, text, strlen(text)) != MS_OK)) {
        snprintf(why, sizeof why, "cannot be written (%s): the next start probes again",
                 text ? ms_errmsg() : "out of memory");
        note(p->cache_path, why);
        rc = -1;
    }
    free(text);
    cJSON_Delete(doc);
    cJSON_Delete(old);
    return rc;
}

int mon_peak_cache_save(const mon_peak *p, const be_backend *be) {
    if (!p->cache_path[0] || !p->from_probe || p->probes_run < 1 || !(p->probed > 0)) return 0;
    char dir[sizeof p->cache_path], lock[sizeof p->cache_path + 8], why[700];
    snprintf(dir, sizeof dir, "%s", p->cache_path);
    ms_path_dir(dir);
    snprintf(lock, sizeof lock, "%s.lock", p->cache_path);
    int made = ms_mkdirs(dir) == MS_OK;
    int fd = made ? open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
    if (fd < 0) {
        snprintf(why, sizeof why, "cannot be written (%s): the next start probes again",
                 made ? strerror(errno) : ms_errmsg());
        note(p->cache_path, why);
        return -1;
    }
    /* the ranks of a host save at once: each waits its turn (up to 2 s: a save is a read and
     * a write of a small file), so that every peak is merged (before, a rank that found the
     * lock held skipped its save: a higher peak than the writer's was lost) */
    int rc = 0, locked = 0, err = 0;
    for (int t = 0; t < 200 && !locked; t++) {
        locked = flock(fd, LOCK_EX | LOCK_NB) == 0;
        err = locked ? 0 : errno;
        if (!locked && err != EWOULDBLOCK) break;
        if (!locked) usleep(10000);
    }
    if (locked) {
        rc = save_locked(p, be);
        flock(fd, LOCK_UN);
    } else if (err != EWOULDBLOCK) {
        snprintf(why, sizeof why, "cannot be locked (%.300s: %s): the next start probes again",
                 lock, strerror(err));
        note(p->cache_path, why);
        rc = -1;
    }
    close(fd);
    return rc;
}
