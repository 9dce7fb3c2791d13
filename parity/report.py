"""`python -m parity report`: every claim checked quickly, printed as one table.

Each topic registers, in `parity/checks/<topic>.py`, one quick check per claim:

    @check("formats.decode")
    def _() -> Observation:
        ...
        return Observation(observed, n, note)

`observed` is in the claim's unit (see parity/compare.py) and the verdict is
`compare.holds(claim, observed)`. A claim with no registered check is reported as
"NOT CHECKED" and makes the report fail: the table must never claim more than it checks.
Pictures are registered in parity/pictures/ and drawn into --out.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from parity import pictures
from parity.compare import holds
from parity.pictures import picture  # noqa: F401  (re-exported for checks modules)
from parity.tolerances import CLAIMS, Claim, claim


@dataclass(frozen=True)
class Observation:
    """What a quick check saw: the worst case in the claim's unit, over n compared values."""

    observed: float
    n: int
    note: str = ""
    # close and eps claims: the raw max |a - b| behind `observed` (compare.max_abs_difference),
    # printed next to the bound so a ratio is never read as an absolute difference
    raw: float | None = None


@dataclass(frozen=True)
class Row:
    claim: Claim
    observation: Observation | None
    verdict: str  # "ok", "FAIL", "ERROR", "NOT CHECKED"
    seconds: float


CHECKS: dict[str, Callable[[], Observation]] = {}


def check(claim_id: str) -> Callable[[Callable[[], Observation]], Callable[[], Observation]]:
    """Register the quick check of one claim (the claim must exist in the table)."""
    claim(claim_id)

    def register(fn: Callable[[], Observation]) -> Callable[[], Observation]:
        if claim_id in CHECKS:
            raise RuntimeError(f"two report checks for claim {claim_id}")
        CHECKS[claim_id] = fn
        return fn

    return register


def load_checks() -> None:
    """Import every module of parity.checks so that their @check decorators run."""
    import parity.checks

    for info in pkgutil.iter_modules(parity.checks.__path__):
        importlib.import_module(f"parity.checks.{info.name}")


def run(topic: str | None = None) -> list[Row]:
    """Run the quick check of every claim (of one topic, if given)."""
    load_checks()
    rows = []
    for c in CLAIMS:
        if topic is not None and c.topic != topic:
            continue
        fn = CHECKS.get(c.id)
        if fn is None:
            rows.append(Row(c, None, "NOT CHECKED", 0.0))
            continue
        start = time.perf_counter()
        try:
            obs = fn()
            verdict = "ok" if holds(c, obs.observed) else "FAIL"
        except Exception:  # a crashing check is a failed claim, shown with its traceback
            obs = Observation(float("nan"), 0, traceback.format_exc(limit=3).strip())
            verdict = "ERROR"
        rows.append(Row(c, obs, verdict, time.perf_counter() - start))
    return rows


def render(rows: list[Row]) -> str:
    """A plain-text table: claim / tolerance / observed worst case in the claim's unit (a
    count, ulps, eps units, or the ratio to a close bound) / the raw max |a-b| where the
    check reports it / n / verdict."""
    head = ("claim", "kind", "tolerance", "observed", "max |a-b|", "n", "verdict", "s")
    body = []
    for r in rows:
        obs = r.observation
        observed = "-" if obs is None else f"{obs.observed:.3g}"
        raw = "-" if obs is None or obs.raw is None else f"{obs.raw:.3g}"
        n = "-" if obs is None else f"{obs.n:,}"
        body.append(
            (r.claim.id, r.claim.kind, r.claim.tolerance, observed, raw, n, r.verdict,
             f"{r.seconds:.1f}")
        )
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for row in body:
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    notes = [f"{r.claim.id}: {r.observation.note}" for r in rows
             if r.observation is not None and r.observation.note and r.verdict != "ok"]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


def write_pictures(out: Path) -> list[Path]:
    """Draw every registered picture into `out`; [] when matplotlib is not installed."""
    load_checks()  # topics that still register pictures beside their checks
    return pictures.draw_all(out)
