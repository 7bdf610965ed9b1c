"""Route the conv of HF transformers' linear-attention / SSM models through gdnconv.

``patch()`` replaces ``causal_conv1d_update`` (decode) and ``causal_conv1d_fn`` (prefill)
in every modeling module of the installed transformers that defines them
(``ARCHITECTURES``), ``unpatch()`` puts the originals back, ``patched()`` does both around
a ``with`` block. ``counters()`` tells, per architecture and function, how many calls
gdnconv took (``"routed"``) and how many went to the original function (``"fallback"``:
anything gdnconv cannot take, e.g. autograd, a CUDA tensor, an activation other than
SiLU, packed sequences).

Prefill (ref: ``causal_conv1d_fn`` in the same modules): without the ``causal_conv1d``
package transformers runs the function's own torch body, a depthwise ``F.conv1d`` of
``hidden_states`` ``(B, D, T)`` from zero history; the models first prepend the cached
columns themselves (``cache.update_conv_state``, which also writes the cache), so the
function holds no state. gdnconv computes it with ``conv_prefill`` on the ``(B, T, D)``
view (no state) and returns the ``(B, D, T)`` view of the result. Calls with
``cu_seqlens`` or ``seq_idx`` (packed sequences) go to the original, which refuses them
without the ``causal_conv1d`` package (5.19's ignores them).

transformers' convention (ref: ``causal_conv1d_update`` in e.g.
transformers/models/qwen3_next/modeling_qwen3_next.py): ``hidden_states`` ``(B, D, T)``,
``conv_state`` ``(B, D, Lc)`` with ``Lc = W`` columns (the conv kernel size), oldest first;
after the call the state holds the last ``Lc`` columns of ``cat(conv_state, hidden_states)``.
The conv reads only the last ``W - 1`` columns, so gdnconv gets the view
``conv_state.transpose(1, 2)[:, Lc - (W - 1):]`` (``(B, W-1, D)``, rows = time) and does the
plain-mode roll there; the ``Lc - W + 1`` leading columns (column 0 when ``Lc = W``),
which the conv never reads but transformers keeps, are set afterwards to columns
``T .. T + Lc - W`` of ``cat(conv_state, hidden_states)``, as transformers leaves them.
The state stays bit-identical to transformers' own.
"""
import contextlib
import importlib
import importlib.util

try:
    import torch
    import transformers
except ImportError as e:
    raise ImportError(f"gdnconv.transformers needs torch and transformers ({e}): from a gdnconv checkout, "
                      f"pip install \".[transformers]\" (or pip install torch \"transformers>=5.19,<5.24\")") from e
from packaging.specifiers import SpecifierSet

import gdnconv as _g

__all__ = ["patch", "unpatch", "patched", "is_patched", "counters", "reset_counters", "ARCHITECTURES",
           "SUPPORTED_TRANSFORMERS"]

SUPPORTED_TRANSFORMERS = (">=5.19.0", "<5.24")   # the range the "transformers" extra accepts
# every model package of transformers 5.19-5.23 whose modeling module defines causal_conv1d_update (and
# causal_conv1d_fn, same signatures in every release of the range), with the first release of the range that has it
_ADDED = {
    "bailing_hybrid": "5.20", "bamba": "5.19", "falcon_h1": "5.19", "falcon_mamba": "5.19", "glm5_next": "5.19",
    "granitemoehybrid": "5.19", "inkling": "5.19", "inkling2": "5.23", "jamba": "5.19", "kimi_linear": "5.19",
    "lfm2": "5.19", "lfm2_moe": "5.19", "lfm3": "5.23", "mamba": "5.19", "mamba2": "5.19", "nemotron_h": "5.19",
    "olmo_hybrid": "5.19", "qwen3_5": "5.19", "qwen3_5_moe": "5.19", "qwen3_next": "5.19", "qwen4_exp": "5.19",
    "zamba": "5.19", "zamba2": "5.19",
}
# the ones the installed transformers has
ARCHITECTURES = tuple(a for a in _ADDED if importlib.util.find_spec(f"transformers.models.{a}") is not None)
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_originals = {}          # architecture -> {op: the module's original function}
_counts = {}


def _check_version():
    if transformers.__version__ not in SpecifierSet(",".join(SUPPORTED_TRANSFORMERS)):
        raise RuntimeError(
            f"gdnconv.transformers supports transformers {','.join(SUPPORTED_TRANSFORMERS)}, found "
            f"{transformers.__version__}: pip install \"transformers{','.join(SUPPORTED_TRANSFORMERS)}\" "
            f"(or, from a gdnconv checkout, pip install \".[transformers]\")")


def _module(arch):
    return importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")


def _routable(hidden_states, conv_state, weight, bias, activation):
    """True when gdnconv computes exactly what transformers' function would (else: fall back).
    ``conv_state`` None: the prefill conv, which has no state."""
    ts = tuple(t for t in (hidden_states, conv_state, weight, bias) if t is not None)
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in ts):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in ts):
        return False
    if activation not in (None, "silu", "swish") or hidden_states.dim() != 3:
        return False
    if weight.dim() != 2 or (bias is not None and (bias.dim() != 1 or bias.dtype != weight.dtype)):
        return False
    B, D, T = hidden_states.shape
    W = weight.shape[1]
    if not 2 <= W <= 8 or weight.shape[0] != D:
        return False
    dt = hidden_states.dtype
    if conv_state is not None and (conv_state.dim() != 3 or conv_state.shape[:2] != (B, D)
                                   or conv_state.shape[2] < W - 1 or conv_state.dtype != dt):
        return False
    return dt in _DTYPES and weight.dtype in (dt, torch.float32) and T > 0


