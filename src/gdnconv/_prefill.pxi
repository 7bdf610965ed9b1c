# The conv prefill op (vLLM's causal_conv1d_fn): its checks (the shared ones of
# _checks.pxi plus its own), its params filled in one place (_prefill_params), the
# call, and the byte model.

cdef class _Prefill:
    """One prefill call as the kernel sees it: the views of its arguments, the objects
    that own their memory (kept until the kernel returns), and its params."""
    cdef gdn_prefill_params p
    cdef View xv, sv, wv, bv, ov, iv, qv, rv
    cdef list keep
    cdef object flags           # has_initial_state as a private (B,) uint8 copy, or None
    cdef object snaps           # snapshots as a private (K, 3) int32 copy, or None
    cdef bint out_is_x, varlen, has_state
    cdef bint packed            # is_weight_packed: the weight in vLLM's packed layout
    cdef bint vllm              # arguments in vLLM's order (gdnconv.vllm): x and out (D, N), state (S, D, L)
    cdef int64_t B, T, N, S, L, D, W, pad_slot_id
    cdef int dt, wdt, silu

    def __cinit__(self):
        self.keep = []


cdef object _flag_source(object a, str name):
    """has_initial_state as a private 1-D uint8 0/1 array (true = nonzero), or None;
    converted (user code runs) before the call takes any pointer, and a copy, so it
    overlaps nothing the call writes."""
    if a is None:
        return None
    if _is_tensor(a):
        if not a.is_cpu:
            raise ValueError(f"{name} must be a CPU tensor, got device {a.device}")
        if a.dtype.is_floating_point or a.dtype.is_complex:
            raise TypeError(f"{name} must be a bool or integer array, got dtype {_dtype_name(a)}")
        a = _tensor_copy(a, name)
    a = _sequence_array(a, np.bool_)
    if a.dtype.kind not in "biu":
        raise TypeError(f"{name} must be a bool or integer array, got dtype {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D (B,), got shape {a.shape}")
    return np.ascontiguousarray(a != 0).view(np.uint8)


cdef object _snapshot_source(object a):
    """snapshots as a private C-contiguous (K, 3) int32 copy (rows: request, tokens, slot), or
    None; converted (user code runs) before the call takes any pointer, and a copy, so it
    overlaps nothing the call writes."""
    if a is None:
        return None
    if _is_tensor(a):
        if not a.is_cpu:
            raise ValueError(f"snapshots must be a CPU tensor, got device {a.device}")
        if a.dtype.is_floating_point or a.dtype.is_complex or a.dtype is _torch.bool:
            raise TypeError(f"snapshots must be an integer array, got dtype {_dtype_name(a)}")
        a = a.numpy(force=True)
    a = np.asarray(a)
    if a.size == 0:
        a = a.reshape(0, 3).astype(np.int32)
    if a.dtype.kind not in "iu":
        raise TypeError(f"snapshots must be an integer array, got dtype {a.dtype}")
    if a.ndim != 2 or a.shape[1] != 3:
        raise ValueError(f"snapshots must be (K, 3) rows (request, tokens, slot), got shape {a.shape}")
    if a.size and (a.min() < -2**31 or a.max() >= 2**31):
        raise ValueError(f"snapshots has values outside the int32 range: min {a.min()}, max {a.max()}")
    return np.array(a, dtype=np.int32, order="C")


