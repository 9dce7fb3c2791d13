"""The training loop around the step, written once: step counting, the batch loop, the
complete checkpoint, resume, fault injection and the numerics hook. None of it depends on
the library; each tree's train.py supplies what does (its `Run`: the step itself, its random
state, how its state is copied; `Tree`: its payload, faults and numerics modules).

One step (each tree's `train_step`, the only one; recomputation is an argument of it):

    zero_grad; forward (autocast to the precision; checkpointed segments per the schedule);
    loss in float32; backward of S * loss; unscale; clip the UNSCALED gradients; step unless
    a gradient is inf/NaN (skipped); update S; then, in Run, scheduler.step() unless skipped
    (the schedule counts applied updates; torch also warns when a scheduler steps before its
    optimizer ever did)

A run is a pure function of its configuration and of the number of steps, so an interrupted
run resumed from a checkpoint must reach the SAME bits as an uninterrupted one. That holds
only if the checkpoint holds everything the next step reads (the inventory, docs/resume.md):

    item        why the next step needs it
    model       the parameters, and the buffers (fp8-delayed's amax histories and scales)
    optimizer   per-parameter buffers (momentum / exp_avg / exp_avg_sq) and step counts,
                and each group's current lr
    scheduler   last_epoch and the recursive lr (NOTE [ Chainable schedules ], optim.py)
    scaler      the loss scale S and its growth tracker (fp16)
    rng         the generator dropout draws from (also the one that initialized the
                weights: make_mlp shares it), as the tree's generator state
    data        the sampler's (epoch, position): which batch comes next
    step        the step counter (and `skipped`, the count of skipped steps)
    config      the fingerprint of what must not change across a resume

The state digest (printed as `state-sha256`) is common/state_digest.py (NOTE [ Canonical
state digest ]); the configuration is common/train_config.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import ckpt
from common.train_config import TrainConfig

FAULTS = (None, "fp16_without_scaler", "clip_before_unscale")
INVENTORY = ("model", "optimizer", "scheduler", "scaler", "rng", "data", "step")
Phase = Callable[[str], AbstractContextManager[Any]]
Loader = Callable[[Path], dict[str, Any]]
Configure = Callable[[Mapping[str, Any] | None], TrainConfig]


def no_phase(name: str) -> AbstractContextManager[None]:
    """The default `phase` of train_step: nothing around each phase."""
    return nullcontext()


@dataclass(frozen=True)
class StepResult:
    """What one training step did: the unscaled loss, the scale it used, whether it skipped."""

    loss: float
    scale: float
    skipped: bool
    grad_norm: float | None = None  # what clip_grad_norm_ returned (None: no clipping)


@dataclass(frozen=True)
class RanksResult:
    """What an N-rank run (`train --world-size N`, either tree's ddp_train) ended with: the
    step, rank 0's state digest (every rank's is checked to be the same), the skipped steps
    in all."""

    step: int
    digest: str
    skipped: int


@dataclass(frozen=True)
class Tree:
    """The modules of one tree the loop calls: `resume` (PAYLOAD, CheckpointManager,
    load_checkpoint), `faults` (check_model, apply_fault, LOSSES, loss_of)
    and `numerics` (Detector, view_format, format_counts, NonFinite)."""

    resume: ModuleType
    faults: ModuleType
    numerics: ModuleType


class Batches:
    """The loader's items, epoch after epoch: `next()` calls `new_epoch` and iter(loader)
    again when an epoch is used up (the sampler then starts the next one)."""

    def __init__(self, loader: Iterable, new_epoch: Callable[[], None] | None = None) -> None:
        self.loader, self.new_epoch = loader, new_epoch
        self._items: Iterator | None = None

    def next(self) -> Any:
        while True:
            if self._items is None:
                if self.new_epoch is not None:
                    self.new_epoch()
                self._items = iter(self.loader)
            try:
                return next(self._items)
            except StopIteration:
                self._items = None


def batches(config: TrainConfig, loader: Iterable,
            batch_of: Callable[[TrainConfig, Any], Any]) -> Iterator[Any]:
    """The loader's global batches, epoch after epoch (a new epoch starts where the last one
    ran out: Batches, with no hook), each made by the tree's `batch_of(config, item)`."""
    items = Batches(loader)
    while True:
        yield batch_of(config, items.next())


