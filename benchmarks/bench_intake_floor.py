"""What reading torch tensors costs gdnconv's Cython layer against a C++ binding doing the same checks.

    python benchmarks/bench_intake_floor.py [--dim 2048] [--batch 1] [--repeats 7]

Needs a C++ compiler and ninja: it builds, with ``torch.utils.cpp_extension.load_inline``, a
prototype that reads the tensors of one speculative ``conv_update_multi`` call (x, conv_state,
weight, num_accepted_tokens, conv_state_indices, out) as gdnconv's Cython layer does and runs the
same checks on them (CPU, strided, dtype, no pending negation; for the written ones no autograd
and no inference tensor outside inference mode; each view inside its storage), but computes
nothing. Called as a pybind11 function and as a torch op (``torch.ops``, as vLLM calls its
kernels), with a given out and with a new one (``at::empty_like``), side by side with gdnconv's
core call on the same tensors and on NumPy views of the same memory (the kernel plus the NumPy
call's own fixed cost, ~1 us). Warm, one thread, medians of interleaved rounds. The question it answers: how much of a small
call's time is the Python-level tensor intake, and what a binding compiled against torch would
leave of it (issue 26's small-batch cases).
"""
import argparse
import statistics

import numpy as np
import torch
from torch.utils.cpp_extension import load_inline

import gdnconv
from harness import sample_ns

SOURCE = r"""
#include <torch/extension.h>

static void take(const at::Tensor &t, bool written, at::ScalarType dtype) {
    TORCH_CHECK(t.device().is_cpu() && t.layout() == at::kStrided, "a CPU dense tensor");
    TORCH_CHECK(t.scalar_type() == dtype, "dtype");
    TORCH_CHECK(!t.is_neg(), "pending negation");
    if (written) {
        TORCH_CHECK(!t.requires_grad(), "requires grad");
        TORCH_CHECK(!t.is_inference() || c10::InferenceMode::is_enabled(), "inference tensor");
    }
    int64_t lo = 0, hi = 0;
    for (int64_t i = 0; i < t.dim(); i++) {
        if (t.size(i) == 0) return;
        (t.stride(i) < 0 ? lo : hi) += (t.size(i) - 1) * t.stride(i);
    }
    const char *p = (const char *)t.data_ptr(), *base = (const char *)t.storage().data();
    TORCH_CHECK(p + lo * t.element_size() >= base &&
                p + (hi + 1) * t.element_size() <= base + t.storage().nbytes(), "inside its storage");
}

static void inputs(const at::Tensor &x, const at::Tensor &st, const at::Tensor &w, const at::Tensor &na,
                   const at::Tensor &idx) {
    take(x, false, x.scalar_type());
    take(st, true, x.scalar_type());
    take(w, false, w.scalar_type());
    take(na, false, at::kInt);
    take(idx, false, at::kInt);
}

void intake(const at::Tensor &x, const at::Tensor &st, const at::Tensor &w, const at::Tensor &na,
            const at::Tensor &idx, const at::Tensor &out) {
    inputs(x, st, w, na, idx);
    take(out, true, x.scalar_type());
}

at::Tensor intake_new(const at::Tensor &x, const at::Tensor &st, const at::Tensor &w, const at::Tensor &na,
                      const at::Tensor &idx) {
    inputs(x, st, w, na, idx);
    at::Tensor out = at::empty_like(x);
    take(out, true, x.scalar_type());
    return out;
}

TORCH_LIBRARY(gdnconv_intake_floor, m) {
    m.def("intake_new(Tensor x, Tensor(a!) st, Tensor w, Tensor na, Tensor idx) -> Tensor");
}
TORCH_LIBRARY_IMPL(gdnconv_intake_floor, CPU, m) { m.impl("intake_new", &intake_new); }
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args(argv)
    ext = load_inline("gdnconv_intake_floor", cpp_sources=[SOURCE], functions=["intake", "intake_new"],
                      extra_cflags=["-O2"])
    torch.set_num_threads(1)
    D, B, T, W = args.dim, args.batch, args.tokens, 4
    g = torch.Generator().manual_seed(0)
    w = gdnconv.pack_weight(torch.randn(D, W, generator=g).bfloat16())
    idx = torch.arange(B, dtype=torch.int32)
    na = torch.ones(B, dtype=torch.int32)
    st = torch.zeros(B, W - 2 + T, D).bfloat16()
    x = torch.randn(B, T, D, generator=g).bfloat16()
    out = torch.empty_like(x)
    arrays = [t.numpy() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().view(_bf16()) for t in
              (x, st, w, na, idx, out)]
    xa, sa, wa, naa, ia, oa = arrays
    kw = dict(activation="silu", num_accepted_tokens=na, conv_state_indices=idx)
    peers = {
        "C++ pybind11 intake, out given": lambda: ext.intake(x, st, w, na, idx, out),
        "C++ pybind11 intake, new out": lambda: ext.intake_new(x, st, w, na, idx),
        "C++ intake as a torch op, new out": lambda: torch.ops.gdnconv_intake_floor.intake_new(x, st, w, na, idx),
        "gdnconv on NumPy views, out given": lambda: gdnconv.conv_update_multi(
            xa, sa, wa, None, activation="silu", num_accepted_tokens=naa, conv_state_indices=ia, out=oa),
        "gdnconv on the tensors, out given": lambda: gdnconv.conv_update_multi(x, st, w, None, out=out, **kw),
        "gdnconv on the tensors, new out": lambda: gdnconv.conv_update_multi(x, st, w, None, **kw),
    }
    times = {name: [] for name in peers}
    for _ in range(args.repeats):
        for name, fn in peers.items():
            times[name].append(sample_ns(fn, args.calls) / 1e3)
    print(f"gdnconv {gdnconv.__version__}, isa {gdnconv.active_isa()}, torch {torch.__version__}; bf16 D={D} "
          f"B={B} T={T} W={W}, speculative, SiLU, pack_weight's weight; warm, 1 thread; medians of "
          f"{args.repeats} interleaved rounds of {args.calls} calls")
    for name, ts in times.items():
        print(f"  {name:36s} {statistics.median(ts):7.2f} us")


def _bf16():
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


if __name__ == "__main__":
    main()
