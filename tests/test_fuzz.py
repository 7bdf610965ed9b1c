"""Seeded fuzzer: valid and invalid calls mixed across layouts, dtypes, modes, widths,
thread counts, ISAs and NumPy/torch inputs.

A valid call is checked against the float64 reference (``run_and_check``: outputs
within tolerance, the state bit for bit). An invalid call is a valid one with one
fault injected: it must raise the fault's exception type, and every buffer it was
given (x, conv_state, weight, bias, out and the index arrays, with whatever memory
around them their base arrays hold) must be byte-identical afterwards. Small calls run
on several threads too (the size threshold is lowered while fuzzing).

``GDNCONV_FUZZ_CALLS`` and ``GDNCONV_FUZZ_SEED`` size a longer run; the script
``scripts/fuzz.py --calls N --seed S`` runs one. Each failure names its seed and call
number, and ``fuzz(1, seed, first=i)`` replays call i alone.
"""
import os
import sys

import numpy as np
import pytest

import gdnconv
from conftest import BF16, bits, make_call, run_and_check

CALLS = int(os.environ.get("GDNCONV_FUZZ_CALLS", "3000"))
SEED = int(os.environ.get("GDNCONV_FUZZ_SEED", "11"))
INVALID_SHARE = 0.4


def _params(rng):
    W = int(rng.integers(2, 9))
    mode = ("plain", "spec")[int(rng.integers(2))]
    batching = ("fixed", "varlen")[int(rng.integers(2))]
    T = int(rng.choice([1, 1, 2, 3, 4, 7]))
    flat = batching == "fixed" and T == 1 and bool(rng.integers(2))
    return dict(
        dtype=("fp32", "fp16", "bf16")[int(rng.integers(3))], W=W, T=T, mode=mode, batching=batching,
        B=int(rng.integers(0, 7)), D=int(rng.choice([1, 7, 16, 33, 64, 100, 256, 300])),
        extra=int(rng.integers(0, 3)), pads=bool(rng.integers(2)),
        pad_slot_id=int(rng.choice([-1, -1, -5, 40])),
        state_layout=("SD", "DS", "SDpad")[int(rng.integers(3))],
        wkind=("same", "f32", "packed", "wT")[int(rng.integers(4))], bias=bool(rng.integers(2)),
        activation=("silu", None)[int(rng.integers(2))], xmem=("contig", "rowpad", "chstride")[int(rng.integers(3))],
        flat=flat, default_indices=bool(rng.integers(2)))


def _root(a):
    """The array that owns a's memory (so bytes around a view are watched too)."""
    while isinstance(getattr(a, "base", None), np.ndarray):
        a = a.base
    return a


def _to_torch(call):
    """The call's float arrays as torch tensors sharing their memory (bf16 through int16)."""
    import torch

    def conv(a):
        if a is None:
            return None
        if a.dtype == BF16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)
    call = dict(call)
    call["_np"] = {k: call[k] for k in ("x", "conv_state", "weight", "bias")}
    for k in ("x", "conv_state", "weight", "bias"):
        call[k] = conv(call[k])
    return call


# ------------------------------------------------------------- injected faults
# Each takes (call, kwargs of conv_update_multi, rng) and returns the exception type the
# call must raise after its change, or None when the fault does not apply to this call.

def _other_dtype(a):
    return {np.dtype(np.float32): np.float16, np.dtype(np.float16): BF16, BF16: np.float32}[a.dtype]


def f_state_dtype(c, kw, rng):
    kw["conv_state"] = kw["conv_state"].astype(_other_dtype(kw["conv_state"]))
    return TypeError


def f_x_float64(c, kw, rng):
    kw["x"] = kw["x"].astype(np.float64)
    kw["out"] = None
    return TypeError


def f_width(c, kw, rng):
    W = int(rng.choice([1, 9]))
    kw["weight"] = np.zeros((kw["weight"].shape[0], W), kw["weight"].dtype)
    return ValueError


