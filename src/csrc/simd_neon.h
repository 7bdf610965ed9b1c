/* NEON (Advanced SIMD, every Armv8-A CPU) primitives for the shared SIMD bodies: 4
 * channels per q register, fp32 arithmetic, a line step of 4 vectors (16 channels).
 * Included after <arm_neon.h>; with GDN_SIMD_BF16_NATIVE defined (and +bf16 in the
 * including file's target region) bf16 is also stored with BFCVTN (dtype code
 * GDN_BF16_NATIVE).
 *
 * The arithmetic is AVX2's (simd_avx2.h), operation for operation, with three
 * substitutions: AVX2's fmsub/fnmsub become FMLA/FMLS on a negated addend (the same
 * single rounding, signed zeros included); its 8-entry vpermps tables are TBL on two
 * q registers; its rcp (2^-11) is FRECPE (2^-8) for the fp32 correction step (which
 * scales a remainder of ~1 ulp, so 2^-8 adds ~0.004 ulp) and FRECPE + one FRECPS step
 * (~2^-16) for bf16. So outputs without SiLU, fp16 SiLU and the states are AVX2's and
 * AVX-512's bits; fp32 and bf16 SiLU are within the same one-ulp bound but may differ
 * from x86 in the last place where the reciprocal estimates differ. */
#ifndef GDNCONV_SIMD_NEON_H
#define GDNCONV_SIMD_NEON_H

#include "silu.h"

typedef float32x4_t V;
typedef uint32x4_t R;  /* fp32 bits, or 4 x 16-bit in the low 64 bits */
#define LANES 4

GDN_INLINE R ld_raw(const char *p, int dt) {
    if (dt == GDN_F32) return vreinterpretq_u32_u8(vld1q_u8((const uint8_t *)p));
    return vreinterpretq_u32_u8(vcombine_u8(vld1_u8((const uint8_t *)p), vdup_n_u8(0)));
}

GDN_INLINE void st_raw(char *p, R v, int dt) {
    if (dt == GDN_F32) vst1q_u8((uint8_t *)p, vreinterpretq_u8_u32(v));
    else vst1_u8((uint8_t *)p, vget_low_u8(vreinterpretq_u8_u32(v)));
}

/* PRFM PLDL1KEEP / PSTL1KEEP: prefetches of the next unit's (update) or tile's (prefill) rows */
#define SIMD_PREFETCH_R(p) __builtin_prefetch((p), 0, 3)
#define SIMD_PREFETCH_W(p) __builtin_prefetch((p), 1, 3)

GDN_INLINE V to_f32(R v, int dt) {
    if (dt == GDN_F32) return vreinterpretq_f32_u32(v);
    if (dt == GDN_F16) return vcvt_f32_f16(vreinterpret_f16_u32(vget_low_u32(v)));
    return vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(vreinterpretq_u16_u32(v)), 16));  /* bf16 */
}

GDN_INLINE R from_f32(V v, int dt) {
    if (dt == GDN_F32) return vreinterpretq_u32_f32(v);
    uint16x4_t h;
    if (dt == GDN_F16) {
        h = vreinterpret_u16_f16(vcvt_f16_f32(v));   /* FCVTN: nearest even, NaN quiet with its top payload */
#ifdef GDN_SIMD_BF16_NATIVE
    } else if (dt == GDN_BF16_NATIVE) {
        /* BFCVTN rounds to nearest even (FPCR.RMode) and keeps subnormals (FPCR.FZ is 0 on
         * Linux), a NaN made quiet with its sign and top payload: the bits of the integer
         * rounding below (scripts/test_aarch64.sh --quick checks them against it) */
        h = vreinterpret_u16_bf16(vcvt_bf16_f32(v));
#endif
    } else {
        /* bf16, round to nearest even on the bits; NaN keeps its sign and top payload, made quiet */
        const uint32x4_t u = vreinterpretq_u32_f32(v);
        const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
        const uint16x4_t r = vaddhn_u32(vaddq_u32(u, lsb), vdupq_n_u32(0x7fff));
        const uint16x4_t nan = vorr_u16(vshrn_n_u32(u, 16), vdup_n_u16(0x40));
        h = vbsl_u16(vmovn_u32(vceqq_f32(v, v)), r, nan);
    }
    return vreinterpretq_u32_u16(vcombine_u16(h, vdup_n_u16(0)));
}

GDN_INLINE V vload(const float *p) { return vld1q_f32(p); }
GDN_INLINE void vstore(float *p, V v) { vst1q_f32(p, v); }
GDN_INLINE V vfma(V a, V b, V c) { return vfmaq_f32(c, a, b); }

