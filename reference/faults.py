"""The catalogue of seeded faults: deterministic ways to make a run go non-finite, for the
numerics detector (reference/numerics.py) to find. The catalogue itself is plain data in
common/fault_catalogue.py (the torch tree reads it too); this module writes a fault.

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

from common.fault_catalogue import FAULTS, Fault, Write, check_model, fault_named  # noqa: F401
from reference import amp
from reference.layers import softmax, softmax_backward
from reference.losses import Loss
from reference.module import Module, check_float


def apply_fault(model: Module, fault: Fault, batch: tuple[np.ndarray, np.ndarray],
                optimizer: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Make the fault's writes into the model's parameters and attributes or into a copy of
    the batch, and set the optimizer's learning rate if the fault has one; the batch to
    train on (a ValueError if the model has no such place)."""
    if fault.lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = fault.lr
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


# ---------------------------------------------------------------- a loss written by hand

def log(a: np.ndarray) -> np.ndarray:
    """torch.log: ln a in the opmath dtype, rounded once to a's dtype (log 0 = -inf)."""
    return amp.cast(np.log(amp.wide(a)), a.dtype)


class HandWrittenCrossEntropy(Loss):
    """The cross entropy as it is often written by hand, -mean(log(softmax(z)[i, y_i])):

        p = softmax(z)  (N, C), in z's dtype     picked_i = p[i, y_i]
        l = -mean(float32(log(picked)))

    It is the cross entropy in exact arithmetic, but softmax rounds first: when the target's
    logit trails the largest by more than ln(1 / smallest subnormal) (float32: 103.3;
    float16, a softmax in float16 under CPU autocast: 16.6), p underflows to exactly 0 at the
    target and log(0) = -inf (LogBackward0). In the backward d picked = -g / (N picked) is
    -inf there and softmax's backward p (g - sum p g) meets 0 * -inf: NaN
    (SoftmaxBackward0). torch's cross_entropy is log_softmax, (z - m) - log sum exp(z - m):
    no exp of the target's own gap is ever taken, so it stays finite.

    `composite`: the detector looks for the op inside it (numerics_locate.watch_ops), and
    `backward_nodes` holds each backward stage's output under torch's node name, in the
    order torch's engine runs them (the anomaly replay names the first holding a NaN).
    """

    composite = True

    def forward(self, x: np.ndarray, target: np.ndarray) -> np.ndarray:
        x, target = check_float(self, x), np.asarray(target)
        if x.ndim != 2 or target.shape != x.shape[:1] or target.dtype.kind not in "iu":
            raise ValueError(f"{self!r}: expected logits (N, C) and integer classes (N,), got "
                             f"{x.shape} and {target.shape} {target.dtype}")
        self._in_dtype = x.dtype
        p = softmax(x)  # (N, C)
        rows = np.arange(x.shape[0])
        picked = p[rows, target]  # (N,)
        logp = amp.cast(log(picked), np.dtype(np.float32))  # (N,)
        self.save_for_backward({"result": p, "target": target.astype(np.int64),
                                "picked": picked})
        return np.asarray(-logp.mean(dtype=np.float32))

    def backward(self, grad_output: np.ndarray | float = 1.0) -> np.ndarray:
        saved = self.pop_saved()
        p, target, picked = saved["result"], saved["target"], saved["picked"]
        n = picked.shape[0]
        g = -np.float32(grad_output)  # NegBackward0
        g_mean = np.full(n, g / np.float32(n), np.float32)  # MeanBackward0 (N,)
        g_log = amp.cast(g_mean, picked.dtype)  # ToCopyBackward0 (a no-op in float32)
        g_picked = amp.cast(amp.wide(g_log) / amp.wide(picked), picked.dtype)  # LogBackward0
        g_p = np.zeros_like(p)
        g_p[np.arange(n), target] = g_picked  # IndexBackward0 (N, C)
        dx = softmax_backward(g_p, p)  # SoftmaxBackward0 (N, C)
        self.backward_nodes = [("NegBackward0", np.asarray(g)), ("MeanBackward0", g_mean),
                               ("LogBackward0", g_picked), ("IndexBackward0", g_p),
                               ("SoftmaxBackward0", dx)]
        return amp.cast(dx, self._in_dtype)


LOSSES = {"hand_written_cross_entropy": HandWrittenCrossEntropy}


def loss_of(loss_fn: Loss) -> dict[str, str]:
    """{"loss": name} when `loss_fn` is a fault's loss (a replay file records it: the
    replay re-runs the step with it), else {}."""
    names = [n for n, cls in LOSSES.items() if isinstance(loss_fn, cls)]
    return {"loss": names[0]} if names else {}
