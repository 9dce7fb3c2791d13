"""Complete checkpoints: the reference's payload, "npy-records", in the shared container.

The container (magic, header, payload, trailing XXH3-128 digest), the atomic write, the
directory of a run's checkpoints and the CheckpointError family know neither NumPy nor
torch and live once in the `ckpt` package (NOTE [ Checkpoint file layout ], NOTE [ Atomic
write ], NOTE [ What a run may touch in its directory ]); this module adds how a state
becomes bytes and back:

    8 bytes     J = skeleton length, uint64 little-endian (J <= what the payload holds)
    J bytes     the skeleton: the state as plain JSON, each array replaced by {"__array__": k}
    records     array 0, array 1, ...: NumPy .npy records (a header, then the raw bytes)

Skeleton encoding: dicts with str keys (not starting "__") and lists are JSON as is;
{"__dict__": [[key, value], ...]} a dict with int keys; {"__tuple__": [...]} a tuple;
{"__scalar__": k} a NumPy scalar (stored as a 0-d record); {"__float__": "inf"} a
non-finite float (float.hex / float.fromhex). Python ints are exact at any size (a PCG64
state is 128 bits), finite floats round-trip through repr.

Reading never unpickles and never trusts a length: a record's declared size must fit in
what is left of the payload before a byte of it is used, object dtypes are refused
(NOTE [ No pickle on load ]), and the skeleton may nest at most 3 * ckpt.MAX_DEPTH deep.
Records are written straight from the arrays' memory (no copy) and read with one copy out
of the mapped file.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

import ckpt
from ckpt import (  # the one family, re-exported: reference.resume.CheckpointError is ckpt's
    CheckpointCorruptError,
    CheckpointDirectoryError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointUnsafeError,
    CheckpointVersionError,
    CheckpointWriteError,
    check_matches,
)

__all__ = [
    "PAYLOAD", "WRITER", "CheckpointCorruptError", "CheckpointDirectoryError", "CheckpointError",
    "CheckpointManager", "CheckpointMismatchError", "CheckpointUnsafeError",
    "CheckpointVersionError", "CheckpointWriteError", "check_matches", "decode_state",
    "load_checkpoint", "save_checkpoint", "write_state",
]

PAYLOAD = "npy-records"
WRITER = "reference"

# NOTE [ No pickle on load ]
# Unpickling runs code named by the file (`__reduce__`), so a checkpoint from elsewhere
# could do anything as it loads, digest or not (a crafted file has a valid digest). The
# reference reads .npy records itself, refusing an object dtype before reading its bytes,
# and its metadata as JSON; torch_impl loads with torch.load(weights_only=True), whose
# restricted unpickler accepts only tensors, containers and primitive types. Both refuse
# such a file with CheckpointUnsafeError, and both refuse at save time what could not be
# loaded back this way.


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
        if not (a.flags.c_contiguous or a.flags.f_contiguous):
            a = np.ascontiguousarray(a)
        np.lib.format.write_array_header_1_0(out, np.lib.format.header_data_from_array_1_0(a))
        out.write(memoryview(a.ravel(order="K")).cast("B"))  # the array's own memory


# NOTE [ Record headers ]
# numpy's own reader parses a record's header, a Python dict literal, with ast.literal_eval:
# about 20 us a record, most of a small checkpoint's decode. The headers write_state writes
# (write_array_header_1_0) all have one form, which _HEADER reads in a few microseconds:
#     \x93NUMPY \x01 \x00 | uint16 length | {'descr': '<f4', 'fortran_order': False,
#     'shape': (3, 4), } padded with spaces, then \n
# A header in any other form (version 2.0, a structured dtype, other spacing) goes to
# numpy's reader, which accepts or refuses it as numpy.load would. What _HEADER accepts,
# numpy's reader reads the same way: a simple type string, a bool, a tuple of ints.
_INT = rb"(?:0|[1-9][0-9]*)"  # as a Python literal: no leading zeros
_HEADER = re.compile(rb"\{'descr': '([<>|=]?[a-zA-Z][0-9]*)', 'fortran_order': (True|False), "
                     rb"'shape': \(((?:" + _INT + rb", )*(?:" + _INT + rb",?)?)\), \} *\n")
_MAGIC_1_0 = np.lib.format.magic(1, 0)


def _record_header(reader: ckpt.ViewReader) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of the record header at the reader's position
    (NOTE [ Record headers ]); ValueError if it is not one."""
    start, view = reader.pos, reader.view
    if len(view) - start >= 10 and view[start:start + 8] == _MAGIC_1_0:
        (length,) = struct.unpack_from("<H", view, start + 8)
        match = _HEADER.fullmatch(view[start + 10:start + 10 + length])
        if match:
            descr, fortran, dims = match.groups()
            reader.seek(start + 10 + length)
            return (tuple(int(d) for d in dims.split(b",") if d.strip()), fortran == b"True",
                    np.dtype(descr.decode()))
    version = np.lib.format.read_magic(reader)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    return read_header(reader)


