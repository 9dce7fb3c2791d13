"""MX block formats and NVFP4 with torch ops. See reference/mx.py for the math.

The same public names in the same order. What torch does differently or lacks:

- torch has float8_e8m0fnu and float4_e2m1fn_x2 dtypes but no cast into fp6 or fp4 (and
  the e8m0 cast rounds to nearest, not by the scale modes), so scale codes are integer
  arithmetic on the float32 word (`Tensor.view(torch.int32)`), and fp6/fp4 elements are
  rounded by exact float64 operations (frexp, ldexp, round: half to even; floor(q + 1/2):
  half away) into the code W = ((t - t_min) << m) + k, where k = |q| / 2^(t - m) rounded
  (reference/formats.py's W: a carry out of k lands on the next binade by itself).
- fp4 (e2m1) rounded to nearest even, the NVFP4 hot path, counts instead: its magnitude
  code is the number of its 7 rounding boundaries |q| has passed, a tie passing the
  boundary where the even code lies above (0.75, 1.75, 3.5); float32 comparisons, about 10x
  the float64 route on one CPU thread and the same codes (parity/test_mx.py drives every
  boundary and its float32 neighbours through both routes and the reference).
- float8 elements rounded to nearest even are `Tensor.to(float8_*)`, torch's own cast;
  a NaN is then given the reference's canonical NaN code (torch's e5m2 cast writes 0x7F,
  the reference 0x7E: both NaN, inside a block whose scale is NaN anyway).
- a NaN into fp6/fp4 (formats without NaN) gives the zero of the opposite sign, as the
  reference's encoder does (NOTE [ NaN to a finite format ] in reference/small_formats.py).
- "rceil_log2f" is torch.log2 in float32 itself: torchao's eager rule, word for word.
- the variants' rules are torch_impl/mx_variants.py (reference/mx_variants.py states them);
  the argument ranges, and the checks both trees share, are common/mx_ranges.py.
Works on CPU and CUDA tensors alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common import mx_ranges  # the declared ranges and the checks of both trees
from common.format_spec import FORMATS  # bit widths and ranges: a plain data spec
from torch_impl import mx_variants as mxv
from torch_impl.format_spec import DTYPES  # the formats torch casts to natively

ELEMENT_FORMATS = mx_ranges.ELEMENT_FORMATS
SCALE_MODES = mx_ranges.SCALE_MODES
ROUNDINGS = mx_ranges.ROUNDINGS
VARIANTS = mx_ranges.VARIANTS  # the specification first, then the libraries' (mx_variants)
NVFP4_VARIANTS = mx_ranges.NVFP4_VARIANTS  # TE's training recipe, torchao 0.18's
BLOCK_SIZE = 32
NVFP4_BLOCK_SIZE = 16
E8M0_BIAS = 127
E8M0_NAN = 255
F32_TINY = 2.0**-126
E4M3_TINY = 2.0**-6
E4M3_MAX = FORMATS["float8_e4m3fn"].max  # 448
FP4_MAX = FORMATS["float4_e2m1fn"].max  # 6
F32_MAX = torch.finfo(torch.float32).max


@dataclass(frozen=True)
class MXTensor:
    """An MX tensor: E8M0 scale codes (..., K / block_size) and element codes (..., K)."""

    scales: torch.Tensor  # uint8
    elements: torch.Tensor  # uint8, one code per element
    fmt: str
    block_size: int


@dataclass(frozen=True)
class NVFP4Tensor:
    """NVFP4: e4m3 block-scale codes (..., K / 16), fp4 codes (..., K), and torchao's g (None:
    one level) or Transformer Engine's global amax A (the default variant's)."""

    scales: torch.Tensor  # uint8, float8_e4m3fn codes
    elements: torch.Tensor  # uint8, float4_e2m1fn codes
    per_tensor_scale: torch.Tensor | None  # torchao's g
    global_amax: torch.Tensor | None = None  # Transformer Engine's A


def _check(x: object, fmt: str, mode: str | None, rounding: str | None, block_size: int,
           variant: str = "ocp") -> tuple[torch.Tensor, str, str]:
    """(x as contiguous float32, the mode, the rounding): common/mx_ranges.py's checks."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"MX quantization takes float32 or bfloat16 input, got "
                        f"{str(x.dtype).removeprefix('torch.')}")
    mode, rounding = mx_ranges.variant_settings(variant, fmt, mode, rounding)
    mx_ranges.check_block_size(block_size)
    if x.dim() == 0 or x.shape[-1] % block_size:
        raise ValueError(f"the last dimension of shape {tuple(x.shape)} must be divisible by "
                         f"the block size {block_size}")
    return x.to(torch.float32).contiguous(), mode, rounding  # bfloat16 -> float32 is exact


