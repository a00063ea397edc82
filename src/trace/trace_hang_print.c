/* trace_hang_print.c - the hang analysis as text (grid tables per pipeline
 * stage, the oldest in-flight op per rank, the suspects) and as JSON. */
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

static int rank_at(const trace_hang *h, int dp, int pp, int tp) {
    return tp + h->shape.tp * (dp + h->shape.dp * pp);
}

/* Bounds on the text for a huge world (a damaged dump said 1048575: millions of lines). */
#define HANG_TABLE_MAX 4096 /* ranks drawn in the state tables */
#define HANG_RUN_MIN 4      /* ranks without a dump in a row said in one line */

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
    for (int pp = 0; pp < h->shape.pp; pp++) {
        fprintf(f, "pp stage %d (rows dp, columns tp):\n%8s", pp, "");
        for (int tp = 0; tp < h->shape.tp; tp++)
            fprintf(f, "  tp %-6d", tp);
        fprintf(f, "\n");
        for (int dp = 0; dp < h->shape.dp; dp++) {
            fprintf(f, "  dp %-3d", dp);
            for (int tp = 0; tp < h->shape.tp; tp++)
                fprintf(f, "  %-9s", state_of(h, &h->ranks[rank_at(h, dp, pp, tp)]));
            fprintf(f, "\n");
        }
    }
}

void trace_hang_print(const trace_hang *h, FILE *f) {
    int missing = h->world - h->n_dumps;
    fprintf(f, "hang analysis of %s: world %d = dp %d x pp %d x tp %d; %d dump(s), %d missing\n",
            h->dir, h->world, h->shape.dp, h->shape.pp, h->shape.tp, h->n_dumps, missing);
    print_tables(h, f);
    fprintf(f, "oldest in-flight op per rank:\n");
    char c[64], op[512];
    for (int rk = 0; rk < h->world; rk++) {
        const hang_rank *r = &h->ranks[rk];
        int end = no_dump_run(h, rk, 0);
        if (end > rk) {
            fprintf(f, "  ranks %d-%d (%d ranks): no dump\n", rk, end, end - rk + 1);
            rk = end;
            continue;
        }
        fprintf(f, "  rank %d %s %s: ", rk, trace_coord_str(c, sizeof c, r->coord), r->host);
        if (!r->has_dump) {
            fprintf(f, "no dump\n");
        } else if (r->oldest_g < 0) {
            fprintf(f, "nothing in flight (dump: %s)\n", r->reason);
        } else {
            const hang_group *g = &r->groups[r->oldest_g];
            const hang_op *o = &g->in_flight[r->oldest_i];
            fprintf(f, "%s, %.1f s, %s (dump: %s)\n", op_str(op, sizeof op, g, o), o->age_s,
                    o->state, r->reason);
        }
    }
    if (!trace_hang_n_suspects(h)) fprintf(f, "suspects: none found\n");
    for (int pass = 0; pass < 2; pass++)
        for (int rk = 0; rk < h->world; rk++) {
            const hang_rank *r = &h->ranks[rk];
            if (pass ? !hang_is_note(h, r) : !hang_is_suspect(h, r)) continue;
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

cJSON *trace_hang_json(const trace_hang *h) {
    cJSON *o = cJSON_CreateObject(), *shape = trace_coord_json(h->shape);
    cJSON *dumps = cJSON_CreateArray(), *missing = cJSON_CreateArray();
    cJSON *sus = cJSON_CreateArray(), *wait = cJSON_CreateArray(), *notes = cJSON_CreateArray();
    int ok = o && shape && dumps && missing && sus && wait && notes;
    for (int rk = 0; ok && rk < h->world; rk++) {
        const hang_rank *r = &h->ranks[rk];
        ok = add_int(r->has_dump ? dumps : missing, rk);
        if (ok && r->cls) {
            cJSON *s = suspect_json(r);
            ok = s && cJSON_AddItemToArray(hang_is_suspect(h, r) ? sus : notes, s);
        }
        if (ok && r->has_dump && r->oldest_g >= 0) {
            cJSON *w = waiting_json(r);
            ok = w && cJSON_AddItemToArray(wait, w);
        }
    }
    ok = ok && cJSON_AddNumberToObject(o, "world", h->world) &&
         trace_json_add_text(o, "dir", h->dir);
    cJSON *items[] = {shape, dumps, missing, sus, notes, wait};
    const char *names[] = {"shape", "dumps", "missing", "suspects", "notes", "waiting"};
    for (int i = 0; i < 6; i++) {
        if (ok && cJSON_AddItemToObject(o, names[i], items[i])) continue;
        ok = 0;
        cJSON_Delete(items[i]);
    }
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}
