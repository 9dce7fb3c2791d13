"""MX and NVFP4, the reference against torch_impl: every code and value bit for bit
(mx.twins) on edge blocks and under hypothesis; the float32 log2 of torchao's rceil
(mx.rceil_log2f); the clipping and ties-away counts of both trees (mx.clipping), the full
table against the committed docs/data/mx_counts.json (slow). The oracle tests against
torchao: parity/test_mx_torchao.py. Driver: parity/drivers/mx.py.
"""

from __future__ import annotations

import json
import math
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
from reference import mx_variants as rmx_variants
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
                 device: str, variant: str = "ocp") -> None:
    ref, tor = drv.both_to_mx(x, fmt, mode, rounding, device, variant)
    assert_claim("mx.twins", actual=tmx.scaled_blocks(drv.to_torch(x, device), fmt, mode,
                                                      variant=variant)[1],
                 expected=rmx.scaled_blocks(x, fmt, mode, variant=variant)[1],
                 context=f"{context} scaled")
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
    for variant, mode, rounding in drv.settings(fmt):
        _check_twins(x, fmt, mode, rounding, f"{fmt} {mode} {rounding} {variant}", device,
                     variant)
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
    for variant, mode_, rounding in drv.settings(fmt, (mode,)):
        _check_twins(x, fmt, mode_, rounding, f"{fmt} {mode} {rounding} {variant} {kinds}",
                     device, variant)


@pytest.mark.parametrize("two_level", [False, True])
def test_torch_nvfp4_gives_the_reference_bits(two_level: bool, device: str) -> None:
    """torchao's variant: block-scale and fp4 codes, and the decoded values, with one and two
    scale levels."""
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
    assert_claim("mx.twins", actual=tmx.nvfp4_scaled(drv.to_torch(normal, device), g,
                                                     variant="torchao")[1],
                 expected=rmx.nvfp4_scaled(normal, ref.per_tensor_scale, variant="torchao")[1],
                 context="nvfp4 x R")
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
    floor = rmx_variants.log2_floor_f32(d).astype(np.float32)  # microxcaling's floor
    assert_claim("mx.rceil_log2f", actual=floor, context=f"{context} floor",
                 expected=torch.floor(torch.log2(torch.from_numpy(d))).numpy())


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


ML_DTYPES = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2,
             "float6_e2m3fn": ml_dtypes.float6_e2m3fn, "float6_e3m2fn": ml_dtypes.float6_e3m2fn,
             "float4_e2m1fn": ml_dtypes.float4_e2m1fn}


