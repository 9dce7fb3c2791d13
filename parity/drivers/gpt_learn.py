"""The learning control: the tiny GPT learns the copy task, in each tree, on the CPU.

Both trees start from the same weights (the reference's init, copied), read the same batches
(the copy task and the resumable sampler of reference/data.py and torch_impl/data.py) and
take AdamW steps (reference.optim.AdamW, torch.optim.AdamW). Every `every` steps the copy
accuracy is measured on a held-out set (another seed): the fraction of copy positions (from
the separator on, NOTE in reference/data.py make_copy_task) whose argmax logit is the label.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from parity.drivers import gpt as dg
from reference import data as rdata
from reference import optim as roptim
from torch_impl import data as tdata

CONFIG = dg.GPTConfig()  # the tiny default: vocab 12, block 16, 2 layers, 2 heads, width 32
PREFIX = 8  # copy 8 digits: 2 * 8 = 16 tokens = block_size
TRAIN_SAMPLES, HELD_OUT, BATCH, LR = 4096, 256, 32, 3e-3
TRAIN_SEED, HELD_OUT_SEED, INIT_SEED = 1, 2, 0
TARGET_ACCURACY = 0.95  # the stated goal: copy accuracy on the held-out set
CONTROL_STEPS = 400  # ... reached within this many steps, in both trees


@dataclass
class Curve:
    """Measured points of one run: step, training loss, held-out copy accuracy, seconds."""

    tree: str
    steps: list[int]
    loss: list[float]
    accuracy: list[float]
    seconds: float


def copy_accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of copy positions (t >= PREFIX) whose argmax logit is the label."""
    return float(np.mean(logits[:, PREFIX:].argmax(-1) == labels[:, PREFIX:]))


def learn(tree: str, steps: int, every: int = 25) -> Curve:
    """Train one tree for `steps` AdamW steps; the curve measured every `every` steps."""
    ref, twin = dg.make_pair(CONFIG, np.float32, INIT_SEED)
    held = rdata.make_copy_task(HELD_OUT_SEED, HELD_OUT, prefix=PREFIX,
                                vocab_size=CONFIG.vocab_size)
    curve = Curve(tree, [], [], [], 0.0)
    start = time.perf_counter()
    if tree == "reference":
        task = rdata.make_copy_task(TRAIN_SEED, TRAIN_SAMPLES, prefix=PREFIX,
                                    vocab_size=CONFIG.vocab_size)
        loader = rdata.make_loader(task, rdata.ResumableSampler(TRAIN_SAMPLES, TRAIN_SEED),
                                   BATCH, drop_last=True)
        opt = roptim.AdamW(ref.parameters(), lr=LR)
        step = 0
        while step < steps:
            for idx, labels in loader:
                ref.zero_grad()
                _, loss = ref.forward(idx, labels)
                ref.backward()
                opt.step()
                step += 1
                if step % every == 0 or step == steps:
                    ref.eval()
                    logits, _ = ref.forward(held.inputs)
                    ref.free_saved()
                    ref.train()
                    curve.steps.append(step)
                    curve.loss.append(float(loss))
                    curve.accuracy.append(copy_accuracy(logits, held.labels))
                if step == steps:
                    break
    else:
        task_t = tdata.make_copy_task(TRAIN_SEED, TRAIN_SAMPLES, prefix=PREFIX,
                                      vocab_size=CONFIG.vocab_size)
        loader_t = tdata.make_loader(task_t, tdata.ResumableSampler(TRAIN_SAMPLES, TRAIN_SEED),
                                     BATCH, drop_last=True, generator=torch.Generator())
        opt_t = torch.optim.AdamW(twin.parameters(), lr=LR)
        held_t = torch.from_numpy(held.inputs)
        step = 0
        while step < steps:
            for idx_t, labels_t in loader_t:
                opt_t.zero_grad()
                _, loss_t = twin(idx_t, labels_t)
                loss_t.backward()
                opt_t.step()
                step += 1
                if step % every == 0 or step == steps:
                    twin.eval()
                    with torch.no_grad():
                        logits_t, _ = twin(held_t)
                    twin.train()
                    curve.steps.append(step)
                    curve.loss.append(loss_t.item())
                    curve.accuracy.append(copy_accuracy(logits_t.numpy(), held.labels))
                if step == steps:
                    break
    curve.seconds = time.perf_counter() - start
    return curve


def steps_to(curve: Curve, accuracy: float = TARGET_ACCURACY) -> int | None:
    """The first measured step whose held-out copy accuracy is >= `accuracy`."""
    return next((s for s, a in zip(curve.steps, curve.accuracy, strict=True) if a >= accuracy),
                None)
