"""Shared helpers for the gdnconv test suite.

- dtype tables and bit views (states are compared bit for bit through integer views);
- the tolerance of SPEC "Numerics" against the float64 reference;
- a builder of random calls (shapes, modes, layouts, pads) and a runner that checks
  one call against ``gdnconv.reference.conv_update_multi_ref``;
- the ``isa`` fixture, parametrized over every compiled kernel;
- ``run_python``, a fresh interpreter for what must start from a clean import.
"""
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import gdnconv
from gdnconv.reference import conv_update_multi_ref

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
DTYPES = {"fp32": F32, "fp16": F16, "bf16": BF16}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# smallest positive subnormal of each output dtype: the floor of one ulp
SUBNORMAL_MIN = {F32: 2.0 ** -149, F16: 2.0 ** -24, BF16: 2.0 ** -133}
# fp32 accumulation noise per unit of sum |w_k * window_k| (plus |bias|)
NOISE = 8 * 2.0 ** -24
SILU_NOISE_FACTOR = 1.1


def run_python(code, timeout=120, **env):
    """Run code in a fresh interpreter that imports this gdnconv, with env added to the
    environment; returns the CompletedProcess (text output captured). Raises
    subprocess.TimeoutExpired after timeout seconds."""
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join(p for p in [full.get("PYTHONPATH", "")] + sys.path if p)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          timeout=timeout)


# ----------------------------------------------------------------- arrays

def is_tensor(a):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def _torch_np_dtype(t):
    import torch
    return {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16}[t.dtype]


def bits(a):
    """A copy of the raw bits of a float array or tensor, as unsigned integers."""
    if is_tensor(a):
        import torch
        size = a.element_size()
        raw = a.detach().view({2: torch.int16, 4: torch.int32}[size]).numpy()
        return np.array(raw.view(_UINT[size]))
    a = np.asarray(a)
    return np.array(a.view(_UINT[a.dtype.itemsize]))


def as_np(a):
    """A NumPy copy of an array or tensor in its own dtype (bf16 -> ml_dtypes), bits kept."""
    if a is None:
        return None
    if is_tensor(a):
        if a.is_floating_point():
            return bits(a).view(_torch_np_dtype(a))
        return a.numpy().copy()
    return np.array(a)


def f64(a):
    if a is None:
        return None
    with np.errstate(invalid="ignore"):   # signaling NaNs warn when cast
        return as_np(a).astype(np.float64)


def abs64(a):
    return None if a is None else np.abs(f64(a))


def from_bits(u, dtype):
    """Array of dtype whose elements have the given bit patterns."""
    dtype = np.dtype(dtype)
    return np.asarray(u, dtype=_UINT[dtype.itemsize]).view(dtype)


def assert_bits_equal(actual, expected, what="array"):
    a, e = bits(actual), bits(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    diff = a != e
    if diff.any():
        idx = tuple(int(i) for i in np.argwhere(diff)[0])
        raise AssertionError(
            f"{what}: {int(diff.sum())} of {diff.size} elements differ bitwise; first at {idx}: "
            f"got 0x{int(a[idx]):x} ({as_np(actual)[idx]}), expected 0x{int(e[idx]):x} "
            f"({as_np(expected)[idx]})")


# -------------------------------------------------------------- tolerance

def allowed_error(ref, mag, dtype, silu):
    """Per-element bound on |out - ref| (SPEC Numerics): ulp term + fp32 accumulation noise."""
    dtype = np.dtype(dtype)
    noise = NOISE * mag * (SILU_NOISE_FACTOR if silu else 1.0)
    if dtype == F32:
        ulp = 1e-5 * np.abs(ref)
    else:
        with np.errstate(over="ignore"):
            rounded = np.abs(ref).astype(dtype)
        ulp = np.spacing(rounded).astype(np.float64)
    return np.maximum(ulp, SUBNORMAL_MIN[dtype]) + noise


def assert_out_close(out, ref, mag, dtype, silu, rows=None, what="out"):
    """out (array/tensor) against the float64 reference, on the rows selected by ``rows``.

    NaN exactly where the reference has NaN; infinities equal; finite values within
    ``allowed_error``; a finite reference that overflows the output dtype must give inf
    of the same sign.
    """
    o = f64(out)
    ref = np.asarray(ref, dtype=np.float64)
    mag = np.asarray(mag, dtype=np.float64)
    assert o.shape == ref.shape, f"{what}: shape {o.shape} != reference {ref.shape}"
    if rows is not None:
        o, ref, mag = o[rows], ref[rows], mag[rows]
    nan_o, nan_r = np.isnan(o), np.isnan(ref)
    if not np.array_equal(nan_o, nan_r):
        i = int(np.flatnonzero(nan_o != nan_r)[0])
        raise AssertionError(f"{what}: NaN pattern differs ({int(nan_o.sum())} NaN in out, "
                             f"{int(nan_r.sum())} in reference); first flat index {i}: "
                             f"got {o.flat[i]}, expected {ref.flat[i]}")
    inf_r = np.isinf(ref)
    assert np.array_equal(o[inf_r], ref[inf_r]), f"{what}: infinities differ"
    with np.errstate(over="ignore"):
        rounded = ref.astype(dtype).astype(np.float64)
    ovf = np.isfinite(ref) & np.isinf(rounded)
    assert np.array_equal(o[ovf], rounded[ovf]), f"{what}: overflow to inf expected"
    chk = np.isfinite(ref) & ~ovf
    tol = allowed_error(ref[chk], mag[chk], dtype, silu)
    err = np.abs(o[chk] - ref[chk])
    bad = ~(err <= tol)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        flat = int(np.flatnonzero(chk.ravel())[j])
        pos = tuple(int(v) for v in np.unravel_index(flat, chk.shape))
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} values out of tolerance; first at {pos} "
            f"(of the checked rows): got {o[pos]!r}, reference {ref[pos]!r}, error {err[j]:.3g} "
            f"> allowed {tol[j]:.3g} (max error/allowed {np.max(err / tol):.3g})")