def ocp_conversion(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """OCP MX 1.0's conversion (section 6.3) of float32 x, a block of 32 at a time, computed
    apart from the reference: X = 2^(floor(log2 amax) - e_max), clamped to 2^-127 .. 2^127
    (math.frexp of the float64 amax), NaN for a block holding an inf or a NaN; P_i = V_i / X
    in float64 (exact), clamped to +-max_elem, cast by ml_dtypes; the value X P_i.
    (E8M0 codes (..., n), float32 values shaped as x.)"""
    spec = rmx.FORMATS[fmt]
    codes, values = [], []
    for block in x.astype(np.float64).reshape(-1, rmx.BLOCK_SIZE):
        amax = float(np.max(np.abs(block)))  # NaN if the block holds one
        if not math.isfinite(amax):
            codes.append(rmx.E8M0_NAN)
            values.append(np.full(rmx.BLOCK_SIZE, np.nan))
            continue
        floor_log2 = math.frexp(amax)[1] - 1 if amax > 0 else -1000
        s = min(max(floor_log2 - spec.emax, -127), 127)
        p = np.clip(block / 2.0**s, -spec.max, spec.max).astype(ML_DTYPES[fmt])
        codes.append(s + 127)
        values.append(p.astype(np.float64) * 2.0**s)
    return (np.array(codes, np.uint8).reshape(*x.shape[:-1], -1),
            np.array(values).astype(np.float32).reshape(x.shape))


def _check_ocp(x: np.ndarray, fmt: str, context: str) -> None:
    codes, values = ocp_conversion(x, fmt)
    ref = rmx.to_mx(x, fmt)  # the defaults: FLOOR, the specification
    assert_claim("mx.ocp", actual=ref.scales, expected=codes, context=f"{context} scales")
    assert_claim("mx.ocp", actual=rmx.from_mx(ref), expected=values, context=f"{context} values")


@pytest.mark.parametrize("fmt", rmx.ELEMENT_FORMATS)
def test_the_default_is_the_ocp_conversion_at_the_smallest_scale_and_at_inf(fmt: str) -> None:
    """Every edge kind: the reference's default equals the specification's conversion; the
    blocks that tell it from torchao's variant (code 0, +-inf) are reached."""
    x = edge_array(fmt, seed=4)
    x[0, :] = np.float32(2.0**-126)  # code 0 in every format (e_max >= 2): P = 2 at X = 2^-127
    x[1, 3] = np.float32(np.inf)
    _check_ocp(x, fmt, fmt)
    torchao = rmx.from_mx(rmx.to_mx(x, fmt, variant="torchao"))
    spec = rmx.from_mx(rmx.to_mx(x, fmt))
    assert np.isnan(spec[1]).all() and not np.isnan(torchao[1]).all(), "guard: an inf block"
    assert np.array_equal(spec[0], x[0]) and not np.array_equal(torchao[0], x[0]), (
        "guard: a code-0 block the specification keeps and torchao halves")


@given(case=mx_blocks())
@settings(examples(30))
def test_the_default_is_the_ocp_conversion_for_any_blocks(
        case: tuple[str, str, list[str], np.ndarray]) -> None:
    """Any mix of edge blocks and element formats (the FLOOR scale: OCP's)."""
    fmt, _, kinds, x = case
    for kind in set(kinds):
        event(kind)
    _check_ocp(x, fmt, f"{fmt} {kinds}")


def te_nvfp4(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Transformer Engine's NVFP4 quantizer (its reference_nvfp4.py, 1x16 blocks) computed
    apart from the reference: every float32 operation as the float64 result of its float32
    operands rounded by np.float32 (exact for + - * /: 53 >= 2 * 24 + 2), the e4m3 and fp4
    casts by ml_dtypes, block by block in Python scalars. (e4m3 scale codes (..., n), fp4
    codes shaped as x, float32 values.)"""
    f32 = np.float32
    a = float(np.max(np.abs(x)))  # float32's amax, NaN if any
    enc = f32(min(float(f32(2688.0 / a)) if a else math.inf, float(rmx.F32_MAX)))
    if a == 0 or enc == 0:
        enc = f32(1.0)
    dec, sixth = f32(1.0 / float(enc)), f32(1.0 / 6.0)
    scales, codes, values = [], [], []
    for block in x.astype(np.float64).reshape(-1, 16):
        b = f32(float(np.max(np.abs(block))) * float(f32(float(enc) * float(sixth))))
        s = np.array([min(b, 448.0)], np.float32).astype(ml_dtypes.float8_e4m3fn)
        sv = float(s.astype(np.float64)[0])
        denominator = float(f32(sv * float(dec)))
        r = min(float(f32(1.0 / denominator)) if denominator else math.inf, float(rmx.F32_MAX))
        q = np.array([f32(v * r) for v in block], np.float64)
        p = np.clip(q, -6.0, 6.0).astype(ml_dtypes.float4_e2m1fn)
        final = f32(float(f32(sv * a)) * float(f32(1.0 / 2688.0)))
        scales.append(s.view(np.uint8)[0])
        codes.append(p.view(np.uint8) & 0xF)
        with np.errstate(invalid="ignore"):  # A = inf: 0 * inf, as TE's dequantize gives
            values.append(np.array([f32(v * float(final)) for v in p.astype(np.float64)]))
    return (np.array(scales, np.uint8).reshape(*x.shape[:-1], -1),
            np.array(codes, np.uint8).reshape(x.shape),
            np.array(values, np.float32).reshape(x.shape))


def _check_te(x: np.ndarray, context: str) -> rmx.NVFP4Tensor:
    scales, codes, values = te_nvfp4(x)
    ref = rmx.to_nvfp4(x)  # the default: Transformer Engine's recipe
    assert_claim("mx.nvfp4_te", actual=ref.scales, expected=scales, context=f"{context} scales")
    kept = np.repeat((scales & 0x7F) != 0x7F, 16, axis=-1)  # blocks whose scale is a number
    assert_claim("mx.nvfp4_te", actual=np.where(kept, ref.elements, 0),
                 expected=np.where(kept, codes, 0), context=f"{context} elements")
    assert_claim("mx.nvfp4_te", actual=rmx.from_nvfp4(ref), expected=values,
                 context=f"{context} values")
    return ref


def test_the_default_nvfp4_is_transformer_engines_recipe_on_its_own_edge_cases() -> None:
    """TE's edge cases: an all-zero tensor is zeros (torchao's two levels: NaN), a block whose
    scale rounds to 0 saturates its nonzero elements to +-6, an inf element gives S_enc = 1;
    then edge blocks of every kind, and a Student-t tensor."""
    zeros = np.zeros((2, 32), np.float32)
    ref = _check_te(zeros, "zeros")
    assert not ref.scales.any() and not ref.elements.any() and not rmx.from_nvfp4(ref).any()
    torchao = rmx.to_nvfp4(zeros, rmx.per_tensor_scale(zeros), variant="torchao")
    assert np.isnan(rmx.from_nvfp4(torchao)).all(), "torchao's 0 / 0, named in docs/mx.md"
    tiny = np.zeros((1, 32), np.float32)
    tiny[0, :16] = 1000.0  # A = 1000: a block of amax 1e-4 has S = e4m3(1e-4 * 0.448) = 0
    tiny[0, 16:] = np.float32(1e-4) * np.sign(np.arange(16) - 7.5).astype(np.float32)
    ref = _check_te(tiny, "a scale rounded to 0")
    assert ref.scales[0, 1] == 0 and set((ref.elements[0, 16:] & 7).tolist()) == {7}
    inf = np.ones((1, 32), np.float32)
    inf[0, 3] = np.inf
    ref = _check_te(inf, "inf")
    assert rmx.global_scales(np.float32(np.inf))[0] == 1 and ref.scales[0, 0] == 0x7E
    _check_te(edge_array("float4_e2m1fn", seed=7).reshape(-1, 32)[~np.isnan(
        edge_array("float4_e2m1fn", seed=7).reshape(-1, 32)).any(axis=-1)], "edge blocks")
    _check_te(drv.distributions(32)["student_t3"], "student-t")


@pytest.mark.parametrize("case", ["edge", "zeros", "student_t3"])
def test_torch_nvfp4_gives_the_reference_bits_under_transformer_engines_recipe(
        case: str, device: str) -> None:
    """The default variant in both trees: scale codes, element codes, values, A."""
    x = {"edge": edge_array("float4_e2m1fn", seed=2).reshape(-1, 16),
         "zeros": np.zeros((2, 32), np.float32),
         "student_t3": drv.distributions(32)["student_t3"]}[case]
    ref, tor = rmx.to_nvfp4(x), tmx.to_nvfp4(drv.to_torch(x, device))
    assert_claim("mx.twins", actual=tor.scales, expected=ref.scales, context=f"te {case} scales")
    assert_claim("mx.twins", actual=tor.elements, expected=ref.elements,
                 context=f"te {case} elements")
    assert_claim("mx.twins", actual=tmx.from_nvfp4(tor), expected=rmx.from_nvfp4(ref),
                 context=f"te {case} values")
    assert_claim("mx.twins", actual=tmx.nvfp4_scaled(drv.to_torch(x, device))[1],
                 expected=rmx.nvfp4_scaled(x)[1], context=f"te {case} x R")


@pytest.mark.parametrize("block_size", [1, 2, 256])
def test_block_sizes_at_and_past_the_usual_give_the_same_bits_in_both_trees(
        block_size: int, device: str) -> None:
    """The block size's declared range is every positive int: at its lower edge (1: each
    element its own scale), 2, and past the usual 32 (256), every format, mode and variant
    give the same codes in both trees."""
    rng = np.random.default_rng(block_size)
    x = (rng.standard_normal((2, 512)) * 2.0 ** rng.integers(-30, 30, (2, 512))).astype(
        np.float32)
    t = drv.to_torch(x, device)
    for fmt in rmx.ELEMENT_FORMATS:
        for variant, mode, rounding in drv.settings(fmt):
            ref = rmx.to_mx(x, fmt, mode, block_size=block_size, rounding=rounding,
                            variant=variant)
            tor = tmx.to_mx(t, fmt, mode, block_size=block_size, rounding=rounding,
                            variant=variant)
            context = f"block {block_size} {fmt} {mode} {variant}"
            assert_claim("mx.twins", actual=tor.scales, expected=ref.scales,
                         context=f"{context} scales")
            assert_claim("mx.twins", actual=tor.elements, expected=ref.elements,
                         context=f"{context} elements")


def test_fp4_elements_round_as_the_reference_at_every_boundary(device: str) -> None:
    """round_elements to fp4, nearest even: torch's count of the boundaries passed against
    the reference's float64 rounding at each midpoint of fp4 (ties to the even code),
    its float32 neighbours, each magnitude, +-0, +-6, NaN of both signs, and N(0, 2) draws."""
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    mags = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
    near = np.concatenate([mids, np.nextafter(mids, np.float32(0)),
                           np.nextafter(mids, np.float32(7)), mags,
                           np.nextafter(mags[1:], np.float32(0)), [2.0**-149, np.nan]])
    draws = np.clip(np.random.default_rng(5).normal(0, 2, 4096), -6, 6)
    q = np.concatenate([near, -near, draws]).astype(np.float32)
    expected = rmx.round_elements(q, "float4_e2m1fn")
    actual = tmx.round_elements(torch.from_numpy(q).to(device), "float4_e2m1fn").cpu().numpy()
    assert_claim("mx.twins", actual=actual, expected=expected, context="fp4 boundaries")
