# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython layer over the C kernels.

Design:
- Arrays are read as (pointer, shape, byte strides, dtype code) through the NumPy C
  API, or for torch tensors through one ``torch.utils.dlpack.to_dlpack`` export
  (``data_ptr()``/``stride()`` where torch refuses it, as for a tensor that
  requires grad): NumPy cannot export ml_dtypes.bfloat16 through the buffer
  protocol and torch has none, so typed memoryviews are not used. torch is never
  imported here; a tensor is recognised only when the caller has imported torch
  already.
- Every check of the error list runs before ``gdn_run``; the index arrays are
  checked in C (``gdn_validate``) in one pass. Nothing is written before that.
- Lifetimes: every argument conversion that can run user code (``__array__``,
  ``__len__``, torch methods) runs before the first pointer is taken, and every
  buffer the kernel touches (arguments, copies, the weight scratch) is held by the
  call (``_Call.keep``) until ``gdn_run`` returns; a tensor through its storage.
- ``conv_state`` and ``out`` are never copied. ``x`` is copied only when its
  channels are not contiguous and ``out`` is not ``x`` (so the SIMD path applies).
  A read-only input whose overlap with a written array NumPy cannot decide within a
  bounded search (``_shares``) is copied; two such written arrays are refused.
- The GIL is released around ``gdn_run``; threads start only inside it. A forked
  child runs every call on its calling thread (``gdn_fork_guard_init``).
- A call with several requests lends ``gdn_run`` a float32 scratch kept per Python
  thread (``_weight_scratch``), where its threads convert the weights once.
