# Checks every op makes the same way, on the views of _arrays.pxi: written arrays
# (writeable, outside autograd, no self-overlap), aliasing between arguments, and the
# shared arguments (activation, pad_slot_id, weight and bias).

cdef int _refuse_self_overlap(const View *v, str name) except -1:
    """A written array must give every element its own memory (layout.h's rule, the torch
    op's too)."""
    if not gdn_no_self_overlap(v.ndim, v.shape, v.strides):
        raise ValueError(f"{name} overlaps itself (shape {tuple(v.shape[k] for k in range(v.ndim))}, "
                         f"strides {tuple(v.strides[k] for k in range(v.ndim))} in elements): "
                         f"every element it holds must have its own memory")
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
    """Two written arrays must not share memory; an undecided pair is refused too (a
    tensor outside its storage, as its own fault)."""
    cdef int shared = _shares(a, b)
    if shared:
        _in_storage(a, name)
        _in_storage(b, bname)
    if shared == 1:
        raise ValueError(f"{name} overlaps {bname}")
    if shared == -1:
        raise ValueError(f"{name} may overlap {bname}: their strides interleave in a way NumPy could "
                         f"not check within a bounded time; pass {name} and {bname} as separate "
                         f"allocations, or as slices of one buffer along a single axis")
    return 0


cdef int _read_apart(list keep, View *r, str name, const View *w, str wname, str detail="") except -1:
    """A read-only argument must not share memory with an array the call writes: raises
    when it does. When NumPy cannot tell (see _shares), r is pointed at a private copy
    of its elements, which the call keeps."""
    cdef int shared = _shares(r, w)
    if shared == 0:
        return 0
    _in_storage(r, name)     # (a tensor outside its storage is its own fault, and the copy reads r)
    _in_storage(w, wname)
    if shared == 1:
        raise ValueError(f"{name} overlaps {wname}{detail}: the call reads {name} while it writes {wname}; "
                         f"pass a copy of {name} (.copy() or .clone())")
    copy = np.array(_raw(r), order="C")
    keep.append(copy)
    r.ptr = <char *>cnp.PyArray_DATA(<cnp.ndarray>copy)
    r.store = NULL
    cdef int64_t stride = 1
    cdef int i
    for i in range(r.ndim - 1, -1, -1):
        r.strides[i] = stride
        stride *= r.shape[i]
    return 0


cdef int _refuse_autograd(object a, str name) except -1:
    """gdnconv writes outside autograd: a written tensor that requires grad would be
    changed behind its back (torch itself refuses in-place writes to such leaves)."""
    if _is_tensor(a) and a.requires_grad:
        raise ValueError(f"{name} requires grad; gdnconv writes it in place outside autograd: "
                         f"pass {name}.detach(), which shares its memory (torch.no_grad() does not "
                         f"change a tensor's requires_grad)")
    return 0


# ------------------------------------------------------- arguments every op checks

