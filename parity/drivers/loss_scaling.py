"""Running the loss-scaling mechanisms of both trees on the same input: the two GradScaler
kernels one call at a time, the scaler state machine, clipping, float16 underflow, and whole
training runs of the compact model. The torch side runs on `device`."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from parity.compare import as_numpy
from parity.drivers.amp import float32_accumulation
from parity.drivers.optim import FUSED
from parity.strategies.loss_scaling import scaler_grad_stream, scaler_hyper
from reference import amp as ramp
from reference import clip_grad as rclip
from reference import loss_scale_kernels as kernels
from reference import loss_scaling as rls
from reference import nn as rnn
from reference import optim as ropt
from reference.nn import Parameter
from torch_impl import loss_scaling as tls
from torch_impl import nn as tnn
from torch_impl import state_mapping as tstate

U32 = 2.0**-24  # float32 unit roundoff


# -- the kernels, one call each
def random_scales(rng: np.random.Generator, n: int) -> np.ndarray:
    """Positive finite float32 scales: random bit patterns (subnormals to near max)."""
    bits = rng.integers(1, 0x7F800000, size=n, dtype=np.uint32)
    return bits.view(np.float32)


def update_pair(scale: float, tracker: int, found_inf: float, growth_factor: float,
                backoff_factor: float, growth_interval: int, device: str = "cpu"
                ) -> tuple[np.ndarray, np.ndarray]:
    """[scale bits, tracker] after one update from the same state: reference
    loss_scale_kernels.update_scale_ and torch._amp_update_scale_."""
    ours = (np.array(scale, dtype=np.float32), np.array(tracker, dtype=np.int32))
    kernels.update_scale_(*ours, np.array(found_inf, dtype=np.float32), growth_factor,
                          backoff_factor, growth_interval)
    t_scale = torch.full((), scale, dtype=torch.float32, device=device)
    t_tracker = torch.full((), tracker, dtype=torch.int32, device=device)
    torch._amp_update_scale_(t_scale, t_tracker, torch.full((), found_inf, device=device),
                             growth_factor, backoff_factor, growth_interval)
    theirs = as_numpy(t_scale), as_numpy(t_tracker)
    return (np.array([ours[0].view(np.int32), ours[1]], dtype=np.int64),
            np.array([theirs[0].view(np.int32), theirs[1]], dtype=np.int64))


def unscale_pair(grads: list[np.ndarray], scale: float, device: str = "cpu"
                 ) -> tuple[list[np.ndarray], list[np.ndarray], float, float]:
    """The non-finite check and unscale of the same float16/32/64 gradients: reference
    kernels.non_finite_check_and_unscale_ and torch's kernel (once per dtype group, as
    GradScaler calls it). Returns (reference grads, torch grads, found_inf ref, torch)."""
    ref_grads = [g.copy() for g in grads]
    found_ref = np.array(0.0, dtype=np.float32)
    kernels.non_finite_check_and_unscale_(ref_grads, found_ref,
                                          kernels.inv_scale(np.float32(scale)))
    t_grads = [torch.from_numpy(g.copy()).to(device) for g in grads]
    inv = torch.full((), scale, dtype=torch.float32, device=device).double().reciprocal().float()
    found = torch.zeros((), device=device)
    for dtype in {g.dtype for g in t_grads}:
        torch._amp_foreach_non_finite_check_and_unscale_(
            [g for g in t_grads if g.dtype == dtype], found, inv)
    return ref_grads, [as_numpy(g) for g in t_grads], float(found_ref), float(found)


def special_grads(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Gradients across magnitudes, with +inf, -inf or NaN planted at random."""
    mag = {np.float16: 24, np.float32: 140, np.float64: 300}[dtype]
    with np.errstate(over="ignore"):
        g = (rng.standard_normal(shape) * 2.0 ** rng.integers(-mag, mag // 2 + 1, shape)
             ).astype(dtype)
    kind = rng.integers(0, 5)
    if kind < 3 and g.size:
        g.reshape(-1)[rng.integers(g.size)] = (np.inf, -np.inf, np.nan)[kind]
    return g


# -- the scaler state machine: one pair, driven by tests and the report alike
class ScalerPair:
    """A reference and a torch GradScaler, each with SGD (momentum 0.5) over the same
    parameters; `iterate`, `save`, `load` and `compare` are the state machine's moves."""

    def __init__(self, hyper: dict[str, Any], shapes: list[tuple[int, ...]], seed: int,
                 device: str = "cpu") -> None:
        rng = np.random.default_rng(seed)
        init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        self.hyper, self.device = hyper, device
        self.ref_params = [Parameter(x.copy()) for x in init]
        self.torch_params = [torch.nn.Parameter(torch.from_numpy(x.copy()).to(device))
                             for x in init]
        self.ref_opt = ropt.SGD(self.ref_params, lr=0.1, momentum=0.5, fma=FUSED)
        self.torch_opt = torch.optim.SGD(self.torch_params, lr=0.1, momentum=0.5)
        self.ref = rls.GradScaler(**hyper)
        self.torch = tls.GradScaler(torch.device(device).type, **hyper)
        self.skips: tuple[bool, bool] = (False, False)
        self.saved: tuple[dict[str, Any], dict[str, Any]] | None = None

    def iterate(self, grads: list[np.ndarray], explicit_unscale: bool) -> None:
        """scale (a 1.0 loss), set the gradients, [unscale_], step, update: both sides."""
        self.ref.scale(np.float32(1.0))
        self.torch.scale(torch.tensor(1.0, device=self.device))
        for p, tp, g in zip(self.ref_params, self.torch_params, grads, strict=True):
            p.grad, tp.grad = g.copy(), torch.from_numpy(g.copy()).to(self.device)
        if explicit_unscale:
            self.ref.unscale_(self.ref_opt)
            self.torch.unscale_(self.torch_opt)
        self.ref.step(self.ref_opt)
        self.torch.step(self.torch_opt)
        self.skips = (rls.step_skipped(self.ref, self.ref_opt),
                      tls.step_skipped(self.torch, self.torch_opt))
        self.ref.update()
        self.torch.update()

    def save(self) -> None:
        """Keep both scalers' state_dicts (a checkpoint of the scalers)."""
        self.saved = (self.ref.state_dict(), self.torch.state_dict())
        if set(self.saved[0]) != set(self.saved[1]):
            raise ValueError(f"state_dict keys differ: {sorted(self.saved[0])} vs "
                             f"{sorted(self.saved[1])}")

    def load(self, cross: bool, live: bool) -> None:
        """Load the kept state_dicts (each tree the other's when `cross`): into new scalers,
        or into the live ones, whose scale and tracker have moved on since, when `live`."""
        if self.saved is None:
            raise RuntimeError("ScalerPair.load before save")
        ref_state, torch_state = self.saved[::-1] if cross else self.saved
        if not live:
            self.ref = rls.GradScaler(**self.hyper)
            self.torch = tls.GradScaler(torch.device(self.device).type, **self.hyper)
        self.ref.load_state_dict(ref_state)
        self.torch.load_state_dict(torch_state)

    def compare(self) -> list[tuple[str, Any, Any]]:
        """(label, reference, torch) for scale, tracker, skip, every grad and parameter."""
        pairs: list[tuple[str, Any, Any]] = [
            ("scale", np.float32(self.ref.get_scale()), np.float32(self.torch.get_scale())),
            ("tracker", np.int64(self.ref._get_growth_tracker()),
             np.int64(self.torch._get_growth_tracker())),
            ("skipped", np.bool_(self.skips[0]), np.bool_(self.skips[1])),
        ]
        for i, (p, tp) in enumerate(zip(self.ref_params, self.torch_params, strict=True)):
            pairs.append((f"param {i}", p.data, as_numpy(tp)))
            if p.grad is not None:
                pairs.append((f"grad {i}", p.grad, as_numpy(tp.grad)))
        return pairs


SCALER_SHAPES = [(3,), (2, 5)]


class ScalerStreams(RuleBasedStateMachine):
    """Both scalers, one gradient stream, state_dicts saved and loaded (into new or live
    scalers, across the trees) between steps; after every move each
    (label, reference, torch) of ScalerPair.compare goes to `judge`, which a test makes an
    assertion and the report a measurement (the one scaler state machine of the project)."""

    device = "cpu"

    def judge(self, label: str, a: Any, b: Any) -> None:
        raise NotImplementedError

    @initialize(hyper=scaler_hyper(), seed=st.integers(0, 2**16))
    def start(self, hyper: dict, seed: int) -> None:
        self.pair = ScalerPair(hyper, SCALER_SHAPES, seed, self.device)

    @rule(stream=scaler_grad_stream(SCALER_SHAPES), explicit_unscale=st.booleans())
    def iterate(self, stream: list[np.ndarray], explicit_unscale: bool) -> None:
        self.pair.iterate(stream, explicit_unscale)
        event("skipped" if self.pair.skips[1] else "stepped")

    @rule()
    def save(self) -> None:
        self.pair.save()

    @precondition(lambda self: hasattr(self, "pair") and self.pair.saved is not None)
    @rule(cross=st.booleans(), live=st.booleans())
    def load(self, cross: bool, live: bool) -> None:
        event("loaded into live scalers" if live else "loaded into new scalers")
        self.pair.load(cross, live)

    @invariant()
    def judged(self) -> None:
        if hasattr(self, "pair"):
            for label, a, b in self.pair.compare():
                self.judge(label, a, b)


# -- clipping
def norm_scale(grads: list[np.ndarray]) -> float:
    """S of loss_scaling.clip_grad_norm for the total norm: (n + m + 6) / 2 times the norm
    (n the largest tensor, m the number of tensors), so that |a - b| <= eps S."""
    n = max((g.size for g in grads), default=0)
    return (n + len(grads) + 6) / 2 * float(np.sqrt(sum(
        np.sum(g.astype(np.float64) ** 2) for g in grads)))


def clip_pair(grads: list[np.ndarray], max_norm: float, total_norm: float | None = None,
              foreach: bool | None = None, device: str = "cpu"
              ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Clip copies of the same float32 gradients in both trees: with `total_norm` given,
    clip_grads_with_norm_ with that norm on both sides (as a float32); otherwise
    clip_grad_norm_, each tree computing its own norm. Returns (reference norm, torch norm,
    reference grads, torch grads)."""
    ref_params = [Parameter(np.zeros_like(g)) for g in grads]
    t_params = [torch.nn.Parameter(torch.zeros(g.shape, device=device)) for g in grads]
    for p, tp, g in zip(ref_params, t_params, grads, strict=True):
        p.grad, tp.grad = g.copy(), torch.from_numpy(g.copy()).to(device)
    if total_norm is None:
        ref_norm = rclip.clip_grad_norm_(ref_params, max_norm)
        t_norm = tls.clip_grad_norm_(t_params, max_norm, foreach=foreach)
    else:
        ref_norm = np.array(total_norm, dtype=np.float32)
        t_norm = torch.tensor(total_norm, dtype=torch.float32, device=device)
        rclip.clip_grads_with_norm_(ref_params, max_norm, ref_norm)
        tls.clip_grads_with_norm_(t_params, max_norm, t_norm, foreach=foreach)
    return (np.asarray(ref_norm), as_numpy(t_norm), [p.grad for p in ref_params],
            [as_numpy(tp.grad) for tp in t_params])


def clipped_scale(grads: list[np.ndarray], max_norm: float) -> list[np.ndarray]:
    """S of loss_scaling.clip_grad_norm for each clipped gradient: (n + m + 16) / 2 c |g| with
    c the clip coefficient from the exact norm (0 where both trees' coefficients are 1)."""
    n, m = max(g.size for g in grads), len(grads)
    norm = float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads)))
    margin = (n + m + 6) * U32 * norm  # how far each tree's norm may be from the exact one
    c = min(1.0, max_norm / (norm - margin + 1e-6)) if norm > margin else 1.0
    unclipped = norm + margin + 1e-6 < max_norm * (1 - 4 * U32)  # both coefficients clamp to 1
    return [np.zeros(g.shape) if unclipped else (n + m + 16) / 2 * c * np.abs(
        g.astype(np.float64)) for g in grads]


