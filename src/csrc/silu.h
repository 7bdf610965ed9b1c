/* SiLU: the one table of polynomial coefficients every kernel uses, and the scalar
 * silu of the portable kernel. */
#ifndef GDNCONV_SILU_H
#define GDNCONV_SILU_H

#include <math.h>

#include "convert.h"

/* fp32 outputs, in double (the portable kernel; AVX2 and AVX-512 in float lanes, below):
 * e = exp(a) = 2^m q(r) for a = -|y| clamped at GDN_EXP_ARG_MIN, m = round(a log2 e), r = a - m ln2 in [-ln2/2, ln2/2] (one constant:
 * |m| <= 1443 makes r's error ~1e-13), q near-minimax of degree 6 (relative error
 * 1.9e-9; degree 5 has 7.5e-8, more than the 2^-24 that one ulp of the result allows
 * at worst). silu = (y < 0 ? y e : y) / (1 + e), the reciprocal to ~4e-9, then one
 * rounding to float: the value before it is within ~0.1 ulp of the exact result, so
 * the result is within one ulp of the correctly rounded one for every input (subnormal
 * results too, which the one rounding makes: tests/test_silu.py, and
 * benchmarks/silu_exhaustive.c over all 2^32 inputs). e stays a normal double down to
 * y ~ -708 and underflows to 0 below y ~ -745 (the result underflows to -0 from
 * y ~ -104 on); at the clamp (m = -1443) e is 0, so y = -inf gives -inf * 0 = NaN
 * like the reference. */
#define GDN_LOG2E_D 1.4426950408889634
#define GDN_LN2_D 0.6931471805599453
#define GDN_EXP_ARG_MIN -1000.0
#define GDN_EXP_DEG6 0.0013836845556505085, 0.008374815802223545, 0.041668225577458175, \
                     0.16666420169881113, 0.49999992079780364, 1.000000036323189, 1.000000000554169
/* fp32 outputs on AVX-512, in float lanes with hi + lo parts (simd_avx512.h's vsilu_n
 * says how): 2^(j/32) as hi + lo floats (j = 0..31, together within 2^-48), ln 2 as hi
 * (float(ln 2), so (k/32) hi is exact in an FMA) + lo, expm1 on [-ln2/64, ln2/64] as
 * r + r^2 (c[1] + c[0] r) (near-minimax, 1e-10), the magic constant 1.5 2^18 whose
 * float grid is 1/32 (the sum's low 5 mantissa bits are k mod 32, the table index),
 * the clamp of y (below -120 the result is -0, above 120 it is y) and the vfixupimm
 * table: +-0 and +inf give y, -inf gives NaN, other classes keep the result. */
#define GDN_EXP2_32_HI 0x1p+0f, 0x1.059b0ep+0f, 0x1.0b5586p+0f, 0x1.11301ep+0f, 0x1.172b84p+0f, \
    0x1.1d4874p+0f, 0x1.2387a6p+0f, 0x1.29e9ep+0f, 0x1.306fep+0f, 0x1.371a74p+0f, 0x1.3dea64p+0f, \
    0x1.44e086p+0f, 0x1.4bfdaep+0f, 0x1.5342b6p+0f, 0x1.5ab07ep+0f, 0x1.6247ecp+0f, 0x1.6a09e6p+0f, \
    0x1.71f75ep+0f, 0x1.7a1148p+0f, 0x1.82589ap+0f, 0x1.8ace54p+0f, 0x1.93737cp+0f, 0x1.9c4918p+0f, \
    0x1.a5503cp+0f, 0x1.ae89fap+0f, 0x1.b7f77p+0f, 0x1.c199bep+0f, 0x1.cb720ep+0f, 0x1.d5818ep+0f, \
    0x1.dfc974p+0f, 0x1.ea4afap+0f, 0x1.f50766p+0f
