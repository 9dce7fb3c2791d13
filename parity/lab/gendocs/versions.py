"""The README's list of the versions the suite and the report were last verified on, from
the runs .ci/torch-matrix recorded (docs/data/torch_matrix.json: `--record`, with
`--readme` for the quick start as a newcomer runs it, on the torch pip resolves)."""

from __future__ import annotations

import json
from typing import Any

from parity.lab.gendocs import DOCS, section

MATRIX = DOCS / "data" / "torch_matrix.json"
HOW = {"readme": "the README's quick start in a fresh environment (the torch pip resolved)",
       "pinned": "`.ci/torch-matrix VERSION` (torch pinned, as CI pins 2.13.0)"}


def recorded() -> dict[str, dict[str, Any]]:
    """{torch release: the recorded run}, oldest first; {} before any run was recorded."""
    if not MATRIX.exists():
        return {}
    return json.loads(MATRIX.read_text(encoding="utf-8"))


@section("../README.md", "verified")
def _() -> str:
    rows = ["| torch | ml_dtypes | how | date | report | tests |", "|---|---|---|---|---|---|"]
    for r in recorded().values():
        verdict = "" if r["ok"] else " **(failed)**"
        rows.append(f"| {r['torch']}{verdict} | {r['ml_dtypes']} | {HOW[r['how']]} | "
                    f"{r['date']} | {r['report']} | {r['tests']} |")
    return "\n".join(rows)
