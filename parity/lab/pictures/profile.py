"""docs/profile.md's pictures, drawn from the committed profiles of both trees on a CPU
(docs/data/profile_cpu.json for the MLP, profile_cpu_gpt.json for the transformer, written by
benchmarks/profile_cpu.py): the phases predicted vs measured, and the bytes at each boundary
by category."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from parity.lab.pictures import picture
from parity.lab.runners import profile_sheet as sheets

DATA = Path(__file__).resolve().parents[3] / "docs" / "data"
PROFILE_JSON = DATA / "profile_cpu.json"
PROFILE_JSONS = {"mlp": PROFILE_JSON, "gpt": DATA / "profile_cpu_gpt.json"}


def load_profile(model: str = "mlp") -> dict[str, Any] | None:
    """The committed profiles of `model` ({"torch": ..., "reference": ...}), or None."""
    path = PROFILE_JSONS[model]
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _results(model: str) -> list[dict[str, Any]]:
    record = load_profile(model)
    if record is None:
        raise FileNotFoundError(f"{PROFILE_JSONS[model]}: run python benchmarks/profile_cpu.py "
                                f"--model {model} --write")
    return [record["reference"], record["torch"]]


@picture("profile_phases.png")
def _(path: Path) -> None:
    sheets.draw_phases(path, _results("mlp"))


@picture("profile_memory.png")
def _(path: Path) -> None:
    sheets.draw_memory(path, _results("mlp"))


@picture("profile_gpt_phases.png")
def _(path: Path) -> None:
    sheets.draw_phases(path, _results("gpt"))


@picture("profile_gpt_memory.png")
def _(path: Path) -> None:
    sheets.draw_memory(path, _results("gpt"))
