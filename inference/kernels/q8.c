/* chatui's CPU int8 matmul: weights as int8 in groups of 32 along K with one fp16 scale per
 * row and group; activations quantized on the fly to 8 bits in the same groups, asymmetric
 * (quantize_row); exact integer dot products per group, fp32 accumulation across groups.
 *
 * Packed weight layout, for row block b (16 rows), group g, pair t (0..15):
 *   32 bytes = for r in 0..15: w[16b + r, 32g + 2t], w[16b + r, 32g + 2t + 1]
 * so on AVX2 one 16-lane multiply-add of int16 pairs into int32 (vpmaddwd) advances 16 rows by
 * two columns (AVX-512 VNNI joins two pairs for vpdpbusd, rows_avx512); after a group, lane r
 * holds row r's integer dot product over it, and no horizontal sums are needed. Scales: [N/16, G, 16] fp16 (as llama.cpp's
 * Q8_0 blocks keep them: 6% of the bytes read, not 12.5%).
 * Built at run time by inference/q8kernel.py with the machine's C compiler (-march=native) and
 * OpenMP; loaded after torch, so it shares torch's OpenMP runtime.
 */
#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include <string.h>
#include <stdlib.h>

#include "chatui_kernels.h"
#include "rowprep.h"
#include "team.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define GS 32
#define RB 16
#define MB 8 /* activation rows handled together */

/* Activations: 8-bit, asymmetric, per group of 32 (padded with zeros past K), as PyTorch's
 * quint8 affine scheme: lo = min(0, min x), hi = max(0, max x), inv = 255 / (hi - lo),
 * scale = (hi - lo) / 255, an integer zero point z = round(-lo * inv) in 0..255 and
 * q = clamp(round(x * inv) + z, 0, 255), so x ~ scale * (q - z); an all-zero group has scale,
 * z and q 0. Rounding to nearest even throughout (lrintf and vcvtps2dq). A weight row's dot
 * product with a group is then scale * (sum q w - z * sum w), both sums exact integers.
 * Why 8 bits and not the int16 of issue 18's first passes: AVX-512 VNNI's vpdpbusd does 64
 * multiply-adds where vpdpwssd does 32, at the same rate here (a loop of each: 3.65 G a second
 * on one core), and a batched step's matmuls ran near vpdpwssd's rate. Measured (30 layers
 * and the output layer of the default model's shapes, random weights from memory, 2 threads,
 * medians of 25-30 interleaved runs): 8 rows 9.4 -> 8.4 ms, 4 rows 8.0 -> 7.6, one row
 * unchanged (6.8, its weights' reading); 256 rows (a prefill's) 161 -> 119 ms. The cost in
 * top-1 agreement (97.9 -> 97.6 % on the default model) is in the README. */
/* A group's scale and zero point. The zero point is an integer 0..255 kept as a float, so
 * that the AVX-512 epilogue broadcasts it from memory instead of converting it a row and group
 * (two micro-ops on the ports the multiply-adds need; issue 18's fifteenth pass: 30 layers'
 * matmuls at 8 rows, A/B in one process, -0.19 ms a step). The same bits. */
struct xq { float scale; float zero; };

/* How a group's codes are stored for the multiply-adds: with AVX-512 VNNI the codes q
 * themselves (vpdpbusd's unsigned bytes, the zero point applied after, rows_avx512); elsewhere
 * q - z as int16 (-255..255), so that vpmaddwd's int16 pairs (and the portable loop) give
 * sum w (q - z) directly: the same integers, and the int16 kernels' speed (q as bytes there,
 * widened and the weights' sums taken for the zero point in the loop, made AVX2's int8
 * matmuls 6-28 % slower for 1-8 rows). */
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define ACT_BYTES 1
typedef uint8_t act_t;
#else
#define ACT_BYTES 0
typedef int16_t act_t;
#endif

static inline struct xq quant_params(float lo, float hi) {
    struct xq p = {0.f, 0};
    if (hi > lo) {
        float inv = 255.f / (hi - lo);
        p.scale = (hi - lo) / 255.f;
        p.zero = (float)lrintf(-lo * inv);
    }
    return p;
}