/* LANES 32-bit lanes each holding two bf16 values (vLLM's packed weight: taps 2j and
 * 2j + 1 of a channel) as fp32: the low halves to *lo, the high halves to *hi. */
GDN_INLINE void wpair(const uint16_t *p, V *lo, V *hi) {
    const uint32x4_t v = vld1q_u32((const uint32_t *)p);
    *lo = vreinterpretq_f32_u32(vshlq_n_u32(v, 16));
    *hi = vreinterpretq_f32_u32(vandq_u32(v, vdupq_n_u32(0xffff0000u)));
}

/* Lane j takes flat element j*W + k of v[0..W-1] (the weight conversion only, once per
 * unit: through memory). */
GDN_INLINE V gather_taps(const V *v, const int W, const int k) {
    float t[GDN_MAX_WIDTH * LANES];
    for (int m = 0; m < W; m++) vst1q_f32(t + LANES * m, v[m]);
    const float r[LANES] = {t[k], t[W + k], t[2 * W + k], t[3 * W + k]};
    return vld1q_f32(r);
}

/* lane i <- 32-bit entry (idx_i mod 8) of an 8-entry table: TBL on byte indices 4j..4j+3 */
GDN_INLINE uint8x16_t tbl8_index(uint32x4_t idx) {
    return vreinterpretq_u8_u32(vmlaq_u32(vdupq_n_u32(0x03020100u), vandq_u32(idx, vdupq_n_u32(7)),
                                          vdupq_n_u32(0x04040404u)));
}
GDN_INLINE uint32x4_t tbl8(uint8x16x2_t t, uint8x16_t bi) { return vreinterpretq_u32_u8(vqtbl2q_u8(t, bi)); }

/* silu(y) = y * sigmoid(y), each step across all n vectors: simd_avx2.h's vsilu_n (its
 * comment gives the method and the bounds) with the substitutions above. FMINNM /
 * FMAXNM return the constant for a NaN y, as x86's min/max do with the constant second. */
