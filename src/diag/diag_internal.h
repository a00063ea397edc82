/* diag_internal.h - the checks of the node self-test and their shared
 * helpers (history, details, fault queries).  Internal to src/diag. */
#ifndef DIAG_INTERNAL_H
#define DIAG_INTERNAL_H

#include "comm/comm.h"
#include "diag/diag.h"

/* What identifies comparable history entries. */
typedef struct {
    const char *check;  /* "gemm", "memory" */
    const char *unit;   /* "GFLOP/s", "GB/s" */
    const char *device; /* backend name ("cpu", "cuda"); "host" for memory */
    int size;           /* the product size n, or the buffer MB */
    int local_rank;     /* this rank on its node */
} diag_hist_key;

/* Median of the newest DIAG_HISTORY_MEDIAN entries of path matching k into
 * *median, their count into *n (0, median 0: none, or no file).  Lines
 * that are not JSON objects are skipped with a warning naming path:line.
 * Errors: MS_ERR_IO naming the file (it exists but cannot be read). */
ms_status diag_history_median(const char *path, const diag_hist_key *k, double *median, int *n);
/* Whether path can be rewritten as a history: missing, empty, or text of
 * at most DIAG_HISTORY_MAX_BYTES with a JSON object on one of its lines.
 * Else MS_ERR_ARG naming it (an append keeps only the newest lines: a file
 * given by mistake, a shard or a log, would lose the rest). */
ms_status diag_history_check(const char *path);
/* Append one entry (k, value, host, now) atomically, keeping the newest
 * DIAG_HISTORY_KEEP lines; a file that diag_history_check refuses is left
 * as it is (MS_ERR_ARG).  Errors: MS_ERR_IO naming the file. */
ms_status diag_history_append(const char *path, const diag_hist_key *k, double value,
                              const char *host);
/* Judge r->value against c->slow_factor x the history median of k (sets
 * the limit when it is higher than the one r has, adds to the detail);
 * returns 0 when the value is too slow.  Fewer than DIAG_HISTORY_MIN
 * comparable entries are reported beside the value, not judged.  An
 * unreadable history is noted in the detail and judged as none. */
int diag_history_judge(const diag_config *c, const diag_hist_key *k, diag_result *r);

/* Fail r for its speed (below a floor or the history's median), after its
 * other verdicts: r->slow stays set only while every failure of r is one of
 * speed (a check that failed otherwise, wrong results, is not "slow"). */
void diag_fail_slow(diag_result *r);
/* Append ("; "-separated) to r->detail. */
void diag_detail(diag_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 1 if the fault `kind` (diag:gemm ...) is injected for this rank (an entry
 * without a step, or at step 1: "diag:comm@1:3" targets rank 3 only). */
int diag_fault(const diag_config *c, const char *kind, int rank);

/* The checks.  Each fills r (name, value, unit, limit, verdict, detail). */
ms_status diag_check_gemm(const diag_config *c, const diag_report *rep, diag_result *r);
void diag_check_memory(const diag_config *c, const diag_report *rep, diag_result *r);
/* The comm check leaves the communicator open in *world (NULL when it
 * could not start), so that the reports are written before any rank exits;
 * diag_comm_close finalises it (a warning if that fails). */
void diag_check_comm(const diag_config *c, const diag_report *rep, diag_result *r,
                     comm_world **world);
void diag_comm_close(comm_world *w);
void diag_check_storage(const diag_config *c, const diag_report *rep, diag_result *r);

#endif