"""
import os
import sys
import threading

import numpy as np

cimport numpy as cnp
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t, uintptr_t

cnp.import_array()

cdef extern from "numpy/ndarraytypes.h":
    enum:
        NPY_USERDEF

cdef extern from *:
    """
    /* DLPack's DLTensor (dlpack.h; this layout is stable since DLPack 0.2): the head
     * of the DLManagedTensor that a "dltensor" capsule holds. */
    typedef struct { int32_t device_type; int32_t device_id; } gdn_dl_device;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } gdn_dl_dtype;
    typedef struct {
        void *data; gdn_dl_device device; int32_t ndim; gdn_dl_dtype dtype;
        int64_t *shape; int64_t *strides; uint64_t byte_offset;
    } gdn_dl_tensor;
    """
    ctypedef struct gdn_dl_device:
        int32_t device_type
    ctypedef struct gdn_dl_dtype:
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct gdn_dl_tensor:
        void *data
        gdn_dl_device device
        int32_t ndim
        gdn_dl_dtype dtype
        int64_t *shape
        int64_t *strides
        uint64_t byte_offset

cdef enum:
    DL_INT = 0       # DLPack type codes and device
    DL_FLOAT = 2
    DL_BFLOAT = 4
    DL_CPU = 1

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
    ctypedef struct gdn_params:
        int64_t batch, dim, width, state_len, num_slots, seqlen, pad_slot_id
        int dtype, weight_dtype, silu, zero_skipped
        const void *x
        int64_t x_stride_b, x_stride_t, x_stride_d
        void *out
        int64_t out_stride_b, out_stride_t, out_stride_d
        void *conv_state
        int64_t state_stride_s, state_stride_l, state_stride_d
        const void *weight
        int64_t weight_stride_d, weight_stride_w
        const void *bias
        int64_t bias_stride
        const int32_t *conv_state_indices
        const int32_t *num_accepted_tokens
        const int32_t *query_start_loc
        float *weight_scratch
    ctypedef struct gdn_cpu_features:
        int sse2, avx, avx2, fma, f16c
        int avx512f, avx512bw, avx512vl, avx512dq, avx512_bf16, avx512_fp16
        int amx_tile, amx_bf16, amx_int8
        int os_avx, os_avx512, os_amx
    const gdn_cpu_features *gdn_get_cpu_features()
    int gdn_isa_count()
    const char *gdn_isa_name(int i)
    int gdn_isa_supported(int i)
    int gdn_select_isa(const char *name)
    const char *gdn_active_isa()
    int gdn_validate(const gdn_params *p, int64_t num_tokens, int64_t *bad_index,
                     int64_t *bad_value)
    int64_t gdn_bytes_moved(const gdn_params *p)
    int64_t gdn_set_parallel_min_bytes(int64_t bytes)
    void gdn_fork_guard_init()
    int gdn_num_procs()
    int64_t gdn_weight_scratch_floats(const gdn_params *p, int num_threads)
    void gdn_run(const gdn_params *p, int num_threads)


# ---------------------------------------------------------------- array views

cdef enum:
    KIND_OTHER = -1      # dtype code for anything that is not fp32/fp16/bf16

cdef struct View:
    char *ptr
    int ndim
    int64_t shape[3]
    int64_t strides[3]   # in elements
    int dtype            # GDN_F32 / GDN_F16 / GDN_BF16 / KIND_OTHER
    int itemsize
    bint writeable
    bint torch

cdef int _bf16_typenum = -1
cdef object _torch = None          # the torch module, once it has been imported
cdef object _tensor_type = None    # torch.Tensor
cdef dict _torch_dtypes = {}       # torch dtype -> gdn dtype code
cdef object _to_dlpack = None      # torch.utils.dlpack.to_dlpack


cdef inline bint _is_tensor(object a):
    """NumPy arrays and None answer without a lookup, and torch.Tensor is looked up
    once: per argument, sys.modules (torch not imported) or torch.Tensor cost a D=64
    call with out= 0.93 -> 0.66 us from NumPy (1.10 -> 0.65 with torch imported) and
    2.95 -> 2.69 us from torch tensors."""
    global _torch, _tensor_type, _to_dlpack
    if a is None or cnp.PyArray_Check(a):
        return False
    if _tensor_type is None:
        mod = sys.modules.get("torch")
        if mod is None:
            return False
        _torch = mod
        _torch_dtypes.update({mod.float32: GDN_F32, mod.float16: GDN_F16, mod.bfloat16: GDN_BF16})
        _to_dlpack = getattr(getattr(getattr(mod, "utils", None), "dlpack", None), "to_dlpack", None)
        _tensor_type = mod.Tensor
    return isinstance(a, _tensor_type)


cdef object _dl_export(object a, gdn_dl_tensor **t):
    """A CPU tensor's DLPack capsule, *t pointing into it (valid while the capsule
    lives), read with one call where attributes take six (a call with six tensor
    arguments measured 3.90 -> 3.38 us);
    None where torch refuses the export (a tensor that requires grad), gives another
    kind of capsule, or the tensor is not on the CPU: the attributes decide then."""
    if _to_dlpack is None:
        return None
    try:
        cap = _to_dlpack(a)
    except Exception:
        return None
    if not PyCapsule_IsValid(cap, "dltensor"):
        return None
    t[0] = <gdn_dl_tensor *>PyCapsule_GetPointer(cap, "dltensor")
    if t[0].device.device_type != DL_CPU or t[0].dtype.lanes != 1:
        return None
    return cap


cdef int _numpy_dtype_code(cnp.ndarray a):
    global _bf16_typenum
    cdef int num = cnp.PyArray_TYPE(a)
    if num == cnp.NPY_FLOAT32:
        return GDN_F32
    if num == cnp.NPY_FLOAT16:
        return GDN_F16
    if num == _bf16_typenum:
        return GDN_BF16
    if num >= NPY_USERDEF and a.dtype.name == "bfloat16" and a.dtype.itemsize == 2:
        _bf16_typenum = num
        return GDN_BF16
    return KIND_OTHER


cdef str _layout_name(object a):
    return "nested" if getattr(a, "is_nested", False) else str(a.layout).replace("torch.", "")


cdef str _dtype_name(object a):
    if _is_tensor(a):
        return str(a.dtype).replace("torch.", "")
    return str(a.dtype)


cdef object _view(object a, View *v, str name):
    """Fill v from a NumPy array or a torch CPU tensor (no copy). Returns the object
    that keeps the memory at v.ptr alive, which the call holds until the kernel has
    returned: the array, or the tensor's storage (see _storage)."""
    cdef cnp.ndarray arr
    cdef int i
    cdef int64_t size
    cdef gdn_dl_tensor *t
    if cnp.PyArray_Check(a):
        arr = <cnp.ndarray>a
        if not cnp.PyArray_ISNOTSWAPPED(arr):
            raise ValueError(f"{name} has non-native byte order (dtype {a.dtype.str}): "
                             f"use {name}.astype({name}.dtype.newbyteorder('='))")
        v.ndim = cnp.PyArray_NDIM(arr)
        if v.ndim > 3:
            raise ValueError(f"{name} must have at most 3 dimensions, got shape {tuple(a.shape)}")
        v.ptr = <char *>cnp.PyArray_DATA(arr)
        v.itemsize = <int>cnp.PyArray_ITEMSIZE(arr)
        v.dtype = _numpy_dtype_code(arr)
        v.writeable = cnp.PyArray_ISWRITEABLE(arr)
        v.torch = False
        owner = a
        for i in range(v.ndim):
            v.shape[i] = cnp.PyArray_DIMS(arr)[i]
            if cnp.PyArray_STRIDES(arr)[i] % v.itemsize:
                raise ValueError(f"{name} has strides {a.strides} that are not multiples of "
                                 f"its item size {v.itemsize}")
            v.strides[i] = cnp.PyArray_STRIDES(arr)[i] // v.itemsize
    elif _is_tensor(a):
        owner = _storage(a)
        cap = _dl_export(a, &t)
        if cap is not None and t.ndim <= 3:
            v.ndim = t.ndim
            v.ptr = <char *>t.data + t.byte_offset
            v.itemsize = t.dtype.bits // 8 if t.dtype.bits >= 8 else 1
            v.dtype = (GDN_BF16 if t.dtype.code == DL_BFLOAT and t.dtype.bits == 16 else
                       (GDN_F32 if t.dtype.bits == 32 else GDN_F16 if t.dtype.bits == 16 else KIND_OTHER)
                       if t.dtype.code == DL_FLOAT else KIND_OTHER)
            size = 1
            for i in range(v.ndim - 1, -1, -1):
                v.shape[i] = t.shape[i]
                v.strides[i] = t.strides[i] if t.strides != NULL else size
                size *= t.shape[i]
        else:
            if not a.is_cpu:
                raise ValueError(f"{name} must be a CPU tensor, got device {a.device}")
            if a.layout is not _torch.strided or getattr(a, "is_nested", False):
                raise TypeError(f"{name} must be a dense tensor, got a {_layout_name(a)} tensor")
            owner = a.detach()   # (its own handle on the storage)
            shape = owner.shape
            v.ndim = len(shape)
            if v.ndim > 3:
                raise ValueError(f"{name} must have at most 3 dimensions, got shape {tuple(shape)}")
            v.ptr = <char *><uintptr_t>owner.data_ptr()
            v.dtype = _torch_dtypes.get(owner.dtype, KIND_OTHER)
            v.itemsize = 4 if v.dtype == GDN_F32 else 2 if v.dtype != KIND_OTHER else owner.element_size()
            strides = owner.stride()
            for i in range(v.ndim):
                v.shape[i] = shape[i]
                v.strides[i] = strides[i]
        if a.is_neg():  # (the conjugate bit exists only for complex dtypes, refused later)
            raise ValueError(f"{name} has a pending negation bit; call .resolve_neg() first")
        v.writeable = True
        v.torch = True
    else:
        raise TypeError(f"{name} must be a numpy.ndarray or a torch.Tensor, got {type(a).__name__}")
    size = 1
    for i in range(v.ndim):
        size *= v.shape[i]
    if size and v.ptr == NULL:
        raise ValueError(f"{name} has {size} elements but no memory (a zero or fake tensor?): "
                         f"pass a materialised tensor such as {name}.clone()")
    if size and (<uintptr_t>v.ptr) % v.itemsize:
        raise ValueError(f"{name} data is not aligned to its item size {v.itemsize}")
    return owner


cdef object _native(object a):
    """An input in native byte order (a copy only when it was byte-swapped)."""
    if cnp.PyArray_Check(a) and not cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a):
        return a.astype(a.dtype.newbyteorder("="))
    return a


