"""conv_prefill (vLLM's causal_conv1d_fn) against the float64 reference, on every ISA.

A sampled grid of calls (widths, dtypes, lengths, varlen with zero-length requests,
pads, has_initial_state mixes, state and x layouts), chaining with conv_update_multi
(states and outputs bit for bit), thread splits (bit for bit), and refusals that must
leave every array byte-identical.
"""
import os

import numpy as np
import pytest
from conftest import (
    BF16,
    DTYPES,
    F32,
    alloc,
    as_np,
    assert_bits_equal,
    bits,
    f64,
    sentinel_like,
)

import gdnconv
from gdnconv import _core
from gdnconv.reference import causal_conv1d_ref, conv_prefill_ref, prefill_magnitude
from gdnconv.testing import assert_outputs_close


def assert_out_close(actual, reference, magnitude, dtype, silu, rows=None):
    assert_outputs_close(actual, reference, magnitude, dtype, silu=silu, rows=rows)

AXES = {
    "dtype": ["fp32", "fp16", "bf16"],
    "W": [2, 3, 4, 5, 6, 7, 8],
    "D": [1, 7, 64, 100, 1000],
    "T": [1, 2, 3, 5, 17, 64, 300],
    "batching": ["fixed", "varlen"],
    "pads": ["nopad", "pad"],
    "init": ["none", "all", "mix", "None"],
    "state": ["SD", "DS", "SDpad", "nostate"],
    "out": ["new", "given", "x"],
    "wkind": ["same", "f32", "packed", "wT"],
    "act": ["silu", "none"],
    "bias": ["bias", "nobias"],
    "xmem": ["contig", "rowpad", "chstride", "Dmajor", "vllmT"],
}
N_RANDOM = 36


def _cases():
    rng = np.random.default_rng(20261130)
    names = list(AXES)
    n_cover = max(len(v) for v in AXES.values())
    perms = {a: rng.permutation(n_cover) for a in names}
    cases = [{a: AXES[a][perms[a][j] % len(AXES[a])] for a in names} for j in range(n_cover)]
    cases += [{a: AXES[a][int(rng.integers(len(AXES[a])))] for a in names} for _ in range(N_RANDOM)]
    # a few long prompts (one tile boundary after another, and the channel tails)
    cases.append(dict(cases[0], dtype="bf16", W=4, D=100, T=2100, batching="varlen", state="SD", out="new",
                      xmem="contig", init="mix", pads="pad"))
    cases.append(dict(cases[1], dtype="fp32", W=7, D=72, T=1500, batching="fixed", state="DS", out="given",
                      xmem="vllmT", init="all"))
    params = []
    for i, c in enumerate(cases):
        c["seed"] = 500 + i
        cid = "-".join(str(c[a]) for a in names) + f"-{i}"
        params.append(pytest.param(c, id=cid))
    return params


CASES = _cases()


def make_x(rng, shape, dt, mem):
    """x of shape in memory layout mem: alloc's, "Dmajor" (channels outermost in memory:
    channel stride N), or "vllmT": vLLM's x, a (D, N) view of (N, D) memory whose
    rows are every other row of a buffer, passed as its .T (time stride 2D)."""
    if mem == "Dmajor":
        return np.ascontiguousarray(alloc(rng, shape, dt).swapaxes(-1, -2)).swapaxes(-1, -2)
    if mem == "vllmT":
        buf = alloc(rng, shape[:-2] + (2 * shape[-2], shape[-1]), dt)[..., ::2, :]
        vllm_x = buf.swapaxes(-1, -2)          # (D, N) as vLLM holds it
        return vllm_x.swapaxes(-1, -2)         # what a caller passes: x.T
    return alloc(rng, shape, dt, mem)


