/* The conv update's internals shared by its files: work-unit sizes, the kernel
 * signatures an ISA provides, one request's geometry, and weight conversion. */
#ifndef GDNCONV_UPDATE_H
#define GDNCONV_UPDATE_H

#include <stdlib.h>

#include "convert.h"

/* Channels per unit of work (multiples of 64): GDN_BLOCK_CHANNELS, or up to
 * GDN_BLOCK_CHANNELS_MAX (update.c's unit_channels; the kernels' buffers hold that many),
 * and requests per unit of the portable kernel, which converts the weights of a chunk
 * once for all of them (SIMD units hold one request: see update.c). */
#define GDN_BLOCK_CHANNELS 256
#define GDN_BLOCK_CHANNELS_MAX 512
#define GDN_BLOCK_REQUESTS 8
#define GDN_SLAB 8  /* tokens the SIMD update stages at a time (update_simd.h) */

/* An ISA's update kernel: requests [r0, r1) x channels [c0, c1). */
typedef void (*gdn_update_kernel_fn)(const gdn_update_params *p, int64_t r0, int64_t r1,
                                     int64_t c0, int64_t c1);
/* An ISA's weight conversion: weights and bias of channels [c0, c1) as fp32,
 * w[k * ld + c] and b[c] (update.c's per-thread copy). */
typedef void (*gdn_fill_fn)(const gdn_update_params *p, int64_t c0, int64_t c1, float *w,
                            int64_t ld, float *b);

