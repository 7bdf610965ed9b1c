/* SiLU: the one table of polynomial coefficients every kernel uses, and the scalar
 * silu of the portable kernel. */
#ifndef GDNCONV_SILU_H
#define GDNCONV_SILU_H

#include <math.h>

#include "convert.h"

/* fp32 outputs: exp(a) = 2^m q(r) for a = -|y| clamped at GDN_EXP_ARG_MIN,
 * m = round(a log2 e), r = a - m ln2 in [-ln2/2, ln2/2] by a two-constant
 * reduction, q near-minimax of degree 5 (relative error 2e-7), r^5 first. */
#define GDN_LOG2E 1.44269504f
#define GDN_LN2_HI 0.693359375f
#define GDN_LN2_LO -2.12194440e-4f
#define GDN_EXP_ARG_MIN -150.0f
/* For y < 0, silu = y e / (1 + e) is formed as (y eh / (1 + e)) 2^-64 with eh = e 2^64:
 * the only rounding into the subnormal range is the last one, so results below 2^-126
 * keep their precision. At the clamp (m = -216) eh = 2^-152 q rounds to 0, so a finite y
 * gives -0 and y = -inf gives -inf * 0 = NaN like the reference. Where nothing is
 * subnormal the bits are those of y (e / (1 + e)). */
#define GDN_EXP_DEG5 0.008297654800117016f, 0.04191538318991661f, 0.16667574644088745f, \
                     0.49998894333839417f, 0.9999997019767761f, 1.0000001192092896f
/* 16-bit outputs: 2^r on r in [0, 1), near-minimax in relative error: degree 3
 * (7.5e-5) for fp16, degree 2 (1.7e-3) for bf16, r^3 (or r^2) first. */
#define GDN_EXP2_DEG3 0.07802451401948929f, 0.22606724500656128f, 0.6958334445953369f, 0.9999252557754517f
#define GDN_EXP2_DEG2 0.337189257144928f, 0.6576361656188965f, 1.0017248392105103f
/* The same two polynomials re-expanded in m = 1 + r (the portable kernel gets m
 * from the exponent bits), m^3 (or m^2) first. */
#define GDN_EXP2_DEG3_M 0.07802450656890869f, -0.008006353862583637f, 0.4777727425098419f, 0.45213431119918823f
#define GDN_EXP2_DEG2_M 0.337189257144928f, -0.016742324456572533f, 0.6812779307365417f

/* bf16 outputs: the sigmoid's denominator 1 + 2^t is formed scaled by 2^-16 (and y
 * with it, which is exact for |y| >= 2^-110), so it stays finite up to t = 144
 * (y ~ -99.8) instead of overflowing at t = 128 (y ~ -88.7): results of y in about
 * [-97.4, -88.7), normal or subnormal bf16 down to 2^-133, come out instead of -0.
 * Below that the exact result rounds to -0. Where nothing underflows the scaling
 * gives the same bits as the unscaled formula. fp16 results underflow long before
 * (y < -20), so fp16 keeps the unscaled formula. */
#define GDN_BF16_DEN_SCALE 0x1p-16f
#define GDN_BF16_DEN_SHIFT 16

/* Sign bit set (-0, -inf, and a NaN with the sign bit) -> +0; a NaN without it
 * passes. */
static inline float gdn_clamp0(float a) {
    const uint32_t u = gdn_f2u(a);
    return gdn_u2f(u & ~(0u - (u >> 31)));
}

