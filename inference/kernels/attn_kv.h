/* The cache-type-dependent part of attn.c, included there once per KV cache element type:
 * KV_T (float, or uint16_t holding IEEE fp16), KV_FN(name) (the instance's name for a function),
 * KV_LOAD16(p) (16 elements from p as an __m512, AVX-512 builds), KV_GET(p) (one element as a
 * float) and KV_PUT(p, v) (store float v, rounded to nearest even). Every function here does
 * its arithmetic in fp32 as before; only the cache's loads and stores differ. */
#if defined(__AVX512F__)

/* Eight keys' scores: eight dot products of D = 16 T, their horizontal sums reduced together
 * (one horizontal sum a key, as before, was most of this loop's time: 0.43 ms a row and step
 * at 8 rows of the default model). Every key's sum takes the same tree, whichever of the eight
 * slots it is in, so a score does not depend on where a call's keys begin (the shared prefix
 * splits a chunk in two calls). */
static inline __attribute__((always_inline)) void KV_FN(scores8)(const __m512 *qv,
                                                                 const KV_T *k, float *out,
                                                                 const int T) {
    __m512 a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm512_setzero_ps();
    for (int t = 0; t < T; t++)
        for (int j = 0; j < 8; j++)
            a[j] = _mm512_fmadd_ps(qv[t], KV_LOAD16(k + 16 * (j * T + t)), a[j]);
    sums8(a, out);
}

/* Eight keys' scores for Q (1..3) queries at once (out + ldo q): each key vector is converted
 * from the cache once for the Q queries instead of once a query (the fp16 conversion is two
 * micro-ops, as many as the multiply-adds it fed). Every score is scores8's: the same fused
 * multiply-adds in the same order and the same reduction tree, so the same bits. With the
 * masked tail of the exponentials and new_row's vector RoPE (issue 18's fifteenth pass), 30
 * layers' attention at a comparison's state (138 shared and 64 own keys, fp16 cache, hot,
 * 2 threads) at 1 / 4 / 8 rows 0.29 / 0.77 / 1.40 -> 0.25 / 0.63 / 1.11 ms. */
static inline __attribute__((always_inline)) void KV_FN(scores8_q)(const float *q, const KV_T *k,
                                                                   float *out, int ldo, const int T,
                                                                   const int Q) {
    __m512 a[3][8];
    for (int g = 0; g < Q; g++)
        for (int j = 0; j < 8; j++) a[g][j] = _mm512_setzero_ps();
    for (int t = 0; t < T; t++) {
        __m512 qv[3];
        for (int g = 0; g < Q; g++) qv[g] = _mm512_loadu_ps(q + (size_t)g * 16 * T + 16 * t);
        for (int j = 0; j < 8; j++) {
            __m512 kv = KV_LOAD16(k + 16 * (j * T + t));
            for (int g = 0; g < Q; g++) a[g][j] = _mm512_fmadd_ps(qv[g], kv, a[g][j]);
        }
    }
    for (int g = 0; g < Q; g++) sums8(a[g], out + (size_t)g * ldo);
}

/* pg[i] = q . K[i] for n keys, D = 16 T; the last n % 8 keys through a zero-padded copy. */
static inline __attribute__((always_inline)) void KV_FN(scores_t)(const float *q, const KV_T *K,
                                                                  int n, float *pg, const int T) {
    __m512 qv[8];
    for (int t = 0; t < T; t++) qv[t] = _mm512_loadu_ps(q + 16 * t);
    int i = 0;
    for (; i + 8 <= n; i += 8) KV_FN(scores8)(qv, K + (size_t)i * 16 * T, pg + i, T);
    if (i < n) {
        KV_T pad[8 * 128];
        float out[8];
        int rest = n - i;
        memcpy(pad, K + (size_t)i * 16 * T, sizeof(KV_T) * 16 * T * rest);
        memset(pad + 16 * T * rest, 0, sizeof(KV_T) * 16 * T * (8 - rest));
        KV_FN(scores8)(qv, pad, out, T);
        memcpy(pg + i, out, sizeof(float) * rest);
    }
}

