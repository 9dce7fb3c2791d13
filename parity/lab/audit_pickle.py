"""Reading a pickle without running it, two ways.

- `pickle_names`: pickletools.genops parses the opcodes and executes none, so the globals a
  pickle would import and the strings it holds (dict keys among them) can be listed for a
  file that is never loaded (an Accelerate .pkl, a torch.save file that weights_only
  refuses, a DCP .metadata).
- `read_inert`: a restricted unpickler for a pickled object whose field values are wanted
  (Hugging Face's training_args.bin, a pickled TrainingArguments dataclass). Its
  `find_class` imports nothing: a global inside the allowlist of module prefixes becomes an
  inert `Inert` class named after it, whose construction (REDUCE, NEWOBJ) and state (BUILD)
  are only recorded; any other global (os.system, builtins.eval) ends the read with an
  UnpicklingError. So nothing the pickle names is ever called.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import zipfile
from pathlib import Path
from typing import Any

from parity.lab.audit_recognize import Unloadable

MAX_PICKLE = 64 << 20  # RNG and sampler pickles are kilobytes; a larger one is not read


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


def pickle_of(path: Path) -> bytes:
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
    found, names = pickle_names(pickle_of(path))
    return Unloadable(reason, needs or found, names)


class Inert:
    """An object of a global a pickle named, never imported: `name` the global, `args` what
    it was called with, `state` what BUILD gave it."""

    name = ""
    args: tuple[Any, ...] = ()  # NEWOBJ builds without __init__: these stay the defaults
    state: Any = None

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __reduce__(self) -> Any:  # an Inert is read, never written back
        raise TypeError("an Inert stands for an object never built")


class _InertUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, allowed: tuple[str, ...]) -> None:
        super().__init__(io.BytesIO(data))
        self.allowed = allowed

    def find_class(self, module: str, name: str) -> type[Inert]:
        full = f"{module}.{name}"
        if not full.startswith(self.allowed):
            raise pickle.UnpicklingError(f"it names {full}, outside what it may hold")
        return type(name, (Inert,), {"name": full})

    def persistent_load(self, pid: Any) -> Inert:  # a torch.save storage: not read
        return Inert(pid)


def read_inert(data: bytes, allowed: tuple[str, ...]) -> Any:
    """The object a pickle describes, its globals `Inert` (only names starting with one of
    `allowed`); pickle.UnpicklingError naming the first other global. Nothing is run."""
    try:
        return _InertUnpickler(data, allowed).load()
    except pickle.UnpicklingError:
        raise
    except Exception as e:  # damage: EOFError, a bad opcode, a stack left wrong
        raise pickle.UnpicklingError(f"damaged: {type(e).__name__}: {e}") from None
