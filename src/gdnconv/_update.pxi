# The conv update op (vLLM's causal_conv1d_update): its checks, its params filled in
# one place (_update_params), the call, and the byte model.

cdef class _Update:
    """One update call as the kernel sees it: the views of its arguments, the objects
    that own their memory (kept until the kernel returns), and its params."""
    cdef gdn_update_params p
    cdef View xv, sv, wv, bv, ov, iv, nv, qv, rv
    cdef list keep
    cdef bint out_is_x, varlen
    cdef bint packed            # is_weight_packed: the weight in vLLM's packed layout
    cdef bint vllm              # arguments in vLLM's order (gdnconv.vllm): state (S, D, L), x (B, D, T)
    cdef bint vllm_x            # x and out in vLLM's (B, D, T) order (vllm, but for vLLM's C++ op's (B, T, D))
    cdef bint skipped_from_x    # out rows of skipped (pad-slot) requests take x's values
    cdef int64_t B, T, N, S, L, D, W, pad_slot_id
    cdef int dt, wdt, silu

    def __cinit__(self):
        self.keep = []


cdef inline void _swap_axes(View *v, int a, int b) noexcept:
    """v as the view with axes a and b exchanged (no copy): how vLLM-order tensors become
    gdnconv's (S, L, D) state and (B, T, D) / (N, D) tokens."""
    v.shape[a], v.shape[b] = v.shape[b], v.shape[a]
    v.strides[a], v.strides[b] = v.strides[b], v.strides[a]


cdef inline void _vllm_order(View *v, bint vllm) noexcept:
    """A 3-D view in vLLM's order ((S, D, L) state, (B, D, T) tokens) as gdnconv's."""
    if vllm and v.ndim == 3:
        _swap_axes(v, 1, 2)


cdef int _check_update(_Update c, x, conv_state, weight, bias, activation, num_accepted_tokens,
                       conv_state_indices, query_start_loc, pad_slot_id, out,
                       initial_state_indices=None) except -1:
    """Every check of the update that needs no index value, but the storage checks
    (_update_storage, once the call runs no more user code); nothing is written. All
    arguments must come from _input_array / _index_source (only torch overrides run
    user code here)."""
    cdef int64_t B, T = 1, N = 0, D, W, L, S
    c.silu = _silu_flag(activation)
    c.pad_slot_id = _pad_slot(pad_slot_id)

    # ---- arrays and dtypes
    c.keep.append(_view(x, &c.xv, "x"))
    c.keep.append(_view(conv_state, &c.sv, "conv_state"))
    _vllm_order(&c.xv, c.vllm_x)
    _vllm_order(&c.sv, c.vllm)
    c.dt = _dtype_of(&c.xv, x, "x")
    if _dtype_of(&c.sv, conv_state, "conv_state") != c.dt:
        raise TypeError(f"conv_state dtype {_dtype_name(conv_state)} does not match x dtype {_dtype_name(x)}")
    c.wdt = _weights(c.keep, &c.wv, &c.bv, weight, bias, x, c.dt, c.packed)
    if out is x:         # written in place (gdnconv.vllm's out=None): x's view, read once
        c.ov = c.xv
    elif out is not None:
        c.keep.append(_view(out, &c.ov, "out"))
        _vllm_order(&c.ov, c.vllm_x)
        if _dtype_of(&c.ov, out, "out") != c.dt:
            raise TypeError(f"out dtype {_dtype_name(out)} does not match x dtype {_dtype_name(x)}")

    # ---- shapes
    D = c.wv.shape[0]
    W = c.wv.shape[1]
    if c.xv.ndim in (2, 3) and c.xv.shape[c.xv.ndim - 1] != D:
        hint = (f": x looks like vLLM's Triton layout (B, D, T); pass x.transpose(1, 2)"
                if c.xv.ndim == 3 and c.xv.shape[1] == D and not c.vllm else "")
        layout = ("(batch, dim), (batch, dim, seqlen) or (num_tokens, dim)" if c.vllm_x else
                  "(batch, dim) or (batch, seqlen, dim), channels last" if c.vllm else
                  "(B, T, D), (B, D) or (N, D), channels last")
        raise ValueError(f"x dim {c.xv.shape[c.xv.ndim - 1]} (shape {tuple(x.shape)}) does not match "
                         f"weight dim {D} (weight shape {tuple(weight.shape)}): x is {layout}{hint}")
    _state_dims(&c.sv, conv_state, D, c.vllm)
    S = c.sv.shape[0]
    L = c.sv.shape[1]
    _written(&c.sv, conv_state, "conv_state")
    if c.xv.ndim == 3:
        if query_start_loc is not None:
            raise ValueError(f"x must be 2-D (N, D) with query_start_loc, got shape {tuple(x.shape)}")
        B = c.xv.shape[0]
        T = c.xv.shape[1]
    elif c.xv.ndim == 2:
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
        raise ValueError(f"state_len = conv_state.shape[{2 if c.vllm else 1}] = {L} is too small: {mode} "
                         f"needs state_len >= width - 1 = {W - 1}")
    c.out_is_x = False
    if out is not None:
        if not _same_shape(&c.ov, &c.xv):
            raise ValueError(f"out shape {tuple(out.shape)} does not match x shape {tuple(x.shape)}")
        _written(&c.ov, out, "x" if out is x else "out")   # (out=x: x is what is written)
        c.out_is_x = _same_view(&c.ov, &c.xv)

    # ---- index arrays
    if query_start_loc is not None:
        c.keep.append(_index_array(query_start_loc, "query_start_loc", B + 1, &c.qv))
    if conv_state_indices is not None:
        c.keep.append(_index_array(conv_state_indices, "conv_state_indices", B, &c.iv))
    elif B > S:
        raise ValueError(f"batch {B} needs conv_state_indices: conv_state has only {S} slots")
    if num_accepted_tokens is not None:
        c.keep.append(_index_array(num_accepted_tokens, "num_accepted_tokens", B, &c.nv))
    if initial_state_indices is not None:
        c.keep.append(_index_array(initial_state_indices, "initial_state_indices", B, &c.rv))

    _update_apart(c, out is not None, "x" if out is x else "out", not c.out_is_x)

    c.B, c.T, c.N, c.S, c.L, c.D, c.W = B, T, N, S, L, D, W
    c.varlen = query_start_loc is not None
    return 0


