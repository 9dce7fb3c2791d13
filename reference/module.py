"""What every reference layer and loss is built on: parameters and the tape of saved tensors.

A `Node` is one PyTorch autograd node: its forward records, under names, the tensors its
backward will need (torch's `grad_fn._saved_*`), and its backward consumes them:

    forward(x):   y = f(x);  save_for_backward({"name": tensor, ...});  return y
    backward(g):  saved = pop_saved()   (an error if forward recorded nothing; frees the tape)
                  accumulate parameter gradients;  return dx

A `Module` is a Node with parameters and children (named "0", "1", ... in a Sequential), so
`tape()` lists every tensor a model holds now, module by module: memory accounting falls out
of it, and activation checkpointing (reference/recompute.py) drops and re-records it. The
layers are in reference/nn.py, the losses in reference/losses.py; torch's twin of this file
is torch.nn.Module, bound under this file's names in torch_impl/module.py; what autograd
saves is measured by hooks in torch_impl/saved_tensors.py, and torch_impl/state_mapping.py
converts a state_dict.

Global hooks, as torch.nn.modules.module.register_module_forward_pre_hook /
register_module_forward_hook / register_module_full_backward_hook: each fires around EVERY
node's forward or backward, for observers (the numerics detector, reference/numerics.py) that
must see each op's output without changing the layers:

    forward_pre(node, args)                     before forward
    forward(node, args, output)                 after forward
    backward(node, grad_input, grad_output)     after backward (grad_input: what it returns)

torch fires its hooks in `Module.__call__`; the reference calls `.forward` and `.backward`
directly everywhere, so the hooks wrap those methods of every subclass (NOTE [ Hooks wrap
forward and backward ]).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
# what an op may receive: also the 2-byte arrays autocast makes (NOTE [ Low-precision arrays ])
INPUT_DTYPES = (*FLOAT_DTYPES, np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


class Parameter:
    """A trainable array: `.data` (the values) and `.grad` (None until a backward)."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = np.asarray(data)
        self.grad: np.ndarray | None = None

    def accumulate(self, grad: np.ndarray) -> None:
        """grad <- grad + g (torch accumulates into .grad; the first backward assigns it)."""
        self.grad = grad.copy() if self.grad is None else self.grad + grad

    def __repr__(self) -> str:
        return f"Parameter(shape={self.data.shape}, dtype={self.data.dtype})"


@dataclass(frozen=True)
class SavedTensor:
    """One entry of the tape: which module saved what, and how many bytes it holds."""

    module: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


# NOTE [ Hooks wrap forward and backward ]
# `Node.__init_subclass__` wraps the `forward` and `backward` each subclass defines, so a hook
# registered below fires for every layer, loss and container, however it is called
# (Sequential, a checkpointed segment or autocast calling `.forward`). Rules:
# 1. No hook registered: the wrapper calls the method and nothing else.
# 2. A subclass method calling `super().forward(...)` fires the hooks once, for the outermost
#    call on that object (the inner call finds the object already running).
# 3. Hooks run in registration order; a hook returns nothing and changes nothing.
_FORWARD_PRE_HOOKS: dict[int, Callable[[Node, tuple], None]] = {}
_FORWARD_HOOKS: dict[int, Callable[[Node, tuple, Any], None]] = {}
_BACKWARD_HOOKS: dict[int, Callable[[Node, Any, tuple], None]] = {}
_RUNNING: dict[str, set[int]] = {"forward": set(), "backward": set()}  # rule 2: object ids
_handle_ids = itertools.count()


class RemovableHandle:
    """What registering a hook returns; `remove()` unregisters it (torch's RemovableHandle)."""

    def __init__(self, table: dict[int, Any], hook: Callable[..., None]) -> None:
        self.id, self._table = next(_handle_ids), table
        table[self.id] = hook

    def remove(self) -> None:
        self._table.pop(self.id, None)


def register_module_forward_pre_hook(hook: Callable[[Node, tuple], None]) -> RemovableHandle:
    """hook(node, args) before every node's forward."""
    return RemovableHandle(_FORWARD_PRE_HOOKS, hook)


