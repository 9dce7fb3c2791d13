"""Hugging Face Trainer's `checkpoint-<step>/` folder, read as what it is: the files
`Trainer._save_checkpoint` writes, each read without running its pickle, and what
`trainer.train(resume_from_checkpoint=...)` does with each (transformers 5.x, trainer.py).

    file                       piece                               read with
    model.safetensors          weights (or model-<i>-of-<n>.       its header: names, dtypes,
                               safetensors shards; PEFT's          shapes
                               adapter_model.safetensors)
    pytorch_model.bin          weights (safetensors off)           weights_only=True
    optimizer.pt               optimizer moments, per-param step   weights_only=True
    scheduler.pt               LR scheduler                        weights_only=True
    scaler.pt                  GradScaler (fp16 only)              weights_only=True
    rng_state.pth              RNG: python, numpy, cpu, cuda       weights_only=True, allowlist
    rng_state_<r>.pth          the same, one per process             NUMPY_ARRAY (see below)
    trainer_state.json         global_step, epoch                  json
    training_args.bin          the run's TrainingArguments          read_inert (see below)

Two side files are pickles of more than tensors. rng_state.pth holds np.random.get_state(),
a tuple around a uint32 ndarray: it is loaded with `torch.load(weights_only=True)` inside
`torch.serialization.safe_globals` widened by the four numpy globals an array needs and no
more (parity.lab.your_trainer.audit.NUMPY_ARRAY, the list Trainer loads it with).
training_args.bin is a pickled dataclass: it is read by a restricted unpickler
(parity.lab.audit_pickle.read_inert) that imports nothing, turning each global named under
transformers, accelerate or torch.device into an inert record and refusing any other;
a file it refuses (a payload naming os.system) is reported unreadable, and nothing runs.

What the resume does with each piece, and so what the audit requires:
- the weights are loaded; optimizer.pt and scheduler.pt are loaded only when both are there
  (`_load_optimizer_and_scheduler`): without one, the other is not loaded either;
- scaler.pt is loaded when there (fp16 only); the RNG states are restored when the file
  is there (python, numpy, cpu, and cuda where saved; a missing file is one log line);
- trainer_state.json is required (FileNotFoundError without it). From its global_step the
  resume takes epochs_trained = global_step // steps_per_epoch and skips the first
  global_step % steps_per_epoch update steps' batches of that epoch (times
  gradient_accumulation_steps), unless ignore_data_skip. For Trainer's own sampler over a
  map-style dataset that is exact when the RNG is restored: the epoch's order is drawn again
  from the restored torch generator;
- training_args.bin is not read by the resume (the resuming run's own arguments are). The
  audit reads it for how the run was set up (fp16: the scaler is required; ignore_data_skip:
  the consumed batches come again). Without it that cannot be known, and the verdict is
  "unknown", never "exact".
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any

from parity.lab.audit_files import safetensors_header, torch_file
from parity.lab.audit_pickle import Inert, pickle_of, read_inert
from parity.lab.audit_recognize import (
    DISABLED,
    INCOMPLETE,
    MISSING,
    NOT_NEEDED,
    PRESENT,
    REQUIRED,
    UNSAFE,
    Audit,
    AuditInputError,
    Row,
    Unloadable,
    recognize,
)

KIND = "Hugging Face Trainer checkpoint"
RNG_FILE = re.compile(r"rng_state(?:_(\d+))?\.pth")
WEIGHTS = re.compile(r"(model|pytorch_model|adapter_model)(-\d+-of-\d+)?\.(safetensors|bin)")
MARKERS = ("trainer_state.json", "training_args.bin", "optimizer.pt", "scheduler.pt")
# what a Trainer folder written by DeepSpeed or FSDP holds instead of optimizer.pt
SHARDED = re.compile(r"global_step\d+|pytorch_model_fsdp_\d+|optimizer_\d+")
ARGS_GLOBALS = ("transformers.", "accelerate.", "torch.device")
ARGS_READ = ("fp16", "bf16", "ignore_data_skip", "gradient_accumulation_steps", "use_cpu",
             "seed")
MAX_JSON = 16 << 20  # trainer_state.json grows with its log history; a bigger one is not read
RNG_ITEMS = ("torch CPU RNG", "numpy RNG", "Python random")


def is_trainer_folder(names: list[str]) -> bool:
    """Whether a folder holding `names` is laid out as Trainer's checkpoint-<step>/."""
    return any(n in MARKERS or RNG_FILE.fullmatch(n) for n in names)


