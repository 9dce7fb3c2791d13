"""fp8 scaling in both trees, and in the libraries that are the oracles: each function runs
reference.fp8_scaling and torch_impl.fp8_scaling (or torchao) on one input and returns NumPy
arrays (fp8 data as ml_dtypes arrays, scales float32) for parity/compare.py."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from common.fp8_recipes import AMAX_EPS
from parity.compare import as_numpy
from reference import fp8_scaling as rfp8
from reference.formats import get_format


def _torch() -> Any:
    import torch

    return torch


def current(x: np.ndarray, fmt: str, axis: int | None, power_of_2: bool, device: str = "cpu"
            ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((data, scale) of the reference, (data, scale) of the torch tree) for current scaling."""
    from torch_impl import fp8_scaling as tfp8

    ref = rfp8.current_scaling(x, fmt, axis, power_of_2)
    data, scale = tfp8.current_scaling(_torch().from_numpy(x).to(device), fmt, axis, power_of_2)
    return ref, (as_numpy(data), as_numpy(scale))


def delayed_run(history: np.ndarray, scale: np.ndarray, amaxes: np.ndarray, fmt: str,
                margin: int, algo: str, order: str = "kernel", tree: str = "reference",
                device: str = "cpu") -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(histories, scales) after each of len(amaxes) steps of delayed scaling in one tree, a
    step as TE runs it: the casts record the step's amax in slot 0 (record_amax), then the
    update rolls the history and picks the scale the next step casts with."""
    if tree == "reference":
        update, record, h, s = rfp8.delayed_update, rfp8.record_amax, history, scale
        back = np.asarray
    else:
        from torch_impl import fp8_scaling as tfp8

        torch = _torch()
        update, record = tfp8.delayed_update, tfp8.record_amax
        h, s = torch.from_numpy(history).to(device), torch.from_numpy(scale).to(device)
        amaxes = torch.from_numpy(amaxes).to(device)
        back = as_numpy
    histories, scales = [], []
    for amax in amaxes:
        h = record(h, amax)
        h, s = update(h, s, fmt, margin, algo, order)
        histories.append(np.array(back(h)))
        scales.append(np.array(back(s)))
    return histories, scales


def torchao_current(x: np.ndarray, fmt: str, axis: int | None, power_of_2: bool
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(data, scale) of torchao's hp_tensor_to_float8_dynamic (tensorwise, or AXISWISE along
    axis), the oracle of current scaling."""
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

    from torch_impl.format_spec import DTYPES

    granularity = (ScalingGranularity.TENSORWISE if axis is None
                   else ScalingGranularity.AXISWISE)
    t = hp_tensor_to_float8_dynamic(_torch().from_numpy(x), DTYPES[fmt], LinearMMConfig(),
                                    scaling_granularity=granularity, axiswise_dim=axis,
                                    round_scales_to_power_of_2=power_of_2)
    return as_numpy(t._data), as_numpy(t._scale)


def torchao_scale(amax: np.ndarray, fmt: str, power_of_2: bool) -> np.ndarray:
    """torchao's amax_to_scale on float32 amaxes."""
    from torchao.float8.float8_utils import amax_to_scale

    from torch_impl.format_spec import DTYPES

    return as_numpy(amax_to_scale(_torch().from_numpy(amax), DTYPES[fmt], power_of_2))


POW2_TOP = 4096  # the float32 values just below each power of two that are swept


def pow2_binades(fmt: str) -> tuple[int, int]:
    """The binades [k_lo, k_hi] wholly inside the scales an amax gives: fp8_max / FLT_MAX
    (2^-119.2 for e4m3, 2^-112.2 for e5m2) to fp8_max / 1e-12 (2^48.7, 2^55.7)."""
    fp8_max = get_format(fmt).max
    flt_max = float(np.finfo(np.float32).max)
    return (math.ceil(math.log2(fp8_max / flt_max)),
            math.floor(math.log2(fp8_max / AMAX_EPS)) - 1)


