/* AVX-512 primitives for the shared SIMD bodies (F/BW/VL/DQ + FMA + F16C): 16
 * channels per zmm, fp32 arithmetic. Included inside the including file's target
 * region; with GDN_SIMD_BF16_NATIVE defined (and avx512bf16 in that region) bf16 is
 * also stored with vcvtneps2bf16 (dtype code GDN_BF16_NATIVE). */
#ifndef GDNCONV_SIMD_AVX512_H
#define GDNCONV_SIMD_AVX512_H

#include "silu.h"

typedef __m512 V;
typedef __m512i R;  /* fp32 bits, or 16 x 16-bit in the low 256 bits */
#define LANES 16

GDN_INLINE R ld_raw(const char *p, int dt) {
    return dt == GDN_F32 ? _mm512_loadu_si512(p) : _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p));
}

GDN_INLINE void st_raw(char *p, R v, int dt) {
    if (dt == GDN_F32) _mm512_storeu_si512(p, v);
    else _mm256_storeu_si256((__m256i *)p, _mm512_castsi512_si256(v));
}

/* prefetches of the next unit's (update) or tile's (prefill) rows: prefetcht0 for read
 * rows, prefetchw for written ones (every AVX-512 CPU has PRFCHW) */
#define SIMD_PREFETCH_R(p) _mm_prefetch((p), _MM_HINT_T0)
#define SIMD_PREFETCH_W(p) _mm_prefetch((p), _MM_HINT_ET0)

/* the update's one-token steps take twice the vectors (update_simd.h: 32 registers hold
 * them; one token uses each weight once, so the loads fold into the FMAs) */
#define SIMD_WIDE_T1 1

/* decode of a channel-contiguous state in place (update_simd.h's sd_direct): one token
 * warm 0.87-0.89x the staged path's time here, four (speculative) 0.92-0.94x; AVX2's
 * 16 registers do not hold the raw rows (one token 1.09x slower there) */
#define SIMD_SD_DIRECT 1

GDN_INLINE V to_f32(R v, int dt) {
    if (dt == GDN_F32) return _mm512_castsi512_ps(v);
    if (dt == GDN_F16) return _mm512_cvtph_ps(_mm512_castsi512_si256(v));
    /* bf16: word j to the high half of dword j, low half zeroed (one permute) */
    const __m512i idx = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0,
                                         7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xaaaaaaaau, idx, v));
}

GDN_INLINE R from_f32(V v, int dt) {
    if (dt == GDN_F32) return _mm512_castps_si512(v);
    if (dt == GDN_F16)
        return _mm512_castsi256_si512(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#ifdef GDN_SIMD_BF16_NATIVE
    /* vcvtneps2bf16 flushes subnormals; a vector holding one (fpclass 0x20) takes
     * the integer rounding below, so every path rounds the same, bit for bit */
    if (dt == GDN_BF16_NATIVE && !_mm512_fpclass_ps_mask(v, 0x20))
        return _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(v));
#endif
    /* bf16, round to nearest even on the bits; NaN keeps its sign and top payload, made quiet */
    const __m512i u = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                     _mm512_and_si512(hi, _mm512_set1_epi32(1))));
    r = _mm512_srli_epi32(r, 16);
    r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), hi, _mm512_set1_epi32(0x40));
    return _mm512_castsi256_si512(_mm512_cvtepi32_epi16(r));
}

#ifdef GDN_SIMD_BF16_NATIVE
/* Two vectors to bf16 with one vcvtne2ps2bf16 and one 64-byte store. Its output is
 * +-0 exactly for a +-0 or subnormal input (bf16 shares fp32's exponent range, and
 * subnormals are flushed), so a line holding a zero is redone by from_f32, which
 * rounds subnormals itself. */
#define SIMD_ST2_NATIVE 1
GDN_INLINE void st2_native(char *p, V lo, V hi) {
    const __m512i r = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    if (!_mm512_testn_epi16_mask(r, _mm512_set1_epi16(0x7fff))) {
        _mm512_storeu_si512(p, r);
    } else {
        st_raw(p, from_f32(lo, GDN_BF16_NATIVE), GDN_BF16);
        st_raw(p + 32, from_f32(hi, GDN_BF16_NATIVE), GDN_BF16);
    }
}
#endif

GDN_INLINE V vload(const float *p) { return _mm512_loadu_ps(p); }
GDN_INLINE void vstore(float *p, V v) { _mm512_storeu_ps(p, v); }
GDN_INLINE V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }

/* LANES 32-bit lanes each holding two bf16 values (vLLM's packed weight: taps 2j and
 * 2j + 1 of a channel) as fp32: the low halves to *lo, the high halves to *hi. */
GDN_INLINE void wpair(const uint16_t *p, V *lo, V *hi) {
    const __m512i v = _mm512_loadu_si512(p);
    *lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *hi = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}

