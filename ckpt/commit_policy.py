"""What an N-rank run (`python -m parity train --world-size N`) does with what its directory
already holds: the commit-record counterpart of ckpt/policy.py's table, decided once, in
the process that starts the ranks, before any rank runs (a refusal changes nothing).
Stdlib only; both trees' N-rank training call it (NOTE [ A checkpoint exists when its
commit record does ] in ckpt/commit.py).

    the directory holds            no flag        --resume                  --overwrite
    nothing, or is missing         step 0         step 0, says so           step 0
                                                  (--resume-strict: refused)
    commit records                 refused        the newest whose files    records and step
                                                  verify, of this payload   directories removed
                                                  (another tree's: refused) first, then step 0
    single-process checkpoints     refused        refused                   refused
    (ckpt-<step>.ckpt)

A step directory no record names is a save that did not finish: it is no checkpoint, and
a run that goes ahead removes it (saying so), since its step is saved again into a fresh
directory of that name. `prune(parent, keep)` keeps the newest `keep` commits: it removes a
record before its directory, so a kill in between leaves an uncommitted directory, never a
record whose files are gone.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt import commit as ckc
from ckpt.atomic import sync_directory
from ckpt.directory import NAME as SINGLE_NAME
from ckpt.errors import CheckpointDirectoryError

Notify = Callable[[str], None]


@dataclass(frozen=True)
class Start:
    """Where the run starts: `record` (None: step 0) and the configuration it saved."""

    record: ckc.Commit | None
    config: dict[str, Any] | None


def start(parent: str | os.PathLike, payload: str, *, resume: bool, overwrite: bool,
          strict: bool = False, notify: Notify = print) -> Start:
    """The module docstring's table; CheckpointDirectoryError for a refusal."""
    where = Path(parent)
    if resume and overwrite:
        raise CheckpointDirectoryError("--resume continues the run in a directory and "
                                       "--overwrite starts a new one there: choose one")
    if where.exists() and not where.is_dir():
        raise CheckpointDirectoryError(f"{where} exists and is not a directory")
    present = where.is_dir()
    singles = sorted(p.name for p in where.iterdir()
                     if SINGLE_NAME.match(p.name)) if present else []
    if singles:
        raise CheckpointDirectoryError(
            f"{where} holds single-process checkpoints ({singles[0]}, ...): --world-size 1 "
            "continues them; an N-rank run writes commit records, so choose another directory")
    records = ckc.records(where) if present else []
    if records and not resume:
        if not overwrite:
            raise CheckpointDirectoryError(
                f"{where} already holds {len(records)} commit record(s) (newest "
                f"{records[0].name}): pass --resume to continue, --overwrite to delete them "
                "first, or choose another directory; nothing was changed")
        for path in records:
            _remove_commit(path, notify)
        records = []
    record = config = None
    if resume and records:
        record, skipped = ckc.newest(where, payload)  # refuses another tree's, naming it
        for line in skipped:
            notify(f"skipped: {line}")
        config = ckc.read_config(record)
    elif resume and strict:
        raise CheckpointDirectoryError(f"nothing to resume in {where}: it holds no commit "
                                       "record (--resume-strict; --resume starts at step 0 "
                                       "there)")
    elif resume:
        notify(f"nothing to resume in {where}: starting at step 0")
    if present:
        for directory in ckc.uncommitted(where):
            notify(f"removed {directory.name}: no commit record names it (a save that did "
                   "not finish)")
            shutil.rmtree(directory)
    return Start(record, config)


def prune(parent: str | os.PathLike, keep: int, notify: Notify | None = None) -> None:
    """Remove all but the newest `keep` commits (each record first, then its directory)."""
    if keep < 1:
        raise ValueError(f"prune: keep must be >= 1, got {keep}")
    for path in ckc.records(parent)[keep:]:
        _remove_commit(path, notify)


def _remove_commit(path: Path, notify: Notify | None) -> None:
    step = int(path.name.removeprefix("COMMITTED-").removesuffix(".json"))
    path.unlink()
    sync_directory(path.parent)  # the record is gone before its files are
    directory = ckc.step_dir(path.parent, step)
    if directory.is_dir() and not directory.is_symlink():
        shutil.rmtree(directory)
    if notify is not None:
        notify(f"removed {path.name} and {directory.name}")
