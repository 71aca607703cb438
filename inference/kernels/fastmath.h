/* Small math shared by chatui's kernels. */
#ifndef CHATUI_FASTMATH_H
#define CHATUI_FASTMATH_H

#include <stdint.h>

/* exp(x), relative error ~2e-7 over [-87, 87] (clamped outside), written so the compiler
 * vectorizes loops that call it (libm's expf is a scalar call per element). */
static inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : x > 87.0f ? 87.0f : x;
    float t = x * 1.44269504088896341f; /* log2(e) */
    float n = __builtin_floorf(t + 0.5f);
    float f = t - n; /* [-0.5, 0.5] */
    /* 2^f, degree-6 polynomial */
    float p = 1.5353362e-4f;
    p = p * f + 1.3398874e-3f;
    p = p * f + 9.6184413e-3f;
    p = p * f + 5.5503406e-2f;
    p = p * f + 2.4022652e-1f;
    p = p * f + 6.9314720e-1f;
    p = p * f + 1.0f;
    union { float f; int32_t i; } u = {p};
    u.i += (int32_t)n << 23;
    return u.f;
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

/* fast_exp on 16 (AVX-512) or 8 (AVX2) lanes with the operations gcc makes of the scalar code
 * (the multiply by log2(e) fused into the floor's argument and into f, the polynomial in fused
 * multiply-adds): the scalar function's bits for x in [-87, 87] (outside, where the compiler
 * may fold the clamped value into a constant, within the last bits of 1e-38 or 6e37). */
#if defined(__AVX512F__)
static inline __m512 fast_exp16(__m512 x) {
    const __m512 l2e = _mm512_set1_ps(1.44269504088896341f);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, l2e, _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_fmsub_ps(x, l2e, n);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.5353362e-4f), f, _mm512_set1_ps(1.3398874e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6184413e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503406e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022652e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314720e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p),
                                                _mm512_slli_epi32(_mm512_cvttps_epi32(n), 23)));
}
#elif defined(__AVX2__) && defined(__FMA__)
static inline __m256 fast_exp8(__m256 x) {
    const __m256 l2e = _mm256_set1_ps(1.44269504088896341f);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(87.0f));
    __m256 n = _mm256_round_ps(_mm256_fmadd_ps(x, l2e, _mm256_set1_ps(0.5f)),
                               _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fmsub_ps(x, l2e, n);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(1.5353362e-4f), f, _mm256_set1_ps(1.3398874e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6184413e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5503406e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022652e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314720e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p),
                                                _mm256_slli_epi32(_mm256_cvttps_epi32(n), 23)));
}
#endif

#endif