def make_prefill(rng, *, dtype="fp32", W=4, D=16, T=8, B=3, batching="varlen", pads="nopad", init="mix",
                 state="SD", wkind="same", act="silu", bias="bias", xmem="contig", extra=1, **_):
    """Random arguments of one legal conv_prefill call: dict with x, weight, bias and "kw".
    Slots of requests without an initial state are filled with NaN: reading them fails."""
    dt = DTYPES[dtype]
    if batching == "varlen":
        lens = rng.integers(0, T + 1, size=B)
        lens[int(rng.integers(B))] = T
        if B > 1:
            lens[(int(np.argmax(lens)) + 1) % B] = 0      # one zero-length request
        qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        x = make_x(rng, (int(qsl[-1]), D), dt, xmem)
    else:
        qsl = None
        x = make_x(rng, (B, T, D), dt, xmem)
    wdt = dt if wkind == "same" else F32
    w = (rng.standard_normal((D, W)) / np.sqrt(W)).astype(wdt)
    if wkind == "packed":
        w = gdnconv.pack_weight(w)
    elif wkind == "wT":
        w = np.ascontiguousarray(w.T.astype(dt)).T
    b = None
    if bias == "bias":
        b = (rng.standard_normal(D) * 0.5).astype(F32 if wkind in ("f32", "packed") else dt)
    kw = dict(activation=None if act == "none" else act, query_start_loc=qsl, pad_slot_id=-1)
    if state == "nostate":
        return dict(x=x, weight=w, bias=b, kw=kw)
    L = W - 1 + extra
    S = B + 2
    if state == "SD":
        st = rng.standard_normal((S, L, D)).astype(dt)
    elif state == "SDpad":
        st = rng.standard_normal((S + 1, L + 2, D + 8)).astype(dt)[1:, 1:L + 1, 4:D + 4]
    else:  # vLLM's (S, D, L) storage as a transposed view
        st = rng.standard_normal((S, D, L)).astype(dt).transpose(0, 2, 1)
    idx = rng.permutation(S)[:B].astype(np.int32)
    if pads == "pad":
        idx[int(rng.integers(B))] = -1
    flags = {"none": np.zeros(B, bool), "all": np.ones(B, bool), "mix": rng.random(B) < 0.5,
             "None": None}[init]
    for i in range(B):
        if idx[i] >= 0 and (flags is None or not flags[i]):
            st[idx[i]] = np.nan
    kw.update(conv_state=st, cache_indices=idx, has_initial_state=flags)
    return dict(x=x, weight=w, bias=b, kw=kw)


def _np_kw(kw):
    out = {}
    for k, v in kw.items():
        if k == "conv_state":
            out[k] = as_np(v) if v is not None else None
        elif hasattr(v, "numpy"):
            out[k] = v.numpy()
        else:
            out[k] = v
    return out


def reference(call):
    """(out, new_state, magnitude) of the float64 reference."""
    x, w, b, kw = as_np(call["x"]), as_np(call["weight"]), as_np(call["bias"]), _np_kw(call["kw"])
    with np.errstate(invalid="ignore", over="ignore"):
        out, state = conv_prefill_ref(x, w, b, **kw)
        mag = prefill_magnitude(x, w, b, **kw)
    return out, state, mag


def skipped(call):
    """Boolean mask over x's rows of pad-slot requests."""
    kw = _np_kw(call["kw"])
    x = call["x"]
    mask = np.zeros(tuple(x.shape[:-1]), bool)
    idx = kw.get("cache_indices")
    if idx is None:
        return mask
    q = kw["query_start_loc"]
    for i, s in enumerate(idx):
        if s == kw["pad_slot_id"]:
            if q is not None:
                mask[q[i]:q[i + 1]] = True
            else:
                mask[i] = True
    return mask


def run_and_check(call, out_mode="new", num_threads=None, rng=None):
    """One conv_prefill call checked against the reference: outputs within tolerance,
    skipped rows zero (new out) or untouched (given out), the state bit for bit."""
    rng = np.random.default_rng(0) if rng is None else rng
    ref_out, ref_state, mag = reference(call)
    skip = skipped(call)
    x, kw = call["x"], call["kw"]
    out = {"new": None, "given": sentinel_like(rng, x) if out_mode == "given" else None, "x": x}[out_mode]
    before = None if out is None else bits(out)
    res = gdnconv.conv_prefill(x, call["weight"], call["bias"], out=out, num_threads=num_threads, **kw)
    if out is not None:
        assert res is out
    dtype = as_np(res).dtype
    assert dtype == as_np(x).dtype and tuple(res.shape) == tuple(x.shape)
    assert_out_close(res, ref_out, mag, dtype, kw["activation"] is not None, rows=~skip)
    if skip.any():
        if out is None:
            assert (f64(res)[skip] == 0).all(), "rows of skipped requests must be zero in a new out"
        else:
            assert np.array_equal(bits(res)[skip], before[skip]), "skipped rows must be left as they were"
    if kw.get("conv_state") is not None:
        assert_bits_equal(kw["conv_state"], ref_state, "conv_state")
    return res


