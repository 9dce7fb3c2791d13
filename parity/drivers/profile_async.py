"""Honest timing on the CPU (NOTE [ A sync on the CPU ], torch_impl/profile.py): the torch
tree's step timed with a loader worker as the bottleneck, the batch taken in the data wait
and then in the optimizer phase, and what moved between the two.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from parity.drivers.profile import ProfileCase

WARMUP = 4  # steps dropped per loop: the worker's start and its first prefetched batches
LATENCY_X = 4  # the storage's latency per batch, in synchronized steps (the bottleneck)
MIN_LATENCY_S = 0.002
IN_DATA_WAIT = "batch taken in the data wait"
IN_OPTIMIZER = "batch taken in the optimizer (a step hook)"
MOVED = ("data wait", "optimizer")  # the phases the wait moves between


def rounds(case: ProfileCase) -> int:
    """Timed steps per loop."""
    return max(case.repeats, 7)


def progress_total(case: ProfileCase) -> int:
    return 2 * (WARMUP + rounds(case))


def worker_timings(case: ProfileCase, run: Any, step: Callable[..., Any], step_s: float,
                   progress: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Each loop's step `rounds(case)` times after WARMUP, one loop after the other (two
    loops interleaved would share the workers' period and split the wait between them
    arbitrarily), with storage latency LATENCY_X x `step_s` (the synchronized step's median)."""
    from torch_impl import profile as tprof

    latency = max(MIN_LATENCY_S, LATENCY_X * step_s)
    out: dict[str, list[dict[str, float]]] = {}
    for name in (IN_DATA_WAIT, IN_OPTIMIZER):
        timer = tprof.PhaseTimer(sync=tprof.device_sync(case.device), annotate=False)
        with tprof.WorkerBatches(case.train_config(), latency) as batches:
            hook = (run.optimizer.register_step_post_hook(lambda *_: batches.take_ahead())
                    if name == IN_OPTIMIZER else None)
            try:
                for _ in range(WARMUP + rounds(case)):
                    tprof.drive_step(timer, batches, step, case.device)
                    progress()
            finally:
                if hook is not None:
                    hook.remove()
        out[name] = [s.seconds() for s in timer.steps[WARMUP:]]
    return {"latency_s": latency, "latency_x": LATENCY_X, "min_latency_s": MIN_LATENCY_S,
            "steps": out}
