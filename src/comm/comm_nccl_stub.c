/* comm_nccl_stub.c - stands in for comm_nccl*.c when NCCL is not built in
 * (MS_HAVE_NCCL undefined): no group ever has NCCL, and
 * comm_group_enable_nccl says why.  Compiled to nothing with MS_HAVE_NCCL.
 *
 * The definitions are weak, so the build may also compile comm_nccl.c and
 * comm_nccl_group.c (with MS_HAVE_NCCL) into a separate object library
 * linked only into the programs that run on real GPUs, next to an mscore
 * built without MS_HAVE_NCCL (and free of CUDA): there the real, strong
 * definitions win; everywhere else (CPU builds, the CUDA emulator) these.
 */
#ifndef MS_HAVE_NCCL

#include "comm/comm_internal.h"

__attribute__((weak)) int comm_nccl_wants(const comm_req *r) {
    return 0;
}

__attribute__((weak)) ms_status comm_nccl_start(comm_req *r) {
    ms_panic(__FILE__, __LINE__, "comm: NCCL op without NCCL built in");
}

__attribute__((weak)) ms_status comm_nccl_wait(comm_req *r) {
    ms_panic(__FILE__, __LINE__, "comm: NCCL op without NCCL built in");
}

__attribute__((weak)) ms_status comm_nccl_test(comm_req *r, int *done) {
    ms_panic(__FILE__, __LINE__, "comm: NCCL op without NCCL built in");
}

__attribute__((weak)) void comm_nccl_group_free(comm_group *g, int broken) {
    g->nccl = NULL;
}

__attribute__((weak)) ms_status comm_group_enable_nccl(comm_group *g, void *cuda_stream) {
    return ms_error(MS_ERR_INTERNAL,
                    "comm_group_enable_nccl on group '%s': NCCL is not built in (configure on a "
                    "machine with the CUDA toolkit and NCCL); the group stays on MPI",
                    g ? g->name : "(null)");
}

#else
typedef int comm_nccl_stub_unused; /* ISO C wants something in a translation unit */
#endif
