"""Dynamic loss scaling with torch.amp. See reference/loss_scaling.py for the mechanism, and
reference/loss_scale_kernels.py for the update rule and the unscale it reproduces.

The scaler IS torch.amp.GradScaler and clipping IS torch.nn.utils.clip_grad_norm_; this file
gives them the reference's names, and adds what torch does not give: `make_scaler` and the
skipped-step signal. The training step that orders scale, backward, unscale_, clip, step and
update is torch_impl/train.py's.

What PyTorch does that the reference spells out:
- `unscale_` and the non-finite check are one fused kernel per (device, dtype) group,
  `torch._amp_foreach_non_finite_check_and_unscale_`; the scale update is
  `torch._amp_update_scale_` (NOTEs [ Unscale by reciprocal ], [ Scale update rounding ],
  [ Tracker order ] in reference/loss_scale_kernels.py describe both; the CUDA kernels
  compute the same formulas).
- The scale and tracker live on the device (no host sync per step); `get_scale()` syncs.
- No skipped-step signal: `step()` returns None both when skipped and when the optimizer
  returns None. `step_skipped` reads the found_inf flags of this iteration
  (`scaler._found_inf_per_device(optimizer)`, filled by unscale_) BEFORE `update()` clears
  them; reading them costs a host sync, as `get_scale()` does.
- clip_grad_norm_'s norms: `torch._foreach_norm` per (device, dtype) group (on CPU a loop of
  `linalg.vector_norm`, on CUDA one multi-tensor kernel), each a float32 reduction in
  torch's own order: within about n float32 ulps of the reference's, not bit for bit
  (reference/clip_grad.py).
- Extras of the reference (min_scale, hysteresis, last_step_skipped, StaticLossScaler) have
  no torch twin.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.amp.grad_scaler import OptState
from torch.nn.utils import clip_grad_norm_, clip_grads_with_norm_, get_total_norm

from torch_impl import amp

GradScaler = torch.amp.GradScaler

__all__ = ["GradScaler", "OptState", "clip_grad_norm_", "clip_grads_with_norm_",
           "get_total_norm", "make_scaler", "step_skipped"]


def make_scaler(precision: str, device: str | torch.device = "cpu",
                **kwargs: Any) -> torch.amp.GradScaler:
    """GradScaler(enabled=(precision == "fp16")): fp16 needs scaling, bf16 and fp32 do not."""
    amp.autocast_dtype(precision)
    return torch.amp.GradScaler(torch.device(device).type, enabled=(precision == "fp16"),
                                **kwargs)


def step_skipped(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """Whether scaler.step(optimizer) skipped this iteration; call after step, before update."""
    return scaler.is_enabled() and bool(
        sum(v.item() for v in scaler._found_inf_per_device(optimizer).values()))
