"""A nanoGPT-style checkpoint (model, optimizer, model_args, iter_num, config), read as
nanoGPT's train.py (karpathy/nanoGPT) runs. Three of the generic rows mean something else
there:

- scheduler: its learning rate is get_lr(iter_num), a pure function of the saved iter_num:
  there is no scheduler state to lose;
- scaler: train.py makes torch.cuda.amp.GradScaler(enabled=(dtype == 'float16')), which
  disables itself without CUDA, and its device_type is 'cuda' if 'cuda' in device else
  'cpu', where it never autocasts (ctx = nullcontext()): so a device without 'cuda' in its
  name ('cpu', 'mps') trains float32 and needs no scaler; needed only for float16 on CUDA
  (a config that names no device keeps the generic rule: needed if fp16);
- data position and epoch: nanoGPT's get_batch draws each batch's offsets with
  torch.randint from the global generator, so it has no position and no epoch, and the torch
  CPU RNG saved resumes its batches exactly. But the file cannot show the loader: a script
  with nanoGPT's keys and a loader of epochs needs its position saved. So with the RNG saved
  the two rows are not counted missing, and the verdict is "unknown", saying why, never
  "exact" (exit 5). Without the RNG the RNG row is the gap, and these two stay named with
  what losing them costs.

A file with train.py's own `config` (every global of the script: eval_interval among them)
and best_val_loss was written by train.py's loop, which draws the batch the next step trains
on (its prefetch, `X, Y = get_batch('train')`) before the eval that writes the checkpoint,
and draws it again on resume. An RNG state taken on the line that saves is then not the
straight run's; the one taken just before that prefetch is. The file cannot show which was
saved, so the verdict stays unknown, saying so with what each measured (MEASURED) and the
fix; without the RNG, the flag says what the resume cost and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parity.lab.audit_recognize import MISSING, NOT_NEEDED, PRESENT, Audit, Row

KIND = "nanoGPT-style checkpoint"
# max |Δw| of the weights at iteration 8 resumed from iteration 4 against a straight run's,
# and the tensors differing (of 10): examples/nanogpt_train.py (a 1-layer GPT, dropout 0.1,
# 2 micro-steps of 4 sequences, get_lr's warmup and cosine, float16 on the CPU: the scaler
# disabled), its checkpoint without the RNG ("no"), with torch.get_rng_state() taken on the
# line that saves ("at_save") and before the prefetch ("before_batch");
# tests/test_audit_nanogpt_resume.py measures them again
MEASURED = {"no": (0.0649, 10), "at_save": (0.0627, 10), "before_batch": (0.0, 0)}
FIX = ("keep rng = torch.get_rng_state() just before each X, Y = get_batch('train'), save it "
       "in the checkpoint, and torch.set_rng_state it after loading, before the first "
       "get_batch (measured exact)")


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
    if device and "cuda" not in device:  # train.py's own test of its device_type
        set_row("scaler", f"device {device!r}: train.py's device_type is 'cpu', which never "
                          "autocasts, and its GradScaler disables itself without CUDA",
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
    train_py = "best_val_loss" in top and "eval_interval" in config
    if train_py and audit.unknown is not None and audit.refused is None:
        at_save, before = MEASURED["at_save"], MEASURED["before_batch"]
        audit.unknown = (
            "train.py draws the batch its next step trains on before the eval that writes "
            "the checkpoint, and a resume draws it again: the torch RNG saved here resumes "
            "it only if taken just before that draw, which the file cannot show, nor that "
            "the batches come from get_batch (measured on examples/nanogpt_train.py: taken "
            f"on the line that saves, max |Δw| {at_save[0]:g}, {at_save[1]} tensors "
            f"differing; before the draw, exact: {before[1]} differing). Fix: {FIX}")
    audit.flags = [f for f in audit.flags if not f.startswith("nanoGPT-style")]
    missing = [i for i in ("scaler", "torch CPU RNG", "data position")
               if audit.row(i).status == MISSING]
    if missing:
        cost = MEASURED["no"]
        audit.flags.append(f"nanoGPT-style checkpoint (model, optimizer, model_args, "
                           f"iter_num): no {', '.join(missing)}; its resume is not exact (its "
                           "lr is get_lr(iter_num): no scheduler is needed)"
                           + (f"; measured on examples/nanogpt_train.py without the RNG: max "
                              f"|Δw| {cost[0]:g}, {cost[1]} tensors differing. Fix: {FIX}"
                              if train_py else ""))
    return audit