/* One whole group of 32 with SIMD, bit for bit the scalar loop below (the same float
 * operations; lrintf and vcvtps2dq both round to nearest even). Returns 0 where there is no
 * SIMD code. */
static inline int quantize_group(const float *x, act_t *xq, struct xq *xp) {
#if defined(__AVX512F__)
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    float lo = _mm512_reduce_min_ps(_mm512_min_ps(_mm512_min_ps(a, b), _mm512_setzero_ps()));
    float hi = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a, b), _mm512_setzero_ps()));
    struct xq p = quant_params(lo, hi);
    *xp = p;
    __m512 vi = _mm512_set1_ps(hi > lo ? 255.f / (hi - lo) : 0.f);
    __m512i z = _mm512_set1_epi32((int32_t)p.zero), zero = _mm512_setzero_si512(),
            top = _mm512_set1_epi32(255);
    __m512i qa = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(a, vi)), z);
    __m512i qb = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(b, vi)), z);
    qa = _mm512_min_epi32(_mm512_max_epi32(qa, zero), top);
    qb = _mm512_min_epi32(_mm512_max_epi32(qb, zero), top);
#if ACT_BYTES
    _mm_storeu_si128((__m128i *)xq, _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(xq + 16), _mm512_cvtepi32_epi8(qb));
#else
    _mm256_storeu_si256((__m256i *)xq, _mm512_cvtepi32_epi16(_mm512_sub_epi32(qa, z)));
    _mm256_storeu_si256((__m256i *)(xq + 16), _mm512_cvtepi32_epi16(_mm512_sub_epi32(qb, z)));
#endif
    return 1;
#elif defined(__AVX2__)
    __m256 v[4], lo8 = _mm256_setzero_ps(), hi8 = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        lo8 = _mm256_min_ps(lo8, v[i]);
        hi8 = _mm256_max_ps(hi8, v[i]);
    }
    __m128 l = _mm_min_ps(_mm256_castps256_ps128(lo8), _mm256_extractf128_ps(lo8, 1));
    l = _mm_min_ps(l, _mm_movehl_ps(l, l));
    l = _mm_min_ss(l, _mm_shuffle_ps(l, l, 1));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(hi8), _mm256_extractf128_ps(hi8, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float lo = _mm_cvtss_f32(l), hi = _mm_cvtss_f32(h);
    struct xq p = quant_params(lo, hi);
    *xp = p;
    __m256 vi = _mm256_set1_ps(hi > lo ? 255.f / (hi - lo) : 0.f);
    __m256i z = _mm256_set1_epi32((int32_t)p.zero), zero = _mm256_setzero_si256(),
            top = _mm256_set1_epi32(255);
    __m256i q[4];
    for (int i = 0; i < 4; i++) {
        q[i] = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[i], vi)), z);
        q[i] = _mm256_sub_epi32(_mm256_min_epi32(_mm256_max_epi32(q[i], zero), top), z);
    }
    for (int i = 0; i < 4; i += 2) /* (packs interleaves the halves; the permute orders them) */
        _mm256_storeu_si256((__m256i *)(xq + 8 * i),
                            _mm256_permute4x64_epi64(_mm256_packs_epi32(q[i], q[i + 1]), 0xD8));
    return 1;
#else
    (void)x, (void)xq, (void)xp;
    return 0;
#endif
}

/* x [K] -> xq [G*32] (the codes as act_t holds them) and xp [G] (scale and zero point of
 * each group of 32). */
