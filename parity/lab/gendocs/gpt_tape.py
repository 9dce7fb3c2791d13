"""What docs/gpt.md shows of the reference's tape (generated text and the picture)."""

from __future__ import annotations

import dataclasses

import numpy as np

from parity.drivers import gpt as dg
from reference import gpt as rgpt
from reference.module import Node

TAPE_BATCH = 4


def _group(module: str) -> str:
    if ".core" in module:
        return "core"
    if ".attn" in module:
        return "attn"
    if ".mlp" in module:
        return "mlp"
    return "ln" if ".ln_" in module else "ends"


def tape_rows(dropout: float = 0.1, dtype: type = np.float32,
              autocast: str | None = None) -> list[dict]:
    """The saved tensors of the ends and of block 0 after one forward of the default config
    (under `autocast` CPU autocast if given), in forward order, each with whether its storage
    was already counted (a view)."""
    from reference import amp as ramp

    config = dataclasses.replace(dg.GPTConfig(), dropout=dropout)
    model = rgpt.GPT(config, rng=np.random.default_rng(0), dtype=dtype)
    idx, targets = dg.tokens(config, TAPE_BATCH, config.block_size, 0)
    with ramp.autocast(autocast, "cpu"):
        model.forward(idx, targets)
    seen: set[int] = set()
    rows = []
    for path, m in [*model.named_modules(), ("", model.loss_fn)]:
        if ".h." in path and not path.startswith("transformer.h.0"):
            continue
        for name, a in Node.saved_tensors(m).items():
            root = a
            while isinstance(root.base, np.ndarray):
                root = root.base
            shared = id(root) in seen
            seen.add(id(root))
            rows.append({"module": path.replace("transformer.", "") or "(loss)",
                         "name": rgpt.torch_node_name(m, name).split(":")[-1],
                         "shape": list(a.shape), "dtype": str(a.dtype), "nbytes": int(a.nbytes),
                         "shared": shared, "group": _group(path),
                         "op": rgpt.torch_node_name(m, name).rpartition(".")[0]})
    return rows


def held_totals() -> list[tuple[str, float, int, int]]:
    """(dtype, dropout, tape entries, held bytes) for the default config, batch TAPE_BATCH."""
    out = []
    for dtype in (np.float32, np.float64):
        for dropout in (0.0, 0.1):
            config = dataclasses.replace(dg.GPTConfig(), dropout=dropout)
            model = rgpt.GPT(config, rng=np.random.default_rng(0), dtype=dtype)
            idx, targets = dg.tokens(config, TAPE_BATCH, config.block_size, 0)
            model.forward(idx, targets)
            out.append((np.dtype(dtype).name, dropout, len(model.tape()), model.held_bytes()))
    return out


def tape_by_op(dropout: float = 0.1, autocast: str | None = None
               ) -> dict[str, list[tuple[str, int, bool]]]:
    """Block 0's saved tensors grouped by op ("module: torch node" in forward order): for
    each, (attribute, bytes, a view of a storage already counted)."""
    ops: dict[str, list[tuple[str, int, bool]]] = {}
    for r in tape_rows(dropout, autocast=autocast):
        if not r["module"].startswith("h.0"):
            continue
        ops.setdefault(f"{r['module'][4:]}: {r['op']}", []).append(
            (r["name"].rpartition(".")[2], r["nbytes"], r["shared"]))
    return ops
