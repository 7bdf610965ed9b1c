"""One run of vLLM's offline engine on CPU over a small random checkpoint, for test_vllm_engine.py.

    python tests/vllm_engine.py MODEL_KIND CHECKPOINT_DIR [--spec K] [--tp N] [--tokens N]

Writes one JSON line: the greedy token ids per prompt, gdnconv's counters per worker process,
tokens/s, and the conv's share of the decode step (its calls timed inside the workers). Run with
GDNCONV_VLLM=0 for vLLM's stock conv, GDNCONV_VLLM_SHADOW=1 for the shadow comparison.

The checkpoints are real: transformers' random init (std 0.02) saved with ``save_pretrained``,
so the tokens vary from step to step (``load_format="dummy"`` makes every request repeat one
token and proves nothing). Qwen3-Next gets random MTP weights (``mtp.*``, the full-attention
layer's copy) so that vLLM's ``qwen3_next_mtp`` speculative method loads them.
"""
import argparse
import json
import os
import sys
import time

KINDS = ("qwen3_next", "mamba2")
LOGPROBS = 4         # top logprobs kept per position, to tell a near tie from a real difference


def make_checkpoint(kind, path):
    """A tiny random model of ``kind`` saved at ``path`` (bf16 safetensors + config)."""
    import torch
    from safetensors.torch import load_file, save_file
    torch.manual_seed(0)
    if kind == "qwen3_next":
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
        cfg = Qwen3NextConfig(
            vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=2,
            num_key_value_heads=2, head_dim=64, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=64, shared_expert_intermediate_size=64, max_position_embeddings=1024,
            layer_types=["linear_attention"] * 3 + ["full_attention"], bos_token_id=None, eos_token_id=None,
            tie_word_embeddings=False)
        cfg.num_nextn_predict_layers = 1
        model = Qwen3NextForCausalLM(cfg)
    else:
        from transformers import Mamba2Config, Mamba2ForCausalLM
        cfg = Mamba2Config(vocab_size=512, hidden_size=128, state_size=16, num_hidden_layers=2, num_heads=8,
                           head_dim=32, n_groups=1, expand=2, conv_kernel=4, chunk_size=64,
                           bos_token_id=None, eos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
        model = Mamba2ForCausalLM(cfg)
    model.to(torch.bfloat16).save_pretrained(path)
    if kind == "qwen3_next":      # MTP weights for vLLM's qwen3_next_mtp draft
        file = os.path.join(path, "model.safetensors")
        sd = load_file(file)
        g = torch.Generator().manual_seed(1)
        full = f"model.layers.{cfg.num_hidden_layers - 1}."
        for k in [k for k in sd if k.startswith(full)]:
            sd["mtp.layers.0." + k[len(full):]] = sd[k].clone()
        sd["mtp.fc.weight"] = (torch.randn(cfg.hidden_size, 2 * cfg.hidden_size, generator=g) * 0.02).bfloat16()
        for n in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
            sd[f"mtp.{n}.weight"] = sd["model.norm.weight"].clone()
        save_file(sd, file, metadata={"format": "pt"})


def _time_conv_sites():
    """Wrap each conv site of gdnconv.vllm_plugin.ROUTES (gdnconv's or vLLM's own, whichever is
    in place) with a timer, in this process; returns the list its seconds accumulate in."""
    import gdnconv.vllm_plugin as vp
    spent = [0.0]
    for route in vp.ROUTES:
        module = sys.modules.get(route.module)
        fn = getattr(module, route.attribute, None)
        if fn is None:
            continue

        def timed(*a, _fn=fn, **k):
            t = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t
        vp._replace(fn, timed)
    return spent


def _count_ops():
    """With the engine in this process (tp=1): how many calls gdnconv's op call (gdnconv.vllm's
    _op_new / _op_into: direct, or through torch.ops) took and refused from now on
    (_core._log_op_calls), or None where this process has no op."""
    import gdnconv.vllm as gv
    if gv._op_new is None:
        return None
    counts = {"taken": 0, "refused": 0, "direct": gv._op_new is gv._direct_ops[0]}

    class Tally:
        def append(self, taken):
            counts["taken" if taken else "refused"] += 1

    gv._core._log_op_calls(Tally())
    return counts


def _worker_counters(worker):
    """Runs in each worker process (LLM.collective_rpc): gdnconv's counters and conv time there."""
    try:
        import gdnconv.vllm as gv
    except ImportError:
        return {}
    return gv.counters()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("checkpoint")
    ap.add_argument("--spec", type=int, default=0, help="MTP draft tokens (0: no speculative decoding)")
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size")
    ap.add_argument("--tokens", type=int, default=24, help="new tokens per prompt")
    ap.add_argument("--prompts", type=int, default=4)
    args = ap.parse_args(argv)
    if not os.path.exists(os.path.join(args.checkpoint, "config.json")):
        make_checkpoint(args.kind, args.checkpoint)
    if args.tp == 1:       # the engine in this process: its conv calls can be counted and timed here
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    else:                  # one NUMA node: vLLM asks for each worker's CPUs ("0|1" on two cores)
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")   # collective_rpc of this file's functions
        cpus = sorted(os.sched_getaffinity(0))
        step = max(1, len(cpus) // args.tp)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(
            ",".join(str(c) for c in cpus[i * step:(i + 1) * step]) for i in range(args.tp)))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    kw = dict(model=args.checkpoint, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256,
              kv_cache_memory_bytes=64 << 20,
              max_num_seqs=8, enforce_eager=True, tensor_parallel_size=args.tp, seed=0,
              enable_prefix_caching=False)
    if args.spec:
        kw["speculative_config"] = {"method": "qwen3_next_mtp", "num_speculative_tokens": args.spec}
    if args.tp > 1:
        kw["distributed_executor_backend"] = "mp"
    llm = LLM(**kw)
    prompts = [TokensPrompt(prompt_token_ids=[(7 * i + 3 * j) % 500 + 1 for j in range(5 + 3 * i)])
               for i in range(args.prompts)]
    sp = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True, detokenize=False,
                        logprobs=LOGPROBS)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=2, detokenize=False))   # warm-up
    rpc = getattr(llm, "collective_rpc", None)
    import gdnconv.vllm as gv
    if rpc is not None:
        rpc(lambda worker: gv.reset_counters())
    gv.reset_counters()
    spent = _time_conv_sites() if args.tp == 1 else [None]      # the model runs in this process
    ops = _count_ops() if args.tp == 1 and os.environ.get("GDNCONV_VLLM") != "0" else None
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp)
    seconds = time.perf_counter() - t0
    counters = rpc(_worker_counters) if rpc is not None else []
    local = gv.counters()
    logprobs = [[{str(t): lp.logprob for t, lp in pos.items()} for pos in o.outputs[0].logprobs] for o in outs]
    print(json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in outs], "logprobs": logprobs,
                      "tokens_per_s": args.prompts * args.tokens / seconds,
                      "conv_share": None if spent[0] is None else spent[0] / seconds,
                      "workers": counters, "local": local, "op": ops}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
