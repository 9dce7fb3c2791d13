"""Sharded checkpoints that cannot tear: a fresh step directory per checkpoint, and a commit
record beside it that makes it exist. Stdlib only: both trees' sharded checkpoints
(torch_impl/sharded_ckpt.py: torch.distributed.checkpoint; reference/sharded_ckpt.py: one
container per simulated rank) commit and find theirs with this module.

    parent/
      step-00000010/            the step's files, written by every rank (never reused)
      COMMITTED-00000010.json   the commit record: step, world size, payload, and each
                                file's name, size and SHA-256 (as its rank recorded them)

# NOTE [ A checkpoint exists when its commit record does ]
1. Every checkpoint goes into a FRESH directory step-<step>: a save never writes into a
   directory that already holds a checkpoint, so no file of an older step can be left beside
   the new ones (plain DCP into an existing directory tears: its old .metadata survives a
   save killed before the new one lands, and dcp.load then mixes two steps).
2. Each rank writes and fsyncs its own files and records their size and SHA-256.
3. After every rank's files (and DCP's .metadata) are durable, the coordinator fsyncs the
   step directory, then writes the commit record by the atomic write (NOTE [ Atomic write ]
   in ckpt/atomic.py: a temporary name, fsync, rename into the parent, fsync the parent).
4. Loading takes the newest commit record whose every file verifies (size, then SHA-256)
   BEFORE any byte of those files is parsed; a step directory without a verified commit
   record is not a checkpoint (a save killed at any moment leaves one) and is ignored.
A kill before 3's rename leaves the previous commit record and its files untouched, so
the previous checkpoint stays loadable; after it the new one is complete.

# NOTE [ The trust boundary ]
Verifying the digests before parsing means no file of a torn, truncated or substituted
step is ever read, and DCP's .metadata (a pickle: torch's FileSystemReader.read_metadata
calls pickle.load) is unpickled only when its bytes are the ones the commit record names.
It does not make a checkpoint from elsewhere safe: whoever writes the commit record can
write a malicious .metadata and its matching digest. Load only commit records you trust
(your own run's directory); the record is plain JSON and is parsed without pickle.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt.atomic import atomic_write, sync_directory, write_all
from ckpt.errors import CheckpointCorruptError, CheckpointDirectoryError, CheckpointVersionError

FORMAT = "mirrortrain-sharded-commit"
VERSION = 1
MAX_RECORD_BYTES = 1 << 20  # a record lists a few files: anything larger is not ours
_RECORD = re.compile(r"COMMITTED-(\d{8})\.json")
_STEP_DIR = re.compile(r"step-(\d{8})")
_NAME = re.compile(r"\.?[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a plain name: no separator, no ".."
_CHUNK = 1 << 20
CONFIG = "config.json"  # the run's configuration, beside the ranks' files (write_config)


def rank_seed(seed: int, rank: int, step: int) -> int:
    """The seed of rank `rank`'s stream from (seed, rank, step) (NOTE [ Resharding a DDP
    checkpoint ] in torch_impl/sharded_ckpt.py): the first 63 bits of SHA-256 of the three
    as text, a pure function of integers, the same in both trees."""
    if not all(_is_int(v, 0) for v in (seed, rank, step)):
        raise ValueError(f"rank_seed: seed, rank and step must be ints >= 0, got "
                         f"{(seed, rank, step)!r}")
    return int.from_bytes(hashlib.sha256(f"{seed}:{rank}:{step}".encode()).digest()[:8],
                          "little") >> 1


def step_dir(parent: str | os.PathLike, step: int) -> Path:
    """parent/step-<step, 8 digits>."""
    return Path(parent) / f"step-{_check_step(step):08d}"


def record_path(parent: str | os.PathLike, step: int) -> Path:
    """parent/COMMITTED-<step, 8 digits>.json."""
    return Path(parent) / f"COMMITTED-{_check_step(step):08d}.json"


def _check_step(step: int) -> int:
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 10**8:
        raise ValueError(f"sharded checkpoint: step must be an int in [0, 10^8), got {step!r}")
    return step


@dataclass(frozen=True)
class FileEntry:
    """One file of a step directory, as the rank that wrote it recorded it."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Commit:
    """A parsed commit record."""

    step: int
    world_size: int
    payload: str  # "dcp" (torch_impl/sharded_ckpt.py) or "npy-records" (the reference's)
    files: tuple[FileEntry, ...]
    path: Path  # the record itself

    @property
    def directory(self) -> Path:
        return self.path.parent / f"step-{self.step:08d}"