static void quantize_row(const float *x, int K, int G, act_t *xq, struct xq *xp) {
    for (int g = 0; g < G; g++) {
        if ((g + 1) * GS <= K && quantize_group(x + g * GS, xq + g * GS, xp + g))
            continue;
        float lo = 0.f, hi = 0.f;
        for (int k = 0; k < GS; k++) {
            int kk = g * GS + k;
            float v = kk < K ? x[kk] : 0.f;
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        struct xq p = quant_params(lo, hi);
        float inv = hi > lo ? 255.f / (hi - lo) : 0.f;
        xp[g] = p;
        for (int k = 0; k < GS; k++) {
            int kk = g * GS + k;
            float v = kk < K ? x[kk] * inv : 0.f;
            long q = lrintf(v) + (long)p.zero;
            q = q < 0 ? 0 : q > 255 ? 255 : q;
            xq[g * GS + k] = (act_t)(ACT_BYTES ? q : q - (long)p.zero);
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
/* How many groups (512 bytes each) ahead the weights are fetched, and how, for every row
 * count: into L2 on every CPU, non-temporal where the build defines CHATUI_WEIGHTS_NT
 * (CHATUI_WEIGHT_FETCH=nontemporal; q8kernel.py's weight_fetch_defines). The history:
 *
 * AMD (Zen 4), on the file's 4 KB pages. A decode step streams the whole model (134 MB for the
 * default model) once, each byte used once; fetched the normal way, that stream went through L2 and
 * into the L3 (AMD's L3 takes what L2 evicts) and pushed out the KV cache and activations the step
 * reads again: attention then read each row's keys and values from memory. Non-temporal, the
 * weights pass through L1 and the cache stays. Measured (decode steps of the default model at a
 * comparison's state: 138-token shared prompt, 64 own tokens a row; medians of 4 interleaved rounds
 * of 25 steps, 2 threads, one process; issue 18's seventh pass): 1 / 4 / 8 rows 3.92 / 5.26 / 6.62
 * ms -> 3.69 / 4.55 / 5.58 ms with 8 groups ahead (before: 4 groups, T0, 4+ rows only); 6, 12 and
 * 16 groups within noise of 8; T2 (into L3) 3.98 / 5.18 / 6.22. 16 since each thread streams one
 * contiguous range of blocks (q8_matmul): the matmuls of 30 layers (weights from memory, 2 threads,
 * medians of 5 interleaved rounds) at 1 / 4 / 8 rows 8 ahead 2.13 / 2.70 / 3.30 ms, 16 ahead 1.99 /
 * 2.46 / 2.96; 24, 32 and 48 no quicker.
 *
 * Intel (a 2-core Xeon with AMX, 2026-11-27). There a non-temporal fetch fills L1 alone, so a
 * core has only its L1's few fill buffers in flight to memory and the L2's streamer never
 * sees the stream: `chatui bench --new-tokens 128` decoded 58.5 tok/s (8.4 GB/s of weights,
 * the machine's read bandwidth 27 GB/s). Into L2 (T2) 16 ahead 178-179 tok/s, 32 ahead
 * 194-195, 8 ahead 172, 64 ahead 173; T1 32 ahead 192, T0 16 / 32 ahead 155 / 163, no fetch
 * at all 129 (one run each, 2 threads).
 *
 * AMD again, once the weights ran from huge pages (issue 18's twenty-eighth pass): into L2
 * (T2, 32 ahead) is now the quicker there too, and the default on every CPU (q8kernel.py's
 * weight_fetch_defines; CHATUI_WEIGHT_FETCH=nontemporal builds the non-temporal fetch). A
 * comparison's decode steps, both builds alternately in one process (medians of 5-6 rounds):
 * at 1 / 4 / 8 rows non-temporal 6.30 / 7.36 / 10.30 ms, into L2 5.85 / 7.23 / 8.63; in a slower
 * period 6.18 / 7.56 / 11.95 against 6.26 / 7.37 / 10.05 (and on the file's 4 KB pages 6.64 /
 * 8.17 / 11.16 against 6.32 / 7.41 / 11.13); one row alone, 12 rounds twice, 6.00 / 5.85
 * against 5.96 / 5.83. T2 16 or 64 ahead, and T1, within noise of T2 32; T0 slower at 8
 * rows (11.35 against 9.57 ms). */
#if CHATUI_WEIGHTS_NT
#define AHEAD 16
#define WEIGHT_HINT _MM_HINT_NTA
#define FIRST_LOCALITY 0
#else
#define AHEAD 32
#define WEIGHT_HINT _MM_HINT_T2
#define FIRST_LOCALITY 1
#endif

/* The vpermw that makes two pairs' 64 bytes one vector of each row's four columns. */
#define PAIRS_TO_QUADS                                                                        \
    _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, \
                     6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0)

/* R activation rows (1 <= R <= 8, a constant once inlined) against one row block. The packed
 * layout holds a row's columns in pairs (for vpmaddwd); two pairs' 64 bytes become one
 * vector of each row's four columns 4u..4u+3 with one vpermw, shared by the R rows, and then
 * one vpdpbusd a row advances 16 rows by four columns. The weights' sums a group (for the zero
 * points) are one more vpdpbusd a vector against ones, also shared (or, with wsp, given as
 * floats: a prefill's chunks of 8 rows share them, block_sums_avx512). The R rows' multiply-adds
 * are independent chains; the weights AHEAD groups ahead are fetched (see AHEAD).
 * The integer sums are exact, and
 * d - z * sum w (all below 2^24) is exact in float, so every row gets the bits it gets alone
 * and the bits of the AVX2 and portable integer sums. */
static inline __attribute__((always_inline)) void rows_avx512(const uint8_t *xq, const struct xq *xp,
                                                              int G, const int8_t *wb,
                                                              const uint16_t *sb, float *y,
                                                              size_t ldy, int cnt,
                                                              const float *wsp, const int R) {
    const __m512i pairs = PAIRS_TO_QUADS;
    const __m512i ones = _mm512_set1_epi8(1);
    __m512 acc[MB];
    for (int i = 0; i < R; i++) acc[i] = _mm512_setzero_ps();
    for (int g = 0; g < G; g++) {
        const int8_t *wg = wb + (size_t)g * GS * RB;
        for (int l = 0; l < GS * RB; l += 64)
            _mm_prefetch((const char *)(wg + (size_t)AHEAD * GS * RB + l), WEIGHT_HINT);
        __m512i d[MB], ws = _mm512_setzero_si512();
        const int32_t *x[MB]; /* each row's group as four-byte words */
        for (int i = 0; i < R; i++) {
            d[i] = _mm512_setzero_si512();
            x[i] = (const int32_t *)(xq + (size_t)i * G * GS + g * GS);
        }
        for (int u = 0; u < 8; u++) {
            __m512i w = _mm512_permutexvar_epi16(pairs, _mm512_loadu_si512(wg + u * 64));
            if (!wsp) ws = _mm512_dpbusd_epi32(ws, ones, w);
            for (int i = 0; i < R; i++)
                d[i] = _mm512_dpbusd_epi32(d[i], _mm512_set1_epi32(x[i][u]), w);
        }
        __m512 sw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + g * RB)));
        __m512 wsf = wsp ? _mm512_loadu_ps(wsp + g * RB) : _mm512_cvtepi32_ps(ws);
        for (int i = 0; i < R; i++) {
            struct xq p = xp[(size_t)i * G + g];
            __m512 dd = _mm512_fnmadd_ps(wsf, _mm512_set1_ps(p.zero),
                                         _mm512_cvtepi32_ps(d[i]));
            acc[i] = _mm512_fmadd_ps(dd, _mm512_mul_ps(sw, _mm512_set1_ps(p.scale)), acc[i]);
        }
    }
    __mmask16 keep = (__mmask16)(cnt >= RB ? 0xFFFF : (1u << cnt) - 1);
    for (int i = 0; i < R; i++) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

/* M rows against one block: the block's cnt outputs of row i go to y + i * ldy, stored from the
 * accumulators (masked past N). They went through a 16-float buffer and a memcpy a row of
 * cnt floats (a library call: cnt is not a constant), 8 calls a block at 8 rows, ~78,000
 * a step of the default model: decode layers after 40 MB (`bench_kernels_ab.py --base HEAD`,
 * issue 18's twenty-sixth pass) at 4 / 8 rows 6.01 / 7.84 -> 6.02 / 7.45 ms and, in a slower
 * minute, 5.75 / 10.05 -> 5.70 / 8.89 ms; one row 5.11 -> 5.08. The same bits. */
static void block_avx512(const uint8_t *xq, const struct xq *xp, int M, int G, const int8_t *wb,
                         const uint16_t *sb, float *y, size_t ldy, int cnt) {
    switch (M) {
    case 8: rows_avx512(xq, xp, G, wb, sb, y, ldy, cnt, NULL, 8); break;
    case 7: rows_avx512(xq, xp, G, wb, sb, y, ldy, cnt, NULL, 7); break;
    case 6: rows_avx512(xq, xp, G, wb, sb, y, ldy, cnt, NULL, 6); break;
    case 5: rows_avx512(xq, xp, G, wb, sb, y, ldy, cnt, NULL, 5); break;
    case 4: rows_avx512(xq, xp, G, wb, sb, y, ldy, cnt, NULL, 4); break;
    case 3: rows_avx512(xq, xp, G, wb, sb, y, ldy, cnt, NULL, 3); break;
    case 2: rows_avx512(xq, xp, G, wb, sb, y, ldy, cnt, NULL, 2); break;
    default: rows_avx512(xq, xp, G, wb, sb, y, ldy, cnt, NULL, 1); break;
    }
}

/* A block's weight sums a group (for the zero points), as rows_avx512 takes them in its loop,
 * once for all of a prefill's chunks of 8 rows: wsf [G][16] as floats (exact integers). The
 * same integers, so the same bits. */
static void block_sums_avx512(const int8_t *wb, int G, float *wsf) {
    const __m512i pairs = PAIRS_TO_QUADS;
    const __m512i ones = _mm512_set1_epi8(1);
    for (int g = 0; g < G; g++) {
        const int8_t *wg = wb + (size_t)g * GS * RB;
        __m512i ws = _mm512_setzero_si512();
        for (int u = 0; u < 8; u++)
            ws = _mm512_dpbusd_epi32(
                ws, ones, _mm512_permutexvar_epi16(pairs, _mm512_loadu_si512(wg + u * 64)));
        _mm512_storeu_ps(wsf + (size_t)g * RB, _mm512_cvtepi32_ps(ws));
    }
}

/* block_avx512 for a chunk of 8 rows with the block's sums given (block_sums_avx512). */
static void block8_sums_avx512(const uint8_t *xq, const struct xq *xp, int G, const int8_t *wb,
                               const uint16_t *sb, float *y, size_t ldy, int cnt,
                               const float *wsf) {
    rows_avx512(xq, xp, G, wb, sb, y, ldy, cnt, wsf, 8);
}
#define BLOCK_TO_Y block_avx512
#define BLOCK_SUMS 1
#define FETCH_GROUPS AHEAD
#elif defined(__AVX2__) && defined(__F16C__)
/* R activation rows (R <= 4, a constant once inlined) against one group: each pair of weight
 * vectors is widened once for the R rows instead of once a row (the weights of a group do not
 * fit AVX2's 16 registers, so they are widened as they stream); a row's integer sums and float
 * operations are those of the single-row case, and the integers are rows_avx512's. */
static inline __attribute__((always_inline)) void rows_avx2(const int8_t *wg, __m256 sw0,
                                                            __m256 sw1, const act_t *xq,
                                                            const struct xq *xp, int G, int g,
                                                            __m256 (*acc)[2], const int R) {
    __m256i d0[4], d1[4];
    const int32_t *x[4]; /* each row's group as int16 pairs */
    for (int i = 0; i < R; i++) {
        d0[i] = d1[i] = _mm256_setzero_si256();
        x[i] = (const int32_t *)(xq + (size_t)i * G * GS + g * GS);
    }
    for (int t = 0; t < 16; t++) {
        __m256i wt = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wg + t * 32)));
        __m256i wu = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wg + t * 32 + 16)));
        for (int i = 0; i < R; i++) {
            __m256i xb = _mm256_set1_epi32(x[i][t]);
            d0[i] = _mm256_add_epi32(d0[i], _mm256_madd_epi16(wt, xb));
            d1[i] = _mm256_add_epi32(d1[i], _mm256_madd_epi16(wu, xb));
        }
    }
    for (int i = 0; i < R; i++) {
        __m256 sx = _mm256_set1_ps(xp[(size_t)i * G + g].scale);
        acc[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0[i]), _mm256_mul_ps(sw0, sx), acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1[i]), _mm256_mul_ps(sw1, sx), acc[i][1]);
    }
}

