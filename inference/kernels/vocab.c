/* The per-token work at the ends of a decode step that scales with the vocabulary or the
 * embedding, not with the decoder: an int8 embedding's rows (the input) and Gemma's logit
 * soft-capping (the output).
 *
 * Both were torch ops before: Q8Weight.rows' eight ops (~0.1 ms a token on one core, 1.5 % of
 * the default model's step) and cap * tanh(logits / cap) over Gemma 3's 262,144 logits (three
 * passes and 0.8 ms a token on one core, torch's tanh). Here each is one pass.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "chatui_kernels.h"
#include "fastmath.h"
#include "rowprep.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

#define GS 32
#define RB 16

/* out [n, K] = rows ids of the packed int8 weight (q8.c's layout: blocks of 16 rows, groups of
 * 32 along K, a row's pair t of group g at byte 32 t + 2 r of the group), dequantized as
 * Q8Weight.rows does (float(q) * float(scale), one rounding), then times `mul` (Gemma's
 * embedding scale; 1 elsewhere, exact). */
void q8_rows(const int64_t *ids, int n, int K, const int8_t *wp, const uint16_t *sp, float mul,
             float *out) {
    int G = (K + GS - 1) / GS;
    for (int i = 0; i < n; i++) {
        int64_t b = ids[i] / RB, r = ids[i] % RB;
        const int8_t *wb = wp + (size_t)b * G * GS * RB;
        const uint16_t *sb = sp + (size_t)b * G * RB;
        float *o = out + (size_t)i * K;
        for (int g = 0; g < G; g++) {
            float s = half_to_float(sb[g * RB + r]);
            const int8_t *wg = wb + (size_t)g * GS * RB;
            for (int t = 0; t < GS / 2; t++)
                for (int j = 0; j < 2; j++) {
                    int k = g * GS + 2 * t + j;
                    if (k < K) o[k] = ((float)wg[t * 32 + 2 * r + j] * s) * mul;
                }
        }
    }
}

/* y = cap * tanh(y / cap), in place. tanh(z) = sign(z) (1 - e) / (1 + e), e = exp(-2 |z|)
 * (fast_exp: a few float ulps from torch's tanh, which the tests' 1e-4 on log-probabilities
 * and greedy tokens against transformers check). */
void softcap(float *y, size_t n, float cap) {
    float inv = 1.0f / cap;
    #pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float z = y[i] * inv, a = fabsf(z);
        float e = fast_exp(-2.0f * a);
        float t = (1.0f - e) / (1.0f + e);
        y[i] = cap * (z < 0.f ? -t : t);
    }
}
