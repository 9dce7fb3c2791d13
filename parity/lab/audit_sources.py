"""Reading what `python -m parity audit FILE` is given, safely, into one object tree for
parity/lab/audit_recognize.py: a torch.save file (a dict, a Lightning `.ckpt`), an
Accelerate `save_state` folder (one entry per file), or this project's own container.

Nothing here runs a pickle. torch.save files go through torch_impl.audit.load_safely
(weights_only=True); a `.pkl` file is not loaded at all: its opcodes are read with
pickletools (which parses, never executes) for the globals it would import and the names it
holds. `model.safetensors` is read from its header alone (8 bytes little-endian length N,
then N bytes of JSON {name: {"dtype", "shape", "data_offsets"}}): no safetensors library.
"""

from __future__ import annotations

import io
import json
import os
import pickletools
import stat
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ckpt
from ckpt.container import MAGIC_V2
from common.train_loop import INVENTORY
from parity.lab.audit_recognize import Audit, Unloadable, recognize

MAX_HEADER = 100 << 20  # safetensors' own limit on its JSON header
MAX_PICKLE = 64 << 20  # RNG and sampler pickles are kilobytes; a larger one is not read
ACCELERATE_FILES = ("model.safetensors", "pytorch_model.bin", "optimizer.bin", "scheduler.bin",
                    "scaler.pt", "random_states_0.pkl", "sampler.bin")
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                      "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                      "BOOL": "bool"}


class AuditInputError(Exception):
    """What was given cannot be audited: a missing path, a file that is no checkpoint, a
    damaged one, a folder of an unsupported layout (one line saying which)."""


@dataclass(frozen=True)
class TensorInfo:
    """A tensor known from a header: its dtype and shape, no data."""

    dtype: str
    shape: tuple[int, ...]


def safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """name -> TensorInfo of a .safetensors file, from its header alone."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise AuditInputError(f"{path}: a .safetensors file shorter than its 8-byte header "
                                  "length")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or 8 + n > size:
            raise AuditInputError(f"{path}: its header length {n} exceeds the file "
                                  f"({size} bytes) or safetensors' 100 MB limit")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise AuditInputError(f"{path}: its header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise AuditInputError(f"{path}: its header is not a JSON object")
    return {k: TensorInfo(SAFETENSORS_DTYPES.get(v.get("dtype"), str(v.get("dtype"))),
                          tuple(v.get("shape", ())))
            for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def pickle_names(data: bytes) -> tuple[tuple[str, ...], frozenset[str]]:
    """(globals, strings) a pickle mentions, read by pickletools.genops: nothing is run. A
    pickle cut short or malformed gives what was read before the damage."""
    needs: list[str] = []
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(io.BytesIO(data)):
            if op.name in ("GLOBAL", "INST"):
                needs.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                needs.append(f"{strings[-2]}.{strings[-1]}")
            elif isinstance(arg, str):
                strings.append(arg)
    except Exception:  # damage ends the reading; what was read stands
        pass
    return tuple(dict.fromkeys(needs)), frozenset(strings)


def _pickle_of(path: Path) -> bytes:
    """The pickle inside `path`: a torch.save zip's data.pkl, or the file itself."""
    if path.stat().st_size > MAX_PICKLE:
        return b""
    raw = path.read_bytes()
    if raw.startswith(b"PK\x03\x04"):
        try:
            zf = zipfile.ZipFile(io.BytesIO(raw))
            name = next(n for n in zf.namelist() if n.endswith("data.pkl"))
            if zf.getinfo(name).file_size <= MAX_PICKLE:
                return zf.read(name)
        except (zipfile.BadZipFile, StopIteration, KeyError, OSError):
            pass
        return b""
    return raw


def unloadable(path: Path, reason: str, needs: tuple[str, ...] = ()) -> Unloadable:
    """An Unloadable for `path`, with what its pickle names."""
    found, names = pickle_names(_pickle_of(path))
    return Unloadable(reason, needs or found, names)


def _torch_file(path: Path) -> Any:
    from torch_impl.audit import NotACheckpoint, load_safely

    try:
        loaded = load_safely(path)
    except NotACheckpoint as e:
        raise AuditInputError(str(e)) from None
    if loaded.refused is not None:
        return unloadable(path, loaded.refused, loaded.needs)
    return loaded.value


def audit_path(text: str) -> Audit:
    """The Audit of the file or folder `text`; AuditInputError when it cannot be read."""
    path = Path(text)
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise AuditInputError(f"{text}: {e.strerror.lower()}") from None
    if stat.S_ISDIR(mode):
        return _folder(path)
    if not stat.S_ISREG(mode):
        raise AuditInputError(f"{text}: not a regular file or a folder")
    try:
        with open(path, "rb") as f:
            head = f.read(len(ckpt.MAGIC))
    except OSError as e:
        raise AuditInputError(f"{text}: cannot be read ({e.strerror})") from None
    if head in (ckpt.MAGIC, MAGIC_V2):
        return _mirrortrain(path)
    value = _torch_file(path)
    if isinstance(value, Unloadable):
        audit = Audit("torch.save file", refused=value.reason, needs=value.needs)
        if any("numpy" in g for g in value.needs):
            audit.flags.append("a numpy global: the usual cause is a legacy "
                               "np.random.get_state() (an ndarray inside a tuple); save "
                               "np.random.default_rng(...).bit_generator.state instead")
        return audit
    return recognize(value)


def _mirrortrain(path: Path) -> Audit:
    """This project's container (ckpt/): verified, decoded by the tree that wrote it."""
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
    audit = recognize(state, f"mirrortrain checkpoint ({payload}, written by {tree})",
                      generator="torch" if payload == "torch-zip" else "numpy")
    lacks = [item for item in INVENTORY if item not in state]
    audit.flags.append("this project's inventory (common/train_loop.py): "
                       + (f"{', '.join(INVENTORY)}, all there" if not lacks
                          else f"lacks {', '.join(lacks)}"))
    return audit


def _folder(path: Path) -> Audit:
    names = {p.name for p in path.iterdir()}
    if ".metadata" in names:
        raise AuditInputError(f"{path}: a torch.distributed.checkpoint (DCP) folder; not "
                              "supported (pass a torch.save file or an Accelerate folder)")
    if not names & set(ACCELERATE_FILES) and not any(
            n.startswith(("model", "pytorch_model", "optimizer", "random_states")) for n in names):
        mine = sorted((int(n[5:-5]), n) for n in names
                      if n.startswith("ckpt-") and n.endswith(".ckpt") and n[5:-5].isdigit())
        if mine:  # a mirrortrain run directory: its newest checkpoint
            audit = _mirrortrain(path / mine[-1][1])
            audit.kind += f", the newest of {len(mine)} in the folder: {mine[-1][1]}"
            return audit
        raise AuditInputError(f"{path}: a folder without an Accelerate save_state's files "
                              f"({', '.join(ACCELERATE_FILES)}) or ckpt-<step>.ckpt files")
    tree: dict[str, Any] = {}
    for p in sorted(path.iterdir()):
        if not p.is_file() or p.is_symlink():
            continue
        if p.suffix == ".safetensors":
            tree[p.name] = safetensors_header(p)
        elif p.suffix == ".pkl":
            tree[p.name] = unloadable(p, "a pickle: loading it would run its globals")
        elif p.suffix in (".bin", ".pt", ".pth"):
            tree[p.name] = _torch_file(p)
    return recognize(tree, "Accelerate save_state folder")
