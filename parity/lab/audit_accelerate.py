"""Accelerate's `save_state` folder, read as what `Accelerator.load_state` restores
(accelerate 1.x, checkpointing.py), nothing run:

    file                        piece                              read with
    model.safetensors           weights (model_<i>.safetensors;    its header
                                pytorch_model.bin unsafe off)      (weights_only=True)
    optimizer.bin, _<i>         optimizer                          weights_only=True
    scheduler.bin, _<i>         LR scheduler                       weights_only=True
    scaler.pt                   GradScaler (fp16)                  weights_only=True
    random_states_<p>.pkl       a torch.save dict: python, numpy,  weights_only=True, numpy's
                                torch (cpu, cuda) RNG, and "step"  array globals allowed
    custom_checkpoint_<i>.pkl   a state_dict of each object given  weights_only=True
                                to register_for_checkpointing
    sampler.bin                 a seedable sampler over an         weights_only=True
                                IterableDatasetShard
    dl_state_dict.bin           a StatefulDataLoader's state       weights_only=True
                                (use_stateful_dataloader=True)

The "step" in random_states_<p>.pkl is NOT the global step: it is `Accelerator.step`, the
gradient-accumulation counter (`_do_sync`: reset to 0 at the end of the dataloader, else
+1), which load_state puts back. Accelerate keeps no global step, epoch or data position:
the user's loop does, and saves them only by registering an object with
`accelerator.register_for_checkpointing(obj)` (obj.state_dict() goes to
custom_checkpoint_<i>.pkl), or by naming the folder as Accelerate's examples do
("step_<n>", "epoch_<n>": the loop parses the name on resume).

The data position: a loop resumed mid-epoch calls `accelerator.skip_first_batches(dl, n)`,
which starts a NEW pass over the DataLoader: a shuffling sampler draws a new order (from the
torch generator load_state restored, not the one the straight run drew the epoch's order
from), so the skipped batches are not the ones trained on. Measured (MEASURED, held by
tests/test_audit_accelerate_resume.py): exact at an epoch's end, not mid-epoch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from parity.lab.audit_files import safetensors_header, torch_file
from parity.lab.audit_recognize import (
    MISSING,
    PRESENT,
    STEP_KEYS,
    Audit,
    Row,
    is_tensor,
    recognize,
)

KIND = "Accelerate save_state folder"
MARKERS = re.compile(r"optimizer(_\d+)?\.bin|scheduler(_\d+)?\.bin|sampler(_\d+)?\.bin"
                     r"|random_states_\d+\.pkl|custom_checkpoint_\d+\.pkl"
                     r"|dl_state_dict(_\d+)?\.bin")
WEIGHTS = re.compile(r"(model|pytorch_model)(_\d+)?\.(safetensors|bin)")
RNG = re.compile(r"random_states_\d+\.pkl")
CUSTOM = re.compile(r"custom_checkpoint_\d+\.pkl")
NAMED = re.compile(r"(step|epoch)_(\d+)")  # Accelerate's examples' folder names
# an int the user's registered state may hold: batches done in the current epoch
IN_EPOCH = ("step_in_epoch", "batch_in_epoch", "batches_done", "batch_idx", "position")
# max |Δw| after the resume against a straight run, tensors differing (of 4): an MLP with
# dropout 0.2, AdamW, cosine lr, DataLoader(shuffle=True) of 6 batches an epoch, 3 epochs;
# "mid-epoch": saved after 4 batches, resumed by load_state + skip_first_batches(dl, 4);
# "boundary": saved at epoch 0's end; "no step": the same folder, the loop not knowing its
# step (none registered) and so starting over at epoch 0
MEASURED = {"mid-epoch": (0.0241, 4), "boundary": (0.0, 0), "no step": (0.00237, 4)}
FIX = ("save_state at epoch ends only (measured exact), with the global step registered "
       "(accelerator.register_for_checkpointing of an object whose state_dict() holds "
       "global_step, epoch and step_in_epoch)")


def is_accelerate_folder(names: list[str]) -> bool:
    return any(MARKERS.fullmatch(n) for n in names)


def audit_accelerate(path: Path) -> Audit:
    """The Audit of a save_state folder `path` (the table above)."""
    from parity.lab.your_trainer.audit import NUMPY_ARRAY

    tree: dict[str, Any] = {}
    for p in sorted(path.iterdir()):
        if not p.is_file() or p.is_symlink():
            continue
        if WEIGHTS.fullmatch(p.name) and p.suffix == ".safetensors":
            tree[p.name] = safetensors_header(p)
        elif RNG.fullmatch(p.name):
            tree[p.name] = torch_file(p, NUMPY_ARRAY)
        elif WEIGHTS.fullmatch(p.name) or MARKERS.fullmatch(p.name) or p.name == "scaler.pt":
            tree[p.name] = torch_file(p)
    audit = recognize(tree, KIND)
    audit.flags[:] = [f for f in audit.flags if not f.startswith("legacy np.random")]
    custom = {n: v for n, v in tree.items() if CUSTOM.fullmatch(n) and isinstance(v, dict)}
    named = NAMED.fullmatch(path.name)
    _step(audit, tree, custom, named)
    _position(audit, tree, custom, named)
    return audit


def _set(audit: Audit, item: str, status: str, where: str, detail: str,
         need: str | None = None) -> None:
    i = next(n for n, r in enumerate(audit.rows) if r.item == item)
    audit.rows[i] = Row(item, status, where, detail, audit.rows[i].need if need is None
                        else need)


def _int(v: Any) -> int | None:
    """An int, or a one-element integer tensor's value; else None."""
    if is_tensor(v) and v.numel() == 1 and not v.is_floating_point():
        return int(v.item())
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _registered(custom: dict[str, dict[str, Any]], keys: tuple[str, ...]
                ) -> tuple[str, int] | None:
    """(where, value) of the first int under one of `keys` in a registered state."""
    for name, state in custom.items():
        for key in keys:
            if key in state and _int(state[key]) is not None:
                return f"{name}/{key}", _int(state[key])
    return None


