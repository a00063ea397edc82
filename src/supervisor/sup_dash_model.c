/* sup_dash_model.c - what the dashboard knows of a run, built line by line
 * from its files: the metrics (curves, checkpoints, the layout), the
 * supervisor's events (the log, each rank's and node's state, the bottom
 * line) and the compute rows (the heat map); and the API's replies from it
 * (docs/formats.md, "Dashboard API").  No I/O here: sup_dash.c feeds it. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor/sup_dash_internal.h"
#include "supervisor/sup_internal.h"

typedef struct {
    int step;
    double wall, loss, lr, grad_norm, tok_s, mfu, ms, tokens;
} point;

typedef struct {
    int step;
    double wall, loss;
} val_point;

typedef struct {
    int step;
    double bytes, stall_ms, persist_ms, wall;
} ckpt_rec;

#define DASH_EARLY 16

typedef enum { R_STARTING, R_RUNNING, R_SLOW, R_HUNG, R_DEAD, R_EVICTED, R_STOPPED, R_DONE } rstate;
static const char *const RSTATE[] = {"starting", "running", "slow",    "hung",
                                     "dead",     "evicted", "stopped", "done"};

typedef struct {
    char node[SUP_NODE_NAME], host[128], last_fault[96];
    rstate state;
    int faults, step;
    int up; /* a rank_up since the attempt's launch */
    /* its first DASH_EARLY compute times (any attempt) and their lower quartile: its own
     * early speed, the heat map's measure for a stage of one rank (NAN: not enough yet) */
    float early[DASH_EARLY];
    int n_early;
    double early_ms;
} rank_rec;

typedef enum { N_ACTIVE, N_SPARE, N_EVICTED } nstate;
static const char *const NSTATE[] = {"active", "spare", "evicted"};

typedef struct {
    char name[SUP_NODE_NAME], reason[160];
    nstate state;
} node_rec;

struct dash_model {
    /* metrics */
    point *pts;
    int n_pts;
    val_point *val;
    int n_val;
    ckpt_rec *ckpts;
    int n_ckpts;
    long epoch;
    int world, dp, pp, tp, steps;
    char model[96];
    double params; /* the model's parameters (NAN: not known) */
    /* events */
    char **ev; /* ring of DASH_MAX_EVENTS lines */
    long first_seq, next_seq;
    size_t ev_bytes; /* of the lines first_seq .. next_seq - 1 */
    char metrics_path[4200];
    int own_metrics; /* it is the driver's RUN_DIR/metrics.jsonl (job_start's own_metrics) */
    double t0, started, straggler_score;
    double cfg_wall;  /* the first metrics config line's time: a plain run's start (NAN) */
    double last_time; /* the newest time an event or a step says (NAN: none) */
    char job_state[16], outcome[32];
    int attempt, restarts, faults, best_step;
    int resumed; /* driver_resumed was the last event: the next job_start goes on its job */
    cJSON *summary;
    int np;
    rank_rec *ranks;
    int n_up;  /* ranks with up set: the attempt runs once all are */
    long work; /* rank records the event being applied touched (dash_model_event_line) */
    node_rec nodes[SUP_MAX_NODES];
    int n_nodes;
    /* compute rows: slot k holds step heat_step[k] (-1: empty) */
    int heat_keep;
    int *heat_step;
    double *heat_ms; /* [heat_keep][np] */
    long bad;
};

dash_model *dash_model_new(void) {
    dash_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->pts = malloc(DASH_MAX_POINTS * sizeof *m->pts);
    m->val = malloc(DASH_MAX_VAL * sizeof *m->val);
    m->ckpts = malloc(DASH_MAX_CKPTS * sizeof *m->ckpts);
    m->ev = calloc(DASH_MAX_EVENTS, sizeof *m->ev);
    if (!m->pts || !m->val || !m->ckpts || !m->ev) {
        dash_model_free(m);
        return NULL;
    }
    m->straggler_score = 0.6;
    m->t0 = m->started = m->params = m->cfg_wall = m->last_time = NAN;
    snprintf(m->job_state, sizeof m->job_state, "starting");
    return m;
}

void dash_model_free(dash_model *m) {
    if (!m) return;
    for (int i = 0; m->ev && i < DASH_MAX_EVENTS; i++)
        free(m->ev[i]);
    free(m->ev);
    free(m->pts);
    free(m->val);
    free(m->ckpts);
    free(m->ranks);
    free(m->heat_step);
    free(m->heat_ms);
    cJSON_Delete(m->summary);
    free(m);
}

double dash_model_last_time(const dash_model *m) {
    return m->last_time;
}

const char *dash_model_metrics_path(const dash_model *m) {
    return m->metrics_path;
}

long dash_model_bad_lines(const dash_model *m) {
    return m->bad;
}

/* ---- small JSON helpers ------------------------------------------------- */

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) ? v->valuedouble : NAN;
}

static int int_in(const cJSON *o, const char *key, int lo, int hi, int def) {
    double v = num(o, key);
    return isfinite(v) && v >= lo && v <= hi && v == floor(v) ? (int)v : def;
}

static const char *str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static cJSON *jnum(double v) {
    return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

static void add_num(cJSON *o, const char *key, double v) {
    cJSON_AddItemToObject(o, key, jnum(v));
}

static cJSON *parse_object(dash_model *m, const char *line, size_t len) {
    if (!len) return NULL;
    cJSON *o = cJSON_ParseWithLength(line, len);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        m->bad++;
        return NULL;
    }
    return o;
}

/* ---- metrics -------------------------------------------------------------- */

