"""Optimizers and learning-rate schedules with torch.optim's semantics, rounding for rounding.

Per parameter p with gradient g, in p's dtype (float32 or float64); `fma(a, b, c)` is
a * b + c rounded ONCE, every other operation rounds once as usual, and every Python
float hyperparameter is first cast to p's dtype (NOTE [ Scalars are cast to the dtype ]):

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

    lerp(s, e, w) = fma(w, e - s, s) if |w| < 0.5 else fma(w - 1, e - s, e)

Where torch's kernels do not fuse (ATEN_CPU_CAPABILITY=default), pass `fma=False`: every
fma above then rounds twice, like NumPy's `a * b + c`. `sqrt` is IEEE's (np.sqrt) unless
Adam is given another; torch's MKL builds round it differently (NOTE [ torch's CPU sqrt
is MKL's ]). The schedules StepLR,
CosineAnnealingLR and LinearLR are plain Python float arithmetic, written with torch's
recursive ("chainable") formulas; see NOTE [ Chainable schedules ].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from reference.nn import Parameter

# NOTE [ FMA in torch's CPU kernels ]
# torch's CPU kernels for add(alpha=), addcmul, lerp (and SGD/Adam are built from them) are
# written `self + alpha * other`. The vectorized body calls vec::fmadd, a hardware fused
# multiply-add on the AVX2 and AVX512 builds; the scalar tail (n mod 2*vector width
# elements, and 0-d tensors) is plain C++ that GCC contracts to an FMA too (GNU mode,
# -ffp-contract=fast). Measured on torch 2.13 (sizes 1..69, 1000, 40000, 100003, 300001):
# with capability AVX512 or AVX2 every element equals fma(a, b, c), in the body and in the
# tail; with ATEN_CPU_CAPABILITY=default no element is fused (two roundings everywhere).
# Unfused NumPy differs from the fused kernels (standard normal p, g; docs/optim.md):
# `p + (-lr) * g` in 2% of elements at lr = 0.0123 (more as |lr g| nears |p|), lerp in 11%
# (weight 0.1) to 46% (weight 0.9), addcmul in 0.26%. addcdiv `self + value * t1 / t2` ends in a
# division, so there is nothing to fuse and NumPy's three roundings match.

# NOTE [ torch's CPU sqrt is MKL's ]
# torch's CPU builds with MKL compute Tensor.sqrt through MKL VML, which is NOT correctly
# rounded: on this machine 17% of float32 and 1.2% of float64 results are 1 ulp away from
# the IEEE square root (np.sqrt), on every CPU capability (it is MKL's own dispatch), at
# every size and position. No NumPy expression reproduces a closed library's rounding, so
# Adam takes the square root as a parameter: `sqrt=np.sqrt` (IEEE) by default; the parity
# tests pass torch's own sqrt to show that every OTHER operation is bit-identical, and
# measure the sqrt separately (parity claims optim.torch_sqrt_*).

# NOTE [ Scalars are cast to the dtype ]
# A Python float hyperparameter reaches the kernel as a c10::Scalar converted to the
# tensor's dtype (`value.to<scalar_t>()`), and float32 kernels compute in float32: torch's
# `v.mul_(beta2)` is float32(v * float32(beta2)), not float32(v * beta2) (they differ in
# ~16% of elements). So every scalar below goes through `dt(...)` first.


def _add_round_to_odd(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x + y rounded to odd: exact sums as is, inexact ones to the neighbour with odd last bit.

    TwoSum (Knuth) gives the exact error e = (x + y) - s of s = fl(x + y); when e != 0 the
    exact sum lies strictly between s and its neighbour toward e, and round-to-odd picks
    whichever of the two has an odd significand.
    """
    s = x + y
    bb = s - x
    e = (x - (s - bb)) + (y - bb)
    uint = np.uint64 if s.dtype == np.float64 else np.uint32
    even = (np.asarray(s).view(uint) & uint(1)) == 0
    push = (e != 0) & even & np.isfinite(s)
    return np.where(push, np.nextafter(s, np.where(e > 0, np.inf, -np.inf).astype(s.dtype)), s)


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Veltkamp splitting: a = hi + lo exactly, each with at most 26 significant bits."""
    t = a * 134217729.0  # 2**27 + 1
    hi = t - (t - a)
    return hi, a - hi


# NOTE [ Exact FMA emulation ]
# float32: the product of two float32 (24 + 24 = 48 significant bits) is exact in float64
# (53 bits). The sum p + c rounded to float64 and then to float32 is a DOUBLE rounding that
# can go wrong: Figueroa's q >= 2p + 2 guarantee covers one operation on p-bit operands,
# not a 48-bit product plus a 24-bit addend. Counterexample: a = 2**-12 (1 + 2**-23),
# b = 2**-12 (1 - 2**-23), c = 1 + 2**-23; a*b + c = 1 + 2**-23 + 2**-24 - 2**-70 rounds to
# float64 as the exact float32 midpoint 1 + 2**-23 + 2**-24, which ties to even upward,
# while the true sum rounds down to c. Rounding the float64 sum to ODD instead (TwoSum
# error, then push an inexact even result one ulp toward the error) keeps the sticky
# information, and a round-to-odd result with >= p + 2 bits rounds correctly to p bits
# (Boldo and Melquiond 2008): 53 >= 24 + 2.
# float64: no wider type holds the product (np.longdouble is x87 80-bit here: 64 bits <
# 106), so use error-free transformations: a*b = uh + ul exactly (Dekker's TwoProduct with
# Veltkamp splitting), c + uh = th + tl exactly (TwoSum), then fma = RN(th + RO(tl + ul))
# (Boldo and Melquiond 2008, Algorithm 5.4). Exact while nothing overflows and the product
# does not underflow: |a|, |b| < 2**995 and |a*b| >= 2**-969 (or a*b == 0). Non-finite
# operands fall back to a * b + c, which gives the same inf/NaN as the hardware FMA.


def fma(a: Any, b: Any, c: Any, fused: bool = True) -> np.ndarray:
    """a * b + c rounded once to nearest-even in the operands' dtype (float32 or float64).

    With `fused=False`: a * b rounded, then + c rounded (the unfused kernels' rounding).
    """
    a, b, c = np.broadcast_arrays(np.asarray(a), np.asarray(b), np.asarray(c))
    dtype = a.dtype
    if b.dtype != dtype or c.dtype != dtype or dtype not in (np.float32, np.float64):
        raise TypeError(f"fma: operands must share dtype float32 or float64, got "
                        f"{a.dtype}, {b.dtype}, {c.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):
        if not fused:
            return np.asarray(a * b + c)
        if dtype == np.float32:
            wide = _add_round_to_odd(a.astype(np.float64) * b.astype(np.float64),
                                     c.astype(np.float64))
            return np.asarray(wide.astype(np.float32))
        uh = a * b
        (ah, al), (bh, bl) = _split(a), _split(b)
        ul = ((ah * bh - uh) + ah * bl + al * bh) + al * bl
        th = c + uh
        bb = th - c
        tl = (c - (th - bb)) + (uh - bb)
        exact = th + _add_round_to_odd(tl, ul)
        naive = uh + c
        return np.asarray(np.where(np.isfinite(naive), exact, naive))


def lerp(start: np.ndarray, end: np.ndarray, weight: np.floating, fused: bool = True
         ) -> np.ndarray:
    """torch.lerp with a scalar weight: start + weight * (end - start), torch's two branches.

    For |weight| >= 0.5 torch anchors at `end` (end - (end - start) * (1 - weight)), which is
    exact at weight = 1; the fused form is fma(weight - 1, end - start, end).
    """
    diff = end - start
    if abs(weight) < 0.5:
        return fma(weight, diff, start, fused)
    return fma(weight - weight.dtype.type(1), diff, end, fused)


class Optimizer:
    """torch.optim.Optimizer's bookkeeping: param_groups, per-parameter state, state_dict.

    `param_groups`: list of dicts, each {"params": [Parameter, ...], hyperparameter: value}
    (a group's values may be changed between steps; the constructor's keywords are the
    defaults). `state`: {Parameter: {name: array}}, filled lazily at the first step.
    `fma`: the rounding model of the kernels mirrored (NOTE [ FMA in torch's CPU kernels ]).
    """

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
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening,
                    "weight_decay": weight_decay, "nesterov": nesterov, "maximize": maximize}
        super().__init__(params, defaults, fma)

    def step(self) -> None:
        for group in self.param_groups:
            lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p, grad in self._grads(group):
                dt = p.data.dtype.type
                if group["maximize"]:
                    grad = -grad
                if wd != 0:
                    grad = fma(p.data, dt(wd), grad, self.fma)
                if momentum != 0:
                    state = self.state.setdefault(p, {})
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = grad.copy()
                    else:
                        buf = fma(grad, dt(1 - group["dampening"]), buf * dt(momentum), self.fma)
                    state["momentum_buffer"] = buf
                    grad = fma(buf, dt(momentum), grad, self.fma) if group["nesterov"] else buf
                np.copyto(p.data, fma(grad, dt(-lr), p.data, self.fma))


class Adam(Optimizer):
    """Adam; state: {"step" (float32 0-d), "exp_avg", "exp_avg_sq", "max_exp_avg_sq" if amsgrad}."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *, maximize: bool = False,
                 decoupled_weight_decay: bool = False, fma: bool = True,
                 sqrt: Callable[[np.ndarray], np.ndarray] = np.sqrt) -> None:
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "amsgrad": amsgrad, "maximize": maximize,
                    "decoupled_weight_decay": decoupled_weight_decay}
        super().__init__(params, defaults, fma)
        self.sqrt = sqrt  # NOTE [ torch's CPU sqrt is MKL's ]

    def step(self) -> None:
        for group in self.param_groups:
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
                    if group["decoupled_weight_decay"]:
                        np.copyto(p.data, p.data * dt(1 - lr * wd))
                    else:
                        grad = fma(p.data, dt(wd), grad, self.fma)
                state["exp_avg"] = lerp(state["exp_avg"], grad, dt(1 - beta1), self.fma)
                state["exp_avg_sq"] = fma(grad * dt(1 - beta2), grad,
                                          state["exp_avg_sq"] * dt(beta2), self.fma)
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
                denom = self.sqrt(v) / dt(bias_correction2_sqrt) + dt(group["eps"])
                np.copyto(p.data, p.data + (dt(-step_size) * state["exp_avg"]) / denom)


class AdamW(Adam):
    """Adam with decoupled weight decay (torch.optim.AdamW: weight_decay defaults to 1e-2)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 fma: bool = True, sqrt: Callable[[np.ndarray], np.ndarray] = np.sqrt) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         decoupled_weight_decay=True, fma=fma, sqrt=sqrt)


# NOTE [ Chainable schedules ]
# torch's get_lr() updates each group's CURRENT lr from the previous one (StepLR:
# lr * gamma every step_size steps; LinearLR and CosineAnnealingLR: lr times a ratio of
# consecutive factors), not from base_lr with the closed form. The recursion accumulates
# one rounding per step, so the closed form differs from it in the last bits (docs/optim.md
# gives the measured rates), and a resumed run must carry the current lr, not recompute
# it: state_dict() holds `_last_lr` and the optimizer's state_dict holds each group's lr.


class LRScheduler:
    """Sets each group's lr once at construction (step 0) and at every step().

    State (state_dict): every attribute except the optimizer: base_lrs (the groups'
    `initial_lr`), last_epoch, _step_count, _is_initial, _last_lr, and the schedule's own
    hyperparameters. Call optimizer.step() before scheduler.step(), as with torch.
    """

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        for i, group in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] when "
                               "resuming scheduler with last_epoch >= 0.")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._step_count = 0
        self._is_initial = True
        self.step()
        self._is_initial = False

    def get_lr(self) -> list[float]:
        """The next lr of every group (called by step() after last_epoch advanced)."""
        raise NotImplementedError

    def step(self) -> None:
        """Advance last_epoch and write the new lr into every param group."""
        self._step_count += 1
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        """The lrs the last step() wrote."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in vars(self).items()
                if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)

    def _lrs(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]


