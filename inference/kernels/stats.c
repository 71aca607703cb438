/* chatui's per-step token statistics over a row of raw logits, in two passes over the
 * vocabulary instead of torch's ten (inference/sampling.py's token_stats: log_softmax, exp,
 * the entropy's product, where and sum, gather, topk, and for greedy rows argmax and the
 * sampler columns, each a pass over [B, V] and a few allocations).
 *
 * Pass 1 finds the k best logits (value descending, index ascending on ties: the first of
 * equal maxima is torch.argmax's choice) with one vector compare against the k-th best per
 * 16 logits; pass 2 sums exp(x - max) and exp(x - max) * (x - max) (the row then still sits in
 * L2). log-sum-exp and entropy come from these sums in double: lse = log S, entropy =
 * lse - T / S. -inf logits (filtered tokens) add nothing; NaN is never chosen.
 *
 * topk_f32 (at the end) ranks many more (the top-p filter's 256 or 4096 candidates).
 *
 * Output per row (ld floats apart), the columns of token_stats then, for greedy rows
 * (chosen == NULL), sampler_stats' greedy columns:
 *   chosen id, its logprob, entropy, k ids, k logprobs, [1, 1, k alt probs, k cut codes]
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chatui_kernels.h"
#include "fastmath.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define MAXK 21 /* top_logprobs <= 20, and at least one for the argmax */
#define LANES 16
#define CHUNK 1024 /* logits summed in float lanes before joining the double total */

struct topk { /* a row's best logits so far, best first */
    float v[MAXK];
    int id[MAXK];
    int n, k;
};

/* Insert (x, i) after every kept entry of value >= x (indices arrive in increasing order, so
 * equal values keep index order); the list keeps its k best. */
static inline void topk_push(struct topk *t, float x, int i) {
    int p = t->n < t->k ? t->n++ : t->k - 1;
    while (p > 0 && t->v[p - 1] < x) {
        t->v[p] = t->v[p - 1];
        t->id[p] = t->id[p - 1];
        p--;
    }
    t->v[p] = x;
    t->id[p] = i;
}

static inline void topk_scalar(struct topk *t, const float *x, int i0, int i1) {
    for (int i = i0; i < i1; i++) {
        float v = x[i];
        if (t->n < t->k ? v == v : v > t->v[t->k - 1]) topk_push(t, v, i);
    }
}

/* The k (>= 1) best of x [V]. */
static void topk_row(const float *x, int V, struct topk *t) {
    int i = t->k < V ? t->k : V;
    topk_scalar(t, x, 0, i);
#if defined(__AVX512F__)
    for (; i + 16 <= V; i += 16) {
        if (t->n < t->k) { /* NaNs among the first: fill the list first */
            topk_scalar(t, x, i, i + 16);
            continue;
        }
        if (_mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), _mm512_set1_ps(t->v[t->k - 1]),
                               _CMP_GT_OQ))
            topk_scalar(t, x, i, i + 16);
    }
#elif defined(__AVX2__)
    for (; i + 8 <= V; i += 8) {
        if (t->n < t->k) {
            topk_scalar(t, x, i, i + 8);
            continue;
        }
        if (_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i),
                                             _mm256_set1_ps(t->v[t->k - 1]), _CMP_GT_OQ)))
            topk_scalar(t, x, i, i + 8);
    }
#endif
    topk_scalar(t, x, i, V);
}

#if defined(__AVX512F__)
/* fast_exp (fastmath.h) on 16 lanes, 0 below -87 (-inf logits). */
static inline __m512 exp16(__m512 d) {
    __mmask16 live = _mm512_cmp_ps_mask(d, _mm512_set1_ps(-87.0f), _CMP_GT_OQ);
    __m512 x = _mm512_min_ps(d, _mm512_set1_ps(87.0f));
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.5353362e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3398874e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6184413e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503406e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022652e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314720e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_add_epi32(_mm512_castps_si512(p),
                                 _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23));
    return _mm512_maskz_mov_ps(live, _mm512_castsi512_ps(e));
}
#elif defined(__AVX2__) && defined(__FMA__)
static inline __m256 exp8(__m256 d) {
    __m256 live = _mm256_cmp_ps(d, _mm256_set1_ps(-87.0f), _CMP_GT_OQ);
    __m256 x = _mm256_min_ps(d, _mm256_set1_ps(87.0f));
    __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
    __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_set1_ps(1.5353362e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3398874e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6184413e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5503406e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022652e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314720e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_add_epi32(_mm256_castps_si256(p),
                                 _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23));
    return _mm256_and_ps(live, _mm256_castsi256_ps(e));
}
#endif

