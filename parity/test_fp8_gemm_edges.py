"""Every argument of the fp8_gemm twins (dequantize, matmul_f32, scaled_mm, mx_matmul) at each
edge of its declared range (common/arg_ranges.py: GEMM_FORMATS, SCALE_DTYPES, MATMUL_DTYPES;
common/mx_ranges.py for mx_matmul's format, mode and variant) and one past it, and the
shapes at theirs (K of 0 and 1, one row, one column, no rows; a vector, three dimensions and
a K that does not match refused; a scale one value, rowwise, or of another shape): both
trees give the same one-line error, or values equal as the function's claim compares them
(fp8_gemm.dequantize NaN as a class; fp8_gemm.reference and fp8_gemm.mx_twins within the
derived GEMM bound). The strategy that draws the GEMM cases reads the declared formats."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, settings

from common import mx_ranges
from common.arg_ranges import GEMM_FORMATS, MATMUL_DTYPES, SCALE_DTYPES
from parity.claims.fp8_gemm_bounds import gemm_scale
from parity.drivers.edges import judge, outcome, to_torch
from parity.strategies.edges import UNKNOWN, edges
from parity.strategies.fp8_gemm import fp8_gemm_cases
from reference import fp8_gemm as rgemm
from reference import mx as rmx
from torch_impl import fp8_gemm as tgemm

CLAIM = {"dequantize": "fp8_gemm.dequantize", "matmul_f32": "fp8_gemm.reference",
         "scaled_mm": "fp8_gemm.reference", "mx_matmul": "fp8_gemm.mx_twins"}
OTHER_DTYPE = {"float8_e4m3fn": "float16", "float32": "float64"}  # a declared one's unknown
_RNG = np.random.default_rng(11)
M, K, N = 2, 3, 4


def _array(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Values |x| in [2^-4, 2^4) of either sign, rounded to `dtype` (ml_dtypes for fp8)."""
    x = _RNG.choice([-1.0, 1.0], shape) * np.exp2(_RNG.uniform(-4, 4, shape))
    return np.asarray(x).astype(getattr(ml_dtypes, dtype, None) or np.dtype(dtype))


def _dtypes(declared: tuple[str, ...]) -> list[tuple[str, str, bool]]:
    """(label, dtype name, inside): each member, and another dtype for the unknown one."""
    return [(label, OTHER_DTYPE[declared[0]] if v == UNKNOWN else str(v), inside)
            for label, v, inside in edges(declared)]


Case = tuple[str, tuple[Any, ...], bool]  # (function, positional arguments, all inside)


def _dequantize_cases() -> dict[str, Case]:
    c: dict[str, Case] = {}
    one = np.full((), 1.5, np.float32)
    for label, fmt, inside in _dtypes(GEMM_FORMATS):
        c[f"dequantize x {label}"] = "dequantize", (_array((M, K), fmt), one), inside
    for label, dt, inside in _dtypes(SCALE_DTYPES):
        c[f"dequantize scale {label}"] = "dequantize", (
            _array((M, K), "float8_e5m2"), np.ones((M, 1), dt) * 0.75), inside
    for shape, inside in (((), True), ((M, 1), True), ((1, K), True), ((M, K), True),
                          ((K,), True), ((M,), False), ((1, M, K), False)):
        c[f"dequantize scale of shape {shape}"] = "dequantize", (
            _array((M, K), "float8_e4m3fn"), np.full(shape, 3.0, np.float32)), inside
    for shape in ((), (0, K), (1,)):
        c[f"dequantize x of shape {shape}"] = "dequantize", (
            _array(shape, "float8_e4m3fn"), one), True
    return c


def _matmul_cases() -> dict[str, Case]:
    c: dict[str, Case] = {}
    for label, dt, inside in _dtypes(MATMUL_DTYPES):
        c[f"matmul_f32 a {label}"] = "matmul_f32", (
            _array((M, K), dt), _array((K, N), "float32")), inside
        c[f"matmul_f32 b {label}"] = "matmul_f32", (
            _array((M, K), "float32"), _array((K, N), dt)), inside
    for a, b, inside in _SHAPES:
        c[f"matmul_f32 shapes {a} x {b}"] = "matmul_f32", (
            _array(a, "float32"), _array(b, "float32")), inside
    return c


# (a's shape, b's, whether they multiply): K of 0 and 1, one row, one column, no rows
_SHAPES = (((M, 0), (0, N), True), ((M, 1), (1, N), True), ((1, K), (K, N), True),
           ((M, K), (K, 1), True), ((0, K), (K, N), True), ((M, K), (M, N), False),
           ((K,), (K, N), False), ((1, M, K), (K, N), False))


