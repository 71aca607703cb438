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
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "fastmath.h"

static void rope(float *x, const float *c, const float *s, int half) {
    for (int i = 0; i < half; i++) {
        float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c[i] - b * s[i];
        x[2 * i + 1] = a * s[i] + b * c[i];
    }
}

#define CHUNK 256 /* keys per task: the scores of one chunk stay in L1 */

/* Attention of the G query heads sharing one KV head over keys [k0, k1): unnormalized output
 * acc[g][D], running max mx[g] and sum sm[g] (combined across chunks by the caller). */
static void chunk_attend(const float *q /* [G][D] scaled, rotated */, int G, int D,
                         const float *K, const float *V, int k0, int k1, const uint8_t *m,
                         int w, float *acc, float *mx, float *sm, float *p /* [G][CHUNK] */) {
    int n = k1 - k0;
    for (int g = 0; g < G; g++) {
        float *pg = p + (size_t)g * CHUNK;
        const float *qg = q + (size_t)g * D;
        float best = -INFINITY;
        for (int i = 0; i < n; i++) {
            const float *kr = K + (size_t)(k0 + i) * D;
            float a = 0.f;
            #pragma omp simd reduction(+ : a)
            for (int d = 0; d < D; d++) a += qg[d] * kr[d];
            if (m && !m[k0 + i] && k0 + i != w) a = -INFINITY;
            pg[i] = a;
            best = a > best ? a : best;
        }
        float sum = 0.f;
        if (best == -INFINITY) {
            for (int i = 0; i < n; i++) pg[i] = 0.f;
        } else {
            #pragma omp simd reduction(+ : sum)
            for (int i = 0; i < n; i++) {
                float e = pg[i] == -INFINITY ? 0.f : fast_exp(pg[i] - best);
                pg[i] = e;
                sum += e;
            }
        }
        mx[g] = best;
        sm[g] = sum;
        float *o = acc + (size_t)g * D;
        for (int d = 0; d < D; d++) o[d] = 0.f;
        for (int i = 0; i < n; i++) {
            float pk = pg[i];
            const float *vr = V + (size_t)(k0 + i) * D;
            #pragma omp simd
            for (int d = 0; d < D; d++) o[d] += pk * vr[d];
        }
    }
}

void attn_decode(const float *qkv, int B, int H, int KV, int D, float *kc, float *vc, int C,
                 int w, const int64_t *pos, const float *cos_t, const float *sin_t,
                 const uint8_t *mask, float *out, int threads) {
    int G = H / KV, half = D / 2, S = w + 1;
    size_t row = (size_t)(H + 2 * KV) * D;
    float scale = 1.0f / sqrtf((float)D);
    /* new keys and values into the cache (keys rotated); queries rotated and scaled */
    float *qs = (float *)malloc(sizeof(float) * (size_t)B * H * D);
    for (int b = 0; b < B; b++) {
        const float *c = cos_t + (size_t)pos[b] * half, *s = sin_t + (size_t)pos[b] * half;
        for (int j = 0; j < KV; j++) {
            float *kd = kc + (((size_t)b * KV + j) * C + w) * D;
            float *vd = vc + (((size_t)b * KV + j) * C + w) * D;
            const float *ks = qkv + b * row + (size_t)(H + j) * D;
            const float *vs = qkv + b * row + (size_t)(H + KV + j) * D;
            for (int d = 0; d < D; d++) { kd[d] = ks[d]; vd[d] = vs[d]; }
            rope(kd, c, s, half);
        }
        for (int h = 0; h < H; h++) {
            float *qd = qs + ((size_t)b * H + h) * D;
            const float *src = qkv + b * row + (size_t)h * D;
            for (int d = 0; d < D; d++) qd[d] = src[d] * scale;
            rope(qd, c, s, half);
        }
    }
    int nc = (S + CHUNK - 1) / CHUNK, tasks = B * KV * nc;
    size_t per = (size_t)G * (D + 2);
    float *part = (float *)malloc(sizeof(float) * per * tasks);
    if (threads < 1) threads = 1;
    #pragma omp parallel num_threads(threads) if (tasks > 1)
    {
    float *scratch = (float *)malloc(sizeof(float) * (size_t)G * CHUNK);
    #pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < tasks; t++) {
        int c = t % nc, j = (t / nc) % KV, b = t / (nc * KV);
        int k0 = c * CHUNK, k1 = k0 + CHUNK < S ? k0 + CHUNK : S;
        float *pt = part + per * t;
        chunk_attend(qs + ((size_t)b * H + (size_t)j * G) * D, G, D,
                     kc + ((size_t)b * KV + j) * C * D, vc + ((size_t)b * KV + j) * C * D, k0, k1,
                     mask ? mask + (size_t)b * S : NULL, w, pt, pt + (size_t)G * D,
                     pt + (size_t)G * D + G, scratch);
    }
    free(scratch);
    }
    /* combine the chunks of each (row, KV head) */
    for (int b = 0; b < B; b++)
        for (int j = 0; j < KV; j++)
            for (int g = 0; g < G; g++) {
                float M = -INFINITY;
                for (int c = 0; c < nc; c++) {
                    float *pt = part + per * (((size_t)b * KV + j) * nc + c);
                    float m = pt[(size_t)G * D + g];
                    M = m > M ? m : M;
                }
                float *o = out + (size_t)b * H * D + (size_t)(j * G + g) * D;
                for (int d = 0; d < D; d++) o[d] = 0.f;
                float total = 0.f;
                for (int c = 0; c < nc; c++) {
                    float *pt = part + per * (((size_t)b * KV + j) * nc + c);
                    float m = pt[(size_t)G * D + g];
                    if (m == -INFINITY) continue;
                    float f = fast_exp(m - M);
                    total += f * pt[(size_t)G * D + G + g];
                    for (int d = 0; d < D; d++) o[d] += f * pt[(size_t)g * D + d];
                }
                float inv = 1.0f / total;
                for (int d = 0; d < D; d++) o[d] *= inv;
            }
    free(part);
    free(qs);
}
