"""One training step over the compact model, in PyTorch. See reference/train.py for the
step and common/train_loop.py for the loop around it and the checkpoint's inventory; this
tree supplies the same two things, its `train_step` and a Run that says where its random
state is.

What PyTorch does differently or hides:
- nn.Dropout draws from the DEFAULT generator (no `generator=` argument), and
  torch.utils.checkpoint replays that same default generator. The run keeps its own
  torch.Generator and swaps it in for the step (NOTE [ Dropout's stream is the default
  generator ]), so the global RNG is never the run's state and never changed by the run.
- DataLoader draws a base seed at every iter() (NOTE [ DataLoader base seed ] in
  torch_impl/data.py). The loader's generator is re-seeded from (seed, epoch) before each
  iter(), so the draw is a function of the epoch, not of the moment a (resumed) run began;
  with num_workers=0 nothing consumes it, and it needs no place in the checkpoint.
  With `loader_workers` the workers prefetch, and the checkpoint still holds the consumed
  position (torch_impl/data_workers.py); the worker seeds derived from that base seed are
  never used (a batch's randomness is seeded from (seed, epoch, batch index)).
- Autocast and recomputation compose natively (torch.autocast around
  torch.utils.checkpoint, which re-enters the forward's autocast state); the reference
  composes them in every precision too, by recording the autocast state at a segment's
  forward and recomputing under it (reference/recompute.py).
- The scaler is torch.amp.GradScaler; on CUDA the dropout stream is a CUDA generator.
- torch's state_dicts hand out live tensors, so a checkpoint's state is a cloned snapshot.
- nvfp4's and bf16-sr's random bits are the reference's BitStream (numpy, the same bits:
  NOTE [ One bit stream, both trees ] in common/recipes_train.py), its state in rng["bits"].
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from common import train_loop
from common.fp8_train import WEIGHT_PRECISIONS, autocast_precision, needs_bits
from common.recipes_train import BitStream
from common.train_config import OPTIMIZERS, TrainConfig
from common.train_loop import FAULTS, INVENTORY, Phase, StepResult, no_phase
from torch_impl import amp, faults, loss_scaling, numerics, resume
from torch_impl.data import LOADER, hash_words
from torch_impl.data_workers import WorkerLoader
from torch_impl.gpt import GPT
from torch_impl.recipes_train import BF16SR
from torch_impl.recompute import Schedule
from torch_impl.state_digest import state_digest
from torch_impl.train_models import batch_of, build

__all__ = ["FAULTS", "INVENTORY", "Run", "StepResult", "TrainConfig", "restored", "state_digest",
           "train", "train_step"]


# NOTE [ Dropout's stream is the default generator ]
# nn.Dropout (and F.dropout) take no generator: they draw from torch's default generator of
# their device, and torch.utils.checkpoint(preserve_rng_state=True) stashes and replays that
# same default generator. A step therefore runs inside torch.random.fork_rng (which restores
# the global state afterwards) with the run's own generator's state copied in, and copies
# the advanced state back out. The run's stream is an explicit torch.Generator that the
# checkpoint saves; the global RNG is neither read as the run's state nor left changed.


class Run(train_loop.BaseRun):
    """A training run's objects; the counters, the loop and the checkpoint are BaseRun's."""

    tree = train_loop.Tree(resume=resume, faults=faults, numerics=numerics)

    def __init__(self, config: TrainConfig, device: str | torch.device = "cpu",
                 loader_workers: int = 0) -> None:
        """`loader_workers` > 0: batches fetched by that many processes (WorkerLoader; not
        state: the batches, the checkpoint and the digest are those of 0 workers)."""
        super().__init__(config)
        c = config
        self.device = torch.device(device)
        self.generator = torch.Generator().manual_seed(c.seed)  # initialization, then dropout
        self.loader_generator = torch.Generator()
        self.bits = BitStream(c.seed) if needs_bits(c.precision) else None  # SR's bits
        parts = build(c, self.generator, self.device, self.loader_generator, self.bits)
        self.model, self.loss_fn = parts.model, parts.loss_fn
        self.cuda_generator = None
        if self.device.type == "cuda":  # dropout on CUDA draws from the device's generator
            self.cuda_generator = torch.Generator(self.device).manual_seed(c.seed)
        if c.precision in WEIGHT_PRECISIONS:  # bf16 weights, AdamWSR
            self.optimizer = BF16SR(self.model.parameters(), self.bits, lr=c.lr,
                                                  **OPTIMIZERS[c.optimizer])
        else:
            self.optimizer = getattr(torch.optim, c.optimizer)(self.model.parameters(),
                                                               lr=c.lr,
                                                               **OPTIMIZERS[c.optimizer])
        self.scheduler = _make_scheduler(self.optimizer, c)
        self.scaler = loss_scaling.make_scaler(autocast_precision(c.precision), self.device,
                                               init_scale=c.init_scale,
                                               growth_interval=c.growth_interval)
        self.task, self.sampler, self.loader = parts.task, parts.sampler, parts.loader
        if loader_workers:  # NOTE [ Workers run ahead of the sampler state ] (data.py)
            self.loader = WorkerLoader(self.task, self.sampler, c.batch_size, drop_last=True,
                                       generator=self.loader_generator,
                                       num_workers=loader_workers)
        self.schedule = parts.schedule

    def _batch(self, item: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        return batch_of(self.config, item)

    def _new_epoch(self) -> None:
        # the base seed of this epoch's iter() is a function of (seed, epoch)
        seed = int(hash_words(self.config.seed, LOADER, self.sampler.epoch, 1)[0])
        self.loader_generator.manual_seed(seed)

    def _step(self, x: torch.Tensor, y: torch.Tensor, phase: Phase) -> StepResult:
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=self.device.type):
            torch.default_generator.set_state(self.generator.get_state())
            if self.cuda_generator is not None:
                torch.cuda.set_rng_state(self.cuda_generator.get_state(), self.device)
            result = train_step(self.model, self.loss_fn, self.optimizer, self.scaler, x, y,
                                precision=autocast_precision(self.config.precision),
                                max_grad_norm=self.config.max_grad_norm, schedule=self.schedule,
                                fault=self.step_fault, phase=phase)
            self.generator.set_state(torch.default_generator.get_state())
            if self.cuda_generator is not None:
                self.cuda_generator.set_state(torch.cuda.get_rng_state(self.device))
        return result

    def _rng_state(self) -> dict[str, Any]:
        rng = {"model": self.generator.get_state()}
        if self.cuda_generator is not None:
            rng["cuda"] = self.cuda_generator.get_state()
        if self.bits is not None:
            rng["bits"] = self.bits.state()
        return rng

    def _load_rng(self, rng: Mapping[str, Any]) -> None:
        if "model" in rng:  # absent from a mapped state (NOTE [ Cross-implementation mapping ])
            self.generator.set_state(rng["model"])
        if self.cuda_generator is not None and "cuda" in rng:
            self.cuda_generator.set_state(rng["cuda"])
        if self.bits is not None:
            self.bits.load(rng["bits"])

    def _snapshot(self, value: Any) -> Any:
        return _snapshot(value)

    def _disabled_scaler(self) -> torch.amp.GradScaler:
        return loss_scaling.make_scaler("fp32", self.device)


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
    return Run.restored(config, state, omit, device=device)  # type: ignore[return-value]


def train(config: TrainConfig | train_loop.Configure, steps: int,
          checkpoint_dir: str | Path | None = None,
          checkpoint_every: int = 0, **options: Any) -> Run:
    """common.train_loop.train with this tree's Run (`options`: that function's keywords,
    and `device`)."""
    return train_loop.train(Run, config, steps, checkpoint_dir, checkpoint_every, **options)


def _make_scheduler(optimizer: torch.optim.Optimizer, c: TrainConfig
                    ) -> torch.optim.lr_scheduler.LRScheduler:
    lr_scheduler = torch.optim.lr_scheduler
    if c.schedule == "cosine":
        return lr_scheduler.CosineAnnealingLR(optimizer, T_max=c.horizon)
    if c.schedule == "step":
        return lr_scheduler.StepLR(optimizer, step_size=max(1, c.horizon // 4), gamma=0.5)
    return lr_scheduler.StepLR(optimizer, step_size=c.horizon + 1, gamma=1.0)


def train_step(model: nn.Module, loss_fn: nn.Module, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler, x: torch.Tensor, y: torch.Tensor, *,
               precision: str, max_grad_norm: float | None = None,
               schedule: Schedule | None = None, fault: str | None = None,
               phase: Phase = no_phase) -> StepResult:
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
