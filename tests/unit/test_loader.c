/* test_loader.c - the asynchronous prefetcher (same batches and cursors as
 * the synchronous loader, errors delivered in order, resumable) and the
 * shared-memory batch ring (one leader, several follower processes,
 * identical batches, dead peers detected). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "check.h"
#include "data/loader.h"
#include "data/prefetch.h"
#include "data/shard.h"
#include "data/shm_ring.h"

/* Shard whose token i is (i * 7) % mod, with one bad id at `bad` if >= 0. */
static void write_shard(const char *path, uint32_t n, uint32_t mod, long bad) {
    data_shard_writer w;
    T_EQ_INT(data_shard_writer_open(&w, path, 1), MS_OK);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t t = (uint32_t)(((uint64_t)i * 7) % mod);
        if ((long)i == bad) t = 60000;
        data_shard_writer_put(&w, &t, 1);
    }
    T_EQ_INT(data_shard_writer_commit(&w), MS_OK);
}

static void test_prefetch(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/p.bin", dir);
    write_shard(path, 5000, 1000, -1);
    for (int order = 0; order < 2; order++) {
        data_loader_config c = {path, 3, 16, 1000, (data_order)order, 11, 0, 1, 1};
        data_loader *sync, *async;
        T_EQ_INT(data_loader_open(&sync, &c), MS_OK);
        T_EQ_INT(data_loader_open(&async, &c), MS_OK);
        data_prefetch *p;
        T_EQ_INT(data_prefetch_start(&p, async, 3, 16, 4), MS_OK);
        int same = 1, cursors = 1;
        int32_t a[48], at[48], b[48], bt[48];
        for (int k = 0; k < 300; k++) { /* several epochs */
            data_loader_next(sync, a, at);
            double wait;
            T_EQ_INT(data_prefetch_next(p, b, bt, &wait), MS_OK);
            same &= !memcmp(a, b, sizeof a) && !memcmp(at, bt, sizeof at);
            data_cursor cs = data_loader_cursor(sync), cp = data_prefetch_cursor(p);
            cursors &= cs.pos == cp.pos && cs.shard == cp.shard && cs.epoch == cp.epoch;
        }
        T_OK(same);
        T_OK(cursors);
        /* stop with batches still in the ring: the loader rewinds to the
         * consumer's cursor, so the next batch is the one after the last used */
        data_prefetch_stop(p);
        data_loader_next(sync, a, at);
        data_loader_next(async, b, bt);
        T_OK(!memcmp(a, b, sizeof a));
        data_loader_close(sync);
        data_loader_close(async);
    }
    /* an error in the thread arrives with the batch it belongs to */
    snprintf(path, sizeof path, "%s/bad.bin", dir);
    write_shard(path, 2000, 1000, 16 * 3 * 5 + 4); /* inside batch 5 (0-based) */
    data_loader_config c = {path, 3, 16, 1000, DATA_ORDER_SEQUENTIAL, 1, 0, 1, 1};
    data_loader *dl;
    T_EQ_INT(data_loader_open(&dl, &c), MS_OK);
    data_prefetch *p;
    T_EQ_INT(data_prefetch_start(&p, dl, 3, 16, 2), MS_OK);
    int32_t b[48], bt[48];
    for (int k = 0; k < 5; k++) T_EQ_INT(data_prefetch_next(p, b, bt, NULL), MS_OK);
    T_EQ_INT(data_prefetch_next(p, b, bt, NULL), MS_ERR_RANGE);
    T_STR_CONTAINS(ms_errmsg(), "bad.bin");
    T_STR_CONTAINS(ms_errmsg(), "60000");
    T_EQ_INT(data_prefetch_next(p, b, bt, NULL), MS_ERR_RANGE);
    data_prefetch_stop(p);
    data_loader_close(dl);
}

static void fill(int32_t *x, size_t n, int k) {
    for (size_t i = 0; i < n; i++) x[i] = (int32_t)(k * 1000003 + (int)i);
}

/* Follower process: read `nb` batches, exit 0 if all are right. */
static double give_up_at; /* give_up_later: yes from this time on */

static int give_up_later(void *ctx) {
    (void)ctx;
    return ms_now() >= give_up_at;
}

static int follower(const data_shm_config *c, int nb, int die_after) {
    data_shm *s;
    if (data_shm_open_follower(&s, c) != MS_OK) {
        fprintf(stderr, "follower: %s\n", ms_errmsg());
        return 2;
    }
    int32_t *in = malloc(c->batch_ints * 4), *tg = malloc(c->batch_ints * 4);
    int32_t *want = malloc(c->batch_ints * 4);
    int bad = 0;
    for (int k = 0; k < nb; k++) {
        if (k == die_after) _exit(9); /* a follower that dies */
        if (data_shm_get(s, in, tg, NULL) != MS_OK) {
            fprintf(stderr, "follower: %s\n", ms_errmsg());
            return 3;
        }
        fill(want, c->batch_ints, k);
        bad |= memcmp(in, want, c->batch_ints * 4) != 0;
        fill(want, c->batch_ints, -k);
        bad |= memcmp(tg, want, c->batch_ints * 4) != 0;
    }
    data_shm_close(s);
    return bad ? 4 : 0;
}

