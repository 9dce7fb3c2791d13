"""Blockwise fp8 in both trees (fp8_blockwise.twins, fp8_blockwise.dequantize) on the edge
tiles and any matrix; each variant held to its library's rule written apart here
(fp8_blockwise.deepseek, .torchao, .transformer_engine); the docs' table of where they part
(fp8_blockwise.disagreements). Driver: parity/drivers/fp8_blockwise.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import event, given, settings

from parity.compare import assert_claim
from parity.drivers import fp8_blockwise as drv
from parity.strategies import (
    blockwise_edge_matrix,
    blockwise_edge_tiles,
    blockwise_tensors,
    examples,
)
from reference import fp8_blockwise as rfb
from torch_impl import fp8_blockwise as tfb

TILES = ((1, 128), (128, 128))  # DeepSeek-V3's: written here, not read from the trees
VARIANTS = ("deepseek", "torchao", "transformer_engine")
FP8_PAGE = Path(__file__).resolve().parents[1] / "docs" / "fp8.md"


def test_blockwise_1x128_gives_the_same_codes_and_scales_in_both_trees(device: str) -> None:
    """One small tensor quantized 1x128 (DeepSeek's rule) by each tree: the same codes and
    scales, bit for bit."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 256)) * 2.0 ** rng.integers(-12, 12, (4, 1))).astype(np.float32)
    ref_codes, ref_scales = rfb.quantize_blockwise(x, rfb.TILE_1x128)  # (4, 256), (4, 2)
    torch_codes, torch_scales = tfb.quantize_blockwise(torch.from_numpy(x).to(device),
                                                       tfb.TILE_1x128)  # (4, 256), (4, 2)
    assert_claim("fp8_blockwise.twins", actual=torch_scales, expected=ref_scales,
                 context="scales")
    assert_claim("fp8_blockwise.twins", actual=torch_codes, expected=ref_codes, context="codes")


@pytest.mark.parametrize("variant", VARIANTS)
def test_edge_tiles_give_the_same_codes_scales_and_values_in_both_trees(variant: str,
                                                                        device: str) -> None:
    """Every edge class, both tiles (and a 3x5 tile over shapes it does not divide): the same
    codes and scales, and the same decoded values, in both trees."""
    x = blockwise_edge_matrix()  # (rows, 128): one 1x128 tile per row
    wide = np.concatenate([x, x[::-1]], axis=1)[:130, :251]  # partial tiles both ways
    for matrix, tile in ((x, TILES[0]), (x, TILES[1]), (wide, (3, 5)), (wide, TILES[1])):
        (rc, rs), (tc, ts) = drv.quantize(matrix, tile, variant, device)
        context = f"{variant} tile {tile} shape {matrix.shape}"
        assert_claim("fp8_blockwise.twins", actual=ts, expected=rs, context=context + " scales")
        assert_claim("fp8_blockwise.twins", actual=tc, expected=rc, context=context + " codes")
        ref_values, torch_values = drv.dequantize(rc, rs, tile, device)
        assert_claim("fp8_blockwise.dequantize", actual=torch_values, expected=ref_values,
                     context=context)


@given(case=blockwise_tensors())
@settings(examples(30))
def test_any_matrix_gives_the_same_codes_and_scales_in_both_trees(case: tuple,
                                                                  device: str) -> None:
    """Any float32 matrix, tile and variant: the same codes and scales in both trees."""
    x, tile, variant = case
    (rc, rs), (tc, ts) = drv.quantize(x, tile, variant, device)
    event(f"tile divides the shape: {x.shape[0] % tile[0] == 0 and x.shape[1] % tile[1] == 0}")
    event(f"a NaN or inf: {bool((~np.isfinite(x)).any())}")
    context = f"{variant} tile {tile} shape {x.shape}"
    assert_claim("fp8_blockwise.twins", actual=ts, expected=rs, context=context + " scales")
    assert_claim("fp8_blockwise.twins", actual=tc, expected=rc, context=context + " codes")


def test_bad_input_gets_the_same_one_line_error_in_both_trees() -> None:
    """An unknown variant, a wrong dtype, shape or tile: the same exception and message."""
    good = np.ones((2, 4), np.float32)
    for x, tile, variant in ((good, (1, 128), "deepgemm"), (good.astype(np.float64), (1, 4),
                             "deepseek"), (good[0], (1, 4), "torchao"),
                             (good, (0, 4), "deepseek"), (good, (1, 4.0), "deepseek")):
        with pytest.raises((TypeError, ValueError)) as ref_error:
            rfb.quantize_blockwise(x, tile, variant)
        with pytest.raises((TypeError, ValueError)) as torch_error:
            tfb.quantize_blockwise(torch.from_numpy(x), tile, variant)
        assert type(ref_error.value) is type(torch_error.value)
        assert str(ref_error.value) == str(torch_error.value)
        assert "\n" not in str(ref_error.value)


# The libraries' rules, written apart: float64 steps rounded to float32 (f32), the amax a loop,
# the cast ml_dtypes' after an explicit clamp. One tile at a time, a flat float64 array.
def f32(v: np.ndarray | float) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(v, dtype=np.float64).astype(np.float32).astype(np.float64)


def e4m3(v: np.ndarray) -> np.ndarray:
    clamped = np.where(np.isnan(v), v, np.minimum(np.maximum(v, -448.0), 448.0))
    return clamped.astype(ml_dtypes.float8_e4m3fn)


def loop_amax(tile: np.ndarray, drop_nan: bool) -> float:
    amax = 0.0
    for v in tile.tolist():
        if math.isnan(v):
            if not drop_nan:
                return math.nan
            continue
        amax = max(amax, abs(v))
    return amax


def deepgemm(tile: np.ndarray) -> tuple[np.ndarray, float]:
    amax = loop_amax(tile, drop_nan=False)
    amax = amax if math.isnan(amax) else max(amax, float(f32(1e-4)))
    sf = f32(amax / 448.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return e4m3(f32(tile * f32(1.0 / sf))), float(sf)


def torchao_018(tile: np.ndarray) -> tuple[np.ndarray, float]:
    amax = loop_amax(tile, drop_nan=False)
    amax = amax if math.isnan(amax) else max(amax, 1e-12)
    s = f32(448.0 / amax)
    with np.errstate(divide="ignore", invalid="ignore"):
        return e4m3(f32(tile * s)), float(f32(np.float64(1.0) / s))


def te_float8_block(tile: np.ndarray) -> tuple[np.ndarray, float]:
    amax = loop_amax(tile, drop_nan=True)
    if amax == 0 or math.isinf(amax):
        s = 1.0
    else:
        s = float(f32(448.0 / amax))
        s = float(np.finfo(np.float32).max) if math.isinf(s) else s
        s = math.ldexp(0.5, math.frexp(s)[1])  # 2^floor(log2 s)
    with np.errstate(invalid="ignore"):
        return e4m3(f32(tile * s)), float(f32(1.0 / s))


ORACLES = {"deepseek": deepgemm, "torchao": torchao_018, "transformer_engine": te_float8_block}


def oracle(x: np.ndarray, tile: tuple[int, int], variant: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scales) by the library's rule, tile by tile; x's shape divisible by tile."""
    (r, c), (m, n) = tile, x.shape
    codes = np.zeros((m, n), ml_dtypes.float8_e4m3fn)
    scales = np.zeros((m // r, n // c), np.float32)
    for i in range(m // r):
        for j in range(n // c):
            block = x[i * r:(i + 1) * r, j * c:(j + 1) * c].astype(np.float64)
            q, scales[i, j] = ORACLES[variant](block.ravel())
            codes[i * r:(i + 1) * r, j * c:(j + 1) * c] = q.reshape(r, c)
    return codes, scales


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_is_its_librarys_rule_on_the_edge_tiles(variant: str) -> None:
    """The reference's variant, on its own tile constants, against the library's rule written
    apart on DeepSeek-V3's tiles."""
    x = blockwise_edge_matrix()
    x = np.concatenate([x, np.zeros((128 - x.shape[0] % 128, 128), np.float32)])
    for tile, own in zip(TILES, (rfb.TILE_1x128, rfb.TILE_128x128), strict=True):
        codes, scales = rfb.quantize_blockwise(x, own, variant)
        want_codes, want_scales = oracle(x, tile, variant)
        claim = f"fp8_blockwise.{variant}"
        assert_claim(claim, actual=scales, expected=want_scales, context=f"{tile} scales")
        assert_claim(claim, actual=codes, expected=want_codes, context=f"{tile} codes")


def test_each_variant_meets_its_librarys_stated_edges() -> None:
    """The edge cases the libraries' sources state, as exact values."""
    row = np.zeros((1, 128), np.float32)
    one_inf, one_nan = row.copy(), row.copy()
    one_inf[0, :3], one_nan[0, :3] = (np.inf, 1.0, -2.0), (np.nan, 1.0, -2.0)
    tiny = row + np.float32(2e-13)  # below torchao's 1e-12 and DeepGEMM's 1e-4
    got = {v: {name: rfb.quantize_blockwise(x, (1, 128), v)
               for name, x in (("zero", row), ("inf", one_inf), ("nan", one_nan),
                               ("tiny", tiny))} for v in VARIANTS}
    truths = [  # (variant, case, what, actual, expected)
        ("deepseek", "zero", "scale", got["deepseek"]["zero"][1],
         np.float32(1e-4) / np.float32(448)),
        ("deepseek", "inf", "codes", got["deepseek"]["inf"][0][0, :3].astype(np.float32),
         np.array([np.nan, 0, -0.0], np.float32)),
        ("deepseek", "nan", "scale", got["deepseek"]["nan"][1], np.float32(np.nan)),
        ("deepseek", "tiny", "scale", got["deepseek"]["tiny"][1], got["deepseek"]["zero"][1]),
        ("torchao", "zero", "scale", got["torchao"]["zero"][1],
         np.float32(1) / np.float32(448 / 1e-12)),
        ("torchao", "tiny", "scale", got["torchao"]["tiny"][1], got["torchao"]["zero"][1]),
        ("torchao", "inf", "scale", got["torchao"]["inf"][1], np.float32(np.inf)),
        ("torchao", "inf", "codes", got["torchao"]["inf"][0][0, :3].astype(np.float32),
         np.array([np.nan, 0, -0.0], np.float32)),
        ("transformer_engine", "zero", "scale", got["transformer_engine"]["zero"][1],
         np.float32(1)),
        ("transformer_engine", "inf", "scale", got["transformer_engine"]["inf"][1],
         np.float32(1)),
        ("transformer_engine", "inf", "codes",
         got["transformer_engine"]["inf"][0][0, :3].astype(np.float32),
         np.array([448, 1, -2], np.float32)),
        ("transformer_engine", "nan", "codes",
         got["transformer_engine"]["nan"][0][0, :3].astype(np.float32),
         np.array([np.nan, 128, -256], np.float32)),  # amax 2: 224 rounded down to 128
        ("transformer_engine", "tiny", "scale", got["transformer_engine"]["tiny"][1],
         np.float32(2.0**-50)),  # 448 / 2e-13 = 2.24e15 in [2^50, 2^51): scale 2^50
    ]
    for variant, case, what, actual, expected in truths:
        assert_claim(f"fp8_blockwise.{variant}", actual=np.asarray(actual, np.float32).ravel(),
                     expected=np.asarray(expected, np.float32).ravel(),
                     context=f"{case} tile {what}")


def disagreement_counts() -> dict[str, list[int]]:
    """Input class -> [tiles, then the elements whose decoded values differ for deepseek vs
    torchao, deepseek vs transformer_engine, torchao vs transformer_engine]."""
    counts = {}
    for name, x in blockwise_edge_tiles().items():
        values = {v: rfb.dequantize_blockwise(*rfb.quantize_blockwise(x, (1, 128), v), (1, 128))
                  for v in VARIANTS}
        row = [x.shape[0]]
        for a, b in (("deepseek", "torchao"), ("deepseek", "transformer_engine"),
                     ("torchao", "transformer_engine")):
            same = (values[a] == values[b]) | (np.isnan(values[a]) & np.isnan(values[b]))
            row.append(int((~same).sum()))
        counts[name] = row
    return counts


def test_the_docs_table_of_disagreements_is_the_computed_one() -> None:
    """docs/fp8.md's table of where the variants part is the reference's counts."""
    counts = disagreement_counts()
    table = "\n".join(f"| {name} | " + " | ".join(str(n) for n in row) + " |"
                      for name, row in counts.items())
    page = FP8_PAGE.read_text(encoding="utf-8")
    committed = []
    for name in counts:
        found = re.search(rf"^\| {re.escape(name)} \|([\d |]+)\|$", page, flags=re.M)
        assert found, f"docs/fp8.md lacks the row {name!r}; the computed rows:\n{table}"
        committed.append([int(n) for n in found.group(1).split("|")])
    assert_claim("fp8_blockwise.disagreements", actual=np.array(list(counts.values())),
                 expected=np.array(committed), context=f"computed rows:\n{table}")
