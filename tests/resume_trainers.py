"""Trainers for tests/test_resume_check.py, written as a user would: an MLP with dropout,
AdamW, fp16 autocast on the CPU with a GradScaler whose scale overflows and backs off, and a
data position into a fixed set of batches (`own_generator`: and input noise from a
torch.Generator the trainer keeps as an attribute). `correct` saves everything a step reads;
each other factory leaves one entry out of state_dict(), the classic ways a resume goes
wrong."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

BATCHES = 5


class Trainer:
    def __init__(self, leave_out: str = "", numpy_state: bool = False, nudge: bool = False,
                 counts: bool = False, own_gen: bool = False) -> None:
        self.leave_out, self.numpy_state, self.nudge = leave_out, numpy_state, nudge
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        self.data = [(torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g))
                     for _ in range(BATCHES)]
        self.model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.25),
                                   nn.Linear(16, 2))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        # 2^20 overflows float16 at first: the early steps are skipped and the scale backs off
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20, growth_interval=2)
        self.pos = 0
        if counts:
            self.logged = 0  # how many steps this process has logged: not state
        if own_gen:
            self.gen = torch.Generator().manual_seed(2)  # the input noise's own stream

    def step(self) -> None:
        print(f"step {self.pos}")  # a user's progress line: the check reads past it
        x, y = self.data[self.pos % BATCHES]
        if hasattr(self, "gen"):
            x = x + 0.01 * torch.randn(x.shape, generator=self.gen)
        self.pos += 1
        if hasattr(self, "logged"):
            self.logged += 1
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(self.model(x).float(), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()

    def state_dict(self) -> dict[str, Any]:
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scaler": self.scaler.state_dict(), "rng": torch.get_rng_state(),
                 "pos": self.pos}
        if hasattr(self, "gen"):
            state["gen"] = self.gen.get_state()
        if self.numpy_state:
            state["noise"] = np.zeros(3)  # a NumPy array: loading it needs pickle
        state.pop(self.leave_out, None)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        if "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        if "rng" in state:
            torch.set_rng_state(state["rng"])
        self.pos = state.get("pos", 0)
        if "gen" in state:
            self.gen.set_state(state["gen"])
        if self.nudge:  # one float32 ulp up on every weight: not exact, within 1e-6
            with torch.no_grad():
                w = self.model[0].weight
                w.copy_(torch.nextafter(w, torch.full_like(w, torch.inf)))


def correct() -> Trainer:
    return Trainer()


def no_optimizer() -> Trainer:
    return Trainer("optimizer")


def no_rng() -> Trainer:
    return Trainer("rng")


def no_data_position() -> Trainer:
    return Trainer("pos")


def no_scaler() -> Trainer:
    return Trainer("scaler")


def own_generator() -> Trainer:
    return Trainer(own_gen=True)


def no_own_generator() -> Trainer:
    return Trainer("gen", own_gen=True)


def numpy_array_in_state() -> Trainer:
    return Trainer(numpy_state=True)


def nudged_on_load() -> Trainer:
    return Trainer(nudge=True)


def counts_its_steps() -> Trainer:
    return Trainer(counts=True)


def fails_to_load() -> tuple[Any, Any, Any]:
    t = Trainer()

    def load(state: dict[str, Any]) -> None:
        raise KeyError("scaler")

    return t.state_dict, load, t.step


def as_callables() -> tuple[Any, Any, Any]:
    t = Trainer()
    return t.state_dict, t.load_state_dict, t.step
