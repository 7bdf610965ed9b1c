"""gdnconv.vllm's usual decode call through its op's call, direct and through torch.ops, against its Cython path, in one process.

    python benchmarks/bench_op.py [--dims 2048 8192] [--batch 1 4] [--rounds 7] [--regimes inference]
                                  [--weight plain|subclass]

The op's call (src/csrc/torch_op.c) is made without torch's dispatcher where this torch allows
it (``direct``: gdnconv.vllm's default, ``_core._direct_new`` / ``_direct_into``), or through
``torch.ops._gdnconv`` (``torch op``, on torch's stable C ABI); the core's Cython intake takes
the same call when neither is on (``cython``). This times the three, alternated round by
round, for the routes that try the op: ``gdnconv.vllm.causal_conv1d_update`` with a given
out (vLLM's order, vLLM's packed bf16 weight) and the plugin's drop-in for
``gdn_attention._causal_conv1d_update_cpu`` (a new out, tokens last), plain and speculative
decode (T = 4), and with T = 4 the plugin's speculative conv (``_spec_forward``'s: a varlen call
on vLLM's step metadata, with a (B, T) block table of slots, on a layer of modules as vLLM's,
``layer.conv1d`` a submodule, its bias a registered None), in three regimes: grad mode,
``torch.no_grad()`` and ``torch.inference_mode()``
(vLLM's steps). The state is made outside inference mode (as vLLM's cache); the step's tensors
(x, indices, a given out) inside it in the inference regime, as vLLM's are. ``--weight
subclass``: the weight an nn.Parameter subclass with a Python ``__torch_function__``, as
vLLM's ModelWeightParameter (its conv1d's weight in vLLM 0.32, registered; ``harness.vllm_weight``).
Warm (repeated calls on the same arrays), one thread, bf16, W = 4, SiLU; medians of the
rounds, us per call.
"""
import argparse
import contextlib
import statistics
import types

import torch

import gdnconv
import gdnconv.vllm as gv
import gdnconv.vllm_plugin as vp
from harness import sample_ns, vllm_layer, vllm_weight

REGIMES = {"grad": contextlib.nullcontext, "no_grad": torch.no_grad, "inference": torch.inference_mode}


def calls(B, D, T, regime, weight):
    """{route: fn} of one case."""
    L = 3 if T == 1 else 6
    st = torch.randn(64, L, D, dtype=torch.bfloat16).transpose(1, 2)
    w = gv.pack_weight_like_vllm(torch.randn(D, 4, dtype=torch.bfloat16))
    if weight == "subclass":
        w = vllm_weight(w)
    with REGIMES[regime]():
        x = torch.randn(B, D, dtype=torch.bfloat16) if T == 1 else torch.randn(B, T, D, dtype=torch.bfloat16)
        idx = torch.randperm(64)[:B].to(torch.int32)
        na = torch.randint(1, 4, (B,), dtype=torch.int32) if T > 1 else None
        xv = x if T == 1 else x.transpose(1, 2)      # vLLM's (B, D, T)
        out = torch.empty_like(xv)
    fns = {
        "vllm.py, out given": lambda: gv.causal_conv1d_update(xv, st, w, None, "silu", idx, na, out=out,
                                                              is_weight_packed=True),
        "plugin, new out": lambda: vp._update_op(x=x, conv_states=st, weight=w, bias=None, silu_activation=True,
                                                 conv_state_indices=idx, is_weight_packed=True,
                                                 num_accepted_tokens=na),
    }
    if T > 1:   # the plugin's speculative conv (_spec_forward's, varlen) on vLLM's step metadata
        with REGIMES[regime]():
            meta = types.SimpleNamespace(
                num_spec_decodes=B, spec_query_start_loc=torch.arange(0, B * T + 1, T, dtype=torch.int32),
                spec_state_indices_tensor=torch.stack([idx] * T, 1), num_accepted_tokens=na)
            tokens = x.reshape(B * T, D)
        layer = vllm_layer(w, None, True)   # (as vLLM holds it: modules, the bias a registered None)
        fns["plugin, spec varlen"] = lambda: vp._spec_conv(layer, meta, tokens, st)
    return fns


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--regimes", nargs="+", choices=list(REGIMES), default=list(REGIMES))
    ap.add_argument("--weight", choices=["plain", "subclass"], default="plain")
    args = ap.parse_args(argv)
    if gv._dispatched_ops[0] is None:
        raise SystemExit("no torch op here (not Linux, a torch without the stable ABI's functions, "
                         "or GDNCONV_TORCH_OP=0)")
    torch.set_num_threads(1)
    gdnconv.set_num_threads(1)
    entries = {"direct": gv._direct_ops, "torch op": gv._dispatched_ops, "cython": (None, None)}
    if gv._direct_ops[0] is None:
        print("no direct call with this torch: its column shows the torch op")
        entries["direct"] = gv._dispatched_ops
    default = gv._op_new, gv._op_into
    print(f"gdnconv {gdnconv.__version__}, isa {gdnconv.active_isa()}, torch {torch.__version__}; bf16, W=4, "
          f"SiLU, {args.weight} weight, warm, 1 thread; medians of {args.rounds} alternated rounds of "
          f"{args.calls} calls, us")
    print(f"{'regime':>9} {'D':>5} {'B':>2} {'T':>2}  {'route':20} {'direct':>7} {'op':>7} {'cython':>7} "
          f"{'dir/op':>6} {'dir/cy':>6}")
    for regime in args.regimes:
        for D in args.dims:
            for B in args.batch:
                for T in (1, 4):
                    fns = calls(B, D, T, regime, args.weight)
                    times = {}
                    with REGIMES[regime]():
                        for _ in range(args.rounds):
                            for entry, ops in entries.items():
                                gv._op_new, gv._op_into = ops
                                for name, fn in fns.items():
                                    times.setdefault((name, entry), []).append(sample_ns(fn, args.calls) / 1e3)
                    gv._op_new, gv._op_into = default
                    for name in fns:
                        d, o, c = (statistics.median(times[(name, e)]) for e in entries)
                        print(f"{regime:>9} {D:5d} {B:2d} {T:2d}  {name:20} {d:7.2f} {o:7.2f} {c:7.2f} "
                              f"{d / o:6.2f} {d / c:6.2f}")


if __name__ == "__main__":
    main()
