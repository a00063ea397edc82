/* sup_internal.h - what the driver's files share: the job (the mpirun
 * child, sup_job.c), the writer thread of its files (sup_writer.c), the
 * events log and summary (sup_events.c), and the per-rank state the
 * heartbeats fill (sup_driver.c).  Not for use outside src/supervisor/. */
#ifndef SUP_INTERNAL_H
#define SUP_INTERNAL_H

#include <signal.h>
#include <stdio.h>
#include <sys/types.h>

#include "base/node.h"
#include "supervisor/sup.h"
#include "supervisor/sup_dash.h"

/* ---- sup_job.c: one attempt of the job ---------------------------------- */

#define SUP_JOB_KILLED_MAX 64 /* processes of mpirun's group whose session directories go */
#define SUP_TERM_WAIT_S 5.0 /* mpirun's time to end a job on SIGTERM (it takes ~1 s) */

typedef struct {
    pid_t pid;   /* mpirun, leader of its own process group; 0: not running */
    int status;  /* waitpid status once it exited */
    int exited;  /* 1 once reaped (or, adopted, once gone) */
    int adopted; /* started by an earlier driver: not our child, no status */
    char tmp[512]; /* mpirun's temporary directory (its session directory's parent) */
    /* sup_job_stop: what ended mpirun: 0 the stop request (SIGUSR1), 1
     * SIGTERM, 2 SIGKILL, 3 nothing (it had exited) */
    int escalation;
    /* what sup_job_stop removed that a killed mpirun left behind (base/shm_sweep.h) */
    int swept_segments; /* Open MPI shared-memory segments of this host */
    double swept_mb;    /* their size */
    int swept_session;  /* 1: mpirun's session directory */
    pid_t killed[SUP_JOB_KILLED_MAX]; /* the group's processes SIGKILL ended (a wrapper's mpirun) */
    int n_killed;
    /* sup_job_start's child, held before its exec until sup_job_release */
    int held;
    int gate_fd; /* the child execs on a byte here, exits at its EOF (the driver gone) */
    int exec_fd; /* the child's exec errno arrives here (EOF: it ran) */
} sup_job;

/* Fork the process that runs mpirun (argv NULL-terminated) in a new
 * process group, with the heartbeat address, token and attempt and the node map
 * (MS_NODE_MAP: the node of each block of ranks) in its environment, and
 * hold it before its exec: the caller saves its pid first, then
 * sup_job_release lets it run.  A driver that dies in between leaves no
 * job that no state names: the held child exits when its gate closes.
 * lock_fd (-1: none): the driver's run-directory lock, which the child
 * closes at once (held, it kept the lock from a successor).  0 (j->pid
 * set), or -1 with why set. */
int sup_job_start(sup_job *j, char *const argv[], const char *hb_addr, const char *token,
                  int attempt, const char *node_map, int lock_fd, char *why, size_t n);
/* 1 if pid runs another program than this process (its /proc/PID/exe is
 * not ours): a child forked here that has exec'd; 0 if the same, or not
 * known. */
int sup_pid_execd(pid_t pid);
/* Let the held child exec mpirun (prog: argv[0], for the error): 0, or -1
 * with why set (the exec failed: a missing --mpirun; the child reaped,
 * j->pid 0). */
int sup_job_release(sup_job *j, const char *prog, char *why, size_t n);
/* Take over the job an earlier driver started (pid: its mpirun). */
void sup_job_adopt(sup_job *j, pid_t pid);
/* 1 if pid is a live process (not a zombie). */
int sup_pid_alive(pid_t pid);
/* The start time of pid in clock ticks since boot (/proc/PID/stat), 0 if unknown:
 * with the pid it names a process for good (pids are reused). */
unsigned long long sup_pid_start(pid_t pid);
/* pid's parent (/proc/PID/stat), or -1 when it is gone. */
pid_t sup_pid_parent(pid_t pid);
/* pid if it is still the process started at `start` (alive, same start
 * time), else 0; a start of 0 (unknown) verifies nothing: 0. */
