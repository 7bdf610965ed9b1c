"""Longer runs of the test suite's fuzzer (tests/test_fuzz.py): valid and invalid calls
mixed across layouts, dtypes, modes, widths, threads, ISAs and NumPy/torch inputs,
valid ones checked against gdnconv.reference, refused ones for unchanged buffers.

    PYTHONPATH=src python scripts/fuzz.py --calls 20000 --seed 1

(the suite runs 3000 calls of seed 11). Needs the test dependencies (pytest, ml_dtypes;
torch for the tensor calls). Prints the count of each kind of call; a failure prints
the seed and call number, which ``--first N --calls 1`` replays alone.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000, help="calls to make (default 20000)")
    ap.add_argument("--seed", type=int, default=1, help="sequence seed (default 1)")
    ap.add_argument("--first", type=int, default=0, help="number of the first call (default 0)")
    ap.add_argument("--no-torch", action="store_true", help="NumPy arrays only")
    args = ap.parse_args()
    if not args.no_torch:
        try:
            import torch  # noqa: F401  (the fuzzer sends tensors when torch is imported)
        except ImportError:
            print("torch not installed: NumPy arrays only")
    from test_fuzz import fuzz
    t0 = time.perf_counter()
    counts = fuzz(args.calls, args.seed, first=args.first)
    print(f"{args.calls} calls (seed {args.seed}) in {time.perf_counter() - t0:.0f} s, all passed:")
    for kind, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"  {n:7d}  {kind}")


if __name__ == "__main__":
    main()