def register_module_forward_hook(hook: Callable[[Node, tuple, Any], None]) -> RemovableHandle:
    """hook(node, args, output) after every node's forward."""
    return RemovableHandle(_FORWARD_HOOKS, hook)


def register_module_full_backward_hook(hook: Callable[[Node, Any, tuple], None]
                                       ) -> RemovableHandle:
    """hook(node, grad_input, grad_output) after every node's backward; grad_input is what
    backward returns, grad_output its arguments (torch's order)."""
    return RemovableHandle(_BACKWARD_HOOKS, hook)


def hooked_call(kind: str, node: Node, run: Callable[[], Any], args: tuple) -> Any:
    """`run()` as `node`'s forward or backward (`kind`), with the hooks fired around it once.

    What the wrapped methods do; also for code that computes a node's forward outside the
    method.
    """
    running = _RUNNING[kind]
    hooks = (_FORWARD_PRE_HOOKS or _FORWARD_HOOKS) if kind == "forward" else _BACKWARD_HOOKS
    if not hooks or id(node) in running:  # rules 1 and 2
        return run()
    if kind == "forward":
        for hook in list(_FORWARD_PRE_HOOKS.values()):
            hook(node, args)
    running.add(id(node))
    try:
        result = run()
    finally:
        running.discard(id(node))
    for hook in list((_FORWARD_HOOKS if kind == "forward" else _BACKWARD_HOOKS).values()):
        hook(node, args, result) if kind == "forward" else hook(node, result, args)
    return result


def _hooked(kind: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Node, *args: Any, **kwargs: Any) -> Any:
        return hooked_call(kind, self, lambda: method(self, *args, **kwargs), args)

    wrapper._hooked = True  # type: ignore[attr-defined]
    return wrapper


class Node:
    """One autograd node's tape: the named tensors its forward saved for its backward."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for kind in ("forward", "backward"):
            method = cls.__dict__.get(kind)
            if callable(method) and not getattr(method, "_hooked", False):
                setattr(cls, kind, _hooked(kind, method))

    def __init__(self) -> None:
        self._saved: dict[str, np.ndarray] = {}

    def save_for_backward(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Record named tensors for backward (replacing any earlier tape of this node)."""
        self._saved = dict(tensors)

    def saved_tensors(self) -> dict[str, np.ndarray]:
        """This node's own saved tensors, by name (empty after backward)."""
        return dict(self._saved)

    def pop_saved(self) -> dict[str, np.ndarray]:
        """Hand the tape to backward and free it; an error if forward has not recorded one."""
        if not self._saved and self._needs_tape():
            raise RuntimeError(f"{self!r}: backward without a forward (the tape is empty)")
        saved, self._saved = self._saved, {}
        return saved

    def _needs_tape(self) -> bool:
        return True

    def free_saved(self) -> None:
        """Drop the tape (what a checkpoint discards)."""
        self._saved = {}

    def tape(self, prefix: str = "") -> list[SavedTensor]:
        """The saved tensors held now, as SavedTensor(prefix, name, shape, dtype, bytes)."""
        return [SavedTensor(prefix, key, tuple(a.shape), str(a.dtype), int(a.nbytes))
                for key, a in self._saved.items()]


