#!/usr/bin/env python
"""Benchmark ``conv_update_multi`` against a plain copy of the same bytes and the
per-request torch loop, for every SIMD path this CPU runs.

    python benchmarks/bench.py --batch 1 4 16 64 --dim 8192 --tokens 4 --dtype bfloat16

Sweeps batch B, channels D, tokens per request T and dtype (every axis can be
restricted), in speculative mode by default: W=4, state length L = W-2+T (the
history rows plus this step's tokens, as vLLM sizes it), num_accepted_tokens drawn
in [1, L-W+2] per request, and the B state rows in a random permutation of the
B cache slots (conv_state_indices), channels contiguous. Plain mode uses L = W-1
and no num_accepted_tokens. Each ISA reuses one preallocated ``out`` per layer
(--alloc-out measures a fresh output per call instead).

Engine-like cold mode (the default): each call goes to the next of enough layers'
separate arrays (state, x, out, weights; together 4x the last-level cache) that it
finds its data evicted, as in a served model where the other layers run between two
calls of one layer; the torch loop and the copy rotate the same way. --warm times
repeated calls on the same arrays instead (data in the caches). The mode is printed.

Reported per configuration and ISA: microseconds per call (median over repeats,
argument checks included), GB/s of the byte count of gdnconv.bytes_moved, the
time relative to a plain copy of that many bytes (the faster of np.copyto and
torch's copy_; the copy reads and writes that many bytes each, so it moves twice
the traffic of the count: x copy < 1 is possible), and the speedup over the
per-request torch loop (gdnconv.reference.torch_loop_update on the same memory as
torch tensors; skipped at B=256 unless --torch-all).

Timing: every callable is warmed up, then calibrated to a batch of calls lasting
at least --sample-us; each sample is one untimed call, then one batch divided by
its count (time.perf_counter_ns). Repeats are interleaved in one process (each
ISA, then the copies, then the torch loop) and medians are reported. The untimed
call wakes the thread pools whatever ran before (--cold-samples drops it); the
number of repeats adapts to --budget seconds per configuration unless --repeats is
given. A correctness check runs once per configuration before timing (--no-check
skips it): every ISA on the full batch against the float64 reference for up to 16
sampled requests, with gdnconv.testing's tolerance.

A torch loop call slower than half the budget (fp16 conv1d on CPU costs ~40 ms a
request) is timed once. Every row also records the CPU time other processes used
while it was timed (other%): on a small shared machine a busy neighbour makes
multi-threaded calls wait for the scheduler, and --wait-quiet waits for quiet and
retries such rows.

Ends with the fixed cost of a small call: B=1, D=8192, T=4, bf16, spec mode, silu,
from NumPy arrays and from torch tensors, per ISA. Writes a table to stdout, a CSV
(--csv), a JSON file (--json) and, with matplotlib installed, a plot of GB/s
against batch per ISA (--plot).
"""
import argparse
import datetime
import gc
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time

import numpy as np

from gdnconv.reference import conv_update_multi_ref, magnitude, torch_loop_update
from gdnconv.testing import as_torch, error_ratio
from gdnconv.timing import BUSY_PCT, CpuMeter, wait_quiet
from harness import Rotation, add_mode_arguments, calibrate, copy_same_bytes, cycle, sample_ns, stats

DEFAULT_BATCH = (1, 4, 16, 64, 256)
DEFAULT_DIM = (2048, 8192, 10240)
DEFAULT_TOKENS = (1, 2, 4)
DEFAULT_DTYPES = ("float32", "float16", "bfloat16")
QUICK = dict(batch=(1, 16, 64), dim=(8192,), tokens=(4,), dtype=("float32", "bfloat16"))
# the argparse defaults, by identity: an axis still holding one of these was not given
_DEFAULT_ARGS = dict(batch=list(DEFAULT_BATCH), dim=list(DEFAULT_DIM), tokens=list(DEFAULT_TOKENS),
                     dtype=list(DEFAULT_DTYPES))
FIXED_COST_CFG = dict(B=1, D=8192, T=4, dtype="bfloat16")   # the fixed cost of a small call

_DTYPE_ALIASES = {"float32": "float32", "fp32": "float32", "f32": "float32",
                  "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
                  "bfloat16": "bfloat16", "bf16": "bfloat16"}

