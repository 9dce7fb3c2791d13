"""What a training run trains: the model, its loss, its task and loader, its recomputation.

reference/train.py's Run builds its parts here, by `TrainConfig.model`:

    mlp   make_mlp(sizes, activation, dropout) on make_task (a teacher's labels or values),
          CrossEntropyLoss or MSELoss; recompute: a schedule over the Sequential's layers
    gpt   the compact transformer (reference/gpt.py) of shape TRAIN_SHAPE, dropout from the
          config, on the copy task (make_copy_task, TRAIN_COPY_PREFIX digits: 2 P tokens =
          the block size; both plain data in gpt_config.py), next-token cross-entropy inside
          the model; recompute: a schedule over the blocks, "selective", or both
          (reference/recompute_gpt.py), set on the model

The generator `rng` initializes the weights and then draws every dropout mask (one
generator, as make_mlp shares it), so the run's random state is one bit_generator.state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from common.fp8_train import SCALED_PRECISIONS
from common.gpt_config import TRAIN_COPY_PREFIX, TRAIN_SHAPE, GPTConfig
from common.recipes_train import BitStream
from reference import fp8_train
from reference.data import ResumableSampler, make_copy_task, make_loader, make_task
from reference.gpt import GPT
from reference.nn import CrossEntropyLoss, MSELoss, make_mlp
from reference.recompute import Schedule, parse_schedule
from reference.recompute_gpt import set_recompute

if TYPE_CHECKING:
    from common.train_config import TrainConfig


@dataclass
class Parts:
    """A run's model, loss (None for gpt: the model computes its own), task, sampler, loader,
    and the schedule train_step takes (None for gpt: the model carries its own)."""

    model: Any
    loss_fn: Any
    task: Any
    sampler: ResumableSampler
    loader: Any
    schedule: Schedule | None


def gpt_config(c: TrainConfig) -> GPTConfig:
    """The transformer a gpt run trains: TRAIN_SHAPE with the run's dropout."""
    return replace(TRAIN_SHAPE, dropout=c.dropout)


def build(c: TrainConfig, rng: np.random.Generator, bits: BitStream | None = None) -> Parts:
    """Every part of a run of `c`, the weights drawn from `rng`, a scaled precision's random
    bits from `bits` (ValueError: a recompute spec the model cannot take)."""
    sampler = ResumableSampler(c.num_samples, c.seed)
    if c.model == "gpt":
        model = GPT(gpt_config(c), rng=rng)
        set_recompute(model, c.recompute)
        if c.precision in SCALED_PRECISIONS:  # the blocks' Linears scaled and cast
            fp8_train.convert(model, c.precision, bits)
        task = make_copy_task(c.seed, c.num_samples, prefix=TRAIN_COPY_PREFIX,
                              vocab_size=TRAIN_SHAPE.vocab_size)
        loader = make_loader(task, sampler, c.batch_size, drop_last=True)
        return Parts(model, None, task, sampler, loader, None)
    model = make_mlp(c.sizes, c.activation, c.dropout, rng=rng)
    loss_fn = CrossEntropyLoss() if c.loss == "cross_entropy" else MSELoss()
    task = make_task(c.seed, c.num_samples, features=c.sizes[0], classes=c.sizes[-1])
    loader = make_loader(task, sampler, c.batch_size, drop_last=True)
    schedule = None if c.recompute == "none" else parse_schedule(c.recompute, len(model))
    return Parts(model, loss_fn, task, sampler, loader, schedule)


def batch_of(c: TrainConfig, item: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of what the loader yielded: (idx, next tokens) for gpt, (x, labels
    or values) for mlp by its loss."""
    if c.model == "gpt":
        return item[0], item[1]
    x, labels, values = item
    return x, (labels if c.loss == "cross_entropy" else values)