void dash_model_metrics_reset(dash_model *m) {
    m->n_pts = m->n_val = m->n_ckpts = 0;
    m->cfg_wall = NAN; /* a new run's file: its own start (it kept the earlier run's) */
    m->epoch++;
}

int dash_model_own_metrics(const dash_model *m) {
    return m->own_metrics;
}

/* Past the cap, every other older point goes (the newest stays): a long
 * run's curve thins out towards its start.  Points were dropped: a new
 * epoch, so that clients take the thinned curve instead of keeping all. */
static void thin_points(dash_model *m) {
    int k = 0;
    for (int i = 0; i < m->n_pts; i++)
        if (i % 2 == 0 || i == m->n_pts - 1) m->pts[k++] = m->pts[i];
    m->n_pts = k;
    m->epoch++;
}

/* s into out (n bytes) with every control character a '?': a run directory's events may
 * hold anything, and each such byte printed as \u00XX six times its size (a status reply of
 * 65536 ranks' hosts grew past its bound) */
static void printable(char *out, size_t n, const char *s) {
    if (s != out) snprintf(out, n, "%s", s);
    for (char *p = out; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
}

/* The model the config line's options describe: the preset, or the
 * --init-from file's name, and the dimensions given beside it (a "d6" of
 * 2 layers of width 32 read "d6" before). */
static void model_label(dash_model *m, const cJSON *opt) {
    const char *base = str(opt, "model"), *from = str(opt, "init-from");
    if (!(base && *base) && from && *from) {
        const char *slash = strrchr(from, '/');
        base = slash && slash[1] ? slash + 1 : from;
    }
    static const char *const dims[][2] = {
        {"layers", "%d layers"}, {"dim", "dim %d"}, {"heads", "%d heads"}, {"vocab", "vocab %d"}};
    char given[80] = "";
    size_t n = 0;
    for (size_t i = 0; i < sizeof dims / sizeof *dims && n < sizeof given; i++) {
        int v = int_in(opt, dims[i][0], 1, INT_MAX, 0);
        if (!v) continue;
        if (n) n += (size_t)snprintf(given + n, sizeof given - n, ", ");
        if (n < sizeof given) n += (size_t)snprintf(given + n, sizeof given - n, dims[i][1], v);
    }
    char buf[sizeof m->model];
    if (base && *base && given[0])
        snprintf(buf, sizeof buf, "%s (%s)", base, given);
    else
        snprintf(buf, sizeof buf, "%s", base && *base ? base : given);
    if (buf[0]) printable(m->model, sizeof m->model, buf);
}

static void saw_time(dash_model *m, double t) {
    if (isfinite(t) && !(t <= m->last_time)) m->last_time = t;
}

static void on_config(dash_model *m, const cJSON *o) {
    if (!isfinite(m->cfg_wall)) m->cfg_wall = num(o, "wall");
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(o, "layout");
    m->world = int_in(lay, "world", 1, DASH_MAX_RANKS, m->world);
    m->dp = int_in(lay, "dp", 1, DASH_MAX_RANKS, m->dp);
    m->pp = int_in(lay, "pp", 1, DASH_MAX_RANKS, m->pp);
    m->tp = int_in(lay, "tp", 1, DASH_MAX_RANKS, m->tp);
    /* each in range, but a product past the ranks is no layout of a run (dp = tp = 65536 made
     * rank_coord's TP x DP wrap to 0 and divide by it): no layout, as before one is read (no
     * coordinates, the heat map's ranks compared all together) */
    if ((long long)m->dp * m->pp * m->tp > DASH_MAX_RANKS) m->world = m->dp = m->pp = m->tp = 0;
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(o, "options");
    m->steps = int_in(opt, "steps", 0, INT_MAX, m->steps);
    model_label(m, opt);
    double params = num(o, "params");
    m->params = isfinite(params) && params > 0 ? params : NAN;
}

static void on_step(dash_model *m, const cJSON *o, int step) {
    if (m->n_pts && step <= m->pts[m->n_pts - 1].step) { /* the same steps again: redone */
        while (m->n_pts && m->pts[m->n_pts - 1].step >= step)
            m->n_pts--;
        m->epoch++;
    }
    if (m->n_pts == DASH_MAX_POINTS) thin_points(m);
    saw_time(m, num(o, "wall"));
    m->pts[m->n_pts++] = (point){step,          num(o, "wall"),      num(o, "loss"),
                                 num(o, "lr"),  num(o, "grad_norm"), num(o, "tok_s"),
                                 num(o, "mfu"), num(o, "ms"),        num(o, "tokens")};
}

void dash_model_metrics_line(dash_model *m, const char *line, size_t len) {
    cJSON *o = parse_object(m, line, len);
    if (!o) return;
    const char *type = str(o, "type");
    int step = int_in(o, "step", 0, INT_MAX, -1);
    if (type && !strcmp(type, "config")) {
        on_config(m, o);
    } else if (type && !strcmp(type, "ckpt")) {
        if (step >= 0) {
            if (m->n_ckpts == DASH_MAX_CKPTS) /* the oldest goes */
                memmove(m->ckpts, m->ckpts + 1, (DASH_MAX_CKPTS - 1) * sizeof *m->ckpts);
            else
                m->n_ckpts++;
            m->ckpts[m->n_ckpts - 1] = (ckpt_rec){step, num(o, "bytes"), num(o, "stall_ms"),
                                                  num(o, "persist_ms"), num(o, "wall")};
        }
    } else if (step >= 0 && cJSON_GetObjectItemCaseSensitive(o, "val_loss")) {
        if (m->n_val == DASH_MAX_VAL) {
            memmove(m->val, m->val + 1, (DASH_MAX_VAL - 1) * sizeof *m->val);
            m->n_val--;
        }
        m->val[m->n_val++] = (val_point){step, num(o, "wall"), num(o, "val_loss")};
    } else if (step >= 1 && cJSON_GetObjectItemCaseSensitive(o, "loss")) {
        on_step(m, o, step);
    } else {
        m->bad++;
    }
    cJSON_Delete(o);
}

/* ---- events ----------------------------------------------------------------- */

/* Node `raw` (its control characters '?', as the ranks' names: they went to the page raw). */
static int find_node(dash_model *m, const char *raw, int add) {
    char name[SUP_NODE_NAME];
    printable(name, sizeof name, raw);
    for (int i = 0; i < m->n_nodes; i++)
        if (!strcmp(m->nodes[i].name, name)) return i;
    if (!add || m->n_nodes == SUP_MAX_NODES || !*name) return -1;
    node_rec *n = &m->nodes[m->n_nodes];
    memset(n, 0, sizeof *n);
    snprintf(n->name, sizeof n->name, "%s", name);
    n->state = N_SPARE;
    return m->n_nodes++;
}

/* Each name of a comma-separated list: fn(m, name, k). */
static void each_name(dash_model *m, const char *list,
                      void (*fn)(dash_model *, const char *, int)) {
    char name[SUP_NODE_NAME];
    int k = 0;
    for (const char *p = list; p && *p;) {
        size_t n = strcspn(p, ",");
        snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), p);
        fn(m, name, k++);
        p += n + (p[n] == ',');
    }
}

