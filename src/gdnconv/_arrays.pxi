# The arrays layer, shared by every op: NumPy arrays and torch tensors read as
# (pointer, shape, strides, dtype) without copies, index arguments as int32 arrays,
# new outputs. The checks built on these views are in _checks.pxi.
#
# Order within a call: every argument that can run user code when converted (a
# sequence or an object with __array__) is converted first (_input_array,
# _index_source); views and pointers are taken afterwards, from objects the call
# holds until the kernel returns. torch code a tensor subclass's or a mode's
# __torch_function__ overrides (is_neg, untyped_storage, empty_like, clone, ...) can
# still run after a pointer was taken and resize another tensor's storage: so every
# tensor view is checked against its storage (_in_storage) after the last step that
# can run such code, right before the memory checks and the kernel.

cdef extern from "numpy/ndarraytypes.h":
    enum:
        NPY_USERDEF

cdef extern from *:
    """
    /* DLPack's DLTensor (dlpack.h; this layout is stable since DLPack 0.2): the head
     * of every DLPack tensor. */
    typedef struct { int32_t device_type; int32_t device_id; } gdn_dl_device;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } gdn_dl_dtype;
    typedef struct {
        void *data; gdn_dl_device device; int32_t ndim; gdn_dl_dtype dtype;
        int64_t *shape; int64_t *strides; uint64_t byte_offset;
    } gdn_dl_tensor;
    /* The head of DLPack 1.3+'s DLPackExchangeAPI (dlpack.h; new in 1.3), which torch publishes as
     * the "dlpack_exchange_api" capsule torch.Tensor.__dlpack_c_exchange_api__: its
     * dltensor_from_py_object_no_sync fills a DLTensor on the caller's stack, shape and
     * strides pointing into the tensor, with no allocation and no Python-level call;
     * 0 on success, -1 with a Python exception set (it throws no C++ exception). */
    typedef int (*gdn_dl_from_py)(void *py_object, gdn_dl_tensor *out);
    typedef struct {
        uint32_t major; uint32_t minor; void *prev_api;
        void *managed_tensor_allocator; void *managed_tensor_from_py_object_no_sync;
        void *managed_tensor_to_py_object_no_sync; gdn_dl_from_py dltensor_from_py_object_no_sync;
    } gdn_dl_exchange_api;
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
    ctypedef int (*gdn_dl_from_py)(void *py_object, gdn_dl_tensor *out)
    ctypedef struct gdn_dl_exchange_api:
        uint32_t major
        uint32_t minor
        gdn_dl_from_py dltensor_from_py_object_no_sync

cdef enum:
    DL_INT = 0       # DLPack type codes and device
    DL_FLOAT = 2
    DL_BFLOAT = 4
    DL_CPU = 1



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
    PyObject *store      # a torch tensor's UntypedStorage (held by the call's keep), else NULL

cdef int _bf16_typenum = -1
cdef object _torch = None          # the torch module, once it has been imported
cdef object _tensor_type = None    # torch.Tensor
cdef object _parameter_type = None # torch.nn.Parameter
cdef object _storage_type = None   # torch.UntypedStorage
cdef object _inference_mode = None # torch.is_inference_mode_enabled
cdef object _grad_enabled = None   # torch.is_grad_enabled
cdef dict _torch_dtypes = {}       # torch dtype -> gdn dtype code
cdef gdn_dl_from_py _dl_from_py = NULL   # torch's DLPack exchange entry (see gdn_dl_exchange_api)


cdef inline bint _is_tensor(object a):
    """NumPy arrays and None answer without a lookup, and torch.Tensor is looked up
    once: per argument, sys.modules (torch not imported) or torch.Tensor cost a D=64
    call with out= 0.93 -> 0.66 us from NumPy (1.10 -> 0.65 with torch imported) and
    2.95 -> 2.69 us from torch tensors."""
    global _torch, _tensor_type, _parameter_type, _storage_type, _dl_from_py, _inference_mode, _grad_enabled
    if a is None or cnp.PyArray_Check(a):
        return False
    if _tensor_type is None:
        mod = sys.modules.get("torch")
        if mod is None:
            return False
        _torch = mod
        _torch_dtypes.update({mod.float32: GDN_F32, mod.float16: GDN_F16, mod.bfloat16: GDN_BF16})
        api = getattr(mod.Tensor, "__dlpack_c_exchange_api__", None)
        if api is not None and PyCapsule_IsValid(api, "dlpack_exchange_api"):
            ex = <gdn_dl_exchange_api *>PyCapsule_GetPointer(api, "dlpack_exchange_api")
            if ex.major == 1 and ex.minor >= 3:
                _dl_from_py = ex.dltensor_from_py_object_no_sync
        _storage_type = mod.UntypedStorage
        _inference_mode = mod.is_inference_mode_enabled
        _grad_enabled = mod.is_grad_enabled
        _parameter_type = mod.nn.Parameter
        _tensor_type = mod.Tensor
    return isinstance(a, _tensor_type)


cdef int _plain_tensors(tuple args) except -1:
    """Every argument given (not None) is a torch.Tensor or an nn.Parameter (whose
    __torch_function__ is torch's own), or, for the weight and bias (args[2], args[3]), a
    numpy.ndarray: checked by type alone, so no user code runs."""
    cdef int i
    if not _is_tensor(args[0]):
        raise TypeError(f"x must be a torch.Tensor, got {type(args[0]).__name__}")
    for i, a in enumerate(args):
        if (a is not None and type(a) is not _tensor_type and type(a) is not _parameter_type
                and not (2 <= i <= 3 and type(a) is np.ndarray)):
            raise TypeError(f"an argument is a {type(a).__name__}, not a torch.Tensor or nn.Parameter "
                            f"(or a numpy.ndarray weight or bias)")
    return 0


cdef bint _dl_read(object a, gdn_dl_tensor *t):
    """Fill t from a CPU tensor through torch's DLPack exchange API: one C call (no
    Python-level call, so no __torch_function__ override runs), where to_dlpack took
    ~0.3 us and an allocation per tensor. False where torch cannot describe the tensor
    (meta, sparse, nested: the exception is cleared), it is not on the CPU, or this
    torch has no exchange API: the attributes decide then. t's shape and strides point
    into the tensor: valid while it is held and not resized (copied into a View at once)."""
    if _dl_from_py == NULL:
        return False
    if _dl_from_py(<void *>a, t) != 0:
        PyErr_Clear()
        return False
    return t.device.device_type == DL_CPU and t.dtype.lanes == 1


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
    returned: the array, or the tensor's storage (see _storage; v.store, which
    _in_storage checks v against once no more user code can run)."""
    cdef cnp.ndarray arr
    cdef int i
    cdef int64_t size
    cdef gdn_dl_tensor t
    v.store = NULL
    if cnp.PyArray_Check(a):
        arr = <cnp.ndarray>a
        if not cnp.PyArray_ISNOTSWAPPED(arr):
            # inputs were made native by _native: this is an array the call writes in place
            raise ValueError(f"{name} has non-native byte order (dtype {a.dtype.str}) and is written in "
                             f"place: allocate it with dtype '{a.dtype.newbyteorder('=').str}' (a converted "
                             f"copy would not receive the update)")
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
        if _dl_read(a, &t) and t.ndim <= 3:
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
            d = a.detach()
            shape = d.shape
            v.ndim = len(shape)
            if v.ndim > 3:
                raise ValueError(f"{name} must have at most 3 dimensions, got shape {tuple(shape)}")
            try:
                v.ptr = <char *><uintptr_t>d.data_ptr()
            except RuntimeError as e:    # (a tensor without storage: torch.func's wrappers)
                raise TypeError(f"{name} is a tensor whose memory cannot be read ({e}): pass a plain "
                                f"torch.Tensor (outside torch.func.vmap / grad)") from None
            v.dtype = _torch_dtypes.get(d.dtype, KIND_OTHER)
            v.itemsize = 4 if v.dtype == GDN_F32 else 2 if v.dtype != KIND_OTHER else d.element_size()
            strides = d.stride()
            for i in range(v.ndim):
                v.shape[i] = shape[i]
                v.strides[i] = strides[i]
        if a.is_neg():  # (the conjugate bit exists only for complex dtypes, refused later)
            raise ValueError(f"{name} has a pending negation bit; call .resolve_neg() first")
        v.writeable = True
        v.torch = True
        if type(owner) is _storage_type:
            v.store = <PyObject *>owner
    else:
        raise TypeError(f"{name} must be a numpy.ndarray or a torch.Tensor, got {type(a).__name__}")
    size = 1
    for i in range(v.ndim):
        size *= v.shape[i]
    if size and v.ptr == NULL:
        raise ValueError(f"{name} has {size} elements but no memory (a zero or fake tensor?): "
                         f"pass a materialised tensor such as {name}.clone()")
    if size and v.torch and v.store == NULL:
        raise TypeError(f"{name} is a {type(a).__name__} whose storage cannot be read "
                        f"(untyped_storage() gave {type(owner).__name__}): pass a plain torch.Tensor")
    if size and (<uintptr_t>v.ptr) % v.itemsize:
        raise ValueError(f"{name} data is not aligned to its item size {v.itemsize}")
    return owner


