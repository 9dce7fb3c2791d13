"""Time one training step phase by phase and count its bytes at every phase boundary, with
PyTorch's own instruments. See reference/profile.py for the prediction (NOTE [ Predicting a
phase ]) and the phases and their boundaries (NOTE [ Phase boundaries ]).

What PyTorch does differently or hides:
- CUDA kernels run asynchronously: a call returns when the kernel is QUEUED, so a clock read
  on the host measures the launch, and the work lands at the next sync, in whichever phase
  that is (NOTE [ Honest timing ]). The timer synchronizes the device at every boundary
  before it reads the clock. On the CPU, kernels run on the calling thread before the call
  returns: there is nothing to wait for, and the timer says so ("CPU").
- Each phase is also a `torch.profiler.record_function` range, so a chrome trace of a few
  steps under `torch.profiler.schedule(wait, warmup, active)` shows the same phases beside
  every aten op (`profiled_steps`).
- Saved tensors are autograd's, invisible to the module: `BoundaryMemory`
  (torch_impl/profile_meters.py, with the op census and the seeded fault) packs each into a
  small holder with `saved_tensors_hooks` and keeps a weak reference to the holder, so at a
  boundary it knows which saved tensors autograd still holds (backward drops them).
- On CUDA the caching allocator has its own view: `memory_allocated` (blocks handed out,
  each rounded up to 512 bytes), `memory_reserved` (plus the cache), and
  `max_memory_allocated` since `reset_peak_memory_stats`, which BoundaryMemory calls at the
  start of every phase: each phase's own peak.
- Adam's `step` stays on the CPU unless capturable or fused: not in device memory.

# NOTE [ Honest timing ]
On CUDA a host clock read without a synchronize measures how long the host took to QUEUE
the phase's kernels. The device's time surfaces at the next point where the host waits for
it: torch.cuda.synchronize, an .item() / .cpu() / print of a device value, a copy to a
pageable host buffer. train_step ends with loss.item(), so an unsynchronized profile books
the forward's and backward's device time under the optimizer; a stray .item() in the
forward (a debug print: the seeded fault profile_meters.item_in_forward) moves that time
back into the forward. Synchronizing at every boundary puts each phase's work in its own
phase, at the price of the overlap the queue would have bought. On the CPU none of this can
appear: every op has finished when its call returns, and the same three timings differ only
by noise.

# NOTE [ A sync on the CPU ]
The CPU's asynchronous boundary is the DataLoader's worker process. With num_workers >= 1 a
worker fetches batches in another process while the step runs, and the training process sees
that work only as the time it WAITS for a batch: the wait lands wherever the loop first
blocks on the loader, as the device's time lands at the first sync. `WorkerBatches` is such
a loader: one worker, and storage that takes `latency_s` per batch (the worker sleeps, as a
read from a slow disk would, and takes no core from the step). Made the bottleneck (latency
above the step), each batch is waited for latency less the time since the last request, and
two loops with the same train_step book that wait in different phases:
    taken in the data wait    the loop asks for the batch at the top of the step (drive_step)
    taken in the optimizer    an optimizer step post-hook asks for the NEXT batch (a
                              "helpful" prefetch a trainer's callback might do), inside the
                              optimizer phase; the next data wait hands over the held batch
The optimizer does the same work in both and the worker does the same work in both; the
second loop's optimizer phase is longer by the wait, and its data wait is nearly nothing. The
step's total stays the worker's period. Timing a phase tells what the thread waited for in
it, not what that phase cost: the lesson the .item() teaches on CUDA.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from common.gpt_config import TRAIN_COPY_PREFIX, TRAIN_SHAPE  # plain data
from common.train_loop import Batches
from torch_impl import data as tdata
from torch_impl.accounting import cuda_allocated
from torch_impl.train_models import batch_of

if TYPE_CHECKING:
    from common.train_config import TrainConfig
    from torch_impl.profile_meters import BoundaryMemory


@dataclass
class Step:
    """One timed step: its start and end, and each phase's (start, end), in ns (the
    reference's Step, field for field)."""

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


def device_sync(device: str | torch.device) -> Callable[[], None] | None:
    """What waits for the device's queue: torch.cuda.synchronize on CUDA, None on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return None


# ---------------------------------------------------------------- the machine's rates
def _median_ns(fn: Callable[[], object], repeats: int, sync: Callable[[], None] | None) -> int:
    fn()  # the first call pays for allocation, cuBLAS's handle and workspace, warm caches
    times = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        t0 = time.perf_counter_ns()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter_ns() - t0)
    return max(1, int(statistics.median(times)))


def matmul_rate(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                n: int = 256, repeats: int = 9) -> float:
    """FLOP/s of one (n x n) @ (n x n) in `dtype` on `device`: 2 n^3 over the median time."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(device, dtype) for _ in range(2))
    return 2 * n**3 / (_median_ns(lambda: a @ b, repeats, device_sync(device)) * 1e-9)


