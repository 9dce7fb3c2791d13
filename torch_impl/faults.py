"""The seeded faults in a torch model. See reference/faults.py for the catalogue (plain data,
imported here); only writing a value into a tensor differs."""

from __future__ import annotations

import torch
from torch import nn

from common.fault_catalogue import (  # noqa: F401  (plain data)
    FAULTS,
    Fault,
    Write,
    check_model,
    fault_named,
)


def apply_fault(model: nn.Module, fault: Fault, batch: tuple[torch.Tensor, torch.Tensor],
                optimizer: torch.optim.Optimizer | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """reference.faults.apply_fault, on a torch model and batch."""
    if fault.lr is not None:
        for group in optimizer.param_groups:  # type: ignore[union-attr]
            group["lr"] = fault.lr
    for w in fault.writes:
        if w.target == "batch.x":
            x = batch[0].clone()
            x[_index(w)] = w.value
            batch = (x, batch[1])
        elif w.how == "attribute":
            path, _, attr = w.target.rpartition(".")
            module = dict(model.named_modules()).get(path)
            if module is None or not isinstance(getattr(module, attr, None), float):
                raise ValueError(f"fault {fault.name}: the model has no module {path} with a "
                                 f"float attribute {attr}")
            setattr(module, attr, w.value)
        else:
            with torch.no_grad():
                data = _parameter(model, fault, w)
                if w.how == "multiply":
                    data[_index(w)] *= w.value
                else:
                    data[_index(w)] = w.value
    return batch


def _index(w: Write) -> tuple[int | slice, ...]:
    return tuple(slice(None) if i is None else i for i in w.index)


def _parameter(model: nn.Module, fault: Fault, w: Write) -> torch.Tensor:
    params = dict(model.named_parameters())
    if w.target not in params or (w.index and params[w.target].ndim != len(w.index)):
        raise ValueError(f"fault {fault.name}: the model has no parameter {w.target} of "
                         f"{len(w.index)} dimensions (the faults of --model {fault.model}; "
                         "the MLP's need at least 3 layers)")
    return params[w.target]


# ---------------------------------------------------------------- a loss written by hand

class HandWrittenCrossEntropy(nn.Module):
    """reference.faults.HandWrittenCrossEntropy: -mean(log(softmax(z)[i, y_i])), each op
    torch's own (torch.softmax, indexing, torch.log), the loss cast to float32."""

    composite = True

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(x, dim=-1)  # (N, C)
        picked = p[torch.arange(x.shape[0], device=x.device), target]  # (N,)
        return -torch.log(picked).float().mean()


LOSSES = {"hand_written_cross_entropy": HandWrittenCrossEntropy}


def loss_of(loss_fn: nn.Module) -> dict[str, str]:
    """{"loss": name} when `loss_fn` is a fault's loss (a replay file records it: the
    replay re-runs the step with it), else {}."""
    names = [n for n, cls in LOSSES.items() if isinstance(loss_fn, cls)]
    return {"loss": names[0]} if names else {}