cdef int _check_prefill(_Prefill c, x, weight, bias, activation, conv_state, query_start_loc,
                        cache_indices, has_initial_state, pad_slot_id, out, initial_state_indices=None,
                        snapshots=None) except -1:
    """Every check of the prefill that needs no index value, but the storage checks
    (_prefill_storage, once the call runs no more user code); nothing is written. All
    arguments must come from _input_array / _index_source / _flag_source."""
    cdef int64_t B, T = 0, N = 0, D, W, L = 0, S = 0
    c.silu = _silu_flag(activation)
    c.pad_slot_id = _pad_slot(pad_slot_id)
    c.has_state = conv_state is not None
    if not c.has_state:
        for arg, name in ((cache_indices, "cache_indices"), (has_initial_state, "has_initial_state"),
                          (initial_state_indices, "initial_state_indices"), (snapshots, "snapshots")):
            if arg is not None:
                raise ValueError(f"{name} is given without conv_state: pass the conv_state it refers to, "
                                 f"or {name}=None for a convolution without state")

    # ---- arrays and dtypes
    c.keep.append(_view(x, &c.xv, "x"))
    _vllm_tokens(&c.xv, c.vllm)
    c.dt = _dtype_of(&c.xv, x, "x")
    if c.has_state:
        c.keep.append(_view(conv_state, &c.sv, "conv_state"))
        _vllm_order(&c.sv, c.vllm)
        if _dtype_of(&c.sv, conv_state, "conv_state") != c.dt:
            raise TypeError(f"conv_state dtype {_dtype_name(conv_state)} does not match x dtype {_dtype_name(x)}")
    else:   # an empty view: overlaps nothing
        memset(&c.sv, 0, sizeof(View))
        c.sv.ndim = 3
        c.sv.itemsize = c.xv.itemsize
    c.wdt = _weights(c.keep, &c.wv, &c.bv, weight, bias, x, c.dt, c.packed)
    if out is not None:
        c.keep.append(_view(out, &c.ov, "out"))
        _vllm_tokens(&c.ov, c.vllm)
        if _dtype_of(&c.ov, out, "out") != c.dt:
            raise TypeError(f"out dtype {_dtype_name(out)} does not match x dtype {_dtype_name(x)}")

    # ---- shapes
    D = c.wv.shape[0]
    W = c.wv.shape[1]
    if c.xv.ndim in (2, 3) and c.xv.shape[c.xv.ndim - 1] != D:
        hint = ("" if c.vllm else
                f": x looks like vLLM's (D, N) layout; pass x.T (a free view, the fast layout)"
                if c.xv.ndim == 2 and c.xv.shape[0] == D else
                f": x looks like vLLM's Triton layout (B, D, T); pass x.transpose(1, 2)"
                if c.xv.ndim == 3 and c.xv.shape[1] == D else "")
        layout = "(dim, num_tokens)" if c.vllm else "(N, D) or (B, T, D), channels last"
        raise ValueError(f"x dim {c.xv.shape[c.xv.ndim - 1]} (shape {tuple(x.shape)}) does not match "
                         f"weight dim {D} (weight shape {tuple(weight.shape)}): x is {layout}{hint}")
    if c.has_state:
        _state_dims(&c.sv, conv_state, D, c.vllm)
        S = c.sv.shape[0]
        L = c.sv.shape[1]
        _written(&c.sv, conv_state, "conv_state")
        if L < W - 1:
            raise ValueError(f"state_len = conv_state.shape[{2 if c.vllm else 1}] = {L} is too small: "
                             f"conv_prefill keeps the last width - 1 = {W - 1} inputs there (state_len >= {W - 1})")
    if c.xv.ndim == 3:
        if query_start_loc is not None:
            raise ValueError(f"x must be 2-D (N, D) with query_start_loc, got shape {tuple(x.shape)}")
        B = c.xv.shape[0]
        T = c.xv.shape[1]
    elif c.xv.ndim == 2:
        if query_start_loc is None:
            raise ValueError(f"x of shape {tuple(x.shape)} is (N, D) and needs query_start_loc (B + 1,); "
                             f"for one sequence of N tokens pass x[None] ((1, N, D)) or "
                             f"query_start_loc=[0, N]")
        N = c.xv.shape[0]
        B = _index_len(query_start_loc, "query_start_loc") - 1
        if B < 0:
            raise ValueError("query_start_loc must have B + 1 >= 1 entries, got 0")
    else:
        raise ValueError(f"x must be (N, D) with query_start_loc, or (B, T, D), got shape {tuple(x.shape)}")
    c.out_is_x = False
    if out is not None:
        if not _same_shape(&c.ov, &c.xv):
            raise ValueError(f"out shape {tuple(out.shape)} does not match x shape {tuple(x.shape)}")
        _written(&c.ov, out, "x" if out is x else "out")   # (out=x: x is what is written)
        c.out_is_x = _same_view(&c.ov, &c.xv)

    # ---- index arrays
    if query_start_loc is not None:
        c.keep.append(_index_array(query_start_loc, "query_start_loc", B + 1, &c.qv))
    if cache_indices is not None:
        c.keep.append(_index_array(cache_indices, "cache_indices", B, &c.iv))
    elif c.has_state and B > S:
        raise ValueError(f"batch {B} needs cache_indices: conv_state has only {S} slots")
    if has_initial_state is not None and has_initial_state.shape[0] != B:
        raise ValueError(f"has_initial_state must have shape ({B},), got {has_initial_state.shape}")
    c.flags = has_initial_state
    if initial_state_indices is not None:
        c.keep.append(_index_array(initial_state_indices, "initial_state_indices", B, &c.rv))
    c.snaps = snapshots

    _prefill_apart(c, out is not None, not c.out_is_x)

    c.B, c.T, c.N, c.S, c.L, c.D, c.W = B, T, N, S, L, D, W
    c.varlen = query_start_loc is not None
    return 0


