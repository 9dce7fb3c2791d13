"""docs/tolerances.md, how to read a claim, and docs/claims/<topic>.md, one page per topic:
each claim with its kind, tolerance, the worst case the tests observed (recorded by
`python -m parity report --record` into docs/data/report.json), statement and reason."""

from __future__ import annotations

import json
from typing import Any

from parity.lab.gendocs import DOCS, page
from parity.tolerances import CLAIMS, TOPICS, Claim

OBSERVED_JSON = DOCS / "data" / "report.json"

_READING = [
    "## Reading the tolerance and the report",
    "",
    "`python -m parity report` prints, per claim, `observed`: the worst case the tests' "
    "assertions saw, in the claim's own unit, so `observed` is compared with the bound, "
    "never read as an absolute difference. For `eps` claims the column `max |a-b|` beside it is "
    "the raw largest absolute difference. `python -m parity report --json` gives the same "
    "per claim (id, kind, bound, observed, raw, n, verdict).",
    "",
    "| kind | tolerance reads | observed is | holds when |",
    "|---|---|---|---|",
    "| bits | bit-identical | the count of elements whose bit patterns differ | "
    "observed = 0 |",
    "| nan_class | bit-identical, NaN as a class | that count, any NaN equal to any NaN | "
    "observed = 0 |",
    "| ulps | <= k ulp of F | the largest number of steps between consecutive members of "
    "F separating the two sides; both sides must already be members of F (a value between "
    "two members fails the claim: a missing rounding shows) | observed <= k |",
    "| eps | \\|a-b\\| <= c eps · S | max \\|a-b\\| / (eps S), eps of the compared dtype, "
    "S the array the claim names (\\|y_torch\\|, (k+1) \\|A\\|\\|B\\|, ...) | "
    "observed <= c |",
    "",
    "Where the two sides disagree on which elements are NaN, `ulps` and `eps` "
    "observe inf; NaN on both sides and equal infinities differ by 0.",
]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _observed() -> dict[str, Any]:
    return (json.loads(OBSERVED_JSON.read_text(encoding="utf-8"))
            if OBSERVED_JSON.exists() else {})


def _seen(c: Claim, seen: dict[str, Any] | None) -> str:
    """The observed worst case beside the bound, with its ratio where one means anything."""
    if seen is None or seen["observed"] is None:
        return "not recorded"
    observed, raw = seen["observed"], seen["raw"]
    text = f"{observed:.3g}" if isinstance(observed, float | int) else str(observed)
    if c.kind in ("ulps", "eps") and isinstance(observed, float | int) and float(c.bound):
        text += f" ({observed / float(c.bound):.2g} of the bound)"  # type: ignore[arg-type]
    if raw is not None:
        text += f", max \\|a-b\\| {raw:.3g}" if isinstance(raw, float | int) else f", {raw}"
    return f"{text} over {seen['n']:,} values ({seen['verdict']})"


def topic_page(topic: str) -> str:
    seen = _observed()
    claims = [c for c in CLAIMS if c.topic == topic]
    out = [f"# Claims: {topic}", "",
           f"Generated from `parity/claims/{topic}.py` by `python -m parity docs`; the observed "
           "worst cases are those of the last `python -m parity report --record` "
           "(docs/data/report.json). How to read a tolerance: [tolerances.md](../tolerances.md)."
           " The tests: `parity/test_" + topic + "*.py`.", ""]
    for c in claims:
        out += [f"## `{c.id}`", "",
                f"- kind: {c.kind}; tolerance: {_cell(c.tolerance)}",
                f"- observed: {_seen(c, seen.get(c.id))}", "",
                c.statement, "", f"Why this bound: {c.reason}", ""]
    return "\n".join(out)


for _topic in TOPICS:
    page(f"claims/{_topic}.md")(lambda t=_topic: topic_page(t))


@page("tolerances.md")
def tolerances_markdown() -> str:
    seen = _observed()
    out = ["# Claims and tolerances", "",
           "Generated from `parity/claims/` by `python -m parity docs`; "
           "a test fails when this page is out of date. "
           "`python -m parity report` runs the parity tests and prints each claim's observed "
           "worst case. Each topic's claims, with their statements, reasons and the recorded "
           "worst case beside each bound, are on a page of their own:", ""]
    out += ["| topic | claims | recorded ok |", "|---|---|---|"]
    for topic in TOPICS:
        claims = [c for c in CLAIMS if c.topic == topic]
        ok = sum(seen.get(c.id, {}).get("verdict") == "ok" for c in claims)
        out.append(f"| [{topic}](claims/{topic}.md) | {len(claims)} | {ok} |")
    out += ["", *_READING, ""]
    return "\n".join(out)
