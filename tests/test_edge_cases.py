"""Layouts and sizes off the beaten path: negative and zero strides, strided weights and
bias, many requests across work-unit boundaries, more requests than slots, many slots,
long plain-mode steps, exact rounding of the stored output."""
import numpy as np
import pytest

import gdnconv
from gdnconv.testing import assert_bits_equal, bits
from conftest import DTYPES, F16, F32, f64, make_call, reference, run_and_check


@pytest.mark.parametrize("flip", ["batch", "tokens", "channels", "slots", "state-rows", "state-channels"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_negative_strides(isa, rng, flip, dtype):
    """Reversed views are ordinary strided arrays: read and written where they are."""
    mode = "plain" if flip == "state-rows" else "spec"
    call = make_call(rng, dtype=dtype, W=4, D=37, T=3, B=4, mode=mode, pads=True, extra=1)
    if flip == "batch":
        call["x"] = call["x"][::-1]
    elif flip == "tokens":
        call["x"] = call["x"][:, ::-1]
    elif flip == "channels":
        call["x"] = call["x"][..., ::-1]
    elif flip == "slots":
        call["conv_state"] = call["conv_state"][::-1]
    elif flip == "state-rows":
        call["conv_state"] = call["conv_state"][:, ::-1]
    else:
        call["conv_state"] = call["conv_state"][..., ::-1]
    for out_mode in ("new", "given"):
        run_and_check(call, out_mode=out_mode, rng=rng)
    run_and_check(call, out_mode="x", rng=rng)


def test_broadcast_inputs(isa, rng):
    """Zero-stride (broadcast, read-only) x, weight and bias are legal read-only inputs."""
    D, W = 40, 4
    x_row = rng.standard_normal(D).astype(np.float32)
    x = np.broadcast_to(x_row, (3, 2, D))
    w = np.broadcast_to(rng.standard_normal((1, W)).astype(np.float32), (D, W))
    b = np.broadcast_to(np.float32(0.25), (D,))
    call = dict(x=x, conv_state=rng.standard_normal((4, 5, D)).astype(np.float32), weight=w, bias=b,
                kw=dict(activation="silu", num_accepted_tokens=np.array([1, 2, 2], np.int32),
                        conv_state_indices=np.array([2, 0, 3], np.int32), query_start_loc=None,
                        pad_slot_id=-1))
    run_and_check(call, rng=rng)
    run_and_check(call, out_mode="given", rng=rng)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_strided_weight_and_bias(isa, rng, dtype):
    D, W = 70, 5
    dt = DTYPES[dtype]
    call = make_call(rng, dtype=dtype, W=W, D=D, T=2, B=3, mode="spec", wkind="f32")
    wbuf = rng.standard_normal((W + 2, D + 5)).astype(np.float32)
    bbuf = rng.standard_normal(2 * D).astype(np.float32)
    variants = {
        "f32-tap-major-padded": (wbuf[:W, :D].T, bbuf[::2]),
        "f32-reversed-taps": (gdnconv.pack_weight(wbuf[:W, :D].T)[:, ::-1], bbuf[D:]),
        "f32-channel-stride-2": (np.repeat(wbuf[:W, :D], 2, axis=1)[:, ::2].T, bbuf[:D][::-1]),
        "same-dtype-strided": (wbuf[:W, :D].T.astype(dt)[:, :], bbuf[::2].astype(dt)),
    }
    for name, (w, b) in variants.items():
        c = dict(call, weight=w, bias=b, conv_state=call["conv_state"].copy())
        run_and_check(c, rng=rng)


@pytest.mark.parametrize("D", [1000, 4100, 8192])
def test_many_requests_across_units(isa, rng, D):
    """B > 8 (several request groups per unit), pads spread over them, threads on and off."""
    call = make_call(rng, dtype="bf16", W=4, D=D, T=2, B=21, mode="spec", batching="varlen",
                     pads=True, extra=1)
    call["kw"]["conv_state_indices"][[0, 8, 9, 20]] = -1
    for n in (1, 2):
        c = dict(call, conv_state=call["conv_state"].copy())
        run_and_check(c, num_threads=n, rng=rng)


def check_one_and_two_threads(call, rng):
    """call on one thread and on two (every call size split), each against the reference,
    and the two bit for bit alike."""
    previous = gdnconv._core._set_parallel_min_bytes(0)
    try:
        outs, states = [], []
        for n in (1, 2):
            c = dict(call, conv_state=call["conv_state"].copy())
            outs.append(run_and_check(c, num_threads=n, rng=rng)[0])
            states.append(c["conv_state"])
    finally:
        gdnconv._core._set_parallel_min_bytes(previous)
    assert_bits_equal(outs[1], outs[0], "out, two threads against one")
    assert_bits_equal(states[1], states[0], "conv_state, two threads against one")


@pytest.mark.parametrize("D,B,dtype,mode,layout", [
    (8192, 2, "bf16", "plain", "SD"),    # two threads, 16 channel blocks each; bf16 weights
    (4100, 3, "bf16", "spec", "DS"),     # 17 blocks: ranges of 9 and 8, time-contiguous state
    (4100, 8, "fp32", "plain", "SD"),    # 4 requests per thread, the uneven ranges
    (2300, 5, "fp32", "spec", "DS"),     # 9 blocks
])
def test_channel_ranges_per_thread(isa, rng, D, B, dtype, mode, layout):
    """With few requests per thread and rows of at least a page per thread, each thread
    takes a range of channel blocks for every request (update.c's unit_of): every unit
    runs exactly once, pads and varlen requests too, with the same bits as on one thread
    (mapping a range's units wrongly fails here on every SIMD kernel)."""
    call = make_call(rng, dtype=dtype, W=4, D=D, T=1 if mode == "plain" else 3, B=B, mode=mode,
                     batching="fixed" if mode == "plain" else "varlen", pads=B > 2,
                     state_layout=layout, wkind="same" if B <= 2 else "packed")
    check_one_and_two_threads(call, rng)


@pytest.mark.parametrize("D", [511, 513, 1100, 4100])
@pytest.mark.parametrize("dtype,W,layout,wkind,B", [
    ("bf16", 4, "SD", "packed", 5),   # in place (sd_direct), pack_weight's fp32 weight read in place
    ("bf16", 4, "DS", "same", 5),     # time-contiguous in place (tc_t1), weights converted once per thread
    ("fp32", 8, "DS", "same", 5),     # staged: channel stride 7, the staging buffer's largest rows
    ("fp16", 3, "SD", "same", 5),
    ("bf16", 4, "SD", "same", 2),     # on two threads the weights converted per unit (simd_kernel's wbuf)
])
def test_plain_decode_units_of_512_channels(isa, rng, D, dtype, W, layout, wkind, B):
    """Plain decode of one token a request runs in units of 512 channels, speculative calls in
    units of 256 (update.c's unit_channels), which unit_of, the kernels' buffers and their
    prefetch of the next unit follow: D short of, just past and across several such units, a
    tail that is no whole line, pads, one and two threads (request ranges, and channel ranges
    per thread at D = 4100), checked against the reference and bit for bit across threads."""
    call = make_call(rng, dtype=dtype, W=W, D=D, T=1, B=B, mode="plain", pads=B > 2,
                     state_layout=layout, wkind=wkind)
    check_one_and_two_threads(call, rng)


def test_more_requests_than_slots_when_padded(isa, rng):
    D, W = 24, 4
    x = rng.standard_normal((6, 2, D)).astype(np.float32)
    state = rng.standard_normal((2, 4, D)).astype(np.float32)
    w = rng.standard_normal((D, W)).astype(np.float32)
    kw = dict(activation="silu", num_accepted_tokens=np.array([1, 2, 1, 1, 1, 2], np.int32),
              conv_state_indices=np.array([-1, 1, -1, -1, 0, -1], np.int32), query_start_loc=None,
              pad_slot_id=-1)
    run_and_check(dict(x=x, conv_state=state, weight=w, bias=None, kw=kw), out_mode="given", rng=rng)


def test_many_slots_duplicate_check(rng):
    """More than 64K slots (the duplicate check's heap path): legal slots accepted, a repeated
    high slot refused, nothing written."""
    S, D, W = 70_000, 1, 2
    state = np.zeros((S, 1, D), np.float32)
    state[:, 0, 0] = np.arange(S, dtype=np.float32)
    w = np.ones((D, W), np.float32)
    x = np.full((3, 1, D), 0.5, np.float32)
    idx = np.array([69_999, 65_600, 3], np.int32)
    out = gdnconv.conv_update_multi(x, state, w, conv_state_indices=idx, activation=None)
    np.testing.assert_array_equal(out[:, 0, 0], [69_999.5, 65_600.5, 3.5])
    np.testing.assert_array_equal(state[idx, 0, 0], [0.5, 0.5, 0.5])
    before = bits(state)
    with pytest.raises(ValueError, match="conv_state_indices"):
        gdnconv.conv_update_multi(x, state, w, conv_state_indices=np.array([65_600, 1, 65_600], np.int32))
    assert np.array_equal(bits(state), before)


@pytest.mark.parametrize("W,T", [(2, 9), (3, 12), (4, 7), (8, 16)])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_plain_mode_long_steps(isa, rng, W, T, dtype):
    """Plain mode with T > state_len: the state keeps the last W-1 tokens."""
    call = make_call(rng, dtype=dtype, W=W, D=50, T=T, B=3, mode="plain", batching="varlen", pads=True)
    run_and_check(call, out_mode="given", rng=rng)


def test_noncontiguous_index_arrays(isa, rng):
    call = make_call(rng, dtype="fp16", W=4, D=30, T=2, B=3, mode="spec", batching="varlen", extra=1)
    kw = call["kw"]
    for k in ("num_accepted_tokens", "conv_state_indices", "query_start_loc"):
        a = kw[k].astype(np.int64)
        buf = np.zeros(2 * a.size, np.int64)
        buf[::2] = a
        kw[k] = buf[::2]
    run_and_check(call, rng=rng)


def test_zero_token_fixed_batch(rng):
    """x of shape (B, 0, D): every request is empty, nothing is written."""
    state = rng.standard_normal((3, 4, 8)).astype(np.float32)
    before = bits(state)
    out = gdnconv.conv_update_multi(np.zeros((2, 0, 8), np.float32), state, np.ones((8, 4), np.float32),
                                    num_accepted_tokens=np.array([1, 2], np.int32))
    assert out.shape == (2, 0, 8)
    assert np.array_equal(bits(state), before)


def _rounding_cases(rng, dt):
    """fp32 values around the dtype's rounding points: random, exact halfway, subnormal, overflow."""
    u = rng.integers(0, 2**32, size=6000, dtype=np.uint64).astype(np.uint32)
    lo, hi = (103, 144) if dt == F16 else (0, 255)
    u[:3000] = (u[:3000] & np.uint32(0x807FFFFF)) | (rng.integers(lo, hi, 3000).astype(np.uint32) << 23)
    drop = 13 if dt == F16 else 16        # mantissa bits dropped by the rounding (normal range)
    half = np.uint32(1 << (drop - 1))
    u[3000:4000] = (u[3000:4000] & ~np.uint32((1 << drop) - 1)) | half            # exact ties
    u[4000:4500] = (u[4000:4500] & ~np.uint32((1 << drop) - 1)) | (half - 1)
    u[4500:5000] = (u[4500:5000] & ~np.uint32((1 << drop) - 1)) | (half + 1)
    v = u.view(np.float32)
    extra = np.array([65504.0, 65519.996, 65520.0, 65536.0, 6.1e-5, 5.96e-8, 2.98e-8, 2.99e-8, 1e-10,
                      3.3895314e38, 3.4028235e38, 1.1754944e-38, 9.2e-41, 1e-45], np.float32)
    v = np.concatenate([v, extra, -extra])
    return v[np.isfinite(v)]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_output_rounding_is_round_to_nearest_even(isa, rng, dtype):
    """fp32 weights, x = 1, no activation: the fp32 sum is exactly w[:, 1], so the stored output
    must be its correctly rounded (RNE) value, bit for bit, overflow to inf included."""
    dt = DTYPES[dtype]
    v = _rounding_cases(rng, dt)
    D = v.size
    w = np.zeros((D, 2), np.float32)
    w[:, 1] = v
    x = np.ones((1, 1, D), dt)
    state = np.zeros((1, 1, D), dt)
    out = gdnconv.conv_update_multi(x, state, w, activation=None)
    with np.errstate(over="ignore"):
        expected = (np.float32(0) + v).astype(dt)
    assert_bits_equal(out[0, 0], expected, f"{dtype} rounding of fp32 sums")


def test_fp32_output_of_exact_sums_is_exact(isa, rng):
    """Small integers: every product and sum is exact in fp32, so the output is exact."""
    D, W = 45, 6
    x = rng.integers(-8, 9, size=(4, 3, D)).astype(np.float32)
    state = rng.integers(-8, 9, size=(5, 8, D)).astype(np.float32)
    w = rng.integers(-8, 9, size=(D, W)).astype(np.float32)
    b = rng.integers(-8, 9, size=D).astype(np.float32)
    kw = dict(num_accepted_tokens=np.array([1, 3, 2, 4], np.int32),
              conv_state_indices=np.array([4, 0, 2, 1], np.int32))
    ref_out, ref_state, _ = reference(x, state, w, b, activation=None, **kw)
    out = gdnconv.conv_update_multi(x, state, w, b, activation=None, **kw)
    assert_bits_equal(out, ref_out.astype(np.float32), "out")
    assert_bits_equal(state, ref_state, "conv_state")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("weights", ["f32", "same"])
def test_every_16bit_value(isa, dtype, weights):
    """All 65536 bit patterns as x with taps [0, 1] and no activation: the output is the value
    itself (exact conversions both ways; -0 + 0 = +0; NaN stays NaN), and the state row that
    receives x holds its exact bits (signaling NaNs included)."""
    dt = DTYPES[dtype]
    pats = np.arange(2**16, dtype=np.uint16)
    D = pats.size + 5                       # 5 more channels: a tail for the SIMD kernels
    xb = np.concatenate([pats, pats[:5]])
    x = xb.view(dt).reshape(1, 1, D)
    state = np.zeros((1, 1, D), dt)
    w = np.zeros((D, 2), F32 if weights == "f32" else dt)
    w[:, 1] = 1
    out = gdnconv.conv_update_multi(x, state, w, activation=None)
    assert np.array_equal(bits(state)[0, 0], xb), "state must receive x bit for bit"
    xf = f64(x)[0, 0]
    o = f64(out)[0, 0]
    nan = np.isnan(xf)
    assert np.array_equal(np.isnan(o), nan)
    with np.errstate(invalid="ignore"):
        expected = (np.float32(0) + x[0, 0].astype(np.float32)).astype(dt)
    assert np.array_equal(bits(out)[0, 0][~nan], bits(expected)[~nan])


@pytest.mark.parametrize("arg", ["x", "conv_state", "weight", "out"])
def test_non_native_byte_order(rng, arg):
    """A byte-swapped float32 array must not be read or written as native floats: the call
    either gives the right answer or is refused (naming the argument) without writing."""
    D, W = 16, 4
    x = rng.standard_normal((2, 1, D)).astype(np.float32)
    state = rng.standard_normal((2, 3, D)).astype(np.float32)
    w = rng.standard_normal((D, W)).astype(np.float32)
    out = np.zeros(x.shape, np.float32)
    args = dict(x=x, conv_state=state, weight=w, out=out)
    args[arg] = args[arg].astype(args[arg].dtype.newbyteorder(">" if np.little_endian else "<"))
    ref_out, ref_state, mag = reference(x, state, w, None)
    state_before = args["conv_state"].copy()
    out_before = args["out"].copy()
    try:
        res = gdnconv.conv_update_multi(args["x"], args["conv_state"], args["weight"], out=args["out"])
    except (TypeError, ValueError) as e:
        assert arg in str(e)
        if arg in ("conv_state", "out"):   # written in place: a converted copy is no fix
            assert "in place" in str(e) and "astype" not in str(e), str(e)
        np.testing.assert_array_equal(args["conv_state"], state_before)
        np.testing.assert_array_equal(args["out"], out_before)
        return
    np.testing.assert_allclose(res.astype(np.float64), ref_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(args["conv_state"].astype(np.float32), ref_state)


@pytest.mark.parametrize("W", [2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("wkind", ["same", "f32", "packed", "wT"])
def test_weight_layouts_every_width(isa, rng, W, dtype, wkind):
    """Each width with each weight dtype and layout (channel-major contiguous, fp32 with
    16-bit activations, packed tap-major, tap-major in the activation dtype)."""
    call = make_call(rng, dtype=dtype, W=W, D=300, T=2, B=2, mode="spec", wkind=wkind, extra=1)
    run_and_check(call, rng=rng)


@pytest.mark.parametrize("T", [7, 8, 9, 16, 17, 25])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("W", [2, 4, 8])
def test_spec_mode_long_steps(isa, rng, T, dtype, W):
    """Speculative steps longer than any internal token batch (state_len >= W-2+T)."""
    call = make_call(rng, dtype=dtype, W=W, D=200, T=T, B=3, mode="spec", batching="varlen",
                     pads=True, extra=int(rng.integers(0, 3)))
    run_and_check(call, out_mode=str(rng.choice(["new", "given", "x"])), rng=rng)


@pytest.mark.parametrize("nat", [13, 15, 18])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_spec_window_far_down_a_long_state(isa, rng, dtype, nat):
    """Speculative requests of 8 and 9 tokens after shorter ones, W = 8, their windows far down a
    24-row state: the next unit's prefetch then lists up to 37 rows (until stop 57 the list held
    32, was written past, and AVX2's outputs came out wrong)."""
    W, L, D = 8, 24, 256
    dt = DTYPES[dtype]
    lens = np.array([1, 8, 3, 9])
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    call = {"x": rng.standard_normal((int(qsl[-1]), D)).astype(dt),
            "conv_state": rng.standard_normal((6, L, D)).astype(dt),
            "weight": (rng.standard_normal((D, W)) / np.sqrt(W)).astype(dt), "bias": None,
            "kw": dict(activation="silu", num_accepted_tokens=np.array([1, nat, 2, nat], np.int32),
                       conv_state_indices=np.array([4, 0, 5, 2], np.int32), query_start_loc=qsl, pad_slot_id=-1)}
    run_and_check(call, num_threads=1, rng=rng)
