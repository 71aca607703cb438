/* chatui's CPU int8 matmul: weights as int8 in groups of 32 along K with one fp16 scale per
 * row and group; activations quantized on the fly to int16 in the same groups (precise enough
 * that top-1 agreement with fp32 stays where fp32 activations put it); exact integer dot
 * products per group, fp32 accumulation across groups.
 *
 * Packed weight layout, for row block b (16 rows), group g, pair t (0..15):
 *   32 bytes = for r in 0..15: w[16b + r, 32g + 2t], w[16b + r, 32g + 2t + 1]
 * so one 16-lane multiply-add of int16 pairs into int32 (vpdpwssd, or vpmaddwd on AVX2)
 * advances 16 rows by two columns; after 16 of them lane r holds row r's integer dot product
 * over group g, and no horizontal sums are needed. Scales: [N/16, G, 16] fp16 (as llama.cpp's
 * Q8_0 blocks keep them: 6% of the bytes read, not 12.5%).
 * Built at run time by inference/q8kernel.py with the machine's C compiler (-march=native) and
 * OpenMP; loaded after torch, so it shares torch's OpenMP runtime.
 */
#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include <string.h>
#include <stdlib.h>

#include "chatui_kernels.h"
#include "rowprep.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define GS 32
#define RB 16
#define MB 8 /* activation rows handled together */

/* One whole group of 32 with SIMD, bit for bit the scalar loop below (the same float
 * operations; lrintf and vcvtps2dq both round to nearest even): the scalar loop's lrintf is a
 * call a value, 0.9 ms of an 8-row default-model step (about a million values) against
 * 0.1 ms. Returns 0 where there is no SIMD code. */
static inline int quantize_group(const float *x, int16_t *xq, float *xs) {
#if defined(__AVX512F__)
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    float inv = amax > 0.f ? 32767.f / amax : 0.f;
    *xs = amax / 32767.f;
    __m512 vi = _mm512_set1_ps(inv);
    _mm256_storeu_si256((__m256i *)xq,
                        _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(a, vi))));
    _mm256_storeu_si256((__m256i *)(xq + 16),
                        _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(b, vi))));
    return 1;
#elif defined(__AVX2__)
    __m256 v[4], sign = _mm256_set1_ps(-0.0f), m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float amax = _mm_cvtss_f32(h);
    float inv = amax > 0.f ? 32767.f / amax : 0.f;
    *xs = amax / 32767.f;
    __m256 vi = _mm256_set1_ps(inv);
    for (int i = 0; i < 4; i += 2) {
        __m256i p = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[i], vi)),
                                       _mm256_cvtps_epi32(_mm256_mul_ps(v[i + 1], vi)));
        _mm256_storeu_si256((__m256i *)(xq + 8 * i), _mm256_permute4x64_epi64(p, 0xD8));
    }
    return 1;
#else
    (void)x, (void)xq, (void)xs;
    return 0;
#endif
}

/* x [K] -> xq [G*32] int16 and xs [G] fp32 (groups of 32, symmetric, round to nearest). */
static void quantize_row(const float *x, int K, int G, int16_t *xq, float *xs) {
    for (int g = 0; g < G; g++) {
        if ((g + 1) * GS <= K && quantize_group(x + g * GS, xq + g * GS, xs + g))
            continue;
        float amax = 0.f;
        for (int k = 0; k < GS; k++) {
            int kk = g * GS + k;
            float v = kk < K ? fabsf(x[kk]) : 0.f;
            amax = v > amax ? v : amax;
        }
        float s = amax / 32767.f;
        float inv = amax > 0.f ? 32767.f / amax : 0.f;
        xs[g] = s;
        for (int k = 0; k < GS; k++) {
            int kk = g * GS + k;
            float v = kk < K ? x[kk] * inv : 0.f;
            xq[g * GS + k] = (int16_t)lrintf(v);
        }
    }
}

