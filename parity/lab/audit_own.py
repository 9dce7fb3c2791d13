"""This project's own checkpoints, recognised before any foreign layout is guessed at:
what `python -m parity train` writes, single-process or `--world-size N`, in either tree.

    given                        told by                               verdict from
    a checkpoint file            the container's magic (ckpt/)         its state: audit_recognize
                                                                       (a rank's state: below)
    a single-process run folder  ckpt-<step>.ckpt files                its newest file
    an N-rank run folder         COMMITTED-<step>.json records,        the step the resume takes:
                                 step-<step> folders (ckpt/commit.py)  the newest that verifies
    a step folder                step-<8 digits> holding rank files    committed: every rank's
                                 (or named by a record beside it)      state (audit_ranks.py)
    a rank file                  a rank's state (rank-<r>.ckpt), or    one of N shards: impossible
                                 __<r>_<i>.distcp in a step folder

A committed step is checked as the N-rank resume checks it (ckpt.commit.verify: every
file the record lists has its size and SHA-256, before any byte is parsed; a failure is
damage: exit 2), then read: the reference's rank files are this project's container (no
pickle); the torch tree's .metadata is DCP's pickle, read by pickletools for the names it
holds (its keys, the files it uses), never run, so the torch rows check names, not shapes.
The step's config.json is required: the resume compares it with the command (without it
ckpt.check_config refuses, "holds no configuration to compare").

# NOTE [ A rank file alone is no resumable checkpoint ]
The project resumes an N-rank run from a whole committed step and nothing less: the
resume takes a commit record whose every file verifies; each reference rank reads its own
file, and DCP serves each torch key from the one file its planner chose (a replicated
entry, the model too, lives in ONE rank's file). A rank file carries one rank's stream and
maybe not even the model. Exit 0 would tell a script that keeping this file keeps the run,
which is false: the verdict is "impossible", the reason names the whole step to audit and
whether it is committed, and the rows say what this one file holds.

An uncommitted step folder (no record names it: a save killed or crashed before its
commit record) is no checkpoint: the resume ignores it and removes it; its verdict is
"impossible", saying so, with the rows of what its files hold.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import ckpt
from ckpt import commit as ckc
from ckpt.container import MAGIC_V2
from ckpt.directory import NAME as SINGLE_NAME
from common.train_loop import INVENTORY
from parity.lab import audit_ranks
from parity.lab.audit_pickle import pickle_names, pickle_of
from parity.lab.audit_recognize import Audit, AuditInputError, recognize

RANK_FILE = re.compile(r"rank-(\d+)\.ckpt")
DCP_FILE = re.compile(r"__(\d+)_(\d+)\.distcp")
STEP_DIR = re.compile(r"step-(\d{8})")
TREES = {"npy-records": "reference", "dcp": "torch"}  # a commit record's payload -> --impl
METADATA = ".metadata"


def own(path: Path) -> Audit | None:
    """The Audit of `path` if this project wrote it (the table above), else None."""
    if path.is_dir():
        return _folder(path)
    with open(path, "rb") as f:
        head = f.read(len(ckpt.MAGIC))
    if head in (ckpt.MAGIC, MAGIC_V2):
        return container(path)
    m = DCP_FILE.fullmatch(path.name)
    if m and _is_step_dir(path.parent):
        return _dcp_rank_file(path, int(m.group(1)))
    return None


def container(path: Path) -> Audit:
    """A ckpt/ container, verified and decoded by the tree that wrote it: a single-process
    checkpoint, or one rank's file of an N-rank checkpoint."""
    try:
        header = ckpt.read_header(path)
    except ckpt.CheckpointError as e:
        raise AuditInputError(str(e)) from None
    payload = header.get("payload") if isinstance(header, dict) else None
    if payload == "torch-zip":
        from torch_impl import resume
    elif payload == "npy-records":
        from reference import resume  # type: ignore[no-redef]
    else:
        raise AuditInputError(f"{path}: a mirrortrain checkpoint of unknown payload "
                              f"{payload!r}")
    try:
        state = resume.load_checkpoint(path)
    except ckpt.CheckpointError as e:
        raise AuditInputError(str(e)) from None
    tree = "torch_impl" if payload == "torch-zip" else "reference"
    rank = audit_ranks.is_rank_state(state)
    if rank is not None:
        return _rank_file(path, rank, {rank: state}, TREES.get(payload, "torch"))
    audit = recognize(state, f"mirrortrain checkpoint ({payload}, written by {tree})",
                      generator="torch" if payload == "torch-zip" else "numpy")
    lacks = [item for item in INVENTORY if item not in state]
    audit.flags.append("this project's inventory (common/train_loop.py): "
                       + (f"{', '.join(INVENTORY)}, all there" if not lacks
                          else f"lacks {', '.join(lacks)}"))
    return audit


