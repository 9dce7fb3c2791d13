"""The catalogue of seeded faults: deterministic ways to make a run go non-finite, for the
numerics detector (reference/numerics.py) to find. The catalogue itself is plain data in
reference/fault_catalogue.py (the torch tree reads it too); this module writes a fault.

A fault names where it strikes (a parameter of the model by its path, or the step's input
batch), the value it writes and at which index; the run loop seeds it before a chosen step
(`train(..., fault=, fault_step=)`, `python -m parity train --fault NAME --fault-step K`).
Each one's `what` says where it first shows in each precision and why, `fix` what repairs
it; docs/numerics.md tabulates what both trees report for each. torch_impl/faults.py writes
the same faults into a torch model.
"""

from __future__ import annotations

import numpy as np

from reference.fault_catalogue import FAULTS, Fault, fault_named  # noqa: F401
from reference.module import Module


def apply_fault(model: Module, fault: Fault, batch: tuple[np.ndarray, np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray]:
    """Write the fault's value into the model's parameter or into a copy of the batch; the
    batch to train on (a ValueError if the model has no such parameter)."""
    if fault.module == "batch":
        x = batch[0].copy()
        x[fault.index] = fault.value
        return x, batch[1]
    params = dict(model.named_parameters())
    name = f"{fault.module}.{fault.param}"
    if name not in params or params[name].data.ndim != len(fault.index):
        raise ValueError(f"fault {fault.name}: the model has no parameter {name} of "
                         f"{len(fault.index)} dimensions (sizes needs at least 3 layers)")
    params[name].data[fault.index] = fault.value
    return batch
