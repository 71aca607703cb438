/* chatui's CPU kernels: every exported function and struct, in one place.
 *
 * Every .c file includes this header, so a prototype or the layer struct can change in one
 * place only and the compiler checks each definition against it. The Python side
 * (inference/kernel_abi.py) mirrors it in ONE table of ctypes signatures and structs and checks,
 * on load, the ABI version and the size of every struct against the library's answers: a
 * mismatch refuses the library (the runtime falls back to torch) instead of corrupting memory.
 *
 * Bump CHATUI_KERNELS_ABI with any change to a signature or a struct below, and change
 * kernel_abi.py's table in the same commit.
 */
#ifndef CHATUI_KERNELS_H
#define CHATUI_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#define CHATUI_KERNELS_ABI 12

/* One decoder layer's tensors for decode_layers (biases may be NULL). Python: kernel_abi.Layer.
 * The four weights are all int8 (wbits 8: packed int8 and scales of q8.c) or all int4 (wbits 4:
 * packed nibbles, read as bytes, and scales and mins of q4.c). */
typedef struct {
    const float *ln1, *ln2;
    const int8_t *wqkv; const uint16_t *sqkv; const float *bqkv;
    const int8_t *wo; const uint16_t *so; const float *bo;
    const int8_t *wgu; const uint16_t *sgu; const float *bgu;
    const int8_t *wd; const uint16_t *sd; const float *bd;
    int wbits;
    /* Per-head RMS norms [D] of q and k before RoPE (Qwen3), or NULL. */
    const float *q_norm, *k_norm;
    /* A mixture of experts in place of the gated MLP (wgu .. bd unused) where router is not
     * NULL: router [n_experts, hidden] fp32; the experts' packed gate/up [2 moe_inter, hidden]
     * and down [hidden, moe_inter] weights and scales as arrays of n_experts pointers, of
     * wbits like the layer's others; top_k of them per token, weighted by their softmax
     * probabilities (renormalised over the chosen ones when norm_topk). */
    const float *router;
    const void *const *egu_w; const void *const *egu_s;
    const void *const *ed_w; const void *const *ed_s;
    int n_experts, top_k, norm_topk, moe_inter;
    /* Gemma: RMS norms [hidden] of the attention's and the MLP's outputs before each residual
     * add, or NULL. window: keys older than this many cache slots (the new one included) are
     * hidden, 0 for none. act: the gate's activation, 0 SiLU, 1 tanh GELU. rope: which of
     * decode_layers' RoPE tables this layer uses (Gemma 3's local and global bases). */
    const float *post_attn, *post_mlp;
    int window, act, rope;
} layer_t;

/* abi.c: what the loader checks before it calls anything else. */
int chatui_abi_version(void);
size_t chatui_sizeof_layer_t(void);

/* q8.c: int8 weights in groups of q8_group_size() along K, packed in blocks of q8_row_block()
 * rows. y [M, N] = f(x) W^T; mode 0: f(x) = x, 1: RMS norm scaled by aux (eps), 2: x's rows
 * hold [gate | up] (2K values) and f(x) = silu(gate) * up, 3: the same with tanh GELU. */
int q8_group_size(void);
int q8_row_block(void);
int q8_openmp(void);
const char *q8_isa(void);
void q8_matmul(const float *x, int M, int K, const int8_t *wp, const uint16_t *sp, int N, float *y,
               int threads, int mode, const float *aux, float eps);
/* P one-row products in one parallel loop (a mixture of experts' decode step): y [P, N],
 * y[p] = f(x[p / xdiv]) W[sel[p]]^T with W[e] = (wp[e], sp[e]), all [N, K]; mode 0 or 2. */
void q8_matmul_sel(int P, const float *x, int xdiv, int K, const int8_t *const *wp,
                   const uint16_t *const *sp, const int64_t *sel, int N, float *y, int threads,
                   int mode);

/* q4.c: int4 weights (q * d + m, 4-bit q, fp16 d and m per row and group of 32 along K),
 * packed in blocks of 16 rows (layout in q4.c); y [M, N] = f(x) W^T with f as q8_matmul's. */
const char *q4_isa(void);
void q4_matmul(const float *x, int M, int K, const uint8_t *wp, const uint16_t *sp, int N, float *y,
               int threads, int mode, const float *aux, float eps);
/* q8_matmul_sel for int4 weights. */
void q4_matmul_sel(int P, const float *x, int xdiv, int K, const uint8_t *const *wp,
                   const uint16_t *const *sp, const int64_t *sel, int N, float *y, int threads,
                   int mode);

