"""NaN in, NaN out (exactly where it reaches); NaN/Inf payloads survive the state roll bit for
bit; silu at the extremes (silu(+inf) = inf, silu(-inf) = NaN per the reference formula)."""
import numpy as np
import pytest

import gdnconv
from gdnconv.testing import assert_bits_equal, assert_outputs_close, bits
from conftest import DTYPES, f64, from_bits, make_call, reference, run_and_check

# quiet NaN with payload, signaling NaN, negative NaN, infinities, -0, smallest subnormal
SPECIALS = {
    "fp32": [0x7FC01234, 0x7F801234, 0xFFC05678, 0x7F800001, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001],
    "bf16": [0x7F81, 0x7FC1, 0xFFC1, 0xFF81, 0x7F80, 0xFF80, 0x8000, 0x0001],
    "fp16": [0x7E01, 0x7C01, 0xFE55, 0xFC02, 0x7C00, 0xFC00, 0x8000, 0x0001],
}


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("mode", ["plain", "spec"])
@pytest.mark.parametrize("channel", [3, 37], ids=["simd-lane", "tail"])
def test_nan_in_x_reaches_exactly_the_dependent_outputs(isa, rng, dtype, mode, channel):
    W, T, D = 4, 5, 40
    call = make_call(rng, dtype=dtype, W=W, D=D, T=T, B=3, mode=mode)
    x = call["x"]
    nan = from_bits([{"fp32": 0x7FC00000, "fp16": 0x7E00, "bf16": 0x7FC0}[dtype]], x.dtype)[0]
    x[1, 1, channel] = nan
    out, _ = run_and_check(call, out_mode="given", rng=rng)
    expected = np.zeros(x.shape, bool)
    expected[1, 1:min(T, 1 + W), channel] = True   # outputs whose window holds token 1
    assert np.array_equal(np.isnan(f64(out)), expected)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("row", [0, 1, 2, 3, 4, 5])
def test_nan_in_state_reaches_exactly_the_dependent_outputs(isa, rng, dtype, row):
    """Spec mode, nat=2 (window rows 1..3 of L=6): a NaN at row r only reaches outputs t <= r-1."""
    W, T, D, L = 4, 3, 40, 6
    call = make_call(rng, dtype=dtype, W=W, D=D, T=T, B=2, mode="spec", extra=L - (W - 2 + T))
    state = call["conv_state"]
    assert state.shape[1] == L
    call["kw"]["num_accepted_tokens"] = np.array([2, 2], np.int32)
    slot = int(call["kw"]["conv_state_indices"][1])
    state[slot, row, 20] = np.nan
    out, _ = run_and_check(call, rng=rng)
    expected = np.zeros(out.shape, bool)
    j = row - 1                      # index of the row in the window
    if 0 <= j <= W - 2:
        expected[1, :j + 1, 20] = True
    assert np.array_equal(np.isnan(f64(out)), expected)


def _plant(rng, a, patterns, frac):
    """Overwrite a random fraction of a's elements with the given bit patterns (in place)."""
    flat_bits = a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize]).reshape(-1)
    n = max(len(patterns), int(frac * flat_bits.size))
    pos = rng.choice(flat_bits.size, size=n, replace=False)
    flat_bits[pos] = np.resize(np.asarray(patterns, flat_bits.dtype), n)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("mode", ["plain", "spec"])
@pytest.mark.parametrize("T", [1, 2, 4])
def test_special_bit_patterns_survive_the_roll(isa, rng, dtype, mode, T):
    """NaN payloads (quiet and signaling), infinities, -0 and subnormals are copied bit-exactly
    into the state, both from x and from the old state rows; outputs follow the reference."""
    W, D, B = 4, 35, 3
    for activation in ("silu", None):
        call = make_call(rng, dtype=dtype, W=W, D=D, T=T, B=B, mode=mode, extra=1, activation=activation)
        x, state, kw = call["x"], call["conv_state"], call["kw"]
        _plant(rng, x, SPECIALS[dtype], 0.15)
        _plant(rng, state, SPECIALS[dtype], 0.15)
        xb, sb = bits(x), bits(state)
        expected = sb.copy()
        for i, s in enumerate(kw["conv_state_indices"]):
            if mode == "spec":
                off = int(kw["num_accepted_tokens"][i]) - 1
                expected[s, :W - 2] = sb[s, off + 1:off + W - 1]
                expected[s, W - 2:W - 2 + T] = xb[i]
            else:
                window = np.concatenate([sb[s, :W - 1], xb[i]])
                expected[s, :W - 1] = window[-(W - 1):]
        run_and_check(call, out_mode="given", rng=rng)
        assert np.array_equal(bits(state), expected), "special values not moved bit for bit"
        assert np.array_equal(bits(x), xb), "x was modified"


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_specific_payloads_from_x_and_state(isa, dtype):
    """The exact patterns 0x7fc01234 (fp32), 0x7f81 (bf16, signaling), 0x7e01 (fp16)."""
    pattern = {"fp32": 0x7FC01234, "bf16": 0x7F81, "fp16": 0x7E01}[dtype]
    dt = DTYPES[dtype]
    W, L, D = 4, 6, 48
    state = np.zeros((1, L, D), dt)
    sbits = state.view({2: np.uint16, 4: np.uint32}[dt.itemsize])
    sbits[0, 2, :] = pattern            # window row 1 (nat=2): rolled to row 0
    x = np.ones((1, 2, D), dt)
    x.view(sbits.dtype)[0, 1, 5::7] = pattern
    w = np.ones((D, W), dt)
    gdnconv.conv_update_multi(x, state, w, num_accepted_tokens=np.array([2], np.int32))
    assert (sbits[0, 0] == pattern).all()
    assert (sbits[0, 3, 5::7] == pattern).all()
    # plain mode, one token: row 1 -> row 0, token -> row W-2
    state = np.zeros((1, W - 1, D), dt)
    sbits = state.view(sbits.dtype)
    sbits[0, 1, :] = pattern
    x = np.ones((1, 1, D), dt)
    x.view(sbits.dtype)[0, 0, ::3] = pattern
    out = gdnconv.conv_update_multi(x, state, w)
    assert (sbits[0, 0] == pattern).all()
    assert (sbits[0, 2, ::3] == pattern).all()
    assert np.isnan(f64(out)).all()


