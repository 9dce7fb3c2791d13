"""Blockwise fp8: one float32 scale per tile of a 2-D tensor, float8_e4m3fn codes, as
DeepSeek-V3 trains (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437, section
3.3.2 "Fine-grained quantization": activations and gradients in 1x128 tiles, one scale per
token per 128 channels; weights in 128x128 blocks; the scale from the tile's amax, computed
online). A tile's outlier then costs only its own tile the precision a per-tensor scale
(reference/fp8_scaling.py) would cost the whole tensor.

Three libraries implement the recipe and disagree on the scale. Each is a variant of the
same functions; the default is DeepSeek's own (DeepGEMM, the recipe the others follow).
`f32(v)` rounds to float32 (nearest even), `e4m3(v)` is float8_e4m3fn nearest even,
`clamp448(v)` = min(max(v, -448), 448), each tile's amax = max |x| over the tile:

    deepseek (DeepGEMM deep_gemm/utils/math.py, per_token_cast_to_fp8 and
    per_block_cast_to_fp8, commit 54e22612409371d6364144b69086735beb54e98b):
        amax  = max(amax_f32, f32(1e-4))         # a NaN amax stays NaN
        sf    = f32(amax / 448)                  # float32 division
        q     = e4m3(clamp448(f32(x * f32(1 / sf))))
        scale = sf                               # stored: the decode scale

    torchao (torchao v0.18.0, prototype/blockwise_fp8_training/kernels.py,
    torch_blockwise_scale_act_quant_lhs and torch_blockwise_scale_weight_quant, commit
    5f2baf9d575cf732362594c998c399902942531f):
        amax  = max(f64(amax_f32), 1e-12)        # in float64
        s     = f32(448 / amax)                  # float64 division, rounded once
        q     = e4m3(clamp448(f32(x * s)))
        scale = f32(1 / s)                       # stored: the reciprocal

    transformer_engine (TE Float8BlockScaling, power_2_scale, amax_epsilon 0:
    common/recipe/recipe_common.cuh compute_scale_from_amax, common/transpose/
    quantize_transpose_{vector,square}_blockwise.cu, commit
    d0067d0da6cb01811b8072a7d304f0e00344ce2b):
        amax  = fmax over |x|                    # a NaN is dropped
        if amax is 0, inf or NaN: s = 1
        else: s = f32(448 / amax), FLT_MAX if that is inf
        s     = bits(s) & 0xFF800000             # rounded DOWN to a power of two
        q     = e4m3(clamp448(f32(x * s)))       # satfinite
        scale = f32(1 / s)                       # exact: s is a power of two

Each library casts with saturation (torch >= 2.13's `.to(float8_e4m3fn)`, PTX
`cvt...satfinite`): the clamp before a nearest-even cast gives the same codes whatever the
cast's own overflow policy (NOTE [ float8_e4m3fn overflow ] in reference/formats.py): 464
rounds to 448 either way, inf becomes 448, NaN stays NaN. So an inf element gives DeepSeek
sf = inf, 1 / sf = 0 and inf * 0 = NaN; torchao s = 0 and NaN likewise, with scale inf; TE
scale 1 and that element 448. A NaN element makes DeepSeek's and torchao's whole tile NaN and
only itself under TE. Where they differ, by input class: docs/fp8.md, "Blockwise fp8".

Shapes: x is a float32 (M, N) array (bf16 values are float32 values; cast first); a shape
not divisible by the tile is padded with zeros to whole tiles, as DeepGEMM pads, which leaves
each amax as it is. Scales are (ceil(M / r), ceil(N / c)) for a tile (r, c); codes are x's
shape. dequantize_blockwise gives f32(q * scale), tile by tile.
"""

from __future__ import annotations

import numpy as np
from ml_dtypes import float8_e4m3fn

from common.arg_ranges import BLOCKWISE_VARIANTS, TILE_SIDES
from reference.formats import encode, get_format

TILE_1x128 = (1, 128)  # activations and gradients: one scale per row per 128 columns
TILE_128x128 = (128, 128)  # weights
VARIANTS = BLOCKWISE_VARIANTS  # the declared range (common/arg_ranges.py)
E4M3_MAX = 448.0  # 0x1.cp8, float8_e4m3fn's largest finite
DEEPSEEK_EPS = np.float32(1e-4)  # DeepGEMM's clamp(min=1e-4) on a float32 amax
TORCHAO_EPS = 1e-12  # torchao's EPS, a float64 clamp
FLT_MAX = np.float32(np.finfo(np.float32).max)  # 0x1.fffffep127
_EXPONENT_BITS = np.uint32(0xFF800000)  # sign and exponent of a float32


def block_amax(x: np.ndarray, tile: tuple[int, int], variant: str = "deepseek") -> np.ndarray:
    """Each tile's max |x|, float32 (ceil(M / r), ceil(N / c)): NaN propagates, except under
    transformer_engine, whose fmaxf drops it (a tile of NaNs only: 0)."""
    a = _tiles(_check(x, tile, variant, "block_amax"), tile)  # (M/r, N/c, r*c)
    if variant == "transformer_engine":
        return np.max(np.where(np.isnan(a), np.float32(0), np.abs(a)), axis=-1)
    return np.max(np.abs(a), axis=-1)


