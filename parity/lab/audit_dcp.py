"""A torch.distributed.checkpoint (DCP) folder, read as what `dcp.load` reads, nothing run
(torch 2.13's FileSystemWriter layout; this project's own DCP step folders are read first,
by parity/lab/audit_own.py).

    file               what it is                              read with
    .metadata          a pickled Metadata: each item's name    read_inert (audit_pickle.py):
                       (fqn), tensor dtype and shape or        a restricted unpickler that
                       "bytes", where its bytes lie (file,     imports nothing; any global
                       offset, length), and planner_data:      outside METADATA_GLOBALS ends
                       each fqn's path in the saved dict       the read; nothing is called
    __<r>_<i>.distcp   rank r's items, each a torch.save blob  only the small non-tensor
                       at the offset .metadata gives           items (steps, epochs), by
                                                               torch.load(weights_only=True)

torch's own FileSystemReader.read_metadata is `pickle.load` (and dcp.load reads each bytes
item with weights_only=False): it would run what a crafted .metadata names, so it is not
used. DCP writes .metadata last (in `finish`, after every shard): a folder of shard files
and no .metadata is a save that did not finish (a crash mid-save), and `dcp.load` cannot
read it. A shard file alone is no checkpoint: which items it holds, and where, only
.metadata says.

The saved dict is rebuilt from planner_data ({"model": sd, "optim": osd} flattens to
"model.0.weight" -> ("model", "0.weight"), "optim.state.0.exp_avg" -> ("optim", "state",
"0", "exp_avg"), list indices as ints), tensors as their dtype and shape, and handed to
audit_recognize's rules like any other checkpoint.
"""

from __future__ import annotations

import io
import math
import pickle
import re
from pathlib import Path
from typing import Any

from parity.lab.audit_files import TensorInfo
from parity.lab.audit_pickle import Inert, pickle_of, read_inert
from parity.lab.audit_recognize import Audit, AuditInputError, Unloadable, recognize

KIND = "torch.distributed.checkpoint (DCP) folder"
METADATA = ".metadata"
SHARD = re.compile(r"__(\d+)_(\d+)\.distcp")
MAX_ITEM = 1 << 20  # a step or an lr is bytes; a bigger non-tensor item is not read
DTYPES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
          "int64", "int32", "int16", "int8", "uint8", "bool", "complex64", "complex128")
# the globals a DCP .metadata names (as Inert records, never imported): its dataclasses,
# torch.Size, a layout, the dtypes, and the checkpoint_id's Path
METADATA_GLOBALS = ("torch.distributed.checkpoint.metadata.",
                    "torch.distributed.checkpoint.filesystem._StorageInfo", "torch.Size",
                    "torch.serialization._get_layout", "pathlib.PosixPath",
                    "pathlib.WindowsPath", "pathlib.Path",
                    *(f"torch.{d}" for d in DTYPES))


def _fields(obj: Any) -> dict[str, Any]:
    """An Inert dataclass's fields (BUILD's dict, or the (dict, slots) pair)."""
    state = obj.state if isinstance(obj, Inert) else None
    if (isinstance(state, tuple) and len(state) == 2
            and all(isinstance(s, dict | None) for s in state)):
        return {**(state[0] or {}), **(state[1] or {})}
    return state if isinstance(state, dict) else {}


def _is(obj: Any, name: str) -> bool:
    return isinstance(obj, Inert) and obj.name.endswith(f".{name}")


def read_metadata(path: Path) -> dict[str, Any]:
    """.metadata's fields (state_dict_metadata, planner_data, storage_data), read by
    read_inert; AuditInputError when it is damaged or names a global outside
    METADATA_GLOBALS (nothing of it runs)."""
    try:
        meta = read_inert(pickle_of(path), METADATA_GLOBALS)
    except pickle.UnpicklingError as e:
        raise AuditInputError(f"{path}: not a DCP .metadata that can be read safely ({e}); "
                              "nothing in it was run") from None
    fields = _fields(meta)
    if not _is(meta, "Metadata") or not isinstance(fields.get("state_dict_metadata"), dict):
        raise AuditInputError(f"{path}: not a DCP .metadata (no Metadata with its items)")
    return fields


def item_names(fields: dict[str, Any]) -> dict[str, TensorInfo | None]:
    """fqn -> its dtype and shape (a tensor) or None (bytes: a pickled non-tensor)."""
    out: dict[str, TensorInfo | None] = {}
    for fqn, item in fields["state_dict_metadata"].items():
        if _is(item, "TensorStorageMetadata"):
            f = _fields(item)
            props = getattr(f.get("properties"), "state", None)  # TensorProperties'
            # __getstate__: (dtype, layout, requires_grad, memory_format, pin_memory)
            dtype = props[0] if isinstance(props, tuple) and props else None
            size = f.get("size")
            shape = size.args[0] if isinstance(size, Inert) and size.args else ()
            out[str(fqn)] = TensorInfo(str(getattr(dtype, "name", "?")).removeprefix("torch."),
                                       tuple(int(n) for n in shape))
        else:
            out[str(fqn)] = None
    return out