def copy_bandwidth(device: str | torch.device = "cpu", nbytes: int = 1 << 24,
                   repeats: int = 9) -> float:
    """Bytes moved per second by one copy of `nbytes` on `device` (2 nbytes moved)."""
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / (_median_ns(lambda: dst.copy_(src), repeats, device_sync(device)) * 1e-9)


def h2d_bandwidth(device: str | torch.device, nbytes: int = 1 << 24,
                  repeats: int = 9) -> float | None:
    """Bytes per second of a copy from pageable host memory to `device`; None on the CPU (a
    tensor already on the device is not copied)."""
    if torch.device(device).type == "cpu":
        return None
    src = torch.ones(nbytes // 4)
    return nbytes / (_median_ns(lambda: src.to(device), repeats, device_sync(device)) * 1e-9)


def op_overhead(device: str | torch.device = "cpu", repeats: int = 201) -> float:
    """Seconds of one tiny aten op (an add of two 1-element tensors): the dispatcher's and
    the interpreter's cost of an op that computes nothing (a kernel launch on CUDA)."""
    a = torch.ones(1, device=device)
    return _median_ns(lambda: torch.add(a, a), repeats, device_sync(device)) * 1e-9


def cublas_workspace_bytes(device: str | torch.device) -> int | None:
    """Bytes the first GEMM of the process adds to memory_allocated beyond its result: the
    cuBLAS workspace, kept for the stream's life (0 if a GEMM ran before; None on the CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    a = torch.ones(8, 8, device=device)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    c = a @ a
    torch.cuda.synchronize(device)
    result = cuda_allocated(c.untyped_storage().nbytes())
    return torch.cuda.memory_allocated(device) - before - result


def sync_latency(device: str | torch.device, repeats: int = 21) -> float:
    """Seconds of one synchronize with nothing queued (0 on the CPU: there is no queue)."""
    sync = device_sync(device)
    return 0.0 if sync is None else _median_ns(sync, repeats, None) * 1e-9


# ---------------------------------------------------------------- the timer
class PhaseTimer:
    """perf_counter_ns around each phase, the device synchronized before every clock read
    (`sync`: device_sync(device); None = do not wait, the dishonest timing of NOTE [ Honest
    timing ]), each phase a record_function range for the profiler's trace; the thread's CPU
    time beside the wall clock (a blocking sync spins: on CUDA it counts as CPU time)."""

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns,
                 observers: Iterable[Callable[[str, str], None]] = (),
                 sync: Callable[[], None] | None = None, annotate: bool = True,
                 cpu_clock: Callable[[], int] = time.thread_time_ns) -> None:
        self.clock, self.sync, self.annotate = clock, sync, annotate
        self.cpu_clock = cpu_clock
        self.observers = list(observers)
        self.steps: list[Step] = []
        self._step: Step | None = None
        self._open: dict[str, tuple[int, Any]] = {}
        self._cpu: dict[str, int] = {}  # the thread's CPU clock at each open phase's start

    def begin_step(self) -> None:
        if self.sync is not None:
            self.sync()
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
        if self.sync is not None:
            self.sync()  # what was queued before belongs to the phase before
        annotation = torch.profiler.record_function(name) if self.annotate else None
        if annotation is not None:
            annotation.__enter__()
        self._open[name] = (self.clock(), annotation)
        self._cpu[name] = self.cpu_clock()

    def _end(self, name: str) -> None:
        if self.sync is not None:
            self.sync()  # the phase's kernels have finished: now the clock means something
        t = self.clock()
        cpu = self.cpu_clock()
        assert self._step is not None
        start, annotation = self._open.pop(name)
        if annotation is not None:
            annotation.__exit__(None, None, None)
        self._step.phases[name] = (start, t)
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


def drive_step(timer: PhaseTimer, next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
               step_fn: Callable[..., Any], device: str | torch.device,
               meter: BoundaryMemory | None = None) -> Any:
    """One step of the loop: the data wait and the copy to the device timed here, OUTSIDE
    the step, then step_fn(x, y, phase=timer.phase) (train_step with its arguments bound)."""
    timer.begin_step()
    with timer.phase("data wait"):
        x, y = next_batch()
        if meter is not None:
            meter.batch = (x, y)
    with timer.phase("host-to-device"):
        x, y = x.to(device), y.to(device)  # a tensor already on the device is returned as is
        if meter is not None:
            meter.batch = (x, y)
    result = step_fn(x, y, phase=timer.phase)
    timer.end_step()
    if meter is not None:
        meter.batch = ()
    return result


class HostBatches:
    """The run's batches on the HOST (torch_impl.train.Run builds its task on the device: a
    profile wants the batch in host memory and the copy as a phase of its own): the task of
    the config's model (torch_impl/train_models.py), its loader, (inputs, targets)."""

    def __init__(self, config: TrainConfig) -> None:
        c = self.config = config
        if c.model == "gpt":
            task = tdata.make_copy_task(c.seed, c.num_samples, prefix=TRAIN_COPY_PREFIX,
                                        vocab_size=TRAIN_SHAPE.vocab_size)
        else:
            task = tdata.make_task(c.seed, c.num_samples, features=c.sizes[0],
                                   classes=c.sizes[-1])
        self.loader = tdata.make_loader(task, tdata.ResumableSampler(c.num_samples, c.seed),
                                        c.batch_size, drop_last=True,
                                        generator=torch.Generator().manual_seed(c.seed))
        self._batches = Batches(self.loader)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return batch_of(self.config, self._batches.next())


