"""A DCP state_dict cached across saves (a peer's bug: every later save rewrote the first).
The loop builds its checkpoint with torch.distributed.checkpoint's get_state_dict and stages
it (copies every tensor into buffers of its own, as an asynchronous save stages before it
writes). The faulty loop keeps the staged dict of its first save and hands it out again; the
repaired one keeps the buffers but copies the live values into them at every save.

    cd examples/peers && python -m parity resume-check cached_state_dict:faulty --steps 6 --at 3
    cd examples/peers && python -m parity resume-check cached_state_dict:repaired --steps 6 --at 3

Both runs end on the same stale dict, so their final states agree; what catches it is the
uninterrupted run's state not moving while the trainer's model does (NOTE [ A state that
does not move ] in parity/lab/your_trainer/resume_stale.py). The first prints
`resume-check: differs: first entry model.0.weight, the runs part at step 3 at
trainer.model.0.weight` (tests/test_resume_check_peers.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def _stage(value: Any, into: Any) -> Any:
    """`value` with every tensor copied: into `into`'s buffers where given (the repair),
    else into new ones."""
    if isinstance(value, dict):
        return {k: _stage(v, None if into is None else into[k]) for k, v in value.items()}
    if isinstance(value, list):
        return [_stage(v, None if into is None else into[i]) for i, v in enumerate(value)]
    if isinstance(value, torch.Tensor):
        return value.detach().clone() if into is None else into.copy_(value)
    return value


class Trainer:
    """An MLP, AdamW, a fixed set of batches and a data position."""

    def __init__(self, cache_values: bool) -> None:
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        self.batches = [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g))
                        for _ in range(4)]
        self.model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.pos = 0
        self.cache_values = cache_values
        self.staged: dict[str, Any] | None = None

    def step(self) -> None:
        x, y = self.batches[self.pos % len(self.batches)]
        self.pos += 1
        nn.functional.mse_loss(self.model(x), y).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        if self.staged is not None and self.cache_values:
            return self.staged  # BUG: the first save's values, again
        model, optimizer = get_state_dict(self.model, self.optimizer)
        live = {"model": model, "optimizer": optimizer, "pos": self.pos}
        if self.staged is not None and set(live["optimizer"]["state"]) != set(
                self.staged["optimizer"]["state"]):  # AdamW's lazy state came since
            self.staged = None
        self.staged = _stage(live, self.staged)
        return self.staged

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        self.pos = state["pos"]
        self.staged = None


def faulty() -> Trainer:
    return Trainer(cache_values=True)


def repaired() -> Trainer:
    return Trainer(cache_values=False)
