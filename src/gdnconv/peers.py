"""What gdnconv is measured against: the per-request torch loop that serving engines
run without a native kernel, and a plain copy of the same number of bytes.

torch is imported only inside these functions.
"""
import numpy as np


def torch_loop_update(x, conv_state, weight, bias=None, *, activation="silu", num_accepted_tokens=None,
                      conv_state_indices=None, query_start_loc=None, pad_slot_id=-1, out=None):
    """gdnconv.conv_update_multi as a Python loop over requests with torch ops
    (``torch.cat`` + depthwise ``F.conv1d`` + state copy per request), all tensors.

    Shapes and semantics as ``gdnconv.conv_update_multi``; ``conv_state`` is updated
    in place; returns ``out``.
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


def copy_same_bytes(nbytes, use_torch=False):
    """A no-argument callable that copies ``nbytes`` between two preallocated buffers
    (``np.copyto``, or torch's ``copy_``): the memory-speed yardstick."""
    if use_torch:
        import torch

        src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
        return lambda: dst.copy_(src)
    src, dst = np.ones(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8)
    return lambda: np.copyto(dst, src)