cdef int _update_storage(_Update c) except -1:
    """Every tensor view within its storage (absent arguments have empty views); run
    after the last step of the call that can run user code (x's copy, the new out)."""
    _in_storage(&c.xv, "x")
    _in_storage(&c.sv, "conv_state")
    _in_storage(&c.wv, "weight")
    _in_storage(&c.bv, "bias")
    if not (c.out_is_x and c.ov.store == c.xv.store):    # (else checked as x)
        _in_storage(&c.ov, "out")
    _in_storage(&c.iv, "conv_state_indices")
    _in_storage(&c.nv, "num_accepted_tokens")
    _in_storage(&c.qv, "query_start_loc")
    _in_storage(&c.rv, "initial_state_indices")
    return 0


cdef int _update_apart(_Update c, bint has_out, str out_name, bint x_vs_out) except -1:
    """Aliasing: what is written (conv_state, out) must not share memory with what is read,
    nor with each other (a read-only argument NumPy cannot decide within a bounded search is
    read from a copy; absent arguments have empty views). Run on the caller's arguments, and
    again on x's copy or the new out the call made (a __torch_function__ override of
    contiguous or empty_like may return any memory)."""
    if has_out:
        _refuse_shared(&c.ov, out_name, &c.sv, "conv_state")
        if x_vs_out:
            _read_apart(c.keep, &c.xv, "x", &c.ov, "out", " without being out")
    _read_apart(c.keep, &c.xv, "x", &c.sv, "conv_state")
    _keep_apart(c, &c.wv, "weight", has_out)
    _keep_apart(c, &c.bv, "bias", has_out)
    _keep_apart(c, &c.iv, "conv_state_indices", has_out)
    _keep_apart(c, &c.nv, "num_accepted_tokens", has_out)
    _keep_apart(c, &c.qv, "query_start_loc", has_out)
    _keep_apart(c, &c.rv, "initial_state_indices", has_out)
    return 0


cdef int _keep_apart(_Update c, View *r, str name, bint has_out) except -1:
    """A read-only argument must not share memory with conv_state or out (see _read_apart)."""
    _read_apart(c.keep, r, name, &c.sv, "conv_state")
    if has_out:
        _read_apart(c.keep, r, name, &c.ov, "out")
    return 0


