"""docs/distributed.md's picture of an asynchronous save: every rank's training thread
(compute, staging) and its background (write, commit) on one time axis, from the event
timeline benchmarks/async_ckpt.py recorded (docs/data/ddp_async.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from parity.lab.pictures import picture

ASYNC_JSON = Path(__file__).resolve().parents[3] / "docs" / "data" / "ddp_async.json"
COLOURS = {"compute": "0.75", "wait": "tab:red", "stage": "tab:orange",
           "write": "tab:blue", "commit": "tab:green"}
LANES = (("compute", "wait", "stage"), ("write", "commit"))  # the training thread, the background
SAVES_SHOWN = 3  # the first saves of the run, and the steps around them


def load_async() -> dict[str, Any]:
    """The committed measurement; FileNotFoundError naming the command that writes it."""
    if not ASYNC_JSON.exists():
        raise FileNotFoundError(f"{ASYNC_JSON}: run python benchmarks/async_ckpt.py --write")
    return json.loads(ASYNC_JSON.read_text(encoding="utf-8"))


@picture("ddp_async_timeline.png")
def draw_timeline(path: Path) -> None:
    """Per rank, two lanes: the training thread's steps, its wait for the previous commit
    and its staging, the background's write and commit; the first SAVES_SHOWN saves, in
    milliseconds from the run's first step."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    data = load_async()
    every, timeline = data["every"], data["timeline"]
    last = every * SAVES_SHOWN + every // 2  # a few steps past the last save shown
    end = max(b for rank in timeline for w, s, a, b in rank if w == "compute" and s == last)
    fig, ax = plt.subplots(figsize=(10, 3.6))
    labels = []
    for r, events in enumerate(timeline):
        for lane, kinds in enumerate(LANES):
            y = (len(timeline) - 1 - r) * 2.5 + (1 - lane)
            labels.append((y + 0.4, f"rank {r} {'training' if lane == 0 else 'background'}"))
            for what, step, a, b in events:
                if what in kinds and a <= end:
                    ax.broken_barh([(1e3 * a, max(1e3 * (b - a), 0.3))], (y, 0.8),
                                   facecolors=COLOURS[what], edgecolor="white", linewidth=0.3)
                    if what == "commit":
                        ax.annotate(f"{step}", (1e3 * b, y + 0.4), xytext=(2, 0),
                                    textcoords="offset points", fontsize=6, va="center")
    ax.set_yticks([y for y, _ in labels], [t for _, t in labels], fontsize=7)
    ax.set_xlim(0, 1e3 * end)
    ax.set_xlabel("ms since the first step (time.monotonic, one clock for both processes)")
    ax.set_title(f"train --world-size 2 --model gpt --async-save: a save every {every} steps "
                 f"(the commit's step number beside it)", fontsize=9)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], fontsize=7,
              loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=len(COLOURS))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
