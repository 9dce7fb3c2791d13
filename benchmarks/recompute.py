"""Checkpointing's trade: held bytes and forward+backward time relative to no checkpointing.

    python benchmarks/recompute.py [--repeats 5] [--width 256] [--write]

Chains of 16, 32 and 64 modules (Linear(256, 256) + Tanh pairs, float32, batch 64), every
schedule, both implementations, timed round-robin in one run (medians). Next to each time
ratio: the theoretical recompute fraction R / n (recomputed layer forwards over n) and the
time it predicts, 1 + R / (3n), if a layer's backward costs two of its forwards. --write
saves the rows to docs/recompute_benchmark.json (the picture in docs/recompute.md reads it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from parity.checks.recompute import BENCH_JSON, draw_tradeoff, tradeoff_rows  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)  # CPU time of one thread: comparable across schedules and sides
    # 2 units + 1 modules: 8 -> 17 (~16), 16 -> 33 (~32), 32 -> 65 (~64)
    rows = tradeoff_rows((8, 16, 32), args.width, args.repeats)
    head = ("n", "schedule", "held", "torch held", "peak", "R/n", "theory t", "ref t",
            "torch t", "torch t / theory")
    print("  ".join(f"{h:>16}" for h in head))
    for r in rows:
        theory = 1 + r["recompute_fraction"] / 3
        print("  ".join(f"{v:>16}" for v in (
            r["n"], r["spec"], f"{r['held_ratio']:.3f}", f"{r['torch_held_ratio']:.3f}",
            f"{r['peak_ratio']:.3f}", f"{r['recompute_fraction']:.3f}", f"{theory:.3f}",
            f"{r['reference_time_ratio']:.3f}", f"{r['torch_time_ratio']:.3f}",
            f"{r['torch_time_ratio'] / theory:.3f}")))
    if args.write:
        BENCH_JSON.write_text(json.dumps(rows, indent=1) + "\n")
        draw_tradeoff(ROOT / "docs" / "img" / "recompute_tradeoff.png", rows)
        print(f"wrote {BENCH_JSON.relative_to(ROOT)} and docs/img/recompute_tradeoff.png")


if __name__ == "__main__":
    main()
