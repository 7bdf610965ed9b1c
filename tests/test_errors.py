"""SPEC "Errors": every bad call raises the right exception, names the argument (and
the offending value where there is one), and leaves conv_state, out and x bit-identical."""
import numpy as np
import pytest

import gdnconv
from gdnconv.testing import assert_bits_equal, assert_outputs_close, bits
from conftest import BF16, as_np, make_call, reference, skipped_rows

D, W, B, T, S, L = 16, 4, 3, 2, 5, 5


def base(varlen=False, spec=True):
    """A legal call (fp32, spec mode, given out) that each case then breaks."""
    rng = np.random.default_rng(7)
    kw = dict(
        x=rng.standard_normal((B, T, D)).astype(np.float32),
        conv_state=rng.standard_normal((S, L, D)).astype(np.float32),
        weight=rng.standard_normal((D, W)).astype(np.float32),
        bias=rng.standard_normal(D).astype(np.float32),
        activation="silu",
        num_accepted_tokens=np.array([1, 2, 2], np.int32) if spec else None,
        conv_state_indices=np.array([3, 0, 4], np.int32),
        pad_slot_id=-1,
    )
    if varlen:
        kw["x"] = rng.standard_normal((5, D)).astype(np.float32)
        kw["query_start_loc"] = np.array([0, 2, 2, 5], np.int32)
    kw["out"] = np.full(kw["x"].shape, 123.0, np.float32)
    return kw


