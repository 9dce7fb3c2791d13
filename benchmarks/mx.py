"""The MX counts table: clipped blocks per distribution, element format and scale mode, and
the elements ties-away rounding sets apart from nearest-even, counted by both trees.

    python benchmarks/mx.py [--no-write]

Counts, not timings: deterministic (seeded draws, the GPT at its seeded init), so
parity/test_mx.py (slow) recounts and compares with what this writes,
docs/data/mx_counts.json (docs/mx.md's table: python -m parity docs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parity.drivers.mx import FULL_BLOCKS, counts  # noqa: E402

OUT = ROOT / "docs" / "data" / "mx_counts.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print, do not write")
    args = parser.parse_args()
    table = counts(FULL_BLOCKS)
    mismatched = [(d, f, m) for d, by_fmt in table["clipped"].items()
                  for f, by_mode in by_fmt.items() for m, (a, b) in by_mode.items() if a != b]
    if mismatched:
        print(f"the trees' counts differ: {mismatched}", file=sys.stderr)
        return 1
    record = {"method": "parity.drivers.mx.counts: reference and torch_impl on the same "
                        "float32 blocks of 32, seed 0", "blocks_per_distribution": FULL_BLOCKS,
              "table": table}
    text = json.dumps(record, indent=1) + "\n"
    if args.no_write:
        print(text)
    else:
        OUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
