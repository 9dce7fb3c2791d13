"""`iter()` called on a stateful loader before its state is loaded (a peer's bug: worker data
restarted from row 0). torchdata's StatefulDataLoader applies a loaded state at the NEXT
iter(); an iterator made before the load (here in __init__, to have it ready) still starts
at row 0, while the loader's state_dict() goes on reporting the position it was given.
The repair makes the iterator after the load, at the first step.

    cd examples/peers && python -m parity resume-check iter_before_load:faulty --steps 6 --at 3
    cd examples/peers && python -m parity resume-check iter_before_load:repaired --steps 6 --at 3

The first prints `resume-check: differs: first entry model.0.weight, the runs part at step 4
at model.0.weight` (tests/test_resume_check_peers.py): the state loads back whole, and
the first step after it trains on rows 0-3 instead of 12-15.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

ROWS = 64


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates (a UserWarning)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "'set_vital' is deprecated", UserWarning)
        yield


class Trainer:
    """An MLP, SGD, and rows of a fixed table served in batches of 4 by StatefulDataLoader."""

    def __init__(self, iter_at_init: bool) -> None:
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(ROWS, 4, generator=g), torch.randn(ROWS, 1, generator=g)
        with _quiet():
            self.loader = StatefulDataLoader(list(zip(x, y, strict=True)), batch_size=4)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.batches: Iterator[Any] | None = None
        if iter_at_init:  # BUG: made before any load_state_dict can reach it
            self.batches = self._iter()

    def _iter(self) -> Iterator[Any]:
        with _quiet():
            return iter(self.loader)

    def step(self) -> None:
        if self.batches is None:  # the repair: made at the first step, after any load
            self.batches = self._iter()
        x, y = next(self.batches)
        nn.functional.mse_loss(self.model(x), y).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.loader.load_state_dict(state["loader"])  # applied at the next iter()


def faulty() -> Trainer:
    return Trainer(iter_at_init=True)


def repaired() -> Trainer:
    return Trainer(iter_at_init=False)
