"""Per-tensor fp8 scaling: current (dynamic) scaling as torchao computes it, and delayed
scaling with an amax history as Transformer Engine's DelayedScaling recipe updates it.

An fp8 format holds few binades (float8_e4m3fn: max 448, smallest normal 2^-6; float8_e5m2:
max 57344, 2^-14), so a tensor is stored as q = fp8(clamp(x * s, -max, max)) with a float32
scale s that brings its largest magnitude (its amax) to max, and read back as q / s. The
recipes differ in which amax picks s: current scaling measures this tensor's amax now (one
extra pass over it), delayed scaling uses the amaxes of earlier steps (an amax history) and
records this step's for the next.

Current scaling, torchao 0.18 (float8_utils.tensor_to_amax, amax_to_scale, to_fp8_saturated;
float8_training_tensor._ToFloat8ConstrFunc), as scalar code (executable: tests/
test_fp8_scaling_reference.py compiles this text and holds the code to it, bit for bit).
`f32(v)` rounds a Python float to float32, `fp8(v)` to the format, nearest even; the division
is in float64 (torchao: "upcast to float64 to ensure same numeric between compile and eager"),
then rounded to float32:

    def current_scale(amax, fp8_max, power_of_2):
        scale = f32(fp8_max / max(amax, AMAX_EPS))
        if power_of_2 and scale > 0 and math.isfinite(scale):
            mantissa, exponent = math.frexp(scale)    # scale = mantissa * 2^exponent, [0.5, 1)
            scale = math.ldexp(0.5, exponent)         # 2^floor(log2(scale)): rounded down
        return scale

    def current_cast(x, scale, fp8_max):
        return fp8(min(max(f32(x * scale), -fp8_max), fp8_max))

Tensorwise, amax = max |x| over the tensor; rowwise (torchao's AXISWISE), one amax and one
scale per slice along `axis` (kept as a size-1 dimension, so the scale broadcasts). A NaN
anywhere makes amax NaN, the scale NaN and every element NaN; an infinite amax makes the
scale 0 (and inf * 0 NaN). The clamp makes the cast's own overflow policy irrelevant: NOTE
[ float8_e4m3fn overflow ] in reference/formats.py (torch >= 2.13 saturates, older torch
and ml_dtypes give NaN) never comes into play. Power-of-2 rounding here is exact, as TE's
kernel does it (recipe_common.cuh: scale_bits & 0xFF800000); torchao 0.18's
exp2(floor(log2(scale))) in float32 rounds UP where float32 log2 rounds to the next
integer (NOTE [ Power-of-2 scales ]).

Delayed scaling, TE's fused update (transformer_engine/common/recipe/delayed_scaling.cu,
kernel_bulk, what te.pytorch runs after the amax reduction), per scale, with `history` the
amax history (slot 0: this step's amax, recorded by the casts), as scalar code:

    def delayed_update(history, scale, fp8_max, margin, algo):
        last = history[0]
        amax = 0.0
        if last != 0:                 # no new amax: TE's kernel rolls nothing
            rolled = history[1:] + [last]
            for a in rolled:
                amax = fmax(amax, a)  # fmaxf: a NaN loses to any number
            history = [0.0] + rolled[1:]
        if algo == "most_recent":
            amax = last
        scaled_max = f32(fp8_max * 2.0 ** -margin)
        if math.isfinite(amax) and amax > 0:
            scale = f32(scaled_max / amax)
        if math.isinf(scale):
            scale = FLT_MAX
        return history, scale

So an infinite amax, once recorded, keeps the scale where it was for as long as it is in the
history (amax_history_len updates under "max", one under "most_recent"); a NaN is skipped
by "max" and holds the scale one update under "most_recent". TE's unfused Python update
(NVTE_UNFUSED_FP8_UPDATE=1, or a callable algo; transformer_engine/pytorch/quantization.py,
_default_sf_compute) and TE's docstring instead compute (fp8_max / amax) / 2^margin:
`order="python"` (NOTE [ The margin's two orders ]).
"""

from __future__ import annotations

import numpy as np
from ml_dtypes import float8_e4m3fn, float8_e5m2

from common.arg_ranges import check_flag
from common.fp8_recipes import AMAX_EPS, check_delayed_args, check_fp8_format, check_order
from reference.formats import encode, get_format

FLT_MAX = np.float32(np.finfo(np.float32).max)  # 0x1.fffffep127
_NP_FP8 = {"float8_e4m3fn": float8_e4m3fn, "float8_e5m2": float8_e5m2}
_EXPONENT_BITS = np.uint32(0xFF800000)  # sign and exponent of a float32