def _blocks(a: torch.Tensor, block_size: int) -> torch.Tensor:
    return a.reshape(*a.shape[:-1], a.shape[-1] // block_size, block_size)  # (..., n, k)


def scale_codes(amax: torch.Tensor, fmt: str, mode: str | None = None, variant: str = "ocp"
                ) -> torch.Tensor:
    """The E8M0 code of each block's float32 amax under `mode` (reference/mx.py): for the
    specification ("ocp"), a block holding +-inf has the NaN code under floor/ceil/even."""
    mode, _ = mx_ranges.variant_settings(variant, fmt, mode, None)
    if amax.dtype != torch.float32:
        raise TypeError(f"scale_codes takes a float32 amax, got "
                        f"{str(amax.dtype).removeprefix('torch.')}")
    spec = FORMATS[fmt]
    bits = amax.view(torch.int32).to(torch.int64)
    nan = torch.isnan(amax)
    if variant != "torchao" and mode not in ("rceil", "rceil_log2f"):
        nan = nan | torch.isinf(amax)
    if variant == "microxcaling":
        e = mxv.log2_floor_f32(amax) - spec.emax  # NaN and inf kept: the NaN code below
        e = torch.where(nan, torch.zeros_like(e), e)
        code = e.clamp(-E8M0_BIAS, E8M0_BIAS).to(torch.int64) + E8M0_BIAS
    elif mode in ("rceil", "rceil_log2f"):
        d = mxv.te_quotient(amax, fmt) if variant == "transformer_engine" else amax / spec.max
        if mode == "rceil":
            safe = torch.where(torch.isfinite(d) & (d > 0), d, torch.ones_like(d))
            m, e = torch.frexp(safe.to(torch.float64))
            s = (e - (m == 0.5).to(e.dtype)).to(torch.float32)  # ceil(log2 d), exactly
            s = torch.where(d == 0, torch.full_like(s, -E8M0_BIAS), s)
        else:
            s = torch.ceil(torch.log2(d))  # float32 log2, as torchao
            s = torch.where(torch.isfinite(d), s, torch.zeros_like(s))
        code = s.clamp(-E8M0_BIAS, E8M0_BIAS).to(torch.int64) + E8M0_BIAS
        code = torch.where(torch.isinf(d), torch.full_like(code, 254), code)
    else:
        if mode == "even":  # amax's fraction rounded to m bits, half up, then the exponent
            bits = (bits + (1 << (22 - spec.mantissa_bits))) & 0xFF800000
        exponent = ((bits >> 23) & 0xFF) - E8M0_BIAS
        if mode == "ceil":
            exponent = exponent + ((bits & 0x7FFFFF) != 0).to(exponent.dtype)
        code = (exponent - spec.emax).clamp(-E8M0_BIAS, E8M0_BIAS + 1) + E8M0_BIAS
    return torch.where(nan, torch.full_like(code, E8M0_NAN), code).to(torch.uint8)


def scaled_blocks(x: torch.Tensor, fmt: str, mode: str | None = None, *,
                  block_size: int = BLOCK_SIZE, variant: str = "ocp"
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale codes (..., n), x scaled by its block's scale, before the clamp (..., n, k))."""
    a, mode, _ = _check(x, fmt, mode, None, block_size, variant)
    a = _blocks(a, block_size)
    amax = mxv.block_amax(a, variant)  # (..., n), float32; NaN if the block holds one
    code = scale_codes(amax, fmt, mode, variant)
    c = code.to(torch.int32)
    if variant == "torchao":
        q = mxv.torchao_scaled(a, code, mode)
    elif variant == "transformer_engine":  # x times exp2f_rcp(code)
        q = a * mxv.te_multiplier(code).unsqueeze(-1)
    else:  # V_i / X: X's float32 word is code << 23, or 2^22 (2^-127) at 0
        word = torch.where(c == 0, torch.full_like(c, 1 << 22), torch.bitwise_left_shift(c, 23))
        scale = word.view(torch.float32)  # code 255: +inf's word, made NaN below
        scale = torch.where(c == E8M0_NAN, torch.full_like(scale, float("nan")), scale)
        q = a / scale.unsqueeze(-1)
    return code, q


def round_elements(q: torch.Tensor, fmt: str, rounding: str = "nearest_even") -> torch.Tensor:
    """float32 q, already within +-max of `fmt`, rounded to `fmt`'s codes (uint8)."""
    mx_ranges.variant_settings("ocp", fmt, None, rounding)
    if q.dtype != torch.float32:
        raise TypeError(f"round_elements takes float32 q, got "
                        f"{str(q.dtype).removeprefix('torch.')}")
    spec = FORMATS[fmt]
    if rounding == "nearest_even" and fmt in DTYPES:
        codes = q.to(DTYPES[fmt]).view(torch.uint8)
        nan = (torch.signbit(q).to(torch.uint8) << 7) | spec.nan_code  # the canonical NaN
        return torch.where(torch.isnan(q), nan, codes)
    if rounding == "nearest_even" and fmt == "float4_e2m1fn":
        return _round_fp4_nearest_even(q)
    a = q.to(torch.float64).abs()
    nan = torch.isnan(a)
    _, e = torch.frexp(torch.where(nan, torch.zeros_like(a), a))  # a = f 2^e, 1/2 <= f < 1
    t = (e - 1).clamp(min=spec.min_exponent)  # the binade, subnormals at min_exponent
    t = torch.where(a == 0, torch.full_like(t, spec.min_exponent), t)  # frexp(0): e = 0
    scaled = torch.ldexp(a, (spec.mantissa_bits - t).to(torch.float64))  # exact
    k = torch.round(scaled) if rounding == "nearest_even" else torch.floor(scaled + 0.5)
    magnitude = ((t - spec.min_exponent) << spec.mantissa_bits) + k.to(torch.int64)
    sign = torch.signbit(q).to(torch.int64)
    if spec.nan_code is None:  # fp6/fp4: NaN -> the zero of the opposite sign
        magnitude = torch.where(nan, torch.zeros_like(magnitude), magnitude)
        sign = torch.where(nan, 1 - sign, sign)
    else:
        magnitude = torch.where(nan, torch.full_like(magnitude, spec.nan_code), magnitude)
    return ((sign << (spec.bits - 1)) | magnitude).to(torch.uint8)


# fp4's rounding boundaries, the midpoints of its magnitudes 0 .5 1 1.5 2 3 4 6, and whether
# a tie there goes up (to the even code: 0.75 -> 1, 1.75 -> 2, 3.5 -> 4) or down (0.25 -> 0,
# 1.25 -> 1, 2.5 -> 2, 5 -> 4)
_FP4_BOUNDARIES = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False),
                   (3.5, True), (5.0, False))


