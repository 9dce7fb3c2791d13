"""Microscaling (MX) block formats and NVFP4, from the bits.

An MX tensor splits the last dimension into blocks of k = 32 values; each block stores one
shared scale X = 2^s as a float8_e8m0fnu code (s + 127; 255 is NaN) and k elements
P_i in a small format (float8_e4m3fn, float8_e5m2, float6_e2m3fn, float6_e3m2fn,
float4_e2m1fn; OCP Microscaling 1.0). The value is X * P_i. The default, `variant="ocp"`
with mode "floor", is the specification's conversion (OCP MX 1.0, section 6.3, in its
words' substance: shared_exp = floor(log2(max_i |V_i|)) - emax_elem, X = 2^shared_exp, each
P_i = V_i / X quantized to the element format, normal values clamped to its largest
magnitude). With amax = max_i |x_i| (a
float32, E its biased exponent field, F its fraction field) and e_max the element format's
largest exponent (8, 15, 2, 4, 2):

    floor  (OCP)    s = E - 127 - e_max                       the largest power of two
                                                              <= amax, over 2^e_max
    ceil            s = E - 127 + (F != 0) - e_max            the smallest >= amax
    even            s = E' - 127 - e_max, E' the exponent of amax with its fraction rounded
                    to the element's m bits, half up: bits(amax) + 2^(22 - m), then masked
    rceil  (cuBLAS) d = f32(amax / max_elem);  s = ceil(log2 d), exactly
    rceil_log2f     d as above;  s = ceil(f32(log2 d)): torchao's eager fallback (NOTE
                    [ rceil in float32 ] in reference/mx_variants.py)
    every mode      code = clamp(s, -127, 128) + 127 (rceil: clamp to 127); NaN amax gives
                    255; rceil gives 254 for an infinite d

floor, ceil and even leave E = 0 (a zero or subnormal amax) as s = -127 - e_max, clamped:
the code 0. The elements, as the specification states them (OCP MX 1.0's conversion,
section 6.3: P_i = quantize(V_i / X), X the stored scale):

    every mode          P_i = round(clamp(x_i / X, +-max_elem)),  X = 2^(code - 127)
                        (2^-127 at code 0: a float32 subnormal, exact), NaN at code 255

A block holding +-inf has no scale by the specification: floor(log2 amax) has no finite
value, and E8M0's only non-finite code is NaN, so floor, ceil and even give it the code 255
and the block decodes to NaN (as microxcaling's emulation does). rceil and rceil_log2f are
not OCP's: they state cuBLAS's cvt.rp.satfinite, which saturates an infinite d to 254.

Each library's MX differs from this somewhere; the difference is a named variant
(`variant=`: "torchao", "microxcaling", "microxcaling_cpp", "transformer_engine"), its rule
and source in reference/mx_variants.py, its argument ranges in common/mx_ranges.py.

`round` is round to nearest, ties to even (the project's encoder, reference/formats.py), or
with rounding="nearest_away" ties away from zero (microxcaling's `_round_mantissa`):
k = floor(|q| / u + 1/2) u, u the element's spacing at |q|. Clamping before rounding equals
rounding before saturating: the rounding is monotone and max_elem is a member. A block
*clips* when its scaled amax (amax / X, or amax R) lies beyond max_elem: the clamp, not the
rounding, sets its largest element (`clipped_blocks`). floor clips every block whose amax
has a significand above max_elem's (1.75 for e4m3, 1.5 for fp4); ceil and rceil never clip
a finite block.

NVFP4 (NVIDIA): blocks of 16, float4_e2m1fn elements, a float8_e4m3fn block scale, and by
default (variant "transformer_engine") a float32 global scale from the tensor's amax A, as
Transformer Engine's training recipe (NVFP4BlockScaling) states it in its reference
quantizer (transformer_engine/pytorch/custom_recipes/reference_nvfp4.py; 1x16 blocks), every
step rounded once in float32, 2688 = 448 * 6:

    S_enc = min(f32(2688 / A), FLT_MAX), but 1 where A = 0 or S_enc = 0 (A = inf)
    S_dec = f32(1 / S_enc)
    S = e4m3(min(f32(amax * f32(S_enc * f32(1/6))), 448))     no lower clamp: 0 and subnormals
    R = min(f32(1 / f32(S * S_dec)), FLT_MAX)                  S = 0 gives FLT_MAX
    P_i = fp4(clamp(f32(x_i * R), +-6)),  value = P_i * f32(f32(S * A) * f32(1/2688))

An all-zero tensor is all zeros (S_enc = 1, every S = 0). variant "torchao" is torchao 0.18's
nvfp4_quantize, with one level, or two with its per-tensor scale g = f32(A / 2688):

    b = f32(amax / 6)           one level                 two levels (g given)
    S = e4m3(clamp(b, 2^-6, 448))                         e4m3(clamp(f32(b / g), 2^-6, 448))
    R = f32(1 / S)                                        f32(f32(1 / g) / S)
    P_i = fp4(clamp(f32(x_i * R), +-6)),  value = P_i * f32(S g)

so an all-zero tensor gives g = 0 and 0 / 0: every scale and value NaN.

Codes are returned unpacked, one uint8 per element (`pack_fp4` packs two per byte as
torchao does: the first element in the low nibble).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from common import mx_ranges
from common.format_spec import FORMATS, FloatFormat
from reference import formats
from reference import mx_variants as mxv

ELEMENT_FORMATS = mx_ranges.ELEMENT_FORMATS
SCALE_MODES = mx_ranges.SCALE_MODES
ROUNDINGS = mx_ranges.ROUNDINGS
VARIANTS = mx_ranges.VARIANTS  # the specification first, then the libraries' (mx_variants)
NVFP4_VARIANTS = mx_ranges.NVFP4_VARIANTS  # TE's training recipe, torchao 0.18's
BLOCK_SIZE = 32
NVFP4_BLOCK_SIZE = 16
E8M0_BIAS = 127
E8M0_NAN = 255
F32_TINY = np.float32(float.fromhex("0x1p-126"))  # float32's smallest normal
E4M3_TINY = np.float32(float.fromhex("0x1p-6"))  # 0.015625, float8_e4m3fn's smallest normal
E4M3_MAX = np.float32(FORMATS["float8_e4m3fn"].max)  # 448
FP4_MAX = np.float32(FORMATS["float4_e2m1fn"].max)  # 6
F32_MAX = np.float32(np.finfo(np.float32).max)


@dataclass(frozen=True)
class MXTensor:
    """An MX tensor: E8M0 scale codes (..., K / block_size) and element codes (..., K)."""

    scales: np.ndarray  # uint8
    elements: np.ndarray  # uint8, one code per element
    fmt: str
    block_size: int


@dataclass(frozen=True)
class NVFP4Tensor:
    """NVFP4: e4m3 block-scale codes (..., K / 16), fp4 codes (..., K), and torchao's g (None:
    one level) or Transformer Engine's global amax A (the default variant's)."""

    scales: np.ndarray  # uint8, float8_e4m3fn codes
    elements: np.ndarray  # uint8, float4_e2m1fn codes
    per_tensor_scale: np.float32 | None  # torchao's g
    global_amax: np.float32 | None = None  # Transformer Engine's A


def _check(x: object, fmt: str, mode: str | None, rounding: str | None, block_size: int,
           variant: str = "ocp") -> tuple[np.ndarray, str, str]:
    """(x as float32, the mode, the rounding): common/mx_ranges.py's checks, one line each."""
    a = np.asarray(x)
    if a.dtype == ml_dtypes.bfloat16:
        a = a.astype(np.float32)  # exact
    if a.dtype != np.float32:
        raise TypeError(f"MX quantization takes float32 or bfloat16 input, got {a.dtype}")
    mode, rounding = mx_ranges.variant_settings(variant, fmt, mode, rounding)
    mx_ranges.check_block_size(block_size)
    if a.ndim == 0 or a.shape[-1] % block_size:
        raise ValueError(f"the last dimension of shape {a.shape} must be divisible by the "
                         f"block size {block_size}")
    return a, mode, rounding


