"""Blockwise fp8 with PyTorch's native API. See reference/fp8_blockwise.py for the math (the
three variants' rules, their sources, the zero padding); same public names, same order.
What PyTorch does differently or hides:

- Tiles are a view: pad with torch.nn.functional.pad (zeros), then reshape and permute, as
  DeepGEMM's per_block_cast_to_fp8 does; amax by torch.amax over the tile's elements (NaN
  propagates), or for transformer_engine over |x| with NaN replaced by 0 (fmaxf drops it).
- A Python float in `tensor op float` enters as float32 (448.0, 1.0), so the DeepSeek and TE
  divisions are float32 ones; torchao's is its own line, a float64 clamp and division.
- The power-of-two mask is a bit view: `s.view(torch.int32) & 0xFF800000 - 2**32` (the mask
  as a signed int32), then viewed back as float32.
- The cast is `.to(torch.float8_e4m3fn)` after a clamp to +-448, so the codes do not depend
  on whether this torch's cast saturates (from 2.13) or gives NaN (2.6-2.12).
Works on CPU and CUDA tensors alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from common.arg_ranges import BLOCKWISE_VARIANTS, TILE_SIDES

TILE_1x128 = (1, 128)
TILE_128x128 = (128, 128)
VARIANTS = BLOCKWISE_VARIANTS  # the declared range (common/arg_ranges.py)
E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448.0
DEEPSEEK_EPS = 1e-4  # clamp(min=1e-4) on a float32 amax: the bound is f32(1e-4)
TORCHAO_EPS = 1e-12
FLT_MAX = torch.finfo(torch.float32).max  # 0x1.fffffep127
_EXPONENT_BITS = 0xFF800000 - 2**32  # as a signed int32


def block_amax(x: torch.Tensor, tile: tuple[int, int], variant: str = "deepseek"
               ) -> torch.Tensor:
    """Each tile's max |x|, float32; NaN propagates except under transformer_engine."""
    a = _tiles(_check(x, tile, variant, "block_amax"), tile)  # (M/r, N/c, r*c)
    if variant == "transformer_engine":
        return torch.amax(torch.where(torch.isnan(a), 0.0, torch.abs(a)), dim=-1)
    amax = torch.amax(torch.abs(a), dim=-1)
    # a NaN amax as the quiet NaN 0x7fc00000 (NumPy's): torch's strided reduction of a tile
    # one column wide gives the NaN 0xffffffff, and the scales are compared bit for bit
    return torch.where(torch.isnan(amax), torch.nan, amax)


def block_scales(x: torch.Tensor, tile: tuple[int, int], variant: str = "deepseek"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(multiplier, scale), float32 per tile."""
    _check(x, tile, variant, "block_scales")  # its own name in the error line
    amax = block_amax(x, tile, variant)
    if variant == "deepseek":
        sf = amax.clamp(min=DEEPSEEK_EPS) / E4M3_MAX
        return 1.0 / sf, sf
    if variant == "torchao":
        s = (E4M3_MAX / amax.to(torch.float64).clamp(min=TORCHAO_EPS)).to(torch.float32)
        return s, 1.0 / s
    s = E4M3_MAX / amax
    s = torch.where(torch.isinf(s), FLT_MAX, s)
    s = torch.where(torch.isfinite(amax) & (amax > 0), s, 1.0)
    s = (s.view(torch.int32) & _EXPONENT_BITS).view(torch.float32)
    return s, (1.0 / s.to(torch.float64)).to(torch.float32)


def quantize_blockwise(x: torch.Tensor, tile: tuple[int, int], variant: str = "deepseek"
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales): float8_e4m3fn codes of x's shape, float32 decode scales per tile."""
    _check(x, tile, variant, "quantize_blockwise")
    multiplier, scale = block_scales(x, tile, variant)
    m, n = x.shape
    expanded = _expand(multiplier, tile, (m, n))  # (M, N)
    scaled = x * expanded
    return scaled.clamp(min=-E4M3_MAX, max=E4M3_MAX).to(torch.float8_e4m3fn), scale


def dequantize_blockwise(codes: torch.Tensor, scales: torch.Tensor, tile: tuple[int, int]
                         ) -> torch.Tensor:
    """f32(q * scale), each code times its tile's decode scale."""
    _check_tile(tile, "dequantize_blockwise")
    q = codes.to(torch.float32)
    if q.ndim != 2 or tuple(scales.shape) != _grid(tuple(q.shape), tile):
        raise ValueError(f"dequantize_blockwise: codes {tuple(q.shape)} and scales "
                         f"{tuple(scales.shape)} do not match tile {tile}")
    return q * _expand(scales.to(torch.float32), tile, tuple(q.shape))


def _grid(shape: tuple[int, ...], tile: tuple[int, int]) -> tuple[int, int]:
    return (-(-shape[0] // tile[0]), -(-shape[1] // tile[1]))


def _within(tile: tuple[int, int], shape: tuple[int, ...]) -> tuple[int, int]:
    """The tile cut to the matrix (reference: the same)."""
    return min(tile[0], shape[0]), min(tile[1], shape[1])


def _tiles(a: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """(M/r, N/c, r*c): x zero-padded to whole tiles, each tile's elements on the last axis."""
    (gm, gn), (r, c) = _grid(tuple(a.shape), tile), _within(tile, tuple(a.shape))
    padded = F.pad(a, (0, gn * c - a.shape[1], 0, gm * r - a.shape[0]))
    return padded.reshape(gm, r, gn, c).permute(0, 2, 1, 3).reshape(gm, gn, r * c)


def _expand(per_tile: torch.Tensor, tile: tuple[int, int], shape: tuple[int, ...]
            ) -> torch.Tensor:
    """(M, N): each tile's value at each of its elements."""
    r, c = _within(tile, shape)
    expanded = per_tile.repeat_interleave(r, dim=0).repeat_interleave(c, dim=1)
    return expanded[: shape[0], : shape[1]]


def _check(x: object, tile: object, variant: str, where: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        what = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{where}: x must be float32, got {str(what).removeprefix('torch.')}")
    if x.ndim != 2 or x.numel() == 0:
        raise ValueError(f"{where}: x must be a non-empty (M, N) matrix, got shape "
                         f"{tuple(x.shape)}")
    _check_tile(tile, where)
    if variant not in VARIANTS:
        raise ValueError(f"{where}: variant must be one of {VARIANTS}, got {variant!r}")
    return x


def _check_tile(tile: object, where: str) -> None:
    """ValueError unless `tile` is two ints (rows, columns) in TILE_SIDES."""
    if (not isinstance(tile, tuple) or len(tile) != 2
            or not all(type(t) is int and t in TILE_SIDES for t in tile)):
        raise ValueError(f"{where}: tile must be two ints (rows, columns) in [{TILE_SIDES[0]}, "
                         f"2^63), got {tile!r}")