_CSV_FIELDS = ["dtype", "D", "T", "B", "W", "L", "mode", "cache", "layers", "activation", "bias", "weight", "threads", "isa",
               "bytes", "us", "us_min", "spread_pct", "gbps", "copy_us", "copy_np_us", "copy_torch_us",
               "copy_gbps", "x_copy", "loop_us", "loop_gbps", "loop_speedup", "repeats", "loop_repeats",
               "calls_per_sample", "others_pct", "check"]


# ----------------------------------------------------------------------------- setup

def _np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _import_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


class Case:
    """One configuration: its layers' arrays (``layers`` dicts of x, state, weight_raw,
    weight, bias, bias_k, out; the index arrays are shared, as in an engine) and the byte
    count of one call."""

    def __init__(self, dtype, D, T, B, W, mode, activation, bias, weight_kind, alloc_out, rng, rotation):
        import gdnconv
        self.dtype, self.D, self.T, self.B, self.W = dtype, D, T, B, W
        self.mode, self.activation, self.bias_on = mode, activation, bias
        self.weight_kind, self.alloc_out = weight_kind, alloc_out
        self.L = W - 2 + T if mode == "spec" else W - 1
        self.L = max(self.L, W - 1)
        dt = _np_dtype(dtype)
        S = B
        first = dict(
            x=rng.standard_normal((B, T, D), dtype=np.float32).astype(dt),
            state=rng.standard_normal((S, self.L, D), dtype=np.float32).astype(dt),
            weight_raw=(rng.standard_normal((D, W), dtype=np.float32) / math.sqrt(W)).astype(dt),
            bias=(0.1 * rng.standard_normal(D, dtype=np.float32)).astype(dt) if bias else None)
        self.idx = rng.permutation(S).astype(np.int32)
        self.na = rng.integers(1, self.L - W + 3, size=B).astype(np.int32) if mode == "spec" else None
        self.act = None if activation == "none" else activation
        self.layers = [self._layer(first)]
        layer_bytes = sum(a.nbytes for a in self.layers[0].values() if a is not None)
        for _ in range(rotation.layers(layer_bytes) - 1):
            self.layers.append(self._layer({k: None if v is None else v.copy() for k, v in first.items()}))
        self.turn = itertools.cycle(range(len(self.layers)))   # shared by every peer on these layers
        self.nbytes = int(gdnconv.bytes_moved(first["x"], first["state"], first["weight_raw"],
                                              num_accepted_tokens=self.na, conv_state_indices=self.idx))

    def _layer(self, arrays):
        import gdnconv
        layer = dict(arrays, out=np.zeros_like(arrays["x"]))
        layer["weight"] = gdnconv.pack_weight(arrays["weight_raw"]) if self.weight_kind == "packed" \
            else arrays["weight_raw"]
        # the kernel's bias has the kernel weight's dtype (float32 next to packed weights)
        layer["bias_k"] = None if arrays["bias"] is None else arrays["bias"].astype(layer["weight"].dtype)
        return layer

    def kernel(self):
        """gdnconv on each layer in turn."""
        import gdnconv
        f, act, na, idx = gdnconv.conv_update_multi, self.act, self.na, self.idx

        def call(ly):
            x, st, w, b, out = ly["x"], ly["state"], ly["weight"], ly["bias_k"], ly["out"]
            if self.alloc_out:
                return lambda: f(x, st, w, b, activation=act, num_accepted_tokens=na, conv_state_indices=idx)
            return lambda: f(x, st, w, b, activation=act, num_accepted_tokens=na, conv_state_indices=idx, out=out)
        return cycle((call(ly) for ly in self.layers), self.turn)

    def torch_loop(self, torch):
        """The per-request torch loop on each layer's memory in turn."""
        act = self.act
        na = None if self.na is None else torch.from_numpy(self.na)
        idx = torch.from_numpy(self.idx)

        def call(ly):
            x, st, w, b = as_torch(ly["x"]), as_torch(ly["state"]), as_torch(ly["weight_raw"]), as_torch(ly["bias"])
            out = as_torch(ly["out"])
            return lambda: torch_loop_update(x, st, w, b, activation=act, num_accepted_tokens=na,
                                             conv_state_indices=idx, out=out)
        return cycle((call(ly) for ly in self.layers), self.turn)

    def kernel_from_tensors(self, torch):
        """gdnconv on torch tensors over each layer's memory in turn (with out=)."""
        import gdnconv
        f, act = gdnconv.conv_update_multi, self.act
        na = None if self.na is None else torch.from_numpy(self.na)
        idx = torch.from_numpy(self.idx)

        def call(ly):
            x, st, w, b, out = (as_torch(ly[k]) for k in ("x", "state", "weight", "bias_k", "out"))
            return lambda: f(x, st, w, b, activation=act, num_accepted_tokens=na, conv_state_indices=idx, out=out)
        return cycle((call(ly) for ly in self.layers), self.turn)

    def check(self, isas, max_requests=16):
        """Each ISA on the full batch of the first layer from the same starting state,
        against the float64 reference for up to ``max_requests`` sampled requests
        (requests are independent): outputs within gdnconv.testing's tolerance, states
        bit-identical. Returns 'ok' or what went wrong."""
        import gdnconv
        ly = self.layers[0]
        B = self.B
        sel = np.arange(B) if B <= max_requests else np.sort(
            np.random.default_rng(B).choice(B, max_requests, replace=False))
        slots = self.idx[sel]
        kw = dict(num_accepted_tokens=None if self.na is None else self.na[sel], conv_state_indices=slots)
        ref_out, ref_state = conv_update_multi_ref(ly["x"][sel], ly["state"], ly["weight_raw"], ly["bias"],
                                                   activation=self.act, **kw)
        mag = magnitude(ly["x"][sel], ly["state"], ly["weight_raw"], ly["bias"], **kw)
        bad = []
        for isa in isas:
            gdnconv.set_isa(isa)
            st = ly["state"].copy()
            out = gdnconv.conv_update_multi(ly["x"], st, ly["weight"], ly["bias_k"], activation=self.act,
                                            num_accepted_tokens=self.na, conv_state_indices=self.idx)
            ratio = error_ratio(out[sel], ref_out, mag, silu=self.act is not None)
            if not np.all(ratio <= 1.0):
                bad.append(f"{isa}: out off by up to {float(np.max(ratio)):.2f}x the tolerance")
            if not np.array_equal(st[slots].view(np.uint8), ref_state[slots].view(np.uint8)):
                bad.append(f"{isa}: state differs from the reference roll")
        return "ok" if not bad else "; ".join(bad)


