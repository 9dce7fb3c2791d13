"""docs/profile.md's pictures, drawn from the committed profile of both trees on a CPU
(docs/data/profile_cpu.json, written by benchmarks/profile_cpu.py): the phases predicted vs
measured, and the bytes at each boundary by category."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from parity.drivers import profile_sheet as sheets
from parity.pictures import picture

PROFILE_JSON = Path(__file__).resolve().parents[2] / "docs" / "data" / "profile_cpu.json"


def load_profile() -> dict[str, Any] | None:
    """The committed profiles ({"torch": ..., "reference": ...}), or None if none is."""
    return json.loads(PROFILE_JSON.read_text(encoding="utf-8")) if PROFILE_JSON.exists() \
        else None


def _results() -> list[dict[str, Any]]:
    record = load_profile()
    if record is None:
        raise FileNotFoundError(f"{PROFILE_JSON}: run python benchmarks/profile_cpu.py --write")
    return [record["reference"], record["torch"]]


@picture("profile_phases.png")
def _(path: Path) -> None:
    sheets.draw_phases(path, _results())


@picture("profile_memory.png")
def _(path: Path) -> None:
    sheets.draw_memory(path, _results())
