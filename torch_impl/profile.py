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
- Saved tensors are autograd's, invisible to the module: `BoundaryMemory` packs each into a
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
forward (a debug print: the seeded fault `item_in_forward`) moves that time back into the
forward. Synchronizing at every boundary puts each phase's work in its own phase, at the
price of the overlap the queue would have bought. On the CPU none of this can appear: every
op has finished when its call returns, and the same three timings differ only by noise.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from torch_impl import data as tdata
from torch_impl.accounting import cuda_allocated


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
    profile wants the batch in host memory and the copy as a phase of its own)."""

    def __init__(self, seed: int, num_samples: int, features: int, classes: int,
                 batch_size: int, loss: str = "cross_entropy") -> None:
        task = tdata.make_task(seed, num_samples, features=features, classes=classes)
        self.loader = tdata.make_loader(task, tdata.ResumableSampler(num_samples, seed),
                                        batch_size, drop_last=True,
                                        generator=torch.Generator().manual_seed(seed))
        self.loss = loss
        self._batches: Iterator | None = None

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        while True:
            if self._batches is None:
                self._batches = iter(self.loader)
            try:
                x, labels, values = next(self._batches)
            except StopIteration:
                self._batches = None
                continue
            return x, (labels if self.loss == "cross_entropy" else values)


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


# ---------------------------------------------------------------- bytes at the boundaries
class _Held:
    """What the pack hook hands autograd: the saved tensor, behind a weak-referenceable box."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class BoundaryMemory:
    """Bytes by category at every boundary (NOTE [ Phase boundaries ] in reference/profile.py)
    from the tensors themselves: parameters, grads, optimizer state, the saved tensors
    autograd still holds, the loop's batch; distinct (data_ptr, nbytes), parameter storages
    never counted as activations (accounting's notion). On CUDA also each phase's allocator
    view (`cuda`: allocated at start and end, peak, reserved) and, per boundary, the
    allocator's rounding of the storages counted. `with meter:` installs the hooks; use it as
    a PhaseTimer observer."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 device: str | torch.device = "cpu") -> None:
        self.model, self.optimizer, self.device = model, optimizer, torch.device(device)
        self.batch: tuple[torch.Tensor, ...] = ()
        self.boundaries: list[tuple[str, dict[str, int]]] = []
        self.cuda: dict[str, dict[str, int]] = {}
        self._packed: list[weakref.ref] = []
        self._hooks: Any = None

    def _pack(self, t: torch.Tensor) -> _Held:
        held = _Held(t)
        self._packed.append(weakref.ref(held))
        return held

    def __enter__(self) -> BoundaryMemory:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda h: h.tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)

    def saved(self) -> list[torch.Tensor]:
        """The saved tensors autograd holds now."""
        alive = [(ref, ref()) for ref in self._packed]
        self._packed = [ref for ref, held in alive if held is not None]
        return [held.tensor for _, held in alive if held is not None]

    def __call__(self, name: str, when: str) -> None:
        on_cuda = self.device.type == "cuda"
        if on_cuda:
            torch.cuda.synchronize(self.device)
        if (name, when) == ("step", "begin"):
            self.boundaries.append(("start", self.categories()))
        elif when == "begin" and on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)  # this phase's own peak
            self.cuda[name] = {"start": torch.cuda.memory_allocated(self.device)}
        elif when == "end":
            self.boundaries.append((name, self.categories()))
            if on_cuda:
                self.cuda[name].update(end=torch.cuda.memory_allocated(self.device),
                                       peak=torch.cuda.max_memory_allocated(self.device),
                                       reserved=torch.cuda.memory_reserved(self.device))

    def categories(self) -> dict[str, int]:
        seen: set[tuple[int, int]] = set()
        storages: dict[int, int] = {}  # device storages counted: data_ptr -> allocation
        params = list(self.model.parameters())
        param_storages = {p.untyped_storage().data_ptr() for p in params}

        def take(tensors: Iterable[torch.Tensor]) -> int:
            total = 0
            for t in tensors:
                key = (t.data_ptr(), t.numel() * t.element_size())
                if key[1] and key not in seen:
                    seen.add(key)
                    total += key[1]
                    if t.device == self.device:
                        storage = t.untyped_storage()
                        storages[storage.data_ptr()] = storage.nbytes()
            return total

        state = [v for entries in self.optimizer.state.values() for v in entries.values()
                 if isinstance(v, torch.Tensor)]
        out = {"weights": take(params),
               "grads": take(p.grad for p in params if p.grad is not None),
               "optimizer state": take(state),
               "activations": take(t for t in self.saved()
                                   if t.untyped_storage().data_ptr() not in param_storages),
               "batch": take(self.batch)}
        if self.device.type == "cuda":
            out["allocator rounding"] = sum(cuda_allocated(n) - n for n in storages.values())
        return out


# ---------------------------------------------------------------- ops per phase
class OpCensus(TorchDispatchMode):
    """The aten ops each phase dispatches (what the per-op overhead is paid for); a module
    forward run during the backward is recomputation, counted apart as "recompute". `with
    census:` for the whole step; use it as a PhaseTimer observer."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self.phase, self._depth, self._handles = "outside the phases", 0, []
        for module in model.modules():
            self._handles.append(module.register_forward_pre_hook(self._pre))
            self._handles.append(module.register_forward_hook(self._post, always_call=True))

    def _pre(self, module: nn.Module, args: tuple) -> None:
        self._depth += 1

    def _post(self, module: nn.Module, args: tuple, out: object) -> None:
        self._depth -= 1

    def __call__(self, name: str, when: str) -> None:
        if name != "step":
            self.phase = name if when == "begin" else "outside the phases"

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        key = "recompute" if self.phase == "backward" and self._depth else self.phase
        self.counts[key] = self.counts.get(key, 0) + 1
        return func(*args, **(kwargs or {}))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


# ---------------------------------------------------------------- the seeded fault
@contextlib.contextmanager
def item_in_forward(model: nn.Module) -> Iterator[list[int]]:
    """A forward hook that reads one value of the output with .item() (a debug print): on
    CUDA the host waits there for every kernel queued so far (NOTE [ Honest timing ]). Yields
    the list of calls, so a caller can prove the fault ran."""
    calls: list[int] = []

    def read(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        calls.append(1)
        out.detach().abs().max().item()

    handle = model.register_forward_hook(read)
    try:
        yield calls
    finally:
        handle.remove()
