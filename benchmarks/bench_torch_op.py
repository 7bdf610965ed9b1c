"""Per-call cost of the torch.library op path against the plain gdnconv call, B = 1.

    PYTHONPATH=src python benchmarks/bench_torch_op.py [--dim 64 8192] [--repeats 31] [--threads 1]
        [--prompt-len 16]

Times, for each dim, ``gdnconv.conv_update_multi`` on torch tensors and
``gdnconv.torch.conv_update_multi`` (``torch.ops.gdnconv.conv_update_multi``), both with
a new output and with ``out=``, bf16, W=4, T=4, speculative mode, one request; and likewise
``gdnconv.conv_prefill`` against ``gdnconv.torch.conv_prefill`` for one varlen prompt of
``--prompt-len`` tokens into slot 0 of the state, from its initial state. Each repeat times
every variant once (interleaved, 200 calls each after 20 untimed); the medians over the
repeats and the op-minus-plain differences are printed.
"""
import argparse
import statistics
import time

import torch

import gdnconv
import gdnconv.torch as gt


def _time(fn, calls=200, warm=20):
    for _ in range(warm):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dim", type=int, nargs="+", default=[64, 8192])
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--threads", type=int, default=1, help="gdnconv and torch threads")
    ap.add_argument("--prompt-len", type=int, default=16, help="tokens of the prefill call")
    args = ap.parse_args()
    gdnconv.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    W, T = 4, 4
    for D in args.dim:
        g = torch.Generator().manual_seed(0)
        state = torch.randn(1, W - 2 + T, D, generator=g).bfloat16()
        w = torch.randn(D, W, generator=g).bfloat16()
        x = torch.randn(1, T, D, generator=g).bfloat16()
        out = torch.empty_like(x)
        nat = torch.ones(1, dtype=torch.int32)
        kw = dict(num_accepted_tokens=nat)
        prompt = torch.randn(args.prompt_len, D, generator=g).bfloat16()
        pout = torch.empty_like(prompt)
        pkw = dict(conv_state=state, query_start_loc=torch.tensor([0, args.prompt_len], dtype=torch.int32),
                   cache_indices=torch.zeros(1, dtype=torch.int32), has_initial_state=torch.ones(1, dtype=torch.bool))
        variants = {
            "plain": lambda: gdnconv.conv_update_multi(x, state, w, **kw),
            "op": lambda: gt.conv_update_multi(x, state, w, **kw),
            "plain out=": lambda: gdnconv.conv_update_multi(x, state, w, out=out, **kw),
            "op out=": lambda: gt.conv_update_multi(x, state, w, out=out, **kw),
            "prefill plain": lambda: gdnconv.conv_prefill(prompt, w, **pkw),
            "prefill op": lambda: gt.conv_prefill(prompt, w, **pkw),
            "prefill plain out=": lambda: gdnconv.conv_prefill(prompt, w, out=pout, **pkw),
            "prefill op out=": lambda: gt.conv_prefill(prompt, w, out=pout, **pkw),
        }
        samples = {k: [] for k in variants}
        for _ in range(args.repeats):
            for k, fn in variants.items():
                samples[k].append(_time(fn))
        med = {k: statistics.median(v) for k, v in samples.items()}
        print(f"D={D} B=1 update T={T}, prefill T={args.prompt_len}, bf16, {args.threads} thread(s), medians of "
              f"{args.repeats} interleaved repeats (us per call):")
        for k in variants:
            print(f"  {k:18s} {med[k]:7.2f}")
        for name, pre in (("update", ""), ("prefill", "prefill ")):
            print(f"  {name} op overhead: {med[pre + 'op'] - med[pre + 'plain']:.2f} us (new out), "
                  f"{med[pre + 'op out='] - med[pre + 'plain out=']:.2f} us (out=)")


if __name__ == "__main__":
    main()
