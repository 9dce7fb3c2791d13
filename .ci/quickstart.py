#!/usr/bin/env python3
"""Print the README's quick start: its two command lines, one per line (exit 1 unless there
are exactly two). .ci/run and .ci/torch-matrix --readme run them as written, so what CI runs
cannot drift from what users are told."""

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def quickstart(readme: Path = README) -> list[str]:
    section = readme.read_text(encoding="utf-8").split("## Quick start", 1)[1]
    block = re.search(r"```[a-z]*\n(.*?)```", section, re.S).group(1)
    return [ln for ln in block.splitlines() if ln.strip()]


if __name__ == "__main__":
    lines = quickstart()
    if len(lines) != 2:
        sys.exit(f"README quick start must hold exactly two command lines, found {len(lines)}")
    print("\n".join(lines))
