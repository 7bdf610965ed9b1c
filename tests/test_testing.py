"""gdnconv.testing: the tolerance rule at its edges (one ulp, noise, NaN, overflow) and
bitwise state comparison."""
import ml_dtypes
import numpy as np
import pytest

from gdnconv.testing import allowed_error, assert_outputs_close, assert_states_equal, error_ratio

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)])
def test_one_ulp_passes_two_fail(dtype):
    ref = np.array([1.0, 3.0, -0.75])
    ulp = np.spacing(np.abs(ref).astype(dtype)).astype(np.float64)
    mag = np.zeros(3)
    assert np.all(error_ratio((ref + ulp).astype(dtype), ref, mag, silu=False) <= 1.0)
    assert np.all(error_ratio((ref + 2 * ulp).astype(dtype), ref, mag, silu=False) > 1.0)
    with pytest.raises(AssertionError, match="3 of 3 values out of tolerance"):
        assert_outputs_close((ref + 2 * ulp).astype(dtype), ref, mag, silu=False)


def test_accumulation_noise_and_fp32_rule():
    ref, mag = np.array([1.0]), np.array([1000.0])
    tol = allowed_error(ref, mag, np.float32, silu=True)
    assert tol[0] == pytest.approx(1e-5 + 8 * 2.0 ** -24 * 1000.0 * 1.1)
    assert allowed_error(np.array([0.0]), np.array([0.0]), np.float32, silu=False)[0] == 2.0 ** -149


def test_nan_and_overflow():
    f16 = np.dtype(np.float16)
    ref = np.array([np.nan, 1e6, -1e6, 2.0])
    mag = np.zeros(4)
    ok = np.array([np.nan, np.inf, -np.inf, 2.0], f16)
    assert np.all(error_ratio(ok, ref, mag, silu=False) == 0.0)
    bad = np.array([1.0, 65504.0, -np.inf, np.nan], f16)
    assert error_ratio(bad, ref, mag, silu=False).tolist() == [np.inf, np.inf, 0.0, np.inf]


def test_states_compared_bit_for_bit():
    a = np.array([0x7FC1, 0x3F80], np.uint16).view(BF16)     # a NaN payload, 1.0
    b = np.array([0x7FC2, 0x3F80], np.uint16).view(BF16)
    assert_states_equal(a, a.copy())
    with pytest.raises(AssertionError, match="1 of 2 elements differ bitwise"):
        assert_states_equal(a, b)