def test_covering_set_hits_every_axis_value():
    for axis, values in AXES.items():
        assert {p.values[0][axis] for p in CASES} >= set(values), axis


@pytest.mark.parametrize("case", CASES)
def test_grid(case, isa):
    rng = np.random.default_rng(case["seed"])
    call = make_prefill(rng, **case)
    run_and_check(call, case["out"], rng=rng)


def test_reference_matches_stream_reference(rng):
    """conv_prefill_ref with zero history is causal_conv1d_ref of each request."""
    x = rng.standard_normal((30, 8))
    w = rng.standard_normal((8, 4))
    b = rng.standard_normal(8)
    qsl = np.array([0, 10, 10, 30])
    out, _ = conv_prefill_ref(x, w, b, query_start_loc=qsl)
    for i in range(3):
        assert np.allclose(out[qsl[i]:qsl[i + 1]], causal_conv1d_ref(x[qsl[i]:qsl[i + 1]], w, b), atol=1e-12)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("W", [2, 4, 8])
def test_chaining_with_updates(isa, rng, dtype, W):
    """prefill(prompt) then k one-token plain updates == prefill(prompt ++ k tokens):
    states and outputs bit for bit (same tap order, one rounding); and a prefill of T
    tokens == T one-token updates from the same initial state."""
    dt = DTYPES[dtype]
    D, T, k = 200, 37, 5
    seq = rng.standard_normal((T + k, D)).astype(dt)
    w = (rng.standard_normal((D, W)) / 2).astype(dt)
    b = rng.standard_normal(D).astype(dt)
    init = rng.standard_normal((1, W - 1 + 2, D)).astype(dt)
    for has_init in (False, True):
        s1 = init.copy()
        o1 = gdnconv.conv_prefill(seq[None, :T], w, b, conv_state=s1, has_initial_state=[has_init])
        steps = [gdnconv.conv_update_multi(seq[None, T + j:T + j + 1], s1, w, b) for j in range(k)]
        s2 = init.copy()
        o2 = gdnconv.conv_prefill(seq[None], w, b, conv_state=s2, has_initial_state=[has_init])
        assert_bits_equal(s1, s2, "state after prefill + updates")
        assert_bits_equal(o1[0], o2[0, :T], "prompt outputs")
        assert_bits_equal(np.concatenate([o[0] for o in steps]), o2[0, T:], "decode outputs")
    # prefill of T tokens == T single-token updates (history = the slot's rows)
    s1, s2 = init.copy(), init.copy()
    o1 = gdnconv.conv_prefill(seq[None], w, b, conv_state=s1, has_initial_state=np.array([True]))
    o2 = np.concatenate([gdnconv.conv_update_multi(seq[None, t:t + 1], s2, w, b)[0] for t in range(T + k)])
    assert_bits_equal(s1, s2, "state: prefill vs one-token updates")
    assert_bits_equal(o1[0], o2, "outputs: prefill vs one-token updates")


@pytest.fixture
def small_threshold():
    previous = _core._set_parallel_min_bytes(0)
    try:
        yield
    finally:
        _core._set_parallel_min_bytes(previous)