/* Lane j takes flat element j*W + k of v[0..W-1]: a two-source permute per pair of vectors. */
GDN_INLINE V gather_taps(const V *v, const int W, const int k) {
    const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(k),
                                         _mm512_mullo_epi32(_mm512_set1_epi32(W), _mm512_set_epi32(
                                             15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)));
    const __m512i pair = _mm512_srli_epi32(idx, 5);
    V r = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int m = 0; m < W; m += 2) {
        const V hi = m + 1 < W ? v[m + 1] : v[m];
        r = _mm512_mask_mov_ps(r, _mm512_cmpeq_epi32_mask(pair, _mm512_set1_epi32(m / 2)),
                               _mm512_permutex2var_ps(v[m], idx, hi));
    }
    return r;
}

/* 16-bit weights with W <= 4 fit in two zmm (16 W words): one word permute per tap
 * gathers its 16 values, a third of the operations of gather_taps after conversion.
 * bf16 at even W, whose taps pair up as dwords: one dword permute per pair (none at
 * W = 2), split as wpair splits vLLM's packed pairs (a two-source word permute takes
 * two cycles of port 5 on Intel, a dword one one). */
#define SIMD_TAPS_BLOCK(wdt, W) ((wdt) != GDN_F32 && (W) <= 4)
GDN_INLINE void taps_block(const char *src, const int wdt, const int W, V *t) {
    const __mmask32 mhi = W == 4 ? 0xffffffffu : W == 3 ? 0xffffu : 0;   /* words 32.. (W >= 2) */
    const __m512i lo = _mm512_loadu_si512(src), hi = _mm512_maskz_loadu_epi16(mhi, src + 64);
    if (wdt == GDN_BF16 && W % 2 == 0) {
        const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        __m512i d[2] = {lo, lo};   /* d[m], lane j: taps 2m, 2m + 1 of channel j */
        if (W == 4) {
            d[0] = _mm512_permutex2var_epi32(lo, even, hi);
            d[1] = _mm512_permutex2var_epi32(lo, _mm512_add_epi32(even, _mm512_set1_epi32(1)), hi);
        }
#pragma GCC unroll 2
        for (int m = 0; 2 * m < W; m++) {
            t[2 * m] = _mm512_castsi512_ps(_mm512_slli_epi32(d[m], 16));
            t[2 * m + 1] = _mm512_castsi512_ps(_mm512_and_si512(d[m], _mm512_set1_epi32((int)0xffff0000u)));
        }
        return;
    }
    const __m512i j = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                       15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
#pragma GCC unroll 4
    for (int k = 0; k < W; k++) {   /* word j*W + k of [lo, hi] */
        const __m512i idx = _mm512_add_epi16(_mm512_mullo_epi16(j, _mm512_set1_epi16((short)W)),
                                             _mm512_set1_epi16((short)k));
        t[k] = to_f32(_mm512_permutex2var_epi16(lo, idx, hi), wdt);
    }
}

/* silu(y) = y * sigmoid(y), each step across all n vectors so their independent
 * chains interleave; scalef makes subnormals, zero and inf correctly.
 * fp32 outputs: y / (1 + exp(-y)) in float lanes (29 operations per 16 lanes; in
 *   double it took ~44), constants in silu.h (GDN_EXP2_32_*). a = y clamped to
 *   [-120, 120] by vrangeps (below -120 the result is -0, above 120 it is y);
 *   exp(-a) = 2^(k/32) e^r, k = round(-a 32 log2 e) by the magic constant, whose
 *   low bits index the 32-entry tables of 2^(j/32) as hi + lo; r = -a - (k/32) ln2
 *   with ln2 as hi + lo (the hi step is exact), |r| <= ln2/64; e^r - 1 by degree 3
 *   (1e-10). So exp(-a) = 2^floor(k/32) (th + x), x = th expm1(r) + tl, to ~2e-9.
 *   The denominator is w1 + w2 + x' (scalef by floor(k/32), minus 64 for y < 0 so
 *   that exp(|y|) up to 2^173 stays finite: then the 1 becomes 2^-64 and the result
 *   is scaled back by 2^-64), w1 the larger of the 1 and the exponential's hi part.
 *   q = y d with d = rcp14 of e (1 + r) + 1 (within 2^-13 of the reciprocal, and
 *   ready before x'); the remainder y - q w1 is exact (Sterbenz), so q + (y - q w1 -
 *   q w2 - q x') d is one rounding of a value within ~2e-8 of the quotient (mostly
 *   d's error squared); the 2^-64 rescaling rounds subnormal results a second time
 *   (within 0.75 ulp). vfixupimm restores +-0 and +inf (y) and gives NaN for -inf
 *   like the reference. benchmarks/silu_exhaustive.c, all 2^32 inputs: 0 outputs
 *   over one ulp. avx512bf16 shares this code.
 * 16-bit outputs (ulp >= 2^-8 relative bf16, 2^-11 fp16): sigmoid = 1/(1 + 2^t),
 *   t = -y log2 e; 2^t = 2^floor(t) p(t - floor(t)) with vreduceps giving the
 *   fraction and scalef applying floor(t); p on [0, 1) of degree 2 (1.7e-3) for
 *   bf16, 3 (7.5e-5) for fp16, rcp14 (6e-5): 8 or 9 operations, within one ulp for
 *   every input (as the portable gdn_silu). bf16 scales p (its coefficients), the
 *   1 and y by 2^-16 (silu.h's GDN_BF16_DEN_SCALE, one more multiply), so 2^t does
 *   not overflow before t = 144 and results of y down to ~-97.4 come out instead
 *   of -0; rcp14 rounds subnormal results correctly. No clamp is needed: for
 *   |t| >= 2^23 the fraction is 0, scalef saturates to 0 or inf (inf: reduce
 *   gives 0, scalef gives 0 or inf), so y = inf gives inf, y = -inf gives
 *   -inf * 0 = NaN like the reference, NaN stays NaN. */
