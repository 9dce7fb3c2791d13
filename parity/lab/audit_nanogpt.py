"""A nanoGPT-style checkpoint (model, optimizer, model_args, iter_num, config), read as
nanoGPT's train.py (karpathy/nanoGPT) runs. Three of the generic rows mean something else
there:

- scheduler: its learning rate is get_lr(iter_num), a pure function of the saved iter_num:
  there is no scheduler state to lose;
- scaler: train.py makes torch.cuda.amp.GradScaler(enabled=(dtype == 'float16')), which
  disables itself without CUDA, and a 'cpu' device never autocasts: needed only for float16
  on CUDA (a config that names neither keeps the generic rule: needed if fp16);
- data position and epoch: nanoGPT's get_batch draws each batch's offsets with
  torch.randint from the global generator, so it has no position and no epoch, and the torch
  CPU RNG saved resumes its batches exactly. But the file cannot show the loader: a script
  with nanoGPT's keys and a loader of epochs needs its position saved. So with the RNG saved
  the two rows are not counted missing, and the verdict is "unknown", saying why, never
  "exact" (exit 5). Without the RNG the RNG row is the gap, and these two stay named with
  what losing them costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parity.lab.audit_recognize import MISSING, NOT_NEEDED, PRESENT, Audit, Row

KIND = "nanoGPT-style checkpoint"


def adjust(audit: Audit, top: Mapping[str, Any]) -> Audit:
    """`audit` with nanoGPT's meaning of the scheduler, scaler, data position and epoch rows,
    and its flag restated from the rows as they now are."""
    config = top.get("config") if isinstance(top.get("config"), Mapping) else {}
    device = str(config.get("device", "")).lower()

    def set_row(item: str, detail: str, need: str) -> None:
        i = next(n for n, r in enumerate(audit.rows) if r.item == item)
        if audit.rows[i].status == MISSING:
            audit.rows[i] = Row(item, NOT_NEEDED, audit.rows[i].where, detail, need)

    set_row("scheduler", "lr is get_lr(iter_num), and iter_num is saved",
            "not in nanoGPT: its lr is a function of iter_num")
    if device.startswith("cpu"):
        set_row("scaler", "device 'cpu': the GradScaler disables itself without CUDA",
                "if trained in float16 on CUDA")
    if audit.row("torch CPU RNG").status == PRESENT:
        for item in ("data position", "epoch"):
            set_row(item, "nanoGPT's get_batch draws its offsets with torch.randint: the "
                          "torch CPU RNG saved is its position",
                    "if batches come from a loader of epochs, not nanoGPT's get_batch")
        if audit.unknown is None and not audit.gaps():
            audit.unknown = ("nanoGPT's get_batch resumes from the torch RNG saved here, but "
                             "the file cannot show that the batches come from it: a loader "
                             "of epochs needs its position saved (resume-check settles it)")
    audit.flags = [f for f in audit.flags if not f.startswith("nanoGPT-style")]
    missing = [i for i in ("scaler", "torch CPU RNG", "data position")
               if audit.row(i).status == MISSING]
    if missing:
        audit.flags.append(f"nanoGPT-style checkpoint (model, optimizer, model_args, "
                           f"iter_num): no {', '.join(missing)}; its resume is not exact (its "
                           "lr is get_lr(iter_num): no scheduler is needed)")
    return audit
