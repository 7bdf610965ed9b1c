"""vLLM's conv functions with vLLM's signatures, computed by gdnconv (torch CPU tensors).

ref: vllm/model_executor/layers/mamba/ops/causal_conv1d.py (vLLM 0.32: ``causal_conv1d_update``,
``causal_conv1d_fn``) and ops/cpu/causal_conv1d.py (the CPU variants, which name the pad
marker ``pad_slot_id``). A call site swaps ``causal_conv1d_update`` for
``gdnconv.vllm.causal_conv1d_update`` (and ``causal_conv1d_fn`` for
``gdnconv.vllm.causal_conv1d_fn``) and keeps its arguments.

Design:
- vLLM's tensors are views in vLLM's order: the state ``(S, D, L)`` (vLLM's default "SD"
  storage makes it a transposed view of channel-contiguous memory: gdnconv's fast layout),
  ``x`` ``(B, D)``, ``(B, D, T)`` or varlen ``(N, D)``. The adapter transposes the views
  back (no copies) and makes one ``gdnconv.conv_update_multi`` call.
- What vLLM returns: ``out`` in ``x``'s shape and dtype; with ``out=None`` the result is
  written into ``x`` itself, as vLLM does.
- Arguments gdnconv cannot honour (prefix-caching block indices) raise ValueError; none
  is ignored.
- ``causal_conv1d_fn`` (prefill) makes one ``gdnconv.conv_prefill`` call on ``x.T`` (vLLM's
  ``(D, N)`` tokens are a transposed view of ``(N, D)`` memory) and the ``(S, L, D)`` state view.
"""
import torch

import gdnconv as _g

__all__ = ["causal_conv1d_fn", "causal_conv1d_update", "NULL_BLOCK_ID", "PAD_SLOT_ID"]

# vllm.v1.attention.backends.utils
PAD_SLOT_ID = -1
NULL_BLOCK_ID = 0
_NO_PAD = 2 ** 63 - 1   # a pad marker no int32 slot can equal: vLLM's null_block_id=None


def _activation(activation, name="activation"):
    if isinstance(activation, bool):
        return "silu" if activation else None
    if activation is None or activation in ("silu", "swish"):
        return activation
    raise ValueError(f"{name} must be None, 'silu', 'swish' or a bool (vLLM's values), got {activation!r}")


def _refuse(**unsupported):
    for name, value in unsupported.items():
        if value is not None:
            raise ValueError(
                f"{name} is not supported by gdnconv (prefix caching / block-table state indexing), got a "
                f"{type(value).__name__}; call vLLM's own kernel for that path, or pass {name}=None")


def _state_view(conv_state, name):
    """vLLM's (..., dim, state_len) state as gdnconv's (S, L, D) view."""
    if not isinstance(conv_state, torch.Tensor) or conv_state.dim() != 3:
        shape = tuple(conv_state.shape) if isinstance(conv_state, torch.Tensor) else type(conv_state).__name__
        raise ValueError(f"{name} must be a 3-D (num_cache_lines, dim, state_len) tensor, got {shape}")
    return conv_state.transpose(1, 2)


