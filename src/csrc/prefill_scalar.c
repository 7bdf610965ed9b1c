/* Portable prefill kernel (any ISA, any strides): the scalar core over a unit of work. */
#include "prefill.h"
#include "silu.h"

#define GDN_PREFILL_CHANNELS 256   /* channels per chunk of the core */

void gdn_prefill_gather(float *dst, const char *row, int64_t stride, int64_t c, int n, int dt) {
    for (int l = 0; l < n; l++) dst[l] = gdn_raw_to_float(gdn_load_raw(row, (c + l) * stride, dt), dt);
}

/* Request r, channels [c0, c1), tokens [t0, t1), dtype dt and weight dtype wdt
 * (constants), width W (a constant for the common width 4, a variable otherwise, as
 * in update_scalar.c), in chunks of GDN_PREFILL_CHANNELS channels. The window of the
 * W-1 inputs before token t0 comes from x (rows t0-W+1..) or the history (state rows
 * or zeros); a ring of W fp32 rows then slides along time. Per token the arithmetic
 * is update_scalar.c's, expression for expression (bias, taps 0..W-2 of the window
 * added one by one, then the new token's product; gdn_silu; one rounding), so the
 * portable prefill equals the portable update bit for bit. The state is written
 * after the window is read, before out: out never aliases x or the state here. */
GDN_INLINE void prefill_scalar_core(const gdn_prefill_params *pp, const float *wsrc, int64_t ld,
                                    const float *bsrc, const gdn_prefill_request *r, int64_t c0,
                                    int64_t c1, int64_t t0, int64_t t1, const int dt, const int wdt,
                                    const int W, const int unit) {
    const gdn_update_params *p = &pp->conv;
    const int H = W - 1;
    const int64_t e = gdn_elsize(dt);
    /* unit: x and out have channel stride 1 (a constant: packed loads) */
    const int64_t xd = unit ? 1 : p->x_stride_d, xt = p->x_stride_t;
    const int64_t od = unit ? 1 : p->out_stride_d, ot = p->out_stride_t;
    const int64_t sd = p->state_stride_d, sl = p->state_stride_l;
    float w[GDN_MAX_WIDTH][GDN_PREFILL_CHANNELS], b[GDN_PREFILL_CHANNELS], acc[GDN_PREFILL_CHANNELS];
    float hf[GDN_MAX_WIDTH][GDN_PREFILL_CHANNELS];   /* ring: W-1 window inputs + the new one */
    for (int64_t cb = c0; cb < c1; cb += GDN_PREFILL_CHANNELS) {
        const int64_t n = c1 - cb < GDN_PREFILL_CHANNELS ? c1 - cb : GDN_PREFILL_CHANNELS;
        for (int k = 0; k < W; k++)
            for (int64_t c = 0; c < n; c++) w[k][c] = wsrc[k * ld + cb + c];
        for (int64_t c = 0; c < n; c++) b[c] = bsrc[cb + c];
        const char *xs = r->x + e * cb * xd;          /* [T, D] at channel cb */
        char *os = r->out + e * cb * od;              /* [T, D] */
        for (int k = 0; k < H; k++) {                 /* window row k: position t0-H+k */
            const int64_t pos = t0 - H + k;
            if (pos >= 0) {
                for (int64_t c = 0; c < n; c++)
                    hf[k][c] = gdn_raw_to_float(gdn_load_raw(xs, pos * xt + c * xd, dt), dt);
            } else if (r->init) {
                const char *row = r->state + e * ((pos + H) * sl + cb * sd);
                for (int64_t c = 0; c < n; c++) hf[k][c] = gdn_raw_to_float(gdn_load_raw(row, c * sd, dt), dt);
            } else {
                for (int64_t c = 0; c < n; c++) hf[k][c] = 0.0f;
            }
        }
        if (t0 == 0 && r->state) gdn_prefill_write_state(pp, r, cb, cb + n);
        int head = 0;  /* ring slot of the oldest window input */
        for (int64_t t = t0; t < t1; t++) {
            const float *h[GDN_MAX_WIDTH - 1];
            for (int k = 0; k < H; k++) h[k] = hf[(head + k) % W];
            float *xf = hf[(head + H) % W];
            const char *xrow = xs + e * t * xt;
            for (int64_t c = 0; c < n; c++) {
                const float xv = gdn_raw_to_float(gdn_load_raw(xrow, c * xd, dt), dt);
                float a = b[c];
                for (int k = 0; k < H; k++) a += w[k][c] * h[k][c];
                acc[c] = a + w[H][c] * xv;
                xf[c] = xv;
            }
            if (p->silu)
                for (int64_t c = 0; c < n; c++) acc[c] = gdn_silu(acc[c], dt);
            char *orow = os + e * t * ot;
            for (int64_t c = 0; c < n; c++)
                gdn_store_raw(orow, c * od, gdn_float_to_raw(acc[c], dt, wdt == GDN_F32), dt);
            head = head + 1 == W ? 0 : head + 1;
        }
    }
}

#define PREFILL_SCALAR_WIDTHS_U(dt, wdt, u)                                                  \
    if (p->conv.width == 4) prefill_scalar_core(p, w, ld, b, r, c0, c1, t0, t1, dt, wdt, 4, u); \
    else prefill_scalar_core(p, w, ld, b, r, c0, c1, t0, t1, dt, wdt, (int)p->conv.width, u);
#define PREFILL_SCALAR_WIDTHS(dt, wdt) \
    if (unit) { PREFILL_SCALAR_WIDTHS_U(dt, wdt, 1) } else { PREFILL_SCALAR_WIDTHS_U(dt, wdt, 0) }

void gdn_prefill_scalar_range(const gdn_prefill_params *p, const float *w, int64_t ld, const float *b,
                              const gdn_prefill_request *r, int64_t c0, int64_t c1, int64_t t0, int64_t t1) {
    if (c0 >= c1 || t0 >= t1 || r->skip) return;
    const int wf32 = p->conv.weight_dtype == GDN_F32;
    const int unit = p->conv.x_stride_d == 1 && p->conv.out_stride_d == 1;
    switch (p->conv.dtype) {
    case GDN_F32: PREFILL_SCALAR_WIDTHS(GDN_F32, GDN_F32) break;
    case GDN_F16:
        if (wf32) PREFILL_SCALAR_WIDTHS(GDN_F16, GDN_F32)
        else PREFILL_SCALAR_WIDTHS(GDN_F16, GDN_F16)
        break;
    default:
        if (wf32) PREFILL_SCALAR_WIDTHS(GDN_BF16, GDN_F32)
        else PREFILL_SCALAR_WIDTHS(GDN_BF16, GDN_BF16)
        break;
    }
}
#undef PREFILL_SCALAR_WIDTHS
#undef PREFILL_SCALAR_WIDTHS_U

void gdn_prefill_scalar(const gdn_prefill_params *p, const float *w, int64_t ld, const float *b, int64_t i,
                        int64_t c0, int64_t c1, int64_t t0, int64_t t1) {
    const gdn_prefill_request r = gdn_prefill_get_request(p, i);
    gdn_prefill_scalar_range(p, w, ld, b, &r, c0, c1, t0, t1);
}
