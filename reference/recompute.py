"""Activation checkpointing on the tape: keep a segment's input, re-run its forward in backward.

A plain forward leaves every layer's saved tensors on the tape until backward consumes them
(reference/nn.py). A checkpointed segment instead records only

    its input x                        ("input", one activation)
    its generators' states             (so dropout draws the same masks again)
    the autocast state                 (so each op casts as it did: reference/amp.py)

and frees the tapes its layers recorded. Its backward restores the generator states, re-runs
the segment's forward on a fresh tape ("recompute") inside the recorded autocast state, puts
the generators back where they were, and back-propagates through the fresh tape. Every
operation sees the same inputs, weights, masks and dtypes as without checkpointing, so
gradients are bit-identical (NOTE [ RNG replay ], NOTE [ Autocast state ] in amp.py).

Which layers are checkpointed is a plan (reference/recompute_plans.py: `parse_schedule`,
`Segment`, `Schedule`; re-exported here). `forward_with_schedule(model, x, schedule)` runs a
model under a plan and returns a `ScheduledRun` whose `backward(grad)` does the
recomputation:

    forward:   for item in plan: a layer runs normally; a Segment becomes a Checkpoint that
               stashes generator states, runs its body, frees the body's tapes, keeps x
    backward:  in reverse; a Checkpoint whose body saved anything restores the stashed
               states, re-runs its body up to the last child that saves tensors (early
               stop), restores the states it found, then back-propagates through the fresh
               tapes

The memory model is read off the tape, not a formula: `held_bytes` after forward (what is
kept for backward) and `peak_bytes` during backward, both counting each distinct storage
once (ReLU's result and the next Linear's input are one array).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import numpy as np

from common.recompute_plans import SPECS, Schedule, Segment, check_plan, uniform_plan
from reference import amp
from reference.nn import Module, SavedTensor, Sequential
from reference.recompute_plans import (
    binomial_cost,
    check_budget,
    checkpoints_held,
    parse_schedule,
    revolve_cost,
    revolve_plan,
    revolve_split,
)

__all__ = ["SPECS", "Checkpoint", "Counter", "Region", "Schedule", "ScheduledRun", "Segment",
           "binomial_cost", "check_budget", "check_plan", "checkpoint", "checkpoint_sequential",
           "checkpoints_held", "distinct_bytes", "forward_with_schedule", "parse_schedule",
           "revolve_cost", "revolve_plan", "revolve_split", "uniform_plan"]

Item = tuple[str, Module, int | None]  # (child name, module, layer index; None: a Checkpoint)


# NOTE [ RNG replay ]
# Dropout draws its mask from a generator at forward. A checkpoint frees the mask with the
# rest of the segment's tape, so the recompute must draw the SAME mask: the checkpoint copies
# every generator's state before its first forward, and the recompute runs with those states
# restored, then puts back the states the generators had (torch: fork_rng around the
# recompute, set_rng_state(stashed)). Without the replay (torch's preserve_rng_state=False),
# the recompute draws fresh masks: backward then uses masks the forward never applied and the
# gradients are wrong, silently. Generators shared by several Dropouts (make_mlp shares one)
# are restored once: their draws replay in the same order.
class Counter:
    """Layer forwards per layer index, split into "forward" and "backward" (recompute) phase."""

    def __init__(self) -> None:
        self.phase = "forward"
        self.counts: dict[str, dict[int, int]] = {"forward": {}, "backward": {}}

    def hit(self, index: int) -> None:
        table = self.counts[self.phase]
        table[index] = table.get(index, 0) + 1


class Region(Module):
    """A plan's items as one module: children run in order, each layer's forward counted.

    `on_step()` is called after each child's backward (the run samples the tape there).
    """

    def __init__(self, items: Sequence[Item], counter: Counter,
                 on_step: Callable[[], None]) -> None:
        super().__init__()
        for name, module, _ in items:
            self.add_module(name, module)
        self.layer_indices = [index for _, _, index in items]
        self.counter, self.on_step = counter, on_step

    def run(self, x: np.ndarray, stop_after: int | None = None) -> np.ndarray:
        """The children's forwards in order (only children 0..stop_after when given)."""
        for k, (child, index) in enumerate(zip(self._children.values(), self.layer_indices,
                                               strict=True)):
            if stop_after is not None and k > stop_after:
                break
            if index is not None:
                self.counter.hit(index)
            x = child.forward(x)
        return x

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self.run(x)

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        for child in reversed(self._children.values()):
            grad_output = child.backward(grad_output)
            self.on_step()
        return grad_output


