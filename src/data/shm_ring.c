/* shm_ring.c - the shared-memory batch ring. */
#include "data/shm_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/timeutil.h"

#define SHM_MAGIC 0x4d534852u /* "MSHR" */

typedef struct {
    uint32_t magic, ready;
    uint64_t followers, batch_ints, depth;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t published; /* batches put so far */
    int dead;           /* a peer died holding the lock */
    /* then depth x uint64 readers_left, followers x uint64 taken (batches
     * follower f has read: taken[f - 1]), then depth x 2*batch_ints int32 */
} shm_header;

struct data_shm {
    data_shm_config cfg;
    char name[256];
    int leader;
    int unlinked; /* leader: the name is gone already (data_shm_unlink) */
    shm_header *h;
    size_t bytes;
    uint64_t next; /* follower: next batch index to read */
    int *ranks;    /* the members' global ranks (cfg.ranks), or NULL */
    int told;      /* the member cfg.on_wait last heard of in this put or get (-1: none) */
};

static size_t seg_bytes(const data_shm_config *c) {
    return sizeof(shm_header) + ((size_t)c->depth + (size_t)c->followers) * sizeof(uint64_t) +
           (size_t)c->depth * 2 * c->batch_ints * sizeof(int32_t);
}
static uint64_t *readers_left(shm_header *h) { return (uint64_t *)(h + 1); }
static uint64_t *taken(shm_header *h) {
    return readers_left(h) + h->depth;
}
static int32_t *slot_data(shm_header *h, uint64_t i) {
    return (int32_t *)(taken(h) + h->followers) + (i % h->depth) * 2 * h->batch_ints;
}

/* "rank R (follower F)", "the leader (rank R)", or without ranks the member alone. */
static const char *who(const data_shm *s, int member, char *buf, size_t n) {
    int r = s->ranks ? s->ranks[member] : -1;
    if (member == 0 && r >= 0)
        snprintf(buf, n, "the leader (rank %d)", r);
    else if (member == 0)
        snprintf(buf, n, "the leader");
    else if (r >= 0)
        snprintf(buf, n, "rank %d (follower %d)", r, member);
    else
        snprintf(buf, n, "follower %d", member);
    return buf;
}

/* The first follower that has not read batch b yet (1..followers), or 0. */
static int lagging(shm_header *h, uint64_t b) {
    for (uint64_t f = 0; f < h->followers; f++)
        if (taken(h)[f] <= b) return (int)f + 1;
    return 0;
}

/* Lock, turning a dead owner into an error. */
static ms_status lock(data_shm *s) {
    int rc = pthread_mutex_lock(&s->h->mu);
    if (rc == EOWNERDEAD) {
        s->h->dead = 1;
        pthread_mutex_consistent(&s->h->mu);
        pthread_mutex_unlock(&s->h->mu);
        return ms_error(MS_ERR_IO, "%s: a process sharing the batch ring died", s->name);
    }
    if (rc != 0) return ms_error(MS_ERR_INTERNAL, "%s: lock: %s", s->name, strerror(rc));
    if (s->h->dead) {
        pthread_mutex_unlock(&s->h->mu);
        return ms_error(MS_ERR_IO, "%s: a process sharing the batch ring died", s->name);
    }
    return MS_OK;
}

/* Wait on the condition until `deadline` (monotonic seconds) for `member`:
 * the leader for a follower to read batch b, a follower for the leader to
 * publish it (named in the error of a timeout). */
