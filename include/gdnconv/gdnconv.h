/* gdnconv public C interface: the params struct, kernel signature and dispatcher.
 *
 * ref: vLLM causal_conv1d_update (vllm/model_executor/layers/mamba/ops/causal_conv1d.py)
 * for the semantics; ../shared/SPEC.md for the exact contract.
 */
#ifndef GDNCONV_GDNCONV_H
#define GDNCONV_GDNCONV_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GDN_MIN_WIDTH 2
#define GDN_MAX_WIDTH 8

typedef enum { GDN_F32 = 0, GDN_F16 = 1, GDN_BF16 = 2 } gdn_dtype;

/* One struct describes a whole call (zero-initialise it, then fill it in). Strides
 * are in elements, not bytes.
 * Token t of request i lives at
 *   x + i * x_stride_b + (start_i + t) * x_stride_t + d * x_stride_d
 * where start_i = query_start_loc[i] (varlen, x_stride_b = 0) or 0 (fixed T). */
typedef struct gdn_params {
    int64_t batch;          /* B requests */
    int64_t dim;            /* D channels */
    int64_t width;          /* W taps, GDN_MIN_WIDTH..GDN_MAX_WIDTH */
    int64_t state_len;      /* L rows per slot */
    int64_t num_slots;      /* S slots */
    int64_t seqlen;         /* T for fixed-length batches; unused with query_start_loc */
    int64_t pad_slot_id;

    int dtype;              /* gdn_dtype of x, out, conv_state */
    int weight_dtype;       /* gdn_dtype of weight and bias: dtype or GDN_F32 */
    int silu;               /* 1: out = silu(conv), 0: out = conv */
    int zero_skipped;       /* 1: write zeros to out rows of pad-slot requests */

    const void *x;          /* [B, T, D] or [N, D] */
    int64_t x_stride_b, x_stride_t, x_stride_d;
    void *out;              /* same shape as x */
    int64_t out_stride_b, out_stride_t, out_stride_d;
    void *conv_state;       /* [S, L, D] */
    int64_t state_stride_s, state_stride_l, state_stride_d;
    const void *weight;     /* [D, W] */
    int64_t weight_stride_d, weight_stride_w;
    const void *bias;       /* [D] or NULL */
    int64_t bias_stride;

    const int32_t *conv_state_indices;   /* [B] or NULL: slot i for request i */
    const int32_t *num_accepted_tokens;  /* [B] or NULL: plain decode */
    const int32_t *query_start_loc;      /* [B + 1] or NULL: fixed T */

    /* NULL, or room for gdn_weight_scratch_floats(p, num_threads) floats, the
     * caller's for the call: where each thread may convert the weights and bias
     * once (fp32, taps outermost) */
    float *weight_scratch;
} gdn_params;

/* Every ISA kernel has this signature: requests [r0, r1) x channels [c0, c1). */
typedef void (*gdn_kernel_fn)(const gdn_params *p, int64_t r0, int64_t r1,
                              int64_t c0, int64_t c1);

/* ---- CPU features (cpu_features.c) ---- */
typedef struct gdn_cpu_features {
    int sse2, avx, avx2, fma, f16c;
    int avx512f, avx512bw, avx512vl, avx512dq, avx512_bf16, avx512_fp16;
    int amx_tile, amx_bf16, amx_int8;
    int os_avx, os_avx512, os_amx;  /* XCR0 says the OS saves YMM / ZMM / tile state */
} gdn_cpu_features;

const gdn_cpu_features *gdn_get_cpu_features(void);

/* ---- dispatch (dispatch.c) ---- */
/* Number of ISA kernels compiled into this build, best first. */
int gdn_isa_count(void);
const char *gdn_isa_name(int i);
/* 1 if ISA i is compiled in and this CPU (and OS) supports it. */
int gdn_isa_supported(int i);
/* Select by name; returns 0, -1 for an unknown name, -2 if unsupported here. */
int gdn_select_isa(const char *name);
const char *gdn_active_isa(void);

/* Validation of index arrays before any write. Returns 0 when the call is
 * legal, otherwise a gdn_error code with *bad_index set to the offending
 * request (or query_start_loc entry) and *bad_value to its value. */
enum {
    GDN_OK = 0,
    GDN_ERR_SLOT_RANGE = 1,
    GDN_ERR_SLOT_DUPLICATE = 2,
    GDN_ERR_ACCEPTED_RANGE = 3,
    GDN_ERR_SPEC_TOKENS = 4,
    GDN_ERR_QSL_START = 5,
    GDN_ERR_QSL_ORDER = 6,
    GDN_ERR_QSL_END = 7,
    GDN_ERR_NO_MEMORY = 8
};
int gdn_validate(const gdn_params *p, int64_t num_tokens, int64_t *bad_index,
                 int64_t *bad_value);

/* Bytes SPEC's performance model says the call must move. */
int64_t gdn_bytes_moved(const gdn_params *p);

/* Calls moving fewer bytes run on the calling thread; returns the previous value. */
int64_t gdn_set_parallel_min_bytes(int64_t bytes);

/* Call once before any call (the extension does at import): from then on, a
 * process forked from this one runs every call on its calling thread. */
void gdn_fork_guard_init(void);

/* CPUs the process may use as the OpenMP runtime counts them (its count stays the
 * process's when OMP_PROC_BIND pins the calling thread to one CPU); 0 in a build
 * without OpenMP. */
int gdn_num_procs(void);

/* Floats of weight_scratch that gdn_run(p, num_threads) can use (p filled in but
 * for weight_scratch); 0: it would not use any. */
int64_t gdn_weight_scratch_floats(const gdn_params *p, int num_threads);

/* Run the whole call, on up to num_threads threads. Call gdn_validate first. */
void gdn_run(const gdn_params *p, int num_threads);

#ifdef __cplusplus
}
#endif
#endif
