"""Sampled grid of conv_update_multi calls against the float64 reference, on every ISA.

The full product of the axes below is far too large, so the parameter list is a
deterministic covering set (every value of every axis appears at least once) plus a
seeded random sample. Each case runs with every compiled ISA (``isa`` fixture).
"""
import numpy as np
import pytest

from conftest import make_call, run_and_check

AXES = {
    "dtype": ["fp32", "fp16", "bf16"],
    "W": [2, 3, 4, 5, 6, 7, 8],
    "D": [1, 7, 64, 1000, 8192],
    "T": [1, 2, 3, 4, 5],
    "mode": ["plain", "spec"],
    "batching": ["fixed", "varlen"],
    "pads": ["nopad", "pad"],
    "state": ["SD", "DS", "SDpad"],
    "out": ["new", "given", "x"],
    "wkind": ["same", "f32", "packed", "wT"],
    "act": ["silu", "none", "swish"],
    "bias": ["bias", "nobias"],
    "xmem": ["contig", "rowpad", "chstride"],
    "extra": [0, 1, 3],
}
N_RANDOM = 260


def _cases():
    rng = np.random.default_rng(20240531)
    names = list(AXES)
    n_cover = max(len(v) for v in AXES.values())
    perms = {a: rng.permutation(n_cover) for a in names}
    cases = []
    for j in range(n_cover):   # covering set: value j (mod len) of every axis, shuffled per axis
        cases.append({a: AXES[a][perms[a][j] % len(AXES[a])] for a in names})
    for _ in range(N_RANDOM):
        cases.append({a: AXES[a][int(rng.integers(len(AXES[a])))] for a in names})
    params = []
    for i, c in enumerate(cases):
        c["seed"] = 1000 + i
        cid = (f"{c['dtype']}-W{c['W']}-D{c['D']}-T{c['T']}-{c['mode']}-{c['batching']}-{c['pads']}-"
               f"{c['state']}-out_{c['out']}-w_{c['wkind']}-{c['act']}-{c['bias']}-{c['xmem']}-"
               f"L+{c['extra']}-{i}")
        params.append(pytest.param(c, id=cid))
    return params


CASES = _cases()


def test_covering_set_hits_every_axis_value():
    for axis, values in AXES.items():
        seen = {p.values[0][axis] for p in CASES}
        assert seen == set(values), axis


@pytest.mark.parametrize("case", CASES)
def test_grid_against_reference(isa, case):
    rng = np.random.default_rng(case["seed"])
    D = case["D"]
    if rng.random() < 0.15:   # more requests than one work unit holds (8)
        B = int(rng.integers(9, 13 if D >= 8192 else 21))
    else:
        B = int(rng.integers(1, 4 if D >= 8192 else 7))
    flat = case["batching"] == "fixed" and case["T"] == 1 and rng.random() < 0.5
    pad_slot_id = -1 if rng.random() < 0.8 else int(rng.choice([-5, 1_000_000]))
    call = make_call(
        rng, dtype=case["dtype"], W=case["W"], D=D, T=case["T"], B=B, mode=case["mode"],
        batching=case["batching"], pads=case["pads"] == "pad", state_layout=case["state"],
        wkind=case["wkind"], bias=case["bias"] == "bias",
        activation=None if case["act"] == "none" else case["act"], extra=case["extra"],
        xmem=case["xmem"], pad_slot_id=pad_slot_id, flat=flat,
        default_indices=rng.random() < 0.3)
    run_and_check(call, out_mode=case["out"], rng=rng)
