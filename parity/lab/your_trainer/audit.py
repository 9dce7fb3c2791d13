"""Loading a checkpoint someone else wrote, without running its pickle: see
parity/lab/audit_recognize.py for what is then read out of it.

`torch.load(f, weights_only=True, map_location="cpu")` is the only load: its unpickler builds
tensors and plain containers and refuses any other global. A refusal is an answer, never a
reason to retry with weights_only=False: `load_safely` returns it with the globals the
error names (a legacy `np.random.get_state()` names numpy's `_reconstruct`). Only the two
formats torch.save writes are offered to torch.load: its zip (b"PK\\x03\\x04") and the legacy
pickle that opens with torch's magic number. Any other pickle is refused unread (the
weights-only unpickler would parse it, but a file that is not torch.save's is not a torch
checkpoint); anything else is not a checkpoint.

`allow` widens the weights-only allowlist for one load, through
`torch.serialization.safe_globals`, and for nothing else: Hugging Face's rng_state.pth holds
`np.random.get_state()`, whose array needs exactly NUMPY_ARRAY (numpy's `_reconstruct`,
`ndarray`, `dtype` and the uint32 dtype's class; none of them runs code of the file's
choosing), the list Trainer itself loads it with.
"""

from __future__ import annotations

import os
import pickle
import re
import stat
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

ZIP_MAGIC = b"PK\x03\x04"
# torch.save's legacy format: pickle protocol 2, then the LONG1 0x1950a86a20f9469cfc6c
LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
PICKLE_OPCODE = 0x80  # PROTO: the first byte of a pickle of protocol 2 or later
# what an ndarray inside a weights_only load needs (a uint32 array: np.random.get_state())
NUMPY_ARRAY = (np._core.multiarray._reconstruct, np.ndarray, np.dtype,
               type(np.dtype(np.uint32)))
_GLOBAL = re.compile(r"GLOBAL ([A-Za-z_][\w.]*)")


class NotACheckpoint(Exception):
    """The file is not one torch.save wrote, or is damaged (truncated, overwritten)."""


@dataclass(frozen=True)
class Loaded:
    """What weights_only loading gave: the value, or why it was refused (`refused`), with
    the globals the refusal names (`needs`)."""

    value: Any = None
    refused: str | None = None
    needs: tuple[str, ...] = ()


def file_kind(head: bytes) -> str:
    """"zip", "legacy" (both torch.save's), "pickle" (another pickle) or "other"."""
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if head.startswith(LEGACY_MAGIC):
        return "legacy"
    if head[:1] == bytes([PICKLE_OPCODE]):
        return "pickle"
    return "other"


def load_safely(path: str | os.PathLike, allow: tuple[Any, ...] = ()) -> Loaded:
    """`path` loaded with weights_only=True on the CPU (its allowlist widened by `allow`),
    or the refusal; NotACheckpoint for a file torch.save did not write or that is damaged
    (one line saying which)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise NotACheckpoint(f"{path}: not a regular file")
    with open(path, "rb") as f:
        head = f.read(len(LEGACY_MAGIC))
    kind = file_kind(head)
    if kind == "other":
        raise NotACheckpoint(f"{path}: not a torch checkpoint (neither torch.save's zip nor "
                             "its legacy format, nor a pickle)")
    if kind == "pickle":
        return Loaded(refused="a plain pickle, not torch.save's format: it cannot be read "
                              "without running pickle")
    try:
        # a zip's storages are mapped, not read: a 10 GB checkpoint is audited in place
        with torch.serialization.safe_globals(list(allow)):
            return Loaded(torch.load(path, weights_only=True, map_location="cpu",
                                     mmap=kind == "zip"))
    except pickle.UnpicklingError as e:
        needs = tuple(dict.fromkeys(_GLOBAL.findall(str(e))))
        if needs:
            return Loaded(refused="weights_only=True refuses it: it needs pickle", needs=needs)
        return Loaded(refused=f"weights_only=True refuses it: {_first_line(e)}")
    except Exception as e:  # torch's zip reader: RuntimeError, EOFError, ...
        damage = "truncated or damaged" if kind == "zip" else "damaged"
        raise NotACheckpoint(f"{path}: a torch.save file, {damage}: {type(e).__name__}: "
                             f"{_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:200] if lines else type(e).__name__
