"""NVFP4 training quantization with PyTorch's native API. See reference/nvfp4.py for the math
(Transformer Engine's scale chain, the RHT, stochastic rounding, Four Over Six, the edge
cases); same public names, same order. What PyTorch does differently or hides:

- torch has no unpacked fp4 dtype (float4_e2m1fn_x2 packs two codes a byte), so fp4 codes
  are torch_impl.mx.round_elements' (exact float64 frexp / ldexp / round, half to even; a NaN
  gives the zero of the opposite sign) and are decoded by TE's own table (cast_from_fp4x2):
  the 8 magnitudes of e2m1 indexed by the low 3 bits, the sign by the fourth.
- e4m3 scales are `.to(torch.float8_e4m3fn)` (after the clamp to 448, so whether this torch's
  cast saturates cannot show), its NaN given the reference's canonical code.
- A Python float in `tensor op float` enters as float32: 1536.0, 6.0, 0.25, 1.5 and f32(1/6)
  (written as its float32 word) are exact there, so every step is the float32 operation the
  reference does. But `float / tensor` is torch's reciprocal times the float, two roundings
  (2688.0 / A is 1 ulp off f32(2688 / A) at A = 3.171875): 6 E / A and 1 / (6 E) divide a
  tensor by a tensor. (1.0 / tensor is exact that way: the product by 1 does not round.)
- The RHT's 16-term sum is a loop of float32 `+` in index order, not a matmul: a BLAS or
  tensor-core sum has its own order (reference.nvfp4.rht says when the order can show).
- rounding="deepgemm" is DeepGEMM's own torch lines (`code += (ax > boundary)` over the
  seven midpoints), which the reference quotes.
Works on CPU and CUDA tensors alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_impl.mx import E4M3_MAX, F32_MAX, FP4_MAX, round_elements

TILES = ((1, 16), (16, 16))
ROUNDINGS = ("nearest_even", "stochastic", "deepgemm")
_DEEPGEMM_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
FOUR_OVER_SIX_E4M3_MAX = 256.0
SIGN_VECTOR = torch.tensor([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1],
                           dtype=torch.float32)
_SIXTH = float.fromhex("0x1.555556p-3")  # f32(1/6), the word 0x3E2AAAAB
_GROUP = 16
_FP4_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # e2m1, codes 0..7


def hadamard(n: int = 16) -> torch.Tensor:
    """Sylvester's n x n Hadamard matrix, float32 entries +-1 (n a power of two)."""
    if type(n) is not int or n < 1 or n & (n - 1):
        raise ValueError(f"hadamard: n must be a power of two, got {n!r}")
    h = torch.ones((1, 1), dtype=torch.float32)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return h


def rht_matrix(signs: torch.Tensor = SIGN_VECTOR) -> torch.Tensor:
    """M = diag(s) H / 4, float32 (16, 16), on the signs' device."""
    s = _check_signs(signs)
    return (s.unsqueeze(1) * hadamard(_GROUP).to(s.device)) * 0.25


def rht(x: torch.Tensor, signs: torch.Tensor = SIGN_VECTOR) -> torch.Tensor:
    """TE's random Hadamard transform of bfloat16 x per group of 16: y = x M, bfloat16."""
    m = rht_matrix(signs.to(x.device) if isinstance(signs, torch.Tensor) else signs)
    return _group_product(_bf16_groups(x, "rht"), m.to(x.device)).reshape(x.shape)


def rht_inverse(y: torch.Tensor, signs: torch.Tensor = SIGN_VECTOR) -> torch.Tensor:
    """x = y M^T per group of 16, bfloat16, by the same steps as rht."""
    m = rht_matrix(signs.to(y.device) if isinstance(signs, torch.Tensor) else signs)
    return _group_product(_bf16_groups(y, "rht_inverse"), m.to(y.device).T).reshape(y.shape)


