"""The compact model on a tape of saved tensors (see DESIGN.md). Work in progress."""

from __future__ import annotations

import numpy as np


class Parameter:
    """A trainable array: `.data` (the values) and `.grad` (None until a backward)."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = np.asarray(data)
        self.grad: np.ndarray | None = None

    def __repr__(self) -> str:
        return f"Parameter(shape={self.data.shape}, dtype={self.data.dtype})"