class BaseRun:
    """A training run's counters and its loop; `state_dict()` is its complete checkpoint.
    A tree's Run builds the objects (model, loss_fn, optimizer, scheduler, scaler, sampler,
    loader, schedule) and supplies the methods marked "the tree's"."""

    tree: ClassVar[Tree]

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.step = 0
        self.skipped = 0
        self._batches: Batches | None = None
        self.last_batch: tuple[Any, Any] | None = None  # the replay saves it
        self.numerics: Any = None  # train(check_numerics=True) sets it: a Detector
        self.step_fault: str | None = None  # train_step's `fault` (a seeded fault sets it)

    # -- the tree's
    def _batch(self, item: tuple) -> tuple[Any, Any]:
        """(inputs, targets) of what the loader yielded (train_models.batch_of)."""
        raise NotImplementedError

    def _new_epoch(self) -> None:
        """Called before each iter(loader): nothing, unless iter() itself draws."""

    def _step(self, x: Any, y: Any, phase: Phase) -> StepResult:
        """train_step on (x, y), inside whatever the tree's step needs around it."""
        raise NotImplementedError

    def _rng_state(self) -> dict[str, Any]:
        """The random state the next step draws from, as a fresh copy."""
        raise NotImplementedError

    def _load_rng(self, rng: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _snapshot(self, value: Any) -> Any:
        """`value` with every array the run still holds copied (identity when none is)."""
        return value

    def _disabled_scaler(self) -> Any:
        raise NotImplementedError

    # -- one step
    def next_batch(self) -> tuple[Any, Any]:
        """(inputs, targets) of the next batch; a new epoch starts when one is used up."""
        if self._batches is None:
            self._batches = Batches(self.loader, self._new_epoch)
        return self._batch(self._batches.next())

    def train_step(self, batch: tuple[Any, Any] | None = None,
                   phase: Phase = no_phase) -> StepResult:
        """One step on the next batch (or on `batch`: the anomaly replay's saved one);
        `phase` is train_step's (the numerics detector's, a profiler's)."""
        x, y = self.next_batch() if batch is None else batch
        self.last_batch = (x, y)
        result = self._step(x, y, phase)
        if not result.skipped:  # the schedule counts applied updates
            self.scheduler.step()
        self.step += 1
        self.skipped += int(result.skipped)
        return result

    # -- the complete state
    def state_dict(self) -> dict[str, Any]:
        return self._snapshot({
            "config": self.config.to_dict(), "fingerprint": self.config.fingerprint(),
            "step": self.step, "epoch": self.sampler.epoch, "skipped": self.skipped,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
            "data": self.sampler.state_dict(), "rng": self._rng_state()})

    def template(self) -> dict[str, Any]:
        """What a checkpoint must match to be loaded here (resume.check_matches)."""
        return {"fingerprint": self.config.fingerprint(), "model": self.model.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any], omit: tuple[str, ...] = ()) -> None:
        """Restore every inventory item but those in `omit` (omit is for measuring damage);
        a state of another configuration is refused naming the fields that differ."""
        ckpt.check_config(state.get("config"), self.config.to_dict())
        ckpt.check_matches(state, self.template())
        if "model" not in omit:
            self.model.load_state_dict(state["model"])
        if "optimizer" not in omit:
            self.optimizer.load_state_dict(state["optimizer"])
        if "scheduler" not in omit:
            self.scheduler.load_state_dict(state["scheduler"])
        if "scaler" not in omit and self.scaler.is_enabled():
            self.scaler.load_state_dict(state["scaler"])
        if "rng" not in omit and state.get("rng") is not None:
            self._load_rng(state["rng"])
        if "data" not in omit:
            self.sampler.load_state_dict(state["data"])
        if "step" not in omit:
            self.step, self.skipped = int(state["step"]), int(state["skipped"])
        self.close()

    def close(self) -> None:
        """Drop the live batch iterator and end the loader's worker processes, if it has
        any (`loader.close()`); the next batch is fetched afresh from the sampler's state,
        which is the consumed position (NOTE [ Consumed position ] in reference/data.py)."""
        self._batches = None
        close = getattr(self.loader, "close", None)
        if close is not None:
            close()

    @classmethod
    def restored(cls, config: TrainConfig, state: Mapping[str, Any],
                 omit: tuple[str, ...] = (), **options: Any) -> BaseRun:
        """A new Run with `state` loaded: all or nothing (a failure leaves no half-restored
        run); `options` are the tree's Run's (torch: device)."""
        run = cls(config, **options)
        run.load_state_dict(state, omit)
        return run


