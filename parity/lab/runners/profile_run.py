"""One profiled run from end to end, in the order the comparison's honesty needs: probe the
machine, predict, WRITE the sheet (and announce its sha256 and time), only then build the
model and measure, compare, and write the profile beside the sheet. The command
(parity/lab/cli/profile.py), the docs' recorded profile (benchmarks/profile.py) and the tests
all run this one function.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parity.drivers import profile as drv
from parity.drivers import profile_gaps as gaps
from parity.drivers import profile_measure as meas
from parity.lab.runners import profile_sheet as sheets

FILES = ("predictions.json", "predictions.md", "trace.json", "profile.json", "profile.md",
         "phases.png", "memory.png")


def run_profile(case: drv.ProfileCase, out: Path,
                announce: Callable[[dict[str, Any]], None] = lambda written: None,
                progress: Callable[[], None] = lambda: None,
                pictures: bool = True) -> dict[str, Any]:
    """Profile `case` into the folder `out` (FILES; trace.json with torch only, the pictures
    when `pictures` and matplotlib is present). `announce(written)` is called as soon as the
    sheet is on disk, before the model exists. Files of FILES left by an earlier run are
    removed first. Returns profile.json's object, whose "pictures" names the pictures drawn
    (profile.md links those and no other)."""
    for name in FILES:  # the folder describes one run: no trace or page of an earlier one
        (out / name).unlink(missing_ok=True)
    with case.torch_threads():
        machine = drv.probe_machine(case)
        sheet = drv.predict(case, machine)
        written = drv.write_predictions(sheet, out, sheets.predictions_markdown(sheet))
        announce(written)
        measured = meas.measure(case, out, progress)
    comparison = gaps.compare(case, sheet, measured)
    result = {"predictions": written, "sheet": sheet, "measured": measured,
              "comparison": comparison}
    result = json.loads(json.dumps(result))  # what profile.json holds: tuples become lists
    result["pictures"] = _draw(out, result) if pictures else []
    (out / "profile.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    (out / "profile.md").write_text(sheets.profile_markdown(result), encoding="utf-8")
    return result


def _draw(out: Path, result: dict[str, Any]) -> list[str]:
    """Draw the pictures into `out`; the names drawn ([] without matplotlib)."""
    from parity.lab.pictures import have_matplotlib

    if not have_matplotlib():
        return []
    sheets.draw_phases(out / "phases.png", [result])
    sheets.draw_memory(out / "memory.png", [result])
    return ["phases.png", "memory.png"]
