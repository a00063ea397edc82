/* train_gate.c - a multi-rank command's errors printed once, by rank 0,
 * with the failing ranks named.
 *
 * Without it every rank prints its own error line: 8 copies of the same
 * "--lr expects a finite number" under mpirun -np 8, and one rank's real
 * failure buried among the others'.  The ranks meet at a few gates instead
 * (after MPI starts, after set-up, at the end of the command): one max
 * all-reduce of "did I fail" (a single integer when all is well); when some
 * rank failed, one all-gather of every rank's error (status, host, message),
 * and rank 0 prints one line per distinct message, naming its ranks:
 *
 *   megascale train: error (all 8 ranks): command line: --lr expects ...
 *   megascale train: error (rank 3 of 8 on node-b): val.bin: token 70000 ...
 *
 * Every rank then returns a failure with the message marked as reported
 * (ms_error_reported), so that main prints nothing more; a rank that did
 * not fail returns the first failing rank's status, its message naming
 * that rank.
 *
 * The gates run on a communicator of their own (a copy of the world), so a
 * failed rank waiting at one can never meet another collective of the
 * others.  A failed rank waits GATE_WAIT_S at most: when the others are
 * stuck elsewhere (one rank failed while the rest wait for it in a step's
 * all-reduce), its gate times out and it prints its own line as before,
 * marking the world broken (no MPI_Finalize).  A rank that did not fail
 * waits the communicator's timeout, as at any collective. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/ctx.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "comm/comm.h"
#include "train/train_internal.h"

#define GATE_WAIT_S 5.0 /* a failed rank's wait for the others */
#define REC_BYTES 512
#define REC_HOST 60
#define REC_MSG (REC_BYTES - 4 - REC_HOST)
#define LINES_MAX 8 /* distinct messages printed; the rest counted */

typedef struct {
    int32_t code;
    char host[REC_HOST];
    char msg[REC_MSG];
} gate_rec;
_Static_assert(sizeof(gate_rec) == REC_BYTES, "gate record size");

struct train_gate {
    comm_world *world;
    comm_group *group;
    char cmd[32];
    int stuck;       /* an op abandoned (gate_op): the buffers are never freed */
    int32_t flag[2]; /* this rank failed; any rank failed */
    gate_rec mine;
    gate_rec *all; /* world size records */
};

/* "ranks 0-2,5" of the n ranks flagged in sel (their world ranks). */
static void rank_list(const unsigned char *sel, int n, char *out, size_t cap) {
    size_t k = 0;
    int first = 1;
    out[0] = 0;
    for (int r = 0; r < n && k + 16 < cap; r++) {
        if (!sel[r]) continue;
        int e = r;
        while (e + 1 < n && sel[e + 1])
            e++;
        k += (size_t)snprintf(out + k, cap - k, e > r ? "%s%d-%d" : "%s%d", first ? "" : ",", r, e);
        first = 0;
        r = e;
    }
    if (k + 16 >= cap) snprintf(out + cap - 5, 5, "...");
}

/* Rank 0: one line per distinct message (in the order of its first rank). */
static void print_errors(const train_gate *g, const gate_rec *recs, int n) {
    unsigned char *done = calloc((size_t)n, 1), *sel = calloc((size_t)n, 1);
    if (!done || !sel) {
        free(done);
        free(sel);
        for (int r = 0; r < n; r++) /* no memory to group them: each as it is */
            if (recs[r].code)
                ms_log_raw("megascale %s: error (rank %d of %d on %s): %s", g->cmd, r, n,
                           recs[r].host, recs[r].msg);
        return;
    }
    int lines = 0, more = 0;
    for (int r = 0; r < n; r++) {
        if (!recs[r].code || done[r]) continue;
        int count = 0;
        memset(sel, 0, (size_t)n);
        for (int q = r; q < n; q++)
            if (recs[q].code && !done[q] && !strcmp(recs[q].msg, recs[r].msg)) {
                sel[q] = done[q] = 1;
                count++;
            }
        if (lines == LINES_MAX) {
            more += count;
            continue;
        }
        lines++;
        char who[160];
        if (count == n) {
            snprintf(who, sizeof who, "all %d ranks", n);
        } else if (count == 1) {
            snprintf(who, sizeof who, "rank %d of %d on %s", r, n, recs[r].host);
        } else {
            char list[128];
            rank_list(sel, n, list, sizeof list);
            snprintf(who, sizeof who, "ranks %s of %d", list, n);
        }
        ms_log_raw("megascale %s: error (%s): %s", g->cmd, who, recs[r].msg);
    }
    if (more)
        ms_log_raw("megascale %s: error: %d more rank(s) failed with other messages", g->cmd, more);
    fflush(stderr);
    free(done);
    free(sel);
}

/* One collective of the gate on its own buffers: all-reduce (max) of
 * g->flag, or all-gather of g->mine into g->all.  A rank that did not fail
 * waits as at any collective (the communicator's timeout); a failed rank
 * GATE_WAIT_S at most, then abandons the op (g->stuck: it may still
 * complete into the gate's buffers, which are then never freed) and
 * returns MS_ERR_TIMEOUT without a word: the caller reports its own
 * failure. */
