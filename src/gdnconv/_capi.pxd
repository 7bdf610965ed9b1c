# The C interface as Cython sees it: the one mirror of include/gdnconv/gdnconv.h, plus
# the thread-setting hooks of src/csrc/threads.h, the memory advice of src/csrc/memory.h, the
# self-overlap rule of src/csrc/layout.h and the torch op's set-up (src/csrc/torch_op.h).
from libc.stdint cimport int32_t, int64_t, uint8_t

cdef extern from "gdnconv/gdnconv.h" nogil:
    enum:
        GDN_F32
        GDN_F16
        GDN_BF16
        GDN_MIN_WIDTH
        GDN_MAX_WIDTH
        GDN_OK
        GDN_ERR_SLOT_RANGE
        GDN_ERR_SLOT_DUPLICATE
        GDN_ERR_ACCEPTED_RANGE
        GDN_ERR_SPEC_TOKENS
        GDN_ERR_QSL_START
        GDN_ERR_QSL_ORDER
        GDN_ERR_QSL_END
        GDN_ERR_NO_MEMORY
        GDN_ERR_READ_SLOT_RANGE
        GDN_ERR_READ_WRITTEN
        GDN_ERR_SPEC_READ
        GDN_ERR_SNAPSHOT_REQUEST
        GDN_ERR_SNAPSHOT_TOKENS
        GDN_ERR_SNAPSHOT_SLOT_RANGE
        GDN_ERR_SNAPSHOT_DUPLICATE
        GDN_FEATURE_COUNT
        GDN_SKIPPED_KEEP
        GDN_SKIPPED_ZERO
        GDN_SKIPPED_X
    ctypedef struct gdn_update_params:
        int64_t batch, dim, width, state_len, num_slots, seqlen, pad_slot_id
        int dtype, weight_dtype, silu, skipped_rows
        const void *x
        int64_t x_stride_b, x_stride_t, x_stride_d
        void *out
        int64_t out_stride_b, out_stride_t, out_stride_d
        void *conv_state
        int64_t state_stride_s, state_stride_l, state_stride_d
        const void *weight
        int64_t weight_stride_d, weight_stride_w
        int is_weight_packed
        const void *bias
        int64_t bias_stride
        const int32_t *conv_state_indices
        const int32_t *num_accepted_tokens
        const int32_t *query_start_loc
        const int32_t *initial_state_indices
    const char *gdn_feature_name(int f)
    int gdn_cpu_has(int f)
    int gdn_isa_count()
    const char *gdn_isa_name(int i)
    int gdn_isa_supported(int i)
    int gdn_select_isa(const char *name)
    const char *gdn_active_isa()
    int gdn_update_validate(const gdn_update_params *p, int64_t num_tokens, int64_t *bad_index,
                            int64_t *bad_value)
    int64_t gdn_update_bytes(const gdn_update_params *p)
    void gdn_update_run(const gdn_update_params *p, int num_threads)
    int gdn_update_last_path(const char **isa, const char **entry)
    ctypedef struct gdn_prefill_params:
        gdn_update_params conv
        const uint8_t *has_initial_state
        const int32_t *snapshots
        int64_t num_snapshots
    int gdn_prefill_validate(const gdn_prefill_params *p, int64_t num_tokens, int64_t *bad_index,
                             int64_t *bad_value)
    int64_t gdn_prefill_bytes(const gdn_prefill_params *p)
    int gdn_prefill_run(const gdn_prefill_params *p, int num_threads)

cdef extern from "threads.h" nogil:
    enum:
        GDN_NO_CAP
    ctypedef struct gdn_adapt_state:
        int cap
        unsigned history
        int last_threads
        double retry_at, backoff
        int64_t slow_calls, probes, reductions, capped_calls
    gdn_adapt_state gdn_adapt_get()
    void gdn_adapt_set(gdn_adapt_state s)
    int gdn_adapt_step(int n, int slow, double now)
    double gdn_adapt_now()
    int64_t gdn_set_parallel_min_bytes(int64_t bytes)
    void gdn_fork_guard_init()
    int gdn_num_procs()

cdef extern from "memory.h" nogil:
    enum:
        GDN_HUGE_ADVICE_BYTES
        GDN_REUSE_MIN_BYTES
        GDN_BLOCK_SKEW
    void gdn_advise_huge_pages(void *p, int64_t bytes)
    void *gdn_block_take(int64_t bytes, int huge, int64_t *size)
    void gdn_block_give(void *p, int64_t size)
    int64_t gdn_block_cache_limit(int64_t bytes)
    int64_t gdn_block_cache_held()

cdef extern from "layout.h" nogil:
    int gdn_no_self_overlap(int ndim, const int64_t *shape, const int64_t *strides)

cdef extern from "torch_op.h" nogil:
    enum:
        GDN_OP_SILU
        GDN_OP_BIAS
        GDN_OP_ACCEPTED
        GDN_OP_INDICES
        GDN_OP_VARLEN
    int gdn_torch_op_init(const char *libtorch_path)
    void gdn_torch_op_threads(int request)
    int gdn_torch_direct_init(const char *libtorch_python_path, size_t header, void **probe)
    int gdn_torch_direct(void *const objs[8], int into, int64_t flags, int64_t pad, void **new_out)

cdef extern from "torch_op.h":
    object gdn_torch_wrap(void *tensor)
