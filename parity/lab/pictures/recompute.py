"""docs/recompute.md's pictures: the tape each schedule holds, and the memory/time trade-off
measured by benchmarks/recompute.py (docs/data/recompute_benchmark.json)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parity.drivers.recompute import chain, inputs, make_ref, theory_time_ratio, tradeoff_rows
from parity.lab.pictures import picture, place_labels
from reference import recompute as rrc

BENCH_JSON = Path(__file__).resolve().parents[3] / "docs" / "data" / "recompute_benchmark.json"
TAPE_SPECS = ("none", "uniform:3", "sqrt", "optimal:2", "optimal:1")


def load_benchmark() -> dict | None:
    """The committed benchmark measurements, or None when none are committed."""
    return json.loads(BENCH_JSON.read_text(encoding="utf-8")) if BENCH_JSON.exists() else None


@picture("recompute_tape.png")
def draw_tape(path: Path, n_units: int = 12) -> None:
    """What is held between forward and backward, layer by layer, for several schedules."""
    import matplotlib.pyplot as plt

    case = chain(n_units // 2, 32)
    n = len(make_ref(case))
    fig, ax = plt.subplots(figsize=(10, 0.9 * len(TAPE_SPECS) + 1.2))
    for row, spec in enumerate(TAPE_SPECS):
        x, _ = inputs(case)
        run = rrc.forward_with_schedule(make_ref(case), x, spec)
        y = len(TAPE_SPECS) - 1 - row
        for entry in run.tape():
            last = entry.module.split(".")[-1]
            if entry.name == "input" and last.startswith("checkpoint"):
                start = int(last[len("checkpoint("):].split(":")[0])
                ax.add_patch(plt.Rectangle((start, y + 0.1), 0.25, 0.8, color="tab:orange"))
            else:
                ax.add_patch(plt.Rectangle((int(last) + 0.3, y + 0.1), 0.65, 0.8,
                                           color="tab:blue"))

        def brackets(plan: Sequence[int | rrc.Segment], depth: int, y: int = y) -> None:
            for item in plan:
                if isinstance(item, rrc.Segment):
                    ax.plot([item.start, item.stop], [y + 0.05 + 0.07 * depth] * 2,
                            color="black", lw=1)
                    brackets(item.body, depth + 1)
        brackets(run.schedule.plan, 0)
        ax.text(n + 0.3, y + 0.5, f"{run.held_bytes / 1024:.0f} KiB held", va="center")
    ax.set_yticks([len(TAPE_SPECS) - 1 - i + 0.5 for i in range(len(TAPE_SPECS))], TAPE_SPECS)
    ax.set_xlim(0, n + 3.5)
    ax.set_ylim(0, len(TAPE_SPECS))
    ax.set_xlabel(f"layer index (Linear/Tanh chain of {n} modules, batch 64, width 32, "
                  "float32)")
    ax.set_title("The tape between forward and backward: blue = a layer's saved tensors, "
                 "orange = a segment's saved input,\nlines under a row = checkpointed segments "
                 "(stacked lines: nested)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def tradeoff_figure() -> Any:
    """Held bytes vs forward+backward time relative to no checkpointing: medians over the
    benchmark's repeats with interquartile bars, next to the theory 1 + R / (3n). Without
    committed measurements, theory only."""
    import matplotlib.pyplot as plt

    bench = load_benchmark()
    rows = bench["rows"] if bench else tradeoff_rows((8, 16), 32)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    labels: dict[str, list[tuple[float, float, str]]] = {"reference": [], "torch": []}
    for ax, side in zip(axes, ("reference", "torch"), strict=True):
        for n, marker in zip(sorted({r["n"] for r in rows}), "osD^", strict=False):
            sub = [r for r in rows if r["n"] == n]
            held = [r["held_ratio"] for r in sub]
            ax.scatter(held, [theory_time_ratio(r["recompute_fraction"]) for r in sub],
                       marker=marker, facecolors="none", edgecolors="gray",
                       label=f"theory 1 + R/(3n), n = {n}")
            key = f"{side}_time_ratio"
            if key not in sub[0]:
                continue
            med = [r[key]["median"] for r in sub]
            err = [[r[key]["median"] - r[key]["q1"] for r in sub],
                   [r[key]["q3"] - r[key]["median"] for r in sub]]
            ax.errorbar(held, med, yerr=err, fmt=marker, capsize=3, ms=5,
                        label=f"measured median, IQR bars, n = {n}")
            labels[side] += [(r["held_ratio"], m, r["spec"]) for r, m in zip(sub, med,
                                                                               strict=True)]
        ax.set_title(side)
        ax.set_xlabel("held bytes / held bytes without checkpointing")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("forward+backward time / without checkpointing")
    axes[1].legend(fontsize=6)
    if bench:
        fig.suptitle(f"{bench['repeats']} interleaved repeats; {bench['method']}", fontsize=7)
    fig.tight_layout()
    for ax, side in zip(axes, ("reference", "torch"), strict=True):
        place_labels(fig, ax, labels[side])
    return fig


@picture("recompute_tradeoff.png")
def draw_tradeoff(path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = tradeoff_figure()
    fig.savefig(path, dpi=110)
    plt.close(fig)
