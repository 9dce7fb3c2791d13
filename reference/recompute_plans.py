"""The reference's revolve planner: NOTE [ Revolve counting ], the optimal first split found
by searching every split, and the budget a plan needs. The plan types and the specs are
common/recompute_plans.py (plain data both trees share); `parse_schedule` here is that
parser with this planner, checked against its budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

from common.recompute_plans import Schedule, Segment
from common.recompute_plans import parse_schedule as _parse_schedule


def parse_schedule(spec: str, n_layers: int) -> Schedule:
    """common.recompute_plans.parse_schedule with this tree's revolve_plan, whose plan is
    checked against its budget (check_budget: the search's result, not a formula's)."""
    return _parse_schedule(spec, n_layers, _checked_revolve_plan)


def _checked_revolve_plan(i: int, j: int, slots: int) -> tuple[int | Segment, ...]:
    plan = revolve_plan(i, j, slots)
    check_budget(plan, slots)
    return plan


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
    if slots < 1:
        raise ValueError(f"revolve_cost: {length} steps need at least one slot, got {slots}")
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
    segments = [item for item in plan if isinstance(item, Segment)]
    peak = len(segments)
    for count, segment in enumerate(segments):
        peak = max(peak, count + max(1, checkpoints_held(segment.body)))
    return peak


def check_budget(plan: Sequence[int | Segment], slots: int) -> None:
    """ValueError when running `plan` would store more than `slots` segment inputs at once."""
    held = checkpoints_held(plan)
    if held > slots:
        raise ValueError(f"schedule needs {held} checkpoint slots but the budget is {slots}")
