"""The two CUDA memory meters' bookkeeping, driven on any machine by a scripted allocator.

StepMeter (torch_impl/accounting.py) and BoundaryMemory (torch_impl/profile_meters.py) read
torch.cuda's allocator statistics at each phase boundary. `max_memory_allocated` is the peak
since the last `reset_peak_memory_stats`, so a phase's peak is its own only if the meter resets
it at the phase's start: without the reset, a later phase reports the step's peak so far.
Reading the allocator right after itself cannot tell a right meter from a wrong one (the peak
is never below the current value, the reserve never below the peak), so these tests replace
torch.cuda's five functions by a scripted allocator whose every value is known, and hold each
meter's per-phase record to the script exactly. On a GPU the same property is asserted against
the real allocator (tests/test_accounting_torch.py, parity/test_profile.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from torch_impl import accounting as tacc
from torch_impl import profile as tprof
from torch_impl import profile_meters as tmeters

BASE = 4096  # what the scripted device holds before the step


class ScriptedAllocator:
    """allocated moves only when the test says; peak is the maximum since the last reset."""

    def __init__(self) -> None:
        self.allocated = self.peak = BASE
        self.resets = 0

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def free(self, n: int) -> None:
        self.allocated -= n

    def reset(self, device: Any = None) -> None:
        self.peak = self.allocated
        self.resets += 1


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> ScriptedAllocator:
    fake = ScriptedAllocator()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: fake.allocated)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: fake.peak)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 1 << 20)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", fake.reset)
    return fake


def test_step_meter_records_each_phases_own_peak(scripted: ScriptedAllocator) -> None:
    """A forward that allocates 1000 bytes, a backward that allocates 300 (the gradients) and
    then frees the 1000 (the saved tensors), an optimizer that holds 10 bytes for the length of
    its step: StepMeter's record is exactly start, end and peak of each phase, the optimizer's
    peak 1290 bytes below the backward's."""
    model = nn.Linear(4, 3)
    loss_fn = nn.CrossEntropyLoss()

    class Holding(torch.optim.SGD):
        def step(self, closure: Any = None) -> Any:  # type: ignore[override]
            scripted.alloc(10)  # a transient of the step, freed before it returns
            result = super().step(closure)
            scripted.free(10)
            return result

    # an SGD built first makes torch wrap SGD.step too (it wraps a class's step at its first
    # instance), so Holding's step fires the step hooks twice, nested: the phase is the
    # outer step's, whatever other test built an SGD before this one in the process
    torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    optimizer = Holding(model.parameters(), lr=0.1)
    x, y = torch.ones(2, 4), torch.tensor([0, 2])
    with tacc.StepMeter(model, loss_fn=loss_fn, optimizer=optimizer, device="cuda") as meter:
        scripted.alloc(1000)
        loss = loss_fn(model(x), y)  # the loss module's hook: the backward begins
        scripted.alloc(300)
        scripted.free(1000)
        loss.backward()
        optimizer.step()
    b = BASE
    assert meter.cuda == {
        "forward": {"start": b, "end": b + 1000, "peak": b + 1000, "reserved": 1 << 20},
        "backward": {"start": b + 1000, "end": b + 300, "peak": b + 1300, "reserved": 1 << 20},
        "optimizer": {"start": b + 300, "end": b + 300, "peak": b + 310, "reserved": 1 << 20}}


def test_boundary_memory_records_each_phases_own_peak(scripted: ScriptedAllocator) -> None:
    """The profile's meter, a PhaseTimer's observer: each phase's peak is the maximum
    inside that phase alone (the data wait's 50 bytes, the forward's 700, the backward's 200
    on top of what the forward left, the optimizer's 5), never an earlier phase's."""
    model = nn.Linear(2, 2)
    meter = tmeters.BoundaryMemory(model, torch.optim.SGD(model.parameters(), lr=0.1), "cuda")
    script = {"data wait": (50, 50), "forward": (700, 0), "backward": (200, 900),
              "optimizer": (5, 5)}
    timer = tprof.PhaseTimer(observers=[meter], annotate=False)
    timer.begin_step()
    for phase, (alloc, free) in script.items():
        with timer.phase(phase):
            scripted.alloc(alloc)
            scripted.free(free)
    timer.end_step()
    b = BASE
    peaks = {phase: stats["peak"] - b for phase, stats in meter.cuda.items()}
    assert peaks == {"data wait": 50, "forward": 700, "backward": 900, "optimizer": 5}
    assert [(s["start"] - b, s["end"] - b) for s in meter.cuda.values()] == [
        (0, 0), (0, 700), (700, 0), (0, 0)]