def _read_record(reader: ckpt.ViewReader, where: str) -> np.ndarray:
    """One .npy record at the reader's position, bounds checked, copied out of the file."""
    try:
        shape, fortran_order, dtype = _record_header(reader)
    except (ValueError, TypeError) as e:
        raise CheckpointCorruptError(f"{where}: unreadable array record: {e}") from None
    if dtype.hasobject:
        raise CheckpointUnsafeError(f"{where}: an array record needs pickle to load (object "
                                    "dtype): refused")
    count = math.prod(shape)
    nbytes, left = count * dtype.itemsize, len(reader.view) - reader.pos
    if nbytes > left:
        raise CheckpointCorruptError(f"{where}: an array record declares {nbytes} bytes, the "
                                     f"payload has {left} left")
    flat = np.frombuffer(reader.view, dtype, count, reader.pos).copy() if count else \
        np.empty(0, dtype)
    reader.seek(nbytes, os.SEEK_CUR)
    return flat.reshape(shape[::-1]).T if fortran_order else flat.reshape(shape)


def decode_state(payload: memoryview, where: str) -> Any:
    """The state of an "npy-records" payload (module docstring); never unpickles."""
    reader = ckpt.ViewReader(payload)
    try:
        (skeleton_len,) = struct.unpack("<Q", reader.read(8))
        if skeleton_len > len(payload) - 8:
            raise ValueError(f"length {skeleton_len} exceeds the payload")
        skeleton = json.loads(reader.read(skeleton_len))
    except (struct.error, ValueError, RecursionError) as e:
        raise CheckpointCorruptError(f"{where}: unreadable skeleton: {e}") from None
    ckpt.check_depth(skeleton, where, limit=3 * ckpt.MAX_DEPTH)
    arrays = []
    while reader.pos < len(payload):
        arrays.append(_read_record(reader, where))
    try:
        return _decode(skeleton, arrays)
    except (IndexError, KeyError, TypeError, ValueError) as e:
        raise CheckpointCorruptError(f"{where}: skeleton does not fit the records: {e}") from None


# ---------------------------------------------------------------- save / load


def save_checkpoint(path: str | os.PathLike, state: Mapping[str, Any],
                    meta: Mapping[str, Any] | None = None) -> None:
    """Write `state` to `path` atomically, with its digest; `meta` goes into the header."""
    if not isinstance(state, Mapping):
        raise TypeError(f"save_checkpoint: state must be a mapping, got {type(state).__name__}")
    ckpt.save_container(path, PAYLOAD, WRITER, lambda out: write_state(state, out), meta)


def load_checkpoint(path: str | os.PathLike, *, like: Mapping[str, Any] | None = None
                    ) -> dict[str, Any]:
    """Read, verify and decode a checkpoint; with `like`, also check_matches(state, like)."""
    _, state = ckpt.load_container(path, PAYLOAD, decode_state, "convert it with "
                                   "torch_impl.resume.state_to_reference")
    if like is not None:
        check_matches(state, like)
    return state


def CheckpointManager(directory: str | os.PathLike | Path, keep: int = 3,
                      log: Callable[[str], None] | None = None) -> ckpt.CheckpointDirectory:
    """The run directory (ckpt.CheckpointDirectory) that saves reference checkpoints."""
    return ckpt.CheckpointDirectory(directory, payload=PAYLOAD, save=save_checkpoint,
                                    keep=keep, log=log)
