"""Atomic, durable writes of one file, and the probe that finds an unwritable directory early.

Every system call goes through this module's `os` (open, write, fsync, close, replace,
unlink), so a test can record their order or make any one of them fail
(tests/test_resume_atomic.py).
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckpt import digest
from ckpt.errors import CheckpointWriteError

TEMP_SUFFIX = ".tmp"  # temporary names: "." + final name + "." + 8 hex digits + TEMP_SUFFIX

# NOTE [ Atomic write ]
# 1. write the whole file to a temporary name IN THE SAME DIRECTORY (os.replace is atomic
#    only within one filesystem), 2. fsync it (its bytes are on the disk before its name
#    is), 3. close it, 4. os.replace onto the final name (readers see the old file or the new
#    one, never a mix), 5. fsync the directory (the rename itself survives a power cut).
# On any failure before 4 (ENOSPC, EIO, an interrupt) the temporary file is unlinked, the
# final name is untouched, and CheckpointWriteError names the FINAL path (the temporary
# name means nothing to the user). A failure at 5 leaves the new file in place and says
# that its rename may not be durable. A SIGKILL between 1 and 4 leaves only a temporary
# file, which the next run's directory cleanup removes. SIGTERM and Ctrl-C are exceptions
# raised wherever the interpreter next checks for signals, which may be the instant the
# open returns, before its descriptor is even stored: the cleanup region therefore starts
# AT the open, and removes the temporary name whether or not a descriptor was kept.


class HashingWriter:
    """A write-only file over a descriptor that digests every byte on its way to disk.

    The payload is streamed through it (no copy of it is assembled in memory; torch.save
    hands over each tensor's own memory) and the digest it has accumulated is written last
    (writer.write_container). Each write is hashed on this thread, then written: XXH3
    costs about a twentieth of writing the same bytes into the page cache (NOTE [ Container
    digest ]), too little to be worth a helper thread. Every byte is hashed once and copied
    never.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.hasher = digest.new()
        self.error: OSError | None = None  # a serializer may wrap it in its own exception
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.hasher.update(view)
        try:
            write_all(self.fd, view)
        except OSError as e:
            self.error = e
            raise
        self.size += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        pass


def write_all(fd: int, data: memoryview) -> None:
    """os.write until every byte is written (a write may be partial)."""
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _write_error(path: Path, cause: OSError, what: str, tail: str = "") -> CheckpointWriteError:
    code = cause.errno or errno.EIO
    return CheckpointWriteError(code, f"{what} {path}: {os.strerror(code)}{tail}")


def temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def atomic_write(path: str | os.PathLike, write: Callable[[HashingWriter], None]) -> int:
    """Run `write(writer)` into a temporary file, then commit it to `path` atomically and
    durably (NOTE [ Atomic write ]); return the number of bytes written."""
    path = Path(path)
    tmp = temp_name(path)
    flags = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
             | getattr(os, "O_NOFOLLOW", 0))
    fd: int | None = None
    writer: HashingWriter | None = None
    try:  # one region from the open on: a signal handled as the open returns is inside it
        fd = os.open(tmp, flags, 0o644)
        writer = HashingWriter(fd)
        try:
            write(writer)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        if fd is None and isinstance(e, OSError):  # the open failed: no file of ours exists
            raise _write_error(path, e, "cannot write checkpoint") from None
        try:  # an interrupt just after the open returned leaves fd unset and the file there
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        # torch.save reports a failed write as RuntimeError: the writer kept the OSError
        cause = e if isinstance(e, OSError) else writer.error if writer else None
        if cause is not None:
            raise _write_error(path, cause, "cannot write checkpoint", "; the previous file at "
                               "that path, if any, is untouched") from e
        raise
    try:
        sync_directory(path.parent)
    except OSError as e:
        raise _write_error(path, e, "wrote checkpoint", " while syncing its directory: the "
                           "file is complete but its rename may not survive a power cut") from e
    return writer.size


def sync_directory(directory: Path) -> None:
    """fsync a directory: the names created or replaced in it become durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def probe(directory: str | os.PathLike) -> None:
    """CheckpointWriteError naming `directory` unless a file can be created, written, synced
    and removed in it (read-only filesystem, no permission, a full disk): found before a
    run trains, not at its first checkpoint."""
    directory = Path(directory)
    tmp = directory / f".ckpt-probe.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                     0o644)
        try:
            write_all(fd, memoryview(b"probe"))
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(tmp)
    except OSError as e:
        raise _write_error(directory, e, "cannot write checkpoints in") from None
