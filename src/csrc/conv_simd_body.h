/* The SIMD loop structure shared by the ISA kernels; included by conv_<isa>.c after
 * it defines, for its vector width:
 *   V, R              fp32 vector and raw-bits vector (16-bit lanes in the low half)
 *   LANES             channels per vector
 *   ld_raw, st_raw    load / store LANES raw elements of dtype dt
 *   to_f32, from_f32  raw <-> fp32 (rounding to nearest even)
 *   vload, vstore, vfma, vsilu
 *   gather_taps(v, W, k)  tap k of LANES channels from W vectors holding [LANES, W]
 *   SIMD_KERNEL       the name of the kernel to define
 * Channel tails (fewer than LANES channels) go to the shared scalar core. */

/* One (request group, channel block) unit for constant dtype, width and activation.
 * A step covers one 64-byte line of every row (NV vectors): the W-1 history rows
 * and the weights live in registers, every token is read once, its output and
 * (spec mode) its state row written, and the plain-mode roll stores the last W-1
 * inputs at the end. Whole lines matter: the rows of x, out and conv_state are
 * often a multiple of 4 KiB apart, so the ~2T+L lines a step touches share one L1
 * set and evict each other; a half-line step would fetch each line twice
 * (measured at B=1, D=8192 bf16: 2.3 ns per channel with 16-channel steps). */
GDN_INLINE void simd_unit(const gdn_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                          const float *const *wrow, const float *brow, const int dt, const int W,
                          const int silu) {
    const int H = W - 1;
    const int64_t e = gdn_elsize(dt), sl = p->state_stride_l * e;
    const int64_t xt = p->x_stride_t * e, ot = p->out_stride_t * e;
    const int NV = LANES * e < 64 ? (int)(64 / (LANES * e)) : 1;   /* vectors per line */
    const int G = 4 / NV > 1 ? 4 / NV : 1;                          /* tokens loaded ahead */
    const int64_t step = NV * LANES, nline = (c1 - c0) / step * step;
    const int spec = p->num_accepted_tokens != NULL;
    for (int64_t i = r0; i < r1; i++) {
        const gdn_request r = gdn_get_request(p, i);
        if (r.skip) continue;
        for (int64_t c = 0; c < nline; c += step) {
            char *st = r.state + e * (c0 + c);      /* [L, D] at this channel */
            const char *xs = r.x + e * (c0 + c);    /* [T, D] */
            char *os = r.out + e * (c0 + c);        /* [T, D] */
            V w[GDN_MAX_WIDTH][4], hf[GDN_MAX_WIDTH - 1][4], b[4];
            R hr[GDN_MAX_WIDTH - 1][4];
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) {
                b[v] = vload(brow + c + v * LANES);
#pragma GCC unroll 8
                for (int k = 0; k < W; k++) w[k][v] = vload(wrow[k] + c + v * LANES);
#pragma GCC unroll 8
                for (int k = 0; k < H; k++) {
                    hr[k][v] = ld_raw(st + (r.off + k) * sl + v * LANES * e, dt);
                    hf[k][v] = to_f32(hr[k][v], dt);
                }
            }
            if (spec)  /* rows 0..W-3 <- window rows 1..W-2, read above */
#pragma GCC unroll 8
                for (int k = 0; k + 1 < H; k++)
#pragma GCC unroll 4
                    for (int v = 0; v < NV; v++) st_raw(st + k * sl + v * LANES * e, hr[k + 1][v], dt);
            /* G tokens are loaded before the first of their stores, so no load waits
             * behind a store to the same offset in another 4 KiB page. */
            for (int64_t t0 = 0; t0 < r.T; t0 += G) {
                const int64_t n = r.T - t0 < G ? r.T - t0 : G;
                R xr[4][4];
#pragma GCC unroll 4
                for (int j = 0; j < G; j++)
                    if (j < n)
#pragma GCC unroll 4
                        for (int v = 0; v < NV; v++) xr[j][v] = ld_raw(xs + (t0 + j) * xt + v * LANES * e, dt);
#pragma GCC unroll 4
                for (int j = 0; j < G; j++) {
                    if (j >= n) break;
                    const int64_t t = t0 + j;
#pragma GCC unroll 4
                    for (int v = 0; v < NV; v++) {
                        const V xf = to_f32(xr[j][v], dt);
                        V acc = b[v];
#pragma GCC unroll 8
                        for (int k = 0; k < H; k++) acc = vfma(w[k][v], hf[k][v], acc);
                        acc = vfma(w[H][v], xf, acc);
                        if (silu) acc = vsilu(acc, dt);
                        st_raw(os + t * ot + v * LANES * e, from_f32(acc, dt), dt);
                        if (spec) st_raw(st + (W - 2 + t) * sl + v * LANES * e, xr[j][v], dt);
#pragma GCC unroll 8
                        for (int k = 0; k + 1 < H; k++) {
                            hf[k][v] = hf[k + 1][v];
                            hr[k][v] = hr[k + 1][v];
                        }
                        hf[H - 1][v] = xf;
                        hr[H - 1][v] = xr[j][v];
                    }
                }
            }
            if (!spec)  /* rows 0..W-2 <- the last W-1 inputs of the window */
#pragma GCC unroll 8
                for (int k = 0; k < H; k++)
#pragma GCC unroll 4
                    for (int v = 0; v < NV; v++) st_raw(st + k * sl + v * LANES * e, hr[k][v], dt);
        }
        if (nline < c1 - c0) gdn_scalar_range(p, &r, c0 + nline, c1);
    }
}

