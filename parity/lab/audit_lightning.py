"""A Lightning `.ckpt` read as what `Trainer.fit(ckpt_path=...)` restores (lightning 2.6).

audit_recognize.py finds the model ("state_dict"), the optimizers ("optimizer_states"), the
schedulers ("lr_schedulers"), the precision plugin's scaler, "epoch" and "global_step" by
their structure. Lightning saves no RNG: the user adds it, the usual way being the
LightningModule's hooks,

    def on_save_checkpoint(self, checkpoint):
        checkpoint["torch_rng_state"] = torch.get_rng_state()
    def on_load_checkpoint(self, checkpoint):
        torch.set_rng_state(checkpoint["torch_rng_state"])

(a 5056-byte uint8 tensor: the torch CPU RNG row). What the rules cannot see is the data
position. Lightning restores its loop counters ("loops"/"fit_loop": the epoch's progress,
the batches done in it), but the batches come from the user's DataLoader, and a plain
DataLoader is not resumable: on resume it starts its epoch over (Lightning warns "your
dataloader is not resumable"). A loader with `state_dict`/`load_state_dict` (torchdata's
StatefulDataLoader) has its state saved under fit_loop's "state_dict"/"combined_loader".

Where in the epoch the file was written, from fit_loop's "epoch_progress" totals (the same
tests Lightning's `_FitLoop.update_restart_stage` makes):

    saved                       epoch_progress.total             the resume
    at an epoch's end           processed == started,            starts the next epoch: its
    (on_train_epoch_end)        completed == processed - 1       order is drawn afresh
    after the epoch's last      processed == started - 1,        the same (Lightning treats
    batch (on_train_batch_end)  batch_progress.is_last_batch     it as the epoch's end)
    mid-epoch                   processed == started - 1         restarts the loader's epoch,
                                                                 or a stateful loader's state

At an epoch boundary the data position is the epoch itself: the next epoch's order is drawn
from the DataLoader's generator, which is the torch CPU generator (restored by the hooks:
exact) only if the DataLoader was given no generator= of its own. Lightning does not reseed
one it was given (measured: DataLoader(shuffle=True, generator=g) resumes on the order g
drew first), and no key says which loader the run had: such a file is "unknown", exact only
where it holds a generator state besides the torch CPU generator's (a Callback whose
state_dict() returns g.get_state(), saved under "callbacks", as FIX says: measured exact).
Mid-epoch the verdict is "unknown", never "exact": with no loader state, a plain DataLoader
restarts its epoch. With a loader's state saved (a StatefulDataLoader) it is "unknown" at an
epoch boundary too: the restored loader no longer draws from the torch CPU generator as the
straight run's did, so a model that draws from it too (dropout) resumes on other masks (so
too, measured once, with the loader given a generator of its own).
MEASURED holds what tests/test_audit_lightning_resume.py measures for each (it asserts
these numbers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parity.lab.audit_recognize import MISSING, PRESENT, Audit, Row

KIND = "Lightning checkpoint"
# max |Δw| of the resumed run's weights against a straight run's, and the tensors differing
# (of 4): a tiny MLP with dropout 0.2, AdamW, cosine lr, DataLoader(shuffle=True) of 6
# batches an epoch, 3 epochs, RNG saved by the hooks above; "plain" and "stateful" (torchdata's
# StatefulDataLoader): checkpoint after 4 batches; "boundary" (a plain DataLoader) and
# "stateful boundary": at epoch 0's end; "boundary generator" and "last batch generator":
# DataLoader(shuffle=True, generator=g), at epoch 0's end and after epoch 1's last batch;
# "boundary registered generator": that loader with g's state saved by a Callback (FIX), both
# files (0 each)
MEASURED = {"plain": (0.0375, 4), "stateful": (0.0152, 4), "boundary": (0.0, 0),
            "stateful boundary": (0.0184, 4), "boundary generator": (0.0219, 4),
            "last batch generator": (0.00204, 4), "boundary registered generator": (0.0, 0)}
GENERATOR_BYTES = 5056  # a torch.Generator's get_state(): audit_recognize.TORCH_CPU_RNG_BYTES
FIX = ("a shuffling DataLoader given a generator whose state the checkpoint holds "
       "(DataLoader(data, shuffle=True, generator=g) and a Callback whose state_dict() returns "
       "{'generator': g.get_state()} and whose load_state_dict(s) calls "
       "g.set_state(s['generator'])), and checkpoints at epoch ends only "
       "(ModelCheckpoint(every_n_epochs=1, save_on_train_epoch_end=True)): measured exact; "
       "torchdata's StatefulDataLoader saves the loader's position (Lightning keeps its "
       "state_dict) but, with dropout, not the masks")


def _get(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def generator_states(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """(key path, state) of each torch generator state in the file: a uint8 tensor of
    GENERATOR_BYTES (the torch CPU generator's, or a generator of the loop's own)."""
    if isinstance(value, Mapping):
        return [hit for k, v in value.items()
                for hit in generator_states(v, f"{path}/{k}" if path else str(k))]
    if isinstance(value, list | tuple):
        return [hit for i, v in enumerate(value) for hit in generator_states(v, f"{path}/{i}")]
    shape = getattr(value, "shape", None)
    if str(getattr(value, "dtype", "")).removeprefix("torch.") == "uint8" and shape is not None \
            and tuple(shape) == (GENERATOR_BYTES,):
        return [(path, value)]
    return []


def _distinct(states: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """`states` less those equal to one before them (the same generator saved twice)."""
    kept: list[tuple[str, Any]] = []
    for path, v in states:
        if not any(bool((v == w).all()) for _, w in kept):
            kept.append((path, v))
    return kept


def where_in_epoch(top: Mapping[str, Any]) -> tuple[str, int | None]:
    """("boundary" | "mid-epoch" | "unknown", batches done in the epoch) from the fit loop's
    progress counters (the table above)."""
    fit = _get(top, "loops", "fit_loop")
    total = _get(fit, "epoch_progress", "total")
    batches = _get(fit, "epoch_loop.batch_progress")
    if not isinstance(total, Mapping) or not isinstance(batches, Mapping):
        return "unknown", None
    try:
        started, processed, completed = (int(total[k]) for k in ("started", "processed",
                                                                    "completed"))
        done = int(batches["current"]["processed"])
    except (KeyError, TypeError, ValueError):
        return "unknown", None
    if processed == started and completed in (processed, processed - 1):
        return "boundary", done
    if processed == started - 1 and batches.get("is_last_batch") is True:
        return "boundary", done  # saved in the last batch's on_train_batch_end
    return "mid-epoch", done


def adjust(audit: Audit, top: Mapping[str, Any]) -> Audit:
    """`audit` with the data position read as the table above says, and the verdict unknown
    mid-epoch."""
    i = next(n for n, r in enumerate(audit.rows) if r.item == "data position")
    stage, done = where_in_epoch(top)
    epoch = top.get("epoch")
    loader = _get(top, "loops", "fit_loop", "state_dict", "combined_loader")
    where = "loops/fit_loop/epoch_progress"
    if stage == "unknown":
        audit.rows[i] = Row("data position", MISSING, "", "no fit loop progress to read")
        return audit
    if loader:
        at = (f"at the end of epoch {epoch}" if stage == "boundary"
              else f"{done} batches into epoch {epoch}")
        audit.rows[i] = Row("data position", PRESENT, "loops/fit_loop/state_dict/"
                            "combined_loader", f"a stateful loader's state, {at}")
        cost = MEASURED["stateful boundary" if stage == "boundary" else "stateful"]
        audit.unknown = (
            f"saved {at} with a stateful loader's state: on resume the restored loader does "
            "not draw from the torch CPU generator as the straight run's did, so a model "
            f"drawing from it (dropout) gets other masks (measured: max |Δw| {cost[0]:g}, "
            f"{cost[1]} tensors differing); exact only if nothing else draws from it. "
            f"Fix: {FIX}")
        return audit
    if stage == "boundary":
        states = _distinct(generator_states(top))
        saved, own = MEASURED["boundary registered generator"], MEASURED["boundary generator"]
        last, plain = MEASURED["last batch generator"], MEASURED["boundary"]
        if len(states) > 1:
            audit.rows[i] = Row("data position", PRESENT, where, (
                f"saved at the end of epoch {epoch}, with {len(states)} generator states "
                f"({', '.join(p for p, _ in states)}): the torch CPU generator's and one of the "
                "loop's own besides; the resume starts the next epoch, whose order the "
                "DataLoader draws from its generator= (measured, saved by a Callback: max "
                f"|Δw| {saved[0]:g}), or without one from the torch CPU generator (measured: "
                f"max |Δw| {plain[0]:g})"))
            return audit
        audit.rows[i] = Row("data position", PRESENT, where,
                            f"saved at the end of epoch {epoch}: the resume starts the next "
                            "epoch, whose order a shuffling DataLoader draws from its "
                            "generator")
        audit.unknown = (
            f"saved at the end of epoch {epoch}: the next epoch's order comes from the "
            "DataLoader's generator, the torch CPU generator if it has no generator= of its "
            f"own (measured: max |Δw| {plain[0]:g}), else its own, which Lightning does not "
            "reseed and no key holds (DataLoader(shuffle=True, generator=g) measured: max "
            f"|Δw| {own[0]:g}, {own[1]} tensors differing at an epoch's end, {last[0]:g}, "
            f"{last[1]} after its last batch). Fix: {FIX}")
        return audit
    audit.rows[i] = Row("data position", MISSING, "loops/fit_loop",
                        f"Lightning's counters say {done} batches into epoch {epoch}, but no "
                        "loader state was saved (no fit_loop combined_loader)",
                        "if the DataLoader is not resumable (a plain one is not)")
    cost = MEASURED["plain"]
    audit.unknown = (
        f"saved {done} batches into epoch {epoch}: the loader's position cannot be seen. "
        "Lightning restores its loop counters, but a plain DataLoader restarts its epoch "
        "(Lightning warns 'your dataloader is not resumable'; measured after a mid-epoch "
        f"resume: max |Δw| {cost[0]:g}, {cost[1]} tensors differing). Fix: {FIX}")
    return audit