def training_args(path: Path) -> dict[str, Any]:
    """The fields of a pickled TrainingArguments that the audit reads, by read_inert;
    pickle.UnpicklingError when it holds anything else (nothing of it runs)."""
    value = read_inert(pickle_of(path), ARGS_GLOBALS)
    if not (isinstance(value, Inert) and value.name.endswith(".TrainingArguments")
            and isinstance(value.state, dict)):
        raise pickle.UnpicklingError("it is not a pickled TrainingArguments")
    return {k: value.state[k] for k in ARGS_READ if k in value.state}


def audit_trainer(path: Path) -> Audit:
    """The Audit of Trainer's checkpoint-<step>/ folder `path` (the table above)."""
    from parity.lab.your_trainer.audit import NUMPY_ARRAY

    names = sorted(p.name for p in path.iterdir())
    sharded = [n for n in names if SHARDED.fullmatch(n)]
    if sharded:
        raise AuditInputError(f"{path}: a Trainer checkpoint saved by DeepSpeed or FSDP "
                              f"({sharded[0]}); not supported (audit reads Trainer's "
                              "single-file layout)")
    tree: dict[str, Any] = {}
    rng_ranks: list[int] = []
    for name in names:
        p = path / name
        if not p.is_file() or p.is_symlink():
            continue
        rng = RNG_FILE.fullmatch(name)
        if WEIGHTS.fullmatch(name) and name.endswith(".safetensors"):
            tree[name] = safetensors_header(p)
        elif WEIGHTS.fullmatch(name) or name in ("optimizer.pt", "scheduler.pt", "scaler.pt"):
            tree[name] = torch_file(p)
        elif rng:
            tree[name] = torch_file(p, NUMPY_ARRAY)
            rng_ranks.append(int(rng.group(1) or 0))
    audit = recognize(tree, KIND)
    audit.flags[:] = [f for f in audit.flags if not f.startswith("legacy np.random")]
    _rng(audit, tree, rng_ranks)
    args = _args(audit, path / "training_args.bin")
    _pairs(audit, tree)
    _scaler(audit, args)
    _position(audit, path / "trainer_state.json", args)
    return audit


def _set(audit: Audit, item: str, status: str, where: str, detail: str,
         need: str | None = None) -> None:
    i = next(n for n, r in enumerate(audit.rows) if r.item == item)
    audit.rows[i] = Row(item, status, where, detail, audit.rows[i].need if need is None
                        else need)


def _rng(audit: Audit, tree: dict[str, Any], ranks: list[int]) -> None:
    files = [n for n in tree if RNG_FILE.fullmatch(n)]
    for name in files:
        if isinstance(tree[name], Unloadable):
            for item in RNG_ITEMS:
                _set(audit, item, UNSAFE, name, f"unreadable: {tree[name].reason}")
            audit.flags[:] = [f for f in audit.flags if not f.startswith(f"{name}: not loaded")]
            audit.flags.append(f"{name}: unreadable: {tree[name].reason}; nothing in it was run")
    gaps = sorted(set(range(max(ranks) + 1)) - set(ranks)) if ranks else []
    if gaps:
        _set(audit, "torch CPU RNG", INCOMPLETE, ", ".join(files),
             f"{len(ranks)} processes' files, rng_state_{gaps[0]}.pth missing")
    elif files and audit.row("torch CPU RNG").status == PRESENT:
        audit.flags.append(f"{', '.join(files)}: read with weights_only=True and numpy's array "
                           "globals allowed, as Trainer loads it: python, numpy "
                           "(np.random.get_state()), cpu" + (
                               ", cuda" if audit.row("CUDA RNG").status == PRESENT else ""))


def _args(audit: Audit, path: Path) -> dict[str, Any] | None:
    """training_args.bin's fields, or None with the verdict made unknown saying why."""
    why = "the run's fp16 and ignore_data_skip cannot be read, so the scaler's need and the " \
          "data skip on resume cannot be verified"
    if not path.is_file():
        audit.unknown = f"training_args.bin missing: {why}"
        return None
    try:
        args = training_args(path)
    except pickle.UnpicklingError as e:
        audit.unknown = f"training_args.bin unreadable: {why}"
        audit.flags.append(f"training_args.bin: unreadable: {e}; nothing in it was run")
        return None
    audit.flags.append("training_args.bin: read without running it: "
                       + ", ".join(f"{k}={v}" for k, v in args.items()))
    if args.get("use_cpu") and audit.row("CUDA RNG").status == MISSING:
        _set(audit, "CUDA RNG", NOT_NEEDED, "training_args.bin", "use_cpu=True")
    return args