#define EACH for (int i = 0; i < n; i++)
GDN_INLINE void vsilu_n(V *y, const int n, const int dt) {
    if (dt != GDN_F32) {
        V m[4], r[4], q[4], d[4];
#pragma GCC unroll 4
        EACH m[i] = _mm512_mul_ps(y[i], _mm512_set1_ps(-GDN_LOG2E));          /* t = -y log2 e */
#pragma GCC unroll 4
        EACH r[i] = _mm512_reduce_ps(m[i], _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);  /* t - floor t */
        static const float p3[] = {GDN_EXP2_DEG3}, p2[] = {GDN_EXP2_DEG2};
        const float *c = dt == GDN_F16 ? p3 : p2;   /* bf16: degree 2 */
        const int deg = dt == GDN_F16 ? 3 : 2;
        const float s = dt == GDN_F16 ? 1.0f : GDN_BF16_DEN_SCALE;   /* bf16: (1 + 2^t) s, y s */
#pragma GCC unroll 4
        EACH q[i] = _mm512_set1_ps(c[0] * s);
#pragma GCC unroll 3
        for (int k = 1; k <= deg; k++)
#pragma GCC unroll 4
            EACH q[i] = _mm512_fmadd_ps(q[i], r[i], _mm512_set1_ps(c[k] * s));
#pragma GCC unroll 4
        EACH d[i] = _mm512_rcp14_ps(_mm512_add_ps(_mm512_scalef_ps(q[i], m[i]), _mm512_set1_ps(s)));
        if (dt != GDN_F16) {
#pragma GCC unroll 4
            EACH y[i] = _mm512_mul_ps(y[i], _mm512_set1_ps(s));
        }
#pragma GCC unroll 4
        EACH y[i] = _mm512_mul_ps(y[i], d[i]);
        return;
    }
    /* fp32: y / (1 + exp(-y)) in float lanes, the denominator as hi + lo (silu.h's GDN_EXP2_32) */
    static const float th[] = {GDN_EXP2_32_HI}, tl[] = {GDN_EXP2_32_LO};
    const V th0 = _mm512_loadu_ps(th), th1 = _mm512_loadu_ps(th + 16);
    const V tl0 = _mm512_loadu_ps(tl), tl1 = _mm512_loadu_ps(tl + 16);
    const V magic = _mm512_set1_ps(GDN_EXP2_32_MAGIC), lo64 = _mm512_set1_ps(0x1p-64f);
    V yn[4], a[4], t[4], m[4], r[4], e[4], x[4], w1[4], w2[4], d[4], q[4];
    __mmask16 neg[4];
#pragma GCC unroll 4
    EACH yn[i] = _mm512_max_ps(_mm512_set1_ps(-GDN_SILU_CLAMP), y[i]);   /* NaN passes: max returns operand 2 */
#pragma GCC unroll 4
    EACH a[i] = _mm512_range_ps(y[i], _mm512_set1_ps(GDN_SILU_CLAMP), 0x2);   /* |a| = min(|y|, 120), y's sign */
#pragma GCC unroll 4
    EACH t[i] = _mm512_fmadd_ps(a[i], _mm512_set1_ps(-GDN_LOG2E), magic); /* magic + k/32 */
#pragma GCC unroll 4
    EACH m[i] = _mm512_sub_ps(t[i], magic);                                /* k/32 */
#pragma GCC unroll 4
    EACH r[i] = _mm512_fnmsub_ps(m[i], _mm512_set1_ps(GDN_LN2_HI), a[i]); /* -a - k ln2/32, exact */
#pragma GCC unroll 4
    EACH r[i] = _mm512_fnmadd_ps(m[i], _mm512_set1_ps(GDN_LN2_LO), r[i]);
    static const float c[] = {GDN_EXPM1_32};
#pragma GCC unroll 4
    EACH x[i] = _mm512_fmadd_ps(_mm512_mul_ps(r[i], r[i]), _mm512_fmadd_ps(r[i], _mm512_set1_ps(c[0]), _mm512_set1_ps(c[1])),
                                r[i]);                                     /* expm1(r) */
#pragma GCC unroll 4
    EACH e[i] = _mm512_permutex2var_ps(th0, _mm512_castps_si512(t[i]), th1);
#pragma GCC unroll 4
    EACH x[i] = _mm512_fmadd_ps(e[i], x[i], _mm512_permutex2var_ps(tl0, _mm512_castps_si512(t[i]), tl1));
#pragma GCC unroll 4
    EACH neg[i] = _mm512_cmp_ps_mask(y[i], _mm512_setzero_ps(), _CMP_LT_OQ);
#pragma GCC unroll 4
    EACH m[i] = _mm512_mask_sub_ps(m[i], neg[i], m[i], _mm512_set1_ps(64.0f));
#pragma GCC unroll 4
    EACH e[i] = _mm512_scalef_ps(e[i], m[i]);
#pragma GCC unroll 4
    EACH x[i] = _mm512_scalef_ps(x[i], m[i]);
#pragma GCC unroll 4
    EACH w1[i] = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), neg[i], e[i]);   /* the larger term */