static inline void block_generic(const int16_t *xq, const float *xs, int M, int G, const int8_t *wb,
                          const uint16_t *sb, float *acc /* [M][16] */) {
    for (int m = 0; m < M; m++)
        for (int r = 0; r < RB; r++) acc[m * RB + r] = 0.f;
    for (int g = 0; g < G; g++) {
        const int8_t *wg = wb + (size_t)g * GS * RB;
        for (int m = 0; m < M; m++) {
            const int16_t *x = xq + (size_t)m * G * GS + g * GS;
            int32_t d[RB] = {0};
            for (int t = 0; t < GS / 2; t++)
                for (int r = 0; r < RB; r++)
                    d[r] += wg[t * 32 + 2 * r] * x[2 * t] + wg[t * 32 + 2 * r + 1] * x[2 * t + 1];
            float sx = xs[(size_t)m * G + g];
            for (int r = 0; r < RB; r++) acc[m * RB + r] += (float)d[r] * half_to_float(sb[g * RB + r]) * sx;
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
/* R activation rows (4 <= R <= 8, a constant once inlined) against one row block: each
 * weight vector is widened once and multiplied into the R rows' accumulators in turn, so R
 * independent chains of multiply-adds are in flight (block_avx512 runs a row's 16 for a group
 * before the next row's: two chains of 8, each waiting on the multiply-add's latency unless
 * the scheduler reaches the next row), and the weights four groups (2 KB) ahead are fetched
 * (block_avx512 fetched the next block's same group for 4 rows and more: 8 rows' matmuls
 * 20.8 -> 16.8 ms on one core then). The integer sums are exact and each group's float operations
 * are block_avx512's, so the bits are the same. The default model's int8 matmuls of one
 * step (30 layers and the output layer, 2 threads, random weights from memory, medians of
 * 30 interleaved runs): 4 rows 7.14 -> 6.48 ms, 8 rows 9.17 -> 8.32 ms, one row (unchanged
 * code) 5.96 ms. */
static inline __attribute__((always_inline)) void rows_avx512(const int16_t *xq, const float *xs,
                                                              int G, const int8_t *wb,
                                                              const uint16_t *sb, float *out,
                                                              const int R) {
    __m512 acc[MB];
    for (int i = 0; i < R; i++) acc[i] = _mm512_setzero_ps();
    for (int g = 0; g < G; g++) {
        const int8_t *wg = wb + (size_t)g * GS * RB;
        for (int l = 0; l < GS * RB; l += 64)
            _mm_prefetch((const char *)(wg + (size_t)4 * GS * RB + l), _MM_HINT_T0);
        __m512i d[MB];
        const int32_t *x[MB]; /* each row's group as int16 pairs */
        for (int i = 0; i < R; i++) {
            d[i] = _mm512_setzero_si512();
            x[i] = (const int32_t *)(xq + (size_t)i * G * GS + g * GS);
        }
        for (int t = 0; t < 16; t++) {
            __m512i wt = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wg + t * 32)));
            for (int i = 0; i < R; i++)
                d[i] = _mm512_dpwssd_epi32(d[i], wt, _mm512_set1_epi32(x[i][t]));
        }
        __m512 sw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + g * RB)));
        for (int i = 0; i < R; i++) {
            __m512 s = _mm512_mul_ps(sw, _mm512_set1_ps(xs[(size_t)i * G + g]));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[i]), s, acc[i]);
        }
    }
    for (int i = 0; i < R; i++) _mm512_storeu_ps(out + i * RB, acc[i]);
}

/* 1 to 3 rows (rows_avx512 takes 4 to 8): each row's 16 multiply-adds of a group in turn, no
 * software prefetch (it only ever ran for 4 rows and more). */
static void block_avx512(const int16_t *xq, const float *xs, int M, int G, const int8_t *wb,
                         const uint16_t *sb, float *out) {
    __m512 acc[MB];
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (int g = 0; g < G; g++) {
        const int8_t *wg = wb + (size_t)g * GS * RB;
        __m512i w[16];
        for (int t = 0; t < 16; t++)
            w[t] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wg + t * 32)));
        __m512 sw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + g * RB)));
        for (int m = 0; m < M; m++) {
            const int32_t *x = (const int32_t *)(xq + (size_t)m * G * GS + g * GS);
            __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
            for (int t = 0; t < 16; t += 2) {
                d0 = _mm512_dpwssd_epi32(d0, w[t], _mm512_set1_epi32(x[t]));
                d1 = _mm512_dpwssd_epi32(d1, w[t + 1], _mm512_set1_epi32(x[t + 1]));
            }
            __m512 s = _mm512_mul_ps(sw, _mm512_set1_ps(xs[(size_t)m * G + g]));
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0, d1)), s, acc[m]);
        }
    }
    for (int m = 0; m < M; m++) _mm512_storeu_ps(out + m * RB, acc[m]);
}
#define BLOCK block_avx512
#elif defined(__AVX2__) && defined(__F16C__)
/* R activation rows (R <= 4, a constant once inlined) against one group: each pair of weight
 * vectors is widened once for the R rows instead of once a row (the weights of a group do not
 * fit AVX2's 16 registers, so they are widened as they stream); a row's integer sums and float
 * operations are those of the single-row case. */
