/* monitor.h - MFU against a declared peak, the GEMM peak probe, peak
 * memory.  (The step record and its sinks: monitor/step.h; the event log
 * and clock reference: monitor/evlog.h.)
 *
 * MFU people can compare: the peak is the device's dense bf16 figure from a
 * table (A100, H100, H200, B200; never the sparse one), --peak-flops, or on
 * a CPU (or an unknown GPU) the best of several GEMM probes, the last ones
 * taken during warm-up so a busy moment at start-up does not lower it.
 * mon_peak_mfu never reports more than 1: a step that beats the peak raises
 * the peak to what it achieved, and says so once.  One thread.
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

typedef struct {
    double flops;      /* per device (rank), FLOP/s */
    char source[256];  /* where it came from, for the start-up line */
    int from_probe;    /* mon_peak_reprobe may raise it */
    int probes;        /* probes taken */
    int raised;        /* mon_peak_mfu raised it to an achieved rate */
} mon_peak;

/* The dense bf16 peak of a GPU named `device` (its marketing name as the
 * driver gives it, e.g. "NVIDIA H200"), or 0 if the table has no entry. */
double mon_peak_table(const char *device);
/* Decide the peak: `given` (> 0, from --peak-flops), else the table for
 * the backend's device (a bf16 backend), else a probe. */
void mon_peak_init(mon_peak *p, be_backend *be, double given);
/* Another probe during warm-up (CPU and unknown devices only): keep the
 * best. */
void mon_peak_reprobe(mon_peak *p, be_backend *be);
/* MFU of a rank that achieved `flops` FLOP/s: flops / peak, at most 1 (a
 * faster step raises the peak, with a warning the first time). */
double mon_peak_mfu(mon_peak *p, double flops);

/* Peak resident set size of this process in bytes (getrusage). */
double mon_peak_rss_bytes(void);

#endif
