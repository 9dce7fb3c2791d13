"""The MX variants with torch ops. See reference/mx_variants.py for each library's rule and
its source; the same names, in the same order. What differs here: microxcaling's log2 is
torch.log2 in float32 itself, as the library calls it (the reference rounds float64's log2
once to float32: the same on CPU, claim mx.rceil_log2f; CUDA's log2f was not measured).
"""

from __future__ import annotations

import torch

from common.format_spec import FORMATS

_E8M0_BIAS = 127
_F32_TINY = 2.0**-126  # float32's smallest normal


def block_amax(a: torch.Tensor, variant: str) -> torch.Tensor:
    """max_i |x_i| of each block (..., n, k) -> (..., n): NaN if the block holds one, but
    Transformer Engine's fmaxf, which drops a NaN (the max of none is 0)."""
    if variant == "transformer_engine":
        return torch.where(torch.isnan(a), torch.zeros_like(a), a.abs()).amax(dim=-1)
    return a.abs().amax(dim=-1)


def log2_floor_f32(amax: torch.Tensor) -> torch.Tensor:
    """microxcaling's floor(torch.log2(amax + 2^-126 [amax == 0])), word for word: float32."""
    return torch.floor(torch.log2(amax + _F32_TINY * (amax == 0).to(amax.dtype)))


def te_quotient(amax: torch.Tensor, fmt: str) -> torch.Tensor:
    """Transformer Engine's d = f32(amax * max_norm_rcp), max_norm_rcp = f32(1 / max_elem)."""
    rcp = torch.tensor(1 / FORMATS[fmt].max, dtype=torch.float32, device=amax.device)
    return amax.to(torch.float32) * rcp


def te_multiplier(code: torch.Tensor) -> torch.Tensor:
    """Transformer Engine's exp2f_rcp(code): 2^(127 - code) as a float32, 2^-127 at 254
    (0x00400000), NaN at 255."""
    c = code.to(torch.int32)
    word = torch.where(c == 254, torch.full_like(c, 0x00400000),
                       torch.bitwise_left_shift((254 - c).clamp(0, 254), 23))
    r = word.view(torch.float32)
    return torch.where(c == 255, torch.full_like(r, float("nan")), r)


def torchao_scaled(a: torch.Tensor, code: torch.Tensor, mode: str) -> torch.Tensor:
    """torchao 0.18's q (..., n, k): x divided by max(X, 2^-126) under floor/ceil/even (the
    code's float32 word: 255 << 23 is +inf), times R under rceil (1 at code 0)."""
    c = code.to(torch.int32)
    if mode in ("rceil", "rceil_log2f"):
        r = torch.exp2((_E8M0_BIAS - c).to(torch.float32))
        r = torch.where(c == 0, torch.ones_like(r), r)
        r = torch.where(c == 254, torch.full_like(r, 2.0**-127), r)
        r = torch.where(c == 255, torch.full_like(r, float("nan")), r)
        return a * r.unsqueeze(-1)
    divisor = torch.bitwise_left_shift(c, 23).view(torch.float32).clamp(min=_F32_TINY)
    return a / divisor.unsqueeze(-1)


def round_microxcaling(q: torch.Tensor, fmt: str) -> torch.Tensor:
    """microxcaling's Python path on float32 q (|q| <= max_elem or NaN): the element codes
    of sign(q) floor(f32(|q| 2^(m - t) + 1/2)) 2^(t - m), torch.sign's +0 for a zero."""
    spec = FORMATS[fmt]
    a = q.to(torch.float32).abs()
    _, e = torch.frexp(torch.where(torch.isnan(a) | (a == 0), torch.ones_like(a), a))
    t = (e - 1).clamp(min=spec.min_exponent)  # the binade, subnormals at min_exponent
    out = torch.ldexp(a, (spec.mantissa_bits - t).to(torch.float32))  # exact
    k = torch.floor(out + 0.5)  # a float32 sum, rounded: the 0.5 - 2^-25 trap
    magnitude = ((t.to(torch.int64) - spec.min_exponent) << spec.mantissa_bits) \
        + k.to(torch.int64)  # W: a carry out of k lands on the next binade by itself
    magnitude = torch.where(k == 0, torch.zeros_like(magnitude), magnitude)
    sign = (q < 0).to(torch.int64)  # torch.sign(+-0) is 0: a zero element is +0
    if spec.nan_code is None:  # fp6/fp4: NaN -> the zero of the opposite sign
        nan = torch.isnan(q)
        magnitude = torch.where(nan, torch.zeros_like(magnitude), magnitude)
        sign = torch.where(nan, 1 - torch.signbit(q).to(torch.int64), sign)
    else:
        nan = torch.isnan(q)
        magnitude = torch.where(nan, torch.full_like(magnitude, spec.nan_code), magnitude)
        sign = torch.where(nan, torch.signbit(q).to(torch.int64), sign)
    return ((sign << (spec.bits - 1)) | magnitude).to(torch.uint8)


def unsigned_zeros(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """microxcaling's C++ path: every zero element is +0 (quantize_elemwise returns 0.0f)."""
    sign = 1 << (FORMATS[fmt].bits - 1)
    return torch.where(codes == sign, torch.zeros_like(codes), codes)
