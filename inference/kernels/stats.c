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
 * topk_f32 ranks many more (the top-p filter's 256 or 4096 candidates), and sample_f32 (at
 * the end) runs a sampled step's whole chain and draw.
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

/* sampler_stats' columns of a greedy row after its token_stats' in out: probability and
 * nucleus 1, each alternative 1 and kept if it is the chosen c, else 0 and cut. */
static void greedy_columns(float *out, int k, int64_t c, float cut) {
    float *s = out + 3 + 2 * k;
    s[0] = 1.f; /* the chosen token's probability after the chain */
    s[1] = 1.f; /* the nucleus */
    for (int j = 0; j < k; j++) {
        int is = (int64_t)out[3 + j] == c && out[3 + k + j] > -INFINITY;
        s[2 + j] = is ? 1.f : 0.f;
        s[2 + k + j] = is ? 0.f : cut;
    }
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
    if (!chosen) greedy_columns(out, k, c, greedy_cut);
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

/* Stable LSD radix sort of (keys, idx) [n] by the low `bits` bits of keys (a multiple of 8),
 * 8 bits a pass, through keys2 and idx2; returns the array (idx or idx2) that holds the order
 * (its keys in the matching keys array). */
static int32_t *radix_sort(uint32_t *keys, int32_t *idx, uint32_t *keys2, int32_t *idx2, int n,
                           int bits) {
    for (int shift = 0; shift < bits; shift += 8) {
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
    return idx;
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
    idx = radix_sort(keys, idx, keys2, idx2, n, 32);
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

/* ---- the sampler: sampling.py's chain (temperature, top-k, top-p, min-p) and draw, fused ----
 * torch's chain is a dozen passes over each row's [V] logits with an allocation each (the
 * division, top-k's threshold, top-p's softmax, candidates, cumulative sums, scatter and
 * mask, min-p's softmax, the draw's softmax and cumulative sum, the sampler columns' count and
 * gathers): 4.7 ms of an 18.8 ms 8-column comparison step of the default model. Here a
 * sampled row takes: x = pre / T (and its max); top-k's threshold (the k-th largest, by
 * order-key histograms); e = exp(x - max) for the tokens top-k keeps; top-p's nucleus (as
 * _top_p_keep: the float64 mass below each rank tested against 1 - top_p in float32, ties by
 * ascending id; found by its mass's histogram, see nucleus()); min-p (e < min_p, e of the
 * best token being 1); then one uniform number against the float64 cumulative sum of the
 * kept probabilities in vocabulary order (sampling.sample_rows' CPU draw). Removed tokens
 * carry e = -1 through the passes; a kept token whose exp underflows stays in the nucleus
 * count, as a finite logit does in torch's.
 *
 * Cut codes (sampling.CUT_NAMES): 0 kept, 1 top-k, 2 top-p, 3 min-p, 4 greedy. */

#define CUT_TOP_K 1.f
#define CUT_TOP_P 2.f
#define CUT_MIN_P 3.f
#define CUT_GREEDY 4.f

#define NBIN 1024 /* a non-negative float's top 12 bits (sign 0): e <= 1 lies below 0x3f9 */

struct sample_scratch {
    float *e;        /* [V] */
    uint32_t *keys;  /* [2V] */
    int32_t *idx;    /* [2V] */
    int *h;          /* [4096] */
    float *cv;       /* [V + 16] candidates' values (top-k's), or the nucleus's survivors' */
    int64_t *cid;    /* [V] candidates' ids */
    double *sums;    /* [V / CHUNK + 1] the draw's chunk sums */
    int32_t *surv;   /* [V + 16] the nucleus's survivors (their values in cv) */
    double *hm;      /* [4 NBIN] their mass by bin */
};

/* Each thread's scratch, kept between calls and grown for a larger vocabulary. A sampled row
 * needs about 36 bytes a token of it (1.7 MB at 49,152): malloc'd and freed at every call,
 * those pages were faulted in and zeroed by the kernel again at every step (perf of one
 * row at temperature 0.7: clear_page a fifth of the samples, at 90 us a step). The threads
 * are OpenMP's pool and the caller's, which live as long as the process. */
static __thread struct sample_scratch tls_scratch;
static __thread int tls_scratch_v;

static struct sample_scratch *thread_scratch(int V) {
    struct sample_scratch *s = &tls_scratch;
    if (tls_scratch_v < V) {
        free(s->e);
        free(s->keys);
        free(s->idx);
        free(s->h);
        free(s->cv);
        free(s->cid);
        free(s->sums);
        free(s->surv);
        free(s->hm);
        s->e = (float *)malloc(sizeof(float) * (size_t)V);
        s->keys = (uint32_t *)malloc(sizeof(uint32_t) * 2 * (size_t)V);
        s->idx = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)V);
        s->h = (int *)malloc(sizeof(int) * 4096);
        s->cv = (float *)malloc(sizeof(float) * ((size_t)V + 16));
        s->cid = (int64_t *)malloc(sizeof(int64_t) * (size_t)V);
        s->sums = (double *)malloc(sizeof(double) * ((size_t)V / CHUNK + 1));
        s->surv = (int32_t *)malloc(sizeof(int32_t) * ((size_t)V + 16));
        s->hm = (double *)malloc(sizeof(double) * 4 * NBIN);
        tls_scratch_v = V;
    }
    return s;
}

static int argmax_row(const float *x, int V) {
    int best = 0;
    float bv = x[0];
    for (int i = 1; i < V; i++)
        if (x[i] > bv || (bv != bv && x[i] == x[i])) {
            bv = x[i];
            best = i;
        }
    return best;
}

/* Sum of the positive values of e [V] (removed tokens are negative) in sixteen double lanes
 * per chunk (the same order in every build; float lanes put the draw's cumulative sums ~1e-8
 * off, as much as a 1e-6 change of the logits moves them, and a batched row drew another token
 * than the same row alone); the chunk sums go to sums [V / CHUNK + 1] when given, the count
 * of kept tokens (e >= 0) to *kept. */
static double positive_sum(const float *e, int V, double *sums, int *kept) {
    double s = 0.0;
    int n = 0;
    for (int c = 0, c0 = 0; c0 < V; c++, c0 += CHUNK) {
        int c1 = c0 + CHUNK < V ? c0 + CHUNK : V;
        double ls[LANES] = {0};
        int i = c0;
#if defined(__AVX512F__)
        __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
        for (; i + LANES <= c1; i += LANES) {
            __m512 v = _mm512_loadu_ps(e + i);
            __m512 pos = _mm512_maskz_mov_ps(
                _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ), v);
            a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(pos)));
            a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_castpd_ps(
                                       _mm512_extractf64x4_pd(_mm512_castps_pd(pos), 1))));
            n += __builtin_popcount(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GE_OQ));
        }
        _mm512_storeu_pd(ls, a0);
        _mm512_storeu_pd(ls + 8, a1);