static void test_shm(void) {
    char name[64];
    snprintf(name, sizeof name, "/ms-test-ring-%d", (int)getpid());
    data_shm_config c = {
        .name = name, .followers = 2, .batch_ints = 1000, .depth = 3, .timeout_s = 5.0};
    int nb = 200;
    pid_t kids[2];
    for (int i = 0; i < 2; i++) {
        c.member = i + 1;
        if ((kids[i] = fork()) == 0) _exit(follower(&c, nb, -1));
    }
    c.member = 0;
    data_shm *s;
    T_EQ_INT(data_shm_open_leader(&s, &c), MS_OK);
    int32_t in[1000], tg[1000];
    for (int k = 0; k < nb; k++) {
        fill(in, 1000, k);
        fill(tg, 1000, -k);
        if (data_shm_put(s, in, tg, NULL) != MS_OK) {
            T_OK(!"put failed");
            fprintf(stderr, "%s\n", ms_errmsg());
            break;
        }
    }
    for (int i = 0; i < 2; i++) {
        int ws = 0;
        waitpid(kids[i], &ws, 0);
        T_OK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    }
    data_shm_close(s);

    /* a follower that dies: the leader reports it after the timeout */
    c.timeout_s = 1.0;
    c.followers = 1;
    c.member = 1;
    pid_t k = fork();
    if (k == 0) _exit(follower(&c, nb, 5));
    c.member = 0;
    T_EQ_INT(data_shm_open_leader(&s, &c), MS_OK);
    ms_status st = MS_OK;
    for (int b = 0; b < 50 && st == MS_OK; b++) {
        fill(in, 1000, b);
        fill(tg, 1000, -b);
        st = data_shm_put(s, in, tg, NULL);
    }
    T_EQ_INT(st, MS_ERR_IO);
    T_STR_CONTAINS(ms_errmsg(), name);
    T_STR_CONTAINS(ms_errmsg(), "timed out");
    T_STR_CONTAINS(ms_errmsg(), "waiting for follower 1 to read batch 5");
    waitpid(k, NULL, 0);
    data_shm_close(s);

    /* with the members' ranks: of two followers, the one that stops reading
     * is named by its rank, not the one that keeps up */
    int ranks[3] = {10, 11, 12};
    c.followers = 2;
    c.ranks = ranks;
    pid_t two[2];
    for (int i = 0; i < 2; i++) {
        c.member = i + 1;
        if ((two[i] = fork()) == 0) _exit(follower(&c, nb, i ? 7 : -1));
    }
    c.member = 0;
    T_EQ_INT(data_shm_open_leader(&s, &c), MS_OK);
    st = MS_OK;
    for (int b = 0; b < 50 && st == MS_OK; b++) {
        fill(in, 1000, b);
        fill(tg, 1000, -b);
        st = data_shm_put(s, in, tg, NULL);
    }
    T_EQ_INT(st, MS_ERR_IO);
    T_STR_CONTAINS(ms_errmsg(), "waiting for rank 12 (follower 2) to read batch 7");
    for (int i = 0; i < 2; i++)
        waitpid(two[i], NULL, 0);
    data_shm_close(s);

    /* a leader that stops publishing: the follower names it */
    c.followers = 1;
    pid_t lead = fork();
    if (lead == 0) {
        data_shm *l;
        c.member = 0;
        if (data_shm_open_leader(&l, &c) != MS_OK) _exit(2);
        for (int b = 0; b < 3; b++) {
            fill(in, 1000, b);
            fill(tg, 1000, -b);
            if (data_shm_put(l, in, tg, NULL) != MS_OK) _exit(3);
        }
        usleep(1500000); /* past the follower's timeout, holding the segment */
        data_shm_close(l);
        _exit(0);
    }
    c.member = 1;
    data_shm *fw;
    T_EQ_INT(data_shm_open_follower(&fw, &c), MS_OK);
    for (int b = 0; b < 3; b++)
        T_EQ_INT(data_shm_get(fw, in, tg, NULL), MS_OK);
    T_EQ_INT(data_shm_get(fw, in, tg, NULL), MS_ERR_IO);
    T_STR_CONTAINS(ms_errmsg(), "waiting for the leader (rank 10) to publish batch 3");
    data_shm_close(fw);
    waitpid(lead, NULL, 0);

    /* the same with give_up saying yes 0.3 s into the wait (the caller's world broke):
     * the follower stops waiting then, not at its 5 s timeout */
    c.timeout_s = 5.0;
    lead = fork();
    if (lead == 0) {
        data_shm *l;
        c.member = 0;
        if (data_shm_open_leader(&l, &c) != MS_OK) _exit(2);
        usleep(2000000);
        data_shm_close(l);
        _exit(0);
    }
    usleep(100000); /* the leader's segment exists */
    c.member = 1;
    give_up_at = ms_now() + 0.3;
    c.give_up = give_up_later;
    T_EQ_INT(data_shm_open_follower(&fw, &c), MS_OK);
    double t0 = ms_now();
    T_EQ_INT(data_shm_get(fw, in, tg, NULL), MS_ERR_IO);
    T_OK(ms_now() - t0 < 1.5);
    T_STR_CONTAINS(ms_errmsg(), "given up waiting for the leader (rank 10) to publish batch 0");
    data_shm_close(fw);
    waitpid(lead, NULL, 0);
    c.give_up = NULL;
    c.timeout_s = 1.0;

    /* the leader's put reports how long it waited for a slow follower: the
     * ring holds 3 batches, so the 4th put waits for the first read */
    c.timeout_s = 5.0;
    c.member = 1;
    pid_t slow = fork();
    if (slow == 0) {
        usleep(300000);
        _exit(follower(&c, 4, -1));
    }
    c.member = 0;
    T_EQ_INT(data_shm_open_leader(&s, &c), MS_OK);
    double waited[4] = {0};
    for (int b = 0; b < 4; b++) {
        fill(in, 1000, b);
        fill(tg, 1000, -b);
        T_EQ_INT(data_shm_put(s, in, tg, &waited[b]), MS_OK);
    }
    T_OK(waited[0] < 0.1 && waited[1] < 0.1 && waited[2] < 0.1);
    T_OK(waited[3] > 0.15 && waited[3] < 4.0);
    int ws = 0;
    waitpid(slow, &ws, 0);
    T_OK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    data_shm_close(s);

    /* a follower's member must be one of the ring's followers */
    c.member = 0;
    T_EQ_INT(data_shm_open_follower(&fw, &c), MS_ERR_ARG);
    c.member = 2;
    T_EQ_INT(data_shm_open_follower(&fw, &c), MS_ERR_ARG);
    c.member = 1;
    c.ranks = NULL;

    /* no leader: a follower gives up after the timeout, naming the ring */
    data_shm *f;
    T_EQ_INT(data_shm_open_follower(&f, &c), MS_ERR_IO);
    T_STR_CONTAINS(ms_errmsg(), name);
}

