"""What a call through gdnconv.vllm (and the vLLM plugin's drop-ins) costs over the core call.

    python benchmarks/bench_adapter.py [--dim 512] [--batch 8] [--repeats 15]

Warm on purpose: the same small arrays every call (D=512 by default: a tensor-parallel shard or
a small model, where a call's fixed cost matters most), one thread, so what differs between
the rows is the Python and torch work around the kernel. Per row: the core call
(``gdnconv.conv_update_multi`` / ``conv_prefill`` on gdnconv-order views made once), the
same call through ``gdnconv.vllm`` in vLLM's order, and through the plugin's drop-in for vLLM's
C++ op (``_causal_conv1d_update_cpu`` / ``_causal_conv1d_fwd_cpu``: it allocates the output as
that op does). Samples interleave the peers; medians and the adapter's extra microseconds.
Thread CPU time is measured (time.thread_time_ns), so another process on the core inflates
the figures less than wall time would.
"""
import argparse
import statistics
import time

import torch

import gdnconv
import gdnconv.vllm as gv
import gdnconv.vllm_plugin as vp


def per_call_us(fn, n):
    fn()
    t0 = time.thread_time_ns()
    for _ in range(n):
        fn()
    return (time.thread_time_ns() - t0) / n / 1e3


def cases(D, B):
    g = torch.Generator().manual_seed(0)
    W = 4
    w = torch.randn(D, W, generator=g).bfloat16()
    b = torch.randn(D, generator=g).bfloat16()
    packed = gv.pack_weight_like_vllm(w) if D % 32 == 0 else None
    idx = torch.arange(B, dtype=torch.int32)
    out = {}
    # plain decode, T=1: x (B, D); vLLM's state view (S, D, L) over SD storage
    st = torch.zeros(B + 2, W - 1, D).bfloat16()
    stv = st.transpose(1, 2)
    x = torch.randn(B, D, generator=g).bfloat16()
    o = torch.empty_like(x)
    out["plain T=1"] = dict(
        core=lambda: gdnconv.conv_update_multi(x, st, w, b, activation="silu", conv_state_indices=idx, out=o),
        vllm=lambda: gv.causal_conv1d_update(x, stv, w, b, "silu", idx, out=o),
        drop_in=(lambda: vp._update_op(x=x, conv_states=stv, weight=packed, bias=b, silu_activation=True,
                                       conv_state_indices=idx, is_weight_packed=True)) if packed is not None else None)
    # speculative, T=4: vLLM's (B, D, T) view of (B, T, D) memory
    T = 4
    sts = torch.zeros(B + 2, W - 2 + T, D).bfloat16()
    stsv = sts.transpose(1, 2)
    xs = torch.randn(B, T, D, generator=g).bfloat16()
    xsv = xs.transpose(1, 2)
    os_ = torch.empty_like(xs)
    osv = os_.transpose(1, 2)
    nat = torch.ones(B, dtype=torch.int32)
    out["spec T=4"] = dict(
        core=lambda: gdnconv.conv_update_multi(xs, sts, w, b, activation="silu", num_accepted_tokens=nat,
                                               conv_state_indices=idx, out=os_),
        vllm=lambda: gv.causal_conv1d_update(xsv, stsv, w, b, "silu", idx, nat, out=osv),
        drop_in=(lambda: vp._update_op(x=xs, conv_states=stsv, weight=packed, bias=b, silu_activation=True,
                                       conv_state_indices=idx, is_weight_packed=True,
                                       num_accepted_tokens=nat)) if packed is not None else None)
    # prefill: B prompts of 4 tokens, x (D, N) as vLLM passes it
    N = 4 * B
    xp = torch.randn(N, D, generator=g).bfloat16()
    xpt = xp.T                 # vLLM's (D, N) view, which vLLM makes itself before the call
    qsl = torch.arange(0, N + 1, 4, dtype=torch.int32)
    init = torch.ones(B, dtype=torch.bool)
    out["prefill 4 tok"] = dict(
        core=lambda: gdnconv.conv_prefill(xp, w, b, activation="silu", conv_state=st, query_start_loc=qsl,
                                          cache_indices=idx, has_initial_state=init),
        vllm=lambda: gv.causal_conv1d_fn(xpt, w, b, stv, qsl, idx, init, "silu"),
        drop_in=(lambda: vp._prefill_op(x=xpt, weight=packed, bias=b, conv_states=stv, query_start_loc=qsl,
                                        cache_indices=idx, has_initial_state=init, silu_activation=True,
                                        is_weight_packed=True)) if packed is not None else None)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=15, help="interleaved samples per peer (default: %(default)s)")
    ap.add_argument("--calls", type=int, default=2000, help="calls per sample (default: %(default)s)")
    args = ap.parse_args(argv)
    gdnconv.set_num_threads(1)
    print(f"gdnconv {gdnconv.__version__}, isa {gdnconv.active_isa()}, bf16, D={args.dim}, B={args.batch}, "
          f"1 thread, warm, thread CPU time; medians of {args.repeats} interleaved samples of {args.calls} calls")
    print(f"{'case':14s} {'core us':>8s} {'gdnconv.vllm us':>16s} {'extra us':>9s} {'drop-in us':>11s} {'extra us':>9s}")
    worst = 0.0
    for name, peers in cases(args.dim, args.batch).items():
        live = {k: f for k, f in peers.items() if f is not None}
        samples = {k: [] for k in live}
        for _ in range(args.repeats):
            for k, f in live.items():
                samples[k].append(per_call_us(f, args.calls))
        med = {k: statistics.median(v) for k, v in samples.items()}
        extra = med["vllm"] - med["core"]
        worst = max(worst, extra)
        drop = (f"{med['drop_in']:11.2f} {med['drop_in'] - med['core']:9.2f}" if "drop_in" in med else
                f"{'-':>11s} {'-':>9s}")
        print(f"{name:14s} {med['core']:8.2f} {med['vllm']:16.2f} {extra:9.2f} {drop}")
    print(f"worst extra cost of gdnconv.vllm over the core call: {worst:.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
