"""Which op made the first invalid value: the module that made it, and the op inside it.

The detector (reference/numerics.py) sees module outputs. The first leaf module whose output
holds a non-finite value is where the value first SHOWS; it was MADE there only if that
leaf's inputs were finite. A leaf fed a non-finite input (the attention core's dropout,
handed softmax's NaN) only passes it on: the value was made by its parent's own ops, between
its children (the core's q k^T, scaling, masking and softmax). So:

    maker = the leaf itself if its float inputs are finite (or nothing above it has finite
            inputs: the value came with the data); otherwise the innermost module around it
            whose float inputs are all finite
    op    = a leaf maker's own op (numerics.op_name); for a container, the first op inside
            it whose output holds a non-finite value while every input, tensors and scalars,
            is finite: a value an op was TOLD to write (masked_fill's -inf) is not invalid,
            and an op fed an invalid value did not make it

Finding a container's op re-runs its forward on the recorded inputs, under the step's
autocast state, with its ops watched; only on the step that found a value, never on a clean
one. The re-run leaves nothing behind: the dropout generators are restored, the tape the
re-run recorded is dropped. The reference watches the op functions (reference/layers.py)
that the container's module imported, under torch's autograd node names and argument
names (OPS), so the two trees' reports compare as strings; an op written inline (the
residual `x + y`) is not watched, and a container whose only maker is one is reported with
op "" (torch would name AddBackward0).
The torch twin is torch_impl/numerics_locate.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from reference import amp
from reference.format_spec import FloatFormat
from reference.module import INPUT_DTYPES, Module, Node
from reference.numerics_report import InputRange

# reference/layers.py's op functions: torch's autograd node and the aten op's argument names
OPS = {"bmm": ("BmmBackward0", ("self", "mat2")),
       "scale": ("MulBackward0", ("self", "other")),
       "masked_fill": ("MaskedFillBackward0", ("self", "mask", "value")),
       "softmax": ("SoftmaxBackward0", ("self",)),
       "layer_norm": ("NativeLayerNormBackward0", ("input", "weight", "bias", "eps")),
       "embedding": ("EmbeddingBackward0", ("weight", "indices")),
       "log": ("LogBackward0", ("self",))}


def finite(values: tuple) -> bool:
    """Every float array and float scalar among `values` is finite."""
    with np.errstate(invalid="ignore"):
        return all(bool(np.isfinite(np.asarray(v, np.float64)).all()) for v in values
                   if isinstance(v, float) or is_float(v))


def is_float(v: Any) -> bool:
    """A float array: float32/64 or the 2-byte ones autocast makes (ml_dtypes' kind is "V")."""
    return isinstance(v, np.ndarray) and v.dtype in INPUT_DTYPES


def maker(path: str, calls: dict[str, tuple[Node, tuple]]) -> str:
    """The path of the module that made the first invalid value first shown by leaf `path`
    (`calls`: path -> (module, args) of every module called in the step's forward)."""
    if finite(calls[path][1]):
        return path
    parts = path.split(".")
    for n in range(len(parts) - 1, -1, -1):  # the parents, innermost first; "" is the root
        parent = ".".join(parts[:n])
        if parent in calls and finite(calls[parent][1]):
            return parent
    return path


Found = tuple[str, tuple[int, ...], str, tuple[InputRange, ...]]  # op, index, value, inputs


def watch_ops(node: Module, args: tuple, state: amp.AutocastState, fmt: FloatFormat,
              ranges: Callable[[str, np.ndarray, FloatFormat], InputRange],
              first: Callable[[np.ndarray], tuple[tuple[int, ...], str]]) -> Found | None:
    """Re-run `node.forward(*args)` under `state` with its module's op functions watched:
    (op, index and value of its first non-finite element, its inputs' ranges) of the first
    op that made a non-finite value from finite inputs, or None."""
    namespace = sys.modules[type(node).__module__]
    found: list[Found] = []

    def watched(function: Callable[..., Any], op: str, names: tuple[str, ...]
                ) -> Callable[..., Any]:
        def run(*a: Any) -> Any:
            result = function(*a)
            out = result[0] if isinstance(result, tuple) else result
            if not found and finite(a) and not finite((out,)):
                inputs = tuple(ranges(n, v, fmt) for n, v in zip(names, a, strict=False)
                               if is_float(v))
                found.append((op, *first(out), inputs))
            return result
        return run

    originals = {name: getattr(namespace, name) for name in OPS if hasattr(namespace, name)}
    generators = {id(m.rng): m.rng for m in (node.modules() if isinstance(node, Module)
                                             else (node,))
                  if isinstance(getattr(m, "rng", None), np.random.Generator)}
    states = {k: g.bit_generator.state for k, g in generators.items()}
    try:
        for name, function in originals.items():
            setattr(namespace, name, watched(function, *OPS[name]))
        with amp.autocast.entering(state), np.errstate(all="ignore"):
            node.forward(*args)
    finally:
        for name, function in originals.items():
            setattr(namespace, name, function)
        for k, g in generators.items():
            g.bit_generator.state = states[k]
        node.free_saved()
    return found[0] if found else None
