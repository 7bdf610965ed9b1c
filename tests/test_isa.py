"""Kernel selection, CPU feature detection, channel tails, and agreement between ISAs."""
import platform
import sys

import numpy as np
import pytest

import gdnconv
from gdnconv.testing import allowed_error, assert_bits_equal
from conftest import BF16, DTYPES, f64, make_call, reference, run_and_check, run_python, skipped_rows

def _run_python(code, isa_env):
    return run_python(code, GDNCONV_ISA=isa_env)


CALL_SNIPPET = """
import numpy as np, gdnconv
from gdnconv.reference import conv_update_multi_ref
assert gdnconv.active_isa() == {name!r}, gdnconv.active_isa()
rng = np.random.default_rng(0)
x = rng.standard_normal((3, 2, 37)).astype(np.float32)
st = rng.standard_normal((4, 5, 37)).astype(np.float32)
w = rng.standard_normal((37, 4)).astype(np.float32)
nat = np.array([1, 2, 2], np.int32)
ref, ref_st = conv_update_multi_ref(x, st, w, num_accepted_tokens=nat)
out = gdnconv.conv_update_multi(x, st, w, num_accepted_tokens=nat)
assert np.allclose(out, ref, rtol=1e-5, atol=1e-5), np.abs(out - ref).max()
assert (st.view(np.uint32) == ref_st.view(np.uint32)).all()
print("OK", gdnconv.active_isa())
"""


@pytest.mark.parametrize("name", gdnconv.compiled_isas())
def test_env_var_forces_isa(name):
    if name not in gdnconv.available_isas():
        pytest.skip(f"CPU lacks {name}")
    r = _run_python(CALL_SNIPPET.format(name=name), name)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"OK {name}"


def test_env_var_scalar_always_works():
    r = _run_python(CALL_SNIPPET.format(name="scalar"), "scalar")
    assert r.returncode == 0, r.stderr
    assert "OK scalar" in r.stdout


def test_env_var_unknown_isa_is_import_error():
    r = _run_python("import gdnconv", "no-such-isa")
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "no-such-isa" in r.stderr


def test_env_var_empty_means_best():
    r = _run_python("import gdnconv; print(gdnconv.active_isa(), gdnconv.available_isas()[0])", "")
    assert r.returncode == 0, r.stderr
    active, best = r.stdout.split()
    assert active == best


def test_isa_lists_and_set_isa():
    compiled, available = gdnconv.compiled_isas(), gdnconv.available_isas()
    assert compiled[-1] == "scalar" and available[-1] == "scalar"
    assert [n for n in compiled if n in available] == available
    assert set(compiled) <= {"avx512bf16", "avx512", "avx2", "neonbf16", "neon", "scalar"}
    if platform.machine() in ("aarch64", "arm64"):   # the NEON rows are built wherever GCC >= 10 / clang >= 11
        assert compiled == ["neonbf16", "neon", "scalar"], compiled
    previous = gdnconv.active_isa()
    try:
        for name in available:
            before = gdnconv.active_isa()
            assert gdnconv.set_isa(name) == before
            assert gdnconv.active_isa() == name
        assert gdnconv.set_isa(None) == available[-1]
        assert gdnconv.active_isa() == available[0]
        with pytest.raises(ValueError, match="bogus"):
            gdnconv.set_isa("bogus")
        assert gdnconv.active_isa() == available[0]
        for name in compiled:
            if name not in available:
                with pytest.raises(ValueError, match=name):
                    gdnconv.set_isa(name)
    finally:
        gdnconv.set_isa(previous)


def test_available_isas_follow_cpu_features():
    f = gdnconv.cpu_features()
    expected = set(f) == {"sse2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                          "avx512dq", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                          "amx_int8", "os_avx", "os_avx512", "os_amx", "asimd", "sve", "bf16"}
    assert expected, sorted(f)
    assert all(isinstance(v, bool) for v in f.values())
    available = gdnconv.available_isas()
    if "avx2" in gdnconv.compiled_isas():
        assert ("avx2" in available) == (f["avx2"] and f["fma"] and f["f16c"] and f["os_avx"])
    if "avx512" in gdnconv.compiled_isas():
        want = all(f[k] for k in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "os_avx512"))
        assert ("avx512" in available) == want
    if "neon" in gdnconv.compiled_isas():
        assert ("neon" in available) == f["asimd"]
        assert ("neonbf16" in available) == (f["asimd"] and f["bf16"])


def _cpuinfo_flags():
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return None