def _folder(path: Path) -> Audit | None:
    if _is_step_dir(path):
        return _step_folder(path)
    names = {p.name for p in path.iterdir()}
    singles = sorted((n for n in names if SINGLE_NAME.match(n)),
                     key=lambda n: int(SINGLE_NAME.match(n).group(1)))  # type: ignore[union-attr]
    sharded = ckc.records(path) or [n for n in names if STEP_DIR.fullmatch(n)
                                    and _is_step_dir(path / n)]
    if singles and sharded:
        raise AuditInputError(f"{path}: holds both single-process checkpoints ({singles[0]}, "
                              "...) and N-rank commits: audit one file or step folder")
    if singles:
        return _single_folder(path, singles)
    if sharded:
        return _run_folder(path)
    return None


def _single_folder(path: Path, singles: list[str]) -> Audit:
    """A single-process run folder: its newest checkpoint that verifies (the resume, too,
    passes over one that does not, saying so)."""
    passed = []
    for name in reversed(singles):
        try:
            audit = container(path / name)
        except AuditInputError as e:
            passed.append(str(e))
            continue
        audit.kind += f", the newest of {len(singles)} in the folder that verifies: {name}"
        audit.flags.extend(f"passed over, as the resume does: {line}" for line in passed)
        return audit
    raise AuditInputError(f"{path}: no checkpoint in it verifies: {'; '.join(passed)}")


def _is_step_dir(path: Path) -> bool:
    """A step folder of ckpt/commit.py: step-<8 digits>, named by a record beside it or
    holding what the N-rank saves write."""
    m = STEP_DIR.fullmatch(path.name)
    if m is None or not path.is_dir() or path.is_symlink():
        return False
    if ckc.record_path(path.parent, int(m.group(1))).exists():
        return True
    return any(RANK_FILE.fullmatch(p.name) or DCP_FILE.fullmatch(p.name)
               or p.name in (METADATA, ckc.CONFIG) for p in path.iterdir())


def _run_folder(path: Path) -> Audit:
    """An N-rank run folder: the newest commit whose files verify (the resume's choice)."""
    passed = []
    records = ckc.records(path)
    for record_path in records:
        try:
            record = ckc.read_record(record_path)
            ckc.verify(record)
        except (ckpt.CheckpointCorruptError, ckpt.CheckpointVersionError) as e:
            passed.append(str(e))
            continue
        audit = _committed(record)
        audit.kind = (f"mirrortrain {record.world_size}-rank run folder (--impl "
                      f"{_tree(record)}): its newest committed step, {record.directory.name} "
                      f"(of {len(records)} commit record(s))")
        audit.flags.extend(f"passed over, as the resume does: {line}" for line in passed)
        audit.flags.extend(f"{d.name}: uncommitted (a save that did not finish); the resume "
                           "ignores it" for d in ckc.uncommitted(path))
        return audit
    if passed:
        raise AuditInputError(f"{path}: no commit record verifies: {'; '.join(passed)}")
    steps = ", ".join(d.name for d in ckc.uncommitted(path))
    return Audit("mirrortrain N-rank run folder, no commit record",
                 refused=f"nothing committed: {steps} uncommitted (saves that did not finish);"
                         " a --resume there starts at step 0")


def _tree(record: ckc.Commit) -> str:
    if record.payload not in TREES:
        raise AuditInputError(f"commit record {record.path}: unknown payload "
                              f"{record.payload!r}")
    return TREES[record.payload]


def _step_folder(path: Path) -> Audit:
    step = int(STEP_DIR.fullmatch(path.name).group(1))  # type: ignore[union-attr]
    record_path = ckc.record_path(path.parent, step)
    if not record_path.exists():
        return _uncommitted(path, step)
    try:
        record = ckc.read_record(record_path)
        ckc.verify(record)
    except (ckpt.CheckpointCorruptError, ckpt.CheckpointVersionError) as e:
        raise AuditInputError(str(e)) from None
    audit = _committed(record)
    newest = ckc.records(path.parent)[0]
    if newest != record_path:
        audit.flags.append(f"not the newest commit: a resume in {path.parent} takes "
                           f"{newest.name}'s step")
    return audit


def _committed(record: ckc.Commit) -> Audit:
    """A verified commit: every rank's state against audit_ranks' table."""
    tree = _tree(record)
    try:
        config = ckc.read_config(record)
    except ckpt.CheckpointCorruptError as e:
        raise AuditInputError(str(e)) from None
    listed = {f.name for f in record.files}
    ws = record.world_size
    audit = Audit(f"mirrortrain {ws}-rank checkpoint (--impl {tree}: {record.payload}), "
                  f"{record.directory.name}, committed")
    refusals = []
    if tree == "reference":
        ranks = {f"rank-{r}.ckpt" for r in range(ws)}
        if listed - {ckc.CONFIG} != ranks:
            refusals.append(f"its record lists {sorted(listed - {ckc.CONFIG})}, the resume "
                            f"reads exactly {sorted(ranks)}")
        states = {r: _load_rank(record.directory / f"rank-{r}.ckpt")
                  for r in range(ws) if f"rank-{r}.ckpt" in listed}
    else:
        states, used = _dcp_names(record.directory, ws)
        if METADATA not in listed:
            refusals.append(f"its record lists no {METADATA}")
        if not used <= listed:
            refusals.append(f"its {METADATA} uses {sorted(used - listed)}, which the record "
                            "does not list")
    if config is None:
        refusals.append(f"its record lists no {ckc.CONFIG}: the resume refuses a step "
                        "without the configuration it continues")
    audit_ranks.rows(audit, states, tree, config, ws)
    if refusals:
        audit.refused = "; ".join(refusals)
    audit.flags.append(f"{record.path.name}: {ws} rank(s), {len(record.files)} file(s), "
                       "each of its recorded size and SHA-256")
    return audit