pid_t sup_pid_same(pid_t pid, unsigned long long start);
/* 1 if mpirun has exited (reaps it), 0 while it runs. */
int sup_job_poll(sup_job *j);
/* Stop the job.  ask 1: SIGUSR1 (the trainer's stop request) to mpirun,
 * which forwards it to every rank, and to the ranks pids[0..n): they take
 * a final checkpoint and exit; ask 0: SIGTERM to mpirun's process group and
 * the ranks (mpirun ends the job).  Then SIGCONT to both; after `grace`
 * seconds (ask 1) SIGTERM to mpirun, which ends the job itself and removes
 * its files; SIGKILL to the group if it is still there after
 * SUP_TERM_WAIT_S more (or after `grace`, ask 0), SIGKILL to every rank
 * still there, and reap mpirun.  Then sup_job_sweep.
 * While it waits it calls wait(arg) (which must block a little) if given.
 * Returns the seconds it took. */
double sup_job_stop(sup_job *j, int ask, double grace, const int *pids, int n, void (*wait)(void *),
                    void *arg);
/* The directory an mpirun the driver starts keeps its session directory
 * in, as Open MPI picks it: OMPI_MCA_orte_tmpdir_base, else TMPDIR, TEMP,
 * TMP, else /tmp. */
void sup_mpirun_tmpdir(char *out, size_t n);
/* Once mpirun is gone, remove what a killed one leaves on this host (a
 * clean exit leaves nothing): its session directory (8 MB, in mpirun's
 * temporary directory) while no process has its pid, and this host's
 * Open MPI shared-memory segments that no process uses (4 MiB a rank, in
 * memory; base/shm_sweep.h).  Counts in swept_*.  The ranks of the next
 * attempt sweep the other hosts. */
void sup_job_sweep(sup_job *j);
/* "exit code 3", "killed by signal 9" for the reaped status. */
void sup_job_describe(const sup_job *j, char *buf, size_t n);

/* ---- sup_writer.c: the driver's file writes, off its loop ----------------- */

/* One thread writes the driver's files (events.jsonl, compute.jsonl,
 * driver.json), so that a slow disk does not stall the loop.  Every
 * function below is called from the driver's thread only. */
typedef struct sup_writer sup_writer;
sup_writer *sup_writer_start(char *why, size_t n); /* NULL (why set) if it cannot */
/* Open path to append lines to; the file's index, or -1 with why set.
 * bound: 0, or the bytes that may wait, past which its lines are dropped
 * (counted: sup_writer_dropped). */
int sup_writer_open(sup_writer *w, const char *path, size_t bound, char *why, size_t n);
/* File k, once past max_bytes (0: never), renamed PATH.1 (replacing the
 * older one) and started again. */
void sup_writer_rotate(sup_writer *w, int k, uint64_t max_bytes);
/* Queue text (len bytes, no newline) and a newline for file k; 0, or -1
 * if it was dropped. */
int sup_writer_line(sup_writer *w, int k, const char *text, size_t len);
long sup_writer_dropped(sup_writer *w, int k);
/* Queue text (malloc'd, taken over) to replace path atomically (temp +
 * rename); a newer text replaces one not written yet.  Returns the save's
 * number for sup_writer_wait. */
unsigned long sup_writer_replace(sup_writer *w, const char *path, char *text);
/* Wait at most timeout_s until save gen (or a newer one) was written (or
 * failed, said on stderr once); 0, or -1 on time out. */
int sup_writer_wait(sup_writer *w, unsigned long gen, double timeout_s);
/* Write what is queued, within timeout_s, and end the thread; -1 (said on
 * stderr) if the disk did not take it in time.  NULL is fine. */
int sup_writer_stop(sup_writer *w, double timeout_s);

/* ---- sup_events.c: the events JSONL and the bottom line ----------------- */

#define SUP_MAX_FAULTS 1024

typedef struct {
    sup_writer *w; /* writes its lines (NULL: closed) */
    int wk;        /* its file in w */
    char path[4096];
    double t0; /* wall time of job_start */
    /* for the summary */
    int n_faults; /* at most SUP_MAX_FAULTS are kept */
    char kinds[SUP_MAX_FAULTS][24];
    double detect_s[SUP_MAX_FAULTS], recover_s[SUP_MAX_FAULTS];
    int redone;
} sup_events;

/* Append to path, through w (events are never dropped). */
int sup_events_open(sup_events *e, sup_writer *w, const char *path, char *why, size_t n);
/* One line {"time": epoch s, "t": s since job_start, "event": EVENT, and the
 * members of fields (a cJSON object, consumed; may be NULL)}, queued for the
 * writer (in order). */
struct cJSON;
void sup_events_put(sup_events *e, const char *event, struct cJSON *fields);
void sup_events_close(sup_events *e);

