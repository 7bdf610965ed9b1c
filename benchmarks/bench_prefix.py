#!/usr/bin/env python
"""Prefix caching's cost in gdnconv.conv_prefill: the same prefill with and without vLLM's
block-table work (each request's history read from another slot, ``initial_state_indices``, and
the state stored at every multiple of the block size it crosses, ``snapshots``), against a copy
of the extra bytes that work moves, side by side in one process.

Per shape (B, T, block size k) at D=8192, W=4, bf16, every request with an initial state and
``num_computed_tokens`` = k / 2 (so the boundaries fall mid-prompt), medians of interleaved
samples (each after one untimed call) of
  plain    gdnconv.conv_prefill, history read from and state written to one slot per request
  cache    the same call with the history read from another slot and the boundary snapshots
  extra    torch copy_ of (prefill_bytes_moved(cache) - prefill_bytes_moved(plain)) / 2 bytes:
           as many bytes read and written as the extra work must move ((W-1) rows of D per
           snapshot and per copied history)
The claim (issue 27): cache - plain <= extra, up to noise. ``diff`` is the median of the paired
differences cache - plain of samples taken one after the other (steadier than the difference of
the medians on a loaded machine), with its interquartile range; ``mindiff`` the difference of
the fastest samples (the least disturbed ones). Cold engine-like rotation by
default (benchmarks/harness.py; ``--warm`` for repeated calls on the same arrays).
"""
import argparse
import datetime
import itertools
import os
import sys

import numpy as np
from harness import Rotation, add_mode_arguments, calibrate, copy_same_bytes, cycle, sample_ns, stats

SHAPES = [(1, 4096, 512), (8, 512, 64), (1, 512, 16), (4, 2048, 256)]
W = 4


class Layer:
    """One layer's arrays: x (N, D), out, a state of 2 B + snapshot slots, the two calls' arguments."""

    def __init__(self, torch, B, T, k, D, rng):
        import ml_dtypes

        import gdnconv
        from gdnconv.testing import as_torch
        bf16 = ml_dtypes.bfloat16
        N = B * T
        n = k // 2                                           # num_computed_tokens of every request
        bounds = [p for p in range(1, T) if (n + p) % k == 0]
        S = 2 * B + B * len(bounds)
        self.x = as_torch(rng.standard_normal((N, D), dtype=np.float32).astype(bf16))
        self.state = as_torch(rng.standard_normal((S, W - 1, D), dtype=np.float32).astype(bf16))
        self.w = as_torch((rng.standard_normal((D, W), dtype=np.float32) / 2).astype(bf16))
        self.out = torch.empty_like(self.x)
        self.plain = dict(conv_state=self.state, query_start_loc=torch.arange(0, N + 1, T, dtype=torch.int32),
                          cache_indices=torch.arange(B, dtype=torch.int32),
                          has_initial_state=torch.ones(B, dtype=torch.bool))
        snaps = [(i, p, 2 * B + i * len(bounds) + j) for i in range(B) for j, p in enumerate(bounds)]
        self.cache = dict(self.plain, initial_state_indices=torch.arange(B, 2 * B, dtype=torch.int32),
                          snapshots=torch.tensor(snaps, dtype=torch.int32).reshape(-1, 3))
        self.snapshots = len(snaps)
        self.nbytes = {k_: int(gdnconv.prefill_bytes_moved(self.x, self.w, **kw))
                       for k_, kw in (("plain", self.plain), ("cache", self.cache))}


def time_shape(torch, B, T, k, args, rotation, rng):
    import gdnconv
    probe = Layer(torch, B, T, k, args.D, rng)
    n = 1 if rotation.warm or probe.nbytes["cache"] >= rotation.factor * rotation.llc else \
        rotation.layers(probe.nbytes["cache"])
    layers = [probe] + [Layer(torch, B, T, k, args.D, rng) for _ in range(n - 1)]
    turn = itertools.cycle(range(n))
    th = args.threads
    extra = probe.nbytes["cache"] - probe.nbytes["plain"]
    peers = {
        "plain": cycle([lambda c=c: gdnconv.conv_prefill(c.x, c.w, out=c.out, num_threads=th, **c.plain)
                        for c in layers], turn),
        "cache": cycle([lambda c=c: gdnconv.conv_prefill(c.x, c.w, out=c.out, num_threads=th, **c.cache)
                        for c in layers], turn),
        "extra": copy_same_bytes(extra // 2, n, use_torch=True),
    }
    calls = {p: calibrate(f, args.sample_ms * 1e6)[0] for p, f in peers.items()}
    samples = {p: [] for p in peers}
    for r in range(args.repeats):       # the order alternates: no peer always follows the same one
        for p in (list(peers) if r % 2 else list(peers)[::-1]):
            samples[p].append(sample_ns(peers[p], calls[p]))
    diffs = np.subtract(samples["cache"], samples["plain"]) / 1e6
    q1, q3 = np.percentile(diffs, [25, 75])
    fastest = (min(samples["cache"]) - min(samples["plain"])) / 1e6
    return probe, extra, n, {p: stats(v)[0] / 1e6 for p, v in samples.items()}, (float(np.median(diffs)), q3 - q1,
                                                                                 fastest)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9, help="interleaved samples per peer (default: %(default)s)")
    ap.add_argument("--sample-ms", type=float, default=50.0, help="length of one sample (default: %(default)s)")
    ap.add_argument("--D", type=int, default=8192)
    ap.add_argument("--shapes", default=",".join(f"{b}x{t}x{k}" for b, t, k in SHAPES), help="BxTxk,...")
    add_mode_arguments(ap)
    args = ap.parse_args(argv)
    import torch

    import gdnconv
    torch.set_num_threads(args.threads)
    rotation = Rotation.from_args(args)
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, gdnconv {gdnconv.active_isa()}, "
          f"threads {args.threads}, torch {torch.__version__}, load {os.getloadavg()[0]:.2f}")
    print(f"# {rotation.describe()}", flush=True)
    rng = np.random.default_rng(0)
    print(f"ms per call (medians of {args.repeats} interleaved samples), D = {args.D}, W = {W}, bf16, silu")
    print(f"{'B':>3} {'T':>6} {'k':>5} {'snaps':>5} {'MB':>7} {'+MB':>6} {'plain':>8} {'cache':>8} {'extra':>8}"
          f"  {'diff':>7} {'IQR':>6}  diff/extra  {'mindiff':>7}")
    for s in args.shapes.split(","):
        B, T, k = (int(v) for v in s.split("x"))
        probe, extra, n, m, (diff, iqr, fastest) = time_shape(torch, B, T, k, args, rotation, rng)
        print(f"{B:>3} {T:>6} {k:>5} {probe.snapshots:>5} {probe.nbytes['plain'] / 1e6:>7.1f} {extra / 1e6:>6.2f} "
              f"{m['plain']:>8.3f} {m['cache']:>8.3f} {m['extra']:>8.3f}  {diff:>7.3f} {iqr:>6.3f}  "
              f"{diff / m['extra']:>9.2f}  {fastest:>7.3f}   ({n} layer{'s' if n > 1 else ''})", flush=True)
    print(f"# load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
