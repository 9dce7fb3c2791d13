"""Does a loaded state fit what it is loaded into? Library-free: arrays and tensors are
compared through their `.shape` and `.dtype` alone (duck typing)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt.errors import CheckpointMismatchError


def _is_array(v: Any) -> bool:
    return hasattr(v, "shape") and hasattr(v, "dtype")


def describe(v: Any) -> str:
    """"ndarray (16, 8) float32", "Tensor (16, 8) torch.float32", "int 3"."""
    if _is_array(v):
        return f"{type(v).__name__} {tuple(v.shape)} {v.dtype}"
    return f"{type(v).__name__} {v!r}"


def check_matches(state: Any, like: Mapping[str, Any], path: str = "") -> None:
    """CheckpointMismatchError naming the first key where `state` does not fit `like`.

    Only the keys of `like` are checked, recursively: mappings must have the same keys,
    arrays (anything with .shape and .dtype) the same shape and dtype, every other value
    must be equal.
    """
    if not isinstance(state, Mapping):
        raise CheckpointMismatchError(f"{path or 'state'}: checkpoint has {describe(state)}, "
                                      "expected a mapping")
    for key in like:
        here = f"{path}/{key}" if path else str(key)
        if key not in state:
            raise CheckpointMismatchError(f"{here}: missing from the checkpoint")
        a, b = state[key], like[key]
        if isinstance(b, Mapping):
            check_matches(a, b, here)
            extra = sorted(map(str, set(a) - set(b)))
            if extra:
                raise CheckpointMismatchError(f"{here}/{extra[0]}: in the checkpoint but not "
                                              "in what it is loaded into")
        elif _is_array(b):
            if not _is_array(a) or tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
                raise CheckpointMismatchError(f"{here}: checkpoint has {describe(a)}, the "
                                              f"model has {describe(b)}")
        elif a != b:
            raise CheckpointMismatchError(f"{here}: checkpoint has {describe(a)}, "
                                          f"expected {describe(b)}")


def config_differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """One phrase per differing field: "precision: 'fp32' in the checkpoint, 'bf16' now"."""
    out = []
    for key in sorted(set(saved) | set(now), key=str):
        if key not in now:
            out.append(f"{key}: {saved[key]!r} in the checkpoint, not a field now")
        elif key not in saved:
            out.append(f"{key}: not in the checkpoint, {now[key]!r} now")
        elif saved[key] != now[key] or type(saved[key]) is not type(now[key]):
            out.append(f"{key}: {saved[key]!r} in the checkpoint, {now[key]!r} now")
    return out


def check_config(saved: Any, now: Mapping[str, Any], where: str = "checkpoint") -> None:
    """CheckpointMismatchError naming every field in which `saved` differs from `now`."""
    if not isinstance(saved, Mapping):
        raise CheckpointMismatchError(f"{where}: holds no configuration to compare")
    differences = config_differences(saved, now)
    if differences:
        raise CheckpointMismatchError(f"{where}: the configuration changed: "
                                      + "; ".join(differences))
