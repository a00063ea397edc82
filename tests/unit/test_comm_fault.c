/* test_comm_fault.c - a collective with a missing rank ends in an error on
 * every surviving rank, within the timeout, naming the op, the group and
 * the missing rank.  Run on 3 ranks by tests/comm/fault.sh (which sets
 * MS_COMM_TIMEOUT and mpirun --enable-recovery, so that mpirun lets the
 * survivors report when a rank dies):
 *   dead    rank 2 exits (_exit, no MPI_Finalize) right after a warm-up
 *           barrier; ranks 0 and 1 enter an all-reduce on the world.
 *   late    rank 2 stays alive but never enters (sleeps past the timeout).
 *   split   rank 2 exits; ranks 0 and 1 create a group by split (the
 *           group_split op must name rank 2 like any collective).
 *   stopped rank 2 stops itself (SIGSTOP: a hung process; a forked child
 *           continues it after the survivors have given up).
 *   stopped-late  rank 2 stops itself 0.5 s before the survivors' op times
 *           out, so its heartbeat is young when they give up: they wait
 *           until it is stale, and both the error and their hang dumps
 *           name it as not responding (not "alive").
 *   dead-dev as dead, with the all-reduce on (fake) device buffers staged
 *           through pinned memory (tests/comm/fake_device.h): the same
 *           report, and nothing is copied back to the device.
 *   dump    rank 2 as in late; rank 0 times out in an all-reduce and writes
 *           its hang dump; rank 1 asks for dumps 0.5 s after that (as a
 *           rank of the host that times out a moment later does): rank 0's
 *           dump still shows the all-reduce in flight, not the nothing left
 *           after its timeout failed its ops.
 *   signal-noboard  the world without its arrival board (no_board), rank
 *           2 as in late; rank 0 is asked for a dump (SIGUSR2)
 *           1 s into its all-reduce: the dump is written while the op is
 *           in flight (before, only a board's poll answered, so the dump
 *           came when the op timed out).
 *   signal-first  rank 2 as in late; rank 0 writes a dump for SIGUSR2
 *           before any op, then times out in an all-reduce: it still asks
 *           the host's other ranks for theirs (rank 1 sees the request on
 *           the board).  Before, any dump written earlier kept it from
 *           asking, and the others' stale dumps were read as current.
 *   outside  rank 0 breaks its world for a failure outside the
 *           communicator (comm_world_fail: a batch ring's wait that timed
 *           out); comm_world_check and the next op say that failure at once.
 *   postfail rank 2's MPI_Iallreduce fails as it is posted (this program
 *           wraps it through MPI's profiling interface, PMPI): the op fails
 *           naming the call, the world is broken (the next op fails at once,
 *           naming it) and rank 2 exits; ranks 0 and 1, in the same
 *           all-reduce, report it as exited, never arrived in the op.
 *           Before, a failed post left the world whole: the rank went on
 *           one collective behind its peers.
 * Survivors print "FAULT-OK r<rank> <seconds>: <message>" when every check
 * holds and exit without finalising MPI (the world is broken). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/timeutil.h"
#include "base/ctx.h"
#include "check.h"
#include "comm/comm.h"
#include "comm/comm_internal.h" /* comm_board_request_dump */
#include "comm/env_options.h"
#include "comm/fake_device.h"

/* Mode "postfail": set on rank 2, its next MPI_Iallreduce is refused as MPI refuses a post. */
static volatile int fail_iallreduce;

int MPI_Iallreduce(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,
                   MPI_Comm comm, MPI_Request *req) {
    if (fail_iallreduce) return MPI_ERR_OTHER;
    return PMPI_Iallreduce(sbuf, rbuf, count, dt, op, comm, req);
}

/* Mode "postfail" on rank 2 (see the top): exits with the summary. */
static int postfail_mode(comm_world *w) {
    comm_group *g = comm_world_group(w);
    double x[4] = {1, 2, 3, 4};
    fail_iallreduce = 1;
    T_EQ_INT(comm_allreduce(g, x, x, 4, COMM_F64, COMM_SUM), MS_ERR_INTERNAL);
    T_STR_CONTAINS(ms_errmsg(), "MPI_Iallreduce failed");
    T_STR_CONTAINS(ms_errmsg(), "group 'world'");
    T_OK(comm_world_broken(w));
    fail_iallreduce = 0;
    double t0 = ms_now();
    T_EQ_INT(comm_barrier(g), MS_ERR_INTERNAL); /* at once, not one collective behind */
    T_OK(ms_now() - t0 < 1.0);
    T_STR_CONTAINS(ms_errmsg(), "world broken");
    T_STR_CONTAINS(ms_errmsg(), "MPI_Iallreduce failed");
    if (ms_t_fail == 0) fprintf(stderr, "FAULT-OK r2 postfail: %s\n", ms_errmsg());
    int rc = ms_test_summary("test_comm_fault postfail r2");
    fflush(stderr);
    _exit(rc);
}

