"""The mapped payload as a file: what each tree's decoder reads from (ckpt/container.py maps
and verifies the file; the payload's bytes are then read in place, never copied whole)."""

from __future__ import annotations

from typing import Any


class ViewReader:
    """A read-only, seekable file over a memoryview: decoders read the mapped payload
    without a copy of it (torch.load reads its records straight into tensors)."""

    def __init__(self, view: memoryview) -> None:
        self.view, self.pos = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.pos, len(self.view))[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = len(self.view) if n is None or n < 0 else min(len(self.view), self.pos + n)
        out = bytes(self.view[self.pos:end])
        self.pos = max(self.pos, end)
        return out

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        n = max(0, min(len(target), len(self.view) - self.pos))
        target[:n] = self.view[self.pos:self.pos + n]
        self.pos += n
        return n
