/* trace_hang_internal.h - the loaded form of a run's hang dumps, shared by
 * trace_hang.c (loading, suspects) and trace_hang_print.c (text, JSON).
 * Memory: a trace_hang owns everything inside it (trace_hang_free).
 * Thread-safety: none needed (no shared state).
 */
#ifndef MS_TRACE_HANG_INTERNAL_H
#define MS_TRACE_HANG_INTERNAL_H

#include <string.h>

#include "trace/trace_internal.h"

/* In-flight ops younger than this are no evidence of a hang (trace_hang.c, set_min_age). */
#define HANG_MIN_AGE_S 1.0

typedef struct {
    char op[32], state[16];
    int64_t seq, peer, tag, bytes; /* peer -1 for collectives, tag -1 when none */
    double age_s;
} hang_op;

typedef struct {
    char name[64];
    int *ranks; /* global ranks of the members, in group order */
    int n_ranks;
    int id; /* equal for the copies of one group (name and members) on its ranks' dumps */
    int64_t issued, completed;
    int has_last;
    hang_op last; /* the last completed op, if has_last */
    hang_op *in_flight;
    int n_in_flight;
} hang_group;

typedef struct {
    int rank, has_dump;
    int damaged;                /* its dump was there but could not be read (skipped: has_dump 0) */
    char host[256], reason[32]; /* reason: why the dump was written */
    trace_coord coord;
    hang_group *groups;
    int n_groups;
    char **why; /* the reasons this rank is suspected */
    int n_why;
    int cls;                     /* its strongest evidence: HANG_* (0: none) */
    int n_stale_by, n_exited_by; /* peers whose dumps call it unresponsive / exited */
    char stale_by[160], exited_by[160];
    double stale_age;                /* the oldest heartbeat age they saw */
    int drv_silent;                  /* the driver's hang_driver.json names it silent */
    double drv_age;                  /* then: its last beat's age (s) when the dumps were asked */
    int pid;                         /* its dump's (0: unknown) */
    double wall_s;                   /* when its dump was written (0: unknown) */
    cJSON *seen_stale, *seen_exited; /* its dump's "unresponsive" / "exited" lists */
    int oldest_g, oldest_i;          /* its oldest in-flight op, or -1 */
} hang_rank;

/* Classes of evidence, strongest first.  The suspects are the ranks with
 * the strongest class present; weaker findings on other ranks are notes
 * (most often the consequence: ranks stuck behind the culprit). */
enum {
    HANG_DEAD = 1, /* wrote no dump, or peers or the driver saw it unresponsive / exited */
    HANG_BEHIND,   /* never entered a collective its group waits in, and waits in nothing */
    HANG_STUCK,    /* every member of its group is in the op (a collective, or both ends of a
                    * transfer) and it never completed: the link, or a member stuck inside */
    HANG_NO_SEND,  /* a peer waits to receive from it; it sends nothing */
    HANG_BLOCKED,  /* never entered it, but waits in an op itself (most often for a suspect) */
    HANG_UNREAD,   /* its dump is damaged: nothing is known of what it waited in */
};

struct trace_hang {
    char *dir;
    int top_cls;    /* the strongest class of any rank (0: none) */
    double min_age; /* in-flight ops younger than this are no evidence (half the oldest's age,
                     * at least HANG_MIN_AGE_S) */
    double oldest;  /* the age of the oldest op in flight in any dump (s) */
    int world, n_dumps;
    trace_coord shape;
    hang_rank *ranks; /* [world], by global rank */
};

/* A wait for rank op->peer outside the communicator (the dump's "wait_for":
 * a tp group's shared-memory batch ring), read as a receive from it. */
static inline int hang_is_wait_for(const hang_op *op) {
    return !strcmp(op->op, "wait_for");
}

/* 1 when r is a suspect; a rank with weaker findings is a note. */
static inline int hang_is_suspect(const trace_hang *h, const hang_rank *r) {
    return r->cls && r->cls == h->top_cls;
}
static inline int hang_is_note(const trace_hang *h, const hang_rank *r) {
    return r->cls && r->cls != h->top_cls;
}

#endif
