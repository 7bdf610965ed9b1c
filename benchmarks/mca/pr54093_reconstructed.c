/* vLLM PR 54093's NEON decode kernel, RECONSTRUCTED for llvm-mca (its source is not in
 * the reference stores this estimate could use; the PR text gives bf16 vbfdotq_f32,
 * 8-channel micro-tiles, width 4 only, a faster SiLU "with fexp"). The loop below is the
 * plainest kernel of that description, one token of 8 channels per iteration: the
 * (D, 3) bf16 state de-interleaved by LD3, taps paired with the input by ZIP1/ZIP2
 * (BFDOT takes adjacent pairs), weights pre-paired in registers, bias as the
 * accumulator, two BFDOTs per 4 channels, SiLU as x / (1 + exp(-x)) with a
 * degree-5 exp (Arm optimized-routines' expf shape: 2^n by the exponent bits) and a
 * vector divide, BFCVTN/BFCVTN2 to bf16, the state shifted back by ST3. Assumptions,
 * not the PR's code: benchmarks/README.md says what they change. */
#include <arm_neon.h>

#include "common.h"

GDN_TARGET_BEGIN(GDN_NEON_BF16_TARGET)

GDN_INLINE float32x4_t silu_exp(float32x4_t y) {
    const float32x4_t a = vnegq_f32(y);
    const float32x4_t sh = vdupq_n_f32(0x1.8p23f);
    const float32x4_t z = vfmaq_f32(sh, a, vdupq_n_f32(1.44269504f));
    const float32x4_t n = vsubq_f32(z, sh);
    float32x4_t r = vfmsq_f32(a, n, vdupq_n_f32(0x1.62e43p-1f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-0x1.05c61p-29f));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(0x1.0e4020p-7f), r, vdupq_n_f32(0x1.573e2ep-10f));
    p = vfmaq_f32(vdupq_n_f32(0x1.555e66p-5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0x1.fffdb6p-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const float32x4_t s = vreinterpretq_f32_u32(vaddq_u32(vshlq_n_u32(vreinterpretq_u32_f32(z), 23),
                                                          vdupq_n_u32(0x3f800000u - (0x4b400000u << 23))));
    return vdivq_f32(y, vfmaq_f32(vdupq_n_f32(1.0f), p, s));
}

void mca_pr54093(const uint16_t *st, uint16_t *so, const uint16_t *x, uint16_t *out, const uint16_t *wp,
                 const float *bias, int64_t n) {
    const bfloat16x8_t w01l = vld1q_bf16((const bfloat16_t *)wp), w01h = vld1q_bf16((const bfloat16_t *)wp + 8);
    const bfloat16x8_t w23l = vld1q_bf16((const bfloat16_t *)wp + 16), w23h = vld1q_bf16((const bfloat16_t *)wp + 24);
    const float32x4_t bl = vld1q_f32(bias), bh = vld1q_f32(bias + 4);
    for (int64_t i = 0; i < n; i++) {
        __asm__ volatile("# LLVM-MCA-BEGIN pr54093" ::: "memory");
        const uint16x8x3_t s = vld3q_u16(st + 24 * i);
        const uint16x8_t xv = vld1q_u16(x + 8 * i);
        const bfloat16x8_t p01l = vreinterpretq_bf16_u16(vzip1q_u16(s.val[0], s.val[1]));
        const bfloat16x8_t p01h = vreinterpretq_bf16_u16(vzip2q_u16(s.val[0], s.val[1]));
        const bfloat16x8_t p23l = vreinterpretq_bf16_u16(vzip1q_u16(s.val[2], xv));
        const bfloat16x8_t p23h = vreinterpretq_bf16_u16(vzip2q_u16(s.val[2], xv));
        float32x4_t al = vbfdotq_f32(vbfdotq_f32(bl, w01l, p01l), w23l, p23l);
        float32x4_t ah = vbfdotq_f32(vbfdotq_f32(bh, w01h, p01h), w23h, p23h);
        al = silu_exp(al), ah = silu_exp(ah);
        vst1q_bf16((bfloat16_t *)out + 8 * i, vcvtq_high_bf16_f32(vcvtq_low_bf16_f32(al), ah));
        const uint16x8x3_t ns = {{s.val[1], s.val[2], xv}};
        vst3q_u16(so + 24 * i, ns);
        __asm__ volatile("# LLVM-MCA-END pr54093" ::: "memory");
    }
}

GDN_TARGET_END
