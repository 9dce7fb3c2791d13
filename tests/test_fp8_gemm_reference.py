"""reference.fp8_gemm against exact rational arithmetic: the GEMM is the exact product of
the dequantized operands within half a float32 ulp and float64's gamma_K (NOTE [ Accumulate
in float64, round once ]); dequantize against ml_dtypes' own widening; the errors it names
(the trees' agreement is parity/test_fp8_gemm.py)."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from parity.claims.fp8_gemm_bounds import U32, U64, gamma
from reference import fp8_gemm as rgemm


def _fp8(shape: tuple[int, int], dtype: type, rng: np.random.Generator) -> np.ndarray:
    codes = rng.integers(0, 256, shape).astype(np.uint8)
    x = codes.view(dtype)
    return np.where(np.isfinite(x.astype(np.float32)), x, dtype(1.5)).astype(dtype)


@pytest.mark.parametrize("rowwise", [False, True])
def test_scaled_mm_is_the_exact_product_rounded_once(rowwise: bool) -> None:
    """|Y - E| <= u |E| + gamma_K(2^-53) (1 + u) |A||B|, E exact (Fractions), every code of
    both formats among the operands; and Y is a float32 array."""
    rng = np.random.default_rng(5)
    m, k, n = 6, 48, 5
    a = _fp8((m, k), ml_dtypes.float8_e4m3fn, rng)
    b = _fp8((k, n), ml_dtypes.float8_e5m2, rng)
    sa = rng.uniform(0.1, 3, (m, 1) if rowwise else ()).astype(np.float32)
    sb = rng.uniform(0.1, 3, (1, n) if rowwise else ()).astype(np.float32)
    y = rgemm.scaled_mm(a, b, sa, sb)
    assert y.dtype == np.float32 and y.shape == (m, n)
    big_a, big_b = rgemm.dequantize(a, sa), rgemm.dequantize(b, sb)  # float32 operands
    fa = [[Fraction(float(v)) for v in row] for row in big_a]
    fb = [[Fraction(float(v)) for v in row] for row in big_b.T]
    worst = 0.0
    for i in range(m):
        for j in range(n):
            exact = sum((p * q for p, q in zip(fa[i], fb[j], strict=True)), Fraction(0))
            p_ij = float(np.abs(big_a[i].astype(np.float64)) @ np.abs(big_b[:, j].astype(
                np.float64)))
            bound = U32 * abs(float(exact)) + gamma(k, U64) * (1 + U32) * p_ij
            err = abs(Fraction(float(y[i, j])) - exact)
            slack = 1 + 2 * k * U64  # the bound is itself a float64 sum of k terms
            assert err <= Fraction(bound) * Fraction(slack), (i, j, float(err), bound)
            worst = max(worst, float(err) / bound if bound else 0.0)
    assert worst > 0.1, "guard: the final rounding was seen"


def test_dequantize_is_ml_dtypes_widening_times_the_scale() -> None:
    """Every code of both formats: decode is ml_dtypes' own value (NaN as NaN)."""
    codes = np.arange(256, dtype=np.uint8)
    for dtype in rgemm.FP8_FORMATS.values():
        ours = rgemm.dequantize(codes.view(dtype), np.float32(1))
        theirs = codes.view(dtype).astype(np.float32)
        assert np.array_equal(ours, theirs, equal_nan=True)


def test_bad_input_is_refused_naming_the_problem() -> None:
    a = np.ones((2, 32), np.float32).astype(ml_dtypes.float8_e4m3fn)
    b = np.ones((32, 3), np.float32).astype(ml_dtypes.float8_e4m3fn)
    one = np.float32(1)
    with pytest.raises(TypeError, match="a must be float8_e4m3fn or float8_e5m2, got float32"):
        rgemm.scaled_mm(np.ones((2, 32), np.float32), b, one, one)
    with pytest.raises(ValueError, match=r"a \(M, K\) and b \(K, N\) expected"):
        rgemm.scaled_mm(a, a, one, one)
    with pytest.raises(TypeError, match="scale_a must be float32, got float64"):
        rgemm.scaled_mm(a, b, 1.0, one)
    with pytest.raises(ValueError, match=r"of shape \(2, 1\) \(rowwise\)"):
        rgemm.scaled_mm(a, b, np.ones((1, 2), np.float32), one)
    with pytest.raises(TypeError, match="a must be float32, got float64"):
        rgemm.matmul_f32(np.ones((2, 2)), np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match=r"matmul_f32: a \(M, K\) and b \(K, N\) expected"):
        rgemm.matmul_f32(np.ones((2, 3), np.float32), np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match=r"mx_matmul: a \(M, K\)"):
        rgemm.mx_matmul(np.ones((2, 32), np.float32), np.ones((3, 2), np.float32),
                        "float8_e4m3fn")
