/* All decoder layers of one decode step in one call, for int8 or int4 weights and fp32
 * activations: per layer, the fused norm + QKV projection (q8.c or q4.c), Qwen3's per-head q/k
 * norms, attention with RoPE and the cache write (attn.c), the output projection and residual,
 * then the MLP: the fused norm + gate/up projection and the fused silu(gate) * up + down
 * projection, or a mixture of experts (the router's softmax and top-k here, the chosen experts
 * in two q8_matmul_sel / q4_matmul_sel calls), and the residual. The same math as
 * FastLlama.forward's loop, without a Python round trip per operation (121 kernel calls a token
 * for the default model).
 *
 * Qwen3's q/k norms and the mixture of experts moved here from Python (FastLlama's per-layer
 * loop and _after_attention), so Qwen3, Qwen3-MoE and Mixtral decode in this one call too. On
 * the Qwen3-30B-A3B-layer shape (benchmarks/shapes.py qwen3-moe-small: 6 layers, 32 experts,
 * top 8), one thread's CPU time per decode step, median of 7 interleaved rounds in one process
 * (load 5): int4 29.6 -> 26.6 ms, int8 38.6 -> 34.9 ms; the per-layer Python and torch calls
 * (q/k norm, router, top-k, the experts' weighted sum, a kernel call per projection) cost about
 * 0.5-0.6 ms a layer. About half of what is left is the output layer (151,936 x 2048).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "chatui_kernels.h"
#include "rowprep.h"

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

/* Per-head RMS norm of q's H and k's KV heads (the first (H + KV) * D values of each qkv row),
 * in place, as F.rms_norm over D. */
static void qk_norm(float *qkv, int B, int H, int KV, int D, int nqkv, const float *qn,
                    const float *kn, float eps) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H + KV; h++) {
            float *v = qkv + (size_t)b * nqkv + (size_t)h * D;
            const float *w = h < H ? qn : kn;
            float r = 1.0f / sqrtf((float)(sum_squares(v, D) / D) + eps);
            for (int d = 0; d < D; d++) v[d] = v[d] * r * w[d];
        }
}

/* Scratch of a mixture-of-experts layer, sized for the largest layer (private to this file). */
struct moe_buf {
    float *xn, *logits, *wsel, *gu, *y;
    int64_t *sel;
};

/* x [B, hidden] += the mixture of experts of RMS(x) * ln2 (MoE.route and PackedExperts in
 * fast_blocks.py / quant.py, the same math): router logits (f32.c), softmax, the top_k
 * largest (the lowest index first among equals), optionally renormalised, then every row's
 * chosen experts' gate/up in one call and their down projections (SwiGLU fused) in another. */
static void moe_ffn(const layer_t *L, float *x, int B, int hidden, float eps, int threads,
                    struct moe_buf *m) {
    int E = L->n_experts, k = L->top_k, I = L->moe_inter, P = B * k;
    for (int b = 0; b < B; b++)
        prepare_row(x + (size_t)b * hidden, hidden, 1, L->ln2, eps, m->xn + (size_t)b * hidden);
    /* A small router (Qwen3-30B-A3B's: 128 x 2048, 1 MB) on one thread: a thread team costs
     * more than its share of the work, and on a loaded machine each team waits for its
     * slowest, preempted thread. */
    int rows = f32_max_rows(), rt = (size_t)E * hidden >= ((size_t)1 << 20) ? threads : 1;
    for (int b = 0; b < B; b += rows)
        f32_matvec(m->xn + (size_t)b * hidden, B - b < rows ? B - b : rows, hidden, L->router, E,
                   m->logits + (size_t)b * E, rt);
    for (int b = 0; b < B; b++) {
        float *l = m->logits + (size_t)b * E, mx = l[0], sum = 0.f;
        for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < E; e++) sum += (l[e] = expf(l[e] - mx));
        for (int e = 0; e < E; e++) l[e] /= sum;
        float chosen = 0.f;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (l[e] >= 0.f && (best < 0 || l[e] > l[best])) best = e;
            m->sel[b * k + j] = best;
            m->wsel[b * k + j] = l[best];
            chosen += l[best];
            l[best] = -1.f; /* taken */
        }
        if (L->norm_topk)
            for (int j = 0; j < k; j++) m->wsel[b * k + j] /= chosen;
    }
    if (L->wbits == 4) {
        q4_matmul_sel(P, m->xn, k, hidden, (const uint8_t *const *)L->egu_w,
                      (const uint16_t *const *)L->egu_s, m->sel, 2 * I, m->gu, threads, 0);
        q4_matmul_sel(P, m->gu, 1, I, (const uint8_t *const *)L->ed_w,
                      (const uint16_t *const *)L->ed_s, m->sel, hidden, m->y, threads, 2);
    } else {
        q8_matmul_sel(P, m->xn, k, hidden, (const int8_t *const *)L->egu_w,
                      (const uint16_t *const *)L->egu_s, m->sel, 2 * I, m->gu, threads, 0);
        q8_matmul_sel(P, m->gu, 1, I, (const int8_t *const *)L->ed_w,
                      (const uint16_t *const *)L->ed_s, m->sel, hidden, m->y, threads, 2);
    }
    for (int b = 0; b < B; b++) {
        float *xb = x + (size_t)b * hidden, *t = m->xn + (size_t)b * hidden; /* xn is free now */
        for (int n = 0; n < hidden; n++) t[n] = 0.f;
        for (int j = 0; j < k; j++) {
            const float *yj = m->y + (size_t)(b * k + j) * hidden;
            float w = m->wsel[b * k + j];
            for (int n = 0; n < hidden; n++) t[n] += w * yj[n];
        }
        add_into(xb, t, hidden);
    }
}