/* scores_t for the G queries of one KV head (query g's scores at pg + ldp g): each block of
 * eight keys is loaded from the cache once and scored against every query while it is in
 * L1 (one query's pass over a 256-key chunk, 64 KB, read it back from L2 for the next query:
 * the loop waited on L2 at one cache line a multiply-add), and converted once for up to three
 * queries (scores8_q). Every score is scores8's, so the
 * same bits as scores_t query by query. The keys KEYS_AHEAD ahead are fetched, and the values
 * of the keys being scored (V, at the same first key) into L2 for the weighted sum after: a
 * profile of 8 rows had most of chunk_attend's time on the first loads of each key and value
 * row (a row's own 64 keys are 16 KB, too short a stream for the hardware's prefetcher to
 * get ahead). Decode steps at 4 / 8 rows (as q8.c's AHEAD measures them): 5.45 / 6.83 ->
 * 5.26 / 6.50 ms; with q8.c's non-temporal weights 4.69 / 5.92 -> 4.55 / 5.58 ms. */
static inline __attribute__((always_inline)) void KV_FN(scores_g)(const float *q, int G,
                                                                  const KV_T *K, int n, float *pg,
                                                                  int ldp, const int T,
                                                                  const KV_T *V) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int l = 0; l < 8 * 16 * T; l += 64 / (int)sizeof(KV_T)) {
            _mm_prefetch((const char *)(K + (size_t)(i + KEYS_AHEAD) * 16 * T + l), _MM_HINT_T0);
            _mm_prefetch((const char *)(V + (size_t)i * 16 * T + l), _MM_HINT_T1);
        }
        for (int g = 0; g < G; g += 3) {
            const float *qg = q + (size_t)g * 16 * T;
            const KV_T *kb = K + (size_t)i * 16 * T;
            float *og = pg + (size_t)g * ldp + i;
            if (G - g >= 3) KV_FN(scores8_q)(qg, kb, og, ldp, T, 3);
            else if (G - g == 2) KV_FN(scores8_q)(qg, kb, og, ldp, T, 2);
            else KV_FN(scores8_q)(qg, kb, og, ldp, T, 1);
        }
    }
    if (i < n)
        for (int g = 0; g < G; g++)
            KV_FN(scores_t)(q + (size_t)g * 16 * T, K + (size_t)i * 16 * T, n - i,
                            pg + (size_t)g * ldp + i, T);
}

/* o = sum_i pg[i] V[i] over n keys (added to o's values with `more`), D = 16 T, the output in
 * registers: two calls over [0, a) and [a, n) make the same fused multiply-adds as one. */
static inline __attribute__((always_inline)) void KV_FN(weighted_sum_t)(const float *pg,
                                                                        const KV_T *V, int n,
                                                                        float *o, int more,
                                                                        const int T) {
    __m512 acc[8];
    for (int t = 0; t < T; t++) acc[t] = more ? _mm512_loadu_ps(o + 16 * t) : _mm512_setzero_ps();
    for (int i = 0; i < n; i++) {
        __m512 p = _mm512_set1_ps(pg[i]);
        const KV_T *v = V + (size_t)i * 16 * T;
        for (int t = 0; t < T; t++) acc[t] = _mm512_fmadd_ps(p, KV_LOAD16(v + 16 * t), acc[t]);
    }
    for (int t = 0; t < T; t++) _mm512_storeu_ps(o + 16 * t, acc[t]);
}

/* weighted_sum_t for Q queries at once (rows pg + CHUNK q, outputs o + 16 T q): each value row
 * is loaded once for the Q queries, and their 4Q (T = 4) accumulators are independent chains
 * instead of one query's 4 waiting on each other's latency; every query's fused multiply-adds
 * are those of weighted_sum_t, in the same order. */
