/* The SIMD loop structure shared by the ISA kernels; included by conv_<isa>.c after
 * it defines, for its vector width:
 *   V, R              fp32 vector and raw-bits vector (16-bit lanes in the low half)
 *   LANES             channels per vector
 *   ld_raw, st_raw    load / store LANES raw elements of dtype dt
 *   to_f32, from_f32  raw <-> fp32 (rounding to nearest even)
 *   vload, vstore, vfma
 *   vsilu_n(y, n, dt)     silu of n vectors in place, each step across all n
 *   gather_taps(v, W, k)  tap k of LANES channels from W vectors holding [LANES, W]
 *   taps16(src, wdt, W, t)  optional (SIMD_TAPS16): the same for 16-bit weights, W <= 4
 *   st2_native(p, lo, hi)   optional (SIMD_ST2_NATIVE): store two vectors of dtype
 *                           GDN_BF16_NATIVE, lo then hi, exactly as two st_raw(from_f32)
 * and then defines its kernels as calls of simd_kernel().
 * Channels past the last whole 64-byte line of a block go to the shared scalar core. */

#define GDN_SLAB 8  /* tokens staged at a time */

/* Tokens j0 .. j0+n-1 of a slab, one line step (NV vectors per row): the tokens are
 * rows H + j of the staging buffer, outputs go to out rows j. The convolutions
 * run first, then SiLU stage by stage across the n*NV vectors (independent chains
 * side by side keep the FP pipes busy: the exp-reciprocal chain is ~45 cycles
 * long), then the stores. The window hf slides by n. */
GDN_INLINE void simd_tokens(const char *xs, int64_t bs, char *os, int64_t ot, int64_t j0, V w[][4],
                            const V *b, V hf[][4], const int n, const int NV, const int dt, const int W,
                            const int silu) {
    const int H = W - 1;
    const int64_t ve = LANES * gdn_elsize(dt);
    V E[GDN_MAX_WIDTH - 1 + 4][4], acc[4];   /* window then the n new tokens, fp32 */
#pragma GCC unroll 8
    for (int k = 0; k < H; k++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) E[k][v] = hf[k][v];
#pragma GCC unroll 8
    for (int j = 0; j < n; j++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            E[H + j][v] = to_f32(ld_raw(xs + (H + j0 + j) * bs + v * ve, dt), dt);
            acc[j * NV + v] = b[v];
#pragma GCC unroll 8
            for (int k = 0; k < W; k++) acc[j * NV + v] = vfma(w[k][v], E[j + k][v], acc[j * NV + v]);
        }
    if (silu) vsilu_n(acc, n * NV, dt);
#pragma GCC unroll 8
    for (int j = 0; j < n; j++) {
#ifdef SIMD_ST2_NATIVE
        if (dt == GDN_BF16_NATIVE && NV == 2) {
            st2_native(os + (j0 + j) * ot, acc[j * NV], acc[j * NV + 1]);
            continue;
        }
#endif
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) st_raw(os + (j0 + j) * ot + v * ve, from_f32(acc[j * NV + v], dt), dt);
    }
#pragma GCC unroll 8
    for (int k = 0; k < H; k++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) hf[k][v] = E[n + k][v];
}

/* bytes (a multiple of 64) from src to dst, raw, in ascending order (so dst < src
 * may overlap). The empty asm keeps the compiler from turning the loop into a
 * memcpy call (~14 calls of 512 bytes per request and block, where the profile
 * put 14% of the time at B=1; inline copies measured ~2% faster). */
GDN_INLINE void simd_copy(char *dst, const char *src, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += LANES * 4) {
        R v = ld_raw(src + o, GDN_F32);
        __asm__("" : "+v"(v));
        st_raw(dst + o, v, GDN_F32);
    }
}

/* One row copy of a staged block: bytes from src to dst (simd_copy). */
typedef struct { char *dst; const char *src; } simd_row_copy;

/* The row copies that stage tokens t0 .. t0+nt-1 of one block of request r (st and
 * x at the block's first channel) into buf, in the order they must run: the window
 * (slab 0: conv_state rows off.., and in spec mode the kept rows written back to rows
 * 0..W-3; a later slab: the previous slab's last H rows, buf rows prev..), then the
 * tokens, and in spec mode their state rows W-2+t. At most 2 (W-1) + 2 GDN_SLAB. */
