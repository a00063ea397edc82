/* monitor.c - the declared peak and MFU, GEMM peak probe, peak RSS. */
#include "monitor/monitor.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/bf16.h"
#include "base/fileio.h"
#include "base/rng.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "monitor/peakcache.h"

static double probe_once(be_backend *be, int n, int reps) {
    size_t bytes = (size_t)n * n * be_dtype_size(be->act_dtype);
    float *host = malloc((size_t)n * n * sizeof(float));
    void *a = be->alloc(be, bytes), *b = be->alloc(be, bytes), *c = be->alloc(be, bytes);
    double best = 0;
    if (!host || !a || !b || !c) goto out;
    /* uniform in [-0.5, 0.5), 24 random bits: a Philox draw per row spread
     * over the row (ms_rng_mix64); a Philox block per element took 80 ms
     * of each 2048^3 probe, and the trainer probes twice at start-up and
     * again over its first steps */
    for (size_t r = 0; r < (size_t)n; r++) {
        uint64_t base = ms_rng_u64(7, 0, r);
        for (size_t j = 0; j < (size_t)n; j++)
            host[r * n + j] = (float)(ms_rng_mix_at(base, j) >> 40) * 0x1.0p-24f - 0.5f;
    }
    if (be->act_dtype == BE_BF16) { /* round to bf16 in place (nearest even) */
        uint16_t *h16 = (uint16_t *)host;
        for (size_t i = 0; i < (size_t)n * n; i++)
            h16[i] = ms_f32_to_bf16(host[i]); /* reads float i before h16[i] covers it */
    }
    be->to_device(be, a, host, bytes);
    be->to_device(be, b, host, bytes);
    for (int r = 0; r < reps + 1; r++) { /* the first run warms up */
        be->sync(be);
        double t0 = ms_now();
        be->gemm(be, 0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n, 0, NULL, BE_EPI_NONE, NULL);
        be->sync(be);
        double dt = ms_now() - t0;
        double f = 2.0 * n * (double)n * n / dt;
        if (r > 0 && f > best) best = f;
    }
out:
    if (a) be->free(be, a);
    if (b) be->free(be, b);
    if (c) be->free(be, c);
    free(host);
    return best;
}

double mon_probe_peak_flops(be_backend *be, int n, int reps) {
    double best = probe_once(be, n, reps);
    /* The CPU's fp32 GEMMs may run on megascale's own kernel, which is
     * faster than OpenBLAS at the step's shapes but not always at n^3: the
     * peak is the best GEMM this machine runs, so OpenBLAS's is probed too
     * (never a peak below what a library reaches, so never an MFU above). */
    int own = !strcmp(be->name, "cpu") && be->act_dtype == BE_F32 ? be_cpu_gemm_own(be) : 0;
    if (own && be_cpu_gemm_set(be, BE_CPU_GEMM_OPENBLAS) == MS_OK) {
        double f = probe_once(be, n, reps);
        if (f > best) best = f;
        MS_CHECK(be_cpu_gemm_set(be, own) == MS_OK);
    }
    return best;
}

double mon_peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (double)ru.ru_maxrss * 1024.0;
}

/* Dense (not sparse) bf16 tensor-core peaks of the SXM parts, FLOP/s, from
 * the vendors' data sheets.  Longer names first: "H100 PCIe" before "H100". */
static const struct {
    const char *match;
    double flops;
} peak_table[] = {
    {"H100 PCIe", 756e12}, {"H100 NVL", 835e12}, {"GH200", 989e12}, {"H200", 989e12},
    {"H100", 989e12},      {"H800", 989e12},     {"B200", 2250e12}, {"GB200", 2500e12},
    {"B100", 1750e12},     {"A100", 312e12},     {"A800", 312e12},  {"L40S", 362e12},
};

double mon_peak_table(const char *device) {
    for (size_t i = 0; device && i < sizeof peak_table / sizeof peak_table[0]; i++)
        if (strstr(device, peak_table[i].match)) return peak_table[i].flops;
    return 0;
}

/* The size of the peak's probe on this device: n, or where one n^3 product
 * would take more than MON_PROBE_BUDGET_S, the largest size that does not.
 * Timed at 256^3 (warmed up), then at the largest doubling whose product
 * fits at the rate seen so far, until n or no larger one fits: a GPU goes
 * straight to n or through a size or two (its small products are bound by
 * the launch), and the CUDA emulator (tests/cuda_emu) stops at 1024^3,
 * where its 8192^3 bf16 probe ran for more than 10 minutes.  A smaller
 * product reads a lower rate: the peak is then low and MFU high, which the
 * start-up line's source says (the probe's size).  A CPU's probe (2048^3,
 * 17 GFLOP: seconds on the slowest core) is not fitted: one timing on a
 * loaded machine can read far too slow (a 2-thread product with a thread
 * descheduled: 16x, in an ASan CI run, which then probed at 1024^3). */
