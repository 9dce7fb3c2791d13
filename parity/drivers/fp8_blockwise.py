"""Blockwise fp8 in both trees: run reference.fp8_blockwise and torch_impl.fp8_blockwise on
one input and return NumPy arrays (codes as ml_dtypes float8_e4m3fn, scales float32) for
parity/compare.py."""

from __future__ import annotations

import numpy as np

from parity.compare import as_numpy
from reference import fp8_blockwise as rfb


def quantize(x: np.ndarray, tile: tuple[int, int], variant: str, device: str = "cpu"
             ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((codes, scales) of the reference, (codes, scales) of the torch tree)."""
    import torch

    from torch_impl import fp8_blockwise as tfb

    codes, scales = tfb.quantize_blockwise(torch.from_numpy(x).to(device), tile, variant)
    return rfb.quantize_blockwise(x, tile, variant), (as_numpy(codes), as_numpy(scales))


def dequantize(codes: np.ndarray, scales: np.ndarray, tile: tuple[int, int],
               device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """(the reference's values, the torch tree's values) of the same codes and scales."""
    import torch

    from torch_impl import fp8_blockwise as tfb

    t_codes = torch.from_numpy(codes.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    values = tfb.dequantize_blockwise(t_codes.to(device), torch.from_numpy(scales).to(device),
                                      tile)
    return rfb.dequantize_blockwise(codes, scales, tile), as_numpy(values)
