/* AVX2 primitives for the shared SIMD bodies (AVX2 + FMA + F16C): 8 channels per
 * ymm, fp32 arithmetic. Included inside the including file's target region. */
#ifndef GDNCONV_SIMD_AVX2_H
#define GDNCONV_SIMD_AVX2_H

#include "silu.h"

typedef __m256 V;
typedef __m256i R;  /* fp32 bits, or 8 x 16-bit in the low 128 bits */
#define LANES 8

/* prefetches of the next unit's (update) or tile's (prefill) rows: prefetcht0 for read
 * and written rows alike (prefetchw needs PRFCHW, which not every AVX2 CPU has) */
#define SIMD_PREFETCH_R(p) _mm_prefetch((p), _MM_HINT_T0)
#define SIMD_PREFETCH_W(p) _mm_prefetch((p), _MM_HINT_T0)

/* the update's one-token steps take twice the vectors where a line is fewer than four
 * (fp32: two ymm; update_simd.h) */
#define SIMD_WIDE_T1 1

GDN_INLINE R ld_raw(const char *p, int dt) {
    return dt == GDN_F32 ? _mm256_loadu_si256((const __m256i *)p)
                         : _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p));
}

GDN_INLINE void st_raw(char *p, R v, int dt) {
    if (dt == GDN_F32) _mm256_storeu_si256((__m256i *)p, v);
    else _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(v));
}

GDN_INLINE V to_f32(R v, int dt) {
    if (dt == GDN_F32) return _mm256_castsi256_ps(v);
    if (dt == GDN_F16) return _mm256_cvtph_ps(_mm256_castsi256_si128(v));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(v)), 16));
}

GDN_INLINE R from_f32(V v, int dt) {
    if (dt == GDN_F32) return _mm256_castps_si256(v);
    if (dt == GDN_F16)
        return _mm256_castsi128_si256(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    /* bf16, round to nearest even on the bits; NaN keeps its sign and top payload, made quiet */
    const __m256i u = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                     _mm256_and_si256(hi, _mm256_set1_epi32(1))));
    r = _mm256_srli_epi32(r, 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    /* values fit 16 bits: pack within 128-bit lanes, then gather qwords 0 and 2 */
    r = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    return r;
}

GDN_INLINE V vload(const float *p) { return _mm256_loadu_ps(p); }
GDN_INLINE void vstore(float *p, V v) { _mm256_storeu_ps(p, v); }
GDN_INLINE V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }

/* LANES 32-bit lanes each holding two bf16 values (vLLM's packed weight: taps 2j and
 * 2j + 1 of a channel) as fp32: the low halves to *lo, the high halves to *hi. */
GDN_INLINE void wpair(const uint16_t *p, V *lo, V *hi) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)p);
    *lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *hi = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

/* Lane j takes flat element j*W + k of v[0..W-1]: a permute and a blend per vector. */
GDN_INLINE V gather_taps(const V *v, const int W, const int k) {
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(k),
                                         _mm256_mullo_epi32(_mm256_set1_epi32(W),
                                                            _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0)));
    const __m256i src = _mm256_srli_epi32(idx, 3);
    V r = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int m = 0; m < W; m++)
        r = _mm256_blendv_ps(r, _mm256_permutevar8x32_ps(v[m], idx),
                             _mm256_castsi256_ps(_mm256_cmpeq_epi32(src, _mm256_set1_epi32(m))));
    return r;
}

/* W = 4: the taps of 8 channels (a [8, 4] block, 32 values) by a transpose within
 * 128-bit lanes, for every weight dtype: the block's halves are put so that lane 0 of
 * u[m] holds channel m and lane 1 channel m + 4 (the 16-bit dtypes as words in 32-bit
 * lanes, unpacked against zero: bf16 to the high half, which is the conversion, fp16
 * to the low half), then four unpacks and four shuffles give tap k of channels 0..3
 * and 4..7 in place. 14 shuffles against gather_taps' 16 permutes and 16 blends after
 * 4 conversions (fp16: 8 more shuffles and 4 conversions). */
#define SIMD_TAPS_BLOCK(wdt, W) ((W) == 4)
GDN_INLINE void taps_block(const char *src, const int wdt, const int W, V *t) {
    (void)W;
    __m256 u[4];
    if (wdt == GDN_F32) {   /* a: channels 0, 1; b: 2, 3; c: 4, 5; d: 6, 7 */
        const __m256 a = _mm256_loadu_ps((const float *)src), b = _mm256_loadu_ps((const float *)src + 8),
                     c = _mm256_loadu_ps((const float *)src + 16), d = _mm256_loadu_ps((const float *)src + 24);
        u[0] = _mm256_permute2f128_ps(a, c, 0x20);
        u[1] = _mm256_permute2f128_ps(a, c, 0x31);
        u[2] = _mm256_permute2f128_ps(b, d, 0x20);
        u[3] = _mm256_permute2f128_ps(b, d, 0x31);
    } else {                /* a: channels 0..3 (a 64-bit lane each); b: 4..7 */
        const __m256i a = _mm256_loadu_si256((const __m256i *)src), b = _mm256_loadu_si256((const __m256i *)src + 1);
        const __m256i r01 = _mm256_permute2x128_si256(a, b, 0x20), r23 = _mm256_permute2x128_si256(a, b, 0x31);
        const __m256i z = _mm256_setzero_si256();
        if (wdt == GDN_F16) {
            u[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(r01, z));
            u[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(r01, z));
            u[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(r23, z));
            u[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(r23, z));
        } else {
            u[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, r01));
            u[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, r01));
            u[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, r23));
            u[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, r23));
        }
    }
    const __m256 lo01 = _mm256_unpacklo_ps(u[0], u[1]), hi01 = _mm256_unpackhi_ps(u[0], u[1]);
    const __m256 lo23 = _mm256_unpacklo_ps(u[2], u[3]), hi23 = _mm256_unpackhi_ps(u[2], u[3]);
    t[0] = _mm256_shuffle_ps(lo01, lo23, 0x44);
    t[1] = _mm256_shuffle_ps(lo01, lo23, 0xee);
    t[2] = _mm256_shuffle_ps(hi01, hi23, 0x44);
    t[3] = _mm256_shuffle_ps(hi01, hi23, 0xee);
    if (wdt == GDN_F16) {   /* the halves in the low 16 bits: packed, then converted */
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i h = _mm256_packus_epi32(_mm256_castps_si256(t[k]), _mm256_castps_si256(t[k]));
            t[k] = _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(h, 0x08)));
        }
    }
}

