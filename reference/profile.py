"""Predict one training step phase by phase, then time it and count its bytes at every phase
boundary. The reference's device is the CPU: NumPy finishes each operation before the call
returns, so the clock read at a boundary is the time of the work done, with nothing to
synchronize (torch_impl/profile.py: on CUDA the clock must wait for the device's queue).

# NOTE [ Predicting a phase ]
A roofline: a phase costs its arithmetic at the machine's matmul rate, or its data movement
at the machine's copy bandwidth, as measured by two short probes before anything is predicted:
    R = 2 n^3 / t          one (n x n) @ (n x n) matmul, t the median of k repeats
    W = 2 M / t            one copy of M bytes (read once and written once: 2 M moved)
    forward                t = FLOPs / R             (reference/flops.py: GEMMs only)
    backward               t = (backward + recompute FLOPs) / R
    data wait              t = 2 (bytes of the gathered batch) / W
    host-to-device         t = (bytes of the batch) / W_h2d, 0 when the device is the host
    optimizer              t = words x itemsize x n_params / W: every element of each tensor
                           the update touches is read or written once (a fused update):
                           sgd 3 (p, g read; p written), sgd_momentum 5 (+ buf read and
                           written), adam and adamw 7 (p, g, exp_avg, exp_avg_sq read; p,
                           exp_avg, exp_avg_sq written)
The predicted slowest phase is the largest t. Everything the roofline leaves out (per-op
overhead, small GEMMs below the probe's rate, a sync, a per-tensor loop) is a gap that the
comparison names (parity/drivers/profile.py).

# NOTE [ Phase boundaries ]
One step is a run of phases in this order, each timed from one clock as (start, end):
    data wait          the loop asks for the next batch (OUTSIDE train_step)
    host-to-device     the loop copies it to the device (torch only: the reference's device
                       is the host, there is nothing to copy)
    forward, backward, optimizer    train_step's own `phase(name)` contexts
The step runs from the data wait's start to the optimizer's end; what lies between two
phases (train_step's argument checks, the calls themselves) is "outside the phases": small,
measured, reported, never folded into a phase.
Bytes at each boundary (the step's start, then each phase's end) are the distinct storages
live, each counted once, in the first of these categories that holds it:
    weights, grads, optimizer state (Adam's step included), activations (what the tape or
    autograd holds for backward), batch (the loop's inputs and targets)
At a steady step (the optimizer state exists; W, G, O, A: reference/accounting.py's training
memory and held activations of the model and the loss (the transformer's: its accountant's
saves held under the block schedule, parity/drivers/profile_gpt.py), B the batch, B_s the
part of it that is saved for backward (the MLP's loss saves its labels; the transformer
saves its token ids and targets: B_s = B); fp16's S * loss saves the 0-dim S inside the
backward phase and frees it there: never live at a boundary):
    start          W + G + O            G: the last step's gradients (zero_grad is in forward)
    data wait      W + G + O + B
    h2d            W + G + O + B        (the device copy replaces the host one)
    forward        W + O + A + B - B_s  zero_grad freed G
    backward       W + G + O + B        backward freed A
    optimizer      W + G + O + B
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from reference.profile_meters import BoundaryMemory

PHASES = ("data wait", "host-to-device", "forward", "backward", "optimizer")
CATEGORIES = ("weights", "grads", "optimizer state", "activations", "batch")
TRAFFIC_WORDS = {"sgd": 3, "sgd_momentum": 5, "adam": 7, "adamw": 7}  # NOTE [ Predicting ... ]


# ---------------------------------------------------------------- the prediction
def roofline_seconds(*, flops: int = 0, moved: int = 0, rate: float, bandwidth: float) -> float:
    """max(FLOPs / R, bytes moved / W): the phase's time if it ran at the probes' rates."""
    if not rate > 0 or not bandwidth > 0:
        raise ValueError(f"rate and bandwidth must be > 0, got {rate!r}, {bandwidth!r}")
    return max(flops / rate, moved / bandwidth)


def optimizer_moved_bytes(n_params: int, optimizer: str, itemsize: int = 4) -> int:
    """Bytes a fused update reads and writes: words x itemsize x n_params."""
    if optimizer not in TRAFFIC_WORDS:
        raise ValueError(f"optimizer must be one of {tuple(TRAFFIC_WORDS)}, got {optimizer!r}")
    return TRAFFIC_WORDS[optimizer] * itemsize * n_params


def slowest(seconds: dict[str, float]) -> str:
    """The phase with the largest time (the first of equals, in PHASES order)."""
    return max((p for p in PHASES if p in seconds), key=lambda p: seconds[p])


def _median_ns(fn: Callable[[], object], repeats: int) -> int:
    fn()  # the first call pays for allocation and warm caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return max(1, int(statistics.median(times)))


def matmul_rate(n: int = 256, repeats: int = 9) -> float:
    """FLOP/s of one float32 (n x n) @ (n x n) in NumPy: 2 n^3 over the median time."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    return 2 * n**3 / (_median_ns(lambda: a @ b, repeats) * 1e-9)


