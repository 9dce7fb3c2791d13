"""docs/tolerances.md: the claim table, every claim with its kind, tolerance and reason."""

from __future__ import annotations

from parity.lab.gendocs import page
from parity.tolerances import CLAIMS, TOPICS

_READING = [
    "## Reading the tolerance and the report",
    "",
    "`python -m parity report` prints, per claim, `observed`: the worst case its quick check "
    "saw, in the claim's own unit, so `observed` is compared with the bound, never read as an "
    "absolute difference. For `eps` and `close` claims the column `max |a-b|` beside it is "
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
    "| close | \\|a-b\\| <= atol + rtol \\|b\\| | the ratio max \\|a-b\\| / (atol + "
    "rtol \\|b\\|), b the torch side; 0.5 means half the allowed difference | "
    "observed <= 1 |",
    "| statistical | P(false failure) <= p | the smallest p-value of the test's statistics | "
    "observed >= p |",
    "",
    "Where the two sides disagree on which elements are NaN, `ulps`, `eps` and `close` "
    "observe inf; NaN on both sides and equal infinities differ by 0.",
]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


@page("tolerances.md")
def tolerances_markdown() -> str:
    out = ["# Claims and tolerances", "",
           "Generated from `parity/claims/` by `python -m parity docs`; "
           "a test fails when this page is out of date. "
           "`python -m parity report` checks every claim and prints the observed worst case.",
           "", *_READING, ""]
    for topic in TOPICS:
        claims = [c for c in CLAIMS if c.topic == topic]
        if not claims:
            continue
        out += [f"## {topic}", "", "| claim | kind | tolerance | statement | reason |",
                "|---|---|---|---|---|"]
        out += ["| " + " | ".join(_cell(x) for x in (f"`{c.id}`", c.kind, c.tolerance,
                                                     c.statement, c.reason)) + " |"
                for c in claims]
        out.append("")
    return "\n".join(out)