#elif defined(__AVX2__)
        __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                        _mm256_setzero_pd()};
        __m256 z = _mm256_setzero_ps();
        for (; i + LANES <= c1; i += LANES)
            for (int h = 0; h < 2; h++) {
                __m256 v = _mm256_loadu_ps(e + i + 8 * h);
                __m256 pos = _mm256_and_ps(v, _mm256_cmp_ps(v, z, _CMP_GT_OQ));
                a[2 * h] = _mm256_add_pd(a[2 * h], _mm256_cvtps_pd(_mm256_castps256_ps128(pos)));
                a[2 * h + 1] = _mm256_add_pd(a[2 * h + 1],
                                             _mm256_cvtps_pd(_mm256_extractf128_ps(pos, 1)));
                n += __builtin_popcount(_mm256_movemask_ps(_mm256_cmp_ps(v, z, _CMP_GE_OQ)));
            }
        for (int h = 0; h < 4; h++) _mm256_storeu_pd(ls + 4 * h, a[h]);
#else
        for (; i + LANES <= c1; i += LANES)
            for (int j = 0; j < LANES; j++) {
                float v = e[i + j];
                ls[j] += v > 0.f ? (double)v : 0.0;
                n += v >= 0.f;
            }
#endif
        for (; i < c1; i++) {
            ls[0] += e[i] > 0.f ? (double)e[i] : 0.0;
            n += e[i] >= 0.f;
        }
        double cs = 0.0;
        for (int j = 0; j < LANES; j++) cs += ls[j];
        if (sums) sums[c] = cs;
        s += cs;
    }
    if (kept) *kept = n;
    return s;
}

