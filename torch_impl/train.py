"""The training loop in PyTorch. See reference/train.py for the step, the inventory of a
complete checkpoint; torch_impl/state_digest.py for NOTE [ Canonical state digest ].

What PyTorch does differently or hides:
- nn.Dropout draws from the DEFAULT generator (no `generator=` argument), and
  torch.utils.checkpoint replays that same default generator. The run keeps its own
  torch.Generator and swaps it in for the step (NOTE [ Dropout's stream is the default
  generator ]), so the global RNG is never the run's state and never changed by the run.
- DataLoader draws a base seed at every iter() (NOTE [ DataLoader base seed ] in
  torch_impl/data.py). The loader's generator is re-seeded from (seed, epoch) before each
  iter(), so the draw is a function of the epoch, not of the moment a (resumed) run began;
  with num_workers=0 nothing consumes it, and it needs no place in the checkpoint.
- Autocast and recomputation compose natively (torch.autocast around
  torch.utils.checkpoint); the reference composes them only in fp32.
- The scaler is torch.amp.GradScaler; on CUDA the dropout stream is a CUDA generator.

TrainConfig (and the optimizers' fixed hyperparameters) are the reference's, imported as
plain data: one configuration, validated once, with one fingerprint, so a checkpoint's
configuration compares across the implementations field by field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import ckpt
from common.train_config import OPTIMIZERS, TrainConfig  # plain data (module docstring)
from torch_impl import amp, faults, loss_scaling, numerics, resume
from torch_impl.data import hash_words
from torch_impl.gpt import GPT
from torch_impl.recompute import Schedule
from torch_impl.state_digest import state_digest  # noqa: F401  (re-exported)
from torch_impl.train_models import batch_of, build


def no_phase(name: str) -> AbstractContextManager[None]:
    """The default `phase` of train_step: nothing around each phase."""
    return nullcontext()


FAULTS = (None, "fp16_without_scaler", "clip_before_unscale")
INVENTORY = ("model", "optimizer", "scheduler", "scaler", "rng", "data", "step")
LOADER_SEED = 5  # a purpose of reference/data.py's hash, beside ORDER, INPUTS, ...


# NOTE [ Dropout's stream is the default generator ]
# nn.Dropout (and F.dropout) take no generator: they draw from torch's default generator of
# their device, and torch.utils.checkpoint(preserve_rng_state=True) stashes and replays that
# same default generator. A step therefore runs inside torch.random.fork_rng (which restores
# the global state afterwards) with the run's own generator's state copied in, and copies
# the advanced state back out. The run's stream is an explicit torch.Generator that the
# checkpoint saves; the global RNG is neither read as the run's state nor left changed.


class Run:
    """A training run's objects and counters; `state_dict()` is its complete checkpoint."""

    def __init__(self, config: TrainConfig, device: str | torch.device = "cpu") -> None:
        c = self.config = config
        self.device = torch.device(device)
        self.generator = torch.Generator().manual_seed(c.seed)  # initialization, then dropout
        self.loader_generator = torch.Generator()
        parts = build(c, self.generator, self.device, self.loader_generator)
        self.model, self.loss_fn = parts.model, parts.loss_fn
        self.cuda_generator = None
        if self.device.type == "cuda":  # dropout on CUDA draws from the device's generator
            self.cuda_generator = torch.Generator(self.device).manual_seed(c.seed)
        self.optimizer = getattr(torch.optim, c.optimizer)(self.model.parameters(), lr=c.lr,
                                                           **OPTIMIZERS[c.optimizer])
        self.scheduler = _make_scheduler(self.optimizer, c)
        self.scaler = loss_scaling.make_scaler(c.precision, self.device,
                                               init_scale=c.init_scale,
                                               growth_interval=c.growth_interval)
        self.task, self.sampler, self.loader = parts.task, parts.sampler, parts.loader
        self.schedule = parts.schedule
        self.step = 0
        self.skipped = 0
        self._batches: Iterator | None = None
        self.last_batch: tuple[torch.Tensor, torch.Tensor] | None = None  # the replay saves it
        self.numerics: numerics.Detector | None = None  # train(check_numerics=True) sets it
        self.step_fault: str | None = None  # train_step's `fault` (a seeded fault sets it)

    # -- one step
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of the next batch; a new epoch starts when one is used up."""
        while True:
            if self._batches is None:
                # the base seed of this epoch's iter() is a function of (seed, epoch)
                seed = int(hash_words(self.config.seed, LOADER_SEED, self.sampler.epoch, 1)[0])
                self.loader_generator.manual_seed(seed)
                self._batches = iter(self.loader)
            try:
                item = next(self._batches)
            except StopIteration:
                self._batches = None
                continue
            return batch_of(self.config, item)

    def train_step(self, batch: tuple[torch.Tensor, torch.Tensor] | None = None,
                   phase: Callable[[str], AbstractContextManager[Any]] = no_phase
                   ) -> StepResult:
        """One step on the next batch (or on `batch`: the anomaly replay's saved one);
        `phase` is train_step's (the numerics detector's, a profiler's)."""
        x, y = self.next_batch() if batch is None else batch
        self.last_batch = (x, y)
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=self.device.type):
            torch.default_generator.set_state(self.generator.get_state())
            if self.cuda_generator is not None:
                torch.cuda.set_rng_state(self.cuda_generator.get_state(), self.device)
            result = train_step(self.model, self.loss_fn, self.optimizer, self.scaler, x, y,
                                precision=self.config.precision,
                                max_grad_norm=self.config.max_grad_norm, schedule=self.schedule,
                                fault=self.step_fault, phase=phase)
            self.generator.set_state(torch.default_generator.get_state())
            if self.cuda_generator is not None:
                self.cuda_generator.set_state(torch.cuda.get_rng_state(self.device))
        if not result.skipped:  # the schedule counts applied updates
            self.scheduler.step()
        self.step += 1
        self.skipped += int(result.skipped)
        return result

    # -- the complete state
    def state_dict(self) -> dict[str, Any]:
        rng = {"model": self.generator.get_state()}
        if self.cuda_generator is not None:
            rng["cuda"] = self.cuda_generator.get_state()
        return _snapshot({
            "config": self.config.to_dict(), "fingerprint": self.config.fingerprint(),
            "step": self.step, "epoch": self.sampler.epoch, "skipped": self.skipped,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
            "data": self.sampler.state_dict(), "rng": rng})

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
            self.generator.set_state(state["rng"]["model"])
            if self.cuda_generator is not None and "cuda" in state["rng"]:
                self.cuda_generator.set_state(state["rng"]["cuda"])
        if "data" not in omit:
            self.sampler.load_state_dict(state["data"])
        if "step" not in omit:
            self.step, self.skipped = int(state["step"]), int(state["skipped"])
        self._batches = None