@pytest.mark.parametrize("nan_bits", [0x7FFFFFFF, 0xFFFFFFFF, 0x7F80FFFF], ids=["max", "neg-max", "low-payload"])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_fp32_weight_nan_payloads_stay_nan_in_bf16(isa, nan_bits, activation):
    """An fp32 weight NaN whose low payload bits would carry when rounded to bf16
    (0x7fffffff + 0x7fff would make -0, 0xffffffff +0) still gives NaN outputs, and
    only in its channel; so does a signaling NaN with only low payload bits
    (0x7f80ffff, quieted by the first product), and bf16's own largest NaN (0x7fff)
    in x."""
    W, T, D = 4, 3, 40
    bf = DTYPES["bf16"]
    x = np.ones((2, T, D), bf)
    state = np.ones((2, W - 1, D), bf)
    w = np.full((D, W), 0.25, np.float32)
    for c in (3, 37):   # a SIMD lane and the scalar tail
        w.view(np.uint32)[c, 1] = nan_bits
    x.view(np.uint16)[1, 0, 20] = 0x7FFF
    out = gdnconv.conv_update_multi(x, state, w, activation=activation)
    expected = np.zeros(out.shape, bool)
    expected[:, :, [3, 37]] = True
    expected[1, 0:min(T, W), 20] = True
    assert np.array_equal(np.isnan(f64(out)), expected)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("channel", [2, 40], ids=["simd-lane", "tail"])
def test_infinities_through_silu(isa, dtype, channel):
    """Positive weights: +inf in x gives +inf (silu(+inf) = inf); -inf gives NaN with silu
    (inf * 0 in the reference's formula) and -inf without activation."""
    dt = DTYPES[dtype]
    W, T, D = 3, 4, 41
    w = np.full((D, W), 0.5, dt)
    for value, act, expect in ((np.inf, "silu", np.inf), (-np.inf, "silu", np.nan),
                               (-np.inf, None, -np.inf), (np.inf, None, np.inf)):
        x = np.ones((1, T, D), dt)
        x[0, 1, channel] = value
        state = np.zeros((1, W - 1, D), dt)
        ref_out, _, _ = reference(x, state, w, None, activation=act)
        out = gdnconv.conv_update_multi(x, state, w, activation=act)
        got = f64(out)[0, :, channel]
        want = np.array([1.0, expect, expect, expect])
        want[0] = ref_out[0, 0, channel]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[1:][~np.isnan(want[1:])], want[1:][~np.isnan(want[1:])])
        np.testing.assert_array_equal(np.isnan(ref_out[0, :, channel]), np.isnan(want))
        assert_bits_equal(state[0], x[0, -(W - 1):], "state after the roll")
        others = np.delete(f64(out)[0], channel, axis=1)
        assert np.isfinite(others).all()


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_silu_over_its_whole_range(isa, dtype):
    """W=2, weights [0, 1]: out = silu(x) exactly as the reference, from -200 to 200 and at the
    edges (overflow of exp, subnormal results, signed zeros, inf, NaN)."""
    dt = DTYPES[dtype]
    vals = np.concatenate([np.linspace(-200, 200, 2001), [-88.7, -87.3, -103.9, -104.0, -150, 88.7, 0.0,
                                                         -0.0, 1e-30, -1e-30, 3.0e-39, np.inf, -np.inf,
                                                         np.nan]])
    if dtype == "fp16":
        vals = np.concatenate([vals[(np.abs(vals) < 60000) | ~np.isfinite(vals)], [60000.0, -60000.0]])
    xv = vals.astype(dt)
    D = xv.size
    x = xv.reshape(1, 1, D)
    state = np.zeros((1, 1, D), dt)
    w = np.tile(np.array([0.0, 1.0], dt), (D, 1))
    ref_out, _, mag = reference(x, state, w, None)
    out = gdnconv.conv_update_multi(x, state.copy(), w)
    assert_outputs_close(out, ref_out, mag, dt, silu=True)
    xf = f64(x)[0, 0]
    o = f64(out)[0, 0]
    assert o[xf == np.inf][0] == np.inf
    assert np.isnan(o[xf == -np.inf][0])
    assert np.isnan(o[np.isnan(xf)]).all()


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_large_values(isa, rng, dtype):
    """Inputs scaled so outputs reach the top of the dtype (fp16 may overflow to inf)."""
    scale = {"fp32": 1e30, "fp16": 8000.0, "bf16": 1e30}[dtype]
    for activation in ("silu", None):
        call = make_call(rng, dtype=dtype, W=6, D=70, T=3, B=3, mode="spec", activation=activation)
        for k in ("x", "conv_state"):
            call[k][...] = (f64(call[k]) * scale).astype(call[k].dtype)
        run_and_check(call, rng=rng)
