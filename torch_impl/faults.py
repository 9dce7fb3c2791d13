"""The seeded faults in a torch model. See reference/faults.py for the catalogue (plain data,
imported here); only writing a value into a tensor differs."""

from __future__ import annotations

import torch
from torch import nn

from reference.fault_catalogue import FAULTS, Fault, fault_named  # noqa: F401  (plain data)


def apply_fault(model: nn.Module, fault: Fault, batch: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """reference.faults.apply_fault, on a torch model and batch."""
    if fault.module == "batch":
        x = batch[0].clone()
        x[fault.index] = fault.value
        return x, batch[1]
    params = dict(model.named_parameters())
    name = f"{fault.module}.{fault.param}"
    if name not in params or params[name].ndim != len(fault.index):
        raise ValueError(f"fault {fault.name}: the model has no parameter {name} of "
                         f"{len(fault.index)} dimensions (sizes needs at least 3 layers)")
    with torch.no_grad():
        params[name][fault.index] = fault.value
    return batch