GDN_INLINE int simd_stage(simd_row_copy *rc, char *buf, int64_t bs, const gdn_request *r, char *st,
                          const char *x, int64_t sl, int64_t xt, int64_t t0, int64_t nt, int64_t prev,
                          const int H, const int spec) {
    int n = 0;
    for (int k = 0; k < H; k++) {
        rc[n].dst = buf + k * bs;
        rc[n++].src = t0 == 0 ? st + (r->off + k) * sl : buf + (prev + k) * bs;
    }
    if (spec && t0 == 0)
        for (int k = 0; k + 1 < H; k++) {
            rc[n].dst = st + k * sl;
            rc[n++].src = buf + (k + 1) * bs;
        }
    for (int64_t j = 0; j < nt; j++) {
        rc[n].dst = buf + (H + j) * bs;
        rc[n++].src = x + (t0 + j) * xt;
    }
    if (spec)
        for (int64_t j = 0; j < nt; j++) {
            rc[n].dst = st + (H - 1 + t0 + j) * sl;
            rc[n++].src = buf + (H + j) * bs;
        }
    return n;
}

/* The first item (request, channel block) at or after q whose request is not skipped;
 * items = (r1 - r0) * nb when there is none. */
GDN_INLINE int64_t simd_next_item(const gdn_params *p, int64_t r0, int64_t nb, int64_t items, int64_t q,
                                  gdn_request *r) {
    for (; q < items; q += nb - q % nb) {
        *r = gdn_get_request(p, r0 + q / nb);
        if (!r->skip) break;
    }
    return q;
}

GDN_INLINE void simd_fill(const gdn_params *p, int64_t c0, int64_t c1, float *w, int64_t ld, float *b);
static void simd_weights(const gdn_params *p, int64_t cs, int64_t n, float (*wbuf)[GDN_BLOCK_CHANNELS],
                         float *bbuf, const float **wrow, const float **brow);

/* Requests [r0, r1) x channels [c0, c1) for constant dtype, width and activation, as
 * items (request, block of GDN_BLOCK_CHANNELS channels), request-major.
 *
 * Every row an item touches is staged through a small buffer, row by row: the
 * rows of x, out and conv_state are often a multiple of 4 KiB apart, so reading
 * or writing one channel position in all ~2T+L of them at once lands every line in
 * one L1 set, which thrashes (measured at B=1, D=8192 bf16: 2.9 ns per channel,
 * against 1.0 when D=8704; re-measured on the kernel below: reading and writing the
 * rows in place, all loads of a line step before its stores, took 30 cycles per 16
 * bf16 outputs at D=8192 against 13 staged, and 12.5 with rows 64 elements apart).
 * Per slab of up to GDN_SLAB tokens:
 *   buf rows 0..H-1 = the window (conv_state rows off..off+H-1, then the last H
 *   inputs of the previous slab), rows H.. = the slab's tokens (raw bits);
 *   the state roll is written from buf, row by row; the convolution reads buf,
 *   with weights and history in registers, and writes out. Everything an item
 *   reads is read before it writes, so out may be x.
 * The copies wait on the caches and the convolution on the FP pipes, so they run
 * side by side: the next item's first slab is staged into the other buffer, a few
 * rows after each line step of the current item's last slab (D=8192, T=4, silu, two
 * threads, medians of 11 interleaved rounds against staging each item before its
 * compute: bf16 B=4 -3%, B=16 -4%, B=64 -1%, B=1 and no activation unchanged; fp32
 * B=16 -28%). Items touch disjoint channels or slots, so the order of one item's
 * copies against another's reads and writes does not matter. */
