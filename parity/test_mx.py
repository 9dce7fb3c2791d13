"""MX and NVFP4, the reference against torch_impl: every code and value bit for bit
(mx.twins) on edge blocks and under hypothesis; the float32 log2 of torchao's rceil
(mx.rceil_log2f); the clipping and ties-away counts of both trees (mx.clipping), the full
table against the committed docs/data/mx_counts.json (slow). The oracle tests against
torchao: parity/test_mx_torchao.py. Driver: parity/drivers/mx.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import event, given, settings

from parity.compare import assert_claim
from parity.drivers import mx as drv
from parity.strategies import edge_array, examples, mx_blocks
from reference import mx as rmx
from torch_impl import mx as tmx

COUNTS_JSON = Path(__file__).resolve().parents[1] / "docs" / "data" / "mx_counts.json"


def test_one_tensor_to_mxfp8_and_back_gives_the_same_bits_in_both_trees(device: str) -> None:
    """One float32 tensor through to_mx (float8_e4m3fn, floor scales) and from_mx: both trees
    give the same scale codes, element codes and decoded values."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 64)) * 2.0 ** rng.integers(-20, 20, (2, 64))).astype(np.float32)
    ref_mx = rmx.to_mx(x, "float8_e4m3fn", "floor")  # scales (2, 2), elements (2, 64)
    torch_mx = tmx.to_mx(torch.from_numpy(x).to(device), "float8_e4m3fn", "floor")
    ref_back = rmx.from_mx(ref_mx)  # (2, 64) float32
    torch_back = tmx.from_mx(torch_mx)  # (2, 64) float32
    assert_claim("mx.twins", actual=torch_mx.scales, expected=ref_mx.scales, context="scales")
    assert_claim("mx.twins", actual=torch_mx.elements, expected=ref_mx.elements,
                 context="elements")
    assert_claim("mx.twins", actual=torch_back, expected=ref_back, context="values")


def _check_twins(x: np.ndarray, fmt: str, mode: str, rounding: str, context: str,
                 device: str) -> None:
    ref, tor = drv.both_to_mx(x, fmt, mode, rounding, device)
    assert_claim("mx.twins", actual=tmx.scaled_blocks(drv.to_torch(x, device), fmt, mode)[1],
                 expected=rmx.scaled_blocks(x, fmt, mode)[1], context=f"{context} scaled")
    assert_claim("mx.twins", actual=tor.scales, expected=ref.scales, context=f"{context} scales")
    assert_claim("mx.twins", actual=tor.elements, expected=ref.elements,
                 context=f"{context} elements")
    assert_claim("mx.twins", actual=tmx.from_mx(tor), expected=rmx.from_mx(ref),
                 context=f"{context} from_mx")


@pytest.mark.parametrize("fmt", rmx.ELEMENT_FORMATS)
def test_torch_mx_gives_the_reference_bits_on_edge_blocks(fmt: str, device: str) -> None:
    """Every scale mode and both roundings: scale codes, element codes, decoded values;
    and bfloat16 input (widened exactly to float32 by both)."""
    x = edge_array(fmt, seed=1)
    for mode in rmx.SCALE_MODES:
        for rounding in rmx.ROUNDINGS:
            _check_twins(x, fmt, mode, rounding, f"{fmt} {mode} {rounding}", device)
    _check_twins(x.astype(ml_dtypes.bfloat16), fmt, "floor", "nearest_even", "bfloat16",
                 device)
    ref = rmx.to_mx(x, fmt, "floor")
    assert {0, 255} <= set(ref.scales.ravel().tolist()), "guard: the smallest and the NaN scale"
    away = rmx.to_mx(x, fmt, "floor", rounding="nearest_away")
    assert np.any(away.elements != ref.elements), "guard: a tie the two roundings split"


@given(case=mx_blocks())
@settings(examples(30))
def test_torch_mx_gives_the_reference_bits_for_any_blocks(
        case: tuple[str, str, list[str], np.ndarray], device: str) -> None:
    """Any mix of edge blocks, any element format and scale mode, both roundings."""
    fmt, mode, kinds, x = case
    for kind in set(kinds):
        event(kind)
    for rounding in rmx.ROUNDINGS:
        _check_twins(x, fmt, mode, rounding, f"{fmt} {mode} {rounding} {kinds}", device)


