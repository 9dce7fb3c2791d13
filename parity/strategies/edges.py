"""The edges of a declared range (common/arg_ranges.py, common/fp8_recipes.py), and the
strategy that draws over all of it, so a strategy built on `declared_values` reaches both
edges of the range its argument check reads.

    declared            edges (label, value, inside)
    range(lo, hi + 1)   lo, hi inside; lo - 1, hi + 1 outside
    (a, b, ...)         each member inside; one unknown name outside
    FloatRange          each finite bound or its neighbour inside, one past it outside;
                        an infinite bound itself inside where the range is closed there;
                        NaN, inside where the range takes it
    IntsFrom(lo)        lo inside, lo - 1 outside, and 2^64 inside (no upper edge)
"""

from __future__ import annotations

import math

from hypothesis import strategies as st

from common.arg_ranges import FloatRange, IntsFrom

UNKNOWN = "no-such-name"  # an enumeration's one unknown member
FAR = 2**64  # an IntsFrom's stand-in for its missing upper edge: past any C integer

Declared = range | tuple[str, ...] | FloatRange | IntsFrom

Edge = tuple[str, object, bool]  # (label, value, whether the check must accept it)


def edges(declared: Declared) -> list[Edge]:
    """Every edge of `declared` and one step past each (module docstring's table)."""
    if isinstance(declared, IntsFrom):
        return [("the lower edge", declared.low, True),
                ("one below the lower edge", declared.low - 1, False),
                ("far above the lower edge (no upper edge)", FAR, True)]
    if isinstance(declared, range):
        lo, hi = declared[0], declared[-1]
        return [("the lower edge", lo, True), ("the upper edge", hi, True),
                ("one below the lower edge", lo - 1, False),
                ("one above the upper edge", hi + 1, False)]
    if isinstance(declared, tuple):
        return [(f"member {m!r}", m, True) for m in declared] + [
            ("an unknown member", UNKNOWN, False)]
    found: list[Edge] = []
    for end, bound, is_open, inward in (("lower", declared.low, declared.low_open, math.inf),
                                        ("upper", declared.high, declared.high_open,
                                         -math.inf)):
        if math.isinf(bound):
            if not is_open:
                found.append((f"the {end} edge", bound, True))
            continue
        inside = math.nextafter(bound, inward) if is_open else bound
        outside = bound if is_open else math.nextafter(bound, -inward)
        found += [(f"the {end} edge", inside, True), (f"one past the {end} edge", outside, False)]
    found.append(("NaN", math.nan, declared.nan))
    return found


def declared_values(declared: Declared) -> st.SearchStrategy:
    """Any value of `declared`: integers lo..hi (from lo, for IntsFrom), a member, or a
    float between the bounds (open ends excluded, infinite closed ends included; NaN not
    drawn). The edges themselves are drawn often (one draw in four, at least), so a
    property test reaches them in a handful of examples."""
    if isinstance(declared, tuple):
        return st.sampled_from(declared)
    inside = [value for _, value, ok in edges(declared) if ok and value == value]
    if isinstance(declared, IntsFrom):
        anywhere: st.SearchStrategy = st.integers(min_value=declared.low)
    elif isinstance(declared, range):
        anywhere = st.integers(declared[0], declared[-1])
    else:
        anywhere = st.floats(min_value=declared.low, max_value=declared.high,
                             exclude_min=declared.low_open, exclude_max=declared.high_open,
                             allow_nan=False)
    return st.one_of(st.sampled_from(inside), anywhere, anywhere, anywhere)
