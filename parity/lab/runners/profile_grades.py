"""The mini-project's two profile rows, graded from the folder `python -m parity profile`
left: the prediction sheet written first, predicting each phase's time and the slowest, with
every gap named (NOTE [ Naming a gap ]); and a timing shown to move with where the loop
blocks (NOTE [ A sync on the CPU ]). Each a function of the folder only, so a test can spoil
one piece of evidence and see the grade fall.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from parity.lab.runners import profile_sheet as sheets

Row = tuple[str, str, str, str]  # criterion, grade (Strong | Pass | FAIL | missing), evidence, why
PHASES = ("data wait", "forward", "backward", "optimizer")  # a synchronized step's, in profile.json

SHEET = ("predictions.json", "predictions.md")


def sheet_first(folder: Path) -> tuple[bool, str]:
    """(whether both files of the prediction sheet were written no later than every other
    file in `folder`, the reason in words). A missing sheet file fails; so does any
    measurement file (profile.json, profile.md, trace.json, the pictures) older than either
    sheet file. A hidden file is no measurement: the folder's mark (.mirrortrain-output,
    NOTE [ An output folder is the command's own ]) is written when the folder is taken,
    before the sheet. Modification times in nanoseconds, as the profile run left them."""
    missing = [name for name in SHEET if not (folder / name).is_file()]
    if missing:
        return False, f"no {' and no '.join(missing)} in {folder.name}/"
    sheet = max((folder / name).stat().st_mtime_ns for name in SHEET)
    measured = sorted((p.stat().st_mtime_ns, p.name) for p in folder.iterdir()
                      if p.is_file() and p.name not in SHEET and not p.name.startswith("."))
    if not measured:
        return False, f"no measurement file in {folder.name}/ after the sheet"
    first, name = measured[0]
    if first < sheet:
        return False, f"{name} is older than the prediction sheet"
    return True, (f"predictions.json and predictions.md were written before every one of "
                  f"the {len(measured)} measurement files (first: {name})")


def _profile(folder: Path) -> dict[str, Any]:
    try:
        record = json.loads((folder / "profile.json").read_text())
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}


def _sheet_is_the_one_compared(folder: Path, record: dict[str, Any]) -> tuple[bool, str]:
    """predictions.json on disk is the sheet the profile compared with (its sha256), and it
    predicts a time and a share for every phase and the slowest."""
    try:
        body = (folder / "predictions.json").read_bytes()
        sheet = json.loads(body)
    except (OSError, ValueError):
        return False, "predictions.json is unreadable"
    if hashlib.sha256(body).hexdigest() != record.get("predictions", {}).get("sha256"):
        return False, "profile.json compared with another sheet than predictions.json"
    times = sheet.get("seconds", {}) if isinstance(sheet, dict) else {}
    if set(PHASES) - set(times) or sheet.get("slowest") not in PHASES:
        return False, "predictions.json predicts no time for each phase and no slowest"
    return True, ""


def prediction_row(folder: Path) -> Row:
    """NOTE [ Naming a gap ]: Strong when the sheet came first, predicts every phase's time
    (so its share) and the slowest, is the sheet the profile compared with, and every gap of
    time and bytes has a named term of measured size; Pass when some gap is UNEXPLAINED."""
    from parity.drivers import profile_gaps as gaps  # here: the parser must not load torch

    name, evidence = "prediction before measurement", "profile/predictions.md, profile/profile.md"
    before, why = sheet_first(folder)
    if not before:
        return name, "FAIL", evidence, why
    record = _profile(folder)
    same, why_not = _sheet_is_the_one_compared(folder, record)
    if not same:
        return name, "FAIL", evidence, why_not
    try:
        time_rows, n_un = record["comparison"]["time"], record["comparison"]["unexplained"]
        sheet = record["sheet"]
        shares = sheets.predicted_shares(sheet)
    except (KeyError, TypeError):
        return name, "FAIL", evidence, "profile.json holds no comparison with the sheet"
    unnamed = [r["phase"] for r in time_rows if r["verdict"].startswith(gaps.UNEXPLAINED)]
    sizes = [t["seconds"] for r in time_rows for t in r["terms"]]
    sized = all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in sizes)
    said = (f"{why}; slowest predicted {sheet['slowest']} ({shares[sheet['slowest']]:.0%} of "
            f"the step), measured {sheets.measured_slowest(time_rows)}; {len(sizes)} named "
            "terms, each sized by a measurement")
    if unnamed or n_un["memory"] or not sized:
        gaps_said = ", ".join(unnamed + ([f"{n_un['memory']} byte rows"] if n_un["memory"]
                                         else []) + ([] if sized else ["a term unsized"]))
        return name, "Pass", evidence, f"{said}; UNEXPLAINED: {gaps_said}"
    return name, "Strong", evidence, f"{said}; no gap UNEXPLAINED (time or bytes)"


def honest_row(folder: Path) -> Row:
    """Pass: synchronized steps time every one of PHASES (the data wait outside the step's
    phases); Strong: and the loader-worker demonstration (NOTE [ A sync on the CPU ]) moved
    its wait from the data wait into the optimizer beyond the spread, recomputed here from
    the raw step timings."""
    from parity.drivers import profile_async as pasync  # here: the parser must not load torch
    from parity.drivers import profile_gaps as gaps

    name, evidence = "honest timing (profile)", "profile/profile.md, profile/profile.json"
    measured = _profile(folder).get("measured", {})
    steps = (measured.get("honest") or {}).get("synchronized") or []
    if not (steps and all(all(phase in step for phase in PHASES) for step in steps)):
        return (name, "FAIL", evidence,
                "profile.json has no synchronized step timing " + ", ".join(PHASES))
    said = f"{len(steps)} steps timed at synchronized boundaries, the data wait outside"
    try:
        worker = gaps.worker_timing(measured)
    except (KeyError, TypeError, ValueError, IndexError):
        worker = None
    if worker is None:
        return name, "Pass", evidence, f"{said}; no timing shown to move with a sync"
    a, b = (worker["medians"][v] for v in (pasync.IN_DATA_WAIT, pasync.IN_OPTIMIZER))
    moved = (f"data wait {sheets.seconds(a['data wait']['median'])} -> "
             f"{sheets.seconds(b['data wait']['median'])}, optimizer "
             f"{sheets.seconds(a['optimizer']['median'])} -> "
             f"{sheets.seconds(b['optimizer']['median'])}")
    if not worker["moved"]:
        return name, "Pass", evidence, f"{said}; the loader worker's wait did not move " \
                                       f"beyond the spread ({moved})"
    return (name, "Strong", evidence, f"{said}; a loader worker's wait moved with where the "
            f"loop blocks, each beyond the other's spread ({moved}): the CPU's asynchronous "
            "boundary, the lesson a CUDA sync teaches")


def profile_rows(folder: Path, returncode: int) -> list[Row]:
    """prediction before measurement and honest timing (profile), from the profile folder
    the profile command (exit status `returncode`) left."""
    if returncode != 0:
        return [("prediction before measurement", "FAIL", "profile/profile-output.txt",
                 f"the profile command exited {returncode}"),
                ("honest timing (profile)", "FAIL", "profile/profile-output.txt", "no profile")]
    return [prediction_row(folder), honest_row(folder)]