/* silu(y) = y * sigmoid(y), each step across all n vectors.
 * 16-bit outputs: sigmoid = 1 / (1 + 2^t), t = -y log2 e clamped to [-127, 128]
 *   (max/min return the constant for a NaN t; y carries the NaN), 2^t =
 *   2^floor(t) p(frac) with 2^floor(t) from the exponent bits (t = 128 gives
 *   inf: y = -inf then gives -inf * 0 = NaN like the reference), p of degree 3
 *   on [0, 1) (7.5e-5), then y * rcp (2^-12) for bf16 outputs, 15 operations,
 *   or a division for fp16 (a Newton step after rcp would turn 2^t = inf into
 *   NaN). bf16 scales 1 + 2^t and y by 2^-16 (silu.h's GDN_BF16_DEN_SCALE, t clamped
 *   to [-111, 144] instead of [-127, 128]), so neither 2^t nor the rcp (which
 *   flushes results below 2^-126 to 0) cuts off results of y down to ~-97.4:
 *   within one ulp for every input, as the AVX-512 and portable kernels.
 * fp32 outputs: y / (1 + exp(-y)) in float lanes (32 operations per 8 lanes, one of
 *   them a division; in double it took ~50 and two: fp32 calls 0.74-0.82x the time,
 *   0.98-1.05x the former float formula's, benchmarks/README.md), constants in silu.h
 *   (GDN_EXP2_8_*). yn = y clamped to [-110, FLT_MAX] (below -110 the result is -0),
 *   a = yn clamped at 64 for the exponent; exp(-a) = 2^(k/8) e^r, k = round(-a 8
 *   log2 e) by the magic constant, whose low 3 bits index the 8-entry table of 2^(j/8)
 *   (vpermps); r = -a - (k/8) ln2 (ln2 as hi + lo, the hi step exact) plus the table's
 *   lo part ln(2^(j/8) / hi), |r| <= ln2/16; e^r - 1 = p of degree 4 (2e-10). eh =
 *   hi 2^floor(k/8) comes from integer adds on the table's bits (t << 20 carries
 *   floor(k/8) into the exponent field), scaled by 2^-64 for y < 0 (and 2^-32 for +0)
 *   with the same vpsignd term as s1, the 1 scaled alike (2^-64 for y < 0), so exp(|y|)
 *   up to e^110 stays finite; x = eh p. The denominator is s1 + eh + x (~5e-9);
 *   q = yn / its float sum, corrected once by the remainder yn - q (s1 + eh + x) (the
 *   larger of s1 and eh first; its rounding is at most ~2^-25 of the result) times rcp
 *   (2^-11), then q s1 - sp, rounded once (subnormal results a second time, as on
 *   AVX-512). sp = min(y, FLT_MAX) - y is +0 for finite y (which keeps -0), -inf for
 *   +inf (the result is then +inf) and NaN for -inf (-inf * 0 in the reference) and
 *   NaN. benchmarks/silu_exhaustive.c, all 2^32 inputs: 0 outputs over one ulp. */
#define EACH for (int i = 0; i < n; i++)
GDN_INLINE void vsilu_n(V *y, const int n, const int dt) {
    if (dt != GDN_F32) {
        V a[4], m[4], r[4], q[4], e[4];
        /* bf16: 1 + 2^t and y scaled by s = 2^-16 (silu.h), t in [-111, 144] */
        const int k = dt == GDN_F16 ? 0 : GDN_BF16_DEN_SHIFT;
        const float s = dt == GDN_F16 ? 1.0f : GDN_BF16_DEN_SCALE;
#pragma GCC unroll 4
        EACH m[i] = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(y[i], _mm256_set1_ps(-GDN_LOG2E)),
                                                _mm256_set1_ps(-127.0f + k)), _mm256_set1_ps(128.0f + k));
#pragma GCC unroll 4
        EACH a[i] = _mm256_floor_ps(m[i]);
#pragma GCC unroll 4
        EACH r[i] = _mm256_sub_ps(m[i], a[i]);
        static const float c[] = {GDN_EXP2_DEG3};
#pragma GCC unroll 4
        EACH q[i] = _mm256_set1_ps(c[0]);
#pragma GCC unroll 3
        for (int j = 1; j <= 3; j++)
#pragma GCC unroll 4
            EACH q[i] = _mm256_fmadd_ps(q[i], r[i], _mm256_set1_ps(c[j]));