@pytest.mark.skipif(not (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")),
                    reason="/proc/cpuinfo flags are only compared on Linux x86-64")
def test_cpu_features_agree_with_proc_cpuinfo():
    flags = _cpuinfo_flags()
    if flags is None:
        pytest.skip("/proc/cpuinfo has no flags line")
    f = gdnconv.cpu_features()
    mapping = {"avx2": "avx2", "fma": "fma", "f16c": "f16c", "avx512f": "avx512f",
               "avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512dq": "avx512dq",
               "avx512_bf16": "avx512_bf16", "avx512_fp16": "avx512_fp16", "amx_tile": "amx_tile",
               "amx_bf16": "amx_bf16", "sse2": "sse2", "avx": "avx", "amx_int8": "amx_int8"}
    mismatches = {k: (f[k], flag in flags) for k, flag in mapping.items() if f[k] != (flag in flags)}
    assert not mismatches, f"cpu_features() vs /proc/cpuinfo: {mismatches}"


TAIL_DIMS = [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 23, 31, 33, 47, 100, 255, 257, 263]


@pytest.mark.parametrize("D", TAIL_DIMS, ids=[f"D{d}" for d in TAIL_DIMS])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_channel_tails(isa, rng, D, dtype):
    for mode, batching in (("plain", "fixed"), ("spec", "varlen")):
        W = int(rng.integers(2, 9))
        call = make_call(rng, dtype=dtype, W=W, D=D, T=int(rng.integers(1, 5)), B=3, mode=mode,
                         batching=batching, pads=True, extra=int(rng.integers(0, 2)),
                         wkind=str(rng.choice(["same", "packed"])))
        run_and_check(call, out_mode="given", rng=rng)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("mode", ["plain", "spec"])
@pytest.mark.parametrize("W", [2, 4, 8])
@pytest.mark.parametrize("activation", ["silu", None], ids=["silu", "noact"])
def test_isas_agree(rng, dtype, mode, W, activation):
    """Every available ISA: within tolerance of the reference and of each other; states bitwise equal."""
    available = gdnconv.available_isas()
    call = make_call(rng, dtype=dtype, W=W, D=1000, T=4, B=5, mode=mode, batching="varlen", pads=True,
                     activation=activation, extra=1)
    kw = call["kw"]
    ref_out, ref_state, mag = reference(call["x"], call["conv_state"], call["weight"], call["bias"], **kw)
    skip = skipped_rows(call["x"].shape, kw["conv_state_indices"], kw["query_start_loc"])
    dt = DTYPES[dtype]
    tol = allowed_error(ref_out[~skip], mag[~skip], dt, silu=activation is not None)
    results = {}
    previous = gdnconv.active_isa()
    try:
        for name in available:
            gdnconv.set_isa(name)
            state = call["conv_state"].copy()
            out = gdnconv.conv_update_multi(call["x"], state, call["weight"], call["bias"], **kw)
            assert np.all(np.abs(f64(out)[~skip] - ref_out[~skip]) <= tol), name
            assert_bits_equal(state, ref_state, f"conv_state ({name})")
            results[name] = (f64(out)[~skip], state)
    finally:
        gdnconv.set_isa(previous)
    names = list(results)
    for a in names:
        for b in names:
            if a < b:
                assert np.all(np.abs(results[a][0] - results[b][0]) <= 2 * tol), f"{a} vs {b}"
                assert_bits_equal(results[a][1], results[b][1], f"state {a} vs {b}")


def test_isa_availability_follows_cpu_features():
    """Each SIMD kernel is available exactly when the features it needs are detected."""
    f = gdnconv.cpu_features()
    compiled, available = gdnconv.compiled_isas(), gdnconv.available_isas()
    avx2 = f["os_avx"] and f["avx2"] and f["fma"] and f["f16c"]
    avx512 = (f["os_avx512"] and f["avx512f"] and f["avx512bw"] and f["avx512vl"] and f["avx512dq"]
              and f["fma"] and f["f16c"])
    expect = {"avx2": avx2, "avx512": avx512, "avx512bf16": avx512 and f["avx512_bf16"],
              "neon": f["asimd"], "neonbf16": f["asimd"] and f["bf16"], "scalar": True}
    for name in compiled:
        assert (name in available) == bool(expect[name]), (name, f)


@pytest.mark.parametrize("native,integer", [("avx512bf16", "avx512"), ("neonbf16", "neon")],
                         ids=["avx512bf16", "neonbf16"])
@pytest.mark.parametrize("activation", ["silu", None], ids=["silu", "noact"])
def test_bf16_native_store_matches_integer_rounding(rng, activation, native, integer):
    """avx512bf16 stores bf16 with the CPU's conversion instructions (which flush subnormals)
    and redoes a line holding a zero or subnormal result; neonbf16 with BFCVTN (which keeps
    them); avx512 and neon round in integer arithmetic. All round the same fp32 results to
    nearest even, so outputs agree bit for bit, on data with zeros and subnormal-scale values
    scattered through the lines."""
    if not {native, integer} <= set(gdnconv.available_isas()):
        pytest.skip(f"CPU lacks {native} or {integer} (available: {gdnconv.available_isas()})")
    B, T, D, W, L = 5, 4, 1000 + 37, 4, 6
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    u = rng.random(x.shape)
    x[u < 0.02] = 0.0
    x[(u >= 0.02) & (u < 0.04)] *= 1e-39          # fp32 subnormals, bf16 subnormal after rounding
    x = x.astype(BF16)
    state = rng.standard_normal((B + 2, L, D)).astype(BF16)
    state[:, :, ::7] = 0
    w = rng.standard_normal((D, W)).astype(BF16)
    w[::5] = 0                                     # whole channels of exact zeros
    kw = dict(activation=activation, num_accepted_tokens=np.array([1, 2, 3, 1, 2], np.int32),
              conv_state_indices=np.array([6, 0, 2, 4, 1], np.int32))
    outs = {}
    previous = gdnconv.active_isa()
    try:
        for name in (native, integer):
            gdnconv.set_isa(name)
            outs[name] = gdnconv.conv_update_multi(x, state.copy(), w, **kw)
    finally:
        gdnconv.set_isa(previous)
    tiny = np.abs(f64(outs[integer])) < 2.0 ** -126
    assert np.count_nonzero(tiny & (outs[integer] != 0)) > 0, "no subnormal outputs: the case is not exercised"
    assert_bits_equal(outs[native], outs[integer], f"{native} vs {integer} outputs")
