"""NVFP4 training quantization in both trees: run reference.nvfp4 and torch_impl.nvfp4 on one
input and return NumPy arrays (codes and scale codes uint8, values float32, the RHT's
bfloat16 as ml_dtypes') for parity/compare.py."""

from __future__ import annotations

from typing import Any

import numpy as np

from parity.compare import as_numpy
from reference import nvfp4 as rnv


def to_torch(x: np.ndarray | None, device: str = "cpu") -> Any:
    """The torch tensor of the same bits (bfloat16 from ml_dtypes' by its bit view)."""
    import ml_dtypes
    import torch

    if x is None:
        return None
    if x.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.ascontiguousarray(x)).to(device)


def quantize(x: np.ndarray, tile: tuple[int, int], device: str = "cpu", **options: Any
             ) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """((codes, block_scales, A) of the reference, the same of the torch tree); options are
    quantize's keywords (rounding, rbits as uint8 NumPy, four_over_six, with_rht,
    global_amax)."""
    from torch_impl import nvfp4 as tnv

    torch_options = {**options, "rbits": to_torch(options.get("rbits"), device)}
    got = tnv.quantize(to_torch(x, device), tile, **torch_options)
    return rnv.quantize(x, tile, **options), tuple(as_numpy(t) for t in got)


def dequantize(codes: np.ndarray, block_scales: np.ndarray, global_amax: np.float32,
               device: str = "cpu", four_over_six: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
    """(the reference's values, the torch tree's values) of the same codes and scales."""
    import torch

    from torch_impl import nvfp4 as tnv

    values = tnv.dequantize(to_torch(codes, device), to_torch(block_scales, device),
                            torch.tensor(global_amax, dtype=torch.float32),
                            four_over_six=four_over_six)
    return (rnv.dequantize(codes, block_scales, global_amax, four_over_six=four_over_six),
            as_numpy(values))


def rht(x: np.ndarray, device: str = "cpu", inverse: bool = False
        ) -> tuple[np.ndarray, np.ndarray]:
    """(the reference's, the torch tree's) rht (or rht_inverse) of bfloat16 x."""
    from torch_impl import nvfp4 as tnv

    if inverse:
        return rnv.rht_inverse(x), as_numpy(tnv.rht_inverse(to_torch(x, device)))
    return rnv.rht(x), as_numpy(tnv.rht(to_torch(x, device)))


def round_fp4_stochastic(a: np.ndarray, rbits: np.ndarray, device: str = "cpu"
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(the reference's, the torch tree's) stochastic rounding of float32 a on the same
    rbits."""
    from torch_impl import nvfp4 as tnv

    got = tnv.round_fp4_stochastic(to_torch(a, device), to_torch(rbits, device))
    return rnv.round_fp4_stochastic(a, rbits), as_numpy(got)
