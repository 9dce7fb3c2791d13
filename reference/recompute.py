"""Activation checkpointing on the tape: keep a segment's input, re-run its forward in backward.

A plain forward leaves every layer's saved tensors on the tape until backward consumes them
(reference/nn.py). A checkpointed segment instead records only

    its input x                        ("input", one activation)
    its generators' states             (so dropout draws the same masks again)

and frees the tapes its layers recorded. Its backward restores the generator states, re-runs
the segment's forward on a fresh tape ("recompute"), puts the generators back where they were,
and back-propagates through the fresh tape. Every operation sees the same inputs, weights and
masks as without checkpointing, so gradients are bit-identical (NOTE [ RNG replay ]).

Schedules say which layers of a Sequential of n layers are checkpointed (`parse_schedule`):

    none         no checkpoint: n layer tapes held, 0 recomputed layer forwards
    uniform:K    torch's checkpoint_sequential(model, K): K - 1 checkpointed segments of
                 n // K layers, then the rest run normally (the last segment is NOT checkpointed);
                 recomputes (K - 1) (n // K) layer forwards
    sqrt         uniform:K with K = round(sqrt n), the K that minimizes K + n / K
    optimal:S    Griewank-Walther "revolve" with S checkpoint slots (NOTE [ Revolve counting ])

A schedule is a plan: a tuple of items, each a layer index (run normally, tape kept) or a
`Segment(start, stop, body)` (checkpointed; `body` is again a plan, so segments nest).
`forward_with_schedule` runs a model under a plan and returns a `ScheduledRun` whose
`backward(grad)` does the recomputation. The memory model is read off the tape, not a formula:
`held_bytes` after forward (what is kept for backward) and `peak_bytes` during backward, both
counting each distinct storage once (ReLU's result and the next Linear's input are one array).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from reference.nn import Module, SavedTensor, Sequential


# -- plans: plain data, shared with torch_impl/recompute.py
@dataclass(frozen=True)
class Segment:
    """Layers start..stop-1 checkpointed; `body` says how they run when recomputed."""

    start: int
    stop: int
    body: tuple[int | Segment, ...]


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule: the spec, the number of layers, the plan and its checkpoint budget."""

    spec: str
    n_layers: int
    plan: tuple[int | Segment, ...]
    slots: int | None = None  # optimal:S's budget; None when the schedule sets none


SPECS = ("none", "sqrt", "uniform:K", "optimal:S")


def _parse_int(spec: str, what: str) -> int:
    head, _, value = spec.partition(":")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"parse_schedule: {head}:{what} needs an integer {what}, "
                         f"got {spec!r}") from None


def parse_schedule(spec: str, n_layers: int) -> Schedule:
    """The plan for "none", "sqrt", "uniform:K" (1 <= K <= n) or "optimal:S" (S >= 1)."""
    if not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"parse_schedule: n_layers must be a positive int, got {n_layers!r}")
    if spec == "none":
        return Schedule(spec, n_layers, tuple(range(n_layers)))
    if spec == "sqrt":
        return Schedule(spec, n_layers, uniform_plan(n_layers, max(1, round(math.sqrt(n_layers)))))
    if spec.startswith("uniform:"):
        k = _parse_int(spec, "K")
        if not 1 <= k <= n_layers:
            raise ValueError(f"parse_schedule: uniform:K needs 1 <= K <= {n_layers} (the number "
                             f"of layers), got K = {k}")
        return Schedule(spec, n_layers, uniform_plan(n_layers, k))
    if spec.startswith("optimal:"):
        s = _parse_int(spec, "S")
        if s < 1:
            raise ValueError(f"parse_schedule: optimal:S needs S >= 1 checkpoint slot (the "
                             f"input's), got S = {s}")
        plan = revolve_plan(0, n_layers, s)
        check_budget(plan, s)
        return Schedule(spec, n_layers, plan, s)
    raise ValueError(f"parse_schedule: unknown schedule {spec!r}; accepted: {', '.join(SPECS)}")


def uniform_plan(n: int, k: int) -> tuple[int | Segment, ...]:
    """torch.utils.checkpoint.checkpoint_sequential(functions, k): k - 1 checkpoints of n // k."""
    size = n // k
    plan: list[int | Segment] = [Segment(s, s + size, tuple(range(s, s + size)))
                                 for s in range(0, size * (k - 1), size)]
    return (*plan, *range(size * (k - 1), n))