cdef object _native(object a):
    """An input in native byte order (a copy only when it was byte-swapped)."""
    if cnp.PyArray_Check(a) and not cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a):
        return a.astype(a.dtype.newbyteorder("="))
    return a


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


cdef object _int32_view(object owner, char *ptr, int64_t n, View *v, PyObject *store=NULL):
    """v = the (n,) contiguous int32 array at ptr (in store, a torch storage, or NULL);
    returns its owner."""
    v.ptr = ptr
    v.ndim = 1
    v.shape[0] = n
    v.strides[0] = 1
    v.itemsize = 4
    v.store = store
    return owner


cdef object _sequence_array(object a, object empty_dtype):
    """np.asarray(a) for an index argument that is not an array; an empty list or tuple
    (np.asarray gives float64) as an empty array of empty_dtype."""
    arr = np.asarray(a)
    if arr.size == 0 and arr.dtype == np.float64 and isinstance(a, (list, tuple)):
        return arr.astype(empty_dtype)
    return arr


cdef object _storage(object a):
    """What keeps a tensor's memory alive while the call runs, taken before its pointer:
    its storage. A DLPack capsule would not: it shares the tensor's TensorImpl, so a
    ``.set_()`` in code that runs later in the call (a subclass's or mode's
    ``__torch_function__``) frees the memory under it; it does not stop a
    ``resize_()`` of the storage, which _in_storage catches. (A detached alias where
    the storage cannot be had, as for tensors without memory, refused by _view.)"""
    try:
        return a.untyped_storage()
    except Exception:
        return a.detach()


