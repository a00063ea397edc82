/* train_agree.c - the ranks' options compared at start-up, before any
 * collective whose shape or count follows from them: ranks started with a
 * different --dim used to corrupt the heap inside MPI (buffers of different
 * sizes in one reduce-scatter), a different --steps to hang until the
 * communicator's timeout.
 *
 * What is compared: train_config.shared_json, the options that every rank
 * must share (the option table's per_rank 0; src/cli/cmd_train.c), with
 * "dp" replaced by the effective data-parallel size (--dp given on one rank
 * and inferred on another is the same layout).  Its 64-bit FNV-1a hash goes
 * through one all-gather over the world; only when the hashes differ do the
 * ranks learn which options differ (rank 0 broadcasts its JSON, each rank
 * flags the options it disagrees on, a max all-reduce merges the flags) and
 * their values (one all-gather of the first AGREE_NAMED flagged options'
 * values).  Every decision follows from data every rank holds, so every rank
 * makes the same collectives and fails with the same message. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/hash.h"
#include "comm/comm.h"
#include "train/train_internal.h"

#define AGREE_NAMED 3   /* differing options named with their values */
#define AGREE_VALUE 64  /* bytes per value: an 8-byte hash, then its text */
#define AGREE_GROUPS 4  /* distinct values named per option */
#define AGREE_RANKS 120 /* characters of one rank list */
#define AGREE_MSG 4096

static uint64_t fnv1a(const char *s) {
    return ms_fnv1a_str(MS_FNV1A_BASIS, s);
}

/* The shared options' text with "dp" set to dp (> 0), malloc'd; "{}" for
 * no JSON; NULL on OOM or unparsable JSON. */
