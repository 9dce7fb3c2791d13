"""The commit protocol's system calls, in order (NOTE [ A checkpoint exists when its commit
record does ] in ckpt/commit.py): every rank file is fsynced before it is hashed and before
the record; the step directory is fsynced before the record's atomic write; the record is
fsynced under its temporary name, renamed, and its directory fsynced. The calls of both
ckpt.commit and ckpt.atomic are recorded, as tests/test_resume_atomic.py records the
single-file atomic write's. And pruning (ckpt/commit_policy.py) makes a record's removal
durable before it removes the files the record named.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckpt import atomic, commit_policy
from ckpt import commit as ckc

STEP = 4
FILES = ("__0_0.distcp", "__1_0.distcp", ".metadata")  # what a 2-rank DCP save leaves


class _Recorder:
    """Stands in for `os` inside ckpt.commit and ckpt.atomic: records open, fsync, read,
    write, close and replace, each labelled by what it touches: a directory `dir:<name>`,
    the record's temporary file `temp`, or a file by name (repeated reads are one entry)."""

    CALLS = ("open", "fsync", "read", "write", "close", "replace")

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fds: dict[int, str] = {}

    def _label(self, name: str, args: tuple) -> str:
        if name == "open":
            path = Path(args[0])
            if path.is_dir():
                return f"open dir:{path.name}"
            return "open temp" if path.name.endswith(atomic.TEMP_SUFFIX) else f"open {path.name}"
        if name == "replace":
            return f"replace {Path(args[1]).name}"
        return f"{name} {self.fds.get(args[0], '?')}"

    def __getattr__(self, name: str) -> object:
        real = getattr(os, name)
        if name not in self.CALLS:
            return real

        def call(*args: object, **kwargs: object) -> object:
            label = self._label(name, args)
            if self.calls[-1:] != [label] or name not in ("read", "write"):
                self.calls.append(label)
            result = real(*args, **kwargs)
            if name == "open":
                self.fds[result] = label.split(" ", 1)[1]
            return result
        return call


def _first(calls: list[str], label: str) -> int:
    assert label in calls, f"no `{label}` among the calls: {calls}"
    return calls.index(label)


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], Path]:
    """(the calls, the parent) of one save as both trees make it: make_fresh, every file
    written by its rank (here plainly, unrecorded: DCP's writer), file_entry for each,
    then commit by the coordinator."""
    recorder = _Recorder()
    monkeypatch.setattr(ckc, "os", recorder)
    monkeypatch.setattr(atomic, "os", recorder)
    parent = tmp_path / "saves"
    directory = ckc.make_fresh(parent, STEP)
    for i, name in enumerate(FILES):
        (directory / name).write_bytes(bytes([i]) * (1000 + i))
    entries = [ckc.file_entry(directory, name) for name in FILES]
    ckc.commit(parent, STEP, 2, "dcp", entries)
    monkeypatch.undo()
    return recorder.calls, parent


def test_every_rank_file_is_fsynced_before_it_is_hashed_and_before_the_record(
        recorded: tuple[list[str], Path]) -> None:
    """fsync <file> precedes the first read of it (the SHA-256 the record carries) and the
    record's temporary file: the digest is of bytes that are on the disk."""
    calls, parent = recorded
    record_opened = _first(calls, "open temp")
    for name in FILES:
        synced = _first(calls, f"fsync {name}")
        assert synced < _first(calls, f"read {name}"), f"{name} hashed before its fsync"
        assert synced < record_opened, f"{name} fsynced after the record was begun"
    assert ckc.read_record(ckc.record_path(parent, STEP)).files[0].size == 1000


def test_the_step_directory_is_fsynced_before_the_records_atomic_write(
        recorded: tuple[list[str], Path]) -> None:
    """open, fsync, close of step-<step> come before the record's temporary file is opened:
    the files' names are durable before the record that names them."""
    calls, _ = recorded
    step = ckc.step_dir("", STEP).name
    synced = _first(calls, f"fsync dir:{step}")
    assert calls[synced - 1:synced + 2] == [f"open dir:{step}", f"fsync dir:{step}",
                                            f"close dir:{step}"]
    assert synced < _first(calls, "open temp")


def test_the_record_is_fsynced_renamed_and_its_directory_fsynced(
        recorded: tuple[list[str], Path]) -> None:
    """The record's own atomic write, last: NOTE [ Atomic write ]'s order, the parent
    fsynced after the rename (and after make_fresh created the step directory in it)."""
    calls, parent = recorded
    record = ckc.record_path(parent, STEP).name
    tail = calls[_first(calls, "open temp"):]
    assert tail == ["open temp", "write temp", "fsync temp", "close temp", f"replace {record}",
                    f"open dir:{parent.name}", f"fsync dir:{parent.name}",
                    f"close dir:{parent.name}"], tail
    assert calls[:3] == [f"open dir:{parent.name}", f"fsync dir:{parent.name}",
                         f"close dir:{parent.name}"], "make_fresh syncs the new step's name"


def _save(parent: Path, step: int) -> None:
    directory = ckc.make_fresh(parent, step)
    (directory / "__0_0.distcp").write_bytes(bytes([step]) * 100)
    ckc.commit(parent, step, 1, "dcp", [ckc.file_entry(directory, "__0_0.distcp")])


def test_pruning_syncs_a_records_removal_before_removing_its_step_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prune(keep=1) of commits 2, 4, 6: for 2 and 4, the parent is fsynced while the record
    is gone and its step directory still there (a power cut then leaves an uncommitted
    directory, never a record naming missing files); 6 and its directory stay."""
    parent = tmp_path / "saves"
    for step in (2, 4, 6):
        _save(parent, step)
    seen: list[set[str]] = []
    real = commit_policy.sync_directory

    def sync(directory: Path) -> None:
        assert Path(directory) == parent, directory
        seen.append(set(os.listdir(parent)))
        real(directory)

    monkeypatch.setattr(commit_policy, "sync_directory", sync)
    commit_policy.prune(parent, 1)
    for step in (2, 4):
        record, directory = ckc.record_path(parent, step).name, ckc.step_dir(parent, step).name
        assert any(record not in names and directory in names for names in seen), (
            f"no fsync of {parent.name} between removing {record} and {directory}: {seen}")
    assert set(os.listdir(parent)) == {ckc.record_path(parent, 6).name,
                                       ckc.step_dir(parent, 6).name}