GDN_INLINE void simd_unit(const gdn_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                          const int dt, const int W, const int silu) {
    const int H = W - 1;
    const int64_t e = gdn_elsize(dt), ve = LANES * e, sl = p->state_stride_l * e;
    const int64_t xt = p->x_stride_t * e, ot = p->out_stride_t * e;
    const int NV = ve < 64 ? (int)(64 / ve) : 1;     /* vectors per 64-byte line */
    const int G = 4 / NV;                             /* tokens per group: G * NV = 4 vectors */
    const int64_t step = NV * LANES;
    const int64_t bs = GDN_BLOCK_CHANNELS * e;       /* buf row stride */
    const int spec = p->num_accepted_tokens != NULL;
    const int64_t nb = (c1 - c0 + GDN_BLOCK_CHANNELS - 1) / GDN_BLOCK_CHANNELS, items = (r1 - r0) * nb;
    GDN_ALIGN64 char bufs[2][(GDN_MAX_WIDTH - 1 + GDN_SLAB) * GDN_BLOCK_CHANNELS * 4];
    GDN_ALIGN64 float wbuf[GDN_MAX_WIDTH][GDN_BLOCK_CHANNELS];
    GDN_ALIGN64 float bbuf[GDN_BLOCK_CHANNELS];
    simd_row_copy rc[2 * (GDN_MAX_WIDTH - 1) + 2 * GDN_SLAB];
    gdn_request r, rn;
    int64_t q = simd_next_item(p, r0, nb, items, 0, &r), rbytes = 0;
    int nrc = 0, done = 0, cur = 0;
#define ITEM_CHANNELS(q, cs, nline)                                                          \
    const int64_t cs = c0 + (q) % nb * GDN_BLOCK_CHANNELS;                                   \
    const int64_t nline = ((cs + GDN_BLOCK_CHANNELS < c1 ? cs + GDN_BLOCK_CHANNELS : c1) - cs) / step * step
    /* the copies of item qq's first slab (request req) into buffer into: nrc of rbytes */
#define STAGE_FIRST(qq, req, into)                                                                       \
    do {                                                                                                 \
        ITEM_CHANNELS(qq, cs_, nline_);                                                                  \
        rbytes = nline_ * e;                                                                             \
        nrc = simd_stage(rc, into, bs, &(req), (req).state + e * cs_, (req).x + e * cs_, sl, xt, 0,      \
                         (req).T < GDN_SLAB ? (req).T : GDN_SLAB, 0, H, spec);                          \
    } while (0)
    if (q < items) {   /* the first item's first slab, before anything overlaps it */
        STAGE_FIRST(q, r, bufs[0]);
        for (int k = 0; k < nrc; k++) simd_copy(rc[k].dst, rc[k].src, rbytes);
    }
    while (q < items) {
        ITEM_CHANNELS(q, cs, nline);
        const int64_t ce = cs + GDN_BLOCK_CHANNELS < c1 ? cs + GDN_BLOCK_CHANNELS : c1;
        const int64_t qn = simd_next_item(p, r0, nb, items, q + 1, &rn);
        char *buf = bufs[cur], *st = r.state + e * cs, *os = r.out + e * cs;
        const float *wrow[GDN_MAX_WIDTH], *brow;
        if (nline > 0) simd_weights(p, cs, nline, wbuf, bbuf, wrow, &brow);
        int64_t nt = 0;
        for (int64_t t0 = 0; t0 < r.T && nline > 0; t0 += GDN_SLAB, os += GDN_SLAB * ot) {
            const int64_t prev = nt;
            nt = r.T - t0 < GDN_SLAB ? r.T - t0 : GDN_SLAB;
            if (t0 > 0) {   /* a later slab of a long request: staged in place, then computed */
                nrc = simd_stage(rc, buf, bs, &r, st, r.x + e * cs, sl, xt, t0, nt, prev, H, spec);
                for (int k = 0; k < nrc; k++) simd_copy(rc[k].dst, rc[k].src, nline * e);
            }
            nrc = done = 0;
            if (t0 + nt >= r.T && qn < items) STAGE_FIRST(qn, rn, bufs[cur ^ 1]);   /* during the last slab */
            /* copies per line step, rounded up: all are done by the last step (the loop
             * after it does nothing, but GCC 12 scheduled the loop above 2-5% faster
             * with it: B = 4-64, two threads, 7-9 interleaved rounds) */
            const int per = (int)((nrc * step + nline - 1) / nline);
            for (int64_t c = 0; c < nline; c += step) {
                V w[GDN_MAX_WIDTH][4], hf[GDN_MAX_WIDTH - 1][4], b[4];
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++) {
                    b[v] = vload(brow + c + v * LANES);
#pragma GCC unroll 8
                    for (int k = 0; k < W; k++) w[k][v] = vload(wrow[k] + c + v * LANES);
#pragma GCC unroll 8
                    for (int k = 0; k < H; k++) hf[k][v] = to_f32(ld_raw(buf + k * bs + (c + v * LANES) * e, dt), dt);
                }
                /* groups of G tokens, the remainder (< G) in halving groups */
                int64_t j = 0;
                for (; j + G <= nt; j += G)
                    simd_tokens(buf + c * e, bs, os + c * e, ot, j, w, b, hf, G, NV, dt, W, silu);
                if (G > 2 && j + 2 <= nt) {
                    simd_tokens(buf + c * e, bs, os + c * e, ot, j, w, b, hf, 2, NV, dt, W, silu);
                    j += 2;
                }
                if (j < nt) simd_tokens(buf + c * e, bs, os + c * e, ot, j, w, b, hf, 1, NV, dt, W, silu);
                for (int k = 0; k < per && done < nrc; k++, done++) simd_copy(rc[done].dst, rc[done].src, rbytes);
            }
            for (; done < nrc; done++) simd_copy(rc[done].dst, rc[done].src, rbytes);
        }
        if (!spec)   /* rows 0..W-2 <- the last W-1 inputs of the window */
            for (int k = 0; k < H; k++) simd_copy(st + k * sl, buf + (nt + k) * bs, nline * e);
        if (nline < ce - cs) gdn_scalar_range(p, &r, 1, cs + nline, ce);
        if (nline == 0 && qn < items) {   /* no line step to overlap the next item's staging */
            STAGE_FIRST(qn, rn, bufs[cur ^ 1]);
            for (int k = 0; k < nrc; k++) simd_copy(rc[k].dst, rc[k].src, rbytes);
        }
        if (qn >= items) break;
        q = qn;
        r = rn;
        cur ^= 1;
    }
