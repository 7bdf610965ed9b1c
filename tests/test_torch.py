"""torch CPU tensors: zero-copy in, state updated in place, results equal to the NumPy path."""
import os
import warnings

import numpy as np
import pytest

import gdnconv
from gdnconv.testing import assert_bits_equal, assert_outputs_close, bits
from conftest import BF16, as_np, make_call, reference, run_and_check, run_python, skipped_rows

torch = pytest.importorskip("torch")

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def to_torch(a):
    """A torch tensor with the bits, shape and strides of the NumPy array a (bf16 included)."""
    if a is None:
        return None
    a = np.asarray(a)
    if a.dtype.kind in "iu":
        return torch.from_numpy(a.copy())
    size = a.dtype.itemsize
    tdt = {4: torch.float32, 2: torch.bfloat16 if a.dtype.name == "bfloat16" else torch.float16}[size]
    raw = torch.from_numpy(np.ascontiguousarray(a).view({2: np.int16, 4: np.int32}[size]).copy())
    t = raw.view(tdt)
    if not a.flags.c_contiguous:   # rebuild the same strides
        strides = tuple(s // size for s in a.strides)
        buf = torch.empty(int(sum((n - 1) * s for n, s in zip(a.shape, strides)) + 1), dtype=tdt)
        out = buf.as_strided(a.shape, strides)
        out.copy_(t)
        t = out
    return t


def torch_call(call):
    tc = dict(call)
    for k in ("x", "conv_state", "weight", "bias"):
        tc[k] = to_torch(call[k])
    tc["kw"] = dict(call["kw"])
    for k in ("num_accepted_tokens", "conv_state_indices", "query_start_loc"):
        if call["kw"][k] is not None:
            tc["kw"][k] = torch.from_numpy(np.asarray(call["kw"][k]).copy())
    return tc


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("mode", ["plain", "spec"])
@pytest.mark.parametrize("batching", ["fixed", "varlen"])
@pytest.mark.parametrize("out_mode", ["new", "given", "x"])
def test_torch_equals_numpy_and_reference(isa, rng, dtype, mode, batching, out_mode):
    call = make_call(rng, dtype=dtype, W=4, D=100, T=3, B=4, mode=mode, batching=batching, pads=True,
                     extra=1)
    tc = torch_call(call)
    assert tc["x"].dtype == TORCH_DTYPES[dtype]
    x_np = call["x"].copy()
    np_out = gdnconv.conv_update_multi(call["x"], call["conv_state"], call["weight"], call["bias"],
                                       **call["kw"])
    t_out, _ = run_and_check(tc, out_mode=out_mode, rng=rng)
    assert isinstance(t_out, torch.Tensor) and t_out.dtype == TORCH_DTYPES[dtype]
    assert_bits_equal(tc["conv_state"], call["conv_state"], "torch state vs numpy state")
    skip = skipped_rows(x_np.shape, call["kw"]["conv_state_indices"], call["kw"]["query_start_loc"])
    assert np.array_equal(bits(t_out)[~skip], bits(np_out)[~skip]), "torch out differs from numpy out"


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_state_slice_of_a_bigger_cache_slots(isa, rng, dtype):
    """conv_state = cache[2:6]: the caller's cache holds the update, everything else untouched."""
    tdt = TORCH_DTYPES[dtype]
    D, W, L, T = 64, 4, 5, 2
    cache = torch.randn(10, L, D).to(tdt)
    before = bits(cache)
    state = cache[2:6]
    x = torch.randn(3, T, D).to(tdt)
    w = torch.randn(D, W).to(tdt)
    idx = torch.tensor([3, -1, 0], dtype=torch.int32)
    nat = torch.tensor([2, 1, 1], dtype=torch.int32)
    ref_out, ref_state, mag = reference(x, state, w, None, num_accepted_tokens=nat, conv_state_indices=idx)
    out = gdnconv.conv_update_multi(x, state, w, num_accepted_tokens=nat, conv_state_indices=idx)
    assert isinstance(out, torch.Tensor)
    skip = skipped_rows(tuple(x.shape), idx)
    assert_outputs_close(out, ref_out, mag, as_np(out).dtype, silu=True, rows=~skip)
    after = bits(cache)
    assert np.array_equal(after[:2], before[:2]) and np.array_equal(after[6:], before[6:])
    assert_bits_equal(cache[2:6], ref_state, "cache[2:6]")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["plain", "spec"])