class Module(Node):
    """Base class of the layers: parameters, children, the tapes of all of them, train/eval.

    Registration is torch.nn.Module's: assigning a Parameter or a Module to an attribute
    (`self.c_fc = Linear(...)`) registers it under that name, in assignment order (the
    order of state_dict and of the tape); `add_module(name, module)` registers a child whose
    name is no identifier (a Sequential's "0", "1", ...). Re-assigning a registered name
    keeps its place (a tied weight replaces the one it ties)."""

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_children", {})
        self.training = True
        self.rng: np.random.Generator | None = None  # the generator forward draws from, if any

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Parameter):
            self._params[name] = value
        elif isinstance(value, Module):
            self._children[name] = value
        object.__setattr__(self, name, value)

    def add_module(self, name: str, module: Module) -> None:
        """Register `module` as the child `name` (torch.nn.Module.add_module)."""
        self._children[name] = module

    def children(self) -> Iterator[Module]:
        """The immediate children, in registration order (torch.nn.Module.children)."""
        yield from self._children.values()

    # -- the tape
    def free_saved(self) -> None:
        """Drop the tape of this module and all its children (what a checkpoint discards)."""
        for m in self.modules():
            Node.free_saved(m)

    def tape(self, prefix: str = "") -> list[SavedTensor]:
        """Every saved tensor held now, with module path, name, shape, dtype and bytes: each
        module's own saves, containers' included (the attention core's scores and softmax),
        as torch_impl.saved_tensors.measure_saved_tensors attributes torch's."""
        return [s for path, m in self.named_modules(prefix) for s in Node.tape(m, path)]

    # -- structure
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, child in self._children.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """("0.weight", p), ... in registration order, as torch names them."""
        for path, m in self.named_modules(prefix):
            for name, p in m._params.items():
                yield (f"{path}.{name}" if path else name), p

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def generators(self) -> dict[str, np.random.Generator]:
        """Every generator a forward draws from, by module path (for recompute and resume)."""
        return {path: m.rng for path, m in self.named_modules() if m.rng is not None}

    def zero_grad(self) -> None:
        """Set every .grad to None (torch's default, set_to_none=True)."""
        for p in self.parameters():
            p.grad = None

    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    # -- state
    def buffers_of(self) -> dict[str, np.ndarray]:
        """This module's own persistent buffers (torch's register_buffer): state that is not
        trained, such as delayed scaling's amax histories (none by default)."""
        return {}

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        """("h.0.mlp.c_fc.fp8_scale_input", array), ... module by module, as torch names them."""
        for path, m in self.named_modules(prefix):
            for name, b in m.buffers_of().items():
                yield (f"{path}.{name}" if path else name), b

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameter name -> a copy of its values (same keys and layouts as torch), then
        the buffers' copies."""
        state = {name: p.data.copy() for name, p in self.named_parameters()}
        return state | {name: b.copy() for name, b in self.named_buffers()}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Copy values in; keys, shapes and dtypes must match exactly (torch's strict=True)."""
        buffers = dict(self.named_buffers())
        if buffers:
            missing = sorted(set(buffers) - set(state))
            if missing:
                raise KeyError(f"load_state_dict: missing keys {missing}")
            for name, b in buffers.items():
                value = np.asarray(state[name])
                if value.shape != b.shape or value.dtype != b.dtype:
                    raise ValueError(f"load_state_dict: {name} expects {b.shape} {b.dtype}, "
                                     f"got {value.shape} {value.dtype}")
            for name, b in buffers.items():  # a buffer array is copied into in place
                b[...] = state[name]
            state = {k: v for k, v in state.items() if k not in buffers}
        params = dict(self.named_parameters())
        missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        if missing or unexpected:
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for name, p in params.items():
            value = np.asarray(state[name])
            if value.shape != p.data.shape or value.dtype != p.data.dtype:
                raise ValueError(
                    f"load_state_dict: {name} expects {p.data.shape} {p.data.dtype}, "
                    f"got {value.shape} {value.dtype}"
                )
            p.data = value.copy()

    # -- calling
    def forward(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.forward(x)


# The input contract of every layer and loss (torch checks the same inside its ops).
def check_float(node: Node, x: np.ndarray) -> np.ndarray:
    """x as an array; a TypeError naming the node unless it is float32 or float64 (or, as
    autocast makes them, float16 or bfloat16)."""
    x = np.asarray(x)
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{node!r}: expected a float32 or float64 array (float16 or bfloat16 "
                        f"under autocast), got {x.dtype}")
    return x


def check_grad(node: Node, grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """grad as an array; a ValueError naming the node unless it has the output's shape."""
    grad = np.asarray(grad)
    if grad.shape != shape:
        raise ValueError(f"{node!r}: expected grad_output of shape {shape}, got {grad.shape}")
    return grad
