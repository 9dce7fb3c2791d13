"""Complete checkpoints in PyTorch: the "torch-zip" payload. See reference/resume.py.

The container, the atomic write, the directory and the CheckpointError family are the
shared `ckpt` package (neither NumPy nor torch), the same classes as the reference's. What
differs:

- the payload is "torch-zip": the bytes `torch.save(state)` writes, streamed through the
  hashing writer, read back with `torch.load(weights_only=True, map_location="cpu")`
  (NOTE [ No pickle on load ] in reference/resume.py) straight out of the mapped file
  (ckpt.ViewReader: torch reads each record into its tensor, one copy). torch.load does NOT
  check the CRC-32 of its zip members: without the outer digest a flipped byte inside a
  tensor's data loads as a different value, silently. torch bounds-checks its own records
  (a storage larger than its record is a RuntimeError, reported as corrupt), and the
  decoded state must be a dict nested at most ckpt.MAX_DEPTH deep, as in the reference.
  Version-dependent: torch 2.6 does not compare a storage's declared size with its zip
  record (2.11 and 2.13 do); it loads the record's own bytes and allocates nothing from the
  declared size, so such a crafted file loads there (claim resume.crafted_refused).
- the state holds tensors where the reference holds arrays; torch.Generator states are
  uint8 tensors (`get_state()`), so they need no special case.
- `state_to_reference` / `state_from_reference`: the lossless mapping between the two trees'
  complete training states (NOTE [ Cross-implementation mapping ]).
"""

from __future__ import annotations

import copy
import os
import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

import ckpt
from ckpt import (  # the one family, re-exported: torch_impl.resume.CheckpointError is ckpt's
    CheckpointCorruptError,
    CheckpointDirectoryError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointUnsafeError,
    CheckpointVersionError,
    CheckpointWriteError,
    check_matches,
)
from common.fp8_train import WEIGHT_PRECISIONS
from torch_impl.state_mapping import (
    optimizer_state_from_torch,
    optimizer_state_to_torch,
    scheduler_state_from_torch,
    scheduler_state_to_torch,
    state_dict_from_torch,
    state_dict_to_torch,
)

__all__ = [
    "PAYLOAD", "WRITER", "CheckpointCorruptError", "CheckpointDirectoryError", "CheckpointError",
    "CheckpointManager", "CheckpointMismatchError", "CheckpointUnsafeError",
    "CheckpointVersionError", "CheckpointWriteError", "check_matches", "decode_state",
    "load_checkpoint", "save_checkpoint", "state_from_reference", "state_to_reference",
    "write_state",
]

PAYLOAD = "torch-zip"
WRITER = "torch_impl"


def _check_storable(value: Any, path: str) -> None:
    """TypeError unless torch.load(weights_only=True) can read `value` back."""
    if value is None or isinstance(value, bool | int | float | str | torch.Tensor):
        return
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_storable(v, f"{path}[{i}]")
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str | int) or isinstance(k, bool):
                raise TypeError(f"save_checkpoint: key {k!r} in {path or 'state'} is a "
                                f"{type(k).__name__}; keys must be str or int")
            _check_storable(v, f"{path}/{k}" if path else str(k))
        return
    raise TypeError(f"save_checkpoint: {path or 'state'} is a {type(value).__name__}; a "
                    "checkpoint holds dicts, lists, tuples, tensors, numbers, str and None "
                    "(what torch.load(weights_only=True) reads back)")


def write_state(state: Mapping[str, Any], out: Any) -> None:
    """Write the "torch-zip" payload (torch.save's bytes) to the file-like `out`, after
    checking that every leaf loads back with weights_only=True.

    torch.save's zip records carry a CRC-32 each, which torch.load never checks and which
    costs as much CPU as writing the bytes; the container's digest covers every byte, so
    the CRC-32s are switched off while saving (torch.serialization.set_crc32_options, a
    process-wide setting, restored afterwards): the bytes are hashed once. The fields read
    0; torch.load reads such a file as any other."""
    _check_storable(state, "")
    crc32 = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(dict(state), out)
    finally:
        torch.serialization.set_crc32_options(crc32)


# What torch's weights_only unpickler says when it refuses a pickle for what it would RUN
# (a global outside its allowlist, a call, an object build); any other failure is damage.
# torch 2.6 wraps every failure in UnpicklingError, later versions only these.
_UNSAFE = ("GLOBAL", "call reduce", "Can only create new object", "Can only build")