# -------------------------------------------------------------- reference

def _np_index(a):
    if a is None:
        return None
    return a.numpy() if is_tensor(a) else np.asarray(a)


def reference(x, conv_state, weight, bias=None, *, activation="silu", num_accepted_tokens=None,
              conv_state_indices=None, query_start_loc=None, pad_slot_id=-1):
    """(ref_out float64, ref_state, magnitude) for one call; inputs are not modified.

    magnitude = |bias| + sum_k |w_k * window_k| per output, computed by the reference
    on absolute values without activation.
    """
    kw = dict(num_accepted_tokens=_np_index(num_accepted_tokens),
              conv_state_indices=_np_index(conv_state_indices),
              query_start_loc=_np_index(query_start_loc), pad_slot_id=pad_slot_id)
    x, st, w, b = as_np(x), as_np(conv_state), as_np(weight), as_np(bias)
    with np.errstate(invalid="ignore", over="ignore"):
        out, new_state = conv_update_multi_ref(x, st, w, b, activation=activation, **kw)
        mag, _ = conv_update_multi_ref(abs64(x), abs64(st), abs64(w), abs64(b), activation=None, **kw)
    return out, new_state, mag


def skipped_rows(x_shape, conv_state_indices=None, query_start_loc=None, pad_slot_id=-1):
    """Boolean mask over x's rows (x.shape[:-1]) of requests that are skipped (pad slot)."""
    mask = np.zeros(x_shape[:-1], dtype=bool)
    if conv_state_indices is None:
        return mask
    idx = _np_index(conv_state_indices)
    if query_start_loc is not None:
        q = _np_index(query_start_loc)
        for i, s in enumerate(idx):
            if s == pad_slot_id:
                mask[q[i]:q[i + 1]] = True
    else:
        for i, s in enumerate(idx):
            if s == pad_slot_id:
                mask[i] = True
    return mask


# ---------------------------------------------------------- random calls

def alloc(rng, shape, dtype, mem="contig", scale=1.0):
    """Random normal array of ``shape``: contiguous, a channel slice of a wider buffer
    ("rowpad", unit channel stride) or every other channel of a buffer ("chstride")."""
    shape = tuple(shape)
    D = shape[-1]
    if mem == "contig":
        return (rng.standard_normal(shape) * scale).astype(dtype)
    if mem == "rowpad":
        buf = (rng.standard_normal(shape[:-1] + (D + 3,)) * scale).astype(dtype)
        return buf[..., 1:D + 1]
    if mem == "chstride":
        buf = (rng.standard_normal(shape[:-1] + (2 * D,)) * scale).astype(dtype)
        return buf[..., ::2]
    raise ValueError(mem)