# NOTE [ Revolve counting ]
# Griewank and Walther's model (ACM TOMS 26(1), 2000, "Algorithm 799: revolve"): a chain of
# l equal steps, c checkpoint slots (the chain's input occupies one), a step's tape exists only
# while that step is reversed. t(l, c) counts the forward steps run without tape ("advances"),
# the first forward sweep included; the l taped steps are not counted. Its closed form:
#     t(l, c) = r l - beta(c + 1, r - 1),   beta(c, r) = C(c + r, c),
#     r the integer with beta(c, r - 1) < l <= beta(c, r).
# Realized with nested checkpoints: plan(i, j, c) = [Segment(i, m, plan(i, m, c))] +
# plan(m, j, c - 1), and plan(i, i + 1, c) = [i]. Every layer is run with its tape exactly
# once (as the last plain item of some plan), so counting OUR way, "recomputed layer forwards"
# R = (layer forwards in forward + backward) - n, gives R = t(n, S): the n counted in our
# forward are the one taped step plus the n - 1 advances of the first sweep, and every other
# forward happens in backward. The budget S = c counts stored segment inputs; the tape of the
# layer being differentiated comes on top, so the tape peaks at S + 1 activations.
# The optimal first split m is any in [max(beta(c, r-2), l - beta(c-1, r)),
# min(beta(c, r-1), l - beta(c-1, r-1))]; both trees take the largest (revolve advances as far
# as it may). The reference finds it by minimizing over all m; the torch twin uses the formula.
@cache
def revolve_cost(length: int, slots: int) -> int:
    """min over the first split m of m + t(m, c) + t(l - m, c - 1): all recursive schedules."""
    if length <= 1:
        return 0
    return min(_split_cost(length, slots, m) for m in _feasible_splits(length, slots))


def _feasible_splits(length: int, slots: int) -> range:
    # the tail after m needs a slot per checkpoint; with c = 1 it must be one plain layer
    return range(length - 1, length) if slots == 1 else range(1, length)


def _split_cost(length: int, slots: int, m: int) -> int:
    return m + revolve_cost(m, slots) + revolve_cost(length - m, slots - 1)


def revolve_split(length: int, slots: int) -> int:
    """The largest first checkpoint distance m that attains revolve_cost(length, slots)."""
    best = revolve_cost(length, slots)
    return max(m for m in _feasible_splits(length, slots) if _split_cost(length, slots, m) == best)


def revolve_plan(i: int, j: int, slots: int) -> tuple[int | Segment, ...]:
    """NOTE [ Revolve counting ]: the plan of layers i..j-1 with `slots` checkpoint slots."""
    if j - i == 1:
        return (i,)
    m = i + revolve_split(j - i, slots)
    return (Segment(i, m, revolve_plan(i, m, slots)), *revolve_plan(m, j, slots - 1))


def binomial_cost(length: int, slots: int) -> int:
    """Griewank-Walther's closed form t(l, c) = r l - beta(c + 1, r - 1) (NOTE above)."""
    r = 0
    while math.comb(slots + r, slots) < length:
        r += 1
    return r * length - math.comb(slots + r, slots + 1) if r > 0 else 0


def checkpoints_held(plan: Sequence[int | Segment]) -> int:
    """The most segment inputs stored at once while running `plan` forward and backward.

    After forward every Segment of the plan holds its input; backward frees them from the
    end, and a segment being recomputed hands its input to its body (the body's first
    segment stores that same array).
    """
    segments = [k for k, item in enumerate(plan) if isinstance(item, Segment)]
    peak = len(segments)
    for count, k in enumerate(segments):
        body = plan[k].body  # type: ignore[union-attr]
        peak = max(peak, count + max(1, checkpoints_held(body)))
    return peak


def check_budget(plan: Sequence[int | Segment], slots: int) -> None:
    """ValueError when running `plan` would store more than `slots` segment inputs at once."""
    held = checkpoints_held(plan)
    if held > slots:
        raise ValueError(f"schedule needs {held} checkpoint slots but the budget is {slots}")


