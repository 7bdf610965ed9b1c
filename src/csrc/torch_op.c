/* gdnconv's decode as a torch op, for gdnconv.vllm's usual call on torch tensors.
 *
 * Why: from Python, reading six tensors costs gdnconv's Cython layer ~3-5 us a call
 * (each storage, negation bit and version through torch's Python bindings), more than
 * the kernel at one to four requests. A torch op receives them as C handles and reads
 * them with C calls: ~2 us for the whole call through torch.ops, a new out included
 * (benchmarks/bench_intake_floor.py).
 *
 * How, without building against torch: the ops use torch's stable C ABI only (the
 * aoti_torch_* shim and the boxed calling convention, StableIValue stacks), whose
 * functions are looked up in the libtorch the process has loaded (dlopen with
 * RTLD_NOLOAD, dlsym). A torch without them (or another platform) gets no ops, and
 * gdnconv.vllm keeps its Cython path. The C declarations below are the shim's, by its
 * documented signatures (torch/csrc/inductor/aoti_torch/c/shim.h, stable/c/shim.h).
 *
 * What the ops take: exactly gdnconv.vllm's usual decode call (plain or speculative,
 * x (B, D) or 3-D, or varlen x (N, D) with query_start_loc, conv_state (S, D, L), weights
 * in x's dtype or float32, int32 index arrays of at least B entries, conv_state_indices
 * also as a (B, k) table whose column 0 is read) on CPU tensors, every view inside its
 * storage, what is written (conv_state, out) apart from everything else by address range.
 * Anything else they refuse (a None result, or 0), before any write, and the caller runs
 * its full path, which gives that call's result or its error. They fill gdn_update_params as the Cython layer's
 * _update_params does, so the kernel, and its result, are the same bit for bit. What
 * the shim cannot read (a negation bit, requires_grad, inference tensors) the caller
 * checks before calling (_core._op_update, _runtime.pxi), and an input's negation bit the
 * dispatcher resolves before the kernel runs. The ops are gdnconv's own (torch.ops._gdnconv),
 * called through _core._op_update only: called directly with a written tensor that has a
 * negation bit, torch's fallback for it runs the kernel on a resolved copy and then fails
 * to copy back (the ops return no tensor), after conv_state was written. Where torch's
 * Python objects allow it, the same call is made without the dispatcher (below). */
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "layout.h"
#include "memory.h"
#include "torch_op.h"

#if defined(__linux__) || defined(__APPLE__)
#include <dlfcn.h>
#define GDN_HAVE_DLOPEN 1
#endif

typedef struct gdn_aten_tensor *AtenTensorHandle;
typedef struct gdn_torch_library *TorchLibraryHandle;
typedef uint64_t StableIValue;
typedef int32_t AOTITorchError;                 /* 0: success */
typedef void (*gdn_boxed_fn)(StableIValue *stack, uint64_t num_args, uint64_t num_outputs);

static struct {
    AOTITorchError (*data_ptr)(AtenTensorHandle, void **);
    AOTITorchError (*dim)(AtenTensorHandle, int64_t *);
    AOTITorchError (*sizes)(AtenTensorHandle, int64_t **);
    AOTITorchError (*strides)(AtenTensorHandle, int64_t **);
    AOTITorchError (*dtype)(AtenTensorHandle, int32_t *);
    AOTITorchError (*device_type)(AtenTensorHandle, int32_t *);
    AOTITorchError (*layout)(AtenTensorHandle, int32_t *);
    AOTITorchError (*storage_offset)(AtenTensorHandle, int64_t *);
    AOTITorchError (*storage_size)(AtenTensorHandle, int64_t *);   /* bytes */
    AOTITorchError (*empty_strided)(int64_t, const int64_t *, const int64_t *, int32_t, int32_t, int32_t,
                                    AtenTensorHandle *);
    AOTITorchError (*undefined_tensor)(AtenTensorHandle *);
    AOTITorchError (*delete_tensor)(AtenTensorHandle);
    int32_t (*device_cpu)(void), (*layout_strided)(void);
    int32_t (*dtype_f32)(void), (*dtype_f16)(void), (*dtype_bf16)(void), (*dtype_i32)(void);
    AOTITorchError (*library_init_def)(const char *, const char *, uint32_t, TorchLibraryHandle *);
    AOTITorchError (*library_init_impl)(const char *, const char *, const char *, uint32_t, TorchLibraryHandle *);
    AOTITorchError (*library_def)(TorchLibraryHandle, const char *);
    AOTITorchError (*library_impl)(TorchLibraryHandle, const char *, gdn_boxed_fn);                 /* torch < 2.10 */
    AOTITorchError (*library_impl_v)(TorchLibraryHandle, const char *, gdn_boxed_fn, uint64_t);     /* 2.10 on */
} api;

