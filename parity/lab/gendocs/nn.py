"""docs/model.md: the tape of the compact model, tensor by tensor, against torch's hooks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from parity.lab.gendocs import section
from reference import nn as ref
from torch_impl import nn as tnn
from torch_impl import saved_tensors as tsaved


def tape_table_markdown(batch: int = 32, sizes: Sequence[int] = (16, 64, 64, 4),
                        activation: str = "gelu", dropout: float = 0.1) -> str:
    """The saved-tensor table of docs/model.md: reference tape vs torch's saved tensors."""
    model = ref.make_mlp(sizes, activation, dropout, rng=np.random.default_rng(0))
    twin = tnn.make_mlp(sizes, activation, dropout, generator=torch.Generator().manual_seed(0))
    x = np.zeros((batch, sizes[0]), dtype=np.float32)
    model.forward(x)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        theirs = tsaved.measure_saved_tensors(twin, torch.from_numpy(x).requires_grad_(True))
    lines = [
        f"make_mlp({tuple(sizes)}, {activation!r}, dropout={dropout}), float32, batch {batch}:",
        "",
        "| module | layer | reference saves | torch saves (grad_fn attribute) | shape | "
        "bytes (ref) | bytes (torch, excl. weights) |",
        "|---|---|---|---|---|---:|---:|",
    ]
    total_ref = total_torch = 0
    for path, layer in model.named_modules():
        if path == "":
            continue
        mine = [s for s in model.tape() if s.module == path]
        their = [s for s in theirs if s.module == path]
        for i in range(max(len(mine), len(their))):
            m = mine[i] if i < len(mine) else None
            t = their[i] if i < len(their) else None
            ref_bytes = m.nbytes if m else 0
            torch_bytes = 0 if t is None or t.is_parameter else t.nbytes
            total_ref, total_torch = total_ref + ref_bytes, total_torch + torch_bytes
            tname = "-" if t is None else t.name + (" (weight view)" if t.is_parameter else "")
            shape = (m or t).shape  # type: ignore[union-attr]
            lines.append(f"| {path} | {layer!r} | {m.name if m else '-'} | {tname} | "
                         f"{shape} | {ref_bytes:,} | {torch_bytes:,} |")
    lines.append(f"| total | | | | | {total_ref:,} | {total_torch:,} |")
    return "\n".join(lines)


@section("model.md", "tape-table")
def _() -> str:
    return tape_table_markdown()