@pytest.mark.parametrize("shape", ["long", "varlen", "few_tokens", "two_chunks"])
def test_threads_bit_identical(isa, rng, small_threshold, shape):
    """1 thread vs 2: the time split (one long prompt, varlen with pads) or the
    channel split (few tokens: blocks of 256 channels; two chunks: of 512, and a
    remainder) gives the same bits, and the reference's values (one thread: no split)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: no second thread")
    B, T, D = {"long": (1, 3001, 136), "varlen": (5, 700, 72), "few_tokens": (2, 3, 520),
               "two_chunks": (1, 300, 1100)}[shape]
    call = make_prefill(rng, dtype="bf16", W=4, D=D, T=T, B=B, batching="varlen" if B > 1 else "fixed",
                        pads="pad" if shape == "varlen" else "nopad", init="mix")
    st0 = call["kw"]["conv_state"].copy()
    res = []
    for n in (1, 2):
        call["kw"]["conv_state"][...] = st0
        res.append((run_and_check(call, num_threads=n), call["kw"]["conv_state"].copy()))
    assert_bits_equal(res[0][0], res[1][0], "out, 1 vs 2 threads")
    assert_bits_equal(res[0][1], res[1][1], "conv_state, 1 vs 2 threads")


@pytest.mark.parametrize("W", [3, 8])
def test_chunk_boundary_near_request_start(isa, rng, small_threshold, W):
    """Requests that start 1..W-2 rows before a time-chunk boundary (chunks of 256 rows
    of the whole call), with and without an initial state: the chunk boundary moves to
    the request's start (only the unit holding token 0 reads the history and writes the
    state), and 1 vs 2 threads give the reference's values, the same bits."""
    # starts 0, 255 (boundary 256 at token 1), 260, 768 - (W - 2) (boundary 768 at token W-2), ...
    lens = [255, 5, 768 - (W - 2) - 260, 300, 1, W - 2]
    call = make_prefill(rng, dtype="bf16", W=W, D=96, T=1, B=len(lens), init="all")
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    call["x"] = alloc(rng, (int(qsl[-1]), 96), BF16)
    flags = np.arange(len(lens)) % 2 == 1
    st, idx = call["kw"]["conv_state"], call["kw"]["cache_indices"]
    for i in np.flatnonzero(~flags):
        if idx[i] >= 0:
            st[idx[i]] = np.nan       # not read without an initial state
    call["kw"].update(query_start_loc=qsl, has_initial_state=flags)
    st0 = call["kw"]["conv_state"].copy()
    res = []
    for n in (1, 2):
        call["kw"]["conv_state"][...] = st0
        res.append((run_and_check(call, num_threads=n), call["kw"]["conv_state"].copy()))
    assert_bits_equal(res[0][0], res[1][0], "out, 1 vs 2 threads")
    assert_bits_equal(res[0][1], res[1][1], "conv_state, 1 vs 2 threads")


def test_no_state_is_causal_conv(isa, rng):
    x = rng.standard_normal((3, 50, 40)).astype(np.float32)
    w = rng.standard_normal((40, 4)).astype(np.float32)
    out = gdnconv.conv_prefill(x, w, activation=None)
    for i in range(3):
        ref = causal_conv1d_ref(x[i], w, activation=None)
        assert_out_close(out[i], ref, causal_conv1d_ref(np.abs(x[i]), np.abs(w), activation=None), F32, False)


def test_empty_batch_and_zero_lengths():
    w = np.ones((16, 4), np.float32)
    st = np.full((2, 3, 16), 7.0, np.float32)
    out = gdnconv.conv_prefill(np.zeros((0, 16), np.float32), w, conv_state=st, query_start_loc=[0])
    assert out.shape == (0, 16)
    out = gdnconv.conv_prefill(np.zeros((0, 16), np.float32), w, conv_state=st, query_start_loc=[0, 0, 0],
                               has_initial_state=[True, False])
    assert (st == 7).all()
    out = gdnconv.conv_prefill(np.zeros((2, 0, 16), np.float32), w, conv_state=st)
    assert out.shape == (2, 0, 16) and (st == 7).all()


def test_short_prompt_keeps_history_rows(isa, rng):
    """T < W-1: the new state is the old history's last rows then x (or zeros then x)."""
    dt = BF16
    W, D = 6, 40
    st = rng.standard_normal((3, 7, D)).astype(dt)
    x = rng.standard_normal((2, 2, D)).astype(dt)
    w = rng.standard_normal((D, W)).astype(dt)
    call = dict(x=x, weight=w, bias=None, kw=dict(activation="silu", conv_state=st, query_start_loc=None,
                                                  cache_indices=np.array([2, 0], np.int32),
                                                  has_initial_state=np.array([True, False]), pad_slot_id=-1))
    before = st.copy()
    run_and_check(call)
    assert_bits_equal(st[2, :3], before[2, 2:5], "kept history")
    assert (f64(st[0, :3]) == 0).all()
    assert_bits_equal(st[:, 5:], before[:, 5:], "rows past W-2")


