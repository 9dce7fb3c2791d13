"""The canonical digest of a training state: what `python -m parity train` prints as its last
line, `state-sha256: <64 hex digits>`. A run killed at any moment and resumed prints the same
digest as an uninterrupted one.

# NOTE [ Canonical state digest ]
`state_digest` (printed as `state-sha256`) is SHA-256 over length-prefixed records, in
this order: every model entry in state_dict order; every optimizer buffer, parameter index
ascending, buffer name sorted ("optimizer/<i>/<name>"); every scaler entry, key sorted
("scaler/<key>"); then "data/epoch" and "data/position". An array record is
name NUL dtype NUL shape NUL raw-bytes (little-endian, C order), where dtype is the
little-endian dtype.str, or the name for ml_dtypes' types (whose str, a bare '<V2', '<V1'
or '<f1', does not tell e4m3fn from another 1-byte format); a plain value's is
name NUL "py" NUL repr(value). Each tree says only which of its values are arrays and how
they become NumPy (reference/state_digest.py, torch_impl/state_digest.py), so a state and
its cross-implementation mapping have the same digest. Random streams and
the lr are not in it: they are checked by the resume tests through the parameters they
change.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

AsArray = Callable[[Any], "np.ndarray | None"]


def _record(name: str, value: Any, as_array: AsArray) -> bytes:
    a = as_array(value)
    if a is not None:
        a = np.ascontiguousarray(a)
        ml = a.dtype.type.__module__ == "ml_dtypes"
        kind = a.dtype.name if ml else a.dtype.newbyteorder("<").str
        body = (f"{name}\0{kind}\0{','.join(map(str, a.shape))}\0"
                .encode() + a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
    else:
        body = f"{name}\0py\0{value!r}".encode()
    return struct.pack("<Q", len(body)) + body


def state_digest(state: Mapping[str, Any], as_array: AsArray) -> str:
    """SHA-256 of params, optimizer buffers, scaler and data position (NOTE [ Canonical state
    digest ]); `as_array(value)` is the value's NumPy array, or None for a plain value."""
    h = hashlib.sha256()
    for key, value in state["model"].items():
        h.update(_record(f"model/{key}", value, as_array))
    opt_state = state["optimizer"]["state"]
    for i in sorted(opt_state):
        for name in sorted(opt_state[i]):
            h.update(_record(f"optimizer/{i}/{name}", opt_state[i][name], as_array))
    for key in sorted(state["scaler"]):
        h.update(_record(f"scaler/{key}", state["scaler"][key], as_array))
    h.update(_record("data/epoch", int(state["data"]["epoch"]), as_array))
    h.update(_record("data/position", int(state["data"]["position"]), as_array))
    return h.hexdigest()


def sharded_state_digest(state: Mapping[str, Any], as_array: AsArray,
                         buffers: Mapping[str, str] | None = None) -> str:
    """state_digest of one rank's flat sharded state (the table in torch_impl/sharded_ckpt.py),
    put in the canonical order: model/<name> as the model's entries, optim/<b>/<i> as
    parameter i's buffer buffers[b] (by default optim/momentum/<i> as its
    "momentum_buffer", SGD's; the GPT's AdamW: common/ddp_gpt_state.py), scaler/scale and
    scaler/growth_tracker as the scaler's plain values "scale" (a float) and
    "_growth_tracker" (an int), data/epoch and data/position. As in state_digest, the
    step, the skipped count and the random streams are not in it."""

    def scalar(key: str) -> Any:
        return np.asarray(as_array(state[key])).item()

    buffers = {"momentum": "momentum_buffer"} if buffers is None else buffers
    optimizer: dict[int, dict[str, Any]] = {}
    for key, value in state.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "optim" and parts[1] in buffers:
            optimizer.setdefault(int(parts[2]), {})[buffers[parts[1]]] = value
    nested = {"model": {k.removeprefix("model/"): v for k, v in state.items()
                        if k.startswith("model/")},
              "optimizer": {"state": optimizer},
              "scaler": {"scale": float(scalar("scaler/scale")),
                         "_growth_tracker": int(scalar("scaler/growth_tracker"))},
              "data": {"epoch": int(scalar("data/epoch")),
                       "position": int(scalar("data/position"))}}
    return state_digest(nested, as_array)