/* Mode "dump" on ranks 0 and 1 (see the top): exits with the summary. */
static int dump_mode(comm_world *w, int R, double timeout) {
    char dir[] = "/tmp/ms_dump_XXXXXX", path[64], *text = NULL;
    size_t len = 0;
    if (R == 1) { /* a request after rank 0's timeout dump */
        usleep((useconds_t)((timeout + 0.5) * 1e6));
        comm_board_request_dump(w);
        sleep(1);
        if (ms_t_fail == 0) fprintf(stderr, "FAULT-OK r1 dump: asked for dumps\n");
        _exit(ms_test_summary("test_comm_fault dump r1"));
    }
    T_OK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/hang_r00000.json", dir);
    T_EQ_INT(comm_world_set_dump_path(w, path), MS_OK);
    double x = 1;
    T_EQ_INT(comm_allreduce(comm_world_group(w), &x, &x, 1, COMM_F64, COMM_SUM), MS_ERR_TIMEOUT);
    sleep(2); /* rank 1's request comes and is answered meanwhile */
    T_EQ_INT(ms_file_read_all(path, &text, &len), MS_OK);
    const char *fl = text ? strstr(text, "\"in_flight\":[{\"op\":\"all_reduce\"") : NULL;
    T_OK(fl != NULL);
    T_OK(text && strstr(text, "\"reason\":\"timeout\""));
    if (!fl) fprintf(stderr, "dump: %s\n", text ? text : "(none)");
    free(text);
    unlink(path);
    rmdir(dir);
    if (ms_t_fail == 0)
        fprintf(stderr, "FAULT-OK r0 dump: the dump keeps the op it timed out in\n");
    int rc = ms_test_summary("test_comm_fault dump r0");
    fflush(stderr);
    _exit(rc);
}

/* Mode "signal-noboard", rank 0's asker: 1 s into the all-reduce, a dump
 * request (SIGUSR2, to this process); then whether the dump is on disk
 * within 1 s, the op in flight. */
typedef struct {
    const char *path;
    int seen; /* 1: written in time, the all-reduce in flight, reason "signal" */
} asker;

static void *ask_dump(void *arg) {
    asker *a = arg;
    sleep(1);
    raise(SIGUSR2); /* the handler counts the request (ms_ctx.dump_requests) */
    for (int i = 0; i < 100 && !a->seen; i++) {
        char *text = NULL;
        size_t len = 0;
        if (ms_file_read_all(a->path, &text, &len) == MS_OK && text &&
            strstr(text, "\"reason\":\"signal\"") &&
            strstr(text, "\"in_flight\":[{\"op\":\"all_reduce\""))
            a->seen = 1;
        free(text);
        usleep(10000);
    }
    return NULL;
}

static int signal_noboard_mode(comm_world *w, int R) {
    char dir[] = "/tmp/ms_dump_XXXXXX", path[64];
    T_OK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/hang_r%05d.json", dir, R);
    T_EQ_INT(comm_world_set_dump_path(w, path), MS_OK);
    asker a = {path, 0};
    ms_ctx_catch_signals();
    pthread_t th;
    int asking = R == 0 && pthread_create(&th, NULL, ask_dump, &a) == 0;
    T_OK(R != 0 || asking);
    double x = 1;
    T_EQ_INT(comm_allreduce(comm_world_group(w), &x, &x, 1, COMM_F64, COMM_SUM), MS_ERR_TIMEOUT);
    if (asking) pthread_join(th, NULL);
    T_OK(R != 0 || a.seen);
    unlink(path);
    rmdir(dir);
    if (ms_t_fail == 0)
        fprintf(stderr, "FAULT-OK r%d signal-noboard: %s\n", R,
                R ? "timed out" : "the dump came while the op was in flight");
    int rc = ms_test_summary("test_comm_fault signal-noboard");
    fflush(stderr);
    _exit(rc);
}