static void pool_node(dash_model *m, const char *name, int k) {
    find_node(m, name, 1);
}

static void set_ranks(dash_model *m, int np) {
    if (np == m->np || np < 1 || np > DASH_MAX_RANKS) return;
    rank_rec *r = calloc((size_t)np, sizeof *r);
    int heat = (int)fmin(DASH_HEAT_KEEP, 8e6 / np); /* at most 64 MB of rows */
    int *hs = malloc((size_t)(heat > 0 ? heat : 1) * sizeof *hs);
    double *hm = malloc((size_t)(heat > 0 ? heat : 1) * (size_t)np * sizeof *hm);
    if (!r || !hs || !hm) {
        free(r), free(hs), free(hm);
        return;
    }
    free(m->ranks);
    free(m->heat_step);
    free(m->heat_ms);
    m->ranks = r;
    m->np = np;
    m->n_up = 0;
    m->heat_keep = heat;
    m->heat_step = hs;
    m->heat_ms = hm;
    for (int k = 0; k < heat; k++)
        hs[k] = -1;
    for (int i = 0; i < np; i++)
        r[i].early_ms = NAN;
}

static void launch_node(dash_model *m, const char *name, int k) {
    int i = find_node(m, name, 1);
    if (i >= 0) m->nodes[i].state = N_ACTIVE;
}

/* The attempt's nodes, in rank order: contiguous blocks of ranks each. */
static void on_launch(dash_model *m, const cJSON *o) {
    m->attempt = int_in(o, "attempt", 0, 1 << 30, m->attempt);
    const char *list = str(o, "nodes");
    for (int i = 0; i < m->n_nodes; i++)
        if (m->nodes[i].state == N_ACTIVE) m->nodes[i].state = N_SPARE;
    int count = 0;
    for (const char *p = list; p && *p; p++)
        count += *p == ',';
    count += list && *list;
    for (int r = 0; r < m->np; r++) {
        rank_rec *x = &m->ranks[r];
        x->state = R_STARTING;
        x->host[0] = x->node[0] = 0;
        x->up = 0;
    }
    m->n_up = 0;
    m->work += m->np;
    /* one pass over the list: name k holds ranks [k * per, (k + 1) * per); a job has at most
     * np nodes, so names past np are not read (each rank walked the list from its start: a
     * list of 500k names and 65536 ranks held the server for seconds a line) */
    char name[SUP_NODE_NAME];
    int per = count > 0 ? (m->np + count - 1) / count : 0, k = 0;
    for (const char *p = list; p && *p && k < m->np; k++) {
        size_t n = strcspn(p, ",");
        snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), p);
        launch_node(m, name, k);
        for (int r = k * per; per > 0 && r < (k + 1) * per && r < m->np; r++)
            snprintf(m->ranks[r].node, sizeof m->ranks[r].node, "%s", name);
        p += n + (p[n] == ',');
    }
    /* a restart's launch: the job recovers until it is past the step it failed at (the
     * `recovered` event), as the driver's own page says (before, "starting", then "running"
     * at its ranks' rank_up) */
    if (strcmp(m->job_state, "recovering") && strcmp(m->job_state, "failing"))
        snprintf(m->job_state, sizeof m->job_state, "starting");
}

/* A fault on rank r (one of the event's ranks): counted unless skipped, named as its last. */
static void fault_on_rank(dash_model *m, int r, const char *kind, int step, int counted) {
    rank_rec *x = &m->ranks[r];
    x->faults += counted;
    if (step >= 0)
        snprintf(x->last_fault, sizeof x->last_fault, "%s at step %d", kind, step);
    else
        snprintf(x->last_fault, sizeof x->last_fault, "%s", kind);
    printable(x->last_fault, sizeof x->last_fault, x->last_fault);
}