def _check_plan(plan: Sequence[int | Segment], start: int, stop: int) -> None:
    at = start
    for item in plan:
        lo, hi = (item, item + 1) if isinstance(item, int) else (item.start, item.stop)
        if lo != at or hi <= lo:
            raise ValueError(f"schedule plan must cover layers {start}..{stop - 1} in order; "
                             f"item {item!r} starts at {lo}, expected {at}")
        if isinstance(item, Segment):
            _check_plan(item.body, item.start, item.stop)
        at = hi
    if at != stop:
        raise ValueError(f"schedule plan covers layers {start}..{at - 1}, expected ..{stop - 1}")


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


class Checkpoint(Module):
    """One checkpointed segment: saves "input" (and generator states); backward recomputes.

    `early_stop` mirrors torch's non-reentrant checkpoint: the recompute stops after the last
    child that records tensors (children after it saved nothing, so backward needs nothing
    from them).
    """

    def __init__(self, children: Sequence[tuple[str, Module]], indices: Sequence[int | None],
                 counter: Counter, preserve_rng_state: bool = True, early_stop: bool = True
                 ) -> None:
        super().__init__()
        for name, child in children:
            self._children[name] = child
        self._indices = list(indices)  # layer index of each child, None for a nested Checkpoint
        self.counter, self.preserve_rng_state, self.early_stop = counter, preserve_rng_state, \
            early_stop
        self.recomputes = 0

    def __repr__(self) -> str:
        return f"Checkpoint({', '.join(self._children)})"

    def _run_children(self, x: np.ndarray, stop_after: int | None = None) -> np.ndarray:
        for k, (child, index) in enumerate(zip(self._children.values(), self._indices,
                                               strict=True)):
            if stop_after is not None and k > stop_after:
                break
            if index is not None:
                self.counter.hit(index)
            x = child.forward(x)
        return x

    def _generators(self) -> list[np.random.Generator]:
        unique: dict[int, np.random.Generator] = {}
        for g in self.generators().values():
            unique.setdefault(id(g), g)
        return list(unique.values())

    def forward(self, x: np.ndarray) -> np.ndarray:
        self._states = [copy.deepcopy(g.bit_generator.state) for g in self._generators()] \
            if self.preserve_rng_state else []
        y = self._run_children(x)
        recorded = [bool(c.tape()) for c in self._children.values()]
        self._last_saving = max((k for k, r in enumerate(recorded) if r), default=-1)
        self._shape = y.shape
        self.free_saved()  # the children's tapes go; only the input stays
        self.save_for_backward({"input": x})
        return y

    def recompute(self, x: np.ndarray) -> None:
        """Re-run the children's forward on a fresh tape with the generators replayed."""
        generators = self._generators() if self.preserve_rng_state else []
        now = [copy.deepcopy(g.bit_generator.state) for g in generators]
        for g, state in zip(generators, self._states, strict=True):
            g.bit_generator.state = copy.deepcopy(state)
        try:
            self._run_children(x, self._last_saving if self.early_stop else None)
        finally:
            for g, state in zip(generators, now, strict=True):
                g.bit_generator.state = state
        self.recomputes += 1

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        x = self.pop_saved()["input"]
        if grad_output.shape != self._shape:
            raise ValueError(f"{self!r}: expected grad_output of shape {self._shape}, "
                             f"got {grad_output.shape}")
        self.recompute(x)
        if self._observer is not None:
            self._observer()
        for child in reversed(self._children.values()):
            grad_output = child.backward(grad_output)
        return grad_output

    _observer = None


def distinct_bytes(arrays: Sequence[np.ndarray]) -> int:
    """Bytes of the distinct storage among `arrays` (views of one buffer counted once)."""
    seen = {(a.__array_interface__["data"][0], a.nbytes) for a in arrays if a.nbytes}
    return sum(nbytes for _, nbytes in seen)