#pragma GCC unroll 4
    EACH w2[i] = _mm512_mask_mov_ps(e[i], neg[i], lo64);
    /* the reciprocal of e (1 + r) + (y < 0 ? 2^-64 : 1), within 6e-5 of the denominator
     * but ready four operations earlier: d within 2^-13 of 1 / denominator */
#pragma GCC unroll 4
    EACH d[i] = _mm512_rcp14_ps(_mm512_fmadd_ps(e[i], _mm512_add_ps(r[i], _mm512_set1_ps(1.0f)),
                                                _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), neg[i], lo64)));
#pragma GCC unroll 4
    EACH q[i] = _mm512_mul_ps(yn[i], d[i]);
#pragma GCC unroll 4
    EACH r[i] = _mm512_fnmadd_ps(q[i], w1[i], yn[i]);                      /* exact (Sterbenz) */
#pragma GCC unroll 4
    EACH r[i] = _mm512_fnmadd_ps(q[i], w2[i], r[i]);
#pragma GCC unroll 4
    EACH r[i] = _mm512_fnmadd_ps(q[i], x[i], r[i]);
#pragma GCC unroll 4
    EACH q[i] = _mm512_fmadd_ps(r[i], d[i], q[i]);
#pragma GCC unroll 4
    EACH q[i] = _mm512_mask_mul_ps(q[i], neg[i], q[i], lo64);
#pragma GCC unroll 4
    EACH y[i] = _mm512_fixupimm_ps(q[i], y[i], _mm512_set1_epi32(GDN_SILU_FIXUP), 0);
}
#undef EACH

/* ---- transposition of a time-contiguous state (update_simd.h's tc_load / tc_save) ----
 * One 64-byte line of channels (32 16-bit or 16 fp32 lanes) at a time, raw bits. In:
 * the line's block (element (k, j) at j*sd + k) is sd vectors, and row k takes lane j
 * from element j*sd + k of them. Out: block vector m takes lane i from row k, channel j,
 * where m*LINE + i = j*sd + k, and is stored with the lanes k < R only. Each gather is
 * a two-source word or dword permute per pair of source vectors, merged by lane masks
 * that the plan holds with the indices. */
#define TC_LINE(e) (64 / (e))

typedef struct {
    __m512i idx[GDN_MAX_WIDTH];                 /* in: per row k; out: per block vector m */
    uint32_t pick[GDN_MAX_WIDTH][GDN_MAX_WIDTH / 2];  /* lanes taken from source pair q */
    uint32_t keep[GDN_MAX_WIDTH];               /* out: lanes stored */
} tc_plan;

GDN_INLINE __m512i tc_iota(const int e) {
    return e == 2 ? _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                     15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
                  : _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
}

GDN_INLINE __m512i tc_set(int v, const int e) { return e == 2 ? _mm512_set1_epi16((short)v) : _mm512_set1_epi32(v); }
GDN_INLINE __m512i tc_add(__m512i a, __m512i b, const int e) { return e == 2 ? _mm512_add_epi16(a, b) : _mm512_add_epi32(a, b); }
GDN_INLINE __m512i tc_mul(__m512i a, __m512i b, const int e) { return e == 2 ? _mm512_mullo_epi16(a, b) : _mm512_mullo_epi32(a, b); }
GDN_INLINE uint32_t tc_eq(__m512i a, int v, const int e) {
    return e == 2 ? (uint32_t)_mm512_cmpeq_epi16_mask(a, tc_set(v, e)) : (uint32_t)_mm512_cmpeq_epi32_mask(a, tc_set(v, e));
}
/* source pair of a flat index: 2 vectors = 64 words or 32 dwords */
GDN_INLINE __m512i tc_pair(__m512i idx, const int e) { return e == 2 ? _mm512_srli_epi16(idx, 6) : _mm512_srli_epi32(idx, 5); }