static int probe_fit(be_backend *be, int n) {
    if (!strcmp(be->name, "cpu")) return n;
    int m = n < 256 ? n : 256;
    double f = probe_once(be, m, 1);
    if (!(f > 0)) return n; /* the probe itself says what failed */
    while (m < n) {
        int next = m;
        while (next < n) {
            int c = 2 * next < n ? 2 * next : n;
            if (2.0 * c * c * (double)c / f > MON_PROBE_BUDGET_S) break;
            next = c;
        }
        if (next == m) break;
        m = next;
        if (m < n) f = fmax(f, probe_once(be, m, 1));
    }
    return m;
}

/* The probe's size: the GPU needs a large product to reach its peak
 * (8192^3 is 1.1 TFLOP); a CPU, bf16 or fp32, reaches its own at 2048^3. */
int mon_peak_probe_dim(int gpu, int bf16) {
    return gpu && bf16 ? 8192 : 2048;
}

int mon_peak_probe_n(const be_backend *be) {
    return mon_peak_probe_dim(strcmp(be->name, "cpu") != 0, be->act_dtype == BE_BF16);
}

static void peak_describe_probe(mon_peak *p, const be_backend *be) {
    int both = !strcmp(be->name, "cpu") && be->act_dtype == BE_F32 && be_cpu_gemm_own(be);
    char kept[64] = ""; /* a cached peak probed again in warm-up */
    if (p->probes_run < p->probes)
        snprintf(kept, sizeof kept, ", %d of them from the peak cache", p->probes - p->probes_run);
    snprintf(p->source, sizeof p->source, "probed: best of %d GEMM probe%s (%d^3, %s%s%s) on %s",
             p->probes, p->probes == 1 ? "" : "s", p->probe_n,
             be->act_dtype == BE_BF16 ? "bf16" : "fp32",
             both ? ", the own kernel's and OpenBLAS's" : "", kept, be->device_name);
    if (p->probe_n < mon_peak_probe_n(be)) {
        size_t at = strlen(p->source);
        snprintf(p->source + at, sizeof p->source - at,
                 "; not %d^3: one such product would take more than %.0f s on this device, and "
                 "a smaller one reads a lower peak (a higher MFU)",
                 mon_peak_probe_n(be), MON_PROBE_BUDGET_S);
    }
}

void mon_peak_init(mon_peak *p, be_backend *be, double given, const char *cache_dir) {
    memset(p, 0, sizeof *p);
    double table = be->act_dtype == BE_BF16 ? mon_peak_table(be->device_name) : 0;
    if (given > 0) {
        p->flops = given;
        snprintf(p->source, sizeof p->source, "given (--peak-flops)");
    } else if (table > 0) {
        p->flops = table;
        snprintf(p->source, sizeof p->source, "dense bf16 peak of %s (table)", be->device_name);
    } else if (!mon_peak_cache_load(p, be, cache_dir)) {
        p->from_probe = 1;
        p->probe_n = probe_fit(be, mon_peak_probe_n(be));
        p->flops = p->probed = mon_probe_peak_flops(be, p->probe_n, 2);
        p->probes = p->probes_run = 1;
        peak_describe_probe(p, be);
    }
}

void mon_peak_reprobe(mon_peak *p, be_backend *be) {
    if (!p->from_probe || p->raised || p->probes >= MON_PEAK_PROBES) return;
    /* a cached peak's size, or a size fitted at a busy moment: fitted again */
    int n = p->probe_n < mon_peak_probe_n(be) ? probe_fit(be, mon_peak_probe_n(be)) : p->probe_n;
    double f = mon_probe_peak_flops(be, n, 1);
    if (f > p->probed) p->probed = f;
    if (n > p->probe_n) p->probe_n = n;
    p->flops = p->probed;
    p->probes++;
    p->probes_run++;
    p->cached = 0; /* measured again: the source is the probes now */
    peak_describe_probe(p, be);
}

double mon_peak_mfu(mon_peak *p, double flops) {
    if (!(flops > 0) || !(p->flops > 0)) return 0;
    if (flops > p->flops) {
        if (!p->raised)
            ms_warn("MFU: a step ran at %.1f GFLOP/s, above the peak %.1f GFLOP/s (%s); the peak "
                    "is raised to the achieved rate, so MFU stays <= 100%%",
                    flops / 1e9, p->flops / 1e9, p->source);
        p->raised = 1;
        p->flops = flops;
        snprintf(p->source, sizeof p->source, "raised to the best achieved step rate");
    }
    return flops / p->flops;
}
