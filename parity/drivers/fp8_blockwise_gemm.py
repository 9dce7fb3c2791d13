"""The blockwise fp8 GEMM in both trees: run reference.fp8_blockwise_gemm and
torch_impl.fp8_blockwise_gemm on the same codes and scales and return NumPy float32 arrays
for parity/compare.py; and the sweep behind docs/fp8.md's table of where the three
quantization variants make the GEMM's outputs part."""

from __future__ import annotations

import numpy as np

from parity.compare import as_numpy
from parity.strategies.fp8_blockwise import blockwise_gemm_operands
from reference import fp8_blockwise as rfb
from reference import fp8_blockwise_gemm as rgemm

PAIRS = (("deepseek", "torchao"), ("deepseek", "transformer_engine"),
         ("torchao", "transformer_engine"))


def quantized(x: np.ndarray, w: np.ndarray, variant: str
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(a_codes, a_scales, b_codes, b_scales): x in 1x128 tiles, w in 128x128 blocks, by the
    reference's quantizer (held to torch's by fp8_blockwise.twins)."""
    return (*rfb.quantize_blockwise(x, rfb.TILE_1x128, variant),
            *rfb.quantize_blockwise(w, rfb.TILE_128x128, variant))


def mm(a_codes: np.ndarray, a_scales: np.ndarray, b_codes: np.ndarray, b_scales: np.ndarray,
       device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """(the reference's Y, the torch tree's Y) of the same codes and scales."""
    import torch

    from torch_impl import fp8_blockwise_gemm as tgemm

    def codes(c: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(c.view(np.uint8).copy()).view(torch.float8_e4m3fn).to(device)

    y = tgemm.blockwise_mm(codes(a_codes), torch.from_numpy(a_scales).to(device),
                           codes(b_codes), torch.from_numpy(b_scales).to(device))
    return rgemm.blockwise_mm(a_codes, a_scales, b_codes, b_scales), as_numpy(y)


def variant_outputs(x: np.ndarray, w: np.ndarray) -> dict[str, np.ndarray]:
    """Variant -> the reference GEMM's Y of x and w quantized by that variant."""
    return {v: rgemm.blockwise_mm(*quantized(x, w, v)) for v in rfb.VARIANTS}


def variant_disagreements(seed: int = 0) -> dict[str, list[int]]:
    """Input class -> [outputs, then how many outputs differ (NaN as one value) under each
    pair of PAIRS]."""
    table = {}
    for name, (x, w) in blockwise_gemm_operands(seed).items():
        ys = variant_outputs(x, w)
        row = [ys["deepseek"].size]
        for a, b in PAIRS:
            same = (ys[a] == ys[b]) | (np.isnan(ys[a]) & np.isnan(ys[b]))
            row.append(int((~same).sum()))
        table[name] = row
    return table
