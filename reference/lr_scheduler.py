"""Learning-rate schedules with torch.optim.lr_scheduler's semantics, bit for bit.

Each schedule sets every param group's lr at construction (step 0) and at every step(),
with torch's recursive ("chainable") formulas in Python float64 (NOTE [ Chainable
schedules ]); the closed forms they follow:

    StepLR             lr_t = base_lr * gamma ** (t // step_size)
    LinearLR           lr_t = base_lr * (start + (end - start) * min(t, total_iters) / total_iters)
    CosineAnnealingLR  lr_t = eta_min + (base_lr - eta_min) (1 + cos(pi t / T_max)) / 2

torch's twins are torch.optim.lr_scheduler's classes themselves; torch_impl/state_mapping.py
converts their state.
"""

from __future__ import annotations

import math
from typing import Any

from reference.optim import Optimizer

# NOTE [ Chainable schedules ]
# torch's get_lr() updates each group's CURRENT lr from the previous one (StepLR:
# lr * gamma every step_size steps; LinearLR and CosineAnnealingLR: lr times a ratio of
# consecutive factors), not from base_lr with the closed form. The recursion accumulates
# one rounding per step, so the closed form differs from it in the last bits (docs/optim.md
# gives the measured rates), and a resumed run must carry the current lr, not recompute
# it: state_dict() holds `_last_lr` and the optimizer's state_dict holds each group's lr.


class LRScheduler:
    """Sets each group's lr once at construction (step 0) and at every step().

    State (state_dict): every attribute except the optimizer: base_lrs (the groups'
    `initial_lr`), last_epoch, _step_count, _is_initial, _last_lr, and the schedule's own
    hyperparameters. Call optimizer.step() before scheduler.step(), as with torch.
    """

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        for i, group in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] when "
                               "resuming scheduler with last_epoch >= 0.")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._step_count = 0
        self._is_initial = True
        self.step()
        self._is_initial = False

    def get_lr(self) -> list[float]:
        """The next lr of every group (called by step() after last_epoch advanced)."""
        raise NotImplementedError

    def step(self) -> None:
        """Advance last_epoch and write the new lr into every param group."""
        self._step_count += 1
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        """The lrs the last step() wrote."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in vars(self).items()
                if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)

    def _lrs(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]


class StepLR(LRScheduler):
    """lr <- lr * gamma whenever last_epoch is a positive multiple of step_size."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._lrs()
        return [lr * self.gamma for lr in self._lrs()]


class LinearLR(LRScheduler):
    """Factor from start_factor to end_factor linearly over total_iters steps, recursively:
    lr_t = lr_{t-1} * (1 + (end - start) / (total_iters * start + (t - 1) * (end - start)))."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3,
                 end_factor: float = 1.0, total_iters: int = 5, last_epoch: int = -1) -> None:
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError("Starting multiplicative factor expected to be greater than 0 and "
                             "less or equal to 1.")
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0:
            return [lr * self.start_factor for lr in self._lrs()]
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._lrs()
        delta = self.end_factor - self.start_factor
        return [lr * (1.0 + delta / (self.total_iters * self.start_factor
                                     + (self.last_epoch - 1) * delta))
                for lr in self._lrs()]


class CosineAnnealingLR(LRScheduler):
    """eta_min + (base_lr - eta_min)(1 + cos(pi t / T_max)) / 2, recursively:
    lr_t = (1 + cos(pi t / T)) / (1 + cos(pi (t-1) / T)) * (lr_{t-1} - eta_min) + eta_min,
    with an additive step where the denominator vanishes (t - 1 - T a multiple of 2T)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,
                 last_epoch: int = -1) -> None:
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        t, T, eta_min = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return self._lrs()
        if self._step_count == 1 and t > 0:
            return [eta_min + (base - eta_min) * (1 + math.cos(t * math.pi / T)) / 2
                    for base in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:
            return [lr + (base - eta_min) * (1 - math.cos(math.pi / T)) / 2
                    for base, lr in zip(self.base_lrs, self._lrs(), strict=True)]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T))
                * (lr - eta_min) + eta_min for lr in self._lrs()]