def f_weight_dim(c, kw, rng):
    kw["weight"] = np.zeros((kw["weight"].shape[0] + 1, kw["weight"].shape[1]), kw["weight"].dtype)
    return ValueError


def f_bias_shape(c, kw, rng):
    dt = kw["weight"].dtype if kw["bias"] is None else kw["bias"].dtype
    kw["bias"] = np.zeros(kw["weight"].shape[0] + 2, dt)
    return ValueError


def f_state_rank(c, kw, rng):
    kw["conv_state"] = np.zeros(kw["conv_state"].shape[1:], kw["conv_state"].dtype)   # (S may be 0)
    return ValueError


def _live(kw):
    idx = kw["conv_state_indices"]
    B = len(idx) if idx is not None else (kw["x"].shape[0] if kw["query_start_loc"] is None
                                           else len(kw["query_start_loc"]) - 1)
    if idx is None:
        return np.arange(B, dtype=np.int32)
    return np.array(idx, np.int32)


def f_slot_range(c, kw, rng):
    idx = _live(kw)
    if not len(idx):
        return None
    bad = kw["conv_state"].shape[0] + int(rng.integers(0, 3))
    if bad == kw["pad_slot_id"]:
        return None
    idx[int(rng.integers(len(idx)))] = bad
    kw["conv_state_indices"] = idx
    return ValueError


def f_slot_duplicate(c, kw, rng):
    idx = _live(kw)
    live = np.flatnonzero(idx != kw["pad_slot_id"])
    if len(live) < 2:
        return None
    i, j = rng.permutation(live)[:2]
    idx[i] = idx[j]
    kw["conv_state_indices"] = idx
    return ValueError


def f_accepted(c, kw, rng):
    nat = kw["num_accepted_tokens"]
    idx = _live(kw)
    live = np.flatnonzero(idx != kw["pad_slot_id"])
    if nat is None or not len(live):
        return None
    nat = np.array(nat)
    L, W = kw["conv_state"].shape[1], kw["weight"].shape[1]
    nat[int(rng.choice(live))] = int(rng.choice([0, -1, L - W + 3]))
    kw["num_accepted_tokens"] = nat
    return ValueError


def f_qsl(c, kw, rng):
    q = kw["query_start_loc"]
    if q is None or len(q) < 2:
        return None
    q = np.array(q)
    if rng.integers(2) and len(q) > 2:
        j = int(rng.integers(1, len(q) - 1))
        q[j] = q[j + 1] + 1           # not non-decreasing
    else:
        q[-1] += int(rng.choice([-1, 1])) if q[-1] > 0 else 1   # does not end at N
    kw["query_start_loc"] = q
    return ValueError


def f_state_len(c, kw, rng):
    W = kw["weight"].shape[1]
    kw["conv_state"] = kw["conv_state"][:, :W - 2]
    return ValueError


def f_state_read_only(c, kw, rng):
    st = kw["conv_state"][...]
    st.flags.writeable = False
    kw["conv_state"] = st
    return ValueError


def f_out_read_only(c, kw, rng):
    out = np.zeros(kw["x"].shape, kw["x"].dtype)
    out.flags.writeable = False
    kw["out"] = out
    return ValueError


def _inside_state(kw):
    """An array of x's shape made of the first elements of conv_state's base buffer, or
    None where there is no such buffer (empty arrays, another dtype, too small)."""
    st = kw["conv_state"]
    if kw["x"].size == 0 or st.size == 0:
        return None
    flat = np.asarray(_root(st)).reshape(-1)
    if flat.dtype != st.dtype or flat.size < kw["x"].size:
        return None
    return flat[:kw["x"].size].reshape(kw["x"].shape)


def f_out_overlaps_state(c, kw, rng):
    out = _inside_state(kw)
    if out is None or not np.shares_memory(out, kw["conv_state"]):
        return None
    kw["out"] = out
    return ValueError