cdef bint _flag(object value, str name) except -1:
    """A bool argument (Python's or NumPy's); TypeError naming it for anything else."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {value!r}")


cdef int _silu_flag(object activation) except -1:
    """1 for SiLU ("silu", "swish", True as vLLM takes), 0 for None/False."""
    if activation is None or activation is False:
        return 0
    if activation is True or activation == "silu" or activation == "swish":
        return 1
    raise ValueError(f"activation must be None, 'silu' or 'swish' (or a bool, as vLLM takes), "
                     f"got {activation!r}")


cdef int64_t _pad_slot(object pad_slot_id) except? -1:
    """pad_slot_id as an int32 value: index arrays are int32, so any other value could
    never mark a request."""
    if isinstance(pad_slot_id, bool) or not isinstance(pad_slot_id, (int, np.integer)):
        raise TypeError(f"pad_slot_id must be an integer, got {pad_slot_id!r}")
    if not -2**31 <= pad_slot_id < 2**31:
        raise ValueError(f"pad_slot_id = {pad_slot_id} is outside the int32 range "
                         f"[{-2**31}, {2**31 - 1}] of the index arrays, so it could never mark a request: "
                         f"pass the value your index arrays use for padding (vLLM: -1)")
    return pad_slot_id


cdef int _weights(list keep, View *wv, View *bv, object weight, object bias, object x, int dt,
                  bint packed) except -1:
    """Views of weight (D, W) and bias (D,) with their checks against x's dtype (keep
    gets what owns their memory), and with packed (is_weight_packed) the checks of vLLM's
    packed layout; returns the weight dtype code."""
    cdef int wdt
    keep.append(_view(weight, wv, "weight"))
    wdt = _dtype_of(wv, weight, "weight")
    if wdt != dt and wdt != GDN_F32:
        fix = ("the packed weight in x's dtype or as float32 (a float32 copy keeps the layout)" if packed else
               "weights of x's dtype, or float32 weights (gdnconv.pack_weight)")
        raise TypeError(f"weight dtype {_dtype_name(weight)} does not match x dtype {_dtype_name(x)}: "
                        f"pass {fix} with a float32 bias")
    if bias is not None:
        keep.append(_view(bias, bv, "bias"))
        if _dtype_of(bv, bias, "bias") != wdt:
            fix = ("a float32 bias" if wdt == GDN_F32 else
                   f"a bias of the weight's dtype, or float32 weights (gdnconv.pack_weight) with it")
            raise TypeError(f"bias dtype {_dtype_name(bias)} does not match weight dtype "
                            f"{_dtype_name(weight)}: pass {fix}")
    if wv.ndim == 3 and wv.shape[1] == 1:
        raise ValueError(f"weight must have shape (D, W), got {tuple(weight.shape)}, the layout of "
                         f"nn.Conv1d's weight (D, 1, W): pass weight.squeeze(1)")
    if wv.ndim != 2:
        raise ValueError(f"weight must have shape (D, W), got {tuple(weight.shape)}")
    if not GDN_MIN_WIDTH <= wv.shape[1] <= GDN_MAX_WIDTH:
        hint = (f": this looks like (W, D); pass weight.T" if GDN_MIN_WIDTH <= wv.shape[0] <= GDN_MAX_WIDTH
                else "")
        raise ValueError(f"width W = weight.shape[1] = {wv.shape[1]} is outside "
                         f"{GDN_MIN_WIDTH}..{GDN_MAX_WIDTH} (weight shape {tuple(weight.shape)}){hint}")
    if packed and (wv.shape[1] != 4 or wv.shape[0] % 32 or (wv.shape[0] > 0 and (wv.strides[0] != 4
                                                                                or wv.strides[1] != 1))):
        got = (f"shape {tuple(weight.shape)}" if wv.shape[1] != 4 or wv.shape[0] % 32 else
               f"a view with strides ({wv.strides[0]}, {wv.strides[1]}) in elements, not contiguous")
        raise ValueError(f"weight with is_weight_packed=True must be in vLLM's packed layout "
                         f"(causal_conv1d_weight_pack's): a contiguous (D, 4) array with D a multiple of 32, "
                         f"got {got}; pass the plain (D, W) weight with is_weight_packed=False")
    if bias is not None and (bv.ndim != 1 or bv.shape[0] != wv.shape[0]):
        raise ValueError(f"bias must have shape ({wv.shape[0]},) to match weight {tuple(weight.shape)}, "
                         f"got {tuple(bias.shape)}")
    return wdt


cdef int _written(const View *v, object a, str name) except -1:
    """Checks on an array the call writes in place: writeable, outside autograd, not an
    inference tensor outside inference mode, every element its own memory."""
    if not v.writeable:
        raise ValueError(f"{name} is read-only: it is written in place (pass a writeable array)")
    _refuse_autograd(a, name)
    if v.torch:
        _refuse_inference(a, name)
    _refuse_self_overlap(v, name)
    return 0


cdef int _refuse_inference(object a, str name) except -1:
    """torch's rule for inference tensors (made under torch.inference_mode()): not
    written in place outside inference mode. Inside it every tensor may be written, which is
    asked first: there (vLLM's steps) the tensors a call writes are often inference tensors,
    whose ``_version`` raises, and torch's exception took ~3.5 us a tensor. Outside it only
    an inference tensor lacks a version counter: reading ``_version`` measured ~70 ns less
    than ``is_inference()``."""
    if _inference_mode():
        return 0
    try:
        a._version
        return 0
    except RuntimeError:
        pass
    if a.is_inference():
        raise ValueError(f"{name} is an inference tensor (made under torch.inference_mode()) and gdnconv "
                         f"writes it in place, which torch allows only inside inference mode: make the "
                         f"call inside torch.inference_mode() as well, or pass a normal tensor "
                         f"({name}.clone() outside inference mode gives one to use from then on)")
    return 0


cdef int _in_storage(const View *v, str name) except -1:
    """A torch tensor's view must lie within its storage, as torch's own ops require:
    a storage shrunk by ``untyped_storage().resize_()``, before the call or by torch
    code the call ran after taking the pointer (a subclass's or mode's
    __torch_function__), would leave the kernel reading or writing freed memory. Run
    after the last step of a call that can run user code; reads the storage's C
    methods only (no torch function, so no override runs)."""
    cdef int64_t base, nbytes, lo, hi
    cdef uintptr_t vlo, vhi
    if v.store == NULL:
        return 0
    _extent(v, &vlo, &vhi)
    if vlo == vhi:
        return 0
    store = <object>v.store
    nbytes = len(store)
    base = store.data_ptr()
    lo = <int64_t>vlo - base
    hi = <int64_t>vhi - base
    if lo < 0 or hi > nbytes:
        _raise_outside_storage(name, lo, hi, nbytes)
    return 0


cdef int _raise_outside_storage(str name, int64_t lo, int64_t hi, int64_t nbytes) except -1:
    raise ValueError(f"{name} lies outside its storage: its elements span bytes {lo}..{hi} of a "
                     f"storage of {nbytes} bytes (shrunk by untyped_storage().resize_(), before the "
                     f"call or by a __torch_function__ override during it?); torch refuses such a "
                     f"tensor too: pass one whose storage holds it")


cdef int _state_dims(const View *sv, object conv_state, int64_t D, bint vllm=False) except -1:
    """conv_state must be (num_slots, state_len, D) with weight's D ((num_slots, D, state_len)
    in vLLM's order, which sv already shows as gdnconv's)."""
    if sv.ndim != 3:
        layout = "(num_cache_lines, dim, state_len)" if vllm else "(num_slots, state_len, D)"
        raise ValueError(f"conv_state must have shape {layout}, got {tuple(conv_state.shape)}")
    if sv.shape[2] != D:
        hint = (f": a (num_slots, D, state_len) state (vLLM's DS layout, transformers' cache) is passed "
                f"as conv_state.transpose(1, 2)" if sv.shape[1] == D and not vllm else "")
        raise ValueError(f"conv_state dim {sv.shape[2]} (shape {tuple(conv_state.shape)}) does not "
                         f"match weight dim {D}{hint}")
    return 0