/* The most requests whose slots the op gathers from a block table's column (else the caller's path). */
#define GDN_OP_GATHER_MAX 1024

static int32_t cpu, strided, f32, f16, bf16, i32;   /* torch's codes */
static int thread_request = -1;
static int registered;

void gdn_torch_op_threads(int request) { thread_request = request; }

/* ---- a tensor as the kernel sees it ---- */

typedef struct {
    char *ptr;
    int ndim, dtype;               /* dtype: GDN_F32/F16/BF16, GDN_I32 below for int32, -1 other */
    int64_t itemsize;
    int64_t shape[3], strides[3];  /* strides in elements */
    uintptr_t lo, hi;              /* the bytes its elements span: [lo, hi) */
} tview;

#define GDN_I32 100

/* 1 when h is a strided CPU tensor of 1..3 dimensions, a dtype gdnconv reads, at least one
 * element, no negative stride, aligned and inside its storage; its view in v. */
static int take(AtenTensorHandle h, tview *v) {
    int32_t device, layout, dt;
    int64_t ndim, *size, *stride, offset, nbytes, extent = 0;
    void *data;
    if (api.device_type(h, &device) || device != cpu || api.layout(h, &layout) || layout != strided ||
        api.dim(h, &ndim) || ndim < 1 || ndim > 3 || api.dtype(h, &dt) || api.sizes(h, &size) ||
        api.strides(h, &stride) || api.data_ptr(h, &data) || api.storage_offset(h, &offset) ||
        api.storage_size(h, &nbytes))
        return 0;
    v->dtype = dt == f32 ? GDN_F32 : dt == f16 ? GDN_F16 : dt == bf16 ? GDN_BF16 : dt == i32 ? GDN_I32 : -1;
    if (v->dtype < 0 || data == NULL) return 0;
    v->itemsize = v->dtype == GDN_F16 || v->dtype == GDN_BF16 ? 2 : 4;
    v->ndim = (int)ndim;
    v->ptr = (char *)data;
    for (int i = 0; i < v->ndim; i++) {
        if (size[i] < 1 || stride[i] < 0) return 0;
        v->shape[i] = size[i];
        v->strides[i] = stride[i];
        extent += (size[i] - 1) * stride[i];
    }
    v->lo = (uintptr_t)data;
    v->hi = v->lo + (uintptr_t)((extent + 1) * v->itemsize);
    return v->lo % (uintptr_t)v->itemsize == 0 && offset >= 0 &&
           v->hi - (v->lo - (uintptr_t)(offset * v->itemsize)) <= (uintptr_t)nbytes;
}

static void swap12(tview *v) {
    int64_t t = v->shape[1];
    v->shape[1] = v->shape[2];
    v->shape[2] = t;
    t = v->strides[1];
    v->strides[1] = v->strides[2];
    v->strides[2] = t;
}

static int apart(const tview *a, const tview *b) { return a->hi <= b->lo || b->hi <= a->lo; }

static int same_view(const tview *a, const tview *b) {
    if (a->ptr != b->ptr || a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || a->strides[i] != b->strides[i]) return 0;
    return 1;
}

static int c_contiguous(const tview *v) {
    int64_t expect = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[i] != 1 && v->strides[i] != expect) return 0;
        expect *= v->shape[i];
    }
    return 1;
}

/* The strides (request, token, channel) of x or out, as the Cython layer's _rows: (B, T, D),
 * (N, D) varlen (row query_start_loc[i] + t), or (B, D). */
static void rows(const tview *v, int varlen, int64_t *sb, int64_t *st, int64_t *sd) {
    *sb = varlen ? 0 : v->strides[0];
    *st = v->ndim == 3 ? v->strides[1] : varlen ? v->strides[0] : 0;
    *sd = v->strides[v->ndim - 1];
}