cdef int _prefill_storage(_Prefill c) except -1:
    """Every tensor view within its storage (absent arguments have empty views); run
    after the last step of the call that can run user code (x's copy, the new out)."""
    _in_storage(&c.xv, "x")
    _in_storage(&c.sv, "conv_state")
    _in_storage(&c.wv, "weight")
    _in_storage(&c.bv, "bias")
    _in_storage(&c.ov, "out")
    _in_storage(&c.iv, "cache_indices")
    _in_storage(&c.qv, "query_start_loc")
    _in_storage(&c.rv, "initial_state_indices")
    return 0


cdef int _prefill_apart(_Prefill c, bint has_out, bint x_vs_out) except -1:
    """Aliasing: what is written (conv_state, out) must not share memory with what is read,
    nor with each other (see _update_apart: run on the caller's arguments, and again on x's
    copy or the new out the call made)."""
    if has_out:
        _refuse_shared(&c.ov, "out", &c.sv, "conv_state")
        if x_vs_out:
            _read_apart(c.keep, &c.xv, "x", &c.ov, "out", " without being out")
    _read_apart(c.keep, &c.xv, "x", &c.sv, "conv_state")
    _prefill_keep_apart(c, &c.wv, "weight", has_out)
    _prefill_keep_apart(c, &c.bv, "bias", has_out)
    _prefill_keep_apart(c, &c.iv, "cache_indices", has_out)
    _prefill_keep_apart(c, &c.qv, "query_start_loc", has_out)
    _prefill_keep_apart(c, &c.rv, "initial_state_indices", has_out)
    return 0


cdef int _prefill_keep_apart(_Prefill c, View *r, str name, bint has_out) except -1:
    """A read-only argument must not share memory with conv_state or out (see _read_apart)."""
    _read_apart(c.keep, r, name, &c.sv, "conv_state")
    if has_out:
        _read_apart(c.keep, r, name, &c.ov, "out")
    return 0


cdef int _prefill_params(_Prefill c, bint has_bias, bint has_idx, bint zero_skipped, bint has_isi=False) except -1:
    """The one place the prefill's params are filled, from the checked views (x and out
    final), then the index arrays validated in C; nothing is written."""
    cdef gdn_update_params *p = &c.p.conv
    cdef int64_t bad_i = 0, bad_v = 0
    memset(&c.p, 0, sizeof(gdn_prefill_params))
    p.batch, p.dim, p.width, p.state_len, p.num_slots, p.seqlen = c.B, c.D, c.W, c.L, c.S, c.T
    p.pad_slot_id = c.pad_slot_id
    p.dtype, p.weight_dtype, p.silu = c.dt, c.wdt, c.silu
    p.skipped_rows = GDN_SKIPPED_ZERO if zero_skipped else GDN_SKIPPED_KEEP
    p.x = c.xv.ptr
    _rows(&c.xv, c.varlen, &p.x_stride_b, &p.x_stride_t, &p.x_stride_d)
    p.out = c.ov.ptr
    _rows(&c.ov, c.varlen, &p.out_stride_b, &p.out_stride_t, &p.out_stride_d)
    if c.has_state:
        p.conv_state = c.sv.ptr
        p.state_stride_s, p.state_stride_l, p.state_stride_d = c.sv.strides[0], c.sv.strides[1], c.sv.strides[2]
    p.weight = c.wv.ptr
    p.weight_stride_d, p.weight_stride_w = c.wv.strides[0], c.wv.strides[1]
    p.is_weight_packed = c.packed
    if has_bias:
        p.bias = c.bv.ptr
        p.bias_stride = c.bv.strides[0]
    if c.varlen:
        p.query_start_loc = <const int32_t *>c.qv.ptr
    if has_idx:
        p.conv_state_indices = <const int32_t *>c.iv.ptr
    if c.flags is not None:
        c.p.has_initial_state = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>c.flags)
    if has_isi:
        p.initial_state_indices = <const int32_t *>c.rv.ptr
    if c.snaps is not None:
        c.p.snapshots = <const int32_t *>cnp.PyArray_DATA(<cnp.ndarray>c.snaps)
        c.p.num_snapshots = c.snaps.shape[0]
    rc = gdn_prefill_validate(&c.p, c.N, &bad_i, &bad_v)
    if rc != GDN_OK:
        _raise_index_error(rc, bad_i, bad_v, p, c.N, "cache_indices")
    return 0