def _blocks(a: np.ndarray, block_size: int) -> np.ndarray:
    return a.reshape(*a.shape[:-1], a.shape[-1] // block_size, block_size)  # (..., n, k)


def scale_codes(amax: np.ndarray, fmt: str, mode: str | None = None, variant: str = "ocp"
                ) -> np.ndarray:
    """The E8M0 code of each block's float32 amax under `mode` (None: the variant's own). One
    amax, as scalar code (executable: tests/test_mx_reference.py compiles this text and holds
    this function to it; `f32` rounds to float32, `word` is a float32's bits as an int, and
    a quotient or product of two float32 in Python's float64, rounded to float32, is the
    float32 operation's result, 53 >= 2 * 24 + 2):

        def scale_rule(amax, mode, e_max, m, max_elem, variant):
            if amax != amax:
                return 255
            if variant == "microxcaling":  # floor(torch.log2(amax)) in float32
                if amax == math.inf:
                    return 255
                e = math.floor(f32(math.log2(amax if amax > 0 else 2.0**-126))) - e_max
                return min(max(e, -127), 127) + 127
            if mode in ("rceil", "rceil_log2f"):
                if variant == "transformer_engine":
                    d = f32(amax * f32(1 / max_elem))
                else:
                    d = f32(amax / max_elem)
                if d == math.inf:
                    return 254
                if d == 0:
                    s = -127
                elif mode == "rceil":
                    f, e = math.frexp(d)  # d = f 2^e, 1/2 <= f < 1
                    s = e - 1 if f == 0.5 else e
                else:
                    s = math.ceil(f32(math.log2(d)))
                return min(max(s, -127), 127) + 127
            if amax == math.inf and variant != "torchao":
                return 255
            bits = word(amax)
            if mode == "even":
                bits = (bits + 2 ** (22 - m)) & 0xFF800000
            s = ((bits >> 23) & 0xFF) - 127 - e_max
            if mode == "ceil" and bits & 0x7FFFFF:
                s = s + 1
            return min(max(s, -127), 128) + 127
    """
    mode, _ = mx_ranges.variant_settings(variant, fmt, mode, None)
    amax = np.asarray(amax)
    if amax.dtype != np.float32:
        raise TypeError(f"scale_codes takes a float32 amax, got {amax.dtype}")
    spec = FORMATS[fmt]
    bits = amax.view(np.uint32).astype(np.int64)
    nan = np.isnan(amax) | (np.isinf(amax) & (variant != "torchao")
                            & (mode not in ("rceil", "rceil_log2f")))
    if variant == "microxcaling":
        e = mxv.log2_floor_f32(amax) - spec.emax  # NaN and inf kept: the NaN code below
        code = np.clip(np.where(nan, 0, e), -E8M0_BIAS, E8M0_BIAS).astype(np.int64) + E8M0_BIAS
    elif mode in ("rceil", "rceil_log2f"):
        with np.errstate(over="ignore"):
            d = (mxv.te_quotient(amax, fmt) if variant == "transformer_engine"
                 else amax / np.float32(spec.max))  # float32, rounded once
        if mode == "rceil":
            m, e = np.frexp(np.where(np.isfinite(d) & (d > 0), d, 1).astype(np.float64))
            s = e - (m == 0.5)  # ceil(log2 d): e - 1 for an exact power of two
            s = np.where(d == 0, -E8M0_BIAS, s)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                s = np.ceil(np.log2(d.astype(np.float64)).astype(np.float32))
            s = np.where(np.isfinite(d), s, 0)
        code = np.clip(s, -E8M0_BIAS, E8M0_BIAS).astype(np.int64) + E8M0_BIAS
        code = np.where(np.isinf(d), 254, code)
    else:
        if mode == "even":  # amax's fraction rounded to m bits, half up, then the exponent
            bits = (bits + (1 << (22 - spec.mantissa_bits))) & 0xFF800000
        exponent = ((bits >> 23) & 0xFF) - E8M0_BIAS
        if mode == "ceil":
            exponent = exponent + ((bits & 0x7FFFFF) != 0)
        code = np.clip(exponent - spec.emax, -E8M0_BIAS, E8M0_BIAS + 1) + E8M0_BIAS
    return np.where(nan, E8M0_NAN, code).astype(np.uint8)


def scaled_blocks(x: object, fmt: str, mode: str | None = None, *,
                  block_size: int = BLOCK_SIZE, variant: str = "ocp"
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(scale codes (..., n), x scaled by its block's scale, before the clamp (..., n, k))."""
    a, mode, _ = _check(x, fmt, mode, None, block_size, variant)
    a = _blocks(a, block_size)
    amax = mxv.block_amax(a, variant)  # (..., n), float32; NaN if the block holds one
    code = scale_codes(amax, fmt, mode, variant)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        if variant == "torchao":
            q = mxv.torchao_scaled(a, code, mode)
        elif variant == "transformer_engine":  # x times exp2f_rcp(code)
            q = a * mxv.te_multiplier(code)[..., None]
        else:  # V_i / X, X the stored scale: 2^-127 at code 0 is exact (OCP MX 1.0, 6.3)
            scale = np.ldexp(np.float32(1), code.astype(np.int32) - E8M0_BIAS)  # float32
            scale = np.where(code == E8M0_NAN, np.float32(np.nan), scale)
            q = a / scale[..., None]
    return code, q.astype(np.float32)


def round_elements(q: np.ndarray, fmt: str, rounding: str = "nearest_even") -> np.ndarray:
    """float32 q, already within +-max of `fmt`, rounded to `fmt`'s codes (uint8)."""
    mx_ranges.variant_settings("ocp", fmt, None, rounding)
    q = np.asarray(q)
    if q.dtype != np.float32:
        raise TypeError(f"round_elements takes float32 q, got {q.dtype}")
    if rounding == "nearest_even":
        return formats.encode(q, fmt)
    spec: FloatFormat = FORMATS[fmt]
    a = np.abs(q.astype(np.float64))
    _, e = np.frexp(np.where(np.isnan(a), 0, a))  # a = f 2^e, 1/2 <= f < 1
    t = np.maximum(e - 1, spec.min_exponent)  # the binade, subnormals at min_exponent
    k = np.floor(np.ldexp(a, spec.mantissa_bits - t) + 0.5)  # ties away from zero
    value = np.copysign(np.ldexp(k, t - spec.mantissa_bits), q)  # a member: encoded exactly
    return formats.encode(np.where(np.isnan(q), q.astype(np.float64), value), fmt)


def to_mx(x: object, fmt: str, mode: str | None = None, *, block_size: int = BLOCK_SIZE,
          rounding: str | None = None, variant: str = "ocp") -> MXTensor:
    """float32/bfloat16 x (last dimension a multiple of block_size) as an MX tensor.

    fmt: one of ELEMENT_FORMATS; mode: one of SCALE_MODES; rounding: "nearest_even" or
    "nearest_away"; variant: one of VARIANTS, "ocp" (the specification) by default. mode and
    rounding None take the variant's own ("floor" and "nearest_even" for "ocp", OCP MX 1.0
    section 6.3; common/mx_ranges.py). ValueError for an unknown name, a mode or rounding the
    variant does not take, or a last dimension that the block size does not divide;
    TypeError for another dtype.
    """
    a, mode, rounding = _check(x, fmt, mode, rounding, block_size, variant)
    code, q = scaled_blocks(a, fmt, mode, block_size=block_size, variant=variant)
    top = np.float32(FORMATS[fmt].max)
    q = np.clip(q, -top, top)  # clip keeps NaN
    if variant == "microxcaling":
        elements = mxv.round_microxcaling(q, fmt)
    else:
        elements = round_elements(q, fmt, rounding)
    if variant == "microxcaling_cpp":
        elements = mxv.unsigned_zeros(elements, fmt)
    return MXTensor(code, elements.reshape(a.shape), fmt, block_size)


def from_mx(mx: MXTensor) -> np.ndarray:
    """The float32 values X * P_i (NaN for a block whose scale is NaN)."""
    p = _blocks(formats.decode(mx.elements, mx.fmt), mx.block_size)  # float64, exact
    s = mx.scales.astype(np.int64)
    with np.errstate(over="ignore"):
        x = np.ldexp(p, (s - E8M0_BIAS)[..., None])  # exact; beyond float32 -> inf below
        x = np.where((s == E8M0_NAN)[..., None], np.nan, x).astype(np.float32)
    return x.reshape(mx.elements.shape)


def clipped_blocks(x: object, fmt: str, mode: str | None, *, block_size: int = BLOCK_SIZE,
                   variant: str = "ocp") -> int:
    """How many blocks clip: their scaled amax lies beyond the element format's max."""
    _, q = scaled_blocks(x, fmt, mode, block_size=block_size, variant=variant)
    with np.errstate(invalid="ignore"):
        beyond = np.abs(q) > np.float32(FORMATS[fmt].max)
    return int(np.count_nonzero(beyond.any(axis=-1)))


def per_tensor_scale(x: object) -> np.float32:
    """NVFP4's per-tensor scale g = f32(amax / (448 * 6)) of float32/bfloat16 x."""
    a = np.asarray(x).astype(np.float32)
    top = np.max(np.abs(a), initial=np.float32(0))  # an empty tensor's amax: 0
    return np.float32(top / np.float32(E4M3_MAX * FP4_MAX))


def global_scales(global_amax: np.float32 | float) -> tuple[np.float32, np.float32]:
    """Transformer Engine's (S_enc, S_dec) of a float32 global amax A (the module docstring)."""
    a = np.float32(mx_ranges.check_amax("global_amax", global_amax))
    with np.errstate(divide="ignore", over="ignore"):
        enc = np.minimum(np.float32(2688) / a, F32_MAX)  # NaN stays NaN
    if a == 0 or enc == 0:
        enc = np.float32(1)
    return enc, np.float32(1) / enc


def nvfp4_scaled(x: object, per_tensor: np.float32 | float | None = None, *,
                 variant: str = "transformer_engine",
                 global_amax: np.float32 | float | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.float32 | None]:
    """(e4m3 block-scale codes (..., n), x times its block's R before the clamp (..., n, 16),
    and A (transformer_engine) or g or None (torchao)): NVFP4's steps up to the elements
    (the module docstring)."""
    mx_ranges.check_nvfp4(variant, per_tensor, global_amax)
    a = _blocks(_check(x, "float4_e2m1fn", None, None, NVFP4_BLOCK_SIZE)[0], NVFP4_BLOCK_SIZE)
    amax = np.max(np.abs(a), axis=-1)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if variant == "transformer_engine":
            top = (np.max(amax, initial=np.float32(0)) if global_amax is None
                   else np.float32(global_amax))  # an empty tensor's A: 0
            enc, dec = global_scales(top)
            b = np.minimum(amax * (enc * np.float32(1 / 6)), E4M3_MAX)  # no lower clamp
            scale = formats.encode(b, "float8_e4m3fn")
            s = formats.decode(scale, "float8_e4m3fn", dtype=np.float32)
            r = np.minimum(np.float32(1) / (s * dec), F32_MAX)
            return scale, a * r[..., None], np.float32(top)
        b = amax / FP4_MAX
        g = None if per_tensor is None else np.float32(per_tensor)
        if g is not None:
            b = b / g
        scale = formats.encode(np.clip(b, E4M3_TINY, E4M3_MAX), "float8_e4m3fn")
        s = formats.decode(scale, "float8_e4m3fn", dtype=np.float32)
        # NOTE [ NVFP4 below 2^-116 ]: for g < 2^-128 (a tensor amax below about 2^-116.6)
        # 1 / g overflows to inf, and a zero element times inf is NaN. fp4 has no NaN: the
        # reference writes the zero of the opposite sign, torchao's bit trick the NaN's low
        # bits (0x3 with its sign: such a zero decodes to -+1.5 S g there)
        r = np.float32(1) / s if g is None else (np.float32(1) / g) / s
        q = a * r[..., None]
    return scale, q, g


def to_nvfp4(x: object, per_tensor: np.float32 | float | None = None, *,
             variant: str = "transformer_engine",
             global_amax: np.float32 | float | None = None) -> NVFP4Tensor:
    """float32/bfloat16 x (last dimension a multiple of 16) as NVFP4: Transformer Engine's
    two levels (default; global_amax: another tensor's A, e.g. a weight's across ranks), or
    torchao's one level, or two with per_tensor = g (`per_tensor_scale`)."""
    scale, q, level = nvfp4_scaled(x, per_tensor, variant=variant, global_amax=global_amax)
    elements = formats.encode(np.clip(q, -FP4_MAX, FP4_MAX), "float4_e2m1fn")
    elements = elements.reshape(np.shape(x))
    if variant == "transformer_engine":
        return NVFP4Tensor(scale, elements, None, level)
    return NVFP4Tensor(scale, elements, level)


def from_nvfp4(t: NVFP4Tensor) -> np.ndarray:
    """The float32 values: P_i * f32(f32(S A) * f32(1/2688)) (Transformer Engine's dequantize),
    P_i * f32(S g) (torchao's two levels), P_i * S (one level)."""
    p = _blocks(formats.decode(t.elements, "float4_e2m1fn", dtype=np.float32),
                NVFP4_BLOCK_SIZE)
    s = formats.decode(t.scales, "float8_e4m3fn", dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        if t.global_amax is not None:
            s = (s * t.global_amax) * np.float32(1 / 2688)
        elif t.per_tensor_scale is not None:
            s = s * t.per_tensor_scale
        return (p * s[..., None]).reshape(t.elements.shape)


def pack_fp4(codes: np.ndarray) -> np.ndarray:
    """Two fp4 codes a byte along the last dimension, the first in the low nibble."""
    c = np.asarray(codes, dtype=np.uint8)
    if c.ndim == 0 or c.shape[-1] % 2 or (c.size and c.max() > 15):
        raise ValueError("pack_fp4 takes 4-bit codes with an even last dimension")
    return c[..., ::2] | (c[..., 1::2] << np.uint8(4))


def unpack_fp4(packed: np.ndarray) -> np.ndarray:
    """The inverse of pack_fp4."""
    p = np.asarray(packed, dtype=np.uint8)
    if p.ndim == 0:
        raise ValueError("unpack_fp4 takes packed bytes with a last dimension")
    return np.stack([p & np.uint8(15), p >> np.uint8(4)], axis=-1).reshape(
        *p.shape[:-1], 2 * p.shape[-1])
