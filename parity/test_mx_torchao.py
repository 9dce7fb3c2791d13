"""reference.mx against its oracle, torchao 0.18's prototype MX and NVFP4 code on CPU
(claims mx.torchao, mx.nvfp4_torchao): to_mx for every element format and scale mode,
to_dtype (from_mx), nvfp4_quantize with one and two scale levels, and torchao's fp4 packing.
Skipped, saying so, without torchao (the oracles extra: pip install -e .[oracles]).
"""

from __future__ import annotations

import logging

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import event, given, settings

from parity.compare import assert_claim
from parity.drivers import mx as drv
from parity.extras import import_extra
from parity.strategies import edge_array, edge_block, examples, mx_blocks
from reference import mx as rmx

torchao = import_extra("torchao", "the MX oracle")
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # torchao's enum notices
from torchao.prototype.mx_formats import mx_tensor as ao  # noqa: E402
from torchao.prototype.mx_formats import nvfp4_tensor as ao_nvfp4  # noqa: E402
from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: E402

ELEM = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
        "float6_e2m3fn": "fp6_e2m3", "float6_e3m2fn": "fp6_e3m2",
        "float4_e2m1fn": torch.float4_e2m1fn_x2}
# reference mode -> torchao's ScaleCalculationMode (torchao's RCEIL on CPU is rceil_log2f)
MODES = {"floor": ScaleCalculationMode.FLOOR, "ceil": ScaleCalculationMode.CEIL,
         "even": ScaleCalculationMode.EVEN, "rceil_log2f": ScaleCalculationMode.RCEIL}


def _torchao_to_mx(x: np.ndarray, fmt: str, mode: str) -> tuple[np.ndarray, torch.Tensor]:
    """(scale codes, torchao's element tensor as it returns it)."""
    scale, data = ao.to_mx(drv.to_torch(x), ELEM[fmt], 32, MODES[mode])
    return scale.view(torch.uint8).numpy(), data


def _element_codes(data: torch.Tensor, fmt: str) -> np.ndarray:
    """torchao's elements as one uint8 code each (fp4 comes packed two per byte)."""
    codes = data.contiguous().view(torch.uint8).numpy()
    return rmx.unpack_fp4(codes) if fmt == "float4_e2m1fn" else codes


def _check(x: np.ndarray, fmt: str, mode: str, context: str) -> None:
    ref = rmx.to_mx(x, fmt, mode, variant="torchao")  # NOTE [ torchao's variant ]
    scales, data = _torchao_to_mx(x, fmt, mode)
    assert_claim("mx.torchao", actual=ref.scales, expected=scales, context=f"{context} scales")
    finite = np.repeat(ref.scales != rmx.E8M0_NAN, 32, axis=-1)  # blocks whose scale is a number
    assert_claim("mx.torchao", actual=ref.elements[finite],
                 expected=_element_codes(data, fmt)[finite], context=f"{context} elements")
    if fmt == "float4_e2m1fn":  # the packing itself: torchao's bytes where no block is NaN
        rows = finite.all(axis=-1)
        assert_claim("mx.torchao", actual=rmx.pack_fp4(ref.elements)[rows],
                     expected=data.view(torch.uint8).numpy()[rows], context=f"{context} packed")
    e8m0 = torch.from_numpy(scales).view(torch.float8_e8m0fnu)
    values = ao.to_dtype(data, e8m0, ELEM[fmt], 32, torch.float32).numpy()
    ref_values = rmx.from_mx(ref)
    assert np.all(np.isnan(ref_values[~finite])), "a NaN scale makes its block NaN"
    assert_claim("mx.torchao", actual=np.where(finite, ref_values, 0),
                 expected=np.where(finite, values, 0), context=f"{context} from_mx")
    assert np.all(np.isnan(values[~finite])), "torchao: a NaN scale makes its block NaN"


@pytest.mark.parametrize("fmt", rmx.ELEMENT_FORMATS)
@pytest.mark.parametrize("mode", list(MODES))
def test_to_mx_gives_torchaos_scales_and_elements_on_edge_blocks(fmt: str, mode: str) -> None:
    """Every edge kind 8 times, amax from 2^-100 to 2^100: codes and decoded values."""
    x = edge_array(fmt, seed=3)
    _check(x, fmt, mode, f"{fmt} {mode}")
    codes = rmx.to_mx(x, fmt, mode, variant="torchao").scales
    assert {0, 255} <= set(codes.ravel().tolist()), "guard: the smallest scale and NaN"


@pytest.mark.parametrize("fmt", rmx.ELEMENT_FORMATS)
def test_to_mx_of_bfloat16_input_gives_torchaos_bits(fmt: str) -> None:
    """bfloat16 input, widened exactly to float32 by both: floor and rceil_log2f."""
    x = edge_array(fmt, seed=6).astype(ml_dtypes.bfloat16)
    for mode in ("floor", "rceil_log2f"):
        _check(x, fmt, mode, f"{fmt} {mode} bfloat16")


