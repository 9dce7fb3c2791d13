"""The training loop over the compact model, with complete checkpoints and bit-exact resume.

One step (`train_step`, the only one; recomputation is an argument of it, not a copy):

    zero_grad; forward (autocast to the precision; checkpointed segments per the schedule);
    loss in float32; backward of S * loss; unscale; clip the UNSCALED gradients; step unless
    a gradient is inf/NaN (skipped); update S; then, in Run, scheduler.step() unless skipped
    (the schedule counts applied updates; torch also warns when a scheduler steps before its
    optimizer ever did)

A run is a pure function of its configuration and of the number of steps, so an interrupted
run resumed from a checkpoint must reach the SAME bits as an uninterrupted one. That holds
only if the checkpoint holds everything the next step reads (the inventory, docs/resume.md):

    item        why the next step needs it
    model       the parameters
    optimizer   per-parameter buffers (momentum / exp_avg / exp_avg_sq) and step counts,
                and each group's current lr
    scheduler   last_epoch and the recursive lr (NOTE [ Chainable schedules ], optim.py)
    scaler      the loss scale S and its growth tracker (fp16)
    rng         the generator dropout draws from (here also the one that initialized the
                weights: make_mlp shares it), as bit_generator.state
    data        the sampler's (epoch, position): which batch comes next
    step        the step counter (and `skipped`, the count of skipped steps)
    config      the fingerprint of what must not change across a resume

The state digest (printed as `state-sha256`) is reference/state_digest.py (NOTE [ Canonical
state digest ]); the configuration is common/train_config.py.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import ckpt
from common.train_config import (  # noqa: F401  (re-exported: the configuration)
    F32_MAX,
    OPTIMIZERS,
    SCHEDULES,
    TrainConfig,
)
from reference import amp, faults, loss_scaling, lr_scheduler, numerics, optim, resume
from reference.gpt import GPT
from reference.losses import Loss
from reference.nn import Module
from reference.recompute import Schedule
from reference.state_digest import state_digest  # noqa: F401  (re-exported)
from reference.train_models import batch_of, build


def no_phase(name: str) -> AbstractContextManager[None]:
    """The default `phase` of train_step: nothing around each phase."""
    return nullcontext()


FAULTS = (None, "fp16_without_scaler", "clip_before_unscale")
INVENTORY = ("model", "optimizer", "scheduler", "scaler", "rng", "data", "step")
class Run:
    """A training run's objects and counters; `state_dict()` is its complete checkpoint."""

    def __init__(self, config: TrainConfig) -> None:
        c = self.config = config
        self.rng = np.random.default_rng(c.seed)  # initialization, then dropout
        parts = build(c, self.rng)  # refuses a recompute spec this model cannot take
        self.model, self.loss_fn = parts.model, parts.loss_fn
        self.optimizer = getattr(optim, c.optimizer)(self.model.parameters(), lr=c.lr,
                                                     **OPTIMIZERS[c.optimizer])
        self.scheduler = _make_scheduler(self.optimizer, c)
        self.scaler = loss_scaling.make_scaler(c.precision, init_scale=c.init_scale,
                                               growth_interval=c.growth_interval)
        self.task, self.sampler, self.loader = parts.task, parts.sampler, parts.loader
        self.schedule = parts.schedule
        self.step = 0
        self.skipped = 0
        self._batches: Iterator | None = None
        self.last_batch: tuple[np.ndarray, np.ndarray] | None = None  # the replay saves it
        self.numerics: numerics.Detector | None = None  # train(check_numerics=True) sets it
        self.step_fault: str | None = None  # train_step's `fault` (a seeded fault sets it)

    # -- one step
    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets) of the next batch; a new epoch starts when one is used up."""
        while True:
            if self._batches is None:
                self._batches = iter(self.loader)
            try:
                item = next(self._batches)
            except StopIteration:
                self._batches = None
                continue
            return batch_of(self.config, item)

    def train_step(self, batch: tuple[np.ndarray, np.ndarray] | None = None,
                   phase: Callable[[str], AbstractContextManager[Any]] = no_phase
                   ) -> StepResult:
        """One step on the next batch (or on `batch`: the anomaly replay's saved one);
        `phase` is train_step's (the numerics detector's, a profiler's)."""
        x, y = self.next_batch() if batch is None else batch
        self.last_batch = (x, y)
        # fp16 with a loss scale overflows on purpose now and then: the step is skipped, and
        # inf * 0 = NaN in the backward is how the scaler finds out (found_inf); a seeded
        # fault divides by zero (LayerNorm with eps 0): the numerics detector reports it
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            result = self._step(x, y, phase)
        if not result.skipped:  # the schedule counts applied updates
            self.scheduler.step()
        self.step += 1
        self.skipped += int(result.skipped)
        return result

    def _step(self, x: np.ndarray, y: np.ndarray,
              phase: Callable[[str], AbstractContextManager[Any]]) -> StepResult:
        return train_step(self.model, self.loss_fn, self.optimizer, self.scaler, x, y,
                          precision=self.config.precision,
                          max_grad_norm=self.config.max_grad_norm, schedule=self.schedule,
                          fault=self.step_fault, phase=phase)

    # -- the complete state
    def state_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "fingerprint": self.config.fingerprint(),
                "step": self.step, "epoch": self.sampler.epoch, "skipped": self.skipped,
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                "data": self.sampler.state_dict(),
                "rng": {"model": self.rng.bit_generator.state}}

    def template(self) -> dict[str, Any]:
        """What a checkpoint must match to be loaded here (resume.check_matches)."""
        return {"fingerprint": self.config.fingerprint(), "model": self.model.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any], omit: tuple[str, ...] = ()) -> None:
        """Restore every inventory item but those in `omit` (omit is for measuring damage);
        a state of another configuration is refused naming the fields that differ."""
        ckpt.check_config(state.get("config"), self.config.to_dict())
        resume.check_matches(state, self.template())
        if "model" not in omit:
            self.model.load_state_dict(state["model"])
        if "optimizer" not in omit:
            self.optimizer.load_state_dict(state["optimizer"])
        if "scheduler" not in omit:
            self.scheduler.load_state_dict(state["scheduler"])
        if "scaler" not in omit and self.scaler.is_enabled():
            self.scaler.load_state_dict(state["scaler"])
        if "rng" not in omit and state.get("rng") is not None:
            self.rng.bit_generator.state = state["rng"]["model"]
        if "data" not in omit:
            self.sampler.load_state_dict(state["data"])
        if "step" not in omit:
            self.step, self.skipped = int(state["step"]), int(state["skipped"])
        self._batches = None


