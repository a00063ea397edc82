/* fault.c - the fault-injection registry (see fault.h).  The only library
 * code that ends the process: an injected crash is a crash. */
#include "base/fault.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/rng.h"

static const char *const kinds[] = {
    "exit",
    "kill",
    "stop",
    "hang",
    "term",
    "slow",
    "nan-grad",
    "spike",
    "stage1:mid",
    "stage2:start",
    "stage2:mid-shard",
    "stage2:after-shard",
    "stage2:after-manifest",
    "stage2:after-commit",
    "stage2:flip-shm",
    "stage2:slow",
    "io:enospc-shard",
    "io:eio-fsync-shard",
    "io:enospc-manifest",
    "io:eio-fsync-manifest",
    "io:eio-fsync-commit",
    "io:noexchange",
    "signal:term",
    "diag:gemm",
    "diag:nan",
    "diag:memory",
    "diag:comm",
    "diag:storage",
    "diag:slow",
    "diag:blip",
};

static int known_kind(const char *k) {
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (!strcmp(k, kinds[i])) return 1;
    return 0;
}

int ms_fault_is_ckpt(const char *kind) {
    static const char *const prefix[] = {"stage1:", "stage2:", "io:", "signal:"};
    for (size_t i = 0; i < sizeof prefix / sizeof prefix[0]; i++)
        if (!strncmp(kind, prefix[i], strlen(prefix[i]))) return known_kind(kind);
    return 0;
}

int ms_fault_rank0_only(const char *kind) {
    static const char *const k[] = {"stage2:after-manifest", "stage2:after-commit",
                                    "io:enospc-manifest",    "io:eio-fsync-manifest",
                                    "io:eio-fsync-commit",   "io:noexchange"};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(kind, k[i])) return 1;
    return 0;
}

static ms_status add(ms_fault_plan *p, const ms_fault *f, const char *what) {
    if (p->n == MS_FAULT_MAX)
        return ms_error(MS_ERR_ARG, "%s: more than %d faults", what, MS_FAULT_MAX);
    p->f[p->n++] = *f;
    return MS_OK;
}

/* A decimal integer in [0, max] at s, digits only (no blank, sign or
 * overflow, which sscanf's %d let through: "exit@4294967297" fired at step
 * 1); the digits' count into *k.  0, or -1 when s holds no such number. */
static int parse_count(const char *s, unsigned long long max, unsigned long long *v, int *k) {
    unsigned long long x = 0;
    int i = 0;
    for (; s[i] >= '0' && s[i] <= '9'; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (x > (max - d) / 10) return -1;
        x = x * 10 + d;
    }
    if (i == 0) return -1;
    *v = x, *k = i;
    return 0;
}

/* random=SEED/N/MAXSTEP/WORLD: N crash, hang and transient NaN faults at distinct steps. */
static ms_status expand_random(ms_fault_plan *p, const char *arg, const char *what) {
    unsigned long long v[4] = {0};
    const char *q = arg;
    int ok = 1;
    for (int i = 0; ok && i < 4; i++) {
        int k = 0;
        ok = (i == 0 || *q++ == '/') &&
             parse_count(q, i == 0 ? ULLONG_MAX : INT32_MAX, &v[i], &k) == 0;
        q += k;
    }
    int n = (int)v[1], maxstep = (int)v[2], world = (int)v[3];
    if (!ok || *q || n < 1 || world < 1 || (long long)maxstep < (long long)n + 1)
        return ms_error(MS_ERR_ARG,
                        "%s: 'random=%s': expected random=SEED/N/MAXSTEP/WORLD with N >= 1 "
                        "faults at distinct steps in [2, MAXSTEP]",
                        what, arg);
    if (n > MS_FAULT_MAX - p->n)
        return ms_error(MS_ERR_ARG, "%s: 'random=%s': more than %d faults in all", what, arg,
                        MS_FAULT_MAX);
    /* the steps in [2, MAXSTEP] the plan's entries leave free: at least N,
     * or the draws below would never end */
    long long taken = 0;
    for (int i = 0; i < p->n; i++) {
        int dup = p->f[i].step < 2 || p->f[i].step > maxstep;
        for (int j = 0; !dup && j < i; j++)
            dup = p->f[j].step == p->f[i].step;
        taken += !dup;
    }
    if ((long long)maxstep - 1 - taken < n)
        return ms_error(MS_ERR_ARG,
                        "%s: 'random=%s': %d faults at distinct steps, but the other entries "
                        "leave %lld of the steps 2..%d free",
                        what, arg, n, (long long)maxstep - 1 - taken, maxstep);
    static const char *const mix[] = {"exit", "kill", "stop", "hang", "nan-grad"};
    ms_rng r = ms_rng_make((uint64_t)v[0], 0xfa017);
    int placed = 0;
    while (placed < n) { /* distinct steps: one fault per step */
        int step = 2 + (int)ms_rng_next_below(&r, (uint64_t)(maxstep - 1));
        int dup = 0;
        for (int i = 0; i < p->n; i++)
            dup |= p->f[i].step == step;
        if (dup) continue;
        ms_fault f = {.step = step, .rank = (int)ms_rng_next_below(&r, (uint64_t)world)};
        snprintf(f.kind, sizeof f.kind, "%s", mix[ms_rng_next_below(&r, 5)]);
        MS_TRY(add(p, &f, what));
        placed++;
    }
    return MS_OK;
}

