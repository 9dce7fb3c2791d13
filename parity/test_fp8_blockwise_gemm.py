"""The blockwise fp8 GEMM (reference/fp8_blockwise_gemm.py, torch_impl/fp8_blockwise_gemm.py):
the trees bit for bit (fp8_blockwise.gemm_twins), the reference held to DeepGEMM's promotion
rule written apart here (fp8_blockwise.gemm_rule), its error against the float64 product
within the derived bound (fp8_blockwise.gemm_bound), the variants equal where their scales
are powers of two (fp8_blockwise.gemm_variants_agree) and the docs' table of where they part
(fp8_blockwise.gemm_disagreements); bad input in one line, the same in both trees.
Driver: parity/drivers/fp8_blockwise_gemm.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from parity.claims.fp8_blockwise_bounds import blockwise_gemm_truth
from parity.compare import assert_claim
from parity.drivers import fp8_blockwise_gemm as drv
from parity.drivers.edges import judge, outcome, to_torch
from parity.strategies.fp8_blockwise import blockwise_gemm_operands
from reference import fp8_blockwise_gemm as rgemm
from torch_impl import fp8_blockwise_gemm as tgemm

VARIANTS = ("deepseek", "torchao", "transformer_engine")
CHUNK = 128  # DeepSeek-V3's N_C: written here, not read from the trees
FP8_PAGE = Path(__file__).resolve().parents[1] / "docs" / "fp8.md"
_RNG = np.random.default_rng(29)
# (5, 300) x (300, 200): K = 2 whole chunks and a partial one, N one block and a partial one;
# row 1 and the second 128 columns 2^12 larger so that tiles and blocks differ in scale
X = _RNG.standard_normal((5, 300)).astype(np.float32)
X[1] *= np.float32(4096)
W = _RNG.standard_normal((300, 200)).astype(np.float32)
W[128:256] *= np.float32(4096)


@pytest.mark.parametrize("variant", VARIANTS)
def test_blockwise_mm_gives_the_same_outputs_in_both_trees(device: str, variant: str) -> None:
    """blockwise_mm of the same codes and scales: the same float32 bits in both trees."""
    ref, tor = drv.mm(*drv.quantized(X, W, variant), device=device)
    assert_claim("fp8_blockwise.gemm_twins", actual=tor, expected=ref, context=variant)


def test_blockwise_mm_carries_nan_codes_and_inf_scales_alike_in_both_trees(device: str
                                                                           ) -> None:
    """A NaN code and an inf scale (torchao's tile holding an inf) make NaNs at the same
    outputs in both trees, and the other outputs the same bits."""
    x = X.copy()
    x[2, 5] = np.inf  # torchao: that tile's scale inf, its outputs NaN
    a_codes, a_scales, b_codes, b_scales = drv.quantized(x, W, "torchao")
    b_codes = b_codes.copy()
    b_codes[130, 7] = np.float32(np.nan)  # the NaN code 0x7F
    ref, tor = drv.mm(a_codes, a_scales, b_codes, b_scales, device=device)
    assert np.isnan(ref[2]).all() and np.isnan(ref[:, 7]).all() and not np.isnan(ref[0, 0])
    assert_claim("fp8_blockwise.gemm_twins", actual=tor, expected=ref, context="nan and inf")


def _rule(a_codes: np.ndarray, a_scales: np.ndarray, b_codes: np.ndarray,
          b_scales: np.ndarray, cols: range) -> np.ndarray:
    """DeepGEMM's promotion for the outputs in `cols`, one at a time, in Python floats and
    NumPy float32 scalars."""
    a, b = a_codes.astype(float), b_codes.astype(float)
    m, k = a.shape
    y = np.zeros((m, len(cols)), np.float32)
    for i in range(m):
        for out, j in enumerate(cols):
            acc = np.float32(0)
            for c in range(math.ceil(k / CHUNK)):
                ks = range(c * CHUNK, min(k, (c + 1) * CHUNK))
                p = np.float32(math.fsum(a[i, q] * b[q, j] for q in ks))  # exact, then f32
                s = np.float32(a_scales[i, c]) * np.float32(b_scales[c, j // CHUNK])
                acc = np.float32(acc + np.float32(s * p))
            y[i, out] = acc
    return y


@pytest.mark.parametrize("variant", VARIANTS)
def test_blockwise_mm_is_deepgemms_promotion_written_apart(variant: str) -> None:
    """Per chunk of 128 along K: the exact sum rounded to float32, times f32(sa * sb), added
    to a float32 sum, chunks in order; the partial last chunk and both sides of a block edge
    of b (columns 120..139) included."""
    operands = drv.quantized(X[:3], W, variant)
    cols = range(120, 140)
    got = rgemm.blockwise_mm(*operands)[:, cols.start : cols.stop]
    assert_claim("fp8_blockwise.gemm_rule", actual=got, expected=_rule(*operands, cols),
                 context=variant)


def _same_sign(rng: np.random.Generator, m: int, k: int, n: int) -> tuple[np.ndarray, ...]:
    """Positive x (M, K), each 1x128 tile in its own binade of [2^-3, 2^3), and positive w:
    every partial sum grows, so each rounding counts against |A||B|."""
    tiles = 2.0 ** rng.uniform(-3, 3, (m, k // CHUNK))
    x = rng.uniform(0.5, 1.0, (m, k)) * np.repeat(tiles, CHUNK, axis=1)
    return x.astype(np.float32), rng.uniform(0.5, 1.0, (k, n)).astype(np.float32)


# (M, K, N, same-sign): C = 2 chunks, where the bound is gamma_4(u) and is reached; C = 8 of
# mixed signs; C = 32
BOUND_CASES = ((64, 256, 256, True), (32, 1024, 160, False), (8, 4096, 128, True))


@pytest.mark.parametrize("variant", VARIANTS)
def test_blockwise_mm_is_within_the_derived_bound_of_the_float64_product(variant: str
                                                                        ) -> None:
    """|Y - A @ B| <= (gamma_{C+2}(u) + gamma_K(2^-53)) |A||B|, A and B dequantized exactly;
    for deepseek and torchao on same-sign operands at C = 2 the error spends over 1/100 of
    it (TE's power-of-two scales leave those products exact)."""
    rng = np.random.default_rng(41)
    worst = {}
    for m, k, n, same_sign in BOUND_CASES:
        x, w = (_same_sign(rng, m, k, n) if same_sign else
                (rng.standard_normal((m, k)).astype(np.float32),
                 rng.standard_normal((k, n)).astype(np.float32)))
        operands = drv.quantized(x, w, variant)
        truth, scale = blockwise_gemm_truth(*operands)
        worst[k] = assert_claim("fp8_blockwise.gemm_bound",
                                actual=rgemm.blockwise_mm(*operands).astype(np.float64),
                                expected=truth, scale=scale, context=f"{variant} K={k}")
    if variant != "transformer_engine":
        assert worst[256] > 1 / 100, f"the bound is not exercised: {worst}"


def test_the_variants_give_the_same_gemm_where_every_tile_amax_is_448_times_2k() -> None:
    """Power-of-two scales in every rule: the same codes, scales and outputs, bit for bit."""
    x, w = blockwise_gemm_operands()["every tile's amax 448 * 2^k"]
    ys = drv.variant_outputs(x, w)
    assert np.abs(ys["deepseek"]).max() > 0
    for v in VARIANTS[1:]:
        assert_claim("fp8_blockwise.gemm_variants_agree", actual=ys[v].view(np.uint32),
                     expected=ys["deepseek"].view(np.uint32), context=f"deepseek vs {v}")


def test_the_docs_table_of_gemm_disagreements_is_the_computed_one() -> None:
    """docs/fp8.md's GEMM table (python -m parity docs) is the reference's counts now."""
    counts = drv.variant_disagreements()
    page = FP8_PAGE.read_text(encoding="utf-8")
    begin = "<!-- generated: blockwise-gemm"
    assert begin in page, "docs/fp8.md lacks the GEMM table's markers (python -m parity docs)"
    section = page.split(begin, 1)[1].split("<!-- end generated", 1)[0]
    committed = []
    for name in counts:
        found = re.search(rf"^\| {re.escape(name)} \|([\d |]+)\|$", section, flags=re.M)
        assert found, f"docs/fp8.md lacks the GEMM row {name!r} (python -m parity docs)"
        committed.append([int(n) for n in found.group(1).split("|")])
    assert_claim("fp8_blockwise.gemm_disagreements", actual=np.array(list(counts.values())),
                 expected=np.array(committed), context=f"computed: {counts}")


def _bad_inputs() -> dict[str, tuple]:
    a_codes, a_scales, b_codes, b_scales = drv.quantized(X, W, "deepseek")
    a_by_block = drv.quantized(W.T.copy(), W, "deepseek")[1]  # a (200, 300)'s 1x128 grid
    return {
        "K differs": (a_codes[:, :299], a_scales, b_codes, b_scales),
        "K differs in a whole chunk": (a_codes[:, :128], a_scales[:, :1], b_codes, b_scales),
        "a tiled 128x128": (a_codes, a_scales[:1], b_codes, b_scales),
        "a scales of another matrix": (a_codes, a_by_block, b_codes, b_scales),
        "b tiled 1x128": (a_codes, a_scales, b_codes, np.repeat(b_scales, 128, axis=0)),
        "b scales one block short": (a_codes, a_scales, b_codes, b_scales[:, :1]),
        "b scales transposed": (a_codes, a_scales, b_codes, b_scales.T.copy()),
        "a 1-D": (a_codes[0], a_scales, b_codes, b_scales),
        "codes float32": (X, a_scales, b_codes, b_scales),
        "codes e5m2": (a_codes.astype(ml_dtypes.float8_e5m2), a_scales, b_codes, b_scales),
        "scales float64": (a_codes, a_scales, b_codes, b_scales.astype(np.float64)),
    }


@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_bad_operands_get_the_same_one_line_error_in_both_trees(device: str, case: str
                                                                ) -> None:
    """K that differs, a scale grid of the wrong tile or shape, codes that are not e4m3 or a
    matrix, scales that are not float32: one line naming blockwise_mm, both trees alike."""
    args = _bad_inputs()[case]
    ref = outcome(lambda: rgemm.blockwise_mm(*args))
    tor = outcome(lambda: tgemm.blockwise_mm(*to_torch(args, device)))
    assert ref.error is not None and "blockwise_mm: " in ref.error, (case, ref.error)
    judge("fp8_blockwise.gemm_twins", ref, tor, case)
