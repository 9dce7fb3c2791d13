"""Lossless conversion of optimizer and LR-scheduler state between reference.optim and torch.optim.

The optimizers themselves are torch.optim's (see reference/optim.py for the math and the
NOTEs on how torch's CPU kernels round). Issue 3 places this conversion in torch_impl/nn.py;
it lives here because it concerns optim's state, and nn.py is the model's file.

What PyTorch adds to the reference's structure:
- tensors instead of arrays (the same bits: `torch.from_numpy` of a copy, `.numpy()` back);
- implementation switches in every param group that select a kernel, not a formula:
  `foreach`, `fused`, `differentiable` (and `capturable` for Adam/AdamW). The reference
  models torch's default CPU path (for-loop kernels), so these are written with their
  defaults and must have them when read back;
- a scheduler flag `_get_lr_called_within_step` (a guard for a warning).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

# NOTE [ FMA in torch's CPU kernels ] and NOTE [ torch's CPU sqrt is MKL's ] (reference/optim.py)
# say how these optimizers round; the switches below pick the for-loop path they describe.
SWITCHES: dict[str, dict[str, Any]] = {
    "SGD": {"foreach": None, "differentiable": False, "fused": None},
    "Adam": {"foreach": None, "capturable": False, "differentiable": False, "fused": None},
    "AdamW": {"foreach": None, "capturable": False, "differentiable": False, "fused": None},
}
_DEFAULT_PATH = {"foreach": (None, False), "fused": (None, False), "capturable": (False,),
                 "differentiable": (False,)}


def optimizer_state_to_torch(state_dict: dict[str, Any], optimizer: str) -> dict[str, Any]:
    """A reference optimizer state_dict as torch.optim.<optimizer>.load_state_dict accepts it."""
    if optimizer not in SWITCHES:
        raise ValueError(f"optimizer_state_to_torch: optimizer must be one of "
                         f"{sorted(SWITCHES)}, got {optimizer!r}")
    state = {i: {k: torch.from_numpy(np.array(v, copy=True)) for k, v in s.items()}
             for i, s in state_dict["state"].items()}
    groups = []
    for g in state_dict["param_groups"]:
        group = {k: v for k, v in g.items() if k != "params"}
        group.update(SWITCHES[optimizer])
        group["params"] = list(g["params"])
        groups.append(group)
    return {"state": state, "param_groups": groups}


def optimizer_state_from_torch(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A torch.optim state_dict as the reference's load_state_dict accepts it (bits kept)."""
    state = {i: {k: v.detach().cpu().numpy().copy() for k, v in s.items()}
             for i, s in state_dict["state"].items()}
    groups = []
    for g in state_dict["param_groups"]:
        for key, allowed in _DEFAULT_PATH.items():
            if key in g and g[key] not in allowed:
                raise ValueError(f"optimizer_state_from_torch: param group has {key}="
                                 f"{g[key]!r}; the reference models torch's default CPU "
                                 f"for-loop path only ({key} in {allowed})")
        group = {k: v for k, v in g.items() if k not in _DEFAULT_PATH and k != "params"}
        group["params"] = list(g["params"])
        groups.append(group)
    return {"state": state, "param_groups": groups}


def scheduler_state_to_torch(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A reference scheduler state_dict as torch's LRScheduler.load_state_dict accepts it."""
    return {**_copy_lists(state_dict), "_get_lr_called_within_step": False}


def scheduler_state_from_torch(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A torch LRScheduler state_dict as the reference's load_state_dict accepts it."""
    return {k: v for k, v in _copy_lists(state_dict).items()
            if k != "_get_lr_called_within_step"}


def _copy_lists(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, list) else v) for k, v in d.items()}
