"""docs/optimize.md: the gauntlet's committed runs, one row per optimization."""

from __future__ import annotations

import json

from parity.lab.gendocs import DOCS, section

RUNS = DOCS / "data" / "optimize"


@section("optimize.md", "runs")
def _() -> str:
    records = sorted(RUNS.glob("optimize-*.json"))
    if not records:
        return "No committed run yet (`python -m parity optimize --what W --out " \
               "docs/data/optimize`).\n"
    lines = ["| optimization | model | claims hold | speedup [95% interval] | clock | "
             "first call (s, base / opt) | learning | resume | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for path in records:
        r = json.loads(path.read_text())
        what = r["opt"]["what"]
        model = r["opt"].get("model", "mlp")
        claims = sum(c[3] for c in r["claims"])
        ratio, low, high = r["speedup"]
        word = "null" if r["null"] else ("faster" if low > 1 else "slower")
        learned = all(x["final_loss"] <= r["controls"]["loss_band"] * x["initial_loss"]
                      and x["accuracy"] >= r["controls"]["accuracy"]
                      for x in r["learning"].values())
        first = r["timing"].get("first_call_wall")
        call = (f"{first['baseline']:.3f} / {first['optimized']:.3f}" if first else
                "not recorded")
        mismatches, n, same = r["resume"]
        lines.append(
            f"| [{what}](data/optimize/{path.stem}.md) | {model} | "
            f"{claims}/{len(r['claims'])} | "
            f"{ratio:.2f} [{low:.2f}, {high:.2f}] {word} | {r['opt']['timer']} | {call} | "
            f"{'both pass' if learned else 'FAIL'} | "
            f"{'exact' if mismatches == 0 and same else f'{mismatches:g}/{n} differ'} | "
            f"{'PASS' if r['passed'] else 'FAIL'} |")
    return "\n".join(lines) + "\n"
