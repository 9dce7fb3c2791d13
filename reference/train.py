"""One training step over the compact model, in NumPy; the loop around it (checkpoints,
resume, faults, the numerics hook) and the checkpoint's inventory are common/train_loop.py.

This tree supplies what the loop cannot know: `train_step` (the step, line for line with
torch_impl/train.py's), and a Run that builds the objects and says where its random state
is (one numpy Generator: it initializes the weights and then draws every dropout mask, so
the run's random state is its bit_generator.state; a precision that rounds stochastically,
nvfp4 or bf16-sr, adds the run's BitStream: common/recipes_train.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from common import train_loop
from common.fp8_train import WEIGHT_PRECISIONS, autocast_precision, needs_bits
from common.recipes_train import BitStream
from common.train_config import OPTIMIZERS, TrainConfig
from common.train_loop import FAULTS, INVENTORY, Phase, StepResult, no_phase
from reference import amp, faults, loss_scaling, lr_scheduler, numerics, optim, resume
from reference.gpt import GPT
from reference.losses import Loss
from reference.nn import Module
from reference.recipes_train import BF16SR
from reference.recompute import Schedule
from reference.state_digest import state_digest
from reference.train_models import batch_of, build

__all__ = ["FAULTS", "INVENTORY", "Run", "StepResult", "TrainConfig", "restored", "state_digest",
           "train", "train_step"]


class Run(train_loop.BaseRun):
    """A training run's objects; the counters, the loop and the checkpoint are BaseRun's."""

    tree = train_loop.Tree(resume=resume, faults=faults, numerics=numerics)

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        c = config
        self.rng = np.random.default_rng(c.seed)  # initialization, then dropout
        self.bits = BitStream(c.seed) if needs_bits(c.precision) else None  # SR's bits
        parts = build(c, self.rng, self.bits)  # refuses a recompute spec this model cannot take
        self.model, self.loss_fn = parts.model, parts.loss_fn
        if c.precision in WEIGHT_PRECISIONS:  # bf16 weights, AdamWSR
            self.optimizer = BF16SR(self.model.parameters(), self.bits, lr=c.lr,
                                                  **OPTIMIZERS[c.optimizer])
        else:
            self.optimizer = getattr(optim, c.optimizer)(self.model.parameters(), lr=c.lr,
                                                         **OPTIMIZERS[c.optimizer])
        self.scheduler = _make_scheduler(self.optimizer, c)
        self.scaler = loss_scaling.make_scaler(autocast_precision(c.precision),
                                               init_scale=c.init_scale,
                                               growth_interval=c.growth_interval)
        self.task, self.sampler, self.loader = parts.task, parts.sampler, parts.loader
        self.schedule = parts.schedule

    def _batch(self, item: tuple) -> tuple[np.ndarray, np.ndarray]:
        return batch_of(self.config, item)

    def _step(self, x: np.ndarray, y: np.ndarray, phase: Phase) -> StepResult:
        # fp16 with a loss scale overflows on purpose now and then: the step is skipped, and
        # inf * 0 = NaN in the backward is how the scaler finds out (found_inf); a seeded
        # fault divides by zero (LayerNorm with eps 0): the numerics detector reports it
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return train_step(self.model, self.loss_fn, self.optimizer, self.scaler, x, y,
                              precision=autocast_precision(self.config.precision),
                              max_grad_norm=self.config.max_grad_norm, schedule=self.schedule,
                              fault=self.step_fault, phase=phase)

    def _rng_state(self) -> dict[str, Any]:
        rng = {"model": self.rng.bit_generator.state}  # a new dict at every read
        if self.bits is not None:
            rng["bits"] = self.bits.state()
        return rng

    def _load_rng(self, rng: Mapping[str, Any]) -> None:
        if "model" in rng:  # absent from a mapped state (NOTE [ Cross-implementation mapping ])
            self.rng.bit_generator.state = rng["model"]
        if self.bits is not None:
            self.bits.load(rng["bits"])

    def _disabled_scaler(self) -> loss_scaling.GradScaler:
        return loss_scaling.make_scaler("fp32")


def restored(config: TrainConfig, state: Mapping[str, Any], omit: tuple[str, ...] = ()) -> Run:
    """A new Run with `state` loaded: all or nothing (a failure leaves no half-restored run)."""
    return Run.restored(config, state, omit)  # type: ignore[return-value]


def train(config: TrainConfig | train_loop.Configure, steps: int,
          checkpoint_dir: str | Path | None = None,
          checkpoint_every: int = 0, **options: Any) -> Run:
    """common.train_loop.train with this tree's Run (`options`: that function's keywords)."""
    return train_loop.train(Run, config, steps, checkpoint_dir, checkpoint_every, **options)


def _make_scheduler(optimizer: optim.Optimizer, c: TrainConfig) -> lr_scheduler.LRScheduler:
    if c.schedule == "cosine":
        return lr_scheduler.CosineAnnealingLR(optimizer, T_max=c.horizon)
    if c.schedule == "step":
        return lr_scheduler.StepLR(optimizer, step_size=max(1, c.horizon // 4), gamma=0.5)
    return lr_scheduler.StepLR(optimizer, step_size=c.horizon + 1, gamma=1.0)


def train_step(model: Module, loss_fn: Loss, optimizer: Any,
               scaler: loss_scaling.GradScaler, x: np.ndarray, y: np.ndarray, *,
               precision: str, max_grad_norm: float | None = None,
               schedule: Schedule | None = None, fault: str | None = None,
               phase: Phase = no_phase) -> StepResult:
    """One mixed-precision step; torch_impl.train.train_step line for line.

    precision "fp32" | "bf16" | "fp16" picks the autocast dtype (amp.autocast_dtype);
    "fp16" requires an enabled scaler (make_scaler gives the right one for each). Order:
    zero_grad, autocast forward, float32 loss, scale(loss) backward, unscale_, clip the
    UNSCALED gradients (if max_grad_norm), step (skipped on inf/NaN), update.
    `fault` reproduces a classic mistake, for the tests and docs only (FAULTS):
    "fp16_without_scaler" lifts the fp16 guard, "clip_before_unscale" clips the scaled
    gradients (the threshold is then effectively max_grad_norm * S).
    `skipped` comes from the scaler's found_inf flags, read before update (step_skipped).
    `phase(name)` is entered around "forward", "backward" and "optimizer" (a profiler's
    timer; by default nothing).
    `schedule` (recompute.parse_schedule) runs the forward with checkpointed segments that
    backward recomputes (recompute.ScheduledRun); autocast and recomputation compose in every
    precision: a segment records the autocast state at forward and recomputes under it.
    A GPT `model` (x: token ids, y: next tokens) computes its own loss (`loss_fn` unused)
    and carries its own recomputation (recompute_gpt.set_recompute; `schedule` must be None).
    A scaled low-precision backward may overflow to inf and then NaN: that is the event the
    GradScaler checks for, so NumPy's overflow and invalid warnings are silenced there.
    """
    dtype = amp.autocast_dtype(precision)
    if fault not in FAULTS:
        raise ValueError(f"train_step: fault must be one of {FAULTS}, got {fault!r}")
    if precision == "fp16" and not scaler.is_enabled() and fault != "fp16_without_scaler":
        raise ValueError("train_step: precision 'fp16' needs an enabled GradScaler "
                         "(make_scaler('fp16')); bf16 and fp32 do not")
    if isinstance(model, GPT) and schedule is not None:
        raise ValueError("train_step: a GPT carries its own recomputation "
                         "(recompute_gpt.set_recompute); pass schedule=None")
    with phase("forward"):
        optimizer.zero_grad()
        with amp.autocast(dtype):
            if isinstance(model, GPT):  # its own cross-entropy (torch: loss_fn(model(x), y))
                _, loss = model.forward(x, y)
            else:
                runner = model if schedule is None else _scheduled(model, schedule)
                loss = loss_fn(runner.forward(x), y)  # fp32 op list: losses run in float32
    with phase("backward"), np.errstate(over="ignore", invalid="ignore"):
        seed = scaler.scale(np.ones_like(loss))  # d(S loss)/dloss
        if isinstance(model, GPT):
            model.backward(seed)
        else:
            runner.backward(loss_fn.backward(seed))
    with phase("optimizer"):
        return _optimizer_phase(model, optimizer, scaler, float(loss), max_grad_norm, fault)


def _optimizer_phase(model: Module, optimizer: Any, scaler: loss_scaling.GradScaler,
                     loss: float, max_grad_norm: float | None, fault: str | None
                     ) -> StepResult:
    """unscale_, clip the unscaled gradients, step unless inf/NaN, update the scale."""
    grad_norm = None
    if fault == "clip_before_unscale" and max_grad_norm is not None:
        grad_norm = loss_scaling.clip_grad_norm_(model.parameters(), max_norm=max_grad_norm)
    scaler.unscale_(optimizer)
    if max_grad_norm is not None and fault != "clip_before_unscale":
        grad_norm = loss_scaling.clip_grad_norm_(model.parameters(), max_norm=max_grad_norm)
    scale = scaler.get_scale()
    scaler.step(optimizer)
    skipped = loss_scaling.step_skipped(scaler, optimizer)
    scaler.update()
    return StepResult(loss, scale, skipped, None if grad_norm is None else float(grad_norm))


def _scheduled(model: Module, schedule: Schedule) -> Any:
    """The recompute adapter: the model's forward/backward under a checkpointing schedule."""
    from reference import recompute

    return recompute.ScheduledRun(model, schedule)
