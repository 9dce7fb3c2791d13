"""docs/tolerances.md: the claim table, every claim with its kind, tolerance and reason."""

from __future__ import annotations

from parity.gendocs import page
from parity.tolerances import CLAIMS, TOPICS


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


@page("tolerances.md")
def tolerances_markdown() -> str:
    out = ["# Claims and tolerances", "",
           "Generated from `parity/claims/` by `python -m parity docs`; "
           "a test fails when this page is out of date. "
           "`python -m parity report` checks every claim and prints the observed worst case.",
           ""]
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
