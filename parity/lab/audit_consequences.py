"""What resuming without each checkpoint entry does, measured on the project's own model:
the audit's "consequence" column. Measured once and committed (docs/data/
audit_consequences.json), so `python -m parity audit` trains nothing.

    python -m parity.lab.audit_consequences    rewrites docs/data/audit_consequences.json

The case is the resume inventory's (parity/drivers/train.py's INVENTORY_CASE: fp16 with
overflow-skipped steps, dropout 0.2, cosine lr, 5-batch epochs) on the torch tree, with the
checkpoint at step K = 7 (mid-epoch, so the position and the epoch are two things) and the
runs compared at TOTAL = 14. Each entry is resumed without, by the inventory's own
mechanism (parity.drivers.train.resumed_without): left out (it stays as a fresh run has it)
or, for the parts of an entry, reset in the loaded state (a scaler state whose
`_growth_tracker` was filled with 0, per-parameter steps filled with 0, the epoch 0):

    max_dparam   max |param - param of the uninterrupted run| at TOTAL (0: exact)
    data_order   the batches after the resume, against the uninterrupted run's: "same",
                 "repeats" (a batch already trained on before the checkpoint comes again)
                 or "differs"
"""

from __future__ import annotations

import hashlib
import json
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# the drivers (and torch) are imported by the functions that train: the audit only reads

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "data" / "audit_consequences.json"
K, TOTAL = 7, 14
CASE_TEXT = ("the project's MLP on the torch tree, fp16 with overflow-skipped steps, dropout "
             "0.2, cosine lr over 20 steps, 5-batch epochs; checkpoint at step 7, compared "
             "at step 14")
Change = Callable[[dict[str, Any]], dict[str, Any]]


def _reset_steps(state: dict[str, Any]) -> dict[str, Any]:
    opt = state["optimizer"]
    per = {i: {**s, "step": s["step"] * 0} for i, s in opt["state"].items()}
    return {**state, "optimizer": {**opt, "state": per}}


def _zero_tracker(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "scaler": {**state["scaler"], "_growth_tracker": 0}}


def _epoch_zero(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "data": {**state["data"], "epoch": 0}}


# entry -> (inventory items left out, change to the loaded state, what resume without it does)
VARIANTS: dict[str, tuple[tuple[str, ...], Change | None, str]] = {
    "none": ((), None, "nothing left out: the control, exact"),
    "model": (("model",), None, "training restarts from the initial weights"),
    "optimizer": (("optimizer",), None, "AdamW's moments restart at zero, its bias correction "
                  "at step 1, the groups' lr at the initial value"),
    "optimizer step counts": ((), _reset_steps, "bias correction restarts as at step 1 "
                              "(torch's Adam raises KeyError without a 'step')"),
    "scheduler": (("scheduler",), None, "the lr schedule restarts from its first value"),
    "scaler": (("scaler",), None, "the loss scale restarts at init_scale: other steps "
               "overflow and are skipped"),
    "scaler growth tracker": ((), _zero_tracker, "the scale grows later than it would have "
                              "(GradScaler.load_state_dict raises KeyError without it)"),
    "torch CPU RNG": (("rng",), None, "dropout masks restart from the seed: other masks"),
    "data position": (("data",), None, "the sampler restarts at epoch 0, batch 0"),
    "epoch": ((), _epoch_zero, "the sampler replays epoch 0's order from the saved position"),
    "global step": (("step",), None, "the step counter restarts at 0: the run takes the "
                    "steps it already took again, and ends later"),
    "nanoGPT-style": (("scaler", "rng", "data"), None, "model, optimizer and step only "
                      "(the lr recomputed from the step): no scaler, RNG or data position"),
}
# the audit's rows -> the entry measured for it (None: the project's model does not use it)
MEASURED_FOR: dict[str, str | None] = {
    "model": "model", "optimizer": "optimizer", "optimizer step counts": "optimizer step counts",
    "scheduler": "scheduler", "scaler": "scaler", "torch CPU RNG": "torch CPU RNG",
    "CUDA RNG": None, "numpy RNG": None, "Python random": None,
    "data position": "data position", "epoch": "epoch", "global step": "global step"}
NOT_MEASURED = "not measured: the project's model draws only from its torch CPU generator"


def _key(batch: Any) -> str:
    """A batch's identity: the SHA-256 of its inputs' and targets' bytes."""
    from parity.compare import as_numpy

    h = hashlib.sha256()
    for part in batch:
        h.update(np.ascontiguousarray(as_numpy(part)).tobytes())
    return h.hexdigest()


def straight(name: str = "torch") -> tuple[dict[str, Any], list[str]]:
    """The uninterrupted run of TOTAL steps: its final state and every step's batch."""
    from parity.drivers.train import INVENTORY_CASE, impl

    m = impl(name)
    run = m.Run(m.TrainConfig(**INVENTORY_CASE))
    seen = []
    while run.step < TOTAL:
        run.train_step()
        seen.append(_key(run.last_batch))
    return run.state_dict(), seen


def data_order(after: list[str], seen: list[str]) -> str:
    """"same", "repeats" or "differs": the batches `after` a resume at K against the
    uninterrupted run's `seen` (TOTAL of them)."""
    if after[:TOTAL - K] == seen[K:]:
        return "same"
    return "repeats" if set(after) & set(seen[:K]) else "differs"


def measure(entry: str, expected: tuple[dict[str, Any], list[str]] | None = None,
            name: str = "torch") -> dict[str, Any]:
    """{"max_dparam", "data_order"} of resuming without `entry` (a VARIANTS key);
    `expected` is straight(name), computed when not given."""
    from parity.drivers.train import (
        INVENTORY_CASE,
        max_param_difference,
        one_thread,
        resumed_without,
    )

    omit, change, _ = VARIANTS[entry]
    with one_thread():
        final, seen = straight(name) if expected is None else expected
        batches: list[Any] = []
        with tempfile.TemporaryDirectory() as tmp:
            actual = resumed_without(name, INVENTORY_CASE, K, TOTAL, Path(tmp), omit,
                                     change=change, batches=batches)
    return {"max_dparam": max_param_difference(actual, final),
            "data_order": data_order([_key(b) for b in batches], seen)}


def write_consequences(path: Path = DATA) -> dict[str, Any]:
    """Measure every VARIANTS entry and write the JSON the audit reads."""
    import torch

    from parity.drivers.train import one_thread

    with one_thread():
        expected = straight()
    data = {"case": CASE_TEXT, "k": K, "total": TOTAL, "torch": torch.__version__,
            "numpy": np.__version__, "machine": platform.machine(),
            "entries": {e: measure(e, expected) for e in VARIANTS}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return data


def load(path: Path = DATA) -> dict[str, Any]:
    """The committed measurements."""
    return json.loads(path.read_text(encoding="utf-8"))


if __name__ == "__main__":
    print(json.dumps(write_consequences(), indent=1))
