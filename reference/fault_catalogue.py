"""The catalogue of seeded faults, plain data that both trees read: where each fault strikes,
the value it writes, where it first shows and what repairs it. Writing a fault into a model
is each tree's own code (reference/faults.py, torch_impl/faults.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    """A deterministic fault seeded before a chosen step: parameter `module.param` gets
    `value` at `index`, or with module "batch", that step's input batch does (param "x").
    Plain data (the torch tree seeds the same faults)."""

    name: str
    module: str
    param: str
    index: tuple[int, ...]
    value: float
    what: str  # where it first shows, and why
    fix: str


FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("weight_overflow", "2", "weight", (0, 0), 2.0**17,
          "one weight of the second Linear set to 2^17 = 131072: beyond float16's max 65504 "
          "(finite in float32 and bfloat16). Under fp16 autocast its cast is inf, so that "
          "Linear's output column 0 is inf (forward, AddmmBackward0); the backward then "
          "multiplies a zero gradient by it (AddmmBackward0 returns NaN). fp32 and bf16 runs "
          "stay finite.",
          "keep weights inside the format (weight decay, clipping the update), or train in "
          "bf16, whose range is float32's"),
    Fault("inf_weight", "2", "weight", (0, 0), float("inf"),
          "one weight of the second Linear set to +inf, in any precision: that Linear's "
          "output column 0 is +-inf (forward, AddmmBackward0).",
          "find what wrote the inf (a diverging update, a bad checkpoint) and restore from "
          "the last finite checkpoint"),
    Fault("poisoned_batch", "batch", "x", (0, 0), float("nan"),
          "one input value of the step's batch set to NaN (a corrupt sample), in any "
          "precision: the first Linear's output row 0 is NaN (forward, AddmmBackward0, its "
          "input already non-finite); in the backward the loss's log_softmax returns NaN "
          "first (LogSoftmaxBackward0).",
          "validate the data (torch.isfinite on each batch at load), drop or repair the sample"),
)}


def fault_named(name: str) -> Fault:
    """FAULTS[name], or a ValueError listing the catalogue."""
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; the catalogue: {', '.join(FAULTS)}")
    return FAULTS[name]
