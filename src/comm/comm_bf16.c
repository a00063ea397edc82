/* comm_bf16.c - reductions of COMM_BF16 over MPI: user-defined MPI_Ops
 * (sum, max, min) on MPI_UINT16_T payloads.  Each combining step converts
 * both operands to fp32 (exact), combines them in fp32 and rounds the result
 * to bf16, to nearest even (a NaN stays a quiet NaN; max/min are exact).
 * The ops are declared commutative (fp32 a+b == b+a bit for bit), so MPI may
 * combine in any order: an element of a sum over n ranks goes through n-1
 * roundings, each off by at most half a bf16 ulp of the partial sum.
 *
 * Created by comm_world_init and freed by comm_world_finalize on the main
 * thread, while the communication thread is not running (MPI is used by one
 * thread at a time).  The callbacks run inside MPI on the communication
 * thread and touch only their arguments.
 */
#include <stdint.h>
#include <string.h>

#include "base/bf16.h"
#include "comm/comm_internal.h"

/* MPI_User_function: inout[i] = in[i] op inout[i]. */
static void comm_bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = ms_f32_to_bf16(ms_bf16_to_f32(a[i]) + ms_bf16_to_f32(b[i]));
}

static void comm_bf16_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        if (ms_bf16_to_f32(a[i]) > ms_bf16_to_f32(b[i])) b[i] = a[i];
}

static void comm_bf16_min(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        if (ms_bf16_to_f32(a[i]) < ms_bf16_to_f32(b[i])) b[i] = a[i];
}

ms_status comm_bf16_ops_create(comm_world *w) {
    MPI_User_function *fns[3] = {comm_bf16_sum, comm_bf16_max, comm_bf16_min};
    for (int i = 0; i < 3; i++)
        w->bf16_op[i] = MPI_OP_NULL;
    for (int i = 0; i < 3; i++) {
        int rc = MPI_Op_create(fns[i], 1, &w->bf16_op[i]);
        if (rc != MPI_SUCCESS) {
            comm_bf16_ops_free(w);
            return comm_mpi_error(rc, "MPI_Op_create (bf16)", "comm_world_init");
        }
    }
    return MS_OK;
}

void comm_bf16_ops_free(comm_world *w) {
    for (int i = 0; i < 3; i++)
        if (w->bf16_op[i] != MPI_OP_NULL) MPI_Op_free(&w->bf16_op[i]);
}
