/* ckpt_probe.c - is --ckpt-dir one directory for every rank?  (See
 * ckpt.h, ckpt_dir_probe.)  A commit needs every rank's shard in the same
 * staging directory, so a per-host local path would give commits missing
 * the other hosts' shards; this finds out at start-up, before any step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/log.h"
#include "ckpt/ckpt.h"
#include "comm/comm.h"

#define PROBE_LIST_MAX 8 /* ranks named in the message */

static void probe_path(char *buf, size_t n, const char *dir, const char *token, int rank) {
    snprintf(buf, n, "%s/.probe-%s-r%05d", dir, token, rank);
}

/* 1 if rank r's probe file holds what r wrote. */
static int probe_sees(const char *dir, const char *token, int r) {
    char path[4400], want[96], *text = NULL;
    size_t len = 0;
    probe_path(path, sizeof path, dir, token, r);
    snprintf(want, sizeof want, "megascale ckpt-dir probe %s rank %d\n", token, r);
    int ok = ms_file_read_max(path, 4096, &text, &len) == MS_OK && len == strlen(want) &&
             !memcmp(text, want, len);
    free(text);
    return ok;
}

ms_status ckpt_dir_probe(const char *dir, comm_world *w) {
    if (!w || comm_world_size(w) < 2 || !dir || !*dir) return MS_OK;
    comm_group *g = comm_world_group(w);
    int rank = comm_world_rank(w), n = comm_world_size(w);
    char token[33] = {0};
    if (rank == 0) {
        unsigned char b[16];
        if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) { /* no entropy: time and pid */
            unsigned long long x = (unsigned long long)time(NULL) * 6364136223846793005ULL ^
                                   (unsigned long long)getpid();
            for (int i = 0; i < 16; i++)
                b[i] = (unsigned char)(x >> (8 * (i % 8))) ^ (unsigned char)i;
        }
        for (int i = 0; i < 16; i++)
            snprintf(token + 2 * i, 3, "%02x", b[i]);
    }
    MS_TRY(comm_broadcast(g, token, sizeof token, COMM_U8, 0));
    char path[4400], body[96];
    probe_path(path, sizeof path, dir, token, rank);
    snprintf(body, sizeof body, "megascale ckpt-dir probe %s rank %d\n", token, rank);
    int wrote = ms_mkdirs(dir) == MS_OK && ms_file_write_atomic(path, body, strlen(body)) == MS_OK;
    char werr[512] = "";
    if (!wrote) snprintf(werr, sizeof werr, "%s", ms_errmsg());
    MS_TRY(comm_barrier(g)); /* every probe is written (fsynced, renamed) */
    /* each rank reads rank 0's probe and its neighbour's: 2 reads a rank */
    int next = (rank + 1) % n;
    int miss[2] = {!probe_sees(dir, token, 0), next != 0 && !probe_sees(dir, token, next)};
    int mine = !wrote ? 1 : miss[0] ? 2 : miss[1] ? 3 : 0;
    int *all = calloc((size_t)n, sizeof *all);
    if (!all) return ms_error(MS_ERR_NOMEM, "ckpt_dir_probe: out of memory");
    ms_status st = comm_allgather(g, &mine, all, 1, COMM_I32);
    if (st == MS_OK) st = comm_barrier(g); /* every read is done before any removal */
    if (wrote) unlink(path);
    if (st != MS_OK) {
        free(all);
        return st;
    }
    int bad = 0;
    char list[2048];
    size_t len = 0;
    for (int r = 0; r < n; r++) {
        if (!all[r]) continue;
        if (bad++ >= PROBE_LIST_MAX) continue;
        int other = all[r] == 2 ? 0 : (r + 1) % n;
        if (all[r] == 1)
            len += (size_t)snprintf(list + len, sizeof list - len,
                                    "%srank %d (on %s) cannot write its probe file%s%s",
                                    len ? "; " : "", r, comm_world_host(w, r),
                                    r == rank && werr[0] ? ": " : "", r == rank ? werr : "");
        else
            len += (size_t)snprintf(
                list + len, sizeof list - len,
                "%srank %d (on %s) cannot see the probe file of rank %d (on %s)", len ? "; " : "",
                r, comm_world_host(w, r), other, comm_world_host(w, other));
        if (len >= sizeof list) len = sizeof list - 1;
    }
    free(all);
    if (!bad) {
        ms_debug("checkpoint: --ckpt-dir %s is one directory for all %d ranks (probe %s)", dir, n,
                 token);
        return MS_OK;
    }
    return ms_error(MS_ERR_ARG,
                    "--ckpt-dir %s is not one directory shared by every rank: %s%s%s (a commit "
                    "needs every rank's shard in it: put it on a file system that every host "
                    "mounts at the same path, such as NFS or Lustre)",
                    dir, list, bad > PROBE_LIST_MAX ? "; ... " : "",
                    bad > PROBE_LIST_MAX ? "and more" : "");
}
