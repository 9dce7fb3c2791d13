"""A directory of training checkpoints `ckpt-<step>.ckpt`: what is in it, saving, pruning.

NOTE [ What a run may touch in its directory ]
A checkpoint directory is the user's data. An entry under a checkpoint name is one of
  - a checkpoint this run can read: a regular file whose container verifies and whose
    header carries the run's metadata (step, config), ckpt/container.py;
  - an entry it cannot read: a symbolic link (never followed), a directory, a FIFO (never
    opened), a file that does not verify, one of another format version, ... (`problem`
    says which).
A run DELETES only checkpoints it OWNS: the ones it wrote, and, when it resumes, the ones
of its own payload kind and configuration that it found at the start; and only if it
verified the file and the file is still the one it verified (same device, inode, size and
mtime). A resume reads the headers of what it finds without their digests (NOTE [
Choosing before verifying ] in ckpt/policy.py), so an owned checkpoint found there is
verified when it first matters: before `keep` counts it or it is deleted; one that does
not verify is kept, reported, and owned no longer. `keep` counts verified owned
checkpoints only, so an entry it cannot read never holds a slot and is never deleted. An
unreadable entry that sits at a name the run is about to write is renamed aside
(`<name>.unreadable`), not overwritten. The directory is locked (flock) while a run uses it,
so two runs never prune each other's files; temporary files a killed writer left are
removed at the start (a temporary name is never a checkpoint).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt.atomic import TEMP_SUFFIX, probe
from ckpt.container import _kind, open_checkpoint, read_header
from ckpt.errors import (
    CheckpointDirectoryError,
    CheckpointError,
    CheckpointVersionError,
    CheckpointWriteError,
)

NAME = re.compile(r"^ckpt-(\d{8,})\.ckpt$")
TEMP = re.compile(r"^\.ckpt-.*" + re.escape(TEMP_SUFFIX) + "$")
ASIDE = ".unreadable"

Identity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


def _identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class Entry:
    """One entry under a checkpoint name: its header if this code can read it, else why not."""

    path: Path
    step: int
    header: dict[str, Any] | None
    problem: str | None
    identity: Identity | None
    verified: bool = False  # its digest verified (a checkpoint, maybe of another version);
    # False with a header: read_entry(verify=False) read the header, not the digest

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def payload(self) -> str:
        return self.header["payload"] if self.header else ""

    @property
    def writer(self) -> str:
        return self.header["writer"] if self.header else ""

    @property
    def config(self) -> dict[str, Any]:
        return self.header["meta"]["config"] if self.header else {}


def read_entry(path: Path, step: int, *, verify: bool = True) -> Entry:
    """lstat (no symlink followed), then verify a regular file's container and metadata.

    verify=False reads the frame and the header only (container.read_header, no digest):
    an entry with a header and `verified` False. Whatever that cheap read cannot accept is
    read verified after all, so an unreadable entry's `problem` is what a verified read
    says (a flipped bit is "corrupt", not the garbled header's complaint)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return Entry(path, step, None, f"cannot stat: {e.strerror}", None)
    if not stat.S_ISREG(st.st_mode):
        return Entry(path, step, None, f"{_kind(st.st_mode)}, not a regular file", None)
    if not verify:
        try:
            header = read_header(path, follow_symlinks=False)
        except (CheckpointError, OSError):
            header = None
        if header is not None and _meta_problem(header, step) is None:
            return Entry(path, step, header, None, _identity(st))
    try:
        with open_checkpoint(path, follow_symlinks=False) as container:
            header = container.header
    except CheckpointVersionError as e:
        return Entry(path, step, None, _short(e, path), _identity(st), verified=True)
    except (CheckpointError, OSError) as e:
        return Entry(path, step, None, _short(e, path), _identity(st))
    what = _meta_problem(header, step)
    if what is not None:
        return Entry(path, step, None, what, _identity(st))
    return Entry(path, step, header, None, _identity(st), verified=True)


def _meta_problem(header: dict[str, Any], step: int) -> str | None:
    """Why a header is not a training checkpoint's of `step`, or None."""
    meta = header.get("meta")
    if (isinstance(meta, dict) and isinstance(meta.get("config"), dict)
            and meta.get("step") == step):
        return None
    return ("no training metadata in its header" if not isinstance(meta, dict)
            or "step" not in meta else f"its header says step {meta.get('step')!r}")


def _short(error: BaseException, path: Path) -> str:
    """An error's message without the path prefix (the entry's name is printed beside it)."""
    text = str(error)
    return text.split(": ", 1)[1] if text.startswith(f"{path}: ") else text


class CheckpointDirectory:
    """The checkpoints of one directory, for one tree (`payload`, `save`).

    save(step, state, config) writes `ckpt-<step>.ckpt` atomically and then prunes the owned
    checkpoints beyond the newest `keep` (NOTE [ What a run may touch in its directory ]).
    `log` receives one line per thing done or skipped that the user should know about.
    """

    def __init__(self, directory: str | os.PathLike, *, payload: str,
                 save: Callable[[Path, Mapping[str, Any], Mapping[str, Any]], None],
                 keep: int = 3, log: Callable[[str], None] | None = None) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"CheckpointDirectory: keep must be an int >= 1, got {keep!r}")
        if os.fspath(directory) == "":
            raise ValueError("CheckpointDirectory: the directory is an empty path")
        self.directory = Path(directory)
        self.payload, self.keep = payload, keep
        self._save, self._log = save, log
        self.owned: dict[Path, Entry] = {}

    def say(self, line: str) -> None:
        if self._log is not None:
            self._log(line)

    def path(self, step: int) -> Path:
        return self.directory / f"ckpt-{step:08d}.ckpt"

    # -- what is there
    def names(self) -> list[tuple[int, Path]]:
        """(step, path) of every entry under a checkpoint name, whatever it is, by step."""
        if not self.directory.is_dir():
            return []
        found = [(int(m.group(1)), Path(e.path)) for e in os.scandir(self.directory)
                 if (m := NAME.match(e.name))]
        return sorted(found)

    def checkpoints(self) -> list[tuple[int, Path]]:
        """(step, path) of every regular file under a checkpoint name (symlinks excluded)."""
        return [(s, p) for s, p in self.names()
                if stat.S_ISREG(os.lstat(p).st_mode)]

    def scan(self, *, verify: bool = True) -> list[Entry]:
        """Every entry under a checkpoint name, read (read_entry), oldest step first;
        verify=False reads headers, not digests (NOTE [ Choosing before verifying ])."""
        return [read_entry(p, s, verify=verify) for s, p in self.names()]

    # -- opening
    @contextmanager
    def opened(self) -> Iterator[CheckpointDirectory]:
        """For the block: the directory exists (created if needed), is locked against a
        second run (flock on its descriptor, no lock file), is proven writable
        (ckpt.atomic.probe), and holds no temporary file an interrupted save left.
        CheckpointWriteError or CheckpointDirectoryError name the directory otherwise.
        The folders it created are removed again at the end of the block if they are still
        empty (a run refused, or interrupted, before its first checkpoint leaves none)."""
        if self.directory.exists() and not self.directory.is_dir():
            raise CheckpointDirectoryError(f"{self.directory} exists and is not a directory")
        created = []  # the missing folders, the directory first, then its missing parents
        for folder in (self.directory, *self.directory.parents):
            if os.path.lexists(folder):
                break
            created.append(folder)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CheckpointWriteError(e.errno or errno.EIO, "cannot create the checkpoint "
                                       f"directory {self.directory}: {e.strerror}") from None
        try:
            with self._locked():
                probe(self.directory)
                for p in self.cleanup():
                    self.say(f"removed {p.name}, a temporary file an interrupted save left")
                yield self
        finally:
            for folder in created:
                try:
                    os.rmdir(folder)  # only ever an empty folder: never the user's data
                except OSError:
                    break

    def cleanup(self) -> list[Path]:
        """Remove the temporary files (regular files only) an interrupted save left."""
        removed = []
        for e in os.scandir(self.directory):
            if TEMP.match(e.name) and e.is_file(follow_symlinks=False):
                os.unlink(e.path)
                removed.append(Path(e.path))
        return removed

    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            import fcntl
        except ImportError:  # no flock on this platform: unlocked
            yield
            return
        fd = os.open(self.directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CheckpointDirectoryError(
                    f"{self.directory} is in use by another run (it holds the directory's "
                    "lock): wait for it to end or choose another directory") from None
            yield
        finally:
            os.close(fd)

    # -- ownership, saving, pruning
    def own(self, entry: Entry) -> None:
        """Make a checkpoint of this run prunable (one not yet verified is verified before
        `keep` counts it or it is deleted)."""
        self.owned[entry.path] = entry

    def remove(self, entry: Entry) -> bool:
        """Delete a checkpoint read by this run if it is still the file that was read."""
        try:
            same = entry.identity is not None and _identity(os.lstat(entry.path)) == \
                entry.identity
        except FileNotFoundError:
            same = False
        if same:
            os.unlink(entry.path)
        self.owned.pop(entry.path, None)
        return same

    def save(self, step: int, state: Mapping[str, Any], config: Mapping[str, Any]) -> Path:
        """Write ckpt-<step>.ckpt (header meta: step and config), own it, then prune."""
        path = self.path(step)
        if path in self.owned and not self.owned[path].verified:
            self._verified(self.owned[path])  # overwritten only if verified as this run's
        if path not in self.owned and os.path.lexists(path):
            self._set_aside(path)
        self._save(path, state, {"step": step, "config": dict(config)})
        self.own(Entry(path, step, None, None, _identity(os.lstat(path)), verified=True))
        self.prune()
        return path

    def prune(self) -> None:
        """Delete the owned checkpoints beyond the newest `keep`, counting and deleting only
        verified ones: each owned one not yet verified is verified first, and kept, and
        owned no longer, when it does not verify."""
        kept = 0
        for old in sorted(self.owned.values(), key=lambda e: e.step, reverse=True):
            checked = old if old.verified else self._verified(old)
            if checked is None:
                continue
            if kept < self.keep:
                kept += 1
            elif not self.remove(checked) and os.path.lexists(checked.path):
                self.say(f"kept {checked.name}: it changed since this run read it")

    def _verified(self, entry: Entry) -> Entry | None:
        """The owned `entry` verified (read_entry) and still owned, or None (no longer
        owned, saying why) when it does not verify or is no longer the file that was read."""
        checked = read_entry(entry.path, entry.step)
        if checked.identity != entry.identity or (
                checked.header is not None and checked.header != entry.header):
            if os.path.lexists(entry.path):
                self.say(f"kept {entry.name}: it changed since this run read it")
            checked = None
        elif checked.header is None:
            self.say(f"kept {entry.name}: cannot read it ({checked.problem})")
            checked = None
        if checked is None:
            del self.owned[entry.path]
        else:
            self.owned[entry.path] = checked
        return checked

    def _set_aside(self, path: Path) -> None:
        aside, n = path.with_name(path.name + ASIDE), 1
        while os.path.lexists(aside):
            n += 1
            aside = path.with_name(f"{path.name}{ASIDE}-{n}")
        os.rename(path, aside)
        self.say(f"renamed {path.name} to {aside.name}: this run could not read it and "
                 f"writes that name now")
