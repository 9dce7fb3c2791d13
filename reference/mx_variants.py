"""The MX variants: where a library's MX quantization leaves the specification, as rules.

reference/mx.py states OCP Microscaling 1.0 (`variant="ocp"`, the default: section 5.3's
shared scale X = 2^(floor(log2 amax) - e_max) under "floor", section 6.3's conversion
P_i = quantize(V_i / X) with the stored X). Each library below differs somewhere; its
difference is a named variant of the same functions (`to_mx(..., variant=...)`), in both
trees, and these are the rules, each read from the library's source at the commit named
(docs/sources/block_scaling.md has the notes). A variant that implies a scale mode or a
rounding sets it when the caller passes None, and refuses another (common/mx_ranges.py).

torchao (0.18.0, torchao/prototype/mx_formats/mx_tensor.py, tag v0.18.0 = 5f2baf9):
every mode; the same codes but for inf, other divisors (NOTE [ torchao's variant ]
below):
    floor, ceil, even   q_i = x_i / max(X, 2^-126); a block holding +-inf takes the code of
                        inf's exponent field (247 for e4m3)
    rceil, rceil_log2f  q_i = x_i R, R = 2^(127 - code), but 1 at code 0, 2^-127 at 254

microxcaling (v1.1.0 = 7bc4195, mx/mx_ops.py `_shared_exponents` and `_quantize_mx`,
mx/elemwise_ops.py `_quantize_elemwise_core` and `_round_mantissa`): the library's default
path (`custom_cuda=False`), in float32 torch ops. Mode floor only, ties away:
    e = floor(torch.log2(amax + 2^-126 [amax == 0])) - e_max      float32 log2
    code = 255 if e is NaN or e > 127, else max(e, -127) + 127     (inf, NaN amax: 255)
    q_i = x_i / 2^(code - 127);  k = sign(q) floor(f32(|q| 2^(m - t) + 1/2)),
    t = max(floor(log2 |q|), t_min);  P_i = clamp(k 2^(t - m), +-max_elem)
It departs from the specification three ways. (1) torch.log2 rounds to the integer k for
amax a few ulps below 2^k (float32's log2 of 2^k (1 - d) is k - d / ln 2, which rounds to k
once d / ln 2 is below half an ulp of k: 1 ulp of amax at k = 3..4, 44 at k = 126), so e
comes out one too high: FLT_MAX quantizes to inf (e = 120, FLT_MAX / 2^120 rounds to 256
in e4m3, and 256 2^120 overflows), a block max of 2^20 (1 - 2^-24) under fp4 to 2^20 (not
6 2^17). The reference computes that log2 as float64's log2 rounded once to float32 (the
correctly rounded float32 log2), equal to torch.log2's on CPU at every input measured
(claim mx.rceil_log2f, which holds the floor as well as the ceiling); CUDA's log2f was not
measured, so this variant states the library on CPU. (2) torch.sign(-0.0) is +0: an element
-0 becomes +0 (a negative value that rounds to zero stays -0). (3) |q| 2^(m - t) + 1/2 is
a float32 addition: a scaled value just below half the smallest subnormal step (fp4:
0.25 - 2^-26) sums to a tie at 1 and rounds up, to that step. t itself is exact here: a
log2 one too high moves |q| to the binade above, where it rounds to the same member.

microxcaling_cpp (the same commit, mx/cpp/shared_exp.cuh, quantize.cuh, common.cuh; used
when mx_specs['custom_cuda'] is set, on CPU and CUDA): the shared exponent from amax's
exponent field (get_biased_exponent), clamped to -127 .. 127, NaN for inf or NaN: the
specification's scale exactly, `input / scale` exact; the elements rounded on the
mantissa bits, rd_away (ties away), saturated. It departs from the specification in the
sign of zero only: quantize_elemwise returns 0.0f for a zero input and for a result that
rounds to zero, so every zero element is +0.

transformer_engine (NVIDIA/TransformerEngine d0067d0, 2.20.0.dev0: transformer_engine/
common/cast/mxfp8/quantize_mxfp8.cuh, util/ptx.cuh `exp2f_rcp`, util/ptx_arch_spec.cuh
`float_to_e8m0`, utils.cuh `Quantized_Limits`): MXFP8 (e4m3, e5m2), mode rceil, nearest even:
    amax = fmaxf over |x_i|            a NaN element is dropped (fmaxf returns the number)
    d = f32(amax * f32(1 / max_elem))  max_norm_rcp, a float32 constant, not a division
    code = float_to_e8m0(d)            cvt.rp.satfinite.ue8m0 or its software twin: the
                                       exact rceil of d, 254 for inf, 255 for NaN
    R = exp2f_rcp(code)                2^(127 - code); 2^-127 at 254, NaN at 255
    P_i = fp8(f32(x_i R))              static_cast with __NV_SATFINITE: clamp, NaN kept
so a block holding a NaN keeps its other values (its scale from the rest) where the
specification makes it NaN. At code 0, R = 2^127 (254 << 23): the specification's 1 / X.
TE wrote R = 1 at code 0 (and 0 at 254) until commit 71971e33d ("Fix exp2f_rcp to properly
handle nan and 0xFE cases", first released in v2.13); torchao 0.18 copied that older rule
(its rceil variant, above). f32(1 / 448) is 0.75 ulp above 1/448, and its product was
measured to give the same code as the division at every amax (the edge test's sweep).

NOTE [ torchao's variant ]: torchao 0.18's to_mx divides floor/ceil/even blocks by the
stored scale raised to at least 2^-126 (float32's smallest normal; its comment cites Triton's
subnormals), so a block whose code is 0 (scale 2^-127) is divided by 2^-126 and decodes at
half its value. Its rceil follows TransformerEngine: R = 1 at code 0, so such a block's
elements are its raw values, all of which round to 0. It reads a block's scale off amax's
exponent field with no case for inf (field 255). Until this project stated the
specification first, these were the reference's defaults; `variant="torchao"` keeps them,
held bit for bit to torchao (claim mx.torchao), and docs/mx.md counts where the two differ.

NOTE [ rceil in float32 ]: cuBLAS rounds d up to a power of two exactly (cvt.rp.satfinite
.ue8m0x2.f32). torchao's eager path computes ceil(torch.log2(d)) in float32, and log2 of a
d a few ulps above 2^j rounds to exactly j (j + f/ln 2 is below half an ulp of j): the
scale is then 2^j, the block's scaled amax lands just above max_elem, and the block clips.
"rceil_log2f" is that rule, with the log2 correctly rounded to float32 (float64's log2,
rounded once: equal to torch.log2's on CPU at every d tested, claim mx.rceil_log2f).

NOTE [ Variants written apart ]: each rule here is held to its library computed apart in
parity/test_mx_variants.py (claims mx.microxcaling, mx.microxcaling_cpp,
mx.transformer_engine): microxcaling's Python path transcribed in torch ops as the library
calls them, its C++ path's mantissa shifts transcribed on the float32 bits, TE's kernel in
Python scalars with ml_dtypes casts.
"""

