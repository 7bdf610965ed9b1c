"""``gdnconv generate``: a small random-weight transformers model decoding with and without gdnconv.

Builds a model from a config of the installed transformers (no download: random weights,
seeded), generates greedily with transformers' own conv update and again with
``gdnconv.transformers.patch()``, checks that the tokens agree, and prints decode tokens/s
for both and the share of a decode step spent in the conv update; a busy machine (other
processes using CPU time meanwhile) is flagged, as by ``gdnconv simulate``. Needs torch and
transformers 5.19-5.23: ``pip install ".[transformers]"`` from a gdnconv checkout.
"""
import time

from gdnconv.timing import BUSY_PCT, CpuMeter, busy_note, busy_warning

PRESETS = ("qwen3_next", "qwen3_5", "mamba2", "bamba", "lfm2")
MORE = ("falcon_h1", "granitemoehybrid", "jamba", "nemotron_h", "zamba2", "kimi_linear")   # tiny_config has them too
VOCAB = 128


def tiny_config(arch, *, hidden=64, layers=2, conv_kernel=4):
    """A small config of ``arch`` (one of PRESETS or MORE) from the installed transformers: linear /
    SSM layers first, then one attention layer where the architecture has them."""
    import transformers as tf
    common = dict(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, pad_token_id=0,
                  bos_token_id=None, eos_token_id=None, tie_word_embeddings=False)
    attn = dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=2 * hidden)
    mixed = ["linear_attention"] * (layers - 1) + ["full_attention"]
    if arch == "qwen3_next":
        return tf.Qwen3NextConfig(**common, **attn, head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2,
                                  linear_key_head_dim=16, linear_value_head_dim=16,
                                  linear_conv_kernel_dim=conv_kernel, layer_types=mixed, num_experts=4,
                                  num_experts_per_tok=2, moe_intermediate_size=hidden // 2,
                                  shared_expert_intermediate_size=hidden // 2, mlp_only_layers=[])
    if arch == "qwen3_5":
        return tf.Qwen3_5TextConfig(**common, **attn, head_dim=16, linear_num_value_heads=4,
                                    linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                                    linear_conv_kernel_dim=conv_kernel, layer_types=mixed)
    if arch == "mamba2":
        return tf.Mamba2Config(**common, num_heads=8, head_dim=2 * hidden // 8, state_size=16, n_groups=1,
                               conv_kernel=conv_kernel, expand=2, chunk_size=16)
    if arch == "bamba":
        return tf.BambaConfig(**common, **attn, attn_layer_indices=[layers - 1], mamba_n_heads=8,
                              mamba_d_head=2 * hidden // 8, mamba_d_state=16, mamba_d_conv=conv_kernel,
                              mamba_chunk_size=16)
    if arch == "lfm2":
        return tf.Lfm2Config(**common, **attn, conv_L_cache=conv_kernel, block_auto_adjust_ff_dim=False,
                             layer_types=["conv"] * (layers - 1) + ["full_attention"])
    ssm = dict(mamba_d_state=16, mamba_chunk_size=16)
    if arch == "falcon_h1":
        return tf.FalconH1Config(**common, **attn, **ssm, mamba_n_heads=8, mamba_d_head=16, mamba_d_ssm=2 * hidden,
                                 mamba_n_groups=1, mamba_d_conv=conv_kernel)
    if arch == "granitemoehybrid":
        return tf.GraniteMoeHybridConfig(**common, **attn, **ssm, layer_types=["mamba"] * (layers - 1) + ["attention"],
                                         mamba_n_heads=8, mamba_d_head=16, mamba_d_conv=conv_kernel,
                                         num_local_experts=2, num_experts_per_tok=1, shared_intermediate_size=hidden)
    if arch == "jamba":
        return tf.JambaConfig(**common, **attn, attn_layer_period=layers, attn_layer_offset=layers - 1,
                              expert_layer_period=2, expert_layer_offset=1, num_experts=2, num_experts_per_tok=1,
                              mamba_d_state=16, mamba_expand=2, mamba_dt_rank=8, mamba_d_conv=conv_kernel,
                              use_mamba_kernels=False)
    if arch == "nemotron_h":
        return tf.NemotronHConfig(**common, **attn, hybrid_override_pattern="M" * (layers - 1) + "*", mamba_num_heads=8,
                                  mamba_head_dim=16, ssm_state_size=16, n_groups=1, chunk_size=16, head_dim=16,
                                  conv_kernel=conv_kernel)
    if arch == "zamba2":
        return tf.Zamba2Config(**common, **attn, mamba_d_state=16, n_mamba_heads=8, mamba_headdim=16, chunk_size=16,
                               mamba_d_conv=conv_kernel, layers_block_type=["mamba"] * (layers - 1) + ["hybrid"],
                               attention_head_dim=16, use_mem_rope=False)
    if arch == "kimi_linear":
        return tf.KimiLinearConfig(**common, **dict(attn, num_key_value_heads=4), moe_intermediate_size=32,
                                   kv_lora_rank=16, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=8,
                                   num_experts_per_tok=1, num_local_experts=2, linear_head_dim=16, linear_num_heads=4,
                                   linear_conv_kernel_dim=conv_kernel, layer_types=mixed,
                                   mlp_layer_types=["dense"] * layers)
    raise ValueError(f"arch must be one of {', '.join(PRESETS + MORE)}, got {arch!r}")


def tiny_model(arch, seed=0, **config):
    """A seeded random-weight causal LM of ``tiny_config(arch, **config)``, in eval mode, fp32."""
    import torch
    import transformers as tf
    torch.manual_seed(seed)
    return tf.AutoModelForCausalLM.from_config(tiny_config(arch, **config)).eval()


def prompts(batch, length, seed=0, left_pad=True):
    """(input_ids, attention_mask): random tokens, request i left-padded by ``(3 * i) % length``
    positions (pad id 0) when left_pad."""
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for i in range(batch):
        pad = (3 * i) % length if left_pad else 0
        ids[i, :pad] = 0
        mask[i, :pad] = 0
    return ids, mask


def greedy(model, ids, mask, new_tokens):
    """transformers' greedy generate; returns its output (sequences, logits, past_key_values)."""
    import torch
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                              min_new_tokens=new_tokens, output_logits=True, return_dict_in_generate=True)