/* ---- sup_nodes.c: the node pool and the blocklist ---------------------- */

#define SUP_MAX_NODES 1024
#define SUP_NODE_NAME MS_NODE_NAME_MAX /* base/node.h */

typedef struct {
    int n;        /* nodes in the pool: the job's and the spares */
    int needed;   /* nodes one attempt runs on */
    int per_node; /* ranks per node */
    char name[SUP_MAX_NODES][SUP_NODE_NAME];
    int slots[SUP_MAX_NODES];         /* hostfile slots (0: one host) */
    char blocked[SUP_MAX_NODES][160]; /* "" or why it is on the blocklist */
    int active[SUP_MAX_NODES];        /* [needed]: the pool index of the attempt's k-th node */
    char blocklist_path[4200];
    struct cJSON *doc; /* the blocklist file's entries (kept, appended to) */
} sup_nodes;

/* The pool from --nodes/--spares or --hostfile; 0, or -1 with why set. */
int sup_nodes_init(sup_nodes *p, const sup_config *c, char *why, size_t n);
/* -1 (why set) when --hostfile names a host other than this one while the
 * heartbeats are bound to a loopback address or 0.0.0.0 (the ranks are
 * told that address, which on another host is not the driver's). */
int sup_nodes_reachable(const sup_nodes *p, const sup_config *c, const char *bind_addr, char *why,
                        size_t n);
/* Read RUN_DIR/blocklist.json if there is one (strictly). */
int sup_nodes_load_blocklist(sup_nodes *p, char *why, size_t n);
/* Put node i on the blocklist and rewrite the file atomically. */
int sup_nodes_block(sup_nodes *p, int i, const char *reason, char *why, size_t n);
int sup_nodes_find(const sup_nodes *p, const char *name); /* index or -1 */
int sup_nodes_usable(const sup_nodes *p);                 /* nodes not blocked */
/* The attempt's nodes: the first `needed` not blocked; -1 if too few. */
int sup_nodes_choose(sup_nodes *p);
int sup_nodes_is_active(const sup_nodes *p, int i);
int sup_nodes_of_rank(const sup_nodes *p, int rank); /* pool index of rank's node */
const char *sup_nodes_rank_name(const sup_nodes *p, int rank);
/* "a,b,c": the names of nodes idx[0..k). */
void sup_nodes_map(const sup_nodes *p, const int *idx, int k, char *buf, size_t n);
/* "a,b,c": the names of every node of the pool, in pool order. */
void sup_nodes_pool(const sup_nodes *p, char *buf, size_t n);
/* A hostfile of nodes idx[0..k) with `slots` each, written atomically. */
int sup_nodes_write_hostfile(const sup_nodes *p, const int *idx, int k, int slots, const char *path,
                             char *why, size_t n);
void sup_nodes_free(sup_nodes *p);

/* ---- sup_diag.c: megascale diag on the nodes ------------------------------ */

/* The speeds each node's report gives, compared across the nodes. */
enum { SUP_DIAG_GEMM, SUP_DIAG_MEMORY, SUP_DIAG_SPEEDS };

typedef struct {
    int ok;          /* every check passed */
    int reported;    /* 0: no report came back (crashed, timed out) */
    char failed[96]; /* "gemm, storage" */
    char detail[600];
    double speed[SUP_DIAG_SPEEDS]; /* GEMM GFLOP/s, memory GB/s as measured (0: none) */
    /* each speed check: 1 failed on its speed alone ("slow" in its report:
     * below the node's own history), 2 failed otherwise, 0 passed */
    int slow[SUP_DIAG_SPEEDS];
    int hard; /* a check failed other than on its speed alone (wrong results, storage) */
} sup_diag_result;

/* 1 if r failed on speeds alone (its own history's, or after
 * sup_diag_peers the other nodes'), which a second measurement decides; 0
 * if it passed, gave no report or failed a check otherwise (evicted at
 * once). */
int sup_diag_slow_only(const sup_diag_result *r);
/* A second measurement of r's node (again; ignored when it did not report)
 * into r, best of two: each speed the higher; a check r failed on its speed
 * alone passes when again passed it (the history's median is the same: a
 * failing result is not appended).  Only the speeds count: again's other
 * checks are r's over again.  r passes when no check is left failed (before
 * sup_diag_peers judges the speeds). */
void sup_diag_best_of_two(sup_diag_result *r, const sup_diag_result *again);

