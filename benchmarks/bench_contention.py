"""Calls when another process holds a core: conv_update_multi with the default threads
against num_threads=1, with one competing busy-loop process and without.

A team call returns only when all its threads have run, so a thread the scheduler
parked behind another process holds the caller (threads.c: default calls then use
fewer threads). This script starts one busy-loop process pinned to one CPU
(os.sched_setaffinity) for each contention block; it stops itself after a bounded
time, and when its parent dies. Each repeat runs an idle block and a contention block
(in alternating order); in each, default-thread and one-thread samples alternate,
after --settle seconds of untimed default calls that let the adaptive team size
follow the condition. Each sample is the mean of a run of calls (probes of a larger
team included); the table gives medians over the repeats and the ratios.

    python benchmarks/bench_contention.py [--repeats 7] [--warm] [--batch 16 --dim 8192]

The load average (os.getloadavg) is printed with every block: other processes that
keep the cores busy make the idle figures contention figures too (--wait-quiet waits
for a quiet moment before each idle block; other% says what it got).
"""
import argparse
import itertools
import os
import statistics
import subprocess
import sys
import time

import harness
import numpy as np

import gdnconv
from gdnconv.timing import CpuMeter, wait_quiet

# The competing process: spins on one CPU until its deadline, or until its parent is gone.
BUSY_LOOP = """
import os, sys, time
cpu, seconds, parent = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
os.sched_setaffinity(0, {cpu})
end = time.monotonic() + seconds
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(20000):
        pass
"""


def start_busy(cpu, seconds):
    """A busy-loop process pinned to ``cpu`` that exits after ``seconds`` or when this
    process dies (Linux: it checks its parent id)."""
    return subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(cpu), str(seconds), str(os.getpid())])


def stop_busy(proc):
    proc.kill()
    proc.wait()


def _dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def make_calls(args, rotation):
    """(default-thread call, one-thread call, layers): B requests of T tokens, spec mode
    (num_accepted_tokens = 2, L = W - 2 + T), SiLU, the caller's own out; each call
    on the next layer's arrays."""
    dt = _dtype(args.dtype)
    B, T, D, W = args.batch, args.tokens, args.dim, args.width
    L = W - 2 + T
    rng = np.random.default_rng(0)
    per_layer = (B * T * 2 + B * L) * D * dt.itemsize + D * W * dt.itemsize
    layers = rotation.layers(per_layer)
    sets = []
    for _ in range(layers):
        x = rng.standard_normal((B, T, D)).astype(dt)
        st = rng.standard_normal((B, L, D)).astype(dt)
        w = rng.standard_normal((D, W)).astype(dt)
        sets.append((x, st, w, np.empty_like(x)))
    na = np.full(B, 2, np.int32)

    def call(s, n):
        x, st, w, out = s
        return gdnconv.conv_update_multi(x, st, w, num_accepted_tokens=na, out=out, num_threads=n)

    turn = itertools.cycle(range(layers))   # both peers share the rotation
    default = harness.cycle([lambda s=s: call(s, None) for s in sets], turn)
    one = harness.cycle([lambda s=s: call(s, 1) for s in sets], turn)
    return default, one, layers


def _state():
    probe = getattr(gdnconv, "thread_contention", None)   # absent in builds before the adaptive team
    return probe() if probe else None


