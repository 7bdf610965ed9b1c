"""gdnconv: the CPU kernel for the short causal convolution of Gated DeltaNet and
Mamba-style layers (Qwen3-Next, Qwen3.5, Mamba2, ...) in decoding and speculative
decoding. ``conv_update_multi`` follows vLLM's ``causal_conv1d_update``, and
``conv_prefill`` (the prompt, which seeds each request's state) its ``causal_conv1d_fn``.

The kernel (``avx512bf16``, ``avx512``, ``avx2``; ``neonbf16``, ``neon`` on aarch64; or the
portable ``scalar``) is chosen once at import: the best one this CPU supports, or the one
named by the ``GDNCONV_ISA`` environment variable. ``gdnconv.reference`` is the float64 definition of the op,
``gdnconv.testing`` the accepted error, ``gdnconv simulate`` the main job. Inside a function
that ``torch.compile`` traces, the calls on tensors trace as the ``gdnconv::`` torch ops.
"""
import os as _os

__version__ = "0.1.0"

from ._core import (  # noqa: E402
    active_isa,
    available_isas,
    bytes_moved,
    compiled_isas,
    conv_prefill,
    conv_update_multi,
    cpu_features,
    get_num_threads,
    last_path,
    out_cache_bytes,
    pack_weight,
    prefill_bytes_moved,
    set_isa,
    set_num_threads,
    set_out_cache_bytes,
    thread_contention,
)

__all__ = [
    "conv_update_multi", "conv_prefill", "pack_weight", "bytes_moved", "prefill_bytes_moved",
    "set_num_threads", "get_num_threads", "thread_contention", "set_out_cache_bytes", "out_cache_bytes",
    "cpu_features", "available_isas", "compiled_isas", "active_isa", "set_isa", "last_path", "__version__",
]


def _select_isa_from_env():
    name = _os.environ.get("GDNCONV_ISA", "").strip()
    try:
        set_isa(name or None)
    except ValueError as e:
        raise ImportError(f"GDNCONV_ISA={name!r} cannot be used: {e}") from None


_select_isa_from_env()

from . import _compile  # noqa: E402

_compile.watch()   # torch.compile traces the plain calls on tensors as the gdnconv:: ops (never imports torch)
