"""docs/numerics.md: the catalogue of seeded faults, as both trees report them (a
deterministic run of the code: no timing), and the detector's overhead (committed
benchmark)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from parity.drivers.numerics import (
    FAULTED,
    observe_catalogue,
    seed_directory,
    underflow_counts,
)
from parity.drivers.train import one_thread
from parity.lab.gendocs import DOCS, section
from reference import train as ref_train
from reference.faults import FAULTS
from reference.numerics import COLUMNS


def _columns(found: dict[str, Any] | None) -> list[str]:
    """A tree's report as the table's three observed columns."""
    if found is None:
        return ["not found"] * 3
    where = (found["step"], found["phase"], found["module"], found["op"],
             tuple(found["index"]), found["value"])
    return [f"`{where}`", ", ".join(f"`{n}`" for n in found["out_of_range"]),
            f"`{tuple(found['replay'])}`"]


@section("numerics.md", "catalogue")
def _() -> str:
    with one_thread(), tempfile.TemporaryDirectory() as tmp:
        rows = observe_catalogue(Path(tmp))
    lines = ["Seeded before step 3 (`--fault-step`'s default) of the default model (8, 32, "
             "32, 3), tanh, or of the transformer (`--model gpt`: 4 blocks, n_embd 32, the copy "
             "task), in the precision shown. Both trees start from the same checkpoint, the "
             "reference's run after one step (torch resumes it through the cross-implementation "
             "mapping: `parity/drivers/numerics.py`), so a cell shows one value when both trees "
             "report it. On the command line, `python -m parity train --impl reference "
             "[--model gpt] --precision P --steps 12 --checkpoint-dir run --check-numerics "
             "--fault NAME` prints the row (exit status 3); with `--impl torch` the same "
             "command starts from torch's own weights (below the table).", "",
             "| fault | precision | first invalid (step, phase, module, op, index, value) | "
             "input already out of range | replay: backward node, module | the fix |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        ref, tor = _columns(row["reference"]), _columns(row["torch"])
        cells = [a if a == b else f"reference {a}, torch {b}" for a, b in zip(ref, tor,
                                                                               strict=True)]
        lines.append(f"| `{row['fault']}` | {row['precision']} | " + " | ".join(cells)
                     + f" | {FAULTS[row['fault']].fix} |")
    return "\n".join(lines)


@section("numerics.md", "underflow")
def _() -> str:
    zero = COLUMNS.index("zero")
    with one_thread(), tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = {**FAULTED, "precision": "fp16"}
        seed_directory(root / "start", config)
        rows = {(name, repaired): underflow_counts(name, config["seed"], root / "start", root,
                                                   repaired=repaired)
                for name in ("reference", "torch") for repaired in (False, True)}
    params = list(rows["reference", False])
    sizes = {n: p.data.size for n, p in ref_train.Run(ref_train.TrainConfig(**FAULTED))
             .model.named_parameters()}
    lines = ["`fp16_without_scaler` seeded before step 1 of the default model's fp16 run, "
             "from the same checkpoint in both trees (to watch it: `python -m parity train "
             "--impl reference --precision fp16 --steps 2 --checkpoint-dir run --check-numerics "
             "--fault fp16_without_scaler --fault-step 1`, exit status 0: its second step's "
             "line and the table per parameter): gradient entries exactly zero at that step, "
             "of each parameter's size, as each tree's detector counts them (claim "
             "`numerics.underflow_counts`). No value is non-finite in either run.", "",
             "| run | tree | " + " | ".join(f"`{n}`" for n in params) + " |",
             "|---|---|" + "---|" * len(params)]
    for repaired, label in ((False, "no GradScaler"), (True, "GradScaler, S = 2^16 (the fix)")):
        for name in ("reference", "torch"):
            cells = [f"{rows[name, repaired][n][zero]} / {sizes[n]}" for n in params]
            lines.append(f"| {label} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@section("numerics.md", "overhead")
def _() -> str:
    data = json.loads((DOCS / "data" / "numerics_overhead.json").read_text(encoding="utf-8"))
    lines = [f"torch {data['torch']}, {data['machine']}, one thread, CPU; {data['repeats']} "
             f"repeats of {data['steps']} steps per side, alternating step by step (`python "
             "benchmarks/numerics.py --write` rewrites `docs/data/numerics_overhead.json`).",
             "", "| model | precision | plain step (CPU ms) | checked / plain, wall: median "
             "[min, max] | CPU time ratio | the detector's CPU ms | its aten calls |",
             "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {r['size']} | {r['precision']} | {r['plain_ms']:.2f} | "
                     f"{r['wall_ratio']:.2f} [{r['wall_min']:.2f}, {r['wall_max']:.2f}] | "
                     f"{r['cpu_ratio']:.2f} | {r['extra_ms']:.2f} | {r['extra_calls']} |")
    return "\n".join(lines)