def _update(hidden_states, conv_state, weight, bias, activation):
    """transformers' causal_conv1d_update through gdnconv (arguments already vetted)."""
    T = hidden_states.shape[2]
    n0 = conv_state.shape[2] - (weight.shape[1] - 1)     # leading columns the conv never reads
    head = None
    if n0 > 0:   # columns T .. T+n0-1 of cat(conv_state, hidden_states), before the roll
        head = torch.cat([conv_state[:, :, :min(conv_state.shape[2], n0 + T)], hidden_states], dim=-1)
        head = head[:, :, T:T + n0]
    out = _g.conv_update_multi(hidden_states.transpose(1, 2), conv_state.transpose(1, 2)[:, n0:],
                               weight, bias, activation=activation)                      # (B, T, D)
    if head is not None:
        conv_state[:, :, :n0].copy_(head)
    return out.transpose(1, 2)


def _route(arch, op, original, routable, run):
    """The module-level replacement for ``op``: ``run`` when ``routable``, else ``original``."""
    count = _counts.setdefault(arch, {}).setdefault(op, {"routed": 0, "fallback": 0})

    def routed(*args, **kwargs):
        if routable(*args, **kwargs):
            out = run(*args, **kwargs)
            count["routed"] += 1
            return out
        count["fallback"] += 1
        return original(*args, **kwargs)
    routed.__name__ = routed.__qualname__ = op
    routed.__wrapped__ = original
    routed.__doc__ = f"gdnconv's route for {arch}'s {op} (gdnconv.transformers)."
    return routed


def _update_routable(hidden_states, conv_state, weight, bias=None, activation=None):
    return _routable(hidden_states, conv_state, weight, bias, activation)


def _update_run(hidden_states, conv_state, weight, bias=None, activation=None):
    return _update(hidden_states, conv_state, weight, bias, activation)


def _fn_routable(hidden_states, weight, bias=None, activation=None, **kwargs):
    # packed sequences (cu_seqlens / seq_idx) go to the original; other kwargs it ignores too
    if kwargs.get("cu_seqlens") is not None or kwargs.get("seq_idx") is not None:
        return False
    return _routable(hidden_states, None, weight, bias, activation)


def _fn_run(hidden_states, weight, bias=None, activation=None, **kwargs):
    # transformers' causal_conv1d_fn: the conv of (B, D, T) tokens from a zero history
    out = _g.conv_prefill(hidden_states.transpose(1, 2), weight, bias, activation=activation)
    return out.transpose(1, 2)


# op name in the modeling modules -> (routable, run); both take the original's arguments
_ROUTES = {"causal_conv1d_update": (_update_routable, _update_run), "causal_conv1d_fn": (_fn_routable, _fn_run)}


def patch(architectures=None):
    """Route the conv ops of ``architectures`` (default: all of ``ARCHITECTURES``) through
    gdnconv. Idempotent. Raises RuntimeError outside the supported transformers range,
    ValueError for an unknown architecture name or one the installed transformers lacks."""
    _check_version()
    archs = ARCHITECTURES if architectures is None else tuple(architectures)
    missing = [f"{a} (added in transformers {_ADDED[a]})" for a in archs if a in _ADDED and a not in ARCHITECTURES]
    if missing:
        raise ValueError(f"transformers {transformers.__version__} lacks {', '.join(missing)}: upgrade "
                         f"transformers or leave them out")
    unknown = [a for a in archs if a not in ARCHITECTURES]
    if unknown:
        raise ValueError(f"architectures {unknown} have no causal_conv1d_update gdnconv can route; "
                         f"known: {', '.join(ARCHITECTURES)}")
    for arch in archs:
        if arch in _originals:
            continue
        mod = _module(arch)
        _originals[arch] = {op: getattr(mod, op) for op in _ROUTES if hasattr(mod, op)}
        for op, original in _originals[arch].items():
            setattr(mod, op, _route(arch, op, original, *_ROUTES[op]))


def _restore(arch):
    mod = _module(arch)
    for op, original in _originals.pop(arch).items():
        setattr(mod, op, original)


def unpatch():
    """Put every original function back (a no-op when nothing is patched)."""
    for arch in list(_originals):
        _restore(arch)


def is_patched(arch=None):
    """Whether ``arch`` (or any architecture, when None) is routed through gdnconv."""
    return bool(_originals) if arch is None else arch in _originals


@contextlib.contextmanager
def patched(architectures=None):
    """``with patched(): ...`` routes through gdnconv inside the block and restores what
    was there before (architectures patched before the block stay patched)."""
    before = set(_originals)
    patch(architectures)
    try:
        yield
    finally:
        for arch in set(_originals) - before:
            _restore(arch)


def counters():
    """``{architecture: {op: {"routed": n, "fallback": m}}}`` since the last reset (a copy)."""
    return {a: {op: dict(c) for op, c in ops.items()} for a, ops in _counts.items()}


def reset_counters():
    for ops in _counts.values():
        for c in ops.values():
            c["routed"] = c["fallback"] = 0
