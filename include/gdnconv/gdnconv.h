/* gdnconv public C interface: dtypes, status codes, CPU features, ISA selection and
 * the ops (one params struct and one set of calls per op).
 *
 * ref: vLLM causal_conv1d_update and causal_conv1d_fn
 * (vllm/model_executor/layers/mamba/ops/causal_conv1d.py) for the update's and the
 * prefill's semantics; the package's README and gdnconv.reference for the exact
 * contract.
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

/* Status of a validation: GDN_OK, or what is wrong (with the offending index and
 * value reported beside it). */
enum {
    GDN_OK = 0,
    GDN_ERR_SLOT_RANGE = 1,
    GDN_ERR_SLOT_DUPLICATE = 2,
    GDN_ERR_ACCEPTED_RANGE = 3,
    GDN_ERR_SPEC_TOKENS = 4,
    GDN_ERR_QSL_START = 5,
    GDN_ERR_QSL_ORDER = 6,
    GDN_ERR_QSL_END = 7,
    GDN_ERR_NO_MEMORY = 8,
    /* prefix caching: a request's state read from one slot, written to another, and
     * the prefill's boundary snapshots (bad_index a request, or k for snapshots[k]) */
    GDN_ERR_READ_SLOT_RANGE = 9,      /* initial_state_indices[i] outside 0..S-1 */
    GDN_ERR_READ_WRITTEN = 10,        /* initial_state_indices[i] is a slot another request writes */
    GDN_ERR_SPEC_READ = 11,           /* spec mode, read slot != write slot, num_accepted > T_i */
    GDN_ERR_SNAPSHOT_REQUEST = 12,    /* snapshots[k] names a request out of order, out of range, or skipped */
    GDN_ERR_SNAPSHOT_TOKENS = 13,     /* snapshots[k]'s token count outside 1..T_i */
    GDN_ERR_SNAPSHOT_SLOT_RANGE = 14, /* snapshots[k]'s slot outside 0..S-1 */
    GDN_ERR_SNAPSHOT_DUPLICATE = 15   /* snapshots[k]'s slot is written already (a write slot or a snapshot) */
};

/* ---- CPU features (cpu_features.c): what the CPU has and the OS enables ---- */
typedef enum {
    GDN_FEATURE_SSE2, GDN_FEATURE_AVX, GDN_FEATURE_AVX2, GDN_FEATURE_FMA, GDN_FEATURE_F16C,
    GDN_FEATURE_AVX512F, GDN_FEATURE_AVX512BW, GDN_FEATURE_AVX512VL, GDN_FEATURE_AVX512DQ,
    GDN_FEATURE_AVX512_BF16, GDN_FEATURE_AVX512_FP16,
    GDN_FEATURE_AMX_TILE, GDN_FEATURE_AMX_BF16, GDN_FEATURE_AMX_INT8,
    GDN_FEATURE_OS_AVX, GDN_FEATURE_OS_AVX512, GDN_FEATURE_OS_AMX, /* XCR0: the OS saves YMM / ZMM / tiles */
    GDN_FEATURE_ASIMD, GDN_FEATURE_SVE,                             /* aarch64 */
    GDN_FEATURE_BF16,                                               /* aarch64 FEAT_BF16 */
    GDN_FEATURE_COUNT
} gdn_feature;

/* Lower-case name of feature f ("avx512_bf16"), NULL outside 0..GDN_FEATURE_COUNT-1. */
const char *gdn_feature_name(int f);
/* 1 if this CPU (and OS) has feature f; detected once, on the first call. */
int gdn_cpu_has(int f);

/* ---- ISA kernels (isa.c) ---- */
/* Number of ISA kernels compiled into this build, best first. */
int gdn_isa_count(void);
const char *gdn_isa_name(int i);
/* 1 if ISA i is compiled in and this CPU (and OS) supports it. */
int gdn_isa_supported(int i);
/* Select by name (NULL: the best supported); returns 0, -1 for an unknown name, -2
 * if unsupported here. Not thread-safe: call it between calls, not during one. */
