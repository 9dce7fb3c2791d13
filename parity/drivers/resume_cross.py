"""Resuming one tree from the other's checkpoint: the loaders `train(..., foreign=...)` takes
(NOTE [ Cross-implementation mapping ] in torch_impl/resume.py).

Importing this module imports neither tree's torch side: torch is imported only when a
conversion runs, so `train --impl reference` never loads it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def converters(impl: str) -> dict[str, Callable[[Path], dict[str, Any]]]:
    """Payload kind of the OTHER implementation -> a loader returning `impl`'s state
    (NOTE [ Cross-implementation mapping ] in torch_impl/resume.py); torch is imported only
    when a conversion is needed."""

    def from_torch(path: Path) -> dict[str, Any]:
        from torch_impl import resume as t_resume

        return t_resume.state_to_reference(t_resume.load_checkpoint(path))

    def from_reference(path: Path) -> dict[str, Any]:
        from reference import resume as r_resume
        from torch_impl import resume as t_resume

        return t_resume.state_from_reference(r_resume.load_checkpoint(path))

    return {"torch-zip": from_torch} if impl == "reference" else {"npy-records": from_reference}
