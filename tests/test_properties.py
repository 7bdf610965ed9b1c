"""Properties that follow from SPEC, plus the small API surface (threads, pack_weight,
bytes_moved, empty batches, (B, D) input)."""
import os

import numpy as np
import pytest

import gdnconv
from gdnconv.testing import assert_bits_equal, bits
from conftest import DTYPES, f64, make_call, reference, run_and_check


def _cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("W,T,extra", [(2, 3, 0), (4, 4, 0), (4, 2, 2), (8, 5, 1), (3, 1, 0)])
def test_plain_T_tokens_equals_T_single_token_calls(isa, rng, dtype, W, T, extra):
    D, B = 70, 3
    call = make_call(rng, dtype=dtype, W=W, D=D, T=T, B=B, mode="plain", extra=extra, pads=True)
    x, state, w, b, kw = call["x"], call["conv_state"], call["weight"], call["bias"], call["kw"]
    state2 = state.copy()
    out = gdnconv.conv_update_multi(x, state, w, b, **kw)
    outs = [gdnconv.conv_update_multi(np.ascontiguousarray(x[:, t]), state2, w, b, **kw) for t in range(T)]
    assert_bits_equal(np.stack(outs, axis=1), out, "out")
    assert_bits_equal(state2, state, "conv_state")


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("W,extra", [(2, 0), (4, 0), (4, 3), (8, 1)])
def test_spec_one_accepted_one_token_equals_plain(isa, rng, dtype, W, extra):
    D, B = 50, 4
    call = make_call(rng, dtype=dtype, W=W, D=D, T=1, B=B, mode="plain", extra=extra, pads=True)
    x, state, w, b, kw = call["x"], call["conv_state"], call["weight"], call["bias"], call["kw"]
    state_spec = state.copy()
    out_plain = gdnconv.conv_update_multi(x, state, w, b, **kw)
    out_spec = gdnconv.conv_update_multi(x, state_spec, w, b, **dict(
        kw, num_accepted_tokens=np.ones(B, np.int32)))
    assert_bits_equal(out_spec, out_plain, "out")
    assert_bits_equal(state_spec, state, "conv_state")


@pytest.mark.parametrize("mode", ["plain", "spec"])
@pytest.mark.parametrize("batching", ["fixed", "varlen"])
def test_output_independent_of_batch_neighbours(isa, rng, mode, batching):
    D, T, B, W = 300, 3, 9, 4
    call = make_call(rng, dtype="bf16", W=W, D=D, T=T, B=B, mode=mode, batching=batching, extra=1)
    x, state, w, b, kw = call["x"], call["conv_state"], call["weight"], call["bias"], call["kw"]
    full_state = state.copy()
    full = gdnconv.conv_update_multi(x, full_state, w, b, **kw)
    qsl = kw["query_start_loc"]
    for i in range(B):
        alone_state = state.copy()
        one = dict(kw)
        one["conv_state_indices"] = kw["conv_state_indices"][i:i + 1]
        if kw["num_accepted_tokens"] is not None:
            one["num_accepted_tokens"] = kw["num_accepted_tokens"][i:i + 1]
        if qsl is not None:
            rows = slice(int(qsl[i]), int(qsl[i + 1]))
            xi = x[rows]
            one["query_start_loc"] = np.array([0, qsl[i + 1] - qsl[i]], np.int32)
        else:
            rows = slice(i, i + 1)
            xi = x[rows]
        out_i = gdnconv.conv_update_multi(xi, alone_state, w, b, **one)
        assert_bits_equal(out_i, full[rows], f"out of request {i}")
        s = int(kw["conv_state_indices"][i])
        assert_bits_equal(alone_state[s], full_state[s], f"state of request {i}")


@pytest.mark.parametrize("dtype,wkind", [("bf16", "same"), ("bf16", "f32"), ("bf16", "wT"), ("fp16", "same"),
                                         ("fp32", "wT")])
