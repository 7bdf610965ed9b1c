"""TEMP shim (drop when the real conv_prefill lands from branch i13p): ``conv_prefill``
in pure Python over the float64 reference of the update, so the client adapters can be
tested before the kernel is on main. No argument checks, slow, not for use.
"""
import numpy as np

from .reference import conv_update_multi_ref
from .testing import _is_tensor, as_torch, to_numpy


def conv_prefill(x, weight, bias=None, *, activation="silu", conv_state=None, query_start_loc=None,
                 cache_indices=None, has_initial_state=None, pad_slot_id=-1, out=None, num_threads=None):
    activation = {True: "silu", False: None}.get(activation, activation) if isinstance(activation, bool) \
        else activation
    xa, w, b = to_numpy(x), to_numpy(weight), to_numpy(bias)
    state = None if conv_state is None else to_numpy(conv_state)
    W, D = w.shape[1], w.shape[0]
    if query_start_loc is not None:
        qsl = [int(v) for v in query_start_loc]
        spans = [(qsl[i], qsl[i + 1]) for i in range(len(qsl) - 1)]
        rows = [xa[a:c] for a, c in spans]
    else:
        rows = list(xa)
    B = len(rows)
    slots = list(range(B)) if cache_indices is None else [int(s) for s in cache_indices]
    init = [False] * B if has_initial_state is None else [bool(h) for h in has_initial_state]
    res = np.zeros(xa.shape, dtype=xa.dtype)
    res_rows = [res[a:c] for a, c in spans] if query_start_loc is not None else list(res)
    live = []
    for i in range(B):
        s, T = slots[i], rows[i].shape[0]
        if T == 0 or (cache_indices is not None and s == pad_slot_id):
            continue
        live.append(i)
        hdt = xa.dtype if state is None else state.dtype
        hist = state[s, :W - 1].copy() if (state is not None and init[i]) else np.zeros((W - 1, D), hdt)
        o, h = conv_update_multi_ref(rows[i][None], hist[None], w, b, activation=activation)
        with np.errstate(over="ignore", invalid="ignore"):
            res_rows[i][...] = o[0].astype(xa.dtype)
        if state is not None:
            state[s, :W - 1] = h[0]
    if conv_state is not None:
        _write(conv_state, state, [slots[i] for i in live], W)
    if out is None:
        return as_torch(res).clone() if _is_tensor(x) else res
    for i in live:
        if query_start_loc is not None:
            _write_rows(out, res, slice(*spans[i]))
        else:
            _write_rows(out, res, i)
    return out


def _write(conv_state, state, slots, W):
    for s in slots:
        _write_rows(conv_state, state, (s, slice(0, W - 1)))


def _write_rows(dst, src, index):
    if _is_tensor(dst):
        dst[index] = as_torch(np.ascontiguousarray(src[index]))
    else:
        dst[index] = src[index]
