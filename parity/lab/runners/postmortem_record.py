"""What one fault postmortem holds, how it is written (markdown and JSON), and how the
rubric grades it. The investigations themselves are postmortem_amp.py and postmortem_loop.py;
the registry of faults is postmortem.py.

A postmortem is evidence, not prose: every hypothesis carries the numbers a run measured and
its verdict (`holds`) is computed from them by the investigation, never typed in; the guard
is a function run on the seeded loop and on the repaired one, and what it returned is kept.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from parity.lab.runners.profile_grades import Row


@dataclass(frozen=True)
class Hypothesis:
    """One candidate cause: a short name, what it says, what was measured to test it (with
    the numbers), and whether the numbers bear it out."""

    name: str
    statement: str
    evidence: str
    holds: bool


@dataclass
class Postmortem:
    """One fault investigated: the symptom a run showed, the measurement that tells the
    hypotheses apart (its table: a header row, then one row per measured case), the
    hypotheses with their verdicts, the repair, and the regression guard's result on the
    seeded loop (`guard_before`, which must be False) and on the repaired one (`guard_after`,
    True). `numbers` holds every measured figure, for the JSON."""

    fault: str
    title: str
    symptom: str
    measurement: str
    table: list[list[str]]
    hypotheses: list[Hypothesis]
    repair: str
    guard: str  # the guard's qualified name, then what it asserts
    guard_before: bool
    guard_after: bool
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def rejected(self) -> list[Hypothesis]:
        return [h for h in self.hypotheses if not h.holds]

    @property
    def confirmed(self) -> list[Hypothesis]:
        return [h for h in self.hypotheses if h.holds]


def markdown(pm: Postmortem) -> str:
    """The postmortem as a page: symptom, hypotheses, measurement, verdicts, repair, guard."""
    head, *rows = pm.table
    table = ("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n"
             + "".join("| " + " | ".join(r) + " |\n" for r in rows))
    hypotheses = "\n".join(f"- H{i} ({h.name}): {h.statement}"
                           for i, h in enumerate(pm.hypotheses, 1))
    verdicts = "\n".join(f"- **H{i} {'confirmed' if h.holds else 'rejected'}**: {h.evidence}"
                         for i, h in enumerate(pm.hypotheses, 1))
    before = "passes" if pm.guard_before else "FAILS"
    after = "passes" if pm.guard_after else "FAILS"
    return f"""# Postmortem: {pm.title}

Fault `{pm.fault}` (`python -m parity miniproject --fault {pm.fault}`).

**Symptom.** {pm.symptom}

**Hypotheses.**
{hypotheses}

**Discriminating measurement.** {pm.measurement}

{table}
**Verdicts, from the numbers above.**
{verdicts}

**Repair.** {pm.repair}

**Regression guard** ({pm.guard}). On the seeded loop it {before}; on the repaired one it
{after}.
"""


def _plain(value: Any) -> Any:
    """`value` with every non-finite float as its text (JSON has no inf or NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def as_json(pm: Postmortem) -> str:
    """Every field of the postmortem, the measured numbers included, as JSON."""
    return json.dumps(_plain(asdict(pm)), indent=1) + "\n"


def fault_repair_row(pm: Postmortem, file: str = "postmortem.md") -> Row:
    """The rubric's fault row, naming the fault it graded. FAIL: the guard does not fail on
    the seeded loop, or does not pass on the repaired one; Pass: it does; Strong: and a
    hypothesis was rejected by a measured number while another was confirmed by one."""
    evidence = (f"{file}: fault {pm.fault}; the guard fails on the seeded loop and passes on "
                "the repaired one")
    if pm.guard_before or not pm.guard_after:
        return ("fault repair", "FAIL", f"{file}: fault {pm.fault}",
                f"guard on the seeded loop {pm.guard_before}, on the repaired one "
                f"{pm.guard_after}")
    strong = bool(pm.rejected) and bool(pm.confirmed)
    named = ", ".join(h.name for h in pm.rejected)
    return ("fault repair", "Strong" if strong else "Pass", evidence,
            "repaired with a guard that fails before and passes after"
            + (f"; rejected by measurement: {named}" if strong else
               "; no hypothesis both rejected and confirmed by measurement"))