def _bytes_item(folder: Path, info: Any) -> Any:
    """A non-tensor item, from the shard and offset .metadata gives, by weights_only."""
    import torch

    f = _fields(info)
    name, offset, length = f.get("relative_path"), f.get("offset"), f.get("length")
    if not (isinstance(name, str) and SHARD.fullmatch(name) and isinstance(offset, int)
            and isinstance(length, int) and 0 <= length <= MAX_ITEM):
        return Unloadable("a non-tensor item not read (its place in the shard is not "
                          "plain, or it is over 1 MiB)")
    path = folder / name
    if not path.is_file() or path.is_symlink():
        return Unloadable(f"its shard {name} is missing")
    with open(path, "rb") as fh:
        fh.seek(offset)
        raw = fh.read(length)
    try:
        return torch.load(io.BytesIO(raw), weights_only=True)
    except Exception as e:  # weights_only refuses a global, or the bytes are damaged
        return Unloadable(f"weights_only=True refuses it ({type(e).__name__})")


def _place(tree: dict[str, Any], keys: tuple[Any, ...], value: Any) -> None:
    """tree[k0][k1]... = value, list indices (ints) kept as dict keys, then lists made."""
    node = tree
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value


def _lists(node: Any) -> Any:
    """A dict keyed 0..n-1 by int (a list DCP flattened) back into a list."""
    if not isinstance(node, dict):
        return node
    node = {k: _lists(v) for k, v in node.items()}
    if node and all(isinstance(k, int) for k in node) and sorted(node) == list(range(len(node))):
        return [node[i] for i in range(len(node))]
    return node


def _read(tensor: TensorInfo | None) -> bool:
    """Whether an item's value is read: a non-tensor, or a one-element tensor (an
    optimizer's step); other tensors stay their dtype and shape."""
    return tensor is None or math.prod(tensor.shape) == 1


def saved_tree(folder: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """The dict dcp.save was given: tensors as TensorInfo, non-tensors and one-element
    tensors read."""
    names = item_names(fields)
    places = {}
    for index, info in (fields.get("storage_data") or {}).items():
        fqn = _fields(index).get("fqn")
        if isinstance(fqn, str) and fqn in names and _read(names[fqn]):
            places[fqn] = info
    paths = fields.get("planner_data") or {}
    tree: dict[str, Any] = {}
    for fqn, tensor in names.items():
        value = tensor if not _read(tensor) else (
            _bytes_item(folder, places[fqn]) if fqn in places
            else Unloadable("no place for it in .metadata"))
        keys = paths.get(fqn)
        _place(tree, tuple(keys) if isinstance(keys, tuple | list) and keys else (fqn,), value)
    return _lists(tree)


def audit_dcp(folder: Path) -> Audit:
    """The Audit of a DCP folder: half-written without .metadata, else its saved dict by
    the rules, with every shard .metadata names checked to be there."""
    names = sorted(p.name for p in folder.iterdir())
    shards = [n for n in names if SHARD.fullmatch(n)]
    if METADATA not in names:
        audit = Audit(f"{KIND}, half-written")
        audit.refused = (f"a half-written DCP checkpoint: {len(shards)} shard file(s) "
                         f"({', '.join(shards[:4])}) and no {METADATA}, which dcp.save writes "
                         "last, after every shard: a save that did not finish (a crash "
                         "mid-save); dcp.load cannot read it")
        return audit
    fields = read_metadata(folder / METADATA)
    used = {_fields(i).get("relative_path") for i in (fields.get("storage_data") or {}).values()}
    missing = sorted(str(n) for n in used if n not in names)
    read = (f"{METADATA}: read without running it (a restricted unpickler): "
            f"{len(item_names(fields))} items in {len(used)} shard file(s)")
    if missing:
        audit = Audit(KIND, flags=[read])
        audit.refused = (f"shard file(s) {', '.join(missing)} named by {METADATA} are missing: "
                         "dcp.load cannot read their items")
        return audit
    audit = recognize(saved_tree(folder, fields), KIND)
    audit.flags.append(read)
    return audit


def shard_file(path: Path) -> Audit:
    """A DCP shard file alone: one rank's items, which only the folder's .metadata names."""
    m = SHARD.fullmatch(path.name)
    rank = f"rank {m.group(1)}'s" if m else "a"
    audit = Audit("torch.distributed.checkpoint (DCP) shard file")
    beside = (path.parent / METADATA).is_file()
    audit.refused = (f"{rank} shard file of a DCP checkpoint: its items are found by the "
                     f"folder's {METADATA}, never by the shard alone; audit the folder "
                     + (f"({path.parent})" if beside else f"(none beside it: no {METADATA})"))
    return audit
