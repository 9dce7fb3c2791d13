"""docs/profile.md: the committed CPU profiles of the default MLP and of train --model gpt's
transformer in both trees (docs/data/profile_cpu.json, profile_cpu_gpt.json, written by
benchmarks/profile_cpu.py), rendered with the very functions that write a run's
predictions.md and profile.md (parity/lab/runners/profile_sheet.py). Each section exists twice:
NAME for the MLP, gpt-NAME for the transformer. Timings come from those files only, never
from a fresh run."""

from __future__ import annotations

from typing import Any

from parity.lab.gendocs import section
from parity.lab.pictures.profile import load_profile
from parity.lab.runners import profile_sheet as sheets
from reference import profile as rprof


def _record(model: str) -> dict[str, Any]:
    record = load_profile(model)
    if record is None:
        raise FileNotFoundError(f"no committed {model} profile: run python "
                                f"benchmarks/profile_cpu.py --model {model} --write")
    return record


def _both(name: str) -> Any:
    """Register fn(record) as section NAME (the MLP's) and gpt-NAME (the transformer's)."""
    def register(fn: Any) -> Any:
        for model, title in (("mlp", name), ("gpt", f"gpt-{name}")):
            section("profile.md", title)(lambda model=model: fn(_record(model)))
        return fn
    return register


def _demote(text: str, levels: int = 2) -> str:
    return "\n".join("#" * levels + line if line.startswith("#") else line
                     for line in text.splitlines())


@_both("profile-case")
def _profile_case(record: dict[str, Any]) -> str:
    lines = []
    for impl in ("reference", "torch"):
        r = record[impl]
        lines.append(f"- {sheets.case_line(r['sheet']['case'])}. Predictions sha256 "
                     f"`{r['predictions']['sha256'][:16]}...`, written "
                     f"{r['predictions']['written_at']}.")
    machine = record["torch"]["sheet"]["machine"]
    lines += ["", f"Recorded on `{record['machine']}` (Python {record['python']}, torch "
              f"{machine['torch']}), torch on {machine['threads']} thread."]
    return "\n".join(lines)


@_both("prediction-sheet")
def _prediction_sheet(record: dict[str, Any]) -> str:
    return _demote(sheets.predictions_markdown(record["torch"]["sheet"]))


@_both("side-by-side")
def _side_by_side(record: dict[str, Any]) -> str:
    rows = {impl: {r["phase"]: r for r in record[impl]["comparison"]["time"]}
            for impl in ("reference", "torch")}
    body = []
    for phase in [*rprof.PHASES, "outside the phases", "step"]:
        cells = [phase]
        for impl in ("reference", "torch"):
            r = rows[impl].get(phase)
            cells += ["-", "-"] if r is None else [
                sheets.seconds(r["predicted"]) if r["predicted"] else "0",
                f"{sheets.seconds(r['measured']['median'])} "
                f"({sheets.seconds(r['measured']['q1'])} .. "
                f"{sheets.seconds(r['measured']['q3'])})"]
        body.append(cells)
    head = ["phase", "reference predicted", "reference measured (q1 .. q3)",
            "torch predicted", "torch measured (q1 .. q3)"]
    slowest = {impl: (record[impl]["sheet"]["slowest"],
                      sheets.measured_slowest(record[impl]["comparison"]["time"]))
               for impl in ("reference", "torch")}
    return "\n".join([*sheets.table(head, body, {1, 2, 3, 4}), "", "Slowest phase, "
                      "predicted / measured: " + "; ".join(
                          f"{impl} {p} / {m}" for impl, (p, m) in slowest.items()) + "."])


@_both("gap-tables")
def _gap_tables(record: dict[str, Any]) -> str:
    out = []
    for impl in ("reference", "torch"):
        comp = record[impl]["comparison"]
        out += [f"**{impl}**", "", *sheets.table(sheets.PHASE_HEAD,
                                                   sheets.phase_rows(comp["time"]),
                                                   {1, 2, 3, 4}), ""]
    return "\n".join(out).rstrip()


@_both("memory")
def _memory(record: dict[str, Any]) -> str:
    out = []
    for impl in ("torch", "reference"):
        rows = record[impl]["comparison"]["memory"]
        out += [f"**{impl}**", "", *sheets.memory_lines(rows), ""]
    return "\n".join(out).rstrip()


@_both("honest")
def _honest(record: dict[str, Any]) -> str:
    return "\n".join(sheets.honest_lines(record["torch"]["comparison"]["honest"]))


@_both("worker")
def _worker(record: dict[str, Any]) -> str:
    worker = record["torch"]["comparison"].get("worker")
    if worker is None:
        return ("Not in this record: it predates the loader-worker timing (run python "
                "benchmarks/profile_cpu.py --write).")
    return "\n".join(sheets.worker_lines(worker))


@_both("layer")
def _layer(record: dict[str, Any]) -> str:
    out = []
    for impl in ("torch", "reference"):
        out += [f"**{impl}**", "", *sheets.saved_lines(record[impl]["measured"]["layer"]), ""]
    return "\n".join(out).rstrip()