class StepLR(LRScheduler):
    """lr <- lr * gamma whenever last_epoch is a positive multiple of step_size."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._lrs()
        return [lr * self.gamma for lr in self._lrs()]


class LinearLR(LRScheduler):
    """Factor from start_factor to end_factor linearly over total_iters steps, recursively:
    lr_t = lr_{t-1} * (1 + (end - start) / (total_iters * start + (t - 1) * (end - start)))."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3,
                 end_factor: float = 1.0, total_iters: int = 5, last_epoch: int = -1) -> None:
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError("Starting multiplicative factor expected to be greater than 0 and "
                             "less or equal to 1.")
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0:
            return [lr * self.start_factor for lr in self._lrs()]
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._lrs()
        delta = self.end_factor - self.start_factor
        return [lr * (1.0 + delta / (self.total_iters * self.start_factor
                                     + (self.last_epoch - 1) * delta))
                for lr in self._lrs()]


class CosineAnnealingLR(LRScheduler):
    """eta_min + (base_lr - eta_min)(1 + cos(pi t / T_max)) / 2, recursively:
    lr_t = (1 + cos(pi t / T)) / (1 + cos(pi (t-1) / T)) * (lr_{t-1} - eta_min) + eta_min,
    with an additive step where the denominator vanishes (t - 1 - T a multiple of 2T)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,
                 last_epoch: int = -1) -> None:
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        t, T, eta_min = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return self._lrs()
        if self._step_count == 1 and t > 0:
            return [eta_min + (base - eta_min) * (1 + math.cos(t * math.pi / T)) / 2
                    for base in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:
            return [lr + (base - eta_min) * (1 - math.cos(math.pi / T)) / 2
                    for base, lr in zip(self.base_lrs, self._lrs(), strict=True)]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T))
                * (lr - eta_min) + eta_min for lr in self._lrs()]
