"""Optimizers with torch.optim's semantics, rounding for rounding.

Per parameter p with gradient g, in p's dtype (float32 or float64); `fma(a, b, c)` is
a * b + c rounded ONCE (reference/fma.py), every other operation rounds once as usual, and
every Python float hyperparameter is first cast to p's dtype (NOTE [ Scalars are cast to
the dtype ]):

    SGD(lr, momentum, dampening, nesterov, weight_decay, maximize):
        g <- -g                                  if maximize
        g <- fma(p, wd, g)                       if wd != 0
        b <- copy(g)                             first step, if momentum != 0
        b <- fma(g, 1 - dampening, b * momentum) later steps
        g <- fma(b, momentum, g) if nesterov else b
        p <- fma(g, -lr, p)

    Adam(lr, betas=(beta1, beta2), eps, weight_decay, amsgrad, maximize), AdamW:
        t <- t + 1                               (a float32 0-d array, like torch's step)
        p <- p * (1 - lr * wd)                   AdamW (decoupled weight decay)
        g <- fma(p, wd, g)                       Adam with wd != 0
        m <- lerp(m, g, 1 - beta1)               m = exp_avg
        v <- fma(g * (1 - beta2), g, v * beta2)  v = exp_avg_sq
        v_max <- max(v_max, v); v <- v_max       amsgrad (v_max = max_exp_avg_sq)
        c1 = 1 - beta1**t; c2 = 1 - beta2**t     Python float64 scalars
        p <- p + ((-lr / c1) * m) / (sqrt(v) / c2**0.5 + eps)

Where torch's kernels do not fuse (ATEN_CPU_CAPABILITY=default), pass `fma=False`: every
fma above then rounds twice, like NumPy's `a * b + c` (NOTE [ FMA in torch's CPU kernels ]
in reference/fma.py). `sqrt` is IEEE's (np.sqrt) unless Adam is given another; torch's MKL
builds round it differently (NOTE [ torch's CPU sqrt is MKL's ]).

The learning-rate schedules are in reference/lr_scheduler.py (built on this module's
Optimizer; this module does not import it). torch's twins are torch.optim's classes themselves,
bound under these names in torch_impl/optim.py; torch_impl/state_mapping.py converts state
between the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from common.arg_ranges import (
    ADAM_BETAS,
    ADAM_EPSILONS,
    ADAM_LRS,
    ADAM_WEIGHT_DECAYS,
    SGD_LRS,
    SGD_MOMENTA,
    SGD_WEIGHT_DECAYS,
)
from reference.fma import fma, lerp
from reference.module import Parameter

# NOTE [ torch's CPU sqrt is MKL's ]
# torch's CPU builds with MKL compute Tensor.sqrt through MKL VML, which is NOT correctly
# rounded: a fraction of float32 and float64 results is 1 ulp away from the IEEE square root
# (np.sqrt), on every CPU capability (it is MKL's own dispatch), at every size and position
# (docs/optim.md gives the measured fractions). No NumPy expression reproduces a closed
# library's rounding, so Adam takes the square root as a parameter: `sqrt=np.sqrt` (IEEE) by
# default; the parity tests pass torch's own sqrt to show that every OTHER operation is
# bit-identical, and measure the sqrt separately (parity claims optim.torch_sqrt_*).

# NOTE [ Scalars are cast to the dtype ]
# A Python float hyperparameter reaches the kernel as a c10::Scalar converted to the
# tensor's dtype (`value.to<scalar_t>()`), and float32 kernels compute in float32: torch's
# `v.mul_(beta2)` is float32(v * float32(beta2)), not float32(v * beta2) (they differ in a
# sizeable fraction of elements: docs/optim.md). So every scalar below goes through `dt(...)`,
# or `_checked(..., dt)` where torch's conversion is checked (NOTE [ A scalar torch converts
# with a check ]).

# NOTE [ A scalar torch converts with a check ]
# A Scalar passed as an op's `alpha=` or `value=` or as lerp's weight is converted by
# c10::checked_convert: a FINITE value outside the dtype's range raises
# `RuntimeError: value cannot be converted to type float without overflow` at the step
# (inf and NaN pass, as they convert exactly). One passed as a plain operand (`mul_(beta2)`,
# `add_(eps)`, `div_(c)`) is cast unchecked, to inf. torch's constructors check neither (an
# lr of 3.5e38 is built), so neither does the reference's; its step raises where torch's
# does, and computes with IEEE infinities and NaNs elsewhere, silently, as torch's kernels
# do (np.errstate in the steps: an lr of inf makes inf and NaN there, not an error).
_CONVERT_NAMES = {np.float32: "float", np.float64: "double"}


def _checked(x: float, dt: type) -> np.floating:
    """x cast to `dt` (np.float32 or np.float64), or torch's RuntimeError where x is finite
    and outside the dtype's range (NOTE [ A scalar torch converts with a check ])."""
    if math.isfinite(x) and abs(x) > float(np.finfo(dt).max):  # compared in float64
        raise RuntimeError(f"value cannot be converted to type {_CONVERT_NAMES[dt]} without "
                           "overflow")
    return dt(x)


