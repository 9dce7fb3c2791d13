"""Number formats with PyTorch's native API. See reference/formats.py for the math.

Same public names as the reference, in the same order: encode, decode, quantize,
draw_random_words (FORMATS and get_format from torch_impl/format_spec.py). Where the two
differ in shape: a torch cast yields values, whose bits are the codes, so here `quantize`
holds the rounding and `encode` is quantize plus a bit view; the reference rounds on codes,
so there `encode` holds the rounding and `quantize` is encode plus decode. `is_member` and
`ulp_distance` (measuring in a format) are no twins: parity/ulps.py, the proof's ruler. What
PyTorch does differently or hides:

- Round to nearest even is `Tensor.to(dtype)`: C++ bit tricks (c10/util/Half.h,
  BFloat16.h, torch/headeronly/util/Float8_*.h) or hardware conversion instructions (F16C,
  AVX512) on vectorized CPU paths. tf32 uses the classic integer trick on the int32 view.
- float64 input: torch casts through float32, rounding twice. The correctly rounded result
  is recovered with native casts by rounding to ODD in float32 first: truncate, then set the
  last bit if anything was dropped. float32 keeps at least 2 more bits than any target at
  every magnitude, so the second, nearest-even rounding is then correct (Boldo and
  Melquiond, "Emulation of FMA and correctly rounded sums", IEEE TC 2008).
- No rounding mode but nearest exists: toward zero is the native cast followed by one step
  toward zero (an integer -1 on the code) where the cast rounded away; stochastic rounding
  is built from torch.frexp / ldexp / trunc, which are exact, and a 32-bit random word per
  element from a torch.Generator (NOTE [ Stochastic rounding with 32-bit words ]).
- float8_e4m3fn overflow depends on the torch version (NOTE [ float8_e4m3fn overflow ] in
  reference/formats.py): torch >= 2.13 saturates (+-inf included), 2.6-2.12 give NaN
  (measured on 2.6.0, 2.7.1, 2.8.0, 2.11.0, 2.12.0, 2.12.1 and 2.13.0).
  `DEFAULT_OVERFLOW` holds what the installed torch does, and the default policy leaves the
  native result untouched, so a parity test sees torch's own behaviour.
- The small formats (the fnuz float8s, E8M0, float6/float4, float8_e4m3/e3m4) are encoded
  and decoded in torch_impl/small_formats.py: torch's cast where it has one and rounds to
  nearest, exact torch ops everywhere else; `encode` is the rounding there and `quantize`
  is encode plus decode, as in the reference.
- The unsigned code dtypes (torch.uint16, uint32) get arithmetic and indexing only in recent
  torch (2.6 has neither for uint16), so codes are checked and converted as int64.
Works on CPU and CUDA tensors alike.
"""

from __future__ import annotations

import math

import torch

from common import arg_ranges
from torch_impl import small_formats as small
from torch_impl.format_spec import FORMATS, TorchFormat, get_format  # noqa: F401

# the declared ranges (common/arg_ranges.py), which the strategies read too
ROUNDING_MODES = arg_ranges.ROUNDING_MODES
OVERFLOW_POLICIES = arg_ranges.OVERFLOW_POLICIES


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


# NOTE [ float8_e4m3fn overflow ] (reference/formats.py): the first release that saturates.
E4M3FN_SATURATES = _torch_version() >= (2, 13)
# What the installed torch's cast does with a value that rounds beyond max, and with +-inf.
DEFAULT_OVERFLOW: dict[str, str] = {
    "float32": "inf",
    "tf32": "inf",
    "float16": "inf",
    "bfloat16": "inf",
    "float8_e5m2": "inf",
    "float8_e4m3fn": "saturate" if E4M3FN_SATURATES else "nan",
    # torch 2.13's fnuz and E8M0 casts give the NaN (claim formats.small_encode); the formats
    # it lacks follow the reference's DEFAULT_OVERFLOW
    **{name: "nan" for name in ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
                                "float8_e8m0fnu")},
    **{name: "saturate" for name in ("float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn")},
    "float8_e4m3": "inf",
    "float8_e3m4": "inf",
}
_TF32_DROP = 23 - 10  # float32 fraction bits below tf32's
_SIGN32 = -(2**31)  # the int32 with only the sign bit set


def encode(
    x: torch.Tensor,
    fmt: str | TorchFormat,
    *,
    rounding: str = "nearest_even",
    rng: torch.Generator | None = None,
    random_bits: torch.Tensor | None = None,
    overflow: str | None = None,
    subnormals: bool = True,
    via: str | None = None,
) -> torch.Tensor:
    """Round like `quantize` and return the codes (torch.uint8/uint16/uint32, x's shape)."""
    fmt = get_format(fmt)
    if fmt.small:
        return _encode_small(x, fmt, rounding, rng, random_bits, overflow, subnormals, via)
    values = quantize(x, fmt, rounding=rounding, rng=rng, random_bits=random_bits,
                      overflow=overflow, subnormals=subnormals, via=via)
    values = values.to(torch.float32)  # members: this cast is exact
    if fmt.dtype is None:  # tf32: the top 19 bits of the float32 word
        word = values.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        return (word >> _TF32_DROP).to(torch.uint32)
    return values.to(fmt.dtype).view(fmt.code_dtype)


