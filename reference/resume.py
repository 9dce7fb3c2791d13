"""Complete checkpoints: atomic writes, verified reads, no pickle, a directory manager.

A checkpoint is one file (NOTE [ Checkpoint file layout ]):

    offset      bytes  content
    0           8      magic  b"\\x89MTCKPT\\n"
    8           4      H = header length, uint32 little-endian
    12          H      header, UTF-8 JSON: {"format", "version", "payload", "writer"}
    12 + H      P      payload ("npy-records" here, "torch-zip" in torch_impl/resume.py)
    12 + H + P  32     SHA-256 of every byte before it

load verifies the trailing digest before it parses anything, so a truncation or a flipped
bit anywhere (magic, header, payload, digest) is a CheckpointCorruptError, with a
probability of missing it of 2^-256. The digest is integrity, not authenticity: a
deliberately crafted file carries a valid digest, so the payload is ALSO parsed without
pickle (NOTE [ No pickle on load ]).

The reference payload ("npy-records"):

    8 bytes     J = skeleton length, uint64 little-endian
    J bytes     the skeleton: the state as plain JSON, each array replaced by {"__array__": k}
    records     array 0, array 1, ...: NumPy .npy records (np.lib.format), allow_pickle=False

Skeleton encoding: dicts with str keys (not starting "__") and lists are JSON as is;
{"__dict__": [[key, value], ...]} a dict with int keys; {"__tuple__": [...]} a tuple;
{"__scalar__": k} a NumPy scalar (stored as a 0-d record); {"__float__": "inf"} a
non-finite float (float.hex / float.fromhex). Python ints are exact at any size (a PCG64
state is 128 bits), finite floats round-trip through repr.

Writing is atomic (NOTE [ Atomic write ]); `CheckpointManager` keeps the last K files,
finds the newest one that verifies, and removes the temporary files a crash left.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import math
import os
import re
import struct
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"\x89MTCKPT\n"
FORMAT = "mirrortrain-checkpoint"
VERSION = 1
PAYLOAD = "npy-records"
WRITER = "reference"
DIGEST_BYTES = 32
SUFFIX = ".ckpt"
TEMP_SUFFIX = ".tmp"


class CheckpointError(Exception):
    """Base of every error load_checkpoint and save_checkpoint raise."""


class CheckpointCorruptError(CheckpointError):
    """Truncated, bit-flipped or otherwise unreadable: the digest or the layout is wrong."""


class CheckpointVersionError(CheckpointError):
    """A well-formed checkpoint of a format version (or payload kind) this code cannot read."""


class CheckpointMismatchError(CheckpointError):
    """A valid checkpoint that does not fit the model/config it is being loaded into."""


class CheckpointUnsafeError(CheckpointError):
    """A checkpoint whose payload would need pickle (arbitrary code) to load: refused."""


class CheckpointWriteError(CheckpointError, OSError):
    """Writing failed (disk full, ...); the previous file at the path is untouched."""


# NOTE [ Checkpoint file layout ]
# Both trees write the same container (magic, header, payload, trailing SHA-256 over all of
# it) and differ only in the payload. The digest covers the header too, so a flip that
# happens to turn "version": 1 into another valid number is still "corrupt", not "a newer
# version". torch.load alone would not notice damage: it does not verify the CRC-32s of
# its zip members, so a flipped byte inside a tensor loads silently with another value
# (tests/test_resume_torch.py shows it).


def _head(payload_kind: str, writer: str) -> bytes:
    header = json.dumps({"format": FORMAT, "version": VERSION, "payload": payload_kind,
                         "writer": writer}, sort_keys=True).encode()
    return MAGIC + struct.pack("<I", len(header)) + header


def encode_container(payload: bytes, payload_kind: str, writer: str) -> bytes:
    """magic | header length | header JSON | payload | sha256 of all before (in memory)."""
    body = _head(payload_kind, writer) + payload
    return body + hashlib.sha256(body).digest()


class HashingWriter:
    """A write-only file over a descriptor that SHA-256s every byte on its way to disk.

    The container is streamed through it (no copy of the payload is assembled in memory),
    and the digest it has accumulated is written last.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.sha256 = hashlib.sha256()
        self.error: OSError | None = None  # a serializer may wrap it in its own exception

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        try:
            _write_all(self.fd, view)
        except OSError as e:
            self.error = e
            raise
        return view.nbytes

    def flush(self) -> None:
        pass


