/* chatui's CPU attention for one new token per row (decode), fp32: RoPE on the new query and
 * key, the key and value written into the KV cache, and attention over the cache, in one call
 * instead of a dozen torch ops per layer.
 *
 * qkv: [B, (H + 2 KV) * D], each row q heads then k heads then v heads; q and k heads in
 * interleaved RoPE pairs (2i, 2i + 1), as inference/fast_llama.py lays them out.
 * kc, vc: [B, KV, C, D] (one layer's cache); the new key and value go to position `w`.
 * pos: [B] RoPE position of each row's token; cos, sin: [*, D/2] tables (already scaled).
 * mask: [B, S] (1 = attend) or NULL for "all of 0..S-1"; S = w + 1 keys are attended.
 * out: [B, H * D]. Query head h uses KV head h / (H / KV), as transformers' repeat_kv does.
 * shared: positions 0..shared-1 hold the same keys and values in every row (one prompt
 * prefilled once and repeated for compare columns or fan-out branches): those are read from
 * row 0 for every row, and the rows of one chunk of them are handed out one after the other,
 * so B rows read the prompt's cache about once instead of B times (at 8 rows of a 150-token
 * context the default model's cache reads were 55 MB a step, 0.7 ms a row on one core).
 * Every row's arithmetic is unchanged: the copies are bitwise equal.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chatui_kernels.h"
#include "fastmath.h"
#include "rowprep.h"
#include "team.h"
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

/* RoPE of interleaved pairs (x[2i], x[2i + 1]) by angle i: x[2i] = a c - (b s) and
 * x[2i + 1] = a s + (b c), each one fused multiply-add of the other product rounded (the
 * operations gcc made of the plain expressions before, written out so that the vector loop
 * gives the same bits; issue 18's fifteenth pass vectorized it: a scalar pair at a time was
 * 6 % of an 8-row attention's time, with the cache's fp16 stores). */
static void rope(float *x, const float *c, const float *s, int half) {
    int i = 0;
#if defined(__AVX512F__)
    /* eight pairs a vector: c and s repeated per pair, the pair swapped for the cross terms */
    const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    for (; i + 8 <= half; i += 8) {
        __m512 v = _mm512_loadu_ps(x + 2 * i), w = _mm512_permute_ps(v, 0xB1);
        __m512 c2 = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(c + i)));
        __m512 s2 = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(s + i)));
        __m512 even = _mm512_fmsub_ps(v, c2, _mm512_mul_ps(w, s2)); /* a c - (b s) */
        __m512 odd = _mm512_fmadd_ps(w, s2, _mm512_mul_ps(v, c2));  /* a s + (b c) */
        _mm512_storeu_ps(x + 2 * i, _mm512_mask_blend_ps((__mmask16)0xAAAA, even, odd));
    }
#endif
    for (; i < half; i++) {
        float a = x[2 * i], b = x[2 * i + 1];
#if defined(__FMA__)
        x[2 * i] = fmaf(a, c[i], -(b * s[i]));
        x[2 * i + 1] = fmaf(a, s[i], b * c[i]);
#else /* (no fused multiply-add: libm's fmaf would be a slow software one) */
        x[2 * i] = a * c[i] - b * s[i];
        x[2 * i + 1] = a * s[i] + b * c[i];
#endif
    }
}

#define CHUNK 256 /* keys per task: the scores of one chunk stay in L1 */

/* Keys fetched this many ahead of the scores (4 KB at D = 64). */
#define KEYS_AHEAD 16

/* The sum of p[0..n): sixteen running sums (key i in sum i % 16, each in key order), added
 * together in lane order, then the last n % 16 keys in order. The same operations whatever
 * the vector width (gcc makes the lanes' loop SIMD; a single running sum could not be), so
 * every build adds alike. One sum in key order was a chain of dependent adds, 4 cycles a key:
 * 30 layers of attention at 8 rows of a 170-key context went 1.88 -> 1.69 ms without it. */
static float sum_keys(const float *p, int n) {
    float lane[16] = {0.f};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lane[l] += p[i + l];
    float sum = 0.f;
    for (int l = 0; l < 16; l++) sum += lane[l];
    for (; i < n; i++) sum += p[i];
    return sum;
}

/* fp16 <-> fp32 for the fp16 cache: the F16C instructions where there are, else the same
 * IEEE conversions in software (round to nearest even, subnormals, inf and NaN kept), so every
 * build stores and reads the same bits. */