#define FAULT_FORM "KIND[=ARG][@STEP[+]][:RANK | :node=NAME]"
#define FAULT_DELAY_MAX_MS 3600000.0 /* slow=MS, stage2:slow=MS: an hour */

/* The ":node=NAME" target at the end of entry e (its head is e[0..*head_n))
 * into f->node.  No such target: *head_n = strlen(e). */
static ms_status parse_node(const char *e, ms_fault *f, size_t *head_n, const char *what) {
    const char *t = strstr(e, ":node=");
    *head_n = t ? (size_t)(t - e) : strlen(e);
    if (!t) return MS_OK;
    const char *name = t + strlen(":node=");
    if (!ms_node_name_ok(name))
        return ms_error(MS_ERR_ARG,
                        "%s: '%s': node name '%s': expected 1 to %d characters of [A-Za-z0-9._-]",
                        what, e, name, MS_NODE_NAME_MAX - 1);
    snprintf(f->node, sizeof f->node, "%s", name);
    return MS_OK;
}

/* One entry KIND[=ARG][@STEP[+]][:RANK | :node=NAME]. */
static ms_status parse_one(ms_fault_plan *p, const char *e, const char *what) {
    ms_fault f = {.step = -1, .rank = -1};
    char head[256];
    size_t hn;
    MS_TRY(parse_node(e, &f, &hn, what));
    if (hn >= sizeof head) goto bad;
    memcpy(head, e, hn);
    head[hn] = 0;
    size_t kn = strcspn(head, "=@"); /* a kind may hold a ':' (stage1:mid) */
    /* KIND:RANK without a step ("exit:1", "stage1:mid:1"): the last ':' ends the kind when what
     * is before it is one and what follows is a rank (it was "unknown fault 'exit:1'"); split
     * before the kind's length is checked (stage2:after-manifest:10 is longer than a kind) */
    char *colon = head[kn] ? NULL : strrchr(head, ':');
    if (colon && (size_t)(colon - head) < sizeof f.kind) {
        unsigned long long r = 0;
        int rk = 0;
        memcpy(f.kind, head, (size_t)(colon - head));
        f.kind[colon - head] = 0;
        if (known_kind(f.kind) && !known_kind(head) &&
            parse_count(colon + 1, INT32_MAX, &r, &rk) == 0 && !colon[1 + rk]) {
            f.rank = (int)r;
            kn = strlen(head); /* the whole head is read */
        } else {
            colon = NULL;
        }
    } else {
        colon = NULL;
    }
    if (!colon) {
        if (kn == 0 || kn >= sizeof f.kind) goto bad;
        memcpy(f.kind, head, kn);
        f.kind[kn] = 0;
    }
    if (!strcmp(f.kind, "random") && head[kn] == '=') {
        if (f.node[0])
            return ms_error(MS_ERR_ARG, "%s: '%s': random=... takes no node target", what, e);
        return expand_random(p, head + kn + 1, what);
    }
    if (!known_kind(f.kind))
        return ms_error(
            MS_ERR_ARG,
            "%s: '%s': unknown fault '%s' (exit, kill, stop, hang, slow=MS, nan-grad, "
            "spike=X, the checkpoint points stage1:mid, stage2:start, "
            "stage2:mid-shard, stage2:after-shard, stage2:after-manifest, "
            "stage2:after-commit, stage2:flip-shm, stage2:slow=MS, io:enospc-shard, "
            "io:eio-fsync-shard, io:enospc-manifest, io:eio-fsync-manifest, "
            "io:eio-fsync-commit, io:noexchange, signal:term, the self-test's diag:gemm, diag:nan, diag:memory, "
            "diag:comm, "
            "diag:storage, diag:slow, diag:blip, or "
            "random=SEED/N/MAXSTEP/WORLD)",
            what, e, f.kind);
    const char *q = head + kn;
    int k = 0;
    if (*q == '=') { /* no blank or sign before it (sscanf took them); inf: said below */
        char *end = NULL;
        if (isspace((unsigned char)q[1]) || q[1] == '+' || q[1] == '-') goto bad;
        f.arg = strtod(q + 1, &end);
        if (end == q + 1 || !(f.arg >= 0)) goto bad;
        q = end;
    }
    /* a delay is slept with usleep, whose useconds_t wraps at 71 minutes */
    if (!strcmp(f.kind, "slow") && !(f.arg > 0 && f.arg <= FAULT_DELAY_MAX_MS))
        return ms_error(MS_ERR_ARG,
                        "%s: '%s': slow needs =MS (milliseconds per step, 0 < MS <= %.0f)", what, e,
                        FAULT_DELAY_MAX_MS);
    if (!strcmp(f.kind, "stage2:slow") && !(f.arg > 0 && f.arg <= FAULT_DELAY_MAX_MS))
        return ms_error(MS_ERR_ARG,
                        "%s: '%s': stage2:slow needs =MS (milliseconds more per persist, 0 < MS "
                        "<= %.0f)",
                        what, e, FAULT_DELAY_MAX_MS);
    if (!strcmp(f.kind, "spike") && !(f.arg > 0 && isfinite(f.arg)))
        return ms_error(MS_ERR_ARG,
                        "%s: '%s': spike needs =X (the step's lr is multiplied by X > 0)", what, e);
    unsigned long long v = 0;
    if (!isfinite(f.arg)) goto bad;
    if (*q == '@') {
        if (parse_count(q + 1, INT32_MAX, &v, &k) != 0) goto bad;
        f.step = (int)v;
        q += 1 + k;
        if (*q == '+') f.from = 1, q++;
    }
    if (*q == ':') {
        if (f.node[0] || f.rank >= 0)
            return ms_error(MS_ERR_ARG, "%s: '%s': one target only, :RANK or :node=NAME", what, e);
        if (parse_count(q + 1, INT32_MAX, &v, &k) != 0) goto bad;
        f.rank = (int)v;
        q += 1 + k;
    }
    if (*q) goto bad;
    if (f.rank >= 0 && f.node[0])
        return ms_error(MS_ERR_ARG, "%s: '%s': one target only, :RANK or :node=NAME", what, e);
    /* no STEP: the trainer's kinds fire at step 1 (as documented; they never fired), the
     * checkpoint's at the first checkpoint of the process, the self-test's at its run */
    if (f.step < 0 && !ms_fault_is_ckpt(f.kind) && strncmp(f.kind, "diag:", 5)) f.step = 1;
    /* the manifest and the commit are rank 0's: such a point aimed at another rank never
     * fired, and a chaos run reported 0 faults without a word */
    if (ms_fault_rank0_only(f.kind) && f.rank > 0)
        return ms_error(MS_ERR_ARG,
                        "%s: '%s': %s fires on rank 0 only (the rank that writes the manifest "
                        "and commits): give :0 or no target",
                        what, e, f.kind);
    if (!strcmp(f.kind, "spike") && (f.rank >= 0 || f.node[0]))
        return ms_error(MS_ERR_ARG,
                        "%s: '%s': spike takes no rank or node target (it applies on every rank, "
                        "so the replicas stay equal)",
                        what, e);
    return add(p, &f, what);
bad:
    return ms_error(MS_ERR_ARG, "%s: '%s': expected " FAULT_FORM, what, e);
}

