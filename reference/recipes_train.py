"""bf16-sr: training with bfloat16 weights and no float32 master copy, the update rounded
stochastically (AdamWSR, reference/optim_sr.py), its draws from the run's BitStream.

A bf16 weight run keeps one copy of each weight, in bfloat16; every update is rounded back to
bfloat16, stochastically, so an update below half a bfloat16 spacing still moves the weight
in expectation. Here the model's forward and backward run in float32 (as every op outside
the scaled GEMMs of common/fp8_train.py), on weights that hold bfloat16 VALUES:

    at construction:  W <- f32(bf16_rne(W))                  the weights become bf16 values
    each step:        w = bf16(W)                            exact: W holds a bf16 value
                      g = bf16_rne(dL/dW)                    the bf16 gradient a bf16
                                                             backward would hand over
                      r = BitStream.uint16(W's shape), one per parameter, in order
                      w <- AdamWSR.step(w, g, r)             float32 arithmetic, SR to bf16
                      W <- f32(w)                            exact

So W never carries more than a bfloat16 (there is no master to accumulate small updates: the
float32 storage is only the width the float32 forward reads), and the run's state is W, the
AdamWSR moments (bfloat16) and step, and the BitStream's state (NOTE [ One bit stream, both
trees ] in common/recipes_train.py). state_dict() widens the bfloat16 moments to float32
(exact; load_state_dict casts them back, as torch's Optimizer casts state to its parameter's
dtype), so a checkpoint holds them as any float32 optimizer buffer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ml_dtypes
import numpy as np

from common.recipes_train import BitStream, weight_draws
from reference.module import Parameter
from reference.optim_sr import AdamWSR

_BF16 = np.dtype(ml_dtypes.bfloat16)


def to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 rounded to the nearest bfloat16, ties to even (exact for bf16 values)."""
    return np.asarray(a, dtype=np.float32).astype(_BF16)


class BF16SR(AdamWSR):
    """AdamWSR over bfloat16 copies of `params` (the model's float32 Parameters, made to hold
    bfloat16 values), drawing from `bits`; the model's view of the optimizer (zero_grad, step,
    param_groups, state_dict) is the one train_step and the LR scheduler use."""

    def __init__(self, params: Iterable[Parameter], bits: BitStream, lr: float = 1e-3,
                 weight_decay: float = 1e-2, **kwargs: Any) -> None:
        self.weights = list(params)
        for p in self.weights:
            if p.data.dtype != np.float32:
                raise TypeError(f"BF16SR: the model's parameters must be float32, got "
                                f"{p.data.dtype}")
            p.data[...] = to_bf16(p.data).astype(np.float32)
        super().__init__([Parameter(to_bf16(p.data)) for p in self.weights], lr=lr,
                         weight_decay=weight_decay, **kwargs)
        self.bits = bits

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.weights:
            p.grad = None if set_to_none or p.grad is None else np.zeros_like(p.grad)
        super().zero_grad(set_to_none)

    def step(self) -> None:  # type: ignore[override]
        """One update of every weight with a gradient (the module docstring's step)."""
        pairs = list(zip(self.weights, self.param_groups[0]["params"], strict=True))
        shapes = []
        for p, w in pairs:
            w.data = to_bf16(p.data)
            w.grad = None if p.grad is None else to_bf16(p.grad)
            if p.grad is not None:
                shapes.append(p.data.shape)
        super().step(weight_draws(self.bits, shapes))
        for p, w in pairs:
            p.data[...] = w.data.astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        """AdamWSR's, its bfloat16 moments widened to float32 (exact)."""
        state = super().state_dict()
        for entries in state["state"].values():
            for name, value in entries.items():
                if value.dtype == _BF16:
                    entries[name] = value.astype(np.float32)
        return state
