"""Edges found by trying the library as a new user: fork safety, bytes_moved's checks,
empty arrays, vLLM-style boolean activation, autograd-tracked written tensors, the
reset forms of set_isa / set_num_threads, pack_weight's checks."""
import multiprocessing
import sys

import numpy as np
import pytest

import gdnconv
from gdnconv.reference import conv_update_multi_ref

f32 = np.float32


def _big_call():
    """A call large enough to run a parallel region; returns its max error vs the reference."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 4, 4096)).astype(f32)
    state = rng.standard_normal((64, 6, 4096)).astype(f32)
    w = rng.standard_normal((4096, 4)).astype(f32)
    na = np.full(64, 2, np.int32)
    ref, _ = conv_update_multi_ref(x, state, w, num_accepted_tokens=na)
    out = gdnconv.conv_update_multi(x, state, w, num_accepted_tokens=na, num_threads=2)
    return float(np.max(np.abs(out - ref)))


@pytest.mark.skipif(sys.platform != "linux",
                    reason="Windows has no fork(), and macOS forks a multi-threaded process unsafely "
                           "(Python warns); the GNU OpenMP hang this guards is on Linux builds")
def test_call_in_child_forked_after_a_parallel_call():
    """GNU OpenMP hangs a forked child's first parallel region; gdnconv runs such a child's
    calls on one thread instead, and they give the right values."""
    assert _big_call() < 1e-3
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        err = pool.apply_async(_big_call).get(timeout=120)
    assert err < 1e-3


def _call_args():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 16)).astype(f32)
    state = rng.standard_normal((5, 4, 16)).astype(f32)
    w = rng.standard_normal((16, 4)).astype(f32)
    return x, state, w


def test_bytes_moved_counts_and_checks_like_a_call():
    x, state, w = _call_args()
    slots = np.array([4, -1, 0], np.int32)
    na = np.array([1, 1, 2], np.int32)
    # 2 live requests: 2T + (W-1) + (W-2+T) = 4 + 3 + 4 = 11 rows of 16 fp32, plus 16x4 weights
    got = gdnconv.bytes_moved(x, state, w, num_accepted_tokens=na, conv_state_indices=slots)
    assert got == 2 * 11 * 16 * 4 + 16 * 4 * 4
    with pytest.raises(ValueError, match="weight"):
        gdnconv.bytes_moved(x, state, w[:, 0])
    with pytest.raises(ValueError, match="query_start_loc"):
        gdnconv.bytes_moved(x.reshape(6, 16), state, w, query_start_loc=np.array([0, 4, 2, 6], np.int32))


def test_empty_arrays_are_a_no_op():
    x = np.zeros((2, 1, 0), f32)
    state = np.zeros((6, 4, 0), f32)
    out = gdnconv.conv_update_multi(x, state, np.zeros((0, 4), f32))
    assert out.shape == (2, 1, 0)
    x0 = np.zeros((0, 16), f32)
    state = np.ones((3, 3, 16), f32)
    before = state.copy()
    assert gdnconv.conv_update_multi(x0, state, np.ones((16, 4), f32), out=x0) is x0
    assert np.array_equal(state, before)


def test_boolean_activation_as_in_vllm():
    x, state, w = _call_args()
    s1, s2 = state.copy(), state.copy()
    a = gdnconv.conv_update_multi(x, s1, w, activation=True)
    b = gdnconv.conv_update_multi(x, s2, w, activation="silu")
    assert np.array_equal(a, b)
    s1, s2 = state.copy(), state.copy()
    a = gdnconv.conv_update_multi(x, s1, w, activation=False)
    ref, _ = conv_update_multi_ref(x, s2, w, activation=None)
    np.testing.assert_allclose(a, ref, rtol=1e-5, atol=1e-5)


def test_written_tensor_that_requires_grad_is_refused():
    torch = pytest.importorskip("torch")
    x, state, w = (torch.from_numpy(a) for a in _call_args())
    state.requires_grad_(True)
    before = state.detach().clone()
    with pytest.raises(ValueError, match=r"conv_state requires grad.*detach\(\)"):
        gdnconv.conv_update_multi(x, state, w)
    assert torch.equal(state.detach(), before)
    state = state.detach()
    out = torch.zeros_like(x, requires_grad=True)
    with pytest.raises(ValueError, match="out requires grad"):
        gdnconv.conv_update_multi(x, state, w, out=out)
    assert torch.equal(state, before) and not out.detach().any()


def test_reset_forms_of_set_isa_and_set_num_threads():
    best = gdnconv.available_isas()[0]
    previous = gdnconv.set_isa("scalar")
    try:
        assert gdnconv.set_isa("") == "scalar"
        assert gdnconv.active_isa() == best
    finally:
        gdnconv.set_isa(previous)
    default = gdnconv.get_num_threads()
    gdnconv.set_num_threads(1)
    gdnconv.set_num_threads(None)
    assert gdnconv.get_num_threads() == default


def test_pack_weight_checks_its_argument():
    with pytest.raises(ValueError, match="W <= 8"):
        gdnconv.pack_weight(np.ones((16, 20), f32))
    with pytest.raises(TypeError, match="float"):
        gdnconv.pack_weight(np.ones((16, 4), np.complex64))
    w = np.arange(64, dtype=f32).reshape(16, 4)
    packed = gdnconv.pack_weight(w)
    assert packed.strides == (4, 64) and np.array_equal(packed, w)


@pytest.mark.parametrize("op", ["update", "prefill"])
def test_packed_weight_refusals_name_the_argument_and_write_nothing(op):
    """is_weight_packed=True takes only vLLM's packed layout (a contiguous (D, 4) array, D a
    multiple of 32), in x's dtype or float32, and a bool flag; each refusal names the argument,
    its value and the fix, and writes nothing."""
    import ml_dtypes
    bf16 = np.dtype(ml_dtypes.bfloat16)
    D = 64
    x = np.ones((2, 1, D), bf16)
    state = np.ones((3, 3, D), bf16)
    good = np.ones((D, 4), bf16)
    cases = [(np.ones((D, 3), bf16), True, ValueError, r"is_weight_packed=True must be in vLLM's packed layout .* "
              r"got shape \(64, 3\); pass the plain"),
             (np.ones((40, 4), bf16), True, ValueError, r"D a multiple of 32, got shape \(40, 4\)"),
             (np.ones((4, D), bf16).T, True, ValueError, r"strides \(1, 64\) in elements, not contiguous"),
             (good.astype(np.float16), True, TypeError, r"weight dtype float16 does not match x dtype bfloat16: "
              r"pass the packed weight in x's dtype or as float32"),
             (good, "yes", TypeError, r"is_weight_packed must be a bool, got 'yes'")]
    for w, flag, err, match in cases:
        st, out = state.copy(), np.full_like(x, 7)
        with pytest.raises(err, match=match):
            if op == "update":
                gdnconv.conv_update_multi(x, st, w, is_weight_packed=flag, out=out)
            else:
                gdnconv.conv_prefill(x, w, conv_state=st, cache_indices=np.array([0, 2], np.int32),
                                     has_initial_state=np.array([True, True]), is_weight_packed=flag, out=out)
        assert np.array_equal(st.view(np.uint16), state.view(np.uint16)), match
        assert (out.astype(np.float32) == 7).all(), match


def test_packed_weight_of_no_channels_is_taken():
    """D = 0 (a multiple of 32) with is_weight_packed=True: taken as the plain call takes it."""
    x, state, w = np.zeros((2, 0), f32), np.zeros((3, 6, 0), f32), np.zeros((0, 4), f32)
    for packed in (False, True):
        assert gdnconv.conv_update_multi(x, state, w, is_weight_packed=packed).shape == (2, 0)


def test_query_start_loc_must_be_one_dimensional():
    x, state, w = _call_args()
    before = state.copy()
    with pytest.raises(ValueError, match="query_start_loc must be 1-D"):
        gdnconv.conv_update_multi(x.reshape(6, 16), state, w, query_start_loc=np.array([[0, 6]], np.int32))
    assert np.array_equal(state, before)