#define EACH for (int i = 0; i < n; i++)
GDN_INLINE void vsilu_n(V *y, const int n, const int dt) {
    if (dt != GDN_F32) {
        V a[4], m[4], r[4], q[4], e[4];
        /* bf16: 1 + 2^t and y scaled by s = 2^-16 (silu.h), t in [-111, 144] */
        const int k = dt == GDN_F16 ? 0 : GDN_BF16_DEN_SHIFT;
        const float s = dt == GDN_F16 ? 1.0f : GDN_BF16_DEN_SCALE;
#pragma GCC unroll 4
        EACH m[i] = vminnmq_f32(vmaxnmq_f32(vmulq_n_f32(y[i], -GDN_LOG2E), vdupq_n_f32(-127.0f + k)),
                                vdupq_n_f32(128.0f + k));
#pragma GCC unroll 4
        EACH a[i] = vrndmq_f32(m[i]);
#pragma GCC unroll 4
        EACH r[i] = vsubq_f32(m[i], a[i]);
        static const float c[] = {GDN_EXP2_DEG3};
#pragma GCC unroll 4
        EACH q[i] = vdupq_n_f32(c[0]);
#pragma GCC unroll 3
        for (int j = 1; j <= 3; j++)
#pragma GCC unroll 4
            EACH q[i] = vfmaq_f32(vdupq_n_f32(c[j]), q[i], r[i]);
#pragma GCC unroll 4
        EACH e[i] = vaddq_f32(vdupq_n_f32(s), vmulq_f32(q[i], vreinterpretq_f32_s32(vshlq_n_s32(
                        vaddq_s32(vcvtq_s32_f32(a[i]), vdupq_n_s32(127 - k)), 23))));
        if (dt == GDN_F16) {  /* y / (1 + 2^t), as AVX2 */
#pragma GCC unroll 4
            EACH y[i] = vdivq_f32(y[i], e[i]);
        } else {   /* FRECPS gives 2 for inf * 0, so 2^t = inf gives a reciprocal of 0, not NaN */
#pragma GCC unroll 4
            EACH {
                const V d = vrecpeq_f32(e[i]);
                y[i] = vmulq_f32(vmulq_n_f32(y[i], s), vmulq_f32(d, vrecpsq_f32(e[i], d)));
            }
        }
        return;
    }
    /* fp32: y / (1 + exp(-y)) in float lanes, the denominator as s1 + eh + x (silu.h's GDN_EXP2_8) */
    static const float th[] = {GDN_EXP2_8_HI}, tl[] = {GDN_EXP2_8_LO}, c[] = {GDN_EXPM1_8};
    /* 2^(j/8) bits less j << 20 (t << 20 adds it back with floor(k/8) << 23) and 2^28 (sign below) */
    static const uint32_t tsub[8] = {0x10000000, 0x10100000, 0x10200000, 0x10300000,
                                     0x10400000, 0x10500000, 0x10600000, 0x10700000};
    const uint8x16x2_t tb = {{
        vreinterpretq_u8_u32(vsubq_u32(vreinterpretq_u32_f32(vld1q_f32(th)), vld1q_u32(tsub))),
        vreinterpretq_u8_u32(vsubq_u32(vreinterpretq_u32_f32(vld1q_f32(th + 4)), vld1q_u32(tsub + 4)))}};
    const uint8x16x2_t tlv = {{vreinterpretq_u8_f32(vld1q_f32(tl)), vreinterpretq_u8_f32(vld1q_f32(tl + 4))}};
    const V magic = vdupq_n_f32(GDN_EXP2_8_MAGIC);
    V sp[4], yn[4], a[4], t[4], r[4], p[4], s1[4], eh[4], x[4], d[4], q[4];
    uint8x16_t bi[4];
#pragma GCC unroll 4
    EACH {   /* +inf -> FLT_MAX and sp = -inf; -inf, NaN: sp = NaN; finite: sp = +0 */
        const V yc = vminnmq_f32(y[i], vdupq_n_f32(0x1.fffffep127f));
        sp[i] = vsubq_f32(yc, y[i]);
        yn[i] = vmaxnmq_f32(yc, vdupq_n_f32(GDN_SILU_LO));
    }
#pragma GCC unroll 4
    EACH a[i] = vminnmq_f32(yn[i], vdupq_n_f32(GDN_SILU_HI));
#pragma GCC unroll 4
    EACH t[i] = vfmaq_f32(magic, a[i], vdupq_n_f32(-GDN_LOG2E));  /* magic + k/8 */
#pragma GCC unroll 4
    EACH bi[i] = tbl8_index(vreinterpretq_u32_f32(t[i]));
#pragma GCC unroll 4
    EACH {   /* r = -a - (k/8) ln2 + tl[k mod 8], the ln2 hi step exact */
        const V m = vsubq_f32(t[i], magic);
        r[i] = vfmsq_f32(vnegq_f32(a[i]), m, vdupq_n_f32(GDN_LN2_HI));
        r[i] = vfmsq_f32(r[i], m, vdupq_n_f32(GDN_LN2_LO));
        r[i] = vaddq_f32(r[i], vreinterpretq_f32_u32(tbl8(tlv, bi[i])));
    }
#pragma GCC unroll 4
    EACH {   /* expm1(r) */
        const V r2 = vmulq_f32(r[i], r[i]);
        p[i] = vfmaq_f32(vdupq_n_f32(c[2]), vfmaq_f32(vdupq_n_f32(c[1]), r[i], vdupq_n_f32(c[0])), r[i]);
        p[i] = vfmaq_f32(r[i], r2, p[i]);
    }
#pragma GCC unroll 4
    EACH {   /* sg = 2^28 (y > 0), -2^28 (y < 0, -0), 0 (+0) on bits less 2^28: s1, eh scaled by 1, 2^-64, 2^-32 */
        const int32x4_t yi = vreinterpretq_s32_f32(y[i]);
        const uint32x4_t sg = vshlq_n_u32(vsubq_u32(vcltzq_s32(yi), vcgtzq_s32(yi)), 28);
        s1[i] = vreinterpretq_f32_u32(vaddq_u32(sg, vdupq_n_u32(0x3f800000u - (1u << 28))));
        const uint32x4_t ti = vreinterpretq_u32_f32(t[i]);
        eh[i] = vreinterpretq_f32_u32(vaddq_u32(vaddq_u32(tbl8(tb, bi[i]), sg), vshlq_n_u32(ti, 20)));
    }
#pragma GCC unroll 4
    EACH x[i] = vmulq_f32(eh[i], p[i]);
#pragma GCC unroll 4
    EACH d[i] = vaddq_f32(vaddq_f32(s1[i], eh[i]), x[i]);
#pragma GCC unroll 4
    EACH q[i] = vdivq_f32(yn[i], d[i]);
#pragma GCC unroll 4
    EACH d[i] = vrecpeq_f32(d[i]);
#pragma GCC unroll 4
    EACH {   /* q - (q (s1 + eh + x) - yn) d, the larger of s1, eh first */
        V rm = vfmaq_f32(vnegq_f32(yn[i]), q[i], vmaxq_f32(s1[i], eh[i]));
        rm = vfmaq_f32(rm, q[i], vminq_f32(s1[i], eh[i]));
        rm = vfmaq_f32(rm, q[i], x[i]);
        q[i] = vfmsq_f32(q[i], rm, d[i]);
    }
#pragma GCC unroll 4
    EACH y[i] = vfmaq_f32(vnegq_f32(sp[i]), q[i], s1[i]);
}
#undef EACH