#pragma GCC unroll 4
        EACH e[i] = _mm256_add_ps(_mm256_set1_ps(s), _mm256_mul_ps(q[i], _mm256_castsi256_ps(_mm256_slli_epi32(
                        _mm256_add_epi32(_mm256_cvttps_epi32(a[i]), _mm256_set1_epi32(127 - k)), 23))));
        if (dt == GDN_F16) {  /* y / (1 + 2^t): 2^t = inf gives -0 (a Newton step would give NaN) */
#pragma GCC unroll 4
            EACH y[i] = _mm256_div_ps(y[i], e[i]);
        } else {
#pragma GCC unroll 4
            EACH y[i] = _mm256_mul_ps(_mm256_mul_ps(y[i], _mm256_set1_ps(s)), _mm256_rcp_ps(e[i]));
        }
        return;
    }
    /* fp32: y / (1 + exp(-y)) in float lanes, the denominator as s1 + eh + x (silu.h's GDN_EXP2_8) */
    static const float th[] = {GDN_EXP2_8_HI}, tl[] = {GDN_EXP2_8_LO}, c[] = {GDN_EXPM1_8};
    /* 2^(j/8) bits less j << 20 (t << 20 adds it back with floor(k/8) << 23) and 2^28 (sign below) */
    const __m256i tb = _mm256_sub_epi32(_mm256_castps_si256(_mm256_loadu_ps(th)),
                                        _mm256_set_epi32(0x10700000, 0x10600000, 0x10500000, 0x10400000,
                                                         0x10300000, 0x10200000, 0x10100000, 0x10000000));
    const V tlv = _mm256_loadu_ps(tl), magic = _mm256_set1_ps(GDN_EXP2_8_MAGIC);
    V sp[4], yn[4], a[4], t[4], r[4], p[4], s1[4], eh[4], x[4], d[4], q[4];
#pragma GCC unroll 4
    EACH {   /* +inf -> FLT_MAX and sp = -inf; -inf, NaN: sp = NaN; finite: sp = +0 */
        const V yc = _mm256_min_ps(y[i], _mm256_set1_ps(0x1.fffffep127f));
        sp[i] = _mm256_sub_ps(yc, y[i]);
        yn[i] = _mm256_max_ps(yc, _mm256_set1_ps(GDN_SILU_LO));
    }
#pragma GCC unroll 4
    EACH a[i] = _mm256_min_ps(yn[i], _mm256_set1_ps(GDN_SILU_HI));
#pragma GCC unroll 4
    EACH t[i] = _mm256_fmadd_ps(a[i], _mm256_set1_ps(-GDN_LOG2E), magic);  /* magic + k/8 */
#pragma GCC unroll 4
    EACH {   /* r = -a - (k/8) ln2 + tl[k mod 8], the ln2 hi step exact */
        const V m = _mm256_sub_ps(t[i], magic);
        r[i] = _mm256_fnmsub_ps(m, _mm256_set1_ps(GDN_LN2_HI), a[i]);
        r[i] = _mm256_fnmadd_ps(m, _mm256_set1_ps(GDN_LN2_LO), r[i]);
        r[i] = _mm256_add_ps(r[i], _mm256_permutevar8x32_ps(tlv, _mm256_castps_si256(t[i])));
    }
#pragma GCC unroll 4
    EACH {   /* expm1(r) */
        const V r2 = _mm256_mul_ps(r[i], r[i]);
        p[i] = _mm256_fmadd_ps(_mm256_fmadd_ps(r[i], _mm256_set1_ps(c[0]), _mm256_set1_ps(c[1])), r[i], _mm256_set1_ps(c[2]));
        p[i] = _mm256_fmadd_ps(r2, p[i], r[i]);
    }
#pragma GCC unroll 4
    EACH {   /* sg = 2^28 (y > 0), -2^28 (y < 0, -0), 0 (+0) on bits less 2^28: s1, eh scaled by 1, 2^-64, 2^-32 */
        const __m256i sg = _mm256_sign_epi32(_mm256_set1_epi32(1 << 28), _mm256_castps_si256(y[i]));
        s1[i] = _mm256_castsi256_ps(_mm256_add_epi32(sg, _mm256_set1_epi32(0x3f800000 - (1 << 28))));
        const __m256i ti = _mm256_castps_si256(t[i]);
        eh[i] = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_add_epi32(_mm256_permutevar8x32_epi32(tb, ti), sg),
                                                     _mm256_slli_epi32(ti, 20)));
    }
#pragma GCC unroll 4
    EACH x[i] = _mm256_mul_ps(eh[i], p[i]);
#pragma GCC unroll 4
    EACH d[i] = _mm256_add_ps(_mm256_add_ps(s1[i], eh[i]), x[i]);
#pragma GCC unroll 4
    EACH q[i] = _mm256_div_ps(yn[i], d[i]);
#pragma GCC unroll 4
    EACH d[i] = _mm256_rcp_ps(d[i]);
#pragma GCC unroll 4
    EACH {   /* q - (q (s1 + eh + x) - yn) d, the larger of s1, eh first */
        V rm = _mm256_fmsub_ps(q[i], _mm256_max_ps(s1[i], eh[i]), yn[i]);
        rm = _mm256_fmadd_ps(q[i], _mm256_min_ps(s1[i], eh[i]), rm);
        rm = _mm256_fmadd_ps(q[i], x[i], rm);
        q[i] = _mm256_fnmadd_ps(rm, d[i], q[i]);
    }
#pragma GCC unroll 4
    EACH y[i] = _mm256_fmsub_ps(q[i], s1[i], sp[i]);
}
#undef EACH