/* Each node's speeds against the median of the other nodes' (of the ones
 * that measured it): below factor x that median, the node fails that check
 * as slow (its failed list and detail say so).  A node slow from the start
 * has its own history at its slow speed; only its peers show it.  Needs
 * two nodes or more.  Returns the number of nodes it failed. */
int sup_diag_peers(sup_diag_result *res, int k, double factor);

typedef struct {
    const char *mpirun, *bin, *storage_dir, *history_dir;
    const char *device;                /* the job's --device (NULL: diag's default, cpu) */
    const char *faults;                /* the diag:* entries of the fault plan (may be NULL) */
    const volatile sig_atomic_t *stop; /* non-zero: give up at once (the driver was signalled) */
    double timeout, slow_factor;
    int threads;           /* per node (0: diag's default) */
    const sup_nodes *pool; /* with a hostfile: mpirun gets one slot per node */
    const char *hostfile;  /* where to write that hostfile (NULL: one host) */
    void (*tick)(void *);  /* called while it waits (the driver answers its control socket) */
    void *tick_arg;
} sup_diag_config;

/* Run the self-test on nodes idx[0..k) of the pool at once (one rank
 * each, one mpirun: the comm check is an all-reduce among them); out[j] is
 * node idx[j]'s result.  0, or -1 with why set (could not run at all). */
int sup_diag_run(const sup_diag_config *c, const int *idx, int k, sup_diag_result *out, char *why,
                 size_t n);
/* The same on each node alone: one mpirun of one rank per node, all at
 * once, within one timeout (with a hostfile: HOSTFILE.NODE each, removed
 * afterwards).  A node that cannot be reached fails without holding up the
 * others.  0, or -1 with why set (a run could not start; the nodes started
 * before it still have their results). */
int sup_diag_run_each(const sup_diag_config *c, const int *idx, int k, sup_diag_result *out,
                      char *why, size_t n);

/* ---- sup_ctl.c: the control socket's server side -------------------------- */

/* The control file RUN_DIR/control.json (mode 0600): address and token. */
int sup_ctl_write(const char *run_dir, const char *addr, const char *token, char *why, size_t n);
/* Write text to path atomically, mode 0600 (it holds a token). */
int sup_file_private(const char *path, const char *text, char *why, size_t n);

/* ---- sup_detect.c: the detectors fed by beats ----------------------------- */

/* qsort's comparison of doubles, ascending. */
int sup_cmp_double(const void *a, const void *b);

#define SUP_SPIKE_WINDOW 32
#define SUP_STRAGGLER_WARMUP 3 /* steps of each attempt the straggler detector does not score */
#define SUP_STRAGGLER_BASE 5   /* rounds whose median is a rank's own speed */

typedef struct {
    double v[SUP_SPIKE_WINDOW]; /* the last changes of the loss, step to step */
    double prev;                /* the last loss */
    int n, next, last_step, have_prev, skip_next;
} sup_spike;

/* The steps the no-progress limit is based on: the longest step of the
 * last SUP_INTERVAL_WINDOW to twice that many steps (two buckets of steps by
 * number: this one and the last one with a step timed), so that one late
 * step (a loaded host, a storage stall) raises the limit for a while, not
 * for the rest of a week-long job, while a long step that comes back at
 * least every SUP_INTERVAL_WINDOW steps is always in it. */
#define SUP_INTERVAL_WINDOW 1000
typedef struct {
    double cur, prev; /* the longest step of bucket `bucket`, of the one before (s) */
    int bucket;       /* step / SUP_INTERVAL_WINDOW of the newest step timed */
} sup_interval;

/* Time `step` (seconds since the step before).  A step of an earlier
 * bucket (redone after a restart) counts in the current one. */
void sup_interval_feed(sup_interval *v, int step, double seconds);
/* The longest step in the window; 0 if none was timed. */
double sup_interval_max(const sup_interval *v);

/* Feed rank 0's loss of `step` (once per step); returns the z-score of its
 * change from the step before when that is a spike (z > z_max against the
 * changes of at least 16 earlier steps), else 0.  *mean: the loss it
 * jumped from; *sd: the spread of the changes. */
double sup_spike_feed(sup_spike *s, int step, double loss, double z_max, double *mean, double *sd);

