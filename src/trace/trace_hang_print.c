/* trace_hang_print.c - the hang analysis as text (grid tables per pipeline
 * stage, the oldest in-flight op per rank, the suspects) and as JSON. */
#include <stdlib.h>
#include <string.h>

#include "trace/trace_hang_internal.h"

static const char *state_of(const trace_hang *h, const hang_rank *r) {
    if (!r->has_dump) return "no dump";
    if (hang_is_suspect(h, r)) return "SUSPECT";
    return r->oldest_g >= 0 ? "wait" : "idle";
}

/* "all_reduce #12 on 'tp' [4,5]" or "recv from rank 4 tag 3 on 'pp' #7". */
static const char *op_str(char *buf, size_t n, const hang_group *g, const hang_op *op) {
    if (hang_is_wait_for(op)) { /* outside the communicator (comm_dump.c) */
        snprintf(buf, n, "a wait for rank %lld in '%s'", (long long)op->peer, g->name);
        return buf;
    }
    if (op->peer >= 0) {
        snprintf(buf, n, "%s %s rank %lld tag %lld on '%s' #%lld", op->op,
                 strcmp(op->op, "send") ? "from" : "to", (long long)op->peer, (long long)op->tag,
                 g->name, (long long)op->seq);
        return buf;
    }
    size_t o = (size_t)snprintf(buf, n, "%s #%lld on '%s' [", op->op, (long long)op->seq, g->name);
    for (int i = 0; i < g->n_ranks && o + 16 < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%d", i ? "," : "", g->ranks[i]);
    if (o + 16 >= n && g->n_ranks) o += (size_t)snprintf(buf + o, n - o, ",...");
    snprintf(buf + o, n - o, "]");
    return buf;
}

static int cell_of(const trace_hang *h, trace_coord c) { /* -1: outside the grid */
    if (c.dp < 0 || c.dp >= h->shape.dp || c.pp < 0 || c.pp >= h->shape.pp || c.tp < 0 ||
        c.tp >= h->shape.tp)
        return -1;
    return c.tp + h->shape.tp * (c.dp + h->shape.dp * c.pp);
}

/* at[cell] = the rank at each (dp, pp, tp) cell of the tables, by the ranks' own
 * coordinates (a dump's, or an events header's: a grid placed host by host over ranks
 * that mpirun dealt out round-robin does not follow the position formula; before, the
 * cells were filled by the formula and a rank's state was drawn at another rank's
 * place): the ranks with a dump first, then the others where their cell is free, then
 * any left in the free cells in order. */
static void place_ranks(const trace_hang *h, int *at) {
    char *placed = calloc((size_t)h->world, 1);
    for (int i = 0; i < h->world; i++)
        at[i] = -1;
    for (int pass = 0; pass < 3; pass++)
        for (int rk = 0, free_cell = 0; rk < h->world; rk++) {
            const hang_rank *r = &h->ranks[rk];
            if ((placed && placed[rk]) || (pass == 0 && !r->has_dump)) continue;
            int cell = pass < 2 ? cell_of(h, r->coord) : -1;
            if (pass == 2)
                while (free_cell < h->world && at[free_cell] >= 0)
                    free_cell++;
            if (pass == 2 && free_cell < h->world) cell = free_cell;
            if (cell < 0 || at[cell] >= 0) continue;
            at[cell] = rk;
            if (placed) placed[rk] = 1;
        }
    free(placed);
}

/* Bounds on the output for a huge world (a damaged dump said 1048575: millions of lines; a
 * 32k-rank job whose ranks all wait, or are all suspects, printed 17 MB of JSON and of text).
 * Past HANG_LIST_MAX entries a list ends, and the ranks it left out are counted and grouped by
 * what they wait in (hang_by_op): the totals and the groups are exact, the rank lists cut. */
#define HANG_TABLE_MAX 4096 /* ranks drawn in the state tables */
#define HANG_RUN_MIN 4      /* ranks without a dump in a row said in one line */
#define HANG_LIST_MAX 32    /* lines (text) or entries (JSON) of a per-rank list, groups too */

/* What a rank waits in, the key of the groups: no dump, nothing in flight, or its oldest
 * in-flight op by op, group name and (for a collective) sequence number; a transfer's peer
 * and sequence are left out of the key (they differ from rank to rank). */
typedef struct {
    int rank, kind; /* kind: 0 no dump, 1 nothing in flight, 2 an op */
    const char *op, *group;
    int64_t seq; /* -1 for a transfer or a wait_for */
} hang_key;

static hang_key key_of(const hang_rank *r) {
    hang_key k = {r->rank, 0, "", "", -1};
    if (!r->has_dump) return k;
    k.kind = 1;
    if (r->oldest_g < 0) return k;
    const hang_group *g = &r->groups[r->oldest_g];
    const hang_op *op = &g->in_flight[r->oldest_i];
    k.kind = 2;
    k.op = op->op;
    k.group = g->name;
    k.seq = op->peer >= 0 || hang_is_wait_for(op) ? -1 : op->seq;
    return k;
}

static int key_cmp(const hang_key *a, const hang_key *b) {
    int c = a->kind - b->kind;
    if (!c) c = strcmp(a->op, b->op);
    if (!c) c = strcmp(a->group, b->group);
    if (!c) c = (a->seq > b->seq) - (a->seq < b->seq);
    return c;
}

static int key_sort(const void *x, const void *y) { /* by key, then rank */
    const hang_key *a = x, *b = y;
    int c = key_cmp(a, b);
    return c ? c : a->rank - b->rank;
}

/* "all_reduce #12 on 'tp'", "recv on 'pp'", "no dump" into buf. */
static const char *key_str(char *buf, size_t n, const hang_key *k) {
    if (k->kind < 2)
        snprintf(buf, n, "%s", k->kind ? "nothing in flight" : "no dump");
    else if (k->seq >= 0)
        snprintf(buf, n, "%s #%lld on '%s'", k->op, (long long)k->seq, k->group);
    else
        snprintf(buf, n, "%s on '%s'", k->op, k->group);
    return buf;
}

/* The ranks that `pick` selects (0: all of them), sorted by what they wait in: a malloc'd
 * array (free it) of *n keys; NULL on OOM (*n 0). */
static hang_key *hang_by_op(const trace_hang *h, int (*pick)(const trace_hang *, const hang_rank *),
                            int *n) {
    hang_key *k = malloc(((size_t)h->world + 1) * sizeof *k);
    *n = 0;
    if (!k) return NULL;
    for (int rk = 0; rk < h->world; rk++)
        if (!pick || pick(h, &h->ranks[rk])) k[(*n)++] = key_of(&h->ranks[rk]);
    qsort(k, (size_t)*n, sizeof *k, key_sort);
    return k;
}

/* The end of the group of sorted keys k[0..n) that starts at i: the first key after it. */
static int group_end(const hang_key *k, int n, int i) {
    int j = i;
    while (j < n && !key_cmp(&k[i], &k[j]))
        j++;
    return j;
}

/* The groups of keys k[0..n): "    all_reduce #12 on 'tp': 32768 rank(s): 0, 1, ..." lines, at
 * most HANG_LIST_MAX of them and HANG_LIST_MAX ranks each. */
static void print_groups(const hang_key *k, int n, FILE *f) {
    char what[160];
    int shown = 0, n_groups = 0;
    for (int i = 0, j; i < n; i = j) {
        j = group_end(k, n, i);
        n_groups++;
        if (shown++ >= HANG_LIST_MAX) continue;
        fprintf(f, "    %s: %d rank(s):", key_str(what, sizeof what, &k[i]), j - i);
        for (int q = i; q < j && q < i + HANG_LIST_MAX; q++)
            fprintf(f, "%s %d", q > i ? "," : "", k[q].rank);
        fprintf(f, "%s\n", j - i > HANG_LIST_MAX ? ", ..." : "");
    }
    if (n_groups > HANG_LIST_MAX)
        fprintf(f, "    ... and %d more group(s)\n", n_groups - HANG_LIST_MAX);
}

/* After a list cut at HANG_LIST_MAX lines: how many were left out, and every rank of the
 * list grouped by what it waits in. */
static void print_rest(const trace_hang *h, int (*pick)(const trace_hang *, const hang_rank *),
                       const char *what, int left, FILE *f) {
    int n;
    hang_key *k = hang_by_op(h, pick, &n);
    fprintf(f, "  ... %d more %s not listed (%d in all); all %d by what they wait in:\n", left,
            what, n, n);
    if (k) print_groups(k, n, f);
    free(k);
}

/* The last rank of the run from rk of ranks without a dump (with no other evidence against
 * them: `why1`), rk itself when the run is shorter than HANG_RUN_MIN. */
static int no_dump_run(const trace_hang *h, int rk, int why1) {
    int end = rk;
    while (end < h->world && !h->ranks[end].has_dump && (!why1 || h->ranks[end].n_why == 1))
        end++;
    return end - rk >= HANG_RUN_MIN ? end - 1 : rk;
}

static void print_tables(const trace_hang *h, FILE *f) {
    if (h->world > HANG_TABLE_MAX) {
        fprintf(f, "(state tables left out: %d ranks, more than %d)\n", h->world, HANG_TABLE_MAX);
        return;
    }
    int *at = malloc((size_t)h->world * sizeof *at);
    if (!at) {
        fprintf(f, "(state tables left out: out of memory)\n");
        return;
    }
    place_ranks(h, at);
    for (int pp = 0; pp < h->shape.pp; pp++) {
        fprintf(f, "pp stage %d (rows dp, columns tp):\n%8s", pp, "");
        for (int tp = 0; tp < h->shape.tp; tp++)
            fprintf(f, "  tp %-6d", tp);
        fprintf(f, "\n");
        for (int dp = 0; dp < h->shape.dp; dp++) {
            fprintf(f, "  dp %-3d", dp);
            for (int tp = 0; tp < h->shape.tp; tp++) {
                int rk = at[tp + h->shape.tp * (dp + h->shape.dp * pp)];
                fprintf(f, "  %-9s", rk >= 0 ? state_of(h, &h->ranks[rk]) : "?");
            }
            fprintf(f, "\n");
        }
    }
    free(at);
}

void trace_hang_print(const trace_hang *h, FILE *f) {
    int missing = h->world - h->n_dumps;
    fprintf(f, "hang analysis of %s: world %d = dp %d x pp %d x tp %d; %d dump(s), %d missing\n",
            h->dir, h->world, h->shape.dp, h->shape.pp, h->shape.tp, h->n_dumps, missing);
    print_tables(h, f);
    fprintf(f, "oldest in-flight op per rank:\n");
    char c[64], op[512];
    for (int rk = 0, lines = 0; rk < h->world; rk++, lines++) {
        const hang_rank *r = &h->ranks[rk];
        if (lines == HANG_LIST_MAX) {
            print_rest(h, NULL, "rank(s)", h->world - rk, f);
            break;
        }
        int end = no_dump_run(h, rk, 0);
        if (end > rk) {
            fprintf(f, "  ranks %d-%d (%d ranks): no dump\n", rk, end, end - rk + 1);
            rk = end;
            continue;
        }
        fprintf(f, "  rank %d %s %s: ", rk, trace_coord_str(c, sizeof c, r->coord), r->host);
        if (!r->has_dump) {
            fprintf(f, "%s\n", r->damaged ? "damaged dump (skipped)" : "no dump");
        } else if (r->oldest_g < 0) {
            fprintf(f, "nothing in flight (dump: %s)\n", r->reason);
        } else {
            const hang_group *g = &r->groups[r->oldest_g];
            const hang_op *o = &g->in_flight[r->oldest_i];
            fprintf(f, "%s, %.1f s, %s (dump: %s)\n", op_str(op, sizeof op, g, o), o->age_s,
                    o->state, r->reason);
        }
    }
    if (!trace_hang_n_suspects(h) && h->oldest > 0 && h->oldest < HANG_MIN_AGE_S)
        fprintf(f,
                "suspects: none found (no op in flight had waited %.1f s: the dumps show a job "
                "that was making progress, not a hang)\n",
                HANG_MIN_AGE_S);
    else if (!trace_hang_n_suspects(h))
        fprintf(f, "suspects: none found\n");
    for (int pass = 0; pass < 2; pass++)
        for (int rk = 0, lines = 0; rk < h->world; rk++) {
            const hang_rank *r = &h->ranks[rk];
            if (pass ? !hang_is_note(h, r) : !hang_is_suspect(h, r)) continue;
            if (lines++ == HANG_LIST_MAX) {
                int left = 0;
                for (int q = rk; q < h->world; q++)
                    left += pass ? hang_is_note(h, &h->ranks[q]) : hang_is_suspect(h, &h->ranks[q]);
                print_rest(h, pass ? hang_is_note : hang_is_suspect,
                           pass ? "rank(s) with weaker evidence" : "suspect(s)", left, f);
                break;
            }
            int end = pass ? rk : no_dump_run(h, rk, 1);
            if (end > rk) { /* the same one reason each */
                fprintf(f, "suspects: ranks %d-%d (%d ranks): %s\n", rk, end, end - rk + 1,
                        r->why[0]);
                rk = end;
                continue;
            }
            fprintf(f, "%s: rank %d %s on %s: ", pass ? "also (weaker evidence)" : "suspects", rk,
                    trace_coord_str(c, sizeof c, r->coord), r->host);
            for (int i = 0; i < r->n_why; i++)
                fprintf(f, "%s%s", i ? "; " : "", r->why[i]);
            fprintf(f, "\n");
        }
}

static int add_int(cJSON *arr, int v) {
    cJSON *x = cJSON_CreateNumber(v);
    if (x && cJSON_AddItemToArray(arr, x)) return 1;
    cJSON_Delete(x);
    return 0;
}

static cJSON *suspect_json(const hang_rank *r) {
    cJSON *o = cJSON_CreateObject(), *c = trace_coord_json(r->coord), *why = cJSON_CreateArray();
    int ok = o && c && why && cJSON_AddNumberToObject(o, "rank", r->rank) &&
             cJSON_AddItemToObject(o, "coord", c);
    if (ok) c = NULL;
    ok = ok && cJSON_AddStringToObject(o, "host", r->host);
    for (int i = 0; ok && i < r->n_why; i++) {
        cJSON *s = cJSON_CreateString(r->why[i]);
        ok = s && cJSON_AddItemToArray(why, s);
        if (!ok) cJSON_Delete(s);
    }
    if (ok && cJSON_AddItemToObject(o, "reasons", why)) return o;
    cJSON_Delete(why);
    cJSON_Delete(c);
    cJSON_Delete(o);
    return NULL;
}

static cJSON *waiting_json(const hang_rank *r) {
    const hang_group *g = &r->groups[r->oldest_g];
    const hang_op *op = &g->in_flight[r->oldest_i];
    cJSON *o = cJSON_CreateObject();
    if (o && cJSON_AddNumberToObject(o, "rank", r->rank) &&
        cJSON_AddStringToObject(o, "op", op->op) && cJSON_AddStringToObject(o, "group", g->name) &&
        cJSON_AddNumberToObject(o, "seq", (double)op->seq) &&
        cJSON_AddNumberToObject(o, "age_s", op->age_s) &&
        cJSON_AddNumberToObject(o, "peer", (double)op->peer) &&
        cJSON_AddNumberToObject(o, "tag", (double)op->tag) &&
        cJSON_AddStringToObject(o, "state", op->state))
        return o;
    cJSON_Delete(o);
    return NULL;
}

static int is_waiting(const trace_hang *h, const hang_rank *r) {
    (void)h;
    return r->has_dump && r->oldest_g >= 0;
}

/* [{"what","op","group","seq","n_ranks","ranks":[first HANG_LIST_MAX]}], the first
 * HANG_LIST_MAX groups of the ranks `pick` selects (hang_by_op); *n_groups: all of them. */
static cJSON *groups_json(const trace_hang *h, int (*pick)(const trace_hang *, const hang_rank *),
                          int *n_groups) {
    int n;
    hang_key *k = hang_by_op(h, pick, &n);
    cJSON *arr = cJSON_CreateArray();
    int ok = k && arr;
    char what[160];
    *n_groups = 0;
    for (int i = 0, j; ok && i < n; i = j) {
        j = group_end(k, n, i);
        if ((*n_groups)++ >= HANG_LIST_MAX) continue;
        cJSON *g = cJSON_CreateObject(), *ranks = cJSON_CreateArray();
        ok = g && ranks && trace_json_add_text(g, "what", key_str(what, sizeof what, &k[i])) &&
             (k[i].kind < 2 ? cJSON_AddNullToObject(g, "op") && cJSON_AddNullToObject(g, "group")
                            : trace_json_add_text(g, "op", k[i].op) &&
                                  trace_json_add_text(g, "group", k[i].group)) &&
             (k[i].seq >= 0 ? cJSON_AddNumberToObject(g, "seq", (double)k[i].seq) != NULL
                            : cJSON_AddNullToObject(g, "seq") != NULL) &&
             cJSON_AddNumberToObject(g, "n_ranks", j - i);
        for (int q = i; ok && q < j && q < i + HANG_LIST_MAX; q++)
            ok = add_int(ranks, k[q].rank);
        if (ok && cJSON_AddItemToObject(g, "ranks", ranks)) {
            ranks = NULL;
            ok = cJSON_AddItemToArray(arr, g);
            if (ok) g = NULL;
        } else {
            ok = 0;
        }
        cJSON_Delete(ranks);
        cJSON_Delete(g);
    }
    free(k);
    if (ok) return arr;
    cJSON_Delete(arr);
    return NULL;
}

/* The per-rank lists hold their first HANG_LIST_MAX entries; "n_<list>" counts them all, and
 * "suspects_by_op" / "waiting_by_op" group every suspect / waiting rank by what it waits in. */
cJSON *trace_hang_json(const trace_hang *h) {
    cJSON *o = cJSON_CreateObject(), *shape = trace_coord_json(h->shape);
    cJSON *dumps = cJSON_CreateArray(), *missing = cJSON_CreateArray();
    cJSON *sus = cJSON_CreateArray(), *wait = cJSON_CreateArray(), *notes = cJSON_CreateArray();
    int n_sg = 0, n_wg = 0;
    cJSON *sus_by = groups_json(h, hang_is_suspect, &n_sg),
          *wait_by = groups_json(h, is_waiting, &n_wg);
    int ok = o && shape && dumps && missing && sus && wait && notes && sus_by && wait_by;
    int n[5] = {0}; /* dumps, missing, suspects, notes, waiting */
    for (int rk = 0; ok && rk < h->world; rk++) {
        const hang_rank *r = &h->ranks[rk];
        int li = r->has_dump ? 0 : 1;
        ok = n[li]++ >= HANG_LIST_MAX || add_int(li ? missing : dumps, rk);
        li = hang_is_suspect(h, r) ? 2 : 3;
        if (ok && r->cls && n[li]++ < HANG_LIST_MAX) {
            cJSON *s = suspect_json(r);
            ok = s && cJSON_AddItemToArray(li == 2 ? sus : notes, s);
        }
        if (ok && is_waiting(h, r) && n[4]++ < HANG_LIST_MAX) {
            cJSON *w = waiting_json(r);
            ok = w && cJSON_AddItemToArray(wait, w);
        }
    }
    const char *counts[] = {"n_dumps", "n_missing", "n_suspects", "n_notes", "n_waiting"};
    int cut = n_sg > HANG_LIST_MAX || n_wg > HANG_LIST_MAX;
    for (int i = 0; i < 5; i++) {
        ok = ok && cJSON_AddNumberToObject(o, counts[i], n[i]);
        cut |= n[i] > HANG_LIST_MAX;
    }
    ok = ok && cJSON_AddNumberToObject(o, "world", h->world) &&
         trace_json_add_text(o, "dir", h->dir) &&
         cJSON_AddNumberToObject(o, "list_max", HANG_LIST_MAX) &&
         cJSON_AddBoolToObject(o, "truncated", cut);
    cJSON *items[] = {shape, dumps, missing, sus, notes, wait, sus_by, wait_by};
    const char *names[] = {"shape", "dumps",   "missing",        "suspects",
                           "notes", "waiting", "suspects_by_op", "waiting_by_op"};
    for (int i = 0; i < 8; i++) {
        if (ok && cJSON_AddItemToObject(o, names[i], items[i])) continue;
        ok = 0;
        cJSON_Delete(items[i]);
    }
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}