@pytest.mark.parametrize("W,bias", [(3, True), (4, False), (7, True)])
def test_weights_converted_once_per_call_match_per_request(isa, rng, dtype, wkind, W, bias):
    """With more requests than threads the SIMD kernels convert the weights once per
    thread into a scratch and read them there; a one-request call converts them per
    channel block. Both give the same bits, for contiguous, strided and fp32 weights,
    with and without bias, D with a channel tail."""
    B = 7
    call = make_call(rng, dtype=dtype, W=W, D=1000 + 3, T=3, B=B, mode="spec", wkind=wkind, bias=bias)
    x, state, w, b, kw = call["x"], call["conv_state"], call["weight"], call["bias"], call["kw"]
    previous = gdnconv._core._set_parallel_min_bytes(0)   # two threads even for these small calls
    try:
        for n in (1, 2):
            full_state = state.copy()
            full = gdnconv.conv_update_multi(x, full_state, w, b, num_threads=n, **kw)
            for i in range(B):
                alone_state = state.copy()
                one = dict(kw, conv_state_indices=kw["conv_state_indices"][i:i + 1],
                           num_accepted_tokens=kw["num_accepted_tokens"][i:i + 1])
                out_i = gdnconv.conv_update_multi(x[i:i + 1], alone_state, w, b, num_threads=n, **one)
                assert_bits_equal(out_i, full[i:i + 1], f"out of request {i}, num_threads={n}")
                s = int(kw["conv_state_indices"][i])
                assert_bits_equal(alone_state[s], full_state[s], f"state of request {i}")
    finally:
        gdnconv._core._set_parallel_min_bytes(previous)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("mode", ["plain", "spec"])
def test_bit_identical_whatever_the_thread_count(isa, rng, dtype, mode):
    """Big enough to run in parallel (B=16, T=4, D=8192)."""
    call = make_call(rng, dtype=dtype, W=4, D=8192, T=4, B=16, mode=mode, pads=True)
    x, state, w, b, kw = call["x"], call["conv_state"], call["weight"], call["bias"], call["kw"]
    results = []
    for n in (1, 2, None):
        st = state.copy()
        out = gdnconv.conv_update_multi(x, st, w, b, num_threads=n, **kw)
        results.append((n, out, st))
    for n, out, st in results[1:]:
        assert_bits_equal(out, results[0][1], f"out with num_threads={n}")
        assert_bits_equal(st, results[0][2], f"conv_state with num_threads={n}")
    ref_out, ref_state, mag = reference(x, state, w, b, **kw)
    assert_bits_equal(results[0][2], ref_state, "conv_state")


def test_set_num_threads_is_deterministic_too(rng):
    call = make_call(rng, dtype="bf16", W=4, D=8192, T=4, B=16, mode="spec")
    x, state, w, b, kw = call["x"], call["conv_state"], call["weight"], call["bias"], call["kw"]
    previous = gdnconv.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            gdnconv.set_num_threads(n)
            assert gdnconv.get_num_threads() == min(n, _cpus())
            st = state.copy()
            results.append((gdnconv.conv_update_multi(x, st, w, b, **kw), st))
    finally:
        gdnconv.set_num_threads(None)
    assert gdnconv.get_num_threads() == previous
    assert_bits_equal(results[1][0], results[0][0], "out")
    assert_bits_equal(results[1][1], results[0][1], "conv_state")


def test_set_num_threads_validates():
    previous = gdnconv.get_num_threads()
    try:
        gdnconv.set_num_threads(1)
        assert gdnconv.get_num_threads() == 1
        gdnconv.set_num_threads(10_000)
        assert 1 <= gdnconv.get_num_threads() <= 10_000
        for bad in (0, -1, 1.5, True, "2"):
            with pytest.raises(ValueError):
                gdnconv.set_num_threads(bad)
    finally:
        gdnconv.set_num_threads(None)
    assert gdnconv.get_num_threads() == previous


