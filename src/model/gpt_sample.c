/* gpt_sample.c - drawing the next token from a row of logits: greedy,
 * temperature, top-k (`megascale sample`). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt.h"

static void swapf(float *a, float *b) {
    float t = *a;
    *a = *b;
    *b = t;
}

static int cmp_desc(const void *pa, const void *pb) {
    float a = *(const float *)pa, b = *(const float *)pb;
    return (a < b) - (a > b);
}

/* The k-th largest value (k in [1, n], counting equal values apart) of
 * a[0..n), which is reordered.  Quickselect with a three-way partition
 * (many equal logits cost one pass) around the median of three
 * pseudo-random elements: O(n) expected; past 2 log2(n) + 16 rounds (an
 * input that defeats the pivots) the rest is sorted, O(n log n) at worst. */
static float kth_largest(float *a, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1, budget = 16;
    for (int m = n; m > 1; m >>= 1)
        budget += 2;
    uint32_t x = 0x9e3779b9u; /* the pivots' xorshift: fixed, not the sampling stream */
    while (lo < hi) {
        if (budget-- == 0) {
            qsort(a + lo, (size_t)(hi - lo + 1), sizeof *a, cmp_desc);
            return a[want];
        }
        float p3[3];
        for (int j = 0; j < 3; j++) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            p3[j] = a[lo + (int)(x % (uint32_t)(hi - lo + 1))];
        }
        if (p3[0] > p3[1]) swapf(&p3[0], &p3[1]);
        if (p3[1] > p3[2]) swapf(&p3[1], &p3[2]);
        if (p3[0] > p3[1]) swapf(&p3[0], &p3[1]);
        float p = p3[1];
        /* [lo, lt) > p, [lt, i) == p, (gt, hi] < p */
        int lt = lo, i = lo, gt = hi;
        while (i <= gt) {
            if (a[i] > p)
                swapf(&a[lt++], &a[i++]);
            else if (a[i] < p)
                swapf(&a[i], &a[gt--]);
            else
                i++; /* equal (or unordered: a NaN) */
        }
        if (want < lt)
            hi = lt - 1;
        else if (want > gt)
            lo = gt + 1;
        else
            return p;
    }
    return a[lo];
}

int gpt_sample_token(const float *logits, int V, double temp, int top_k, ms_rng *rng, float *work) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temp <= 0) return best;
    float cut = -INFINITY;
    int at_cut = V; /* how many of the logits equal to cut are among the k */
    if (top_k > 0 && top_k < V) {
        memcpy(work, logits, sizeof(float) * (size_t)V);
        cut = kth_largest(work, V, top_k);
        at_cut = top_k; /* ties at the cut: the lowest ids, so that exactly k remain */
        for (int i = 0; i < V; i++)
            at_cut -= logits[i] > cut;
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