def decode_state(payload: memoryview, where: str) -> Any:
    """The state of a "torch-zip" payload via torch.load(weights_only=True): no pickle code."""
    try:
        return torch.load(ckpt.ViewReader(payload), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        if any(marker in str(e) for marker in _UNSAFE):
            raise CheckpointUnsafeError(f"{where}: the payload needs pickle beyond tensors "
                                        f"and plain containers to load: refused ({e})") from None
        raise CheckpointCorruptError(f"{where}: unreadable torch payload: {e}") from None
    except Exception as e:  # a crafted pickle reaches asserts, TypeErrors
        raise CheckpointCorruptError(f"{where}: unreadable torch payload: "
                                     f"{type(e).__name__}: {e}") from None


# ---------------------------------------------------------------- save / load


def save_checkpoint(path: str | os.PathLike, state: Mapping[str, Any],
                    meta: Mapping[str, Any] | None = None) -> None:
    """Write `state` to `path` atomically, with its digest (reference/resume.py)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"save_checkpoint: state must be a mapping, got {type(state).__name__}")
    ckpt.save_container(path, PAYLOAD, WRITER, lambda out: write_state(state, out), meta)


def load_checkpoint(path: str | os.PathLike, *, like: Mapping[str, Any] | None = None
                    ) -> dict[str, Any]:
    """Read, verify and decode a checkpoint; with `like`, also check_matches(state, like)."""
    _, state = ckpt.load_container(path, PAYLOAD, decode_state,
                                   "convert it with state_from_reference")
    if like is not None:
        check_matches(state, like)
    return state


def CheckpointManager(directory: str | os.PathLike | Path, keep: int = 3,
                      log: Callable[[str], None] | None = None) -> ckpt.CheckpointDirectory:
    """The run directory (ckpt.CheckpointDirectory) that saves torch_impl checkpoints."""
    return ckpt.CheckpointDirectory(directory, payload=PAYLOAD, save=save_checkpoint,
                                    keep=keep, log=log)


# ---------------------------------------------------------------- across implementations

# NOTE [ Cross-implementation mapping ]
# A complete training state (reference/train.py, torch_impl/train.py) has the keys
#   config, step, epoch, model, optimizer, scheduler, scaler, data, rng.
# Mapped losslessly, bit for bit (the functions: torch_impl/state_mapping.py):
#   model      same keys and (out, in) layouts: state_dict_{to,from}_torch
#   optimizer  same structure; torch adds its kernel switches (foreach, fused, ...):
#              optimizer_state_{to,from}_torch
#   scheduler  torch adds `_get_lr_called_within_step`: scheduler_state_{to,from}_torch
#   scaler     plain numbers (scale, growth tracker, factors, interval): copied
#   data       the sampler's (seed, num_samples, epoch, position): plain ints, copied; the
#              order itself is a hash both trees compute (NOTE [ Counter-based hashing
#              instead of a Generator ] in reference/data.py)
#   config, fingerprint, step, epoch, skipped: plain values, copied
#   optimizer of bf16-sr (a WEIGHT_PRECISION: BF16SR, AdamWSR over bfloat16 copies) has
#              no torch class behind it: both trees' groups hold the same keys (lr, betas,
#              eps, weight_decay, amsgrad, initial_lr, params), copied with arrays <->
#              tensors of the same bits
#   rng["bits"] the random bits of stochastic rounding (bf16-sr, nvfp4) are ONE stream in
#              both trees, numpy's PCG64 (NOTE [ One bit stream, both trees ] in
#              common/recipes_train.py): its state, plain ints, copied
# NOT mapped: the rest of rng. numpy's PCG64 and torch's Mersenne Twister / Philox are
# different generators; no state of one reproduces the other's stream. The mapped state
# carries rng = None (or only its "bits"), and a loop resuming it keeps the dropout streams
# it was built with (train.py: seeded from the config's seed): the same parameters,
# optimizer, schedule, scaler and data position, but from then on other dropout masks, so
# not the same run unless dropout is off.


def _arrays_to_tensors(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return torch.from_numpy(np.array(value, copy=True))
    if isinstance(value, Mapping):
        return {k: _arrays_to_tensors(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_arrays_to_tensors(v) for v in value)
    return value


def _tensors_to_arrays(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy()
    if isinstance(value, Mapping):
        return {k: _tensors_to_arrays(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_tensors_to_arrays(v) for v in value)
    return value


MAPPED_KEYS = ("config", "step", "epoch", "model", "optimizer", "scheduler", "scaler", "data")
CONVERTED = ("model", "optimizer", "scheduler", "scaler", "rng")


def _bits(state: Mapping[str, Any]) -> dict[str, Any] | None:
    """The carried part of rng (NOTE [ Cross-implementation mapping ]): the bit stream."""
    rng = state.get("rng")
    if not isinstance(rng, Mapping) or "bits" not in rng:
        return None
    return {"bits": copy.deepcopy(dict(rng["bits"]))}


def _plain(state: Mapping[str, Any]) -> dict[str, Any]:
    """Every entry but the converted ones, copied (config, counters, data, fingerprint...)."""
    return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in state.items()
            if k not in CONVERTED}


def state_from_reference(ref_state: Mapping[str, Any]) -> dict[str, Any]:
    """A reference training state as torch_impl's (NOTE [ Cross-implementation mapping ])."""
    missing = [k for k in MAPPED_KEYS if k not in ref_state]
    if missing:
        raise ValueError(f"state_from_reference: missing keys {missing}")
    config = ref_state["config"]
    optimizer = (_arrays_to_tensors(ref_state["optimizer"])
                 if config.get("precision") in WEIGHT_PRECISIONS
                 else optimizer_state_to_torch(ref_state["optimizer"], config["optimizer"]))
    return {
        **_plain(ref_state),
        "model": state_dict_to_torch(ref_state["model"]),
        "optimizer": optimizer,
        "scheduler": scheduler_state_to_torch(ref_state["scheduler"]),
        "scaler": _arrays_to_tensors(ref_state["scaler"]),
        "rng": _bits(ref_state),
    }


def state_to_reference(torch_state: Mapping[str, Any]) -> dict[str, Any]:
    """A torch_impl training state as the reference's (NOTE [ Cross-implementation mapping ])."""
    missing = [k for k in MAPPED_KEYS if k not in torch_state]
    if missing:
        raise ValueError(f"state_to_reference: missing keys {missing}")
    config = torch_state["config"]
    optimizer = (_tensors_to_arrays(torch_state["optimizer"])
                 if config.get("precision") in WEIGHT_PRECISIONS
                 # the name: torch 2.6's Adam groups do not say whether decay is decoupled
                 else optimizer_state_from_torch(torch_state["optimizer"], config["optimizer"]))
    return {
        **_plain(torch_state),
        "model": state_dict_from_torch(torch_state["model"]),
        "optimizer": optimizer,
        "scheduler": scheduler_state_from_torch(torch_state["scheduler"]),
        "scaler": _tensors_to_arrays(torch_state["scaler"]),
        "rng": _bits(torch_state),
    }
