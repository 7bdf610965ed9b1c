"""The conv state in other memory layouts: the same call on a channel-contiguous state,
a time-contiguous one (vLLM's DS layout ``(S, D, L)`` passed transposed, padded channel
strides, transformers' ``(B, D, W)`` cache as ``[..., 1:]``) gives the same outputs and
states bit for bit on every ISA, within the reference's tolerance, writes nothing
outside the view, and runs the ISA's SIMD entry (``gdnconv.last_path``)."""
import sys
import threading

import numpy as np
import pytest
from conftest import DTYPES, reference, skipped_rows

import gdnconv
from gdnconv.testing import assert_bits_equal, assert_outputs_close, bits

# layout -> (extra columns before, after the L time columns of each channel)
LAYOUTS = {"ds": (0, 0), "hf": (1, 0), "tail": (0, 1), "pad": (2, 3), "wide": (0, 9)}


def time_contiguous(values, layout):
    """(memory, view): ``values`` ((S, L, D)) in a (S, D, before + L + after) buffer of
    recognisable garbage, and the (S, L, D) view of it gdnconv is passed."""
    before, after = LAYOUTS[layout]
    S, L, D = values.shape
    mem = np.arange(S * D * (before + L + after), dtype=np.uint32).astype(np.uint16)
    with np.errstate(invalid="ignore"):   # NaN garbage
        mem = (mem | 0x7c01).view(np.float16).astype(values.dtype).reshape(S, D, before + L + after)
    mem[..., before:before + L] = values.transpose(0, 2, 1)
    return mem, mem[..., before:before + L].transpose(0, 2, 1)


def make(rng, dtype, W, D, mode, B=4, T=3):
    dt = DTYPES[dtype]
    L = W - 1 if mode == "plain" else W - 2 + T + 1
    S = B + 2
    kw = dict(conv_state_indices=np.array([4, -1, 0, 2][:B], np.int32), activation="silu")
    if mode == "varlen":
        qsl = np.array([0, 3, 3, 4, 6], np.int32)
        x = rng.standard_normal((6, D)).astype(dt)
        kw.update(query_start_loc=qsl, num_accepted_tokens=rng.integers(1, L - W + 3, B).astype(np.int32))
    else:
        x = rng.standard_normal((B, T, D)).astype(dt)
        if mode == "spec":
            kw["num_accepted_tokens"] = rng.integers(1, L - W + 3, B).astype(np.int32)
    w = (rng.standard_normal((D, W)) / np.sqrt(W)).astype(dt)
    b = rng.standard_normal(D).astype(dt)
    return x, rng.standard_normal((S, L, D)).astype(dt), w, b, kw


def _simd_entry(isa, layout_kind):
    return f"{isa}:{layout_kind}" if isa != "scalar" else "scalar:" + (
        "state-channel-contiguous" if layout_kind == "state-channel-contiguous" else "any-strides")


def check_every_layout(isa, x, values, w, b, kw):
    """The channel-contiguous call against the reference, then the same call on every
    layout of LAYOUTS: the SIMD entry ran, outputs and states bit for bit the same, and
    nothing written outside the view."""
    st_sd = values.copy()
    out_sd = gdnconv.conv_update_multi(x, st_sd, w, b, **kw)
    assert gdnconv.last_path() == _simd_entry(isa, "state-channel-contiguous")
    ref_out, ref_state, mag = reference(x, values, w, b, **kw)
    rows = ~skipped_rows(x.shape, kw["conv_state_indices"], kw.get("query_start_loc"))
    assert_outputs_close(out_sd, ref_out, mag, out_sd.dtype, silu=True, rows=rows)
    assert_bits_equal(st_sd, ref_state, "channel-contiguous conv_state")
    for layout, (before, after) in LAYOUTS.items():
        mem, st = time_contiguous(values, layout)
        outside = bits(mem).copy()
        out = gdnconv.conv_update_multi(x, st, w, b, **kw)
        dense = layout == "ds" and values.shape[1] == 1   # one row: channel stride 1
        assert gdnconv.last_path() == _simd_entry(
            isa, "state-channel-contiguous" if dense else "state-time-contiguous"), layout
        assert np.array_equal(bits(out), bits(out_sd)), f"{layout}: out differs from the channel-contiguous call"
        assert_bits_equal(np.ascontiguousarray(st), st_sd, f"{layout} conv_state")
        L = values.shape[1]
        for cols in (slice(0, before), slice(before + L, before + L + after)):
            assert np.array_equal(bits(mem)[..., cols], outside[..., cols]), f"{layout}: wrote outside the view"


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("W", range(2, 9))
@pytest.mark.parametrize("mode", ["plain", "spec", "varlen"])
def test_time_contiguous_matches_channel_contiguous(isa, rng, dtype, W, mode):
    """D = 300: a block of 256 channels and a tail that is no whole vector line."""
    check_every_layout(isa, *make(rng, dtype, W, 300, mode))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("D", [16, 31, 32, 33, 64, 255, 257, 520])