@pytest.fixture
def fresh_adaptive_state():
    """The calling thread's adaptive team state reset before and after the test."""
    gdnconv._core._hold_threads(None, 0)
    yield
    gdnconv._core._hold_threads(None, 0)


def test_adaptive_team_halves_after_two_slow_of_four_and_probes_with_backoff(fresh_adaptive_state):
    """The state machine of threads.c driven with a made-up clock: one slow call does not
    change the team, two of the last four do; a slow probe doubles the wait before the
    next, a fast one restores the team and halves it."""
    step = gdnconv._core._adapt_step
    t = 1000.0
    for slow in (True, False, False, False, True, False, False):   # never two in four
        assert step(2, slow, t) == 2
        t += 0.001
    assert step(2, True, t) == 2                  # second slow of the last four
    assert gdnconv.thread_contention()["reductions"] == 1
    assert step(2, False, t + 0.001) == 1         # held on one thread for the 10 ms backoff
    assert step(2, False, t + 0.009) == 1
    assert step(2, True, t + 0.011) == 2          # probe, slow: backoff doubles to 20 ms
    assert step(2, False, t + 0.030) == 1
    assert step(2, True, t + 0.032) == 2          # probe, slow: 40 ms
    assert step(2, False, t + 0.070) == 1
    assert step(2, False, t + 0.073) == 2         # probe, fast: full team again, backoff 20 ms
    state = gdnconv.thread_contention()
    assert (state["threads"], state["probes"], state["reductions"], state["slow_calls"], state["capped_calls"]) == (
        gdnconv.get_num_threads(), 3, 1, 5, 4)
    t += 1.0
    assert step(2, True, t) == 2 and step(2, True, t) == 2
    assert step(2, False, t + 0.019) == 1         # the halved backoff: 20 ms
    assert step(2, False, t + 0.021) == 2