/* Shards of two header kinds in one glob are two tokenizers' ids: refused,
 * naming both files (they were read as one stream).  And shuffle's "fewer
 * windows than a step" counts the step's rows, accumulation included (it
 * counted one micro-batch per rank: a step then repeated windows). */
static void test_glob_checks(const char *dir) {
    char path[512], pat[512];
    snprintf(path, sizeof path, "%s/mix_000.bin", dir);
    write_shard(path, 2000, 1000, -1);
    snprintf(path, sizeof path, "%s/mix_001.bin", dir);
    data_shard_writer w;
    T_EQ_INT(data_shard_writer_open(&w, path, 2), MS_OK); /* uint32 tokens */
    for (uint32_t i = 0; i < 2000; i++) {
        uint32_t t = i % 1000;
        data_shard_writer_put(&w, &t, 1);
    }
    T_EQ_INT(data_shard_writer_commit(&w), MS_OK);
    snprintf(pat, sizeof pat, "%s/mix_*.bin", dir);
    data_loader_config c = {pat, 3, 16, 1000, DATA_ORDER_SHUFFLE, 1, 0, 1, 1};
    data_loader *dl = NULL;
    T_EQ_INT(data_loader_open(&dl, &c), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "mix_001.bin is a GPT-2 uint32 shard");
    T_STR_CONTAINS(ms_errmsg(), "mix_000.bin is a GPT-2 uint16 one");
    snprintf(path, sizeof path, "%s/five.bin", dir); /* 81 tokens: 5 windows of T+1 = 17 */
    write_shard(path, 81, 1000, -1);
    data_loader_config f = {path, 2, 16, 1000, DATA_ORDER_SHUFFLE, 1, 0, 1, 2}; /* 4 rows */
    T_EQ_INT(data_loader_open(&dl, &f), MS_OK);
    data_loader_close(dl);
    f.accum = 3; /* 6 rows a step */
    T_EQ_INT(data_loader_open(&dl, &f), MS_ERR_FORMAT);
    T_STR_CONTAINS(ms_errmsg(), "only 5 windows of T+1=17, fewer than one step's batch of 6");
}

int main(void) {
    char dir[] = "/tmp/ms_loader_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_prefetch(dir);
    test_glob_checks(dir);
    test_shm();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return ms_test_summary("test_loader");
}