static char *effective_text(const char *json, int dp) {
    cJSON *o = cJSON_Parse(json && *json ? json : "{}");
    if (!o) return NULL;
    if (dp > 0 && cJSON_GetObjectItemCaseSensitive(o, "dp"))
        cJSON_ReplaceItemInObjectCaseSensitive(o, "dp", cJSON_CreateNumber(dp));
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

/* One value for the message, into slot (AGREE_VALUE bytes): the hash of
 * its full text (so truncation never merges two values), then the text:
 * numbers as JSON, strings quoted, "unset" for null, "no such option"
 * where the option is missing. */
static void value_slot(const cJSON *v, unsigned char *slot) {
    char *json = v ? cJSON_PrintUnformatted(v) : NULL;
    const char *text = !v ? "no such option" : cJSON_IsNull(v) ? "unset" : json ? json : "?";
    uint64_t h = fnv1a(text);
    memcpy(slot, &h, sizeof h);
    char *t = (char *)slot + sizeof h;
    size_t room = AGREE_VALUE - sizeof h;
    if (cJSON_IsString(v)) {
        int n = snprintf(t, room, "'%s'", v->valuestring);
        if (n >= (int)room) snprintf(t + room - 5, 5, "...'");
    } else {
        int n = snprintf(t, room, "%s", text);
        if (n >= (int)room) snprintf(t + room - 4, 4, "...");
    }
    free(json);
}

/* 1 when a and b print the same (as the hash saw them; cJSON_Compare
 * would take two doubles an ulp apart as equal). */
static int same_text(const cJSON *a, const cJSON *b) {
    char *x = cJSON_PrintUnformatted(a), *y = cJSON_PrintUnformatted(b);
    int same = x && y && !strcmp(x, y);
    free(x);
    free(y);
    return same;
}

/* Append printf-style text to msg (capacity AGREE_MSG), truncating. */
static void add(char *msg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(char *msg, const char *fmt, ...) {
    size_t len = strlen(msg);
    if (len + 1 >= AGREE_MSG) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + len, AGREE_MSG - len, fmt, ap);
    va_end(ap);
}

/* "rank 3" or "ranks 0-2,5" of the ranks r with in[r], at most AGREE_RANKS
 * characters (then ",..."). */
static void add_ranks(char *msg, const int *in, int n) {
    int count = 0;
    for (int r = 0; r < n; r++)
        count += in[r];
    char list[AGREE_RANKS + 8] = "";
    size_t len = 0;
    for (int r = 0; r < n; r++) {
        if (!in[r] || (r > 0 && in[r - 1])) continue;
        int e = r;
        while (e + 1 < n && in[e + 1])
            e++;
        char one[32];
        int k = e == r ? snprintf(one, sizeof one, "%s%d", len ? "," : "", r)
                       : snprintf(one, sizeof one, "%s%d-%d", len ? "," : "", r, e);
        if (len + (size_t)k > AGREE_RANKS) {
            memcpy(list + len, ",...", 5);
            break;
        }
        memcpy(list + len, one, (size_t)k + 1);
        len += (size_t)k;
    }
    add(msg, "%s %s", count == 1 ? "rank" : "ranks", list);
}

/* "--NAME is A on ranks .. but B on rank .. and C on ..." from the values'
 * slots of every rank (vals + (r*n_sel + j)*AGREE_VALUE). */
static void add_option(char *msg, const char *name, const unsigned char *vals, int n, int n_sel,
                       int j, int *in) {
    add(msg, "--%s is ", name);
    uint64_t seen[AGREE_GROUPS];
    int groups = 0, more = 0;
    for (int r = 0; r < n; r++) {
        const unsigned char *s = vals + ((size_t)r * n_sel + j) * AGREE_VALUE;
        uint64_t h;
        memcpy(&h, s, sizeof h);
        int known = 0;
        for (int g = 0; g < groups; g++)
            known |= seen[g] == h;
        if (known) continue;
        if (groups == AGREE_GROUPS) {
            more++;
            continue;
        }
        seen[groups] = h;
        for (int q = 0; q < n; q++) {
            uint64_t hq;
            memcpy(&hq, vals + ((size_t)q * n_sel + j) * AGREE_VALUE, sizeof hq);
            in[q] = hq == h;
        }
        add(msg, "%s%s on ",
            groups == 0   ? ""
            : groups == 1 ? " but "
                          : " and ",
            (const char *)s + sizeof h);
        add_ranks(msg, in, n);
        groups++;
    }
    if (more) add(msg, " (and %d more values)", more);
}

/* The comparison's state; every array is sized from data every rank
 * holds alike (the world size, rank 0's JSON). */
typedef struct {
    comm_group *g;
    int n, me;
    char *mine, *text0; /* this rank's and rank 0's effective options */
    int64_t *hash;      /* [n] every rank's hash */
    cJSON *o0, *om;     /* text0 and mine, parsed */
    int k;              /* rank 0's options */
    int32_t *flag;      /* [k + 1]: option i differs on some rank; [k]: an option rank 0 lacks */
    int n_sel, sel[AGREE_NAMED];
    unsigned char *vals; /* [n][n_sel] value slots */
    int *in;             /* [n] scratch: a set of ranks */
} agree;

static ms_status oom(void) {
    return ms_error(MS_ERR_NOMEM, "comparing the ranks' options: out of memory");
}

/* Rank 0's options to every rank; a->flag merged over the ranks. */
static ms_status flag_options(agree *a) {
    int64_t len0 = a->me == 0 ? (int64_t)strlen(a->mine) : 0;
    MS_TRY(comm_broadcast(a->g, &len0, 1, COMM_I64, 0));
    a->text0 = a->me == 0 ? a->mine : calloc((size_t)len0 + 1, 1);
    if (!a->text0) return oom();
    MS_TRY(comm_broadcast(a->g, a->text0, (size_t)len0 + 1, COMM_U8, 0));
    a->o0 = cJSON_Parse(a->text0);
    a->om = cJSON_Parse(a->mine);
    a->k = a->o0 ? cJSON_GetArraySize(a->o0) : 0;
    a->flag = calloc((size_t)a->k + 1, sizeof *a->flag);
    if (!a->flag) return oom();
    int i = 0;
    for (const cJSON *x = a->o0 ? a->o0->child : NULL; x; x = x->next, i++) {
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(a->om, x->string);
        a->flag[i] = !y || !same_text(x, y);
    }
    for (const cJSON *y = a->om ? a->om->child : NULL; y; y = y->next)
        a->flag[a->k] |= !cJSON_GetObjectItemCaseSensitive(a->o0, y->string);
    a->flag[a->k] |= !a->o0 || !a->om;
    return comm_allreduce(a->g, a->flag, a->flag, (size_t)a->k + 1, COMM_I32, COMM_MAX);
}

/* The first AGREE_NAMED flagged options: every rank's values. */
static ms_status gather_values(agree *a) {
    for (int i = 0; i < a->k && a->n_sel < AGREE_NAMED; i++)
        if (a->flag[i]) a->sel[a->n_sel++] = i;
    if (!a->n_sel) return MS_OK;
    unsigned char *mine = calloc((size_t)a->n_sel, AGREE_VALUE);
    a->vals = calloc((size_t)a->n * a->n_sel, AGREE_VALUE);
    if (!mine || !a->vals) {
        free(mine);
        return oom();
    }
    for (int j = 0; j < a->n_sel; j++) {
        const char *name = cJSON_GetArrayItem(a->o0, a->sel[j])->string;
        value_slot(cJSON_GetObjectItemCaseSensitive(a->om, name), mine + (size_t)j * AGREE_VALUE);
    }
    ms_status st = comm_allgather(a->g, mine, a->vals, (size_t)a->n_sel * AGREE_VALUE, COMM_U8);
    free(mine);
    return st;
}

/* The message, the same on every rank, as the error. */
static ms_status mismatch(agree *a) {
    char msg[AGREE_MSG] = "the ranks' options differ: ";
    for (int j = 0; j < a->n_sel; j++) {
        if (j) add(msg, "; ");
        add_option(msg, cJSON_GetArrayItem(a->o0, a->sel[j])->string, a->vals, a->n, a->n_sel, j,
                   a->in);
    }
    int rest = -a->n_sel, shown = 0;
    for (int i = 0; i < a->k; i++)
        rest += a->flag[i];
    if (rest > 0) add(msg, "; and %d more:", rest);
    int i = 0;
    for (const cJSON *x = a->o0 ? a->o0->child : NULL; rest > 0 && x; x = x->next, i++)
        if (a->flag[i] && shown++ >= a->n_sel)
            add(msg, "%s --%s", shown > a->n_sel + 1 ? "," : "", x->string);
    if (a->flag[a->k] || !a->n_sel) { /* extra options, another order: no ranks gathered */
        for (int r = 0; r < a->n; r++)
            a->in[r] = a->hash[r] != a->hash[0];
        add(msg, "%sthe option tables differ (another megascale version?) between rank 0 and ",
            a->n_sel ? "; " : "");
        add_ranks(msg, a->in, a->n);
    }
    add(msg, ". Start every rank with the same options (docs/user-guide.md, \"Layout\", lists "
             "the few that may differ)");
    return ms_error(MS_ERR_ARG, "%s", msg);
}

ms_status train_agree(comm_world *w, const char *shared_json, int dp) {
    agree a = {.g = comm_world_group(w)};
    a.n = comm_group_size(a.g), a.me = comm_group_rank(a.g);
    a.mine = effective_text(shared_json, dp);
    a.hash = calloc((size_t)a.n, sizeof *a.hash);
    a.in = calloc((size_t)a.n, sizeof *a.in);
    ms_status st = a.mine && a.hash && a.in ? MS_OK : oom();
    int64_t h = a.mine ? (int64_t)fnv1a(a.mine) : 0;
    if (st == MS_OK) st = comm_allgather(a.g, &h, a.hash, 1, COMM_I64);
    int differ = 0;
    for (int r = 1; st == MS_OK && r < a.n; r++)
        differ |= a.hash[r] != a.hash[0];
    if (st == MS_OK && differ) st = flag_options(&a);
    if (st == MS_OK && differ) st = gather_values(&a);
    if (st == MS_OK && differ) st = mismatch(&a);
    cJSON_Delete(a.o0);
    cJSON_Delete(a.om);
    if (a.text0 != a.mine) free(a.text0);
    free(a.mine);
    free(a.hash);
    free(a.flag);
    free(a.in);
    free(a.vals);
    return st;
}
