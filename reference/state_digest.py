"""The canonical digest of a reference training state. See common/state_digest.py for
NOTE [ Canonical state digest ]; this tree says only which values are arrays: NumPy's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from common import state_digest as common_digest


def as_array(value: Any) -> np.ndarray | None:
    """A NumPy array or scalar as an array; None for a plain value."""
    return np.asarray(value) if isinstance(value, np.ndarray | np.generic) else None


def state_digest(state: Mapping[str, Any]) -> str:
    """common.state_digest.state_digest of a state holding NumPy arrays."""
    return common_digest.state_digest(state, as_array)
