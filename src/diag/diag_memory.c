/* diag_memory.c - the memory check: host memory bandwidth of a parallel
 * copy (STREAM's "copy": bytes read + bytes written per second, best of a
 * few), verified byte for byte, against --min-mem-gbps and the history. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/ctx.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/timeutil.h"
#include "diag/diag_internal.h"

#define MEM_REPS 5
#define MEM_CHUNK ((size_t)1 << 20)

/* dst = src (n bytes) in 1 MiB chunks over `threads` threads. */
static void par_copy(char *dst, const char *src, size_t n, int threads) {
    long chunks = (long)((n + MEM_CHUNK - 1) / MEM_CHUNK);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < chunks; i++) {
        size_t off = (size_t)i * MEM_CHUNK, len = n - off < MEM_CHUNK ? n - off : MEM_CHUNK;
        memcpy(dst + off, src + off, len);
    }
}

/* Fill p (n bytes, a multiple of 8) with random words (this also faults the
 * pages in, on the threads that copy them later). */
static void par_fill(uint64_t *p, size_t words, uint64_t seed, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < (long)words; i++)
        p[i] = ms_rng_u64(seed, 3, (uint64_t)i);
}

/* Offset of the first byte where a and b differ, or -1. */
static long long first_diff(const char *a, const char *b, size_t n) {
    for (size_t off = 0; off < n; off += MEM_CHUNK) {
        size_t len = n - off < MEM_CHUNK ? n - off : MEM_CHUNK;
        if (memcmp(a + off, b + off, len))
            for (size_t i = 0; i < len; i++)
                if (a[off + i] != b[off + i]) return (long long)(off + i);
    }
    return -1;
}

void diag_check_memory(const diag_config *c, const diag_report *rep, diag_result *r) {
    *r = (diag_result){.name = "memory", .ok = 1, .unit = "GB/s"};
    size_t n = (size_t)c->mem_mb << 20;
    int threads = c->threads > 0 ? c->threads : omp_get_num_procs();
    uint64_t *src = aligned_alloc(64, n), *dst = aligned_alloc(64, n);
    if (!src || !dst) {
        r->ok = 0;
        diag_detail(r, "cannot allocate 2 x %d MB of host memory", c->mem_mb);
        goto out;
    }
    par_fill(src, n / 8, (uint64_t)(ms_wall_now() * 1e6), threads);
    par_fill(dst, n / 8, 0, threads);
    double best = 0;
    for (int rep_i = 0; rep_i < MEM_REPS; rep_i++) {
        double t0 = ms_now();
        par_copy((char *)dst, (const char *)src, n, threads);
        double dt = ms_now() - t0, gbps = dt > 0 ? 2.0 * (double)n / dt / 1e9 : 0;
        if (gbps > best) best = gbps;
    }
    r->value = best;
    int corrupt = diag_fault(c, "diag:memory", rep->rank);
    if (corrupt) ((unsigned char *)dst)[n / 3] ^= 0x10; /* injected: a flipped bit */
    long long bad = first_diff((const char *)dst, (const char *)src, n);
    diag_detail(r, "copy of %d MB, best of %d, %d thread(s)", c->mem_mb, MEM_REPS, threads);
    if (bad >= 0) {
        r->ok = 0;
        diag_detail(r, "CORRUPTED: the copy differs at byte %lld of %zu%s", bad, n,
                    corrupt ? " [injected fault diag:memory]" : "");
    }
    if (c->min_mem_gbps > 0) {
        r->has_limit = 1, r->limit = c->min_mem_gbps;
        if (best < c->min_mem_gbps) {
            r->ok = 0;
            diag_detail(r, "SLOW: %.3g GB/s < --min-mem-gbps %g", best, c->min_mem_gbps);
        }
    }
    diag_hist_key k = {"memory", "GB/s", "host", c->mem_mb, ms_ctx_get()->local_rank};
    if (!diag_history_judge(c, &k, r)) r->ok = 0;
    if (r->ok && c->history && *c->history &&
        diag_history_append(c->history, &k, best, rep->host) != MS_OK)
        ms_warn("diag: the memory result was not added to the history: %s", ms_errmsg());
out:
    free(src);
    free(dst);
}