def test_torch_zero_copy(isa, rng):
    torch = pytest.importorskip("torch")
    D, W = 96, 4
    x = torch.randn(3, 20, D, dtype=torch.bfloat16)
    w = torch.randn(D, W, dtype=torch.bfloat16)
    st = torch.randn(4, W - 1, D, dtype=torch.bfloat16)
    idx = torch.tensor([3, -1, 0], dtype=torch.int32)
    flags = torch.tensor([True, False, False])
    call = dict(x=x, weight=w, bias=None, kw=dict(activation="silu", conv_state=st, query_start_loc=None,
                                                  cache_indices=idx, has_initial_state=flags, pad_slot_id=-1))
    ptr = st.data_ptr()
    out = run_and_check(call)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and st.data_ptr() == ptr
    # vLLM's layouts: x as (D, N) -> pass x.T; state (S, D, L) -> pass .transpose(1, 2)
    x_vllm = torch.randn(50, D, dtype=torch.bfloat16).T      # (D, N) view of (N, D) memory
    sd = torch.randn(2, D, W - 1, dtype=torch.bfloat16)
    qsl = torch.tensor([0, 30, 50], dtype=torch.int32)
    call = dict(x=x_vllm.T, weight=w, bias=None,
                kw=dict(activation="silu", conv_state=sd.transpose(1, 2), query_start_loc=qsl,
                        cache_indices=torch.tensor([1, 0], dtype=torch.int32),
                        has_initial_state=torch.tensor([True, True]), pad_slot_id=-1))
    run_and_check(call)


def test_bytes_moved():
    D, W = 64, 4
    x = np.zeros((10, D), BF16)
    w = np.zeros((D, W), BF16)
    st = np.zeros((3, 3, D), BF16)
    kw = dict(conv_state=st, query_start_loc=[0, 4, 4, 10], cache_indices=[0, 1, 2],
              has_initial_state=[True, True, False])
    got = gdnconv.prefill_bytes_moved(x, w, **kw)
    assert got == 2 * D * (2 * 4 + 3 + 3 + 2 * 6 + 0 + 3) + 2 * D * W
    assert gdnconv.prefill_bytes_moved(x, w, query_start_loc=[0, 10]) == 2 * D * 20 + 2 * D * W


# ---------------------------------------------------------------- refusals

def _bad_calls():
    """(name, builder, message fragment): builder(rng) -> (args, kwargs) of a refused call."""
    D, W = 32, 4

    def base(rng, **over):
        x = rng.standard_normal((10, D)).astype(np.float32)
        a = dict(x=x, weight=rng.standard_normal((D, W)).astype(np.float32), bias=None)
        kw = dict(conv_state=rng.standard_normal((4, 3, D)).astype(np.float32), query_start_loc=[0, 4, 10],
                  cache_indices=np.array([0, 2], np.int32), has_initial_state=[True, False],
                  out=np.zeros((10, D), np.float32))
        kw.update(over)
        return a, kw

    cases = [
        ("dtype", lambda r: base(r, conv_state=np.zeros((4, 3, D), np.float16)), "conv_state dtype"),
        ("width", lambda r: (dict(base(r)[0], weight=np.zeros((D, 9), np.float32)), base(r)[1]), "width"),
        ("dim", lambda r: base(r, conv_state=np.zeros((4, 3, D + 1), np.float32)), "conv_state dim"),
        ("state_len", lambda r: base(r, conv_state=np.zeros((4, 2, D), np.float32)), "state_len"),
        ("slot_range", lambda r: base(r, cache_indices=np.array([0, 4], np.int32)), r"cache_indices\[1\] = 4"),
        ("duplicate", lambda r: base(r, cache_indices=np.array([2, 2], np.int32)), "repeats the slot"),
        ("qsl_end", lambda r: base(r, query_start_loc=[0, 4, 9]), "must equal the number of tokens"),
        ("qsl_order", lambda r: base(r, query_start_loc=[0, 5, 4, 10], cache_indices=[0, 1, 2],
                                     has_initial_state=None), "non-decreasing"),
        ("no_qsl", lambda r: base(r, query_start_loc=None, cache_indices=None, has_initial_state=None),
         "needs query_start_loc"),
        ("flags_shape", lambda r: base(r, has_initial_state=[True]), "has_initial_state must have shape"),
        ("flags_dtype", lambda r: base(r, has_initial_state=[0.5, 1.0]), "bool or integer"),
        ("idx_dtype", lambda r: base(r, cache_indices=np.array([0.0, 1.0])), "integer array"),
        ("no_state_idx", lambda r: base(r, conv_state=None), "without conv_state"),
        ("readonly", lambda r: base(r, conv_state=np.broadcast_to(np.zeros((1, 3, D), np.float32), (4, 3, D))),
         "read-only"),
        ("out_overlaps_state", None, "out overlaps conv_state"),
        ("out_overlaps_x", None, "x overlaps out"),
        ("activation", lambda r: base(r, activation="relu"), "activation"),
        ("out_shape", lambda r: base(r, out=np.zeros((9, D), np.float32)), "out shape"),
    ]
    return cases