typedef struct {
    int n;           /* ranks */
    double *compute; /* [n]: the latest compute_ms of each rank (NaN: none) */
    int *step;       /* [n]: the step of that value */
    int *stage;      /* [n]: its pipeline stage (-1: not said: one stage) */
    double *early;   /* [n][SUP_STRAGGLER_BASE]: its first scored rounds' compute_ms */
    int *n_early;    /* [n]: how many of them so far */
    double *base;    /* [n]: their median, its own speed (NaN until known) */
    int *strikes;    /* [n]: rounds in a row below the score */
    int round_step;  /* the step of the last round scored */
} sup_straggler;

int sup_straggler_init(sup_straggler *s, int n);
void sup_straggler_free(sup_straggler *s);
void sup_straggler_reset(sup_straggler *s);
/* Rank r's compute_ms for `step`; stage: its pipeline stage (-1: unknown). */
void sup_straggler_feed(sup_straggler *s, int r, int stage, int step, double compute_ms);
/* Once every rank has a value past the last round: score each rank
 * against the other ranks of its pipeline stage (their median compute_ms
 * / its own: stages do different work, the last one also the loss; a rank
 * alone in its stage has no such score) and against its own speed (its
 * median over its first SUP_STRAGGLER_BASE rounds / now) while the ranks
 * of the other stages kept theirs (a node holding a whole stage that
 * became slow; not a slowdown of the whole job), take the lower, count
 * strikes below `score`, and return the rank with at least `rounds`
 * strikes (the worst), or -1; *out_score is its score. */
int sup_straggler_check(sup_straggler *s, double score, int rounds, double *out_score);

/* ---- sup_heatlog.c: every rank's compute time per step (compute.jsonl) ---- */

#define SUP_HEAT_PENDING 32 /* steps whose row is being filled */

#define SUP_HEAT_QUEUE (1 << 20) /* bytes of rows that may wait for a slow disk */

typedef struct {
    sup_writer *w; /* writes its rows (NULL: closed) */
    int wk;        /* its file in w */
    char *line;    /* a row's text, [np * 16 + 64] */
    int np, attempt;
    int step[SUP_HEAT_PENDING]; /* -1: free */
    int *have;                  /* [SUP_HEAT_PENDING]: ranks reported */
    double *ms;                 /* [SUP_HEAT_PENDING][np], NaN: not yet */
} sup_heatlog;

/* Append to path through w (rows past SUP_HEAT_QUEUE waiting bytes are
 * dropped: sup_writer_dropped counts them), rotated to PATH.1 past
 * max_bytes (0: never); 0, or -1 with why set. */
int sup_heatlog_open(sup_heatlog *h, sup_writer *w, const char *path, int np, uint64_t max_bytes,
                     char *why, size_t n);
/* Rank's compute_ms of step (in attempt: a new attempt flushes the rows
 * of the last one). */
void sup_heatlog_feed(sup_heatlog *h, int attempt, int rank, int step, double ms);
void sup_heatlog_flush(sup_heatlog *h); /* the pending rows, incomplete */
void sup_heatlog_close(sup_heatlog *h); /* flushes; a zeroed h is fine */

/* ---- the driver (sup_driver.c, sup_watch.c, sup_recover.c) ------------------ */

#include "base/fault.h"
#include "monitor/heartbeat.h"

#define SUP_TICK_MS 200
#define SUP_MAX_CONNS 4096
#define SUP_MAX_CTL 8
#define SUP_HB_AUTH_S 5.0 /* a heartbeat connection must send a valid beat within this */
/* A rank of a job taken over reconnects within this of the takeover: its beat client redials
 * every 2 s (HB_RECONNECT_S, src/monitor/heartbeat.c), at a beat (1 s apart) */
#define SUP_REDIAL_S 3.0
/* a hang the beats pin on no rank waits this long at most for a beat from each
 * (ranks beat every second; 2 s leaves one late beat a second) */
#define SUP_UNCLEAR_WAIT_S 2.0
/* no beat for this long: at least one missed (ranks beat every second) */
#define SUP_BEAT_MISSED_S 1.5
/* a beat at most this old: a rank's newest, its next one not overdue (a quarter second late) */
#define SUP_BEAT_RECENT_S 1.25

typedef struct {
    int fd, rank;  /* rank -1 until its first valid beat */
    int ended;     /* read to its end or rejected (read_conn): dropped on the next pass */
    double t_open; /* accepted at; dropped if no valid beat within SUP_HB_AUTH_S */
    unsigned long long seq;
    size_t len;
    char buf[MON_HB_LINE_MAX + 1];
} sup_conn;

