"""Checkpointing plans: which layers of a Sequential of n layers are checkpointed, and how.

A plan is plain data: a tuple of items, each a layer index (run normally, its tape kept
until backward) or a `Segment(start, stop, body)` (checkpointed: only its input is kept and
backward re-runs it; `body` is again a plan, so segments nest). reference/recompute.py runs
a plan on the tape; torch_impl/recompute.py runs the same plan with torch.utils.checkpoint.
The plan types and the spec parsing live here once; each tree supplies its own revolve
planner (`parse_schedule`'s `revolve`), written two ways on purpose (claim recompute.plans):
reference/recompute_plans.py searches every split, torch_impl/recompute_plans.py uses
Griewank and Walther's formula.

Specs (`parse_schedule(spec, n)`), with R the layer forwards recomputed during backward:

    none         no checkpoint: n layer tapes held, R = 0
    uniform:K    torch's checkpoint_sequential(model, K): K - 1 checkpointed segments of
                 n // K layers, then the rest run normally (the last segment is NOT
                 checkpointed); R = (K - 1) (n // K)
    sqrt         uniform:K with K = round(sqrt n), the K that minimizes K + n / K
    optimal:S    Griewank-Walther "revolve" with S checkpoint slots, nested segments;
                 R = t(n, S) (NOTE [ Revolve counting ])

The transformer's recompute spec (`split_recompute`) adds one more word: "selective"
recomputes the attention core of every block (reference/recompute_gpt.py), alone or joined
to a block schedule with "+": "selective", "sqrt+selective", "optimal:2+selective".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

SPECS = ("none", "sqrt", "uniform:K", "optimal:S")
SELECTIVE = "selective"


@dataclass(frozen=True)
class Segment:
    """Layers start..stop-1 checkpointed; `body` says how they run when recomputed."""

    start: int
    stop: int
    body: tuple[int | Segment, ...]


@dataclass(frozen=True)
class Schedule:
    """A plan for a model of n_layers layers, with its spec and checkpoint budget.

    Built valid or not at all: the plan must cover layers 0..n_layers-1 in order, each
    segment's body its own layers (ValueError naming the first item out of place).
    """

    spec: str
    n_layers: int
    plan: tuple[int | Segment, ...]
    slots: int | None = None  # optimal:S's budget; None when the schedule sets none

    def __post_init__(self) -> None:
        if isinstance(self.n_layers, bool) or not isinstance(self.n_layers, int) \
                or self.n_layers < 1:
            raise ValueError(f"Schedule: n_layers must be a positive int, got {self.n_layers!r}")
        check_plan(self.plan, 0, self.n_layers)


def check_plan(plan: Sequence[int | Segment], start: int, stop: int) -> None:
    """ValueError unless `plan` covers layers start..stop-1 in order, segments nesting."""
    at = start
    for item in plan:
        lo, hi = (item, item + 1) if isinstance(item, int) else (item.start, item.stop)
        if lo != at or hi <= lo:
            raise ValueError(f"schedule plan must cover layers {start}..{stop - 1} in order; "
                             f"item {item!r} starts at {lo}, expected {at}")
        if isinstance(item, Segment):
            check_plan(item.body, item.start, item.stop)
        at = hi
    if at != stop:
        raise ValueError(f"schedule plan covers layers {start}..{at - 1}, expected ..{stop - 1}")


def _parse_int(spec: str, what: str) -> int:
    head, _, value = spec.partition(":")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"parse_schedule: {head}:{what} needs an integer {what}, "
                         f"got {spec!r}") from None


def parse_schedule(spec: str, n_layers: int,
                   revolve: Callable[[int, int, int], tuple[int | Segment, ...]]) -> Schedule:
    """The plan for "none", "sqrt", "uniform:K" (1 <= K <= n) or "optimal:S" (S >= 1);
    "optimal:S"'s plan is `revolve(0, n_layers, S)` (NOTE [ Revolve counting ], in
    reference/recompute_plans.py), the tree's own planner."""
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
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
        return Schedule(spec, n_layers, revolve(0, n_layers, s), s)
    raise ValueError(f"parse_schedule: unknown schedule {spec!r}; accepted: {', '.join(SPECS)}")


def split_recompute(spec: str) -> tuple[str, bool]:
    """(block schedule spec, selective) of a transformer's recompute spec: "SPEC",
    "selective" or "SPEC+selective" (ValueError for anything else; SPEC is checked by
    parse_schedule)."""
    if not isinstance(spec, str):
        raise ValueError(f"split_recompute: the recompute spec must be a str, got {spec!r}")
    words = spec.split("+")
    selective = SELECTIVE in words
    blocks = [w for w in words if w != SELECTIVE]
    if len(blocks) > 1 or words.count(SELECTIVE) > 1:
        raise ValueError(f"split_recompute: expected SPEC, {SELECTIVE!r} or "
                         f"'SPEC+{SELECTIVE}' with SPEC one of {', '.join(SPECS)}, got {spec!r}")
    return (blocks[0] if blocks else "none"), selective


def uniform_plan(n: int, k: int) -> tuple[int | Segment, ...]:
    """torch.utils.checkpoint.checkpoint_sequential(functions, k): k - 1 checkpoints of n // k."""
    size = n // k
    plan: list[int | Segment] = [Segment(s, s + size, tuple(range(s, s + size)))
                                 for s in range(0, size * (k - 1), size)]
    return (*plan, *range(size * (k - 1), n))
