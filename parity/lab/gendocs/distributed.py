"""docs/distributed.md: the loss-scaling-across-ranks table (committed measurement,
docs/data/ddp_scaler.json, written by `python -m parity.drivers.ddp_scaler` and held to a
fresh run by parity/test_ddp_scaler.py)."""

from __future__ import annotations

import json
import math

from parity.lab.gendocs import DOCS, section

DATA = DOCS / "data" / "ddp_scaler.json"
REPAIRS = {"none": "none (plain GradScaler)", "max": "all_reduce(found_inf, MAX)",
           "sharded": "ShardedGradScaler (SUM)", "sum": "all_reduce(found_inf, SUM)"}


def _scales(scales: list[float]) -> str:
    """Powers of two as 2^k (every scale here is one), anything else as it is."""
    return ", ".join(f"2^{int(math.log2(s))}" if s > 0 and math.log2(s).is_integer()
                     else f"{s:g}" for s in scales)


@section("distributed.md", "scaler-runs")
def _() -> str:
    if not DATA.exists():
        return ("No measurements committed (docs/data/ddp_scaler.json is missing: "
                "python -m parity.drivers.ddp_scaler).")
    data = json.loads(DATA.read_text(encoding="utf-8"))
    sizes = "-".join(map(str, data["sizes"]))
    lines = [f"MLP {sizes}, fp16 autocast, SGD with momentum, init_scale 2^16, "
             f"growth_interval {data['growth_interval']}; the fault: rank ws - 1's reduced "
             f"gradient made +inf at step 2 (torch {data['torch']}; "
             "`python -m parity.drivers.ddp_scaler` rewrites `docs/data/ddp_scaler.json`).", "",
             "| ws | repair | step | scale per rank after the step | ranks that skipped | "
             "max \\|Δparam\\| between ranks | the cross-rank check |",
             "|---:|---|---:|---|---|---:|---|"]
    for run in data["runs"]:
        for s, step in enumerate(run["steps"], 1):
            verdict = step["divergence"] or "agree"
            if step["divergence"]:
                verdict = verdict.split(" (found_inf")[0]
            skipped = ", ".join(map(str, step["skipped"])) or "none"
            diff = step["max_abs_param_difference"]
            lines.append(f"| {run['world_size']} | {REPAIRS[run['repair']]} | {s} | "
                         f"{_scales(step['scale'])} | {skipped} | "
                         f"{'0' if diff == 0 else f'{diff:.3g}'} | {verdict} |")
    return "\n".join(lines)
