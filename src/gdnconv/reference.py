"""The float64 reference: the definitions of conv_update_multi and conv_prefill,
written plainly.

ref: vLLM causal_conv1d_update and causal_conv1d_fn
(vllm/model_executor/layers/mamba/ops/causal_conv1d.py).
Slow on purpose (a Python loop over requests); tests and the simulator check the
native kernel against it (with the tolerance of ``gdnconv.testing``).

Also here: ``torch_loop_update`` and ``torch_loop_prefill``, the same ops as the
per-request torch loops that serving engines run without a native kernel (the peers
``gdnconv simulate`` and the benchmarks time gdnconv against).
"""
import numpy as np


def silu(y):
    """y * sigmoid(y) = y / (1 + exp(-y)) in float64 (for very negative y the exponential
    overflows to inf and the result is the correct -0; NaN and -inf give NaN)."""
    y = np.asarray(y, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        d = np.exp(-y)
        d += 1.0
        return y / d


def _act(y, activation):
    if activation is None:
        return y
    if activation in ("silu", "swish"):
        return silu(y)
    raise ValueError(f"activation must be None, 'silu' or 'swish', got {activation!r}")


def conv_update_multi_ref(x, conv_state, weight, bias=None, *, activation="silu",
                          num_accepted_tokens=None, conv_state_indices=None,
                          query_start_loc=None, pad_slot_id=-1, initial_state_indices=None):
    """Reference for ``gdnconv.conv_update_multi``; nothing passed in is modified.

    Takes the same arguments (NumPy arrays of any float dtype) and returns
    ``(out, new_state)``: ``out`` in float64 with ``x``'s shape (rows of skipped
    requests are NaN, since the kernel leaves them alone), ``new_state`` a copy of
    ``conv_state`` in its own dtype with the rolled rows moved bit for bit.
    With ``initial_state_indices`` (prefix caching) request ``i``'s window is read from
    slot ``initial_state_indices[i]`` of the state as it was before the call, and the
    rolled rows are written to its ``conv_state_indices`` slot (rows the roll does not
    reach keep that slot's content).
    """
    x = np.asarray(x)
    weight = np.asarray(weight, dtype=np.float64)
    D, W = weight.shape
    b = np.zeros(D) if bias is None else np.asarray(bias, dtype=np.float64)
    state = np.array(conv_state, copy=True)
    before = np.array(conv_state, copy=True)
    # one (T_i, D) block of rows per request
    if query_start_loc is not None:
        qsl = [int(v) for v in query_start_loc]
        rows = [x[qsl[i]:qsl[i + 1]] for i in range(len(qsl) - 1)]
    elif x.ndim == 2:
        rows = [x[i:i + 1] for i in range(x.shape[0])]
    else:
        rows = list(x)
    B = len(rows)
    slots = list(range(B)) if conv_state_indices is None else [int(s) for s in conv_state_indices]
    reads = slots if initial_state_indices is None else [int(r) for r in initial_state_indices]
    out_rows = []
    for i in range(B):
        xi = rows[i]
        T = xi.shape[0]
        s = slots[i]
        if (conv_state_indices is not None and s == pad_slot_id) or T == 0:
            out_rows.append(np.full((T, D), np.nan))
            continue
        off = 0 if num_accepted_tokens is None else int(num_accepted_tokens[i]) - 1
        history = before[reads[i], off:off + W - 1]               # (W-1, D) original dtype
        window = np.concatenate([history.astype(np.float64), xi.astype(np.float64)])
        y = np.stack([b + np.sum(weight * window[t:t + W].T, axis=1) for t in range(T)])
        out_rows.append(_act(y, activation))
        raw = np.concatenate([history, xi.astype(state.dtype)])   # bits of history and x_i
        if num_accepted_tokens is None:
            state[s, :W - 1] = raw[-(W - 1):]
        else:
            state[s, :W - 2] = history[1:]
            state[s, W - 2:W - 2 + T] = xi
    out = np.concatenate(out_rows) if out_rows else np.zeros((0, D))
    return out.reshape(x.shape), state


def magnitude(x, conv_state, weight, bias=None, **kwargs):
    """``|bias| + sum_k |weight[:, k] * window[k]|`` per output, float64, ``x``'s shape:
    the scale of the float32 accumulation noise that ``gdnconv.testing`` allows.
    Same arguments as ``conv_update_multi_ref`` (``activation`` is ignored); rows of
    skipped requests are NaN."""
    kwargs["activation"] = None
    with np.errstate(invalid="ignore", over="ignore"):   # signaling NaNs warn when cast
        absolute = [None if a is None else np.abs(np.asarray(a).astype(np.float64))
                    for a in (x, conv_state, weight, bias)]
        mag, _ = conv_update_multi_ref(*absolute, **kwargs)
    return mag


def causal_conv1d_ref(tokens, weight, bias=None, activation="silu"):
    """Causal conv1d of a whole token stream ``(n, D)`` from an all-zero history, float64.

    ``out[p] = act(bias + sum_k weight[:, k] * tokens[p - (W - 1) + k])``: what a
    request's outputs must be when its state started at zero, however the state
    was rolled in between.
    """
    tokens = np.asarray(tokens, dtype=np.float64)
    weight = np.asarray(weight, dtype=np.float64)
    D, W = weight.shape
    b = np.zeros(D) if bias is None else np.asarray(bias, dtype=np.float64)
    padded = np.concatenate([np.zeros((W - 1, D)), tokens])
    y = b + sum(weight[:, k] * padded[k:k + len(tokens)] for k in range(W))
    return _act(y, activation)


def _prefill_rows(x, query_start_loc):
    """One (T_i, D) block of rows per request: (N, D) split at query_start_loc, or (B, T, D)."""
    if query_start_loc is not None:
        qsl = [int(v) for v in query_start_loc]
        return [x[qsl[i]:qsl[i + 1]] for i in range(len(qsl) - 1)]
    return list(x)


def conv_prefill_ref(x, weight, bias=None, *, activation="silu", conv_state=None, query_start_loc=None,
                     cache_indices=None, has_initial_state=None, pad_slot_id=-1, initial_state_indices=None,
                     snapshots=None):
    """Reference for ``gdnconv.conv_prefill``; nothing passed in is modified.

    ref: vLLM causal_conv1d_fn. Takes the same arguments (NumPy arrays of any float
    dtype) and returns ``(out, new_state)``: ``out`` in float64 with ``x``'s shape (rows
    of skipped requests are NaN, since the kernel leaves a given ``out`` alone there),
    ``new_state`` a copy of ``conv_state`` in its own dtype (None without one) whose
    rows ``0..W-2`` of each live slot hold the last ``W-1`` rows of history ++ x_i,
    bit for bit. The history is the slot's rows ``0..W-2`` when ``has_initial_state[i]``
    is true, else zeros (the slot is not read).

    Prefix caching: with ``initial_state_indices`` the history is read from slot
    ``initial_state_indices[i]`` (of the state before the call); each row ``(i, p, s)`` of
    ``snapshots`` sets rows ``0..W-2`` of slot ``s`` to the last ``W-1`` rows of
    ``history ++ x_i[:p]``, the state after ``p`` of the request's tokens.
    """
    x = np.asarray(x)
    weight = np.asarray(weight, dtype=np.float64)
    D, W = weight.shape
    b = np.zeros(D) if bias is None else np.asarray(bias, dtype=np.float64)
    state = None if conv_state is None else np.array(conv_state, copy=True)
    before = None if conv_state is None else np.array(conv_state, copy=True)
    rows = _prefill_rows(x, query_start_loc)
    B = len(rows)
    slots = list(range(B)) if cache_indices is None else [int(s) for s in cache_indices]
    reads = slots if initial_state_indices is None else [int(r) for r in initial_state_indices]
    snaps = [] if snapshots is None else [tuple(int(v) for v in row) for row in np.asarray(snapshots).reshape(-1, 3)]
    init = [False] * B if has_initial_state is None else [bool(h) for h in has_initial_state]
    out_rows = []
    for i in range(B):
        xi = rows[i]
        T = xi.shape[0]
        s = slots[i]
        if (cache_indices is not None and s == pad_slot_id) or T == 0:
            out_rows.append(np.full((T, D), np.nan))
            continue
        if state is not None and init[i]:
            history = before[reads[i], :W - 1]                    # (W-1, D), state dtype
        else:
            history = np.zeros((W - 1, D), dtype=x.dtype if state is None else state.dtype)
        seq = np.concatenate([history.astype(np.float64), xi.astype(np.float64)])
        y = b + sum(weight[:, k] * seq[k:k + T] for k in range(W))
        out_rows.append(_act(y, activation))
        if state is not None:
            raw = np.concatenate([history, xi.astype(state.dtype)])   # bits of history and x_i
            state[s, :W - 1] = raw[-(W - 1):]
            for req, p, slot in snaps:
                if req == i:
                    state[slot, :W - 1] = raw[p:p + W - 1]            # the last W-1 rows of history ++ x_i[:p]
    out = np.concatenate(out_rows) if out_rows else np.zeros((0, D))
    return out.reshape(x.shape), state


def vllm_block_table_ref(cache_indices, query_start_loc, initial_state_idx, block_idx_last_scheduled_token,
                         block_idx_first_scheduled_token=None, num_computed_tokens=None, block_size_to_align=0):
    """vLLM's prefix-caching block table in gdnconv's terms, as vLLM's Triton kernels read it.

    ref: ``_causal_conv1d_fwd_kernel`` / ``_causal_conv1d_update_kernel`` (vLLM 0.32,
    ``vllm/model_executor/layers/mamba/ops/causal_conv1d.py``). Request ``b``'s state is read
    from ``cache_indices[b, initial_state_idx[b]]`` and its final state written to
    ``cache_indices[b, block_idx_last_scheduled_token[b]]``; a prefill (given
    ``block_idx_first_scheduled_token``, ``num_computed_tokens`` ``n`` and block size ``k``)
    also stores the state after each of its ``p`` tokens with ``(n + p) % k == 0``,
    ``0 < p < T_b``, the ``j``-th into ``cache_indices[b, block_idx_first_scheduled_token[b] +
    j]``. (Triton writes a chunk shorter than ``width - 1`` into the read block: vLLM issue
    56196; this is the contract, not that.) Returns ``(initial_state_indices,
    conv_state_indices, snapshots)``: two ``(B,)`` int lists and a list of ``(b, p, slot)``.
    """
    idx = np.asarray(cache_indices)
    qsl = [int(v) for v in query_start_loc]
    reads, writes, snaps = [], [], []
    for b in range(len(qsl) - 1):
        reads.append(int(idx[b, int(initial_state_idx[b])]))
        writes.append(int(idx[b, int(block_idx_last_scheduled_token[b])]))
        if block_idx_first_scheduled_token is None:
            continue
        first, n, k = int(block_idx_first_scheduled_token[b]), int(num_computed_tokens[b]), block_size_to_align
        boundaries = [p for p in range(1, qsl[b + 1] - qsl[b]) if (n + p) % k == 0]
        snaps += [(b, p, int(idx[b, first + j])) for j, p in enumerate(boundaries)]
    return reads, writes, snaps


def prefill_magnitude(x, weight, bias=None, **kwargs):
    """``magnitude`` for ``conv_prefill``: ``|bias| + sum_k |weight[:, k] * window[k]|``
    per output, float64, ``x``'s shape. Same arguments as ``conv_prefill_ref``."""
    kwargs["activation"] = None
    with np.errstate(invalid="ignore", over="ignore"):
        absolute = [None if a is None else np.abs(np.asarray(a).astype(np.float64))
                    for a in (x, weight, bias, kwargs.get("conv_state"))]
        kwargs["conv_state"] = absolute[3]
        mag, _ = conv_prefill_ref(*absolute[:3], **kwargs)
    return mag


def torch_loop_update(x, conv_state, weight, bias=None, *, activation="silu", num_accepted_tokens=None,
                      conv_state_indices=None, query_start_loc=None, pad_slot_id=-1, out=None):
    """``gdnconv.conv_update_multi`` as a Python loop over requests with torch ops
    (``torch.cat`` + depthwise ``F.conv1d`` + state copy per request): what serving
    engines run without a native kernel.

    All arguments are torch CPU tensors (index arrays int32/int64), shapes and
    semantics as ``gdnconv.conv_update_multi``; ``conv_state`` is updated in place;
    returns ``out`` (a new zero tensor of ``x``'s shape when not given). No argument
    checks: invalid input gives whatever torch raises. torch is imported here only.
    """
    import torch
    import torch.nn.functional as F

    D, W = weight.shape
    w = weight.unsqueeze(1)                      # [D, 1, W] depthwise filters
    if out is None:
        out = torch.zeros_like(x)
    if query_start_loc is not None:
        starts = query_start_loc.tolist()
        spans = [(starts[i], starts[i + 1]) for i in range(len(starts) - 1)]
        rows = [x[a:b] for a, b in spans]
        outs = [out[a:b] for a, b in spans]
    elif x.dim() == 2:
        rows, outs = [x[i:i + 1] for i in range(x.shape[0])], [out[i:i + 1] for i in range(x.shape[0])]
    else:
        rows, outs = list(x), list(out)
    slots = list(range(len(rows))) if conv_state_indices is None else conv_state_indices.tolist()
    accepted = None if num_accepted_tokens is None else num_accepted_tokens.tolist()
    for i, (xi, oi) in enumerate(zip(rows, outs)):
        s, T = slots[i], xi.shape[0]
        if T == 0 or (conv_state_indices is not None and s == pad_slot_id):
            continue
        off = 0 if accepted is None else accepted[i] - 1
        window = torch.cat([conv_state[s, off:off + W - 1], xi], dim=0)           # [W-1+T, D]
        y = F.conv1d(window.t().unsqueeze(0), w, bias, groups=D)[0].t()           # [T, D]
        oi.copy_(F.silu(y) if activation in ("silu", "swish") else y)
        if accepted is None:
            conv_state[s, :W - 1] = window[-(W - 1):]
        else:
            conv_state[s, :W - 2] = window[1:W - 1]
            conv_state[s, W - 2:W - 2 + T] = xi
    return out


def torch_loop_prefill(x, weight, bias=None, *, activation="silu", conv_state=None, query_start_loc=None,
                       cache_indices=None, has_initial_state=None, pad_slot_id=-1, out=None):
    """``gdnconv.conv_prefill`` as a Python loop over requests with torch ops, as vLLM's
    CPU fallback runs it (``torch.cat`` of the history and the prompt, depthwise
    ``F.conv1d``, SiLU, state copy per request).

    All arguments are torch CPU tensors (index arrays int32/int64, ``has_initial_state``
    bool), shapes and semantics as ``gdnconv.conv_prefill``; ``conv_state`` is updated
    in place; returns ``out`` (a new zero tensor of ``x``'s shape when not given). No
    argument checks.
    """
    import torch
    import torch.nn.functional as F

    D, W = weight.shape
    w = weight.unsqueeze(1)                      # [D, 1, W] depthwise filters
    if out is None:
        out = torch.zeros_like(x)
    if query_start_loc is not None:
        starts = query_start_loc.tolist()
        spans = [(starts[i], starts[i + 1]) for i in range(len(starts) - 1)]
        rows, outs = [x[a:b] for a, b in spans], [out[a:b] for a, b in spans]
    else:
        rows, outs = list(x), list(out)
    slots = list(range(len(rows))) if cache_indices is None else cache_indices.tolist()
    init = [False] * len(rows) if has_initial_state is None else has_initial_state.tolist()
    for i, (xi, oi) in enumerate(zip(rows, outs)):
        s, T = slots[i], xi.shape[0]
        if T == 0 or (cache_indices is not None and s == pad_slot_id):
            continue
        if conv_state is not None and init[i]:
            history = conv_state[s, :W - 1]
        else:
            history = torch.zeros(W - 1, D, dtype=x.dtype)
        window = torch.cat([history, xi], dim=0)                                  # [W-1+T, D]
        y = F.conv1d(window.t().unsqueeze(0), w, bias, groups=D)[0].t()           # [T, D]
        oi.copy_(F.silu(y) if activation in ("silu", "swish", True) else y)
        if conv_state is not None:
            conv_state[s, :W - 1] = window[-(W - 1):]
    return out