cdef void _rows(const View *v, bint varlen, int64_t *sb, int64_t *st, int64_t *sd) noexcept:
    """Strides (request, token, channel) of x or out: (B, T, D), (N, D) with
    row = query_start_loc[i] + t, or (B, D) with one token per request."""
    if v.ndim == 3:
        sb[0], st[0], sd[0] = v.strides[0], v.strides[1], v.strides[2]
    elif varlen:
        sb[0], st[0], sd[0] = 0, v.strides[0], v.strides[1]
    else:
        sb[0], st[0], sd[0] = v.strides[0], 0, v.strides[1]


cdef int _update_params(_Update c, bint has_bias, bint has_idx, bint has_nat, bint new_out,
                        bint has_isi=False) except -1:
    """The one place the update's params are filled, from the checked views (x and
    out final), then the index arrays validated in C; nothing is written."""
    cdef gdn_update_params *p = &c.p
    cdef int64_t bad_i = 0, bad_v = 0
    memset(p, 0, sizeof(gdn_update_params))
    p.batch, p.dim, p.width, p.state_len, p.num_slots, p.seqlen = c.B, c.D, c.W, c.L, c.S, c.T
    p.pad_slot_id = c.pad_slot_id
    p.dtype, p.weight_dtype, p.silu = c.dt, c.wdt, c.silu
    p.skipped_rows = GDN_SKIPPED_X if c.skipped_from_x else GDN_SKIPPED_ZERO if new_out else GDN_SKIPPED_KEEP
    p.x = c.xv.ptr
    _rows(&c.xv, c.varlen, &p.x_stride_b, &p.x_stride_t, &p.x_stride_d)
    p.out = c.ov.ptr
    _rows(&c.ov, c.varlen, &p.out_stride_b, &p.out_stride_t, &p.out_stride_d)
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
    if has_nat:
        p.num_accepted_tokens = <const int32_t *>c.nv.ptr
    if has_isi:
        p.initial_state_indices = <const int32_t *>c.rv.ptr
    rc = gdn_update_validate(p, c.N, &bad_i, &bad_v)
    if rc != GDN_OK:
        _raise_index_error(rc, bad_i, bad_v, p, c.N)
    return 0