/* ---- transposition of a time-contiguous state (update_simd.h's tc_load / tc_save) ----
 * fp32: eight channels at a time in dword lanes; in: the block (element (k, j) at
 * j*sd + k) is sd vectors and row k takes lane j from element j*sd + k; out: block vector
 * m takes lane i from row k, channel j, where 8m + i = j*sd + k. Odd sd (3, 5, 7): the
 * elements of a row lie in distinct lanes (j*sd + k mod 8 is one-to-one in j), so a row
 * is the block vectors merged by immediate blends, then one lane permute; back, each row
 * is permuted once and the block vectors are the rows merged by immediate blends (R
 * permutes per 8 channels each way). sd 2 and 6: the same per half of the 8 channels
 * (2 R). sd 4: two channels a 128-bit lane, a 4x4 transposition in lanes by in-lane
 * shuffles (out: the rows, in channel order (0 2 4 6 1 3 5 7), permuted once each).
 * sd 8: a gather is a lane permute and a variable blend per source vector (sd R
 * permutes). On the Intel the kernels were timed on, a lane permute and a variable blend
 * each take a cycle of one port, an immediate blend a third, an in-lane shuffle half
 * (benchmarks/README.md, stop 50).
 * 16-bit: sixteen channels at a time, eight per 128-bit lane (the line's two halves, whose
 * blocks are 16 sd bytes apart, each the same pattern): the block's 16-byte chunk m of both
 * halves is one register. sd 2, 3, 5, 6, 7: the fp32 merges above on the words of each
 * 128-bit lane (one immediate word blend serves both halves), each merge put in place by
 * one byte shuffle (vpshufb, within lanes): sd = 3, R = 3, 6 blends and 3 shuffles each
 * way per 16 channels. sd = 8: row k is the OR over m of one byte shuffle of chunk m that
 * picks row k's words and zeroes the rest, and back chunk m the OR over k of one of row k
 * (R sd shuffles each way). sd = 4 (two channels a chunk): a 4x4 word transposition per
 * channel pair by unpacks (12 in, 8 out). AVX2 has no
 * 16-bit masked store: where the block has gaps (R < sd: transformers' view, padding),
 * each chunk goes by two dword-masked stores, of its dwords whose two words are both
 * written and of the same from 2 bytes before (the chunk shifted a word up, the previous
 * chunk's word 7 its word 0), so every written word (at R >= 2 each has a written
 * neighbour) is stored once or twice with its value and nothing outside the rows is
 * written; R = 1 keeps the element loop. */
#define TC_LINE(e) ((e) == 2 ? 16 : 8)

typedef struct {
    __m256i idx[GDN_MAX_WIDTH];    /* fp32 in: per row k; out: per block vector m */
    __m256i keep[GDN_MAX_WIDTH];   /* fp32 out: lanes stored */
    __m256i inv[GDN_MAX_WIDTH][2]; /* fp32 out, merged sd: row k's permute for channel set h (TC_SET), lane i <-
                                      its channel j with j*sd + k = i mod 8 */
    /* 16-bit, sd = 8, in: [k][m], row k's bytes from chunk m; out: [m][k], chunk m's bytes from row k
     * (0x80: zero); the same 16 indices in both lanes; built with vector operations (byte by
     * byte, building it took half of tc_load's and tc_save's time) */
    __m256i shuf[GDN_MAX_WIDTH][GDN_MAX_WIDTH];
    /* 16-bit, the lane merges (sd 2, 3, 5, 6, 7): in, row k's byte shuffle of its merged
     * chunks (word j <- word (j*sd + k) mod 8); out, row k's per channel set h (TC_SET), word
     * i <- its channel j with j*sd + k = i mod 8 (the words of inv, as byte pairs) */
    __m256i perm16[GDN_MAX_WIDTH][2];
    /* 16-bit out, 2 <= R < sd: chunk m's dwords (vpmaskmovd lanes) whose two words are both
     * written, on grid g: words (2d, 2d + 1) of the chunk (g = 0), or the chunk shifted a
     * word up, its words (2d - 1, 2d) (g = 1) */
    __m128i pairs[2][GDN_MAX_WIDTH];
} tc_plan;

/* 16-bit plans: the shuffle taking word pos (per 16-bit lane; 0..7) where take, zero elsewhere */
GDN_INLINE __m256i tc_word_shuf(const __m256i pos, const __m256i take) {
    const __m256i bytes = _mm256_add_epi16(_mm256_mullo_epi16(pos, _mm256_set1_epi16(514)), _mm256_set1_epi16(256));
    return _mm256_blendv_epi8(_mm256_set1_epi16((short)0x8080), bytes, take);   /* bytes 2 pos, 2 pos + 1 */
}

/* word j of each 128-bit lane: j */
GDN_INLINE __m256i tc_lane_words(void) { return _mm256_set_epi16(7, 6, 5, 4, 3, 2, 1, 0, 7, 6, 5, 4, 3, 2, 1, 0); }

GDN_INLINE void tc_plan_in(tc_plan *t, const int sd, const int R, const int e) {
    if (e == 2) {   /* row k's word j is element j*sd + k: word % 8 of chunk / 8 (sd = 4: unpacks) */
        for (int k = 0; k < R && sd != 4; k++) {
            const __m256i el = _mm256_add_epi16(_mm256_mullo_epi16(tc_lane_words(), _mm256_set1_epi16((short)sd)),
                                                _mm256_set1_epi16((short)k));
            const __m256i chunk = _mm256_srli_epi16(el, 3), pos = _mm256_and_si256(el, _mm256_set1_epi16(7));
            if (sd != 8) t->perm16[k][0] = tc_word_shuf(pos, _mm256_set1_epi16(-1));   /* (the merges) */
            for (int m = 0; m < sd && sd == 8; m++)
                t->shuf[k][m] = tc_word_shuf(pos, _mm256_cmpeq_epi16(chunk, _mm256_set1_epi16((short)m)));
        }
        return;
    }
    const __m256i base = _mm256_mullo_epi32(_mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0), _mm256_set1_epi32(sd));
    for (int k = 0; k < R; k++) t->idx[k] = _mm256_add_epi32(base, _mm256_set1_epi32(k));
}

