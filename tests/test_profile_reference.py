"""reference/profile.py's PhaseTimer held to NOTE [ Phase boundaries ]: the batch source's
wait is booked in "data wait", outside train_step's own phases, and a memory meter's
readings are never inside a phase's clock. NumPy finishes each call before it returns, so
there is no queue to synchronize (tests/test_profile_torch.py holds the torch timer's sync).
Every claim is read off the timer's own intervals, so none depends on how busy the machine is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from reference.profile import PhaseTimer, Step, drive_step

WAIT = 0.05  # seconds of one batch source's wait
READING = 0.01  # seconds of one memory meter reading


def landed(step: Step, t: int) -> str:
    """The phase whose interval holds clock reading t; "outside the phases" inside the step
    but in no phase; "outside the step" otherwise."""
    for name, (start, end) in step.phases.items():
        if start <= t <= end:
            return name
    return "outside the phases" if step.start <= t <= step.end else "outside the step"


def stand_in_step(x: np.ndarray, y: np.ndarray, *, phase: Callable[[str], Any]) -> float:
    """train_step's phases around a tiny amount of work."""
    with phase("forward"):
        loss = float((x * 2).sum())
    with phase("backward"):
        loss += 1
    with phase("optimizer"):
        return loss


def test_a_slow_batch_source_is_booked_in_data_wait_outside_the_steps_phases() -> None:
    waits: list[tuple[int, int]] = []

    def slow_batches() -> tuple[np.ndarray, np.ndarray]:
        start = time.perf_counter_ns()
        time.sleep(WAIT)
        waits.append((start, time.perf_counter_ns()))
        return np.zeros((2, 3)), np.zeros(2, dtype=np.int64)

    timer = PhaseTimer()
    drive_step(timer, slow_batches, stand_in_step)
    step, seconds = timer.steps[-1], timer.steps[-1].seconds()
    assert {landed(step, t) for t in waits[0]} == {"data wait"}
    assert seconds["data wait"] >= WAIT > max(seconds["forward"], seconds["outside the phases"])


class SlowMeter:
    """A memory meter whose every reading costs READING seconds; readings holds their spans."""

    def __init__(self) -> None:
        self.batch: tuple[np.ndarray, ...] = ()
        self.readings: list[tuple[int, int]] = []

    def __call__(self, name: str, when: str) -> None:
        start = time.perf_counter_ns()
        time.sleep(READING)
        self.readings.append((start, time.perf_counter_ns()))


def test_the_memory_meters_own_cost_is_outside_every_phase() -> None:
    """Each reading's span overlaps no phase; the step holds them all "outside the phases"
    (begin_step's reading and every phase's begin and end: 1 + 2 x 4, no host-to-device)."""
    meter = SlowMeter()
    timer = PhaseTimer(observers=[meter])
    drive_step(timer, lambda: (np.zeros((2, 3)), np.zeros(2)), stand_in_step, meter)
    step = timer.steps[-1]
    assert len(meter.readings) == 9
    for start, end in meter.readings:
        assert all(end < s or e < start for s, e in step.phases.values()), (start, end)
    assert step.seconds()["outside the phases"] >= 9 * READING