# a C function with an inspectable signature: torch.compile traces it as the gdnconv:: op (gdnconv._compile)
@cython.binding(False)
@cython.embedsignature(True)
@cython.embedsignature.format("clinic")
def conv_update_multi(x, conv_state, weight, bias=None, *, activation="silu",
                      num_accepted_tokens=None, conv_state_indices=None, query_start_loc=None,
                      pad_slot_id=-1, out=None, num_threads=None, initial_state_indices=None,
                      is_weight_packed=False):
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
            (``ml_dtypes.bfloat16`` for NumPy), any strides; anything else goes
            through ``np.asarray`` and must then have one of those dtypes. Read only.
        conv_state: ``(S, L, D)`` state, updated in place (never copied), same dtype
            as ``x``. Any strides; channels contiguous is the fast path, and vLLM's
            ``L``-contiguous layout passed as a transposed view works too.
        weight: ``(D, W)`` taps, ``2 <= W <= 8``; same dtype as ``x`` or float32
            (``nn.Conv1d``'s ``(D, 1, W)`` weight: pass ``weight.squeeze(1)``).
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
        pad_slot_id: slot value that marks padding (default -1), within int32.
        out: optional array of ``x``'s shape and dtype to write into; may be ``x``
            itself. Rows of skipped requests are left as they were (zeros in a newly
            allocated output).
        num_threads: threads for this call, used as asked (capped by the process's
            CPU affinity). Default: ``get_num_threads()``, fewer while calls on
            several threads wait for a thread the scheduler parked (see
            ``thread_contention``). Small calls run on the calling thread.
        initial_state_indices: ``(B,)`` integer slot each request's state is read
            from (prefix caching: the block holding the cached state); the rolled
            state is written to ``conv_state_indices[i]``, whose rows the roll does
            not reach keep their content; None: read where written. vLLM's block
            table ``idx`` maps as ``initial_state_indices[i] = idx[i,
            initial_state_idx[i]]``, ``conv_state_indices[i] = idx[i,
            block_idx_last_scheduled_token[i]]`` (``gdnconv.vllm`` does this). A read
            slot must be in range and not written by another request of the call
            (several requests may read one); in speculative mode a read slot other
            than the write slot needs ``num_accepted_tokens[i] <= T_i``.
        is_weight_packed: True when ``weight`` is in vLLM's packed layout (what
            vLLM's ``causal_conv1d_weight_pack`` makes of a bf16 width-4 conv weight at
            load on AVX512-BF16 and aarch64-BF16 hosts; ``gdnconv.vllm.unpack_weight``
            spells it out): a contiguous ``(D, 4)`` array, ``D`` a multiple of 32. A
            bf16 one is read in place, at half the bytes of a float32 weight; the
            outputs are the plain weight's, bit for bit.

    Returns:
        ``out`` (a new NumPy array or torch tensor like ``x`` when not given).

    Raises:
        TypeError: ``conv_state``, ``weight``, ``bias`` or ``out`` is not an
            array/tensor (``x`` and the index arguments may be sequences NumPy
            converts; an empty list is an empty index array), dtypes are
            unsupported or mixed (``bias`` must have ``weight``'s dtype), or an
            index array is not of an integer dtype.
        ValueError: wrong rank or shape, ``D``/``W`` mismatch, width outside 2..8,
            ``state_len`` too small, slot out of range or used twice, a written
            array that overlaps itself or has non-native byte order,
            ``num_accepted_tokens`` out of range, bad ``query_start_loc``, read-only
            ``conv_state``/``out``, ``out`` overlapping ``conv_state`` (or ``x``
            without being ``x``), ``x``, ``weight``, ``bias`` or an index array
            overlapping ``conv_state`` or ``out``, non-CPU tensors, a tensor whose
            view lies outside its storage (a storage shrunk with
            ``untyped_storage().resize_()``, before the call or by a
            ``__torch_function__`` override during it), an inference tensor
            ``conv_state``/``out`` outside ``torch.inference_mode()``, ``pad_slot_id``
            outside the int32 range, an ``initial_state_indices`` entry out of range or
            written by another request, a weight with ``is_weight_packed=True`` that
            is not a contiguous ``(D, 4)`` array with ``D`` a multiple of 32.
        Nothing is written when an exception is raised.
    """
    cdef _Update c = _Update()
    c.packed = _flag(is_weight_packed, "is_weight_packed")
    return _update(c, x, conv_state, weight, bias, activation, num_accepted_tokens, conv_state_indices,
                   query_start_loc, pad_slot_id, out, num_threads, initial_state_indices)


# a C function with an inspectable signature, traced as gdnconv.vllm._update_vllm_traced (gdnconv._compile)
@cython.binding(False)
@cython.embedsignature(True)
@cython.embedsignature.format("clinic")
def _conv_update_vllm(x, conv_state, weight, bias=None, *, activation=None, num_accepted_tokens=None,
                      conv_state_indices=None, query_start_loc=None, pad_slot_id=-1, out=None,
                      initial_state_indices=None, plain_tensors=False, tokens_last=False, is_weight_packed=False,
                      skipped_rows_from_x=False):
    """conv_update_multi on tensors in vLLM's order (gdnconv.vllm): conv_state (S, D, L), a 3-D
    x and out (B, D, T), or (B, T, D) with tokens_last (vLLM's C++ op's order: the plugin's
    drop-in); read as gdnconv's views, no transposed tensors made. Errors name the
    caller's shapes. plain_tensors: gdnconv.vllm's first try at vLLM's usual call, which it
    redoes through its full path where this refuses: every argument given must then be a
    torch.Tensor or nn.Parameter, or for the weight and bias a numpy.ndarray (a caller's
    NumPy weights; TypeError for anything else, before any of them is read), so that a refused try
    runs no user code (no __array__, no subclass's __torch_function__). skipped_rows_from_x: the
    out rows of skipped (pad-slot) requests take x's values, not zeros (a new out) or their old
    values (a given one): what vLLM's CPU op causal_conv1d_update_cpu returns, a copy of x with
    the live requests' rows computed (the plugin's drop-in for it, in eager mode only)."""
    cdef _Update c = _Update()
    c.packed = _flag(is_weight_packed, "is_weight_packed")
    c.skipped_from_x = _flag(skipped_rows_from_x, "skipped_rows_from_x")
    c.vllm = True
    c.vllm_x = not tokens_last
    if plain_tensors:
        _plain_tensors((x, conv_state, weight, bias, num_accepted_tokens, conv_state_indices, query_start_loc,
                        out, initial_state_indices))
    return _update(c, x, conv_state, weight, bias, activation, num_accepted_tokens, conv_state_indices,
                   query_start_loc, pad_slot_id, out, None, initial_state_indices)


cdef object _update(_Update c, x, conv_state, weight, bias, activation, num_accepted_tokens,
                    conv_state_indices, query_start_loc, pad_slot_id, out, num_threads, initial_state_indices):
    """The body of conv_update_multi (and of the vLLM-order entry)."""
    cdef int nthreads = _call_threads(num_threads)
    cdef View raw
    # convert first: user code (__array__) must not run once pointers are taken
    x = _input_array(x, "x")
    weight = _native(weight)
    bias = _native(bias)
    num_accepted_tokens = _index_source(num_accepted_tokens, "num_accepted_tokens", c.keep)
    conv_state_indices = _index_source(conv_state_indices, "conv_state_indices", c.keep)
    query_start_loc = _index_source(query_start_loc, "query_start_loc", c.keep)
    initial_state_indices = _index_source(initial_state_indices, "initial_state_indices", c.keep)
    _check_update(c, x, conv_state, weight, bias, activation, num_accepted_tokens, conv_state_indices,
                  query_start_loc, pad_slot_id, out, initial_state_indices)
    copied = c.xv.strides[c.xv.ndim - 1] != 1 and not c.out_is_x
    if copied:
        # channels not contiguous: a contiguous copy of x (never of out or conv_state)
        if c.vllm_x and c.xv.ndim == 3:     # (B, D, T) in vLLM's order: channels last in memory
            copy = _torch_contiguous(x.transpose(1, 2)).transpose(1, 2)
        else:
            copy = _torch_contiguous(x) if c.xv.torch else np.ascontiguousarray(x)
        raw = c.xv
        _vllm_order(&raw, c.vllm_x)         # x's view in the caller's order, as the copy's
        c.keep.append(_made(copy, &c.xv, &raw, x, "x"))
        _vllm_order(&c.xv, c.vllm_x)
        x = copy
    new_out = out is None
    if new_out:
        out = _new_like(x, &c.xv)
        raw = c.xv
        _vllm_order(&raw, c.vllm_x)
        c.keep.append(_made(out, &c.ov, &raw, x, "out"))
        _vllm_order(&c.ov, c.vllm_x)
    if new_out or copied:
        _update_apart(c, True, "out", True)
    if new_out:
        _advise_huge(&c.ov)
    _update_storage(c)   # no user code runs from here on
    _update_params(c, bias is not None, conv_state_indices is not None, num_accepted_tokens is not None,
                   new_out, initial_state_indices is not None)
    with nogil:
        gdn_update_run(&c.p, nthreads)
    return out


def last_path():
    """The kernel path the last ``conv_update_multi`` call on this thread took, as
    ``"<isa>:<entry>"`` (per thread: calls on other threads do not change it), or None
    before this thread's first call. For tests and debugging.

    ``<isa>`` is the kernel's ISA name (``"scalar"`` for the portable kernel);
    ``<entry>`` is ``"state-channel-contiguous"`` (``conv_state`` with unit channel
    stride), ``"state-time-contiguous"`` (time stride 1 and channel stride >= L: vLLM's
    DS layout or transformers' cache view, transposed in registers) or
    ``"any-strides"`` (the portable kernel, for any other strides). ``x`` and ``out``
    need unit channel stride for a SIMD entry (a strided ``x`` is copied first).
    Within a SIMD entry the channels past the last whole 64-byte line of each block of
    256 channels run the portable core.
    """
    cdef const char *isa = NULL
    cdef const char *entry = NULL
    if gdn_update_last_path(&isa, &entry) != 0:
        return None
    return f"{isa.decode()}:{entry.decode()}"


def bytes_moved(x, conv_state, weight, *, num_accepted_tokens=None, conv_state_indices=None,
                query_start_loc=None, pad_slot_id=-1, initial_state_indices=None):
    """Bytes the performance model counts for this call (int), for benchmarks.

    ``e * D * sum_i (2 T_i + (W - 1) + (W - 2 + T_i))`` over requests that are not
    skipped (``e`` bytes per element), plus ``D * W`` weight elements, plus ``W - 1``
    rows per request whose state is copied from another slot. Takes the
    arguments of a ``conv_update_multi`` call, checks them the same way (same
    exceptions) and reads nothing but the index arrays.
    """
    cdef _Update c = _Update()
    x = _input_array(x, "x")
    weight = _native(weight)
    num_accepted_tokens = _index_source(num_accepted_tokens, "num_accepted_tokens", c.keep)
    conv_state_indices = _index_source(conv_state_indices, "conv_state_indices", c.keep)
    query_start_loc = _index_source(query_start_loc, "query_start_loc", c.keep)
    initial_state_indices = _index_source(initial_state_indices, "initial_state_indices", c.keep)
    _check_update(c, x, conv_state, weight, None, None, num_accepted_tokens, conv_state_indices,
                  query_start_loc, pad_slot_id, None, initial_state_indices)
    _update_storage(c)
    c.ov = c.xv
    _update_params(c, False, conv_state_indices is not None, num_accepted_tokens is not None, False,
                   initial_state_indices is not None)
    return gdn_update_bytes(&c.p)


cdef int _raise_index_error(int rc, int64_t i, int64_t v, const gdn_update_params *p, int64_t N,
                            str slots="conv_state_indices") except -1:
    """The exception for a status of gdn_update_validate (or gdn_prefill_validate, whose
    slot argument is named ``slots``)."""
    W, L = p.width, p.state_len
    if rc == GDN_ERR_SLOT_RANGE:
        raise ValueError(f"{slots}[{i}] = {v} is out of range: slots are 0..{p.num_slots - 1} "
                         f"(conv_state.shape[0] = {p.num_slots}) or pad_slot_id = {p.pad_slot_id}")
    if rc == GDN_ERR_SLOT_DUPLICATE:
        first = 0
        while p.conv_state_indices[first] != v:
            first += 1
        raise ValueError(f"{slots}[{i}] = {v} repeats the slot of request {first}: "
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
    if rc == GDN_ERR_READ_SLOT_RANGE:
        raise ValueError(f"initial_state_indices[{i}] = {v} is out of range: slots are 0..{p.num_slots - 1} "
                         f"(conv_state.shape[0] = {p.num_slots}); a request to skip is marked with "
                         f"pad_slot_id = {p.pad_slot_id} in {slots}")
    if rc == GDN_ERR_READ_WRITTEN:
        raise ValueError(f"initial_state_indices[{i}] = {v} is a slot another request of the call writes "
                         f"({_writer(p, i, v, slots)}): a request cannot read a state the same call replaces; "
                         f"split the call, or read from a slot nothing writes")
    if rc == GDN_ERR_SPEC_READ:
        T = p.query_start_loc[i + 1] - p.query_start_loc[i] if p.query_start_loc != NULL else p.seqlen
        write = p.conv_state_indices[i] if p.conv_state_indices != NULL else i
        raise ValueError(f"num_accepted_tokens[{i}] = {v} is more than request {i}'s {T} tokens while its state "
                         f"is read from initial_state_indices[{i}] = {p.initial_state_indices[i]} and written to "
                         f"slot {write}: window rows the roll does not rewrite would carry the read slot into the "
                         f"write slot; read and write one slot for such a request")
    if rc == GDN_ERR_SNAPSHOT_REQUEST:
        raise ValueError(f"snapshots[{i}, 0] = {v} must name a request 0..{p.batch - 1} with tokens and a live "
                         f"slot, in non-decreasing order: sort snapshots by request and drop those of skipped "
                         f"requests")
    if rc == GDN_ERR_SNAPSHOT_TOKENS:
        raise ValueError(f"snapshots[{i}, 1] = {v} tokens is outside 1..T_i for its request: a snapshot is the "
                         f"state after that many of the request's tokens")
    if rc == GDN_ERR_SNAPSHOT_SLOT_RANGE:
        raise ValueError(f"snapshots[{i}, 2] = {v} is out of range: slots are 0..{p.num_slots - 1} "
                         f"(conv_state.shape[0] = {p.num_slots})")
    if rc == GDN_ERR_SNAPSHOT_DUPLICATE:
        raise ValueError(f"snapshots[{i}, 2] = {v} is a slot the call writes already (a request's {slots} "
                         f"entry or an earlier snapshot): every written slot takes one state")
    if rc == GDN_ERR_NO_MEMORY:
        raise MemoryError("no memory for the duplicate-slot check")
    raise RuntimeError(f"gdn_update_validate returned {rc}")




cdef str _writer(const gdn_update_params *p, int64_t reader, int64_t slot, str slots):
    """Who writes ``slot`` in the call (for GDN_ERR_READ_WRITTEN's message)."""
    cdef int64_t j
    for j in range(p.batch):
        if j != reader and p.conv_state_indices != NULL and p.conv_state_indices[j] == slot:
            return f"{slots}[{j}]"
        if j != reader and p.conv_state_indices == NULL and j == slot:
            return f"request {j}'s slot"
    return "a snapshot of another request"


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
