/* chatui's fp32 matrix-vector product for decode: y [M, N] = x [M, K] W [N, K]^T for a few rows
 * of x (M <= 8). A decode step is bound by reading W; torch's CPU GEMV reads the output layer at
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
#define MAXM 8 /* a comparison's or fan-out's rows (up to 8): each gets the bits it gets alone */

#if !defined(__AVX512F__)
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
#endif

#if defined(__AVX512F__)
/* y[m, n..n+R) for every m: R weight rows (4 up to 4 rows of x; 2 above, half the
 * accumulators 8 x 4 would take; 1 for the rows past the last whole step). 5-8 rows this way
 * against torch's GEMM (2 threads, the Intel Xeon of the README, 20 calls): the default
 * model's output layer (49,152 x 576) at 5 / 8 rows 5.52 / 7.29 ms against 6.43 / 9.74, its
 * 1536 x 576 and 576 x 1536 projections within 5% either way.
 * Each (m, n) is the same chain of fused multiply-adds and the same horizontal sum whatever R
 * and M, so a row of x batched gets the bits it gets alone (issue 18: a comparison's 5-8
 * columns in fp32 ran torch's GEMM, and on an Intel Xeon a sampled token of a column differed
 * from the same column run alone; the last rows of a task went to rows_generic, whose vector
 * sum gcc ordered by the pointers' alignment). */
static inline __attribute__((always_inline)) void rows_step(const float *x, int M, int K,
                                                             const float *w, int n, int N,
                                                             float *y, const int R) {
    const float *wr[ROWS];
    for (int r = 0; r < R; r++) wr[r] = w + (size_t)(n + r) * K;
    __m512 acc[MAXM][ROWS];
    for (int m = 0; m < M; m++)
        for (int r = 0; r < R; r++) acc[m][r] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 wv[ROWS];
        for (int r = 0; r < R; r++) wv[r] = _mm512_loadu_ps(wr[r] + k);
        for (int m = 0; m < M; m++) {
            __m512 xv = _mm512_loadu_ps(x + (size_t)m * K + k);
            for (int r = 0; r < R; r++) acc[m][r] = _mm512_fmadd_ps(wv[r], xv, acc[m][r]);
        }
    }
    if (k < K) {
        __mmask16 t = (__mmask16)((1u << (K - k)) - 1);
        __m512 wv[ROWS];
        for (int r = 0; r < R; r++) wv[r] = _mm512_maskz_loadu_ps(t, wr[r] + k);
        for (int m = 0; m < M; m++) {
            __m512 xv = _mm512_maskz_loadu_ps(t, x + (size_t)m * K + k);
            for (int r = 0; r < R; r++) acc[m][r] = _mm512_fmadd_ps(wv[r], xv, acc[m][r]);
        }
    }
    for (int m = 0; m < M; m++)
        for (int r = 0; r < R; r++) y[(size_t)m * N + n + r] = _mm512_reduce_add_ps(acc[m][r]);
}

static inline __attribute__((always_inline)) void rows_avx512(const float *x, int M, int K,
                                                               const float *w, int n0, int n1,
                                                               int N, float *y, const int R) {
    int n = n0;
    for (; n + R <= n1; n += R) rows_step(x, M, K, w, n, N, y, R);
    for (; n < n1; n++) rows_step(x, M, K, w, n, N, y, 1);
}
/* M == 1 (one row decoding) compiled on its own, its accumulators in registers */
static void rows_m1(const float *x, int M, int K, const float *w, int n0, int n1, int N,
                    float *y) {
    (void)M;
    rows_avx512(x, 1, K, w, n0, n1, N, y, ROWS);
}
static void rows_any(const float *x, int M, int K, const float *w, int n0, int n1, int N,
                     float *y) {
    rows_avx512(x, M, K, w, n0, n1, N, y, ROWS);
}
static void rows_wide(const float *x, int M, int K, const float *w, int n0, int n1, int N,
                      float *y) {
    rows_avx512(x, M, K, w, n0, n1, N, y, 2);
}
#define ROWS_FN(x, M, K, w, n0, n1, N, y) \
    ((M) == 1 ? rows_m1 : (M) <= ROWS ? rows_any : rows_wide)(x, M, K, w, n0, n1, N, y)
#else
#define ROWS_FN rows_generic
#endif

int f32_max_rows(void) { return MAXM; }

/* y [M, N] = x [M, K] W^T, W [N, K] row-major fp32, M <= MAXM. */
void f32_matvec(const float *x, int M, int K, const float *w, int N, float *y, int threads) {
    int blocks = (N + 63) / 64; /* 64 rows per task */
    if (threads < 1) threads = 1;
    #pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (blocks > 1)
    for (int b = 0; b < blocks; b++) {
        int n0 = b * 64, n1 = n0 + 64 < N ? n0 + 64 : N;
        ROWS_FN(x, M, K, w, n0, n1, N, y);
    }
}