def test_state_channel_slice_of_a_bigger_cache(isa, rng, dtype, mode):
    """conv_state = cache[:, :, 64:128] (a TP shard of a fused cache): written in place."""
    tdt = TORCH_DTYPES[dtype]
    D, W, L, T, S = 64, 4, 6, 3, 5
    cache = torch.randn(S, L, 256).to(tdt)
    before = bits(cache)
    state = cache[:, :, 64:128]
    x = torch.randn(4, T, D).to(tdt)
    w = torch.randn(D, W).to(tdt)
    b = torch.randn(D).to(tdt)
    idx = torch.tensor([4, 0, -1, 2], dtype=torch.int32)
    nat = torch.tensor([1, 2, 3, 2], dtype=torch.int32) if mode == "spec" else None
    ref_out, ref_state, mag = reference(x, state, w, b, num_accepted_tokens=nat, conv_state_indices=idx)
    out = torch.zeros_like(x)
    res = gdnconv.conv_update_multi(x, state, w, b, num_accepted_tokens=nat, conv_state_indices=idx, out=out)
    assert res is out
    skip = skipped_rows(tuple(x.shape), idx)
    assert_outputs_close(out, ref_out, mag, as_np(out).dtype, silu=True, rows=~skip)
    assert (bits(out)[skip] == 0).all()
    after = bits(cache)
    assert np.array_equal(after[:, :, :64], before[:, :, :64])
    assert np.array_equal(after[:, :, 128:], before[:, :, 128:])
    assert_bits_equal(cache[:, :, 64:128], ref_state, "cache[:, :, 64:128]")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_state_ds_layout_tensor(isa, rng, dtype):
    """vLLM's DS storage: (S, D, L) contiguous tensor passed as .transpose(1, 2)."""
    tdt = TORCH_DTYPES[dtype]
    D, W, L, T, S = 40, 4, 6, 3, 4
    storage = torch.randn(S, D, L).to(tdt)
    state = storage.transpose(1, 2)
    x = torch.randn(2, T, D).to(tdt)
    w = torch.randn(D, W).to(tdt)
    idx = torch.tensor([3, 1], dtype=torch.int32)
    nat = torch.tensor([2, 3], dtype=torch.int32)
    ref_out, ref_state, mag = reference(x, state, w, None, num_accepted_tokens=nat, conv_state_indices=idx)
    out = gdnconv.conv_update_multi(x, state, w, num_accepted_tokens=nat, conv_state_indices=idx)
    assert_outputs_close(out, ref_out, mag, as_np(out).dtype, silu=True)
    assert_bits_equal(storage.transpose(1, 2), ref_state, "DS storage")


@pytest.mark.parametrize("index_kind", ["int32", "int64", "int32-strided"])
def test_torch_index_tensors(isa, rng, index_kind):
    """Contiguous int32 index tensors are read in place, int64 and strided ones are
    converted: all three give the reference's result."""
    call = make_call(rng, dtype="bf16", W=3, D=48, T=2, B=5, mode="spec", batching="varlen", pads=True)
    tc = torch_call(call)
    for k in ("num_accepted_tokens", "conv_state_indices", "query_start_loc"):
        t = tc["kw"][k]
        if index_kind == "int64":
            t = t.to(torch.int64)
        elif index_kind == "int32-strided":
            t = torch.stack([t, torch.full_like(t, 99)], dim=1)[:, 0]
            assert not t.is_contiguous()
        tc["kw"][k] = t
    run_and_check(tc, out_mode="given", rng=rng)