def _encode_small(x: torch.Tensor, fmt: TorchFormat, rounding: str, rng: object,
                  random_bits: object, overflow: str | None, subnormals: bool,
                  via: str | None) -> torch.Tensor:
    """`encode` for the small formats: torch's cast to nearest where it has one, exact ops
    otherwise (torch_impl/small_formats.py)."""
    x = _check_input(x)
    overflow = _check_policies(fmt, rounding, overflow, rng, random_bits, subnormals)
    words = _random_words(x, rng, random_bits) if rounding == "stochastic" else None
    x32, source = _source(x, fmt, via)
    if rounding == "nearest_even" and fmt.name in small.NATIVE:
        code = small.encode_native(x32, fmt, overflow, subnormals)
    elif rounding == "nearest_even" and small.sibling_applies(fmt, overflow, subnormals):
        code = small.encode_sibling(x32, fmt, overflow)
    else:
        finite = overflow == "saturate_finite"  # an infinity converts exactly: after
        code = small.encode_ops(source, fmt, rounding, words,
                                "saturate" if finite else overflow, subnormals)
        if finite:
            inf = (fmt.inf_code | (1 << (fmt.bits - 1)) * torch.signbit(source).to(code.dtype))
            code = torch.where(torch.isinf(source), inf.to(code.dtype), code)
    return code.to(torch.uint8)


def _check_input(x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"expected a float32 or float64 tensor, got dtype {x.dtype}")
    return x


def _check_policies(fmt: TorchFormat, rounding: str, overflow: str | None,
                    rng: object, random_bits: object, subnormals: object) -> str:
    """Refuse unknown modes and policies and a subnormals flag that is no bool; return the
    overflow policy that applies."""
    arg_ranges.check_flag("encode", "subnormals", subnormals)
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; accepted: {', '.join(ROUNDING_MODES)}")
    if rounding != "stochastic" and (rng is not None or random_bits is not None):
        raise ValueError("rng= and random_bits= apply to rounding='stochastic' only")
    if overflow is None:  # (toward_zero: NOTE [ Toward zero keeps infinities ], reference)
        finite = "saturate_finite" if fmt.has_infinity else "saturate"
        overflow = finite if rounding == "toward_zero" else DEFAULT_OVERFLOW[fmt.name]
    if overflow not in OVERFLOW_POLICIES:
        raise ValueError(f"unknown overflow {overflow!r}; accepted: {', '.join(OVERFLOW_POLICIES)}")
    if overflow in ("inf", "saturate_finite") and not fmt.has_infinity:
        raise ValueError(f"{fmt.name} has no infinity; use overflow='saturate' or 'nan'")
    if overflow == "nan" and fmt.convention == "finite":
        raise ValueError(f"{fmt.name} has no NaN and no infinity; overflow saturates")
    return overflow


def _source(x: torch.Tensor, fmt: TorchFormat, via: str | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x32, source): the float32 the native casts read, and the exact value the result must
    be the rounding of (x itself, or x rounded to float32 first with via="float32")."""
    if via is not None and (via != "float32" or x.dtype != torch.float64):
        raise ValueError("via='float32' applies to float64 input only (and is the only via)")
    if x.dtype == torch.float32 or via == "float32" or fmt.name == "float32":
        x32 = x.to(torch.float32)  # one rounding (or none): what the cast does is right
    else:
        x32 = _round_to_odd_float32(x)
    return x32, (x32 if via == "float32" else x)


def _round_to_odd_float32(x: torch.Tensor) -> torch.Tensor:
    """float64 -> float32 rounded to odd: truncate toward zero, then set the last bit if
    anything was dropped. Keeps the sticky information a second rounding needs."""
    y = x.to(torch.float32)
    code = y.view(torch.int32)
    away = (y.to(torch.float64).abs() > x.abs()) & torch.isfinite(x)
    code = torch.where(away, code - 1, code)  # one step toward zero (sign-magnitude code)
    inexact = code.view(torch.float32).to(torch.float64) != x
    return (code | inexact.to(torch.int32)).view(torch.float32)


def _nearest(x32: torch.Tensor, fmt: TorchFormat) -> torch.Tensor:
    """Round-to-nearest-even of float32 values by torch's own cast, returned as float64."""
    if fmt.dtype is not None:
        return x32.to(fmt.dtype).to(torch.float64)
    # tf32: add half a tf32 ulp minus one, plus the kept lsb, then clear the dropped bits.
    code = x32.view(torch.int32)
    sign = code & _SIGN32
    magnitude = code & ~_SIGN32
    lsb = (magnitude >> _TF32_DROP) & 1
    rounded = ((magnitude + (1 << (_TF32_DROP - 1)) - 1 + lsb) >> _TF32_DROP) << _TF32_DROP
    rounded = torch.where(torch.isnan(x32), magnitude, rounded)
    return (rounded | sign).view(torch.float32).to(torch.float64)