class SlowStorage(torch.utils.data.Dataset):
    """`task`'s samples read from storage that takes `latency_s` per batch: the worker sleeps
    (a slow disk's read costs no core), then reads them (NOTE [ A sync on the CPU ])."""

    def __init__(self, task: torch.utils.data.Dataset, latency_s: float) -> None:
        self.task, self.latency_s = task, latency_s

    def __len__(self) -> int:
        return len(self.task)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Any:
        return self.task[i]

    def __getitems__(self, indices: list[int]) -> list[Any]:  # torch's fetcher: one per batch
        time.sleep(self.latency_s)
        return [self.task[i] for i in indices]


class _Cycle:
    """The batches' indices, in order, again and again (the timing needs no shuffle)."""

    def __init__(self, n: int, batch: int) -> None:
        self.n, self.batch = n, batch

    def __iter__(self) -> Iterator[list[int]]:
        starts = range(0, self.n - self.batch + 1, self.batch)
        while True:
            for s in starts:
                yield list(range(s, s + self.batch))


class WorkerBatches:
    """`config`'s batches fetched by ONE worker process from SlowStorage, prefetch_factor 2
    (NOTE [ A sync on the CPU ]): call it for the next batch; `take_ahead()` fetches the one
    after now and the next call hands it over. A context manager: leaving it ends the worker."""

    def __init__(self, config: TrainConfig, latency_s: float) -> None:
        self.config = config
        task = HostBatches(config).loader.dataset
        self.loader = torch.utils.data.DataLoader(
            SlowStorage(task, latency_s), batch_sampler=_Cycle(len(task), config.batch_size),
            num_workers=1, prefetch_factor=2)
        self._it: Any = None
        self._held: tuple[torch.Tensor, torch.Tensor] | None = None

    def __enter__(self) -> WorkerBatches:
        self._it = iter(self.loader)
        return self

    def __exit__(self, *exc: object) -> None:
        it, self._it = self._it, None
        if it is not None:
            it._shutdown_workers()  # at once, not when the garbage collector gets to it

    def take_ahead(self) -> None:
        self._held = batch_of(self.config, next(self._it))

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        held, self._held = self._held, None
        return held if held is not None else batch_of(self.config, next(self._it))


def profiled_steps(steps: int, one_step: Callable[[int], None], *, wait: int, warmup: int,
                   active: int, trace: str | None, cuda: bool) -> None:
    """Run one_step(i) for i < steps under torch.profiler with schedule(wait, warmup, active,
    repeat=1): steps wait + warmup .. + active are recorded and written to `trace` as a chrome
    trace. Steps past the window run under the profiler unrecorded; a caller comparing with
    a run WITHOUT the profiler runs those after this returns: while the profiler is on, its
    callbacks cost every op something even outside the window."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def ready(prof: torch.profiler.profile) -> None:
        if trace is not None:
            prof.export_chrome_trace(trace)

    schedule = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    # acc_events: one cycle (repeat=1), nothing to accumulate; without it torch 2.11 warns
    # at the window's start that events are cleared per cycle (2.6 has no such warning)
    with torch.profiler.profile(activities=activities, schedule=schedule,
                                on_trace_ready=ready, acc_events=True) as prof:
        for i in range(steps):
            one_step(i)
            prof.step()
