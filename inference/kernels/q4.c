/* chatui's CPU int4 matmul, in the blocks of GGUF's 4-bit types: weights as 4-bit values q in
 * 0..15 in groups of 32 along K, each row and group with an fp16 scale d and an fp16 min m,
 * w = q * d + m (Q4_1's formula; Q4_0 is m = -8 d, exact; Q4_K's sub-blocks are d = d * sc and
 * m = -dmin * mn rounded to fp16). Activations are quantized on the fly to int8 per group of 32
 * (symmetric, as llama.cpp's Q8 activations): at 4 bits the weights' rounding dominates, so
 * int8 costs nothing measurable in top-1 agreement (inference/quality.py) and lets one
 * unsigned-by-signed byte multiply-add (vpdpbusd, or vpmaddubsw on AVX2) do four products.
 * Per row and group: y += d * xd * sum(q * xq) + m * xd * sum(xq), which is the dot product of
 * the dequantized weights with the quantized activations. (With the exact sum(x) in the min's
 * term instead, the activations' rounding meets q * d, which is offset by -m from the weight,
 * not the weight itself: top-1 agreement on the default model fell from 97.8 % to 92.5 %.)
 *
 * Packed weight layout, for row block b (16 rows), group g, pair p (0..3): 64 bytes, byte i
 * (row r = i / 4, j = i % 4) holds
 *   low nibble  = q[16b + r, 32g + 8p + j],  high nibble = q[16b + r, 32g + 8p + 4 + j]
 * so one 64-byte load gives, after a mask and a shift, two registers of 16 rows x 4 columns:
 * lane r of a dword multiply-add is row r, and no horizontal sums are needed (as in q8.c).
 * AVX2 reads the two 32-byte halves (rows 0..7, rows 8..15) separately.
 * Scales: [N/16, G, 2, 16] fp16: the 16 rows' d, then their m. 5 bits a weight in all (Q4_1's
 * size; Q4_K_M's average is about 4.8).
 * Built with the other kernels by inference/q8kernel.py.
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
#define GBYTES (GS * RB / 2) /* packed bytes of one row block and group */

/* x [K] -> xq [G*32] int8 in -127..127, xd [G] its scales and xsum [G] the sums of the groups'
 * quantized values (xd * sum(xq); zeros past K). */
static void quantize_row_i8(const float *x, int K, int G, int8_t *xq, float *xd, float *xsum) {
    for (int g = 0; g < G; g++) {
        float amax = 0.f;
        for (int k = 0; k < GS; k++) {
            int kk = g * GS + k;
            float v = kk < K ? fabsf(x[kk]) : 0.f;
            amax = v > amax ? v : amax;
        }
        float inv = amax > 0.f ? 127.f / amax : 0.f;
        int32_t isum = 0;
        xd[g] = amax / 127.f;
        for (int k = 0; k < GS; k++) {
            int kk = g * GS + k;
            float v = kk < K ? x[kk] * inv : 0.f;
            xq[g * GS + k] = (int8_t)lrintf(v);
            isum += xq[g * GS + k];
        }
        xsum[g] = (float)isum * xd[g];
    }
}

static inline void block_generic(const int8_t *xq, const float *xd, const float *xs, int M, int G,
                                 const uint8_t *wb, const uint16_t *sb, float *out) {
    for (int m = 0; m < M; m++)
        for (int r = 0; r < RB; r++) out[m * RB + r] = 0.f;
    for (int g = 0; g < G; g++) {
        const uint8_t *wg = wb + (size_t)g * GBYTES;
        const uint16_t *sg = sb + (size_t)g * 2 * RB;
        for (int m = 0; m < M; m++) {
            const int8_t *x = xq + (size_t)m * G * GS + g * GS;
            int32_t d[RB] = {0};
            for (int p = 0; p < 4; p++)
                for (int r = 0; r < RB; r++)
                    for (int j = 0; j < 4; j++) {
                        uint8_t v = wg[p * 64 + r * 4 + j];
                        d[r] += (v & 15) * x[8 * p + j] + (v >> 4) * x[8 * p + 4 + j];
                    }
            float sx = xd[(size_t)m * G + g], sum = xs[(size_t)m * G + g];
            for (int r = 0; r < RB; r++)
                out[m * RB + r] += (float)d[r] * half_to_float(sg[r]) * sx
                                   + half_to_float(sg[RB + r]) * sum;
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
static void block_avx512(const int8_t *xq, const float *xd, const float *xs, int M, int G,
                         const uint8_t *wb, const uint16_t *sb, float *out) {
    const __m512i low = _mm512_set1_epi8(0x0f);
    __m512 acc[MB];
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (int g = 0; g < G; g++) {
        const uint8_t *wg = wb + (size_t)g * GBYTES;
        __m512i w[8]; /* w[2p]: columns 8p..8p+3 of the 16 rows, w[2p + 1]: 8p+4..8p+7 */
        for (int p = 0; p < 4; p++) {
            __m512i v = _mm512_loadu_si512((const void *)(wg + p * 64));
            w[2 * p] = _mm512_and_si512(v, low);
            w[2 * p + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        __m512 sd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + g * 2 * RB)));
        __m512 sm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + g * 2 * RB + RB)));
        for (int m = 0; m < M; m++) {
            const int32_t *x = (const int32_t *)(xq + (size_t)m * G * GS + g * GS);
            __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
            for (int t = 0; t < 8; t += 2) {
                d0 = _mm512_dpbusd_epi32(d0, w[t], _mm512_set1_epi32(x[t]));
                d1 = _mm512_dpbusd_epi32(d1, w[t + 1], _mm512_set1_epi32(x[t + 1]));
            }
            size_t i = (size_t)m * G + g;
            __m512 s = _mm512_mul_ps(sd, _mm512_set1_ps(xd[i]));
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0, d1)), s, acc[m]);
            acc[m] = _mm512_fmadd_ps(sm, _mm512_set1_ps(xs[i]), acc[m]);
        }
    }
    for (int m = 0; m < M; m++) _mm512_storeu_ps(out + m * RB, acc[m]);
}
#define BLOCK block_avx512
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
/* No byte dot product here: vpmaddubsw gives int16 sums of two products (at most
 * 2 * 15 * 127 = 3810), eight of them add up to at most 30480 without overflowing int16, so a
 * group's 32 columns take one vpmaddwd to int32. */
