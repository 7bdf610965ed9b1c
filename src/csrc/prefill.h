/* The conv prefill's internals shared by its files: one request's geometry, the
 * kernel signature an ISA provides, the state write, and the portable core. */
#ifndef GDNCONV_PREFILL_H
#define GDNCONV_PREFILL_H

#include "update.h"

/* Tokens per time chunk of a work unit (prefill.c), and tokens per tile of a SIMD
 * kernel: a tile runs every channel line before the next tile, so it streams TILE
 * rows of x and of out side by side and reloads each line's window of W-1 rows from
 * the previous tile (in L2) instead of keeping a copy. */
#define GDN_PREFILL_CHUNK 256
#define GDN_PREFILL_TILE 8

/* Line steps ahead of the one computed whose x and out rows a SIMD kernel prefetches
 * (A/B switch of benchmarks/README.md's measures; 0: none). */
#ifndef GDN_PREFILL_PF
#define GDN_PREFILL_PF 8
#endif

/* One request as a prefill unit sees it (the update's geometry, off = 0). */
typedef struct gdn_prefill_request {
    int skip;         /* pad slot or no tokens: nothing read, nothing written */
    int init;         /* the history is state rows 0..W-2 (else zeros) */
    int64_t T;        /* tokens */
    const char *x;    /* token 0, channel 0 (byte pointer), [T, D] */
    char *out;        /* [T, D] */
    char *state;      /* slot row 0, channel 0, [L, D]; NULL without conv_state */
} gdn_prefill_request;

static inline gdn_prefill_request gdn_prefill_get_request(const gdn_prefill_params *pp, int64_t i) {
    const gdn_update_params *p = &pp->conv;
    gdn_prefill_request r;
    const int64_t e = gdn_elsize(p->dtype);
    const int64_t start = p->query_start_loc ? p->query_start_loc[i] : 0;
    r.T = p->query_start_loc ? p->query_start_loc[i + 1] - start : p->seqlen;
    r.skip = r.T <= 0 || gdn_is_pad(p, i);
    r.x = (const char *)p->x + e * (i * p->x_stride_b + start * p->x_stride_t);
    r.out = (char *)p->out + e * (i * p->out_stride_b + start * p->out_stride_t);
    r.state = NULL;
    if (p->conv_state && !r.skip) {
        const int64_t slot = p->conv_state_indices ? p->conv_state_indices[i] : i;
        r.state = (char *)p->conv_state + e * slot * p->state_stride_s;
    }
    r.init = r.state && pp->has_initial_state && pp->has_initial_state[i];
    return r;
}

/* An ISA's prefill kernel for one unit: request i, channels [c0, c1), tokens [t0, t1).
 * w: fp32 weights, tap k of channel c at w[k * ld + c]; b: fp32 bias [D]. Writes out
 * rows [t0, t1). Only a unit with t0 == 0 reads the history (prefill.c never starts
 * a chunk at 0 < t0 < W-1), and that unit also writes the state, after it has read
 * the history (gdn_prefill_write_state), so no other unit touches the slot. */
typedef void (*gdn_prefill_kernel_fn)(const gdn_prefill_params *p, const float *w, int64_t ld,
                                      const float *b, int64_t i, int64_t c0, int64_t c1, int64_t t0,
                                      int64_t t1);

void gdn_prefill_scalar(const gdn_prefill_params *p, const float *w, int64_t ld, const float *b, int64_t i,
                        int64_t c0, int64_t c1, int64_t t0, int64_t t1);
#ifdef GDN_HAVE_X86_SIMD
void gdn_prefill_avx2(const gdn_prefill_params *p, const float *w, int64_t ld, const float *b, int64_t i,
                      int64_t c0, int64_t c1, int64_t t0, int64_t t1);
void gdn_prefill_avx512(const gdn_prefill_params *p, const float *w, int64_t ld, const float *b, int64_t i,
                        int64_t c0, int64_t c1, int64_t t0, int64_t t1);
void gdn_prefill_avx512bf16(const gdn_prefill_params *p, const float *w, int64_t ld, const float *b,
                            int64_t i, int64_t c0, int64_t c1, int64_t t0, int64_t t1);
#endif
#ifdef GDN_HAVE_NEON_SIMD
void gdn_prefill_neon(const gdn_prefill_params *p, const float *w, int64_t ld, const float *b, int64_t i,
                      int64_t c0, int64_t c1, int64_t t0, int64_t t1);
void gdn_prefill_neonbf16(const gdn_prefill_params *p, const float *w, int64_t ld, const float *b,
                          int64_t i, int64_t c0, int64_t c1, int64_t t0, int64_t t1);
#endif

/* The portable core (prefill_scalar.c): request r, channels [c0, c1), tokens
 * [t0, t1), any strides; the SIMD kernels call it for their channel tails. */
void gdn_prefill_scalar_range(const gdn_prefill_params *p, const float *w, int64_t ld, const float *b,
                              const gdn_prefill_request *r, int64_t c0, int64_t c1, int64_t t0, int64_t t1);

/* dst[l] = element (c + l) * stride of row (dtype dt) as fp32, l < n: a SIMD kernel's
 * history row from a state whose channels are strided (prefill_scalar.c; out of
 * line: it runs once per request and channel line). */
void gdn_prefill_gather(float *dst, const char *row, int64_t stride, int64_t c, int n, int dt);

/* Rows 0..W-2 at dst_state (a slot's row 0, channel 0), channels [c0, c1) <- the last
 * W-1 rows of h ++ x[:T], T = r->T, raw bits (NaN payloads kept). Row k takes x row
 * T-(W-1)+k, or for T < W-1 history row T+k: state row T+k of r's slot (read before it
 * is written, as rows go up, when dst_state is that slot) or zeros. The caller has
 * read the history already when dst_state is r's slot. */
static inline void gdn_prefill_write_rows(const gdn_prefill_params *pp, const gdn_prefill_request *r,
                                          char *dst_state, int64_t c0, int64_t c1) {
    const gdn_update_params *p = &pp->conv;
    const int64_t H = p->width - 1, e = gdn_elsize(p->dtype), n = c1 - c0;
    const int64_t sd = p->state_stride_d, sl = p->state_stride_l, xd = p->x_stride_d;
    for (int64_t k = 0; k < H; k++) {
        const int64_t pos = r->T - H + k;   /* position in x; < 0: history row pos + H */
        char *dst = dst_state + e * (k * sl + c0 * sd);
        const char *src = pos >= 0 ? r->x + e * (pos * p->x_stride_t + c0 * xd)
                          : r->init ? r->state + e * ((pos + H) * sl + c0 * sd)
                                    : NULL;
        const int64_t ss = pos >= 0 ? xd : sd;
        if (!src && sd == 1) memset(dst, 0, (size_t)(n * e));
        else if (sd == 1 && ss == 1) memmove(dst, src, (size_t)(n * e));
        else
            for (int64_t c = 0; c < n; c++)
                gdn_store_raw(dst, c * sd, src ? gdn_load_raw(src, c * ss, p->dtype) : 0u, p->dtype);
    }
}

/* State rows 0..W-2 of r's slot <- the last W-1 rows of h ++ x (gdn_prefill_write_rows). */
static inline void gdn_prefill_write_state(const gdn_prefill_params *pp, const gdn_prefill_request *r,
                                           int64_t c0, int64_t c1) {
    gdn_prefill_write_rows(pp, r, r->state, c0, c1);
}

#endif