/* Mode "signal-first" on ranks 0 and 1 (see the top): exits with the summary. */
static int signal_first_mode(comm_world *w, int R, double timeout) {
    if (R == 1) { /* stays out of the all-reduce; waits for rank 0's request */
        int seen = 0;
        for (double t0 = ms_now(); !seen && ms_now() - t0 < timeout + 8; usleep(50000))
            seen = comm_board_dump_requests(w) > 0;
        T_OK(seen);
        if (ms_t_fail == 0) fprintf(stderr, "FAULT-OK r1 signal-first: rank 0 asked\n");
        _exit(ms_test_summary("test_comm_fault signal-first r1"));
    }
    char dir[] = "/tmp/ms_dump_XXXXXX", path[64];
    T_OK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/hang_r00000.json", dir);
    T_EQ_INT(comm_world_set_dump_path(w, path), MS_OK);
    ms_ctx_catch_signals();
    raise(SIGUSR2); /* a dump by hand (launch --ctl dump) long before any hang */
    for (int i = 0; i < 100 && comm_world_dumps(w) < 1; i++)
        usleep(20000);
    T_EQ_INT(comm_world_dumps(w), 1);
    double x = 1;
    T_EQ_INT(comm_allreduce(comm_world_group(w), &x, &x, 1, COMM_F64, COMM_SUM), MS_ERR_TIMEOUT);
    unlink(path);
    rmdir(dir);
    if (ms_t_fail == 0) fprintf(stderr, "FAULT-OK r0 signal-first: timed out, asked\n");
    int rc = ms_test_summary("test_comm_fault signal-first r0");
    fflush(stderr);
    _exit(rc);
}

/* outside: rank 0 breaks the world for a failure outside the communicator (a batch ring's
 * wait for rank 2 that timed out): comm_world_check says it, naming that failure, a later op
 * is refused at once with it, a second failure does not replace it, and MPI is not
 * finalised; the other ranks' worlds are whole (each rank's own). */