static void on_fault(dash_model *m, const cJSON *o) {
    const char *kind = str(o, "kind"), *action = str(o, "action");
    /* a skipped update is no fault of the summary's (the run goes on without it, or the
     * streak's stop is the fault): counted as the summary counts, it said 10 to its 2 */
    int counted = !action || strcmp(action, "skip");
    m->faults += counted;
    int r = int_in(o, "rank", 0, m->np - 1, -1), step = int_in(o, "step", 0, INT_MAX, -1);
    /* stop: the attempt stops, and the policy has given up on the job */
    int stops = !action || !strcmp(action, "restart") || !strcmp(action, "stop");
    if (stops)
        snprintf(m->job_state, sizeof m->job_state, "%s",
                 action && !strcmp(action, "stop") ? "failing" : "recovering");
    if (r < 0 || !kind) return;
    fault_on_rank(m, r, kind, step, counted);
    /* every rank the event names (a NaN in the own gradients of ranks 0 and 1) */
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(o, "ranks"), *it;
    if (!cJSON_IsArray(ranks)) ranks = NULL;
    int named = 0;
    cJSON_ArrayForEach(it, ranks) {
        if (++named > m->np) break; /* bounded by the job, whatever the line holds */
        if (cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble < m->np &&
            (int)it->valuedouble != r)
            fault_on_rank(m, (int)it->valuedouble, kind, step, counted);
    }
    m->work += named;
    rank_rec *x = &m->ranks[r];
    if (!stops) return; /* redone in place, or watched */
    if (!strcmp(kind, "hang") || !strcmp(kind, "startup"))
        x->state = R_HUNG;
    else if (!strcmp(kind, "straggler"))
        x->state = R_SLOW;
    else if (strcmp(kind, "evicted"))
        x->state = R_DEAD;
}

static void on_evict(dash_model *m, const cJSON *o) {
    const char *node = str(o, "node");
    int i = node ? find_node(m, node, 1) : -1;
    if (i < 0) return;
    m->nodes[i].state = N_EVICTED;
    const char *why = str(o, "reason");
    snprintf(m->nodes[i].reason, sizeof m->nodes[i].reason, "%s", why ? why : "");
    for (int r = 0; r < m->np; r++)
        if (!strcmp(m->ranks[r].node, node)) m->ranks[r].state = R_EVICTED;
    m->work += m->np;
}

static void all_ranks(dash_model *m, rstate s, int only_live) {
    for (int r = 0; r < m->np; r++)
        if (!only_live || m->ranks[r].state <= R_SLOW) m->ranks[r].state = s;
    m->work += m->np;
}

static void apply_event(dash_model *m, const cJSON *o, const char *ev) {
    int resumed = m->resumed;
    m->resumed = !strcmp(ev, "driver_resumed");
    if (!strcmp(ev, "job_start")) {
        set_ranks(m, int_in(o, "np", 1, DASH_MAX_RANKS, 0));
        if (!resumed) { /* a new job in this run directory: its own counts */
            m->faults = m->restarts = m->attempt = m->best_step = 0;
            for (int r = 0; r < m->np; r++)
                m->ranks[r].faults = 0, m->ranks[r].last_fault[0] = 0;
        }
        all_ranks(m, R_STARTING, 0);
        for (int r = 0; r < m->np; r++) /* a new job's ranks come up again */
            m->ranks[r].up = 0;
        m->n_up = 0;
        if (!resumed || !isfinite(m->started)) /* a driver that took over: the job's start */
            m->started = num(o, "time");
        if (!isfinite(m->t0)) m->t0 = m->started;
        const char *mp = str(o, "metrics");
        if (mp) snprintf(m->metrics_path, sizeof m->metrics_path, "%s", mp);
        m->own_metrics = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "own_metrics"));
        double s = num(o, "straggler_score");
        if (s > 0) m->straggler_score = s;
        each_name(m, str(o, "pool"), pool_node);
        snprintf(m->job_state, sizeof m->job_state, "starting");
        m->outcome[0] = 0;
        cJSON_Delete(m->summary);
        m->summary = NULL;
    } else if (!strcmp(ev, "launch")) {
        on_launch(m, o);
    } else if (!strcmp(ev, "rank_up")) {
        int r = int_in(o, "rank", 0, m->np - 1, -1);
        if (r < 0) return;
        const char *host = str(o, "host"), *node = str(o, "node");
        if (host) printable(m->ranks[r].host, sizeof m->ranks[r].host, host);
        if (node && *node) printable(m->ranks[r].node, sizeof m->ranks[r].node, node);
        m->ranks[r].state = R_RUNNING;
        /* counted, not every rank looked at for each (65536 ranks' rank_up lines: 4e9 steps) */
        if (!m->ranks[r].up) m->ranks[r].up = 1, m->n_up++;
        if (m->n_up == m->np && strcmp(m->job_state, "recovering") &&
            strcmp(m->job_state, "failing"))
            snprintf(m->job_state, sizeof m->job_state, "running");
    } else if (!strcmp(ev, "fault_detected")) {
        on_fault(m, o);
    } else if (!strcmp(ev, "job_stopped")) {
        all_ranks(m, R_STOPPED, 1);
    } else if (!strcmp(ev, "evict")) {
        on_evict(m, o);
    } else if (!strcmp(ev, "restart")) {
        m->restarts = int_in(o, "restart", 0, 1 << 30, m->restarts);
    } else if (!strcmp(ev, "recovered")) {
        if (!strcmp(m->job_state, "recovering"))
            snprintf(m->job_state, sizeof m->job_state, "running");
    } else if (!strcmp(ev, "anomaly")) {
        const char *kind = str(o, "kind");
        int r = int_in(o, "rank", 0, m->np - 1, -1);
        if (kind && !strcmp(kind, "straggler") && r >= 0 && m->ranks[r].state == R_RUNNING)
            m->ranks[r].state = R_SLOW;
    } else if (!strcmp(ev, "driver_resumed")) {
        m->restarts = int_in(o, "restarts", 0, 1 << 30, m->restarts);
    } else if (!strcmp(ev, "summary")) {
        cJSON_Delete(m->summary);
        m->summary = cJSON_Duplicate(o, 1);
        const char *out = str(o, "outcome");
        snprintf(m->outcome, sizeof m->outcome, "%s", out ? out : "");
        m->best_step = int_in(o, "steps", 0, INT_MAX, m->best_step);
        if (out && !strcmp(out, "stopped")) {
            snprintf(m->job_state, sizeof m->job_state, "stopped");
            all_ranks(m, R_STOPPED, 1);
        }
    } else if (!strcmp(ev, "job_done")) {
        snprintf(m->job_state, sizeof m->job_state, "done");
        all_ranks(m, R_DONE, 0);
    } else if (!strcmp(ev, "job_failed")) {
        snprintf(m->job_state, sizeof m->job_state, "failed");
        all_ranks(m, R_STOPPED, 1);
    }
}

