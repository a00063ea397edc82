/* test_sample.c - gpt_sample_token against the selection sort it replaced
 * (O(k V) a token): the same draws, bit for bit, for the same rng stream,
 * on random logits with many ties (ties at the k-th value go to the lowest
 * ids), every k from 1 to V on small V, greedy and high temperatures.
 * `test_sample --perf` times both for GPT-2's V = 50257 and k = 50, 1000, V
 * (median of 7 runs of 200 draws) for docs/perf.md. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "model/gpt.h"

/* The draw of cmd_sample.c before gpt_sample_token, verbatim: the reference. */
static int draw_ref(float *logits, int V, double temp, int top_k, ms_rng *rng, float *work) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temp <= 0) return best;
    float cut = -INFINITY;
    int at_cut = V;               /* how many of the logits equal to cut are among the k */
    if (top_k > 0 && top_k < V) { /* k-th largest by partial selection on a copy */
        memcpy(work, logits, sizeof(float) * (size_t)V);
        for (int k = 0; k < top_k; k++) {
            int mi = k;
            for (int i = k + 1; i < V; i++)
                if (work[i] > work[mi]) mi = i;
            float t = work[k];
            work[k] = work[mi];
            work[mi] = t;
        }
        cut = work[top_k - 1];
        at_cut = 0; /* ties at the cut: the lowest ids, so that exactly k remain */
        for (int k = 0; k < top_k; k++)
            at_cut += work[k] == cut;
    }
    double sum = 0;
    for (int i = 0; i < V; i++) {
        int in = logits[i] > cut || (logits[i] == cut && at_cut-- > 0);
        double p = in ? exp((logits[i] - logits[best]) / temp) : 0;
        work[i] = (float)p;
        sum += p;
    }
    double u = ms_rng_next_uniform(rng) * sum, acc = 0;
    for (int i = 0; i < V; i++) {
        acc += work[i];
        if (u < acc) return i;
    }
    return best;
}

/* logits (V) from seed: `levels` distinct values (many ties when few), a
 * spread of `scale`, some -0.0 and -inf among them when odd. */
static void fill(float *l, int V, uint64_t seed, int levels, float scale, int odd) {
    for (int i = 0; i < V; i++) {
        int q = (int)(ms_rng_u64(seed, 1, (uint64_t)i) % (uint64_t)levels);
        l[i] = scale * ((float)q / (float)levels - 0.5f);
        if (odd && ms_rng_u64(seed, 2, (uint64_t)i) % 17 == 0) l[i] = -0.0f;
        if (odd && ms_rng_u64(seed, 3, (uint64_t)i) % 29 == 0) l[i] = -INFINITY;
    }
}

/* n draws of both from the same streams over fresh logits; 1 if all agree. */
static int same_draws(int V, int k, double temp, int levels, float scale, int odd, uint64_t seed,
                      int n) {
    float *l = malloc(sizeof(float) * (size_t)V), *w1 = malloc(sizeof(float) * (size_t)V);
    float *w2 = malloc(sizeof(float) * (size_t)V), *l2 = malloc(sizeof(float) * (size_t)V);
    ms_rng r1 = ms_rng_make(seed, 7), r2 = ms_rng_make(seed, 7);
    int good = l && w1 && w2 && l2;
    for (int t = 0; good && t < n; t++) {
        fill(l, V, seed * 1000 + (uint64_t)t, levels, scale, odd);
        memcpy(l2, l, sizeof(float) * (size_t)V);
        int a = draw_ref(l, V, temp, k, &r1, w1);
        int b = gpt_sample_token(l2, V, temp, k, &r2, w2);
        if (a != b || memcmp(l, l2, sizeof(float) * (size_t)V)) {
            fprintf(stderr, "V %d k %d temp %g levels %d seed %llu draw %d: reference %d, new %d\n",
                    V, k, temp, levels, (unsigned long long)seed, t, a, b);
            good = 0;
        }
    }
    free(l), free(l2), free(w1), free(w2);
    return good;
}

static void test_same_draws(void) {
    /* every k on small V, few levels (ties everywhere), and the odd values */
    for (int V = 1; V <= 40; V += 13)
        for (int k = 0; k <= V + 1; k++)
            for (int levels = 1; levels <= 8; levels *= 2)
                T_OK(same_draws(V, k, 1.0, levels, 4.0f, levels == 4, (uint64_t)(V * 100 + k), 20));
    /* GPT-2's V: ties at the cut, temperatures from greedy to flat */
    static const int ks[] = {1, 2, 40, 50, 1000, 50257, 60000};
    static const double temps[] = {0, 0.3, 0.8, 1.0, 5.0};
    for (size_t a = 0; a < sizeof ks / sizeof ks[0]; a++)
        for (size_t b = 0; b < sizeof temps / sizeof temps[0]; b++)
            T_OK(same_draws(50257, ks[a], temps[b], ks[a] < 100 ? 300 : 100000, 20.0f, b == 2,
                            a * 10 + b + 1, ks[a] <= 1000 ? 3 : 1));
    /* a row of one value: every id tied, exactly k drawn among the first k */
    float l[64], w[64];
    for (int i = 0; i < 64; i++)
        l[i] = 1.5f;
    ms_rng r = ms_rng_make(3, 1);
    int hi = 0;
    for (int t = 0; t < 200; t++) {
        int id = gpt_sample_token(l, 64, 1.0, 5, &r, w);
        hi = id > hi ? id : hi;
    }
    T_EQ_INT(hi, 4);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median over 7 runs of the time per draw of fn, in microseconds. */
static double time_draw(int (*fn)(float *, int, double, int, ms_rng *, float *), const float *l,
                        int V, int k, int draws) {
    float *c = malloc(sizeof(float) * (size_t)V), *w = malloc(sizeof(float) * (size_t)V);
    double t[7];
    volatile int sink = 0;
    for (int run = 0; run < 7; run++) {
        ms_rng r = ms_rng_make(1, 1);
        double t0 = now_s();
        for (int d = 0; d < draws; d++) {
            memcpy(c, l, sizeof(float) * (size_t)V);
            sink += fn(c, V, 0.8, k, &r, w);
        }
        t[run] = (now_s() - t0) / draws * 1e6;
    }
    (void)sink;
    free(c), free(w);
    qsort(t, 7, sizeof t[0], cmp_d);
    return t[3];
}

static int new_draw(float *l, int V, double temp, int k, ms_rng *r, float *w) {
    return gpt_sample_token(l, V, temp, k, r, w);
}

static void perf(void) {
    const int V = 50257;
    float *l = malloc(sizeof(float) * (size_t)V);
    for (int i = 0; i < V; i++) /* logit-like: a normal spread */
        l[i] = 3.0f * ms_rng_normal(11, 0, (uint64_t)i);
    printf("V %d, median of 7 runs, microseconds per draw (temperature 0.8)\n", V);
    printf("%8s %14s %14s %8s\n", "k", "selection", "quickselect", "speedup");
    static const int ks[] = {50, 1000, 50256, 50257}; /* V - 1: the old worst case */
    for (size_t a = 0; a < 4; a++) {
        int k = ks[a], slow = k > 1000 ? 1 : k >= 1000 ? 5 : 50, fast = 200;
        double o = k >= V ? time_draw(draw_ref, l, V, k, fast) : time_draw(draw_ref, l, V, k, slow);
        double n = time_draw(new_draw, l, V, k, fast);
        printf("%8d %14.1f %14.1f %7.1fx\n", k, o, n, o / n);
    }
    free(l);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--perf")) {
        perf();
        return 0;
    }
    test_same_draws();
    return ms_test_summary("test_sample");
}