def _load_rank(path: Path) -> dict[str, Any]:
    from reference import resume

    try:
        return resume.load_checkpoint(path)
    except ckpt.CheckpointError as e:
        raise AuditInputError(str(e)) from None


def _dcp_names(directory: Path, ws: int | None) -> tuple[dict[int, dict[str, Any]], set[str]]:
    """Every rank's keys (DCP serves each key to every rank), by name only, and the files
    the step's .metadata uses: read by pickletools from its pickle, nothing run."""
    meta = directory / METADATA
    if not meta.is_file() or meta.is_symlink():
        return {}, set()
    _, names = pickle_names(pickle_of(meta))  # past MAX_PICKLE: nothing read, no names
    used = {n for n in names if DCP_FILE.fullmatch(n)}
    ranks = range(ws) if ws else sorted({int(m.group(1)) for n in used
                                          if (m := DCP_FILE.fullmatch(n))})
    keys = {n: None for n in names}
    return {r: keys for r in ranks}, used


def _read_config(directory: Path) -> dict[str, Any] | None:
    path = directory / ckc.CONFIG
    if not path.is_file() or path.stat().st_size > ckc.MAX_RECORD_BYTES:
        return None
    try:
        config = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return config if isinstance(config, dict) else None


def _uncommitted(path: Path, step: int) -> Audit:
    ranks = sorted((int(m.group(1)), p) for p in path.iterdir()
                   if (m := RANK_FILE.fullmatch(p.name)))
    tree = "reference" if ranks else "torch"
    audit = Audit(f"mirrortrain step folder {path.name} (--impl {tree}), uncommitted")
    if ranks:
        states = {}
        for r, p in ranks:
            try:
                states[r] = _load_rank(p)
            except AuditInputError as e:
                audit.flags.append(f"{p.name}: cannot be read: {e}")
    else:
        states, _ = _dcp_names(path, None)
    audit_ranks.rows(audit, states, tree, _read_config(path), None)
    audit.refused = (f"{path.name} is uncommitted: no {ckc.record_path(path.parent, step).name}"
                     " names it (a save that did not finish: killed or crashed before its "
                     "commit record); the project's resume ignores it, and a run resuming in "
                     f"{path.parent} removes it")
    return audit


def _rank_file(path: Path, rank: int, states: dict[int, dict[str, Any]], tree: str) -> Audit:
    """NOTE [ A rank file alone is no resumable checkpoint ]."""
    step_dir = path.parent
    m = STEP_DIR.fullmatch(step_dir.name)
    record = None
    if m and ckc.record_path(step_dir.parent, int(m.group(1))).exists():
        try:
            record = ckc.read_record(ckc.record_path(step_dir.parent, int(m.group(1))))
        except (ckpt.CheckpointCorruptError, ckpt.CheckpointVersionError):
            record = None
    ws = record.world_size if record else None
    config = _read_config(step_dir)
    of = f"one of {ws} shards" if ws else "one shard"
    if record is not None and path.name in {f.name for f in record.files}:
        whole = (f"{of} (rank {rank}'s file of committed step {record.step}): the project "
                 f"resumes a whole committed step, never one rank's file; audit {step_dir}")
        where = f"committed step {record.step} of a {ws}-rank run"
    elif m:
        whole = (f"{of} (rank {rank}'s file of {step_dir.name}), and no commit record names "
                 "that step: a save that did not finish, which the project's resume ignores")
        where = f"{step_dir.name}, uncommitted"
    else:
        whole = (f"{of} (rank {rank}'s file), outside its step folder: the project resumes a "
                 "whole committed step, never one rank's file")
        where = "outside a step folder"
    audit = Audit(f"mirrortrain rank file (--impl {tree}): rank {rank}'s state, {where}")
    if states:
        audit_ranks.rows(audit, states, tree, config, ws)
    audit.refused = whole
    return audit


def _dcp_rank_file(path: Path, rank: int) -> Audit:
    audit = _rank_file(path, rank, {}, "torch")
    audit.flags.append(f"DCP writes each replicated entry once, into the file of the rank its "
                       f"planner picks: only the step's {METADATA} says which are in this "
                       "file; audit the step folder for what the step holds")
    return audit