ms_status ms_fault_parse(ms_fault_plan *p, const char *spec, const char *what) {
    if (!spec || !*spec) return MS_OK;
    size_t len = strlen(spec);
    if (len >= MS_FAULT_SPEC_MAX)
        return ms_error(MS_ERR_ARG, "%s: %zu bytes, more than the %d a plan may have", what, len,
                        MS_FAULT_SPEC_MAX - 1);
    char *buf = strdup(spec);
    if (!buf) return ms_error(MS_ERR_NOMEM, "%s: out of memory", what);
    ms_status st = MS_OK;
    for (char *save = NULL, *e = strtok_r(buf, ",", &save); e && st == MS_OK;
         e = strtok_r(NULL, ",", &save))
        st = parse_one(p, e, what);
    free(buf);
    return st;
}

void ms_fault_plan_set_node(ms_fault_plan *p, const char *name) {
    snprintf(p->self_node, sizeof p->self_node, "%s", name ? name : "");
}

/* 1 if f is an entry of `kind` for `rank` and p's node. */
static int targets(const ms_fault_plan *p, const ms_fault *f, const char *kind, int rank) {
    if (strcmp(f->kind, kind) || (f->rank >= 0 && f->rank != rank)) return 0;
    return !f->node[0] || (p->self_node[0] && !strcmp(f->node, p->self_node));
}

