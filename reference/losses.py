"""The losses of the compact model, on the same tape as the layers (reference/module.py).

A loss is one autograd node with two inputs: `forward(input, target)` returns the loss and
saves what its backward needs; `backward(grad_output=1)` returns d loss / d input (the
target gets no gradient). torch's twins are torch.nn.MSELoss and torch.nn.CrossEntropyLoss
themselves (torch_impl has no losses of its own).

    MSELoss           l = (x - t)^2, reduced         dx = 2 (x - t) g [/ n]
                                                           saves "self", "target"
    CrossEntropyLoss  l_i = -log softmax(x_i)[t_i]   dx = (softmax(x) - onehot(t)) g [/ N]
                                                           saves "result" (log-probs), "target"

Reductions: "mean" (the sum divided by n elements for MSE, by N rows for cross-entropy),
"sum", "none". The elementwise terms and the gradients follow torch's CPU kernels operation
by operation; only the reductions' summation order and the elementary functions (exp, log)
differ (the nn claims in parity/claims/nn.py).

Under autocast (reference/amp.py) both are fp32 ops: an lp input is cast to float32 (exact)
and that float32 copy is what they save; backward returns the gradient in the input's own
dtype, rounding the float32 gradient to lp as the cast's backward (ToCopyBackward0) does.
"""

from __future__ import annotations

import numpy as np

from reference import amp
from reference.module import Node, check_float, check_grad

REDUCTIONS = ("mean", "sum", "none")


class Loss(Node):
    """Base of the losses: `loss = fn(input, target)`, then `fn.backward(grad_output)`."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self._in_dtype = np.dtype(np.float32)  # forward's input dtype, for backward's cast
        if reduction not in REDUCTIONS:
            raise ValueError(f"{type(self).__name__}: reduction must be one of {REDUCTIONS}, "
                             f"got {reduction!r}")
        self.reduction = reduction

    def __repr__(self) -> str:
        return f"{type(self).__name__}(reduction={self.reduction!r})"

    def forward(self, x: np.ndarray, target: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def backward(self, grad_output: np.ndarray | float = 1.0) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, x: np.ndarray, target: np.ndarray) -> np.ndarray:
        return self.forward(x, target)


class MSELoss(Loss):
    """l = (x - t)^2 elementwise, then mean / sum / none; dx = 2 (x - t) g, / n for mean."""

    def forward(self, x: np.ndarray, target: np.ndarray) -> np.ndarray:
        x, target = check_float(self, x), np.asarray(target)
        self._in_dtype = x.dtype
        if target.dtype in amp.FLOATS:  # under autocast, both go to float32
            x, target = amp.apply(amp.decide("mse_loss", x.dtype, target.dtype), x, target)
        if target.shape != x.shape or target.dtype != x.dtype:
            raise ValueError(f"{self!r}: target must match input {x.shape} {x.dtype}, "
                             f"got {target.shape} {target.dtype}")
        self.save_for_backward({"self": x, "target": target})
        d = x - target
        loss = d * d
        if self.reduction == "mean":
            return np.asarray(loss.mean(dtype=x.dtype))
        return np.asarray(loss.sum(dtype=x.dtype)) if self.reduction == "sum" else loss

    def backward(self, grad_output: np.ndarray | float = 1.0) -> np.ndarray:
        saved = self.pop_saved()
        x, target = saved["self"], saved["target"]
        c = x.dtype.type
        shape = x.shape if self.reduction == "none" else ()
        g = check_grad(self, np.asarray(grad_output, dtype=x.dtype), shape)
        norm = c(2.0 / x.size) if self.reduction == "mean" else c(2.0)
        dx = (x - target) * norm * g  # torch: sub, mul_(norm), mul_(grad)
        return amp.cast(dx, self._in_dtype)


class CrossEntropyLoss(Loss):
    """l_i = logsumexp(x_i) - x_i[t_i] for logits (N, C) or (C,) and integer classes t.

    log_softmax(x) = (x - m) - log(sum exp(x - m)), m = max x (torch's stable form); reduction
    "mean" divides the sum by N (no class weights, no ignore_index, no label smoothing).
    """

    def forward(self, x: np.ndarray, target: np.ndarray) -> np.ndarray:
        x, target = check_float(self, x), np.asarray(target)
        if x.ndim not in (1, 2) or target.shape != x.shape[:-1]:
            raise ValueError(f"{self!r}: expected logits (N, C) with target (N,) or (C,) with "
                             f"target (), got {x.shape} and {target.shape}")
        if target.dtype.kind not in "iu":
            raise TypeError(f"{self!r}: target must hold integer classes, got {target.dtype}")
        self._in_dtype = x.dtype
        d = amp.decide("cross_entropy_loss", x.dtype)  # fp32 on CPU; CUDA lists
        if d.cast is None:  # its parts instead, log_softmax (fp32 there) then nll_loss
            d = amp.decide("log_softmax", x.dtype)
        (x,) = amp.apply(d, x)
        if np.any((target < 0) | (target >= x.shape[-1])):
            raise ValueError(f"{self!r}: target classes must lie in [0, {x.shape[-1]})")
        shifted = x - x.max(axis=-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # (N, C)
        self.save_for_backward({"result": logp, "target": target.astype(np.int64)})
        nll = -np.take_along_axis(logp, target[..., None].astype(np.intp), axis=-1)[..., 0]
        if self.reduction == "none" or x.ndim == 1:
            return nll if self.reduction == "none" else np.asarray(nll)
        total = nll.sum(dtype=x.dtype)
        return np.asarray(total / x.dtype.type(x.shape[0]) if self.reduction == "mean" else total)

    def backward(self, grad_output: np.ndarray | float = 1.0) -> np.ndarray:
        saved = self.pop_saved()
        logp, target = saved["result"], saved["target"]
        c = logp.dtype.type
        shape = logp.shape[:-1] if self.reduction == "none" else ()
        g = check_grad(self, np.asarray(grad_output, dtype=logp.dtype), shape)
        if self.reduction == "mean" and logp.ndim == 2:
            g = g / c(logp.shape[0])
        onehot = np.zeros_like(logp)
        np.put_along_axis(onehot, target[..., None].astype(np.intp), c(1), axis=-1)
        grad_logp = -onehot * np.asarray(g)[..., None]  # nll backward
        dx = grad_logp - np.exp(logp) * grad_logp.sum(axis=-1, keepdims=True)
        return amp.cast(dx, self._in_dtype)
