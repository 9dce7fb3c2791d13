"""Training the compact model in both trees with each tree's train.train_step: free runs
(the learning curve, the scale trajectory) and synced runs (torch given the reference's
parameters before every step), with the per-step bound of claim loss_scaling.train."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from parity.compare import as_numpy
from parity.drivers.loss_scaling import U32, models
from parity.drivers.optim import FUSED
from reference import amp as ramp
from reference import loss_scaling as rls
from reference import nn as rnn
from reference import optim as ropt
from torch_impl import loss_scaling as tls


def regression_batch(rng: np.random.Generator, n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """x ~ N(0, 1)^(n, 8), y = tanh(x w) for a fixed w: a task the model learns in 60 steps."""
    w = np.linspace(-1.0, 1.0, 8, dtype=np.float32).reshape(8, 1)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    return x, np.tanh(x @ w).astype(np.float32)


class TrainPair:
    """Both trees' model, SGD and scaler; `step` runs each tree's train.train_step once."""

    def __init__(self, precision: str, *, lr: float = 0.1, init_scale: float = 2.0**16,
                 growth_interval: int = 10, max_grad_norm: float | None = 1.0,
                 fault: str | None = None, device: str = "cpu", recompute: str = "none"
                 ) -> None:
        from reference import recompute as rrc
        from reference import train as rtrain
        from torch_impl import train as ttrain

        self.rtrain, self.ttrain = rtrain, ttrain
        self.precision, self.max_grad_norm, self.fault = precision, max_grad_norm, fault
        self.lr, self.device = lr, device
        self.ref, self.tm = models(device=device)
        self.schedule = (None if recompute == "none"  # one plan for both trees (plain data)
                         else rrc.parse_schedule(recompute, len(self.ref)))
        self.ref_opt = ropt.SGD(self.ref.parameters(), lr=lr, fma=FUSED)
        self.torch_opt = torch.optim.SGD(self.tm.parameters(), lr=lr)
        kwargs = {"init_scale": init_scale, "growth_interval": growth_interval}
        scaler_precision = "fp32" if fault == "fp16_without_scaler" else precision
        self.ref_scaler = rls.make_scaler(scaler_precision, **kwargs)
        self.torch_scaler = tls.make_scaler(scaler_precision, device, **kwargs)

    def step(self, x: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
        """(reference StepResult, torch StepResult) of one step on the batch (x, y)."""
        from parity.drivers.amp import float32_accumulation

        r = self.rtrain.train_step(self.ref, rnn.MSELoss(), self.ref_opt, self.ref_scaler, x,
                                   y, precision=self.precision, schedule=self.schedule,
                                   max_grad_norm=self.max_grad_norm, fault=self.fault)
        with float32_accumulation(self.device):  # as step_gradients computes them
            t = self.ttrain.train_step(self.tm, torch.nn.MSELoss(), self.torch_opt,
                                       self.torch_scaler, torch.from_numpy(x).to(self.device),
                                       torch.from_numpy(y).to(self.device),
                                       precision=self.precision, schedule=self.schedule,
                                       max_grad_norm=self.max_grad_norm, fault=self.fault)
        return r, t

    def sync(self) -> None:
        """Give torch the reference's parameters (bit copies); SGD without momentum and the
        scaler (compared step by step) hold no other state that could differ."""
        with torch.no_grad():
            for p, tp in zip(self.ref.parameters(), self.tm.parameters(), strict=True):
                tp.copy_(torch.from_numpy(p.data))

    def params(self) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """(name, reference, torch) copies of the parameters now."""
        return [(name, p.data.copy(), as_numpy(tp).copy()) for (name, p), tp
                in zip(self.ref.named_parameters(), self.tm.parameters(), strict=True)]


def train_runs(precision: str, steps: int = 60, seed: int = 2, **kwargs: Any) -> dict[str, Any]:
    """train_step `steps` times in both trees on the same batches, each tree on its own
    (free running): {"ref": [StepResult], "torch": [StepResult], "params": [...]}."""
    pair = TrainPair(precision, **kwargs)
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"ref": [], "torch": []}
    for _ in range(steps):
        r, t = pair.step(*regression_batch(rng))
        out["ref"].append(r)
        out["torch"].append(t)
    out["params"] = pair.params()
    return out


def loss_reduction(results: list[Any], k: int = 5) -> float:
    """1 - mean(last k losses) / mean(first k losses)."""
    losses = np.array([r.loss for r in results])
    return float(1.0 - losses[-k:].mean() / losses[:k].mean())


def step_gradients(pair: TrainPair, x: np.ndarray, y: np.ndarray, scale: float
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(reference, torch) unscaled, unclipped parameter gradients of one forward and backward
    of scale * MSE loss from the pair's current parameters: what train_step computes before
    clipping (amp.model_* bounds their difference layer by layer)."""
    from parity.drivers.amp import torch_autocast_run

    fmt = ramp.autocast_dtype(pair.precision)
    if fmt is None:
        raise ValueError("step_gradients: the per-step bound covers fp16 and bf16 runs")
    loss_fn = rnn.MSELoss()
    with np.errstate(over="ignore", invalid="ignore"):
        with ramp.autocast(fmt):
            loss_fn(pair.ref(x), y)
        pair.ref.zero_grad()
        pair.ref.backward(loss_fn.backward(np.float32(scale)))
    pair.tm.zero_grad()
    torch_autocast_run(pair.tm, x, y, fmt, scale, pair.device)
    s = np.float32(scale)
    return [(p.grad / s, as_numpy(tp.grad) / s)
            for p, tp in zip(pair.ref.parameters(), pair.tm.parameters(), strict=True)]


