"""Reading one file of a checkpoint without running it, for the audit: a .safetensors header
(names, dtypes, shapes: no data) and a torch.save file under weights_only. The folder readers
(parity/lab/audit_sources.py, audit_hf.py) both use them; they import neither."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.lab.audit_pickle import unloadable
from parity.lab.audit_recognize import AuditInputError

MAX_HEADER = 100 << 20  # safetensors' own limit on its JSON header
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                      "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                      "BOOL": "bool"}


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


def torch_file(path: Path, allow: tuple[Any, ...] = ()) -> Any:
    """A torch.save file loaded with weights_only (its allowlist widened by `allow`), or an
    Unloadable saying why not; AuditInputError for a file that is no torch checkpoint."""
    from parity.lab.your_trainer.audit import NotACheckpoint, load_safely

    try:
        loaded = load_safely(path, allow)
    except NotACheckpoint as e:
        raise AuditInputError(str(e)) from None
    if loaded.refused is not None:
        return unloadable(path, loaded.refused, loaded.needs)
    return loaded.value
