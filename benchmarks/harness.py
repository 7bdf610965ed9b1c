"""What the benchmark scripts share: the engine-like rotation that makes every timed call
find its data cold, calibrated interleaved samples, and the same-bytes copy.

Engine-like (cold) mode, the default: in a served model every GDN/Mamba layer has its
own conv state, inputs, outputs and weights, and between two calls of one layer the
other layers run and evict them. A benchmark therefore builds ``Rotation.layers(...)``
separate sets of arrays, together ``--cold-factor`` (4) times the last-level cache, and
each call of a peer goes to the next set (``cycle``), so every call starts cold. Every
peer (gdnconv, vLLM's kernel, the torch loop, the copy) gets the same rotation.
``--layers N`` instead rotates through N sets (a model's N layers, as the issues' side
by side runs did with 32), fewer where N of them would take more than ``--max-mib``;
small layers then stay in a large last-level cache, as they would between two steps of
such a model. ``--warm`` uses one set: repeated calls on the same arrays, as earlier
versions timed.

    rotation = Rotation.from_args(args)
    n = rotation.layers(bytes_of_one_layer)
    fn = cycle([make_call(layer) for layer in build(n)])
    calls, est = calibrate(fn, 250e3)
    samples = [sample_ns(fn, calls) for _ in range(repeats)]
"""
import itertools
import math
import statistics
import time

import numpy as np

from gdnconv.timing import last_level_cache_bytes

__all__ = ["Rotation", "add_mode_arguments", "cycle", "copy_same_bytes", "parallel_copy", "sample_ns", "calibrate",
           "stats"]


def add_mode_arguments(parser, layers=0):
    """--warm, --cold-factor, --layers and --max-mib, the options of ``Rotation.from_args``."""
    parser.add_argument("--warm", action="store_true",
                        help="repeated calls on the same arrays (data stays in the caches); default: engine-like "
                             "cold mode, every call on the next of enough layers' separate arrays that it starts cold")
    parser.add_argument("--cold-factor", type=float, default=4.0, metavar="F",
                        help="cold mode: the layers' arrays together hold F times the last-level cache "
                             "(default: %(default)s)")
    parser.add_argument("--layers", type=int, default=layers, metavar="N",
                        help="cold mode: rotate through N layers' arrays instead (a model's N layers), fewer where "
                             "N layers would take more than --max-mib; 0: as many as --cold-factor asks "
                             "(default: %(default)s)")
    parser.add_argument("--max-mib", type=float, default=1024.0, metavar="M",
                        help="with --layers: at most M MiB of layers per peer (default: %(default)s)")
    return parser