/* j = p / sd for p < 64, 2 <= sd <= 8: (p * ceil(2^16 / sd)) >> 16 is exact there */
GDN_INLINE void tc_plan_out(tc_plan *t, const int sd, const int R, const int e) {
    if (e == 2) {   /* chunk m's word w is element 8m + w: row % sd, channel / sd */
        const __m256i magic16 = _mm256_set1_epi16((short)((65536 + sd - 1) / sd));
        __m128i prev = _mm_setzero_si128();   /* chunk m - 1's words written (none before the block) */
        for (int m = 0; m < sd; m++) {
            const __m256i el = _mm256_add_epi16(tc_lane_words(), _mm256_set1_epi16((short)(8 * m)));
            const __m256i ch = _mm256_mulhi_epu16(el, magic16);   /* (el < 64: exact, as said above) */
            const __m256i row = _mm256_sub_epi16(el, _mm256_mullo_epi16(ch, _mm256_set1_epi16((short)sd)));
            for (int k = 0; k < sd && sd == 8; k++)   /* (rows from R on: tc_out shuffles zeros; sd = 4: unpacks) */
                t->shuf[m][k] = tc_word_shuf(ch, _mm256_cmpeq_epi16(row, _mm256_set1_epi16((short)k)));
            /* R < sd: the words written (rows < R), shifted a word up on grid 1 */
            const __m128i wr = _mm_cmpgt_epi16(_mm_set1_epi16((short)R), _mm256_castsi256_si128(row));
            for (int g = 0; g < 2 && R < sd; g++) {
                const __m128i w = g ? _mm_alignr_epi8(wr, prev, 14) : wr;
                t->pairs[g][m] = _mm_and_si128(w, _mm_shufflehi_epi16(_mm_shufflelo_epi16(w, 0xb1), 0xb1));
            }
            prev = wr;
        }
        for (int k = 0; k < R && sd != 4 && sd != 8; k++) {   /* the lane merges' inverse (as inv below) */
            const __m256i d = _mm256_sub_epi16(tc_lane_words(), _mm256_set1_epi16((short)k));
            for (int h = 0; h < (sd & 1 ? 1 : 2); h++) {   /* (TC_SETS) */
                const __m256i half = _mm256_mullo_epi16(_mm256_srai_epi16(d, 1), _mm256_set1_epi16((short)(sd / 2)));
                const __m256i j = sd & 1 ? _mm256_mullo_epi16(d, _mm256_set1_epi16((short)sd))
                                         : _mm256_add_epi16(_mm256_set1_epi16((short)(4 * h)),
                                                            _mm256_and_si256(half, _mm256_set1_epi16(3)));
                t->perm16[k][h] = tc_word_shuf(_mm256_and_si256(j, _mm256_set1_epi16(7)), _mm256_set1_epi16(-1));
            }
        }
        return;
    }
    const __m256i magic = _mm256_set1_epi32((65536 + sd - 1) / sd);
    for (int m = 0; m < sd; m++) {
        const __m256i p = _mm256_add_epi32(_mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0), _mm256_set1_epi32(8 * m));
        const __m256i j = _mm256_srli_epi32(_mm256_mullo_epi32(p, magic), 16);
        const __m256i k = _mm256_sub_epi32(p, _mm256_mullo_epi32(j, _mm256_set1_epi32(sd)));
        t->idx[m] = _mm256_add_epi32(_mm256_slli_epi32(k, 3), j);   /* row k, channel j */
        t->keep[m] = _mm256_cmpgt_epi32(_mm256_set1_epi32(R), k);
    }
    /* odd sd is its own inverse mod 8 (3 * 3, 5 * 5, 7 * 7 = 1): j = (i - k) * sd mod 8; sd = 2s
     * (s = 1, 3: its own inverse mod 4), half h: j = 4h + (s (i - k) / 2 mod 4), i - k even */
    for (int k = 0; k < R; k++) {
        const __m256i d = _mm256_sub_epi32(_mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0), _mm256_set1_epi32(k));
        if (sd & 1) t->inv[k][0] = _mm256_mullo_epi32(d, _mm256_set1_epi32(sd));
        for (int h = 0; h < 2 && !(sd & 1); h++)
            t->inv[k][h] = _mm256_add_epi32(
                _mm256_set1_epi32(4 * h),
                _mm256_and_si256(_mm256_mullo_epi32(_mm256_srai_epi32(d, 1), _mm256_set1_epi32(sd / 2)), _mm256_set1_epi32(3)));
    }
}

GDN_INLINE int tc_out_ok(const int sd, const int R, const int e) { return e == 4 || sd == R || R >= 2; }

/* fp32, sd odd or 2 or 6 (the lane merges): the lanes of block vector M whose elements
 * are row K's (8M + i = j*SD + K) for channels j in [4H, 4H + 4), for all eight
 * channels (odd SD: they lie in distinct lanes), and for channel set H of TC_SETS(SD):
 * all eight for odd SD, else half H (j*SD + K mod 8 is then one-to-one within a half).
 * Immediates: SD, K, M and H are literals. */
#define TC_LJ(SD, K, M, J) ((((SD) * (J) + (K)) >> 3) == (M) ? 1 << (((SD) * (J) + (K)) & 7) : 0)
#define TC_LANES4(SD, K, M, H) \
    (TC_LJ(SD, K, M, 4 * (H)) | TC_LJ(SD, K, M, 4 * (H) + 1) | TC_LJ(SD, K, M, 4 * (H) + 2) | TC_LJ(SD, K, M, 4 * (H) + 3))
#define TC_SETS(SD) ((SD) & 1 ? 1 : 2)
#define TC_SET(SD, K, M, H)                                                                   \
    ((M) < (SD) && (K) < (SD) && (H) < TC_SETS(SD)                                            \
         ? ((SD) & 1 ? TC_LANES4(SD, K, M, 0) | TC_LANES4(SD, K, M, 1) : TC_LANES4(SD, K, M, H)) \
         : 0)
/* the merges: fp32 lanes of a 256-bit vector; 16-bit, words of each 128-bit lane (the two
 * halves of a 16-bit line, which have the same pattern) */
#define TC_MERGE(r, s, MASK) \
    if (MASK) r = _mm256_blend_epi32(r, s, MASK);
