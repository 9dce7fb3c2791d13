"""fp16 training of the compact transformer with a GradScaler in both trees (claim
loss_scaling.gpt_trajectory): the same weights and batches, each tree on its own, the
scale and the skipped steps read after every step.

Each step: zero_grad, forward under float16 autocast, backward of S * loss (grad_output S:
d(S loss)/d loss), scaler.step (skipped when an unscaled gradient is inf or NaN: the fp16
backward overflowed), scaler.update. The default run starts at a scale far above what the
fp16 backward holds, so it overflows, backs off step by step, grows every
`growth_interval` clean steps and overflows again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from parity.drivers import gpt as dg
from parity.drivers.amp import float32_accumulation
from parity.drivers.optim import FUSED
from reference import amp as ramp
from reference import loss_scaling as rls
from reference import optim as ropt
from torch_impl import loss_scaling as tls


@dataclass
class Trajectory:
    """Per step, each tree's scale after update, whether it skipped, and its loss."""

    ref_scales: np.ndarray
    torch_scales: np.ndarray
    ref_skipped: np.ndarray
    torch_skipped: np.ndarray
    ref_losses: np.ndarray
    torch_losses: np.ndarray


def gpt_trajectory(steps: int = 16, init_scale: float = 2.0**24, growth_interval: int = 2,
                   lr: float = 0.05, seed: int = 0, device: str = "cpu") -> Trajectory:
    """Run `steps` fp16 steps of the default GPT (dropout off) in both trees."""
    config = replace(dg.GPTConfig(), dropout=0.0)
    ref, twin = dg.make_pair(config, np.float32, seed, device)
    ref_opt = ropt.SGD(ref.parameters(), lr=lr, fma=FUSED)
    torch_opt = torch.optim.SGD(twin.parameters(), lr=lr)
    kwargs = {"init_scale": init_scale, "growth_interval": growth_interval}
    rs, ts = rls.make_scaler("fp16", **kwargs), tls.make_scaler("fp16", device, **kwargs)
    out: dict[str, list] = {k: [] for k in Trajectory.__dataclass_fields__}
    for step in range(steps):
        idx, targets = dg.tokens(config, 4, config.block_size, seed * 1000 + step)
        ref.zero_grad()
        with np.errstate(over="ignore", invalid="ignore"):
            with ramp.autocast("float16"):
                _, loss = ref.forward(idx, targets)
            ref.backward(rs.scale(np.ones((), np.float32)))  # d(S loss)/d loss = S
            rs.step(ref_opt)
        out["ref_skipped"].append(rls.step_skipped(rs, ref_opt))
        rs.update()
        out["ref_scales"].append(rs.get_scale())
        out["ref_losses"].append(float(loss))
        torch_opt.zero_grad()
        with float32_accumulation(device):
            with torch.autocast(torch.device(device).type, dtype=torch.float16):
                _, t_loss = twin(dg.to_torch_tokens(idx, device),
                                 dg.to_torch_tokens(targets, device))
            ts.scale(t_loss).backward()
        ts.step(torch_opt)
        out["torch_skipped"].append(tls.step_skipped(ts, torch_opt))
        ts.update()
        out["torch_scales"].append(ts.get_scale())
        out["torch_losses"].append(float(t_loss.detach()))
    return Trajectory(**{k: np.array(v) for k, v in out.items()})