static int same_shape(const tview *a, const tview *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* ---- the call ----
 * stack: x, conv_state, weight, bias, num_accepted_tokens, conv_state_indices,
 * query_start_loc, [out,] flags, pad_slot_id (an absent argument's place holds x).
 * Returns 1 when the kernel ran, 0 when refused; with new_out, the out it made (on a
 * refusal, none). */
static int update(const StableIValue *s, int into, AtenTensorHandle *new_out) {
    enum { X, STATE, WEIGHT, BIAS, ACCEPTED, INDICES, STARTS, OUT };
    const int64_t flags = (int64_t)s[into ? 8 : 7], pad = (int64_t)s[into ? 9 : 8];
    const int silu = (flags & GDN_OP_SILU) != 0, packed = (flags & GDN_OP_PACKED) != 0;
    const int has_bias = (flags & GDN_OP_BIAS) != 0, has_nat = (flags & GDN_OP_ACCEPTED) != 0;
    const int has_idx = (flags & GDN_OP_INDICES) != 0, vllm_x = !(flags & GDN_OP_TOKENS_LAST);
    const int varlen = (flags & GDN_OP_VARLEN) != 0;
    tview v[8], made;
    gdn_update_params p;
    int64_t bad_i = 0, bad_v = 0;
    *new_out = NULL;
    if (pad < INT32_MIN || pad > INT32_MAX) return 0;
    for (int i = 0; i < (into ? 8 : 7); i++)
        if ((i != BIAS || has_bias) && (i != ACCEPTED || has_nat) && (i != INDICES || has_idx) &&
            (i != STARTS || varlen) && !take((AtenTensorHandle)(uintptr_t)s[i], &v[i]))
            return 0;
    tview *x = &v[X], *st = &v[STATE], *w = &v[WEIGHT], *b = &v[BIAS], *qsl = &v[STARTS], *out = &v[OUT];
    /* vLLM's order as gdnconv's: x (B, D, T) -> (B, T, D), conv_state (S, D, L) -> (S, L, D);
     * varlen: x (N, D), query_start_loc (B + 1,) int32 offsets, slots given (as vLLM requires) */
    if (st->ndim != 3 || x->ndim < 2) return 0;
    if (varlen && (x->ndim != 2 || !has_idx || qsl->dtype != GDN_I32 || qsl->ndim != 1 || qsl->shape[0] < 2 ||
                   qsl->strides[0] != 1))
        return 0;
    if (x->ndim == 3 && vllm_x) swap12(x);
    if (into && out->ndim == 3 && vllm_x) swap12(out);
    swap12(st);
    const int dt = x->dtype;
    if (dt == GDN_I32 || st->dtype != dt || (w->dtype != dt && w->dtype != GDN_F32) ||
        (has_bias && b->dtype != w->dtype) || (has_nat && v[ACCEPTED].dtype != GDN_I32) ||
        (has_idx && v[INDICES].dtype != GDN_I32) || (into && out->dtype != dt))
        return 0;
    const int64_t D = w->shape[0], W = w->ndim == 2 ? w->shape[1] : 0;
    const int64_t B = varlen ? qsl->shape[0] - 1 : x->shape[0], T = x->ndim == 3 ? x->shape[1] : 1;
    const int64_t S = st->shape[0], L = st->shape[1];
    if (w->ndim != 2 || W < GDN_MIN_WIDTH || W > GDN_MAX_WIDTH || L < W - 1 ||
        (packed && (W != 4 || D % 32 || w->strides[0] != 4 || w->strides[1] != 1)) ||
        (has_bias && (b->ndim != 1 || b->shape[0] != D)) || x->shape[x->ndim - 1] != D ||
        x->strides[x->ndim - 1] != 1 || st->shape[2] != D)
        return 0;
    /* int32 (B,) arrays, or longer, of which the first B entries are read; conv_state_indices
     * may be a (B, k) table of which column 0 is read (vLLM's conventions, gdnconv.vllm's
     * _first; Mamba2's decode passes (B, 1), speculative decode its (B, 1 + drafts) block
     * table), gathered here when its rows are apart */
    int32_t column[GDN_OP_GATHER_MAX];
    for (int i = ACCEPTED; i <= INDICES; i++)
        if ((i == ACCEPTED ? has_nat : has_idx) &&
            ((v[i].ndim != 1 && (i != INDICES || v[i].ndim != 2)) || v[i].shape[0] < B ||
             (B > 1 && v[i].strides[0] != 1 && (i != INDICES || B > GDN_OP_GATHER_MAX))))
            return 0;
    if (!has_idx && B > S) return 0;
    /* what is written: every element its own memory, apart from what the call reads */
    int out_is_x = 0;
    if (!gdn_no_self_overlap(st->ndim, st->shape, st->strides) || !apart(st, x) || !apart(st, w) ||
        (has_bias && !apart(st, b)) || (has_nat && !apart(st, &v[ACCEPTED])) || (has_idx && !apart(st, &v[INDICES])) ||
        (varlen && !apart(st, qsl)))
        return 0;
    if (into) {
        out_is_x = same_view(out, x);
        if (!same_shape(out, x) || !gdn_no_self_overlap(out->ndim, out->shape, out->strides) || !apart(out, st) ||
            (!out_is_x && !apart(out, x)) || !apart(out, w) || (has_bias && !apart(out, b)) ||
            (has_nat && !apart(out, &v[ACCEPTED])) || (has_idx && !apart(out, &v[INDICES])) ||
            (varlen && !apart(out, qsl)))
            return 0;
    }
    memset(&p, 0, sizeof p);
    p.batch = B, p.dim = D, p.width = W, p.state_len = L, p.num_slots = S, p.seqlen = T;
    p.pad_slot_id = pad;
    p.dtype = dt, p.weight_dtype = w->dtype, p.silu = silu;
    p.skipped_rows = flags & GDN_OP_SKIPPED_FROM_X ? GDN_SKIPPED_X : into ? GDN_SKIPPED_KEEP : GDN_SKIPPED_ZERO;
    p.x = x->ptr;
    rows(x, varlen, &p.x_stride_b, &p.x_stride_t, &p.x_stride_d);
    p.conv_state = st->ptr;
    p.state_stride_s = st->strides[0], p.state_stride_l = st->strides[1], p.state_stride_d = st->strides[2];
    p.weight = w->ptr;
    p.weight_stride_d = w->strides[0], p.weight_stride_w = w->strides[1];
    p.is_weight_packed = packed;
    if (has_bias) p.bias = b->ptr, p.bias_stride = b->strides[0];
    if (has_idx && (B == 1 || v[INDICES].strides[0] == 1)) {
        p.conv_state_indices = (const int32_t *)v[INDICES].ptr;
    } else if (has_idx) {
        for (int64_t i = 0; i < B; i++) column[i] = ((const int32_t *)v[INDICES].ptr)[i * v[INDICES].strides[0]];
        p.conv_state_indices = column;
    }
    if (has_nat) p.num_accepted_tokens = (const int32_t *)v[ACCEPTED].ptr;
    if (varlen) p.query_start_loc = (const int32_t *)qsl->ptr;
    if (gdn_update_validate(&p, varlen ? x->shape[0] : 0, &bad_i, &bad_v) != GDN_OK) return 0;
    if (into) {
        p.out = out->ptr;
        rows(out, varlen, &p.out_stride_b, &p.out_stride_t, &p.out_stride_d);
    } else {
        /* torch.empty_like(x) where x is dense in gdnconv's order (its strides), else a
         * contiguous tensor of x's shape: as the Cython layer's _new_like, in x's own
         * (tensor) order; large outs go to the caller's path, which reuses memory */
        int64_t size[3], stride[3], n = x->itemsize;
        tview xt = *x;
        if (xt.ndim == 3 && vllm_x) swap12(&xt);
        const int dense = c_contiguous(x);
        for (int i = xt.ndim - 1; i >= 0; i--) {
            size[i] = xt.shape[i];
            stride[i] = dense ? xt.strides[i] : n / x->itemsize;
            n *= xt.shape[i];
        }
        if (n >= GDN_REUSE_MIN_BYTES ||
            api.empty_strided(xt.ndim, size, stride, dt == GDN_F32 ? f32 : dt == GDN_F16 ? f16 : bf16, cpu, 0,
                              new_out))
            return 0;
        if (!take(*new_out, &made)) {
            api.delete_tensor(*new_out);
            *new_out = NULL;
            return 0;
        }
        if (made.ndim == 3 && vllm_x) swap12(&made);
        if (made.strides[made.ndim - 1] != 1) {   /* (a non-dense x's channels: the caller copies it) */
            api.delete_tensor(*new_out);
            *new_out = NULL;
            return 0;
        }
        p.out = made.ptr;
        rows(&made, varlen, &p.out_stride_b, &p.out_stride_t, &p.out_stride_d);
    }
    gdn_update_run(&p, thread_request);
    return 1;
}

static void release(StableIValue *s, int n) {
    for (int i = 0; i < n; i++) api.delete_tensor((AtenTensorHandle)(uintptr_t)s[i]);   /* (the inputs are ours) */
}

/* update_new(...) -> Tensor: the new out, or an undefined tensor (None) when refused */
static void update_new(StableIValue *s, uint64_t num_args, uint64_t num_outputs) {
    AtenTensorHandle out = NULL;
    (void)num_args, (void)num_outputs;
    update(s, 0, &out);
    release(s, 7);
    if (out == NULL && api.undefined_tensor(&out)) out = NULL;
    s[0] = (StableIValue)(uintptr_t)out;
}

/* update_into(..., out, ...) -> int: 1 when out (and conv_state) were written, 0 when refused */
static void update_into(StableIValue *s, uint64_t num_args, uint64_t num_outputs) {
    AtenTensorHandle unused;
    (void)num_args, (void)num_outputs;
    const int done = update(s, 1, &unused);
    release(s, 8);
    s[0] = (StableIValue)(int64_t)done;
}

/* ---- the same call without the dispatcher ----
 * From Python, a call through torch.ops spends ~2.5 us outside the kernel (the schema's
 * argument parsing, the dispatcher's boxed call, a handle made and freed per tensor). A
 * torch.Tensor's Python object holds its at::Tensor, which is what an AtenTensorHandle
 * points to, at a fixed place: gdn_torch_direct_init finds that place by wrapping a
 * tensor of its own (THPVariable_Wrap, looked up in libtorch_python) and comparing, and
 * only where it is found are the calls below made. They run update() on handles into
 * the caller's Python objects, which the caller holds for the call. */
typedef void *(*gdn_wrap_fn)(const void *tensor);   /* THPVariable_Wrap(const at::TensorBase &) */
static gdn_wrap_fn wrap;
static size_t tensor_at;                             /* 0: not found, no direct calls */

int gdn_torch_direct_init(const char *libtorch_python_path, size_t header, void **probe) {
    AtenTensorHandle t = NULL;
    int64_t one = 1;
    *probe = NULL;
#ifdef GDN_HAVE_DLOPEN
    if (!registered || tensor_at) return tensor_at ? 0 : -1;
    void *lib = dlopen(libtorch_python_path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) return -1;
    *(void **)&wrap = dlsym(lib, "_Z16THPVariable_WrapRKN2at10TensorBaseE");
    dlclose(lib);
    if (wrap == NULL || api.empty_strided(1, &one, &one, f32, cpu, 0, &t)) return -2;
    /* a new Python object for t: its at::Tensor holds t's TensorImpl (the one pointer an
     * at::Tensor is), right after PyObject_HEAD in torch 2.13's THPVariable; compared by
     * value, nothing read through it, so a torch laid out otherwise gets no direct calls */
    *probe = wrap(t);
    if (*probe != NULL && *(void *const *)((const char *)*probe + header) == *(void *const *)t) tensor_at = header;
    api.delete_tensor(t);
    return tensor_at ? 0 : -3;
#else
    (void)libtorch_python_path, (void)header, (void)one, (void)t;
    return -1;
#endif
}

int gdn_torch_direct(void *const objs[8], int into, int64_t flags, int64_t pad, void **new_out) {
    StableIValue s[10];
    const int n = into ? 8 : 7;
    if (!tensor_at) return 0;
    for (int i = 0; i < n; i++) s[i] = (StableIValue)(uintptr_t)((char *)objs[i] + tensor_at);
    s[n] = (StableIValue)flags, s[n + 1] = (StableIValue)pad;
    return update(s, into, (AtenTensorHandle *)new_out);
}

void *gdn_torch_wrap(void *tensor) {
    void *obj = wrap(tensor);
    api.delete_tensor((AtenTensorHandle)tensor);
    return obj;
}

#define GDN_OP_ARGS "Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor bias, Tensor num_accepted_tokens, " \
                    "Tensor conv_state_indices, Tensor query_start_loc"

int gdn_torch_op_init(const char *libtorch_path) {
#ifdef GDN_HAVE_DLOPEN
    static TorchLibraryHandle def, impl;    /* kept for the process: the registrations live as long */
    if (registered) return 0;
    void *lib = dlopen(libtorch_path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) return -1;
#define SYM(field, name) (*(void **)&api.field = dlsym(lib, name))
    SYM(data_ptr, "aoti_torch_get_data_ptr");
    SYM(dim, "aoti_torch_get_dim");
    SYM(sizes, "aoti_torch_get_sizes");
    SYM(strides, "aoti_torch_get_strides");
    SYM(dtype, "aoti_torch_get_dtype");
    SYM(device_type, "aoti_torch_get_device_type");
    SYM(layout, "aoti_torch_get_layout");
    SYM(storage_offset, "aoti_torch_get_storage_offset");
    SYM(storage_size, "aoti_torch_get_storage_size");
    SYM(empty_strided, "aoti_torch_empty_strided");
    SYM(undefined_tensor, "aoti_torch_new_uninitialized_tensor");
    SYM(delete_tensor, "aoti_torch_delete_tensor_object");
    SYM(device_cpu, "aoti_torch_device_type_cpu");
    SYM(layout_strided, "aoti_torch_layout_strided");
    SYM(dtype_f32, "aoti_torch_dtype_float32");
    SYM(dtype_f16, "aoti_torch_dtype_float16");
    SYM(dtype_bf16, "aoti_torch_dtype_bfloat16");
    SYM(dtype_i32, "aoti_torch_dtype_int32");
    SYM(library_init_def, "aoti_torch_library_init_def");
    SYM(library_init_impl, "aoti_torch_library_init_impl");
    SYM(library_def, "aoti_torch_library_def");
    SYM(library_impl, "aoti_torch_library_impl");
    SYM(library_impl_v, "torch_library_impl");
#undef SYM
    dlclose(lib);   /* (NOLOAD took a reference; torch holds its own) */
    if (!api.data_ptr || !api.dim || !api.sizes || !api.strides || !api.dtype || !api.device_type ||
        !api.layout || !api.layout_strided || !api.storage_offset || !api.storage_size || !api.empty_strided || !api.undefined_tensor ||
        !api.delete_tensor || !api.device_cpu || !api.dtype_f32 || !api.dtype_f16 || !api.dtype_bf16 ||
        !api.dtype_i32 || !api.library_init_def || !api.library_init_impl || !api.library_def ||
        (!api.library_impl && !api.library_impl_v))
        return -2;
    cpu = api.device_cpu(), strided = api.layout_strided();
    f32 = api.dtype_f32(), f16 = api.dtype_f16(), bf16 = api.dtype_bf16(), i32 = api.dtype_i32();
    /* the boxed convention of torch 2.10's stable ABI (its StableIValue forms of Tensor and int) */
    const uint64_t abi = (2ull << 56) | (10ull << 48);
#define IMPL(name, fn) (api.library_impl_v ? api.library_impl_v(impl, name, fn, abi) : api.library_impl(impl, name, fn))
    if (api.library_init_def("_gdnconv", __FILE__, __LINE__, &def) ||
        api.library_def(def, "update_new(" GDN_OP_ARGS ", int flags, int pad_slot_id) -> Tensor") ||
        api.library_def(def, "update_into(" GDN_OP_ARGS ", Tensor(b!) out, int flags, int pad_slot_id) -> int") ||
        api.library_init_impl("_gdnconv", "CPU", __FILE__, __LINE__, &impl) ||
        IMPL("update_new", update_new) || IMPL("update_into", update_into))
        return -3;
#undef IMPL
    registered = 1;
    return 0;
#else
    (void)libtorch_path;
    return -1;
#endif
}