cdef int _refuse_self_overlap(const View *v, str name) except -1:
    """A written array must give every element its own memory. Checked by sorting
    the dimensions by stride: each stride must step over everything inside it.
    (A few exotic interleaved layouts without overlap are refused too.)"""
    cdef int i, j
    cdef int order[3]
    cdef int64_t span = 1, st
    for i in range(v.ndim):
        if v.shape[i] == 0:
            return 0       # no element, no overlap (NumPy gives empty arrays zero strides)
    n = 0
    for i in range(v.ndim):
        if v.shape[i] > 1:
            order[n] = i
            n += 1
    for i in range(1, n):  # insertion sort by |stride|
        j = i
        while j > 0 and abs(v.strides[order[j - 1]]) > abs(v.strides[order[j]]):
            order[j - 1], order[j] = order[j], order[j - 1]
            j -= 1
    for i in range(n):
        st = abs(v.strides[order[i]])
        if st < span:
            raise ValueError(f"{name} overlaps itself (shape {tuple(v.shape[k] for k in range(v.ndim))}, "
                             f"strides {tuple(v.strides[k] for k in range(v.ndim))} in elements): "
                             f"every element it holds must have its own memory")
        span = st * v.shape[order[i]]
    return 0


cdef inline void _extent(const View *v, uintptr_t *lo, uintptr_t *hi):
    """Byte range [lo, hi) that v may touch; lo == hi when v is empty."""
    cdef int i
    cdef int64_t low = 0, high = 0
    for i in range(v.ndim):
        if v.shape[i] == 0:
            lo[0] = hi[0] = 0
            return
        if v.strides[i] < 0:
            low += (v.shape[i] - 1) * v.strides[i]
        else:
            high += (v.shape[i] - 1) * v.strides[i]
    lo[0] = <uintptr_t>(v.ptr + low * v.itemsize)
    hi[0] = <uintptr_t>(v.ptr + (high + 1) * v.itemsize)


class _RawArray:
    """A NumPy view of raw memory, for the exact overlap test."""
    def __init__(self, ptr, shape, strides, itemsize):
        self.__array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": f"<u{itemsize}",
                                    "strides": tuple(s * itemsize for s in strides), "version": 3}


cdef object _raw(const View *v):
    return np.asarray(_RawArray(<uintptr_t>v.ptr, tuple(v.shape[i] for i in range(v.ndim)),
                                tuple(v.strides[i] for i in range(v.ndim)), v.itemsize))


cdef int64_t _size(const View *v):
    cdef int64_t n = 1
    cdef int i
    for i in range(v.ndim):
        n *= v.shape[i]
    return n


_TooHardError = getattr(np, "exceptions", np).TooHardError


