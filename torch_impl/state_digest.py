"""The canonical digest of a training state from tensors. See reference/state_digest.py for
NOTE [ Canonical state digest ]; only reading a tensor's bytes differs (detached, on the
CPU, as NumPy), so a state and its cross-implementation mapping have the same digest.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def _record(name: str, value: Any) -> bytes:
    if isinstance(value, torch.Tensor):
        a = np.ascontiguousarray(value.detach().cpu().numpy())
        body = (f"{name}\0{a.dtype.newbyteorder('<').str}\0{','.join(map(str, a.shape))}\0"
                .encode() + a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
    else:
        body = f"{name}\0py\0{value!r}".encode()
    return struct.pack("<Q", len(body)) + body


def state_digest(state: Mapping[str, Any]) -> str:
    """SHA-256 of params, optimizer buffers, scaler and data position (the reference's)."""
    h = hashlib.sha256()
    for key, value in state["model"].items():
        h.update(_record(f"model/{key}", value))
    opt_state = state["optimizer"]["state"]
    for i in sorted(opt_state):
        for name in sorted(opt_state[i]):
            h.update(_record(f"optimizer/{i}/{name}", opt_state[i][name]))
    for key in sorted(state["scaler"]):
        h.update(_record(f"scaler/{key}", state["scaler"][key]))
    h.update(_record("data/epoch", int(state["data"]["epoch"])))
    h.update(_record("data/position", int(state["data"]["position"])))
    return h.hexdigest()
