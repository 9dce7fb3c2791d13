"""The numerics pictures of docs/numerics.md: per-layer counts over the steps of a float16
run, up to the step where a seeded fault makes the first non-finite value, for the MLP and
for the transformer (its counts summed per block)."""

from __future__ import annotations

from pathlib import Path

from parity.drivers.numerics import counts_history
from parity.lab.pictures import picture
from reference.numerics import COLUMNS

ZERO, NONFINITE = COLUMNS.index("zero"), slice(0, 3)


@picture("numerics_counts.png")
def draw_counts(path: Path) -> None:
    """Zeros of each parameter's gradient (underflow) and non-finite activations, per step."""
    history, report = counts_history("reference")
    _draw(path, history, report, lambda name: name.removeprefix("grad:").removeprefix("act:"),
          lambda name: not name.startswith("grad:") or name.endswith("weight"),
          "weight_overflow")


@picture("numerics_counts_gpt.png")
def draw_counts_gpt(path: Path) -> None:
    """The transformer's counts, summed per block (embeddings, h.0 .. h.3, head)."""
    history, report = counts_history("reference", "gpt")
    _draw(path, history, report, _block, lambda name: True, "attention_overflow")


def _block(name: str) -> str:
    """transformer.h.2.mlp.c_fc.weight -> h.2; the embeddings, ln_f, lm_head and the loss."""
    path = name.split(":", 1)[1]
    parts = path.split(".")
    if parts[:2] == ["transformer", "h"]:
        return f"h.{parts[2]}"
    return {"transformer.wte": "embeddings", "transformer.wpe": "embeddings",
            "transformer.drop": "embeddings"}.get(".".join(parts[:2]), "head")


def _draw(path: Path, history: list[dict[str, list[int]]], report: object,
          group: object, keep: object, fault: str) -> None:
    import matplotlib.pyplot as plt

    steps = list(range(len(history)))  # the step as the report numbers it (0-based)
    zeros: dict[str, list[int]] = {}
    nonfinite: dict[str, list[int]] = {}
    for name in history[0]:
        if not keep(name):  # type: ignore[operator]
            continue
        label = group(name)  # type: ignore[operator]
        if name.startswith("grad:"):
            series = [h[name][ZERO] for h in history]
            zeros[label] = [a + b for a, b in zip(zeros.get(label, [0] * len(steps)), series,
                                                  strict=True)]
        else:
            series = [sum(h.get(name, [0] * len(COLUMNS))[NONFINITE]) for h in history]
            nonfinite[label] = [a + b for a, b in zip(nonfinite.get(label, [0] * len(steps)),
                                                      series, strict=True)]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for label, series in zeros.items():
        top.plot(steps, series, marker="o", ms=3, label=label)
    for label, series in nonfinite.items():
        bottom.plot(steps, series, marker="o", ms=3, label=label)
    top.set_ylabel("zero gradient entries")
    top.set_title("fp16, loss scale 2^-16: gradients underflow to zero", fontsize=10)
    top.legend(fontsize=7, title="parameter", title_fontsize=7)
    bottom.set_ylabel("non-finite outputs")
    bottom.set_xlabel("step")
    if report is not None:
        where = f"step {report.step}, {report.module}, {report.op}"  # type: ignore[attr-defined]
        bottom.set_title(f"{fault} seeded; first invalid: {where}", fontsize=9)
    bottom.legend(fontsize=7, title="module", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
