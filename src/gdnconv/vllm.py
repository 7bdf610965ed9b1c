"""vLLM's conv functions with vLLM's signatures, computed by gdnconv (torch CPU tensors).

ref: vllm/model_executor/layers/mamba/ops/causal_conv1d.py (vLLM 0.32: ``causal_conv1d_update``,
``causal_conv1d_fn``, the Triton kernels that define the semantics) and ops/cpu/causal_conv1d.py
(``causal_conv1d_update_cpu`` / ``causal_conv1d_fn_cpu``, what vLLM binds to those names on CPU).
A call site swaps ``causal_conv1d_update`` for ``gdnconv.vllm.causal_conv1d_update`` (and
``causal_conv1d_fn`` for ``gdnconv.vllm.causal_conv1d_fn``) and keeps its arguments; the vLLM
plugin (``gdnconv.vllm_plugin``) does that for every CPU call site of vLLM 0.32.

Design:
- vLLM's tensors are views in vLLM's order: the state ``(S, D, L)`` (vLLM's default "SD"
  storage makes it a transposed view of channel-contiguous memory: gdnconv's fast layout; "DS"
  storage is gdnconv's time-contiguous layout, read in place), ``x`` ``(B, D)``, ``(B, D, T)``
  or varlen ``(N, D)``. The functions pass them to the core ops in vLLM's order (no copies,
  no transposed views made per call); errors name the caller's shapes.
- Conventions of vLLM's CPU bindings: ``-1`` (``pad_slot_id``) marks a padded request, slot 0
  is a live slot, and ``null_block_id`` marks padding only where a caller passes it. Index
  arrays longer than the batch: the first ``B`` entries are used (vLLM's kernels read so).
- ``is_weight_packed=True``: the weight is in the layout vLLM's ``causal_conv1d_weight_pack``
  gives it at load on AVX512-BF16 and aarch64-BF16 hosts (see ``unpack_weight``), and goes to
  the core as it is (``is_weight_packed`` of ``gdnconv.conv_update_multi``): the kernels read a
  bf16 one in place, so nothing is copied or kept, and a change to it is seen by the next call.
- What vLLM returns: ``out`` in ``x``'s shape and dtype; with ``out=None`` the result is
  written into ``x`` itself, as vLLM does. The update refuses an ``x`` whose float dtype differs
  from the state's (a result computed in the state's dtype and copied back would bypass the
  checks of what is written); the prefill, which only reads ``x``, computes on
  ``x.to(conv_state.dtype)`` as vLLM does.
- The dtypes the core refuses are refused here with the core's messages: the only conversions
  are the prefill's ``x`` above and fp16/bf16 weights widened to float32 (exact) when they
  differ from the state's dtype.
- Prefix caching (vLLM's block tables): ``conv_state_indices`` / ``cache_indices`` ``(batch,
  max_blocks)`` with ``initial_state_idx``, ``block_idx_last_scheduled_token`` (and for the
  prefill ``block_idx_first_scheduled_token``, ``num_computed_tokens``, ``block_size_to_align``)
  become the core's per-request read slot (``initial_state_indices``), write slot and, for the
  prefill, boundary ``snapshots`` (``_block_table``; ``gdnconv.reference.vllm_block_table_ref``
  spells the mapping out). A request whose read block is ``null_block_id`` (when given) or
  ``pad_slot_id`` is skipped, as vLLM's kernels skip it. Where vLLM's Triton kernel writes a
  chunk shorter than ``width - 1`` into the read block (vLLM issue 56196), gdnconv writes the
  last scheduled block. Block indices that contradict each other are a ValueError naming them.
"""
import os
import sys

import numpy as np
import torch

import gdnconv as _g
from gdnconv import _compile, _core

__all__ = ["causal_conv1d_fn", "causal_conv1d_update", "unpack_weight", "pack_weight_like_vllm",
           "forget_packed_weights", "counters", "reset_counters", "NULL_BLOCK_ID", "PAD_SLOT_ID"]

# vllm.v1.attention.backends.utils
PAD_SLOT_ID = -1
NULL_BLOCK_ID = 0
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_PACK_BLOCK = 32     # channels per block of causal_conv1d_weight_pack's layout

# ---- counters of the vLLM plugin's routed calls (gdnconv.vllm_plugin fills them) ----
_counters = {}


def counters():
    """``{site: {"routed": n, "fallback": m}}`` for the vLLM plugin's call sites in this
    process: calls computed by gdnconv, and calls handed back to vLLM's own function (an
    argument gdnconv does not take, or a refusal). Sites appear once the plugin routes them."""
    return {site: dict(c) for site, c in _counters.items()}


def reset_counters():
    """Set every site's counts to zero."""
    for c in _counters.values():
        c["routed"] = c["fallback"] = 0


