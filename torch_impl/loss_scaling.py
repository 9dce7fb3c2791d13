"""The canonical mixed-precision step with torch.amp. See reference/loss_scaling.py for the math.

The scaler IS torch.amp.GradScaler; this file holds the training step that uses it, line
for line like the reference's `train_step`, and the skipped-step signal torch does not give.

What PyTorch does that the reference spells out:
- `unscale_` and the non-finite check are one fused kernel per (device, dtype) group,
  `torch._amp_foreach_non_finite_check_and_unscale_`; the scale update is
  `torch._amp_update_scale_` (NOTEs [ Unscale by reciprocal ], [ Scale update rounding ],
  [ Tracker order ] in reference/loss_scaling.py describe both, CPU and CUDA alike).
- The scale and tracker live on the device (no host sync per step); `get_scale()` syncs.
- No skipped-step signal: `step()` returns None both when skipped and when the optimizer
  returns None. `train_step` reads the found_inf flags of this iteration
  (`scaler._found_inf_per_device(optimizer)`, filled by unscale_) BEFORE `update()` clears
  them; reading them costs a host sync, as `get_scale()` does.
- Extras of the reference (min_scale, hysteresis, last_step_skipped) have no torch twin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torch_impl import amp

FAULTS = (None, "fp16_without_scaler", "clip_before_unscale")

__all__ = ["FAULTS", "StepResult", "make_scaler", "step_skipped", "train_step"]


@dataclass(frozen=True)
class StepResult:
    """What one training step did: the unscaled loss, the scale it used, whether it skipped."""

    loss: float
    scale: float
    skipped: bool
    grad_norm: float | None = None  # what clip_grad_norm_ returned (None: no clipping)


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


def train_step(model: nn.Module, loss_fn: nn.Module, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler, x: torch.Tensor, y: torch.Tensor, *,
               precision: str, max_grad_norm: float | None = None,
               fault: str | None = None) -> StepResult:
    """One mixed-precision step; reference.loss_scaling.train_step line for line.

    precision "fp32" | "bf16" | "fp16" picks the autocast dtype (amp.autocast_dtype);
    "fp16" requires an enabled scaler (make_scaler gives the right one for each). Order:
    zero_grad, autocast forward, float32 loss, scale(loss).backward(), unscale_, clip the
    UNSCALED gradients (if max_grad_norm), step (skipped on inf/NaN), update.
    `fault` reproduces a classic mistake, for the tests and docs only (FAULTS):
    "fp16_without_scaler" lifts the fp16 guard, "clip_before_unscale" clips the scaled
    gradients (the threshold is then effectively max_grad_norm * S).
    """
    dtype = amp.autocast_dtype(precision)
    if fault not in FAULTS:
        raise ValueError(f"train_step: fault must be one of {FAULTS}, got {fault!r}")
    if precision == "fp16" and not scaler.is_enabled() and fault != "fp16_without_scaler":
        raise ValueError("train_step: precision 'fp16' needs an enabled GradScaler "
                         "(make_scaler('fp16')); bf16 and fp32 do not")
    optimizer.zero_grad()
    with amp.autocast(dtype, x.device.type):
        output = model(x)
        loss = loss_fn(output, y)  # fp32 op list: losses run in float32
    scaler.scale(loss).backward()
    grad_norm = None
    if fault == "clip_before_unscale" and max_grad_norm is not None:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_grad_norm)
    scaler.unscale_(optimizer)
    if max_grad_norm is not None and fault != "clip_before_unscale":
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_grad_norm)
    scale = scaler.get_scale()
    scaler.step(optimizer)
    skipped = step_skipped(scaler, optimizer)
    scaler.update()
    return StepResult(loss.item(), scale, skipped,
                      None if grad_norm is None else grad_norm.item())