def test_channel_tails_and_array_end(isa, rng, dtype, D):
    """D around the line sizes (16 fp32 / 32 16-bit channels; avx2 8 / 16): the last line
    of the array and the block tail take the element loops; the state's memory ends at
    the view's last element (ds), so no read may pass it."""
    x, values, w, b, kw = make(rng, dtype, 4, D, "spec")
    st_sd = values.copy()
    out_sd = gdnconv.conv_update_multi(x, st_sd, w, b, **kw)
    for layout in ("ds", "hf"):
        _, st = time_contiguous(values, layout)
        out = gdnconv.conv_update_multi(x, st, w, b, **kw)
        assert np.array_equal(bits(out), bits(out_sd)), layout
        assert_bits_equal(np.ascontiguousarray(st), st_sd, layout)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["plain", "spec"])
@pytest.mark.parametrize("T", [8, 9, 19])
def test_more_tokens_than_a_slab(isa, rng, dtype, mode, T):
    """T past the kernel's 8-token staging slab: the speculative roll is written slab by
    slab (rows 0..W-3+8, then 8 or fewer rows at a time), transposed for every layout."""
    check_every_layout(isa, *make(rng, dtype, 4, 300, mode, T=T))


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("W", range(2, 9))
@pytest.mark.parametrize("extra", [0, 1])
def test_one_token_plain_decode(isa, rng, dtype, W, extra):
    """vLLM's plain decode: one token, state_len W-1 (or W, as with speculative decoding
    configured; ``extra``), which AVX-512 reads and rolls in place at channel stride <= 8
    (16-bit) or <= 4 (fp32; ds, hf at small W): every layout as the channel-contiguous
    call, bit for bit, nothing written outside the view."""
    x, values, w, b, kw = make(rng, dtype, W, 300, "plain", T=1)
    if extra:
        values = np.concatenate([values, rng.standard_normal(values[:, :1].shape).astype(values.dtype)], axis=1)
    check_every_layout(isa, x, values, w, b, kw)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("W", range(2, 7))
@pytest.mark.parametrize("T", range(1, 6))
@pytest.mark.parametrize("extra", [0, 1])
def test_short_speculative_decode(isa, rng, dtype, W, T, extra):
    """vLLM's speculative decode with state_len W-2+T (its DS layout's channel stride; one
    more row: ``extra``), which AVX-512 reads and rolls in place for a 16-bit state of
    channel stride <= 8 (fp32: <= 4) at W <= 5 and T <= 4 (the others staged), from every window start
    the state holds: every layout as the channel-contiguous call, bit for bit, nothing
    written outside the view."""
    x, values, w, b, kw = make(rng, dtype, W, 300, "spec", T=T)
    L = W - 2 + T + extra
    values = values[:, :L]
    kw["num_accepted_tokens"] = (np.arange(4) % (L - W + 2) + 1).astype(np.int32)
    check_every_layout(isa, x, values, w, b, kw)


def _by_a_guard_page(shape, dtype, side="end"):
    """A writable array of ``shape`` whose memory ends where a page that cannot be read
    begins (``side="end"``), or begins where such a page ends (``"start"``), so an access
    past its last element, or before its first, faults (POSIX)."""
    import ctypes
    import mmap
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    pages = -(-nbytes // mmap.PAGESIZE) + 1
    buf = mmap.mmap(-1, pages * mmap.PAGESIZE)
    at = (pages - 1) * mmap.PAGESIZE if side == "end" else 0
    guard = ctypes.addressof(ctypes.c_char.from_buffer(buf)) + at
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(guard), mmap.PAGESIZE, 0) == 0, "mprotect failed"
    offset = (pages - 1) * mmap.PAGESIZE - nbytes if side == "end" else mmap.PAGESIZE
    return np.frombuffer(buf, np.uint8, nbytes, offset).view(dtype).reshape(shape)


@pytest.mark.skipif(sys.platform == "win32", reason="the guard page needs POSIX mprotect, which Windows lacks")
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("D", [31, 32, 33, 64, 95, 257, 520])
@pytest.mark.parametrize("layout", ["ds", "hf"])
@pytest.mark.parametrize("mode, T, L", [("plain", 1, 3), ("plain", 1, 4), ("spec", 1, 3), ("spec", 2, 4),
                                        ("spec", 3, 5), ("spec", 4, 6)])