/* The nucleus of e [V] (removed tokens negative) under top_p, as _top_p_keep decides it: the
 * kept tokens best first (ties by ascending id), rank j > 0 dropped once the mass from j down,
 * 1 - (the mass above j) / S, is <= limit = 1 - top_p in float32. Returns whether it drops
 * any, with the last kept token's e and id in *e_b, *id_b (0: all kept, the two unset).
 *
 * Without ranking the vocabulary: every token below t = limit * S / (2V) is dropped (the mass
 * from the first of them down is at most V t, half the limit), so only the tokens at or
 * above t count ("survivors": a few dozen of 49,152 at temperature 0.7, a median fifth at
 * 1.2). They are binned by their top twelve bits (1/8 of an octave a bin), each bin's
 * float64 mass summed; the walk down the bins stops at the first whose mass reaches the
 * limit, and only that bin's tokens (tens to hundreds) are sorted to find the rank. Ranking
 * the candidates in tiers of 256, 4096 and 16,384 instead cost a row at temperature 1.2 a
 * median 170 us a step (its nucleus passed 4,096 tokens a third of the steps: a sort of the
 * whole row); now 14 us (1.0: 12, 0.7: 2; 32 steps of a comparison's logits, one thread).
 * The float64 additions come in another order than the sorted one (as they do in torch's
 * cumulative sum). */

static inline int mass_bin(float v) {
    union { float f; uint32_t u; } c = {v};
    uint32_t b = c.u >> 20;
    return b < NBIN - 1 ? (int)b : NBIN - 1;
}

/* Stable sort of (keys, idx) [n] by keys ascending, the keys equal in bits 24-31 (one mass
 * bin's); returns the array (idx or idx2) that holds the order. */
static int32_t *sort_low24(uint32_t *keys, int32_t *idx, uint32_t *keys2, int32_t *idx2, int n) {
    if (n > 32) return radix_sort(keys, idx, keys2, idx2, n, 24);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && keys[j - 1] > keys[j]; j--) {
            uint32_t tk = keys[j]; keys[j] = keys[j - 1]; keys[j - 1] = tk;
            int32_t ti = idx[j]; idx[j] = idx[j - 1]; idx[j - 1] = ti;
        }
    return idx;
}

static int nucleus(const float *e, int V, double S, float limit, struct sample_scratch *s,
                   float *e_b, int64_t *id_b) {
    double inv = 1.0 / S;
    float t = (float)(0.5 * (double)limit * S / (double)V);
    /* the survivors' values (cv) and ids (surv), a vector's packed at once where AVX-512 can
     * (a loop over its set bits mispredicted its exit at most vectors: at temperature 1.2
     * the survivors took 11 us, now 5) */
    int32_t *surv = s->surv;
    float *sv = s->cv;
    int n = 0, i = 0;
#if defined(__AVX512F__)
    __m512 vt = _mm512_set1_ps(t);
    __m512i id = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 16 <= V; i += 16, id = _mm512_add_epi32(id, _mm512_set1_epi32(16))) {
        __m512 v = _mm512_loadu_ps(e + i);
        __mmask16 m = _mm512_cmp_ps_mask(v, vt, _CMP_GE_OQ);
        if (m) { /* (most vectors have none at a low temperature, most have some at 1.2:
                  * without the branch, a row at 0.7 took 1.7 -> 7.7 us here) */
            _mm512_storeu_ps(sv + n, _mm512_maskz_compress_ps(m, v));
            _mm512_storeu_si512((void *)(surv + n), _mm512_maskz_compress_epi32(m, id));
            n += __builtin_popcount(m);
        }
    }
#elif defined(__AVX2__)
    __m256 vt = _mm256_set1_ps(t);
    for (; i + 8 <= V; i += 8)
        for (uint32_t m = (uint32_t)_mm256_movemask_ps(
                 _mm256_cmp_ps(_mm256_loadu_ps(e + i), vt, _CMP_GE_OQ));
             m; m &= m - 1) {
            sv[n] = e[i + __builtin_ctz(m)];
            surv[n++] = i + __builtin_ctz(m);
        }
