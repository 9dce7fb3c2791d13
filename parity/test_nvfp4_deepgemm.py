"""nvfp4.quantize(rounding="deepgemm"): DeepGEMM's fp4 cast (deep_gemm/utils/math.py,
_quantize_to_fp4_e2m1, commit 54e22612409371d6364144b69086735beb54e98b) in place of TE's
nearest even, held to test vectors derived here from its source lines (quoted in
reference/nvfp4.py's docstring), and the same bits in both trees (nvfp4.twins)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from parity.compare import assert_claim
from parity.drivers.edges import judge, outcome, to_torch
from reference import nvfp4 as rnv
from torch_impl import nvfp4 as tnv

# One 1x16 block whose amax is the global amax 6, so that S = 448 and R = 1: each element
# is cast as it is. (value, DeepGEMM's code, TE's nearest-even code), from the source:
# DeepGEMM's magnitude code counts the midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0 that
# are strictly below |x| (a tie goes down), and sets the sign bit 0x8 only on a nonzero code;
# nearest even takes the even code (0, 0.5, 1, 1.5, 2, 3, 4, 6 are codes 0..7) at a tie and
# keeps the sign of zero.
VECTORS = (
    (6.0, 0x7, 0x7),
    (0.25, 0x0, 0x0),  # between codes 0 and 1: both down
    (0.75, 0x1, 0x2),  # between 1 and 2: DeepGEMM 0.5, TE 1
    (1.25, 0x2, 0x2),
    (1.75, 0x3, 0x4),  # DeepGEMM 1.5, TE 2
    (2.5, 0x4, 0x4),
    (3.5, 0x5, 0x6),  # DeepGEMM 3, TE 4
    (5.0, 0x6, 0x6),
    (-0.75, 0x9, 0xA),
    (-1.75, 0xB, 0xC),
    (-3.5, 0xD, 0xE),
    (-0.1, 0x0, 0x8),  # rounds to zero: DeepGEMM +0, TE -0
    (-0.0, 0x0, 0x8),
    (float(np.nextafter(np.float32(0.75), np.float32(1))), 0x2, 0x2),  # past the tie: up
    (5.5, 0x7, 0x7),
    (0.5, 0x1, 0x1),
)
# a second block, amax inf (S = 448, R = 1 still): DeepGEMM needs no clamp
INF_BLOCK = ((np.inf, 0x7, 0x7), (-np.inf, 0xF, 0xF), (-7.0, 0xF, 0xF), (0.3, 0x1, 0x1))


def _vectors() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = list(VECTORS) + list(INF_BLOCK) + [(0.0, 0x0, 0x0)] * (16 - len(INF_BLOCK))
    x = np.array([[v for v, _, _ in rows]], np.float32)  # (1, 32): two blocks
    return (x, np.array([[d for _, d, _ in rows]], np.uint8),
            np.array([[t for _, _, t in rows]], np.uint8))


@pytest.mark.parametrize("rounding", ["deepgemm", "nearest_even"])
def test_deepgemm_rounding_gives_the_codes_read_from_its_source(device: str, rounding: str
                                                                ) -> None:
    """Ties toward zero (0.75 -> 0.5, 1.75 -> 1.5, 3.5 -> 3) and an unsigned zero under
    DeepGEMM; ties to even and a signed zero under TE's nearest even; both trees."""
    x, deepgemm, nearest_even = _vectors()
    want = deepgemm if rounding == "deepgemm" else nearest_even
    codes, scales, amax = rnv.quantize(x, (1, 16), 6.0, rounding=rounding)
    values = rnv.dequantize(codes, scales, amax)
    # the guard: R = 1, each block's scale decodes to 1, so the codes are of x itself
    finite = np.isfinite(values[0, :16])
    assert np.array_equal(np.abs(values[0, :16][finite]),
                          np.array([0, .5, 1, 1.5, 2, 3, 4, 6], np.float32)[want[0, :16] & 7]
                          [finite]), values
    assert np.array_equal(codes, want), (codes, want)
    t_codes, t_scales, _ = tnv.quantize(to_torch(x, device), (1, 16), 6.0, rounding=rounding)
    assert_claim("nvfp4.twins", actual=t_codes.cpu().numpy(), expected=codes,
                 context=f"{rounding} vectors")
    assert_claim("nvfp4.twins", actual=t_scales.cpu().numpy(), expected=scales,
                 context=f"{rounding} vectors scales")


def test_deepgemm_rounding_makes_a_nan_block_unsigned_zeros(device: str) -> None:
    """A NaN makes the block's scale and every scaled value NaN; DeepGEMM's comparisons are
    all false, so every code is +0 (0x0), in both trees."""
    x = np.linspace(-3, 3, 32, dtype=np.float32)[None, :]
    x[0, 20] = np.nan
    codes, _, _ = rnv.quantize(x, (1, 16), 6.0, rounding="deepgemm")
    assert np.array_equal(codes[0, 16:], np.zeros(16, np.uint8)) and codes[0, :16].any()
    t_codes, _, _ = tnv.quantize(to_torch(x, device), (1, 16), 6.0, rounding="deepgemm")
    assert_claim("nvfp4.twins", actual=t_codes.cpu().numpy(), expected=codes, context="nan")


@pytest.mark.parametrize("tile", [(1, 16), (16, 16)])
@pytest.mark.parametrize("with_rht", [False, True])
def test_deepgemm_rounding_gives_the_same_codes_in_both_trees(device: str, tile: tuple,
                                                               with_rht: bool) -> None:
    """A matrix of quarters, both tiles, with and without the RHT: the same codes and scales
    in both trees; and they part from nearest even only at the three ties and -0.25."""
    rng = np.random.default_rng(7)
    # values on a fine grid hit the ties 0.75, 1.75 and 3.5 after scaling by R = 1 at A = 6
    x = (rng.integers(-24, 25, (48, 80)) / 4).astype(np.float32)
    x[:, ::16] = 6.0
    if with_rht:
        x = x.astype(ml_dtypes.bfloat16)
    ref = rnv.quantize(x, tile, 6.0, rounding="deepgemm", with_rht=with_rht)
    tor = tnv.quantize(to_torch(x, device), tile, 6.0, rounding="deepgemm", with_rht=with_rht)
    for name, r, t in zip(("codes", "scales"), ref, tor, strict=False):
        assert_claim("nvfp4.twins", actual=t.cpu().numpy(), expected=r,
                     context=f"{tile} rht={with_rht} {name}")
    if not with_rht:
        even = rnv.quantize(x, tile, 6.0)[0]
        parted = ref[0] != even
        assert parted.any()
        # the ties 0.75, 1.75, 3.5 of either sign, and -0.25: a tie down to zero, unsigned
        assert set(np.unique(x[parted]).tolist()) <= {-3.5, -1.75, -0.75, -0.25, 0.75, 1.75,
                                                     3.5}, np.unique(x[parted])


def test_four_over_six_refuses_deepgemm_rounding_in_one_line(device: str) -> None:
    """Four Over Six's candidates are nearest even: rounding='deepgemm' with it is refused,
    the same line in both trees."""
    x = np.ones((1, 16), np.float32)
    ref = outcome(lambda: rnv.quantize(x, (1, 16), rounding="deepgemm", four_over_six=True))
    tor = outcome(lambda: tnv.quantize(to_torch(x, device), (1, 16), rounding="deepgemm",
                                       four_over_six=True))
    assert ref.error is not None and "deepgemm" in ref.error, ref.error
    judge("nvfp4.twins", ref, tor, "four_over_six with deepgemm")
