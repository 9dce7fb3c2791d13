"""The compact model on a tape of saved tensors: layers with explicit forward and backward.

Every module works like one PyTorch autograd node (reference/module.py). `forward(x)`
computes the output and records, under a name, each tensor its `backward` will need (the
node's "saved tensors"); `backward(grad_output)` reads only those, frees them, accumulates
parameter gradients into `Parameter.grad` (summed across backwards until `zero_grad`, as in
torch) and returns the gradient with respect to the input. Parameters are not put on the
tape: a module reads its own weights at backward, as torch reads the parameter it saved by
reference.

    Linear     y = x W^T + b                  W: (out, in)   saves input as (N, in)   "input"
               dx = g W,  dW += g^T x,  db += sum_N g
    ReLU       y = max(x, 0)                  dx = g [y > 0]                    saves "result"
    Tanh       y = tanh(x)                    dx = g * (1 - y^2)                saves "result"
    GELU       tanh:  y = x/2 (1 + tanh(k (x + 0.044715 x^3))),  k = sqrt(2/pi)  saves "self"
               none:  y = x/2 (1 + erf(x / sqrt 2))  (exact; erf from math.erf, per element)
    Dropout    y = x * m,  m = keep / (1 - p),  keep ~ Bernoulli(1 - p)         saves "mask"
               (training only; identity in eval or when p = 0; m in the input dtype)

The losses (MSELoss, CrossEntropyLoss) take a target besides the input: reference/losses.py
(re-exported here for `from reference.nn import MSELoss`).

Saved-tensor names follow PyTorch's (`grad_fn._saved_result`, `_saved_self`), except
Linear's "input" (torch: `_saved_mat1`, the input flattened to (N, in)) and Dropout's
"mask" (torch: `_saved_other` of a multiplication). See docs/model.md for the table.
Every elementwise formula is evaluated in the parameters' dtype with the operation order of
PyTorch's CPU kernels (NOTE [ GELU formulas ]), so the two differ only by libm vs SLEEF
rounding and by BLAS accumulation order.

Activation checkpointing (reference/recompute.py) is built on this: `free_saved()` drops a
segment's tape, re-running `forward` records a fresh one, and `generators()` lists every
generator a forward draws from so its `bit_generator.state` can be captured and restored.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence

import numpy as np

from reference import amp
from reference.losses import CrossEntropyLoss, MSELoss  # noqa: F401  (re-exported: old path)
from reference.module import (  # noqa: F401  (FLOAT_DTYPES, Node, SavedTensor re-exported)
    FLOAT_DTYPES,
    Module,
    Node,
    Parameter,
    SavedTensor,
    check_float,
    check_grad,
)

# NOTE [ Spurious BLAS flags ]
# NumPy warns "invalid value encountered in matmul" when the FPU's invalid flag is set after
# the BLAS call, and OpenBLAS's kernels can leave that flag set for finite inputs and finite
# outputs (seen once in a suite run: a bf16-autocast MLP whose inputs and product were all
# finite). A reference that turned such a flag into a failure would fail on the BLAS, not on
# its math. So the flag is not read: the product itself is checked, and the warning raised
# only when it holds a NaN that no NaN in the operands explains (an inf - inf in the sums,
# or an inf times 0: real invalid operations), as NumPy's np.errstate says (ignore, warn or
# raise). Overflow warnings are left as NumPy gives them.


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b, warning of an invalid operation by the product's values, not by the FPU flags
    the BLAS leaves behind (NOTE [ Spurious BLAS flags ])."""
    mode = np.geterr()["invalid"]  # the caller's np.errstate, honoured as NumPy would
    with np.errstate(invalid="ignore"):
        y = a @ b
    if mode != "ignore" and np.isnan(y).any() and not (np.isnan(a).any() or np.isnan(b).any()):
        if mode == "raise":
            raise FloatingPointError("invalid value encountered in matmul")
        warnings.warn("invalid value encountered in matmul", RuntimeWarning, stacklevel=2)
    return y


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
        self._in_shape: tuple[int, ...] = ()  # forward's input shape, for backward's reshape
        self._in_dtype = self._out_dtype = np.dtype(dtype)  # forward's, for backward's casts
        bound = 1.0 / math.sqrt(in_features)
        w = rng.uniform(-bound, bound, size=(out_features, in_features))
        self.weight = Parameter(w.astype(dtype))
        self.bias: Parameter | None = None
        if bias:
            self.bias = Parameter(
                rng.uniform(-bound, bound, size=out_features).astype(dtype))

    def __repr__(self) -> str:
        return f"Linear({self.in_features}, {self.out_features})"

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = check_float(self, x)
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"{self!r}: expected input (..., {self.in_features}), got {x.shape}")
        b = None if self.bias is None else self.bias.data
        d = amp.decide("linear", x.dtype, self.weight.data.dtype)
        x_c, w, b = amp.apply(d, x, self.weight.data, b)  # the casts (lp under autocast)
        if x_c.dtype != w.dtype:
            raise TypeError(f"{self!r}: input is {x_c.dtype} but the weights are {w.dtype}")
        x2 = x_c.reshape(-1, self.in_features)  # (N, in): a view, as torch's mat1
        y2 = matmul(amp.wide(x2), amp.wide(w).T)  # (N, out), accumulated in the opmath dtype
        if b is not None:
            y2 = y2 + amp.wide(b)
        saved = {"input": x2} if w is self.weight.data else {"input": x2, "weight": w.T}
        self.save_for_backward(saved)  # a cast weight is a new tensor: torch saves it (mat2)
        self._in_shape, self._in_dtype, self._out_dtype = x.shape, x.dtype, d.result
        return amp.cast(y2, d.result).reshape(*x.shape[:-1], self.out_features)

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        saved = self.pop_saved()
        x2 = saved["input"]  # (N, in)
        w = saved["weight"].T if "weight" in saved else self.weight.data  # (out, in)
        g = check_grad(self, grad_output, (*self._in_shape[:-1], self.out_features))
        g2 = amp.wide(amp.cast(g, self._out_dtype).reshape(-1, self.out_features))  # (N, out)
        master = self.weight.data.dtype  # the casts' backward widens to it (exact)
        self.weight.accumulate(amp.cast(amp.cast(matmul(g2.T, amp.wide(x2)), w.dtype), master))
        if self.bias is not None:
            self.bias.accumulate(amp.cast(amp.cast(g2.sum(axis=0), w.dtype), master))
        dx = amp.cast(matmul(g2, amp.wide(w)), x2.dtype)  # (N, in)
        return amp.cast(dx, self._in_dtype).reshape(self._in_shape)