def test_adaptive_team_halves_step_by_step_on_many_threads(fresh_adaptive_state):
    step = gdnconv._core._adapt_step
    t = 1000.0
    assert step(8, True, t) == 8 and step(8, True, t) == 8
    assert step(8, True, t) == 4 and step(8, True, t) == 4
    assert step(8, False, t) == 2
    assert step(3, False, t) == 2                 # a smaller call is capped the same
    assert step(8, False, t + 0.011) == 4         # probe twice the team, fast: cap 4
    assert step(8, False, t + 0.012) == 4         # the next probe after the backoff (10 ms)
    assert step(8, False, t + 0.022) == 8         # it restores all 8
    assert step(1, True, t + 0.031) == 1          # one-thread calls are not recorded
    assert gdnconv.thread_contention()["slow_calls"] == 4
    assert gdnconv.thread_contention()["capped_calls"] == 5   # held at 4, 4, 2, 2 (of 3), 4


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_reduced_team_and_explicit_counts_give_the_same_bits(isa, rng, dtype, fresh_adaptive_state):
    """With default calls held on one thread (as after slow team calls), a default call
    runs on one thread, num_threads=2 and set_num_threads(2) still run two, a probe runs
    two; every one gives the same bits, and the state matches the reference."""
    call = make_call(rng, dtype=dtype, W=4, D=1000 + 3, T=4, B=5, mode="spec", pads=True)
    x, state, w, b, kw = call["x"], call["conv_state"], call["weight"], call["bias"], call["kw"]
    two = min(2, _cpus())
    previous = gdnconv._core._set_parallel_min_bytes(0)   # teams even for these small calls
    results = []

    def run(expect_threads, **extra):
        st = state.copy()
        out = gdnconv.conv_update_multi(x, st, w, b, **kw, **extra)
        assert gdnconv.thread_contention()["last_call_threads"] == expect_threads, extra
        results.append((out, st))

    try:
        run(1, num_threads=1)
        gdnconv._core._hold_threads(1, 3600.0)
        assert gdnconv.thread_contention()["threads"] == 1
        run(1)                                   # the default, held on one thread
        run(two, num_threads=2)                  # an explicit count is used as asked
        gdnconv.set_num_threads(2)
        run(two)
        gdnconv.set_num_threads(None)
        run(1)
        gdnconv._core._hold_threads(1, 0.0)      # the backoff is over: the next call probes
        run(two)
    finally:
        gdnconv.set_num_threads(None)
        gdnconv._core._set_parallel_min_bytes(previous)
    for out, st in results[1:]:
        assert_bits_equal(out, results[0][0], "out")
        assert_bits_equal(st, results[0][1], "conv_state")
    _, ref_state, _ = reference(x, state, w, b, **kw)
    assert_bits_equal(results[0][1], ref_state, "conv_state")


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("batching", ["fixed", "varlen"])
def test_pad_rows_zero_in_new_out_untouched_in_given(isa, rng, dtype, batching):
    for _ in range(20):   # a draw whose pad requests have tokens (varlen may give them none)
        call = make_call(rng, dtype=dtype, W=4, D=200, T=3, B=6, mode="spec", batching=batching,
                         pads=True, zero_len=False)
        x, state, w, b, kw = call["x"], call["conv_state"], call["weight"], call["bias"], call["kw"]
        idx = kw["conv_state_indices"]
        assert (idx == -1).any()
        pad_rows = np.zeros(x.shape[:-1], bool)
        for i in np.flatnonzero(idx == -1):
            if kw["query_start_loc"] is not None:
                pad_rows[kw["query_start_loc"][i]:kw["query_start_loc"][i + 1]] = True
            else:
                pad_rows[i] = True
        if pad_rows.any():
            break
    out = gdnconv.conv_update_multi(x, state.copy(), w, b, **kw)
    assert pad_rows.any()
    assert (bits(out)[pad_rows] == 0).all(), "pad rows must be exactly +0 in a new out"
    given = (rng.standard_normal(x.shape) * 50).astype(x.dtype)
    before = bits(given)
    res = gdnconv.conv_update_multi(x, state.copy(), w, b, out=given, **kw)
    assert res is given
    assert np.array_equal(bits(given)[pad_rows], before[pad_rows])
    assert_bits_equal(given[~pad_rows], out[~pad_rows], "non-pad rows of a given out")


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("mode", ["plain", "spec"])
@pytest.mark.parametrize("batching", ["fixed", "varlen"])
def test_out_is_x(isa, rng, dtype, mode, batching):
    """In place: correct outputs, and the state receives the ORIGINAL x (bitwise)."""
    W, T, D = 4, 3, 100
    call = make_call(rng, dtype=dtype, W=W, D=D, T=T, B=4, mode=mode, batching=batching, pads=True)
    x, state, w, b, kw = call["x"], call["conv_state"], call["weight"], call["bias"], call["kw"]
    x_orig = x.copy()
    run_and_check(call, out_mode="x")
    # the reference (run on the original x) already fixed the state; check explicitly too
    if mode == "spec" and batching == "fixed":
        for i, s in enumerate(kw["conv_state_indices"]):
            if s != -1:
                assert_bits_equal(state[s, W - 2:W - 2 + T], x_orig[i], f"state rows of request {i}")


def test_out_is_x_explicit_values(isa):
    """With out=x the state must hold the tokens, not the outputs written over them."""
    D = 40
    x = np.tile(np.array([[5.0], [6.0], [7.0]], np.float32), (1, D))[None]   # (1, 3, D)
    state = np.zeros((1, 5, D), np.float32)
    w = np.tile(np.array([1.0, 10.0, 100.0, 1000.0], np.float32), (D, 1))
    res = gdnconv.conv_update_multi(x, state, w, activation=None,
                                    num_accepted_tokens=np.array([1], np.int32), out=x)
    assert res is x
    np.testing.assert_array_equal(x[0, :, 0], [5000.0, 6500.0, 7650.0])
    np.testing.assert_array_equal(state[0, :, 0], [0.0, 0.0, 5.0, 6.0, 7.0])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_two_dim_x_is_one_token_per_request(isa, rng, dtype):
    call = make_call(rng, dtype=dtype, W=4, D=33, T=1, B=5, flat=True, pads=True)
    assert call["x"].ndim == 2
    run_and_check(call, out_mode="given", rng=rng)


