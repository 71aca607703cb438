/* chatui's CPU 6-bit matmul: the output layer under --quantize int4, in GGUF Q6_K's numbers.
 * A weight is w = d * sc * (q - 32): q in 0..63, sc an int8 scale per row and sub-block of 16
 * along K, d an fp16 scale per row and super-block of 256 (eight groups of 32). A Q6_K tensor
 * (what llama.cpp's Q4_K_M keeps its output layer in) is these three arrays as they are, so it
 * loads with no rounding at all; 6.5625 bits a weight, Q6_K's size, against int8's 8.5 (the
 * output layer was most of the bytes an int4 token read on the small-layer shapes, and a 4-bit
 * one cost 4 points of top-1 agreement on the default model).
 *
 * Activations are quantized to int8 per group of 32 as q4.c does (xd its scale). Per row,
 * group g and its sub-blocks s = 0, 1: y += d * xd * sum_s sc_s * (sum(q * xq) - 32 sum(xq))
 * over the sub-block's 16 columns, all integer up to the last product (|.| < 2^26).
 *
 * Packed layout, for row block b (16 rows) and group g: 416 bytes
 *   [0, 256)   the low 4 bits of q in q4.c's nibble layout: pair p (0..3), byte i (row
 *              r = i / 4, j = i % 4): low nibble column 8p + j, high nibble column 8p + 4 + j;
 *   [256, 384) the high 2 bits: half a (0, 1), byte i (r = i / 4, j = i % 4) holds at bits
 *              2u, 2u + 1 (u = 0..3) those of column 16a + 4u + j;
 *   [384, 416) sc as int8 [2 (sub-block), 16 (row)];
 * and the scales [N/16, ceil(G/8), 16] fp16: the rows' d for groups 8s .. 8s + 7. So the
 * 16 lanes of a dword multiply-add are the 16 rows, as in q8.c and q4.c: column t's four
 * values (4t .. 4t + 3) of every row are one register after a mask, two shifts and an or.
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
#define SUPER 8 /* groups of 32 per super-block (one d) */
#define Q6_GBYTES 416 /* packed bytes of one row block and group */
#define HI_OFF 256
#define SC_OFF 384

/* x [K] -> xq [G*32] int8, xd [G] its scales, xo [2G] 32 times each 16 values' sum of xq. */
static void quantize_row_q6(const float *x, int K, int G, int8_t *xq, float *xd, int32_t *xo) {
    for (int g = 0; g < G; g++) {
        float amax = 0.f;
        for (int k = 0; k < GS; k++) {
            int kk = g * GS + k;
            float v = kk < K ? fabsf(x[kk]) : 0.f;
            amax = v > amax ? v : amax;
        }
        float inv = amax > 0.f ? 127.f / amax : 0.f;
        xd[g] = amax / 127.f;
        int32_t sum[2] = {0, 0};
        for (int k = 0; k < GS; k++) {
            int kk = g * GS + k;
            float v = kk < K ? x[kk] * inv : 0.f;
            xq[g * GS + k] = (int8_t)lrintf(v);
            sum[k / 16] += xq[g * GS + k];
        }
        xo[2 * g] = 32 * sum[0];
        xo[2 * g + 1] = 32 * sum[1];
    }
}

