/* Portable kernel (any ISA, any strides): the scalar core over a unit of work. */
#include "conv_common.h"

#define GDN_SCALAR_CHUNK 64

/* The portable core: request r, channels [c0, c1), any strides, width W (a
 * constant). Reads the whole history window before the first state write, keeps
 * the last W-1 inputs in a ring of W slots (fp32 and raw bits) so the slot that
 * takes x[t] is never one the same loop reads, and writes out[t] only after x[t]
 * is read, so out may be x. One fused channel loop per token: no function calls or
 * branches, so it vectorises. */
/* One token over n channels (silu and spec are constants, so no branch is left in
 * the loop): out = act(b + sum_k w[k] h[k] + w[H] x), x kept in the ring slot
 * xf/xr, and in spec mode written to its state row. */
GDN_INLINE void gdn_scalar_token(const char *xrow, int64_t xd, char *orow, int64_t od, char *srow,
                                 int64_t sd, float (*w)[GDN_SCALAR_CHUNK], const float *b,
                                 const float *const *h, float *xf, uint32_t *xr, int64_t n, const int dt,
                                 const int W, const int silu, const int spec) {
    const int H = W - 1;
    for (int64_t c = 0; c < n; c++) {
        const uint32_t raw = gdn_load_raw(xrow, c * xd, dt);
        const float xv = gdn_raw_to_float(raw, dt);
        float acc = b[c];
        for (int k = 0; k < H; k++) acc += w[k][c] * h[k][c];
        acc += w[H][c] * xv;
        xf[c] = xv;
        xr[c] = raw;
        gdn_store_raw(orow, c * od, gdn_float_to_raw(silu ? gdn_silu(acc) : acc, dt), dt);
        if (spec) gdn_store_raw(srow, c * sd, raw, dt);
    }
}

GDN_INLINE void gdn_scalar_core(const gdn_params *p, const gdn_request *r, int64_t c0,
                                int64_t c1, const int dt, const int wdt, const int W) {
    const int H = W - 1;
    const int64_t T = r->T;
    const int64_t sd = p->state_stride_d, sl = p->state_stride_l;
    const int64_t xd = p->x_stride_d, xt = p->x_stride_t, od = p->out_stride_d, ot = p->out_stride_t;
    const int64_t e = gdn_elsize(dt);
    const int silu = p->silu, spec = p->num_accepted_tokens != NULL;
    float w[GDN_MAX_WIDTH][GDN_SCALAR_CHUNK], b[GDN_SCALAR_CHUNK];
    float hf[GDN_MAX_WIDTH][GDN_SCALAR_CHUNK];     /* ring: H window inputs + the new one */
    uint32_t hr[GDN_MAX_WIDTH][GDN_SCALAR_CHUNK];  /* same, raw bits */

    for (int64_t cb = c0; cb < c1; cb += GDN_SCALAR_CHUNK) {
        const int64_t n = c1 - cb < GDN_SCALAR_CHUNK ? c1 - cb : GDN_SCALAR_CHUNK;
        char *st = r->state + e * cb * sd;      /* [L, D] at channel cb */
        const char *xs = r->x + e * cb * xd;    /* [T, D] */
        char *os = r->out + e * cb * od;        /* [T, D] */
        gdn_fill_weights(p, cb, n, &w[0][0], GDN_SCALAR_CHUNK, b, wdt);
        for (int k = 0; k < H; k++) {
            const char *row = st + e * (r->off + k) * sl;
            for (int64_t c = 0; c < n; c++) {
                hr[k][c] = gdn_load_raw(row, c * sd, dt);
                hf[k][c] = gdn_raw_to_float(hr[k][c], dt);
            }
        }
        if (spec) /* rows 0..W-3 <- window rows 1..W-2 */
            for (int k = 0; k + 1 < H; k++)
                for (int64_t c = 0; c < n; c++) gdn_store_raw(st + e * k * sl, c * sd, hr[k + 1][c], dt);
        int head = 0;  /* ring slot of the oldest window input */
        for (int64_t t = 0; t < T; t++) {
            const float *h[GDN_MAX_WIDTH - 1];
            for (int k = 0; k < H; k++) h[k] = hf[(head + k) % W];
            float *xf = hf[(head + H) % W];
            uint32_t *xr = hr[(head + H) % W];
            const char *xrow = xs + e * t * xt;
            char *orow = os + e * t * ot;
            char *srow = st + e * (W - 2 + t) * sl;
            if (silu && spec) gdn_scalar_token(xrow, xd, orow, od, srow, sd, w, b, h, xf, xr, n, dt, W, 1, 1);
            else if (silu) gdn_scalar_token(xrow, xd, orow, od, srow, sd, w, b, h, xf, xr, n, dt, W, 1, 0);
            else if (spec) gdn_scalar_token(xrow, xd, orow, od, srow, sd, w, b, h, xf, xr, n, dt, W, 0, 1);
            else gdn_scalar_token(xrow, xd, orow, od, srow, sd, w, b, h, xf, xr, n, dt, W, 0, 0);
            head = head + 1 == W ? 0 : head + 1;
        }
        if (!spec) /* rows 0..W-2 <- the last W-1 inputs */
            for (int k = 0; k < H; k++) {
                const uint32_t *hk = hr[(head + k) % W];
                for (int64_t c = 0; c < n; c++) gdn_store_raw(st + e * k * sl, c * sd, hk[c], dt);
            }
    }
}

/* Dispatch the scalar core on (dtype, weight dtype, width) so each instance is
 * compiled with constants. */
#define GDN_SCALAR_WIDTHS(dt, wdt)                                                     \
    switch (p->width) {                                                                \
    case 2: gdn_scalar_core(p, r, c0, c1, dt, wdt, 2); break;                          \
    case 3: gdn_scalar_core(p, r, c0, c1, dt, wdt, 3); break;                          \
    case 4: gdn_scalar_core(p, r, c0, c1, dt, wdt, 4); break;                          \
    case 5: gdn_scalar_core(p, r, c0, c1, dt, wdt, 5); break;                          \
    case 6: gdn_scalar_core(p, r, c0, c1, dt, wdt, 6); break;                          \
    case 7: gdn_scalar_core(p, r, c0, c1, dt, wdt, 7); break;                          \
    default: gdn_scalar_core(p, r, c0, c1, dt, wdt, 8); break;                         \
    }

void gdn_scalar_range(const gdn_params *p, const gdn_request *r, int64_t c0, int64_t c1) {
    if (c0 >= c1) return;
    const int wf32 = p->weight_dtype == GDN_F32;
    switch (p->dtype) {
    case GDN_F32: GDN_SCALAR_WIDTHS(GDN_F32, GDN_F32) break;
    case GDN_F16:
        if (wf32) GDN_SCALAR_WIDTHS(GDN_F16, GDN_F32)
        else GDN_SCALAR_WIDTHS(GDN_F16, GDN_F16)
        break;
    default:
        if (wf32) GDN_SCALAR_WIDTHS(GDN_BF16, GDN_F32)
        else GDN_SCALAR_WIDTHS(GDN_BF16, GDN_BF16)
        break;
    }
}
#undef GDN_SCALAR_WIDTHS

void gdn_kernel_scalar(const gdn_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    for (int64_t i = r0; i < r1; i++) {
        const gdn_request r = gdn_get_request(p, i);
        if (!r.skip) gdn_scalar_range(p, &r, c0, c1);
    }
}