def restored(config: TrainConfig, state: Mapping[str, Any], omit: tuple[str, ...] = ()) -> Run:
    """A new Run with `state` loaded: all or nothing (a failure leaves no half-restored run)."""
    run = Run(config)
    run.load_state_dict(state, omit)
    return run


def _make_scheduler(optimizer: optim.Optimizer, c: TrainConfig) -> lr_scheduler.LRScheduler:
    if c.schedule == "cosine":
        return lr_scheduler.CosineAnnealingLR(optimizer, T_max=c.horizon)
    if c.schedule == "step":
        return lr_scheduler.StepLR(optimizer, step_size=max(1, c.horizon // 4), gamma=0.5)
    return lr_scheduler.StepLR(optimizer, step_size=c.horizon + 1, gamma=1.0)


@dataclass(frozen=True)
class StepResult:
    """What one training step did: the unscaled loss, the scale it used, whether it skipped."""

    loss: float
    scale: float
    skipped: bool
    grad_norm: float | None = None  # what clip_grad_norm_ returned (None: no clipping)



def train_step(model: Module, loss_fn: Loss, optimizer: Any,
               scaler: loss_scaling.GradScaler, x: np.ndarray, y: np.ndarray, *,
               precision: str, max_grad_norm: float | None = None,
               schedule: Schedule | None = None, fault: str | None = None,
               phase: Callable[[str], AbstractContextManager[Any]] = no_phase) -> StepResult:
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


# ---------------------------------------------------------------- the loop

Loader = Callable[[Path], dict[str, Any]]


def train(config: TrainConfig, steps: int, checkpoint_dir: str | Path | None = None,
          checkpoint_every: int = 0, *, resume_from_latest: bool = False,
          overwrite: bool = False, keep: int = 3, log: Callable[[str], None] | None = None,
          foreign: Mapping[str, Loader] | None = None, check_numerics: bool = False,
          fault: faults.Fault | None = None, fault_step: int = 0) -> Run:
    """Train to `steps` steps in all; with `checkpoint_dir`, write a checkpoint every
    `checkpoint_every` steps (0: none between) and after the last step.

    `check_numerics`: a numerics.Detector watches every step (its counts are logged and kept
    in `run.numerics.history`); the first invalid value raises numerics.NonFinite before
    that step's update, with `.replay` holding what the anomaly replay needs (the run's
    state, the random state before the step, the batch). `fault` (faults.FAULTS) is
    written into the model before step `fault_step`.

    What the directory already holds decides where the run starts (ckpt.policy: fresh,
    `resume_from_latest`, `overwrite`, or a CheckpointError refusing, with nothing changed;
    docs/resume.md has the table). `foreign` maps another tree's payload kind to a loader
    returning THIS tree's state (python -m parity train passes the cross-implementation
    mapping); a converted state's random streams restart from the seed.
    """
    if not 0 <= steps <= config.horizon or checkpoint_every < 0:
        raise ValueError(f"train: steps must be in [0, horizon = {config.horizon}] (a schedule "
                         f"run past its horizon restarts) and checkpoint_every >= 0, got "
                         f"steps {steps}, checkpoint_every {checkpoint_every}")
    if fault is not None:
        faults.check_model(fault, config.model)  # before the directory is touched
    run = Run(config)
    directory = (None if checkpoint_dir is None
                 else resume.CheckpointManager(checkpoint_dir, keep=keep, log=log))
    with directory.opened() if directory is not None else nullcontext():
        if directory is not None:
            found = ckpt.start(directory, config=config.to_dict(), steps=steps,
                               resume=resume_from_latest, overwrite=overwrite,
                               readable={resume.PAYLOAD, *(foreign or {})})
            if found is not None:
                run = restored(config, _read(found, foreign))
                _say(log, f"resumed from {found.name} at step {run.step}" + (
                    "" if found.payload == resume.PAYLOAD else f" (written by {found.writer}, "
                    "converted; random streams restart from the seed)"))
        if fault is not None and not run.step <= fault_step < steps:
            raise ValueError(f"train: fault {fault.name} is seeded before step {fault_step}, "
                             f"but this run takes steps {run.step} to {steps - 1}: it would "
                             "never strike")
        if fault is not None and fault.loss is not None:  # code, not state: the whole run
            run.loss_fn = faults.LOSSES[fault.loss]()
        detector = None
        if check_numerics:
            detector = numerics.Detector(run.model, run.loss_fn,
                                         numerics.view_format(config.precision),
                                         scaler_enabled=run.scaler.is_enabled())
        run.numerics = detector
        while run.step < steps:
            batch = None
            if fault is not None and run.step == fault_step:
                batch = faults.apply_fault(run.model, fault, run.next_batch(), run.optimizer)
                if not fault.scaler:
                    _drop_scaler(run)
            r = _checked_step(run, detector, batch)
            _say(log, f"step {run.step} loss {r.loss:.6g} scale {r.scale:g} "
                      f"skipped {int(r.skipped)} (total {run.skipped})" + (
                          "" if detector is None
                          else "  " + numerics.format_counts(detector.history[-1])))
            if directory is not None and ckpt.due(run.step, steps, checkpoint_every):
                directory.save(run.step, run.state_dict(), config.to_dict())
    return run


def _drop_scaler(run: Run) -> None:
    """A fault's "fp16 without a GradScaler": the run trains on unscaled from here (the
    detector then stops at a non-finite gradient: no scaler skips the step)."""
    run.scaler = loss_scaling.make_scaler("fp32")  # disabled
    run.step_fault = "fp16_without_scaler"
    if run.numerics is not None:
        run.numerics.scaler_enabled = False


def _checked_step(run: Run, detector: numerics.Detector | None,
                  batch: tuple[Any, Any] | None) -> StepResult:
    """run.train_step, watched by `detector`; a NonFinite leaves with the replay state."""
    if detector is None:
        return run.train_step(batch)
    detector.step = run.step
    rng = {"model": copy.deepcopy(run.rng.bit_generator.state)}  # before the step's draws
    try:
        return run.train_step(batch, detector.phase)
    except numerics.NonFinite as e:
        x, y = run.last_batch  # type: ignore[misc]
        e.replay = {**run.state_dict(), "rng": rng, "batch": {"x": x, "y": y},
                    "first_invalid": e.report.line(),
                    **faults.loss_of(run.loss_fn)}
        e.history = detector.history
        raise


def _read(found: ckpt.Entry, foreign: Mapping[str, Loader] | None) -> dict[str, Any]:
    """The state of the checkpoint the policy chose, converted if another tree wrote it."""
    if found.payload == resume.PAYLOAD:
        state = resume.load_checkpoint(found.path)
    else:
        state = (foreign or {})[found.payload](found.path)
    if state.get("step") != found.step:
        raise resume.CheckpointCorruptError(f"{found.path}: holds step {state.get('step')!r}, "
                                            f"its name and header say {found.step}")
    return state


def _say(log: Callable[[str], None] | None, line: str) -> None:
    if log is not None:
        log(line)
