"""torch_impl/profile.py's PhaseTimer held to NOTE [ Honest timing ]: work queued on a
device lands in the phase that launched it only because the timer synchronizes before it
reads a phase's end; the batch source's wait is booked in "data wait", outside the step's
own phases; a memory meter's readings are never inside a phase's clock.

On the CPU torch kernels finish before their call returns, so nothing could show a missing
sync. `QueueDevice` is an honest asynchronous boundary instead: its work runs on a
background thread (a kernel queued on a stream), `sync` waits for it (torch.cuda.synchronize).
Every claim is read off the timer's own intervals (where a piece of work FINISHED, on the
timer's clock), so none depends on how busy the machine is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import torch

from torch_impl.profile import PhaseTimer, Step, _median_ns, device_sync, drive_step

WORK = 0.05  # seconds of queued device work, of a batch source's wait
READING = 0.01  # seconds of one memory meter reading


class QueueDevice:
    """launch(s) queues s seconds of work and returns at once (a kernel launch); sync() waits
    until the queue is empty; finished holds each job's end on the timer's clock."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1)  # one stream: jobs run in order
        self._queued: list[Future] = []
        self.finished: list[int] = []

    def launch(self, seconds: float) -> None:
        def work() -> None:
            time.sleep(seconds)
            self.finished.append(time.perf_counter_ns())

        self._queued.append(self._pool.submit(work))

    def sync(self) -> None:
        for job in self._queued:
            job.result()
        self._queued.clear()

    def close(self) -> None:
        self.sync()
        self._pool.shutdown()


@pytest.fixture
def queue() -> Iterator[QueueDevice]:
    device = QueueDevice()
    yield device
    device.close()


def landed(step: Step, t: int) -> str:
    """The phase whose interval holds clock reading t; "outside the phases" inside the step
    but in no phase; "outside the step" otherwise."""
    for name, (start, end) in step.phases.items():
        if start <= t <= end:
            return name
    return "outside the phases" if step.start <= t <= step.end else "outside the step"


def queued_step(timer: PhaseTimer, queue: QueueDevice, before: str) -> Step:
    """A step whose work is queued just before the phase `before` opens ("step": before
    the step begins, "forward": inside the forward), and whose optimizer ends with a host
    read of a device value (train_step's loss.item(): the host waits for the queue)."""
    if before == "step":
        queue.launch(WORK)
    timer.begin_step()
    with timer.phase("forward"):
        if before == "forward":
            queue.launch(WORK)
    if before == "backward":
        queue.launch(WORK)
    with timer.phase("backward"):
        pass
    with timer.phase("optimizer"):
        queue.sync()  # loss.item()
    return timer.end_step()


def test_with_the_sync_queued_work_lands_in_the_phase_that_launched_it(
        queue: QueueDevice) -> None:
    step = queued_step(PhaseTimer(sync=queue.sync, annotate=False), queue, "forward")
    assert landed(step, queue.finished[0]) == "forward"
    assert step.seconds()["forward"] >= WORK


def test_without_the_sync_queued_work_lands_where_the_host_first_waits(
        queue: QueueDevice) -> None:
    """The dishonest timing of the NOTE: the forward measures the launch, and the work is
    booked under the optimizer, whose .item() is the first wait."""
    step = queued_step(PhaseTimer(sync=None, annotate=False), queue, "forward")
    assert landed(step, queue.finished[0]) == "optimizer"
    assert step.seconds()["forward"] < WORK  # the launch alone


@pytest.mark.parametrize(("before", "where"), [("step", "outside the step"),
                                               ("backward", "outside the phases")])
def test_work_queued_before_a_phase_opens_is_never_booked_to_it(
        queue: QueueDevice, before: str, where: str) -> None:
    """The sync at a phase's (and the step's) start: what was queued earlier belongs to
    the time before it."""
    step = queued_step(PhaseTimer(sync=queue.sync, annotate=False), queue, before)
    assert landed(step, queue.finished[0]) == where


def test_the_probes_time_the_queued_work_not_its_launch(queue: QueueDevice) -> None:
    """The machine's rates (matmul_rate, copy_bandwidth) come from _median_ns, which waits
    for the device after each call: a call that only queues READING seconds takes them."""
    assert _median_ns(lambda: queue.launch(READING), 3, queue.sync) >= READING * 1e9


