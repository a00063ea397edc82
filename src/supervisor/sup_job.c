/* sup_job.c - the job: mpirun as a child in its own process group, and
 * stopping it with nothing left behind. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/shm_sweep.h"
#include "base/timeutil.h"
#include "supervisor/sup_internal.h"

/* environ with NAME=value set for the four variables (malloc'd: the
 * array and the four strings; the child gets it ready-made, since a fork
 * of a process with threads (the dashboard's) may only exec). */
#define JOB_ENV_N 4
static char **job_env(const char *hb_addr, const char *token, int attempt, const char *node_map) {
    extern char **environ;
    static const char *const names[JOB_ENV_N] = {
        "MS_HEARTBEAT=", "MS_HEARTBEAT_TOKEN=", "MS_HEARTBEAT_ATTEMPT=", "MS_NODE_MAP="};
    char att[16];
    snprintf(att, sizeof att, "%d", attempt);
    const char *vals[JOB_ENV_N] = {hb_addr, token, att, node_map};
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + JOB_ENV_N + 1, sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int ours = 0;
        for (int v = 0; v < JOB_ENV_N; v++)
            ours |= !strncmp(environ[i], names[v], strlen(names[v]));
        if (!ours) env[k++] = environ[i];
    }
    for (int v = 0; v < JOB_ENV_N; v++) {
        size_t len = strlen(names[v]) + strlen(vals[v]) + 1;
        if (!(env[k] = malloc(len))) { /* only the strings made here are freed (a short array
                                          given back freed environ's own) */
            while (v-- > 0)
                free(env[--k]);
            free(env);
            return NULL;
        }
        snprintf(env[k++], len, "%s%s", names[v], vals[v]);
    }
    return env;
}

static void job_env_free(char **env) {
    size_t n = 0;
    while (env && env[n])
        n++;
    for (size_t i = n >= JOB_ENV_N ? n - JOB_ENV_N : 0; env && i < n; i++)
        free(env[i]);
    free(env);
}

void sup_mpirun_tmpdir(char *out, size_t n) {
    /* mpirun inherits the driver's environment: the driver's own (read
     * from environ, not taken as an option of ours: it only mirrors what
     * mpirun reads) */
    extern char **environ;
    static const char *const names[4] = {"OMPI_MCA_orte_tmpdir_base=", "TMPDIR=", "TEMP=", "TMP="};
    snprintf(out, n, "/tmp");
    for (int v = 0; v < 4; v++)
        for (size_t i = 0; environ[i]; i++)
            if (!strncmp(environ[i], names[v], strlen(names[v])) && environ[i][strlen(names[v])]) {
                snprintf(out, n, "%s", environ[i] + strlen(names[v]));
                return;
            }
}

int sup_job_start(sup_job *j, char *const argv[], const char *hb_addr, const char *token,
                  int attempt, const char *node_map, int lock_fd, char *why, size_t n) {
    memset(j, 0, sizeof *j);
    sup_mpirun_tmpdir(j->tmp, sizeof j->tmp);
    char **env = job_env(hb_addr, token, attempt, node_map);
    if (!env) return snprintf(why, n, "out of memory"), -1;
    /* the child reports a failed exec through a close-on-exec pipe: a
     * missing --mpirun is a clear error here (SUP_EXIT_ERROR), not a job
     * that "exits 127", a diag of the nodes and restarts.  It waits for
     * the go on the gate pipe, whose write end only the driver holds */
    int ep[2], gate[2];
    if (pipe2(ep, O_CLOEXEC) != 0) {
        snprintf(why, n, "pipe: %s", strerror(errno));
        job_env_free(env);
        return -1;
    }
    if (pipe2(gate, O_CLOEXEC) != 0) {
        snprintf(why, n, "pipe: %s", strerror(errno));
        job_env_free(env);
        close(ep[0]), close(ep[1]);
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, n, "fork: %s", strerror(errno));
        job_env_free(env);
        close(ep[0]), close(ep[1]), close(gate[0]), close(gate[1]);
        return -1;
    }
    if (pid == 0) {
        close(ep[0]), close(gate[1]);
        if (lock_fd >= 0) close(lock_fd); /* (close-on-exec: held, it kept the flock) */
        setpgid(0, 0); /* one group: the driver stops mpirun and its ranks together */
        char go;
        ssize_t r;
        while ((r = read(gate[0], &go, 1)) < 0 && errno == EINTR) {
        }
        if (r != 1) _exit(127); /* the driver is gone before it saved this pid: no job */
        execvpe(argv[0], argv, env);
        int e = errno;
        if (write(ep[1], &e, sizeof e) < 0) { /* write(2) only: nothing that may lock */
        }
        _exit(127);
    }
    close(ep[1]), close(gate[0]);
    job_env_free(env);
    setpgid(pid, pid); /* also here: no race with the child's own call */
    j->pid = pid;
    j->held = 1, j->gate_fd = gate[1], j->exec_fd = ep[0];
    return 0;
}

