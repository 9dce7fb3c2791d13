"""Number formats with PyTorch's native API. See reference/formats.py for the math.

Same public names as the reference: FORMATS, get_format, quantize, encode, decode,
draw_random_words. What PyTorch does differently or hides:

- Ranges come from `torch.finfo`, which has no `smallest_subnormal` (it is tiny * eps) and no
  exponent limits (read off max and tiny with math.frexp). tf32 has no torch dtype at all:
  its range is float32's with a 10-bit mantissa (the bit widths are the one thing taken from
  the reference, as a plain spec).
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
  reference/formats.py): torch >= 2.12 saturates (+-inf included), 2.6-2.11 give NaN.
  `DEFAULT_OVERFLOW` holds what the installed torch does, and the default policy leaves the
  native result untouched, so a parity test sees torch's own behaviour.
Works on CPU and CUDA tensors alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from reference.formats import FORMATS as _SPECS  # bit widths only: a plain data spec

ROUNDING_MODES = ("nearest_even", "toward_zero", "stochastic")
OVERFLOW_POLICIES = ("inf", "saturate", "nan")


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


E4M3FN_SATURATES = _torch_version() >= (2, 12)
# What the installed torch's cast does with a value that rounds beyond max, and with +-inf.
DEFAULT_OVERFLOW: dict[str, str] = {
    "float32": "inf",
    "tf32": "inf",
    "float16": "inf",
    "bfloat16": "inf",
    "float8_e5m2": "inf",
    "float8_e4m3fn": "saturate" if E4M3FN_SATURATES else "nan",
}


@dataclass(frozen=True)
class TorchFormat:
    """A named format as torch sees it: its dtype (None for tf32) and torch.finfo ranges."""

    name: str
    dtype: torch.dtype | None
    code_dtype: torch.dtype  # the unsigned integer dtype of one code

    @property
    def _finfo(self) -> torch.finfo:
        return torch.finfo(self.dtype if self.dtype is not None else torch.float32)

    @property
    def mantissa_bits(self) -> int:
        if self.dtype is None:
            return _SPECS[self.name].mantissa_bits
        return -math.frexp(self._finfo.eps)[1] + 1  # eps = 2^-m

    @property
    def bits(self) -> int:
        if self.dtype is None:
            return _SPECS[self.name].bits
        return self._finfo.bits

    @property
    def exponent_bits(self) -> int:
        return self.bits - 1 - self.mantissa_bits

    @property
    def eps(self) -> float:
        return 2.0 ** -self.mantissa_bits if self.dtype is None else self._finfo.eps

    @property
    def unit_roundoff(self) -> float:
        return self.eps / 2

    @property
    def max(self) -> float:
        if self.dtype is None:  # float32's largest binade with m mantissa bits
            top = math.frexp(self._finfo.max)[1] - 1
            return (2.0 - self.eps) * 2.0**top
        return self._finfo.max

    @property
    def tiny(self) -> float:
        return self._finfo.tiny

    @property
    def smallest_subnormal(self) -> float:
        return self.tiny * self.eps  # torch.finfo lacks it

    @property
    def max_exponent(self) -> int:
        return math.frexp(self.max)[1]  # max = f * 2^e, 0.5 <= f < 1: 2^e is not finite

    @property
    def min_exponent(self) -> int:
        return math.frexp(self.tiny)[1] - 1


FORMATS: dict[str, TorchFormat] = {
    "float32": TorchFormat("float32", torch.float32, torch.uint32),
    "tf32": TorchFormat("tf32", None, torch.uint32),
    "float16": TorchFormat("float16", torch.float16, torch.uint16),
    "bfloat16": TorchFormat("bfloat16", torch.bfloat16, torch.uint16),
    "float8_e5m2": TorchFormat("float8_e5m2", torch.float8_e5m2, torch.uint8),
    "float8_e4m3fn": TorchFormat("float8_e4m3fn", torch.float8_e4m3fn, torch.uint8),
}
_TF32_DROP = 23 - 10  # float32 fraction bits below tf32's
_SIGN32 = -(2**31)  # the int32 with only the sign bit set


def get_format(fmt: str | TorchFormat) -> TorchFormat:
    """A TorchFormat from itself or its name (only named formats have torch twins)."""
    if isinstance(fmt, TorchFormat):
        return fmt
    if isinstance(fmt, str) and fmt in FORMATS:
        return FORMATS[fmt]
    raise ValueError(
        f"unknown format {fmt!r}; torch_impl knows {', '.join(FORMATS)} "
        "(generic formats exist only in reference.formats)"
    )


def _check_input(x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"expected a float32 or float64 tensor, got dtype {x.dtype}")
    return x


def _round_to_odd_float32(x: torch.Tensor) -> torch.Tensor:
    """float64 -> float32 rounded to odd: truncate toward zero, then set the last bit if
    anything was dropped. Keeps the sticky information a second rounding needs."""
    y = x.to(torch.float32)
    code = y.view(torch.int32)
    away = (y.to(torch.float64).abs() > x.abs()) & torch.isfinite(x)
    code = torch.where(away, code - 1, code)  # one step toward zero (sign-magnitude code)
    inexact = code.view(torch.float32).to(torch.float64) != x
    return (code | inexact.to(torch.int32)).view(torch.float32)


def _nearest_native(x32: torch.Tensor, fmt: TorchFormat) -> torch.Tensor:
    """Round-to-nearest-even of float32 values by torch's own cast, returned as float32."""
    if fmt.dtype is not None:
        return x32.to(fmt.dtype).to(torch.float32)
    # tf32: add half a tf32 ulp minus one, plus the kept lsb, then clear the dropped bits.
    code = x32.view(torch.int32)
    sign = code & _SIGN32
    magnitude = code & ~_SIGN32
    lsb = (magnitude >> _TF32_DROP) & 1
    rounded = ((magnitude + (1 << (_TF32_DROP - 1)) - 1 + lsb) >> _TF32_DROP) << _TF32_DROP
    rounded = torch.where(torch.isnan(x32), magnitude, rounded)
    return (rounded | sign).view(torch.float32)