static int outside_mode(comm_world *w, int R) {
    comm_group *g = comm_world_group(w);
    if (R != 0) {
        T_EQ_INT(comm_world_check(w, "nothing"), MS_OK);
        T_OK(!comm_world_broken(w));
        if (ms_t_fail == 0) fprintf(stderr, "FAULT-OK r%d outside: a whole world\n", R);
        char name[64];
        snprintf(name, sizeof name, "test_comm_fault outside r%d", R);
        _exit(ms_test_summary(name) ? 1 : 0); /* no finalize: rank 0 will not meet it */
    }
    T_EQ_INT(comm_world_check(w, "nothing"), MS_OK);
    comm_world_fail(w, MS_ERR_TIMEOUT, "ring: timed out after 5 s waiting for rank 2");
    T_OK(comm_world_broken(w));
    comm_world_fail(w, MS_ERR_IO, "a later failure");
    T_EQ_INT(comm_world_check(w, "the ring's wait"), MS_ERR_TIMEOUT);
    T_STR_CONTAINS(ms_errmsg(), "comm: the ring's wait: world broken by an earlier failure: "
                                "ring: timed out after 5 s waiting for rank 2");
    double t0 = ms_now();
    T_EQ_INT(comm_barrier(g), MS_ERR_TIMEOUT);
    T_OK(ms_now() - t0 < 1.0);
    T_STR_CONTAINS(ms_errmsg(), "world broken by an earlier failure: ring: timed out");
    T_EQ_INT(comm_world_finalize(w), MS_ERR_TIMEOUT);
    T_STR_CONTAINS(ms_errmsg(), "MPI not finalized");
    if (ms_t_fail == 0) fprintf(stderr, "FAULT-OK r0 outside: broken from outside\n");
    return ms_test_summary("test_comm_fault outside r0");
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "dead";
    ms_ctx_init(); /* rank-aware log lines */
    comm_world *w = NULL;
    comm_options co = ms_test_comm_options(); /* MS_COMM_TIMEOUT, MS_COMM_NCCL_SYNC */
    co.no_board = !strcmp(mode, "signal-noboard");
    if (comm_world_init(&w, &argc, &argv, &co) != MS_OK) {
        fprintf(stderr, "test_comm_fault: %s\n", ms_errmsg());
        return 1;
    }
    int R = comm_world_rank(w), N = comm_world_size(w);
    double timeout = comm_world_timeout(w);
    comm_group *g = comm_world_group(w);
    T_EQ_INT(N, 3);
    T_EQ_INT(comm_barrier(g), MS_OK); /* everyone is up */
    if (!strcmp(mode, "outside")) return outside_mode(w, R);
    if (R == 2) {
        if (!strcmp(mode, "postfail")) return postfail_mode(w);
        if (!strcmp(mode, "dead") || !strcmp(mode, "split") || !strcmp(mode, "dead-dev")) _exit(0);
        if (!strcmp(mode, "stopped") || !strcmp(mode, "stopped-late")) {
            if (!strcmp(mode, "stopped-late")) usleep((useconds_t)((timeout - 0.5) * 1e6));
            pid_t self = getpid();
            if (fork() == 0) {
                sleep((unsigned)(timeout + 5));
                kill(self, SIGCONT);
                _exit(0);
            }
            raise(SIGSTOP);
            _exit(0);
        }
        sleep((unsigned)(timeout + 2));
        _exit(0);
    }
    if (!strcmp(mode, "dump")) return dump_mode(w, R, timeout);
    if (!strcmp(mode, "signal-noboard")) return signal_noboard_mode(w, R);
    if (!strcmp(mode, "signal-first")) return signal_first_mode(w, R, timeout);
    int on_dev = !strcmp(mode, "dead-dev");
    fake_dev fd;
    comm_device dev;
    fake_dev_init(&fd, &dev);
    double xh[64], *x = xh;
    if (on_dev) {
        T_EQ_INT(comm_world_set_device(w, &dev), MS_OK);
        x = fake_dev_alloc(&fd, sizeof xh);
    }
    for (int i = 0; i < 64; i++)
        x[i] = R + i;
    int split = !strcmp(mode, "split"), late = !strcmp(mode, "stopped-late");
    char dump[128];
    snprintf(dump, sizeof dump, "/tmp/ms_comm_fault_%d_r%d.json", (int)getppid(), R);
    if (late) T_EQ_INT(comm_world_set_dump_path(w, dump), MS_OK);
    comm_group *sub = NULL;
    double t0 = ms_now();
    ms_status st = split ? comm_group_create_split(g, 0, R, "sub", &sub)
                         : comm_allreduce(g, x, x, 64, COMM_F64, COMM_SUM);
    double el = ms_now() - t0;
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", ms_errmsg());
    T_EQ_INT(st, MS_ERR_TIMEOUT);
    T_OK(el <= timeout + (late ? 3.5 : 1.0)); /* late: the wait for its heartbeat to age */
    T_STR_CONTAINS(msg, split ? "group_split" : "all_reduce");
    T_OK(sub == NULL);
    T_STR_CONTAINS(msg, "group 'world'");
    T_STR_CONTAINS(msg, "not arrived: rank 2 (global 2");
    int exited = !strcmp(mode, "dead") || !strcmp(mode, "postfail") || split || on_dev;
    T_STR_CONTAINS(msg, exited                             ? "exited"
                        : !strcmp(mode, "stopped") || late ? "not responding"
                                                           : "alive");
    T_OK(strstr(msg, "rank 0 (global") == NULL && strstr(msg, "rank 1 (global") == NULL);
    T_OK(comm_world_broken(w));
    if (late) { /* the dump names rank 2 as unresponsive */
        FILE *f = fopen(dump, "r");
        char text[8192] = "";
        size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
        text[n] = 0;
        if (f) fclose(f);
        T_STR_CONTAINS(text, "\"unresponsive\":[{\"rank\":2,");
        unlink(dump);
    }
    if (on_dev) { /* staged: copied in, never back; untouched device buffer */
        T_EQ_INT(fd.to_host, 1);
        T_EQ_INT(fd.to_device, 0);
        T_EQ_INT(x[1], R + 1);
        T_EQ_INT(fd.wrong_thread, 0);
    }
    /* later ops fail at once, naming the original failure */
    T_EQ_INT(comm_barrier(g), MS_ERR_TIMEOUT);
    T_STR_CONTAINS(ms_errmsg(), "world broken");
    T_EQ_INT(comm_world_finalize(w), MS_ERR_TIMEOUT);
    T_STR_CONTAINS(ms_errmsg(), "MPI not finalized");
    if (ms_t_fail == 0) fprintf(stderr, "FAULT-OK r%d %.1f s: %s\n", R, el, msg);
    /* postfail: rank 1 stays until rank 0 has reported (its exit is no part of the fault):
     * rank 0 leaves a file when it has, rank 1 waits for it (at most timeout + 10 s) */
    if (!strcmp(mode, "postfail")) {
        char done[128];
        snprintf(done, sizeof done, "/tmp/ms_comm_fault_%d_postfail.done", (int)getppid());
        if (R == 0) {
            FILE *f = fopen(done, "w");
            if (f) fclose(f);
        } else {
            for (double t1 = ms_now(); access(done, F_OK) != 0 && ms_now() - t1 < timeout + 10;)
                usleep(20000);
            unlink(done);
        }
    }
    char name[64];
    snprintf(name, sizeof name, "test_comm_fault %s r%d", mode, R);
    int rc = ms_test_summary(name);
    fflush(stdout);
    fflush(stderr);
    _exit(rc); /* MPI is not finalised: skip atexit handlers */
}
