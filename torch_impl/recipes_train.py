"""bf16-sr with PyTorch. See reference/recipes_train.py for the step; same names, same order.
What PyTorch does differently or hides:

- BF16SR is a torch.optim.Optimizer (torch_impl/optim_sr.AdamWSR), so torch's LR schedulers
  and GradScaler take it; its parameters are bfloat16 tensors detached from the model's
  float32 ones, which the step reads and writes under no_grad.
- `.to(torch.bfloat16)` of float32 is round-to-nearest-even, the reference's to_bf16.
- The draws are the reference's numpy arrays (NOTE [ One bit stream, both trees ] in
  common/recipes_train.py) as tensors: torch.randint would draw other integers.
- torch.optim.Optimizer.load_state_dict casts the float32 moments of a checkpoint back to
  the bfloat16 parameters' dtype.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from common.recipes_train import BitStream, weight_draws
from torch_impl.optim_sr import AdamWSR


class BF16SR(AdamWSR):
    """AdamWSR over bfloat16 copies of the model's float32 parameters (reference/
    recipes_train.py), drawing from `bits`."""

    def __init__(self, params: Iterable[torch.Tensor], bits: BitStream, lr: float = 1e-3,
                 weight_decay: float = 1e-2, **kwargs: Any) -> None:
        self.weights = list(params)
        with torch.no_grad():
            for p in self.weights:
                if p.dtype != torch.float32:
                    raise TypeError(f"BF16SR: the model's parameters must be float32, got "
                                    f"{str(p.dtype).removeprefix('torch.')}")
                p.copy_(p.to(torch.bfloat16))
        super().__init__([p.detach().to(torch.bfloat16) for p in self.weights], lr=lr,
                         weight_decay=weight_decay, **kwargs)
        self.bits = bits

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.weights:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        super().zero_grad(set_to_none)

    @torch.no_grad()
    def step(self) -> None:  # type: ignore[override]
        """One update of every weight with a gradient (reference/recipes_train.py)."""
        pairs = list(zip(self.weights, self.param_groups[0]["params"], strict=True))
        drawn = []
        for p, w in pairs:
            w.copy_(p)
            w.grad = None if p.grad is None else p.grad.to(torch.bfloat16)
            if p.grad is not None:
                drawn.append(p)
        draws = weight_draws(self.bits, [tuple(p.shape) for p in drawn])
        super().step([torch.from_numpy(d).to(p.device) for d, p in zip(draws, drawn,
                                                                       strict=True)])
        for p, w in pairs:
            p.copy_(w)

    def state_dict(self) -> dict[str, Any]:
        """AdamWSR's, its bfloat16 moments widened to float32 (exact)."""
        state = super().state_dict()
        state["state"] = {i: {name: (v.float() if v.dtype == torch.bfloat16 else v)
                              for name, v in entries.items()}
                          for i, entries in state["state"].items()}
        return state