def _widen(t, dtype):
    """weight/bias in a dtype gdnconv takes with activations of ``dtype``: unchanged when it
    already is ``dtype`` or float32, else widened to float32 (exact for fp16/bf16)."""
    if t is None or t.dtype == dtype or t.dtype == torch.float32:
        return t
    return t.float()


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None,
                         num_accepted_tokens=None, query_start_loc=None, max_query_len=-1,
                         null_block_id=NULL_BLOCK_ID, block_idx_last_scheduled_token=None,
                         initial_state_idx=None, validate_data=False, out=None, *, pad_slot_id=None):
    """vLLM's ``causal_conv1d_update`` (decode and speculative decode), same arguments.

    Args (vLLM's names, order and defaults):
        x: ``(batch, dim)`` one token per request, ``(batch, dim, seqlen)``, or varlen
            ``(num_tokens, dim)`` with ``query_start_loc``.
        conv_state: ``(num_cache_lines, dim, state_len)``, updated in place; vLLM's "SD"
            cache ``(S, L, D)`` passed as ``.transpose(-1, -2)`` is the fast layout.
        weight: ``(dim, width)``; bias: ``(dim,)`` or None.
        activation: None, "silu", "swish", or a bool (True = silu).
        conv_state_indices: ``(batch,)`` slots, or ``(batch, k)`` of which column 0 is used
            (vLLM's speculative block table without prefix caching). Required with
            ``query_start_loc``.
        num_accepted_tokens: ``(batch,)``; given = speculative mode.
        query_start_loc: ``(batch + 1,)`` offsets of each request's rows in a varlen ``x``.
        max_query_len: the longest request in a varlen call, or -1; refused when smaller
            than a request's length (vLLM's kernel would drop that request's tokens).
        null_block_id: slot value of padded requests (vLLM: 0, "block 0 is the null block");
            None: no request is padding.
        block_idx_last_scheduled_token, initial_state_idx: prefix caching; must be None.
        validate_data: accepted; gdnconv always validates.
        out: tensor of ``x``'s shape and dtype; None: written into ``x``, as vLLM does.
        pad_slot_id: the CPU variant's name for ``null_block_id``; when given it wins.

    Returns ``out`` (``x`` when not given), in ``x``'s shape and dtype.

    Raises ValueError/TypeError naming the argument for anything gdnconv refuses;
    nothing is written then.
    """
    _refuse(block_idx_last_scheduled_token=block_idx_last_scheduled_token,
            initial_state_idx=initial_state_idx)
    if pad_slot_id is not None and null_block_id not in (None, NULL_BLOCK_ID, pad_slot_id):
        raise ValueError(f"pad_slot_id = {pad_slot_id} and null_block_id = {null_block_id} disagree; "
                         f"they name the same marker, pass one of them")
    pad = pad_slot_id if pad_slot_id is not None else null_block_id
    pad = _NO_PAD if pad is None else pad
    activation = _activation(activation)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch tensor, got {type(x).__name__}")
    state = _state_view(conv_state, "conv_state")
    if isinstance(conv_state_indices, torch.Tensor) and conv_state_indices.dim() == 2:
        conv_state_indices = conv_state_indices[:, 0]
    if isinstance(max_query_len, bool) or not isinstance(max_query_len, int):
        raise TypeError(f"max_query_len must be an int, got {max_query_len!r}")
    if query_start_loc is not None:
        if conv_state_indices is None:
            raise ValueError("conv_state_indices is required with query_start_loc (varlen x), as in vLLM")
        if x.dim() != 2:
            raise ValueError(f"x must be (num_tokens, dim) with query_start_loc, got shape {tuple(x.shape)}")
        if max_query_len != -1 and query_start_loc.numel() > 1:
            longest = int((query_start_loc[1:] - query_start_loc[:-1]).max())
            if longest > max_query_len:
                raise ValueError(f"max_query_len = {max_query_len} is smaller than the longest request "
                                 f"({longest} tokens); pass the true maximum or -1")
        xg = x                                   # (N, D)
    elif x.dim() == 3:
        xg = x.transpose(1, 2)                   # (B, D, T) -> (B, T, D) view
    elif x.dim() == 2:
        xg = x                                   # (B, D)
    else:
        raise ValueError(f"x must be (batch, dim), (batch, dim, seqlen) or (num_tokens, dim), "
                         f"got shape {tuple(x.shape)}")
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != x.dtype):
        what = (tuple(out.shape), out.dtype) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"out must be a tensor of x's shape {tuple(x.shape)} and dtype {x.dtype}, got {what}")
    dtype = state.dtype
    weight, bias = _widen(weight, dtype), _widen(bias, dtype)
    kw = dict(activation=activation, num_accepted_tokens=num_accepted_tokens,
              conv_state_indices=conv_state_indices, query_start_loc=query_start_loc, pad_slot_id=pad)
    if x.dtype != dtype:                         # vLLM computes on x.to(conv_state.dtype)
        if out is not None:
            raise TypeError(f"out with x.dtype = {x.dtype} different from conv_state.dtype = {dtype} is not "
                            f"supported; pass x in conv_state's dtype, or out=None")
        xc = xg.to(dtype)
        _g.conv_update_multi(xc, state, weight, bias, out=xc, **kw)
        return (xc.transpose(1, 2) if xg is not x else xc).to(x.dtype)
    target = xg if out is None else (out.transpose(1, 2) if xg is not x else out)
    _g.conv_update_multi(xg, state, weight, bias, out=target, **kw)
    return x if out is None else out


def causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
                     has_initial_state=None, activation="silu", pad_slot_id=PAD_SLOT_ID,
                     null_block_id=NULL_BLOCK_ID, block_idx_first_scheduled_token=None,
                     block_idx_last_scheduled_token=None, initial_state_idx=None,
                     num_computed_tokens=None, block_size_to_align=0, metadata=None,
                     validate_data=False):
    """vLLM's ``causal_conv1d_fn`` (prefill), same arguments, computed by ``gdnconv.conv_prefill``.

    Args (vLLM's names, order and defaults):
        x: ``(dim, num_tokens)``, the requests' tokens end to end. vLLM passes the transpose
            of its ``(num_tokens, dim)`` hidden states (channel stride 1: gdnconv's fast
            layout); any strides work. Computed in ``conv_states``' dtype, as vLLM does.
        weight: ``(dim, width)``, ``2 <= width <= 8``; bias: ``(dim,)`` or None.
        conv_states: ``(num_cache_lines, dim, state_len)``, ``state_len >= width - 1``,
            updated in place (vLLM's "SD" cache passed as ``.transpose(-1, -2)`` is the fast
            layout); None: a convolution from zero history that writes no state.
        query_start_loc: ``(batch + 1,)`` offsets of each request's tokens (required).
        cache_indices: ``(batch,)`` slot per request (or ``(batch, k)``, of which column 0 is
            used, as vLLM's kernel does without prefix caching); None: request ``i`` uses
            slot ``i``.
        has_initial_state: ``(batch,)`` bool: start from rows ``0..width-2`` of the slot; else
            from zero history (the slot is not read). None: no request has one.
        activation: None, "silu", "swish", or a bool (True = silu).
        pad_slot_id: requests whose slot is this are skipped (vLLM's CPU variant).
        null_block_id: requests whose slot is this are skipped too (vLLM's kernel: block 0 is
            the null block); None: no such marker.
        block_idx_first_scheduled_token, block_idx_last_scheduled_token, initial_state_idx,
        num_computed_tokens: prefix caching; must be None. block_size_to_align: must be 0.
        metadata: vLLM's precomputed launch sizes; not needed, ignored.
        validate_data: accepted; gdnconv always validates.

    Afterwards rows ``0..width-2`` of each live slot hold the last ``width - 1`` inputs of
    its request (history included), as vLLM leaves them; skipped requests read and write
    nothing. Returns a new ``(dim, num_tokens)`` tensor in ``x``'s dtype (a transposed view
    of ``(num_tokens, dim)`` memory, vLLM's channel-last layout); rows of skipped requests
    are zeros.

    Raises ValueError/TypeError naming the argument for anything gdnconv refuses (the
    errors of ``gdnconv.conv_prefill``, the prefix-caching arguments); nothing is written then.
    """
    _refuse(block_idx_first_scheduled_token=block_idx_first_scheduled_token,
            block_idx_last_scheduled_token=block_idx_last_scheduled_token,
            initial_state_idx=initial_state_idx, num_computed_tokens=num_computed_tokens)
    if block_size_to_align not in (0, None):
        raise ValueError(f"block_size_to_align = {block_size_to_align!r} (prefix caching) is not "
                         f"supported by gdnconv; pass 0")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a (dim, num_tokens) tensor, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if query_start_loc is None:
        raise ValueError("query_start_loc is required: the (batch + 1,) offsets of the requests' tokens "
                         "in x, as in vLLM")
    state = None if conv_states is None else _state_view(conv_states, "conv_states")
    if isinstance(cache_indices, torch.Tensor) and cache_indices.dim() == 2:
        cache_indices = cache_indices[:, 0]
    if (null_block_id is not None and null_block_id != pad_slot_id and isinstance(cache_indices, torch.Tensor)
            and not cache_indices.is_floating_point()):   # one marker for both (gdnconv checks the rest)
        cache_indices = cache_indices.masked_fill(cache_indices == null_block_id, pad_slot_id)
    dtype = x.dtype if state is None else state.dtype
    weight, bias = _widen(weight, dtype), _widen(bias, dtype)
    out = _g.conv_prefill(x.T.to(dtype), weight, bias, activation=_activation(activation),
                          conv_state=state, query_start_loc=query_start_loc, cache_indices=cache_indices,
                          has_initial_state=has_initial_state, pad_slot_id=pad_slot_id)
    return out.T.to(x.dtype)
