"""The numerics detector's report, plain data that both trees fill in and print: the count
columns, where the first invalid value appeared, what the replay found. The computations
that fill them are each tree's own (reference/numerics.py, torch_impl/numerics.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from common.format_spec import FloatFormat, get_format

COLUMNS = ("nan", "posinf", "neginf", "zero", "over_max", "to_zero")


def thresholds(fmt: FloatFormat) -> tuple[float, float]:
    """(overflow, underflow): a cast to fmt takes x past its range (to inf; to NaN or to
    +-max in a format without inf) iff |x| >= overflow, to zero iff |x| <= underflow, for
    any x a float64 holds.

    Round to nearest even; both ties go to the even neighbour. The overflow tie
    max + ulp(max)/2 lies between max and the next significand up (inf's, or NaN's in
    float8_e4m3fn): where max's significand is odd (1.1...1: ieee, fnuz) the tie goes past
    the range, and overflow is the tie; where it is even (fn: 1.1...10, e4m3fn's 448) the
    tie rounds to max, and overflow is the next float64 above it (464 rounds to 448 and
    464 + 2^-44 does not). The underflow tie smallest_subnormal / 2 goes to zero."""
    tie = fmt.max + 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)
    max_is_even = fmt.convention == "fn"  # max's significand 1.1...10 (FloatFormat.max)
    overflow = math.nextafter(tie, math.inf) if max_is_even else tie
    return overflow, fmt.smallest_subnormal / 2


@dataclass(frozen=True)
class InputRange:
    """One input of the failing op: its finite range and what was already out of range."""

    name: str
    low: float | None  # finite min (None: no finite value)
    high: float | None
    nonfinite: int
    beyond: int  # finite values with |x| >= the view format's overflow threshold

    def out_of_range(self) -> bool:
        return self.nonfinite > 0 or self.beyond > 0


# a watched re-run's find (numerics_locate.watch_ops)
Found = tuple[str, tuple[int, ...], str, tuple[InputRange, ...]]  # op, index, value, inputs


@dataclass(frozen=True)
class FirstInvalid:
    """Where the first non-finite value appeared (module docstring). Plain data: the torch
    tree uses this very class, so the two reports compare field by field."""

    step: int
    phase: str  # "forward" | "backward"
    module: str  # the module path ("2"), "loss", or the parameter ("2.weight") in backward
    op: str  # torch's autograd node name ("" in backward: the replay names it)
    index: tuple[int, ...]
    value: str  # "inf", "-inf", "nan"
    fmt: str  # the view format
    inputs: tuple[InputRange, ...] = ()
    counts: dict[str, list[int]] = field(default_factory=dict, compare=False)  # the step's
    micro_step: int = 0  # which micro-step made it, from 0 (the `i` of `for i in range(k)`)
    micro_steps: int = 1  # how many the step took (1: no gradient accumulation)
    skipped: bool = False  # a gradient's value: the GradScaler skips the step (not raised)
    scale: float | None = None  # the scale of the skipped step (the scaler lowers it)
    grad_norm: float | None = None  # the pre-clip gradient norm the step was given

    def identity(self) -> dict[str, Any]:
        """The identifying part, printed as `first-invalid: {json}` (compared across trees);
        the micro-step only where the step took several."""
        micro = ({} if self.micro_steps == 1 else
                 {"micro_step": self.micro_step, "micro_steps": self.micro_steps})
        return {"step": self.step, **micro, "phase": self.phase, "module": self.module,
                "op": self.op, "index": list(self.index), "value": self.value}

    def line(self) -> str:
        return "first-invalid: " + json.dumps(self.identity(), sort_keys=True)

    def describe(self) -> str:
        """The report a person reads: where, and which input was already out of range."""
        where = f"{self.module!r}" + (f" ({self.op})" if self.op else "")
        when = f"step {self.step}" + ("" if self.micro_steps == 1 else
                                      f", micro-step {self.micro_step} of {self.micro_steps}")
        lines = [f"first non-finite value at {when}, {self.phase}, in {where}: "
                 f"{self.value} at index {list(self.index)}"]
        if self.grad_norm is not None:
            lines.append(f"  pre-clip gradient norm: {self.grad_norm:g}")
        if self.skipped:
            lines.append("  the GradScaler skips this step" + (
                "" if self.scale is None else f" and lowers its scale from {self.scale:g}"))
        overflow = thresholds(get_format(self.fmt))[0]
        for r in self.inputs:
            span = ("no finite value" if r.low is None
                    else f"finite range [{r.low:.6g}, {r.high:.6g}]")
            flag = ""
            if r.nonfinite:
                flag = f"  <- already {r.nonfinite} non-finite"
            elif r.beyond:
                flag = f"  <- {r.beyond} value(s) beyond {self.fmt}'s range (|x| >= {overflow:g})"
            lines.append(f"  input {r.name}: {span}{flag}")
        return "\n".join(lines)


class NonFinite(Exception):
    """Raised by the detector at the end of the step that made the first invalid value."""

    def __init__(self, report: FirstInvalid) -> None:
        super().__init__(report.describe())
        self.report = report
        self.replay: dict[str, Any] | None = None  # the run loop attaches the replay state
        self.history: list[dict[str, list[int]]] = []  # and every step's counts, this one's last


def totals(counts: dict[str, list[int]], kind: str) -> list[int]:
    """COLUMNS summed over the rows of one kind ("act" or "grad")."""
    rows = [row for name, row in counts.items() if name.startswith(kind + ":")]
    return [sum(column) for column in zip(*rows, strict=True)] if rows else [0] * len(COLUMNS)


def format_counts(counts: dict[str, list[int]]) -> str:
    """One step's counts as a compact column: act and grad totals, nan/+inf/-inf/zero/over/
    to_zero."""
    return " | ".join(f"{kind} " + "/".join(map(str, totals(counts, kind)))
                      for kind in ("act", "grad"))


@dataclass(frozen=True)
class ReplayResult:
    """What the anomaly replay found: the backward node that first returned NaN (None: no
    NaN in backward), its module, and the forward call's traceback."""

    node: str | None
    module: str | None
    traceback: str