# a C function with an inspectable signature: torch.compile traces it as the gdnconv:: op (gdnconv._compile)
@cython.binding(False)
@cython.embedsignature(True)
@cython.embedsignature.format("clinic")
def conv_prefill(x, weight, bias=None, *, activation="silu", conv_state=None, query_start_loc=None,
                 cache_indices=None, has_initial_state=None, pad_slot_id=-1, out=None, num_threads=None,
                 initial_state_indices=None, snapshots=None, is_weight_packed=False):
    """Causal conv1d over whole prompts (prefill), seeding each request's conv state.

    Semantics follow vLLM's ``causal_conv1d_fn`` (its CPU op ``causal_conv1d_fwd_cpu``);
    the float64 ``gdnconv.reference.conv_prefill_ref`` spells them out. For request ``i``
    with tokens ``x_i`` (``T_i`` rows) and slot ``s = cache_indices[i]``, the history
    ``h`` is ``conv_state[s, 0:W-1]`` when ``has_initial_state[i]`` is true, else ``W-1``
    zero rows (the slot is then not read: stale or NaN content cannot leak), and
    ``out[t, d] = act(bias[d] + sum_k weight[d, k] * (h ++ x_i)[t + k, d])``, accumulated
    in float32 in the update's tap order and rounded once: ``conv_update_multi``'s
    outputs for the same window, bit for bit on the same ISA. Afterwards
    ``conv_state[s, 0:W-1]`` holds the last ``W-1`` rows of ``h ++ x_i`` (bit-exact
    copies; rows past ``W-2`` untouched), what plain ``conv_update_multi`` leaves, so
    decode and speculative updates continue from it directly.

    Args:
        x: ``(N, D)`` tokens of all requests end to end, with ``query_start_loc``; or
            ``(B, T, D)`` for requests of equal length. float32, float16 or bfloat16
            (``ml_dtypes.bfloat16`` for NumPy), any strides; channel stride 1 takes the
            SIMD kernel, other strides the portable one. vLLM holds ``x`` as ``(D, N)``,
            a transposed view of ``(N, D)`` memory: pass ``x.T`` (a free view with
            channel stride 1, the fast layout), and ``out.T`` likewise. Read only.
        weight: ``(D, W)`` taps, ``2 <= W <= 8``; ``x``'s dtype or float32.
        bias: ``(D,)`` of ``weight``'s dtype, or None.
        activation: None, ``"silu"`` or ``"swish"``; True/False as in vLLM.
        conv_state: ``(S, L, D)`` with ``L >= W - 1``, ``x``'s dtype, updated in place
            (never copied); any strides (vLLM's ``(S, D, L)`` storage passed as
            ``conv_state.transpose(1, 2)``). None: a convolution from zero history
            that writes no state (``cache_indices`` and ``has_initial_state`` must then
            be None).
        query_start_loc: ``(B + 1,)`` integer offsets of each request's rows in ``x``
            (0, non-decreasing, ending at ``N``); ``T_i = 0`` is allowed.
        cache_indices: ``(B,)`` integer slot per request (vLLM's name for
            ``conv_state_indices``); default ``arange(B)``. A request whose slot is
            ``pad_slot_id`` is skipped: nothing read or written, its ``out`` rows zeros
            in a new ``out`` and untouched in a given one. Live slots must differ.
        has_initial_state: ``(B,)`` bool (or integer, nonzero = true); None: no
            request has one.
        pad_slot_id: slot value that marks padding (default -1), within int32.
        out: optional array of ``x``'s shape and dtype, any strides; may be ``x``
            itself (``x`` is then read from a temporary copy).
        num_threads: threads for this call, used as asked. Default:
            ``get_num_threads()``, fewer while calls on this thread wait for threads
            the scheduler parked (see ``thread_contention()``). Long
            prompts are split along time, so one prompt uses every thread; the results
            do not depend on the thread count, bit for bit; small calls run on the
            calling thread.
        initial_state_indices: ``(B,)`` integer slot each request's history is read
            from where ``has_initial_state[i]`` (prefix caching: the block holding the
            cached state); the final state is written to ``cache_indices[i]``. None:
            read where written. A read slot must be in range and not written by
            another request of the call (several requests may read one).
        snapshots: ``(K, 3)`` integer rows ``(i, p, s)``, sorted by ``i``: afterwards
            rows ``0..W-2`` of slot ``s`` hold the state after request ``i``'s first
            ``p`` tokens (the last ``W-1`` rows of ``h ++ x_i[:p]``, raw bits; rows past
            ``W-2`` untouched), ``1 <= p <= T_i``, request ``i`` live. Every written
            slot (``cache_indices`` and snapshot slots) takes one state, and none is
            another request's read slot; a snapshot may go to the request's own read
            slot (read first). vLLM's prefix caching maps as: for block size ``b`` and
            ``n = num_computed_tokens[i]``, the boundaries ``p = k b - n`` with
            ``0 < p < T_i`` go to ``idx[i, block_idx_first_scheduled_token[i] + j]``
            in order (``gdnconv.vllm`` builds the rows).
        is_weight_packed: True when ``weight`` is in vLLM's packed layout (see
            ``conv_update_multi``): a contiguous ``(D, 4)`` array, ``D`` a multiple
            of 32; converted once per call, the outputs the plain weight's.

    Returns:
        ``out`` (a new NumPy array or torch tensor like ``x`` when not given).

    Raises:
        TypeError: an argument is not an array/tensor (``x`` and the index arguments
            may be sequences NumPy converts; an empty list is an empty index
            array), dtypes unsupported or mixed, index arrays not integer
            (``has_initial_state``: not bool or integer).
        ValueError: wrong rank or shape, ``D``/``W`` mismatch, width outside 2..8,
            ``state_len < W - 1``, a 2-D ``x`` without ``query_start_loc``, bad
            ``query_start_loc``, slot out of range or used twice, ``cache_indices``
            or ``has_initial_state`` without ``conv_state``, read-only or
            self-overlapping ``conv_state``/``out``, ``out`` overlapping
            ``conv_state`` (or ``x`` without being ``x``), ``x``, ``weight``,
            ``bias`` or an index array overlapping ``conv_state`` or ``out``,
            non-CPU tensors, a tensor whose view lies outside its storage (a
            storage shrunk with ``untyped_storage().resize_()``, before the call or
            by a ``__torch_function__`` override during it), an inference tensor
            ``conv_state``/``out`` outside ``torch.inference_mode()``, ``pad_slot_id``
            outside the int32 range, ``initial_state_indices`` or ``snapshots`` not
            as described above (or given without ``conv_state``), a weight with
            ``is_weight_packed=True`` that is not a contiguous ``(D, 4)`` array with
            ``D`` a multiple of 32.
        MemoryError: no memory for the weight conversion.
        Nothing is written when an exception is raised.
    """
    cdef _Prefill c = _Prefill()
    c.packed = _flag(is_weight_packed, "is_weight_packed")
    return _prefill(c, x, weight, bias, activation, conv_state, query_start_loc, cache_indices,
                    has_initial_state, pad_slot_id, out, num_threads, initial_state_indices, snapshots)


