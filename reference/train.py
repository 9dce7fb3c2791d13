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

# NOTE [ Canonical state digest ]
`state_digest` (printed as `state-sha256`) is SHA-256 over length-prefixed records, in
this order: every model entry in state_dict order; every optimizer buffer, parameter index
ascending, buffer name sorted ("optimizer/<i>/<name>"); every scaler entry, key sorted
("scaler/<key>"); then "data/epoch" and "data/position". An array record is
name NUL dtype.str NUL shape NUL raw-bytes (little-endian, C order); a plain value's is
name NUL "py" NUL repr(value). torch_impl/train.py computes the same bytes from tensors,
so a state and its cross-implementation mapping have the same digest. Random streams and
the lr are not in it: they are checked by the resume tests through the parameters they
change.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reference import amp, loss_scaling, optim, resume
from reference.data import ResumableSampler, make_loader, make_task
from reference.nn import CrossEntropyLoss, Module, MSELoss, make_mlp
from reference.recompute import Schedule

FAULTS = (None, "fp16_without_scaler", "clip_before_unscale")
INVENTORY = ("model", "optimizer", "scheduler", "scaler", "rng", "data", "step")
OPTIMIZERS = {"SGD": {"momentum": 0.9}, "Adam": {}, "AdamW": {"weight_decay": 0.01}}
SCHEDULES = ("constant", "cosine", "step")


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a run (and must not change across a resume: the fingerprint)."""

    seed: int = 0
    sizes: tuple[int, ...] = (8, 32, 32, 3)
    activation: str = "tanh"
    dropout: float = 0.0
    precision: str = "fp32"
    recompute: str = "none"
    optimizer: str = "AdamW"
    lr: float = 1e-2
    schedule: str = "cosine"
    total_steps: int = 200  # the schedule's horizon (T_max), not the steps of one invocation
    batch_size: int = 16
    num_samples: int = 256
    loss: str = "cross_entropy"
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    max_grad_norm: float | None = None

    def __post_init__(self) -> None:
        amp.autocast_dtype(self.precision)
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"TrainConfig: optimizer must be one of {tuple(OPTIMIZERS)}, "
                             f"got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"TrainConfig: schedule must be one of {SCHEDULES}, "
                             f"got {self.schedule!r}")
        if self.loss not in ("cross_entropy", "mse"):
            raise ValueError(f"TrainConfig: loss must be 'cross_entropy' or 'mse', "
                             f"got {self.loss!r}")

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def fingerprint(self) -> str:
        """SHA-256 of the configuration as canonical JSON (sorted keys)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


