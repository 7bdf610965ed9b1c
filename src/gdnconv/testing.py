"""The accepted error of ``conv_update_multi``, as one definition (like ``numpy.testing``).

SPEC "Numerics": against the float64 reference (``gdnconv.reference``),

- float32 ``out``: ``1e-5 * |ref|``;
- float16 / bfloat16 ``out``: one unit in the last place of the reference rounded to
  the output dtype;

each at least the dtype's smallest subnormal, plus float32 accumulation noise
``8 * 2**-24 * magnitude`` (``* 1.1`` with SiLU), where ``magnitude`` is
``|bias| + sum_k |weight[:, k] * window[k]|`` per output
(``gdnconv.reference.magnitude``). NaN in the reference must be NaN in ``out``,
infinities must be equal, and a finite reference that overflows the output dtype
must give the infinity of its sign. The state roll is a copy: states are compared
bit for bit through integer views, NaN payloads included.

The tests, ``gdnconv simulate`` and the benchmarks all check with these functions.
Arrays may be NumPy arrays (bfloat16 as ``ml_dtypes.bfloat16``) or torch CPU tensors.
"""
import sys

import numpy as np

__all__ = ["NOISE", "SILU_NOISE_FACTOR", "FP32_RTOL", "allowed_error", "error_ratio", "assert_outputs_close",
           "assert_states_equal", "assert_bits_equal", "bits", "to_numpy", "as_torch"]

NOISE = 8 * 2.0 ** -24       # fp32 accumulation noise per unit of magnitude
SILU_NOISE_FACTOR = 1.1      # SiLU in fp32 adds a little to it
FP32_RTOL = 1e-5             # float32 outputs: relative error
# the smallest positive subnormal of each output dtype: the floor of one ulp
_SUBNORMAL_MIN = {"float32": 2.0 ** -149, "float16": 2.0 ** -24, "bfloat16": 2.0 ** -133}
# |x| below which a value surely stays finite when rounded to the dtype (half its largest finite value)
_SURELY_FINITE = {"float32": 2.0 ** 127, "float16": 2.0 ** 15, "bfloat16": 2.0 ** 127}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _is_tensor(a):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def bits(a):
    """A copy of the raw bits of a float array or torch tensor as unsigned integers of
    the same width (``uint16`` for bf16/fp16, ``uint32`` for fp32), same shape."""
    if _is_tensor(a):
        import torch
        size = a.element_size()
        raw = a.detach().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[size]).numpy()
        return np.array(raw.view(_UINT[size]))
    a = np.asarray(a)
    return np.array(a.view(_UINT[a.dtype.itemsize]))


def to_numpy(a):
    """A NumPy copy of an array or torch tensor in its own dtype, bits kept (a bf16
    tensor becomes ``ml_dtypes.bfloat16``); ``None`` stays ``None``."""
    if a is None:
        return None
    if _is_tensor(a):
        if not a.is_floating_point():
            return a.detach().numpy().copy()
        import torch
        if a.dtype == torch.bfloat16:
            import ml_dtypes
            return bits(a).view(ml_dtypes.bfloat16)
        return bits(a).view({torch.float16: np.float16, torch.float32: np.float32,
                             torch.float64: np.float64}[a.dtype])
    return np.array(a)


def as_torch(a):
    """A torch tensor sharing the memory of NumPy array ``a`` (bfloat16 through its
    bits, which ``torch.from_numpy`` refuses); ``None`` stays ``None``."""
    if a is None:
        return None
    import torch
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _dtype_name(dtype):
    name = np.dtype(dtype).name
    if name not in _SUBNORMAL_MIN:
        raise TypeError(f"dtype must be float32, float16 or bfloat16, got {name}")
    return name


def allowed_error(reference, magnitude, dtype, *, silu):
    """The largest accepted ``|out - reference|`` per element, float64.

    reference: float64 array, the exact output (finite values); magnitude: float64
    array of the same shape (``gdnconv.reference.magnitude``); dtype: the output dtype
    (float32, float16 or bfloat16, a NumPy dtype); silu: whether the call applied SiLU.
    Raises TypeError for another dtype.
    """
    name = _dtype_name(dtype)
    reference = np.asarray(reference, dtype=np.float64)
    noise = NOISE * np.asarray(magnitude, dtype=np.float64) * (SILU_NOISE_FACTOR if silu else 1.0)
    if name == "float32":
        ulp = np.maximum(FP32_RTOL * np.abs(reference), _SUBNORMAL_MIN[name])
    else:   # the spacing of a 16-bit value is at least its smallest subnormal
        with np.errstate(over="ignore"):
            rounded = np.abs(reference).astype(np.dtype(dtype))
        ulp = np.spacing(rounded).astype(np.float64)
    ulp += noise
    return ulp