def _snapshot(value: Any) -> Any:
    """A copy with every tensor cloned: torch's state_dicts hand out live tensors."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_snapshot(v) for v in value)
    return value


def restored(config: TrainConfig, state: Mapping[str, Any], omit: tuple[str, ...] = (),
             device: str | torch.device = "cpu") -> Run:
    """A new Run with `state` loaded: all or nothing (a failure leaves no half-restored run)."""
    run = Run(config, device)
    run.load_state_dict(state, omit)
    return run


def _make_scheduler(optimizer: torch.optim.Optimizer, c: TrainConfig
                    ) -> torch.optim.lr_scheduler.LRScheduler:
    lr_scheduler = torch.optim.lr_scheduler
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



def train_step(model: nn.Module, loss_fn: nn.Module, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler, x: torch.Tensor, y: torch.Tensor, *,
               precision: str, max_grad_norm: float | None = None,
               schedule: Schedule | None = None, fault: str | None = None,
               phase: Callable[[str], AbstractContextManager[Any]] = no_phase) -> StepResult:
    """One mixed-precision step; reference.train.train_step line for line.

    precision "fp32" | "bf16" | "fp16" picks the autocast dtype (amp.autocast_dtype);
    "fp16" requires an enabled scaler (make_scaler gives the right one for each). Order:
    zero_grad, autocast forward, float32 loss, scale(loss).backward(), unscale_, clip the
    UNSCALED gradients (if max_grad_norm), step (skipped on inf/NaN), update.
    `fault` reproduces a classic mistake, for the tests and docs only (FAULTS):
    "fp16_without_scaler" lifts the fp16 guard, "clip_before_unscale" clips the scaled
    gradients (the threshold is then effectively max_grad_norm * S).
    `phase(name)` is entered around "forward", "backward" and "optimizer" (a profiler's
    timer or record_function; by default nothing).
    `schedule` runs the forward with checkpointed segments (recompute.forward_with_schedule);
    torch.autocast and torch.utils.checkpoint compose natively, in every precision.
    A GPT `model` returns (logits, None) and `loss_fn` is train_models.NextTokenLoss (the
    cross-entropy GPT.forward computes with targets, the same ops); it carries its own
    recomputation (recompute_gpt.set_recompute), so `schedule` must be None.
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
        with amp.autocast(dtype, x.device.type):
            output = model(x) if schedule is None else _scheduled(model, x, schedule)
            loss = loss_fn(output, y)  # fp32 op list: losses run in float32
    with phase("backward"):
        scaler.scale(loss).backward()
    with phase("optimizer"):
        return _optimizer_phase(model, optimizer, scaler, loss, max_grad_norm, fault)