#define TC_MERGE16(r, s, MASK) \
    if (MASK) r = _mm256_blend_epi16(r, s, MASK);
/* in: r <- block vectors v merged (by MERGE) where row K's elements of channel set H lie */
#define TC_SET_ROW(r, SD, K, H, MERGE)                                                                          \
    r = v[0];                                                                                                  \
    MERGE(r, v[1], TC_SET(SD, K, 1, H)) MERGE(r, v[2], TC_SET(SD, K, 2, H))                                    \
    MERGE(r, v[3], TC_SET(SD, K, 3, H)) MERGE(r, v[4], TC_SET(SD, K, 4, H))                                    \
    MERGE(r, v[5], TC_SET(SD, K, 5, H)) MERGE(r, v[6], TC_SET(SD, K, 6, H))
/* row K: each set's merge permuted to channel order (two sets: lanes 0-3 from the first) */
#define TC_MERGED_ROW(SD, K)                                                                                   \
    if (K < R) {                                                                                               \
        __m256i r0, r1;                                                                                        \
        TC_SET_ROW(r0, SD, K, 0, TC_MERGE)                                                                            \
        __m256i row = _mm256_permutevar8x32_epi32(r0, t->idx[K]);                                              \
        if (TC_SETS(SD) == 2) {                                                                                \
            TC_SET_ROW(r1, SD, K, 1, TC_MERGE)                                                                        \
            row = _mm256_blend_epi32(row, _mm256_permutevar8x32_epi32(r1, t->idx[K]), 0xf0);                   \
        }                                                                                                      \
        _mm256_storeu_si256((__m256i *)(dst + K * bs), row);                                                   \
    }
#define TC_MERGED_IN(SD)                                                                                       \
    do {                                                                                                       \
        for (int m = 0; m < SD; m++) v[m] = _mm256_loadu_si256((const __m256i *)(src + 32 * m));               \
        TC_MERGED_ROW(SD, 0) TC_MERGED_ROW(SD, 1) TC_MERGED_ROW(SD, 2) TC_MERGED_ROW(SD, 3)                    \
        TC_MERGED_ROW(SD, 4) TC_MERGED_ROW(SD, 5) TC_MERGED_ROW(SD, 6)                                         \
    } while (0)
/* out: block vector M <- the rows permuted per channel set, p[k][h], merged where each
 * row's elements of each set lie (rows from R on are zero, and their lanes not stored) */
#define TC_MERGE_K(r, SD, K, M, MERGE) MERGE(r, p[K][0], K ? TC_SET(SD, K, M, 0) : 0) MERGE(r, p[K][1], TC_SET(SD, K, M, 1))
#define TC_MERGE_ROWS(r, SD, M, MERGE)                                                                         \
    r = p[0][0];                                                                                               \
    TC_MERGE_K(r, SD, 0, M, MERGE) TC_MERGE_K(r, SD, 1, M, MERGE) TC_MERGE_K(r, SD, 2, M, MERGE)               \
    TC_MERGE_K(r, SD, 3, M, MERGE) TC_MERGE_K(r, SD, 4, M, MERGE) TC_MERGE_K(r, SD, 5, M, MERGE)               \
    TC_MERGE_K(r, SD, 6, M, MERGE)
#define TC_MERGED_VEC(SD, M)                                                                                   \
    if (M < SD) {                                                                                              \
        __m256i r;                                                                                             \
        TC_MERGE_ROWS(r, SD, M, TC_MERGE)                                                                      \
        if (R == SD) _mm256_storeu_si256((__m256i *)(dst + 32 * M), r);                                        \
        else _mm256_maskstore_epi32((int *)(dst + 32 * M), t->keep[M], r);                                     \
    }
#define TC_MERGED_OUT(SD)                                                                                      \
    do {                                                                                                       \
        for (int k = 0; k < SD; k++)                                                                           \
            for (int h = 0; h < TC_SETS(SD); h++)                                                              \
                p[k][h] = k < R ? _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(src + k * bs)), \
                                                              t->inv[k][h])                                    \
                                : _mm256_setzero_si256();                                                      \
        TC_MERGED_VEC(SD, 0) TC_MERGED_VEC(SD, 1) TC_MERGED_VEC(SD, 2) TC_MERGED_VEC(SD, 3)                    \
        TC_MERGED_VEC(SD, 4) TC_MERGED_VEC(SD, 5) TC_MERGED_VEC(SD, 6)                                         \
    } while (0)

/* 16-bit, sd 2, 3, 5, 6, 7: the same merges on the words of each 128-bit lane (a line's two
 * halves, with the same pattern: one immediate serves both), each merge's words put in
 * place by one byte shuffle. in: row K of the line's 16 channels from its chunks v */
#define TC_MERGED_ROW16(SD, K)                                                                                 \
    if (K < R) {                                                                                               \
        __m256i r0, r1;                                                                                        \
        TC_SET_ROW(r0, SD, K, 0, TC_MERGE16)                                                                   \
        __m256i row = _mm256_shuffle_epi8(r0, t->perm16[K][0]);                                                \
        if (TC_SETS(SD) == 2) {                                                                                \
            TC_SET_ROW(r1, SD, K, 1, TC_MERGE16)                                                               \
            row = _mm256_blend_epi16(row, _mm256_shuffle_epi8(r1, t->perm16[K][0]), 0xf0);                     \
        }                                                                                                      \
        _mm256_storeu_si256((__m256i *)(dst + K * bs), row);                                                   \
    }
#define TC_MERGED_IN16(SD)                                                                                     \
    do {                                                                                                       \
        TC_MERGED_ROW16(SD, 0) TC_MERGED_ROW16(SD, 1) TC_MERGED_ROW16(SD, 2) TC_MERGED_ROW16(SD, 3)            \
        TC_MERGED_ROW16(SD, 4) TC_MERGED_ROW16(SD, 5) TC_MERGED_ROW16(SD, 6)                                   \
    } while (0)