# ----------------------------------------------------------------------------- timing

def bench_case(case, isas, args, torch, rotation):
    """Time one configuration; returns one row per ISA."""
    import gdnconv
    target_ns = args.sample_us * 1e3
    timers = []   # (key, fn, isa or None)
    for isa in isas:
        timers.append((("kernel", isa), case.kernel(), isa))
    copy_layers = rotation.layers(2 * case.nbytes)
    timers.append(("copy_np", copy_same_bytes(case.nbytes, copy_layers), None))
    if torch is not None:
        timers.append(("copy_torch", copy_same_bytes(case.nbytes, copy_layers, use_torch=True), None))
    do_loop = torch is not None and not args.no_torch and (case.B < 256 or args.torch_all)
    loop_fn = case.torch_loop(torch) if do_loop else None

    calls, est = {}, {}
    for key, fn, isa in timers:
        if isa is not None:
            gdnconv.set_isa(isa)
        calls[key], est[key] = calibrate(fn, target_ns)
    warm = not args.cold_samples
    cost = sum((calls[k] + warm) * est[k] for k, _, _ in timers) * 1e-9   # seconds per repeat
    if args.repeats:
        repeats = args.repeats
    else:
        repeats = int(min(args.max_repeats, max(args.min_repeats, args.budget / max(cost, 1e-9))))
    loop_every, loop_n = 0, 0
    loop_samples = []
    if loop_fn is not None:
        loop_n, loop_est = calibrate(loop_fn, target_ns)
        if loop_est * 1e-9 > args.budget * 0.5 and not args.repeats:
            loop_samples, loop_fn = [loop_est], None   # too slow to repeat: its one call is the sample
        # the torch loop is slow (fp16 conv1d on CPU: ~40 ms per request): half the budget,
        # at least one sample, at most one per repeat
        loop_budget = args.budget * 0.5
        loop_reps = int(min(repeats, max(1, loop_budget / max((loop_n + warm) * loop_est * 1e-9, 1e-9))))
        if args.repeats:
            loop_reps = min(repeats, max(3, repeats // 4))
        loop_every = max(1, repeats // max(loop_reps, 1))

    samples = {k: [] for k, _, _ in timers}
    meter = CpuMeter()
    m0 = meter.mark()
    for r in range(repeats):
        for key, fn, isa in timers:
            if isa is not None:
                gdnconv.set_isa(isa)
            samples[key].append(sample_ns(fn, calls[key], warm))
        if loop_fn is not None and r % loop_every == 0 and len(loop_samples) < loop_reps:
            loop_samples.append(sample_ns(loop_fn, loop_n, warm))

    others = meter.others_pct(m0, meter.mark())
    copy_np = stats(samples["copy_np"])[0] / 1e3
    copy_torch = stats(samples["copy_torch"])[0] / 1e3 if "copy_torch" in samples else float("nan")
    copy_us = min(copy_np, copy_torch) if torch is not None else copy_np
    loop_us = stats(loop_samples)[0] / 1e3 if loop_samples else float("nan")
    rows = []
    for isa in isas:
        med, lo, spread = stats(samples[("kernel", isa)])
        us = med / 1e3
        rows.append(dict(
            dtype=case.dtype, D=case.D, T=case.T, B=case.B, W=case.W, L=case.L, mode=case.mode,
            cache="warm" if rotation.warm else "cold", layers=len(case.layers),
            activation=case.activation, bias=int(case.bias_on), weight=case.weight_kind,
            threads=gdnconv.get_num_threads(), isa=isa, bytes=case.nbytes,
            us=us, us_min=lo / 1e3, spread_pct=spread, gbps=case.nbytes / (us * 1e3),
            copy_us=copy_us, copy_np_us=copy_np, copy_torch_us=copy_torch,
            copy_gbps=case.nbytes / (copy_us * 1e3), x_copy=us / copy_us,
            loop_us=loop_us, loop_gbps=case.nbytes / (loop_us * 1e3) if loop_samples else float("nan"),
            loop_speedup=loop_us / us if loop_samples else float("nan"),
            repeats=repeats, loop_repeats=len(loop_samples), calls_per_sample=calls[("kernel", isa)],
            others_pct=others, check=case.check_result))
    return rows


def fixed_cost(isas, args, torch, rng, rotation):
    """The fixed cost of a small call: B=1, D=8192, T=4, bf16 (fp32 without ml_dtypes),
    spec mode, silu, from NumPy arrays and (with torch) from torch tensors, in the
    benchmark's mode (cold: rotating through the layers)."""
    import gdnconv
    try:
        _np_dtype("bfloat16")
        dtype = "bfloat16"
    except ImportError:
        dtype = "float32"
    c = FIXED_COST_CFG
    case = Case(dtype, c["D"], c["T"], c["B"], args.width, "spec", "silu", args.bias, args.weight,
                args.alloc_out, rng, rotation)
    fns = [((isa, "numpy"), case.kernel(), isa) for isa in isas]
    if torch is not None:
        fns += [((isa, "torch"), case.kernel_from_tensors(torch), isa) for isa in isas]
    calls = {}
    for key, fn, isa in fns:
        gdnconv.set_isa(isa)
        calls[key] = calibrate(fn, args.sample_us * 1e3)[0]
    samples = {key: [] for key, _, _ in fns}
    meter = CpuMeter()
    m0 = meter.mark()
    for _ in range(max(args.min_repeats, 21)):
        for key, fn, isa in fns:
            gdnconv.set_isa(isa)
            samples[key].append(sample_ns(fn, calls[key], not args.cold_samples))
    res = {key: (statistics.median(v) / 1e3, min(v) / 1e3) for key, v in samples.items()}
    return dtype, case.nbytes, res, meter.others_pct(m0, meter.mark())


# ----------------------------------------------------------------------------- output

def _fmt(v, spec):
    """format(v, spec), or '-' padded to the spec's width for a missing value."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        width = "".join(c for c in spec.split(".")[0] if c.isdigit())
        return "-".rjust(int(width) if width else 1)
    return format(v, spec)


def format_group(rows):
    """One table for a (dtype, D, T) group: a row per (B, ISA)."""
    r0 = rows[0]
    head = (f"{r0['dtype']}  D={r0['D']}  T={r0['T']}  W={r0['W']}  L={r0['L']}  {r0['mode']} mode  "
            f"activation={r0['activation']}  bias={'yes' if r0['bias'] else 'no'}  weight={r0['weight']}  "
            f"threads={r0['threads']}  {r0['cache']}")
    iw = max(7, max(len(r["isa"]) for r in rows))
    cols = (f"{'B':>5} {'layers':>6} {'isa':<{iw}} {'us/call':>9} {'IQR%':>5} {'GB/s':>7} {'x copy':>7} {'speedup':>8}   "
            f"{'copy us':>8} {'copy GB/s':>9} {'np/torch us':>15}   {'loop us':>9} {'loop GB/s':>9}  {'MB':>7}  {'other%':>6}  check")
    lines = [head, cols, "-" * len(cols)]
    last_b = None
    for r in rows:
        first = r["B"] != last_b
        last_b = r["B"]
        tail = ""
        if first:
            np_t = f"{_fmt(r['copy_np_us'], '.1f')}/{_fmt(r['copy_torch_us'], '.1f')}"
            tail = (f"   {_fmt(r['copy_us'], '8.1f')} {_fmt(r['copy_gbps'], '9.1f')} {np_t:>15}   "
                    f"{_fmt(r['loop_us'], '9.1f')} {_fmt(r['loop_gbps'], '9.2f')}  {r['bytes'] / 1e6:7.2f}  "
                    f"{_fmt(r['others_pct'], '6.0f')}  {r['check']}")
        spd = _fmt(r["loop_speedup"], ".1f") + ("x" if not math.isnan(r["loop_speedup"]) else "")
        lines.append(f"{(r['B'] if first else ''):>5} {(r['layers'] if first else ''):>6} {r['isa']:<{iw}} {r['us']:9.1f} {r['spread_pct']:5.0f} "
                     f"{r['gbps']:7.1f} {r['x_copy']:7.2f} {spd:>8}{tail}")
    return "\n".join(lines)


LEGEND = ("layers: separate sets of arrays each peer rotates through (1: warm); us/call: median microseconds "
          "per call incl. argument checks;\nIQR%: interquartile range of the "
          "samples / median;\nGB/s: bytes_moved count / time; x copy: time / time of copying that many bytes "
          "(faster of np.copyto, torch copy_);\nspeedup: per-request torch loop time / kernel time; loop: "
          "the torch loop on the same memory; MB: bytes_moved count;\nother%: CPU time other processes used while "
          "this row was timed, in % of one CPU (a busy neighbour distorts multi-threaded timings).")


def write_csv(rows, path):
    import csv
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=_CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()})


def _json_safe(v):
    return None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v


def write_json(rows, meta, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": [{k: _json_safe(v) for k, v in r.items()} for r in rows]}, f, indent=1)


def plot(rows, path):
    """GB/s against batch, one panel per (dtype, D) at the largest T, a line per ISA,
    the same-bytes copy (dashed) and the torch loop (dotted) as references."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    dtypes = sorted({r["dtype"] for r in rows}, key=lambda d: DEFAULT_DTYPES.index(d))
    dims = sorted({r["D"] for r in rows})
    T = max(r["T"] for r in rows)
    isas = list(dict.fromkeys(r["isa"] for r in rows))
    batches = sorted({r["B"] for r in rows})
    fig, axes = plt.subplots(len(dtypes), len(dims), figsize=(max(6.0, 4.2 * len(dims)), 3.3 * len(dtypes) + 0.6),
                             squeeze=False, sharex=True)
    for i, dt in enumerate(dtypes):
        for j, D in enumerate(dims):
            ax = axes[i][j]
            sel = [r for r in rows if r["dtype"] == dt and r["D"] == D and r["T"] == T]
            for isa in isas:
                pts = sorted((r["B"], r["gbps"]) for r in sel if r["isa"] == isa)
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=isa)
            ref = sorted({(r["B"], r["copy_gbps"]) for r in sel})
            if ref:
                ax.plot(*zip(*ref), "k--", label="copy (same bytes)")
            loop = sorted({(r["B"], r["loop_gbps"]) for r in sel if not math.isnan(r["loop_gbps"])})
            if loop:
                ax.plot(*zip(*loop), ":", color="grey", marker=".", label="torch loop")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(batches)
            ax.set_xticklabels([str(b) for b in batches])
            ax.minorticks_off()
            ax.set_title(f"{dt}, D={D}, T={T}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if i == len(dtypes) - 1:
                ax.set_xlabel("batch B")
            if j == 0:
                ax.set_ylabel("GB/s (bytes_moved count)")
    axes[0][0].legend(fontsize=7)
    r0 = rows[0]
    fig.suptitle(f"gdnconv conv_update_multi: {r0['mode']} mode, W={r0['W']}, activation={r0['activation']},\n"
                 f"{r0['threads']} threads, T={T}; dashed: copy of the same bytes, dotted: torch loop", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ----------------------------------------------------------------------------- CLI

def add_arguments(parser):
    a = parser.add_argument
    a("--batch", type=int, nargs="+", metavar="B", default=_DEFAULT_ARGS["batch"], help="batch sizes")
    a("--dim", type=int, nargs="+", metavar="D", default=_DEFAULT_ARGS["dim"], help="channels")
    a("--tokens", type=int, nargs="+", metavar="T", default=_DEFAULT_ARGS["tokens"], help="tokens per request")
    a("--dtype", nargs="+", metavar="DT", default=_DEFAULT_ARGS["dtype"],
      help="float32 float16 bfloat16 (aliases fp32 fp16 bf16)")
    a("--isa", nargs="+", metavar="ISA", help="SIMD paths to time; None: every available one")
    a("--activation", choices=("silu", "none"), default="silu")
    a("--mode", choices=("spec", "plain"), default="spec",
      help="spec: L = W-2+T, num_accepted_tokens random in [1, L-W+2]; plain: L = W-1")
    a("--width", type=int, default=4, help="kernel width W")
    a("--bias", action="store_true", help="pass a bias (Qwen3-Next/3.5 have none)")
    a("--weight", choices=("raw", "packed"), default="raw",
      help="raw: (D, W) weights in the activation dtype; packed: gdnconv.pack_weight once, reused")
    a("--alloc-out", action="store_true", help="let every call allocate its output instead of reusing one out=")
    a("--threads", type=int, help="threads for gdnconv (explicit, as num_threads=) and torch; None: torch takes "
                                   "gdnconv.get_num_threads() and gdnconv makes default calls (fewer threads while they stall)")
    a("--repeats", type=int, help="interleaved repeats per configuration; None: adaptive, see --budget")
    a("--budget", type=float, default=1.0, help="seconds per configuration that adaptive repeats aim for")
    a("--min-repeats", type=int, default=7, help="fewest adaptive repeats")
    a("--max-repeats", type=int, default=41, help="most adaptive repeats")
    a("--sample-us", type=float, default=250.0, help="a timed sample is a batch of calls lasting at least this")
    a("--cold-samples", action="store_true",
      help="no untimed call before each sample (which otherwise wakes the thread pools)")
    a("--quick", action="store_true", help="small subset: B 1 16 64, D 8192, T 4, float32 and bfloat16, "
                                           "fewer repeats (explicit axis flags still win)")
    a("--no-torch", action="store_true", help="skip the torch loop even when torch is installed")
    a("--torch-all", action="store_true", help="time the torch loop at B=256 too (slow)")
    a("--no-check", action="store_true", help="skip the correctness check against the float64 reference")
    a("--seed", type=int, default=0, help="seed of the random inputs")
    a("--csv", default=os.path.join("bench_out", "bench.csv"), help="CSV output path ('' for none)")
    a("--json", nargs="?", const=os.path.join("bench_out", "bench.json"), default=None, metavar="PATH",
      help="write JSON too; PATH defaults to bench_out/bench.json")
    a("--plot", default=os.path.join("bench_out", "bench.png"), help="PNG plot path ('' for none)")
    a("--wait-quiet", type=float, default=0.0, metavar="S",
      help="before each configuration wait up to S seconds for other processes to use < 15%% of a CPU, "
           "and time a configuration again (twice at most) when they used > 20%% meanwhile (a shared "
           "machine); 0: don't wait")
    a("--no-progress", action="store_true", help="no tqdm progress bar")
    add_mode_arguments(parser)
    return parser


def _resolve(args):
    import gdnconv
    q = QUICK if args.quick else {}

    def axis(name):   # an axis left at its default takes --quick's subset
        v = getattr(args, name)
        return q.get(name, v) if v is _DEFAULT_ARGS[name] else v

    batch, dims, tokens = axis("batch"), axis("dim"), axis("tokens")
    dtypes = []
    for d in axis("dtype"):
        if d.lower() not in _DTYPE_ALIASES:
            raise SystemExit(f"bench.py: unknown dtype {d!r}; use float32, float16 or bfloat16")
        dtypes.append(_DTYPE_ALIASES[d.lower()])
    if "bfloat16" in dtypes:
        try:
            _np_dtype("bfloat16")
        except ImportError:
            print("bench.py: ml_dtypes is not installed, skipping bfloat16", file=sys.stderr)
            dtypes.remove("bfloat16")
    avail = gdnconv.available_isas()
    isas = args.isa or avail
    for isa in isas:
        if isa not in avail:
            raise SystemExit(f"bench.py: ISA {isa!r} is not available here (available: {', '.join(avail)})")
    for name, vals in (("--batch", batch), ("--dim", dims), ("--tokens", tokens)):
        if any(v < 1 for v in vals):
            raise SystemExit(f"bench.py: {name} values must be >= 1")
    if not 2 <= args.width <= 8:
        raise SystemExit("bench.py: --width must be in 2..8")
    if args.quick and not args.repeats:
        args.max_repeats = min(args.max_repeats, 15)
        args.min_repeats = min(args.min_repeats, 5)
        args.budget = min(args.budget, 0.5)
    return list(dict.fromkeys(batch)), list(dict.fromkeys(dims)), list(dict.fromkeys(tokens)), \
        list(dict.fromkeys(dtypes)), list(dict.fromkeys(isas))


def run(args):
    """Run the sweep described by ``args`` (from ``add_arguments``); returns an exit code."""
    import gdnconv
    batch, dims, tokens, dtypes, isas = _resolve(args)
    rotation = Rotation.from_args(args)
    torch = _import_torch()
    prev_isa, prev_threads = gdnconv.active_isa(), gdnconv.get_num_threads()
    prev_torch_threads = torch.get_num_threads() if torch is not None else None
    threads = args.threads or prev_threads
    if args.threads:   # explicit; without --threads gdnconv's calls stay default (adaptive) calls
        gdnconv.set_num_threads(threads)
    if torch is not None:
        torch.set_num_threads(threads)
    rng = np.random.default_rng(args.seed)
    configs = [(dt, D, T, B) for dt in dtypes for D in dims for T in tokens for B in sorted(batch)]
    if not configs or not isas:
        print("bench.py: nothing to run (no dtype, batch, dim, token count or ISA left; see the messages above)",
              file=sys.stderr)
        return 2
    meta = dict(started=datetime.datetime.now().isoformat(timespec="seconds"), cpu=_cpu_name(),
                logical_cpus=os.cpu_count(), threads=threads, isas=isas, gdnconv=gdnconv.__version__,
                numpy=np.__version__, torch=getattr(torch, "__version__", None), python=platform.python_version(),
                mode=args.mode, activation=args.activation, width=args.width, bias=args.bias, weight=args.weight,
                alloc_out=args.alloc_out, cache="warm" if rotation.warm else "cold",
                last_level_cache=rotation.llc, argv=sys.argv[1:])
    out = sys.stdout
    print(f"benchmarks/bench.py, gdnconv {gdnconv.__version__}  {meta['started']}  cpu: {meta['cpu']} ({os.cpu_count()} logical)  "
          f"threads: {threads}  ISAs: {', '.join(isas)}  torch: {meta['torch'] or 'not installed'}", file=out)
    print(rotation.describe(), file=out)
    print(f"{len(configs)} configurations x {len(isas)} ISA(s); {LEGEND}\n", file=out, flush=True)

    bar = None
    if not args.no_progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=len(configs), desc="bench", unit="cfg", file=sys.stderr, leave=False)
        except ImportError:
            bar = None
    emit = (lambda s: bar.write(s, file=out)) if bar is not None else (lambda s: print(s, file=out, flush=True))

    rows, failures = [], 0
    t_start = time.perf_counter()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        group = []
        for n, (dt, D, T, B) in enumerate(configs):
            if bar is not None:
                bar.set_postfix_str(f"{dt} D={D} T={T} B={B}")
            case = Case(dt, D, T, B, args.width, args.mode, args.activation, args.bias, args.weight,
                        args.alloc_out, rng, rotation)
            case.check_result = "skipped" if args.no_check else case.check(isas)
            if case.check_result not in ("ok", "skipped"):
                failures += 1
            wait_quiet(args.wait_quiet)
            new = bench_case(case, isas, args, torch, rotation)
            for _ in range(2 if args.wait_quiet > 0 else 0):   # disturbed by other processes: wait, retry
                if not new[0]["others_pct"] > BUSY_PCT:
                    break
                wait_quiet(args.wait_quiet)
                again = bench_case(case, isas, args, torch, rotation)
                if again[0]["others_pct"] < new[0]["others_pct"]:
                    new = again
            del case
            gc.collect()
            rows.extend(new)
            group.extend(new)
            nxt = configs[n + 1] if n + 1 < len(configs) else None
            if nxt is None or nxt[:3] != (dt, D, T):
                emit(format_group(group) + "\n")
                group = []
            if bar is not None:
                bar.update(1)

        wait_quiet(args.wait_quiet)
        fc = fixed_cost(isas, args, torch, rng, rotation)
    finally:
        if gc_was_enabled:
            gc.enable()
        if bar is not None:
            bar.close()
        gdnconv.set_isa(prev_isa)
        if args.threads:
            gdnconv.set_num_threads(None)   # back to the default
        if torch is not None:
            torch.set_num_threads(prev_torch_threads)
    elapsed = time.perf_counter() - t_start
    meta["elapsed_s"] = round(elapsed, 1)

    dtype_fc, nbytes_fc, res, others_fc = fc
    c = FIXED_COST_CFG
    lines = [f"Fixed cost of a small call (median of interleaved samples): B={c['B']}, D={c['D']}, T={c['T']}, {dtype_fc}, spec mode, silu, "
             f"W={args.width}, {nbytes_fc / 1e3:.0f} kB moved, argument checks included, {threads} threads "
             f"(other processes: {_fmt(others_fc, '.0f')}% of a CPU):"]
    iw = max(7, max(len(i) for i in isas))
    for isa in isas:
        s = f"  {isa:<{iw}} {res[(isa, 'numpy')][0]:7.1f} us/call from NumPy (min {res[(isa, 'numpy')][1]:.1f})"
        if (isa, "torch") in res:
            s += f", {res[(isa, 'torch')][0]:7.1f} us/call from torch tensors (min {res[(isa, 'torch')][1]:.1f})"
        lines.append(s)
    in_sweep = [r for r in rows if (r["B"], r["D"], r["T"], r["dtype"], r["mode"], r["activation"]) ==
                (c["B"], c["D"], c["T"], dtype_fc, "spec", "silu")]
    if in_sweep:
        lines.append("  (same configuration in the sweep: " + ", ".join(
            f"{r['isa']} {r['us']:.1f} us" for r in in_sweep) + f"; same-bytes copy {in_sweep[0]['copy_us']:.1f} us)")
    print("\n".join(lines), file=out)
    meta["fixed_cost_us"] = {f"{isa}/{src}": round(v[0], 2) for (isa, src), v in res.items()}

    if args.csv:
        write_csv(rows, args.csv)
        print(f"\nCSV: {args.csv}", file=out)
    if args.json:
        write_json(rows, meta, args.json)
        print(f"JSON: {args.json}", file=out)
    if args.plot:
        if plot(rows, args.plot):
            print(f"plot: {args.plot}", file=out)
        else:
            print("plot: skipped (matplotlib is not installed)", file=out)
    print(f"elapsed: {elapsed:.1f} s", file=out)
    busy = [r for r in rows if r["others_pct"] > BUSY_PCT]
    if busy:
        print(f"WARNING: other processes used more than 20% of a CPU while {len(busy)} of {len(rows)} rows were "
              f"timed (up to {max(r['others_pct'] for r in busy):.0f}%); those timings are not trustworthy.",
              file=out)
    if failures:
        print(f"bench.py: {failures} configuration(s) FAILED the correctness check (see the check column)",
              file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bench.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
