"""gdnconv.transformers: transformers' own models decode the same with and without patch()."""
import os
import re

import numpy as np
import pytest
from packaging.version import Version

from conftest import assert_bits_equal, run_python

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import gdnconv.transformers as gtf  # noqa: E402
from gdnconv.generate import MORE, PRESETS, conv_states, greedy, prompts, tiny_model  # noqa: E402

NEW_TOKENS = 32


@pytest.fixture(autouse=True)
def _clean_patch():
    gtf.unpatch()
    gtf.reset_counters()
    yield
    gtf.unpatch()


def test_architectures_are_every_modeling_file_with_a_conv_update():
    """ARCHITECTURES: every modeling module that defines causal_conv1d_update; each also defines
    the prefill conv causal_conv1d_fn, and patch() routes both."""
    root = os.path.join(os.path.dirname(transformers.__file__), "models")
    found, with_fn = set(), set()
    for arch in os.listdir(root):
        path = os.path.join(root, arch, f"modeling_{arch}.py")
        if not os.path.exists(path):
            continue
        source = open(path).read()
        if re.search(r"^def causal_conv1d_update\(", source, re.M):
            found.add(arch)
        if re.search(r"^def causal_conv1d_fn\(", source, re.M):
            with_fn.add(arch)
    assert found == set(gtf.ARCHITECTURES) == with_fn
    gtf.patch()
    for arch in gtf.ARCHITECTURES:
        mod = gtf._module(arch)
        for op in ("causal_conv1d_update", "causal_conv1d_fn"):
            assert getattr(mod, op).__doc__.startswith("gdnconv's route"), (arch, op)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("arch", PRESETS)
def test_greedy_decode_same_with_patch(arch, batch):
    """Greedy fp32 generation, left padding at B=4: identical tokens, last logits within 1e-5,
    conv caches equal (the first conv layer's bit for bit: its inputs do not depend on earlier
    conv outputs), every decode and prefill conv routed, no fallback."""
    model = tiny_model(arch, seed=1, layers=3)
    ids, mask = prompts(batch, 8, seed=2)
    base = greedy(model, ids, mask, NEW_TOKENS)
    with gtf.patched():
        fast = greedy(model, ids, mask, NEW_TOKENS)
    assert torch.equal(base.sequences, fast.sequences)
    diff = (base.logits[-1] - fast.logits[-1]).abs().max().item()
    assert diff <= 1e-5, f"last logits differ by {diff}"
    sb, sf = conv_states(base.past_key_values), conv_states(fast.past_key_values)
    assert len(sb) == len(sf) >= 2
    assert_bits_equal(sf[0], sb[0], "first conv layer's cache")
    for a, b in zip(sf, sb):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    count = gtf.counters()[arch]
    assert count["causal_conv1d_update"] == {"routed": (NEW_TOKENS - 1) * len(sb), "fallback": 0}
    assert count["causal_conv1d_fn"] == {"routed": len(sb), "fallback": 0}      # one prefill per conv layer


