/* Portable update kernel (any ISA, any strides): the scalar core over a unit of work. */
#include "silu.h"
#include "update.h"

#define GDN_SCALAR_CHUNK 256

/* The portable core: requests reqs[0..nreq), channels [c0, c1), any strides, width
 * W (a constant for the common width 4, a variable otherwise: the build then
 * compiles 20 instances of this core instead of 70), in chunks of GDN_SCALAR_CHUNK channels whose weights are
 * converted once for all the requests. Per request and chunk it reads every
 * window row before a state write can reach it (spec mode writes the roll's
 * rows 0..W-3 as it reads window rows 1..W-2), keeps the last W-1 inputs in a
 * ring of W slots (fp32, and raw elements in plain mode) so the slot that takes x[t] is never one the
 * same loop reads, and writes out[t] only after x[t] is read, so out may be x.
 * Per token, channel loops without branches, so each vectorises: the convolution
 * into an fp32 row (x kept in the ring and, in spec mode, written to its state
 * row), the activation in place (gdn_silu_row), then rounding and store. */
GDN_INLINE void gdn_scalar_conv(const char *xrow, int64_t xd, char *srow, int64_t sd,
                                float (*w)[GDN_SCALAR_CHUNK], const float *b, const float *const *h,
                                float *xf, void *xr, float *acc, int64_t n, const int dt,
                                const int W, const int spec) {
    const int H = W - 1;
    for (int64_t c = 0; c < n; c++) {
        const uint32_t raw = gdn_load_raw(xrow, c * xd, dt);
        const float xv = gdn_raw_to_float(raw, dt);
        float a = b[c];
        for (int k = 0; k < H; k++) a += w[k][c] * h[k][c];
        acc[c] = a + w[H][c] * xv;
        xf[c] = xv;
        if (spec) gdn_store_raw(srow, c * sd, raw, dt);  /* the state row is its raw copy */
        else gdn_store_raw(xr, c, raw, dt);
    }
}

/* Activation in place, in a function of its own: the loop's ~11 constants then
 * stay in registers of a baseline x86-64 build instead of being reloaded. */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static void gdn_silu_row(float *acc, int64_t n, int dt) {
    if (dt == GDN_BF16)
        for (int64_t c = 0; c < n; c++) acc[c] = gdn_silu(acc[c], GDN_BF16);
    else if (dt == GDN_F16)
        for (int64_t c = 0; c < n; c++) acc[c] = gdn_silu(acc[c], GDN_F16);
    else
        for (int64_t c = 0; c < n; c++) acc[c] = gdn_silu(acc[c], GDN_F32);
}

/* Activation, then rounding and store in a second loop. */
GDN_INLINE void gdn_scalar_store(char *orow, int64_t od, float *acc, int64_t n, const int dt,
                                 const int wdt, const int silu) {
    if (silu) gdn_silu_row(acc, n, dt);
    for (int64_t c = 0; c < n; c++)
        gdn_store_raw(orow, c * od, gdn_float_to_raw(acc[c], dt, wdt == GDN_F32), dt);
}