/* out: chunk M of both halves, r[M], from rows v (those from R on zero) shuffled per set */
#define TC_MERGED_CHUNK16(SD, M) \
    if (M < SD) { TC_MERGE_ROWS(r[M], SD, M, TC_MERGE16) }
#define TC_MERGED_CHUNKS16(SD)                                                                                 \
    do {                                                                                                       \
        __m256i p[GDN_MAX_WIDTH][2];                                                                           \
        for (int k = 0; k < SD; k++)                                                                           \
            for (int h = 0; h < TC_SETS(SD); h++)                                                              \
                p[k][h] = k < R ? _mm256_shuffle_epi8(v[k], t->perm16[k][h]) : _mm256_setzero_si256();         \
        TC_MERGED_CHUNK16(SD, 0) TC_MERGED_CHUNK16(SD, 1) TC_MERGED_CHUNK16(SD, 2) TC_MERGED_CHUNK16(SD, 3)    \
        TC_MERGED_CHUNK16(SD, 4) TC_MERGED_CHUNK16(SD, 5) TC_MERGED_CHUNK16(SD, 6)                             \
    } while (0)

/* a switch's cases for the sd the merges take, each running F(SD) with SD a literal */
#define TC_MERGED_CASES(F) \
    case 2: F(2); return;  \
    case 3: F(3); return;  \
    case 5: F(5); return;  \
    case 6: F(6); return;  \
    case 7: F(7); return;

/* fp32, sd = 4: rows k < R from the four 128-bit lanes' channels (a 4x4 transposition in
 * lanes) and back; x4 holds channels (c, c + 4) (in) or (2c, 2c + 1) (out) */
GDN_INLINE void tc_4x4(__m256 *y, const __m256 *x) {
    const __m256 t0 = _mm256_shuffle_ps(x[0], x[1], 0x44), t1 = _mm256_shuffle_ps(x[2], x[3], 0x44);
    const __m256 t2 = _mm256_shuffle_ps(x[0], x[1], 0xee), t3 = _mm256_shuffle_ps(x[2], x[3], 0xee);
    y[0] = _mm256_shuffle_ps(t0, t1, 0x88);
    y[1] = _mm256_shuffle_ps(t0, t1, 0xdd);
    y[2] = _mm256_shuffle_ps(t2, t3, 0x88);
    y[3] = _mm256_shuffle_ps(t2, t3, 0xdd);
}

/* lane i <- flat element idx_i of v[0..n-1] */
GDN_INLINE __m256i tc_gather(const __m256i *v, const int n, __m256i idx) {
    const __m256i src = _mm256_srli_epi32(idx, 3);
    __m256i r = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int m = 0; m < n; m++)
        r = _mm256_blendv_epi8(r, _mm256_permutevar8x32_epi32(v[m], idx), _mm256_cmpeq_epi32(src, _mm256_set1_epi32(m)));
    return r;
}

/* the OR over m < n of v[m] shuffled by shuf[m] (16-bit lines) */
GDN_INLINE __m256i tc_shuffle_or(const __m256i *v, const int n, const __m256i *shuf) {
    __m256i r = _mm256_shuffle_epi8(v[0], shuf[0]);
#pragma GCC unroll 8
    for (int m = 1; m < n; m++) r = _mm256_or_si256(r, _mm256_shuffle_epi8(v[m], shuf[m]));
    return r;
}

/* 16-bit out: the sd chunks r[m] of a line (both halves) from rows v[k] (those from R on
 * are zero): by the lane merges; at sd = 4 a 4x4 word transposition per channel pair by
 * unpacks (8 where the shuffles took 12-16 and 9-12 ORs); sd = 8 by shuffles (n rows) */
GDN_INLINE void tc_chunks(__m256i *r, const __m256i *v, const int sd, const int n, const int R, const tc_plan *t) {
    switch (sd) {
    TC_MERGED_CASES(TC_MERGED_CHUNKS16)
    default: break;
    }
    if (sd == 4) {
        const __m256i a0 = _mm256_unpacklo_epi16(v[0], v[1]), a1 = _mm256_unpackhi_epi16(v[0], v[1]);
        const __m256i b0 = _mm256_unpacklo_epi16(v[2], v[3]), b1 = _mm256_unpackhi_epi16(v[2], v[3]);
        r[0] = _mm256_unpacklo_epi32(a0, b0), r[1] = _mm256_unpackhi_epi32(a0, b0);
        r[2] = _mm256_unpacklo_epi32(a1, b1), r[3] = _mm256_unpackhi_epi32(a1, b1);
        return;
    }
#pragma GCC unroll 8
    for (int m = 0; m < sd; m++) r[m] = tc_shuffle_or(v, n, t->shuf[m]);
}

GDN_INLINE void tc_in(char *dst, int64_t bs, const char *src, const int sd, const int R, const tc_plan *t,
                      const int e) {
    __m256i v[GDN_MAX_WIDTH];
    if (e == 2) {
#pragma GCC unroll 8
        for (int m = 0; m < sd; m++)
            v[m] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(src + 16 * m))),
                                           _mm_loadu_si128((const __m128i *)(src + 16 * (sd + m))), 1);
        if (sd == 4) {   /* a 4x4 word transposition per channel pair, by unpacks */
            const __m256i a0 = _mm256_unpacklo_epi16(v[0], v[1]), a1 = _mm256_unpackhi_epi16(v[0], v[1]);
            const __m256i a2 = _mm256_unpacklo_epi16(v[2], v[3]), a3 = _mm256_unpackhi_epi16(v[2], v[3]);
            const __m256i b0 = _mm256_unpacklo_epi16(a0, a1), b1 = _mm256_unpackhi_epi16(a0, a1);   /* rows 0, 1 | 2, 3 */
            const __m256i b2 = _mm256_unpacklo_epi16(a2, a3), b3 = _mm256_unpackhi_epi16(a2, a3);   /* of channels 4-7 */
            _mm256_storeu_si256((__m256i *)dst, _mm256_unpacklo_epi64(b0, b2));
            if (R > 1) _mm256_storeu_si256((__m256i *)(dst + bs), _mm256_unpackhi_epi64(b0, b2));
            if (R > 2) _mm256_storeu_si256((__m256i *)(dst + 2 * bs), _mm256_unpacklo_epi64(b1, b3));
            if (R > 3) _mm256_storeu_si256((__m256i *)(dst + 3 * bs), _mm256_unpackhi_epi64(b1, b3));
            return;
        }
        switch (sd) {
        TC_MERGED_CASES(TC_MERGED_IN16)
        default: break;
        }
