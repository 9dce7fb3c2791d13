"""docs/mx.md: the counts table (clipped blocks per scale mode, ties-away differences), read
from docs/data/mx_counts.json (benchmarks/mx.py; parity/test_mx.py recounts it, slow)."""

from __future__ import annotations

import json

from parity.lab.gendocs import DOCS, section

COUNTS = DOCS / "data" / "mx_counts.json"
MODES = ("floor", "ceil", "even", "rceil", "rceil_log2f")
FORMATS = ("float8_e4m3fn", "float8_e5m2", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn")
NAMES = {"normal": "normal N(0, 1)", "student_t3": "Student-t, 3 dof",
         "gpt": "compact GPT, Linear inputs"}


def _load() -> dict | None:
    return json.loads(COUNTS.read_text(encoding="utf-8")) if COUNTS.is_file() else None


@section("mx.md", "clipping")
def _() -> str:
    record = _load()
    if record is None:
        return f"No counts committed ({COUNTS.name} is missing: python benchmarks/mx.py)."
    table = record["table"]
    head = "| distribution | element format | " + " | ".join(f"`{m}`" for m in MODES) + " |"
    lines = [head, "|---|---|" + "---:|" * len(MODES)]
    for dist, by_fmt in table["clipped"].items():
        n = table["blocks"][dist]
        for fmt in FORMATS:
            cells = []
            for m in MODES:
                ref, tor = by_fmt[fmt][m]
                assert ref == tor, f"the committed counts differ between the trees: {dist}"
                cells.append(f"{ref} ({100 * ref / n:.1f}%)")
            lines.append(f"| {NAMES[dist]} | `{fmt}` | " + " | ".join(cells) + " |")
    return (f"Blocks (of {record['blocks_per_distribution']:,} blocks of 32 per distribution) "
            "whose scaled amax lies beyond the element format's max, so that the clamp, not "
            "the rounding, sets their largest element; the same count in both trees (claim "
            "`mx.clipping`):\n\n" + "\n".join(lines))


@section("mx.md", "ties-away")
def _() -> str:
    record = _load()
    if record is None:
        return f"No counts committed ({COUNTS.name} is missing: python benchmarks/mx.py)."
    table = record["table"]
    head = "| distribution | input | " + " | ".join(f"`{f}`" for f in FORMATS) + " |"
    lines = [head, "|---|---|" + "---:|" * len(FORMATS)]
    for dist in table["away"]:
        for part, label in (("away", "float32"), ("away_bf16", "rounded to bfloat16")):
            cells = [str(table[part][dist][f][0]) for f in FORMATS]
            lines.append(f"| {NAMES[dist]} | {label} | " + " | ".join(cells) + " |")
    n = record["blocks_per_distribution"] * 32
    return (f"Elements (of {n:,} per distribution, floor scale mode) whose code under "
            "`rounding=\"nearest_away\"` differs from nearest-even's, the same count in both "
            "trees:\n\n" + "\n".join(lines))