def _cast(x: float, dt: type) -> np.floating:
    """x cast to `dt` unchecked: past its range, inf (torch's plain scalar operand)."""
    with np.errstate(over="ignore"):
        return dt(x)


class Optimizer:
    """torch.optim.Optimizer's bookkeeping: param_groups, per-parameter state, state_dict.

    `param_groups`: list of dicts, each {"params": [Parameter, ...], hyperparameter: value}
    (a group's values may be changed between steps; the constructor's keywords are the
    defaults). `state`: {Parameter: {name: array}}, filled lazily at the first step.
    `fma`: the rounding model of the kernels mirrored (NOTE [ FMA in torch's CPU kernels ]).
    """

    @staticmethod
    def _check_adam(lr: float, betas: tuple[float, float], eps: float) -> None:
        """torch.optim.Adam's checks of lr, betas and eps, with its messages (every Adam-like
        optimizer here, optim_sr's AdamWSR too, makes them), over the declared ranges
        (common/arg_ranges.py: torch writes `not 0.0 <= lr`, so NaN is refused)."""
        if lr not in ADAM_LRS:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps not in ADAM_EPSILONS:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if betas[0] not in ADAM_BETAS:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if betas[1] not in ADAM_BETAS:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any], fma: bool) -> None:
        if isinstance(params, (Parameter, np.ndarray)):
            raise TypeError(f"{type(self).__name__}: params should be an iterable of Parameters "
                            f"or dicts, but got {type(params).__name__}")
        self.defaults = defaults
        self.fma = fma
        self.state: dict[Parameter, dict[str, np.ndarray]] = {}
        self.param_groups: list[dict[str, Any]] = []
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Append a group; missing hyperparameters take the defaults (not validated, as torch)."""
        group = dict(param_group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, Parameter) else list(params)
        for p in group["params"]:
            if not isinstance(p, Parameter):
                raise TypeError(f"{type(self).__name__} can only optimize Parameters, "
                                f"but one of the params is {type(p).__name__}")
        for name, default in self.defaults.items():
            group.setdefault(name, default)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        ids = [id(p) for p in group["params"]]
        if len(set(ids)) != len(ids) or seen.intersection(ids):
            raise ValueError("some parameters appear more than once in the parameter groups")
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient (set_to_none) or zero it in place."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad[...] = 0

    def _grads(self, group: dict[str, Any]) -> Iterable[tuple[Parameter, np.ndarray]]:
        """The group's parameters that have a gradient, with the gradient checked."""
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.shape != p.data.shape or p.grad.dtype != p.data.dtype:
                raise ValueError(f"{type(self).__name__}: grad {p.grad.shape} {p.grad.dtype} "
                                 f"does not match parameter {p.data.shape} {p.data.dtype}")
            if p.data.dtype not in (np.float32, np.float64):
                raise TypeError(f"{type(self).__name__}: parameters must be float32 or "
                                f"float64, got {p.data.dtype}")
            yield p, p.grad

    def state_dict(self) -> dict[str, Any]:
        """{"state": {index: {name: array copy}}, "param_groups": [{..., "params": [index]}]}.

        Parameters are numbered 0, 1, ... in group order, as torch does; arrays are copies
        (torch hands out its live state tensors).
        """
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {index[id(p)]: {k: np.array(v, copy=True) for k, v in s.items()}
                 for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from `state_dict()`'s structure; float state is cast to its parameter's dtype."""
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(s["params"]) != len(g["params"]) for s, g in zip(saved, self.param_groups,
                                                                    strict=True)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match "
                             "the size of optimizer's group")
        by_index = {i: p for s, g in zip(saved, self.param_groups, strict=True)
                    for i, p in zip(s["params"], g["params"], strict=True)}
        self.state = {}
        for i, entries in state_dict["state"].items():
            p = by_index[i]
            self.state[p] = {}
            for name, value in entries.items():
                value = np.asarray(value)
                if name == "step":
                    self.state[p][name] = np.array(value, dtype=np.float32)
                    continue
                if value.shape != p.data.shape:
                    raise ValueError(f"{type(self).__name__}.load_state_dict: state[{i}]"
                                     f"[{name!r}] has shape {value.shape}, the parameter "
                                     f"{p.data.shape}")
                self.state[p][name] = value.astype(p.data.dtype, copy=True)
        self.param_groups = [{**{k: v for k, v in s.items() if k != "params"},
                              "params": g["params"]}
                             for s, g in zip(saved, self.param_groups, strict=True)]

    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        raise NotImplementedError


class SGD(Optimizer):
    """Stochastic gradient descent with momentum; state: {"momentum_buffer"} if momentum != 0."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0,
                 dampening: float = 0, weight_decay: float = 0, nesterov: bool = False, *,
                 maximize: bool = False, fma: bool = True) -> None:
        # torch's checks over the declared ranges (common/arg_ranges.py: torch writes
        # `lr < 0.0`, so NaN passes)
        if lr not in SGD_LRS:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum not in SGD_MOMENTA:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay not in SGD_WEIGHT_DECAYS:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening,
                    "weight_decay": weight_decay, "nesterov": nesterov, "maximize": maximize}
        super().__init__(params, defaults, fma)

    def step(self) -> None:
        with np.errstate(over="ignore", invalid="ignore"):  # IEEE, as torch's kernels
            for group in self.param_groups:
                self._step_group(group)

    def _step_group(self, group: dict[str, Any]) -> None:
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        for p, grad in self._grads(group):
            dt = p.data.dtype.type
            if group["maximize"]:
                grad = -grad
            if wd != 0:
                grad = fma(p.data, _checked(wd, dt), grad, self.fma)  # add(alpha=wd)
            if momentum != 0:
                state = self.state.setdefault(p, {})
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = grad.copy()
                else:  # buf.mul_(momentum).add_(grad, alpha=1 - dampening)
                    buf = fma(grad, _checked(1 - group["dampening"], dt),
                              buf * _cast(momentum, dt), self.fma)
                state["momentum_buffer"] = buf
                grad = (fma(buf, _checked(momentum, dt), grad, self.fma) if group["nesterov"]
                        else buf)
            np.copyto(p.data, fma(grad, _checked(-lr, dt), p.data, self.fma))