def spacing32(v: np.ndarray) -> np.ndarray:
    """The float32 spacing at |v| (2^-149 in the subnormal range)."""
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.abs(np.asarray(v, dtype=np.float64))))
    return np.ldexp(1.0, (np.maximum(np.where(np.isfinite(e), e, -126), -126) - 23
                          ).astype(np.int64))


def step_bound(grads: list[tuple[np.ndarray, np.ndarray]], max_norm: float | None, lr: float,
               params_after: list[np.ndarray]) -> list[np.ndarray]:
    """The per-element bound B of loss_scaling.train on |p_ref - p_torch| after one step from
    the same parameters, given each tree's unclipped gradients g_r, g_t (unscaling by a
    power of two is exact), u = 2^-24:
        clip coefficient   c = min(1, max_norm / (||g|| + 1e-6)); the two trees' norms
                           differ by <= ||g_r - g_t||_2 + (n + m + 6) u ||g|| (the bound of
                           loss_scaling.clip_grad_norm), so their coefficients by
                           dc = c ((n + m + 16) u + ||g_r - g_t||_2 / ||g||), 0 when both
                           clamp to 1
        SGD                p' = p - lr c g: the values before the final rounding differ by
                           D = lr (c |g_r - g_t| + |g| dc)(1 + 4u) + 2u lr c |g|, and two
                           round-to-nearest results by D + (s(p'_t) + s(|p'_t| + D + s(p'_t)))/2,
                           s the float32 spacing
    """
    g_t = [np.abs(t.astype(np.float64)) for _, t in grads]
    dg = [np.abs(r.astype(np.float64) - t) for r, t in grads]
    norm = float(np.sqrt(sum(np.sum(g * g) for g in g_t)))
    dnorm = float(np.sqrt(sum(np.sum(d * d) for d in dg)))
    n, m = max(g.size for g in g_t), len(g_t)
    c, dc = 1.0, 0.0
    if max_norm is not None:
        margin = dnorm + (n + m + 6) * U32 * norm
        c = min(1.0, max_norm / (norm - margin + 1e-6)) if norm > margin else 1.0
        if norm + margin + 1e-6 >= max_norm * (1 - 4 * U32):  # a tree may clip
            dc = c * ((n + m + 16) * U32 + dnorm / max(norm - margin, 1e-30))
    bounds = []
    for d, g, p in zip(dg, g_t, params_after, strict=True):
        before = lr * (c * d + g * dc) * (1 + 4 * U32) + 2 * U32 * lr * c * g
        s = spacing32(p)
        bounds.append(before + (s + spacing32(np.abs(p.astype(np.float64)) + before + s)) / 2)
    return bounds


def synced_steps(precision: str, steps: int = 60, seed: int = 2, device: str = "cpu",
                 **kwargs: Any) -> list[dict[str, Any]]:
    """`steps` steps of each tree's train_step, torch given the reference's parameters
    before every step; per step: both StepResults, (name, ref, torch) parameters after it,
    and the bound B of each (0 for a skipped step: the parameters must not move)."""
    pair = TrainPair(precision, device=device, **kwargs)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        x, y = regression_batch(rng)
        pair.sync()
        scale = pair.ref_scaler.get_scale() if pair.ref_scaler.is_enabled() else 1.0
        grads = step_gradients(pair, x, y, scale)
        r, t = pair.step(x, y)
        params = pair.params()
        if r.skipped:
            bounds = [np.zeros(a.shape) for _, a, _ in params]
        else:
            bounds = step_bound(grads, pair.max_grad_norm, pair.lr, [b for _, _, b in params])
        out.append({"ref": r, "torch": t, "params": params, "bounds": bounds})
    return out
