/* Shared internals: request geometry, dtype conversion, the scalar per-channel core
 * used by the portable kernel and by the SIMD kernels for channel tails. */
#ifndef GDNCONV_CONV_COMMON_H
#define GDNCONV_CONV_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gdnconv/gdnconv.h"

#if defined(_MSC_VER) && !defined(__clang__)
#define GDN_INLINE static __forceinline
#define GDN_ALIGN64 __declspec(align(64))
#else
#define GDN_INLINE static inline __attribute__((always_inline))
#define GDN_ALIGN64 __attribute__((aligned(64)))
#endif

/* SIMD kernels are compiled where the compiler can target them from a baseline
 * build (GCC >= 10 or clang >= 9 on x86-64); elsewhere only the scalar kernel. */
#if (defined(__x86_64__) || defined(_M_X64)) && \
    ((defined(__clang__) && __clang_major__ >= 9) || \
     (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define GDN_HAVE_AVX2 1
#define GDN_HAVE_AVX512 1
#endif

/* Channels per unit of work (a multiple of 64), and requests per unit of the
 * portable kernel, which converts the weights of a chunk once for all of them
 * (SIMD units hold one request: see gdn_run). */
#define GDN_BLOCK_CHANNELS 256
#define GDN_BLOCK_REQUESTS 8

void gdn_kernel_scalar(const gdn_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
/* A SIMD ISA's weight conversion: weights and bias of channels [c0, c1) as fp32,
 * w[k * ld + c] and b[c] (see gdn_run). */
typedef void (*gdn_fill_fn)(const gdn_params *p, int64_t c0, int64_t c1, float *w, int64_t ld, float *b);
#ifdef GDN_HAVE_AVX2
void gdn_kernel_avx2(const gdn_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
void gdn_fill_avx2(const gdn_params *p, int64_t c0, int64_t c1, float *w, int64_t ld, float *b);
#endif
#ifdef GDN_HAVE_AVX512
void gdn_kernel_avx512(const gdn_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
void gdn_kernel_avx512bf16(const gdn_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
void gdn_fill_avx512(const gdn_params *p, int64_t c0, int64_t c1, float *w, int64_t ld, float *b);
#endif

/* ---- one request ---- */
/* Internal dtype code: bf16 stored with the AVX512-BF16 conversion instruction
 * (round to nearest even; the kernel rounds subnormals itself). Only SIMD
 * kernels see it. */
#define GDN_BF16_NATIVE 3

typedef struct gdn_request {
    int skip;        /* pad slot or no tokens: nothing read, nothing written */
    int64_t T;       /* tokens this step */
    int64_t off;     /* first window row: num_accepted_tokens - 1, or 0 */
    const char *x;   /* token 0, channel 0 (byte pointer) */
    char *out;
    char *state;     /* slot row 0, channel 0 */
} gdn_request;

static inline int gdn_elsize(int dtype) { return dtype == GDN_F32 ? 4 : 2; }

static inline int gdn_is_pad(const gdn_params *p, int64_t i) {
    return p->conv_state_indices && p->conv_state_indices[i] == p->pad_slot_id;
}

static inline gdn_request gdn_get_request(const gdn_params *p, int64_t i) {
    gdn_request r;
    const int64_t e = gdn_elsize(p->dtype);
    const int64_t slot = p->conv_state_indices ? p->conv_state_indices[i] : i;
    const int64_t start = p->query_start_loc ? p->query_start_loc[i] : 0;
    r.T = p->query_start_loc ? p->query_start_loc[i + 1] - start : p->seqlen;
    r.skip = r.T <= 0 || gdn_is_pad(p, i);
    r.off = p->num_accepted_tokens ? p->num_accepted_tokens[i] - 1 : 0;
    r.x = (const char *)p->x + e * (i * p->x_stride_b + start * p->x_stride_t);
    r.out = (char *)p->out + e * (i * p->out_stride_b + start * p->out_stride_t);
    r.state = r.skip ? NULL : (char *)p->conv_state + e * slot * p->state_stride_s;
    return r;
}

/* ---- dtype conversion on raw bits (uint32 holds fp32 bits or a 16-bit value) ---- */
static inline float gdn_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t gdn_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* The conversions and gdn_silu (dt is a constant) are branch-free (bit
 * operations and selects) so that the channel loops of the portable core
 * vectorise. */
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

/* silu(y) = y * sigmoid(y) for an output of dtype dt (a constant). NaN
 * propagates through y.
 *   16-bit outputs: arithmetic and bit operations only (selects here made GCC
 *     move them to the result and compute the division twice), so the loop
 *     vectorises to ~18 SSE2 operations per 4 outputs. y / (1 + 2^t), t = -y
 *     log2 e. b = (128 - t) 2^23 and a = (t + 127) 2^23 are clamped at 0 by
 *     their sign bits, so for every finite or infinite y the int32 of a is in
 *     [0, 255 << 23]: floor(t) + 127 in its exponent field, frac(t) in its
 *     mantissa. 2^t = 2^floor(t) q(m), m = 1 + frac(t), spans [0, inf]: t < -126
 *     gives 0 (y / 1), t >= 128 gives inf (y / inf = -0, and -inf / inf = NaN
 *     like the reference's -inf * 0). A NaN y with its sign bit clear reaches
 *     the conversion as NaN: Annex F (IEC 60559) makes that an unspecified
 *     value, and whatever it is y / (...) is NaN; masking the NaN first measured
 *     7% slower on the whole portable kernel. q approximates 2^(m-1) on [1, 2)
 *     with relative error 1.7e-3 (degree 2) for bf16, whose ulp is >= 2^-8
 *     relative, and 7.5e-5 (degree 3) for fp16 (ulp >= 2^-11), so the result
 *     stays within one ulp. For y in about (-97, -88.7) the true |silu| (up to
 *     2.6e-37) is a bf16 normal or subnormal and the result is -0: that is inside
 *     the fp32 accumulation noise of such a y (8 * 2^-24 * |y|), as for the
 *     AVX-512 kernel (AVX2's fp32 formulation gets those values).
 *   fp32 outputs: e = exp(-|y|) in (0, 1], a in [-150, 0], y / (1 + e) for
 *     y >= 0 and y e / (1 + e) below; exp(a) = 2^m q(r), r = a - m ln2 in
 *     [-ln2/2, ln2/2] by a two-constant reduction, q of degree 5 (2e-7), 2^m
 *     applied in two normal halves so subnormal results are right. */
/* 2^r on r in [0, 1), near-minimax in relative error, for the SIMD kernels'
 * 16-bit SiLU: degree 3 (7.5e-5) and degree 2 (1.7e-3), coefficients of r^3 (or
 * r^2) first. gdn_silu uses the same polynomials re-expanded in m = 1 + r. */
#define GDN_EXP2_DEG3 0.07802451401948929f, 0.22606724500656128f, 0.6958334445953369f, 0.9999252557754517f
#define GDN_EXP2_DEG2 0.337189257144928f, 0.6576361656188965f, 1.0017248392105103f

/* Sign bit set (-0, -inf, and a NaN with the sign bit) -> +0; a NaN without it
 * passes. */
static inline float gdn_clamp0(float a) {
    const uint32_t u = gdn_f2u(a);
    return gdn_u2f(u & ~(0u - (u >> 31)));
}

GDN_INLINE float gdn_silu(float y, const int dt) {
    if (dt != GDN_F32) {
        const float b = gdn_clamp0(y * (1.44269504f * 8388608.0f) + 1073741824.0f);
        const uint32_t bits = (uint32_t)(int32_t)gdn_clamp0(2139095040.0f - b);
        const uint32_t mant = bits & 0x007fffffu;
        const float m = gdn_u2f(mant | 0x3f800000u);
        float q;
        if (dt == GDN_BF16) {
            q = 0.337189257144928f * m + -0.016742324456572533f;
            q = q * m + 0.6812779307365417f;
        } else {
            q = 0.07802450656890869f * m + -0.008006353862583637f;
            q = q * m + 0.4777727425098419f;
            q = q * m + 0.45213431119918823f;
        }
        return y / (1.0f + gdn_u2f(bits ^ mant) * q);
    }
    float a = -fabsf(y);
    a = a < -150.0f ? -150.0f : a;
    const float m = (a * 1.44269504f + 12582912.0f) - 12582912.0f;  /* round to nearest */
    float r = a - m * 0.693359375f;
    r = r - m * -2.12194440e-4f;
    float q = 0.008297654800117016f * r + 0.04191538318991661f;
    q = q * r + 0.16667574644088745f;
    q = q * r + 0.49998894333839417f;
    q = q * r + 0.9999997019767761f;
    q = q * r + 1.0000001192092896f;
    const int32_t mi = (int32_t)m, m1 = mi / 2, m2 = mi - m1;      /* -217..0: halves >= -109 */
    const float e = q * gdn_u2f((uint32_t)(m1 + 127) << 23) * gdn_u2f((uint32_t)(m2 + 127) << 23);
    return y * ((y >= 0.0f ? 1.0f : e) / (1.0f + e));
}

/* Weights and bias of channels [c0, c0 + n) as fp32, tap-major: w[k * ld + c]. */
GDN_INLINE void gdn_fill_weights(const gdn_params *p, int64_t c0, int64_t n, float *w,
                                 int64_t ld, float *b, int wdt) {
    const int64_t W = p->width;
    for (int64_t c = 0; c < n; c++) {
        const int64_t row = (c0 + c) * p->weight_stride_d;
        for (int64_t k = 0; k < W; k++)
            w[k * ld + c] = gdn_raw_to_float(gdn_load_raw(p->weight, row + k * p->weight_stride_w, wdt), wdt);
        b[c] = p->bias ? gdn_raw_to_float(gdn_load_raw(p->bias, (c0 + c) * p->bias_stride, wdt), wdt) : 0.0f;
    }
}

/* Same, with the weight dtype resolved at run time (once per unit of work). */
static inline void gdn_fill_weights_any(const gdn_params *p, int64_t c0, int64_t n, float *w,
                                        int64_t ld, float *b) {
    if (p->weight_dtype == GDN_F32) gdn_fill_weights(p, c0, n, w, ld, b, GDN_F32);
    else if (p->weight_dtype == GDN_F16) gdn_fill_weights(p, c0, n, w, ld, b, GDN_F16);
    else gdn_fill_weights(p, c0, n, w, ld, b, GDN_BF16);
}

static inline void gdn_fill_bias(const gdn_params *p, int64_t c0, int64_t n, float *b) {
    for (int64_t c = 0; c < n; c++)
        b[c] = p->bias ? gdn_raw_to_float(gdn_load_raw(p->bias, (c0 + c) * p->bias_stride, p->weight_dtype),
                                          p->weight_dtype)
                       : 0.0f;
}

/* The portable core (conv_scalar.c): requests reqs[0..nreq) (skipped ones
 * ignored), channels [c0, c1), any strides. The SIMD kernels call it for the
 * channels past their last whole vector line. */
void gdn_scalar_range(const gdn_params *p, const gdn_request *reqs, int nreq, int64_t c0, int64_t c1);

#endif
