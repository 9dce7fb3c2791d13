"""The numerics picture of docs/numerics.md: per-layer counts over the steps of a float16
run, up to the step where a seeded fault makes the first non-finite value."""

from __future__ import annotations

from pathlib import Path

from parity.drivers.numerics import counts_history
from parity.pictures import picture
from reference.numerics import COLUMNS


@picture("numerics_counts.png")
def draw_counts(path: Path) -> None:
    """Zeros of each parameter's gradient (underflow) and non-finite activations, per step."""
    import matplotlib.pyplot as plt

    history, report = counts_history("reference")
    steps = list(range(len(history)))  # the step as the report numbers it (0-based)
    zero, nonfinite = COLUMNS.index("zero"), slice(0, 3)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for name in history[0]:
        if name.startswith("grad:") and name.endswith("weight"):
            top.plot(steps, [h[name][zero] for h in history], marker="o", ms=3,
                     label=name.removeprefix("grad:"))
        if name.startswith("act:"):
            bottom.plot(steps, [sum(h[name][nonfinite]) for h in history], marker="o", ms=3,
                        label=name.removeprefix("act:"))
    top.set_ylabel("zero gradient entries")
    top.set_title("fp16, loss scale 2^-16: gradients underflow to zero", fontsize=10)
    top.legend(fontsize=7, title="parameter", title_fontsize=7)
    bottom.set_ylabel("non-finite outputs")
    bottom.set_xlabel("step")
    if report is not None:
        bottom.set_title(f"weight_overflow seeded: first invalid at step {report.step}, "
                         f"module {report.module!r}, {report.op}", fontsize=10)
    bottom.legend(fontsize=7, title="module", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