static void drop_oldest_event(dash_model *m) {
    char **e = &m->ev[m->first_seq % DASH_MAX_EVENTS];
    if (*e) m->ev_bytes -= strlen(*e);
    free(*e);
    *e = NULL;
    m->first_seq++;
}

long dash_model_event_line(dash_model *m, const char *line, size_t len) {
    cJSON *o = parse_object(m, line, len);
    if (!o) return 1;
    const char *ev = str(o, "event");
    if (!ev) {
        m->bad++;
        cJSON_Delete(o);
        return 1;
    }
    m->work = 1; /* the loops over every rank add theirs */
    saw_time(m, num(o, "time"));
    apply_event(m, o, ev);
    long work = m->work;
    /* the server's sequence number, once (a line that had its own "seq" was sent with two) */
    while (cJSON_GetObjectItemCaseSensitive(o, "seq")) /* every copy of a repeated key */
        cJSON_DeleteItemFromObjectCaseSensitive(o, "seq");
    cJSON_AddNumberToObject(o, "seq", (double)m->next_seq);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text) return work;
    if (m->next_seq - m->first_seq == DASH_MAX_EVENTS) drop_oldest_event(m);
    long slot = m->next_seq % DASH_MAX_EVENTS;
    m->ev[slot] = strdup(text); /* malloc'd: freed with free() */
    cJSON_free(text);
    if (!m->ev[slot]) return work;
    m->ev_bytes += strlen(m->ev[slot]);
    m->next_seq++;
    while (m->ev_bytes > DASH_EVENTS_BYTES && m->next_seq - m->first_seq > 1)
        drop_oldest_event(m);
    return work;
}

/* ---- compute rows ---------------------------------------------------------------- */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

void dash_model_compute_line(dash_model *m, const char *line, size_t len) {
    cJSON *o = parse_object(m, line, len);
    if (!o) return;
    int step = int_in(o, "step", 1, INT_MAX, -1);
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(o, "compute_ms");
    if (step < 0 || !cJSON_IsArray(ms) || !m->np || cJSON_GetArraySize(ms) != m->np) {
        m->bad++;
        cJSON_Delete(o);
        return;
    }
    int k = step % m->heat_keep; /* a newer row of the same step (redone) replaces it */
    m->heat_step[k] = step;
    double *row = m->heat_ms + (size_t)k * (size_t)m->np;
    int r = 0;
    for (const cJSON *v = ms->child; v && r < m->np; v = v->next, r++) {
        row[r] = cJSON_IsNumber(v) && v->valuedouble >= 0 ? v->valuedouble : NAN;
        if (!isfinite(row[r])) continue;
        rank_rec *rr = &m->ranks[r];
        rr->step = step; /* its last step heard */
        if (rr->n_early < DASH_EARLY) {
            rr->early[rr->n_early++] = (float)row[r];
            if (rr->n_early == DASH_EARLY) { /* the lower quartile: a start's slow first steps
                                                (its set-up) do not move it */
                float v4[DASH_EARLY];
                memcpy(v4, rr->early, sizeof v4);
                qsort(v4, DASH_EARLY, sizeof *v4, cmp_float);
                rr->early_ms = v4[(DASH_EARLY - 1) / 4];
            }
        }
    }
    cJSON_Delete(o);
}

/* ---- replies ------------------------------------------------------------------------ */

static void rank_coord(const dash_model *m, int r, int *dp, int *pp, int *tp) {
    long long TP = m->tp > 0 ? m->tp : 1, DP = m->dp > 0 ? m->dp : 1;
    *tp = (int)(r % TP);
    *dp = (int)((r / TP) % DP);
    *pp = (int)(r / (TP * DP));
}

/* The state of a run without a supervisor (no events: `megascale dashboard` of a
 * plain --out-dir run), from its metrics: done at --steps; running while its
 * newest step is recent (within 10 of its steps, and at least 5 minutes);
 * else stopped (it ended short of --steps, or hangs: no driver says which).
 * Before, such a run said "starting" for good. */
static const char *plain_state(const dash_model *m, int best, double now) {
    if (m->steps > 0 && best >= m->steps) return "done";
    if (!m->n_pts) return "starting";
    const point *p = &m->pts[m->n_pts - 1];
    double quiet = isfinite(p->ms) && p->ms * 10 / 1e3 > 300 ? p->ms * 10 / 1e3 : 300;
    return isfinite(p->wall) && now - p->wall > quiet ? "stopped" : "running";
}