def f_x_overlaps_state(c, kw, rng):
    st = kw["conv_state"]
    x = _inside_state(kw)
    if x is None:
        return None
    try:   # an overlap gdnconv's bounded check cannot decide is read from a copy instead
        if not np.shares_memory(x, st, max_work=16 + (x.size + st.size) // 256):
            return None
    except np.exceptions.TooHardError:
        return None
    kw["x"] = x
    kw["out"] = None
    return ValueError


def f_index_float(c, kw, rng):
    kw["conv_state_indices"] = _live(kw).astype(np.float64)
    return TypeError


def f_threads(c, kw, rng):
    kw["num_threads"] = int(rng.choice([0, -2]))
    return ValueError


def f_activation(c, kw, rng):
    kw["activation"] = "relu"
    return ValueError


def f_pad_slot(c, kw, rng):
    kw["pad_slot_id"] = 1.5
    return TypeError


FAULTS = [f_state_dtype, f_x_float64, f_width, f_weight_dim, f_bias_shape, f_state_rank, f_slot_range,
          f_slot_duplicate, f_accepted, f_qsl, f_state_len, f_state_read_only, f_out_read_only,
          f_out_overlaps_state, f_x_overlaps_state, f_index_float, f_threads, f_activation, f_pad_slot]


def _refused(call, rng, num_threads):
    """Inject a fault that applies to this (NumPy) call; check the refusal. False when
    none applied."""
    base = dict(x=call["x"], conv_state=call["conv_state"], weight=call["weight"], bias=call["bias"],
                out=None, num_threads=num_threads, **call["kw"])
    for fault in rng.permutation(FAULTS):
        kw = dict(base)
        if rng.integers(2):
            kw["out"] = np.zeros(call["x"].shape, call["x"].dtype)
        exc = fault(call, kw, rng)
        if exc is None:
            continue
        watched = [a for a in kw.values() if isinstance(a, np.ndarray)]
        roots = [_root(a) for a in watched]
        before = [bits(r) for r in roots]
        try:
            gdnconv.conv_update_multi(**kw)
        except exc:
            pass
        else:
            raise AssertionError(f"{fault.__name__}: the call did not raise {exc.__name__}")
        for r, b in zip(roots, before):
            assert np.array_equal(bits(r), b), f"{fault.__name__}: a refused call changed a buffer"
        return fault.__name__
    return None


def fuzz(calls, seed, first=0):
    """Runs calls first .. first+calls-1 of the sequence seed; returns {kind: count}."""
    torch = sys.modules.get("torch")
    isas = gdnconv.available_isas()
    counts = {}
    previous_isa = gdnconv.active_isa()
    previous_min = gdnconv._core._set_parallel_min_bytes(0)
    try:
        for i in range(first, first + calls):
            rng = np.random.default_rng([seed, i])
            p = _params(rng)
            isa = isas[int(rng.integers(len(isas)))]
            num_threads = (None, 1, 2, 3)[int(rng.integers(4))]
            gdnconv.set_isa(isa)
            call = make_call(rng, **p)
            where = f"seed {seed} call {i}: isa {isa}, threads {num_threads}, {p}"
            try:
                if rng.random() < INVALID_SHARE:
                    kind = _refused(call, rng, num_threads)
                else:
                    kind = None
                if kind is None:
                    use_torch = torch is not None and rng.random() < 0.25
                    if use_torch:
                        call = _to_torch(call)
                    out_mode = ("new", "given", "x")[int(rng.integers(3))]
                    run_and_check(call, out_mode=out_mode, num_threads=num_threads, rng=rng)
                    kind = "valid-torch" if use_torch else "valid"
            except Exception as e:
                raise AssertionError(f"{where}: {type(e).__name__}: {e}") from e
            counts[kind] = counts.get(kind, 0) + 1
    finally:
        gdnconv.set_isa(previous_isa)
        gdnconv._core._set_parallel_min_bytes(previous_min)
    return counts


def test_fuzz_valid_and_invalid_calls():
    pytest.importorskip("torch")   # a quarter of the valid calls go through torch tensors
    counts = fuzz(CALLS, SEED)
    valid = counts.get("valid", 0) + counts.get("valid-torch", 0)
    assert valid > CALLS // 3 and CALLS - valid > CALLS // 5, counts
