"""The compact model on a tape of saved tensors: layers with explicit forward and backward.

Every module works like one PyTorch autograd node. `forward(x)` computes the output and
records, under a name, each tensor its `backward` will need (the node's "saved tensors");
`backward(grad_output)` reads only those, frees them, accumulates parameter gradients into
`Parameter.grad` (summed across backwards until `zero_grad`, as in torch) and returns the
gradient with respect to the input. Parameters are not put on the tape: a module reads its
own weights at backward, as torch reads the parameter it saved by reference.

    Linear     y = x W^T + b                  W: (out, in)   saves input as (N, in)   "input"
               dx = g W,  dW += g^T x,  db += sum_N g
    ReLU       y = max(x, 0)                  dx = g [y > 0]                    saves "result"
    Tanh       y = tanh(x)                    dx = g * (1 - y^2)                saves "result"
    GELU       tanh:  y = x/2 (1 + tanh(k (x + 0.044715 x^3))),  k = sqrt(2/pi)  saves "self"
               none:  y = x/2 (1 + erf(x / sqrt 2))  (exact; erf from math.erf, per element)
    Dropout    y = x * m,  m = keep / (1 - p),  keep ~ Bernoulli(1 - p)         saves "mask"
               (training only; identity in eval or when p = 0; m in the input dtype)
    MSELoss    l = (x - t)^2, reduced             dx = 2 (x - t) g [/ n]  saves "self", "target"
    CrossEntropyLoss  l_i = -log softmax(x_i)[t_i]   dx = (softmax(x) - onehot(t)) g [/ N]
                                                          saves "result" (log-probs), "target"

Saved-tensor names follow PyTorch's (`grad_fn._saved_result`, `_saved_self`), except
Linear's "input" (torch: `_saved_mat1`, the input flattened to (N, in)) and Dropout's
"mask" (torch: `_saved_other` of a multiplication). See docs/model.md for the table.
Every elementwise formula is evaluated in the parameters' dtype with the operation order of
PyTorch's CPU kernels (NOTE [ GELU formulas ]), so the two differ only by libm vs SLEEF
rounding and by BLAS accumulation order.

Activation checkpointing is built on this (see DESIGN.md): `free_saved()` drops a
segment's tape, re-running `forward` records a fresh one, and `generators()` lists every
generator a forward draws from so its `bit_generator.state` can be captured and restored.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class Parameter:
    """A trainable array: `.data` (the values) and `.grad` (None until a backward)."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = np.asarray(data)
        self.grad: np.ndarray | None = None

    def accumulate(self, grad: np.ndarray) -> None:
        """grad <- grad + g (torch accumulates into .grad; the first backward assigns it)."""
        self.grad = grad.copy() if self.grad is None else self.grad + grad

    def __repr__(self) -> str:
        return f"Parameter(shape={self.data.shape}, dtype={self.data.dtype})"


@dataclass(frozen=True)
class SavedTensor:
    """One entry of the tape: which module saved what, and how many bytes it holds."""

    module: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