from __future__ import annotations

import numpy as np

from common.format_spec import FORMATS
from reference import formats

_E8M0_BIAS = 127
_F32_TINY = np.float32(float.fromhex("0x1p-126"))  # float32's smallest normal


def block_amax(a: np.ndarray, variant: str) -> np.ndarray:
    """max_i |x_i| of each block (..., n, k) -> (..., n): NaN if the block holds one, but
    Transformer Engine's fmaxf, which drops a NaN (the max of none is 0)."""
    if variant == "transformer_engine":
        return np.max(np.where(np.isnan(a), np.float32(0), np.abs(a)), axis=-1)
    return np.max(np.abs(a), axis=-1)


def log2_floor_f32(amax: np.ndarray) -> np.ndarray:
    """microxcaling's floor(torch.log2(amax + 2^-126 [amax == 0])), its log2 in float32
    (float64's, rounded once); float64 (..., n), NaN and inf kept."""
    a = np.where(amax == 0, _F32_TINY, amax).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.floor(np.log2(a).astype(np.float32).astype(np.float64))


def te_quotient(amax: np.ndarray, fmt: str) -> np.ndarray:
    """Transformer Engine's d = f32(amax * max_norm_rcp), max_norm_rcp = f32(1 / max_elem)."""
    rcp = np.float32(1 / FORMATS[fmt].max)
    with np.errstate(over="ignore", invalid="ignore"):
        return (amax.astype(np.float32) * rcp).astype(np.float32)


