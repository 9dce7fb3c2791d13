"""The learning control in fp8 and MX: the tiny GPT of parity/drivers/gpt_learn.py on the copy
task, its blocks' Linears scaled and cast by a precision of common/fp8_train.py, against the
same run under bf16 autocast; the same weights, batches, AdamW and held-out set as
gpt_learn.learn, in either tree.

    python -m parity.drivers.fp8_train_learn    measures every precision (torch tree) into
                                                docs/data/fp8_learning.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from common.fp8_train import SCALED_PRECISIONS
from parity.drivers import gpt as dg
from parity.drivers import gpt_learn as gl
from reference import amp as ramp
from reference import data as rdata
from reference import fp8_train as rfp8
from reference import optim as roptim
from torch_impl import data as tdata
from torch_impl import fp8_train as tfp8

ROOT = Path(__file__).resolve().parents[2]
LEARN_DATA = ROOT / "docs" / "data" / "fp8_learning.json"
CONTROL = "bf16"
# the recipes measured here (docs/data/fp8_learning.json); the 2025-26 ones have their own
# control, on the train command's model: parity/drivers/fp8_train_recipes.py
LEARN_PRECISIONS = (CONTROL, *SCALED_PRECISIONS[:5])
LEARN_STEPS = gl.CONTROL_STEPS  # the measured runs (the docs' table): gpt_learn's control


def learn(tree: str, precision: str, steps: int, every: int = 25) -> gl.Curve:
    """Train one tree in `precision` ("bf16": autocast; else a scaled precision) for `steps`
    AdamW steps; held-out copy accuracy every `every` steps (evaluated in the same precision)."""
    if precision not in LEARN_PRECISIONS:
        raise ValueError(f"learn: precision must be one of {LEARN_PRECISIONS}, got {precision!r}")
    ref, twin = dg.make_pair(gl.CONFIG, np.float32, gl.INIT_SEED)
    held = rdata.make_copy_task(gl.HELD_OUT_SEED, gl.HELD_OUT, prefix=gl.PREFIX,
                                vocab_size=gl.CONFIG.vocab_size)
    curve = gl.Curve(tree, [], [], [], 0.0)
    start = time.perf_counter()
    if tree == "reference":
        if precision != CONTROL:
            rfp8.convert(ref, precision)
        task = rdata.make_copy_task(gl.TRAIN_SEED, gl.TRAIN_SAMPLES, prefix=gl.PREFIX,
                                    vocab_size=gl.CONFIG.vocab_size)
        loader = rdata.make_loader(task, rdata.ResumableSampler(gl.TRAIN_SAMPLES, gl.TRAIN_SEED),
                                   gl.BATCH, drop_last=True)
        opt = roptim.AdamW(ref.parameters(), lr=gl.LR)
        dtype = "bfloat16" if precision == CONTROL else None

        def step_ref(idx: np.ndarray, labels: np.ndarray) -> float:
            ref.zero_grad()
            with ramp.autocast(dtype):
                _, loss = ref.forward(idx, labels)
            ref.backward()
            opt.step()
            return float(loss)

        def evaluate_ref() -> np.ndarray:
            ref.eval()
            with ramp.autocast(dtype):
                logits, _ = ref.forward(held.inputs)
            ref.free_saved()
            ref.train()
            return np.asarray(logits, dtype=np.float32)

        _loop(curve, loader, step_ref, evaluate_ref, held.labels, steps, every)
    else:
        if precision != CONTROL:
            tfp8.convert(twin, precision)
        task_t = tdata.make_copy_task(gl.TRAIN_SEED, gl.TRAIN_SAMPLES, prefix=gl.PREFIX,
                                      vocab_size=gl.CONFIG.vocab_size)
        loader_t = tdata.make_loader(task_t, tdata.ResumableSampler(gl.TRAIN_SAMPLES,
                                                                    gl.TRAIN_SEED),
                                     gl.BATCH, drop_last=True, generator=torch.Generator())
        opt_t = torch.optim.AdamW(twin.parameters(), lr=gl.LR)
        held_t = torch.from_numpy(held.inputs)
        enabled = precision == CONTROL

        def step_torch(idx: torch.Tensor, labels: torch.Tensor) -> float:
            opt_t.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
                _, loss = twin(idx, labels)
            loss.backward()
            opt_t.step()
            return loss.item()

        def evaluate_torch() -> np.ndarray:
            twin.eval()
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
                logits, _ = twin(held_t)
            twin.train()
            return logits.float().numpy()

        _loop(curve, loader_t, step_torch, evaluate_torch, held.labels, steps, every)
    curve.seconds = time.perf_counter() - start
    return curve


def _loop(curve: gl.Curve, loader: object, step_fn: object, evaluate: object,
          labels: np.ndarray, steps: int, every: int) -> None:
    step = 0
    while step < steps:
        for idx, target in loader:  # type: ignore[attr-defined]
            loss = step_fn(idx, target)  # type: ignore[operator]
            step += 1
            if step % every == 0 or step == steps:
                curve.steps.append(step)
                curve.loss.append(loss)
                curve.accuracy.append(gl.copy_accuracy(evaluate(), labels))  # type: ignore[operator]
            if step == steps:
                return


def measure(tree: str = "torch", steps: int = LEARN_STEPS) -> dict:
    """Every precision's curve in `tree`: {precision: {steps, loss, accuracy, seconds}}."""
    out = {}
    for precision in LEARN_PRECISIONS:
        c = learn(tree, precision, steps)
        out[precision] = {"steps": c.steps, "loss": c.loss, "accuracy": c.accuracy,
                          "seconds": round(c.seconds, 2)}
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)
    data = {"tree": "torch", "steps": LEARN_STEPS, "runs": measure("torch")}
    LEARN_DATA.write_text(json.dumps(data, indent=1) + "\n")
    for p, run in data["runs"].items():
        print(p, run["accuracy"][-1], run["seconds"])
