"""torch.library custom ops for gdnconv: importing this module registers them.

``torch.ops.gdnconv.conv_update_multi`` and ``torch.ops.gdnconv.conv_prefill`` return a
new output; ``torch.ops.gdnconv.conv_update_multi_out`` and
``torch.ops.gdnconv.conv_prefill_out`` write a given ``out`` and return nothing (a custom
op may not return one of its inputs). All mark ``conv_state`` (and ``out``) as mutated,
so ``torch.compile`` (``fullgraph=True`` included) keeps the in-place update and the
ordering around it. ``conv_update_multi`` and ``conv_prefill`` below pick one of each
pair, with the arguments of ``gdnconv.conv_update_multi`` / ``gdnconv.conv_prefill``.

Design:
- the ops call ``gdnconv.conv_update_multi`` on the tensors they get (zero-copy);
- the fake implementations give the output's exact shape, dtype and strides
  (contiguous, as the real op returns it) so a compiled graph needs no real data;
  they refuse a mix of devices (one meta tensor among CPU ones), as torch's ops do;
- ``activation`` goes through the schema as a string (booleans are mapped first);
- NumPy users never import this module, so ``import gdnconv`` never imports torch.
"""
import torch

from . import _core

__all__ = ["conv_prefill", "conv_update_multi"]


def _activation(activation):
    if activation is True:
        return "silu"
    if activation is False:
        return None
    return activation


_ARGS = ("Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias, str? activation, "
         "Tensor? num_accepted_tokens, Tensor? conv_state_indices, Tensor? query_start_loc, int pad_slot_id")
# Library.define + impl, not torch.library.custom_op: the same schema and fake, but the call
# goes straight through the dispatcher (custom_op's Python wrapper cost ~15x the plain call).
_lib = torch.library.Library("gdnconv", "DEF")
# num_threads last, with a default: positional calls that end at pad_slot_id (or out) still match
# prefix caching's arguments after them, with defaults too
_lib.define(f"conv_update_multi({_ARGS}, int? num_threads=None, Tensor? initial_state_indices=None, "
            f"bool is_weight_packed=False) -> Tensor")
_lib.define(f"conv_update_multi_out({_ARGS}, Tensor(b!) out, int? num_threads=None, "
            f"Tensor? initial_state_indices=None, bool is_weight_packed=False) -> ()")
_PREFILL_ARGS = ("Tensor x, Tensor weight, Tensor? bias, str? activation, Tensor(a!)? conv_state, "
                 "Tensor? query_start_loc, Tensor? cache_indices, Tensor? has_initial_state, int pad_slot_id, "
                 "int? num_threads")
_PREFILL_CACHE = "Tensor? initial_state_indices=None, Tensor? snapshots=None, bool is_weight_packed=False"
_lib.define(f"conv_prefill({_PREFILL_ARGS}, {_PREFILL_CACHE}) -> Tensor")
_lib.define(f"conv_prefill_out({_PREFILL_ARGS}, Tensor(b!) out, {_PREFILL_CACHE}) -> ()")


def _op(x, conv_state, weight, bias, activation, num_accepted_tokens, conv_state_indices, query_start_loc,
        pad_slot_id, num_threads=None, initial_state_indices=None, is_weight_packed=False):
    out = _core.conv_update_multi(x, conv_state, weight, bias, activation=activation,
                                  num_accepted_tokens=num_accepted_tokens,
                                  conv_state_indices=conv_state_indices,
                                  query_start_loc=query_start_loc, pad_slot_id=pad_slot_id, num_threads=num_threads,
                                  initial_state_indices=initial_state_indices, is_weight_packed=is_weight_packed)
    return out if out.is_contiguous() else out.contiguous()


def _op_out(x, conv_state, weight, bias, activation, num_accepted_tokens, conv_state_indices,
            query_start_loc, pad_slot_id, out, num_threads=None, initial_state_indices=None, is_weight_packed=False):
    _core.conv_update_multi(x, conv_state, weight, bias, activation=activation,
                            num_accepted_tokens=num_accepted_tokens, conv_state_indices=conv_state_indices,
                            query_start_loc=query_start_loc, pad_slot_id=pad_slot_id, out=out,
                            num_threads=num_threads, initial_state_indices=initial_state_indices,
                            is_weight_packed=is_weight_packed)


def _prefill(x, weight, bias, activation, conv_state, query_start_loc, cache_indices, has_initial_state,
             pad_slot_id, num_threads, initial_state_indices=None, snapshots=None, is_weight_packed=False):
    out = _core.conv_prefill(x, weight, bias, activation=activation, conv_state=conv_state,
                          query_start_loc=query_start_loc, cache_indices=cache_indices,
                          has_initial_state=has_initial_state, pad_slot_id=pad_slot_id, num_threads=num_threads,
                          initial_state_indices=initial_state_indices, snapshots=snapshots,
                          is_weight_packed=is_weight_packed)
    return out if out.is_contiguous() else out.contiguous()


def _prefill_out(x, weight, bias, activation, conv_state, query_start_loc, cache_indices, has_initial_state,
                 pad_slot_id, num_threads, out, initial_state_indices=None, snapshots=None, is_weight_packed=False):
    _core.conv_prefill(x, weight, bias, activation=activation, conv_state=conv_state,
                    query_start_loc=query_start_loc, cache_indices=cache_indices,
                    has_initial_state=has_initial_state, pad_slot_id=pad_slot_id, num_threads=num_threads,
                    out=out, initial_state_indices=initial_state_indices, snapshots=snapshots,
                    is_weight_packed=is_weight_packed)


