/* chatui's fp32 matrix-vector product for decode: y [M, N] = x [M, K] W [N, K]^T for a few rows
 * of x (M <= 4). A decode step is bound by reading W; torch's CPU GEMV reads the output layer at
 * about 15 GB/s on the machine this was written on, this loop streams four rows of W at a time
 * with one vector load and one FMA per 16 weights, over row blocks handed to threads as they ask.
 * The sum runs in a different order from torch's, so results differ in the last bits only.
 */
#include <stddef.h>

#include "chatui_kernels.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define ROWS 4
#define MAXM 4

static void rows_generic(const float *x, int M, int K, const float *w, int n0, int n1, int N,
                         float *y) {
    for (int n = n0; n < n1; n++) {
        const float *wr = w + (size_t)n * K;
        for (int m = 0; m < M; m++) {
            const float *xm = x + (size_t)m * K;
            float acc = 0.f;
            #pragma omp simd reduction(+ : acc)
            for (int k = 0; k < K; k++) acc += wr[k] * xm[k];
            y[(size_t)m * N + n] = acc;
        }
    }
}

#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void rows_avx512(const float *x, int M, int K,
                                                               const float *w, int n0, int n1,
                                                               int N, float *y) {
    int n = n0;
    for (; n + ROWS <= n1; n += ROWS) {
        const float *w0 = w + (size_t)n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        __m512 acc[MAXM][ROWS];
        for (int m = 0; m < M; m++)
            for (int r = 0; r < ROWS; r++) acc[m][r] = _mm512_setzero_ps();
        int k = 0;
        for (; k + 16 <= K; k += 16) {
            __m512 a = _mm512_loadu_ps(w0 + k), b = _mm512_loadu_ps(w1 + k);
            __m512 c = _mm512_loadu_ps(w2 + k), d = _mm512_loadu_ps(w3 + k);
            for (int m = 0; m < M; m++) {
                __m512 xv = _mm512_loadu_ps(x + (size_t)m * K + k);
                acc[m][0] = _mm512_fmadd_ps(a, xv, acc[m][0]);
                acc[m][1] = _mm512_fmadd_ps(b, xv, acc[m][1]);
                acc[m][2] = _mm512_fmadd_ps(c, xv, acc[m][2]);
                acc[m][3] = _mm512_fmadd_ps(d, xv, acc[m][3]);
            }
        }
        if (k < K) {
            __mmask16 t = (__mmask16)((1u << (K - k)) - 1);
            __m512 a = _mm512_maskz_loadu_ps(t, w0 + k), b = _mm512_maskz_loadu_ps(t, w1 + k);
            __m512 c = _mm512_maskz_loadu_ps(t, w2 + k), d = _mm512_maskz_loadu_ps(t, w3 + k);
            for (int m = 0; m < M; m++) {
                __m512 xv = _mm512_maskz_loadu_ps(t, x + (size_t)m * K + k);
                acc[m][0] = _mm512_fmadd_ps(a, xv, acc[m][0]);
                acc[m][1] = _mm512_fmadd_ps(b, xv, acc[m][1]);
                acc[m][2] = _mm512_fmadd_ps(c, xv, acc[m][2]);
                acc[m][3] = _mm512_fmadd_ps(d, xv, acc[m][3]);
            }
        }
        for (int m = 0; m < M; m++)
            for (int r = 0; r < ROWS; r++)
                y[(size_t)m * N + n + r] = _mm512_reduce_add_ps(acc[m][r]);
    }
    if (n < n1) rows_generic(x, M, K, w, n, n1, N, y);
}
/* M == 1 (one row decoding) compiled on its own, its accumulators in registers */
static void rows_m1(const float *x, int M, int K, const float *w, int n0, int n1, int N,
                    float *y) {
    (void)M;
    rows_avx512(x, 1, K, w, n0, n1, N, y);
}
static void rows_any(const float *x, int M, int K, const float *w, int n0, int n1, int N,
                     float *y) {
    rows_avx512(x, M, K, w, n0, n1, N, y);
}
#define ROWS_FN(x, M, K, w, n0, n1, N, y) \
    ((M) == 1 ? rows_m1 : rows_any)(x, M, K, w, n0, n1, N, y)
#else
#define ROWS_FN rows_generic
#endif

int f32_max_rows(void) { return MAXM; }

/* y [M, N] = x [M, K] W^T, W [N, K] row-major fp32, M <= 4. */
void f32_matvec(const float *x, int M, int K, const float *w, int N, float *y, int threads) {
    int blocks = (N + 63) / 64; /* 64 rows per task */
    if (threads < 1) threads = 1;
    #pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (blocks > 1)
    for (int b = 0; b < blocks; b++) {
        int n0 = b * 64, n1 = n0 + 64 < N ? n0 + 64 : N;
        ROWS_FN(x, M, K, w, n0, n1, N, y);
    }
}