static inline __attribute__((always_inline)) void KV_FN(weighted_sum_q)(const float *pg, int ldp,
                                                                        const KV_T *V, int n,
                                                                        float *o, int more,
                                                                        const int T, const int Q) {
    __m512 acc[4][4];
    for (int q = 0; q < Q; q++)
        for (int t = 0; t < T; t++)
            acc[q][t] = more ? _mm512_loadu_ps(o + 16 * T * q + 16 * t) : _mm512_setzero_ps();
    for (int i = 0; i < n; i++) {
        const KV_T *v = V + (size_t)i * 16 * T;
        for (int t = 0; t < T; t++) {
            __m512 vt = KV_LOAD16(v + 16 * t);
            for (int q = 0; q < Q; q++)
                acc[q][t] = _mm512_fmadd_ps(_mm512_set1_ps(pg[(size_t)q * ldp + i]), vt, acc[q][t]);
        }
    }
    for (int q = 0; q < Q; q++)
        for (int t = 0; t < T; t++) _mm512_storeu_ps(o + 16 * T * q + 16 * t, acc[q][t]);
}
#endif

/* pg[i] = q . K[i] for n keys (K at the first key). */
static void KV_FN(scores)(const float *q, const KV_T *K, int n, int D, float *pg) {
#if defined(__AVX512F__)
    if (D == 64) { KV_FN(scores_t)(q, K, n, pg, 4); return; }
    if (D == 128) { KV_FN(scores_t)(q, K, n, pg, 8); return; }
#endif
    for (int i = 0; i < n; i++) {
        const KV_T *kr = K + (size_t)i * D;
        float a = 0.f;
        #pragma omp simd reduction(+ : a)
        for (int d = 0; d < D; d++) a += q[d] * KV_GET(kr + d);
        pg[i] = a;
    }
}

/* o = sum_i pg[i] V[i] for n keys (V at the first key), added to o with `more`. */
static void KV_FN(weighted_sum)(const float *pg, const KV_T *V, int n, int D, float *o,
                                int more) {
#if defined(__AVX512F__)
    if (D == 64) { KV_FN(weighted_sum_t)(pg, V, n, o, more, 4); return; }
    if (D == 128) { KV_FN(weighted_sum_t)(pg, V, n, o, more, 8); return; }
#endif
    if (!more)
        for (int d = 0; d < D; d++) o[d] = 0.f;
    for (int i = 0; i < n; i++) {
        float pk = pg[i];
        const KV_T *vr = V + (size_t)i * D;
        #pragma omp simd
        for (int d = 0; d < D; d++) o[d] += pk * KV_GET(vr + d);
    }
}

/* Attention of the G query heads sharing one KV head over keys [k0, k1): unnormalized output
 * acc[g][D], running max mx[g] and sum sm[g] (combined across chunks by the caller). Keys
 * below `shared` are read from Ks, Vs (row 0's), the others from K, V (the row's own): the
 * same values, so the same arithmetic in the same order. */