static inline uint16_t f32_to_f16(float f) {
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    union { float f; uint32_t u; } v = {f};
    uint32_t sign = (v.u >> 16) & 0x8000, a = v.u & 0x7fffffff;
    if (a >= 0x7f800000) /* inf, NaN (quiet, payload's top bits) */
        return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000 ? 0x200 | ((a >> 13) & 0x3ff) : 0));
    if (a >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* rounds past 65504: inf */
    if (a < 0x38800000) { /* below 2^-14: subnormal (or zero), a multiple of 2^-24 */
        if (a < 0x33000000) return (uint16_t)sign; /* below half of 2^-24: zero */
        uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000, shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        q += rest > halfway || (rest == halfway && (q & 1));
        return (uint16_t)(sign | q);
    }
    uint32_t q = (a >> 13) - (112u << 10), rest = a & 0x1fff;
    q += rest > 0x1000 || (rest == 0x1000 && (q & 1));
    return (uint16_t)(sign | q);
#endif
}

static inline float f16_to_f32(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return half_to_float(h);
#endif
}

#if defined(__AVX512F__)
/* Eight keys' sums, out[j] = the sum of a[j]'s sixteen lanes, reduced together through one
 * tree (scores8 and scores8_q of either cache type: every score takes the same tree, so the
 * same bits wherever it is computed). */
static inline __attribute__((always_inline)) void sums8(const __m512 *a, float *out) {
    __m256 r[8];
    for (int j = 0; j < 8; j++)
        r[j] = _mm256_add_ps(_mm512_castps512_ps256(a[j]),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[j]), 1)));
    __m256 h0 = _mm256_hadd_ps(r[0], r[1]), h1 = _mm256_hadd_ps(r[2], r[3]);
    __m256 h2 = _mm256_hadd_ps(r[4], r[5]), h3 = _mm256_hadd_ps(r[6], r[7]);
    __m256 u0 = _mm256_hadd_ps(h0, h1), u1 = _mm256_hadd_ps(h2, h3);
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                                        _mm256_permute2f128_ps(u0, u1, 0x31)));
}
#endif

#define KV_T float
#define KV_FN(name) name##_f32
#define KV_LOAD16(p) _mm512_loadu_ps(p)
#define KV_STORE16(p, v) _mm512_storeu_ps(p, v)
#define KV_GET(p) (*(p))
#define KV_PUT(p, v) (*(p) = (v))
#include "attn_kv.h"
#undef KV_T
#undef KV_FN
#undef KV_LOAD16
#undef KV_STORE16
#undef KV_GET
#undef KV_PUT

#define KV_T uint16_t
#define KV_FN(name) name##_f16
#define KV_LOAD16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define KV_STORE16(p, v) _mm256_storeu_si256((__m256i *)(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT))
#define KV_GET(p) f16_to_f32(*(p))
#define KV_PUT(p, v) (*(p) = f32_to_f16(v))
#include "attn_kv.h"
#undef KV_T
#undef KV_FN
#undef KV_LOAD16
#undef KV_STORE16
#undef KV_GET
#undef KV_PUT

void attn_decode(const float *qkv, int B, int H, int KV, int D, void *kc, void *vc, int C, int w,
                 const int64_t *pos, const float *cos_t, const float *sin_t, const uint8_t *mask,
                 int shared, float *out, int threads, int kv_half) {
    if (kv_half)
        attend_f16(qkv, B, H, KV, D, (uint16_t *)kc, (uint16_t *)vc, C, w, pos, cos_t, sin_t,
                   mask, shared, out, threads);
    else
        attend_f32(qkv, B, H, KV, D, (float *)kc, (float *)vc, C, w, pos, cos_t, sin_t, mask,
                   shared, out, threads);
}

void attn_prefill(const float *qkv, int T, int H, int KV, int D, void *kc, void *vc, int C,
                  int start, const float *cos_t, const float *sin_t, float *out, int threads,
                  int kv_half) {
    if (kv_half)
        prefill_f16(qkv, T, H, KV, D, (uint16_t *)kc, (uint16_t *)vc, C, start, cos_t, sin_t, out,
                    threads);
    else
        prefill_f32(qkv, T, H, KV, D, (float *)kc, (float *)vc, C, start, cos_t, sin_t, out,
                    threads);
}