cdef object _index_source(object a, str name, list keep):
    """An index argument as _index_array reads it without running any user code: None,
    a NumPy array, or for a 1-D int32 unit-stride CPU tensor (read in place: .numpy()
    costs ~0.7 us) the tuple (its storage, data address, length); the storage also goes
    to keep, and _in_storage checks the view against it. Everything that can run user code (``__array__``,
    ``__len__``, torch methods) happens here, before the call takes any pointer. An
    empty sequence (a batch of none) is an empty int32 array."""
    cdef gdn_dl_tensor t
    cdef uintptr_t ptr
    if a is None or cnp.PyArray_Check(a):
        return a
    if not _is_tensor(a):
        return _sequence_array(a, np.int32)
    if a.is_neg():   # torch's values are the negated memory
        a = a.resolve_neg()
    store = _storage(a)
    if (_dl_read(a, &t) and t.ndim == 1 and t.dtype.code == DL_INT and t.dtype.bits == 32 and
            (t.shape[0] <= 1 or t.strides == NULL or t.strides[0] == 1)):
        ptr = <uintptr_t>t.data + t.byte_offset
        if ptr % 4 == 0 and (ptr != 0 or t.shape[0] == 0) and type(store) is _storage_type:
            keep.append(store)
            return (store, ptr, t.shape[0])
    if not a.is_cpu:
        raise ValueError(f"{name} must be a CPU tensor, got device {a.device}")
    if a.layout is not _torch.strided or getattr(a, "is_nested", False):
        raise TypeError(f"{name} must be a dense integer tensor (int32), got a {_layout_name(a)} tensor")
    if a.dtype.is_floating_point or a.dtype.is_complex or a.dtype is _torch.bool:
        raise TypeError(f"{name} must be an integer array (int32), got dtype {_dtype_name(a)}")
    return _tensor_copy(a, name)