def _round_fp4_nearest_even(q: torch.Tensor) -> torch.Tensor:
    """fp4 codes of float32 q within +-6, nearest even: the magnitude code is the number of
    boundaries |q| has passed (a NaN passes none: the zero of the opposite sign, as
    round_elements' general route gives)."""
    a = q.abs()
    magnitude = torch.zeros_like(a, dtype=torch.uint8)
    for boundary, tie_up in _FP4_BOUNDARIES:
        magnitude += (a >= boundary) if tie_up else (a > boundary)
    sign = torch.signbit(q) ^ torch.isnan(a)
    return (sign.to(torch.uint8) << 3) | magnitude


def to_mx(x: torch.Tensor, fmt: str, mode: str | None = None, *,
          block_size: int = BLOCK_SIZE, rounding: str | None = None, variant: str = "ocp"
          ) -> MXTensor:
    """float32/bfloat16 x as an MX tensor (reference.mx.to_mx: the same arguments)."""
    a, mode, rounding = _check(x, fmt, mode, rounding, block_size, variant)
    code, q = scaled_blocks(a, fmt, mode, block_size=block_size, variant=variant)
    top = FORMATS[fmt].max
    q = q.clamp(-top, top)  # clamp keeps NaN
    if variant == "microxcaling":
        elements = mxv.round_microxcaling(q, fmt)
    else:
        elements = round_elements(q, fmt, rounding)
    if variant == "microxcaling_cpp":
        elements = mxv.unsigned_zeros(elements, fmt)
    return MXTensor(code, elements.reshape(a.shape), fmt, block_size)