/* Gemma's norm of a sub-layer's output [B, hidden] in place (F.rms_norm in fp32, as the
 * block's input norms; prepare_row reads each value before it writes it). */
static void post_norm(float *t, int B, int hidden, const float *w, float eps) {
    if (!w) return;
    for (int b = 0; b < B; b++)
        prepare_row(t + (size_t)b * hidden, hidden, 1, w, eps, t + (size_t)b * hidden);
}

/* The attention mask of a layer with a sliding window: the padding mask (or every slot) with
 * the slots before the window cleared, into buf [B, w + 1]; the padding mask itself (NULL:
 * every slot) when the window reaches slot 0 (fast_llama._window_mask, the same rule). */
static const uint8_t *window_mask(const uint8_t *mask, int B, int w, int window, uint8_t *buf) {
    int lo = window > 0 && w - window + 1 > 0 ? w - window + 1 : 0, S = w + 1;
    if (lo == 0) return mask;
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++)
            buf[(size_t)b * S + s] = s < lo ? 0 : mask ? mask[(size_t)b * S + s] : 1;
    return buf;
}

/* x: [B, hidden] residual stream, updated in place. kc, vc: per layer [B, KV, C, D].
 * Gemma 2/3's extras per layer (layer_t): the post-attention and post-MLP norms, tanh GELU,
 * sliding windows and a RoPE table per layer kind. Before they were here, Gemma 3 decoded
 * through FastLlama's per-layer Python loop (a kernel call per projection, torch's q/k norms,
 * GELU, norms and adds): on the gemma3-1b shape (26 layers, benchmarks/shapes.py) one
 * thread's CPU time per step went 69.7 -> 59.7 ms with this call (bench_moe_step.py --shape
 * gemma3-1b --quantize int8, A/B in one process, load 5.5; README, "decode.c and Gemma"). */
void decode_layers(float *x, int B, int hidden, int n_layers, const layer_t *layers,
                   void *const *kc, void *const *vc, int H, int KV, int D, int inter, int C,
                   int w, const int64_t *pos, const float *const *cos_t,
                   const float *const *sin_t, const uint8_t *mask, int shared, float eps,
                   int threads, int kv_half) {
    int nqkv = (H + 2 * KV) * D;
    size_t E = 0, PK = 0, PI = 0; /* the largest mixture's experts, rows and rows x inter */
    for (int i = 0; i < n_layers; i++)
        if (layers[i].router) {
            size_t p = (size_t)B * layers[i].top_k;
            E = E > (size_t)layers[i].n_experts ? E : (size_t)layers[i].n_experts;
            PK = PK > p ? PK : p;
            PI = PI > p * layers[i].moe_inter ? PI : p * layers[i].moe_inter;
        }
    float *qkv = (float *)malloc(sizeof(float) * (size_t)B * nqkv);
    float *o = (float *)malloc(sizeof(float) * (size_t)B * H * D);
    float *t = (float *)malloc(sizeof(float) * (size_t)B * hidden);
    float *gu = (float *)malloc(sizeof(float) * (size_t)B * 2 * inter);
    uint8_t *wmask = (uint8_t *)malloc((size_t)B * (w + 1));
    struct moe_buf m = {0};
    if (PK) {
        m.xn = (float *)malloc(sizeof(float) * (size_t)B * hidden);
        m.logits = (float *)malloc(sizeof(float) * (size_t)B * E);
        m.wsel = (float *)malloc(sizeof(float) * PK);
        m.sel = (int64_t *)malloc(sizeof(int64_t) * PK);
        m.gu = (float *)malloc(sizeof(float) * 2 * PI);
        m.y = (float *)malloc(sizeof(float) * PK * hidden);
    }
    for (int i = 0; i < n_layers; i++) {
        const layer_t *L = layers + i;
        qmm(L, x, B, hidden, L->wqkv, L->sqkv, nqkv, qkv, threads, 1, L->ln1, eps);
        add_bias(qkv, L->bqkv, B, nqkv);
        if (L->q_norm) qk_norm(qkv, B, H, KV, D, nqkv, L->q_norm, L->k_norm, eps);
        attn_decode(qkv, B, H, KV, D, kc[i], vc[i], C, w, pos, cos_t[L->rope],
                    sin_t[L->rope], window_mask(mask, B, w, L->window, wmask), shared, o,
                    threads, kv_half);
        qmm(L, o, B, H * D, L->wo, L->so, hidden, t, threads, 0, NULL, 0.f);
        add_bias(t, L->bo, B, hidden);
        post_norm(t, B, hidden, L->post_attn, eps);
        add_into(x, t, B * hidden);
        if (L->router) {
            moe_ffn(L, x, B, hidden, eps, threads, &m);
            continue;
        }
        qmm(L, x, B, hidden, L->wgu, L->sgu, 2 * inter, gu, threads, 1, L->ln2, eps);
        add_bias(gu, L->bgu, B, 2 * inter);
        qmm(L, gu, B, inter, L->wd, L->sd, hidden, t, threads, L->act == 1 ? 3 : 2, NULL, 0.f);
        add_bias(t, L->bd, B, hidden);
        post_norm(t, B, hidden, L->post_mlp, eps);
        add_into(x, t, B * hidden);
    }
    free(qkv);
    free(o);
    free(t);
    free(gu);
    free(wmask);
    free(m.xn);
    free(m.logits);
    free(m.wsel);
    free(m.sel);
    free(m.gu);
    free(m.y);
}