def test_torch_int32_index_tensors_read_in_place(monkeypatch):
    """Contiguous int32 index tensors do not go through .numpy(), and give what the
    same indices as NumPy arrays give."""
    D, W = 40, 4
    x = torch.randn(3, 2, D).to(torch.bfloat16)
    state = torch.randn(5, W - 2 + 2, D).to(torch.bfloat16)
    w = torch.randn(D, W).to(torch.bfloat16)
    idx, nat = [4, 0, 2], [1, 2, 1]
    want_state = state.clone()
    want = gdnconv.conv_update_multi(x, want_state, w, num_accepted_tokens=np.array(nat, np.int32),
                                     conv_state_indices=np.array(idx, np.int32))
    def no_numpy(self, *a, **k):
        raise AssertionError("an index tensor went through .numpy()")
    monkeypatch.setattr(torch.Tensor, "numpy", no_numpy)
    got = gdnconv.conv_update_multi(x, state, w, num_accepted_tokens=torch.tensor(nat, dtype=torch.int32),
                                    conv_state_indices=torch.tensor(idx, dtype=torch.int32))
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(state.view(torch.int16), want_state.view(torch.int16))


def test_torch_fp32_weight_with_bf16_activations(isa, rng):
    call = make_call(rng, dtype="bf16", W=4, D=96, T=2, B=3, mode="spec", wkind="f32")
    tc = torch_call(call)
    assert tc["weight"].dtype == torch.float32 and tc["x"].dtype == torch.bfloat16
    run_and_check(tc, rng=rng)
    tc = torch_call(make_call(rng, dtype="bf16", W=4, D=96, T=2, B=3, mode="spec", wkind="f32"))
    tc["weight"] = gdnconv.pack_weight(tc["weight"])
    assert isinstance(tc["weight"], torch.Tensor) and tc["weight"].stride() == (1, 96)
    run_and_check(tc, rng=rng)


def test_torch_noncontiguous_x(isa, rng):
    call = make_call(rng, dtype="fp16", W=4, D=64, T=3, B=3, mode="plain", xmem="chstride")
    tc = torch_call(call)
    assert not tc["x"].is_contiguous()
    run_and_check(tc, out_mode="given", rng=rng)


def test_torch_errors_write_nothing():
    x = torch.randn(2, 2, 16)
    state = torch.randn(3, 4, 16)
    w = torch.randn(16, 4)
    before = bits(state)
    with pytest.raises(TypeError, match="float16"):
        gdnconv.conv_update_multi(x.half(), state, w)
    with pytest.raises(TypeError, match="float64"):
        gdnconv.conv_update_multi(x.double(), state.double(), w.double())
    with pytest.raises(ValueError, match="conv_state_indices"):
        gdnconv.conv_update_multi(x, state, w, conv_state_indices=torch.tensor([1, 1], dtype=torch.int32))
    with pytest.raises(TypeError, match="conv_state_indices"):
        gdnconv.conv_update_multi(x, state, w, conv_state_indices=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="x overlaps conv_state"):
        gdnconv.conv_update_multi(state[:2, :2], state, w)
    with pytest.raises(ValueError, match="out overlaps conv_state"):
        gdnconv.conv_update_multi(x, state, w, out=state[:2, :2])
    assert np.array_equal(bits(state), before)


@pytest.mark.parametrize("arg", ["conv_state", "out"])
def test_self_overlapping_written_tensor_refused(arg):
    """An expanded (stride-0) tensor as conv_state or out puts two slots (or two requests'
    outputs) on the same memory: the memory-level twin of duplicate slots, and a tensor torch
    itself refuses to write in place. The call must be refused, naming the argument, with
    nothing written."""
    D, W = 16, 4
    x = torch.stack([torch.full((1, D), 1.0), torch.full((1, D), 2.0)])       # (2, 1, D)
    w = torch.tensor([[1.0, 10.0, 100.0, 1000.0]]).repeat(D, 1)
    base_state = torch.arange(3.0).repeat(D, 1).t().reshape(1, 3, D).contiguous()
    base_out = torch.full((1, 1, D), 7.0)
    state = base_state.expand(2, 3, D) if arg == "conv_state" else base_state.repeat(2, 1, 1)
    out = base_out.expand(2, 1, D) if arg == "out" else None
    watched = base_state if arg == "conv_state" else base_out
    before = bits(watched)
    with pytest.raises(ValueError, match=arg):
        gdnconv.conv_update_multi(x, state, w, activation=None, out=out)
    assert np.array_equal(bits(watched), before)