def conv_states(cache):
    """The conv state tensors of a transformers cache, layer by layer (layers without one skipped)."""
    found = []
    for layer in cache.layers:
        states = getattr(layer, "conv_states", None)
        if states:
            found.extend(s for s in (states.values() if isinstance(states, dict) else states) if s is not None)
    return found


def add_arguments(p):
    """Add ``gdnconv generate``'s options to an argparse parser (every help text gives the default)."""
    p.add_argument("--model", choices=PRESETS, default="qwen3_next",
                   help="architecture of the random model (default: %(default)s)")
    p.add_argument("--hidden", type=int, default=1024, help="hidden size (default: %(default)s)")
    p.add_argument("--layers", type=int, default=4,
                   help="layers, the last one attention where the model has it (default: %(default)s)")
    p.add_argument("--batch", type=int, default=1, help="requests decoded together (default: %(default)s)")
    p.add_argument("--prompt-len", type=int, default=16,
                   help="prompt tokens per request, request i left-padded by 3*i mod this (default: %(default)s)")
    p.add_argument("--new-tokens", type=int, default=64,
                   help="tokens generated per request, greedily (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompts (default: %(default)s)")


def _timed(model, ids, mask, new_tokens, conv_ops):
    """Greedy run; returns (output, decode seconds, seconds inside conv updates, % of a CPU
    other processes used meanwhile)."""
    spent = [0.0]

    def timed(fn):
        def inner(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t
        return inner

    originals = {m: m.causal_conv1d_update for m in conv_ops}
    for m in conv_ops:
        m.causal_conv1d_update = timed(m.causal_conv1d_update)
    meter = CpuMeter()
    try:
        m0 = meter.mark()
        t0 = time.perf_counter()
        greedy(model, ids, mask, 1)             # prefill and first token
        t1 = time.perf_counter()
        spent[0] = 0.0
        out = greedy(model, ids, mask, new_tokens)
        t2 = time.perf_counter()
        others = meter.others_pct(m0, meter.mark())
    finally:
        for m, f in originals.items():
            m.causal_conv1d_update = f
    decode = (t2 - t1) - (t1 - t0)              # the steps after the first token
    return out, decode, spent[0], others


def run(args):
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        print('gdnconv generate needs torch and transformers: pip install torch "transformers>=5.19,<5.24" '
              '(from a gdnconv checkout: pip install ".[transformers]")')
        return 2
    import importlib

    import gdnconv.transformers as gtf
    model = tiny_model(args.model, args.seed, hidden=args.hidden, layers=args.layers)
    ids, mask = prompts(args.batch, args.prompt_len, args.seed)
    mod = importlib.import_module(f"transformers.models.{args.model}.modeling_{args.model}")
    steps = args.new_tokens - 1
    print(f"gdnconv generate: random {args.model} (hidden {args.hidden}, {args.layers} layers), batch {args.batch}, "
          f"prompt {args.prompt_len}, {args.new_tokens} new tokens, greedy, float32, torch threads "
          f"{torch.get_num_threads()}")
    base, t_base, conv_base, busy_base = _timed(model, ids, mask, args.new_tokens, [mod])
    with gtf.patched([args.model]):
        gtf.reset_counters()
        fast, t_fast, conv_fast, busy_fast = _timed(model, ids, mask, args.new_tokens, [mod])
        count = gtf.counters()[args.model]["causal_conv1d_update"]
    same = torch.equal(base.sequences, fast.sequences)
    diff = (base.logits[-1] - fast.logits[-1]).abs().max().item()
    for name, t, c, busy in (("transformers", t_base, conv_base, busy_base), ("gdnconv", t_fast, conv_fast, busy_fast)):
        print(f"{name:13s}: {args.batch * steps / t:8.1f} decode tokens/s, conv update "
              f"{100 * c / t:5.1f}% of the decode time ({1e6 * c / max(1, steps) :.0f} us per step){busy_note(busy)}")
    print(f"conv calls routed through gdnconv: {count['routed']}, fallbacks: {count['fallback']}")
    print(f"tokens {'identical' if same else 'DIFFER'}; last logits max |diff| {diff:.2e}")
    busy = [p for p in (busy_base, busy_fast) if p > BUSY_PCT]
    if busy:
        print(busy_warning(max(busy)))
    return 0 if same and count["fallback"] == 0 else 1
