"""A dummy step that advances Adam's step counter (a peer's bug: a warm-up step to build the
optimizer's state). A loop that must materialize AdamW's lazy state before a load fills it
in place takes one optimizer step with zero gradients and lr 0: the weights do not move, but
AdamW counts the step and decays its moments. Taken BEFORE the load, the load overwrites
all of it (repaired); taken after (faulty), the resumed AdamW is one step ahead: its bias
corrections and its decayed moments are another run's. A fresh run takes no warm-up step.

    cd examples/peers && python -m parity resume-check adam_warmup:faulty --steps 6 --at 3
    cd examples/peers && python -m parity resume-check adam_warmup:repaired --steps 6 --at 3

The first prints `resume-check: differs: first entry model.0.weight, the runs part at step 3
at optimizer.state.0.step` (tests/test_resume_check_peers.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Trainer:
    """An MLP, AdamW, a fixed set of batches and a data position."""

    def __init__(self, warm_up_after_load: bool) -> None:
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        self.batches = [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g))
                        for _ in range(4)]
        self.model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.pos = 0
        self.warm_up_after_load = warm_up_after_load

    def warm_up(self) -> None:
        """AdamW's state made by a step on zero gradients at lr 0 (weights unchanged)."""
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)
        lr = [g["lr"] for g in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["lr"] = 0.0
        self.optimizer.step()  # step += 1; exp_avg *= beta1; exp_avg_sq *= beta2
        for g, value in zip(self.optimizer.param_groups, lr, strict=True):
            g["lr"] = value
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        x, y = self.batches[self.pos % len(self.batches)]
        self.pos += 1
        nn.functional.mse_loss(self.model(x), y).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.warm_up_after_load:
            self.warm_up()  # the repair: before the load, which overwrites what it made
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.pos = state["pos"]
        if self.warm_up_after_load:  # BUG: the resumed AdamW is one step ahead
            self.warm_up()


def faulty() -> Trainer:
    return Trainer(warm_up_after_load=True)


def repaired() -> Trainer:
    return Trainer(warm_up_after_load=False)