static void KV_FN(chunk_attend)(const float *q /* [G][D] scaled, rotated */, int G, int D,
                                const KV_T *Ks, const KV_T *Vs, int shared, const KV_T *K,
                                const KV_T *V, int k0, int k1, const uint8_t *m, int w,
                                float *acc, float *mx, float *sm, float *p /* [G][CHUNK] */) {
    int n = k1 - k0;
    int n0 = shared - k0 < 0 ? 0 : shared - k0 > n ? n : shared - k0;
    int together = 0; /* the G queries' scores computed key block by key block */
#if defined(__AVX512F__)
    if (D == 64 || D == 128) {
        int T = D / 16;
        if (n0) {
            if (T == 4) KV_FN(scores_g)(q, G, Ks + (size_t)k0 * D, n0, p, CHUNK, 4, Vs + (size_t)k0 * D);
            else KV_FN(scores_g)(q, G, Ks + (size_t)k0 * D, n0, p, CHUNK, 8, Vs + (size_t)k0 * D);
        }
        if (n0 < n) {
            const KV_T *Ko = K + (size_t)(k0 + n0) * D;
            const KV_T *Vo = V + (size_t)(k0 + n0) * D;
            if (T == 4) KV_FN(scores_g)(q, G, Ko, n - n0, p + n0, CHUNK, 4, Vo);
            else KV_FN(scores_g)(q, G, Ko, n - n0, p + n0, CHUNK, 8, Vo);
        }
        together = 1;
    }
#endif
    for (int g = 0; g < G; g++) {
        float *pg = p + (size_t)g * CHUNK;
        const float *qg = q + (size_t)g * D;
        float best = -INFINITY;
        if (n0 && !together) KV_FN(scores)(qg, Ks + (size_t)k0 * D, n0, D, pg);
        if (n0 < n && !together) KV_FN(scores)(qg, K + (size_t)(k0 + n0) * D, n - n0, D, pg + n0);
        if (m)
            for (int i = 0; i < n; i++)
                if (!m[k0 + i] && k0 + i != w) pg[i] = -INFINITY;
        int i0 = 0;
#if defined(__AVX512F__)
        if (n >= 16) { /* the maximum is exact in any order */
            __m512 vm = _mm512_set1_ps(-INFINITY);
            for (; i0 + 16 <= n; i0 += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(pg + i0));
            best = _mm512_reduce_max_ps(vm);
        }
#endif
        for (int i = i0; i < n; i++) best = pg[i] > best ? pg[i] : best;
        float sum = 0.f;
        if (best == -INFINITY) {
            for (int i = 0; i < n; i++) pg[i] = 0.f;
        } else {
            /* the exponentials in SIMD lanes (fast_exp16 / fast_exp8: fast_exp's bits; gcc
             * left this loop scalar, 40% of this function at 8 rows) */
            int i = 0;
#if defined(__AVX512F__)
            __m512 vb = _mm512_set1_ps(best), ninf = _mm512_set1_ps(-INFINITY);
            for (; i + 16 <= n; i += 16) {
                __m512 v = _mm512_loadu_ps(pg + i);
                __mmask16 live = _mm512_cmp_ps_mask(v, ninf, _CMP_NEQ_UQ);
                _mm512_storeu_ps(pg + i,
                                 _mm512_maskz_mov_ps(live, fast_exp16(_mm512_sub_ps(v, vb))));
            }
            if (i < n) { /* the last n % 16 keys in masked lanes (fast_exp16 is fast_exp lane
                          * by lane: the scalar loop's bits) */
                __mmask16 part = (__mmask16)((1u << (n - i)) - 1);
                __m512 v = _mm512_maskz_loadu_ps(part, pg + i);
                __mmask16 live = _mm512_mask_cmp_ps_mask(part, v, ninf, _CMP_NEQ_UQ);
                _mm512_mask_storeu_ps(pg + i, part,
                                      _mm512_maskz_mov_ps(live, fast_exp16(_mm512_sub_ps(v, vb))));
                i = n;
            }
#elif defined(__AVX2__) && defined(__FMA__)
            __m256 vb = _mm256_set1_ps(best), ninf = _mm256_set1_ps(-INFINITY);
            for (; i + 8 <= n; i += 8) {
                __m256 v = _mm256_loadu_ps(pg + i);
                __m256 live = _mm256_cmp_ps(v, ninf, _CMP_NEQ_UQ);
                _mm256_storeu_ps(pg + i, _mm256_and_ps(live, fast_exp8(_mm256_sub_ps(v, vb))));
            }
#endif
            for (; i < n; i++) pg[i] = pg[i] == -INFINITY ? 0.f : fast_exp(pg[i] - best);
            sum = sum_keys(pg, n);
        }
        mx[g] = best;
        sm[g] = sum;
    }
    int g = 0;
#if defined(__AVX512F__)
    if (D == 64) /* the queries' weighted sums four at a time (see weighted_sum_q) */
        while (G - g >= 2) {
            int Q = G - g >= 4 ? 4 : G - g;
            float *o = acc + (size_t)g * D;
            const float *pq = p + (size_t)g * CHUNK;
            for (int part = 0; part < 2; part++) {
                int a = part ? n0 : 0, len = part ? n - n0 : n0;
                const KV_T *Vp = (part ? V : Vs) + (size_t)(k0 + a) * D;
                if (!len) continue;
                int more = part && n0 > 0;
                if (Q == 4) KV_FN(weighted_sum_q)(pq + a, CHUNK, Vp, len, o, more, 4, 4);
                else if (Q == 3) KV_FN(weighted_sum_q)(pq + a, CHUNK, Vp, len, o, more, 4, 3);
                else KV_FN(weighted_sum_q)(pq + a, CHUNK, Vp, len, o, more, 4, 2);
            }
            g += Q;
        }
#endif
    for (; g < G; g++) {
        float *pg = p + (size_t)g * CHUNK;
        float *o = acc + (size_t)g * D;
        if (n0) KV_FN(weighted_sum)(pg, Vs + (size_t)k0 * D, n0, D, o, 0);
        if (n0 < n) KV_FN(weighted_sum)(pg + n0, V + (size_t)(k0 + n0) * D, n - n0, D, o, n0 > 0);
    }
}