static ms_status gate_op(train_gate *g, int failed, int gather) {
    comm_req *req = NULL;
    ms_status st =
        gather
            ? comm_allgather_start(g->group, &g->mine, g->all, sizeof g->mine, COMM_U8, &req)
            : comm_allreduce_start(g->group, &g->flag[0], &g->flag[1], 1, COMM_I32, COMM_MAX, &req);
    if (st != MS_OK || !failed) return st == MS_OK ? comm_wait(req) : st;
    double until = ms_now() + GATE_WAIT_S;
    int done = 0;
    for (useconds_t nap = 200; st == MS_OK && !done && ms_now() < until;
         nap += nap < 20000 ? nap : 0) {
        st = comm_test(req, &done);
        if (!done) usleep(nap);
    }
    if (done || st != MS_OK) return comm_wait(req);
    g->stuck = 1;
    return MS_ERR_TIMEOUT;
}

ms_status train_gate_pass(train_gate *g, ms_status st) {
    if (!g || g->stuck || (st != MS_OK && ms_error_reported())) return st; /* they know already */
    if (comm_world_broken(g->world)) return st;
    char own[2048];
    snprintf(own, sizeof own, "%s", st == MS_OK ? "" : ms_errmsg());
    int failed = st != MS_OK;
    g->flag[0] = failed;
    ms_status cs = gate_op(g, failed, 0);
    if (cs == MS_OK && g->flag[1]) {
        int n = comm_world_size(g->world), me = comm_world_rank(g->world);
        memset(&g->mine, 0, sizeof g->mine);
        g->mine.code = (int32_t)st;
        gethostname(g->mine.host, sizeof g->mine.host - 1);
        snprintf(g->mine.msg, sizeof g->mine.msg, "%s", own);
        if (strlen(own) >= sizeof g->mine.msg)
            memcpy(g->mine.msg + sizeof g->mine.msg - 4, "...", 4);
        cs = gate_op(g, failed, 1);
        if (cs == MS_OK) {
            const gate_rec *all = g->all;
            if (me == 0) print_errors(g, all, n);
            if (st == MS_OK) { /* the first failed rank's failure, named */
                int r = 0;
                while (r < n && !all[r].code)
                    r++;
                st = ms_error(r < n ? (ms_status)all[r].code : MS_ERR_INTERNAL,
                              "rank %d of %d on %s failed: %s", r, n, r < n ? all[r].host : "?",
                              r < n ? all[r].msg : "?");
            } else {
                ms_error(st, "%s", own);
            }
            ms_error_set_reported(1);
        }
    }
    if (cs != MS_OK && st != MS_OK) return ms_error(st, "%s", own); /* the others are elsewhere */
    return cs != MS_OK ? cs : st;
}

ms_status train_gate_open(comm_world *w, const char *cmd, ms_status st, train_gate **out) {
    *out = NULL;
    train_gate *g = calloc(1, sizeof *g);
    if (g) g->all = calloc((size_t)comm_world_size(w), sizeof *g->all);
    if (!g || !g->all) {
        free(g);
        return ms_error(MS_ERR_NOMEM, "out of memory for the error gate");
    }
    g->world = w;
    snprintf(g->cmd, sizeof g->cmd, "%s", cmd);
    char own[2048];
    snprintf(own, sizeof own, "%s", st == MS_OK ? "" : ms_errmsg());
    ms_status cs =
        comm_group_create_split(comm_world_group(w), 0, comm_world_rank(w), "gate", &g->group);
    if (cs != MS_OK) {
        free(g->all);
        free(g);
        return st != MS_OK ? ms_error(st, "%s", own) : cs;
    }
    *out = g;
    if (st != MS_OK) ms_error(st, "%s", own);
    return train_gate_pass(g, st);
}

void train_gate_close(train_gate *g) {
    if (!g || g->stuck) return; /* an op may still write into it */
    comm_group_destroy(g->group);
    free(g->all);
    free(g);
}

ms_status train_gate_end(train_gate *g, comm_world *w, ms_status st) {
    int reported = st != MS_OK && ms_error_reported();
    char why[2048];
    snprintf(why, sizeof why, "%s", st == MS_OK ? "" : ms_errmsg());
    train_gate_close(g);
    /* after a failure no rank reported, the others may still wait: mpirun ends the job */
    ms_status fs = w && (st == MS_OK || reported) ? comm_world_finalize(w) : MS_OK;
    if (st == MS_OK) return fs;
    ms_error(st, "%s", why);
    ms_error_set_reported(reported);
    return st;
}

ms_status train_gate_early(const char *cmd, ms_status st) {
    if (st == MS_OK || ms_ctx_get()->world <= 1) return st;
    char own[2048];
    snprintf(own, sizeof own, "%s", ms_errmsg());
    comm_world *w = NULL;
    train_gate *g = NULL;
    if (comm_world_init(&w, NULL, NULL, NULL) != MS_OK) /* the defaults: options failed */
        return ms_error(st, "%s", own);
    st = train_gate_open(w, cmd, ms_error(st, "%s", own), &g);
    return train_gate_end(g, w, st);
}