_lib.impl("conv_update_multi", _op, "CPU")
_lib.impl("conv_update_multi_out", _op_out, "CPU")
_lib.impl("conv_prefill", _prefill, "CPU")
_lib.impl("conv_prefill_out", _prefill_out, "CPU")


def _one_device(op, **tensors):
    """The fake kernels run for fake tensors (torch.compile, FakeTensorMode) and for
    meta tensors, which the dispatcher sends here when any argument is on the meta
    device: a mix of meta and CPU tensors is refused as torch's own ops refuse it
    (the CPU arguments would otherwise be left unwritten, the output uninitialised)."""
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        where = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise RuntimeError(f"gdnconv::{op}: expected all tensors to be on the same device, got {where}: "
                           f"pass CPU tensors to compute, or meta tensors only to infer shapes")


@torch.library.register_fake("gdnconv::conv_update_multi", lib=_lib)
def _op_fake(x, conv_state, weight, bias, activation, num_accepted_tokens, conv_state_indices,
             query_start_loc, pad_slot_id, num_threads=None, initial_state_indices=None, is_weight_packed=False):
    _one_device("conv_update_multi", x=x, conv_state=conv_state, weight=weight, bias=bias,
                num_accepted_tokens=num_accepted_tokens, conv_state_indices=conv_state_indices,
                query_start_loc=query_start_loc, initial_state_indices=initial_state_indices)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.register_fake("gdnconv::conv_update_multi_out", lib=_lib)
def _op_out_fake(x, conv_state, weight, bias, activation, num_accepted_tokens, conv_state_indices,
                 query_start_loc, pad_slot_id, out, num_threads=None, initial_state_indices=None,
                 is_weight_packed=False):
    _one_device("conv_update_multi_out", x=x, conv_state=conv_state, weight=weight, bias=bias,
                num_accepted_tokens=num_accepted_tokens, conv_state_indices=conv_state_indices,
                query_start_loc=query_start_loc, out=out, initial_state_indices=initial_state_indices)
    return None


@torch.library.register_fake("gdnconv::conv_prefill", lib=_lib)
def _prefill_fake(x, weight, bias, activation, conv_state, query_start_loc, cache_indices, has_initial_state,
                  pad_slot_id, num_threads, initial_state_indices=None, snapshots=None, is_weight_packed=False):
    _one_device("conv_prefill", x=x, weight=weight, bias=bias, conv_state=conv_state,
                query_start_loc=query_start_loc, cache_indices=cache_indices, has_initial_state=has_initial_state,
                initial_state_indices=initial_state_indices, snapshots=snapshots)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.register_fake("gdnconv::conv_prefill_out", lib=_lib)
def _prefill_out_fake(x, weight, bias, activation, conv_state, query_start_loc, cache_indices,
                      has_initial_state, pad_slot_id, num_threads, out, initial_state_indices=None, snapshots=None,
                      is_weight_packed=False):
    _one_device("conv_prefill_out", x=x, weight=weight, bias=bias, conv_state=conv_state,
                query_start_loc=query_start_loc, cache_indices=cache_indices, has_initial_state=has_initial_state,
                out=out, initial_state_indices=initial_state_indices, snapshots=snapshots)
    return None


def conv_update_multi(x, conv_state, weight, bias=None, *, activation="silu", num_accepted_tokens=None,
                      conv_state_indices=None, query_start_loc=None, pad_slot_id=-1, out=None, num_threads=None,
                      initial_state_indices=None, is_weight_packed=False):
    """``gdnconv.conv_update_multi`` through the registered torch ops (torch tensors only).

    Same arguments, semantics and errors as ``gdnconv.conv_update_multi``; ``torch.compile``
    traces a plain ``gdnconv.conv_update_multi`` call as this one. Returns ``out`` (a new
    tensor when not given).
    """
    activation = _activation(activation)
    if out is None:
        return torch.ops.gdnconv.conv_update_multi(x, conv_state, weight, bias, activation,
                                                   num_accepted_tokens, conv_state_indices,
                                                   query_start_loc, pad_slot_id, num_threads,
                                                   initial_state_indices, is_weight_packed)
    torch.ops.gdnconv.conv_update_multi_out(x, conv_state, weight, bias, activation, num_accepted_tokens,
                                            conv_state_indices, query_start_loc, pad_slot_id, out, num_threads,
                                            initial_state_indices, is_weight_packed)
    return out


def conv_prefill(x, weight, bias=None, *, activation="silu", conv_state=None, query_start_loc=None,
                 cache_indices=None, has_initial_state=None, pad_slot_id=-1, out=None, num_threads=None,
                 initial_state_indices=None, snapshots=None, is_weight_packed=False):
    """``gdnconv.conv_prefill`` through the registered torch ops (torch tensors only).

    Same arguments, semantics and errors as ``gdnconv.conv_prefill`` (vLLM's
    ``causal_conv1d_fn``); ``torch.compile`` traces a plain ``gdnconv.conv_prefill`` call as
    this one. Returns ``out`` (a new contiguous tensor of ``x``'s shape when not given).
    """
    activation = _activation(activation)
    args = (x, weight, bias, activation, conv_state, query_start_loc, cache_indices, has_initial_state,
            pad_slot_id, num_threads)
    if out is None:
        return torch.ops.gdnconv.conv_prefill(*args, initial_state_indices, snapshots, is_weight_packed)
    torch.ops.gdnconv.conv_prefill_out(*args, out, initial_state_indices, snapshots, is_weight_packed)
    return out