class Module:
    """Base class: parameters, children, the tape of saved tensors, train/eval."""

    def __init__(self) -> None:
        self.training = True
        self._params: dict[str, Parameter] = {}
        self._children: dict[str, Module] = {}
        self._saved: dict[str, np.ndarray] = {}

    # -- the tape
    def save_for_backward(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Record named tensors for backward (replacing any earlier tape of this module)."""
        self._saved = dict(tensors)

    def saved_tensors(self) -> dict[str, np.ndarray]:
        """This module's own saved tensors, by name (empty after backward)."""
        return dict(self._saved)

    def pop_saved(self) -> dict[str, np.ndarray]:
        """Hand the tape to backward and free it; an error if forward has not recorded one."""
        if not self._saved and self._needs_tape():
            raise RuntimeError(f"{self!r}: backward without a forward (the tape is empty)")
        saved, self._saved = self._saved, {}
        return saved

    def _needs_tape(self) -> bool:
        return True

    def free_saved(self) -> None:
        """Drop the tape of this module and all its children (what a checkpoint discards)."""
        for m in self.modules():
            m._saved = {}

    def tape(self, prefix: str = "") -> list[SavedTensor]:
        """Every saved tensor held now, with module path, name, shape, dtype and bytes."""
        return [
            SavedTensor(name, key, tuple(a.shape), str(a.dtype), int(a.nbytes))
            for name, m in self.named_modules(prefix)
            for key, a in m._saved.items()
        ]

    # -- structure
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, child in self._children.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """("0.weight", p), ... in registration order, as torch names them."""
        for path, m in self.named_modules(prefix):
            for name, p in m._params.items():
                yield (f"{path}.{name}" if path else name), p

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def generators(self) -> dict[str, np.random.Generator]:
        """Every generator a forward draws from, by module path (for recompute and resume)."""
        return {path: m.rng for path, m in self.named_modules() if isinstance(m, Dropout)}

    def zero_grad(self) -> None:
        """Set every .grad to None (torch's default, set_to_none=True)."""
        for p in self.parameters():
            p.grad = None

    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    # -- state
    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameter name -> a copy of its values (same keys and layouts as torch)."""
        return {name: p.data.copy() for name, p in self.named_parameters()}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Copy values in; keys, shapes and dtypes must match exactly (torch's strict=True)."""
        params = dict(self.named_parameters())
        missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        if missing or unexpected:
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for name, p in params.items():
            value = np.asarray(state[name])
            if value.shape != p.data.shape or value.dtype != p.data.dtype:
                raise ValueError(
                    f"load_state_dict: {name} expects {p.data.shape} {p.data.dtype}, "
                    f"got {value.shape} {value.dtype}"
                )
            p.data = value.copy()

    # -- calling
    def forward(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.forward(x)


def _check_float(module: Module, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{module!r}: expected a float32 or float64 array, got {x.dtype}")
    return x


def _check_grad(module: Module, grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    grad = np.asarray(grad)
    if grad.shape != shape:
        raise ValueError(f"{module!r}: expected grad_output of shape {shape}, got {grad.shape}")
    return grad


class Linear(Module):
    """y = x W^T + b, W of shape (out_features, in_features) as in torch.nn.Linear.

    Initialization is torch's: kaiming_uniform(a=sqrt(5)) for W and U(-1/sqrt(in), 1/sqrt(in))
    for b, i.e. both uniform on [-1/sqrt(in), 1/sqrt(in)], drawn from `rng` (float64 draws
    rounded to `dtype`; the distribution, not the draws, is torch's).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 rng: np.random.Generator, dtype: type = np.float32) -> None:
        super().__init__()
        if np.dtype(dtype) not in FLOAT_DTYPES:
            raise TypeError(f"Linear: dtype must be float32 or float64, got {np.dtype(dtype)}")
        if in_features < 1 or out_features < 1:
            raise ValueError(f"Linear: sizes must be positive, got ({in_features}, {out_features})")
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        w = rng.uniform(-bound, bound, size=(out_features, in_features))
        self.weight = self._params["weight"] = Parameter(w.astype(dtype))
        self.bias: Parameter | None = None
        if bias:
            self.bias = self._params["bias"] = Parameter(
                rng.uniform(-bound, bound, size=out_features).astype(dtype))

    def __repr__(self) -> str:
        return f"Linear({self.in_features}, {self.out_features})"

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = _check_float(self, x)
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"{self!r}: expected input (..., {self.in_features}), got {x.shape}")
        if x.dtype != self.weight.data.dtype:
            raise TypeError(f"{self!r}: input is {x.dtype} but the weights are "
                            f"{self.weight.data.dtype}")
        x2 = x.reshape(-1, self.in_features)  # (N, in): a view, as torch's mat1
        y2 = x2 @ self.weight.data.T  # (N, out)
        if self.bias is not None:
            y2 = y2 + self.bias.data
        self.save_for_backward({"input": x2})
        self._in_shape = x.shape
        return y2.reshape(*x.shape[:-1], self.out_features)

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        x2 = self.pop_saved()["input"]  # (N, in)
        g = _check_grad(self, grad_output, (*self._in_shape[:-1], self.out_features))
        g2 = g.reshape(-1, self.out_features)  # (N, out)
        self.weight.accumulate(g2.T @ x2)  # (out, in)
        if self.bias is not None:
            self.bias.accumulate(g2.sum(axis=0))
        return (g2 @ self.weight.data).reshape(self._in_shape)


class ReLU(Module):
    """y = max(x, 0); backward passes g where the saved result is positive.

    Written as torch's kernels compare: y = (x < 0 ? 0 : x) keeps -0 and NaN, and
    dx = (y <= 0 ? 0 : g) passes the gradient through NaN.
    """

    def __repr__(self) -> str:
        return "ReLU()"

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = _check_float(self, x)
        y = np.where(x < 0, x.dtype.type(0), x)
        self.save_for_backward({"result": y})
        return y

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        y = self.pop_saved()["result"]
        g = _check_grad(self, grad_output, y.shape)
        return np.where(y <= 0, g.dtype.type(0), g)


class Tanh(Module):
    """y = tanh(x); dx = g * (1 - y*y) from the saved result."""

    def __repr__(self) -> str:
        return "Tanh()"

    def forward(self, x: np.ndarray) -> np.ndarray:
        y = np.tanh(_check_float(self, x))
        self.save_for_backward({"result": y})
        return y

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        y = self.pop_saved()["result"]
        g = _check_grad(self, grad_output, y.shape)
        return g * (y.dtype.type(1) - y * y)


# NOTE [ GELU formulas ]
# Both trees evaluate GELU in the input dtype with the constants PyTorch's CPU kernel
# (aten/src/ATen/native/cpu/GeluKernel.cpp) rounds to that dtype:
#   tanh:  beta = sqrt(2) * (2/sqrt(pi)) / 2,  kappa = 0.044715
#          inner = beta * (x + kappa * x^3);  y = 0.5 * x * (1 + tanh(inner))
#          dy/dx = 0.5 * (1 + t) + 0.5 * x * (1 - t^2) * beta * (1 + 3 kappa x^2)
#   none:  y = x * 0.5 * (1 + erf(x * sqrt(1/2)))
#          dy/dx = 0.5 * (1 + erf(x * sqrt(1/2))) + x * (2/sqrt(pi)) sqrt(1/2) / 2 * exp(-x^2/2)
# The only remaining differences are the elementary functions (libm/NumPy vs SLEEF),
# each within about one ulp; parity/tolerances.py derives the bounds from that.
_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5
_KAPPA = 0.044715
_SQRT1_2 = math.sqrt(0.5)
_PDF_ALPHA = (2.0 / math.sqrt(math.pi)) * _SQRT1_2 * 0.5
_erf64 = np.vectorize(math.erf, otypes=[np.float64])


def _erf(x: np.ndarray) -> np.ndarray:
    """erf per element via math.erf in float64 (<= 1 ulp), rounded to x's dtype."""
    return _erf64(x.astype(np.float64)).astype(x.dtype)


class GELU(Module):
    """GELU with approximate="tanh" or "none" (exact, erf-based); saves its input "self"."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def __repr__(self) -> str:
        return f"GELU(approximate={self.approximate!r})"

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = _check_float(self, x)
        c = x.dtype.type
        self.save_for_backward({"self": x})
        if self.approximate == "tanh":
            inner = c(_BETA) * (x + c(_KAPPA) * (x * x * x))
            return c(0.5) * x * (c(1) + np.tanh(inner))
        return x * c(0.5) * (c(1) + _erf(x * c(_SQRT1_2)))

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        x = self.pop_saved()["self"]
        g = _check_grad(self, grad_output, x.shape)
        c = x.dtype.type
        if self.approximate == "tanh":
            x_sq = x * x
            t = np.tanh(c(_BETA) * (x + c(_KAPPA) * (x_sq * x)))
            left, right = c(0.5) * x, c(1) + t
            left_derivative = c(0.5) * right
            right_derivative = left * (c(1) - t * t) * c(_BETA) * (c(1) + c(3 * _KAPPA) * x_sq)
            return g * (left_derivative + right_derivative)
        cdf = c(0.5) * (c(1) + _erf(x * c(_SQRT1_2)))
        pdf = c(_PDF_ALPHA) * np.exp(x * x * c(-0.5))
        return g * (cdf + x * pdf)


# NOTE [ Dropout mask ]
# PyTorch's CPU dropout (aten/src/ATen/native/Dropout.cpp, _dropout_impl) draws
# noise = bernoulli(1 - p) in the input dtype, divides it in place by (1 - p) (a float32
# division for float32 input), returns input * noise and saves noise for backward
# (MulBackward0._saved_other). p == 0 or eval returns the input itself and saves nothing;
# p == 1 multiplies by a 0-dim zero. The two generators differ, so parity feeds torch's
# mask to the reference through `forward(x, mask=...)`; the reference's own draws are
# keep = rng.random(shape) < 1 - p.
class Dropout(Module):
    """Training: y = x * keep / (1 - p) with keep ~ Bernoulli(1 - p) from `rng`; eval: y = x."""

    def __init__(self, p: float = 0.5, *, rng: np.random.Generator) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"Dropout: rng must be a numpy.random.Generator, got {type(rng)}")
        self.p, self.rng = p, rng

    def __repr__(self) -> str:
        return f"Dropout(p={self.p})"

    def _needs_tape(self) -> bool:
        return self.training and 0.0 < self.p

    def forward(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """`mask`: a boolean keep-mask to use instead of drawing one (parity, recompute)."""
        x = _check_float(self, x)
        self._shape = x.shape
        if not self.training or self.p == 0.0:
            self.save_for_backward({})
            return x
        c = x.dtype.type
        if self.p == 1.0:
            noise = np.zeros((), dtype=x.dtype)
        else:
            if mask is None:
                keep = self.rng.random(x.shape) < 1.0 - self.p
            else:
                keep = np.asarray(mask)
                if keep.shape != x.shape or keep.dtype != np.bool_:
                    raise ValueError(f"{self!r}: mask must be bool of shape {x.shape}, "
                                     f"got {keep.dtype} {keep.shape}")
            noise = keep.astype(x.dtype) / c(1.0 - self.p)
        self.save_for_backward({"mask": noise})
        return x * noise

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        saved = self.pop_saved()
        g = _check_grad(self, grad_output, self._shape)
        return g * saved["mask"] if "mask" in saved else g


class Sequential(Module):
    """Children named "0", "1", ...; forward in order, backward in reverse."""

    def __init__(self, *layers: Module) -> None:
        super().__init__()
        for i, layer in enumerate(layers):
            self._children[str(i)] = layer

    def __repr__(self) -> str:
        return "Sequential(" + ", ".join(map(repr, self._children.values())) + ")"

    def __getitem__(self, i: int) -> Module:
        return list(self._children.values())[i]

    def __len__(self) -> int:
        return len(self._children)

    def _needs_tape(self) -> bool:
        return False

    def forward(self, x: np.ndarray) -> np.ndarray:
        for layer in self._children.values():
            x = layer.forward(x)
        return x

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        for layer in reversed(self._children.values()):
            grad_output = layer.backward(grad_output)
        return grad_output


_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(name: str, reduction: str) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{name}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return reduction


class MSELoss(Module):
    """l = (x - t)^2 elementwise, then mean / sum / none; dx = 2 (x - t) g, / n for mean."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = _check_reduction("MSELoss", reduction)

    def __repr__(self) -> str:
        return f"MSELoss(reduction={self.reduction!r})"

    def forward(self, x: np.ndarray, target: np.ndarray) -> np.ndarray:  # type: ignore[override]
        x, target = _check_float(self, x), np.asarray(target)
        if target.shape != x.shape or target.dtype != x.dtype:
            raise ValueError(f"{self!r}: target must match input {x.shape} {x.dtype}, "
                             f"got {target.shape} {target.dtype}")
        self.save_for_backward({"self": x, "target": target})
        d = x - target
        loss = d * d
        if self.reduction == "mean":
            return np.asarray(loss.mean(dtype=x.dtype))
        return np.asarray(loss.sum(dtype=x.dtype)) if self.reduction == "sum" else loss

    def __call__(self, x: np.ndarray, target: np.ndarray) -> np.ndarray:  # type: ignore[override]
        return self.forward(x, target)

    def backward(self, grad_output: np.ndarray | float = 1.0) -> np.ndarray:
        saved = self.pop_saved()
        x, target = saved["self"], saved["target"]
        c = x.dtype.type
        shape = x.shape if self.reduction == "none" else ()
        g = _check_grad(self, np.asarray(grad_output, dtype=x.dtype), shape)
        norm = c(2.0 / x.size) if self.reduction == "mean" else c(2.0)
        return (x - target) * norm * g  # torch: sub, mul_(norm), mul_(grad)


class CrossEntropyLoss(Module):
    """l_i = logsumexp(x_i) - x_i[t_i] for logits (N, C) or (C,) and integer classes t.

    log_softmax(x) = (x - m) - log(sum exp(x - m)), m = max x (torch's stable form); reduction
    "mean" divides the sum by N (no class weights, no ignore_index, no label smoothing).
    """

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = _check_reduction("CrossEntropyLoss", reduction)

    def __repr__(self) -> str:
        return f"CrossEntropyLoss(reduction={self.reduction!r})"

    def forward(self, x: np.ndarray, target: np.ndarray) -> np.ndarray:  # type: ignore[override]
        x, target = _check_float(self, x), np.asarray(target)
        if x.ndim not in (1, 2) or target.shape != x.shape[:-1]:
            raise ValueError(f"{self!r}: expected logits (N, C) with target (N,) or (C,) with "
                             f"target (), got {x.shape} and {target.shape}")
        if target.dtype.kind not in "iu":
            raise TypeError(f"{self!r}: target must hold integer classes, got {target.dtype}")
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

    def __call__(self, x: np.ndarray, target: np.ndarray) -> np.ndarray:  # type: ignore[override]
        return self.forward(x, target)

    def backward(self, grad_output: np.ndarray | float = 1.0) -> np.ndarray:
        saved = self.pop_saved()
        logp, target = saved["result"], saved["target"]
        c = logp.dtype.type
        shape = logp.shape[:-1] if self.reduction == "none" else ()
        g = _check_grad(self, np.asarray(grad_output, dtype=logp.dtype), shape)
        if self.reduction == "mean" and logp.ndim == 2:
            g = g / c(logp.shape[0])
        onehot = np.zeros_like(logp)
        np.put_along_axis(onehot, target[..., None].astype(np.intp), c(1), axis=-1)
        grad_logp = -onehot * np.asarray(g)[..., None]  # nll backward
        return grad_logp - np.exp(logp) * grad_logp.sum(axis=-1, keepdims=True)


ACTIVATIONS = ("relu", "tanh", "gelu", "gelu_tanh")


def _activation(name: str) -> Module:
    table = {"relu": ReLU, "tanh": Tanh, "gelu": GELU,
             "gelu_tanh": lambda: GELU(approximate="tanh")}
    if name not in table:
        raise ValueError(f"make_mlp: activation must be one of {ACTIVATIONS}, got {name!r}")
    return table[name]()


def make_mlp(sizes: Sequence[int], activation: str = "gelu", dropout: float = 0.0, *,
             rng: np.random.Generator, dtype: type = np.float32) -> Sequential:
    """Sequential(Linear, act, [Dropout], Linear, act, [Dropout], ..., Linear).

    sizes = (d_in, h_1, ..., d_out); a Dropout follows each activation when dropout > 0, and
    draws from `rng` too (the same generator that initialized the weights, after them).
    """
    if len(sizes) < 2:
        raise ValueError(f"make_mlp: sizes needs at least (d_in, d_out), got {tuple(sizes)}")
    _activation(activation)
    layers: list[Module] = []
    for i, (d_in, d_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(Linear(d_in, d_out, rng=rng, dtype=dtype))
        if i < len(sizes) - 2:
            layers.append(_activation(activation))
            if dropout > 0.0:
                layers.append(Dropout(dropout, rng=rng))
    return Sequential(*layers)
