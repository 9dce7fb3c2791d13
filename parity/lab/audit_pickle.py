"""Reading a pickle without running it: pickletools.genops parses the opcodes and executes
none, so the globals a pickle would import and the strings it holds (dict keys among them)
can be listed for a file that is never loaded (an Accelerate .pkl, a torch.save file that
weights_only refuses, a DCP .metadata).
"""

from __future__ import annotations

import io
import pickletools
import zipfile
from pathlib import Path

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