cJSON *dash_model_status(const dash_model *m, const sup_dash_live *live, const char *run_dir,
                         double now) {
    cJSON *o = cJSON_CreateObject(), *job = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "v", 1);
    cJSON_AddBoolToObject(o, "live", live != NULL);
    cJSON_AddStringToObject(o, "run_dir", run_dir);
    add_num(o, "now", now);
    int best = m->n_pts ? m->pts[m->n_pts - 1].step : 0;
    if (m->best_step > best) best = m->best_step;
    if (live && live->best_step > best) best = live->best_step;
    const char *state = !live && !m->next_seq ? plain_state(m, best, now) : m->job_state;
    int ended = !strcmp(state, "done") || !strcmp(state, "failed") || !strcmp(state, "stopped");
    if (live && live->recovering && !ended && strcmp(state, "failing")) state = "recovering";
    cJSON_AddStringToObject(job, "state", state);
    cJSON_AddNumberToObject(job, "attempt", live && live->attempt ? live->attempt : m->attempt);
    cJSON_AddNumberToObject(job, "restarts", live ? live->restarts : m->restarts);
    cJSON_AddNumberToObject(job, "step", best);
    add_num(job, "steps", m->steps > 0 ? m->steps : NAN);
    cJSON_AddNumberToObject(job, "faults", m->faults);
    double ettr = m->summary ? num(m->summary, "ettr") : live ? live->ettr : NAN;
    add_num(job, "ettr", ettr);
    if (m->outcome[0])
        cJSON_AddStringToObject(job, "outcome", m->outcome);
    else
        cJSON_AddNullToObject(job, "outcome");
    /* a plain run (no events): its start is its metrics' first config line; once it is not
     * running, its time ends at its last step (before, no start: no wall time, and the
     * wall-time axis was empty) */
    int plain = !live && !m->next_seq;
    double started = isfinite(m->started) ? m->started : m->cfg_wall;
    add_num(job, "started", started);
    double until = plain && strcmp(state, "running") && isfinite(m->last_time) ? m->last_time : now;
    double wall = m->summary          ? num(m->summary, "wall_s")
                  : isfinite(started) ? until - started
                                      : NAN;
    add_num(job, "wall_s", wall);
    if (m->model[0])
        cJSON_AddStringToObject(job, "model", m->model);
    else
        cJSON_AddNullToObject(job, "model");
    add_num(job, "params", m->params);
    add_num(job, "tokens", m->n_pts ? m->pts[m->n_pts - 1].tokens : NAN);
    cJSON_AddItemToObject(o, "job", job);
    if (m->world) {
        cJSON *lay = cJSON_AddObjectToObject(o, "layout");
        cJSON_AddNumberToObject(lay, "world", m->world);
        cJSON_AddNumberToObject(lay, "dp", m->dp ? m->dp : 1);
        cJSON_AddNumberToObject(lay, "pp", m->pp ? m->pp : 1);
        cJSON_AddNumberToObject(lay, "tp", m->tp ? m->tp : 1);
    } else {
        cJSON_AddNullToObject(o, "layout");
    }
    cJSON *ranks = cJSON_AddArrayToObject(o, "ranks");
    for (int r = 0; r < m->np; r++) {
        const rank_rec *x = &m->ranks[r];
        const sup_dash_rank *l = live && r < live->n_ranks ? &live->ranks[r] : NULL;
        rstate s = x->state;
        /* the driver's live view refines a rank the events call live */
        if (l && s <= R_SLOW && l->state <= SUP_DASH_HUNG) s = (rstate)l->state;
        int dp, pp, tp;
        rank_coord(m, r, &dp, &pp, &tp);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "rank", r);
        add_num(e, "dp", m->world ? dp : NAN); /* no layout yet: no coordinates */
        add_num(e, "pp", m->world ? pp : NAN);
        add_num(e, "tp", m->world ? tp : NAN);
        cJSON_AddStringToObject(e, "node", x->node);
        cJSON_AddStringToObject(e, "host", x->host);
        cJSON_AddStringToObject(e, "state", RSTATE[s]);
        /* the step the driver last heard (its compute rows); read from the
         * files alone, a live rank's is at least rank 0's in the metrics (the
         * ranks step together), which go on when the driver is gone */
        int step = l && l->step >= 0 ? l->step : x->step;
        int last = m->n_pts ? m->pts[m->n_pts - 1].step : 0;
        if (!live && s <= R_SLOW && last > step) step = last;
        cJSON_AddNumberToObject(e, "step", step);
        add_num(e, "beat_age_s", l ? l->beat_age_s : NAN);
        add_num(e, "compute_ms", l ? l->compute_ms : NAN);
        cJSON_AddNumberToObject(e, "faults", x->faults);
        if (x->last_fault[0])
            cJSON_AddStringToObject(e, "last_fault", x->last_fault);
        else
            cJSON_AddNullToObject(e, "last_fault");
        cJSON_AddItemToArray(ranks, e);
    }
    cJSON *nodes = cJSON_AddArrayToObject(o, "nodes");
    for (int i = 0; i < m->n_nodes; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "node", m->nodes[i].name);
        cJSON_AddStringToObject(e, "state", NSTATE[m->nodes[i].state]);
        cJSON_AddStringToObject(e, "reason", m->nodes[i].reason);
        cJSON_AddItemToArray(nodes, e);
    }
    if (m->n_pts) {
        const point *p = &m->pts[m->n_pts - 1];
        cJSON *last = cJSON_AddObjectToObject(o, "last");
        cJSON_AddNumberToObject(last, "step", p->step);
        add_num(last, "loss", p->loss);
        add_num(last, "lr", p->lr);
        add_num(last, "grad_norm", p->grad_norm);
        add_num(last, "tok_s", p->tok_s);
        add_num(last, "mfu", p->mfu);
        add_num(last, "ms", p->ms);
    } else {
        cJSON_AddNullToObject(o, "last");
    }
    if (m->summary)
        cJSON_AddItemToObject(o, "summary", cJSON_Duplicate(m->summary, 1));
    else
        cJSON_AddNullToObject(o, "summary");
    return o;
}

