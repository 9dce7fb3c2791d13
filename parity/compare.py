"""Comparisons behind each claim kind (see parity/tolerances.py).

`measure(claim, actual, expected, scale=S)` returns the observed worst case in the claim's
own unit (mismatch count, ulps, eps units |a-b| / (eps S), or the largest
|a-b| / (atol + rtol|b|) ratio), so the tests and `python -m parity report` judge with one
function: a claim holds when `measure(...) <= claim.bound` (for `close`, when the ratio is
<= 1). `scale` is the array S of an `eps` claim (its `scale` field says what it is).
`assert_claim` raises an AssertionError that names the claim and shows the first
mismatches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parity.tolerances import Claim, claim

_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def as_numpy(x: Any) -> np.ndarray:
    """A NumPy array holding the same bits as `x` (NumPy array, torch tensor or scalar).

    torch dtypes NumPy lacks (bfloat16, float8_*) come across as their unsigned bit view,
    reinterpreted with ml_dtypes' types so values stay values.
    """
    if type(x).__module__.startswith("torch"):
        import ml_dtypes
        import torch

        t = x.detach().cpu()
        lacking = {
            torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
            torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
            torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
        }
        if t.dtype in lacking:
            int_dtype, np_dtype = lacking[t.dtype]
            return t.view(int_dtype).numpy().view(np_dtype)
        return t.numpy()
    return np.asarray(x)


def bit_view(x: Any) -> np.ndarray:
    """The unsigned-integer view of an array's bytes (same shape)."""
    a = np.ascontiguousarray(as_numpy(x))
    return a.view(_UINT_OF_SIZE[a.dtype.itemsize])


def _is_nan(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "ui":
        return np.zeros(a.shape, dtype=bool)
    return np.isnan(a.astype(np.float64))


def mismatches(kind: str, actual: Any, expected: Any) -> np.ndarray:
    """Boolean mask of the elements that break a `bits` or `nan_class` claim."""
    a, b = as_numpy(actual), as_numpy(expected)
    if a.shape != b.shape:
        raise AssertionError(f"shapes differ: {a.shape} vs {b.shape}")
    if a.dtype != b.dtype:
        raise AssertionError(f"dtypes differ: {a.dtype} vs {b.dtype}")
    differ = bit_view(a) != bit_view(b)
    if kind == "nan_class":
        nan_a, nan_b = _is_nan(a), _is_nan(b)
        differ = np.where(nan_a | nan_b, nan_a != nan_b, differ)
    return differ


def in_eps_units(actual: Any, expected: Any, scale: Any) -> np.ndarray:
    """|a - b| / (eps(dtype) * scale), elementwise, in float64 (0 where a == b exactly).

    The difference of two float32/float64 values within a factor 2 of each other is exact
    in float64 (Sterbenz), so the units are not blurred by the measurement itself.
    """
    a, b = as_numpy(actual), as_numpy(expected)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise AssertionError(f"shapes/dtypes differ: {a.shape} {a.dtype} vs {b.shape} {b.dtype}")
    eps = float(np.finfo(a.dtype).eps)
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    s = np.broadcast_to(np.asarray(scale, dtype=np.float64), diff.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        units = diff / (eps * s)
    return np.where(diff == 0, 0.0, units)


def max_abs_difference(actual: Any, expected: Any) -> float:
    """max |a - b| in float64 over elements that are not NaN on both sides (inf if the NaN
    sets differ): the raw number a report prints beside a close or eps claim's ratio."""
    a = as_numpy(actual).astype(np.float64)
    b = as_numpy(expected).astype(np.float64)
    if a.shape != b.shape:
        raise AssertionError(f"shapes differ: {a.shape} vs {b.shape}")
    if np.any(np.isnan(a) != np.isnan(b)):
        return float("inf")
    with np.errstate(invalid="ignore"):
        return float(np.max(np.where(np.isnan(a), 0.0, np.abs(a - b)), initial=0.0))


def measure(c: Claim, actual: Any, expected: Any, *, scale: Any = None) -> float:
    """The observed worst case of `actual` against `expected` in the claim's unit."""
    if c.kind in ("bits", "nan_class"):
        return float(np.count_nonzero(mismatches(c.kind, actual, expected)))
    if c.kind == "ulps":
        from reference.formats import get_format, ulp_distance

        return float(np.max(ulp_distance(as_numpy(actual), as_numpy(expected),
                                         get_format(c.fmt)), initial=0))
    if c.kind == "eps":
        if scale is None:
            raise ValueError(f"claim {c.id}: an eps claim is measured against its scale S "
                             f"({c.scale}); pass scale=")
        a, b = as_numpy(actual), as_numpy(expected)
        if np.any(np.isnan(a) != np.isnan(b)):
            return float("inf")
        return float(np.max(np.nan_to_num(in_eps_units(a, b, scale), nan=0.0), initial=0.0))
    if c.kind == "close":
        rtol, atol = c.bound  # type: ignore[misc]
        a = as_numpy(actual).astype(np.float64)
        b = as_numpy(expected).astype(np.float64)
        if a.shape != b.shape:
            raise AssertionError(f"shapes differ: {a.shape} vs {b.shape}")
        if np.any(np.isnan(a) != np.isnan(b)):
            return float("inf")
        with np.errstate(invalid="ignore"):
            err = np.where(np.isnan(a), 0.0, np.abs(a - b))
        return float(np.max(err / (atol + rtol * np.abs(b)), initial=0.0))
    raise ValueError(f"claim {c.id}: statistical claims are measured by their own test")


def holds(c: Claim, observed: float) -> bool:
    """Whether an observed worst case is within the claim's bound.

    For `statistical` claims the observation is the smallest p-value of the checked
    statistics, and the claim holds while it is at least the false-failure probability.
    """
    if c.kind == "close":
        return observed <= 1.0
    if c.kind == "statistical":
        return observed >= float(c.bound)  # type: ignore[arg-type]
    return observed <= float(c.bound)  # type: ignore[arg-type]


def assert_claim(claim_id: str, actual: Any, expected: Any, context: str = "", *,
                 scale: Any = None) -> float:
    """Assert the claim for these two arrays; return the observed worst case."""
    c = claim(claim_id)
    observed = measure(c, actual, expected, scale=scale)
    if not holds(c, observed):
        detail = ""
        if c.kind in ("bits", "nan_class"):
            bad = np.flatnonzero(mismatches(c.kind, actual, expected))[:5]
            a = as_numpy(actual).reshape(-1)
            b = as_numpy(expected).reshape(-1)
            ba, bb = bit_view(a), bit_view(b)
            detail = "; ".join(
                f"[{i}] {a[i]!r} (0x{int(ba[i]):x}) vs {b[i]!r} (0x{int(bb[i]):x})" for i in bad
            )
        raise AssertionError(
            f"claim {c.id} ({c.tolerance}) broken{' ' + context if context else ''}: "
            f"observed {observed:g}. {c.statement} {detail}"
        )
    return observed
