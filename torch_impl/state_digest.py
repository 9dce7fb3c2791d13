"""The canonical digest of a training state from tensors. See common/state_digest.py for
NOTE [ Canonical state digest ]; only reading a tensor's bytes differs (detached, on the
CPU, as NumPy), so a state and its cross-implementation mapping have the same digest.
Tensor.numpy() refuses bfloat16 and the float8 dtypes: their bits are read through an
integer view of the same width and named as ml_dtypes names them, the reference's arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import torch

from common import state_digest as common_digest

# the dtypes NumPy has no type for -> (the integer view that carries their bits, ml_dtypes')
_VIEWED = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
           torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
           torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2)}


def as_array(value: Any) -> np.ndarray | None:
    """A tensor's values as NumPy (detached, on the CPU; bfloat16 and float8 as ml_dtypes'
    arrays of the same bits); None for a plain value."""
    if not isinstance(value, torch.Tensor):
        return None
    t = value.detach().cpu()
    if t.dtype in _VIEWED:
        carrier, dtype = _VIEWED[t.dtype]
        return t.view(carrier).numpy().view(dtype)
    return t.numpy()


def state_digest(state: Mapping[str, Any]) -> str:
    """common.state_digest.state_digest of a state holding tensors."""
    return common_digest.state_digest(state, as_array)
