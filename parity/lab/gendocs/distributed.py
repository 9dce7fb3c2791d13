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


def _diff(value: float) -> str:
    return "0" if value == 0 else f"{value:.3g}"


@section("distributed.md", "scaler-runs")
def _() -> str:
    if not DATA.exists():
        return ("No measurements committed (docs/data/ddp_scaler.json is missing: "
                "python -m parity.drivers.ddp_scaler).")
    data = json.loads(DATA.read_text(encoding="utf-8"))
    sizes = "-".join(map(str, data["sizes"]))
    lines = [f"MLP {sizes}, fp16 autocast, SGD with momentum, init_scale 2^16, "
             f"growth_interval {data['growth_interval']}, {data['steps']} steps; the fault: "
             "rank ws - 1's reduced gradient made +inf at step 2 (torch "
             f"{data['torch']}; `python -m parity.drivers.ddp_scaler` rewrites "
             "`docs/data/ddp_scaler.json`). Without the repair:", "",
             "| ws | step | scale per rank after the step | ranks that skipped | "
             "max \\|Δparam\\| between ranks | the cross-rank check |",
             "|---:|---:|---|---|---:|---|"]
    repaired = [run for run in data["runs"] if run["repair"] != "none"]
    for run in data["runs"]:
        if run["repair"] != "none":
            continue
        for s, step in enumerate(run["steps"], 1):
            verdict = "agree" if step["divergence"] is None else step["divergence"].split(
                " (found_inf")[0]
            skipped = ", ".join(map(str, step["skipped"])) or "none"
            lines.append(f"| {run['world_size']} | {s} | {_scales(step['scale'])} | {skipped} "
                         f"| {_diff(step['max_abs_param_difference'])} | {verdict} |")
    lines += ["", "With the repair (every rank holds the same scale at every step):", "",
              "| ws | repair | scale after each step | steps skipped (by every rank) | "
              "max \\|Δparam\\| between ranks, any step | the cross-rank check |",
              "|---:|---|---|---|---:|---|"]
    for run in repaired:
        steps = run["steps"]
        assert all(len(set(st["scale"])) == 1 for st in steps), "repaired: one scale per step"
        skipped = [str(s) for s, st in enumerate(steps, 1) if st["skipped"]]
        worst = max(st["max_abs_param_difference"] for st in steps)
        verdicts = {st["divergence"] for st in steps}
        lines.append(f"| {run['world_size']} | {REPAIRS[run['repair']]} | "
                     f"{_scales([st['scale'][0] for st in steps])} | {', '.join(skipped)} | "
                     f"{_diff(worst)} | {'agree' if verdicts == {None} else 'DIVERGE'} |")
    return "\n".join(lines)