def _small_torch_call():
    D, W = 40, 4
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, D, generator=g).to(torch.bfloat16)
    state = torch.randn(4, W - 2 + 2, D, generator=g).to(torch.bfloat16)
    w = torch.randn(D, W, generator=g).to(torch.bfloat16)
    b = torch.randn(D, generator=g).to(torch.bfloat16)
    return x, state, w, b


def _np(t):
    """A bf16 tensor's memory as an ml_dtypes.bfloat16 NumPy array."""
    return t.view(torch.int16).numpy().view(BF16)


def test_torch_tensors_read_through_dlpack(monkeypatch):
    """Plain CPU tensors are read through one DLPack export each, not through data_ptr()
    and stride(), and give what the same memory as NumPy arrays gives."""
    x, state, w, b = _small_torch_call()
    kw = dict(num_accepted_tokens=np.array([1, 2, 1], np.int32), conv_state_indices=np.array([3, 0, 2], np.int32))
    want_state = state.clone()
    want = gdnconv.conv_update_multi(_np(x), _np(want_state), _np(w), _np(b), **kw)
    out = torch.empty_like(x)
    def refused(self, *a, **k):
        raise AssertionError("a tensor was read through its attributes")
    monkeypatch.setattr(torch.Tensor, "data_ptr", refused)
    monkeypatch.setattr(torch.Tensor, "stride", refused)
    got = gdnconv.conv_update_multi(x, state, w, b, out=out, **{k: torch.from_numpy(v) for k, v in kw.items()})
    assert got is out
    assert np.array_equal(bits(got), bits(want))
    assert np.array_equal(bits(state), bits(want_state))


def test_torch_inputs_that_require_grad_are_read():
    """torch refuses to export a tensor that requires grad through DLPack; such a read-only
    input (x, weight, bias) is read through its attributes instead, with the same result."""
    x, state, w, b = _small_torch_call()
    want_state = state.clone()
    want = gdnconv.conv_update_multi(x, want_state, w, b)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    got = gdnconv.conv_update_multi(xg, state, wg, bg)
    assert np.array_equal(bits(got), bits(want))
    assert np.array_equal(bits(state), bits(want_state))


def test_torch_negated_views():
    """A tensor with torch's pending negation bit: an index tensor counts as the values torch
    shows (here 0 and -1, the pad slot), not as its memory (0 and 1); a float tensor is
    refused, naming it, with nothing written."""
    neg_view = getattr(torch, "_neg_view", None)
    if neg_view is None:
        pytest.skip("this torch has no torch._neg_view")
    x, state, w, b = _small_torch_call()
    x, want_state = x[:2], state.clone()
    want = gdnconv.conv_update_multi(x, want_state, w, b, conv_state_indices=np.array([0, -1], np.int32))
    idx = neg_view(torch.tensor([0, 1], dtype=torch.int32))
    assert idx.is_neg() and idx.tolist() == [0, -1]
    got = gdnconv.conv_update_multi(x, state, w, b, conv_state_indices=idx)
    assert np.array_equal(bits(got), bits(want))
    assert np.array_equal(bits(state), bits(want_state))
    before = bits(state)
    with pytest.raises(ValueError, match="x has a pending negation bit"):
        gdnconv.conv_update_multi(neg_view(x), state, w, b)
    assert np.array_equal(bits(state), before)


