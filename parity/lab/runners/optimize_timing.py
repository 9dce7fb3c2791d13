"""The gauntlet's clock and statistics: interleaved repeats, the first call timed apart,
median, IQR and a bootstrap interval of the speedup (parity/lab/runners/optimize.py runs them).

NOTE [ The first call is timed apart ]
Each side's very first training step is timed alone, on the wall clock, and never enters
the samples: for torch.compile it is where Dynamo captures and Inductor generates and builds
the kernels (seconds, partly in worker processes, which is why the clock is the wall), for
every other optimization it is the allocator's and the caches' warm-up. Then one warm-up
block per side, also unrecorded, and only then the R recorded repeats, so the speedup is
steady-state step time against steady-state step time, and the compile time is a number of
its own beside it (what a run of S steps pays once: first call - median step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

BOOTSTRAP = 2000
CONFIDENCE = 0.95  # the speedup interval's level; the report's text reads it from here


@dataclass
class Timing:
    baseline_cpu: list[float]
    optimized_cpu: list[float]
    baseline_wall: list[float]
    optimized_wall: list[float]
    steps: int
    first_call_wall: dict[str, float] = field(default_factory=dict)  # seconds, per side

    def samples(self, timer: str) -> tuple[np.ndarray, np.ndarray]:
        if timer == "cpu":
            return np.array(self.baseline_cpu), np.array(self.optimized_cpu)
        return np.array(self.baseline_wall), np.array(self.optimized_wall)


def time_interleaved(runs: dict[str, Any], repeats: int, steps: int) -> Timing:
    """runs: {"baseline": Run, "optimized": Run}. Each side's first step timed alone (NOTE
    [ The first call is timed apart ]), one unrecorded warm-up block of `steps` steps per
    side, then R repeats of `steps` steps per side, ABBA-interleaved. Seconds per step, CPU
    time of this process (time.process_time) and wall time."""
    out: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in runs}
    first: dict[str, float] = {}

    def block(name: str, record: bool) -> None:
        run = runs[name]
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            run.train_step()
        c1, w1 = time.process_time(), time.perf_counter()
        if record:
            out[name][0].append((c1 - c0) / steps)
            out[name][1].append((w1 - w0) / steps)

    for name, run in runs.items():
        w0 = time.perf_counter()
        run.train_step()
        first[name] = time.perf_counter() - w0
        block(name, record=False)
    for r in range(repeats):
        order = ("baseline", "optimized") if r % 2 == 0 else ("optimized", "baseline")
        for name in order:
            block(name, record=True)
    return Timing(out["baseline"][0], out["optimized"][0], out["baseline"][1],
                  out["optimized"][1], steps, first)


def speedup(baseline: np.ndarray, optimized: np.ndarray, seed: int = 0
            ) -> tuple[float, float, float]:
    """(ratio of medians baseline/optimized, and the CONFIDENCE interval of its bootstrap
    distribution: its (1 - CONFIDENCE)/2 and (1 + CONFIDENCE)/2 quantiles, the 2.5th and
    97.5th percentile at 95%): each side resampled with replacement, BOOTSTRAP times, seeded."""
    rng = np.random.default_rng(seed)
    b = rng.choice(baseline, (BOOTSTRAP, baseline.size))
    o = rng.choice(optimized, (BOOTSTRAP, optimized.size))
    ratios = np.median(b, axis=1) / np.median(o, axis=1)
    low, high = np.percentile(ratios, [50 * (1 - CONFIDENCE), 50 * (1 + CONFIDENCE)])
    return float(np.median(baseline) / np.median(optimized)), float(low), float(high)


def spread(x: np.ndarray) -> tuple[float, float, float]:
    """(median, 25th, 75th percentile)."""
    q25, q50, q75 = np.percentile(x, [25, 50, 75])
    return float(q50), float(q25), float(q75)