def _pairs(audit: Audit, tree: dict[str, Any]) -> None:
    """optimizer.pt and scheduler.pt: Trainer loads neither without the other."""
    has = {n: n in tree for n in ("optimizer.pt", "scheduler.pt")}
    if has["optimizer.pt"] != has["scheduler.pt"]:
        there, gone = ("optimizer.pt", "scheduler.pt") if has["optimizer.pt"] else (
            "scheduler.pt", "optimizer.pt")
        item = "optimizer" if there == "optimizer.pt" else "scheduler"
        _set(audit, item, INCOMPLETE, there, f"not loaded: Trainer loads {there} only "
                                             f"together with {gone}")
        audit.flags.append(f"{gone} missing: Trainer's resume then loads neither it nor "
                           f"{there} (_load_optimizer_and_scheduler)")


def _scaler(audit: Audit, args: dict[str, Any] | None) -> None:
    if args is None or "fp16" not in args:
        return
    row = audit.row("scaler")
    if args["fp16"]:
        _set(audit, "scaler", row.status, row.where, row.detail or "fp16=True", REQUIRED)
    elif row.status in (MISSING, DISABLED):
        _set(audit, "scaler", NOT_NEEDED, "training_args.bin",
             f"fp16=False{', bf16=True' if args.get('bf16') else ''}: no GradScaler")


def _position(audit: Audit, path: Path, args: dict[str, Any] | None) -> None:
    """global step, epoch and data position from trainer_state.json, as the resume uses
    them (the skip of the consumed batches)."""
    if not path.is_file():
        for item in ("global step", "epoch", "data position"):
            _set(audit, item, MISSING, "", "no trainer_state.json")
        audit.flags.append("trainer_state.json missing: Trainer's resume raises "
                           "FileNotFoundError without it")
        audit.refused = ("a half-written Trainer checkpoint: no trainer_state.json, which "
                         "Trainer._save_checkpoint writes last (after the weights, optimizer, "
                         "scheduler and RNG): a save that did not finish (a crash mid-save)")
        return
    try:
        if path.stat().st_size > MAX_JSON:
            raise ValueError(f"over {MAX_JSON >> 20} MB")
        state = json.loads(path.read_bytes())
        step, epoch = int(state["global_step"]), float(state["epoch"] or 0)
    except (ValueError, KeyError, TypeError) as e:
        raise AuditInputError(f"{path}: not Trainer's state ({type(e).__name__}: {e})"
                              ) from None
    where = "trainer_state.json"
    _set(audit, "global step", PRESENT, where, f"global_step = {step}")
    if epoch <= 0 or step <= 0:
        _set(audit, "epoch", PRESENT, where, f"{epoch:g}")
        _set(audit, "data position", PRESENT, where, "no step taken: nothing to skip")
        return
    per_epoch = max(1, round(step / epoch))  # epoch = step / per_epoch, as Trainer counts
    done, skip = divmod(step, per_epoch)
    accumulate = int((args or {}).get("gradient_accumulation_steps", 1))
    _set(audit, "epoch", PRESENT, where,
         f"{epoch:.4g}: epoch {done}, {skip} of its {per_epoch} update steps taken")
    if args is not None and args.get("ignore_data_skip"):
        _set(audit, "data position", MISSING, "training_args.bin",
             "ignore_data_skip=True: the resume does not skip the consumed batches, and "
             "trains on them again")
        return
    batches = f"{skip * accumulate} batches" + (f" ({skip} x {accumulate} accumulated)"
                                                 if accumulate > 1 else "")
    _set(audit, "data position", PRESENT, f"{where} (global_step, epoch)",
         f"the resume skips the first {batches} of epoch {done}")
    audit.flags.append("data position: Trainer skips the consumed batches of the epoch, "
                       "which is exact for its own sampler over a map-style dataset when the "
                       "RNG is restored; a custom sampler or an IterableDataset is skipped by "
                       "drawing its batches again, exact only if it is deterministic")
