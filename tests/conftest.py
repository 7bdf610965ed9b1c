"""Shared helpers for the gdnconv test suite.

- dtype tables and bit views (states are compared bit for bit through integer views);
- (the tolerance of SPEC "Numerics" is ``gdnconv.testing``);
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
from gdnconv.reference import conv_update_multi_ref, magnitude
from gdnconv.testing import assert_bits_equal, assert_outputs_close, bits
from gdnconv.testing import to_numpy as as_np

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
DTYPES = {"fp32": F32, "fp16": F16, "bf16": BF16}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def pytest_configure(config):
    """Integration tests need software the test extra does not install (vLLM itself):
    they run only when asked for, ``python -m pytest -m integration``. Set here, not in
    pyproject.toml, so that the tests copied beside an installed wheel behave the same."""
    config.addinivalue_line("markers", "integration: needs vLLM installed; run with -m integration")
    if not config.option.markexpr:
        config.option.markexpr = "not integration"


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


def f64(a):
    if a is None:
        return None
    with np.errstate(invalid="ignore"):   # signaling NaNs warn when cast
        return as_np(a).astype(np.float64)


def from_bits(u, dtype):
    """Array of dtype whose elements have the given bit patterns."""
    dtype = np.dtype(dtype)
    return np.asarray(u, dtype=_UINT[dtype.itemsize]).view(dtype)


# -------------------------------------------------------------- reference

def _np_index(a):
    if a is None:
        return None
    return a.numpy() if is_tensor(a) else np.asarray(a)


def reference(x, conv_state, weight, bias=None, *, activation="silu", num_accepted_tokens=None,
              conv_state_indices=None, query_start_loc=None, pad_slot_id=-1):
    """(ref_out float64, ref_state, magnitude) for one call; inputs are not modified.

    magnitude = |bias| + sum_k |w_k * window_k| per output (gdnconv.reference.magnitude).
    """
    kw = dict(num_accepted_tokens=_np_index(num_accepted_tokens),
              conv_state_indices=_np_index(conv_state_indices),
              query_start_loc=_np_index(query_start_loc), pad_slot_id=pad_slot_id)
    x, st, w, b = as_np(x), as_np(conv_state), as_np(weight), as_np(bias)
    with np.errstate(invalid="ignore", over="ignore"):
        out, new_state = conv_update_multi_ref(x, st, w, b, activation=activation, **kw)
    return out, new_state, magnitude(x, st, w, b, **kw)


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
    assert_outputs_close(res, ref_out, mag, dtype, silu=silu, rows=~skip)
    if skip.any():
        if out is None:
            assert (f64(res)[skip] == 0).all(), "rows of skipped requests must be zero in a new out"
        else:
            assert np.array_equal(bits(res)[skip], out_before[skip]), \
                "rows of skipped requests must be left as they were in a given out"
    assert_bits_equal(state, ref_state, "conv_state")
    return res, ref_out


# ------------------------------------------------------------------- ISA

def _isa_params():
    """Every compiled kernel, or only the one ``GDNCONV_ISA`` names: ``GDNCONV_ISA=scalar pytest``
    runs every test on the portable kernel (gdnconv's import has refused an unknown name)."""
    forced = os.environ.get("GDNCONV_ISA", "").strip()
    return [forced] if forced else gdnconv.compiled_isas()


@pytest.fixture(params=_isa_params(), ids=str)
def isa(request):
    """Runs the test with each compiled kernel selected (only GDNCONV_ISA's when it is set);
    skipped where the CPU lacks it."""
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
