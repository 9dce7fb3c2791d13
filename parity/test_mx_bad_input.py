"""Bad input to the MX twins (reference/mx.py, torch_impl/mx.py; their ranges in
common/mx_ranges.py): a last dimension the block does not divide (32 for MX, 16 for
mx.to_nvfp4: no padding rule) and a name that does not exist (element format, scale mode,
rounding, variant) each get the same one-line error in both trees (claim mx.twins; an error
line counts one value), naming the shape and the block, or listing the accepted names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from common import mx_ranges
from parity.drivers.edges import judge, outcome, to_torch
from reference import mx as rmx
from torch_impl import mx as tmx

_RNG = np.random.default_rng(12)
X32 = _RNG.standard_normal((3, 32)).astype(np.float32)


def _same_error(ref_call: Callable[[], Any], torch_call: Callable[[], Any], context: str) -> str:
    """Both trees raise, the same one line (recorded under mx.twins); that line."""
    ref, tor = outcome(ref_call), outcome(torch_call)
    assert ref.error is not None, f"{context}: the reference accepted it"
    judge("mx.twins", ref, tor, context)
    return ref.error


@pytest.mark.parametrize("columns", [33, 48, 16, 1])
def test_to_mx_refuses_a_last_dimension_the_block_of_32_does_not_divide(device: str,
                                                                        columns: int) -> None:
    """One line naming the shape and the block size 32."""
    x = _RNG.standard_normal((3, columns)).astype(np.float32)
    line = _same_error(lambda: rmx.to_mx(x, "float8_e4m3fn", "floor"),
                       lambda: tmx.to_mx(to_torch(x, device), "float8_e4m3fn", "floor"),
                       f"to_mx (3, {columns})")
    assert f"(3, {columns})" in line and "block size 32" in line, line


@pytest.mark.parametrize("variant", rmx.NVFP4_VARIANTS)
def test_to_nvfp4_refuses_a_last_dimension_the_block_of_16_does_not_divide(
        device: str, variant: str) -> None:
    """mx.to_nvfp4 has no padding rule (reference/nvfp4.py's quantize has): one line naming
    the shape and the block size 16."""
    x = _RNG.standard_normal((3, 20)).astype(np.float32)
    line = _same_error(lambda: rmx.to_nvfp4(x, variant=variant),
                       lambda: tmx.to_nvfp4(to_torch(x, device), variant=variant), "to_nvfp4")
    assert "(3, 20)" in line and "block size 16" in line, line


UNKNOWN = {  # argument -> (keyword arguments of to_mx, the names it must list)
    "element format": ({"fmt": "fp8", "mode": "floor"}, mx_ranges.ELEMENT_FORMATS),
    "scale mode": ({"fmt": "float8_e4m3fn", "mode": "round"}, mx_ranges.SCALE_MODES),
    "rounding": ({"fmt": "float8_e4m3fn", "mode": "floor", "rounding": "stochastic"},
                 mx_ranges.ROUNDINGS),
    "variant": ({"fmt": "float8_e4m3fn", "mode": "floor", "variant": "nvidia"},
                mx_ranges.VARIANTS),
}


@pytest.mark.parametrize("argument", list(UNKNOWN))
def test_an_unknown_name_lists_the_accepted_ones(device: str, argument: str) -> None:
    """An element format, scale mode, rounding or variant that does not exist: one line
    listing every accepted name."""
    kwargs, accepted = UNKNOWN[argument]
    line = _same_error(lambda: rmx.to_mx(X32, **kwargs),
                       lambda: tmx.to_mx(to_torch(X32, device), **kwargs), argument)
    assert all(name in line for name in accepted), line


def test_an_unknown_nvfp4_variant_lists_the_accepted_ones(device: str) -> None:
    """mx.to_nvfp4's variant that does not exist: one line listing both recipes."""
    x = X32[:, :16].copy()
    line = _same_error(lambda: rmx.to_nvfp4(x, variant="te"),
                       lambda: tmx.to_nvfp4(to_torch(x, device), variant="te"), "variant")
    assert all(name in line for name in mx_ranges.NVFP4_VARIANTS) and "'te'" in line, line