GDN_INLINE void gdn_scalar_core(const gdn_update_params *p, const gdn_request *reqs, int nreq, int64_t c0,
                                int64_t c1, const int dt, const int wdt, const int W, const int unit) {
    const int H = W - 1;
    /* unit: channel strides of x, out and state are all 1 (a constant, so the
     * channel loops use packed loads instead of element-wise ones) */
    const int64_t sd = unit ? 1 : p->state_stride_d, sl = p->state_stride_l;
    const int64_t xd = unit ? 1 : p->x_stride_d, xt = p->x_stride_t;
    const int64_t od = unit ? 1 : p->out_stride_d, ot = p->out_stride_t;
    const int64_t e = gdn_elsize(dt);
    const int silu = p->silu, spec = p->num_accepted_tokens != NULL;
    float w[GDN_MAX_WIDTH][GDN_SCALAR_CHUNK], b[GDN_SCALAR_CHUNK], acc[GDN_SCALAR_CHUNK];
    float hf[GDN_MAX_WIDTH][GDN_SCALAR_CHUNK];     /* ring: H window inputs + the new one */
    union { uint16_t h[GDN_MAX_WIDTH][GDN_SCALAR_CHUNK]; uint32_t f[GDN_MAX_WIDTH][GDN_SCALAR_CHUNK]; }
        ring;                                      /* same, raw elements (plain mode: x too) */
#define GDN_RAW(k) (dt == GDN_F32 ? (void *)ring.f[k] : (void *)ring.h[k])

    for (int64_t cb = c0; cb < c1; cb += GDN_SCALAR_CHUNK) {
        const int64_t n = c1 - cb < GDN_SCALAR_CHUNK ? c1 - cb : GDN_SCALAR_CHUNK;
        gdn_fill_weights(p, cb, n, &w[0][0], GDN_SCALAR_CHUNK, b, wdt);
        for (int i = 0; i < nreq; i++) {
            const gdn_request *r = &reqs[i];
            if (r->skip) continue;
            char *st = r->state + e * cb * sd;      /* [L, D] at channel cb */
            const char *xs = r->x + e * cb * xd;    /* [T, D] */
            char *os = r->out + e * cb * od;        /* [T, D] */
            for (int k = 0; k < H; k++) {
                const char *row = st + e * (r->off + k) * sl;
                if (spec && k == 0) {
                    for (int64_t c = 0; c < n; c++) hf[0][c] = gdn_raw_to_float(gdn_load_raw(row, c * sd, dt), dt);
                    continue;
                }
                /* spec: the roll's rows 0..W-3 <- window rows 1..W-2, each written as
                 * it is read (row k - 1 is below every window row still to be read);
                 * plain mode keeps the raw window for its roll after the tokens */
                char *dst = spec ? st + e * (k - 1) * sl : (char *)GDN_RAW(k);
                const int64_t dd = spec ? sd : 1;
                for (int64_t c = 0; c < n; c++) {
                    const uint32_t raw = gdn_load_raw(row, c * sd, dt);
                    gdn_store_raw(dst, c * dd, raw, dt);
                    hf[k][c] = gdn_raw_to_float(raw, dt);
                }
            }
            int head = 0;  /* ring slot of the oldest window input */
            for (int64_t t = 0; t < r->T; t++) {
                const float *h[GDN_MAX_WIDTH - 1];
                for (int k = 0; k < H; k++) h[k] = hf[(head + k) % W];
                const int slot = (head + H) % W;
                char *srow = st + e * (W - 2 + t) * sl;
                if (spec) gdn_scalar_conv(xs + e * t * xt, xd, srow, sd, w, b, h, hf[slot], NULL, acc, n, dt, W, 1);
                else gdn_scalar_conv(xs + e * t * xt, xd, srow, sd, w, b, h, hf[slot], GDN_RAW(slot), acc, n, dt, W, 0);
                gdn_scalar_store(os + e * t * ot, od, acc, n, dt, wdt, silu);
                head = head + 1 == W ? 0 : head + 1;
            }
            if (!spec) /* rows 0..W-2 <- the last W-1 inputs */
                for (int k = 0; k < H; k++) {
                    const void *hk = GDN_RAW((head + k) % W);
                    for (int64_t c = 0; c < n; c++) gdn_store_raw(st + e * k * sl, c * sd, gdn_load_raw(hk, c, dt), dt);
                }
        }
    }
#undef GDN_RAW
}

/* Dispatch the scalar core on (dtype, weight dtype, width 4 or any, unit strides) so
 * each instance is compiled with constants. */
#define GDN_SCALAR_WIDTHS_U(dt, wdt, u)                                                \
    if (p->width == 4) gdn_scalar_core(p, reqs, nreq, c0, c1, dt, wdt, 4, u);          \
    else gdn_scalar_core(p, reqs, nreq, c0, c1, dt, wdt, (int)p->width, u);
#define GDN_SCALAR_WIDTHS(dt, wdt)                                                     \
    if (unit) { GDN_SCALAR_WIDTHS_U(dt, wdt, 1) } else { GDN_SCALAR_WIDTHS_U(dt, wdt, 0) }

void gdn_update_scalar_range(const gdn_update_params *p, const gdn_request *reqs, int nreq, int64_t c0, int64_t c1) {
    if (c0 >= c1 || nreq <= 0) return;
    const int wf32 = p->weight_dtype == GDN_F32;
    const int unit = p->x_stride_d == 1 && p->out_stride_d == 1 && p->state_stride_d == 1;
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
#undef GDN_SCALAR_WIDTHS_U

void gdn_update_scalar(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    gdn_request reqs[GDN_BLOCK_REQUESTS];
    while (r0 < r1) {
        int nreq = 0;
        for (; r0 < r1 && nreq < GDN_BLOCK_REQUESTS; r0++) reqs[nreq++] = gdn_get_request(p, r0);
        gdn_update_scalar_range(p, reqs, nreq, c0, c1);
    }
}
