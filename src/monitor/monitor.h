/* monitor.h - training telemetry: JSONL metrics, MFU, peak-flops probe,
 * peak memory.
 *
 * mon_metrics writes one JSON object per line and flushes after each, so a
 * crashed run keeps every completed step.  One thread at a time per writer.
 */
#ifndef MON_MONITOR_H
#define MON_MONITOR_H

#include <stdio.h>

#include "backend/backend.h"
#include "base/status.h"

typedef struct {
    FILE *f;
    char path[4096];
} mon_metrics;

/* Open path for writing; path NULL or "" gives a disabled writer.  A run
 * that starts at step 0 truncates the file; a resumed run (resume_step > 0)
 * keeps the lines of steps <= resume_step (replacing the file atomically) and
 * appends after them, so the file reads as one run. */
ms_status mon_metrics_open(mon_metrics *mm, const char *path, int resume_step);
/* Write one line: `json_object` is the text of an object without newline. */
ms_status mon_metrics_write(mon_metrics *mm, const char *json_object);
void mon_metrics_close(mon_metrics *mm);

/* Measure the backend's GEMM throughput (FLOP/s) in its act dtype (fp32 on
 * the CPU, bf16 on CUDA) with a short probe (a few square products of size
 * n on random inputs, best time). */
double mon_probe_peak_flops(be_backend *be, int n, int reps);

/* Peak resident set size of this process in bytes (getrusage). */
double mon_peak_rss_bytes(void);

#endif
