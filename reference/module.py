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
is torch.nn.Module plus torch_impl/module.py (what autograd saves, measured by hooks, and the
state_dict conversion).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

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


class Node:
    """One autograd node's tape: the named tensors its forward saved for its backward."""

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
    """Base class of the layers: parameters, children, the tapes of all of them, train/eval."""

    def __init__(self) -> None:
        super().__init__()
        self.training = True
        self.rng: np.random.Generator | None = None  # the generator forward draws from, if any
        self._params: dict[str, Parameter] = {}
        self._children: dict[str, Module] = {}

    # -- the tape
    def free_saved(self) -> None:
        """Drop the tape of this module and all its children (what a checkpoint discards)."""
        for m in self.modules():
            Node.free_saved(m)

    def tape(self, prefix: str = "") -> list[SavedTensor]:
        """Every saved tensor held now, with module path, name, shape, dtype and bytes."""
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
    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameter name -> a copy of its values (same keys and layouts as torch)."""
        return {name: p.data.copy() for name, p in self.named_parameters()}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Copy values in; keys, shapes and dtypes must match exactly (torch's strict=True)."""
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