int sup_job_release(sup_job *j, const char *prog, char *why, size_t n) {
    if (!j->held) return 0;
    j->held = 0;
    ssize_t put;
    while ((put = write(j->gate_fd, "g", 1)) < 0 && errno == EINTR) {
    }
    int e = put == 1 ? 0 : errno; /* before close() may change it */
    close(j->gate_fd);
    ssize_t got = 0;
    while (put == 1 && (got = read(j->exec_fd, &e, sizeof e)) < 0 && errno == EINTR) {
    }
    close(j->exec_fd);
    if (put == 1 && got != (ssize_t)sizeof e) return 0; /* it runs mpirun */
    /* the exec failed (or the child could not be told to go: it ended) */
    if (put != 1) kill(j->pid, SIGKILL);
    while (waitpid(j->pid, NULL, 0) < 0 && errno == EINTR) {
    }
    j->pid = 0;
    if (put == 1)
        snprintf(why, n, "cannot run --mpirun %s: %s", prog, strerror(e));
    else
        snprintf(why, n, "the process that was to run --mpirun %s is gone: %s", prog, strerror(e));
    return -1;
}

int sup_pid_execd(pid_t pid) {
    char path[64], theirs[4096], ours[4096];
    snprintf(path, sizeof path, "/proc/%d/exe", (int)pid);
    ssize_t a = readlink(path, theirs, sizeof theirs - 1),
            b = readlink("/proc/self/exe", ours, sizeof ours - 1);
    if (a <= 0 || b <= 0) return 0;
    theirs[a] = 0, ours[b] = 0;
    return strcmp(theirs, ours) != 0;
}

void sup_job_adopt(sup_job *j, pid_t pid) {
    memset(j, 0, sizeof *j);
    j->pid = pid;
    j->adopted = 1;
    sup_mpirun_tmpdir(j->tmp, sizeof j->tmp);
}

/* Field 3 (state), 4 (parent; ppid may be NULL), 5 (process group; pgrp may be NULL) and 22
 * (start time) of /proc/PID/stat; -1 if gone. */
static int proc_stat(pid_t pid, char *state, int *ppid, int *pgrp, unsigned long long *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p) return -1;
    unsigned long long v = 0;
    int field = 2;
    *state = '?';
    if (ppid) *ppid = -1;
    if (pgrp) *pgrp = -1;
    for (char *save = NULL, *t = strtok_r(p + 1, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        field++;
        if (field == 3) *state = t[0];
        if (field == 4 && ppid) *ppid = atoi(t);
        if (field == 5 && pgrp) *pgrp = atoi(t);
        if (field == 22) {
            v = strtoull(t, NULL, 10);
            break;
        }
    }
    if (start) *start = v;
    return 0;
}

/* The processes of process group pgid, at most max of them into out;
 * their count. */
static int group_members(pid_t pgid, pid_t *out, int max) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while (n < max && (e = readdir(d))) {
        char state;
        int pgrp;
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid > 0 && proc_stat(pid, &state, NULL, &pgrp, NULL) == 0 && pgrp == (int)pgid)
            out[n++] = pid;
    }
    closedir(d);
    return n;
}

int sup_pid_alive(pid_t pid) {
    char state;
    if (pid <= 0) return 0;
    if (proc_stat(pid, &state, NULL, NULL, NULL) != 0) return kill(pid, 0) == 0 || errno == EPERM;
    return state != 'Z' && state != 'X';
}

unsigned long long sup_pid_start(pid_t pid) {
    char state;
    unsigned long long start = 0;
    return pid > 0 && proc_stat(pid, &state, NULL, NULL, &start) == 0 ? start : 0;
}

pid_t sup_pid_parent(pid_t pid) {
    char state;
    int ppid = -1;
    return pid > 0 && proc_stat(pid, &state, &ppid, NULL, NULL) == 0 ? (pid_t)ppid : -1;
}

pid_t sup_pid_same(pid_t pid, unsigned long long start) {
    return start && sup_pid_alive(pid) && sup_pid_start(pid) == start ? pid : 0;
}

int sup_job_poll(sup_job *j) {
    if (j->exited || !j->pid) return 1;
    if (j->adopted) { /* not our child: gone is all we can know */
        if (!sup_pid_alive(j->pid)) j->exited = 1;
        return j->exited;
    }
    int st = 0;
    pid_t r = waitpid(j->pid, &st, WNOHANG);
    if (r == j->pid || (r < 0 && errno == ECHILD)) {
        j->status = r == j->pid ? st : 0;
        j->exited = 1;
        return 1;
    }
    return 0;
}

/* Reap every exited child: the driver is a child subreaper (sup_run), so
 * ranks that lose mpirun become its children.  mpirun itself, if it is
 * among them, has its status kept for the job (before, it was reaped here
 * and sup_job_poll then found no child: "exit code 0" for an mpirun that
 * failed, and an exit 2 that refused the options went unseen). */
static void reap_orphans(sup_job *j) {
    int st;
    pid_t r;
    while ((r = waitpid(-1, &st, WNOHANG)) > 0)
        if (j && !j->adopted && r == j->pid && !j->exited) j->status = st, j->exited = 1;
}