def decode_container(data: bytes, where: str) -> tuple[dict[str, Any], memoryview]:
    """(header, payload) of a container whose digest verifies; CheckpointCorruptError if not."""
    fixed = len(MAGIC) + 4
    if len(data) < fixed + DIGEST_BYTES:
        raise CheckpointCorruptError(f"{where}: {len(data)} bytes is shorter than an empty "
                                     f"checkpoint ({fixed + DIGEST_BYTES}): truncated")
    body, digest = memoryview(data)[:-DIGEST_BYTES], data[-DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointCorruptError(f"{where}: SHA-256 of the content does not match the "
                                     "stored digest: truncated or corrupted")
    if bytes(body[: len(MAGIC)]) != MAGIC:
        raise CheckpointCorruptError(f"{where}: not a mirrortrain checkpoint (bad magic)")
    (header_len,) = struct.unpack("<I", body[len(MAGIC):fixed])
    try:
        header = json.loads(bytes(body[fixed:fixed + header_len]))
    except ValueError as e:
        raise CheckpointCorruptError(f"{where}: unreadable header: {e}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointCorruptError(f"{where}: header is not a {FORMAT} header: {header!r}")
    if header.get("version") != VERSION:
        raise CheckpointVersionError(f"{where}: format version {header.get('version')!r}; "
                                     f"this code reads version {VERSION} only")
    return header, body[fixed + header_len:]


# NOTE [ Atomic write ]
# 1. write the whole file to a temporary name IN THE SAME DIRECTORY (os.replace is atomic
#    only within one filesystem), 2. flush and fsync it (its bytes are on the disk before
#    its name is), 3. os.replace onto the final name (readers see the old file or the new
#    one, never a mix), 4. fsync the directory (the rename itself survives a power cut).
# On any failure (ENOSPC, EIO, an interrupt) the temporary file is removed and the error
# re-raised; a SIGKILL between 1 and 3 leaves only a temporary file, which
# CheckpointManager.cleanup() removes. Writing goes through os.write so that the disk-full
# tests can make it fail halfway.


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]


def atomic_write(path: str | os.PathLike, write: Callable[[HashingWriter], None]) -> None:
    """Run `write(writer)` into a temporary file, then commit it to `path` atomically and
    durably (NOTE [ Atomic write ])."""
    path = Path(path)
    directory = path.parent
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    writer = HashingWriter(fd)
    try:
        try:
            write(writer)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        # torch.save reports a failed write as RuntimeError: the writer kept the OSError
        cause = e if isinstance(e, OSError) else writer.error
        if cause is not None:
            raise CheckpointWriteError(
                cause.errno or errno.EIO, f"save_checkpoint: writing {path} failed ({cause}); "
                f"the previous file at that path, if any, is untouched") from e
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# ---------------------------------------------------------------- payload


def _encode(value: Any, arrays: list[np.ndarray], path: str) -> Any:
    """The JSON skeleton of `value`; arrays are appended to `arrays`."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": value.hex()}
    if isinstance(value, np.ndarray | np.generic):
        a = np.asarray(value)
        if a.dtype.hasobject:
            raise TypeError(f"save_checkpoint: {path or 'state'} is an object array; only "
                            "plain numeric arrays are stored (NOTE [ No pickle on load ])")
        arrays.append(a)
        return {"__scalar__" if isinstance(value, np.generic) else "__array__": len(arrays) - 1}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, arrays, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, arrays, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        for k in value:
            if not isinstance(k, str | int) or isinstance(k, bool):
                raise TypeError(f"save_checkpoint: key {k!r} in {path or 'state'} is a "
                                f"{type(k).__name__}; keys must be str or int")
        items = {k: _encode(v, arrays, f"{path}/{k}" if path else str(k))
                 for k, v in value.items()}
        if all(isinstance(k, str) and not k.startswith("__") for k in items):
            return items
        return {"__dict__": [[k, v] for k, v in items.items()]}
    raise TypeError(f"save_checkpoint: {path or 'state'} is a {type(value).__name__}; a "
                    "checkpoint holds dicts, lists, tuples, arrays, numbers, str and None")


def _decode(node: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(node, list):
        return [_decode(v, arrays) for v in node]
    if not isinstance(node, dict):
        return node
    if "__array__" in node:
        return arrays[node["__array__"]]
    if "__scalar__" in node:
        return arrays[node["__scalar__"]][()]
    if "__float__" in node:
        return float.fromhex(node["__float__"])
    if "__tuple__" in node:
        return tuple(_decode(v, arrays) for v in node["__tuple__"])
    if "__dict__" in node:
        return {k: _decode(v, arrays) for k, v in node["__dict__"]}
    return {k: _decode(v, arrays) for k, v in node.items()}


def write_state(state: Mapping[str, Any], out: Any) -> None:
    """Write the "npy-records" payload of a state to the file-like `out`."""
    arrays: list[np.ndarray] = []
    skeleton = json.dumps(_encode(state, arrays, ""), allow_nan=False).encode()
    out.write(struct.pack("<Q", len(skeleton)))
    out.write(skeleton)
    for a in arrays:
        np.lib.format.write_array(out, a, allow_pickle=False)


def encode_state(state: Mapping[str, Any]) -> bytes:
    """The "npy-records" payload of a state (nested dicts of arrays and plain values)."""
    buf = io.BytesIO()
    write_state(state, buf)
    return buf.getvalue()


# NOTE [ No pickle on load ]
# Unpickling runs code named by the file (`__reduce__`), so a checkpoint from elsewhere
# could do anything as it loads. The reference reads .npy records with allow_pickle=False
# (an object-dtype record raises instead of unpickling) and its metadata as JSON; torch_impl
# loads with torch.load(weights_only=True), whose restricted unpickler accepts only tensors,
# containers and primitive types. Both refuse such a file with CheckpointUnsafeError, and
# both refuse at save time what could not be loaded back this way.


def decode_state(payload: bytes, where: str) -> dict[str, Any]:
    """The state of an "npy-records" payload; refuses object arrays (pickle)."""
    buf = io.BytesIO(payload)
    try:
        (skeleton_len,) = struct.unpack("<Q", buf.read(8))
        skeleton = json.loads(buf.read(skeleton_len))
    except (struct.error, ValueError) as e:
        raise CheckpointCorruptError(f"{where}: unreadable skeleton: {e}") from None
    arrays = []
    while buf.tell() < len(payload):
        try:
            arrays.append(np.lib.format.read_array(buf, allow_pickle=False))
        except ValueError as e:
            if "allow_pickle" in str(e):
                raise CheckpointUnsafeError(f"{where}: an array record needs pickle to load "
                                            "(object dtype): refused") from None
            raise CheckpointCorruptError(f"{where}: unreadable array record: {e}") from None
    try:
        return _decode(skeleton, arrays)
    except (IndexError, KeyError, TypeError, ValueError) as e:
        raise CheckpointCorruptError(f"{where}: skeleton does not fit the records: {e}") from None


# ---------------------------------------------------------------- save / load


def save_checkpoint(path: str | os.PathLike, state: Mapping[str, Any]) -> None:
    """Write `state` to `path` atomically, with its digest (module docstring)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"save_checkpoint: state must be a mapping, got {type(state).__name__}")
    def write(w: HashingWriter) -> None:
        w.write(_head(PAYLOAD, WRITER))
        write_state(state, w)
        w.write(w.sha256.digest())

    atomic_write(path, write)