GDN_INLINE void tc_plan_in(tc_plan *t, const int sd, const int R, const int e) {
    const __m512i base = tc_mul(tc_iota(e), tc_set(sd, e), e);
    for (int k = 0; k < R; k++) {
        t->idx[k] = tc_add(base, tc_set(k, e), e);
        for (int q = 0; 2 * q < sd; q++) t->pick[k][q] = tc_eq(tc_pair(t->idx[k], e), q, e);
    }
}

/* Row k and channel j of each lane of block vector m (element m*LINE + i = j*sd + k):
 * j = p / sd for p < 256, 2 <= sd <= 8, where (p * ceil(2^16 / sd)) >> 16 is exact. */
GDN_INLINE void tc_block_kj(const int m, const int sd, const int e, __m512i *k, __m512i *j) {
    const int magic = (65536 + sd - 1) / sd;
    const __m512i p = tc_add(tc_iota(e), tc_set(m * TC_LINE(e), e), e);
    *j = e == 2 ? _mm512_mulhi_epu16(p, _mm512_set1_epi16((short)magic))
                : _mm512_srli_epi32(_mm512_mullo_epi32(p, _mm512_set1_epi32(magic)), 16);
    *k = e == 2 ? _mm512_sub_epi16(p, _mm512_mullo_epi16(*j, tc_set(sd, e)))
                : _mm512_sub_epi32(p, _mm512_mullo_epi32(*j, tc_set(sd, e)));
}

/* lanes whose row is in [r0, r1) */
GDN_INLINE uint32_t tc_rows(__m512i k, const int r0, const int r1, const int e) {
    uint32_t m = 0;
    for (int r = r0; r < r1; r++) m |= tc_eq(k, r, e);
    return m;
}

GDN_INLINE void tc_plan_out(tc_plan *t, const int sd, const int R, const int e) {
    for (int m = 0; m < sd; m++) {
        __m512i k, j;
        tc_block_kj(m, sd, e, &k, &j);
        t->idx[m] = tc_add(tc_mul(k, tc_set(TC_LINE(e), e), e), j, e);   /* row k, channel j */
        t->keep[m] = tc_rows(k, 0, R, e);
        for (int q = 0; 2 * q < sd; q++) t->pick[m][q] = tc_eq(tc_pair(t->idx[m], e), q, e);
    }
}

GDN_INLINE int tc_out_ok(const int sd, const int R, const int e) { (void)sd, (void)R, (void)e; return 1; }

/* r with the lanes in pick taken from the two-source permute of (lo, hi) by idx */
GDN_INLINE __m512i tc_pick(__m512i r, const uint32_t pick, __m512i lo, __m512i idx, __m512i hi, const int e) {
    return e == 2 ? _mm512_mask_mov_epi16(r, pick, _mm512_permutex2var_epi16(lo, idx, hi))
                  : _mm512_mask_mov_epi32(r, (__mmask16)pick, _mm512_permutex2var_epi32(lo, idx, hi));
}

GDN_INLINE void tc_store(char *dst, const uint32_t keep, __m512i r, const int e) {
    if (e == 2) _mm512_mask_storeu_epi16(dst, keep, r);
    else _mm512_mask_storeu_epi32(dst, (__mmask16)keep, r);
}

/* lane i <- flat element idx_i of v[0..n-1] */
GDN_INLINE __m512i tc_gather(const __m512i *v, const int n, __m512i idx, const uint32_t *pick, const int e) {
    __m512i r = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int q = 0; 2 * q < n; q++) r = tc_pick(r, pick[q], v[2 * q], idx, v[2 * q + 1 < n ? 2 * q + 1 : 2 * q], e);
    return r;
}

GDN_INLINE void tc_in(char *dst, int64_t bs, const char *src, const int sd, const int R, const tc_plan *t,
                      const int e) {
    __m512i v[GDN_MAX_WIDTH];
#pragma GCC unroll 8
    for (int m = 0; m < sd; m++) v[m] = _mm512_loadu_si512(src + 64 * m);
#pragma GCC unroll 8
    for (int k = 0; k < R; k++) _mm512_storeu_si512(dst + k * bs, tc_gather(v, sd, t->idx[k], t->pick[k], e));
}

GDN_INLINE void tc_out(char *dst, const int sd, const int R, const char *src, int64_t bs, const tc_plan *t,
                       const int e) {
    __m512i v[GDN_MAX_WIDTH];
#pragma GCC unroll 8
    for (int k = 0; k < sd; k++) v[k] = k < R ? _mm512_loadu_si512(src + k * bs) : _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int m = 0; m < sd; m++) {
        tc_store(dst + 64 * m, t->keep[m], tc_gather(v, sd, t->idx[m], t->pick[m], e), e);   /* sd: a constant, R is not */
    }
}