static void block_avx2(const int8_t *xq, const float *xd, const float *xs, int M, int G,
                       const uint8_t *wb, const uint16_t *sb, float *out) {
    const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc[MB][2];
    for (int m = 0; m < M; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int g = 0; g < G; g++) {
        const uint8_t *wg = wb + (size_t)g * GBYTES;
        const uint16_t *sg = sb + (size_t)g * 2 * RB;
        for (int h = 0; h < 2; h++) { /* rows 8h .. 8h + 7 */
            __m256i w[8];
            for (int p = 0; p < 4; p++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(wg + p * 64 + h * 32));
                w[2 * p] = _mm256_and_si256(v, low);
                w[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            }
            __m256 sd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sg + 8 * h)));
            __m256 sm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sg + RB + 8 * h)));
            for (int m = 0; m < M; m++) {
                const int32_t *x = (const int32_t *)(xq + (size_t)m * G * GS + g * GS);
                __m256i s16 = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(x[0]));
                for (int t = 1; t < 8; t++)
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[t], _mm256_set1_epi32(x[t])));
                __m256i d = _mm256_madd_epi16(s16, ones);
                size_t i = (size_t)m * G + g;
                __m256 s = _mm256_mul_ps(sd, _mm256_set1_ps(xd[i]));
                acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), s, acc[m][h]);
                acc[m][h] = _mm256_fmadd_ps(sm, _mm256_set1_ps(xs[i]), acc[m][h]);
            }
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

const char *q4_isa(void) {
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
    return "avx512-vnni";
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    return "avx2";
#else
    return "generic";
#endif
}

/* y [M, N] = f(x) [M, K] (fp32) times the packed int4 weight's transpose, f given by mode as in
 * q8_matmul (x's rows hold 2K values in mode 2). */
void q4_matmul(const float *x, int M, int K, const uint8_t *wp, const uint16_t *sp, int N, float *y,
               int threads, int mode, const float *aux, float eps) {
    int G = (K + GS - 1) / GS, NB = (N + RB - 1) / RB;
    int8_t *xq = (int8_t *)aligned_alloc(64, (((size_t)M * G * GS + 63) / 64) * 64);
    float *xd = (float *)malloc(sizeof(float) * (size_t)M * G);
    float *xs = (float *)malloc(sizeof(float) * (size_t)M * G);
    size_t ldx = mode >= 2 ? 2 * (size_t)K : (size_t)K;
    if (threads < 1) threads = 1;
    #pragma omp parallel num_threads(threads) if (M > 4)
    {
        float *row = (float *)malloc(sizeof(float) * (size_t)K);
        #pragma omp for schedule(static)
        for (int m = 0; m < M; m++) {
            prepare_row(x + (size_t)m * ldx, K, mode, aux, eps, row);
            quantize_row_i8(row, K, G, xq + (size_t)m * G * GS, xd + (size_t)m * G,
                            xs + (size_t)m * G);
        }
        free(row);
    }
    /* One contiguous range of row blocks a thread (see q8_matmul; the default model's shapes
     * at --quantize int4, 30 layers from memory, 2 threads, medians of 5 interleaved
     * rounds: 1 / 4 / 8 rows 3.28 / 4.95 / 6.44 -> 2.43 / 3.83 / 5.29 ms against chunks
     * handed out as threads asked; q6.c's 49,152 x 576 about as much quicker). */
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < NB; b++) {
        float out[MB * RB];
        for (int m0 = 0; m0 < M; m0 += MB) {
            int mm = M - m0 < MB ? M - m0 : MB;
            BLOCK(xq + (size_t)m0 * G * GS, xd + (size_t)m0 * G, xs + (size_t)m0 * G, mm, G,
                  wp + (size_t)b * G * GBYTES, sp + (size_t)b * G * 2 * RB, out);
            int n0 = b * RB, cnt = N - n0 < RB ? N - n0 : RB;
            for (int i = 0; i < mm; i++)
                memcpy(y + (size_t)(m0 + i) * N + n0, out + i * RB, sizeof(float) * cnt);
        }
    }
    free(xq);
    free(xd);
    free(xs);
}

