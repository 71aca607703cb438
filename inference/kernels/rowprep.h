/* Pieces the int8 (q8.c) and int4 (q4.c) matmuls share: fp16 scales to float for the portable
 * code, and the fused input transforms (RMS norm, SwiGLU) applied to each row of x before it is
 * quantized. Static inline, so each kernel file gets its own copy compiled for its loops. */
#ifndef CHATUI_ROWPREP_H
#define CHATUI_ROWPREP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fastmath.h"

/* IEEE half (the scales' storage) to float, for the portable path. */
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0) {
        v.f = (float)man * 5.9604644775390625e-8f; /* subnormal: man * 2^-24 */
        v.u |= sign;
        return v.f;
    }
    v.u = sign | (exp == 31 ? 0x7f800000u | (man << 13) : ((exp + 112) << 23) | (man << 13));
    return v.f;
}

/* out = silu(g) * u = g / (1 + fast_exp(-g)) * u over n values. Inlined into the kernels'
 * OpenMP regions gcc left this loop scalar (fast_exp's floor and type pun), 5% of an 8-row
 * default-model step; fast_exp16 / fast_exp8 (fastmath.h) make the operations gcc made of the
 * scalar code, so the same bits for |g| <= 87 (below -87, where the product is
 * under 1e-33, the scalar loop's constant folded by the compiler may differ in the last bits;
 * tests/test_q8_activations.py compiles both and compares them). 0.117 -> 0.085 ms for the
 * default model's down projection of 8 rows, one thread. */
static inline void silu_mul(const float *g, const float *u, int n, float *out) {
    int k = 0;
#if defined(__AVX512F__)
    for (; k + 16 <= n; k += 16) {
        __m512 gv = _mm512_loadu_ps(g + k);
        __m512 e = fast_exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        __m512 d = _mm512_div_ps(gv, _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
        _mm512_storeu_ps(out + k, _mm512_mul_ps(d, _mm512_loadu_ps(u + k)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (; k + 8 <= n; k += 8) {
        __m256 gv = _mm256_loadu_ps(g + k);
        __m256 e = fast_exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        __m256 d = _mm256_div_ps(gv, _mm256_add_ps(e, _mm256_set1_ps(1.0f)));
        _mm256_storeu_ps(out + k, _mm256_mul_ps(d, _mm256_loadu_ps(u + k)));
    }
#endif
    for (; k < n; k++) out[k] = g[k] / (1.0f + fast_exp(-g[k])) * u[k];
}

/* The sum of x[k]^2 over K values in double: sixteen running sums (value k in sum k % 16, each
 * in order; a float's square is exact in double), added in lane order, then the last K % 16
 * values in order: the same operations whatever the vector width, so every build adds alike.
 * One running sum was a chain of dependent double adds (4 cycles a value, ~0.5 us a row of
 * 576), paid by every row of the two normed matmuls of each layer while the memory waited:
 * 30 layers at a comparison's state (2 threads, medians of 6 interleaved rounds, issue 18's
 * eleventh pass) at 1 / 4 / 8 rows 2.99 / 3.54 / 4.05 -> 2.99 / 3.35 / 3.91 ms. */
static inline double sum_squares(const float *x, int K) {
    double lane[16] = {0.0};
    int k = 0;
    for (; k + 16 <= K; k += 16)
        for (int l = 0; l < 16; l++) lane[l] += (double)x[k + l] * x[k + l];
    double ss = 0.0;
    for (int l = 0; l < 16; l++) ss += lane[l];
    for (; k < K; k++) ss += (double)x[k] * x[k];
    return ss;
}

/* The matmul's input row from x's row: x itself (mode 0), RMS-normalized and scaled by aux
 * (mode 1, a transformer block's norm before its projection), or silu(gate) * up from a row
 * [gate | up] of 2K values (mode 2, the MLP's down projection; mode 3: tanh GELU's). */
static inline void prepare_row(const float *x, int K, int mode, const float *aux, float eps,
                               float *out) {
    if (mode == 1) {
        float r = 1.0f / sqrtf((float)(sum_squares(x, K) / K) + eps);
        for (int k = 0; k < K; k++) out[k] = x[k] * r * aux[k];
    } else if (mode == 2) {
        silu_mul(x, x + K, K, out);
    } else if (mode == 3) {
        /* tanh GELU (Gemma's gelu_pytorch_tanh): 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)),
         * u = sqrt(2/pi) (g + 0.044715 g^3); vectorized like SiLU above instead of a scalar
         * tanhf call per element (6,912 a layer for Gemma 3 1B). */
        for (int k = 0; k < K; k++) {
            float g = x[k];
            float u = 0.7978845608028654f * (g + 0.044715f * g * g * g);
            out[k] = g / (1.0f + fast_exp(-2.0f * u)) * x[K + k];
        }
    } else {
        memcpy(out, x, sizeof(float) * K);
    }
}

#endif