# NOTE [ Power-of-2 scales ]
# A power-of-2 scale makes x * s and q / s exact (no rounding but the cast's). Rounded DOWN
# (the largest 2^k <= s) it keeps amax * s <= max, so nothing saturates. For a positive
# normal float32 s = 1.f * 2^k that is s with its fraction bits cleared: bits & 0xFF800000
# (TE's compute_scale_from_amax; a subnormal keeps its highest fraction bit, where TE's mask
# would give 0, but no scale here is subnormal: s >= fp8_max / FLT_MAX), math.frexp in the
# pseudocode, torch.frexp in the twin.
# torchao 0.18 writes torch.exp2(torch.floor(torch.log2(s))): float32 log2(s) for s just
# below 2^(k+1) is k + 1 - d with d below half of float32's spacing at k + 1, so it rounds
# to the integer k + 1, floor keeps it, and the scale becomes 2^(k+1) > s: rounded UP, and
# amax * s can exceed max (then clamped). How often: claim fp8_scaling.torchao_pow2.


def tensor_amax(x: np.ndarray, axis: int | None = None) -> np.ndarray:
    """max |x| in x's dtype: over the whole tensor (0-d), or along `axis` with that dimension
    kept at size 1 (rowwise: axis=-1 gives one amax per row). NaN propagates."""
    a = _check_array(x, "tensor_amax")
    if axis is not None and not -a.ndim <= axis < a.ndim:
        raise ValueError(f"tensor_amax: axis {axis} out of range for {a.ndim} dimensions")
    if a.size == 0:
        raise ValueError("tensor_amax: an empty tensor (or slice) has no amax")
    if axis is None:
        return np.max(np.abs(a))
    return np.max(np.abs(a), axis=axis, keepdims=True)


def round_down_to_power_of_2(scale: np.ndarray) -> np.ndarray:
    """2^floor(log2(s)) for each positive finite float32 s, exactly; 0, inf and NaN as they
    are (NOTE [ Power-of-2 scales ])."""
    s = np.asarray(scale, dtype=np.float32)
    bits = s.view(np.uint32)
    down = bits & _EXPONENT_BITS  # a normal: its fraction cleared
    # a subnormal (exponent field 0) is F * 2^-149: keep F's highest set bit
    top = np.frexp(bits.astype(np.float64))[1] - 1  # floor(log2(F)), exact: F < 2^23
    highest = np.left_shift(np.uint32(1), np.maximum(top, 0).astype(np.uint32))
    down = np.where(bits < 0x00800000, highest, down)
    return np.where(np.isfinite(s) & (s > 0), down.view(np.float32), s)


def amax_to_scale(amax: np.ndarray, fmt: str, power_of_2: bool = False) -> np.ndarray:
    """The float32 scale f32(fp8_max / max(f64(amax), 1e-12)), rounded down to a power of 2
    when `power_of_2` (torchao's round_scales_to_power_of_2, done exactly)."""
    fp8_max = get_format(check_fp8_format(fmt, "amax_to_scale")).max
    check_flag("amax_to_scale", "power_of_2", power_of_2)
    a64 = np.asarray(amax).astype(np.float64)
    with np.errstate(invalid="ignore"):  # NaN amax: a NaN scale
        scale = (fp8_max / np.maximum(a64, AMAX_EPS)).astype(np.float32)
    return round_down_to_power_of_2(scale) if power_of_2 else scale


def cast_to_fp8(x: np.ndarray, scale: np.ndarray, fmt: str) -> np.ndarray:
    """fp8(clamp(f32(x) * scale, -max, max)), nearest even, as an ml_dtypes fp8 array."""
    fp8 = get_format(check_fp8_format(fmt, "cast_to_fp8"))
    a = _check_array(x, "cast_to_fp8").astype(np.float32)
    # inf * 0 (an infinite amax's zero scale) is NaN; a product beyond FLT_MAX is inf, and
    # either way the clamp below decides
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = a * np.asarray(scale, dtype=np.float32)
    clamped = np.clip(scaled, np.float32(-fp8.max), np.float32(fp8.max))
    codes = encode(clamped, fp8)  # nearest even; nothing left beyond max to overflow
    return codes.astype(np.uint8).view(_NP_FP8[fmt])


