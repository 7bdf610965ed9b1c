#!/usr/bin/env python
"""Time ``conv_update_multi`` on the same call with the conv state in different memory
layouts, interleaved in one run, and report each layout's time relative to the
channel-contiguous one.

    python benchmarks/bench_layouts.py --batch 1 4 16 64 --dim 8192 --tokens 4 --dtype bf16

``--state-layout`` (default: all three):
  sd  ``(S, L, D)`` memory, channels contiguous (gdnconv's own layout);
  ds  ``(S, D, L)`` memory passed as ``.transpose(1, 2)``: vLLM's DS layout, channel
      stride L, time stride 1;
  hf  ``(S, D, L + 1)`` memory passed as ``[..., 1:].transpose(1, 2)``: transformers'
      conv cache (``(B, D, W)`` with the history in the last ``W - 1`` columns when
      ``L = W - 1``, i.e. ``--mode plain``), channel stride L + 1, time stride 1.

Every layout gets the same values (x, state, weights, slots, num_accepted_tokens), so
the calls compute the same thing; a check before timing says so bit for bit, and which
kernel path each layout took (``gdnconv.last_path``, where this gdnconv has it: run the
script with an older build on PYTHONPATH to time its ``sd`` path for a before/after).
Modes, rotation and sampling as ``bench.py`` (``harness.py``): cold by default, calls
calibrated to ``--sample-us``, repeats interleaved across layouts, medians reported;
one thread unless ``--threads``. ``other%``: CPU time other processes used meanwhile.
"""
import argparse
import math
import sys

import numpy as np
from harness import Rotation, add_mode_arguments, calibrate, cycle, sample_ns, stats

from gdnconv.timing import CpuMeter

LAYOUTS = ("sd", "ds", "hf")


def _dtype(name):
    if name in ("bf16", "bfloat16"):
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype({"fp32": "float32", "fp16": "float16"}.get(name, name))


def state_view(values, layout):
    """A new conv state of ``layout`` holding ``values`` ((S, L, D)), as gdnconv is passed it."""
    S, L, D = values.shape
    if layout == "sd":
        return values.copy()
    if layout == "ds":
        return np.ascontiguousarray(values.transpose(0, 2, 1)).transpose(0, 2, 1)
    mem = np.zeros((S, D, L + 1), values.dtype)
    mem[..., 1:] = values.transpose(0, 2, 1)
    return mem[..., 1:].transpose(0, 2, 1)


def build(args, dt, B, D, T, layout, rng, rotation):
    """The layers (dicts of x, state, weight, out) and call keywords for one layout."""
    W = args.width
    L = W - 2 + T if args.mode == "spec" else W - 1
    L = max(L, W - 1)
    seeds = np.random.default_rng(rng.integers(1 << 31))
    x = seeds.standard_normal((B, T, D), dtype=np.float32).astype(dt)
    values = seeds.standard_normal((B, L, D), dtype=np.float32).astype(dt)
    w = (seeds.standard_normal((D, W), dtype=np.float32) / math.sqrt(W)).astype(dt)
    kw = dict(conv_state_indices=seeds.permutation(B).astype(np.int32), activation="silu")
    if args.mode == "spec":
        kw["num_accepted_tokens"] = seeds.integers(1, L - W + 3, size=B).astype(np.int32)
    one = x.nbytes * 2 + values.nbytes + w.nbytes
    layers = [dict(x=x.copy(), state=state_view(values, layout), weight=w.copy(), out=np.zeros_like(x))
              for _ in range(rotation.layers(one))]
    return layers, kw, (x, values, w)


def run(args):
    import gdnconv
    dt = _dtype(args.dtype)
    rotation = Rotation.from_args(args)
    gdnconv.set_num_threads(args.threads)
    if args.isa:
        gdnconv.set_isa(args.isa)
    has_path = hasattr(gdnconv, "last_path")
    print(f"benchmarks/bench_layouts.py  isa: {gdnconv.active_isa()}  threads: {gdnconv.get_num_threads()}  "
          f"{args.dtype} D={args.dim} T={args.tokens} W={args.width} {args.mode} mode, silu")
    print(rotation.describe())
    print(f"{'B':>4} {'layout':<6} {'us/call':>9} {'IQR%':>5} {'x sd':>6} {'other%':>6}  path")
    rng = np.random.default_rng(args.seed)
    for B in args.batch:
        peers, paths = {}, {}
        seed = rng.integers(1 << 31)
        ref = None
        for layout in args.state_layout:
            layers, kw, first = build(args, dt, B, args.dim, args.tokens, layout, np.random.default_rng(seed), rotation)
            # the check: one call on a fresh state, bitwise equal across layouts
            st = state_view(first[1], layout)
            out = gdnconv.conv_update_multi(first[0], st, first[2], **kw)
            paths[layout] = gdnconv.last_path() if has_path else "-"
            got = (out.view(np.uint8).tobytes(), np.ascontiguousarray(st).view(np.uint8).tobytes())
            if ref is None:
                ref = got
            elif got != ref:
                print(f"bench_layouts.py: layout {layout} computes other bits than {args.state_layout[0]}",
                      file=sys.stderr)
                return 1

            def call(ly, kw=kw):
                return lambda: gdnconv.conv_update_multi(ly["x"], ly["state"], ly["weight"], out=ly["out"], **kw)
            peers[layout] = cycle([call(ly) for ly in layers])
        calls = {k: calibrate(fn, args.sample_us * 1e3)[0] for k, fn in peers.items()}
        samples = {k: [] for k in peers}
        meter = CpuMeter()
        m0 = meter.mark()
        for _ in range(args.repeats):
            for k, fn in peers.items():
                samples[k].append(sample_ns(fn, calls[k]))
        others = meter.others_pct(m0, meter.mark())
        base = stats(samples[args.state_layout[0]])[0]
        for k in peers:
            med, _, iqr = stats(samples[k])
            print(f"{B:>4} {k:<6} {med / 1e3:9.2f} {iqr:5.0f} {med / base:6.2f} {others:6.0f}  {paths[k]}", flush=True)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bench_layouts.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    a = parser.add_argument
    a("--state-layout", nargs="+", choices=LAYOUTS, default=list(LAYOUTS),
      help="layouts to time; the first is the one the others are compared with")
    a("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    a("--dim", type=int, default=8192)
    a("--tokens", type=int, default=4)
    a("--dtype", default="bf16", choices=("fp32", "fp16", "bf16", "float32", "float16", "bfloat16"))
    a("--width", type=int, default=4)
    a("--mode", choices=("spec", "plain"), default="spec",
      help="spec: L = W-2+T with num_accepted_tokens; plain: L = W-1 (transformers' cache)")
    a("--threads", type=int, default=1)
    a("--isa", help="kernel to time (default: the active one)")
    a("--repeats", type=int, default=21, help="interleaved samples per layout")
    a("--sample-us", type=float, default=2000.0, help="a sample is a batch of calls lasting at least this")
    a("--seed", type=int, default=0)
    add_mode_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