#endif
    for (; i < V; i++)
        if (e[i] >= t) {
            sv[n] = e[i];
            surv[n++] = i;
        }
    /* masses by bin (a bin holds a survivor when its mass is positive: survivors are >= t >
     * 0), in two copies (even and odd survivors) so that neighbours in one bin do not wait on
     * each other's store; the copies join in a fixed order */
    int lo = mass_bin(t); /* no survivor lies in a bin below t's */
    double *hm = s->hm;
    for (int c = 0; c < 4; c++) memset(hm + c * NBIN + lo, 0, sizeof(double) * (NBIN - lo));
    int q = 0;
    for (; q + 4 <= n; q += 4) {
        int b0 = mass_bin(sv[q]), b1 = mass_bin(sv[q + 1]), b2 = mass_bin(sv[q + 2]),
            b3 = mass_bin(sv[q + 3]);
        hm[b0] += sv[q];
        hm[NBIN + b1] += sv[q + 1];
        hm[2 * NBIN + b2] += sv[q + 2];
        hm[3 * NBIN + b3] += sv[q + 3];
    }
    for (; q < n; q++) hm[mass_bin(sv[q])] += sv[q];
    int lowest = NBIN;
    for (int b = lo; b < NBIN; b++) {
        hm[b] += hm[NBIN + b] + (hm[2 * NBIN + b] + hm[3 * NBIN + b]);
        lowest = hm[b] > 0.0 && b < lowest ? b : lowest;
    }
    /* the bin holding the last kept token: the first whose mass reaches the limit, else the
     * lowest (the rank after every survivor is dropped) */
    double above = 0.0, above_b = 0.0;
    int bin = -1, b = NBIN - 1;
    for (; b >= lo; b--) {
        if (!(hm[b] > 0.0)) continue;
        bin = b;
        above_b = above;
        if ((float)(1.0 - (above + hm[b]) * inv) <= limit) break;
        above += hm[b];
    }
    if (bin < 0 || (b < lo && n == V)) return 0;
    uint32_t *keys = s->keys, *keys2 = s->keys + V;
    int32_t *idx = s->idx, *idx2 = s->idx + V;
    int m = 0;
    int r = 0;
#if defined(__AVX512F__)
    __m512i want = _mm512_set1_epi32(bin);
    for (; r + 16 <= n; r += 16) { /* (one bin of thousands of survivors: a vector at a time) */
        __m512i bits = _mm512_loadu_si512((const void *)(sv + r));
        __mmask16 in = _mm512_cmpeq_epi32_mask(_mm512_srli_epi32(bits, 20), want);
        if (!in) continue;
        _mm512_storeu_si512((void *)(keys + m), _mm512_maskz_compress_epi32(
            in, _mm512_xor_si512(_mm512_or_si512(bits, _mm512_set1_epi32((int)0x80000000u)),
                                 _mm512_set1_epi32(-1))));
        _mm512_storeu_si512((void *)(idx + m), _mm512_maskz_compress_epi32(
            in, _mm512_loadu_si512((const void *)(surv + r))));
        m += __builtin_popcount(in);
    }
#endif
    for (; r < n; r++)
        if (mass_bin(sv[r]) == bin) {
            keys[m] = ~order_key(sv[r]); /* ascending ~key = descending value, ids in order */
            idx[m++] = surv[r];
        }
    idx = sort_low24(keys, idx, keys2, idx2, m);
    above = above_b;
    for (int r = 0; r < m; r++) {
        if (r > 0 && (float)(1.0 - above * inv) <= limit) {
            *e_b = e[idx[r - 1]];
            *id_b = idx[r - 1];
            return 1;
        }
        above += e[idx[r]];
    }
    *e_b = e[idx[m - 1]];
    *id_b = idx[m - 1];
    return !(n == V && bin == lowest); /* (all kept: the last survivor is the last token) */
}

/* e = pre / T (an IEEE division, as torch's); returns the largest (NaN never). */
static float scaled_max(const float *pre, int V, float T, float *e) {
    float m = -INFINITY;
    int i = 0;
#if defined(__AVX512F__)
    __m512 vt = _mm512_set1_ps(T), vm = _mm512_set1_ps(-INFINITY);
    for (; i + 16 <= V; i += 16) {
        __m512 v = _mm512_div_ps(_mm512_loadu_ps(pre + i), vt);
        _mm512_storeu_ps(e + i, v);
        vm = _mm512_max_ps(v, vm); /* v > m ? v : m, as below */
    }
    m = _mm512_reduce_max_ps(vm);
#elif defined(__AVX2__)
    __m256 vt = _mm256_set1_ps(T), vm = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= V; i += 8) {
        __m256 v = _mm256_div_ps(_mm256_loadu_ps(pre + i), vt);
        _mm256_storeu_ps(e + i, v);
        vm = _mm256_max_ps(v, vm);
    }
    float l[8];
    _mm256_storeu_ps(l, vm);
    for (int j = 0; j < 8; j++) m = l[j] > m ? l[j] : m;