/* D floats into the cache's row (rounded to nearest even where it holds fp16: vcvtps2ph and
 * KV_PUT round alike). */
static inline void KV_FN(store_row)(KV_T *dst, const float *src, int D) {
    int d = 0;
#if defined(__AVX512F__)
    for (; d + 16 <= D; d += 16) KV_STORE16(dst + d, _mm512_loadu_ps(src + d));
#endif
    for (; d < D; d++) KV_PUT(dst + d, src[d]);
}

/* Row b's new key and value of KV head j into the cache (the key rotated in fp32, kr [D]
 * scratch) and the queries of that head's G query heads rotated and scaled into qs. */
static void KV_FN(new_head)(const float *qkv, int b, int j, int H, int KV, int D, KV_T *kc,
                            KV_T *vc, int C, int w, const int64_t *pos, const float *cos_t,
                            const float *sin_t, float *qs, float *kr) {
    int half = D / 2, G = H / KV;
    size_t row = (size_t)(H + 2 * KV) * D;
    float scale = 1.0f / sqrtf((float)D);
    const float *c = cos_t + (size_t)pos[b] * half, *s = sin_t + (size_t)pos[b] * half;
    KV_T *kd = kc + (((size_t)b * KV + j) * C + w) * D;
    KV_T *vd = vc + (((size_t)b * KV + j) * C + w) * D;
    const float *ks = qkv + b * row + (size_t)(H + j) * D;
    const float *vs = qkv + b * row + (size_t)(H + KV + j) * D;
    memcpy(kr, ks, sizeof(float) * (size_t)D);
    rope(kr, c, s, half);
    KV_FN(store_row)(kd, kr, D);
    KV_FN(store_row)(vd, vs, D);
    for (int h = j * G; h < (j + 1) * G; h++) {
        float *qd = qs + ((size_t)b * H + h) * D;
        const float *src = qkv + b * row + (size_t)h * D;
        for (int d = 0; d < D; d++) qd[d] = src[d] * scale;
        rope(qd, c, s, half);
    }
}

/* Row b's new keys and values into the cache and its queries into qs (new_head of each KV
 * head). */
static void KV_FN(new_row)(const float *qkv, int b, int H, int KV, int D, KV_T *kc, KV_T *vc,
                           int C, int w, const int64_t *pos, const float *cos_t,
                           const float *sin_t, float *qs, float *kr) {
    for (int j = 0; j < KV; j++)
        KV_FN(new_head)(qkv, b, j, H, KV, D, kc, vc, C, w, pos, cos_t, sin_t, qs, kr);
}