int gdn_select_isa(const char *name);
const char *gdn_active_isa(void);

/* ---- the conv update (update.c): decode and speculative decoding ----
 *
 * One struct describes a whole call (zero-initialise it, then fill it in). Strides
 * are in elements, not bytes. Token t of request i lives at
 *   x + i * x_stride_b + (start_i + t) * x_stride_t + d * x_stride_d
 * where start_i = query_start_loc[i] (varlen, x_stride_b = 0) or 0 (fixed T). */
/* What a call writes to the out rows of pad-slot requests: nothing (a given out keeps
 * them), zeros (a new out), or x's rows (the update only: vLLM's CPU op returns a copy
 * of x with the live requests' rows computed). */
typedef enum { GDN_SKIPPED_KEEP = 0, GDN_SKIPPED_ZERO = 1, GDN_SKIPPED_X = 2 } gdn_skipped_rows;

typedef struct gdn_update_params {
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
    int skipped_rows;       /* out rows of pad-slot requests: a gdn_skipped_rows */

    const void *x;          /* [B, T, D] or [N, D] */
    int64_t x_stride_b, x_stride_t, x_stride_d;
    void *out;              /* same shape as x */
    int64_t out_stride_b, out_stride_t, out_stride_d;
    void *conv_state;       /* [S, L, D] */
    int64_t state_stride_s, state_stride_l, state_stride_d;
    const void *weight;     /* [D, W] */
    int64_t weight_stride_d, weight_stride_w;
    /* 1: weight is in vLLM's packed layout (causal_conv1d_weight_pack, what vLLM's
     * CPU backend holds for bf16 width-4 conv weights): W = 4, D a multiple of 32,
     * contiguous, tap k of channel c at element (c / 32) * 128 + (k / 2) * 64 +
     * (c % 32) * 2 + k % 2; the weight strides are not read. The SIMD kernels read a
     * bf16 one in place (two taps per 32-bit lane), any other is converted. */
    int is_weight_packed;
    const void *bias;       /* [D] or NULL */
    int64_t bias_stride;

    const int32_t *conv_state_indices;   /* [B] or NULL: slot i for request i */
    const int32_t *num_accepted_tokens;  /* [B] or NULL: plain decode */
    const int32_t *query_start_loc;      /* [B + 1] or NULL: fixed T */
    /* [B] or NULL: the slot request i's state is read from (vLLM's prefix-caching block
     * cache_indices[i, initial_state_idx[i]]); the rolled state goes to
     * conv_state_indices[i]. Where they differ, the rows the window reads (off..off+W-2)
     * are copied from the read slot to the write slot first, channel block by channel
     * block in the unit that then runs the kernel there, so the write slot's rows the
     * roll does not reach keep their content. */
    const int32_t *initial_state_indices;
    /* Set by gdn_update_run on its own copy for the kernels (the value passed is
     * ignored): the units run request-major within each of this many contiguous ranges
     * of channel blocks, one range per thread (update.c), which the kernels' prefetch of
     * the next unit follows. */
    int64_t channel_groups;
    /* Set by gdn_update_run on its own copy too: channels per unit of work (update.c's
     * unit_channels), a multiple of 64. */
    int64_t block_channels;
} gdn_update_params;

/* Validation of the index arrays before any write (with initial_state_indices: read
 * slots in range, none written by another request, and in speculative mode a read slot
 * other than the write slot needs num_accepted_tokens[i] <= T_i, so every row copied
 * to the write slot is rewritten by the roll). Returns GDN_OK when the call is
 * legal, otherwise a status code with *bad_index set to the offending request (or
 * query_start_loc entry) and *bad_value to its value. */
int gdn_update_validate(const gdn_update_params *p, int64_t num_tokens, int64_t *bad_index,
                        int64_t *bad_value);

