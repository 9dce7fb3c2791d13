"""docs/accounting.md's picture: the published FLOP approximations against the exact count over
the sequence length, from the formulas alone (deterministic)."""

from __future__ import annotations

from pathlib import Path

from parity.lab.pictures import picture
from reference import flops as rflops
from reference.flops_published import flop_approximations

# (label, n_layer, d_model, n_head): GPT-2 small's and GPT-3 175B's shapes, V = 50257
SHAPES = (("GPT-2 small", 12, 768, 12), ("GPT-3 175B", 96, 12288, 96))
VOCAB = 50257
SEQ_LENS = tuple(2**k for k in range(6, 18))  # 64 .. 131072 tokens


def approximation_curves(n_layer: int, d_model: int, n_head: int
                         ) -> dict[str, list[float]]:
    """approximation / exact per sequence length, and the exact count's attention share."""
    curves: dict[str, list[float]] = {"attention share": []}
    for s in SEQ_LENS:
        shape = {"n_layer": n_layer, "d_model": d_model, "n_head": n_head, "seq_len": s,
                 "vocab": VOCAB, "batch": 1}
        for a in flop_approximations(**shape):
            curves.setdefault(a.name, []).append(float(a.flops / a.exact))
        parts = rflops.transformer_forward_flops(**shape)
        curves["attention share"].append(parts["attention"] / parts["total"])
    return curves


@picture("accounting_approximations.png")
def _(path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"Kaplan 2020": "C0", "PaLM 2022": "C1", "Chinchilla 2022": "C2"}
    for (label, n_layer, d_model, n_head), style in zip(SHAPES, ("-", "--"), strict=True):
        curves = approximation_curves(n_layer, d_model, n_head)
        for name, color in colors.items():
            left.plot(SEQ_LENS, curves[name], style, color=color, marker=".",
                      label=f"{name}, {label}")
        right.plot(SEQ_LENS, curves["attention share"], style, color="k", marker=".",
                   label=label)
        for ax in (left, right):
            ax.axvline(6 * d_model, linestyle=style, color="0.6", linewidth=0.8)
    left.axhline(1.0, color="k", linewidth=0.8)
    left.set_ylabel("approximation / exact count")
    left.set_title("FLOPs of one training step, batch 1, untied head")
    right.set_ylabel("attention (q k^T, att @ v) / forward FLOPs")
    right.set_title("where attention starts to matter (grey: s = 6h)")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length s (tokens)")
        ax.grid(alpha=0.3)
    left.legend(fontsize=7)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