class Rotation:
    """How many layers' separate arrays each peer cycles through: one when ``warm``;
    ``fixed`` (> 0) when given, but no more than fit in ``max_bytes`` (at least 2); else
    enough that they hold ``factor`` times the last-level cache (at least 2)."""

    def __init__(self, warm=False, factor=4.0, fixed=0, max_bytes=1 << 30):
        if not warm and not factor > 0:
            raise SystemExit(f"--cold-factor must be > 0, got {factor}")
        if fixed < 0 or not max_bytes > 0:
            raise SystemExit(f"--layers must be >= 0 and --max-mib > 0, got {fixed} and {max_bytes / 2**20:g}")
        self.warm, self.factor, self.fixed, self.max_bytes = warm, factor, fixed, max_bytes
        self.llc = last_level_cache_bytes()

    @classmethod
    def from_args(cls, args):
        return cls(args.warm, args.cold_factor, getattr(args, "layers", 0),
                   getattr(args, "max_mib", 1024.0) * 2**20)

    def layers(self, layer_bytes):
        """Sets of arrays to rotate through when one set takes ``layer_bytes``."""
        if self.warm:
            return 1
        if self.fixed:
            return max(2, min(self.fixed, int(self.max_bytes // max(int(layer_bytes), 1))))
        return max(2, math.ceil(self.factor * self.llc / max(int(layer_bytes), 1)))

    def describe(self):
        """One line saying which mode runs."""
        if self.warm:
            return "mode: warm (repeated calls on the same arrays, data in the caches)"
        if self.fixed:
            return (f"mode: engine-like, {self.fixed} layers (each call on the next layer's own state, x, out and "
                    f"weights, fewer layers where {self.fixed} would take more than {self.max_bytes / 2**20:g} MiB; "
                    f"last-level cache {self.llc / 2**20:.1f} MiB; --warm for repeated calls on the same arrays)")
        return (f"mode: engine-like cold (each call on the next layer's own state, x, out and weights; the layers "
                f"together hold {self.factor:g}x the {self.llc / 2**20:.1f} MiB last-level cache; --warm for "
                f"repeated calls on the same arrays)")


_VLLM_WEIGHT = []


def vllm_weight(t):
    """The torch tensor t as vLLM 0.32 holds a layer's weight (its conv1d's too): a
    ModelWeightParameter, an nn.Parameter subclass whose ``__torch_function__`` is Python
    (vllm.model_executor.parameter.BasevLLMParameter's: it calls super()), requires_grad
    False; mirrored here, so that vLLM need not be imported."""
    if not _VLLM_WEIGHT:
        import torch

        class ModelWeightParameter(torch.nn.Parameter):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                return super().__torch_function__(func, types, args, kwargs or {})

        _VLLM_WEIGHT.append(ModelWeightParameter)
    return _VLLM_WEIGHT[0](t, requires_grad=False)


def vllm_layer(weight, bias, unpacked, activation="silu"):
    """A GDN layer as vLLM 0.32's engine holds it, for the plugin's speculative conv: modules,
    ``layer.conv1d`` a submodule whose weight is a registered parameter where it is a Parameter
    (vllm_weight), else an attribute; its bias a registered None where there is none (vLLM's conv1d
    is a linear layer built without bias), else an attribute; ``_cpu_unpacked_conv_weight`` (the
    stash of the plain weight: vLLM stores a clone, a plain tensor) an attribute."""
    import torch
    conv1d = torch.nn.Module()
    if isinstance(weight, torch.nn.Parameter):
        conv1d.register_parameter("weight", weight)
    else:
        conv1d.weight = weight
    if bias is None:
        conv1d.register_parameter("bias", None)
    else:
        conv1d.bias = bias
    conv1d._cpu_unpacked_conv_weight = unpacked
    layer = torch.nn.Module()
    layer.conv1d = conv1d
    layer.activation = activation
    return layer


def cycle(calls, turn=None):
    """One no-argument callable that calls ``calls[0]``, ``calls[1]``, ... in turn.
    ``turn``, an iterator of indices (``itertools.cycle(range(n))``), may be shared by the
    callables of several peers on the same layers, so that each call goes to the layer
    that waited longest, whichever peer ran last."""
    calls = list(calls)
    if len(calls) == 1:
        return calls[0]
    turn = itertools.cycle(range(len(calls))) if turn is None else turn
    return lambda: calls[next(turn)]()


def copy_same_bytes(nbytes, layers=1, use_torch=False, threads=1):
    """A no-argument callable that copies ``nbytes`` between two preallocated buffers
    (``np.copyto``, or torch's ``copy_``), a different pair on each of ``layers``
    calls in turn: the memory-speed yardstick, rotated like the peers. ``threads`` > 1
    (NumPy only): the buffers are cut in that many 64-byte aligned parts, copied at once
    by the calling thread and a pool of ``threads - 1`` (``np.copyto`` releases the
    GIL), as a kernel with that many threads can move them; the pool's hand-over costs
    ~13 us a call on the 2-core Xeon, so below a few MiB the one-thread copy is faster."""
    calls = []
    for _ in range(layers):
        if use_torch:
            import torch
            src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
            calls.append(lambda s=src, d=dst: d.copy_(s))
            continue
        src, dst = np.ones(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8)
        dst[...] = 0
        calls.append(parallel_copy(dst, src, threads) if threads > 1 else lambda s=src, d=dst: np.copyto(d, s))
    return cycle(calls)


def parallel_copy(dst, src, threads):
    """A no-argument callable that copies the C-contiguous array ``src`` into ``dst`` (of
    its shape and dtype) in ``threads`` parts of whole 64-byte lines of the flat memory
    (the last one shorter), the calling thread taking the first and the pool of
    ``threads - 1`` the rest, all at once."""
    if not (src.flags.c_contiguous and dst.flags.c_contiguous and dst.shape == src.shape and dst.dtype == src.dtype):
        raise ValueError("parallel_copy takes two C-contiguous arrays of one shape and dtype")
    dst, src = dst.reshape(-1), src.reshape(-1)
    pool = _copy_pool(threads)
    step = max(64, -(-src.nbytes // threads // 64) * 64) // src.itemsize
    parts = [(dst[i:i + step], src[i:i + step]) for i in range(0, len(src), step)]

    def copy(first=parts[0], rest=parts[1:]):
        pending = [pool.submit(np.copyto, d, s) for d, s in rest]
        np.copyto(*first)
        for f in pending:
            f.result()
    return copy


_pools = {}


def _copy_pool(threads):
    """One thread pool per thread count, shared by every copy that asks for it."""
    if threads not in _pools:
        from concurrent.futures import ThreadPoolExecutor
        _pools[threads] = ThreadPoolExecutor(threads - 1, thread_name_prefix="copy")
    return _pools[threads]


def sample_ns(fn, n, warm_up=True):
    """Nanoseconds per call of ``n`` calls of ``fn`` in a row, after one untimed call
    when ``warm_up`` (it wakes the thread pools; under a rotation the timed calls still
    go to other layers)."""
    if warm_up:
        fn()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n


SLOW_NS = 50e6


def calibrate(fn, sample_ns_target):
    """Warm up, then (calls per sample, estimated ns per call) for samples lasting at
    least ``sample_ns_target``. A callable slower than one sample is called only twice
    (warm-up, then timed), one slower than SLOW_NS only once."""
    t = sample_ns(fn, 1, False)
    if t >= SLOW_NS:           # very slow (the fp16 torch loop): the first call is the estimate
        return 1, t
    t = sample_ns(fn, 1, False)
    if t >= sample_ns_target:
        return 1, t
    n_warm = max(2, min(50, int(20e6 / max(t, 1))))   # about 20 ms of warm-up, 2..50 calls
    sample_ns(fn, n_warm, False)
    t = min(sample_ns(fn, 1, False) for _ in range(3))
    n = max(1, math.ceil(sample_ns_target / max(t, 1)))
    t = sample_ns(fn, n, False)
    n = max(1, math.ceil(sample_ns_target / max(t, 1)))
    return n, t


def stats(samples):
    """(median, minimum, interquartile range in % of the median) of timing samples."""
    s = sorted(samples)
    med = statistics.median(s)
    q1, q3 = np.percentile(s, [25, 75]) if len(s) > 1 else (med, med)
    return med, s[0], 100.0 * (q3 - q1) / med if med > 0 else 0.0
