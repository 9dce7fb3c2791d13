"""Complete checkpoints in PyTorch. See reference/resume.py for the file layout and protocol.

The container (magic, header, payload, trailing SHA-256) and the atomic write are the
reference's, line for line (NOTE [ Checkpoint file layout ], NOTE [ Atomic write ] there).
What differs:

- the payload is "torch-zip": the bytes `torch.save(state)` writes, read back with
  `torch.load(weights_only=True, map_location="cpu")` (NOTE [ No pickle on load ]).
  torch.load does NOT check the CRC-32 of its zip members: without the outer digest a
  flipped byte inside a tensor's data loads as a different value, silently.
- the state holds tensors where the reference holds arrays; torch.Generator states are
  uint8 tensors (`get_state()`), so they need no special case.
- `state_to_reference` / `state_from_reference`: the lossless mapping between the two trees'
  complete training states (NOTE [ Cross-implementation mapping ]).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import re
import struct
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torch_impl.nn import state_dict_from_torch, state_dict_to_torch
from torch_impl.optim import (
    optimizer_state_from_torch,
    optimizer_state_to_torch,
    scheduler_state_from_torch,
    scheduler_state_to_torch,
)

MAGIC = b"\x89MTCKPT\n"
FORMAT = "mirrortrain-checkpoint"
VERSION = 1
PAYLOAD = "torch-zip"
WRITER = "torch_impl"
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


def _check_storable(value: Any, path: str) -> None:
    """TypeError unless torch.load(weights_only=True) can read `value` back."""
    if value is None or isinstance(value, bool | int | float | str | torch.Tensor):
        return
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_storable(v, f"{path}[{i}]")
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str | int) or isinstance(k, bool):
                raise TypeError(f"save_checkpoint: key {k!r} in {path or 'state'} is a "
                                f"{type(k).__name__}; keys must be str or int")
            _check_storable(v, f"{path}/{k}" if path else str(k))
        return
    raise TypeError(f"save_checkpoint: {path or 'state'} is a {type(value).__name__}; a "
                    "checkpoint holds dicts, lists, tuples, tensors, numbers, str and None "
                    "(what torch.load(weights_only=True) reads back)")


def write_state(state: Mapping[str, Any], out: Any) -> None:
    """Write the "torch-zip" payload (torch.save's bytes) to the file-like `out`, after
    checking that every leaf loads back with weights_only=True."""
    _check_storable(state, "")
    torch.save(dict(state), out)


def encode_state(state: Mapping[str, Any]) -> bytes:
    """The "torch-zip" payload of a state, in memory."""
    buf = io.BytesIO()
    write_state(state, buf)
    return buf.getvalue()


def decode_state(payload: bytes, where: str) -> dict[str, Any]:
    """The state of a "torch-zip" payload via torch.load(weights_only=True): no pickle code."""
    try:
        state = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        raise CheckpointUnsafeError(f"{where}: the payload needs pickle beyond tensors and "
                                    f"plain containers to load: refused ({e})") from None
    except (RuntimeError, EOFError, ValueError) as e:
        raise CheckpointCorruptError(f"{where}: unreadable torch payload: {e}") from None
    if not isinstance(state, dict):
        raise CheckpointCorruptError(f"{where}: payload is a {type(state).__name__}, not a dict")
    return state


# ---------------------------------------------------------------- save / load


def save_checkpoint(path: str | os.PathLike, state: Mapping[str, Any]) -> None:
    """Write `state` to `path` atomically, with its digest (reference/resume.py)."""
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
            f"torch_impl reads {PAYLOAD!r} (convert with state_from_reference)")
    state = decode_state(payload, where)
    if like is not None:
        check_matches(state, like)
    return state


def _describe(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"tensor {tuple(v.shape)} {v.dtype}"
    return f"{type(v).__name__} {v!r}"


def check_matches(state: Mapping[str, Any], like: Mapping[str, Any], path: str = "") -> None:
    """CheckpointMismatchError naming the first key where `state` does not fit `like`.

    Only the keys of `like` are checked, recursively: mappings must have the same keys,
    tensors the same shape and dtype, every other value must be equal (configuration).
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
        elif isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
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


# ---------------------------------------------------------------- across implementations

# NOTE [ Cross-implementation mapping ]
# A complete training state (reference/train.py, torch_impl/train.py) has the keys
#   config, step, epoch, model, optimizer, scheduler, scaler, data, rng.
# Mapped losslessly, bit for bit:
#   model      same keys and (out, in) layouts: torch_impl.nn.state_dict_{to,from}_torch
#   optimizer  same structure; torch adds its kernel switches (foreach, fused, ...):
#              torch_impl.optim.optimizer_state_{to,from}_torch
#   scheduler  torch adds `_get_lr_called_within_step`: scheduler_state_{to,from}_torch
#   scaler     plain numbers (scale, growth tracker, factors, interval): copied
#   data       the sampler's (seed, num_samples, epoch, position): plain ints, copied; the
#              order itself is a hash both trees compute (NOTE [ Counter-based hashing
#              instead of a Generator ] in reference/data.py)
#   config, fingerprint, step, epoch, skipped: plain values, copied
# NOT mapped: rng. numpy's PCG64 and torch's Mersenne Twister / Philox are different
# generators; no state of one reproduces the other's stream. The mapped state carries
# rng = None, and a loop resuming it keeps the streams it was built with (train.py: seeded
# from the config's seed): the same parameters, optimizer, schedule, scaler and data
# position, but from then on other dropout masks, so not the same run unless dropout is off.


def _arrays_to_tensors(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return torch.from_numpy(np.array(value, copy=True))
    if isinstance(value, Mapping):
        return {k: _arrays_to_tensors(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_arrays_to_tensors(v) for v in value)
    return value


def _tensors_to_arrays(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy()
    if isinstance(value, Mapping):
        return {k: _tensors_to_arrays(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_tensors_to_arrays(v) for v in value)
    return value


MAPPED_KEYS = ("config", "step", "epoch", "model", "optimizer", "scheduler", "scaler", "data")
CONVERTED = ("model", "optimizer", "scheduler", "scaler", "rng")


def _plain(state: Mapping[str, Any]) -> dict[str, Any]:
    """Every entry but the converted ones, copied (config, counters, data, fingerprint...)."""
    return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in state.items()
            if k not in CONVERTED}


def state_from_reference(ref_state: Mapping[str, Any]) -> dict[str, Any]:
    """A reference training state as torch_impl's (NOTE [ Cross-implementation mapping ])."""
    missing = [k for k in MAPPED_KEYS if k not in ref_state]
    if missing:
        raise ValueError(f"state_from_reference: missing keys {missing}")
    optimizer = ref_state["config"]["optimizer"]
    return {
        **_plain(ref_state),
        "model": state_dict_to_torch(ref_state["model"]),
        "optimizer": optimizer_state_to_torch(ref_state["optimizer"], optimizer),
        "scheduler": scheduler_state_to_torch(ref_state["scheduler"]),
        "scaler": _arrays_to_tensors(ref_state["scaler"]),
        "rng": None,
    }


def state_to_reference(torch_state: Mapping[str, Any]) -> dict[str, Any]:
    """A torch_impl training state as the reference's (NOTE [ Cross-implementation mapping ])."""
    missing = [k for k in MAPPED_KEYS if k not in torch_state]
    if missing:
        raise ValueError(f"state_to_reference: missing keys {missing}")
    return {
        **_plain(torch_state),
        "model": state_dict_from_torch(torch_state["model"]),
        "optimizer": optimizer_state_from_torch(torch_state["optimizer"]),
        "scheduler": scheduler_state_from_torch(torch_state["scheduler"]),
        "scaler": _tensors_to_arrays(torch_state["scaler"]),
        "rng": None,
    }