static int alive(sup_job *j, pid_t pid) {
    reap_orphans(j);
    return sup_pid_alive(pid);
}

void sup_job_sweep(sup_job *j) {
    j->swept_segments = 0, j->swept_mb = 0, j->swept_session = 0;
    if (!j->pid || !j->exited) return; /* mpirun alive: its files are its own */
    /* the pid may be another process by now: its session directory is one
     * only while no process has the pid (a new mpirun's would be in use) */
    if (!sup_pid_alive(j->pid))
        j->swept_session = ms_sweep_mpirun_session(j->tmp, (long)j->pid) == 1;
    for (int i = 0; i < j->n_killed; i++)
        if (j->killed[i] != j->pid && !sup_pid_alive(j->killed[i]) &&
            ms_sweep_mpirun_session(j->tmp, (long)j->killed[i]) == 1)
            j->swept_session = 1;
    ms_sweep_result r;
    if (ms_sweep_mpi_shm(1, &r) == MS_OK) {
        j->swept_segments = r.removed;
        j->swept_mb = (double)r.bytes / 1e6;
    }
}

double sup_job_stop(sup_job *j, int ask, double grace, const int *pids, int n, void (*wait)(void *),
                    void *arg) {
    double t0 = ms_now();
    j->escalation = 3;
    j->n_killed = 0;
    if (j->held) { /* never let go: the gate's EOF ends it before its exec */
        close(j->gate_fd), close(j->exec_fd);
        j->held = 0;
    }
    if (j->pid && !sup_job_poll(j)) {
        j->escalation = ask ? 0 : 1;
        /* ask: SIGUSR1, the trainer's stop request, to mpirun, which forwards
         * it to every rank on every host, and to the ranks here themselves
         * (they have process groups of their own; the forwarding takes a
         * while): a rank stops at its next step, taking no injected fault of
         * a later one, and takes its final checkpoint.  Not SIGTERM to
         * mpirun: Open MPI answers it by killing the ranks 1 s later, done
         * or not, and stops forwarding their output.  Then SIGCONT, so a
         * stopped rank runs to see it. */
        int sig = ask ? SIGUSR1 : SIGTERM;
        kill(ask ? j->pid : -j->pid, sig);
        for (int i = 0; i < n; i++)
            if (pids[i] > 0 && alive(j, pids[i])) kill(pids[i], sig), kill(pids[i], SIGCONT);
        kill(-j->pid, SIGCONT);
        while (!sup_job_poll(j) && ms_now() - t0 < grace) {
            if (wait)
                wait(arg); /* the driver goes on reading beats meanwhile */
            else
                usleep(20000);
        }
        if (!j->exited && ask) {
            /* the ranks did not stop within the grace (a step that does
             * not end, a final checkpoint on a slow disk): SIGTERM to
             * mpirun, which kills them and removes its files (its session
             * directory, every rank's shared-memory segment, on every
             * host); SIGKILL would leave all of them behind */
            double t1 = ms_now();
            j->escalation = 1;
            kill(j->pid, SIGTERM);
            while (!sup_job_poll(j) && ms_now() - t1 < SUP_TERM_WAIT_S)
                usleep(20000); /* no beats read: ranks killed are no news */
        }
        if (!j->exited) {
            /* mpirun behind a wrapper: the session directories of all of them */
            j->n_killed = group_members(j->pid, j->killed, SUP_JOB_KILLED_MAX);
            j->escalation = 2;
            kill(-j->pid, SIGKILL);
        }
    }
    for (int i = 0; i < n; i++) /* ranks outside the group (or not yet gone) */
        if (pids[i] > 0 && alive(j, pids[i])) kill(pids[i], SIGKILL);
    if (j->pid) {
        kill(-j->pid, SIGKILL); /* anything of the group still there */
        for (int k = 0; !sup_job_poll(j) && (!j->adopted || k < 500); k++)
            usleep(10000);
        reap_orphans(j);
    }
    for (int i = 0; i < n; i++) /* wait until the ranks are gone (they are not our children) */
        for (int k = 0; k < 500 && pids[i] > 0 && alive(j, pids[i]); k++)
            usleep(10000);
    /* and the group's processes killed (mpirun behind a wrapper): on a loaded host one
     * still dying was taken for alive, and its session directory was left */
    for (int i = 0; i < j->n_killed; i++)
        for (int k = 0; k < 500 && sup_pid_alive(j->killed[i]); k++)
            usleep(10000);
    sup_job_sweep(j);
    return ms_now() - t0;
}

void sup_job_describe(const sup_job *j, char *buf, size_t n) {
    if (j->adopted)
        snprintf(buf, n, "an unknown status (it was started by an earlier driver)");
    else if (WIFEXITED(j->status))
        snprintf(buf, n, "exit code %d", WEXITSTATUS(j->status));
    else if (WIFSIGNALED(j->status))
        snprintf(buf, n, "killed by signal %d", WTERMSIG(j->status));
    else
        snprintf(buf, n, "status %d", j->status);
}
