"""gdnconv.vllm's usual decode call as one torch op (src/csrc/torch_op.c, registered on torch's
stable C ABI): the op's results are the Cython path's bit for bit (and the float64
reference's), in every route that tries it (gdnconv.vllm's given out and out=None, the plugin's
new outs); whatever it refuses goes to the full path, which gives that call's result or its
error, with nothing written."""
import re
import types
import zlib

import numpy as np
import pytest

from conftest import as_np, assert_bits_equal, reference
from gdnconv.testing import assert_outputs_close

torch = pytest.importorskip("torch")
import gdnconv  # noqa: E402
import gdnconv.vllm as gv  # noqa: E402
import gdnconv.vllm_plugin as vp  # noqa: E402
from test_vllm import _Counting, _WeightParameter  # noqa: E402

TD = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
pytestmark = pytest.mark.skipif(gv._op_new is None, reason="torch's stable C ABI ops are not registered here "
                                "(not Linux, or a torch without the shim's functions)")


def bits_t(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


@pytest.fixture(autouse=True, params=["direct", "dispatched"])
def entry(request, monkeypatch):
    """Each test through both entries of the op's call: without torch's dispatcher (the routes'
    default where this torch's tensor objects allow it) and through torch.ops."""
    ops = gv._direct_ops if request.param == "direct" else gv._dispatched_ops
    if ops[0] is None:
        pytest.skip("no direct calls with this torch (its tensor objects are laid out otherwise)")
    monkeypatch.setattr(gv, "_op_new", ops[0])
    monkeypatch.setattr(gv, "_op_into", ops[1])
    return request.param


@pytest.fixture(autouse=True)
def _no_grad():
    """Grad mode off, as in vLLM's steps (torch.inference_mode()): in grad mode a given out goes
    to the Cython path (test_grad_mode_takes_new_outs_only)."""
    with torch.no_grad():
        yield


@pytest.fixture
def op_calls():
    """A list that gets, for each call of the op from now on (direct or through torch.ops),
    whether it was taken."""
    calls = []
    previous = gdnconv._core._log_op_calls(calls)
    yield calls
    gdnconv._core._log_op_calls(previous)


def _case(seed, dtype, state, B=3, D=64, W=4, spec=False, T=1):
    """vLLM-order tensors of one decode step: conv_state (S, D, L) (a transposed view of (S, L, D)
    memory for "SD"), x (B, D) or (B, D, T), weight (D, W), bias (D,), slots with a pad, and
    num_accepted_tokens in spec mode."""
    g = torch.Generator().manual_seed(seed)
    dt = TD[dtype]
    L = W - 1 + (T - 1 if spec else 0)
    S = 6
    st = (torch.randn(S, L, D, generator=g).to(dt).transpose(1, 2) if state == "SD"
          else torch.randn(S, D, L, generator=g).to(dt))
    w = (torch.randn(D, W, generator=g) / 2).to(dt)
    b = (torch.randn(D, generator=g) / 2).to(dt)
    tokens = torch.randn(B, T, D, generator=g).to(dt)          # (B, T, D) memory
    x = tokens[:, 0] if T == 1 else tokens.transpose(1, 2)      # vLLM's (B, D) / (B, D, T)
    slots = torch.tensor([4, -1, 0][:B], dtype=torch.int32)
    nat = torch.tensor([1, 2, T - 1 if T > 1 else 1][:B], dtype=torch.int32) if spec else None
    return st, x, w, b, slots, nat


ROUTES = ["given_out", "into_x", "plugin_new", "plugin_skipped_from_x"]


def _call(route, st, x, w, b, slots, nat, packed=False, activation="silu", pad=-1):
    """One call through the route; returns its result."""
    if route == "given_out":
        return gv.causal_conv1d_update(x, st, w, b, activation, slots, nat, out=torch.full_like(x, 7.0),
                                       pad_slot_id=pad, is_weight_packed=packed)
    if route == "into_x":
        return gv.causal_conv1d_update(x, st, w, b, activation, slots, nat, pad_slot_id=pad,
                                       is_weight_packed=packed)
    if route == "plugin_new":   # gdn_attention._causal_conv1d_update_cpu's drop-in: x (B, T, D)
        xt = x if x.dim() == 2 else x.transpose(1, 2)
        return vp._update_op(x=xt, conv_states=st, weight=w, bias=b, silu_activation=activation is not None,
                             conv_state_indices=slots, is_weight_packed=packed, num_accepted_tokens=nat)
    return vp._update_cpu(x, st, w, b, activation, slots, pad_slot_id=pad, num_accepted_tokens=nat,
                          is_weight_packed=packed)


def _both(monkeypatch, route, make, **kw):
    """(op result, op state, Cython result, Cython state): the same call on fresh copies through
    the op and with the op off."""
    res = []
    for use_op in (True, False):
        st, x, w, b, slots, nat = make()
        if not use_op:
            monkeypatch.setattr(gv, "_op_new", None)
        out = _call(route, st, x, w, b, slots, nat, **kw)
        res += [out.clone(), st.clone()]
    return res


@pytest.mark.parametrize("dtype, weights", [(d, w) for d in ("fp32", "fp16", "bf16")
                                            for w in ("raw", "float32", "packed", "no_bias")
                                            if w != "packed" or d == "bf16"])   # (vLLM packs bf16 weights only)
@pytest.mark.parametrize("state", ["SD", "DS"])
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("mode", ["plain", "spec"])
def test_the_op_gives_the_cython_paths_bits(dtype, weights, state, route, mode, monkeypatch, op_calls):
    """Every route's usual call is taken by the op (one call), and its result and state are the
    Cython path's bit for bit; the live rows match the float64 reference."""
    spec = mode == "spec"
    seed = zlib.crc32(repr((dtype, state, route, mode, weights)).encode())

    def make():
        st, x, w, b, slots, nat = _case(seed, dtype, state, D=64, spec=spec, T=4 if spec else 1)
        if weights == "float32":
            w, b = w.float(), b.float()
        elif weights == "packed":
            w = gv.pack_weight_like_vllm(w)
        elif weights == "no_bias":
            b = None
        return st, x, w, b, slots, nat

    out, state_after, ref_out, ref_state = _both(monkeypatch, route, make, packed=weights == "packed")
    assert op_calls == [True]
    assert torch.equal(bits_t(out), bits_t(ref_out)) and torch.equal(bits_t(state_after), bits_t(ref_state))
    st, x, w, b, slots, nat = make()
    w = gv.unpack_weight(w) if weights == "packed" else w
    xt = x if x.dim() == 2 else x.transpose(1, 2)        # gdnconv's (B, T, D)
    r_out, r_state, mag = reference(xt, st.transpose(1, 2), w, b, activation="silu", conv_state_indices=slots,
                                    num_accepted_tokens=nat)
    live = (slots != -1).numpy()
    got = out if out.dim() == 2 or route == "plugin_new" else out.transpose(1, 2)
    assert_outputs_close(got, r_out, mag, silu=True, rows=live)
    assert_bits_equal(state_after.transpose(1, 2), r_state, "conv_state")
    if route == "plugin_skipped_from_x":
        assert torch.equal(bits_t(got[~torch.from_numpy(live)]), bits_t(xt[~torch.from_numpy(live)]))
    elif route == "plugin_new":
        assert not got[~torch.from_numpy(live)].any()


def test_the_op_follows_the_thread_setting(monkeypatch, op_calls):
    """The op's calls take gdnconv's thread setting (set_num_threads), as the core's own do."""
    st, x, w, b, slots, nat = _case(1, "bf16", "SD", B=3, D=8192 * 4)
    try:
        for n in (1, 2):
            gdnconv.set_num_threads(n)
            gv.causal_conv1d_update(x.clone(), st, w, b, "silu", slots)
            assert gdnconv.thread_contention()["last_call_threads"] == min(n, gdnconv.get_num_threads())
    finally:
        gdnconv.set_num_threads(None)
    assert op_calls == [True, True]


def _shrunk_state():
    st, x, w, b, slots, nat = _case(2, "fp32", "DS")
    big = torch.zeros(st.numel() + 64)
    view = big[64:].view(st.shape)
    view.copy_(st)
    big.untyped_storage().resize_(64 * 4 + 16)   # the view now lies past its storage's end
    return view


REFUSED = {
    # case: (what to change, the error the full path gives, or None: the full path's result)
    "state_outside_storage": (lambda a: a.update(st=_shrunk_state()), "conv_state lies outside its storage"),
    "out_overlaps_state": (lambda a: a.update(out=a["st"][:3, :, 0]), "overlaps"),
    "out_overlaps_itself": (lambda a: a.update(out=torch.empty(1, 64).expand(3, 64)), "out overlaps itself"),
    "slot_out_of_range": (lambda a: a["slots"].__setitem__(0, 6), r"conv_state_indices\[0\] = 6 is out of range"),
    "slot_twice": (lambda a: a["slots"].__setitem__(2, 4), r"repeats the slot"),
    "state_requires_grad": (lambda a: a.update(st=a["st"].detach().clone().requires_grad_()), "requires grad"),
    "state_negated": (lambda a: a.update(st=torch._neg_view(a["st"])), "pending negation"),
    "inference_state": (lambda a: a.update(st=_inference(a["st"])), "inference tensor"),
    "meta_x": (lambda a: a.update(x=a["x"].to("meta")), None),
    "pad_slot_outside_int32": (lambda a: a.update(pad=2 ** 40), "outside the int32 range"),
    "x_channels_strided": (lambda a: a.update(x=torch.stack([a["x"], a["x"]], 2).reshape(3, 128)[:, ::2]), None),
    "int64_slots": (lambda a: a.update(slots=a["slots"].long()), None),
    # tensors of other layouts and kinds, which the dispatcher refuses and the direct call reads
    # no memory of
    "sparse_x": (lambda a: a.update(x=a["x"].to_sparse()), None),
    "mkldnn_x": (lambda a: a.update(x=a["x"].to_mkldnn()), None),
    "quantized_x": (lambda a: a.update(x=torch.quantize_per_tensor(a["x"], 0.1, 0, torch.qint8)), None),
    "nested_x": (lambda a: a.update(x=torch.nested.nested_tensor([a["x"][0], a["x"][1, :32]])), None),
    "sparse_weight": (lambda a: a.update(w=a["w"].to_sparse()), None),
    "activation_other": (lambda a: a.update(activation="relu"), "activation must be None, 'silu'"),
}


def _inference(t):
    with torch.inference_mode():
        return t.clone()


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_the_op_refuses_goes_to_the_full_path(case, monkeypatch, op_calls):
    """Each call the op does not take (refused in C, by its caller's pre-checks, or by the
    dispatcher) gives what the full path gives: that call's error with nothing written, or its
    result, bit for bit."""
    change, error = REFUSED[case]

    def run():
        st, x, w, b, slots, nat = _case(3, "fp32", "DS")
        a = dict(st=st, x=x, w=w, b=b, slots=slots, out=torch.full((3, 64), 7.0), pad=-1, activation="silu")
        change(a)
        before = {k: v.detach().clone() for k, v in a.items()
                  if isinstance(v, torch.Tensor) and v.layout == torch.strided and not (v.is_meta or v.is_nested
                                                                                       or v.is_quantized)
                  and k != "st" or k == "st" and case != "state_outside_storage"}
        try:
            res = gv.causal_conv1d_update(a["x"], a["st"], a["w"], a["b"], a["activation"], a["slots"],
                                          out=a["out"], pad_slot_id=a["pad"])
        except (TypeError, ValueError, NotImplementedError, RuntimeError) as e:
            for k, v in before.items():
                assert torch.equal(bits_t(a[k].detach().resolve_neg()), bits_t(v.resolve_neg())), f"{k} was written"
            return e
        return res.detach().clone(), a["st"].detach().clone()

    _as_the_full_path(run, error, monkeypatch, op_calls)


def _as_the_full_path(run, error, monkeypatch, op_calls):
    """A call the op does not take (``run()``: its (result, state), or the exception it raised
    with nothing written) gives ``error`` (a ValueError matching it), or else, with the op off,
    the full path's exception or its bits."""
    got = run()
    assert True not in op_calls
    if error is not None:
        assert isinstance(got, ValueError) and re.search(error, str(got)), got
        return
    monkeypatch.setattr(gv, "_op_new", None)
    ref = run()
    if isinstance(ref, Exception):
        assert type(got) is type(ref) and str(got) == str(ref)
    else:
        assert torch.equal(bits_t(got[0]), bits_t(ref[0])) and torch.equal(bits_t(got[1]), bits_t(ref[1]))


@pytest.mark.parametrize("arg", ["x", "weight", "bias"])
def test_an_input_with_a_negation_bit_is_read_as_its_values(arg, entry, monkeypatch, op_calls):
    """An input with a pending negation bit (torch._neg_view): through torch.ops the dispatcher
    resolves it before the op runs, so the op computes on its values: the bits of the call on
    .resolve_neg(). Without the dispatcher the call refuses it (its raw memory holds the negated
    values), and the core's own intake asks for resolve_neg(), nothing written."""
    st, x, w, b, slots, nat = _case(5, "bf16", "SD")
    args = {"x": x, "weight": w, "bias": b}
    args[arg] = torch._neg_view(-args[arg])
    st2 = st.clone()
    if entry == "direct":
        out = torch.full_like(x, 7.0)
        with pytest.raises(ValueError, match=f"^{arg} has a pending negation bit; call .resolve_neg"):
            gv.causal_conv1d_update(args["x"], st, args["weight"], args["bias"], "silu", slots, out=out)
        assert op_calls == [False] and torch.equal(bits_t(st), bits_t(st2))
        assert torch.equal(bits_t(out), bits_t(torch.full_like(x, 7.0)))
        return
    neg = args[arg]
    out = gv.causal_conv1d_update(args["x"], st, args["weight"], args["bias"], "silu", slots,
                                  out=torch.zeros_like(x))
    assert op_calls == [True]
    args[arg] = neg.resolve_neg()
    monkeypatch.setattr(gv, "_op_new", None)
    ref = gv.causal_conv1d_update(args["x"], st2, args["weight"], args["bias"], "silu", slots,
                                  out=torch.zeros_like(x))
    assert torch.equal(bits_t(out), bits_t(ref)) and torch.equal(bits_t(st), bits_t(st2))


@pytest.mark.parametrize("arg", ["conv_state_indices", "num_accepted_tokens"])
@pytest.mark.parametrize("route", ROUTES)
def test_index_arrays_with_a_negation_bit_are_read_as_their_values(arg, route, entry, monkeypatch, op_calls):
    """conv_state_indices or num_accepted_tokens with a pending negation bit: every entry gives the
    Cython path's bits (which reads their values): the dispatcher resolves the bit for the torch
    op; the direct call refuses the array (its memory holds the values negated: slots [1, -1, 0]
    read raw are [-1, 1, 0], valid slots, so a raw read would compute other requests), and the
    Cython path takes the call."""
    def make():
        st, x, w, b, slots, nat = _case(12, "bf16", "SD", spec=True, T=3)
        if arg == "conv_state_indices":
            slots = torch._neg_view(-torch.tensor([1, -1, 0], dtype=torch.int32))
        else:
            nat = torch._neg_view(-nat)
        return st, x, w, b, slots, nat

    out, st, ref_out, ref_st = _both(monkeypatch, route, make)
    assert op_calls == [entry == "dispatched"]
    assert torch.equal(bits_t(out), bits_t(ref_out)) and torch.equal(bits_t(st), bits_t(ref_st))


def test_a_large_new_out_goes_to_the_cython_path(monkeypatch, op_calls):
    """New outs of GDN_REUSE_MIN_BYTES (4 MiB) and more are made by the Cython path, which
    reuses their memory (the op refuses them): the same bits either way."""
    def make():
        return _case(4, "fp32", "SD", B=3, D=1 << 19)

    out, st, ref_out, ref_st = _both(monkeypatch, "plugin_new", make)
    assert op_calls == [False]
    assert torch.equal(bits_t(out), bits_t(ref_out)) and torch.equal(bits_t(st), bits_t(ref_st))


def test_gdnconv_torch_op_0_turns_the_op_off():
    """GDNCONV_TORCH_OP=0: no op (gdnconv.vllm keeps its Cython path)."""
    from conftest import run_python
    r = run_python("import gdnconv.vllm as gv; print(gv._op_new is None, gv._op_into is None)",
                   GDNCONV_TORCH_OP="0")
    assert r.stdout.split() == ["True", "True"], r


@pytest.mark.parametrize("route", ["adapter", "plugin"])
def test_subclasses_never_reach_the_op(route, op_calls):
    """vLLM's packed weight, a Parameter subclass with a Python __torch_function__, reaches the op
    as a plain tensor on its memory (gdnconv.vllm._plain), none of its torch functions run, with
    the plain weight's bits; an x of a tensor subclass is not given to the op (the dispatcher
    would run its __torch_function__), and the full path computes it."""
    st0, x, w, b, slots, nat = _case(7, "bf16", "SD", D=64)
    param = _WeightParameter(gv.pack_weight_like_vllm(w), requires_grad=False)
    st_ref = st0.clone()
    ref = gv.causal_conv1d_update(x.clone(), st_ref, w, b, "silu", slots)
    op_calls.clear()
    _WeightParameter.seen = 0
    st = st0.clone()
    if route == "adapter":
        out = gv.causal_conv1d_update(x.clone(), st, param, b, "silu", slots, is_weight_packed=True)
    else:
        out = vp._update_op(x=x, conv_states=st, weight=param, bias=b, silu_activation=True,
                            conv_state_indices=slots, is_weight_packed=True)
        ref[1] = 0           # (the drop-in's new out: a skipped request's row is zeros)
    assert op_calls == [True] and _WeightParameter.seen == 0
    assert torch.equal(bits_t(out), bits_t(ref)) and torch.equal(bits_t(st), bits_t(st_ref))
    op_calls.clear()
    _Counting.seen = 0
    st = st0.clone()
    sub = gv.causal_conv1d_update(x.clone().as_subclass(_Counting), st, w, b, "silu", slots)
    assert op_calls == [] and _Counting.seen > 0
    if route == "adapter":
        assert torch.equal(bits_t(sub.as_subclass(torch.Tensor)), bits_t(ref))
        assert torch.equal(bits_t(st), bits_t(st_ref))


def test_grad_mode_takes_new_outs_only(monkeypatch, op_calls):
    """In grad mode the op takes the plugin's new-out call of plain tensors; a given out, or an
    input that requires grad (an nn.Parameter weight), goes to the Cython path: the same bits,
    and no autograd history on the result."""
    with torch.enable_grad():
        st, x, w, b, slots, nat = _case(8, "bf16", "SD", D=64)
        ref_st = st.clone()
        ref = _call("plugin_new", ref_st, x, w, b, slots, nat)
        assert op_calls == [True] and not ref.requires_grad
        op_calls.clear()
        for route, weight in (("given_out", w), ("plugin_new", torch.nn.Parameter(w.clone()))):
            s2 = st.clone()
            out = _call(route, s2, x, weight, b, slots, nat)
            assert op_calls == [] and not out.requires_grad, route
            if route == "given_out":
                out[1] = 0
            assert torch.equal(bits_t(out), bits_t(ref)) and torch.equal(bits_t(s2), bits_t(ref_st)), route


@pytest.mark.parametrize("route", ROUTES)
def test_a_weight_subclass_runs_none_of_its_functions_in_grad_mode(route, monkeypatch, op_calls):
    """A Parameter subclass weight and bias (vLLM's ModelWeightParameter) in grad mode: the op's
    call takes it (a new out) or leaves it to the Cython path (a given out), with none of its
    Python functions run (the requires_grad reads too), and the plain tensors' bits."""
    with torch.enable_grad():
        def make():
            st, x, w, b, slots, nat = _case(13, "bf16", "SD", D=64)
            return st, x, _WeightParameter(w, requires_grad=False), _WeightParameter(b, requires_grad=False), slots, nat

        _WeightParameter.seen = 0
        st, x, w, b, slots, nat = make()
        out = _call(route, st, x, w, b, slots, nat)
        assert _WeightParameter.seen == 0 and not out.requires_grad
        assert op_calls == ([True] if route.startswith("plugin") else [])
        monkeypatch.setattr(gv, "_op_new", None)
        st2, x2, w2, b2, slots2, nat2 = make()
        ref = _call(route, st2, x2, w2.detach(), b2.detach(), slots2, nat2)
    assert torch.equal(bits_t(out), bits_t(ref)) and torch.equal(bits_t(st), bits_t(st2))


@pytest.mark.parametrize("shrink", ["one_element", "to_zero"])
@pytest.mark.parametrize("route", ["update_cpu", "update_torch", "prefill"])
def test_copies_of_x_check_its_storage_first(shrink, route):
    """The plugin's fallbacks and the prefill copy x with torch (``x.to(conv_state.dtype)``),
    which reads past a shrunk storage: an x outside its storage is a ValueError naming it
    first (it returned numbers read from freed memory, or crashed), nothing written."""
    st, x0, w, b, slots, nat = _case(9, "fp32", "SD", D=64)
    big = torch.randn(64 + 3 * 64).half()                   # fp16 x, fp32 state: the path that copies
    x = big[64:].view(3, 64)
    x = x[:, :, None] if route == "update_torch" else x.t() if route == "prefill" else x   # (views made first)
    big.untyped_storage().resize_(0 if shrink == "to_zero" else (64 + 3 * 64 - 1) * 2)
    before = st.clone()
    with pytest.raises(ValueError, match="^x lies outside its storage"):
        if route == "update_cpu":
            vp._update_cpu(x, st, w, b, "silu", slots, pad_slot_id=-1)
        elif route == "update_torch":
            vp._update_torch(x, st[:3], w, b, "silu")
        else:
            gv.causal_conv1d_fn(x, w, b, st, torch.tensor([0, 1, 3], dtype=torch.int32),
                                torch.tensor([1, 2], dtype=torch.int32), torch.tensor([False, True]))
    assert torch.equal(bits_t(st), bits_t(before))


def test_a_functorch_wrapped_x_is_a_type_error():
    """A tensor without storage (torch.func.vmap's wrappers) is a TypeError naming it, which
    the plugin's routing hands to vLLM's own function (it was a RuntimeError from data_ptr())."""
    import torch.func
    st, x, w, b, slots, nat = _case(10, "fp32", "SD", D=64)
    before = st.clone()
    with pytest.raises(TypeError, match="^x is a tensor whose memory cannot be read"):
        torch.func.vmap(lambda xx: vp._update_op(x=xx, conv_states=st, weight=w, bias=b, silu_activation=True,
                                                 conv_state_indices=slots, is_weight_packed=False))(x[None])
    assert torch.equal(bits_t(st), bits_t(before))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("columns", [1, 2])
def test_a_block_table_of_slots_reads_column_0(route, columns, monkeypatch, op_calls):
    """conv_state_indices as a (B, k) table (Mamba2's decode in vLLM passes (B, 1)): column 0 is
    each request's slot, as gdnconv.vllm reads it. The op takes a (B, 1) table in place and
    gathers a wider one's column (vLLM's speculative block table): the same bits as the full path."""
    def make():
        st, x, w, b, slots, nat = _case(11, "bf16", "SD", D=64)
        table = torch.stack([slots] + [slots.flip(0)] * (columns - 1), 1)
        return st, x, w, b, table, nat

    out, st, ref_out, ref_st = _both(monkeypatch, route, make)
    assert op_calls == [True]
    assert torch.equal(bits_t(out), bits_t(ref_out)) and torch.equal(bits_t(st), bits_t(ref_st))
    st0, x, w, b, slots, nat = _case(11, "bf16", "SD", D=64)
    st1 = st0.clone()
    one = _call(route, st1, x.clone(), w, b, slots, nat)
    assert torch.equal(bits_t(out), bits_t(one)) and torch.equal(bits_t(st), bits_t(st1))


def _varlen_case(seed, dtype, state, spec, lens=(3, 0, 1, 4, 2), slots=(4, 2, -1, 0, 6), D=64, W=4):
    """A varlen step as vLLM's speculative conv calls it: x (N, D) of the requests' tokens in turn,
    query_start_loc (B + 1,), a (B, 3) block table of slots (column 0 each request's), a pad and
    an empty request, num_accepted_tokens in spec mode; conv_state (S, D, L) as in _case."""
    g = torch.Generator().manual_seed(seed)
    dt = TD[dtype]
    L = W - 1 + (max(lens) - 1 if spec else 0)
    S = 8
    st = (torch.randn(S, L, D, generator=g).to(dt).transpose(1, 2) if state == "SD"
          else torch.randn(S, D, L, generator=g).to(dt))
    w = (torch.randn(D, W, generator=g) / 2).to(dt)
    b = (torch.randn(D, generator=g) / 2).to(dt)
    x = torch.randn(sum(lens), D, generator=g).to(dt)
    qsl = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
    col = torch.tensor(slots, dtype=torch.int32)
    table = torch.stack([col, col.flip(0), col], 1)
    nat = torch.tensor([max(1, min(n, 2)) for n in lens], dtype=torch.int32) if spec else None
    return st, x, w, b, table, nat, qsl


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("state", ["SD", "DS"])
@pytest.mark.parametrize("mode", ["plain", "spec"])
def test_a_varlen_call_is_one_op_call(dtype, state, mode, monkeypatch, op_calls):
    """gdnconv.vllm's varlen call (query_start_loc; the plugin's speculative conv), with a block
    table of slots, a pad and an empty request: one op call, the Cython path's bits, and the
    float64 reference's values; the pad's and the empty request's rows untouched."""
    spec = mode == "spec"

    def run(use_op):
        st, x, w, b, table, nat, qsl = _varlen_case(21, dtype, state, spec)
        if not use_op:
            monkeypatch.setattr(gv, "_op_new", None)
        out = torch.full_like(x, 7.0)
        res = gv.causal_conv1d_update(x, st, w, b, "silu", table, nat, qsl, out=out)
        assert res is out
        return out, st

    out, st = run(True)
    assert op_calls == [True]
    ref_out, ref_st = run(False)
    assert torch.equal(bits_t(out), bits_t(ref_out)) and torch.equal(bits_t(st), bits_t(ref_st))
    st0, x, w, b, table, nat, qsl = _varlen_case(21, dtype, state, spec)
    r_out, r_state, mag = reference(x, st0.transpose(1, 2), w, b, activation="silu", conv_state_indices=table[:, 0],
                                    num_accepted_tokens=nat, query_start_loc=qsl)
    live = np.repeat(table[:, 0].numpy() != -1, np.diff(qsl.numpy()))
    assert_outputs_close(out, r_out, mag, silu=True, rows=live)
    assert_bits_equal(st.transpose(1, 2), r_state, "conv_state")
    assert (out[~torch.from_numpy(live)] == 7.0).all()


VARLEN_REFUSED = {
    # case: (what to change, the full path's error, or None: its result)
    "tokens_past_the_last_start": (lambda a: a.update(x=torch.cat([a["x"], a["x"][:1]])),
                                   r"query_start_loc\[5\] = 10 must equal the number of tokens x.shape\[0\] = 11"),
    "decreasing_starts": (lambda a: a["qsl"].__setitem__(2, 2), r"query_start_loc must be non-decreasing"),
    "no_slots": (lambda a: a.update(table=None), r"conv_state_indices is required with query_start_loc"),
    "int64_starts": (lambda a: a.update(qsl=a["qsl"].long()), None),
    "max_query_len_given": (lambda a: a.update(max_query_len=4), None),
    "max_query_len_too_small": (lambda a: a.update(max_query_len=3), r"max_query_len = 3 is smaller"),
    "starts_in_out": (lambda a: _starts_in_out(a),
                      r"query_start_loc overlaps out: the call reads query_start_loc while it writes out"),
}


def _starts_in_out(a):
    """query_start_loc's entries held in out's first row (out is written: refused)."""
    a["out"] = torch.full_like(a["x"], 7.0)
    qsl = a["out"].view(torch.int32).view(-1)[:6]
    qsl.copy_(a["qsl"])
    a["qsl"] = qsl


@pytest.mark.parametrize("case", sorted(VARLEN_REFUSED))
def test_a_varlen_call_the_op_refuses_goes_to_the_full_path(case, monkeypatch, op_calls):
    """A varlen call the op does not take gives the full path's result bit for bit, or its error
    naming the argument with nothing written."""
    change, error = VARLEN_REFUSED[case]

    def run():
        st, x, w, b, table, nat, qsl = _varlen_case(22, "fp32", "SD", True)
        a = dict(st=st, x=x, w=w, b=b, table=table, nat=nat, qsl=qsl, max_query_len=-1)
        change(a)
        a.setdefault("out", torch.full_like(a["x"], 7.0))
        before = {k: v.clone() for k, v in a.items() if isinstance(v, torch.Tensor)}
        try:
            res = gv.causal_conv1d_update(a["x"], a["st"], a["w"], a["b"], "silu", a["table"], a["nat"], a["qsl"],
                                          a["max_query_len"], out=a["out"])
        except (TypeError, ValueError) as e:
            for k, v in before.items():
                assert torch.equal(bits_t(a[k]), bits_t(v)), f"{k} was written"
            return e
        return res.clone(), a["st"].clone()

    _as_the_full_path(run, error, monkeypatch, op_calls)


def test_varlen_starts_with_a_negation_bit_are_read_as_their_values(entry, monkeypatch, op_calls):
    """query_start_loc with a pending negation bit: the Cython path's bits through every entry
    (the dispatcher resolves it for the torch op; the direct call refuses it)."""
    def run(use_op):
        st, x, w, b, table, nat, qsl = _varlen_case(23, "bf16", "SD", True)
        if not use_op:
            monkeypatch.setattr(gv, "_op_new", None)
        out = torch.full_like(x, 7.0)
        gv.causal_conv1d_update(x, st, w, b, "silu", table, nat, torch._neg_view(-qsl), out=out)
        return out, st

    out, st = run(True)
    assert op_calls == [entry == "dispatched"]
    ref_out, ref_st = run(False)
    assert torch.equal(bits_t(out), bits_t(ref_out)) and torch.equal(bits_t(st), bits_t(ref_st))


def _vllm_like_layer(weight, bias, unpacked):
    """A GDN layer as vLLM holds it: a module whose conv1d submodule has its weight registered as
    a Parameter subclass (vLLM's ModelWeightParameter), its bias registered (None or a Parameter)
    and the stash of its plain weight as an instance attribute."""
    conv1d = torch.nn.Module()
    conv1d.register_parameter("weight", _WeightParameter(weight, requires_grad=False))
    conv1d.register_parameter("bias", None if bias is None else torch.nn.Parameter(bias, requires_grad=False))
    conv1d._cpu_unpacked_conv_weight = unpacked
    layer = torch.nn.Module()
    layer.conv1d = conv1d
    layer.activation = "silu"
    return layer


@pytest.mark.parametrize("holder", ["namespace", "module"])
@pytest.mark.parametrize("metadata", ["as_vllm", "longer_int64"])
@pytest.mark.parametrize("weights", ["packed", "plain", "fp16"])
@pytest.mark.parametrize("tier", ["op", "core"])
def test_the_plugins_speculative_conv(tier, metadata, weights, holder, monkeypatch, op_calls):
    """The plugin's speculative conv (_spec_conv, for its _spec_forward) on vLLM's step metadata,
    into a new out: one op call; where the op does not take it (off here, or an out of 4 MiB or
    more) one core call; where that refuses too (an fp16 weight for a bf16 state), the full path,
    which widens it. Every tier gives the reference's values, its state bit for bit and zeros in
    padded and empty requests' rows; metadata with more rows than the step, or int64, is cut and
    converted (vLLM's tensors, int32 and of the step's rows, are passed as they come). The layer
    a namespace, or modules as vLLM's (whose registered members _member reads)."""
    import sys
    st, x, w, b, table, nat, qsl = _varlen_case(24, "bf16", "SD", True, D=64)
    st0 = st.clone()
    if tier == "core":
        monkeypatch.setattr(gv, "_op_new", None)
    full_calls = []
    monkeypatch.setattr(gv, "causal_conv1d_update", lambda *a, _f=gv.causal_conv1d_update, **k: full_calls.append(1)
                        or _f(*a, **k))
    B = qsl.shape[0] - 1
    meta_qsl, meta_table, meta_nat = qsl, table, nat
    if metadata == "longer_int64":
        meta_qsl = torch.cat([qsl, qsl[-1:] + 3]).long()
        meta_table = torch.cat([table, table[:2]]).long()
        meta_nat = torch.cat([nat, nat[:2]]).long()
    meta = types.SimpleNamespace(num_spec_decodes=B, spec_query_start_loc=meta_qsl,
                                 spec_state_indices_tensor=meta_table, num_accepted_tokens=meta_nat)
    plain_w = w.half() if weights == "fp16" else w
    held = (gv.pack_weight_like_vllm(w) if weights == "packed" else plain_w, b, True if weights == "packed" else None)
    if holder == "module":
        layer = _vllm_like_layer(*held)
    else:
        conv1d = types.SimpleNamespace(weight=held[0], bias=held[1], _cpu_unpacked_conv_weight=held[2])
        layer = types.SimpleNamespace(conv1d=conv1d, activation="silu")
    # vLLM's plain (D, W) view of its weight, which the plugin asks its module for
    monkeypatch.setitem(sys.modules, vp._GDN, types.SimpleNamespace(_unpacked_conv_weight=lambda layer: plain_w))
    out, idx, num_acc, starts = vp._spec_conv(layer, meta, x, st)
    assert torch.equal(idx, table) and torch.equal(num_acc, nat) and torch.equal(starts, qsl)
    assert idx.dtype == num_acc.dtype == starts.dtype == torch.int32
    assert op_calls == ([] if tier == "core" else [False, False] if weights == "fp16" else [True])
    assert len(full_calls) == (weights == "fp16")
    r_out, r_state, mag = reference(x, st0.transpose(1, 2), w, b, activation="silu", conv_state_indices=table[:, 0],
                                    num_accepted_tokens=nat, query_start_loc=qsl)
    live = np.repeat(table[:, 0].numpy() != -1, np.diff(qsl.numpy()))
    assert_outputs_close(out, r_out, mag, silu=True, rows=live)
    assert_bits_equal(st.transpose(1, 2), r_state, "conv_state")
    assert not out[~torch.from_numpy(live)].any()


def test_member_reads_what_getattr_reads():
    """_member(m, name) is getattr(m, name): registered parameters, buffers (also None) and
    submodules from the module's dicts, each read anew (a parameter registered again is the new
    one); an instance attribute, a class attribute or property of that name, a class with its own
    __getattr__, a name not there (AttributeError, as getattr's), a module without its parameter
    dict (TypeError, as getattr's), a class that cannot be hashed and an object that is no module
    through getattr; the record of classes stays bounded under torch's parametrizations (a class
    per module)."""
    class Shadowed(torch.nn.Module):
        @property
        def weight(self):
            return "the property"

    class OwnGetattr(torch.nn.Module):
        def __getattr__(self, name):
            return "own" if name == "weight" else super().__getattr__(name)

    m = torch.nn.Module()
    m.register_parameter("weight", torch.nn.Parameter(torch.ones(2)))
    m.register_parameter("bias", None)
    m.register_buffer("running", torch.zeros(3))
    m.register_buffer("empty", None)
    m.child = torch.nn.Linear(2, 2)
    m.plain = torch.ones(1)          # not registered: an instance attribute
    shadowed, own = Shadowed(), OwnGetattr()
    shadowed.register_parameter("bias", torch.nn.Parameter(torch.ones(1)))
    for module in (shadowed, own):   # registered under the name the class answers for (past its checks)
        module._parameters["weight"] = torch.nn.Parameter(torch.ones(2))
    cases = [(m, n) for n in ("weight", "bias", "running", "empty", "child", "plain", "training", "call_super_init")]
    cases += [(shadowed, "weight"), (shadowed, "bias"), (own, "weight"), (types.SimpleNamespace(weight=5), "weight")]
    for module, name in cases:
        for _ in range(2):   # (the second read from _member's record of the class)
            assert vp._member(module, name) is getattr(module, name), (type(module).__name__, name)
    m.register_parameter("weight", torch.nn.Parameter(torch.zeros(2)))
    assert vp._member(m, "weight") is m.weight and not m.weight.any()
    for module in (m, types.SimpleNamespace()):
        with pytest.raises(AttributeError):
            vp._member(module, "missing")
    broken = torch.nn.Module()         # no parameter dict: __getattr__ fails on it, and so does _member
    broken.register_buffer("running", torch.ones(1))
    broken.__dict__["_parameters"] = None
    for read in (getattr, vp._member):
        with pytest.raises(TypeError):
            read(broken, "running")

    class Unhashable(type(torch.nn.Module)):
        __hash__ = None

    class Odd(torch.nn.Module, metaclass=Unhashable):
        pass

    odd = Odd()
    odd.register_parameter("weight", torch.nn.Parameter(torch.ones(1)))
    assert vp._member(odd, "weight") is odd.weight
    # a class per module (torch's parametrizations): the record of classes stays bounded
    from torch.nn.utils import parametrize

    class Same(torch.nn.Module):
        def forward(self, w):
            return w

    for _ in range(vp._VIA_GETATTR_MAX + 10):
        lin = torch.nn.Linear(2, 2)
        parametrize.register_parametrization(lin, "weight", Same())
        assert torch.equal(vp._member(lin, "weight"), lin.weight) and vp._member(lin, "bias") is lin.bias
    assert len(vp._via_getattr) <= vp._VIA_GETATTR_MAX


def test_the_plugins_speculative_conv_of_a_large_out_is_one_core_call(monkeypatch, op_calls):
    """An out of 4 MiB or more the op leaves to the core, which makes it from memory it reuses:
    one core call (not the full path), the reference's values and state, and zeros in the rows
    of the padded request's tokens."""
    st, x, w, b, table, nat, qsl = _varlen_case(25, "bf16", "SD", True, D=1 << 16, lens=(16, 4, 8, 4),
                                                 slots=(3, -1, 0, 5))
    st0 = st.clone()
    full_calls = []
    monkeypatch.setattr(gv, "causal_conv1d_update", lambda *a, _f=gv.causal_conv1d_update, **k: full_calls.append(1)
                        or _f(*a, **k))
    meta = types.SimpleNamespace(num_spec_decodes=4, spec_query_start_loc=qsl, spec_state_indices_tensor=table,
                                 num_accepted_tokens=nat)
    layer = types.SimpleNamespace(conv1d=types.SimpleNamespace(weight=gv.pack_weight_like_vllm(w), bias=b,
                                                               _cpu_unpacked_conv_weight=True), activation="silu")
    out = vp._spec_conv(layer, meta, x, st)[0]
    assert x.nbytes >= 4 << 20 and op_calls == [False] and full_calls == []
    r_out, r_state, mag = reference(x, st0.transpose(1, 2), w, b, activation="silu", conv_state_indices=table[:, 0],
                                    num_accepted_tokens=nat, query_start_loc=qsl)
    live = np.repeat(table[:, 0].numpy() != -1, np.diff(qsl.numpy()))
    assert not live.all()
    assert_outputs_close(out, r_out, mag, silu=True, rows=live)
    assert_bits_equal(st.transpose(1, 2), r_state, "conv_state")
    assert not out[~torch.from_numpy(live)].any()


@pytest.mark.parametrize("written", ["conv_state", "out"])
def test_layouts_by_the_one_overlap_rule_are_taken_alike(written, monkeypatch, op_calls):
    """A written tensor whose strides do not nest but which gives every element its own memory
    (conv_state (S, L, D) memory with strides (58, 21, 1); out (B, D) with strides (31, 2)): the op
    and the Cython path both compute it (layout.h's one rule), with the same bits."""
    def make():
        st, x, w, b, slots, nat = _case(31, "fp32", "SD", D=16)
        if written == "conv_state":
            buf = torch.full((st.shape[0] * 58 + 8,), 5.0)
            view = buf.as_strided((st.shape[0], 3, 16), (58, 21, 1))
            view.copy_(st.transpose(1, 2))
            st = view.transpose(1, 2)
        return st, x, w, b, slots, nat

    res = []
    for use_op in (True, False):
        st, x, w, b, slots, nat = make()
        if not use_op:
            monkeypatch.setattr(gv, "_op_new", None)
        out = torch.full((3 * 31 + 8,), 7.0).as_strided((3, 16), (31, 2)) if written == "out" else torch.zeros_like(x)
        gv.causal_conv1d_update(x, st, w, b, "silu", slots, out=out)
        res += [out.clone(), st.clone()]
    assert op_calls == [True]
    assert torch.equal(bits_t(res[0]), bits_t(res[2])) and torch.equal(bits_t(res[1]), bits_t(res[3]))
