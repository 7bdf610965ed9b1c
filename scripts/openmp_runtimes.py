"""Which OpenMP runtimes a process holds when torch and gdnconv share it (threadpoolctl),
whether gdnconv's thread count still follows ``set_num_threads``/``num_threads=`` and
``OMP_NUM_THREADS``, and whether a forked child's calls (gdnconv and torch) finish.

Run it in an environment with the installed wheel and torch (python scripts/openmp_runtimes.py);
it prints what it finds and exits non-zero if gdnconv's threads do not follow its setting
or a forked child hangs. Threads are counted in /proc/self/task (Linux).
"""
import multiprocessing
import os
import subprocess
import sys

import numpy as np


def _threads():
    return len(os.listdir("/proc/self/task"))


def _call(n):
    import gdnconv
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4, 4096)).astype(np.float32)
    state = rng.standard_normal((64, 6, 4096)).astype(np.float32)
    w = rng.standard_normal((4096, 4)).astype(np.float32)
    out = gdnconv.conv_update_multi(x, state, w, num_accepted_tokens=np.full(64, 2, np.int32), num_threads=n)
    return float(np.abs(out).sum())


def _child():
    import torch
    _call(2)
    return float(torch.ones(256, 256).matmul(torch.ones(256, 256)).sum())


def report():
    import torch   # torch first, as in a serving engine
    import gdnconv
    from threadpoolctl import threadpool_info

    failures = []
    t0 = _threads()
    _call(1)
    t1 = _threads()
    _call(2)
    t2 = _threads()
    torch.ones(512, 512).matmul(torch.ones(512, 512))
    t3 = _threads()
    print(f"threads: {t0} at start, {t1} after a gdnconv call on 1 thread, {t2} after one on 2, "
          f"{t3} after a torch matmul")
    if t1 != t0 or t2 != t1 + 1:
        failures.append("gdnconv's pool does not follow num_threads")
    for info in threadpool_info():
        if info["user_api"] == "openmp":
            print(f"OpenMP runtime: {info['filepath']} ({info['internal_api']}, "
                  f"omp_get_max_threads {info['num_threads']})")
    torch.set_num_threads(1)
    print(f"torch.set_num_threads(1): gdnconv.get_num_threads() = {gdnconv.get_num_threads()} "
          f"(gdnconv keeps its own setting)")

    env = dict(os.environ, OMP_NUM_THREADS="1")
    code = ("import torch, gdnconv, os, sys; sys.path.insert(0, %r); import openmp_runtimes as m; "
            "t = m._threads(); m._call(None); print(gdnconv.get_num_threads(), m._threads() - t)"
            % os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    n, extra = r.stdout.split()
    print(f"OMP_NUM_THREADS=1: gdnconv.get_num_threads() = {n}, {extra} threads added by a call")
    if (n, extra) != ("1", "0"):
        failures.append("OMP_NUM_THREADS=1 does not govern gdnconv")

    with multiprocessing.get_context("fork").Pool(1) as pool:
        try:
            pool.apply_async(_child).get(timeout=120)
            print("fork after parallel calls of both: the child's gdnconv call and torch matmul finish")
        except multiprocessing.TimeoutError:
            failures.append("a forked child hung")
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(report())
