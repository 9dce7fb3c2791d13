"""Strategies for the fp8_gemm claims: GEMM shapes (K from 1, not only the multiples of 16
the CUDA kernels need), operand formats (each operand's over the declared range,
common/arg_ranges.py: GEMM_FORMATS), scale kinds and sign patterns; and the edge table
of scale_result (`scale_result_edges`), where dividing by it is not multiplying by its
float32 reciprocal."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from common.arg_ranges import GEMM_FORMATS
from parity.strategies.edges import declared_values

# the pairs the parametrized tests run: each format with itself, and one mixed pair (the
# strategy below draws each operand's format over the whole declared range)
FORMAT_PAIRS = (("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e5m2"),
                ("float8_e4m3fn", "float8_e5m2"))  # (a's format, b's)
GEMM_EDGES = ("k_one", "odd_k", "vector_out", "mixed_formats", "rowwise", "mixed_signs")
# not powers of two (1 / s would be exact); 1/448 is the float32 scale of an e4m3 amax of 1
SCALE_RESULTS = (0.75, 0.3, float(np.float32(1) / np.float32(448)))
_NEAR = 4  # float32 neighbours tried on each side of f32(m * s)


@st.composite
def fp8_gemm_cases(draw: st.DrawFn) -> tuple[dict, list[str]]:
    """(keyword arguments of parity.drivers.fp8_gemm.fp8_case, the edges they reach)."""
    m, n = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    k = draw(st.integers(1, 300))
    fmts = (draw(declared_values(GEMM_FORMATS)), draw(declared_values(GEMM_FORMATS)))
    rowwise, same_sign = draw(st.booleans()), draw(st.booleans())
    case = {"m": m, "k": k, "n": n, "fmts": fmts, "rowwise": rowwise,
            "seed": draw(st.integers(0, 2**32 - 1)), "same_sign": same_sign}
    edges = [name for name, hit in (
        ("k_one", k == 1), ("odd_k", k % 2 == 1), ("vector_out", min(m, n) == 1),
        ("mixed_formats", fmts[0] != fmts[1]), ("rowwise", rowwise),
        ("mixed_signs", not same_sign)) if hit]
    return case, edges


def scale_result_edges(fmt: str, scale_result: float) -> np.ndarray:
    """Every float32 x, positive and negative, within _NEAR ulps of f32(m * s) for a
    midpoint m between two adjacent finite values of fp8 format `fmt`, s = scale_result,
    where the fp8 cast of f32(x / s) and of f32(x * f32(1 / s)) are different codes.

    The two quotients differ by at most an ulp of float32, and the cast to fp8 drops 20 or
    more of their bits, so they part only across an fp8 rounding boundary (a midpoint, or
    on it: ties go to even): the search is exact, by float32 and ml_dtypes arithmetic, over
    every such boundary of the format. Empty where 1 / s is exact (s a power of two)."""
    dtype = getattr(ml_dtypes, fmt)
    s = np.float32(scale_result)
    r = np.float32(1) / s  # torch's C++ `1 / output_scale` in float
    values = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
    v = np.unique(values[np.isfinite(values) & (values > 0)])
    mid = ((v[:-1].astype(np.float64) + v[1:]) / 2).astype(np.float32)  # exact: 5 bits
    lo = hi = mid * s
    near = [lo]
    for _ in range(_NEAR):
        lo, hi = np.nextafter(lo, np.float32(0)), np.nextafter(hi, np.float32(np.inf))
        near += [lo, hi]
    x = np.unique(np.concatenate(near))
    x = np.concatenate([x, -x])
    by_div, by_mul = (x / s).astype(dtype), (x * r).astype(dtype)
    return x[by_div.view(np.uint8) != by_mul.view(np.uint8)]
