"""Per-tensor fp8 scaling with PyTorch's native API. See reference/fp8_scaling.py for the
math (both recipes as scalar pseudocode, NOTE [ Power-of-2 scales ], NOTE [ The margin's two
orders ]); same public names, same order. What PyTorch does differently or hides:

- The cast is `Tensor.to(torch.float8_e4m3fn / float8_e5m2)`, nearest even in C++
  (torch/headeronly/util/Float8_*.h). Its overflow policy depends on the torch version
  (NOTE [ float8_e4m3fn overflow ] in reference/formats.py); the clamp to +-max before it
  makes the recipes independent of that (claim fp8_scaling.saturation).
- The scale's float64 division is torchao's own line: `amax.to(torch.float64)`, a float64
  clamp and division, `.to(torch.float32)`.
- Power-of-2 rounding by torch.frexp / torch.ldexp (exact), not by the bit mask the
  reference uses and not by torchao's exp2(floor(log2(s))), which rounds up near a power of
  two (claim fp8_scaling.torchao_pow2).
- TE's delayed update runs in a CUDA kernel (delayed_scaling.cu); here it is torch ops:
  torch.fmax for fmaxf (a NaN loses to a number), torch.where for its branches.
Works on CPU and CUDA tensors alike.
"""

from __future__ import annotations

import torch

from common.arg_ranges import check_flag
from common.fp8_recipes import AMAX_EPS, check_delayed_args, check_fp8_format, check_order
from torch_impl.format_spec import DTYPES

FLT_MAX = torch.finfo(torch.float32).max  # 0x1.fffffep127


def _max(fmt: str, where: str) -> float:
    return torch.finfo(DTYPES[check_fp8_format(fmt, where)]).max


def tensor_amax(x: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """max |x| in x's dtype, over the tensor (0-d) or along `axis` kept at size 1."""
    x = _check_tensor(x, "tensor_amax")
    if axis is not None and not -x.ndim <= axis < x.ndim:
        raise ValueError(f"tensor_amax: axis {axis} out of range for {x.ndim} dimensions")
    if x.numel() == 0:
        raise ValueError("tensor_amax: an empty tensor (or slice) has no amax")
    if axis is None:
        return torch.max(torch.abs(x))
    return torch.amax(torch.abs(x), dim=axis, keepdim=True)


def round_down_to_power_of_2(scale: torch.Tensor) -> torch.Tensor:
    """2^floor(log2(s)) for positive finite float32 s, exactly; 0, inf and NaN as they are."""
    _, exponent = torch.frexp(scale)  # s = m * 2^exponent, m in [0.5, 1)
    down = torch.ldexp(torch.ones_like(scale), exponent - 1)  # 2^(exponent - 1), no overflow
    return torch.where(torch.isfinite(scale) & (scale > 0), down, scale)


def amax_to_scale(amax: torch.Tensor, fmt: str, power_of_2: bool = False) -> torch.Tensor:
    """f32(fp8_max / max(f64(amax), 1e-12)), rounded down to a power of 2 if `power_of_2`."""
    fp8_max = _max(fmt, "amax_to_scale")
    check_flag("amax_to_scale", "power_of_2", power_of_2)
    scale = (fp8_max / torch.clamp(amax.to(torch.float64), min=AMAX_EPS)).to(torch.float32)
    return round_down_to_power_of_2(scale) if power_of_2 else scale


def cast_to_fp8(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """fp8(clamp(f32(x) * scale, -max, max)), nearest even, as a torch fp8 tensor."""
    fp8_max = _max(fmt, "cast_to_fp8")
    scaled = _check_tensor(x, "cast_to_fp8").to(torch.float32) * scale.to(torch.float32)
    return scaled.clamp(min=-fp8_max, max=fp8_max).to(DTYPES[fmt])


def current_scaling(x: torch.Tensor, fmt: str, axis: int | None = None,
                    power_of_2: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 data, float32 scale) of x, current scaling (tensorwise, or rowwise along axis)."""
    scale = amax_to_scale(tensor_amax(x, axis), fmt, power_of_2)
    return cast_to_fp8(x, scale, fmt), scale


def delayed_scale(amax: torch.Tensor, scale: torch.Tensor, fmt: str, margin: int = 0,
                  order: str = "kernel") -> torch.Tensor:
    """The new float32 scale from the chosen amax (order "kernel" or "python")."""
    check_delayed_args(margin, "max", "delayed_scale")
    check_order(order, "delayed_scale")
    fp8_max = torch.tensor(_max(fmt, "delayed_scale"), dtype=torch.float32, device=amax.device)
    a = amax.to(torch.float32)
    if order == "kernel":
        new = (fp8_max * 2.0**-margin) / a  # a Python float operand enters as float32
    else:
        # TE's _default_sf_compute, line for line, but 2.0**margin: a Python int 2**margin
        # from margin 64 on does not fit the int64 torch makes of it (an OverflowError)
        new = (fp8_max / a) / 2.0**margin
    new = torch.where(torch.isfinite(a) & (a > 0), new, scale.to(torch.float32))
    return torch.where(torch.isinf(new), torch.full_like(new, FLT_MAX), new)


def delayed_update(history: torch.Tensor, scale: torch.Tensor, fmt: str, margin: int = 0,
                   algo: str = "max", order: str = "kernel") -> tuple[torch.Tensor, torch.Tensor]:
    """(new history, new scale) after one TE delayed-scaling update; inputs unmodified;
    `order` picks the scale's formula only, the roll is the fused kernel's."""
    check_delayed_args(margin, algo, "delayed_update")
    h = history.to(torch.float32)
    if h.ndim not in (1, 2) or h.shape[0] < 1 or scale.shape != h.shape[1:]:
        raise ValueError(f"delayed_update: history must be (L,) or (L, n) with L >= 1 and "
                         f"scale of shape (n,) or (); got {tuple(h.shape)} and "
                         f"{tuple(scale.shape)}")
    last = h[0]
    rolled = torch.roll(h, -1, dims=0)  # rolled[i] = h[i + 1], rolled[L-1] = h[0]
    rolls = last != 0
    amax = torch.zeros_like(last)
    for a in rolled:  # fmaxf, one history slot at a time
        amax = torch.fmax(amax, a)
    amax = torch.where(rolls, amax, torch.zeros_like(amax))
    zeroed = torch.cat([torch.zeros_like(last)[None], rolled[1:]])
    new_history = torch.where(rolls, zeroed, h)
    if algo == "most_recent":
        amax = last
    return new_history, delayed_scale(amax, scale, fmt, margin, order)


def record_amax(history: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """The history with slot 0 raised to `amax` (NaN propagating); the input unmodified."""
    h = history.to(torch.float32).clone()
    h[0] = torch.maximum(h[0], amax.to(torch.float32))
    return h


def _check_tensor(x: object, where: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        what = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{where}: expects a floating-point tensor, got {what}")
    return x