class Checkpoint(Region):
    """One checkpointed segment: saves "input" (and generator states); backward recomputes.

    `early_stop` mirrors torch's non-reentrant checkpoint: the recompute stops after the last
    child that records tensors (children after it saved nothing, so backward needs nothing
    from them). After a forward, `last_saving` is that child's position (-1: none) and
    `last_saving_layer` its layer index (None when it is a nested Checkpoint or absent).
    A segment whose children saved nothing is not recomputed at all, early stop or not: torch
    recomputes on the first unpack of a saved tensor, and there is none to unpack.
    """

    def __init__(self, segment: Segment, items: Sequence[Item], counter: Counter,
                 on_step: Callable[[], None], *, preserve_rng_state: bool = True,
                 early_stop: bool = True) -> None:
        super().__init__(items, counter, on_step)
        self.segment = segment
        self.preserve_rng_state, self.early_stop = preserve_rng_state, early_stop
        self.recomputes = 0
        self.last_saving = -1
        self.last_saving_layer: int | None = None
        self.stashed: list[dict] = []  # the generators' states before the forward
        self.autocast = amp.autocast_state()  # the autocast state the forward ran in
        self.out_shape: tuple[int, ...] | None = None

    @property
    def name(self) -> str:
        return f"checkpoint({self.segment.start}:{self.segment.stop})"

    def __repr__(self) -> str:
        return f"Checkpoint({', '.join(self._children)})"

    def _generators(self) -> list[np.random.Generator]:
        unique: dict[int, np.random.Generator] = {}
        for g in self.generators().values():
            unique.setdefault(id(g), g)
        return list(unique.values())

    def forward(self, x: np.ndarray) -> np.ndarray:
        self.stashed = [copy.deepcopy(g.bit_generator.state) for g in self._generators()] \
            if self.preserve_rng_state else []
        self.autocast = amp.autocast_state()
        y = self.run(x)
        recorded = [bool(child.tape()) for child in self._children.values()]
        self.last_saving = max((k for k, r in enumerate(recorded) if r), default=-1)
        self.last_saving_layer = self.layer_indices[self.last_saving] \
            if self.last_saving >= 0 else None
        self.out_shape = y.shape
        self.free_saved()  # the children's tapes go; only the input stays
        self.save_for_backward({"input": x})
        return y

    def keep_input(self, x: np.ndarray) -> None:
        """Save `x` as this segment's input without running it (an early-stopped recompute
        of the enclosing segment ends here; the stashed states are still this forward's)."""
        self.save_for_backward({"input": x})

    def recompute(self, x: np.ndarray) -> None:
        """Re-run the children's forward on a fresh tape with the generators replayed.

        With early stop, up to the last save the forward made: through the last saving child
        if it is a layer (torch cuts it short inside, NOTE [ Early stop ]), or up to the
        input of a nested Checkpoint, whose body torch then does not run either.
        """
        generators = self._generators() if self.preserve_rng_state else []
        now = [copy.deepcopy(g.bit_generator.state) for g in generators]
        for g, state in zip(generators, self.stashed, strict=True):
            g.bit_generator.state = copy.deepcopy(state)
        try:
            last = list(self._children.values())[self.last_saving]
            with amp.autocast.entering(self.autocast):  # torch: the state recorded at forward
                if not self.early_stop:
                    self.run(x)
                elif isinstance(last, Checkpoint):
                    last.keep_input(self.run(x, self.last_saving - 1))
                else:
                    self.run(x, self.last_saving)
        finally:
            for g, state in zip(generators, now, strict=True):
                g.bit_generator.state = state
        self.recomputes += 1

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        x = self.pop_saved()["input"]
        if grad_output.shape != self.out_shape:
            raise ValueError(f"{self!r}: expected grad_output of shape {self.out_shape}, "
                             f"got {grad_output.shape}")
        if self.last_saving >= 0:
            self.recompute(x)
            self.on_step()
        return super().backward(grad_output)


def distinct_bytes(arrays: Sequence[np.ndarray]) -> int:
    """Bytes of the distinct storage among `arrays` (views of one buffer counted once)."""
    seen = {(a.__array_interface__["data"][0], a.nbytes) for a in arrays if a.nbytes}
    return sum(nbytes for _, nbytes in seen)


def _checked_schedule(model: Sequential, schedule: Schedule | str) -> Schedule:
    if not isinstance(model, Sequential):
        raise TypeError(f"forward_with_schedule: model must be a reference.nn.Sequential, "
                        f"got {type(model).__name__}")
    if isinstance(schedule, str):
        schedule = parse_schedule(schedule, len(model))
    if schedule.n_layers != len(model):
        raise ValueError(f"forward_with_schedule: schedule {schedule.spec!r} is for "
                         f"{schedule.n_layers} layers, the model has {len(model)}")
    return schedule