def test_the_profiles_sync_on_cuda_is_torch_cuda_synchronize_of_that_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Read without a GPU: the function device_sync gives calls synchronize(device)."""
    calls: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", calls.append)
    assert device_sync("cpu") is None
    sync = device_sync("cuda:1")
    assert sync is not None
    sync()
    assert calls == [torch.device("cuda:1")]


def test_a_cuda_kernel_lands_in_the_phase_that_launched_it(cuda_device: str) -> None:
    """The same claim on a real stream: torch.cuda._sleep queues a kernel that spins for a
    number of cycles; device_sync is what the profile gives the timer."""
    torch.cuda.synchronize(cuda_device)
    for sync, booked in ((device_sync(cuda_device), "forward"), (None, "optimizer")):
        timer = PhaseTimer(sync=sync, annotate=False)
        timer.begin_step()
        with torch.cuda.device(cuda_device), timer.phase("forward"):
            torch.cuda._sleep(int(WORK * 2e9))  # >= WORK seconds below a 2 GHz clock
        with timer.phase("optimizer"):
            torch.cuda.synchronize(cuda_device)  # loss.item()
        seconds = timer.end_step().seconds()
        assert max(("forward", "optimizer"), key=seconds.__getitem__) == booked


# ---------------------------------------------------------------- the loop's boundaries
def stand_in_step(x: torch.Tensor, y: torch.Tensor, *, phase: Callable[[str], Any]) -> bool:
    """train_step's phases around a tiny amount of work."""
    with phase("forward"):
        loss = (x * 2).sum()
    with phase("backward"):
        loss = loss + 1
    with phase("optimizer"):
        return bool(loss.item() == loss.item())


def test_a_slow_batch_source_is_booked_in_data_wait_outside_the_steps_phases() -> None:
    waits: list[tuple[int, int]] = []

    def slow_batches() -> tuple[torch.Tensor, torch.Tensor]:
        start = time.perf_counter_ns()
        time.sleep(WORK)
        waits.append((start, time.perf_counter_ns()))
        return torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)

    timer = PhaseTimer(annotate=False)
    drive_step(timer, slow_batches, stand_in_step, "cpu")
    step, seconds = timer.steps[-1], timer.steps[-1].seconds()
    assert {landed(step, t) for t in waits[0]} == {"data wait"}
    assert seconds["data wait"] >= WORK > max(seconds["forward"], seconds["outside the phases"])


class SlowCopy:
    """A host batch whose copy to the device takes READING seconds; copies holds their spans."""

    def __init__(self, copies: list[tuple[int, int]]) -> None:
        self.copies = copies

    def to(self, device: str) -> torch.Tensor:
        start = time.perf_counter_ns()
        time.sleep(READING)
        self.copies.append((start, time.perf_counter_ns()))
        return torch.zeros(2, 3, device=device)


def test_the_copy_to_the_device_is_booked_in_host_to_device() -> None:
    copies: list[tuple[int, int]] = []
    timer = PhaseTimer(annotate=False)
    drive_step(timer, lambda: (SlowCopy(copies), SlowCopy(copies)), stand_in_step, "cpu")
    step = timer.steps[-1]
    assert len(copies) == 2
    assert {landed(step, t) for span in copies for t in span} == {"host-to-device"}


class SlowMeter:
    """A memory meter whose every reading costs READING seconds; readings holds their spans."""

    def __init__(self) -> None:
        self.batch: tuple[torch.Tensor, ...] = ()
        self.readings: list[tuple[int, int]] = []

    def __call__(self, name: str, when: str) -> None:
        start = time.perf_counter_ns()
        time.sleep(READING)
        self.readings.append((start, time.perf_counter_ns()))


def test_the_memory_meters_own_cost_is_outside_every_phase() -> None:
    """Each reading's span overlaps no phase; the step holds them all "outside the phases"
    (begin_step's reading and every phase's begin and end: 1 + 2 x 5)."""
    meter = SlowMeter()
    timer = PhaseTimer(observers=[meter], annotate=False)
    drive_step(timer, lambda: (torch.zeros(2, 3), torch.zeros(2)), stand_in_step, "cpu", meter)
    step = timer.steps[-1]
    assert len(meter.readings) == 11
    for start, end in meter.readings:
        assert all(end < s or e < start for s, e in step.phases.values()), (start, end)
    assert step.seconds()["outside the phases"] >= 11 * READING


def test_the_worker_loader_hands_over_the_batch_taken_ahead_and_ends_its_worker() -> None:
    """NOTE [ A sync on the CPU ]: take_ahead() fetches the next batch early, the next call
    returns exactly it (the order is the same with or without taking ahead), and leaving the
    context ends the worker process."""
    import multiprocessing

    from common.train_config import TrainConfig
    from torch_impl.profile import WorkerBatches

    config = TrainConfig(batch_size=4, num_samples=12)
    with WorkerBatches(config, 0.0) as plain:
        expected = [plain()[0] for _ in range(5)]  # wraps around: 3 batches a cycle
    with WorkerBatches(config, 0.0) as ahead:
        got = [ahead()[0]]
        for _ in range(4):
            ahead.take_ahead()
            got.append(ahead()[0])
        assert multiprocessing.active_children(), "the batches came from a worker process"
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert torch.equal(expected[0], expected[3]) and not torch.equal(expected[0], expected[1])
    assert not multiprocessing.active_children()