static void block_avx2(const act_t *xq, const struct xq *xp, int M, int G, const int8_t *wb,
                       const uint16_t *sb, float *out) {
    __m256 acc[MB][2];
    for (int m = 0; m < M; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int g = 0; g < G; g++) {
        const int8_t *wg = wb + (size_t)g * GS * RB;
        __m256 sw0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + g * RB)));
        __m256 sw1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + g * RB + 8)));
        int m = 0;
        for (; m + 4 <= M; m += 4)
            rows_avx2(wg, sw0, sw1, xq + (size_t)m * G * GS, xp + (size_t)m * G, G, g, acc + m, 4);
        switch (M - m) {
        case 3: rows_avx2(wg, sw0, sw1, xq + (size_t)m * G * GS, xp + (size_t)m * G, G, g, acc + m, 3); break;
        case 2: rows_avx2(wg, sw0, sw1, xq + (size_t)m * G * GS, xp + (size_t)m * G, G, g, acc + m, 2); break;
        case 1: rows_avx2(wg, sw0, sw1, xq + (size_t)m * G * GS, xp + (size_t)m * G, G, g, acc + m, 1); break;
        default: break;
        }
    }
    for (int m = 0; m < M; m++) {
        _mm256_storeu_ps(out + m * RB, acc[m][0]);
        _mm256_storeu_ps(out + m * RB + 8, acc[m][1]);
    }
}
#define BLOCK block_avx2
#define FETCH_GROUPS 0
#else
/* The portable loop (codes stored as q - z here: sum w (q - z) directly). */
static inline void block_generic(const act_t *xq, const struct xq *xp, int M, int G,
                                 const int8_t *wb, const uint16_t *sb, float *acc /* [M][16] */) {
    for (int m = 0; m < M; m++)
        for (int r = 0; r < RB; r++) acc[m * RB + r] = 0.f;
    for (int g = 0; g < G; g++) {
        const int8_t *wg = wb + (size_t)g * GS * RB;
        for (int m = 0; m < M; m++) {
            const act_t *x = xq + (size_t)m * G * GS + g * GS;
            int32_t d[RB] = {0};
            for (int t = 0; t < GS / 2; t++)
                for (int r = 0; r < RB; r++)
                    d[r] += wg[t * 32 + 2 * r] * x[2 * t] + wg[t * 32 + 2 * r + 1] * x[2 * t + 1];
            float sx = xp[(size_t)m * G + g].scale;
            for (int r = 0; r < RB; r++)
                acc[m * RB + r] += (float)d[r] * half_to_float(sb[g * RB + r]) * sx;
        }
    }
}

