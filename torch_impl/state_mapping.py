"""The state mapping: a model's, an optimizer's and an LR scheduler's state between the trees.

Not half of a twin: the modules, optimizers and schedules are torch's own (torch_impl/module.py,
nn.py and optim.py name them; reference/ states the math). Every value is copied, never
recomputed: arrays <-> tensors of the same dtype and bits, Python scalars as they are.

A model's state_dict has the same keys and the same layouts ((out, in) weights) on both
sides: `state_dict_to_torch` and `state_dict_from_torch` are copies. An optimizer's and a
scheduler's state differ in shape, and by torch version: each conversion maps exactly the
keys the installed torch has (read off a fresh torch optimizer or scheduler once), and
refuses what it cannot map without loss.

Optimizer param groups (tensors <-> arrays of the same bits in "state"):
    both sides       the hyperparameters (lr, momentum, dampening, weight_decay, nesterov,
                     maximize; betas, eps, amsgrad), `initial_lr` once a scheduler is attached
    torch only       kernel switches that select a kernel, not a formula: foreach, fused,
                     differentiable (all versions), capturable (Adam, AdamW). The reference
                     models torch's default CPU path (for-loop kernels), so they are written
                     with that path's values and refused with any other value when read.
    reference; torch decoupled_weight_decay (False for Adam, True for AdamW): in the groups of
      2.11, 2.13     torch 2.11.0 and 2.13.0 (where AdamW is Adam with it set), absent in
                     torch 2.6.0 (where AdamW is its own class). For a torch without it, the
                     value is checked against the one its class implies and dropped when
                     writing, and restored from the optimizer's name when reading.
Scheduler state (plain Python values):
    both sides       the schedule's hyperparameters, base_lrs, last_epoch, _step_count,
                     _last_lr
    torch only       _get_lr_called_within_step (a warning guard, False between steps; all
                     versions), verbose (torch 2.6.0: the deprecated printing flag, False)
    reference; torch _is_initial (True only while the constructor takes step 0): torch 2.11.0
      2.11, 2.13     and 2.13.0 carry it; torch 2.6.0 lacks it and tests last_epoch == 0
                     instead, the same thing for every state a scheduler can save.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


# -- a model: same keys, same layouts, same bits
def state_dict_to_torch(ref_state: Mapping[str, np.ndarray],
                        device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """A reference state_dict as torch tensors (copies; bit-exact; keys unchanged)."""
    return {k: torch.from_numpy(np.array(v, copy=True)).to(device) for k, v in ref_state.items()}


def state_dict_from_torch(torch_state: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """A torch state_dict as NumPy arrays (copies; bit-exact; keys unchanged)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in torch_state.items()}


# -- an optimizer and its scheduler: the keys of the installed torch
OPTIMIZERS = ("SGD", "Adam", "AdamW")

# Param-group keys torch adds: the values the default CPU path has (the first is written).
SWITCHES: dict[str, tuple[Any, ...]] = {
    "foreach": (None, False), "fused": (None, False), "capturable": (False,),
    "differentiable": (False,),
}
# Param-group keys the reference always has and an older torch lacks: the value that torch's
# class behaves as.
IMPLIED: dict[str, dict[str, Any]] = {
    "SGD": {}, "Adam": {"decoupled_weight_decay": False},
    "AdamW": {"decoupled_weight_decay": True},
}
# Scheduler bookkeeping the reference keeps (besides each schedule's hyperparameters), and
# what torch keeps besides the shared keys: the values any saved state has.
REFERENCE_SCHEDULER_KEYS = ("base_lrs", "last_epoch", "_step_count", "_is_initial", "_last_lr")
TORCH_SCHEDULER_EXTRAS: dict[str, tuple[Any, ...]] = {
    "_get_lr_called_within_step": (False,), "verbose": (False,), "_is_initial": (False,),
}


@functools.cache
def torch_group_keys(optimizer: str) -> frozenset[str]:
    """The param-group keys of the installed torch's optimizer (from a fresh instance)."""
    probe = getattr(torch.optim, optimizer)([torch.zeros(1, requires_grad=True)])
    return frozenset(probe.param_groups[0]) - {"params"}