def te_multiplier(code: np.ndarray) -> np.ndarray:
    """Transformer Engine's exp2f_rcp(code): 2^(127 - code) as a float32, 2^-127 at 254
    (0x00400000), NaN at 255."""
    c = code.astype(np.int64)
    word = np.where(c == 254, 0x00400000, np.clip(254 - c, 0, 254) << 23)
    r = word.astype(np.uint32).view(np.float32)
    return np.where(c == 255, np.float32(np.nan), r)


def torchao_scaled(a: np.ndarray, code: np.ndarray, mode: str) -> np.ndarray:
    """torchao 0.18's q (..., n, k): x divided by max(X, 2^-126) under floor/ceil/even (the
    code's float32 word: 255 << 23 is +inf), times R under rceil (1 at code 0)."""
    c = code.astype(np.int32)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        if mode in ("rceil", "rceil_log2f"):
            r = np.ldexp(np.float32(1), _E8M0_BIAS - c).astype(np.float32)
            r = np.where(c == 0, np.float32(1), r)
            r = np.where(c == 254, np.float32(float.fromhex("0x1p-127")), r)
            r = np.where(c == 255, np.float32(np.nan), r)
            return (a * r[..., None]).astype(np.float32)
        divisor = np.maximum((c.astype(np.uint32) << 23).view(np.float32), _F32_TINY)
        return (a / divisor[..., None]).astype(np.float32)


def round_microxcaling(q: np.ndarray, fmt: str) -> np.ndarray:
    """microxcaling's Python path on float32 q (|q| <= max_elem or NaN): the element codes
    of sign(q) floor(f32(|q| 2^(m - t) + 1/2)) 2^(t - m), torch.sign's +0 for a zero."""
    spec = formats.FORMATS[fmt]
    a = np.abs(q.astype(np.float32))
    _, e = np.frexp(np.where(np.isnan(a) | (a == 0), 1, a))  # |q| = f 2^e, 1/2 <= f < 1
    t = np.maximum(e - 1, spec.min_exponent)  # the binade, subnormals at min_exponent
    out = np.ldexp(a, spec.mantissa_bits - t).astype(np.float32)  # exact: a power of two
    k = np.floor(out + np.float32(0.5))  # a float32 sum, rounded: the 0.5 - 2^-25 trap
    value = np.ldexp(k.astype(np.float64), t - spec.mantissa_bits)
    sign = np.where(q > 0, 1.0, np.where(q < 0, -1.0, 0.0))  # torch.sign: 0 for +-0
    value = np.where(np.isnan(q), q.astype(np.float64), np.where(sign == 0, 0.0, sign * value))
    return formats.encode(value, fmt)  # every value a member: encoded exactly


def unsigned_zeros(codes: np.ndarray, fmt: str) -> np.ndarray:
    """microxcaling's C++ path: every zero element is +0 (quantize_elemwise returns 0.0f)."""
    sign = np.uint8(1 << (FORMATS[fmt].bits - 1))
    return np.where(codes == sign, np.uint8(0), codes).astype(np.uint8)