static ms_status wait_until(data_shm *s, double deadline, int member, uint64_t b) {
    if (s->cfg.on_wait && member != s->told) s->cfg.on_wait(s->cfg.wait_ctx, member);
    s->told = member;
    double left = deadline - ms_now();
    if (left <= 0) {
        pthread_mutex_unlock(&s->h->mu);
        char w[96];
        return ms_error(MS_ERR_IO, "%s: timed out after %g s waiting for %s to %s batch %llu",
                        s->name, s->cfg.timeout_s, who(s, member, w, sizeof w),
                        member ? "read" : "publish", (unsigned long long)b);
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double step = left < 0.2 ? left : 0.2; /* wake up now and then to re-check */
    ts.tv_sec += (time_t)step;
    ts.tv_nsec += (long)((step - (double)(time_t)step) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    int rc = pthread_cond_timedwait(&s->h->cv, &s->h->mu, &ts);
    if (rc == EOWNERDEAD) {
        s->h->dead = 1;
        pthread_mutex_consistent(&s->h->mu);
    }
    if (s->h->dead) {
        pthread_mutex_unlock(&s->h->mu);
        return ms_error(MS_ERR_IO, "%s: a process sharing the batch ring died", s->name);
    }
    if (s->cfg.give_up && s->cfg.give_up(s->cfg.wait_ctx)) {
        pthread_mutex_unlock(&s->h->mu);
        char w[96];
        return ms_error(MS_ERR_IO, "%s: given up waiting for %s to %s batch %llu", s->name,
                        who(s, member, w, sizeof w), member ? "read" : "publish",
                        (unsigned long long)b);
    }
    return MS_OK;
}

static ms_status init_sync(shm_header *h) {
    pthread_mutexattr_t ma;
    pthread_condattr_t ca;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_mutex_init(&h->mu, &ma);
    if (rc == 0) rc = pthread_cond_init(&h->cv, &ca);
    pthread_mutexattr_destroy(&ma);
    pthread_condattr_destroy(&ca);
    return rc == 0 ? MS_OK : ms_error(MS_ERR_INTERNAL, "shm ring: sync init: %s", strerror(rc));
}

static data_shm *alloc_handle(const data_shm_config *cfg, int leader) {
    data_shm *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cfg = *cfg;
    snprintf(s->name, sizeof s->name, "%s", cfg->name);
    s->cfg.name = s->name;
    s->leader = leader;
    s->bytes = seg_bytes(cfg);
    s->cfg.ranks = NULL;
    if (cfg->ranks) {
        s->ranks = malloc(((size_t)cfg->followers + 1) * sizeof *s->ranks);
        if (!s->ranks) {
            free(s);
            return NULL;
        }
        memcpy(s->ranks, cfg->ranks, ((size_t)cfg->followers + 1) * sizeof *s->ranks);
    }
    return s;
}

ms_status data_shm_open_leader(data_shm **out, const data_shm_config *cfg) {
    *out = NULL;
    if (cfg->depth < 1 || cfg->followers < 0 || cfg->batch_ints == 0)
        return ms_error(MS_ERR_ARG, "%s: bad shm ring shape", cfg->name);
    data_shm *s = alloc_handle(cfg, 1);
    if (!s) return ms_error(MS_ERR_NOMEM, "%s: out of memory", cfg->name);
    shm_unlink(s->name); /* a stale segment of a crashed run */
    int fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    ms_status st = MS_OK;
    if (fd < 0 || ftruncate(fd, (off_t)s->bytes) != 0) {
        st = ms_error(MS_ERR_IO, "%s: create shared memory (%zu bytes): %s", s->name, s->bytes,
                      strerror(errno));
        goto out;
    }
    s->h = mmap(NULL, s->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s->h == MAP_FAILED) {
        s->h = NULL;
        st = ms_error(MS_ERR_IO, "%s: mmap: %s", s->name, strerror(errno));
        goto out;
    }
    s->h->followers = (uint64_t)cfg->followers;
    s->h->batch_ints = cfg->batch_ints;
    s->h->depth = (uint64_t)cfg->depth;
    st = init_sync(s->h);
    if (st == MS_OK) {
        __atomic_store_n(&s->h->magic, SHM_MAGIC, __ATOMIC_RELEASE);
        __atomic_store_n(&s->h->ready, 1, __ATOMIC_RELEASE);
    }
out:
    if (fd >= 0) close(fd);
    if (st != MS_OK) data_shm_close(s);
    else *out = s;
    return st;
}

ms_status data_shm_open_follower(data_shm **out, const data_shm_config *cfg) {
    *out = NULL;
    if (cfg->member < 1 || cfg->member > cfg->followers)
        return ms_error(MS_ERR_ARG, "%s: follower %d of a ring of %d followers", cfg->name,
                        cfg->member, cfg->followers);
    data_shm *s = alloc_handle(cfg, 0);
    if (!s) return ms_error(MS_ERR_NOMEM, "%s: out of memory", cfg->name);
    double deadline = ms_now() + cfg->timeout_s;
    struct stat sb;
    int fd = -1;
    for (;;) { /* wait for the leader to create and size the segment */
        fd = shm_open(s->name, O_RDWR, 0);
        if (fd >= 0 && fstat(fd, &sb) == 0 && (size_t)sb.st_size == s->bytes) break;
        if (fd >= 0) close(fd);
        fd = -1;
        if (ms_now() > deadline) break;
        usleep(10000);
    }
    ms_status st = MS_OK;
    if (fd < 0) {
        st = ms_error(MS_ERR_IO, "%s: no batch ring from the leader after %.0f s", s->name,
                      cfg->timeout_s);
        goto out;
    }
    s->h = mmap(NULL, s->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s->h == MAP_FAILED) {
        s->h = NULL;
        st = ms_error(MS_ERR_IO, "%s: mmap: %s", s->name, strerror(errno));
        goto out;
    }
    while (!__atomic_load_n(&s->h->ready, __ATOMIC_ACQUIRE) && ms_now() < deadline) usleep(1000);
    if (s->h->magic != SHM_MAGIC || s->h->batch_ints != cfg->batch_ints ||
        s->h->depth != (uint64_t)cfg->depth)
        st = ms_error(MS_ERR_FORMAT, "%s: the leader's batch ring has another shape", s->name);
out:
    if (st != MS_OK) data_shm_close(s);
    else *out = s;
    return st;
}

ms_status data_shm_put(data_shm *s, const int32_t *inputs, const int32_t *targets,
                       double *wait_sec) {
    shm_header *h = s->h;
    double t0 = ms_now(), deadline = t0 + s->cfg.timeout_s;
    s->told = -1;
    MS_TRY(lock(s));
    uint64_t i = h->published, k = i % h->depth;
    while (i >= h->depth && readers_left(h)[k] > 0) { /* slot still unread */
        int f = lagging(h, i - h->depth);
        MS_TRY(wait_until(s, deadline, f ? f : 1, i - h->depth));
    }
    pthread_mutex_unlock(&h->mu);
    if (wait_sec) *wait_sec = ms_now() - t0;
    int32_t *d = slot_data(h, i); /* ours until published */
    memcpy(d, inputs, h->batch_ints * sizeof(int32_t));
    memcpy(d + h->batch_ints, targets, h->batch_ints * sizeof(int32_t));
    MS_TRY(lock(s));
    readers_left(h)[k] = h->followers;
    h->published = i + 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return MS_OK;
}

ms_status data_shm_get(data_shm *s, int32_t *inputs, int32_t *targets, double *wait_sec) {
    shm_header *h = s->h;
    double t0 = ms_now(), deadline = t0 + s->cfg.timeout_s;
    s->told = -1;
    MS_TRY(lock(s));
    while (h->published <= s->next)
        MS_TRY(wait_until(s, deadline, 0, s->next));
    pthread_mutex_unlock(&h->mu);
    if (wait_sec) *wait_sec = ms_now() - t0;
    const int32_t *d = slot_data(h, s->next); /* cannot be overwritten until we count down */
    memcpy(inputs, d, h->batch_ints * sizeof(int32_t));
    memcpy(targets, d + h->batch_ints, h->batch_ints * sizeof(int32_t));
    MS_TRY(lock(s));
    readers_left(h)[s->next % h->depth]--;
    s->next++;
    taken(h)[s->cfg.member - 1] = s->next;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return MS_OK;
}

void data_shm_unlink(data_shm *s) {
    if (!s || !s->leader || s->unlinked) return;
    shm_unlink(s->name);
    s->unlinked = 1;
}

void data_shm_close(data_shm *s) {
    if (!s) return;
    if (s->h) munmap(s->h, s->bytes);
    data_shm_unlink(s);
    free(s->ranks);
    free(s);
}