#define BLOCK block_generic
#define FETCH_GROUPS 0
#endif

int q8_group_size(void) { return GS; }
int q8_row_block(void) { return RB; }

int q8_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

const char *q8_isa(void) {
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
    return "avx512-vnni";
#elif defined(__AVX2__) && defined(__F16C__)
    return "avx2";
#else
    return "generic";
#endif
}

/* y [M, N] = f(x) [M, K] (fp32) times the packed weight's transpose, f given by mode (see
 * prepare_row; x's rows hold 2K values in mode 2). */
#ifndef FIRST_LOCALITY
#define FIRST_LOCALITY 0 /* (no weights are fetched ahead: FETCH_GROUPS is 0) */
#endif

void q8_matmul(const float *x, int M, int K, const int8_t *wp, const uint16_t *sp, int N, float *y,
               int threads, int mode, const float *aux, float eps) {
    int G = (K + GS - 1) / GS, NB = (N + RB - 1) / RB;
    act_t *xq = (act_t *)aligned_alloc(64, (((size_t)M * G * GS * sizeof(act_t) + 63) / 64) * 64);
    struct xq *xs = (struct xq *)malloc(sizeof(struct xq) * (size_t)M * G);
    size_t ldx = mode >= 2 ? 2 * (size_t)K : (size_t)K;
    if (threads < 1) threads = 1;
    if (M == 1) { /* one row: prepared here, before the team, with no barrier after it */
        float *row = (float *)malloc(sizeof(float) * (size_t)K);
        prepare_row(x, K, mode, aux, eps, row);
        quantize_row(row, K, G, xq, xs);
        free(row);
    }
    /* Each thread computes one contiguous range of blocks (team.h's team_range), the
     * first groups of its range fetched before it starts (the fetches run ahead within a block
     * and on into the next one only). Handed out in chunks of 2-16 blocks as threads asked
     * for them (OpenMP's dynamic schedule, before issue 18's tenth pass), the two threads'
     * reads of a weight matrix interleaved and every chunk began with weights nobody had
     * fetched: the default model's 30 layers of matmuls with their weights from memory
     * (2 threads, medians of 5 interleaved rounds in one process) at 1 / 4 / 8 rows took
     * 2.67 / 3.34 / 4.17 ms against 1.99 / 2.46 / 2.96 ms now. The dynamic schedule was there
     * for a preempted thread's share, which the other took over; measured with another program
     * busy on one of the two cores, the static one is still the quicker (8 rows: 7.95 -> 3.36 ms
     * with a program busy half of the time, 13.8 -> 8.0 with one busy all the time),
     * and the engine's thread tuner (threads.py) can move to one thread under such a load.
     * Several rows are prepared (norm or SwiGLU, then quantized) by the same team first, a
     * barrier between (rows 2-4 were prepared by one thread while the other waited, and rows
     * 5-8 by a team of their own); no barrier after the blocks but the team's end. A thread's
     * first groups are fetched before the rows are prepared, so that the memory works during
     * that and the barrier (issue 18's eleventh pass: 30 layers at a comparison's state, 2
     * threads, medians of 8 interleaved rounds, 4 / 8 rows 3.67 / 4.42 -> 3.42 / 4.37 ms). */
    size_t fetch = (size_t)(G < FETCH_GROUPS ? G : FETCH_GROUPS) * GS * RB;
    #pragma omp parallel num_threads(threads)
    {
        int b_lo, b_hi;
        team_range(NB, &b_lo, &b_hi);
        if (b_lo < b_hi)
            for (size_t l = 0; l < fetch; l += 64)
                __builtin_prefetch(wp + (size_t)b_lo * G * GS * RB + l, 0, FIRST_LOCALITY);
        if (M > 1) {
            float *row = (float *)malloc(sizeof(float) * (size_t)K);
            #pragma omp for schedule(static)
            for (int m = 0; m < M; m++) {
                prepare_row(x + (size_t)m * ldx, K, mode, aux, eps, row);
                quantize_row(row, K, G, xq + (size_t)m * G * GS, xs + (size_t)m * G);
            }
            free(row);
        }
#ifdef BLOCK_SUMS
        /* A prefill's (more than 8 rows): each block's weight sums once for all its chunks of
         * 8 rows instead of once a chunk (8 of a chunk's 72 vpdpbusd a group). The default
         * model's 30 layers of matmuls at 137 rows (a throwaway A/B of two builds in one
         * process, medians of 152 interleaved rounds, 2 threads) 67.0 -> 61.5 ms, the same
         * bits; its 137-token prompt's prefill 80-82 -> 75-77 ms. */
        float *sums = M > MB ? (float *)malloc(sizeof(float) * (size_t)G * RB) : NULL;
#endif
        for (int b = b_lo; b < b_hi; b++) { /* (the team's end waits for all) */
            const int8_t *bw = wp + (size_t)b * G * GS * RB;
#ifdef BLOCK_SUMS
            if (sums) block_sums_avx512(bw, G, sums);
#endif
            for (int m0 = 0; m0 < M; m0 += MB) {
                int mm = M - m0 < MB ? M - m0 : MB;
                const act_t *bx = xq + (size_t)m0 * G * GS;
                const struct xq *bs = xs + (size_t)m0 * G;
                const uint16_t *bsc = sp + (size_t)b * G * RB;
                int n0 = b * RB, cnt = N - n0 < RB ? N - n0 : RB;
                float *yb = y + (size_t)m0 * N + n0;
#ifdef BLOCK_TO_Y
#ifdef BLOCK_SUMS
                if (sums && mm == MB) block8_sums_avx512(bx, bs, G, bw, bsc, yb, N, cnt, sums);
                else
#endif
                BLOCK_TO_Y(bx, bs, mm, G, bw, bsc, yb, N, cnt);
#else
                float out[MB * RB];
                BLOCK(bx, bs, mm, G, bw, bsc, out);
                for (int i = 0; i < mm; i++)
                    memcpy(yb + (size_t)i * N, out + i * RB, sizeof(float) * cnt);
#endif
            }
        }
#ifdef BLOCK_SUMS
        free(sums);
#endif
    }
    free(xq);
    free(xs);
}

