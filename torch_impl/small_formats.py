"""The small formats with torch ops. See reference/small_formats.py for the conventions (fnuz,
finite, unsigned) and reference/formats.py for rounding on the integers.

torch 2.13 casts to three of the nine (NATIVE: float8_e4m3fnuz, float8_e5m2fnuz,
float8_e8m0fnu; 2.7 to 2.13 alike, 2.6 lacks the E8M0 dtype). Its float4_e2m1fn_x2 holds
two codes a byte and has no cast ("copy_kernel" not implemented); float8_e4m3b11fnuz, the
float6s, float4_e2m1fn, float8_e4m3 and float8_e3m4 have no dtype at all. So:

- Round to nearest to a NATIVE format is torch's cast and a bit view (`encode_native`), and
  does what torch does. The fnuz casts do what the reference does (overflow and +-inf give
  the NaN 0x80, -0 gives +0; claim formats.small_encode). The float8_e8m0fnu cast differs
  in three places (claim formats.e8m0_torch): a negative x gives |x|'s code (-4 -> 4), +-0
  gives 2^-127 (code 0), and |x| strictly between 2^-127 and 1.5 * 2^-127 gives 2^-126,
  where the reference and ml_dtypes give NaN, NaN and 2^-127. Its ties round up as theirs
  do (1.5 -> 2; NOTE [ E8M0 ties ]).
- Everything else (the other six formats, and toward_zero and stochastic rounding to all
  nine) is `encode_ops`: exact torch ops in the input's own dtype, the same rounding as the
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
  passes that cost about half the frexp path's; float64 input takes the frexp path, exact
  in float64, so it is rounded once. Where the reference and ml_dtypes give NaN for E8M0 (x <= 0,
  NaN), so does this path: torch has no rounding but its cast's to follow there.
"""

from __future__ import annotations

import torch

from torch_impl.format_spec import TorchFormat

# float8_e8m0fnu is a torch dtype from 2.7 (measured: absent on 2.6.0); without it E8M0 takes
# the exact-ops path and its layout decode, as the formats torch lacks do.
NATIVE: tuple[str, ...] = tuple(name for name in
                                ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
                                if hasattr(torch, name))


def encode_native(x32: torch.Tensor, fmt: TorchFormat, overflow: str,
                  subnormals: bool) -> torch.Tensor:
    """torch's cast of float32 x32 and its bits (int32 codes); overflow="saturate" turns the
    cast's one NaN code, where the input was no NaN (overflow, +-inf), into +-max."""
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


def encode_ops(x: torch.Tensor, fmt: TorchFormat, rounding: str, words: torch.Tensor | None,
               overflow: str, subnormals: bool) -> torch.Tensor:
    """float32/float64 x (the exact value to round) to int32 codes by the module docstring's
    four lines, then `pack`."""
    if rounding == "nearest_even" and x.dtype == torch.float32 and fmt.convention != "unsigned":
        code, beyond = nearest_float32(x, fmt)
        return pack(code, (x.view(torch.int32) < 0).to(torch.int32), torch.isnan(x), beyond,
                    fmt, overflow, subnormals)
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
        return torch.where(~(x > 0), fmt.nan_code, code)  # NaN, zeros, negatives
    return pack(code, torch.signbit(x).to(torch.int32), nan, beyond, fmt, overflow, subnormals)


def nearest_float32(x32: torch.Tensor, fmt: TorchFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """(|code|, beyond max) of float32 x32 rounded to nearest even, on its bits: the carry at
    one shift for every element, and below the smallest normal one float addition (NOTE
    [ Nearest-even in two ranges ] in reference/encode_kernels.py), int32 throughout."""
    m, drop = fmt.mantissa_bits, 23 - fmt.mantissa_bits
    magnitude = x32.view(torch.int32) & 0x7FFFFFFF
    smallest_normal = (127 + fmt.min_exponent) << 23  # 2^(1-b)'s float32 bits
    w = torch.clamp(magnitude, min=smallest_normal) - ((127 - fmt.bias) << 23)
    normal = (w + ((1 << (drop - 1)) - 1) + ((w >> drop) & 1)) >> drop
    p = 2.0 ** (fmt.min_exponent - m + 23)  # |x| + 2^p rounds at the subnormal spacing
    below = (magnitude.view(torch.float32) + p).view(torch.int32) - \
        torch.tensor(p, dtype=torch.float32).view(torch.int32)
    code = torch.minimum(normal, below)
    return code, code > fmt.max_code  # inf and NaN: far beyond (NaN then wins in pack)


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
