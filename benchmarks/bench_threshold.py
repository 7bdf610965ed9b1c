"""Where does a second thread start to pay? Times conv_update_multi with one thread and
with all threads over a range of call sizes, interleaved, and prints the ratio.

The dispatcher runs calls that move fewer than parallel_min_bytes (src/csrc/threads.c) on
the calling thread; this script is how that number was chosen. It lifts the
threshold for its own calls, then runs each call with num_threads=1 and with
num_threads=N, interleaved.

    python benchmarks/bench_threshold.py [--dtype bfloat16] [--repeats 15]
"""
import argparse
import time

import numpy as np

import gdnconv


def _median_us(fn, inner, repeats):
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter_ns() - t0) / inner / 1e3)
    return float(np.median(samples))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=4)
    args = ap.parse_args()
    if args.dtype == "bfloat16":
        import ml_dtypes
        dt = np.dtype(ml_dtypes.bfloat16)
    else:
        dt = np.dtype(args.dtype)
    nmax = gdnconv.get_num_threads()
    gdnconv._core._set_parallel_min_bytes(0)
    rng = np.random.default_rng(0)
    T, W = args.tokens, 4
    L = W - 1 + T - 1
    print(f"isa {gdnconv.active_isa()}, {args.dtype}, T={T}, W={W}, threads 1 vs {nmax}")
    print(f"{'B':>4} {'D':>6} {'KB':>8} {'1 thread us':>12} {f'{nmax} threads us':>14} {'speed-up':>9}")
    for B, D in [(1, 2048), (1, 4096), (1, 8192), (2, 8192), (4, 8192), (8, 8192), (16, 8192), (64, 8192)]:
        x = rng.standard_normal((B, T, D)).astype(dt)
        state = rng.standard_normal((B, L, D)).astype(dt)
        w = rng.standard_normal((D, W)).astype(dt)
        na = np.full(B, 2, np.int32)
        out = np.empty_like(x)
        kb = gdnconv.bytes_moved(x, state, w, num_accepted_tokens=na) / 1024
        inner = max(1, int(2e5 / (kb * 1024 / 10)))
        one, many = [], []
        for _ in range(args.repeats):  # interleaved
            one.append(_median_us(lambda: gdnconv.conv_update_multi(x, state, w, num_accepted_tokens=na, out=out,
                                                                    num_threads=1), inner, 1))
            many.append(_median_us(lambda: gdnconv.conv_update_multi(x, state, w, num_accepted_tokens=na, out=out,
                                                                     num_threads=nmax), inner, 1))
        a, b = float(np.median(one)), float(np.median(many))
        print(f"{B:>4} {D:>6} {kb:>8.0f} {a:>12.1f} {b:>14.1f} {a / b:>8.2f}x")


if __name__ == "__main__":
    main()