# a C function with an inspectable signature, traced as gdnconv.vllm._prefill_vllm_traced (gdnconv._compile)
@cython.binding(False)
@cython.embedsignature(True)
@cython.embedsignature.format("clinic")
def _conv_prefill_vllm(x, weight, bias=None, *, activation=None, conv_state=None, query_start_loc=None,
                       cache_indices=None, has_initial_state=None, pad_slot_id=-1, initial_state_indices=None,
                       snapshots=None, is_weight_packed=False):
    """conv_prefill on tensors in vLLM's order (gdnconv.vllm): x (D, N), conv_state (S, D, L);
    read as gdnconv's views, no transposed tensors made. Returns a new (D, N) tensor whose
    memory is (N, D), channels last. Errors name the caller's shapes."""
    cdef _Prefill c = _Prefill()
    c.packed = _flag(is_weight_packed, "is_weight_packed")
    c.vllm = True
    return _prefill(c, x, weight, bias, activation, conv_state, query_start_loc, cache_indices,
                    has_initial_state, pad_slot_id, None, None, initial_state_indices, snapshots)


cdef inline void _vllm_tokens(View *v, bint vllm) noexcept:
    """vLLM's (D, N) prefill tokens as gdnconv's (N, D) view."""
    if vllm and v.ndim == 2:
        _swap_axes(v, 0, 1)