class Run:
    """A training run's objects and counters; `state_dict()` is its complete checkpoint."""

    def __init__(self, config: TrainConfig) -> None:
        c = self.config = config
        self.rng = np.random.default_rng(c.seed)  # initialization, then dropout
        self.model = make_mlp(c.sizes, c.activation, c.dropout, rng=self.rng)
        self.loss_fn = CrossEntropyLoss() if c.loss == "cross_entropy" else MSELoss()
        self.optimizer = getattr(optim, c.optimizer)(self.model.parameters(), lr=c.lr,
                                                     **OPTIMIZERS[c.optimizer])
        self.scheduler = _make_scheduler(self.optimizer, c)
        self.scaler = loss_scaling.make_scaler(c.precision, init_scale=c.init_scale,
                                               growth_interval=c.growth_interval)
        self.task = make_task(c.seed, c.num_samples, features=c.sizes[0], classes=c.sizes[-1])
        self.sampler = ResumableSampler(c.num_samples, c.seed)
        self.loader = make_loader(self.task, self.sampler, c.batch_size, drop_last=True)
        self.schedule = None
        if c.recompute != "none":
            from reference import recompute

            if c.precision != "fp32":
                _scheduled(self.model, recompute.parse_schedule(c.recompute, len(self.model)),
                           c.precision)  # refuses now, not at the first step
            self.schedule = recompute.parse_schedule(c.recompute, len(self.model))
        self.step = 0
        self.skipped = 0
        self._batches: Iterator | None = None

    # -- one step
    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets) of the next batch; a new epoch starts when one is used up."""
        while True:
            if self._batches is None:
                self._batches = iter(self.loader)
            try:
                x, labels, values = next(self._batches)
            except StopIteration:
                self._batches = None
                continue
            return x, (labels if self.config.loss == "cross_entropy" else values)

    def train_step(self) -> StepResult:
        x, y = self.next_batch()
        # fp16 with a loss scale overflows on purpose now and then: the step is skipped, and
        # inf * 0 = NaN in the backward is how the scaler finds out (found_inf)
        with np.errstate(over="ignore", invalid="ignore"):
            result = self._step(x, y)
        if not result.skipped:  # the schedule counts applied updates
            self.scheduler.step()
        self.step += 1
        self.skipped += int(result.skipped)
        return result

    def _step(self, x: np.ndarray, y: np.ndarray) -> StepResult:
        return train_step(self.model, self.loss_fn, self.optimizer, self.scaler, x, y,
                          precision=self.config.precision,
                          max_grad_norm=self.config.max_grad_norm, schedule=self.schedule)

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
        """Restore every inventory item but those in `omit` (omit is for measuring damage)."""
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


def _make_scheduler(optimizer: optim.Optimizer, c: TrainConfig) -> optim.LRScheduler:
    if c.schedule == "cosine":
        return optim.CosineAnnealingLR(optimizer, T_max=c.total_steps)
    if c.schedule == "step":
        return optim.StepLR(optimizer, step_size=max(1, c.total_steps // 4), gamma=0.5)
    return optim.StepLR(optimizer, step_size=c.total_steps + 1, gamma=1.0)


@dataclass(frozen=True)
class StepResult:
    """What one training step did: the unscaled loss, the scale it used, whether it skipped."""

    loss: float
    scale: float
    skipped: bool
    grad_norm: float | None = None  # what clip_grad_norm_ returned (None: no clipping)



def train_step(model: Module, loss_fn: Module, optimizer: Any,
               scaler: loss_scaling.GradScaler, x: np.ndarray, y: np.ndarray, *,
               precision: str, max_grad_norm: float | None = None,
               schedule: Schedule | None = None, fault: str | None = None) -> StepResult:
    """One mixed-precision step; torch_impl.train.train_step line for line.

    precision "fp32" | "bf16" | "fp16" picks the autocast dtype (amp.autocast_dtype);
    "fp16" requires an enabled scaler (make_scaler gives the right one for each). Order:
    zero_grad, autocast forward, float32 loss, scale(loss) backward, unscale_, clip the
    UNSCALED gradients (if max_grad_norm), step (skipped on inf/NaN), update.
    `fault` reproduces a classic mistake, for the tests and docs only (FAULTS):
    "fp16_without_scaler" lifts the fp16 guard, "clip_before_unscale" clips the scaled
    gradients (the threshold is then effectively max_grad_norm * S).
    `skipped` comes from the scaler's found_inf flags, read before update (step_skipped).
    `schedule` (recompute.parse_schedule) runs the forward with checkpointed segments that
    backward recomputes (recompute.ScheduledRun); in the reference only in fp32 for now:
    amp.Autocast and ScheduledRun each drive the layers themselves, so they do not nest.
    """
    dtype = amp.autocast_dtype(precision)
    if fault not in FAULTS:
        raise ValueError(f"train_step: fault must be one of {FAULTS}, got {fault!r}")
    if precision == "fp16" and not scaler.is_enabled() and fault != "fp16_without_scaler":
        raise ValueError("train_step: precision 'fp16' needs an enabled GradScaler "
                         "(make_scaler('fp16')); bf16 and fp32 do not")
    optimizer.zero_grad()
    runner = amp.Autocast(model, dtype) if schedule is None else _scheduled(model, schedule,
                                                                             precision)
    output = runner.forward(x)
    loss = loss_fn(output, y)  # fp32 op list: losses run in float32 (low-precision values
    #                            already live in float32 arrays here, so no cast is needed)
    runner.backward(loss_fn.backward(scaler.scale(np.ones_like(loss))))  # d(S loss)/dloss
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
    return StepResult(float(loss), scale, skipped,
                      None if grad_norm is None else float(grad_norm))


def _scheduled(model: Module, schedule: Schedule, precision: str) -> Any:
    """The recompute adapter: the model's forward/backward under a checkpointing schedule."""
    from reference import recompute

    if precision != "fp32":
        raise ValueError("reference.train: recompute with precision "
                         f"{precision!r} is not composed in the reference (amp.Autocast and "
                         "recompute.ScheduledRun each drive the layers); torch_impl composes "
                         "them")
    return recompute.ScheduledRun(model, schedule)


