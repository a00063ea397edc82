/* sup_internal.h - what the driver's files share: the job (the mpirun
 * child, sup_job.c), the events log and summary (sup_events.c), and the
 * per-rank state the heartbeats fill (sup_driver.c).  Not for use outside
 * src/supervisor/. */
#ifndef SUP_INTERNAL_H
#define SUP_INTERNAL_H

#include <stdio.h>
#include <sys/types.h>

#include "supervisor/sup.h"

/* ---- sup_job.c: one attempt of the job ---------------------------------- */

typedef struct {
    pid_t pid;  /* mpirun, leader of its own process group; 0: not running */
    int status; /* waitpid status once it exited */
    int exited; /* 1 once reaped */
} sup_job;

/* Start mpirun (argv NULL-terminated) in a new process group, with the
 * heartbeat address and token in its environment.  0, or -1 with buf set. */
int sup_job_start(sup_job *j, char *const argv[], const char *hb_addr, const char *token, char *why,
                  size_t n);
/* 1 if mpirun has exited (reaps it), 0 while it runs. */
int sup_job_poll(sup_job *j);
/* Stop the job: SIGTERM to its process group, SIGKILL after `grace`
 * seconds, then SIGKILL to every pid in pids[0..n) (ranks mpirun may have
 * left behind) and reap mpirun.  Returns the seconds it took. */
double sup_job_stop(sup_job *j, double grace, const int *pids, int n);
/* "exit code 3", "killed by signal 9" for the reaped status. */
void sup_job_describe(const sup_job *j, char *buf, size_t n);

/* ---- sup_events.c: the events JSONL and the bottom line ----------------- */

#define SUP_MAX_FAULTS 1024

typedef struct {
    FILE *f;
    char path[4096];
    double t0; /* wall time of job_start */
    /* for the summary */
    int n_faults; /* at most SUP_MAX_FAULTS are kept */
    char kinds[SUP_MAX_FAULTS][24];
    double detect_s[SUP_MAX_FAULTS], recover_s[SUP_MAX_FAULTS];
    int redone;
} sup_events;

int sup_events_open(sup_events *e, const char *path, char *why, size_t n);
/* One line {"time": epoch s, "t": s since job_start, "event": EVENT, and the
 * members of fields (a cJSON object, consumed; may be NULL)}, flushed. */
struct cJSON;
void sup_events_put(sup_events *e, const char *event, struct cJSON *fields);
void sup_events_close(sup_events *e);

#endif