#pragma GCC unroll 8
        for (int k = 0; k < R; k++) _mm256_storeu_si256((__m256i *)(dst + k * bs), tc_shuffle_or(v, sd, t->shuf[k]));
        return;
    }
    switch (sd) {
    TC_MERGED_CASES(TC_MERGED_IN)
    case 4: {   /* lane l of x[c] <- channel c + 4 l; y[k] lane l <- channels 4 l .. 4 l + 3 of row k */
        __m256 x[4], y[4];
        for (int c = 0; c < 4; c++)
            x[c] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps((const float *)(src + 16 * c))),
                                        _mm_loadu_ps((const float *)(src + 16 * (c + 4))), 1);
        tc_4x4(y, x);
        for (int k = 0; k < R; k++) _mm256_storeu_ps((float *)(dst + k * bs), y[k]);
        return;
    }
    default: break;
    }
#pragma GCC unroll 8
    for (int m = 0; m < sd; m++) v[m] = _mm256_loadu_si256((const __m256i *)(src + 32 * m));
#pragma GCC unroll 8
    for (int k = 0; k < R; k++) _mm256_storeu_si256((__m256i *)(dst + k * bs), tc_gather(v, sd, t->idx[k]));
}

GDN_INLINE void tc_out(char *dst, const int sd, const int R, const char *src, int64_t bs, const tc_plan *t,
                       const int e) {
    __m256i v[GDN_MAX_WIDTH];
    if (e == 2) {   /* (sd: a constant, R is not; rows from R on zero) */
        __m256i r[GDN_MAX_WIDTH];
        if (R == sd) {
#pragma GCC unroll 8
            for (int k = 0; k < sd; k++) v[k] = _mm256_loadu_si256((const __m256i *)(src + k * bs));
            tc_chunks(r, v, sd, sd, R, t);
#pragma GCC unroll 8
            for (int m = 0; m < sd; m++) {
                _mm_storeu_si128((__m128i *)(dst + 16 * m), _mm256_castsi256_si128(r[m]));
                _mm_storeu_si128((__m128i *)(dst + 16 * (sd + m)), _mm256_extracti128_si256(r[m], 1));
            }
            return;
        }
#pragma GCC unroll 8
        for (int k = 0; k < sd; k++) v[k] = k < R ? _mm256_loadu_si256((const __m256i *)(src + k * bs)) : _mm256_setzero_si256();
        tc_chunks(r, v, sd, sd - 1, R, t);   /* R < sd (tc_out_ok: R >= 2) */
#pragma GCC unroll 8
        for (int m = 0; m < sd; m++) {
            const __m256i s1 = _mm256_alignr_epi8(r[m], m ? r[m - 1] : _mm256_setzero_si256(), 14);
            char *d0 = dst + 16 * m, *d1 = dst + 16 * (sd + m);
            _mm_maskstore_epi32((int *)d0, t->pairs[0][m], _mm256_castsi256_si128(r[m]));
            _mm_maskstore_epi32((int *)d1, t->pairs[0][m], _mm256_extracti128_si256(r[m], 1));
            _mm_maskstore_epi32((int *)(d0 - 2), t->pairs[1][m], _mm256_castsi256_si128(s1));
            _mm_maskstore_epi32((int *)(d1 - 2), t->pairs[1][m], _mm256_extracti128_si256(s1, 1));
        }
        return;
    }
    __m256i p[GDN_MAX_WIDTH][2];
    switch (sd) {
    TC_MERGED_CASES(TC_MERGED_OUT)
    case 4: {   /* rows in channel order (0 2 4 6 1 3 5 7): y[c] lane l <- channel 2c + l's 4 rows */
        const __m256i evens = _mm256_set_epi32(7, 5, 3, 1, 6, 4, 2, 0);
        __m256 x[4], y[4];
        for (int k = 0; k < 4; k++)
            x[k] = k < R ? _mm256_permutevar8x32_ps(_mm256_loadu_ps((const float *)(src + k * bs)), evens)
                         : _mm256_setzero_ps();
        tc_4x4(y, x);
        for (int c = 0; c < 4; c++) {
            if (R == 4) _mm256_storeu_ps((float *)(dst + 32 * c), y[c]);
            else _mm256_maskstore_ps((float *)(dst + 32 * c), t->keep[c], y[c]);
        }
        return;
    }
    default: break;
    }
#pragma GCC unroll 8
    for (int k = 0; k < sd; k++) v[k] = k < R ? _mm256_loadu_si256((const __m256i *)(src + k * bs)) : _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int m = 0; m < sd; m++)   /* sd: a constant, R is not */
        _mm256_maskstore_epi32((int *)(dst + 32 * m), t->keep[m], tc_gather(v, sd, t->idx[m]));
}

/* keeps the compiler from seeing through a register (see update_simd.h's simd_copy) */
#define GDN_SIMD_OPAQUE(v) __asm__("" : "+v"(v))

#endif
