"""The small formats with torch ops. See reference/small_formats.py for the conventions (fnuz,
finite, unsigned) and reference/formats.py for rounding on the integers.

torch 2.13 casts to three of the nine (NATIVE: float8_e4m3fnuz, float8_e5m2fnuz,
float8_e8m0fnu; 2.7 to 2.13 alike, 2.6 lacks the E8M0 dtype). Its float4_e2m1fn_x2 holds
two codes a byte and has no cast ("copy_kernel" not implemented); float8_e4m3b11fnuz, the
float6s, float4_e2m1fn, float8_e4m3 and float8_e3m4 have no dtype at all. So:

- Round to nearest to a NATIVE format is torch's cast and a bit view (`encode_native`), and
  does what torch does. The fnuz casts do what the reference does (overflow and +-inf give
  the NaN 0x80, -0 gives +0; claim formats.small_encode). The float8_e8m0fnu cast differs
  in two places (claim formats.e8m0_torch): a negative x gives |x|'s code (-4 -> 4), and |x|
  strictly between 2^-127 and 1.5 * 2^-127 gives 2^-126, where the reference gives NaN and
  2^-127; +-0 gives 2^-127 (code 0) in both (NOTE [ E8M0 at zero ]). Its ties round up as theirs
  do (1.5 -> 2; NOTE [ E8M0 ties ]).
- Round to nearest to four of the other six is torch's cast to a sibling, a torch format
  with the same mantissa width, of x scaled by a power of two (`encode_sibling`, NOTE [ A
  sibling's cast ]): float8_e4m3b11fnuz by float8_e4m3fnuz's, the float6s by
  float8_e4m3fn's and float8_e5m2's, float8_e4m3 by float8_e4m3fn's.
- Everything else (float8_e3m4 and float4_e2m1fn to nearest, flushed subnormals and the
  policies the siblings do not take, and toward_zero and stochastic rounding to all nine)
  is `encode_ops`: exact torch ops in the input's own dtype, the same rounding as the
  reference's integer W, with the float |x| / 2^(t - m) in place of the integer M >> shift:

      |x| = f * 2^e, 0.5 <= f < 1 (torch.frexp)        t = max(e - 1, 1 - b)
      scaled = |x| / 2^(t - m)   = f * 2^(m + 1) (normals), |x| * 2^(m - (1 - b)) (below)
      kept   = round (half to even) | trunc | trunc + (u < floor(2^32 * (scaled - trunc)))
      |code| = ((t - (1 - b)) << m) + kept              (unsigned: t + bias + kept - 1)

  Each line is exact: scaling by a constant power of two, trunc, round and floor of a
  float that holds the integer part and the fraction exactly. Then `pack`, the reference's
  rules, statement by statement. Round to nearest of float32 input (what a sweep runs) takes
  the same |code| from the bits instead (`nearest_float32`: one shift, and below the
  smallest normal one float addition, as reference/encode_kernels.py does it), int32
  passes in place, packed by `pack_carried` without bool masks (NOTE [ A sweep's chunk in
  place ]); float64 input takes the frexp path, exact
  in float64, so it is rounded once. Where the reference and ml_dtypes give NaN for E8M0 (x <= 0,
  NaN), so does this path: torch has no rounding but its cast's to follow there.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from torch_impl.format_spec import TorchFormat

# float8_e8m0fnu is a torch dtype from 2.7 (measured: absent on 2.6.0); without it E8M0 takes
# the exact-ops path and its layout decode, as the formats torch lacks do.
NATIVE: tuple[str, ...] = tuple(name for name in
                                ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
                                if hasattr(torch, name))


def encode_native(x32: torch.Tensor, fmt: TorchFormat, overflow: str,
                  subnormals: bool) -> torch.Tensor:
    """torch's cast of float32 x32 and its bits (codes); overflow="saturate" turns the
    cast's one NaN code, where the input was no NaN (overflow, +-inf), into +-max. Under the
    cast's own policies the cast's bits are the codes, uint8 as they are."""
    if overflow != "saturate" and (subnormals or fmt.convention != "fnuz"):
        return x32.to(fmt.dtype).view(torch.uint8)
    code = x32.to(fmt.dtype).view(torch.uint8).to(torch.int32)
    top = fmt.bits - 1
    nan_full = 1 << top if fmt.convention == "fnuz" else fmt.nan_code
    if overflow == "saturate":
        beyond = (code == nan_full) & ~torch.isnan(x32)
        signed_max = fmt.max_code if fmt.convention == "unsigned" else \
            fmt.max_code | (torch.signbit(x32).to(torch.int32) << top)
        code = torch.where(beyond, signed_max, code)
    if not subnormals and fmt.convention == "fnuz":  # a flushed result is +0: no -0
        below = ((code & ((1 << top) - 1)) < 2**fmt.mantissa_bits) & (code != nan_full)
        code = torch.where(below, 0, code)
    return code


# NOTE [ A sibling's cast ]
# A format with the mantissa width of one torch casts to, and a bias b against the torch
# format's b', has the same grid scaled by 2^(b - b'): the code with biased exponent E and
# mantissa M is 2^(E - b) (1 + M / 2^m) in one and 2^(E - b') (1 + M / 2^m) in the other
# (E = 0 alike, the subnormals). So x * 2^(b - b') rounds to the same (E, M) in the torch
# format, while E fits in the smaller field, and the scaling is exact in float32 except where
# it leaves float32's normal range: below, where both round to +-0 anyway (the inputs that
# scale to a float32 subnormal are below 2^-114, where the least half-spacing of the formats
# scaled down is 2^-5; x86 multiplies them about 30x slower than a normal, a sweep's 2.7% of
# float32 patterns), and above, past every overflow bound. Out of the format's range the
# result is set before the cast: a finite format's overflow saturates, so x is clamped to
# +-max first (clamped, then rounded: the values between max and the tie above it round to
# max anyway); float8_e4m3's +inf is the code after max, which float8_e4m3fn's cast gives to
# the tie 248 itself (halfway from 240, odd mantissa, to 256, even), so x is clamped to +-248
# (+-240 to saturate). NaNs keep their own rule (NOTE [ NaN to a finite format ]; the quiet
# NaN with the input's sign), applied only in a chunk that holds one, as pack_carried does.
# The fnuz float8_e4m3b11fnuz is float8_e4m3fnuz's cast of 8 x, NaN and policies included.
# Two of the nine have no sibling: float8_e3m4 (no torch format has 4 mantissa bits) and
# float4_e2m1fn (none has 1).
SIBLING: dict[str, tuple[torch.dtype, int]] = {  # name: (torch's dtype, b - b')
    "float8_e4m3b11fnuz": (torch.float8_e4m3fnuz, 11 - 8),
    "float6_e2m3fn": (torch.float8_e4m3fn, 1 - 7),
    "float6_e3m2fn": (torch.float8_e5m2, 3 - 15),
    "float8_e4m3": (torch.float8_e4m3fn, 7 - 7),
}


def sibling_applies(fmt: TorchFormat, overflow: str, subnormals: bool) -> bool:
    """Whether `encode_sibling` rounds this format to nearest under these policies (the
    others, and flushed subnormals, take encode_ops)."""
    return fmt.name in SIBLING and subnormals and overflow in (
        ("nan", "saturate") if fmt.convention == "fnuz" else ("saturate", "inf"))


def encode_sibling(x32: torch.Tensor, fmt: TorchFormat, overflow: str) -> torch.Tensor:
    """Round to nearest of float32 x32 by torch's cast to the format's sibling (NOTE [ A
    sibling's cast ]): uint8 codes, the same as encode_ops'."""
    dtype, shift = SIBLING[fmt.name]
    if fmt.convention == "fnuz":
        native = dataclasses.replace(fmt, dtype=dtype)  # the same codes, torch's cast
        return encode_native(x32 * 2.0**shift, native, overflow, True).to(torch.uint8)
    top = fmt.bits - 1
    bound = fmt.max if fmt.convention == "finite" or overflow == "saturate" else 248.0
    y = x32.clamp(-bound, bound)
    if shift:
        y *= 2.0**shift
    c = y.to(dtype).view(torch.uint8)
    if fmt.bits < 8:  # the sign from bit 7 to the format's top bit, the rest as it is
        sign = c >> (8 - fmt.bits)
        sign &= 1 << top
        c &= (1 << top) - 1
        c |= sign
    if c.numel() and math.isnan(x32.max()):
        nan = torch.isnan(x32)
        sign = torch.signbit(x32[nan]).to(torch.uint8) << top
        c[nan] = sign ^ (1 << top) if fmt.convention == "finite" else sign | fmt.nan_code
    return c


def encode_ops(x: torch.Tensor, fmt: TorchFormat, rounding: str, words: torch.Tensor | None,
               overflow: str, subnormals: bool) -> torch.Tensor:
    """float32/float64 x (the exact value to round) to int32 codes by the module docstring's
    four lines, then `pack`."""
    if rounding == "nearest_even" and x.dtype == torch.float32 and fmt.convention != "unsigned":
        return pack_carried(nearest_float32(x, fmt), x, fmt, overflow, subnormals)
    m, low = fmt.mantissa_bits, fmt.min_exponent  # low = 1 - b (unsigned: -b)
    nan = torch.isnan(x)
    a = torch.nan_to_num(x.abs(), nan=0.0, posinf=0.0)  # inf and NaN: pack handles them
    f, e = torch.frexp(a)
    normal = (e > low) & (a > 0)  # floor(log2 a) = e - 1 >= 1 - b
    scaled = torch.where(normal, f * 2.0 ** (m + 1), a * 2.0 ** (m - low))
    binade = (e - 1 - low) * normal  # t - (1 - b): 0 below
    if rounding == "nearest_even":
        kept = torch.round(scaled)
    else:
        kept = torch.floor(scaled)  # (trunc: scaled >= 0)
        if rounding == "stochastic":
            # NOTE [ Stochastic rounding with 32-bit words ]: up when u < floor(2^32 frac)
            top32 = torch.floor((scaled - kept) * 2.0**32)
            kept = kept + (words < top32.to(torch.int64)).to(kept.dtype)  # type: ignore[operator]
    code = (binade << m) + kept.to(torch.int32)
    beyond = (code > fmt.max_code + (fmt.convention == "unsigned")) | torch.isinf(x)
    if fmt.convention == "unsigned":  # powers of two: kept is 1 or 2 (0 or 1 below 2^-b)
        code = torch.clamp(code - 1, min=0)  # below 2^-bias: the smallest value
        code = torch.where(beyond, fmt.max_code if overflow == "saturate" else fmt.nan_code,
                           code)
        code = torch.where(x == 0, 0, code)  # +-0: the smallest value (reference/small_formats)
        return torch.where(~(x >= 0), fmt.nan_code, code)  # NaN, negatives
    return pack(code, torch.signbit(x).to(torch.int32), nan, beyond, fmt, overflow, subnormals)


# NOTE [ A sweep's chunk in place ]
# An exhaustive sweep encodes 2^32 float32 inputs in chunks of 2^16, and most formats go
# through nearest_float32 and pack_carried. Written as expressions, each of their ~20 torch
# ops allocated a fresh 256 KiB tensor (freed to the kernel and faulted in again, as NOTE
# [ Encoding in blocks ] in reference/encode_kernels.py tells), and each bool mask (isnan,
# a comparison, torch.where) cost 0.8-1.1 ns an input against 0.2 for an integer op
# (measured on one CPU thread): 9-11 ns an input in all. So both work in place on int32
# tensors, and pack_carried uses no mask where it can do without: every input beyond max
# (+-inf and NaN among them) has a |code| above max_code, so the overflow policy is a
# clamp where its code is max or the one above it; the sign is moved to the code's top bit
# by a shift and an and; fnuz's "no -0" multiplies the sign by (code + 2^bits - 1) >> bits,
# 1 exactly where code != 0; and NaNs, which only a chunk of the NaN patterns holds, are
# looked for by one max of x (NaN when any value is; a host read) before a mask is built.


def nearest_float32(x32: torch.Tensor, fmt: TorchFormat) -> torch.Tensor:
    """|code| of float32 x32 rounded to nearest even (before the overflow policy), on its
    bits: the carry at one shift for every element, and below the smallest normal one float
    addition (NOTE [ Nearest-even in two ranges ] in reference/encode_kernels.py), int32
    throughout, in place (NOTE [ A sweep's chunk in place ]). inf and NaN land far beyond
    max_code."""
    m, drop = fmt.mantissa_bits, 23 - fmt.mantissa_bits
    magnitude = x32.view(torch.int32) & 0x7FFFFFFF
    p = 2.0 ** (fmt.min_exponent - m + 23)  # |x| + 2^p rounds at the subnormal spacing
    below = (magnitude.view(torch.float32) + p).view(torch.int32)
    below -= int(torch.tensor(p, dtype=torch.float32).view(torch.int32))
    w = magnitude.clamp_(min=(127 + fmt.min_exponent) << 23)  # 2^(1-b)'s float32 bits
    w -= (127 - fmt.bias) << 23  # W: the binades below 2^(1-b) taken out
    odd = w >> drop
    odd &= 1
    w += odd
    w += (1 << (drop - 1)) - 1
    w >>= drop  # (W + half - 1 + odd) >> drop
    return torch.minimum(w, below, out=w)


def pack_carried(code: torch.Tensor, x32: torch.Tensor, fmt: TorchFormat, overflow: str,
                 subnormals: bool) -> torch.Tensor:
    """`pack` for nearest_float32's |code| of float32 x32, in place (NOTE [ A sweep's chunk
    in place ]): the same rules, with the overflow as a clamp and the sign by integer ops."""
    bits, top = x32.view(torch.int32), fmt.bits - 1
    nan = None  # where x32 is a NaN, if anywhere (torch's max is NaN when a value is)
    if bits.numel() and math.isnan(x32.max()):
        nan = torch.isnan(x32)
    if not subnormals:  # a subnormal result (|code| below the smallest normal's) becomes +-0
        code = torch.where(code < 2**fmt.mantissa_bits, 0, code)
    sign = bits >> (31 - top)  # arithmetic: bit 31 lands on the code's top bit
    sign &= 1 << top
    if fmt.convention == "fnuz":  # beyond max: max, or max_code + 1, the NaN (sign bit alone)
        code.clamp_(max=fmt.max_code + 1 if overflow == "nan" else fmt.max_code)
        nonzero = code + (2**fmt.bits - 1)
        nonzero >>= fmt.bits  # 1 where code != 0
        sign *= nonzero  # no -0
        code |= sign
        if nan is not None:
            code[nan] = 1 << top
        return code
    if fmt.convention == "finite":
        code.clamp_(max=fmt.max_code)
        code |= sign
        if nan is not None:  # NOTE [ NaN to a finite format ]: a zero of the inverted sign
            code[nan] = sign[nan] ^ (1 << top)
        return code
    replacement = {"inf": fmt.inf_code, "saturate": fmt.max_code, "nan": fmt.nan_code}[overflow]
    if replacement <= fmt.max_code + 1:
        code.clamp_(max=replacement)  # +-inf lands here too
    else:
        code = torch.where(code > fmt.max_code, replacement, code)
    code |= sign
    if nan is not None:  # the quiet NaN, with the input's sign
        code[nan] = sign[nan] | fmt.nan_code
    return code


def pack(code: torch.Tensor, sign: torch.Tensor, nan: torch.Tensor, beyond: torch.Tensor,
         fmt: TorchFormat, overflow: str, subnormals: bool) -> torch.Tensor:
    """The code: |code| = code, then the overflow policy, NaN, and the sign (int32), as in
    reference/small_formats.py's `pack`."""
    if not subnormals:  # a subnormal result (|code| below the smallest normal's) becomes +-0
        code = torch.where(code < 2**fmt.mantissa_bits, 0, code)
    top = fmt.bits - 1
    if fmt.convention == "fnuz":
        sign = torch.where((code == 0) & ~beyond, 0, sign)  # no -0 (+-inf's code is 0 here)
        nan_out = nan | beyond if overflow == "nan" else nan
        code = torch.where(beyond, fmt.max_code, code)
        code = torch.where(nan_out, 0, code)
        sign = torch.where(nan_out, 1, sign)
        return (sign << top) | code
    if fmt.convention == "finite":
        code = torch.where(beyond, fmt.max_code, code)
        code = torch.where(nan, 0, code)
        sign = torch.where(nan, 1 - sign, sign)  # NOTE [ NaN to a finite format ]
        return (sign << top) | code
    replacement = {"inf": fmt.inf_code, "saturate": fmt.max_code, "nan": fmt.nan_code}[overflow]
    code = torch.where(beyond, replacement, code)  # +-inf lands here too
    code = torch.where(nan, fmt.nan_code, code)  # the quiet NaN, with the input's sign
    return (sign << top) | code


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """2^k as float64, built from its bits (k an int64 tensor in float64's normal range)."""
    return ((k + 1023) << 52).view(torch.float64)


def decode_values(c: torch.Tensor, fmt: TorchFormat) -> torch.Tensor:
    """The float64 value of each int64 code: a bit view where torch has the dtype, else the
    layout read with integer ops (reference/small_formats.py's `decode_values`)."""
    if fmt.dtype is not None:
        return c.to(torch.uint8).view(fmt.dtype).to(torch.float64)
    if fmt.convention == "unsigned":  # E8M0 on torch 2.6: 2^(c - bias), 0xFF the NaN
        return torch.where(c == fmt.nan_code, torch.nan, _pow2(c - fmt.bias))
    m = fmt.mantissa_bits
    negative = (c >> (fmt.bits - 1)) == 1
    field = (c >> m) & (2**fmt.exponent_bits - 1)
    frac = c & (2**m - 1)
    # value = M * 2^(max(E, 1) - bias - m): an integer below 2^5 times a power of two, exact
    big_m = torch.where(field > 0, frac + 2**m, frac)
    value = big_m.to(torch.float64) * _pow2(torch.clamp(field, min=1) - fmt.bias - m)
    if fmt.convention == "fnuz":
        value = torch.where(c == 2 ** (fmt.bits - 1), torch.nan, value)
    if fmt.convention == "ieee":
        top = 2**fmt.exponent_bits - 1
        value = torch.where((field == top) & (frac == 0), torch.inf, value)
        value = torch.where((field == top) & (frac != 0), torch.nan, value)
    return torch.where(negative, -value, value)