def load_checkpoint(path: str | os.PathLike, *, like: Mapping[str, Any] | None = None
                    ) -> dict[str, Any]:
    """Read, verify and decode a checkpoint; with `like`, also check_matches(state, like)."""
    where = f"load_checkpoint({os.fspath(path)!r})"
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise CheckpointCorruptError(f"{where}: cannot read: {e}") from e
    header, payload = decode_container(data, where)
    if header.get("payload") != PAYLOAD:
        raise CheckpointVersionError(
            f"{where}: payload {header.get('payload')!r} written by {header.get('writer')!r}; "
            f"the reference reads {PAYLOAD!r} (convert with torch_impl.resume.state_to_reference)")
    state = decode_state(payload, where)
    if like is not None:
        check_matches(state, like)
    return state


def _describe(v: Any) -> str:
    if isinstance(v, np.ndarray | np.generic):
        return f"array {tuple(np.shape(v))} {np.asarray(v).dtype}"
    return f"{type(v).__name__} {v!r}"


def check_matches(state: Mapping[str, Any], like: Mapping[str, Any], path: str = "") -> None:
    """CheckpointMismatchError naming the first key where `state` does not fit `like`.

    Only the keys of `like` are checked, recursively: mappings must have the same keys,
    arrays the same shape and dtype, every other value must be equal (configuration).
    """
    if not isinstance(state, Mapping):
        raise CheckpointMismatchError(f"{path or 'state'}: checkpoint has {_describe(state)}, "
                                      "expected a mapping")
    for key in like:
        here = f"{path}/{key}" if path else str(key)
        if key not in state:
            raise CheckpointMismatchError(f"{here}: missing from the checkpoint")
        a, b = state[key], like[key]
        if isinstance(b, Mapping):
            check_matches(a, b, here)
            extra = sorted(map(str, set(a) - set(b)))
            if extra:
                raise CheckpointMismatchError(f"{here}/{extra[0]}: in the checkpoint but not "
                                              "in what it is loaded into")
        elif isinstance(b, np.ndarray | np.generic):
            if (not isinstance(a, np.ndarray | np.generic) or np.shape(a) != np.shape(b)
                    or np.asarray(a).dtype != np.asarray(b).dtype):
                raise CheckpointMismatchError(f"{here}: checkpoint has {_describe(a)}, the "
                                              f"model has {_describe(b)}")
        elif a != b:
            raise CheckpointMismatchError(f"{here}: checkpoint has {_describe(a)}, "
                                          f"expected {_describe(b)}")