static inline void block_generic(const int8_t *xq, const float *xd, const int32_t *xo, int M,
                                 int G, const uint8_t *wb, const uint16_t *sb, float *out) {
    for (int m = 0; m < M; m++)
        for (int r = 0; r < RB; r++) out[m * RB + r] = 0.f;
    for (int g = 0; g < G; g++) {
        const uint8_t *wg = wb + (size_t)g * Q6_GBYTES;
        const int8_t *sc = (const int8_t *)(wg + SC_OFF);
        const uint16_t *dg = sb + (size_t)(g / SUPER) * RB;
        for (int m = 0; m < M; m++) {
            const int8_t *x = xq + (size_t)m * G * GS + g * GS;
            int32_t dot[2][RB] = {{0}};
            for (int r = 0; r < RB; r++)
                for (int t = 0; t < 8; t++) /* columns 4t .. 4t + 3 */
                    for (int j = 0; j < 4; j++) {
                        uint8_t lo = wg[(t / 2) * 64 + r * 4 + j];
                        lo = t % 2 ? lo >> 4 : lo & 15;
                        uint8_t hi = (wg[HI_OFF + (t / 4) * 64 + r * 4 + j] >> (2 * (t % 4))) & 3;
                        dot[t / 4][r] += (int32_t)(lo | hi << 4) * x[4 * t + j];
                    }
            const int32_t *o = xo + (size_t)m * 2 * G + 2 * g;
            float sx = xd[(size_t)m * G + g];
            for (int r = 0; r < RB; r++) {
                int32_t v = sc[r] * (dot[0][r] - o[0]) + sc[RB + r] * (dot[1][r] - o[1]);
                out[m * RB + r] += (float)v * half_to_float(dg[r]) * sx;
            }
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
static void block_avx512(const int8_t *xq, const float *xd, const int32_t *xo, int M, int G,
                         const uint8_t *wb, const uint16_t *sb, float *out) {
    const __m512i low = _mm512_set1_epi8(0x0f), top = _mm512_set1_epi8(0x30);
    __m512 acc[MB];
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    __m512 dv = _mm512_setzero_ps();
    for (int g = 0; g < G; g++) {
        const uint8_t *wg = wb + (size_t)g * Q6_GBYTES;
        if (g % SUPER == 0)
            dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + (g / SUPER) * RB)));
        __m512i w[8]; /* w[t]: columns 4t .. 4t + 3 of the 16 rows, 0..63 */
        for (int a = 0; a < 2; a++) {
            __m512i h = _mm512_loadu_si512((const void *)(wg + HI_OFF + a * 64));
            for (int p = 2 * a; p < 2 * a + 2; p++) {
                __m512i v = _mm512_loadu_si512((const void *)(wg + p * 64));
                __m512i h0 = p % 2 ? _mm512_srli_epi16(h, 0) : _mm512_slli_epi16(h, 4);
                __m512i h1 = p % 2 ? _mm512_srli_epi16(h, 2) : _mm512_slli_epi16(h, 2);
                /* (v & 15) | (h << 4 - 2u & 0x30): one ternary op each */
                w[2 * p] = _mm512_or_si512(_mm512_and_si512(v, low), _mm512_and_si512(h0, top));
                w[2 * p + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low),
                                               _mm512_and_si512(h1, top));
            }
        }
        __m512i sc0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(wg + SC_OFF)));
        __m512i sc1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(wg + SC_OFF + 16)));
        for (int m = 0; m < M; m++) {
            const int32_t *x = (const int32_t *)(xq + (size_t)m * G * GS + g * GS);
            const int32_t *o = xo + (size_t)m * 2 * G + 2 * g;
            __m512i d0 = _mm512_set1_epi32(-o[0]), d1 = _mm512_set1_epi32(-o[1]);
            for (int t = 0; t < 4; t++) {
                d0 = _mm512_dpbusd_epi32(d0, w[t], _mm512_set1_epi32(x[t]));
                d1 = _mm512_dpbusd_epi32(d1, w[t + 4], _mm512_set1_epi32(x[t + 4]));
            }
            __m512i v = _mm512_add_epi32(_mm512_mullo_epi32(d0, sc0), _mm512_mullo_epi32(d1, sc1));
            __m512 s = _mm512_mul_ps(dv, _mm512_set1_ps(xd[(size_t)m * G + g]));
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), s, acc[m]);
        }
    }
    for (int m = 0; m < M; m++) _mm512_storeu_ps(out + m * RB, acc[m]);
}
#define BLOCK block_avx512
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
/* vpmaddubsw: int16 sums of two products, at most 2 * 63 * 127 = 16002; two of them still fit
 * int16, so a sub-block's four registers take two vpmaddwd to int32. */