def global_scales(global_amax: torch.Tensor | float, e4m3_max: float = E4M3_MAX
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(S_enc, S_dec), 0-d float32, of a global amax A: min(f32(6 E / A), FLT_MAX), 1 where
    A = 0 or S_enc = 0; a NaN A gives NaN."""
    a = torch.as_tensor(global_amax, dtype=torch.float32)
    six_e = torch.tensor(FP4_MAX * e4m3_max, device=a.device)  # 2688: a tensor, not a float
    enc = torch.clamp(six_e / a, max=F32_MAX)
    enc = torch.where((a == 0) | (enc == 0), torch.ones_like(enc), enc)
    return enc, 1.0 / enc


def block_amax(x: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """Each 16-wide block's amax, float32 (M', N' / 16), repeated on a 16x16 tile's rows."""
    a = _pad(x.abs(), tile)  # (M', N')
    rows, cols = a.shape
    r = tile[0]
    amax = a.reshape(rows // r, r, cols // _GROUP, _GROUP).amax(dim=(1, 3))
    return amax.repeat_interleave(r, dim=0)  # (M', N' / 16)


def round_fp4_stochastic(a: torch.Tensor, rbits: torch.Tensor) -> torch.Tensor:
    """float32 a rounded stochastically onto the fp4 grid with one uint8 of rbits per element
    (TE's software rule: reference.nvfp4.round_fp4_stochastic)."""
    x = _check_float32(a, "round_fp4_stochastic")
    r = _check_rbits(rbits, tuple(x.shape))
    u = r.to(torch.float32) * (1 / 256)
    mag = x.abs()
    t = mag + u * _grid_step(mag)
    step_t = _grid_step(t)
    q = torch.fmin(torch.floor(t * (1.0 / step_t)) * step_t, torch.full_like(t, FP4_MAX))
    return torch.copysign(q, torch.where(torch.isnan(x), torch.ones_like(x), x))


def quantize(x: torch.Tensor, tile: tuple[int, int],
             global_amax: torch.Tensor | float | None = None, *,
             rounding: str = "nearest_even", rbits: torch.Tensor | None = None,
             four_over_six: bool = False, with_rht: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 (M, N), block_scales uint8 (M, ceil(N / 16)), A 0-d float32)."""
    a = _check(x, tile, rounding, rbits, four_over_six, with_rht)
    if with_rht:
        a = rht(x).to(torch.float32)
    m, n = a.shape
    blocks = _blocks(_pad(a, tile))  # (M', N' / 16, 16)
    amax = block_amax(a, tile)  # (M', N' / 16)
    top = (a.abs().amax() if global_amax is None
           else torch.as_tensor(global_amax, dtype=torch.float32).to(a.device))
    if four_over_six:
        codes, scales = _four_over_six(blocks, amax, top, tile)
    else:
        enc, dec = global_scales(top)
        b = torch.clamp(amax * (enc * _SIXTH), max=E4M3_MAX)  # NaN stays NaN
        scales = round_elements(b, "float8_e4m3fn")
        r = _encode_scale(scales, dec)
        codes = _round(blocks, r, rounding, rbits)
    return codes.reshape(blocks.shape[0], -1)[:m, :n], scales[:m], top


def dequantize(codes: torch.Tensor, block_scales: torch.Tensor,
               global_amax: torch.Tensor | float, *, four_over_six: bool = False
               ) -> torch.Tensor:
    """float32 values f32(P_i * f32(f32(S * A) * f32(1 / (6 E)))) (TE's dequantize kernel)."""
    p = _decode_fp4(codes)
    s = block_scales.view(torch.float8_e4m3fn).to(torch.float32)
    if p.ndim != 2 or tuple(s.shape) != (p.shape[0], -(-p.shape[1] // _GROUP)):
        raise ValueError(f"dequantize: codes {tuple(p.shape)} and block_scales "
                         f"{tuple(s.shape)} do not match (M, N) and (M, ceil(N / 16))")
    e4m3_max = FOUR_OVER_SIX_E4M3_MAX if four_over_six else E4M3_MAX
    inverse = torch.ones((), device=p.device) / (FP4_MAX * e4m3_max)  # f32(1 / 2688)
    a = torch.as_tensor(global_amax, dtype=torch.float32).to(p.device)
    factor = (s * a) * inverse
    return p * factor.repeat_interleave(_GROUP, dim=1)[:, : p.shape[1]]


def _four_over_six(blocks: torch.Tensor, amax: torch.Tensor, top: torch.Tensor,
                   tile: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes (M', N' / 16, 16), scales (M', N' / 16)): each block's candidate of lower error."""
    enc, dec = global_scales(top, FOUR_OVER_SIX_E4M3_MAX)
    denominator = FP4_MAX * FOUR_OVER_SIX_E4M3_MAX  # 1536
    base = (amax / FP4_MAX) * enc
    candidates = []
    for b in (torch.clamp(base * 1.5, max=E4M3_MAX), torch.clamp(base, max=E4M3_MAX)):
        scales = round_elements(b, "float8_e4m3fn")  # map to 4, then map to 6
        codes = _round(blocks, _encode_scale(scales, dec), "nearest_even", None)
        s = scales.view(torch.float8_e4m3fn).to(torch.float32)
        p = _decode_fp4(codes)
        diff = ((((p * s.unsqueeze(-1)) * top) / denominator) - blocks).abs()
        error = torch.zeros_like(amax)
        for i in range(_GROUP):  # element order, as TE's __fadd_rn loop
            error = error + diff[..., i]
        candidates.append((codes, scales, _tile_error(error, tile)))
    (codes4, scales4, error4), (codes6, scales6, error6) = candidates
    pick4 = error4 < error6  # strict: a tie (or a NaN) keeps map to 6
    return torch.where(pick4.unsqueeze(-1), codes4, codes6), torch.where(pick4, scales4, scales6)


def _tile_error(error: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """A 16x16 tile's error: its 16 row errors added as TE's warp reduction adds them."""
    if tile[0] == 1:
        return error
    rows = error.reshape(-1, _GROUP, error.shape[-1])  # (M' / 16, 16, N' / 16)
    while rows.shape[1] > 1:
        half = rows.shape[1] // 2
        rows = rows[:, :half] + rows[:, half:]
    return rows[:, 0].repeat_interleave(_GROUP, dim=0)


def _encode_scale(scales: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
    """R = min(f32(1 / f32(S * S_dec)), FLT_MAX) of e4m3 scale codes (S = 0: FLT_MAX)."""
    s = scales.view(torch.float8_e4m3fn).to(torch.float32)
    return torch.clamp(1.0 / (s * dec), max=F32_MAX)


def _round(blocks: torch.Tensor, r: torch.Tensor, rounding: str, rbits: torch.Tensor | None
           ) -> torch.Tensor:
    """fp4 codes of f32(x * R): nearest even after the clamp, or stochastic on padded rbits."""
    q = blocks * r.unsqueeze(-1)  # (M', N' / 16, 16)
    shape = tuple(blocks.shape)
    if rounding == "nearest_even":
        return round_elements(q.clamp(-FP4_MAX, FP4_MAX), "float4_e2m1fn")
    if rounding == "deepgemm":
        return _round_deepgemm(q)
    r = torch.zeros((shape[0], shape[1] * _GROUP), dtype=torch.uint8, device=q.device)
    r[: rbits.shape[0], : rbits.shape[1]] = rbits
    return round_elements(round_fp4_stochastic(q, r.reshape(shape)), "float4_e2m1fn")


def _round_deepgemm(q: torch.Tensor) -> torch.Tensor:
    """DeepGEMM's _quantize_to_fp4_e2m1, its own torch lines (reference: the source)."""
    mag = torch.zeros_like(q, dtype=torch.uint8)
    for m in _DEEPGEMM_MIDPOINTS:
        mag += (q.abs() > m).to(torch.uint8)
    sign = (q < 0) & (mag != 0)
    return mag | (sign.to(torch.uint8) << 3)


def _grid_step(v: torch.Tensor) -> torch.Tensor:
    return torch.where(v >= 4, 2.0, torch.where(v >= 2, 1.0, 0.5))


def _group_product(a: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """bfloat16 of the float32 sum, from zero, over i = 0..15 of a[..., i] * m[i, :]."""
    y = torch.zeros_like(a)  # (..., n, 16)
    for i in range(_GROUP):
        y = y + a[..., i : i + 1] * m[i]
    return y.to(torch.bfloat16)


def _decode_fp4(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of uint8 fp4 codes: TE's table, magnitude by the low 3 bits."""
    c = codes.to(torch.int64)
    magnitude = torch.tensor(_FP4_MAGNITUDES, device=codes.device)[c & 7]
    return torch.where((c & 8) == 8, -magnitude, magnitude)


def _pad(a: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """a zero-padded to whole tiles: (ceil(M / r) r, ceil(N / 16) 16)."""
    rows = -(-a.shape[0] // tile[0]) * tile[0]
    cols = -(-a.shape[1] // _GROUP) * _GROUP
    return F.pad(a, (0, cols - a.shape[1], 0, rows - a.shape[0]))


def _blocks(a: torch.Tensor) -> torch.Tensor:
    return a.reshape(a.shape[0], a.shape[1] // _GROUP, _GROUP)  # (M', N' / 16, 16)


def _name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def _bf16_groups(x: object, where: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
        what = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{where}: x must be bfloat16, got {_name(what)}")
    if x.ndim == 0 or x.shape[-1] % _GROUP:
        raise ValueError(f"{where}: the last dimension of shape {tuple(x.shape)} must be a "
                         f"multiple of {_GROUP}")
    return x.to(torch.float32).reshape(*x.shape[:-1], -1, _GROUP)  # (..., n, 16), exact


def _check_signs(signs: object) -> torch.Tensor:
    s = torch.as_tensor(signs, dtype=torch.float32)
    if tuple(s.shape) != (_GROUP,) or not bool((s.abs() == 1).all()):
        raise ValueError(f"signs must be {_GROUP} values of +-1, got shape {tuple(s.shape)}")
    return s


def _check_float32(x: object, where: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        what = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{where}: x must be float32, got {_name(what)}")
    return x


def _check_rbits(rbits: object, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(rbits, torch.Tensor):
        raise ValueError(f"rbits must be uint8 of shape {tuple(shape)}, got "
                         f"{type(rbits).__name__}")
    if rbits.dtype != torch.uint8 or tuple(rbits.shape) != tuple(shape):
        raise ValueError(f"rbits must be uint8 of shape {tuple(shape)}, got "
                         f"{_name(rbits.dtype)} of shape {tuple(rbits.shape)}")
    return rbits


def _check(x: object, tile: object, rounding: str, rbits: object, four_over_six: bool,
           with_rht: bool) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float32, torch.bfloat16):
        what = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"quantize: x must be float32 or bfloat16, got {_name(what)}")
    if x.ndim != 2 or x.numel() == 0:
        raise ValueError(f"quantize: x must be a non-empty (M, N) matrix, got shape "
                         f"{tuple(x.shape)}")
    if tile not in TILES:
        raise ValueError(f"quantize: tile must be one of {TILES}, got {tile!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"quantize: rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if (rounding == "stochastic") != (rbits is not None):
        raise ValueError("quantize: rbits are given with rounding='stochastic', and only then")
    if rbits is not None:
        _check_rbits(rbits, tuple(x.shape))
    if four_over_six and (with_rht or rounding == "stochastic"):
        raise ValueError("quantize: Four Over Six takes neither the RHT nor stochastic "
                         "rounding (TE refuses both)")
    if four_over_six and rounding == "deepgemm":
        raise ValueError("quantize: Four Over Six rounds its candidates to nearest even; "
                         "rounding='deepgemm' is refused with it")
    if with_rht:
        _bf16_groups(x, "quantize")
    return x.to(torch.float32)  # bfloat16 widens exactly