@pytest.mark.parametrize("pad_slot_id", [-1, -7, 3, 2**31 - 1])
def test_other_pad_slot_ids(isa, rng, pad_slot_id):
    for mode in ("plain", "spec"):
        call = make_call(rng, dtype="bf16", W=4, D=48, T=2, B=5, mode=mode, pads=True,
                         pad_slot_id=pad_slot_id)
        assert (call["kw"]["conv_state_indices"] == pad_slot_id).any()
        run_and_check(call, out_mode="given", rng=rng)


def test_pad_slot_id_value_is_a_slot_of_another_call(rng):
    """-1 is a slot error when pad_slot_id is something else, nothing written."""
    call = make_call(rng, dtype="fp32", W=4, D=16, T=1, B=3)
    x, state, w, kw = call["x"], call["conv_state"], call["weight"], call["kw"]
    kw["conv_state_indices"] = np.array([0, -1, 1], np.int32)
    before = bits(state)
    with pytest.raises(ValueError, match="conv_state_indices"):
        gdnconv.conv_update_multi(x, state, w, **dict(kw, pad_slot_id=-5))
    assert np.array_equal(bits(state), before)


def test_pad_requests_ignore_num_accepted(rng):
    """A skipped request reads nothing: its num_accepted_tokens (even 0) is not used."""
    call = make_call(rng, dtype="fp32", W=4, D=16, T=2, B=3, mode="spec", extra=1)
    kw = call["kw"]
    kw["conv_state_indices"] = np.array([0, -1, 1], np.int32)
    kw["num_accepted_tokens"] = np.array([1, 0, 2], np.int32)
    run_and_check(call, out_mode="given", rng=rng)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_empty_batches_are_noops(rng, dtype):
    dt = DTYPES[dtype]
    D, W = 24, 4
    state = rng.standard_normal((3, 4, D)).astype(dt)
    before = bits(state)
    w = rng.standard_normal((D, W)).astype(dt)
    out = gdnconv.conv_update_multi(np.zeros((0, 2, D), dt), state, w)
    assert out.shape == (0, 2, D)
    out = gdnconv.conv_update_multi(np.zeros((0, D), dt), state, w, num_accepted_tokens=np.zeros(0, np.int32))
    assert out.shape == (0, D)
    # all requests empty (varlen)
    out = gdnconv.conv_update_multi(np.zeros((0, D), dt), state, w,
                                    query_start_loc=np.zeros(4, np.int32),
                                    conv_state_indices=np.array([2, 0, 1], np.int32))
    assert out.shape == (0, D)
    # all requests padded
    x = rng.standard_normal((2, 3, D)).astype(dt)
    out = gdnconv.conv_update_multi(x, state, w, conv_state_indices=np.array([-1, -1], np.int32))
    assert (f64(out) == 0).all()
    given = x.copy()
    gdnconv.conv_update_multi(x, state, w, conv_state_indices=np.array([-1, -1], np.int32), out=given)
    assert_bits_equal(given, x, "out of an all-pad call")
    assert np.array_equal(bits(state), before)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_pack_weight(isa, rng, dtype):
    D, W = 300, 4
    w = rng.standard_normal((D, W)).astype(DTYPES[dtype])
    p = gdnconv.pack_weight(w)
    assert p.shape == (D, W) and p.dtype == np.float32 and p.strides == (4, 4 * D)
    np.testing.assert_array_equal(p, w.astype(np.float32))
    call = make_call(rng, dtype=dtype, W=W, D=D, T=3, B=3, mode="spec", wkind="f32")
    call["weight"] = w.astype(np.float32)
    s1, s2 = call["conv_state"].copy(), call["conv_state"].copy()
    o1 = gdnconv.conv_update_multi(call["x"], s1, call["weight"], call["bias"], **call["kw"])
    o2 = gdnconv.conv_update_multi(call["x"], s2, gdnconv.pack_weight(call["weight"]), call["bias"],
                                   **call["kw"])
    assert_bits_equal(o2, o1, "out with packed weight")
    assert_bits_equal(s2, s1, "conv_state with packed weight")
    with pytest.raises(ValueError, match="weight"):
        gdnconv.pack_weight(np.zeros(4, np.float32))


