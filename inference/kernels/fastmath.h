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

#endif
