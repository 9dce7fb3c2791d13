"""The instrument a PhaseTimer (reference/profile.py) calls at each phase boundary: the bytes
live by category (NOTE [ Phase boundaries ] in reference/profile.py), read off the
reference's own objects. torch_impl/profile_meters.py is its twin (with, for torch alone, the
op census and the seeded fault of NOTE [ Honest timing ]).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


# ---------------------------------------------------------------- bytes at the boundaries
class BoundaryMemory:
    """Bytes by category (NOTE [ Phase boundaries ]) at every boundary, read off the
    reference's own objects: parameters, their grads, the optimizer's state arrays, every
    tape (tape_nodes: the model's and the loss's), and the batch the loop holds. Distinct
    (data pointer, bytes), the notion of reference/accounting.py's distinct_bytes. Beside
    them, for a model that keeps its own count (the transformer's GPT.held_bytes: distinct
    base buffers of its tapes), that count at every boundary (`tape`). Use as a PhaseTimer
    observer."""

    def __init__(self, model: Any, loss_fn: Any | None, optimizer: Any) -> None:
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.batch: tuple[np.ndarray, ...] = ()
        self.boundaries: list[tuple[str, dict[str, int]]] = []
        self.tape: list[tuple[str, int]] = []  # the model's own count, if it keeps one

    def __call__(self, name: str, when: str) -> None:
        if (name, when) == ("step", "begin"):
            boundary = "start"
        elif when == "end":
            boundary = name
        else:
            return
        self.boundaries.append((boundary, self.categories()))
        if hasattr(self.model, "held_bytes"):
            self.tape.append((boundary, self.model.held_bytes()))

    def categories(self) -> dict[str, int]:
        seen: set[tuple[int, int]] = set()

        def take(arrays: Iterable[Any]) -> int:
            total = 0
            for a in arrays:
                a = np.asarray(a)
                key = (a.__array_interface__["data"][0], a.nbytes)
                if a.nbytes and key not in seen:
                    seen.add(key)
                    total += a.nbytes
            return total

        params = self.model.parameters()
        tapes = tape_nodes(self.model, self.loss_fn)
        return {"weights": take(p.data for p in params),
                "grads": take(p.grad for p in params if p.grad is not None),
                "optimizer state": take(v for entries in self.optimizer.state.values()
                                        for v in entries.values()),
                "activations": take(a for m in tapes for a in m.saved_tensors().values()),
                "batch": take(self.batch)}


def tape_nodes(model: Any, loss_fn: Any | None = None) -> list[Any]:
    """Every node whose tape the step fills: the model's modules, and for the transformer
    (reference/gpt.py) also its per-block checkpoints (`trunk`: each saves its block's input)
    and its own loss node (it computes the loss itself: train_step's `loss_fn` is None), the
    nodes GPT.held_bytes counts; then the loop's `loss_fn`, if any."""
    nodes = [*model.modules()]
    trunk = getattr(model, "trunk", None)
    nodes += [] if trunk is None else list(trunk.checkpoints)
    nodes += [n for n in (getattr(model, "loss_fn", None), loss_fn) if n is not None]
    return nodes
