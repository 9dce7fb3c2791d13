"""The torch tree's revolve planner for torch.utils.checkpoint. See
common/recompute_plans.py for the plan types and the specs, reference/recompute_plans.py for
NOTE [ Revolve counting ].

PyTorch has no planner beyond checkpoint_sequential's uniform rule, so this tree writes its
own, and writes it differently on purpose: revolve's first split comes from Griewank and
Walther's binomial formula, where the reference searches every split. Claim recompute.plans
then compares two computations of the same plan. Plans are plain data both trees share
(`Schedule`, `Segment`: frozen dataclasses, validated on construction), so both trees' plans
compare with ==. No budget check after the revolve plan: the formula's split is optimal
within the budget by construction, the reference checks its search (`check_budget`).
"""

from __future__ import annotations

import math

from common.recompute_plans import Schedule, Segment
from common.recompute_plans import parse_schedule as _parse_schedule

__all__ = ["parse_schedule", "revolve_plan", "revolve_split"]


def parse_schedule(spec: str, n_layers: int) -> Schedule:
    """common.recompute_plans.parse_schedule with this tree's revolve_plan."""
    return _parse_schedule(spec, n_layers, revolve_plan)


def _beta(c: int, r: int) -> int:
    return math.comb(c + r, c) if r >= 0 else 0


def revolve_split(length: int, slots: int) -> int:
    """The largest optimal first checkpoint distance: min(beta(c, r-1), l - beta(c-1, r-1))."""
    if slots < 1 or length < 2:
        raise ValueError(f"revolve_split: needs length >= 2 and slots >= 1, got length "
                         f"{length}, slots {slots}")
    r = 0
    while _beta(slots, r) < length:
        r += 1
    return min(_beta(slots, r - 1), length - _beta(slots - 1, r - 1))


def revolve_plan(i: int, j: int, slots: int) -> tuple[int | Segment, ...]:
    """NOTE [ Revolve counting ] (reference/recompute_plans.py): layers i..j-1, `slots` slots."""
    if j - i == 1:
        return (i,)
    m = i + revolve_split(j - i, slots)
    return (Segment(i, m, revolve_plan(i, m, slots)), *revolve_plan(m, j, slots - 1))