class ScheduledRun:
    """A model's forward under a schedule; `backward(grad)` recomputes what was dropped.

    Attributes after forward: `output`, `held_bytes` (distinct bytes on the tape between
    forward and backward), `tape()`. After backward: `peak_bytes` (the most distinct bytes on
    the tape at any point of backward, sampled after every recompute and every child's
    backward; 0 with track_peak=False, which saves a walk over the tape per step, as a
    timing wants), `grad_input`, and `recomputed()`: recomputed forwards per layer index.
    """

    def __init__(self, model: Sequential, schedule: Schedule | str, *,
                 preserve_rng_state: bool = True, early_stop: bool = True,
                 track_peak: bool = True) -> None:
        self.schedule = _checked_schedule(model, schedule)
        self.model, self.counter = model, Counter()
        self.preserve_rng_state, self.early_stop = preserve_rng_state, early_stop
        self.track_peak = track_peak
        self.checkpoints: list[Checkpoint] = []  # every Checkpoint, nested ones included
        self.root = Region(self._items(self.schedule.plan), self.counter, self._observe)
        self.held_bytes = self.peak_bytes = 0

    def _items(self, plan: Sequence[int | Segment]) -> list[Item]:
        items: list[Item] = []
        for item in plan:
            if isinstance(item, int):
                items.append((str(item), self.model[item], item))
                continue
            node = Checkpoint(item, self._items(item.body), self.counter, self._observe,
                              preserve_rng_state=self.preserve_rng_state,
                              early_stop=self.early_stop)
            self.checkpoints.append(node)
            items.append((node.name, node, None))
        return items

    def tape(self) -> list[SavedTensor]:
        """Everything held now: segment inputs and the tapes of layers run normally."""
        return self.root.tape()

    def tape_bytes(self) -> int:
        return distinct_bytes([a for m in self.root.modules()
                               for a in m.saved_tensors().values()])

    def _observe(self) -> None:
        if self.track_peak:
            self.peak_bytes = max(self.peak_bytes, self.tape_bytes())

    def forward(self, x: np.ndarray) -> np.ndarray:
        self.counter.phase = "forward"
        self.output = self.root.forward(x)
        self.held_bytes = self.tape_bytes()
        return self.output

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        """Back-propagate, recomputing each checkpointed segment; returns the input gradient."""
        self.counter.phase = "backward"
        self.peak_bytes = 0
        self._observe()
        self.grad_input = self.root.backward(grad_output)
        return self.grad_input

    def interrupted(self) -> dict[int, int]:
        """Layer index -> recomputes in which it is its segment's last saving layer.

        There torch's non-reentrant early stop cuts the layer's forward short after its saves
        (NOTE [ Early stop ] in torch_impl/recompute.py); the reference runs it whole.
        """
        cut = dict.fromkeys(range(len(self.model)), 0)
        for node in self.checkpoints:
            if node.early_stop and node.last_saving_layer is not None:
                cut[node.last_saving_layer] += node.recomputes
        return cut

    def recomputed(self) -> dict[int, int]:
        """Layer index -> forwards run during backward (0 for layers never recomputed)."""
        done = self.counter.counts["backward"]
        return {i: done.get(i, 0) for i in range(len(self.model))}


def forward_with_schedule(model: Sequential, x: np.ndarray, schedule: Schedule | str, *,
                          preserve_rng_state: bool = True, early_stop: bool = True,
                          track_peak: bool = True) -> ScheduledRun:
    """Run `model.forward(x)` under `schedule` (a Schedule or a spec string)."""
    run = ScheduledRun(model, schedule, preserve_rng_state=preserve_rng_state,
                       early_stop=early_stop, track_peak=track_peak)
    run.forward(x)
    return run


def checkpoint(segment: Module, x: np.ndarray, *, preserve_rng_state: bool = True
               ) -> ScheduledRun:
    """torch.utils.checkpoint.checkpoint(segment, x): the whole segment is one checkpoint."""
    model = segment if isinstance(segment, Sequential) else Sequential(segment)
    n = len(model)
    schedule = Schedule("checkpoint", n, (Segment(0, n, tuple(range(n))),))
    return forward_with_schedule(model, x, schedule, preserve_rng_state=preserve_rng_state)


def checkpoint_sequential(model: Sequential, segments: int, x: np.ndarray, *,
                          preserve_rng_state: bool = True) -> ScheduledRun:
    """torch's checkpoint_sequential(model, segments, x): the last segment runs normally."""
    if not isinstance(model, Sequential):
        raise TypeError(f"checkpoint_sequential: model must be a reference.nn.Sequential, "
                        f"got {type(model).__name__}")
    if isinstance(segments, bool) or not isinstance(segments, int) \
            or not 1 <= segments <= len(model):
        raise ValueError(f"checkpoint_sequential: segments must be in [1, {len(model)}] (the "
                         f"number of layers), got {segments!r}")
    return forward_with_schedule(model, x, parse_schedule(f"uniform:{segments}", len(model)),
                                 preserve_rng_state=preserve_rng_state)