/* q8_matmul_sel for int4 weights (packed nibbles and scales of q4_matmul). Each of x's
 * R = ceil(P / xdiv) rows is quantized once, not once per product: a mixture's gate/up call
 * (xdiv = top_k) quantizes the token's row once for its k experts. The products are grouped
 * by weight (a batch's rows that chose the same expert) and each group's rows, up to MB at a
 * time, go through the multi-row block: an expert is read once per step, not once per row
 * that chose it (each row's result is the same, bit for bit, as alone). */
void q4_matmul_sel(int P, const float *x, int xdiv, int K, const uint8_t *const *wp,
                   const uint16_t *const *sp, const int64_t *sel, int N, float *y, int threads,
                   int mode) {
    int G = (K + GS - 1) / GS, NB = (N + RB - 1) / RB;
    if (xdiv < 1) xdiv = 1;
    int R = (P + xdiv - 1) / xdiv;
    int8_t *xq = (int8_t *)aligned_alloc(64, (((size_t)R * G * GS + 63) / 64) * 64);
    float *xd = (float *)malloc(sizeof(float) * (size_t)R * G);
    float *xs = (float *)malloc(sizeof(float) * (size_t)R * G);
    /* The products in order of their weight (stable), then runs of at most MB of one weight. */
    int *order = (int *)malloc(sizeof(int) * (size_t)P);
    int *run = (int *)malloc(sizeof(int) * ((size_t)P + 1));
    int8_t *gq = (int8_t *)aligned_alloc(64, (((size_t)P * G * GS + 63) / 64) * 64);
    float *gd = (float *)malloc(sizeof(float) * (size_t)P * G);
    float *gs = (float *)malloc(sizeof(float) * (size_t)P * G);
    for (int p = 0; p < P; p++) {
        int i = p;
        while (i > 0 && sel[order[i - 1]] > sel[p]) {
            order[i] = order[i - 1];
            i--;
        }
        order[i] = p;
    }
    int runs = 0;
    for (int i = 0; i < P; i++)
        if (i == 0 || sel[order[i]] != sel[order[i - 1]] || i - run[runs - 1] == MB)
            run[runs++] = i;
    run[runs] = P;
    size_t ldx = mode >= 2 ? 2 * (size_t)K : (size_t)K;
    if (threads < 1) threads = 1;
    int total = runs * NB;
    int chunk = total / (threads * 8);
    chunk = chunk < 1 ? 1 : chunk > 16 ? 16 : chunk;
    #pragma omp parallel num_threads(threads)
    {
        float *row = (float *)malloc(sizeof(float) * (size_t)K);
        #pragma omp for schedule(static)
        for (int r = 0; r < R; r++) {
            prepare_row(x + (size_t)r * ldx, K, mode, NULL, 0.f, row);
            quantize_row_i8(row, K, G, xq + (size_t)r * G * GS, xd + (size_t)r * G,
                            xs + (size_t)r * G);
        }
        free(row);
        if (runs < P) { /* the rows in the grouped order (every thread takes this branch or none) */
            #pragma omp for schedule(static)
            for (int i = 0; i < P; i++) {
                int r = order[i] / xdiv;
                memcpy(gq + (size_t)i * G * GS, xq + (size_t)r * G * GS, (size_t)G * GS);
                memcpy(gd + (size_t)i * G, xd + (size_t)r * G, sizeof(float) * G);
                memcpy(gs + (size_t)i * G, xs + (size_t)r * G, sizeof(float) * G);
            }
        }
        #pragma omp for schedule(dynamic, chunk)
        for (int t = 0; t < total; t++) {
            int j = t / NB, b = t % NB, i0 = run[j], mm = run[j + 1] - i0;
            float out[MB * RB];
            const uint8_t *w = wp[sel[order[i0]]];
            const uint16_t *s = sp[sel[order[i0]]];
            /* Every product its own expert (a single token's): the rows as quantized, and the
             * block inlined for M = 1 (a variable M measured up to 10 % slower here) */
            if (runs == P) {
                int r = order[i0] / xdiv;
                BLOCK(xq + (size_t)r * G * GS, xd + (size_t)r * G, xs + (size_t)r * G, 1, G,
                      w + (size_t)b * G * GBYTES, s + (size_t)b * G * 2 * RB, out);
            } else
                BLOCK(gq + (size_t)i0 * G * GS, gd + (size_t)i0 * G, gs + (size_t)i0 * G, mm,
                      G, w + (size_t)b * G * GBYTES, s + (size_t)b * G * 2 * RB, out);
            int n0 = b * RB, cnt = N - n0 < RB ? N - n0 : RB;
            for (int i = 0; i < mm; i++)
                memcpy(y + (size_t)order[i0 + i] * N + n0, out + i * RB, sizeof(float) * cnt);
        }
    }
    free(xq);
    free(xd);
    free(xs);
    free(order);
    free(run);
    free(gq);
    free(gd);
    free(gs);
}
