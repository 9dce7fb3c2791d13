"""What the resume check (resume_check.py) reads out of a user's trainer: its state
flattened to dotted entries, a digest per entry, what can be observed on the trainer beyond
the state it saves, and the check that a state loads back under weights_only.

NOTE [ Observed beside the state ]
A trainer whose state_dict() leaves something out resumes wrongly, and the state it saves
cannot say what: the missing entry is not in it. So at every step the check also digests
what it can see on the trainer without being told:
  rng.torch, rng.cuda.<i>   torch's global generators (CUDA only once CUDA is initialized)
  rng.numpy, rng.python     numpy's legacy global generator and Python's `random`
  trainer.<attr>...         each attribute of the trainer object that is an nn.Module, an
                            Optimizer, an LR scheduler, a GradScaler (their state_dict()), a
                            torch.Generator (its state) or an int (a step, a data position)
A global generator is compared only if the uninterrupted run draws from it (its state
changes over the steps): one nobody uses differs between two processes for no reason.
Floats and tensors held as attributes are not observed: they are as often the last loss as
state. Observed entries do not decide the verdict (the saved state does, and the stale-state
guard of resume_stale.py reads them); they name the cause: a trainer that saves no RNG
state parts from the uninterrupted run at `rng.torch` right after the load, one step before
its weights do.
"""

from __future__ import annotations

import hashlib
import random
import sys
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

Leaf = Any
EMPTY = ("{}", "[]")  # an empty container is an entry of its own: {} vs {"0": ...} shows


def flatten(value: Any, prefix: str = "") -> dict[str, Leaf]:
    """Dotted path -> leaf of a nested state: a mapping's keys and a list's indices joined by
    "." ("optimizer.state.0.exp_avg"); an empty dict or list is a leaf ("{}", "[]")."""
    out: dict[str, Leaf] = {}
    if isinstance(value, Mapping | list | tuple):
        items = (list(value.items()) if isinstance(value, Mapping)
                 else list(enumerate(value)))
        if not items:
            out[prefix] = EMPTY[0] if isinstance(value, Mapping) else EMPTY[1]
        for key, v in items:
            out.update(flatten(v, f"{prefix}.{key}" if prefix else str(key)))
        return out
    out[prefix] = value
    return out


def leaf_digest(value: Leaf) -> str:
    """16 hex digits over a leaf's type, dtype, shape and bytes (a tensor) or its repr."""
    h = hashlib.blake2b(digest_size=8)
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous().reshape(-1)
        h.update(f"tensor\0{t.dtype}\0{tuple(value.shape)}\0".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    elif hasattr(value, "tobytes") and hasattr(value, "dtype"):  # a numpy array
        h.update(f"array\0{value.dtype}\0{value.shape}\0".encode() + value.tobytes())
    else:
        h.update(f"{type(value).__name__}\0{value!r}".encode())
    return h.hexdigest()


def digests(entries: Mapping[str, Leaf]) -> dict[str, str]:
    return {name: leaf_digest(v) for name, v in entries.items()}


def _state_of(value: Any) -> Any | None:
    """The state an attribute's object carries (NOTE [ Observed beside the state ])."""
    if isinstance(value, nn.Module | torch.optim.Optimizer | torch.amp.GradScaler
                  | torch.optim.lr_scheduler.LRScheduler):
        return value.state_dict()
    if isinstance(value, torch.Generator):
        return value.get_state()
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def global_rngs() -> dict[str, Leaf]:
    """The process-wide generators, flattened (NOTE [ Observed beside the state ])."""
    out: dict[str, Leaf] = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            out[f"rng.cuda.{i}"] = torch.cuda.get_rng_state(i)
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, gauss = np.random.get_state()
        out["rng.numpy"] = (name, keys.tobytes(), pos, has_gauss, gauss)
    out["rng.python"] = random.getstate()
    return out


def observe(trainer: Any) -> dict[str, Leaf]:
    """Every observed entry of `trainer`, flattened: global RNGs, then its attributes."""
    out = global_rngs()
    for attr, value in getattr(trainer, "__dict__", {}).items():
        if attr.startswith("__"):
            continue
        state = _state_of(value)
        if state is not None:
            out.update(flatten(state, f"trainer.{attr}"))
    return out


def check_storable(state: Any, path: str = "") -> None:
    """TypeError naming the dotted entry unless torch.load(weights_only=True) reads `state`
    back as it is: dicts (str or int keys), lists, tuples, tensors, numbers, str and None,
    the same rule as the checkpoint writer (torch_impl/resume.py)."""
    if path == "" and not isinstance(state, Mapping):
        raise TypeError(f"resume check: state_dict() returned a {type(state).__name__}; it "
                        "must return a dict")
    if state is None or isinstance(state, bool | int | float | str | torch.Tensor):
        return
    if isinstance(state, list | tuple):
        for i, v in enumerate(state):
            check_storable(v, f"{path}.{i}" if path else str(i))
        return
    if isinstance(state, Mapping):
        for k, v in state.items():
            if not isinstance(k, str | int) or isinstance(k, bool):
                raise TypeError(f"resume check: entry {path or '(the state)'} has the key "
                                f"{k!r}, a {type(k).__name__}; keys must be str or int")
            check_storable(v, f"{path}.{k}" if path else str(k))
        return
    hint = (" (save its .state_dict() instead)" if hasattr(state, "state_dict")
            else " (a NumPy value: save torch.from_numpy(a); a generator's state as "
                 "np.random.default_rng(...).bit_generator.state, a dict of ints)"
            if type(state).__module__.startswith("numpy") else "")
    raise TypeError(f"resume check: entry {path} is a {type(state).__module__}."
                    f"{type(state).__qualname__}, which needs pickle to load: "
                    f"torch.load(weights_only=True) reads back dicts, lists, tuples, "
                    f"tensors, numbers, str and None{hint}")
