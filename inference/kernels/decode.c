/* All decoder layers of one decode step in one call, for int8 or int4 weights and fp32
 * activations: per layer, the fused norm + QKV projection (q8.c or q4.c), attention with RoPE and the cache write
 * (attn.c), the output projection and residual, the fused norm + gate/up projection, the fused
 * silu(gate) * up + down projection and residual. The same math as FastLlama.forward's loop,
 * without a Python round trip per operation (121 kernel calls a token for the default model).
 */
#include <stdint.h>
#include <stdlib.h>

#include "chatui_kernels.h"

static void add_bias(float *y, const float *b, int M, int N) {
    if (!b) return;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) y[(size_t)m * N + n] += b[n];
}

static void add_into(float *x, const float *y, int n) {
    for (int i = 0; i < n; i++) x[i] += y[i];
}

/* One of a layer's projections through the int8 or the int4 kernel (layer_t.wbits). */
static void qmm(const layer_t *L, const float *x, int M, int K, const int8_t *w, const uint16_t *s,
                int N, float *y, int threads, int mode, const float *aux, float eps) {
    if (L->wbits == 4)
        q4_matmul(x, M, K, (const uint8_t *)w, s, N, y, threads, mode, aux, eps);
    else
        q8_matmul(x, M, K, w, s, N, y, threads, mode, aux, eps);
}

/* x: [B, hidden] residual stream, updated in place. kc, vc: per layer [B, KV, C, D]. */
void decode_layers(float *x, int B, int hidden, int n_layers, const layer_t *layers,
                   float *const *kc, float *const *vc, int H, int KV, int D, int inter, int C,
                   int w, const int64_t *pos, const float *cos_t, const float *sin_t,
                   const uint8_t *mask, int shared, float eps, int threads) {
    int nqkv = (H + 2 * KV) * D;
    float *qkv = (float *)malloc(sizeof(float) * (size_t)B * nqkv);
    float *o = (float *)malloc(sizeof(float) * (size_t)B * H * D);
    float *t = (float *)malloc(sizeof(float) * (size_t)B * hidden);
    float *gu = (float *)malloc(sizeof(float) * (size_t)B * 2 * inter);
    for (int i = 0; i < n_layers; i++) {
        const layer_t *L = layers + i;
        qmm(L, x, B, hidden, L->wqkv, L->sqkv, nqkv, qkv, threads, 1, L->ln1, eps);
        add_bias(qkv, L->bqkv, B, nqkv);
        attn_decode(qkv, B, H, KV, D, kc[i], vc[i], C, w, pos, cos_t, sin_t, mask, shared, o,
                    threads);
        qmm(L, o, B, H * D, L->wo, L->so, hidden, t, threads, 0, NULL, 0.f);
        add_bias(t, L->bo, B, hidden);
        add_into(x, t, B * hidden);
        qmm(L, x, B, hidden, L->wgu, L->sgu, 2 * inter, gu, threads, 1, L->ln2, eps);
        add_bias(gu, L->bgu, B, 2 * inter);
        qmm(L, gu, B, inter, L->wd, L->sd, hidden, t, threads, 2, NULL, 0.f);
        add_bias(t, L->bd, B, hidden);
        add_into(x, t, B * hidden);
    }
    free(qkv);
    free(o);
    free(t);
    free(gu);
}