@given(case=mx_blocks())
@settings(examples(25))
def test_to_mx_gives_torchaos_bits_for_any_blocks(case: tuple[str, str, list[str], np.ndarray]
                                                  ) -> None:
    """Any mix of edge blocks; rceil (exact) is judged by tests of its own, not torchao."""
    fmt, mode, kinds, x = case
    mode = "rceil_log2f" if mode == "rceil" else mode
    for kind in set(kinds):
        event(kind)
    _check(x, fmt, mode, f"{fmt} {mode} {kinds}")


def test_torchaos_cpu_rceil_is_not_cublass_exact_rule_just_above_powers_of_two() -> None:
    """NOTE [ rceil in float32 ]: torchao's RCEIL equals rceil_log2f (above) and differs from
    the exact rceil exactly where the two reference rules differ; there it clips."""
    rng = np.random.default_rng(5)
    x = np.stack([edge_block("above_elem_max", "float8_e4m3fn", j, rng)
                  for j in range(-60, 60)])
    scales, _ = _torchao_to_mx(x, "float8_e4m3fn", "rceil_log2f")
    exact = rmx.to_mx(x, "float8_e4m3fn", "rceil", variant="torchao").scales
    log2f = rmx.to_mx(x, "float8_e4m3fn", "rceil_log2f", variant="torchao").scales
    assert_claim("mx.torchao", actual=log2f, expected=scales, context="rceil_log2f")
    differ = exact != scales
    assert differ.sum() > 10, "guard: the trap is hit"
    assert np.array_equal(scales[differ].astype(int) + 1, exact[differ].astype(int))
    assert rmx.clipped_blocks(x, "float8_e4m3fn", "rceil") == 0
    assert rmx.clipped_blocks(x, "float8_e4m3fn", "rceil_log2f") == int(differ.sum())


def _check_nvfp4(x: np.ndarray, two_level: bool, context: str) -> None:
    finite_x = np.where(np.isfinite(x), x, np.float32(0))
    g = ao_nvfp4.per_tensor_amax_to_scale(torch.from_numpy(finite_x).abs().max()) \
        if two_level else None
    ours_g = rmx.per_tensor_scale(finite_x) if two_level else None
    if two_level:
        assert_claim("mx.nvfp4_torchao", actual=np.float32(ours_g), expected=g.numpy(),
                     context=f"{context} g")
    scales, data = ao_nvfp4.nvfp4_quantize(torch.from_numpy(x), 16, g)
    ref = rmx.to_nvfp4(x, ours_g, variant="torchao")
    assert_claim("mx.nvfp4_torchao", actual=ref.scales, expected=scales.view(torch.uint8).numpy(),
                 context=f"{context} scales")
    # an element is a number where its block's scale is (e4m3's NaN: 0x7F of either sign)
    # and its scaled value is (NOTE [ NVFP4 below 2^-116 ]: 0 * inf is NaN)
    finite = np.repeat(ref.scales & 0x7F != 0x7F, 16, axis=-1)
    finite &= ~np.isnan(rmx.nvfp4_scaled(x, ours_g, variant="torchao")[1].reshape(x.shape))
    assert_claim("mx.nvfp4_torchao", actual=ref.elements[finite],
                 expected=rmx.unpack_fp4(data.view(torch.uint8).numpy())[finite],
                 context=f"{context} elements")


@pytest.mark.parametrize("two_level", [False, True])
def test_to_nvfp4_gives_torchaos_block_scales_and_elements(two_level: bool) -> None:
    """Edge blocks of 16 (two a row), one scale level and two."""
    x = edge_array("float4_e2m1fn", seed=4)
    _check_nvfp4(x, two_level, f"two_level={two_level}")
    codes = rmx.to_nvfp4(x, variant="torchao").scales
    assert 0x7F in codes and 0x08 in codes and 0x7E in codes, \
        "guard: a NaN block, the clamp to 2^-6 and the clamp to 448"
    normal = drv.distributions(64)["student_t3"]  # a tensor's range: S of every significand
    _check_nvfp4(normal, two_level, f"student-t two_level={two_level}")
    g = rmx.per_tensor_scale(normal) if two_level else None
    assert len(set((rmx.to_nvfp4(normal, g, variant="torchao").scales & 7).ravel().tolist())) \
           == 8, \
        "guard: block scales of every e4m3 significand"


@given(case=mx_blocks(block_size=16))
@settings(examples(20))
def test_to_nvfp4_gives_torchaos_bits_for_any_blocks(
        case: tuple[str, str, list[str], np.ndarray]) -> None:
    """Any mix of edge blocks of 16, with and without the per-tensor scale."""
    _, _, kinds, x = case
    for kind in set(kinds):
        event(kind)
    for two_level in (False, True):
        _check_nvfp4(x, two_level, f"{kinds} two_level={two_level}")