def vllm_packed(w):
    """A (D, 4) weight in vLLM's packed layout (causal_conv1d_weight_pack's, as
    gdnconv.vllm.pack_weight_like_vllm makes it of a tensor): [b, j, c, p] = w[32 b + c, 2 j + p]."""
    D = w.shape[0]
    return np.ascontiguousarray(w.reshape(D // 32, 32, 2, 2).transpose(0, 2, 1, 3)).reshape(D, 4)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("mode", ["plain", "spec"])
@pytest.mark.parametrize("layout", ["SD", "DS"])
def test_vllm_packed_weight(isa, rng, dtype, mode, layout):
    """is_weight_packed=True: a weight in vLLM's packed layout gives the bits of its plain weight
    (which the reference checks) on every ISA: bf16 read in place by the SIMD kernels, fp16 and
    fp32 converted; one token and varlen with pads; channel- and time-contiguous states; D = 544,
    a whole unit of channels and part of the next (units of 512 in one-token plain decode, 256
    otherwise); and the prefill."""
    D, W = 544, 4
    for T, batching in ((1, "fixed"), (3, "varlen")):
        call = make_call(rng, dtype=dtype, W=W, D=D, T=T, B=3, mode=mode, batching=batching, pads=True,
                         state_layout=layout)
        x, w, b, kw = call["x"], call["weight"], call["bias"], call["kw"]
        state = np.copy(call["conv_state"], order="K")
        packed = vllm_packed(w)
        assert not np.array_equal(packed, w)
        want, _ = run_and_check(call)
        out = gdnconv.conv_update_multi(x, state, packed, b, is_weight_packed=True, **kw)
        assert_bits_equal(out, want, f"out with the packed weight, T={T}")
        assert_bits_equal(state, call["conv_state"], f"conv_state with the packed weight, T={T}")
    dt = DTYPES[dtype]
    qsl = np.array([0, 5, 5, 12], np.int32)
    x = rng.standard_normal((12, D)).astype(dt)
    w = (rng.standard_normal((D, W)) / 2).astype(dt)
    b = (rng.standard_normal(D) / 2).astype(dt)
    states = [rng.standard_normal((4, W - 1, D)).astype(dt) for _ in range(2)]
    states[1][...] = states[0]
    kw = dict(query_start_loc=qsl, cache_indices=np.array([3, -1, 1], np.int32),
              has_initial_state=np.array([True, False, False]))
    want = gdnconv.conv_prefill(x, w, b, conv_state=states[0], **kw)
    got = gdnconv.conv_prefill(x, vllm_packed(w), b, conv_state=states[1], is_weight_packed=True, **kw)
    assert_bits_equal(got, want, "prefill out with the packed weight")
    assert_bits_equal(states[1], states[0], "prefill conv_state with the packed weight")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_bytes_moved_formula(rng, dtype):
    dt = DTYPES[dtype]
    e = dt.itemsize
    D, W, T, B = 64, 4, 3, 5
    x = np.zeros((B, T, D), dt)
    state = np.zeros((8, 6, D), dt)
    w = np.zeros((D, W), dt)
    expected = e * D * B * (2 * T + (W - 1) + (W - 2 + T)) + D * W * e
    assert gdnconv.bytes_moved(x, state, w) == expected
    idx = np.array([0, -1, 2, 3, -1], np.int32)
    expected = e * D * 3 * (2 * T + (W - 1) + (W - 2 + T)) + D * W * e
    assert gdnconv.bytes_moved(x, state, w, conv_state_indices=idx) == expected
    qsl = np.array([0, 2, 2, 5], np.int32)
    xv = np.zeros((5, D), dt)
    lens = [2, 0, 3]
    expected = e * D * sum(2 * t + (W - 1) + (W - 2 + t) for t in lens if t) + D * W * 4
    assert gdnconv.bytes_moved(xv, state, w.astype(np.float32), query_start_loc=qsl,
                               conv_state_indices=np.array([1, 2, 3], np.int32)) == expected


def test_state_rows_past_the_window_untouched(isa, rng):
    """Spec mode writes rows [0, W-2+T) only; plain mode rows [0, W-1) only."""
    W, T, D = 4, 2, 64
    for mode, written in (("spec", W - 2 + T), ("plain", W - 1)):
        call = make_call(rng, dtype="bf16", W=W, D=D, T=T, B=3, mode=mode, extra=4)
        state = call["conv_state"]
        before = bits(state)
        gdnconv.conv_update_multi(call["x"], state, call["weight"], call["bias"], **call["kw"])
        assert np.array_equal(bits(state)[:, written:], before[:, written:])
        slots = call["kw"]["conv_state_indices"]
        unused = [s for s in range(state.shape[0]) if s not in set(slots.tolist())]
        for s in unused:
            assert np.array_equal(bits(state)[s], before[s])


def test_fp32_weights_with_16bit_activations(isa, rng):
    for dtype in ("fp16", "bf16"):
        for wkind in ("f32", "packed"):
            call = make_call(rng, dtype=dtype, W=5, D=130, T=2, B=3, mode="spec", wkind=wkind)
            assert np.asarray(call["weight"]).dtype == np.float32
            run_and_check(call)


def test_swish_is_silu(isa, rng):
    call = make_call(rng, dtype="fp32", W=4, D=40, T=2, B=2, activation="silu")
    s1, s2 = call["conv_state"].copy(), call["conv_state"].copy()
    o1 = gdnconv.conv_update_multi(call["x"], s1, call["weight"], call["bias"], **call["kw"])
    o2 = gdnconv.conv_update_multi(call["x"], s2, call["weight"], call["bias"],
                                   **dict(call["kw"], activation="swish"))
    assert_bits_equal(o2, o1, "out")


def test_concurrent_calls_from_python_threads(rng):
    """The GIL is released around the kernel: calls from several Python threads on their own
    arrays give the same bits as the same calls made one after another."""
    from concurrent.futures import ThreadPoolExecutor
    calls = [make_call(np.random.default_rng(100 + i), dtype="bf16", W=4, D=2048, T=3, B=8,
                       mode="spec", pads=True) for i in range(8)]

    def run(call, steps=10):
        state = call["conv_state"].copy()
        outs = [gdnconv.conv_update_multi(call["x"], state, call["weight"], call["bias"], **call["kw"])
                for _ in range(steps)]
        return outs, state

    sequential = [run(c) for c in calls]
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(run, calls))
    for (o1, s1), (o2, s2) in zip(sequential, parallel):
        for a, b in zip(o1, o2):
            assert_bits_equal(b, a, "out")
        assert_bits_equal(s2, s1, "conv_state")


def test_num_threads_above_cpu_count(rng):
    call = make_call(rng, dtype="fp16", W=4, D=8192, T=2, B=12, mode="plain")
    s1, s2 = call["conv_state"].copy(), call["conv_state"].copy()
    o1 = gdnconv.conv_update_multi(call["x"], s1, call["weight"], call["bias"], num_threads=1, **call["kw"])
    o2 = gdnconv.conv_update_multi(call["x"], s2, call["weight"], call["bias"], num_threads=64, **call["kw"])
    assert_bits_equal(o2, o1, "out")
    assert_bits_equal(s2, s1, "conv_state")
