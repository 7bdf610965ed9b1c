"""What reading torch tensors costs gdnconv's Cython layer against a C++ binding doing the same checks.

    python benchmarks/bench_intake_floor.py [--dim 2048] [--batch 1] [--repeats 7]

Needs a C++ compiler and ninja: it builds, with ``torch.utils.cpp_extension.load_inline``, a
prototype that reads the tensors of one speculative ``conv_update_multi`` call (x, conv_state,
weight, num_accepted_tokens, conv_state_indices, out) as gdnconv's Cython layer does and runs the
same checks on them (CPU, strided, dtype, no pending negation; for the written ones no autograd
and no inference tensor outside inference mode; each view inside its storage), but computes
nothing. Called as a pybind11 function and as a torch op (``torch.ops``, as vLLM calls its
kernels), with a given out and with a new one (``at::empty_like``), and as a torch op built on
torch's stable C ABI alone (``STABLE_TORCH_LIBRARY``: the ``aoti_torch_*`` shim, which a binding
can resolve from the loaded libtorch at run time, so that no build against torch is needed; its
reads lack the negation bit, ``requires_grad`` and inference tensors, which such a binding would
leave to the dispatcher or check in Python), side by side with gdnconv's
core call on the same tensors and on NumPy views of the same memory (the kernel plus the NumPy
call's own fixed cost, ~1 us). Warm, one thread, medians of interleaved rounds. The question it answers: how much of a small
call's time is the Python-level tensor intake, and what a binding compiled against torch would
leave of it (issue 26's small-batch cases).
"""
import argparse
import os
import statistics
import tempfile

import numpy as np
import torch
from torch.utils.cpp_extension import load, load_inline

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

# The same reads through torch's stable C ABI: tensors come as handles (AtenTensorHandle) on the
# boxed stack, each read by shim calls (device, dtype, sizes, strides, data and storage), the out
# made by aoti_torch_empty_strided.
STABLE_SOURCE = r"""
#include <torch/csrc/stable/library.h>

static void take(AtenTensorHandle t, int32_t dtype) {
    int32_t device, dt;
    int64_t ndim, *size, *stride, offset, nbytes;
    void *data;
    aoti_torch_get_device_type(t, &device);
    aoti_torch_get_dtype(t, &dt);
    STD_TORCH_CHECK(device == aoti_torch_device_type_cpu() && dt == dtype, "a CPU tensor of the dtype");
    aoti_torch_get_dim(t, &ndim);
    aoti_torch_get_sizes(t, &size);
    aoti_torch_get_strides(t, &stride);
    aoti_torch_get_data_ptr(t, &data);
    aoti_torch_get_storage_offset(t, &offset);
    aoti_torch_get_storage_size(t, &nbytes);
    const int64_t e = aoti_torch_dtype_element_size(dt);
    int64_t lo = 0, hi = 0;
    for (int64_t i = 0; i < ndim; i++) {
        if (size[i] == 0) return;
        (stride[i] < 0 ? lo : hi) += (size[i] - 1) * stride[i];
    }
    STD_TORCH_CHECK(offset + lo >= 0 && (offset + hi + 1) * e <= nbytes, "inside its storage");
}

// x, st, w, na, idx -> out
static void intake_new(StableIValue *stack, uint64_t, uint64_t) {
    AtenTensorHandle t[5];
    for (int i = 0; i < 5; i++) t[i] = reinterpret_cast<AtenTensorHandle>(stack[i]);
    int32_t dt, wdt;
    aoti_torch_get_dtype(t[0], &dt);
    aoti_torch_get_dtype(t[2], &wdt);
    take(t[0], dt);
    take(t[1], dt);
    take(t[2], wdt);
    take(t[3], aoti_torch_dtype_int32());
    take(t[4], aoti_torch_dtype_int32());
    int64_t ndim, *size, *stride;
    aoti_torch_get_dim(t[0], &ndim);
    aoti_torch_get_sizes(t[0], &size);
    aoti_torch_get_strides(t[0], &stride);
    AtenTensorHandle out;
    aoti_torch_empty_strided(ndim, size, stride, dt, aoti_torch_device_type_cpu(), 0, &out);
    take(out, dt);
    for (int i = 0; i < 5; i++) aoti_torch_delete_tensor_object(t[i]);
    stack[0] = reinterpret_cast<StableIValue>(out);
}

STABLE_TORCH_LIBRARY(gdnconv_intake_stable, m) {
    m.def("intake_new(Tensor x, Tensor(a!) st, Tensor w, Tensor na, Tensor idx) -> Tensor");
}
STABLE_TORCH_LIBRARY_IMPL(gdnconv_intake_stable, CPU, m) { m.impl("intake_new", &intake_new); }
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
    with tempfile.TemporaryDirectory() as tmp:   # (load_inline would include torch/extension.h)
        src = os.path.join(tmp, "gdnconv_intake_stable.cpp")
        with open(src, "w") as f:
            f.write(STABLE_SOURCE)
        load("gdnconv_intake_stable", [src], is_python_module=False,
             extra_cflags=["-O2", "-DTORCH_TARGET_VERSION=0x020a000000000000"])
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
        "stable-ABI intake as a torch op, new out": lambda: torch.ops.gdnconv_intake_stable.intake_new(
            x, st, w, na, idx),
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
        print(f"  {name:42s} {statistics.median(ts):7.2f} us")


def _bf16():
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


if __name__ == "__main__":
    main()