def _scaled_mm_cases() -> dict[str, Case]:
    c: dict[str, Case] = {}
    one = np.ones((), np.float32)
    for label, fmt, inside in _dtypes(GEMM_FORMATS):
        c[f"scaled_mm a {label}"] = "scaled_mm", (
            _array((M, K), fmt), _array((K, N), "float8_e5m2"), one, one), inside
        c[f"scaled_mm b {label}"] = "scaled_mm", (
            _array((M, K), "float8_e5m2"), _array((K, N), fmt), one, one), inside
    for label, dt, inside in _dtypes(SCALE_DTYPES):
        for i, name in ((2, "scale_a"), (3, "scale_b")):
            args: list[Any] = [_array((M, K), "float8_e4m3fn"),
                               _array((K, N), "float8_e4m3fn"), one, one]
            args[i] = np.full((), 0.25, dt)
            c[f"scaled_mm {name} {label}"] = "scaled_mm", tuple(args), inside
    for sa, sb, inside in (((M, 1), (1, N), True), ((1, 1, 1), (1,), True),
                           ((M,), (), False), ((1, M), (), False), ((), (N, 1), False),
                           ((), (N,), False)):
        c[f"scaled_mm scales of shapes {sa} and {sb}"] = "scaled_mm", (
            _array((M, K), "float8_e4m3fn"), _array((K, N), "float8_e4m3fn"),
            np.full(sa, 0.5, np.float32), np.full(sb, 2.0, np.float32)), inside
    for a, b, inside in _SHAPES:
        c[f"scaled_mm shapes {a} x {b}"] = "scaled_mm", (
            _array(a, "float8_e4m3fn"), _array(b, "float8_e5m2"), one, one), inside
    return c


def _mx_cases() -> dict[str, Case]:
    c: dict[str, Case] = {}
    a, b = _array((M, 64), "float32"), _array((64, N), "float32")
    for label, fmt, inside in edges(mx_ranges.ELEMENT_FORMATS):
        c[f"mx_matmul fmt {label}"] = "mx_matmul", (a, b, fmt, "floor", "ocp"), inside
    for label, mode, inside in edges(mx_ranges.SCALE_MODES):
        c[f"mx_matmul mode {label}"] = "mx_matmul", (a, b, "float8_e4m3fn", mode, "ocp"), inside
    for label, variant, inside in edges(mx_ranges.VARIANTS):
        c[f"mx_matmul variant {label}"] = "mx_matmul", (
            a, b, "float8_e5m2", None, variant), inside
    c["mx_matmul a variant's contradicting mode"] = "mx_matmul", (
        a, b, "float8_e4m3fn", "floor", "transformer_engine"), False
    for sa, sb, inside in (((M, 32), (32, N), True), ((M, 16), (16, N), False),
                           ((M, 64), (32, N), False), ((64,), (64, N), False)):
        c[f"mx_matmul shapes {sa} x {sb}"] = "mx_matmul", (
            _array(sa, "float32"), _array(sb, "float32"), "float6_e2m3fn", "floor",
            "ocp"), inside
    return c


CASES = {**_dequantize_cases(), **_matmul_cases(), **_scaled_mm_cases(), **_mx_cases()}


def _scale(fn: str, args: tuple[Any, ...]) -> np.ndarray | None:
    """S of the GEMM bound from the reference's float32 operands, for the GEMM claims."""
    if fn == "matmul_f32":
        return gemm_scale(*args)
    if fn == "scaled_mm":  # a scale of one element is one value, whatever its shape
        sa, sb = (s.reshape(()) if s.size == 1 else s for s in args[2:])
        return gemm_scale(rgemm.dequantize(args[0], sa), rgemm.dequantize(args[1], sb))
    if fn == "mx_matmul":
        a, b, fmt, mode, variant = args
        a_hp = rmx.from_mx(rmx.to_mx(a, fmt, mode, variant=variant))
        b_hp = rmx.from_mx(rmx.to_mx(np.ascontiguousarray(b.T), fmt, mode, variant=variant)).T
        return gemm_scale(a_hp, b_hp)
    return None


@pytest.mark.parametrize("case", list(CASES))
def test_each_argument_at_each_declared_edge_is_the_same_in_both_trees(case: str,
                                                                       device: str) -> None:
    """Each format, dtype, scale shape, element format, mode and variant, and an unknown
    one, and the shapes at their edges: the same values within the claim, or the same
    error line."""
    fn, args, inside = CASES[case]
    ref = outcome(lambda: getattr(rgemm, fn)(*args))
    tor = outcome(lambda: getattr(tgemm, fn)(*to_torch(args, device)))
    assert inside == (ref.error is None), f"{case}: inside {inside}, reference {ref.error}"
    judge(CLAIM[fn], ref, tor, case, scale=_scale(fn, args) if ref.error is None else None)


def test_the_gemm_strategy_reaches_every_declared_format() -> None:
    """fp8_gemm_cases draws each declared format for a and for b, and both kinds of scale."""
    for i in (0, 1):
        for fmt in GEMM_FORMATS:
            find(fp8_gemm_cases(), lambda c, i=i, f=fmt: c[0]["fmts"][i] == f,
                 settings=settings(max_examples=500, database=None, derandomize=True,
                                   phases=[Phase.generate],
                                   suppress_health_check=list(HealthCheck)))