typedef struct {
    int fd;
    unsigned long busy; /* being answered in this pass (0: not): passes nested in the answer
                         * neither poll nor drop it */
    double t_open;
    size_t len;
    char buf[SUP_CTL_LINE_MAX + 1];
} sup_ctl_conn;

typedef struct {
    int connected, pid, step, first_step, done, failed, redone, skipped;
    int stopped;     /* said "stopped": ended cleanly before --steps */
    int ckpt_failed; /* its last beat's failed commits in a row */
    int started;     /* in the training loop (phase train, or a step done) */
    int resume_step; /* the step it started the loop at (-1: not yet) */
    double last_beat, last_progress;
    double comm_wait_s; /* its last beat's: blocked in communication for (NaN: not sent) */
    double t_blocked;   /* its newest beat that said it waited in communication (0: none) */
    double t_wait_from; /* when that wait began, as the beat said (0: none) */
    int dumps;          /* its last beat's: SIGUSR2 hang-dump requests answered (-1: not sent) */
    unsigned long long pid_start; /* /proc start time (same host), 0: unknown */
    double t_lost;                /* its connection closed while its process lived (0: not so) */
    int adopted; /* its pid is from an earlier driver's state: no beat to this driver yet */
    int stale_pid; /* the last rank of another attempt refused for this rank (said once) */
    char host[128], phase[16], error[1024];
} sup_rank;