/* Bytes the performance model says the call must move (plus (W-1) rows per request
 * whose state is copied from another slot). */
int64_t gdn_update_bytes(const gdn_update_params *p);

/* Run the whole call. Call gdn_update_validate first. num_threads > 0: up to that
 * many threads, as asked; num_threads < 0: the default, up to -num_threads threads,
 * fewer while this calling thread's calls on several threads wait for a thread the
 * scheduler parked (docs/design.md). Calls below the parallel size, and every call
 * in a forked child, run on the calling thread. */
void gdn_update_run(const gdn_update_params *p, int num_threads);

/* The kernel the calling thread's last gdn_update_run took, for tests: *isa the ISA
 * name ("scalar" for the portable kernel), *entry "state-channel-contiguous",
 * "state-time-contiguous" (conv_state with time stride 1) or "any-strides" (the
 * portable kernel for any other strides). Within a SIMD entry, channels past the last
 * whole 64-byte line of a block run the portable core. Returns 0, or -1 (both NULL)
 * before this thread's first call. */
int gdn_update_last_path(const char **isa, const char **entry);

/* ---- the conv prefill (prefill.c): whole prompts, seeding each request's state ----
 *
 * ref: vLLM causal_conv1d_fn and its CPU op causal_conv1d_fwd_cpu. Request i with
 * slot s = conv.conv_state_indices[i] (vLLM's cache_indices): the history h is
 * conv_state[s, 0:W-1] when has_initial_state[i], else W-1 zero rows (the slot is
 * then not read); out over h ++ x_i with the update's arithmetic; afterwards
 * conv_state[s, 0:W-1] holds the last W-1 rows of h ++ x_i (raw bits), rows past
 * W-2 untouched: what a plain update leaves. */
typedef struct gdn_prefill_params {
    /* the update's struct for the shared fields (geometry, arrays, weights, slots,
     * query_start_loc); num_accepted_tokens must be NULL. conv_state NULL: a
     * convolution from zero history that writes no state (conv_state_indices,
     * has_initial_state NULL then too). */
    gdn_update_params conv;
    const uint8_t *has_initial_state;    /* [B] 0/1, or NULL: every history is zeros */
    /* [num_snapshots, 3] rows (request i, tokens p, slot s), requests non-decreasing:
     * afterwards rows 0..W-2 of slot s hold the last W-1 rows of h_i ++ x_i[:p] (the
     * state after p tokens, raw bits; rows past W-2 untouched): vLLM's prefix-caching
     * states at block boundaries. NULL with num_snapshots 0: none. */
    const int32_t *snapshots;
    int64_t num_snapshots;
} gdn_prefill_params;

/* The update's index checks (query_start_loc, slot range, duplicate live slots, the
 * read slots of initial_state_indices where has_initial_state), and the snapshots' (in
 * order, of live requests, 1 <= p <= T_i, slots in range and written once in the call
 * with the write slots, none another request's read slot), with its status codes;
 * before any write. */
int gdn_prefill_validate(const gdn_prefill_params *p, int64_t num_tokens, int64_t *bad_index,
                         int64_t *bad_value);

/* Bytes the performance model counts: e * D * sum over live requests of (2 T_i
 * [read x, write out] + (W-1) [history read, when has_initial_state] + (W-1) [state
 * written, when conv_state is given] + (W-1) [the history copied to the write slot,
 * when read from another slot]) + (W-1) per snapshot, plus D * W weight elements. */
int64_t gdn_prefill_bytes(const gdn_prefill_params *p);

/* Run the whole call on num_threads threads (< 0: a default call on up to -num_threads,
 * as gdn_update_run takes it); call gdn_prefill_validate first.
 * Returns GDN_OK, or GDN_ERR_NO_MEMORY (nothing written) when the weight conversion
 * has no memory. */
int gdn_prefill_run(const gdn_prefill_params *p, int num_threads);

#ifdef __cplusplus
}
#endif
#endif