static cJSON *row(const double *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, jnum(v[i]));
    return a;
}

cJSON *dash_model_metrics(const dash_model *m, long since, long val_since, int max) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "epoch", (double)m->epoch);
    cJSON_AddNumberToObject(o, "since", (double)since);
    cJSON_AddNumberToObject(o, "last_step", m->n_pts ? m->pts[m->n_pts - 1].step : 0);
    add_num(o, "t0", isfinite(m->t0) ? m->t0 : m->cfg_wall); /* a plain run's: its start */
    cJSON *cols = cJSON_AddArrayToObject(o, "columns");
    static const char *const C[] = {"step",      "wall",  "loss", "lr",
                                    "grad_norm", "tok_s", "mfu",  "ms"};
    for (int i = 0; i < 8; i++)
        cJSON_AddItemToArray(cols, cJSON_CreateString(C[i]));
    /* the first point past `since` (binary search: the steps increase) */
    int lo = 0, hi = m->n_pts;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (m->pts[mid].step <= since)
            lo = mid + 1;
        else
            hi = mid;
    }
    cJSON *steps = cJSON_AddArrayToObject(o, "steps");
    int n = 0;
    for (int i = lo; i < m->n_pts && n < max; i++, n++) {
        const point *p = &m->pts[i];
        double v[8] = {p->step, p->wall, p->loss, p->lr, p->grad_norm, p->tok_s, p->mfu, p->ms};
        cJSON_AddItemToArray(steps, row(v, 8));
    }
    cJSON_AddBoolToObject(o, "more", lo + n < m->n_pts);
    cJSON *val = cJSON_AddArrayToObject(o, "val");
    for (int i = 0; i < m->n_val; i++)
        if (m->val[i].step > val_since) {
            double v[3] = {m->val[i].step, m->val[i].wall, m->val[i].loss};
            cJSON_AddItemToArray(val, row(v, 3));
        }
    return o;
}

