"""Format ranges as torch sees them: torch.finfo (see common/format_spec.py for the math).

torch.finfo has no `smallest_subnormal` (it is tiny * eps) and no exponent limits (read off
max and tiny with math.frexp). tf32 has no torch dtype at all: its range is float32's with a
10-bit mantissa (the bit widths are the one thing taken from the reference, as a plain spec).

The small formats (SMALL: the fnuz float8s, E8M0, float6/float4, float8_e4m3/e3m4) take every
range from their bit layout, the plain spec, for torch.finfo cannot give them: six have no
torch dtype (float4_e2m1fn_x2 is two packed codes a byte, with no cast), torch 2.13's
finfo(float8_e5m2fnuz).eps is 0.125 where 2 mantissa bits give 0.25 (claim
formats.torch_finfo_e5m2fnuz), and finfo(float8_e8m0fnu) knows no unsigned format (it reads
as 7 exponent bits). `dtype` is torch's where it has one (float8_e4m3fnuz, float8_e5m2fnuz,
float8_e8m0fnu), and the cast to it is used; parity/test_formats_small.py holds torch.finfo
to the spec where finfo is right.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from common.format_spec import EXTENDED, unknown_format
from common.format_spec import FORMATS as _SPECS  # bit widths only: a plain data spec

SMALL: tuple[str, ...] = tuple(f.name for f in EXTENDED)


@dataclass(frozen=True)
class TorchFormat:
    """A named format as torch sees it: its dtype (None for tf32 and the small formats torch
    lacks) and torch.finfo ranges (the bit layout's for the small formats)."""

    name: str
    dtype: torch.dtype | None
    code_dtype: torch.dtype  # the unsigned integer dtype of one code

    @property
    def small(self) -> bool:
        """Whether the ranges come from the bit layout (a small format: SMALL above)."""
        return self.name in SMALL

    @property
    def convention(self) -> str:
        """ieee, fn (classic: what torch's cast makes of inf says), or the small format's."""
        if self.small:
            return _SPECS[self.name].convention
        return "ieee" if self.has_infinity else "fn"

    @property
    def bias(self) -> int:
        return _SPECS[self.name].bias if self.small else 1 - self.min_exponent

    @property
    def max_code(self) -> int:
        """The magnitude bits of `max` (small formats; the classic ones need no codes here)."""
        return _SPECS[self.name].max_code

    @property
    def nan_code(self) -> int | None:
        return _SPECS[self.name].nan_code

    @property
    def inf_code(self) -> int | None:
        return _SPECS[self.name].inf_code

    @property
    def _finfo(self) -> torch.finfo:
        return torch.finfo(self.dtype if self.dtype is not None else torch.float32)

    @property
    def has_infinity(self) -> bool:
        """Whether +-inf is a value of the format: what torch's cast makes of inf says."""
        if self.small:
            return _SPECS[self.name].inf_code is not None
        if self.dtype is None:
            return True
        return bool(torch.tensor(math.inf).to(self.dtype).to(torch.float32).isinf())

    @property
    def mantissa_bits(self) -> int:
        if self.small:
            return _SPECS[self.name].mantissa_bits
        if self.dtype is None:
            return _SPECS[self.name].mantissa_bits
        return -math.frexp(self._finfo.eps)[1] + 1  # eps = 2^-m

    @property
    def bits(self) -> int:
        if self.small:
            return _SPECS[self.name].bits
        if self.dtype is None:
            return _SPECS[self.name].bits
        return self._finfo.bits

    @property
    def exponent_bits(self) -> int:
        if self.small:
            return _SPECS[self.name].exponent_bits
        return self.bits - 1 - self.mantissa_bits

    @property
    def eps(self) -> float:
        if self.small:
            return _SPECS[self.name].eps
        return 2.0 ** -self.mantissa_bits if self.dtype is None else self._finfo.eps

    @property
    def unit_roundoff(self) -> float:
        return self.eps / 2

    @property
    def max(self) -> float:
        if self.small:
            return _SPECS[self.name].max
        if self.dtype is None:  # float32's largest binade with m mantissa bits
            top = math.frexp(self._finfo.max)[1] - 1
            return (2.0 - self.eps) * 2.0**top
        return self._finfo.max

    @property
    def tiny(self) -> float:
        if self.small:
            return _SPECS[self.name].tiny
        return self._finfo.tiny

    @property
    def smallest_subnormal(self) -> float:
        if self.small:
            return _SPECS[self.name].smallest_subnormal
        return self.tiny * self.eps  # torch.finfo lacks it

    @property
    def max_exponent(self) -> int:
        if self.small:
            return _SPECS[self.name].max_exponent
        return math.frexp(self.max)[1]  # max = f * 2^e, 0.5 <= f < 1: 2^e is not finite

    @property
    def min_exponent(self) -> int:
        if self.small:
            return _SPECS[self.name].min_exponent
        return math.frexp(self.tiny)[1] - 1


FORMATS: dict[str, TorchFormat] = {
    "float32": TorchFormat("float32", torch.float32, torch.uint32),
    "tf32": TorchFormat("tf32", None, torch.uint32),
    "float16": TorchFormat("float16", torch.float16, torch.uint16),
    "bfloat16": TorchFormat("bfloat16", torch.bfloat16, torch.uint16),
    "float8_e5m2": TorchFormat("float8_e5m2", torch.float8_e5m2, torch.uint8),
    "float8_e4m3fn": TorchFormat("float8_e4m3fn", torch.float8_e4m3fn, torch.uint8),
    **{name: TorchFormat(name, getattr(torch, name, None), torch.uint8) for name in SMALL},
}


def get_format(fmt: str | TorchFormat) -> TorchFormat:
    """A TorchFormat from itself or its name (only named formats have torch twins)."""
    if isinstance(fmt, TorchFormat):
        return fmt
    if isinstance(fmt, str) and fmt in FORMATS:
        return FORMATS[fmt]
    raise unknown_format(fmt)  # generic formats exist only in reference.formats


# torch's dtype by name: every format torch stores natively, and float64 (the oracle's
# precision). One map for torch_impl and the proof; the reference's arrays are NumPy's.
DTYPES: dict[str, torch.dtype] = {
    **{name: f.dtype for name, f in FORMATS.items() if f.dtype is not None},
    "float64": torch.float64}