def copy_bandwidth(nbytes: int = 1 << 24, repeats: int = 9) -> float:
    """Bytes moved per second by one copy of `nbytes` (2 nbytes: read and written)."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    return 2 * src.nbytes / (_median_ns(lambda: np.copyto(dst, src), repeats) * 1e-9)


def op_overhead(repeats: int = 201) -> float:
    """Seconds of one tiny NumPy call (an add of two 1-element arrays)."""
    a = np.ones(1, dtype=np.float32)
    return _median_ns(lambda: np.add(a, a), repeats) * 1e-9


# ---------------------------------------------------------------- the timer
@dataclass
class Step:
    """One timed step: its start and end, and each phase's (start, end), in ns."""

    start: int
    end: int = 0
    phases: dict[str, tuple[int, int]] = field(default_factory=dict)
    cpu: dict[str, int] = field(default_factory=dict)  # the thread's CPU ns per phase, "step"

    def seconds(self) -> dict[str, float]:
        """Each phase's duration, the step's, and "outside the phases" (the rest)."""
        out = {name: (e - s) * 1e-9 for name, (s, e) in self.phases.items()}
        total = (self.end - self.start) * 1e-9
        return {**out, "step": total, "outside the phases": total - sum(out.values())}

    def off_cpu(self) -> dict[str, float]:
        """Per phase and for the step, wall time less the thread's CPU time: seconds the
        thread was not running (waiting for a core another process held, or blocked)."""
        wall = self.seconds()
        return {name: wall[name] - ns * 1e-9 for name, ns in self.cpu.items()}


class PhaseTimer:
    """perf_counter_ns around each phase (NOTE [ Phase boundaries ]), and the thread's CPU
    time beside it (thread_time_ns: what the wall clock holds beyond it, the thread did not
    run). `timer.phase` is what train_step takes as its `phase` argument; `observers` are
    called as fn(name, "begin" | "end") at each boundary outside the clock readings (before
    a phase's start is read, after its end is: a memory meter is never timed)."""

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns,
                 observers: Iterable[Callable[[str, str], None]] = (),
                 cpu_clock: Callable[[], int] = time.thread_time_ns) -> None:
        self.clock, self.cpu_clock = clock, cpu_clock
        self.observers = list(observers)
        self.steps: list[Step] = []
        self._step: Step | None = None
        self._open: dict[str, int] = {}
        self._cpu: dict[str, int] = {}  # the thread's CPU clock at each open phase's start

    def begin_step(self) -> None:
        self._step = Step(self.clock())
        self._cpu["step"] = self.cpu_clock()
        for observe in self.observers:
            observe("step", "begin")

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """The context train_step enters around each of its phases."""
        self._begin(name)
        try:
            yield
        finally:
            self._end(name)

    def _begin(self, name: str) -> None:
        if self._step is None or name in self._open or name in self._step.phases:
            raise RuntimeError(f"phase {name!r} entered outside a step or twice in one step")
        for observe in self.observers:
            observe(name, "begin")
        self._open[name] = self.clock()
        self._cpu[name] = self.cpu_clock()

    def _end(self, name: str) -> None:
        t = self.clock()
        cpu = self.cpu_clock()
        assert self._step is not None
        self._step.phases[name] = (self._open.pop(name), t)
        self._step.cpu[name] = cpu - self._cpu.pop(name)
        for observe in self.observers:
            observe(name, "end")

    def end_step(self) -> Step:
        assert self._step is not None and not self._open
        self._step.end = self.clock()
        self._step.cpu["step"] = self.cpu_clock() - self._cpu.pop("step")
        step, self._step = self._step, None
        self.steps.append(step)
        return step


def drive_step(timer: PhaseTimer, next_batch: Callable[[], tuple[np.ndarray, np.ndarray]],
               step_fn: Callable[..., Any], meter: BoundaryMemory | None = None) -> Any:
    """One step of the loop: the data wait timed here, OUTSIDE the step, then
    step_fn(x, y, phase=timer.phase) (train_step with its arguments bound)."""
    timer.begin_step()
    with timer.phase("data wait"):
        x, y = next_batch()
        if meter is not None:
            meter.batch = (x, y)
    # the reference's device is the host: no host-to-device phase
    result = step_fn(x, y, phase=timer.phase)
    timer.end_step()
    if meter is not None:
        meter.batch = ()
    return result