/* The speculative roll of a time-contiguous state in place (update_simd.h's tc_roll), one
 * line of channels: block lanes of rows k < k0 take the element shift places further on
 * (row k + shift of the same channel, still the old state: lines and vectors go in
 * ascending order), by a masked load, no permute; rows k0 <= k < k0 + nt take token row
 * k - k0 (buf rows bs apart), gathered by pairs of token rows as tc_out does; other rows
 * are left alone. The masked load reads only the lanes it keeps, all within their own
 * channel. Against tc_out over the rows staged in buf this halves the word permutes at
 * nt = 4 (2 of these 2-cycle permutes per block vector instead of 4 at sd = 7). */
#define TC_ROLL 1

typedef struct {
    __m512i idx[GDN_MAX_WIDTH];                 /* token row k - k0, channel j */
    uint32_t pick[GDN_MAX_WIDTH][GDN_SLAB / 2]; /* lanes taken from token row pair q */
    uint32_t old[GDN_MAX_WIDTH], keep[GDN_MAX_WIDTH];
} tc_roll_plan;

GDN_INLINE void tc_plan_roll(tc_roll_plan *t, const int sd, const int k0, const int nt, const int e) {
    for (int m = 0; m < sd; m++) {
        __m512i k, j;
        tc_block_kj(m, sd, e, &k, &j);
        t->idx[m] = tc_add(tc_mul(tc_add(k, tc_set(-k0, e), e), tc_set(TC_LINE(e), e), e), j, e);
        t->old[m] = tc_rows(k, 0, k0, e);
        t->keep[m] = tc_rows(k, 0, k0 + nt, e);
        for (int q = 0; 2 * q < nt; q++) t->pick[m][q] = tc_eq(tc_pair(t->idx[m], e), q, e) & t->keep[m] & ~t->old[m];
    }
}

GDN_INLINE void tc_roll_line(char *dst, const int sd, int64_t shift, const char *tok, int64_t bs, const int nt,
                             const tc_roll_plan *t, const int e) {
#pragma GCC unroll 8
    for (int m = 0; m < sd; m++) {
        const char *old = dst + 64 * m + e * shift;
        __m512i r = e == 2 ? _mm512_maskz_loadu_epi16(t->old[m], old) : _mm512_maskz_loadu_epi32((__mmask16)t->old[m], old);
        for (int q = 0; 2 * q < nt; q++)
            r = tc_pick(r, t->pick[m][q], _mm512_loadu_si512(tok + 2 * q * bs), t->idx[m],
                        _mm512_loadu_si512(tok + (2 * q + 1 < nt ? 2 * q + 1 : 2 * q) * bs), e);
        tc_store(dst + 64 * m, t->keep[m], r, e);
    }
}

/* Short decode of a time-contiguous state, read and rolled in place (update_simd.h's
 * tc_t1_unit), a group of 32 channels at a time (fp32: tc_t1_row32 / tc_t1_roll32 below,
 * two halves of 16 channels). 16-bit: its block (element
 * (k, j) at j*sd + k) is sd <= TC_T1_MAX_SD vectors. Row k of the group's half h (16
 * channels) is gathered from block vectors a = h*sd/2 and a + 1 where sd <= 4 (16 channels
 * span at most two), or a, a + 1 and a + 2, a + 3, merged by a mask, where sd > 4 (they
 * span at most four); so nothing is staged. fp16: one two-source word permute per pair,
 * packed, then converted. bf16: one two-source dword permute per pair (1 uop, where the
 * word permute takes 3) of the dwords that hold the row's words, each word then put in
 * the high half of its lane, the low half zeroed (the conversion): the dword as is, its
 * low half cleared, where the word is its high half, shifted left 16 where the word is
 * its low half. The dwords of rows k and k + 2 also hold row k + 1's words (row k + 1's
 * word is the high half of row k's dword where row k's word is even, the low half of row
 * k + 2's where it is odd), so row k + 1 costs no permute between them: 2 permutes where
 * W - 1 = 3 rows took 3. The roll (rows
 * k < H-1 <- row k + shift, rows H-1+t <- token t, t < T, rows from H-1+T on kept;
 * plain: shift 1, T = 1; spec: shift off + 1) is per block vector m its elements'
 * successors (the row shift on in the same channel: a load shift elements on, 1.04x
 * faster than a two-source permute of vectors m and m + 1) and one permute of each
 * token's 32 words, merged by masks and stored with the lanes of rows < H-1+T. The last vector's lanes that take an old row take it from
 * the same channel, within the vector: a one-source permute there, so the load never
 * passes the group's block. */
#define TC_T1 1
#define TC_T1_MAX_SD 8
#define TC_T1_MAX_T 4   /* tokens a roll places */

