/* The prefill's SIMD loop structure shared by the ISA kernels; included by
 * prefill_<isa>.c after its simd_<isa>.h, with the primitives update_simd.h lists
 * (V, R, LANES, ld_raw, st_raw, to_f32, from_f32, vload, vfma, vsilu_n, and
 * optionally st2_native) and the token loop of simd_tokens.h, and then defines its
 * kernel as a call of prefill_kernel().
 *
 * Precondition: x and out have channel stride 1 (prefill.c sends other calls to the
 * portable kernel); the state may have any strides (it is only W-1 rows per request:
 * a strided history is gathered, a strided state written element by element).
 * Channels past the last whole line step go to the portable core. */
#ifndef LANES
#error "prefill_simd.h: include an ISA's simd_<isa>.h first"
#endif

#include "simd_tokens.h"

GDN_ALIGN64 static const float prefill_zeros[16] = {0.0f};   /* a zero vector (LANES <= 16) */

/* One unit (request r, channels [c0, c1), tokens [t0, t1)) for constant dtype, width
 * and activation. Tiles of GDN_PREFILL_TILE tokens; within a tile every line step of
 * the channel range: weights and bias to registers, the window from x rows ta-W+1..
 * (read in the previous tile, so from L2) or the history, then the tile's tokens in
 * groups of G = 4/NV with the window sliding in registers. x is read once from
 * memory and out written once; nothing is staged (unlike the update, whose ~2T+L rows
 * per request thrash one L1 set: here a tile's 2 * 8 rows fit its ways). The unit
 * that starts the request writes the state after its first tile, the only one that
 * reads the history. */
GDN_INLINE void prefill_unit(const gdn_prefill_params *pp, const float *w, int64_t ld, const float *bias,
                             const gdn_prefill_request *r, int64_t c0, int64_t c1, int64_t t0, int64_t t1,
                             const int dt, const int W, const int silu) {
    const gdn_update_params *p = &pp->conv;
    const int H = W - 1;
    const int64_t e = gdn_elsize(dt), ve = LANES * e;
    const int64_t xt = p->x_stride_t * e, ot = p->out_stride_t * e;
    const int64_t sd = p->state_stride_d, sl = p->state_stride_l * e;
    const int NV = ve >= 64 ? 1 : 64 / ve > 4 ? 4 : (int)(64 / ve);  /* vectors per line step */
    const int G = 4 / NV;                             /* tokens per group: G * NV = 4 vectors */
    const int64_t step = NV * LANES, nline = (c1 - c0) / step * step;
    if (nline > 0) {
        for (int64_t ta = t0; ta < t1; ta += GDN_PREFILL_TILE) {
            const int64_t nt = t1 - ta < GDN_PREFILL_TILE ? t1 - ta : GDN_PREFILL_TILE;
            const char *wrow[GDN_MAX_WIDTH - 1];  /* window row k at channel 0: x, state, or NULL (zeros) */
            int from_state[GDN_MAX_WIDTH - 1];
            for (int k = 0; k < H; k++) {
                const int64_t pos = ta - H + k;
                from_state[k] = pos < 0;
                wrow[k] = pos >= 0 ? r->x + pos * xt : r->init ? r->state + (pos + H) * sl : NULL;
            }
            const char *xs = r->x + ta * xt;
            char *os = r->out + ta * ot;
            const int64_t nsteps = nline / step;
            for (int64_t c = c0; c < c0 + nline; c += step) {
                /* the rows GDN_PREFILL_PF line steps ahead in this unit's order (a tile's lines,
                 * then the next tile's): x read, out written. A narrow unit's rows are short
                 * pieces a row stride apart, which the hardware prefetchers do not follow. */
#if GDN_PREFILL_PF > 0
                {
                    const int64_t k = (c - c0) / step + GDN_PREFILL_PF;
                    const int64_t pt = ta + k / nsteps * GDN_PREFILL_TILE, pc = (c0 + k % nsteps * step) * e;
                    const int64_t pn = t1 - pt < GDN_PREFILL_TILE ? t1 - pt : GDN_PREFILL_TILE;
                    for (int64_t j = 0; j < pn; j++) {
                        SIMD_PREFETCH_R(r->x + (pt + j) * xt + pc);
                        SIMD_PREFETCH_W(r->out + (pt + j) * ot + pc);
                    }
                }
#endif
                V wv[GDN_MAX_WIDTH][4], hf[GDN_MAX_WIDTH - 1][4], b[4];
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++) {
                    const int64_t ch = c + v * LANES;
                    b[v] = vload(bias + ch);
#pragma GCC unroll 8
                    for (int k = 0; k < W; k++) wv[k][v] = vload(w + k * ld + ch);
#pragma GCC unroll 8
                    for (int k = 0; k < H; k++) {
                        if (!wrow[k]) {
                            hf[k][v] = vload(prefill_zeros);
                        } else if (!from_state[k] || sd == 1) {
                            hf[k][v] = to_f32(ld_raw(wrow[k] + (from_state[k] ? ch * sd : ch) * e, dt), dt);
                        } else {   /* a strided state's history row, gathered (first tile only) */
                            GDN_ALIGN64 float tmp[LANES];
                            gdn_prefill_gather(tmp, wrow[k], sd, ch, LANES, p->dtype);
                            hf[k][v] = vload(tmp);
                        }
                    }
                }
                int64_t j = 0;
                for (; j + G <= nt; j += G)
                    simd_tokens(xs + j * xt + c * e, xt, os + j * ot + c * e, ot, wv, b, hf, G, NV, dt, W, silu);
                if (G > 2 && j + 2 <= nt) {
                    simd_tokens(xs + j * xt + c * e, xt, os + j * ot + c * e, ot, wv, b, hf, 2, NV, dt, W, silu);
                    j += 2;
                }
                if (j < nt)
                    simd_tokens(xs + j * xt + c * e, xt, os + j * ot + c * e, ot, wv, b, hf, 1, NV, dt, W, silu);
            }
            if (ta == 0 && r->state) gdn_prefill_write_state(pp, r, c0, c0 + nline);
        }
    }
    if (nline < c1 - c0) gdn_prefill_scalar_range(pp, w, ld, bias, r, c0 + nline, c1, t0, t1);
}

