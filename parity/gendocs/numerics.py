"""docs/numerics.md: the catalogue of seeded faults, as both trees report them (a
deterministic run of the code: no timing), and the count columns."""

from __future__ import annotations

import tempfile
from pathlib import Path

from parity.drivers.numerics import observe_catalogue
from parity.drivers.train import one_thread
from parity.gendocs import section
from reference.numerics import FAULTS


def _cell(row: dict, key: str) -> str:
    ref, tor = row["reference"], row["torch"]
    a, b = (None if r is None else r[key] for r in (ref, tor))
    text = (lambda v: "not found" if v is None else f"`{v}`")
    return text(a) if a == b else f"reference {text(a)}, torch {text(b)}"


@section("numerics.md", "catalogue")
def _() -> str:
    with one_thread(), tempfile.TemporaryDirectory() as tmp:
        rows = observe_catalogue(Path(tmp))
    lines = ["Seeded before step 3 of the default model (8, 32, 32, 3), tanh, from the same "
             "checkpoint in both trees (`python -m parity train --check-numerics --fault NAME "
             "--fault-step 3`). A cell shows one value when both trees report it.", "",
             "| fault | precision | first invalid (step, phase, module, op, index, value) | "
             "input already out of range | replay: backward node, module | the fix |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        ref = row["reference"]
        if ref is not None:
            for tree in ("reference", "torch"):
                r = row[tree]
                if r is not None:
                    r["where"] = (r["step"], r["phase"], r["module"], r["op"], tuple(r["index"]),
                                  r["value"])
                    r["replay"] = tuple(r["replay"])
                    r["out_of_range"] = ", ".join(r["out_of_range"])
        fault = FAULTS[row["fault"]]
        cells = ([_cell(row, "where"), _cell(row, "out_of_range"), _cell(row, "replay")]
                 if ref is not None else ["not found"] * 3)
        lines.append(f"| `{row['fault']}` | {row['precision']} | " + " | ".join(cells)
                     + f" | {fault.fix} |")
    return "\n".join(lines)