def make_fresh(parent: str | os.PathLike, step: int) -> Path:
    """Create step-<step> (and the parent); CheckpointDirectoryError if it exists already:
    NOTE [ A checkpoint exists when its commit record does ] 1."""
    directory = step_dir(parent, step)
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        directory.mkdir()
    except FileExistsError:
        raise CheckpointDirectoryError(
            f"{directory} exists: a sharded checkpoint is written only into a fresh step "
            "directory (remove it if no commit record names it)") from None
    sync_directory(directory.parent)
    return directory


def _open_regular(path: Path, where: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{where}: {path.name} is missing") from None
    except OSError as e:
        raise CheckpointCorruptError(f"{where}: cannot open {path.name}: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointCorruptError(f"{where}: {path.name} is not a regular file")
    return fd


def _sha256(fd: int) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    while chunk := os.read(fd, _CHUNK):
        h.update(chunk)
        size += len(chunk)
    return size, h.hexdigest()


def file_entry(directory: str | os.PathLike, name: str) -> FileEntry:
    """fsync `name` in `directory` and record its size and SHA-256 (step 2 of the NOTE)."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"sharded checkpoint: {name!r} is not a plain file name")
    fd = _open_regular(Path(directory) / name, str(directory))
    try:
        os.fsync(fd)
        size, digest = _sha256(fd)
    finally:
        os.close(fd)
    return FileEntry(name, size, digest)


def commit(parent: str | os.PathLike, step: int, world_size: int, payload: str,
           files: list[FileEntry]) -> Path:
    """Step 3 of the NOTE: check every listed file is there at its recorded size, fsync the
    step directory, then write COMMITTED-<step>.json atomically; return its path."""
    directory = step_dir(parent, step)
    names = [f.name for f in files]
    if not files or len(set(names)) != len(names):
        raise ValueError(f"sharded checkpoint: commit needs distinct files, got {names}")
    for f in files:
        fd = _open_regular(directory / f.name, f"cannot commit {directory}")
        try:
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size != f.size:
            raise CheckpointCorruptError(f"cannot commit {directory}: {f.name} has {size} "
                                         f"bytes, its rank recorded {f.size}")
    sync_directory(directory)
    body = json.dumps({"format": FORMAT, "version": VERSION, "step": step,
                       "world_size": world_size, "payload": payload,
                       "files": [vars(f) for f in files]}, indent=1).encode() + b"\n"
    path = record_path(parent, step)
    atomic_write(path, lambda out: write_all(out.fd, memoryview(body)))
    return path


def _read_json(path: Path, where: str) -> Any:
    """The JSON value of a small regular file (a record, a step's configuration), read with
    no pickle; CheckpointCorruptError past MAX_RECORD_BYTES or when it is not JSON."""
    fd = _open_regular(path, where)
    try:
        if os.fstat(fd).st_size > MAX_RECORD_BYTES:
            raise CheckpointCorruptError(f"{where}: larger than {MAX_RECORD_BYTES} bytes")
        raw = os.read(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointCorruptError(f"{where}: not JSON ({e})") from None


def read_record(path: str | os.PathLike) -> Commit:
    """Parse a commit record (plain JSON, no pickle); CheckpointCorruptError if malformed,
    CheckpointVersionError for another format or version."""
    path = Path(path)
    where = f"commit record {path}"
    match = _RECORD.fullmatch(path.name)
    if match is None:
        raise ValueError(f"{where}: not named COMMITTED-<8 digits>.json")
    data = _read_json(path, where)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointCorruptError(f"{where}: not a {FORMAT} record")
    if data.get("version") != VERSION:
        raise CheckpointVersionError(f"{where}: version {data.get('version')!r}, this code "
                                     f"reads {VERSION}")
    files = data.get("files")
    if (data.get("step") != int(match.group(1)) or not _is_int(data.get("world_size"), 1)
            or not isinstance(data.get("payload"), str) or not isinstance(files, list)
            or not files or not all(_is_entry(f) for f in files)):
        raise CheckpointCorruptError(f"{where}: step (matching its name), world_size, payload "
                                     "and files [{name, size, sha256}] expected")
    names = [f["name"] for f in files]
    if len(set(names)) != len(names):
        raise CheckpointCorruptError(f"{where}: a file is listed twice")
    return Commit(data["step"], data["world_size"], data["payload"],
                  tuple(FileEntry(f["name"], f["size"], f["sha256"]) for f in files), path)


def _is_int(v: Any, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _is_entry(f: Any) -> bool:
    return (isinstance(f, dict) and set(f) == {"name", "size", "sha256"}
            and isinstance(f["name"], str) and bool(_NAME.fullmatch(f["name"]))
            and _is_int(f["size"], 0) and isinstance(f["sha256"], str)
            and re.fullmatch(r"[0-9a-f]{64}", f["sha256"]) is not None)


def verify(record: Commit) -> None:
    """Every file the record names is a regular file of its size and SHA-256, else
    CheckpointCorruptError naming the file (step 4 of the NOTE; before anything parses it)."""
    where = f"checkpoint {record.directory}"
    for f in record.files:
        fd = _open_regular(record.directory / f.name, where)
        try:
            if os.fstat(fd).st_size != f.size:
                raise CheckpointCorruptError(f"{where}: {f.name} has {os.fstat(fd).st_size} "
                                             f"bytes, the commit record says {f.size}")
            _, digest = _sha256(fd)
        finally:
            os.close(fd)
        if digest != f.sha256:
            raise CheckpointCorruptError(f"{where}: {f.name}'s SHA-256 does not match the "
                                         "commit record (changed or torn since it was written)")


def records(parent: str | os.PathLike) -> list[Path]:
    """The commit records in `parent`, newest step first."""
    found = [(int(m.group(1)), p) for p in Path(parent).iterdir()
             if (m := _RECORD.fullmatch(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def newest(parent: str | os.PathLike, payload: str) -> tuple[Commit, list[str]]:
    """The newest commit record of `payload` whose files all verify, and one line per newer
    record passed over (why); CheckpointDirectoryError if none verifies (a foreign or empty
    directory, or every checkpoint damaged)."""
    parent = Path(parent)
    if not parent.is_dir():
        raise CheckpointDirectoryError(f"{parent}: not a directory")
    skipped = []
    for path in records(parent):
        try:
            record = read_record(path)
            if record.payload != payload:
                raise CheckpointVersionError(f"commit record {path}: payload "
                                             f"{record.payload!r}, expected {payload!r}")
            verify(record)
        except (CheckpointCorruptError, CheckpointVersionError) as e:
            skipped.append(str(e))
            continue
        return record, skipped
    detail = "; ".join(skipped) if skipped else "no COMMITTED-<step>.json in it"
    raise CheckpointDirectoryError(f"{parent}: no committed sharded checkpoint ({detail})")


def write_config(directory: str | os.PathLike, config: dict[str, Any]) -> FileEntry:
    """Write the run's configuration as `directory`/config.json (plain JSON, sorted keys,
    by the atomic write) and record it: the commit record lists it beside the ranks' files,
    so a resume reads the configuration it continues only after its digest verified."""
    path = Path(directory) / CONFIG
    body = json.dumps(config, sort_keys=True).encode() + b"\n"
    atomic_write(path, lambda out: write_all(out.fd, memoryview(body)))
    return file_entry(directory, CONFIG)


def read_config(record: Commit) -> dict[str, Any] | None:
    """The configuration a verified record's step directory holds (None: it lists none);
    CheckpointCorruptError if it is not a JSON object."""
    if CONFIG not in {f.name for f in record.files}:
        return None
    config = _read_json(record.directory / CONFIG, f"checkpoint {record.directory}: {CONFIG}")
    if not isinstance(config, dict):
        raise CheckpointCorruptError(f"checkpoint {record.directory}: {CONFIG} is not an object")
    return config


def uncommitted(parent: str | os.PathLike) -> list[Path]:
    """Step directories no commit record names (a save killed before committing): not
    checkpoints; the run that wrote them may remove them."""
    named = {int(m.group(1)) for p in records(parent) if (m := _RECORD.fullmatch(p.name))}
    return sorted(p for p in Path(parent).iterdir() if (m := _STEP_DIR.fullmatch(p.name))
                  and p.is_dir() and not p.is_symlink() and int(m.group(1)) not in named)