@pytest.mark.parametrize("arch", MORE)
def test_more_architectures_decode_same_with_patch(arch):
    """FalconH1, GraniteMoeHybrid, Jamba, NemotronH, Zamba2, Kimi-Linear: B=2 with left padding,
    8 tokens, same checks on tokens, logits, the first conv cache and the counters."""
    model = tiny_model(arch, seed=1)
    ids, mask = prompts(2, 6, seed=2)
    base = greedy(model, ids, mask, 8)
    with gtf.patched([arch]):
        fast = greedy(model, ids, mask, 8)
    assert torch.equal(base.sequences, fast.sequences)
    assert (base.logits[-1] - fast.logits[-1]).abs().max().item() <= 1e-5
    sb, sf = conv_states(base.past_key_values), conv_states(fast.past_key_values)
    layers = len(sb)
    assert layers >= 1
    assert_bits_equal(sf[0], sb[0], "first conv layer's cache")
    assert gtf.counters()[arch]["causal_conv1d_update"] == {"routed": 7 * layers, "fallback": 0}
    assert gtf.counters()[arch]["causal_conv1d_fn"] == {"routed": layers, "fallback": 0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("extra_cols", [0, 1, 3])    # conv_state columns: W - 1 + extra_cols
@pytest.mark.parametrize("T", [1, 2, 6])
@pytest.mark.parametrize("bias,activation", [(True, "silu"), (False, None)])
def test_route_equals_transformers_function(dtype, extra_cols, T, bias, activation):
    """Same inputs through transformers' function and the routed one: the state bit for bit
    (all W columns, history last, column 0 included), outputs within SPEC's tolerance."""
    from transformers.models.qwen3_next import modeling_qwen3_next as mq
    original = mq.causal_conv1d_update
    g = torch.Generator().manual_seed(T * 10 + extra_cols)
    B, D, W = 3, 40, 4
    x = torch.randn(B, T, D, generator=g).to(dtype).transpose(1, 2)     # (B, D, T) as the models pass it
    state = torch.randn(B, D, W - 1 + extra_cols, generator=g).to(dtype)
    w = torch.randn(D, W, generator=g).to(dtype)
    b = torch.randn(D, generator=g).to(dtype) if bias else None
    s1, s2 = state.clone(), state.clone()
    ref = original(x, s1, w, b, activation)
    gtf.patch(["qwen3_next"])
    out = mq.causal_conv1d_update(x, s2, w, b, activation)
    assert gtf.counters()["qwen3_next"]["causal_conv1d_update"] == {"routed": 1, "fallback": 0}
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert_bits_equal(s2, s1, "conv_state")
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7
    np.testing.assert_allclose(out.float().numpy(), ref.float().numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("T", [1, 5, 11])
@pytest.mark.parametrize("bias,activation", [(True, "silu"), (False, None), (True, "swish")])
def test_prefill_route_equals_transformers_function(dtype, W, T, bias, activation):
    """transformers' causal_conv1d_fn (its torch body: F.conv1d from zero history) and the routed
    one on the same (B, D, T) input: same shape and dtype, outputs within SPEC's tolerance;
    keyword arguments the original ignores are ignored too."""
    from transformers.models.mamba2 import modeling_mamba2 as mm
    original = mm.causal_conv1d_fn
    g = torch.Generator().manual_seed(T * 10 + W)
    B, D = 3, 40
    x = torch.randn(B, T, D, generator=g).to(dtype).transpose(1, 2)     # (B, D, T) as the models pass it
    w = torch.randn(D, W, generator=g).to(dtype)
    b = torch.randn(D, generator=g).to(dtype) if bias else None
    x0 = x.clone()
    ref = original(x, w, b, activation=activation)
    gtf.patch(["mamba2"])
    out = mm.causal_conv1d_fn(x, w, b, activation=activation, position_ids=None)
    assert gtf.counters()["mamba2"]["causal_conv1d_fn"] == {"routed": 1, "fallback": 0}
    assert out.shape == ref.shape and out.dtype == ref.dtype and torch.equal(x, x0)
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7
    np.testing.assert_allclose(out.float().numpy(), ref.float().numpy(), rtol=tol, atol=tol)


def test_prefill_fallbacks_are_counted_and_match():
    """What gdnconv cannot take goes to the original: an activation it lacks, a float64 weight,
    autograd; packed sequences (seq_idx), which the original refuses the same way (transformers
    >= 5.20; 5.19's ignores seq_idx, and so the routed one gives its result)."""
    from transformers.models.qwen3_next import modeling_qwen3_next as mq
    original = mq.causal_conv1d_fn
    gtf.patch(["qwen3_next"])
    x, w = torch.randn(2, 8, 5), torch.randn(8, 4)
    cases = [dict(activation="gelu"), dict(weight=w.double()), dict(grad=True)]
    for case in cases:
        ww = case.get("weight", w).clone().requires_grad_(case.get("grad", False))
        act = case.get("activation", "silu")
        with torch.enable_grad():
            assert torch.equal(original(x, ww, None, act), mq.causal_conv1d_fn(x, ww, None, act))
    seq_idx = torch.zeros(1, 5, dtype=torch.int32)
    if Version(transformers.__version__) >= Version("5.20"):
        for fn in (original, mq.causal_conv1d_fn):
            with pytest.raises(ValueError, match="packed sequences"):
                fn(x, w, None, "silu", seq_idx=seq_idx)
    else:
        assert torch.equal(original(x, w, None, "silu", seq_idx=seq_idx),
                           mq.causal_conv1d_fn(x, w, None, "silu", seq_idx=seq_idx))
    assert gtf.counters()["qwen3_next"]["causal_conv1d_fn"] == {"routed": 0, "fallback": len(cases) + 1}


def test_fallbacks_are_counted_and_match():
    from transformers.models.mamba2 import modeling_mamba2 as mm
    original = mm.causal_conv1d_update
    gtf.patch(["mamba2"])
    x, state, w = torch.randn(2, 8, 1), torch.randn(2, 8, 4), torch.randn(8, 4)
    cases = [dict(activation="gelu"), dict(weight=w.double()), dict(grad=True)]
    for case in cases:
        s1, s2 = state.clone(), state.clone()
        ww = case.get("weight", w).clone().requires_grad_(case.get("grad", False))
        act = case.get("activation", "silu")
        with torch.enable_grad():
            r1 = original(x, s1, ww, None, act)
            r2 = mm.causal_conv1d_update(x, s2, ww, None, act)
        assert torch.equal(r1, r2) and torch.equal(s1, s2)
    assert gtf.counters()["mamba2"]["causal_conv1d_update"] == {"routed": 0, "fallback": len(cases)}


def test_patch_unpatch_and_context_restore_the_originals():
    from transformers.models.lfm2 import modeling_lfm2 as ml
    from transformers.models.bamba import modeling_bamba as mb
    original_l, original_b = ml.causal_conv1d_update, mb.causal_conv1d_update
    original_fn = ml.causal_conv1d_fn
    gtf.patch(["lfm2"])
    assert ml.causal_conv1d_fn.__wrapped__ is original_fn
    routed = ml.causal_conv1d_update
    assert routed is not original_l and routed.__wrapped__ is original_l and gtf.is_patched("lfm2")
    gtf.patch(["lfm2"])
    assert ml.causal_conv1d_update is routed                  # idempotent
    with gtf.patched():
        assert mb.causal_conv1d_update is not original_b and ml.causal_conv1d_update is routed
    assert mb.causal_conv1d_update is original_b and ml.causal_conv1d_update is routed
    gtf.unpatch()
    assert ml.causal_conv1d_update is original_l and ml.causal_conv1d_fn is original_fn and not gtf.is_patched()
    with pytest.raises(ValueError, match="'llama'"):
        gtf.patch(["llama"])
    assert not gtf.is_patched()


@pytest.mark.parametrize("version", ["5.18.2", "5.24.0"])
def test_version_outside_the_supported_range_is_refused(monkeypatch, version):
    monkeypatch.setattr(transformers, "__version__", version)
    with pytest.raises(RuntimeError, match=rf"supports transformers >=5\.19\.0,<5\.24, found {version}: "
                                           r'pip install "transformers>=5\.19\.0,<5\.24".*"\.\[transformers\]"'):
        gtf.patch()
    assert not gtf.is_patched()


def test_an_architecture_the_installed_transformers_lacks_is_named(monkeypatch):
    """An architecture newer than the installed transformers (as lfm3 and inkling2 are for 5.19-5.22):
    patch() names it and the release that added it, and patches nothing."""
    monkeypatch.setattr(gtf, "ARCHITECTURES", tuple(a for a in gtf.ARCHITECTURES if a != "lfm3"))
    with pytest.raises(ValueError, match=r"lacks lfm3 \(added in transformers 5\.23\)"):
        gtf.patch(["qwen3_next", "lfm3"])
    assert not gtf.is_patched()


def test_import_without_transformers_names_the_extra():
    r = run_python("import sys; sys.modules['transformers'] = None\n"
                   "try:\n    import gdnconv.transformers\nexcept ImportError as e:\n    print(e)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("gdnconv.transformers needs torch and transformers") and \
        'pip install ".[transformers]"' in r.stdout, r.stdout


def test_import_gdnconv_imports_neither_torch_nor_transformers():
    r = run_python("import sys, gdnconv; print('torch' in sys.modules, 'transformers' in sys.modules)")
    assert r.returncode == 0 and r.stdout.split() == ["False", "False"], r.stderr