def _step_toward_zero(r: torch.Tensor, fmt: TorchFormat) -> torch.Tensor:
    """The member of `fmt` just below |r| (r a float32 holding a member, or +-inf)."""
    if fmt.dtype is None:
        code = r.view(torch.int32) - (1 << _TF32_DROP)
        return code.view(torch.float32)
    int_dtype = {1: torch.int8, 2: torch.int16, 4: torch.int32}[fmt.bits // 8]
    code = r.to(fmt.dtype).view(int_dtype) - 1
    return code.view(fmt.dtype).to(torch.float32)


def _overflow_boundary(fmt: TorchFormat, rounding: str) -> tuple[float, bool]:
    """(b, tie_overflows): a value overflows when |v| > b, or |v| == b and tie_overflows."""
    ulp_max = 2.0 ** (fmt.max_exponent - 1 - fmt.mantissa_bits)
    if rounding == "toward_zero":
        return fmt.max + ulp_max, True
    # Round to nearest even: the tie at max + ulp/2 goes up when max's last bit is odd
    # (IEEE: 1.11...1) and stays at max when it is even (fn: 1.11...10).
    max_is_odd = (fmt.max / ulp_max) % 2 == 1
    return fmt.max + ulp_max / 2, max_is_odd


def draw_random_words(shape: tuple[int, ...], rng: torch.Generator,
                      device: str | torch.device = "cpu") -> torch.Tensor:
    """The random words stochastic rounding consumes: int64 in [0, 2^32), one per element."""
    return torch.randint(0, 2**32, shape, dtype=torch.int64, generator=rng, device=device)


def _stochastic(x: torch.Tensor, fmt: TorchFormat, words: torch.Tensor) -> torch.Tensor:
    """Stochastic rounding in float64 with exact operations (frexp, ldexp, trunc)."""
    xd = x.to(torch.float64)
    _, e = torch.frexp(xd)  # |x| = f * 2^e with 0.5 <= f < 1: floor(log2|x|) = e - 1
    spacing_exp = torch.clamp(e.to(torch.int64) - 1, min=fmt.min_exponent) - fmt.mantissa_bits
    scaled = torch.ldexp(xd.abs(), -spacing_exp.to(torch.float64))  # |x| / spacing: exact
    kept = torch.trunc(scaled)
    top32 = torch.floor(torch.ldexp(scaled - kept, torch.tensor(32.0, dtype=torch.float64,
                                                                   device=x.device)))
    kept = kept + (words < top32.to(torch.int64)).to(torch.float64)
    r = torch.ldexp(kept, spacing_exp.to(torch.float64)).copysign(xd)
    return torch.where(torch.isfinite(xd), r, xd)


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
    """Each element replaced by the member of `fmt` the rounding picks; x's dtype and device.

    Arguments as in reference.formats.quantize; `rng` is a torch.Generator, `random_bits`
    an integer tensor of x's shape with values in [0, 2^32). Default overflow: what the
    installed torch's cast does (DEFAULT_OVERFLOW), "saturate" for toward_zero (IEEE 754).
    """
    fmt = get_format(fmt)
    x = _check_input(x)
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; accepted: {', '.join(ROUNDING_MODES)}")
    native = DEFAULT_OVERFLOW[fmt.name]
    if overflow is None:
        overflow = "saturate" if rounding == "toward_zero" else native
    if overflow not in OVERFLOW_POLICIES:
        raise ValueError(f"unknown overflow {overflow!r}; accepted: {', '.join(OVERFLOW_POLICIES)}")
    if overflow == "inf" and fmt.name == "float8_e4m3fn":
        raise ValueError(f"{fmt.name} has no infinity; use overflow='saturate' or 'nan'")
    if via is not None and (via != "float32" or x.dtype != torch.float64):
        raise ValueError("via='float32' applies to float64 input only (and is the only via)")

    if x.dtype == torch.float32 or via == "float32" or fmt.name == "float32":
        x32 = x.to(torch.float32)  # one rounding (or none): what the cast does is right
    else:
        x32 = _round_to_odd_float32(x)
    source = x32 if via == "float32" else x  # what the exact comparisons below compare with

    if rounding == "stochastic":
        if (rng is None) == (random_bits is None):
            raise ValueError("stochastic rounding needs exactly one of rng= (a torch.Generator) "
                             "or random_bits= (integers in [0, 2^32), one per element)")
        if random_bits is None:
            if not isinstance(rng, torch.Generator):
                raise TypeError(f"rng must be a torch.Generator, got {type(rng).__name__}")
            words = draw_random_words(tuple(x.shape), rng, device=x.device)
        else:
            if random_bits.shape != x.shape or random_bits.dtype.is_floating_point:
                raise ValueError(f"random_bits must be integers of shape {tuple(x.shape)}, "
                                 f"got {random_bits.dtype} {tuple(random_bits.shape)}")
            words = random_bits.to(device=x.device, dtype=torch.int64)
        r = _stochastic(source, fmt, words)
        over = (r.abs() > fmt.max) | torch.isinf(source)
    elif rounding == "nearest_even":
        r = _nearest_native(x32, fmt).to(torch.float64)
        if overflow == native:
            over = torch.zeros_like(torch.isinf(r))  # leave torch's own overflow result visible
        else:
            bound, tie_overflows = _overflow_boundary(fmt, "nearest_even")
            magnitude = source.abs().to(torch.float64)
            over = (magnitude > bound) | ((magnitude == bound) & tie_overflows)
    else:  # toward_zero: the native nearest, then one step back where it rounded away
        magnitude = source.abs().to(torch.float64)
        r = _nearest_native(x32, fmt).to(torch.float64)
        # Anything between max and the overflow boundary truncates to max; the cast's own
        # overflow result (inf, NaN or max, by version) must not be stepped from.
        r = torch.where(magnitude > fmt.max, torch.full_like(r, fmt.max).copysign(r), r)
        away = r.abs() > magnitude
        stepped = _step_toward_zero(r.to(torch.float32), fmt).to(torch.float64)
        r = torch.where(away, stepped, r)
        bound, _ = _overflow_boundary(fmt, "toward_zero")
        over = (magnitude >= bound) & ~torch.isnan(magnitude)
    replacement = {"inf": math.inf, "saturate": fmt.max, "nan": math.nan}[overflow]
    signed = torch.full_like(r, replacement).copysign(source.to(torch.float64))
    r = torch.where(over, signed, r)
    if not subnormals:
        r = torch.where(r.abs() < fmt.tiny, torch.zeros_like(r).copysign(r), r)
    return r.to(x.dtype)


def encode(x: torch.Tensor, fmt: str | TorchFormat, **kwargs: object) -> torch.Tensor:
    """Round like `quantize` and return the codes (torch.uint8/uint16/uint32, x's shape)."""
    fmt = get_format(fmt)
    values = quantize(x, fmt, **kwargs).to(torch.float32)  # members: this cast is exact
    if fmt.dtype is None:
        word = values.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        return (word >> _TF32_DROP).to(torch.uint32)
    return values.to(fmt.dtype).view(fmt.code_dtype)


def decode(codes: torch.Tensor, fmt: str | TorchFormat,
           dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The exact value of each code, by reinterpreting the bits (`Tensor.view`)."""
    fmt = get_format(fmt)
    if not isinstance(codes, torch.Tensor) or codes.dtype.is_floating_point:
        raise TypeError("decode expects an integer tensor of codes")
    if fmt.dtype is None:
        word = codes.to(torch.int64) << _TF32_DROP
        word = torch.where(word >= 2**31, word - 2**32, word)  # two's complement int32
        return word.to(torch.int32).view(torch.float32).to(dtype)
    if codes.dtype != fmt.code_dtype:
        raise TypeError(f"{fmt.name} codes are {fmt.code_dtype}, got {codes.dtype}")
    return codes.view(fmt.dtype).to(dtype)