#define GDN_EXP2_32_LO 0.0f, -0x1.9d4f52p-25f, 0x1.9f3122p-25f, -0x1.fdb496p-25f, -0x1.c15742p-27f, \
    -0x1.d2e8cap-25f, 0x1.ceac48p-25f, -0x1.5c0424p-25f, 0x1.4636e2p-25f, -0x1.18aac6p-25f, \
    0x1.824684p-25f, 0x1.8624b4p-30f, -0x1.593abcp-25f, -0x1.2c561p-25f, -0x1.5bd5ecp-27f, \
    -0x1.f8b55p-25f, 0x1.9fcef4p-26f, 0x1.1d8beep-25f, -0x1.829fdp-25f, -0x1.accc7cp-26f, \
    0x1.15506ep-27f, -0x1.e64744p-25f, 0x1.51f848p-27f, -0x1.b83b54p-25f, -0x1.a94b14p-26f, \
    -0x1.a09438p-25f, -0x1.3d56b2p-27f, -0x1.8837ccp-27f, -0x1.822dbcp-27f, -0x1.908c94p-25f, \
    0x1.52486cp-27f, -0x1.246ebp-26f
#define GDN_LN2_HI 0x1.62e43p-1f
#define GDN_LN2_LO -0x1.05c61p-29f
#define GDN_EXPM1_32 0x1.5555cep-3f, 0x1.000088p-1f
#define GDN_EXP2_32_MAGIC 0x1.8p18f
#define GDN_SILU_CLAMP 120.0f
#define GDN_SILU_FIXUP 0x00130100
/* fp32 outputs on AVX2 (simd_avx2.h's vsilu_n says how), ln 2 as GDN_LN2_HI + LO above:
 * 2^(j/8) (j = 0..7) as float hi and lo = ln(2^(j/8) / hi) (|lo| < 3.2e-8, added to r;
 * hi rounded to float, lo from mpmath at 100 bits), expm1 on |r| <= ln2/16 as r + r^2 (c[2] + r (c[1] +
 * r c[0])): fit by Lawson's iteration (weighted least squares towards minimax) of
 * (expm1(r) - r) / r^2 on 4000 Chebyshev points, weight r^2 / e^r, coefficients then
 * rounded to float; error relative to e^r 1.9e-10 (degree 3: 2.6e-8, too close to the
 * 2^-24 that one ulp allows once the other errors add). The magic constant 1.5 2^20,
 * whose float grid is 1/8; the clamps of y: the result rounds to -0 below -110 (silu(-110)
 * ~ 2^-152) and e^110 2^-64 is finite; above 64 it is y, and e^-64 keeps e a normal float. */
#define GDN_EXP2_8_HI 0x1p+0f, 0x1.172b84p+0f, 0x1.306fep+0f, 0x1.4bfdaep+0f, 0x1.6a09e6p+0f, \
    0x1.8ace54p+0f, 0x1.ae89fap+0f, 0x1.d5818ep+0f
#define GDN_EXP2_8_LO 0.0f, -0x1.9c0c22p-27f, 0x1.125002p-25f, -0x1.0a3552p-25f, 0x1.26055cp-26f, \
    0x1.67a1cap-28f, -0x1.f9c306p-27f, -0x1.a5217cp-28f
#define GDN_EXPM1_8 0x1.554842p-5f, 0x1.555c76p-3f, 0.5f
#define GDN_EXP2_8_MAGIC 0x1.8p20f
#define GDN_SILU_LO -110.0f
#define GDN_SILU_HI 64.0f
/* float log2 e, for the 16-bit paths */
#define GDN_LOG2E 1.44269504f
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
 *   fp32 outputs: in double as GDN_EXP_DEG6 says, so within one ulp for every input;
 *     2^m as 2^m1 2^m2, m1 = round(a log2 e / 2), both normal doubles (m1, m2 >=
 *     -722), their exponent fields from the low bits of m_i + 1.5 2^52, so the loop
 *     has no float-int conversions and vectorises (2 doubles per SSE2 vector). */
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
    static const double c6[] = {GDN_EXP_DEG6};
    const double yd = y, magic = 0x1.8p52;
    double a = -fabs(yd);
    a = a < GDN_EXP_ARG_MIN ? GDN_EXP_ARG_MIN : a;                  /* NaN passes */
    const double t = a * GDN_LOG2E_D + magic, m = t - magic;         /* round to nearest */
    const double t1 = a * (0.5 * GDN_LOG2E_D) + magic, t2 = (m - (t1 - magic)) + magic;
    const double r = a - m * GDN_LN2_D;
    double q = c6[0] * r + c6[1];
    for (int k = 2; k < 7; k++) q = q * r + c6[k];
    const double e = q * gdn_u2d((gdn_d2u(t1) + 1023u) << 52) * gdn_u2d((gdn_d2u(t2) + 1023u) << 52);
    return (float)(yd * (yd < 0.0 ? e : 1.0) / (1.0 + e));
}

#endif