#define PREFILL_UNIT_WIDTHS(dt, silu)                                                        \
    switch (p->conv.width) {                                                                 \
    case 2: prefill_unit(p, w, ld, b, &r, c0, c1, t0, t1, dt, 2, silu); break;               \
    case 3: prefill_unit(p, w, ld, b, &r, c0, c1, t0, t1, dt, 3, silu); break;               \
    case 4: prefill_unit(p, w, ld, b, &r, c0, c1, t0, t1, dt, 4, silu); break;               \
    case 5: prefill_unit(p, w, ld, b, &r, c0, c1, t0, t1, dt, 5, silu); break;               \
    case 6: prefill_unit(p, w, ld, b, &r, c0, c1, t0, t1, dt, 6, silu); break;               \
    case 7: prefill_unit(p, w, ld, b, &r, c0, c1, t0, t1, dt, 7, silu); break;               \
    default: prefill_unit(p, w, ld, b, &r, c0, c1, t0, t1, dt, 8, silu); break;              \
    }

#define PREFILL_UNIT_DTYPES(silu)                                                            \
    switch (p->conv.dtype) {                                                                 \
    case GDN_F32: PREFILL_UNIT_WIDTHS(GDN_F32, silu) break;                                  \
    case GDN_F16: PREFILL_UNIT_WIDTHS(GDN_F16, silu) break;                                  \
    default: PREFILL_UNIT_WIDTHS(GDN_BF16, silu) break;                                      \
    }

/* The kernel of a unit; bf16_native (a constant, bf16 calls only) stores bf16 with
 * the ISA's conversion instruction (dtype code GDN_BF16_NATIVE), as simd_kernel. */
GDN_INLINE void prefill_kernel(const gdn_prefill_params *p, const float *w, int64_t ld, const float *b,
                               int64_t i, int64_t c0, int64_t c1, int64_t t0, int64_t t1,
                               const int bf16_native) {
    const gdn_prefill_request r = gdn_prefill_get_request(p, i);
    if (r.skip || t0 >= t1) return;
    if (bf16_native) {
        if (p->conv.silu) PREFILL_UNIT_WIDTHS(GDN_BF16_NATIVE, 1)
        else PREFILL_UNIT_WIDTHS(GDN_BF16_NATIVE, 0)
    } else if (p->conv.silu) {
        PREFILL_UNIT_DTYPES(1)
    } else {
        PREFILL_UNIT_DTYPES(0)
    }
}