@pytest.mark.parametrize("two_level", [False, True])
def test_torch_nvfp4_gives_the_reference_bits(two_level: bool, device: str) -> None:
    """Block-scale and fp4 codes, and the decoded values, with one and two scale levels."""
    x = edge_array("float4_e2m1fn", seed=2).reshape(-1, 16)
    ref, tor = drv.both_to_nvfp4(x, two_level, device)
    assert_claim("mx.twins", actual=tor.scales, expected=ref.scales, context="nvfp4 scales")
    assert_claim("mx.twins", actual=tor.elements, expected=ref.elements, context="nvfp4 elements")
    assert_claim("mx.twins", actual=tmx.from_nvfp4(tor), expected=rmx.from_nvfp4(ref),
                 context="nvfp4 values")
    assert (ref.per_tensor_scale is not None) == two_level
    assert 0x7F in ref.scales and 0x08 in ref.scales, "guard: a NaN scale and the clamp to 2^-6"
    normal = drv.distributions(64)["student_t3"]  # a tensor's range: S of every significand
    ref, tor = drv.both_to_nvfp4(normal, two_level, device)
    g = None if ref.per_tensor_scale is None else torch.tensor(ref.per_tensor_scale, device=device)
    assert_claim("mx.twins", actual=tmx.nvfp4_scaled(drv.to_torch(normal, device), g)[1],
                 expected=rmx.nvfp4_scaled(normal, ref.per_tensor_scale)[1], context="nvfp4 x R")
    assert_claim("mx.twins", actual=tor.elements, expected=ref.elements,
                 context="nvfp4 student-t elements")
    assert_claim("mx.twins", actual=tmx.from_nvfp4(tor), expected=rmx.from_nvfp4(ref),
                 context="nvfp4 student-t values")
    assert len(set((ref.scales & 7).ravel().tolist())) == 8, "guard: every e4m3 significand"


def _near_powers_of_two(ulps: int) -> np.ndarray:
    """Every positive finite float32 within `ulps` words of each power of two 2^-149..2^127."""
    words = np.array([np.float32(2.0**k).view(np.int32) for k in range(-149, 128)], np.int64)
    near = (words[:, None] + np.arange(-ulps, ulps + 1)).ravel()
    return near[(near > 0) & (near < 0x7F800000)].astype(np.int32).view(np.float32)


def _check_log2f(d: np.ndarray, context: str) -> None:
    ours = np.ceil(np.log2(d.astype(np.float64)).astype(np.float32))  # reference.mx's rule
    theirs = torch.ceil(torch.log2(torch.from_numpy(d))).numpy()
    assert_claim("mx.rceil_log2f", actual=ours, expected=theirs, context=context)


def test_float32_log2_ceiling_is_torchs_near_every_power_of_two() -> None:
    """ceil(f32(log2 d)) equals torch's float32 ceil(log2 d) around every power of two, and
    the scale codes of rceil_log2f and rceil differ just above them (the trap is real)."""
    d = _near_powers_of_two(256)
    _check_log2f(d, "within 256 ulps of a power of two")
    words = np.random.default_rng(0).integers(1, 0x7F800000, 200_000).astype(np.int32)
    _check_log2f(words.view(np.float32), "random words")
    tops = np.array([np.float32(448 * 2.0**k).view(np.int32) for k in range(-140, 120)])
    amax = (tops[:, None] + np.arange(4)).ravel().astype(np.int32).view(np.float32)  # 448 2^k
    exact = rmx.scale_codes(amax, "float8_e4m3fn", "rceil")
    log2f = rmx.scale_codes(amax, "float8_e4m3fn", "rceil_log2f")
    assert_claim("mx.twins",
                 actual=tmx.scale_codes(torch.from_numpy(amax), "float8_e4m3fn", "rceil_log2f"),
                 expected=log2f, context="log2f scale codes")
    assert np.count_nonzero(exact != log2f) > 0, "guard: torchao's rceil rounds some down"


@pytest.mark.slow
def test_float32_log2_ceiling_is_torchs_within_20000_ulps_of_every_power_of_two() -> None:
    """The statement's full sweep: 10.8 million d."""
    _check_log2f(_near_powers_of_two(20_000), "within 20,000 ulps")


def _check_counts(table: dict) -> None:
    for part in ("clipped", "away", "away_bf16"):
        for dist, by_fmt in table[part].items():
            for fmt, cell in by_fmt.items():
                pairs = cell.values() if isinstance(cell, dict) else [cell]
                for ref, tor in pairs:
                    assert_claim("mx.clipping", actual=np.array(tor), expected=np.array(ref),
                                 context=f"{part} {dist} {fmt}")


def test_both_trees_count_the_same_clipped_blocks_and_ties() -> None:
    """256 blocks of each distribution: equal counts; floor clips where rceil does not."""
    table = drv.counts(drv.QUICK_BLOCKS)
    _check_counts(table)
    for dist in drv.DISTRIBUTIONS:
        e4m3 = table["clipped"][dist]["float8_e4m3fn"]
        assert e4m3["floor"][0] > 0 and e4m3["rceil"][0] == 0, f"guard: {dist} {e4m3}"
        assert e4m3["ceil"][0] == 0
    assert table["away_bf16"]["gpt"]["float4_e2m1fn"][0] > 0, "guard: bf16 data has ties"


@pytest.mark.slow
def test_the_committed_counts_table_is_what_both_trees_count_now() -> None:
    """docs/data/mx_counts.json (benchmarks/mx.py) equals a fresh count, both trees equal."""
    table = drv.counts(drv.FULL_BLOCKS)
    _check_counts(table)
    committed = json.loads(COUNTS_JSON.read_text(encoding="utf-8"))
    assert committed["table"] == table, "docs/data/mx_counts.json is stale: run benchmarks/mx.py"