/* Task t's own keys and values (its row's, past the shared prompt) fetched: the keys into L1,
 * the values into L2. Each decode step streams the model's weights between one visit of a
 * layer's cache and the next, so a row's own part comes from memory or L3, 16 KB a (row, KV
 * head) at 64 own keys of the default model: too short a stream for the hardware's
 * prefetcher, and KEYS_AHEAD inside the task starts only with its first keys. */
static void KV_FN(fetch_task)(int t, int B, int nc, int S, int shared, int KV, int C, int D,
                              const KV_T *kc, const KV_T *vc, const int *first_key) {
    int b = t % B, c = (t / B) % nc, j = t / (B * nc);
    int a0 = first_key[b] + c * CHUNK, a1 = a0 + CHUNK < S ? a0 + CHUNK : S;
    a0 = a0 > shared ? a0 : shared;
    if (a1 <= a0) return;
    size_t off = (((size_t)b * KV + j) * C + a0) * D, bytes = (size_t)(a1 - a0) * D * sizeof(KV_T);
    for (size_t l = 0; l < bytes; l += 64) {
        __builtin_prefetch((const char *)(kc + off) + l, 0, 3);
        __builtin_prefetch((const char *)(vc + off) + l, 0, 2);
    }
}

/* The output of row b's KV head j: its nc chunks' partial softmaxes combined. */
static void KV_FN(combine)(const float *part, int b, int j, int KV, int G, int D, int nc,
                           size_t per, float *out, int H) {
    for (int g = 0; g < G; g++) {
        float M = -INFINITY;
        for (int c = 0; c < nc; c++) {
            const float *pt = part + per * (((size_t)b * KV + j) * nc + c);
            float m = pt[(size_t)G * D + g];
            M = m > M ? m : M;
        }
        float *o = out + (size_t)b * H * D + (size_t)(j * G + g) * D;
        for (int d = 0; d < D; d++) o[d] = 0.f;
        float total = 0.f;
        for (int c = 0; c < nc; c++) {
            const float *pt = part + per * (((size_t)b * KV + j) * nc + c);
            float m = pt[(size_t)G * D + g];
            if (m == -INFINITY) continue;
            float f = fast_exp(m - M);
            total += f * pt[(size_t)G * D + G + g];
            for (int d = 0; d < D; d++) o[d] += f * pt[(size_t)g * D + d];
        }
        float inv = 1.0f / total;
        for (int d = 0; d < D; d++) o[d] *= inv;
    }
}

/* The new rows' keys, values and queries (new_row), attention in tasks of (row, KV head,
 * chunk of keys), then each (row, KV head)'s chunks combined (combine). With several rows the
 * first and the last run in the thread team too, one row and one (row, head) a thread at a
 * time: serial, they were about a fifth of attention's time at 8 rows, the other thread
 * waiting (a profile of an 8-row comparison: attn_decode's own time 2.6 % of the process's
 * samples, against 8.8 % for the attention itself). */
