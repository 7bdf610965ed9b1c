/* The SIMD loop structure shared by the ISA kernels; included by conv_<isa>.c after
 * it defines, for its vector width:
 *   V, R              fp32 vector and raw-bits vector (16-bit lanes in the low half)
 *   LANES             channels per vector
 *   ld_raw, st_raw    load / store LANES raw elements of dtype dt
 *   to_f32, from_f32  raw <-> fp32 (rounding to nearest even)
 *   vload, vfma, vsilu
 *   SIMD_KERNEL       the name of the kernel to define
 * Channel tails (fewer than LANES channels) go to the shared scalar core. */

/* One (request group, channel block) unit for constant dtype, width and activation.
 * Per LANES channels: the W-1 history rows and the weights live in registers,
 * every token is read once, its output and (spec mode) its state row written, and
 * the plain-mode roll stores the last W-1 inputs at the end. */
GDN_INLINE void simd_unit(const gdn_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                          const float *const *wrow, const float *brow, const int dt, const int W,
                          const int silu) {
    const int H = W - 1;
    const int64_t e = gdn_elsize(dt), sl = p->state_stride_l * e;
    const int64_t xt = p->x_stride_t * e, ot = p->out_stride_t * e;
    const int64_t nvec = (c1 - c0) / LANES * LANES;
    const int spec = p->num_accepted_tokens != NULL;
    for (int64_t i = r0; i < r1; i++) {
        const gdn_request r = gdn_get_request(p, i);
        if (r.skip) continue;
        for (int64_t c = 0; c < nvec; c += LANES) {
            char *st = r.state + e * (c0 + c);      /* [L, D] at this channel */
            const char *xs = r.x + e * (c0 + c);    /* [T, D] */
            char *os = r.out + e * (c0 + c);        /* [T, D] */
            V w[GDN_MAX_WIDTH], hf[GDN_MAX_WIDTH - 1];
            R hr[GDN_MAX_WIDTH - 1];
            const V b = vload(brow + c);
#pragma GCC unroll 8
            for (int k = 0; k < W; k++) w[k] = vload(wrow[k] + c);
#pragma GCC unroll 8
            for (int k = 0; k < H; k++) {
                hr[k] = ld_raw(st + (r.off + k) * sl, dt);
                hf[k] = to_f32(hr[k], dt);
            }
            if (spec)  /* rows 0..W-3 <- window rows 1..W-2, read above */
#pragma GCC unroll 8
                for (int k = 0; k + 1 < H; k++) st_raw(st + k * sl, hr[k + 1], dt);
            for (int64_t t = 0; t < r.T; t++) {
                const R xr = ld_raw(xs + t * xt, dt);
                const V xf = to_f32(xr, dt);
                V acc = b;
#pragma GCC unroll 8
                for (int k = 0; k < H; k++) acc = vfma(w[k], hf[k], acc);
                acc = vfma(w[H], xf, acc);
                if (silu) acc = vsilu(acc, dt);
                st_raw(os + t * ot, from_f32(acc, dt), dt);
                if (spec) st_raw(st + (W - 2 + t) * sl, xr, dt);
#pragma GCC unroll 8
                for (int k = 0; k + 1 < H; k++) {
                    hf[k] = hf[k + 1];
                    hr[k] = hr[k + 1];
                }
                hf[H - 1] = xf;
                hr[H - 1] = xr;
            }
            if (!spec)  /* rows 0..W-2 <- the last W-1 inputs of the window */
#pragma GCC unroll 8
                for (int k = 0; k < H; k++) st_raw(st + k * sl, hr[k], dt);
        }
        if (nvec < c1 - c0) gdn_scalar_range(p, &r, c0 + nvec, c1);
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
        if (p->bias && p->bias_stride == 1) brow = (const float *)p->bias + c0;
        else gdn_fill_bias(p, c0, nvec, bbuf);
    } else {
        gdn_fill_weights_any(p, c0, nvec, &wbuf[0][0], GDN_BLOCK_CHANNELS, bbuf);
        for (int64_t k = 0; k < p->width; k++) wrow[k] = wbuf[k];
    }
    if (p->silu) {
        SIMD_UNIT_DTYPES(1)
    } else {
        SIMD_UNIT_DTYPES(0)
    }
}
