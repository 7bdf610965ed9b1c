"""Hashes of outputs and states over a fixed grid of calls, one per ISA.

A refactoring that must not change results is checked by running this before and
after it and comparing the lines (``python tests/results_grid.py > before.txt``).
The grid: every ISA this CPU runs; fp32, fp16 and bf16 (and fp32 weights with 16-bit
activations); widths 2..8; plain (two tokens, and one), speculative and varlen calls with pad slots; SiLU
and no activation; channel-contiguous, transposed-state, strided-x and out=x
layouts; D with and without a channel tail.

The inputs are drawn in float64 and cast; ml_dtypes 0.6 casts float64 to bfloat16
through float32 (two roundings), 0.7 and later directly, so a few bf16 inputs in a
million differ and every hash with them: compare runs made with the same ml_dtypes
(the hashes quoted in benchmarks/README.md are 0.7's).
"""
import hashlib
import sys

import ml_dtypes
import numpy as np

import gdnconv

DTYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def _calls(rng):
    """Yields (name, kwargs-builder) pairs; each builder returns fresh arrays."""
    for dname, dt in DTYPES.items():
        for wname in (("same", "f32w") if dname != "fp32" else ("same",)):
            for W in range(2, 9):
                for D in (37, 300):
                    for mode in ("plain", "plain1", "spec", "varlen"):
                        for layout in ("contig", "ds_state", "strided_x", "out_is_x"):
                            for act in ("silu", None):
                                yield (dname, wname, W, D, mode, layout, act), rng.integers(1 << 31)


def _one(key, seed):
    dname, wname, W, D, mode, layout, act = key
    dt = DTYPES[dname]
    rng = np.random.default_rng(seed)
    B, S = 5, 9
    T = {"plain": 2, "plain1": 1}.get(mode, 3)       # plain1: one token, vLLM's plain decode
    L = {"plain": W, "plain1": W - 1}.get(mode, W - 1 + (T - 1))
    wdt = np.float32 if wname == "f32w" else dt
    weight = rng.standard_normal((D, W)).astype(wdt)
    bias = rng.standard_normal(D).astype(wdt)
    if layout == "ds_state":
        state = np.ascontiguousarray(rng.standard_normal((S, D, L)).astype(dt)).transpose(0, 2, 1)
    else:
        state = rng.standard_normal((S, L, D)).astype(dt)
    slots = np.array([4, 0, -1, 7, 2], np.int32)
    kw = dict(activation=act, conv_state_indices=slots)
    if mode == "varlen":
        lens = [3, 0, 2, 1, 3]
        qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        x = rng.standard_normal((qsl[-1], D)).astype(dt)
        kw["query_start_loc"] = qsl
        kw["num_accepted_tokens"] = np.array([1, 2, 1, 2, 1], np.int32)
    else:
        x = rng.standard_normal((B, T, D)).astype(dt)
        if mode == "spec":
            kw["num_accepted_tokens"] = np.array([1, 2, 1, 2, 1], np.int32)
    if layout == "strided_x":
        big = np.zeros(x.shape[:-1] + (2 * D,), dt)
        big[..., ::2] = x
        x = big[..., ::2]
    if layout == "out_is_x":
        x = x.copy()
        kw["out"] = x
    out = gdnconv.conv_update_multi(x, state, weight, bias, **kw)
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(out).view(np.uint8).tobytes())
    h.update(np.ascontiguousarray(state).view(np.uint8).tobytes())
    return h.digest()


def main():
    for isa in gdnconv.available_isas():
        gdnconv.set_isa(isa)
        rng = np.random.default_rng(2026)
        total = hashlib.sha256()
        n = 0
        for key, seed in _calls(rng):
            total.update(_one(key, seed))
            n += 1
        print(f"{isa:12s} {n} calls {total.hexdigest()}")
    gdnconv.set_isa(None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