typedef struct {
    __m512i row[TC_T1_MAX_SD][2];     /* row k, half h: lane <- pair element (fp16: word; bf16: dword) */
    uint32_t first[TC_T1_MAX_SD][2];  /* sd > 4: lanes of row k, half h from vectors a, a + 1 */
    __m512i idx32[TC_T1_MAX_SD];      /* fp32, row k of a half: lane j <- element j*sd + k */
    uint32_t pick32[TC_T1_MAX_SD][TC_T1_MAX_SD / 2];   /* fp32, row k: lanes from the half's vector pair q */
    __m512i old, tok[TC_T1_MAX_SD];   /* old: lane i <- lane i + 1 (the last vector's successors) */
    uint32_t from_tok[TC_T1_MAX_SD][TC_T1_MAX_T];      /* [m][t]: lanes of row H-1+t */
    uint32_t keep[TC_T1_MAX_SD][TC_T1_MAX_T + 1];      /* [m][T]: lanes of rows < H-1+T */
    uint32_t last;   /* lanes of the last block vector read: those up to the last channel's row L-1 */
    uint16_t low[TC_T1_MAX_SD][2];    /* bf16: lanes of row k, half h whose word is its dword's low half */
} tc_t1_plan;

/* (rows: the window rows read, from row 0; nt: the token counts rolled, from 1) */
GDN_INLINE void tc_t1_plan_make(tc_t1_plan *t, const int sd, const int H, const int L, const int dt, const int rows,
                                const int nt) {
    const int e = dt == GDN_F32 ? 4 : 2;
    if (e == 4) {   /* the rows of a half's block vectors as tc_plan_in's */
        for (int k = 0; k < rows; k++) {
            t->idx32[k] = tc_add(tc_mul(tc_iota(4), tc_set(sd, 4), 4), tc_set(k, 4), 4);
            for (int q = 0; 2 * q < sd; q++) t->pick32[k][q] = tc_eq(tc_pair(t->idx32[k], 4), q, 4);
        }
    } else if (dt != GDN_F16) {   /* bf16: lane i is channel 16h + i; w: its word from vector a's first */
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < rows; k++) {
                const __m512i w = _mm512_add_epi32(_mm512_mullo_epi32(tc_iota(4), _mm512_set1_epi32(sd)),
                                                   _mm512_set1_epi32(16 * h * sd + k - 32 * (h * sd / 2)));
                t->row[k][h] = _mm512_srli_epi32(w, 1);
                t->low[k][h] = (uint16_t)_mm512_testn_epi32_mask(w, _mm512_set1_epi32(1));
                if (sd > 4) t->first[k][h] = (uint32_t)_mm512_cmplt_epu32_mask(w, _mm512_set1_epi32(64));
            }
    } else {
        const __m512i iota = tc_iota(2);
        const __m512i ch = _mm512_and_si512(iota, _mm512_set1_epi16(15));   /* word i: channel 16h + i (from 16: any) */
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < rows; k++) {
                t->row[k][h] = _mm512_add_epi16(_mm512_mullo_epi16(ch, _mm512_set1_epi16((short)sd)),
                                                _mm512_set1_epi16((short)(16 * h * sd + k - 32 * (h * sd / 2))));
                if (sd > 4) t->first[k][h] = (uint32_t)_mm512_cmplt_epu16_mask(t->row[k][h], _mm512_set1_epi16(64));
            }
    }
    t->old = tc_add(tc_iota(e), tc_set(1, e), e);
    for (int m = 0; m < sd; m++) {   /* (fp32: the same for both halves' block vectors) */
        __m512i k, j;
        tc_block_kj(m, sd, e, &k, &j);
        t->tok[m] = j;
        t->keep[m][0] = tc_rows(k, 0, H - 1, e);
        for (int q = 0; q < nt; q++) {
            t->from_tok[m][q] = tc_eq(k, H - 1 + q, e);
            t->keep[m][q + 1] = t->keep[m][q] | t->from_tok[m][q];
        }
    }
    /* the block ends sd - L elements after the last channel's row L-1, which may be the
     * array's last element: those lanes are not read */
    t->last = (e == 2 ? 0xffffffffu : 0xffffu) >> (sd - L);
}

/* fp16: row k of half h of a group's block vectors sv, as fp32 */
GDN_INLINE V tc_t1_row(const __m512i *sv, const tc_t1_plan *t, const int k, const int h, const int sd) {
    const int a = h * sd / 2, b = a + 1 < sd ? a + 1 : a;
    const __m512i lo = _mm512_permutex2var_epi16(sv[a], t->row[k][h], sv[b]);
    if (sd <= 4) return _mm512_cvtph_ps(_mm512_castsi512_si256(lo));
    const int c = a + 2 < sd ? a + 2 : sd - 1, d = a + 3 < sd ? a + 3 : sd - 1;
    const __m512i hi = _mm512_permutex2var_epi16(sv[c], t->row[k][h], sv[d]);
    return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_mask_mov_epi16(lo, (__mmask32)~t->first[k][h], hi)));
}