def run_block(busy_cpu, default, one, calls, samples, settle_s, bound_s):
    """Alternating samples (µs per call) of both peers in one condition: idle when
    busy_cpu is None, else with a busy loop on that CPU. Returns the samples, the other
    processes' CPU share (% of one CPU), the load average and the adaptive counters."""
    proc = start_busy(busy_cpu, bound_s) if busy_cpu is not None else None
    try:
        time.sleep(0.2)
        end = time.perf_counter() + settle_s
        while time.perf_counter() < end:
            default()
        before = _state()
        meter = CpuMeter()
        a = meter.mark()
        d, o = [], []
        for _ in range(samples):
            d.append(harness.sample_ns(default, calls, warm_up=False) / 1e3)
            o.append(harness.sample_ns(one, calls, warm_up=False) / 1e3)
        others = meter.others_pct(a, meter.mark())
        after = _state()
    finally:
        if proc is not None:
            stop_busy(proc)
    counts = None
    if before is not None:
        counts = {k: after[k] - before[k] for k in ("slow_calls", "reductions", "probes")}
        counts["threads"] = after["threads"]
    return d, o, others, os.getloadavg()[0], counts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dim", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--repeats", type=int, default=7, help="idle/contention block pairs (default: %(default)s)")
    ap.add_argument("--samples", type=int, default=2, help="samples of each peer per block (default: %(default)s)")
    ap.add_argument("--sample-ms", type=float, default=100.0, help="length of a sample (default: %(default)s)")
    ap.add_argument("--settle", type=float, default=1.2,
                    help="seconds of untimed default calls before each block's samples, longer than the "
                         "adaptive team's longest backoff (1 s) (default: %(default)s)")
    ap.add_argument("--only", choices=["idle", "contention"], default=None,
                    help="run only the blocks of one condition (A/B runs of two builds)")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help="before each idle block, wait up to S seconds until other processes use less than 15%% "
                         "of a CPU (default: no wait)")
    ap.add_argument("--cpu", type=int, default=None, help="CPU of the busy loop (default: the last this process may use)")
    harness.add_mode_arguments(ap)
    args = ap.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    busy_cpu = cpus[-1] if args.cpu is None else args.cpu
    if busy_cpu not in cpus:
        raise SystemExit(f"--cpu {busy_cpu} is not one this process may use: {cpus}")
    rotation = harness.Rotation.from_args(args)
    default, one, layers = make_calls(args, rotation)
    calls, est_ns = harness.calibrate(one, args.sample_ms * 1e6)
    print(f"gdnconv from {os.path.dirname(gdnconv.__file__)}, isa {gdnconv.active_isa()}, default threads "
          f"{gdnconv.get_num_threads()} of CPUs {cpus}; busy loop on CPU {busy_cpu}")
    print(f"{args.dtype}, B={args.batch}, D={args.dim}, W={args.width}, T={args.tokens}, spec mode, SiLU; "
          f"{rotation.describe()}; {layers} layer(s); {calls} calls per sample")
    # the busy loop's bound: 20 times the block's one-thread estimate, plus 10 s
    bound_s = 20 * (args.settle + 2 * args.samples * calls * est_ns * 1e-9) + 10
    rows = {"idle": ([], []), "contention": ([], [])}
    print(f"{'repeat':>6} {'condition':>10} {'load1':>6} {'other%':>7} {'default us':>11} {'1 thread us':>12} "
          f"{'ratio':>6}  adaptive (slow calls, reductions, probes -> threads)")
    for r in range(args.repeats):
        order = ("idle", "contention") if r % 2 == 0 else ("contention", "idle")
        order = [c for c in order if args.only in (None, c)]
        for cond in order:
            if cond == "idle" and args.wait_quiet > 0:
                wait_quiet(args.wait_quiet)
            d, o, others, load, counts = run_block(busy_cpu if cond == "contention" else None, default, one,
                                                   calls, args.samples, args.settle, bound_s)
            rows[cond][0].extend(d)
            rows[cond][1].extend(o)
            dm, om = statistics.median(d), statistics.median(o)
            note = "-" if counts is None else (f"{counts['slow_calls']}, {counts['reductions']}, "
                                               f"{counts['probes']} -> {counts['threads']}")
            print(f"{r:>6} {cond:>10} {load:>6.2f} {others:>7.0f} {dm:>11.1f} {om:>12.1f} {dm / om:>6.2f}  {note}",
                  flush=True)
    print("medians over all samples:")
    rows = {c: v for c, v in rows.items() if v[0]}
    for cond, (d, o) in rows.items():
        dm, om = statistics.median(d), statistics.median(o)
        print(f"  {cond:>10}: default {dm:.1f} us, one thread {om:.1f} us, default/one {dm / om:.2f}")
    if len(rows) == 2:
        idle_d, cont_d = statistics.median(rows["idle"][0]), statistics.median(rows["contention"][0])
        print(f"  default under contention / default idle: {cont_d / idle_d:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
