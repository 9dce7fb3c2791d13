"""Cost of the numerics detector: a checked training step against the unchecked one.

    python benchmarks/numerics.py [--repeats 7] [--steps 30] [--write]

Two runs of the same configuration (torch_impl.train.Run, one torch thread, CPU): one steps
plainly, the other with `phase=Detector.phase` (the counts of every activation and gradient,
one reduction and one `.tolist()` per step). Within each repeat the two take turns by blocks
of `--steps` steps, and the ratio is formed per repeat, so a slow moment of the shared
machine hits both sides. Reported per size and precision: the median wall ratio, its
min-max over the repeats, and the ratio of the median CPU times (time.process_time).
Sizes: the default model (8, 32, 32, 3) with batch 16, whose step is a millisecond of tiny
kernels (the detector's dozen kernels are a large share of it), and a wider one
(64, 256, 256, 16) with batch 128, where the per-tensor cost is small against the work.
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
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reference.train import TrainConfig  # noqa: E402
from torch_impl import numerics  # noqa: E402
from torch_impl.train import Run  # noqa: E402

SIZES = {"default": {"sizes": (8, 32, 32, 3), "batch_size": 16, "num_samples": 256},
         "wide": {"sizes": (64, 256, 256, 16), "batch_size": 128, "num_samples": 4096}}
GOAL = 1.10  # the goal: under 10% at the default size


def _block(run: Run, steps: int, phase: object | None) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        run.train_step() if phase is None else run.train_step(phase=phase)
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(size: str, precision: str, repeats: int, steps: int) -> dict[str, float]:
    config = TrainConfig(**SIZES[size], precision=precision, horizon=10**6)
    plain, checked = Run(config), Run(config)
    detector = numerics.Detector(checked.model, checked.loss_fn,
                                 numerics.view_format(precision),
                                 scaler_enabled=checked.scaler.is_enabled())
    _block(plain, 3, None), _block(checked, 3, detector.phase)  # warm up
    ratios, cpu_plain, cpu_checked = [], [], []
    for _ in range(repeats):
        wall_a, cpu_a = _block(plain, steps, None)
        wall_b, cpu_b = _block(checked, steps, detector.phase)
        ratios.append(wall_b / wall_a)
        cpu_plain.append(cpu_a)
        cpu_checked.append(cpu_b)
    return {"wall_ratio": statistics.median(ratios), "wall_min": min(ratios),
            "wall_max": max(ratios),
            "cpu_ratio": statistics.median(cpu_checked) / statistics.median(cpu_plain),
            "plain_ms": 1e3 * statistics.median(cpu_plain) / steps}


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
                  f"(plain step {r['plain_ms']:.2f} ms cpu)", flush=True)
    result = {"torch": torch.__version__, "machine": platform.machine(),
              "repeats": args.repeats, "steps": args.steps, "goal": GOAL, "rows": rows}
    if args.write:
        path = ROOT / "docs" / "data" / "numerics_overhead.json"
        path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