def block_scales(x: np.ndarray, tile: tuple[int, int], variant: str = "deepseek"
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(multiplier, scale), float32 per tile: x * multiplier is cast, q * scale decodes; the
    variant's rule in the module docstring."""
    _check(x, tile, variant, "block_scales")  # its own name in the error line
    amax = block_amax(x, tile, variant)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if variant == "deepseek":
            sf = np.maximum(amax, DEEPSEEK_EPS) / np.float32(E4M3_MAX)
            return np.float32(1) / sf, sf
        if variant == "torchao":
            s = (E4M3_MAX / np.maximum(amax.astype(np.float64), TORCHAO_EPS)).astype(np.float32)
            return s, np.float32(1) / s
        s = np.float32(E4M3_MAX) / amax
        s = np.where(np.isinf(s), FLT_MAX, s)
        s = np.where(np.isfinite(amax) & (amax > 0), s, np.float32(1))
        s = (s.view(np.uint32) & _EXPONENT_BITS).view(np.float32)
        return s, (1.0 / s.astype(np.float64)).astype(np.float32)


def quantize_blockwise(x: np.ndarray, tile: tuple[int, int], variant: str = "deepseek"
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scales): float8_e4m3fn codes of x's shape, float32 decode scales per tile."""
    _check(x, tile, variant, "quantize_blockwise")
    multiplier, scale = block_scales(x, tile, variant)
    m, n = np.shape(x)
    expanded = _expand(multiplier, tile, (m, n))  # (M, N): each element's tile multiplier
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0: NaN; beyond FLT_MAX: inf
        scaled = np.asarray(x, dtype=np.float32) * expanded
    clamped = np.clip(scaled, np.float32(-E4M3_MAX), np.float32(E4M3_MAX))
    codes = encode(clamped, get_format("float8_e4m3fn"))  # nearest even, nothing beyond 448
    return codes.astype(np.uint8).view(float8_e4m3fn), scale


def dequantize_blockwise(codes: np.ndarray, scales: np.ndarray, tile: tuple[int, int]
                         ) -> np.ndarray:
    """f32(q * scale), each code times its tile's decode scale."""
    _check_tile(tile, "dequantize_blockwise")
    q = np.asarray(codes).astype(np.float32)
    if q.ndim != 2 or np.shape(scales) != _grid(q.shape, tile):
        raise ValueError(f"dequantize_blockwise: codes {q.shape} and scales "
                         f"{np.shape(scales)} do not match tile {tile}")
    with np.errstate(invalid="ignore", over="ignore"):
        return q * _expand(np.asarray(scales, dtype=np.float32), tile, q.shape)


def _grid(shape: tuple[int, ...], tile: tuple[int, int]) -> tuple[int, int]:
    return (-(-shape[0] // tile[0]), -(-shape[1] // tile[1]))


def _within(tile: tuple[int, int], shape: tuple[int, ...]) -> tuple[int, int]:
    """The tile cut to the matrix: a side longer than the matrix's covers all of it, one
    tile, whose zero padding changes no amax, so it is never allocated."""
    return min(tile[0], shape[0]), min(tile[1], shape[1])


def _tiles(a: np.ndarray, tile: tuple[int, int]) -> np.ndarray:
    """(M/r, N/c, r*c): x zero-padded to whole tiles, each tile's elements on the last axis."""
    (gm, gn), (r, c) = _grid(a.shape, tile), _within(tile, a.shape)
    padded = np.zeros((gm * r, gn * c), dtype=np.float32)
    padded[: a.shape[0], : a.shape[1]] = a
    return padded.reshape(gm, r, gn, c).transpose(0, 2, 1, 3).reshape(gm, gn, r * c)


def _expand(per_tile: np.ndarray, tile: tuple[int, int], shape: tuple[int, int]) -> np.ndarray:
    """(M, N): each tile's value at each of its elements."""
    r, c = _within(tile, shape)
    return np.repeat(np.repeat(per_tile, r, axis=0), c, axis=1)[: shape[0], : shape[1]]


def _check(x: object, tile: object, variant: str, where: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype != np.float32:
        raise TypeError(f"{where}: x must be float32, got {a.dtype}")
    if a.ndim != 2 or a.size == 0:
        raise ValueError(f"{where}: x must be a non-empty (M, N) matrix, got shape "
                         f"{tuple(a.shape)}")
    _check_tile(tile, where)
    if variant not in VARIANTS:
        raise ValueError(f"{where}: variant must be one of {VARIANTS}, got {variant!r}")
    return a


def _check_tile(tile: object, where: str) -> None:
    """ValueError unless `tile` is two ints (rows, columns) in TILE_SIDES."""
    if (not isinstance(tile, tuple) or len(tile) != 2
            or not all(type(t) is int and t in TILE_SIDES for t in tile)):
        raise ValueError(f"{where}: tile must be two ints (rows, columns) in [{TILE_SIDES[0]}, "
                         f"2^63), got {tile!r}")