# ---------------------------------------------------------------- the loop

def train(run_class: type[BaseRun], config: TrainConfig | Configure, steps: int,
          checkpoint_dir: str | Path | None = None, checkpoint_every: int = 0, *,
          resume_from_latest: bool = False, overwrite: bool = False, keep: int = 3,
          log: Callable[[str], None] | None = None, foreign: Mapping[str, Loader] | None = None,
          check_numerics: bool = False, fault: Any = None, fault_step: int = 0,
          notify: Callable[[str], None] | None = None, strict: bool = False,
          **options: Any) -> Any:
    """Train a `run_class` run (built with `options`: torch's device) to `steps` steps in all;
    with `checkpoint_dir`, write a checkpoint every `checkpoint_every` steps (0: none
    between) and after the last step.

    `check_numerics`: a numerics.Detector watches every step (its counts are logged and kept
    in `run.numerics.history`); the first invalid value raises numerics.NonFinite before
    that step's update, with `.replay` holding what the anomaly replay needs (the run's
    state, the random state before the step, the batch). `fault` (faults.FAULTS) is
    written into the model before step `fault_step`.

    What the directory already holds decides where the run starts (ckpt.policy: fresh,
    `resume_from_latest`, `overwrite`, or a CheckpointError refusing, with nothing changed;
    docs/resume.md has the table). `foreign` maps another tree's payload kind to a loader
    returning THIS tree's state (python -m parity train passes the cross-implementation
    mapping); a converted state's dropout streams restart from the seed. `strict` (with
    `resume_from_latest`): nothing to resume is a refusal. `log` receives each step's line;
    `notify` (default: `log`) what the directory policy says and the line naming the
    checkpoint resumed from (python -m parity train sends these to stderr).

    `config` is the run's TrainConfig, or how it follows from the configuration saved in the
    checkpoint a resume continues (None: there is none; python -m parity train inherits the
    horizon and refuses another model that way). The configuration is settled, checked and
    its one Run built before the directory is touched, unless it waits for a resume's one
    reading of an existing directory (ckpt.policy.start); a resumed state is loaded into
    that Run.
    """
    tree = run_class.tree
    configure: Configure = ((lambda saved: config) if isinstance(config, TrainConfig)
                            else config)
    settled: TrainConfig | None = None  # settle() sets it

    def settle(saved: Mapping[str, Any] | None) -> dict[str, Any]:
        nonlocal settled
        settled = configure(saved)
        if not 0 <= steps <= settled.horizon or checkpoint_every < 0:
            raise ValueError(f"train: steps must be in [0, horizon = {settled.horizon}] (a "
                             "schedule run past its horizon restarts) and checkpoint_every "
                             f">= 0, got steps {steps}, checkpoint_every {checkpoint_every}")
        if fault is not None:
            tree.faults.check_model(fault, settled.model)
        return settled.to_dict()

    notify = log if notify is None else notify
    directory = (None if checkpoint_dir is None
                 else tree.resume.CheckpointManager(checkpoint_dir, keep=keep, log=notify))
    waits = (not isinstance(config, TrainConfig) and resume_from_latest
             and directory is not None and directory.directory.is_dir())
    run = None
    if not waits:  # all of it before the directory is touched
        settle(None)
        run = run_class(settled, **options)
    with directory.opened() if directory is not None else nullcontext():
        found = None
        if directory is not None:
            found = ckpt.start(directory, config=settle if waits else settled.to_dict(),
                               steps=steps, resume=resume_from_latest, overwrite=overwrite,
                               readable={tree.resume.PAYLOAD, *(foreign or {})},
                               load=lambda entry: _read(tree, entry, foreign),
                               strict=strict)
        config = settled
        if run is None:
            run = run_class(config, **options)
        if found is not None:
            run.load_state_dict(found.state)
            _say(notify, f"resumed from {found.entry.name} at step {run.step}" + (
                "" if found.entry.payload == tree.resume.PAYLOAD else f" (written by "
                f"{found.entry.writer}, converted; dropout streams restart from the seed)"))
        if fault is not None and not run.step <= fault_step < steps:
            raise ValueError(f"train: fault {fault.name} is seeded before step {fault_step}, "
                             f"but this run takes steps {run.step} to {steps - 1}: it would "
                             "never strike")
        if fault is not None and fault.loss is not None:  # code, not state: the whole run
            run.loss_fn = tree.faults.LOSSES[fault.loss]()
        if check_numerics:
            run.numerics = tree.numerics.Detector(
                run.model, run.loss_fn, tree.numerics.view_format(config.precision),
                scaler_enabled=run.scaler.is_enabled())
        try:
            _steps(run, tree, steps, directory, checkpoint_every, fault, fault_step, log)
        finally:
            run.close()  # a loader's worker processes end with the loop
    return run


