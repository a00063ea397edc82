/* shm_sweep.h - files that killed processes left in shared memory, found
 * and removed: a file in a directory whose name starts with a prefix, that
 * this user owns and that no live process maps or holds open.
 *
 * Open MPI's shared-memory transport (btl vader) gives every rank a 4 MiB
 * file, /dev/shm/vader_segment.HOST.UID.JOBID.LOCALRANK, which the rank's
 * mpirun removes when the job ends; when mpirun itself is killed (SIGKILL:
 * a supervisor's last resort, the OOM killer, an operator), every rank's
 * file of the host stays until the machine reboots.  The supervisor sweeps
 * its host after it stops a job, and the first rank of every host sweeps
 * that host after MPI_Init, so a job restarted a hundred times does not
 * leak a hundred times.
 *
 * Why a file is known unused: the processes are read after the directory,
 * each one's open files (/proc/PID/fd) before its mappings
 * (/proc/PID/maps).  A file listed was created by open(), which holds it
 * from then on until the process maps it and closes it, so a file in use is
 * seen in one of the two.  Not seen: processes whose maps this user may not
 * read (not dumpable: ssh-agent, a daemon that changed its uid, a sandbox's
 * own agent; counted in `unreadable`; an MPI rank is none of them), and
 * processes in another PID namespace: the HOST part of the name keeps a
 * sweep to the files of its own host name (containers sharing /dev/shm have
 * names of their own).  Files younger than min_age are left alone.
 *
 * Who calls it: comm_world_init (first rank of a host), the supervisor after
 * a stop, the trainer's batch-ring leaders (their own rings of killed jobs,
 * /dev/shm/megascale-batches-HOST-*).  Memory: none kept.  Thread-safety: no shared state.
 */
#ifndef MS_SHM_SWEEP_H
#define MS_SHM_SWEEP_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct {
    int found;      /* files of the prefix, ours, old enough */
    int in_use;     /* ... that a live process maps or holds */
    int removed;    /* ... unused: unlinked (do_remove), or would be */
    uint64_t bytes; /* size of the removed (or removable) ones */
    int unreadable; /* processes of this user (any, for root) not read */
} ms_sweep_result;

/* The files in dir whose names begin with prefix, of this user, regular,
 * last changed at least min_age_s ago, that no live process maps or holds
 * open: unlinked when do_remove.  Errors: MS_ERR_IO naming dir when it cannot
 * be read (a missing dir is no error: nothing found). */
ms_status ms_sweep_unused(const char *dir, const char *prefix, double min_age_s, int do_remove,
                          ms_sweep_result *r);

/* This host's name as Open MPI writes it in file names, up to the first
 * dot ("" when unknown): the part of a shared-memory file's name that keeps
 * a sweep to its own host's files (containers that share /dev/shm, each in
 * its own PID namespace, have names of their own). */
void ms_shm_host_name(char *out, size_t n);

/* Open MPI's vader segments of this host in /dev/shm (prefix
 * "vader_segment.HOST." with HOST the host name up to its first dot, as
 * Open MPI writes it), at least 2 s old: ms_sweep_unused. */
ms_status ms_sweep_mpi_shm(int do_remove, ms_sweep_result *r);

/* Remove the session directory that mpirun `pid` (now gone) kept under
 * tmp (NULL or "": /tmp): TMP/ompi.HOST.UID/pid.PID, if it is there and
 * ours.  1 removed, 0 none there, -1 a removal failed. */
int ms_sweep_mpirun_session(const char *tmp, long pid);

#endif
