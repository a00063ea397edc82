/* ckpt_fault.c - deterministic fault injection for the checkpoint tests.
 *
 * ckpt_options.fault is a fault plan (base/fault.h, the one syntax of every
 * injected fault; the trainer passes its --inject-fault and --ckpt-fault,
 * env MS_CKPT_FAULT): an entry POINT[@STEP][:RANK | :node=NAME] fires at
 * POINT of the checkpoint of step STEP (default: the first checkpoint this
 * process takes) on global rank RANK or the ranks of node NAME
 * (ckpt_manager_set_node; default: every rank):
 *   stage1:mid            SIGKILL halfway through the stage-1 copy
 *   stage2:start          SIGKILL before the shard is written
 *   stage2:mid-shard      half a shard written to its temp file, SIGKILL
 *   stage2:after-shard    SIGKILL once this rank's shard is fsynced
 *   stage2:after-manifest SIGKILL after the manifest, before the commit rename
 *   stage2:after-commit   SIGKILL after the commit, before DIR/latest
 *   stage2:flip-shm       one bit of the snapshot's data flipped in /dev/shm
 *                         before stage 2 reads it (memory damaged after stage
 *                         1): the persist must fail, the commits stay as they were
 *   stage2:slow=MS        stage 2 sleeps MS ms before writing the shard (a slow
 *                         or throttled disk; STEP+ for every persist from STEP):
 *                         unlike the others it leaves the schedule as it is
 *   io:enospc-shard       the shard write fails with ENOSPC
 *   io:eio-fsync-shard    the shard's fsync fails with EIO
 *   io:enospc-manifest    the manifest write fails with ENOSPC
 *   io:eio-fsync-manifest the manifest's fsync fails with EIO
 *   io:eio-fsync-commit   the fsync of the checkpoint directory after the commit
 *                         rename fails with EIO (the commit stands, with a warning)
 *   io:noexchange         the commit over an older directory of its step finds
 *                         no atomic exchange (RENAME_EXCHANGE: EINVAL, as on NFS)
 *   signal:term           SIGTERM to this process after step STEP (a clean,
 *                         deterministic stop: the trainer saves and exits)
 * While a fault other than stage2:slow is armed (ckpt_fault.serial), stage 1
 * waits for the previous persist to end, so the point is reached
 * deterministically (the checkpoint before it is committed by then).
 * Without one, a checkpoint waits only when both /dev/shm slots are busy
 * (ckpt_manager.c).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/ctx.h"
#include "ckpt/ckpt_internal.h"

ms_status ckpt_fault_parse(const char *spec, ckpt_fault *f) {
    memset(f, 0, sizeof *f);
    MS_TRY(ms_fault_parse(&f->plan, spec, "--inject-fault / --ckpt-fault (MS_CKPT_FAULT)"));
    for (int j = 0; j < f->plan.n; j++) { /* armed on every rank, whichever rank it hits */
        int ck = ms_fault_is_ckpt(f->plan.f[j].kind);
        f->armed |= ck;
        f->serial |= ck && strcmp(f->plan.f[j].kind, "stage2:slow");
    }
    return MS_OK;
}

double ckpt_fault_delay_ms(const ckpt_fault *f, const char *point, int step, int first) {
    if (!f || !f->armed) return 0;
    int rank = ms_ctx_get()->rank;
    const ms_fault *e = ms_fault_find(&f->plan, point, step, rank);
    if (!e && first) e = ms_fault_find(&f->plan, point, -1, rank);
    return e ? e->arg : 0;
}

int ckpt_fault_hits(const ckpt_fault *f, const char *point, int step, int first) {
    if (!f || !f->armed) return 0;
    int rank = ms_ctx_get()->rank;
    return ms_fault_find(&f->plan, point, step, rank) != NULL ||
           (first && ms_fault_find(&f->plan, point, -1, rank) != NULL);
}

void ckpt_fault_kill(const ckpt_fault *f, const char *point, int step, int first) {
    if (!ckpt_fault_hits(f, point, step, first)) return;
    fprintf(stderr, "[megascale r%d] injected fault %s at the checkpoint of step %d: SIGKILL\n",
            ms_ctx_get()->rank, point, step);
    fflush(stderr);
    raise(SIGKILL);
}

ms_status ckpt_fault_io_error(const char *path, const char *op, int err) {
    return ms_error(MS_ERR_IO, "%s: %s: %s (injected fault)", path, op, strerror(err));
}