def _tensor_values(a, name):
    """_tensor_copy(a, name) for gdnconv.vllm, which reads index values on the host (block
    tables): one bounds check for the core's conversions and the adapter's."""
    _is_tensor(a)   # (looks the torch types up on a first call)
    return _tensor_copy(a, name)


cdef object _tensor_copy(object a, str name):
    """A NumPy copy of a CPU tensor's values (an array sharing its memory would not keep
    it alive; force: a zero tensor has no memory to share); refused where the tensor lies
    outside its storage (_in_own_storage), which .numpy() would read past."""
    _in_own_storage(a, name)
    return np.array(a.numpy(force=True))


def _in_own_storage(a, name):
    """ValueError naming ``name`` where the torch tensor ``a`` lies outside its storage
    (shrunk by untyped_storage().resize_()): torch's own copies of it (``.numpy()``,
    ``.to()``) read past the storage's end, freed memory. For the copies gdnconv.vllm and its
    plugin make with torch."""
    if not _is_tensor(a):     # (also looks torch's types up on a first call)
        return
    store = _storage(a)
    if a.numel() and type(store) is _storage_type:
        lo = a.storage_offset() * a.element_size()
        hi = lo + (1 + sum((n - 1) * s for n, s in zip(a.shape, a.stride()))) * a.element_size()
        if hi > len(store):
            _raise_outside_storage(name, lo, hi, len(store))


cdef int64_t _index_len(object src, str name) except -1:
    """Entries of a 1-D index source (see _index_source)."""
    if not cnp.PyArray_Check(src):
        return (<tuple>src)[2]
    if cnp.PyArray_NDIM(<cnp.ndarray>src) != 1:
        raise ValueError(f"{name} must be 1-D (B + 1,), got shape {src.shape}")
    return cnp.PyArray_DIMS(<cnp.ndarray>src)[0]


cdef object _index_array(object src, str name, int64_t n, View *v):
    """(n,) int32 view of an index source (see _index_source); returns the object that
    owns the memory (the source tuple, the source array or its int32 copy)."""
    cdef uintptr_t ptr
    if not cnp.PyArray_Check(src):
        store, ptr, length = <tuple>src
        if length != n:
            raise ValueError(f"{name} must have shape ({n},), got ({length},)")
        return _int32_view(src, <char *>ptr, n, v, <PyObject *>store)
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
    if _view_bytes(xv) >= GDN_REUSE_MIN_BYTES and (not xv.torch or type(x) is _tensor_type):
        # (a tensor subclass keeps empty_like, which keeps the subclass.) empty_like keeps
        # the strides of a dense x (vLLM's (B, D, T) x is a transposed view of gdnconv's
        # contiguous order); a reused tensor takes them too
        reused = _reused_like(x, xv, tuple(x.shape), x.stride() if xv.torch and _c_contiguous(xv) else None)
        if reused is not None:
            return reused
    if xv.torch:   # empty_like keeps x's strides: ~0.9 us cheaper than empty(shape)
        return _torch.empty_like(x) if _c_contiguous(xv) else _torch.empty(tuple(x.shape), dtype=x.dtype)
    for i in range(xv.ndim):
        dims[i] = xv.shape[i]
    return cnp.PyArray_EMPTY(xv.ndim, dims, cnp.PyArray_TYPE(<cnp.ndarray>x), 0)


cdef void _give_block(object capsule) noexcept:
    """The capsule under a reused array dies with the array: its block goes back."""
    gdn_block_give(PyCapsule_GetPointer(capsule, "gdnconv.block"),
                   <int64_t><intptr_t>PyCapsule_GetContext(capsule))


cdef int64_t _view_bytes(const View *v):
    cdef int64_t n = v.itemsize
    cdef int i
    for i in range(v.ndim):
        n *= v.shape[i]
    return n