@functools.cache
def torch_scheduler_keys() -> frozenset[str]:
    """The keys every scheduler of the installed torch saves besides its hyperparameters."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    return frozenset(sched.state_dict()) - {"step_size", "gamma"}


def _check_name(where: str, optimizer: str) -> None:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"{where}: optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")


def optimizer_state_to_torch(state_dict: dict[str, Any], optimizer: str) -> dict[str, Any]:
    """A reference optimizer state_dict as the installed torch.optim.<optimizer> loads it."""
    where = "optimizer_state_to_torch"
    _check_name(where, optimizer)
    torch_keys = torch_group_keys(optimizer)
    state = {i: {k: torch.from_numpy(np.array(v, copy=True)) for k, v in s.items()}
             for i, s in state_dict["state"].items()}
    groups = []
    for g in state_dict["param_groups"]:
        group = {}
        for key, value in g.items():
            if key in torch_keys or key == "initial_lr":
                group[key] = value
            elif key in IMPLIED[optimizer]:
                if value != IMPLIED[optimizer][key]:
                    raise ValueError(
                        f"{where}: torch {torch.__version__}'s {optimizer} has no {key}: it "
                        f"always behaves as {key}={IMPLIED[optimizer][key]!r}, the reference "
                        f"group has {key}={value!r}")
            elif key != "params":
                raise ValueError(f"{where}: torch {torch.__version__}'s {optimizer} has no "
                                 f"param-group key {key!r}")
        for key in sorted(torch_keys - set(group)):
            if key not in SWITCHES:
                raise ValueError(f"{where}: torch {torch.__version__}'s {optimizer} needs the "
                                 f"param-group key {key!r}, which the reference state lacks")
            group[key] = SWITCHES[key][0]
        group["params"] = list(g["params"])
        groups.append(group)
    return {"state": state, "param_groups": groups}


def optimizer_state_from_torch(state_dict: dict[str, Any], optimizer: str | None = None
                               ) -> dict[str, Any]:
    """A torch.optim state_dict as the reference's load_state_dict accepts it (bits kept).

    `optimizer` ("SGD", "Adam", "AdamW") is needed only where the torch groups lack a key
    the reference's have (decoupled_weight_decay in torch 2.6.0's Adam and AdamW).
    """
    where = "optimizer_state_from_torch"
    if optimizer is not None:
        _check_name(where, optimizer)
    state = {i: {k: v.detach().cpu().numpy().copy() for k, v in s.items()}
             for i, s in state_dict["state"].items()}
    groups = []
    for g in state_dict["param_groups"]:
        for key, allowed in SWITCHES.items():
            if key in g and g[key] not in allowed:
                raise ValueError(f"{where}: param group has {key}={g[key]!r}; the reference "
                                 f"models torch's default CPU for-loop path only ({key} in "
                                 f"{allowed})")
        group = {k: v for k, v in g.items() if k not in SWITCHES and k != "params"}
        if optimizer is not None:
            for key, value in IMPLIED[optimizer].items():
                group.setdefault(key, value)
        elif "betas" in group and "decoupled_weight_decay" not in group:
            raise ValueError(f"{where}: torch {torch.__version__}'s Adam and AdamW groups do "
                             f"not record decoupled_weight_decay; pass optimizer='Adam' or "
                             f"'AdamW' to say which")
        group["params"] = list(g["params"])
        groups.append(group)
    return {"state": state, "param_groups": groups}


def scheduler_state_to_torch(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A reference scheduler state_dict as the installed torch's schedulers load it."""
    torch_keys = torch_scheduler_keys()
    out = {}
    for key, value in _copy_lists(state_dict).items():
        if key in REFERENCE_SCHEDULER_KEYS and key not in torch_keys:
            _check_extra("scheduler_state_to_torch", key, value)
        else:
            out[key] = value
    for key in sorted(torch_keys - set(out)):
        if key not in TORCH_SCHEDULER_EXTRAS:
            raise ValueError(f"scheduler_state_to_torch: torch {torch.__version__}'s schedulers "
                             f"save {key!r}, which the reference state lacks")
        out[key] = TORCH_SCHEDULER_EXTRAS[key][0]
    return out


def scheduler_state_from_torch(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A torch LRScheduler state_dict as the reference's load_state_dict accepts it."""
    out = {}
    for key, value in _copy_lists(state_dict).items():
        if key in TORCH_SCHEDULER_EXTRAS and key not in REFERENCE_SCHEDULER_KEYS:
            _check_extra("scheduler_state_from_torch", key, value)
        else:
            out[key] = value
    for key in REFERENCE_SCHEDULER_KEYS:
        if key not in out:
            if key not in TORCH_SCHEDULER_EXTRAS:
                raise ValueError(f"scheduler_state_from_torch: the torch state lacks {key!r}")
            out[key] = TORCH_SCHEDULER_EXTRAS[key][0]
    return out


def _check_extra(where: str, key: str, value: Any) -> None:
    """A key one side lacks may be dropped only with the one value every saved state has."""
    if value not in TORCH_SCHEDULER_EXTRAS[key] or not isinstance(value, bool):
        raise ValueError(f"{where}: {key}={value!r} cannot be mapped (the other side has no "
                         f"{key}; only {TORCH_SCHEDULER_EXTRAS[key]} is)")


def _copy_lists(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, list) else v) for k, v in d.items()}