def _optimizer_phase(model: nn.Module, optimizer: torch.optim.Optimizer,
                     scaler: torch.amp.GradScaler, loss: torch.Tensor,
                     max_grad_norm: float | None, fault: str | None) -> StepResult:
    """unscale_, clip the unscaled gradients, step unless inf/NaN, update the scale."""
    grad_norm = None
    if fault == "clip_before_unscale" and max_grad_norm is not None:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_grad_norm)
    scaler.unscale_(optimizer)
    if max_grad_norm is not None and fault != "clip_before_unscale":
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_grad_norm)
    scale = scaler.get_scale()
    scaler.step(optimizer)
    skipped = loss_scaling.step_skipped(scaler, optimizer)
    scaler.update()
    return StepResult(loss.item(), scale, skipped,
                      None if grad_norm is None else grad_norm.item())


def _scheduled(model: nn.Module, x: torch.Tensor, schedule: Schedule) -> torch.Tensor:
    """The recompute adapter: the model's forward under a checkpointing schedule."""
    from torch_impl import recompute

    return recompute.forward_with_schedule(model, x, schedule)


# ---------------------------------------------------------------- the loop

Loader = Callable[[Path], dict[str, Any]]


def train(config: TrainConfig, steps: int, checkpoint_dir: str | Path | None = None,
          checkpoint_every: int = 0, *, resume_from_latest: bool = False,
          overwrite: bool = False, keep: int = 3, log: Callable[[str], None] | None = None,
          foreign: Mapping[str, Loader] | None = None, check_numerics: bool = False,
          fault: faults.Fault | None = None, fault_step: int = 0,
          device: str | torch.device = "cpu") -> Run:
    """reference.train.train, on a device."""
    if not 0 <= steps <= config.horizon or checkpoint_every < 0:
        raise ValueError(f"train: steps must be in [0, horizon = {config.horizon}] (a schedule "
                         f"run past its horizon restarts) and checkpoint_every >= 0, got "
                         f"steps {steps}, checkpoint_every {checkpoint_every}")
    if fault is not None:
        faults.check_model(fault, config.model)  # before the directory is touched
    run = Run(config, device)
    directory = (None if checkpoint_dir is None
                 else resume.CheckpointManager(checkpoint_dir, keep=keep, log=log))
    with directory.opened() if directory is not None else nullcontext():
        if directory is not None:
            found = ckpt.start(directory, config=config.to_dict(), steps=steps,
                               resume=resume_from_latest, overwrite=overwrite,
                               readable={resume.PAYLOAD, *(foreign or {})})
            if found is not None:
                run = restored(config, _read(found, foreign), device=device)
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
    run.scaler = loss_scaling.make_scaler("fp32", run.device)  # disabled
    run.step_fault = "fp16_without_scaler"
    if run.numerics is not None:
        run.numerics.scaler_enabled = False


def _checked_step(run: Run, detector: numerics.Detector | None,
                  batch: tuple[Any, Any] | None) -> StepResult:
    """run.train_step, watched by `detector`; a NonFinite leaves with the replay state
    (the run's generator is still the one before the step: the exception skipped its
    copy-back)."""
    if detector is None:
        return run.train_step(batch)
    detector.step = run.step
    try:
        return run.train_step(batch, detector.phase)
    except numerics.NonFinite as e:
        x, y = run.last_batch  # type: ignore[misc]
        e.replay = {**run.state_dict(), "batch": {"x": x.clone(), "y": y.clone()},
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