static inline __attribute__((always_inline)) void rows_avx2(const int8_t *wg, __m256 sw0,
                                                            __m256 sw1, const int16_t *xq,
                                                            const float *xs, int G, int g,
                                                            __m256 (*acc)[2], const int R) {
    __m256i d0[4], d1[4];
    const int32_t *x[4];
    for (int i = 0; i < R; i++) {
        d0[i] = d1[i] = _mm256_setzero_si256();
        x[i] = (const int32_t *)(xq + (size_t)i * G * GS + g * GS);
    }
    for (int t = 0; t < 16; t++) {
        __m256i wt = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wg + t * 32)));
        __m256i wu = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wg + t * 32 + 16)));
        for (int i = 0; i < R; i++) {
            __m256i xb = _mm256_set1_epi32(x[i][t]);
            d0[i] = _mm256_add_epi32(d0[i], _mm256_madd_epi16(wt, xb));
            d1[i] = _mm256_add_epi32(d1[i], _mm256_madd_epi16(wu, xb));
        }
    }
    for (int i = 0; i < R; i++) {
        __m256 sx = _mm256_set1_ps(xs[(size_t)i * G + g]);
        acc[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0[i]), _mm256_mul_ps(sw0, sx), acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1[i]), _mm256_mul_ps(sw1, sx), acc[i][1]);
    }
}

static void block_avx2(const int16_t *xq, const float *xs, int M, int G, const int8_t *wb,
                       const uint16_t *sb, float *out) {
    __m256 acc[MB][2];
    for (int m = 0; m < M; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int g = 0; g < G; g++) {
        const int8_t *wg = wb + (size_t)g * GS * RB;
        __m256 sw0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + g * RB)));
        __m256 sw1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + g * RB + 8)));
        int m = 0;
        for (; m + 4 <= M; m += 4)
            rows_avx2(wg, sw0, sw1, xq + (size_t)m * G * GS, xs + (size_t)m * G, G, g, acc + m, 4);
        switch (M - m) {
        case 3: rows_avx2(wg, sw0, sw1, xq + (size_t)m * G * GS, xs + (size_t)m * G, G, g, acc + m, 3); break;
        case 2: rows_avx2(wg, sw0, sw1, xq + (size_t)m * G * GS, xs + (size_t)m * G, G, g, acc + m, 2); break;
        case 1: rows_avx2(wg, sw0, sw1, xq + (size_t)m * G * GS, xs + (size_t)m * G, G, g, acc + m, 1); break;
        default: break;
        }
    }
    for (int m = 0; m < M; m++) {
        _mm256_storeu_ps(out + m * RB, acc[m][0]);
        _mm256_storeu_ps(out + m * RB + 8, acc[m][1]);
    }
}
#define BLOCK block_avx2
#else
#define BLOCK block_generic
#endif

int q8_group_size(void) { return GS; }
int q8_row_block(void) { return RB; }

int q8_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

const char *q8_isa(void) {
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
    return "avx512-vnni";
#elif defined(__AVX2__) && defined(__F16C__)
    return "avx2";
#else
    return "generic";
#endif
}

/* y [M, N] = f(x) [M, K] (fp32) times the packed weight's transpose, f given by mode (see
 * prepare_row; x's rows hold 2K values in mode 2). */