void gdn_update_scalar(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
#ifdef GDN_HAVE_X86_SIMD
void gdn_update_avx2(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
void gdn_fill_avx2(const gdn_update_params *p, int64_t c0, int64_t c1, float *w, int64_t ld, float *b);
void gdn_update_avx512(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
void gdn_fill_avx512(const gdn_update_params *p, int64_t c0, int64_t c1, float *w, int64_t ld, float *b);
void gdn_update_avx512bf16(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
#endif
#ifdef GDN_HAVE_NEON_SIMD
void gdn_update_neon(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
void gdn_fill_neon(const gdn_update_params *p, int64_t c0, int64_t c1, float *w, int64_t ld, float *b);
void gdn_update_neonbf16(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
#endif

/* ---- one request ---- */
typedef struct gdn_request {
    int skip;        /* pad slot or no tokens: nothing read, nothing written */
    int64_t T;       /* tokens this step */
    int64_t off;     /* first window row: num_accepted_tokens - 1, or 0 */
    const char *x;   /* token 0, channel 0 (byte pointer) */
    char *out;
    char *state;     /* slot row 0, channel 0 */
} gdn_request;

static inline int gdn_is_pad(const gdn_update_params *p, int64_t i) {
    return p->conv_state_indices && p->conv_state_indices[i] == p->pad_slot_id;
}

static inline gdn_request gdn_get_request(const gdn_update_params *p, int64_t i) {
    gdn_request r;
    const int64_t e = gdn_elsize(p->dtype);
    const int64_t slot = p->conv_state_indices ? p->conv_state_indices[i] : i;
    const int64_t start = p->query_start_loc ? p->query_start_loc[i] : 0;
    r.T = p->query_start_loc ? p->query_start_loc[i + 1] - start : p->seqlen;
    r.skip = r.T <= 0 || gdn_is_pad(p, i);
    r.off = p->num_accepted_tokens ? p->num_accepted_tokens[i] - 1 : 0;
    r.x = (const char *)p->x + e * (i * p->x_stride_b + start * p->x_stride_t);
    r.out = (char *)p->out + e * (i * p->out_stride_b + start * p->out_stride_t);
    r.state = r.skip ? NULL : (char *)p->conv_state + e * slot * p->state_stride_s;
    return r;
}

/* ---- prefix caching: the state read from another slot ---- */
/* The checks of both ops: query_start_loc, write slots (range, duplicates), the
 * speculative ranges, snapshots[K, 3] (prefill) and the read slots of
 * initial_state_indices (every live request's in the update; in the prefill those with
 * init[i]). gdn_update_validate and gdn_prefill_validate are this. */
int gdn_slots_validate(const gdn_update_params *p, int64_t num_tokens, int prefill, const uint8_t *init,
                       const int32_t *snap, int64_t K, int64_t *bad_index, int64_t *bad_value);

/* Rows [l0, l0 + n) of slot src to slot dst, channels [c0, c1), raw bits (NaN
 * payloads kept). */
static inline void gdn_copy_rows(const gdn_update_params *p, int64_t src, int64_t dst, int64_t l0, int64_t n,
                                 int64_t c0, int64_t c1) {
    const int64_t e = gdn_elsize(p->dtype), sd = p->state_stride_d;
    for (int64_t l = l0; l < l0 + n; l++) {
        const char *from = (const char *)p->conv_state + e * (src * p->state_stride_s + l * p->state_stride_l);
        char *to = (char *)p->conv_state + e * (dst * p->state_stride_s + l * p->state_stride_l);
        if (sd == 1) memcpy(to + e * c0, from + e * c0, (size_t)(e * (c1 - c0)));
        else
            for (int64_t c = c0; c < c1; c++) gdn_store_raw(to, c * sd, gdn_load_raw(from, c * sd, p->dtype), p->dtype);
    }
}

/* ---- weights ---- */
/* The element index of tap k of channel c in vLLM's packed layout (gdnconv.h): taps 2j
 * and 2j + 1 of a channel share a 32-bit lane, 32 channels' lanes per tap pair. */
GDN_INLINE int64_t gdn_packed_index(int64_t c, int64_t k) {
    return (c >> 5) * 128 + (k >> 1) * 64 + (c & 31) * 2 + (k & 1);
}

/* The element index of tap k of channel c in p->weight (its strides, or the packed layout). */
GDN_INLINE int64_t gdn_weight_index(const gdn_update_params *p, int64_t c, int64_t k) {
    return p->is_weight_packed ? gdn_packed_index(c, k) : c * p->weight_stride_d + k * p->weight_stride_w;
}

/* fp32 weights with unit channel stride (pack_weight's layout), which every kernel
 * reads in place. */
GDN_INLINE int gdn_weight_f32_rows(const gdn_update_params *p) {
    return p->weight_dtype == GDN_F32 && p->weight_stride_d == 1 && !p->is_weight_packed;
}

/* bf16 weights in vLLM's packed layout, which the SIMD kernels read in place. */
GDN_INLINE int gdn_weight_bf16_packed(const gdn_update_params *p) {
    return p->is_weight_packed && p->weight_dtype == GDN_BF16;
}

/* Weights and bias of channels [c0, c0 + n) as fp32, tap-major: w[k * ld + c]. */
GDN_INLINE void gdn_fill_weights(const gdn_update_params *p, int64_t c0, int64_t n, float *w,
                                 int64_t ld, float *b, int wdt) {
    const int64_t W = p->width;
    for (int64_t c = 0; c < n; c++) {
        for (int64_t k = 0; k < W; k++)
            w[k * ld + c] = gdn_raw_to_float(gdn_load_raw(p->weight, gdn_weight_index(p, c0 + c, k), wdt), wdt);
        b[c] = p->bias ? gdn_raw_to_float(gdn_load_raw(p->bias, (c0 + c) * p->bias_stride, wdt), wdt) : 0.0f;
    }
}

/* Same, with the weight dtype resolved at run time (once per unit of work). */
static inline void gdn_fill_weights_any(const gdn_update_params *p, int64_t c0, int64_t n, float *w,
                                        int64_t ld, float *b) {
    if (p->weight_dtype == GDN_F32) gdn_fill_weights(p, c0, n, w, ld, b, GDN_F32);
    else if (p->weight_dtype == GDN_F16) gdn_fill_weights(p, c0, n, w, ld, b, GDN_F16);
    else gdn_fill_weights(p, c0, n, w, ld, b, GDN_BF16);
}

static inline void gdn_fill_bias(const gdn_update_params *p, int64_t c0, int64_t n, float *b) {
    for (int64_t c = 0; c < n; c++)
        b[c] = p->bias ? gdn_raw_to_float(gdn_load_raw(p->bias, (c0 + c) * p->bias_stride, p->weight_dtype),
                                          p->weight_dtype)
                       : 0.0f;
}

/* The portable core (update_scalar.c): requests reqs[0..nreq) (skipped ones
 * ignored), channels [c0, c1), any strides. The SIMD kernels call it for the
 * channels past their last whole vector line. */
void gdn_update_scalar_range(const gdn_update_params *p, const gdn_request *reqs, int nreq, int64_t c0,
                             int64_t c1);

#endif