#undef STAGE_FIRST
#undef ITEM_CHANNELS
}

#define SIMD_UNIT_WIDTHS(dt, silu)                                                      \
    switch (p->width) {                                                                 \
    case 2: simd_unit(p, r0, r1, c0, c1, dt, 2, silu); break;               \
    case 3: simd_unit(p, r0, r1, c0, c1, dt, 3, silu); break;               \
    case 4: simd_unit(p, r0, r1, c0, c1, dt, 4, silu); break;               \
    case 5: simd_unit(p, r0, r1, c0, c1, dt, 5, silu); break;               \
    case 6: simd_unit(p, r0, r1, c0, c1, dt, 6, silu); break;               \
    case 7: simd_unit(p, r0, r1, c0, c1, dt, 7, silu); break;               \
    default: simd_unit(p, r0, r1, c0, c1, dt, 8, silu); break;              \
    }

#define SIMD_UNIT_DTYPES(silu)                                                          \
    switch (p->dtype) {                                                                 \
    case GDN_F32: SIMD_UNIT_WIDTHS(GDN_F32, silu) break;                                \
    case GDN_F16: SIMD_UNIT_WIDTHS(GDN_F16, silu) break;                                \
    default:                                                                            \
        if (bf16_native) SIMD_UNIT_WIDTHS(GDN_BF16_NATIVE, silu)                         \
        else SIMD_UNIT_WIDTHS(GDN_BF16, silu)                                           \
        break;                                                                          \
    }

/* Weights of channels c0.. from a contiguous (D, W) array to W fp32 tap rows
 * (w[k * ld + c]), LANES channels at a time: W vector loads of the channel-major
 * block [LANES, W], then per tap a lane permute (gather_taps), or the ISA's taps16
 * for 16-bit weights with W <= 4. */
GDN_INLINE void simd_fill_weights(const gdn_params *p, int64_t c0, int64_t nvec, float *w, int64_t ld,
                                  const int wdt, const int W) {
    const int64_t e = gdn_elsize(wdt);
    for (int64_t c = 0; c < nvec; c += LANES) {
        const char *src = (const char *)p->weight + e * (c0 + c) * W;   /* [LANES, W] */
        V t[GDN_MAX_WIDTH];
#ifdef SIMD_TAPS16
        if (wdt != GDN_F32 && W <= 4) {
            taps16(src, wdt, W, t);
        } else
#endif
        {
            V v[GDN_MAX_WIDTH];
#pragma GCC unroll 8
            for (int m = 0; m < W; m++) v[m] = to_f32(ld_raw(src + e * m * LANES, wdt), wdt);
#pragma GCC unroll 8
            for (int k = 0; k < W; k++) t[k] = gather_taps(v, W, k);
        }
#pragma GCC unroll 8
        for (int k = 0; k < W; k++) vstore(w + k * ld + c, t[k]);
    }
}