/* P independent one-row products in one parallel loop: y[p] [N] = f(x[p / xdiv]) W[sel[p]]^T,
 * W[e] being the e-th weight of wp / sp (all [N, K]), f given by mode as in q8_matmul (x's rows
 * hold 2K values in mode 2). A mixture of experts' decode step: the k experts a token chose run
 * as one loop over (expert, row block) pairs, with one thread team for all of them, instead of
 * k matmuls of a few hundred rows each (moe.c). */
void q8_matmul_sel(int P, const float *x, int xdiv, int K, const int8_t *const *wp,
                   const uint16_t *const *sp, const int64_t *sel, int N, float *y, int threads,
                   int mode) {
    int G = (K + GS - 1) / GS, NB = (N + RB - 1) / RB;
    act_t *xq = (act_t *)aligned_alloc(64, (((size_t)P * G * GS * sizeof(act_t) + 63) / 64) * 64);
    struct xq *xs = (struct xq *)malloc(sizeof(struct xq) * (size_t)P * G);
    size_t ldx = mode >= 2 ? 2 * (size_t)K : (size_t)K;
    if (threads < 1) threads = 1;
    int total = P * NB;
    int chunk = total / (threads * 8);
    chunk = chunk < 1 ? 1 : chunk > 16 ? 16 : chunk;
    #pragma omp parallel num_threads(threads)
    {
        float *row = (float *)malloc(sizeof(float) * (size_t)K);
        #pragma omp for schedule(static)
        for (int p = 0; p < P; p++) {
            prepare_row(x + (size_t)(p / xdiv) * ldx, K, mode, NULL, 0.f, row);
            quantize_row(row, K, G, xq + (size_t)p * G * GS, xs + (size_t)p * G);
        }
        free(row);
        #pragma omp for schedule(dynamic, chunk)
        for (int i = 0; i < total; i++) {
            int p = i / NB, b = i % NB;
            const int8_t *w = wp[sel[p]];
            const uint16_t *s = sp[sel[p]];
            int n0 = b * RB, cnt = N - n0 < RB ? N - n0 : RB;
#ifdef BLOCK_TO_Y
            BLOCK_TO_Y(xq + (size_t)p * G * GS, xs + (size_t)p * G, 1, G,
                       w + (size_t)b * G * GS * RB, s + (size_t)b * G * RB, y + (size_t)p * N + n0,
                       N, cnt);
#else
            float out[RB];
            BLOCK(xq + (size_t)p * G * GS, xs + (size_t)p * G, 1, G,
                  w + (size_t)b * G * GS * RB, s + (size_t)b * G * RB, out);
            memcpy(y + (size_t)p * N + n0, out, sizeof(float) * cnt);
#endif
        }
    }
    free(xq);
    free(xs);
}