/* ---- transposition of a time-contiguous state (update_simd.h's tc_load / tc_save) ----
 * One 16-byte row of channels (TC_LINE(e): 4 fp32 or 8 16-bit) at a time, as bytes. In:
 * the line's block (element (k, j) at j*sd + k) is sd q registers, and row k takes byte
 * i = j*e + b from block byte (j*sd + k)*e + b; out: block register m takes byte i from
 * row k, byte j*e + b, where m*16 + i = (j*sd + k)*e + b. Each gather is one TBL (or TBL
 * and TBX for more than 4 registers) with the byte indices the plan holds. Without a
 * masked store, rows go back by vectors only when the block has no gaps (sd == R), by
 * the element loop otherwise (as AVX2's 16-bit rows). */
#define TC_LINE(e) (16 / (e))

typedef struct {
    uint8x16_t idx[GDN_MAX_WIDTH];   /* in: per row k; out: per block register m */
} tc_plan;

GDN_INLINE void tc_plan_in(tc_plan *t, const int sd, const int R, const int e) {
    for (int k = 0; k < R; k++) {
        uint8_t b[16];
        for (int i = 0; i < 16; i++) b[i] = (uint8_t)((i / e * sd + k) * e + i % e);
        t->idx[k] = vld1q_u8(b);
    }
}

GDN_INLINE void tc_plan_out(tc_plan *t, const int sd, const int R, const int e) {
    (void)R;
    for (int m = 0; m < sd; m++) {
        uint8_t b[16];
        for (int i = 0; i < 16; i++) {
            const int el = (m * 16 + i) / e, j = el / sd, k = el % sd;
            b[i] = (uint8_t)(k * 16 + j * e + i % e);
        }
        t->idx[m] = vld1q_u8(b);
    }
}

GDN_INLINE int tc_out_ok(const int sd, const int R, const int e) { (void)e; return sd == R; }

/* byte idx_i of v[0..n-1] (n <= 8, idx < 16 n) */
GDN_INLINE uint8x16_t tc_gather(const uint8x16_t *v, const int n, uint8x16_t idx) {
    if (n == 1) return vqtbl1q_u8(v[0], idx);
    if (n == 2) return vqtbl2q_u8((uint8x16x2_t){{v[0], v[1]}}, idx);
    if (n == 3) return vqtbl3q_u8((uint8x16x3_t){{v[0], v[1], v[2]}}, idx);
    const uint8x16_t r = vqtbl4q_u8((uint8x16x4_t){{v[0], v[1], v[2], v[3]}}, idx);
    if (n == 4) return r;
    /* indices 64..: the upper registers (TBX keeps lanes whose index is out of its range) */
    const uint8x16x4_t hi = {{v[4], n > 5 ? v[5] : v[4], n > 6 ? v[6] : v[4], n > 7 ? v[7] : v[4]}};
    return vqtbx4q_u8(r, hi, vsubq_u8(idx, vdupq_n_u8(64)));
}

GDN_INLINE void tc_in(char *dst, int64_t bs, const char *src, const int sd, const int R, const tc_plan *t,
                      const int e) {
    (void)e;
    uint8x16_t v[GDN_MAX_WIDTH];
#pragma GCC unroll 8
    for (int m = 0; m < sd; m++) v[m] = vld1q_u8((const uint8_t *)src + 16 * m);
#pragma GCC unroll 8
    for (int k = 0; k < R; k++) vst1q_u8((uint8_t *)dst + k * bs, tc_gather(v, sd, t->idx[k]));
}

GDN_INLINE void tc_out(char *dst, const int sd, const int R, const char *src, int64_t bs, const tc_plan *t,
                       const int e) {
    (void)e, (void)R;   /* R == sd (tc_out_ok) */
    uint8x16_t v[GDN_MAX_WIDTH];
#pragma GCC unroll 8
    for (int k = 0; k < sd; k++) v[k] = vld1q_u8((const uint8_t *)src + k * bs);
#pragma GCC unroll 8
    for (int m = 0; m < sd; m++) vst1q_u8((uint8_t *)dst + 16 * m, tc_gather(v, sd, t->idx[m]));
}

/* keeps the compiler from seeing through a register (see update_simd.h's simd_copy) */
#define GDN_SIMD_OPAQUE(v) __asm__("" : "+w"(v))

#endif