#define SIMD_FILL_WIDTHS(wdt)                                                             \
    switch (p->width) {                                                                   \
    case 2: simd_fill_weights(p, c0, nvec, w, ld, wdt, 2); break;                         \
    case 3: simd_fill_weights(p, c0, nvec, w, ld, wdt, 3); break;                         \
    case 4: simd_fill_weights(p, c0, nvec, w, ld, wdt, 4); break;                         \
    case 5: simd_fill_weights(p, c0, nvec, w, ld, wdt, 5); break;                         \
    case 6: simd_fill_weights(p, c0, nvec, w, ld, wdt, 6); break;                         \
    case 7: simd_fill_weights(p, c0, nvec, w, ld, wdt, 7); break;                         \
    default: simd_fill_weights(p, c0, nvec, w, ld, wdt, 8); break;                        \
    }

/* Weights and bias of channels [c0, c1) as fp32, tap-major (w[k * ld + c], b[c]):
 * whole vectors here, the rest through the scalar conversion. */
GDN_INLINE void simd_fill(const gdn_params *p, int64_t c0, int64_t c1, float *w, int64_t ld, float *b) {
    const int64_t nvec = (c1 - c0) / LANES * LANES;
    const int wdt = p->weight_dtype;
    if (p->weight_stride_w == 1 && p->weight_stride_d == p->width) {
        if (wdt == GDN_F32) SIMD_FILL_WIDTHS(GDN_F32)
        else if (wdt == GDN_F16) SIMD_FILL_WIDTHS(GDN_F16)
        else SIMD_FILL_WIDTHS(GDN_BF16)
    } else {
        gdn_fill_weights_any(p, c0, nvec, w, ld, b);
    }
    if (p->bias && p->bias_stride == 1) {
        for (int64_t c = 0; c < nvec; c += LANES)
            vstore(b + c, to_f32(ld_raw((const char *)p->bias + gdn_elsize(wdt) * (c0 + c), wdt), wdt));
    } else {
        gdn_fill_bias(p, c0, nvec, b);
    }
    if (nvec < c1 - c0) gdn_fill_weights_any(p, c0 + nvec, c1 - c0 - nvec, w + nvec, ld, b + nvec);
}

/* Weights and bias of channels [cs, cs + n) as fp32 tap rows: fp32 weights with unit
 * channel stride (pack_weight's layout, or gdn_run's per-thread copy) in place, any
 * others converted into wbuf and bbuf. */
static void simd_weights(const gdn_params *p, int64_t cs, int64_t n, float (*wbuf)[GDN_BLOCK_CHANNELS],
                         float *bbuf, const float **wrow, const float **brow) {
    *brow = bbuf;
    if (p->weight_dtype == GDN_F32 && p->weight_stride_d == 1) {
        for (int64_t k = 0; k < p->width; k++) wrow[k] = (const float *)p->weight + cs + k * p->weight_stride_w;
        if (p->bias && p->bias_stride == 1) *brow = (const float *)p->bias + cs;
        else gdn_fill_bias(p, cs, n, bbuf);
    } else {
        simd_fill(p, cs, cs + n, &wbuf[0][0], GDN_BLOCK_CHANNELS, bbuf);
        for (int64_t k = 0; k < p->width; k++) wrow[k] = wbuf[k];
    }
}

/* The kernel; bf16_native (a constant) stores bf16 with the ISA's conversion
 * instruction (dtype code GDN_BF16_NATIVE) instead of integer rounding. */
GDN_INLINE void simd_kernel(const gdn_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                            const int bf16_native) {
    if (p->silu) {
        SIMD_UNIT_DTYPES(1)
    } else {
        SIMD_UNIT_DTYPES(0)
    }
}