/* S = sum exp(x - m), T = sum exp(x - m) (x - m) over finite x, in float lanes per chunk and
 * double across chunks. */
static void exp_sums(const float *x, int V, float m, double *S, double *T) {
    double s = 0.0, t = 0.0;
    for (int c0 = 0; c0 < V; c0 += CHUNK) {
        int c1 = c0 + CHUNK < V ? c0 + CHUNK : V;
        float ls[LANES] = {0}, lt[LANES] = {0};
        int i = c0;
#if defined(__AVX512F__)
        __m512 vs = _mm512_setzero_ps(), vt = _mm512_setzero_ps(), vm = _mm512_set1_ps(m);
        for (; i + 16 <= c1; i += 16) {
            __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), vm);
            __m512 e = exp16(d);
            vs = _mm512_add_ps(vs, e);
            /* e * d is 0 where e is (d = -inf would make it NaN) */
            vt = _mm512_fmadd_ps(e, _mm512_max_ps(d, _mm512_set1_ps(-88.0f)), vt);
        }
        _mm512_storeu_ps(ls, vs);
        _mm512_storeu_ps(lt, vt);
#elif defined(__AVX2__) && defined(__FMA__)
        __m256 vs = _mm256_setzero_ps(), vt = _mm256_setzero_ps(), vm = _mm256_set1_ps(m);
        for (; i + 8 <= c1; i += 8) {
            __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
            __m256 e = exp8(d);
            vs = _mm256_add_ps(vs, e);
            vt = _mm256_fmadd_ps(e, _mm256_max_ps(d, _mm256_set1_ps(-88.0f)), vt);
        }
        _mm256_storeu_ps(ls, vs);
        _mm256_storeu_ps(lt, vt);
#endif
        for (; i < c1; i++) {
            float d = x[i] - m;
            if (d > -87.0f) {
                float e = fast_exp(d);
                ls[0] += e;
                lt[0] += e * d;
            }
        }
        float cs = 0.f, ct = 0.f;
        for (int j = 0; j < LANES; j++) {
            cs += ls[j];
            ct += lt[j];
        }
        s += cs;
        t += ct;
    }
    *S = s;
    *T = t;
}

static void stats_row(const float *x, int V, const int64_t *chosen, int k, float greedy_cut,
                      float *out) {
    struct topk t;
    t.n = 0;
    t.v[0] = -INFINITY; /* (a row of NaN only) */
    t.id[0] = 0;
    t.k = k > 0 ? k : 1;
    topk_row(x, V, &t);
    float m = t.v[0];
    double S, T;
    exp_sums(x, V, m, &S, &T);
    double lse = log(S);
    int c = chosen ? (int)*chosen : t.id[0];
    out[0] = (float)c;
    out[1] = (float)((double)(x[c] - m) - lse);
    out[2] = (float)(lse - T / S);
    for (int j = 0; j < k; j++) {
        int ok = j < t.n;
        out[3 + j] = ok ? (float)t.id[j] : 0.f;
        out[3 + k + j] = ok ? (float)((double)(t.v[j] - m) - lse) : -INFINITY;
    }
    if (!chosen) {
        float *s = out + 3 + 2 * k;
        s[0] = 1.f; /* the chosen token's probability after the chain */
        s[1] = 1.f; /* the nucleus */
        for (int j = 0; j < k; j++) {
            int is = j < t.n && t.id[j] == c;
            s[2 + j] = is ? 1.f : 0.f;
            s[2 + k + j] = is ? 0.f : greedy_cut;
        }
    }
}

int token_stats_max_k(void) { return MAXK - 1; }

void token_stats_f32(const float *logits, int B, int V, const int64_t *chosen, int k,
                     float greedy_cut, float *out, int ld, int threads) {
    if (threads < 1) threads = 1;
    #pragma omp parallel for num_threads(threads) schedule(static) if (B > 1 && threads > 1)
    for (int b = 0; b < B; b++)
        stats_row(logits + (size_t)b * V, V, chosen ? chosen + b : NULL, k, greedy_cut,
                  out + (size_t)b * ld);
}

/* ---- top-k of many (the top-p filter's candidates: k = 256 or 4096 of 49,152) ----
 * torch.topk over a [B, V] row costs 0.17 ms at k = 256 and 0.57 ms at k = 4096 (one thread,
 * V = 49,152), every sampled row and step. Here: a threshold no larger than the k-th largest
 * value (the k-th largest of the maxima of V / bs blocks, found by histograms of their bits),
 * the values at or above it gathered in index order (a few more than k), and those sorted by
 * a stable radix sort, descending. Ties: lower index first. */