const ms_fault *ms_fault_find(const ms_fault_plan *p, const char *kind, int step, int rank) {
    for (int i = 0; p && i < p->n; i++) {
        const ms_fault *f = &p->f[i];
        if (!targets(p, f, kind, rank)) continue;
        if (step < 0 ? f->step < 0 : (f->step == step || (f->from && step > f->step))) return f;
    }
    return NULL;
}

int ms_fault_any(const ms_fault_plan *p, const char *kind, int rank) {
    for (int i = 0; p && i < p->n; i++)
        if (targets(p, &p->f[i], kind, rank)) return 1;
    return 0;
}

/* x as the shortest of %.15g / %.17g that reads back as x. */
static void fmt_arg(char *out, size_t n, double x) {
    snprintf(out, n, "%.15g", x);
    if (strtod(out, NULL) != x) snprintf(out, n, "%.17g", x);
}

int ms_fault_entry_format(const ms_fault *f, char *buf, size_t n) {
    char a[32] = "", at[24] = "", tgt[96] = "";
    if (f->arg > 0) {
        a[0] = '=';
        fmt_arg(a + 1, sizeof a - 1, f->arg);
    }
    if (f->step >= 0) snprintf(at, sizeof at, "@%d%s", f->step, f->from ? "+" : "");
    if (f->rank >= 0) snprintf(tgt, sizeof tgt, ":%d", f->rank);
    if (f->node[0]) snprintf(tgt, sizeof tgt, ":node=%s", f->node);
    return snprintf(buf, n, "%s%s%s%s", f->kind, a, at, tgt);
}

int ms_fault_format(const ms_fault_plan *p, int after_step, char *buf, size_t n) {
    size_t len = 0;
    int left_out = 0;
    if (n) buf[0] = 0;
    for (int i = 0; i < p->n; i++) {
        const ms_fault *f = &p->f[i];
        if (f->step >= 0 && f->step <= after_step && !f->from) continue;
        char e[256] = ","; /* the comma before every entry but the first */
        int c = len ? 1 : 0, k = ms_fault_entry_format(f, e + c, sizeof e - 1);
        if (k >= 0) k += c;
        if (k < 0 || (size_t)k >= n - len) { /* whole entries only: "exit@1" of "exit@12" */
            left_out++;
            continue;
        }
        memcpy(buf + len, e, (size_t)k + 1);
        len += (size_t)k;
    }
    return left_out;
}

int ms_fault_fire_slow(const ms_fault_plan *p, int step, int rank) {
    const ms_fault *f = ms_fault_find(p, "slow", step, rank);
    if (f) usleep((useconds_t)(f->arg * 1e3));
    return f != NULL;
}

void ms_fault_fire_process(const ms_fault_plan *p, int step, int rank) {
    if (ms_fault_find(p, "exit", step, rank)) {
        ms_errorf("step %d: injected fault: rank %d exits", step, rank);
        _exit(42);
    }
    if (ms_fault_find(p, "kill", step, rank)) {
        ms_errorf("step %d: injected fault: rank %d is killed (SIGKILL)", step, rank);
        raise(SIGKILL);
    }
    if (ms_fault_find(p, "stop", step, rank)) {
        ms_errorf("step %d: injected fault: rank %d stops (SIGSTOP)", step, rank);
        raise(SIGSTOP);
    }
    if (ms_fault_find(p, "term", step, rank)) { /* a stop that reaches this rank first */
        ms_errorf("step %d: injected fault: rank %d is sent SIGTERM", step, rank);
        raise(SIGTERM);
    }
    if (ms_fault_find(p, "hang", step, rank)) {
        ms_errorf("step %d: injected fault: rank %d hangs (no more progress)", step, rank);
        for (;;)
            pause();
    }
}
