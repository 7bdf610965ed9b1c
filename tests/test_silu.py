"""SiLU through the kernel against the float64 reference, in units in the last place.

Every 16-bit input bit pattern (bf16 and fp16, 65,536 each) and a dense fp32 sweep go
through ``conv_update_multi`` (the fp32 sweep also through ``conv_prefill``, whose SIMD
kernels share the SiLU) with weights ``[0, .., 0, 1]`` per channel, no bias and
a zero state: the convolution is then exact (``0 * 0`` sums plus ``1 * x``), so the
pre-activation is ``x`` itself and any error is the SiLU's. The patterns are laid
across the channels of ``D = 4099`` (whole SIMD lines plus a tail that the portable
core takes) and across requests and tokens; non-finite patterns go to the last token
of each request only, so that they never sit in a window where ``0 * inf`` would make
a NaN. The accumulation-noise term of ``gdnconv.testing`` is zero here and the test
is stricter: the output must be within one ulp of the reference rounded to the
output dtype, counting steps between representable values (subnormals included,
+0 and -0 the same), and NaN exactly where the reference is NaN (NaN in, and -inf
in: ``-inf * sigmoid(-inf)`` is ``-inf * 0``; +inf gives +inf). Every fp32 input,
all 2^32, is checked by benchmarks/silu_exhaustive.c (minutes, so not here).
"""
import numpy as np
import pytest

import gdnconv
from gdnconv.reference import silu
from conftest import BF16, F16, F32, from_bits

D, T, W = 4099, 4, 4
_UINT = {2: np.uint16, 4: np.uint32}


def ulp_steps(a, b):
    """|a - b| in steps between representable values of their (common) float dtype;
    +0 and -0 are the same value. Signed magnitudes map onto one integer line."""
    def line(v):
        u = v.view(_UINT[v.dtype.itemsize]).astype(np.int64)
        top = 8 * v.dtype.itemsize - 1
        mag = u & ((1 << top) - 1)
        return np.where(u >> top, -mag, mag)
    return np.abs(line(np.asarray(a)) - line(np.asarray(b)))


def silu_through_kernel(vals, prefill=False):
    """silu of each value of the 1-D array vals (dtype of the call) computed by the kernel:
    ``conv_update_multi`` from a zero state, or ``conv_prefill`` from zero history."""
    dt, n = vals.dtype, vals.size
    B = -(-n // (T * D))
    x = np.zeros((B, T, D), dt)
    last = np.broadcast_to(np.arange(T)[None, :, None] == T - 1, x.shape).ravel()
    slots = np.argsort(last, kind="stable")[x.size - n:]     # the last tokens' positions last
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(vals.astype(np.float64))
    order = np.argsort(~finite, kind="stable")                  # the non-finite values last
    assert (~finite).sum() <= B * D
    x.reshape(-1)[slots] = vals[order]
    w = np.zeros((D, W), dt)
    w[:, -1] = 1
    if prefill:
        out = gdnconv.conv_prefill(x, w, None, activation="silu")
    else:
        out = gdnconv.conv_update_multi(x, np.zeros((B, W - 1, D), dt), w, None, activation="silu")
    res = np.empty(n, dt)
    res[order] = out.reshape(-1)[slots]
    return res


def check_silu(vals, max_steps=1, prefill=False):
    """The kernel's silu of vals against the reference rounded to vals' dtype: NaN exactly
    where the reference is NaN, elsewhere at most max_steps ulp; returns the steps."""
    got = silu_through_kernel(vals, prefill)
    with np.errstate(invalid="ignore"):
        exact = silu(vals.astype(np.float64))
    want = exact.astype(vals.dtype)
    nan = np.isnan(exact)
    got_nan = np.isnan(got.astype(np.float64))
    assert np.array_equal(got_nan, nan), f"NaN where the reference is not (or not where it is): " \
        f"inputs {vals[got_nan != nan][:8]}"
    steps = ulp_steps(got[~nan], want[~nan])
    bad = steps > max_steps
    assert not bad.any(), (f"{bad.sum()} outputs over {max_steps} ulp, worst {steps.max()}: inputs "
                           f"{vals[~nan][bad][:8]}, got {got[~nan][bad][:8]}, reference {exact[~nan][bad][:8]}")
    return steps


def test_ulp_steps():
    """The measure can fail: -0 for x = -89 in bf16 (the exact -1.98e-37 is a normal bf16)
    is many steps away; neighbours are one step, across zero and across a binade too."""
    want = np.array([silu(np.float64(-89.0))]).astype(BF16)
    assert ulp_steps(np.array([-0.0], BF16), want)[0] > 100
    assert ulp_steps(np.array([0.0], F32), np.array([-0.0], F32))[0] == 0
    assert ulp_steps(from_bits([1], F16), from_bits([0x8001], F16))[0] == 2
    assert ulp_steps(np.array([1.0], F32), np.array([np.nextafter(np.float32(1), np.float32(0))]))[0] == 1


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_every_16bit_input(isa, dtype):
    """All 65,536 bit patterns: within one ulp (the tails included: bf16 results of
    x in [-97.4, -88.7] are normal or subnormal bf16, not -0)."""
    dt = BF16 if dtype == "bf16" else F16
    vals = from_bits(np.arange(1 << 16), dt)
    steps = check_silu(vals)
    if dtype == "bf16":   # the former -0 range comes out nonzero
        v = vals.astype(F32)
        with np.errstate(invalid="ignore"):
            tail = (v > -97.0) & (v < -88.0)
        got = silu_through_kernel(vals[tail])
        assert (got.astype(np.float64) < 0).all()
    assert steps.max() <= 1


def fp32_sweep():
    """Every 2048th fp32 bit pattern (both signs, zeros, subnormals, huge values, inf,
    NaN), every 512th in [-20, 20] (the main range) and every 4th in [-110, -80]
    (normal, subnormal and underflowing results), and the extremes: 5.2 million."""
    def between(a, b, every):
        lo, hi = np.array([a, b], F32).view(np.uint32).astype(np.int64)
        return np.arange(lo, hi + 1, every).astype(np.uint32)
    step = np.arange(0, 1 << 32, 1 << 11, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0, 0x80000000, 1, 0x80000001, 0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000,
                      0x7fc00000, 0xffc00000, 0x7f800001], np.uint32)
    parts = [step, between(0.0, 20.0, 512), between(-0.0, -20.0, 512), between(-80.0, -110.0, 4), edges]
    return from_bits(np.concatenate(parts), F32)


def test_fp32_sweep(isa):
    """fp32 (fp32_sweep) through the update: within one ulp, NaN where the reference is
    (NaN and -inf in); the results of x below ~-104 underflow to -0 as the reference's."""
    vals = fp32_sweep()
    steps = check_silu(vals)
    assert steps.max() <= 1
    tail = silu_through_kernel(np.array([-87.0, -100.0, -103.9, -104.0, -120.0, -1e30], F32))
    assert (tail[:4] < 0).all() and np.array_equal(tail[4:].view(np.uint32), [0x80000000] * 2)


def test_fp32_prefill(isa):
    """The same through conv_prefill (its own SIMD loop around the shared SiLU)."""
    vals = fp32_sweep()[::4]
    assert check_silu(vals, prefill=True).max() <= 1