/* silu(y) = y * sigmoid(y) for an output of dtype dt (a constant). NaN
 * propagates through y. Every path is within one ulp of the correctly rounded
 * result for 16-bit outputs, every input included (tests/test_silu.py).
 *   16-bit outputs: arithmetic and bit operations only, so the loop vectorises to
 *     ~20 SSE2 operations per 4 outputs (each select here risks GCC moving it to
 *     the result and dividing twice: the bf16 one does move to the denominator,
 *     which still divides once). y / (1 + 2^t), t = -y log2 e. b = (128 - t) 2^23
 *     (fp16: clamped at 0 by its sign bit) and a = (t + 127 - k) 2^23 (clamped at
 *     0 by its sign bit, bf16 also at 255 << 23), k = 0 for fp16 and
 *     GDN_BF16_DEN_SHIFT for bf16, so for every finite or infinite y the int32 of a
 *     is in [0, 255 << 23]: floor(t) + 127 - k in its exponent field, frac(t) in
 *     its mantissa. 2^(t-k) = 2^(floor(t)-k) q(m), m = 1 + frac(t), spans [0, inf]:
 *     t < k - 126 gives 0 (y / 1), t >= 128 + k gives inf (y / inf = -0, and -inf /
 *     inf = NaN like the reference's -inf * 0). bf16 divides y 2^-k by 2^-k + 2^(t-k)
 *     (GDN_BF16_DEN_SCALE above), so results down to bf16's smallest subnormal
 *     come out. A NaN y with its sign bit clear reaches the conversion as NaN:
 *     Annex F (IEC 60559) makes that an unspecified value, and whatever it is
 *     y / (...) is NaN; masking the NaN first measured 7% slower on the whole
 *     portable kernel. q is GDN_EXP2_DEG2_M (bf16, whose ulp is >= 2^-8 relative)
 *     or GDN_EXP2_DEG3_M (fp16, ulp >= 2^-11).
 *   fp32 outputs: e = exp(-|y|) in (0, 1] as above, y / (1 + e) for y >= 0 and
 *     (y eh / (1 + e)) 2^-64 below, eh = e 2^64 from 2^(m+64) in two normal halves,
 *     so subnormal results are rounded once (see GDN_EXP_DEG5); within 5 ulp. */
GDN_INLINE float gdn_silu(float y, const int dt) {
    if (dt != GDN_F32) {
        static const float c3[] = {GDN_EXP2_DEG3_M}, c2[] = {GDN_EXP2_DEG2_M};
        const float *c = dt == GDN_BF16 ? c2 : c3;
        const int deg = dt == GDN_BF16 ? 2 : 3;
        const float s = dt == GDN_BF16 ? GDN_BF16_DEN_SCALE : 1.0f;
        const float k23 = dt == GDN_BF16 ? (float)(GDN_BF16_DEN_SHIFT << 23) : 0.0f;
        float b = y * (GDN_LOG2E * 8388608.0f) + 1073741824.0f;
        if (dt != GDN_BF16) b = gdn_clamp0(b);
        float a = (2139095040.0f - b) - k23;
        if (dt == GDN_BF16) a = a < 2139095040.0f ? a : 2139095040.0f;
        const uint32_t bits = (uint32_t)(int32_t)gdn_clamp0(a);
        const uint32_t mant = bits & 0x007fffffu;
        const float m = gdn_u2f(mant | 0x3f800000u);
        float q = c[0] * m + c[1];
        for (int k = 2; k <= deg; k++) q = q * m + c[k];
        return (y * s) / (s + gdn_u2f(bits ^ mant) * q);
    }
    static const float c5[] = {GDN_EXP_DEG5};
    float a = -fabsf(y);
    a = a < GDN_EXP_ARG_MIN ? GDN_EXP_ARG_MIN : a;
    const float m = (a * GDN_LOG2E + 12582912.0f) - 12582912.0f;  /* round to nearest */
    float r = a - m * GDN_LN2_HI;
    r = r - m * GDN_LN2_LO;
    float q = c5[0] * r + c5[1];
    for (int k = 2; k < 6; k++) q = q * r + c5[k];
    const int32_t mi = (int32_t)m, m1 = mi / 2, m2 = mi - m1;      /* -217..0: halves >= -109 */
    const float eh = q * gdn_u2f((uint32_t)(m1 + 127 + 32) << 23) * gdn_u2f((uint32_t)(m2 + 127 + 32) << 23);
    /* the 2^-64 from the sign bit, not a second select (GCC then divides twice) */
    const float sc = gdn_u2f(0x3f800000u - ((gdn_f2u(y) >> 31) << 29));
    return y * ((y >= 0.0f ? 1.0f : eh) / (1.0f + eh * 0x1p-64f)) * sc;
}

#endif
