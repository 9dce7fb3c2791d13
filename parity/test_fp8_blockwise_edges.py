"""Every ranged argument of the blockwise fp8 twins (block_amax, block_scales,
quantize_blockwise, dequantize_blockwise) at each edge of its declared range
(common/arg_ranges.py: TILE_SIDES, BLOCKWISE_VARIANTS) and one past it, and the matrix's
shape at its edges (one row, one column; empty and not 2-d refused): both trees give the
same bits or the same one-line error (claim fp8_blockwise.twins; dequantized values NaN as
a class, fp8_blockwise.dequantize), and a value outside its range is refused. The strategy
that draws tiles and variants reads the same ranges."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, settings

from common.arg_ranges import BLOCKWISE_VARIANTS, TILE_SIDES
from parity.drivers.edges import judge, outcome, to_torch
from parity.strategies.edges import edges
from parity.strategies.fp8_blockwise import blockwise_tensors
from reference import fp8_blockwise as rbw
from torch_impl import fp8_blockwise as tbw

_RNG = np.random.default_rng(5)
X = (_RNG.standard_normal((5, 7)) * 2.0 ** _RNG.integers(-10, 10, (5, 7))).astype(np.float32)
X[1, 2] = np.inf
X_NAN = np.ones((2, 32), np.float32)  # 32 columns: torch's vectorized reduction
X_NAN[1, 9] = np.nan
FUNCTIONS = ("block_amax", "block_scales", "quantize_blockwise")

# (function, positional arguments, whether every argument is inside its declared range)
Case = tuple[str, tuple[Any, ...], bool]


def _cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    for fn in FUNCTIONS:
        for label, side, inside in edges(TILE_SIDES):
            cases[f"{fn} tile rows {label}"] = fn, (X, (side, 3), "deepseek"), inside
            cases[f"{fn} tile columns {label}"] = fn, (X, (2, side), "torchao"), inside
        for label, variant, inside in edges(BLOCKWISE_VARIANTS):
            cases[f"{fn} variant {label}"] = fn, (X, (2, 3), variant), inside
        for label, x, inside in (("one row", X[:1], True), ("one column", X[:, :1], True),
                                 ("no rows", X[:0], False), ("a vector", X[0], False),
                                 ("three dimensions", X[None], False)):
            cases[f"{fn} x {label}"] = fn, (x, (2, 3), "transformer_engine"), inside
        for variant in BLOCKWISE_VARIANTS:  # a strided reduction: torch's NaN was 0xffffffff
            cases[f"{fn} a NaN in a tile one column wide {variant}"] = fn, (
                X_NAN, (TILE_SIDES[-1], 1), variant), True
        cases[f"{fn} tile of a bool side"] = fn, (X, (True, 3), "deepseek"), False
        cases[f"{fn} tile of three sides"] = fn, (X, (1, 2, 3), "deepseek"), False
    for label, side, inside in edges(TILE_SIDES):
        tile = (side, 3)
        codes, scales = rbw.quantize_blockwise(X, (2, 3) if not inside else tile)
        cases[f"dequantize_blockwise tile rows {label}"] = "dequantize_blockwise", (
            codes, scales, tile), inside
    return cases


CASES = _cases()


@pytest.mark.parametrize("case", list(CASES))
def test_each_argument_at_each_declared_edge_is_the_same_in_both_trees(case: str,
                                                                       device: str) -> None:
    """A tile side of 1 and of 2^63 - 1 (a tile longer than the matrix covers all of it),
    0 and 2^63, each variant and an unknown one, one-row and one-column matrices: the same
    codes and scales, or the same error line, from both trees."""
    fn, args, inside = CASES[case]
    ref = outcome(lambda: getattr(rbw, fn)(*args))
    tor = outcome(lambda: getattr(tbw, fn)(*to_torch(args, device)))
    assert inside or ref.error is not None, f"{case}: accepted outside its declared range"
    judge("fp8_blockwise.twins", ref, tor, case,
          value_claim="fp8_blockwise.dequantize" if fn == "dequantize_blockwise" else None)


def test_a_tile_longer_than_the_matrix_is_one_tile() -> None:
    """A tile side past the matrix's gives what the matrix's own side gives (one tile),
    bit for bit, in the reference (the twin is held to it above)."""
    for fn in FUNCTIONS:
        long = getattr(rbw, fn)(X, (TILE_SIDES[-1], X.shape[1] + 1))
        whole = getattr(rbw, fn)(X, X.shape)
        for a, b in zip(long if isinstance(long, tuple) else (long,),
                        whole if isinstance(whole, tuple) else (whole,), strict=True):
            assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def _finds(condition: Any) -> None:
    find(blockwise_tensors(max_size=2), condition, settings=settings(
        max_examples=2000, database=None, derandomize=True, phases=[Phase.generate],
        suppress_health_check=list(HealthCheck)))


def test_the_blockwise_strategy_reaches_every_declared_edge() -> None:
    """blockwise_tensors draws every variant, and tile sides at both edges of TILE_SIDES."""
    for variant in BLOCKWISE_VARIANTS:
        _finds(lambda c, v=variant: c[2] == v)
    for side in (TILE_SIDES[0], TILE_SIDES[-1]):
        _finds(lambda c, s=side: s in c[1])
