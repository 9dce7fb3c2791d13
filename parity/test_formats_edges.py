"""Every ranged argument of the formats twins (encode, quantize, decode) at each edge of its
declared range (common/arg_ranges.py, common/format_spec.py's FORMATS): each member of an
enumeration and one unknown, the integer ranges' edges and one past each. Both trees give
the same codes or the same one-line error (claim formats.contract: a contract is exact),
or the same values, NaN as a class (claim formats.decode: quantize is decode of the codes);
a value outside its range is refused. The strategies that draw these arguments read the
same ranges (test_the_format_strategies_reach_every_declared_edge)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, settings

from common.arg_ranges import (
    DECODE_DTYPES,
    OVERFLOW_POLICIES,
    RANDOM_WORDS,
    ROUNDING_MODES,
    VIAS,
)
from common.format_spec import FORMATS
from parity.drivers.edges import judge, outcome, to_torch
from parity.strategies.edges import UNKNOWN, edges
from parity.strategies.formats import rounding_arguments
from reference import formats as rf
from torch_impl import formats as tf

# no negative value: float8_e8m0fnu has no sign, and torch's cast gives a negative x |x|'s
# code where the reference gives NaN (a declared difference, claim formats.e8m0_torch)
X32 = np.array([1.5, 0.0, 2.0**-30, 0.1, 1e30, np.inf, 3.0e38, 2.0**-140], np.float32)
X64 = X32.astype(np.float64) + np.array([0, 0, 0, 2.0**-60, 0, 0, 0, 0])
FLAG_EDGES = (("True", True, True), ("False", False, True), ("a truthy int", 1, False))
OVERFLOW_FORMATS = ("float16", "float8_e4m3fn", "float4_e2m1fn", "float8_e8m0fnu")

# (function, keyword arguments: x or codes, fmt, ...; whether the argument is inside its
# declared range: one outside it must be refused)
Case = tuple[str, dict[str, Any], bool]


def _rounding_cases(fn: str) -> dict[str, Case]:
    """encode/quantize (`fn`): each argument alone at each of its edges."""
    cases: dict[str, Case] = {}
    base = {"x": X32, "fmt": "float16"}
    for label, fmt, inside in edges(tuple(FORMATS)):
        cases[f"{fn} fmt {label}"] = fn, {**base, "fmt": fmt}, inside
    for label, mode, inside in edges(ROUNDING_MODES):
        words = {"random_bits": np.arange(X32.size, dtype=np.int64)} if mode == "stochastic" \
            else {}
        cases[f"{fn} rounding {label}"] = fn, {**base, "rounding": mode, **words}, inside
    for fmt in OVERFLOW_FORMATS:
        for label, policy, inside in edges(OVERFLOW_POLICIES):
            cases[f"{fn} {fmt} overflow {label}"] = fn, {**base, "fmt": fmt,
                                                         "overflow": policy}, inside
    for label, flag, inside in FLAG_EDGES:
        cases[f"{fn} subnormals {label}"] = fn, {**base, "fmt": "float8_e5m2",
                                                  "subnormals": flag}, inside
    for label, via, inside in [("None", None, True), *edges(VIAS)]:
        cases[f"{fn} via {label}"] = fn, {**base, "x": X64, "fmt": "bfloat16",
                                          "via": via}, inside
    for label, word, inside in edges(RANDOM_WORDS):
        cases[f"{fn} random word {label}"] = fn, {
            **base, "rounding": "stochastic",
            "random_bits": np.full(X32.shape, word, dtype=np.int64)}, inside
    return cases


def _decode_cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    for label, fmt, inside in edges(tuple(FORMATS)):
        bits = FORMATS[fmt].bits if inside else 8
        for code_label, code, code_inside in edges(range(0, 2**bits)):
            cases[f"decode fmt {label} code {code_label}"] = "decode", {
                "codes": np.array([code, 1], dtype=np.int64), "fmt": fmt}, inside and code_inside
    for label, dtype, inside in edges(DECODE_DTYPES):
        cases[f"decode dtype {label}"] = "decode", {
            "codes": np.arange(4, dtype=np.int64), "fmt": "float8_e4m3fn", "dtype": dtype}, inside
    return cases


CASES = {**_rounding_cases("encode"), **_rounding_cases("quantize"), **_decode_cases()}


def _dtype(name: object, torch_side: bool) -> object:
    """A decode dtype by name in each tree's type (an unknown name: float16, no output type)."""
    name = "float16" if name == UNKNOWN else name
    return getattr(torch, str(name)) if torch_side else np.dtype(str(name))


def _call(tree: Any, fn: str, kwargs: dict[str, Any], torch_side: bool, device: str
          ) -> Callable[[], Any]:
    given = {k: (to_torch(v, device) if torch_side else v) for k, v in kwargs.items()}
    if "dtype" in given:
        given["dtype"] = _dtype(kwargs["dtype"], torch_side)
    first = given.pop("x" if "x" in given else "codes")
    return lambda: getattr(tree, fn)(first, **given)


@pytest.mark.parametrize("case", list(CASES))
def test_each_argument_at_each_declared_edge_is_the_same_in_both_trees(case: str,
                                                                       device: str) -> None:
    """Each argument of encode, quantize and decode at each edge of its declared range: the
    same bits, or the same one-line error, from both trees."""
    fn, kwargs, inside = CASES[case]
    ref = outcome(_call(rf, fn, kwargs, False, device))
    tor = outcome(_call(tf, fn, kwargs, True, device))
    assert inside or ref.error is not None, f"{case}: accepted outside its declared range"
    judge("formats.contract", ref, tor, case,
          value_claim=None if fn == "encode" else "formats.decode")


def test_the_edge_cases_reach_both_outcomes() -> None:
    """Guard: the table holds accepted and refused values of every argument kind."""
    refused = sum(1 for fn, kw, _ in CASES.values()
                  if outcome(_call(rf, fn, kw, False, "cpu")).error is not None)
    assert 40 < refused < len(CASES) - 40, (refused, len(CASES))


def _finds(strategy: Any, condition: Callable[[Any], bool]) -> Any:
    return find(strategy, condition, settings=settings(
        max_examples=2000, database=None, derandomize=True, phases=[Phase.generate],
        suppress_health_check=list(HealthCheck)))


@pytest.mark.parametrize("name", ["rounding", "overflow"])
def test_the_format_strategies_reach_every_declared_edge(name: str) -> None:
    """rounding_arguments draws every declared rounding mode and overflow policy (it reads
    common/arg_ranges.py), and the stochastic words' edges 0 and 2^32 - 1."""
    declared = {"rounding": ROUNDING_MODES, "overflow": OVERFLOW_POLICIES}[name]
    for member in declared:
        _finds(rounding_arguments(), lambda a, m=member: a[name] == m)
    if name == "rounding":
        for word in (RANDOM_WORDS[0], RANDOM_WORDS[-1]):
            _finds(rounding_arguments(), lambda a, w=word: a.get("word") == w)
