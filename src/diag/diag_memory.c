/* diag_memory.c - the memory check: host memory bandwidth of a parallel
 * copy (STREAM's "copy": bytes read + bytes written per second, best of a
 * few), verified byte for byte, against --min-mem-gbps and the history.
 * Two more STREAM-style kernels are reported beside it (not judged):
 *  - triad, a = b + s*c, counted as STREAM counts it (12 bytes an element);
 *  - update, a = a*s + b, in place (12 bytes an element): the access
 *    pattern of an optimizer step, which writes back only lines it has
 *    just read.  Plain stores into a line not read first (the copy's, the
 *    triad's) also read it (write-allocate), which STREAM does not count;
 *    the update has none of that traffic, so it reads higher, and it is
 *    the yardstick of a read-modify-write pass (bench/cpu_step). */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
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

/* a = b + s*c (n floats each), the triad. */
static void par_triad(float *restrict a, const float *restrict b, const float *restrict c, size_t n,
                      int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < (long)n; i++)
        a[i] = b[i] + 0.5f * c[i];
}

/* a = a*s + b (n floats each), in place. */
static void par_update(float *restrict a, const float *restrict b, size_t n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < (long)n; i++)
        a[i] = a[i] * 0.5f + b[i];
}

/* Fill p (n floats) with v, on the threads that use them. */
static void par_fill_f(float *p, size_t n, float v, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < (long)n; i++)
        p[i] = v;
}

/* GB/s (bytes / seconds) of the best of MEM_REPS runs of the triad
 * (kind 0: a = dst's first half, b and c src's halves) or the update
 * (kind 1: a = dst, b = src), on buffers of normal floats (random words
 * would make some denormal, which the FPU may handle slowly). */
static double stream_best(int kind, float *dst, float *src, size_t n_bytes, int threads) {
    size_t n = n_bytes / sizeof(float), h = n / 2;
    par_fill_f(src, n, 1.0f, threads);
    par_fill_f(dst, n, 2.0f, threads);
    double best = 0;
    for (int i = 0; i < MEM_REPS; i++) {
        double t0 = ms_now();
        if (kind == 0)
            par_triad(dst, src, src + h, h, threads);
        else
            par_update(dst, src, n, threads);
        double dt = ms_now() - t0, bytes = 12.0 * (double)(kind == 0 ? h : n);
        if (dt > 0 && bytes / dt / 1e9 > best) best = bytes / dt / 1e9;
    }
    return best;
}

/* Fill p (words 64-bit words) with random words, on the threads that copy
 * them later (which also faults the pages in there): each 1 MiB chunk from
 * its own Philox draw, spread over the chunk's words by SplitMix64's
 * finaliser (ms_rng_mix64).  A Philox block per word took a third of the
 * check's time (16 M blocks for the source and the destination, 2 x 64 MB
 * in the supervisor's diag: about 0.3 s of a core on a Zen 5), on the
 * recovery's path; any pattern the copy cannot get right by chance does,
 * and this one differs from run to run (the seed is the clock). */
static void par_fill(uint64_t *p, size_t words, uint64_t seed, int threads) {
    const size_t per = MEM_CHUNK / sizeof *p;
    long chunks = (long)((words + per - 1) / per);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < chunks; i++) {
        size_t off = (size_t)i * per, len = words - off < per ? words - off : per;
        uint64_t base = ms_rng_u64(seed, 3, (uint64_t)i);
        for (size_t j = 0; j < len; j++)
            p[off + j] = ms_rng_mix_at(base, j);
    }
}

/* Zero n bytes in 1 MiB chunks over `threads` threads (faulting the pages
 * in on the threads that use them). */
static void par_zero(char *p, size_t n, int threads) {
    long chunks = (long)((n + MEM_CHUNK - 1) / MEM_CHUNK);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < chunks; i++) {
        size_t off = (size_t)i * MEM_CHUNK, len = n - off < MEM_CHUNK ? n - off : MEM_CHUNK;
        memset(p + off, 0, len);
    }
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
    /* huge pages where THP allows, as the trainer's buffers (ms_alloc_aligned):
     * the bandwidth its streaming passes see, and 64 faults where 4 KB pages
     * took 32768 for the supervisor's 2 x 64 MB (most of the check's time in
     * a VM) */
    uint64_t *src = ms_alloc_aligned_raw(n), *dst = ms_alloc_aligned_raw(n);
    if (!src || !dst) {
        r->ok = 0;
        diag_detail(r, "cannot allocate 2 x %d MB of host memory", c->mem_mb);
        goto out;
    }
    par_fill(src, n / 8, (uint64_t)(ms_wall_now() * 1e6), threads);
    par_zero((char *)dst, n, threads);
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
    } else { /* the buffers are checked: reuse them (a corrupt copy reports no rates) */
        r->aux_name[0] = "triad_gbps", r->aux_name[1] = "update_gbps";
        r->aux[0] = stream_best(0, (float *)dst, (float *)src, n, threads);
        r->aux[1] = stream_best(1, (float *)dst, (float *)src, n, threads);
        diag_detail(r, "triad %.3g GB/s, in-place update %.3g GB/s", r->aux[0], r->aux[1]);
    }
    if (c->min_mem_gbps > 0) {
        r->has_limit = 1, r->limit = c->min_mem_gbps;
        if (best < c->min_mem_gbps) {
            diag_fail_slow(r);
            diag_detail(r, "SLOW: %.3g GB/s < --min-mem-gbps %g", best, c->min_mem_gbps);
        }
    }
    diag_hist_key k = {"memory", "GB/s", "host", c->mem_mb, ms_ctx_get()->local_rank};
    if (!diag_history_judge(c, &k, r)) diag_fail_slow(r);
    if (r->ok && c->history && *c->history &&
        diag_history_append(c->history, &k, best, rep->host) != MS_OK)
        ms_warn("diag: the memory result was not added to the history: %s", ms_errmsg());
out:
    ms_free_aligned(src);
    ms_free_aligned(dst);
}