@pytest.mark.parametrize("name,build,msg", _bad_calls(), ids=[c[0] for c in _bad_calls()])
def test_refusal_writes_nothing(rng, name, build, msg):
    D = 32
    if name == "out_overlaps_state":
        buf = rng.standard_normal(4 * 3 * D + 10 * D).astype(np.float32)
        a = dict(x=rng.standard_normal((10, D)).astype(np.float32),
                 weight=rng.standard_normal((D, 4)).astype(np.float32), bias=None)
        kw = dict(conv_state=buf[:4 * 3 * D].reshape(4, 3, D), out=buf[4 * 2 * D:4 * 2 * D + 10 * D].reshape(10, D),
                  query_start_loc=[0, 4, 10], cache_indices=[0, 2])
    elif name == "out_overlaps_x":
        buf = rng.standard_normal(11 * D).astype(np.float32)
        a = dict(x=buf[:10 * D].reshape(10, D), weight=rng.standard_normal((D, 4)).astype(np.float32), bias=None)
        kw = dict(conv_state=rng.standard_normal((4, 3, D)).astype(np.float32), out=buf[D:].reshape(10, D),
                  query_start_loc=[0, 4, 10], cache_indices=[0, 2])
    else:
        a, kw = build(rng)
    snaps = {k: bits(v).copy() for k, v in (("x", a["x"]), ("conv_state", kw.get("conv_state")),
                                              ("out", kw.get("out"))) if v is not None}
    with pytest.raises((ValueError, TypeError), match=msg):
        gdnconv.conv_prefill(a["x"], a["weight"], a["bias"], **kw)
    for k, before in snaps.items():
        arr = {"x": a["x"], "conv_state": kw.get("conv_state"), "out": kw.get("out")}[k]
        assert np.array_equal(bits(arr), before), f"{k} changed by a refused call"


def test_out_is_x_in_place(isa, rng):
    call = make_prefill(rng, dtype="fp16", W=5, D=80, T=40, B=3, init="mix")
    run_and_check(call, "x")


# ------------------------------------------------------------- simulator

def _simulate(capsys, *extra):
    import argparse
    import json

    from gdnconv import simulate
    parser = simulate.add_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--preset", "tiny", "--steps", "30", "--json", "--no-progress", *extra])
    rc = simulate.run(args)
    return rc, json.loads(capsys.readouterr().out)


def test_simulate_prefill_phase(capsys):
    """Joining requests prefill a prompt (their stale slots unread); prompt and decode
    outputs pass the float64 check, and the torch replay's state matches bit for bit."""
    pytest.importorskip("torch")
    rc, r = _simulate(capsys, "--prompt-len", "40")
    assert rc == 0 and r["ok"], r["check"]
    assert r["prefill"]["calls"] > 0 and r["prefill"]["tokens"] > r["prefill"]["calls"]
    assert r["check"]["prefill"]["outputs"] == r["prefill"]["tokens"] * r["config"]["dim"]
    assert r["check"]["prefill"]["max_error_ratio"] <= 1.0 and r["check"]["torch_state_match"]


def test_simulate_catches_a_broken_prefill(capsys, monkeypatch):
    """A prefill that leaves one state value wrong fails the check (only the decode
    outputs after it can show it)."""
    real = gdnconv.conv_prefill

    def broken(x, weight, bias=None, **kw):
        out = real(x, weight, bias, **kw)
        kw["conv_state"][int(kw["cache_indices"][0]), 0, 0] += 1.0
        return out

    monkeypatch.setattr(gdnconv, "conv_prefill", broken)
    rc, r = _simulate(capsys, "--prompt-len", "10", "--no-torch")
    assert rc == 1 and not r["ok"]