cJSON *dash_model_events(const dash_model *m, long since, int max) {
    cJSON *o = cJSON_CreateObject(), *evs = cJSON_CreateArray();
    long from = since + 1 > m->first_seq ? since + 1 : m->first_seq, k = from;
    size_t bytes = 0;
    for (; k < m->next_seq && k - from < max; k++) {
        const char *text = m->ev[k % DASH_MAX_EVENTS];
        size_t len = text ? strlen(text) : 0;
        if (k > from && bytes + len > DASH_EVENTS_REPLY_BYTES) break; /* the rest: "more" */
        bytes += len;
        cJSON *e = text ? cJSON_Parse(text) : NULL;
        if (e) cJSON_AddItemToArray(evs, e);
    }
    cJSON_AddNumberToObject(o, "next", (double)(k - 1));
    cJSON_AddBoolToObject(o, "more", k < m->next_seq);
    cJSON_AddItemToObject(o, "events", evs);
    return o;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

typedef struct {
    const dash_model *m;
    int r;
    int dp, pp, tp;
} rank_order;

static int cmp_rank(const void *a, const void *b) {
    const rank_order *x = a, *y = b;
    if (x->pp != y->pp) return x->pp - y->pp;
    if (x->dp != y->dp) return x->dp - y->dp;
    if (x->tp != y->tp) return x->tp - y->tp;
    return x->r - y->r;
}

/* The median of sorted v[0..k) without one element equal to x (in v; k >= 2). */
static double median_without(const double *v, int k, double x) {
    int lo = 0, hi = k - 1; /* an index j with v[j] == x */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (v[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    int n = k - 1, a = (n - 1) / 2, b = n / 2; /* the middle of the rest */
    double va = v[a < lo ? a : a + 1], vb = v[b < lo ? b : b + 1];
    return 0.5 * (va + vb);
}

cJSON *dash_model_heatmap(const dash_model *m, int cols) {
    cJSON *o = cJSON_CreateObject();
    int np = m->np;
    if (np > 0 && cols > DASH_HEAT_CELLS / np) cols = DASH_HEAT_CELLS / np;
    if (cols < 1) cols = 1;
    int *steps = malloc(sizeof(int) * (size_t)(m->heat_keep + 1));
    rank_order *ord = malloc(sizeof *ord * (size_t)(np + 1));
    double *med = malloc(sizeof(double) * (size_t)(cols + 1)),
           *tmp = malloc(sizeof(double) * (size_t)(np + cols + 1)),
           *sorted = malloc(sizeof(double) * ((size_t)np * (size_t)cols + 1));
    int *n_sorted = malloc(sizeof(int) * (size_t)(cols + 1));
    int n = 0;
    for (int k = 0; steps && k < m->heat_keep; k++)
        if (m->heat_step[k] >= 0) steps[n++] = m->heat_step[k];
    if (steps) qsort(steps, (size_t)n, sizeof *steps, cmp_int);
    int first = n > cols ? n - cols : 0;
    cJSON *js = cJSON_AddArrayToObject(o, "steps"), *jr = cJSON_AddArrayToObject(o, "ranks");
    cJSON *jl = cJSON_AddArrayToObject(o, "labels"), *ratio = cJSON_AddArrayToObject(o, "ratio");
    cJSON *cms = cJSON_AddArrayToObject(o, "compute_ms"),
          *strag = cJSON_AddArrayToObject(o, "stragglers");
    cJSON *jag = cJSON_AddArrayToObject(o, "against"); /* each row's reference: "stage", "own" */
    add_num(o, "threshold", m->straggler_score);
    if (!steps || !ord || !med || !tmp || !sorted || !n_sorted) goto out;
    int nc = n - first;
    for (int c = 0; c < nc; c++)
        cJSON_AddItemToArray(js, cJSON_CreateNumber(steps[first + c]));
    for (int r = 0; r < np; r++) {
        ord[r] = (rank_order){m, r, 0, 0, 0};
        rank_coord(m, r, &ord[r].dp, &ord[r].pp, &ord[r].tp);
    }
    qsort(ord, (size_t)np, sizeof *ord, cmp_rank);
    int own_ref = 0; /* this stage's rows are against the rank's own early speed */
    for (int i = 0; i < np; i++) {
        /* each step's median over the ranks of this rank's pipeline stage
         * (consecutive in ord; all ranks before the layout is known):
         * stages do different work, the last one also the head and loss */
        if (i == 0 || (m->world && ord[i].pp != ord[i - 1].pp)) {
            int end = i + 1;
            while (end < np && (!m->world || ord[end].pp == ord[i].pp))
                end++;
            /* the lower median: of two ranks the faster (the mean made the healthy peer
             * of a straggler look as far off as the straggler) */
            for (int c = 0; c < nc; c++) {
                const double *rw =
                    m->heat_ms + (size_t)(steps[first + c] % m->heat_keep) * (size_t)np;
                double *v = sorted + (size_t)c * (size_t)np;
                int k = 0;
                for (int j = i; j < end; j++)
                    if (isfinite(rw[ord[j].r])) v[k++] = rw[ord[j].r];
                qsort(v, (size_t)k, sizeof *v, sup_cmp_double);
                n_sorted[c] = k;
                med[c] = k ? v[(k - 1) / 2] : NAN;
            }
            /* a stage of one rank (pipeline parallelism alone, or a job of one rank: before,
             * its every cell read 1x against itself): its own early speed (the
             * lower quartile of its first 16 compute times), else, before it has them, its
             * lower quartile over the steps shown (each step's own time read 1x, and a rank
             * that slowed down did not show; over the steps shown alone, one slowed for most
             * of them read as fast before) */
            own_ref = m->world && end - i == 1;
            if (own_ref) {
                double own = m->ranks[ord[i].r].early_ms;
                if (!isfinite(own) || own <= 0) {
                    int k = 0;
                    for (int c = 0; c < nc; c++)
                        if (isfinite(med[c])) tmp[k++] = med[c];
                    qsort(tmp, (size_t)k, sizeof *tmp, sup_cmp_double);
                    own = k ? tmp[(k - 1) / 4] : NAN;
                }
                for (int c = 0; c < nc; c++)
                    med[c] = own;
            }
        }
        int r = ord[i].r;
        char label[160];
        if (m->world)
            snprintf(label, sizeof label, "r%d dp%d pp%d tp%d %s", r, ord[i].dp, ord[i].pp,
                     ord[i].tp, m->ranks[r].node);
        else
            snprintf(label, sizeof label, "r%d %s", r, m->ranks[r].node);
        cJSON_AddItemToArray(jr, cJSON_CreateNumber(r));
        cJSON_AddItemToArray(jl, cJSON_CreateString(label));
        cJSON_AddItemToArray(jag, cJSON_CreateString(own_ref ? "own" : "stage"));
        cJSON *a = cJSON_CreateArray(), *b = cJSON_CreateArray();
        int k = 0;
        for (int c = 0; c < nc; c++) {
            double v = m->heat_ms[(size_t)(steps[first + c] % m->heat_keep) * (size_t)np + r];
            double q = isfinite(v) && med[c] > 0 ? v / med[c] : NAN;
            cJSON_AddItemToArray(a, jnum(isfinite(q) ? round(q * 1000) / 1000 : NAN));
            cJSON_AddItemToArray(b, jnum(isfinite(v) ? round(v * 1000) / 1000 : NAN));
            /* the score, the driver's within-stage one: the median of the other
             * ranks of its stage / its own (none when it has no peer) */
            if (isfinite(v) && v > 0 && n_sorted[c] >= 2)
                tmp[k++] = median_without(sorted + (size_t)c * (size_t)np, n_sorted[c], v) / v;
        }
        cJSON_AddItemToArray(ratio, a);
        cJSON_AddItemToArray(cms, b);
        if (k >= 5) {
            qsort(tmp, (size_t)k, sizeof *tmp, sup_cmp_double);
            if (tmp[k / 2] < m->straggler_score) cJSON_AddItemToArray(strag, cJSON_CreateNumber(r));
        }
    }
out:
    free(steps);
    free(ord);
    free(med);
    free(tmp);
    free(sorted);
    free(n_sorted);
    return o;
}

cJSON *dash_model_checkpoints(const dash_model *m) {
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "checkpoints");
    for (int i = 0; i < m->n_ckpts; i++) {
        const ckpt_rec *c = &m->ckpts[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "step", c->step);
        add_num(e, "bytes", c->bytes);
        add_num(e, "stall_ms", c->stall_ms);
        add_num(e, "persist_ms", c->persist_ms);
        add_num(e, "wall", c->wall);
        cJSON_AddItemToArray(a, e);
    }
    return o;
}
