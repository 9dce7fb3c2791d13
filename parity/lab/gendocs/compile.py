"""docs/compile.md: the graph-break catalogue's code (read from parity/drivers/
compile_breaks.py), and what each measured torch version did with it, the training step, the
shape sequence and the numerics (docs/data/compile.json, written by benchmarks/compile.py),
and the claim table."""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from parity.drivers.compile import SHAPES
from parity.drivers.compile_breaks import CATALOGUE
from parity.lab.gendocs import DOCS, section
from parity.lab.gendocs.recompute import claims_table

DATA = DOCS / "data" / "compile.json"


def _measured() -> dict[str, Any]:
    return json.loads(DATA.read_text()) if DATA.exists() else {}


def _versions(data: dict[str, Any]) -> list[str]:
    return sorted(data, key=lambda v: tuple(int(p) for p in v.split(".")))


def _plain(reason: str) -> str:
    """A reason without what differs by machine: object addresses, absolute paths."""
    reason = re.sub(r" at 0x[0-9a-f]+", "", reason)
    return re.sub(r"/\S*/site-packages/", "", reason)


def _missing() -> str:
    return f"No measurements committed ({DATA.name} is missing: python benchmarks/compile.py)."


@section("compile.md", "catalogue-code")
def _() -> str:
    parts = []
    for e in CATALOGUE:
        parts += [f"### `{e.name}`", "", f"Breaks because {e.cause}. Repair: {e.repair}.", "",
                  "```python", inspect.getsource(e.broken).rstrip(), "",
                  inspect.getsource(e.repaired).rstrip(), "```", ""]
    return "\n".join(parts).rstrip()


@section("compile.md", "catalogue-counts")
def _() -> str:
    data = _measured()
    if not data:
        return _missing()
    versions = _versions(data)
    lines = ["| break | " + " | ".join(f"torch {v}: graphs / breaks (repaired)" for v in versions)
             + " | first line of the reason (torch " + versions[-1] + ") |",
             "|---|" + "---:|" * len(versions) + "---|"]
    for i, e in enumerate(CATALOGUE):
        cells = []
        for v in versions:
            r = data[v]["catalogue"][i]
            cells.append(f"{r['graphs']} / {r['breaks']} ({r['repaired_graphs']} / "
                         f"{r['repaired_breaks']})")
        reason = data[versions[-1]]["catalogue"][i]["reasons"]
        lines.append(f"| `{e.name}` | " + " | ".join(cells) + " | "
                     + (_plain(reason[0]).replace("|", "\\|") if reason else "-") + " |")
    first = data[versions[0]]["catalogue"]
    worded = [f"`{e.name}`: \"{_plain(r['reasons'][0])}\""
              for e, r in zip(CATALOGUE, first, strict=True) if r["reasons"]]
    lines += ["", f"torch {versions[0]} words the same reasons as: " + "; ".join(worded) + "."]
    return "\n".join(lines)


@section("compile.md", "train-step")
def _() -> str:
    data = _measured()
    if not data:
        return _missing()
    lines = []
    for v in _versions(data):
        s = data[v]["train_step"]
        lines.append(f"- torch {v}: {s['graphs']} graphs ({s['ops_per_graph']} operations), "
                     f"graph_break_count {s['breaks']}, {len(s['reasons'])} reasons: "
                     + "; ".join(f"`{_plain(r)}`" for r in s["reasons"]))
    return "\n".join(lines)


@section("compile.md", "recompiles")
def _() -> str:
    data = _measured()
    if not data:
        return _missing()
    versions = _versions(data)
    shapes = ", ".join(f"({b}, {t})" for b, t in SHAPES)
    lines = [f"Calls with (batch, sequence) = {shapes}; graphs compiled "
             "(`counters['stats']['unique_graphs']`):", "",
             "| mode | " + " | ".join(f"torch {v}" for v in versions) + " |",
             "|---|" + "---:|" * len(versions)]
    modes = list(data[versions[-1]]["recompiles"])
    for m in modes:
        lines.append(f"| `{m}` | " + " | ".join(str(data[v]["recompiles"][m]["graphs"])
                                              for v in versions) + " |")
    lines += ["", f"The failed guards, in the order Dynamo recorded them (torch {versions[-1]}; "
              "each line is one cached version tried and rejected for a call):", ""]
    for m in modes:
        guards = data[versions[-1]]["recompiles"][m]["failed_guards"]
        lines.append(f"- `{m}`: " + ("none" if not guards else
                                     "; ".join(f"`{g}`" for g in guards)))
    return "\n".join(lines)


def _worst(row: dict, side: str) -> str:
    value = row.get(f"{side}_worst")
    return "-" if value is None else f"{value:.2g}"


@section("compile.md", "numerics")
def _() -> str:
    data = _measured()
    if not data:
        return _missing()
    lines = ["Worst case over each compared array of |compiled - other| / (eps S), S the "
             "claim's bound (1 = at the bound); `differ`: elements not bit-identical to eager. "
             "The claims' bound is 6 sigma of the probabilistic propagation; `worst case` is "
             "the same ratio against the worst-case propagation (`bounds`) for comparison.",
             "", "| torch | case | entry | differ | vs eager (compile.eager) | worst case | "
             "vs reference (compile.reference) | worst case |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for v in _versions(data):
        for r in data[v]["numerics"]:
            lines.append(f"| {v} | {r['case']} | `{r['entry']}` | {r['differ']} / {r['size']} | "
                         f"{r['eager']:.2g} | {_worst(r, 'eager')} | {r['reference']:.2g} | "
                         f"{_worst(r, 'reference')} |")
    lines += ["", "Cold compile of the first case (fresh cache, wall clock, one run): "
              + "; ".join(f"torch {v}: {data[v]['cold_compile_s']:g} s ({data[v]['machine']})"
                          for v in _versions(data)) + "."]
    return "\n".join(lines)


@section("compile.md", "claims")
def _() -> str:
    return claims_table("compile")