# ---------------------------------------------------------------- a directory of checkpoints

_NAME = re.compile(r"^ckpt-(\d{8,})\.ckpt$")


@dataclass
class CheckpointManager:
    """Checkpoints `ckpt-<step>.ckpt` in one directory: save, keep the last `keep`, resume.

    `latest_valid()` walks from the newest step down and returns the first file that loads
    and verifies; every file it had to skip is recorded in `skipped` as (path, error).
    """

    directory: Path
    keep: int = 3
    skipped: list[tuple[Path, CheckpointError]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        if self.keep < 1:
            raise ValueError(f"CheckpointManager: keep must be >= 1, got {self.keep}")
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, step: int) -> Path:
        return self.directory / f"ckpt-{step:08d}{SUFFIX}"

    def checkpoints(self) -> list[tuple[int, Path]]:
        """(step, path) of every checkpoint file, oldest first."""
        found = [(int(m.group(1)), p) for p in self.directory.iterdir()
                 if (m := _NAME.match(p.name))]
        return sorted(found)

    def save(self, step: int, state: Mapping[str, Any]) -> Path:
        """save_checkpoint at this step's name, then delete all but the newest `keep`."""
        path = self.path(step)
        save_checkpoint(path, state)
        for _, old in self.checkpoints()[: -self.keep]:
            old.unlink(missing_ok=True)
        return path

    def latest_valid(self, like: Mapping[str, Any] | None = None
                     ) -> tuple[Path, dict[str, Any]] | None:
        """(path, state) of the newest checkpoint that verifies, or None; skips are recorded."""
        self.skipped = []
        for _, path in reversed(self.checkpoints()):
            try:
                return path, load_checkpoint(path, like=like)
            except (CheckpointCorruptError, CheckpointVersionError, CheckpointUnsafeError) as e:
                self.skipped.append((path, e))
        return None

    def cleanup(self) -> list[Path]:
        """Remove the temporary files an interrupted save left behind; return them.

        Call it when no other process is saving into the directory (at startup).
        """
        removed = []
        for p in self.directory.iterdir():
            if p.name.startswith(".ckpt-") and p.name.endswith(TEMP_SUFFIX):
                p.unlink(missing_ok=True)
                removed.append(p)
        return removed