typedef struct {
    const sup_config *c;
    sup_events ev;
    sup_nodes *pool;
    char token[33], addr[64], ctl_addr[64], state_path[4200], hostfile_path[4200];
    char ctl_token[33]; /* the control socket's own: the ranks hold `token` (MS_HEARTBEAT_TOKEN) */
    char diag_dir[4200], ckpt_dir[4096], device[16]; /* device: the job's --device */
    int lfd, ctl_fd, lock_fd;
    sup_conn *conns;
    int n_conns;
    sup_ctl_conn ctl[SUP_MAX_CTL];
    int n_ctl;
    unsigned long serve_passes; /* sup_serve_for's passes begun (one nests in an eviction's save) */
    int reading_ahead;          /* read_ahead (sup_watch.c): beats read ahead decide no fault */
    int ahead_rank;             /* the first of them with an error of its own (not comm), or -1 */
    sup_beat ahead_beat;        /* its beat */
    double rej_t0;      /* rejected connections: the second their events are counted in */
    int rej_n, rej_cut; /* events written in it, and those left out (a flood: one line a cut) */
    sup_rank *r;
    sup_job job;
    double t_launch;
    int attempt_no;
    /* the fault of this attempt */
    int fault;
    char kind[24], detail[1100];
    int fault_rank, fault_step;
    int fault_best;     /* the best step when it was seen: the attempt's progress (policy) */
    int fault_final;    /* the policy gave up on the job when it was seen: no restart follows */
    int fault_reporter; /* >= 0: the rank whose error told of the fault (comm: a survivor) */
    int options_ok;     /* a start of this job reached training: its options are not what fails */
    int fault_booked;         /* it is in the summary's faults (book_fault) */
    int fault_usage;          /* it is a rank's usage error: a restart would be refused too */
    double t_detect, t_stall; /* when it was detected; when the rank went silent/stuck */
    int evict_node;           /* a node the detectors or the control socket named (-1) */
    char evict_reason[160];
    /* detectors */
    sup_spike spike;
    sup_straggler strag;
    int straggler_warned, nan_step, skip_step;
    double t_unclear;   /* when a stall was first seen that the beats did not pin on a rank
                         * (0: none): the verdict waits for a beat from each (sup_watch) */
    int ckpt_streak;    /* checkpoints of this attempt that failed to commit in a row */
    int ckpt_fault;     /* its fault's index in the summary (-1: none pending) */
    double t_ckpt_fail; /* when the first of them was seen */
    /* across attempts */
    int best_step, start_step, restarts, no_progress, pending_recovery, redone_booked;
    int pending_fault; /* the summary's entry of the fault being recovered from (-1) */
    double t_recovery_from;
    int step_at_fault;
    int step_before;    /* the step the job had reached when this attempt started: what its
                         * ranks redo when they resume from an earlier commit */
    int stopping;       /* the driver is stopping this attempt (its "stopped" beats are no fault) */
    double t_all_done;  /* when every rank had said "done" (0: not yet) */
    int resumed;        /* taken over from an earlier driver's state (driver.json) */
    int requeued;       /* a new job after one that ended, same options (inherit_start) */
    pid_t lost_pid;     /* that state's mpirun, which ended while no driver watched (0: not so) */
    int recovering;     /* stopped after a fault, not restarted yet (saved in driver.json) */
    int recover_prev_best; /* the best step when the attempt started (its policy's) */
    char latest0[4200]; /* CKPT_DIR/latest's identity before the job's first start */
    char job0[40];      /* CKPT_DIR/job's text then ("-": not known, an older state) */
    char restart_job[40];                   /* the --restart-job of the job's argv (job_argv) */
    const volatile sig_atomic_t *stop_flag; /* the driver's signal flag (diag gives up on it) */
    ms_fault_plan plan;                     /* --faults: the faults to hand out */
    int faults_through;                     /* the faults at steps <= this have fired */
    char fault_arg[MS_FAULT_SPEC_MAX];      /* this attempt's --inject-fault */
    char node_map[SUP_MAX_NODES * SUP_NODE_NAME];
    double step_ms_sum; /* rank 0's step times, for the ETTR's mean step time */
    long step_ms_n;
    int timed_step;      /* the last step in them (kept over restarts: a step is timed once) */
    sup_interval interval; /* the longest recent step, over ranks and attempts */
    double first_interval; /* the longest first step of an attempt (s): the limit's base
                            * until a later step is timed */
    int n_anomalies;
    /* commits that stood with a warning, as rank 0's beats count them in this attempt (the
     * most said; an adopted job's from the state file, so a driver that takes over does not
     * say them again) */
    int ckpt_warned, ckpt_warned_adopt;
    /* an adopted job's steps redone and skipped as its ranks' beats had said them (the most
     * a rank said) and the steps of the last redo and skip events: a driver that takes over
     * does not say them again */
    int redone_adopt, skipped_adopt, nan_step_adopt, skip_step_adopt;
    int straggler_warned_adopt; /* the adopted attempt's straggler anomaly was said */
    /* an earlier driver's job to take over (sup_recover.c) */
    pid_t adopt_pid;
    pid_t *adopt_pids;                /* [np]: its ranks (0: unknown or gone) */
    unsigned long long *adopt_starts; /* [np]: their verified /proc start times */
    char (*adopt_hosts)[128];         /* [np]: their hosts ("" unknown) */
    double t_saved;                   /* when driver.json was last queued */
    sup_writer *writer;               /* writes events.jsonl, compute.jsonl, driver.json */
    /* the dashboard (NULL: off) and its files */
    sup_dash *dash;
    sup_dash_rank *dash_ranks; /* [np] */
    double t_dash;             /* when the live view was last pushed */
    sup_heatlog heat;          /* RUN_DIR/compute.jsonl */
    char metrics_path[4200];   /* the job's metrics (absolute) */
    char trace_dir[4200];      /* the ranks' event logs and hang dumps ("": tracing off) */
    int own_metrics;           /* the train options name none: the driver adds it */
    char peak_cache[4200];     /* --peak-cache RUN_DIR (absolute) for the ranks, so a restart reads
                                  the probed peak; "": the train options name their own */
} sup_driver;

/* The value of option `name` in argv[0..argc) (--name V or --name=V; the
 * last one given, as the option parser takes it), or NULL (sup_driver.c). */
const char *sup_argv_value(char *const *argv, int argc, const char *name);
/* 32 random hex digits and a NUL into out[33] (sup_driver.c); 0, or -1. */
int sup_make_token(char *out);

/* sup_watch.c: the sockets and the detectors. */
int sup_listen(const char *bind_addr, int port, int *fd, char *addr, size_t an, char *why,
               size_t n);
void sup_serve(sup_driver *d); /* one tick: accept, read beats and control lines */
void sup_serve_for(sup_driver *d, int ms); /* the same, waiting at most ms for input */
/* SIGUSR2 to the job: every rank that traces writes its hang dump; waits
 * (serving) for their beats to say so, at most 3 s; event "hang_dumps"
 * with `by` and the ranks silent when they were asked, which
 * TRACE_DIR/hang_driver.json also holds (for `trace hang`).  Returns the
 * ranks that answered, *asked the ranks asked. */
int sup_hang_dumps(sup_driver *d, const char *by, int *asked);
/* Seconds since rank i's last beat if it has missed about two beats (a live
 * rank beats every second: silence past min(3 s, 0.6 x the heartbeat
 * timeout)) while connected, neither done nor failed; else -1 (sup_watch.c). */