static void KV_FN(attend)(const float *qkv, int B, int H, int KV, int D, KV_T *kc, KV_T *vc,
                          int C, int w, const int64_t *pos, const float *cos_t,
                          const float *sin_t, const uint8_t *mask, int shared, float *out,
                          int threads) {
    int G = H / KV, S = w + 1;
    shared = shared < 0 ? 0 : shared > w ? w : shared;
    float *qs = (float *)malloc(sizeof(float) * (size_t)B * H * D);
    /* Each row's chunks of keys begin at its first attended key (0 without a mask): a
     * left-padded row of `chatui batch` then sums its keys in the lanes and chunks its prompt
     * alone (`chatui generate`) sums them in, and with int8's rounding answers the same
     * (its chunks began at slot 0, so the padding moved every key to another lane of
     * sum_keys and of the chunks' partial softmaxes: "Name three colors." answered
     * "1. Red..." in a batch, "The most obvious color..." alone, at temperature 0). */
    int *first_key = (int *)malloc(sizeof(int) * (size_t)B);
    int most = 0;
    for (int b = 0; b < B; b++) {
        int f = 0;
        if (mask)
            while (f < w && !mask[(size_t)b * S + f]) f++;
        first_key[b] = f;
        most = S - f > most ? S - f : most;
    }
    int nc = (most + CHUNK - 1) / CHUNK, tasks = B * KV * nc;
    /* One chunk of keys a row (up to CHUNK keys: a comparison's rows until their context
     * passes 256 tokens): each task is one (row, KV head), which makes that head's new key,
     * value and queries itself (new_head), attends and finishes its output (combine), so the
     * team meets only at its end. Otherwise the rows' new keys and values first and the
     * chunks combined after, a barrier between each. */
    int single = nc == 1;
    size_t per = (size_t)G * (D + 2);
    float *part = (float *)malloc(sizeof(float) * per * tasks);
    if (threads < 1) threads = 1;
    if (!single && B == 1) { /* (one row: before the team, with no barrier after it) */
        float *kr = (float *)malloc(sizeof(float) * (size_t)D);
        KV_FN(new_row)(qkv, 0, H, KV, D, kc, vc, C, w, pos, cos_t, sin_t, qs, kr);
        free(kr);
    }
    #pragma omp parallel num_threads(threads) if (tasks > 1)
    {
    if (!single && B > 1) {
        float *kr = (float *)malloc(sizeof(float) * (size_t)D); /* a new key, rotated in fp32 */
        #pragma omp for schedule(static)
        for (int b = 0; b < B; b++)
            KV_FN(new_row)(qkv, b, H, KV, D, kc, vc, C, w, pos, cos_t, sin_t, qs, kr);
        free(kr);
    }
    float *scratch = (float *)malloc(sizeof(float) * (size_t)G * CHUNK);
    float *kr = (float *)malloc(sizeof(float) * (size_t)D);
    /* Each thread takes one contiguous range of tasks, so that it knows its next one and
     * fetches that task's own keys and values while it computes this one (fetch_task). Handed
     * out one at a time (OpenMP's dynamic schedule) before issue 18's tenth pass: 30 layers at
     * a comparison's state (138-token shared prompt, 64 own tokens a row, 2 threads, medians
     * of 6 interleaved rounds) at 1 / 4 / 8 rows 2.08 / 2.95 / 4.14 -> 1.98 / 2.91 / 3.93 ms. */
    int t_lo, t_hi;
    team_range(tasks, &t_lo, &t_hi);
    if (t_lo < t_hi) KV_FN(fetch_task)(t_lo, B, nc, S, shared, KV, C, D, kc, vc, first_key);
    for (int t = t_lo; t < t_hi; t++) {
        if (t + 1 < t_hi) KV_FN(fetch_task)(t + 1, B, nc, S, shared, KV, C, D, kc, vc, first_key);
        /* rows vary fastest: the B tasks of one chunk run back to back, its shared part hot */
        int b = t % B, c = (t / B) % nc, j = t / (B * nc);
        int k0 = first_key[b] + c * CHUNK, k1 = k0 + CHUNK < S ? k0 + CHUNK : S;
        float *pt = part + per * (((size_t)b * KV + j) * nc + c);
        if (single)
            KV_FN(new_head)(qkv, b, j, H, KV, D, kc, vc, C, w, pos, cos_t, sin_t, qs, kr);
        if (k0 >= S) { /* (a row with fewer keys than the longest: no chunk here) */
            for (int g = 0; g < G; g++) pt[(size_t)G * D + g] = -INFINITY;
            continue;
        }
        size_t own = ((size_t)b * KV + j) * C * D, first = (size_t)j * C * D;
        KV_FN(chunk_attend)(qs + ((size_t)b * H + (size_t)j * G) * D, G, D, kc + first,
                            vc + first, shared, kc + own, vc + own, k0, k1,
                            mask ? mask + (size_t)b * S : NULL, w, pt, pt + (size_t)G * D,
                            pt + (size_t)G * D + G, scratch);
        if (single) KV_FN(combine)(part, b, j, KV, G, D, nc, per, out, H);
    }
    free(kr);
    free(scratch);
    if (!single) {
        #pragma omp barrier
        #pragma omp for schedule(static) nowait
        for (int bj = 0; bj < B * KV; bj++)
            KV_FN(combine)(part, bj / KV, bj % KV, KV, G, D, nc, per, out, H);
    }
    }
    free(part);
    free(qs);
    free(first_key);
}