#define SIMD_UNIT_WIDTHS(dt, silu)                                                      \
    switch (p->width) {                                                                 \
    case 2: simd_unit(p, r0, r1, c0, c1, wrow, brow, dt, 2, silu); break;               \
    case 3: simd_unit(p, r0, r1, c0, c1, wrow, brow, dt, 3, silu); break;               \
    case 4: simd_unit(p, r0, r1, c0, c1, wrow, brow, dt, 4, silu); break;               \
    case 5: simd_unit(p, r0, r1, c0, c1, wrow, brow, dt, 5, silu); break;               \
    case 6: simd_unit(p, r0, r1, c0, c1, wrow, brow, dt, 6, silu); break;               \
    case 7: simd_unit(p, r0, r1, c0, c1, wrow, brow, dt, 7, silu); break;               \
    default: simd_unit(p, r0, r1, c0, c1, wrow, brow, dt, 8, silu); break;              \
    }

#define SIMD_UNIT_DTYPES(silu)                                                          \
    switch (p->dtype) {                                                                 \
    case GDN_F32: SIMD_UNIT_WIDTHS(GDN_F32, silu) break;                                \
    case GDN_F16: SIMD_UNIT_WIDTHS(GDN_F16, silu) break;                                \
    default: SIMD_UNIT_WIDTHS(GDN_BF16, silu) break;                                    \
    }

/* Weights of LANES channels from a contiguous (D, W) array to W fp32 tap vectors:
 * W vector loads of the channel-major block, then per tap a lane permute (gather_taps). */
GDN_INLINE void simd_fill_weights(const gdn_params *p, int64_t c0, int64_t nvec, float *wbuf,
                                  const int wdt, const int W) {
    const int64_t e = gdn_elsize(wdt);
    for (int64_t c = 0; c < nvec; c += LANES) {
        const char *src = (const char *)p->weight + e * (c0 + c) * W;   /* [LANES, W] */
        V v[GDN_MAX_WIDTH];
#pragma GCC unroll 8
        for (int m = 0; m < W; m++) v[m] = to_f32(ld_raw(src + e * m * LANES, wdt), wdt);
#pragma GCC unroll 8
        for (int k = 0; k < W; k++) vstore(wbuf + k * GDN_BLOCK_CHANNELS + c, gather_taps(v, W, k));
    }
}

#define SIMD_FILL_WIDTHS(wdt)                                                             \
    switch (p->width) {                                                                   \
    case 2: simd_fill_weights(p, c0, nvec, &wbuf[0][0], wdt, 2); break;                   \
    case 3: simd_fill_weights(p, c0, nvec, &wbuf[0][0], wdt, 3); break;                   \
    case 4: simd_fill_weights(p, c0, nvec, &wbuf[0][0], wdt, 4); break;                   \
    case 5: simd_fill_weights(p, c0, nvec, &wbuf[0][0], wdt, 5); break;                   \
    case 6: simd_fill_weights(p, c0, nvec, &wbuf[0][0], wdt, 6); break;                   \
    case 7: simd_fill_weights(p, c0, nvec, &wbuf[0][0], wdt, 7); break;                   \
    default: simd_fill_weights(p, c0, nvec, &wbuf[0][0], wdt, 8); break;                  \
    }

void SIMD_KERNEL(const gdn_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    /* fp32 weights with unit channel stride (pack_weight's layout) are read in
     * place; any other weights are converted once per unit, tap-major. */
    GDN_ALIGN64 float wbuf[GDN_MAX_WIDTH][GDN_BLOCK_CHANNELS];
    GDN_ALIGN64 float bbuf[GDN_BLOCK_CHANNELS];
    const float *wrow[GDN_MAX_WIDTH];
    const float *brow = bbuf;
    const int64_t nvec = (c1 - c0) / LANES * LANES;
    if (p->weight_dtype == GDN_F32 && p->weight_stride_d == 1) {
        for (int64_t k = 0; k < p->width; k++) wrow[k] = (const float *)p->weight + c0 + k * p->weight_stride_w;
    } else {
        if (p->weight_stride_w == 1 && p->weight_stride_d == p->width) {
            if (p->weight_dtype == GDN_F32) SIMD_FILL_WIDTHS(GDN_F32)
            else if (p->weight_dtype == GDN_F16) SIMD_FILL_WIDTHS(GDN_F16)
            else SIMD_FILL_WIDTHS(GDN_BF16)
        } else {
            gdn_fill_weights_any(p, c0, nvec, &wbuf[0][0], GDN_BLOCK_CHANNELS, bbuf);
        }
        for (int64_t k = 0; k < p->width; k++) wrow[k] = wbuf[k];
    }
    if (p->bias && p->bias_stride == 1 && p->weight_dtype == GDN_F32) {
        brow = (const float *)p->bias + c0;
    } else if (p->bias && p->bias_stride == 1) {
        for (int64_t c = 0; c < nvec; c += LANES)
            vstore(bbuf + c, to_f32(ld_raw((const char *)p->bias + 2 * (c0 + c), p->weight_dtype), p->weight_dtype));
    } else {
        gdn_fill_bias(p, c0, nvec, bbuf);
    }
    if (p->silu) {
        SIMD_UNIT_DTYPES(1)
    } else {
        SIMD_UNIT_DTYPES(0)
    }
}