def test_torch_tensor_off_the_cpu_refused():
    x, state, w, b = _small_torch_call()
    before = bits(state)
    with pytest.raises(ValueError, match="x must be a CPU tensor, got device meta"):
        gdnconv.conv_update_multi(x.to("meta"), state, w, b)
    meta_idx = torch.tensor([0, 1, 2], dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="conv_state_indices must be a CPU tensor, got device meta"):
        gdnconv.conv_update_multi(x, state, w, b, conv_state_indices=meta_idx)
    assert np.array_equal(bits(state), before)


def _zero_tensor(shape, dtype=torch.float32):
    make = getattr(torch, "_efficientzerotensor", None)
    if make is None:
        pytest.skip("this torch has no torch._efficientzerotensor")
    return make(shape, dtype=dtype)


@pytest.mark.parametrize("case", ["zero-x", "zero-weight", "zero-state", "sparse-x", "nested-x", "zero-indices",
                                  "negated-duplicate-indices", "float-indices-requiring-grad",
                                  "bf16-indices", "sparse-indices"])
def test_torch_odd_tensors_refused_cleanly(case):
    """Tensors without ordinary memory, and index tensors of the wrong kind, get gdnconv's
    error naming the argument (not torch's, and no crash: a zero tensor reports a null
    data pointer), with nothing written. A zero index tensor counts as its zeros."""
    x, state, w = torch.randn(3, 3, 64), torch.randn(6, 5, 64), torch.randn(64, 4)
    args, kw = [x, state, w], {}
    if case == "zero-x":
        args[0], err, match = _zero_tensor((3, 3, 64)), ValueError, "x has 576 elements but no memory"
    elif case == "zero-weight":
        args[2], err, match = _zero_tensor((64, 4)), ValueError, "weight has 256 elements but no memory"
    elif case == "zero-state":
        args[1], err, match = _zero_tensor((6, 5, 64)), ValueError, "conv_state has 1920 elements but no memory"
    elif case == "sparse-x":
        args[0], err, match = x.to_sparse(), TypeError, "x must be a dense tensor, got a sparse_coo tensor"
    elif case == "nested-x":
        with warnings.catch_warnings():   # "the nested tensor API is in prototype stage"
            warnings.simplefilter("ignore")
            args[0] = torch.nested.nested_tensor([x[0], x[1]])
        err, match = TypeError, "x must be a dense tensor, got a nested tensor"
    elif case == "zero-indices":
        kw["conv_state_indices"] = _zero_tensor((3,), torch.int32)
        err, match = ValueError, r"conv_state_indices\[1\] = 0 repeats the slot of request 0"
    elif case == "negated-duplicate-indices":
        if not hasattr(torch, "_neg_view"):
            pytest.skip("this torch has no torch._neg_view")
        kw["conv_state_indices"] = torch._neg_view(torch.tensor([-1, -1, -2], dtype=torch.int32))
        err, match = ValueError, r"conv_state_indices\[1\] = 1 repeats the slot of request 0"
    elif case == "float-indices-requiring-grad":
        kw["conv_state_indices"] = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        err, match = TypeError, r"conv_state_indices must be an integer array \(int32\), got dtype float32"
    elif case == "bf16-indices":
        kw["num_accepted_tokens"] = torch.tensor([1, 1, 1], dtype=torch.bfloat16)
        err, match = TypeError, r"num_accepted_tokens must be an integer array \(int32\), got dtype bfloat16"
    else:
        kw["conv_state_indices"] = torch.tensor([0, 1, 2], dtype=torch.int32).to_sparse()
        err, match = TypeError, "conv_state_indices must be a dense integer tensor .* sparse_coo tensor"
    before = bits(state)
    with pytest.raises(err, match=match):
        gdnconv.conv_update_multi(*args, **kw)
    assert np.array_equal(bits(state), before)


