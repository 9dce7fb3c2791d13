"""docs/gpt.md's picture: the block as the tape sees it (which tensors each op keeps, and
their bytes), drawn from the reference's tape on the default config."""

from __future__ import annotations

from pathlib import Path

from parity.drivers.gpt_docs import TAPE_BATCH, tape_rows
from parity.pictures import picture


@picture("gpt_tape.png")
def draw_tape(path: Path) -> None:
    """One bar per saved tensor of block 0 and of the model's ends, float32, dropout 0.1,
    bytes on the x axis; tensors that share one storage are hatched after the first."""
    import matplotlib.pyplot as plt

    rows = tape_rows(dropout=0.1)
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(rows) + 1.4))
    colors = {"ln": "tab:blue", "attn": "tab:orange", "core": "tab:red", "mlp": "tab:green",
              "ends": "tab:gray"}
    for i, r in enumerate(rows):
        y = len(rows) - 1 - i
        ax.barh(y, r["nbytes"], color=colors[r["group"]], hatch="//" if r["shared"] else None,
                edgecolor="white" if not r["shared"] else "black")
        ax.text(r["nbytes"], y, f" {r['nbytes']:,}", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r['module']}: {r['name']} {tuple(r['shape'])}" for r in rows][::-1],
                       fontsize=7)
    ax.set_xlabel("bytes kept for backward (float32)")
    ax.set_title(f"What the tape keeps: tiny GPT, batch {TAPE_BATCH} x 16 tokens, dropout 0.1\n"
                 "block 0 (block 1 alike); hatched: a view of a storage already counted",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
