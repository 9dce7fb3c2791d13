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

from typing import Any

import torch

from torch_impl import amp

__all__ = ["make_scaler", "step_skipped"]


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