/* q6.c: 6-bit weights in GGUF Q6_K's numbers (w = d * sc * (q - 32): 6-bit q, an int8 sc per row
 * and 16 along K, an fp16 d per row and 256 along K), packed in blocks of 16 rows (layout in
 * q6.c); y [M, N] = f(x) W^T with f as q8_matmul's. The output layer under --quantize int4. */
void q6_matmul(const float *x, int M, int K, const uint8_t *wp, const uint16_t *sp, int N, float *y,
               int threads, int mode, const float *aux, float eps);

/* attn.c: one new token per row: RoPE, the cache write at w and attention over 0..w; positions
 * 0..shared-1 are equal in every row and read from row 0. The cache holds fp32 or, with
 * kv_half, IEEE fp16 (uint16_t) values. */
void attn_decode(const float *qkv, int B, int H, int KV, int D, void *kc, void *vc, int C, int w,
                 const int64_t *pos, const float *cos_t, const float *sin_t, const uint8_t *mask,
                 int shared, float *out, int threads, int kv_half);

/* attn.c: a prefill's attention: T new tokens of one sequence at positions start..start+T-1,
 * causal; qkv [T, (H + 2 KV) * D] as attn_decode's (RoPE, the scale and the cache writes
 * done here, as a decode step does them), the cache [KV, C, D] of one row (fp32, or fp16 with
 * kv_half), out [T, H * D]. */
void attn_prefill(const float *qkv, int T, int H, int KV, int D, void *kc, void *vc, int C,
                  int start, const float *cos_t, const float *sin_t, float *out, int threads,
                  int kv_half);

/* decode.c: every decoder layer of one decode step; x [B, hidden] updated in place. cos_t,
 * sin_t: one RoPE table of each kind, indexed by layer_t.rope. */
void decode_layers(float *x, int B, int hidden, int n_layers, const layer_t *layers,
                   void *const *kc, void *const *vc, int H, int KV, int D, int inter, int C,
                   int w, const int64_t *pos, const float *const *cos_t, const float *const *sin_t,
                   const uint8_t *mask, int shared, float eps, int threads, int kv_half);

/* f32.c: y [M, N] = x [M, K] W^T for fp32, M <= f32_max_rows(). */
int f32_max_rows(void);
void f32_matvec(const float *x, int M, int K, const float *w, int N, float *y, int threads);

/* vocab.c: out [n, K] = the rows ids [n] of a packed int8 weight (q8.c's layout) as fp32,
 * times mul (an embedding lookup); y [n] = cap * tanh(y / cap) in place (logit soft-capping). */
void q8_rows(const int64_t *ids, int n, int K, const int8_t *wp, const uint16_t *sp, float mul,
             float *out);
void softcap(float *y, size_t n, float cap);

/* stats.c: a decode step's statistics of B rows of raw logits [B, V]: out[b] (ld floats apart)
 * = chosen id, its logprob, entropy, k best ids, their logprobs; chosen NULL: the argmax
 * (greedy), followed by sampler_stats' greedy columns (1, 1, k alternative probabilities, k
 * cut codes: 0 for the chosen, greedy_cut for the rest). k <= token_stats_max_k(). */
int token_stats_max_k(void);
void token_stats_f32(const float *logits, int B, int V, const int64_t *chosen, int k,
                     float greedy_cut, float *out, int ld, int threads);
/* The k largest of each row of x [B, V]: vals [B, k] descending, ids [B, k] (ties: the lower
 * index first); for the top-p filter's candidates. */
void topk_f32(const float *x, int B, int V, int k, float *vals, int64_t *ids, int threads);
/* One decode step's sampling of B rows (sampling.py's chain and CPU draw, fused): raw [B, V]
 * the logits, pre [B, V] the same after the repetition penalty (raw where there is none);
 * per row the temperature (greedy rows: any), top_k (0 off), top_p (1 off), min_p (0 off),
 * greedy (1: the argmax of pre) and u, a uniform number in [0, 1) for the draw. out[b] (ld
 * floats apart) = token_stats' columns for the chosen token then sampler_stats' (its
 * probability after the chain, the nucleus size, k alternatives' probabilities and cut
 * codes). k <= token_stats_max_k(). */
void sample_f32(const float *raw, const float *pre, int B, int V, const float *temperature,
                const int64_t *top_k, const float *top_p, const float *min_p,
                const uint8_t *greedy, const double *u, int k, float *out, int ld,
                int threads);

#endif
