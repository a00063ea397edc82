/* ctx.c - the process-level run context. */
#include "base/ctx.h"

#include <stdlib.h>
#include <string.h>

static ms_ctx g_ctx = {.world = 1, .local_size = 1, .log_level = MS_LOG_INFO};

static int env_int(const char *a, const char *b, int def) {
    const char *v = getenv(a);
    if (!v) v = getenv(b);
    return v ? atoi(v) : def;
}

void ms_ctx_init(void) {
    g_ctx.rank = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", 0);
    g_ctx.world = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", 1);
    g_ctx.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", 0);
    g_ctx.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", 1);
    const char *lv = getenv("MS_LOG_LEVEL");
    if (lv) {
        if (!strcmp(lv, "debug"))
            g_ctx.log_level = MS_LOG_DEBUG;
        else if (!strcmp(lv, "warn"))
            g_ctx.log_level = MS_LOG_WARN;
        else if (!strcmp(lv, "error"))
            g_ctx.log_level = MS_LOG_ERROR;
    }
}

const ms_ctx *ms_ctx_get(void) {
    return &g_ctx;
}
ms_ctx *ms_ctx_mut(void) {
    return &g_ctx;
}

static void on_signal(int sig) {
    if (g_ctx.stop) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_ctx.stop = 1;
}

void ms_ctx_catch_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL); /* a closed ssh session: stop, with a final checkpoint */
    /* a log reader that went away (`| tee` killed by the same Ctrl-C, a
     * closed ssh session) must not kill the run: the write fails with
     * EPIPE instead, which ms_log turns into a stop request */
    signal(SIGPIPE, SIG_IGN);
}