void q8_matmul(const float *x, int M, int K, const int8_t *wp, const uint16_t *sp, int N, float *y,
               int threads, int mode, const float *aux, float eps) {
    int G = (K + GS - 1) / GS, NB = (N + RB - 1) / RB;
    int16_t *xq = (int16_t *)aligned_alloc(64, (((size_t)M * G * GS * 2 + 63) / 64) * 64);
    float *xs = (float *)malloc(sizeof(float) * (size_t)M * G);
    size_t ldx = mode >= 2 ? 2 * (size_t)K : (size_t)K;
    if (threads < 1) threads = 1;
    #pragma omp parallel num_threads(threads) if (M > 4)
    {
        float *row = (float *)malloc(sizeof(float) * (size_t)K);
        #pragma omp for schedule(static)
        for (int m = 0; m < M; m++) {
            prepare_row(x + (size_t)m * ldx, K, mode, aux, eps, row);
            quantize_row(row, K, G, xq + (size_t)m * G * GS, xs + (size_t)m * G);
        }
        free(row);
    }
    /* Blocks are handed out in small chunks as threads ask for them, not split in fixed
     * halves: when another process (the chat UI) preempts one of the engine's threads, the
     * others take over its share instead of waiting for it at the end of the matmul. */
    int chunk = NB / (threads * 8);
    chunk = chunk < 1 ? 1 : chunk > 16 ? 16 : chunk;
    #pragma omp parallel for num_threads(threads) schedule(dynamic, chunk)
    for (int b = 0; b < NB; b++) {
        float out[MB * RB];
        for (int m0 = 0; m0 < M; m0 += MB) {
            int mm = M - m0 < MB ? M - m0 : MB;
            const int16_t *bx = xq + (size_t)m0 * G * GS;
            const float *bs = xs + (size_t)m0 * G;
            const int8_t *bw = wp + (size_t)b * G * GS * RB;
            const uint16_t *bsc = sp + (size_t)b * G * RB;
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
            switch (mm) {
            case 8: rows_avx512(bx, bs, G, bw, bsc, out, 8); break;
            case 7: rows_avx512(bx, bs, G, bw, bsc, out, 7); break;
            case 6: rows_avx512(bx, bs, G, bw, bsc, out, 6); break;
            case 5: rows_avx512(bx, bs, G, bw, bsc, out, 5); break;
            case 4: rows_avx512(bx, bs, G, bw, bsc, out, 4); break;
            default: BLOCK(bx, bs, mm, G, bw, bsc, out);
            }
#else
            BLOCK(bx, bs, mm, G, bw, bsc, out);
#endif
            int n0 = b * RB, cnt = N - n0 < RB ? N - n0 : RB;
            for (int i = 0; i < mm; i++)
                memcpy(y + (size_t)(m0 + i) * N + n0, out + i * RB, sizeof(float) * cnt);
        }
    }
    free(xq);
    free(xs);
}

/* P independent one-row products in one parallel loop: y[p] [N] = f(x[p / xdiv]) W[sel[p]]^T,
 * W[e] being the e-th weight of wp / sp (all [N, K]), f given by mode as in q8_matmul (x's rows
 * hold 2K values in mode 2). A mixture of experts' decode step: the k experts a token chose run
 * as one loop over (expert, row block) pairs, with one thread team for all of them, instead of
 * k matmuls of a few hundred rows each (moe.c). */
void q8_matmul_sel(int P, const float *x, int xdiv, int K, const int8_t *const *wp,
                   const uint16_t *const *sp, const int64_t *sel, int N, float *y, int threads,
                   int mode) {
    int G = (K + GS - 1) / GS, NB = (N + RB - 1) / RB;
    int16_t *xq = (int16_t *)aligned_alloc(64, (((size_t)P * G * GS * 2 + 63) / 64) * 64);
    float *xs = (float *)malloc(sizeof(float) * (size_t)P * G);
    size_t ldx = mode >= 2 ? 2 * (size_t)K : (size_t)K;
    if (threads < 1) threads = 1;
    int total = P * NB;
    int chunk = total / (threads * 8);
    chunk = chunk < 1 ? 1 : chunk > 16 ? 16 : chunk;
    #pragma omp parallel num_threads(threads)
    {
        float *row = (float *)malloc(sizeof(float) * (size_t)K);
        #pragma omp for schedule(static)
        for (int p = 0; p < P; p++) {
            prepare_row(x + (size_t)(p / xdiv) * ldx, K, mode, NULL, 0.f, row);
            quantize_row(row, K, G, xq + (size_t)p * G * GS, xs + (size_t)p * G);
        }
        free(row);
        #pragma omp for schedule(dynamic, chunk)
        for (int i = 0; i < total; i++) {
            int p = i / NB, b = i % NB;
            float out[RB];
            const int8_t *w = wp[sel[p]];
            const uint16_t *s = sp[sel[p]];
            BLOCK(xq + (size_t)p * G * GS, xs + (size_t)p * G, 1, G,
                  w + (size_t)b * G * GS * RB, s + (size_t)b * G * RB, out);
            int n0 = b * RB, cnt = N - n0 < RB ? N - n0 : RB;
            memcpy(y + (size_t)p * N + n0, out, sizeof(float) * cnt);
        }
    }
    free(xq);
    free(xs);
}
