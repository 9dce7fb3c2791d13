"""Which op made the first invalid value, with PyTorch. See reference/numerics_locate.py for
the rule (the maker module, the first op making a non-finite value from finite inputs).

What PyTorch does differently: the re-run is watched below autograd by a TorchDispatchMode,
which sees every aten op (the reference watches its op functions by name); an aten op's
autograd node is its name in CamelCase + "Backward0" (bmm: BmmBackward0, _softmax:
SoftmaxBackward0, native_layer_norm: NativeLayerNormBackward0) and its argument names come
from its schema, so the two trees' reports compare as strings. The re-run runs under
no_grad (the same forward ops, nothing recorded) and torch.random.fork_rng (dropout's draws
do not advance the run's generator).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from common.numerics_report import Found, InputRange

Autocast = tuple[str, bool, torch.dtype]  # device type, enabled, dtype


class Call(tuple):
    """A module call's positional arguments, its keyword arguments in `.kwargs`: a model that
    is not this project's (transformers' GPT-2 blocks take hidden_states positionally and
    the mask by name) is re-run, and its inputs checked, with both."""

    kwargs: dict[str, Any]

    @classmethod
    def of(cls, args: tuple, kwargs: dict[str, Any] | None) -> Call:
        call = cls(args)
        call.kwargs = dict(kwargs or {})
        return call


def _leaves(value: Any) -> list[Any]:
    """The tensors and floats in a value: through tuples, lists and dicts (a ModelOutput)."""
    if isinstance(value, tuple | list):
        return [x for v in value for x in _leaves(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    return [value]


def autocast_state(device_type: str) -> Autocast:
    """The autocast state in force now on `device_type` (what the re-run re-enters)."""
    return (device_type, torch.is_autocast_enabled(device_type),
            torch.get_autocast_dtype(device_type))


def finite(values: tuple | list) -> bool:
    """Every float tensor and float scalar among `values` (a Call's keyword arguments too;
    inside tuples, lists and dicts) is finite."""
    for v in _leaves([*values, getattr(values, "kwargs", {})]):
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            if not bool(torch.isfinite(v).all()):
                return False
        elif isinstance(v, float) and not torch.isfinite(torch.tensor(v)):
            return False
    return True


def ended_maker(before: int, ended: list[tuple[int, str, Any]],
                calls: dict[str, tuple[nn.Module, tuple]]) -> str | None:
    """reference.numerics_locate.ended_maker (a host read per container, on the step that
    found a value only)."""
    for seen, path, output in ended:
        if seen > before:
            break
        if not finite([output]) and finite(calls[path][1]):
            return path
    return None


def maker(path: str, calls: dict[str, tuple[nn.Module, tuple]]) -> str:
    """reference.numerics_locate.maker."""
    if finite(calls[path][1]):
        return path
    parts = path.split(".")
    for n in range(len(parts) - 1, -1, -1):  # the parents, innermost first; "" is the root
        parent = ".".join(parts[:n])
        if parent in calls and finite(calls[parent][1]):
            return parent
    return path


def node_name(func: Any) -> str:
    """The autograd node of an aten op: _softmax -> SoftmaxBackward0."""
    name = func._schema.name.split("::")[-1]
    return "".join(part.capitalize() for part in name.strip("_").split("_")) + "Backward0"


def watch_ops(module: nn.Module, args: tuple, state: Autocast, dtype: torch.dtype,
              ranges: Callable[[str, torch.Tensor, torch.dtype], InputRange],
              first: Callable[[torch.Tensor], tuple[tuple[int, ...], str]]) -> Found | None:
    """reference.numerics_locate.watch_ops: re-run `module(*args)` watched."""
    found: list[Found] = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kwargs=None):
            out = func(*a, **(kwargs or {}))
            if not found:
                values = [*a, *(kwargs or {}).values()]
                first_out = out[0] if isinstance(out, tuple | list) else out
                if (isinstance(first_out, torch.Tensor) and first_out.is_floating_point()
                        and finite(values) and not finite([first_out])):
                    names = [arg.name for arg in func._schema.arguments]
                    inputs = tuple(ranges(n, v, dtype) for n, v in zip(names, a, strict=False)
                                   if isinstance(v, torch.Tensor) and v.is_floating_point()
                                   and v.dim() > 0)
                    found.append((node_name(func), *first(first_out), inputs))
            return out

    device_type, enabled, lp = state
    kwargs = getattr(args, "kwargs", {})
    devices = list({t.device for t in _leaves([*args, kwargs])
                    if isinstance(t, torch.Tensor) and t.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices), torch.no_grad(), \
            torch.autocast(device_type, lp, enabled=enabled), Watch():
        try:
            module(*args, **kwargs)
        except Exception:  # NOTE [ A re-run may fail ]
            return found[0] if found else None
    return found[0] if found else None


# NOTE [ A re-run may fail ]
# A user's module is re-run with the arguments it was called with, after that call: an
# argument it mutates (transformers' DynamicCache gains the step's keys and values, so the
# re-run sees twice the tokens) can make the re-run raise. The report then names the maker
# module without an op: what was found up to the failure, or nothing.
