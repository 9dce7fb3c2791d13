"""Every ranged argument of the fp8 scaling twins at each edge of its declared range
(common/fp8_recipes.py: FP8_FORMATS, MARGINS, AMAX_ALGOS, DELAYED_ORDERS, HISTORY_LENGTHS;
an axis in [-ndim, ndim); the power_of_2 flag) and one past it: both trees give the same
bits or the same one-line error (claims fp8_scaling.current_trees and delayed_trees), and a
value outside its range is refused. HISTORY_LENGTHS' upper edge is memory's, not a check's:
lengths 1, 2 and 1024 are parity/test_fp8_scaling.py's. The strategies that draw these
arguments read the same ranges (test_the_fp8_strategies_reach_every_declared_edge)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, settings

from common.fp8_recipes import AMAX_ALGOS, DELAYED_ORDERS, FP8_FORMATS, HISTORY_LENGTHS, MARGINS
from parity.drivers.edges import judge, outcome, to_torch
from parity.strategies.edges import edges
from parity.strategies.fp8_scaling import fp8_histories, fp8_tensors
from reference import fp8_scaling as rfp8
from torch_impl import fp8_scaling as tfp8

X = np.array([[1.0, -2.0, 0.0], [3.0e-3, 0.5, 7.0e4]], np.float32)  # (2, 3)
SCALE = np.array([1.0, 0.25, 2.0**20], np.float32)  # (3,)
HISTORY = np.array([[3.0, 0.0, 1e-30], [1.0, 2.0, 5.0]], np.float32)  # (L=2, n=3)
FLAGS = (("True", True, True), ("False", False, True), ("a truthy int", 1, False))
E4M3 = "float8_e4m3fn"

# (function, positional arguments, whether every argument is inside its declared range)
Case = tuple[str, tuple[Any, ...], bool]


def _cases() -> dict[str, Case]:
    c: dict[str, Case] = {}
    for label, axis, inside in [("None", None, True), *edges(range(-X.ndim, X.ndim))]:
        c[f"tensor_amax axis {label}"] = "tensor_amax", (X, axis), inside
        c[f"current_scaling axis {label}"] = "current_scaling", (X, E4M3, axis), inside
    for label, fmt, inside in edges(FP8_FORMATS):
        c[f"amax_to_scale fmt {label}"] = "amax_to_scale", (SCALE, fmt), inside
        c[f"cast_to_fp8 fmt {label}"] = "cast_to_fp8", (X, SCALE, fmt), inside
        c[f"current_scaling fmt {label}"] = "current_scaling", (X, fmt, -1), inside
        c[f"delayed_scale fmt {label}"] = "delayed_scale", (SCALE, SCALE, fmt), inside
        c[f"delayed_update fmt {label}"] = "delayed_update", (HISTORY, SCALE, fmt), inside
    for label, flag, inside in FLAGS:
        c[f"amax_to_scale power_of_2 {label}"] = "amax_to_scale", (SCALE, E4M3, flag), inside
        c[f"current_scaling power_of_2 {label}"] = "current_scaling", (X, E4M3, 0, flag), inside
    for label, margin, inside in edges(MARGINS):
        for order in DELAYED_ORDERS:
            c[f"delayed_scale margin {label} {order}"] = "delayed_scale", (
                SCALE, SCALE, E4M3, margin, order), inside
            c[f"delayed_update margin {label} {order}"] = "delayed_update", (
                HISTORY, SCALE, E4M3, margin, "max", order), inside
    for label, order, inside in edges(DELAYED_ORDERS):
        c[f"delayed_scale order {label}"] = "delayed_scale", (SCALE, SCALE, E4M3, 0, order), inside
        c[f"delayed_update order {label}"] = "delayed_update", (
            HISTORY, SCALE, E4M3, 0, "max", order), inside
    for label, algo, inside in edges(AMAX_ALGOS):
        c[f"delayed_update algo {label}"] = "delayed_update", (
            HISTORY, SCALE, E4M3, 0, algo), inside
    for label, length, inside in edges(HISTORY_LENGTHS)[::2]:  # the lower edge, one below
        history = np.resize(HISTORY, (length, 3)).astype(np.float32)
        c[f"delayed_update history length {label}"] = "delayed_update", (
            history, SCALE, E4M3), inside
    return c


CASES = _cases()


@pytest.mark.parametrize("case", list(CASES))
def test_each_argument_at_each_declared_edge_is_the_same_in_both_trees(case: str,
                                                                       device: str) -> None:
    """Each argument alone at each edge of its range: the same bits or the same error line."""
    fn, args, inside = CASES[case]
    ref = outcome(lambda: getattr(rfp8, fn)(*args))
    tor = outcome(lambda: getattr(tfp8, fn)(*to_torch(args, device)))
    assert inside or ref.error is not None, f"{case}: accepted outside its declared range"
    claim = "fp8_scaling.delayed_trees" if fn.startswith("delayed") else \
        "fp8_scaling.current_trees"
    judge(claim, ref, tor, case)


def _finds(strategy: Any, condition: Any) -> None:
    find(strategy, condition, settings=settings(
        max_examples=2000, database=None, derandomize=True, phases=[Phase.generate],
        suppress_health_check=list(HealthCheck)))


def test_the_fp8_strategies_reach_every_declared_edge() -> None:
    """fp8_histories draws the margin at both edges of MARGINS, every algo and format;
    fp8_tensors every format and both flags. A strategy drawing from a narrower, hard-coded
    range than the check's never reaches an edge, and fails here."""
    for margin in (MARGINS[0], MARGINS[-1]):
        _finds(fp8_histories(), lambda h, m=margin: h["margin"] == m)
    for algo in AMAX_ALGOS:
        _finds(fp8_histories(), lambda h, a=algo: h["algo"] == a)
    for fmt in FP8_FORMATS:
        _finds(fp8_histories(), lambda h, f=fmt: h["fmt"] == f)
        _finds(fp8_tensors(), lambda t, f=fmt: t[1] == f)