/* A prefill's attention: T new tokens of one sequence at positions start..start+T-1. Each
 * token's key and value go into the cache and its queries are rotated and scaled as a decode
 * step's are (new_row, the same bits: a token's key is the same whether a prefill or a step
 * wrote it), then each token attends causally to keys 0..its position in tasks of (token, KV
 * head), each over chunks of CHUNK keys from key 0 (chunk_attend) combined as a decode step's
 * are (combine): a token's output is the one a decode step at its position gives, to the bit,
 * however the prompt was cut into prefill calls. qkv: [T, (H + 2 KV) * D] as attn_decode's;
 * kc, vc: [KV, C, D] (one row's cache); cos_t, sin_t: RoPE tables; out: [T, H * D]. Torch's
 * scaled_dot_product_attention, with the RoPE and the cache writes in torch, took 0.6-0.8 ms a
 * layer for a 138-token prompt of the default model (2 threads), a fifth of the prefill. */
static void KV_FN(prefill)(const float *qkv, int T, int H, int KV, int D, KV_T *kc, KV_T *vc,
                           int C, int start, const float *cos_t, const float *sin_t, float *out,
                           int threads) {
    int G = H / KV, most = (start + T + CHUNK - 1) / CHUNK;
    size_t per = (size_t)G * (D + 2), row = (size_t)(H + 2 * KV) * D;
    float *qs = (float *)malloc(sizeof(float) * (size_t)T * H * D);
    if (threads < 1) threads = 1;
    #pragma omp parallel num_threads(threads) if (T * KV > 1)
    {
    float *kr = (float *)malloc(sizeof(float) * (size_t)D);
    #pragma omp for schedule(static)
    for (int t = 0; t < T; t++) {
        int64_t p = start + t;
        KV_FN(new_row)(qkv + (size_t)t * row, 0, H, KV, D, kc, vc, C, (int)p, &p, cos_t, sin_t,
                       qs + (size_t)t * H * D, kr);
    }
    free(kr);
    float *scratch = (float *)malloc(sizeof(float) * (size_t)G * CHUNK);
    float *part = (float *)malloc(sizeof(float) * per * (size_t)most);
    /* the longest first, handed out a few at a time: the tasks' lengths grow with the token */
    #pragma omp for schedule(dynamic, 4)
    for (int i = 0; i < T * KV; i++) {
        int t = T - 1 - i / KV, j = i % KV, S = start + t + 1, nc = (S + CHUNK - 1) / CHUNK;
        const KV_T *K = kc + (size_t)j * C * D, *V = vc + (size_t)j * C * D;
        const float *qt = qs + ((size_t)t * H + (size_t)j * G) * D;
        for (int c = 0; c < nc; c++) {
            int k0 = c * CHUNK, k1 = k0 + CHUNK < S ? k0 + CHUNK : S;
            float *pt = part + per * c;
            KV_FN(chunk_attend)(qt, G, D, K, V, 0, K, V, k0, k1, NULL, 0, pt,
                                pt + (size_t)G * D, pt + (size_t)G * D + G, scratch);
        }
        KV_FN(combine)(part, 0, 0, 1, G, D, nc, per,
                       out + (size_t)t * H * D + (size_t)j * G * D, H);
    }
    free(part);
    free(scratch);
    }
    free(qs);
}
