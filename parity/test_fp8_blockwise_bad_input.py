"""Bad input to the blockwise fp8 twins (reference/fp8_blockwise.py,
torch_impl/fp8_blockwise.py): a shape the 128-wide tile does not divide follows the stated
padding rule (zeros to whole tiles, as DeepGEMM pads; scales (ceil(M / r), ceil(N / c))),
checked against the matrix padded by hand; a variant that does not exist gets the same
one-line error in both trees (claim fp8_blockwise.twins; an error line counts one value),
naming the function called and listing the accepted variants. Every other ranged argument
at its edges: test_fp8_blockwise_edges.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity.compare import assert_claim
from parity.drivers.edges import judge, outcome, to_torch
from reference import fp8_blockwise as rbw
from torch_impl import fp8_blockwise as tbw

_RNG = np.random.default_rng(13)
# 130 x 200: neither side a multiple of 128; row 3 2^10 larger, so tiles differ; the partial
# tiles' values 2^-10 smaller, so padding with anything but zeros would move their amax
X = _RNG.standard_normal((130, 200)).astype(np.float32)
X[3] *= np.float32(1024)
X[:, 128:] *= np.float32(2**-10)
X[128:] *= np.float32(2**-10)


def _padded() -> np.ndarray:
    padded = np.zeros((256, 256), np.float32)
    padded[:130, :200] = X
    return padded


@pytest.mark.parametrize("variant", rbw.VARIANTS)
@pytest.mark.parametrize("tile", [rbw.TILE_1x128, rbw.TILE_128x128])
def test_quantize_blockwise_pads_to_whole_tiles_with_zeros(device: str, tile: tuple[int, int],
                                                           variant: str) -> None:
    """A (130, 200) matrix quantizes as its zero-padded (256, 256) copy, cut back: codes
    (130, 200) and scales (ceil(130 / r), 2), in both trees."""
    want_codes, want_scales = rbw.quantize_blockwise(_padded(), tile, variant)
    codes, scales = rbw.quantize_blockwise(X, tile, variant)
    grid = (-(-130 // tile[0]), 2)
    assert codes.shape == (130, 200) and scales.shape == grid
    assert np.array_equal(codes.view(np.uint8), want_codes[:130, :200].view(np.uint8))
    assert np.array_equal(scales.view(np.uint32), want_scales[: grid[0]].view(np.uint32))
    t_codes, t_scales = tbw.quantize_blockwise(to_torch(X, device), tile, variant)
    assert_claim("fp8_blockwise.twins", actual=t_codes.cpu().view(torch.uint8).numpy(),
                 expected=codes.view(np.uint8), context=f"{tile} {variant}")
    assert_claim("fp8_blockwise.twins", actual=t_scales.cpu().numpy(), expected=scales,
                 context=f"{tile} {variant} scales")


@pytest.mark.parametrize("where", ["block_amax", "block_scales", "quantize_blockwise"])
@pytest.mark.parametrize("variant", ["deepgemm", "te", "DeepSeek", ""])
def test_an_unknown_variant_lists_the_accepted_ones_naming_the_function(
        device: str, where: str, variant: str) -> None:
    """One line naming the function called, the variant given and every accepted one."""
    ref, tor = (outcome(lambda: getattr(rbw, where)(X, rbw.TILE_1x128, variant)),
                outcome(lambda: getattr(tbw, where)(to_torch(X, device), tbw.TILE_1x128,
                                                    variant)))
    assert ref.error is not None, f"{where}: the reference accepted {variant!r}"
    judge("fp8_blockwise.twins", ref, tor, f"{where} {variant!r}")
    assert ref.error.startswith(f"ValueError: {where}: variant"), ref.error
    assert repr(variant) in ref.error and all(v in ref.error for v in rbw.VARIANTS), ref.error