class ScheduledRun:
    """A model's forward under a schedule; `backward(grad)` recomputes what was dropped.

    Attributes after forward: `output`, `held_bytes` (distinct bytes on the tape between
    forward and backward), `tape()`. After backward: `peak_bytes` (the most distinct bytes on
    the tape at any point of backward, sampled after every recompute and every layer backward),
    `grad_input`, and `counter.counts["backward"]`: recomputed forwards per layer index.
    """

    def __init__(self, model: Sequential, schedule: Schedule, preserve_rng_state: bool = True,
                 early_stop: bool = True) -> None:
        if not isinstance(model, Sequential):
            raise TypeError(f"forward_with_schedule: model must be a reference.nn.Sequential, "
                            f"got {type(model).__name__}")
        if schedule.n_layers != len(model):
            raise ValueError(f"forward_with_schedule: schedule {schedule.spec!r} is for "
                             f"{schedule.n_layers} layers, the model has {len(model)}")
        _check_plan(schedule.plan, 0, len(model))
        self.model, self.schedule, self.counter = model, schedule, Counter()
        self.root = Module()
        self.checkpoints: list[Checkpoint] = []
        self._items = self._build(schedule.plan, self.root, preserve_rng_state, early_stop)
        self.peak_bytes = 0

    def _build(self, plan: Sequence[int | Segment], parent: Module, preserve: bool,
               early_stop: bool) -> list[tuple[Module, int | None]]:
        items: list[tuple[Module, int | None]] = []
        for item in plan:
            if isinstance(item, int):
                parent._children[str(item)] = self.model[item]
                items.append((self.model[item], item))
                continue
            node = Checkpoint([], [], self.counter, preserve, early_stop)
            inner = self._build(item.body, node, preserve, early_stop)
            node._indices = [index for _, index in inner]
            node._observer = self._observe
            parent._children[f"checkpoint({item.start}:{item.stop})"] = node
            self.checkpoints.append(node)
            items.append((node, None))
        return items

    def tape(self) -> list[SavedTensor]:
        """Everything held now: segment inputs and the tapes of layers run normally."""
        return self.root.tape()

    def tape_bytes(self) -> int:
        return distinct_bytes([a for m in self.root.modules()
                               for a in m.saved_tensors().values()])

    def _observe(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self.tape_bytes())

    def forward(self, x: np.ndarray) -> np.ndarray:
        self.counter.phase = "forward"
        for module, index in self._items:
            if index is not None:
                self.counter.hit(index)
            x = module.forward(x)
        self.output = x
        self.held_bytes = self.tape_bytes()
        return x

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        """Back-propagate, recomputing each checkpointed segment; returns the input gradient."""
        self.counter.phase = "backward"
        self.peak_bytes = self.tape_bytes()
        for module, _ in reversed(self._items):
            grad_output = module.backward(grad_output)
            self._observe()
        self.grad_input = grad_output
        return grad_output

    def interrupted(self) -> dict[int, int]:
        """Layer index -> recomputes in which it is its segment's last saving layer.

        There torch's non-reentrant early stop cuts the layer's forward short after its saves
        (NOTE [ Early stop ] in torch_impl/recompute.py); the reference runs it whole.
        """
        cut = dict.fromkeys(range(len(self.model)), 0)
        for node in self.checkpoints:
            if node._last_saving >= 0 and node._indices[node._last_saving] is not None:
                cut[node._indices[node._last_saving]] += node.recomputes  # type: ignore[index]
        return cut

    def recomputed(self) -> dict[int, int]:
        """Layer index -> forwards run during backward (0 for layers never recomputed)."""
        done = self.counter.counts["backward"]
        return {i: done.get(i, 0) for i in range(len(self.model))}


def forward_with_schedule(model: Sequential, x: np.ndarray, schedule: Schedule | str, *,
                          preserve_rng_state: bool = True, early_stop: bool = True
                          ) -> ScheduledRun:
    """Run `model.forward(x)` under `schedule` (a Schedule or a spec string)."""
    if isinstance(schedule, str):
        if not isinstance(model, Sequential):
            raise TypeError(f"forward_with_schedule: model must be a reference.nn.Sequential, "
                            f"got {type(model).__name__}")
        schedule = parse_schedule(schedule, len(model))
    run = ScheduledRun(model, schedule, preserve_rng_state, early_stop)
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
    if not isinstance(segments, int) or not 1 <= segments <= len(model):
        raise ValueError(f"checkpoint_sequential: segments must be in [1, {len(model)}] (the "
                         f"number of layers), got {segments!r}")
    return forward_with_schedule(model, x, parse_schedule(f"uniform:{segments}", len(model)),
                                 preserve_rng_state=preserve_rng_state)