def _decode_elements(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """The float64 value of each element code (no NaN: a block's NaN is its scale's)."""
    spec = FORMATS[fmt]
    if fmt in DTYPES:
        return codes.view(DTYPES[fmt]).to(torch.float64)
    c = codes.to(torch.int64)
    m = spec.mantissa_bits
    field = (c >> m) & (2**spec.exponent_bits - 1)
    frac = c & (2**m - 1)
    big_m = torch.where(field > 0, frac + 2**m, frac).to(torch.float64)
    value = torch.ldexp(big_m, (field.clamp(min=1) - spec.bias - m).to(torch.float64))
    return torch.where(((c >> (spec.bits - 1)) & 1) == 1, -value, value)


def from_mx(mx: MXTensor) -> torch.Tensor:
    """The float32 values X * P_i (NaN for a block whose scale is NaN)."""
    p = _blocks(_decode_elements(mx.elements, mx.fmt), mx.block_size)
    s = mx.scales.to(torch.int64)
    x = torch.ldexp(p, (s - E8M0_BIAS).unsqueeze(-1).to(torch.float64))
    x = torch.where((s == E8M0_NAN).unsqueeze(-1), torch.full_like(x, float("nan")), x)
    return x.to(torch.float32).reshape(mx.elements.shape)


def clipped_blocks(x: torch.Tensor, fmt: str, mode: str | None, *, block_size: int = BLOCK_SIZE,
                   variant: str = "ocp") -> int:
    """How many blocks clip: their scaled amax lies beyond the element format's max."""
    _, q = scaled_blocks(x, fmt, mode, block_size=block_size, variant=variant)
    return int((q.abs() > FORMATS[fmt].max).any(dim=-1).sum())


def per_tensor_scale(x: torch.Tensor) -> torch.Tensor:
    """NVFP4's per-tensor scale g = f32(amax / (448 * 6)), a 0-d float32 tensor."""
    a = x.to(torch.float32).abs()
    top = a.amax() if a.numel() else a.new_zeros(())  # an empty tensor's amax: 0
    return top / (E4M3_MAX * FP4_MAX)


def global_scales(global_amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Transformer Engine's (S_enc, S_dec) of a 0-d float32 global amax A, as its reference
    quantizer computes them: torch.div, torch.min with FLT_MAX, 1 where A = 0 or S_enc = 0."""
    mx_ranges.check_amax("global_amax", _number(global_amax))
    a = global_amax.to(torch.float32)
    enc = torch.minimum(2688.0 / a, torch.tensor(F32_MAX, device=a.device))
    enc = torch.where((a == 0) | (enc == 0), torch.ones_like(enc), enc)
    return enc, 1.0 / enc


def _number(value: object) -> object:
    """A 0-d tensor as its Python number for common/mx_ranges.py's check; anything else as
    it is (a tensor of another shape, or no number, is refused there by its type)."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.dtype.is_complex \
            and value.dtype != torch.bool:
        return value.item()
    return value


def nvfp4_scaled(x: torch.Tensor, per_tensor: torch.Tensor | None = None, *,
                 variant: str = "transformer_engine", global_amax: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(e4m3 block-scale codes, x times its block's R before the clamp, A or g or None)."""
    mx_ranges.check_nvfp4(variant, _number(per_tensor), _number(global_amax))
    a = _blocks(_check(x, "float4_e2m1fn", None, None, NVFP4_BLOCK_SIZE)[0], NVFP4_BLOCK_SIZE)
    amax = a.abs().amax(dim=-1)
    if variant == "transformer_engine":
        top = ((amax.amax() if amax.numel() else amax.new_zeros(())) if global_amax is None
               else global_amax.to(torch.float32))  # an empty tensor's A: 0
        enc, dec = global_scales(top)
        b = torch.clamp(amax * (enc * torch.reciprocal(torch.tensor(6.0))), max=E4M3_MAX)
        scale = b.to(torch.float8_e4m3fn)  # no lower clamp: 0 and subnormals
        s = scale.to(torch.float32)
        r = torch.clamp(1.0 / (s * dec), max=F32_MAX)  # S = 0: 1 / 0 = inf -> FLT_MAX
        return scale.view(torch.uint8), a * r.unsqueeze(-1), top
    b = amax / FP4_MAX
    g = None if per_tensor is None else per_tensor.to(torch.float32)
    if g is not None:
        b = b / g
    scale = b.clamp(E4M3_TINY, E4M3_MAX).to(torch.float8_e4m3fn)
    s = scale.to(torch.float32)
    r = 1.0 / s if g is None else (1.0 / g) / s  # NOTE [ NVFP4 below 2^-116 ]
    q = a * r.unsqueeze(-1)
    return scale.view(torch.uint8), q, g


def to_nvfp4(x: torch.Tensor, per_tensor: torch.Tensor | None = None, *,
             variant: str = "transformer_engine", global_amax: torch.Tensor | None = None
             ) -> NVFP4Tensor:
    """float32/bfloat16 x as NVFP4 (reference.mx.to_nvfp4: the same steps and arguments)."""
    scale, q, level = nvfp4_scaled(x, per_tensor, variant=variant, global_amax=global_amax)
    elements = round_elements(q.clamp(-FP4_MAX, FP4_MAX), "float4_e2m1fn").reshape(x.shape)
    if variant == "transformer_engine":
        return NVFP4Tensor(scale, elements, None, level)
    return NVFP4Tensor(scale, elements, level)


def from_nvfp4(t: NVFP4Tensor) -> torch.Tensor:
    """The float32 values (reference.mx.from_nvfp4: Transformer Engine's dequantize, torchao's
    P_i * f32(S g), or P_i * S with one level)."""
    p = _blocks(_decode_elements(t.elements, "float4_e2m1fn").to(torch.float32),
                NVFP4_BLOCK_SIZE)
    s = t.scales.view(torch.float8_e4m3fn).to(torch.float32)
    if t.global_amax is not None:
        s = (s * t.global_amax) * torch.reciprocal(torch.tensor(2688.0))
    elif t.per_tensor_scale is not None:
        s = s * t.per_tensor_scale
    return (p * s.unsqueeze(-1)).reshape(t.elements.shape)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Two fp4 codes a byte along the last dimension, the first in the low nibble."""
    if codes.dim() == 0 or codes.shape[-1] % 2 or (codes.numel() and int(codes.max()) > 15):
        raise ValueError("pack_fp4 takes 4-bit codes with an even last dimension")
    c = codes.to(torch.uint8)
    return c[..., ::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_fp4."""
    if packed.dim() == 0:
        raise ValueError("unpack_fp4 takes packed bytes with a last dimension")
    p = packed.to(torch.uint8)
    return torch.stack([p & 15, p >> 4], dim=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])