#endif
    for (; i < V; i++) {
        e[i] = pre[i] / T;
        m = e[i] > m ? e[i] : m;
    }
    return m;
}

/* e = exp(e - m) (fast_exp: the same bits in every build) where e >= thr, else -1. */
static void exp_kept(float *e, int V, float m, float thr) {
    int i = 0;
#if defined(__AVX512F__)
    __m512 vm = _mm512_set1_ps(m), vthr = _mm512_set1_ps(thr), out = _mm512_set1_ps(-1.f);
    for (; i + 16 <= V; i += 16) {
        __m512 x = _mm512_loadu_ps(e + i), d = _mm512_sub_ps(x, vm);
        __mmask16 keep = _mm512_cmp_ps_mask(x, vthr, _CMP_GE_OQ)
                         & _mm512_cmp_ps_mask(d, _mm512_set1_ps(-INFINITY), _CMP_GT_OQ);
        _mm512_storeu_ps(e + i, _mm512_mask_mov_ps(out, keep, fast_exp16(d)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 vm = _mm256_set1_ps(m), vthr = _mm256_set1_ps(thr), out = _mm256_set1_ps(-1.f);
    for (; i + 8 <= V; i += 8) {
        __m256 x = _mm256_loadu_ps(e + i), d = _mm256_sub_ps(x, vm);
        __m256 keep = _mm256_and_ps(_mm256_cmp_ps(x, vthr, _CMP_GE_OQ),
                                    _mm256_cmp_ps(d, _mm256_set1_ps(-INFINITY), _CMP_GT_OQ));
        _mm256_storeu_ps(e + i, _mm256_blendv_ps(out, fast_exp8(d), keep));
    }
#endif
    for (; i < V; i++) {
        float d = e[i] - m;
        float x = fast_exp(d);
        e[i] = e[i] >= thr && d > -INFINITY ? x : -1.f;
    }
}

/* Top-p's cut: kept tokens (e >= 0) after the last kept one (e_b, id_b) in the candidates'
 * order (value descending, id ascending) get -2. */
static void drop_below(float *e, int V, float e_b, int id_b) {
    int i = 0;
#if defined(__AVX512F__)
    __m512 vb = _mm512_set1_ps(e_b), out = _mm512_set1_ps(-2.f);
    __m512i id = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i ib = _mm512_set1_epi32(id_b);
    for (; i + 16 <= V; i += 16, id = _mm512_add_epi32(id, _mm512_set1_epi32(16))) {
        __m512 v = _mm512_loadu_ps(e + i);
        __mmask16 kept = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GE_OQ);
        __mmask16 after = _mm512_cmp_ps_mask(v, vb, _CMP_LT_OQ)
                          | (_mm512_cmp_ps_mask(v, vb, _CMP_EQ_OQ)
                             & _mm512_cmpgt_epi32_mask(id, ib));
        _mm512_storeu_ps(e + i, _mm512_mask_mov_ps(v, kept & after, out));
    }
#endif
    for (; i < V; i++)
        e[i] = e[i] >= 0.f && (e[i] < e_b || (e[i] == e_b && i > id_b)) ? -2.f : e[i];
}

static void sample_row(const float *raw, const float *pre, int V, float T, int64_t top_k,
                       float top_p, float min_p, int greedy, double u, int k,
                       struct sample_scratch *s, float *out) {
    int64_t c;
    if (greedy) {
        c = argmax_row(pre, V);
        stats_row(raw, V, &c, k, 0.f, out);
        greedy_columns(out, k, c, CUT_GREEDY);
        return;
    }
    float *e = s->e;
    float m = scaled_max(pre, V, T, e);
    /* top-k: the k-th largest, ties kept */
    float thr_k = -INFINITY;
    if (top_k > 0 && top_k < V) {
        topk_many_row(e, V, (int)top_k, s->cv, s->cid, s->keys, s->idx, s->keys + V,
                      s->idx + V, s->h);
        thr_k = s->cv[top_k - 1];
    }
    int filtered = thr_k > -INFINITY;
    exp_kept(e, V, m, thr_k);
    /* top-p, then min-p (the best token's e is 1): the dropped get -2 and -3 */
    if (top_p < 1.f) {
        float e_b;
        int64_t id_b;
        if (nucleus(e, V, positive_sum(e, V, NULL, NULL), 1.f - top_p, s, &e_b, &id_b)) {
            filtered = 1;
            drop_below(e, V, e_b, (int)id_b);
        }
    }
    if (min_p > 0.f) {
        filtered = 1;
        for (int i = 0; i < V; i++) e[i] = e[i] >= 0.f && e[i] < min_p ? -3.f : e[i];
    }
    /* the draw: the first kept token whose cumulative e (chunk sums, then within the chunk in
     * order) passes u times their sum */
    int kept;
    double *sums = s->sums;
    double S = positive_sum(e, V, sums, &kept);
    double point = u * S, below = nextafter(S, 0.0);
    point = point < below ? point : below;
    double cum = 0.0;
    c = -1;
    for (int ch = 0, c0 = 0; c0 < V && c < 0; ch++, c0 += CHUNK) {
        int c1 = c0 + CHUNK < V ? c0 + CHUNK : V;
        if (cum + sums[ch] <= point && c1 < V) {
            cum += sums[ch];
            continue;
        }
        int last = -1;
        for (int i = c0; i < c1; i++) {
            if (e[i] <= 0.f) continue;
            last = i;
            cum += e[i];
            if (cum > point) break;
        }
        c = last; /* (the chunk's last positive token where rounding left the point past it) */
    }
    if (c < 0) c = argmax_row(pre, V); /* (nothing kept: cannot happen, the best is kept) */
    stats_row(raw, V, &c, k, 0.f, out);
    float *g = out + 3 + 2 * k;
    g[0] = (float)(e[c] / S);
    g[1] = filtered ? (float)kept : (float)V;
    for (int j = 0; j < k; j++) {
        float ea = e[(int)out[3 + j]];
        g[2 + j] = ea >= 0.f ? (float)(ea / S) : 0.f;
        g[2 + k + j] = ea >= 0.f ? 0.f : ea == -1.f ? CUT_TOP_K : ea == -2.f ? CUT_TOP_P
                                                                               : CUT_MIN_P;
    }
}

/* A row's expected cost, for the order rows are handed out in: a greedy row is two passes;
 * a sampled row's top-p nucleus, the costly part, widens with its temperature. */
static float row_cost(float temperature, float top_p, int greedy) {
    if (greedy) return -1.f;
    return top_p < 1.f ? temperature : 0.f;
}

void sample_f32(const float *raw, const float *pre, int B, int V, const float *temperature,
                const int64_t *top_k, const float *top_p, const float *min_p,
                const uint8_t *greedy, const double *u, int k, float *out, int ld,
                int threads) {
    if (threads < 1) threads = 1;
    /* Rows one at a time as threads ask, the costliest first: a row's cost depends on its
     * nucleus (of a comparison's rows, one at temperature 1.2 sorts thousands of candidates,
     * 264 us a step, one at 0.4 a few, 85 us). In fixed halves, or in row order when the
     * costly row comes last, one thread waited on the other: 4 rows (temperatures 0.7, 1.0,
     * 0.4, 1.2) took 362 us a step, where their work on two threads is about 290. */
    int order[64];
    int n = B < 64 ? B : 64;
    for (int i = 0; i < n; i++) {
        int j = i;
        float c = row_cost(temperature[i], top_p[i], greedy[i]);
        for (; j > 0 && row_cost(temperature[order[j - 1]], top_p[order[j - 1]],
                                 greedy[order[j - 1]]) < c; j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    #pragma omp parallel num_threads(threads) if (B > 1 && threads > 1)
    {
        struct sample_scratch *s = thread_scratch(V);
        #pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < B; i++) {
            int b = i < n ? order[i] : i;
            sample_row(raw + (size_t)b * V, pre + (size_t)b * V, V, temperature[b], top_k[b],
                       top_p[b], min_p[b], greedy[b], u[b], k, s, out + (size_t)b * ld);
        }
    }
}