class Adam(Optimizer):
    """Adam; state: {"step" (float32 0-d), "exp_avg", "exp_avg_sq", "max_exp_avg_sq" if amsgrad}."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *, maximize: bool = False,
                 decoupled_weight_decay: bool = False, fma: bool = True,
                 sqrt: Callable[[np.ndarray], np.ndarray] = np.sqrt) -> None:
        self._check_adam(lr, betas, eps)
        if weight_decay not in ADAM_WEIGHT_DECAYS:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not (isinstance(betas[0], float) and isinstance(betas[1], float)):
            # torch's text: its betas may also be two tensors, the reference's may not
            raise ValueError("betas must be either both floats or both Tensors")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "amsgrad": amsgrad, "maximize": maximize,
                    "decoupled_weight_decay": decoupled_weight_decay}
        super().__init__(params, defaults, fma)
        self.sqrt = sqrt  # NOTE [ torch's CPU sqrt is MKL's ]

    def step(self) -> None:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # IEEE, as torch
            for group in self.param_groups:
                self._step_group(group)

    def _step_group(self, group: dict[str, Any]) -> None:
        lr, (beta1, beta2), wd = group["lr"], group["betas"], group["weight_decay"]
        for p, grad in self._grads(group):
            dt = p.data.dtype.type
            state = self.state.setdefault(p, {})
            if not state:  # lazy initialization, as torch
                state["step"] = np.array(0.0, dtype=np.float32)
                state["exp_avg"] = np.zeros_like(p.data)
                state["exp_avg_sq"] = np.zeros_like(p.data)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = np.zeros_like(p.data)
            if group["maximize"]:
                grad = -grad
            state["step"] += np.float32(1)
            if wd != 0:
                if group["decoupled_weight_decay"]:  # mul_(1 - lr * wd)
                    np.copyto(p.data, p.data * _cast(1 - lr * wd, dt))
                else:  # add(param, alpha=wd)
                    grad = fma(p.data, _checked(wd, dt), grad, self.fma)
            state["exp_avg"] = lerp(state["exp_avg"], grad, _checked(1 - beta1, dt), self.fma)
            state["exp_avg_sq"] = fma(grad * _checked(1 - beta2, dt), grad,  # addcmul value=
                                      state["exp_avg_sq"] * _cast(beta2, dt), self.fma)
            # NOTE [ Adam's bias corrections are Python floats ]
            # torch's for-loop path reads step with .item() and does the scalar math in
            # Python (float64, C pow); only the finished scalars meet the tensors.
            step = float(state["step"])
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            step_size = lr / bias_correction1
            bias_correction2_sqrt = bias_correction2**0.5
            v = state["exp_avg_sq"]
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = v = np.maximum(state["max_exp_avg_sq"], v)
            denom = self.sqrt(v) / _cast(bias_correction2_sqrt, dt) + _cast(group["eps"], dt)
            # addcdiv_(exp_avg, denom, value=-step_size)
            np.copyto(p.data, p.data + (_checked(-step_size, dt) * state["exp_avg"]) / denom)


class AdamW(Adam):
    """Adam with decoupled weight decay (torch.optim.AdamW: weight_decay defaults to 1e-2)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 fma: bool = True, sqrt: Callable[[np.ndarray], np.ndarray] = np.sqrt) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         decoupled_weight_decay=True, fma=fma, sqrt=sqrt)