def _toward_zero(x32: torch.Tensor, source: torch.Tensor, fmt: TorchFormat) -> torch.Tensor:
    """The native nearest, then one step back toward zero where it rounded away."""
    magnitude = source.abs().to(torch.float64)
    r = _nearest(x32, fmt)
    # Anything between max and the overflow boundary truncates to max; the cast's own
    # overflow result (inf, NaN or max, by version) must not be stepped from.
    r = torch.where(magnitude > fmt.max, torch.full_like(r, fmt.max).copysign(r), r)
    away = r.abs() > magnitude
    return torch.where(away, _step_toward_zero(r.to(torch.float32), fmt).to(torch.float64), r)


def _step_toward_zero(r: torch.Tensor, fmt: TorchFormat) -> torch.Tensor:
    """The member of `fmt` just below |r| (r a float32 holding a member, or +-inf)."""
    if fmt.dtype is None:
        code = r.view(torch.int32) - (1 << _TF32_DROP)
        return code.view(torch.float32)
    int_dtype = {1: torch.int8, 2: torch.int16, 4: torch.int32}[fmt.bits // 8]
    code = r.to(fmt.dtype).view(int_dtype) - 1
    return code.view(fmt.dtype).to(torch.float32)


def _stochastic(x: torch.Tensor, fmt: TorchFormat, words: torch.Tensor) -> torch.Tensor:
    """Stochastic rounding in float64 with exact operations (frexp, ldexp, trunc)."""
    xd = x.to(torch.float64)
    _, e = torch.frexp(xd)  # |x| = f * 2^e with 0.5 <= f < 1: floor(log2|x|) = e - 1
    spacing_exp = torch.clamp(e.to(torch.int64) - 1, min=fmt.min_exponent) - fmt.mantissa_bits
    scaled = torch.ldexp(xd.abs(), -spacing_exp.to(torch.float64))  # |x| / spacing: exact
    kept = torch.trunc(scaled)
    # NOTE [ Stochastic rounding with 32-bit words ]: up when u < floor(2^32 * rest/spacing).
    top32 = torch.floor(torch.ldexp(scaled - kept, torch.tensor(32.0, dtype=torch.float64,
                                                                   device=x.device)))
    kept = kept + (words < top32.to(torch.int64)).to(torch.float64)
    r = torch.ldexp(kept, spacing_exp.to(torch.float64)).copysign(xd)
    return torch.where(torch.isfinite(xd), r, xd)


def _overflow(r: torch.Tensor, source: torch.Tensor, fmt: TorchFormat, rounding: str,
              overflow: str) -> torch.Tensor:
    """r with every result beyond max replaced by the policy's value (sign kept). With the
    installed torch's own policy, round to nearest keeps the cast's result untouched."""
    magnitude = source.abs().to(torch.float64)
    ulp_max = 2.0 ** (fmt.max_exponent - 1 - fmt.mantissa_bits)
    if rounding == "stochastic":
        over = (r.abs() > fmt.max) | torch.isinf(source)
    elif rounding == "toward_zero":  # the next member up, max + ulp, is the first too large
        over = (magnitude >= fmt.max + ulp_max) & ~torch.isnan(magnitude)
    elif overflow == DEFAULT_OVERFLOW[fmt.name]:
        return r  # leave torch's own overflow result visible
    else:
        # Round to nearest even: the tie at max + ulp/2 goes up when max's last bit is odd
        # (IEEE: 1.11...1) and stays at max when it is even (fn: 1.11...10).
        bound, max_is_odd = fmt.max + ulp_max / 2, (fmt.max / ulp_max) % 2 == 1
        over = (magnitude > bound) | ((magnitude == bound) & max_is_odd)
    replacement = {"inf": math.inf, "saturate": fmt.max, "nan": math.nan,
                   "saturate_finite": fmt.max}[overflow]
    signed = torch.full_like(r, replacement).copysign(source.to(torch.float64))
    r = torch.where(over, signed, r)
    if overflow == "saturate_finite":  # an infinity converts exactly
        r = torch.where(torch.isinf(source), source.to(r.dtype), r)
    return r


def _random_words(x: torch.Tensor, rng: torch.Generator | None,
                  random_bits: object) -> torch.Tensor:
    """The words u of stochastic rounding: int64 on x's device, each in [0, 2^32)."""
    if (rng is None) == (random_bits is None):
        raise ValueError("stochastic rounding needs exactly one of rng= (a torch.Generator) "
                         "or random_bits= (integers in [0, 2^32), one per element)")
    if random_bits is None:
        if not isinstance(rng, torch.Generator):
            raise TypeError(f"rng must be a torch.Generator, got {type(rng).__name__}")
        return draw_random_words(tuple(x.shape), rng, device=x.device)
    if not isinstance(random_bits, torch.Tensor) or random_bits.dtype.is_floating_point or \
            random_bits.dtype.is_complex or random_bits.dtype == torch.bool:
        what = random_bits.dtype if isinstance(random_bits, torch.Tensor) else \
            type(random_bits).__name__
        raise TypeError(f"random_bits must be an integer tensor, got {what}")
    if random_bits.shape != x.shape:
        raise ValueError(f"random_bits must have x's shape {tuple(x.shape)}, "
                         f"got {tuple(random_bits.shape)}")
    words = random_bits.to(device=x.device, dtype=torch.int64)
    if words.numel() and (words.min() < 0 or words.max() >= 2**32):
        raise ValueError("random_bits must lie in [0, 2^32)")
    return words


def draw_random_words(shape: tuple[int, ...], rng: torch.Generator,
                      device: str | torch.device = "cpu") -> torch.Tensor:
    """The words stochastic rounding consumes: int64 in [0, 2^32), one per element."""
    return torch.randint(0, 2**32, shape, dtype=torch.int64, generator=rng, device=device)


def decode(codes: torch.Tensor, fmt: str | TorchFormat,
           dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The exact value of each code, by reinterpreting the bits (`Tensor.view`)."""
    fmt = get_format(fmt)
    if not isinstance(codes, torch.Tensor) or codes.dtype.is_floating_point or \
            codes.dtype.is_complex or codes.dtype == torch.bool:
        what = codes.dtype if isinstance(codes, torch.Tensor) else type(codes).__name__
        raise TypeError(f"decode expects an integer tensor of codes, got {what}")
    c = codes.to(torch.int64)
    if c.numel() and (c.min() < 0 or c.max() >= 2**fmt.bits):
        raise ValueError(f"codes out of range for the {fmt.bits}-bit format {fmt.name}: "
                         f"expected [0, 2^{fmt.bits})")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"decode produces float32 or float64, got "
                        f"{str(dtype).removeprefix('torch.')}")
    if fmt.small:  # every small format's values are float32 values
        return small.decode_values(c, fmt).to(dtype)
    width = 32 if fmt.dtype is None else fmt.bits  # tf32: the top 19 bits of float32's word
    word = c << (width - fmt.bits)
    word = torch.where(word >= 2 ** (width - 1), word - 2**width, word)  # two's complement
    signed = {8: torch.int8, 16: torch.int16, 32: torch.int32}[width]
    return word.to(signed).view(fmt.dtype or torch.float32).to(dtype)


def quantize(
    x: torch.Tensor,
    fmt: str | TorchFormat,
    *,
    rounding: str = "nearest_even",
    rng: torch.Generator | None = None,
    random_bits: torch.Tensor | None = None,
    overflow: str | None = None,
    subnormals: bool = True,
    via: str | None = None,
) -> torch.Tensor:
    """Each element replaced by the member of `fmt` the rounding picks; x's dtype, shape and
    device.

    Arguments as in reference.formats.quantize; `rng` is a torch.Generator, `random_bits`
    an integer tensor of x's shape with values in [0, 2^32). Default overflow: what the
    installed torch's cast does (DEFAULT_OVERFLOW); for toward_zero IEEE 754's,
    "saturate_finite" where the format has an infinity (NOTE [ Toward zero keeps infinities ]
    in reference/formats.py).
    """
    fmt = get_format(fmt)
    x = _check_input(x)
    if fmt.small:
        codes = encode(x, fmt, rounding=rounding, rng=rng, random_bits=random_bits,
                       overflow=overflow, subnormals=subnormals, via=via)
        return decode(codes, fmt, dtype=torch.float64).to(x.dtype)
    overflow = _check_policies(fmt, rounding, overflow, rng, random_bits, subnormals)
    words = _random_words(x, rng, random_bits) if rounding == "stochastic" else None
    x32, source = _source(x, fmt, via)
    if rounding == "nearest_even":
        r = _nearest(x32, fmt)
    elif rounding == "toward_zero":
        r = _toward_zero(x32, source, fmt)
    else:
        r = _stochastic(source, fmt, words)  # type: ignore[arg-type]
    r = _overflow(r, source, fmt, rounding, overflow)
    if not subnormals:
        r = torch.where(r.abs() < fmt.tiny, torch.zeros_like(r).copysign(r), r)
    return r.to(x.dtype)