class ReLU(Module):
    """y = max(x, 0); backward passes g where the saved result is positive.

    Written as torch's kernels compare: y = (x < 0 ? 0 : x) keeps -0 and NaN, and
    dx = (y <= 0 ? 0 : g) passes the gradient through NaN.
    """

    def __repr__(self) -> str:
        return "ReLU()"

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = check_float(self, x)  # unlisted: runs in x's dtype, exactly (no rounding)
        y = np.where(x < 0, x.dtype.type(0), x)
        self.save_for_backward({"result": y})
        return y

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        y = self.pop_saved()["result"]
        g = amp.cast(check_grad(self, grad_output, y.shape), y.dtype)
        return np.where(y <= 0, g.dtype.type(0), g)


class Tanh(Module):
    """y = tanh(x); dx = g * (1 - y*y) from the saved result."""

    def __repr__(self) -> str:
        return "Tanh()"

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = check_float(self, x)
        y = amp.cast(np.tanh(amp.wide(x)), x.dtype)  # unlisted: opmath, one rounding
        self.save_for_backward({"result": y})
        return y

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        saved = self.pop_saved()["result"]
        g = amp.wide(amp.cast(check_grad(self, grad_output, saved.shape), saved.dtype))
        y = amp.wide(saved)
        return amp.cast(g * (y.dtype.type(1) - y * y), saved.dtype)


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
        x_in = check_float(self, x)
        self.save_for_backward({"self": x_in})
        x = amp.wide(x_in)  # unlisted: opmath, one rounding
        c = x.dtype.type
        if self.approximate == "tanh":
            inner = c(_BETA) * (x + c(_KAPPA) * (x * x * x))
            return amp.cast(c(0.5) * x * (c(1) + np.tanh(inner)), x_in.dtype)
        return amp.cast(x * c(0.5) * (c(1) + _erf(x * c(_SQRT1_2))), x_in.dtype)

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        x_in = self.pop_saved()["self"]
        return amp.cast(self._derivative(amp.wide(x_in), amp.wide(amp.cast(
            check_grad(self, grad_output, x_in.shape), x_in.dtype))), x_in.dtype)

    def _derivative(self, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        """g * GELU'(x) in x's dtype (NOTE [ GELU formulas ])."""
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
        self._shape: tuple[int, ...] = ()  # forward's input shape, for backward's check

    def __repr__(self) -> str:
        return f"Dropout(p={self.p})"

    def _needs_tape(self) -> bool:
        return self.training and 0.0 < self.p

    def forward(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """`mask`: a boolean keep-mask to use instead of drawing one (parity, recompute)."""
        x = check_float(self, x)
        self._shape = x.shape
        if not self.training or self.p == 0.0:
            self.save_for_backward({})
            return x
        c = amp.opmath(x.dtype).type  # unlisted: the mask is made in x's dtype
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
            noise = amp.cast(keep.astype(c) / c(1.0 - self.p), x.dtype)  # opmath division
        self.save_for_backward({"mask": noise})
        return amp.cast(amp.wide(x) * amp.wide(noise), x.dtype)

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        saved = self.pop_saved()
        g = check_grad(self, grad_output, self._shape)
        if "mask" not in saved:
            return g
        mask = saved["mask"]
        return amp.cast(amp.wide(amp.cast(g, mask.dtype)) * amp.wide(mask), mask.dtype)


class Sequential(Module):
    """Children named "0", "1", ...; forward in order, backward in reverse."""

    def __init__(self, *layers: Module) -> None:
        super().__init__()
        for i, layer in enumerate(layers):
            self.add_module(str(i), layer)

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