cdef object _prefill(_Prefill c, x, weight, bias, activation, conv_state, query_start_loc, cache_indices,
                     has_initial_state, pad_slot_id, out, num_threads, initial_state_indices, snapshots):
    """The body of conv_prefill (and of the vLLM-order entry)."""
    cdef int nthreads = _call_threads(num_threads)
    cdef int rc
    cdef View raw
    # convert first: user code (__array__) must not run once pointers are taken
    x = _input_array(x, "x")
    weight = _native(weight)
    bias = _native(bias)
    cache_indices = _index_source(cache_indices, "cache_indices", c.keep)
    query_start_loc = _index_source(query_start_loc, "query_start_loc", c.keep)
    has_initial_state = _flag_source(has_initial_state, "has_initial_state")
    initial_state_indices = _index_source(initial_state_indices, "initial_state_indices", c.keep)
    snapshots = _snapshot_source(snapshots)
    _check_prefill(c, x, weight, bias, activation, conv_state, query_start_loc, cache_indices,
                   has_initial_state, pad_slot_id, out, initial_state_indices, snapshots)
    copied = c.out_is_x
    if copied:
        # a time chunk reads its window from x rows that earlier outputs would overwrite
        copy = x.clone() if c.xv.torch else np.array(x, order="C")
        raw = c.xv
        _vllm_tokens(&raw, c.vllm)          # x's view in the caller's order, as the copy's
        c.keep.append(_made(copy, &c.xv, &raw, x, "x"))
        _vllm_tokens(&c.xv, c.vllm)
        x = copy
    new_out = out is None
    if new_out:
        if c.vllm and not _c_contiguous(&c.xv):   # (D, N) over (N, D) memory
            out = _reused_like(x, &c.xv, (c.N, c.D)) if type(x) is _tensor_type else None
            out = (_torch.empty_strided((c.D, c.N), (1, c.D), dtype=x.dtype) if out is None else out.t())
        else:
            out = _new_like(x, &c.xv)
        raw = c.xv
        _vllm_tokens(&raw, c.vllm)
        c.keep.append(_made(out, &c.ov, &raw, x, "out"))
        _vllm_tokens(&c.ov, c.vllm)
    if new_out or copied:
        _prefill_apart(c, True, True)
    if new_out:
        _advise_huge(&c.ov)
    _prefill_storage(c)   # no user code runs from here on
    _prefill_params(c, bias is not None, cache_indices is not None, new_out, initial_state_indices is not None)
    with nogil:
        rc = gdn_prefill_run(&c.p, nthreads)
    if rc == GDN_ERR_NO_MEMORY:
        raise MemoryError("no memory for conv_prefill's weight conversion")
    return out


def prefill_bytes_moved(x, weight, *, conv_state=None, query_start_loc=None, cache_indices=None,
                        has_initial_state=None, pad_slot_id=-1, initial_state_indices=None, snapshots=None):
    """Bytes the performance model counts for this ``conv_prefill`` call (int), for
    benchmarks.

    ``e * D * sum_i (2 T_i + (W - 1) [history read, when has_initial_state[i]] + (W - 1)
    [state written, with conv_state] + (W - 1) [a history copied from another slot])`` over
    requests that are not skipped (``e`` bytes per element), plus ``(W - 1) e D`` per
    snapshot and ``D * W`` weight elements. Checks the arguments as
    ``conv_prefill`` does (same exceptions) and reads nothing but the index arrays.
    """
    cdef _Prefill c = _Prefill()
    x = _input_array(x, "x")
    weight = _native(weight)
    cache_indices = _index_source(cache_indices, "cache_indices", c.keep)
    query_start_loc = _index_source(query_start_loc, "query_start_loc", c.keep)
    has_initial_state = _flag_source(has_initial_state, "has_initial_state")
    initial_state_indices = _index_source(initial_state_indices, "initial_state_indices", c.keep)
    snapshots = _snapshot_source(snapshots)
    _check_prefill(c, x, weight, None, None, conv_state, query_start_loc, cache_indices, has_initial_state,
                   pad_slot_id, None, initial_state_indices, snapshots)
    _prefill_storage(c)
    c.ov = c.xv
    _prefill_params(c, False, cache_indices is not None, False, initial_state_indices is not None)
    return gdn_prefill_bytes(&c.p)
