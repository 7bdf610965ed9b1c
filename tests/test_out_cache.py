"""Large new outputs reuse freed blocks (memory.c; gdnconv.set_out_cache_bytes).

A call that makes its own out of 4 MiB or more takes a block from gdnconv's cache, and
the block comes back when the array, and every view of it, is freed. What must hold: a
reused block's stale contents never show (every value is the reference's, skipped rows
are zeros), a block in use is never handed out twice, the limit is kept, and bad limits
are refused by name.
"""
import sys

import numpy as np
import pytest

import gdnconv
from conftest import run_python
from gdnconv.reference import conv_prefill_ref, prefill_magnitude
from gdnconv.testing import assert_outputs_close

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="memory.c reuses blocks on Linux only (elsewhere outputs are allocated as usual)")

N, D = 2048, 4096            # fp32 (N, D): 32 MiB


def block(nbytes):
    """The block an out of nbytes holds: itself and the skew (memory.h), in 2 MiB steps."""
    return -(-(nbytes + 1088) // (2 << 20)) * (2 << 20)


BIG = block(N * D * 4)


@pytest.fixture
def cache():
    """An empty cache at the default limit; the limit the test found is put back."""
    previous = gdnconv.set_out_cache_bytes(0)
    gdnconv.set_out_cache_bytes(256 << 20)
    yield
    gdnconv.set_out_cache_bytes(previous)


def _prefill(rng):
    """A two-request prefill of N tokens whose second request is skipped (pad slot), its
    arguments and the float64 reference's out."""
    x = rng.standard_normal((N, D), dtype=np.float32)
    w = rng.standard_normal((D, 4), dtype=np.float32) / 2
    st = rng.standard_normal((2, 3, D), dtype=np.float32)
    kw = dict(conv_state=st, query_start_loc=np.array([0, N // 2, N], np.int32),
              cache_indices=np.array([1, -1], np.int32), has_initial_state=np.array([True, True]))
    ref, _ = conv_prefill_ref(x, w, **{k: v.copy() for k, v in kw.items()})
    ref = (ref, prefill_magnitude(x, w, **{k: v.copy() for k, v in kw.items()}))
    return x, w, kw, ref


def _run(x, w, kw):
    """conv_prefill into a new out, on a copy of the state (each call starts from the same)."""
    return gdnconv.conv_prefill(x, w, **{**kw, "conv_state": kw["conv_state"].copy()})


def _check(out, x, w, kw, ref, rows=N // 2):
    """The live request's rows (the first ``rows`` of them) are the reference's, and the
    skipped request's rows, where ``out`` has them, are zeros."""
    out = np.asarray(out)
    assert_outputs_close(out[:rows], ref[0][:rows], ref[1][:rows], np.float32, silu=True)
    assert not out[N // 2:].any(), "a skipped request's rows are not zeros"


def test_a_freed_large_out_is_reused_with_fresh_values(cache, rng):
    """The second call's out lies in the first one's freed block, and its values are its
    own: the first call's are overwritten everywhere, skipped rows included."""
    x, w, kw, ref = _prefill(rng)
    out = _run(x, w, kw)
    _check(out, x, w, kw, ref)
    first = out.ctypes.data
    assert gdnconv.out_cache_bytes() == 0
    del out
    assert gdnconv.out_cache_bytes() == BIG
    x2, w2, kw2, ref2 = _prefill(rng)
    out2 = _run(x2, w2, kw2)
    assert out2.ctypes.data == first and gdnconv.out_cache_bytes() == 0
    assert out2.shape == (N, D) and out2.dtype == np.float32 and out2.flags.c_contiguous and out2.flags.writeable
    _check(out2, x2, w2, kw2, ref2)


def test_a_view_keeps_its_block(cache, rng):
    """A block goes back only when every view of its array is freed: no two live arrays
    share memory."""
    x, w, kw, ref = _prefill(rng)
    out = _run(x, w, kw)
    head = out[:4]
    first = out.ctypes.data
    del out
    assert gdnconv.out_cache_bytes() == 0
    out2 = _run(x, w, kw)
    assert out2.ctypes.data != first
    _check(out2, x, w, kw, ref)
    _check(head, x, w, kw, ref, rows=4)
    del head
    assert gdnconv.out_cache_bytes() == BIG


def test_small_outs_and_a_zero_limit_are_not_kept(cache, rng):
    """Outs under 4 MiB are left to malloc, one of 4 MiB is kept; with the limit at 0
    nothing is kept and setting it releases what was."""
    x, w, kw, ref = _prefill(rng)
    gdnconv.conv_prefill(x[:255], w, query_start_loc=np.array([0, 255], np.int32))   # just under 4 MiB
    assert gdnconv.out_cache_bytes() == 0
    gdnconv.conv_prefill(x[:256], w, query_start_loc=np.array([0, 256], np.int32))   # (temporaries: freed at once)
    assert gdnconv.out_cache_bytes() == block(4 << 20)
    _run(x, w, kw)
    assert gdnconv.out_cache_bytes() == block(4 << 20) + BIG
    assert gdnconv.set_out_cache_bytes(0) == 256 << 20
    assert gdnconv.out_cache_bytes() == 0
    out = _run(x, w, kw)
    _check(out, x, w, kw, ref)
    del out
    assert gdnconv.out_cache_bytes() == 0


def test_the_limit_is_kept(cache, rng):
    """A block that would take the cache past its limit pushes the oldest out; one larger
    than the limit is released."""
    x, w, kw, ref = _prefill(rng)
    outs = [_run(x, w, kw) for _ in range(3)]
    gdnconv.set_out_cache_bytes(2 * BIG)
    outs.clear()
    assert gdnconv.out_cache_bytes() == 2 * BIG
    gdnconv.set_out_cache_bytes(BIG - 1)
    assert gdnconv.out_cache_bytes() == 0
    _run(x, w, kw)
    assert gdnconv.out_cache_bytes() == 0


def test_torch_outs_reuse_blocks(cache, rng):
    """A new torch out (the core, and gdnconv.vllm's (dim, num_tokens) view) reuses a freed
    block too, with the reference's values; such a tensor's storage cannot be resized
    (torch refuses, nothing silent)."""
    torch = pytest.importorskip("torch")
    x, w, kw, ref = _prefill(rng)
    tkw = {k: torch.from_numpy(v.copy()) for k, v in kw.items()}
    out = gdnconv.conv_prefill(torch.from_numpy(x), torch.from_numpy(w), **tkw)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (N, D)
    _check(out.numpy(), x, w, kw, ref)
    first = out.data_ptr()
    with pytest.raises(RuntimeError, match="not resizable"):
        out.untyped_storage().resize_(16)
    del out
    assert gdnconv.out_cache_bytes() == BIG
    import gdnconv.vllm as gv
    st = torch.from_numpy(kw["conv_state"].transpose(0, 2, 1).copy())   # vLLM's (num_cache_lines, dim, state_len)
    res = gv.causal_conv1d_fn(torch.from_numpy(x).T, torch.from_numpy(w), None, st, tkw["query_start_loc"],
                              tkw["cache_indices"], tkw["has_initial_state"])
    assert res.shape == (D, N) and res.stride() == (1, D) and res.data_ptr() == first
    _check(res.T.numpy(), x, w, kw, ref)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1", None])
def test_a_bad_limit_is_refused_by_name(cache, bad):
    """Anything but an integer >= 0 is refused, naming the argument and the value, and the
    limit stays as it was."""
    with pytest.raises(ValueError, match=rf"nbytes must be an integer >= 0 .*got {bad!r}"):
        gdnconv.set_out_cache_bytes(bad)
    assert gdnconv.set_out_cache_bytes(256 << 20) == 256 << 20


def test_a_tensor_subclass_keeps_empty_like(cache, rng):
    """A tensor subclass x gets torch.empty_like's out, of its subclass, as below 4 MiB;
    no block is used."""
    torch = pytest.importorskip("torch")

    class Sub(torch.Tensor):
        pass

    x, w, kw, ref = _prefill(rng)
    tkw = {k: torch.from_numpy(v.copy()) for k, v in kw.items()}
    out = gdnconv.conv_prefill(torch.from_numpy(x).as_subclass(Sub), torch.from_numpy(w), **tkw)
    assert type(out) is Sub and out.stride() == (D, 1)
    _check(out.as_subclass(torch.Tensor).numpy(), x, w, kw, ref)
    del out
    assert gdnconv.out_cache_bytes() == 0


FORK = """
import os, numpy as np, gdnconv
x = np.random.default_rng(0).standard_normal((2048, 4096), dtype=np.float32)
w = np.full((4096, 4), 0.25, np.float32)
qsl = np.array([0, 2048], np.int32)
BLOCK = 34 << 20   # 32 MiB and the skew, in 2 MiB steps
want = np.empty_like(x)
gdnconv.conv_prefill(x, w, query_start_loc=qsl, out=want)
gdnconv.conv_prefill(x, w, query_start_loc=qsl)   # a freed out: the cache holds its block
assert gdnconv.out_cache_bytes() == BLOCK
pid = os.fork()
if pid == 0:   # the child reuses the inherited block, and its cache works on its own
    out = gdnconv.conv_prefill(x, w, query_start_loc=qsl)
    ok = gdnconv.out_cache_bytes() == 0 and (out.view(np.uint32) == want.view(np.uint32)).all()
    del out
    os._exit(0 if ok and gdnconv.out_cache_bytes() == BLOCK else 1)
_, status = os.waitpid(pid, 0)
out = gdnconv.conv_prefill(x, w, query_start_loc=qsl)
assert os.waitstatus_to_exitcode(status) == 0, status
assert (out.view(np.uint32) == want.view(np.uint32)).all()
print("ok")
"""


def test_a_forked_child_reuses_and_keeps_its_own_blocks():
    """After fork() the child takes the block it inherited and gives it back to its own
    cache (the cache's lock is released on both sides of a fork); the parent's block is
    still its own. Bits equal a call into a given out."""
    r = run_python(FORK)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_a_repeated_torch_out_of_8_mib_reuses_its_block(cache):
    """An 8 MiB torch out comes back to the cache and the next call's out lies in it: in a
    fresh process malloc mapped each such tensor afresh (~515 page faults and 3-15 ms a
    call on the 2-core Xeon, where the NumPy call took 0.8 ms)."""
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((1024, 2048), dtype=np.float32))
    w = torch.full((2048, 4), 0.25)
    qsl = torch.tensor([0, 1024], dtype=torch.int32)
    want = gdnconv.conv_prefill(x.numpy(), w.numpy(), query_start_loc=qsl.numpy(), out=np.empty((1024, 2048), np.float32))
    out = gdnconv.conv_prefill(x, w, query_start_loc=qsl)
    first = out.data_ptr()
    del out
    assert gdnconv.out_cache_bytes() == block(8 << 20)
    for _ in range(2):
        out = gdnconv.conv_prefill(x, w, query_start_loc=qsl)
        assert out.data_ptr() == first and gdnconv.out_cache_bytes() == 0
        assert (out.numpy().view(np.uint32) == want.view(np.uint32)).all()
        del out