def error_ratio(actual, reference, magnitude, dtype=None, *, silu):
    """``|actual - reference| / allowed_error`` per element, float64, ``reference``'s
    shape: 1.0 is at the limit. Where the reference is not finite, or is finite but
    beyond the output dtype's range, ``actual`` must equal it rounded to the dtype
    (NaN for NaN, the infinity of its sign): 0 if it does, ``inf`` if not. A NaN
    ``actual`` against a finite reference is ``inf``.

    actual: the kernel's output (NumPy array or torch tensor); reference, magnitude:
    float64 arrays of the same shape; dtype: the output dtype (default ``actual``'s).
    Raises ValueError when the shapes differ, TypeError for a dtype other than
    float32, float16 or bfloat16.
    """
    a = to_numpy(actual) if _is_tensor(actual) else np.asarray(actual)
    dtype = a.dtype if dtype is None else np.dtype(dtype)
    with np.errstate(invalid="ignore"):   # signaling NaNs warn when cast
        a = a.astype(np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if a.shape != ref.shape:
        raise ValueError(f"actual's shape {a.shape} != reference's {ref.shape}")
    mag = np.broadcast_to(magnitude, ref.shape)
    with np.errstate(invalid="ignore"):
        usual = bool(np.all(np.abs(ref) < _SURELY_FINITE[_dtype_name(dtype)]))   # no NaN, inf or overflow
    if usual:
        ratio = np.abs(a - ref)
        ratio /= allowed_error(ref, mag, dtype, silu=silu)
    else:
        with np.errstate(over="ignore"):
            rounded = ref.astype(dtype).astype(np.float64)
        chk = np.isfinite(rounded)
        ratio = np.zeros(ref.shape)
        ratio[chk] = np.abs(a[chk] - ref[chk]) / allowed_error(ref[chk], mag[chk], dtype, silu=silu)
        special_ok = (a == rounded) | (np.isnan(a) & np.isnan(rounded))
        ratio[~chk & ~special_ok] = np.inf
    ratio[np.isnan(ratio)] = np.inf
    return ratio


def assert_outputs_close(actual, reference, magnitude, dtype=None, *, silu, rows=None, err_msg="out"):
    """Assert that ``actual`` is within the SPEC tolerance of ``reference``
    (``error_ratio <= 1`` everywhere checked).

    actual: the kernel's output, any shape, NumPy array or torch tensor; reference and
    magnitude: float64 arrays of the same shape; dtype: the output dtype (default:
    ``actual``'s); silu: whether SiLU was applied; rows: an optional boolean mask or
    index over the leading dimensions selecting what to check (for example the rows
    of requests that were not skipped).

    Raises AssertionError naming the count of offending elements and the first one:
    its position, value, the reference and the allowed error.
    """
    a = to_numpy(actual)
    dtype = a.dtype if dtype is None else np.dtype(dtype)
    ref = np.asarray(reference, dtype=np.float64)
    if a.shape != ref.shape:
        raise AssertionError(f"{err_msg}: shape {a.shape} != reference {ref.shape}")
    mag = np.broadcast_to(np.asarray(magnitude, dtype=np.float64), ref.shape)
    if rows is not None:
        a, ref, mag = a[rows], ref[rows], mag[rows]
    ratio = error_ratio(a, ref, mag, dtype, silu=silu)
    bad = ~(ratio <= 1.0)
    if bad.any():
        pos = tuple(int(v) for v in np.argwhere(bad)[0])
        with np.errstate(invalid="ignore", over="ignore"):
            got, want = float(a[pos]), float(ref[pos])
            allowed = float(allowed_error(want, mag[pos], dtype, silu=silu)) if np.isfinite(want) else 0.0
        raise AssertionError(
            f"{err_msg}: {int(bad.sum())} of {bad.size} values out of tolerance; first at {pos} "
            f"(of the checked rows): got {got!r}, reference {want!r}, error {abs(got - want):.3g} "
            f"> allowed {allowed:.3g} (max error/allowed {float(np.max(ratio)):.3g})")


def assert_bits_equal(actual, expected, err_msg="array"):
    """Assert that two float arrays (or tensors) of the same shape and element size hold
    the same bits everywhere (NaN payloads and signed zeros included).

    Raises AssertionError with the count of differing elements and the first one."""
    a, e = bits(actual), bits(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{err_msg}: shape {a.shape} != {e.shape}")
    diff = a != e
    if diff.any():
        idx = tuple(int(i) for i in np.argwhere(diff)[0])
        raise AssertionError(
            f"{err_msg}: {int(diff.sum())} of {diff.size} elements differ bitwise; first at {idx}: "
            f"got 0x{int(a[idx]):x} ({to_numpy(actual)[idx]}), expected 0x{int(e[idx]):x} "
            f"({to_numpy(expected)[idx]})")


def assert_states_equal(actual, expected, err_msg="conv_state"):
    """Assert that a ``conv_state`` (``(S, L, D)``, any strides, NumPy array or tensor)
    equals the expected one bit for bit: the state roll is a copy (SPEC Numerics).

    Raises AssertionError as ``assert_bits_equal``."""
    assert_bits_equal(actual, expected, err_msg)