def _ro(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def _set(**changes):
    def apply(kw):
        kw.update({k: (v(kw) if callable(v) else v) for k, v in changes.items()})
        return kw
    return apply


def _overlap_out_state(kw):
    big = np.random.default_rng(1).standard_normal((S + 2, L, D)).astype(np.float32)
    kw["conv_state"] = big[:S]
    kw["out"] = big[:B, :T]        # inside the state
    kw["_keep"] = big
    return kw


def _overlap_out_state_tail(kw):
    big = np.random.default_rng(1).standard_normal((S * L * D + B * T * D,)).astype(np.float32)
    kw["conv_state"] = big[:S * L * D].reshape(S, L, D)
    kw["out"] = big[S * L * D - 5:S * L * D - 5 + B * T * D].reshape(B, T, D)   # shares 5 elements
    kw["_keep"] = big
    return kw


def _overlap_out_x(kw):
    buf = np.random.default_rng(2).standard_normal((B, T + 1, D)).astype(np.float32)
    kw["x"] = buf[:, :T]
    kw["out"] = buf[:, 1:]
    kw["_keep"] = buf
    return kw


def _overlap_out_x_reversed(kw):
    buf = np.random.default_rng(2).standard_normal((B, T, D)).astype(np.float32)
    kw["x"] = buf
    kw["out"] = buf[::-1]          # same memory, not the same view
    return kw


def _overlap_x_state(kw):
    st = kw["conv_state"]
    kw["x"] = st[:B, :T]
    return kw


def _in_state_buffer(name, make):
    """kw[name] replaced by make(buf) of a buffer whose first S slots are conv_state."""
    def apply(kw):
        buf = np.random.default_rng(3).standard_normal((S + 2, L, D)).astype(np.float32)
        kw["conv_state"] = buf[:S]
        kw[name] = make(buf)
        kw["_keep"] = buf
        return kw
    return apply


def _slots_in(buf):
    """The base call's slots, stored in slot 1 of the state buffer."""
    buf[1, 0, :3] = np.array([3, 0, 4], np.int32).view(np.float32)
    return buf[1, 0, :3].view(np.int32)


def _dtype(name, dt):
    return lambda kw: kw[name].astype(dt)


# (id, mutation, exception type, words the message must contain)
CASES = [
    # ranks and shapes
    ("x-rank1", _set(x=lambda kw: kw["x"][0, 0].copy(), out=None), ValueError, ["x"]),
    ("x-rank4", _set(x=lambda kw: kw["x"][None].copy(), out=None), ValueError, ["x", "(1, 3, 2, 16)"]),
    ("x-D-mismatch", _set(x=lambda kw: np.zeros((B, T, D + 1), np.float32),
                          out=lambda kw: np.zeros((B, T, D + 1), np.float32)), ValueError, ["x", "17"]),
    ("conv_state-rank2", _set(conv_state=lambda kw: kw["conv_state"][0]), ValueError, ["conv_state"]),
    ("conv_state-rank4", _set(conv_state=lambda kw: kw["conv_state"][None]), ValueError, ["conv_state"]),
    ("conv_state-D-mismatch", _set(conv_state=lambda kw: np.zeros((S, L, D + 2), np.float32)),
     ValueError, ["conv_state", "18"]),
    ("weight-rank1", _set(weight=lambda kw: kw["weight"][:, 0].copy()), ValueError, ["weight"]),
    ("weight-rank3", _set(weight=lambda kw: kw["weight"][None].copy()), ValueError, ["weight"]),
    ("weight-D-mismatch", _set(weight=lambda kw: np.zeros((D + 1, W), np.float32),
                               bias=None), ValueError, ["weight", "17"]),
    ("width-1", _set(weight=lambda kw: kw["weight"][:, :1].copy()), ValueError, ["1"]),
    ("width-9", _set(weight=lambda kw: np.zeros((D, 9), np.float32),
                     conv_state=lambda kw: np.zeros((S, 12, D), np.float32)), ValueError, ["9"]),
    ("bias-shape", _set(bias=lambda kw: np.zeros(D + 1, np.float32)), ValueError, ["bias"]),
    ("bias-rank2", _set(bias=lambda kw: np.zeros((D, 1), np.float32)), ValueError, ["bias"]),
    ("out-shape", _set(out=lambda kw: np.zeros((B, T + 1, D), np.float32)), ValueError, ["out"]),
    ("out-rank", _set(out=lambda kw: np.zeros((B * T, D), np.float32)), ValueError, ["out"]),
    ("batch-larger-than-slots", _set(conv_state_indices=None,
                                     conv_state=lambda kw: kw["conv_state"][:2].copy()),
     ValueError, ["conv_state"]),
    ("x-3d-with-query_start_loc", _set(query_start_loc=np.array([0, 1, 2, 3], np.int32)),
     ValueError, ["x"]),
    # dtypes
    ("dtype-x-f16-state-f32", _set(x=_dtype("x", np.float16), out=None), TypeError, ["float16", "float32"]),
    ("dtype-state-bf16", _set(conv_state=_dtype("conv_state", BF16)), TypeError, ["bfloat16", "float32"]),
    ("dtype-weight-f16", _set(weight=_dtype("weight", np.float16)), TypeError, ["float16", "float32"]),
    ("dtype-bias-f16", _set(bias=_dtype("bias", np.float16)), TypeError, ["float16", "float32"]),
    ("dtype-out-bf16", _set(out=lambda kw: np.zeros(kw["x"].shape, BF16)), TypeError, ["bfloat16", "float32"]),
    ("unsupported-float64", _set(x=_dtype("x", np.float64), conv_state=_dtype("conv_state", np.float64),
                                 weight=_dtype("weight", np.float64), bias=None, out=None),
     TypeError, ["float64"]),
    ("unsupported-int32-x", _set(x=lambda kw: np.ones((B, T, D), np.int32), out=None),
     TypeError, ["x", "int32"]),
    ("unsupported-int-state", _set(conv_state=lambda kw: np.ones((S, L, D), np.int16)),
     TypeError, ["conv_state", "int16"]),
    # slots
    ("slot-S", _set(conv_state_indices=np.array([3, S, 4], np.int32)), ValueError,
     ["conv_state_indices", str(S)]),
    ("slot-minus-2", _set(conv_state_indices=np.array([3, 0, -2], np.int32)), ValueError,
     ["conv_state_indices", "-2"]),
    ("slot-duplicate", _set(conv_state_indices=np.array([3, 0, 3], np.int32)), ValueError,
     ["conv_state_indices", "3"]),
    ("slot-indices-shape", _set(conv_state_indices=np.array([3, 0, 4, 1], np.int32)), ValueError,
     ["conv_state_indices"]),
    ("slot-int64-overflow", _set(conv_state_indices=np.array([3, 2**40, 4], np.int64)), ValueError,
     ["conv_state_indices"]),
    # num_accepted_tokens
    ("num_accepted-0", _set(num_accepted_tokens=np.array([1, 0, 2], np.int32)), ValueError,
     ["num_accepted_tokens", "0"]),
    ("num_accepted-too-large", _set(num_accepted_tokens=np.array([1, L - W + 3, 2], np.int32)), ValueError,
     ["num_accepted_tokens", str(L - W + 3)]),
    ("num_accepted-negative", _set(num_accepted_tokens=np.array([-1, 1, 1], np.int32)), ValueError,
     ["num_accepted_tokens", "-1"]),
    ("num_accepted-shape", _set(num_accepted_tokens=np.array([1, 1], np.int32)), ValueError,
     ["num_accepted_tokens"]),
    # state_len
    ("state_len-plain", _set(num_accepted_tokens=None,
                             conv_state=lambda kw: kw["conv_state"][:, :W - 2].copy()), ValueError,
     ["state_len"]),
    ("state_len-spec", _set(conv_state=lambda kw: kw["conv_state"][:, :W - 1].copy(),
                            num_accepted_tokens=np.array([1, 1, 1], np.int32)), ValueError,
     ["state_len"]),
    # read-only, aliasing
    ("conv_state-read-only", _set(conv_state=lambda kw: _ro(kw["conv_state"])), ValueError, ["conv_state"]),
    ("out-read-only", _set(out=lambda kw: _ro(kw["out"])), ValueError, ["out"]),
    ("out-overlaps-conv_state", _overlap_out_state, ValueError, ["out", "conv_state"]),
    ("out-overlaps-conv_state-tail", _overlap_out_state_tail, ValueError, ["out", "conv_state"]),
    ("out-overlaps-x", _overlap_out_x, ValueError, ["out", "x"]),
    ("out-is-reversed-x", _overlap_out_x_reversed, ValueError, ["out", "x"]),
    ("x-overlaps-conv_state", _overlap_x_state, ValueError, ["x", "conv_state"]),
    ("weight-overlaps-conv_state", _in_state_buffer("weight", lambda buf: buf[0, :W].reshape(D, W)),
     ValueError, ["weight", "conv_state", "copy"]),
    ("indices-overlap-conv_state", _in_state_buffer("conv_state_indices", _slots_in),
     ValueError, ["conv_state_indices", "conv_state", "copy"]),
    # index array types
    ("indices-float", _set(conv_state_indices=np.array([3.0, 0.0, 4.0])), TypeError, ["conv_state_indices"]),
    ("indices-bool", _set(conv_state_indices=np.array([True, False, True])), TypeError,
     ["conv_state_indices"]),
    ("num_accepted-float", _set(num_accepted_tokens=np.array([1.0, 2.0, 2.0], np.float32)), TypeError,
     ["num_accepted_tokens"]),
    ("num_accepted-bool", _set(num_accepted_tokens=np.array([True, True, True])), TypeError,
     ["num_accepted_tokens"]),
    # other arguments
    ("activation-relu", _set(activation="relu"), ValueError, ["activation", "relu"]),
    ("num_threads-0", _set(num_threads=0), ValueError, ["num_threads", "0"]),
    ("num_threads-negative", _set(num_threads=-3), ValueError, ["num_threads", "-3"]),
    ("conv_state-list", _set(conv_state=lambda kw: kw["conv_state"].tolist()), TypeError, ["conv_state"]),
    ("weight-list", _set(weight=lambda kw: kw["weight"].tolist()), TypeError, ["weight"]),
    ("out-list", _set(out=lambda kw: kw["out"].tolist()), TypeError, ["out"]),
    ("pad_slot_id-float", _set(pad_slot_id=1.5), TypeError, ["pad_slot_id"]),
    ("pad_slot_id-beyond-int64", _set(pad_slot_id=2**70), ValueError, ["pad_slot_id"]),
    # index arrays are int32: a pad_slot_id beyond that range could never mark a request
    ("pad_slot_id-above-int32", _set(pad_slot_id=2**31), ValueError,
     ["pad_slot_id = 2147483648", "int32 range [-2147483648, 2147483647]"]),
    ("pad_slot_id-below-int32", _set(pad_slot_id=np.int64(-2**31 - 1)), ValueError,
     ["pad_slot_id = -2147483649", "int32 range"]),
    # layouts a newcomer passes by mistake: the message names the layout and the fix
    ("x-triton-layout", _set(x=lambda kw: np.ascontiguousarray(kw["x"].transpose(0, 2, 1)), out=None),
     ValueError, ["x", "(B, D, T)", "x.transpose(1, 2)"]),
    ("weight-W-by-D", _set(weight=lambda kw: kw["weight"].T.copy()), ValueError, ["weight", "weight.T"]),
    ("weight-conv1d-layout", _set(weight=lambda kw: kw["weight"][:, None, :].copy()), ValueError,
     ["weight", "(D, 1, W)", "squeeze(1)"]),
    ("conv_state-DS-untransposed", _set(conv_state=lambda kw: np.zeros((S, D, L), np.float32)), ValueError,
     ["conv_state", "transpose(1, 2)"]),
    ("x-list-of-floats", _set(x=lambda kw: kw["x"].tolist(), out=None), TypeError,
     ["x", "list", "float64", "np.asarray(x, np.float32)"]),
    ("bias-f32-with-bf16-weight", _set(x=_dtype("x", BF16), conv_state=_dtype("conv_state", BF16),
                                       weight=_dtype("weight", BF16), out=None), TypeError,
     ["bias", "float32", "bfloat16", "pack_weight"]),
    ("bias-bf16-with-f32-weight", _set(x=_dtype("x", BF16), conv_state=_dtype("conv_state", BF16),
                                       bias=_dtype("bias", BF16), out=None), TypeError,
     ["bias", "float32 bias"]),
]

VARLEN_CASES = [
    ("qsl-start-not-0", _set(query_start_loc=np.array([1, 2, 2, 5], np.int32)), ValueError,
     ["query_start_loc", "1"]),
    ("qsl-not-monotonic", _set(query_start_loc=np.array([0, 3, 2, 5], np.int32)), ValueError,
     ["query_start_loc", "2"]),
    ("qsl-end-short", _set(query_start_loc=np.array([0, 2, 2, 4], np.int32)), ValueError,
     ["query_start_loc", "4"]),
    ("qsl-end-long", _set(query_start_loc=np.array([0, 2, 2, 6], np.int32)), ValueError,
     ["query_start_loc", "6"]),
    ("qsl-float", _set(query_start_loc=np.array([0.0, 2.0, 2.0, 5.0])), TypeError, ["query_start_loc"]),
    ("qsl-bool", _set(query_start_loc=np.array([False, True, True, True])), TypeError, ["query_start_loc"]),
    ("qsl-length-vs-indices", _set(query_start_loc=np.array([0, 2, 5], np.int32)), ValueError,
     ["conv_state_indices"]),
    ("qsl-spec-request-too-long", _set(query_start_loc=np.array([0, 1, 1, 5], np.int32)), ValueError,
     ["state_len", "4"]),
]


def _check_refused(kw, exc, words):
    kw = dict(kw)
    keep = kw.pop("_keep", None)
    watched = {name: kw[name] for name in ("conv_state", "out", "x")
               if isinstance(kw.get(name), np.ndarray)}
    before = {name: bits(a) for name, a in watched.items()}
    keep_before = None if keep is None else bits(keep)
    with pytest.raises(exc) as info:
        gdnconv.conv_update_multi(**kw)
    msg = str(info.value)
    for w in words:
        assert w in msg, f"message {msg!r} does not name {w!r}"
    for name, a in watched.items():
        assert np.array_equal(bits(a), before[name]), f"{name} was written by a refused call"
    if keep is not None:
        assert np.array_equal(bits(keep), keep_before), "the buffer was written by a refused call"


@pytest.mark.parametrize("mutate,exc,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused(mutate, exc, words):
    _check_refused(mutate(base()), exc, words)


@pytest.mark.parametrize("mutate,exc,words", [c[1:] for c in VARLEN_CASES], ids=[c[0] for c in VARLEN_CASES])
def test_refused_varlen(mutate, exc, words):
    _check_refused(mutate(base(varlen=True)), exc, words)


def test_base_calls_are_legal():
    """The calls the cases start from are accepted (so each case fails for its own reason)."""
    for varlen in (False, True):
        kw = base(varlen=varlen)
        out = gdnconv.conv_update_multi(**kw)
        assert out is kw["out"]


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_later_request_error_writes_nothing(varlen):
    """A bad entry at the end of the batch must not let the earlier requests run."""
    kw = base(varlen=varlen)
    kw["conv_state_indices"] = np.array([3, 0, 0], np.int32)
    _check_refused(kw, ValueError, ["conv_state_indices"])
    kw = base(varlen=varlen)
    kw["num_accepted_tokens"] = np.array([1, 1, 9], np.int32)
    _check_refused(kw, ValueError, ["num_accepted_tokens", "9"])


def test_refused_with_new_out_writes_no_state():
    kw = base()
    kw["out"] = None
    kw["conv_state_indices"] = np.array([3, 3, 4], np.int32)
    _check_refused(kw, ValueError, ["conv_state_indices"])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["plain", "spec"])
def test_interleaved_x_and_out_in_one_buffer_accepted(isa, rng, dtype, mode):
    """x = buf[..., :D] and out = buf[..., D:] share a buffer but no element: accepted."""
    Dd = 40
    call = make_call(rng, dtype=dtype, W=4, D=Dd, T=3, B=4, mode=mode, pads=True)
    buf = np.empty(call["x"].shape[:-1] + (2 * Dd,), call["x"].dtype)
    buf[..., :Dd] = call["x"]
    buf[..., Dd:] = (rng.standard_normal(call["x"].shape) * 9).astype(call["x"].dtype)
    call["x"] = buf[..., :Dd]
    out = buf[..., Dd:]
    x_before, out_before = bits(call["x"]), bits(out)
    ref_out, ref_state, mag = reference(call["x"], call["conv_state"], call["weight"], call["bias"],
                                        **call["kw"])
    res = gdnconv.conv_update_multi(call["x"], call["conv_state"], call["weight"], call["bias"],
                                    out=out, **call["kw"])
    assert res is out
    skip = skipped_rows(call["x"].shape, call["kw"]["conv_state_indices"])
    assert skip.any()
    assert_outputs_close(out, ref_out, mag, as_np(out).dtype, silu=True, rows=~skip)
    assert np.array_equal(bits(out)[skip], out_before[skip]), "pad rows of out must be untouched"
    assert np.array_equal(bits(call["x"]), x_before), "x must not be written"
    assert_bits_equal(call["conv_state"], ref_state, "conv_state")


def test_interleaved_strided_x_and_out_accepted(isa, rng):
    """Even channels of one buffer as x and odd channels as out (strided, disjoint): accepted."""
    Dd = 24
    call = make_call(rng, dtype="fp32", W=3, D=Dd, T=2, B=3, mode="spec")
    buf = np.empty(call["x"].shape[:-1] + (2 * Dd,), np.float32)
    buf[..., 0::2] = call["x"]
    buf[..., 1::2] = 5.0
    call["x"] = buf[..., 0::2]
    out = buf[..., 1::2]
    x_before = bits(call["x"])
    ref_out, ref_state, mag = reference(call["x"], call["conv_state"], call["weight"], call["bias"],
                                        **call["kw"])
    res = gdnconv.conv_update_multi(call["x"], call["conv_state"], call["weight"], call["bias"],
                                    out=out, **call["kw"])
    assert res is out
    assert_outputs_close(out, ref_out, mag, np.float32, silu=True)
    assert np.array_equal(bits(call["x"]), x_before), "x must not be written"
    assert_bits_equal(call["conv_state"], ref_state, "conv_state")


@pytest.mark.parametrize("layout", ["state_rows_interleaved", "out_channels_interleaved", "state_one_short"])
def test_written_layouts_by_the_one_overlap_rule(isa, rng, layout):
    """A written array whose strides do not nest but which gives every element its own memory
    is computed (layout.h's rule, the torch op's too): conv_state (S, L, D) with strides
    (58, 21, 1), each slot's last row ending just before the next slot; out (B, D) with strides
    (31, 2). One element less per slot (57, 21, 1) puts a slot's last element on the next
    slot's first: refused, naming conv_state, nothing written. The gaps stay untouched."""
    S, L, D, W, B = 4, 3, 16, 4, 3
    call = make_call(rng, dtype="fp32", W=W, D=D, T=1, B=B, mode="plain")
    x, w, b = call["x"][:, 0], call["weight"], call["bias"]
    idx = np.array([2, 0, 3], np.int32)
    slot = 57 if layout == "state_one_short" else 58
    sbuf = np.full(S * slot + 64, 5.0, np.float32)
    st = np.lib.stride_tricks.as_strided(sbuf, (S, L, D), (slot * 4, 21 * 4, 4))
    if layout != "state_one_short":
        st[...] = rng.standard_normal((S, L, D)).astype(np.float32)
    out, obuf = None, None
    if layout == "out_channels_interleaved":
        obuf = np.full(B * 31 + 64, 7.0, np.float32)
        out = np.lib.stride_tricks.as_strided(obuf, (B, D), (31 * 4, 2 * 4))
    before_s, before_o = sbuf.copy(), None if obuf is None else obuf.copy()
    if layout == "state_one_short":
        with pytest.raises(ValueError, match="^conv_state overlaps itself"):
            gdnconv.conv_update_multi(x, st, w, b, conv_state_indices=idx)
        assert np.array_equal(sbuf, before_s)
        return
    ref_out, ref_state, mag = reference(x, st.copy(), w, b, conv_state_indices=idx)
    res = gdnconv.conv_update_multi(x, st, w, b, conv_state_indices=idx, out=out)
    assert out is None or res is out
    assert_outputs_close(res, ref_out, mag, np.float32, silu=True)
    assert_bits_equal(st, ref_state, "conv_state")
    held = np.zeros(sbuf.shape, bool)
    held[(np.arange(S)[:, None, None] * slot + np.arange(L)[None, :, None] * 21 + np.arange(D)).ravel()] = True
    assert np.array_equal(sbuf[~held], before_s[~held]), "conv_state's gaps were written"
    if obuf is not None:
        held = np.zeros(obuf.shape, bool)
        held[(np.arange(B)[:, None] * 31 + np.arange(D) * 2).ravel()] = True
        assert np.array_equal(obuf[~held], before_o[~held]), "out's gaps were written"


def test_out_another_view_of_x_accepted(isa, rng):
    """out may be a different view object of exactly x's memory (same shape and strides)."""
    call = make_call(rng, dtype="bf16", W=4, D=32, T=2, B=2, mode="spec")
    x = call["x"]
    x_orig = x.copy()
    ref_out, ref_state, mag = reference(x_orig, call["conv_state"], call["weight"], call["bias"],
                                        **call["kw"])
    view = x[...]
    res = gdnconv.conv_update_multi(x, call["conv_state"], call["weight"], call["bias"], out=view,
                                    **call["kw"])
    assert res is view
    assert_outputs_close(x, ref_out, mag, BF16, silu=True)
    assert_bits_equal(call["conv_state"], ref_state, "conv_state")


def test_prefill_pad_slot_id_outside_int32_refused():
    """Issue 24, fault 8 for conv_prefill (the update's cases are in CASES)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, D)).astype(np.float32)
    state = rng.standard_normal((S, L, D)).astype(np.float32)
    out = np.full(x.shape, 7.0, np.float32)
    before = bits(state), bits(out)
    for pad in (2**31, -2**31 - 1):
        with pytest.raises(ValueError) as info:
            gdnconv.conv_prefill(x, rng.standard_normal((D, W)).astype(np.float32), conv_state=state,
                                 cache_indices=np.array([0, 1], np.int32), pad_slot_id=pad, out=out)
        assert str(info.value).startswith(f"pad_slot_id = {pad} is outside the int32 range"), str(info.value)
        assert np.array_equal(bits(state), before[0]) and np.array_equal(bits(out), before[1])
    gdnconv.conv_prefill(x, np.ones((D, W), np.float32), conv_state=state, cache_indices=[0, 2**31 - 1],
                         pad_slot_id=2**31 - 1)   # the int32 ends are taken
    assert np.array_equal(bits(state)[1:], before[0][1:]), "the request on pad_slot_id wrote"


@pytest.mark.parametrize("empty", [list, tuple])
def test_empty_sequences_are_an_empty_batch(empty):
    """Issue 24, fault 7: empty Python lists (np.asarray gives float64) for an empty
    batch are an empty index array, as int32 arrays are: a no-op that returns an empty
    out and leaves the state alone (they were refused as float64)."""
    rng = np.random.default_rng(4)
    state = rng.standard_normal((S, L, D)).astype(np.float32)
    before = bits(state)
    w = rng.standard_normal((D, W)).astype(np.float32)
    out = gdnconv.conv_update_multi(np.zeros((0, T, D), np.float32), state, w, conv_state_indices=empty(),
                                    num_accepted_tokens=empty())
    assert out.shape == (0, T, D)
    out = gdnconv.conv_update_multi(np.zeros((0, D), np.float32), state, w, conv_state_indices=empty(),
                                    query_start_loc=empty([0]))
    assert out.shape == (0, D)
    out = gdnconv.conv_prefill(np.zeros((0, D), np.float32), w, conv_state=state, query_start_loc=empty([0]),
                               cache_indices=empty(), has_initial_state=empty())
    assert out.shape == (0, D)
    assert np.array_equal(bits(state), before)
    # an empty float array stays refused: only a sequence has no dtype of its own
    with pytest.raises(TypeError, match="conv_state_indices must be an integer array"):
        gdnconv.conv_update_multi(np.zeros((0, T, D), np.float32), state, w, conv_state_indices=np.zeros(0))