def _steps(run: BaseRun, tree: Tree, steps: int, directory: Any, checkpoint_every: int,
           fault: Any, fault_step: int, log: Callable[[str], None] | None) -> None:
    """train()'s loop: steps until `steps`, checkpoints when due."""
    config = run.config
    while run.step < steps:
        batch = None
        if fault is not None and run.step == fault_step:
            batch = tree.faults.apply_fault(run.model, fault, run.next_batch(),
                                            run.optimizer)
            if not fault.scaler:
                _drop_scaler(run)
        r = _checked_step(run, batch)
        _say(log, f"step {run.step} loss {r.loss:.6g} scale {r.scale:g} "
                  f"skipped {int(r.skipped)} (total {run.skipped})" + (
                      "" if run.numerics is None
                      else "  " + tree.numerics.format_counts(run.numerics.history[-1])))
        if directory is not None and ckpt.due(run.step, steps, checkpoint_every):
            directory.save(run.step, run.state_dict(), config.to_dict())


def _drop_scaler(run: BaseRun) -> None:
    """A fault's "fp16 without a GradScaler": the run trains on unscaled from here (the
    detector then stops at a non-finite gradient: no scaler skips the step)."""
    run.scaler = run._disabled_scaler()
    run.step_fault = "fp16_without_scaler"
    if run.numerics is not None:
        run.numerics.scaler_enabled = False


def _checked_step(run: BaseRun, batch: tuple[Any, Any] | None) -> StepResult:
    """run.train_step, watched by its detector; a NonFinite leaves with the replay state."""
    detector = run.numerics
    if detector is None:
        return run.train_step(batch)
    detector.step = run.step
    rng = run._rng_state()  # before the step's draws
    try:
        return run.train_step(batch, detector.phase)
    except run.tree.numerics.NonFinite as e:
        x, y = run.last_batch  # type: ignore[misc]
        e.replay = {**run.state_dict(), "rng": rng, "batch": run._snapshot({"x": x, "y": y}),
                    "first_invalid": e.report.line(),
                    **run.tree.faults.loss_of(run.loss_fn)}
        e.history = detector.history
        raise


def _read(tree: Tree, found: ckpt.Entry, foreign: Mapping[str, Loader] | None
          ) -> dict[str, Any]:
    """The state of the checkpoint the policy chose, converted if another tree wrote it."""
    if found.payload == tree.resume.PAYLOAD:
        state = tree.resume.load_checkpoint(found.path)
    else:
        state = (foreign or {})[found.payload](found.path)
    if state.get("step") != found.step:
        raise ckpt.CheckpointCorruptError(f"{found.path}: holds step {state.get('step')!r}, "
                                          f"its name and header say {found.step}")
    return state


def _say(log: Callable[[str], None] | None, line: str) -> None:
    if log is not None:
        log(line)