def current_scaling(x: np.ndarray, fmt: str, axis: int | None = None,
                    power_of_2: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(fp8 data, float32 scale) of x, current scaling: torchao's hp_tensor_to_float8_dynamic
    (tensorwise when axis is None, else rowwise along `axis`). x is data / scale."""
    scale = amax_to_scale(tensor_amax(x, axis), fmt, power_of_2)
    return cast_to_fp8(x, scale, fmt), scale


def delayed_scale(amax: np.ndarray, scale: np.ndarray, fmt: str, margin: int = 0,
                  order: str = "kernel") -> np.ndarray:
    """The new float32 scale from the chosen amax: scaled_max / amax where amax is finite
    and > 0, else the previous `scale`; an infinite result is FLT_MAX. order "kernel":
    scaled_max = f32(fp8_max * 2^-margin) (TE's CUDA kernel); "python": (fp8_max / amax) /
    2^margin (TE's unfused update and docstring; NOTE [ The margin's two orders ])."""
    check_delayed_args(margin, "max", "delayed_scale")
    check_order(order, "delayed_scale")
    fp8_max = np.float32(get_format(check_fp8_format(fmt, "delayed_scale")).max)
    a = np.asarray(amax, dtype=np.float32)
    previous = np.asarray(scale, dtype=np.float32)
    power = np.float32(2.0**-margin)  # exact: margin in [-100, 100]
    with np.errstate(divide="ignore", over="ignore", invalid="ignore", under="ignore"):
        if order == "kernel":
            new = (fp8_max * power) / a
        else:
            new = (fp8_max / a) * power  # exact as a division by 2^margin: one rounding
    new = np.where(np.isfinite(a) & (a > 0), new, previous)
    return np.where(np.isinf(new), FLT_MAX, new).astype(np.float32)


# NOTE [ The margin's two orders ]
# kernel: f32(f32(fp8_max * 2^-m) / amax); python: f32(f32(fp8_max / amax) * 2^-m). For an
# integer m in [-100, 100] the scaled max is exact, and so is the product by 2^-m while the
# result is a normal float32, so both are the correctly rounded fp8_max 2^-m / amax and agree.
# They part where the python order's first quotient overflows (amax < fp8_max / FLT_MAX: the
# python order gives FLT_MAX, the kernel a finite fp8_max 2^-m / amax for m > 0) or where its
# product falls below 2^-126 and rounds a second time (large m and amax). Measured: claim
# fp8_scaling.margin_order.


def delayed_update(history: np.ndarray, scale: np.ndarray, fmt: str, margin: int = 0,
                   algo: str = "max", order: str = "kernel") -> tuple[np.ndarray, np.ndarray]:
    """(new history, new scale) after one update of TE's delayed scaling (the docstring's
    delayed_update, vectorized over scales). history: float32 (L,) or (L, n), slot 0 this
    step's amax; scale: float32 () or (n,). Neither input is modified. `order` picks the
    scale's formula only (delayed_scale); the roll, its skip on a zero slot 0 and the fmax
    fold are the fused kernel's in either order (TE's unfused update rolls always and takes
    torch.max, which propagates NaN: docs/fp8.md)."""
    check_delayed_args(margin, algo, "delayed_update")
    h = np.asarray(history, dtype=np.float32)
    s = np.asarray(scale, dtype=np.float32)
    if h.ndim not in (1, 2) or h.shape[0] < 1 or s.shape != h.shape[1:]:
        raise ValueError(f"delayed_update: history must be (L,) or (L, n) with L >= 1 and "
                         f"scale of shape (n,) or (); got {h.shape} and {s.shape}")
    last = h[0]
    rolled = np.concatenate([h[1:], last[None]])  # rolled[i] = h[i + 1], rolled[L-1] = h[0]
    rolls = last != 0  # NaN != 0: a NaN is recorded and rolled like a number
    amax = np.fmax.reduce(np.concatenate([np.zeros_like(last)[None], rolled]), axis=0)
    amax = np.where(rolls, amax, np.float32(0))
    new_history = np.where(rolls, np.concatenate([np.zeros_like(last)[None], rolled[1:]]), h)
    if algo == "most_recent":
        amax = last
    return new_history, delayed_scale(amax, s, fmt, margin, order)


def record_amax(history: np.ndarray, amax: np.ndarray) -> np.ndarray:
    """The history with this step's amax in slot 0 (which the last update zeroed): the max
    of what the slot holds and `amax`, NaN propagating, as each cast of the step records."""
    h = np.array(history, dtype=np.float32)
    h[0] = np.maximum(h[0], np.asarray(amax, dtype=np.float32))
    return h


def _check_array(x: object, where: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind != "f" and a.dtype.name not in ("bfloat16",):
        raise TypeError(f"{where}: expects a floating-point array, got dtype {a.dtype}")
    return a
