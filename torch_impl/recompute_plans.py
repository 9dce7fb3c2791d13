"""Checkpointing plans for torch.utils.checkpoint. See reference/recompute_plans.py for the specs
and NOTE [ Revolve counting ].

PyTorch has no planner beyond checkpoint_sequential's uniform rule, so this tree writes its
own, and writes it differently on purpose: revolve's first split comes from Griewank and
Walther's binomial formula, where the reference searches every split. Claim recompute.plans
then compares two computations of the same plan. Plans are the reference's plain data
(`Schedule`, `Segment`: frozen dataclasses, validated on construction), so both trees' plans
compare with ==. No budget check after the revolve plan: the formula's split is optimal
within the budget by construction, the reference checks its search (`check_budget`).
"""

from __future__ import annotations

import math

from reference.recompute_plans import Schedule, Segment  # plain data: the plan's shape

SPECS = ("none", "sqrt", "uniform:K", "optimal:S")

__all__ = ["SPECS", "Schedule", "Segment", "parse_schedule", "revolve_plan", "revolve_split",
           "uniform_plan"]


def _parse_int(spec: str, what: str) -> int:
    head, _, value = spec.partition(":")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"parse_schedule: {head}:{what} needs an integer {what}, "
                         f"got {spec!r}") from None


def parse_schedule(spec: str, n_layers: int) -> Schedule:
    """The plan for "none", "sqrt", "uniform:K" (1 <= K <= n) or "optimal:S" (S >= 1)."""
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
        return Schedule(spec, n_layers, revolve_plan(0, n_layers, s), s)
    raise ValueError(f"parse_schedule: unknown schedule {spec!r}; accepted: {', '.join(SPECS)}")


def uniform_plan(n: int, k: int) -> tuple[int | Segment, ...]:
    """checkpoint_sequential(functions, k)'s segments: k - 1 checkpoints of n // k layers."""
    size = n // k
    plan: list[int | Segment] = [Segment(s, s + size, tuple(range(s, s + size)))
                                 for s in range(0, size * (k - 1), size)]
    return (*plan, *range(size * (k - 1), n))


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