# -- the compact model in both trees
def models(sizes: tuple[int, ...] = (8, 32, 32, 1), seed: int = 1, device: str = "cpu"
           ) -> tuple[rnn.Sequential, torch.nn.Sequential]:
    """The same compact model twice (reference weights copied into torch)."""
    ref = rnn.make_mlp(sizes, "gelu", rng=np.random.default_rng(seed))
    tm = tnn.make_mlp(sizes, "gelu", generator=torch.Generator().manual_seed(seed))
    tm.load_state_dict(tstate.state_dict_to_torch(ref.state_dict()))
    return ref, tm.to(device)


# -- fault 1: float16 without scaling
def underflow_models(seed: int = 1, device: str = "cpu"
                     ) -> tuple[rnn.Sequential, torch.nn.Sequential]:
    """A compact model whose output layer starts small (weights * 2^-10, as small-init output
    layers do): the gradients reaching the earlier layers are ~2^-10 smaller."""
    ref, tm = models((16, 64, 64, 4), seed)
    ref[4].weight.data *= np.float32(2.0**-10)
    tm.load_state_dict(tstate.state_dict_to_torch(ref.state_dict()))
    return ref, tm.to(device)


def underflow_batch(seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((256, 16)).astype(np.float32),
            (rng.standard_normal((256, 4)) * 0.1).astype(np.float32))


def underflow_grads(scale: float, dtype: str = "float16", device: str = "cpu"
                    ) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, reference grad, torch grad) of one autocast backward of S * loss, unscaled."""
    ref, tm = underflow_models(device=device)
    x, y = underflow_batch()
    loss_fn = rnn.MSELoss()
    with ramp.autocast(dtype):
        loss_fn(ref(x), y)
    ref.backward(loss_fn.backward(np.float32(scale)))
    with float32_accumulation(device):
        with torch.autocast(torch.device(device).type, dtype=getattr(torch, dtype)):
            loss = torch.nn.functional.mse_loss(tm(torch.from_numpy(x).to(device)),
                                                torch.from_numpy(y).to(device))
        (loss * torch.tensor(scale, dtype=torch.float32, device=device)).backward()
    return [(name, p.grad / np.float32(scale), as_numpy(tp.grad) / np.float32(scale))
            for (name, p), tp in zip(ref.named_parameters(), tm.parameters(), strict=True)]


def underflow_fractions(scale: float, dtype: str = "float16") -> dict[str, float]:
    """Per parameter: the fraction of the reference's gradient elements that are exactly 0."""
    return {name: float(np.mean(a == 0)) for name, a, _ in underflow_grads(scale, dtype)}
