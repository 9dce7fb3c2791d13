"""What a training run trains, in PyTorch. See reference/train_models.py for the two models.

Same names and order as the reference. What PyTorch does differently: the transformer's
loss is a module, NextTokenLoss, that train_step applies to GPT(idx)'s output as it applies
the MLP's (the reference's GPT computes its loss itself); the weights are drawn
from the run's torch.Generator (the transformer from the meta device, torch_impl/gpt.py),
the task lives on the run's device, and the loader is a DataLoader whose base-seed generator
the run re-seeds per epoch (torch_impl/train.py). TRAIN_SHAPE and TRAIN_COPY_PREFIX are
common/gpt_config.py's (plain data).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from common.fp8_train import SCALED_PRECISIONS
from common.gpt_config import TRAIN_COPY_PREFIX, TRAIN_SHAPE, GPTConfig  # plain data
from common.recipes_train import BitStream
from torch_impl import fp8_train
from torch_impl.data import ResumableSampler, make_copy_task, make_loader, make_task
from torch_impl.gpt import GPT
from torch_impl.nn import make_mlp
from torch_impl.recompute import Schedule, parse_schedule
from torch_impl.recompute_gpt import set_recompute

if TYPE_CHECKING:
    from common.train_config import TrainConfig

__all__ = ["NextTokenLoss", "Parts", "batch_of", "build", "gpt_config"]


class NextTokenLoss(nn.Module):
    """F.cross_entropy over GPT(idx)'s (B T, V) logits: the loss GPT.forward computes when
    given targets, as a module, so that train_step's `loss_fn(model(x), y)` serves the
    transformer too (the reference's GPT computes it itself: reference/train.py)."""

    def forward(self, output: tuple[torch.Tensor, None], targets: torch.Tensor) -> torch.Tensor:
        logits = output[0]
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


@dataclass
class Parts:
    """A run's model, loss (NextTokenLoss for gpt), task, sampler, loader, and the schedule
    train_step takes (None for gpt: the model carries its own)."""

    model: Any
    loss_fn: Any
    task: Any
    sampler: ResumableSampler
    loader: Any
    schedule: Schedule | None


def gpt_config(c: TrainConfig) -> GPTConfig:
    """The transformer a gpt run trains: TRAIN_SHAPE with the run's dropout."""
    return replace(TRAIN_SHAPE, dropout=c.dropout)


def build(c: TrainConfig, generator: torch.Generator, device: torch.device,
          loader_generator: torch.Generator, bits: BitStream | None = None) -> Parts:
    """Every part of a run of `c` on `device`, the weights drawn from `generator`, a scaled
    precision's random bits from `bits` (ValueError: a recompute spec the model cannot
    take)."""
    sampler = ResumableSampler(c.num_samples, c.seed)
    if c.model == "gpt":
        model = GPT(gpt_config(c), generator=generator, device=device)
        set_recompute(model, c.recompute)
        if c.precision in SCALED_PRECISIONS:  # the blocks' Linears scaled and cast
            fp8_train.convert(model, c.precision, bits)
        task = make_copy_task(c.seed, c.num_samples, prefix=TRAIN_COPY_PREFIX,
                              vocab_size=TRAIN_SHAPE.vocab_size, device=device)
        loader = make_loader(task, sampler, c.batch_size, drop_last=True,
                             generator=loader_generator)
        return Parts(model, NextTokenLoss(), task, sampler, loader, None)
    model = make_mlp(c.sizes, c.activation, c.dropout, generator=generator, device=device)
    loss_fn = nn.CrossEntropyLoss() if c.loss == "cross_entropy" else nn.MSELoss()
    task = make_task(c.seed, c.num_samples, features=c.sizes[0], classes=c.sizes[-1],
                     device=device)
    loader = make_loader(task, sampler, c.batch_size, drop_last=True, generator=loader_generator)
    schedule = None if c.recompute == "none" else parse_schedule(c.recompute, len(model))
    return Parts(model, loss_fn, task, sampler, loader, schedule)


def batch_of(c: TrainConfig, item: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of what the loader yielded (reference/train_models.py)."""
    if c.model == "gpt":
        return item[0], item[1]
    x, labels, values = item
    return x, (labels if c.loss == "cross_entropy" else values)