/* bf16: the dwords that hold row k of half h's words */
GDN_INLINE __m512i tc_t1_dwords(const __m512i *sv, const tc_t1_plan *t, const int k, const int h, const int sd) {
    const int a = h * sd / 2, b = a + 1 < sd ? a + 1 : a;
    const __m512i lo = _mm512_permutex2var_epi32(sv[a], t->row[k][h], sv[b]);
    if (sd <= 4) return lo;
    const int c = a + 2 < sd ? a + 2 : sd - 1, d = a + 3 < sd ? a + 3 : sd - 1;
    return _mm512_mask_mov_epi32(lo, (__mmask16)~t->first[k][h], _mm512_permutex2var_epi32(sv[c], t->row[k][h], sv[d]));
}

/* bf16: rows off..off+H-1 of half h of a group's block vectors sv, as fp32, to hf[k][h] */
GDN_INLINE void tc_t1_rows_bf16(const __m512i *sv, const tc_t1_plan *t, const int off, const int h, const int sd,
                                const int H, V hf[][4]) {
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    __m512i p[TC_T1_MAX_SD], ph[TC_T1_MAX_SD];   /* (ph: p with the low halves cleared) */
#pragma GCC unroll 8
    for (int k = 0; k < H; k++) {
        if (k % 2 == 1 && k + 1 < H) continue;   /* (from rows k - 1 and k + 1) */
        p[k] = tc_t1_dwords(sv, t, off + k, h, sd);
        ph[k] = _mm512_and_si512(p[k], top);
    }
#pragma GCC unroll 8
    for (int k = 0; k < H; k++)
        hf[k][h] = _mm512_castsi512_ps(k % 2 == 1 && k + 1 < H
                                           ? _mm512_mask_slli_epi32(ph[k - 1], (__mmask16)~t->low[off + k - 1][h], p[k + 1], 16)
                                           : _mm512_mask_slli_epi32(ph[k], t->low[off + k][h], p[k], 16));
}

/* fp32: row k of a half's block vectors sv (sd of them), as tc_gather's dword gather */
GDN_INLINE V tc_t1_row32(const __m512i *sv, const tc_t1_plan *t, const int k, const int sd) {
    __m512i r = _mm512_permutex2var_epi32(sv[0], t->idx32[k], sv[1 < sd ? 1 : 0]);
#pragma GCC unroll 4
    for (int q = 1; 2 * q < sd; q++) r = tc_pick(r, t->pick32[k][q], sv[2 * q], t->idx32[k], sv[2 * q + 1 < sd ? 2 * q + 1 : 2 * q], 4);
    return _mm512_castsi512_ps(r);
}

/* fp32: the roll of a group's 2 sd block vectors sv (at blk; half h's are sv[h*sd..]) by
 * shift = off + 1 with the T tokens' halves tok[2t + h], as tc_t1_roll's with dword lanes */
GDN_INLINE void tc_t1_roll32(char *blk, const __m512i *sv, const __m512i *tok, const int T, const int off,
                             const tc_t1_plan *t, const int sd) {
#pragma GCC unroll 16
    for (int m = 0; m < 2 * sd; m++) {
        const int h = m >= sd, a = m - h * sd;
        __m512i r = m + 1 < 2 * sd ? _mm512_loadu_si512(blk + 64 * m + 4 + 4 * off)
                                   : _mm512_permutexvar_epi32(_mm512_add_epi32(t->old, _mm512_set1_epi32(off)), sv[m]);
#pragma GCC unroll 4
        for (int q = 0; q < T; q++)
            r = _mm512_mask_mov_epi32(r, (__mmask16)t->from_tok[a][q], _mm512_permutexvar_epi32(t->tok[a], tok[2 * q + h]));
        _mm512_mask_storeu_epi32(blk + 64 * m, (__mmask16)t->keep[a][T], r);
    }
}

/* the roll of a group's block vectors sv (at blk) by shift = off + 1 with the T tokens' words tok;
 * full: the roll writes every row (W - 2 + T >= sd), so the block is stored whole */
GDN_INLINE void tc_t1_roll(char *blk, const __m512i *sv, const __m512i *tok, const int T, const int off,
                           const tc_t1_plan *t, const int sd, const int full) {
#pragma GCC unroll 8   /* (sd <= 8 vectors, unrolled whole: at unroll 4, sd 6-7 ran 3-4% slower) */
    for (int m = 0; m < sd; m++) {
        __m512i r = m + 1 < sd ? _mm512_loadu_si512(blk + 64 * m + 2 + 2 * off)
                               : _mm512_permutexvar_epi16(_mm512_add_epi16(t->old, _mm512_set1_epi16((short)off)), sv[m]);
#pragma GCC unroll 4
        for (int q = 0; q < T; q++)
            r = _mm512_mask_mov_epi16(r, t->from_tok[m][q], _mm512_permutexvar_epi16(t->tok[m], tok[q]));
        if (full) _mm512_storeu_si512(blk + 64 * m, r);
        else _mm512_mask_storeu_epi16(blk + 64 * m, t->keep[m][T], r);
    }
}

/* keeps the compiler from seeing through a register (see update_simd.h's simd_copy) */
#define GDN_SIMD_OPAQUE(v) __asm__("" : "+v"(v))

#endif