static inline uint32_t order_key(float v) {
    union { float f; uint32_t u; } c = {v};
    return c.u & 0x80000000u ? ~c.u : c.u | 0x80000000u; /* unsigned order = float order */
}

/* The bin where the k-th largest falls, walking h [n] down; *above: how many lie above it. */
static int kth_bin(const int *h, int n, int k, int *above) {
    int cum = 0;
    for (int b = n - 1; b >= 0; b--) {
        if (cum + h[b] >= k) {
            *above = cum;
            return b;
        }
        cum += h[b];
    }
    *above = cum;
    return 0;
}

/* The k-th largest of keys [n] (1 <= k <= n), by three histograms (12, 12, 8 bits). */
static uint32_t kth_key(const uint32_t *keys, int n, int k, int *h /* [4096] */) {
    int above;
    memset(h, 0, sizeof(int) * 4096);
    for (int i = 0; i < n; i++) h[keys[i] >> 20]++;
    uint32_t b1 = (uint32_t)kth_bin(h, 4096, k, &above);
    k -= above;
    memset(h, 0, sizeof(int) * 4096);
    for (int i = 0; i < n; i++)
        if ((keys[i] >> 20) == b1) h[(keys[i] >> 8) & 0xfff]++;
    uint32_t prefix = (b1 << 12) | (uint32_t)kth_bin(h, 4096, k, &above);
    k -= above;
    memset(h, 0, sizeof(int) * 256);
    for (int i = 0; i < n; i++)
        if ((keys[i] >> 8) == prefix) h[keys[i] & 0xff]++;
    return (prefix << 8) | (uint32_t)kth_bin(h, 256, k, &above);
}

static void topk_many_row(const float *x, int V, int k, float *vals, int64_t *ids,
                          uint32_t *keys /* [V] */, int32_t *idx /* [V] */,
                          uint32_t *keys2 /* [V] */, int32_t *idx2 /* [V] */, int *h) {
    int bs = 1;
    while (bs < 16 && V / (bs * 2) >= 2 * k) bs *= 2;
    int nb = V / bs;
    float T = -INFINITY;
    if (nb >= k && bs > 1) {
        for (int j = 0; j < nb; j++) {
            float m = x[j * bs];
            for (int i = 1; i < bs; i++) m = x[j * bs + i] > m ? x[j * bs + i] : m;
            keys[j] = order_key(m);
        }
        uint32_t t = kth_key(keys, nb, k, h);
        union { uint32_t u; float f; } c = {t & 0x80000000u ? t & 0x7fffffffu : ~t};
        T = c.f;
    }
    int n = 0;
    for (int i = 0; i < V; i++)
        if (x[i] >= T || bs == 1) {
            keys[n] = ~order_key(x[i]); /* ascending ~key = descending value */
            idx[n++] = i;
        }
    /* stable LSD radix sort of (keys, idx) by keys, 8 bits a pass */
    for (int shift = 0; shift < 32; shift += 8) {
        int cnt[257] = {0};
        for (int i = 0; i < n; i++) cnt[((keys[i] >> shift) & 0xff) + 1]++;
        for (int d = 0; d < 256; d++) cnt[d + 1] += cnt[d];
        for (int i = 0; i < n; i++) {
            int p = cnt[(keys[i] >> shift) & 0xff]++;
            keys2[p] = keys[i];
            idx2[p] = idx[i];
        }
        uint32_t *tk = keys; keys = keys2; keys2 = tk;
        int32_t *ti = idx; idx = idx2; idx2 = ti;
    }
    for (int j = 0; j < k && j < n; j++) {
        ids[j] = idx[j];
        vals[j] = x[idx[j]];
    }
}

void topk_f32(const float *x, int B, int V, int k, float *vals, int64_t *ids, int threads) {
    if (threads < 1) threads = 1;
    if (k > V) k = V;
    if (k <= 0) return;
    #pragma omp parallel num_threads(threads) if (B > 1 && threads > 1)
    {
        uint32_t *keys = (uint32_t *)malloc(sizeof(uint32_t) * 2 * (size_t)V);
        int32_t *idx = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)V);
        int *h = (int *)malloc(sizeof(int) * 4096);
        #pragma omp for schedule(static)
        for (int b = 0; b < B; b++)
            topk_many_row(x + (size_t)b * V, V, k, vals + (size_t)b * k, ids + (size_t)b * k,
                          keys, idx, keys + V, idx + V, h);
        free(keys);
        free(idx);
        free(h);
    }
}