def pow2_sweep_amaxes(fmt: str) -> np.ndarray:
    """float32 amaxes f32(fp8_max / s) for s the POW2_TOP largest float32 values of every
    binade of pow2_binades(fmt): amaxes whose scales sit just below a power of two, the only
    place a float32 log2 can round up to the next integer (NOTE [ Power-of-2 scales ]: a
    value 4096 ulps below 2^(k+1) has log2 at least 2^-12 below k + 1, and float32's spacing
    there is at most 2^-16)."""
    fp8_max = get_format(fmt).max
    lo, hi = pow2_binades(fmt)
    tops = np.array([np.float32(2.0 ** (k + 1)).view(np.uint32) for k in range(lo, hi + 1)],
                    dtype=np.uint32)
    bits = (tops[:, None] - np.arange(1, POW2_TOP + 1, dtype=np.uint32)[None, :]).reshape(-1)
    return (fp8_max / bits.view(np.float32).astype(np.float64)).astype(np.float32)


def log2_rounds_up(scale: np.ndarray) -> np.ndarray:
    """Where the correctly rounded float32 log2 of a positive finite float32 s is
    floor(log2 s) + 1 (so s is no power of two): log2 in float64 (its error far below
    float32's spacing) rounded to float32. The predicate torchao's rounding up is claimed
    to follow; False for 0, inf and NaN."""
    s = scale.astype(np.float64)
    ok = np.isfinite(s) & (s > 0)
    log2 = np.log2(np.where(ok, s, 1.0))
    return ok & (log2.astype(np.float32).astype(np.float64) == np.floor(log2) + 1)


def margin_scales(amax: np.ndarray, fmt: str, margin: int, tree: str = "reference",
                  device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """(kernel order, python order) new scales from float32 amaxes (previous scale 1)."""
    if tree == "reference":
        one = np.ones_like(amax)
        return (rfp8.delayed_scale(amax, one, fmt, margin, "kernel"),
                rfp8.delayed_scale(amax, one, fmt, margin, "python"))
    from torch_impl import fp8_scaling as tfp8

    a = _torch().from_numpy(amax).to(device)
    one = _torch().ones_like(a)
    return (as_numpy(tfp8.delayed_scale(a, one, fmt, margin, "kernel")),
            as_numpy(tfp8.delayed_scale(a, one, fmt, margin, "python")))


def float32_range(lo: float, hi: float) -> np.ndarray:
    """Every float32 in [lo, hi) (both positive float32 values)."""
    a, b = np.float32(lo).view(np.uint32), np.float32(hi).view(np.uint32)
    return np.arange(a, b, dtype=np.uint32).view(np.float32)


def saturation(fmt: str, device: str = "cpu") -> dict[str, Any]:
    """What the installed torch's raw cast does beyond max, and the recipe's cast (clamp, then
    cast) in the torch tree beside the reference's under every overflow policy the format
    can have, on products that overflow: the tie above max (464 for e4m3, 61440 for e5m2),
    max + ulp (480, 65536), -FLT_MAX * 4 (-inf in float32), +-inf; and one that does not."""
    from reference.formats import encode
    from torch_impl import fp8_scaling as tfp8
    from torch_impl.format_spec import DTYPES
    from torch_impl.formats import E4M3FN_SATURATES

    torch = _torch()
    fp8 = get_format(fmt)
    ulp = 2.0 ** (math.floor(math.log2(fp8.max)) - fp8.mantissa_bits)
    scale = np.float32(4.0)
    x = np.array([(fp8.max + ulp / 2) / 4, (fp8.max + ulp) / 4, -np.finfo(np.float32).max,
                  np.inf, -np.inf, 1.0], dtype=np.float32)
    with np.errstate(over="ignore"):
        scaled = x * scale
    raw = as_numpy(torch.from_numpy(scaled).to(device).to(DTYPES[fmt]))
    clamped = np.clip(scaled, np.float32(-fp8.max), np.float32(fp8.max))
    policies = ("saturate", "nan") if fmt == "float8_e4m3fn" else ("saturate", "inf", "nan")
    codes = {p: encode(clamped, fmt, overflow=p).astype(np.uint8).view(raw.dtype)
             for p in policies}
    recipe = as_numpy(tfp8.cast_to_fp8(torch.from_numpy(x).to(device),
                                       torch.tensor(scale).to(device), fmt))
    return {"torch": torch.__version__, "saturates": E4M3FN_SATURATES, "raw": raw,
            "recipe_torch": recipe, "recipe_reference": rfp8.cast_to_fp8(x, scale, fmt),
            "policies": codes, "scaled": scaled, "max": fp8.max}
