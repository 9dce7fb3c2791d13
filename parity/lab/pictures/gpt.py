"""docs/gpt.md's picture: the block as the tape sees it (which tensors each op keeps, and
their bytes), drawn from the reference's tape on the default config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parity.lab.gendocs.gpt_tape import TAPE_BATCH, tape_rows
from parity.lab.pictures import picture


def tape_figure() -> Any:
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
    return fig


@picture("gpt_tape.png")
def draw_tape(path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = tape_figure()  # the box measured at the saving dpi: tight_layout's, made at the
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.15)  # figure's, clipped
    plt.close(fig)


@picture("gpt_tape_autocast.png")
def draw_tape_autocast(path: Path) -> None:
    """Block 0 op by op: what each op keeps for backward, float32 against bf16 CPU autocast,
    each bar stacked by saved tensor (labelled inside), the op's total bytes at its end."""
    import matplotlib.pyplot as plt

    from parity.lab.gendocs.gpt_tape import tape_by_op

    runs = (("float32", tape_by_op(0.1)), ("bf16 autocast", tape_by_op(0.1, "bfloat16")))
    ops = list(runs[1][1])  # forward order; autocast keeps a superset (the weight casts)
    fig, ax = plt.subplots(figsize=(10.5, 0.62 * len(ops) + 1.6))
    colors = {"float32": "tab:blue", "bf16 autocast": "tab:orange"}
    height = 0.38
    for j, (label, by_op) in enumerate(runs):
        for i, op in enumerate(ops):
            y = len(ops) - 1 - i + (height / 2 if j == 0 else -height / 2)
            left = 0
            for attr, nbytes, shared in by_op.get(op, []):
                ax.barh(y, nbytes, height=height, left=left, color=colors[label],
                        edgecolor="black", linewidth=0.5, hatch="//" if shared else None,
                        label=label if (i, left) == (0, 0) else None)
                if nbytes >= 2500:
                    ax.text(left + nbytes / 2, y, attr, ha="center", va="center", fontsize=6)
                left += nbytes
            ax.text(left, y, f" {left:,}", va="center", fontsize=7)
    ax.set_yticks(range(len(ops)))
    ax.set_yticklabels(ops[::-1], fontsize=7)
    ax.set_xlabel("bytes kept for backward (block 0; block 1 keeps the same)")
    totals = [sum(n for entries in by_op.values() for _, n, s in entries if not s)
              for _, by_op in runs]
    ax.set_title(f"The block as the tape sees it: tiny GPT, batch {TAPE_BATCH} x 16 tokens, "
                 f"dropout 0.1\nfloat32 {totals[0]:,} B against bf16 CPU autocast "
                 f"{totals[1]:,} B per block\nmatmul operands, softmax result, GELU input and "
                 "dropout noise halve; LayerNorm stays float32;\nthe weights' bf16 copies "
                 "(mat2) are new", fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
