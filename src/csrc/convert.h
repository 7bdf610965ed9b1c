/* dtype sizes and conversions on raw bits (a uint32 holds fp32 bits or a 16-bit
 * value): fp16/bf16 <-> fp32, rounding to nearest even, NaN payloads kept. */
#ifndef GDNCONV_CONVERT_H
#define GDNCONV_CONVERT_H

#include "common.h"

/* Internal dtype code: bf16 stored with the AVX512-BF16 conversion instruction
 * (round to nearest even; the kernel rounds subnormals itself). Only SIMD kernels
 * see it. */
#define GDN_BF16_NATIVE 3

static inline int gdn_elsize(int dtype) { return dtype == GDN_F32 ? 4 : 2; }

static inline float gdn_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t gdn_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline double gdn_u2d(uint64_t u) { double f; memcpy(&f, &u, 8); return f; }
static inline uint64_t gdn_d2u(double f) { uint64_t u; memcpy(&u, &f, 8); return u; }

/* The conversions are branch-free (bit operations and selects) so that the channel
 * loops of the portable core vectorise. */
static inline float gdn_half_to_float(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t o = (h & 0x7fffu) << 13;
    /* Rescaling the shifted bits by 2^112 is exact for normal and subnormal halves;
     * inf and NaN (payload kept) get the fp32 exponent instead. */
    const uint32_t scaled = gdn_f2u(gdn_u2f(o) * 0x1p112f);
    return gdn_u2f(((h & 0x7c00u) == 0x7c00u ? o | 0x7f800000u : scaled) | sign);
}

static inline uint32_t gdn_float_to_half(float x) {  /* round to nearest even */
    const uint32_t u = gdn_f2u(x), sign = u & 0x80000000u, f = u ^ sign;
    /* overflow, inf or NaN (quiet, top payload kept) */
    const uint32_t big = f > 0x7f800000u ? 0x7e00u | ((f >> 13) & 0x3ffu) : 0x7c00u;
    /* subnormal or zero: adding 0.5 lets the FPU round at the half's last place */
    const uint32_t tiny = gdn_f2u(gdn_u2f(f) + 0.5f) - 0x3f000000u;
    /* normal: rebias the exponent by (15 - 127) << 23 and round */
    const uint32_t normal = (f + 0xc8000fffu + ((f >> 13) & 1u)) >> 13;
    const uint32_t o = f >= 0x47800000u ? big : f < 0x38800000u ? tiny : normal;
    return o | (sign >> 16);
}

/* Round to nearest even. Adding 0x7fff + lsb never carries out of a NaN whose low
 * 16 bits are zero, so its top half stays NaN: every NaN does when x, state,
 * weight and bias are all bf16 (arithmetic keeps an operand's payload or makes
 * the default NaN), and nan_check (a constant) is needed only with fp32 weights,
 * whose NaN payloads can carry. With it, a NaN is truncated, which keeps it NaN
 * because NaNs that come out of arithmetic are quiet (bit 22 set). */
static inline uint32_t gdn_float_to_bf16(float x, const int nan_check) {
    const uint32_t u = gdn_f2u(x);
    const uint32_t nan = nan_check && x != x ? 0xffffffffu : 0u;
    return (u + ((0x7fffu + ((u >> 16) & 1u)) & ~nan)) >> 16;
}

GDN_INLINE uint32_t gdn_load_raw(const void *base, int64_t idx, int dt) {
    return dt == GDN_F32 ? ((const uint32_t *)base)[idx] : ((const uint16_t *)base)[idx];
}

GDN_INLINE void gdn_store_raw(void *base, int64_t idx, uint32_t v, int dt) {
    if (dt == GDN_F32) ((uint32_t *)base)[idx] = v;
    else ((uint16_t *)base)[idx] = (uint16_t)v;
}

GDN_INLINE float gdn_raw_to_float(uint32_t v, int dt) {
    return dt == GDN_F32 ? gdn_u2f(v) : dt == GDN_BF16 ? gdn_u2f(v << 16) : gdn_half_to_float(v);
}

/* nan_check: see gdn_float_to_bf16 */
GDN_INLINE uint32_t gdn_float_to_raw(float f, int dt, const int nan_check) {
    return dt == GDN_F32 ? gdn_f2u(f) : dt == GDN_BF16 ? gdn_float_to_bf16(f, nan_check) : gdn_float_to_half(f);
}

#endif
