"""Cost of the numerics detector: a checked training step against the unchecked one.

    python benchmarks/numerics.py [--repeats 7] [--steps 30] [--write]

Two runs of the same configuration (torch_impl.train.Run, one torch thread, CPU): one steps
plainly, the other with `phase=Detector.phase` (the counts of every activation and gradient:
one bucketing pass, one bincount and one `.tolist()` per step). Within each repeat the two
take turns STEP BY STEP (`--steps` pairs, alternating which goes first), and the ratio of
the two sides' median step times is formed per repeat, so a slow moment of the shared
machine hits both sides and a stray slow step does not count. Reported per size and
precision: the median wall ratio, its min-max over the repeats, and the median ratio of
the median thread CPU times (time.thread_time: what this process spent, whatever else runs).
Sizes: the default model (8, 32, 32, 3) with batch 16, whose step is a millisecond of tiny
kernels (the detector's dozen kernels are a large share of it), and a wider one
(64, 256, 256, 16) with batch 128, where the counting pass is large against the step's small
matmuls, and the transformer `train --model gpt` trains (4 blocks, n_embd 32, batch 16 of
16 tokens: 60 activations and 50 gradients counted per step), and that transformer at 4x
its width ("gpt4x": n_embd 128, n_head 2; the benchmark swaps the shape the run builds, a
benchmark-only patch of torch_impl.train_models.TRAIN_SHAPE), the realistic size the
detector's goal is stated at: its counting grows with the activations (4x), the step's
matmuls with the width squared (16x).
`--write` stores the result in docs/data/numerics_overhead.json (docs/numerics.md prints it
through `python -m parity docs`). Never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reference.train import TrainConfig  # noqa: E402
from torch_impl import numerics, train_models  # noqa: E402
from torch_impl.train import Run  # noqa: E402

SIZES = {"default": {"sizes": (8, 32, 32, 3), "batch_size": 16, "num_samples": 256},
         "wide": {"sizes": (64, 256, 256, 16), "batch_size": 128, "num_samples": 4096},
         "gpt": {"model": "gpt"}, "gpt4x": {"model": "gpt"}}
WIDE_GPT = replace(train_models.TRAIN_SHAPE, n_embd=4 * train_models.TRAIN_SHAPE.n_embd)
GOAL = 1.10  # the goal: at most 10% on the transformer at 4x the default width


def _timed(run: Run, phase: object | None) -> tuple[float, float]:
    """One step's (wall, thread CPU) seconds."""
    wall, cpu = time.perf_counter(), time.thread_time()
    run.train_step() if phase is None else run.train_step(phase=phase)
    return time.perf_counter() - wall, time.thread_time() - cpu


def measure(size: str, precision: str, repeats: int, steps: int) -> dict[str, float]:
    config = TrainConfig(**SIZES[size], precision=precision, horizon=10**6)
    shape = WIDE_GPT if size == "gpt4x" else train_models.TRAIN_SHAPE
    with mock.patch.object(train_models, "TRAIN_SHAPE", shape):
        plain, checked = Run(config), Run(config)
    detector = numerics.Detector(checked.model, checked.loss_fn,
                                 numerics.view_format(precision),
                                 scaler_enabled=checked.scaler.is_enabled())
    for _ in range(3):  # warm up
        _timed(plain, None), _timed(checked, detector.phase)
    ratios, cpu_ratios, plain_cpu = [], [], []
    for _ in range(repeats):
        a_wall, a_cpu, b_wall, b_cpu = [], [], [], []
        for i in range(steps):  # step by step, alternating which side goes first
            for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                wall, cpu = (_timed(plain, None) if side == 0
                             else _timed(checked, detector.phase))
                (a_wall if side == 0 else b_wall).append(wall)
                (a_cpu if side == 0 else b_cpu).append(cpu)
        ratios.append(statistics.median(b_wall) / statistics.median(a_wall))
        cpu_ratios.append(statistics.median(b_cpu) / statistics.median(a_cpu))
        plain_cpu.append(statistics.median(a_cpu))
    return {"wall_ratio": statistics.median(ratios), "wall_min": min(ratios),
            "wall_max": max(ratios), "cpu_ratio": statistics.median(cpu_ratios),
            "plain_ms": 1e3 * statistics.median(plain_cpu),
            "extra_ms": 1e3 * statistics.median(plain_cpu) * (statistics.median(cpu_ratios) - 1),
            "extra_calls": _calls(checked, detector.phase) - _calls(plain, None)}


def _calls(run: Run, phase: object | None) -> int:
    """The aten calls one step dispatches (nested ones included), read by torch's profiler:
    the checked step's extra calls are the detector's fixed cost, whatever the size."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run.train_step() if phase is None else run.train_step(phase=phase)
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for size in SIZES:
        for precision in ("fp32", "fp16"):
            r = {"size": size, "precision": precision,
                 **measure(size, precision, args.repeats, args.steps)}
            rows.append(r)
            print(f"{size:8} {precision}: checked/plain wall {r['wall_ratio']:.2f} "
                  f"[{r['wall_min']:.2f}, {r['wall_max']:.2f}], cpu {r['cpu_ratio']:.2f} "
                  f"(plain step {r['plain_ms']:.2f} ms cpu; the detector adds "
                  f"{r['extra_ms']:.2f} ms and {r['extra_calls']} aten calls)", flush=True)
    result = {"torch": torch.__version__, "machine": platform.machine(),
              "repeats": args.repeats, "steps": args.steps, "goal": GOAL, "rows": rows}
    if args.write:
        path = ROOT / "docs" / "data" / "numerics_overhead.json"
        path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