def _step(audit: Audit, tree: dict[str, Any], custom: dict[str, dict[str, Any]],
          named: re.Match[str] | None) -> None:
    """The global step and epoch: registered, or in the folder's name; never the pickled
    accumulation counter."""
    counters = [f"{n}'s 'step' = {v['step']}" for n, v in tree.items()
                if RNG.fullmatch(n) and isinstance(v, dict) and "step" in v]
    step = _registered(custom, STEP_KEYS)
    if step:
        _set(audit, "global step", PRESENT, step[0], f"{step[1]} (registered for "
                                                      "checkpointing)")
    elif named and named.group(1) == "step":
        _set(audit, "global step", PRESENT, "the folder's name", f"{named.group(2)}, from "
             f"{named.group(0)} (the loop must parse it on resume, as Accelerate's "
             "examples do)")
    else:
        _set(audit, "global step", MISSING, "", (
            f"{', '.join(counters)} is Accelerate's gradient-accumulation counter "
            "(Accelerator.step), not the global step; " if counters else "")
            + "none registered (accelerator.register_for_checkpointing)")
    epoch = _registered(custom, ("epoch",))
    if epoch:
        _set(audit, "epoch", PRESENT, epoch[0], str(epoch[1]))
    elif named and named.group(1) == "epoch":
        _set(audit, "epoch", PRESENT, "the folder's name", f"{named.group(2)}, from "
             f"{named.group(0)} (saved at that epoch's end)")
    elif audit.row("global step").status == PRESENT:
        _set(audit, "epoch", MISSING, "", "the loop derives it as global step // batches "
             "an epoch, as Accelerate's examples do", "if not derived from the global step")


def _position(audit: Audit, tree: dict[str, Any], custom: dict[str, dict[str, Any]],
              named: re.Match[str] | None) -> None:
    """Where in the epoch the folder was saved, and so whether the resume is exact."""
    stateful = sorted(n for n in tree if n.startswith(("dl_state_dict", "sampler")))
    at = _registered(custom, IN_EPOCH)
    mid, boundary = MEASURED["mid-epoch"], MEASURED["boundary"]
    if stateful:
        _set(audit, "data position", PRESENT, ", ".join(stateful), "the loader's own state")
        audit.unknown = (f"{', '.join(stateful)}: a loader's saved state, which this audit "
                         "has not held to a resume; unknown")
    elif (at and at[1] == 0) or (named and named.group(1) == "epoch"):
        where = at[0] if at else "the folder's name"
        _set(audit, "data position", PRESENT, where,
             "at an epoch's end: the resumed loop starts the next epoch, whose order the "
             "DataLoader draws from the torch generator load_state restores (measured: max "
             f"|Δw| {boundary[0]:g})")
    else:
        seen = (f"{at[1]} batches into the epoch ({at[0]})" if at
                else "where in the epoch it was saved cannot be seen (no registered "
                     "step_in_epoch, no epoch_<n> name)")
        _set(audit, "data position", MISSING, at[0] if at else "", seen,
             "if saved mid-epoch")
        if audit.row("global step").status == PRESENT:
            audit.unknown = (
                f"Accelerate saves no data position; {seen}. Mid-epoch, the resumed loop's "
                "skip_first_batches(dl, n) starts a new pass whose shuffled order is not the "
                f"straight run's (measured: max |Δw| {mid[0]:g}, {mid[1]} tensors "
                f"differing). Fix: {FIX}")