cdef object _reused_like(object x, const View *xv, tuple shape, object strides=None):
    """A new C-contiguous array or tensor of ``shape`` and x's dtype (a tensor: with
    ``strides`` when given, a dense layout of the same elements) over a block of
    memory.c's cache (memory.h: GDN_REUSE_MIN_BYTES and up), or None (smaller, reuse
    off, no block): the caller allocates as usual. The block returns to the cache when
    the array, and every view of it, is freed. A NumPy array is a view of a uint8 array
    whose base is the block's capsule; a tensor shares such an array's memory
    (torch.from_numpy), so its storage, like any from_numpy tensor's, cannot be resized."""
    cdef int64_t nbytes = xv.itemsize, size = 0
    cdef cnp.npy_intp n
    cdef void *p
    cdef int i
    for i in range(len(shape)):
        nbytes *= <int64_t>shape[i]
    if nbytes < GDN_REUSE_MIN_BYTES:
        return None
    p = gdn_block_take(nbytes + GDN_BLOCK_SKEW, _numpy_madvise is None or _numpy_madvise(), &size)
    if p == NULL:
        return None
    try:
        capsule = PyCapsule_New(p, "gdnconv.block", <PyCapsule_Destructor>_give_block)
    except BaseException:
        gdn_block_give(p, size)
        raise
    PyCapsule_SetContext(capsule, <void *><intptr_t>size)
    n = <cnp.npy_intp>nbytes
    raw = cnp.PyArray_SimpleNewFromData(1, &n, cnp.NPY_UINT8, <char *>p + GDN_BLOCK_SKEW)   # (memory.h)
    cnp.set_array_base(<cnp.ndarray>raw, capsule)
    if xv.torch:
        flat = _torch.from_numpy(raw).view(x.dtype)
        return flat.view(shape) if strides is None else flat.as_strided(shape, strides)
    return raw.view(x.dtype).reshape(shape)


# NumPy's switch of its own huge-page advice (np._core.multiarray._set_madvise_hugepage;
# off by default on Linux kernels before 4.6), which _advise_huge follows
try:
    from numpy._core.multiarray import _get_madvise_hugepage as _numpy_madvise
except ImportError:
    try:
        from numpy.core.multiarray import _get_madvise_hugepage as _numpy_madvise
    except ImportError:   # a NumPy without the getter: advise
        _numpy_madvise = None


cdef int _advise_huge(const View *v) except -1:
    """Huge pages for a large new torch out before its first touch, as NumPy advises
    its own arrays (and only while NumPy does: its switch is followed); memory.c says
    why. NumPy outs: nothing, NumPy has done it."""
    cdef uintptr_t lo, hi
    if not v.torch:
        return 0
    _extent(v, &lo, &hi)
    if hi - lo >= GDN_HUGE_ADVICE_BYTES and (_numpy_madvise is None or _numpy_madvise()):
        gdn_advise_huge_pages(<void *>lo, <int64_t>(hi - lo))
    return 0


cdef object _made(object a, View *v, const View *like, object x, str name):
    """Fill v from an array the call made from x after its checks (a copy of x, a new
    out; see _view), which must have x's shape and dtype (like, x's view; may be v):
    torch functions that a subclass's or a mode's __torch_function__ overrides may
    return anything. A new out must give each element its own memory."""
    cdef View xv = like[0]
    owner = _view(a, v, name)
    if not _same_shape(v, &xv) or v.dtype != xv.dtype:
        raise TypeError(f"the {name} the call made (torch.empty_like, .clone() or .contiguous() of x) has "
                        f"shape {tuple(a.shape)} and dtype {_dtype_name(a)}, not x's {tuple(x.shape)} and "
                        f"{_dtype_name(x)}: a __torch_function__ override (of x's class or of a mode) "
                        f"returned it; such an override must return what the torch function returns")
    _refuse_self_overlap(v, name)
    return owner


cdef object _input_array(object a, str name):
    """An input (x) as an array or tensor in native byte order: arrays and tensors as
    they are, anything else through np.asarray (which may run the object's
    __array__: call this before taking any pointer)."""
    if a is None:
        raise TypeError(f"{name} must be an array or tensor, got None")
    if not (cnp.PyArray_Check(a) or _is_tensor(a)):
        kind = type(a).__name__
        a = np.asarray(a)
        if _numpy_dtype_code(<cnp.ndarray>a) == KIND_OTHER:
            raise TypeError(f"{name} (a {kind}) converts to a NumPy array of dtype {a.dtype}, which gdnconv "
                            f"does not take: pass an array of float32, float16 or bfloat16, e.g. "
                            f"np.asarray({name}, np.float32)")
    return _native(a)


cdef object _torch_contiguous(object x):
    return x.contiguous()
