"""The canonical digest of a training state from tensors. See common/state_digest.py for
NOTE [ Canonical state digest ]; only reading a tensor's bytes differs (detached, on the
CPU, as NumPy), so a state and its cross-implementation mapping have the same digest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from common import state_digest as common_digest


def as_array(value: Any) -> np.ndarray | None:
    """A tensor's values as NumPy (detached, on the CPU); None for a plain value."""
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else None


def state_digest(state: Mapping[str, Any]) -> str:
    """common.state_digest.state_digest of a state holding tensors."""
    return common_digest.state_digest(state, as_array)