static void block_avx2(const int8_t *xq, const float *xd, const int32_t *xo, int M, int G,
                       const uint8_t *wb, const uint16_t *sb, float *out) {
    const __m256i low = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi8(0x30);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[MB][2];
    for (int m = 0; m < M; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    __m256 dv[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int g = 0; g < G; g++) {
        const uint8_t *wg = wb + (size_t)g * Q6_GBYTES;
        if (g % SUPER == 0)
            for (int h = 0; h < 2; h++)
                dv[h] = _mm256_cvtph_ps(
                    _mm_loadu_si128((const __m128i *)(sb + (g / SUPER) * RB + 8 * h)));
        for (int h = 0; h < 2; h++) { /* rows 8h .. 8h + 7 */
            __m256i w[8];
            for (int a = 0; a < 2; a++) {
                __m256i hb = _mm256_loadu_si256((const __m256i *)(wg + HI_OFF + a * 64 + h * 32));
                for (int p = 2 * a; p < 2 * a + 2; p++) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(wg + p * 64 + h * 32));
                    __m256i h0 = p % 2 ? hb : _mm256_slli_epi16(hb, 4);
                    __m256i h1 = p % 2 ? _mm256_srli_epi16(hb, 2) : _mm256_slli_epi16(hb, 2);
                    w[2 * p] = _mm256_or_si256(_mm256_and_si256(v, low),
                                               _mm256_and_si256(h0, top));
                    w[2 * p + 1] = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(v, 4), low), _mm256_and_si256(h1, top));
                }
            }
            __m256i sc0 = _mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i *)(wg + SC_OFF + 8 * h)));
            __m256i sc1 = _mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i *)(wg + SC_OFF + 16 + 8 * h)));
            for (int m = 0; m < M; m++) {
                const int32_t *x = (const int32_t *)(xq + (size_t)m * G * GS + g * GS);
                const int32_t *o = xo + (size_t)m * 2 * G + 2 * g;
                __m256i d[2];
                for (int s = 0; s < 2; s++) {
                    __m256i a = _mm256_add_epi16(
                        _mm256_maddubs_epi16(w[4 * s], _mm256_set1_epi32(x[4 * s])),
                        _mm256_maddubs_epi16(w[4 * s + 1], _mm256_set1_epi32(x[4 * s + 1])));
                    __m256i b = _mm256_add_epi16(
                        _mm256_maddubs_epi16(w[4 * s + 2], _mm256_set1_epi32(x[4 * s + 2])),
                        _mm256_maddubs_epi16(w[4 * s + 3], _mm256_set1_epi32(x[4 * s + 3])));
                    d[s] = _mm256_sub_epi32(
                        _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones)),
                        _mm256_set1_epi32(o[s]));
                }
                __m256i v = _mm256_add_epi32(_mm256_mullo_epi32(d[0], sc0),
                                             _mm256_mullo_epi32(d[1], sc1));
                __m256 s = _mm256_mul_ps(dv[h], _mm256_set1_ps(xd[(size_t)m * G + g]));
                acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), s, acc[m][h]);
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

/* y [M, N] = f(x) [M, K] (fp32) times the packed 6-bit weight's transpose, f given by mode as
 * in q8_matmul. */
void q6_matmul(const float *x, int M, int K, const uint8_t *wp, const uint16_t *sp, int N, float *y,
               int threads, int mode, const float *aux, float eps) {
    int G = (K + GS - 1) / GS, NB = (N + RB - 1) / RB, S = (G + SUPER - 1) / SUPER;
    int8_t *xq = (int8_t *)aligned_alloc(64, (((size_t)M * G * GS + 63) / 64) * 64);
    float *xd = (float *)malloc(sizeof(float) * (size_t)M * G);
    int32_t *xo = (int32_t *)malloc(sizeof(int32_t) * (size_t)M * 2 * G);
    size_t ldx = mode == 2 ? 2 * (size_t)K : (size_t)K;
    if (threads < 1) threads = 1;
    #pragma omp parallel num_threads(threads) if (M > 4)
    {
        float *row = (float *)malloc(sizeof(float) * (size_t)K);
        #pragma omp for schedule(static)
        for (int m = 0; m < M; m++) {
            prepare_row(x + (size_t)m * ldx, K, mode, aux, eps, row);
            quantize_row_q6(row, K, G, xq + (size_t)m * G * GS, xd + (size_t)m * G,
                            xo + (size_t)m * 2 * G);
        }
        free(row);
    }
    /* One contiguous range of row blocks a thread (see q8_matmul and q4_matmul). */
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < NB; b++) {
        float out[MB * RB];
        for (int m0 = 0; m0 < M; m0 += MB) {
            int mm = M - m0 < MB ? M - m0 : MB;
            BLOCK(xq + (size_t)m0 * G * GS, xd + (size_t)m0 * G, xo + (size_t)m0 * 2 * G, mm, G,
                  wp + (size_t)b * G * Q6_GBYTES, sp + (size_t)b * S * RB, out);
            int n0 = b * RB, cnt = N - n0 < RB ? N - n0 : RB;
            for (int i = 0; i < mm; i++)
                memcpy(y + (size_t)(m0 + i) * N + n0, out + i * RB, sizeof(float) * cnt);
        }
    }
    free(xq);
    free(xd);
    free(xo);
}
