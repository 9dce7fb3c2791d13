"""The catalogue of seeded faults: deterministic ways to make a run go non-finite, for the
numerics detector (reference/numerics.py) to find. The catalogue itself is plain data in
reference/fault_catalogue.py (the torch tree reads it too); this module writes a fault.

A fault is written for one model (the MLP or the transformer) and names its writes: where
each strikes (a parameter of the model by its path, a module's attribute such as a
LayerNorm's eps, or the step's input batch), the value and at which index; the run loop
seeds it before a chosen step (`train(..., fault=, fault_step=)`,
`python -m parity train --fault NAME --fault-step K`).
Each one's `what` says where it first shows in each precision and why, `fix` what repairs
it; docs/numerics.md tabulates what both trees report for each. torch_impl/faults.py writes
the same faults into a torch model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from reference.fault_catalogue import FAULTS, Fault, Write, check_model, fault_named  # noqa: F401
from reference.module import Module


def apply_fault(model: Module, fault: Fault, batch: tuple[np.ndarray, np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray]:
    """Make the fault's writes into the model's parameters and attributes or into a copy of
    the batch; the batch to train on (a ValueError if the model has no such place)."""
    for w in fault.writes:
        if w.target == "batch.x":
            x = batch[0].copy()
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
            data = _parameter(model, fault, w).data
            if w.how == "multiply":
                data[_index(w)] *= data.dtype.type(w.value)
            else:
                data[_index(w)] = w.value
    return batch


def _index(w: Write) -> tuple[int | slice, ...]:
    return tuple(slice(None) if i is None else i for i in w.index)


def _parameter(model: Module, fault: Fault, w: Write) -> Any:
    params = dict(model.named_parameters())
    if w.target not in params or (w.index and params[w.target].data.ndim != len(w.index)):
        raise ValueError(f"fault {fault.name}: the model has no parameter {w.target} of "
                         f"{len(w.index)} dimensions (the faults of --model {fault.model}; "
                         "the MLP's need at least 3 layers)")
    return params[w.target]