LATE_IMPORT = """
import sys
import numpy as np
import gdnconv
rng = np.random.default_rng(0)
x = rng.standard_normal((2, 4, 64)).astype(np.float32)
w = rng.standard_normal((64, 4)).astype(np.float32)
nat = np.array([1, 2], np.int32)
st_np = rng.standard_normal((2, 6, 64)).astype(np.float32)
st_t0 = st_np.copy()
out_np = gdnconv.conv_update_multi(x, st_np, w, None, num_accepted_tokens=[1, 2])   # a list: looks for torch
assert "torch" not in sys.modules
import torch
st_t = torch.from_numpy(st_t0)
out_t = gdnconv.conv_update_multi(torch.from_numpy(x), st_t, torch.from_numpy(w), None,
                                  num_accepted_tokens=torch.from_numpy(nat))
assert isinstance(out_t, torch.Tensor), type(out_t)
assert np.array_equal(out_t.numpy(), out_np) and np.array_equal(st_t.numpy(), st_np)
print("ok")
"""


def test_tensors_recognised_when_torch_is_imported_after_numpy_calls():
    """gdnconv caches torch.Tensor when it first finds torch imported: calls from
    NumPy before the import must not stop tensors from being recognised after it."""
    r = run_python(LATE_IMPORT)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


needs_thp = pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage"),
                               reason="no transparent huge pages (not Linux, or a kernel without THP)")


def _vm_flags(addr):
    """The VmFlags of the mapping of this process that holds address addr (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


@needs_thp
@pytest.mark.parametrize("op", ["update", "prefill"])
def test_a_large_new_torch_out_asks_for_huge_pages(rng, op):
    """A new torch out of 4 MiB or more is advised MADV_HUGEPAGE (smaps flag hg) before
    the kernel first writes it, as NumPy advises its own arrays: torch's allocator does
    not, and 4 KiB page faults doubled a large prefill's time. Its values are the
    reference's."""
    D, N = 4096, 320                      # fp32 (N, D): 5 MiB
    x = rng.standard_normal((N, D), dtype=np.float32)
    w = rng.standard_normal((D, 4), dtype=np.float32) / 2
    if op == "update":
        x = x.reshape(N // 4, 4, D)
        st = rng.standard_normal((N // 4, 3, D), dtype=np.float32)
        want = gdnconv.conv_update_multi(x, st.copy(), w)
        out = gdnconv.conv_update_multi(torch.from_numpy(x), torch.from_numpy(st), torch.from_numpy(w))
    else:
        want = gdnconv.conv_prefill(x[None], w)
        out = gdnconv.conv_prefill(torch.from_numpy(x[None]), torch.from_numpy(w))
    assert "hg" in _vm_flags(out.data_ptr() + out.numel() * 2), "no MADV_HUGEPAGE on the new out"
    assert_bits_equal(out.numpy(), want, "torch's new out against the NumPy call's")


@needs_thp
def test_no_huge_page_advice_when_numpy_gives_none():
    """NumPy's switch of its own advice (_set_madvise_hugepage) is followed: off, a new
    torch out gets none. 40 MiB: beyond glibc's largest mmap threshold, so the out is a
    fresh mapping that nothing else advised."""
    multiarray = pytest.importorskip("numpy._core.multiarray",
                                     reason="NumPy 1.x: its switch lives elsewhere (numpy.core)")
    x = np.ones((1, 1280, 8192), dtype=np.float32)
    w = np.full((8192, 4), 0.25, dtype=np.float32)
    previous = multiarray._set_madvise_hugepage(False)
    try:
        out = gdnconv.conv_prefill(torch.from_numpy(x), torch.from_numpy(w))
        assert "hg" not in _vm_flags(out.data_ptr() + out.numel() * 2)
        del out
        multiarray._set_madvise_hugepage(True)
        out = gdnconv.conv_prefill(torch.from_numpy(x), torch.from_numpy(w))
        assert "hg" in _vm_flags(out.data_ptr() + out.numel() * 2)
        assert_bits_equal(out.numpy(), gdnconv.conv_prefill(x, w), "out")
    finally:
        multiarray._set_madvise_hugepage(previous)