def _activation(activation, name="activation"):
    if activation is None or activation == "silu":
        return activation
    if isinstance(activation, bool):
        return "silu" if activation else None
    if activation is None or activation in ("silu", "swish"):
        return activation
    raise ValueError(f"{name} must be None, 'silu', 'swish' or a bool (vLLM's values), got {activation!r}")


def _values(a, name, B):
    """The first B entries of a (B,) index argument as an int64 NumPy array (values are read:
    prefix caching's slots are resolved here)."""
    if isinstance(a, torch.Tensor):
        if a.is_floating_point() or a.is_complex() or a.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor (int32), got dtype {str(a.dtype)[6:]}")
        a = _core._tensor_values(a, name)
    a = _index(a)
    if a is None or a.ndim != 1 or a.shape[0] < B or a.dtype.kind not in "iu":
        what = "None" if a is None else f"shape {a.shape}, dtype {a.dtype}"
        raise ValueError(f"{name} must be a (batch,) = ({B},) integer array with prefix caching, got {what}")
    return a[:B].astype(np.int64)


def _block_table(indices, B, T, init_col, last_col, pad_slot_id, null_block_id, first_col=None, computed=None,
                 block_size=0, name="conv_state_indices"):
    """vLLM's block table as the core's slots: (write slots with pads, read slots, snapshot rows
    or None). ``T``: (B,) tokens per request. Skips a request whose read block is the pad or
    the null block; refuses columns out of range, a live request writing the pad or null block,
    and (prefill) block indices that do not count the boundaries its tokens cross."""
    idx = _core._tensor_values(indices, name) if isinstance(indices, torch.Tensor) else _index(indices)
    if idx is None or idx.ndim not in (1, 2) or idx.shape[0] < B or idx.dtype.kind not in "iu":
        what = "None" if idx is None else f"shape {idx.shape}, dtype {idx.dtype}"
        raise ValueError(f"{name} must be vLLM's (batch, max_blocks) = ({B}, ...) integer block table with "
                         f"prefix caching, got {what}")
    idx = (idx[:B, None] if idx.ndim == 1 else idx[:B]).astype(np.int64)
    cols = {"initial_state_idx": _values(init_col, "initial_state_idx", B),
            "block_idx_last_scheduled_token": _values(last_col, "block_idx_last_scheduled_token", B)}
    if first_col is not None:
        cols["block_idx_first_scheduled_token"] = _values(first_col, "block_idx_first_scheduled_token", B)
    for col_name, col in cols.items():
        bad = np.flatnonzero((col < 0) | (col >= idx.shape[1]))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{col_name}[{i}] = {col[i]} is not a column of {name} (shape {tuple(idx.shape)}): "
                             f"block columns are 0..{idx.shape[1] - 1}")
    rows = np.arange(B)
    reads = idx[rows, cols["initial_state_idx"]]
    writes = idx[rows, cols["block_idx_last_scheduled_token"]]
    pads = [pad_slot_id] + ([] if null_block_id is None else [null_block_id])
    skip = np.isin(reads, pads) | (T <= 0)
    bad = np.flatnonzero(~skip & np.isin(writes, pads))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"block_idx_last_scheduled_token[{i}] = {cols['block_idx_last_scheduled_token'][i]} points "
                         f"at {name}[{i}, {cols['block_idx_last_scheduled_token'][i]}] = {writes[i]}, a pad/null "
                         f"block, while request {i}'s initial block {name}[{i}, {cols['initial_state_idx'][i]}] = "
                         f"{reads[i]} is live: point it at the block that takes the request's final state, or mark "
                         f"the request's initial block with pad_slot_id to skip it")
    writes = np.where(skip, pad_slot_id, writes)
    if first_col is None:
        return writes.astype(np.int32), reads.astype(np.int32), None
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size <= 0 \
            or block_size % 8:
        raise ValueError(f"block_size_to_align = {block_size!r} must be a positive multiple of 8 with prefix "
                         f"caching (vLLM's kernel stores the state every block_size_to_align tokens)")
    n = _values(computed, "num_computed_tokens", B)
    first = cols["block_idx_first_scheduled_token"]
    crossed = (n + T - 1) // block_size - n // block_size       # boundaries p = k b - n with 0 < p < T
    count = cols["block_idx_last_scheduled_token"] - first
    bad = np.flatnonzero(~skip & ((count != crossed) | (n < 0)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"block_idx_last_scheduled_token[{i}] - block_idx_first_scheduled_token[{i}] = {count[i]}, "
                         f"but request {i}'s {T[i]} tokens after num_computed_tokens[{i}] = {n[i]} cross {crossed[i]} "
                         f"boundaries of block_size_to_align = {block_size}: vLLM's metadata has first = "
                         f"num_computed_tokens // block_size, last = (num_computed_tokens + tokens - 1) // block_size")
    live = np.flatnonzero(~skip & (crossed > 0))
    req = np.repeat(live, crossed[live])
    j = np.arange(req.size) - np.repeat(np.cumsum(crossed[live]) - crossed[live], crossed[live])
    tokens = (n[req] // block_size + 1 + j) * block_size - n[req]
    slots = idx[req, first[req] + j]
    bad = np.flatnonzero(np.isin(slots, pads))
    if bad.size:
        k = int(bad[0])
        raise ValueError(f"{name}[{req[k]}, {first[req[k]] + j[k]}] = {slots[k]} is a pad/null block, but request "
                         f"{req[k]} stores the state after {tokens[k]} of its tokens there (a block boundary): give "
                         f"every block the request fills a real block")
    snaps = np.stack([req, tokens, slots], axis=1).astype(np.int32)
    return writes.astype(np.int32), reads.astype(np.int32), snaps


def _lengths(query_start_loc, B, T=None):
    """(B,) tokens per request: query_start_loc's differences, or T for every request."""
    if query_start_loc is None:
        return np.full(B, T, dtype=np.int64)
    q = _values(query_start_loc, "query_start_loc", B + 1)
    return q[1:] - q[:-1]


# ---- vLLM's packed weight ----

def unpack_weight(weight):
    """The plain ``(D, W)`` weight of one in vLLM's packed layout (a new contiguous tensor).

    ref: vLLM's ``causal_conv1d_weight_pack`` (``vllm._custom_ops``, csrc/cpu conv kernels),
    applied in place at load by ``dispatch_cpu_unquantized_gemm`` (model_executor/layers/utils.py)
    to bf16 width-4 conv weights on AVX512-BF16 and aarch64-BF16 hosts. The packed tensor keeps
    the ``(D, 4)`` shape; its memory holds blocks of 32 channels, each as the pairs
    ``(w[c, 0], w[c, 1])`` of its 32 channels, then the pairs ``(w[c, 2], w[c, 3])``:
    ``packed.view(D // 32, 2, 32, 2)[b, j, c, p] = w[32 b + c, 2 j + p]`` (the pairs feed
    ``vdpbf16ps``). Raises ValueError unless ``weight`` is ``(D, 4)`` contiguous with ``D`` a
    multiple of 32 (the only weights vLLM packs).
    """
    if (not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != 4
            or weight.shape[0] % _PACK_BLOCK or not weight.is_contiguous()):
        what = (f"shape {tuple(weight.shape)}" + ("" if weight.is_contiguous() else ", not contiguous")
                if isinstance(weight, torch.Tensor) else type(weight).__name__)
        raise ValueError(f"weight must be vLLM's packed (D, 4) contiguous tensor with "
                         f"D a multiple of {_PACK_BLOCK}, got {what} (a plain weight needs no unpacking)")
    D = weight.shape[0]
    return weight.view(D // _PACK_BLOCK, 2, _PACK_BLOCK, 2).permute(0, 2, 1, 3).reshape(D, 4).contiguous()


def pack_weight_like_vllm(weight):
    """vLLM's packed layout of a plain ``(D, 4)`` weight (the inverse of ``unpack_weight``), for
    tests and benchmarks where vLLM's own ``causal_conv1d_weight_pack`` is not at hand. Raises
    TypeError for anything but a torch tensor, ValueError unless it is ``(D, 4)`` with ``D`` a
    multiple of 32."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch tensor, got {type(weight).__name__}")
    D = weight.shape[0]
    if weight.dim() != 2 or weight.shape[1] != 4 or D % _PACK_BLOCK:
        raise ValueError(f"weight must be (D, 4) with D a multiple of {_PACK_BLOCK}, got {tuple(weight.shape)}")
    return weight.reshape(D // _PACK_BLOCK, _PACK_BLOCK, 2, 2).permute(0, 2, 1, 3).reshape(D, 4).contiguous()


def forget_packed_weights():
    """Does nothing: gdnconv reads a packed weight in place (``is_weight_packed=True``), so a
    change to it, in place or through ``.data``, is seen by the next call. Earlier versions kept
    an unpacked float32 copy per weight, which this dropped; kept so that their callers run."""


_is_compiling = torch.compiler.is_compiling
_EXACT = (torch.Tensor, torch.nn.Parameter)
_no_subclass_functions = torch._C.DisableTorchFunctionSubclass


def _plain(t):
    """A tensor of a subclass (vLLM's weights are ModelWeightParameter, a Parameter subclass with
    a Python ``__torch_function__``) as a plain tensor on the same memory, made with subclass
    functions off (~0.5 us), so that the core's first try, which takes exact types only, reads it
    and the subclass's functions do not run on every attribute the full path reads (~1.3 us a
    detach); anything else, and anything while torch.compile traces, as it is."""
    if t is None or type(t) in _EXACT or not isinstance(t, torch.Tensor) or _is_compiling():
        return t   # (None first: isinstance against torch.Tensor runs its metaclass's check, ~0.1 us)
    with _no_subclass_functions():
        return t.detach()


def _weights(weight, bias, dtype):
    """weight and bias as the core takes them with activations of ``dtype`` (a packed weight alike:
    its layout is the core's to check): subclasses as plain tensors (``_plain``); fp16/bf16 that
    differ from ``dtype`` widened to float32 (exact; a contiguous weight stays contiguous, so a
    packed one keeps its layout), and both to float32 where the two then still differ (a weight of
    the other kind with a bias of ``dtype``, say). Any other dtype is passed on for the core to
    refuse with its own message."""
    weight, bias = _plain(weight), _plain(bias)
    if (isinstance(weight, torch.Tensor) and weight.dtype is dtype
            and (bias is None or isinstance(bias, torch.Tensor) and bias.dtype is dtype)):
        return weight, bias           # vLLM's usual call: no attribute read twice (~0.2 us)
    if isinstance(weight, torch.Tensor) and weight.dtype != dtype and weight.dtype in _FLOATS:
        weight = weight.float()
    if isinstance(bias, torch.Tensor) and bias.dtype != dtype and bias.dtype in _FLOATS:
        bias = bias.float()
    if (isinstance(weight, torch.Tensor) and isinstance(bias, torch.Tensor) and weight.dtype != bias.dtype
            and weight.dtype in _FLOATS and bias.dtype in _FLOATS):
        weight, bias = weight.float(), bias.float()
    return weight, bias


# ---- the usual decode call as one torch op (src/csrc/torch_op.c; its checks: _core._op_update) ----

_OP_TOKENS_LAST, _OP_PACKED, _OP_SKIPPED_FROM_X = 2, 4, 8     # torch_op.h's GDN_OP_* of the call's layout


def _load_ops():
    """((update_new, update_into), (direct_new, direct_into)): the usual decode call as torch
    ops on torch's stable C ABI, registered from gdnconv's own module (no build against torch),
    and the same call without torch's dispatcher where this torch's tensor objects allow it
    (_core._torch_direct_init); (None, None) for what this process cannot have: off Linux,
    where this torch lacks the ABI's functions, or with GDNCONV_TORCH_OP=0 (neither)."""
    if os.environ.get("GDNCONV_TORCH_OP", "").strip() == "0" or not sys.platform.startswith("linux"):
        return (None, None), (None, None)
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    if _core._torch_op_init(os.path.join(lib, "libtorch_cpu.so")) != 0:
        return (None, None), (None, None)
    new, into = torch.ops._gdnconv.update_new.default, torch.ops._gdnconv.update_into.default
    # the C function behind each overload where torch has it (OpOverload.__call__ is a Python frame)
    ops = getattr(new, "_op", new), getattr(into, "_op", into)
    if _core._torch_direct_init(os.path.join(lib, "libtorch_python.so")) != 0:
        return ops, (None, None)
    return ops, (_core._direct_new, _core._direct_into)


# the op's call as the routes make it: without the dispatcher where possible (~2 us less a
# call), else through torch.ops; tests and benchmarks replace these
_dispatched_ops, _direct_ops = _load_ops()
_op_new, _op_into = _direct_ops if _direct_ops[0] is not None else _dispatched_ops


# ---- index conventions ----

def _index(indices):
    """An index argument as a tensor or ndarray (lists and tuples through NumPy; an empty one is
    an empty int32 array), so that vLLM's conventions below apply to every form."""
    if indices is None or isinstance(indices, (torch.Tensor, np.ndarray)):
        return indices
    a = np.asarray(indices)
    return a.astype(np.int32) if a.size == 0 else a


def _first(indices, B):
    """vLLM's reading of an index argument: column 0 of a (batch, k) block table, the first B
    entries of a longer array; anything else is passed on for the core to check."""
    indices = _index(indices)
    if indices is not None:
        shape = indices.shape
        if len(shape) == 2 and shape[1] > 0:
            indices = indices[:, 0]
            shape = indices.shape
        if len(shape) == 1 and 0 <= B < shape[0]:
            indices = indices[:B]
    return indices


def _pads(indices, pad_slot_id, null_block_id):
    """One pad marker for the core: entries equal to null_block_id (when given and different)
    become pad_slot_id."""
    if null_block_id is None or null_block_id == pad_slot_id or indices is None:
        return indices
    if isinstance(null_block_id, bool) or not isinstance(null_block_id, (int, np.integer)):
        raise TypeError(f"null_block_id must be an int or None, got {null_block_id!r}")
    if isinstance(indices, torch.Tensor):
        if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
            return indices                      # the core refuses it, naming the argument
        return indices.masked_fill(indices == null_block_id, pad_slot_id)
    if indices.dtype.kind not in "iu":
        return indices
    return np.where(indices == null_block_id, pad_slot_id, indices).astype(indices.dtype)


def _batch(query_start_loc):
    """B of a varlen call: query_start_loc's length - 1 (the core checks the rest)."""
    q = query_start_loc if isinstance(query_start_loc, torch.Tensor) else _index(query_start_loc)
    return (q.shape[0] if q.ndim == 1 else 0) - 1


def _other_float(x, dtype):
    """x is of a float dtype gdnconv takes, but not the state's (vLLM converts it)."""
    xd = x.dtype
    return xd is not dtype and xd in _FLOATS and dtype in _FLOATS


def _float_x(x, dtype):
    """x in the state's dtype (vLLM computes on ``x.to(conv_state.dtype)``; the prefill's x is
    only read, so a converted copy is safe); dtypes the core refuses are passed on unchanged for
    its message."""
    if not _other_float(x, dtype):
        return x
    _core._in_own_storage(x, "x")     # (before torch copies it)
    return x.to(dtype)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None,
                         num_accepted_tokens=None, query_start_loc=None, max_query_len=-1,
                         null_block_id=None, block_idx_last_scheduled_token=None,
                         initial_state_idx=None, validate_data=False, out=None, *,
                         pad_slot_id=PAD_SLOT_ID, is_weight_packed=False):
    """vLLM's ``causal_conv1d_update`` (decode and speculative decode), same arguments.

    Args (vLLM's names, order and defaults, with the conventions of vLLM's CPU binding):
        x: ``(batch, dim)`` one token per request, ``(batch, dim, seqlen)``, or varlen
            ``(num_tokens, dim)`` with ``query_start_loc``; ``conv_state``'s dtype (float32,
            float16 or bfloat16: another is refused, as the result is written in place).
        conv_state: ``(num_cache_lines, dim, state_len)``, updated in place; vLLM's "SD"
            cache ``(S, L, D)`` passed as ``.transpose(-1, -2)`` is the fast layout, "DS"
            storage runs in place too.
        weight: ``(dim, width)``, ``2 <= width <= 8``; bias: ``(dim,)`` or None. In the state's
            dtype or float32 (fp16/bf16 of the other kind are widened, exactly).
        activation: None, "silu", "swish", or a bool (True = silu).
        conv_state_indices: ``(batch,)`` slots, or ``(batch, k)`` of which column 0 is used
            (vLLM's speculative block table without prefix caching); longer than the batch:
            the first ``batch`` entries. Required with ``query_start_loc``.
        num_accepted_tokens: ``(batch,)``; given = speculative mode (the window starts at row
            ``num_accepted_tokens - 1``; rows ``0..width-3`` keep the history, rows
            ``width-2..`` the request's tokens, as vLLM's Triton kernel writes them).
        query_start_loc: ``(batch + 1,)`` offsets of each request's rows in a varlen ``x``.
        max_query_len: the longest request in a varlen call, or -1; refused when smaller
            than a request's length (vLLM's kernel would drop that request's tokens; not
            checked while torch.compile traces, and gdnconv computes every token anyway).
        null_block_id: when given, slots equal to it are padding too (vLLM's Triton binding
            passes 0, "block 0 is the null block"); default None: slot 0 is live, as in
            vLLM's CPU binding. With prefix caching: a request whose initial block is it is
            skipped.
        block_idx_last_scheduled_token, initial_state_idx: prefix caching, both or neither
            (``(batch,)`` columns of the ``(batch, max_blocks)`` block table
            ``conv_state_indices``): the state is read from block ``conv_state_indices[b,
            initial_state_idx[b]]`` and the rolled state written to ``conv_state_indices[b,
            block_idx_last_scheduled_token[b]]`` (the core's ``initial_state_indices`` and
            ``conv_state_indices``), as vLLM's Triton kernel does; composes with
            ``num_accepted_tokens``.
        validate_data: accepted; gdnconv always validates.
        out: tensor of ``x``'s shape and dtype; None: written into ``x``, as vLLM does.
        pad_slot_id: slots equal to it are skipped (default -1, vLLM's ``PAD_SLOT_ID``).
        is_weight_packed: True when ``weight`` is in vLLM's packed layout (``unpack_weight``),
            read in place (bf16: half the bytes of a float32 weight).

    Returns ``out`` (``x`` when not given), in ``x``'s shape and dtype.

    Raises ValueError/TypeError naming the argument (with the caller's shapes) for anything
    gdnconv refuses; nothing is written then.
    """
    op = (block_idx_last_scheduled_token is None and initial_state_idx is None and null_block_id is None
          and type(max_query_len) is int and not _is_compiling())
    usual = op and query_start_loc is None
    if op and (usual or max_query_len == -1) and (is_weight_packed is True or is_weight_packed is False):
        # the op first (_op_update; varlen too, where no max_query_len asks for a check of the
        # lengths), weight and bias as they come: its direct call reads a Parameter subclass's
        # memory in place, as _plain would give it, with none of its Python functions run
        target = x if out is None else out
        done = _core._op_update(_op_new, _op_into, x, conv_state, weight, bias, activation, num_accepted_tokens,
                                conv_state_indices, pad_slot_id, target, _OP_PACKED if is_weight_packed else 0,
                                query_start_loc)
        if done is not None:
            return done
    weight, bias = _plain(weight), _plain(bias)   # (once, for the try and the full path)
    if usual:
        # vLLM's decode call: the core reads its arguments as they come (torch tensors, a (batch,)
        # conv_state_indices, weights in x's dtype or float32) in one call. What it refuses (before
        # any write, and before running user code) goes through the full path below, which maps the
        # other forms vLLM's conventions allow and gives this function's messages (~2 us less a call).
        target = x if out is None else out
        try:
            _core._conv_update_vllm(x, conv_state, weight, bias, activation=activation, num_accepted_tokens=num_accepted_tokens,
                                    conv_state_indices=conv_state_indices, pad_slot_id=pad_slot_id, out=target,
                                    plain_tensors=True, is_weight_packed=is_weight_packed)
            return target
        except (TypeError, ValueError):
            pass
    activation = _activation(activation)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch tensor, got {type(x).__name__}")
    if not isinstance(conv_state, torch.Tensor) or conv_state.dim() != 3:
        shape = tuple(conv_state.shape) if isinstance(conv_state, torch.Tensor) else type(conv_state).__name__
        raise ValueError(f"conv_state must be a 3-D (num_cache_lines, dim, state_len) tensor, got {shape}")
    if isinstance(max_query_len, bool) or not isinstance(max_query_len, int):
        raise TypeError(f"max_query_len must be an int, got {max_query_len!r}")
    if query_start_loc is not None:
        if conv_state_indices is None:
            raise ValueError("conv_state_indices is required with query_start_loc (varlen x), as in vLLM")
        if x.dim() != 2:
            raise ValueError(f"x must be (num_tokens, dim) with query_start_loc, got shape {tuple(x.shape)}")
        B = _batch(query_start_loc)
        if max_query_len != -1 and B > 0 and not torch.compiler.is_compiling():   # reads values
            q = query_start_loc
            q = (_core._tensor_values(q, "query_start_loc") if isinstance(q, torch.Tensor) and not q.is_meta and q.dim() == 1
                 and not (q.is_floating_point() or q.is_complex() or q.dtype == torch.bool) else _index(q))
            if isinstance(q, np.ndarray) and q.ndim == 1 and q.dtype.kind in "iu":
                longest = int((q[1:].astype(np.int64) - q[:-1]).max())
                if longest > max_query_len:
                    raise ValueError(f"max_query_len = {max_query_len} is smaller than the longest request "
                                     f"({longest} tokens); pass the true maximum or -1")
    elif x.dim() in (2, 3):
        B = x.shape[0]
    else:
        raise ValueError(f"x must be (batch, dim), (batch, dim, seqlen) or (num_tokens, dim), "
                         f"got shape {tuple(x.shape)}")
    dtype = conv_state.dtype
    if _other_float(x, dtype):
        raise TypeError(f"x dtype {str(x.dtype)[6:]} differs from conv_state dtype {str(dtype)[6:]}: the result is "
                        f"written into x (or out) in place, and vLLM computes in conv_state's dtype; pass "
                        f"x.to(conv_state.dtype), vLLM's own conversion, and use what the call returns")
    weight, bias = _weights(weight, bias, dtype)
    reads = None
    if block_idx_last_scheduled_token is not None or initial_state_idx is not None:
        if block_idx_last_scheduled_token is None or initial_state_idx is None:
            given, missing = (("initial_state_idx", "block_idx_last_scheduled_token")
                              if block_idx_last_scheduled_token is None else
                              ("block_idx_last_scheduled_token", "initial_state_idx"))
            raise ValueError(f"{given} is given without {missing}: prefix caching needs both (the block table's "
                             f"columns of the state read and of the state written); pass both or neither")
        lengths = _lengths(query_start_loc, B, 1 if x.dim() == 2 else x.shape[-1])
        indices, reads, _ = _block_table(conv_state_indices, B, lengths, initial_state_idx,
                                         block_idx_last_scheduled_token, pad_slot_id, null_block_id)
    else:
        indices = _pads(_first(conv_state_indices, B), pad_slot_id, null_block_id)
    target = x if out is None else out           # the core checks out's shape, dtype and overlaps
    _core._conv_update_vllm(x, conv_state, weight, bias, activation=activation,
                            num_accepted_tokens=_first(num_accepted_tokens, B), conv_state_indices=indices,
                            query_start_loc=query_start_loc, pad_slot_id=pad_slot_id, out=target,
                            initial_state_indices=reads, is_weight_packed=is_weight_packed)
    return target


def causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
                     has_initial_state=None, activation="silu", pad_slot_id=PAD_SLOT_ID,
                     null_block_id=None, block_idx_first_scheduled_token=None,
                     block_idx_last_scheduled_token=None, initial_state_idx=None,
                     num_computed_tokens=None, block_size_to_align=0, metadata=None,
                     validate_data=False, *, is_weight_packed=False):
    """vLLM's ``causal_conv1d_fn`` (prefill), same arguments, computed by ``gdnconv.conv_prefill``.

    Args (vLLM's names, order and defaults, with the conventions of vLLM's CPU binding):
        x: ``(dim, num_tokens)``, the requests' tokens end to end. vLLM passes the transpose
            of its ``(num_tokens, dim)`` hidden states (channel stride 1: gdnconv's fast
            layout); any strides work. Computed in ``conv_states``' dtype, as vLLM does.
        weight: ``(dim, width)``, ``2 <= width <= 8``; bias: ``(dim,)`` or None.
        conv_states: ``(num_cache_lines, dim, state_len)``, ``state_len >= width - 1``,
            updated in place (vLLM's "SD" cache passed as ``.transpose(-1, -2)`` is the fast
            layout); None: a convolution from zero history that writes no state.
        query_start_loc: ``(batch + 1,)`` offsets of each request's tokens (required).
        cache_indices: ``(batch,)`` slot per request (or ``(batch, k)``, of which column 0 is
            used, as vLLM's kernel does without prefix caching; longer: the first ``batch``
            entries); None: request ``i`` uses slot ``i``.
        has_initial_state: ``(batch,)`` bool: start from rows ``0..width-2`` of the slot; else
            from zero history (the slot is not read). None: no request has one.
        activation: None, "silu", "swish", or a bool (True = silu).
        pad_slot_id: requests whose slot is this are skipped (default -1, vLLM's CPU binding).
        null_block_id: when given, requests whose slot is this are skipped too (vLLM's Triton
            binding: block 0 is the null block); default None: slot 0 is live. With prefix
            caching: a request whose initial block is it is skipped.
        block_idx_first_scheduled_token, block_idx_last_scheduled_token, initial_state_idx,
        num_computed_tokens, block_size_to_align: prefix caching, all or none (``(batch,)``
            arrays; ``cache_indices`` the ``(batch, max_blocks)`` block table ``idx``): the
            history is read from ``idx[b, initial_state_idx[b]]``, the final state written to
            ``idx[b, block_idx_last_scheduled_token[b]]`` (also for chunks shorter than
            ``width - 1``, where vLLM's Triton kernel writes the read block: vLLM issue 56196),
            and the state after each of the request's ``p`` tokens with ``(num_computed_tokens[b]
            + p) % block_size_to_align == 0``, ``0 < p < T_b``, into ``idx[b,
            block_idx_first_scheduled_token[b] + j]`` in order; ``block_idx_last - block_idx_first``
            must count those boundaries, ``block_size_to_align`` be a positive multiple of 8.
        metadata: vLLM's precomputed launch sizes; not needed, ignored.
        validate_data: accepted; gdnconv always validates.
        is_weight_packed: True when ``weight`` is in vLLM's packed layout (``unpack_weight``).

    Afterwards rows ``0..width-2`` of each live slot hold the last ``width - 1`` inputs of
    its request (history included), as vLLM leaves them; skipped requests read and write
    nothing. Returns a new ``(dim, num_tokens)`` tensor in ``x``'s dtype (a transposed view
    of ``(num_tokens, dim)`` memory, vLLM's channel-last layout); rows of skipped requests
    are zeros.

    Raises ValueError/TypeError naming the argument for anything gdnconv refuses (the
    errors of ``gdnconv.conv_prefill``, the prefix-caching arguments); nothing is written then.
    """
    cache_args = {"block_idx_first_scheduled_token": block_idx_first_scheduled_token,
                  "block_idx_last_scheduled_token": block_idx_last_scheduled_token,
                  "initial_state_idx": initial_state_idx, "num_computed_tokens": num_computed_tokens}
    given = [k for k, v in cache_args.items() if v is not None]
    if given and len(given) < len(cache_args):
        missing = [k for k in cache_args if k not in given]
        raise ValueError(f"{', '.join(given)} given without {', '.join(missing)}: prefix caching needs all four "
                         f"(with block_size_to_align); pass all or none")
    if not given and block_size_to_align:
        raise ValueError(f"block_size_to_align = {block_size_to_align!r} is given without the prefix-caching "
                         f"block indices (block_idx_first_scheduled_token, ...): pass them, or 0")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a (dim, num_tokens) tensor, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if query_start_loc is None:
        raise ValueError("query_start_loc is required: the (batch + 1,) offsets of the requests' tokens "
                         "in x, as in vLLM")
    if conv_states is not None and (not isinstance(conv_states, torch.Tensor) or conv_states.dim() != 3):
        shape = tuple(conv_states.shape) if isinstance(conv_states, torch.Tensor) else type(conv_states).__name__
        raise ValueError(f"conv_states must be a 3-D (num_cache_lines, dim, state_len) tensor, got {shape}")
    B = _batch(query_start_loc)
    dtype = x.dtype if conv_states is None else conv_states.dtype
    weight, bias = _weights(weight, bias, dtype)
    reads = snapshots = None
    if given:
        if conv_states is None:
            raise ValueError("prefix caching's block indices are given without conv_states: pass the state cache "
                             "they index")
        indices, reads, snapshots = _block_table(
            cache_indices, B, _lengths(query_start_loc, B), initial_state_idx, block_idx_last_scheduled_token,
            pad_slot_id, null_block_id, block_idx_first_scheduled_token, num_computed_tokens, block_size_to_align,
            name="cache_indices")
    else:
        indices = _pads(_first(cache_indices, B), pad_slot_id, null_block_id)
    out = _core._conv_prefill_vllm(_float_x(x, dtype), weight, bias, activation=_activation(activation),
                                   conv_state=conv_states, query_start_loc=query_start_loc,
                                   cache_indices=indices, has_initial_state=_first(has_initial_state, B),
                                   pad_slot_id=pad_slot_id, initial_state_indices=reads, snapshots=snapshots,
                                   is_weight_packed=is_weight_packed)
    return out if out.dtype == x.dtype else out.to(x.dtype)


# ---- torch.compile: the vLLM-order core entries trace as the gdnconv:: ops on gdnconv-order views ----

def _tokens(t):
    return t.transpose(1, 2) if t.dim() == 3 else t


def _update_vllm_traced(x, conv_state, weight, bias=None, *, activation=None, num_accepted_tokens=None,
                        conv_state_indices=None, query_start_loc=None, pad_slot_id=-1, out=None,
                        initial_state_indices=None, plain_tensors=False, tokens_last=False, is_weight_packed=False,
                        skipped_rows_from_x=False):
    """``_core._conv_update_vllm`` as ``torch.compile`` traces it (views are free in a graph;
    ``plain_tensors`` is an eager try's, never traced, and so is ``skipped_rows_from_x``, the
    plugin's eager drop-in's)."""
    if skipped_rows_from_x:
        raise NotImplementedError("skipped_rows_from_x is for eager calls (gdnconv.vllm_plugin's), not traced")
    tokens = (lambda t: t) if tokens_last else _tokens
    res = _g.conv_update_multi(tokens(x), conv_state.transpose(1, 2), weight, bias, activation=activation,
                               num_accepted_tokens=num_accepted_tokens, conv_state_indices=conv_state_indices,
                               query_start_loc=query_start_loc, pad_slot_id=pad_slot_id,
                               out=None if out is None else tokens(out), initial_state_indices=initial_state_indices,
                               is_weight_packed=is_weight_packed)
    return tokens(res) if out is None else out


def _prefill_vllm_traced(x, weight, bias=None, *, activation=None, conv_state=None, query_start_loc=None,
                         cache_indices=None, has_initial_state=None, pad_slot_id=-1, initial_state_indices=None,
                         snapshots=None, is_weight_packed=False):
    """``_core._conv_prefill_vllm`` as ``torch.compile`` traces it."""
    return _g.conv_prefill(x.T, weight, bias, activation=activation,
                           conv_state=None if conv_state is None else conv_state.transpose(1, 2),
                           query_start_loc=query_start_loc, cache_indices=cache_indices,
                           has_initial_state=has_initial_state, pad_slot_id=pad_slot_id,
                           initial_state_indices=initial_state_indices, snapshots=snapshots,
                           is_weight_packed=is_weight_packed).T


_compile.substitute(_core._conv_update_vllm, _update_vllm_traced)
_compile.substitute(_core._conv_prefill_vllm, _prefill_vllm_traced)