def test_short_decode_tails_array_end_and_out_is_x(isa, rng, dtype, D, layout, mode, T, L):
    """Plain decode of one token and speculative decode of up to 4, W=4, on a
    time-contiguous state whose memory ends at the view's last element, followed by a page
    that faults when read: the in-place path (16-bit; fp32 at channel stride <= 4) reads
    nothing past it (its last block vector is read with a mask), and the channels past the
    last line step take the element loops (fp32 at D = 95: a last unit whose line steps
    end half way through a group of 32 is staged whole); out=x as vLLM's callers pass it."""
    x, values, w, b, kw = make(rng, dtype, 4, D, mode, T=T)
    if L > values.shape[1]:
        values = np.concatenate([values, rng.standard_normal(values[:, :1].shape).astype(values.dtype)], axis=1)
    values = values[:, :L]
    if mode == "spec":   # every window start the state holds
        kw["num_accepted_tokens"] = (np.arange(4) % (L - 2) + 1).astype(np.int32)
    st_sd = values.copy()
    out_sd = gdnconv.conv_update_multi(x, st_sd, w, b, **kw)
    mem, _ = time_contiguous(values, layout)
    end = _by_a_guard_page(mem.shape, mem.dtype)
    end[...] = mem
    before = LAYOUTS[layout][0]
    st = end[..., before:before + L].transpose(0, 2, 1)
    xo = x.copy()
    out = gdnconv.conv_update_multi(xo, st, w, b, out=xo, **kw)
    assert out is xo
    rows = ~skipped_rows(x.shape, kw["conv_state_indices"], None)   # (a padded request's row keeps x)
    assert np.array_equal(bits(out)[rows], bits(out_sd)[rows]), f"{layout}: out differs from the channel-contiguous call"
    assert_bits_equal(np.ascontiguousarray(st), st_sd, f"{layout} conv_state")
    assert np.array_equal(bits(end)[..., :before], bits(mem)[..., :before]), "wrote outside the view"


@pytest.mark.skipif(sys.platform == "win32", reason="the guard page needs POSIX mprotect, which Windows lacks")
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("D", [32, 33, 300])
@pytest.mark.parametrize("W, mode, T", [(2, "plain", 1), (3, "plain", 1), (4, "plain", 1), (4, "spec", 3),
                                        (5, "plain", 1), (3, "spec", 5)])
def test_gapped_state_starts_at_a_page(isa, rng, dtype, D, W, mode, T):
    """A time-contiguous state with a gap column after each channel's rows (channel
    stride L + 1) whose memory begins where a page that faults when touched ends: the
    transposed rows' stores (AVX2 16-bit: dword-masked, from each chunk and from 2 bytes
    before it) touch nothing before the state's first element and write no gap."""
    x, values, w, b, kw = make(rng, dtype, W, D, mode, T=T)
    L = values.shape[1]
    st_sd = values.copy()
    out_sd = gdnconv.conv_update_multi(x, st_sd, w, b, **kw)
    mem, _ = time_contiguous(values, "tail")
    start = _by_a_guard_page(mem.shape, mem.dtype, "start")
    start[...] = mem
    st = start[..., :L].transpose(0, 2, 1)
    out = gdnconv.conv_update_multi(x, st, w, b, **kw)
    assert np.array_equal(bits(out), bits(out_sd)), "out differs from the channel-contiguous call"
    assert_bits_equal(np.ascontiguousarray(st), st_sd, "conv_state")
    assert np.array_equal(bits(start)[..., L:], bits(mem)[..., L:]), "wrote a gap"


def test_transformers_cache_view(isa, rng):
    """transformers' (B, D, W) cache, bf16, plain decode: the view [..., 1:] (channel stride
    W) runs the SIMD entry and leaves column 0 alone."""
    torch = pytest.importorskip("torch")
    B, D, W = 3, 1000, 4
    cache = torch.randn(B, D, W, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    x = torch.randn(B, 1, D).to(torch.bfloat16)
    w = torch.randn(D, W).to(torch.bfloat16)
    st_sd = cache[..., 1:].transpose(1, 2).contiguous()
    out_sd = gdnconv.conv_update_multi(x, st_sd, w)
    col0 = cache[..., 0].clone()
    out = gdnconv.conv_update_multi(x, cache[..., 1:].transpose(1, 2), w)
    assert gdnconv.last_path() == _simd_entry(isa, "state-time-contiguous")
    assert torch.equal(out.view(torch.int16), out_sd.view(torch.int16))
    assert torch.equal(cache[..., 1:].transpose(1, 2).contiguous().view(torch.int16), st_sd.view(torch.int16))
    assert torch.equal(cache[..., 0].view(torch.int16), col0.view(torch.int16))


def test_other_strides_take_the_portable_kernel(rng):
    """A state whose channels are neither contiguous nor time-contiguous (time stride 2),
    or an out with strided channels, runs the portable kernel and is still right."""
    x, values, w, b, kw = make(rng, "fp32", 4, 40, "plain")
    mem = np.zeros((values.shape[0], 40, 2 * values.shape[1]), np.float32)
    mem[..., ::2] = values.transpose(0, 2, 1)
    st = mem[..., ::2].transpose(0, 2, 1)
    gdnconv.conv_update_multi(x, st, w, b, **kw)
    assert gdnconv.last_path() == "scalar:any-strides"
    _, ref_state, _ = reference(x, values, w, b, **kw)
    assert_bits_equal(np.ascontiguousarray(st), ref_state, "conv_state")


def test_last_path_is_per_thread(rng):
    x, values, w, b, kw = make(rng, "fp32", 4, 40, "plain")
    seen = []
    t = threading.Thread(target=lambda: seen.append(gdnconv.last_path()))
    gdnconv.conv_update_multi(x, values.copy(), w, b, **kw)
    t.start()
    t.join()
    assert seen == [None]
    assert gdnconv.last_path().endswith(":state-channel-contiguous")