cdef int _shares(const View *a, const View *b) except -2:
    """1: a and b share memory; 0: they do not; -1: NumPy could not tell within
    16 + (elements of both) / 256 steps of its exact search. A step measured ~0.25 us,
    so the bound is ~1 ns per element, a small multiple of the time a call takes to
    move one; without it, interleaved strided views can take minutes. Legal layouts
    (halves or alternate channels of one buffer, rows of a fused cache) take 1 step."""
    cdef uintptr_t alo, ahi, blo, bhi
    _extent(a, &alo, &ahi)
    _extent(b, &blo, &bhi)
    if alo == ahi or blo == bhi or ahi <= blo or bhi <= alo:
        return 0
    # extents overlap: interleaved views (two slices of one fused buffer) may still be disjoint
    try:
        return np.shares_memory(_raw(a), _raw(b), max_work=16 + (_size(a) + _size(b)) // 256)
    except _TooHardError:
        return -1


cdef int _refuse_shared(const View *a, str name, const View *b, str bname) except -1:
    """Two written arrays must not share memory; an undecided pair is refused too."""
    cdef int shared = _shares(a, b)
    if shared == 1:
        raise ValueError(f"{name} overlaps {bname}")
    if shared == -1:
        raise ValueError(f"{name} may overlap {bname}: their strides interleave in a way NumPy could "
                         f"not check within a bounded time; pass {name} and {bname} as separate "
                         f"allocations, or as slices of one buffer along a single axis")
    return 0


cdef int _read_apart(_Call c, View *r, str name, const View *w, str wname, str detail="") except -1:
    """A read-only argument must not share memory with an array the call writes: raises
    when it does. When NumPy cannot tell (see _shares), r is pointed at a private copy
    of its elements, which the call keeps."""
    cdef int shared = _shares(r, w)
    if shared == 1:
        raise ValueError(f"{name} overlaps {wname}{detail}")
    if shared == 0:
        return 0
    copy = np.array(_raw(r), order="C")
    c.keep.append(copy)
    r.ptr = <char *>cnp.PyArray_DATA(<cnp.ndarray>copy)
    cdef int64_t stride = 1
    cdef int i
    for i in range(r.ndim - 1, -1, -1):
        r.strides[i] = stride
        stride *= r.shape[i]
    return 0


cdef bint _same_shape(const View *a, const View *b):
    cdef int i
    if a.ndim != b.ndim:
        return False
    for i in range(a.ndim):
        if a.shape[i] != b.shape[i]:
            return False
    return True


cdef bint _same_view(const View *a, const View *b):
    cdef int i
    if a.ptr != b.ptr or not _same_shape(a, b):
        return False
    for i in range(a.ndim):
        if a.shape[i] > 1 and a.strides[i] != b.strides[i]:
            return False
    return True


cdef object _int32_view(object owner, char *ptr, int64_t n, View *v):
    """v = the (n,) contiguous int32 array at ptr; returns its owner."""
    v.ptr = ptr
    v.ndim = 1
    v.shape[0] = n
    v.strides[0] = 1
    v.itemsize = 4
    return owner


cdef object _storage(object a):
    """What keeps a tensor's memory alive while the call runs, taken before its pointer:
    its storage. A DLPack capsule would not: it shares the tensor's TensorImpl, so a
    ``.set_()`` in code that runs later in the call (a subclass's or mode's
    ``__torch_function__``) frees the memory under it. (A detached alias where the
    storage cannot be had, as for tensors without memory, refused later.)"""
    try:
        return a.untyped_storage()
    except Exception:
        return a.detach()


cdef object _index_source(object a, str name, list keep):
    """An index argument as _index_array reads it without running any user code: None,
    a NumPy array, or the DLPack capsule of a 1-D int32 unit-stride CPU tensor (read in
    place: .numpy() costs ~0.7 us; its storage goes to keep). Everything that can run
    user code (``__array__``, ``__len__``, torch methods) happens here, before the call
    takes any pointer."""
    cdef gdn_dl_tensor *t
    cdef uintptr_t ptr
    if a is None or cnp.PyArray_Check(a):
        return a
    if not _is_tensor(a):
        return np.asarray(a)
    if a.is_neg():   # torch's values are the negated memory
        a = a.resolve_neg()
    store = _storage(a)
    cap = _dl_export(a, &t)
    if (cap is not None and t.ndim == 1 and t.dtype.code == DL_INT and t.dtype.bits == 32 and
            (t.shape[0] <= 1 or t.strides == NULL or t.strides[0] == 1)):
        ptr = <uintptr_t>t.data + t.byte_offset
        if ptr % 4 == 0 and (ptr != 0 or t.shape[0] == 0):
            keep.append(store)
            return cap
    if not a.is_cpu:
        raise ValueError(f"{name} must be a CPU tensor, got device {a.device}")
    if a.layout is not _torch.strided or getattr(a, "is_nested", False):
        raise TypeError(f"{name} must be a dense integer tensor (int32), got a {_layout_name(a)} tensor")
    if a.dtype.is_floating_point or a.dtype.is_complex or a.dtype is _torch.bool:
        raise TypeError(f"{name} must be an integer array (int32), got dtype {_dtype_name(a)}")
    # a copy: an array sharing the tensor's memory would not keep it alive
    # (force: a zero tensor has no memory to share)
    return np.array(a.numpy(force=True))


cdef int64_t _index_len(object src, str name) except -1:
    """Entries of a 1-D index source (see _index_source)."""
    if not cnp.PyArray_Check(src):
        return (<gdn_dl_tensor *>PyCapsule_GetPointer(src, "dltensor")).shape[0]
    if cnp.PyArray_NDIM(<cnp.ndarray>src) != 1:
        raise ValueError(f"{name} must be 1-D (B + 1,), got shape {src.shape}")
    return cnp.PyArray_DIMS(<cnp.ndarray>src)[0]


cdef object _index_array(object src, str name, int64_t n, View *v):
    """(n,) int32 view of an index source (see _index_source); returns the object that
    owns the memory (the capsule, the source array or its int32 copy)."""
    cdef gdn_dl_tensor *t
    if not cnp.PyArray_Check(src):
        t = <gdn_dl_tensor *>PyCapsule_GetPointer(src, "dltensor")
        if t.shape[0] != n:
            raise ValueError(f"{name} must have shape ({n},), got ({t.shape[0]},)")
        return _int32_view(src, <char *>t.data + t.byte_offset, n, v)
    a = src
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if cnp.PyArray_NDIM(arr) != 1 or cnp.PyArray_DIMS(arr)[0] != n:
        raise ValueError(f"{name} must have shape ({n},), got {a.shape}")
    if not (cnp.PyArray_ISINTEGER(arr) and not cnp.PyArray_ISBOOL(arr)):
        raise TypeError(f"{name} must be an integer array (int32), got dtype {a.dtype}")
    if cnp.PyArray_TYPE(arr) != cnp.NPY_INT32 or not cnp.PyArray_ISCARRAY_RO(arr):
        if n and (a.min() < -2**31 or a.max() >= 2**31):
            raise ValueError(f"{name} has values outside the int32 range: min {a.min()}, max {a.max()}")
        arr = np.ascontiguousarray(a, dtype=np.int32)
    return _int32_view(arr, <char *>cnp.PyArray_DATA(arr), n, v)


# ------------------------------------------------------------- thread setting

def _affinity_count():
    """CPUs this process may use. The OpenMP runtime's count where the build has one:
    with OMP_PROC_BIND set, libgomp pins the calling thread to one CPU, and that
    thread's own mask (sched_getaffinity) would then say 1."""
    n = gdn_num_procs()
    if n > 0:
        return n
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _default_num_threads():
    n = _affinity_count()
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        return min(int(env), n)
    return n


cdef int _num_threads = _default_num_threads()


gdn_fork_guard_init()   # a forked child runs every call on its calling thread (see dispatch.c)


cdef int _check_threads(object n, str name) except -1:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {n!r}")
    return min(int(n), _affinity_count())


def set_num_threads(n):
    """Set how many threads later calls may use (at most the process's CPU affinity);
    ``None`` restores the default.

    The default follows ``OMP_NUM_THREADS`` when set, else the CPUs this process may
    run on. Small calls always run on the calling thread. Raises ValueError for
    anything but a positive integer or None.
    """
    global _num_threads
    _num_threads = _default_num_threads() if n is None else _check_threads(n, "n")


def _set_parallel_min_bytes(nbytes):
    """Calls moving fewer bytes run on the calling thread (benchmarks only); returns the
    previous value."""
    return gdn_set_parallel_min_bytes(int(nbytes))


def get_num_threads():
    """Threads a call may use: the ``set_num_threads`` value, else the default."""
    return _num_threads


# ------------------------------------------------------------------------ ISA

def cpu_features():
    """Dict of the x86 features gdnconv detects (cpuid + xgetbv); all False elsewhere.

    ``os_avx``/``os_avx512``/``os_amx`` say whether the OS saves that register state
    (XCR0), without which the instructions cannot be used.
    """
    cdef const gdn_cpu_features *f = gdn_get_cpu_features()
    return {"sse2": bool(f.sse2), "avx": bool(f.avx), "avx2": bool(f.avx2), "fma": bool(f.fma),
            "f16c": bool(f.f16c), "avx512f": bool(f.avx512f), "avx512bw": bool(f.avx512bw),
            "avx512vl": bool(f.avx512vl), "avx512dq": bool(f.avx512dq),
            "avx512_bf16": bool(f.avx512_bf16), "avx512_fp16": bool(f.avx512_fp16),
            "amx_tile": bool(f.amx_tile), "amx_bf16": bool(f.amx_bf16), "amx_int8": bool(f.amx_int8),
            "os_avx": bool(f.os_avx), "os_avx512": bool(f.os_avx512), "os_amx": bool(f.os_amx)}


def compiled_isas():
    """Kernel names compiled into this build, best first (``scalar`` is always last)."""
    return [gdn_isa_name(i).decode() for i in range(gdn_isa_count())]


def available_isas():
    """Kernel names this build has and this CPU supports, best first."""
    return [gdn_isa_name(i).decode() for i in range(gdn_isa_count()) if gdn_isa_supported(i)]


def active_isa():
    """Name of the kernel calls use now (``GDNCONV_ISA`` or the best available)."""
    return gdn_active_isa().decode()


def set_isa(name=None):
    """Use kernel ``name`` (None or "": the best available) for later calls; returns the previous name.

    Raises ValueError when ``name`` is unknown or this CPU (or build) lacks it.
    """
    previous = active_isa()
    rc = gdn_select_isa(NULL) if name is None or name == "" else gdn_select_isa(str(name).encode())
    if rc == -1:
        raise ValueError(f"unknown ISA {name!r}: this build knows {compiled_isas()}")
    if rc == -2:
        raise ValueError(f"ISA {name!r} is not supported by this CPU: available are {available_isas()}")
    return previous


# ------------------------------------------------------------------- the call

cdef int _dtype_of(const View *v, object a, str name) except -1:
    if v.dtype == KIND_OTHER:
        raise TypeError(f"{name} has unsupported dtype {_dtype_name(a)}: use float32, float16 or "
                        f"bfloat16 (ml_dtypes.bfloat16 for NumPy)")
    return v.dtype


cdef bint _c_contiguous(const View *v):
    cdef int64_t expect = 1
    cdef int i
    for i in range(v.ndim - 1, -1, -1):
        if v.shape[i] != 1 and v.strides[i] != expect:
            return False
        expect *= v.shape[i]
    return True


cdef object _new_like(object x, const View *xv):
    """A C-contiguous array or tensor of x's shape and dtype (uninitialised)."""
    cdef cnp.npy_intp dims[3]
    cdef int i
    if xv.torch:   # empty_like keeps x's strides: ~0.9 us cheaper than empty(shape)
        return _torch.empty_like(x) if _c_contiguous(xv) else _torch.empty(tuple(x.shape), dtype=x.dtype)
    for i in range(xv.ndim):
        dims[i] = xv.shape[i]
    return cnp.PyArray_EMPTY(xv.ndim, dims, cnp.PyArray_TYPE(<cnp.ndarray>x), 0)


cdef class _Call:
    """One call's arguments as the kernel sees them (views, params, owners)."""
    cdef gdn_params p
    cdef View xv, sv, wv, bv, ov, iv, nv, qv
    cdef list keep
    cdef bint out_is_x

    def __cinit__(self):
        self.keep = []


cdef int _prepare(_Call c, x, conv_state, weight, bias, activation, num_accepted_tokens,
                  conv_state_indices, query_start_loc, pad_slot_id, out) except -1:
    """Every check of a call, then its params; nothing is written. x, weight and bias
    must already be in native byte order (see _native). Arguments are converted (which
    can run user code) before any pointer is taken, and every pointer comes from an
    object c.keep holds."""
    cdef int64_t B, T, N = 0, D, W, L, S, pad, bad_i = 0, bad_v = 0
    cdef int dt, wdt, rc
    cdef bint out_is_x = False

    if activation is None or activation is False:
        c.p.silu = 0
    elif activation is True or activation == "silu" or activation == "swish":
        c.p.silu = 1
    else:
        raise ValueError(f"activation must be None, 'silu' or 'swish' (or a bool, as vLLM takes), "
                         f"got {activation!r}")
    if isinstance(pad_slot_id, bool) or not isinstance(pad_slot_id, (int, np.integer)):
        raise TypeError(f"pad_slot_id must be an integer, got {pad_slot_id!r}")
    if not -2**63 <= pad_slot_id < 2**63:
        raise ValueError(f"pad_slot_id = {pad_slot_id} is outside the int64 range")
    pad = int(pad_slot_id)
    keep = c.keep
    query_start_loc = _index_source(query_start_loc, "query_start_loc", keep)
    conv_state_indices = _index_source(conv_state_indices, "conv_state_indices", keep)
    num_accepted_tokens = _index_source(num_accepted_tokens, "num_accepted_tokens", keep)

    # ---- arrays and dtypes
    keep.append(_view(x, &c.xv, "x"))
    keep.append(_view(conv_state, &c.sv, "conv_state"))
    keep.append(_view(weight, &c.wv, "weight"))
    dt = _dtype_of(&c.xv, x, "x")
    if _dtype_of(&c.sv, conv_state, "conv_state") != dt:
        raise TypeError(f"conv_state dtype {_dtype_name(conv_state)} does not match x dtype {_dtype_name(x)}")
    wdt = _dtype_of(&c.wv, weight, "weight")
    if wdt != dt and wdt != GDN_F32:
        raise TypeError(f"weight dtype {_dtype_name(weight)} does not match x dtype {_dtype_name(x)} "
                        f"(float32 weights are also accepted)")
    if bias is not None:
        keep.append(_view(bias, &c.bv, "bias"))
        if _dtype_of(&c.bv, bias, "bias") != wdt:
            raise TypeError(f"bias dtype {_dtype_name(bias)} does not match weight dtype {_dtype_name(weight)}"
                            f" (with float32 or packed weights, pass a float32 bias)")
    if out is not None:
        keep.append(_view(out, &c.ov, "out"))
        if _dtype_of(&c.ov, out, "out") != dt:
            raise TypeError(f"out dtype {_dtype_name(out)} does not match x dtype {_dtype_name(x)}")

    # ---- shapes
    if c.wv.ndim != 2:
        raise ValueError(f"weight must have shape (D, W), got {tuple(weight.shape)}")
    D = c.wv.shape[0]
    W = c.wv.shape[1]
    if W < GDN_MIN_WIDTH or W > GDN_MAX_WIDTH:
        raise ValueError(f"width W = weight.shape[1] = {W} is outside {GDN_MIN_WIDTH}..{GDN_MAX_WIDTH}")
    if c.xv.ndim in (2, 3) and c.xv.shape[c.xv.ndim - 1] != D:
        raise ValueError(f"x dim {c.xv.shape[c.xv.ndim - 1]} (shape {tuple(x.shape)}) does not match "
                         f"weight dim {D} (weight shape {tuple(weight.shape)})")
    if bias is not None and (c.bv.ndim != 1 or c.bv.shape[0] != D):
        raise ValueError(f"bias must have shape ({D},) to match weight {tuple(weight.shape)}, "
                         f"got {tuple(bias.shape)}")
    if c.sv.ndim != 3:
        raise ValueError(f"conv_state must have shape (num_slots, state_len, D), got {tuple(conv_state.shape)}")
    S = c.sv.shape[0]
    L = c.sv.shape[1]
    if c.sv.shape[2] != D:
        raise ValueError(f"conv_state dim {c.sv.shape[2]} (shape {tuple(conv_state.shape)}) does not "
                         f"match weight dim {D}")
    if not c.sv.writeable:
        raise ValueError("conv_state is read-only: it is updated in place")
    _refuse_autograd(conv_state, "conv_state")
    _refuse_self_overlap(&c.sv, "conv_state")
    if c.xv.ndim == 3:
        if query_start_loc is not None:
            raise ValueError(f"x must be 2-D (N, D) with query_start_loc, got shape {tuple(x.shape)}")
        B = c.xv.shape[0]
        T = c.xv.shape[1]
    elif c.xv.ndim == 2:
        T = 1
        if query_start_loc is None:
            B = c.xv.shape[0]
        else:
            N = c.xv.shape[0]
            B = _index_len(query_start_loc, "query_start_loc") - 1
            if B < 0:
                raise ValueError("query_start_loc must have B + 1 >= 1 entries, got 0")
    else:
        raise ValueError(f"x must be (B, T, D), (B, D) or (N, D), got shape {tuple(x.shape)}")
    if L < W - 1:
        mode = "plain decode" if num_accepted_tokens is None else "speculative mode"
        raise ValueError(f"state_len = conv_state.shape[1] = {L} is too small: {mode} needs "
                         f"state_len >= width - 1 = {W - 1}")
    if out is not None:
        if not _same_shape(&c.ov, &c.xv):
            raise ValueError(f"out shape {tuple(out.shape)} does not match x shape {tuple(x.shape)}")
        if not c.ov.writeable:
            raise ValueError("out is read-only")
        _refuse_autograd(out, "out")
        _refuse_self_overlap(&c.ov, "out")
        out_is_x = _same_view(&c.ov, &c.xv)

    # ---- index arrays
    c.p.conv_state_indices = NULL
    c.p.num_accepted_tokens = NULL
    c.p.query_start_loc = NULL
    if query_start_loc is not None:
        keep.append(_index_array(query_start_loc, "query_start_loc", B + 1, &c.qv))
    if conv_state_indices is not None:
        keep.append(_index_array(conv_state_indices, "conv_state_indices", B, &c.iv))
    elif B > S:
        raise ValueError(f"batch {B} needs conv_state_indices: conv_state has only {S} slots")
    if num_accepted_tokens is not None:
        keep.append(_index_array(num_accepted_tokens, "num_accepted_tokens", B, &c.nv))

    # ---- aliasing: what is written must not share memory with what is read
    if out is not None:
        _refuse_shared(&c.ov, "out", &c.sv, "conv_state")
        if not out_is_x:
            _read_apart(c, &c.xv, "x", &c.ov, "out", " without being out")
    _read_apart(c, &c.xv, "x", &c.sv, "conv_state")
    _keep_apart(c, &c.wv, "weight", out is not None)
    if bias is not None:
        _keep_apart(c, &c.bv, "bias", out is not None)
    if conv_state_indices is not None:
        _keep_apart(c, &c.iv, "conv_state_indices", out is not None)
        c.p.conv_state_indices = <const int32_t *>c.iv.ptr
    if num_accepted_tokens is not None:
        _keep_apart(c, &c.nv, "num_accepted_tokens", out is not None)
        c.p.num_accepted_tokens = <const int32_t *>c.nv.ptr
    if query_start_loc is not None:
        _keep_apart(c, &c.qv, "query_start_loc", out is not None)
        c.p.query_start_loc = <const int32_t *>c.qv.ptr

    # ---- params
    c.p.batch = B
    c.p.dim = D
    c.p.width = W
    c.p.state_len = L
    c.p.num_slots = S
    c.p.seqlen = T
    c.p.pad_slot_id = pad
    c.p.dtype = dt
    c.p.weight_dtype = wdt
    c.p.weight = c.wv.ptr
    c.p.weight_stride_d = c.wv.strides[0]
    c.p.weight_stride_w = c.wv.strides[1]
    c.p.bias = NULL
    c.p.bias_stride = 0
    if bias is not None:
        c.p.bias = c.bv.ptr
        c.p.bias_stride = c.bv.strides[0]
    c.p.conv_state = c.sv.ptr
    c.p.state_stride_s = c.sv.strides[0]
    c.p.state_stride_l = c.sv.strides[1]
    c.p.state_stride_d = c.sv.strides[2]

    rc = gdn_validate(&c.p, N, &bad_i, &bad_v)
    if rc != GDN_OK:
        _raise_index_error(rc, bad_i, bad_v, &c.p, N)

    c.out_is_x = out_is_x
    return 0


def conv_update_multi(x, conv_state, weight, bias=None, *, activation="silu",
                      num_accepted_tokens=None, conv_state_indices=None, query_start_loc=None,
                      pad_slot_id=-1, out=None, num_threads=None):
    """Causal conv1d decode/speculative update with a rolling per-slot state.

    Semantics follow vLLM's ``causal_conv1d_update`` (CPU and Triton paths); the
    float64 ``gdnconv.reference.conv_update_multi_ref`` spells them out. For request ``i`` with slot ``s`` and tokens ``x_i``
    (``T_i`` rows) the window is ``concat(conv_state[s, off:off+W-1], x_i)`` with
    ``off = num_accepted_tokens[i] - 1`` (speculative mode) or 0 (plain decode) and
    ``out[t, d] = act(bias[d] + sum_k weight[d, k] * window[t + k, d])``, accumulated
    in float32 and rounded once (round-to-nearest-even) to the output dtype.

    State roll, plain mode: ``conv_state[s, :W-1]`` keeps the last ``W-1`` rows of the
    window. Speculative mode: ``conv_state[s, :W-2] <- conv_state[s, off+1:off+W-1]``
    and ``conv_state[s, W-2:W-2+T_i] <- x_i``; later rows are untouched. A request
    with ``T_i = 0`` or a pad slot leaves its slot untouched. The roll is a
    bit-exact copy (NaN payloads included).

    Args:
        x: ``(B, T, D)`` tokens; ``(N, D)`` with ``query_start_loc`` (varlen); or
            ``(B, D)``, one token per request. float32, float16 or bfloat16
            (``ml_dtypes.bfloat16`` for NumPy), any strides. Read only.
        conv_state: ``(S, L, D)`` state, updated in place (never copied), same dtype
            as ``x``. Any strides; channels contiguous is the fast path, and vLLM's
            ``L``-contiguous layout passed as a transposed view works too.
        weight: ``(D, W)`` taps, ``2 <= W <= 8``; same dtype as ``x`` or float32.
        bias: ``(D,)`` of ``weight``'s dtype, or None.
        activation: None, ``"silu"`` or ``"swish"`` (same as silu); True/False as in
            vLLM. Note the layout: ``x`` is ``(B, T, D)`` where vLLM's Triton path
            takes ``(B, D, T)``.
        num_accepted_tokens: ``(B,)`` integer, accepted tokens of the previous step
            per request (``1 <= n <= L - W + 2``, not checked for pad requests);
            None for plain decode.
        conv_state_indices: ``(B,)`` integer slot per request; default ``arange(B)``.
            A request whose slot equals ``pad_slot_id`` is skipped entirely.
        query_start_loc: ``(B + 1,)`` integer offsets of each request's rows in a 2-D
            ``x`` (starts at 0, non-decreasing, ends at ``N``); ``T_i`` may be 0.
        pad_slot_id: slot value that marks padding (default -1).
        out: optional array of ``x``'s shape and dtype to write into; may be ``x``
            itself. Rows of skipped requests are left as they were (zeros in a newly
            allocated output).
        num_threads: threads for this call (default ``get_num_threads()``); capped by
            the process's CPU affinity; small calls run on the calling thread.

    Returns:
        ``out`` (a new NumPy array or torch tensor like ``x`` when not given).

    Raises:
        TypeError: ``conv_state``, ``weight``, ``bias`` or ``out`` is not an
            array/tensor (``x`` and the index arguments may be sequences NumPy
            converts), dtypes are unsupported or mixed, or an index array is not of
            an integer dtype.
        ValueError: wrong rank or shape, ``D``/``W`` mismatch, width outside 2..8,
            ``state_len`` too small, slot out of range or used twice, a written
            array that overlaps itself or has non-native byte order,
            ``num_accepted_tokens`` out of range, bad ``query_start_loc``, read-only
            ``conv_state``/``out``, ``out`` overlapping ``conv_state`` (or ``x``
            without being ``x``), ``x`` overlapping ``conv_state``, non-CPU tensors.
        Nothing is written when an exception is raised.
    """
    cdef _Call c = _Call()
    cdef int nthreads = _num_threads if num_threads is None else _check_threads(num_threads, "num_threads")
    if x is None or not (cnp.PyArray_Check(x) or _is_tensor(x)):
        x = _as_input_array(x, "x")
    x = _native(x)
    weight = _native(weight)
    bias = _native(bias)
    _prepare(c, x, conv_state, weight, bias, activation, num_accepted_tokens, conv_state_indices,
             query_start_loc, pad_slot_id, out)
    if c.xv.strides[c.xv.ndim - 1] != 1 and not c.out_is_x:
        x = _torch_contiguous(x) if c.xv.torch else np.ascontiguousarray(x)
        c.keep.append(_view(x, &c.xv, "x"))
    c.p.zero_skipped = out is None
    if out is None:
        out = _new_like(x, &c.xv)
        c.keep.append(_view(out, &c.ov, "out"))
    _fill_rows(&c.p.x, &c.p.x_stride_b, &c.p.x_stride_t, &c.p.x_stride_d, &c.xv, query_start_loc is not None)
    _fill_rows(<const void **>&c.p.out, &c.p.out_stride_b, &c.p.out_stride_t, &c.p.out_stride_d, &c.ov,
               query_start_loc is not None)
    cdef int64_t scratch = gdn_weight_scratch_floats(&c.p, nthreads)
    if scratch:
        c.p.weight_scratch = _weight_scratch(c, scratch)
    with nogil:
        gdn_run(&c.p, nthreads)
    return out


_scratch = threading.local()


cdef float *_weight_scratch(_Call c, int64_t n) except NULL:
    """This thread's scratch of at least ``n`` float32 (kept between calls, grown when
    needed, so no call allocates it twice): a SIMD call with several requests
    converts its weights into it once instead of once per request. The call holds it
    too: at interpreter exit the thread-local is freed while a daemon thread's kernel
    may still be using it."""
    buf = getattr(_scratch, "w", None)
    if buf is None or cnp.PyArray_DIM(<cnp.ndarray>buf, 0) < n:
        buf = np.empty(n, np.float32)
        _scratch.w = buf
    c.keep.append(buf)
    return <float *>cnp.PyArray_DATA(<cnp.ndarray>buf)


cdef int _keep_apart(_Call c, View *r, str name, bint has_out) except -1:
    """A read-only argument must not share memory with conv_state or out (see _read_apart)."""
    _read_apart(c, r, name, &c.sv, "conv_state")
    if has_out:
        _read_apart(c, r, name, &c.ov, "out")
    return 0


cdef int _refuse_autograd(object a, str name) except -1:
    """gdnconv writes outside autograd: a written tensor that requires grad would be
    changed behind its back (torch itself refuses in-place writes to such leaves)."""
    if _is_tensor(a) and a.requires_grad:
        raise ValueError(f"{name} requires grad; gdnconv writes it in place outside autograd: "
                         f"pass {name}.detach() (same memory) or call it under torch.no_grad() "
                         f"with a tensor that does not require grad")
    return 0


cdef object _as_input_array(object a, str name):
    if a is None:
        raise TypeError(f"{name} must be an array or tensor, got None")
    return np.asarray(a)


cdef object _torch_contiguous(object x):
    return x.contiguous()


cdef void _fill_rows(const void **ptr, int64_t *sb, int64_t *st, int64_t *sd, const View *v, bint varlen):
    """Strides (batch, token, channel) of x or out for the params struct."""
    ptr[0] = v.ptr
    if v.ndim == 3:
        sb[0] = v.strides[0]
        st[0] = v.strides[1]
        sd[0] = v.strides[2]
    elif varlen:        # (N, D): row = query_start_loc[i] + t
        sb[0] = 0
        st[0] = v.strides[0]
        sd[0] = v.strides[1]
    else:               # (B, D): one token per request
        sb[0] = v.strides[0]
        st[0] = 0
        sd[0] = v.strides[1]


cdef int _raise_index_error(int rc, int64_t i, int64_t v, const gdn_params *p, int64_t N) except -1:
    W, L = p.width, p.state_len
    if rc == GDN_ERR_SLOT_RANGE:
        raise ValueError(f"conv_state_indices[{i}] = {v} is out of range: slots are 0..{p.num_slots - 1} "
                         f"(conv_state.shape[0] = {p.num_slots}) or pad_slot_id = {p.pad_slot_id}")
    if rc == GDN_ERR_SLOT_DUPLICATE:
        first = 0
        while p.conv_state_indices[first] != v:
            first += 1
        raise ValueError(f"conv_state_indices[{i}] = {v} repeats the slot of request {first}: "
                         f"two requests cannot update one slot")
    if rc == GDN_ERR_ACCEPTED_RANGE:
        raise ValueError(f"num_accepted_tokens[{i}] = {v} is out of range [1, {L - W + 2}] for "
                         f"state_len = {L}, width = {W}; a request with every token rejected "
                         f"is marked with pad_slot_id instead of 0")
    if rc == GDN_ERR_SPEC_TOKENS:
        raise ValueError(f"request {i} has {v} tokens: speculative mode needs width - 2 + tokens "
                         f"<= state_len ({W} - 2 + {v} > {L})")
    if rc == GDN_ERR_QSL_START:
        raise ValueError(f"query_start_loc[0] = {v} must be 0")
    if rc == GDN_ERR_QSL_ORDER:
        raise ValueError(f"query_start_loc must be non-decreasing: query_start_loc[{i}] = {v} "
                         f"is smaller than the entry before it")
    if rc == GDN_ERR_QSL_END:
        raise ValueError(f"query_start_loc[{i}] = {v} must equal the number of tokens x.shape[0] = {N}")
    if rc == GDN_ERR_NO_MEMORY:
        raise MemoryError("no memory for the duplicate-slot check")
    raise RuntimeError(f"gdn_validate returned {rc}")


def bytes_moved(x, conv_state, weight, *, num_accepted_tokens=None, conv_state_indices=None,
                query_start_loc=None, pad_slot_id=-1):
    """Bytes the performance model counts for this call (int), for benchmarks.

    ``e * D * sum_i (2 T_i + (W - 1) + (W - 2 + T_i))`` over requests that are not
    skipped (``e`` bytes per element), plus ``D * W`` weight elements. Takes the
    arguments of a ``conv_update_multi`` call, checks them the same way (same
    exceptions) and reads nothing but the index arrays.
    """
    cdef _Call c = _Call()
    if x is None or not (cnp.PyArray_Check(x) or _is_tensor(x)):
        x = _as_input_array(x, "x")
    _prepare(c, _native(x), conv_state, _native(weight), None, None, num_accepted_tokens,
             conv_state_indices, query_start_loc, pad_slot_id, None)
    _fill_rows(&c.p.x, &c.p.x_stride_b, &c.p.x_stride_t, &c.p.x_stride_d, &c.xv, query_start_loc is not None)
    _fill_rows(<const void **>&c.p.out, &c.p.out_stride_b, &c.p.out_stride_t, &c.p.out_stride_d, &c.xv,
               query_start_loc is not None)
    return gdn_bytes_moved(&c.p)


def pack_weight(weight):
    """Weights as float32 ``(D, W)`` with taps outermost in memory (strides ``(1, D)``
    in elements), the layout the SIMD kernels read without converting.

    The result is an ordinary ``(D, W)`` array (or tensor, for a tensor input) that
    ``conv_update_multi`` accepts anywhere a weight is; pack once, reuse every step.
    The bias then has to be float32 too. Raises ValueError unless ``weight`` is
    ``(D, W)`` with ``2 <= W <= 8``, TypeError for a non-float weight.
    """
    if _is_tensor(weight):
        if weight.dim() != 2 or not GDN_MIN_WIDTH <= weight.shape[1] <= GDN_MAX_WIDTH:
            raise ValueError(f"weight must have shape (D, W) with {GDN_MIN_WIDTH} <= W <= {GDN_MAX_WIDTH}, "
                             f"got {tuple(weight.shape)}")
        if not weight.dtype.is_floating_point:
            raise TypeError(f"weight must be a float tensor, got dtype {weight.dtype}")
        return weight.detach().to(_torch.float32).t().contiguous().t()
    w = np.asarray(weight)
    if w.ndim != 2 or not GDN_MIN_WIDTH <= w.shape[1] <= GDN_MAX_WIDTH:
        raise ValueError(f"weight must have shape (D, W) with {GDN_MIN_WIDTH} <= W <= {GDN_MAX_WIDTH}, "
                         f"got {w.shape}")
    if w.dtype.kind != "f" and w.dtype.name != "bfloat16":
        raise TypeError(f"weight must be a float array, got dtype {w.dtype}")
    return np.ascontiguousarray(w.T, dtype=np.float32).T