double sup_rank_silence(const sup_driver *d, int i, double now);
/* One valid beat b of rank b->rank on heartbeat connection k (k->rank -1:
 * its first): the rank's state, the step time, the detectors fed by beats,
 * the faults a beat says (public for its tests). */
void sup_on_beat(sup_driver *d, sup_conn *k, const sup_beat *b);
void sup_watch(sup_driver *d); /* the hang, start-up and straggler detectors */
void sup_set_fault(sup_driver *d, const char *kind, int rank, double t_stall, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
const char *sup_node_name(const sup_driver *d, int rank); /* the rank's node, "" if none */
void sup_reset_ranks(sup_driver *d);
/* Push the driver's view to the dashboard (at most 4 times a second unless
 * now is set). */
void sup_dash_update(sup_driver *d, int now);
/* The effective training time ratio so far. */
double sup_ettr(const sup_driver *d);

/* sup_recover.c: diagnosis, eviction, the driver's state file. */
/* After a stopped attempt: diag on the nodes, evictions; 0 to go on, else
 * the exit code (SUP_EXIT_*). */
int sup_recover(sup_driver *d);
/* What the restart policy makes of the fault being seen: 0 (a restart), or
 * SUP_EXIT_NO_PROGRESS / SUP_EXIT_GAVE_UP; *no_progress: the restarts in a
 * row that made none, with this one.  prev_best: the attempt's best step at
 * its start. */
int sup_policy_verdict(const sup_driver *d, int prev_best, int *no_progress);
/* Did the job refuse its options (a usage error, said by a rank's last beat
 * or by mpirun's exit code 2)?  No restart or diag can change that. */
int sup_refused_options(const sup_driver *d);
/* The newest step rank 0 logged in the metrics since its start's config line (-1: none). */
int sup_metrics_step(const sup_driver *d);
/* Rank 0's loss of `step` to the loss-spike detector (once a step); a spike is an anomaly. */
void sup_feed_loss(sup_driver *d, int step, double loss);
/* The losses rank 0 logged in the metrics after the detector's last step (the steps a job
 * trained while no driver watched it, before this one took it over), fed to the detector in
 * order; those in the metrics' last 256 KB, of the current start's lines. */
void sup_metrics_catch_up(sup_driver *d);
/* Before the first start (--preflight): diag on every node not on the
 * blocklist (the spares too), evicting the ones that fail, so a node slow
 * or broken from the start never joins the job; 0 to go on, else the exit
 * code (SUP_EXIT_STORAGE). */
int sup_preflight(sup_driver *d);
/* Evict pool node i (reason, `by` "diag", "straggler", "manual"). */
int sup_evict(sup_driver *d, int i, const char *by, const char *reason);
/* Queue the driver's state (driver.json) for the writer: the newest one
 * queued is written.  sync 1: wait (at most SUP_SAVE_WAIT_S, answering the
 * sockets meanwhile) until it is on disk, for a state a successor must see
 * before the driver acts (a fault, a stopped job, a start). */
#define SUP_SAVE_WAIT_S 10.0
#define SUP_EXIT_FLUSH_S 30.0 /* at exit: the longest the driver waits for its writes */
/* then, the longest a watched dashboard stays up (sup_dash_finish): a page
 * polls each second, and reads its five endpoints once more after the
 * status it sees closing */
#define SUP_DASH_LINGER_S 5.0
void sup_state_save(sup_driver *d, int finished, int sync);
/* The --faults plan as a spec: the diag:* entries (diag 1, for the
 * self-test) or the others (diag 0, for the trainer), those past
 * after_step only (ms_fault_format), none of kind skip (NULL: no kind). */
void sup_faults_format(const sup_driver *d, int diag, int after_step, const char *skip, char *buf,
                       size_t n);
/* Read RUN_DIR/driver.json left by an earlier driver that did not finish:
 * the counters, the fault it was acting on (d->fault, an eviction's node),
 * and whether its job still runs (then d->adopt_pid and the heartbeat
 * address/token to bind).  0; -1 with why set (unreadable); -2 with why
 * set when its job still runs with other options than d->c's (--np,
 * --nodes, the pool, a train option): the job and the files are left as
 * they are (d's counters are not: the caller exits). */
int sup_state_resume(sup_driver *d, char *why, size_t n);

#endif