def make_call(rng, *, dtype="fp32", W=4, D=16, T=1, B=2, mode="plain", batching="fixed",
              pads=False, state_layout="SD", wkind="same", bias=True, activation="silu",
              extra=0, xmem="contig", pad_slot_id=-1, default_indices=False, flat=False,
              zero_len=True):
    """Random arguments of one legal call. Returns a dict with x, conv_state, weight,
    bias and the keyword arguments (activation, num_accepted_tokens, conv_state_indices,
    query_start_loc, pad_slot_id) under "kw"."""
    dt = DTYPES[dtype]
    L = (max(W - 1, W - 2 + T) if mode == "spec" else W - 1) + extra
    S = B + int(rng.integers(0, 3))
    usable = [s for s in range(S) if s != pad_slot_id]
    if len(usable) < B:  # pad_slot_id is a slot number: real requests must avoid it
        S += 1
        usable = [s for s in range(S) if s != pad_slot_id]
    idx = rng.permutation(np.array(usable, dtype=np.int32))[:B].astype(np.int32)
    if pads and B:
        npad = int(rng.integers(1, max(1, B // 2) + 1))
        idx[rng.permutation(B)[:npad]] = pad_slot_id
    if default_indices and not pads and B <= S:
        idx = None
    qsl = None
    if batching == "varlen":
        lens = rng.integers(0, T + 1, size=B)
        if B:
            lens[int(rng.integers(B))] = T
        if zero_len and B > 1:
            cand = [i for i in range(B) if lens[i] != T] or [i for i in range(B)]
            lens[cand[int(rng.integers(len(cand)))]] = 0
            if (lens == 0).all():
                lens[0] = T
        qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        x_shape = (int(qsl[-1]), D)
    elif flat:
        assert T == 1
        x_shape = (B, D)
    else:
        x_shape = (B, T, D)
    x = alloc(rng, x_shape, dt, xmem)
    if state_layout == "SD":
        state = rng.standard_normal((S, L, D)).astype(dt)
    elif state_layout == "SDpad":  # a window of a bigger cache: padded slots, rows and channels
        state = rng.standard_normal((S + 1, L + 2, D + 8)).astype(dt)[1:, 1:L + 1, 4:D + 4]
    elif state_layout == "DS":  # vLLM "DS": L contiguous, passed as a transposed view
        state = rng.standard_normal((S, D, L)).astype(dt).transpose(0, 2, 1)
    else:
        raise ValueError(state_layout)
    wdt = dt if wkind == "same" else F32
    w = (rng.standard_normal((D, W)) / np.sqrt(W)).astype(wdt)
    if wkind == "packed":
        w = gdnconv.pack_weight(w)
    elif wkind == "wT":  # (D, W) view of a (W, D) array in the activation dtype
        w = np.ascontiguousarray(w.T.astype(dt)).T
    b = (rng.standard_normal(D) * 0.5).astype(F32 if wkind in ("f32", "packed") else dt) if bias else None
    nat = None
    if mode == "spec":
        nat = rng.integers(1, L - W + 3, size=B).astype(np.int32)
    kw = dict(activation=activation, num_accepted_tokens=nat, conv_state_indices=idx,
              query_start_loc=qsl, pad_slot_id=pad_slot_id)
    return dict(x=x, conv_state=state, weight=w, bias=b, kw=kw)


def sentinel_like(rng, x):
    """An array of x's shape and dtype filled with recognisable garbage, in a random memory
    layout (contiguous, padded rows, or strided channels) for NumPy."""
    if is_tensor(x):
        out = x.clone()
        out.copy_(out.new_tensor(rng.standard_normal(tuple(x.shape)) * 100))
        return out
    mem = ("contig", "rowpad", "chstride")[int(rng.integers(3))]
    out = alloc(rng, x.shape, x.dtype, mem)
    out[...] = (rng.standard_normal(x.shape) * 100).astype(x.dtype)
    return out


def run_and_check(call, out_mode="new", num_threads=None, rng=None):
    """Run one call on call's arrays and check it against the reference.

    out_mode: "new" (out=None), "given" (out filled with garbage) or "x" (out=x).
    Checks out values (tolerance), rows of skipped requests (zero / untouched) and the
    new state bit for bit. Returns (out, ref_out).
    """
    rng = np.random.default_rng(0) if rng is None else rng
    x, state, w, b, kw = call["x"], call["conv_state"], call["weight"], call["bias"], call["kw"]
    x0 = as_np(x)
    ref_out, ref_state, mag = reference(x0, state, w, b, **kw)
    skip = skipped_rows(x0.shape, kw["conv_state_indices"], kw["query_start_loc"], kw["pad_slot_id"])
    if out_mode == "new":
        out = None
    elif out_mode == "given":
        out = sentinel_like(rng, x)
    elif out_mode == "x":
        out = x
    else:
        raise ValueError(out_mode)
    out_before = None if out is None else bits(out)
    res = gdnconv.conv_update_multi(x, state, w, b, out=out, num_threads=num_threads, **kw)
    if out is not None:
        assert res is out, "a given out must be returned"
    assert tuple(res.shape) == tuple(x0.shape)
    if is_tensor(x):
        assert is_tensor(res) and res.dtype == x.dtype
    else:
        assert isinstance(res, np.ndarray) and res.dtype == x0.dtype
    dtype = as_np(res).dtype
    silu = kw["activation"] is not None
    assert_out_close(res, ref_out, mag, dtype, silu, rows=~skip)
    if skip.any():
        if out is None:
            assert (f64(res)[skip] == 0).all(), "rows of skipped requests must be zero in a new out"
        else:
            assert np.array_equal(bits(res)[skip], out_before[skip]), \
                "rows of skipped requests must be left as they were in a given out"
    assert_bits_equal(state, ref_state, "conv_state")
    return res, ref_out


# ------------------------------------------------------------------- ISA

@pytest.fixture(params=gdnconv.compiled_isas(), ids=str)
def isa(request):
    """Runs the test with each compiled kernel selected; skipped where the CPU lacks it."""
    name = request.param
    if name not in gdnconv.available_isas():
        pytest.skip(f"CPU lacks {name} (available: {gdnconv.available_isas()})")
    previous = gdnconv.set_isa(name)
    try:
        yield name
    finally:
        gdnconv.set_isa(previous)


@pytest.fixture
def rng(request):
    """A generator seeded from the test id, so every test has its own fixed data."""
    import zlib
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
