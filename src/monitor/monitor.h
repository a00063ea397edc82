/* monitor.h - MFU against a declared peak, the GEMM peak probe, peak
 * memory.  (The step record and its sinks: monitor/step.h; the event log
 * and clock reference: monitor/evlog.h.)
 *
 * MFU people can compare: the peak is the device's dense bf16 figure from a
 * table (A100, H100, H200, B200; never the sparse one), --peak-flops, or on
 * a CPU (or an unknown GPU) the best of several GEMM probes, the last ones
 * taken during warm-up so a busy moment at start-up does not lower it.
 * mon_peak_mfu never reports more than 1: a step that beats the peak raises
 * the peak to what it achieved, and says so once.  A probed peak may be
 * kept in a peak cache (monitor/peakcache.h), so that a restart on the same
 * host reads it instead of probing again.  One thread.
 */
#ifndef MON_MONITOR_H
#define MON_MONITOR_H

#include <stdio.h>

#include "backend/backend.h"
#include "base/status.h"

/* Measure the backend's GEMM throughput (FLOP/s) in its act dtype (fp32 on
 * the CPU, bf16 on CUDA) with a short probe (a few square products of size
 * n on random inputs, best time).  On a CPU whose fp32 GEMMs run on the own
 * kernel, OpenBLAS's is probed too and the better of the two counts. */
double mon_probe_peak_flops(be_backend *be, int n, int reps);

/* The probes behind a fully warmed-up probed peak: the start-up probe and
 * the trainer's two warm-up re-probes.  A peak with this many is not
 * re-probed (a cached one read from the peak cache). */
#define MON_PEAK_PROBES 3
/* The longest one product of the peak's probe may take (s): a slower device
 * (the CUDA emulator) is probed with a smaller one. */
#define MON_PROBE_BUDGET_S 2.0

typedef struct {
    double flops;          /* per device (rank), FLOP/s */
    char source[640];      /* where it came from, for the start-up line */
    int from_probe;        /* measured by GEMM probes (now, or by the start that cached it) */
    int probes;            /* probes behind `probed` (those of a cached value included) */
    int probes_run;        /* of them, those this process ran */
    int cached;            /* read from the peak cache (monitor/peakcache.h) */
    int raised;            /* mon_peak_mfu raised it to an achieved rate */
    double probed;         /* the best probe (flops before any raise) */
    int probe_n;           /* the probes' size: mon_peak_probe_n, or less on a slow device */
    double fp32_flops;     /* CPU bf16: its fp32 GEMMs' probed rate (0: not known) */
    char cache_path[4200]; /* the peak cache file read or to write ("": none) */
} mon_peak;

/* The dense bf16 peak of a GPU named `device` (its marketing name as the
 * driver gives it, e.g. "NVIDIA H200"), or 0 if the table has no entry. */
double mon_peak_table(const char *device);
/* Decide the peak: `given` (> 0, from --peak-flops), else the table for
 * the backend's device (a bf16 backend), else the peak cache in directory
 * `cache_dir` (NULL or "": none; monitor/peakcache.h) when it holds this
 * host's and backend's, else a probe. */
void mon_peak_init(mon_peak *p, be_backend *be, double given, const char *cache_dir);
/* Another probe during warm-up (CPU and unknown devices only): keep the
 * best.  Nothing once the peak holds MON_PEAK_PROBES probes (a cached one)
 * or was raised. */
void mon_peak_reprobe(mon_peak *p, be_backend *be);
/* The probe's size for this backend (2048 on a CPU, 8192 on a GPU). */
int mon_peak_probe_n(const be_backend *be);
/* The same by kind (gpu: a GPU backend; bf16: its activations are bf16): n of
 * the probe's three n x n matrices (the planner's count of them). */
int mon_peak_probe_dim(int gpu, int bf16);
/* MFU of a rank that achieved `flops` FLOP/s: flops / peak, at most 1 (a
 * faster step raises the peak, with a warning the first time). */
double mon_peak_mfu(mon_peak *p, double flops);

/* Peak resident set size of this process in bytes (getrusage). */
double mon_peak_rss_bytes(void);

#endif