# ---------------------------------------------------------------- the digest

def _record(name: str, value: Any) -> bytes:
    if isinstance(value, np.ndarray | np.generic):
        a = np.ascontiguousarray(np.asarray(value))
        body = (f"{name}\0{a.dtype.newbyteorder('<').str}\0{','.join(map(str, a.shape))}\0"
                .encode() + a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
    else:
        body = f"{name}\0py\0{value!r}".encode()
    return struct.pack("<Q", len(body)) + body


def state_digest(state: Mapping[str, Any]) -> str:
    """SHA-256 of params, optimizer buffers, scaler and data position (NOTE [ Canonical ...])."""
    h = hashlib.sha256()
    for key, value in state["model"].items():
        h.update(_record(f"model/{key}", value))
    opt_state = state["optimizer"]["state"]
    for i in sorted(opt_state):
        for name in sorted(opt_state[i]):
            h.update(_record(f"optimizer/{i}/{name}", opt_state[i][name]))
    for key in sorted(state["scaler"]):
        h.update(_record(f"scaler/{key}", state["scaler"][key]))
    h.update(_record("data/epoch", int(state["data"]["epoch"])))
    h.update(_record("data/position", int(state["data"]["position"])))
    return h.hexdigest()


# ---------------------------------------------------------------- the loop

def train(config: TrainConfig, steps: int, checkpoint_dir: str | Path | None = None,
          checkpoint_every: int = 0, *, resume_from_latest: bool = False, keep: int = 3,
          log: Callable[[str], None] | None = None) -> Run:
    """Train to `steps` total steps, saving a checkpoint every `checkpoint_every` steps.

    With `resume_from_latest`, continue from the newest valid checkpoint in checkpoint_dir
    (corrupt ones are skipped and reported through `log`); temporary files a killed writer
    left are removed first. The final state is saved too when checkpoints are on.
    """
    manager = None if checkpoint_dir is None else resume.CheckpointManager(Path(checkpoint_dir),
                                                                            keep=keep)
    run = Run(config)
    if manager is not None:
        for p in manager.cleanup():
            _say(log, f"removed leftover temporary file {p.name}")
        if resume_from_latest:
            found = manager.latest_valid(like=run.template())
            for p, err in manager.skipped:
                _say(log, f"skipped {p.name}: {err}")
            if found is not None:
                path, state = found
                run = restored(config, state)
                _say(log, f"resumed from {path.name} at step {run.step}")
    while run.step < steps:
        r = run.train_step()
        _say(log, f"step {run.step} loss {r.loss:.6g} scale {r.scale:g} "
                  f"skipped {int(r.skipped)} (total {run.skipped})")
        if manager is not None and checkpoint_every and (
                run.step % checkpoint_every == 0 or run.step == steps):
            manager.save(run.step, run.state_dict())
    return run


def _say(log: Callable[[str], None] | None, line: str) -> None:
    if log is not None:
        log(line)
